/*
 * jinja_eval.h - what the evaluator (jinja_eval.c) and the builtins
 * (jinja_builtins.c: filters, tests, methods, global functions, str() and
 * the JSON writer) share; nothing outside runtime/text/jinja*.c includes it.
 *
 * Every function returning bool reports failure through jj_fail (the first
 * failure is kept in jj_eval) and leaves its output value empty.
 */
#ifndef KT_JINJA_EVAL_H
#define KT_JINJA_EVAL_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "jinja_internal.h"

typedef enum jj_value_kind {
    JJ_V_UNDEFINED = 0, /* a missing variable, key or index: prints "", is false */
    JJ_V_JSON,          /* none, bool, int, float, string, list (and tuple), dict */
    JJ_V_NAMESPACE,     /* j: the object `set ns.x = ...` writes to */
    JJ_V_MACRO,
} jj_value_kind;

typedef struct jj_value {
    jj_value_kind kind;
    json_t *j;              /* one reference, owned (JSON, NAMESPACE) */
    const jj_node *macro;   /* MACRO */
} jj_value;

/* A list item counts this many bytes against max_output_bytes. */
#define JJ_LIST_ITEM_BYTES 16
#define JJ_MAX_ARGS 16

typedef struct jj_args {
    jj_value v[JJ_MAX_ARGS];
    const char *kw[JJ_MAX_ARGS]; /* keyword of v[i], NULL when positional */
    size_t n, n_positional;      /* positional arguments come first */
} jj_args;

typedef struct jj_buf {
    char *bytes; /* [len + 1], NUL-terminated */
    size_t len, cap;
} jj_buf;

typedef struct jj_frame jj_frame;

typedef struct jj_eval {
    const json_t *context;
    kt_jinja_limits lim;
    uint64_t steps;
    uint32_t depth;
    int line;            /* of the node being evaluated, for messages */
    jj_frame *globals;   /* the template's top-level variables */
    jj_frame *scope;     /* the innermost scope */
    kt_err *err;
    kt_status st;
} jj_eval;

bool jj_fail(jj_eval *e, int line, kt_status st, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
bool jj_nomem(jj_eval *e);
bool jj_step(jj_eval *e, int line);
bool jj_charge(jj_eval *e, uint64_t n, int line); /* n steps at once: work proportional to n items */

void jj_value_free(jj_value *v);
jj_value jj_copy(const jj_value *v);
bool jj_json(jj_eval *e, json_t *j, jj_value *out);                     /* takes j (NULL: out of memory) */
bool jj_string(jj_eval *e, const char *s, size_t len, jj_value *out);   /* checks the byte limit */
bool jj_check_list(jj_eval *e, size_t n);
bool jj_truthy(const jj_value *v);
const char *jj_type_name(const jj_value *v);
bool jj_is(const jj_value *v, json_type type);
bool jj_is_number(const jj_value *v); /* int, float or bool */
double jj_number(const jj_value *v);
long long jj_int(const jj_value *v); /* int or bool; 0 for anything else */
bool jj_json_equal(jj_eval *e, const json_t *a, const json_t *b); /* costs steps; false with e->st set when out */
bool jj_equal(jj_eval *e, const jj_value *a, const jj_value *b);
bool jj_contains(jj_eval *e, const jj_value *haystack, const jj_value *needle, int line, bool *result);
bool jj_get_item(jj_eval *e, const jj_value *obj, const jj_value *key, int line, jj_value *out);
bool jj_eval_expr(jj_eval *e, const jj_node *n, jj_value *out);
void jj_args_free(jj_args *args);

bool jj_buf_append(jj_eval *e, jj_buf *b, const char *s, size_t len); /* checks the byte limit */
bool jj_buf_puts(jj_eval *e, jj_buf *b, const char *s);

/* ---- jinja_builtins.c ---- */

/* Appends Python's str(v) ("" for undefined, "None", "True", repr of floats and containers). */
bool jj_to_str(jj_eval *e, jj_buf *b, const jj_value *v);
/* The items a for loop visits: list items, dict keys, string characters; a new array. */
bool jj_iterate(jj_eval *e, const jj_value *v, int line, json_t **items);
bool jj_apply_filter(jj_eval *e, const char *name, const jj_value *v, const jj_args *args, int line, jj_value *out);
bool jj_apply_test(jj_eval *e, const char *name, const jj_value *v, const jj_args *args, int line, bool *result);
bool jj_call_method(jj_eval *e, const jj_value *obj, const char *name, const jj_args *args, int line,
                    jj_value *out);
bool jj_call_builtin(jj_eval *e, const char *name, const jj_args *args, int line, jj_value *out);

size_t jj_utf8_count(const char *s, size_t len);              /* code points */
size_t jj_utf8_offset(const char *s, size_t len, size_t index); /* byte offset of code point index (len past the end) */
const char *jj_memmem(const char *hay, size_t n, const char *needle, size_t k); /* linear (glibc memmem) */

#endif
