/*
 * jinja.h - a bounded interpreter for the Jinja subset that Hugging Face chat
 * templates are written in, so that a template kt has no native renderer for
 * (chat.h) still renders as HF transformers renders it.
 *
 * Semantics are those of Python jinja2 configured as transformers does
 * (trim_blocks, lstrip_blocks, loop controls, no autoescape; tojson is
 * json.dumps with ensure_ascii=False), where @huggingface/jinja agrees; see
 * tests/golden/chat/README.md.  Values come from a jansson context (messages,
 * tools, add_generation_prompt, bos_token, ...) and are never modified.
 *
 * A template is untrusted input: parsing and rendering stop with an error,
 * never a crash, at the nesting limit and at the limits of kt_jinja_limits
 * (steps, nesting, output and value bytes; a list item counts 16 bytes).  Nothing here prints or keeps
 * state between calls; a parsed template may be rendered from many threads.
 */
#ifndef KT_JINJA_H
#define KT_JINJA_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "status.h"

typedef struct kt_jinja_template kt_jinja_template;

/* Parsing refuses blocks and expressions nested deeper than this. */
#define KT_JINJA_MAX_NESTING 128

typedef struct kt_jinja_limits {
    uint64_t max_steps;      /* statements run plus expressions evaluated */
    uint32_t max_depth;      /* evaluation nesting: expressions, blocks, macro calls (each call ~5) */
    size_t max_output_bytes; /* the render, and any one string or list built while rendering */
} kt_jinja_limits;

/* 10^7 steps, nesting 400, 16 MiB. */
#define KT_JINJA_DEFAULT_LIMITS ((kt_jinja_limits){10000000u, 400u, (size_t)16 << 20})

/* Parses source[0..len).  KT_ERR_FORMAT naming the line for a syntax error
 * or a tag outside the subset (call blocks, extends, include, import). */
kt_status kt_jinja_parse(const char *source, size_t len, kt_jinja_template **out, kt_err *err);

void kt_jinja_destroy(kt_jinja_template *t);

/* Renders with context's keys as the template's variables (context may be
 * NULL) into a malloc'd NUL-terminated *out of *out_len bytes (out_len may
 * be NULL).  limits NULL: KT_JINJA_DEFAULT_LIMITS.  Errors name the line:
 * KT_ERR_INVALID for a type error, a failed raise_exception() or a limit
 * reached, KT_ERR_NOMEM.  On failure *out is NULL. */
kt_status kt_jinja_render(const kt_jinja_template *t, const json_t *context, const kt_jinja_limits *limits,
                          char **out, size_t *out_len, kt_err *err);

#endif
