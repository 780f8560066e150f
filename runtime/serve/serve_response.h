/*
 * serve_response.h - a running job's output as OpenAI JSON: the streamed
 * chunks (server-sent events) and the final response object, for chat and
 * text completions (OpenAI's API shapes).
 *
 * A kt_response belongs to the one HTTP thread that answers the request.  It
 * copies what the scheduler published under the job's lock and does all
 * parsing and formatting outside it, so the scheduler never waits on JSON.
 */
#ifndef KT_SERVE_RESPONSE_H
#define KT_SERVE_RESPONSE_H

#include <stdbool.h>
#include <stdint.h>

#include <jansson.h>

#include "scheduler.h"
#include "serve_output.h"
#include "serve_request.h"
#include "serve_text.h"
#include "tokenizer.h"

struct kt_response_choice {
    struct kt_output out;       /* chat: reasoning / content / tool calls */
    struct kt_buf text;         /* completions: all text so far */
    size_t text_seen;           /* bytes of the job's text taken */
    size_t text_sent;           /* completions: bytes streamed */
    struct kt_logprobs *lp;     /* taken, not yet streamed (streaming) or all (final) */
    size_t n_lp, lp_seen;
    enum kt_finish finish;      /* as published */
    int stop_index;
    int32_t stop_token;
    uint32_t n_tokens;
    bool finish_sent;
    size_t text_offset;         /* completions logprobs: the next token's text_offset (code points so far) */
};

struct kt_response {
    enum kt_api_kind kind;
    bool stream, include_usage;
    char id[64];
    int64_t created;            /* unix seconds */
    char model[128];
    struct kt_job *job;         /* borrowed: the caller holds a reference */
    const struct kt_tokenizer *tok;
    struct kt_response_choice *ch; /* [job->n] */
    bool role_sent, echo_sent, done_sent;
    bool job_done;
    char error[1100];           /* the job's error, once done */
    uint32_t n_cached;
    /* Prompt scores (scheduler.h's score_prompt): the echoed prompt's
     * tokens carry logprobs (completions, echo with logprobs), and
     * prompt_logprobs as vLLM gives it (a choice's field on completions,
     * the response's on chat), prompt_top alternatives each. */
    bool echo_logprobs, prompt_logprobs;
    uint32_t prompt_top;
    uint32_t n_scored;          /* the job's n_scored as taken */
    /* A completions request's prompt i answers choices index_base .. + n - 1
     * (index_base = i * n), as OpenAI and vLLM number them. */
    uint32_t index_base;
};

/* kind, stream options and model name come from the request. */
bool kt_response_init(struct kt_response *w, const struct kt_api_request *r, struct kt_job *job,
                      const struct kt_tokenizer *tok, const char *id, const char *model_name);
void kt_response_free(struct kt_response *w);

/* Takes what the job published since the last call; true when that was
 * anything new.  Call before kt_response_stream / kt_response_final. */
bool kt_response_take(struct kt_response *w);

/* Appends the SSE events for what was taken and not yet sent ("data: {...}\n\n"
 * lines; a choice's last chunk carries its finish_reason: "stop", "length" or
 * "tool_calls" when the model ended it, "abort" when its client went away, it
 * timed out or the server shut down, "error" when the engine failed); once
 * the job is done, an error event if it ended so, else the usage chunk; and
 * "data: [DONE]\n\n" last.  Returns true once [DONE] was appended. */
bool kt_response_stream(struct kt_response *w, struct kt_buf *out);
/* The same for the n writers of a completions request's n prompts (w[i]
 * answers prompt i; take each first): their chunks as they come, one usage
 * chunk and one [DONE] once every job is done. */
bool kt_response_stream_all(struct kt_response *w, size_t n, struct kt_buf *out);

/* Once the job is done: the whole response object (new reference), or NULL
 * with e set when the job failed (500), timed out (504) or was cancelled (503). */
json_t *kt_response_final(struct kt_response *w, struct kt_api_error *e);
/* The same for n writers (every job done): one object, their choices in
 * index order, usage summed; the first failure's error if any failed. */
json_t *kt_response_final_all(struct kt_response *w, size_t n, struct kt_api_error *e);

/* The error a failed, timed-out or cancelled job reports; false if it succeeded. */
bool kt_response_job_error(const struct kt_response *w, struct kt_api_error *e);

/* A JSON string for text that should be UTF-8 (invalid bytes become U+FFFD). */
json_t *kt_json_text(const char *s, size_t len);

#endif
