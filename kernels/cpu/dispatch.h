/*
 * dispatch.h - the one table of CPU kernels, filled once at start-up from CPUID.
 *
 * Call sites look up the kernel for a weight type here and never test the
 * instruction set themselves.  KT_ISA=scalar|avx2|avx512|amx (environment)
 * forces a level at or below what the CPU supports, so tests can compare
 * levels; asking for a level the CPU lacks falls back to the best it has and
 * never executes an unsupported instruction.
 */
#ifndef KT_CPU_DISPATCH_H
#define KT_CPU_DISPATCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "quant.h"
#include "cpu/packed.h"
#include "cpu/ref/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

enum kt_isa {
    KT_ISA_SCALAR = 0,
    KT_ISA_AVX2 = 1,   /* AVX2 + FMA + F16C */
    KT_ISA_AVX512 = 2, /* F, BW, VL, VNNI, BF16 */
    KT_ISA_AMX = 3,    /* AMX-TILE, INT8, BF16, with the kernel's permission granted */
};

/* out[r] = dot(row r, a) for r < n_rows, row r starting r * row_bytes bytes
 * into w: bit for bit what n_rows vec_dot calls give, read as one stream. */
typedef void (*kt_gemv_fn)(int64_t n, float *out, const void *w, size_t row_bytes, const void *a,
                           int64_t n_rows);

/* y[t * y_stride + r] = dot(row r of w, row t of a) for r < n_rows, t < n_tok:
 * weight row r at w + r * row_bytes, activation row t at a + t * act_bytes
 * (each as quantize_act wrote it).  Bit for bit what n_rows * n_tok vec_dot
 * calls give; tiled so each weight block is unpacked once for several tokens
 * (the prefill product). */
typedef void (*kt_gemm_fn)(int64_t n, const void *w, size_t row_bytes, int64_t n_rows, const void *a,
                           size_t act_bytes, int64_t n_tok, float *y, int64_t y_stride);

struct kt_cpu_type_kernels {
    /* dot(w, a) over n elements: w of this weight type, a already converted by
     * quantize_act.  NULL if kt has no dot product for this type. */
    kt_vec_dot_fn vec_dot;
    kt_gemv_fn gemv; /* several rows against one activation; NULL where vec_dot is */
    kt_gemm_fn gemm; /* several rows against several activations; NULL where vec_dot is */
    /* Converts an F32 activation row to vec_dot_type (Q8_0, Q8_1, Q8_K or F32). */
    kt_from_float_fn quantize_act;
    enum kt_type vec_dot_type;
    /* The layout expert weights are repacked into at load for this level, and
     * its kernel (kernels/cpu/packed.h); NULL: kept in the GGUF layout. */
    const struct kt_packed_format *packed;
};

/* Float row operations of attention over the latent cache and of the MoE
 * combine: each is bit for bit its kernels/cpu/ref/ops.c twin. */
struct kt_cpu_f32_kernels {
    /* out[t * out_stride] = scale * kt_dot_f32(x, rows[t], n) for t < n_rows
     * (the reference's eight interleaved partial sums per row; x * rows[t]
     * or rows[t] * x: the same products). */
    void (*dot_rows)(const float *x, const float *const *rows, int64_t n_rows, int64_t n, float scale, float *out,
                     int64_t out_stride);
    void (*axpy)(float *y, float a, const float *x, int64_t n); /* kt_axpy_f32: y[i] += a * x[i] */
};

/* The same two on the latent cache's rows of one element type (row[t] for
 * enum kt_row_type t): bit for bit kt_dot_rows_typed and kt_axpy_typed. */
struct kt_cpu_row_kernels {
    void (*dot_rows)(const float *x, const void *const *rows, int64_t n_rows, int64_t n, float scale, float *out,
                     int64_t out_stride);
    void (*axpy)(float *y, float a, const void *x, int64_t n);
    /* n_x queries against the same rows, n_y outputs over the same rows
     * (kt_dot_rows_multi_typed, kt_axpy_rows_typed): each row is read once
     * for all of them and each output stays in registers over the rows. */
    void (*dot_rows_multi)(const float *x, int64_t x_stride, int64_t n_x, const void *const *rows, int64_t n_rows,
                           int64_t n, float scale, float *out, int64_t out_stride);
    void (*axpy_rows)(float *y, int64_t y_stride, int64_t n_y, const float *a, int64_t a_stride,
                      const void *const *rows, int64_t n_rows, int64_t n);
};

struct kt_cpu_kernels {
    enum kt_isa isa;         /* the level in use */
    enum kt_isa isa_max;     /* the best level this CPU supports */
    struct kt_cpu_type_kernels type[KT_TYPE_COUNT];
    struct kt_cpu_f32_kernels f32;
    struct kt_cpu_row_kernels row[KT_ROW_TYPE_COUNT];
};

/* The table (thread-safe; initialised on first call). */
const struct kt_cpu_kernels *kt_cpu_kernels(void);

/* A table for one specific level (<= isa_max), for tests and benchmarks;
 * NULL if the CPU does not support it. */
const struct kt_cpu_kernels *kt_cpu_kernels_for(enum kt_isa isa);

const char *kt_isa_name(enum kt_isa isa);

#ifdef __cplusplus
}
#endif

#endif
