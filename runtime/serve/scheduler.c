/*
 * scheduler.c - continuous batching over one engine (see scheduler.h).
 *
 * The thread's loop, once per step:
 *   1. under the queue lock: drop queued jobs that were cancelled or timed
 *      out, pop the jobs that fit into free sequence slots
 *   2. admit them: fork the best cached prefix (or start empty), samplers
 *   3. finish running jobs that were cancelled or timed out
 *   4. plan the batch within the KV pool's free blocks (plan): one token per
 *      decoding sequence, oldest job first, evicting cached prefixes and
 *      then preempting the youngest job when one cannot get its block; then
 *      prefill chunks and recomputes of preempted jobs, oldest first, within
 *      the token budget and the free blocks; step
 *   5. per logits row: a scored prompt position publishes its logprobs; a
 *      finished prompt forks into its n choices (none with max_tokens 0); sample,
 *      detokenize, match stops, publish; finished choices give their
 *      sequence to the prefix cache
 * It never blocks on an HTTP thread: publishing is a short critical section
 * per job and step.
 */
#include "scheduler.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kv_cache.h"
#include "grammar.h"
#include "prefix_cache.h"

#define NO_SEQ UINT32_MAX

double kt_monotonic_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

const char *kt_finish_name(enum kt_finish f)
{
    switch (f) {
    case KT_FINISH_STOP: return "stop";
    case KT_FINISH_LENGTH: return "length";
    case KT_FINISH_CANCELLED: return "cancelled";
    case KT_FINISH_TIMEOUT: return "timeout";
    case KT_FINISH_ERROR: return "error";
    default: return "none";
    }
}

/* ---- jobs ----------------------------------------------------------------------------- */

/* The request's logit bias, which kt_job_create cannot keep a pointer to. */
static struct kt_logit_bias *job_bias_copy(const struct kt_api_request *r)
{
    if (!r->sampling.n_logit_bias)
        return NULL;
    struct kt_logit_bias *b = malloc(r->sampling.n_logit_bias * sizeof *b);
    if (b)
        memcpy(b, r->sampling.logit_bias, r->sampling.n_logit_bias * sizeof *b);
    return b;
}

struct kt_job *kt_job_create(struct kt_prompt *prompt, const struct kt_api_request *r, double timeout_s)
{
    struct kt_job *job = calloc(1, sizeof *job);
    if (!job)
        return NULL;
    job->choices = calloc(r->n ? r->n : 1, sizeof *job->choices);
    if (!job->choices) {
        free(job);
        return NULL;
    }
    job->sampling = r->sampling;
    job->sampling.logit_bias = job_bias_copy(r); /* the request's array dies with it */
    if (r->sampling.n_logit_bias && !job->sampling.logit_bias) {
        free(job->choices);
        free(job);
        return NULL;
    }
    const bool echo_scored = r->kind == KT_API_COMPLETION && r->echo && r->logprobs;
    job->score_prompt = echo_scored || r->prompt_logprobs;
    job->prompt_top = r->prompt_logprobs ? r->prompt_top_logprobs : 0;
    if (echo_scored && r->top_logprobs > job->prompt_top)
        job->prompt_top = r->top_logprobs;
    if (job->score_prompt && !(job->prompt_lp = calloc(prompt->n_ids ? prompt->n_ids : 1, sizeof *job->prompt_lp))) {
        free((void *)job->sampling.logit_bias);
        free(job->choices);
        free(job);
        return NULL;
    }
    job->prompt = *prompt;
    *prompt = (struct kt_prompt){0};
    job->seed_given = r->seed_given;
    job->n = r->n ? r->n : 1;
    job->logprobs = r->logprobs;
    job->top_logprobs = r->top_logprobs;
    job->ignore_eos = r->ignore_eos;
    job->timeout_s = timeout_s;
    job->t_arrival = kt_monotonic_s();
    for (uint32_t c = 0; c < job->n; c++)
        job->choices[c].stop_index = -1, job->choices[c].stop_token = -1;
    pthread_mutex_init(&job->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&job->cv, &ca);
    pthread_condattr_destroy(&ca);
    atomic_init(&job->cancel, false);
    atomic_init(&job->refs, 1);
    return job;
}

void kt_job_release(struct kt_job *job)
{
    if (!job || atomic_fetch_sub(&job->refs, 1) != 1)
        return;
    for (uint32_t c = 0; c < job->n; c++) {
        kt_buf_free(&job->choices[c].text);
        free(job->choices[c].logprobs);
    }
    free(job->prompt_lp);
    free(job->choices);
    free((void *)job->sampling.logit_bias);
    kt_prompt_free(&job->prompt);
    pthread_mutex_destroy(&job->mu);
    pthread_cond_destroy(&job->cv);
    free(job);
}

void kt_job_cancel(struct kt_job *job)
{
    atomic_store(&job->cancel, true);
}

bool kt_job_wait(struct kt_job *job, uint64_t *seen, int timeout_ms)
{
    pthread_mutex_lock(&job->mu);
    if (job->version == *seen && timeout_ms > 0) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        ts.tv_sec += timeout_ms / 1000;
        ts.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
        if (ts.tv_nsec >= 1000000000L)
            ts.tv_sec++, ts.tv_nsec -= 1000000000L;
        while (job->version == *seen && pthread_cond_timedwait(&job->cv, &job->mu, &ts) != ETIMEDOUT)
            ;
    }
    bool changed = job->version != *seen;
    *seen = job->version;
    pthread_mutex_unlock(&job->mu);
    return changed;
}

/* ---- the scheduler's own state -------------------------------------------------------------- */

struct choice {
    uint32_t seq;            /* engine sequence; NO_SEQ once given back */
    struct kt_sampler *sampler;
    struct kt_grammar_matcher *matcher; /* the job's grammar, where it has one */
    struct kt_detok detok;
    struct kt_stop stop;
    int32_t *fed;            /* generated tokens fed back to the engine: [n_fed] */
    size_t n_fed, cap_fed;
    int32_t next;            /* the token to feed next step */
    uint32_t n_generated;
    bool finished;
    /* preempted: the sequence id stays reserved but holds nothing in the engine; the KV is
     * recomputed from the choice's tokens (prompt, then fed[0 .. n_fed-1)) before next is fed */
    bool parked;
    double t_last_token;
};

struct run {
    struct kt_job *job;
    struct choice *ch;       /* [job->n] */
    uint32_t n_prefilled;    /* prompt tokens in ch[0].seq's KV */
    uint32_t chunk;          /* prompt tokens in this step's batch */
    bool in_step;            /* something of it is in this step's batch */
    bool decoding;           /* the prompt is done; choices sample */
    bool first_token_seen;
    uint32_t n_open;         /* choices not finished */
    double t_admitted, t_first_token; /* monotonic seconds, for the request histograms */
};

enum { ROW_PROMPT_DONE = -1, ROW_SCORE = -2 };

struct row {                 /* what one logits row of the step belongs to */
    struct run *run;
    int choice;              /* a choice sampling; ROW_PROMPT_DONE: the run's prompt just completed;
                                ROW_SCORE: prompt position pos, which scores the prompt token at pos + 1 */
    uint32_t pos;
};

struct kt_sched {
    struct kt_sched_params p;
    struct kt_engine *engine;
    const struct kt_tokenizer *tok;
    uint32_t n_vocab, n_ctx, block_tokens, budget;

    pthread_t thread;
    bool thread_started;
    pthread_mutex_t mu;      /* guards the queue and the flags below */
    pthread_cond_t wake;     /* the scheduler waits here when idle */
    pthread_cond_t idle;     /* drain waits here */
    struct kt_job **queue;   /* ring of max_waiting */
    size_t q_head, q_len;
    bool accepting, stop, cancel_all, poked;
    uint32_t n_runs_shared;  /* running jobs, as drain sees them */

    /* thread-owned from here on */
    struct run **runs;       /* [n_runs] admission order */
    uint32_t n_runs;
    uint32_t seqs_reserved;  /* slots taken by running jobs */
    uint32_t *free_ids;      /* [n_free] engine sequence ids */
    uint32_t n_free;
    struct kt_prefix_cache *pc;
    uint32_t *evicted;       /* [cache entries + 1] */
    struct kt_batch_token *batch;
    struct row *rows;
    /* this step's plan: per sequence in the batch, the positions it grows by, and the KV blocks
     * that takes at most (the sum of kt_kv_cache_grow_blocks) */
    uint32_t *item_seq, *item_new;  /* [n_items] */
    uint32_t n_items;
    uint64_t plan_blocks;
    uint32_t kv_blocks;      /* the pool's */
    float *logits;           /* (max_running_seqs + score_rows, n_vocab) */
    /* Rows for scored prompt positions per step (0 until the first job that
     * scores its prompt: only such jobs pay for the bigger logits buffer). */
    uint32_t score_rows;
    uint32_t score_left;     /* of them, what this step's plan has not given yet */
    float *scratch;          /* [n_vocab] one row for a choice of many */
    char *piece;             /* detokenizer output, detok_cap bytes */
    size_t detok_cap;
    uint64_t seed_state;     /* seeds for requests without one */
    struct kt_grammar_vocab *grammar_vocab; /* the tokenizer's, made for the first job with a grammar */
    uint32_t *mask;          /* [mask words] the token mask of the choice being sampled */
    uint32_t n_batch, n_rows; /* this step's tokens in batch, logits rows in rows */
};

uint32_t kt_sched_engine_seqs(uint32_t max_running_seqs, uint32_t prefix_cache_entries)
{
    return max_running_seqs + prefix_cache_entries;
}

uint32_t kt_sched_kv_blocks_needed(uint32_t max_running_seqs, uint32_t n_ctx, uint32_t block_tokens)
{
    return max_running_seqs * ((n_ctx + block_tokens - 1) / block_tokens);
}

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* ---- publishing (job->mu held) ---------------------------------------------------------------- */

static void publish(struct kt_job *job)
{
    job->version++;
    pthread_cond_broadcast(&job->cv);
}

/* How a job ended, all choices taken together (job->mu held, or the job is
 * done): the first that failed, else the first the server ended, else choice
 * 0's own end. */
static enum kt_finish job_outcome(const struct kt_job *job)
{
    for (uint32_t c = 0; c < job->n; c++)
        if (job->choices[c].finish == KT_FINISH_ERROR)
            return KT_FINISH_ERROR;
    for (uint32_t c = 0; c < job->n; c++)
        if (job->choices[c].finish == KT_FINISH_CANCELLED || job->choices[c].finish == KT_FINISH_TIMEOUT)
            return job->choices[c].finish;
    return job->choices[0].finish;
}

/* Counts a finished job by its outcome.  The request histograms (queue time,
 * TTFT, end-to-end latency, prompt and generation tokens) take one
 * observation each of every job that completed (stop or length), all at its
 * end, so their counts agree; an aborted or failed job is in
 * request_success only.  run: NULL for a job that never ran. */
static void metrics_finish(struct kt_sched *s, const struct kt_job *job, const struct run *run, enum kt_finish f,
                           uint32_t n_generated)
{
    struct kt_serve_metrics *m = s->p.metrics;
    if (!m)
        return;
    int r = f == KT_FINISH_STOP ? KT_METRIC_STOP : f == KT_FINISH_LENGTH ? KT_METRIC_LENGTH
            : f == KT_FINISH_ERROR ? KT_METRIC_ERROR : KT_METRIC_ABORT;
    pthread_mutex_lock(&m->mu);
    m->request_success[r]++;
    if (run && run->first_token_seen && (f == KT_FINISH_STOP || f == KT_FINISH_LENGTH)) {
        kt_histogram_observe(&m->queue_time, run->t_admitted - job->t_arrival);
        kt_histogram_observe(&m->ttft, run->t_first_token - job->t_arrival);
        kt_histogram_observe(&m->e2e, kt_monotonic_s() - job->t_arrival);
        kt_histogram_observe(&m->prompt_len, (double)job->prompt.n_ids);
        kt_histogram_observe(&m->generation_len, (double)n_generated);
    }
    pthread_mutex_unlock(&m->mu);
}

/* A job that never ran: every choice ends with f. */
static void finish_unstarted(struct kt_sched *s, struct kt_job *job, enum kt_finish f, const char *why)
{
    pthread_mutex_lock(&job->mu);
    for (uint32_t c = 0; c < job->n; c++)
        job->choices[c].finish = f;
    if (why)
        snprintf(job->error, sizeof job->error, "%s", why);
    job->done = true;
    publish(job);
    pthread_mutex_unlock(&job->mu);
    metrics_finish(s, job, NULL, f, 0);
    kt_job_release(job);
}

/* ---- sequences ------------------------------------------------------------------------------- */

static void give_back_seq(struct kt_sched *s, uint32_t seq)
{
    kt_engine_seq_remove(s->engine, seq, NULL);
    s->free_ids[s->n_free++] = seq;
}

/* Offers a finished choice's sequence (KV of prompt + fed tokens) to the prefix cache. */
static void retire_seq(struct kt_sched *s, struct run *run, struct choice *ch, uint32_t n_prompt_in_kv)
{
    if (ch->seq == NO_SEQ)
        return;
    uint32_t seq = ch->seq;
    ch->seq = NO_SEQ;
    if (!s->pc || n_prompt_in_kv == 0) {
        give_back_seq(s, seq);
        return;
    }
    size_t n = n_prompt_in_kv + (n_prompt_in_kv == run->job->prompt.n_ids ? ch->n_fed : 0);
    int32_t *tokens = malloc(n * sizeof *tokens);
    if (!tokens || n != kt_engine_seq_length(s->engine, seq)) {
        free(tokens);
        give_back_seq(s, seq);
        return;
    }
    memcpy(tokens, run->job->prompt.ids, n_prompt_in_kv * sizeof *tokens);
    if (n > n_prompt_in_kv)
        memcpy(tokens + n_prompt_in_kv, ch->fed, ch->n_fed * sizeof *tokens);
    size_t n_evicted = 0;
    kt_prefix_cache_insert(s->pc, seq, tokens, n, s->evicted, &n_evicted, NULL);
    free(tokens);
    for (size_t i = 0; i < n_evicted; i++)
        give_back_seq(s, s->evicted[i]);
}

/* ---- running jobs ---------------------------------------------------------------------------- */

static void run_free(struct run *run)
{
    if (!run)
        return;
    if (run->ch)
        for (uint32_t c = 0; c < run->job->n; c++) {
            kt_sampler_destroy(run->ch[c].sampler);
            kt_grammar_matcher_destroy(run->ch[c].matcher);
            kt_stop_free(&run->ch[c].stop);
            free(run->ch[c].fed);
        }
    free(run->ch);
    free(run);
}

/* Ends choice c with f (job->mu held): the detokenizer's and stop matcher's
 * held-back text is released unless a stop string ended it. */
static void end_choice_locked(struct kt_sched *s, struct run *run, uint32_t c, enum kt_finish f)
{
    struct choice *ch = &run->ch[c];
    struct kt_job_choice *jc = &run->job->choices[c];
    if (ch->finished)
        return;
    if (ch->stop.matched < 0) {
        char tail[8];
        size_t n = kt_detok_flush(&ch->detok, tail);
        if (kt_stop_push(&ch->stop, tail, n, &jc->text))
            jc->stop_index = ch->stop.matched;
        kt_stop_flush(&ch->stop, &jc->text);
    }
    jc->finish = f;
    ch->finished = true;
    run->n_open--;
    (void)s;
}

/* After choices finished: give their sequences back; a run with none open leaves. */
static void settle_run(struct kt_sched *s, uint32_t index)
{
    struct run *run = s->runs[index];
    struct kt_job *job = run->job;
    for (uint32_t c = 0; c < job->n; c++) {
        struct choice *ch = &run->ch[c];
        if (!ch->finished || ch->seq == NO_SEQ)
            continue;
        if ((c > 0 && !run->decoding) || ch->parked) { /* never forked, or preempted: only the id is held */
            s->free_ids[s->n_free++] = ch->seq;
            ch->seq = NO_SEQ;
            ch->parked = false;
        } else {
            retire_seq(s, run, ch, run->decoding ? (uint32_t)job->prompt.n_ids : run->n_prefilled);
        }
    }
    if (run->n_open > 0)
        return;
    pthread_mutex_lock(&job->mu);
    job->done = true;
    publish(job);
    enum kt_finish f = job_outcome(job);
    uint32_t generated = 0;
    for (uint32_t c = 0; c < job->n; c++)
        generated += job->choices[c].n_tokens;
    pthread_mutex_unlock(&job->mu);
    metrics_finish(s, job, run, f, generated);
    s->seqs_reserved -= job->n;
    memmove(s->runs + index, s->runs + index + 1, (s->n_runs - index - 1) * sizeof *s->runs);
    s->n_runs--;
    pthread_mutex_lock(&s->mu);
    s->n_runs_shared = s->n_runs;
    if (s->n_runs == 0 && s->q_len == 0)
        pthread_cond_broadcast(&s->idle);
    pthread_mutex_unlock(&s->mu);
    run_free(run);
    kt_job_release(job);
}

static void end_run(struct kt_sched *s, uint32_t index, enum kt_finish f, const char *why)
{
    struct run *run = s->runs[index];
    pthread_mutex_lock(&run->job->mu);
    for (uint32_t c = 0; c < run->job->n; c++)
        end_choice_locked(s, run, c, f);
    if (why)
        snprintf(run->job->error, sizeof run->job->error, "%s", why);
    publish(run->job);
    pthread_mutex_unlock(&run->job->mu);
    settle_run(s, index);
}

static bool timed_out(const struct kt_job *job, double now)
{
    return job->timeout_s > 0 && now - job->t_arrival > job->timeout_s;
}

/* The vocabulary's trie and a mask buffer, made once, on the scheduler thread. */
static kt_status grammar_ready(struct kt_sched *s, kt_err *err)
{
    if (s->grammar_vocab)
        return KT_OK;
    kt_status st = kt_grammar_vocab_from_tokenizer(s->tok, s->n_vocab, &s->grammar_vocab, err);
    if (st != KT_OK)
        return st;
    s->mask = malloc(kt_grammar_vocab_mask_words(s->grammar_vocab) * sizeof *s->mask);
    if (!s->mask) {
        kt_grammar_vocab_destroy(s->grammar_vocab);
        s->grammar_vocab = NULL;
        return kt_err_set(err, KT_ERR_NOMEM, "out of memory for a token mask");
    }
    return KT_OK;
}

/* The logits buffer grown, once, by the rows a step gives scored prompt
 * positions: as many as 64 MiB hold (at most the step's budget, at least one). */
#define SCORE_LOGITS_BYTES ((size_t)64 << 20)
static kt_status score_ready(struct kt_sched *s, kt_err *err)
{
    if (s->score_rows)
        return KT_OK;
    const size_t row_bytes = (size_t)s->n_vocab * sizeof *s->logits;
    size_t rows = SCORE_LOGITS_BYTES / row_bytes;
    rows = rows < 1 ? 1 : rows > s->budget ? s->budget : rows;
    float *grown = realloc(s->logits, ((size_t)s->p.max_running_seqs + rows) * row_bytes);
    if (!grown)
        return kt_err_set(err, KT_ERR_NOMEM, "out of memory for the logits of scored prompt positions");
    s->logits = grown;
    s->score_rows = (uint32_t)rows;
    return KT_OK;
}

/* seq enters the engine holding the first `match` positions of src's KV
 * (forked copy-on-write, then cut back), or empty when src < 0 or match is 0. */
static kt_status seq_start(struct kt_sched *s, uint32_t seq, int64_t src, size_t match, kt_err *err)
{
    if (src < 0 || match == 0)
        return kt_engine_seq_add(s->engine, seq, err);
    kt_status st = kt_engine_seq_fork(s->engine, (uint32_t)src, seq, err);
    if (st == KT_OK && (st = kt_engine_seq_truncate(s->engine, seq, (uint32_t)match, err)) != KT_OK)
        kt_engine_seq_remove(s->engine, seq, NULL);
    return st;
}

/* Moves a queued job into the running set. */
static void admit(struct kt_sched *s, struct kt_job *job)
{
    kt_err err = {0};
    struct run *run = calloc(1, sizeof *run);
    if (run)
        run->ch = calloc(job->n, sizeof *run->ch);
    if (!run || !run->ch) {
        free(run);
        finish_unstarted(s, job, KT_FINISH_ERROR, "out of memory");
        return;
    }
    run->job = job;
    run->n_open = job->n;
    for (uint32_t c = 0; c < job->n; c++) /* ids first: an error below hands them all back */
        run->ch[c].seq = s->free_ids[--s->n_free];
    for (uint32_t c = 0; c < job->n; c++) {
        struct choice *ch = &run->ch[c];
        ch->detok = (struct kt_detok)KT_DETOK_INIT;
        kt_stop_init(&ch->stop, (const char *const *)job->prompt.stops, job->prompt.n_stops);
        struct kt_sampler_params sp = job->sampling;
        sp.seed = job->seed_given ? job->sampling.seed + c : splitmix64(&s->seed_state);
        if (kt_sampler_create(&sp, s->n_vocab, job->prompt.ids, job->prompt.n_ids, &ch->sampler, &err) != KT_OK)
            break;
        if (job->prompt.grammar && job->prompt.n_forced == 0 &&
            (grammar_ready(s, &err) != KT_OK ||
             kt_grammar_matcher_create(job->prompt.grammar, s->grammar_vocab, &ch->matcher, &err) != KT_OK))
            break;
    }
    if (err.status == KT_OK && job->score_prompt)
        score_ready(s, &err);
    s->seqs_reserved += job->n;
    s->runs[s->n_runs++] = run;
    pthread_mutex_lock(&s->mu);
    s->n_runs_shared = s->n_runs;
    pthread_mutex_unlock(&s->mu);
    if (err.status != KT_OK) {
        for (uint32_t c = 0; c < job->n; c++) { /* nothing was added to the engine yet */
            s->free_ids[s->n_free++] = run->ch[c].seq;
            run->ch[c].seq = NO_SEQ;
        }
        end_run(s, s->n_runs - 1, KT_FINISH_ERROR, err.msg);
        return;
    }

    /* the longest cached prefix, leaving at least one prompt token to compute logits from; a
     * prompt to score computes every position's (the cache keeps KV, not logits) */
    size_t match = 0;
    int64_t cached = s->pc && !job->score_prompt ? kt_prefix_cache_lookup(s->pc, job->prompt.ids, job->prompt.n_ids,
                                                                          job->prompt.n_ids - 1, &match)
                                                 : -1;
    uint32_t seq0 = run->ch[0].seq;
    kt_status st = seq_start(s, seq0, cached, match, &err);
    if (cached < 0)
        match = 0;
    if (st != KT_OK) {
        s->free_ids[s->n_free++] = seq0;
        run->ch[0].seq = NO_SEQ;
        end_run(s, s->n_runs - 1, KT_FINISH_ERROR, err.msg);
        return;
    }
    run->n_prefilled = (uint32_t)match;
    run->t_admitted = kt_monotonic_s();
    pthread_mutex_lock(&job->mu);
    job->started = true;
    job->n_cached = (uint32_t)match;
    publish(job);
    pthread_mutex_unlock(&job->mu);
    if (s->p.metrics) {
        pthread_mutex_lock(&s->p.metrics->mu);
        s->p.metrics->prefix_cache_queries += job->prompt.n_ids;
        s->p.metrics->prefix_cache_hits += match;
        s->p.metrics->prompt_tokens += job->prompt.n_ids;
        pthread_mutex_unlock(&s->p.metrics->mu);
    }
}

/* ---- sampling and publishing one token ----------------------------------------------------------- */

/* Counts a token, and the gap since its choice's last one (every gap of every
 * job, whatever its end: inter-token latency describes tokens, not requests). */
static void observe_token(struct kt_sched *s, struct choice *ch, double now)
{
    struct kt_serve_metrics *m = s->p.metrics;
    if (!m)
        return;
    pthread_mutex_lock(&m->mu);
    m->generation_tokens++;
    if (ch->n_generated > 1)
        kt_histogram_observe(&m->itl, now - ch->t_last_token);
    pthread_mutex_unlock(&m->mu);
}

/* Samples choice c from logits (overwritten) and publishes the token's text. */
static void sample_choice(struct kt_sched *s, struct run *run, uint32_t c, float *logits)
{
    struct kt_job *job = run->job;
    struct choice *ch = &run->ch[c];
    struct kt_job_choice *jc = &job->choices[c];
    kt_err err = {0};
    int32_t token;
    struct kt_logprobs lp;
    kt_status st = KT_OK;
    bool forced = job->prompt.n_forced > 0;
    if (forced) {
        token = job->prompt.forced[ch->n_generated < job->prompt.n_forced ? ch->n_generated : 0];
        st = kt_sampler_accept(ch->sampler, token, &err);
        if (st == KT_OK && job->logprobs)
            st = kt_logprobs_compute(logits, s->n_vocab, token, job->top_logprobs, &lp, &err);
    } else {
        if (ch->matcher && kt_grammar_matcher_fill_mask(ch->matcher, s->mask) == 0)
            st = kt_err_set(&err, KT_ERR_INVALID, "structured output: no token of the vocabulary can continue it");
        if (st == KT_OK) {
            kt_sampler_set_allowed(ch->sampler, ch->matcher ? s->mask : NULL);
            st = kt_sampler_sample_logprobs(ch->sampler, logits, job->top_logprobs, &token,
                                            job->logprobs ? &lp : NULL, &err);
            kt_sampler_set_allowed(ch->sampler, NULL);
        }
        if (st == KT_OK && ch->matcher)
            st = kt_grammar_matcher_accept_token(ch->matcher, token, &err);
    }
    double now = kt_monotonic_s();
    if (st != KT_OK) {
        pthread_mutex_lock(&job->mu);
        snprintf(job->error, sizeof job->error, "sampling: %s", err.msg);
        end_choice_locked(s, run, c, KT_FINISH_ERROR);
        publish(job);
        pthread_mutex_unlock(&job->mu);
        return;
    }
    ch->n_generated++;
    observe_token(s, ch, now);
    if (!run->first_token_seen)
        run->t_first_token = now;
    run->first_token_seen = true;
    ch->t_last_token = now;

    enum kt_finish f = KT_FINISH_NONE;
    pthread_mutex_lock(&job->mu);
    jc->n_tokens++;
    if (!job->ignore_eos && kt_token_is_eog(s->tok, token)) {
        jc->stop_token = token;
        f = KT_FINISH_STOP;
    } else {
        if (job->logprobs) {
            if (jc->n_logprobs == jc->cap_logprobs) {
                size_t cap = jc->cap_logprobs ? 2 * jc->cap_logprobs : 16;
                struct kt_logprobs *grown = realloc(jc->logprobs, cap * sizeof *grown);
                if (grown)
                    jc->logprobs = grown, jc->cap_logprobs = cap;
            }
            if (jc->n_logprobs < jc->cap_logprobs)
                jc->logprobs[jc->n_logprobs++] = lp;
        }
        size_t written = 0;
        kt_detok_push(s->tok, &ch->detok, token, job->prompt.special, s->piece, s->detok_cap, &written, NULL);
        if (kt_stop_push(&ch->stop, s->piece, written, &jc->text)) {
            jc->stop_index = ch->stop.matched;
            f = KT_FINISH_STOP;
        } else if (ch->matcher && kt_grammar_matcher_closed(ch->matcher)) {
            f = KT_FINISH_STOP; /* the grammar's sentence is whole and nothing may follow */
        } else if (ch->n_generated >= job->prompt.max_tokens) {
            f = KT_FINISH_LENGTH;
        } else if (forced && ch->n_generated >= job->prompt.n_forced) {
            f = KT_FINISH_STOP;
        } else if (kt_engine_seq_length(s->engine, ch->seq) + 1 > s->n_ctx) {
            f = KT_FINISH_LENGTH;
        }
    }
    if (f != KT_FINISH_NONE)
        end_choice_locked(s, run, c, f);
    publish(job);
    pthread_mutex_unlock(&job->mu);
    if (f != KT_FINISH_NONE)
        return;
    if (ch->n_fed == ch->cap_fed) {
        size_t cap = ch->cap_fed ? 2 * ch->cap_fed : 64;
        int32_t *grown = realloc(ch->fed, cap * sizeof *grown);
        if (!grown) {
            pthread_mutex_lock(&job->mu);
            snprintf(job->error, sizeof job->error, "out of memory");
            end_choice_locked(s, run, c, KT_FINISH_ERROR);
            publish(job);
            pthread_mutex_unlock(&job->mu);
            return;
        }
        ch->fed = grown, ch->cap_fed = cap;
    }
    ch->fed[ch->n_fed++] = token;
    ch->next = token;
}

/* Scores prompt position pos (>= 1) of run from row, the logits of position
 * pos - 1, and publishes it; a failure ends the run's choices. */
static void score_position(struct kt_sched *s, struct run *run, uint32_t pos, const float *row)
{
    struct kt_job *job = run->job;
    if (run->n_open == 0) /* an earlier row of this step failed */
        return;
    struct kt_prompt_logprob *out = &job->prompt_lp[pos]; /* unpublished: the readers stop at n_scored */
    const int32_t token = job->prompt.ids[pos];
    kt_err err = {0};
    kt_status st = kt_logprobs_compute(row, s->n_vocab, token, job->prompt_top, &out->lp, &err);
    if (st == KT_OK) {
        uint32_t rank = 0;
        for (uint32_t v = 0; v < s->n_vocab; v++)
            rank += row[v] >= row[token];
        out->rank = rank;
    }
    pthread_mutex_lock(&job->mu);
    if (st == KT_OK) {
        job->n_scored = pos;
    } else {
        snprintf(job->error, sizeof job->error, "scoring the prompt: %s", err.msg);
        for (uint32_t c = 0; c < job->n; c++)
            end_choice_locked(s, run, c, KT_FINISH_ERROR);
    }
    publish(job);
    pthread_mutex_unlock(&job->mu);
}

/* The prompt of run is in ch[0]'s KV and row holds its last position's logits:
 * fork the other choices and sample every one; with max_tokens 0 (a prompt
 * only scored) every choice ends at once, "length". */
static void start_decoding(struct kt_sched *s, struct run *run, float *row)
{
    struct kt_job *job = run->job;
    if (run->n_open == 0) /* scoring failed */
        return;
    if (job->prompt.max_tokens == 0) {
        pthread_mutex_lock(&job->mu);
        for (uint32_t c = 0; c < job->n; c++)
            end_choice_locked(s, run, c, KT_FINISH_LENGTH);
        publish(job);
        pthread_mutex_unlock(&job->mu);
        return;
    }
    run->decoding = true;
    for (uint32_t c = 1; c < job->n; c++) {
        kt_err err = {0};
        if (kt_engine_seq_fork(s->engine, run->ch[0].seq, run->ch[c].seq, &err) != KT_OK) {
            s->free_ids[s->n_free++] = run->ch[c].seq;
            run->ch[c].seq = NO_SEQ;
            pthread_mutex_lock(&job->mu);
            snprintf(job->error, sizeof job->error, "%s", err.msg);
            end_choice_locked(s, run, c, KT_FINISH_ERROR);
            publish(job);
            pthread_mutex_unlock(&job->mu);
        }
    }
    for (uint32_t c = 0; c < job->n; c++) {
        if (run->ch[c].finished)
            continue;
        float *logits = row;
        if (job->n > 1) {
            memcpy(s->scratch, row, s->n_vocab * sizeof *row);
            logits = s->scratch;
        }
        sample_choice(s, run, c, logits);
    }
}

/* ---- one step: what it runs, within the KV pool ------------------------------------------------ */

static uint32_t blocks_for(uint64_t len, uint32_t bt)
{
    return (uint32_t)((len + bt - 1) / bt);
}

/* The token at position pos of ch's context: the prompt, then what the choice generated. */
static int32_t context_token(const struct run *run, const struct choice *ch, uint32_t pos)
{
    const struct kt_prompt *pr = &run->job->prompt;
    return pos < pr->n_ids ? pr->ids[pos] : ch->fed[pos - pr->n_ids];
}

/* Where a decoding choice's ch->next goes: its KV holds the prompt and every fed token but that last one. */
static uint32_t next_pos(const struct run *run, const struct choice *ch)
{
    return (uint32_t)(run->job->prompt.n_ids + ch->n_fed - 1);
}

static bool live(const struct choice *ch)
{
    return !ch->finished && ch->seq != NO_SEQ;
}

static uint32_t kv_free_blocks(const struct kt_sched *s)
{
    struct kt_kv_cache_stats ks;
    kt_kv_cache_stats(kt_engine_kv_cache(s->engine), &ks);
    return ks.blocks_free;
}

static uint32_t grow_blocks(const struct kt_sched *s, uint32_t seq, uint32_t n)
{
    return kt_kv_cache_grow_blocks(kt_engine_kv_cache(s->engine), seq, n);
}

/* The plan's blocks again: an eviction or a preemption unshares blocks, so its sequences may need fewer. */
static void plan_recount(struct kt_sched *s)
{
    s->plan_blocks = 0;
    for (uint32_t i = 0; i < s->n_items; i++)
        s->plan_blocks += grow_blocks(s, s->item_seq[i], s->item_new[i]);
}

/* Whether `blocks` more fit beside the plan, once cached prefixes are evicted (least recently used first) until
 * they do. */
static bool room_for(struct kt_sched *s, uint64_t blocks)
{
    for (;;) {
        if (s->plan_blocks + blocks <= kv_free_blocks(s))
            return true;
        uint32_t seq;
        if (!s->pc || !kt_prefix_cache_evict_lru(s->pc, &seq))
            return false;
        give_back_seq(s, seq);
        plan_recount(s);
    }
}

/* The most of k positions seq may grow by beside the plan (grow_blocks rises with k). */
static uint32_t fitting(struct kt_sched *s, uint32_t seq, uint32_t k)
{
    if (k == 0 || room_for(s, grow_blocks(s, seq, k)))
        return k;
    const uint64_t free_blocks = kv_free_blocks(s);
    uint32_t lo = 0, hi = k; /* lo fits, hi does not */
    while (hi - lo > 1) {
        const uint32_t mid = lo + (hi - lo) / 2;
        if (s->plan_blocks + grow_blocks(s, seq, mid) <= free_blocks)
            lo = mid;
        else
            hi = mid;
    }
    return lo;
}

/* Puts positions [from, from + k) of ch's context into the batch for seq; the one at logits_at, if among them,
 * wants logits for row `choice` (-1: the run's prompt is then complete). */
static void plan_add(struct kt_sched *s, struct run *run, const struct choice *ch, uint32_t seq, uint32_t from,
                     uint32_t k, uint32_t logits_at, int choice)
{
    /* a prompt to score: every position before the last one not scored yet (a recompute after a
     * preemption scores nothing twice) gives a row too, in batch order, as the logits come */
    const bool scoring = choice == ROW_PROMPT_DONE && run->job->score_prompt;
    for (uint32_t pos = from; pos < from + k; pos++) {
        const bool score = scoring && pos < logits_at && pos + 1 > run->job->n_scored;
        const bool want = pos == logits_at || score;
        s->batch[s->n_batch++] = (struct kt_batch_token){.token = context_token(run, ch, pos), .seq = seq,
                                                         .pos = pos, .want_logits = want};
        if (want)
            s->rows[s->n_rows++] = (struct row){run, score ? ROW_SCORE : choice, pos};
    }
    s->plan_blocks += grow_blocks(s, seq, k);
    s->item_seq[s->n_items] = seq;
    s->item_new[s->n_items++] = k;
    run->in_step = true;
}

/* Whether run holds KV blocks (that preempting it could give back). */
static bool holds_kv(const struct kt_sched *s, const struct run *run)
{
    for (uint32_t c = 0; c < run->job->n; c++)
        if (live(&run->ch[c]) && !run->ch[c].parked && kt_engine_seq_length(s->engine, run->ch[c].seq) > 0)
            return true;
    return false;
}

/* The youngest run at index >= first holding KV blocks, other than `except`; -1 if none. */
static int64_t youngest_holder(const struct kt_sched *s, uint32_t first, int64_t except)
{
    for (uint32_t r = s->n_runs; r-- > first;)
        if ((int64_t)r != except && holds_kv(s, s->runs[r]))
            return r;
    return -1;
}

/* Preempts run: its sequences leave the engine, their blocks back in the pool.  Their ids stay reserved, so the
 * run keeps its place ahead of every queued job; samplers, detokenizers, stop and grammar matchers stay as they
 * are, and the KV is recomputed from the tokens once blocks are free again (resume_choice), so what the client
 * receives goes on exactly where it was. */
static void preempt(struct kt_sched *s, struct run *run)
{
    for (uint32_t c = 0; c < run->job->n; c++) {
        struct choice *ch = &run->ch[c];
        if (!live(ch) || ch->parked || (c > 0 && !run->decoding)) /* those ids were never in the engine */
            continue;
        kt_engine_seq_remove(s->engine, ch->seq, NULL);
        ch->parked = true;
    }
    if (!run->decoding)
        run->n_prefilled = 0;
    plan_recount(s);
    if (s->p.metrics) {
        pthread_mutex_lock(&s->p.metrics->mu);
        s->p.metrics->preemptions++;
        pthread_mutex_unlock(&s->p.metrics->mu);
    }
}

/* Blocks a preempted run needs free before it resumes: its whole context again, the prompt's full blocks shared
 * by its choices as they were before (resuming only to be preempted again would waste the recompute). */
static uint64_t resume_blocks(const struct kt_sched *s, const struct run *run)
{
    const uint32_t bt = s->block_tokens, n_ids = (uint32_t)run->job->prompt.n_ids;
    if (!run->decoding)
        return blocks_for(n_ids, bt);
    uint64_t need = 0;
    bool first = true;
    for (uint32_t c = 0; c < run->job->n; c++) {
        const struct choice *ch = &run->ch[c];
        if (!live(ch) || !ch->parked)
            continue;
        need += blocks_for((uint64_t)next_pos(run, ch) + 1, bt) - (first ? 0 : n_ids / bt);
        first = false;
    }
    return need;
}

/* A preempted choice back in the engine, holding the longest prefix of its context that the prefix cache or a
 * sibling choice still holds; the rest is recomputed. */
static kt_status resume_choice(struct kt_sched *s, struct run *run, uint32_t c, kt_err *err)
{
    struct choice *ch = &run->ch[c];
    const struct kt_prompt *pr = &run->job->prompt;
    size_t match = 0;
    int64_t src = -1;
    if (!run->decoding) { /* as at admission: one prompt token left to compute the first logits from; */
        /* a prompt to score computes every position it has not scored (the cache keeps no logits) */
        src = s->pc && !run->job->score_prompt ? kt_prefix_cache_lookup(s->pc, pr->ids, pr->n_ids, pr->n_ids - 1, &match)
                                               : -1;
    } else {
        const uint32_t want = next_pos(run, ch);
        int32_t *ctx = malloc(want * sizeof *ctx);
        if (!ctx)
            return kt_err_set(err, KT_ERR_NOMEM, "out of memory");
        for (uint32_t p = 0; p < want; p++)
            ctx[p] = context_token(run, ch, p);
        src = s->pc ? kt_prefix_cache_lookup(s->pc, ctx, want, want, &match) : -1;
        if (src < 0)
            match = 0;
        for (uint32_t d = 0; d < run->job->n; d++) {
            const struct choice *sib = &run->ch[d];
            if (d == c || !live(sib) || sib->parked)
                continue;
            const uint32_t len = kt_engine_seq_length(s->engine, sib->seq);
            uint32_t m = 0;
            while (m < len && m < want && context_token(run, sib, m) == ctx[m])
                m++;
            if (m > match)
                match = m, src = sib->seq;
        }
        free(ctx);
    }
    if (src < 0)
        match = 0;
    kt_status st = seq_start(s, ch->seq, src, match, err);
    if (st != KT_OK)
        return st;
    ch->parked = false;
    if (!run->decoding)
        run->n_prefilled = (uint32_t)match;
    return KT_OK;
}

enum plan_result { PLAN_DONE, PLAN_AGAIN };
enum resume_result { RESUMED, NO_ROOM, RESUME_FAILED };

/* resume_choice within the plan: forking a sequence the batch grows (a sibling) makes its last block shared, so
 * the batch may now copy it; when that no longer fits, the choice goes back to waiting. */
static enum resume_result resume_in_plan(struct kt_sched *s, struct run *run, uint32_t c, kt_err *err)
{
    struct choice *ch = &run->ch[c];
    if (resume_choice(s, run, c, err) != KT_OK)
        return RESUME_FAILED;
    plan_recount(s);
    if (room_for(s, 0))
        return RESUMED;
    kt_engine_seq_remove(s->engine, ch->seq, NULL);
    ch->parked = true;
    if (!run->decoding)
        run->n_prefilled = 0;
    plan_recount(s);
    return NO_ROOM;
}

/* Every decoding choice's next token, oldest run first; when the pool cannot take one, the youngest run holding
 * KV is preempted (this run itself when it is the youngest). */
static void plan_decodes(struct kt_sched *s)
{
    for (uint32_t r = 0; r < s->n_runs; r++) {
        struct run *run = s->runs[r];
        if (!run->decoding)
            continue;
        const uint32_t mark_batch = s->n_batch, mark_rows = s->n_rows, mark_items = s->n_items;
        for (uint32_t c = 0; c < run->job->n; c++) {
            struct choice *ch = &run->ch[c];
            if (!live(ch) || ch->parked || kt_engine_seq_length(s->engine, ch->seq) != next_pos(run, ch))
                continue; /* preempted or recomputing: plan_prefills */
            bool self = false;
            while (!room_for(s, grow_blocks(s, ch->seq, 1))) {
                const int64_t v = youngest_holder(s, r, -1);
                if (v < 0 || v == (int64_t)r) {
                    self = true;
                    break;
                }
                preempt(s, s->runs[v]);
            }
            if (self) { /* this run is the youngest: it goes, with what it had in the batch */
                s->n_batch = mark_batch, s->n_rows = mark_rows, s->n_items = mark_items;
                run->in_step = false;
                preempt(s, run);
                break;
            }
            plan_add(s, run, ch, ch->seq, next_pos(run, ch), 1, next_pos(run, ch), (int)c);
        }
    }
}

/* Prompt chunks and recomputes, oldest run first, within the step's budget and the free blocks (no preemption
 * for these); preempted runs resume when their whole context fits.  Stops at the first run that finds no room,
 * so younger ones never overtake it: *blocked is its index, or -1. */
static enum plan_result plan_prefills(struct kt_sched *s, int64_t *blocked)
{
    *blocked = -1;
    for (uint32_t r = 0; r < s->n_runs && s->n_batch < s->budget; r++) {
        struct run *run = s->runs[r];
        kt_err err = {0};
        if (!run->decoding) {
            struct choice *ch = &run->ch[0];
            if (ch->parked && !room_for(s, resume_blocks(s, run))) {
                *blocked = r;
                return PLAN_DONE;
            }
            const enum resume_result rr = ch->parked ? resume_in_plan(s, run, 0, &err) : RESUMED;
            if (rr == RESUME_FAILED) {
                end_run(s, r, KT_FINISH_ERROR, err.msg);
                return PLAN_AGAIN;
            }
            if (rr == NO_ROOM) {
                *blocked = r;
                return PLAN_DONE;
            }
            const uint32_t n_ids = (uint32_t)run->job->prompt.n_ids, left = n_ids - run->n_prefilled;
            uint32_t want = left < s->budget - s->n_batch ? left : s->budget - s->n_batch;
            if (run->job->score_prompt) { /* every position's logits: within this step's rows for them */
                want = want < s->score_left ? want : s->score_left;
                if (want == 0)
                    continue;
            }
            const uint32_t k = fitting(s, ch->seq, want);
            if (k == 0) {
                *blocked = r;
                return PLAN_DONE;
            }
            if (run->job->score_prompt)
                s->score_left -= k;
            plan_add(s, run, ch, ch->seq, run->n_prefilled, k, n_ids - 1, ROW_PROMPT_DONE);
            run->chunk = k;
            continue;
        }
        uint32_t first = run->job->n;
        for (uint32_t c = 0; c < run->job->n && first == run->job->n; c++)
            if (live(&run->ch[c]))
                first = c;
        for (uint32_t c = first; c < run->job->n && s->n_batch < s->budget; c++) {
            struct choice *ch = &run->ch[c];
            if (!live(ch))
                continue;
            bool resumed = false;
            if (ch->parked) {
                if (c == first && !room_for(s, resume_blocks(s, run))) {
                    *blocked = r;
                    return PLAN_DONE;
                }
                const struct choice *lead = &run->ch[first];
                if (c != first && (lead->parked || kt_engine_seq_length(s->engine, lead->seq) != next_pos(run, lead)))
                    continue; /* after the first has recomputed, to fork what they share from it */
                const enum resume_result rr = resume_in_plan(s, run, c, &err);
                if (rr == RESUME_FAILED) {
                    end_run(s, r, KT_FINISH_ERROR, err.msg);
                    return PLAN_AGAIN;
                }
                if (rr == NO_ROOM) {
                    *blocked = r;
                    return PLAN_DONE;
                }
                resumed = true;
            }
            const uint32_t len = kt_engine_seq_length(s->engine, ch->seq), at = next_pos(run, ch);
            if (len == at && !resumed)
                continue; /* a plain decode: plan_decodes has it */
            const uint32_t left = at - len + 1, room = s->budget - s->n_batch;
            const uint32_t k = fitting(s, ch->seq, left < room ? left : room);
            if (k == 0) {
                *blocked = r;
                return PLAN_DONE;
            }
            plan_add(s, run, ch, ch->seq, len, k, at, (int)c);
        }
    }
    return PLAN_DONE;
}

/* This step's batch.  When nothing at all fits, a run is stuck behind blocks that others hold: the youngest
 * other holder is preempted; with none, the stuck run cannot fit the pool on its own and fails. */
static enum plan_result plan(struct kt_sched *s)
{
    s->n_batch = s->n_rows = s->n_items = 0;
    s->plan_blocks = 0;
    s->score_left = s->score_rows;
    for (uint32_t r = 0; r < s->n_runs; r++)
        s->runs[r]->chunk = 0, s->runs[r]->in_step = false;
    plan_decodes(s);
    int64_t blocked;
    if (plan_prefills(s, &blocked) == PLAN_AGAIN)
        return PLAN_AGAIN;
    if (s->n_batch > 0 || blocked < 0)
        return PLAN_DONE;
    const int64_t v = youngest_holder(s, 0, blocked);
    if (v >= 0) {
        preempt(s, s->runs[v]);
        return PLAN_AGAIN;
    }
    char why[300];
    snprintf(why, sizeof why, "KV cache: this request needs more than the whole pool (%u blocks of %u positions) "
                              "on its own: lower n, max_tokens or the prompt, or give the server more KV memory",
             s->kv_blocks, s->block_tokens);
    end_run(s, (uint32_t)blocked, KT_FINISH_ERROR, why);
    return PLAN_AGAIN;
}

/* A run whose every open choice is preempted counts as waiting, not running. */
static bool run_waiting(const struct run *run)
{
    for (uint32_t c = 0; c < run->job->n; c++)
        if (live(&run->ch[c]) && !run->ch[c].parked && (c == 0 || run->decoding))
            return false;
    return true;
}

static void count_runs(const struct kt_sched *s, uint32_t *running, uint32_t *parked)
{
    *parked = 0;
    for (uint32_t r = 0; r < s->n_runs; r++)
        *parked += run_waiting(s->runs[r]);
    *running = s->n_runs - *parked;
}

static void publish_engine_metrics(struct kt_sched *s)
{
    struct kt_serve_metrics *m = s->p.metrics;
    if (!m)
        return;
    struct kt_kv_cache_stats ks;
    kt_kv_cache_stats(kt_engine_kv_cache(s->engine), &ks);
    struct kt_engine_stats es;
    kt_engine_stats(s->engine, &es);
    struct kt_backend_stats ds;
    bool have_device = kt_engine_device_stats(s->engine, &ds) == KT_OK;
    uint32_t running, parked;
    count_runs(s, &running, &parked);
    pthread_mutex_lock(&m->mu);
    m->engine = es;
    m->have_device = have_device;
    if (have_device) {
        m->device = ds;
        const char *name = kt_engine_device_name(s->engine);
        snprintf(m->device_name, sizeof m->device_name, "%s", name ? name : "device");
    }
    m->kv_cache_usage = ks.n_blocks ? (double)ks.blocks_used / (double)ks.n_blocks : 0;
    m->kv_blocks_total = ks.n_blocks;
    m->kv_blocks_used = ks.blocks_used;
    m->kv_block_tokens = ks.block_tokens;
    m->requests_running = running;
    m->requests_preempted = parked;
    pthread_mutex_unlock(&m->mu);
}

static void step(struct kt_sched *s)
{
    while (plan(s) == PLAN_AGAIN)
        ;
    const uint32_t n = s->n_batch, n_rows = s->n_rows;
    if (n == 0)
        return;
    kt_err err = {0};
    if (kt_engine_step(s->engine, &(struct kt_batch){.n_tokens = n, .tokens = s->batch}, s->logits, &err) != KT_OK) {
        /* nothing changed in the engine: fail the jobs of this batch */
        for (uint32_t r = s->n_runs; r-- > 0;)
            if (s->runs[r]->in_step)
                end_run(s, r, KT_FINISH_ERROR, err.msg);
        return;
    }
    for (uint32_t r = 0; r < s->n_runs; r++)
        s->runs[r]->n_prefilled += s->runs[r]->chunk;
    for (uint32_t i = 0; i < n_rows; i++) {
        float *row = s->logits + (size_t)i * s->n_vocab;
        if (s->rows[i].choice == ROW_SCORE)
            score_position(s, s->rows[i].run, s->rows[i].pos + 1, row);
        else if (s->rows[i].choice == ROW_PROMPT_DONE)
            start_decoding(s, s->rows[i].run, row);
        else if (!s->rows[i].run->ch[s->rows[i].choice].finished)
            sample_choice(s, s->rows[i].run, (uint32_t)s->rows[i].choice, row);
    }
    for (uint32_t r = s->n_runs; r-- > 0;) {
        struct run *run = s->runs[r];
        bool any_finished = false;
        for (uint32_t c = 0; c < run->job->n; c++)
            any_finished |= run->ch[c].finished && run->ch[c].seq != NO_SEQ;
        if (any_finished || run->n_open == 0)
            settle_run(s, r);
    }
    publish_engine_metrics(s);
    if (s->p.after_step)
        s->p.after_step(s->p.after_step_ctx, s->engine);
}

/* ---- the thread ----------------------------------------------------------------------------------- */

static void *scheduler_main(void *arg)
{
    struct kt_sched *s = arg;
    struct kt_job **admitted = malloc(s->p.max_running_seqs * sizeof *admitted);
    for (;;) {
        uint32_t n_admitted = 0, admitted_seqs = 0;
        double now = kt_monotonic_s();
        pthread_mutex_lock(&s->mu);
        while (!s->stop && s->q_len == 0 && s->n_runs == 0 && !s->poked)
            pthread_cond_wait(&s->wake, &s->mu);
        if (s->poked && !s->stop && s->q_len == 0 && s->n_runs == 0) {
            s->poked = false; /* idle: nothing to step, so call it now */
            pthread_mutex_unlock(&s->mu);
            if (s->p.poked)
                s->p.poked(s->p.after_step_ctx);
            continue;
        }
        if (s->stop && s->q_len == 0 && s->n_runs == 0) {
            pthread_mutex_unlock(&s->mu);
            break;
        }
        bool cancel_all = s->cancel_all || s->stop;
        /* queued jobs that will never run */
        size_t kept = 0;
        struct kt_job *dropped[64];
        enum kt_finish dropped_why[64];
        size_t n_dropped = 0;
        for (size_t i = 0; i < s->q_len; i++) {
            struct kt_job *job = s->queue[(s->q_head + i) % s->p.max_waiting];
            bool cancel = cancel_all || atomic_load(&job->cancel);
            if ((cancel || timed_out(job, now)) && n_dropped < 64) {
                dropped_why[n_dropped] = cancel ? KT_FINISH_CANCELLED : KT_FINISH_TIMEOUT;
                dropped[n_dropped++] = job;
            } else {
                s->queue[(s->q_head + kept) % s->p.max_waiting] = job;
                kept++;
            }
        }
        s->q_len = kept;
        /* jobs that fit into free sequence slots, in arrival order */
        while (admitted && s->q_len > 0) {
            struct kt_job *job = s->queue[s->q_head];
            if (s->seqs_reserved + admitted_seqs + job->n > s->p.max_running_seqs)
                break;
            admitted[n_admitted++] = job;
            admitted_seqs += job->n;
            s->q_head = (s->q_head + 1) % s->p.max_waiting;
            s->q_len--;
        }
        /* off the queue and not yet running: counted as running, so a drain does not see an idle
         * scheduler while they are in this thread's hands (admit sets it from n_runs again) */
        s->n_runs_shared = s->n_runs + n_admitted;
        if (s->p.metrics) {
            pthread_mutex_lock(&s->p.metrics->mu);
            s->p.metrics->requests_waiting = (uint32_t)s->q_len;
            pthread_mutex_unlock(&s->p.metrics->mu);
        }
        pthread_mutex_unlock(&s->mu);

        for (size_t i = 0; i < n_dropped; i++)
            finish_unstarted(s, dropped[i], dropped_why[i], NULL);
        for (uint32_t i = 0; i < n_admitted; i++)
            admit(s, admitted[i]);
        for (uint32_t r = s->n_runs; r-- > 0;) {
            struct kt_job *job = s->runs[r]->job;
            if (cancel_all || atomic_load(&job->cancel))
                end_run(s, r, KT_FINISH_CANCELLED, NULL);
            else if (timed_out(job, now))
                end_run(s, r, KT_FINISH_TIMEOUT, "the request timed out");
        }
        step(s);
        pthread_mutex_lock(&s->mu); /* asked before or during the step: now, between two steps */
        const bool poked = s->poked;
        s->poked = false;
        pthread_mutex_unlock(&s->mu);
        if (poked && s->p.poked)
            s->p.poked(s->p.after_step_ctx);
        pthread_mutex_lock(&s->mu);
        s->n_runs_shared = s->n_runs;
        if (s->p.metrics) {
            uint32_t running, parked;
            count_runs(s, &running, &parked);
            pthread_mutex_lock(&s->p.metrics->mu);
            s->p.metrics->requests_running = running;
            s->p.metrics->requests_preempted = parked;
            s->p.metrics->requests_waiting = (uint32_t)s->q_len;
            pthread_mutex_unlock(&s->p.metrics->mu);
        }
        if (s->n_runs == 0 && s->q_len == 0)
            pthread_cond_broadcast(&s->idle);
        pthread_mutex_unlock(&s->mu);
    }
    free(admitted);
    return NULL;
}

/* ---- life cycle ------------------------------------------------------------------------------------ */

kt_status kt_sched_create(const struct kt_sched_params *p, struct kt_sched **out, kt_err *err)
{
    *out = NULL;
    if (!p->engine || !p->tok || p->max_running_seqs == 0 || p->max_waiting == 0)
        return kt_err_set(err, KT_ERR_INVALID, "scheduler: engine, tokenizer, max_running_seqs and max_waiting "
                                               "are required");
    const struct kt_engine_params *ep = kt_engine_params(p->engine);
    uint32_t seqs = kt_sched_engine_seqs(p->max_running_seqs, p->prefix_cache_entries);
    if (ep->max_seqs < seqs)
        return kt_err_set(err, KT_ERR_INVALID, "scheduler: the engine has %u sequences; %u running + %u cached "
                                               "prefixes need %u", ep->max_seqs, p->max_running_seqs,
                          p->prefix_cache_entries, seqs);
    struct kt_kv_cache_stats ks;
    kt_kv_cache_stats(kt_engine_kv_cache(p->engine), &ks);
    uint32_t budget = p->max_batch_tokens ? p->max_batch_tokens : kt_engine_max_batch_tokens(p->engine);
    if (budget > kt_engine_max_batch_tokens(p->engine))
        budget = kt_engine_max_batch_tokens(p->engine);
    if (budget < p->max_running_seqs)
        return kt_err_set(err, KT_ERR_INVALID, "scheduler: a step of %u tokens cannot hold %u decoding sequences",
                          budget, p->max_running_seqs);

    struct kt_sched *s = calloc(1, sizeof *s);
    if (!s)
        return kt_err_set(err, KT_ERR_NOMEM, "scheduler: out of memory");
    s->p = *p;
    s->engine = p->engine;
    s->tok = p->tok;
    s->n_vocab = kt_engine_n_vocab(p->engine);
    /* a sequence never holds more than the whole pool, so one alone always fits */
    const uint64_t pool_positions = (uint64_t)ks.n_blocks * ks.block_tokens;
    s->n_ctx = pool_positions < ep->n_ctx ? (uint32_t)pool_positions : ep->n_ctx;
    s->kv_blocks = ks.n_blocks;
    if (p->metrics) { /* the pool's size before the first step */
        pthread_mutex_lock(&p->metrics->mu);
        p->metrics->kv_blocks_total = ks.n_blocks;
        p->metrics->kv_blocks_used = ks.blocks_used;
        p->metrics->kv_block_tokens = ks.block_tokens;
        pthread_mutex_unlock(&p->metrics->mu);
    }
    s->block_tokens = ks.block_tokens;
    s->budget = budget;
    s->accepting = true;
    s->seed_state = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32) ^ (uint64_t)(uintptr_t)s;
    s->detok_cap = kt_detok_max_bytes(p->tok) + 8;
    s->queue = calloc(p->max_waiting, sizeof *s->queue);
    s->runs = calloc(p->max_running_seqs, sizeof *s->runs);
    s->free_ids = calloc(seqs, sizeof *s->free_ids);
    s->evicted = calloc((size_t)p->prefix_cache_entries + 2, sizeof *s->evicted);
    s->batch = calloc(budget, sizeof *s->batch);
    s->rows = calloc(budget, sizeof *s->rows);
    s->item_seq = calloc(budget, sizeof *s->item_seq);
    s->item_new = calloc(budget, sizeof *s->item_new);
    s->logits = malloc((size_t)p->max_running_seqs * s->n_vocab * sizeof *s->logits);
    s->scratch = malloc((size_t)s->n_vocab * sizeof *s->scratch);
    s->piece = malloc(s->detok_cap);
    kt_status st = KT_OK;
    if (!s->queue || !s->runs || !s->free_ids || !s->evicted || !s->batch || !s->rows || !s->item_seq ||
        !s->item_new || !s->logits || !s->scratch || !s->piece)
        st = kt_err_set(err, KT_ERR_NOMEM, "scheduler: out of memory");
    if (st == KT_OK && p->prefix_cache_entries)
        st = kt_prefix_cache_create(p->prefix_cache_entries, &s->pc, err);
    for (uint32_t i = 0; i < seqs; i++)
        s->free_ids[s->n_free++] = seqs - 1 - i; /* hands out 0, 1, ... first */
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->wake, NULL);
    pthread_cond_init(&s->idle, NULL);
    if (st == KT_OK) {
        if (pthread_create(&s->thread, NULL, scheduler_main, s) != 0)
            st = kt_err_set(err, KT_ERR_NOMEM, "scheduler: cannot start its thread");
        else
            s->thread_started = true;
    }
    if (st != KT_OK) {
        kt_sched_destroy(s);
        return st;
    }
    *out = s;
    return KT_OK;
}

enum kt_submit_result kt_sched_submit_all(struct kt_sched *s, struct kt_job *const *jobs, size_t n)
{
    enum kt_submit_result r = KT_SUBMIT_OK;
    pthread_mutex_lock(&s->mu);
    for (size_t i = 0; i < n; i++)
        if (jobs[i]->n > s->p.max_running_seqs)
            r = KT_SUBMIT_TOO_LARGE;
    if (!s->accepting)
        r = KT_SUBMIT_STOPPING;
    else if (r == KT_SUBMIT_OK && n > s->p.max_waiting - s->q_len)
        r = KT_SUBMIT_FULL;
    for (size_t i = 0; r == KT_SUBMIT_OK && i < n; i++) {
        atomic_fetch_add(&jobs[i]->refs, 1);
        s->queue[(s->q_head + s->q_len) % s->p.max_waiting] = jobs[i];
        s->q_len++;
    }
    if (r == KT_SUBMIT_OK)
        pthread_cond_signal(&s->wake);
    pthread_mutex_unlock(&s->mu);
    return r;
}

enum kt_submit_result kt_sched_submit(struct kt_sched *s, struct kt_job *job)
{
    return kt_sched_submit_all(s, &job, 1);
}

void kt_sched_poke(struct kt_sched *s)
{
    pthread_mutex_lock(&s->mu);
    s->poked = true;
    pthread_cond_signal(&s->wake);
    pthread_mutex_unlock(&s->mu);
}

void kt_sched_drain(struct kt_sched *s, double grace_s)
{
    pthread_mutex_lock(&s->mu);
    s->accepting = false;
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    double whole = floor(grace_s);
    until.tv_sec += (time_t)whole;
    until.tv_nsec += (long)((grace_s - whole) * 1e9);
    if (until.tv_nsec >= 1000000000L)
        until.tv_sec++, until.tv_nsec -= 1000000000L;
    while (s->q_len > 0 || s->n_runs_shared > 0) {
        if (!s->cancel_all && pthread_cond_timedwait(&s->idle, &s->mu, &until) == ETIMEDOUT) {
            s->cancel_all = true;
            pthread_cond_signal(&s->wake);
        } else if (s->cancel_all) {
            pthread_cond_wait(&s->idle, &s->mu);
        }
    }
    pthread_mutex_unlock(&s->mu);
}

void kt_sched_destroy(struct kt_sched *s)
{
    if (!s)
        return;
    if (s->thread_started) {
        pthread_mutex_lock(&s->mu);
        s->accepting = false;
        s->stop = true;
        s->cancel_all = true;
        pthread_cond_signal(&s->wake);
        pthread_mutex_unlock(&s->mu);
        pthread_join(s->thread, NULL);
    }
    /* the thread left nothing running; cached prefixes go back to the engine */
    uint32_t seq;
    while (s->pc && kt_prefix_cache_evict_lru(s->pc, &seq))
        kt_engine_seq_remove(s->engine, seq, NULL);
    kt_prefix_cache_destroy(s->pc);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->wake);
    pthread_cond_destroy(&s->idle);
    free(s->queue), free(s->runs), free(s->free_ids), free(s->evicted);
    free(s->batch), free(s->rows), free(s->item_seq), free(s->item_new), free(s->logits), free(s->scratch), free(s->piece);
    kt_grammar_vocab_destroy(s->grammar_vocab);
    free(s->mask);
    free(s);
}
