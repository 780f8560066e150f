/*
 * peak.h - compute peaks measured on the caller's thread count: FMA (f32
 * GFLOP/s) and int8 dot (GOP/s) per SIMD level, so kernel speed can be
 * reported as a ratio taken in the same run on the same cores (docs/architecture.md, Tests and CI).
 * Never prints; measures, never judges (no timed assertions in tests).
 */
#ifndef KT_PEAK_H
#define KT_PEAK_H

#include <stdbool.h>

#include "cpu/dispatch.h"
#include "status.h"

enum kt_peak_kind {
    KT_PEAK_FMA_F32 = 0,   /* independent vfmadd chains: 2 flops per lane */
    KT_PEAK_DOT_INT8 = 1,  /* u8 x s8 multiply-add chains: 2 ops per pair */
};

struct kt_peak_result {
    enum kt_peak_kind kind;
    enum kt_isa isa;
    int width_bits;        /* register width of the loop */
    const char *method;    /* "vfmadd", "vpmaddubsw+vpmaddwd+vpaddd", "vpdpbusd" */
    double best_gops;      /* 1e9 ops per second, best repeat, all threads together */
    double median_gops;
    int threads;
    int repeats;
};

/* Whether this build and CPU have a loop of this kind at this level. */
bool kt_peak_available(enum kt_peak_kind kind, enum kt_isa isa);

/* Runs the loop on `threads` threads for about `seconds` in all (split over
 * `repeats`).  KT_ERR_UNSUPPORTED where kt_peak_available is false. */
kt_status kt_peak_measure(enum kt_peak_kind kind, enum kt_isa isa, int threads, double seconds, int repeats,
                          struct kt_peak_result *out, kt_err *err);

const char *kt_peak_kind_name(enum kt_peak_kind kind); /* "fma_f32", "dot_int8" */

#endif
