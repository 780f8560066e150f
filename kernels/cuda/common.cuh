/*
 * common.cuh - what kt's CUDA files share: CUDA's errors as a kt_status
 * with a message in the caller's kt_err, scalar conversions and the libm-faithful exp the
 * element-wise ops use, warp and block reductions, and the internal matmul
 * that gemv.cu implements for ffn units and mla.cu (and its BF16 weight copy,
 * for blaslt.cu).
 *
 * Nothing here owns state.  Every helper that contains __syncthreads must be
 * called by all threads of the block.
 */
#ifndef KT_CUDA_COMMON_CUH
#define KT_CUDA_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>

#include "kt_cuda.h"
#include "quant.h"

#define KT_CUDA_MAX_GRID_X 2147483647LL
#define KT_CUDA_MAX_GRID_YZ 65535LL

/* ---- errors -------------------------------------------------------------------- */

/* The kt_status of a CUDA error: out of memory, no usable device or driver,
 * a value CUDA refused, else an i/o failure of the device. */
static inline kt_status kt_cuda_status(cudaError_t e)
{
    switch (e) {
    case cudaErrorMemoryAllocation:
        return KT_ERR_NOMEM;
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
        return KT_ERR_UNSUPPORTED;
    case cudaErrorInvalidValue:
        return KT_ERR_INVALID;
    default:
        return KT_ERR_IO;
    }
}

/* "what: <CUDA's text for e>" into err; returns its status.  Also clears the
 * thread's last CUDA error: cudaGetLastError reports the last failure of any
 * runtime call, so a refused non-launch call (a page-lock, a capture) left
 * there would make the next kernel launch look failed (a sticky kernel fault
 * stays). */
static inline kt_status kt_cuda_fail(kt_err *err, const char *what, cudaError_t e)
{
    (void)cudaGetLastError();
    return kt_err_set(err, kt_cuda_status(e), "%s: %s", what, cudaGetErrorString(e));
}

/* KT_OK if the launch just made was accepted, else its failure in err. */
static inline kt_status kt_cuda_launched(const char *what, kt_err *err)
{
    cudaError_t e = cudaGetLastError();
    return e == cudaSuccess ? KT_OK : kt_cuda_fail(err, what, e);
}

static inline unsigned kt_cuda_blocks(int64_t items, int threads)
{
    return (unsigned)((items + threads - 1) / threads);
}

/* ---- scalars --------------------------------------------------------------------- */

static __device__ __forceinline__ float kt_dev_fp16(uint16_t h)
{
    return __half2float(__ushort_as_half(h)); /* exact, like kt_fp16_to_fp32 */
}

static __device__ __forceinline__ float kt_dev_bf16(uint16_t h)
{
    return __uint_as_float((uint32_t)h << 16);
}

/* An E4M3 code as hf_formats.c's kt_fp8_e4m3_to_f32 decodes it, bit for bit
 * (the NaN codes, which FP8_B128 rows never hold, read as NaN too). */
static __device__ __forceinline__ float kt_dev_e4m3(uint8_t code)
{
    const uint32_t sign = (uint32_t)(code & 0x80u) << 24, exp = (code >> 3) & 0xfu, mant = code & 0x7u;
    if (exp == 0xfu && mant == 0x7u)
        return __uint_as_float(sign | 0x7fc00000u);
    if (exp == 0) { /* subnormal: mant * 2^-9, exact */
        const float mag = __fmul_rn((float)mant, 0.001953125f);
        return sign ? -mag : mag;
    }
    return __uint_as_float(sign | (exp + 120u) << 23 | mant << 20);
}

/* expf as glibc computes it in all but rare last-bit cases: exp in double,
 * rounded once to float (CUDA's float expf may be 2 ulp off).  Used where kt's
 * CPU reference calls expf and the result feeds a comparison (routing) or is
 * compared bit-for-bit (softmax, SiLU). */
static __device__ __forceinline__ float kt_dev_expf(float x)
{
    return (float)exp((double)x);
}

/* 1 / (1 + e^-x) and x / (1 + e^-x), in the CPU's operation order, unfused. */
static __device__ __forceinline__ float kt_dev_sigmoid(float x)
{
    return __fdiv_rn(1.0f, __fadd_rn(1.0f, kt_dev_expf(-x)));
}

static __device__ __forceinline__ float kt_dev_silu(float x)
{
    return __fdiv_rn(x, __fadd_rn(1.0f, kt_dev_expf(-x)));
}

/* ---- reductions -------------------------------------------------------------------- */

static __device__ __forceinline__ float kt_warp_sum(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

static __device__ __forceinline__ double kt_warp_sum_double(double v)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

static __device__ __forceinline__ float kt_warp_max(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* Sum of v over the block (blockDim.x a multiple of 32); every thread gets it. */
static __device__ double kt_block_sum_double(double v)
{
    __shared__ double part[32];
    __shared__ double total;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
    v = kt_warp_sum_double(v);
    __syncthreads(); /* a previous call's readers are done with part and total */
    if (lane == 0)
        part[warp] = v;
    __syncthreads();
    if (warp == 0) {
        double s = lane < n_warps ? part[lane] : 0.0;
        s = kt_warp_sum_double(s);
        if (lane == 0)
            total = s;
    }
    __syncthreads();
    return total;
}

/* Max of v over the block (blockDim.x a multiple of 32); every thread gets it. */
static __device__ float kt_block_max(float v)
{
    __shared__ float part[32];
    __shared__ float total;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
    v = kt_warp_max(v);
    __syncthreads();
    if (lane == 0)
        part[warp] = v;
    __syncthreads();
    if (warp == 0) {
        float m = lane < n_warps ? part[lane] : -INFINITY;
        m = kt_warp_max(m);
        if (lane == 0)
            total = m;
    }
    __syncthreads();
    return total;
}

/* ---- the internal matmul (gemv.cu) ---------------------------------------------- */

enum kt_cuda_mm_epilogue {
    KT_CUDA_MM_STORE = 0,    /* y = acc */
    KT_CUDA_MM_SILU_MUL = 1, /* y = silu(acc) * y: the gate product over the up product already in y */
};

/*
 * n_batch independent products, batch z:
 *     y_z (n_tok, n_out) = x_z (n_tok, n_in) . W_z^T
 * W_z = rows [z*w_batch_rows, z*w_batch_rows + n_out) of w (row_bytes apart);
 * token t of batch z reads x + z*x_batch + row(t)*x_stride, row(t) = t, or
 * x_rows[t] when x_rows is set (a row >= x_rows_limit reads as zeros); it
 * writes y + z*y_batch + t*y_stride.  All strides in elements.
 */
struct kt_cuda_mm_args {
    int type;
    const uint8_t *w;
    size_t row_bytes;
    int64_t n_in, n_out, w_batch_rows;
    const float *x;
    int64_t x_stride, x_batch;
    const uint32_t *x_rows;
    uint32_t x_rows_limit;
    float *y;
    int64_t y_stride, y_batch;
    int64_t n_tok, n_batch;
    int epilogue;
};

/* path: KT_CUDA_MATMUL_*.  Checks every argument; enqueues on s. */
kt_status kt_cuda_mm(const struct kt_cuda_mm_args *a, int path, cudaStream_t s, kt_err *err);

/* KT_OK if the weights can be read as given, else KT_ERR_UNSUPPORTED (type)
 * or KT_ERR_INVALID (no data, shape, alignment) with a message. */
kt_status kt_cuda_mat_check(const struct kt_cuda_mat *w, const char *what, kt_err *err);

/* Bytes of one row of w (row_bytes, or the packed size when 0). */
size_t kt_cuda_mat_row_bytes(const struct kt_cuda_mat *w);

/* dst (n_out, ld) BF16 = w's values as the matmul reads them, rounded to
 * nearest even; columns n_in..ld-1 become 0.  ld >= n_in, a multiple of 8;
 * dst 16-byte aligned.  An F32 w with n_out = n_tok converts activations. */
kt_status kt_cuda_mat_to_bf16(const struct kt_cuda_mat *w, __nv_bfloat16 *d_dst, int64_t ld, cudaStream_t s,
                              kt_err *err);

#endif
