/*
 * serve_anthropic.h - Anthropic's Messages API on kt-serve's serving core:
 * a /v1/messages (or /v1/messages/count_tokens) body read into the same
 * checked request the OpenAI parser builds (serve_request.h: a chat request
 * whose messages, tools and tool_choice are the OpenAI forms kt renders), and
 * a job's output written as Anthropic's message object or its event stream.
 *
 * The mapping, request side:
 *  - system (a string or text blocks) is the first, system turn; text blocks
 *    become content parts (chat.h concatenates them as the templates do);
 *  - a user turn's tool_result blocks become tool turns in place (is_error
 *    puts "Error: " before the result), its text blocks a user turn;
 *  - an assistant turn's text blocks are its content, tool_use blocks its
 *    tool calls (input an object), thinking blocks its reasoning_content
 *    (which Kimi-K2-Thinking renders); redacted_thinking is dropped;
 *  - tools {name, description, input_schema} are function tools; tool_choice
 *    auto / any / tool / none is auto / required / named / none;
 *    disable_parallel_tool_use keeps the first call only;
 *  - thinking enabled / disabled is chat_template_kwargs.thinking on / off
 *    (serve_prompt.h: what that changes per family); budget_tokens is checked
 *    as Anthropic checks it (>= 1024, below max_tokens) and bounds nothing
 *    beyond max_tokens; adaptive, between_tools or absent: the model's
 *    template decides; display "omitted" keeps thinking blocks' signatures,
 *    not their text;
 *  - tool_use ids kt made ("toolu_kt_" + the model's own id, escaped) are
 *    turned back into the model's ids, so Kimi sees the ids it was trained on.
 * Unknown fields are refused as Anthropic refuses them ("X: Extra inputs are
 * not permitted").  Accepted as asking nothing kt must do differently:
 * cache_control (kt's prefix cache works without being asked), metadata,
 * service_tier, inference_geo, diagnostics, user_profile_id, workspace_id,
 * speed "standard", output_config.effort (the families have no such knob),
 * eager_input_streaming; temperature, top_p and top_k of the older API are
 * honoured.  What kt cannot do is a 400 that says so: images, documents,
 * server and Anthropic-defined tools, code-execution callers, deferred tools,
 * input_examples, strict tools, output_config.format, speed "fast", MCP,
 * containers, context_management, an assistant turn to continue (prefill).
 *
 * Response side: content is [thinking] [text] [tool_use...]; stop_reason is
 * "max_tokens" at the limit, "tool_use" with a call, "stop_sequence" when one
 * of the request's stop_sequences matched, else "end_turn".  A call whose
 * arguments are not a JSON object is given as a text block of those
 * arguments (a tool_use needs an object).  Streaming: message_start, ping,
 * each block's start / deltas / stop, message_delta, message_stop; a tool
 * call's input goes as one input_json_delta once the call is complete.  A
 * job the server ended (timeout, shutdown, engine failure) ends its stream
 * with an error event and no message_stop.
 */
#ifndef KT_SERVE_ANTHROPIC_H
#define KT_SERVE_ANTHROPIC_H

#include <stdbool.h>
#include <stddef.h>

#include <jansson.h>

#include "serve_request.h"
#include "serve_response.h"
#include "serve_text.h"

/* What a Messages request asks of the answer beyond the chat request. */
struct kt_anthropic_options {
    bool omit_thinking; /* thinking.display "omitted" */
};

/* Parses and checks a Messages body into a KT_API_CHAT request (and opts,
 * which may be NULL).  count_tokens: the count_tokens body (no max_tokens,
 * no sampling).  false with e filled (400 for every problem with the request). */
bool kt_anthropic_request_parse(const char *body, size_t len, bool count_tokens, struct kt_api_request *out,
                                struct kt_anthropic_options *opts, struct kt_api_error *e);

/* {"type":"error","error":{"type":...,"message":...}}, the type from the
 * HTTP status as Anthropic names them (new reference). */
json_t *kt_anthropic_error_json(const struct kt_api_error *e);

/* The stream's state and what the response needs of the request.  One per
 * response, beside its kt_response (which takes the job's output). */
struct kt_anthropic_writer {
    char **stops;                /* [n_stops] copies of the request's stop_sequences */
    size_t n_stops;
    bool omit_thinking;
    bool started, ended;
    int open;                    /* the block being streamed (serve_anthropic.c) */
    size_t index;                /* the next block's index */
    size_t calls_sent;           /* tool calls given whole */
    bool tool_use_sent;          /* one of them as a tool_use block */
};

bool kt_anthropic_writer_init(struct kt_anthropic_writer *a, const struct kt_api_request *r,
                              const struct kt_anthropic_options *opts);
void kt_anthropic_writer_free(struct kt_anthropic_writer *a);

/* Appends the events for what w took and were not yet sent ("event: NAME\n
 * data: {...}\n\n"); true once the stream's last event was appended. */
bool kt_anthropic_stream(struct kt_anthropic_writer *a, struct kt_response *w, struct kt_buf *out);

/* Once the job is done: the message object (new reference), or NULL with e
 * set when the job failed, timed out or was cancelled. */
json_t *kt_anthropic_final(struct kt_anthropic_writer *a, struct kt_response *w, struct kt_api_error *e);

/* The keep-alive event of a quiet stream. */
#define KT_ANTHROPIC_PING "event: ping\ndata: {\"type\":\"ping\"}\n\n"

/* Tool-use ids: kt's ("toolu_kt_" + id with bytes outside [A-Za-z0-9-]
 * as "_XX" hex) and back; an id not made so is kept as it is.  malloc'd. */
char *kt_anthropic_tool_id(const char *model_id);
char *kt_anthropic_model_tool_id(const char *tool_use_id);

#endif
