/*
 * init.h - how kt-synth draws a tensor's values (internal to tools/synth).
 *
 * Every row is a pure function of (seed, tensor index, row index): its random
 * state is derived by hashing those three, so rows can be drawn in any order
 * on any number of threads and the file's bytes never change.  Nothing here
 * locks or prints; only the skew fit allocates.
 */
#ifndef KT_SYNTH_INIT_H
#define KT_SYNTH_INIT_H

#include <stdint.h>

#include "synth.h"

enum kt_synth_init {
    KT_SYNTH_INIT_UNIFORM,     /* uniform, mean 0, std init_std */
    KT_SYNTH_INIT_NORM,        /* 1 + uniform noise of std init_std (RMSNorm weights) */
    KT_SYNTH_INIT_ROUTER_BIAS, /* exp_probs_b: the skew's preference + uniform noise of std init_std */
    KT_SYNTH_INIT_EMBED_CLASS, /* token_embd with --route-input: noise of std init_std mixed with the class direction */
    KT_SYNTH_INIT_ROUTER_CLASS, /* ffn_gate_inp with --route-input: noise plus per-class affinities (init.c) */
    KT_SYNTH_INIT_KV_A_CLASS,   /* attn_kv_a_mqa with --route-input: latent dims 1..3 read the class directions */
    KT_SYNTH_INIT_V_B_CLASS,    /* attn_v_b with --route-input: value dims 1..3 copy latent dims 1..3 */
    KT_SYNTH_INIT_OUT_CLASS,    /* attn_output with --route-input: value dims 1..3 write the class directions */
};

#define KT_SYNTH_NORM_NOISE_STD 0.02f
#define KT_SYNTH_BIAS_NOISE_STD 0.002f

/* Fills out[0 .. ne0-1] with row `row` (rows counted over ne1*ne2) of
 * plan->tensors[tensor_index]. */
void kt_synth_init_row(const struct kt_synth_plan *plan, uint32_t tensor_index, uint64_t row, float *out);

/* rank_of_expert[e] in 1..n_expert: a seeded permutation per layer; rank 1 is
 * the most preferred expert. */
void kt_synth_rank_experts(uint64_t seed, uint32_t layer, uint32_t n_expert, uint32_t *rank_of_expert);

/* Fills plan->skew_bias[l * n_expert + r - 1], the exp_probs_b value before
 * noise of layer l's expert of rank r that makes top-k selection frequencies
 * for random hidden states follow min(1, c r^-plan->layer_skew[l]) (see
 * init.c).  Deterministic; all zero at skew 0 and for dense layers; layers
 * of equal skew get equal values. */
kt_status kt_synth_fit_skew(struct kt_synth_plan *plan, kt_err *err);

/* plan->layer_skew from cfg.skew, cfg.skew_max and the seed (route.h):
 * skew_max <= skew gives every MoE layer cfg.skew; above it the MoE layers
 * get skew + (skew_max - skew) * j / (M - 1), j = 0 .. M-1, in a seeded order. */
void kt_synth_layer_skews(struct kt_synth_plan *plan);

/* plan->class_dir: KT_SYNTH_CLASS_COUNT orthonormal n_embd-vectors, a pure
 * function of the seed (Gram-Schmidt of seeded normal vectors). */
void kt_synth_class_directions(struct kt_synth_plan *plan);

#endif
