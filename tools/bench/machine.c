/*
 * machine.c - `kt-bench machine`: measures what the cost model
 * (placement/cost.h) needs on this host and writes the machine file
 * (placement/machine.h, which says how each figure is taken).
 *
 * Per NUMA node, every node busy at once as the engine runs them (on a
 * synthetic topology the nodes share this machine's cores): a STREAM triad
 * and the FMA and int8 peaks on the node's threads, then per expert weight
 * format the engine's expert path - the MoE step's four phases (gather,
 * gate/up with SiLU, quantize, down) in its task sizes, on the engine's
 * pools with its thread split, over weights in the expert store's layout
 * (packed where the kernel level has a format) - at decode (1 token, 1 to 8
 * experts per call, fitted to overhead + bytes / rate) and at prefill (the
 * FLOP rate of 4 experts' tokens going from 16 to 48 each).  On the step's
 * pool, node 0's attention figures: absorbed heads in GGUF rows, f32
 * products in cache.  The sim accelerator's kernels are the same expert
 * calls on one thread over GGUF rows, as the sim runs device work on its
 * own host thread; its link is the modelled one.  A CUDA device's memory
 * and link are measured with the backend's copies.
 *
 * Weights are real blocks (random rows quantized by the type's reference
 * quantizer, tiled) in enough copies that every call reads them from memory,
 * not from the L3.  It never writes a figure it did not measure in this run
 * (the file leaves out what it could not take; loading it says so).
 */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "backend.h"
#include "bench.h"
#include "cpu/dispatch.h"
#include "cpu/ref/ops.h"
#include "machine.h"
#include "matmul.h"
#include "meminfo.h"
#include "membw.h"
#include "peak.h"
#include "pool.h"
#include "topology.h"

#define HIDDEN 7168              /* E: DeepSeek-V3 / Kimi-K2 hidden size */
#define MAX_FF 2048              /* their expert FFN width */
#define SMALL_FF 256             /* the smallest expert of the fit (a K-quant block of down's row) */
#define EXPERT_TARGET_BYTES 26e6 /* the largest F whose expert stays under this (24.8 MB for q4_K at 2048) */
#define MAX_UNITS 8
#define PREFILL_TOKENS 256       /* rows of h; at least the most pairs a call has (4 x 48) */
#define PREFILL_EXPERTS 4
#define PREFILL_FEW 16           /* tokens per expert of a 128-token prefill, top-8 of 64 experts */
#define PREFILL_MANY 48
#define FILL_ROWS 16
#define GATE_UP_ROWS_PER_TASK 256 /* runtime/forward/moe.c's task sizes */
#define DOWN_ROWS_PER_TASK 256
#define GATE_UP_TOKENS_PER_CALL 16
#define MIN_CALLS 3
#define MAX_SAMPLES 1024
#define MAX_POINTS 8

static const enum kt_type machine_types[] = {KT_TYPE_Q4_K, KT_TYPE_Q5_K, KT_TYPE_Q6_K, KT_TYPE_Q8_0,
                                             KT_TYPE_BF16, KT_TYPE_F16, KT_TYPE_F32};
#define N_TYPES (sizeof machine_types / sizeof machine_types[0])

/* The decode points: k experts of F rows (F 0: SMALL_FF). */
static const struct {
    int k, small;
} decode_points[] = {{1, 1}, {1, 0}, {2, 0}, {4, 0}, {8, 0}};
#define N_POINTS (sizeof decode_points / sizeof decode_points[0])

static double now_s(void)
{
    return kt_bench_now_seconds();
}

static uint64_t xorshift(uint64_t *s)
{
    *s ^= *s << 13, *s ^= *s >> 7, *s ^= *s << 17;
    return *s;
}

static void random_floats(float *x, size_t n, uint64_t *s)
{
    for (size_t i = 0; i < n; i++)
        x[i] = (float)((double)(xorshift(s) >> 11) * (2.0 / 9007199254740992.0) - 1.0);
}

/* The L3 of the cores we run on: sysfs first (in a VM, sysconf may report the
 * whole host's, 384 MiB where the guest's cores share 32), else sysconf. */
static size_t l3_bytes(void)
{
    FILE *f = fopen("/sys/devices/system/cpu/cpu0/cache/index3/size", "r");
    unsigned long kib = 0;
    if (f) {
        if (fscanf(f, "%luK", &kib) != 1)
            kib = 0;
        fclose(f);
    }
    if (kib)
        return (size_t)kib << 10;
    long v = sysconf(_SC_LEVEL3_CACHE_SIZE);
    return v > 0 ? (size_t)v : (size_t)32 << 20;
}

/* ---- experts in the expert store's layout ------------------------------------------------ */

/* Slots of one expert shape, [gate (f, E) | up (f, E) | down (E, f)] each on a
 * 64-byte boundary, slots on 4 KiB boundaries (runtime/forward/expert_store.h). */
struct expert_slots {
    enum kt_type type;
    int64_t n_ff;
    const struct kt_packed_format *packed; /* NULL: GGUF rows */
    size_t gate_off, up_off, down_off, stride, bytes;
    uint64_t expert_bytes;                 /* bytes of one expert in this layout */
    uint64_t gguf_bytes;                   /* ... in the GGUF file: what the rates are per */
    int n;
    uint8_t *base;
};

static size_t round_up(size_t x, size_t a)
{
    return (x + a - 1) / a * a;
}

static size_t mat_bytes(const struct kt_packed_format *f, enum kt_type t, int64_t n_in, int64_t n_out)
{
    return f ? kt_packed_bytes(f, n_in, n_out) : (size_t)n_out * kt_type_row_bytes(t, n_in);
}

/* GGUF bytes of an (n_out, n_in) matrix. */
static uint64_t gguf_matrix_bytes(enum kt_type t, int64_t n_in, int64_t n_out)
{
    return (uint64_t)n_out * kt_type_row_bytes(t, n_in);
}

/* GGUF rows of an (n_out, n_in) matrix: FILL_ROWS random rows quantized, tiled. */
static uint8_t *gguf_matrix(enum kt_type t, int64_t n_in, int64_t n_out, uint64_t *seed)
{
    const size_t row = kt_type_row_bytes(t, n_in);
    uint8_t *w = malloc((size_t)n_out * row);
    float *x = malloc((size_t)n_in * sizeof(float));
    if (!w || !x) {
        free(w), free(x);
        return NULL;
    }
    for (int64_t r = 0; r < n_out; r++) {
        if (r < FILL_ROWS) {
            random_floats(x, (size_t)n_in, seed);
            kt_type_traits(t)->from_float(x, w + (size_t)r * row, n_in);
        } else {
            memcpy(w + (size_t)r * row, w + (size_t)(r % FILL_ROWS) * row, row);
        }
    }
    free(x);
    return w;
}


/* Lays n slots of one expert shape out at base (NULL: only computes
 * s->bytes) holding the same weights, packed when `packed`. */
static kt_status slots_create(struct expert_slots *s, enum kt_type t, int64_t n_ff, bool packed, int n, uint8_t *base,
                              kt_err *err)
{
    *s = (struct expert_slots){.type = t, .n_ff = n_ff, .n = n, .base = base};
    s->packed = packed ? kt_cpu_kernels()->type[t].packed : NULL;
    const size_t gu = mat_bytes(s->packed, t, HIDDEN, n_ff), down = mat_bytes(s->packed, t, n_ff, HIDDEN);
    s->gate_off = 0;
    s->up_off = round_up(gu, 64);
    s->down_off = s->up_off + round_up(gu, 64);
    s->expert_bytes = 2 * (uint64_t)gu + down;
    s->gguf_bytes = 2 * (uint64_t)gguf_matrix_bytes(t, HIDDEN, n_ff) + gguf_matrix_bytes(t, n_ff, HIDDEN);
    s->stride = round_up(s->down_off + down, 4096);
    s->bytes = s->stride * (size_t)n;
    if (!base)
        return KT_OK;
    uint64_t seed = 0x2545f4914f6cdd1dull ^ ((uint64_t)t << 20) ^ (uint64_t)n_ff;
    uint8_t *g = gguf_matrix(t, HIDDEN, n_ff, &seed), *u = gguf_matrix(t, HIDDEN, n_ff, &seed);
    uint8_t *d = gguf_matrix(t, n_ff, HIDDEN, &seed);
    kt_status st = KT_OK;
    if (!g || !u || !d) {
        st = kt_err_set(err, KT_ERR_NOMEM, "cannot build a %s expert", kt_type_name(t));
    } else {
        if (s->packed) {
            s->packed->pack(HIDDEN, g, kt_type_row_bytes(t, HIDDEN), n_ff, base + s->gate_off);
            s->packed->pack(HIDDEN, u, kt_type_row_bytes(t, HIDDEN), n_ff, base + s->up_off);
            s->packed->pack(n_ff, d, kt_type_row_bytes(t, n_ff), HIDDEN, base + s->down_off);
        } else {
            memcpy(base + s->gate_off, g, gu);
            memcpy(base + s->up_off, u, gu);
            memcpy(base + s->down_off, d, down);
        }
        for (int i = 1; i < n; i++)
            memcpy(base + (size_t)i * s->stride, base, s->stride);
    }
    free(g), free(u), free(d);
    return st;
}

static struct kt_mat slot_mat(const struct expert_slots *s, int slot, size_t off, int64_t n_in, int64_t n_out)
{
    return (struct kt_mat){.data = s->base + (size_t)slot * s->stride + off,
                           .type = s->type,
                           .n_in = n_in,
                           .n_out = n_out,
                           .row_bytes = kt_type_row_bytes(s->type, n_in),
                           .packed = s->packed};
}

/* Slots so that a call's experts were last read at least 4 x L3 ago: every
 * read comes from memory, as an expert's rows do in a decode step. */
static int slots_needed(uint64_t expert_bytes, int per_call)
{
    const uint64_t ws = 4 * (uint64_t)l3_bytes() + (uint64_t)per_call * expert_bytes;
    const int n = (int)((ws + expert_bytes - 1) / expert_bytes);
    return n < 2 * per_call ? 2 * per_call : n;
}

/* ---- one call of the expert path ------------------------------------------------------- */

/* One place's call: k units (experts) with their pairs, as moe.c runs a
 * group's units; the item numbering and task sizes are moe.c's. */
struct ffn_call {
    int n_units;
    struct {
        struct kt_mat gate, up, down;
        uint32_t first_pair, n_pairs, first_gate_up, first_down;
    } u[MAX_UNITS];
    uint32_t n_pairs, n_gate_up, n_down;
    int64_t n_ff;
    const uint32_t *pair_token; /* (n_pairs) */
    const uint8_t *hq;          /* (T, hq_bytes) h quantized for gate/up */
    size_t hq_bytes;
    uint8_t *hq_pairs;          /* (n_pairs, hq_bytes) */
    float *act;                 /* (n_pairs, n_ff) */
    uint8_t *act_q;             /* (n_pairs, act_q_bytes) */
    size_t act_q_bytes;
    float *out;                 /* (n_pairs, HIDDEN) */
    int phase;
    uint64_t end_ns;            /* when its pool's last item of the phase finished */
};

static uint64_t now_ns(void)
{
    return (uint64_t)(now_s() * 1e9);
}

static int unit_of(const struct ffn_call *c, uint32_t i, int phase)
{
    int u = 0;
    for (int j = 1; j < c->n_units; j++) {
        const uint32_t first = phase == 1 ? c->u[j].first_gate_up : phase == 3 ? c->u[j].first_down : c->u[j].first_pair;
        if (first <= i)
            u = j;
    }
    return u;
}

static void call_task(void *ctx, int64_t begin, int64_t end, int worker)
{
    (void)worker;
    struct ffn_call *c = ctx;
    float g[GATE_UP_TOKENS_PER_CALL * GATE_UP_ROWS_PER_TASK], v[GATE_UP_TOKENS_PER_CALL * GATE_UP_ROWS_PER_TASK];
    for (int64_t i = begin; i < end; i++) {
        const int ui = unit_of(c, (uint32_t)i, c->phase);
        const uint32_t p0 = c->u[ui].first_pair, np = c->u[ui].n_pairs;
        if (c->phase == 0) { /* gather */
            memcpy(c->hq_pairs + (size_t)i * c->hq_bytes, c->hq + (size_t)c->pair_token[i] * c->hq_bytes, c->hq_bytes);
        } else if (c->phase == 1) { /* gate and up, SiLU fused */
            const int64_t r0 = ((int64_t)i - c->u[ui].first_gate_up) * GATE_UP_ROWS_PER_TASK;
            const int64_t n = r0 + GATE_UP_ROWS_PER_TASK < c->n_ff ? GATE_UP_ROWS_PER_TASK : c->n_ff - r0;
            const struct kt_mat gate = kt_mat_rows(c->u[ui].gate, r0, n), up = kt_mat_rows(c->u[ui].up, r0, n);
            for (uint32_t q = p0; q < p0 + np; q += GATE_UP_TOKENS_PER_CALL) {
                const int64_t nt = p0 + np - q < GATE_UP_TOKENS_PER_CALL ? p0 + np - q : GATE_UP_TOKENS_PER_CALL;
                kt_mat_gemm(&gate, c->hq_pairs + (size_t)q * c->hq_bytes, c->hq_bytes, nt, g, n);
                kt_mat_gemm(&up, c->hq_pairs + (size_t)q * c->hq_bytes, c->hq_bytes, nt, v, n);
                for (int64_t t = 0; t < nt; t++)
                    for (int64_t r = 0; r < n; r++) {
                        const float x = g[t * n + r];
                        c->act[(size_t)(q + t) * c->n_ff + r0 + r] = x / (1.0f + expf(-x)) * v[t * n + r];
                    }
            }
        } else if (c->phase == 2) { /* the down projection's activations */
            kt_quantize_rows(NULL, c->u[ui].down.type, c->act + (size_t)i * c->n_ff, 1, c->n_ff,
                             c->act_q + (size_t)i * c->act_q_bytes);
        } else { /* down */
            const int64_t r0 = ((int64_t)i - c->u[ui].first_down) * DOWN_ROWS_PER_TASK;
            const int64_t n = r0 + DOWN_ROWS_PER_TASK < HIDDEN ? DOWN_ROWS_PER_TASK : HIDDEN - r0;
            const struct kt_mat down = kt_mat_rows(c->u[ui].down, r0, n);
            kt_mat_gemm(&down, c->act_q + (size_t)p0 * c->act_q_bytes, c->act_q_bytes, np,
                        c->out + (size_t)p0 * HIDDEN + r0, HIDDEN);
        }
    }
    const uint64_t t = now_ns();
    uint64_t seen = __atomic_load_n(&c->end_ns, __ATOMIC_RELAXED);
    while (t > seen && !__atomic_compare_exchange_n(&c->end_ns, &seen, t, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
        ;
}

/* Scratch of one place for calls of up to MAX_UNITS experts and PREFILL_TOKENS pairs. */
struct place {
    struct kt_pool *pool;       /* NULL: the calling thread alone (the sim) */
    int threads;
    bool helped;                /* the calling thread helps this place's pool (the first, as the engine does) */
    struct expert_slots big, small;
    uint8_t *region;            /* the slots of the type being measured, reused for the next */
    size_t region_bytes;
    int next_slot;
    struct ffn_call call;
    uint32_t pair_token[PREFILL_TOKENS];
    uint8_t *hq_pairs, *act_q;
    float *act, *out;
    double node_s;              /* this call's time on this place */
    double samples[MAX_POINTS][MAX_SAMPLES]; /* node_s of each point's calls */
};

static kt_status place_scratch(struct place *p, kt_err *err)
{
    const size_t hq = kt_type_row_bytes(KT_TYPE_F32, HIDDEN); /* the widest activation row */
    p->hq_pairs = malloc(PREFILL_TOKENS * hq);
    p->act = malloc((size_t)PREFILL_TOKENS * MAX_FF * sizeof(float));
    p->act_q = malloc((size_t)PREFILL_TOKENS * MAX_FF * sizeof(float));
    p->out = malloc((size_t)PREFILL_TOKENS * HIDDEN * sizeof(float));
    if (!p->hq_pairs || !p->act || !p->act_q || !p->out)
        return kt_err_set(err, KT_ERR_NOMEM, "out of memory for the expert calls' scratch");
    memset(p->act, 0, (size_t)PREFILL_TOKENS * MAX_FF * sizeof(float));
    return KT_OK;
}

static void place_free(struct place *p)
{
    if (p->region)
        munmap(p->region, p->region_bytes);
    free(p->hq_pairs), free(p->act), free(p->act_q), free(p->out);
}

/* Sets up p's call: k experts of s, the next slots in rotation, each with
 * tokens_per_expert pairs; returns the GGUF bytes of its weights. */
static uint64_t plan_call(struct place *p, struct expert_slots *s, int k, int tokens_per_expert, const uint8_t *hq,
                          size_t hq_bytes)
{
    struct ffn_call *c = &p->call;
    *c = (struct ffn_call){.n_units = k, .n_ff = s->n_ff, .pair_token = p->pair_token, .hq = hq, .hq_bytes = hq_bytes,
                           .hq_pairs = p->hq_pairs, .act = p->act, .act_q = p->act_q,
                           .act_q_bytes = kt_act_row_bytes(s->type, s->n_ff), .out = p->out};
    for (int i = 0; i < k; i++) {
        const int slot = p->next_slot++ % s->n;
        c->u[i].gate = slot_mat(s, slot, s->gate_off, HIDDEN, s->n_ff);
        c->u[i].up = slot_mat(s, slot, s->up_off, HIDDEN, s->n_ff);
        c->u[i].down = slot_mat(s, slot, s->down_off, s->n_ff, HIDDEN);
        c->u[i].first_pair = c->n_pairs;
        c->u[i].n_pairs = (uint32_t)tokens_per_expert;
        c->u[i].first_gate_up = c->n_gate_up;
        c->u[i].first_down = c->n_down;
        for (int t = 0; t < tokens_per_expert; t++) /* token t * k + i: each token picks k experts */
            p->pair_token[c->n_pairs + (uint32_t)t] = tokens_per_expert > 1 ? (uint32_t)((t * k + i) % PREFILL_TOKENS) : 0;
        c->n_pairs += (uint32_t)tokens_per_expert;
        c->n_gate_up += (uint32_t)((s->n_ff + GATE_UP_ROWS_PER_TASK - 1) / GATE_UP_ROWS_PER_TASK);
        c->n_down += (HIDDEN + DOWN_ROWS_PER_TASK - 1) / DOWN_ROWS_PER_TASK;
    }
    return (uint64_t)k * s->gguf_bytes;
}

/* Runs every place's planned call at once, phase by phase as run_phase does
 * (submit to each pool, help the first, wait for all); the sim's place
 * (pool NULL) runs alone.  Each place's node_s: the sum over phases of the
 * time its pool took. */
static void run_calls(struct place *places, int n)
{
    for (int i = 0; i < n; i++)
        places[i].node_s = 0;
    for (int phase = 0; phase < 4; phase++) {
        const uint64_t t0 = now_ns();
        for (int i = 0; i < n; i++) {
            struct ffn_call *c = &places[i].call;
            c->phase = phase;
            c->end_ns = t0;
            const int64_t items = phase == 1 ? c->n_gate_up : phase == 3 ? c->n_down : c->n_pairs;
            if (places[i].pool)
                kt_pool_submit(places[i].pool, items, 1, call_task, c);
            else
                call_task(c, 0, items, 0);
        }
        if (places[0].pool) {
            if (places[0].helped)
                kt_pool_help(places[0].pool);
            for (int i = 0; i < n; i++)
                kt_pool_wait(places[i].pool);
        }
        for (int i = 0; i < n; i++)
            places[i].node_s += (double)(places[i].call.end_ns - t0) * 1e-9;
    }
}

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* One shape of call: k experts (small or big slots) with tpe tokens each. */
struct point {
    int k, tpe;
    bool small;
};

/* Rounds of one call of each point on every place at once, until
 * n_points x `seconds` have gone (at least MIN_CALLS rounds): a busy moment
 * of the machine then slows every point alike instead of bending the fit.
 * median_s[p][i] and bytes[p][i]: point p's median seconds and weight bytes
 * per call on place i. */
static void time_points(struct place *places, int n, const struct point *pts, int n_points, const uint8_t *hq,
                        size_t hq_bytes, double seconds, double (*median_s)[KT_MACHINE_MAX_NODES],
                        uint64_t (*bytes)[KT_MACHINE_MAX_NODES])
{
    int rounds = 0;
    const double start = now_s();
    for (int i = 0; i < n; i++) /* one untimed call: code and scratch warm, weights rotate on */
        plan_call(&places[i], &places[i].big, pts[0].k, pts[0].tpe, hq, hq_bytes);
    run_calls(places, n);
    do {
        for (int p = 0; p < n_points; p++) {
            for (int i = 0; i < n; i++)
                bytes[p][i] = plan_call(&places[i], pts[p].small ? &places[i].small : &places[i].big, pts[p].k,
                                        pts[p].tpe, hq, hq_bytes);
            run_calls(places, n);
            for (int i = 0; i < n; i++)
                places[i].samples[p][rounds] = places[i].node_s;
        }
        rounds++;
    } while (rounds < MAX_SAMPLES && (rounds < MIN_CALLS || now_s() - start < seconds * n_points));
    for (int p = 0; p < n_points; p++)
        for (int i = 0; i < n; i++) {
            qsort(places[i].samples[p], (size_t)rounds, sizeof(double), cmp_double);
            median_s[p][i] = places[i].samples[p][rounds / 2];
        }
}

/* time = overhead + bytes / rate, least squares of the relative error (each
 * point weighs 1 / t^2), the overhead held at >= 0; max_err: the largest
 * relative miss of the fit over the points. */
static struct kt_machine_rate fit_rate(const double *bytes, const double *t, int n, double *max_err)
{
    double sw = 0, sx = 0, sxx = 0, st = 0, sxt = 0;
    for (int i = 0; i < n; i++) {
        const double w = 1.0 / (t[i] * t[i]);
        sw += w, sx += w * bytes[i], sxx += w * bytes[i] * bytes[i], st += w * t[i], sxt += w * bytes[i] * t[i];
    }
    const double det = sw * sxx - sx * sx;
    double a = det > 0 ? (sxx * st - sx * sxt) / det : 0, b = det > 0 ? (sw * sxt - sx * st) / det : 0;
    if (a < 0 || b <= 0) {
        a = 0;
        b = sxt / sxx;
    }
    *max_err = 0;
    for (int i = 0; i < n; i++) {
        const double e = fabs(a + b * bytes[i] - t[i]) / t[i];
        *max_err = e > *max_err ? e : *max_err;
    }
    return (struct kt_machine_rate){1e-9 / b, a * 1e6};
}

/* ---- references per node, all nodes at once ------------------------------------------- */

struct ref_job {
    int threads;
    double seconds;
    enum kt_isa fma_isa, int8_isa;
    struct kt_triad_result triad;
    struct kt_peak_result fma, int8;
    kt_status st;
    kt_err err;
    int which; /* 0 triad, 1 fma, 2 int8 */
};

static void *ref_main(void *arg)
{
    struct ref_job *j = arg;
    size_t array = 2 * l3_bytes();
    array = array < ((size_t)32 << 20) ? (size_t)32 << 20 : array;
    if (j->which == 0)
        j->st = kt_stream_triad(array, j->threads, 5, &j->triad, &j->err);
    else if (j->which == 1)
        j->st = kt_peak_measure(KT_PEAK_FMA_F32, j->fma_isa, j->threads, j->seconds, 3, &j->fma, &j->err);
    else
        j->st = kt_peak_measure(KT_PEAK_DOT_INT8, j->int8_isa, j->threads, j->seconds, 3, &j->int8, &j->err);
    return NULL;
}

/* The best level <= the kernels' level that has a loop of this kind, or -1. */
static int peak_isa(enum kt_peak_kind kind)
{
    for (int isa = (int)kt_cpu_kernels()->isa; isa >= 0; isa--)
        if (kt_peak_available(kind, (enum kt_isa)isa))
            return isa;
    return -1;
}

static kt_status measure_refs(struct kt_machine *m, const struct place *places, double seconds, kt_err *err)
{
    struct ref_job jobs[KT_MACHINE_MAX_NODES];
    pthread_t th[KT_MACHINE_MAX_NODES];
    const int fma_isa = peak_isa(KT_PEAK_FMA_F32), int8_isa = peak_isa(KT_PEAK_DOT_INT8);
    for (int which = 0; which < 3; which++) {
        if ((which == 1 && fma_isa < 0) || (which == 2 && int8_isa < 0))
            continue;
        int started = 0;
        for (int i = 0; i < m->n_nodes; i++) {
            jobs[i] = (struct ref_job){.threads = places[i].threads, .seconds = seconds,
                                       .fma_isa = (enum kt_isa)(fma_isa < 0 ? 0 : fma_isa),
                                       .int8_isa = (enum kt_isa)(int8_isa < 0 ? 0 : int8_isa), .which = which};
            if (pthread_create(&th[i], NULL, ref_main, &jobs[i]) != 0)
                break;
            started++;
        }
        for (int i = 0; i < started; i++)
            pthread_join(th[i], NULL);
        if (started < m->n_nodes)
            return kt_err_set(err, KT_ERR_NOMEM, "cannot start the reference threads");
        for (int i = 0; i < m->n_nodes; i++) {
            if (jobs[i].st != KT_OK) {
                *err = jobs[i].err;
                return jobs[i].st;
            }
            if (which == 0)
                m->nodes[i].triad_gbps = jobs[i].triad.median_gbps;
            else if (which == 1)
                m->nodes[i].fma_gflops = jobs[i].fma.median_gops;
            else
                m->nodes[i].int8_gops = jobs[i].int8.median_gops;
        }
    }
    return KT_OK;
}

/* ---- kernels per type ----------------------------------------------------------------------- */

/* The largest power-of-two expert width up to MAX_FF whose expert stays under EXPERT_TARGET_BYTES. */
static int64_t expert_width(enum kt_type t)
{
    int64_t f = MAX_FF;
    while (f > SMALL_FF &&
           (double)(2 * kt_type_row_bytes(t, HIDDEN) * (size_t)f + (size_t)HIDDEN * kt_type_row_bytes(t, f)) >
               EXPERT_TARGET_BYTES)
        f /= 2;
    return f;
}

struct type_result {
    int64_t n_ff;
    const char *layout;
    double max_err;
    int points;
};

/* Bytes of the slots type t's points need on one place (and their counts). */
static size_t region_need(enum kt_type t, bool packed, int *n_big, int *n_small)
{
    struct expert_slots big, small;
    slots_create(&big, t, expert_width(t), packed, 1, NULL, NULL); /* sizes only */
    slots_create(&small, t, SMALL_FF, packed, 1, NULL, NULL);
    *n_big = slots_needed(big.expert_bytes, MAX_UNITS);
    *n_small = slots_needed(small.expert_bytes, 1);
    return round_up(big.stride * (size_t)*n_big + small.stride * (size_t)*n_small, (size_t)2 << 20);
}

/* Grows p's mapping to `need` bytes (the page faults are paid once, not per type). */
static kt_status place_region(struct place *p, size_t need, kt_err *err)
{
    if (need <= p->region_bytes)
        return KT_OK;
    if (p->region)
        munmap(p->region, p->region_bytes);
    p->region_bytes = 0;
    void *r = mmap(NULL, need, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    p->region = r == MAP_FAILED ? NULL : r;
    if (!p->region)
        return kt_err_set(err, KT_ERR_NOMEM, "cannot map %zu MiB for the experts", need >> 20);
    p->region_bytes = need;
    madvise(p->region, need, MADV_HUGEPAGE); /* a hint, as the expert store gives it */
    return KT_OK;
}

/* GB/s of `bytes` read in `fixed_s`, the fixed part of a call that took
 * first_s at its fewest tokens (floored at 1% of it: noise, or a read wholly
 * hidden behind the tokens' work). */
static double fixed_gbps(double bytes, double first_s, double fixed_s)
{
    const double floor_s = 0.01 * first_s;
    return bytes / (fixed_s > floor_s ? fixed_s : floor_s) * 1e-9;
}

/* Decode fit and prefill figure of type t on places [0, n) at once (packed:
 * the expert store's layout; the sim's places take GGUF rows). */
static kt_status measure_type(struct place *places, int n, enum kt_type t, bool packed, double seconds,
                              struct kt_machine_rate *rates, double *prefill, double *fixed,
                              struct type_result *res, kt_err *err)
{
    const int64_t f = expert_width(t);
    kt_status st = KT_OK;
    uint8_t *hq = NULL;
    float *h = NULL;
    for (int i = 0; i < n; i++) {
        struct place *p = &places[i];
        p->next_slot = 0;
        int n_big, n_small;
        if ((st = place_region(p, region_need(t, packed, &n_big, &n_small), err)) ||
            (st = slots_create(&p->big, t, f, packed, n_big, p->region, err)) ||
            (st = slots_create(&p->small, t, SMALL_FF, packed, n_small, p->region + p->big.bytes, err)))
            goto done;
    }
    res->n_ff = f;
    res->layout = places[0].big.packed ? places[0].big.packed->name : "gguf";
    /* h: PREFILL_TOKENS random rows in gate/up's activation format */
    const size_t hq_bytes = kt_act_row_bytes(t, HIDDEN);
    h = malloc((size_t)PREFILL_TOKENS * HIDDEN * sizeof(float));
    hq = malloc((size_t)PREFILL_TOKENS * hq_bytes);
    if (!h || !hq) {
        st = kt_err_set(err, KT_ERR_NOMEM, "out of memory for activations");
        goto done;
    }
    uint64_t seed = 0x51ed270b27a4c5d3ull ^ (uint64_t)t;
    random_floats(h, (size_t)PREFILL_TOKENS * HIDDEN, &seed);
    kt_quantize_rows(NULL, t, h, PREFILL_TOKENS, HIDDEN, hq);

    double med[MAX_POINTS][KT_MACHINE_MAX_NODES];
    uint64_t bytes[MAX_POINTS][KT_MACHINE_MAX_NODES];
    struct point pts[MAX_POINTS];
    int np = 0;
    for (size_t k = 0; k < N_POINTS; k++)
        if (!(decode_points[k].small && f == SMALL_FF)) /* else the same shape as the first big point */
            pts[np++] = (struct point){decode_points[k].k, 1, decode_points[k].small};
    time_points(places, n, pts, np, hq, hq_bytes, seconds, med, bytes);
    res->points = np;
    res->max_err = 0;
    for (int i = 0; i < n; i++) {
        double xs[MAX_POINTS], ts[MAX_POINTS], e;
        for (int p = 0; p < np; p++)
            xs[p] = (double)bytes[p][i], ts[p] = med[p][i];
        rates[i] = fit_rate(xs, ts, np, &e);
        res->max_err = e > res->max_err ? e : res->max_err;
    }
    /* prefill: 4 experts of 16, and of 48 tokens each, weights from memory as in a
     * prefill step; the rate of the extra tokens' FLOPs (their weights are read
     * either way), or of all FLOPs at 48 where noise hides the difference */
    const struct point pre[2] = {{PREFILL_EXPERTS, PREFILL_FEW, false}, {PREFILL_EXPERTS, PREFILL_MANY, false}};
    time_points(places, n, pre, 2, hq, hq_bytes, seconds, med, bytes);
    const double flops_per_pair = 2.0 * 3.0 * HIDDEN * (double)f;
    for (int i = 0; i < n; i++)
        prefill[i] = med[1][i] > 1.05 * med[0][i]
                         ? flops_per_pair * PREFILL_EXPERTS * (PREFILL_MANY - PREFILL_FEW) / (med[1][i] - med[0][i]) * 1e-9
                         : flops_per_pair * PREFILL_EXPERTS * PREFILL_MANY / med[1][i] * 1e-9;
    /* the line through the two points at no tokens, less the decode overhead
     * the model adds (none where the rate is taken at 48 alone) */
    for (int i = 0; i < n; i++) {
        const double per_pair = (med[1][i] - med[0][i]) / (PREFILL_EXPERTS * (PREFILL_MANY - PREFILL_FEW));
        const double at_none = med[0][i] - PREFILL_EXPERTS * PREFILL_FEW * per_pair - rates[i].overhead_us * 1e-6;
        fixed[i] = fixed_gbps((double)bytes[0][i], med[0][i], med[1][i] > 1.05 * med[0][i] ? at_none : 0);
    }
done:
    free(h), free(hq);
    return st;
}

/* ---- attention's per-head products, on the step's pool --------------------------------------- */

#define HEAD_DIM 128    /* qk_nope_dim = v_head_dim of V3 and Kimi-K2 */
#define HEAD_KVR 512    /* kv_lora_rank */
#define HEAD_MAX_THREADS 4096

/* One token's absorbed heads as attention.c runs them: items of `group`
 * heads on the step's pool, each head W_UK,h (kvr rows of dn) times its
 * quantized query, then W_UV,h (dv rows of kvr) times its quantized latent,
 * in GGUF rows; head h's pair at base + slot * stride. */
struct heads_call {
    const uint8_t *base;
    size_t stride, uv_off;
    enum kt_type type;
    int first_slot, n_slots, n_heads, group;
    const float *q, *o_lat;  /* (HEAD_DIM), (HEAD_KVR) */
    uint8_t *act_q;          /* (threads, act_stride) */
    size_t act_stride;
    float *y;                /* (threads, HEAD_KVR) */
};

static void heads_task(void *ctx, int64_t begin, int64_t end, int worker)
{
    const struct heads_call *c = ctx;
    uint8_t *act_q = c->act_q + (size_t)worker * c->act_stride;
    float *y = c->y + (size_t)worker * HEAD_KVR;
    for (int64_t i = begin; i < end; i++)
        for (int g = 0; g < c->group && i * c->group + g < c->n_heads; g++) {
            const uint8_t *w = c->base + (size_t)((c->first_slot + i * c->group + g) % c->n_slots) * c->stride;
            const struct kt_mat uk = {.data = w, .type = c->type, .n_in = HEAD_DIM, .n_out = HEAD_KVR,
                                      .row_bytes = kt_type_row_bytes(c->type, HEAD_DIM)};
            const struct kt_mat uv = {.data = w + c->uv_off, .type = c->type, .n_in = HEAD_KVR, .n_out = HEAD_DIM,
                                      .row_bytes = kt_type_row_bytes(c->type, HEAD_KVR)};
            kt_quantize_rows(NULL, c->type, c->q, 1, HEAD_DIM, act_q);
            kt_matvec_q(&uk, act_q, y);
            kt_quantize_rows(NULL, c->type, c->o_lat, 1, HEAD_KVR, act_q);
            kt_matvec_q(&uv, act_q, y);
        }
}

/* decode_rows[t]: calls of 8, 32, 64 and 128 heads (the weights read from
 * memory, copies of 4 x L3 in rotation) in interleaved rounds, fitted as the
 * experts are.  region: at least region_bytes of mapped memory. */
static kt_status measure_rows(struct kt_pool *pool, uint8_t *region, size_t region_bytes, enum kt_type t,
                              double seconds, struct kt_machine_rate *rate, double *max_err, kt_err *err)
{
    static const int heads[] = {8, 32, 64, 128};
    enum { N_HEAD_POINTS = sizeof heads / sizeof heads[0] };
    const size_t uk = (size_t)HEAD_KVR * kt_type_row_bytes(t, HEAD_DIM), uv = (size_t)HEAD_DIM * kt_type_row_bytes(t, HEAD_KVR);
    const size_t stride = round_up(round_up(uk, 64) + uv, 64);
    int n_slots = (int)((4 * l3_bytes() + 128 * stride) / stride);
    if ((size_t)n_slots * stride > region_bytes)
        n_slots = (int)(region_bytes / stride);
    const int threads = kt_pool_n_threads(pool);
    uint64_t seed = 0x9e3779b97f4a7c15ull ^ (uint64_t)t;
    uint8_t *wk = gguf_matrix(t, HEAD_DIM, HEAD_KVR, &seed), *wv = gguf_matrix(t, HEAD_KVR, HEAD_DIM, &seed);
    const size_t act_stride = round_up(HEAD_KVR * sizeof(float), 64);
    uint8_t *act_q = malloc((size_t)threads * act_stride);
    float *y = malloc((size_t)threads * HEAD_KVR * sizeof(float)), q[HEAD_DIM], o_lat[HEAD_KVR];
    double (*samples)[MAX_SAMPLES] = NULL;
    kt_status st = KT_OK;
    if (!wk || !wv || !act_q || !y || n_slots < 2 * 128) {
        st = kt_err_set(err, KT_ERR_NOMEM, "out of memory for the %s attention heads", kt_type_name(t));
        goto done;
    }
    memcpy(region, wk, uk);
    memcpy(region + round_up(uk, 64), wv, uv);
    for (int i = 1; i < n_slots; i++)
        memcpy(region + (size_t)i * stride, region, stride);
    random_floats(q, HEAD_DIM, &seed);
    random_floats(o_lat, HEAD_KVR, &seed);
    samples = malloc(sizeof(double[N_HEAD_POINTS][MAX_SAMPLES]));
    if (!samples) {
        st = kt_err_set(err, KT_ERR_NOMEM, "out of memory");
        goto done;
    }
    int rounds = 0, next = 0;
    const double start = now_s();
    do {
        for (int p = 0; p < N_HEAD_POINTS; p++) {
            int group = heads[p] / (2 * threads); /* attention.c: heads per item, two items a thread */
            group = group < 1 ? 1 : group > 8 ? 8 : group;
            struct heads_call c = {region, stride, round_up(uk, 64), t, next, n_slots, heads[p], group, q, o_lat,
                                   act_q, act_stride, y};
            next = (next + heads[p]) % n_slots;
            const double t0 = now_s();
            kt_pool_parallel_for(pool, (heads[p] + group - 1) / group, 1, heads_task, &c);
            samples[p][rounds] = now_s() - t0;
        }
        rounds++;
    } while (rounds < MAX_SAMPLES && (rounds < MIN_CALLS || now_s() - start < seconds * N_HEAD_POINTS));
    double xs[N_HEAD_POINTS], ts[N_HEAD_POINTS];
    for (int p = 0; p < N_HEAD_POINTS; p++) {
        qsort(samples[p], (size_t)rounds, sizeof(double), cmp_double);
        ts[p] = samples[p][rounds / 2];
        xs[p] = (double)heads[p] * (double)(uk + uv);
    }
    *rate = fit_rate(xs, ts, N_HEAD_POINTS, max_err);
done:
    free(wk), free(wv), free(act_q), free(y);
    free(samples);
    return st;
}

/* prefill_rows_gflops[t]: the four MLA projections of DeepSeek-V3 and
 * Kimi-K2 (W_qa 7168 -> 1536, W_qb 1536 -> 12288, W_kva 7168 -> 576, W_o
 * 8192 -> 7168) in GGUF rows times 16 and 64 tokens, each quantized and
 * multiplied on the pool as the forward pass does (kt_quantize_rows, then
 * kt_matmul_q), in interleaved rounds: the 48 extra tokens' FLOPs over the
 * time they add, medians of calls. */
static const int64_t rows_shapes[4][2] = {{7168, 1536}, {1536, 12288}, {7168, 576}, {8192, 7168}};
#define ROWS_MAX_IN 8192
#define ROWS_MAX_OUT 12288
static kt_status measure_prefill_rows(struct kt_pool *pool, enum kt_type t, double seconds, double *gflops,
                                      double *fixed, kt_err *err)
{
    static const int tokens[2] = {16, 64};
    uint64_t seed = 0x243f6a8885a308d3ull ^ (uint64_t)t;
    uint8_t *w[4] = {NULL, NULL, NULL, NULL};
    for (int i = 0; i < 4; i++)
        w[i] = gguf_matrix(t, rows_shapes[i][0], rows_shapes[i][1], &seed);
    float *x = malloc((size_t)tokens[1] * ROWS_MAX_IN * sizeof(float));
    float *y = malloc((size_t)tokens[1] * ROWS_MAX_OUT * sizeof(float));
    void *xq = malloc((size_t)tokens[1] * kt_act_row_bytes(t, ROWS_MAX_IN));
    double(*samples)[MAX_SAMPLES] = malloc(sizeof(double[2][MAX_SAMPLES]));
    kt_status st = KT_OK;
    if (!w[0] || !w[1] || !w[2] || !w[3] || !x || !y || !xq || !samples) {
        st = kt_err_set(err, KT_ERR_NOMEM, "out of memory for the %s projections in GGUF rows", kt_type_name(t));
        goto done;
    }
    random_floats(x, (size_t)tokens[1] * ROWS_MAX_IN, &seed);
    double flops_per_token = 0;
    for (int i = 0; i < 4; i++)
        flops_per_token += 2.0 * (double)rows_shapes[i][0] * (double)rows_shapes[i][1];
    int rounds = 0;
    const double start = now_s();
    do {
        for (int p = 0; p < 2; p++) {
            const double t0 = now_s();
            for (int i = 0; i < 4; i++) {
                const int64_t n_in = rows_shapes[i][0], n_out = rows_shapes[i][1];
                const struct kt_mat m = {.data = w[i], .type = t, .n_in = n_in, .n_out = n_out,
                                         .row_bytes = kt_type_row_bytes(t, n_in)};
                kt_quantize_rows(pool, t, x, tokens[p], n_in, xq);
                kt_matmul_q(pool, &m, xq, tokens[p], y, n_out);
            }
            samples[p][rounds] = now_s() - t0;
        }
        rounds++;
    } while (rounds < MAX_SAMPLES && (rounds < MIN_CALLS || now_s() - start < 2 * seconds));
    for (int p = 0; p < 2; p++)
        qsort(samples[p], (size_t)rounds, sizeof(double), cmp_double);
    const double extra = samples[1][rounds / 2] - samples[0][rounds / 2];
    *gflops = flops_per_token * (tokens[1] - tokens[0]) / (extra > 0 ? extra : samples[1][rounds / 2]) * 1e-9;
    double bytes = 0;
    for (int i = 0; i < 4; i++)
        bytes += (double)rows_shapes[i][1] * (double)kt_type_row_bytes(t, rows_shapes[i][0]);
    *fixed = fixed_gbps(bytes, samples[0][rounds / 2],
                        extra > 0 ? samples[0][rounds / 2] - extra * tokens[0] / (tokens[1] - tokens[0]) : 0);
done:
    for (int i = 0; i < 4; i++)
        free(w[i]);
    free(x), free(y), free(xq);
    free(samples);
    return st;
}

/* f32_cached_gbps: every thread of the pool multiplies its own head pair
 * (two 128 x 512 f32 matrices, 512 KiB: they stay in cache) by a vector,
 * over and over; GB/s of matrix read, median of calls. */
struct cached_call {
    const struct kt_cpu_type_kernels *k;
    float *w;                   /* (threads, 2, HEAD_DIM, HEAD_KVR) */
    float *y;                   /* (threads, HEAD_DIM) */
    const float *x;             /* (HEAD_KVR) */
};

static void cached_task(void *ctx, int64_t begin, int64_t end, int worker)
{
    const struct cached_call *c = ctx;
    const float *w = c->w + (size_t)worker * 2 * HEAD_DIM * HEAD_KVR;
    for (int64_t i = begin; i < end; i++)
        for (int m = 0; m < 2; m++)
            c->k->gemv(HEAD_KVR, c->y + (size_t)worker * HEAD_DIM, w + (size_t)m * HEAD_DIM * HEAD_KVR,
                       HEAD_KVR * sizeof(float), c->x, HEAD_DIM);
}

/* Median seconds of kt_pool_parallel_for(pool, items, task, ctx) over calls
 * for `seconds` (at least MIN_CALLS), after one untimed call (into cache);
 * a negative value when memory for the samples runs out. */
static double median_parallel_s(struct kt_pool *pool, int64_t items, kt_pool_fn task, void *ctx, double seconds)
{
    double *samples = malloc(MAX_SAMPLES * sizeof(double));
    if (!samples)
        return -1.0;
    int n = 0;
    kt_pool_parallel_for(pool, items, 1, task, ctx);
    const double start = now_s();
    do {
        const double t0 = now_s();
        kt_pool_parallel_for(pool, items, 1, task, ctx);
        samples[n++] = now_s() - t0;
    } while (n < MAX_SAMPLES && (n < MIN_CALLS || now_s() - start < seconds));
    qsort(samples, (size_t)n, sizeof(double), cmp_double);
    const double med = samples[n / 2];
    free(samples);
    return med;
}

static kt_status measure_cached(struct kt_pool *pool, double seconds, double *gbps, kt_err *err)
{
    const int threads = kt_pool_n_threads(pool), items = 16 * threads;
    struct cached_call c = {kt_mat_kernels_for(KT_TYPE_F32), malloc((size_t)threads * 2 * HEAD_DIM * HEAD_KVR * sizeof(float)),
                            malloc((size_t)threads * HEAD_DIM * sizeof(float)), NULL};
    float *x = malloc(HEAD_KVR * sizeof(float));
    kt_status st = KT_OK;
    if (!c.k || !c.w || !c.y || !x) {
        st = kt_err_set(err, KT_ERR_NOMEM, "out of memory for the cached f32 products");
        goto done;
    }
    uint64_t seed = 0x3c6ef372fe94f82bull;
    random_floats(c.w, (size_t)threads * 2 * HEAD_DIM * HEAD_KVR, &seed);
    random_floats(x, HEAD_KVR, &seed);
    c.x = x;
    const double med = median_parallel_s(pool, items, cached_task, &c, seconds);
    if (med < 0)
        st = kt_err_set(err, KT_ERR_NOMEM, "out of memory for the cached f32 products' samples");
    else
        *gbps = (double)items * 2 * HEAD_DIM * HEAD_KVR * sizeof(float) / med * 1e-9;
done:
    free(c.w), free(c.y), free(x);
    return st;
}

/* head_dequant_gelems[t] and attention_gflops: the expanded form's per-head
 * work besides its f32 products, every thread of the pool on its own head
 * (in cache) at once, medians of calls. */
#define ATTN_KEYS 64 /* keys a query attends to: a 64-token chunk's mean is 32, its last 64 */
#define ATTN_DK 192  /* qk_nope_dim + qk_rope_dim of V3 and Kimi-K2 */

struct dequant_call {
    enum kt_type type;
    const uint8_t *uk, *uv;   /* per thread: W_UK,h (HEAD_KVR rows of HEAD_DIM), W_UV,h (HEAD_DIM rows of HEAD_KVR) */
    float *out, *tmp;         /* (threads, 2 HEAD_DIM HEAD_KVR), (threads, KT_MAT_T_ROWS HEAD_DIM) */
};

static void dequant_task(void *ctx, int64_t begin, int64_t end, int worker)
{
    const struct dequant_call *c = ctx;
    const size_t uk_row = kt_type_row_bytes(c->type, HEAD_DIM), uv_row = kt_type_row_bytes(c->type, HEAD_KVR);
    const struct kt_mat uk = {.data = c->uk + (size_t)worker * HEAD_KVR * uk_row, .type = c->type, .n_in = HEAD_DIM,
                              .n_out = HEAD_KVR, .row_bytes = uk_row};
    const struct kt_mat uv = {.data = c->uv + (size_t)worker * HEAD_DIM * uv_row, .type = c->type, .n_in = HEAD_KVR,
                              .n_out = HEAD_DIM, .row_bytes = uv_row};
    float *out = c->out + (size_t)worker * 2 * HEAD_DIM * HEAD_KVR;
    for (int64_t i = begin; i < end; i++) {
        kt_mat_dequantize_transposed(&uk, out, c->tmp + (size_t)worker * KT_MAT_T_ROWS * HEAD_DIM);
        kt_mat_dequantize(&uv, out + HEAD_DIM * HEAD_KVR);
    }
}

/* head_dequant_gelems[t]: weights a second (1e9). */
static kt_status measure_head_dequant(struct kt_pool *pool, enum kt_type t, double seconds, double *gelems, kt_err *err)
{
    const int threads = kt_pool_n_threads(pool), items = 16 * threads;
    uint64_t seed = 0x9e3779b97f4a7c15ull ^ (uint64_t)t;
    struct dequant_call c = {t, gguf_matrix(t, HEAD_DIM, (int64_t)threads * HEAD_KVR, &seed),
                             gguf_matrix(t, HEAD_KVR, (int64_t)threads * HEAD_DIM, &seed),
                             malloc((size_t)threads * 2 * HEAD_DIM * HEAD_KVR * sizeof(float)),
                             malloc((size_t)threads * KT_MAT_T_ROWS * HEAD_DIM * sizeof(float))};
    const double med = c.uk && c.uv && c.out && c.tmp ? median_parallel_s(pool, items, dequant_task, &c, seconds) : -1;
    kt_status st = KT_OK;
    if (med < 0)
        st = kt_err_set(err, KT_ERR_NOMEM, "out of memory for the %s heads' dequantization", kt_type_name(t));
    else
        *gelems = (double)items * 2.0 * HEAD_DIM * HEAD_KVR / med * 1e-9;
    free((void *)c.uk), free((void *)c.uv), free(c.out), free(c.tmp);
    return st;
}

struct scores_call {
    const float *keys, *vals, *q; /* (threads, ATTN_KEYS, ATTN_DK), (threads, ATTN_KEYS, HEAD_DIM), (threads, ATTN_DK) */
    float *out;                   /* (threads, HEAD_DIM + ATTN_KEYS): the output, then the scores */
};

static void scores_task(void *ctx, int64_t begin, int64_t end, int worker)
{
    const struct scores_call *c = ctx;
    const float *k[ATTN_KEYS], *v[ATTN_KEYS];
    for (int t = 0; t < ATTN_KEYS; t++) {
        k[t] = c->keys + ((size_t)worker * ATTN_KEYS + (size_t)t) * ATTN_DK;
        v[t] = c->vals + ((size_t)worker * ATTN_KEYS + (size_t)t) * HEAD_DIM;
    }
    float *out = c->out + (size_t)worker * (HEAD_DIM + ATTN_KEYS);
    for (int64_t i = begin; i < end; i++)
        kt_attention_head(out, c->q + (size_t)worker * ATTN_DK, k, v, ATTN_KEYS, ATTN_DK, HEAD_DIM, 0.07f,
                          out + HEAD_DIM);
}

/* attention_gflops: kt_attention_head's GFLOP/s, 2 (dk + dv) per key. */
static kt_status measure_attention(struct kt_pool *pool, double seconds, double *gflops, kt_err *err)
{
    const int threads = kt_pool_n_threads(pool), items = 16 * threads;
    float *keys = malloc((size_t)threads * ATTN_KEYS * ATTN_DK * sizeof(float));
    float *vals = malloc((size_t)threads * ATTN_KEYS * HEAD_DIM * sizeof(float));
    float *q = malloc((size_t)threads * ATTN_DK * sizeof(float));
    struct scores_call c = {keys, vals, q, malloc((size_t)threads * (HEAD_DIM + ATTN_KEYS) * sizeof(float))};
    double med = -1;
    if (keys && vals && q && c.out) {
        uint64_t seed = 0x9e3779b97f4a7c15ull;
        random_floats(keys, (size_t)threads * ATTN_KEYS * ATTN_DK, &seed);
        random_floats(vals, (size_t)threads * ATTN_KEYS * HEAD_DIM, &seed);
        random_floats(q, (size_t)threads * ATTN_DK, &seed);
        med = median_parallel_s(pool, items, scores_task, &c, seconds);
    }
    kt_status st = KT_OK;
    if (med < 0)
        st = kt_err_set(err, KT_ERR_NOMEM, "out of memory for the attention scores");
    else
        *gflops = (double)items * 2.0 * ATTN_KEYS * (ATTN_DK + HEAD_DIM) / med * 1e-9;
    free(keys), free(vals), free(q), free(c.out);
    return st;
}

/* ---- CUDA: memory and link ---------------------------------------------------------------- */

static kt_status measure_cuda(struct kt_machine_accel *a, double seconds, kt_err *err)
{
    struct kt_backend *b = NULL;
    const struct kt_backend_params params = {.kind = KT_BACKEND_CUDA, .name = "cuda0", .device = 0};
    kt_status st = kt_backend_create(&params, &b, err);
    if (st)
        return st;
    snprintf(a->name, sizeof a->name, "cuda0");
    a->backend = KT_PLACE_CUDA;
    a->memory_bytes = kt_backend_budget_bytes(b);
    const size_t big = (size_t)256 << 20, small = 64;
    uint8_t *host = aligned_alloc(4096, big);
    void *dev = NULL;
    if (!host || (st = kt_backend_alloc(b, big, &dev, err)) != KT_OK) {
        free(host);
        kt_backend_destroy(b);
        return st ? st : kt_err_set(err, KT_ERR_NOMEM, "cuda0: out of host memory");
    }
    memset(host, 1, big);
    const bool pinned = kt_backend_pin_host(b, host, big);
    double samples[3][256];
    for (int dir = 0; dir < 3; dir++) { /* h2d, d2h, latency (small copies in) */
        int n = 0;
        const double start = now_s();
        do {
            const double t0 = now_s();
            if (dir == 1)
                kt_backend_copy_out(b, host, dev, big);
            else
                kt_backend_copy_in(b, dev, host, dir == 0 ? big : small);
            kt_backend_sync(b);
            samples[dir][n++] = now_s() - t0;
        } while (n < 256 && (n < MIN_CALLS || now_s() - start < seconds / 3));
        qsort(samples[dir], (size_t)n, sizeof(double), cmp_double);
        const double med = samples[dir][n / 2];
        if (dir == 2)
            a->latency_us = med * 1e6;
        else
            *(dir == 0 ? &a->h2d_gbps : &a->d2h_gbps) = (double)big / med * 1e-9;
    }
    st = kt_backend_take_failure(b, err);
    if (pinned)
        kt_backend_unpin_host(b, host);
    kt_backend_free(b, dev, big);
    kt_backend_destroy(b);
    free(host);
    return st;
}

/* ---- the job ---------------------------------------------------------------------------- */

int kt_bench_machine(const struct kt_bench_options *o)
{
    int rc = 1;
    kt_err err = {0};
    struct kt_topology *topo = NULL;
    struct kt_pool *step_pool = NULL;
    struct kt_pools *pools = NULL;
    struct kt_machine *m = calloc(1, sizeof *m);
    struct place *places = calloc(KT_MACHINE_MAX_NODES + 1, sizeof *places);
    const double t_start = now_s();
    if (!m || !places) {
        kt_err_set(&err, KT_ERR_NOMEM, "out of memory");
        goto fail;
    }
    const int threads = (int)o->threads;
    /* --topology stands for KT_TOPOLOGY_SYNTHETIC for the whole run, so the kind
     * recorded names the nodes measured (and a planner under the same
     * environment sees the same kind) */
    if (o->topology && setenv("KT_TOPOLOGY_SYNTHETIC", o->topology, 1) != 0) {
        kt_err_set(&err, KT_ERR_NOMEM, "cannot set KT_TOPOLOGY_SYNTHETIC");
        goto fail;
    }
    if (kt_topology_create(o->topology, &topo, &err) != KT_OK)
        goto fail;
    const char *synthetic = o->topology ? o->topology : topo->synthetic ? getenv("KT_TOPOLOGY_SYNTHETIC") : "";
    kt_machine_this_kind(m->kind, sizeof m->kind);
    snprintf(m->topology, sizeof m->topology, "%s", synthetic ? synthetic : "");

    /* the engine's pools (runtime/forward/engine.c create_pools): the step's
     * pool; with more than one node with cores, one pool per such node,
     * threads - 1 workers in all, the stepping thread helping the first
     * when a core of its node has no worker (kt_pools_caller_helps) */
    if (kt_pool_create(threads, &step_pool, &err) != KT_OK)
        goto fail;
    int n_with_cores = 0;
    for (int i = 0; i < topo->n_nodes; i++)
        n_with_cores += topo->nodes[i].n_cores > 0;
    if (n_with_cores > KT_MACHINE_MAX_NODES) {
        kt_err_set(&err, KT_ERR_UNSUPPORTED, "%d NUMA nodes with cores; a machine file holds at most %d",
                   n_with_cores, KT_MACHINE_MAX_NODES);
        goto fail;
    }
    if (n_with_cores > 1) {
        const struct kt_pools_config cfg = {.max_threads = threads - 1 > n_with_cores ? threads - 1 : n_with_cores};
        if (kt_pools_create(topo, &cfg, &pools, &err) != KT_OK)
            goto fail;
        m->n_nodes = kt_pools_count(pools);
        for (int i = 0; i < m->n_nodes; i++) {
            places[i].pool = kt_pools_get(pools, i);
            places[i].helped = i == 0 && kt_pools_caller_helps(pools);
            places[i].threads = kt_pool_n_workers(places[i].pool) + places[i].helped;
            m->nodes[i].node = kt_pool_node(places[i].pool);
        }
    } else {
        m->n_nodes = 1;
        places[0].pool = step_pool;
        places[0].helped = true;
        places[0].threads = kt_pool_n_threads(step_pool);
        for (int i = 0; i < topo->n_nodes; i++)
            if (topo->nodes[i].n_cores > 0) {
                m->nodes[0].node = i;
                break;
            }
    }
    struct kt_meminfo mi = {0};
    kt_err mi_err;
    kt_meminfo_read(NULL, &mi, &mi_err);
    for (int i = 0; i < m->n_nodes; i++) {
        m->nodes[i].threads = (uint32_t)places[i].threads;
        const uint64_t local = topo->nodes[m->nodes[i].node].memory_bytes;
        m->nodes[i].memory_bytes = local && !topo->synthetic ? local : mi.total_bytes / (uint64_t)m->n_nodes;
        if (place_scratch(&places[i], &err) != KT_OK)
            goto fail;
    }
    /* one mapping per node for every type's slots; node 0's passes to the sim after */
    size_t need_nodes = 0, need_sim = 0;
    for (size_t k = 0; k < N_TYPES; k++) {
        int nb, ns;
        const size_t a = region_need(machine_types[k], kt_cpu_kernels()->type[machine_types[k]].packed != NULL, &nb, &ns);
        const size_t b = region_need(machine_types[k], false, &nb, &ns);
        need_nodes = a > need_nodes ? a : need_nodes;
        need_sim = b > need_sim ? b : need_sim;
    }
    for (int i = 0; i < m->n_nodes; i++)
        if (place_region(&places[i], i == 0 && need_sim > need_nodes ? need_sim : need_nodes, &err) != KT_OK)
            goto fail;
    struct place *sim = &places[m->n_nodes];
    sim->threads = 1;
    if (place_scratch(sim, &err) != KT_OK)
        goto fail;

    printf("kt-bench machine: %d threads, %.2f s per point\n", threads, o->seconds);
    printf("kind      %s\n", m->kind);
    printf("topology  %s\n\n", kt_topology_summary(topo));
    fflush(stdout);
    if (measure_refs(m, places, o->seconds, &err) != KT_OK)
        goto fail;
    printf("%-6s %7s %10s %10s %10s %10s\n", "node", "threads", "memory", "triad", "fma", "int8");
    printf("%-6s %7s %10s %10s %10s %10s\n", "", "", "GiB", "GB/s", "GFLOP/s", "GOP/s");
    for (int i = 0; i < m->n_nodes; i++) {
        const struct kt_machine_node *n = &m->nodes[i];
        printf("%-6d %7u %10.1f %10.2f %10.1f %10.1f\n", n->node, n->threads, (double)n->memory_bytes / (1 << 30),
               n->triad_gbps, n->fma_gflops, n->int8_gops);
    }
    printf("\nexperts (%d x F gate and up, F x %d down) at decode: 1 token, 1 expert of F=%d and 1, 2, 4, 8 of F,\n"
           "fitted to time = overhead + bytes / rate (err: the fit's largest miss); prefill: the FLOP rate of\n"
           "%d experts' tokens from %d to %d each, and its fixed part (the line at no tokens, as GB/s of weights)\n\n",
           HIDDEN, HIDDEN, SMALL_FF, PREFILL_EXPERTS, PREFILL_FEW, PREFILL_MANY);
    printf("%-6s %-6s %-20s %5s %10s %10s %7s %12s %10s\n", "place", "type", "layout", "F", "rate", "overhead", "err",
           "prefill", "fixed");
    printf("%-6s %-6s %-20s %5s %10s %10s %7s %12s %10s\n", "", "", "", "", "GB/s", "us", "", "GFLOP/s", "GB/s");
    fflush(stdout);

    /* CPU nodes, all at once, then the sim alone on the calling thread */
    const struct kt_cpu_kernels *table = kt_cpu_kernels();
    for (int pass = 0; pass < 2; pass++) {
        struct place *ps = pass == 0 ? places : sim;
        const int n = pass == 0 ? m->n_nodes : 1;
        if (pass == 1 && !sim->region) { /* node 0's mapping, its pages already faulted in */
            sim->region = places[0].region, sim->region_bytes = places[0].region_bytes;
            places[0].region = NULL, places[0].region_bytes = 0;
        }
        for (size_t k = 0; k < N_TYPES; k++) {
            const enum kt_type t = machine_types[k];
            if (!kt_mat_kernels_for(t) || !kt_type_traits(t)->from_float)
                continue;
            struct kt_machine_rate rates[KT_MACHINE_MAX_NODES];
            double prefill[KT_MACHINE_MAX_NODES], fixed[KT_MACHINE_MAX_NODES];
            struct type_result res = {0};
            if (measure_type(ps, n, t, pass == 0 && table->type[t].packed != NULL, o->seconds, rates, prefill, fixed,
                             &res, &err) != KT_OK)
                goto fail;
            for (int i = 0; i < n; i++) {
                char label[16];
                if (pass == 0) {
                    m->nodes[i].decode[t] = rates[i];
                    m->nodes[i].prefill_gflops[t] = prefill[i];
                    m->nodes[i].prefill_fixed_gbps[t] = fixed[i];
                    snprintf(label, sizeof label, "node%d", m->nodes[i].node);
                } else {
                    m->accel[0].decode[t] = rates[i];
                    m->accel[0].prefill_gflops[t] = prefill[i];
                    m->accel[0].prefill_fixed_gbps[t] = fixed[i];
                    snprintf(label, sizeof label, "sim");
                }
                printf("%-6s %-6s %-20s %5lld %10.2f %10.1f %7.3f %12.1f %10.1f\n", label, kt_type_name(t), res.layout,
                       (long long)res.n_ff, rates[i].gbps, rates[i].overhead_us, res.max_err, prefill[i], fixed[i]);
            }
            fflush(stdout);
        }
    }

    /* host matrices (attention heads) run on the step's pool and read the
     * first node's memory: node 0's figures, with the node pools idle as
     * they are during attention */
    printf("\nattention heads on the step's pool (%d threads): W_UK,h and W_UV,h (512 x 128, 128 x 512) in GGUF\n"
           "rows, one token, 8 to 128 heads a call, fitted as above; f32 products over a head pair in cache\n\n",
           kt_pool_n_threads(step_pool));
    printf("%-6s %-6s %10s %10s %7s\n", "place", "type", "rate", "overhead", "err");
    printf("%-6s %-6s %10s %10s %7s\n", "", "", "GB/s", "us", "");
    for (size_t k = 0; k < N_TYPES; k++) {
        const enum kt_type t = machine_types[k];
        if (!kt_mat_kernels_for(t) || !kt_type_traits(t)->from_float || !kt_type_row_bytes(t, HEAD_DIM))
            continue; /* K-quants: a head's 128-wide rows are not whole blocks */
        double e = 0;
        if (measure_rows(step_pool, sim->region, sim->region_bytes, t, o->seconds, &m->nodes[0].decode_rows[t], &e,
                         &err) != KT_OK)
            goto fail;
        printf("node%-2d %-6s %10.2f %10.1f %7.3f\n", m->nodes[0].node, kt_type_name(t), m->nodes[0].decode_rows[t].gbps,
               m->nodes[0].decode_rows[t].overhead_us, e);
    }
    if (measure_cached(step_pool, o->seconds, &m->nodes[0].f32_cached_gbps, &err) != KT_OK)
        goto fail;
    printf("node%-2d %-6s %10.2f   (head pair in cache, every thread)\n", m->nodes[0].node, "f32", m->nodes[0].f32_cached_gbps);
    /* the expanded form's dequantized heads and scores, as attention.c runs them */
    for (size_t k = 0; k < N_TYPES; k++) {
        const enum kt_type t = machine_types[k];
        if (!kt_mat_kernels_for(t) || !kt_type_traits(t)->from_float || !kt_type_row_bytes(t, HEAD_DIM))
            continue;
        if (measure_head_dequant(step_pool, t, o->seconds, &m->nodes[0].head_dequant_gelems[t], &err) != KT_OK)
            goto fail;
        printf("node%-2d %-6s %10.2f   (G weights/s dequantized, a head pair each thread)\n", m->nodes[0].node,
               kt_type_name(t), m->nodes[0].head_dequant_gelems[t]);
    }
    if (measure_attention(step_pool, o->seconds, &m->nodes[0].attention_gflops, &err) != KT_OK)
        goto fail;
    printf("node%-2d %-6s %10.2f   (GFLOP/s of scores and sums, %d keys, every thread)\n", m->nodes[0].node, "f32",
           m->nodes[0].attention_gflops, ATTN_KEYS);
    printf("\nmatrices in GGUF rows on the step's pool at prefill (what a sim device's attention runs on):\n"
           "the four MLA projections of V3 / Kimi-K2, 16 and 64 tokens, GFLOP/s of the extra tokens\n\n");
    for (size_t k = 0; k < N_TYPES; k++) {
        const enum kt_type t = machine_types[k];
        if (!kt_mat_kernels_for(t) || !kt_type_traits(t)->from_float)
            continue;
        if (measure_prefill_rows(step_pool, t, o->seconds, &m->nodes[0].prefill_rows_gflops[t],
                                 &m->nodes[0].prefill_rows_fixed_gbps[t], &err) != KT_OK)
            goto fail;
        printf("node%-2d %-6s %10.1f GFLOP/s %10.1f GB/s fixed\n", m->nodes[0].node, kt_type_name(t),
               m->nodes[0].prefill_rows_gflops[t], m->nodes[0].prefill_rows_fixed_gbps[t]);
    }
    fflush(stdout);

    /* accelerators: the sim's modelled link, then CUDA if there is one */
    m->n_accel = 1;
    snprintf(m->accel[0].name, sizeof m->accel[0].name, "sim");
    m->accel[0].backend = KT_PLACE_SIM;
    m->accel[0].shares_host = true;
    m->accel[0].h2d_gbps = m->accel[0].d2h_gbps = o->sim_transfer_gbps;
    m->accel[0].latency_us = o->sim_latency_us;
    printf("\n%-6s %-7s %10s %10s %10s %10s\n", "accel", "backend", "memory", "h2d", "d2h", "latency");
    printf("%-6s %-7s %10s %10s %10s %10s\n", "", "", "GiB", "GB/s", "GB/s", "us");
    printf("%-6s %-7s %10s %10.2f %10.2f %10.1f   modelled link; kernels above, on one host thread\n", "sim", "sim",
           "plan's", m->accel[0].h2d_gbps, m->accel[0].d2h_gbps, m->accel[0].latency_us);
    kt_err cuda_err = {0};
    if (kt_backend_available(KT_BACKEND_CUDA, &cuda_err) == KT_OK) {
        struct kt_machine_accel *a = &m->accel[m->n_accel];
        if (measure_cuda(a, o->seconds, &err) != KT_OK)
            goto fail;
        m->n_accel++;
        printf("%-6s %-7s %10.1f %10.2f %10.2f %10.1f   measured with the backend's copies; kernels not measured\n",
               a->name, "cuda", (double)a->memory_bytes / (1 << 30), a->h2d_gbps, a->d2h_gbps, a->latency_us);
    } else {
        printf("no CUDA device: skipped (%s)\n", cuda_err.msg);
    }

    if (o->output) {
        if (kt_machine_save(m, o->output, &err) != KT_OK)
            goto fail;
        printf("\nwrote %s (%.0f s)\n", o->output, now_s() - t_start);
    } else {
        printf("\n(%.0f s; -o FILE writes the machine file)\n", now_s() - t_start);
    }
    rc = 0;
    goto done;
fail:
    fprintf(stderr, "kt-bench: %s\n", err.msg);
done:
    for (int i = 0; places && i <= KT_MACHINE_MAX_NODES; i++)
        place_free(&places[i]);
    kt_pools_destroy(pools);
    kt_pool_destroy(step_pool);
    kt_topology_destroy(topo);
    free(places);
    free(m);
    return rc;
}
