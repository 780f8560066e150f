/*
 * f32_rows_avx2.h - AVX2 twins of the float row ops kt_dot_rows_f32 and
 * kt_axpy_f32 (kernels/cpu/ref/ops.c), bit for bit (dispatch.h, struct
 * kt_cpu_f32_kernels).
 */
#ifndef KT_F32_ROWS_AVX2_H
#define KT_F32_ROWS_AVX2_H

#include <stdint.h>

void kt_dot_rows_f32_avx2(const float *x, const float *const *rows, int64_t n_rows, int64_t n, float scale, float *out,
                          int64_t out_stride);
void kt_axpy_f32_avx2(float *y, float a, const float *x, int64_t n);

/* The same on cache rows of F32, BF16 and F16 (kernels/cpu/ref/ops.h, kt_dot_rows_typed, kt_axpy_typed). */
void kt_dot_rows_f32_any_avx2(const float *x, const void *const *rows, int64_t n_rows, int64_t n, float scale,
                              float *out, int64_t out_stride);
void kt_axpy_f32_any_avx2(float *y, float a, const void *x, int64_t n);
void kt_dot_rows_bf16_avx2(const float *x, const void *const *rows, int64_t n_rows, int64_t n, float scale, float *out,
                           int64_t out_stride);
void kt_axpy_bf16_avx2(float *y, float a, const void *x, int64_t n);
void kt_dot_rows_f16_avx2(const float *x, const void *const *rows, int64_t n_rows, int64_t n, float scale, float *out,
                          int64_t out_stride);
void kt_axpy_f16_avx2(float *y, float a, const void *x, int64_t n);

/* Several queries / outputs over the same rows (kt_dot_rows_multi_typed, kt_axpy_rows_typed). */
void kt_dot_rows_multi_f32_avx2(const float *x, int64_t x_stride, int64_t n_x, const void *const *rows, int64_t n_rows,
                              int64_t n, float scale, float *out, int64_t out_stride);
void kt_axpy_rows_f32_avx2(float *y, int64_t y_stride, int64_t n_y, const float *a, int64_t a_stride,
                         const void *const *rows, int64_t n_rows, int64_t n);
void kt_dot_rows_multi_bf16_avx2(const float *x, int64_t x_stride, int64_t n_x, const void *const *rows, int64_t n_rows,
                              int64_t n, float scale, float *out, int64_t out_stride);
void kt_axpy_rows_bf16_avx2(float *y, int64_t y_stride, int64_t n_y, const float *a, int64_t a_stride,
                         const void *const *rows, int64_t n_rows, int64_t n);
void kt_dot_rows_multi_f16_avx2(const float *x, int64_t x_stride, int64_t n_x, const void *const *rows, int64_t n_rows,
                              int64_t n, float scale, float *out, int64_t out_stride);
void kt_axpy_rows_f16_avx2(float *y, int64_t y_stride, int64_t n_y, const float *a, int64_t a_stride,
                         const void *const *rows, int64_t n_rows, int64_t n);

#endif
