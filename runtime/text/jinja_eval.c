/*
 * jinja_eval.c - renders a parsed template (jinja_internal.h): scopes,
 * values, operators and the statements; the filters, tests, methods and
 * JSON writer it calls are in jinja_builtins.c.
 *
 * Values are jansson values (lists are arrays, tuples too) plus three kinds
 * JSON has not: undefined, a namespace (an object that `set ns.x` may
 * change; the only mutable value) and a macro.  Every value a function
 * returns carries its own reference.  Scopes follow jinja2: a for loop's
 * body and a macro call get their own variables, an if does not, and `set`
 * writes to the innermost scope.
 *
 * Bounds: every statement and expression costs a step; evaluation nesting
 * (expressions in expressions, blocks in blocks, macro calls) is capped so
 * the C stack stays small; strings, lists and the output are capped in bytes.
 */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jinja_eval.h"

/* ------------------------------------------------------------- errors --- */

bool jj_fail(jj_eval *e, int line, kt_status st, const char *fmt, ...)
{
    if (e->st != KT_OK)
        return false;
    char msg[900];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    e->st = kt_err_set(e->err, st, "chat template line %d: %s", line ? line : e->line, msg);
    return false;
}

bool jj_nomem(jj_eval *e)
{
    return jj_fail(e, 0, KT_ERR_NOMEM, "out of memory rendering the template");
}

/* ------------------------------------------------------------- values --- */

void jj_value_free(jj_value *v)
{
    json_decref(v->j);
    *v = (jj_value){0};
}

jj_value jj_copy(const jj_value *v)
{
    jj_value c = *v;
    json_incref(c.j);
    return c;
}

bool jj_json(jj_eval *e, json_t *j, jj_value *out)
{
    if (!j)
        return jj_nomem(e);
    *out = (jj_value){.kind = JJ_V_JSON, .j = j};
    return true;
}

bool jj_string(jj_eval *e, const char *s, size_t len, jj_value *out)
{
    if (len > e->lim.max_output_bytes)
        return jj_fail(e, 0, KT_ERR_INVALID, "a string of %zu bytes exceeds the limit of %zu", len,
                       e->lim.max_output_bytes);
    if (!jj_charge(e, len / 256, 0)) /* making it copies its bytes */
        return false;
    return jj_json(e, json_stringn_nocheck(s ? s : "", len), out);
}

bool jj_check_list(jj_eval *e, size_t n)
{
    if (n > e->lim.max_output_bytes / JJ_LIST_ITEM_BYTES)
        return jj_fail(e, 0, KT_ERR_INVALID, "a list of %zu items exceeds the limit of %zu", n,
                       e->lim.max_output_bytes / JJ_LIST_ITEM_BYTES);
    return true;
}

bool jj_truthy(const jj_value *v)
{
    if (v->kind == JJ_V_UNDEFINED)
        return false;
    if (v->kind != JJ_V_JSON)
        return true;
    switch (json_typeof(v->j)) {
    case JSON_NULL:
    case JSON_FALSE: return false;
    case JSON_TRUE: return true;
    case JSON_INTEGER: return json_integer_value(v->j) != 0;
    case JSON_REAL: return json_real_value(v->j) != 0;
    case JSON_STRING: return json_string_length(v->j) != 0;
    case JSON_ARRAY: return json_array_size(v->j) != 0;
    case JSON_OBJECT: return json_object_size(v->j) != 0;
    }
    return false;
}

const char *jj_type_name(const jj_value *v)
{
    switch (v->kind) {
    case JJ_V_UNDEFINED: return "undefined";
    case JJ_V_NAMESPACE: return "namespace";
    case JJ_V_MACRO: return "macro";
    case JJ_V_JSON: break;
    }
    switch (json_typeof(v->j)) {
    case JSON_NULL: return "none";
    case JSON_TRUE:
    case JSON_FALSE: return "bool";
    case JSON_INTEGER: return "int";
    case JSON_REAL: return "float";
    case JSON_STRING: return "string";
    case JSON_ARRAY: return "list";
    case JSON_OBJECT: return "dict";
    }
    return "?";
}

bool jj_is(const jj_value *v, json_type type)
{
    return v->kind == JJ_V_JSON && json_typeof(v->j) == type;
}

bool jj_is_number(const jj_value *v)
{
    return jj_is(v, JSON_INTEGER) || jj_is(v, JSON_REAL) || jj_is(v, JSON_TRUE) || jj_is(v, JSON_FALSE);
}

long long jj_int(const jj_value *v)
{
    if (jj_is(v, JSON_TRUE))
        return 1;
    return jj_is(v, JSON_INTEGER) ? json_integer_value(v->j) : 0;
}

double jj_number(const jj_value *v)
{
    if (jj_is(v, JSON_TRUE))
        return 1;
    if (jj_is(v, JSON_FALSE))
        return 0;
    return json_number_value(v->j);
}

/* Python's == across numbers (True == 1 == 1.0), strings and containers;
 * each value compared costs a step (false once they run out: e->st says so). */
bool jj_json_equal(jj_eval *e, const json_t *a, const json_t *b)
{
    if (a == b)
        return true;
    if (!jj_step(e, 0))
        return false;
    bool na = json_is_number(a) || json_is_boolean(a), nb = json_is_number(b) || json_is_boolean(b);
    if (na && nb) {
        if (json_is_integer(a) && json_is_integer(b))
            return json_integer_value(a) == json_integer_value(b);
        double x = json_is_boolean(a) ? json_is_true(a) : json_number_value(a);
        double y = json_is_boolean(b) ? json_is_true(b) : json_number_value(b);
        return x == y;
    }
    if (json_typeof(a) != json_typeof(b))
        return false;
    switch (json_typeof(a)) {
    case JSON_STRING:
        return json_string_length(a) == json_string_length(b) && jj_charge(e, json_string_length(a) / 256, 0) &&
               memcmp(json_string_value(a), json_string_value(b), json_string_length(a)) == 0;
    case JSON_ARRAY:
        if (json_array_size(a) != json_array_size(b))
            return false;
        for (size_t i = 0; i < json_array_size(a); i++)
            if (!jj_json_equal(e, json_array_get(a, i), json_array_get(b, i)))
                return false;
        return true;
    case JSON_OBJECT: {
        if (json_object_size(a) != json_object_size(b))
            return false;
        const char *key;
        json_t *va;
        json_object_foreach((json_t *)a, key, va) {
            json_t *vb = json_object_get(b, key);
            if (!vb || !jj_json_equal(e, va, vb))
                return false;
        }
        return true;
    }
    default:
        return true; /* null */
    }
}

bool jj_equal(jj_eval *e, const jj_value *a, const jj_value *b)
{
    if (a->kind != JJ_V_JSON || b->kind != JJ_V_JSON) {
        if (a->kind != b->kind)
            return false;
        return a->kind == JJ_V_UNDEFINED || (a->kind == JJ_V_MACRO ? a->macro == b->macro : a->j == b->j);
    }
    return jj_json_equal(e, a->j, b->j);
}

/* ------------------------------------------------------------- output --- */

bool jj_buf_append(jj_eval *e, jj_buf *b, const char *s, size_t len)
{
    if (len > e->lim.max_output_bytes - b->len)
        return jj_fail(e, 0, KT_ERR_INVALID, "the output exceeds the limit of %zu bytes", e->lim.max_output_bytes);
    if (b->len + len + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + len + 1)
            cap *= 2;
        char *bytes = realloc(b->bytes, cap);
        if (!bytes)
            return jj_nomem(e);
        b->bytes = bytes;
        b->cap = cap;
    }
    if (len)
        memcpy(b->bytes + b->len, s, len);
    b->len += len;
    b->bytes[b->len] = '\0';
    return true;
}

bool jj_buf_puts(jj_eval *e, jj_buf *b, const char *s)
{
    return jj_buf_append(e, b, s, strlen(s));
}

/* ------------------------------------------------------------- scopes --- */

typedef struct jj_var {
    const char *name;
    jj_value v;
} jj_var;

struct jj_frame {
    jj_var *vars; /* [n] */
    size_t n, cap;
    jj_frame *parent;
};

static void frame_clear(jj_frame *f)
{
    for (size_t i = 0; i < f->n; i++)
        jj_value_free(&f->vars[i].v);
    free(f->vars);
    f->vars = NULL;
    f->n = f->cap = 0;
}

/* Binds name in f; takes v's reference. */
static bool frame_set(jj_eval *e, jj_frame *f, const char *name, jj_value v)
{
    for (size_t i = 0; i < f->n; i++)
        if (strcmp(f->vars[i].name, name) == 0) {
            jj_value_free(&f->vars[i].v);
            f->vars[i].v = v;
            return true;
        }
    if (f->n == f->cap) {
        size_t cap = f->cap ? f->cap * 2 : 8;
        jj_var *vars = realloc(f->vars, cap * sizeof *vars);
        if (!vars) {
            jj_value_free(&v);
            return jj_nomem(e);
        }
        f->vars = vars;
        f->cap = cap;
    }
    f->vars[f->n++] = (jj_var){name, v};
    return true;
}

/* The variable's value (borrowed), or NULL when no scope and no context key has it. */
static const jj_value *lookup(jj_eval *e, const char *name, jj_value *from_context)
{
    for (jj_frame *f = e->scope; f; f = f->parent)
        for (size_t i = f->n; i-- > 0;)
            if (strcmp(f->vars[i].name, name) == 0)
                return &f->vars[i].v;
    json_t *j = e->context ? json_object_get(e->context, name) : NULL;
    if (!j)
        return NULL;
    *from_context = (jj_value){.kind = JJ_V_JSON, .j = j};
    return from_context;
}

/* ----------------------------------------------------------- counting --- */

bool jj_step(jj_eval *e, int line)
{
    if (line)
        e->line = line;
    if (++e->steps > e->lim.max_steps)
        return jj_fail(e, line, KT_ERR_INVALID, "rendering takes more than %llu steps",
                       (unsigned long long)e->lim.max_steps);
    return true;
}

bool jj_charge(jj_eval *e, uint64_t n, int line)
{
    if (n > e->lim.max_steps - (e->steps < e->lim.max_steps ? e->steps : e->lim.max_steps)) {
        e->steps = e->lim.max_steps;
        return jj_step(e, line);
    }
    e->steps += n;
    return true;
}

static bool enter(jj_eval *e, int line)
{
    if (++e->depth > e->lim.max_depth)
        return jj_fail(e, line, KT_ERR_INVALID, "rendering nests deeper than %u (expressions, blocks and macro calls)",
                       e->lim.max_depth);
    return true;
}

/* -------------------------------------------------------- expressions --- */

static bool eval(jj_eval *e, const jj_node *n, jj_value *out);

/* Evaluates a call's arguments into args (positional then keyword, keywords
 * named in kw; NULL for positional). */
static bool eval_args(jj_eval *e, const jj_node *n, jj_args *args)
{
    *args = (jj_args){0};
    if (n->items.n > JJ_MAX_ARGS)
        return jj_fail(e, n->line, KT_ERR_INVALID, "more than %d arguments", JJ_MAX_ARGS);
    for (size_t i = 0; i < n->items.n; i++) {
        if (!eval(e, n->items.items[i], &args->v[i])) {
            jj_args_free(args);
            return false;
        }
        args->kw[i] = n->names ? n->names[i] : NULL;
        args->n++;
        args->n_positional += !args->kw[i];
    }
    return true;
}

void jj_args_free(jj_args *args)
{
    for (size_t i = 0; i < args->n; i++)
        jj_value_free(&args->v[i]);
    args->n = 0;
}

static bool call_macro(jj_eval *e, const jj_node *macro, const jj_args *args, int line, jj_value *out);

/* obj.name and obj[key]: dict keys, list and string indices, namespace attributes. */
bool jj_get_item(jj_eval *e, const jj_value *obj, const jj_value *key, int line, jj_value *out)
{
    *out = (jj_value){0};
    if (obj->kind == JJ_V_UNDEFINED)
        return jj_fail(e, line, KT_ERR_INVALID, "cannot read %s%s of an undefined value",
                       jj_is(key, JSON_STRING) ? "attribute " : "an item",
                       jj_is(key, JSON_STRING) ? json_string_value(key->j) : "");
    if (obj->kind == JJ_V_NAMESPACE || jj_is(obj, JSON_OBJECT)) {
        if (jj_is(key, JSON_STRING)) {
            json_t *j = json_object_getn(obj->j, json_string_value(key->j), json_string_length(key->j));
            if (j) {
                json_incref(j);
                *out = (jj_value){.kind = JJ_V_JSON, .j = j};
            }
        }
        return true;
    }
    if (jj_is(obj, JSON_ARRAY) && (jj_is(key, JSON_INTEGER) || jj_is(key, JSON_TRUE) || jj_is(key, JSON_FALSE))) {
        long long i = jj_int(key), n = (long long)json_array_size(obj->j);
        if (i < 0)
            i += n;
        if (i >= 0 && i < n) {
            json_t *j = json_array_get(obj->j, (size_t)i);
            json_incref(j);
            *out = (jj_value){.kind = JJ_V_JSON, .j = j};
        }
        return true;
    }
    if (jj_is(obj, JSON_STRING) && jj_is(key, JSON_INTEGER)) {
        const char *s = json_string_value(obj->j);
        size_t len = json_string_length(obj->j), n = jj_utf8_count(s, len);
        if (!jj_charge(e, len / 64, line)) /* code points are found by scanning */
            return false;
        long long i = json_integer_value(key->j);
        if (i < 0)
            i += (long long)n;
        if (i >= 0 && (size_t)i < n) {
            size_t from = jj_utf8_offset(s, len, (size_t)i), to = jj_utf8_offset(s, len, (size_t)i + 1);
            return jj_string(e, s + from, to - from, out);
        }
        return true;
    }
    return true; /* anything else: undefined, as jinja2 */
}

/* Python's slice bound: negative counts from the end, then clamped to the sequence. */
static long long clamp_index(long long i, long long n, bool negative_step)
{
    if (i < 0) {
        i += n;
        if (i < 0)
            i = negative_step ? -1 : 0;
    } else if (i >= n) {
        i = negative_step ? n - 1 : n;
    }
    return i;
}

static bool slice_bound(jj_eval *e, const jj_node *n, long long *out, bool *given)
{
    *given = false;
    if (!n)
        return true;
    jj_value v;
    if (!eval(e, n, &v))
        return false;
    bool ok = true;
    if (jj_is(&v, JSON_INTEGER)) {
        *out = json_integer_value(v.j);
        *given = true;
    } else if (!jj_is(&v, JSON_NULL)) {
        ok = jj_fail(e, n->line, KT_ERR_INVALID, "slice indices must be integers or none, not %s", jj_type_name(&v));
    }
    jj_value_free(&v);
    return ok;
}

/* obj[start:stop:step] of a list or string, Python's rules. */
static bool eval_slice(jj_eval *e, const jj_node *n, jj_value *out)
{
    jj_value obj;
    long long start = 0, stop = 0, step = 1;
    bool has_start, has_stop, has_step;
    if (!eval(e, n->a, &obj))
        return false;
    bool ok = slice_bound(e, n->b, &start, &has_start) && slice_bound(e, n->c, &stop, &has_stop) &&
              slice_bound(e, n->d, &step, &has_step);
    if (ok && step == 0)
        ok = jj_fail(e, n->line, KT_ERR_INVALID, "slice step cannot be zero");
    bool is_string = jj_is(&obj, JSON_STRING);
    if (ok && !is_string && !jj_is(&obj, JSON_ARRAY))
        ok = jj_fail(e, n->line, KT_ERR_INVALID, "cannot slice a %s", jj_type_name(&obj));
    if (!ok) {
        jj_value_free(&obj);
        return false;
    }
    const char *s = is_string ? json_string_value(obj.j) : NULL;
    size_t slen = is_string ? json_string_length(obj.j) : 0;
    if (!jj_charge(e, slen / 64, n->line)) {
        jj_value_free(&obj);
        return false;
    }
    long long len = is_string ? (long long)jj_utf8_count(s, slen) : (long long)json_array_size(obj.j);
    bool neg = step < 0;
    start = has_start ? clamp_index(start, len, neg) : neg ? len - 1 : 0;
    stop = has_stop ? clamp_index(stop, len, neg) : neg ? -1 : len;
    if (!jj_charge(e, (uint64_t)(neg ? (start > stop ? start - stop : 0) : (stop > start ? stop - start : 0)) /
                          (neg ? (uint64_t)0 - (uint64_t)step : (uint64_t)step), n->line)) {
        jj_value_free(&obj);
        return false;
    }
    if (is_string && step == 1) {
        size_t from = start < stop ? jj_utf8_offset(s, slen, (size_t)start) : 0;
        size_t to = start < stop ? jj_utf8_offset(s, slen, (size_t)stop) : 0;
        ok = jj_string(e, s + from, to - from, out);
    } else if (is_string) { /* code point offsets once: indexing each one would be quadratic */
        size_t *at = malloc(((size_t)len + 1) * sizeof *at), k = 0;
        jj_buf b = {0};
        ok = (at != NULL || jj_nomem(e)) && jj_buf_append(e, &b, "", 0);
        for (size_t i = 0; ok && i < slen; i++)
            if (((unsigned char)s[i] & 0xC0) != 0x80)
                at[k++] = i;
        if (ok)
            at[k] = slen;
        for (long long i = start; ok && (neg ? i > stop : i < stop);) {
            ok = jj_buf_append(e, &b, s + at[i], at[i + 1] - at[i]);
            if (__builtin_add_overflow(i, step, &i))
                break;
        }
        ok = ok && jj_string(e, b.bytes, b.len, out);
        free(b.bytes);
        free(at);
    } else {
        json_t *list = json_array();
        ok = list != NULL || jj_nomem(e);
        for (long long i = start; ok && (neg ? i > stop : i < stop);) {
            ok = json_array_append(list, json_array_get(obj.j, (size_t)i)) == 0 || jj_nomem(e);
            if (__builtin_add_overflow(i, step, &i))
                break;
        }
        if (ok)
            *out = (jj_value){.kind = JJ_V_JSON, .j = list};
        else
            json_decref(list);
    }
    jj_value_free(&obj);
    return ok;
}

static bool eval_call(jj_eval *e, const jj_node *n, jj_value *out)
{
    const jj_node *callee = n->a;
    jj_args args;
    if (callee->kind == JJ_ATTR) { /* a method: s.split(), d.get(), ... */
        jj_value obj;
        if (!eval(e, callee->a, &obj))
            return false;
        bool ok = eval_args(e, n, &args);
        if (ok) {
            if (obj.kind == JJ_V_JSON || obj.kind == JJ_V_NAMESPACE) {
                ok = jj_call_method(e, &obj, callee->str, &args, n->line, out);
            } else {
                ok = jj_fail(e, n->line, KT_ERR_INVALID, "cannot call %s.%s(): it is %s",
                             callee->a->kind == JJ_NAME ? callee->a->str : "a value", callee->str, jj_type_name(&obj));
            }
            jj_args_free(&args);
        }
        jj_value_free(&obj);
        return ok;
    }
    if (callee->kind != JJ_NAME)
        return jj_fail(e, n->line, KT_ERR_INVALID, "only macros, builtins and methods can be called");
    jj_value ctx;
    const jj_value *bound = lookup(e, callee->str, &ctx);
    if (!eval_args(e, n, &args))
        return false;
    bool ok;
    if (bound && bound->kind == JJ_V_MACRO)
        ok = call_macro(e, bound->macro, &args, n->line, out);
    else if (bound && bound->kind != JJ_V_UNDEFINED)
        ok = jj_fail(e, n->line, KT_ERR_INVALID, "'%s' is %s, not something to call", callee->str,
                     jj_type_name(bound));
    else
        ok = jj_call_builtin(e, callee->str, &args, n->line, out);
    jj_args_free(&args);
    return ok;
}

static bool arith_int(jj_eval *e, int op, long long x, long long y, int line, jj_value *out)
{
    long long r = 0;
    bool overflow = false;
    switch (op) {
    case '+': overflow = __builtin_add_overflow(x, y, &r); break;
    case '-': overflow = __builtin_sub_overflow(x, y, &r); break;
    case '*': overflow = __builtin_mul_overflow(x, y, &r); break;
    case JJ_OP_FLOORDIV:
    case '%':
        if (y == 0)
            return jj_fail(e, line, KT_ERR_INVALID, "integer division or modulo by zero");
        if (x == LLONG_MIN && y == -1) {
            overflow = true;
            break;
        }
        r = op == '%' ? x % y : x / y;
        if (op == '%' && r != 0 && ((r < 0) != (y < 0)))
            r += y;
        else if (op == JJ_OP_FLOORDIV && (x % y != 0) && ((x < 0) != (y < 0)))
            r--;
        break;
    case JJ_OP_POW:
        if (y < 0)
            return jj_json(e, json_real(pow((double)x, (double)y)), out);
        r = 1;
        for (long long k = 0; k < y && !overflow; k++) {
            overflow = __builtin_mul_overflow(r, x, &r);
            if (r == 0 || r == 1)
                break; /* 0 and 1 stay put; -1 alternates below */
        }
        if (!overflow && x == -1)
            r = y % 2 ? -1 : 1;
        break;
    }
    if (overflow)
        return jj_fail(e, line, KT_ERR_INVALID, "integer overflow");
    return jj_json(e, json_integer(r), out);
}

static bool arith(jj_eval *e, int op, const jj_value *a, const jj_value *b, int line, jj_value *out)
{
    if (op == '~') {
        jj_buf s = {0};
        bool ok = jj_buf_append(e, &s, "", 0) && jj_to_str(e, &s, a) && jj_to_str(e, &s, b) &&
                  jj_string(e, s.bytes, s.len, out);
        free(s.bytes);
        return ok;
    }
    if (op == '+' && jj_is(a, JSON_STRING) && jj_is(b, JSON_STRING)) {
        size_t la = json_string_length(a->j), lb = json_string_length(b->j);
        if (la + lb > e->lim.max_output_bytes)
            return jj_string(e, NULL, la + lb, out); /* reports the limit */
        char *s = malloc(la + lb + 1);
        if (!s)
            return jj_nomem(e);
        memcpy(s, json_string_value(a->j), la);
        memcpy(s + la, json_string_value(b->j), lb);
        bool ok = jj_string(e, s, la + lb, out);
        free(s);
        return ok;
    }
    if (op == '+' && jj_is(a, JSON_ARRAY) && jj_is(b, JSON_ARRAY)) {
        size_t total = json_array_size(a->j) + json_array_size(b->j);
        if (!jj_check_list(e, total) || !jj_charge(e, total, line))
            return false;
        json_t *list = json_copy(a->j);
        if (!list || json_array_extend(list, b->j) != 0) {
            json_decref(list);
            return jj_nomem(e);
        }
        return jj_json(e, list, out);
    }
    if (op == '*' && (jj_is(a, JSON_STRING) || jj_is(a, JSON_ARRAY)) && jj_is(b, JSON_INTEGER)) {
        long long times = json_integer_value(b->j);
        if (times < 0 || (jj_is(a, JSON_STRING) ? json_string_length(a->j) : json_array_size(a->j)) == 0)
            times = 0;
        if (jj_is(a, JSON_STRING)) {
            size_t len = json_string_length(a->j);
            if (len && (unsigned long long)times > e->lim.max_output_bytes / len)
                return jj_fail(e, line, KT_ERR_INVALID, "a repeated string exceeds the limit of %zu bytes",
                               e->lim.max_output_bytes);
            jj_buf s = {0};
            bool ok = jj_buf_append(e, &s, "", 0);
            for (long long k = 0; ok && k < times; k++)
                ok = jj_buf_append(e, &s, json_string_value(a->j), len);
            ok = ok && jj_string(e, s.bytes, s.len, out);
            free(s.bytes);
            return ok;
        }
        size_t len = json_array_size(a->j), total = len && (unsigned long long)times > SIZE_MAX / len
                                                         ? SIZE_MAX : len * (size_t)times;
        if (!jj_check_list(e, total) || !jj_charge(e, total, line))
            return false;
        json_t *list = json_array();
        bool ok = list != NULL;
        for (long long k = 0; ok && k < times; k++)
            ok = json_array_extend(list, a->j) == 0;
        if (!ok) {
            json_decref(list);
            return jj_nomem(e);
        }
        return jj_json(e, list, out);
    }
    if (!jj_is_number(a) || !jj_is_number(b))
        return jj_fail(e, line, KT_ERR_INVALID, "unsupported operand types for '%s': %s and %s",
                       op == JJ_OP_FLOORDIV ? "//" : op == JJ_OP_POW ? "**" : (char[]){(char)op, 0},
                       jj_type_name(a), jj_type_name(b));
    bool ints = !jj_is(a, JSON_REAL) && !jj_is(b, JSON_REAL);
    if (ints && op != '/')
        return arith_int(e, op, jj_int(a), jj_int(b), line, out);
    double x = jj_number(a), y = jj_number(b), r = 0;
    switch (op) {
    case '+': r = x + y; break;
    case '-': r = x - y; break;
    case '*': r = x * y; break;
    case JJ_OP_POW: r = pow(x, y); break;
    case '/':
    case JJ_OP_FLOORDIV:
    case '%':
        if (y == 0)
            return jj_fail(e, line, KT_ERR_INVALID, "division by zero");
        r = op == '/' ? x / y : op == JJ_OP_FLOORDIV ? floor(x / y) : x - y * floor(x / y);
        break;
    }
    return jj_json(e, json_real(r), out);
}

/* a < b and friends on numbers and strings (byte order is code point order). */
static bool compare(jj_eval *e, int op, const jj_value *a, const jj_value *b, int line, bool *result)
{
    int c;
    if (jj_is_number(a) && jj_is_number(b)) {
        double x = jj_number(a), y = jj_number(b);
        if (jj_is(a, JSON_INTEGER) && jj_is(b, JSON_INTEGER)) {
            long long i = json_integer_value(a->j), j = json_integer_value(b->j);
            c = i < j ? -1 : i > j;
        } else {
            c = x < y ? -1 : x > y ? 1 : 0;
            if (isnan(x) || isnan(y)) {
                *result = false;
                return true;
            }
        }
    } else if (jj_is(a, JSON_STRING) && jj_is(b, JSON_STRING)) {
        size_t la = json_string_length(a->j), lb = json_string_length(b->j);
        int m = memcmp(json_string_value(a->j), json_string_value(b->j), la < lb ? la : lb);
        c = m ? m : la < lb ? -1 : la > lb;
    } else {
        return jj_fail(e, line, KT_ERR_INVALID, "cannot order %s and %s", jj_type_name(a), jj_type_name(b));
    }
    *result = op == '<' ? c < 0 : op == '>' ? c > 0 : op == JJ_OP_LE ? c <= 0 : c >= 0;
    return true;
}

bool jj_contains(jj_eval *e, const jj_value *haystack, const jj_value *needle, int line, bool *result)
{
    *result = false;
    if (jj_is(haystack, JSON_STRING)) {
        if (!jj_is(needle, JSON_STRING))
            return jj_fail(e, line, KT_ERR_INVALID, "'in <string>' needs a string on the left, not %s",
                           jj_type_name(needle));
        *result = jj_memmem(json_string_value(haystack->j), json_string_length(haystack->j),
                            json_string_value(needle->j), json_string_length(needle->j)) != NULL;
        return jj_charge(e, json_string_length(haystack->j) / 256, line);
    }
    if (jj_is(haystack, JSON_ARRAY)) {
        for (size_t i = 0; i < json_array_size(haystack->j) && !*result; i++)
            *result = needle->kind == JJ_V_JSON && jj_json_equal(e, json_array_get(haystack->j, i), needle->j);
        return e->st == KT_OK;
    }
    if (jj_is(haystack, JSON_OBJECT) || haystack->kind == JJ_V_NAMESPACE) {
        *result = jj_is(needle, JSON_STRING) &&
                  json_object_getn(haystack->j, json_string_value(needle->j), json_string_length(needle->j));
        return true;
    }
    if (haystack->kind == JJ_V_UNDEFINED)
        return jj_fail(e, line, KT_ERR_INVALID, "'in' an undefined value");
    return jj_fail(e, line, KT_ERR_INVALID, "'in' needs a string, list or dict on the right, not %s",
                   jj_type_name(haystack));
}

static bool eval_binary(jj_eval *e, const jj_node *n, jj_value *out)
{
    jj_value a, b;
    if (!eval(e, n->a, &a))
        return false;
    if (n->op == JJ_OP_AND || n->op == JJ_OP_OR) { /* Python returns the deciding operand */
        if (jj_truthy(&a) == (n->op == JJ_OP_OR)) {
            *out = a;
            return true;
        }
        jj_value_free(&a);
        return eval(e, n->b, out);
    }
    if (!eval(e, n->b, &b)) {
        jj_value_free(&a);
        return false;
    }
    bool ok = true, r = false;
    switch (n->op) {
    case JJ_OP_EQ:
    case JJ_OP_NE:
        r = jj_equal(e, &a, &b) == (n->op == JJ_OP_EQ);
        ok = e->st == KT_OK && jj_json(e, json_boolean(r), out);
        break;
    case '<':
    case '>':
    case JJ_OP_LE:
    case JJ_OP_GE:
        ok = compare(e, n->op, &a, &b, n->line, &r) && jj_json(e, json_boolean(r), out);
        break;
    case JJ_OP_IN:
    case JJ_OP_NOT_IN:
        ok = jj_contains(e, &b, &a, n->line, &r) && jj_json(e, json_boolean(r == (n->op == JJ_OP_IN)), out);
        break;
    default:
        ok = arith(e, n->op, &a, &b, n->line, out);
    }
    jj_value_free(&a);
    jj_value_free(&b);
    return ok;
}

static bool eval_list(jj_eval *e, const jj_node *n, jj_value *out)
{
    json_t *list = json_array();
    if (!list)
        return jj_nomem(e);
    for (size_t i = 0; i < n->items.n; i++) {
        jj_value v;
        if (!eval(e, n->items.items[i], &v)) {
            json_decref(list);
            return false;
        }
        if (v.kind != JJ_V_JSON) {
            /* Lists hold data only; an undefined item becomes none, as in a JSON context. */
            jj_value_free(&v);
            v = (jj_value){.kind = JJ_V_JSON, .j = json_null()};
        }
        if (json_array_append_new(list, v.j) != 0) {
            json_decref(list);
            return jj_nomem(e);
        }
    }
    return jj_json(e, list, out);
}

static bool eval_dict(jj_eval *e, const jj_node *n, jj_value *out)
{
    json_t *dict = json_object();
    if (!dict)
        return jj_nomem(e);
    for (size_t i = 0; i + 1 < n->items.n; i += 2) {
        jj_value k, v;
        if (!eval(e, n->items.items[i], &k)) {
            json_decref(dict);
            return false;
        }
        bool ok = jj_is(&k, JSON_STRING) ||
                  jj_fail(e, n->line, KT_ERR_INVALID, "dict keys must be strings here, not %s", jj_type_name(&k));
        ok = ok && eval(e, n->items.items[i + 1], &v);
        if (ok) {
            json_t *j = v.kind == JJ_V_JSON ? v.j : json_null();
            json_incref(j);
            ok = json_object_setn_new_nocheck(dict, json_string_value(k.j), json_string_length(k.j), j) == 0 ||
                 jj_nomem(e);
            jj_value_free(&v);
        }
        jj_value_free(&k);
        if (!ok) {
            json_decref(dict);
            return false;
        }
    }
    return jj_json(e, dict, out);
}

static bool eval(jj_eval *e, const jj_node *n, jj_value *out)
{
    *out = (jj_value){0};
    if (!jj_step(e, n->line) || !enter(e, n->line))
        return false;
    bool ok = true;
    switch (n->kind) {
    case JJ_LITERAL:
        json_incref(n->literal);
        *out = (jj_value){.kind = JJ_V_JSON, .j = n->literal};
        break;
    case JJ_NAME: {
        jj_value ctx;
        const jj_value *v = lookup(e, n->str, &ctx);
        if (v)
            *out = jj_copy(v);
        break;
    }
    case JJ_ATTR:
    case JJ_INDEX: {
        jj_value obj, key;
        if (!eval(e, n->a, &obj)) {
            ok = false;
            break;
        }
        if (n->kind == JJ_ATTR)
            ok = jj_string(e, n->str, n->len, &key);
        else
            ok = eval(e, n->b, &key);
        ok = ok && jj_get_item(e, &obj, &key, n->line, out);
        jj_value_free(&key);
        jj_value_free(&obj);
        break;
    }
    case JJ_SLICE: ok = eval_slice(e, n, out); break;
    case JJ_CALL: ok = eval_call(e, n, out); break;
    case JJ_FILTER: {
        jj_value v;
        jj_args args;
        if (!eval(e, n->a, &v)) {
            ok = false;
            break;
        }
        ok = eval_args(e, n, &args);
        if (ok) {
            ok = jj_apply_filter(e, n->str, &v, &args, n->line, out);
            jj_args_free(&args);
        }
        jj_value_free(&v);
        break;
    }
    case JJ_TEST: {
        jj_value v;
        jj_args args;
        bool r = false;
        if (!eval(e, n->a, &v)) {
            ok = false;
            break;
        }
        ok = eval_args(e, n, &args);
        if (ok) {
            ok = jj_apply_test(e, n->str, &v, &args, n->line, &r) && jj_json(e, json_boolean(r != (n->op == '!')), out);
            jj_args_free(&args);
        }
        jj_value_free(&v);
        break;
    }
    case JJ_UNARY: {
        jj_value v;
        if (!eval(e, n->a, &v)) {
            ok = false;
            break;
        }
        if (n->op == '!') {
            ok = jj_json(e, json_boolean(!jj_truthy(&v)), out);
        } else if (jj_is(&v, JSON_INTEGER) || jj_is(&v, JSON_TRUE) || jj_is(&v, JSON_FALSE)) {
            long long x = jj_int(&v);
            if (n->op == '-' && x == LLONG_MIN)
                ok = jj_fail(e, n->line, KT_ERR_INVALID, "integer overflow");
            else
                ok = jj_json(e, json_integer(n->op == '-' ? -x : x), out);
        } else if (jj_is(&v, JSON_REAL)) {
            ok = jj_json(e, json_real(n->op == '-' ? -json_real_value(v.j) : json_real_value(v.j)), out);
        } else {
            ok = jj_fail(e, n->line, KT_ERR_INVALID, "bad operand type for unary %c: %s", n->op, jj_type_name(&v));
        }
        jj_value_free(&v);
        break;
    }
    case JJ_BINARY: ok = eval_binary(e, n, out); break;
    case JJ_COND: {
        jj_value c;
        if (!eval(e, n->b, &c)) {
            ok = false;
            break;
        }
        bool yes = jj_truthy(&c);
        jj_value_free(&c);
        if (yes)
            ok = eval(e, n->a, out);
        else if (n->c)
            ok = eval(e, n->c, out);
        break;
    }
    case JJ_LIST:
    case JJ_TUPLE: ok = eval_list(e, n, out); break;
    case JJ_DICT: ok = eval_dict(e, n, out); break;
    default: ok = jj_fail(e, n->line, KT_ERR_INVALID, "a statement where an expression belongs");
    }
    e->depth--;
    if (!ok)
        jj_value_free(out);
    return ok;
}

bool jj_eval_expr(jj_eval *e, const jj_node *n, jj_value *out)
{
    return eval(e, n, out);
}

/* --------------------------------------------------------- statements --- */

typedef enum flow { FLOW_NEXT, FLOW_BREAK, FLOW_CONTINUE, FLOW_ERROR } flow;

static flow exec_list(jj_eval *e, const jj_list *body, jj_buf *out);

/* Renders body into a fresh string (macro calls, block set, filter blocks). */
static bool capture(jj_eval *e, const jj_list *body, jj_value *out)
{
    jj_buf b = {0};
    bool ok = jj_buf_append(e, &b, "", 0);
    if (ok) {
        flow f = exec_list(e, body, &b);
        ok = f != FLOW_ERROR;
        if (ok && f != FLOW_NEXT)
            ok = jj_fail(e, 0, KT_ERR_INVALID, "'break' or 'continue' outside a loop");
    }
    ok = ok && jj_string(e, b.bytes, b.len, out);
    free(b.bytes);
    return ok;
}

static bool call_macro(jj_eval *e, const jj_node *macro, const jj_args *args, int line, jj_value *out)
{
    if (args->n_positional > macro->n_names)
        return jj_fail(e, line, KT_ERR_INVALID, "macro '%s' takes %zu arguments, given %zu", macro->str,
                       macro->n_names, args->n_positional);
    jj_frame frame = {.parent = e->globals};
    bool ok = true;
    size_t positional = 0;
    for (size_t i = 0; ok && i < args->n; i++) {
        const char *name = args->kw[i];
        if (!name) {
            name = macro->names[positional++];
        } else {
            bool known = false;
            for (size_t k = 0; k < macro->n_names; k++)
                known |= strcmp(macro->names[k], name) == 0;
            if (!known)
                ok = jj_fail(e, line, KT_ERR_INVALID, "macro '%s' has no parameter '%s'", macro->str, name);
        }
        ok = ok && frame_set(e, &frame, name, jj_copy(&args->v[i]));
    }
    jj_frame *saved = e->scope;
    e->scope = &frame;
    for (size_t k = 0; ok && k < macro->n_names; k++) {
        bool given = false;
        for (size_t i = 0; i < frame.n; i++)
            given |= strcmp(frame.vars[i].name, macro->names[k]) == 0;
        if (given)
            continue;
        jj_value def = {0};
        if (macro->items.items[k])
            ok = eval(e, macro->items.items[k], &def);
        ok = ok && frame_set(e, &frame, macro->names[k], def);
    }
    ok = ok && enter(e, line) && capture(e, &macro->body, out);
    if (ok)
        e->depth--;
    e->scope = saved;
    frame_clear(&frame);
    return ok;
}

/* Binds a loop or set target list to v (copying what it keeps). */
static bool assign_targets(jj_eval *e, jj_frame *f, const char *const *names, size_t n_names, const jj_value *v,
                           int line)
{
    if (n_names == 1)
        return frame_set(e, f, names[0], jj_copy(v));
    if (!jj_is(v, JSON_ARRAY))
        return jj_fail(e, line, KT_ERR_INVALID, "cannot unpack %s into %zu names", jj_type_name(v), n_names);
    if (json_array_size(v->j) != n_names)
        return jj_fail(e, line, KT_ERR_INVALID, "cannot unpack %zu values into %zu names", json_array_size(v->j),
                       n_names);
    for (size_t i = 0; i < n_names; i++) {
        json_t *j = json_array_get(v->j, i);
        json_incref(j);
        if (!frame_set(e, f, names[i], (jj_value){.kind = JJ_V_JSON, .j = j}))
            return false;
    }
    return true;
}

static bool set_loop(jj_eval *e, jj_frame *f, size_t i, size_t n, json_t *items)
{
    json_t *loop = json_object();
    bool ok = loop && json_object_set_new(loop, "index0", json_integer((json_int_t)i)) == 0 &&
              json_object_set_new(loop, "index", json_integer((json_int_t)i + 1)) == 0 &&
              json_object_set_new(loop, "revindex", json_integer((json_int_t)(n - i))) == 0 &&
              json_object_set_new(loop, "revindex0", json_integer((json_int_t)(n - i - 1))) == 0 &&
              json_object_set_new(loop, "first", json_boolean(i == 0)) == 0 &&
              json_object_set_new(loop, "last", json_boolean(i + 1 == n)) == 0 &&
              json_object_set_new(loop, "length", json_integer((json_int_t)n)) == 0 &&
              json_object_set_new(loop, "depth", json_integer(1)) == 0 &&
              json_object_set_new(loop, "depth0", json_integer(0)) == 0 &&
              (i == 0 || json_object_set(loop, "previtem", json_array_get(items, i - 1)) == 0) &&
              (i + 1 == n || json_object_set(loop, "nextitem", json_array_get(items, i + 1)) == 0);
    if (!ok) {
        json_decref(loop);
        return jj_nomem(e);
    }
    return frame_set(e, f, "loop", (jj_value){.kind = JJ_V_JSON, .j = loop});
}

static flow exec_for(jj_eval *e, const jj_node *n, jj_buf *out)
{
    jj_value seq;
    if (!eval(e, n->a, &seq))
        return FLOW_ERROR;
    json_t *items = NULL;
    bool ok = jj_iterate(e, &seq, n->line, &items);
    jj_value_free(&seq);
    if (!ok)
        return FLOW_ERROR;
    if (n->b) { /* for x in xs if cond: the filter runs first, loop.length counts what passes */
        json_t *kept = json_array();
        ok = kept != NULL || jj_nomem(e);
        for (size_t i = 0; ok && i < json_array_size(items); i++) {
            jj_frame probe = {.parent = e->scope};
            jj_value item = {.kind = JJ_V_JSON, .j = json_array_get(items, i)}, c;
            jj_frame *saved = e->scope;
            ok = jj_step(e, n->line) && assign_targets(e, &probe, n->names, n->n_names, &item, n->line);
            e->scope = &probe;
            ok = ok && eval(e, n->b, &c);
            e->scope = saved;
            if (ok) {
                bool keep = jj_truthy(&c);
                jj_value_free(&c);
                if (keep)
                    ok = json_array_append(kept, item.j) == 0 || jj_nomem(e);
            }
            frame_clear(&probe);
        }
        json_decref(items);
        items = kept;
        if (!ok) {
            json_decref(items);
            return FLOW_ERROR;
        }
    }
    size_t count = json_array_size(items);
    flow f = FLOW_NEXT;
    for (size_t i = 0; i < count; i++) {
        jj_frame frame = {.parent = e->scope};
        jj_value item = {.kind = JJ_V_JSON, .j = json_array_get(items, i)};
        if (!jj_step(e, n->line) || !assign_targets(e, &frame, n->names, n->n_names, &item, n->line) ||
            (n->op && !set_loop(e, &frame, i, count, items))) {
            frame_clear(&frame);
            f = FLOW_ERROR;
            break;
        }
        jj_frame *saved = e->scope;
        e->scope = &frame;
        f = exec_list(e, &n->body, out);
        e->scope = saved;
        frame_clear(&frame);
        if (f == FLOW_ERROR)
            break;
        if (f == FLOW_BREAK) {
            f = FLOW_NEXT;
            break;
        }
        f = FLOW_NEXT;
    }
    json_decref(items);
    if (f == FLOW_NEXT && count == 0 && n->orelse.n)
        f = exec_list(e, &n->orelse, out);
    return f;
}

static flow exec_set(jj_eval *e, const jj_node *n)
{
    jj_value v;
    if (n->kind == JJ_SET_BLOCK) {
        if (!capture(e, &n->body, &v))
            return FLOW_ERROR;
    } else if (!eval(e, n->b, &v)) {
        return FLOW_ERROR;
    }
    bool ok;
    if (n->a) { /* ns.attr = v */
        jj_value ctx;
        const jj_value *ns = lookup(e, n->a->str, &ctx);
        if (!ns || ns->kind != JJ_V_NAMESPACE)
            ok = jj_fail(e, n->line, KT_ERR_INVALID, "cannot set '%s.%s': '%s' is %s, not a namespace", n->a->str,
                         n->str, n->a->str, ns ? jj_type_name(ns) : "undefined");
        else if (v.kind != JJ_V_JSON)
            ok = jj_fail(e, n->line, KT_ERR_INVALID, "cannot store %s in a namespace", jj_type_name(&v));
        else
            ok = json_object_set(ns->j, n->str, v.j) == 0 || jj_nomem(e);
    } else {
        ok = assign_targets(e, e->scope, n->names, n->n_names, &v, n->line);
    }
    jj_value_free(&v);
    return ok ? FLOW_NEXT : FLOW_ERROR;
}

static flow exec_node(jj_eval *e, const jj_node *n, jj_buf *out)
{
    switch (n->kind) {
    case JJ_TEXT:
        return jj_buf_append(e, out, n->str, n->len) ? FLOW_NEXT : FLOW_ERROR;
    case JJ_OUTPUT: {
        jj_value v;
        if (!eval(e, n->a, &v))
            return FLOW_ERROR;
        bool ok = jj_to_str(e, out, &v);
        jj_value_free(&v);
        return ok ? FLOW_NEXT : FLOW_ERROR;
    }
    case JJ_IF: {
        jj_value c;
        if (!eval(e, n->a, &c))
            return FLOW_ERROR;
        bool yes = jj_truthy(&c);
        jj_value_free(&c);
        return exec_list(e, yes ? &n->body : &n->orelse, out);
    }
    case JJ_FOR: return exec_for(e, n, out);
    case JJ_SET:
    case JJ_SET_BLOCK: return exec_set(e, n);
    case JJ_MACRO:
        return frame_set(e, e->scope, n->str, (jj_value){.kind = JJ_V_MACRO, .macro = n}) ? FLOW_NEXT : FLOW_ERROR;
    case JJ_BREAK: return FLOW_BREAK;
    case JJ_CONTINUE: return FLOW_CONTINUE;
    case JJ_BLOCK: {
        if (!n->str)
            return exec_list(e, &n->body, out);
        jj_value body, filtered = {0};
        jj_args args;
        if (!capture(e, &n->body, &body))
            return FLOW_ERROR;
        bool ok = eval_args(e, n, &args);
        if (ok) {
            ok = jj_apply_filter(e, n->str, &body, &args, n->line, &filtered);
            jj_args_free(&args);
        }
        ok = ok && jj_to_str(e, out, &filtered);
        jj_value_free(&filtered);
        jj_value_free(&body);
        return ok ? FLOW_NEXT : FLOW_ERROR;
    }
    default:
        return jj_fail(e, n->line, KT_ERR_INVALID, "an expression where a statement belongs") ? FLOW_NEXT
                                                                                               : FLOW_ERROR;
    }
}

static flow exec_list(jj_eval *e, const jj_list *body, jj_buf *out)
{
    if (!enter(e, body->n ? body->items[0]->line : 0))
        return FLOW_ERROR;
    flow f = FLOW_NEXT;
    for (size_t i = 0; i < body->n && f == FLOW_NEXT; i++)
        f = jj_step(e, body->items[i]->line) ? exec_node(e, body->items[i], out) : FLOW_ERROR;
    e->depth--;
    return f;
}

kt_status kt_jinja_render(const kt_jinja_template *t, const json_t *context, const kt_jinja_limits *limits,
                          char **out, size_t *out_len, kt_err *err)
{
    *out = NULL;
    if (out_len)
        *out_len = 0;
    if (!t)
        return kt_err_set(err, KT_ERR_INVALID, "chat template: no template to render");
    if (context && !json_is_object(context))
        return kt_err_set(err, KT_ERR_INVALID, "chat template: the context must be a JSON object");
    jj_frame globals = {0};
    jj_eval e = {.context = context, .lim = limits ? *limits : KT_JINJA_DEFAULT_LIMITS, .err = err,
                 .globals = &globals, .scope = &globals};
    jj_buf b = {0};
    bool ok = jj_buf_append(&e, &b, "", 0);
    if (ok) {
        flow f = exec_list(&e, &t->root, &b);
        ok = f != FLOW_ERROR;
        if (ok && f != FLOW_NEXT)
            ok = jj_fail(&e, 0, KT_ERR_INVALID, "'break' or 'continue' outside a loop");
    }
    frame_clear(&globals);
    if (!ok) {
        free(b.bytes);
        return e.st != KT_OK ? e.st : kt_err_set(err, KT_ERR_INVALID, "chat template: rendering failed");
    }
    *out = b.bytes;
    if (out_len)
        *out_len = b.len;
    return KT_OK;
}
