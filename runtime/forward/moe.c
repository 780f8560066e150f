/*
 * moe.c - the FFN half of a layer for every token of a step: the dense
 * SwiGLU of the leading layers, or DeepSeek MoE (router, routed experts,
 * shared experts) after them (docs/deepseek2.md, MoE routing).
 *
 *     FFN(h)  = W_down (silu(W_gate h) * (W_up h))
 *     MoE(h)  = sum_j w_j Expert_{idx_j}(h)     (selection order)  + Shared(h)
 *
 * Tokens are grouped by expert before any weight is read, so an expert's
 * rows stream from memory once per step however many tokens chose it
 * (docs/architecture.md).  Work is split into (expert, row-slice) tasks, each running
 * its expert's whole token group through one tiled product (the packed
 * kernel when the expert store repacked the expert): gate and up together,
 * SiLU fused, then down.  Routed experts run on the least loaded NUMA pool
 * holding a copy, all pools at once, the stepping thread helping the first
 * when its node has a core without a worker (one node: the step's pool is
 * the one pool, always helped); the shared experts go with the
 * first pool, dense FFNs stay on the step's pool.  In a row-sliced layer
 * (expert_store.h) every pool runs its node's rows of every CPU unit - the
 * same 64-row tasks, on its node's share of the bytes - and an even share of
 * the per-pair work, so each output is still computed by the same call on
 * the same inputs (in a layer the rebalancer is slicing in parts, its sliced
 * experts run so first, then the rest on their pools).  Every (token, expert)
 * product is computed the same way whatever else is in the batch, and sums
 * run in selection order, so a token's output never depends on its batch.
 * Nothing here allocates.
 */
#include <math.h>
#include <string.h>

#include "forward.h"

/* ---- routing ------------------------------------------------------------------------ */

void kt_router_from_hparams(const struct kt_hparams *hp, struct kt_router *r)
{
    r->n_expert = hp->n_expert;
    r->n_used = hp->n_expert_used;
    r->n_groups = hp->n_expert_groups ? hp->n_expert_groups : 1;
    r->n_group_used = hp->n_group_used ? hp->n_group_used : r->n_groups;
    r->gating = hp->gating;
    r->norm = hp->expert_weights_norm;
    r->scale = hp->expert_weights_scale;
}

uint32_t kt_router_scratch_floats(const struct kt_router *r)
{
    return 3 * r->n_expert + 2 * r->n_groups;
}

/* The index of the largest v[i] whose taken[i] is 0 (ties: the lowest index). */
static uint32_t argmax_untaken(const float *v, const float *taken, uint32_t n)
{
    uint32_t best = UINT32_MAX;
    for (uint32_t i = 0; i < n; i++)
        if (taken[i] == 0.0f && (best == UINT32_MAX || v[i] > v[best]))
            best = i;
    return best;
}

void kt_moe_route(const struct kt_router *r, const float *logits, const float *bias, uint32_t *experts,
                  float *weights, float *scratch)
{
    const uint32_t Ne = r->n_expert, k = r->n_used, G = r->n_groups;
    float *prob = scratch;                  /* (Ne) gating scores: they weigh */
    float *sel = prob + Ne;                 /* (Ne) selection scores: they pick */
    float *expert_taken = sel + Ne;         /* (Ne) 1 once selected */
    float *group_score = expert_taken + Ne; /* (G) */
    float *group_kept = group_score + G;    /* (G) 1 once kept */

    for (uint32_t e = 0; e < Ne; e++)
        prob[e] = r->gating == KT_GATING_SIGMOID ? kt_sigmoid(logits[e]) : logits[e];
    if (r->gating == KT_GATING_SOFTMAX)
        kt_softmax(prob, Ne);
    for (uint32_t e = 0; e < Ne; e++) {
        sel[e] = prob[e] + (bias ? bias[e] : 0.0f);
        expert_taken[e] = 0.0f;
    }

    /* Group limit: a group scores the sum of its two best experts; only the
     * n_group_used best groups stay selectable. */
    if (G > 1 && r->n_group_used < G) {
        const uint32_t per = Ne / G;
        for (uint32_t g = 0; g < G; g++) {
            float best = -INFINITY, second = -INFINITY;
            for (uint32_t e = g * per; e < (g + 1) * per; e++) {
                if (sel[e] > best) {
                    second = best;
                    best = sel[e];
                } else if (sel[e] > second) {
                    second = sel[e];
                }
            }
            group_score[g] = per > 1 ? best + second : best;
            group_kept[g] = 0.0f;
        }
        for (uint32_t i = 0; i < r->n_group_used; i++)
            group_kept[argmax_untaken(group_score, group_kept, G)] = 1.0f;
        for (uint32_t g = 0; g < G; g++)
            if (group_kept[g] == 0.0f)
                for (uint32_t e = g * per; e < (g + 1) * per; e++)
                    sel[e] = -INFINITY;
    }

    /* The k best selection scores, best first, weighed by their unbiased scores. */
    for (uint32_t j = 0; j < k; j++) {
        uint32_t best = argmax_untaken(sel, expert_taken, Ne);
        expert_taken[best] = 1.0f;
        experts[j] = best;
        weights[j] = prob[best];
    }

    if (r->norm) {
        float sum = 0.0f;
        for (uint32_t j = 0; j < k; j++)
            sum += weights[j];
        const float denom = sum > 6.103515625e-5f ? sum : 6.103515625e-5f;
        for (uint32_t j = 0; j < k; j++)
            weights[j] /= denom;
    }
    for (uint32_t j = 0; j < k; j++)
        weights[j] *= r->scale;
}

/* ---- running FFN units ----------------------------------------------------------------- */

/* Rows of gate and up (and of down) per task: whole packed groups.  256, not
 * 64: a down task of a Kimi-K2 expert is then 0.3 MB of Q4_K weights instead
 * of 74 KB (gate + up: 2.1 MB instead of 0.5 MB), so the per-task costs
 * (finding the item, the pool's atomic, the kernel's set-up) stop showing.
 * Measured on the 4-layer 64-expert kimi-k2-slice, 2 threads (AMX VM): routed
 * + shared experts 0.88-0.89 -> 0.92 x triad, the whole decode step 0.93 ->
 * 0.95, prefill experts unchanged (0.060 -> 0.061 of the int8 peak).  A real
 * model's expert still has 8 gate/up and 28 down tasks (F = 2048, E = 7168),
 * enough for 16 threads over top-8. */
#define GATE_UP_ROWS_PER_TASK 256
#define DOWN_ROWS_PER_TASK 256

/* The three kinds of work items of a step's units, numbered over all units. */
enum item_kind { ITEMS_PAIRS, ITEMS_GATE_UP, ITEMS_DOWN };

static uint32_t first_item(const struct kt_ffn_unit *u, enum item_kind kind)
{
    return kind == ITEMS_PAIRS ? u->first_pair : kind == ITEMS_GATE_UP ? u->first_gate_up_task : u->first_down_task;
}

/* The unit holding item i of `kind`: the last unit whose first item is <= i. */
static uint32_t unit_holding(const struct kt_ffn_unit *u, uint32_t n_units, uint32_t i, enum item_kind kind)
{
    uint32_t lo = 0, hi = n_units;
    while (hi - lo > 1) {
        uint32_t mid = (lo + hi) / 2;
        if (first_item(&u[mid], kind) <= i)
            lo = mid;
        else
            hi = mid;
    }
    return lo;
}

/* Numbers every unit's pairs, gate/up tasks and down tasks (once per step,
 * before any runs, so CPU and device never race on them). */
static void plan_items(struct kt_engine *e, uint32_t n_units)
{
    uint32_t pairs = 0, gate_up = 0, down = 0;
    const int64_t E = e->hp.n_embd;
    for (uint32_t i = 0; i < n_units; i++) {
        struct kt_ffn_unit *u = &e->units[i];
        u->first_pair = pairs;
        u->first_gate_up_task = gate_up;
        u->first_down_task = down;
        pairs += u->n_pairs;
        gate_up += (uint32_t)((u->w.n_ff + GATE_UP_ROWS_PER_TASK - 1) / GATE_UP_ROWS_PER_TASK);
        down += (uint32_t)((E + DOWN_ROWS_PER_TASK - 1) / DOWN_ROWS_PER_TASK);
    }
    e->n_items[ITEMS_PAIRS] = pairs;
    e->n_items[ITEMS_GATE_UP] = gate_up;
    e->n_items[ITEMS_DOWN] = down;
}

/* Items [first of unit u0, first of unit u1) of `kind`. */
static void unit_items(const struct kt_engine *e, uint32_t u0, uint32_t u1, uint32_t n_units, enum item_kind kind,
                       uint32_t *begin, uint32_t *end)
{
    *begin = u0 < n_units ? first_item(&e->units[u0], kind) : e->n_items[kind];
    *end = u1 < n_units ? first_item(&e->units[u1], kind) : e->n_items[kind];
}

/* Rows are sliced over nodes in whole tasks (expert_store.h). */
_Static_assert(GATE_UP_ROWS_PER_TASK == KT_EXPERT_SLICE_ROWS && DOWN_ROWS_PER_TASK == KT_EXPERT_SLICE_ROWS,
               "a node's share of an expert's rows is whole tasks");

/* The unit's tasks of `kind` (gate/up or down) that part `slice` of a
 * row-sliced layer computes: [*t0, *t0 + returned). */
static int64_t slice_tasks(const struct kt_engine *e, const struct kt_ffn_unit *u, enum item_kind kind, int slice,
                           int64_t *t0)
{
    int64_t first, n;
    kt_expert_slice_rows(kind == ITEMS_GATE_UP ? u->w.n_ff : (int64_t)e->hp.n_embd, e->n_slices, slice, &first, &n);
    *t0 = first / KT_EXPERT_SLICE_ROWS;
    return (n + KT_EXPERT_SLICE_ROWS - 1) / KT_EXPERT_SLICE_ROWS;
}

/* Item l of job j's `kind` items: its unit, and in *at the item's index
 * among that unit's pairs or tasks. */
static const struct kt_ffn_unit *job_item(const struct kt_units_job *j, int64_t l, enum item_kind kind, int64_t *at)
{
    const struct kt_ffn_unit *units = j->e->units;
    if (!j->slice_first) {
        const uint32_t i = (uint32_t)(l + j->offset);
        const struct kt_ffn_unit *u = &units[unit_holding(units, j->n_units, i, kind)];
        *at = (int64_t)i - first_item(u, kind);
        return u;
    }
    uint32_t lo = 0, hi = j->n_sliced_units; /* the last unit whose first item is <= l */
    while (hi - lo > 1) {
        uint32_t mid = (lo + hi) / 2;
        if (j->slice_first[mid] <= l)
            lo = mid;
        else
            hi = mid;
    }
    const struct kt_ffn_unit *u = &units[j->u0 + lo];
    int64_t t0;
    slice_tasks(j->e, u, kind, j->slice, &t0);
    *at = t0 + (l - j->slice_first[lo]);
    return u;
}

/* Rows [r0, r0 + n) of the unit's gate (matrix 0), up (1) or down (2):
 * from the job's node's share when the expert is row-sliced. */
static struct kt_mat unit_rows(const struct kt_units_job *j, const struct kt_ffn_unit *u, int matrix, int64_t r0,
                               int64_t n)
{
    const struct kt_mat *whole = matrix == 0 ? &u->w.gate : matrix == 1 ? &u->w.up : &u->w.down;
    if (!u->sliced)
        return kt_mat_rows(*whole, r0, n);
    const struct kt_expert_slice *s = &u->layout->slice[j->node];
    struct kt_mat share = *whole;
    share.data = u->sliced->slice[j->node] + (matrix == 0   ? s->gate_offset
                                              : matrix == 1 ? s->up_offset
                                                            : s->down_offset);
    share.n_out = matrix == 2 ? s->n_out : s->n_ff;
    return kt_mat_rows(share, r0 - (matrix == 2 ? s->out_first : s->ff_first), n);
}

/* Tokens per gemm call of gate and up: the task's rows of gate and of up stay
 * in L1/L2 while blocks of this many tokens pass over them.  64: a whole chunk
 * of the amx level's tiles (kernels/cpu/amx), which lose to AVX-512 on short
 * calls; the avx512 level measured the same at 16 and 64. */
#define GATE_UP_TOKENS_PER_CALL 64

/* act[p][r] = silu(gate_r . h) * (up_r . h) for the rows of one task, every
 * pair of its unit: gate and up of a block of tokens, then SiLU and the
 * product while both results are in L1 (the fused gate/up step). */
static void gate_up_task(void *ctx, int64_t begin, int64_t end, int thread)
{
    (void)thread;
    const struct kt_units_job *j = ctx;
    const struct kt_moe_bufs *b = j->b;
    const size_t stride = b->hq_row_bytes;
    float g[GATE_UP_TOKENS_PER_CALL * GATE_UP_ROWS_PER_TASK], v[GATE_UP_TOKENS_PER_CALL * GATE_UP_ROWS_PER_TASK];
    for (int64_t l = begin; l < end; l++) {
        int64_t task;
        const struct kt_ffn_unit *u = job_item(j, l, ITEMS_GATE_UP, &task);
        const int64_t r0 = task * GATE_UP_ROWS_PER_TASK;
        const int64_t n = r0 + GATE_UP_ROWS_PER_TASK < u->w.n_ff ? GATE_UP_ROWS_PER_TASK : u->w.n_ff - r0;
        const struct kt_mat gate = unit_rows(j, u, 0, r0, n), up = unit_rows(j, u, 1, r0, n);
        const uint8_t *pairs_up = u->up_shares_gate_rows ? b->hq_pairs_gate : b->hq_pairs_up;
        const uint32_t p_end = u->first_pair + u->n_pairs;
        for (uint32_t p0 = u->first_pair; p0 < p_end; p0 += GATE_UP_TOKENS_PER_CALL) {
            const int64_t nt = p_end - p0 < GATE_UP_TOKENS_PER_CALL ? p_end - p0 : GATE_UP_TOKENS_PER_CALL;
            kt_mat_gemm(&gate, b->hq_pairs_gate + (size_t)p0 * stride, stride, nt, g, n);
            kt_mat_gemm(&up, pairs_up + (size_t)p0 * stride, stride, nt, v, n);
            for (int64_t t = 0; t < nt; t++) {
                float *act = b->act + (size_t)(p0 + t) * b->act_stride + r0;
                for (int64_t r = 0; r < n; r++)
                    act[r] = kt_silu(g[t * n + r]) * v[t * n + r];
            }
        }
    }
}

/* hq_pairs_gate[p] (and hq_pairs_up[p] where up has its own format) = h of
 * pair p's token as quantized for its unit. */
static void gather_task(void *ctx, int64_t begin, int64_t end, int thread)
{
    (void)thread;
    const struct kt_units_job *j = ctx;
    const struct kt_engine *e = j->e;
    const struct kt_moe_bufs *b = j->b;
    const size_t stride = b->hq_row_bytes;
    for (int64_t l = begin; l < end; l++) {
        int64_t at;
        const struct kt_ffn_unit *u = job_item(j, l, ITEMS_PAIRS, &at);
        const size_t p = u->first_pair + (size_t)at;
        const uint32_t t = e->pair_token[p];
        memcpy(b->hq_pairs_gate + p * stride, u->hq_gate + (size_t)t * u->hq_gate_row_bytes, u->hq_gate_row_bytes);
        if (!u->up_shares_gate_rows)
            memcpy(b->hq_pairs_up + p * stride, u->hq_up + (size_t)t * u->hq_up_row_bytes, u->hq_up_row_bytes);
    }
}

/* act_q[p] = act[p] in the down projection's activation type. */
static void quantize_act_task(void *ctx, int64_t begin, int64_t end, int thread)
{
    (void)thread;
    const struct kt_units_job *j = ctx;
    const struct kt_moe_bufs *b = j->b;
    for (int64_t l = begin; l < end; l++) {
        int64_t at;
        const struct kt_ffn_unit *u = job_item(j, l, ITEMS_PAIRS, &at);
        const size_t p = u->first_pair + (size_t)at;
        kt_quantize_rows(NULL, u->w.down.type, b->act + p * b->act_stride, 1, u->w.n_ff,
                         b->act_q + p * b->act_q_stride);
    }
}

/* pair_out[p][r] = down_r . act_q[p] for the rows of one task, every pair of its unit in one gemm. */
static void down_task(void *ctx, int64_t begin, int64_t end, int thread)
{
    (void)thread;
    const struct kt_units_job *j = ctx;
    const struct kt_moe_bufs *b = j->b;
    const int64_t E = j->e->hp.n_embd;
    for (int64_t l = begin; l < end; l++) {
        int64_t task;
        const struct kt_ffn_unit *u = job_item(j, l, ITEMS_DOWN, &task);
        const int64_t r0 = task * DOWN_ROWS_PER_TASK;
        const int64_t n = r0 + DOWN_ROWS_PER_TASK < E ? DOWN_ROWS_PER_TASK : E - r0;
        const struct kt_mat down = unit_rows(j, u, 2, r0, n);
        kt_mat_gemm(&down, b->act_q + (size_t)u->first_pair * b->act_q_stride, b->act_q_stride, u->n_pairs,
                    b->pair_out + (size_t)u->first_pair * E + r0, E);
    }
}

/* h (T, E) quantized for weight type `type` (rows packed at that format's
 * size) into one of b->hq, once per activation format per step (gate and up
 * of routed and shared experts take at most four formats). */
static const uint8_t *quantized_h(struct kt_engine *e, struct kt_pool *pool, const struct kt_moe_bufs *b,
                                  const float *h, int type, int *slot_types, int *n_slots)
{
    const int act_type = kt_mat_kernels_for(type)->vec_dot_type;
    for (int i = 0; i < *n_slots; i++)
        if (slot_types[i] == act_type)
            return b->hq[i];
    int i = (*n_slots)++;
    slot_types[i] = act_type;
    kt_quantize_rows(pool, type, h, e->n_tokens, e->hp.n_embd, b->hq[i]);
    return b->hq[i];
}

/* Where a range of units runs: group g's units [first[g], first[g + 1]) on
 * pool[g], all groups at once, the calling thread helping group 0's pool (the
 * step's pool always; a node pool when e->help_first_pool);
 * pool NULL: one group, on the calling thread alone (a device's queue).
 * sliced (a layer's row-sliced experts): every group works on units
 * [first[0], first[1]): an even share of their pairs, and its part of each
 * one's tasks. */
struct unit_groups {
    int n;
    struct kt_pool *const *pool; /* [n] */
    const uint32_t *first;       /* [n + 1] */
    struct kt_units_job *jobs;   /* [n] */
    bool sliced;
};

/* The units [*u0, *u1) of all of g's groups. */
static void group_units(const struct unit_groups *g, uint32_t *u0, uint32_t *u1)
{
    *u0 = g->first[0];
    *u1 = g->first[g->sliced ? 1 : g->n];
}

/* fn on its items, the time it took added to the step's CPU expert busy
 * time (every CPU thread's, so a fully busy step of n threads counts n x its
 * wall time) and to its node's. */
static void timed_task(void *ctx, int64_t begin, int64_t end, int thread)
{
    const struct kt_units_job *j = ctx;
    const uint64_t t0 = kt_fwd_now_ns();
    j->fn(ctx, begin, end, thread);
    const uint64_t ns = kt_fwd_now_ns() - t0;
    __atomic_add_fetch(&j->e->stats.cpu_experts_busy_ns, ns, __ATOMIC_RELAXED);
    if (thread >= 0 && thread < 16)
        __atomic_add_fetch(&j->e->stats.thread_busy_ns[thread], ns, __ATOMIC_RELAXED);
    if (j->node >= 0 && j->node < 16) {
        __atomic_add_fetch(&j->e->stats.node_busy_ns[j->node], ns, __ATOMIC_RELAXED);
        __atomic_add_fetch(&j->e->step_node_busy[j->node], ns, __ATOMIC_RELAXED);
    }
}

/* Group i's job in a row-sliced layer, its item count returned: an even
 * share of the units' pairs, or its part of each unit's tasks (numbered in
 * its slice_first). */
static int64_t sliced_job(struct kt_engine *e, const struct kt_moe_bufs *b, const struct unit_groups *g, int i,
                          uint32_t n_units, enum item_kind kind, kt_pool_fn fn)
{
    uint32_t u0, u1;
    group_units(g, &u0, &u1);
    struct kt_units_job *j = &g->jobs[i];
    uint32_t begin, end;
    unit_items(e, u0, u1, n_units, kind, &begin, &end);
    *j = (struct kt_units_job){.e = e, .b = b, .n_units = n_units, .offset = begin, .fn = fn};
    if (kind == ITEMS_PAIRS) {
        const int64_t n = (int64_t)end - begin;
        j->offset = begin + n * i / g->n;
        return begin + n * (i + 1) / g->n - j->offset;
    }
    const int slice = e->pool_slice[i];
    if (slice < 0)
        return 0;
    uint32_t *first = e->slice_first + (size_t)i * (e->hp.n_expert + 2);
    int64_t items = 0;
    for (uint32_t u = u0; u < u1; u++) {
        int64_t t0;
        first[u - u0] = (uint32_t)items;
        items += slice_tasks(e, &e->units[u], kind, slice, &t0);
    }
    j->slice_first = first;
    j->u0 = u0;
    j->n_sliced_units = u1 - u0;
    j->slice = slice; /* run_phase sets j->node: the pool's, whose shares it reads */
    return items;
}

/* One phase over the items of every group's units. */
static void run_phase(struct kt_engine *e, const struct kt_moe_bufs *b, const struct unit_groups *g, uint32_t n_units,
                      enum item_kind kind, kt_pool_fn fn)
{
    for (int i = 0; i < g->n; i++) {
        int64_t n_items;
        if (g->sliced) {
            n_items = sliced_job(e, b, g, i, n_units, kind, fn);
        } else {
            uint32_t begin, end;
            unit_items(e, g->first[i], g->first[i + 1], n_units, kind, &begin, &end);
            g->jobs[i] = (struct kt_units_job){.e = e, .b = b, .n_units = n_units, .offset = begin, .fn = fn};
            n_items = (int64_t)end - begin;
        }
        g->jobs[i].node = g->pool ? kt_pool_node(g->pool[i]) : -1;
        if (g->pool)
            kt_pool_submit(g->pool[i], n_items, 1, timed_task, &g->jobs[i]);
        else
            fn(&g->jobs[i], 0, n_items, 0); /* the device's thread: not a CPU pool */
    }
    if (!g->pool)
        return;
    if (g->pool[0] == e->pool || e->help_first_pool) /* the step pool counts its caller */
        kt_pool_help(g->pool[0]);
    for (int i = 0; i < g->n; i++)
        kt_pool_wait(g->pool[i]);
}

/* Runs the groups' units of the step's n_units (planned by plan_items):
 * b->pair_out[p] = FFN_unit(h[pair_token[p]]) for their pairs, with h and
 * every buffer in b. */
static void run_units(struct kt_engine *e, const struct kt_moe_bufs *b, const float *h, const struct unit_groups *g,
                      uint32_t n_units)
{
    uint32_t u0, u1;
    group_units(g, &u0, &u1);
    if (u0 >= u1)
        return;
    int slot_types[4], n_slots = 0;
    struct kt_pool *pool = g->pool ? e->pool : NULL;
    for (uint32_t i = u0; i < u1; i++) {
        struct kt_ffn_unit *u = &e->units[i];
        u->hq_gate = quantized_h(e, pool, b, h, u->w.gate.type, slot_types, &n_slots);
        u->hq_up = quantized_h(e, pool, b, h, u->w.up.type, slot_types, &n_slots);
        u->hq_gate_row_bytes = kt_act_row_bytes(u->w.gate.type, e->hp.n_embd);
        u->hq_up_row_bytes = kt_act_row_bytes(u->w.up.type, e->hp.n_embd);
        u->up_shares_gate_rows = u->hq_up == u->hq_gate;
    }
    run_phase(e, b, g, n_units, ITEMS_PAIRS, gather_task);
    run_phase(e, b, g, n_units, ITEMS_GATE_UP, gate_up_task);
    run_phase(e, b, g, n_units, ITEMS_PAIRS, quantize_act_task);
    run_phase(e, b, g, n_units, ITEMS_DOWN, down_task);
}

/* Weight bytes the units [0, n_units) read this step. */
static void count_weight_bytes(struct kt_engine *e, uint32_t n_units)
{
    for (uint32_t i = 0; i < n_units; i++) {
        const struct kt_ffn_unit *u = &e->units[i];
        e->stats.weight_bytes += kt_mat_bytes(&u->w.gate) + kt_mat_bytes(&u->w.up) + kt_mat_bytes(&u->w.down);
    }
}

/* The device's part of a step, run on its queue: units [u0, u1) with the
 * h it was sent, into its buffers. */
void kt_fwd_run_device_part(void *ctx)
{
    const struct kt_device_part *d = ctx;
    const uint32_t first[2] = {d->u0, d->n_units};
    struct kt_units_job job;
    run_units(d->e, &d->e->dev.bufs, d->e->dev.h, &(struct unit_groups){.n = 1, .first = first, .jobs = &job},
              d->n_units);
}

/* ---- the layer ---------------------------------------------------------------------- */

bool kt_fwd_expert_on_device(const struct kt_engine *e, uint32_t il, uint32_t x)
{
    return e->dev.experts && e->dev.experts[(size_t)il * e->hp.n_expert + x].n_ff > 0;
}

/* Expert x's slabs of the stacked tensors, or its buffer in the expert store
 * ([gate | up | down] adjacent, each in the GGUF layout or repacked for the
 * kernel level in use: same types and row counts either way), or its GGUF
 * slabs copied to the device; on the CPU, the copy on `node` if any. */
struct kt_ffn_weights kt_fwd_expert_gguf(const struct kt_engine *e, const struct kt_layer_weights *L, uint32_t x)
{
    const int64_t f = e->hp.n_ff_exp, E = e->hp.n_embd;
    struct kt_ffn_weights w = {.n_ff = f};
    if (L->gate_up_fused) { /* ffn_gate_up_exps: expert x holds 2f rows, gate then up */
        w.gate = kt_mat_rows(L->gate_exps, x * 2 * f, f);
        w.up = kt_mat_rows(L->gate_exps, x * 2 * f + f, f);
    } else {
        w.gate = kt_mat_rows(L->gate_exps, x * f, f);
        w.up = kt_mat_rows(L->up_exps, x * f, f);
    }
    w.down = kt_mat_rows(L->down_exps, x * E, E);
    return w;
}

static struct kt_ffn_weights expert_weights(const struct kt_engine *e, uint32_t il, const struct kt_layer_weights *L,
                                            uint32_t x, int node)
{
    struct kt_ffn_weights w = kt_fwd_expert_gguf(e, L, x);
    if (kt_fwd_expert_on_device(e, il, x))
        return e->dev.experts[(size_t)il * e->hp.n_expert + x];
    if (e->experts) {
        const struct kt_stored_expert *se = kt_expert_store_expert(e->experts, il, x);
        const uint8_t *data = node >= 0 && node < KT_EXPERT_MAX_NODES && se->copy[node] ? se->copy[node] : se->data;
        const struct kt_expert_layout *lay = kt_expert_store_layout(e->experts, il);
        w.gate.data = data ? data + lay->gate_offset : NULL; /* NULL: sliced, the unit reads each node's share */
        w.up.data = data ? data + lay->up_offset : NULL;
        w.down.data = data ? data + lay->down_offset : NULL;
        w.gate.packed = lay->gate_packed;
        w.up.packed = lay->up_packed;
        w.down.packed = lay->down_packed;
    }
    return w;
}

/* Experts of layer il row-sliced over the node pools now: all of them, or
 * some while the rebalancer slices the layer in parts (or makes it whole). */
static uint32_t sliced_experts(const struct kt_engine *e, uint32_t il)
{
    return e->n_slices > 1 && e->experts ? kt_expert_store_layout(e->experts, il)->n_sliced : 0;
}

/* True if expert x of layer il is row-sliced (in a layer with sliced experts). */
static bool expert_sliced(const struct kt_engine *e, uint32_t il, uint32_t x)
{
    return kt_expert_store_expert(e->experts, il, x)->data == NULL;
}

/* Pools for the step's active CPU experts (expert_pairs[x] > 0), largest token
 * groups first: each to the least loaded pool holding a copy of it (its
 * home's on ties, then the lowest pool), so replicas spread a hot expert's
 * neighbours away from its node.  A pool's load counts what its units cost:
 * each expert's pairs plus KT_READ_PAIRS for reading its weights once, and on
 * the first pool the shared experts when the CPU runs them (T pairs, and their
 * reads in experts' bytes): at decode one read is most of an expert's time,
 * and the shared expert is the step's biggest unit.  Deterministic for a given
 * routing; which copy runs never changes a result (the copies are the same
 * bytes). */
#define KT_READ_PAIRS 8 /* tokens whose multiply-adds take about one read of an expert's weights */
static void choose_pools(struct kt_engine *e, uint32_t il, const struct kt_layer_weights *L, bool shared_on_cpu,
                         bool skip_sliced)
{
    const uint32_t Ne = e->hp.n_expert;
    const int n_pools = e->n_pools;
    uint32_t n_active = 0;
    for (uint32_t x = 0; x < Ne; x++)
        if (e->expert_pairs[x] && !kt_fwd_expert_on_device(e, il, x) && !(skip_sliced && expert_sliced(e, il, x)))
            e->active_experts[n_active++] = x;
    /* insertion sort by pairs, descending (few active experts in decode, at most Ne) */
    for (uint32_t i = 1; i < n_active; i++)
        for (uint32_t j = i; j > 0 && e->expert_pairs[e->active_experts[j]] > e->expert_pairs[e->active_experts[j - 1]];
             j--) {
            uint32_t t = e->active_experts[j];
            e->active_experts[j] = e->active_experts[j - 1];
            e->active_experts[j - 1] = t;
        }
    for (int g = 0; g < n_pools; g++)
        e->pool_load[g] = 0;
    if (shared_on_cpu && n_active) {
        const struct kt_ffn_weights x0 = kt_fwd_expert_gguf(e, L, e->active_experts[0]);
        const uint64_t xb = kt_mat_bytes(&x0.gate) + kt_mat_bytes(&x0.up) + kt_mat_bytes(&x0.down);
        const uint64_t sb = kt_mat_bytes(&L->shared.gate) + kt_mat_bytes(&L->shared.up) + kt_mat_bytes(&L->shared.down);
        e->pool_load[0] = e->n_tokens + (xb ? KT_READ_PAIRS * sb / xb : 0);
    }
    for (uint32_t i = 0; i < n_active; i++) {
        const uint32_t x = e->active_experts[i];
        const struct kt_stored_expert *se = e->experts ? kt_expert_store_expert(e->experts, il, x) : NULL;
        const int home = se && se->home_node >= 0 && se->home_node < e->topo->n_nodes ? se->home_node : 0;
        int best = e->node_pool[home];
        for (int g = 0; se && g < n_pools; g++) {
            const int node = kt_pool_node(e->expert_pools[g]);
            if (node >= 0 && node < KT_EXPERT_MAX_NODES && se->copy[node] && e->pool_load[g] < e->pool_load[best])
                best = g;
        }
        e->expert_pool_of[x] = best;
        e->pool_load[best] += e->expert_pairs[x] + KT_READ_PAIRS;
        const int node = kt_pool_node(e->expert_pools[best]);
        if (node >= 0 && node < 16) {
            e->stats.node_pairs[node] += e->expert_pairs[x];
            e->layer_stats[il].node_pairs[node] += e->expert_pairs[x];
        }
    }
}

/* This step's busiest node pool and the pools' mean busy time in layer il,
 * added to its stats (every pool with a node counts, idle ones too). */
static void note_node_balance(struct kt_engine *e, uint32_t il)
{
    struct kt_engine_layer_stats *ls = &e->layer_stats[il];
    uint64_t max = 0, sum = 0;
    int n = 0;
    for (int g = 0; g < e->n_pools; g++) {
        const int node = kt_pool_node(e->expert_pools[g]);
        if (node < 0 || node >= 16)
            continue;
        const uint64_t ns = e->step_node_busy[node];
        ls->node_busy_ns[node] += ns;
        max = ns > max ? ns : max;
        sum += ns;
        n++;
    }
    if (n > 0) {
        ls->node_busy_max_ns += max;
        ls->node_busy_mean_ns += sum / (uint64_t)n;
    }
}

/* The pair counts of a layer's row-sliced experts: every slice node runs its
 * share of every pair of the step's sliced CPU experts. */
static void count_sliced_pairs(struct kt_engine *e, uint32_t il)
{
    uint64_t pairs = 0;
    for (uint32_t x = 0; x < e->hp.n_expert; x++)
        if (!kt_fwd_expert_on_device(e, il, x) && expert_sliced(e, il, x))
            pairs += e->expert_pairs[x];
    for (int g = 0; g < e->n_pools; g++) {
        const int node = kt_pool_node(e->expert_pools[g]);
        if (e->pool_slice[g] >= 0 && node >= 0 && node < 16) {
            e->stats.node_pairs[node] += pairs;
            e->layer_stats[il].node_pairs[node] += pairs;
        }
    }
}

/* The device part's units on the GPU (a kt_backend_cuda_fn). */
static kt_status cuda_device_part(void *ctx, void *stream, kt_err *err)
{
    const struct kt_device_part *d = ctx;
    struct kt_engine *e = d->e;
    return kt_cuda_ffn_units(e->dev.cuda_units, d->n_units - d->u0, e->dev.h, (int64_t)e->n_tokens, (int64_t)e->hp.n_embd,
                             e->dev.pair_token, e->n_items[ITEMS_PAIRS], e->dev.bufs.act,
                             (int64_t)e->dev.bufs.act_stride, e->dev.bufs.pair_out, stream, err);
}

/* Runs the step's n_units (planned): units [dev0, n_units) on the device -
 * queued first (h in unless h_on_device, its units, their outputs back) -
 * and the CPU's units [0, dev0) while the device works: first the sliced
 * experts' in `sliced` (NULL: none), then the rest in `cpu`'s groups;
 * returns once both are done (so the device's work may point at this frame). */
static void run_split(struct kt_engine *e, const float *h, bool h_on_device, uint32_t n_units,
                      const struct unit_groups *sliced, const struct unit_groups *cpu, int cache_layer)
{
    const uint32_t dev0 = cpu->first[cpu->n];
    const size_t T = e->n_tokens, E = e->hp.n_embd;
    const bool device_work = dev0 < n_units;
    const bool cache = cache_layer >= 0 && e->dev.cache;
    struct kt_backend_stats before = {0};
    if (cache)
        kt_backend_stats(e->dev.backend, &before);
    struct kt_device_part part = {e, dev0, n_units};
    if (device_work) {
        const uint32_t p0 = e->units[dev0].first_pair, n_pairs = e->n_items[ITEMS_PAIRS];
        for (uint32_t i = dev0; i < n_units; i++) { /* the same units as the CUDA kernels take them */
            const struct kt_ffn_unit *u = &e->units[i];
            e->dev.cuda_units[i - dev0].gate = kt_fwd_cuda_mat(&u->w.gate);
            e->dev.cuda_units[i - dev0].up = kt_fwd_cuda_mat(&u->w.up);
            e->dev.cuda_units[i - dev0].down = kt_fwd_cuda_mat(&u->w.down);
            e->dev.cuda_units[i - dev0].first_pair = u->first_pair;
            e->dev.cuda_units[i - dev0].n_pairs = u->n_pairs;
        }
        if (!h_on_device)
            kt_backend_copy_in(e->dev.backend, e->dev.h, h, T * E * sizeof(float));
        kt_backend_copy_in(e->dev.backend, e->dev.pair_token, e->pair_token, (size_t)n_pairs * sizeof *e->pair_token);
        kt_backend_run(e->dev.backend, kt_fwd_run_device_part, &part, cuda_device_part, &part);
        e->stats.device_pairs += n_pairs - p0;
    }
    if (cache) /* rides in the queue's idle time while the CPU computes the misses */
        kt_cache_copy(e, (uint32_t)cache_layer);
    const uint64_t c0 = kt_fwd_now_ns();
    if (sliced)
        run_units(e, &e->bufs, h, sliced, n_units);
    run_units(e, &e->bufs, h, cpu, n_units);
    const uint64_t cpu_ns = kt_fwd_now_ns() - c0;
    if (device_work || cache) {
        /* queued after the CPU's units: a copy into pageable memory (if
         * page-locking was refused) holds the host until it is done */
        if (device_work) {
            const uint32_t p0 = e->units[dev0].first_pair, n_pairs = e->n_items[ITEMS_PAIRS];
            kt_backend_copy_out(e->dev.backend, e->bufs.pair_out + (size_t)p0 * E,
                                e->dev.bufs.pair_out + (size_t)p0 * E, (size_t)(n_pairs - p0) * E * sizeof(float));
        }
        const uint64_t w0 = kt_fwd_now_ns();
        kt_backend_sync(e->dev.backend); /* also ends the chunk's copy, so its staging is free again */
        e->stats.device_wait_ns += kt_fwd_now_ns() - w0;
    }
    if (cache) {
        struct kt_backend_stats after;
        kt_backend_stats(e->dev.backend, &after);
        kt_cache_measure(e, (uint32_t)cache_layer, cpu_ns, after.busy_ns - before.busy_ns);
    }
}

static void dense_ffn(struct kt_engine *e, uint32_t il, const struct kt_layer_weights *L, const float *h, float *out)
{
    const uint32_t T = e->n_tokens, E = e->hp.n_embd;
    kt_fwd_set_act_strides(e, false);
    const bool device = e->dev.dense != NULL;
    e->units[0] = (struct kt_ffn_unit){.w = device ? e->dev.dense[il] : L->dense, .first_pair = 0, .n_pairs = T};
    for (uint32_t t = 0; t < T; t++)
        e->pair_token[t] = t;
    plan_items(e, 1);
    count_weight_bytes(e, 1);
    const uint32_t first[2] = {0, device ? 0 : 1};
    struct kt_units_job job;
    run_split(e, h, false, 1, NULL, &(struct unit_groups){.n = 1, .pool = &e->pool, .first = first, .jobs = &job}, -1);
    memcpy(out, e->bufs.pair_out, (size_t)T * E * sizeof(float));
}

/* experts and weights (T, k) of h (T, E) by L's router, logits (T, Ne) in between. */
static void route(struct kt_engine *e, const struct kt_layer_weights *L, const float *h, float *logits,
                  uint32_t *experts, float *weights)
{
    const uint32_t T = e->n_tokens, Ne = e->hp.n_expert, k = e->router.n_used;
    kt_fwd_matmul(e, &L->router, h, T, logits, e->xq);
    for (uint32_t t = 0; t < T; t++)
        kt_moe_route(&e->router, logits + (size_t)t * Ne, L->exp_probs_b, experts + (size_t)t * k,
                     weights + (size_t)t * k, e->router_scratch);
}

void kt_fwd_route_on_device(struct kt_engine *e, uint32_t il)
{
    const struct kt_layer_weights *L = &e->dev.layers[il];
    const uint32_t E = e->hp.n_embd;
    for (uint32_t t = 0; t < e->n_tokens; t++)
        kt_rmsnorm(e->dev.h + (size_t)t * E, e->dev.x + (size_t)t * E, L->ffn_norm, E, e->hp.rms_eps);
    route(e, L, e->dev.h, e->dev.router_logits, e->dev.route_experts, e->dev.route_weights);
}

/* The router's logits take the GEMV path on the GPU (F32 activations and
 * sums): a BF16 product would move near-tied experts' logits enough to pick
 * others than the CPU does. */
kt_status kt_fwd_route_on_cuda(struct kt_engine *e, uint32_t il, void *stream, kt_err *err)
{
    const struct kt_layer_weights *L = &e->dev.layers[il];
    const int64_t T = e->n_tokens, E = e->hp.n_embd;
    const struct kt_cuda_mat w = kt_fwd_cuda_mat(&L->router);
    const struct kt_router *r = &e->router;
    const struct kt_cuda_router cr = {r->n_expert, r->n_used, r->n_groups, r->n_group_used, (int)r->gating, r->norm,
                                      r->scale};
    kt_status st;
    if ((st = kt_cuda_rmsnorm(e->dev.h, E, e->dev.x, E, L->ffn_norm, T, E, e->hp.rms_eps, stream, err)) != KT_OK ||
        (st = kt_cuda_matmul(&w, e->dev.h, T, e->dev.router_logits, KT_CUDA_MATMUL_GEMV, stream, err)) != KT_OK)
        return st;
    return kt_cuda_route(&cr, e->dev.router_logits, L->exp_probs_b, T, e->dev.route_experts, e->dev.route_weights,
                         stream, err);
}

static void moe_ffn(struct kt_engine *e, uint32_t il, const struct kt_layer_weights *L, const float *h, float *out)
{
    const uint32_t T = e->n_tokens, E = e->hp.n_embd, Ne = e->hp.n_expert, k = e->router.n_used;
    kt_fwd_set_act_strides(e, true);

    /* Router: logits (T, Ne) -> experts and weights (T, k); with attention
     * on the device it ran there, h and the routing came back with x. */
    uint64_t t0 = kt_fwd_now_ns();
    const bool routed_on_device = e->dev.layers != NULL;
    if (!routed_on_device)
        route(e, L, h, e->router_logits, e->route_experts, e->route_weights);
    uint64_t t1 = kt_fwd_now_ns();
    e->stats.router_ns += t1 - t0;

    /* Group (token, expert) pairs by expert, tokens in batch order within
     * each; experts by the pool that runs them, in id order within it, the
     * device's experts last; the shared experts serve every token after the
     * first group's experts, or the device's.
     * A layer's row-sliced experts (and then the shared experts) come first,
     * one group which every pool runs its part of.
     * The order of units changes no sum: the combine below follows pair_of
     * in selection order. */
    memset(e->expert_pairs, 0, Ne * sizeof *e->expert_pairs);
    for (uint32_t i = 0; i < T * k; i++)
        e->expert_pairs[e->route_experts[i]]++;
    if (e->dev.cache)
        kt_cache_route(e, il);
    const bool sliced = sliced_experts(e, il) > 0;
    const bool all_sliced = sliced && kt_expert_store_layout(e->experts, il)->sliced;
    const bool shared = L->shared.n_ff > 0;
    const bool shared_on_device = shared && e->dev.shared;
    if (sliced)
        count_sliced_pairs(e, il);
    if (!all_sliced)
        choose_pools(e, il, L, shared && !shared_on_device && !sliced, sliced);
    uint32_t n_units = 0, n_pairs = 0, shared_pair = 0, dev0 = 0, sliced_first[2] = {0, 0};
    for (int g = -1; g <= e->n_pools; g++) { /* -1: the sliced experts, on every pool; n_pools: the device */
        const bool device = g == e->n_pools, slices = g < 0;
        if (device)
            dev0 = n_units;
        else if (!slices)
            e->pool_units[g] = n_units;
        for (uint32_t x = 0; (!slices || sliced) && x < Ne; x++) {
            if (!e->expert_pairs[x] || kt_fwd_expert_on_device(e, il, x) != device ||
                (!device && sliced && expert_sliced(e, il, x) != slices) ||
                (!device && !slices && e->expert_pool_of[x] != g))
                continue;
            const int node = device || slices ? -1 : kt_pool_node(e->expert_pools[g]);
            e->expert_unit[x] = n_units;
            e->stats.device_routed_pairs += device ? e->expert_pairs[x] : 0;
            e->units[n_units++] = (struct kt_ffn_unit){
                .w = expert_weights(e, il, L, x, node),
                .first_pair = n_pairs,
                .sliced = slices ? kt_expert_store_expert(e->experts, il, x) : NULL,
                .layout = slices ? kt_expert_store_layout(e->experts, il) : NULL};
            n_pairs += e->expert_pairs[x];
        }
        /* the shared experts: with the sliced experts if any (every pool
         * runs its rows), else with the first pool's */
        if (shared && (device ? shared_on_device : !shared_on_device && (sliced ? slices : g == 0))) {
            shared_pair = n_pairs;
            e->units[n_units++] = (struct kt_ffn_unit){
                .w = device ? e->dev.shared[il] : L->shared, .first_pair = n_pairs, .n_pairs = T};
            for (uint32_t t = 0; t < T; t++)
                e->pair_token[n_pairs + t] = t;
            n_pairs += T;
        }
        if (slices)
            sliced_first[1] = n_units;
    }
    e->pool_units[e->n_pools] = dev0;
    for (uint32_t i = 0; i < T * k; i++) {
        struct kt_ffn_unit *u = &e->units[e->expert_unit[e->route_experts[i]]];
        uint32_t p = u->first_pair + u->n_pairs++;
        e->pair_token[p] = i / k;
        e->pair_of[i] = p;
    }
    plan_items(e, n_units);
    count_weight_bytes(e, n_units);

    memset(e->step_node_busy, 0, sizeof e->step_node_busy);
    const struct unit_groups slice_groups = {e->n_pools, e->expert_pools, sliced_first, e->pool_jobs, true};
    run_split(e, h, routed_on_device, n_units, sliced ? &slice_groups : NULL,
              &(struct unit_groups){e->n_pools, e->expert_pools, e->pool_units, e->pool_jobs, false}, (int)il);
    if (e->n_pools > 1)
        note_node_balance(e, il);

    /* out = sum_j w_j Expert_j(h) in selection order, then + Shared(h) (kt_axpy_f32's bits). */
    void (*const axpy)(float *, float, const float *, int64_t) = kt_cpu_kernels()->f32.axpy;
    for (uint32_t t = 0; t < T; t++) {
        float *o = out + (size_t)t * E;
        memset(o, 0, E * sizeof(float));
        for (uint32_t j = 0; j < k; j++)
            axpy(o, e->route_weights[t * k + j], e->bufs.pair_out + (size_t)e->pair_of[t * k + j] * E, E);
        if (shared)
            axpy(o, 1.0f, e->bufs.pair_out + (size_t)(shared_pair + t) * E, E);
    }
    e->stats.experts_ns += kt_fwd_now_ns() - t1;
}

void kt_fwd_ffn(struct kt_engine *e, uint32_t il, const float *h, float *out)
{
    const struct kt_layer_weights *L = &e->layers[il];
    if (L->is_moe) {
        moe_ffn(e, il, L, h, out);
    } else {
        uint64_t t0 = kt_fwd_now_ns();
        dense_ffn(e, il, L, h, out);
        e->stats.other_ns += kt_fwd_now_ns() - t0;
    }
}
