/*
 * gemv.cu - products of GGUF-layout weights with F32 activations:
 * y (n_tok, n_out) = x (n_tok, n_in) . W^T, for F32, F16, BF16, Q8_0, Q5_0, Q4_K,
 * Q5_K and Q6_K weights (the Q4_K_M mix), Q4_0 (a checkpoint's INT4 experts)
 * and FP8_B128 (its block FP8), and the grouped expert FFN built on them.
 *
 * Two paths, one weight reader (load_w8, the same float values as
 * kernels/quant.c's to_float):
 *   GEMV   - decode, up to 8 tokens a block: each warp owns one weight row and
 *            streams it once per 8 tokens; activations are staged in shared
 *            memory 1024 at a time; F32 products, fp32 sums.  Bound by weight
 *            bandwidth at 1-2 tokens, by shared-memory reads of x beyond
 *            (no activation quantization, no register blocking yet).
 *   TENSOR - prefill: a block computes a 64-token x 64-row tile, dequantizing
 *            W and rounding x to BF16 into shared memory 64 columns at a
 *            time, WMMA 16x16x16 BF16 products with fp32 sums.  Not
 *            double-buffered: expect tens of TFLOP/s, not cuBLAS's peak.
 * Neither ever reads outside W's n_out rows, x's rows or past n_in.
 * kt_cuda_mat_to_bf16 hands the same reader's values, rounded to BF16, to
 * blaslt.cu's cuBLASLt path.
 */
#include <cuda_bf16.h>
#include <mma.h>

#include "common.cuh"

/* ---- reading weights ------------------------------------------------------------------ */

/* 6-bit scale and min of sub-block j of a Q4_K super-block (quant.h's kt_k_scale_min). */
static __device__ __forceinline__ void k_scale_min(int j, const uint8_t *s, int *sc, int *m)
{
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4);
        *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

/* w[u] = element k + u of a weight row, u < 8 (k a multiple of 8); elements at
 * or past n_in read as 0.  Bit-identical to the type's to_float. */
static __device__ __forceinline__ void load_w8(int type, const uint8_t *row, int64_t k, int64_t n_in, float w[8])
{
    switch (type) {
    case KT_TYPE_F32: {
        const float *p = (const float *)row;
#pragma unroll
        for (int u = 0; u < 8; u++)
            w[u] = k + u < n_in ? p[k + u] : 0.0f;
        break;
    }
    case KT_TYPE_F16: {
        const uint16_t *p = (const uint16_t *)row;
#pragma unroll
        for (int u = 0; u < 8; u++)
            w[u] = k + u < n_in ? kt_dev_fp16(p[k + u]) : 0.0f;
        break;
    }
    case KT_TYPE_BF16: {
        const uint16_t *p = (const uint16_t *)row;
#pragma unroll
        for (int u = 0; u < 8; u++)
            w[u] = k + u < n_in ? kt_dev_bf16(p[k + u]) : 0.0f;
        break;
    }
    case KT_TYPE_Q8_0: { /* n_in is a multiple of 32: k < n_in means all 8 are inside */
        if (k >= n_in) {
#pragma unroll
            for (int u = 0; u < 8; u++)
                w[u] = 0.0f;
            break;
        }
        const struct kt_block_q8_0 *b = (const struct kt_block_q8_0 *)row + k / KT_QK;
        const float d = kt_dev_fp16(b->d);
        const int8_t *q = b->qs + k % KT_QK;
#pragma unroll
        for (int u = 0; u < 8; u++)
            w[u] = __fmul_rn((float)q[u], d);
        break;
    }
    case KT_TYPE_Q4_K: { /* n_in is a multiple of 256 */
        if (k >= n_in) {
#pragma unroll
            for (int u = 0; u < 8; u++)
                w[u] = 0.0f;
            break;
        }
        const struct kt_block_q4_K *b = (const struct kt_block_q4_K *)row + k / KT_QK_K;
        const int j = (int)(k % KT_QK_K) / 32, l = (int)(k % 32); /* sub-block, offset in it */
        int sc, m;
        k_scale_min(j, b->scales, &sc, &m);
        const float scale = __fmul_rn(kt_dev_fp16(b->d), (float)sc), min = __fmul_rn(kt_dev_fp16(b->dmin), (float)m);
        const uint8_t *q = b->qs + 32 * (j / 2) + l; /* even sub-blocks: low nibbles, odd: high */
        const int shift = (j % 2) * 4;
#pragma unroll
        for (int u = 0; u < 8; u++)
            w[u] = __fsub_rn(__fmul_rn(scale, (float)((q[u] >> shift) & 15)), min);
        break;
    }
    case KT_TYPE_Q4_0: { /* n_in is a multiple of 32; elements e..e+7 are all low or all high nibbles */
        if (k >= n_in) {
#pragma unroll
            for (int u = 0; u < 8; u++)
                w[u] = 0.0f;
            break;
        }
        const struct kt_block_q4_0 *b = (const struct kt_block_q4_0 *)row + k / KT_QK;
        const float d = kt_dev_fp16(b->d);
        const int e = (int)(k % KT_QK);
#pragma unroll
        for (int u = 0; u < 8; u++) {
            const int i = e + u;
            const int nib = i < 16 ? b->qs[i] & 15 : b->qs[i - 16] >> 4;
            w[u] = __fmul_rn((float)(nib - 8), d);
        }
        break;
    }
    case KT_TYPE_FP8_B128: { /* n_in is a multiple of 128; a block is its F32 scale and 128 E4M3 codes */
        if (k >= n_in) {
#pragma unroll
            for (int u = 0; u < 8; u++)
                w[u] = 0.0f;
            break;
        }
        const struct kt_block_fp8_b128 *b = (const struct kt_block_fp8_b128 *)row + k / KT_QK_FP8;
        const uint8_t *q = b->q + k % KT_QK_FP8;
#pragma unroll
        for (int u = 0; u < 8; u++)
            w[u] = __fmul_rn(kt_dev_e4m3(q[u]), b->d);
        break;
    }
    case KT_TYPE_Q5_0: { /* n_in is a multiple of 32 */
        if (k >= n_in) {
#pragma unroll
            for (int u = 0; u < 8; u++)
                w[u] = 0.0f;
            break;
        }
        const struct kt_block_q5_0 *b = (const struct kt_block_q5_0 *)row + k / KT_QK;
        const float d = kt_dev_fp16(b->d);
        const uint32_t qh = (uint32_t)b->qh[0] | (uint32_t)b->qh[1] << 8 | (uint32_t)b->qh[2] << 16 |
                            (uint32_t)b->qh[3] << 24; /* little-endian, only 2-byte aligned */
        const int e = (int)(k % KT_QK);                   /* elements e..e+7: all low or all high nibbles */
#pragma unroll
        for (int u = 0; u < 8; u++) {
            const int i = e + u;
            const int nib = i < 16 ? b->qs[i] & 15 : b->qs[i - 16] >> 4;
            w[u] = __fmul_rn((float)((nib | (int)((qh >> i) & 1) << 4) - 16), d);
        }
        break;
    }
    case KT_TYPE_Q5_K: { /* n_in is a multiple of 256 */
        if (k >= n_in) {
#pragma unroll
            for (int u = 0; u < 8; u++)
                w[u] = 0.0f;
            break;
        }
        const struct kt_block_q5_K *b = (const struct kt_block_q5_K *)row + k / KT_QK_K;
        const int j = (int)(k % KT_QK_K) / 32, l = (int)(k % 32);
        int sc, m;
        k_scale_min(j, b->scales, &sc, &m);
        const float scale = __fmul_rn(kt_dev_fp16(b->d), (float)sc), min = __fmul_rn(kt_dev_fp16(b->dmin), (float)m);
        const uint8_t *q = b->qs + 32 * (j / 2) + l;
        const int shift = (j % 2) * 4;
#pragma unroll
        for (int u = 0; u < 8; u++) {
            const int v = ((q[u] >> shift) & 15) | ((b->qh[l + u] >> j) & 1) << 4; /* bit j of qh: sub-block j */
            w[u] = __fsub_rn(__fmul_rn(scale, (float)v), min);
        }
        break;
    }
    case KT_TYPE_Q6_K: { /* n_in is a multiple of 256 */
        if (k >= n_in) {
#pragma unroll
            for (int u = 0; u < 8; u++)
                w[u] = 0.0f;
            break;
        }
        const struct kt_block_q6_K *b = (const struct kt_block_q6_K *)row + k / KT_QK_K;
        const int i = (int)(k % KT_QK_K), half = i / 128, quarter = i % 128 / 32, l = i % 32;
        const uint8_t *ql = b->ql + 64 * half + (quarter & 1 ? 32 : 0) + l; /* quarters 1, 3: ql[l + 32] */
        const uint8_t *qh = b->qh + 32 * half + l;
        const float scale = __fmul_rn(kt_dev_fp16(b->d), (float)b->scales[i / 16]); /* 8 values share a 16-group */
#pragma unroll
        for (int u = 0; u < 8; u++) {
            const int low = quarter < 2 ? ql[u] & 15 : ql[u] >> 4;
            const int high = (qh[u] >> (2 * quarter)) & 3;
            w[u] = __fmul_rn(scale, (float)((low | high << 4) - 32));
        }
        break;
    }
    default:
#pragma unroll
        for (int u = 0; u < 8; u++)
            w[u] = 0.0f;
        break;
    }
}

/* Row row(t) of x for batch z, or NULL when it reads as zeros. */
static __device__ __forceinline__ const float *x_row(const struct kt_cuda_mm_args &a, int64_t z, int64_t t)
{
    if (t >= a.n_tok)
        return NULL;
    int64_t r = t;
    if (a.x_rows) {
        r = a.x_rows[t];
        if (r >= (int64_t)a.x_rows_limit)
            return NULL;
    }
    return a.x + z * a.x_batch + r * a.x_stride;
}

static __device__ __forceinline__ void store_y(const struct kt_cuda_mm_args &a, int64_t z, int64_t t, int64_t r,
                                               float acc)
{
    float *y = a.y + z * a.y_batch + t * a.y_stride + r;
    *y = a.epilogue == KT_CUDA_MM_SILU_MUL ? __fmul_rn(kt_dev_silu(acc), *y) : acc;
}

/* ---- GEMV path ------------------------------------------------------------------------- */

#define GEMV_WARPS 8
#define GEMV_TOKENS 8
#define GEMV_CHUNK 1024 /* a multiple of 256 (8 values x 32 lanes, and the Q4_K super-block) */

/* Block (row group, token group, batch): warp w owns row blockIdx.x*8 + w. */
__global__ static void __launch_bounds__(GEMV_WARPS * 32) mm_gemv(const struct kt_cuda_mm_args a)
{
    __shared__ __align__(16) float xs[GEMV_TOKENS][GEMV_CHUNK]; /* (tokens, chunk of n_in) */
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t r = (int64_t)blockIdx.x * GEMV_WARPS + warp;
    const int64_t t0 = (int64_t)blockIdx.y * GEMV_TOKENS, z = blockIdx.z;
    const int nt = (int)(a.n_tok - t0 < GEMV_TOKENS ? a.n_tok - t0 : GEMV_TOKENS);
    const bool has_row = r < a.n_out; /* the same for a whole warp */
    const uint8_t *wrow = a.w + (size_t)(z * a.w_batch_rows + (has_row ? r : 0)) * a.row_bytes;
    float acc[GEMV_TOKENS];
#pragma unroll
    for (int t = 0; t < GEMV_TOKENS; t++)
        acc[t] = 0.0f;

    for (int64_t k0 = 0; k0 < a.n_in; k0 += GEMV_CHUNK) {
        const int len = (int)(a.n_in - k0 < GEMV_CHUNK ? a.n_in - k0 : GEMV_CHUNK);
        __syncthreads(); /* the previous chunk has been read */
        for (int t = 0; t < nt; t++) { /* whole chunk written, zeros past len */
            const float *xr = x_row(a, z, t0 + t);
            for (int i = threadIdx.x; i < GEMV_CHUNK; i += blockDim.x)
                xs[t][i] = xr && i < len ? xr[k0 + i] : 0.0f;
        }
        __syncthreads();
        if (has_row) {
            for (int i = lane * 8; i < len; i += 32 * 8) {
                float w[8];
                load_w8(a.type, wrow, k0 + i, a.n_in, w);
#pragma unroll
                for (int t = 0; t < GEMV_TOKENS; t++) {
                    if (t < nt) {
                        const float4 lo = *(const float4 *)&xs[t][i], hi = *(const float4 *)&xs[t][i + 4];
                        acc[t] += w[0] * lo.x + w[1] * lo.y + w[2] * lo.z + w[3] * lo.w + w[4] * hi.x +
                                  w[5] * hi.y + w[6] * hi.z + w[7] * hi.w;
                    }
                }
            }
        }
    }
    if (has_row) {
#pragma unroll
        for (int t = 0; t < GEMV_TOKENS; t++) {
            if (t < nt) {
                const float s = kt_warp_sum(acc[t]);
                if (lane == 0)
                    store_y(a, z, t0 + t, r, s);
            }
        }
    }
}

/* ---- tensor-core path ------------------------------------------------------------------- */

#define TC_TOKENS 64 /* M: tokens per block tile */
#define TC_ROWS 64   /* N: weight rows per block tile */
#define TC_K 64      /* K: columns of n_in staged at a time */
#define TC_PAD 8     /* bf16 row padding: keeps WMMA's 32-byte alignment, spreads banks */
#define TC_THREADS 256

/* Block (row tile, token tile, batch); warp w computes tokens 16*(w%4).. and rows 32*(w/4).. (2 fragments). */
__global__ static void __launch_bounds__(TC_THREADS) mm_tensor(const struct kt_cuda_mm_args a)
{
    using namespace nvcuda;
    __shared__ __align__(32) __nv_bfloat16 xs[TC_TOKENS][TC_K + TC_PAD]; /* A: (tokens, k) row-major */
    __shared__ __align__(32) __nv_bfloat16 ws[TC_ROWS][TC_K + TC_PAD];   /* B: (k, rows) column-major */
    __shared__ __align__(32) float cs[TC_TOKENS][TC_ROWS + 4];           /* C: (tokens, rows) */
    const int tid = threadIdx.x, warp = tid >> 5;
    const int64_t r0 = (int64_t)blockIdx.x * TC_ROWS, t0 = (int64_t)blockIdx.y * TC_TOKENS, z = blockIdx.z;
    const int wt = 16 * (warp % 4), wr = 32 * (warp / 4);

    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[2];
    wmma::fill_fragment(acc[0], 0.0f);
    wmma::fill_fragment(acc[1], 0.0f);

    for (int64_t k0 = 0; k0 < a.n_in; k0 += TC_K) {
        /* 8 consecutive values per thread-iteration: (token or row, k group of 8) */
        for (int g = tid; g < TC_TOKENS * (TC_K / 8); g += TC_THREADS) {
            const int tt = g / (TC_K / 8), kk = (g % (TC_K / 8)) * 8;
            const float *xr = x_row(a, z, t0 + tt);
#pragma unroll
            for (int u = 0; u < 8; u++) {
                const int64_t k = k0 + kk + u;
                xs[tt][kk + u] = __float2bfloat16_rn(xr && k < a.n_in ? xr[k] : 0.0f);
            }
        }
        for (int g = tid; g < TC_ROWS * (TC_K / 8); g += TC_THREADS) {
            const int rr = g / (TC_K / 8), kk = (g % (TC_K / 8)) * 8;
            float w[8];
            if (r0 + rr < a.n_out) {
                load_w8(a.type, a.w + (size_t)(z * a.w_batch_rows + r0 + rr) * a.row_bytes, k0 + kk, a.n_in, w);
            } else {
#pragma unroll
                for (int u = 0; u < 8; u++)
                    w[u] = 0.0f;
            }
#pragma unroll
            for (int u = 0; u < 8; u++)
                ws[rr][kk + u] = __float2bfloat16_rn(w[u]);
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < TC_K; kk += 16) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fa;
            wmma::load_matrix_sync(fa, &xs[wt][kk], TC_K + TC_PAD);
#pragma unroll
            for (int f = 0; f < 2; f++) {
                wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> fb;
                wmma::load_matrix_sync(fb, &ws[wr + 16 * f][kk], TC_K + TC_PAD);
                wmma::mma_sync(acc[f], fa, fb, acc[f]);
            }
        }
        __syncthreads(); /* xs and ws are refilled next */
    }
    wmma::store_matrix_sync(&cs[wt][wr], acc[0], TC_ROWS + 4, wmma::mem_row_major);
    wmma::store_matrix_sync(&cs[wt][wr + 16], acc[1], TC_ROWS + 4, wmma::mem_row_major);
    __syncthreads();
    for (int i = tid; i < TC_TOKENS * TC_ROWS; i += TC_THREADS) {
        const int tt = i / TC_ROWS, rr = i % TC_ROWS; /* consecutive threads: consecutive rows of y */
        if (t0 + tt < a.n_tok && r0 + rr < a.n_out)
            store_y(a, z, t0 + tt, r0 + rr, cs[tt][rr]);
    }
}

/* ---- host side ------------------------------------------------------------------------- */

static bool type_supported(int type)
{
    return type == KT_TYPE_F32 || type == KT_TYPE_F16 || type == KT_TYPE_BF16 || type == KT_TYPE_Q8_0 ||
           type == KT_TYPE_Q4_0 || type == KT_TYPE_Q5_0 || type == KT_TYPE_Q4_K || type == KT_TYPE_Q5_K ||
           type == KT_TYPE_Q6_K || type == KT_TYPE_FP8_B128;
}

size_t kt_cuda_mat_row_bytes(const struct kt_cuda_mat *w)
{
    return w->row_bytes ? w->row_bytes : kt_type_row_bytes(w->type, w->n_in);
}

kt_status kt_cuda_mat_check(const struct kt_cuda_mat *w, const char *what, kt_err *err)
{
    if (!w || !w->data)
        return kt_err_set(err, KT_ERR_INVALID, "%s: no weights", what);
    if (!type_supported(w->type))
        return kt_err_set(err, KT_ERR_UNSUPPORTED,
                          "%s: type %s not supported on CUDA (f32, f16, bf16, q8_0, q4_0, q5_0, q4_K, q5_K, q6_K, "
                          "fp8_b128)", what,
                          kt_type_name(w->type));
    const size_t packed = kt_type_row_bytes(w->type, w->n_in);
    if (w->n_in <= 0 || w->n_out <= 0 || packed == 0)
        return kt_err_set(err, KT_ERR_INVALID, "%s: bad shape %lld x %lld for %s", what, (long long)w->n_out,
                          (long long)w->n_in, kt_type_name(w->type));
    const size_t row_bytes = kt_cuda_mat_row_bytes(w),
                 align = w->type == KT_TYPE_F32 || w->type == KT_TYPE_FP8_B128 ? 4 : 2; /* FP8_B128's F32 scales */
    if (row_bytes < packed)
        return kt_err_set(err, KT_ERR_INVALID, "%s: rows of %zu bytes hold fewer than %lld %s values", what, row_bytes,
                          (long long)w->n_in, kt_type_name(w->type));
    if ((uintptr_t)w->data % align != 0 || row_bytes % align != 0)
        return kt_err_set(err, KT_ERR_INVALID, "%s: %s rows must be %zu-byte aligned", what, kt_type_name(w->type),
                          align);
    return KT_OK;
}

extern "C" kt_status kt_cuda_mat_usable(const struct kt_cuda_mat *w, const char *what, kt_err *err)
{
    return kt_cuda_mat_check(w, what, err);
}

kt_status kt_cuda_mm(const struct kt_cuda_mm_args *a, int path, cudaStream_t s, kt_err *err)
{
    struct kt_cuda_mat w = {a->type, a->w, a->n_in, a->n_out, a->row_bytes};
    kt_status st = kt_cuda_mat_check(&w, "matmul", err);
    if (st != KT_OK)
        return st;
    if (a->n_tok < 0 || a->n_batch < 1 || a->n_batch > KT_CUDA_MAX_GRID_YZ)
        return kt_err_set(err, KT_ERR_INVALID, "matmul: bad token count %lld or batch count %lld", (long long)a->n_tok,
                          (long long)a->n_batch);
    if (a->n_tok == 0)
        return KT_OK;
    if (!a->x || !a->y || a->y_stride < a->n_out || (!a->x_rows && a->x_stride < a->n_in && a->n_tok > 1))
        return kt_err_set(err, KT_ERR_INVALID, "matmul: NULL activations or output, or rows overlapping");
    if (a->epilogue != KT_CUDA_MM_STORE && a->epilogue != KT_CUDA_MM_SILU_MUL)
        return kt_err_set(err, KT_ERR_INVALID, "matmul: unknown epilogue %d", a->epilogue);
    if (path == KT_CUDA_MATMUL_AUTO)
        path = a->n_tok <= GEMV_TOKENS ? KT_CUDA_MATMUL_GEMV : KT_CUDA_MATMUL_TENSOR;
    if (path == KT_CUDA_MATMUL_GEMV) {
        const int64_t gx = (a->n_out + GEMV_WARPS - 1) / GEMV_WARPS, gy = (a->n_tok + GEMV_TOKENS - 1) / GEMV_TOKENS;
        if (gx > KT_CUDA_MAX_GRID_X || gy > KT_CUDA_MAX_GRID_YZ)
            return kt_err_set(err, KT_ERR_INVALID, "matmul: %lld rows x %lld tokens exceed the GEMV grid",
                              (long long)a->n_out, (long long)a->n_tok);
        mm_gemv<<<dim3((unsigned)gx, (unsigned)gy, (unsigned)a->n_batch), GEMV_WARPS * 32, 0, s>>>(*a);
        return kt_cuda_launched("matmul (gemv) launch", err);
    }
    if (path == KT_CUDA_MATMUL_TENSOR) {
        const int64_t gx = (a->n_out + TC_ROWS - 1) / TC_ROWS, gy = (a->n_tok + TC_TOKENS - 1) / TC_TOKENS;
        if (gx > KT_CUDA_MAX_GRID_X || gy > KT_CUDA_MAX_GRID_YZ)
            return kt_err_set(err, KT_ERR_INVALID, "matmul: %lld rows x %lld tokens exceed the tensor grid",
                              (long long)a->n_out, (long long)a->n_tok);
        mm_tensor<<<dim3((unsigned)gx, (unsigned)gy, (unsigned)a->n_batch), TC_THREADS, 0, s>>>(*a);
        return kt_cuda_launched("matmul (tensor) launch", err);
    }
    return kt_err_set(err, KT_ERR_INVALID, "matmul: unknown path %d", path);
}

extern "C" kt_status kt_cuda_matmul(const struct kt_cuda_mat *w, const float *d_x, int64_t n_tok, float *d_y, int path,
                                    void *stream, kt_err *err)
{
    if (!w)
        return kt_err_set(err, KT_ERR_INVALID, "matmul: no weights");
    struct kt_cuda_mm_args a = {};
    a.type = w->type;
    a.w = (const uint8_t *)w->data;
    a.row_bytes = kt_cuda_mat_row_bytes(w);
    a.n_in = w->n_in;
    a.n_out = w->n_out;
    a.x = d_x;
    a.x_stride = w->n_in;
    a.y = d_y;
    a.y_stride = w->n_out;
    a.n_tok = n_tok;
    a.n_batch = 1;
    a.epilogue = KT_CUDA_MM_STORE;
    return kt_cuda_mm(&a, path, (cudaStream_t)stream, err);
}

/* ---- BF16 copies for cuBLASLt (blaslt.cu) ------------------------------------------------ */

/* Thread g writes the 8 values at column 8*(g % (ld/8)) of row g / (ld/8) with one 16-byte store. */
__global__ static void mat_to_bf16(int type, const uint8_t *w, size_t row_bytes, int64_t n_in, int64_t n_rows,
                                   __nv_bfloat16 *dst, int64_t ld)
{
    const int64_t groups = ld / 8, g = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (g >= n_rows * groups)
        return;
    const int64_t r = g / groups, k = (g % groups) * 8;
    float v[8];
    load_w8(type, w + (size_t)r * row_bytes, k, n_in, v); /* zeros past n_in */
    uint32_t pair[4];
#pragma unroll
    for (int u = 0; u < 4; u++) /* element 2u in the low half: little-endian memory order */
        pair[u] = (uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(v[2 * u])) |
                  (uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(v[2 * u + 1])) << 16;
    *(uint4 *)(dst + r * ld + k) = make_uint4(pair[0], pair[1], pair[2], pair[3]);
}

kt_status kt_cuda_mat_to_bf16(const struct kt_cuda_mat *w, __nv_bfloat16 *d_dst, int64_t ld, cudaStream_t s,
                              kt_err *err)
{
    kt_status st = kt_cuda_mat_check(w, "bf16 copy", err);
    if (st != KT_OK)
        return st;
    if (!d_dst || (uintptr_t)d_dst % 16 != 0 || ld < w->n_in || ld % 8 != 0)
        return kt_err_set(err, KT_ERR_INVALID, "bf16 copy: destination NULL, not 16-byte aligned, or bad ld %lld",
                          (long long)ld);
    const int threads = 256;
    const int64_t blocks = (w->n_out * (ld / 8) + threads - 1) / threads;
    if (blocks > KT_CUDA_MAX_GRID_X)
        return kt_err_set(err, KT_ERR_INVALID, "bf16 copy: %lld rows of %lld exceed the grid", (long long)w->n_out,
                          (long long)ld);
    mat_to_bf16<<<(unsigned)blocks, threads, 0, s>>>(w->type, (const uint8_t *)w->data, kt_cuda_mat_row_bytes(w),
                                                     w->n_in, w->n_out, d_dst, ld);
    return kt_cuda_launched("bf16 copy launch", err);
}

/* ---- grouped expert FFN ------------------------------------------------------------------ */

static kt_status check_unit(const struct kt_cuda_ffn_unit *u, uint32_t i, int64_t n_embd, uint32_t n_pairs,
                            int64_t act_stride, kt_err *err)
{
    char what[64];
    kt_status st;
    snprintf(what, sizeof what, "ffn unit %u gate", i);
    if ((st = kt_cuda_mat_check(&u->gate, what, err)) != KT_OK)
        return st;
    snprintf(what, sizeof what, "ffn unit %u up", i);
    if ((st = kt_cuda_mat_check(&u->up, what, err)) != KT_OK)
        return st;
    snprintf(what, sizeof what, "ffn unit %u down", i);
    if ((st = kt_cuda_mat_check(&u->down, what, err)) != KT_OK)
        return st;
    const int64_t n_ff = u->gate.n_out;
    if (u->gate.n_in != n_embd || u->up.n_in != n_embd || u->up.n_out != n_ff || u->down.n_in != n_ff ||
        u->down.n_out != n_embd)
        return kt_err_set(err, KT_ERR_INVALID,
                          "ffn unit %u: shapes gate %lldx%lld, up %lldx%lld, down %lldx%lld do not chain over "
                          "n_embd %lld",
                          i, (long long)u->gate.n_out, (long long)u->gate.n_in, (long long)u->up.n_out,
                          (long long)u->up.n_in, (long long)u->down.n_out, (long long)u->down.n_in,
                          (long long)n_embd);
    if (n_ff > act_stride)
        return kt_err_set(err, KT_ERR_INVALID, "ffn unit %u: n_ff %lld exceeds the act stride %lld", i, (long long)n_ff,
                          (long long)act_stride);
    if ((uint64_t)u->first_pair + u->n_pairs > n_pairs)
        return kt_err_set(err, KT_ERR_INVALID, "ffn unit %u: pairs [%u, %llu) past the %u pairs", i, u->first_pair,
                          (unsigned long long)u->first_pair + u->n_pairs, n_pairs);
    return KT_OK;
}

extern "C" kt_status kt_cuda_ffn_units(const struct kt_cuda_ffn_unit *units, uint32_t n_units, const float *d_h,
                                       int64_t n_tok, int64_t n_embd, const uint32_t *d_pair_token, uint32_t n_pairs,
                                       float *d_act, int64_t act_stride, float *d_pair_out, void *stream, kt_err *err)
{
    if (n_units == 0)
        return KT_OK;
    if (!units || !d_h || !d_pair_token || !d_act || !d_pair_out || n_embd <= 0 || n_tok < 0 || n_tok > UINT32_MAX)
        return kt_err_set(err, KT_ERR_INVALID, "ffn units: NULL buffer or bad shape (n_embd %lld, n_tok %lld)",
                          (long long)n_embd, (long long)n_tok);
    kt_status st;
    for (uint32_t i = 0; i < n_units; i++)
        if ((st = check_unit(&units[i], i, n_embd, n_pairs, act_stride, err)) != KT_OK)
            return st;
    cudaStream_t s = (cudaStream_t)stream;
    for (uint32_t i = 0; i < n_units; i++) {
        const struct kt_cuda_ffn_unit *u = &units[i];
        if (u->n_pairs == 0)
            continue;
        const int path = u->n_pairs <= GEMV_TOKENS ? KT_CUDA_MATMUL_GEMV : KT_CUDA_MATMUL_TENSOR;
        float *act = d_act + (size_t)u->first_pair * act_stride; /* (n_pairs, act_stride) */
        struct kt_cuda_mm_args a = {};
        a.n_batch = 1;
        a.n_tok = u->n_pairs;

        /* act = up . h[token], then act = silu(gate . h[token]) * act */
        a.x = d_h;
        a.x_stride = n_embd;
        a.x_rows = d_pair_token + u->first_pair;
        a.x_rows_limit = (uint32_t)n_tok;
        a.y = act;
        a.y_stride = act_stride;
        const struct kt_cuda_mat *in[2] = {&u->up, &u->gate};
        for (int j = 0; j < 2; j++) {
            a.type = in[j]->type;
            a.w = (const uint8_t *)in[j]->data;
            a.row_bytes = kt_cuda_mat_row_bytes(in[j]);
            a.n_in = in[j]->n_in;
            a.n_out = in[j]->n_out;
            a.epilogue = j == 0 ? KT_CUDA_MM_STORE : KT_CUDA_MM_SILU_MUL;
            if ((st = kt_cuda_mm(&a, path, s, err)) != KT_OK)
                return st;
        }

        /* pair_out = down . act */
        a.type = u->down.type;
        a.w = (const uint8_t *)u->down.data;
        a.row_bytes = kt_cuda_mat_row_bytes(&u->down);
        a.n_in = u->down.n_in;
        a.n_out = u->down.n_out;
        a.x = act;
        a.x_stride = act_stride;
        a.x_rows = NULL;
        a.x_rows_limit = 0;
        a.y = d_pair_out + (size_t)u->first_pair * n_embd;
        a.y_stride = n_embd;
        a.epilogue = KT_CUDA_MM_STORE;
        if ((st = kt_cuda_mm(&a, path, s, err)) != KT_OK)
            return st;
    }
    return KT_OK;
}
