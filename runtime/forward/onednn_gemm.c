/*
 * onednn_gemm.c - float matrix products through oneDNN's C API (see
 * onednn_gemm.h): dnnl_sgemm on row-major matrices, W transposed.
 *
 * It must never let oneDNN start threads (the caller's pool owns the
 * cores), never keep state between calls, and never write the weights.
 */
#include "onednn_gemm.h"

#include <dnnl.h>
#include <stdlib.h>
#include <string.h>

#if DNNL_CPU_THREADING_RUNTIME == DNNL_RUNTIME_OMP
#include <omp.h>
#endif

/* BF16 rows widened per sgemm call: 128 x 7168 floats is 3.5 MiB of scratch,
 * and oneDNN measured as fast on 128 rows as on 2048. */
#define KT_ONEDNN_BF16_ROWS 128

/* Holds the calling thread's OpenMP team to one thread; returns what to restore. */
static int hold_threads(void)
{
#if DNNL_CPU_THREADING_RUNTIME == DNNL_RUNTIME_OMP
    const int before = omp_get_max_threads();
    omp_set_num_threads(1);
    return before;
#else
    return 0;
#endif
}

static void release_threads(int before)
{
#if DNNL_CPU_THREADING_RUNTIME == DNNL_RUNTIME_OMP
    omp_set_num_threads(before);
#else
    (void)before;
#endif
}

static kt_status check_shape(int64_t n_in, int64_t w_stride, int64_t n_out, int64_t a_stride, int64_t n_tok,
                             int64_t y_stride, kt_err *err)
{
    if (n_in < 0 || n_out < 0 || n_tok < 0 || w_stride < n_in || a_stride < n_in || y_stride < n_out)
        return kt_err_set(err, KT_ERR_INVALID,
                          "onednn gemm: bad shape (n_in %lld, n_out %lld, n_tok %lld, strides %lld %lld %lld)",
                          (long long)n_in, (long long)n_out, (long long)n_tok, (long long)w_stride,
                          (long long)a_stride, (long long)y_stride);
    return KT_OK;
}

/* Exact: a bf16 is the high half of an F32 (a loop the compiler vectorizes;
 * quant.c's to_float calls out of line per element). */
static void widen_bf16(const kt_bf16 *src, float *dst, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        const uint32_t u = (uint32_t)src[i] << 16;
        memcpy(&dst[i], &u, sizeof u);
    }
}

/* y (n_tok, n_out) = A (n_tok, n_in) x W^T, W (n_out, n_in) F32, on this thread. */
static kt_status sgemm_rows(int64_t n_in, const float *w, int64_t w_stride, int64_t n_out, const float *a,
                            int64_t a_stride, int64_t n_tok, float *y, int64_t y_stride, kt_err *err)
{
    if (n_out == 0 || n_tok == 0)
        return KT_OK;
    if (n_in == 0) { /* empty sums */
        for (int64_t t = 0; t < n_tok; t++)
            for (int64_t o = 0; o < n_out; o++)
                y[t * y_stride + o] = 0.0f;
        return KT_OK;
    }
    const dnnl_status_t s =
        dnnl_sgemm('N', 'T', n_tok, n_out, n_in, 1.0f, a, a_stride, w, w_stride, 0.0f, y, y_stride);
    if (s != dnnl_success)
        return kt_err_set(err, KT_ERR_INVALID, "onednn gemm: dnnl_sgemm failed (status %d) on %lld x %lld x %lld",
                          (int)s, (long long)n_tok, (long long)n_out, (long long)n_in);
    return KT_OK;
}

kt_status kt_onednn_gemm_f32(int64_t n_in, const float *w, int64_t w_stride, int64_t n_out, const float *a,
                             int64_t a_stride, int64_t n_tok, float *y, int64_t y_stride, kt_err *err)
{
    kt_status st = check_shape(n_in, w_stride, n_out, a_stride, n_tok, y_stride, err);
    if (st != KT_OK)
        return st;
    const int before = hold_threads();
    st = sgemm_rows(n_in, w, w_stride, n_out, a, a_stride, n_tok, y, y_stride, err);
    release_threads(before);
    return st;
}

kt_status kt_onednn_gemm_bf16(int64_t n_in, const kt_bf16 *w, int64_t w_stride, int64_t n_out, const float *a,
                              int64_t a_stride, int64_t n_tok, float *y, int64_t y_stride, kt_err *err)
{
    kt_status st = check_shape(n_in, w_stride, n_out, a_stride, n_tok, y_stride, err);
    if (st != KT_OK)
        return st;
    if (n_out == 0 || n_tok == 0 || n_in == 0) /* nothing to widen */
        return sgemm_rows(n_in, NULL, w_stride, n_out, a, a_stride, n_tok, y, y_stride, err);
    const int64_t block = n_out < KT_ONEDNN_BF16_ROWS ? n_out : KT_ONEDNN_BF16_ROWS;
    float *wf = malloc((size_t)block * (size_t)n_in * sizeof *wf); /* (block, n_in) */
    if (!wf)
        return kt_err_set(err, KT_ERR_NOMEM, "onednn gemm: cannot allocate %lld x %lld floats", (long long)block,
                          (long long)n_in);
    const int before = hold_threads();
    for (int64_t o0 = 0; o0 < n_out && st == KT_OK; o0 += block) {
        const int64_t rows = n_out - o0 < block ? n_out - o0 : block;
        for (int64_t o = 0; o < rows; o++)
            widen_bf16(w + (o0 + o) * w_stride, wf + o * n_in, n_in);
        st = sgemm_rows(n_in, wf, n_in, rows, a, a_stride, n_tok, y + o0, y_stride, err);
    }
    release_threads(before);
    free(wf);
    return st;
}
