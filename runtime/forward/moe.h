/*
 * moe.h - DeepSeek MoE routing: from one token's router logits to the experts
 * it uses and their weights (docs/deepseek2.md, MoE routing).
 *
 *     prob   = sigmoid(z) or softmax(z)                    (gating)
 *     sel    = prob + exp_probs_b                          (bias picks, never weighs)
 *     groups: score = sum of the 2 best sel of the group; keep the n_group_used
 *             best groups, sel = -inf elsewhere
 *     idx    = the k largest sel, descending (ties: lower expert id first)
 *     w_j    = prob[idx_j], / max(sum w, 6.103515625e-5) if norm, * scale
 *
 * Pure function of its inputs: no allocation, no state.
 */
#ifndef KT_MOE_H
#define KT_MOE_H

#include <stdbool.h>
#include <stdint.h>

#include "model.h"

struct kt_router {
    uint32_t n_expert;          /* Ne */
    uint32_t n_used;            /* k */
    uint32_t n_groups;          /* expert groups (1: no group limit); Ne % n_groups == 0 */
    uint32_t n_group_used;      /* groups kept */
    enum kt_gating gating;
    bool norm;                  /* expert_weights_norm */
    float scale;                /* expert_weights_scale (1: none) */
};

void kt_router_from_hparams(const struct kt_hparams *hp, struct kt_router *r);

/* Floats of scratch kt_moe_route needs. */
uint32_t kt_router_scratch_floats(const struct kt_router *r);

/* logits (n_expert), bias (n_expert) or NULL; experts (n_used) receive
 * expert ids in selection order and weights (n_used) their weights. */
void kt_moe_route(const struct kt_router *r, const float *logits, const float *bias, uint32_t *experts,
                  float *weights, float *scratch);

#endif
