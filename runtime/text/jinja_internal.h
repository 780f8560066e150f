/*
 * jinja_internal.h - the syntax tree that jinja_parse.c builds and
 * jinja_eval.c walks; nothing outside runtime/text/jinja*.c includes it.
 *
 * Every node and string of a template lives in its arena and dies with it;
 * literals are jansson values the template owns (one reference each).
 */
#ifndef KT_JINJA_INTERNAL_H
#define KT_JINJA_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>

#include "jinja.h"

typedef enum jj_kind {
    /* statements */
    JJ_TEXT,     /* str[len] verbatim */
    JJ_OUTPUT,   /* {{ a }} */
    JJ_IF,       /* a: condition; body, orelse (an elif is one JJ_IF in orelse) */
    JJ_FOR,      /* names: targets; a: iterable; b: filter or NULL; body, orelse; op: body reads `loop` */
    JJ_SET,      /* names: targets (str: attribute when a is the namespace); b: value */
    JJ_SET_BLOCK,/* names[0] = the body's output */
    JJ_MACRO,    /* str: name; names: parameters, items: their defaults (NULL: none); body */
    JJ_BREAK,
    JJ_CONTINUE,
    JJ_BLOCK,    /* body only: {% generation %} and {% filter %} bodies (str: the filter or NULL) */
    /* expressions */
    JJ_LITERAL,  /* literal */
    JJ_NAME,     /* str */
    JJ_ATTR,     /* a.str */
    JJ_INDEX,    /* a[b] */
    JJ_SLICE,    /* a[b:c:d], each of b c d may be NULL */
    JJ_CALL,     /* a(items), names[i] the keyword of items[i] or NULL */
    JJ_FILTER,   /* a | str(items) */
    JJ_TEST,     /* a is [not] str(items); op '!' when negated */
    JJ_UNARY,    /* op: '-', '+', '!' (not) */
    JJ_BINARY,   /* op: see jj_op */
    JJ_COND,     /* a if b else c (c may be NULL) */
    JJ_LIST,     /* [items] */
    JJ_TUPLE,    /* (items) */
    JJ_DICT,     /* {items[0]: items[1], ...} */
} jj_kind;

/* Binary operators (single characters stand for themselves). */
enum {
    JJ_OP_FLOORDIV = 256, /* // */
    JJ_OP_POW,            /* ** */
    JJ_OP_EQ,
    JJ_OP_NE,
    JJ_OP_LE,
    JJ_OP_GE,
    JJ_OP_IN,
    JJ_OP_NOT_IN,
    JJ_OP_AND,
    JJ_OP_OR,
};

typedef struct jj_node jj_node;

typedef struct jj_list {
    jj_node **items; /* [n] */
    size_t n;
} jj_list;

struct jj_node {
    jj_kind kind;
    int op;
    int line;               /* 1-based line of the tag in the source */
    const char *str;        /* name, attribute, filter, text (arena) */
    size_t len;             /* of str */
    json_t *literal;        /* JJ_LITERAL */
    jj_node *a, *b, *c, *d;
    jj_list items;          /* arguments, elements, defaults */
    const char **names;     /* [n_names] NUL-terminated (arena); keywords are parallel to items */
    size_t n_names;
    jj_list body, orelse;
};

typedef struct jj_arena_block jj_arena_block;

struct kt_jinja_template {
    jj_arena_block *arena;
    json_t **literals;       /* [n_literals], released by kt_jinja_destroy */
    size_t n_literals, cap_literals;
    jj_list root;
};

#endif
