/*
 * responses.c - OpenAI's Responses API over HTTP: POST /v1/responses (parse
 * with serve_responses.h into a chat request, prepare, submit, answer as the
 * response object or its event stream), GET and DELETE /v1/responses/{id} and
 * GET /v1/responses/{id}/input_items (order, limit, after, as OpenAI pages them) from the server's store.
 *
 * The job runs exactly as a chat completion's (generate.c): a stream is a
 * libmicrohttpd content reader on the connection's thread that waits on the
 * job, polls the socket (a client that went away cancels its job) and sends
 * ": ping" comments on a quiet stream; a whole answer waits for the job.  A
 * completed or incomplete response is stored (unless store is false) once
 * its last event or its object was made; a failed one never is.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve_responses.h"
#include "server.h"

struct rstream {
    struct kt_sse_pump pump;
    struct kt_job *job;
    struct kt_responses_request rq;
    struct kt_response w;
    struct kt_responses_writer rw;
};

static void make_id(struct kt_server *s, char *id, size_t size, char *hex, size_t hex_size)
{
    uint64_t n = atomic_fetch_add(&s->next_id, 1), x = s->id_seed ^ (n * 0x9E3779B97F4A7C15ull);
    x = (x ^ (x >> 31)) * 0xBF58476D1CE4E5B9ull;
    snprintf(hex, hex_size, "%016llx%08llx", (unsigned long long)x, (unsigned long long)n & 0xffffffffull);
    snprintf(id, size, "resp_%s", hex);
}

static void log_done(struct kt_server *s, const char *what, const struct kt_response *w)
{
    if (s->o.quiet || !w->ch)
        return;
    enum kt_finish f = w->ch[0].finish;
    fprintf(stderr, "kt-serve: %s: prompt %zu (cached %u), completion %u, %s, %.3f s%s\n", w->id, w->job->prompt.n_ids,
            w->n_cached, w->ch[0].n_tokens, kt_finish_name(f == KT_FINISH_NONE ? KT_FINISH_CANCELLED : f),
            kt_monotonic_s() - w->job->t_arrival, what);
}

/* Keeps a finished response for previous_response_id and GET. */
static void store(struct kt_server *s, const struct kt_responses_request *rq, const json_t *object)
{
    if (rq->store && object && !kt_responses_store_put(s->responses, json_string_value(json_object_get(object, "id")),
                                                       object, rq->input, kt_responses_output(object)) &&
        s->o.responses_store)
        fprintf(stderr, "kt-serve: out of memory storing a response; it is not kept\n");
}

/* ---- streaming ------------------------------------------------------------------------------------ */

/* The pump's writer: the Responses events; a finished response is stored. */
static bool stream_write(void *ctx, bool first, struct kt_buf *out, bool *finished)
{
    struct rstream *st = ctx;
    (void)first; /* the writer's own start says it */
    if (!kt_response_take(&st->w) && st->rw.started)
        return false;
    *finished = kt_responses_stream(&st->rw, &st->w, out);
    if (*finished && !out->out_of_memory) {
        struct kt_api_error e;
        json_t *object = kt_responses_final(&st->rw, &st->w, &e);
        store(st->pump.server, &st->rq, object);
        json_decref(object);
    }
    return true;
}

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    struct rstream *st = cls;
    (void)pos;
    return kt_sse_pump_read(&st->pump, buf, max);
}

static void stream_free(void *cls)
{
    struct rstream *st = cls;
    if (!st->pump.finished)
        kt_job_cancel(st->job);
    log_done(st->pump.server, st->pump.finished ? ", streamed" : ", streamed, client gone", &st->w);
    kt_response_free(&st->w);
    kt_responses_writer_free(&st->rw);
    kt_responses_request_free(&st->rq);
    kt_job_release(st->job);
    kt_sse_pump_free(&st->pump);
    free(st);
}

/* Takes the job and the request (*rq is left empty). */
static enum MHD_Result answer_stream(struct kt_http_request *rq, struct kt_job *job, struct kt_responses_request *r,
                                     const char *id, const char *hex)
{
    struct kt_server *s = rq->server;
    struct rstream *st = calloc(1, sizeof *st);
    if (!st) {
        kt_job_cancel(job);
        kt_job_release(job);
        kt_responses_request_free(r);
        return kt_http_out_of_memory("starting a stream");
    }
    st->job = job;
    st->pump = (struct kt_sse_pump){.server = s, .conn = rq->conn, .jobs = &st->job, .n_jobs = 1,
                                    .write = stream_write, .ctx = st, .last_send = kt_monotonic_s(),
                                    .ping = ": ping\n\n"};
    st->rq = *r;
    *r = (struct kt_responses_request){0};
    bool ok = kt_response_init(&st->w, &st->rq.chat, job, s->tok, id, s->served_name);
    ok = kt_responses_writer_init(&st->rw, &st->rq, hex) && ok;
    if (!ok) {
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

static enum MHD_Result answer_whole(struct kt_http_request *rq, struct kt_job *job, struct kt_responses_request *r,
                                   const char *id, const char *hex)
{
    struct kt_server *s = rq->server;
    struct kt_response w;
    struct kt_responses_writer rw;
    bool ok = kt_response_init(&w, &r->chat, job, s->tok, id, s->served_name);
    ok = kt_responses_writer_init(&rw, r, hex) && ok;
    if (!ok) {
        kt_response_free(&w);
        kt_responses_writer_free(&rw);
        kt_job_cancel(job);
        kt_job_release(job);
        return kt_http_out_of_memory("preparing a response");
    }
    uint64_t seen = 0;
    for (;;) {
        kt_response_take(&w);
        if (w.job_done)
            break;
        if (kt_http_client_gone(rq->conn)) {
            kt_job_cancel(job);
            log_done(s, ", client gone", &w);
            kt_response_free(&w);
            kt_responses_writer_free(&rw);
            kt_job_release(job);
            return MHD_NO; /* closes the connection */
        }
        kt_job_wait(job, &seen, 250);
    }
    struct kt_api_error e;
    json_t *j = kt_responses_final(&rw, &w, &e);
    log_done(s, "", &w);
    store(s, r, j);
    enum MHD_Result sent = j ? kt_http_send_json(rq, 200, j) : kt_http_send_error(rq, &e);
    kt_response_free(&w);
    kt_responses_writer_free(&rw);
    kt_job_release(job);
    return sent;
}

static enum MHD_Result create(struct kt_http_request *rq)
{
    struct kt_server *s = rq->server;
    struct kt_responses_request r;
    struct kt_api_error e;
    if (!kt_responses_request_parse(kt_buf_str(&rq->body), rq->body.len, s->responses, &r, &e))
        return kt_http_send_error(rq, &e);
    kt_buf_free(&rq->body);
    atomic_fetch_add(&s->in_flight, 1); /* until the response is sent: on_completed in http.c */
    rq->in_flight = true;
    enum MHD_Result ok;
    if (r.chat.model && strcmp(r.chat.model, s->served_name) != 0) {
        kt_api_error_set(&e, 404, "invalid_request_error", "model_not_found", "model",
                         "The model '%.200s' does not exist (this server serves '%s')", r.chat.model, s->served_name);
        ok = kt_http_send_error(rq, &e);
        goto done;
    }
    char id[64], hex[40];
    make_id(s, id, sizeof id, hex, sizeof hex);
    struct kt_prompt prompt;
    if (!kt_prompt_prepare(&s->sm, &r.chat, hex, &prompt, &e)) {
        if (strcmp(e.param, "messages") == 0)
            snprintf(e.param, sizeof e.param, "input");
        ok = kt_http_send_error(rq, &e);
        goto done;
    }
    struct kt_job *job = kt_job_create(&prompt, &r.chat, s->o.request_timeout_s);
    kt_prompt_free(&prompt);
    if (!job) {
        kt_api_error_set(&e, 500, "server_error", NULL, NULL, "out of memory");
        ok = kt_http_send_error(rq, &e);
        goto done;
    }
    switch (kt_sched_submit(s->sched, job)) {
    case KT_SUBMIT_OK:
        ok = r.chat.stream ? answer_stream(rq, job, &r, id, hex) : answer_whole(rq, job, &r, id, hex);
        goto done;
    case KT_SUBMIT_FULL:
        kt_api_error_set(&e, 429, "rate_limit_error", "queue_full", NULL,
                         "the server's queue is full (%u requests waiting); retry later", s->o.max_waiting);
        break;
    case KT_SUBMIT_TOO_LARGE:
        kt_api_error_set(&e, 500, "server_error", NULL, NULL, "the request needs more sequences than --max-seqs");
        break;
    case KT_SUBMIT_STOPPING:
        kt_api_error_set(&e, 503, "server_error", "server_shutting_down", NULL, "the server is shutting down");
        break;
    }
    kt_job_release(job);
    ok = kt_http_send_error(rq, &e);
done:
    kt_responses_request_free(&r);
    return ok;
}

/* ---- stored responses ---------------------------------------------------------------------------- */

static enum MHD_Result not_stored(struct kt_http_request *rq, const char *id)
{
    struct kt_api_error e;
    kt_api_error_set(&e, 404, "invalid_request_error", "not_found", NULL,
                     "Response with id '%.100s' not found (kt-serve keeps the last %u stored responses in memory: "
                     "--responses-store)", id, rq->server->o.responses_store);
    return kt_http_send_error(rq, &e);
}

/* GET .../input_items: the items as OpenAI lists them (order desc by default, limit 1..100 (20), after: an
 * item id); an item given without an id is named item_<its place> within this response. */
static enum MHD_Result list_items(struct kt_http_request *rq, const char *key, json_t *input)
{
    struct kt_api_error e;
    const char *order = MHD_lookup_connection_value(rq->conn, MHD_GET_ARGUMENT_KIND, "order");
    const char *limit_s = MHD_lookup_connection_value(rq->conn, MHD_GET_ARGUMENT_KIND, "limit");
    const char *after = MHD_lookup_connection_value(rq->conn, MHD_GET_ARGUMENT_KIND, "after");
    bool desc = !order || strcmp(order, "desc") == 0;
    char *end = NULL;
    long limit = limit_s ? strtol(limit_s, &end, 10) : 20;
    if ((order && !desc && strcmp(order, "asc") != 0) || (limit_s && (*end || limit < 1 || limit > 100))) {
        json_decref(input);
        kt_api_error_invalid(&e, order && !desc && strcmp(order, "asc") != 0 ? "order" : "limit",
                             "'order' must be \"asc\" or \"desc\" and 'limit' an integer from 1 to 100");
        return kt_http_send_error(rq, &e);
    }
    size_t n = json_array_size(input);
    json_t *all = json_array();
    for (size_t k = 0; k < n; k++) {
        size_t i = desc ? n - 1 - k : k;
        json_t *copy = json_deep_copy(json_array_get(input, i));
        if (!json_is_object(copy)) {
            json_decref(copy);
            continue;
        }
        if (!json_object_get(copy, "type"))
            json_object_set_new(copy, "type", json_string("message"));
        if (!json_is_string(json_object_get(copy, "id"))) {
            char id[KT_RESPONSES_ID_MAX + 32];
            snprintf(id, sizeof id, "item_%.80s_%zu", strncmp(key, "resp_", 5) == 0 ? key + 5 : key, i);
            json_object_set_new(copy, "id", json_string(id));
        }
        json_array_append_new(all, copy);
    }
    json_decref(input);
    size_t from = 0;
    if (after) {
        while (from < json_array_size(all) && strcmp(json_string_value(json_object_get(json_array_get(all, from), "id")),
                                                     after) != 0)
            from++;
        if (from == json_array_size(all)) {
            json_decref(all);
            kt_api_error_invalid(&e, "after", "'after' names no input item of response '%.100s'", key);
            return kt_http_send_error(rq, &e);
        }
        from++;
    }
    json_t *data = json_array();
    for (size_t k = from; k < json_array_size(all) && k < from + (size_t)limit; k++)
        json_array_append(data, json_array_get(all, k));
    bool more = from + (size_t)limit < json_array_size(all);
    size_t got = json_array_size(data);
    json_t *first = got ? json_incref(json_object_get(json_array_get(data, 0), "id")) : json_null();
    json_t *last = got ? json_incref(json_object_get(json_array_get(data, got - 1), "id")) : json_null();
    json_decref(all);
    return kt_http_send_json(rq, 200, json_pack("{s:s, s:o, s:o, s:o, s:b}", "object", "list", "data", data,
                                                "first_id", first, "last_id", last, "has_more", more));
}

enum MHD_Result kt_serve_responses(struct kt_http_request *rq, const char *method, const char *id)
{
    bool get = strcmp(method, "GET") == 0 || strcmp(method, "HEAD") == 0;
    struct kt_api_error e;
    if (!id || !*id) {
        if (strcmp(method, "POST") == 0)
            return create(rq);
        kt_api_error_set(&e, 405, "invalid_request_error", "method_not_allowed", NULL, "%s /v1/responses: use POST",
                         method);
        return kt_http_send_error(rq, &e);
    }
    char key[KT_RESPONSES_ID_MAX];
    const char *slash = strchr(id, '/');
    size_t n = slash ? (size_t)(slash - id) : strlen(id);
    bool items = slash && strcmp(slash, "/input_items") == 0;
    if (n >= sizeof key || (slash && !items)) {
        kt_api_error_set(&e, 404, "invalid_request_error", "not_found", NULL, "no route %s /v1/responses/%.100s",
                         method, id);
        return kt_http_send_error(rq, &e);
    }
    memcpy(key, id, n);
    key[n] = '\0';
    if (strcmp(method, "DELETE") == 0 && !items) {
        if (!kt_responses_store_delete(rq->server->responses, key))
            return not_stored(rq, key);
        return kt_http_send_json(rq, 200, json_pack("{s:s, s:s, s:b}", "id", key, "object", "response.deleted",
                                                    "deleted", 1));
    }
    if (!get) {
        kt_api_error_set(&e, 405, "invalid_request_error", "method_not_allowed", NULL,
                         "%s /v1/responses/%.100s: use GET%s", method, id, items ? "" : " or DELETE");
        return kt_http_send_error(rq, &e);
    }
    json_t *object = NULL, *input = NULL;
    if (!kt_responses_store_get(rq->server->responses, key, items ? NULL : &object, items ? &input : NULL, NULL))
        return not_stored(rq, key);
    if (!items)
        return kt_http_send_json(rq, 200, object);
    return list_items(rq, key, input);
}
