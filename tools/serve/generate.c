/*
 * generate.c - /v1/chat/completions, /v1/completions and /v1/messages
 * (Anthropic): parse, prepare, submit a job to the scheduler, then answer
 * from the job's output — as server-sent events (streaming) or one JSON
 * object, in the OpenAI or the Anthropic shapes.
 *
 * A streaming response is a libmicrohttpd content-reader callback running
 * on the connection's own thread: it blocks on the job's condition variable
 * (at most a quarter second at a time), polls the socket, and sends ": ping"
 * comments (Anthropic's: ping events) when nothing else went out for
 * --sse-ping-interval seconds, so a long prefill neither times the client
 * out nor hides its disconnect.  A client that goes away cancels its job.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve_anthropic.h"
#include "serve_response.h"
#include "server.h"

struct stream {
    struct kt_server *server;
    struct MHD_Connection *conn;
    struct kt_job *job;
    struct kt_response w;
    struct kt_anthropic_writer a; /* /v1/messages: its events */
    bool anthropic;
    struct kt_buf out;       /* SSE bytes not yet handed to MHD */
    size_t out_off;
    uint64_t seen;
    double last_send;
    bool opened;             /* the opening events (a chat's role, an echo) were made */
    bool finished;
    char log[160];
};

static void make_id(struct kt_server *s, const char *prefix, char *id, size_t size, char *hex, size_t hex_size)
{
    uint64_t n = atomic_fetch_add(&s->next_id, 1), x = s->id_seed ^ (n * 0x9E3779B97F4A7C15ull);
    x = (x ^ (x >> 31)) * 0xBF58476D1CE4E5B9ull;
    snprintf(hex, hex_size, "%016llx%08llx", (unsigned long long)x, (unsigned long long)n & 0xffffffffull);
    snprintf(id, size, "%s%s", prefix, hex);
}

static void log_done(struct kt_server *s, const char *what, const struct kt_response *w, double t0)
{
    if (s->o.quiet || !w->ch)
        return;
    uint32_t completion = 0;
    for (uint32_t c = 0; c < w->job->n; c++)
        completion += w->ch[c].n_tokens;
    /* a client that left before its job ended cancelled it: the scheduler ends it at its next step */
    enum kt_finish f = w->ch[0].finish;
    fprintf(stderr, "kt-serve: %s: prompt %zu (cached %u), completion %u, %s, %.3f s%s\n", w->id, w->job->prompt.n_ids,
            w->n_cached, completion, kt_finish_name(f == KT_FINISH_NONE ? KT_FINISH_CANCELLED : f),
            kt_monotonic_s() - t0, what);
}

/* ---- streaming ------------------------------------------------------------------------------------ */

/* libmicrohttpd closes a connection that sent nothing for --client-timeout
 * (its stall timer, which also catches clients that stop reading), so a
 * quiet stream pings at least every half of it, --sse-ping-interval 0 too. */
double kt_serve_ping_interval(const struct kt_server *s)
{
    double most = s->o.client_timeout_s / 2.0, p = s->o.ping_interval_s;
    return p > 0 && p < most ? p : most;
}

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    struct stream *st = cls;
    (void)pos;
    for (;;) {
        if (st->out.len > st->out_off) {
            size_t n = st->out.len - st->out_off < max ? st->out.len - st->out_off : max;
            memcpy(buf, st->out.bytes + st->out_off, n);
            st->out_off += n;
            return (ssize_t)n;
        }
        kt_buf_consume(&st->out, st->out.len);
        st->out_off = 0;
        if (st->finished)
            return MHD_CONTENT_READER_END_OF_STREAM;
        if (kt_http_client_gone(st->conn)) {
            kt_job_cancel(st->job);
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
        double now = kt_monotonic_s();
        if (kt_response_take(&st->w) || !st->opened) {
            st->opened = true;
            st->finished = st->anthropic ? kt_anthropic_stream(&st->a, &st->w, &st->out)
                                         : kt_response_stream(&st->w, &st->out);
            if (st->out.out_of_memory) {
                kt_http_out_of_memory("writing a stream");
                return MHD_CONTENT_READER_END_WITH_ERROR;
            }
            if (st->out.len)
                st->last_send = now;
            continue;
        }
        double ping = kt_serve_ping_interval(st->server);
        if (now - st->last_send >= ping) {
            kt_buf_puts(&st->out, st->anthropic ? KT_ANTHROPIC_PING : ": ping\n\n");
            st->last_send = now;
            continue;
        }
        double wait_s = ping - (now - st->last_send);
        int wait_ms = wait_s > 0.25 ? 250 : wait_s < 0.001 ? 1 : (int)(wait_s * 1000);
        kt_job_wait(st->job, &st->seen, wait_ms);
    }
}

static void stream_free(void *cls)
{
    struct stream *st = cls;
    if (!st->finished)
        kt_job_cancel(st->job);
    log_done(st->server, st->finished ? ", streamed" : ", streamed, client gone", &st->w, st->job->t_arrival);
    kt_response_free(&st->w);
    kt_anthropic_writer_free(&st->a);
    kt_job_release(st->job);
    kt_buf_free(&st->out);
    free(st);
}

static enum MHD_Result answer_stream(struct kt_http_request *rq, struct kt_job *job, const struct kt_api_request *r,
                                     const char *id, const struct kt_anthropic_options *anthropic)
{
    struct kt_server *s = rq->server;
    struct stream *st = calloc(1, sizeof *st);
    if (!st) {
        kt_job_cancel(job);
        kt_job_release(job);
        return kt_http_out_of_memory("starting a stream");
    }
    st->server = s, st->conn = rq->conn, st->job = job, st->last_send = kt_monotonic_s();
    st->anthropic = anthropic != NULL;
    if (!kt_response_init(&st->w, r, job, s->tok, id, s->served_name) ||
        (anthropic && !kt_anthropic_writer_init(&st->a, r, anthropic))) {
        st->finished = true;
        stream_free(st);
        return kt_http_out_of_memory("starting a stream");
    }
    struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, stream_read, st,
                                                                  stream_free);
    if (!resp) {
        stream_free(st);
        return kt_http_out_of_memory("starting a stream");
    }
    MHD_add_response_header(resp, "Content-Type", "text/event-stream; charset=utf-8");
    MHD_add_response_header(resp, "Cache-Control", "no-cache");
    MHD_add_response_header(resp, "X-Accel-Buffering", "no");
    return kt_http_queue(rq, 200, resp);
}

/* ---- one JSON object ------------------------------------------------------------------------------- */

static enum MHD_Result answer_whole(struct kt_http_request *rq, struct kt_job *job, const struct kt_api_request *r,
                                   const char *id, const struct kt_anthropic_options *anthropic)
{
    struct kt_server *s = rq->server;
    struct kt_response w;
    struct kt_anthropic_writer a = {0};
    if (!kt_response_init(&w, r, job, s->tok, id, s->served_name) || (anthropic && !kt_anthropic_writer_init(&a, r, anthropic))) {
        kt_response_free(&w);
        kt_job_cancel(job);
        kt_job_release(job);
        return kt_http_out_of_memory("preparing a response");
    }
    uint64_t seen = 0;
    enum MHD_Result ok;
    for (;;) {
        kt_response_take(&w);
        if (w.job_done)
            break;
        if (kt_http_client_gone(rq->conn)) {
            kt_job_cancel(job);
            log_done(s, ", client gone", &w, job->t_arrival);
            kt_response_free(&w);
            kt_anthropic_writer_free(&a);
            kt_job_release(job);
            return MHD_NO; /* closes the connection */
        }
        kt_job_wait(job, &seen, 250);
    }
    struct kt_api_error e;
    json_t *j = anthropic ? kt_anthropic_final(&a, &w, &e) : kt_response_final(&w, &e);
    log_done(s, "", &w, job->t_arrival);
    ok = j ? kt_http_send_json(rq, 200, j) : kt_http_send_error(rq, &e);
    kt_response_free(&w);
    kt_anthropic_writer_free(&a);
    kt_job_release(job);
    return ok;
}

/* anthropic: a /v1/messages body, answered in Anthropic's shapes (serve_anthropic.h) */
static enum MHD_Result generate(struct kt_http_request *rq, enum kt_api_kind kind, bool anthropic)
{
    struct kt_server *s = rq->server;
    struct kt_api_request r;
    struct kt_api_error e;
    struct kt_anthropic_options opts;
    bool parsed = anthropic ? kt_anthropic_request_parse(kt_buf_str(&rq->body), rq->body.len, false, &r, &opts, &e)
                            : kt_api_request_parse(kind, kt_buf_str(&rq->body), rq->body.len, &r, &e);
    if (!parsed)
        return kt_http_send_error(rq, &e);
    kt_buf_free(&rq->body); /* parsed: a response that lasts minutes need not keep up to --max-body-bytes */
    atomic_fetch_add(&s->in_flight, 1); /* until the response is sent: on_completed in http.c */
    rq->in_flight = true;
    enum MHD_Result ok;
    if (r.model && strcmp(r.model, s->served_name) != 0) {
        kt_api_error_set(&e, 404, "invalid_request_error", "model_not_found", "model",
                         "The model '%.200s' does not exist (this server serves '%s')", r.model, s->served_name);
        ok = kt_http_send_error(rq, &e);
        goto done;
    }
    char id[64], hex[40];
    make_id(s, anthropic ? "msg_" : kind == KT_API_CHAT ? "chatcmpl-" : "cmpl-", id, sizeof id, hex, sizeof hex);
    struct kt_prompt prompt;
    if (!kt_prompt_prepare(&s->sm, &r, hex, &prompt, &e)) {
        ok = kt_http_send_error(rq, &e);
        goto done;
    }
    struct kt_job *job = kt_job_create(&prompt, &r, s->o.request_timeout_s);
    kt_prompt_free(&prompt);
    if (!job) {
        kt_api_error_set(&e, 500, "server_error", NULL, NULL, "out of memory");
        ok = kt_http_send_error(rq, &e);
        goto done;
    }
    switch (kt_sched_submit(s->sched, job)) {
    case KT_SUBMIT_OK:
        if (r.stream) {
            ok = answer_stream(rq, job, &r, id, anthropic ? &opts : NULL);
            kt_api_request_free(&r);
            return ok;
        }
        ok = answer_whole(rq, job, &r, id, anthropic ? &opts : NULL);
        goto done;
    case KT_SUBMIT_FULL:
        kt_api_error_set(&e, 429, "rate_limit_error", "queue_full", NULL,
                         "the server's queue is full (%u requests waiting); retry later", s->o.max_waiting);
        break;
    case KT_SUBMIT_TOO_LARGE:
        kt_api_error_invalid(&e, "n", "'n' may be at most %u on this server (--max-seqs)", s->o.max_seqs);
        break;
    case KT_SUBMIT_STOPPING:
        kt_api_error_set(&e, 503, "server_error", "server_shutting_down", NULL, "the server is shutting down");
        break;
    }
    kt_job_release(job);
    ok = kt_http_send_error(rq, &e);
done:
    kt_api_request_free(&r);
    return ok;
}

enum MHD_Result kt_serve_generate(struct kt_http_request *rq, enum kt_api_kind kind)
{
    return generate(rq, kind, false);
}

enum MHD_Result kt_serve_messages(struct kt_http_request *rq)
{
    return generate(rq, KT_API_CHAT, true);
}
