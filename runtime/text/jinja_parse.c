/*
 * jinja_parse.c - template source to syntax tree (jinja_internal.h): the
 * lexer, with HF's whitespace settings applied as jinja2 applies them, and a
 * recursive-descent parser for the expression and statement grammar.
 *
 * Whitespace, as jinja2 with trim_blocks and lstrip_blocks: "{%-"/"{{-"/"{#-"
 * strip all whitespace before the tag and "-%}"/"-}}"/"-#}" all after it;
 * otherwise a block or comment tag that starts a line takes the line's
 * leading spaces and tabs ("{%+" keeps them) and drops one newline right
 * after it ("+%}" keeps it); a single trailing newline of the source goes.
 *
 * The parser refuses nesting beyond KT_JINJA_MAX_NESTING so that neither it
 * nor the evaluator recurses without bound on hostile input.
 */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jinja_internal.h"

/* ------------------------------------------------------------------ arena --- */

struct jj_arena_block {
    jj_arena_block *next;
    size_t used, cap;
    max_align_t data[];
};

static void *arena_alloc(kt_jinja_template *t, size_t bytes)
{
    bytes = (bytes + sizeof(max_align_t) - 1) / sizeof(max_align_t) * sizeof(max_align_t);
    jj_arena_block *b = t->arena;
    if (!b || b->cap - b->used < bytes) {
        size_t cap = bytes > 16384 ? bytes : 16384;
        b = malloc(sizeof *b + cap);
        if (!b)
            return NULL;
        b->next = t->arena;
        b->used = 0;
        b->cap = cap;
        t->arena = b;
    }
    void *p = (char *)b->data + b->used;
    b->used += bytes;
    memset(p, 0, bytes);
    return p;
}

void kt_jinja_destroy(kt_jinja_template *t)
{
    if (!t)
        return;
    for (size_t i = 0; i < t->n_literals; i++)
        json_decref(t->literals[i]);
    free(t->literals);
    while (t->arena) {
        jj_arena_block *next = t->arena->next;
        free(t->arena);
        t->arena = next;
    }
    free(t);
}

/* ------------------------------------------------------------------ lexer --- */

typedef enum tk_type {
    TK_TEXT,
    TK_BLOCK_BEGIN,
    TK_BLOCK_END,
    TK_VAR_BEGIN,
    TK_VAR_END,
    TK_NAME,
    TK_STRING, /* value[vlen], escapes decoded */
    TK_INT,
    TK_FLOAT,
    TK_OP, /* op: a character or a JJ_OP_* code */
    TK_EOF,
} tk_type;

typedef struct token {
    tk_type type;
    int op;
    int line;
    const char *s; /* source text (TEXT, NAME) or decoded value (STRING) */
    size_t len;
    long long i;
    double f;
} token;

typedef struct parser {
    kt_jinja_template *t;
    const char *src; /* arena copy, NUL-terminated */
    size_t len;
    token *toks;     /* [n_toks] */
    size_t n_toks, cap_toks, at;
    int depth;
    size_t loop_refs; /* names "loop" parsed so far: a for body without one gets no loop object */
    kt_err *err;
    kt_status st;    /* first failure */
} parser;

static bool fail(parser *p, int line, kt_status st, const char *fmt, ...) __attribute__((format(printf, 4, 5)));

static bool fail(parser *p, int line, kt_status st, const char *fmt, ...)
{
    if (p->st != KT_OK)
        return false;
    char msg[900];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    p->st = kt_err_set(p->err, st, "chat template line %d: %s", line, msg);
    return false;
}

static bool nomem(parser *p)
{
    return fail(p, 0, KT_ERR_NOMEM, "out of memory parsing the template");
}

static bool push_token(parser *p, token tk)
{
    if (p->n_toks == p->cap_toks) {
        size_t cap = p->cap_toks ? p->cap_toks * 2 : 256;
        token *toks = realloc(p->toks, cap * sizeof *toks);
        if (!toks)
            return nomem(p);
        p->toks = toks;
        p->cap_toks = cap;
    }
    p->toks[p->n_toks++] = tk;
    return true;
}

static int count_lines(const char *s, size_t from, size_t to)
{
    int n = 0;
    for (size_t i = from; i < to; i++)
        n += s[i] == '\n';
    return n;
}

/* Appends the UTF-8 encoding of cp to out (at least 4 bytes free). */
static size_t put_utf8(char *out, unsigned long cp)
{
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* A quoted literal at src[*pos] (the quote), decoded as jinja2 decodes it
 * (Python's unicode-escape for backslash sequences; unknown ones kept). */
static bool lex_string(parser *p, size_t *pos, int line, token *tk)
{
    const char *s = p->src;
    char quote = s[*pos];
    size_t i = *pos + 1, end = i;
    while (end < p->len && s[end] != quote)
        end += s[end] == '\\' && end + 1 < p->len ? 2 : 1;
    if (end >= p->len)
        return fail(p, line, KT_ERR_FORMAT, "unterminated string literal");
    char *out = arena_alloc(p->t, end - i + 1);
    if (!out)
        return nomem(p);
    size_t o = 0;
    while (i < end) {
        char c = s[i++];
        if (c != '\\') {
            out[o++] = c;
            continue;
        }
        char e = s[i++];
        int hex_digits = e == 'x' ? 2 : e == 'u' ? 4 : e == 'U' ? 8 : 0;
        if (hex_digits) {
            unsigned long cp = 0;
            for (int k = 0; k < hex_digits; k++, i++) {
                if (i >= end || !isxdigit((unsigned char)s[i]))
                    return fail(p, line, KT_ERR_FORMAT, "truncated \\%c escape in a string literal", e);
                cp = cp * 16 + (unsigned long)(isdigit((unsigned char)s[i]) ? s[i] - '0'
                                                                            : tolower((unsigned char)s[i]) - 'a' + 10);
            }
            if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
                return fail(p, line, KT_ERR_FORMAT, "escape \\%c names no Unicode scalar value", e);
            /* \xNN and \uNNNN take at most 2 and 6 source bytes but 2 and 3
             * output bytes; \U takes 10 and gives 4: the output never outgrows the source. */
            o += put_utf8(out + o, cp);
            continue;
        }
        switch (e) {
        case 'n': out[o++] = '\n'; break;
        case 't': out[o++] = '\t'; break;
        case 'r': out[o++] = '\r'; break;
        case 'b': out[o++] = '\b'; break;
        case 'f': out[o++] = '\f'; break;
        case 'v': out[o++] = '\v'; break;
        case 'a': out[o++] = '\a'; break;
        case '0': out[o++] = '\0'; break;
        case '\\': out[o++] = '\\'; break;
        case '\'': out[o++] = '\''; break;
        case '"': out[o++] = '"'; break;
        case '\n': break; /* a backslash-newline continues the literal */
        default:
            out[o++] = '\\';
            out[o++] = e;
        }
    }
    out[o] = '\0';
    *tk = (token){.type = TK_STRING, .line = line, .s = out, .len = o};
    *pos = end + 1;
    return true;
}

static bool lex_number(parser *p, size_t *pos, int line, token *tk)
{
    const char *s = p->src;
    size_t i = *pos;
    char buf[64];
    size_t n = 0;
    bool is_float = false;
    for (; i < p->len && (isdigit((unsigned char)s[i]) || s[i] == '_'); i++)
        if (s[i] != '_' && n < sizeof buf - 1)
            buf[n++] = s[i];
    if (i + 1 < p->len && s[i] == '.' && isdigit((unsigned char)s[i + 1])) {
        is_float = true;
        buf[n < sizeof buf - 1 ? n++ : n] = '.';
        for (i++; i < p->len && (isdigit((unsigned char)s[i]) || s[i] == '_'); i++)
            if (s[i] != '_' && n < sizeof buf - 1)
                buf[n++] = s[i];
    }
    if (i < p->len && (s[i] == 'e' || s[i] == 'E')) {
        size_t j = i + 1;
        if (j < p->len && (s[j] == '+' || s[j] == '-'))
            j++;
        if (j < p->len && isdigit((unsigned char)s[j])) {
            is_float = true;
            for (; i < j; i++)
                if (n < sizeof buf - 1)
                    buf[n++] = s[i];
            for (; i < p->len && isdigit((unsigned char)s[i]); i++)
                if (n < sizeof buf - 1)
                    buf[n++] = s[i];
        }
    }
    buf[n] = '\0';
    if (n >= sizeof buf - 1)
        return fail(p, line, KT_ERR_FORMAT, "number literal too long");
    errno = 0;
    if (is_float) {
        *tk = (token){.type = TK_FLOAT, .line = line, .f = strtod(buf, NULL)};
    } else {
        long long v = strtoll(buf, NULL, 10);
        if (errno == ERANGE)
            return fail(p, line, KT_ERR_FORMAT, "integer literal %s does not fit 64 bits", buf);
        *tk = (token){.type = TK_INT, .line = line, .i = v};
    }
    *pos = i;
    return true;
}

static int two_char_op(char a, char b)
{
    if (a == '/' && b == '/')
        return JJ_OP_FLOORDIV;
    if (a == '*' && b == '*')
        return JJ_OP_POW;
    if (a == '=' && b == '=')
        return JJ_OP_EQ;
    if (a == '!' && b == '=')
        return JJ_OP_NE;
    if (a == '<' && b == '=')
        return JJ_OP_LE;
    if (a == '>' && b == '=')
        return JJ_OP_GE;
    return 0;
}

/* The tokens of one {% %} or {{ }} tag from *pos (just past the opener) to
 * its closer; *strip_after says the closer had '-', *keep_newline '+'. */
static bool lex_tag(parser *p, size_t *pos, int *line, bool block, bool *strip_after, bool *keep_newline)
{
    const char *s = p->src;
    size_t i = *pos;
    int braces = 0, start_line = *line;
    for (;;) {
        while (i < p->len && isspace((unsigned char)s[i])) {
            *line += s[i] == '\n';
            i++;
        }
        if (i >= p->len)
            return fail(p, start_line, KT_ERR_FORMAT, "unterminated %s tag", block ? "{% %}" : "{{ }}");
        const char *closer = block ? "%}" : "}}";
        bool mod = (s[i] == '-' || s[i] == '+') && i + 2 < p->len + 1 && strncmp(s + i + 1, closer, 2) == 0;
        if ((mod || strncmp(s + i, closer, 2) == 0) && (block || braces == 0)) {
            *strip_after = mod && s[i] == '-';
            *keep_newline = mod && s[i] == '+';
            *pos = i + 2 + mod;
            return push_token(p, (token){.type = block ? TK_BLOCK_END : TK_VAR_END, .line = *line});
        }
        token tk = {.line = *line};
        char c = s[i];
        if (isalpha((unsigned char)c) || c == '_') {
            size_t j = i;
            while (j < p->len && (isalnum((unsigned char)s[j]) || s[j] == '_'))
                j++;
            tk.type = TK_NAME;
            tk.s = s + i;
            tk.len = j - i;
            i = j;
        } else if (isdigit((unsigned char)c)) {
            if (!lex_number(p, &i, *line, &tk))
                return false;
        } else if (c == '\'' || c == '"') {
            int at = *line;
            size_t from = i;
            if (!lex_string(p, &i, at, &tk))
                return false;
            *line += count_lines(s, from, i);
        } else {
            int op = i + 1 < p->len ? two_char_op(c, s[i + 1]) : 0;
            if (op) {
                i += 2;
            } else if (strchr("+-*/%~()[]{},.:|=<>", c)) {
                op = c;
                i++;
                braces += c == '{' ? 1 : c == '}' ? -1 : 0;
            } else {
                return fail(p, *line, KT_ERR_FORMAT, "unexpected character '%c' (0x%02x) in a tag", isprint((unsigned char)c) ? c : '?',
                            (unsigned char)c);
            }
            tk.type = TK_OP;
            tk.op = op;
        }
        if (!push_token(p, tk))
            return false;
    }
}

static bool lex(parser *p)
{
    const char *s = p->src;
    size_t pos = 0;
    int line = 1;
    bool line_start = true; /* pos is at the start of a line */
    for (;;) {
        size_t start = pos;
        while (start + 1 < p->len && !(s[start] == '{' && (s[start + 1] == '{' || s[start + 1] == '%' || s[start + 1] == '#')))
            start++;
        if (start + 1 >= p->len) {
            if (pos < p->len && !push_token(p, (token){.type = TK_TEXT, .line = line, .s = s + pos, .len = p->len - pos}))
                return false;
            line += count_lines(s, pos, p->len);
            return push_token(p, (token){.type = TK_EOF, .line = line});
        }
        char kind = s[start + 1];
        char mod = start + 2 < p->len && (s[start + 2] == '-' || s[start + 2] == '+') ? s[start + 2] : 0;
        size_t text_end = start;
        if (mod == '-') {
            while (text_end > pos && isspace((unsigned char)s[text_end - 1]))
                text_end--;
        } else if (kind != '{' && mod != '+') { /* lstrip_blocks */
            size_t l = text_end;
            while (l > pos && (s[l - 1] == ' ' || s[l - 1] == '\t'))
                l--;
            if ((l > pos && s[l - 1] == '\n') || (l == pos && line_start))
                text_end = l;
        }
        if (text_end > pos && !push_token(p, (token){.type = TK_TEXT, .line = line, .s = s + pos, .len = text_end - pos}))
            return false;
        line += count_lines(s, pos, start);
        size_t i = start + 2 + (mod != 0);
        bool strip_after = false, keep_newline = false;
        if (kind == '#') {
            const char *close = strstr(s + i, "#}");
            if (!close)
                return fail(p, line, KT_ERR_FORMAT, "unterminated comment");
            size_t c = (size_t)(close - s);
            strip_after = c > i && s[c - 1] == '-';
            keep_newline = c > i && s[c - 1] == '+';
            line += count_lines(s, i, c);
            i = c + 2;
        } else {
            if (!push_token(p, (token){.type = kind == '%' ? TK_BLOCK_BEGIN : TK_VAR_BEGIN, .line = line}))
                return false;
            if (!lex_tag(p, &i, &line, kind == '%', &strip_after, &keep_newline))
                return false;
        }
        line_start = false;
        if (strip_after) {
            while (i < p->len && isspace((unsigned char)s[i])) {
                line_start = s[i] == '\n';
                line += s[i] == '\n';
                i++;
            }
        } else if (kind != '{' && !keep_newline && i < p->len && s[i] == '\n') { /* trim_blocks */
            i++;
            line++;
            line_start = true;
        }
        pos = i;
    }
}

/* ----------------------------------------------------------------- parser --- */

static token *peek(parser *p)
{
    return &p->toks[p->at];
}

static token *next(parser *p)
{
    token *tk = &p->toks[p->at];
    if (tk->type != TK_EOF)
        p->at++;
    return tk;
}

static bool is_op(const token *tk, int op)
{
    return tk->type == TK_OP && tk->op == op;
}

static bool is_name(const token *tk, const char *name)
{
    return tk->type == TK_NAME && tk->len == strlen(name) && memcmp(tk->s, name, tk->len) == 0;
}

static bool expect_op(parser *p, int op)
{
    token *tk = peek(p);
    if (!is_op(tk, op))
        return fail(p, tk->line, KT_ERR_FORMAT, "expected '%c'", op < 256 ? op : '?');
    next(p);
    return true;
}

static const char *describe(const token *tk)
{
    switch (tk->type) {
    case TK_TEXT: return "text";
    case TK_BLOCK_BEGIN: return "'{%'";
    case TK_BLOCK_END: return "'%}'";
    case TK_VAR_BEGIN: return "'{{'";
    case TK_VAR_END: return "'}}'";
    case TK_NAME: return "a name";
    case TK_STRING: return "a string";
    case TK_INT:
    case TK_FLOAT: return "a number";
    case TK_OP: return "an operator";
    case TK_EOF: return "the end of the template";
    }
    return "?";
}

static jj_node *new_node(parser *p, jj_kind kind, int line)
{
    jj_node *n = arena_alloc(p->t, sizeof *n);
    if (!n) {
        nomem(p);
        return NULL;
    }
    n->kind = kind;
    n->line = line;
    return n;
}

static const char *arena_strndup(parser *p, const char *s, size_t len)
{
    char *d = arena_alloc(p->t, len + 1);
    if (!d) {
        nomem(p);
        return NULL;
    }
    memcpy(d, s, len);
    d[len] = '\0';
    return d;
}

/* A growable list built on the heap, then moved into the arena. */
typedef struct list_builder {
    jj_node **items;
    const char **names;
    size_t n, cap;
} list_builder;

static bool lb_push(parser *p, list_builder *b, jj_node *item, const char *name)
{
    if (b->n == b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 8;
        jj_node **items = realloc(b->items, cap * sizeof *items);
        if (items)
            b->items = items;
        const char **names = realloc(b->names, cap * sizeof *names);
        if (names)
            b->names = names;
        if (!items || !names)
            return nomem(p);
        b->cap = cap;
    }
    b->items[b->n] = item;
    b->names[b->n] = name;
    b->n++;
    return true;
}

/* Moves b into the arena: items into *list, names (when wanted) into *names. */
static bool lb_finish(parser *p, list_builder *b, jj_list *list, const char ***names, size_t *n_names)
{
    bool ok = true;
    if (b->n) {
        list->items = arena_alloc(p->t, b->n * sizeof *list->items);
        if (!list->items)
            ok = nomem(p);
        else
            memcpy(list->items, b->items, b->n * sizeof *list->items);
        list->n = ok ? b->n : 0;
        if (ok && names) {
            *names = arena_alloc(p->t, b->n * sizeof **names);
            if (!*names)
                ok = nomem(p);
            else
                memcpy(*names, b->names, b->n * sizeof **names);
            *n_names = ok ? b->n : 0;
        }
    }
    free(b->items);
    free(b->names);
    *b = (list_builder){0};
    return ok;
}

static bool add_literal(parser *p, jj_node *n, json_t *v)
{
    if (!v)
        return nomem(p);
    if (p->t->n_literals == p->t->cap_literals) {
        size_t cap = p->t->cap_literals ? p->t->cap_literals * 2 : 64;
        json_t **l = realloc(p->t->literals, cap * sizeof *l);
        if (!l) {
            json_decref(v);
            return nomem(p);
        }
        p->t->literals = l;
        p->t->cap_literals = cap;
    }
    p->t->literals[p->t->n_literals++] = v;
    n->literal = v;
    return true;
}

static bool enter(parser *p, int line)
{
    if (++p->depth > KT_JINJA_MAX_NESTING)
        return fail(p, line, KT_ERR_FORMAT, "nested deeper than %d", KT_JINJA_MAX_NESTING);
    return true;
}

static jj_node *parse_expression(parser *p);
static jj_node *parse_or(parser *p);
static jj_node *parse_unary(parser *p, bool with_filter);

static bool parse_args(parser *p, list_builder *b)
{
    if (!expect_op(p, '('))
        return false;
    while (!is_op(peek(p), ')')) {
        const char *kw = NULL;
        if (peek(p)->type == TK_NAME && is_op(&p->toks[p->at + 1], '=')) {
            token *name = next(p);
            next(p);
            if (!(kw = arena_strndup(p, name->s, name->len)))
                return false;
        }
        jj_node *arg = parse_expression(p);
        if (!arg || !lb_push(p, b, arg, kw))
            return false;
        if (!is_op(peek(p), ','))
            break;
        next(p);
    }
    return expect_op(p, ')');
}

/* The comma-separated items up to `close`, as in [a, b] and (a, b). */
static bool parse_items(parser *p, list_builder *b, int close)
{
    while (!is_op(peek(p), close)) {
        jj_node *item = parse_expression(p);
        if (!item || !lb_push(p, b, item, NULL))
            return false;
        if (!is_op(peek(p), ','))
            break;
        next(p);
    }
    return expect_op(p, close);
}

static jj_node *parse_primary(parser *p)
{
    token *tk = next(p);
    jj_node *n = NULL;
    list_builder b = {0};
    switch (tk->type) {
    case TK_NAME: {
        static const struct { const char *name; int value; } consts[] = {
            {"true", 1}, {"True", 1}, {"false", 0}, {"False", 0}, {"none", -1}, {"None", -1}};
        for (size_t k = 0; k < sizeof consts / sizeof consts[0]; k++)
            if (is_name(tk, consts[k].name)) {
                if (!(n = new_node(p, JJ_LITERAL, tk->line)) ||
                    !add_literal(p, n, consts[k].value < 0 ? json_null() : json_boolean(consts[k].value)))
                    return NULL;
                return n;
            }
        if (!(n = new_node(p, JJ_NAME, tk->line)) || !(n->str = arena_strndup(p, tk->s, tk->len)))
            return NULL;
        n->len = tk->len;
        p->loop_refs += is_name(tk, "loop");
        return n;
    }
    case TK_STRING: {
        /* Adjacent literals concatenate, as in Python. */
        size_t total = tk->len, first = p->at - 1;
        while (peek(p)->type == TK_STRING)
            total += next(p)->len;
        if (!(n = new_node(p, JJ_LITERAL, tk->line)))
            return NULL;
        char *buf = arena_alloc(p->t, total + 1);
        if (!buf) {
            nomem(p);
            return NULL;
        }
        size_t o = 0;
        for (size_t k = first; k < p->at; k++) {
            memcpy(buf + o, p->toks[k].s, p->toks[k].len);
            o += p->toks[k].len;
        }
        return add_literal(p, n, json_stringn_nocheck(buf, total)) ? n : NULL;
    }
    case TK_INT:
        if (!(n = new_node(p, JJ_LITERAL, tk->line)))
            return NULL;
        return add_literal(p, n, json_integer(tk->i)) ? n : NULL;
    case TK_FLOAT:
        if (!(n = new_node(p, JJ_LITERAL, tk->line)))
            return NULL;
        return add_literal(p, n, json_real(tk->f)) ? n : NULL;
    case TK_OP:
        if (tk->op == '(') {
            if (is_op(peek(p), ')')) {
                next(p);
                return new_node(p, JJ_TUPLE, tk->line);
            }
            jj_node *first = parse_expression(p);
            if (!first)
                return NULL;
            if (!is_op(peek(p), ',')) {
                return expect_op(p, ')') ? first : NULL;
            }
            next(p);
            if (!(n = new_node(p, JJ_TUPLE, tk->line)) || !lb_push(p, &b, first, NULL) || !parse_items(p, &b, ')') ||
                !lb_finish(p, &b, &n->items, NULL, NULL)) {
                lb_finish(p, &b, &(jj_list){0}, NULL, NULL);
                return NULL;
            }
            return n;
        }
        if (tk->op == '[') {
            if (!(n = new_node(p, JJ_LIST, tk->line)) || !parse_items(p, &b, ']') ||
                !lb_finish(p, &b, &n->items, NULL, NULL)) {
                lb_finish(p, &b, &(jj_list){0}, NULL, NULL);
                return NULL;
            }
            return n;
        }
        if (tk->op == '{') {
            if (!(n = new_node(p, JJ_DICT, tk->line)))
                return NULL;
            while (!is_op(peek(p), '}')) {
                jj_node *key = parse_expression(p);
                jj_node *value = key && expect_op(p, ':') ? parse_expression(p) : NULL;
                if (!value || !lb_push(p, &b, key, NULL) || !lb_push(p, &b, value, NULL)) {
                    lb_finish(p, &b, &(jj_list){0}, NULL, NULL);
                    return NULL;
                }
                if (!is_op(peek(p), ','))
                    break;
                next(p);
            }
            if (!expect_op(p, '}') || !lb_finish(p, &b, &n->items, NULL, NULL)) {
                lb_finish(p, &b, &(jj_list){0}, NULL, NULL);
                return NULL;
            }
            return n;
        }
        break;
    default:
        break;
    }
    fail(p, tk->line, KT_ERR_FORMAT, "unexpected %s in an expression", describe(tk));
    return NULL;
}

/* obj[...]: an index or a slice. */
static jj_node *parse_subscript(parser *p, jj_node *obj, int line)
{
    jj_node *parts[3] = {NULL, NULL, NULL};
    int part = 0;
    bool slice = false;
    for (;;) {
        token *tk = peek(p);
        if (is_op(tk, ']'))
            break;
        if (is_op(tk, ':')) {
            next(p);
            slice = true;
            if (++part > 2) {
                fail(p, tk->line, KT_ERR_FORMAT, "a slice takes at most three parts");
                return NULL;
            }
            continue;
        }
        if (parts[part]) {
            fail(p, tk->line, KT_ERR_FORMAT, "expected ':' or ']' in a subscript");
            return NULL;
        }
        if (!(parts[part] = parse_expression(p)))
            return NULL;
    }
    next(p);
    if (!slice && !parts[0]) {
        fail(p, line, KT_ERR_FORMAT, "empty subscript");
        return NULL;
    }
    jj_node *n = new_node(p, slice ? JJ_SLICE : JJ_INDEX, line);
    if (!n)
        return NULL;
    n->a = obj;
    n->b = parts[0];
    n->c = parts[1];
    n->d = parts[2];
    return n;
}

static jj_node *parse_postfix(parser *p, jj_node *n)
{
    for (;;) {
        token *tk = peek(p);
        if (is_op(tk, '.')) {
            next(p);
            token *name = next(p);
            jj_node *m;
            if (name->type == TK_NAME) {
                if (!(m = new_node(p, JJ_ATTR, name->line)) || !(m->str = arena_strndup(p, name->s, name->len)))
                    return NULL;
                m->len = name->len;
                m->a = n;
            } else if (name->type == TK_INT) { /* x.0 is x[0] */
                jj_node *idx = new_node(p, JJ_LITERAL, name->line);
                if (!idx || !add_literal(p, idx, json_integer(name->i)) || !(m = new_node(p, JJ_INDEX, name->line)))
                    return NULL;
                m->a = n;
                m->b = idx;
            } else {
                fail(p, name->line, KT_ERR_FORMAT, "expected an attribute name after '.'");
                return NULL;
            }
            n = m;
        } else if (is_op(tk, '[')) {
            next(p);
            if (!(n = parse_subscript(p, n, tk->line)))
                return NULL;
        } else if (is_op(tk, '(')) {
            jj_node *call = new_node(p, JJ_CALL, tk->line);
            list_builder b = {0};
            if (!call || !parse_args(p, &b) || !lb_finish(p, &b, &call->items, &call->names, &call->n_names)) {
                lb_finish(p, &b, &(jj_list){0}, NULL, NULL);
                return NULL;
            }
            call->a = n;
            n = call;
        } else {
            return n;
        }
    }
}

static bool starts_test_argument(const token *tk)
{
    if (tk->type == TK_NAME)
        return !is_name(tk, "else") && !is_name(tk, "or") && !is_name(tk, "and") && !is_name(tk, "if") &&
               !is_name(tk, "in") && !is_name(tk, "is") && !is_name(tk, "not");
    return tk->type == TK_STRING || tk->type == TK_INT || tk->type == TK_FLOAT || is_op(tk, '(') ||
           is_op(tk, '[') || is_op(tk, '{');
}

/* Filters (x | f(args)) and tests (x is [not] t args) after a postfix expression. */
static jj_node *parse_filters(parser *p, jj_node *n)
{
    for (;;) {
        token *tk = peek(p);
        bool filter = is_op(tk, '|'), test = is_name(tk, "is");
        if (!filter && !test)
            return n;
        next(p);
        bool negated = test && is_name(peek(p), "not");
        if (negated)
            next(p);
        token *name = next(p);
        if (name->type != TK_NAME) {
            fail(p, name->line, KT_ERR_FORMAT, "expected a %s name", filter ? "filter" : "test");
            return NULL;
        }
        jj_node *m = new_node(p, filter ? JJ_FILTER : JJ_TEST, name->line);
        if (!m || !(m->str = arena_strndup(p, name->s, name->len)))
            return NULL;
        m->len = name->len;
        m->a = n;
        m->op = negated ? '!' : 0;
        /* "none" and friends are constants in expressions but names here. */
        list_builder b = {0};
        bool ok = true;
        if (is_op(peek(p), '(')) {
            ok = parse_args(p, &b);
        } else if (test && starts_test_argument(peek(p))) {
            jj_node *arg = parse_primary(p);
            ok = arg && (arg = parse_postfix(p, arg)) && lb_push(p, &b, arg, NULL);
        }
        if (!ok || !lb_finish(p, &b, &m->items, &m->names, &m->n_names)) {
            lb_finish(p, &b, &(jj_list){0}, NULL, NULL);
            return NULL;
        }
        n = m;
    }
}

static jj_node *binary(parser *p, int op, jj_node *a, jj_node *b, int line)
{
    if (!a || !b)
        return NULL;
    jj_node *n = new_node(p, JJ_BINARY, line);
    if (!n)
        return NULL;
    n->op = op;
    n->a = a;
    n->b = b;
    return n;
}

static jj_node *parse_unary(parser *p, bool with_filter)
{
    token *tk = peek(p);
    if (!enter(p, tk->line))
        return NULL;
    jj_node *n;
    if (is_op(tk, '-') || is_op(tk, '+')) {
        next(p);
        jj_node *operand = parse_unary(p, false);
        if (!operand || !(n = new_node(p, JJ_UNARY, tk->line)))
            return NULL;
        n->op = tk->op;
        n->a = operand;
    } else {
        n = parse_primary(p);
        n = n ? parse_postfix(p, n) : NULL;
    }
    if (n && with_filter)
        n = parse_filters(p, n);
    p->depth--;
    return n;
}

static jj_node *parse_pow(parser *p)
{
    jj_node *n = parse_unary(p, true);
    while (n && is_op(peek(p), JJ_OP_POW)) {
        int line = next(p)->line;
        n = binary(p, JJ_OP_POW, n, parse_unary(p, true), line);
    }
    return n;
}

static jj_node *parse_math2(parser *p)
{
    jj_node *n = parse_pow(p);
    for (;;) {
        token *tk = peek(p);
        if (!n || !(is_op(tk, '*') || is_op(tk, '/') || is_op(tk, '%') || is_op(tk, JJ_OP_FLOORDIV)))
            return n;
        next(p);
        n = binary(p, tk->op, n, parse_pow(p), tk->line);
    }
}

static jj_node *parse_concat(parser *p)
{
    jj_node *n = parse_math2(p);
    while (n && is_op(peek(p), '~')) {
        int line = next(p)->line;
        n = binary(p, '~', n, parse_math2(p), line);
    }
    return n;
}

static jj_node *parse_math1(parser *p)
{
    jj_node *n = parse_concat(p);
    for (;;) {
        token *tk = peek(p);
        if (!n || !(is_op(tk, '+') || is_op(tk, '-')))
            return n;
        next(p);
        n = binary(p, tk->op, n, parse_concat(p), tk->line);
    }
}

/* a < b < c is (a < b) and (b < c), as in Python. */
static jj_node *parse_compare(parser *p)
{
    jj_node *n = parse_math1(p), *chain = NULL, *left = n;
    for (;;) {
        token *tk = peek(p);
        int op = 0;
        if (tk->type == TK_OP && (tk->op == JJ_OP_EQ || tk->op == JJ_OP_NE || tk->op == '<' || tk->op == '>' ||
                                  tk->op == JJ_OP_LE || tk->op == JJ_OP_GE))
            op = tk->op;
        else if (is_name(tk, "in"))
            op = JJ_OP_IN;
        else if (is_name(tk, "not") && is_name(&p->toks[p->at + 1], "in"))
            op = JJ_OP_NOT_IN;
        if (!left || !op)
            return chain ? chain : left;
        next(p);
        if (op == JJ_OP_NOT_IN)
            next(p);
        jj_node *right = parse_math1(p);
        jj_node *cmp = binary(p, op, left, right, tk->line);
        if (!cmp)
            return NULL;
        chain = chain ? binary(p, JJ_OP_AND, chain, cmp, tk->line) : cmp;
        left = right;
    }
}

static jj_node *parse_not(parser *p)
{
    token *tk = peek(p);
    if (is_name(tk, "not")) {
        next(p);
        if (!enter(p, tk->line))
            return NULL;
        jj_node *operand = parse_not(p), *n = NULL;
        if (operand && (n = new_node(p, JJ_UNARY, tk->line))) {
            n->op = '!';
            n->a = operand;
        }
        p->depth--;
        return n;
    }
    return parse_compare(p);
}

static jj_node *parse_and(parser *p)
{
    jj_node *n = parse_not(p);
    while (n && is_name(peek(p), "and")) {
        int line = next(p)->line;
        n = binary(p, JJ_OP_AND, n, parse_not(p), line);
    }
    return n;
}

static jj_node *parse_or(parser *p)
{
    jj_node *n = parse_and(p);
    while (n && is_name(peek(p), "or")) {
        int line = next(p)->line;
        n = binary(p, JJ_OP_OR, n, parse_and(p), line);
    }
    return n;
}

static jj_node *parse_expression(parser *p)
{
    token *start = peek(p);
    if (!enter(p, start->line))
        return NULL;
    jj_node *n = parse_or(p);
    while (n && is_name(peek(p), "if")) {
        int line = next(p)->line;
        jj_node *cond = parse_or(p), *orelse = NULL;
        if (cond && is_name(peek(p), "else")) {
            next(p);
            if (!(orelse = parse_expression(p)))
                cond = NULL;
        }
        jj_node *c = cond ? new_node(p, JJ_COND, line) : NULL;
        if (c) {
            c->a = n;
            c->b = cond;
            c->c = orelse;
        }
        n = c;
    }
    p->depth--;
    return n;
}

/* An expression, or a bare tuple "a, b" (the value of {{ }} and set). */
static jj_node *parse_tuple(parser *p)
{
    jj_node *first = parse_expression(p);
    if (!first || !is_op(peek(p), ','))
        return first;
    jj_node *n = new_node(p, JJ_TUPLE, first->line);
    list_builder b = {0};
    bool ok = n && lb_push(p, &b, first, NULL);
    while (ok && is_op(peek(p), ',')) {
        next(p);
        token *tk = peek(p);
        if (tk->type == TK_BLOCK_END || tk->type == TK_VAR_END)
            break;
        jj_node *item = parse_expression(p);
        ok = item && lb_push(p, &b, item, NULL);
    }
    if (!lb_finish(p, &b, n ? &n->items : &(jj_list){0}, NULL, NULL) || !ok)
        return NULL;
    return n;
}

/* --------------------------------------------------------------- statements --- */

static bool expect_block_end(parser *p, const char *tag)
{
    token *tk = next(p);
    if (tk->type != TK_BLOCK_END)
        return fail(p, tk->line, KT_ERR_FORMAT, "expected '%%}' to close '%s', got %s", tag, describe(tk));
    return true;
}

/* Names: "a", "a, b" or "(a, b)" (for and set targets). */
static bool parse_targets(parser *p, list_builder *b)
{
    bool paren = is_op(peek(p), '(');
    if (paren)
        next(p);
    for (;;) {
        token *tk = next(p);
        if (tk->type != TK_NAME)
            return fail(p, tk->line, KT_ERR_FORMAT, "expected a variable name, got %s", describe(tk));
        const char *name = arena_strndup(p, tk->s, tk->len);
        if (!name || !lb_push(p, b, NULL, name))
            return false;
        if (!is_op(peek(p), ','))
            break;
        next(p);
    }
    return !paren || expect_op(p, ')');
}

static bool parse_body(parser *p, jj_list *body, const char *const *ends, size_t *which, int open_line,
                       const char *opener);

static jj_node *parse_if(parser *p, int line)
{
    jj_node *n = new_node(p, JJ_IF, line);
    if (!n || !(n->a = parse_expression(p)) || !expect_block_end(p, "if"))
        return NULL;
    static const char *const ends[] = {"elif", "else", "endif", NULL};
    size_t which;
    if (!parse_body(p, &n->body, ends, &which, line, "if"))
        return NULL;
    if (which == 0) {
        jj_node *elif = parse_if(p, p->toks[p->at - 1].line);
        if (!elif || !(n->orelse.items = arena_alloc(p->t, sizeof *n->orelse.items)))
            return elif ? (nomem(p), NULL) : NULL;
        n->orelse.items[0] = elif;
        n->orelse.n = 1;
        return n; /* the elif consumed the endif */
    }
    if (which == 1) {
        static const char *const endif[] = {"endif", NULL};
        if (!expect_block_end(p, "else") || !parse_body(p, &n->orelse, endif, &which, line, "if"))
            return NULL;
    }
    return expect_block_end(p, "endif") ? n : NULL;
}

static jj_node *parse_for(parser *p, int line)
{
    jj_node *n = new_node(p, JJ_FOR, line);
    list_builder b = {0};
    if (!n || !parse_targets(p, &b) || !lb_finish(p, &b, &(jj_list){0}, &n->names, &n->n_names)) {
        lb_finish(p, &b, &(jj_list){0}, NULL, NULL);
        return NULL;
    }
    if (!is_name(peek(p), "in")) {
        fail(p, line, KT_ERR_FORMAT, "expected 'in' in a for loop");
        return NULL;
    }
    next(p);
    if (!(n->a = parse_or(p)))
        return NULL;
    if (is_name(peek(p), "if")) {
        next(p);
        if (!(n->b = parse_expression(p)))
            return NULL;
    }
    if (is_name(peek(p), "recursive")) {
        fail(p, line, KT_ERR_FORMAT, "recursive for loops are not supported");
        return NULL;
    }
    if (!expect_block_end(p, "for"))
        return NULL;
    static const char *const ends[] = {"else", "endfor", NULL};
    size_t which, refs = p->loop_refs;
    if (!parse_body(p, &n->body, ends, &which, line, "for"))
        return NULL;
    n->op = p->loop_refs != refs; /* the body reads `loop` */
    if (which == 0) {
        static const char *const endfor[] = {"endfor", NULL};
        if (!expect_block_end(p, "else") || !parse_body(p, &n->orelse, endfor, &which, line, "for"))
            return NULL;
    }
    return expect_block_end(p, "endfor") ? n : NULL;
}

static jj_node *parse_set(parser *p, int line)
{
    jj_node *n = new_node(p, JJ_SET, line);
    if (!n)
        return NULL;
    token *first = peek(p);
    if (first->type == TK_NAME && is_op(&p->toks[p->at + 1], '.')) { /* set ns.attr = value */
        next(p);
        next(p);
        token *attr = next(p);
        if (attr->type != TK_NAME) {
            fail(p, attr->line, KT_ERR_FORMAT, "expected an attribute name after '.'");
            return NULL;
        }
        if (!(n->a = new_node(p, JJ_NAME, first->line)) || !(n->a->str = arena_strndup(p, first->s, first->len)) ||
            !(n->str = arena_strndup(p, attr->s, attr->len)))
            return NULL;
        n->a->len = first->len;
        n->len = attr->len;
    } else {
        list_builder b = {0};
        if (!parse_targets(p, &b) || !lb_finish(p, &b, &(jj_list){0}, &n->names, &n->n_names)) {
            lb_finish(p, &b, &(jj_list){0}, NULL, NULL);
            return NULL;
        }
    }
    if (is_op(peek(p), '=')) {
        next(p);
        if (!(n->b = parse_tuple(p)))
            return NULL;
        return expect_block_end(p, "set") ? n : NULL;
    }
    if (n->a || n->n_names != 1) {
        fail(p, line, KT_ERR_FORMAT, "a block set takes one variable name");
        return NULL;
    }
    n->kind = JJ_SET_BLOCK;
    static const char *const ends[] = {"endset", NULL};
    size_t which;
    if (!expect_block_end(p, "set") || !parse_body(p, &n->body, ends, &which, line, "set"))
        return NULL;
    return expect_block_end(p, "endset") ? n : NULL;
}

static jj_node *parse_macro(parser *p, int line)
{
    token *name = next(p);
    if (name->type != TK_NAME) {
        fail(p, name->line, KT_ERR_FORMAT, "expected a macro name");
        return NULL;
    }
    jj_node *n = new_node(p, JJ_MACRO, line);
    if (!n || !(n->str = arena_strndup(p, name->s, name->len)) || !expect_op(p, '('))
        return NULL;
    n->len = name->len;
    list_builder b = {0};
    bool ok = true;
    while (ok && !is_op(peek(p), ')')) {
        token *param = next(p);
        if (param->type != TK_NAME) {
            ok = fail(p, param->line, KT_ERR_FORMAT, "expected a parameter name");
            break;
        }
        const char *pname = arena_strndup(p, param->s, param->len);
        jj_node *def = NULL;
        if (pname && is_op(peek(p), '=')) {
            next(p);
            ok = (def = parse_expression(p)) != NULL;
        }
        ok = ok && pname && lb_push(p, &b, def, pname);
        if (!ok || !is_op(peek(p), ','))
            break;
        next(p);
    }
    if (!lb_finish(p, &b, &n->items, &n->names, &n->n_names) || !ok || !expect_op(p, ')') ||
        !expect_block_end(p, "macro"))
        return NULL;
    static const char *const ends[] = {"endmacro", NULL};
    size_t which;
    if (!parse_body(p, &n->body, ends, &which, line, "macro"))
        return NULL;
    if (peek(p)->type == TK_NAME) /* {% endmacro name %} */
        next(p);
    return expect_block_end(p, "endmacro") ? n : NULL;
}

static jj_node *parse_block(parser *p, int line, const char *tag, const char *end)
{
    jj_node *n = new_node(p, JJ_BLOCK, line);
    if (!n)
        return NULL;
    if (strcmp(tag, "filter") == 0) {
        token *name = next(p);
        if (name->type != TK_NAME) {
            fail(p, name->line, KT_ERR_FORMAT, "expected a filter name");
            return NULL;
        }
        if (!(n->str = arena_strndup(p, name->s, name->len)))
            return NULL;
        n->len = name->len;
        if (is_op(peek(p), '(')) {
            list_builder b = {0};
            if (!parse_args(p, &b) || !lb_finish(p, &b, &n->items, &n->names, &n->n_names)) {
                lb_finish(p, &b, &(jj_list){0}, NULL, NULL);
                return NULL;
            }
        }
    }
    const char *const ends[] = {end, NULL};
    size_t which;
    if (!expect_block_end(p, tag) || !parse_body(p, &n->body, ends, &which, line, tag))
        return NULL;
    return expect_block_end(p, end) ? n : NULL;
}

static jj_node *parse_statement(parser *p)
{
    token *tk = next(p); /* the tag name */
    int line = tk->line;
    if (tk->type != TK_NAME) {
        fail(p, line, KT_ERR_FORMAT, "expected a tag name after '{%%', got %s", describe(tk));
        return NULL;
    }
    if (!enter(p, line))
        return NULL;
    jj_node *n = NULL;
    if (is_name(tk, "if"))
        n = parse_if(p, line);
    else if (is_name(tk, "for"))
        n = parse_for(p, line);
    else if (is_name(tk, "set"))
        n = parse_set(p, line);
    else if (is_name(tk, "macro"))
        n = parse_macro(p, line);
    else if (is_name(tk, "generation"))
        n = parse_block(p, line, "generation", "endgeneration");
    else if (is_name(tk, "filter"))
        n = parse_block(p, line, "filter", "endfilter");
    else if (is_name(tk, "break") || is_name(tk, "continue")) {
        n = new_node(p, is_name(tk, "break") ? JJ_BREAK : JJ_CONTINUE, line);
        if (n && !expect_block_end(p, is_name(tk, "break") ? "break" : "continue"))
            n = NULL;
    } else {
        fail(p, line, KT_ERR_FORMAT, "tag '%.*s' is not supported (or closes nothing open)", (int)tk->len, tk->s);
    }
    p->depth--;
    return n;
}

/* Statements up to a {% tag %} whose name is in ends (NULL-terminated; NULL
 * ends: the end of the template); *which is its index, the tag name consumed. */
static bool parse_body(parser *p, jj_list *body, const char *const *ends, size_t *which, int open_line,
                       const char *opener)
{
    list_builder b = {0};
    bool ok = true;
    for (;;) {
        token *tk = next(p);
        jj_node *n = NULL;
        if (tk->type == TK_EOF) {
            if (ends) {
                ok = fail(p, open_line, KT_ERR_FORMAT, "'%s' is never closed (expected '%s')", opener, ends[0]);
            }
            break;
        }
        if (tk->type == TK_TEXT) {
            if ((n = new_node(p, JJ_TEXT, tk->line))) {
                n->str = tk->s;
                n->len = tk->len;
            }
        } else if (tk->type == TK_VAR_BEGIN) {
            if ((n = new_node(p, JJ_OUTPUT, tk->line)) && (n->a = parse_tuple(p))) {
                token *end = next(p);
                if (end->type != TK_VAR_END)
                    n = (fail(p, end->line, KT_ERR_FORMAT, "expected '}}', got %s", describe(end)), NULL);
            } else {
                n = NULL;
            }
        } else if (tk->type == TK_BLOCK_BEGIN) {
            token *name = peek(p);
            bool ended = false;
            for (size_t k = 0; ends && ends[k]; k++)
                if (is_name(name, ends[k])) {
                    next(p);
                    *which = k;
                    ended = true;
                }
            if (ended)
                break;
            n = parse_statement(p);
        } else {
            fail(p, tk->line, KT_ERR_FORMAT, "unexpected %s", describe(tk));
        }
        if (!n || !lb_push(p, &b, n, NULL)) {
            ok = false;
            break;
        }
    }
    return lb_finish(p, &b, body, NULL, NULL) && ok;
}

kt_status kt_jinja_parse(const char *source, size_t len, kt_jinja_template **out, kt_err *err)
{
    *out = NULL;
    if (!source && len)
        return kt_err_set(err, KT_ERR_INVALID, "chat template: NULL source");
    kt_jinja_template *t = calloc(1, sizeof *t);
    if (!t)
        return kt_err_set(err, KT_ERR_NOMEM, "out of memory parsing the chat template");
    parser p = {.t = t, .err = err};
    if (len && source[len - 1] == '\n') /* jinja2 drops one trailing newline */
        len -= len >= 2 && source[len - 2] == '\r' ? 2 : 1;
    char *src = arena_alloc(t, len + 1);
    if (!src) {
        kt_jinja_destroy(t);
        return kt_err_set(err, KT_ERR_NOMEM, "out of memory parsing the chat template");
    }
    if (len)
        memcpy(src, source, len);
    src[len] = '\0';
    p.src = src;
    p.len = len;
    if (lex(&p)) {
        size_t which;
        parse_body(&p, &t->root, NULL, &which, 1, "");
    }
    free(p.toks);
    if (p.st != KT_OK) {
        kt_jinja_destroy(t);
        return p.st;
    }
    *out = t;
    return KT_OK;
}
