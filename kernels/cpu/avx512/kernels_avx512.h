/*
 * kernels_avx512.h - the AVX-512 (F, BW, VL, VNNI, BF16) rows of the CPU
 * kernel table.
 *
 * Declarations only, so dispatch.c (compiled for the x86-64 baseline) can take
 * their addresses.  Nothing may call these except through the table, after
 * CPUID and XCR0 have proved the whole AVX-512 level: they are built with
 * -mavx512f -mavx512bw -mavx512vl -mavx512vnni -mavx512bf16.  Each equals its
 * scalar twin in kernels/cpu/ref bit for bit (exact integer sums, the
 * reference's float order); activations come from the matching quantize_act.
 */
#ifndef KT_KERNELS_AVX512_H
#define KT_KERNELS_AVX512_H

#include <stddef.h>
#include <stdint.h>

/* kt_vec_dot_fn: *out = dot(w, a) over n elements */
void kt_vec_dot_q8_0_q8_0_avx512(int64_t n, float *out, const void *w, const void *a);
void kt_vec_dot_q4_0_q8_0_avx512(int64_t n, float *out, const void *w, const void *a);
void kt_vec_dot_q4_K_q8_K_avx512(int64_t n, float *out, const void *w, const void *a);
void kt_vec_dot_mxfp4_q8_0_avx512(int64_t n, float *out, const void *w, const void *a);
void kt_vec_dot_fp8_b128_f32_avx512(int64_t n, float *out, const void *w, const void *a);

/* kt_gemv_fn: out[r] = dot(row r, a), bit for bit the vec_dot above, four rows per pass */
void kt_gemv_fp8_b128_f32_avx512(int64_t n, float *out, const void *w, size_t row_bytes, const void *a,
                                 int64_t n_rows);

#endif
