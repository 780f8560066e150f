/*
 * serve_responses.h - OpenAI's Responses API (POST /v1/responses and the
 * stored responses behind GET / DELETE /v1/responses/{id}) on kt-serve's
 * serving core: a Responses body read into the same checked chat request the
 * Chat Completions parser builds (serve_request.h), a job's output written as
 * the response object or its event stream, and the bounded in-memory store
 * that previous_response_id reads.
 *
 * The mapping, request side (the body is rewritten as a Chat Completions body
 * and handed to kt_api_request_parse, so rendering, checks and sampling are
 * the chat path's own):
 *  - instructions: a first system turn (not carried over by
 *    previous_response_id, as OpenAI documents);
 *  - input: a string (one user turn) or items: messages (role user /
 *    assistant / system / developer, content a string or input_text /
 *    output_text parts), function_call items (the tool calls of the
 *    assistant turn they follow), function_call_output items (tool turns),
 *    reasoning items (the reasoning_content of the assistant turn, which
 *    the templates that show reasoning render), item_reference items (the
 *    stored output item with that id: what clients that keep ids send);
 *  - previous_response_id: that response's input and output items come
 *    first; an id the store does not hold is a 400 naming it;
 *  - tools {type:function, name, description, parameters, strict} are chat's
 *    function tools; tool_choice auto / none / required / {type:function,
 *    name}; max_output_tokens, temperature, top_p, parallel_tool_calls and
 *    stream as in chat; text.format text / json_object / json_schema is
 *    chat's response_format (refused there while kt has no constrained
 *    decoding, and then named text.format); reasoning.effort, metadata,
 *    user, store, service_tier are checked and echoed.
 * Anything else kt cannot honour (built-in tools, images and files,
 * background, conversation, prompt templates, truncation
 * "auto") is a 400 naming the field.
 *
 * Response side: output is [reasoning] [message] [function_call...] in the
 * order the model wrote them; a reasoning item carries the model's thinking
 * as one summary_text part; function_call's call_id is the model's own id
 * (Kimi's "functions.NAME:N"), so a round trip renders what the model wrote.
 * status "incomplete" with incomplete_details.reason "max_output_tokens"
 * when the token limit ended it.  Streaming: response.created,
 * response.in_progress, per item output_item.added / its parts and deltas /
 * output_item.done, then response.completed or response.incomplete; every
 * event carries sequence_number, there is no [DONE].  A job the server
 * ended (timeout, shutdown, hang-up, engine failure) ends its stream with an
 * error event and response.failed, never a completion.
 */
#ifndef KT_SERVE_RESPONSES_H
#define KT_SERVE_RESPONSES_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "serve_request.h"
#include "serve_response.h"
#include "serve_text.h"

#define KT_RESPONSES_ID_MAX 80

/* The stored responses: at most cap, least recently used dropped first.
 * Thread-safe; every call copies in or out. */
struct kt_responses_store;

struct kt_responses_store *kt_responses_store_create(uint32_t cap);
void kt_responses_store_destroy(struct kt_responses_store *st);
/* Keeps a response (object), the input items it was given (the previous
 * response's history included) and its output items; copies all three.
 * false when out of memory (nothing is kept) or cap is 0. */
bool kt_responses_store_put(struct kt_responses_store *st, const char *id, const json_t *object, const json_t *input,
                            const json_t *output);
/* Copies of what put kept (any pointer may be NULL); false when id is not held. */
bool kt_responses_store_get(struct kt_responses_store *st, const char *id, json_t **object, json_t **input,
                            json_t **output);
bool kt_responses_store_delete(struct kt_responses_store *st, const char *id);
/* A copy of the stored output item (a message, reasoning or function_call) with this id; NULL: none. */
json_t *kt_responses_store_item(struct kt_responses_store *st, const char *item_id);

/* A parsed Responses request. */
struct kt_responses_request {
    struct kt_api_request chat;  /* the checked chat request it runs as */
    json_t *input;               /* the whole input as items (previous response's first), for the store */
    json_t *echo;                /* the request's fields the response object repeats */
    bool store;
};

/* Parses and checks a Responses body.  store (NULL: none) resolves
 * previous_response_id.  false with e filled (400 for every problem with
 * the request). */
bool kt_responses_request_parse(const char *body, size_t len, struct kt_responses_store *store,
                                struct kt_responses_request *out, struct kt_api_error *e);
void kt_responses_request_free(struct kt_responses_request *r);

/* The writer: one per response, beside its kt_response (which takes the
 * job's output).  hex makes the item ids (msg_, rs_, fc_ + hex). */
struct kt_responses_writer {
    const struct kt_responses_request *rq; /* borrowed */
    char hex[48];
    uint64_t seq;                /* the next sequence_number */
    json_t *output;              /* the output items so far */
    int open;                    /* the item being streamed (serve_responses.c) */
    size_t reasoning_at, content_at; /* bytes of reasoning / content placed in items */
    size_t calls_done;           /* tool calls whose items are complete */
    bool started, ended;
    bool cut;                    /* the token limit ended the job: the last item is incomplete */
};

bool kt_responses_writer_init(struct kt_responses_writer *rw, const struct kt_responses_request *rq, const char *hex);
void kt_responses_writer_free(struct kt_responses_writer *rw);

/* Appends the events for what w took and were not yet sent ("event: NAME\n
 * data: {...}\n\n"); true once the stream's last event was appended.  Once
 * true, kt_responses_final's object is the completed one. */
bool kt_responses_stream(struct kt_responses_writer *rw, struct kt_response *w, struct kt_buf *out);

/* Once the job is done: the response object (new reference), or NULL with e
 * set when the job failed, timed out or was cancelled. */
json_t *kt_responses_final(struct kt_responses_writer *rw, struct kt_response *w, struct kt_api_error *e);

/* The output items of a final object, for the store (a borrowed reference into it). */
const json_t *kt_responses_output(const json_t *object);

#endif
