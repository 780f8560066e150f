/*
 * check.h - a correctness check users run on their own model and machine
 * (`kt-bench check`; later kt-serve's self-check at start-up): does this
 * placement compute what the model computes?
 *
 * Prompts run in lockstep through the caller's engine (the candidate: any
 * placement, device or not) and a reference engine over the same model
 * (kt_engine_params.reference: every weight read in place from the file's
 * GGUF rows by the CPU kernels - no second copy of the weights).  Both take
 * the same tokens, the prompt and then the reference's greedy choice at each
 * step (teacher forcing), so every position's logits are compared, also after
 * the two would have chosen differently.  A row's divergence is
 * max |candidate - reference| over max |reference| (infinite when either
 * holds a NaN or an infinity).  A prompt passes when its median row is
 * within median_tol and 9 rows in 10 are within p90_tol: 1e-2 and 3e-2 by
 * default, the bounds tests/test_hybrid_sim.c holds a GPU's BF16 paths to;
 * CPU placements are bit-exact to the reference, or within a last bit where
 * a packed format is not exact (kernels/cpu/packed.h).  A GPU also differs
 * where its weights are quantized: the CPU reference rounds activations to
 * 8 bits for its integer dot products, the GPU keeps them as floats (on
 * tiny random models that alone reaches about 1e-2): a CUDA candidate of
 * such a model is held to KT_CHECK_MEDIAN_TOL_GPU_Q / _P90_TOL_GPU_Q unless
 * the caller gives tolerances.
 *
 * At the first row over median_tol both engines' residual streams after each
 * layer (kt_engine_set_layer_hook) are compared the same way, which says
 * where the divergence starts.  The greedy tokens parting is reported too,
 * as information: random or near-tied logits part legitimately.
 *
 * It returns a report and never prints.  Memory besides the reference's KV
 * cache: each engine's logits for a prefill chunk of up to 64 tokens and the
 * reference's residual stream after every layer for that chunk.
 */
#ifndef KT_TOOL_CHECK_H
#define KT_TOOL_CHECK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine.h"
#include "model.h"
#include "status.h"
#include "tokenizer.h"

#define KT_CHECK_MEDIAN_TOL 1e-2
#define KT_CHECK_P90_TOL 3e-2
/* A GPU candidate of a model with integer-dot weights (see above): twice
 * the median and 9-in-10 the CPU reference's 8-bit activations alone give
 * on tiny q8_0 / q4_k weights (0.0104 / 0.0133, tests/cuda_emulated.c's
 * numerics, which reproduce the H200's to its figures) */
#define KT_CHECK_MEDIAN_TOL_GPU_Q 2e-2
#define KT_CHECK_P90_TOL_GPU_Q 5e-2
#define KT_CHECK_MAX_TOKENS 16      /* new tokens per prompt by default */
#define KT_CHECK_CHUNK_TOKENS 64    /* most prompt tokens per prefill step */

/* Built-in prompts covering prose, code and a non-Latin script (chat text of
 * one user message each, to render with the model's template). */
#define KT_CHECK_N_BUILTIN 3
struct kt_check_builtin {
    const char *label;          /* "prose", "code", "chinese" */
    const char *text;
};
extern const struct kt_check_builtin kt_check_builtin_prompts[KT_CHECK_N_BUILTIN];

struct kt_check_prompt {
    const int32_t *ids;         /* [n_ids] tokens, rendered and tokenized (tools/cli/prompts.h) */
    uint32_t n_ids;
};

struct kt_check_params {
    uint32_t max_tokens;        /* new tokens per prompt (the reference's choices); 0: KT_CHECK_MAX_TOKENS */
    uint32_t seq;               /* the candidate's sequence to use: free before, free again after */
    uint32_t n_threads;         /* the reference engine's; 0: as many as the candidate's */
    const struct kt_tokenizer *tok; /* its end-of-generation tokens end a prompt sooner; NULL: never */
    double median_tol, p90_tol; /* 0: KT_CHECK_MEDIAN_TOL, KT_CHECK_P90_TOL */
};

/* One compared position of a prompt. */
struct kt_check_row {
    uint32_t pos;               /* the token's position in its sequence */
    uint32_t step;              /* the step that computed it: the prompt's chunks, then one per decode token */
    bool generated;             /* its logits chose a new token: the prompt's last row and every decode row */
    double divergence;          /* max |candidate - reference| / max |reference| of the row's logits */
    int32_t ref_token, cand_token; /* each engine's greedy choice (first largest logit) */
};

struct kt_check_prompt_report {
    uint32_t n_prompt;          /* prompt tokens */
    uint32_t n_rows;            /* rows compared: every prompt position, then each decode step's */
    uint32_t n_steps;
    struct kt_check_row *rows;  /* [n_rows] */
    double median, p90, worst;  /* of the rows' divergences (p90: 9 rows in 10 are within it) */
    bool pass;                  /* median <= median_tol and p90 <= p90_tol */
    int32_t parted_row;         /* the first generated row whose greedy tokens differ; -1: none */
    /* The first row over median_tol (-1: none); at it, each layer's residual
     * stream divergence and where it starts: the first layer whose divergence
     * reaches a hundredth of the largest (and 1e-6), or n_layer when every
     * layer is within 1e-6 - the logits alone differ (output norm and head). */
    int32_t break_row;
    double *layer_divergence;   /* [n_layer] at break_row; NULL when break_row < 0 */
    int32_t break_layer;        /* -1 when break_row < 0 */
};

struct kt_check_report {
    double median_tol, p90_tol;
    uint32_t max_tokens, n_layer;
    size_t n_prompts;
    struct kt_check_prompt_report *prompts; /* [n_prompts], in the order given */
    bool pass;                  /* every prompt passed */
    uint64_t tokens;            /* tokens each engine stepped */
    uint64_t reference_ns, candidate_ns; /* each engine's time in its steps */
};

/* Runs the check of candidate (an engine created over m, with sequence
 * params->seq free and n_ctx for the longest prompt + max_tokens) on
 * prompts; the report is the caller's to free, also on error.  The
 * candidate's counters and routing counts include the check's steps
 * (kt_engine_stats_reset afterwards where that matters). */
kt_status kt_check_run(struct kt_model *m, struct kt_engine *candidate, const struct kt_check_prompt *prompts,
                       size_t n_prompts, const struct kt_check_params *params, struct kt_check_report *report,
                       kt_err *err);
void kt_check_report_free(struct kt_check_report *r);

/* Where prompt pr's divergence starts, in words: "layer 2", "every layer agrees
 * (within 1e-6): the output norm and head", or "no row is over 0.01". */
void kt_check_break_words(const struct kt_check_report *r, const struct kt_check_prompt_report *pr, char *out,
                          size_t size);

/* The divergence of cand from ref over n values (the measure above). */
double kt_check_divergence(const float *ref, const float *cand, size_t n);

#endif
