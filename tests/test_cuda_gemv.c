/*
 * test_cuda_gemv.c - the GPU's weight products compute x . W^T for every
 * supported weight type, on every path, against the weights as kt's
 * reference to_float reads them, summed in double:
 *   GEMV path    |err| <= 1e-5 * sum|w x|                (fp32 sums; a rigorous
 *                bound for n_in up to ~40K)
 *   TENSOR path  |err| <= 2e-2 * sqrt(sum (w x)^2) + 1e-5 * sum|w x|
 *   and cuBLASLt (x and W rounded to BF16: ~12 standard deviations of that
 *                rounding; a misplaced element costs ~50x more)
 * and the grouped expert FFN against the same products with SiLU (output
 * within 1e-4 (GEMV) / 5e-2 (TENSOR) of each pair's output RMS).  Shapes are
 * odd (rows not a multiple of 32 or 64, 1, 3, 8, 17, 64, 65 tokens, rows
 * padded past their values) and Kimi-K2's expert and projection sizes.
 * Skips visibly ("skipped: no CUDA device") where no GPU can be used.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kt_cuda.h"
#include "cpu/ref/ops.h"
#include "quant.h"
#include "testlib.h"


/* A random n_out x n_in matrix of `type` (rows of kt_type_row_bytes), scaled by 1/sqrt(n_in). */
static void *random_weights(int type, int64_t n_out, int64_t n_in, unsigned long long *rng)
{
    const struct kt_type_traits *tr = kt_type_traits(type);
    const size_t row_bytes = kt_type_row_bytes(type, n_in);
    uint8_t *w = kt_test_xmalloc((size_t)n_out * row_bytes);
    float *row = kt_test_xmalloc((size_t)n_in * sizeof *row);
    const float scale = 1.0f / sqrtf((float)n_in);
    for (int64_t r = 0; r < n_out; r++) {
        for (int64_t i = 0; i < n_in; i++)
            row[i] = kt_test_rand_normal(rng) * scale * (i % 61 == 0 ? 4.0f : 1.0f);
        if (type == KT_TYPE_F32)
            memcpy(w + (size_t)r * row_bytes, row, (size_t)n_in * sizeof *row);
        else
            tr->from_float(row, w + (size_t)r * row_bytes, n_in);
    }
    free(row);
    return w;
}

/* ref[t][r] = sum_i W[r][i] x[t][i] in double, with abs_sum = sum |W x| and sq_sum = sum (W x)^2. */
static void reference_product(int type, const uint8_t *w, int64_t n_out, int64_t n_in, const float *x, int64_t n_tok,
                              double *ref, double *abs_sum, double *sq_sum)
{
    const struct kt_type_traits *tr = kt_type_traits(type);
    const size_t row_bytes = kt_type_row_bytes(type, n_in);
    float *row = kt_test_xmalloc((size_t)n_in * sizeof *row);
    for (int64_t r = 0; r < n_out; r++) {
        if (type == KT_TYPE_F32)
            memcpy(row, w + (size_t)r * row_bytes, (size_t)n_in * sizeof *row);
        else
            tr->to_float(w + (size_t)r * row_bytes, row, n_in);
        for (int64_t t = 0; t < n_tok; t++) {
            double s = 0.0, a = 0.0, q = 0.0;
            for (int64_t i = 0; i < n_in; i++) {
                const double p = (double)row[i] * x[t * n_in + i];
                s += p;
                a += fabs(p);
                q += p * p;
            }
            ref[t * n_out + r] = s;
            abs_sum[t * n_out + r] = a;
            sq_sum[t * n_out + r] = q;
        }
    }
    free(row);
}

static bool within(int path, double got, double ref, double abs_sum, double sq_sum)
{
    const double tol = path == KT_CUDA_MATMUL_GEMV ? 1e-5 * abs_sum : 2e-2 * sqrt(sq_sum) + 1e-5 * abs_sum;
    return fabs(got - ref) <= tol + 1e-30;
}

#define LT_PATH (-1) /* kt_cuda_matmul_lt in the path loop, judged as TENSOR */

static const char *path_name(int path)
{
    return path == KT_CUDA_MATMUL_GEMV     ? "gemv"
           : path == KT_CUDA_MATMUL_TENSOR ? "tensor"
           : path == LT_PATH               ? "cublaslt"
                                           : "auto";
}

/* Every path (kt_cuda_matmul's three, kt_cuda_matmul_lt) on one weight
 * matrix for each token count; its rows lie row_pad bytes apart beyond their
 * packed size, the padding filled with NaN bits. */
static void check_matmul_padded(int type, int64_t n_out, int64_t n_in, size_t row_pad, const int64_t *tokens,
                                size_t n_tokens, unsigned long long *rng)
{
    const size_t packed = kt_type_row_bytes(type, n_in), row_bytes = packed + row_pad;
    uint8_t *w = random_weights(type, n_out, n_in, rng); /* packed rows, for the reference */
    uint8_t *stored = kt_test_xmalloc((size_t)n_out * row_bytes);
    memset(stored, 0xff, (size_t)n_out * row_bytes);
    for (int64_t r = 0; r < n_out; r++)
        memcpy(stored + (size_t)r * row_bytes, w + (size_t)r * packed, packed);
    void *d_w = kt_test_cuda_copy_in(stored, (size_t)n_out * row_bytes);
    const struct kt_cuda_mat mat = {type, d_w, n_in, n_out, row_pad ? row_bytes : 0}; /* 0: packed */
    for (size_t i = 0; i < n_tokens; i++) {
        const int64_t T = tokens[i];
        const size_t scratch_bytes = kt_cuda_matmul_lt_scratch_bytes(&mat, T);
        KT_CHECK(scratch_bytes > 0, "no cuBLASLt scratch size for %s %lldx%lld", kt_type_name(type),
                 (long long)n_out, (long long)n_in);
        void *d_scratch = kt_test_cuda_copy_in(NULL, scratch_bytes);
        float *x = kt_test_xmalloc((size_t)(T * n_in) * sizeof *x);
        float *y = kt_test_xmalloc((size_t)(T * n_out) * sizeof *y);
        double *ref = kt_test_xmalloc((size_t)(T * n_out) * sizeof *ref);
        double *abs_sum = kt_test_xmalloc((size_t)(T * n_out) * sizeof *abs_sum);
        double *sq_sum = kt_test_xmalloc((size_t)(T * n_out) * sizeof *sq_sum);
        for (int64_t k = 0; k < T * n_in; k++)
            x[k] = kt_test_rand_normal(rng);
        reference_product(type, w, n_out, n_in, x, T, ref, abs_sum, sq_sum);
        float *d_x = kt_test_cuda_copy_in(x, (size_t)(T * n_in) * sizeof *x);
        float *d_y = kt_test_cuda_copy_in(NULL, (size_t)(T * n_out) * sizeof *d_y);
        static const int paths[] = {KT_CUDA_MATMUL_GEMV, KT_CUDA_MATMUL_TENSOR, KT_CUDA_MATMUL_AUTO, LT_PATH};
        for (size_t p = 0; p < sizeof paths / sizeof paths[0]; p++) {
            const int path = paths[p];
            const int judged = path == KT_CUDA_MATMUL_GEMV || (path == KT_CUDA_MATMUL_AUTO && T <= 8)
                                   ? KT_CUDA_MATMUL_GEMV
                                   : KT_CUDA_MATMUL_TENSOR;
            kt_err err = {0};
            for (int64_t k = 0; k < T * n_out; k++)
                y[k] = NAN; /* poison: an output never written fails */
            kt_status rc = kt_cuda_copy_to_device(d_y, y, (size_t)(T * n_out) * sizeof *y, &err);
            KT_CHECK(rc == 0, "%s", err.msg);
            if (path == LT_PATH)
                rc = kt_cuda_matmul_lt(&mat, d_x, T, d_y, d_scratch, scratch_bytes, NULL, &err);
            else
                rc = kt_cuda_matmul(&mat, d_x, T, d_y, path, NULL, &err);
            KT_CHECK(rc == 0, "%s %lldx%lld (+%zu) T=%lld %s: %s", kt_type_name(type), (long long)n_out,
                     (long long)n_in, row_pad, (long long)T, path_name(path), err.msg);
            kt_test_cuda_copy_out(y, d_y, (size_t)(T * n_out) * sizeof *y);
            int64_t bad = 0, worst = 0;
            double worst_ratio = 0.0;
            for (int64_t k = 0; rc == 0 && k < T * n_out; k++) {
                if (!within(judged, y[k], ref[k], abs_sum[k], sq_sum[k]))
                    bad++;
                const double ratio = fabs(y[k] - ref[k]) / (abs_sum[k] + 1e-30);
                if (ratio > worst_ratio)
                    worst_ratio = ratio, worst = k;
            }
            KT_CHECK(bad == 0, "%s %lldx%lld (+%zu) T=%lld %s: %lld of %lld outputs off (worst [%lld]: %g vs %g)",
                     kt_type_name(type), (long long)n_out, (long long)n_in, row_pad, (long long)T, path_name(path),
                     (long long)bad, (long long)(T * n_out), (long long)worst, (double)y[worst], ref[worst]);
        }
        kt_cuda_free(d_x), kt_cuda_free(d_y), kt_cuda_free(d_scratch);
        free(x), free(y), free(ref), free(abs_sum), free(sq_sum);
    }
    kt_cuda_free(d_w);
    free(w), free(stored);
}

/* The same on packed rows. */
static void check_matmul(int type, int64_t n_out, int64_t n_in, const int64_t *tokens, size_t n_tokens,
                         unsigned long long *rng)
{
    check_matmul_padded(type, n_out, n_in, 0, tokens, n_tokens, rng);
}

static void cuda_matmul_matches_reference_on_odd_shapes(void)
{
    static const int64_t tokens[] = {1, 3, 8, 17, 64, 65};
    static const int float_types[] = {KT_TYPE_F32, KT_TYPE_F16, KT_TYPE_BF16};
    unsigned long long rng = 21;
    for (size_t i = 0; i < sizeof float_types / sizeof float_types[0]; i++) {
        check_matmul(float_types[i], 37, 77, tokens, 6, &rng);    /* n_in not a multiple of 8 */
        check_matmul(float_types[i], 300, 1100, tokens, 6, &rng); /* a chunk and a partial one */
    }
    check_matmul(KT_TYPE_Q8_0, 37, 96, tokens, 6, &rng);
    check_matmul(KT_TYPE_Q8_0, 129, 1056, tokens, 6, &rng);
    check_matmul(KT_TYPE_Q4_K, 37, 256, tokens, 6, &rng);
    check_matmul(KT_TYPE_Q4_K, 300, 512, tokens, 6, &rng); /* the tiny model's hidden size */
    check_matmul(KT_TYPE_Q4_K, 65, 1280, tokens, 6, &rng);
    check_matmul(KT_TYPE_Q5_0, 37, 128, tokens, 6, &rng); /* attn_k_b of a real Q4_K_M file */
    check_matmul(KT_TYPE_Q5_K, 37, 512, tokens, 6, &rng);
    check_matmul(KT_TYPE_Q6_K, 129, 768, tokens, 6, &rng);
    check_matmul(KT_TYPE_Q4_0, 37, 96, tokens, 6, &rng);        /* a checkpoint's INT4 experts */
    check_matmul(KT_TYPE_FP8_B128, 37, 384, tokens, 6, &rng);   /* its block FP8 */
}

static void cuda_matmul_matches_reference_at_kimi_sizes(void)
{
    static const int64_t tokens[] = {1, 3, 17};
    unsigned long long rng = 22;
    check_matmul(KT_TYPE_Q4_K, 2048, 7168, tokens, 3, &rng); /* expert gate/up */
    check_matmul(KT_TYPE_Q4_K, 7168, 2048, tokens, 3, &rng); /* expert down */
    check_matmul(KT_TYPE_Q8_0, 576, 7168, tokens, 3, &rng);  /* attn_kv_a_mqa */
    check_matmul(KT_TYPE_BF16, 1536, 7168, tokens, 2, &rng); /* attn_q_a */
    check_matmul(KT_TYPE_Q4_0, 2048, 7168, tokens, 3, &rng); /* Kimi-K2-Thinking's INT4 expert gate/up */
    check_matmul(KT_TYPE_FP8_B128, 1536, 7168, tokens, 2, &rng); /* DeepSeek-V3's FP8 attn_q_a */
}

/* Dense-projection shapes for kt_cuda_matmul_lt (the other paths run too): rows
 * not a multiple of 16, packed and padded, BF16 read in place and copied. */
static void cuda_matmul_lt_matches_reference_on_padded_rows(void)
{
    static const int64_t tokens[] = {1, 17, 64};
    static const int types[] = {KT_TYPE_F32, KT_TYPE_F16, KT_TYPE_BF16, KT_TYPE_Q8_0, KT_TYPE_Q4_K, KT_TYPE_Q6_K};
    unsigned long long rng = 24;
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        check_matmul_padded(types[i], 72, 256, 0, tokens, 3, &rng);
        check_matmul_padded(types[i], 200, 512, 64, tokens, 3, &rng); /* rows 64 bytes past their values */
    }
    check_matmul_padded(KT_TYPE_BF16, 72, 256, 2, tokens, 3, &rng); /* rows not 16-byte aligned: copied */
}

/* ---- grouped expert FFN ------------------------------------------------------------------ */

struct test_unit {
    int gate_type, down_type;
    int64_t n_ff;
    uint32_t n_pairs;
};

/* Runs units over T tokens of h and checks every pair's output against double products. */
static void check_ffn_units(int64_t n_embd, int64_t T, const struct test_unit *spec, uint32_t n_units,
                            unsigned long long *rng)
{
    uint32_t n_pairs = 0;
    int64_t act_stride = 0;
    for (uint32_t u = 0; u < n_units; u++) {
        n_pairs += spec[u].n_pairs;
        if (spec[u].n_ff > act_stride)
            act_stride = spec[u].n_ff;
    }
    float *h = kt_test_xmalloc((size_t)(T * n_embd) * sizeof *h);
    for (int64_t k = 0; k < T * n_embd; k++)
        h[k] = kt_test_rand_normal(rng);
    uint32_t *pair_token = kt_test_xmalloc((size_t)n_pairs * sizeof *pair_token);
    for (uint32_t p = 0; p < n_pairs; p++)
        pair_token[p] = (uint32_t)(kt_test_rand_u64(rng) % (uint64_t)T);
    pair_token[0] = (uint32_t)T + 1; /* out of range (a GEMV unit and a tensor unit): reads zeros, output 0 */
    pair_token[n_pairs - 1] = (uint32_t)T + 5;

    struct kt_cuda_ffn_unit *units = kt_test_xmalloc(n_units * sizeof *units);
    uint8_t **w = kt_test_xmalloc(3 * n_units * sizeof *w); /* host gate, up, down of each unit */
    float *d_h = kt_test_cuda_copy_in(h, (size_t)(T * n_embd) * sizeof *h);
    uint32_t *d_pair_token = kt_test_cuda_copy_in(pair_token, (size_t)n_pairs * sizeof *pair_token);
    float *d_act = kt_test_cuda_copy_in(NULL, (size_t)n_pairs * act_stride * sizeof(float));
    float *out = kt_test_xmalloc((size_t)n_pairs * n_embd * sizeof *out);
    for (size_t k = 0; k < (size_t)n_pairs * n_embd; k++)
        out[k] = NAN; /* poison: a pair never written fails */
    float *d_out = kt_test_cuda_copy_in(out, (size_t)n_pairs * n_embd * sizeof *out);
    uint32_t first = 0;
    for (uint32_t u = 0; u < n_units; u++) {
        const struct test_unit *s = &spec[u];
        const int types[3] = {s->gate_type, s->gate_type, s->down_type};
        const int64_t n_out[3] = {s->n_ff, s->n_ff, n_embd}, n_in[3] = {n_embd, n_embd, s->n_ff};
        struct kt_cuda_mat *m[3] = {&units[u].gate, &units[u].up, &units[u].down};
        for (int j = 0; j < 3; j++) {
            w[3 * u + j] = random_weights(types[j], n_out[j], n_in[j], rng);
            *m[j] = (struct kt_cuda_mat){types[j],
                                         kt_test_cuda_copy_in(w[3 * u + j], (size_t)n_out[j] * kt_type_row_bytes(types[j], n_in[j])),
                                         n_in[j], n_out[j], 0};
        }
        units[u].first_pair = first;
        units[u].n_pairs = s->n_pairs;
        first += s->n_pairs;
    }
    kt_err err = {0};
    kt_status rc = kt_cuda_ffn_units(units, n_units, d_h, T, n_embd, d_pair_token, n_pairs, d_act, act_stride, d_out,
                                     NULL, &err);
    KT_CHECK(rc == 0, "%s", err.msg);
    kt_test_cuda_copy_out(out, d_out, (size_t)n_pairs * n_embd * sizeof *out);

    /* reference, pair by pair */
    for (uint32_t u = 0; rc == 0 && u < n_units; u++) {
        const struct test_unit *s = &spec[u];
        const int64_t f = s->n_ff;
        double *g = kt_test_xmalloc((size_t)f * sizeof *g), *v = kt_test_xmalloc((size_t)f * sizeof *v);
        double *ref = kt_test_xmalloc((size_t)n_embd * sizeof *ref);
        double *scratch = kt_test_xmalloc((size_t)(f > n_embd ? f : n_embd) * sizeof *scratch);
        float *act = kt_test_xmalloc((size_t)f * sizeof *act), *zeros = kt_test_xmalloc((size_t)n_embd * 4);
        memset(zeros, 0, (size_t)n_embd * 4);
        int64_t bad_pairs = 0;
        for (uint32_t p = units[u].first_pair; p < units[u].first_pair + s->n_pairs; p++) {
            const float *x = pair_token[p] < T ? h + (int64_t)pair_token[p] * n_embd : zeros;
            reference_product(s->gate_type, w[3 * u], f, n_embd, x, 1, g, scratch, scratch);
            reference_product(s->gate_type, w[3 * u + 1], f, n_embd, x, 1, v, scratch, scratch);
            for (int64_t r = 0; r < f; r++)
                act[r] = kt_silu((float)g[r]) * (float)v[r];
            reference_product(s->down_type, w[3 * u + 2], n_embd, f, act, 1, ref, scratch, scratch);
            double rms = 0.0, worst = 0.0;
            for (int64_t r = 0; r < n_embd; r++) {
                rms += ref[r] * ref[r];
                const double e = fabs((double)out[(size_t)p * n_embd + r] - ref[r]);
                worst = e > worst || e != e ? e : worst;
            }
            rms = sqrt(rms / (double)n_embd);
            const double tol = (s->n_pairs <= 8 ? 1e-4 : 5e-2) * rms + 1e-30;
            if (!(worst <= tol))
                bad_pairs++;
        }
        KT_CHECK(bad_pairs == 0, "unit %u (%s/%s, n_ff %lld, %u pairs): %lld pairs off", u,
                 kt_type_name(s->gate_type), kt_type_name(s->down_type), (long long)f, s->n_pairs,
                 (long long)bad_pairs);
        free(g), free(v), free(ref), free(scratch), free(act), free(zeros);
    }
    for (uint32_t u = 0; u < n_units; u++) {
        kt_cuda_free((void *)units[u].gate.data), kt_cuda_free((void *)units[u].up.data);
        kt_cuda_free((void *)units[u].down.data);
        free(w[3 * u]), free(w[3 * u + 1]), free(w[3 * u + 2]);
    }
    kt_cuda_free(d_h), kt_cuda_free(d_pair_token), kt_cuda_free(d_act), kt_cuda_free(d_out);
    free(h), free(pair_token), free(units), free(w), free(out);
}

static void cuda_ffn_units_match_reference(void)
{
    unsigned long long rng = 23;
    /* tiny model: experts of 128, shared experts of 256, one empty unit */
    const struct test_unit tiny[] = {
        {KT_TYPE_Q4_K, KT_TYPE_Q8_0, 128, 1},  {KT_TYPE_Q4_K, KT_TYPE_Q8_0, 128, 3},
        {KT_TYPE_F32, KT_TYPE_F32, 128, 0},    {KT_TYPE_Q8_0, KT_TYPE_Q8_0, 128, 8},
        {KT_TYPE_Q4_K, KT_TYPE_Q8_0, 128, 17}, {KT_TYPE_BF16, KT_TYPE_F16, 256, 20},
    };
    check_ffn_units(512, 20, tiny, sizeof tiny / sizeof tiny[0], &rng);
    /* Kimi-K2: experts 2048 x 7168 in Q4_K, a decode-sized and a prefill-sized group */
    const struct test_unit kimi[] = {{KT_TYPE_Q4_K, KT_TYPE_Q4_K, 2048, 2}, {KT_TYPE_Q4_K, KT_TYPE_Q4_K, 2048, 9}};
    check_ffn_units(7168, 9, kimi, 2, &rng);
}

static void cuda_matmul_rejects_bad_weights(void)
{
    kt_err err = {0};
    float *d = kt_test_cuda_copy_in(NULL, 4096);
    const struct kt_cuda_mat q4_0 = {KT_TYPE_Q4_0, d, 32, 1, 0}, q4_k_short = {KT_TYPE_Q4_K, d, 100, 1, 0},
                             misaligned = {KT_TYPE_F32, (const char *)d + 2, 4, 1, 0},
                             row_too_small = {KT_TYPE_F32, d, 8, 2, 16};
    KT_CHECK(kt_cuda_matmul(&q4_0, d, 1, d, 0, NULL, &err) == KT_ERR_UNSUPPORTED && err.msg[0], "q4_0 accepted");
    err.msg[0] = 0;
    KT_CHECK(kt_cuda_matmul(&q4_k_short, d, 1, d, 0, NULL, &err) == KT_ERR_INVALID && err.msg[0],
             "q4_K with 100 columns accepted");
    err.msg[0] = 0;
    KT_CHECK(kt_cuda_matmul(&misaligned, d, 1, d, 0, NULL, &err) == KT_ERR_INVALID && err.msg[0],
             "misaligned f32 accepted");
    err.msg[0] = 0;
    KT_CHECK(kt_cuda_matmul(&row_too_small, d, 1, d, 0, NULL, &err) == KT_ERR_INVALID && err.msg[0],
             "rows shorter than their values accepted");
    kt_cuda_free(d);
}

static void cuda_matmul_lt_rejects_bad_arguments(void)
{
    kt_err err = {0};
    float *d = kt_test_cuda_copy_in(NULL, 4096);
    const struct kt_cuda_mat q4_0 = {KT_TYPE_Q4_0, d, 32, 1, 0}, f32 = {KT_TYPE_F32, d, 8, 4, 0};
    const size_t need = kt_cuda_matmul_lt_scratch_bytes(&f32, 2);
    uint8_t *scratch = kt_test_cuda_copy_in(NULL, need);
    KT_CHECK(need > 0 && kt_cuda_matmul_lt_scratch_bytes(&q4_0, 2) == 0 && kt_cuda_matmul_lt_scratch_bytes(&f32, 0) == 0,
             "scratch sizes: %zu for f32, %zu for q4_0, %zu for no tokens", need,
             kt_cuda_matmul_lt_scratch_bytes(&q4_0, 2), kt_cuda_matmul_lt_scratch_bytes(&f32, 0));
    KT_CHECK(kt_cuda_matmul_lt(&q4_0, d, 2, d, scratch, need, NULL, &err) == KT_ERR_UNSUPPORTED && err.msg[0],
             "q4_0 accepted");
    err.msg[0] = 0;
    KT_CHECK(kt_cuda_matmul_lt(&f32, d, 0, d, scratch, need, NULL, &err) == KT_ERR_INVALID && err.msg[0],
             "0 tokens accepted");
    err.msg[0] = 0;
    KT_CHECK(kt_cuda_matmul_lt(&f32, NULL, 2, d, scratch, need, NULL, &err) == KT_ERR_INVALID && err.msg[0],
             "NULL x accepted");
    err.msg[0] = 0;
    KT_CHECK(kt_cuda_matmul_lt(&f32, d, 2, d, scratch, need - 1, NULL, &err) == KT_ERR_INVALID && err.msg[0],
             "short scratch accepted");
    err.msg[0] = 0;
    KT_CHECK(kt_cuda_matmul_lt(&f32, d, 2, d, scratch + 128, need - 128, NULL, &err) == KT_ERR_INVALID && err.msg[0],
             "misaligned scratch accepted");
    kt_cuda_free(scratch), kt_cuda_free(d);
}

int main(void)
{
    const int skip = kt_test_skip_without_cuda();
    if (skip)
        return skip;
    KT_RUN(cuda_matmul_matches_reference_on_odd_shapes);
    KT_RUN(cuda_matmul_matches_reference_at_kimi_sizes);
    KT_RUN(cuda_ffn_units_match_reference);
    KT_RUN(cuda_matmul_lt_matches_reference_on_padded_rows);
    KT_RUN(cuda_matmul_rejects_bad_weights);
    KT_RUN(cuda_matmul_lt_rejects_bad_arguments);
    return kt_test_finish();
}
