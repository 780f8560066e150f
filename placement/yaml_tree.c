/*
 * yaml_tree.c - libyaml events to a marked tree (see yaml_tree.h).  Every node
 * is attached to its parent as soon as it exists, so freeing the root frees a
 * half-built tree too.
 */
#include "yaml_tree.h"

#include <stdlib.h>
#include <string.h>
#include <yaml.h>

struct builder {
    const char *name;
    kt_err *err;
    struct kt_ynode *root;
    struct kt_ynode *stack[KT_YAML_MAX_DEPTH];
    int depth;
    uint32_t n_nodes;
};

static kt_status fail_at(struct builder *b, yaml_mark_t mark, const char *what)
{
    return kt_err_set(b->err, KT_ERR_FORMAT, "%s:%zu:%zu: %s", b->name, mark.line + 1, mark.column + 1, what);
}

void kt_yaml_tree_destroy(struct kt_ynode *n)
{
    if (!n)
        return;
    for (uint32_t i = 0; i < n->n; i++)
        kt_yaml_tree_destroy(n->items[i]);
    free(n->items);
    free(n->text);
    free(n);
}

bool kt_yscalar_is(const struct kt_ynode *n, const char *s)
{
    return n->kind == KT_YSCALAR && n->len == strlen(s) && memcmp(n->text, s, n->len) == 0;
}

static bool same_scalar(const struct kt_ynode *a, const struct kt_ynode *b)
{
    return a->len == b->len && memcmp(a->text, b->text, a->len) == 0;
}

/* Hangs node under the innermost open collection (or makes it the root). */
static kt_status attach(struct builder *b, struct kt_ynode *node, yaml_mark_t mark)
{
    if (b->depth == 0) {
        b->root = node;
        return KT_OK;
    }
    struct kt_ynode *parent = b->stack[b->depth - 1];
    if (parent->kind == KT_YMAP && parent->n % 2 == 0) {
        if (node->kind != KT_YSCALAR) {
            kt_yaml_tree_destroy(node);
            return fail_at(b, mark, "a mapping key must be a scalar");
        }
        if (parent->n / 2 >= KT_YAML_MAX_MAP_ENTRIES) {
            kt_yaml_tree_destroy(node);
            return fail_at(b, mark, "too many entries in one mapping");
        }
        for (uint32_t i = 0; i < parent->n; i += 2) {
            if (same_scalar(parent->items[i], node)) {
                char what[160];
                snprintf(what, sizeof what, "duplicate key (first given at line %u)", parent->items[i]->line);
                kt_yaml_tree_destroy(node);
                return fail_at(b, mark, what);
            }
        }
    }
    if ((parent->n & (parent->n - 1)) == 0) { /* grow at powers of two */
        uint32_t cap = parent->n ? 2 * parent->n : 1;
        struct kt_ynode **items = realloc(parent->items, cap * sizeof *items);
        if (!items) {
            kt_yaml_tree_destroy(node);
            return kt_err_set(b->err, KT_ERR_NOMEM, "%s: out of memory reading YAML", b->name);
        }
        parent->items = items;
    }
    parent->items[parent->n++] = node;
    return KT_OK;
}

static kt_status add_node(struct builder *b, const yaml_event_t *ev, enum kt_ynode_kind kind, struct kt_ynode **out)
{
    if (++b->n_nodes > KT_YAML_MAX_NODES)
        return fail_at(b, ev->start_mark, "too many YAML nodes");
    struct kt_ynode *node = calloc(1, sizeof *node);
    if (!node)
        return kt_err_set(b->err, KT_ERR_NOMEM, "%s: out of memory reading YAML", b->name);
    node->kind = kind;
    node->line = (uint32_t)(ev->start_mark.line + 1);
    node->col = (uint32_t)(ev->start_mark.column + 1);
    if (kind == KT_YSCALAR) {
        node->len = ev->data.scalar.length;
        node->plain = ev->data.scalar.style == YAML_PLAIN_SCALAR_STYLE;
        node->text = malloc(node->len + 1);
        if (!node->text) {
            free(node);
            return kt_err_set(b->err, KT_ERR_NOMEM, "%s: out of memory reading YAML", b->name);
        }
        memcpy(node->text, ev->data.scalar.value, node->len);
        node->text[node->len] = 0;
    }
    *out = node;
    return attach(b, node, ev->start_mark);
}

/* Anchors and tags would let a document say things the schema cannot check. */
static kt_status refuse_extras(struct builder *b, const yaml_event_t *ev)
{
    const yaml_char_t *anchor = NULL, *tag = NULL;
    if (ev->type == YAML_SCALAR_EVENT) {
        anchor = ev->data.scalar.anchor;
        tag = ev->data.scalar.tag;
    } else if (ev->type == YAML_SEQUENCE_START_EVENT) {
        anchor = ev->data.sequence_start.anchor;
        tag = ev->data.sequence_start.tag;
    } else if (ev->type == YAML_MAPPING_START_EVENT) {
        anchor = ev->data.mapping_start.anchor;
        tag = ev->data.mapping_start.tag;
    }
    if (anchor)
        return fail_at(b, ev->start_mark, "anchors (&name) are not supported here");
    if (tag)
        return fail_at(b, ev->start_mark, "tags (!tag) are not supported here");
    return KT_OK;
}

/* libyaml leaves a reader error's (bad UTF-8, a control character) mark at
 * the start and gives its byte offset instead: the mark of that offset, the
 * column counted in characters as libyaml counts it (the bytes before the
 * offset are valid UTF-8: the reader checked them). */
static yaml_mark_t mark_of_offset(const char *text, size_t len, size_t offset)
{
    yaml_mark_t m = {.index = offset};
    for (size_t i = 0; i < offset && i < len; i++) {
        const unsigned char c = (unsigned char)text[i];
        if (c == '\n' || (c == '\r' && (i + 1 == len || text[i + 1] != '\n'))) {
            m.line++;
            m.column = 0;
        } else if (c != '\r' && (c & 0xC0) != 0x80) {
            m.column++;
        }
    }
    return m;
}

/* Handles one event; *done at the end of the stream. */
static kt_status on_event(struct builder *b, const yaml_event_t *ev, int *n_docs, bool *done)
{
    kt_status st = refuse_extras(b, ev);
    if (st)
        return st;
    struct kt_ynode *node;
    switch (ev->type) {
    case YAML_STREAM_END_EVENT:
        *done = true;
        return KT_OK;
    case YAML_DOCUMENT_START_EVENT:
        if (++*n_docs > 1)
            return fail_at(b, ev->start_mark, "only one YAML document is allowed");
        return KT_OK;
    case YAML_ALIAS_EVENT:
        return fail_at(b, ev->start_mark, "aliases (*name) are not supported here");
    case YAML_SCALAR_EVENT:
        return add_node(b, ev, KT_YSCALAR, &node);
    case YAML_SEQUENCE_START_EVENT:
    case YAML_MAPPING_START_EVENT:
        if (b->depth == KT_YAML_MAX_DEPTH)
            return fail_at(b, ev->start_mark, "nested too deeply");
        st = add_node(b, ev, ev->type == YAML_MAPPING_START_EVENT ? KT_YMAP : KT_YSEQ, &node);
        if (st == KT_OK)
            b->stack[b->depth++] = node;
        return st;
    case YAML_SEQUENCE_END_EVENT:
    case YAML_MAPPING_END_EVENT:
        if (b->depth > 0)
            b->depth--;
        return KT_OK;
    default:
        return KT_OK;
    }
}

kt_status kt_yaml_tree_parse(const char *text, size_t len, const char *name, struct kt_ynode **root, kt_err *err)
{
    *root = NULL;
    struct builder b = {.name = name, .err = err};
    yaml_parser_t parser;
    if (!yaml_parser_initialize(&parser))
        return kt_err_set(err, KT_ERR_NOMEM, "%s: out of memory reading YAML", name);
    yaml_parser_set_input_string(&parser, (const unsigned char *)text, len);
    kt_status st = KT_OK;
    int n_docs = 0;
    bool done = false;
    while (!done && st == KT_OK) {
        yaml_event_t ev;
        if (!yaml_parser_parse(&parser, &ev)) {
            if (parser.error == YAML_MEMORY_ERROR) {
                st = kt_err_set(err, KT_ERR_NOMEM, "%s: out of memory reading YAML", name);
            } else if (parser.error == YAML_READER_ERROR) {
                char what[256], value[32] = "";
                if (parser.problem_value >= 0)
                    snprintf(value, sizeof value, "0x%X ", (unsigned)parser.problem_value);
                snprintf(what, sizeof what,
                         "%s (%sat byte %zu); a config must be UTF-8 text without control characters",
                         parser.problem ? parser.problem : "unreadable text", value, parser.problem_offset);
                st = fail_at(&b, mark_of_offset(text, len, parser.problem_offset), what);
            } else {
                char what[512];
                snprintf(what, sizeof what, "%s%s%s", parser.problem ? parser.problem : "malformed YAML",
                         parser.context ? " " : "", parser.context ? parser.context : "");
                st = fail_at(&b, parser.problem_mark, what);
            }
            break;
        }
        st = on_event(&b, &ev, &n_docs, &done);
        yaml_event_delete(&ev);
    }
    yaml_parser_delete(&parser);
    if (st) {
        kt_yaml_tree_destroy(b.root);
        return st;
    }
    *root = b.root;
    return KT_OK;
}
