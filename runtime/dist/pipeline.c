/*
 * pipeline.c - the layers of one model over the ranks of a job (pipeline.h):
 * rank 0's stage hooks, the other ranks' follow loop, and the messages of
 * the ring between them.  It moves bytes and calls the engine; it never
 * computes model math, prints or exits.
 */
#include "pipeline.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_MICRO 16
#define FOLLOWER_SENDS 2 /* a follower alternates two send buffers (pass_on's turn) */
#define DEFAULT_TIMEOUT_MS 120000

/* ---- messages ---------------------------------------------------------------------------- */

enum msg_kind { MSG_HELLO = 1, MSG_STEP, MSG_SEQ, MSG_STOP, MSG_RESULT };

/* Every message starts with this.  STEP: then tokens (n_tokens), then the
 * residual stream (n_tokens, n_embd) at x_offset(n_tokens); RESULT (the
 * last rank to rank 0): the stream at x_offset(0); SEQ, STOP: nothing. */
struct msg_header {
    uint32_t kind;
    uint32_t n_tokens;
    uint32_t seq_op, seq, arg;  /* SEQ */
    uint32_t micro;             /* STEP, RESULT: the slice's index in its step */
    uint64_t step;              /* STEP, RESULT: rank 0's step number */
    uint64_t busy_ns[KT_PIPELINE_MAX_RANKS]; /* STEP, RESULT: each rank's time on this slice so far */
};

/* What each rank tells rank 0 at creation. */
struct msg_hello {
    uint32_t kind;
    uint32_t layer_begin, layer_end, n_layer, n_embd, n_vocab, max_batch;
};

static size_t x_offset(uint32_t n_tokens)
{
    const size_t end = sizeof(struct msg_header) + (size_t)n_tokens * sizeof(struct kt_batch_token);
    return (end + 63) / 64 * 64;
}

struct kt_pipeline {
    struct kt_transport *t;
    struct kt_engine *e;
    int rank, size;
    uint32_t n_embd, n_vocab, max_batch;
    uint32_t micro;             /* most slices of a decode batch */
    int64_t timeout_ms;
    void (*on_broken)(void *ctx, const char *why);
    void *on_broken_ctx;
    size_t msg_bytes;           /* the largest message: a STEP of max_batch tokens */
    /* rank 0: one buffer per slice of a step (sends), one for answers;
     * others: in, and two out buffers used in turn */
    uint8_t *out[MAX_MICRO];
    struct kt_transport_req out_req[MAX_MICRO];
    uint8_t *in;
    struct msg_header small;    /* SEQ / STOP */
    struct kt_transport_req small_req;
    uint64_t step_no;
    atomic_bool is_broken;      /* set by the stepping thread after broken[]; read by any (kt_pipeline_broken) */
    char broken[sizeof(((kt_err *)0)->msg)];
    struct kt_pipeline_stats stats;
};

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

void kt_pipeline_split(uint32_t n_layer, int n_ranks, int rank, uint32_t *begin, uint32_t *end)
{
    const uint32_t n = (uint32_t)n_ranks, r = (uint32_t)rank, base = n_layer / n, extra = n_layer % n;
    *begin = r * base + (r < extra ? r : extra);
    *end = *begin + base + (r < extra);
}

/* Rank 0: the pipeline stops working; every later call fails with why. */
static kt_status set_broken(struct kt_pipeline *p, kt_err *err)
{
    if (!atomic_load(&p->is_broken)) {
        snprintf(p->broken, sizeof p->broken, "%s", err && err->msg[0] ? err->msg : "a rank failed");
        atomic_store(&p->is_broken, true);
        if (p->on_broken)
            p->on_broken(p->on_broken_ctx, p->broken);
    }
    return KT_ERR_IO;
}

static kt_status wait_req(struct kt_pipeline *p, struct kt_transport_req *req, int64_t timeout_ms, size_t *bytes,
                          const char *what, int peer, kt_err *err)
{
    const uint64_t t0 = now_ns();
    kt_status st = kt_transport_wait(p->t, req, timeout_ms, bytes, NULL, err);
    p->stats.wait_ns += now_ns() - t0;
    if (st != KT_OK)
        kt_err_prefix(err, "rank %d: %s rank %d", p->rank, what, peer);
    return st;
}

static kt_status send_msg(struct kt_pipeline *p, int to, const void *buf, size_t bytes, struct kt_transport_req *req,
                          kt_err *err)
{
    kt_status st = kt_transport_isend(p->t, to, buf, bytes, req, err);
    if (st == KT_OK)
        p->stats.sent_bytes += bytes;
    return st;
}

/* ---- rank 0: the stage hooks ------------------------------------------------------------- */

static kt_status hook_seq(void *ctx, enum kt_engine_seq_op op, uint32_t seq, uint32_t arg, kt_err *err)
{
    struct kt_pipeline *p = ctx;
    if (p->is_broken)
        return kt_err_set(err, KT_ERR_IO, "the pipeline is down: %s", p->broken);
    p->small = (struct msg_header){.kind = MSG_SEQ, .seq_op = (uint32_t)op, .seq = seq, .arg = arg};
    kt_status st = send_msg(p, 1, &p->small, sizeof p->small, &p->small_req, err);
    if (st == KT_OK)
        st = wait_req(p, &p->small_req, p->timeout_ms, NULL, "sending a sequence operation to", 1, err);
    return st == KT_OK ? KT_OK : set_broken(p, err);
}

/* Between two layers of a slice (both sides): the sends in flight move on,
 * so a slice sent before this one's layers reaches the next rank while they
 * compute (kt_transport_progress), not only once they are done. */
static void hook_progress(void *ctx)
{
    struct kt_pipeline *p = ctx;
    kt_transport_progress(p->t, p->out_req, p->rank == 0 ? (int)p->micro : FOLLOWER_SENDS);
}

/* A batch every sequence of which has one token (decode), split when it has two or more. */
static uint32_t slices_of(const struct kt_pipeline *p, const struct kt_batch *b)
{
    if (p->micro < 2 || b->n_tokens < 2)
        return 1;
    for (uint32_t i = 0; i < b->n_tokens; i++)
        for (uint32_t j = 0; j < i; j++)
            if (b->tokens[i].seq == b->tokens[j].seq)
                return 1;
    return b->n_tokens < p->micro ? b->n_tokens : p->micro;
}

/* Rank 0's answers to slices [0, n) of a step, as they come (the stream is
 * thrown away: after a failed slice nothing more is run). */
static kt_status drain(struct kt_pipeline *p, uint32_t n, kt_err *err)
{
    for (uint32_t m = 0; m < n; m++) {
        struct kt_transport_req req = {0};
        kt_status st = kt_transport_irecv(p->t, p->size - 1, p->in, p->msg_bytes, &req, err);
        if (st == KT_OK)
            st = wait_req(p, &req, p->timeout_ms, NULL, "waiting for an answer from", p->size - 1, err);
        if (st != KT_OK) {
            kt_transport_cancel(p->t, &req);
            return set_broken(p, err);
        }
    }
    return KT_OK;
}

static kt_status hook_step(void *ctx, struct kt_engine *e, const struct kt_batch *b, float *logits, kt_err *err)
{
    struct kt_pipeline *p = ctx;
    if (p->is_broken)
        return kt_err_set(err, KT_ERR_IO, "the pipeline is down: %s", p->broken);
    if (!b || !b->tokens || b->n_tokens == 0 || b->n_tokens > p->max_batch)
        return kt_err_set(err, KT_ERR_INVALID, "a batch of 1 to %u tokens (split long prefills into chunks)",
                          p->max_batch);
    const uint64_t t_step = now_ns();
    const uint32_t n_slices = slices_of(p, b);
    const uint64_t step_no = ++p->step_no;
    kt_status st = KT_OK;
    uint32_t sent = 0;
    for (uint32_t m = 0; m < n_slices; m++) {
        const uint32_t lo = b->n_tokens * m / n_slices, hi = b->n_tokens * (m + 1) / n_slices;
        const struct kt_batch slice = {.n_tokens = hi - lo, .tokens = b->tokens + lo};
        uint8_t *buf = p->out[m];
        if ((st = wait_req(p, &p->out_req[m], p->timeout_ms, NULL, "sending a step to", 1, err)) != KT_OK)
            return set_broken(p, err);
        struct msg_header *h = (struct msg_header *)buf;
        *h = (struct msg_header){.kind = MSG_STEP, .n_tokens = slice.n_tokens, .micro = m, .step = step_no};
        memcpy(buf + sizeof *h, slice.tokens, slice.n_tokens * sizeof *slice.tokens);
        const uint64_t t0 = now_ns();
        st = kt_engine_step_layers(e, &slice, NULL, (float *)(buf + x_offset(slice.n_tokens)), err);
        h->busy_ns[0] = now_ns() - t0;
        if (st != KT_OK)
            break;
        const size_t bytes = x_offset(slice.n_tokens) + (size_t)slice.n_tokens * p->n_embd * sizeof(float);
        if ((st = send_msg(p, 1, buf, bytes, &p->out_req[m], err)) != KT_OK)
            return set_broken(p, err);
        sent++;
    }
    if (st != KT_OK) { /* a slice the engine refused: the slices before it ran everywhere; take them back */
        if (sent == 0)
            return st;
        kt_err undo = {0};
        if (drain(p, sent, &undo) != KT_OK)
            return st;
        const uint32_t hi = b->n_tokens * sent / n_slices;
        for (uint32_t i = 0; i < hi; i++)
            if (kt_engine_seq_truncate(e, b->tokens[i].seq, b->tokens[i].pos, &undo) != KT_OK)
                break;
        return st;
    }
    uint32_t wanted = 0;
    for (uint32_t m = 0; m < n_slices; m++) {
        const uint32_t lo = b->n_tokens * m / n_slices, hi = b->n_tokens * (m + 1) / n_slices;
        const struct kt_batch slice = {.n_tokens = hi - lo, .tokens = b->tokens + lo};
        struct kt_transport_req req = {0};
        size_t got = 0;
        if ((st = kt_transport_irecv(p->t, p->size - 1, p->in, p->msg_bytes, &req, err)) != KT_OK)
            return set_broken(p, err);
        if ((st = wait_req(p, &req, p->timeout_ms, &got, "waiting for an answer from", p->size - 1, err)) != KT_OK) {
            kt_transport_cancel(p->t, &req);
            return set_broken(p, err);
        }
        p->stats.received_bytes += got;
        const struct msg_header *h = (const struct msg_header *)p->in;
        if (got < sizeof *h || h->kind != MSG_RESULT || h->step != step_no || h->micro != m ||
            h->n_tokens != slice.n_tokens || got != x_offset(0) + (size_t)h->n_tokens * p->n_embd * sizeof(float)) {
            kt_err_set(err, KT_ERR_IO, "rank 0: rank %d answered step %llu slice %u with another message (%zu bytes, "
                       "step %llu slice %u)", p->size - 1, (unsigned long long)step_no, m, got,
                       got >= sizeof *h ? (unsigned long long)h->step : 0ull, got >= sizeof *h ? h->micro : 0);
            return set_broken(p, err);
        }
        const uint64_t t0 = now_ns();
        st = kt_engine_head(e, &slice, (const float *)(p->in + x_offset(0)), logits ? logits + (size_t)wanted * p->n_vocab : NULL,
                            err);
        p->stats.busy_ns[0] += now_ns() - t0;
        if (st != KT_OK) /* cannot happen for a batch its layers took; the stages are in step anyway */
            return st;
        for (int r = 0; r < p->size; r++)
            p->stats.busy_ns[r] += h->busy_ns[r];
        for (uint32_t i = 0; i < slice.n_tokens; i++)
            wanted += slice.tokens[i].want_logits;
    }
    p->stats.steps++;
    p->stats.micro_batches += n_slices;
    p->stats.step_ns += now_ns() - t_step;
    return KT_OK;
}

/* ---- creation ---------------------------------------------------------------------------- */

static kt_status check_ranks(struct kt_pipeline *p, const struct msg_hello *mine, kt_err *err)
{
    uint32_t next = 0;
    for (int r = 0; r < p->size; r++) {
        struct msg_hello h = *mine;
        if (r > 0) {
            struct kt_transport_req req = {0};
            size_t got = 0;
            kt_status st = kt_transport_irecv(p->t, r, &h, sizeof h, &req, err);
            if (st == KT_OK)
                st = wait_req(p, &req, -1, &got, "waiting for the layers of", r, err); /* it may load long */
            if (st != KT_OK) {
                kt_transport_cancel(p->t, &req);
                return st;
            }
            if (got != sizeof h || h.kind != MSG_HELLO)
                return kt_err_set(err, KT_ERR_IO, "rank %d sent %zu bytes, not its layers", r, got);
        }
        if (h.n_layer != mine->n_layer || h.n_embd != mine->n_embd || h.n_vocab != mine->n_vocab)
            return kt_err_set(err, KT_ERR_INVALID, "rank %d has a model of %u layers, width %u, vocabulary %u; rank 0 "
                              "one of %u, %u, %u: every rank must open the same model", r, h.n_layer, h.n_embd,
                              h.n_vocab, mine->n_layer, mine->n_embd, mine->n_vocab);
        if (h.max_batch != mine->max_batch)
            return kt_err_set(err, KT_ERR_INVALID, "rank %d takes %u tokens a step, rank 0 %u: give every rank the "
                              "same batch size", r, h.max_batch, mine->max_batch);
        if (h.layer_begin != next || h.layer_end <= h.layer_begin)
            return kt_err_set(err, KT_ERR_INVALID, "rank %d holds layers [%u, %u), but the ranks before it end at "
                              "layer %u: the ranks' layer ranges must follow each other in rank order", r,
                              h.layer_begin, h.layer_end, next);
        next = h.layer_end;
    }
    if (next != mine->n_layer)
        return kt_err_set(err, KT_ERR_INVALID, "the ranks hold layers [0, %u) of %u: the last rank must end at the "
                          "last layer", next, mine->n_layer);
    return KT_OK;
}

kt_status kt_pipeline_create(struct kt_transport *t, struct kt_engine *e, const struct kt_pipeline_params *pp,
                             struct kt_pipeline **out, kt_err *err)
{
    *out = NULL;
    const struct kt_pipeline_params d = pp ? *pp : (struct kt_pipeline_params){0};
    struct kt_pipeline *p = calloc(1, sizeof *p);
    if (!p)
        return kt_err_set(err, KT_ERR_NOMEM, "pipeline: out of memory");
    kt_status st = KT_OK;
    p->t = t;
    p->e = e;
    p->rank = kt_transport_rank(t);
    p->size = kt_transport_size(t);
    p->stats.n_ranks = p->size;
    p->n_embd = kt_engine_n_embd(e);
    p->n_vocab = kt_engine_n_vocab(e);
    p->max_batch = kt_engine_max_batch_tokens(e);
    p->timeout_ms = d.timeout_ms > 0 ? d.timeout_ms : DEFAULT_TIMEOUT_MS;
    p->on_broken = d.on_broken;
    p->on_broken_ctx = d.on_broken_ctx;
    p->micro = d.micro_batches ? d.micro_batches : (uint32_t)p->size;
    if (p->micro > MAX_MICRO)
        p->micro = MAX_MICRO;
    uint32_t begin, end;
    kt_engine_layer_range(e, &begin, &end);
    if (p->size > KT_PIPELINE_MAX_RANKS) {
        st = kt_err_set(err, KT_ERR_UNSUPPORTED, "pipeline: %d ranks; kt runs at most %d", p->size,
                        KT_PIPELINE_MAX_RANKS);
        goto fail;
    }
    if (p->size == 1) {
        *out = p;
        return KT_OK;
    }
    p->msg_bytes = x_offset(p->max_batch) + (size_t)p->max_batch * p->n_embd * sizeof(float);
    const int n_out = p->rank == 0 ? (int)p->micro : 2;
    for (int i = 0; i < n_out; i++)
        if (!(p->out[i] = malloc(p->msg_bytes))) {
            st = kt_err_set(err, KT_ERR_NOMEM, "pipeline: cannot allocate a %zu-byte message buffer", p->msg_bytes);
            goto fail;
        }
    if (!(p->in = malloc(p->msg_bytes))) {
        st = kt_err_set(err, KT_ERR_NOMEM, "pipeline: cannot allocate a %zu-byte message buffer", p->msg_bytes);
        goto fail;
    }
    /* n_layer: the model's, which an engine does not give directly: the last rank's end, checked by rank 0 */
    struct msg_hello mine = {.kind = MSG_HELLO, .layer_begin = begin, .layer_end = end,
                             .n_embd = p->n_embd, .n_vocab = p->n_vocab, .max_batch = p->max_batch};
    mine.n_layer = kt_engine_n_layer(e);
    if (p->rank > 0) {
        struct kt_transport_req req = {0};
        st = send_msg(p, 0, &mine, sizeof mine, &req, err);
        if (st == KT_OK)
            st = wait_req(p, &req, p->timeout_ms, NULL, "telling its layers to", 0, err);
        if (st != KT_OK)
            goto fail;
        kt_engine_set_stage_hooks(e, &(struct kt_engine_stage_hooks){.ctx = p, .progress = hook_progress});
        *out = p;
        return KT_OK;
    }
    if ((st = check_ranks(p, &mine, err)) != KT_OK)
        goto fail;
    kt_engine_set_stage_hooks(
        e, &(struct kt_engine_stage_hooks){.ctx = p, .step = hook_step, .seq = hook_seq, .progress = hook_progress});
    *out = p;
    return KT_OK;

fail:
    for (int i = 0; i < MAX_MICRO; i++)
        free(p->out[i]);
    free(p->in);
    free(p);
    return st;
}

void kt_pipeline_destroy(struct kt_pipeline *p)
{
    if (!p)
        return;
    if (p->size > 1)
        kt_engine_set_stage_hooks(p->e, NULL);
    if (p->rank == 0 && p->size > 1) {
        kt_err ignored = {0};
        for (int i = 0; i < MAX_MICRO && !p->is_broken; i++)
            if (wait_req(p, &p->out_req[i], p->timeout_ms, NULL, "sending a step to", 1, &ignored) != KT_OK)
                set_broken(p, &ignored);
        if (!p->is_broken) {
            p->small = (struct msg_header){.kind = MSG_STOP};
            if (send_msg(p, 1, &p->small, sizeof p->small, &p->small_req, &ignored) == KT_OK)
                wait_req(p, &p->small_req, p->timeout_ms, NULL, "stopping", 1, &ignored);
        }
    }
    for (int i = 0; i < MAX_MICRO; i++) {
        kt_transport_cancel(p->t, &p->out_req[i]);
        free(p->out[i]);
    }
    free(p->in);
    free(p);
}

const char *kt_pipeline_broken(const struct kt_pipeline *p)
{
    return atomic_load(&p->is_broken) ? p->broken : NULL;
}

void kt_pipeline_stats(const struct kt_pipeline *p, struct kt_pipeline_stats *out)
{
    *out = p->stats;
}

void kt_pipeline_stats_reset(struct kt_pipeline *p)
{
    const int n = p->stats.n_ranks;
    p->stats = (struct kt_pipeline_stats){.n_ranks = n};
}

/* ---- ranks > 0: follow ------------------------------------------------------------------- */

/* Sends what this rank made of a STEP on: to the next rank, or from the last back to rank 0. */
static kt_status pass_on(struct kt_pipeline *p, const struct msg_header *in, int *turn, kt_err *err)
{
    const bool last = p->rank == p->size - 1;
    const int to = last ? 0 : p->rank + 1;
    const uint32_t n = in->n_tokens;
    uint8_t *buf = p->out[*turn];
    struct kt_transport_req *req = &p->out_req[*turn];
    *turn ^= 1;
    kt_status st = wait_req(p, req, p->timeout_ms, NULL, "sending a step to", to, err);
    if (st != KT_OK)
        return st;
    struct msg_header *h = (struct msg_header *)buf;
    *h = *in;
    if (last)
        h->kind = MSG_RESULT;
    const struct kt_batch slice = {.n_tokens = n, .tokens = (const struct kt_batch_token *)(p->in + sizeof *in)};
    const size_t xo = last ? x_offset(0) : x_offset(n);
    if (!last)
        memcpy(buf + sizeof *h, slice.tokens, n * sizeof *slice.tokens);
    const uint64_t t0 = now_ns();
    st = kt_engine_step_layers(p->e, &slice, (const float *)(p->in + x_offset(n)), (float *)(buf + xo), err);
    h->busy_ns[p->rank] = now_ns() - t0;
    p->stats.busy_ns[p->rank] += h->busy_ns[p->rank];
    p->stats.steps++;
    if (st != KT_OK) {
        kt_err_prefix(err, "rank %d: step %llu", p->rank, (unsigned long long)in->step);
        return st;
    }
    return send_msg(p, to, buf, xo + (size_t)n * p->n_embd * sizeof(float), req, err);
}

kt_status kt_pipeline_follow(struct kt_pipeline *p, kt_err *err)
{
    if (p->rank == 0 || p->size == 1)
        return kt_err_set(err, KT_ERR_INVALID, "pipeline: rank 0 leads; only the other ranks follow");
    const bool last = p->rank == p->size - 1;
    int turn = 0;
    kt_status st = KT_OK;
    for (;;) {
        struct kt_transport_req req = {0};
        size_t got = 0;
        if ((st = kt_transport_irecv(p->t, p->rank - 1, p->in, p->msg_bytes, &req, err)) != KT_OK ||
            (st = wait_req(p, &req, -1, &got, "waiting for", p->rank - 1, err)) != KT_OK)
            break;
        p->stats.received_bytes += got;
        const struct msg_header *h = (const struct msg_header *)p->in;
        if (got < sizeof *h || (h->kind == MSG_STEP && (h->n_tokens == 0 || h->n_tokens > p->max_batch ||
                                                        got != x_offset(h->n_tokens) +
                                                               (size_t)h->n_tokens * p->n_embd * sizeof(float)))) {
            st = kt_err_set(err, KT_ERR_IO, "rank %d: a message of %zu bytes from rank %d is not a step it can run",
                            p->rank, got, p->rank - 1);
            break;
        }
        if (h->kind == MSG_STEP) {
            if ((st = pass_on(p, h, &turn, err)) != KT_OK)
                break;
            continue;
        }
        if (h->kind != MSG_SEQ && h->kind != MSG_STOP) {
            st = kt_err_set(err, KT_ERR_IO, "rank %d: message kind %u from rank %d is not one it knows", p->rank,
                            h->kind, p->rank - 1);
            break;
        }
        if (h->kind == MSG_SEQ &&
            (st = kt_engine_seq_apply(p->e, (enum kt_engine_seq_op)h->seq_op, h->seq, h->arg, err)) != KT_OK) {
            kt_err_prefix(err, "rank %d: a sequence operation rank 0 made failed here", p->rank);
            break;
        }
        if (!last) { /* on down the ring, in order with the steps */
            p->small = *h;
            if ((st = send_msg(p, p->rank + 1, &p->small, sizeof p->small, &p->small_req, err)) != KT_OK ||
                (st = wait_req(p, &p->small_req, p->timeout_ms, NULL, "passing an operation to", p->rank + 1,
                               err)) != KT_OK)
                break;
        }
        if (h->kind == MSG_STOP)
            break;
    }
    kt_err ignored = {0};
    for (int i = 0; i < FOLLOWER_SENDS && st == KT_OK; i++)
        wait_req(p, &p->out_req[i], p->timeout_ms, NULL, "sending a step to", last ? 0 : p->rank + 1, &ignored);
    return st;
}

double kt_pipeline_bubble(const struct kt_pipeline_stats *s)
{
    uint64_t busy = 0;
    for (int r = 0; r < s->n_ranks; r++)
        busy += s->busy_ns[r];
    return s->step_ns && s->n_ranks ? 1.0 - (double)busy / ((double)s->n_ranks * (double)s->step_ns) : 0.0;
}
