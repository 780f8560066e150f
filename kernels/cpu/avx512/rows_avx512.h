/*
 * rows_avx512.h - AVX-512 twins of the cache-row scores kt_dot_rows_typed
 * (kernels/cpu/ref/ops.h) for F32, BF16 and F16 rows, bit for bit
 * (dispatch.h, struct kt_cpu_row_kernels), and their forms for several heads
 * over one key block.  axpy stays AVX2's: its elements are independent and
 * bound by the row's bytes, not the instruction width.
 */
#ifndef KT_ROWS_AVX512_H
#define KT_ROWS_AVX512_H

#include <stdint.h>

void kt_dot_rows_f32_avx512(const float *x, const void *const *rows, int64_t n_rows, int64_t n, float scale,
                            float *out, int64_t out_stride);
void kt_dot_rows_bf16_avx512(const float *x, const void *const *rows, int64_t n_rows, int64_t n, float scale,
                             float *out, int64_t out_stride);
void kt_dot_rows_f16_avx512(const float *x, const void *const *rows, int64_t n_rows, int64_t n, float scale,
                            float *out, int64_t out_stride);

/* Several queries / outputs over the same rows (kt_dot_rows_multi_typed, kt_axpy_rows_typed), bit for bit. */
void kt_dot_rows_multi_f32_avx512(const float *x, int64_t x_stride, int64_t n_x, const void *const *rows,
                                 int64_t n_rows, int64_t n, float scale, float *out, int64_t out_stride);
void kt_axpy_rows_f32_avx512(float *y, int64_t y_stride, int64_t n_y, const float *a, int64_t a_stride,
                           const void *const *rows, int64_t n_rows, int64_t n);
void kt_dot_rows_multi_bf16_avx512(const float *x, int64_t x_stride, int64_t n_x, const void *const *rows,
                                 int64_t n_rows, int64_t n, float scale, float *out, int64_t out_stride);
void kt_axpy_rows_bf16_avx512(float *y, int64_t y_stride, int64_t n_y, const float *a, int64_t a_stride,
                           const void *const *rows, int64_t n_rows, int64_t n);
void kt_dot_rows_multi_f16_avx512(const float *x, int64_t x_stride, int64_t n_x, const void *const *rows,
                                 int64_t n_rows, int64_t n, float scale, float *out, int64_t out_stride);
void kt_axpy_rows_f16_avx512(float *y, int64_t y_stride, int64_t n_y, const float *a, int64_t a_stride,
                           const void *const *rows, int64_t n_rows, int64_t n);

#endif
