/*
 * test_cost.c - the cost model's arithmetic (placement/cost.h) on kt-synth's
 * tiny model and a machine built by hand.
 *
 * Proves: p_active is 1 - (1 - p)^B, so the expected distinct active experts
 * are k at batch 1 and approach n_expert as the batch grows; the routed
 * experts' time at batch 1 is the expected BUSIEST node's load, equal to an
 * exhaustive enumeration of every active set on a small case and to a Monte
 * Carlo on a larger one, and above the mean node's load; moving an expert to
 * the device never increases the CPU's predicted time; a row-sliced layer is
 * balanced over its nodes and no slower than the same experts homed whole;
 * a prefill is the sum of its chunks and grows with context; its calls read
 * weights at the machine file's prefill fixed part and its expanded heads
 * cost their measured dequantization and scores; the decode
 * prediction is bandwidth-bound (twice the bandwidth, less than half the
 * experts' time); bad plans and profiles are refused with a message; and a
 * Kimi-K2-shaped layer is cheap to evaluate (the planner calls it often).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cost.h"
#include "model.h"
#include "plan.h"
#include "profile.h"
#include "quant.h"
#include "testlib.h"

/* ---- fixtures --------------------------------------------------------------------------- */

static char g_tiny[1024];

static struct kt_model *tiny(void)
{
    return kt_test_synth_once("tiny", g_tiny, sizeof g_tiny);
}

/* n_nodes nodes of 1 thread, every type read at gbps with no overhead and
 * multiplied so fast that decode is pure bytes / bandwidth; one sim accelerator. */
static void machine(struct kt_machine *mc, int n_nodes, double gbps)
{
    memset(mc, 0, sizeof *mc);
    mc->n_nodes = n_nodes;
    for (int n = 0; n < n_nodes; n++) {
        struct kt_machine_node *nd = &mc->nodes[n];
        nd->node = n;
        nd->threads = 1;
        nd->triad_gbps = 1e9; /* norms and sums cost nothing */
        nd->fma_gflops = 1e9;
        for (int t = 0; t < KT_TYPE_COUNT; t++) {
            nd->decode[t] = (struct kt_machine_rate){gbps, 0.0};
            nd->prefill_gflops[t] = 1e9;
        }
    }
    mc->n_accel = 1;
    struct kt_machine_accel *a = &mc->accel[0];
    snprintf(a->name, sizeof a->name, "sim");
    a->backend = KT_PLACE_SIM;
    a->shares_host = true; /* what a machine file's sim entry says unless told otherwise */
    a->h2d_gbps = a->d2h_gbps = 25;
    a->latency_us = 10;
    for (int t = 0; t < KT_TYPE_COUNT; t++) {
        a->decode[t] = (struct kt_machine_rate){gbps, 0.0};
        a->prefill_gflops[t] = 1e9;
    }
}

/* A plan of m: everything on the cpu, expert x of each MoE layer on node x % n_nodes; a sim device beside. */
struct plan {
    struct kt_placement p;
    struct kt_placement_device dev[2];
    struct kt_placement_layer layers[8];
    struct kt_expert_home homes[8][64];
};

static void plan(struct plan *pl, const struct kt_model *m, int n_nodes)
{
    memset(pl, 0, sizeof *pl);
    struct kt_placement *p = &pl->p;
    snprintf(p->source, sizeof p->source, "test plan");
    p->n_devices = 2;
    p->devices = pl->dev;
    snprintf(pl->dev[0].name, sizeof pl->dev[0].name, "cpu");
    snprintf(pl->dev[1].name, sizeof pl->dev[1].name, "sim");
    pl->dev[1].backend = KT_PLACE_SIM;
    pl->dev[1].transfer_gbps = 25;
    pl->dev[1].latency_us = 10;
    p->n_layer = m->hp.n_layer;
    p->n_expert = m->hp.n_expert;
    p->layers = pl->layers;
    p->n_nodes = n_nodes;
    p->expert_nodes = (1ull << n_nodes) - 1;
    for (uint32_t il = 0; il < p->n_layer && il < 8; il++) {
        struct kt_placement_layer *L = &pl->layers[il];
        L->is_moe = m->layers[il].is_moe;
        L->dense_ffn = L->is_moe ? -1 : 0;
        L->shared_experts = L->is_moe && m->layers[il].ffn_gate_shexp ? 0 : -1;
        if (!L->is_moe)
            continue;
        L->experts = pl->homes[il];
        for (uint32_t x = 0; x < p->n_expert && x < 64; x++)
            L->experts[x] = (struct kt_expert_home){0, (int)(x % (uint32_t)n_nodes), 0};
    }
}

static uint32_t first_moe(const struct kt_model *m)
{
    for (uint32_t il = 0; il < m->hp.n_layer; il++)
        if (m->layers[il].is_moe)
            return il;
    return 0;
}

/* Seconds expert x of layer il (any, they are alike) takes to read at gbps. */
static double expert_seconds(const struct kt_model *m, uint32_t il, double gbps)
{
    const struct kt_layer *L = &m->layers[il];
    const double bytes = (double)(L->ffn_gate_exps->nbytes + L->ffn_up_exps->nbytes + L->ffn_down_exps->nbytes) /
                         m->hp.n_expert;
    return bytes / (gbps * 1e9);
}

static double shared_seconds(const struct kt_model *m, uint32_t il, double gbps)
{
    const struct kt_layer *L = &m->layers[il];
    return L->ffn_gate_shexp ? (double)(L->ffn_gate_shexp->nbytes + L->ffn_up_shexp->nbytes +
                                        L->ffn_down_shexp->nbytes) / (gbps * 1e9)
                             : 0.0;
}

/* A profile of m whose layer il routes with probabilities p[x] per token. */
static struct kt_profile *profile(const struct kt_model *m, uint32_t il, const double *p)
{
    struct kt_profile *pr = NULL;
    kt_err err = {0};
    struct kt_model_identity id;
    kt_model_identity(m, &id);
    KT_CHECK(kt_profile_create(m->hp.n_layer, m->hp.n_expert, &id, &pr, &err) == KT_OK, "%s", err.msg);
    if (!pr)
        return NULL;
    pr->tokens[KT_PROFILE_DECODE] = pr->tokens[KT_PROFILE_PREFILL] = 1000.0;
    for (uint32_t l = 0; l < m->hp.n_layer; l++)
        for (uint32_t x = 0; m->layers[l].is_moe && x < m->hp.n_expert; x++) {
            const double px = l == il ? p[x] : (double)m->hp.n_expert_used / m->hp.n_expert;
            pr->counts[KT_PROFILE_DECODE][(size_t)l * m->hp.n_expert + x] = 1000.0 * px;
            pr->counts[KT_PROFILE_PREFILL][(size_t)l * m->hp.n_expert + x] = 1000.0 * px;
        }
    return pr;
}

static struct kt_cost_model *cost(const struct kt_model *m, const struct kt_profile *pr, const struct kt_machine *mc)
{
    struct kt_cost_model *c = NULL;
    kt_err err = {0};
    KT_CHECK(kt_cost_create(m, pr, mc, &c, &err) == KT_OK, "%s", err.msg);
    return c;
}

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static double uniform01(void)
{
    rng_state ^= rng_state << 13, rng_state ^= rng_state >> 7, rng_state ^= rng_state << 17;
    return (double)(rng_state >> 11) / 9007199254740992.0;
}

/* ---- cases ------------------------------------------------------------------------------ */

static void p_active_is_one_minus_miss_to_the_batch(void)
{
    struct kt_model *m = tiny();
    if (!m)
        return;
    struct kt_machine mc;
    machine(&mc, 1, 10);
    struct kt_cost_model *c = cost(m, NULL, &mc);
    const uint32_t il = first_moe(m), n = m->hp.n_expert, k = m->hp.n_expert_used;
    const double p = (double)k / n;
    double prev_sum = 0.0;
    const uint32_t batches[] = {1, 2, 4, 16, 64, 256};
    for (size_t i = 0; c && i < sizeof batches / sizeof batches[0]; i++) {
        struct kt_cost_query q = {.mode = KT_COST_DECODE, .batch = batches[i], .threads = 1};
        double sum = 0.0;
        for (uint32_t x = 0; x < n; x++)
            sum += kt_cost_p_active(c, il, x, &q);
        const double want = n * (1 - pow(1 - p, batches[i]));
        KT_CHECK(fabs(sum - want) < 1e-9 * n, "batch %u: %.6f distinct active, want %.6f", batches[i], sum, want);
        KT_CHECK(sum >= prev_sum && sum <= n + 1e-9, "batch %u: %.6f not in [%.6f, %u]", batches[i], sum, prev_sum, n);
        prev_sum = sum;
    }
    KT_CHECK(prev_sum > 0.99 * n, "batch 256 touches nearly every expert (%.3f of %u)", prev_sum, n);
    struct kt_cost_query q1 = {.mode = KT_COST_DECODE, .batch = 1, .threads = 1};
    double sum1 = 0.0;
    for (uint32_t x = 0; c && x < n; x++)
        sum1 += kt_cost_p_active(c, il, x, &q1);
    KT_CHECK(fabs(sum1 - k) < 1e-9, "batch 1: k = %u active, got %.9f", k, sum1);
    kt_cost_destroy(c);
    kt_model_close(m);
}

/* The DP's E[max over nodes] against every subset of 12 possibly-active experts. */
static void busiest_node_matches_enumeration(void)
{
    struct kt_model *m = tiny();
    if (!m)
        return;
    const uint32_t il = first_moe(m), n = m->hp.n_expert;
    double p[64] = {0};
    /* 12 experts (x = 0 .. 11) carry all k = 8 of a token's choices, unevenly */
    const double w[12] = {0.95, 0.9, 0.85, 0.8, 0.75, 0.7, 0.6, 0.55, 0.5, 0.45, 0.5, 0.45};
    for (int x = 0; x < 12; x++)
        p[x] = w[x];
    struct kt_profile *pr = profile(m, il, p);
    struct kt_machine mc;
    const double gbps = 10;
    machine(&mc, 2, gbps);
    const double ov = 50e-6; /* each node with work pays its MoE step's overhead once */
    for (int nd = 0; nd < 2; nd++)
        for (int t = 0; t < KT_TYPE_COUNT; t++)
            mc.nodes[nd].decode[t].overhead_us = ov * 1e6;
    struct kt_cost_model *c = cost(m, pr, &mc);
    struct plan pl;
    plan(&pl, m, 2);
    if (!c || !pr) {
        kt_cost_destroy(c), kt_profile_destroy(pr), kt_model_close(m);
        return;
    }
    /* uneven homes: experts 0..3 and 8 on node 1, the rest on node 0 */
    for (uint32_t x = 0; x < n; x++)
        pl.homes[il][x].node = x < 4 || x == 8 ? 1 : 0;
    const double t = expert_seconds(m, il, gbps), s = shared_seconds(m, il, gbps);
    double exact = 0.0, mean0 = 0.0, mean1 = 0.0;
    for (uint32_t set = 0; set < (1u << 12); set++) {
        double prob = 1.0, load[2] = {s + ov, 0.0}; /* the shared expert runs with node 0 */
        for (int x = 0; x < 12; x++) {
            const bool on = (set >> x) & 1;
            prob *= on ? w[x] : 1 - w[x];
            if (on)
                load[pl.homes[il][x].node] += t;
        }
        load[1] += load[1] > 0 ? ov : 0.0;
        exact += prob * (load[0] > load[1] ? load[0] : load[1]);
        mean0 += prob * load[0], mean1 += prob * load[1];
    }
    struct kt_cost_query q = {.mode = KT_COST_DECODE, .batch = 1, .threads = 2};
    struct kt_cost_layer out;
    kt_cost_layer(c, &pl.p, il, pl.homes[il], false, &q, &out);
    KT_CHECK(fabs(out.cpu_experts_s - exact) < 1e-6 * exact, "E[busiest] %.9g s, enumeration %.9g s",
             out.cpu_experts_s, exact);
    KT_CHECK(fabs(out.node_s[0] - mean0) < 1e-6 * mean0 && fabs(out.node_s[1] - mean1) < 1e-6 * mean1,
             "node means %.9g %.9g, enumeration %.9g %.9g", out.node_s[0], out.node_s[1], mean0, mean1);
    KT_CHECK(out.cpu_experts_s > (mean0 > mean1 ? mean0 : mean1) * 1.01,
             "the busiest step (%.9g) costs more than the busier node's mean (%.9g)", out.cpu_experts_s,
             mean0 > mean1 ? mean0 : mean1);
    KT_CHECK(out.experts_s >= out.cpu_experts_s, "experts_s %.9g includes the CPU's %.9g", out.experts_s,
             out.cpu_experts_s);
    kt_cost_destroy(c);
    kt_profile_destroy(pr);
    kt_model_close(m);
}

/* Skewed routing over all 32 experts on 3 nodes at batch 1 and 4: the DP against a Monte Carlo. */
static void busiest_node_matches_monte_carlo(void)
{
    struct kt_model *m = tiny();
    if (!m)
        return;
    const uint32_t il = first_moe(m), n = m->hp.n_expert, k = m->hp.n_expert_used;
    double p[64], sum = 0.0;
    for (uint32_t x = 0; x < n; x++)
        sum += p[x] = pow(x + 1.0, -0.7);
    for (uint32_t x = 0; x < n; x++)
        p[x] = p[x] / sum * k;
    for (uint32_t x = 0; x < n; x++) /* a few above 1 are clipped: do it here so the Monte Carlo agrees */
        p[x] = p[x] > 1 ? 1 : p[x];
    struct kt_profile *pr = profile(m, il, p);
    struct kt_machine mc;
    machine(&mc, 3, 10);
    struct kt_cost_model *c = cost(m, pr, &mc);
    struct plan pl;
    plan(&pl, m, 3);
    const double t = expert_seconds(m, il, 10), s = shared_seconds(m, il, 10);
    const uint32_t batches[] = {1, 4};
    for (size_t b = 0; c && pr && b < 2; b++) {
        const uint32_t B = batches[b];
        double mc_sum = 0.0;
        const int trials = 200000;
        for (int i = 0; i < trials; i++) {
            double load[3] = {s, 0, 0};
            for (uint32_t x = 0; x < n; x++)
                if (uniform01() < 1 - pow(1 - p[x], B))
                    load[x % 3] += t;
            double mx = load[0] > load[1] ? load[0] : load[1];
            mc_sum += mx > load[2] ? mx : load[2];
        }
        const double want = mc_sum / trials;
        struct kt_cost_query q = {.mode = KT_COST_DECODE, .batch = B, .threads = 3};
        struct kt_cost_layer out;
        kt_cost_layer(c, &pl.p, il, pl.homes[il], false, &q, &out);
        KT_CHECK(fabs(out.cpu_experts_s - want) < 0.01 * want, "batch %u: E[busiest] %.6g s, Monte Carlo %.6g s", B,
                 out.cpu_experts_s, want);
    }
    kt_cost_destroy(c);
    kt_profile_destroy(pr);
    kt_model_close(m);
}

static void moving_an_expert_to_the_device_never_adds_cpu_time(void)
{
    struct kt_model *m = tiny();
    if (!m)
        return;
    const uint32_t il = first_moe(m), n = m->hp.n_expert, k = m->hp.n_expert_used;
    double p[64], sum = 0.0;
    for (uint32_t x = 0; x < n; x++)
        sum += p[x] = 1.0 / (1.0 + (x * 7) % 13);
    for (uint32_t x = 0; x < n; x++)
        p[x] = p[x] / sum * k;
    struct kt_profile *pr = profile(m, il, p);
    struct kt_machine mc;
    machine(&mc, 2, 10);
    struct kt_cost_model *c = cost(m, pr, &mc);
    struct plan pl;
    plan(&pl, m, 2);
    const uint32_t batches[] = {1, 8};
    for (size_t b = 0; c && pr && b < 2; b++) {
        plan(&pl, m, 2);
        struct kt_cost_query q = {.mode = KT_COST_DECODE, .batch = batches[b], .threads = 2};
        struct kt_cost_layer prev;
        kt_cost_layer(c, &pl.p, il, pl.homes[il], false, &q, &prev);
        KT_CHECK(prev.device_s == 0 && prev.device_pairs == 0, "nothing on the device yet (%g s)", prev.device_s);
        for (uint32_t i = 0; i < n; i++) {
            const uint32_t x = (i * 11) % n; /* an order mixing nodes and heat */
            pl.homes[il][x] = (struct kt_expert_home){1, -1, 0};
            struct kt_cost_layer now;
            kt_cost_layer(c, &pl.p, il, pl.homes[il], false, &q, &now);
            KT_CHECK(now.cpu_experts_s <= prev.cpu_experts_s * (1 + 1e-12), "batch %u, expert %u to the device: CPU %.9g -> %.9g s",
                     batches[b], x, prev.cpu_experts_s, now.cpu_experts_s);
            KT_CHECK(now.device_pairs >= prev.device_pairs, "device pairs grow (%g -> %g)", prev.device_pairs,
                     now.device_pairs);
            prev = now;
        }
        KT_CHECK(fabs(prev.device_pairs - prev.pairs) < 1e-9 * prev.pairs, "every pair on the device at the end (%g of %g)",
                 prev.device_pairs, prev.pairs);
        KT_CHECK(prev.device_experts_s > 0, "the device's units cost time (%g s)", prev.device_experts_s);
    }
    kt_cost_destroy(c);
    kt_profile_destroy(pr);
    kt_model_close(m);
}

static void sliced_layers_are_balanced(void)
{
    struct kt_model *m = tiny();
    if (!m)
        return;
    const uint32_t il = first_moe(m);
    struct kt_machine mc;
    machine(&mc, 2, 10);
    struct kt_cost_model *c = cost(m, NULL, &mc);
    struct plan pl;
    plan(&pl, m, 2);
    const double s = shared_seconds(m, il, 10), t = expert_seconds(m, il, 10);
    for (uint32_t B = 1; c && B <= 16; B *= 4) {
        struct kt_cost_query q = {.mode = KT_COST_DECODE, .batch = B, .threads = 2};
        struct kt_cost_layer whole, sliced;
        kt_cost_layer(c, &pl.p, il, pl.homes[il], false, &q, &whole);
        kt_cost_layer(c, &pl.p, il, pl.homes[il], true, &q, &sliced);
        const double n_active = m->hp.n_expert * (1 - pow(1 - (double)m->hp.n_expert_used / m->hp.n_expert, B));
        /* each node: half of every active expert and half of the shared expert's rows */
        const double want = n_active * t / 2 + s / 2;
        KT_CHECK(fabs(sliced.node_s[0] - want) < 1e-6 * want && fabs(sliced.node_s[1] - want) < 1e-6 * want,
                 "batch %u: sliced nodes %.9g and %.9g, want %.9g each", B, sliced.node_s[0], sliced.node_s[1], want);
        KT_CHECK(sliced.cpu_experts_s <= whole.cpu_experts_s, "batch %u: sliced %.9g s, whole experts %.9g s", B,
                 sliced.cpu_experts_s, whole.cpu_experts_s);
    }
    kt_cost_destroy(c);
    kt_model_close(m);
}

/* A replicated expert runs on one of its copies' nodes (the engine picks the
 * least loaded): each copy's node counts it with probability p_active / k, so
 * every expert homed on node 0 with a copy on node 1 loads both nodes alike,
 * and the busiest node's expected load drops below the unreplicated plan's. */
static void replicas_share_their_experts_load(void)
{
    struct kt_model *m = tiny();
    if (!m)
        return;
    const uint32_t il = first_moe(m);
    struct kt_machine mc;
    machine(&mc, 2, 10);
    struct kt_cost_model *c = cost(m, NULL, &mc);
    struct plan one, copied;
    plan(&one, m, 2);
    plan(&copied, m, 2);
    for (uint32_t x = 0; x < m->hp.n_expert && x < 64; x++) {
        one.homes[il][x] = (struct kt_expert_home){0, 0, 0};
        copied.homes[il][x] = (struct kt_expert_home){0, 0, 1ull << 1};
    }
    const double s = shared_seconds(m, il, 10);
    for (uint32_t B = 1; c && B <= 16; B *= 4) {
        struct kt_cost_query q = {.mode = KT_COST_DECODE, .batch = B, .threads = 2};
        struct kt_cost_layer lo, lc;
        kt_cost_layer(c, &one.p, il, one.homes[il], false, &q, &lo);
        kt_cost_layer(c, &copied.p, il, copied.homes[il], false, &q, &lc);
        /* node 0 also runs the shared experts */
        KT_CHECK(fabs((lc.node_s[0] - s) - lc.node_s[1]) < 1e-6 * lc.node_s[1] && lc.node_s[1] > 0,
                 "batch %u: replicated nodes %.9g (less the shared %.9g) and %.9g s", B, lc.node_s[0], s, lc.node_s[1]);
        KT_CHECK(lc.cpu_experts_s < lo.cpu_experts_s, "batch %u: replicated %.9g s, all on node 0 %.9g s", B,
                 lc.cpu_experts_s, lo.cpu_experts_s);
    }
    kt_cost_destroy(c);
    kt_model_close(m);
}

static void decode_is_bandwidth_bound_and_prefill_is_its_chunks(void)
{
    struct kt_model *m = tiny();
    if (!m)
        return;
    const uint32_t il = first_moe(m);
    struct kt_machine slow, fast;
    machine(&slow, 1, 10);
    machine(&fast, 1, 20);
    struct kt_cost_model *a = cost(m, NULL, &slow), *b = cost(m, NULL, &fast);
    struct plan pl;
    plan(&pl, m, 1);
    struct kt_cost_query q = {.mode = KT_COST_DECODE, .batch = 1, .threads = 1};
    struct kt_cost_layer la, lb;
    if (a && b) {
        kt_cost_layer(a, &pl.p, il, pl.homes[il], false, &q, &la);
        kt_cost_layer(b, &pl.p, il, pl.homes[il], false, &q, &lb);
        const double want = m->hp.n_expert_used * expert_seconds(m, il, 10) + shared_seconds(m, il, 10);
        KT_CHECK(fabs(la.cpu_experts_s - want) < 1e-6 * want, "k experts + shared at 10 GB/s: %.9g s, want %.9g",
                 la.cpu_experts_s, want);
        KT_CHECK(fabs(lb.cpu_experts_s * 2 - la.cpu_experts_s) < 1e-6 * la.cpu_experts_s,
                 "twice the bandwidth halves the experts' time (%.9g, %.9g)", la.cpu_experts_s, lb.cpu_experts_s);
        KT_CHECK(la.total_s > 0 && la.attention_s > 0 && la.router_s > 0, "every part costs time");
        /* prefill: 600 tokens in chunks of 256 = chunks of 256, 256, 88 at rising context */
        struct kt_cost_query pq = {.mode = KT_COST_PREFILL, .tokens = 600, .threads = 1, .chunk = 256};
        struct kt_cost_layer whole, part;
        kt_cost_layer(a, &pl.p, il, pl.homes[il], false, &pq, &whole);
        double sum = 0.0;
        const uint32_t sizes[3] = {256, 256, 88};
        for (int i = 0, ctx = 0; i < 3; ctx += sizes[i++]) {
            struct kt_cost_query one = {.mode = KT_COST_PREFILL, .tokens = sizes[i], .context = (uint32_t)ctx, .threads = 1,
                                        .chunk = 256};
            sum += kt_cost_layer(a, &pl.p, il, pl.homes[il], false, &one, &part);
        }
        KT_CHECK(fabs(whole.total_s - sum) < 1e-9 * sum, "prefill of 600 = its chunks: %.9g vs %.9g s", whole.total_s,
                 sum);
        struct kt_cost_query later = pq;
        later.context = 2000;
        struct kt_cost_layer lt;
        kt_cost_layer(a, &pl.p, il, pl.homes[il], false, &later, &lt);
        KT_CHECK(lt.attention_s > whole.attention_s, "attention grows with context (%.9g -> %.9g s)", whole.attention_s,
                 lt.attention_s);
        /* the whole step: layers plus embedding and head */
        struct kt_cost_layer layers[8];
        double step = 0.0, layer_sum = 0.0;
        kt_err err = {0};
        KT_CHECK(kt_cost_predict(a, &pl.p, &q, layers, &step, &err) == KT_OK, "%s", err.msg);
        for (uint32_t l = 0; l < m->hp.n_layer; l++)
            layer_sum += layers[l].total_s;
        KT_CHECK(step > layer_sum && layer_sum > 0, "the step %.9g s covers its layers %.9g s", step, layer_sum);
    }
    kt_cost_destroy(a);
    kt_cost_destroy(b);
    kt_model_close(m);
}

/* From KT_COST_GEMM_TOKENS tokens on a call reads its weights at the measured
 * prefill line's fixed part, where the file has one; decode keeps the decode
 * rate.  The expanded attention form's dequantization and scores go at their
 * measured rates, else 4 bytes a weight and a pair's MAC at f32_cached_gbps. */
static void prefill_reads_at_the_fixed_part_and_heads_at_their_rates(void)
{
    struct kt_model *m = tiny();
    if (!m)
        return;
    const uint32_t il = first_moe(m);
    struct kt_machine plain, fixed;
    machine(&plain, 1, 10);
    machine(&fixed, 1, 10);
    for (int t = 0; t < KT_TYPE_COUNT; t++)
        fixed.nodes[0].prefill_fixed_gbps[t] = 40;
    struct kt_cost_model *a = cost(m, NULL, &plain), *b = cost(m, NULL, &fixed);
    struct plan pl;
    plan(&pl, m, 1);
    const struct kt_hparams *hp = &m->hp;
    /* 16 tokens per active expert on average or more: every call a gemm */
    const uint32_t T = 16 * hp->n_expert / hp->n_expert_used;
    if (a && b) {
        struct kt_cost_query pq = {.mode = KT_COST_PREFILL, .tokens = T, .threads = 1, .chunk = 256};
        struct kt_cost_layer la, lb;
        kt_cost_layer(a, &pl.p, il, pl.homes[il], false, &pq, &la);
        kt_cost_layer(b, &pl.p, il, pl.homes[il], false, &pq, &lb);
        /* multiplying is free and there is no overhead: the experts' time is their reads */
        KT_CHECK(la.cpu_experts_s > 0 && fabs(lb.cpu_experts_s * 4 - la.cpu_experts_s) < 1e-6 * la.cpu_experts_s,
                 "prefill experts read at 40 GB/s, not 10: %.9g s against %.9g s", lb.cpu_experts_s,
                 la.cpu_experts_s);
        KT_CHECK(lb.attention_s < la.attention_s, "prefill projections read at the fixed part too (%.9g, %.9g s)",
                 lb.attention_s, la.attention_s);
        struct kt_cost_query dq = {.mode = KT_COST_DECODE, .batch = 1, .threads = 1};
        kt_cost_layer(a, &pl.p, il, pl.homes[il], false, &dq, &la);
        kt_cost_layer(b, &pl.p, il, pl.homes[il], false, &dq, &lb);
        KT_CHECK(la.total_s == lb.total_s, "decode ignores the prefill figures (%.9g, %.9g s)", la.total_s, lb.total_s);
    }
    kt_cost_destroy(b);
    b = NULL;

    /* heads: free dequantization and scores take exactly their old terms off */
    const double kvr = hp->kv_lora_rank, dn = hp->qk_nope_dim, dv = hp->v_head_dim, dr = hp->qk_rope_dim;
    const double w = kvr * (dn + dv), pairs = (double)T * (T + 1) / 2, H = hp->n_head;
    KT_CHECK(w + T * w + pairs * (dn + dr + dv) < T * w + pairs * (2 * kvr + dr),
             "the tiny model's %u-token prefill takes the expanded form", T);
    for (int t = 0; t < KT_TYPE_COUNT; t++)
        fixed.nodes[0].prefill_fixed_gbps[t] = 0, fixed.nodes[0].head_dequant_gelems[t] = 1e9;
    fixed.nodes[0].attention_gflops = 1e9;
    plain.nodes[0].f32_cached_gbps = fixed.nodes[0].f32_cached_gbps = 10;
    kt_cost_destroy(a);
    a = cost(m, NULL, &plain), b = cost(m, NULL, &fixed);
    if (a && b) {
        struct kt_cost_query pq = {.mode = KT_COST_PREFILL, .tokens = T, .threads = 1, .chunk = 256};
        struct kt_cost_layer la, lb;
        kt_cost_layer(a, &pl.p, il, pl.homes[il], false, &pq, &la);
        kt_cost_layer(b, &pl.p, il, pl.homes[il], false, &pq, &lb);
        const double old_terms = 4.0 * H * (w + pairs * (dn + dr + dv)) / 10e9;
        const double free_terms = H * w / 1e18 + 2.0 * H * pairs * (dn + dr + dv) / 1e18;
        KT_CHECK(fabs((la.attention_s - lb.attention_s) - (old_terms - free_terms)) < 1e-6 * old_terms,
                 "heads at their own rates: %.9g s less, want %.9g", la.attention_s - lb.attention_s,
                 old_terms - free_terms);
    }
    kt_cost_destroy(a);
    kt_cost_destroy(b);
    kt_model_close(m);
}

static void device_parts_wait_for_the_slower(void)
{
    struct kt_model *m = tiny();
    if (!m)
        return;
    const uint32_t il = first_moe(m);
    struct kt_machine mc;
    machine(&mc, 1, 10);
    struct kt_cost_model *c = cost(m, NULL, &mc);
    struct plan pl;
    plan(&pl, m, 1);
    for (uint32_t l = 0; l < m->hp.n_layer; l++) {
        pl.layers[l].attention = 1;
        if (pl.layers[l].shared_experts == 0)
            pl.layers[l].shared_experts = 1;
    }
    for (uint32_t x = 0; x < m->hp.n_expert / 2; x++)
        pl.homes[il][x] = (struct kt_expert_home){1, -1, 0};
    struct kt_cost_query q = {.mode = KT_COST_DECODE, .batch = 1, .threads = 1};
    struct kt_cost_layer o;
    if (c) {
        kt_cost_layer(c, &pl.p, il, pl.homes[il], false, &q, &o);
        KT_CHECK(o.router_s == 0, "the router ran with attention on the device (%g s on the host)", o.router_s);
        KT_CHECK(o.transfer_s > 5 * 10e-6 && o.transfer_s < o.device_s, "copies %.9g s of device busy %.9g s",
                 o.transfer_s, o.device_s);
        /* the sim's thread shares the host's one core: the FFN takes both parts' time */
        KT_CHECK(fabs(o.experts_s - (o.cpu_experts_s + o.device_experts_s)) < 0.01 * o.experts_s,
                 "sim on one core: experts %.9g s = CPU %.9g + device %.9g", o.experts_s, o.cpu_experts_s,
                 o.device_experts_s);
        /* a GPU runs beside the host: the FFN waits for the slower */
        struct kt_machine gpu = mc;
        gpu.accel[0].backend = KT_PLACE_CUDA;
        pl.dev[1].backend = KT_PLACE_CUDA;
        struct kt_cost_model *cg = cost(m, NULL, &gpu);
        struct kt_cost_layer g;
        if (cg) {
            kt_cost_layer(cg, &pl.p, il, pl.homes[il], false, &q, &g);
            const double slower = g.cpu_experts_s > g.device_experts_s ? g.cpu_experts_s : g.device_experts_s;
            KT_CHECK(g.experts_s >= slower && g.experts_s < slower * 1.01 + 1e-6,
                     "experts %.9g s = the slower of CPU %.9g and device %.9g", g.experts_s, g.cpu_experts_s,
                     g.device_experts_s);
        }
        kt_cost_destroy(cg);
        pl.dev[1].backend = KT_PLACE_SIM;
        /* the machine file plans the sim as a device of its own (benchmarks/rebalance.sh's what-if):
         * the sim's plan is costed as that GPU's */
        struct kt_machine own = mc;
        own.accel[0].shares_host = false;
        struct kt_cost_model *co = cost(m, NULL, &own);
        struct kt_cost_layer s;
        if (co) {
            kt_cost_layer(co, &pl.p, il, pl.homes[il], false, &q, &s);
            const double slower = s.cpu_experts_s > s.device_experts_s ? s.cpu_experts_s : s.device_experts_s;
            KT_CHECK(s.experts_s >= slower && s.experts_s < slower * 1.01 + 1e-6 && s.experts_s < o.experts_s,
                     "a sim of its own: experts %.9g s = the slower of CPU %.9g and device %.9g (sharing: %.9g)",
                     s.experts_s, s.cpu_experts_s, s.device_experts_s, o.experts_s);
        }
        kt_cost_destroy(co);
        KT_CHECK(fabs(o.device_pairs - 0.5 * m->hp.n_expert_used) < 1e-9,
                 "half the routed pairs on the device, the shared expert's not counted (%g)", o.device_pairs);
        /* no accelerator in the machine file: refused, naming the device */
        struct kt_machine bare = mc;
        bare.n_accel = 0;
        struct kt_cost_model *c2 = cost(m, NULL, &bare);
        struct kt_cost_layer layers[8];
        kt_err err = {0};
        KT_CHECK(c2 && kt_cost_predict(c2, &pl.p, &q, layers, NULL, &err) == KT_ERR_INVALID && strstr(err.msg, "sim"),
                 "a plan's device the machine file lacks is refused: '%s'", err.msg);
        kt_cost_destroy(c2);
    }
    kt_cost_destroy(c);
    kt_model_close(m);
}

static void bad_plans_and_profiles_are_refused(void)
{
    struct kt_model *m = tiny();
    if (!m)
        return;
    struct kt_machine mc;
    machine(&mc, 1, 10);
    struct kt_cost_model *c = cost(m, NULL, &mc);
    struct plan pl;
    plan(&pl, m, 2); /* a plan for two nodes, a machine of one */
    struct kt_cost_layer layers[8];
    struct kt_cost_query q = {.mode = KT_COST_DECODE, .batch = 1};
    kt_err err = {0};
    KT_CHECK(c && kt_cost_predict(c, &pl.p, &q, layers, NULL, &err) == KT_ERR_INVALID && strstr(err.msg, "node 1"),
             "a node the machine file lacks: '%s'", err.msg);
    q.batch = 0;
    KT_CHECK(c && kt_cost_predict(c, &pl.p, &q, layers, NULL, &err) == KT_ERR_INVALID, "a batch of 0 is refused");
    struct kt_profile *other = NULL;
    KT_CHECK(kt_profile_create(m->hp.n_layer + 1, m->hp.n_expert, NULL, &other, &err) == KT_OK, "%s", err.msg);
    struct kt_cost_model *c2 = NULL;
    err = (kt_err){0};
    KT_CHECK(other && kt_cost_create(m, other, &mc, &c2, &err) == KT_ERR_INVALID && c2 == NULL && err.msg[0],
             "a profile of another shape is refused: '%s'", err.msg);
    struct kt_model_identity id;
    kt_model_identity(m, &id);
    id.fingerprint ^= 1; /* another model of the same shape */
    struct kt_profile *foreign = NULL;
    KT_CHECK(kt_profile_create(m->hp.n_layer, m->hp.n_expert, &id, &foreign, &err) == KT_OK, "%s", err.msg);
    err = (kt_err){0};
    KT_CHECK(foreign && kt_cost_create(m, foreign, &mc, &c2, &err) == KT_ERR_INVALID && c2 == NULL && strstr(err.msg, "profile"),
             "a profile of another model is refused: '%s'", err.msg);
    kt_profile_destroy(foreign);
    mc.n_nodes = 0;
    KT_CHECK(kt_cost_create(m, NULL, &mc, &c2, &err) == KT_ERR_INVALID && c2 == NULL, "a machine without nodes");
    kt_profile_destroy(other);
    kt_cost_destroy(c);
    kt_model_close(m);
}

/* ---- a Kimi-K2-shaped layer, built in memory (shapes and bytes only) ---------------------- */

static struct kt_gguf_tensor *tensor(struct kt_gguf_tensor *t, int type, int64_t ne0, int64_t ne1, int64_t ne2)
{
    const struct kt_type_traits *tr = kt_type_traits(type);
    memset(t, 0, sizeof *t);
    t->type = type;
    t->ne[0] = ne0, t->ne[1] = ne1, t->ne[2] = ne2, t->ne[3] = 1;
    t->n_dims = ne2 > 1 ? 3 : 2;
    t->nbytes = (uint64_t)(ne0 / tr->block_elems) * tr->block_bytes * (uint64_t)ne1 * (uint64_t)ne2;
    return t;
}

static void kimi_layer_is_cheap(void)
{
    enum { N_LAYER = 61, N_EXPERT = 384 };
    static struct kt_gguf_tensor t[16];
    static struct kt_layer layers[N_LAYER];
    struct kt_model m = {0};
    m.hp = (struct kt_hparams){.n_layer = N_LAYER, .n_embd = 7168, .n_ff = 18432, .n_head = 64, .n_head_kv = 1,
                               .q_lora_rank = 1536, .kv_lora_rank = 512, .qk_nope_dim = 128, .qk_rope_dim = 64,
                               .v_head_dim = 128, .mla_split = true, .n_dense_lead = 1, .n_expert = N_EXPERT,
                               .n_expert_used = 8, .n_expert_shared = 1, .n_ff_exp = 2048, .n_vocab = 163840};
    const int Q = KT_TYPE_Q4_K;
    struct kt_layer L = {.is_moe = true,
                         .attn_q_a = tensor(&t[0], Q, 7168, 1536, 1),
                         .attn_q_b = tensor(&t[1], Q, 1536, 64 * 192, 1),
                         .attn_kv_a_mqa = tensor(&t[2], Q, 7168, 576, 1),
                         .attn_k_b = tensor(&t[3], KT_TYPE_Q8_0, 128, 512, 64),
                         .attn_v_b = tensor(&t[4], KT_TYPE_Q8_0, 512, 128, 64),
                         .attn_output = tensor(&t[5], Q, 8192, 7168, 1),
                         .ffn_gate_inp = tensor(&t[6], KT_TYPE_F32, 7168, N_EXPERT, 1),
                         .ffn_gate_exps = tensor(&t[7], Q, 7168, 2048, N_EXPERT),
                         .ffn_up_exps = tensor(&t[8], Q, 7168, 2048, N_EXPERT),
                         .ffn_down_exps = tensor(&t[9], KT_TYPE_Q6_K, 2048, 7168, N_EXPERT),
                         .ffn_gate_shexp = tensor(&t[10], Q, 7168, 2048, 1),
                         .ffn_up_shexp = tensor(&t[11], Q, 7168, 2048, 1),
                         .ffn_down_shexp = tensor(&t[12], KT_TYPE_Q6_K, 2048, 7168, 1)};
    for (int il = 0; il < N_LAYER; il++)
        layers[il] = L;
    m.layers = layers;
    m.output = tensor(&t[13], KT_TYPE_Q6_K, 7168, 163840, 1);
    m.token_embd = tensor(&t[14], Q, 7168, 163840, 1);
    struct kt_machine mc;
    machine(&mc, 2, 100);
    struct kt_cost_model *c = cost(&m, NULL, &mc);
    static struct kt_placement_layer pls[N_LAYER];
    static struct kt_expert_home homes[N_EXPERT];
    struct kt_placement_device devs[2] = {{.name = "cpu"}, {.name = "sim", .backend = KT_PLACE_SIM}};
    struct kt_placement p = {.n_devices = 2, .devices = devs, .n_layer = N_LAYER, .n_expert = N_EXPERT, .layers = pls,
                             .n_nodes = 2, .expert_nodes = 3};
    for (int x = 0; x < N_EXPERT; x++)
        homes[x] = (struct kt_expert_home){x < 32 ? 1 : 0, x < 32 ? -1 : x % 2, 0};
    for (int il = 0; il < N_LAYER; il++)
        pls[il] = (struct kt_placement_layer){.is_moe = true, .attention = 1, .dense_ffn = -1, .shared_experts = 1,
                                              .experts = homes};
    struct kt_cost_query q = {.mode = KT_COST_DECODE, .batch = 1, .threads = 2};
    const int calls = 61 * 20;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    double sum = 0.0;
    for (int i = 0; c && i < calls; i++)
        sum += kt_cost_layer(c, &p, (uint32_t)(i % N_LAYER), homes, false, &q, NULL);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    const double us = ((t1.tv_sec - t0.tv_sec) * 1e9 + (t1.tv_nsec - t0.tv_nsec)) / 1e3 / calls;
    printf("kt_cost_layer, Kimi-K2 shape (384 experts, 2 nodes, sim device): %.1f us per call\n", us);
    KT_CHECK(sum > 0 && isfinite(sum), "predictions are finite and positive (%g)", sum);
    KT_CHECK(us < 500, "a layer's prediction takes %.1f us (the planner makes thousands)", us);
    kt_cost_destroy(c);
}

int main(void)
{
    KT_RUN(p_active_is_one_minus_miss_to_the_batch);
    KT_RUN(busiest_node_matches_enumeration);
    KT_RUN(busiest_node_matches_monte_carlo);
    KT_RUN(moving_an_expert_to_the_device_never_adds_cpu_time);
    KT_RUN(sliced_layers_are_balanced);
    KT_RUN(replicas_share_their_experts_load);
    KT_RUN(decode_is_bandwidth_bound_and_prefill_is_its_chunks);
    KT_RUN(prefill_reads_at_the_fixed_part_and_heads_at_their_rates);
    KT_RUN(device_parts_wait_for_the_slower);
    KT_RUN(bad_plans_and_profiles_are_refused);
    KT_RUN(kimi_layer_is_cheap);
    if (g_tiny[0])
        remove(g_tiny);
    return kt_test_finish();
}
