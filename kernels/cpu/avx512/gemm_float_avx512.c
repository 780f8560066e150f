/*
 * gemm_float_avx512.c - AVX-512 prefill products for F32, F16 and BF16
 * weights against F32 activations: y[t][r] = dot(W[r], A[t]) for many
 * tokens t at once, on CPUs with AVX-512.
 *
 * The avx512 level's float vec_dot is vec_dot_float_avx2.c's, so that is
 * what every output must equal bit for bit (not the reference, which sums
 * in double): 32 float lanes, lane e taking w[i+e]*a[i+e] by FMA for every
 * full chunk of 32, then float_dot_finish.h.  Lanes are independent, so
 * only the order inside a lane matters, and it is vec_dot's.  Here a
 * (row, token) pair's 32 lanes are two zmm registers and the register tile
 * is 2 rows x 6 tokens (24 accumulators): each chunk of weights is widened
 * once for 6 tokens, each chunk of activations loaded once for 2 rows.
 * BF16 is widened without shuffles (a 32-bit word holds elements 2l and
 * 2l+1: shift left 16 for the even one, mask for the odd one), so its lanes
 * hold even and odd elements in separate registers; the activations are
 * staged in that order and the finish puts the lanes back in natural order.
 *
 * This file must never reorder a lane's chunks, fuse or split a step
 * differently from vec_dot (-ffp-contract=off), or read a row past its n
 * elements.  A short last token group repeats its last token and stores
 * only the real ones.  If the scratch cannot be allocated the call falls
 * back to one vec_dot per pair.
 */
#if !defined(__AVX512F__) || !defined(__AVX512BW__) || !defined(__AVX512VL__)
#error "gemm_float_avx512.c needs the AVX-512 level flags (kernels/CMakeLists.txt sets them for cpu/avx512/*.c)"
#endif

#include "cpu/avx512/gemm_float_avx512.h"
#include "cpu/avx2/float_dot_finish.h"
#include "cpu/avx2/kernels_avx2.h"
#include "cpu/avx2/simd_avx2.h"

#include <stdbool.h>
#include <stdlib.h>

#define KT_FGEMM512_TOKENS 6
#define KT_FGEMM512_K_BLOCK 1024    /* elements: 6 x 4 KiB of activations in L1 */
#define KT_FGEMM512_PANEL_ROWS 64   /* a K block of 64 rows: 256 KiB of F32 in L2 */
#define KT_FGEMM512_BLOCK_TOKENS 48 /* lanes of 64 x 48 pairs: 384 KiB of scratch */

static inline int64_t min_i64(int64_t a, int64_t b)
{
    return a < b ? a : b;
}

/* ---- one chunk of 32 weights -> 2 vectors of 16 lanes ------------------------------ */

static inline void chunk_f32(const void *x, int64_t i, __m512 w[2])
{
    const float *p = (const float *)x + i;
    w[0] = _mm512_loadu_ps(p);
    w[1] = _mm512_loadu_ps(p + 16);
}

static inline void chunk_f16(const void *x, int64_t i, __m512 w[2])
{
    const kt_fp16 *p = (const kt_fp16 *)x + i;
    w[0] = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
    w[1] = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p + 16)));
}

/* Vector 0 holds elements 2l, vector 1 elements 2l + 1. */
static inline void chunk_bf16(const void *x, int64_t i, __m512 w[2])
{
    const __m512i z = _mm512_loadu_si512((const void *)((const kt_bf16 *)x + i));
    w[0] = _mm512_castsi512_ps(_mm512_slli_epi32(z, 16));
    w[1] = _mm512_castsi512_ps(_mm512_and_si512(z, _mm512_set1_epi32((int)0xffff0000u)));
}

/* ---- the register tiles ------------------------------------------------------------ */

/*
 * acc_r (6, 32): the lanes of (row x_r, token t) take chunks [k0, k1) of
 * x_r against act[t], which holds elements k0 .. k1-1 in the chunk
 * function's lane order; the lanes start at zero when k0 is 0.
 */
typedef void (*tile2_fn)(const void *x0, const void *x1, size_t ahead, const float *const act[KT_FGEMM512_TOKENS],
                         int64_t k0, int64_t k1, float *acc0, float *acc1);
typedef void (*tile1_fn)(const void *x0, const float *const act[KT_FGEMM512_TOKENS], int64_t k0, int64_t k1,
                         float *acc0);

/* Asks for the lines of elements [i, i+32) of the row `ahead` bytes past x:
 * the same chunk of the next row pair.  Only a token block's first group
 * asks (ahead 0: none): there the rows come from memory, and a K block's
 * slice of each row is too short for the hardware prefetcher (BF16 at 4
 * tokens: 15 -> 42 GFLOP/s); later groups find them in L2. */
static inline void prefetch_chunk(const void *x, size_t ahead, int64_t i, size_t elem_bytes)
{
    const uintptr_t p = (uintptr_t)x + ahead + (uintptr_t)i * elem_bytes; /* may lie past the matrix: never faults */
    for (size_t b = 0; b < 32 * elem_bytes; b += 64)
        _mm_prefetch((const char *)(p + b), _MM_HINT_T0);
}

static inline __m512 lanes_in(const float *acc, int64_t k0)
{
    return k0 == 0 ? _mm512_setzero_ps() : _mm512_load_ps(acc);
}

#define KT_DEFINE_FLOAT_TILES(tile2, tile1, CHUNK, ESIZE)                                         \
    static void tile2(const void *x0, const void *x1, size_t ahead, const float *const act[KT_FGEMM512_TOKENS], \
                      int64_t k0, int64_t k1, float *acc0, float *acc1)                           \
    {                                                                                             \
        __m512 c0[KT_FGEMM512_TOKENS][2], c1[KT_FGEMM512_TOKENS][2];                              \
        for (int t = 0; t < KT_FGEMM512_TOKENS; t++)                                              \
            for (int v = 0; v < 2; v++) {                                                         \
                c0[t][v] = lanes_in(acc0 + 32 * t + 16 * v, k0);                                  \
                c1[t][v] = lanes_in(acc1 + 32 * t + 16 * v, k0);                                  \
            }                                                                                     \
        for (int64_t i = k0; i < k1; i += 32) {                                                   \
            __m512 w0[2], w1[2];                                                                  \
            CHUNK(x0, i, w0);                                                                     \
            CHUNK(x1, i, w1);                                                                     \
            if (ahead) {                                                                          \
                prefetch_chunk(x0, ahead, i, ESIZE);                                              \
                prefetch_chunk(x1, ahead, i, ESIZE);                                              \
            }                                                                                     \
            for (int t = 0; t < KT_FGEMM512_TOKENS; t++)                                          \
                for (int v = 0; v < 2; v++) {                                                     \
                    __m512 a = _mm512_load_ps(act[t] + (i - k0) + 16 * v);                        \
                    /* one load for both rows, not a memory operand of each FMA: */               \
                    /* 16 loads a chunk instead of 28 (measured 140 -> 168 GFLOP/s in L1) */      \
                    __asm__("" : "+v"(a));                                                        \
                    c0[t][v] = _mm512_fmadd_ps(w0[v], a, c0[t][v]);                               \
                    c1[t][v] = _mm512_fmadd_ps(w1[v], a, c1[t][v]);                               \
                }                                                                                 \
        }                                                                                         \
        for (int t = 0; t < KT_FGEMM512_TOKENS; t++)                                              \
            for (int v = 0; v < 2; v++) {                                                         \
                _mm512_store_ps(acc0 + 32 * t + 16 * v, c0[t][v]);                               \
                _mm512_store_ps(acc1 + 32 * t + 16 * v, c1[t][v]);                               \
            }                                                                                     \
    }                                                                                             \
    static void tile1(const void *x0, const float *const act[KT_FGEMM512_TOKENS], int64_t k0, int64_t k1, \
                      float *acc0)                                                                \
    {                                                                                             \
        __m512 c0[KT_FGEMM512_TOKENS][2];                                                         \
        for (int t = 0; t < KT_FGEMM512_TOKENS; t++)                                              \
            for (int v = 0; v < 2; v++)                                                           \
                c0[t][v] = lanes_in(acc0 + 32 * t + 16 * v, k0);                                  \
        for (int64_t i = k0; i < k1; i += 32) {                                                   \
            __m512 w0[2];                                                                         \
            CHUNK(x0, i, w0);                                                                     \
            for (int t = 0; t < KT_FGEMM512_TOKENS; t++)                                          \
                for (int v = 0; v < 2; v++)                                                       \
                    c0[t][v] = _mm512_fmadd_ps(w0[v], _mm512_load_ps(act[t] + (i - k0) + 16 * v), c0[t][v]); \
        }                                                                                         \
        for (int t = 0; t < KT_FGEMM512_TOKENS; t++)                                              \
            for (int v = 0; v < 2; v++)                                                           \
                _mm512_store_ps(acc0 + 32 * t + 16 * v, c0[t][v]);                                \
    }

KT_DEFINE_FLOAT_TILES(tile2_f32, tile1_f32, chunk_f32, sizeof(float))
KT_DEFINE_FLOAT_TILES(tile2_f16, tile1_f16, chunk_f16, sizeof(kt_fp16))
KT_DEFINE_FLOAT_TILES(tile2_bf16, tile1_bf16, chunk_bf16, sizeof(kt_bf16))

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
 * Chunks [k0, k1) of the 6 tokens' rows, copied into 64-byte aligned scratch
 * rows of KT_FGEMM512_K_BLOCK floats (in chunk_bf16's lane order for BF16)
 * that every row pair of the panel then reads: read in place, rows as the
 * caller aligns them (16 bytes, say) split cache lines and made the tile
 * about 40% slower.
 */
static void stage_tokens(const float *const rows[KT_FGEMM512_TOKENS], int64_t k0, int64_t k1, bool bf16_order,
                         float *staged)
{
    const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
    for (int k = 0; k < KT_FGEMM512_TOKENS; k++) {
        float *p = staged + k * KT_FGEMM512_K_BLOCK;
        for (int64_t i = k0; i < k1; i += 32) {
            const __m512 lo = _mm512_loadu_ps(rows[k] + i), hi = _mm512_loadu_ps(rows[k] + i + 16);
            _mm512_store_ps(p + (i - k0), bf16_order ? _mm512_permutex2var_ps(lo, even, hi) : lo);
            _mm512_store_ps(p + (i - k0) + 16, bf16_order ? _mm512_permutex2var_ps(lo, odd, hi) : hi);
        }
    }
}

/* A pair's 32 lanes as vec_dot's acc0..acc3, finished over the n - n32 tail. */
static inline float finish_pair(const float *c, bool bf16_order, const float *w_tail, const float *a_tail,
                                int64_t n_tail)
{
    __m512 lo = _mm512_load_ps(c), hi = _mm512_load_ps(c + 16);
    if (bf16_order) { /* lo holds elements 0 2 .. 30, hi 1 3 .. 31 */
        const __m512 even = lo;
        lo = _mm512_permutex2var_ps(even, _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23),
                                    hi);
        hi = _mm512_permutex2var_ps(
            even, _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31), hi);
    }
    const __m256 acc1 = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(lo), 1));
    const __m256 acc3 = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(hi), 1));
    return float_dot_finish(_mm512_castps512_ps256(lo), acc1, _mm512_castps512_ps256(hi), acc3, w_tail, a_tail,
                            n_tail);
}

/* ---- the driver -------------------------------------------------------------------- */

/*
 * Loops, outermost first: panels of up to 64 rows; blocks of up to 48
 * tokens (8 groups of 6); K blocks; token groups; row pairs.  A K block's
 * slice of the panel (64 x 4 KiB of F32) stays in L2 while every group of
 * the token block passes over it, each group's slice of activations (6 x
 * 4 KiB) stays in L1 while every row pair passes over it, and each
 * activation is copied from memory once per panel.  The lanes of the
 * panel's (row, token) pairs wait in acc between K blocks.
 */
static inline void fgemm512_drive(int64_t n, const void *w, size_t row_bytes, int64_t n_rows, const void *a,
                                  size_t act_bytes, int64_t n_tok, float *y, int64_t y_stride, bool bf16_order,
                                  tile2_fn tile2, tile1_fn tile1, widen_fn one, kt_vec_dot_fn dot)
{
    const uint8_t *wb = w, *ab = a;
    const int64_t n32 = n / 32 * 32;
    const int64_t panel = min_i64(KT_FGEMM512_PANEL_ROWS, n_rows);
    /* tokens of a block, a whole number of groups (a short last group repeats its last token) */
    const int64_t block = min_i64(KT_FGEMM512_BLOCK_TOKENS,
                                  (n_tok + KT_FGEMM512_TOKENS - 1) / KT_FGEMM512_TOKENS * KT_FGEMM512_TOKENS);
    float *acc = panel > 0 && block > 0 ? aligned_alloc(64, (size_t)(panel * block * 32) * sizeof(float))
                                        : NULL; /* (panel, block, 32) */
    float *staged = aligned_alloc(64, KT_FGEMM512_TOKENS * KT_FGEMM512_K_BLOCK * sizeof(float)); /* (6, K_BLOCK) */
    if (!acc || !staged) {
        for (int64_t t = 0; t < n_tok; t++)
            for (int64_t r = 0; r < n_rows; r++)
                dot(n, &y[t * y_stride + r], wb + (size_t)r * row_bytes, ab + (size_t)t * act_bytes);
        goto done;
    }
    const float *act[KT_FGEMM512_TOKENS];
    for (int k = 0; k < KT_FGEMM512_TOKENS; k++)
        act[k] = staged + k * KT_FGEMM512_K_BLOCK;
    for (int64_t r0 = 0; r0 < n_rows; r0 += panel) {
        const int64_t r1 = min_i64(r0 + panel, n_rows);
        for (int64_t b0 = 0; b0 < n_tok; b0 += block) {
            const int64_t b1 = min_i64(b0 + block, n_tok);
            for (int64_t k0 = 0; k0 < n32; k0 += KT_FGEMM512_K_BLOCK) {
                const int64_t k1 = min_i64(k0 + KT_FGEMM512_K_BLOCK, n32);
                for (int64_t t0 = b0; t0 < b1; t0 += KT_FGEMM512_TOKENS) {
                    const float *rows[KT_FGEMM512_TOKENS];
                    for (int k = 0; k < KT_FGEMM512_TOKENS; k++)
                        rows[k] = (const float *)(ab + (size_t)min_i64(t0 + k, b1 - 1) * act_bytes);
                    stage_tokens(rows, k0, k1, bf16_order, staged);
                    float *acc_g = acc + (t0 - b0) * 32; /* row r's lanes at + (r - r0) * block * 32 */
                    int64_t r = r0;
                    for (; r + 2 <= r1; r += 2)
                        tile2(wb + (size_t)r * row_bytes, wb + (size_t)(r + 1) * row_bytes,
                              t0 == b0 ? 2 * row_bytes : 0, act, k0, k1, acc_g + (r - r0) * block * 32,
                              acc_g + (r + 1 - r0) * block * 32);
                    if (r < r1)
                        tile1(wb + (size_t)r * row_bytes, act, k0, k1, acc_g + (r - r0) * block * 32);
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

void kt_gemm_f32_f32_avx512(int64_t n, const void *w, size_t row_bytes, int64_t n_rows, const void *a,
                            size_t act_bytes, int64_t n_tok, float *y, int64_t y_stride)
{
    fgemm512_drive(n, w, row_bytes, n_rows, a, act_bytes, n_tok, y, y_stride, false, tile2_f32, tile1_f32, one_f32,
                   kt_vec_dot_f32_f32_avx2);
}

void kt_gemm_f16_f32_avx512(int64_t n, const void *w, size_t row_bytes, int64_t n_rows, const void *a,
                            size_t act_bytes, int64_t n_tok, float *y, int64_t y_stride)
{
    fgemm512_drive(n, w, row_bytes, n_rows, a, act_bytes, n_tok, y, y_stride, false, tile2_f16, tile1_f16, one_f16,
                   kt_vec_dot_f16_f32_avx2);
}

void kt_gemm_bf16_f32_avx512(int64_t n, const void *w, size_t row_bytes, int64_t n_rows, const void *a,
                             size_t act_bytes, int64_t n_tok, float *y, int64_t y_stride)
{
    fgemm512_drive(n, w, row_bytes, n_rows, a, act_bytes, n_tok, y, y_stride, true, tile2_bf16, tile1_bf16,
                   one_bf16, kt_vec_dot_bf16_f32_avx2);
}
