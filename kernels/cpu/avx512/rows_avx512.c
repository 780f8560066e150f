/*
 * rows_avx512.c - attention's cache-row scores (kt_dot_rows_typed on F32,
 * BF16 and F16 rows) in AVX-512, bit for bit the reference.
 *
 * The reference sums element i of a row into partial sum i % 8: eight lanes
 * per row, so a wider register cannot take more of one row without changing
 * the order of the sums.  A zmm takes two rows instead, lanes 0-7 one row's
 * eight partials and lanes 8-15 the next's, against the query broadcast to
 * both halves; four zmm accumulators run eight rows at once.  BF16 and F16
 * elements widen exactly as they load (a 16-bit shift; vcvtph2ps), and each
 * half finishes as the AVX2 kernel does (tail from 0, then the partials in
 * order, scalar).  Rows left over (fewer than two) go to the AVX2 kernel.
 * Never fuse, reassociate or reorder a float step here (-ffp-contract=off).
 */
#include "cpu/avx512/rows_avx512.h"

#include <immintrin.h>

#include "cpu/avx2/f32_rows_avx2.h"
#include "quant.h"

/* Two 256-bit halves as one zmm: lo in lanes 0-7, hi in 8-15. */
static inline __m512 join(__m256 lo, __m256 hi)
{
    return _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castpd256_pd512(_mm256_castps_pd(lo)), _mm256_castps_pd(hi), 1));
}

static inline __m512 load2_f32(const void *a, const void *b, int64_t i)
{
    return join(_mm256_loadu_ps((const float *)a + i), _mm256_loadu_ps((const float *)b + i));
}

static inline __m256i load16x2(const void *a, const void *b, int64_t i)
{
    const __m128i lo = _mm_loadu_si128((const __m128i *)((const uint16_t *)a + i));
    const __m128i hi = _mm_loadu_si128((const __m128i *)((const uint16_t *)b + i));
    return _mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1);
}

static inline __m512 load2_bf16(const void *a, const void *b, int64_t i)
{
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(load16x2(a, b, i)), 16));
}

static inline __m512 load2_f16(const void *a, const void *b, int64_t i)
{
    return _mm512_cvtph_ps(load16x2(a, b, i));
}

static inline float elem_f32(const void *r, int64_t i)
{
    return ((const float *)r)[i];
}

static inline float elem_bf16(const void *r, int64_t i)
{
    return kt_bf16_to_fp32(((const uint16_t *)r)[i]);
}

static inline float elem_f16(const void *r, int64_t i)
{
    return kt_fp16_to_fp32(((const uint16_t *)r)[i]);
}

#define KT_ROWS_AVX512(NAME, LOAD2, ELEM)                                                                          \
    /* out of half `half` (0: lanes 0-7, row a; 1: lanes 8-15, row b) */                                          \
    static inline float finish_##NAME(__m512 acc, int half, const float *x, const void *r, int64_t i, int64_t n)  \
    {                                                                                                              \
        float part[16];                                                                                            \
        _mm512_storeu_ps(part, acc);                                                                               \
        float sum = 0.0f;                                                                                          \
        for (; i < n; i++)                                                                                         \
            sum += x[i] * ELEM(r, i);                                                                              \
        for (int j = 0; j < 8; j++)                                                                                \
            sum += part[half * 8 + j];                                                                             \
        return sum;                                                                                                \
    }                                                                                                              \
                                                                                                                   \
    void kt_dot_rows_##NAME##_avx512(const float *x, const void *const *rows, int64_t n_rows, int64_t n,         \
                                     float scale, float *out, int64_t out_stride)                                  \
    {                                                                                                              \
        const int64_t n8 = n / 8 * 8;                                                                              \
        int64_t t = 0;                                                                                             \
        for (; t + 8 <= n_rows; t += 8) {                                                                          \
            const void *const *r = rows + t;                                                                       \
            __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps(), a2 = _mm512_setzero_ps(),                   \
                   a3 = _mm512_setzero_ps();                                                                       \
            for (int64_t i = 0; i < n8; i += 8) {                                                                  \
                const __m256 x8 = _mm256_loadu_ps(x + i);                                                          \
                const __m512 xv = join(x8, x8);                                                                    \
                a0 = _mm512_add_ps(a0, _mm512_mul_ps(xv, LOAD2(r[0], r[1], i)));                                   \
                a1 = _mm512_add_ps(a1, _mm512_mul_ps(xv, LOAD2(r[2], r[3], i)));                                   \
                a2 = _mm512_add_ps(a2, _mm512_mul_ps(xv, LOAD2(r[4], r[5], i)));                                   \
                a3 = _mm512_add_ps(a3, _mm512_mul_ps(xv, LOAD2(r[6], r[7], i)));                                   \
            }                                                                                                      \
            const __m512 acc[4] = {a0, a1, a2, a3};                                                                \
            for (int j = 0; j < 8; j++)                                                                            \
                out[(t + j) * out_stride] = scale * finish_##NAME(acc[j / 2], j % 2, x, r[j], n8, n);              \
        }                                                                                                          \
        for (; t + 2 <= n_rows; t += 2) {                                                                          \
            __m512 a = _mm512_setzero_ps();                                                                        \
            for (int64_t i = 0; i < n8; i += 8) {                                                                  \
                const __m256 x8 = _mm256_loadu_ps(x + i);                                                          \
                a = _mm512_add_ps(a, _mm512_mul_ps(join(x8, x8), LOAD2(rows[t], rows[t + 1], i)));                 \
            }                                                                                                      \
            out[t * out_stride] = scale * finish_##NAME(a, 0, x, rows[t], n8, n);                                  \
            out[(t + 1) * out_stride] = scale * finish_##NAME(a, 1, x, rows[t + 1], n8, n);                        \
        }                                                                                                          \
        if (t < n_rows)                                                                                            \
            kt_dot_rows_##NAME##_tail(x, rows + t, n_rows - t, n, scale, out + t * out_stride, out_stride);        \
    }

/* The AVX2 kernels, for a last odd row. */
#define kt_dot_rows_f32_tail kt_dot_rows_f32_any_avx2
#define kt_dot_rows_bf16_tail kt_dot_rows_bf16_avx2
#define kt_dot_rows_f16_tail kt_dot_rows_f16_avx2

KT_ROWS_AVX512(f32, load2_f32, elem_f32)
KT_ROWS_AVX512(bf16, load2_bf16, elem_bf16)
KT_ROWS_AVX512(f16, load2_f16, elem_f16)

/* ---- several heads over the same rows ----------------------------------------------
 *
 * dot_rows_multi: a tile of up to four queries by eight rows (four row
 * pairs, one zmm each as above) loads each pair once, widened, for all of
 * its queries, and each query's eight elements once for all of its pairs;
 * every (query, row) accumulator is the reference's eight partials, so each
 * score is the bits of dot_rows.  axpy_rows: a tile of up to eight outputs
 * by 32 elements stays in zmm registers while the rows pass, each row's
 * elements widened once for the tile; each element's adds come in row
 * order, a product then a sum, as n_rows axpy calls make them. */

static inline __m512 load16_f32(const void *r, int64_t i)
{
    return _mm512_loadu_ps((const float *)r + i);
}

static inline __m512 load16_bf16(const void *r, int64_t i)
{
    const __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)r + i));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

static inline __m512 load16_f16(const void *r, int64_t i)
{
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)r + i)));
}

#define KT_HEADS_AVX512(NAME, LOAD2, LOAD16, ELEM)                                                                 \
    /* Queries q < G of x by row pairs p < P of r (G, P compile-time once inlined). */                             \
    static inline __attribute__((always_inline)) void dot_tile_##NAME(const int G, const int P, const float *x,    \
                                                                       int64_t xs, const void *const *r,           \
                                                                       int64_t n8, int64_t n, float scale,         \
                                                                       float *out, int64_t os)                     \
    {                                                                                                              \
        __m512 acc[4][4];                                                                                          \
        _Pragma("GCC unroll 4") for (int q = 0; q < G; q++)                                                        \
            _Pragma("GCC unroll 4") for (int p = 0; p < P; p++) acc[q][p] = _mm512_setzero_ps();                   \
        for (int64_t i = 0; i < n8; i += 8) {                                                                      \
            __m512 v[4];                                                                                           \
            _Pragma("GCC unroll 4") for (int p = 0; p < P; p++) v[p] = LOAD2(r[2 * p], r[2 * p + 1], i);           \
            _Pragma("GCC unroll 4") for (int q = 0; q < G; q++) {                                                  \
                const __m256 x8 = _mm256_loadu_ps(x + q * xs + i);                                                 \
                const __m512 xv = join(x8, x8);                                                                    \
                _Pragma("GCC unroll 4") for (int p = 0; p < P; p++)                                                \
                    acc[q][p] = _mm512_add_ps(acc[q][p], _mm512_mul_ps(xv, v[p]));                                 \
            }                                                                                                      \
        }                                                                                                          \
        for (int q = 0; q < G; q++)                                                                                \
            for (int j = 0; j < 2 * P; j++)                                                                        \
                out[q * os + j] = scale * finish_##NAME(acc[q][j / 2], j % 2, x + q * xs, r[j], n8, n);            \
    }                                                                                                              \
                                                                                                                   \
    static inline __attribute__((always_inline)) void dot_pairs_##NAME(const int P, const float *x, int64_t xs,    \
                                                                        int64_t n_x, const void *const *r,         \
                                                                        int64_t n8, int64_t n, float scale,        \
                                                                        float *out, int64_t os)                    \
    {                                                                                                              \
        int64_t q = 0;                                                                                             \
        for (; q + 4 <= n_x; q += 4)                                                                               \
            dot_tile_##NAME(4, P, x + q * xs, xs, r, n8, n, scale, out + q * os, os);                              \
        for (; q + 2 <= n_x; q += 2)                                                                               \
            dot_tile_##NAME(2, P, x + q * xs, xs, r, n8, n, scale, out + q * os, os);                              \
        if (q < n_x)                                                                                               \
            dot_tile_##NAME(1, P, x + q * xs, xs, r, n8, n, scale, out + q * os, os);                              \
    }                                                                                                              \
                                                                                                                   \
    void kt_dot_rows_multi_##NAME##_avx512(const float *x, int64_t x_stride, int64_t n_x,                         \
                                           const void *const *rows, int64_t n_rows, int64_t n, float scale,        \
                                           float *out, int64_t out_stride)                                         \
    {                                                                                                              \
        const int64_t n8 = n / 8 * 8;                                                                              \
        int64_t t = 0;                                                                                             \
        for (; t + 8 <= n_rows; t += 8)                                                                            \
            dot_pairs_##NAME(4, x, x_stride, n_x, rows + t, n8, n, scale, out + t, out_stride);                    \
        for (; t + 2 <= n_rows; t += 2)                                                                            \
            dot_pairs_##NAME(1, x, x_stride, n_x, rows + t, n8, n, scale, out + t, out_stride);                    \
        for (int64_t q = 0; t < n_rows && q < n_x; q++)                                                            \
            kt_dot_rows_##NAME##_tail(x + q * x_stride, rows + t, n_rows - t, n, scale, out + q * out_stride + t,  \
                                      1);                                                                          \
    }                                                                                                              \
                                                                                                                   \
    /* Outputs g < G, elements [i, i + 16 W) (G, W compile-time once inlined). */                                  \
    static inline __attribute__((always_inline)) void axpy_tile_##NAME(const int G, const int W, float *y,         \
                                                                        int64_t ys, const float *a, int64_t as,    \
                                                                        const void *const *rows, int64_t nr,       \
                                                                        int64_t i)                                 \
    {                                                                                                              \
        __m512 acc[8][2];                                                                                          \
        _Pragma("GCC unroll 8") for (int g = 0; g < G; g++)                                                        \
            _Pragma("GCC unroll 2") for (int w = 0; w < W; w++)                                                    \
                acc[g][w] = _mm512_loadu_ps(y + g * ys + i + 16 * w);                                              \
        for (int64_t r = 0; r < nr; r++) {                                                                         \
            __m512 v[2];                                                                                           \
            _Pragma("GCC unroll 2") for (int w = 0; w < W; w++) v[w] = LOAD16(rows[r], i + 16 * w);                \
            _Pragma("GCC unroll 8") for (int g = 0; g < G; g++) {                                                  \
                const __m512 av = _mm512_set1_ps(a[g * as + r]);                                                   \
                _Pragma("GCC unroll 2") for (int w = 0; w < W; w++)                                                \
                    acc[g][w] = _mm512_add_ps(acc[g][w], _mm512_mul_ps(av, v[w]));                                 \
            }                                                                                                      \
        }                                                                                                          \
        _Pragma("GCC unroll 8") for (int g = 0; g < G; g++)                                                        \
            _Pragma("GCC unroll 2") for (int w = 0; w < W; w++)                                                    \
                _mm512_storeu_ps(y + g * ys + i + 16 * w, acc[g][w]);                                              \
    }                                                                                                              \
                                                                                                                   \
    static inline __attribute__((always_inline)) void axpy_heads_##NAME(const int G, float *y, int64_t ys,         \
                                                                         const float *a, int64_t as,               \
                                                                         const void *const *rows, int64_t nr,      \
                                                                         int64_t n)                                \
    {                                                                                                              \
        int64_t i = 0;                                                                                             \
        for (; i + 32 <= n; i += 32)                                                                               \
            axpy_tile_##NAME(G, 2, y, ys, a, as, rows, nr, i);                                                     \
        for (; i + 16 <= n; i += 16)                                                                               \
            axpy_tile_##NAME(G, 1, y, ys, a, as, rows, nr, i);                                                     \
        for (; i < n; i++)                                                                                         \
            for (int g = 0; g < G; g++)                                                                            \
                for (int64_t r = 0; r < nr; r++)                                                                   \
                    y[g * ys + i] += a[g * as + r] * ELEM(rows[r], i);                                             \
    }                                                                                                              \
                                                                                                                   \
    void kt_axpy_rows_##NAME##_avx512(float *y, int64_t y_stride, int64_t n_y, const float *a, int64_t a_stride,   \
                                      const void *const *rows, int64_t n_rows, int64_t n)                          \
    {                                                                                                              \
        int64_t g = 0;                                                                                             \
        for (; g + 8 <= n_y; g += 8)                                                                               \
            axpy_heads_##NAME(8, y + g * y_stride, y_stride, a + g * a_stride, a_stride, rows, n_rows, n);         \
        if (g + 4 <= n_y) {                                                                                        \
            axpy_heads_##NAME(4, y + g * y_stride, y_stride, a + g * a_stride, a_stride, rows, n_rows, n);         \
            g += 4;                                                                                                \
        }                                                                                                          \
        if (g + 2 <= n_y) {                                                                                        \
            axpy_heads_##NAME(2, y + g * y_stride, y_stride, a + g * a_stride, a_stride, rows, n_rows, n);         \
            g += 2;                                                                                                \
        }                                                                                                          \
        if (g < n_y)                                                                                               \
            axpy_heads_##NAME(1, y + g * y_stride, y_stride, a + g * a_stride, a_stride, rows, n_rows, n);         \
    }

KT_HEADS_AVX512(f32, load2_f32, load16_f32, elem_f32)
KT_HEADS_AVX512(bf16, load2_bf16, load16_bf16, elem_bf16)
KT_HEADS_AVX512(f16, load2_f16, load16_f16, elem_f16)
