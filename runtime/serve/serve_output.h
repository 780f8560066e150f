/*
 * serve_output.h - turns a chat model's generated text into the OpenAI
 * message parts: reasoning_content, content and tool_calls, as the text
 * streams in (the families' published tool-call and reasoning formats; tests/golden/chat).
 *
 * Kimi-K2:  [<think> reasoning </think>] content
 *           [<|tool_calls_section_begin|> (<|tool_call_begin|> ID
 *            <|tool_call_argument_begin|> JSON <|tool_call_end|>)* <|tool_calls_section_end|>]
 *           ID is kept verbatim (functions.NAME:IDX); NAME is ID without the
 *           "functions." prefix and the ":IDX" suffix.
 * DeepSeek: [<think> reasoning </think>] content
 *           [<｜tool▁calls▁begin｜> (<｜tool▁call▁begin｜> TYPE <｜tool▁sep｜> NAME "\n```json\n"
 *            JSON "\n```" <｜tool▁call▁end｜>)+ <｜tool▁calls▁end｜>], with the
 *           drifted begin markers llama.cpp accepts; ids are made up
 *           (id_prefix + index), since DeepSeek's templates never show them.
 *
 * Reasoning ends at </think> or where a tool section begins.  Markers may
 * arrive split across pushes: text that could be the start of one is held
 * back until it can be decided, so every byte released is final.  The parser
 * never fails on any text; text it cannot place stays content.
 */
#ifndef KT_SERVE_OUTPUT_H
#define KT_SERVE_OUTPUT_H

#include <stdbool.h>
#include <stddef.h>

#include "chat.h"
#include "serve_text.h"

struct kt_output_params {
    kt_chat_family family;  /* picks the markers: DeepSeek's, else Kimi's (kt_chat_traits_of) */
    bool reasoning;         /* split <think>...</think> off as reasoning */
    bool reasoning_open;    /* the prompt opened the block: output starts inside it */
    bool tools;             /* parse tool calls (else markers stay content) */
    bool single_tool_call;  /* parallel_tool_calls = false: calls after the first are dropped */
    const char *id_prefix;  /* DeepSeek call ids: id_prefix + index; NULL: "call_" */
};

struct kt_output_call {
    char *id, *name;
    struct kt_buf arguments; /* the model's JSON text, verbatim */
    size_t arguments_sent;   /* streaming cursor */
    bool header_sent;        /* streaming cursor: id and name were sent */
};

struct kt_output {
    struct kt_output_params params;
    int state;
    struct kt_buf pending;   /* pushed text not yet placed */
    struct kt_buf head;      /* a tool call's id or name being read */
    struct kt_buf content, reasoning;
    struct kt_output_call *calls;
    size_t n_calls, cap_calls;
    size_t content_sent, reasoning_sent; /* streaming cursors, advanced by the writer */
    bool out_of_memory;
};

void kt_output_init(struct kt_output *o, const struct kt_output_params *params);
/* Adds generated text (whole UTF-8 characters). */
void kt_output_push(struct kt_output *o, const char *text, size_t len);
/* End of the generation: places what was held back. */
void kt_output_finish(struct kt_output *o);
void kt_output_free(struct kt_output *o);

#endif
