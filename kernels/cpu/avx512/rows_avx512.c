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
