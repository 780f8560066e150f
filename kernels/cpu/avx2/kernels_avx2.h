/*
 * kernels_avx2.h - the AVX2 + FMA + F16C rows of the CPU kernel table.
 *
 * Declarations only, so dispatch.c (compiled for the x86-64 baseline) can take
 * their addresses.  Nothing may call these except through the table, after
 * CPUID has proved AVX2, FMA and F16C: they are built with -mavx2 -mfma -mf16c.
 *
 * Every function here computes what its scalar twin in kernels/cpu/ref or
 * quant.c computes.  The quantized dot products sum integers exactly and then
 * apply the block scales in the reference's order, so they equal the reference
 * bit for bit (MXFP4 included); FP8_B128 keeps its reference's 64 FMA lanes and
 * their halving, bit for bit too; the F32/F16/BF16 dot products accumulate in float lanes, so they
 * equal the reference (summed in double) up to float summation error.  Dot
 * products expect activations from the matching quantize_act: Q8_0 quants in
 * [-127, 127], Q8_K quants in [-128, 127] with bsums equal to the sums of qs.
 */
#ifndef KT_KERNELS_AVX2_H
#define KT_KERNELS_AVX2_H

#include <stddef.h>
#include <stdint.h>

/* kt_vec_dot_fn: *out = dot(w, a) over n elements */
void kt_vec_dot_f32_f32_avx2(int64_t n, float *out, const void *w, const void *a);
void kt_vec_dot_f16_f32_avx2(int64_t n, float *out, const void *w, const void *a);
void kt_vec_dot_bf16_f32_avx2(int64_t n, float *out, const void *w, const void *a);
void kt_vec_dot_q8_0_q8_0_avx2(int64_t n, float *out, const void *w, const void *a);
void kt_vec_dot_q4_0_q8_0_avx2(int64_t n, float *out, const void *w, const void *a);
void kt_vec_dot_q5_0_q8_0_avx2(int64_t n, float *out, const void *w, const void *a);
void kt_vec_dot_q4_K_q8_K_avx2(int64_t n, float *out, const void *w, const void *a);
void kt_vec_dot_q5_K_q8_K_avx2(int64_t n, float *out, const void *w, const void *a);
void kt_vec_dot_q6_K_q8_K_avx2(int64_t n, float *out, const void *w, const void *a);
void kt_vec_dot_mxfp4_q8_0_avx2(int64_t n, float *out, const void *w, const void *a);
void kt_vec_dot_fp8_b128_f32_avx2(int64_t n, float *out, const void *w, const void *a); /* bit-exact: ref's 64 lanes */

/* kt_from_float_fn: activation quantizers, bit-exact with quant.c's */
void kt_quantize_q8_0_avx2(const float *x, void *dst, int64_t n);
void kt_quantize_q8_K_avx2(const float *x, void *dst, int64_t n);

#endif
