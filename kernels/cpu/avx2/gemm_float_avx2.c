/*
 * gemm_float_avx2.c - AVX2/FMA prefill products for F32, F16 and BF16
 * weights against F32 activations: y[t][r] = dot(W[r], A[t]) for many
 * tokens t at once (dense float tensors during prefill).
 *
 * The float dot products (vec_dot_float_avx2.c) do not equal the reference
 * (it sums in double); what a gemm row must equal is vec_dot itself, bit for
 * bit.  vec_dot is 32 float lanes, lane e taking w[i+e]*a[i+e] by FMA for
 * every full chunk of 32, then a fixed finish (float_dot_finish.h).  Lanes
 * are independent, so only the order inside a lane matters, and it is
 * vec_dot's.  Register tile: one row x 6 tokens over half the lanes at a
 * time (12 accumulators): the chunks are walked twice, lanes 0-15 then
 * 16-31, and each half-chunk of weights is widened once for 6 tokens.
 * BF16 is widened without shuffles (a 32-bit word holds elements 2l and
 * 2l+1: shift left 16 for the even one, mask for the odd one), so its lanes
 * hold even and odd elements in separate vectors; the activations are
 * staged in that order and the finish puts the lanes back in natural order.
 *
 * This file must never reorder a lane's chunks, fuse or split a step
 * differently from vec_dot (-ffp-contract=off), or read a row past its n
 * elements.  A short last token group repeats its last token and stores
 * only the real ones.  If the scratch cannot be allocated the call falls
 * back to one vec_dot per pair.
 */
#include "cpu/avx2/float_dot_finish.h"
#include "cpu/avx2/gemm_float_avx2.h"
#include "cpu/avx2/kernels_avx2.h"
#include "cpu/avx2/simd_avx2.h"

#include <stdbool.h>
#include <stdlib.h>

#define KT_FGEMM_TOKENS 6
#define KT_FGEMM_K_BLOCK 1024    /* elements: 6 x 4 KiB of activations in L1 */
#define KT_FGEMM_PANEL_ROWS 64   /* a K block of 64 rows: 256 KiB of F32 in L2 */
#define KT_FGEMM_BLOCK_TOKENS 48 /* lanes of 64 x 48 pairs: 384 KiB of scratch */

static inline int64_t min_i64(int64_t a, int64_t b)
{
    return a < b ? a : b;
}

/* ---- half h of a chunk of 32 weights (elements 16h .. 16h+15) -> 2 vectors --------- */

static inline void half_f32(const void *x, int64_t i, int h, __m256 w[2])
{
    const float *p = (const float *)x + i + 16 * h;
    w[0] = _mm256_loadu_ps(p);
    w[1] = _mm256_loadu_ps(p + 8);
}

static inline void half_f16(const void *x, int64_t i, int h, __m256 w[2])
{
    const kt_fp16 *p = (const kt_fp16 *)x + i + 16 * h;
    w[0] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
    w[1] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 8)));
}

/* Vector 0 holds elements 16h + 2l, vector 1 elements 16h + 2l + 1. */
static inline void half_bf16(const void *x, int64_t i, int h, __m256 w[2])
{
    const __m256i z = _mm256_loadu_si256((const __m256i *)((const kt_bf16 *)x + i + 16 * h));
    w[0] = _mm256_castsi256_ps(_mm256_slli_epi32(z, 16));
    w[1] = _mm256_castsi256_ps(_mm256_and_si256(z, _mm256_set1_epi32((int)0xffff0000u)));
}

/* ---- the register tile ------------------------------------------------------------- */

/*
 * acc (6, 32): the lanes of (row x, token t) take chunks [k0, k1) of x
 * against act[t], which holds elements k0 .. k1-1 in the half function's
 * lane order; the lanes start at zero when k0 is 0.
 */
typedef void (*tile_fn)(const void *x, size_t ahead, const float *const act[KT_FGEMM_TOKENS], int64_t k0, int64_t k1,
                        float *acc);

/* Asks for the lines of elements [i, i+32) of the row `ahead` bytes past x:
 * the same chunk of the next row.  Only a token block's first group asks
 * (ahead 0: none): there the rows come from memory, and a K block's slice of
 * each row is too short for the hardware prefetcher; later groups find them
 * in L2. */
static inline void prefetch_chunk(const void *x, size_t ahead, int64_t i, size_t elem_bytes)
{
    const uintptr_t p = (uintptr_t)x + ahead + (uintptr_t)i * elem_bytes; /* may lie past the matrix: never faults */
    for (size_t b = 0; b < 32 * elem_bytes; b += 64)
        _mm_prefetch((const char *)(p + b), _MM_HINT_T0);
}

static inline __m256 lanes_in(const float *acc, int64_t k0)
{
    return k0 == 0 ? _mm256_setzero_ps() : _mm256_load_ps(acc);
}

#define KT_DEFINE_FLOAT_TILE(name, HALF, ESIZE)                                                   \
    static void name(const void *x, size_t ahead, const float *const act[KT_FGEMM_TOKENS], int64_t k0, int64_t k1, \
                     float *acc)                                                                  \
    {                                                                                             \
        for (int h = 0; h < 2; h++) {                                                             \
            __m256 c[KT_FGEMM_TOKENS][2];                                                         \
            for (int t = 0; t < KT_FGEMM_TOKENS; t++)                                             \
                for (int v = 0; v < 2; v++)                                                       \
                    c[t][v] = lanes_in(acc + 32 * t + 16 * h + 8 * v, k0);                        \
            for (int64_t i = k0; i < k1; i += 32) {                                               \
                __m256 w[2];                                                                      \
                HALF(x, i, h, w);                                                                 \
                if (h == 0 && ahead)                                                              \
                    prefetch_chunk(x, ahead, i, ESIZE);                                           \
                for (int t = 0; t < KT_FGEMM_TOKENS; t++)                                         \
                    for (int v = 0; v < 2; v++)                                                   \
                        c[t][v] = _mm256_fmadd_ps(w[v], _mm256_load_ps(act[t] + (i - k0) + 16 * h + 8 * v), \
                                                  c[t][v]);                                       \
            }                                                                                     \
            for (int t = 0; t < KT_FGEMM_TOKENS; t++)                                             \
                for (int v = 0; v < 2; v++)                                                       \
                    _mm256_store_ps(acc + 32 * t + 16 * h + 8 * v, c[t][v]);                      \
        }                                                                                         \
    }

KT_DEFINE_FLOAT_TILE(tile_f32, half_f32, sizeof(float))
KT_DEFINE_FLOAT_TILE(tile_f16, half_f16, sizeof(kt_fp16))
KT_DEFINE_FLOAT_TILE(tile_bf16, half_bf16, sizeof(kt_bf16))

/* ---- single elements (the finish's tail) ------------------------------------------- */

typedef float (*widen_fn)(const void *x, int64_t i);

static float one_f32(const void *x, int64_t i)
{
    return ((const float *)x)[i];
}

static float one_f16(const void *x, int64_t i)
{
    return fp16_to_f32(((const kt_fp16 *)x)[i]);
}

static float one_bf16(const void *x, int64_t i)
{
    const uint32_t u = (uint32_t)((const kt_bf16 *)x)[i] << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* ---- staging and finishing ---------------------------------------------------------- */

/*
 * Chunks [k0, k1) of the 6 tokens' rows, copied into 32-byte aligned scratch
 * rows of KT_FGEMM_K_BLOCK floats (in half_bf16's lane order for BF16) that
 * every row of the panel then reads: read in place, rows as the caller
 * aligns them may split cache lines.
 */
static void stage_tokens(const float *const rows[KT_FGEMM_TOKENS], int64_t k0, int64_t k1, bool bf16_order,
                         float *staged)
{
    for (int k = 0; k < KT_FGEMM_TOKENS; k++) {
        float *p = staged + k * KT_FGEMM_K_BLOCK;
        for (int64_t i = k0; i < k1; i += 16) {
            const __m256 lo = _mm256_loadu_ps(rows[k] + i), hi = _mm256_loadu_ps(rows[k] + i + 8);
            if (!bf16_order) {
                _mm256_store_ps(p + (i - k0), lo);
                _mm256_store_ps(p + (i - k0) + 8, hi);
                continue;
            }
            /* elements 0 2 .. 14, then 1 3 .. 15: shuffle_ps gives 0 2 8 10 | 4 6 12 14 */
            const __m256d even = _mm256_castps_pd(_mm256_shuffle_ps(lo, hi, _MM_SHUFFLE(2, 0, 2, 0)));
            const __m256d odd = _mm256_castps_pd(_mm256_shuffle_ps(lo, hi, _MM_SHUFFLE(3, 1, 3, 1)));
            _mm256_store_ps(p + (i - k0), _mm256_castpd_ps(_mm256_permute4x64_pd(even, _MM_SHUFFLE(3, 1, 2, 0))));
            _mm256_store_ps(p + (i - k0) + 8, _mm256_castpd_ps(_mm256_permute4x64_pd(odd, _MM_SHUFFLE(3, 1, 2, 0))));
        }
    }
}

/* A pair's 32 lanes as vec_dot's acc0..acc3, finished over the n - n32 tail. */
static inline float finish_pair(const float *c, bool bf16_order, const float *w_tail, const float *a_tail,
                                int64_t n_tail)
{
    __m256 v[4];
    for (int h = 0; h < 2; h++) {
        const __m256 e = _mm256_load_ps(c + 16 * h), o = _mm256_load_ps(c + 16 * h + 8);
        if (bf16_order) { /* e holds elements 16h + 0 2 .. 14, o 16h + 1 3 .. 15 */
            const __m256 lo = _mm256_unpacklo_ps(e, o), hi = _mm256_unpackhi_ps(e, o);
            v[2 * h] = _mm256_permute2f128_ps(lo, hi, 0x20);
            v[2 * h + 1] = _mm256_permute2f128_ps(lo, hi, 0x31);
        } else {
            v[2 * h] = e;
            v[2 * h + 1] = o;
        }
    }
    return float_dot_finish(v[0], v[1], v[2], v[3], w_tail, a_tail, n_tail);
}

/* ---- the driver -------------------------------------------------------------------- */

/*
 * Loops, outermost first: panels of up to 64 rows; blocks of up to 48
 * tokens (8 groups of 6); K blocks; token groups; rows.  A K block's slice
 * of the panel (64 x 4 KiB of F32) stays in L2 while every group of the
 * token block passes over it, each group's slice of activations (6 x 4 KiB)
 * stays in L1 while every row passes over it, and each activation is copied
 * from memory once per panel.  The lanes of the panel's (row, token) pairs
 * wait in acc between K blocks.
 */
static inline void fgemm_drive(int64_t n, const void *w, size_t row_bytes, int64_t n_rows, const void *a,
                               size_t act_bytes, int64_t n_tok, float *y, int64_t y_stride, bool bf16_order,
                               tile_fn tile, widen_fn one, kt_vec_dot_fn dot)
{
    const uint8_t *wb = w, *ab = a;
    const int64_t n32 = n / 32 * 32;
    const int64_t panel = min_i64(KT_FGEMM_PANEL_ROWS, n_rows);
    /* tokens of a block, a whole number of groups (a short last group repeats its last token) */
    const int64_t block =
        min_i64(KT_FGEMM_BLOCK_TOKENS, (n_tok + KT_FGEMM_TOKENS - 1) / KT_FGEMM_TOKENS * KT_FGEMM_TOKENS);
    float *acc = panel > 0 && block > 0 ? aligned_alloc(32, (size_t)(panel * block * 32) * sizeof(float))
                                        : NULL; /* (panel, block, 32) */
    float *staged = aligned_alloc(32, KT_FGEMM_TOKENS * KT_FGEMM_K_BLOCK * sizeof(float)); /* (6, K_BLOCK) */
    if (!acc || !staged) {
        for (int64_t t = 0; t < n_tok; t++)
            for (int64_t r = 0; r < n_rows; r++)
                dot(n, &y[t * y_stride + r], wb + (size_t)r * row_bytes, ab + (size_t)t * act_bytes);
        goto done;
    }
    const float *act[KT_FGEMM_TOKENS];
    for (int k = 0; k < KT_FGEMM_TOKENS; k++)
        act[k] = staged + k * KT_FGEMM_K_BLOCK;
    for (int64_t r0 = 0; r0 < n_rows; r0 += panel) {
        const int64_t r1 = min_i64(r0 + panel, n_rows);
        for (int64_t b0 = 0; b0 < n_tok; b0 += block) {
            const int64_t b1 = min_i64(b0 + block, n_tok);
            for (int64_t k0 = 0; k0 < n32; k0 += KT_FGEMM_K_BLOCK) {
                const int64_t k1 = min_i64(k0 + KT_FGEMM_K_BLOCK, n32);
                for (int64_t t0 = b0; t0 < b1; t0 += KT_FGEMM_TOKENS) {
                    const float *rows[KT_FGEMM_TOKENS];
                    for (int k = 0; k < KT_FGEMM_TOKENS; k++)
                        rows[k] = (const float *)(ab + (size_t)min_i64(t0 + k, b1 - 1) * act_bytes);
                    stage_tokens(rows, k0, k1, bf16_order, staged);
                    for (int64_t r = r0; r < r1; r++) /* row r's lanes at acc + (r - r0) * block * 32 */
                        tile(wb + (size_t)r * row_bytes, t0 == b0 ? row_bytes : 0, act, k0, k1,
                             acc + ((r - r0) * block + (t0 - b0)) * 32);
                }
            }
            for (int64_t r = r0; r < r1; r++) {
                const void *x = wb + (size_t)r * row_bytes;
                float w_tail[32];
                for (int64_t i = n32; i < n; i++)
                    w_tail[i - n32] = one(x, i);
                for (int64_t t = b0; t < b1; t++) {
                    const float *row = (const float *)(ab + (size_t)t * act_bytes);
                    const float *c = acc + ((r - r0) * block + (t - b0)) * 32;
                    const __m256 zero = _mm256_setzero_ps(); /* n < 32: no chunk ran */
                    y[t * y_stride + r] = n32 > 0 ? finish_pair(c, bf16_order, w_tail, row + n32, n - n32)
                                                  : float_dot_finish(zero, zero, zero, zero, w_tail, row, n);
                }
            }
        }
    }
done:
    free(acc);
    free(staged);
}

void kt_gemm_f32_f32_avx2(int64_t n, const void *w, size_t row_bytes, int64_t n_rows, const void *a,
                          size_t act_bytes, int64_t n_tok, float *y, int64_t y_stride)
{
    fgemm_drive(n, w, row_bytes, n_rows, a, act_bytes, n_tok, y, y_stride, false, tile_f32, one_f32,
                kt_vec_dot_f32_f32_avx2);
}

void kt_gemm_f16_f32_avx2(int64_t n, const void *w, size_t row_bytes, int64_t n_rows, const void *a,
                          size_t act_bytes, int64_t n_tok, float *y, int64_t y_stride)
{
    fgemm_drive(n, w, row_bytes, n_rows, a, act_bytes, n_tok, y, y_stride, false, tile_f16, one_f16,
                kt_vec_dot_f16_f32_avx2);
}

void kt_gemm_bf16_f32_avx2(int64_t n, const void *w, size_t row_bytes, int64_t n_rows, const void *a,
                           size_t act_bytes, int64_t n_tok, float *y, int64_t y_stride)
{
    fgemm_drive(n, w, row_bytes, n_rows, a, act_bytes, n_tok, y, y_stride, true, tile_bf16, one_bf16,
                kt_vec_dot_bf16_f32_avx2);
}
