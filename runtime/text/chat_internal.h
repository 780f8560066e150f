/*
 * chat_internal.h - what chat.c shares with the per-family renderers
 * (chat_kimi.c, chat_deepseek.c); nothing outside runtime/text/chat*.c includes it.
 *
 * A renderer appends to a kt_chat_text and never fails on its own: input is
 * validated before it runs, and an allocation failure is recorded in the
 * buffer and reported once by kt_chat_render.
 */
#ifndef KT_CHAT_INTERNAL_H
#define KT_CHAT_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>

#include "chat.h"

/* Growable text; after a failed allocation every append is a no-op and
 * out_of_memory stays set. */
typedef struct kt_chat_text {
    char *bytes; /* [len + 1], NUL-terminated while !out_of_memory */
    size_t len;
    size_t cap;
    bool out_of_memory;
} kt_chat_text;

void kt_chat_text_append(kt_chat_text *text, const char *bytes, size_t len);
void kt_chat_text_puts(kt_chat_text *text, const char *str); /* NULL appends nothing */

/* Appends json.dumps(value, ensure_ascii=False) as Python writes it: ", " and
 * ": " separators, keys in document order, floats as repr() does. */
void kt_chat_text_json(kt_chat_text *text, const json_t *value);

/* Python's repr(float) into buf (64 bytes hold any): the shortest digits that
 * read back as x, fixed notation when the decimal point falls within 16
 * places, exponent notation ("1e-05", "1.5e+16") otherwise; NaN and the
 * infinities as json.dumps writes them (json) or as repr does. */
void kt_chat_python_float(double x, char *buf, size_t size, bool json);

/* What a revision does differently from its family's first one. */
typedef struct kt_chat_revision {
    kt_chat_format format;
    const char *name;
    bool is_kimi;
    bool tools_header;      /* Kimi: "\n  # Tools\n  " between the header and the tools JSON */
    bool newline_after_system_header; /* Kimi: system and tool headers end in "\n" */
    bool open_last_turn;    /* Kimi: no <|im_end|> after the last turn without a generation prompt */
    const char *generation_prompt; /* DeepSeek */
} kt_chat_revision;

const kt_chat_revision *kt_chat_revision_of(kt_chat_format format);

/* tools: a non-empty JSON array, or NULL when the request declares none. */
void kt_chat_render_kimi_instruct(const kt_chat_revision *rev, const kt_chat_message *messages,
                                  size_t n, const json_t *tools, bool add_generation_prompt,
                                  kt_chat_text *out);
void kt_chat_render_kimi_thinking(const kt_chat_message *messages, size_t n, const json_t *tools,
                                  bool add_generation_prompt, kt_chat_text *out);
void kt_chat_render_deepseek_r1(const kt_chat_revision *rev, const kt_chat_message *messages,
                                size_t n, const char *bos_token, bool add_generation_prompt,
                                kt_chat_text *out);
void kt_chat_render_deepseek_v3_0324(const kt_chat_message *messages, size_t n,
                                     const char *bos_token, bool add_generation_prompt,
                                     kt_chat_text *out);

#endif
