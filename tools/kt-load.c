/*
 * kt-load.c - a load generator for a running kt-serve (or any
 * OpenAI-compatible server): C concurrent streaming chat clients over HTTP
 * run N requests between them, each checked for a well-formed event stream
 * (tools/load/sse_check.h).  It reports the requests run, aggregate decode
 * tokens per second over the whole run, time to first token p50/p99, the
 * gaps between a stream's tokens (p50, p99, max: a stalled stream shows) and
 * per-stream decode speed.  --disconnect-every K makes every K-th client hang
 * up after its first token (what the server must survive).  Prompts are
 * generated, or taken in order from a JSONL file (--prompts), which is read
 * and checked whole before the first request is sent.
 *
 * Exit status: 0 every request well-formed, 1 a request failed, a stream
 * was malformed or the prompt file is bad (each named on stderr), 2 usage.
 */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>

#include "cli.h"
#include "preflight.h"
#include "http_client.h"
#include "sse_check.h"

struct load_options {
    const char *host, *api_key, *model, *json_out, *prompts_path;
    uint32_t port, concurrency, requests, max_tokens, prompt_words, disconnect_every;
    double timeout_s, temperature;
    uint64_t seed;
    bool seed_given, temperature_given; /* otherwise: seed = request index, temperature not sent */
};

struct result {
    bool ok, disconnected;
    double t_start, t_first, t_end;
    long long tokens;
    double *gaps;           /* [max_tokens] seconds between reads that brought tokens: about one step each */
    uint32_t n_gaps;
    char error[832];
};

struct load {
    const struct load_options *o;
    const json_t *prompts; /* [n] messages arrays from --prompts, only read by the workers; NULL: generated */
    atomic_uint next;
    struct result *results; /* [requests] */
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- prompt file --------------------------------------------------------------------------------- */

/* One line's messages: {"messages": [...]} as it is (other keys ignored), or
 * the line as one user message; NULL with why filled. */
static json_t *prompt_line_messages(const char *line, size_t len, char *why, size_t why_size)
{
    if (line[0] != '{') {
        json_t *text = json_stringn(line, len);
        if (!text) {
            snprintf(why, why_size, "the line is not valid UTF-8");
            return NULL;
        }
        return json_pack("[{s:s, s:o}]", "role", "user", "content", text);
    }
    json_error_t err;
    json_t *root = json_loadb(line, len, 0, &err), *messages = NULL;
    if (!root) {
        snprintf(why, why_size, "not valid JSON at column %d: %s", err.column, err.text);
        return NULL;
    }
    const json_t *m = json_object_get(root, "messages");
    if (!json_is_array(m) || json_array_size(m) == 0) {
        snprintf(why, why_size, "a JSON line must be an object with a non-empty \"messages\" array");
        goto done;
    }
    for (size_t k = 0; k < json_array_size(m); k++) {
        if (!json_is_string(json_object_get(json_array_get(m, k), "role"))) {
            snprintf(why, why_size, "message %zu is not an object with a \"role\" string", k);
            goto done;
        }
    }
    messages = json_incref((json_t *)m);
done:
    json_decref(root);
    return messages;
}

/* Reads a JSONL prompt file, blank lines skipped, into an array of messages
 * arrays; NULL after printing "FILE:LINE: why" (or why the file will not do). */
static json_t *prompts_read(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "kt-load: cannot open prompt file %s: %s\n", path, strerror(errno));
        return NULL;
    }
    json_t *prompts = json_array();
    char *line = NULL, why[256];
    size_t cap = 0, line_no = 0;
    ssize_t got;
    bool ok = prompts != NULL;
    while (ok && (got = getline(&line, &cap, f)) >= 0) {
        line_no++;
        size_t len = (size_t)got;
        while (len && (line[len - 1] == '\n' || line[len - 1] == '\r'))
            len--;
        size_t start = strspn(line, " \t");
        if (start >= len)
            continue;
        json_t *messages = prompt_line_messages(line + start, len - start, why, sizeof why);
        if (!messages || json_array_append_new(prompts, messages) != 0) {
            fprintf(stderr, "kt-load: %s:%zu: %s\n", path, line_no, messages ? "out of memory" : why);
            ok = false;
        }
    }
    if (ok && ferror(f)) {
        fprintf(stderr, "kt-load: cannot read prompt file %s: %s\n", path, strerror(errno));
        ok = false;
    }
    if (ok && json_array_size(prompts) == 0) {
        fprintf(stderr, "kt-load: prompt file %s holds no prompts\n", path);
        ok = false;
    }
    free(line);
    fclose(f);
    if (!ok) {
        json_decref(prompts);
        return NULL;
    }
    return prompts;
}

/* ---- one request --------------------------------------------------------------------------------- */

/* A distinct user message of --prompt-words words for request i. */
static json_t *generated_messages(const struct load_options *o, unsigned i)
{
    static const char *const words[] = {"river", "stone", "light", "north", "garden", "quiet", "signal", "copper",
                                        "window", "harbor", "winter", "engine", "paper", "forest", "orbit", "salt"};
    struct kt_buf p = {0};
    kt_buf_printf(&p, "Request %u:", i);
    unsigned long long x = 0x9E3779B97F4A7C15ull * (i + 1);
    for (uint32_t w = 0; w < o->prompt_words; w++) {
        x ^= x >> 12, x ^= x << 25, x ^= x >> 27;
        kt_buf_printf(&p, " %s", words[(x * 0x2545F4914F6CDD1Dull) >> 60]);
    }
    json_t *messages = json_pack("[{s:s, s:s}]", "role", "user", "content", kt_buf_str(&p));
    kt_buf_free(&p);
    return messages;
}

static char *request_body(const struct load *L, unsigned i)
{
    const struct load_options *o = L->o;
    /* a copy: the shared prompts stay untouched by the other workers' requests */
    json_t *messages = L->prompts ? json_deep_copy(json_array_get(L->prompts, i % json_array_size(L->prompts)))
                                  : generated_messages(o, i);
    json_t *j = json_pack("{s:o, s:I, s:b, s:{s:b}, s:b, s:I}", "messages", messages, "max_tokens",
                          (json_int_t)o->max_tokens, "stream", 1, "stream_options", "include_usage", 1, "ignore_eos",
                          1, "seed", (json_int_t)(o->seed_given ? o->seed : i));
    if (!j)
        return NULL;
    if (o->temperature_given)
        json_object_set_new(j, "temperature", json_real(o->temperature));
    if (o->model)
        json_object_set_new(j, "model", json_string(o->model));
    char *s = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    return s;
}

static void run_one(struct load *L, unsigned i)
{
    const struct load_options *o = L->o;
    struct result *r = &L->results[i];
    bool hang_up = o->disconnect_every && (i + 1) % o->disconnect_every == 0;
    char *body = request_body(L, i);
    struct kt_http_client c;
    struct kt_buf chunk = {0};
    struct kt_sse_check sse;
    kt_sse_check_init(&sse);
    r->t_start = now_s();
    r->gaps = malloc((size_t)o->max_tokens * sizeof *r->gaps);
    double last_token = 0;
    if (!body) {
        snprintf(r->error, sizeof r->error, "out of memory building the request");
        goto done;
    }
    if (!kt_http_client_request(&c, o->host, (int)o->port, "POST", "/v1/chat/completions", o->api_key, body,
                                o->timeout_s, r->error, sizeof r->error))
        goto done;
    int rc;
    while ((rc = kt_http_client_read(&c, &chunk)) > 0) {
        if (c.status && c.status != 200)
            continue; /* collect the error body */
        if (chunk.len == 0)
            continue;
        if (!strstr(c.content_type, "text/event-stream")) {
            snprintf(r->error, sizeof r->error, "content type '%s', not an event stream", c.content_type);
            break;
        }
        size_t tokens = kt_sse_check_feed(&sse, chunk.bytes, chunk.len);
        kt_buf_consume(&chunk, chunk.len);
        if (tokens) {
            const double t = now_s();
            if (r->t_first == 0)
                r->t_first = t;
            else if (r->gaps && r->n_gaps < o->max_tokens)
                r->gaps[r->n_gaps++] = t - last_token;
            last_token = t;
        }
        if (hang_up && r->t_first > 0) {
            r->disconnected = true;
            break;
        }
    }
    if (!r->disconnected && !r->error[0]) {
        if (c.status != 200)
            snprintf(r->error, sizeof r->error, "HTTP %d: %.240s", c.status, kt_buf_str(&chunk));
        else if (rc < 0)
            snprintf(r->error, sizeof r->error, "the connection failed or timed out mid-stream");
        else if (!kt_sse_check_finish(&sse, true))
            snprintf(r->error, sizeof r->error, "malformed stream: %s", sse.error);
        else if (sse.completion_tokens != (long long)o->max_tokens)
            snprintf(r->error, sizeof r->error, "usage says %lld completion tokens, asked for %u",
                     sse.completion_tokens, o->max_tokens);
        else
            r->ok = true;
    }
    kt_http_client_close(&c);
done:
    r->t_end = now_s();
    r->tokens = sse.completion_tokens > 0 ? sse.completion_tokens : 0;
    kt_sse_check_free(&sse);
    kt_buf_free(&chunk);
    free(body);
}

static void *worker(void *arg)
{
    struct load *L = arg;
    unsigned i;
    while ((i = atomic_fetch_add(&L->next, 1)) < L->o->requests)
        run_one(L, i);
    return NULL;
}

/* ---- report ---------------------------------------------------------------------------------------- */

static int by_value(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Nearest-rank percentile of n sorted values. */
static double percentile(const double *v, size_t n, double p)
{
    if (n == 0)
        return 0;
    size_t k = (size_t)ceil(p / 100.0 * (double)n);
    return v[k ? k - 1 : 0];
}

static int report(const struct load *L, double wall_s)
{
    const struct load_options *o = L->o;
    size_t n = o->requests, ok = 0, failed = 0, hung_up = 0, n_ttft = 0, n_rate = 0;
    long long tokens = 0;
    double *ttft = calloc(n ? n : 1, sizeof *ttft), *rate = calloc(n ? n : 1, sizeof *rate);
    size_t n_gaps = 0;
    for (size_t i = 0; i < n; i++)
        n_gaps += L->results[i].n_gaps;
    double *gaps = malloc((n_gaps ? n_gaps : 1) * sizeof *gaps);
    n_gaps = 0;
    for (size_t i = 0; gaps && i < n; i++)
        for (uint32_t g = 0; g < L->results[i].n_gaps; g++)
            gaps[n_gaps++] = L->results[i].gaps[g];
    if (gaps)
        qsort(gaps, n_gaps, sizeof *gaps, by_value);
    const double gap_p50 = gaps ? percentile(gaps, n_gaps, 50) : 0, gap_p99 = gaps ? percentile(gaps, n_gaps, 99) : 0;
    const double gap_max = gaps && n_gaps ? gaps[n_gaps - 1] : 0;
    for (size_t i = 0; i < n; i++) {
        const struct result *r = &L->results[i];
        if (r->disconnected) {
            hung_up++;
        } else if (!r->ok) {
            failed++;
            fprintf(stderr, "kt-load: request %zu: %s\n", i, r->error);
        } else {
            ok++;
            tokens += r->tokens;
            if (r->t_first > 0)
                ttft[n_ttft++] = r->t_first - r->t_start;
            if (r->tokens > 1 && r->t_end > r->t_first)
                rate[n_rate++] = (double)(r->tokens - 1) / (r->t_end - r->t_first);
        }
    }
    qsort(ttft, n_ttft, sizeof *ttft, by_value);
    qsort(rate, n_rate, sizeof *rate, by_value);
    double agg = wall_s > 0 ? (double)tokens / wall_s : 0;
    printf("kt-load: %zu requests at concurrency %u in %.2f s: %zu ok, %zu failed, %zu hung up on purpose\n", n,
           o->concurrency, wall_s, ok, failed, hung_up);
    printf("  completion tokens    %lld (%u per request)\n", tokens, o->max_tokens);
    printf("  aggregate decode     %.2f tok/s\n", agg);
    printf("  time to first token  p50 %.3f s, p99 %.3f s\n", percentile(ttft, n_ttft, 50), percentile(ttft, n_ttft, 99));
    printf("  per-stream decode    p50 %.2f tok/s\n", percentile(rate, n_rate, 50));
    printf("  inter-token gap      p50 %.4f s, p99 %.4f s, max %.4f s\n", gap_p50, gap_p99, gap_max);
    if (L->prompts)
        printf("  prompts              %zu from %s, in order\n", json_array_size(L->prompts), o->prompts_path);
    if (o->json_out) {
        json_t *j = json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:f, s:I, s:f, s:f, s:f, s:f}", "requests", (json_int_t)n,
                              "concurrency", (json_int_t)o->concurrency, "ok", (json_int_t)ok, "failed",
                              (json_int_t)failed, "hung_up", (json_int_t)hung_up, "max_tokens",
                              (json_int_t)o->max_tokens, "wall_s", wall_s, "completion_tokens", (json_int_t)tokens,
                              "aggregate_decode_tok_s", agg, "ttft_p50_s", percentile(ttft, n_ttft, 50),
                              "ttft_p99_s", percentile(ttft, n_ttft, 99), "per_stream_decode_p50_tok_s",
                              percentile(rate, n_rate, 50));
        json_object_set_new(j, "itl_p50_s", json_real(gap_p50));
        json_object_set_new(j, "itl_p99_s", json_real(gap_p99));
        json_object_set_new(j, "itl_max_s", json_real(gap_max));
        json_object_set_new(j, "prompts", o->prompts_path ? json_string(o->prompts_path) : json_null());
        json_object_set_new(j, "prompt_count", json_integer(L->prompts ? (json_int_t)json_array_size(L->prompts) : 0));
        if (json_dump_file(j, o->json_out, JSON_INDENT(2)) != 0)
            fprintf(stderr, "kt-load: cannot write %s\n", o->json_out);
        json_decref(j);
    }
    free(ttft), free(rate), free(gaps);
    return failed ? 1 : 0;
}

/* One GET /health before the run: a server that is not there, or still
 * loading, is said once instead of by every request.  Any other answer
 * (a server without /health too) lets the run go on. */
static bool server_answers(const struct load_options *o)
{
    struct kt_http_client c;
    struct kt_buf body = {0};
    char why[512];
    if (!kt_http_client_request(&c, o->host, (int)o->port, "GET", "/health", o->api_key, NULL,
                                o->timeout_s < 10 ? o->timeout_s : 10, why, sizeof why)) {
        fprintf(stderr, "kt-load: nothing answers at %s:%u (%s): start kt-serve there, or give --host and --port\n",
                o->host, o->port, why);
        return false;
    }
    const bool read = kt_http_client_read_all(&c, &body);
    const int status = c.status;
    kt_http_client_close(&c);
    if (read && status == 503)
        fprintf(stderr, "kt-load: the server at %s:%u is not ready (GET /health answers 503: %.200s): run kt-load "
                        "once it answers 200\n",
                o->host, o->port, kt_buf_str(&body));
    kt_buf_free(&body);
    return !(read && status == 503);
}

/* ---- options and main ----------------------------------------------------------------------------------- */

#define OPTS(o) ((struct load_options *)(o))
KT_CLI_U32_OPTION(opt_port, port, 1, 65535, "--port", NULL)
KT_CLI_U32_OPTION(opt_concurrency, concurrency, 1, 4096, "--concurrency", NULL)
KT_CLI_U32_OPTION(opt_requests, requests, 1, 1u << 24, "--requests", NULL)
KT_CLI_U32_OPTION(opt_max_tokens, max_tokens, 1, 1u << 24, "--max-tokens", NULL)
KT_CLI_U32_OPTION(opt_words, prompt_words, 0, 1u << 20, "--prompt-words", NULL)
KT_CLI_U32_OPTION(opt_disconnect, disconnect_every, 0, 1u << 24, "--disconnect-every", "0: none")
KT_CLI_STRING_OPTION(opt_host, host)
KT_CLI_STRING_OPTION(opt_key, api_key)
KT_CLI_STRING_OPTION(opt_model, model)
KT_CLI_STRING_OPTION(opt_json, json_out)
KT_CLI_STRING_OPTION(opt_prompts, prompts_path)
KT_CLI_DOUBLE_OPTION(opt_timeout, timeout_s, 0, 1e9, KT_CLI_LO_OPEN, "--timeout", "seconds")

static bool opt_seed(void *o, const char *arg, char *why, size_t ws)
{
    OPTS(o)->seed_given = kt_cli_u64_arg("--seed", arg, 0, INT64_MAX, NULL, &OPTS(o)->seed, why, ws);
    return OPTS(o)->seed_given;
}

static bool opt_temperature(void *o, const char *arg, char *why, size_t ws)
{
    OPTS(o)->temperature_given =
        kt_cli_double_arg("--temperature", arg, 0, 2, KT_CLI_CLOSED, "OpenAI's range", &OPTS(o)->temperature, why, ws);
    return OPTS(o)->temperature_given;
}

static const struct kt_cli_option options_table[] = {
    {"--host", NULL, "ADDR", 0, "server address (default 127.0.0.1)", opt_host},
    {"--port", NULL, "PORT", 0, "server port (default 8080)", opt_port},
    {"--concurrency", "-c", "N", 0, "streaming clients at once (default 4)", opt_concurrency},
    {"--requests", "-n", "N", 0, "requests in all (default 4 x concurrency)", opt_requests},
    {"--max-tokens", NULL, "N", 0, "tokens each request generates, end-of-generation ignored (default 64)",
     opt_max_tokens},
    {"--prompts", NULL, "FILE", 0, "take the prompts from a JSONL file, in order, cycling (see below)", opt_prompts},
    {"--prompt-words", NULL, "N", 0, "words in each generated (distinct) user message (default 32)", opt_words},
    {"--seed", NULL, "N", 0, "every request's seed (default: the request's index)", opt_seed},
    {"--temperature", NULL, "T", 0, "every request's temperature (default: not sent)", opt_temperature},
    {"--model", NULL, "NAME", 0, "the request's model field (default: none)", opt_model},
    {"--api-key", NULL, "KEY", 0, "bearer key", opt_key},
    {"--disconnect-every", NULL, "K", 0, "every K-th client hangs up after its first token (default 0: none)",
     opt_disconnect},
    {"--timeout", NULL, "S", 0, "seconds without a byte before a request fails (default 600)", opt_timeout},
    {"--json", NULL, "FILE", 0, "also write the results (and the prompt file) as JSON", opt_json},
};

static void usage(FILE *f);
#define SYNOPSIS "usage: kt-load [--host ADDR] [--port PORT] [-c N] [-n N] [--max-tokens N] [options]\n"
static const struct kt_cli cli = {.prog = "kt-load", .synopsis = SYNOPSIS, .options = options_table,
                                  .n_options = sizeof options_table / sizeof options_table[0], .usage = usage};

static void usage(FILE *f)
{
    fprintf(f, SYNOPSIS "\n"
               "Runs concurrent streaming chat requests against an OpenAI-compatible server and reports\n"
               "aggregate decode tok/s and time to first token p50/p99.\n\noptions:\n");
    kt_cli_print_options(f, &cli, NULL);
    fprintf(f, "\nA --prompts file holds one prompt a line: {\"messages\": [...]} (OpenAI chat messages, sent\n"
               "as they are) or plain text (sent as one user message); blank lines are skipped.  Request i\n"
               "takes prompt i mod the count.  A bad line stops kt-load (exit 1) before any request.\n");
}

int main(int argc, char **argv)
{
    struct load_options o = {.host = "127.0.0.1", .port = 8080, .concurrency = 4, .max_tokens = 64,
                             .prompt_words = 32, .timeout_s = 600};
    int rc = kt_cli_parse(&cli, argc, argv, 1, 0, &o);
    if (rc >= 0)
        return rc;
    if (!o.requests)
        o.requests = 4 * o.concurrency;
    kt_err err = {0};
    if (o.json_out && kt_tool_check_writable("--json", o.json_out, &err) != KT_OK) { /* before the run, not after */
        fprintf(stderr, "kt-load: %s\n", err.msg);
        return 1;
    }
    json_t *prompts = o.prompts_path ? prompts_read(o.prompts_path) : NULL;
    if (o.prompts_path && !prompts)
        return 1;
    if (!server_answers(&o)) {
        json_decref(prompts);
        return 1;
    }
    struct load L = {.o = &o, .prompts = prompts, .results = calloc(o.requests, sizeof *L.results)};
    pthread_t *threads = calloc(o.concurrency, sizeof *threads);
    rc = 1;
    if (!L.results || !threads) {
        fprintf(stderr, "kt-load: out of memory\n");
        goto done;
    }
    atomic_init(&L.next, 0);
    double t0 = now_s();
    uint32_t started = 0;
    for (; started < o.concurrency; started++)
        if (pthread_create(&threads[started], NULL, worker, &L) != 0)
            break;
    for (uint32_t t = 0; t < started; t++)
        pthread_join(threads[t], NULL);
    double wall = now_s() - t0;
    rc = started ? report(&L, wall) : 1;
done:
    free(threads);
    for (uint32_t i = 0; L.results && i < o.requests; i++)
        free(L.results[i].gaps);
    free(L.results);
    json_decref(prompts);
    return rc;
}
