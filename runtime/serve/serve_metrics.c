/*
 * serve_metrics.c - histograms and the Prometheus text writer (see
 * serve_metrics.h).  Bucket bounds are vLLM's, so quantiles computed from
 * kt and from vLLM are comparable.
 */
#include "serve_metrics.h"

#include <string.h>

static const double ttft_bounds[] = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                                     2.5,   5.0,   7.5,  10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0};
static const double itl_bounds[] = {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
                                    1.0,  2.5,   5.0,  7.5,   10.0, 20.0, 40.0, 80.0};
static const double e2e_bounds[] = {0.3,  0.5,  0.8,  1.0,  1.5,   2.0,   2.5,   5.0,   10.0,  15.0,
                                    20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};
static const double token_bounds[] = {1,    2,    5,     10,    20,    50,     100,    200,    500,
                                      1000, 2000, 5000, 10000, 20000, 50000, 100000, 200000};

#define COUNT(a) (sizeof(a) / sizeof((a)[0]))

static void histogram_init(struct kt_histogram *h, const double *bounds, size_t n)
{
    *h = (struct kt_histogram){.bounds = bounds, .n_bounds = n};
}

void kt_serve_metrics_init(struct kt_serve_metrics *m)
{
    memset(m, 0, sizeof *m);
    pthread_mutex_init(&m->mu, NULL);
    histogram_init(&m->ttft, ttft_bounds, COUNT(ttft_bounds));
    histogram_init(&m->itl, itl_bounds, COUNT(itl_bounds));
    histogram_init(&m->e2e, e2e_bounds, COUNT(e2e_bounds));
    histogram_init(&m->queue_time, e2e_bounds, COUNT(e2e_bounds));
    histogram_init(&m->prompt_len, token_bounds, COUNT(token_bounds));
    histogram_init(&m->generation_len, token_bounds, COUNT(token_bounds));
}

void kt_serve_metrics_destroy(struct kt_serve_metrics *m)
{
    pthread_mutex_destroy(&m->mu);
}

void kt_histogram_observe(struct kt_histogram *h, double value)
{
    size_t b = 0;
    while (b < h->n_bounds && value > h->bounds[b])
        b++;
    h->counts[b]++; /* b == n_bounds: the +Inf bucket */
    h->count++;
    h->sum += value;
}

/* ---- exposition ---------------------------------------------------------------------- */

static void header(struct kt_buf *o, const char *name, const char *type, const char *help)
{
    kt_buf_printf(o, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void gauge(struct kt_buf *o, const char *name, const char *labels, double v, const char *help)
{
    header(o, name, "gauge", help);
    kt_buf_printf(o, "%s{%s} %.17g\n", name, labels, v);
}

static void counter(struct kt_buf *o, const char *name, const char *labels, double v, const char *help)
{
    header(o, name, "counter", help);
    kt_buf_printf(o, "%s{%s} %.17g\n", name, labels, v);
}

static void histogram(struct kt_buf *o, const char *name, const char *labels, const struct kt_histogram *h,
                      const char *help)
{
    header(o, name, "histogram", help);
    uint64_t cumulative = 0;
    for (size_t b = 0; b < h->n_bounds; b++) {
        cumulative += h->counts[b];
        kt_buf_printf(o, "%s_bucket{%s,le=\"%g\"} %llu\n", name, labels, h->bounds[b],
                      (unsigned long long)cumulative);
    }
    kt_buf_printf(o, "%s_bucket{%s,le=\"+Inf\"} %llu\n", name, labels, (unsigned long long)h->count);
    kt_buf_printf(o, "%s_sum{%s} %.17g\n", name, labels, h->sum);
    kt_buf_printf(o, "%s_count{%s} %llu\n", name, labels, (unsigned long long)h->count);
}

/* Label values escape backslash, quote and newline. */
static void escape_label(char *dst, size_t cap, const char *src)
{
    size_t o = 0;
    for (; *src && o + 3 < cap; src++) {
        if (*src == '\\' || *src == '"') {
            dst[o++] = '\\';
            dst[o++] = *src;
        } else if (*src == '\n') {
            dst[o++] = '\\';
            dst[o++] = 'n';
        } else {
            dst[o++] = *src;
        }
    }
    dst[o] = '\0';
}

void kt_serve_metrics_render(struct kt_serve_metrics *m, const char *model_name, struct kt_buf *o)
{
    char model[160], labels[200];
    escape_label(model, sizeof model, model_name ? model_name : "");
    snprintf(labels, sizeof labels, "model_name=\"%s\"", model);

    pthread_mutex_lock(&m->mu);
    gauge(o, "vllm:num_requests_running", labels, m->requests_running, "Requests in the running batch.");
    gauge(o, "vllm:num_requests_waiting", labels, m->requests_waiting + m->requests_preempted,
          "Requests waiting to be admitted, or preempted and waiting to recompute their KV cache.");
    gauge(o, "vllm:kv_cache_usage_perc", labels, m->kv_cache_usage,
          "Fraction of KV-cache blocks in use (1 = full), cached prefixes included.");
    counter(o, "vllm:num_preemptions_total", labels, (double)m->preemptions,
            "Running requests preempted to free KV-cache blocks (vLLM's name; kt:preemptions_total is the same).");
    counter(o, "vllm:prompt_tokens_total", labels, (double)m->prompt_tokens, "Prompt tokens processed.");
    counter(o, "vllm:generation_tokens_total", labels, (double)m->generation_tokens, "Tokens generated.");
    counter(o, "vllm:prefix_cache_queries_total", labels, (double)m->prefix_cache_queries,
            "Prompt tokens looked up in the prefix cache.");
    counter(o, "vllm:prefix_cache_hits_total", labels, (double)m->prefix_cache_hits,
            "Prompt tokens found in the prefix cache.");
    static const char *const reasons[] = {"stop", "length", "abort", "error"};
    header(o, "vllm:request_success_total", "counter", "Finished requests by finish reason.");
    for (int r = 0; r < KT_METRIC_FINISH_COUNT; r++)
        kt_buf_printf(o, "vllm:request_success_total{%s,finished_reason=\"%s\"} %llu\n", labels, reasons[r],
                      (unsigned long long)m->request_success[r]);
    /* one population for every request histogram: the requests that completed (see scheduler.c) */
#define COMPLETED " Requests that completed (stop or length); aborted and failed ones are in request_success only."
    histogram(o, "vllm:time_to_first_token_seconds", labels, &m->ttft, "Time from arrival to the first token." COMPLETED);
    histogram(o, "vllm:inter_token_latency_seconds", labels, &m->itl,
              "Time between consecutive tokens of a choice, every request's.");
    histogram(o, "vllm:e2e_request_latency_seconds", labels, &m->e2e, "Time from arrival to the last token." COMPLETED);
    histogram(o, "vllm:request_queue_time_seconds", labels, &m->queue_time, "Time from arrival to admission." COMPLETED);
    histogram(o, "vllm:request_prompt_tokens", labels, &m->prompt_len, "Prompt tokens per request." COMPLETED);
    histogram(o, "vllm:request_generation_tokens", labels, &m->generation_len,
              "Generated tokens per request." COMPLETED);
#undef COMPLETED
    header(o, "kt:http_requests_total", "counter", "HTTP responses by status class.");
    for (int c = 1; c <= 5; c++)
        kt_buf_printf(o, "kt:http_requests_total{status=\"%dxx\"} %llu\n", c,
                      (unsigned long long)m->http_requests[c]);

    /* kt's own: where the step's time goes, and who ran the routed experts */
    const struct kt_engine_stats *s = &m->engine;
    counter(o, "kt:steps_total", labels, (double)s->steps, "Engine forward steps.");
    counter(o, "kt:preemptions_total", labels, (double)m->preemptions,
            "Running requests preempted to free KV-cache blocks; each recomputes its KV later.");
    gauge(o, "kt:kv_cache_blocks_used", labels, m->kv_blocks_used,
          "KV-cache blocks in use (running sequences and cached prefixes).");
    gauge(o, "kt:kv_cache_blocks_free", labels, m->kv_blocks_total - m->kv_blocks_used, "KV-cache blocks free.");
    gauge(o, "kt:kv_cache_block_tokens", labels, m->kv_block_tokens, "Positions one KV-cache block holds.");
    counter(o, "kt:step_tokens_total", labels, (double)s->tokens, "Tokens through the engine (prefill and decode).");
    header(o, "kt:step_seconds_total", "counter", "Step time by part, on the stepping device.");
    const struct {
        const char *part;
        uint64_t ns;
    } parts[] = {{"attention", s->attention_ns}, {"router", s->router_ns}, {"experts", s->experts_ns},
                 {"other", s->other_ns}};
    for (size_t i = 0; i < COUNT(parts); i++)
        kt_buf_printf(o, "kt:step_seconds_total{%s,part=\"%s\"} %.9f\n", labels, parts[i].part, 1e-9 * (double)parts[i].ns);

    header(o, "kt:device_busy_seconds_total", "counter", "Time each device spent running work.");
    uint64_t cpu_ns = s->attention_ns + s->router_ns + s->experts_ns + s->other_ns;
    kt_buf_printf(o, "kt:device_busy_seconds_total{%s,device=\"cpu\"} %.9f\n", labels, 1e-9 * (double)cpu_ns);
    char dev[64];
    escape_label(dev, sizeof dev, m->device_name);
    if (m->have_device) {
        kt_buf_printf(o, "kt:device_busy_seconds_total{%s,device=\"%s\"} %.9f\n", labels, dev,
                      1e-9 * (double)m->device.busy_ns);
        counter(o, "kt:device_wait_seconds_total", labels, 1e-9 * (double)s->device_wait_ns,
                "Time steps waited for the device after their own expert work.");
    }

    pthread_mutex_unlock(&m->mu);
}
