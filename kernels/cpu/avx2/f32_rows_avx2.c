/*
 * f32_rows_avx2.c - attention's float row ops in AVX2, bit for bit the
 * scalar reference (kernels/cpu/ref/ops.c).
 *
 * kt_dot_f32 sums element i into partial sum i % 8, each partial in element
 * order, then adds the tail (n % 8 elements, in order) to 0 and the eight
 * partials to that, 0 through 7.  One ymm accumulator is exactly those eight
 * partials (a multiply, then an add: never a fused multiply-add); four rows
 * run at once so four independent add chains hide the add latency that
 * bounds one row.  The finishing sums are scalar, in the reference's order.
 * kt_axpy_f32's elements are independent: eight lanes at a time, product
 * then sum, as the scalar loop rounds them.
 * Never fuse, reassociate or reorder a float step here (-ffp-contract=off).
 */
#include "cpu/avx2/f32_rows_avx2.h"

#include <immintrin.h>

#include "quant.h"

/* The reference's finish: tail products from 0, then the eight partials in order. */
static inline float finish(__m256 acc, const float *x, const float *r, int64_t i, int64_t n)
{
    float part[8];
    _mm256_storeu_ps(part, acc);
    float sum = 0.0f;
    for (; i < n; i++)
        sum += x[i] * r[i];
    for (int j = 0; j < 8; j++)
        sum += part[j];
    return sum;
}

void kt_dot_rows_f32_avx2(const float *x, const float *const *rows, int64_t n_rows, int64_t n, float scale, float *out,
                          int64_t out_stride)
{
    const int64_t n8 = n / 8 * 8;
    int64_t t = 0;
    for (; t + 4 <= n_rows; t += 4) {
        const float *r0 = rows[t], *r1 = rows[t + 1], *r2 = rows[t + 2], *r3 = rows[t + 3];
        __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
        for (int64_t i = 0; i < n8; i += 8) {
            const __m256 xv = _mm256_loadu_ps(x + i);
            a0 = _mm256_add_ps(a0, _mm256_mul_ps(xv, _mm256_loadu_ps(r0 + i)));
            a1 = _mm256_add_ps(a1, _mm256_mul_ps(xv, _mm256_loadu_ps(r1 + i)));
            a2 = _mm256_add_ps(a2, _mm256_mul_ps(xv, _mm256_loadu_ps(r2 + i)));
            a3 = _mm256_add_ps(a3, _mm256_mul_ps(xv, _mm256_loadu_ps(r3 + i)));
        }
        out[t * out_stride] = scale * finish(a0, x, r0, n8, n);
        out[(t + 1) * out_stride] = scale * finish(a1, x, r1, n8, n);
        out[(t + 2) * out_stride] = scale * finish(a2, x, r2, n8, n);
        out[(t + 3) * out_stride] = scale * finish(a3, x, r3, n8, n);
    }
    for (; t < n_rows; t++) {
        const float *r = rows[t];
        __m256 a = _mm256_setzero_ps();
        for (int64_t i = 0; i < n8; i += 8)
            a = _mm256_add_ps(a, _mm256_mul_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(r + i)));
        out[t * out_stride] = scale * finish(a, x, r, n8, n);
    }
}

void kt_axpy_f32_avx2(float *y, float a, const float *x, int64_t n)
{
    const __m256 av = _mm256_set1_ps(a);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_add_ps(_mm256_loadu_ps(y + i), _mm256_mul_ps(av, _mm256_loadu_ps(x + i))));
    for (; i < n; i++)
        y[i] += a * x[i];
}

/* ---- the same on BF16 and F16 cache rows ---------------------------------------------
 *
 * Eight elements widen exactly to one ymm (BF16: the bits shifted up 16;
 * F16: F16C's vcvtph2ps), then the F32 steps above run unchanged, so each
 * result is bit for bit kt_dot_rows_typed / kt_axpy_typed. */

static inline __m256 load_bf16(const uint16_t *p)
{
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
}

static inline __m256 load_f16(const uint16_t *p)
{
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}

static inline float widen_bf16(uint16_t h)
{
    return kt_bf16_to_fp32(h);
}

static inline float widen_f16(uint16_t h)
{
    return kt_fp16_to_fp32(h);
}

#define KT_ROWS_16(NAME, LOAD, WIDEN)                                                                              \
    static inline float finish_##NAME(__m256 acc, const float *x, const uint16_t *r, int64_t i, int64_t n)        \
    {                                                                                                              \
        float part[8];                                                                                             \
        _mm256_storeu_ps(part, acc);                                                                               \
        float sum = 0.0f;                                                                                          \
        for (; i < n; i++)                                                                                         \
            sum += x[i] * WIDEN(r[i]);                                                                             \
        for (int j = 0; j < 8; j++)                                                                                \
            sum += part[j];                                                                                        \
        return sum;                                                                                                \
    }                                                                                                              \
                                                                                                                   \
    void kt_dot_rows_##NAME##_avx2(const float *x, const void *const *rows, int64_t n_rows, int64_t n, float scale, \
                                   float *out, int64_t out_stride)                                                 \
    {                                                                                                              \
        const int64_t n8 = n / 8 * 8;                                                                              \
        int64_t t = 0;                                                                                             \
        for (; t + 4 <= n_rows; t += 4) {                                                                          \
            const uint16_t *r0 = rows[t], *r1 = rows[t + 1], *r2 = rows[t + 2], *r3 = rows[t + 3];                 \
            __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(),                   \
                   a3 = _mm256_setzero_ps();                                                                       \
            for (int64_t i = 0; i < n8; i += 8) {                                                                  \
                const __m256 xv = _mm256_loadu_ps(x + i);                                                          \
                a0 = _mm256_add_ps(a0, _mm256_mul_ps(xv, LOAD(r0 + i)));                                           \
                a1 = _mm256_add_ps(a1, _mm256_mul_ps(xv, LOAD(r1 + i)));                                           \
                a2 = _mm256_add_ps(a2, _mm256_mul_ps(xv, LOAD(r2 + i)));                                           \
                a3 = _mm256_add_ps(a3, _mm256_mul_ps(xv, LOAD(r3 + i)));                                           \
            }                                                                                                      \
            out[t * out_stride] = scale * finish_##NAME(a0, x, r0, n8, n);                                         \
            out[(t + 1) * out_stride] = scale * finish_##NAME(a1, x, r1, n8, n);                                   \
            out[(t + 2) * out_stride] = scale * finish_##NAME(a2, x, r2, n8, n);                                   \
            out[(t + 3) * out_stride] = scale * finish_##NAME(a3, x, r3, n8, n);                                   \
        }                                                                                                          \
        for (; t < n_rows; t++) {                                                                                  \
            const uint16_t *r = rows[t];                                                                           \
            __m256 a = _mm256_setzero_ps();                                                                        \
            for (int64_t i = 0; i < n8; i += 8)                                                                    \
                a = _mm256_add_ps(a, _mm256_mul_ps(_mm256_loadu_ps(x + i), LOAD(r + i)));                          \
            out[t * out_stride] = scale * finish_##NAME(a, x, r, n8, n);                                           \
        }                                                                                                          \
    }                                                                                                              \
                                                                                                                   \
    void kt_axpy_##NAME##_avx2(float *y, float a, const void *xv, int64_t n)                                       \
    {                                                                                                              \
        const uint16_t *x = xv;                                                                                    \
        const __m256 av = _mm256_set1_ps(a);                                                                       \
        int64_t i = 0;                                                                                             \
        for (; i + 8 <= n; i += 8)                                                                                 \
            _mm256_storeu_ps(y + i, _mm256_add_ps(_mm256_loadu_ps(y + i), _mm256_mul_ps(av, LOAD(x + i))));        \
        for (; i < n; i++)                                                                                         \
            y[i] += a * WIDEN(x[i]);                                                                               \
    }

KT_ROWS_16(bf16, load_bf16, widen_bf16)
KT_ROWS_16(f16, load_f16, widen_f16)

/* The F32 row ops in the cache rows' signature. */
void kt_dot_rows_f32_any_avx2(const float *x, const void *const *rows, int64_t n_rows, int64_t n, float scale,
                              float *out, int64_t out_stride)
{
    kt_dot_rows_f32_avx2(x, (const float *const *)rows, n_rows, n, scale, out, out_stride);
}

void kt_axpy_f32_any_avx2(float *y, float a, const void *x, int64_t n)
{
    kt_axpy_f32_avx2(y, a, x, n);
}

/* ---- several heads over the same rows ----------------------------------------------
 *
 * dot_rows_multi runs the level's dot_rows once per query: a query's rows
 * are few and in L1 (the AVX-512 level shares each row's load between
 * queries).  axpy_rows keeps a tile of up to four outputs by sixteen
 * elements in ymm registers while the rows pass: each row's elements are
 * widened once for the tile's outputs, and each element's adds come in row
 * order, a product then a sum, as n_rows axpy calls make them. */

static inline __m256 load8_f32(const void *r, int64_t i)
{
    return _mm256_loadu_ps((const float *)r + i);
}

static inline __m256 load8_bf16(const void *r, int64_t i)
{
    return load_bf16((const uint16_t *)r + i);
}

static inline __m256 load8_f16(const void *r, int64_t i)
{
    return load_f16((const uint16_t *)r + i);
}

static inline float elem8_f32(const void *r, int64_t i)
{
    return ((const float *)r)[i];
}

static inline float elem8_bf16(const void *r, int64_t i)
{
    return widen_bf16(((const uint16_t *)r)[i]);
}

static inline float elem8_f16(const void *r, int64_t i)
{
    return widen_f16(((const uint16_t *)r)[i]);
}

#define KT_HEADS_AVX2(NAME, LOAD8, ELEM, DOT_ROWS)                                                                 \
    void kt_dot_rows_multi_##NAME##_avx2(const float *x, int64_t x_stride, int64_t n_x, const void *const *rows,   \
                                         int64_t n_rows, int64_t n, float scale, float *out, int64_t out_stride)   \
    {                                                                                                              \
        for (int64_t q = 0; q < n_x; q++)                                                                          \
            DOT_ROWS(x + q * x_stride, rows, n_rows, n, scale, out + q * out_stride, 1);                           \
    }                                                                                                              \
                                                                                                                   \
    /* Outputs g < G (a compile-time count once inlined), elements [i, i + 8 W). */                                \
    static inline __attribute__((always_inline)) void axpy_tile_##NAME(const int G, const int W, float *y,         \
                                                                        int64_t ys, const float *a, int64_t as,    \
                                                                        const void *const *rows, int64_t nr,       \
                                                                        int64_t i)                                 \
    {                                                                                                              \
        __m256 acc[4][2];                                                                                          \
        _Pragma("GCC unroll 4") for (int g = 0; g < G; g++)                                                        \
            _Pragma("GCC unroll 2") for (int w = 0; w < W; w++)                                                    \
                acc[g][w] = _mm256_loadu_ps(y + g * ys + i + 8 * w);                                               \
        for (int64_t r = 0; r < nr; r++) {                                                                         \
            __m256 v[2];                                                                                           \
            _Pragma("GCC unroll 2") for (int w = 0; w < W; w++) v[w] = LOAD8(rows[r], i + 8 * w);                  \
            _Pragma("GCC unroll 4") for (int g = 0; g < G; g++) {                                                  \
                const __m256 av = _mm256_set1_ps(a[g * as + r]);                                                   \
                _Pragma("GCC unroll 2") for (int w = 0; w < W; w++)                                                \
                    acc[g][w] = _mm256_add_ps(acc[g][w], _mm256_mul_ps(av, v[w]));                                 \
            }                                                                                                      \
        }                                                                                                          \
        _Pragma("GCC unroll 4") for (int g = 0; g < G; g++)                                                        \
            _Pragma("GCC unroll 2") for (int w = 0; w < W; w++)                                                    \
                _mm256_storeu_ps(y + g * ys + i + 8 * w, acc[g][w]);                                               \
    }                                                                                                              \
                                                                                                                   \
    static inline __attribute__((always_inline)) void axpy_heads_##NAME(const int G, float *y, int64_t ys,         \
                                                                         const float *a, int64_t as,               \
                                                                         const void *const *rows, int64_t nr,      \
                                                                         int64_t n)                                \
    {                                                                                                              \
        int64_t i = 0;                                                                                             \
        for (; i + 16 <= n; i += 16)                                                                               \
            axpy_tile_##NAME(G, 2, y, ys, a, as, rows, nr, i);                                                     \
        for (; i + 8 <= n; i += 8)                                                                                 \
            axpy_tile_##NAME(G, 1, y, ys, a, as, rows, nr, i);                                                     \
        for (; i < n; i++)                                                                                         \
            for (int g = 0; g < G; g++)                                                                            \
                for (int64_t r = 0; r < nr; r++)                                                                   \
                    y[g * ys + i] += a[g * as + r] * ELEM(rows[r], i);                                             \
    }                                                                                                              \
                                                                                                                   \
    void kt_axpy_rows_##NAME##_avx2(float *y, int64_t y_stride, int64_t n_y, const float *a, int64_t a_stride,     \
                                    const void *const *rows, int64_t n_rows, int64_t n)                            \
    {                                                                                                              \
        int64_t g = 0;                                                                                             \
        for (; g + 4 <= n_y; g += 4)                                                                               \
            axpy_heads_##NAME(4, y + g * y_stride, y_stride, a + g * a_stride, a_stride, rows, n_rows, n);         \
        for (; g + 2 <= n_y; g += 2)                                                                               \
            axpy_heads_##NAME(2, y + g * y_stride, y_stride, a + g * a_stride, a_stride, rows, n_rows, n);         \
        if (g < n_y)                                                                                               \
            axpy_heads_##NAME(1, y + g * y_stride, y_stride, a + g * a_stride, a_stride, rows, n_rows, n);         \
    }

KT_HEADS_AVX2(f32, load8_f32, elem8_f32, kt_dot_rows_f32_any_avx2)
KT_HEADS_AVX2(bf16, load8_bf16, elem8_bf16, kt_dot_rows_bf16_avx2)
KT_HEADS_AVX2(f16, load8_f16, elem8_f16, kt_dot_rows_f16_avx2)
