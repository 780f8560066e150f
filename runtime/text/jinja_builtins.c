/*
 * jinja_builtins.c - the library a chat template calls: filters (tojson,
 * trim, join, selectattr, ...), tests (defined, none, string, ...), methods
 * of strings and dicts (startswith, split, get, items, ...), the globals
 * range, namespace, raise_exception, dict and strftime_now, and the
 * conversions to text (Python's str() and repr(), json.dumps).
 *
 * Behaviour follows Python jinja2 as transformers configures it; case and
 * whitespace functions know ASCII only (upper, lower, title, strip and split
 * leave other characters as they are).  Loops here that a template can make
 * long cost steps like the evaluator's own.
 */
#include <ctype.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "chat_internal.h"
#include "jinja_eval.h"

/* --------------------------------------------------------------- UTF-8 --- */

size_t jj_utf8_count(const char *s, size_t len)
{
    size_t n = 0;
    for (size_t i = 0; i < len; i++)
        n += ((unsigned char)s[i] & 0xC0) != 0x80;
    return n;
}

size_t jj_utf8_offset(const char *s, size_t len, size_t index)
{
    size_t n = 0;
    for (size_t i = 0; i < len; i++)
        if (((unsigned char)s[i] & 0xC0) != 0x80 && n++ == index)
            return i;
    return len;
}

const char *jj_memmem(const char *hay, size_t n, const char *needle, size_t k)
{
    return k == 0 ? hay : memmem(hay, n, needle, k);
}

/* Decodes one code point at s[*i]; an invalid byte reads as itself (0x80-0xFF). */
static unsigned long utf8_next(const char *s, size_t len, size_t *i)
{
    const unsigned char *u = (const unsigned char *)s;
    unsigned long c = u[*i];
    int extra = c >= 0xF0 ? 3 : c >= 0xE0 ? 2 : 1;
    if (c < 0xC0 || *i + (size_t)extra >= len) {
        (*i)++;
        return c;
    }
    unsigned long cp = c & (0x3F >> extra);
    for (int k = 1; k <= extra; k++) {
        if ((u[*i + (size_t)k] & 0xC0) != 0x80) {
            (*i)++;
            return c;
        }
        cp = cp << 6 | (u[*i + (size_t)k] & 0x3F);
    }
    *i += (size_t)extra + 1;
    return cp;
}

static bool is_py_space(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f' || (c >= 0x1c && c <= 0x1f);
}

/* ----------------------------------------------------- text conversions --- */


/* Python's repr(str): single quotes unless the text has ' and no ". */
static bool py_repr_string(jj_eval *e, jj_buf *b, const char *s, size_t len)
{
    char q = memchr(s, '\'', len) && !memchr(s, '"', len) ? '"' : '\'';
    bool ok = jj_buf_append(e, b, &q, 1);
    size_t run = 0;
    for (size_t i = 0; ok && i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        char esc[8];
        const char *x = NULL;
        if (c == '\\')
            x = "\\\\";
        else if (c == (unsigned char)q)
            x = q == '\'' ? "\\'" : "\\\"";
        else if (c == '\n')
            x = "\\n";
        else if (c == '\r')
            x = "\\r";
        else if (c == '\t')
            x = "\\t";
        else if (c < 0x20 || c == 0x7f) {
            snprintf(esc, sizeof esc, "\\x%02x", c);
            x = esc;
        }
        if (x) {
            ok = jj_buf_append(e, b, s + run, i - run) && jj_buf_puts(e, b, x);
            run = i + 1;
        }
    }
    return ok && jj_buf_append(e, b, s + run, len - run) && jj_buf_append(e, b, &q, 1);
}

static bool py_repr(jj_eval *e, jj_buf *b, const json_t *j, int depth);

static bool py_scalar(jj_eval *e, jj_buf *b, const json_t *j)
{
    char num[64];
    switch (json_typeof(j)) {
    case JSON_NULL: return jj_buf_puts(e, b, "None");
    case JSON_TRUE: return jj_buf_puts(e, b, "True");
    case JSON_FALSE: return jj_buf_puts(e, b, "False");
    case JSON_INTEGER:
        snprintf(num, sizeof num, "%lld", (long long)json_integer_value(j));
        return jj_buf_puts(e, b, num);
    case JSON_REAL:
        kt_chat_python_float(json_real_value(j), num, sizeof num, false);
        return jj_buf_puts(e, b, num);
    default: return true;
    }
}

static bool py_repr(jj_eval *e, jj_buf *b, const json_t *j, int depth)
{
    if (depth > 256) /* jansson refuses deeper documents; a built one is bounded by the nesting limit */
        return jj_fail(e, 0, KT_ERR_INVALID, "a value nested too deeply to print");
    if (!jj_step(e, 0))
        return false;
    if (json_is_string(j))
        return py_repr_string(e, b, json_string_value(j), json_string_length(j));
    if (json_is_array(j)) {
        bool ok = jj_buf_puts(e, b, "[");
        for (size_t i = 0; ok && i < json_array_size(j); i++)
            ok = (i == 0 || jj_buf_puts(e, b, ", ")) && py_repr(e, b, json_array_get(j, i), depth + 1);
        return ok && jj_buf_puts(e, b, "]");
    }
    if (json_is_object(j)) {
        bool ok = jj_buf_puts(e, b, "{"), first = true;
        const char *key;
        size_t key_len;
        json_t *v;
        json_object_keylen_foreach((json_t *)j, key, key_len, v) {
            ok = ok && (first || jj_buf_puts(e, b, ", ")) && py_repr_string(e, b, key, key_len) &&
                 jj_buf_puts(e, b, ": ") && py_repr(e, b, v, depth + 1);
            first = false;
        }
        return ok && jj_buf_puts(e, b, "}");
    }
    return py_scalar(e, b, j);
}

bool jj_to_str(jj_eval *e, jj_buf *b, const jj_value *v)
{
    switch (v->kind) {
    case JJ_V_UNDEFINED: return true;
    case JJ_V_NAMESPACE: return jj_buf_puts(e, b, "<Namespace>");
    case JJ_V_MACRO: return jj_buf_puts(e, b, "<Macro>");
    case JJ_V_JSON: break;
    }
    if (json_is_string(v->j))
        return jj_buf_append(e, b, json_string_value(v->j), json_string_length(v->j));
    if (json_is_array(v->j) || json_is_object(v->j))
        return py_repr(e, b, v->j, 0);
    return py_scalar(e, b, v->j);
}

static bool to_string_value(jj_eval *e, const jj_value *v, jj_value *out)
{
    if (jj_is(v, JSON_STRING)) {
        *out = jj_copy(v);
        return true;
    }
    jj_buf b = {0};
    bool ok = jj_buf_append(e, &b, "", 0) && jj_to_str(e, &b, v) && jj_string(e, b.bytes, b.len, out);
    free(b.bytes);
    return ok;
}

/* ------------------------------------------------- json.dumps as Python --- */

typedef struct json_style {
    const char *indent;   /* NULL: one line */
    const char *item_sep; /* ", " (or "," with an indent) */
    const char *key_sep;  /* ": " */
    bool ensure_ascii;
    bool sort_keys;
} json_style;

static bool json_string_out(jj_eval *e, jj_buf *b, const char *s, size_t len, bool ensure_ascii)
{
    bool ok = jj_buf_puts(e, b, "\"");
    size_t run = 0, i = 0;
    while (ok && i < len) {
        size_t at = i;
        unsigned char c = (unsigned char)s[i];
        char esc[48];
        const char *x = NULL;
        if (c >= 0x80 && ensure_ascii) {
            unsigned long cp = utf8_next(s, len, &i);
            if (cp >= 0x10000)
                snprintf(esc, sizeof esc, "\\u%04lx\\u%04lx", 0xD800 + ((cp - 0x10000) >> 10),
                         0xDC00 + ((cp - 0x10000) & 0x3FF));
            else
                snprintf(esc, sizeof esc, "\\u%04lx", cp);
            x = esc;
        } else {
            i++;
            switch (c) {
            case '"': x = "\\\""; break;
            case '\\': x = "\\\\"; break;
            case '\n': x = "\\n"; break;
            case '\r': x = "\\r"; break;
            case '\t': x = "\\t"; break;
            case '\b': x = "\\b"; break;
            case '\f': x = "\\f"; break;
            default:
                if (c < 0x20 || (c == 0x7f && ensure_ascii)) {
                    snprintf(esc, sizeof esc, "\\u%04x", c);
                    x = esc;
                }
            }
        }
        if (x) {
            ok = jj_buf_append(e, b, s + run, at - run) && jj_buf_puts(e, b, x);
            run = i;
        }
    }
    return ok && jj_buf_append(e, b, s + run, len - run) && jj_buf_puts(e, b, "\"");
}

static bool json_newline(jj_eval *e, jj_buf *b, const json_style *st, int level)
{
    bool ok = jj_buf_puts(e, b, "\n");
    for (int i = 0; ok && i < level; i++)
        ok = jj_buf_puts(e, b, st->indent);
    return ok;
}

static int key_order(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static bool json_out(jj_eval *e, jj_buf *b, const json_t *j, const json_style *st, int level)
{
    if (level > 256)
        return jj_fail(e, 0, KT_ERR_INVALID, "a value nested too deeply for tojson");
    if (!jj_step(e, 0))
        return false;
    char num[64];
    switch (json_typeof(j)) {
    case JSON_NULL: return jj_buf_puts(e, b, "null");
    case JSON_TRUE: return jj_buf_puts(e, b, "true");
    case JSON_FALSE: return jj_buf_puts(e, b, "false");
    case JSON_INTEGER:
        snprintf(num, sizeof num, "%lld", (long long)json_integer_value(j));
        return jj_buf_puts(e, b, num);
    case JSON_REAL:
        kt_chat_python_float(json_real_value(j), num, sizeof num, true);
        return jj_buf_puts(e, b, num);
    case JSON_STRING: return json_string_out(e, b, json_string_value(j), json_string_length(j), st->ensure_ascii);
    case JSON_ARRAY: {
        size_t n = json_array_size(j);
        if (n == 0)
            return jj_buf_puts(e, b, "[]");
        bool ok = jj_buf_puts(e, b, "[");
        for (size_t i = 0; ok && i < n; i++) {
            if (i)
                ok = jj_buf_puts(e, b, st->item_sep);
            if (ok && st->indent)
                ok = json_newline(e, b, st, level + 1);
            ok = ok && json_out(e, b, json_array_get(j, i), st, level + 1);
        }
        if (ok && st->indent)
            ok = json_newline(e, b, st, level);
        return ok && jj_buf_puts(e, b, "]");
    }
    case JSON_OBJECT: {
        size_t n = json_object_size(j);
        if (n == 0)
            return jj_buf_puts(e, b, "{}");
        const char **keys = malloc(n * sizeof *keys);
        if (!keys)
            return jj_nomem(e);
        size_t k = 0;
        const char *key;
        json_t *v;
        json_object_foreach((json_t *)j, key, v)
            keys[k++] = key;
        if (st->sort_keys)
            qsort(keys, n, sizeof *keys, key_order);
        bool ok = jj_buf_puts(e, b, "{");
        for (size_t i = 0; ok && i < n; i++) {
            if (i)
                ok = jj_buf_puts(e, b, st->item_sep);
            if (ok && st->indent)
                ok = json_newline(e, b, st, level + 1);
            ok = ok && json_string_out(e, b, keys[i], strlen(keys[i]), st->ensure_ascii) &&
                 jj_buf_puts(e, b, st->key_sep) && json_out(e, b, json_object_get(j, keys[i]), st, level + 1);
        }
        free(keys);
        if (ok && st->indent)
            ok = json_newline(e, b, st, level);
        return ok && jj_buf_puts(e, b, "}");
    }
    }
    return true;
}

/* ------------------------------------------------------------ arguments --- */

#define KEYWORD_ONLY SIZE_MAX

/* The argument at position pos or named name; NULL when not given. */
static const jj_value *arg(const jj_args *a, size_t pos, const char *name)
{
    if (pos < a->n_positional)
        return &a->v[pos];
    for (size_t i = a->n_positional; i < a->n; i++)
        if (name && strcmp(a->kw[i], name) == 0)
            return &a->v[i];
    return NULL;
}

static bool arg_int(jj_eval *e, const jj_args *a, size_t pos, const char *name, long long def, int line,
                    long long *out)
{
    const jj_value *v = arg(a, pos, name);
    *out = def;
    if (!v || jj_is(v, JSON_NULL))
        return true;
    if (!jj_is(v, JSON_INTEGER) && !jj_is(v, JSON_TRUE) && !jj_is(v, JSON_FALSE))
        return jj_fail(e, line, KT_ERR_INVALID, "argument '%s' must be an integer, not %s", name ? name : "?",
                       jj_type_name(v));
    *out = jj_int(v);
    return true;
}

static bool arg_string(jj_eval *e, const jj_args *a, size_t pos, const char *name, int line, const char **s,
                       size_t *len)
{
    const jj_value *v = arg(a, pos, name);
    *s = NULL;
    *len = 0;
    if (!v || jj_is(v, JSON_NULL))
        return true;
    if (!jj_is(v, JSON_STRING))
        return jj_fail(e, line, KT_ERR_INVALID, "argument '%s' must be a string, not %s", name ? name : "?",
                       jj_type_name(v));
    *s = json_string_value(v->j);
    *len = json_string_length(v->j);
    return true;
}

static bool arg_bool(const jj_args *a, size_t pos, const char *name, bool def)
{
    const jj_value *v = arg(a, pos, name);
    return v ? jj_truthy(v) : def;
}

static bool need_string(jj_eval *e, const jj_value *v, const char *what, int line)
{
    return jj_is(v, JSON_STRING) ||
           jj_fail(e, line, KT_ERR_INVALID, "%s needs a string, not %s", what, jj_type_name(v));
}

/* ----------------------------------------------------------- iteration --- */

bool jj_iterate(jj_eval *e, const jj_value *v, int line, json_t **items)
{
    *items = NULL;
    if (v->kind == JJ_V_UNDEFINED) {
        *items = json_array();
        return *items != NULL || jj_nomem(e);
    }
    if (jj_is(v, JSON_ARRAY)) {
        json_incref(v->j);
        *items = v->j;
        return true;
    }
    json_t *list = json_array();
    if (!list)
        return jj_nomem(e);
    bool ok = jj_charge(e, jj_is(v, JSON_OBJECT) ? json_object_size(v->j)
                           : jj_is(v, JSON_STRING) ? json_string_length(v->j) : 0, line);
    if (!ok) {
        json_decref(list);
        return false;
    }
    if (jj_is(v, JSON_OBJECT)) {
        const char *key;
        size_t key_len;
        json_t *x;
        json_object_keylen_foreach(v->j, key, key_len, x) {
            (void)x;
            ok = ok && (json_array_append_new(list, json_stringn_nocheck(key, key_len)) == 0 || jj_nomem(e));
        }
    } else if (jj_is(v, JSON_STRING)) {
        const char *s = json_string_value(v->j);
        size_t len = json_string_length(v->j);
        for (size_t i = 0; ok && i < len;) {
            size_t from = i;
            utf8_next(s, len, &i);
            ok = json_array_append_new(list, json_stringn_nocheck(s + from, i - from)) == 0 || jj_nomem(e);
        }
    } else {
        ok = jj_fail(e, line, KT_ERR_INVALID, "%s is not iterable", jj_type_name(v));
    }
    if (!ok) {
        json_decref(list);
        return false;
    }
    *items = list;
    return true;
}

/* ------------------------------------------------------------- strings --- */

static bool ascii_case(jj_eval *e, const jj_value *v, int mode, jj_value *out)
{
    jj_value s;
    if (!to_string_value(e, v, &s))
        return false;
    size_t len = json_string_length(s.j);
    char *c = malloc(len + 1);
    if (!c) {
        jj_value_free(&s);
        return jj_nomem(e);
    }
    memcpy(c, json_string_value(s.j), len + 1);
    bool word_start = true;
    for (size_t i = 0; i < len; i++) {
        unsigned char ch = (unsigned char)c[i];
        bool letter = isalpha(ch) != 0 && ch < 0x80;
        switch (mode) {
        case 'u': c[i] = (char)(ch < 0x80 ? toupper(ch) : ch); break;
        case 'l': c[i] = (char)(ch < 0x80 ? tolower(ch) : ch); break;
        case 'c': c[i] = (char)(ch < 0x80 ? (i == 0 ? toupper(ch) : tolower(ch)) : ch); break;
        case 't':
            if (ch < 0x80)
                c[i] = (char)(word_start ? toupper(ch) : tolower(ch));
            word_start = !(letter || isdigit(ch) || ch >= 0x80 || ch == '\'');
            break;
        }
    }
    bool ok = jj_string(e, c, len, out);
    free(c);
    jj_value_free(&s);
    return ok;
}

/* Python's str.strip / lstrip / rstrip (chars NULL: whitespace). */
static bool strip(jj_eval *e, const char *s, size_t len, const char *chars, size_t n_chars, bool left, bool right,
                  jj_value *out)
{
    if (!jj_charge(e, len / 256, 0))
        return false;
    size_t from = 0, to = len;
#define STRIPPED(c) (chars ? memchr(chars, (c), n_chars) != NULL : is_py_space(c))
    while (left && from < to && STRIPPED(s[from]))
        from++;
    while (right && to > from && STRIPPED(s[to - 1]))
        to--;
#undef STRIPPED
    return jj_string(e, s + from, to - from, out);
}

static bool replace(jj_eval *e, const char *s, size_t len, const char *old, size_t n_old, const char *new_,
                    size_t n_new, long long count, jj_value *out)
{
    jj_buf b = {0};
    bool ok = jj_charge(e, len / 256, 0) && jj_buf_append(e, &b, "", 0);
    size_t i = 0;
    long long done = 0;
    if (n_old == 0) { /* Python inserts new_ between every character */
        while (ok && (count < 0 || done < count) && i <= len) {
            ok = jj_buf_append(e, &b, new_, n_new) && jj_step(e, 0);
            done++;
            if (i == len)
                break;
            size_t from = i;
            utf8_next(s, len, &i);
            ok = ok && jj_buf_append(e, &b, s + from, i - from);
        }
        ok = ok && jj_buf_append(e, &b, s + i, len - i);
    } else {
        while (ok) {
            const char *hit = (count < 0 || done < count) ? jj_memmem(s + i, len - i, old, n_old) : NULL;
            if (!hit)
                break;
            size_t at = (size_t)(hit - s);
            ok = jj_buf_append(e, &b, s + i, at - i) && jj_buf_append(e, &b, new_, n_new) && jj_step(e, 0);
            i = at + n_old;
            done++;
        }
        ok = ok && jj_buf_append(e, &b, s + i, len - i);
    }
    ok = ok && jj_string(e, b.bytes, b.len, out);
    free(b.bytes);
    return ok;
}

static bool list_push_string(jj_eval *e, json_t *list, const char *s, size_t len)
{
    if (!jj_check_list(e, json_array_size(list) + 1) || !jj_step(e, 0))
        return false;
    return json_array_append_new(list, json_stringn_nocheck(s, len)) == 0 || jj_nomem(e);
}

/* Python's str.split(sep, maxsplit); sep NULL splits on runs of whitespace. */
static bool split(jj_eval *e, const char *s, size_t len, const char *sep, size_t n_sep, long long maxsplit,
                  int line, jj_value *out)
{
    if (sep && n_sep == 0)
        return jj_fail(e, line, KT_ERR_INVALID, "split(): empty separator");
    json_t *list = json_array();
    if (!list)
        return jj_nomem(e);
    bool ok = jj_charge(e, len / 256, line);
    size_t i = 0;
    long long splits = 0;
    if (sep) {
        for (;;) {
            const char *hit = (maxsplit < 0 || splits < maxsplit) ? jj_memmem(s + i, len - i, sep, n_sep) : NULL;
            size_t at = hit ? (size_t)(hit - s) : len;
            if (!(ok = list_push_string(e, list, s + i, at - i)) || !hit)
                break;
            i = at + n_sep;
            splits++;
        }
    } else {
        while (ok) {
            while (i < len && is_py_space(s[i]))
                i++;
            if (i == len)
                break;
            size_t from = i;
            if (maxsplit >= 0 && splits >= maxsplit) {
                size_t to = len;
                while (to > from && is_py_space(s[to - 1]))
                    to--;
                ok = list_push_string(e, list, s + from, to - from);
                break;
            }
            while (i < len && !is_py_space(s[i]))
                i++;
            ok = list_push_string(e, list, s + from, i - from);
            splits++;
        }
    }
    if (!ok) {
        json_decref(list);
        return false;
    }
    return jj_json(e, list, out);
}

/* s.startswith(x) / s.endswith(x), x a string or a list of them. */
static bool affix(jj_eval *e, const char *s, size_t len, const jj_value *x, bool prefix, int line, bool *result)
{
    *result = false;
    if (jj_is(x, JSON_ARRAY)) {
        for (size_t i = 0; i < json_array_size(x->j) && !*result; i++) {
            jj_value item = {.kind = JJ_V_JSON, .j = json_array_get(x->j, i)};
            if (!affix(e, s, len, &item, prefix, line, result))
                return false;
        }
        return true;
    }
    if (!x || !jj_is(x, JSON_STRING))
        return jj_fail(e, line, KT_ERR_INVALID, "%s() needs a string", prefix ? "startswith" : "endswith");
    size_t k = json_string_length(x->j);
    *result = k <= len && memcmp(prefix ? s : s + len - k, json_string_value(x->j), k) == 0;
    return true;
}

static bool join(jj_eval *e, const jj_value *v, const char *sep, size_t n_sep, const char *attribute, int line,
                 jj_value *out);

static bool string_method(jj_eval *e, const jj_value *obj, const char *name, const jj_args *a, int line,
                          jj_value *out, bool *found)
{
    const char *s = json_string_value(obj->j), *x, *y;
    size_t len = json_string_length(obj->j), nx, ny;
    long long count;
    bool r;
    *found = true;
    if (strcmp(name, "startswith") == 0 || strcmp(name, "endswith") == 0)
        return affix(e, s, len, arg(a, 0, NULL), name[0] == 's', line, &r) && jj_json(e, json_boolean(r), out);
    if (strcmp(name, "strip") == 0 || strcmp(name, "lstrip") == 0 || strcmp(name, "rstrip") == 0)
        return arg_string(e, a, 0, "chars", line, &x, &nx) &&
               strip(e, s, len, x, nx, name[0] != 'r', name[0] != 'l', out);
    if (strcmp(name, "split") == 0)
        return arg_string(e, a, 0, "sep", line, &x, &nx) && arg_int(e, a, 1, "maxsplit", -1, line, &count) &&
               split(e, s, len, x, nx, count, line, out);
    if (strcmp(name, "replace") == 0) {
        if (!arg(a, 0, "old") || !arg(a, 1, "new"))
            return jj_fail(e, line, KT_ERR_INVALID, "replace() needs two strings");
        return arg_string(e, a, 0, "old", line, &x, &nx) && arg_string(e, a, 1, "new", line, &y, &ny) &&
               arg_int(e, a, 2, "count", -1, line, &count) && replace(e, s, len, x, nx, y, ny, count, out);
    }
    if (strcmp(name, "upper") == 0 || strcmp(name, "lower") == 0 || strcmp(name, "title") == 0 ||
        strcmp(name, "capitalize") == 0)
        return ascii_case(e, obj, name[0] == 'u' ? 'u' : name[0] == 'l' ? 'l' : name[0] == 't' ? 't' : 'c', out);
    if (strcmp(name, "find") == 0 || strcmp(name, "count") == 0 || strcmp(name, "index") == 0) {
        if (!arg_string(e, a, 0, "sub", line, &x, &nx) || !x)
            return x ? false : jj_fail(e, line, KT_ERR_INVALID, "%s() needs a string", name);
        const char *hit = jj_memmem(s, len, x, nx);
        if (!jj_charge(e, len / 64, line))
            return false;
        if (name[0] == 'c') {
            long long n = 0;
            for (size_t i = 0; nx && (hit = jj_memmem(s + i, len - i, x, nx)); i = (size_t)(hit - s) + nx)
                n++;
            return jj_json(e, json_integer(nx ? n : (long long)jj_utf8_count(s, len) + 1), out);
        }
        if (!hit && name[0] == 'i')
            return jj_fail(e, line, KT_ERR_INVALID, "index(): substring not found");
        return jj_json(e, json_integer(hit ? (long long)jj_utf8_count(s, (size_t)(hit - s)) : -1), out);
    }
    if (strcmp(name, "join") == 0) {
        const jj_value *items = arg(a, 0, NULL);
        if (!items)
            return jj_fail(e, line, KT_ERR_INVALID, "join() needs a list");
        return join(e, items, s, len, NULL, line, out);
    }
    if (strcmp(name, "removeprefix") == 0 || strcmp(name, "removesuffix") == 0) {
        if (!arg_string(e, a, 0, NULL, line, &x, &nx) || !x)
            return x ? false : jj_fail(e, line, KT_ERR_INVALID, "%s() needs a string", name);
        bool pre = name[6] == 'p';
        bool has = nx <= len && memcmp(pre ? s : s + len - nx, x, nx) == 0;
        return jj_string(e, has && pre ? s + nx : s, has ? len - nx : len, out);
    }
    if (strcmp(name, "splitlines") == 0) {
        json_t *list = json_array();
        bool ok = list != NULL || jj_nomem(e);
        for (size_t i = 0; ok && i < len;) {
            size_t from = i;
            while (i < len && s[i] != '\n' && s[i] != '\r')
                i++;
            ok = list_push_string(e, list, s + from, i - from);
            if (i < len && s[i] == '\r' && i + 1 < len && s[i + 1] == '\n')
                i++;
            if (i < len)
                i++;
        }
        return ok ? jj_json(e, list, out) : (json_decref(list), false);
    }
    if (strcmp(name, "isdigit") == 0 || strcmp(name, "isspace") == 0 || strcmp(name, "isalpha") == 0) {
        bool all = len > 0;
        for (size_t i = 0; i < len && all; i++) {
            unsigned char c = (unsigned char)s[i];
            all = name[2] == 'd' ? isdigit(c) != 0 : name[2] == 's' ? is_py_space((char)c) : (c < 0x80 && isalpha(c));
        }
        return jj_json(e, json_boolean(all), out);
    }
    *found = false;
    return false;
}

/* --------------------------------------------------------------- dicts --- */

static bool items_of(jj_eval *e, const json_t *dict, jj_value *out)
{
    if (!jj_charge(e, json_object_size(dict), 0))
        return false;
    json_t *list = json_array();
    bool ok = list != NULL;
    const char *key;
    size_t key_len;
    json_t *v;
    json_object_keylen_foreach((json_t *)dict, key, key_len, v) {
        json_t *pair = ok ? json_pack("[s%O]", key, key_len, v) : NULL;
        ok = pair && json_array_append_new(list, pair) == 0;
    }
    if (!ok) {
        json_decref(list);
        return jj_nomem(e);
    }
    return jj_json(e, list, out);
}

static bool dict_method(jj_eval *e, const jj_value *obj, const char *name, const jj_args *a, int line,
                        jj_value *out, bool *found)
{
    *found = true;
    if (strcmp(name, "get") == 0) {
        const jj_value *key = arg(a, 0, "key"), *def = arg(a, 1, "default");
        if (!key)
            return jj_fail(e, line, KT_ERR_INVALID, "get() needs a key");
        json_t *j = jj_is(key, JSON_STRING)
                        ? json_object_getn(obj->j, json_string_value(key->j), json_string_length(key->j))
                        : NULL;
        if (j) {
            json_incref(j);
            return jj_json(e, j, out);
        }
        if (def) {
            *out = jj_copy(def);
            return true;
        }
        return jj_json(e, json_null(), out);
    }
    if (strcmp(name, "items") == 0)
        return items_of(e, obj->j, out);
    if (strcmp(name, "keys") == 0 || strcmp(name, "values") == 0) {
        if (!jj_charge(e, json_object_size(obj->j), line))
            return false;
        json_t *list = json_array();
        bool ok = list != NULL;
        const char *key;
        size_t key_len;
        json_t *v;
        json_object_keylen_foreach(obj->j, key, key_len, v) {
            json_t *x = name[0] == 'k' ? json_stringn_nocheck(key, key_len) : json_incref(v);
            ok = ok && x && json_array_append_new(list, x) == 0;
        }
        if (!ok) {
            json_decref(list);
            return jj_nomem(e);
        }
        return jj_json(e, list, out);
    }
    *found = false;
    return false;
}

bool jj_call_method(jj_eval *e, const jj_value *obj, const char *name, const jj_args *args, int line,
                    jj_value *out)
{
    bool found = false, ok = false;
    if (jj_is(obj, JSON_STRING))
        ok = string_method(e, obj, name, args, line, out, &found);
    else if (jj_is(obj, JSON_OBJECT))
        ok = dict_method(e, obj, name, args, line, out, &found);
    if (found)
        return ok;
    if (e->st != KT_OK)
        return false;
    return jj_fail(e, line, KT_ERR_INVALID, "%s has no method '%s'", jj_type_name(obj), name);
}

/* ------------------------------------------------------------- filters --- */

/* v.attr with dots ("function.name") and integer parts, as jinja2's make_attrgetter. */
static bool get_path(jj_eval *e, const jj_value *v, const char *path, int line, jj_value *out)
{
    jj_value cur = jj_copy(v);
    const char *p = path;
    bool ok = true;
    while (ok) {
        const char *dot = strchr(p, '.');
        size_t n = dot ? (size_t)(dot - p) : strlen(p);
        jj_value key, next;
        bool digits = n > 0;
        for (size_t i = 0; i < n; i++)
            digits &= isdigit((unsigned char)p[i]) != 0;
        ok = digits ? jj_json(e, json_integer(atoll(p)), &key) : jj_string(e, p, n, &key);
        if (ok && cur.kind == JJ_V_UNDEFINED) {
            jj_value_free(&key);
            break; /* an undefined stays undefined down the path */
        }
        ok = ok && jj_get_item(e, &cur, &key, line, &next);
        jj_value_free(&key);
        jj_value_free(&cur);
        if (!ok)
            break;
        cur = next;
        if (!dot)
            break;
        p = dot + 1;
    }
    if (!ok) {
        jj_value_free(&cur);
        return false;
    }
    *out = cur;
    return true;
}

static bool join(jj_eval *e, const jj_value *v, const char *sep, size_t n_sep, const char *attribute, int line,
                 jj_value *out)
{
    json_t *items;
    if (!jj_iterate(e, v, line, &items))
        return false;
    jj_buf b = {0};
    bool ok = jj_buf_append(e, &b, "", 0);
    for (size_t i = 0; ok && i < json_array_size(items); i++) {
        jj_value item = {.kind = JJ_V_JSON, .j = json_array_get(items, i)}, picked;
        ok = (i == 0 || jj_buf_append(e, &b, sep, n_sep)) && jj_step(e, line);
        if (ok && attribute) {
            ok = get_path(e, &item, attribute, line, &picked) && jj_to_str(e, &b, &picked);
            jj_value_free(&picked);
        } else if (ok) {
            ok = jj_to_str(e, &b, &item);
        }
    }
    ok = ok && jj_string(e, b.bytes, b.len, out);
    free(b.bytes);
    json_decref(items);
    return ok;
}

static bool filter_tojson(jj_eval *e, const jj_value *v, const jj_args *a, int line, jj_value *out)
{
    if (v->kind != JJ_V_JSON)
        return jj_fail(e, line, KT_ERR_INVALID, "tojson: %s is not JSON serializable", jj_type_name(v));
    /* HF's tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False) */
    char indent[64] = "";
    json_style st = {.item_sep = ", ", .key_sep = ": ", .ensure_ascii = arg_bool(a, 0, "ensure_ascii", false),
                     .sort_keys = arg_bool(a, 3, "sort_keys", false)};
    const jj_value *ind = arg(a, 1, "indent");
    if (ind && !jj_is(ind, JSON_NULL)) {
        if (jj_is(ind, JSON_INTEGER)) {
            long long w = json_integer_value(ind->j);
            w = w < 0 ? 0 : w > 32 ? 32 : w;
            memset(indent, ' ', (size_t)w);
            indent[w] = '\0';
        } else if (jj_is(ind, JSON_STRING)) {
            snprintf(indent, sizeof indent, "%s", json_string_value(ind->j));
        } else {
            return jj_fail(e, line, KT_ERR_INVALID, "tojson: indent must be an integer or a string");
        }
        st.indent = indent;
        st.item_sep = ",";
    }
    const jj_value *sep = arg(a, 2, "separators");
    if (sep && !jj_is(sep, JSON_NULL)) {
        if (!jj_is(sep, JSON_ARRAY) || json_array_size(sep->j) != 2 || !json_is_string(json_array_get(sep->j, 0)) ||
            !json_is_string(json_array_get(sep->j, 1)))
            return jj_fail(e, line, KT_ERR_INVALID, "tojson: separators must be two strings");
        st.item_sep = json_string_value(json_array_get(sep->j, 0));
        st.key_sep = json_string_value(json_array_get(sep->j, 1));
    }
    jj_buf b = {0};
    bool ok = jj_buf_append(e, &b, "", 0) && json_out(e, &b, v->j, &st, 0) && jj_string(e, b.bytes, b.len, out);
    free(b.bytes);
    return ok;
}

static bool filter_indent(jj_eval *e, const jj_value *v, const jj_args *a, int line, jj_value *out)
{
    jj_value s;
    char pad[256];
    const jj_value *w = arg(a, 0, "width");
    if (w && jj_is(w, JSON_STRING)) {
        snprintf(pad, sizeof pad, "%s", json_string_value(w->j));
    } else {
        long long n;
        if (!arg_int(e, a, 0, "width", 4, line, &n))
            return false;
        n = n < 0 ? 0 : n > 255 ? 255 : n;
        memset(pad, ' ', (size_t)n);
        pad[n] = '\0';
    }
    bool first = arg_bool(a, 1, "first", false), blank = arg_bool(a, 2, "blank", false);
    if (!to_string_value(e, v, &s))
        return false;
    const char *t = json_string_value(s.j);
    size_t len = json_string_length(s.j);
    jj_buf b = {0};
    bool ok = jj_buf_append(e, &b, "", 0);
    for (size_t i = 0, line_no = 0; ok && i <= len; line_no++) {
        size_t from = i;
        while (i < len && t[i] != '\n')
            i++;
        bool empty = i == from;
        if ((line_no > 0 || first) && (blank || !empty))
            ok = jj_buf_puts(e, &b, pad);
        ok = ok && jj_buf_append(e, &b, t + from, i - from) && jj_step(e, line);
        if (i < len)
            ok = ok && jj_buf_append(e, &b, "\n", 1);
        i++;
    }
    ok = ok && jj_string(e, b.bytes, b.len, out);
    free(b.bytes);
    jj_value_free(&s);
    return ok;
}

/* select / reject / selectattr / rejectattr / map. */
static bool filter_select(jj_eval *e, const char *name, const jj_value *v, const jj_args *a, int line,
                          jj_value *out)
{
    bool attr = strstr(name, "attr") != NULL, keep = name[0] != 'r', map = strcmp(name, "map") == 0;
    json_t *items, *list = NULL;
    if (!jj_iterate(e, v, line, &items))
        return false;
    size_t first_test_arg = attr ? 1 : 0;
    const char *path = NULL, *test = NULL;
    bool ok = true;
    if (map) {
        const jj_value *at = arg(a, KEYWORD_ONLY, "attribute");
        if (at)
            ok = need_string(e, at, "map(attribute=)", line) && (path = json_string_value(at->j));
        else if (a->n_positional == 0 || !jj_is(&a->v[0], JSON_STRING))
            ok = jj_fail(e, line, KT_ERR_INVALID, "map needs a filter name or attribute=");
    } else if (attr) {
        ok = a->n_positional >= 1 ? need_string(e, &a->v[0], name, line) && (path = json_string_value(a->v[0].j))
                                  : jj_fail(e, line, KT_ERR_INVALID, "%s needs an attribute name", name);
    }
    if (ok && !map && a->n_positional > first_test_arg) {
        ok = need_string(e, &a->v[first_test_arg], name, line);
        test = ok ? json_string_value(a->v[first_test_arg].j) : NULL;
    }
    ok = ok && ((list = json_array()) != NULL || jj_nomem(e));
    for (size_t i = 0; ok && i < json_array_size(items); i++) {
        jj_value item = {.kind = JJ_V_JSON, .j = json_array_get(items, i)}, probe = {0};
        ok = jj_step(e, line);
        if (ok && path)
            ok = get_path(e, &item, path, line, &probe);
        else if (ok)
            probe = jj_copy(&item);
        if (ok && map) {
            jj_value mapped = {0};
            if (path) {
                mapped = jj_copy(&probe);
                if (mapped.kind == JJ_V_UNDEFINED && arg(a, KEYWORD_ONLY, "default")) {
                    mapped = jj_copy(arg(a, KEYWORD_ONLY, "default"));
                }
            } else {
                jj_args rest = {0};
                for (size_t k = 1; k < a->n; k++) {
                    rest.v[rest.n] = a->v[k];
                    rest.kw[rest.n++] = a->kw[k];
                }
                rest.n_positional = a->n_positional - 1;
                ok = jj_apply_filter(e, json_string_value(a->v[0].j), &probe, &rest, line, &mapped);
            }
            if (ok) {
                json_t *j = mapped.kind == JJ_V_JSON ? json_incref(mapped.j) : json_null();
                ok = jj_check_list(e, json_array_size(list) + 1) && (json_array_append_new(list, j) == 0 || jj_nomem(e));
            }
            jj_value_free(&mapped);
        } else if (ok) {
            bool r = jj_truthy(&probe);
            if (test) {
                jj_args rest = {0};
                for (size_t k = first_test_arg + 1; k < a->n; k++) {
                    rest.v[rest.n] = a->v[k];
                    rest.kw[rest.n++] = a->kw[k];
                }
                rest.n_positional = a->n_positional - first_test_arg - 1;
                ok = jj_apply_test(e, test, &probe, &rest, line, &r);
            }
            if (ok && r == keep)
                ok = json_array_append(list, item.j) == 0 || jj_nomem(e);
        }
        jj_value_free(&probe);
    }
    json_decref(items);
    if (!ok) {
        json_decref(list);
        return false;
    }
    return jj_json(e, list, out);
}

/* Python's sorted(): stable; strings compare case-insensitively unless case_sensitive. */
typedef struct sort_ctx {
    jj_eval *e;
    bool case_sensitive;
    int line;
    bool ok;
} sort_ctx;

static int sort_cmp(sort_ctx *c, const json_t *x, const json_t *y)
{
    if (!c->ok || !jj_step(c->e, c->line)) {
        c->ok = false;
        return 0;
    }
    if (json_is_string(x) && json_is_string(y)) {
        const char *a = json_string_value(x), *b = json_string_value(y);
        size_t la = json_string_length(x), lb = json_string_length(y);
        if (!jj_charge(c->e, (la < lb ? la : lb) / 256, c->line)) {
            c->ok = false;
            return 0;
        }
        for (size_t i = 0; i < la && i < lb; i++) {
            int ca = (unsigned char)a[i], cb = (unsigned char)b[i];
            if (!c->case_sensitive) {
                ca = ca < 0x80 ? tolower(ca) : ca;
                cb = cb < 0x80 ? tolower(cb) : cb;
            }
            if (ca != cb)
                return ca < cb ? -1 : 1;
        }
        return la < lb ? -1 : la > lb;
    }
    bool nx = json_is_number(x) || json_is_boolean(x), ny = json_is_number(y) || json_is_boolean(y);
    if (nx && ny) {
        double a = json_is_boolean(x) ? json_is_true(x) : json_number_value(x);
        double b = json_is_boolean(y) ? json_is_true(y) : json_number_value(y);
        return a < b ? -1 : a > b;
    }
    c->ok = jj_fail(c->e, c->line, KT_ERR_INVALID, "sort: cannot order these values");
    return 0;
}

static void merge_sort(sort_ctx *c, json_t **v, json_t **keys, json_t **tmp, json_t **tmpk, size_t n)
{
    if (n < 2 || !c->ok)
        return;
    size_t h = n / 2;
    merge_sort(c, v, keys, tmp, tmpk, h);
    merge_sort(c, v + h, keys + h, tmp, tmpk, n - h);
    size_t i = 0, j = h, k = 0;
    while (i < h && j < n)
        if (sort_cmp(c, keys[j], keys[i]) < 0) {
            tmp[k] = v[j];
            tmpk[k++] = keys[j++];
        } else {
            tmp[k] = v[i];
            tmpk[k++] = keys[i++];
        }
    while (i < h) {
        tmp[k] = v[i];
        tmpk[k++] = keys[i++];
    }
    while (j < n) {
        tmp[k] = v[j];
        tmpk[k++] = keys[j++];
    }
    memcpy(v, tmp, n * sizeof *v);
    memcpy(keys, tmpk, n * sizeof *keys);
}

static bool filter_sort(jj_eval *e, const jj_value *v, const jj_args *a, int line, jj_value *out)
{
    json_t *items;
    if (!jj_iterate(e, v, line, &items))
        return false;
    size_t n = json_array_size(items);
    bool reverse = arg_bool(a, 0, "reverse", false);
    sort_ctx c = {e, arg_bool(a, 1, "case_sensitive", false), line, true};
    const char *path = NULL;
    size_t path_len;
    c.ok = arg_string(e, a, 2, "attribute", line, &path, &path_len);
    json_t **vals = calloc(n ? 4 * n : 1, sizeof *vals), *list = NULL;
    jj_value *held = calloc(n ? n : 1, sizeof *held);
    if (!vals || !held)
        c.ok = jj_nomem(e);
    for (size_t i = 0; c.ok && i < n; i++) {
        vals[i] = json_array_get(items, i);
        jj_value item = {.kind = JJ_V_JSON, .j = vals[i]};
        if (path) {
            c.ok = get_path(e, &item, path, line, &held[i]);
            vals[n + i] = c.ok && held[i].kind == JJ_V_JSON ? held[i].j : json_null();
        } else {
            vals[n + i] = vals[i];
        }
    }
    if (c.ok)
        merge_sort(&c, vals, vals + n, vals + 2 * n, vals + 3 * n, n);
    if (c.ok && (list = json_array()) == NULL)
        c.ok = jj_nomem(e);
    for (size_t i = 0; c.ok && i < n; i++)
        c.ok = json_array_append(list, vals[reverse ? n - 1 - i : i]) == 0 || jj_nomem(e);
    for (size_t i = 0; held && i < n; i++)
        jj_value_free(&held[i]);
    free(held);
    free(vals);
    json_decref(items);
    if (!c.ok) {
        json_decref(list);
        return false;
    }
    return jj_json(e, list, out);
}

bool jj_apply_filter(jj_eval *e, const char *name, const jj_value *v, const jj_args *a, int line, jj_value *out)
{
    *out = (jj_value){0};
    const char *x, *y;
    size_t nx, ny;
    long long count;
    if (strcmp(name, "tojson") == 0)
        return filter_tojson(e, v, a, line, out);
    if (strcmp(name, "length") == 0 || strcmp(name, "count") == 0) {
        if (v->kind == JJ_V_UNDEFINED)
            return jj_json(e, json_integer(0), out);
        if (jj_is(v, JSON_STRING))
            return jj_charge(e, json_string_length(v->j) / 64, line) &&
                   jj_json(e, json_integer((json_int_t)jj_utf8_count(json_string_value(v->j), json_string_length(v->j))),
                           out);
        if (jj_is(v, JSON_ARRAY))
            return jj_json(e, json_integer((json_int_t)json_array_size(v->j)), out);
        if (jj_is(v, JSON_OBJECT) || v->kind == JJ_V_NAMESPACE)
            return jj_json(e, json_integer((json_int_t)json_object_size(v->j)), out);
        return jj_fail(e, line, KT_ERR_INVALID, "%s has no length", jj_type_name(v));
    }
    if (strcmp(name, "string") == 0)
        return to_string_value(e, v, out);
    if (strcmp(name, "trim") == 0) {
        jj_value s;
        if (!arg_string(e, a, 0, "chars", line, &x, &nx) || !to_string_value(e, v, &s))
            return false;
        bool ok = strip(e, json_string_value(s.j), json_string_length(s.j), x, nx, true, true, out);
        jj_value_free(&s);
        return ok;
    }
    if (strcmp(name, "upper") == 0 || strcmp(name, "lower") == 0 || strcmp(name, "capitalize") == 0 ||
        strcmp(name, "title") == 0)
        return ascii_case(e, v, name[0] == 'u' ? 'u' : name[0] == 'l' ? 'l' : name[0] == 'c' ? 'c' : 't', out);
    if (strcmp(name, "replace") == 0) {
        jj_value s;
        if (!arg(a, 0, "old") || !arg(a, 1, "new"))
            return jj_fail(e, line, KT_ERR_INVALID, "replace needs two strings");
        if (!arg_string(e, a, 0, "old", line, &x, &nx) || !arg_string(e, a, 1, "new", line, &y, &ny) ||
            !arg_int(e, a, 2, "count", -1, line, &count) || !to_string_value(e, v, &s))
            return false;
        bool ok = replace(e, json_string_value(s.j), json_string_length(s.j), x, nx, y, ny, count, out);
        jj_value_free(&s);
        return ok;
    }
    if (strcmp(name, "join") == 0) {
        const char *attribute;
        size_t n_attribute;
        return arg_string(e, a, 0, "d", line, &x, &nx) && arg_string(e, a, 1, "attribute", line, &attribute, &n_attribute) &&
               join(e, v, x ? x : "", nx, attribute, line, out);
    }
    if (strcmp(name, "first") == 0 || strcmp(name, "last") == 0) {
        json_t *items;
        if (!jj_iterate(e, v, line, &items))
            return false;
        size_t n = json_array_size(items);
        json_t *j = n ? json_array_get(items, name[0] == 'f' ? 0 : n - 1) : NULL;
        if (j)
            *out = (jj_value){.kind = JJ_V_JSON, .j = json_incref(j)};
        json_decref(items);
        return true;
    }
    if (strcmp(name, "default") == 0 || strcmp(name, "d") == 0) {
        const jj_value *def = arg(a, 0, "default_value");
        bool boolean = arg_bool(a, 1, "boolean", false);
        if (v->kind == JJ_V_UNDEFINED || (boolean && !jj_truthy(v))) {
            if (def)
                *out = jj_copy(def);
            else
                return jj_string(e, "", 0, out);
        } else {
            *out = jj_copy(v);
        }
        return true;
    }
    if (strcmp(name, "int") == 0 || strcmp(name, "float") == 0) {
        bool is_int = name[0] == 'i';
        const jj_value *def = arg(a, 0, "default");
        double d = 0;
        long long i = 0;
        bool parsed = true;
        if (jj_is(v, JSON_INTEGER) || jj_is(v, JSON_TRUE) || jj_is(v, JSON_FALSE)) {
            i = jj_int(v);
            d = (double)i;
        } else if (jj_is(v, JSON_REAL)) {
            d = json_real_value(v->j);
            parsed = isfinite(d) && fabs(d) < 9.2e18;
            i = parsed ? (long long)d : 0;
        } else if (jj_is(v, JSON_STRING)) {
            const char *s = json_string_value(v->j);
            char *end;
            if (is_int) {
                i = strtoll(s, &end, 10);
                if (end == s) { /* jinja2 falls back to int(float(s)) */
                    d = strtod(s, &end);
                    i = isfinite(d) && fabs(d) < 9.2e18 ? (long long)d : 0;
                }
            } else {
                d = strtod(s, &end);
            }
            while (is_py_space(*end))
                end++;
            parsed = end != s && *end == '\0';
        } else {
            parsed = false;
        }
        if (!parsed) {
            if (def)
                *out = jj_copy(def);
            else
                return jj_json(e, is_int ? json_integer(0) : json_real(0), out);
            return true;
        }
        return jj_json(e, is_int ? json_integer(i) : json_real(d), out);
    }
    if (strcmp(name, "items") == 0) {
        if (v->kind == JJ_V_UNDEFINED)
            return jj_json(e, json_array(), out);
        if (!jj_is(v, JSON_OBJECT) && v->kind != JJ_V_NAMESPACE)
            return jj_fail(e, line, KT_ERR_INVALID, "items needs a dict, not %s", jj_type_name(v));
        return items_of(e, v->j, out);
    }
    if (strcmp(name, "list") == 0) {
        json_t *items;
        if (!jj_iterate(e, v, line, &items))
            return false;
        if (!jj_charge(e, json_array_size(items), line)) {
            json_decref(items);
            return false;
        }
        json_t *copy = json_copy(items);
        json_decref(items);
        return jj_json(e, copy, out);
    }
    if (strcmp(name, "reverse") == 0) {
        if (jj_is(v, JSON_STRING)) {
            const char *s = json_string_value(v->j);
            size_t len = json_string_length(v->j);
            char *r = malloc(len + 1);
            if (!r)
                return jj_nomem(e);
            for (size_t i = 0; i < len;) { /* code point by code point */
                size_t from = i;
                utf8_next(s, len, &i);
                memcpy(r + len - i, s + from, i - from);
            }
            bool ok = jj_string(e, r, len, out);
            free(r);
            return ok;
        }
        json_t *items;
        if (!jj_iterate(e, v, line, &items))
            return false;
        json_t *list = json_array();
        bool ok = list != NULL && jj_charge(e, json_array_size(items), line);
        for (size_t i = json_array_size(items); ok && i-- > 0;)
            ok = json_array_append(list, json_array_get(items, i)) == 0;
        json_decref(items);
        if (!ok) {
            json_decref(list);
            return jj_nomem(e);
        }
        return jj_json(e, list, out);
    }
    if (strcmp(name, "select") == 0 || strcmp(name, "reject") == 0 || strcmp(name, "selectattr") == 0 ||
        strcmp(name, "rejectattr") == 0 || strcmp(name, "map") == 0)
        return filter_select(e, name, v, a, line, out);
    if (strcmp(name, "indent") == 0)
        return filter_indent(e, v, a, line, out);
    if (strcmp(name, "sort") == 0)
        return filter_sort(e, v, a, line, out);
    if (strcmp(name, "unique") == 0) {
        json_t *items;
        if (!jj_iterate(e, v, line, &items))
            return false;
        json_t *list = json_array();
        bool ok = list != NULL || jj_nomem(e);
        for (size_t i = 0; ok && i < json_array_size(items); i++) {
            json_t *item = json_array_get(items, i);
            bool seen = false;
            for (size_t k = 0; ok && k < json_array_size(list) && !seen; k++) {
                seen = jj_json_equal(e, json_array_get(list, k), item);
                ok = e->st == KT_OK;
            }
            if (ok && !seen)
                ok = json_array_append(list, item) == 0 || jj_nomem(e);
        }
        json_decref(items);
        return ok ? jj_json(e, list, out) : (json_decref(list), false);
    }
    if (strcmp(name, "abs") == 0) {
        if (jj_is(v, JSON_INTEGER)) {
            long long i = json_integer_value(v->j);
            if (i == LLONG_MIN)
                return jj_fail(e, line, KT_ERR_INVALID, "integer overflow");
            return jj_json(e, json_integer(i < 0 ? -i : i), out);
        }
        if (jj_is(v, JSON_REAL))
            return jj_json(e, json_real(fabs(json_real_value(v->j))), out);
        return jj_fail(e, line, KT_ERR_INVALID, "abs needs a number, not %s", jj_type_name(v));
    }
    if (strcmp(name, "round") == 0) {
        long long precision;
        if (!jj_is_number(v))
            return jj_fail(e, line, KT_ERR_INVALID, "round needs a number, not %s", jj_type_name(v));
        if (!arg_int(e, a, 0, "precision", 0, line, &precision) || !arg_string(e, a, 1, "method", line, &x, &nx))
            return false;
        double scale = pow(10, (double)(precision < -20 ? -20 : precision > 20 ? 20 : precision));
        double d = jj_number(v) * scale;
        d = x && strcmp(x, "floor") == 0 ? floor(d) : x && strcmp(x, "ceil") == 0 ? ceil(d) : round(d);
        return jj_json(e, json_real(d / scale), out);
    }
    if (strcmp(name, "max") == 0 || strcmp(name, "min") == 0 || strcmp(name, "sum") == 0) {
        json_t *items;
        if (!jj_iterate(e, v, line, &items))
            return false;
        bool ok = true, is_sum = name[1] == 'u';
        jj_value best = is_sum ? (jj_value){.kind = JJ_V_JSON, .j = json_integer(0)} : (jj_value){0};
        for (size_t i = 0; ok && i < json_array_size(items); i++) {
            jj_value item = {.kind = JJ_V_JSON, .j = json_array_get(items, i)};
            if (is_sum) {
                if (!jj_is_number(&item)) {
                    ok = jj_fail(e, line, KT_ERR_INVALID, "sum needs numbers");
                    break;
                }
                bool ints = jj_is(&best, JSON_INTEGER) && !jj_is(&item, JSON_REAL);
                json_t *s = ints ? json_integer(json_integer_value(best.j) + jj_int(&item))
                                 : json_real(jj_number(&best) + jj_number(&item));
                jj_value_free(&best);
                ok = jj_json(e, s, &best);
                continue;
            }
            sort_ctx c = {e, false, line, true};
            if (best.kind == JJ_V_UNDEFINED || (sort_cmp(&c, item.j, best.j) < 0) == (name[1] == 'i')) {
                if (!c.ok) {
                    ok = false;
                    break;
                }
                jj_value_free(&best);
                best = jj_copy(&item);
            }
            ok = c.ok;
        }
        json_decref(items);
        if (!ok) {
            jj_value_free(&best);
            return false;
        }
        *out = best;
        return true;
    }
    if (strcmp(name, "safe") == 0 || strcmp(name, "e") == 0 || strcmp(name, "escape") == 0) {
        if (name[0] == 's') {
            *out = jj_copy(v);
            return true;
        }
    }
    if (strcmp(name, "dictsort") == 0 && jj_is(v, JSON_OBJECT)) {
        jj_value pairs;
        jj_args none = {0};
        if (!items_of(e, v->j, &pairs))
            return false;
        /* Sorting [key, value] pairs by key: sort the keys, then pair them up. */
        json_t *keys = json_array();
        bool ok = keys != NULL || jj_nomem(e);
        for (size_t i = 0; ok && i < json_array_size(pairs.j); i++)
            ok = json_array_append(keys, json_array_get(json_array_get(pairs.j, i), 0)) == 0 || jj_nomem(e);
        jj_value sorted = {0}, kv = {.kind = JJ_V_JSON, .j = keys};
        ok = ok && filter_sort(e, &kv, &none, line, &sorted);
        json_t *list = ok ? json_array() : NULL;
        for (size_t i = 0; ok && list && i < json_array_size(sorted.j); i++) {
            const char *k = json_string_value(json_array_get(sorted.j, i));
            ok = json_array_append_new(list, json_pack("[sO]", k, json_object_get(v->j, k))) == 0 || jj_nomem(e);
        }
        jj_value_free(&sorted);
        jj_value_free(&pairs);
        json_decref(keys);
        return ok && list ? jj_json(e, list, out) : (json_decref(list), ok ? jj_nomem(e) : false);
    }
    return jj_fail(e, line, KT_ERR_INVALID, "no filter named '%s'", name);
}

/* --------------------------------------------------------------- tests --- */

bool jj_apply_test(jj_eval *e, const char *name, const jj_value *v, const jj_args *a, int line, bool *result)
{
    const jj_value *x = arg(a, 0, NULL);
    bool r = false;
    if (strcmp(name, "defined") == 0)
        r = v->kind != JJ_V_UNDEFINED;
    else if (strcmp(name, "undefined") == 0)
        r = v->kind == JJ_V_UNDEFINED;
    else if (strcmp(name, "none") == 0)
        r = jj_is(v, JSON_NULL);
    else if (strcmp(name, "boolean") == 0)
        r = jj_is(v, JSON_TRUE) || jj_is(v, JSON_FALSE);
    else if (strcmp(name, "true") == 0)
        r = jj_is(v, JSON_TRUE);
    else if (strcmp(name, "false") == 0)
        r = jj_is(v, JSON_FALSE);
    else if (strcmp(name, "integer") == 0)
        r = jj_is(v, JSON_INTEGER);
    else if (strcmp(name, "float") == 0)
        r = jj_is(v, JSON_REAL);
    else if (strcmp(name, "number") == 0)
        r = jj_is_number(v);
    else if (strcmp(name, "string") == 0)
        r = jj_is(v, JSON_STRING);
    else if (strcmp(name, "mapping") == 0)
        r = jj_is(v, JSON_OBJECT);
    else if (strcmp(name, "iterable") == 0)
        r = jj_is(v, JSON_ARRAY) || jj_is(v, JSON_OBJECT) || jj_is(v, JSON_STRING) || v->kind == JJ_V_UNDEFINED;
    else if (strcmp(name, "sequence") == 0)
        r = jj_is(v, JSON_ARRAY) || jj_is(v, JSON_OBJECT) || jj_is(v, JSON_STRING) || v->kind == JJ_V_UNDEFINED;
    else if (strcmp(name, "callable") == 0)
        r = v->kind == JJ_V_MACRO;
    else if (strcmp(name, "odd") == 0 || strcmp(name, "even") == 0 || strcmp(name, "divisibleby") == 0) {
        long long d = name[0] == 'd' ? 0 : 2;
        if (!jj_is(v, JSON_INTEGER))
            return jj_fail(e, line, KT_ERR_INVALID, "'%s' needs an integer, not %s", name, jj_type_name(v));
        if (name[0] == 'd' && (!x || !jj_is(x, JSON_INTEGER) || (d = json_integer_value(x->j)) == 0))
            return jj_fail(e, line, KT_ERR_INVALID, "divisibleby needs a non-zero integer");
        long long m = d == -1 ? 0 : json_integer_value(v->j) % d;
        r = name[0] == 'o' ? m != 0 : m == 0;
    } else if (strcmp(name, "lower") == 0 || strcmp(name, "upper") == 0) {
        r = jj_is(v, JSON_STRING);
        const char *s = r ? json_string_value(v->j) : "";
        bool cased = false;
        for (size_t i = 0; r && s[i]; i++) {
            unsigned char c = (unsigned char)s[i];
            cased |= c < 0x80 && isalpha(c);
            r = !(c < 0x80 && (name[0] == 'l' ? isupper(c) : islower(c)));
        }
        r = r && cased;
    } else if (strcmp(name, "sameas") == 0) {
        r = x && v->kind == x->kind &&
            (v->kind != JJ_V_JSON ? v->j == x->j && v->macro == x->macro
                                  : (json_is_null(v->j) || json_is_boolean(v->j)) ? json_typeof(v->j) == json_typeof(x->j)
                                                                                   : v->j == x->j);
    } else if (strcmp(name, "in") == 0) {
        if (!x)
            return jj_fail(e, line, KT_ERR_INVALID, "'in' test needs a container");
        if (!jj_contains(e, x, v, line, &r))
            return false;
    } else {
        static const struct { const char *names[3]; int op; } cmps[] = {
            {{"eq", "equalto", "=="}, JJ_OP_EQ}, {{"ne", "!=", NULL}, JJ_OP_NE}, {{"lt", "lessthan", "<"}, '<'},
            {{"gt", "greaterthan", ">"}, '>'},   {{"le", "<=", NULL}, JJ_OP_LE}, {{"ge", ">=", NULL}, JJ_OP_GE}};
        int op = 0;
        for (size_t k = 0; k < sizeof cmps / sizeof cmps[0] && !op; k++)
            for (int m = 0; m < 3 && cmps[k].names[m]; m++)
                if (strcmp(name, cmps[k].names[m]) == 0)
                    op = cmps[k].op;
        if (!op)
            return jj_fail(e, line, KT_ERR_INVALID, "no test named '%s'", name);
        if (!x)
            return jj_fail(e, line, KT_ERR_INVALID, "test '%s' needs a value to compare with", name);
        if (op == JJ_OP_EQ || op == JJ_OP_NE) {
            r = jj_equal(e, v, x) == (op == JJ_OP_EQ);
            if (e->st != KT_OK)
                return false;
        } else {
            bool ordered = (jj_is_number(v) && jj_is_number(x)) || (jj_is(v, JSON_STRING) && jj_is(x, JSON_STRING));
            if (!ordered)
                return jj_fail(e, line, KT_ERR_INVALID, "cannot order %s and %s", jj_type_name(v), jj_type_name(x));
            int c;
            if (jj_is(v, JSON_STRING)) {
                c = strcmp(json_string_value(v->j), json_string_value(x->j));
            } else {
                double p = jj_number(v), q = jj_number(x);
                c = p < q ? -1 : p > q;
            }
            r = op == '<' ? c < 0 : op == '>' ? c > 0 : op == JJ_OP_LE ? c <= 0 : c >= 0;
        }
    }
    *result = r;
    return true;
}

/* ------------------------------------------------------------- globals --- */

static bool builtin_range(jj_eval *e, const jj_args *a, int line, jj_value *out)
{
    long long start = 0, stop, step = 1;
    for (size_t i = 0; i < a->n; i++)
        if (!jj_is(&a->v[i], JSON_INTEGER) && !jj_is(&a->v[i], JSON_TRUE) && !jj_is(&a->v[i], JSON_FALSE))
            return jj_fail(e, line, KT_ERR_INVALID, "range() takes integers, not %s", jj_type_name(&a->v[i]));
    if (a->n == 1) {
        stop = jj_int(&a->v[0]);
    } else if (a->n == 2 || a->n == 3) {
        start = jj_int(&a->v[0]);
        stop = jj_int(&a->v[1]);
        step = a->n == 3 ? jj_int(&a->v[2]) : 1;
    } else {
        return jj_fail(e, line, KT_ERR_INVALID, "range() takes one to three integers");
    }
    if (step == 0)
        return jj_fail(e, line, KT_ERR_INVALID, "range() step must not be zero");
    /* Count in long double: stop - start may overflow 64 bits. */
    long double span = (long double)stop - (long double)start;
    long double count = step > 0 ? (span > 0 ? (span + (long double)step - 1) / (long double)step : 0)
                                 : (span < 0 ? (span + (long double)step + 1) / (long double)step : 0);
    size_t n = (size_t)(count > (long double)SIZE_MAX / 2 ? (long double)SIZE_MAX / 2 : count);
    if (!jj_check_list(e, n) || !jj_charge(e, n, line))
        return false;
    json_t *list = json_array();
    bool ok = list != NULL;
    for (size_t i = 0; ok && i < n; i++)
        ok = json_array_append_new(list, json_integer(start + (long long)i * step)) == 0;
    if (!ok) {
        json_decref(list);
        return jj_nomem(e);
    }
    return jj_json(e, list, out);
}

bool jj_call_builtin(jj_eval *e, const char *name, const jj_args *a, int line, jj_value *out)
{
    if (strcmp(name, "range") == 0)
        return builtin_range(e, a, line, out);
    if (strcmp(name, "namespace") == 0 || strcmp(name, "dict") == 0) {
        json_t *obj = json_object();
        bool ok = obj != NULL || jj_nomem(e);
        for (size_t i = 0; ok && i < a->n; i++) {
            if (!a->kw[i]) {
                /* namespace({...}) / dict({...}): start from a mapping */
                if (!jj_is(&a->v[i], JSON_OBJECT))
                    ok = jj_fail(e, line, KT_ERR_INVALID, "%s() takes keyword arguments or a dict", name);
                else
                    ok = json_object_update(obj, a->v[i].j) == 0 || jj_nomem(e);
                continue;
            }
            json_t *j = a->v[i].kind == JJ_V_JSON ? json_incref(a->v[i].j) : json_null();
            ok = json_object_set_new(obj, a->kw[i], j) == 0 || jj_nomem(e);
        }
        if (!ok) {
            json_decref(obj);
            return false;
        }
        *out = (jj_value){.kind = name[0] == 'n' ? JJ_V_NAMESPACE : JJ_V_JSON, .j = obj};
        return true;
    }
    if (strcmp(name, "raise_exception") == 0) {
        jj_buf b = {0};
        const jj_value *msg = arg(a, 0, NULL);
        bool ok = jj_buf_append(e, &b, "", 0) && (!msg || jj_to_str(e, &b, msg));
        if (ok)
            jj_fail(e, line, KT_ERR_INVALID, "the template raised an error: %.700s", b.bytes);
        free(b.bytes);
        return false;
    }
    if (strcmp(name, "strftime_now") == 0) {
        const char *fmt;
        size_t n;
        if (!arg_string(e, a, 0, "format", line, &fmt, &n) || !fmt)
            return fmt ? false : jj_fail(e, line, KT_ERR_INVALID, "strftime_now() needs a format");
        time_t now = time(NULL);
        struct tm tm;
        char buf[256];
        if (!localtime_r(&now, &tm))
            return jj_fail(e, line, KT_ERR_INVALID, "strftime_now(): no local time");
        size_t len = strftime(buf, sizeof buf, fmt, &tm);
        return jj_string(e, buf, len, out);
    }
    return jj_fail(e, line, KT_ERR_INVALID, "'%s' is undefined (no macro or function of that name)", name);
}
