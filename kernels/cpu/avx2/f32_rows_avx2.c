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
