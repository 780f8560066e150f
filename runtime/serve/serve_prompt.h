/*
 * serve_prompt.h - a checked OpenAI request (serve_request.h) made ready to
 * run: the prompt rendered through the model's chat template and tokenized,
 * the token budget resolved against the context, the stop strings and the
 * output parser chosen.
 *
 * What kt-serve adds around the templates, since none of the supported
 * revisions reads chat_template_kwargs.thinking (chat.h):
 *  - thinking off: Kimi-K2-Thinking gets "<think></think>" after the
 *    generation prompt (as K2.5's template writes it); DeepSeek-R1 (later
 *    revision, prompt ending "<think>\n") gets "</think>" (as llama.cpp);
 *    DeepSeek-R1 (January) gets "<think>\n\n</think>\n\n"; reasoning is then
 *    not split off.  Other formats: off only turns the <think> split off.
 *  - tools on DeepSeek-V3/R1, whose templates do not declare tools: the
 *    declaration and the call format go into the system prompt.
 *  - a template only the interpreter renders: its family (kt_chat_traits_of)
 *    picks the tool-call syntax, stop strings and thinking; a prompt ending
 *    in "<think>" opens the block; a forced call with no known syntax is a 400.
 *  - tool_choice "required" / a named function: the prompt ends with the
 *    opening of a tool call (Kimi: "functions.NAME:N" with N the number of
 *    earlier calls in the conversation), which the output parser reads as
 *    the start of the reply; the grammar (serve_grammar.h) constrains the
 *    rest to a well-formed call of a declared tool with valid arguments.
 */
#ifndef KT_SERVE_PROMPT_H
#define KT_SERVE_PROMPT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "chat.h"
#include "grammar.h"
#include "serve_output.h"
#include "serve_request.h"
#include "tokenizer.h"

struct kt_serve_model {
    const struct kt_tokenizer *tok;
    kt_chat_format format;     /* KT_CHAT_FORMAT_UNKNOWN: chat requests are refused */
    const char *chat_template; /* KT_CHAT_JINJA: the template the interpreter renders */
    uint32_t n_ctx;            /* positions one sequence may hold */
    uint32_t kv_positions;     /* positions the whole KV pool holds: a longer prompt gets 413; 0: no limit */
    uint32_t n_vocab;
    bool allow_forced_output;  /* honour kt_test_forced_output (tests only) */
};

struct kt_prompt {
    int32_t *ids;               /* [n_ids] */
    size_t n_ids;
    uint32_t max_tokens;        /* resolved: n_ids + max_tokens <= n_ctx; 0: none generated (max_tokens 0) */
    char **stops;               /* [n_stops]: the request's and (chat) the family's */
    size_t n_stops;
    bool special;               /* render CONTROL tokens in the output text */
    bool parse_output;          /* chat: split reasoning and tool calls with serve_output.h */
    struct kt_output_params output; /* id_prefix points to id_prefix below */
    char *prefill;              /* output opening the prompt ends with (parsed first); NULL: none */
    char *id_prefix;            /* DeepSeek tool-call ids */
    int32_t *forced;            /* [n_forced] tokens generated in place of sampling (tests) */
    size_t n_forced;
    char *echo;                 /* completions with echo: the prompt text to repeat; NULL: none */
    struct kt_grammar *grammar; /* what the output must follow (serve_grammar.h); NULL: anything */
};

/* The chat format of template_text, or when NULL of a GGUF file's
 * tokenizer.chat_template (kt_chat_format_resolve); UNKNOWN when there is
 * none or it cannot be rendered (why then says which).  *text (when text is
 * not NULL) gets the template, malloc'd, for kt_serve_model.chat_template;
 * without text a template only the interpreter renders is UNKNOWN. */
kt_chat_format kt_serve_chat_template(const struct kt_gguf *g, const char *template_text, char **text, char *why,
                                      size_t why_size);

/* kt_serve_chat_template(g, NULL, NULL, ...). */
kt_chat_format kt_serve_chat_format(const struct kt_gguf *g, char *why, size_t why_size);

/* The model's template family and what it does (kt_chat_traits_of). */
kt_chat_traits kt_serve_traits(const struct kt_serve_model *m);

/* Renders and tokenizes.  false with e set: 400 for what the request asks
 * wrongly (context too long: code "context_length_exceeded"), 500 otherwise. */
bool kt_prompt_prepare(const struct kt_serve_model *m, const struct kt_api_request *r, const char *request_id,
                       struct kt_prompt *out, struct kt_api_error *e);
/* The same for prompt prompt_index of a completions request's list
 * (kt_prompt_prepare: the first; chat: 0).  A token id outside the
 * vocabulary is a 400 naming it ("prompt[1][5]: token id ..."). */
bool kt_prompt_prepare_at(const struct kt_serve_model *m, const struct kt_api_request *r, size_t prompt_index,
                          const char *request_id, struct kt_prompt *out, struct kt_api_error *e);
void kt_prompt_free(struct kt_prompt *p);

/* Renders a chat request's prompt text only (for /tokenize); malloc'd. */
bool kt_prompt_render_chat(const struct kt_serve_model *m, const struct kt_api_request *r, char **text,
                           struct kt_api_error *e);

#endif
