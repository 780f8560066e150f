/*
 * json_schema.c - the JSON Schema subset of json_schema.h as grammar nodes.
 *
 * One recursive walk over the schema, carrying the JSON pointer of where it
 * is for errors.  A $ref target is compiled once: its node is made a forward
 * node first, so a schema that refers to itself (trees, linked lists) becomes
 * a cycle in the grammar that the automaton's stack unrolls as it goes.
 */
#include "json_schema.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_COMPILE_DEPTH 128

struct ref_memo {
    const json_t *target;
    uint32_t node;
};

struct ctx {
    struct kt_grammar *g;
    const json_t *root;
    struct ref_memo *refs;
    size_t n_refs, cap_refs;
    char ptr[512];
    size_t ptr_len;
    int depth;
    bool have_any;
    uint32_t any;
};

static kt_status fail(struct ctx *c, kt_err *err, kt_status st, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static kt_status fail(struct ctx *c, kt_err *err, kt_status st, const char *fmt, ...)
{
    char what[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return kt_err_set(err, st, "#%s: %s", c->ptr, what);
}

/* Appends "/token" (escaped as RFC 6901 says) to the pointer; returns the old length. */
static size_t ptr_push(struct ctx *c, const char *token)
{
    size_t old = c->ptr_len;
    if (c->ptr_len + 1 < sizeof c->ptr)
        c->ptr[c->ptr_len++] = '/';
    for (const char *s = token; *s && c->ptr_len + 2 < sizeof c->ptr; s++) {
        if (*s == '~' || *s == '/') {
            c->ptr[c->ptr_len++] = '~';
            c->ptr[c->ptr_len++] = *s == '~' ? '0' : '1';
        } else {
            c->ptr[c->ptr_len++] = *s;
        }
    }
    c->ptr[c->ptr_len] = '\0';
    return old;
}

static size_t ptr_push_index(struct ctx *c, size_t i)
{
    char buf[24];
    snprintf(buf, sizeof buf, "%zu", i);
    return ptr_push(c, buf);
}

static void ptr_pop(struct ctx *c, size_t old)
{
    c->ptr_len = old;
    c->ptr[old] = '\0';
}

static kt_status compile(struct ctx *c, const json_t *s, uint32_t *node, kt_err *err);

/* ---- any value ------------------------------------------------------------------- */

static kt_status any_value(struct kt_grammar *g, uint32_t *node, kt_err *err)
{
    uint32_t fwd, parts[5], alt;
    static const char *const lits[] = {"true", "false", "null"};
    static const size_t lens[] = {4, 5, 4};
    kt_status st = kt_grammar_forward(g, &fwd, err);
    if (st == KT_OK)
        st = kt_grammar_json_map(g, fwd, &parts[0], err);
    if (st == KT_OK)
        st = kt_grammar_json_array(g, fwd, 0, KT_GRAMMAR_UNBOUNDED, &parts[1], err);
    if (st == KT_OK)
        st = kt_grammar_json_string(g, 0, KT_GRAMMAR_UNBOUNDED, &parts[2], err);
    if (st == KT_OK)
        st = kt_grammar_json_number(g, KT_GRAMMAR_NUMBER, &parts[3], err);
    if (st == KT_OK)
        st = kt_grammar_literals(g, lits, lens, 3, &parts[4], err);
    if (st == KT_OK)
        st = kt_grammar_alt(g, parts, 5, &alt, err);
    if (st == KT_OK)
        st = kt_grammar_define(g, fwd, alt, err);
    if (st == KT_OK)
        *node = fwd;
    return st;
}

kt_status kt_json_any_value(struct kt_grammar *g, uint32_t *node, kt_err *err)
{
    return any_value(g, node, err);
}

kt_status kt_json_any_object(struct kt_grammar *g, uint32_t *node, kt_err *err)
{
    uint32_t any;
    kt_status st = any_value(g, &any, err);
    return st == KT_OK ? kt_grammar_json_map(g, any, node, err) : st;
}

static kt_status ctx_any(struct ctx *c, uint32_t *node, kt_err *err)
{
    if (!c->have_any) {
        kt_status st = any_value(c->g, &c->any, err);
        if (st != KT_OK)
            return st;
        c->have_any = true;
    }
    *node = c->any;
    return KT_OK;
}

/* ---- keywords -------------------------------------------------------------------- */

/* Constraints the grammar cannot enforce: refused rather than ignored. */
static const char *const refused[] = {
    "format", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf",
    "patternProperties", "propertyNames", "minProperties", "maxProperties", "uniqueItems", "contains",
    "minContains", "maxContains", "prefixItems", "additionalItems", "not", "if", "then", "else", "oneOf",
    "dependentRequired", "dependentSchemas", "dependencies", "unevaluatedProperties", "unevaluatedItems",
    "$dynamicRef", "$recursiveRef",
};

/* Keywords that say what a value is; beside $ref or anyOf they would have to hold too. */
static const char *const constraining[] = {
    "type", "properties", "required", "additionalProperties", "items", "minItems", "maxItems",
    "minLength", "maxLength", "enum", "const", "anyOf", "allOf", "$ref",
};

static bool has(const json_t *s, const char *key)
{
    const json_t *v = json_object_get(s, key);
    return v != NULL;
}

static kt_status count_keyword(struct ctx *c, const json_t *s, const char *key, uint32_t dflt, uint32_t *out,
                               kt_err *err)
{
    const json_t *v = json_object_get(s, key);
    *out = dflt;
    if (!v)
        return KT_OK;
    size_t old = ptr_push(c, key);
    kt_status st = KT_OK;
    if (!json_is_integer(v) || json_integer_value(v) < 0)
        st = fail(c, err, KT_ERR_INVALID, "'%s' must be a non-negative integer", key);
    else
        *out = json_integer_value(v) >= (json_int_t)UINT32_MAX ? KT_GRAMMAR_UNBOUNDED
                                                               : (uint32_t)json_integer_value(v);
    ptr_pop(c, old);
    return st;
}

/* ---- $ref -------------------------------------------------------------------------- */

static const json_t *resolve_pointer(const json_t *root, const char *ref)
{
    if (strcmp(ref, "#") == 0)
        return root;
    if (strncmp(ref, "#/", 2) != 0)
        return NULL;
    const json_t *cur = root;
    const char *p = ref + 2;
    char token[256];
    for (;;) {
        size_t k = 0;
        while (*p && *p != '/') {
            char ch = *p++;
            if (ch == '~' && (*p == '0' || *p == '1'))
                ch = *p++ == '0' ? '~' : '/';
            if (k + 1 >= sizeof token)
                return NULL;
            token[k++] = ch;
        }
        token[k] = '\0';
        if (json_is_object(cur)) {
            cur = json_object_get(cur, token);
        } else if (json_is_array(cur)) {
            char *end;
            long i = strtol(token, &end, 10);
            cur = (*token && !*end && i >= 0) ? json_array_get(cur, (size_t)i) : NULL;
        } else {
            return NULL;
        }
        if (!cur)
            return NULL;
        if (!*p)
            return cur;
        p++;
    }
}

static kt_status compile_ref(struct ctx *c, const json_t *s, uint32_t *node, kt_err *err)
{
    const json_t *ref = json_object_get(s, "$ref");
    size_t old = ptr_push(c, "$ref");
    kt_status st = KT_OK;
    if (!json_is_string(ref)) {
        st = fail(c, err, KT_ERR_INVALID, "'$ref' must be a string");
        goto done;
    }
    for (size_t i = 0; i < sizeof constraining / sizeof *constraining; i++)
        if (strcmp(constraining[i], "$ref") != 0 && has(s, constraining[i])) {
            ptr_pop(c, old);
            st = fail(c, err, KT_ERR_UNSUPPORTED, "'%s' beside '$ref' is not supported (put it in the referenced schema)",
                      constraining[i]);
            return st;
        }
    const json_t *target = resolve_pointer(c->root, json_string_value(ref));
    if (!target) {
        st = fail(c, err, json_string_value(ref)[0] == '#' ? KT_ERR_INVALID : KT_ERR_UNSUPPORTED,
                  "'%.200s' does not resolve (give \"#\" or a JSON pointer into this schema such as \"#/$defs/Name\")",
                  json_string_value(ref));
        goto done;
    }
    for (size_t i = 0; i < c->n_refs; i++)
        if (c->refs[i].target == target) {
            *node = c->refs[i].node;
            goto done;
        }
    if (c->n_refs == c->cap_refs) {
        size_t cap = c->cap_refs ? 2 * c->cap_refs : 8;
        struct ref_memo *r = realloc(c->refs, cap * sizeof *r);
        if (!r) {
            st = kt_err_set(err, KT_ERR_NOMEM, "json schema: out of memory");
            goto done;
        }
        c->refs = r;
        c->cap_refs = cap;
    }
    uint32_t fwd, body;
    if ((st = kt_grammar_forward(c->g, &fwd, err)) != KT_OK)
        goto done;
    c->refs[c->n_refs++] = (struct ref_memo){target, fwd};
    /* errors inside the target name its own place */
    char saved[sizeof c->ptr];
    size_t saved_len = c->ptr_len;
    memcpy(saved, c->ptr, sizeof saved);
    snprintf(c->ptr, sizeof c->ptr, "%s", json_string_value(ref) + 1);
    c->ptr_len = strlen(c->ptr);
    st = compile(c, target, &body, err);
    memcpy(c->ptr, saved, sizeof saved);
    c->ptr_len = saved_len;
    if (st != KT_OK)
        goto done;
    if ((st = kt_grammar_define(c->g, fwd, body, err)) != KT_OK) {
        st = fail(c, err, KT_ERR_INVALID, "'%.200s' only refers to itself", json_string_value(ref));
        goto done;
    }
    *node = fwd;
done:
    ptr_pop(c, old);
    return st;
}

/* ---- enum and const ------------------------------------------------------------------ */

static bool type_allows(const json_t *type, const json_t *v)
{
    if (!type)
        return true;
    const char *names[8];
    size_t n = 0;
    if (json_is_string(type))
        names[n++] = json_string_value(type);
    else
        for (size_t i = 0; i < json_array_size(type) && n < 8; i++)
            if (json_is_string(json_array_get(type, i)))
                names[n++] = json_string_value(json_array_get(type, i));
    for (size_t i = 0; i < n; i++) {
        const char *t = names[i];
        if ((strcmp(t, "string") == 0 && json_is_string(v)) || (strcmp(t, "number") == 0 && json_is_number(v)) ||
            (strcmp(t, "integer") == 0 && json_is_integer(v)) || (strcmp(t, "boolean") == 0 && json_is_boolean(v)) ||
            (strcmp(t, "null") == 0 && json_is_null(v)) || (strcmp(t, "object") == 0 && json_is_object(v)) ||
            (strcmp(t, "array") == 0 && json_is_array(v)))
            return true;
    }
    return false;
}

static kt_status compile_values(struct ctx *c, const json_t *s, const json_t *values, const char *key,
                                uint32_t *node, kt_err *err)
{
    size_t n = json_array_size(values), k = 0;
    char **texts = calloc(n ? n : 1, sizeof *texts);
    size_t *lens = calloc(n ? n : 1, sizeof *lens);
    kt_status st = KT_OK;
    size_t old = ptr_push(c, key);
    if (!texts || !lens) {
        st = kt_err_set(err, KT_ERR_NOMEM, "json schema: out of memory");
        goto done;
    }
    const json_t *type = json_object_get(s, "type");
    for (size_t i = 0; i < n; i++) {
        const json_t *v = json_array_get(values, i);
        if (!type_allows(type, v))
            continue;
        char *text = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
        if (!text) {
            st = kt_err_set(err, KT_ERR_NOMEM, "json schema: out of memory");
            goto done;
        }
        bool dup = false;
        for (size_t j = 0; j < k && !dup; j++)
            dup = strcmp(texts[j], text) == 0;
        if (dup) {
            free(text);
            continue;
        }
        texts[k] = text;
        lens[k++] = strlen(text);
    }
    if (k == 0) {
        st = fail(c, err, KT_ERR_INVALID, "no value of '%s' has the schema's type: nothing can match", key);
        goto done;
    }
    st = kt_grammar_literals(c->g, (const char *const *)texts, lens, k, node, err);
done:
    ptr_pop(c, old);
    for (size_t i = 0; texts && i < k; i++)
        free(texts[i]);
    free(texts);
    free(lens);
    return st;
}

/* ---- types ---------------------------------------------------------------------------- */

static kt_status compile_object(struct ctx *c, const json_t *s, uint32_t *node, kt_err *err)
{
    const json_t *props = json_object_get(s, "properties");
    const json_t *required = json_object_get(s, "required");
    const json_t *extra = json_object_get(s, "additionalProperties");
    kt_status st = KT_OK;
    if (props && !json_is_object(props)) {
        size_t old = ptr_push(c, "properties");
        st = fail(c, err, KT_ERR_INVALID, "'properties' must be an object");
        ptr_pop(c, old);
        return st;
    }
    if (required && !json_is_array(required)) {
        size_t old = ptr_push(c, "required");
        st = fail(c, err, KT_ERR_INVALID, "'required' must be an array of property names");
        ptr_pop(c, old);
        return st;
    }
    if (extra && !json_is_boolean(extra) && !json_is_object(extra)) {
        size_t old = ptr_push(c, "additionalProperties");
        st = fail(c, err, KT_ERR_INVALID, "'additionalProperties' must be a boolean or a schema");
        ptr_pop(c, old);
        return st;
    }
    for (size_t i = 0; i < json_array_size(required); i++) {
        const json_t *r = json_array_get(required, i);
        size_t old = ptr_push(c, "required");
        ptr_push_index(c, i);
        if (!json_is_string(r))
            st = fail(c, err, KT_ERR_INVALID, "a required name must be a string");
        else if (!json_object_get(props, json_string_value(r)) && !(extra && !json_is_false(extra)))
            st = fail(c, err, KT_ERR_INVALID, "'%.100s' is required but not among the properties (and no others are "
                                              "allowed)", json_string_value(r));
        else if (!json_object_get(props, json_string_value(r)))
            st = fail(c, err, KT_ERR_UNSUPPORTED, "'%.100s' is required but has no schema in 'properties'",
                      json_string_value(r));
        ptr_pop(c, old);
        if (st != KT_OK)
            return st;
    }
    size_t n = json_object_size(props);
    if (n == 0) {
        if (json_is_false(extra))
            return kt_grammar_json_object(c->g, NULL, 0, node, err);
        uint32_t value;
        if (json_is_object(extra)) {
            size_t old = ptr_push(c, "additionalProperties");
            st = compile(c, extra, &value, err);
            ptr_pop(c, old);
        } else {
            st = ctx_any(c, &value, err);
        }
        return st == KT_OK ? kt_grammar_json_map(c->g, value, node, err) : st;
    }
    if (n > 256) {
        size_t old = ptr_push(c, "properties");
        st = fail(c, err, KT_ERR_UNSUPPORTED, "%zu properties (at most 256)", n);
        ptr_pop(c, old);
        return st;
    }
    struct kt_grammar_property *p = calloc(n, sizeof *p);
    if (!p)
        return kt_err_set(err, KT_ERR_NOMEM, "json schema: out of memory");
    size_t i = 0;
    const char *key;
    const json_t *sub;
    json_object_foreach((json_t *)props, key, sub)
    {
        size_t old = ptr_push(c, "properties");
        ptr_push(c, key);
        st = compile(c, sub, &p[i].value, err);
        ptr_pop(c, old);
        if (st != KT_OK)
            break;
        p[i].name = key;
        p[i].name_len = strlen(key);
        for (size_t r = 0; r < json_array_size(required); r++)
            if (strcmp(json_string_value(json_array_get(required, r)), key) == 0)
                p[i].required = true;
        i++;
    }
    if (st == KT_OK)
        st = kt_grammar_json_object(c->g, p, n, node, err);
    free(p);
    return st;
}

static kt_status compile_array(struct ctx *c, const json_t *s, uint32_t *node, kt_err *err)
{
    uint32_t min, max, item;
    kt_status st = count_keyword(c, s, "minItems", 0, &min, err);
    if (st == KT_OK)
        st = count_keyword(c, s, "maxItems", KT_GRAMMAR_UNBOUNDED, &max, err);
    if (st != KT_OK)
        return st;
    if (min > max)
        return fail(c, err, KT_ERR_INVALID, "minItems %u is more than maxItems %u: nothing can match", min, max);
    const json_t *items = json_object_get(s, "items");
    if (items) {
        if (!json_is_object(items) && !json_is_boolean(items)) {
            size_t old = ptr_push(c, "items");
            st = fail(c, err, KT_ERR_UNSUPPORTED, "'items' must be one schema (tuples: not supported)");
            ptr_pop(c, old);
            return st;
        }
        if (json_is_false(items)) {
            if (min > 0)
                return fail(c, err, KT_ERR_INVALID, "'items' false with minItems %u: nothing can match", min);
            max = 0;
            st = ctx_any(c, &item, err);
        } else {
            size_t old = ptr_push(c, "items");
            st = compile(c, items, &item, err);
            ptr_pop(c, old);
        }
    } else {
        st = ctx_any(c, &item, err);
    }
    if (st != KT_OK)
        return st;
    return kt_grammar_json_array(c->g, item, min, max, node, err);
}

static const char *const type_names[] = {"object", "array", "string", "number", "integer", "boolean", "null"};

static bool known_type(const char *t)
{
    for (size_t i = 0; i < sizeof type_names / sizeof *type_names; i++)
        if (strcmp(t, type_names[i]) == 0)
            return true;
    return false;
}

static kt_status unknown_type(struct ctx *c, const char *t, kt_err *err)
{
    return fail(c, err, KT_ERR_INVALID,
                "unknown type '%.64s' (give object, array, string, number, integer, boolean or null)", t);
}

static kt_status compile_type(struct ctx *c, const json_t *s, const char *type, uint32_t *node, kt_err *err)
{
    if (strcmp(type, "object") == 0)
        return compile_object(c, s, node, err);
    if (strcmp(type, "array") == 0)
        return compile_array(c, s, node, err);
    if (strcmp(type, "string") == 0 && has(s, "pattern")) {
        const json_t *p = json_object_get(s, "pattern");
        size_t old = ptr_push(c, "pattern");
        kt_status st;
        if (!json_is_string(p))
            st = fail(c, err, KT_ERR_INVALID, "'pattern' must be a string");
        else if (has(s, "minLength") || has(s, "maxLength"))
            st = fail(c, err, KT_ERR_UNSUPPORTED, "'pattern' together with minLength/maxLength is not supported "
                                                  "(bound the length in the pattern)");
        else if ((st = kt_grammar_json_pattern_string(c->g, json_string_value(p), json_string_length(p), node,
                                                      err)) != KT_OK && st != KT_ERR_NOMEM) {
            char why[sizeof err->msg];
            snprintf(why, sizeof why, "%s", err->msg);
            st = fail(c, err, st, "%s", why);
        }
        ptr_pop(c, old);
        return st;
    }
    if (strcmp(type, "string") == 0) {
        uint32_t min, max;
        kt_status st = count_keyword(c, s, "minLength", 0, &min, err);
        if (st == KT_OK)
            st = count_keyword(c, s, "maxLength", KT_GRAMMAR_UNBOUNDED, &max, err);
        if (st == KT_OK && min > max)
            st = fail(c, err, KT_ERR_INVALID, "minLength %u is more than maxLength %u: nothing can match", min, max);
        return st == KT_OK ? kt_grammar_json_string(c->g, min, max, node, err) : st;
    }
    if (strcmp(type, "number") == 0)
        return kt_grammar_json_number(c->g, KT_GRAMMAR_NUMBER, node, err);
    if (strcmp(type, "integer") == 0)
        return kt_grammar_json_number(c->g, KT_GRAMMAR_INTEGER, node, err);
    if (strcmp(type, "boolean") == 0) {
        static const char *const lits[] = {"true", "false"};
        static const size_t lens[] = {4, 5};
        return kt_grammar_literals(c->g, lits, lens, 2, node, err);
    }
    if (strcmp(type, "null") == 0)
        return kt_grammar_literal(c->g, "null", 4, node, err);
    return fail(c, err, KT_ERR_INVALID,
                "unknown type '%.64s' (give object, array, string, number, integer, boolean or null)", type);
}

static kt_status compile_any_of(struct ctx *c, const json_t *s, uint32_t *node, kt_err *err)
{
    const json_t *any = json_object_get(s, "anyOf");
    for (size_t i = 0; i < sizeof constraining / sizeof *constraining; i++)
        if (strcmp(constraining[i], "anyOf") != 0 && has(s, constraining[i]))
            return fail(c, err, KT_ERR_UNSUPPORTED, "'%s' beside 'anyOf' is not supported (move it into each "
                                                    "alternative)", constraining[i]);
    size_t old = ptr_push(c, "anyOf");
    kt_status st = KT_OK;
    size_t n = json_array_size(any);
    uint32_t *alts = NULL;
    if (!json_is_array(any) || n == 0) {
        st = fail(c, err, KT_ERR_INVALID, "'anyOf' must be a non-empty array of schemas");
        goto done;
    }
    if (!(alts = malloc(n * sizeof *alts))) {
        st = kt_err_set(err, KT_ERR_NOMEM, "json schema: out of memory");
        goto done;
    }
    for (size_t i = 0; i < n && st == KT_OK; i++) {
        size_t o = ptr_push_index(c, i);
        st = compile(c, json_array_get(any, i), &alts[i], err);
        ptr_pop(c, o);
    }
    if (st == KT_OK)
        st = n == 1 ? (*node = alts[0], KT_OK) : kt_grammar_alt(c->g, alts, n, node, err);
done:
    free(alts);
    ptr_pop(c, old);
    return st;
}

static kt_status compile(struct ctx *c, const json_t *s, uint32_t *node, kt_err *err)
{
    if (json_is_true(s))
        return ctx_any(c, node, err);
    if (json_is_false(s))
        return fail(c, err, KT_ERR_INVALID, "the schema false matches nothing");
    if (!json_is_object(s))
        return fail(c, err, KT_ERR_INVALID, "a schema must be an object or a boolean, not %s",
                    json_is_array(s) ? "an array" : json_is_string(s) ? "a string" : "a number or null");
    if (++c->depth > MAX_COMPILE_DEPTH) {
        c->depth--;
        return fail(c, err, KT_ERR_UNSUPPORTED, "the schema nests deeper than %d levels", MAX_COMPILE_DEPTH);
    }
    kt_status st = KT_OK;
    for (size_t i = 0; i < sizeof refused / sizeof *refused; i++)
        if (has(s, refused[i])) {
            size_t old = ptr_push(c, refused[i]);
            st = fail(c, err, KT_ERR_UNSUPPORTED, "'%s' is not supported by kt's structured outputs", refused[i]);
            ptr_pop(c, old);
            goto done;
        }
    const json_t *type = json_object_get(s, "type");
    if (has(s, "$ref")) {
        st = compile_ref(c, s, node, err);
    } else if (has(s, "anyOf")) {
        st = compile_any_of(c, s, node, err);
    } else if (has(s, "allOf")) {
        const json_t *all = json_object_get(s, "allOf");
        size_t old = ptr_push(c, "allOf");
        if (!json_is_array(all) || json_array_size(all) != 1) {
            st = fail(c, err, KT_ERR_UNSUPPORTED, "'allOf' of more than one schema is not supported");
        } else {
            ptr_push_index(c, 0);
            st = compile(c, json_array_get(all, 0), node, err);
        }
        ptr_pop(c, old);
    } else if (has(s, "const")) {
        json_t *one = json_pack("[O]", json_object_get(s, "const"));
        st = one ? compile_values(c, s, one, "const", node, err) : kt_err_set(err, KT_ERR_NOMEM, "out of memory");
        json_decref(one);
    } else if (has(s, "enum")) {
        const json_t *e = json_object_get(s, "enum");
        if (!json_is_array(e) || json_array_size(e) == 0) {
            size_t old = ptr_push(c, "enum");
            st = fail(c, err, KT_ERR_INVALID, "'enum' must be a non-empty array");
            ptr_pop(c, old);
        } else {
            st = compile_values(c, s, e, "enum", node, err);
        }
    } else if (json_is_string(type)) {
        if (!known_type(json_string_value(type))) {
            size_t old = ptr_push(c, "type");
            st = unknown_type(c, json_string_value(type), err);
            ptr_pop(c, old);
        } else {
            st = compile_type(c, s, json_string_value(type), node, err);
        }
    } else if (json_is_array(type)) {
        size_t n = json_array_size(type);
        uint32_t alts[7];
        if (n == 0 || n > 7) {
            size_t old = ptr_push(c, "type");
            st = fail(c, err, KT_ERR_INVALID, "'type' must name 1 to 7 types");
            ptr_pop(c, old);
            goto done;
        }
        for (size_t i = 0; i < n && st == KT_OK; i++) {
            const json_t *t = json_array_get(type, i);
            if (!json_is_string(t) || !known_type(json_string_value(t))) {
                size_t old = ptr_push(c, "type");
                ptr_push_index(c, i);
                st = json_is_string(t) ? unknown_type(c, json_string_value(t), err)
                                       : fail(c, err, KT_ERR_INVALID, "a type name must be a string");
                ptr_pop(c, old);
                break;
            }
            st = compile_type(c, s, json_string_value(t), &alts[i], err);
        }
        if (st == KT_OK)
            st = n == 1 ? (*node = alts[0], KT_OK) : kt_grammar_alt(c->g, alts, n, node, err);
    } else if (type) {
        size_t old = ptr_push(c, "type");
        st = fail(c, err, KT_ERR_INVALID, "'type' must be a string or an array of strings");
        ptr_pop(c, old);
    } else if (has(s, "properties") || has(s, "required") || has(s, "additionalProperties")) {
        st = compile_object(c, s, node, err);
    } else if (has(s, "items") || has(s, "minItems") || has(s, "maxItems")) {
        st = compile_array(c, s, node, err);
    } else if (has(s, "minLength") || has(s, "maxLength") || has(s, "pattern")) {
        st = compile_type(c, s, "string", node, err);
    } else {
        st = ctx_any(c, node, err);
    }
done:
    c->depth--;
    return st;
}

kt_status kt_json_schema_compile(struct kt_grammar *g, const json_t *schema, uint32_t *node, kt_err *err)
{
    struct ctx c = {.g = g, .root = schema};
    kt_status st = compile(&c, schema, node, err);
    free(c.refs);
    return st;
}
