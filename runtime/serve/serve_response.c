/*
 * serve_response.c - OpenAI response objects and SSE chunks from a job's
 * published output (see serve_response.h).
 */
#include "serve_response.h"

#include "unicode.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- strings ----------------------------------------------------------------------------- */

/* Ill-formed UTF-8 becomes one U+FFFD per maximal ill-formed subpart (unicode.h), as
 * Python's and Rust's lossy decoders replace it: a token holding part of a character
 * reads as one "\uFFFD", as vLLM returns it. */
json_t *kt_json_text(const char *s, size_t len)
{
    json_t *j = json_stringn(s ? s : "", s ? len : 0);
    if (j)
        return j;
    char *clean = malloc(3 * len + 1);
    if (!clean)
        return json_string("");
    size_t n = kt_utf8_sanitize(s, len, clean);
    j = json_stringn(clean, n);
    free(clean);
    return j ? j : json_string("");
}

static json_t *text_or_null(const struct kt_buf *b)
{
    return b->len ? kt_json_text(b->bytes, b->len) : json_null();
}

/* ---- set-up --------------------------------------------------------------------------------- */

bool kt_response_init(struct kt_response *w, const struct kt_api_request *r, struct kt_job *job,
                      const struct kt_tokenizer *tok, const char *id, const char *model_name)
{
    *w = (struct kt_response){.kind = r->kind, .stream = r->stream, .include_usage = r->include_usage,
                              .job = job, .tok = tok, .created = (int64_t)time(NULL)};
    snprintf(w->id, sizeof w->id, "%s", id);
    snprintf(w->model, sizeof w->model, "%s", model_name);
    w->echo_sent = !job->prompt.echo;
    w->echo_logprobs = r->kind == KT_API_COMPLETION && r->echo && r->logprobs && job->prompt_lp;
    w->prompt_logprobs = r->prompt_logprobs && job->prompt_lp;
    w->prompt_top = r->prompt_top_logprobs;
    w->ch = calloc(job->n, sizeof *w->ch);
    if (!w->ch)
        return false;
    for (uint32_t c = 0; c < job->n; c++) {
        w->ch[c].stop_index = -1;
        w->ch[c].stop_token = -1;
        if (job->prompt.parse_output) {
            kt_output_init(&w->ch[c].out, &job->prompt.output);
            if (job->prompt.prefill)
                kt_output_push(&w->ch[c].out, job->prompt.prefill, strlen(job->prompt.prefill));
        }
    }
    return true;
}

void kt_response_free(struct kt_response *w)
{
    if (w->ch && w->job)
        for (uint32_t c = 0; c < w->job->n; c++) {
            kt_output_free(&w->ch[c].out);
            kt_buf_free(&w->ch[c].text);
            free(w->ch[c].lp);
        }
    free(w->ch);
    w->ch = NULL;
}

bool kt_response_take(struct kt_response *w)
{
    struct kt_job *job = w->job;
    bool any = false;
    pthread_mutex_lock(&job->mu);
    for (uint32_t c = 0; c < job->n; c++) {
        struct kt_job_choice *jc = &job->choices[c];
        struct kt_response_choice *rc = &w->ch[c];
        if (jc->text.len > rc->text_seen) {
            const char *fresh = jc->text.bytes + rc->text_seen;
            size_t n = jc->text.len - rc->text_seen;
            if (job->prompt.parse_output)
                kt_output_push(&rc->out, fresh, n);
            else
                kt_buf_append(&rc->text, fresh, n);
            rc->text_seen = jc->text.len;
            any = true;
        }
        if (jc->n_logprobs > rc->lp_seen) {
            size_t n = jc->n_logprobs - rc->lp_seen;
            struct kt_logprobs *grown = realloc(rc->lp, (rc->n_lp + n) * sizeof *grown);
            if (grown) {
                memcpy(grown + rc->n_lp, jc->logprobs + rc->lp_seen, n * sizeof *grown);
                rc->lp = grown;
                rc->n_lp += n;
            }
            rc->lp_seen = jc->n_logprobs;
            any = true;
        }
        rc->n_tokens = jc->n_tokens;
        if (jc->finish != KT_FINISH_NONE && rc->finish == KT_FINISH_NONE) {
            rc->finish = jc->finish;
            rc->stop_index = jc->stop_index;
            rc->stop_token = jc->stop_token;
            if (job->prompt.parse_output)
                kt_output_finish(&rc->out);
            any = true;
        }
    }
    if (job->done && !w->job_done) {
        w->job_done = true;
        snprintf(w->error, sizeof w->error, "%s", job->error);
        any = true;
    }
    w->n_cached = job->n_cached;
    if (job->n_scored != w->n_scored) { /* read in place: published entries never change */
        w->n_scored = job->n_scored;
        any = true;
    }
    pthread_mutex_unlock(&job->mu);
    return any;
}

/* ---- pieces shared by chunks and final objects ------------------------------------------------ */

/* A choice the server ended - its client went away, the request timed out,
 * the server shut down (vLLM's "abort"), the engine failed ("error") - says
 * so: only a choice the model ended is "stop" or "tool_calls". */
static const char *finish_reason(const struct kt_response *w, const struct kt_response_choice *rc)
{
    switch (rc->finish) {
    case KT_FINISH_LENGTH: return "length";
    case KT_FINISH_CANCELLED:
    case KT_FINISH_TIMEOUT: return "abort";
    case KT_FINISH_ERROR: return "error";
    default: break;
    }
    if (w->job->prompt.parse_output && rc->out.n_calls > 0)
        return "tool_calls";
    return "stop";
}

static json_t *stop_reason(const struct kt_response *w, const struct kt_response_choice *rc)
{
    if (rc->stop_index >= 0 && (size_t)rc->stop_index < w->job->prompt.n_stops)
        return json_string(w->job->prompt.stops[rc->stop_index]);
    if (rc->stop_token >= 0)
        return json_integer(rc->stop_token);
    return json_null();
}

static json_t *token_bytes_json(const struct kt_tokenizer *tok, int32_t id, json_t **text)
{
    size_t len = 0;
    const char *b = kt_token_bytes(tok, id, &len);
    json_t *arr = json_array();
    for (size_t i = 0; i < len; i++)
        json_array_append_new(arr, json_integer((unsigned char)b[i]));
    *text = kt_json_text(b, len);
    return arr;
}

static double finite_logprob(float lp)
{
    return lp < -9999.0f ? -9999.0 : (double)lp; /* JSON has no -inf; OpenAI clamps to -9999 */
}

/* Chat: {"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}], "refusal": null} */
static json_t *chat_logprobs(const struct kt_response *w, const struct kt_logprobs *lp, size_t n)
{
    json_t *content = json_array();
    for (size_t i = 0; i < n; i++) {
        json_t *text, *bytes = token_bytes_json(w->tok, lp[i].token, &text);
        json_t *top = json_array();
        for (uint32_t k = 0; k < lp[i].n_top; k++) {
            json_t *ttext, *tbytes = token_bytes_json(w->tok, lp[i].top[k].token, &ttext);
            json_array_append_new(top, json_pack("{s:o, s:f, s:o}", "token", ttext, "logprob",
                                                 finite_logprob(lp[i].top[k].logprob), "bytes", tbytes));
        }
        json_array_append_new(content, json_pack("{s:o, s:f, s:o, s:o}", "token", text, "logprob",
                                                 finite_logprob(lp[i].logprob), "bytes", bytes, "top_logprobs", top));
    }
    return json_pack("{s:o, s:n}", "content", content, "refusal");
}

static json_t *token_text(const struct kt_tokenizer *tok, int32_t id)
{
    size_t len = 0;
    const char *b = kt_token_bytes(tok, id, &len);
    return kt_json_text(b, len);
}

/* Code points of UTF-8 text: text_offset counts them, as vLLM counts Python str length. */
static size_t code_points(const char *s, size_t n)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        k += ((unsigned char)s[i] & 0xC0) != 0x80;
    return k;
}

/* Completions logprobs, a token at a time: {"tokens", "token_logprobs",
 * "top_logprobs": [{token: logprob}], "text_offset"}.  A token's
 * top_logprobs hold the token itself and its n_top most likely
 * alternatives (OpenAI's "up to logprobs + 1"); text_offset is where the
 * token's text starts in the tokens' texts joined, in code points. */
struct completion_lp {
    json_t *tokens, *lps, *tops, *offsets;
};

static void clp_init(struct completion_lp *b)
{
    *b = (struct completion_lp){json_array(), json_array(), json_array(), json_array()};
}

/* lp NULL: a token without logprobs (the prompt's first: nothing comes before it). */
static void clp_add(struct completion_lp *b, const struct kt_tokenizer *tok, int32_t token,
                    const struct kt_logprobs *lp, uint32_t n_top, size_t *offset)
{
    json_t *text = token_text(tok, token);
    json_array_append_new(b->offsets, json_integer((json_int_t)*offset));
    *offset += code_points(json_string_value(text), json_string_length(text));
    if (!lp) {
        json_array_append_new(b->tokens, text);
        json_array_append_new(b->lps, json_null());
        json_array_append_new(b->tops, json_null());
        return;
    }
    json_array_append_new(b->lps, json_real(finite_logprob(lp->logprob)));
    json_t *top = json_object();
    json_object_set_new(top, json_string_value(text), json_real(finite_logprob(lp->logprob)));
    for (uint32_t k = 0; k < lp->n_top && k < n_top; k++) {
        json_t *key = token_text(tok, lp->top[k].token);
        if (!json_object_get(top, json_string_value(key)))
            json_object_set_new(top, json_string_value(key), json_real(finite_logprob(lp->top[k].logprob)));
        json_decref(key);
    }
    json_array_append_new(b->tokens, text);
    json_array_append_new(b->tops, top);
}

static json_t *clp_json(struct completion_lp *b)
{
    return json_pack("{s:o, s:o, s:o, s:o}", "tokens", b->tokens, "token_logprobs", b->lps, "top_logprobs", b->tops,
                     "text_offset", b->offsets);
}

/* The echoed prompt's tokens from..to-1 (scored ones with their logprobs) into b. */
static void clp_add_prompt(struct completion_lp *b, const struct kt_response *w, size_t from, size_t to,
                           size_t *offset)
{
    const struct kt_job *job = w->job;
    for (size_t p = from; p < to; p++)
        clp_add(b, w->tok, job->prompt.ids[p], p >= 1 && p <= w->n_scored ? &job->prompt_lp[p].lp : NULL,
                job->top_logprobs, offset);
}

static void clp_add_generated(struct completion_lp *b, const struct kt_response *w, const struct kt_logprobs *lp,
                              size_t n, size_t *offset)
{
    for (size_t i = 0; i < n; i++)
        clp_add(b, w->tok, lp[i].token, &lp[i], w->job->top_logprobs, offset);
}

/* vLLM's prompt_logprobs: [null, {"<token id>": {"logprob", "rank",
 * "decoded_token"}, ...}, ...] - per position the prompt's token first,
 * then its prompt_top most likely alternatives (ranks 1, 2, ...). */
static json_t *prompt_logprobs_json(const struct kt_response *w)
{
    const struct kt_job *job = w->job;
    json_t *arr = json_array();
    json_array_append_new(arr, json_null());
    for (size_t p = 1; p < job->prompt.n_ids && p <= w->n_scored; p++) {
        const struct kt_prompt_logprob *pl = &job->prompt_lp[p];
        const uint32_t n_top = pl->lp.n_top < w->prompt_top ? pl->lp.n_top : w->prompt_top;
        uint32_t rank = pl->rank;
        for (uint32_t k = 0; k < n_top; k++)
            if (pl->lp.top[k].token == pl->lp.token)
                rank = k + 1; /* among the alternatives: its place there, as vLLM's dict keeps it */
        json_t *d = json_object();
        char key[16];
        snprintf(key, sizeof key, "%d", pl->lp.token);
        json_object_set_new(d, key, json_pack("{s:f, s:I, s:o}", "logprob", finite_logprob(pl->lp.logprob), "rank",
                                              (json_int_t)rank, "decoded_token", token_text(w->tok, pl->lp.token)));
        for (uint32_t k = 0; k < n_top; k++) {
            if (pl->lp.top[k].token == pl->lp.token)
                continue;
            snprintf(key, sizeof key, "%d", pl->lp.top[k].token);
            json_object_set_new(d, key, json_pack("{s:f, s:I, s:o}", "logprob", finite_logprob(pl->lp.top[k].logprob),
                                                  "rank", (json_int_t)(k + 1), "decoded_token",
                                                  token_text(w->tok, pl->lp.top[k].token)));
        }
        json_array_append_new(arr, d);
    }
    return arr;
}

/* Usage of n writers' jobs together. */
static json_t *usage_all(const struct kt_response *w, size_t n)
{
    json_int_t completion = 0, prompt = 0, cached = 0;
    for (size_t i = 0; i < n; i++) {
        for (uint32_t c = 0; c < w[i].job->n; c++)
            completion += w[i].ch[c].n_tokens;
        prompt += (json_int_t)w[i].job->prompt.n_ids;
        cached += (json_int_t)w[i].n_cached;
    }
    return json_pack("{s:I, s:I, s:I, s:{s:I}}", "prompt_tokens", prompt, "completion_tokens", completion,
                     "total_tokens", prompt + completion, "prompt_tokens_details", "cached_tokens", cached);
}

static json_t *tool_call_json(const struct kt_output_call *call, size_t index, bool with_index)
{
    json_t *j = json_pack("{s:s, s:s, s:{s:o, s:o}}", "id", call->id, "type", "function", "function", "name",
                          kt_json_text(call->name, strlen(call->name)), "arguments",
                          kt_json_text(kt_buf_str(&call->arguments), call->arguments.len));
    if (with_index)
        json_object_set_new(j, "index", json_integer((json_int_t)index));
    return j;
}

bool kt_response_job_error(const struct kt_response *w, struct kt_api_error *e)
{
    for (uint32_t c = 0; c < w->job->n; c++) {
        switch (w->ch[c].finish) {
        case KT_FINISH_ERROR:
            kt_api_error_set(e, 500, "server_error", NULL, NULL, "generation failed: %.600s",
                             w->error[0] ? w->error : "unknown error");
            return true;
        case KT_FINISH_TIMEOUT:
            kt_api_error_set(e, 504, "timeout_error", "timeout", NULL,
                             "the request ran past the server's time limit (--request-timeout)");
            return true;
        case KT_FINISH_CANCELLED:
            kt_api_error_set(e, 503, "server_error", "server_shutting_down",
                             NULL, "the request was cancelled: the server is shutting down");
            return true;
        default:
            break;
        }
    }
    return false;
}

/* ---- streaming -------------------------------------------------------------------------------- */

static json_t *chunk_base(const struct kt_response *w)
{
    bool chat = w->kind == KT_API_CHAT;
    json_t *j = json_pack("{s:s, s:s, s:I, s:s, s:[]}", "id", w->id, "object",
                          chat ? "chat.completion.chunk" : "text_completion", "created", (json_int_t)w->created,
                          "model", w->model, "choices");
    if (chat)
        json_object_set_new(j, "system_fingerprint", json_string("kt-serve"));
    if (w->include_usage)
        json_object_set_new(j, "usage", json_null());
    return j;
}

static void emit(struct kt_buf *out, json_t *j)
{
    char *s = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    if (!s)
        return;
    kt_buf_puts(out, "data: ");
    kt_buf_puts(out, s);
    kt_buf_puts(out, "\n\n");
    free(s);
}

/* The chat delta of choice c since the last chunk; NULL when there is none. */
static json_t *chat_delta(struct kt_response_choice *rc)
{
    struct kt_output *o = &rc->out;
    json_t *delta = json_object();
    if (o->reasoning.len > o->reasoning_sent) {
        json_object_set_new(delta, "reasoning_content",
                            kt_json_text(o->reasoning.bytes + o->reasoning_sent, o->reasoning.len - o->reasoning_sent));
        o->reasoning_sent = o->reasoning.len;
    }
    if (o->content.len > o->content_sent) {
        json_object_set_new(delta, "content",
                            kt_json_text(o->content.bytes + o->content_sent, o->content.len - o->content_sent));
        o->content_sent = o->content.len;
    }
    json_t *calls = json_array();
    for (size_t i = 0; i < o->n_calls; i++) {
        struct kt_output_call *call = &o->calls[i];
        size_t fresh = call->arguments.len - call->arguments_sent;
        if (call->header_sent && fresh == 0)
            continue;
        json_t *fn = json_object();
        json_t *j = json_pack("{s:I}", "index", (json_int_t)i);
        if (!call->header_sent) {
            json_object_set_new(j, "id", json_string(call->id));
            json_object_set_new(j, "type", json_string("function"));
            json_object_set_new(fn, "name", kt_json_text(call->name, strlen(call->name)));
            call->header_sent = true;
        }
        const char *args = call->arguments.bytes ? call->arguments.bytes + call->arguments_sent : "";
        json_object_set_new(fn, "arguments", kt_json_text(args, fresh));
        call->arguments_sent = call->arguments.len;
        json_object_set_new(j, "function", fn);
        json_array_append_new(calls, j);
    }
    if (json_array_size(calls))
        json_object_set_new(delta, "tool_calls", calls);
    else
        json_decref(calls);
    if (json_object_size(delta) == 0) {
        json_decref(delta);
        return NULL;
    }
    return delta;
}

/* The echo is sent once the prompt it carries logprobs for is scored (or the job ended). */
static bool echo_ready(const struct kt_response *w)
{
    return !w->echo_logprobs || w->job_done || (size_t)w->n_scored + 1 >= w->job->prompt.n_ids;
}

/* One writer's chunks since the last call: the opening (a chat's role, the
 * echo), then each choice's new text, logprobs and end. */
static void stream_chunks(struct kt_response *w, struct kt_buf *out)
{
    bool chat = w->kind == KT_API_CHAT;
    if (chat && !w->role_sent) {
        for (uint32_t c = 0; c < w->job->n; c++) {
            json_t *j = chunk_base(w);
            json_array_append_new(json_object_get(j, "choices"),
                                  json_pack("{s:I, s:{s:s, s:s}, s:n, s:n}", "index", (json_int_t)(w->index_base + c),
                                            "delta", "role", "assistant", "content", "", "logprobs", "finish_reason"));
            emit(out, j);
        }
        w->role_sent = true;
    }
    if (!chat && !w->echo_sent) {
        if (!echo_ready(w))
            return; /* nothing of a choice goes before its echo */
        for (uint32_t c = 0; c < w->job->n; c++) {
            json_t *j = chunk_base(w);
            const char *echo = w->job->prompt.echo;
            json_t *lp = json_null();
            if (w->echo_logprobs) {
                struct completion_lp b;
                clp_init(&b);
                clp_add_prompt(&b, w, 0, w->job->prompt.n_ids, &w->ch[c].text_offset);
                lp = clp_json(&b);
            }
            json_array_append_new(json_object_get(j, "choices"),
                                  json_pack("{s:I, s:o, s:o, s:n}", "index", (json_int_t)(w->index_base + c), "text",
                                            kt_json_text(echo, strlen(echo)), "logprobs", lp, "finish_reason"));
            emit(out, j);
        }
        w->echo_sent = true;
    }
    for (uint32_t c = 0; c < w->job->n; c++) {
        struct kt_response_choice *rc = &w->ch[c];
        if (rc->finish_sent)
            continue;
        json_t *choice = json_pack("{s:I}", "index", (json_int_t)(w->index_base + c));
        bool any = false;
        if (chat) {
            json_t *delta = chat_delta(rc);
            any = delta != NULL;
            json_object_set_new(choice, "delta", delta ? delta : json_object());
        } else {
            size_t fresh = rc->text.len - rc->text_sent;
            json_object_set_new(choice, "text", kt_json_text(rc->text.bytes ? rc->text.bytes + rc->text_sent : "",
                                                             fresh));
            rc->text_sent = rc->text.len;
            any = fresh > 0;
        }
        if (rc->n_lp) {
            json_t *lp;
            if (chat) {
                lp = chat_logprobs(w, rc->lp, rc->n_lp);
            } else { /* text_offset goes on from the tokens sent before */
                struct completion_lp b;
                clp_init(&b);
                clp_add_generated(&b, w, rc->lp, rc->n_lp, &rc->text_offset);
                lp = clp_json(&b);
            }
            json_object_set_new(choice, "logprobs", lp);
            rc->n_lp = 0;
            any = true;
        } else {
            json_object_set_new(choice, "logprobs", json_null());
        }
        bool finishing = rc->finish != KT_FINISH_NONE;
        json_object_set_new(choice, "finish_reason", finishing ? json_string(finish_reason(w, rc)) : json_null());
        if (finishing) {
            json_object_set_new(choice, "stop_reason", stop_reason(w, rc));
            rc->finish_sent = true;
        }
        if (!any && !finishing) {
            json_decref(choice);
            continue;
        }
        json_t *j = chunk_base(w);
        json_array_append_new(json_object_get(j, "choices"), choice);
        emit(out, j);
    }
}

bool kt_response_stream_all(struct kt_response *w, size_t n, struct kt_buf *out)
{
    if (w[0].done_sent)
        return true;
    bool all_done = true;
    for (size_t i = 0; i < n; i++) {
        stream_chunks(&w[i], out);
        all_done = all_done && w[i].job_done;
    }
    if (!all_done)
        return false;
    /* A job is done once every choice ended, so each sent its end above,
     * whichever order the scheduler's publishing and this take interleaved;
     * the error comes after them: a stream's last event is its outcome. */
    struct kt_api_error e;
    bool failed = false;
    for (size_t i = 0; i < n && !failed; i++)
        failed = kt_response_job_error(&w[i], &e);
    if (failed) {
        emit(out, kt_api_error_json(&e)); /* the SDKs raise it as an APIError */
    } else if (w[0].include_usage) {
        json_t *j = chunk_base(&w[0]);
        json_object_set_new(j, "usage", usage_all(w, n));
        emit(out, j);
    }
    kt_buf_puts(out, "data: [DONE]\n\n");
    w[0].done_sent = true;
    return true;
}

bool kt_response_stream(struct kt_response *w, struct kt_buf *out)
{
    return kt_response_stream_all(w, 1, out);
}

/* ---- final objects ------------------------------------------------------------------------------ */

static void final_choices(struct kt_response *w, json_t *choices)
{
    bool chat = w->kind == KT_API_CHAT;
    for (uint32_t c = 0; c < w->job->n; c++) {
        struct kt_response_choice *rc = &w->ch[c];
        json_t *choice = json_pack("{s:I}", "index", (json_int_t)(w->index_base + c));
        if (chat) {
            struct kt_output *o = &rc->out;
            json_t *msg = json_pack("{s:s, s:o}", "role", "assistant", "content", text_or_null(&o->content));
            if (o->reasoning.len)
                json_object_set_new(msg, "reasoning_content", text_or_null(&o->reasoning));
            if (o->n_calls) {
                json_t *calls = json_array();
                for (size_t i = 0; i < o->n_calls; i++)
                    json_array_append_new(calls, tool_call_json(&o->calls[i], i, false));
                json_object_set_new(msg, "tool_calls", calls);
            }
            json_object_set_new(choice, "message", msg);
            json_object_set_new(choice, "logprobs", w->job->logprobs ? chat_logprobs(w, rc->lp, rc->n_lp) : json_null());
        } else {
            struct kt_buf text = {0};
            if (w->job->prompt.echo)
                kt_buf_puts(&text, w->job->prompt.echo);
            kt_buf_append(&text, rc->text.bytes, rc->text.len);
            json_object_set_new(choice, "text", kt_json_text(kt_buf_str(&text), text.len));
            kt_buf_free(&text);
            json_t *lp = json_null();
            if (w->job->logprobs) {
                struct completion_lp b;
                size_t offset = 0;
                clp_init(&b);
                if (w->echo_logprobs)
                    clp_add_prompt(&b, w, 0, w->job->prompt.n_ids, &offset);
                clp_add_generated(&b, w, rc->lp, rc->n_lp, &offset);
                lp = clp_json(&b);
            }
            json_object_set_new(choice, "logprobs", lp);
        }
        json_object_set_new(choice, "finish_reason", json_string(finish_reason(w, rc)));
        json_object_set_new(choice, "stop_reason", stop_reason(w, rc));
        if (!chat && w->prompt_logprobs)
            json_object_set_new(choice, "prompt_logprobs", prompt_logprobs_json(w));
        json_array_append_new(choices, choice);
    }
}

json_t *kt_response_final_all(struct kt_response *w, size_t n, struct kt_api_error *e)
{
    for (size_t i = 0; i < n; i++)
        if (kt_response_job_error(&w[i], e))
            return NULL;
    bool chat = w[0].kind == KT_API_CHAT;
    json_t *choices = json_array();
    for (size_t i = 0; i < n; i++)
        final_choices(&w[i], choices);
    json_t *j = json_pack("{s:s, s:s, s:I, s:s, s:o, s:o}", "id", w[0].id, "object",
                          chat ? "chat.completion" : "text_completion", "created", (json_int_t)w[0].created, "model",
                          w[0].model, "choices", choices, "usage", usage_all(w, n));
    if (chat)
        json_object_set_new(j, "system_fingerprint", json_string("kt-serve"));
    if (chat && w[0].prompt_logprobs) /* vLLM puts a chat's on the response */
        json_object_set_new(j, "prompt_logprobs", prompt_logprobs_json(&w[0]));
    return j;
}

json_t *kt_response_final(struct kt_response *w, struct kt_api_error *e)
{
    return kt_response_final_all(w, 1, e);
}
