/*
 * scheduler.h - continuous batching of generation jobs over one engine.
 *
 * One scheduler thread owns the engine (engine.h is single-threaded) and
 * loops: take new jobs off the queue, drop cancelled or timed-out ones,
 * admit waiting jobs while sequence slots are free (reusing cached prompt
 * prefixes, prefix_cache.h), build one batch — a token for every decoding
 * sequence first, then prefill chunks of the admitted prompts, oldest
 * first, up to the per-step token budget — step it, sample, detokenize,
 * match stop strings, and publish each job's new text.  Jobs join and leave
 * the batch between steps; a long prompt is prefilled a chunk per step so
 * running streams keep flowing.  A job that scores its prompt (echo with
 * logprobs, prompt_logprobs) asks for the logits of every prompt position,
 * as many a step as 64 MiB of logits hold, and never forks a cached prefix.
 *
 * Other threads (HTTP handlers) only touch a job through its mutex: they
 * read what was published and set `cancel`.  A job is reference counted:
 * the submitter's reference and the scheduler's, so either side may finish
 * first.
 *
 * KV memory on demand: the engine's pool (any size) is shared by every
 * sequence, which takes blocks as it grows.  Each step plans its batch
 * within the free blocks: decodes first, oldest job first; when one cannot
 * get its block, cached prefixes are evicted (least recently used first),
 * then the youngest running job is preempted: its blocks go back to the
 * pool, it keeps its sequence ids (so its place ahead of every queued job)
 * and its sampling state, and recomputes its KV from its tokens so far
 * (forking what the prefix cache or a sibling choice still holds) once its
 * whole context fits again.  Its stream just pauses: no token is repeated
 * or lost, and greedy or seeded output is what it would have been.  Prompt
 * chunks and recomputes never preempt; they go oldest first and stop at the
 * first that finds no room.  A sequence holds at most the whole pool (the
 * context is cut to it), and a job that cannot fit the pool even alone
 * fails with an error saying so.  max_running_seqs is a concurrency limit:
 * kt_sched_kv_blocks_needed is only the pool that never has to preempt.
 */
#ifndef KT_SCHEDULER_H
#define KT_SCHEDULER_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine.h"
#include "sampler.h"
#include "serve_metrics.h"
#include "serve_prompt.h"
#include "serve_text.h"
#include "status.h"
#include "tokenizer.h"

enum kt_finish {
    KT_FINISH_NONE = 0,  /* still running */
    KT_FINISH_STOP,      /* end-of-generation token, stop string, or forced output done */
    KT_FINISH_LENGTH,    /* max_tokens or the context */
    KT_FINISH_CANCELLED, /* the client went away, or shutdown */
    KT_FINISH_TIMEOUT,   /* the request's deadline passed */
    KT_FINISH_ERROR,     /* the engine or sampler failed: job->error says why */
};

const char *kt_finish_name(enum kt_finish f); /* "stop", "length", "cancelled", "timeout", "error" */

/* One choice's output as published so far (append-only). */
struct kt_job_choice {
    struct kt_buf text;          /* released text: complete UTF-8, no stop string in it */
    struct kt_logprobs *logprobs; /* [n_logprobs] when the job wants them */
    size_t n_logprobs, cap_logprobs;
    uint32_t n_tokens;           /* tokens generated (an end-of-generation token included) */
    enum kt_finish finish;
    int stop_index;              /* which prompt stop string matched; -1 none */
    int32_t stop_token;          /* the end-of-generation token that stopped it; -1 none */
};

/* One prompt position scored: the log-probability of the prompt's token
 * there given the tokens before it (the logits of the position before),
 * with the job's prompt_top alternatives. */
struct kt_prompt_logprob {
    struct kt_logprobs lp;
    uint32_t rank;               /* 1 + tokens more likely than it (ties count: vLLM's rank) */
};

struct kt_job {
    /* ---- set before kt_sched_submit, read-only afterwards ---- */
    struct kt_prompt prompt;
    struct kt_sampler_params sampling;
    bool seed_given;
    uint32_t n;                  /* choices */
    bool logprobs;
    uint32_t top_logprobs;
    bool ignore_eos;
    /* Prompt scoring (echo with logprobs, prompt_logprobs): every prompt
     * position's logits are computed - none come from the prefix cache,
     * which keeps no logits - and each position after the first scored. */
    bool score_prompt;
    uint32_t prompt_top;         /* alternatives per scored position */
    double timeout_s;            /* 0: none */
    double t_arrival;            /* monotonic seconds */

    /* ---- published by the scheduler, under mu ---- */
    pthread_mutex_t mu;
    pthread_cond_t cv;           /* broadcast whenever version changes */
    uint64_t version;
    struct kt_job_choice *choices; /* [n] */
    uint32_t n_cached;           /* prompt tokens whose KV came from the prefix cache */
    /* score_prompt: [prompt.n_ids]; positions 1 .. n_scored are published
     * (entries never change once published; [0] is unused: the first
     * token has nothing before it) */
    struct kt_prompt_logprob *prompt_lp;
    uint32_t n_scored;
    bool started;                /* admitted into the running batch */
    bool done;                   /* every choice finished */
    char error[1100];            /* KT_FINISH_ERROR: why */

    /* ---- set by any thread ---- */
    atomic_bool cancel;
    atomic_int refs;
};

/* A job for a prepared prompt (moved into the job: *prompt is left empty)
 * and the request's sampling parameters; one reference, the caller's. */
struct kt_job *kt_job_create(struct kt_prompt *prompt, const struct kt_api_request *r, double timeout_s);
void kt_job_release(struct kt_job *job);
/* Asks the scheduler to stop the job and free its sequences (next step). */
void kt_job_cancel(struct kt_job *job);

/* Waits until the job's version differs from *seen or timeout_ms passes;
 * updates *seen.  Returns true if something changed. */
bool kt_job_wait(struct kt_job *job, uint64_t *seen, int timeout_ms);

struct kt_sched_params {
    struct kt_engine *engine;          /* the caller's; only the scheduler thread steps it once started */
    const struct kt_tokenizer *tok;
    uint32_t max_running_seqs;         /* sequences stepping at once (n choices count n) */
    uint32_t max_waiting;              /* jobs queued beyond that: kt_sched_submit says full */
    uint32_t max_batch_tokens;         /* per-step token budget; 0: the engine's */
    uint32_t prefix_cache_entries;     /* 0: no prefix cache */
    struct kt_serve_metrics *metrics;  /* may be NULL */
    /* Called on the scheduler thread after every step that ran, while no step
     * runs: the one moment another part may read the engine's counters
     * (kt_engine_route_counts).  NULL: none. */
    void (*after_step)(void *ctx, const struct kt_engine *e);
    void *after_step_ctx;
    /* Called on the scheduler thread, with after_step_ctx, when kt_sched_poke
     * asked while no job runs or waits (work that waits for "between two
     * steps" is done at once on an idle server).  NULL: none. */
    void (*poked)(void *ctx);
};

/* Engine sequences the scheduler needs from the engine; KV blocks for
 * max_running_seqs sequences at n_ctx (a pool that never preempts). */
uint32_t kt_sched_engine_seqs(uint32_t max_running_seqs, uint32_t prefix_cache_entries);
uint32_t kt_sched_kv_blocks_needed(uint32_t max_running_seqs, uint32_t n_ctx, uint32_t block_tokens);

struct kt_sched;

/* Checks the engine fits the parameters and starts the thread. */
kt_status kt_sched_create(const struct kt_sched_params *p, struct kt_sched **out, kt_err *err);

enum kt_submit_result {
    KT_SUBMIT_OK,
    KT_SUBMIT_FULL,      /* max_waiting jobs already queued */
    KT_SUBMIT_TOO_LARGE, /* n exceeds max_running_seqs */
    KT_SUBMIT_STOPPING,  /* draining for shutdown */
};

/* Queues the job; on KT_SUBMIT_OK the scheduler holds its own reference. */
enum kt_submit_result kt_sched_submit(struct kt_sched *s, struct kt_job *job);
/* Queues n jobs (a completions request's prompts) in order, all or none:
 * KT_SUBMIT_FULL when the queue cannot take every one now. */
enum kt_submit_result kt_sched_submit_all(struct kt_sched *s, struct kt_job *const *jobs, size_t n);

/* Asks the scheduler thread to call p.poked once it is between two steps: after
 * the step it is making, or at once when idle (any thread). */
void kt_sched_poke(struct kt_sched *s);

/* Stops accepting jobs, lets running and queued ones finish for up to
 * grace_s seconds, cancels the rest, and returns when none is left. */
void kt_sched_drain(struct kt_sched *s, double grace_s);

/* Stops the thread (cancelling whatever is left) and frees the scheduler;
 * the engine stays the caller's. */
void kt_sched_destroy(struct kt_sched *s);

/* Monotonic clock in seconds, shared by the server's timestamps. */
double kt_monotonic_s(void);

#endif
