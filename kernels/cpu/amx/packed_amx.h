/*
 * packed_amx.h - expert weights packed for AMX tiles (the amx level's rows).
 *
 * Q8_0, Q4_0 and Q4_K are multiplied with AMX-INT8 (decode-sized calls with
 * the AVX-512 kernels over the same layout) and equal the reference vec_dot
 * bit for bit; BF16 with AMX-BF16 on activations split into two bf16 terms,
 * a float GEMM's accuracy, not the f32 reference's bits (exact = false;
 * tolerance in tests/test_kernels_amx.c; not in the amx level's table, see
 * kernels/cpu/dispatch.c: runtime/forward/matmul.c packs BF16 slices for it
 * where large float products leave vec_dot's bits anyway).  16 rows per
 * group, any row count and token count;
 * Q8_0 and Q4_0 need n a multiple of 32, Q4_K of 256, BF16 any n.  The gemm
 * functions execute tile instructions: call them only where the amx level's
 * CPUID check and permission hold (its table, its tests, kt-bench), never on
 * a CPU or process without AMX.
 */
#ifndef KT_CPU_PACKED_AMX_H
#define KT_CPU_PACKED_AMX_H

#include "cpu/packed.h"

extern const struct kt_packed_format kt_packed_q8_0_amx; /* vs Q8_0 activations */
extern const struct kt_packed_format kt_packed_q4_0_amx; /* vs Q8_0 activations */
extern const struct kt_packed_format kt_packed_q4_K_amx; /* vs Q8_K activations */
extern const struct kt_packed_format kt_packed_bf16_amx; /* vs F32 activations */
extern const struct kt_packed_format kt_packed_fp8_b128_amx; /* vs F32 activations; n a multiple of 128 */

/* The integer formats above pack exactly as the avx512 level's
 * (packed_avx512.h) and run its kernels below a few tokens; these run the
 * tiles at every token count (for the tests and kt-bench's comparison). */
extern const struct kt_packed_format kt_packed_q8_0_amx_tiles;
extern const struct kt_packed_format kt_packed_q4_0_amx_tiles;
extern const struct kt_packed_format kt_packed_q4_K_amx_tiles;

#endif
