/*
 * peak_loops.h - the instruction-throughput loops kt-bench divides kernel
 * speed by: independent FMA chains and int8 dot chains per SIMD width.
 *
 * Each loop runs `iters` rounds on one thread and returns the operations it
 * performed (an FMA counts 2 flops, an int8 multiply-add 2 ops); it stores a
 * result in *sink so nothing is optimised away.  kt_peak_loops_for() hands
 * out only loops this build compiled and this CPU runs (same rule as
 * dispatch.h): a NULL entry is never called.  Never used on a model's data.
 */
#ifndef KT_CPU_PEAK_LOOPS_H
#define KT_CPU_PEAK_LOOPS_H

#include <stdint.h>

#include "cpu/dispatch.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef uint64_t (*kt_peak_loop_fn)(uint64_t iters, float *sink);

struct kt_peak_loops {
    int width_bits;             /* register width the loops use */
    kt_peak_loop_fn fma_f32;    /* vfmadd on f32 lanes; NULL at amx */
    kt_peak_loop_fn dot_int8;   /* u8 x s8 -> s32: vpmaddubsw+vpmaddwd+vpaddd, or vpdpbusd */
    const char *dot_int8_name;  /* the instruction sequence, for reports */
};

/* The loops of one level (avx2, avx512, amx: its int8 loop only); NULL for
 * levels without loops (scalar) or that this build or CPU lacks. */
const struct kt_peak_loops *kt_peak_loops_for(enum kt_isa isa);

uint64_t kt_peak_fma_avx2(uint64_t iters, float *sink);
uint64_t kt_peak_dot_int8_avx2(uint64_t iters, float *sink);
uint64_t kt_peak_fma_avx512(uint64_t iters, float *sink);
uint64_t kt_peak_dot_int8_avx512(uint64_t iters, float *sink);
uint64_t kt_peak_dot_int8_amx(uint64_t iters, float *sink); /* TDPBSSD; fma_f32 NULL at amx */

#ifdef __cplusplus
}
#endif

#endif
