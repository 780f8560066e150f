/*
 * packed_avx2.h - the packed expert layouts of the AVX2 level: Q4_K, Q8_0 and
 * Q4_0 weights interleaved 8 rows per group, one ymm int32 lane per row
 * (kernels/cpu/packed.h says what a packed format promises).
 *
 * Declarations only, so dispatch.c (compiled for the x86-64 baseline) can take
 * their addresses.  Nothing may use these formats except through the table of
 * a level whose CPUID check proved AVX2, FMA and F16C (pack and gemm are
 * built with those flags).  All are exact: every output equals the reference
 * vec_dot bit for bit.
 */
#ifndef KT_PACKED_AVX2_H
#define KT_PACKED_AVX2_H

#include "cpu/packed.h"

extern const struct kt_packed_format kt_packed_q4_K_avx2; /* "q4_K.r8.avx2", Q8_K activations */
extern const struct kt_packed_format kt_packed_q8_0_avx2; /* "q8_0.r8.avx2", Q8_0 activations */
extern const struct kt_packed_format kt_packed_q4_0_avx2; /* "q4_0.r8.avx2", Q8_0 activations */

#endif
