/*
 * moe.c - the FFN half of a layer for every token of a step: the dense
 * SwiGLU of the leading layers, or DeepSeek MoE (router, routed experts,
 * shared experts) after them (reference/deepseek2.md §4.5).
 *
 *     FFN(h)  = W_down (silu(W_gate h) * (W_up h))
 *     MoE(h)  = sum_j w_j Expert_{idx_j}(h)     (selection order)  + Shared(h)
 *
 * Tokens are grouped by expert before any weight is read, so an expert's
 * rows stream from memory once per step however many tokens chose it
 * (DESIGN §2).  Work is split into (expert, row-slice) tasks, each running
 * its expert's whole token group through one tiled product (the packed
 * kernel when the expert store repacked the expert): gate and up together,
 * SiLU fused, then down.  Routed experts run on the NUMA pool of their home
 * node, all pools at once, the stepping thread helping the first (or on the
 * step's thread pool, experts_on_threadpool); the shared experts go with the
 * first pool, dense FFNs stay on the thread pool.  Every (token, expert) product is computed the same
 * way whatever else is in the batch, and sums run in selection order, so a
 * token's output never depends on its batch.  Nothing here allocates.
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

#define GATE_UP_ROWS_PER_TASK 16
#define DOWN_ROWS_PER_TASK 32

/* The unit holding task i (by_task) or pair i: the last unit whose first
 * task (pair) is <= i; units are in order of both. */
static uint32_t unit_holding(const struct kt_ffn_unit *u, uint32_t n_units, uint32_t i, bool by_task)
{
    uint32_t lo = 0, hi = n_units;
    while (hi - lo > 1) {
        uint32_t mid = (lo + hi) / 2;
        if ((by_task ? u[mid].first_task : u[mid].first_pair) <= i)
            lo = mid;
        else
            hi = mid;
    }
    return lo;
}

/* Assigns each unit its tasks of rows_per_task rows (of n_ff, or of E for down). */
static uint32_t plan_tasks(struct kt_ffn_unit *units, uint32_t n_units, uint32_t rows_per_task, int64_t down_rows)
{
    uint32_t n = 0;
    for (uint32_t i = 0; i < n_units; i++) {
        int64_t rows = down_rows ? down_rows : units[i].w.n_ff;
        units[i].first_task = n;
        n += (uint32_t)((rows + rows_per_task - 1) / rows_per_task);
    }
    return n;
}

/* Tokens per gemm call of gate and up: the task's 16 rows of gate and of up
 * stay in L1/L2 while blocks of this many tokens pass over them. */
#define GATE_UP_TOKENS_PER_CALL 16

/* act[p][r] = silu(gate_r . h) * (up_r . h) for the rows of one task, every
 * pair of its unit: gate and up of a block of tokens, then SiLU and the
 * product while both results are in L1 (the fused gate/up step). */
static void gate_up_task(void *ctx, int64_t begin, int64_t end, int thread)
{
    (void)thread;
    const struct kt_units_job *j = ctx;
    struct kt_engine *e = j->e;
    const size_t stride = e->hq_max_row_bytes;
    float g[GATE_UP_TOKENS_PER_CALL * GATE_UP_ROWS_PER_TASK], v[GATE_UP_TOKENS_PER_CALL * GATE_UP_ROWS_PER_TASK];
    for (int64_t i = begin + j->offset; i < end + j->offset; i++) {
        const struct kt_ffn_unit *u = &e->units[unit_holding(e->units, j->n_units, (uint32_t)i, true)];
        const int64_t r0 = ((int64_t)i - u->first_task) * GATE_UP_ROWS_PER_TASK;
        const int64_t n = r0 + GATE_UP_ROWS_PER_TASK < u->w.n_ff ? GATE_UP_ROWS_PER_TASK : u->w.n_ff - r0;
        const struct kt_mat gate = kt_mat_rows(u->w.gate, r0, n), up = kt_mat_rows(u->w.up, r0, n);
        const uint32_t p_end = u->first_pair + u->n_pairs;
        for (uint32_t p0 = u->first_pair; p0 < p_end; p0 += GATE_UP_TOKENS_PER_CALL) {
            const int64_t nt = p_end - p0 < GATE_UP_TOKENS_PER_CALL ? p_end - p0 : GATE_UP_TOKENS_PER_CALL;
            kt_mat_gemm(&gate, e->hq_pairs_gate + (size_t)p0 * stride, stride, nt, g, n);
            kt_mat_gemm(&up, u->pairs_up + (size_t)p0 * stride, stride, nt, v, n);
            for (int64_t t = 0; t < nt; t++) {
                float *act = e->act + (size_t)(p0 + t) * e->act_stride + r0;
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
    struct kt_engine *e = j->e;
    const size_t stride = e->hq_max_row_bytes;
    for (int64_t p = begin + j->offset; p < end + j->offset; p++) {
        const struct kt_ffn_unit *u = &e->units[unit_holding(e->units, j->n_units, (uint32_t)p, false)];
        const uint32_t t = e->pair_token[p];
        memcpy(e->hq_pairs_gate + (size_t)p * stride, u->hq_gate + (size_t)t * u->hq_gate_row_bytes,
               u->hq_gate_row_bytes);
        if (u->pairs_up != e->hq_pairs_gate)
            memcpy(e->hq_pairs_up + (size_t)p * stride, u->hq_up + (size_t)t * u->hq_up_row_bytes,
                   u->hq_up_row_bytes);
    }
}

/* act_q[p] = act[p] in the down projection's activation type. */
static void quantize_act_task(void *ctx, int64_t begin, int64_t end, int thread)
{
    (void)thread;
    const struct kt_units_job *j = ctx;
    struct kt_engine *e = j->e;
    for (int64_t p = begin + j->offset; p < end + j->offset; p++) {
        const struct kt_ffn_unit *u = &e->units[unit_holding(e->units, j->n_units, (uint32_t)p, false)];
        kt_quantize_rows(NULL, u->w.down.type, e->act + (size_t)p * e->act_stride, 1, u->w.n_ff,
                         e->act_q + (size_t)p * e->act_q_stride);
    }
}

/* pair_out[p][r] = down_r . act_q[p] for the rows of one task, every pair of its unit in one gemm. */
static void down_task(void *ctx, int64_t begin, int64_t end, int thread)
{
    (void)thread;
    const struct kt_units_job *j = ctx;
    struct kt_engine *e = j->e;
    const int64_t E = e->hp.n_embd;
    for (int64_t i = begin + j->offset; i < end + j->offset; i++) {
        const struct kt_ffn_unit *u = &e->units[unit_holding(e->units, j->n_units, (uint32_t)i, true)];
        const int64_t r0 = ((int64_t)i - u->first_task) * DOWN_ROWS_PER_TASK;
        const int64_t n = r0 + DOWN_ROWS_PER_TASK < E ? DOWN_ROWS_PER_TASK : E - r0;
        const struct kt_mat down = kt_mat_rows(u->w.down, r0, n);
        kt_mat_gemm(&down, e->act_q + (size_t)u->first_pair * e->act_q_stride, e->act_q_stride, u->n_pairs,
                    e->pair_out + (size_t)u->first_pair * E + r0, E);
    }
}

/* h (T, E) quantized for weight type `type` (rows packed at that format's
 * size) into one of e->hq, once per activation format per step (gate and up of routed and shared experts
 * take at most four formats). */
static const uint8_t *quantized_h(struct kt_engine *e, const float *h, int type, int *slot_types, int *n_slots)
{
    const int act_type = kt_mat_kernels_for(type)->vec_dot_type;
    for (int i = 0; i < *n_slots; i++)
        if (slot_types[i] == act_type)
            return e->hq[i];
    int i = (*n_slots)++;
    slot_types[i] = act_type;
    kt_quantize_rows(e->pool, type, h, e->n_tokens, e->hp.n_embd, e->hq[i]);
    return e->hq[i];
}

/* One phase over items [0, n_items) (tasks or pairs): on the step's thread
 * pool, or with pools, pool i taking the items of its units [pool_units[i],
 * pool_units[i+1]), which are contiguous (first(u) is the first item of unit
 * u), all pools at once, this thread helping pool 0. */
static void run_phase(struct kt_engine *e, bool on_pools, uint32_t n_units, uint32_t n_items,
                      uint32_t (*first)(const struct kt_ffn_unit *u), kt_pool_fn fn)
{
    if (!on_pools) {
        struct kt_units_job j = {e, n_units, 0};
        kt_threadpool_parallel_for(e->pool, n_items, 1, fn, &j);
        return;
    }
    const int n_pools = kt_pools_count(e->pools);
    for (int i = 0; i < n_pools; i++) {
        const uint32_t ub = e->pool_units[i], ue = e->pool_units[i + 1];
        const uint32_t b = ub < n_units ? first(&e->units[ub]) : n_items;
        const uint32_t end = ue < n_units ? first(&e->units[ue]) : n_items;
        e->pool_jobs[i] = (struct kt_units_job){e, n_units, b};
        kt_pool_submit(kt_pools_get(e->pools, i), (int64_t)end - b, 1, fn, &e->pool_jobs[i]);
    }
    kt_pool_help(kt_pools_get(e->pools, 0));
    for (int i = 0; i < n_pools; i++)
        kt_pool_wait(kt_pools_get(e->pools, i));
}

static uint32_t first_task(const struct kt_ffn_unit *u)
{
    return u->first_task;
}

static uint32_t first_pair(const struct kt_ffn_unit *u)
{
    return u->first_pair;
}

/* Runs units [0, n_units): pair_out[p] = FFN_unit(h[pair_token[p]]), on the
 * NUMA pools (units grouped by pool in e->pool_units) or the thread pool. */
static void run_units(struct kt_engine *e, const float *h, uint32_t n_units, bool on_pools)
{
    int slot_types[4], n_slots = 0;
    uint32_t n_pairs = 0;
    for (uint32_t i = 0; i < n_units; i++) {
        struct kt_ffn_unit *u = &e->units[i];
        u->hq_gate = quantized_h(e, h, u->w.gate.type, slot_types, &n_slots);
        u->hq_up = quantized_h(e, h, u->w.up.type, slot_types, &n_slots);
        u->hq_gate_row_bytes = kt_act_row_bytes(u->w.gate.type, e->hp.n_embd);
        u->hq_up_row_bytes = kt_act_row_bytes(u->w.up.type, e->hp.n_embd);
        u->pairs_up = u->hq_up == u->hq_gate ? e->hq_pairs_gate : e->hq_pairs_up;
        n_pairs += u->n_pairs;
        e->stats.weight_bytes += kt_mat_bytes(&u->w.gate) + kt_mat_bytes(&u->w.up) + kt_mat_bytes(&u->w.down);
    }

    run_phase(e, on_pools, n_units, n_pairs, first_pair, gather_task);
    uint32_t n_tasks = plan_tasks(e->units, n_units, GATE_UP_ROWS_PER_TASK, 0);
    run_phase(e, on_pools, n_units, n_tasks, first_task, gate_up_task);
    run_phase(e, on_pools, n_units, n_pairs, first_pair, quantize_act_task);
    n_tasks = plan_tasks(e->units, n_units, DOWN_ROWS_PER_TASK, e->hp.n_embd);
    run_phase(e, on_pools, n_units, n_tasks, first_task, down_task);
}

/* ---- the layer ---------------------------------------------------------------------- */

/* Expert x's slabs of the stacked tensors, or its buffer in the expert store
 * ([gate | up | down] adjacent, each in the GGUF layout or repacked for the
 * kernel level in use: same types and row counts either way). */
static struct kt_ffn_weights expert_weights(const struct kt_engine *e, uint32_t il, const struct kt_layer_weights *L,
                                            uint32_t x, int node)
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
    if (e->experts) {
        const struct kt_stored_expert *se = kt_expert_store_expert(e->experts, il, x);
        const uint8_t *data = node >= 0 && node < KT_EXPERT_MAX_NODES && se->copy[node] ? se->copy[node] : se->data;
        const struct kt_expert_layout *lay = kt_expert_store_layout(e->experts, il);
        w.gate.data = data + lay->gate_offset;
        w.up.data = data + lay->up_offset;
        w.down.data = data + lay->down_offset;
        w.gate.packed = lay->gate_packed;
        w.up.packed = lay->up_packed;
        w.down.packed = lay->down_packed;
    }
    return w;
}

/* Pools for the step's active experts (expert_pairs[x] > 0), largest token
 * groups first: each to the least loaded pool holding a copy of it (its
 * home's on ties, then the lowest pool), so replicas spread a hot expert's
 * neighbours away from its node.  Deterministic for a given routing; which
 * copy runs never changes a result (the copies are the same bytes). */
static void choose_pools(struct kt_engine *e, uint32_t il)
{
    const uint32_t Ne = e->hp.n_expert;
    const int n_pools = kt_pools_count(e->pools);
    uint32_t n_active = 0;
    for (uint32_t x = 0; x < Ne; x++)
        if (e->expert_pairs[x])
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
    for (uint32_t i = 0; i < n_active; i++) {
        const uint32_t x = e->active_experts[i];
        const struct kt_stored_expert *se = e->experts ? kt_expert_store_expert(e->experts, il, x) : NULL;
        const int home = se && se->home_node >= 0 && se->home_node < e->topo->n_nodes ? se->home_node : 0;
        int best = e->node_pool[home];
        for (int g = 0; se && g < n_pools; g++) {
            const int node = kt_pool_node(kt_pools_get(e->pools, g));
            if (node >= 0 && node < KT_EXPERT_MAX_NODES && se->copy[node] && e->pool_load[g] < e->pool_load[best])
                best = g;
        }
        e->expert_pool_of[x] = best;
        e->pool_load[best] += e->expert_pairs[x];
        const int node = kt_pool_node(kt_pools_get(e->pools, best));
        if (node >= 0 && node < 16)
            e->stats.node_pairs[node] += e->expert_pairs[x];
    }
}

static void dense_ffn(struct kt_engine *e, const struct kt_layer_weights *L, const float *h, float *out)
{
    const uint32_t T = e->n_tokens, E = e->hp.n_embd;
    e->units[0] = (struct kt_ffn_unit){.w = L->dense, .first_pair = 0, .n_pairs = T};
    for (uint32_t t = 0; t < T; t++)
        e->pair_token[t] = t;
    run_units(e, h, 1, false);
    memcpy(out, e->pair_out, (size_t)T * E * sizeof(float));
}

static void moe_ffn(struct kt_engine *e, uint32_t il, const struct kt_layer_weights *L, const float *h, float *out)
{
    const uint32_t T = e->n_tokens, E = e->hp.n_embd, Ne = e->hp.n_expert, k = e->router.n_used;

    /* Router: logits (T, Ne) -> experts and weights (T, k). */
    uint64_t t0 = kt_fwd_now_ns();
    kt_fwd_matmul(e, &L->router, h, T, e->router_logits, e->xq);
    for (uint32_t t = 0; t < T; t++)
        kt_moe_route(&e->router, e->router_logits + (size_t)t * Ne, L->exp_probs_b, e->route_experts + (size_t)t * k,
                     e->route_weights + (size_t)t * k, e->router_scratch);
    uint64_t t1 = kt_fwd_now_ns();
    e->stats.router_ns += t1 - t0;

    /* Group (token, expert) pairs by expert, tokens in batch order within
     * each; experts by the pool of their home node (one group without
     * pools), in id order within it; the shared experts serve every token
     * after the first group's experts.  The order of units changes no sum:
     * the combine below follows pair_of in selection order. */
    memset(e->expert_pairs, 0, Ne * sizeof *e->expert_pairs);
    for (uint32_t i = 0; i < T * k; i++)
        e->expert_pairs[e->route_experts[i]]++;
    const bool on_pools = e->pools != NULL;
    const int n_groups = on_pools ? kt_pools_count(e->pools) : 1;
    if (on_pools)
        choose_pools(e, il);
    const bool shared = L->shared.n_ff > 0;
    uint32_t n_units = 0, n_pairs = 0, shared_pair = 0;
    for (int g = 0; g < n_groups; g++) {
        if (on_pools)
            e->pool_units[g] = n_units;
        for (uint32_t x = 0; x < Ne; x++) {
            if (!e->expert_pairs[x] || (on_pools && e->expert_pool_of[x] != g))
                continue;
            const int node = on_pools ? kt_pool_node(kt_pools_get(e->pools, g)) : -1;
            e->expert_unit[x] = n_units;
            e->units[n_units++] = (struct kt_ffn_unit){.w = expert_weights(e, il, L, x, node), .first_pair = n_pairs};
            n_pairs += e->expert_pairs[x];
        }
        if (g == 0 && shared) {
            shared_pair = n_pairs;
            e->units[n_units++] = (struct kt_ffn_unit){.w = L->shared, .first_pair = n_pairs, .n_pairs = T};
            for (uint32_t t = 0; t < T; t++)
                e->pair_token[n_pairs + t] = t;
            n_pairs += T;
        }
    }
    if (on_pools)
        e->pool_units[n_groups] = n_units;
    for (uint32_t i = 0; i < T * k; i++) {
        struct kt_ffn_unit *u = &e->units[e->expert_unit[e->route_experts[i]]];
        uint32_t p = u->first_pair + u->n_pairs++;
        e->pair_token[p] = i / k;
        e->pair_of[i] = p;
    }

    run_units(e, h, n_units, on_pools);

    /* out = sum_j w_j Expert_j(h) in selection order, then + Shared(h). */
    for (uint32_t t = 0; t < T; t++) {
        float *o = out + (size_t)t * E;
        memset(o, 0, E * sizeof(float));
        for (uint32_t j = 0; j < k; j++)
            kt_axpy_f32(o, e->route_weights[t * k + j], e->pair_out + (size_t)e->pair_of[t * k + j] * E, E);
        if (shared)
            kt_axpy_f32(o, 1.0f, e->pair_out + (size_t)(shared_pair + t) * E, E);
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
        dense_ffn(e, L, h, out);
        e->stats.other_ns += kt_fwd_now_ns() - t0;
    }
}
