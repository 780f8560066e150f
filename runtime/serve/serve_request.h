/*
 * serve_request.h - OpenAI request bodies in, checked parameters out: the
 * /v1/chat/completions and /v1/completions fields kt-serve understands,
 * every one range-checked, with errors in the OpenAI envelope's terms
 * (HTTP status, type, code, the parameter at fault).
 *
 * Unknown fields are ignored, as OpenAI-compatible servers do; a known field
 * with a wrong type or value is an error naming it; null means absent.  The
 * parser never touches the model: rendering and tokenizing happen in
 * serve_prompt.h.  It must never crash or leak on any bytes (fuzz_serve_request).
 */
#ifndef KT_SERVE_REQUEST_H
#define KT_SERVE_REQUEST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "chat.h"
#include "sampler.h"

/* Limits on what one request may ask for. */
#define KT_API_MAX_STOP 16       /* stop strings (OpenAI allows 4) */
#define KT_API_MAX_STOP_BYTES 256
#define KT_API_MAX_N 16          /* choices */
#define KT_API_MAX_LOGIT_BIAS 1024
#define KT_API_MAX_JSON_DEPTH 64
#define KT_API_MAX_CHOICES 1024  /* guided_choice strings */
#define KT_API_MAX_PROMPTS 1024  /* prompts in one /v1/completions request */

/* An error as the OpenAI envelope reports it:
 * {"error":{"message":..., "type":..., "param":..., "code":...}}. */
struct kt_api_error {
    int http_status;   /* 400, 401, 404, 413, 429, 500, 503, ... */
    char type[40];     /* "invalid_request_error", ... */
    char code[40];     /* "" for null */
    char param[64];    /* "" for null */
    char message[768];
};

/* Makes the NUL-terminated s (a buffer of cap bytes) well-formed UTF-8:
 * ill-formed parts become U+FFFD, a code point the end would cut is dropped.
 * Every error message and param goes through it: they quote client bytes. */
void kt_api_utf8_fix(char *s, size_t cap);

void kt_api_error_set(struct kt_api_error *e, int http_status, const char *type, const char *code,
                      const char *param, const char *fmt, ...) __attribute__((format(printf, 6, 7)));
/* 400 invalid_request_error naming param. */
void kt_api_error_invalid(struct kt_api_error *e, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* The envelope as a JSON object (new reference). */
json_t *kt_api_error_json(const struct kt_api_error *e);

enum kt_api_kind {
    KT_API_CHAT,       /* /v1/chat/completions */
    KT_API_COMPLETION, /* /v1/completions */
};

enum kt_tool_choice {
    KT_TOOL_CHOICE_AUTO,     /* "auto", or tools given without tool_choice */
    KT_TOOL_CHOICE_NONE,     /* "none", or no tools */
    KT_TOOL_CHOICE_REQUIRED, /* "required" */
    KT_TOOL_CHOICE_NAMED,    /* {"type":"function","function":{"name":...}} */
};

/* What the output must be (constrained decoding, grammar.h). */
enum kt_response_format {
    KT_RESPONSE_TEXT,        /* anything */
    KT_RESPONSE_JSON_OBJECT, /* any JSON object */
    KT_RESPONSE_JSON_SCHEMA, /* a JSON value valid against response_schema (json_schema.h's subset) */
    KT_RESPONSE_REGEX,       /* raw text matching response_schema (a string: grammar.h's regex subset) whole */
    KT_RESPONSE_CHOICE,      /* raw text equal to one of response_schema's strings (an array) */
};

/* One completions prompt: text (tokenized with BOS), or token ids. */
struct kt_api_prompt {
    char *text;                  /* NULL: ids */
    int32_t *ids;                /* [n_ids] */
    size_t n_ids;
    char where[24];              /* how errors name it: "prompt", "prompt[3]" */
};

struct kt_api_request {
    enum kt_api_kind kind;
    char *model;                 /* NULL when not given */
    bool stream, include_usage;
    uint32_t n;                  /* choices, 1.. KT_API_MAX_N */
    uint32_t max_tokens;         /* 0: not given (until the context is full), or no_generation */
    struct kt_sampler_params sampling; /* logit_bias points into logit_bias below */
    struct kt_logit_bias *logit_bias;
    bool seed_given;
    char **stop;                 /* [n_stop] non-empty strings */
    size_t n_stop;
    bool logprobs;
    uint32_t top_logprobs;       /* chat: top_logprobs; completions: logprobs (0..5) */
    bool ignore_eos;             /* vLLM extension */
    /* response_format, or vLLM's guided_json / structured_outputs: checked
     * (the schema compiles) when parsed */
    enum kt_response_format response_format;
    json_t *response_schema;     /* the schema, the regex or the choices (a reference); NULL for the others */

    /* chat */
    kt_chat_messages messages;
    json_t *tools;               /* the "tools" array (a reference), or NULL */
    enum kt_tool_choice tool_choice;
    char *tool_choice_name;      /* KT_TOOL_CHOICE_NAMED */
    bool parallel_tool_calls;
    kt_chat_thinking thinking;   /* chat_template_kwargs.thinking / enable_thinking */
    uint32_t thinking_budget;    /* reasoning tokens at most (Anthropic thinking.budget_tokens); 0: no bound */
    bool add_generation_prompt;  /* extension, default true */

    /* completions: the prompts (a string, token ids, or a list of either);
     * each runs as its own job of n choices, answered as choices
     * i * n .. i * n + n - 1 of one response */
    struct kt_api_prompt *prompts; /* [n_prompts], at least one */
    size_t n_prompts;
    bool echo;
    bool no_generation;          /* max_tokens 0 (completions): the prompt alone, scored when asked */

    /* prompt_logprobs (vLLM extension, both endpoints): every prompt token
     * scored, with this many alternatives (0 .. KT_LOGPROBS_MAX_TOP) each */
    bool prompt_logprobs;
    uint32_t prompt_top_logprobs;

    /* test hook, honoured only when the server allows it: these tokens'
     * text is generated in place of sampled tokens */
    char *forced_output;
};

/* Parses and checks a request body.  false with e filled (400 for every
 * problem with the request itself). */
bool kt_api_request_parse(enum kt_api_kind kind, const char *body, size_t len, struct kt_api_request *out,
                          struct kt_api_error *e);
void kt_api_request_free(struct kt_api_request *r);

/* Parses a body as a JSON object (depth-limited); NULL with e set. */
json_t *kt_api_parse_json(const char *body, size_t len, struct kt_api_error *e);

#endif
