/*
 * profile.h - routing profile: how many tokens the router sent to each
 * expert of each layer, decode and prefill apart, the measurement placement
 * chooses hot experts by and the cost model turns into probabilities.
 *
 * File format (JSON), version 2 (written):
 *
 *     {"version": 2,
 *      "model": {"name": "Kimi-K2", "arch": "deepseek2", "n_layer": 61, "n_expert": 384,
 *                "n_expert_used": 8, "n_embd": 7168, "n_ff_exp": 2048,
 *                "fingerprint": "9f2c...16 hex digits"},
 *      "half_life_tokens": 0,                       (0: no decay)
 *      "tokens": {"decode": 5120, "prefill": 81234}, (tokens routed, decayed like the counts)
 *      "decode":  [[], [12, 0, 7, ...], ...],        (one row per layer: empty, or one count per expert)
 *      "prefill": [[], [...], ...]}
 *
 * Version 1 (still read): {"version": 1, "model": "name", "layers": [[...]]}:
 * its counts load as decode counts, its token totals as unknown (0) and its
 * identity as unknown (fingerprint 0), so it is checked by shape only.
 *
 * A row is empty for a layer without data (dense layers); every non-empty
 * row of both phases has the same length.  Counts are non-negative and finite
 * and may be fractional (decayed).
 */
#ifndef KT_PLACEMENT_PROFILE_H
#define KT_PLACEMENT_PROFILE_H

#include <stddef.h>
#include <stdint.h>

#include "model.h"
#include "status.h"

enum kt_profile_phase { KT_PROFILE_DECODE, KT_PROFILE_PREFILL, KT_PROFILE_PHASES };

/* Which model a profile was measured on (kt_model_identity, model.h). */
struct kt_profile {
    struct kt_model_identity model; /* fingerprint 0: unknown (version 1 files) */
    uint32_t n_layer;
    uint32_t n_expert;               /* 0 when every row is empty */
    double *counts[KT_PROFILE_PHASES]; /* (n_layer, n_expert) routed tokens; 0 in empty rows */
    double tokens[KT_PROFILE_PHASES];  /* tokens routed (each token once, not once per layer) */
    double half_life_tokens;         /* exponential decay of counts and tokens; 0: none */
};

/* Reads a profile file (at most 64 MiB), version 1 or 2.  KT_ERR_IO when it
 * cannot be read, KT_ERR_FORMAT "FILE: where: problem" when it is malformed
 * (NaN, negative or non-numeric counts, rows of different lengths, unknown
 * keys, a version other than 1 or 2). */
kt_status kt_profile_load(const char *path, struct kt_profile **out, kt_err *err);
kt_status kt_profile_parse(const char *text, size_t len, const char *name, struct kt_profile **out, kt_err *err);

/* An all-zero profile of the given shape; id may be NULL (unknown model). */
kt_status kt_profile_create(uint32_t n_layer, uint32_t n_expert, const struct kt_model_identity *id,
                            struct kt_profile **out, kt_err *err);

/* Writes p as JSON version 2, atomically (a temporary file in the same
 * folder, then rename): a failure leaves any earlier file as it was. */
kt_status kt_profile_save(const struct kt_profile *p, const char *path, kt_err *err);

/* The same JSON as a string (malloc'd, NUL-terminated), for GET /kt/profile. */
char *kt_profile_dump(const struct kt_profile *p);

/* KT_OK when p may be used with the model of identity id; else
 * KT_ERR_INVALID "NAME: a profile of MODEL (...), not of this model (...)"
 * naming what differs.  A version 1 profile is checked by shape only. */
kt_status kt_profile_check_model(const struct kt_profile *p, const struct kt_model_identity *id, const char *name,
                                 kt_err *err);

/* Adds n_tokens routed tokens of one phase and their (layer, expert) counts
 * ([n_layer * n_expert]), first decaying everything by 0.5^(n_tokens /
 * half_life_tokens) when p decays. */
void kt_profile_add(struct kt_profile *p, enum kt_profile_phase ph, const uint64_t *counts, uint64_t n_tokens);

/* Probability that one token of phase ph (KT_PROFILE_PHASES: both phases
 * together) is routed to expert x of layer il: count / tokens, so a layer's
 * probabilities sum to n_expert_used.  Without token totals (version 1) the
 * row is normalised to sum to k = the given n_expert_used.  0 for an empty row. */
double kt_profile_probability(const struct kt_profile *p, enum kt_profile_phase ph, uint32_t il, uint32_t x,
                              uint32_t n_expert_used);

/* Routed tokens of both phases for (il, x): what "hottest" means in configs. */
double kt_profile_count(const struct kt_profile *p, uint32_t il, uint32_t x);

void kt_profile_destroy(struct kt_profile *p);

#endif
