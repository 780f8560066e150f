/*
 * generate.c - /v1/chat/completions, /v1/completions and /v1/messages
 * (Anthropic): parse, prepare, submit a job to the scheduler (one per
 * prompt of a completions request's list), then answer from the jobs'
 * output — as server-sent events (streaming) or one JSON object, in the
 * OpenAI or the Anthropic shapes.
 *
 * A streaming response is a libmicrohttpd content-reader callback running
 * on the connection's own thread (kt_sse_pump_read, which the Responses API
 * shares): it blocks on a job's condition variable (at most a quarter second
 * at a time), polls the socket, and sends ": ping" comments (Anthropic's:
 * ping events) when nothing else went out for --sse-ping-interval seconds,
 * so a long prefill neither times the client out nor hides its disconnect.
 * A client that goes away cancels its jobs.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve_anthropic.h"
#include "serve_response.h"
#include "server.h"

struct stream {
    struct kt_sse_pump pump;
    struct kt_job **jobs;         /* [n_jobs] */
    struct kt_response *w;        /* [n_jobs]: w[i] answers jobs[i] */
    size_t n_jobs;
    struct kt_anthropic_writer a; /* /v1/messages: its events (one job) */
    bool anthropic;
};

static void make_id(struct kt_server *s, const char *prefix, char *id, size_t size, char *hex, size_t hex_size)
{
    uint64_t n = atomic_fetch_add(&s->next_id, 1), x = s->id_seed ^ (n * 0x9E3779B97F4A7C15ull);
    x = (x ^ (x >> 31)) * 0xBF58476D1CE4E5B9ull;
    snprintf(hex, hex_size, "%016llx%08llx", (unsigned long long)x, (unsigned long long)n & 0xffffffffull);
    snprintf(id, size, "%s%s", prefix, hex);
}

static void log_done(struct kt_server *s, const char *what, const struct kt_response *w, size_t n_w, double t0)
{
    if (s->o.quiet || !w || !w[0].ch)
        return;
    uint32_t completion = 0, cached = 0;
    size_t prompt = 0;
    for (size_t i = 0; i < n_w; i++) {
        for (uint32_t c = 0; c < w[i].job->n; c++)
            completion += w[i].ch[c].n_tokens;
        prompt += w[i].job->prompt.n_ids;
        cached += w[i].n_cached;
    }
    char prompts[48] = "";
    if (n_w > 1)
        snprintf(prompts, sizeof prompts, " in %zu prompts", n_w);
    /* a client that left before its job ended cancelled it: the scheduler ends it at its next step */
    enum kt_finish f = w[0].ch[0].finish;
    fprintf(stderr, "kt-serve: %s: prompt %zu%s (cached %u), completion %u, %s, %.3f s%s\n", w[0].id, prompt, prompts,
            cached, completion, kt_finish_name(f == KT_FINISH_NONE ? KT_FINISH_CANCELLED : f),
            kt_monotonic_s() - t0, what);
}

/* ---- the SSE content reader ---------------------------------------------------------------------- */

/* libmicrohttpd closes a connection that sent nothing for --client-timeout
 * (its stall timer, which also catches clients that stop reading), so a
 * quiet stream pings at least every half of it, --sse-ping-interval 0 too. */
double kt_serve_ping_interval(const struct kt_server *s)
{
    double most = s->o.client_timeout_s / 2.0, p = s->o.ping_interval_s;
    return p > 0 && p < most ? p : most;
}

static bool job_done(struct kt_job *job)
{
    pthread_mutex_lock(&job->mu);
    bool done = job->done;
    pthread_mutex_unlock(&job->mu);
    return done;
}

ssize_t kt_sse_pump_read(struct kt_sse_pump *p, char *buf, size_t max)
{
    for (;;) {
        if (p->out.len > p->out_off) {
            size_t n = p->out.len - p->out_off < max ? p->out.len - p->out_off : max;
            memcpy(buf, p->out.bytes + p->out_off, n);
            p->out_off += n;
            return (ssize_t)n;
        }
        kt_buf_consume(&p->out, p->out.len);
        p->out_off = 0;
        if (p->finished)
            return MHD_CONTENT_READER_END_OF_STREAM;
        if (kt_http_client_gone(p->conn)) {
            for (size_t i = 0; i < p->n_jobs; i++)
                kt_job_cancel(p->jobs[i]);
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
        double now = kt_monotonic_s();
        const bool first = !p->started;
        p->started = true;
        if (p->write(p->ctx, first, &p->out, &p->finished)) {
            if (p->out.out_of_memory) {
                kt_http_out_of_memory("writing a stream");
                return MHD_CONTENT_READER_END_WITH_ERROR;
            }
            if (p->out.len)
                p->last_send = now;
            continue;
        }
        double ping = kt_serve_ping_interval(p->server);
        if (now - p->last_send >= ping) {
            kt_buf_puts(&p->out, p->ping);
            p->last_send = now;
            continue;
        }
        double wait_s = ping - (now - p->last_send);
        int wait_ms = wait_s > 0.25 ? 250 : wait_s < 0.001 ? 1 : (int)(wait_s * 1000);
        size_t k = p->waiting; /* wait on the first job still running: the others' news is taken on waking */
        while (k + 1 < p->n_jobs && job_done(p->jobs[k]))
            k++;
        if (k != p->waiting)
            p->waiting = k, p->seen = 0;
        kt_job_wait(p->jobs[k], &p->seen, wait_ms);
    }
}

void kt_sse_pump_free(struct kt_sse_pump *p)
{
    kt_buf_free(&p->out);
}

/* ---- streaming ------------------------------------------------------------------------------------ */

/* The pump's writer: what the jobs published, as OpenAI chunks or Anthropic events. */
static bool stream_write(void *ctx, bool first, struct kt_buf *out, bool *finished)
{
    struct stream *st = ctx;
    bool took = first;
    for (size_t i = 0; i < st->n_jobs; i++)
        took = kt_response_take(&st->w[i]) || took;
    if (!took)
        return false;
    *finished = st->anthropic ? kt_anthropic_stream(&st->a, &st->w[0], out)
                              : kt_response_stream_all(st->w, st->n_jobs, out);
    return true;
}

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    struct stream *st = cls;
    (void)pos;
    return kt_sse_pump_read(&st->pump, buf, max);
}

static void free_writers(struct kt_response *w, struct kt_job **jobs, size_t n)
{
    for (size_t i = 0; w && i < n; i++)
        kt_response_free(&w[i]);
    for (size_t i = 0; i < n; i++)
        kt_job_release(jobs[i]);
    free(w);
    free(jobs);
}

static void stream_free(void *cls)
{
    struct stream *st = cls;
    if (!st->pump.finished)
        for (size_t i = 0; i < st->n_jobs; i++)
            kt_job_cancel(st->jobs[i]);
    log_done(st->pump.server, st->pump.finished ? ", streamed" : ", streamed, client gone", st->w, st->n_jobs,
             st->jobs[0]->t_arrival);
    kt_anthropic_writer_free(&st->a);
    free_writers(st->w, st->jobs, st->n_jobs);
    kt_sse_pump_free(&st->pump);
    free(st);
}

/* One writer per job, prompt i's choices numbered from i * n; NULL without memory. */
static struct kt_response *writers(struct kt_server *s, struct kt_job **jobs, size_t n_jobs,
                                   const struct kt_api_request *r, const char *id)
{
    struct kt_response *w = calloc(n_jobs, sizeof *w);
    bool ok = w != NULL;
    for (size_t i = 0; ok && i < n_jobs; i++) {
        ok = kt_response_init(&w[i], r, jobs[i], s->tok, id, s->served_name);
        w[i].index_base = (uint32_t)i * jobs[i]->n;
        w[i].created = w[0].created;
    }
    if (!ok && w) {
        for (size_t i = 0; i < n_jobs; i++)
            kt_response_free(&w[i]);
        free(w);
        w = NULL;
    }
    return w;
}

static void cancel_all(struct kt_job **jobs, size_t n)
{
    for (size_t i = 0; i < n; i++)
        kt_job_cancel(jobs[i]);
}

/* Takes the jobs (and the array). */
static enum MHD_Result answer_stream(struct kt_http_request *rq, struct kt_job **jobs, size_t n_jobs,
                                     const struct kt_api_request *r, const char *id,
                                     const struct kt_anthropic_options *anthropic)
{
    struct kt_server *s = rq->server;
    struct stream *st = calloc(1, sizeof *st);
    if (!st) {
        cancel_all(jobs, n_jobs);
        free_writers(NULL, jobs, n_jobs);
        return kt_http_out_of_memory("starting a stream");
    }
    st->jobs = jobs, st->n_jobs = n_jobs;
    st->anthropic = anthropic != NULL;
    st->pump = (struct kt_sse_pump){.server = s, .conn = rq->conn, .jobs = jobs, .n_jobs = n_jobs,
                                    .write = stream_write, .ctx = st, .last_send = kt_monotonic_s(),
                                    .ping = anthropic ? KT_ANTHROPIC_PING : ": ping\n\n"};
    st->w = writers(s, jobs, n_jobs, r, id);
    if (!st->w || (anthropic && !kt_anthropic_writer_init(&st->a, r, anthropic))) {
        st->pump.finished = true;
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

/* Takes the jobs (and the array). */
static enum MHD_Result answer_whole(struct kt_http_request *rq, struct kt_job **jobs, size_t n_jobs,
                                   const struct kt_api_request *r, const char *id,
                                   const struct kt_anthropic_options *anthropic)
{
    struct kt_server *s = rq->server;
    struct kt_response *w = writers(s, jobs, n_jobs, r, id);
    struct kt_anthropic_writer a = {0};
    if (!w || (anthropic && !kt_anthropic_writer_init(&a, r, anthropic))) {
        cancel_all(jobs, n_jobs);
        free_writers(w, jobs, n_jobs);
        return kt_http_out_of_memory("preparing a response");
    }
    const double t0 = jobs[0]->t_arrival;
    /* the jobs run together; waiting on each in turn ends when the last does */
    for (size_t i = 0; i < n_jobs; i++) {
        uint64_t seen = 0;
        for (;;) {
            kt_response_take(&w[i]);
            if (w[i].job_done)
                break;
            if (kt_http_client_gone(rq->conn)) {
                cancel_all(jobs, n_jobs);
                log_done(s, ", client gone", w, n_jobs, t0);
                kt_anthropic_writer_free(&a);
                free_writers(w, jobs, n_jobs);
                return MHD_NO; /* closes the connection */
            }
            kt_job_wait(jobs[i], &seen, 250);
        }
    }
    struct kt_api_error e;
    json_t *j = anthropic ? kt_anthropic_final(&a, &w[0], &e) : kt_response_final_all(w, n_jobs, &e);
    log_done(s, "", w, n_jobs, t0);
    enum MHD_Result ok = j ? kt_http_send_json(rq, 200, j) : kt_http_send_error(rq, &e);
    kt_anthropic_writer_free(&a);
    free_writers(w, jobs, n_jobs);
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
    struct kt_job **jobs = NULL;
    size_t n_jobs = 0;
    const size_t n_prompts = kind == KT_API_COMPLETION && !anthropic ? r.n_prompts : 1;
    if (r.model && strcmp(r.model, s->served_name) != 0) {
        kt_api_error_set(&e, 404, "invalid_request_error", "model_not_found", "model",
                         "The model '%.200s' does not exist (this server serves '%s')", r.model, s->served_name);
        goto refuse;
    }
    if (n_prompts > s->o.max_waiting) { /* queued all at once, they could never fit */
        kt_api_error_invalid(&e, "prompt", "'prompt' lists %zu prompts; this server queues at most %u at once "
                             "(--max-waiting): send fewer per request", n_prompts, s->o.max_waiting);
        goto refuse;
    }
    char id[64], hex[40];
    make_id(s, anthropic ? "msg_" : kind == KT_API_CHAT ? "chatcmpl-" : "cmpl-", id, sizeof id, hex, sizeof hex);
    if (!(jobs = calloc(n_prompts, sizeof *jobs))) {
        kt_api_error_set(&e, 500, "server_error", NULL, NULL, "out of memory");
        goto refuse;
    }
    for (; n_jobs < n_prompts; n_jobs++) {
        struct kt_prompt prompt;
        if (!kt_prompt_prepare_at(&s->sm, &r, n_jobs, hex, &prompt, &e))
            goto refuse;
        jobs[n_jobs] = kt_job_create(&prompt, &r, s->o.request_timeout_s);
        kt_prompt_free(&prompt);
        if (!jobs[n_jobs]) {
            kt_api_error_set(&e, 500, "server_error", NULL, NULL, "out of memory");
            goto refuse;
        }
    }
    switch (kt_sched_submit_all(s->sched, jobs, n_jobs)) {
    case KT_SUBMIT_OK:
        ok = r.stream ? answer_stream(rq, jobs, n_jobs, &r, id, anthropic ? &opts : NULL)
                      : answer_whole(rq, jobs, n_jobs, &r, id, anthropic ? &opts : NULL);
        kt_api_request_free(&r);
        return ok;
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
refuse:
    free_writers(NULL, jobs, n_jobs);
    ok = kt_http_send_error(rq, &e);
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
