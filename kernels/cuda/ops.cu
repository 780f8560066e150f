/*
 * ops.cu - the element-wise ops of a layer on the GPU: RMSNorm, RoPE (YaRN
 * angles from the host), SwiGLU, residual add and softmax.
 *
 * Each is kernels/cpu/ref/ops.c's formula in its operation order, with the
 * float steps written as unfused intrinsics (nvcc would otherwise contract
 * a*b+c into an FMA) and exp taken through kt_dev_expf, so results match the
 * CPU to the last bit or within an ulp (tests/test_cuda_ops.c).  All are
 * memory-bound: one pass over their data, except RMSNorm and softmax (two).
 */
#include "common.cuh"

#define OPS_THREADS 256
#define OPS_MAX_BLOCKS 65535 /* grid-stride loops cover the rest */

static kt_status check_rows(int64_t rows, int64_t n, const char *what, kt_err *err)
{
    if (rows < 0 || n < 0 || rows > KT_CUDA_MAX_GRID_X)
        return kt_err_set(err, KT_ERR_INVALID, "%s: bad shape (%lld rows of %lld)", what, (long long)rows,
                          (long long)n);
    return KT_OK;
}

/* ---- RMSNorm: one block per row ---------------------------------------------------- */

__global__ static void __launch_bounds__(OPS_THREADS)
    rmsnorm_rows(float *y, int64_t y_stride, const float *x, int64_t x_stride, const float *w, int64_t n, float eps)
{
    const float *xr = x + (int64_t)blockIdx.x * x_stride;
    float *yr = y + (int64_t)blockIdx.x * y_stride;
    double sum_sq = 0.0;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
        sum_sq += (double)xr[i] * xr[i]; /* exact product in double, as the CPU */
    sum_sq = kt_block_sum_double(sum_sq);  /* every x is read before any y is written */
    const float scale = (float)(1.0 / sqrt(sum_sq / (double)n + (double)eps));
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
        yr[i] = __fmul_rn(__fmul_rn(xr[i], scale), w[i]);
}

extern "C" kt_status kt_cuda_rmsnorm(float *d_y, int64_t y_stride, const float *d_x, int64_t x_stride, const float *d_w,
                                     int64_t rows, int64_t n, float eps, void *stream, kt_err *err)
{
    const kt_status st = check_rows(rows, n, "rmsnorm", err);
    if (st != KT_OK)
        return st;
    if (rows == 0 || n == 0)
        return KT_OK;
    if (!d_y || !d_x || !d_w || x_stride < n || y_stride < n)
        return kt_err_set(err, KT_ERR_INVALID, "rmsnorm: NULL pointer or stride below the row length");
    rmsnorm_rows<<<(unsigned)rows, OPS_THREADS, 0, (cudaStream_t)stream>>>(d_y, y_stride, d_x, x_stride, d_w, n,
                                                                          eps);
    return kt_cuda_launched("rmsnorm launch", err);
}

/* ---- RoPE: one thread per rotated pair --------------------------------------------- */

__global__ static void __launch_bounds__(OPS_THREADS)
    rope_pairs(float *x, int64_t rows, int64_t row_stride, int64_t n_heads, int64_t head_stride, int64_t offset,
               const float *cos_sin, int64_t n_dims)
{
    const int64_t half = n_dims / 2, n_pairs = rows * n_heads * half;
    for (int64_t p = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; p < n_pairs;
         p += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = p / (n_heads * half), h = p / half % n_heads, i = p % half;
        float *v = x + r * row_stride + h * head_stride + offset + 2 * i;
        const float c = cos_sin[r * n_dims + 2 * i], s = cos_sin[r * n_dims + 2 * i + 1];
        const float x0 = v[0], x1 = v[1];
        v[0] = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));
        v[1] = __fadd_rn(__fmul_rn(x0, s), __fmul_rn(x1, c));
    }
}

extern "C" kt_status kt_cuda_rope(float *d_x, int64_t rows, int64_t row_stride, int64_t n_heads, int64_t head_stride,
                                  int64_t offset, const float *d_cos_sin, int64_t n_dims, void *stream, kt_err *err)
{
    if (rows < 0 || n_heads < 0 || n_dims < 0 || n_dims % 2 != 0 || offset < 0)
        return kt_err_set(err, KT_ERR_INVALID, "rope: bad shape (%lld rows, %lld heads, %lld dims, offset %lld)",
                          (long long)rows, (long long)n_heads, (long long)n_dims, (long long)offset);
    if (rows == 0 || n_heads == 0 || n_dims == 0)
        return KT_OK;
    if (!d_x || !d_cos_sin)
        return kt_err_set(err, KT_ERR_INVALID, "rope: NULL pointer");
    if (head_stride < 0 || row_stride < 0 || (n_heads > 1 && head_stride < offset + n_dims))
        return kt_err_set(err, KT_ERR_INVALID, "rope: heads overlap (head stride %lld < offset %lld + %lld dims)",
                          (long long)head_stride, (long long)offset, (long long)n_dims);
    const int64_t n_pairs = rows * n_heads * (n_dims / 2);
    const int64_t blocks = (n_pairs + OPS_THREADS - 1) / OPS_THREADS;
    rope_pairs<<<(unsigned)(blocks < OPS_MAX_BLOCKS ? blocks : OPS_MAX_BLOCKS), OPS_THREADS, 0,
                 (cudaStream_t)stream>>>(d_x, rows, row_stride, n_heads, head_stride, offset, d_cos_sin, n_dims);
    return kt_cuda_launched("rope launch", err);
}

/* ---- SwiGLU and add: grid-stride over elements -------------------------------------- */

__global__ static void __launch_bounds__(OPS_THREADS) swiglu_elems(float *out, const float *gate, const float *up,
                                                                   int64_t n)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        out[i] = __fmul_rn(kt_dev_silu(gate[i]), up[i]);
}

__global__ static void __launch_bounds__(OPS_THREADS) add_elems(float *y, const float *a, const float *b, int64_t n)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        y[i] = __fadd_rn(a[i], b[i]);
}

static unsigned elem_blocks(int64_t n)
{
    const int64_t b = (n + OPS_THREADS - 1) / OPS_THREADS;
    return (unsigned)(b < OPS_MAX_BLOCKS ? b : OPS_MAX_BLOCKS);
}

extern "C" kt_status kt_cuda_swiglu(float *d_out, const float *d_gate, const float *d_up, int64_t n, void *stream,
                                    kt_err *err)
{
    if (n < 0)
        return kt_err_set(err, KT_ERR_INVALID, "swiglu: negative length");
    if (n == 0)
        return KT_OK;
    if (!d_out || !d_gate || !d_up)
        return kt_err_set(err, KT_ERR_INVALID, "swiglu: NULL pointer");
    swiglu_elems<<<elem_blocks(n), OPS_THREADS, 0, (cudaStream_t)stream>>>(d_out, d_gate, d_up, n);
    return kt_cuda_launched("swiglu launch", err);
}

extern "C" kt_status kt_cuda_add(float *d_y, const float *d_a, const float *d_b, int64_t n, void *stream, kt_err *err)
{
    if (n < 0)
        return kt_err_set(err, KT_ERR_INVALID, "add: negative length");
    if (n == 0)
        return KT_OK;
    if (!d_y || !d_a || !d_b)
        return kt_err_set(err, KT_ERR_INVALID, "add: NULL pointer");
    add_elems<<<elem_blocks(n), OPS_THREADS, 0, (cudaStream_t)stream>>>(d_y, d_a, d_b, n);
    return kt_cuda_launched("add launch", err);
}

/* ---- softmax: one block per row ------------------------------------------------------ */

__global__ static void __launch_bounds__(OPS_THREADS) softmax_rows(float *x, int64_t n)
{
    float *row = x + (int64_t)blockIdx.x * n;
    float max = -INFINITY;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
        max = fmaxf(max, row[i]);
    max = kt_block_max(max);
    if (max == -INFINITY) { /* everything masked (the same for every thread) */
        for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
            row[i] = 0.0f;
        return;
    }
    double sum = 0.0;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
        const float e = kt_dev_expf(__fsub_rn(row[i], max));
        row[i] = e; /* each thread rewrites only the entries it read */
        sum += e;
    }
    sum = kt_block_sum_double(sum);
    const float inv = (float)(1.0 / sum);
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
        row[i] = __fmul_rn(row[i], inv);
}

extern "C" kt_status kt_cuda_softmax(float *d_x, int64_t rows, int64_t n, void *stream, kt_err *err)
{
    const kt_status st = check_rows(rows, n, "softmax", err);
    if (st != KT_OK)
        return st;
    if (rows == 0 || n == 0)
        return KT_OK;
    if (!d_x)
        return kt_err_set(err, KT_ERR_INVALID, "softmax: NULL pointer");
    softmax_rows<<<(unsigned)rows, OPS_THREADS, 0, (cudaStream_t)stream>>>(d_x, n);
    return kt_cuda_launched("softmax launch", err);
}
