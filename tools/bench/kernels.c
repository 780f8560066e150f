/*
 * kernels.c - `kt-bench kernels`: a STREAM triad and the compute peaks, then
 * each CPU kernel per weight type and instruction set at two shapes:
 *
 *   decode   gemv of one activation over 2048 x 7168 matrices ("experts"),
 *            enough of them to be four times the L3: weight GB/s, / triad
 *   prefill  T tokens (128) over one 2048 x 7168 matrix: GFLOP/s counting
 *            2 x 7168 x 2048 x T, / the int8 dot peak (quantized types) or
 *            the FMA peak (float types); the table's gemm row where it has
 *            one, else gemv per token over blocks of rows
 *   float    F32 and BF16 prefill (T and 4T tokens): kt's gemm as kt_matmul_q
 *            runs it against oneDNN's sgemm (runtime/forward/onednn_gemm.c), GFLOP/s
 *            and / the FMA peak
 *   packed   each level's packed expert layout (kernels/cpu/packed.h) of Q4_K,
 *            Q8_0 and Q4_0 at the
 *            decode shape (1 token, GB/s of packed weights, / triad) and at
 *            16 and 32 tokens over one matrix (the prefill of 128 tokens over
 *            64 experts top-8, and twice that), / that level's int8 dot peak
 *
 * Weights are real blocks (random rows quantized by the type's reference
 * quantizer, tiled), activations are converted by the kernel's own
 * quantize_act outside the timed region.  Levels whose rows are the same
 * functions as a lower level's are named, not measured twice.  It never
 * reports a ratio to a reference it did not measure in this run.
 */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "bench.h"
#include "cpu/dispatch.h"
#ifdef KT_HAVE_AMX_KERNELS
#include "cpu/amx/packed_amx.h"
#endif
#include "membw.h"
#include "onednn_gemm.h"
#include "peak.h"
#include "quant.h"
#include "pool.h"

#define ROWS 2048           /* rows per matrix: an expert's gate or up projection */
#define COLS 7168           /* elements per row: DeepSeek-V3 / Kimi-K2 hidden size */
#define FILL_ROWS 16        /* distinct rows quantized, then tiled over the matrices */
#define DECODE_TASK_ROWS 64
#define PREFILL_TASK_ROWS 16

static const enum kt_type bench_types[] = {KT_TYPE_Q4_K, KT_TYPE_Q5_K, KT_TYPE_Q6_K, KT_TYPE_Q8_0,
                                           KT_TYPE_BF16, KT_TYPE_F16, KT_TYPE_F32, KT_TYPE_MXFP4,
                                           KT_TYPE_FP8_B128};
#define N_TYPES (sizeof bench_types / sizeof bench_types[0])

/* ---- references ----------------------------------------------------------------- */

static size_t l3_bytes(void)
{
    long v = sysconf(_SC_LEVEL3_CACHE_SIZE);
    if (v > 0)
        return (size_t)v;
    FILE *f = fopen("/sys/devices/system/cpu/cpu0/cache/index3/size", "r");
    unsigned long kib = 0;
    if (f) {
        if (fscanf(f, "%luK", &kib) != 1)
            kib = 0;
        fclose(f);
    }
    return (size_t)kib << 10;
}

/* Bytes the decode matrices must exceed: four times the L3 (so LRU leftovers
 * in the L3 are a small share), at least 256 MiB. */
static size_t decode_working_set(void)
{
    size_t ws = 4 * l3_bytes();
    return ws < ((size_t)256 << 20) ? (size_t)256 << 20 : ws;
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

/* ---- timed shapes ------------------------------------------------------------------ */

struct shape_job {
    const struct kt_cpu_type_kernels *k;
    const uint8_t *w;           /* (n_rows, row_bytes) */
    size_t row_bytes;
    int64_t n_rows;
    const uint8_t *act;         /* (n_tok, act_bytes) */
    size_t act_bytes;
    int64_t n_tok;
    float *out;                 /* (n_tok, n_rows) */
};

static void decode_task(void *ctx, int64_t begin, int64_t end, int thread)
{
    (void)thread;
    const struct shape_job *j = ctx;
    for (int64_t b = begin; b < end; b++) {
        int64_t r0 = b * DECODE_TASK_ROWS;
        int64_t n = r0 + DECODE_TASK_ROWS <= j->n_rows ? DECODE_TASK_ROWS : j->n_rows - r0;
        j->k->gemv(COLS, j->out + r0, j->w + (size_t)r0 * j->row_bytes, j->row_bytes, j->act, n);
    }
}

static void prefill_task(void *ctx, int64_t begin, int64_t end, int thread)
{
    (void)thread;
    const struct shape_job *j = ctx;
    for (int64_t b = begin; b < end; b++) {
        int64_t r0 = b * PREFILL_TASK_ROWS;
        int64_t n = r0 + PREFILL_TASK_ROWS <= j->n_rows ? PREFILL_TASK_ROWS : j->n_rows - r0;
        const uint8_t *w = j->w + (size_t)r0 * j->row_bytes;
        if (j->k->gemm) {
            j->k->gemm(COLS, w, j->row_bytes, n, j->act, j->act_bytes, j->n_tok, j->out + r0, j->n_rows);
        } else {
            for (int64_t t = 0; t < j->n_tok; t++)
                j->k->gemv(COLS, j->out + t * j->n_rows + r0, w, j->row_bytes, j->act + (size_t)t * j->act_bytes,
                           n);
        }
    }
}

/* Passes until `seconds` have gone (at least one); the fastest pass's seconds. */
static double best_pass(struct kt_pool *pool, int64_t n_tasks, kt_pool_fn fn, void *j, double seconds,
                        int *passes)
{
    double best = INFINITY, start = kt_bench_now_seconds();
    *passes = 0;
    do {
        double t0 = kt_bench_now_seconds();
        kt_pool_parallel_for(pool, n_tasks, 1, fn, j);
        double t = kt_bench_now_seconds() - t0;
        best = t < best ? t : best;
        ++*passes;
    } while (kt_bench_now_seconds() - start < seconds);
    return best;
}

/* A buffer of n_rows weight rows of `type`: FILL_ROWS random rows quantized, tiled. */
static uint8_t *make_weights(enum kt_type type, int64_t n_rows, size_t row_bytes, uint64_t *seed)
{
    const struct kt_type_traits *tr = kt_type_traits(type);
    const size_t huge = (size_t)2 << 20, bytes = ((size_t)n_rows * row_bytes + huge - 1) & ~(huge - 1);
    uint8_t *w = aligned_alloc(huge, bytes);
    float *x = malloc(COLS * sizeof(float));
    if (!w || !x) {
        free(w), free(x);
        return NULL;
    }
    madvise(w, bytes, MADV_HUGEPAGE); /* a hint: fewer page faults filling a GiB; fine if refused */
    for (int64_t r = 0; r < FILL_ROWS && r < n_rows; r++) {
        random_floats(x, COLS, seed);
        tr->from_float(x, w + (size_t)r * row_bytes, COLS);
    }
    for (int64_t r = FILL_ROWS; r < n_rows; r += FILL_ROWS) {
        int64_t n = r + FILL_ROWS <= n_rows ? FILL_ROWS : n_rows - r;
        memcpy(w + (size_t)r * row_bytes, w, (size_t)n * row_bytes);
    }
    free(x);
    return w;
}

/* n_tok random activation rows converted by the kernel's quantize_act: (n_tok, act_bytes). */
static uint8_t *make_acts(const struct kt_cpu_type_kernels *k, int64_t n_tok, size_t act_bytes, uint64_t *seed)
{
    uint8_t *a = aligned_alloc(64, ((size_t)n_tok * act_bytes + 63) & ~(size_t)63);
    float *x = malloc(COLS * sizeof(float));
    if (!a || !x) {
        free(a), free(x);
        return NULL;
    }
    for (int64_t t = 0; t < n_tok; t++) {
        random_floats(x, COLS, seed);
        k->quantize_act(x, a + (size_t)t * act_bytes, COLS);
    }
    free(x);
    return a;
}

/* ---- the job ------------------------------------------------------------------------ */

struct kernel_result {
    enum kt_type type;
    enum kt_isa isa;
    uint64_t decode_bytes;
    int decode_experts, decode_passes, prefill_passes;
    double decode_gbps, prefill_gflops;
    bool prefill_gemm;
};

/* A level whose rows for every benchmarked type are a lower level's: that level, else -1. */
static int same_as_lower(const struct kt_cpu_kernels *t)
{
    for (int lower = 0; lower < (int)t->isa; lower++) {
        const struct kt_cpu_kernels *l = kt_cpu_kernels_for((enum kt_isa)lower);
        bool same = l != NULL;
        for (size_t i = 0; same && i < N_TYPES; i++) {
            const struct kt_cpu_type_kernels *a = &t->type[bench_types[i]], *b = &l->type[bench_types[i]];
            same = a->gemv == b->gemv && a->gemm == b->gemm && a->quantize_act == b->quantize_act;
        }
        if (same)
            return lower;
    }
    return -1;
}

/* Experts of the decode shape for a type: enough 2048 x 7168 matrices to fill the working set. */
static int decode_experts(enum kt_type type)
{
    const size_t matrix_bytes = kt_type_row_bytes(type, COLS) * ROWS;
    return (int)((decode_working_set() + matrix_bytes - 1) / matrix_bytes);
}

/* Both shapes for one kernel row over w: (decode_experts(type) * ROWS, row_bytes). */
static kt_status measure_kernel(struct kt_pool *pool, const struct kt_cpu_type_kernels *k, enum kt_type type,
                                const uint8_t *w, const struct kt_bench_options *o, struct kernel_result *r)
{
    const size_t row_bytes = kt_type_row_bytes(type, COLS);
    const size_t act_bytes = kt_type_row_bytes(k->vec_dot_type, COLS);
    const int experts = decode_experts(type);
    uint64_t seed = 0x9e3779b97f4a7c15ull ^ (uint64_t)type;
    kt_status st = KT_ERR_NOMEM;

    /* decode: one activation over `experts` matrices */
    const int64_t n_rows = (int64_t)experts * ROWS;
    const int64_t T = o->prefill_tokens;
    uint8_t *act = make_acts(k, T, act_bytes, &seed);
    float *out = malloc((size_t)(n_rows > T * ROWS ? n_rows : T * ROWS) * sizeof(float));
    if (!act || !out)
        goto done;
    struct shape_job j = {k, w, row_bytes, n_rows, act, act_bytes, 1, out};
    int64_t tasks = (n_rows + DECODE_TASK_ROWS - 1) / DECODE_TASK_ROWS;
    double t = best_pass(pool, tasks, decode_task, &j, o->seconds, &r->decode_passes);
    r->decode_bytes = (uint64_t)n_rows * row_bytes;
    r->decode_experts = experts;
    r->decode_gbps = (double)r->decode_bytes / t * 1e-9;

    /* prefill: T tokens over the first matrix, after one untimed pass brings it into cache */
    j = (struct shape_job){k, w, row_bytes, ROWS, act, act_bytes, T, out};
    tasks = (ROWS + PREFILL_TASK_ROWS - 1) / PREFILL_TASK_ROWS;
    kt_pool_parallel_for(pool, tasks, 1, prefill_task, &j);
    t = best_pass(pool, tasks, prefill_task, &j, o->seconds, &r->prefill_passes);
    r->prefill_gflops = 2.0 * COLS * ROWS * (double)T / t * 1e-9;
    r->prefill_gemm = k->gemm != NULL;
    st = KT_OK;
done:
    free(act), free(out);
    return st;
}

/* ---- float weights: kt's gemm against oneDNN --------------------------------------- */

/* Tasks of this many rows, as kt_matmul_q slices: its largest for kt's gemm,
 * its fixed one for oneDNN. */
#define FLOAT_TASK_ROWS 64
#define ONEDNN_TASK_ROWS 128

/* Prefill of F32 or BF16 weights over one ROWS x COLS matrix, one way. */
struct float_job {
    enum kt_type type;
    const struct kt_cpu_type_kernels *k; /* NULL: oneDNN */
    const uint8_t *w;                    /* (ROWS, row_bytes) */
    size_t row_bytes;
    const float *act;                    /* (n_tok, COLS) */
    int64_t n_tok;
    int64_t task_rows;
    float *out;                          /* (n_tok, ROWS) */
    _Atomic int failed;
};

static void float_task(void *ctx, int64_t begin, int64_t end, int thread)
{
    (void)thread;
    struct float_job *j = ctx;
    for (int64_t b = begin; b < end; b++) {
        const int64_t r0 = b * j->task_rows, n = r0 + j->task_rows <= ROWS ? j->task_rows : ROWS - r0;
        const uint8_t *w = j->w + (size_t)r0 * j->row_bytes;
        kt_status st = KT_OK;
        if (j->k)
            j->k->gemm(COLS, w, j->row_bytes, n, j->act, COLS * sizeof(float), j->n_tok, j->out + r0, ROWS);
        else if (j->type == KT_TYPE_F32)
            st = kt_onednn_gemm_f32(COLS, (const float *)w, COLS, n, j->act, COLS, j->n_tok, j->out + r0, ROWS, NULL);
        else
            st = kt_onednn_gemm_bf16(COLS, (const kt_bf16 *)w, COLS, n, j->act, COLS, j->n_tok, j->out + r0, ROWS,
                                     NULL);
        if (st != KT_OK)
            j->failed = 1;
    }
}

/*
 * F32 and BF16 weights at T and 4T tokens, both ways: kt's gemm row (the
 * selected level's) and oneDNN's sgemm (runtime/forward/onednn_gemm.c), each in tasks
 * of rows as kt_matmul_q runs it: printed,
 * and appended to jout.
 */
static kt_status measure_float_prefill(struct kt_pool *pool, const struct kt_bench_options *o, double fma_peak,
                                       json_t *jout, kt_err *err)
{
    const enum kt_type types[] = {KT_TYPE_F32, KT_TYPE_BF16};
    const struct kt_cpu_kernels *table = kt_cpu_kernels();
    const int64_t max_tok = 4 * (int64_t)o->prefill_tokens;
    printf("\nprefill of float weights: %d x %d matrix, in tasks of rows as kt_matmul_q: kt gemm (%s) %d rows, "
           "oneDNN sgemm %d rows\n\n",
           ROWS, COLS, kt_isa_name(table->isa), FLOAT_TASK_ROWS, ONEDNN_TASK_ROWS);
    printf("%-6s %-7s %7s %14s %7s\n", "type", "path", "tokens", "GFLOP/s", "/peak");
    kt_status st = KT_OK;
    for (size_t i = 0; i < sizeof types / sizeof types[0] && st == KT_OK; i++) {
        const enum kt_type type = types[i];
        const struct kt_cpu_type_kernels *k = &table->type[type];
        const size_t row_bytes = kt_type_row_bytes(type, COLS);
        uint64_t seed = 0x51ed270b27a4c5d3ull ^ (uint64_t)type;
        uint8_t *w = make_weights(type, ROWS, row_bytes, &seed);
        uint8_t *act = make_acts(k, max_tok, COLS * sizeof(float), &seed);
        float *out = malloc((size_t)(max_tok * ROWS) * sizeof(float));
        if (!w || !act || !out) {
            st = kt_err_set(err, KT_ERR_NOMEM, "cannot allocate the %s float prefill", kt_type_name(type));
            goto next;
        }
        for (int64_t T = o->prefill_tokens; T <= max_tok && st == KT_OK; T *= 4)
            for (int onednn = 0; onednn < 2; onednn++) {
                struct float_job j = {type, onednn ? NULL : k, w, row_bytes, (const float *)act, T,
                                      onednn ? ONEDNN_TASK_ROWS : FLOAT_TASK_ROWS, out, 0};
                const int64_t tasks = (ROWS + j.task_rows - 1) / j.task_rows;
                int passes = 0;
                kt_pool_parallel_for(pool, tasks, 1, float_task, &j); /* untimed: weights into cache */
                const double t = best_pass(pool, tasks, float_task, &j, o->seconds, &passes);
                if (j.failed) {
                    st = kt_err_set(err, KT_ERR_INVALID, "oneDNN failed on the %s float prefill", kt_type_name(type));
                    break;
                }
                const double gflops = 2.0 * COLS * ROWS * (double)T / t * 1e-9;
                const char *path = onednn ? "onednn" : kt_isa_name(table->isa);
                printf("%-6s %-7s %7lld %14.2f %7.3f\n", kt_type_name(type), path, (long long)T, gflops,
                       fma_peak > 0 ? gflops / fma_peak : 0.0);
                fflush(stdout);
                json_t *jr = json_object();
                json_object_set_new(jr, "type", json_string(kt_type_name(type)));
                json_object_set_new(jr, "path", json_string(path));
                json_object_set_new(jr, "tokens", json_integer(T));
                json_object_set_new(jr, "task_rows", json_integer(j.task_rows));
                json_object_set_new(jr, "passes", json_integer(passes));
                json_object_set_new(jr, "gflops", json_real(gflops));
                if (fma_peak > 0)
                    json_object_set_new(jr, "ratio_to_peak", json_real(gflops / fma_peak));
                json_array_append_new(jout, jr);
            }
    next:
        free(w), free(act), free(out);
    }
    return st;
}

/* ---- packed expert layouts --------------------------------------------------------- */

/* Rows per gemm call: a whole number of groups for every format, and enough
 * that a call's per-token setup is a small share of it. */
#define PACKED_TASK_ROWS 256
/* Bytes of each array of the triads measured beside each packed decode row
 * (three arrays, each 4 x a 32 MiB L3: STREAM's rule). */
#define ADJ_TRIAD_BYTES ((size_t)128 << 20)

/* Tokens per expert matrix at prefill: 128 tokens x top-8 over 64 experts, and twice that. */
static const int64_t packed_tokens[] = {16, 32, 64};
#define N_PACKED_TOKENS (sizeof packed_tokens / sizeof packed_tokens[0])

struct packed_job {
    const struct kt_packed_format *f;
    const uint8_t *w;   /* n_rows packed rows of COLS */
    int64_t n_rows;
    const uint8_t *act; /* (n_tok, act_bytes) */
    size_t act_bytes;
    int64_t n_tok;
    float *out;         /* (n_tok, n_rows) */
};

static void packed_task(void *ctx, int64_t begin, int64_t end, int thread)
{
    (void)thread;
    const struct packed_job *j = ctx;
    for (int64_t b = begin; b < end; b++) {
        const int64_t r0 = b * PACKED_TASK_ROWS;
        const int64_t n = r0 + PACKED_TASK_ROWS <= j->n_rows ? PACKED_TASK_ROWS : j->n_rows - r0;
        j->f->gemm(COLS, kt_packed_rows(j->f, j->w, COLS, r0), n, j->act, j->act_bytes, j->n_tok, j->out + r0,
                   j->n_rows);
    }
}

/* The int8 dot peak measured at a level in this run; 0 if none was. */
static double peak_at(const struct kt_peak_result *peaks, int n_peaks, enum kt_peak_kind kind, enum kt_isa isa)
{
    for (int i = 0; i < n_peaks; i++)
        if (peaks[i].kind == kind && peaks[i].isa == isa)
            return peaks[i].best_gops;
    return 0.0;
}

static double int8_peak_at(const struct kt_peak_result *peaks, int n_peaks, enum kt_isa isa)
{
    return peak_at(peaks, n_peaks, KT_PEAK_DOT_INT8, isa);
}

/* One row of the packed table: format f of `type` at level isa (its kernels
 * table), decode and prefill at packed_tokens, printed and appended to jout. */
static kt_status packed_row(struct kt_pool *pool, const struct kt_bench_options *o, const struct kt_packed_format *f,
                            enum kt_isa isa, enum kt_type type, const uint8_t *w, size_t row_bytes, uint64_t *seed_io,
                            double triad_gbps, const struct kt_peak_result *peaks, int n_peaks, json_t *jout,
                            kt_err *err)
{
    const struct kt_cpu_kernels *table = kt_cpu_kernels_for(isa);
    const int64_t max_tok = packed_tokens[N_PACKED_TOKENS - 1];
    uint64_t seed = *seed_io;
    kt_status st = KT_OK;
    const struct kt_cpu_type_kernels *k = &table->type[type];
    const size_t act_bytes = kt_type_row_bytes(k->vec_dot_type, COLS);
    const size_t matrix_bytes = kt_packed_bytes(f, COLS, ROWS);
    const int experts = decode_experts(type);
    const size_t huge = (size_t)2 << 20, bytes = ((size_t)experts * matrix_bytes + huge - 1) & ~(huge - 1);
    uint8_t *packed = aligned_alloc(huge, bytes), *act = make_acts(k, max_tok, act_bytes, &seed);
    float *out = malloc((size_t)experts * ROWS * sizeof(float));
    if (!packed || !act || !out) {
        st = kt_err_set(err, KT_ERR_NOMEM, "cannot allocate the packed %s matrices", f->name);
        goto done;
    }
    madvise(packed, bytes, MADV_HUGEPAGE);
    f->pack(COLS, w, row_bytes, ROWS, packed);
    for (int e = 1; e < experts; e++) /* whole groups: the experts' rows packed back to back */
        memcpy(packed + (size_t)e * matrix_bytes, packed, matrix_bytes);

    int decode_passes = 0, prefill_passes[N_PACKED_TOKENS];
    double prefill_gflops[N_PACKED_TOKENS];
    /* triads just before and after the decode pass, beside the run's first one: on a
     * shared machine the bandwidth moves between the start and this row */
    struct kt_triad_result before, after;
    if ((st = kt_stream_triad(ADJ_TRIAD_BYTES, kt_pool_n_threads(pool), 3, &before, err)) != KT_OK)
        goto done;
    struct packed_job j = {f, packed, (int64_t)experts * ROWS, act, act_bytes, 1, out};
    double t = best_pass(pool, (j.n_rows + PACKED_TASK_ROWS - 1) / PACKED_TASK_ROWS, packed_task, &j,
                         o->seconds, &decode_passes);
    if ((st = kt_stream_triad(ADJ_TRIAD_BYTES, kt_pool_n_threads(pool), 3, &after, err)) != KT_OK)
        goto done;
    const double adj_triad = 0.5 * (before.best_gbps + after.best_gbps);
    const double decode_gbps = (double)experts * (double)matrix_bytes / t * 1e-9;
    for (size_t ti = 0; ti < N_PACKED_TOKENS; ti++) {
        j = (struct packed_job){f, packed, ROWS, act, act_bytes, packed_tokens[ti], out};
        const int64_t tasks = (ROWS + PACKED_TASK_ROWS - 1) / PACKED_TASK_ROWS;
        kt_pool_parallel_for(pool, tasks, 1, packed_task, &j); /* untimed: the matrix into cache */
        t = best_pass(pool, tasks, packed_task, &j, o->seconds, &prefill_passes[ti]);
        prefill_gflops[ti] = 2.0 * COLS * ROWS * (double)packed_tokens[ti] / t * 1e-9;
    }

    const double peak = int8_peak_at(peaks, n_peaks, (enum kt_isa)isa);
    char ratio[N_PACKED_TOKENS][16];
    for (size_t ti = 0; ti < N_PACKED_TOKENS; ti++) {
        strcpy(ratio[ti], "-");
        if (peak > 0)
            snprintf(ratio[ti], sizeof ratio[ti], "%.3f", prefill_gflops[ti] / peak);
    }
    char peak_name[32];
    snprintf(peak_name, sizeof peak_name, "%s %s", kt_peak_kind_name(KT_PEAK_DOT_INT8),
             peak > 0 ? kt_isa_name((enum kt_isa)isa) : "(none)");
    printf("%-20s %-7s %9.2f %7.3f %8.0f", f->name, kt_isa_name((enum kt_isa)isa), decode_gbps,
           decode_gbps / triad_gbps, (double)experts * (double)matrix_bytes / (1 << 20));
    for (size_t ti = 0; ti < N_PACKED_TOKENS; ti++)
        printf(" %10.2f %7s", prefill_gflops[ti], ratio[ti]);
    printf(" %-15s %9.2f %7.3f\n", peak_name, adj_triad, decode_gbps / adj_triad);
    fflush(stdout);

    json_t *jr = json_object();
    json_object_set_new(jr, "format", json_string(f->name));
    json_object_set_new(jr, "type", json_string(kt_type_name(type)));
    json_object_set_new(jr, "isa", json_string(kt_isa_name((enum kt_isa)isa)));
    json_object_set_new(jr, "rows_per_group", json_integer(f->rows));
    json_object_set_new(jr, "exact", json_boolean(f->exact));
    json_object_set_new(jr, "task_rows", json_integer(PACKED_TASK_ROWS));
    json_t *jd = json_object();
    json_object_set_new(jd, "weight_bytes", json_integer((json_int_t)((size_t)experts * matrix_bytes)));
    json_object_set_new(jd, "experts", json_integer(experts));
    json_object_set_new(jd, "passes", json_integer(decode_passes));
    json_object_set_new(jd, "gbps", json_real(decode_gbps));
    json_object_set_new(jd, "ratio_to_triad", json_real(decode_gbps / triad_gbps));
    json_object_set_new(jd, "adjacent_triad_gbps", json_real(adj_triad));
    json_object_set_new(jd, "ratio_to_adjacent_triad", json_real(decode_gbps / adj_triad));
    json_object_set_new(jr, "decode", jd);
    json_t *jp = json_array();
    for (size_t ti = 0; ti < N_PACKED_TOKENS; ti++) {
        json_t *jt = json_object();
        json_object_set_new(jt, "tokens", json_integer(packed_tokens[ti]));
        json_object_set_new(jt, "passes", json_integer(prefill_passes[ti]));
        json_object_set_new(jt, "gflops", json_real(prefill_gflops[ti]));
        json_object_set_new(jt, "peak", json_string(kt_peak_kind_name(KT_PEAK_DOT_INT8)));
        if (peak > 0) {
            json_object_set_new(jt, "peak_isa", json_string(kt_isa_name((enum kt_isa)isa)));
            json_object_set_new(jt, "ratio_to_peak", json_real(prefill_gflops[ti] / peak));
        }
        json_array_append_new(jp, jt);
    }
    json_object_set_new(jr, "prefill", jp);
    json_array_append_new(jout, jr);
done:
    free(packed), free(act), free(out);
    *seed_io = seed;
    return st;
}

/*
 * For each level's packed format of Q4_K, Q8_0 and Q4_0 (a level whose format is a
 * lower level's is skipped; at the amx level also its .tiles formats, the tiles at
 * every token count): decode over as many packed 2048 x 7168 matrices
 * as the decode shape of the GGUF rows, and prefill at packed_tokens over the
 * first, in tasks of PACKED_TASK_ROWS rows: printed, and appended to jout.
 */
static kt_status measure_packed(struct kt_pool *pool, const struct kt_bench_options *o, double triad_gbps,
                                const struct kt_peak_result *peaks, int n_peaks, json_t *jout, kt_err *err)
{
    const enum kt_type types[] = {KT_TYPE_Q4_K, KT_TYPE_Q8_0, KT_TYPE_Q4_0}; /* Q4_0: Kimi-K2's INT4 experts */
    const enum kt_isa isa_max = kt_cpu_kernels()->isa_max;
    printf("\npacked expert layouts: decode 1 token over >= %zu MiB of packed matrices; prefill", decode_working_set() >> 20);
    for (size_t ti = 0; ti < N_PACKED_TOKENS; ti++)
        printf("%s %lld", ti == 0 ? "" : ti + 1 == N_PACKED_TOKENS ? " and" : ",", (long long)packed_tokens[ti]);
    printf(" tokens x one matrix; %d rows per call\n\n", PACKED_TASK_ROWS);
    printf("%-20s %-7s %9s %7s %8s", "format", "isa", "decode", "/triad", "weights");
    for (size_t ti = 0; ti < N_PACKED_TOKENS; ti++) {
        char col[16];
        snprintf(col, sizeof col, "prefill%lld", (long long)packed_tokens[ti]);
        printf(" %10s %7s", col, "/peak");
    }
    printf(" %-15s %9s %7s\n", "peak", "adj triad", "/adj");
    printf("%-20s %-7s %9s %7s %8s", "", "", "GB/s", "", "MiB");
    for (size_t ti = 0; ti < N_PACKED_TOKENS; ti++)
        printf(" %10s %7s", "GFLOP/s", "");
    printf(" %-15s %9s\n", "", "GB/s");
    kt_status st = KT_OK;
    for (size_t i = 0; i < sizeof types / sizeof types[0] && st == KT_OK; i++) {
        const enum kt_type type = types[i];
        const size_t row_bytes = kt_type_row_bytes(type, COLS);
        uint64_t seed = 0x6a09e667f3bcc909ull ^ (uint64_t)type;
        uint8_t *w = make_weights(type, ROWS, row_bytes, &seed);
        if (!w)
            return kt_err_set(err, KT_ERR_NOMEM, "cannot allocate the %s matrix", kt_type_name(type));
        for (int isa = 0; isa <= (int)isa_max && st == KT_OK; isa++) {
            const struct kt_cpu_kernels *table = kt_cpu_kernels_for((enum kt_isa)isa);
            const struct kt_packed_format *f = table ? table->type[type].packed : NULL;
            bool seen = false;
            for (int lower = 0; f && lower < isa; lower++)
                seen = seen || kt_cpu_kernels_for((enum kt_isa)lower)->type[type].packed == f;
            if (!f || seen || (o->isa_mask && !(o->isa_mask & (1u << isa))))
                continue;
            st = packed_row(pool, o, f, (enum kt_isa)isa, type, w, row_bytes, &seed, triad_gbps, peaks, n_peaks, jout,
                            err);
#ifdef KT_HAVE_AMX_KERNELS
            const struct kt_packed_format *tiles = type == KT_TYPE_Q4_K   ? &kt_packed_q4_K_amx_tiles
                                                   : type == KT_TYPE_Q8_0 ? &kt_packed_q8_0_amx_tiles
                                                                          : &kt_packed_q4_0_amx_tiles;
            if (st == KT_OK && isa == KT_ISA_AMX && strstr(f->name, ".amx"))
                st = packed_row(pool, o, tiles, (enum kt_isa)isa, type, w, row_bytes, &seed, triad_gbps, peaks,
                                n_peaks, jout, err);
#endif
        }
        free(w);
    }
    return st;
}

int kt_bench_kernels(const struct kt_bench_options *o)
{
    int rc = 1;
    kt_err err = {0};
    struct kt_pool *pool = NULL;
    struct kernel_result *results = NULL;
    json_t *root = json_object();
    const int threads = (int)o->threads;

    /* references */
    struct kt_triad_result triad;
    const int triad_repeats = 5;
    if (kt_stream_triad(0, threads, triad_repeats, &triad, &err) != KT_OK)
        goto fail;
    struct kt_peak_result peaks[2 * 4];
    int n_peaks = 0;
    double best_peak[2] = {0, 0};
    const enum kt_isa isa_max = kt_cpu_kernels()->isa_max;
    for (int isa = 0; isa <= (int)isa_max; isa++)
        for (int kind = 0; kind < 2; kind++) {
            if (!kt_peak_available((enum kt_peak_kind)kind, (enum kt_isa)isa))
                continue;
            struct kt_peak_result *p = &peaks[n_peaks++];
            if (kt_peak_measure((enum kt_peak_kind)kind, (enum kt_isa)isa, threads, o->seconds, 3, p, &err) != KT_OK)
                goto fail;
            best_peak[kind] = p->best_gops > best_peak[kind] ? p->best_gops : best_peak[kind];
        }

    printf("kt-bench kernels: %d threads, %.2f s per measurement\n\n", threads, o->seconds);
    printf("STREAM triad         %9.2f GB/s   best of %d, 3 x %zu MiB\n", triad.best_gbps, triad_repeats,
           triad.array_bytes >> 20);
    for (int i = 0; i < n_peaks; i++)
        printf("peak %-8s %-7s %9.1f %s   %d-bit %s\n", kt_peak_kind_name(peaks[i].kind), kt_isa_name(peaks[i].isa),
               peaks[i].best_gops, peaks[i].kind == KT_PEAK_FMA_F32 ? "GFLOP/s" : "GOP/s  ", peaks[i].width_bits,
               peaks[i].method);

    if (kt_pool_create(threads, &pool, &err) != KT_OK)
        goto fail;
    results = calloc((size_t)(isa_max + 1) * N_TYPES, sizeof *results);
    if (!results) {
        kt_err_set(&err, KT_ERR_NOMEM, "out of memory");
        goto fail;
    }
    json_t *jlevels = json_array(), *jres = json_array();
    json_object_set_new(root, "levels", jlevels);
    json_object_set_new(root, "kernels", jres);
    int n_results = 0;
    printf("\ndecode: gemv over %d x %d matrices, >= %zu MiB of weights (4 x L3); prefill: %u tokens x one "
           "matrix\n\n",
           ROWS, COLS, decode_working_set() >> 20, o->prefill_tokens);
    printf("%-6s %-7s %10s %7s %8s %14s %7s %-8s %s\n", "type", "isa", "decode", "/triad", "weights", "prefill",
           "/peak", "peak", "method");
    printf("%-6s %-7s %10s %7s %8s %14s %7s %-8s %s\n", "", "", "GB/s", "", "MiB", "GFLOP/s", "", "", "");
    for (int isa = 0; isa <= (int)isa_max; isa++) {
        const struct kt_cpu_kernels *table = kt_cpu_kernels_for((enum kt_isa)isa);
        if (!table)
            continue;
        int same = same_as_lower(table);
        json_t *jl = json_object();
        json_object_set_new(jl, "isa", json_string(kt_isa_name((enum kt_isa)isa)));
        if (same >= 0) {
            json_object_set_new(jl, "same_kernels_as", json_string(kt_isa_name((enum kt_isa)same)));
            printf("%-6s %-7s same kernels as %s: not measured again\n", "", kt_isa_name((enum kt_isa)isa),
                   kt_isa_name((enum kt_isa)same));
        }
        json_array_append_new(jlevels, jl);
    }
    for (size_t i = 0; i < N_TYPES; i++) {
        const enum kt_type type = bench_types[i];
        if (!kt_type_traits(type)->from_float)
            continue;
        uint64_t seed = 0x2545f4914f6cdd1dull ^ (uint64_t)type;
        uint8_t *w = make_weights(type, (int64_t)decode_experts(type) * ROWS, kt_type_row_bytes(type, COLS), &seed);
        if (!w) {
            kt_err_set(&err, KT_ERR_NOMEM, "cannot allocate the %s matrices", kt_type_name(type));
            goto fail;
        }
        for (int isa = 0; isa <= (int)isa_max; isa++) {
            const struct kt_cpu_kernels *table = kt_cpu_kernels_for((enum kt_isa)isa);
            if (!table || same_as_lower(table) >= 0 || (o->isa_mask && !(o->isa_mask & (1u << isa))))
                continue;
            const struct kt_cpu_type_kernels *k = &table->type[type];
            if (!k->gemv || !k->quantize_act)
                continue;
            struct kernel_result *r = &results[n_results++];
            *r = (struct kernel_result){.type = type, .isa = (enum kt_isa)isa};
            if (measure_kernel(pool, k, type, w, o, r) != KT_OK) {
                free(w);
                kt_err_set(&err, KT_ERR_NOMEM, "cannot allocate the %s activations", kt_type_name(type));
                goto fail;
            }
            /* integer dot products: FP8_B128 is quantized but multiplies floats (F32 activations) */
            const bool quantized = kt_type_traits(r->type)->is_quantized && k->vec_dot_type != KT_TYPE_F32;
            const int peak_kind = quantized ? KT_PEAK_DOT_INT8 : KT_PEAK_FMA_F32;
            /* the row's own level's peak (the amx level's int8 one is the tiles', which these
             * rows do not use: "same kernels as avx512"), else the best measured */
            const double own = peak_at(peaks, n_peaks, (enum kt_peak_kind)peak_kind, r->isa);
            const double peak = own > 0 ? own : best_peak[peak_kind];
            const double ratio_triad = r->decode_gbps / triad.best_gbps;
            char peak_ratio[16] = "-";
            if (peak > 0)
                snprintf(peak_ratio, sizeof peak_ratio, "%.3f", r->prefill_gflops / peak);
            printf("%-6s %-7s %10.2f %7.3f %8.0f %14.2f %7s %-8s %s\n", kt_type_name(r->type),
                   kt_isa_name(r->isa), r->decode_gbps, ratio_triad, (double)r->decode_bytes / (1 << 20),
                   r->prefill_gflops, peak_ratio, kt_peak_kind_name((enum kt_peak_kind)peak_kind),
                   r->prefill_gemm ? "gemm" : "gemv/token");
            fflush(stdout);

            json_t *jr = json_object();
            json_object_set_new(jr, "type", json_string(kt_type_name(r->type)));
            json_object_set_new(jr, "isa", json_string(kt_isa_name(r->isa)));
            json_t *jd = json_object();
            json_object_set_new(jd, "weight_bytes", json_integer((json_int_t)r->decode_bytes));
            json_object_set_new(jd, "experts", json_integer(r->decode_experts));
            json_object_set_new(jd, "passes", json_integer(r->decode_passes));
            json_object_set_new(jd, "gbps", json_real(r->decode_gbps));
            json_object_set_new(jd, "ratio_to_triad", json_real(ratio_triad));
            json_object_set_new(jr, "decode", jd);
            json_t *jp = json_object();
            json_object_set_new(jp, "tokens", json_integer(o->prefill_tokens));
            json_object_set_new(jp, "passes", json_integer(r->prefill_passes));
            json_object_set_new(jp, "method", json_string(r->prefill_gemm ? "gemm" : "gemv per token"));
            json_object_set_new(jp, "gflops", json_real(r->prefill_gflops));
            json_object_set_new(jp, "peak", json_string(kt_peak_kind_name((enum kt_peak_kind)peak_kind)));
            if (peak > 0)
                json_object_set_new(jp, "ratio_to_peak", json_real(r->prefill_gflops / peak));
            json_object_set_new(jr, "prefill", jp);
            json_array_append_new(jres, jr);
        }
        free(w);
    }
    json_t *jpacked = json_array();
    json_object_set_new(root, "packed", jpacked);
    if (measure_packed(pool, o, triad.best_gbps, peaks, n_peaks, jpacked, &err) != KT_OK)
        goto fail;
    json_t *jfloat = json_array();
    json_object_set_new(root, "float_prefill", jfloat);
    if (measure_float_prefill(pool, o, best_peak[KT_PEAK_FMA_F32], jfloat, &err) != KT_OK)
        goto fail;

    json_object_set_new(root, "tool", json_string("kt-bench"));
    json_object_set_new(root, "command", json_string("kernels"));
    json_object_set_new(root, "threads", json_integer(threads));
    json_object_set_new(root, "seconds", json_real(o->seconds));
    json_object_set_new(root, "isa_max", json_string(kt_isa_name(isa_max)));
    json_t *jshape = json_object();
    json_object_set_new(jshape, "rows", json_integer(ROWS));
    json_object_set_new(jshape, "cols", json_integer(COLS));
    json_object_set_new(jshape, "decode_working_set_bytes", json_integer((json_int_t)decode_working_set()));
    json_object_set_new(jshape, "prefill_tokens", json_integer(o->prefill_tokens));
    json_object_set_new(root, "shape", jshape);
    json_t *jt = json_object();
    json_object_set_new(jt, "best_gbps", json_real(triad.best_gbps));
    json_object_set_new(jt, "median_gbps", json_real(triad.median_gbps));
    json_object_set_new(jt, "array_bytes", json_integer((json_int_t)triad.array_bytes));
    json_object_set_new(jt, "repeats", json_integer(triad.repeats));
    json_object_set_new(root, "triad", jt);
    json_t *jpeaks = json_array();
    for (int i = 0; i < n_peaks; i++) {
        json_t *jp = json_object();
        json_object_set_new(jp, "kind", json_string(kt_peak_kind_name(peaks[i].kind)));
        json_object_set_new(jp, "isa", json_string(kt_isa_name(peaks[i].isa)));
        json_object_set_new(jp, "width_bits", json_integer(peaks[i].width_bits));
        json_object_set_new(jp, "method", json_string(peaks[i].method));
        json_object_set_new(jp, "best_gops", json_real(peaks[i].best_gops));
        json_object_set_new(jp, "median_gops", json_real(peaks[i].median_gops));
        json_array_append_new(jpeaks, jp);
    }
    json_object_set_new(root, "peaks", jpeaks);
    if (best_peak[KT_PEAK_FMA_F32] > 0)
        json_object_set_new(root, "fma_peak_gflops", json_real(best_peak[KT_PEAK_FMA_F32]));
    if (best_peak[KT_PEAK_DOT_INT8] > 0)
        json_object_set_new(root, "int8_peak_gops", json_real(best_peak[KT_PEAK_DOT_INT8]));
    rc = o->json ? kt_bench_write_json(root, o->json) : 0;
    goto done;
fail:
    fprintf(stderr, "kt-bench: %s\n", err.msg);
done:
    kt_pool_destroy(pool);
    free(results);
    json_decref(root);
    return rc;
}
