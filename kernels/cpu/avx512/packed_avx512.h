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

/* The layouts' offsets (described in packed_avx512.c), which the amx level's
 * tiles also read (kernels/cpu/amx/packed_amx.c): one definition for both. */
#define KT_PACKED_Q4_K_SB_BYTES 2368 /* a group's slice of one super-block, 37 x 64 */
#define KT_PACKED_Q4_K_SC 2048       /* u8 scales [8][16] */
#define KT_PACKED_Q4_K_M 2176        /* u8 mins [8][16] */
#define KT_PACKED_Q4_K_D 2304        /* fp16 d[16] */
#define KT_PACKED_Q4_K_DMIN 2336     /* fp16 dmin[16] */
#define KT_PACKED_Q8_0_PAIR_BYTES 1088 /* two blocks of 16 rows: 2 x 512 quants, then 2 x 32 scales */
#define KT_PACKED_Q8_0_D 1024
#define KT_PACKED_Q4_0_PAIR_BYTES 576  /* 2 x 256 quants, then 2 x 32 scales */
#define KT_PACKED_Q4_0_D 512

/* How far ahead the packed kernels prefetch the weights they stream. */
#define KT_PACKED_PREFETCH_BYTES 4096

/* Prefetches the weight line `ahead` bytes past p (an integer address: it may
 * lie past the end of the buffer, and a prefetch never faults).  Always
 * inlined: GCC 12 deems a function holding only a prefetch const and drops
 * the calls it did not inline.  (SSE: any x86-64.) */
#include <xmmintrin.h>
static inline __attribute__((always_inline)) void kt_packed_prefetch(const void *p, size_t ahead)
{
    _mm_prefetch((const char *)((uintptr_t)p + ahead), _MM_HINT_T0);
}

extern const struct kt_packed_format kt_packed_q4_K_avx512; /* "q4_K.r16.avx512", Q8_K activations */
extern const struct kt_packed_format kt_packed_q8_0_avx512; /* "q8_0.r16.avx512", Q8_0 activations */
extern const struct kt_packed_format kt_packed_q4_0_avx512; /* "q4_0.r16.avx512", Q8_0 activations */

#endif
