/*
 * test_cuda_ops.c - the GPU's element-wise ops compute what the scalar
 * reference ops (kernels/cpu/ref/ops.c) compute, on odd shapes:
 *   RMSNorm, softmax, SwiGLU   within 1e-6 relative (double-rounding and exp
 *                              last-bit cases; almost always bit-identical)
 *   RoPE (host angles), add    bit-identical
 * Skips visibly ("skipped: no CUDA device") where no GPU can be used.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kt_cuda.h"
#include "cpu/ref/ops.h"
#include "testlib.h"

/* ---- device buffers ---------------------------------------------------------------- */


/* Elements of got and want further apart than rel*|want| + abs. */
static int64_t count_far(const float *got, const float *want, int64_t n, float rel, float abs_tol)
{
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++)
        if (!(fabsf(got[i] - want[i]) <= rel * fabsf(want[i]) + abs_tol))
            bad++;
    return bad;
}

static void fill_normal(float *x, int64_t n, float scale, unsigned long long *rng)
{
    for (int64_t i = 0; i < n; i++)
        x[i] = kt_test_rand_normal(rng) * scale;
}

/* ---- cases -------------------------------------------------------------------------- */

static void cuda_rmsnorm_matches_cpu(void)
{
    static const int64_t rows_list[] = {1, 3, 17, 64};
    static const int64_t n_list[] = {7, 33, 512, 7168};
    unsigned long long rng = 1;
    for (size_t a = 0; a < sizeof rows_list / sizeof rows_list[0]; a++) {
        for (size_t b = 0; b < sizeof n_list / sizeof n_list[0]; b++) {
            const int64_t rows = rows_list[a], n = n_list[b], x_stride = n + 5; /* strided input rows */
            float *x = kt_test_xmalloc((size_t)(rows * x_stride) * sizeof *x);
            float *w = kt_test_xmalloc((size_t)n * sizeof *w);
            float *want = kt_test_xmalloc((size_t)(rows * n) * sizeof *want);
            float *got = kt_test_xmalloc((size_t)(rows * n) * sizeof *got);
            fill_normal(x, rows * x_stride, 3.0f, &rng);
            fill_normal(w, n, 1.0f, &rng);
            for (int64_t r = 0; r < rows; r++)
                kt_rmsnorm(want + r * n, x + r * x_stride, w, n, 1e-6f);
            float *d_x = kt_test_cuda_copy_in(x, (size_t)(rows * x_stride) * sizeof *x);
            float *d_w = kt_test_cuda_copy_in(w, (size_t)n * sizeof *w);
            float *d_y = kt_test_cuda_copy_in(NULL, (size_t)(rows * n) * sizeof *d_y);
            kt_err err = {0};
            kt_status rc = kt_cuda_rmsnorm(d_y, n, d_x, x_stride, d_w, rows, n, 1e-6f, NULL, &err);
            KT_CHECK(rc == 0, "rows %lld n %lld: %s", (long long)rows, (long long)n, err.msg);
            kt_test_cuda_copy_out(got, d_y, (size_t)(rows * n) * sizeof *got);
            int64_t bad = count_far(got, want, rows * n, 1e-6f, 0.0f);
            KT_CHECK(bad == 0, "rows %lld n %lld: %lld values differ", (long long)rows, (long long)n, (long long)bad);

            /* in place on the strided rows */
            rc = kt_cuda_rmsnorm(d_x, x_stride, d_x, x_stride, d_w, rows, n, 1e-6f, NULL, &err);
            KT_CHECK(rc == 0, "in place: %s", err.msg);
            float *xin = kt_test_xmalloc((size_t)(rows * x_stride) * sizeof *xin);
            kt_test_cuda_copy_out(xin, d_x, (size_t)(rows * x_stride) * sizeof *xin);
            bad = 0;
            for (int64_t r = 0; r < rows; r++) {
                bad += count_far(xin + r * x_stride, want + r * n, n, 1e-6f, 0.0f);
                bad += memcmp(xin + r * x_stride + n, x + r * x_stride + n, 5 * sizeof *x) != 0; /* gap untouched */
            }
            KT_CHECK(bad == 0, "in place rows %lld n %lld: %lld values differ", (long long)rows, (long long)n,
                     (long long)bad);
            kt_cuda_free(d_x), kt_cuda_free(d_w), kt_cuda_free(d_y);
            free(x), free(w), free(want), free(got), free(xin);
        }
    }
}

/* Queries (T, H*dk) with the rope part at dn of each head, Kimi's YaRN. */
static void cuda_rope_matches_cpu_bit_for_bit(void)
{
    static const struct { int64_t T, H, dn, dr; } shapes[] = {{1, 8, 32, 16}, {3, 8, 32, 16}, {17, 64, 128, 64},
                                                              {64, 64, 128, 64}};
    const struct kt_rope_params p = {.n_dims = 64, .freq_base = 50000.0, .factor = 32.0, .mode = KT_ROPE_YARN,
                                     .orig_ctx = 4096, .beta_fast = 32.0, .beta_slow = 1.0, .magnitude = 1.0};
    unsigned long long rng = 2;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const int64_t T = shapes[s].T, H = shapes[s].H, dn = shapes[s].dn, dr = shapes[s].dr, dk = dn + dr;
        struct kt_rope_params ps = p;
        ps.n_dims = (uint32_t)dr;
        struct kt_rope rope;
        KT_CHECK(kt_rope_init(&rope, &ps), "rope init");
        float *q = kt_test_xmalloc((size_t)(T * H * dk) * sizeof *q);
        float *want = kt_test_xmalloc((size_t)(T * H * dk) * sizeof *want);
        float *got = kt_test_xmalloc((size_t)(T * H * dk) * sizeof *got);
        float *cs = kt_test_xmalloc((size_t)(T * dr) * sizeof *cs);
        fill_normal(q, T * H * dk, 1.0f, &rng);
        memcpy(want, q, (size_t)(T * H * dk) * sizeof *q);
        for (int64_t t = 0; t < T; t++) {
            kt_rope_angles(&rope, (uint32_t)(t * 977 + 3), cs + t * dr); /* positions up to ~60K */
            for (int64_t h = 0; h < H; h++)
                kt_rope_apply(want + (t * H + h) * dk + dn, cs + t * dr, (uint32_t)dr);
        }
        float *d_q = kt_test_cuda_copy_in(q, (size_t)(T * H * dk) * sizeof *q);
        float *d_cs = kt_test_cuda_copy_in(cs, (size_t)(T * dr) * sizeof *cs);
        kt_err err = {0};
        kt_status rc = kt_cuda_rope(d_q, T, H * dk, H, dk, dn, d_cs, dr, NULL, &err);
        KT_CHECK(rc == 0, "%s", err.msg);
        kt_test_cuda_copy_out(got, d_q, (size_t)(T * H * dk) * sizeof *got);
        KT_CHECK(memcmp(got, want, (size_t)(T * H * dk) * sizeof *got) == 0, "T %lld H %lld: differs from kt_rope_apply",
                 (long long)T, (long long)H);
        kt_cuda_free(d_q), kt_cuda_free(d_cs);
        free(q), free(want), free(got), free(cs);
    }
}

static void cuda_swiglu_and_add_match_cpu(void)
{
    static const int64_t n_list[] = {1, 1000, 7169};
    unsigned long long rng = 3;
    for (size_t i = 0; i < sizeof n_list / sizeof n_list[0]; i++) {
        const int64_t n = n_list[i];
        const size_t bytes = (size_t)n * sizeof(float);
        float *g = kt_test_xmalloc(bytes), *u = kt_test_xmalloc(bytes), *want = kt_test_xmalloc(bytes);
        float *got = kt_test_xmalloc(bytes), *sum = kt_test_xmalloc(bytes);
        fill_normal(g, n, 4.0f, &rng);
        fill_normal(u, n, 1.0f, &rng);
        if (n > 2) { /* saturating SiLU inputs */
            g[0] = -100.0f;
            g[1] = 100.0f;
        }
        kt_swiglu(want, g, u, n);
        for (int64_t k = 0; k < n; k++)
            sum[k] = g[k] + u[k];
        float *d_g = kt_test_cuda_copy_in(g, bytes), *d_u = kt_test_cuda_copy_in(u, bytes), *d_o = kt_test_cuda_copy_in(NULL, bytes);
        kt_err err = {0};
        kt_status rc = kt_cuda_swiglu(d_o, d_g, d_u, n, NULL, &err);
        KT_CHECK(rc == 0, "%s", err.msg);
        kt_test_cuda_copy_out(got, d_o, bytes);
        int64_t bad = count_far(got, want, n, 1e-6f, 1e-30f);
        KT_CHECK(bad == 0, "swiglu n %lld: %lld values differ", (long long)n, (long long)bad);

        rc = kt_cuda_add(d_o, d_g, d_u, n, NULL, &err);
        KT_CHECK(rc == 0, "%s", err.msg);
        kt_test_cuda_copy_out(got, d_o, bytes);
        KT_CHECK(memcmp(got, sum, bytes) == 0, "add n %lld differs", (long long)n);
        rc = kt_cuda_add(d_g, d_g, d_u, n, NULL, &err); /* y aliasing a: the residual add */
        KT_CHECK(rc == 0, "%s", err.msg);
        kt_test_cuda_copy_out(got, d_g, bytes);
        KT_CHECK(memcmp(got, sum, bytes) == 0, "in-place add n %lld differs", (long long)n);
        kt_cuda_free(d_g), kt_cuda_free(d_u), kt_cuda_free(d_o);
        free(g), free(u), free(want), free(got), free(sum);
    }
}

static void cuda_softmax_matches_cpu(void)
{
    static const int64_t rows_list[] = {1, 3, 17};
    static const int64_t n_list[] = {1, 5, 300, 4097};
    unsigned long long rng = 4;
    for (size_t a = 0; a < sizeof rows_list / sizeof rows_list[0]; a++) {
        for (size_t b = 0; b < sizeof n_list / sizeof n_list[0]; b++) {
            const int64_t rows = rows_list[a], n = n_list[b];
            const size_t bytes = (size_t)(rows * n) * sizeof(float);
            float *x = kt_test_xmalloc(bytes), *want = kt_test_xmalloc(bytes), *got = kt_test_xmalloc(bytes);
            fill_normal(x, rows * n, 5.0f, &rng);
            for (int64_t k = 0; k < rows * n; k += 7)
                x[k] = -INFINITY; /* masked entries */
            if (rows > 1)
                for (int64_t k = 0; k < n; k++)
                    x[n + k] = -INFINITY; /* row 1 attends to nothing: all zeros, never NaN */
            memcpy(want, x, bytes);
            for (int64_t r = 0; r < rows; r++)
                kt_softmax(want + r * n, n);
            float *d_x = kt_test_cuda_copy_in(x, bytes);
            kt_err err = {0};
            kt_status rc = kt_cuda_softmax(d_x, rows, n, NULL, &err);
            KT_CHECK(rc == 0, "%s", err.msg);
            kt_test_cuda_copy_out(got, d_x, bytes);
            int64_t bad = count_far(got, want, rows * n, 1e-6f, 1e-30f);
            KT_CHECK(bad == 0, "rows %lld n %lld: %lld values differ", (long long)rows, (long long)n, (long long)bad);
            kt_cuda_free(d_x);
            free(x), free(want), free(got);
        }
    }
}

static void cuda_ops_reject_bad_arguments(void)
{
    kt_err err = {0};
    float *d = kt_test_cuda_copy_in(NULL, 64 * sizeof(float));
    KT_CHECK(kt_cuda_rope(d, 1, 64, 1, 64, 0, d, 7, NULL, &err) != KT_OK && err.msg[0], "odd rope dims accepted");
    err.msg[0] = 0;
    KT_CHECK(kt_cuda_rmsnorm(d, 4, d, 4, d, 2, 8, 1e-6f, NULL, &err) != KT_OK && err.msg[0],
             "stride below the row length accepted");
    err.msg[0] = 0;
    KT_CHECK(kt_cuda_softmax(d, -1, 4, NULL, &err) != KT_OK && err.msg[0], "negative rows accepted");
    err.msg[0] = 0;
    KT_CHECK(kt_cuda_add(NULL, d, d, 4, NULL, &err) != KT_OK && err.msg[0], "NULL output accepted");
    KT_CHECK(kt_cuda_synchronize(&err) == 0, "%s", err.msg);
    kt_cuda_free(d);
}

int main(void)
{
    const int skip = kt_test_skip_without_cuda();
    if (skip)
        return skip;
    KT_RUN(cuda_rmsnorm_matches_cpu);
    KT_RUN(cuda_rope_matches_cpu_bit_for_bit);
    KT_RUN(cuda_swiglu_and_add_match_cpu);
    KT_RUN(cuda_softmax_matches_cpu);
    KT_RUN(cuda_ops_reject_bad_arguments);
    return kt_test_finish();
}
