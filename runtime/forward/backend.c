/*
 * backend.c - the sim and cuda backends (see backend.h).
 *
 * sim: a ring of queued operations consumed in order by one thread.  A copy
 * is a memcpy followed by a busy wait until latency + bytes / bandwidth has
 * passed since it began (so its cost is paid on the device's timeline, not
 * the host's); a launch calls the function.  Memory is aligned host memory
 * counted against the budget.  It must never run two operations of one
 * queue at once, nor let sync return before the last submitted operation
 * finished.
 *
 * cuda: one non-blocking stream on the chosen device; copies are
 * cudaMemcpyAsync on it, launches host functions in stream order, FFN units
 * kt_cuda_ffn_units; memory is cudaMalloc'd within the budget (at most the
 * device's free memory at creation).  The first failure (the kt_err a
 * kt_cuda_* call filled) is kept and reported by kt_backend_take_failure.
 * Each queued operation (copy, kernel sequence, host function) is bracketed
 * by a pair of CUDA events; at each sync their elapsed times add up to
 * busy_ns (and transfer_ns for copies), the device's own clock, like the
 * sim's queue time.
 */
#include "backend.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kt_cuda.h"

#define QUEUE_SLOTS 256
#define CUDA_TIMED_OPS 512 /* ops between syncs that keep their own events (a sync drains them) */
#define LINK_PROBE_BYTES (256u << 10) /* copies at least this large measure the link's rate */

enum op_kind { OP_COPY_IN, OP_COPY_OUT, OP_COPY_DEVICE, OP_LAUNCH };

struct op {
    enum op_kind kind;
    void *dst;
    const void *src;
    size_t bytes;
    kt_backend_fn fn;
    void *ctx;
};

/* A graph: sim, the recorded operations; cuda, the executable graph. */
struct kt_backend_graph {
    struct op *ops;
    size_t n, cap;
    kt_err failure;                 /* a call refused, or out of memory, while recording (KT_OK: none) */
    void *exec;                     /* cuda */
};

struct kt_backend {
    struct kt_backend_params p;
    char name[64];
    uint64_t used_bytes;
    void *stream;                   /* cuda */
    kt_err failure;                 /* cuda: the first failure of queued work (KT_OK: none) */
    void *ev_start[CUDA_TIMED_OPS], *ev_end[CUDA_TIMED_OPS]; /* cuda: events around queued ops (NULL: untimed) */
    size_t ev_link_bytes[CUDA_TIMED_OPS]; /* ... the bytes that op copied over the link (0: none) */
    double link_rate;               /* cuda: bytes/ns of the fastest large copy timed so far (0: none yet) */
    uint32_t n_timed;               /* ops recorded since the last sync */
    struct kt_backend_graph *recording; /* between graph_begin and graph_end (sim: the ops; cuda: capturing) */

    pthread_mutex_t mu;
    pthread_cond_t changed;
    struct op ring[QUEUE_SLOTS];
    uint64_t head, tail;            /* ops [head, tail) queued; head is running while running */
    bool running, stop;
    pthread_t thread;
    struct kt_backend_stats stats;  /* under mu */
};

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* What a copy of `bytes` costs on the simulated link. */
static uint64_t transfer_cost_ns(const struct kt_backend *b, size_t bytes)
{
    double ns = b->p.latency_us * 1e3;
    if (b->p.transfer_gbps > 0)
        ns += (double)bytes / b->p.transfer_gbps;
    return (uint64_t)ns;
}

static void *queue_main(void *arg)
{
    struct kt_backend *b = arg;
    pthread_mutex_lock(&b->mu);
    for (;;) {
        while (b->head == b->tail && !b->stop)
            pthread_cond_wait(&b->changed, &b->mu);
        if (b->head == b->tail)
            break;
        const struct op o = b->ring[b->head % QUEUE_SLOTS];
        b->running = true;
        pthread_mutex_unlock(&b->mu);

        const uint64_t t0 = now_ns();
        if (o.kind == OP_LAUNCH) {
            o.fn(o.ctx);
        } else if (o.kind == OP_COPY_DEVICE) {
            memcpy(o.dst, o.src, o.bytes); /* within the device: no link crossed */
        } else {
            memcpy(o.dst, o.src, o.bytes);
            const uint64_t until = t0 + transfer_cost_ns(b, o.bytes);
            while (now_ns() < until)
                ; /* the link is busy: the device waits, the host does not */
        }
        const uint64_t spent = now_ns() - t0;

        pthread_mutex_lock(&b->mu);
        b->stats.busy_ns += spent;
        b->stats.ops++;
        if (o.kind == OP_COPY_IN || o.kind == OP_COPY_OUT) {
            b->stats.transfer_ns += spent;
            *(o.kind == OP_COPY_IN ? &b->stats.bytes_in : &b->stats.bytes_out) += o.bytes;
        }
        b->head++;
        b->running = false;
        pthread_cond_broadcast(&b->changed);
    }
    pthread_mutex_unlock(&b->mu);
    return NULL;
}

/* The cuda kind: the device, its budget (never above its free memory) and a stream. */
static kt_status create_cuda(const struct kt_backend_params *p, struct kt_backend **out, kt_err *err)
{
    const char *name = p->name ? p->name : "cuda";
    kt_err why = {0};
    const int n = kt_cuda_device_count(&why);
    if (n <= 0)
        return kt_err_set(err, KT_ERR_UNSUPPORTED, "device '%s': no CUDA device (%s)", name, why.msg);
    if (p->device < 0 || p->device >= n)
        return kt_err_set(err, KT_ERR_INVALID, "device '%s': CUDA device %d does not exist (%d found)", name,
                          p->device, n);
    size_t free_bytes = 0, total_bytes = 0;
    kt_status st;
    if ((st = kt_cuda_set_device(p->device, err)) != KT_OK ||
        (st = kt_cuda_mem_info(&free_bytes, &total_bytes, err)) != KT_OK) {
        kt_err_prefix(err, "device '%s'", name);
        return st;
    }
    struct kt_backend *b = calloc(1, sizeof *b);
    if (!b)
        return kt_err_set(err, KT_ERR_NOMEM, "backend: out of memory");
    b->p = *p;
    snprintf(b->name, sizeof b->name, "%s", name);
    b->p.name = b->name;
    if (!b->p.memory_bytes || b->p.memory_bytes > free_bytes)
        b->p.memory_bytes = free_bytes;
    pthread_mutex_init(&b->mu, NULL);
    pthread_cond_init(&b->changed, NULL);
    if ((st = kt_cuda_stream_create(&b->stream, err)) != KT_OK) {
        kt_backend_destroy(b);
        kt_err_prefix(err, "device '%s'", name);
        return st;
    }
    for (int i = 0; i < CUDA_TIMED_OPS; i++) /* without every event the ops go untimed */
        if (kt_cuda_event_create(&b->ev_start[i], NULL) != KT_OK ||
            kt_cuda_event_create(&b->ev_end[i], NULL) != KT_OK) {
            for (int j = 0; j <= i; j++) {
                kt_cuda_event_destroy(b->ev_start[j]);
                kt_cuda_event_destroy(b->ev_end[j]);
                b->ev_start[j] = b->ev_end[j] = NULL;
            }
            break;
        }
    *out = b;
    return KT_OK;
}

/* Keeps the first failure of the cuda queue's work: st and the err a
 * kt_cuda_* call filled (nothing when st is KT_OK).  While recording, the
 * recording's: it is discarded and the caller runs the work directly. */
static void cuda_keep_failure(struct kt_backend *b, kt_status st, const kt_err *err)
{
    kt_err *kept = b->recording ? &b->recording->failure : &b->failure;
    if (st == KT_OK || kept->status != KT_OK)
        return;
    *kept = *err;
    kept->status = st;
}

/* cuda: makes the backend's device current on the calling thread (CUDA
 * keeps the current device per thread, and kt-serve steps the engine on
 * another thread than the one that created it). */
static void cuda_current(struct kt_backend *b)
{
    kt_err err;
    cuda_keep_failure(b, kt_cuda_set_device(b->p.device, &err), &err);
}

/* cuda: sums the timed ops' event pairs into the stats; the stream is idle. */
static void cuda_collect(struct kt_backend *b)
{
    uint64_t busy = 0, transfer = 0;
    double rate = 0;
    for (uint32_t i = 0; i < b->n_timed; i++) {
        uint64_t ns = 0;
        if (kt_cuda_event_elapsed_ns(b->ev_start[i], b->ev_end[i], &ns, NULL) == KT_OK) {
            busy += ns;
            transfer += b->ev_link_bytes[i] ? ns : 0;
            if (b->ev_link_bytes[i] >= LINK_PROBE_BYTES && ns > 0 && (double)b->ev_link_bytes[i] / (double)ns > rate)
                rate = (double)b->ev_link_bytes[i] / (double)ns;
        }
    }
    b->n_timed = 0;
    pthread_mutex_lock(&b->mu);
    b->stats.busy_ns += busy;
    b->stats.transfer_ns += transfer;
    b->link_rate = rate > b->link_rate ? rate : b->link_rate;
    pthread_mutex_unlock(&b->mu);
}

/* cuda: the event before the op about to be queued (every pair in use: a
 * sync collects them first). */
static void cuda_op_begin(struct kt_backend *b)
{
    if (!b->ev_start[0] || b->recording) /* captured work is timed when its graph runs */
        return;
    if (b->n_timed == CUDA_TIMED_OPS)
        kt_backend_sync(b);
    kt_err err;
    cuda_keep_failure(b, kt_cuda_event_record(b->ev_start[b->n_timed], b->stream, &err), &err);
}

/* cuda: the event after it; link_bytes: what the op copied over the link (0: not a copy over it). */
static void cuda_op_end(struct kt_backend *b, size_t link_bytes)
{
    if (!b->ev_start[0] || b->recording)
        return;
    kt_err err;
    cuda_keep_failure(b, kt_cuda_event_record(b->ev_end[b->n_timed], b->stream, &err), &err);
    b->ev_link_bytes[b->n_timed++] = link_bytes;
}

kt_status kt_backend_available(enum kt_backend_kind kind, kt_err *err)
{
    if (kind == KT_BACKEND_SIM)
        return KT_OK;
    kt_err why = {0};
    if (kt_cuda_device_count(&why) <= 0)
        return kt_err_set(err, KT_ERR_UNSUPPORTED, "no CUDA device (%s)", why.msg);
    return KT_OK;
}

kt_status kt_backend_create(const struct kt_backend_params *p, struct kt_backend **out, kt_err *err)
{
    *out = NULL;
    if (p->kind == KT_BACKEND_CUDA)
        return create_cuda(p, out, err);
    if (p->kind != KT_BACKEND_SIM)
        return kt_err_set(err, KT_ERR_INVALID, "unknown backend kind %d", (int)p->kind);
    if (p->transfer_gbps < 0 || p->latency_us < 0)
        return kt_err_set(err, KT_ERR_INVALID, "device '%s': negative transfer cost", p->name ? p->name : "sim");
    struct kt_backend *b = calloc(1, sizeof *b);
    if (!b)
        return kt_err_set(err, KT_ERR_NOMEM, "backend: out of memory");
    b->p = *p;
    snprintf(b->name, sizeof b->name, "%s", p->name ? p->name : "sim");
    b->p.name = b->name;
    pthread_mutex_init(&b->mu, NULL);
    pthread_cond_init(&b->changed, NULL);
    if (pthread_create(&b->thread, NULL, queue_main, b) != 0) {
        pthread_mutex_destroy(&b->mu);
        pthread_cond_destroy(&b->changed);
        free(b);
        return kt_err_set(err, KT_ERR_NOMEM, "device '%s': cannot start its queue thread", p->name);
    }
    *out = b;
    return KT_OK;
}

void kt_backend_destroy(struct kt_backend *b)
{
    if (!b)
        return;
    if (b->p.kind == KT_BACKEND_CUDA) {
        cuda_current(b);
        if (b->stream) {
            kt_cuda_stream_synchronize(b->stream, NULL);
            kt_cuda_stream_destroy(b->stream);
        }
        for (int i = 0; i < CUDA_TIMED_OPS; i++) {
            kt_cuda_event_destroy(b->ev_start[i]);
            kt_cuda_event_destroy(b->ev_end[i]);
        }
        pthread_mutex_destroy(&b->mu);
        pthread_cond_destroy(&b->changed);
        free(b);
        return;
    }
    pthread_mutex_lock(&b->mu);
    b->stop = true;
    pthread_cond_broadcast(&b->changed);
    pthread_mutex_unlock(&b->mu);
    pthread_join(b->thread, NULL); /* the thread drains the queue before it stops */
    pthread_mutex_destroy(&b->mu);
    pthread_cond_destroy(&b->changed);
    free(b);
}

const char *kt_backend_name(const struct kt_backend *b)
{
    return b->name;
}

enum kt_backend_kind kt_backend_kind(const struct kt_backend *b)
{
    return b->p.kind;
}

kt_status kt_backend_alloc(struct kt_backend *b, size_t bytes, void **ptr, kt_err *err)
{
    *ptr = NULL;
    const uint64_t budget = b->p.memory_bytes;
    if (budget && b->used_bytes + bytes > budget)
        return kt_err_set(err, KT_ERR_NOMEM,
                          "device '%s': %.1f MiB more does not fit (%.1f MiB of its %.1f MiB budget in use)", b->name,
                          (double)bytes / (1u << 20), (double)b->used_bytes / (1u << 20), (double)budget / (1u << 20));
    void *p = NULL;
    if (b->p.kind == KT_BACKEND_CUDA) {
        cuda_current(b);
        const kt_status st = kt_cuda_alloc(&p, bytes, err);
        if (st != KT_OK) {
            kt_err_prefix(err, "device '%s'", b->name);
            return st;
        }
    } else {
        const size_t rounded = (bytes + 63) / 64 * 64;
        p = aligned_alloc(64, rounded ? rounded : 64);
    }
    if (!p)
        return kt_err_set(err, KT_ERR_NOMEM, "device '%s': cannot allocate %zu bytes", b->name, bytes);
    b->used_bytes += bytes;
    *ptr = p;
    return KT_OK;
}

void kt_backend_free(struct kt_backend *b, void *ptr, size_t bytes)
{
    if (!ptr)
        return;
    if (b->p.kind == KT_BACKEND_CUDA) {
        cuda_current(b);
        kt_cuda_free(ptr);
    } else {
        free(ptr);
    }
    b->used_bytes -= bytes <= b->used_bytes ? bytes : b->used_bytes;
}

uint64_t kt_backend_used_bytes(const struct kt_backend *b)
{
    return b->used_bytes;
}

uint64_t kt_backend_budget_bytes(const struct kt_backend *b)
{
    return b->p.memory_bytes;
}

double kt_backend_link_bytes_per_ns(struct kt_backend *b)
{
    if (b->p.kind == KT_BACKEND_SIM)
        return b->p.transfer_gbps; /* GB/s = bytes/ns */
    pthread_mutex_lock(&b->mu);
    const double r = b->link_rate;
    pthread_mutex_unlock(&b->mu);
    return r;
}

static void submit(struct kt_backend *b, struct op o)
{
    struct kt_backend_graph *g = b->recording;
    if (g) { /* recorded, not run */
        if (g->n == g->cap) {
            const size_t cap = g->cap ? 2 * g->cap : 16;
            struct op *ops = realloc(g->ops, cap * sizeof *ops);
            if (!ops) {
                if (g->failure.status == KT_OK)
                    kt_err_set(&g->failure, KT_ERR_NOMEM, "out of memory recording a graph");
                return;
            }
            g->ops = ops;
            g->cap = cap;
        }
        g->ops[g->n++] = o;
        return;
    }
    pthread_mutex_lock(&b->mu);
    while (b->tail - b->head >= QUEUE_SLOTS) /* full: wait for the device */
        pthread_cond_wait(&b->changed, &b->mu);
    b->ring[b->tail % QUEUE_SLOTS] = o;
    b->tail++;
    pthread_cond_broadcast(&b->changed);
    pthread_mutex_unlock(&b->mu);
}

/* A copy on the cuda stream (enum kt_cuda_copy_kind), counted. */
static void cuda_copy(struct kt_backend *b, void *dst, const void *src, size_t bytes, int kind)
{
    kt_err err;
    cuda_current(b);
    cuda_op_begin(b);
    cuda_keep_failure(b, kt_cuda_copy_async(dst, src, bytes, kind, b->stream, &err), &err);
    cuda_op_end(b, kind != KT_CUDA_ON_DEVICE ? bytes : 0);
    pthread_mutex_lock(&b->mu);
    if (kind == KT_CUDA_TO_DEVICE)
        b->stats.bytes_in += bytes;
    else if (kind == KT_CUDA_TO_HOST)
        b->stats.bytes_out += bytes;
    b->stats.ops++;
    pthread_mutex_unlock(&b->mu);
}

void kt_backend_copy_in(struct kt_backend *b, void *dst_device, const void *src_host, size_t bytes)
{
    if (b->p.kind == KT_BACKEND_CUDA)
        cuda_copy(b, dst_device, src_host, bytes, KT_CUDA_TO_DEVICE);
    else
        submit(b, (struct op){.kind = OP_COPY_IN, .dst = dst_device, .src = src_host, .bytes = bytes});
}

void kt_backend_copy_out(struct kt_backend *b, void *dst_host, const void *src_device, size_t bytes)
{
    if (b->p.kind == KT_BACKEND_CUDA)
        cuda_copy(b, dst_host, src_device, bytes, KT_CUDA_TO_HOST);
    else
        submit(b, (struct op){.kind = OP_COPY_OUT, .dst = dst_host, .src = src_device, .bytes = bytes});
}

void kt_backend_launch(struct kt_backend *b, kt_backend_fn fn, void *ctx)
{
    if (b->p.kind == KT_BACKEND_CUDA) {
        kt_err err;
        cuda_current(b);
        cuda_op_begin(b);
        cuda_keep_failure(b, kt_cuda_launch_host(b->stream, fn, ctx, &err), &err);
        cuda_op_end(b, 0);
        return;
    }
    submit(b, (struct op){.kind = OP_LAUNCH, .fn = fn, .ctx = ctx});
}

/* A cuda kernel sequence was enqueued (KT_OK) or refused (err says why),
 * after cuda_op_begin. */
static void cuda_enqueued(struct kt_backend *b, kt_status st, const kt_err *err)
{
    cuda_keep_failure(b, st, err);
    cuda_op_end(b, 0);
    pthread_mutex_lock(&b->mu);
    b->stats.ops++;
    pthread_mutex_unlock(&b->mu);
}

void kt_backend_run(struct kt_backend *b, kt_backend_fn host_fn, void *host_ctx, kt_backend_cuda_fn cuda_fn,
                    void *cuda_ctx)
{
    if (b->p.kind != KT_BACKEND_CUDA) {
        kt_backend_launch(b, host_fn, host_ctx);
        return;
    }
    kt_err err = {0};
    cuda_current(b);
    cuda_op_begin(b);
    cuda_enqueued(b, cuda_fn(cuda_ctx, b->stream, &err), &err);
}

void kt_backend_copy_device(struct kt_backend *b, void *dst_device, const void *src_device, size_t bytes)
{
    if (b->p.kind == KT_BACKEND_CUDA)
        cuda_copy(b, dst_device, src_device, bytes, KT_CUDA_ON_DEVICE);
    else
        submit(b, (struct op){.kind = OP_COPY_DEVICE, .dst = dst_device, .src = src_device, .bytes = bytes});
}

kt_status kt_backend_take_failure(struct kt_backend *b, kt_err *err)
{
    const kt_status st = b->failure.status;
    if (st == KT_OK)
        return KT_OK;
    b->failure.status = KT_OK;
    return kt_err_set(err, st, "device '%s': %s", b->name, b->failure.msg);
}

void kt_backend_sync(struct kt_backend *b)
{
    if (b->p.kind == KT_BACKEND_CUDA) {
        kt_err err;
        cuda_current(b);
        cuda_keep_failure(b, kt_cuda_stream_synchronize(b->stream, &err), &err);
        cuda_collect(b);
        return;
    }
    pthread_mutex_lock(&b->mu);
    const uint64_t until = b->tail;
    while (b->head < until)
        pthread_cond_wait(&b->changed, &b->mu);
    pthread_mutex_unlock(&b->mu);
}

void kt_backend_stats(const struct kt_backend *b, struct kt_backend_stats *out)
{
    pthread_mutex_lock((pthread_mutex_t *)&b->mu);
    *out = b->stats;
    pthread_mutex_unlock((pthread_mutex_t *)&b->mu);
}

void kt_backend_stats_reset(struct kt_backend *b)
{
    pthread_mutex_lock(&b->mu);
    memset(&b->stats, 0, sizeof b->stats);
    pthread_mutex_unlock(&b->mu);
}

kt_status kt_backend_graph_begin(struct kt_backend *b, kt_err *err)
{
    if (b->recording)
        return kt_err_set(err, KT_ERR_INVALID, "device '%s': a graph is being recorded already", b->name);
    struct kt_backend_graph *g = calloc(1, sizeof *g);
    if (!g)
        return kt_err_set(err, KT_ERR_NOMEM, "backend: out of memory");
    if (b->p.kind == KT_BACKEND_CUDA) {
        cuda_current(b);
        const kt_status st = kt_cuda_capture_begin(b->stream, err);
        if (st != KT_OK) {
            free(g);
            kt_err_prefix(err, "device '%s'", b->name);
            return st;
        }
    }
    b->recording = g;
    return KT_OK;
}

kt_status kt_backend_graph_end(struct kt_backend *b, struct kt_backend_graph **out, kt_err *err)
{
    *out = NULL;
    struct kt_backend_graph *g = b->recording;
    if (!g)
        return kt_err_set(err, KT_ERR_INVALID, "device '%s': no graph is being recorded", b->name);
    b->recording = NULL;
    /* cuda: the capture ends even when a call in it failed, so the stream runs work again */
    kt_err ended = {0};
    if (b->p.kind == KT_BACKEND_CUDA)
        ended.status = kt_cuda_capture_end(b->stream, &g->exec, &ended);
    const kt_err *why = g->failure.status != KT_OK ? &g->failure : &ended;
    if (why->status != KT_OK) {
        const kt_status st = kt_err_set(err, why->status, "device '%s': %s", b->name, why->msg);
        kt_backend_graph_destroy(g);
        return st;
    }
    *out = g;
    return KT_OK;
}

void kt_backend_graph_launch(struct kt_backend *b, const struct kt_backend_graph *g)
{
    pthread_mutex_lock(&b->mu);
    b->stats.graph_launches++;
    pthread_mutex_unlock(&b->mu);
    if (b->p.kind != KT_BACKEND_CUDA) {
        for (size_t i = 0; i < g->n; i++)
            submit(b, g->ops[i]);
        return;
    }
    kt_err err;
    cuda_current(b);
    cuda_op_begin(b);
    cuda_enqueued(b, kt_cuda_graph_launch(g->exec, b->stream, &err), &err);
}

void kt_backend_graph_destroy(struct kt_backend_graph *g)
{
    if (!g)
        return;
    kt_cuda_graph_destroy(g->exec);
    free(g->ops);
    free(g);
}

bool kt_backend_pin_host(struct kt_backend *b, void *ptr, size_t bytes)
{
    if (b->p.kind != KT_BACKEND_CUDA || !ptr || !bytes)
        return false;
    cuda_current(b);
    return kt_cuda_host_register(ptr, bytes, NULL) == KT_OK;
}

void kt_backend_unpin_host(struct kt_backend *b, void *ptr)
{
    if (b->p.kind == KT_BACKEND_CUDA) {
        cuda_current(b);
        kt_cuda_host_unregister(ptr);
    }
}
