/*
 * packed.h - expert weights repacked at load into the layout a kernel wants.
 *
 * The GGUF stores a matrix row after row, each row a run of quant blocks.  A
 * packed format instead interleaves `rows` consecutive rows into one
 * self-contained group of group_bytes(n) bytes, laid out so the kernel can
 * feed a whole SIMD register (or AMX tile) of rows from one load: e.g. 16
 * rows' nibbles of one 32-element sub-block side by side, scales widened.
 * A packed matrix of n_rows rows is ceil(n_rows / rows) groups back to back;
 * the last group's missing rows are zero-filled and never written out.
 *
 * Activations are the weight type's vec_dot_type rows exactly as the type's
 * quantize_act wrote them (the same as for the GGUF layout), so a caller
 * switches layouts without touching its activation path.
 *
 * Results: every output equals the reference vec_dot (kernels/cpu/ref) of
 * that (row, token) pair bit for bit unless the format's `exact` is false,
 * in which case its test states the tolerance.  A format belongs to one ISA
 * level of the dispatch table: the expert store packs with the format of the
 * level in use, and only that level's gemm may read it.
 */
#ifndef KT_CPU_PACKED_H
#define KT_CPU_PACKED_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* y[t * y_stride + r] = dot(row r, activation t) for r < n_rows, t < n_tok.
 * w: the packed matrix from its first group (callers address row slices by
 * whole groups: kt_packed_rows); n_rows may stop inside the last group; a row
 * has n elements; activation t at a + t * act_bytes.  n_tok >= 1: the same
 * function serves decode (one or a few tokens) and prefill (many). */
typedef void (*kt_packed_gemm_fn)(int64_t n, const void *w, int64_t n_rows, const void *a, size_t act_bytes,
                                  int64_t n_tok, float *y, int64_t y_stride);

struct kt_packed_format {
    const char *name;  /* for logs and kt-bench, e.g. "q4_K.r16.avx512" */
    uint32_t rows;     /* rows per group: 1, 2, 4, 8 or 16 (divides 16) */
    bool exact;        /* bit for bit the reference vec_dot */
    /* Bytes of one group of `rows` rows of n elements (a multiple of 64). */
    size_t (*group_bytes)(int64_t n);
    /* Packs rows [0, n_rows) (row r at w + r * row_bytes, GGUF layout) into
     * dst, ceil(n_rows / rows) groups, zero rows padding the last. */
    void (*pack)(int64_t n, const void *w, size_t row_bytes, int64_t n_rows, void *dst);
    kt_packed_gemm_fn gemm;
};

/* Bytes of a packed matrix of n_rows rows of n elements. */
static inline size_t kt_packed_bytes(const struct kt_packed_format *f, int64_t n, int64_t n_rows)
{
    return (size_t)((n_rows + f->rows - 1) / f->rows) * f->group_bytes(n);
}

/* The packed matrix from row `first` on (first a multiple of f->rows). */
static inline const void *kt_packed_rows(const struct kt_packed_format *f, const void *w, int64_t n, int64_t first)
{
    return (const char *)w + (size_t)(first / f->rows) * f->group_bytes(n);
}

#endif
