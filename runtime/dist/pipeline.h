/*
 * pipeline.h - one model over the ranks of an MPI job (docs: runtime/dist/README.md).
 *
 * Each rank's engine holds a contiguous range of layers (engine.h
 * layer_begin/layer_end; rank r the r-th range, in order).  Rank 0 also
 * holds the embedding and the output head, and everything that is not the
 * layers: tokenizer, scheduler, sampler, HTTP.  A step travels round a ring:
 *
 *   rank 0: embed, its layers ──► rank 1: its layers ──► ... ──► rank N-1: its layers
 *      ▲                                                                │
 *      └──────────── the residual stream (n_tokens, n_embd) ◄───────────┘
 *   rank 0: final norm + output head -> logits -> sampler
 *
 * Rank 0 keeps the head (not the last rank) because what comes back is then
 * n_embd floats a token instead of n_vocab (7168 vs 163840 for Kimi-K2),
 * and the sampler needs the logits on rank 0 anyway.
 *
 * kt_pipeline_create on rank 0 installs stage hooks into its engine
 * (engine.h), so kt_engine_step / kt_engine_seq_* there drive every rank:
 * sequence operations (add, remove, fork, truncate) go down the ring in
 * order with the steps, and each rank applies them to its own KV cache.
 * The other ranks call kt_pipeline_follow, which runs what arrives until
 * rank 0 destroys its pipeline.
 *
 * A decode batch (every sequence one token) of two or more tokens is split
 * into micro-batches (contiguous slices of the batch), sent one after the
 * other, so rank r works on slice k while rank r-1 works on slice k+1.
 * Every token's result is the one it has alone in the batch (engine.h), so
 * the split changes no token; prefill chunks go whole.
 *
 * Faults: rank 0 waits for each step's answer at most timeout_ms; a rank
 * that died or hangs makes the step fail (KT_ERR_IO, naming the rank), and
 * every later step and sequence operation fail at once
 * (kt_pipeline_broken): the caller fails its requests and ends the job
 * (kt_transport_abort).
 */
#ifndef KT_PIPELINE_H
#define KT_PIPELINE_H

#include <stdbool.h>
#include <stdint.h>

#include "engine.h"
#include "transport.h"

#define KT_PIPELINE_MAX_RANKS 16

struct kt_pipeline_params {
    uint32_t micro_batches;     /* slices of a decode batch; 0: the number of ranks; 1: never split */
    int64_t timeout_ms;         /* longest wait for a step's answer or a send; 0: 120000 */
    /* Called once, on the stepping thread, when the pipeline breaks (before
     * the failing call returns): kt-serve turns to 503 there.  NULL: none. */
    void (*on_broken)(void *ctx, const char *why);
    void *on_broken_ctx;
};

struct kt_pipeline_stats {
    int n_ranks;
    uint64_t steps;             /* steps rank 0 ran through the pipeline */
    uint64_t micro_batches;     /* messages they took (a whole step is one) */
    uint64_t step_ns;           /* rank 0's wall time inside those steps */
    uint64_t wait_ns;           /* ... of it waiting for answers */
    /* [rank] time each rank spent on its part of those steps (its layers;
     * rank 0 also the head), as the answers carried it back */
    uint64_t busy_ns[KT_PIPELINE_MAX_RANKS];
    uint64_t sent_bytes, received_bytes; /* this rank's */
};

struct kt_pipeline;

/* Rank r's layers of n_layer over n ranks: contiguous, in rank order, the
 * first n_layer % n ranks one more.  Needs 1 <= n <= n_layer. */
void kt_pipeline_split(uint32_t n_layer, int n_ranks, int rank, uint32_t *begin, uint32_t *end);

/* Every rank calls it with its engine once created: the ranks check each
 * other (ranges contiguous from 0 to n_layer in rank order, the same model
 * widths and batch size) before any step; rank 0 then has the hooks in.
 * A job of one process: a pipeline that changes nothing. */
kt_status kt_pipeline_create(struct kt_transport *t, struct kt_engine *e, const struct kt_pipeline_params *p,
                             struct kt_pipeline **out, kt_err *err);
/* Rank 0: tells the other ranks to stop (unless broken) and takes the hooks out. */
void kt_pipeline_destroy(struct kt_pipeline *p);

/* Ranks > 0: runs rank 0's steps and sequence operations on this rank's
 * engine until rank 0 stops (KT_OK), or one fails (then the job cannot go
 * on: the caller aborts it). */
kt_status kt_pipeline_follow(struct kt_pipeline *p, kt_err *err);

/* Rank 0: why the pipeline stopped working, or NULL while it works. */
const char *kt_pipeline_broken(const struct kt_pipeline *p);
void kt_pipeline_stats(const struct kt_pipeline *p, struct kt_pipeline_stats *out);
void kt_pipeline_stats_reset(struct kt_pipeline *p);
/* The share of the ranks' time in those steps that no rank worked: 1 - sum(busy) / (ranks x step time). */
double kt_pipeline_bubble(const struct kt_pipeline_stats *s);

#endif
