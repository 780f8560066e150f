/*
 * serve_metrics.h - kt-serve's counters, gauges and histograms, and their
 * Prometheus text exposition (format 0.0.4).
 *
 * Names follow vLLM's V1 metrics where one exists (vllm:num_requests_running,
 * vllm:time_to_first_token_seconds, ...), so existing dashboards work; kt's
 * own carry a kt: prefix: time per part of the step, device busy time, and
 * the share of routed (token, expert) pairs each device ran.  The scheduler
 * thread writes, HTTP threads read; one mutex guards everything.
 */
#ifndef KT_SERVE_METRICS_H
#define KT_SERVE_METRICS_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "engine.h"
#include "serve_text.h"

#define KT_HISTOGRAM_MAX_BUCKETS 24

struct kt_histogram {
    const double *bounds; /* [n_bounds] ascending upper bounds (le), +Inf implied */
    size_t n_bounds;
    uint64_t counts[KT_HISTOGRAM_MAX_BUCKETS]; /* per bucket, not cumulative */
    uint64_t count;
    double sum;
};

enum kt_metric_finish { KT_METRIC_STOP, KT_METRIC_LENGTH, KT_METRIC_ABORT, KT_METRIC_ERROR, KT_METRIC_FINISH_COUNT };

struct kt_serve_metrics {
    pthread_mutex_t mu;
    /* gauges */
    uint32_t requests_running, requests_waiting;
    uint32_t requests_preempted; /* admitted, then preempted: waiting for KV blocks to recompute theirs */
    double kv_cache_usage; /* 0..1 of the KV pool's blocks in use (cached prefixes included) */
    uint32_t kv_blocks_total, kv_blocks_used, kv_block_tokens; /* the pool, in blocks of kv_block_tokens positions */
    /* counters */
    uint64_t prompt_tokens, generation_tokens;
    uint64_t prefix_cache_queries, prefix_cache_hits; /* tokens */
    uint64_t request_success[KT_METRIC_FINISH_COUNT];
    uint64_t preemptions; /* running requests whose KV was taken back for others (scheduler.h) */
    uint64_t http_requests[6]; /* by status class: 1xx .. 5xx (index 1..5) */
    /* histograms: ttft, e2e, queue_time, prompt_len and generation_len take one observation per
     * request that completed (stop or length), at its end, so their counts agree; itl one per token
     * gap of every request */
    struct kt_histogram ttft, itl, e2e, queue_time, prompt_len, generation_len;
    /* the engine's cumulative stats and its device's, after the last step */
    struct kt_engine_stats engine;
    bool have_device;
    struct kt_backend_stats device;
    char device_name[32];
    /* routed (token, expert) pairs a token makes: MoE layers x experts used; set once.
     * Without NUMA pools the engine counts no per-node pairs: the CPU's share is
     * then every routed pair the device did not run. */
    uint64_t routed_pairs_per_token;
};

void kt_serve_metrics_init(struct kt_serve_metrics *m);
void kt_serve_metrics_destroy(struct kt_serve_metrics *m);

/* Adds an observation; call with m->mu held. */
void kt_histogram_observe(struct kt_histogram *h, double value);

/* Appends the exposition text; model_name labels the vLLM metrics. */
void kt_serve_metrics_render(struct kt_serve_metrics *m, const char *model_name, struct kt_buf *out);

#endif
