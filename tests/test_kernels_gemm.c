/*
 * test_kernels_gemm.c - the prefill products (the table's gemm rows) and the
 * AVX-512 dot products, against the per-pair vec_dot they must equal.
 *
 * A gemm computes y[t][r] = dot(W[r], A[t]) for many tokens at once; for every
 * level and every weight type it must give, bit for bit, the float that
 * vec_dot gives for that (row, token) pair, and write nothing outside its
 * n_rows x n_tok outputs; the tiled ones are run on shapes around their
 * register tiles, token groups and cache blocks.  The AVX-512 rows must equal
 * the scalar reference bit for bit, and so must the quantized types' tiled
 * gemms (odd shapes, padded strides); on a CPU without AVX-512 those cases
 * say "skipped: no AVX-512".
 * Timings at the end are printed, never asserted.
 */
#include "testlib.h"

#include "cpu/dispatch.h"
#include "peak.h"
#include "quant.h"

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---------------------------------------------------------------------------- */
/* helpers                                                                       */
/* ---------------------------------------------------------------------------- */

static unsigned long long g_rng = 0x67656d6d6b74ULL;

static void *xmalloc(size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    if (!p) {
        fprintf(stderr, "out of memory\n");
        exit(2);
    }
    return p;
}

static uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void put_fp16(uint8_t *p, float v)
{
    const kt_fp16 h = kt_fp32_to_fp16(v);
    memcpy(p, &h, sizeof h);
}

/*
 * One weight row of n elements.  kind 0: quantized gaussian values with
 * outliers; kind 1 (Q8_0, Q4_0 and the K-quants Q4_K, Q5_K, Q6_K only):
 * random bits with finite scales; kind 2 (the same types): extreme codes
 * (Q8_0 all -128; Q4_0 every code 15, i.e. +7; Q4_K / Q5_K every bit set, so
 * every quant at its top and every 6-bit scale and min 63; Q6_K every quant
 * 63 and every scale -128).
 */
static void make_row(int type, int64_t n, int kind, uint8_t *w)
{
    const struct kt_type_traits *t = kt_type_traits(type);
    const int64_t nb = n / t->block_elems;
    const bool raw = type == KT_TYPE_Q8_0 || type == KT_TYPE_Q4_0 || type == KT_TYPE_Q4_K || type == KT_TYPE_Q5_K ||
                     type == KT_TYPE_Q6_K;
    if (kind == 0 || !raw) {
        float *x = xmalloc((size_t)n * sizeof *x);
        for (int64_t i = 0; i < n; i++)
            x[i] = 0.5f * kt_test_rand_normal(&g_rng) * (kt_test_rand_u64(&g_rng) % 100 == 0 ? 100.0f : 1.0f);
        t->from_float(x, w, n);
        free(x);
        return;
    }
    /* d is the first field of every raw type but Q6_K's; Q4_K and Q5_K have dmin next */
    const size_t d_at = type == KT_TYPE_Q6_K ? offsetof(struct kt_block_q6_K, d) : 0;
    for (int64_t b = 0; b < nb; b++) {
        uint8_t *blk = w + (size_t)b * t->block_bytes;
        if (kind == 1) {
            for (size_t k = 0; k < t->block_bytes; k++)
                blk[k] = (uint8_t)kt_test_rand_u64(&g_rng);
        } else {
            memset(blk, type == KT_TYPE_Q8_0 ? 0x80 : 0xff, t->block_bytes);
            if (type == KT_TYPE_Q6_K)
                memset(blk + offsetof(struct kt_block_q6_K, scales), 0x80, KT_QK_K / 16);
        }
        put_fp16(blk + d_at, kind == 1 ? kt_test_rand_normal(&g_rng) * 0.05f : 1.0f);
        if (type == KT_TYPE_Q4_K || type == KT_TYPE_Q5_K)
            put_fp16(blk + 2, kind == 1 ? kt_test_rand_normal(&g_rng) * 0.05f : 0.5f); /* dmin */
    }
}

/* Activation row t: gaussian with outliers; every 4th row +-1 (every quant at
 * the limit); every 5th row with its first half zero. */
static void make_act(int64_t n, int64_t t, float *x)
{
    for (int64_t i = 0; i < n; i++) {
        x[i] = kt_test_rand_normal(&g_rng) * (kt_test_rand_u64(&g_rng) % 100 == 0 ? 100.0f : 1.0f);
        if (t % 4 == 3)
            x[i] = kt_test_rand_u64(&g_rng) & 1 ? 1.0f : -1.0f;
        if (t % 5 == 4 && i < n / 2)
            x[i] = 0.0f;
    }
}

/* Levels whose tables exist on this CPU, scalar first. */
static int levels(enum kt_isa out[KT_ISA_AMX + 1])
{
    int count = 0;
    for (int isa = KT_ISA_SCALAR; isa <= KT_ISA_AMX; isa++)
        if (kt_cpu_kernels_for((enum kt_isa)isa))
            out[count++] = (enum kt_isa)isa;
    return count;
}

/* ---------------------------------------------------------------------------- */
/* gemm = vec_dot per pair                                                       */
/* ---------------------------------------------------------------------------- */

static const float SENTINEL = -12345.678f;

/*
 * One shape at one level: weights (n_rows, row_bytes) with padded rows,
 * activations (n_tok, act_bytes) padded, outputs with y_stride > n_rows
 * filled with a sentinel that must survive outside the n_rows columns.
 * Returns the number of outputs that differ from vec_dot (or that clobbered
 * a sentinel); *nonzero counts outputs that are not 0.
 */
static int gemm_vs_vec_dot(const struct kt_cpu_kernels *k, int type, int64_t n, int64_t n_rows, int64_t n_tok,
                           int *nonzero)
{
    const struct kt_cpu_type_kernels *row = &k->type[type];
    const size_t row_bytes = kt_type_row_bytes(type, n) + 8;
    const size_t act_bytes = kt_type_row_bytes(row->vec_dot_type, n) + 4;
    const int64_t y_stride = n_rows + 3;
    uint8_t *w = xmalloc(row_bytes * (size_t)n_rows);
    uint8_t *a = xmalloc(act_bytes * (size_t)n_tok);
    float *x = xmalloc((size_t)n * sizeof *x);
    float *y = xmalloc((size_t)(y_stride * n_tok) * sizeof *y);
    for (int64_t r = 0; r < n_rows; r++)
        make_row(type, n, (int)(r % 3), w + (size_t)r * row_bytes);
    for (int64_t t = 0; t < n_tok; t++) {
        make_act(n, t, x);
        row->quantize_act(x, a + (size_t)t * act_bytes, n);
    }
    for (int64_t i = 0; i < y_stride * n_tok; i++)
        y[i] = SENTINEL;
    row->gemm(n, w, row_bytes, n_rows, a, act_bytes, n_tok, y, y_stride);
    int differ = 0;
    for (int64_t t = 0; t < n_tok; t++) {
        for (int64_t r = 0; r < y_stride; r++) {
            const float got = y[t * y_stride + r];
            if (r >= n_rows) {
                differ += f32_bits(got) != f32_bits(SENTINEL);
                continue;
            }
            float want = NAN;
            row->vec_dot(n, &want, w + (size_t)r * row_bytes, a + (size_t)t * act_bytes);
            if (f32_bits(got) != f32_bits(want) && differ++ < 3)
                fprintf(stderr, "  %s %s n=%lld rows=%lld tok=%lld: y[%lld][%lld] = %.9g, vec_dot %.9g\n",
                        kt_isa_name(k->isa), kt_type_name(type), (long long)n, (long long)n_rows, (long long)n_tok,
                        (long long)t, (long long)r, got, want);
            *nonzero += want != 0.0f;
        }
    }
    free(w);
    free(a);
    free(x);
    free(y);
    return differ;
}

static void gemm_equals_vec_dot_for_every_pair_on_odd_shapes(void)
{
    enum kt_isa lv[KT_ISA_AMX + 1];
    const int nl = levels(lv);
    const int64_t toks[] = {1, 3, 4, 5, 17}, rows[] = {1, 7, 33};
    for (int l = 0; l < nl; l++) {
        const struct kt_cpu_kernels *k = kt_cpu_kernels_for(lv[l]);
        for (int type = 0; type < KT_TYPE_COUNT; type++) {
            if (!k->type[type].vec_dot)
                continue;
            KT_CHECK(k->type[type].gemm != NULL, "%s %s: vec_dot without gemm", kt_isa_name(lv[l]),
                     kt_type_name(type));
            if (!k->type[type].gemm)
                continue;
            /* 5 super-blocks (or 40 blocks): the 4-at-a-time loops and their tails */
            const int64_t n = kt_type_traits(type)->block_elems == 1 ? 1283 : 1280;
            int differ = 0, nonzero = 0, outputs = 0;
            for (size_t ti = 0; ti < sizeof toks / sizeof toks[0]; ti++)
                for (size_t ri = 0; ri < sizeof rows / sizeof rows[0]; ri++) {
                    differ += gemm_vs_vec_dot(k, type, n, rows[ri], toks[ti], &nonzero);
                    outputs += (int)(rows[ri] * toks[ti]);
                }
            KT_CHECK(differ == 0, "%s %s: %d of %d gemm outputs differ from vec_dot (or wrote outside)",
                     kt_isa_name(lv[l]), kt_type_name(type), differ, outputs);
            KT_CHECK(nonzero > outputs / 2, "%s %s: only %d of %d outputs nonzero: a vacuous comparison",
                     kt_isa_name(lv[l]), kt_type_name(type), nonzero, outputs);
        }
    }
}

/*
 * The tiled gemms of Q5_K and Q6_K (1 row x 4 tokens on AVX2, x 8 on
 * AVX-512) and of F32, F16 and BF16 (vec_dot's 32 float lanes: 1 row x 6
 * tokens on AVX2, 2 rows x 6 on AVX-512) give vec_dot's floats at every
 * level: row counts around the register tiles, token counts around the token
 * groups (short last groups), K-quant rows up to 7168, float rows ending in
 * 8-element chunks and single elements (or made of nothing else), and one
 * shape spanning several row panels (64), token blocks (48) and K blocks
 * (1024).
 */
static void kquant_and_float_gemms_equal_vec_dot_on_odd_shapes(void)
{
    enum kt_isa lv[KT_ISA_AMX + 1];
    const int nl = levels(lv);
    const int types[] = {KT_TYPE_Q5_K, KT_TYPE_Q6_K, KT_TYPE_F32, KT_TYPE_F16, KT_TYPE_BF16};
    const int64_t rows[] = {1, 7, 17}, toks[] = {1, 5, 8, 13};
    const int64_t kquant_n[] = {256, 1280, 7168}, float_n[] = {8, 31, 1283, 1291, 7168};
    for (int l = 0; l < nl; l++) {
        const struct kt_cpu_kernels *k = kt_cpu_kernels_for(lv[l]);
        for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
            const int type = types[ti];
            const bool kquant = kt_type_traits(type)->block_elems == KT_QK_K;
            const int64_t *ns = kquant ? kquant_n : float_n;
            const size_t count = kquant ? sizeof kquant_n / sizeof kquant_n[0] : sizeof float_n / sizeof float_n[0];
            int differ = 0, nonzero = 0, outputs = 0;
            for (size_t ni = 0; ni < count; ni++)
                for (size_t ri = 0; ri < sizeof rows / sizeof rows[0]; ri++)
                    for (size_t tk = 0; tk < sizeof toks / sizeof toks[0]; tk++) {
                        differ += gemm_vs_vec_dot(k, type, ns[ni], rows[ri], toks[tk], &nonzero);
                        outputs += (int)(rows[ri] * toks[tk]);
                    }
            differ += gemm_vs_vec_dot(k, type, kquant ? 2304 : 2083, 131, 53, &nonzero);
            outputs += 131 * 53;
            KT_CHECK(differ == 0, "%s %s: %d of %d gemm outputs differ from vec_dot (or wrote outside)",
                     kt_isa_name(lv[l]), kt_type_name(type), differ, outputs);
            KT_CHECK(nonzero > outputs / 2, "%s %s: only %d of %d outputs nonzero", kt_isa_name(lv[l]),
                     kt_type_name(type), nonzero, outputs);
        }
    }
}

/* The tiled kernels give the scalar reference's floats too (vec_dot does, so
 * this is the same claim end to end: AVX2 or AVX-512 gemm == reference
 * vec_dot) for the quantized types; the float types' SIMD dots sum in float,
 * the reference in double. */
static void tiled_gemm_equals_the_scalar_reference(void)
{
    const struct kt_cpu_kernels *avx2 = kt_cpu_kernels_for(KT_ISA_AVX2);
    if (!avx2) {
        printf("  skipped: no AVX2 (with FMA and F16C) on this CPU\n");
        return;
    }
    const struct kt_cpu_kernels *ref = kt_cpu_kernels_for(KT_ISA_SCALAR), *avx512 = kt_cpu_kernels_for(KT_ISA_AVX512);
    const int types[] = {KT_TYPE_Q8_0, KT_TYPE_Q4_K, KT_TYPE_Q5_K, KT_TYPE_Q6_K};
    const int64_t n = 7168, n_rows = 9, n_tok = 13;
    for (size_t i = 0; i < 2 * sizeof types / sizeof types[0]; i++) {
        const struct kt_cpu_kernels *simd = i % 2 ? avx512 : avx2;
        if (!simd)
            continue;
        const int type = types[i / 2];
        const size_t row_bytes = kt_type_row_bytes(type, n);
        const size_t act_bytes = kt_type_row_bytes(ref->type[type].vec_dot_type, n);
        uint8_t *w = xmalloc(row_bytes * n_rows), *a = xmalloc(act_bytes * n_tok);
        float *x = xmalloc((size_t)n * sizeof *x), *y = xmalloc((size_t)(n_rows * n_tok) * sizeof *y);
        for (int64_t r = 0; r < n_rows; r++)
            make_row(type, n, (int)(r % 3), w + (size_t)r * row_bytes);
        for (int64_t t = 0; t < n_tok; t++) {
            make_act(n, t, x);
            ref->type[type].quantize_act(x, a + (size_t)t * act_bytes, n);
        }
        simd->type[type].gemm(n, w, row_bytes, n_rows, a, act_bytes, n_tok, y, n_rows);
        int differ = 0;
        for (int64_t t = 0; t < n_tok; t++)
            for (int64_t r = 0; r < n_rows; r++) {
                float want;
                ref->type[type].vec_dot(n, &want, w + (size_t)r * row_bytes, a + (size_t)t * act_bytes);
                differ += f32_bits(want) != f32_bits(y[t * n_rows + r]);
            }
        KT_CHECK(differ == 0, "%s %s: %d of %lld gemm outputs differ from the scalar reference",
                 kt_isa_name(simd->isa), kt_type_name(type), differ, (long long)(n_rows * n_tok));
        free(w);
        free(a);
        free(x);
        free(y);
    }
}

/* ---------------------------------------------------------------------------- */
/* AVX-512                                                                       */
/* ---------------------------------------------------------------------------- */

static void avx512_rows_have_their_own_dots_for_q8_0_q4_0_and_q4_K(void)
{
    const struct kt_cpu_kernels *avx512 = kt_cpu_kernels_for(KT_ISA_AVX512);
    if (!avx512) {
        printf("  skipped: no AVX-512 (F/BW/VL/VNNI/BF16) on this CPU\n");
        return;
    }
    const struct kt_cpu_kernels *avx2 = kt_cpu_kernels_for(KT_ISA_AVX2);
    const int types[] = {KT_TYPE_Q8_0, KT_TYPE_Q4_0, KT_TYPE_Q4_K};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
        KT_CHECK(avx512->type[types[i]].vec_dot != avx2->type[types[i]].vec_dot, "%s: avx512 row is the avx2 dot",
                 kt_type_name(types[i]));
    /* KT_ISA=avx2 must reach the avx2 rows: the forced table is a different one */
    KT_CHECK(avx2->type[KT_TYPE_Q4_K].vec_dot != avx512->type[KT_TYPE_Q4_K].vec_dot,
             "avx2 table hands out the avx512 dot");
}

static void avx512_dots_equal_the_reference_bit_for_bit(void)
{
    const struct kt_cpu_kernels *avx512 = kt_cpu_kernels_for(KT_ISA_AVX512);
    if (!avx512) {
        printf("  skipped: no AVX-512 (F/BW/VL/VNNI/BF16) on this CPU\n");
        return;
    }
    const struct kt_cpu_kernels *ref = kt_cpu_kernels_for(KT_ISA_SCALAR);
    const int types[] = {KT_TYPE_Q8_0, KT_TYPE_Q4_0, KT_TYPE_Q4_K};
    const int64_t blocks[] = {1, 2, 3, 4, 5, 7, 8, 9, 15, 17, 28};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        const int type = types[i];
        const int64_t be = kt_type_traits(type)->block_elems;
        int differ = 0, compared = 0, nonzero = 0;
        for (size_t bi = 0; bi < sizeof blocks / sizeof blocks[0]; bi++) {
            const int64_t n = blocks[bi] * be * (be == KT_QK ? 3 : 1); /* Q8_0, Q4_0: around the 8-block loop */
            /* exact-size buffers: an over-read shows under ASan */
            uint8_t *w = xmalloc(kt_type_row_bytes(type, n));
            void *a = xmalloc(kt_type_row_bytes(ref->type[type].vec_dot_type, n));
            float *x = xmalloc((size_t)n * sizeof *x);
            for (int v = 0; v < 6; v++) {
                make_row(type, n, v % 3, w);
                make_act(n, v, x);
                ref->type[type].quantize_act(x, a, n);
                float want = NAN, got = NAN;
                ref->type[type].vec_dot(n, &want, w, a);
                avx512->type[type].vec_dot(n, &got, w, a);
                if (f32_bits(want) != f32_bits(got) && differ++ < 3)
                    fprintf(stderr, "  %s n=%lld variant %d: avx512 %.9g, reference %.9g\n", kt_type_name(type),
                            (long long)n, v, got, want);
                compared++;
                nonzero += want != 0.0f;
            }
            free(w);
            free(a);
            free(x);
        }
        KT_CHECK(differ == 0, "%s: %d of %d avx512 dots differ from the reference", kt_type_name(type), differ,
                 compared);
        KT_CHECK(nonzero > compared / 2, "%s: only %d of %d nonzero", kt_type_name(type), nonzero, compared);
    }
}

/* The avx512 level's own tiled gemms (1 row x 8 tokens, VNNI): bit for bit
 * vec_dot (and so the scalar reference) for every pair, on odd token and row
 * counts, padded strides, and block counts around the 4-block groups. */
static void avx512_gemm_equals_vec_dot_on_odd_shapes(void)
{
    const struct kt_cpu_kernels *avx512 = kt_cpu_kernels_for(KT_ISA_AVX512);
    if (!avx512) {
        printf("  skipped: no AVX-512 (F/BW/VL/VNNI/BF16) on this CPU\n");
        return;
    }
    const struct kt_cpu_kernels *avx2 = kt_cpu_kernels_for(KT_ISA_AVX2), *ref = kt_cpu_kernels_for(KT_ISA_SCALAR);
    const int types[] = {KT_TYPE_Q8_0, KT_TYPE_Q4_K};
    const int64_t toks[] = {1, 3, 4, 5, 8, 9, 17}, rows[] = {1, 7, 33};
    const int64_t ns[2][3] = {{32, 224, 1312}, {256, 768, 1280}}; /* Q8_0: 1, 7, 41 blocks */
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        const int type = types[i];
        KT_CHECK(avx512->type[type].gemm != avx2->type[type].gemm, "%s: avx512 gemm is the avx2 one",
                 kt_type_name(type));
        int differ = 0, nonzero = 0, outputs = 0;
        for (int ni = 0; ni < 3; ni++)
            for (size_t ti = 0; ti < sizeof toks / sizeof toks[0]; ti++)
                for (size_t ri = 0; ri < sizeof rows / sizeof rows[0]; ri++) {
                    differ += gemm_vs_vec_dot(avx512, type, ns[i][ni], rows[ri], toks[ti], &nonzero);
                    outputs += (int)(rows[ri] * toks[ti]);
                }
        KT_CHECK(differ == 0, "%s: %d of %d avx512 gemm outputs differ from vec_dot (or wrote outside)",
                 kt_type_name(type), differ, outputs);
        KT_CHECK(nonzero > outputs / 2, "%s: only %d of %d outputs nonzero", kt_type_name(type), nonzero, outputs);
        /* and from the scalar reference at a model-sized row */
        const int64_t n = 7168, n_rows = 5, n_tok = 11;
        const size_t row_bytes = kt_type_row_bytes(type, n);
        const size_t act_bytes = kt_type_row_bytes(ref->type[type].vec_dot_type, n);
        uint8_t *w = xmalloc(row_bytes * n_rows), *a = xmalloc(act_bytes * n_tok);
        float *x = xmalloc((size_t)n * sizeof *x), *y = xmalloc((size_t)(n_rows * n_tok) * sizeof *y);
        for (int64_t r = 0; r < n_rows; r++)
            make_row(type, n, (int)(r % 3), w + (size_t)r * row_bytes);
        for (int64_t t = 0; t < n_tok; t++) {
            make_act(n, t, x);
            ref->type[type].quantize_act(x, a + (size_t)t * act_bytes, n);
        }
        avx512->type[type].gemm(n, w, row_bytes, n_rows, a, act_bytes, n_tok, y, n_rows);
        int differ_ref = 0;
        for (int64_t t = 0; t < n_tok; t++)
            for (int64_t r = 0; r < n_rows; r++) {
                float want;
                ref->type[type].vec_dot(n, &want, w + (size_t)r * row_bytes, a + (size_t)t * act_bytes);
                differ_ref += f32_bits(want) != f32_bits(y[t * n_rows + r]);
            }
        KT_CHECK(differ_ref == 0, "%s: %d avx512 gemm outputs differ from the scalar reference", kt_type_name(type),
                 differ_ref);
        free(w);
        free(a);
        free(x);
        free(y);
    }
}

/* ---------------------------------------------------------------------------- */
/* measurements (printed, never asserted)                                        */
/* ---------------------------------------------------------------------------- */

#if defined(__SANITIZE_ADDRESS__)
static const bool sanitized = true;
#else
static const bool sanitized = false;
#endif

/* Best-of-3 single-thread GOP/s of a peak loop at a level; 0 if unavailable. */
static double peak_gops(enum kt_peak_kind kind, enum kt_isa isa, const char **method)
{
    struct kt_peak_result res;
    *method = "n/a";
    if (!kt_peak_available(kind, isa) || kt_peak_measure(kind, isa, 1, 0.3, 3, &res, NULL) != KT_OK)
        return 0.0;
    *method = res.method;
    return res.best_gops;
}

/*
 * Q4_K and Q8_0 at a prefill shape (rows 2048, n 7168, 128 tokens), one
 * thread: the tiled gemm against one gemv per token (what matmul did before),
 * as GFLOP/s (2 per multiply-add) and as a share of the int8-dot and FMA peaks.
 */
static void print_prefill_gemm_speed(void)
{
    if (sanitized) {
        printf("  info: speed not measured under sanitizers\n");
        return;
    }
    const struct kt_cpu_kernels *k = kt_cpu_kernels();
    const int64_t n = 7168, n_rows = 2048, n_tok = 128;
    const double flops = 2.0 * (double)n * (double)n_rows * (double)n_tok;
    const char *dot_method, *fma_method;
    const double dot_peak = peak_gops(KT_PEAK_DOT_INT8, k->isa, &dot_method);
    const double fma_peak = peak_gops(KT_PEAK_FMA_F32, k->isa, &fma_method);
    const char *dot2_method;
    const double dot_peak2 = peak_gops(KT_PEAK_DOT_INT8, KT_ISA_AVX2, &dot2_method);
    printf("  info: peaks, 1 thread: %s int8 dot %.1f GOP/s (%s), avx2 int8 dot %.1f GOP/s (%s), %s fma %.1f "
           "GFLOP/s (%s)\n",
           kt_isa_name(k->isa), dot_peak, dot_method, dot_peak2, dot2_method, kt_isa_name(k->isa), fma_peak,
           fma_method);
    const int types[] = {KT_TYPE_Q4_K, KT_TYPE_Q8_0};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        const struct kt_cpu_type_kernels *row = &k->type[types[i]];
        const size_t row_bytes = kt_type_row_bytes(types[i], n);
        const size_t act_bytes = kt_type_row_bytes(row->vec_dot_type, n);
        uint8_t *w = xmalloc(row_bytes * n_rows), *a = xmalloc(act_bytes * n_tok);
        float *x = xmalloc((size_t)n * sizeof *x), *y = xmalloc((size_t)(n_rows * n_tok) * sizeof *y);
        for (int64_t r = 0; r < n_rows; r++) {
            if (r < 16)
                make_row(types[i], n, 1, w + (size_t)r * row_bytes);
            else
                memcpy(w + (size_t)r * row_bytes, w + (size_t)(r % 16) * row_bytes, row_bytes);
        }
        for (int64_t t = 0; t < n_tok; t++) {
            make_act(n, t, x);
            row->quantize_act(x, a + (size_t)t * act_bytes, n);
        }
        const struct kt_cpu_kernels *avx2 = kt_cpu_kernels_for(KT_ISA_AVX2);
        double best_gemm = 1e30, best_gemv = 1e30, best_avx2 = 1e30;
        for (int rep = 0; rep < 3; rep++) {
            if (avx2 && avx2->type[types[i]].gemm != row->gemm) {
                const double t2 = now_s();
                avx2->type[types[i]].gemm(n, w, row_bytes, n_rows, a, act_bytes, n_tok, y, n_rows);
                const double dt2 = now_s() - t2;
                best_avx2 = dt2 < best_avx2 ? dt2 : best_avx2;
            }
            double t0 = now_s();
            row->gemm(n, w, row_bytes, n_rows, a, act_bytes, n_tok, y, n_rows);
            const double dt_gemm = now_s() - t0;
            best_gemm = dt_gemm < best_gemm ? dt_gemm : best_gemm;
            t0 = now_s();
            for (int64_t t = 0; t < n_tok; t++)
                row->gemv(n, y + t * n_rows, w, row_bytes, a + (size_t)t * act_bytes, n_rows);
            const double dt_gemv = now_s() - t0;
            best_gemv = dt_gemv < best_gemv ? dt_gemv : best_gemv;
        }
        const double g = flops / best_gemm / 1e9, gv = flops / best_gemv / 1e9;
        printf("  info: %s gemm %lldx%lld x %lld tokens, 1 thread, %s: %.1f GFLOP/s (%.0f%% of int8 dot peak, "
               "%.0f%% of avx2 int8 peak, %.0f%% of fma peak); per-token gemv %.1f GFLOP/s\n",
               kt_type_name(types[i]), (long long)n_rows, (long long)n, (long long)n_tok, kt_isa_name(k->isa), g,
               dot_peak > 0 ? 100.0 * g / dot_peak : 0.0, dot_peak2 > 0 ? 100.0 * g / dot_peak2 : 0.0,
               fma_peak > 0 ? 100.0 * g / fma_peak : 0.0, gv);
        if (best_avx2 < 1e30)
            printf("  info: %s gemm, same shape, avx2 level: %.1f GFLOP/s (%s gemm %.2fx)\n", kt_type_name(types[i]),
                   flops / best_avx2 / 1e9, kt_isa_name(k->isa), best_avx2 / best_gemm);
        free(w);
        free(a);
        free(x);
        free(y);
    }
}

/* GB/s of weight bytes, one thread, gemv over a 64 MiB matrix of rows of
 * 7168: the AVX-512 dot against the AVX2 one. */
static void print_avx512_vs_avx2_gemv_bandwidth(void)
{
    if (sanitized) {
        printf("  info: bandwidth not measured under sanitizers\n");
        return;
    }
    const struct kt_cpu_kernels *avx512 = kt_cpu_kernels_for(KT_ISA_AVX512), *avx2 = kt_cpu_kernels_for(KT_ISA_AVX2);
    if (!avx512 || !avx2) {
        printf("  skipped: no AVX-512 (F/BW/VL/VNNI/BF16) on this CPU\n");
        return;
    }
    const int64_t n = 7168;
    const size_t matrix_bytes = (size_t)64 << 20;
    float *x = xmalloc((size_t)n * sizeof *x);
    make_act(n, 0, x);
    const int types[] = {KT_TYPE_Q4_K, KT_TYPE_Q8_0};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        const size_t row_bytes = kt_type_row_bytes(types[i], n);
        const int64_t rows = (int64_t)(matrix_bytes / row_bytes);
        uint8_t *w = xmalloc((size_t)rows * row_bytes);
        for (int64_t r = 0; r < rows; r++) {
            if (r < 16)
                make_row(types[i], n, 1, w + (size_t)r * row_bytes);
            else
                memcpy(w + (size_t)r * row_bytes, w + (size_t)(r % 16) * row_bytes, row_bytes);
        }
        void *a = xmalloc(kt_type_row_bytes(avx2->type[types[i]].vec_dot_type, n));
        avx2->type[types[i]].quantize_act(x, a, n);
        float *y = xmalloc((size_t)rows * sizeof *y);
        double best[2] = {1e30, 1e30};
        for (int rep = 0; rep < 5; rep++)
            for (int l = 0; l < 2; l++) {
                const struct kt_cpu_kernels *k = l ? avx512 : avx2;
                const double t0 = now_s();
                k->type[types[i]].gemv(n, y, w, row_bytes, a, rows);
                const double dt = now_s() - t0;
                best[l] = dt < best[l] ? dt : best[l];
            }
        const double bytes = (double)rows * (double)row_bytes;
        printf("  info: %s gemv, 64 MiB, 1 thread: avx512 %.2f GB/s, avx2 %.2f GB/s\n", kt_type_name(types[i]),
               bytes / best[1] / 1e9, bytes / best[0] / 1e9);
        free(w);
        free(a);
        free(y);
    }
    free(x);
}

int main(void)
{
    KT_RUN(gemm_equals_vec_dot_for_every_pair_on_odd_shapes);
    KT_RUN(kquant_and_float_gemms_equal_vec_dot_on_odd_shapes);
    KT_RUN(tiled_gemm_equals_the_scalar_reference);
    KT_RUN(avx512_rows_have_their_own_dots_for_q8_0_q4_0_and_q4_K);
    KT_RUN(avx512_dots_equal_the_reference_bit_for_bit);
    KT_RUN(avx512_gemm_equals_vec_dot_on_odd_shapes);
    KT_RUN(print_prefill_gemm_speed);
    KT_RUN(print_avx512_vs_avx2_gemv_bandwidth);
    return kt_test_finish();
}
