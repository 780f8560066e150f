/*
 * dequant.cu - GPU dequantization of GGUF weight blocks to F32.
 *
 * One thread per output element group: each thread decodes one sub-block-sized
 * run so the block header is read once per run.  Exactly the math of the
 * scalar reference (kernels/quant.c); tests/test_cuda_dequant.c compares the
 * two on odd shapes.  Must never assume a device exists: every entry point
 * reports errors instead of aborting.
 */
#include <string.h>

#include "common.cuh"

static __device__ float fp16_to_f32(kt_fp16 h)
{
    uint32_t sign = (uint32_t)(h >> 15) << 31;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t man = h & 0x3ff;
    uint32_t bits;
    if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else { /* subnormal: renormalise */
            int e = -1;
            do {
                e++;
                man <<= 1;
            } while ((man & 0x400) == 0);
            bits = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3ff) << 13);
        }
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | (man << 13);
    } else {
        bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    return __uint_as_float(bits);
}

/* ---- one kernel per type; i indexes the run each thread decodes --------------- */

__global__ static void dequant_f16(const kt_fp16 *x, float *y, int64_t n)
{
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        y[i] = fp16_to_f32(x[i]);
}

__global__ static void dequant_bf16(const kt_bf16 *x, float *y, int64_t n)
{
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        y[i] = __uint_as_float((uint32_t)x[i] << 16);
}

/* Q8_0: run = one block of 32. */
__global__ static void dequant_q8_0(const struct kt_block_q8_0 *x, float *y, int64_t nblocks)
{
    int64_t b = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (b >= nblocks)
        return;
    float d = fp16_to_f32(x[b].d);
    for (int j = 0; j < KT_QK; j++)
        y[b * KT_QK + j] = d * (float)x[b].qs[j];
}

/* Q4_0: run = one block of 32, low nibbles then high ones, q - 8. */
__global__ static void dequant_q4_0(const struct kt_block_q4_0 *x, float *y, int64_t nblocks)
{
    int64_t b = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (b >= nblocks)
        return;
    float d = fp16_to_f32(x[b].d);
    for (int j = 0; j < KT_QK / 2; j++) {
        y[b * KT_QK + j] = (float)((x[b].qs[j] & 15) - 8) * d;
        y[b * KT_QK + j + KT_QK / 2] = (float)((x[b].qs[j] >> 4) - 8) * d;
    }
}

/* FP8_B128: run = one block of 128, E4M3 codes times the block's F32 scale. */
__global__ static void dequant_fp8_b128(const struct kt_block_fp8_b128 *x, float *y, int64_t nblocks)
{
    int64_t b = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (b >= nblocks)
        return;
    for (int j = 0; j < KT_QK_FP8; j++)
        y[b * KT_QK_FP8 + j] = kt_dev_e4m3(x[b].q[j]) * x[b].d;
}

/* 6-bit scale and min of sub-block j of a Q4_K/Q5_K super-block. */
static __device__ void scale_min_k4(int j, const uint8_t *s, uint8_t *sc, uint8_t *m)
{
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (uint8_t)((s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4));
        *m = (uint8_t)((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
    }
}

/* Q4_K / Q5_K: run = one 32-element sub-block (8 per super-block). */
__global__ static void dequant_q4_K(const struct kt_block_q4_K *x, float *y, int64_t nsub)
{
    int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= nsub)
        return;
    const struct kt_block_q4_K *b = &x[t / 8];
    int j = (int)(t % 8); /* sub-block: chunk c = j/2 of 64 values, low nibbles for even j */
    uint8_t sc, m;
    scale_min_k4(j, b->scales, &sc, &m);
    float d = fp16_to_f32(b->d) * sc, mn = fp16_to_f32(b->dmin) * m;
    const uint8_t *q = b->qs + 32 * (j / 2);
    int shift = (j % 2) * 4;
    for (int l = 0; l < 32; l++)
        y[t * 32 + l] = __fsub_rn(__fmul_rn(d, (float)((q[l] >> shift) & 15)), mn);
}

__global__ static void dequant_q5_K(const struct kt_block_q5_K *x, float *y, int64_t nsub)
{
    int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= nsub)
        return;
    const struct kt_block_q5_K *b = &x[t / 8];
    int j = (int)(t % 8);
    uint8_t sc, m;
    scale_min_k4(j, b->scales, &sc, &m);
    float d = fp16_to_f32(b->d) * sc, mn = fp16_to_f32(b->dmin) * m;
    const uint8_t *q = b->qs + 32 * (j / 2);
    int shift = (j % 2) * 4;
    for (int l = 0; l < 32; l++) {
        int hi = (b->qh[l] >> j) & 1;
        y[t * 32 + l] = __fsub_rn(__fmul_rn(d, (float)(((q[l] >> shift) & 15) + 16 * hi)), mn);
    }
}

/* Q6_K: run = 32 values of one quarter of a 128-value half (8 runs per block). */
__global__ static void dequant_q6_K(const struct kt_block_q6_K *x, float *y, int64_t nrun)
{
    int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= nrun)
        return;
    const struct kt_block_q6_K *b = &x[t / 8];
    int r = (int)(t % 8);
    int half = r / 4, quarter = r % 4; /* quarter selects q1..q4 of the reference formula */
    const uint8_t *ql = b->ql + 64 * half;
    const uint8_t *qh = b->qh + 32 * half;
    const int8_t *sc = b->scales + 8 * half;
    float d = fp16_to_f32(b->d);
    float *out = y + (t / 8) * KT_QK_K + 128 * half + 32 * quarter;
    for (int l = 0; l < 32; l++) {
        int low = quarter & 1 ? ql[l + 32] : ql[l];
        low = quarter < 2 ? (low & 15) : (low >> 4);
        int high = (qh[l] >> (2 * quarter)) & 3;
        int q = (low | (high << 4)) - 32;
        out[l] = __fmul_rn(__fmul_rn(d, (float)sc[l / 16 + 2 * quarter]), (float)q);
    }
}

/* ---- host entry points ------------------------------------------------------- */

extern "C" int kt_cuda_device_count(kt_err *why)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        kt_err_set(why, KT_ERR_UNSUPPORTED, "%s", cudaGetErrorString(e));
        return 0;
    }
    if (n == 0)
        kt_err_set(why, KT_ERR_UNSUPPORTED, "no CUDA device present");
    return n;
}

static unsigned grid_for(int64_t runs, int threads)
{
    return (unsigned)((runs + threads - 1) / threads);
}

extern "C" kt_status kt_cuda_dequantize(int type, const void *d_src, float *d_dst, int64_t n, void *stream, kt_err *err)
{
    const struct kt_type_traits *tr = kt_type_traits(type);
    if (!tr || n < 0 || n % tr->block_elems != 0)
        return kt_err_set(err, KT_ERR_INVALID, "dequantize: bad type %d or length %lld", type, (long long)n);
    cudaStream_t s = (cudaStream_t)stream;
    const int threads = 256;
    if (n == 0)
        return KT_OK;
    cudaError_t e;
    switch (type) {
    case KT_TYPE_F32:
        e = cudaMemcpyAsync(d_dst, d_src, (size_t)n * 4, cudaMemcpyDeviceToDevice, s);
        return e == cudaSuccess ? KT_OK : kt_cuda_fail(err, "dequantize copy", e);
    case KT_TYPE_F16:
        dequant_f16<<<grid_for(n, threads), threads, 0, s>>>((const kt_fp16 *)d_src, d_dst, n);
        break;
    case KT_TYPE_BF16:
        dequant_bf16<<<grid_for(n, threads), threads, 0, s>>>((const kt_bf16 *)d_src, d_dst, n);
        break;
    case KT_TYPE_Q8_0:
        dequant_q8_0<<<grid_for(n / KT_QK, threads), threads, 0, s>>>((const struct kt_block_q8_0 *)d_src, d_dst,
                                                                       n / KT_QK);
        break;
    case KT_TYPE_Q4_0:
        dequant_q4_0<<<grid_for(n / KT_QK, threads), threads, 0, s>>>((const struct kt_block_q4_0 *)d_src, d_dst,
                                                                       n / KT_QK);
        break;
    case KT_TYPE_FP8_B128:
        dequant_fp8_b128<<<grid_for(n / KT_QK_FP8, threads), threads, 0, s>>>(
            (const struct kt_block_fp8_b128 *)d_src, d_dst, n / KT_QK_FP8);
        break;
    case KT_TYPE_Q4_K:
        dequant_q4_K<<<grid_for(n / 32, threads), threads, 0, s>>>((const struct kt_block_q4_K *)d_src, d_dst, n / 32);
        break;
    case KT_TYPE_Q5_K:
        dequant_q5_K<<<grid_for(n / 32, threads), threads, 0, s>>>((const struct kt_block_q5_K *)d_src, d_dst, n / 32);
        break;
    case KT_TYPE_Q6_K:
        dequant_q6_K<<<grid_for(n / 32, threads), threads, 0, s>>>((const struct kt_block_q6_K *)d_src, d_dst, n / 32);
        break;
    default:
        return kt_err_set(err, KT_ERR_UNSUPPORTED, "dequantize: type %s not supported on CUDA", tr->name);
    }
    return kt_cuda_launched("dequantize launch", err);
}

extern "C" kt_status kt_cuda_dequantize_host(int type, const void *src, float *dst, int64_t n, kt_err *err)
{
    size_t in_bytes = kt_type_row_bytes(type, n);
    if (in_bytes == 0 && n != 0)
        return kt_err_set(err, KT_ERR_INVALID, "dequantize: bad type %d or length %lld", type, (long long)n);
    void *d_src = NULL;
    float *d_dst = NULL;
    kt_status st = KT_OK;
    cudaError_t e;
    if ((e = cudaMalloc(&d_src, in_bytes ? in_bytes : 1)) != cudaSuccess)
        return kt_cuda_fail(err, "cudaMalloc", e);
    if ((e = cudaMalloc((void **)&d_dst, n ? (size_t)n * sizeof(float) : 1)) != cudaSuccess) {
        st = kt_cuda_fail(err, "cudaMalloc", e);
        goto done;
    }
    if ((e = cudaMemcpy(d_src, src, in_bytes, cudaMemcpyHostToDevice)) != cudaSuccess) {
        st = kt_cuda_fail(err, "copy to device", e);
        goto done;
    }
    if ((st = kt_cuda_dequantize(type, d_src, d_dst, n, NULL, err)) != KT_OK)
        goto done;
    if ((e = cudaMemcpy(dst, d_dst, (size_t)n * sizeof(float), cudaMemcpyDeviceToHost)) != cudaSuccess)
        st = kt_cuda_fail(err, "copy to host", e);
done:
    cudaFree(d_src);
    cudaFree(d_dst);
    return st;
}
