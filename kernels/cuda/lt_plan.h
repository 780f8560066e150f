/*
 * lt_plan.h - how much scratch blaslt.cu's BF16 GEMM takes: host-only
 * arithmetic, plain C, so that a build without CUDA (no_cuda.c) sizes it as
 * the GPU path does - a planner there reserves what the engine on a GPU
 * host will take (kt_engine_device_work_bytes).
 */
#ifndef KT_CUDA_LT_PLAN_H
#define KT_CUDA_LT_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include "kt_cuda.h"
#include "quant.h"

#define LT_WORKSPACE_BYTES ((size_t)32 << 20) /* cuBLAS's recommended workspace for Hopper (4 MiB before) */

/* Row stride, in elements, of the BF16 copies: rows padded to 8 (16 bytes). */
static inline int64_t lt_bf16_ld(int64_t n_in)
{
    return (n_in + 7) / 8 * 8;
}

static inline size_t lt_align_up(size_t n)
{
    return (n + 255) & ~(size_t)255;
}

/* BF16 weights whose rows start 16-byte aligned are read where they lie. */
static inline int lt_weight_in_place(const struct kt_cuda_mat *w)
{
    const size_t row = w->row_bytes ? w->row_bytes : kt_type_row_bytes(w->type, w->n_in);
    return w->type == KT_TYPE_BF16 && (uintptr_t)w->data % 16 == 0 && row % 16 == 0;
}

/* Byte sizes of the scratch parts, in order: cuBLASLt's workspace, x in BF16
 * (n_tok, ld), W in BF16 (n_out, ld) or 0 when read in place. */
static inline void lt_scratch_parts(const struct kt_cuda_mat *w, int64_t n_tok, size_t part[3])
{
    const size_t ld = (size_t)lt_bf16_ld(w->n_in);
    part[0] = LT_WORKSPACE_BYTES;
    part[1] = lt_align_up((size_t)n_tok * ld * sizeof(uint16_t));
    part[2] = lt_weight_in_place(w) ? 0 : lt_align_up((size_t)w->n_out * ld * sizeof(uint16_t));
}

/* Their sum. */
static inline size_t lt_scratch_total(const struct kt_cuda_mat *w, int64_t n_tok)
{
    size_t part[3];
    lt_scratch_parts(w, n_tok, part);
    return part[0] + part[1] + part[2];
}

#endif
