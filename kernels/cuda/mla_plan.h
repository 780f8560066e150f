/*
 * mla_plan.h - how mla.cu splits one launch's contexts into slices and how
 * much scratch that takes: host-only arithmetic, plain C, so that the host
 * emulation of kt_cuda.h (tests/cuda_emulated.c) sizes and checks scratch
 * exactly as the GPU path does.
 */
#ifndef KT_CUDA_MLA_PLAN_H
#define KT_CUDA_MLA_PLAN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kt_cuda.h"

#define MLA_HEADS 8          /* heads per block = warps per block */
#define MLA_MIN_SPLIT_ROWS 64
#define MLA_TARGET_BLOCKS 256 /* split the context until a launch has about this many blocks */
#define MLA_MAX_SPLITS 1024
#define MLA_ROWS 8           /* cache rows per tile */
#define MLA_THREADS 256
#define MLA_MAX_COLS 4       /* latent columns per thread: kvr <= 4 * 256 */
#define MLA_MAX_SMEM 49152
#define MLA_STATIC_SMEM (MLA_ROWS * sizeof(const float *)) /* mla_attend's tile row pointers */
#define MLA_MAX_HEAD_GROUPS 65535LL /* gridDim.y */

/* Dynamic shared memory of mla_attend for rows of D = kvr + dr. */
static inline size_t mla_smem_bytes(int64_t D)
{
    return (size_t)((MLA_HEADS + MLA_ROWS) * D + MLA_HEADS * MLA_ROWS + 3 * MLA_HEADS) * sizeof(float);
}

/* Whether the kernels take the shape: positive dims, an even rope dim, kvr
 * <= 1024 (four latent columns per thread) and the tile in 48 KiB of shared
 * memory (kvr + dr <= 760). */
static inline bool mla_shape_supported(const struct kt_cuda_mla *m)
{
    const int64_t H = m->n_head, dn = m->nope_dim, dr = m->rope_dim, dv = m->v_dim, kvr = m->kv_rank;
    return H > 0 && H <= MLA_MAX_HEAD_GROUPS * MLA_HEADS && dn > 0 && dr > 0 && dr % 2 == 0 && dv > 0 && kvr > 0 &&
           kvr <= MLA_MAX_COLS * MLA_THREADS && mla_smem_bytes(kvr + dr) + MLA_STATIC_SMEM <= MLA_MAX_SMEM;
}

/* Context slices for a launch: enough blocks to fill the GPU, none shorter
 * than 64 rows.  *most_slices: the count before rounding to equal slices,
 * which is at least the one used and never shrinks as n_kv_max grows (so
 * scratch sized for the longest context holds any shorter one). */
static inline int64_t mla_splits(int64_t H, int64_t n_tok, int64_t n_kv_max, int64_t *split_rows, int64_t *most_slices)
{
    const int64_t blocks = n_tok * ((H + MLA_HEADS - 1) / MLA_HEADS);
    int64_t n = (MLA_TARGET_BLOCKS + blocks - 1) / blocks;
    const int64_t most = (n_kv_max + MLA_MIN_SPLIT_ROWS - 1) / MLA_MIN_SPLIT_ROWS;
    if (n > most)
        n = most;
    if (n > MLA_MAX_SPLITS)
        n = MLA_MAX_SPLITS;
    if (n < 1)
        n = 1;
    *most_slices = n;
    *split_rows = n_kv_max > 0 ? (n_kv_max + n - 1) / n : 1;
    return n_kv_max > 0 ? (n_kv_max + *split_rows - 1) / *split_rows : 1; /* no empty slice */
}

static inline size_t mla_align_up(size_t n)
{
    return (n + 255) & ~(size_t)255;
}

/* Byte sizes of the scratch parts: q_lat, o_lat, part_o, part_ml. */
static inline void mla_scratch_parts(const struct kt_cuda_mla *m, int64_t n_tok, int64_t n_kv_max, size_t part[4],
                                     int64_t *n_split, int64_t *split_rows)
{
    const size_t th = (size_t)n_tok * (size_t)m->n_head;
    int64_t most = 1;
    *n_split = mla_splits(m->n_head, n_tok, n_kv_max, split_rows, &most);
    part[0] = mla_align_up(th * (size_t)(m->kv_rank + m->rope_dim) * sizeof(float));
    part[1] = mla_align_up(th * (size_t)m->kv_rank * sizeof(float));
    part[2] = most > 1 ? mla_align_up(th * (size_t)most * (size_t)m->kv_rank * sizeof(float)) : 0;
    part[3] = most > 1 ? mla_align_up(th * (size_t)most * 2 * sizeof(float)) : 0;
}

/* Their sum: the scratch one launch of n_tok tokens over contexts up to n_kv_max takes. */
static inline size_t mla_scratch_total(const struct kt_cuda_mla *m, int64_t n_tok, int64_t n_kv_max)
{
    size_t part[4];
    int64_t n_split, split_rows;
    mla_scratch_parts(m, n_tok, n_kv_max, part, &n_split, &split_rows);
    return part[0] + part[1] + part[2] + part[3];
}

#endif
