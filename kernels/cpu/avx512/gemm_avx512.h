/*
 * gemm_avx512.h - the AVX-512 (VNNI) gemm rows of the CPU kernel table
 * (prefill products: many activation rows against one weight matrix).
 *
 * Declarations only, so dispatch.c (compiled for the x86-64 baseline) can take
 * their addresses.  Nothing may call these except through the table, after
 * CPUID and XCR0 have proved the whole AVX-512 level.  Each is a kt_gemm_fn:
 * bit for bit the vec_dot of every (row, token) pair, never a reordered float
 * sum.
 */
#ifndef KT_GEMM_AVX512_H
#define KT_GEMM_AVX512_H

#include <stddef.h>
#include <stdint.h>

void kt_gemm_q8_0_q8_0_avx512(int64_t n, const void *w, size_t row_bytes, int64_t n_rows, const void *a,
                              size_t act_bytes, int64_t n_tok, float *y, int64_t y_stride);
void kt_gemm_q4_K_q8_K_avx512(int64_t n, const void *w, size_t row_bytes, int64_t n_rows, const void *a,
                              size_t act_bytes, int64_t n_tok, float *y, int64_t y_stride);
/* kernels/cpu/avx512/fp8_avx512.c: FP8_B128 weights against F32 activation rows */
void kt_gemm_fp8_b128_f32_avx512(int64_t n, const void *w, size_t row_bytes, int64_t n_rows, const void *a,
                                 size_t act_bytes, int64_t n_tok, float *y, int64_t y_stride);

#endif
