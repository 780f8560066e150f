/*
 * reference_forward.h - a naive deepseek2 forward pass in double precision,
 * the yardstick the engine is tested against (test_forward.c).
 *
 * It is written from docs/deepseek2.md, one function per block, and shares no
 * code with the engine but the GGUF reader (runtime/model) and the
 * dequantizers (kernels/quant.c).  Every position is recomputed from scratch;
 * attention uses the expanded form (keys and values per head); routing sorts.
 * Slow on purpose: it exists to be read and trusted.
 */
#ifndef KT_REFERENCE_FORWARD_H
#define KT_REFERENCE_FORWARD_H

#include <stdint.h>

#include "gguf.h"
#include "model.h"
#include "moe.h"

/* A tensor dequantized to a malloc'd float array (ne0*ne1*ne2*ne3 values). */
float *ref_dequantize(const struct kt_gguf_tensor *t);

/* Routing of one token (docs/deepseek2.md "MoE routing"): router logits z
 * (n_expert), selection bias or NULL; idx and w (n_used) receive the experts
 * in selection order and their weights.  Returns the smallest gap between
 * neighbours in the sorted orders that decided the selection: below float
 * resolution a float implementation may order them either way. */
double ref_route(const struct kt_router *r, const double *z, const float *bias, uint32_t *idx, double *w);

/* Logits (n, V) of every position of toks[0..n), malloc'd. */
double *ref_forward(const struct kt_model *m, const int32_t *toks, int64_t n);

/* The same, also giving each MoE layer's routing: routes (n_layer, n, n_expert_used)
 * the experts of position p in selection order (dense layers' rows untouched), and
 * *margin lowered to the smallest ref_route margin met (may both be NULL). */
double *ref_forward_routed(const struct kt_model *m, const int32_t *toks, int64_t n, uint32_t *routes, double *margin);

/* Logits (n_last, V) of the last n_last positions of toks[0..n), malloc'd, for a
 * model of one layer only (NULL otherwise): linear in n, not quadratic, so a
 * 131072-token context is a few seconds.  cache_type: the GGUF type (F32, F16,
 * BF16) the latent cache row is rounded to before it is read, as a KV cache of
 * that type stores it; -1 keeps it in double as ref_forward does. */
double *ref_forward_last(const struct kt_model *m, const int32_t *toks, int64_t n, int64_t n_last, int cache_type);

#endif
