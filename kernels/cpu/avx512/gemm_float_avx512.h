/*
 * gemm_float_avx512.h - the AVX-512 gemm rows of the CPU kernel table for
 * F32, F16 and BF16 weights against F32 activations (prefill products: many
 * activation rows against one weight matrix).
 *
 * Declarations only, so dispatch.c (compiled for the x86-64 baseline) can take
 * their addresses.  Nothing may call these except through the table, after
 * CPUID and XCR0 have proved the whole AVX-512 level.  Each is a kt_gemm_fn:
 * bit for bit the level's vec_dot (vec_dot_float_avx2.c's 32 float lanes
 * and final sum) of every (row, token) pair, never a reordered float sum.
 */
#ifndef KT_GEMM_FLOAT_AVX512_H
#define KT_GEMM_FLOAT_AVX512_H

#include <stddef.h>
#include <stdint.h>

void kt_gemm_f32_f32_avx512(int64_t n, const void *w, size_t row_bytes, int64_t n_rows, const void *a,
                            size_t act_bytes, int64_t n_tok, float *y, int64_t y_stride);
void kt_gemm_f16_f32_avx512(int64_t n, const void *w, size_t row_bytes, int64_t n_rows, const void *a,
                            size_t act_bytes, int64_t n_tok, float *y, int64_t y_stride);
void kt_gemm_bf16_f32_avx512(int64_t n, const void *w, size_t row_bytes, int64_t n_rows, const void *a,
                             size_t act_bytes, int64_t n_tok, float *y, int64_t y_stride);

#endif
