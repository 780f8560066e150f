/*
 * matmul.h - weight matrices read in place from the mapped GGUF, and the
 * matrix-times-activations products of the CPU forward pass.
 *
 * A struct kt_mat is a view of rows of a GGUF weight: row o holds n_in
 * elements of `type` (y[o] = sum_i W[o][i] x[i]).  Views of sub-ranges of rows
 * address one expert's slab of a stacked {n_in, n_out, n_expert} tensor or
 * one head's block of attn_k_b / attn_v_b without copying.
 *
 * Products follow llama.cpp's numerics (GGUF's activation formats): each activation
 * row is converted once to the weight type's vec_dot_type (Q8_0, Q8_K, F32
 * ...) and every output is one vec_dot of a weight row with it - bit for bit,
 * whether the row runs alone (gemv), tiled (gemm) or packed - with one
 * exception: F32/BF16 weights of >= 2048 rows against >= 64 tokens go to
 * oneDNN's sgemm (faster there), whose sums differ from vec_dot's in the last
 * bits (within n_in 2^-24 sum|w a|; matmul.c), so such a row may differ
 * slightly between a large batch and a small one.  Nothing here repacks,
 * caches or writes weights; it must never depend on which thread computes
 * which row (results are the same for any thread count).
 */
#ifndef KT_MATMUL_H
#define KT_MATMUL_H

#include <stddef.h>
#include <stdint.h>

#include "cpu/dispatch.h"
#include "gguf.h"
#include "quant.h"
#include "pool.h"

struct kt_mat {
    /* row o at data + o * row_bytes; packed: groups of packed->rows rows (kernels/cpu/packed.h) */
    const uint8_t *data;
    int type;               /* enum kt_type of the weights */
    int64_t n_in, n_out;    /* elements per row, rows */
    size_t row_bytes;
    /* NULL: GGUF rows.  Else the expert store repacked these rows for this
     * format's kernel; row slices must then start at a multiple of
     * packed->rows, and only the products below may read them. */
    const struct kt_packed_format *packed;
};

/* The CPU kernels (kernels/cpu/dispatch.h) for a weight type; NULL if kt
 * cannot multiply it.  The one place the forward pass looks them up. */
const struct kt_cpu_type_kernels *kt_mat_kernels_for(int type);

/* All of a 2-D tensor, or of a 3-D one's stacked rows ({n_in, n_out, n_stack} ->
 * n_out * n_stack rows). */
struct kt_mat kt_mat_from_tensor(const struct kt_gguf_tensor *t);
/* A plain float matrix (n_out, n_in), e.g. weights dequantized into scratch;
 * its products take F32 activations as they are. */
struct kt_mat kt_mat_f32(const float *data, int64_t n_out, int64_t n_in);

/* Bytes of m's rows as stored (packed groups or GGUF rows). */
uint64_t kt_mat_bytes(const struct kt_mat *m);

/* Rows [first, first + n) of m. */
struct kt_mat kt_mat_rows(struct kt_mat m, int64_t first, int64_t n);

/* Bytes of one activation row of n values in the vec_dot_type of weight type t. */
size_t kt_act_row_bytes(int weight_type, int64_t n);

/* xq[t] = x[t] converted to the vec_dot_type of weight_type, t < n_rows.
 * x (n_rows, n) floats; xq (n_rows, kt_act_row_bytes(weight_type, n)) bytes. */
void kt_quantize_rows(struct kt_pool *pool, int weight_type, const float *x, int64_t n_rows, int64_t n,
                      void *xq);

/* y[t][o] = W[o] . xq[t] for o < m.n_out, t < n_rows, parallel over output rows.
 * xq as kt_quantize_rows wrote it for m.type; y (n_rows, y_stride) floats. */
void kt_matmul_q(struct kt_pool *pool, const struct kt_mat *m, const void *xq, int64_t n_rows, float *y,
                 int64_t y_stride);

/* ya = A xq and yb = B xq (y strides: the matrices' n_out) in one hand-off
 * when both take activations of one format (else one after the other):
 * every output bit for bit what kt_matmul_q gives. */
void kt_matmul_q_pair(struct kt_pool *pool, const struct kt_mat *a, const struct kt_mat *b, const void *xq,
                      int64_t n_rows, float *ya, float *yb);

/* The single-thread product of one row (used inside parallel tasks):
 * y[o] = W[o] . xq for o < m.n_out. */
void kt_matvec_q(const struct kt_mat *m, const void *xq, float *y);

/* The single-thread product of several rows (used inside parallel tasks):
 * y[t * y_stride + o] = W[o] . xq[t] for o < m.n_out, t < n_tok, activation
 * t at xq + t * act_bytes.  Packed or GGUF rows, gemv or tiled gemm: every
 * output is the same float as kt_matvec_q gives for that row alone. */
void kt_mat_gemm(const struct kt_mat *m, const void *xq, size_t act_bytes, int64_t n_tok, float *y,
                 int64_t y_stride);

/* y[i] = sum_o W[o][i] x[o], i < m.n_in: the transposed product, from
 * dequantized rows (tmp: m.n_in floats).  For W_UK of a fused attn_kv_b,
 * whose rows run the other way from what absorption needs. */
void kt_matvec_transposed(const struct kt_mat *m, const float *x, float *y, float *tmp);

/* Dequantizes rows [0, m.n_out) to floats: out (n_out, n_in). */
void kt_mat_dequantize(const struct kt_mat *m, float *out);

/* Rows of m dequantized KT_MAT_T_ROWS at a time: the attention's split-form
 * W_UK,h, whose rows are the columns of what the expanded form multiplies by. */
#define KT_MAT_T_ROWS 16 /* a cache line of floats per column run */

/* Dequantizes m transposed: out (n_in, n_out), out[i][o] = W[o][i]; tmp holds
 * KT_MAT_T_ROWS x n_in floats.  Rows are converted KT_MAT_T_ROWS at a time and
 * stored in runs of that many along out's rows (one store per element down a
 * column, n_out floats apart, thrashes the few cache sets that stride maps to). */
void kt_mat_dequantize_transposed(const struct kt_mat *m, float *out, float *tmp);

#endif
