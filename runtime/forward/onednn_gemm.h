/*
 * onednn_gemm.h - float matrix products through oneDNN (libdnnl), for the
 * prefill products of F32 and BF16 weights where oneDNN measures faster than
 * kt's own gemm rows.
 *
 *   y[t * y_stride + o] = sum_i a[t * a_stride + i] * W[o][i]
 *   A (n_tok, n_in) F32 rows, W (n_out, n_in) F32 or BF16 rows,
 *   for t < n_tok, o < n_out.
 *
 * Results are NOT kt's vec_dot bit for bit: oneDNN blocks and orders the
 * float sums its own way.  Every output is the exact dot product (BF16
 * widened exactly) up to float summation error, at most
 * n_in * 2^-24 * sum_i |a_i * W[o][i]| in any order (tests/test_onednn_gemm.c
 * holds it to that on odd shapes).  Callers that need outputs identical to
 * vec_dot, or independent of the other rows of a batch, must not use it.
 *
 * Threads: a call runs on its calling thread only.  The Debian oneDNN is
 * built on OpenMP; each call holds that thread's OpenMP team to 1 for its
 * duration, so oneDNN never starts threads of its own and kt's pool (which
 * calls this on disjoint row slices) is the only parallelism.  A oneDNN
 * built on TBB or a threadpool would not be held this way.
 */
#ifndef KT_ONEDNN_GEMM_H
#define KT_ONEDNN_GEMM_H

#include <stdint.h>

#include "quant.h"
#include "status.h"

/* w: (n_out, w_stride) floats; a: (n_tok, a_stride) floats; y: (n_tok, y_stride). */
kt_status kt_onednn_gemm_f32(int64_t n_in, const float *w, int64_t w_stride, int64_t n_out, const float *a,
                             int64_t a_stride, int64_t n_tok, float *y, int64_t y_stride, kt_err *err);

/* w: (n_out, w_stride) bf16; the rest as kt_onednn_gemm_f32.  Widens the
 * weights to F32 a block of rows at a time and multiplies with sgemm (the
 * activations stay F32: oneDNN's bf16 x bf16 matmul would round them to
 * bf16, and measured slower here). */
kt_status kt_onednn_gemm_bf16(int64_t n_in, const kt_bf16 *w, int64_t w_stride, int64_t n_out, const float *a,
                              int64_t a_stride, int64_t n_tok, float *y, int64_t y_stride, kt_err *err);

#endif
