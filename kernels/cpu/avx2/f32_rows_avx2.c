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
