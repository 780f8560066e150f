/*
 * packed_avx512.h - the packed expert layouts of the AVX-512 (VNNI) level:
 * Q4_K, Q8_0 and Q4_0 weights interleaved 16 rows per group, one zmm lane per row
 * (kernels/cpu/packed.h says what a packed format promises).
 *
 * Declarations only, so dispatch.c (compiled for the x86-64 baseline) can take
 * their addresses.  Nothing may use these formats except through the table of
 * a level whose CPUID check proved the whole AVX-512 level (pack and gemm are
 * built with the AVX-512 flags).  All are exact: every output equals the
 * reference vec_dot bit for bit.
 */
#ifndef KT_PACKED_AVX512_H
#define KT_PACKED_AVX512_H

#include "cpu/packed.h"

extern const struct kt_packed_format kt_packed_q4_K_avx512; /* "q4_K.r16.avx512", Q8_K activations */
extern const struct kt_packed_format kt_packed_q8_0_avx512; /* "q8_0.r16.avx512", Q8_0 activations */
extern const struct kt_packed_format kt_packed_q4_0_avx512; /* "q4_0.r16.avx512", Q8_0 activations */

#endif
