/*
 * model.c - `kt-bench model`: a seeded random prompt prefilled in chunks,
 * then greedy decode, through the engine on N threads; a STREAM triad on
 * the same threads first.  Reports prefill and decode tok/s, weight bytes
 * per decoded token and their rate / triad, and each layer's time split
 * (attention, router, experts, combine) from the engine's own counters.
 * It drives the runtime and prints; it must never compute model math itself.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench.h"
#include "backend.h"
#include "cost.h"
#include "engine.h"
#include "machine.h"
#include "membw.h"
#include "peak.h"
#include "model.h"
#include "pipeline.h"
#include "placement_opt.h"
#include "preflight.h"
#include "profile.h"
#include "ranks.h"
#include "ranks_plan.h"
#include "svg.h"
#include "transport.h"

struct phase {
    const char *name;
    uint32_t tokens;
    double seconds;             /* wall time of the steps, measured here */
    struct kt_engine_stats stats;
    struct kt_engine_layer_stats *layers; /* [n_layer] */
    bool has_device;
    struct kt_backend_stats device; /* the accelerator's queue, when the placement has one */
};

/* Decode tokens between two triads, and the most blocks kept for the median. */
#define DECODE_BLOCK 8
#define KT_BENCH_MAX_BLOCKS 1024

static uint64_t layer_total_ns(const struct kt_engine_layer_stats *l)
{
    return l->attention_ns + l->router_ns + l->experts_ns + l->combine_ns;
}

/* Copies the engine's counters into ph and adds its routing counts to
 * routes[KT_ROUTE_DECODE / PREFILL] (n_layer, n_expert), then resets them for the next phase. */
static void take_stats(struct kt_engine *e, uint32_t n_layer, struct phase *ph, uint64_t *routes[2], size_t cells)
{
    for (int r = 0; r < 2; r++) {
        const uint64_t *c = kt_engine_route_counts(e, r, NULL);
        for (size_t i = 0; i < cells; i++)
            routes[r][i] += c[i];
    }
    kt_engine_stats(e, &ph->stats);
    ph->has_device = kt_engine_device_stats(e, &ph->device) == KT_OK;
    for (uint32_t il = 0; il < n_layer; il++)
        kt_engine_layer_stats(e, il, &ph->layers[il]);
    kt_engine_stats_reset(e);
}

/* Sequence 0 prefilled with prompt[0, n) in chunks of `chunk` tokens; only the last token's logits. */
static kt_status prefill(struct kt_engine *e, const int32_t *prompt, uint32_t n, uint32_t chunk,
                         struct kt_batch_token *batch, float *logits, kt_err *err)
{
    for (uint32_t i = 0; i < n; i += chunk) {
        const uint32_t m = n - i < chunk ? n - i : chunk;
        for (uint32_t k = 0; k < m; k++)
            batch[k] = (struct kt_batch_token){prompt[i + k], 0, i + k, i + k == n - 1};
        kt_status st = kt_engine_step(e, &(struct kt_batch){m, batch}, logits, err);
        if (st != KT_OK)
            return st;
    }
    return KT_OK;
}

/* Nodes whose pools ran routed experts in a phase: 1 + the last with pairs or busy time; 0: none. */
static int nodes_used(const struct phase *ph)
{
    int n = 0;
    for (int i = 0; i < 16; i++)
        if (ph->stats.node_pairs[i] || ph->stats.node_busy_ns[i])
            n = i + 1;
    return n;
}

static json_t *phase_json(const struct phase *ph, uint32_t n_layer, double triad_gbps, bool decode)
{
    json_t *j = json_object();
    const double ns = 1e9 * ph->seconds;
    uint64_t layers_ns = 0;
    json_t *jl = json_array();
    for (uint32_t il = 0; il < n_layer; il++) {
        const struct kt_engine_layer_stats *l = &ph->layers[il];
        layers_ns += layer_total_ns(l);
        json_t *x = json_object();
        json_object_set_new(x, "layer", json_integer(il));
        json_object_set_new(x, "attention_ns", json_integer((json_int_t)l->attention_ns));
        json_object_set_new(x, "attention_proj_ns", json_integer((json_int_t)l->attention_proj_ns));
        json_object_set_new(x, "router_ns", json_integer((json_int_t)l->router_ns));
        json_object_set_new(x, "experts_ns", json_integer((json_int_t)l->experts_ns));
        json_object_set_new(x, "combine_ns", json_integer((json_int_t)l->combine_ns));
        json_object_set_new(x, "total_ns", json_integer((json_int_t)layer_total_ns(l)));
        if (ph->has_device) {
            json_object_set_new(x, "device_ns", json_integer((json_int_t)l->device_ns));
            json_object_set_new(x, "device_transfer_ns", json_integer((json_int_t)l->device_transfer_ns));
        }
        if (l->node_busy_mean_ns > 0) { /* more than one node pool */
            json_object_set_new(x, "node_busy_max_ns", json_integer((json_int_t)l->node_busy_max_ns));
            json_object_set_new(x, "node_busy_mean_ns", json_integer((json_int_t)l->node_busy_mean_ns));
            json_object_set_new(x, "node_balance", json_real((double)l->node_busy_max_ns / (double)l->node_busy_mean_ns));
        }
        json_array_append_new(jl, x);
    }
    json_object_set_new(j, "tokens", json_integer(ph->tokens));
    json_object_set_new(j, "steps", json_integer((json_int_t)ph->stats.steps));
    json_object_set_new(j, "wall_ns", json_integer((json_int_t)ns));
    json_object_set_new(j, "tok_per_s", json_real(ph->tokens / ph->seconds));
    json_object_set_new(j, "layers_ns", json_integer((json_int_t)layers_ns));
    json_object_set_new(j, "embed_head_ns", json_integer((json_int_t)ph->stats.embed_head_ns));
    json_object_set_new(j, "attention_ns", json_integer((json_int_t)ph->stats.attention_ns));
    json_object_set_new(j, "router_ns", json_integer((json_int_t)ph->stats.router_ns));
    json_object_set_new(j, "experts_ns", json_integer((json_int_t)ph->stats.experts_ns));
    json_object_set_new(j, "weight_bytes", json_integer((json_int_t)ph->stats.weight_bytes));
    json_object_set_new(j, "cpu_ffn_busy_ns", json_integer((json_int_t)ph->stats.cpu_experts_busy_ns));
    if (nodes_used(ph)) { /* per NUMA node pool: routed pairs (row-sliced: each node counts every pair) and busy time */
        json_t *pairs = json_array(), *busy = json_array();
        for (int i = 0; i < nodes_used(ph); i++) {
            json_array_append_new(pairs, json_integer((json_int_t)ph->stats.node_pairs[i]));
            json_array_append_new(busy, json_integer((json_int_t)ph->stats.node_busy_ns[i]));
        }
        json_object_set_new(j, "node_pairs", pairs);
        json_object_set_new(j, "node_busy_ns", busy);
    }
    if (ph->has_device) {
        json_t *d = json_object();
        json_object_set_new(d, "busy_ns", json_integer((json_int_t)ph->device.busy_ns));
        json_object_set_new(d, "transfer_ns", json_integer((json_int_t)ph->device.transfer_ns));
        json_object_set_new(d, "bytes_in", json_integer((json_int_t)ph->device.bytes_in));
        json_object_set_new(d, "bytes_out", json_integer((json_int_t)ph->device.bytes_out));
        json_object_set_new(d, "pairs", json_integer((json_int_t)ph->stats.device_pairs));
        json_object_set_new(d, "cpu_wait_ns", json_integer((json_int_t)ph->stats.device_wait_ns));
        json_object_set_new(j, "device", d);
    }
    if (decode) {
        const double per_token = (double)ph->stats.weight_bytes / ph->tokens;
        const double gbps = (double)ph->stats.weight_bytes / ph->seconds * 1e-9;
        json_object_set_new(j, "weight_bytes_per_token", json_real(per_token));
        json_object_set_new(j, "weight_gbps", json_real(gbps));
        json_object_set_new(j, "ratio_to_triad", json_real(gbps / triad_gbps));
    }
    json_object_set_new(j, "layers", jl);
    return j;
}

/* {"decode": [[...], ...], "prefill": [...]}: tokens routed to each (layer, expert)
 * over the whole run, a token being prefill when its step had more of its
 * sequence (engine.h); dense layers' rows are empty. */
static json_t *routing_json(const struct kt_model *m, uint64_t *const routes[2])
{
    json_t *j = json_object();
    for (int r = 0; r < 2; r++) {
        json_t *rows = json_array();
        for (uint32_t il = 0; il < m->hp.n_layer; il++) {
            json_t *row = json_array();
            for (uint32_t x = 0; m->layers[il].is_moe && x < m->hp.n_expert; x++)
                json_array_append_new(row, json_integer((json_int_t)routes[r][(size_t)il * m->hp.n_expert + x]));
            json_array_append_new(rows, row);
        }
        json_object_set_new(j, r == KT_ROUTE_DECODE ? "decode" : "prefill", rows);
    }
    return j;
}

/* kt-bench model --svg: each layer's decode time per token, split into
 * attention, router, experts and combine (and the device's busy time when
 * there is one, which overlaps the rest). */
static kt_status draw_split(const char *path, const char *model, const struct phase *ph, uint32_t n_layer, kt_err *err)
{
    static const char *const parts[] = {"attention", "router", "experts", "combine"};
    double *v = malloc(((size_t)n_layer * 4 + 1) * sizeof *v);
    if (!v)
        return kt_err_set(err, KT_ERR_NOMEM, "%s: out of memory", path);
    const double per_token = ph->tokens ? 1e-6 / ph->tokens : 0;
    for (uint32_t il = 0; il < n_layer; il++) {
        const struct kt_engine_layer_stats *l = &ph->layers[il];
        v[il * 4 + 0] = l->attention_ns * per_token;
        v[il * 4 + 1] = l->router_ns * per_token;
        v[il * 4 + 2] = l->experts_ns * per_token;
        v[il * 4 + 3] = l->combine_ns * per_token;
    }
    char title[512];
    snprintf(title, sizeof title, "%s: decode time per layer, %u tokens", model, ph->tokens);
    kt_status st = kt_svg_stacked_bars(path, title, n_layer, 4, v, "layer %u", parts, "ms per token", err);
    free(v);
    return st;
}

static void print_phase(const struct phase *ph, uint32_t n_layer)
{
    uint64_t sum[6] = {0}, layers_ns = 0;
    for (uint32_t il = 0; il < n_layer; il++) {
        const struct kt_engine_layer_stats *l = &ph->layers[il];
        sum[0] += l->attention_ns, sum[1] += l->router_ns, sum[2] += l->experts_ns, sum[3] += l->combine_ns;
        sum[4] += l->device_ns, sum[5] += l->device_transfer_ns;
        layers_ns += layer_total_ns(l);
    }
    printf("\n%s per layer (ms over %u tokens%s):\n", ph->name, ph->tokens,
           ph->has_device ? "; device: its queue's busy time, overlapping the host's parts; copy: of it copying" : "");
    printf("  %5s %10s %10s %10s %10s %10s", "layer", "attention", "router", "experts", "combine", "total");
    printf(ph->has_device ? " %10s %10s\n" : "\n", "device", "copy");
    for (uint32_t il = 0; il <= n_layer; il++) {
        const struct kt_engine_layer_stats *l = &ph->layers[il < n_layer ? il : 0];
        const uint64_t v[7] = {l->attention_ns, l->router_ns,  l->experts_ns,         l->combine_ns,
                               layer_total_ns(l), l->device_ns, l->device_transfer_ns};
        const uint64_t *row = il < n_layer ? v : (const uint64_t[7]){sum[0], sum[1], sum[2], sum[3], layers_ns,
                                                                      sum[4], sum[5]};
        if (il < n_layer)
            printf("  %5u", il);
        else
            printf("  %5s", "sum");
        for (int i = 0; i < (ph->has_device ? 7 : 5); i++)
            printf(" %10.3f", 1e-6 * row[i]);
        printf("\n");
    }
    printf("  embedding + output head %.3f ms; steps' wall time %.3f ms\n", 1e-6 * ph->stats.embed_head_ns,
           1e3 * ph->seconds);
    uint64_t proj_ns = 0; /* attention's projections; the rest of it (heads over the context) grows with depth */
    for (uint32_t il = 0; il < n_layer; il++)
        proj_ns += ph->layers[il].attention_proj_ns;
    const double per_token = ph->tokens ? 1e-6 / ph->tokens : 0.0;
    printf("  attention per token %.3f ms: heads over the context %.3f ms, projections %.3f ms\n",
           per_token * (double)sum[0], per_token * (double)(sum[0] - proj_ns), per_token * (double)proj_ns);
    bool nodes = false;
    for (uint32_t il = 0; il < n_layer; il++)
        nodes |= ph->layers[il].node_busy_mean_ns > 0;
    if (nodes) {
        printf("  node balance per MoE layer (busiest / mean node pool busy time, per step, summed):");
        for (uint32_t il = 0; il < n_layer; il++)
            if (ph->layers[il].node_busy_mean_ns > 0)
                printf(" %u: %.3f", il, (double)ph->layers[il].node_busy_max_ns / (double)ph->layers[il].node_busy_mean_ns);
        printf("\n");
    }
}

/* ---- each part against its limit ------------------------------------------------------------ */

static uint64_t tensor_bytes(const struct kt_gguf_tensor *t)
{
    return t ? t->nbytes : 0;
}

/* Multiply-adds of a 2-D tensor's product with one token ({n_in, n_out}): n_in * n_out. */
static double tensor_macs(const struct kt_gguf_tensor *t)
{
    return t ? (double)t->ne[0] * (double)(t->ne[1] * t->ne[2] * t->ne[3]) : 0.0;
}

/* What each part of a step moves or computes, from the file's tensor table
 * and the routing the engine counted: bytes as stored in the file (packed
 * copies hold the same quants), int8 ops as 2 per multiply-add. */
struct part_work {
    double attention_bytes;     /* per token: every layer's projections, W_UK and W_UV */
    double attention_proj_bytes; /* per token: the projections alone */
    double attention_macs;      /* per token: the projections alone (W_qa, W_qb / W_q, W_kva, W_o) */
    double expert_bytes;        /* one routed expert's gate, up and down of a MoE layer */
    double expert_macs;         /* its multiply-adds per token */
    double shared_bytes;        /* per token, all MoE layers' shared experts */
    double shared_macs;
    double dense_macs;          /* per token, dense FFN layers */
    double head_macs;           /* per token whose logits are wanted */
};

static void part_work(const struct kt_model *m, struct part_work *w)
{
    memset(w, 0, sizeof *w);
    for (uint32_t il = 0; il < m->hp.n_layer; il++) {
        const struct kt_layer *l = &m->layers[il];
        const struct kt_gguf_tensor *proj[] = {l->attn_q_a, l->attn_q_b, l->attn_q, l->attn_kv_a_mqa, l->attn_output};
        for (size_t i = 0; i < sizeof proj / sizeof proj[0]; i++) {
            w->attention_bytes += tensor_bytes(proj[i]), w->attention_macs += tensor_macs(proj[i]);
            w->attention_proj_bytes += tensor_bytes(proj[i]);
        }
        w->attention_bytes += tensor_bytes(l->attn_k_b) + tensor_bytes(l->attn_v_b) + tensor_bytes(l->attn_kv_b);
        if (!l->is_moe) {
            w->dense_macs += tensor_macs(l->ffn_gate) + tensor_macs(l->ffn_up) + tensor_macs(l->ffn_down);
            continue;
        }
        const double ne = m->hp.n_expert;
        w->expert_bytes = (tensor_bytes(l->ffn_gate_exps) + tensor_bytes(l->ffn_up_exps) +
                           tensor_bytes(l->ffn_gate_up_exps) + tensor_bytes(l->ffn_down_exps)) / ne;
        w->expert_macs = (tensor_macs(l->ffn_gate_exps) + tensor_macs(l->ffn_up_exps) +
                          tensor_macs(l->ffn_gate_up_exps) + tensor_macs(l->ffn_down_exps)) / ne;
        w->shared_bytes += tensor_bytes(l->ffn_gate_shexp) + tensor_bytes(l->ffn_up_shexp) + tensor_bytes(l->ffn_down_shexp);
        w->shared_macs += tensor_macs(l->ffn_gate_shexp) + tensor_macs(l->ffn_up_shexp) + tensor_macs(l->ffn_down_shexp);
    }
    w->head_macs = tensor_macs(m->output);
}

/*
 * The issue-16 table in one run: decode parts as bytes / time against the
 * mean of the triads measured beside the decode blocks; prefill parts as
 * int8 ops / time against the mean of the int8 dot peaks measured just
 * before and after the timed prefill.
 * "attention" at decode is the whole attention (projections and heads);
 * at prefill both the projections alone (their own clock) and the whole
 * attention are given, each with the projections' ops.
 */
static void print_parts(const struct kt_model *m, const struct phase *pre, const struct phase *dec,
                        uint64_t *const routes[2], double decode_triad_gbps, const struct kt_peak_result *peak)
{
    struct part_work w;
    part_work(m, &w);
    const uint32_t n_layer = m->hp.n_layer, ne = m->hp.n_expert;
    uint64_t att_ns[2] = {0}, proj_ns[2] = {0}, moe_ns[2] = {0}, pairs[2] = {0}, total_ns[2] = {0};
    const struct phase *ph[2] = {pre, dec};
    for (int p = 0; p < 2; p++)
        for (uint32_t il = 0; il < n_layer; il++) {
            const struct kt_engine_layer_stats *l = &ph[p]->layers[il];
            att_ns[p] += l->attention_ns, proj_ns[p] += l->attention_proj_ns, total_ns[p] += layer_total_ns(l);
            if (m->layers[il].is_moe) {
                moe_ns[p] += l->experts_ns;
                for (uint32_t x = 0; x < ne; x++)
                    pairs[p] += routes[p ? KT_ROUTE_DECODE : KT_ROUTE_PREFILL][(size_t)il * ne + x];
            }
        }
    const double tok[2] = {pre->tokens, dec->tokens};
    printf("\nparts against their limits (decode: bytes / time over the mean of the decode phase's triads, "
           "%.2f GB/s; prefill: int8 ops / time over the %s int8 dot peak beside it, %.1f GOP/s):\n",
           decode_triad_gbps, kt_isa_name(peak->isa), peak->best_gops);
    const double dec_att = w.attention_bytes * tok[1] / (att_ns[1] * 1e-9) * 1e-9;
    const double dec_exp = (w.expert_bytes * pairs[1] + w.shared_bytes * tok[1]) / (moe_ns[1] * 1e-9) * 1e-9;
    printf("  decode, attention (all of it)        %7.2f GB/s = %.3f x triad\n", dec_att, dec_att / decode_triad_gbps);
    const double dec_proj = w.attention_proj_bytes * tok[1] / (proj_ns[1] * 1e-9) * 1e-9;
    printf("  decode, attention projections        %7.2f GB/s = %.3f x triad  (%.3f of %.3f ms attention a token)\n",
           dec_proj, dec_proj / decode_triad_gbps, proj_ns[1] * 1e-6 / tok[1], att_ns[1] * 1e-6 / tok[1]);
    printf("  decode, routed + shared experts      %7.2f GB/s = %.3f x triad  (%.2f routed pairs per token)\n",
           dec_exp, dec_exp / decode_triad_gbps, pairs[1] / tok[1]);
    const double pre_proj = 2 * w.attention_macs * tok[0] / (proj_ns[0] * 1e-9) * 1e-9;
    const double pre_att = 2 * w.attention_macs * tok[0] / (att_ns[0] * 1e-9) * 1e-9;
    const double pre_exp = 2 * (w.expert_macs * pairs[0] + w.shared_macs * tok[0]) / (moe_ns[0] * 1e-9) * 1e-9;
    const double pre_all = 2 * (w.attention_macs * tok[0] + w.expert_macs * pairs[0] + w.shared_macs * tok[0] +
                                w.dense_macs * tok[0] + w.head_macs) / pre->seconds * 1e-9;
    printf("  prefill, attention projections       %7.1f GOP/s = %.3f of peak  (%.1f of %.1f ms attention)\n",
           pre_proj, pre_proj / peak->best_gops, proj_ns[0] * 1e-6, att_ns[0] * 1e-6);
    printf("  prefill, attention (all of it)       %7.1f GOP/s = %.3f of peak  (the projections' ops)\n", pre_att,
           pre_att / peak->best_gops);
    printf("  prefill, routed + shared experts     %7.1f GOP/s = %.3f of peak\n", pre_exp, pre_exp / peak->best_gops);
    printf("  prefill, whole step                  %7.1f GOP/s = %.3f of peak  (every product's ops / wall time)\n",
           pre_all, pre_all / peak->best_gops);
}

/* ---- --predict: the cost model beside the measured times ---------------------------------- */

struct prediction {
    char machine[300], profile[300]; /* what it was made from, for the report */
    struct kt_cost_layer *layers[2];  /* [n_layer] summed over the phase's steps: prefill, decode */
    double step_s[2];
};

static void add_cost(struct kt_cost_layer *acc, const struct kt_cost_layer *l)
{
    acc->attention_s += l->attention_s, acc->router_s += l->router_s, acc->experts_s += l->experts_s;
    acc->combine_s += l->combine_s, acc->device_s += l->device_s, acc->transfer_s += l->transfer_s;
    acc->total_s += l->total_s;
}

/* --predict's inputs, read and checked before the engine loads a weight:
 * the machine file (or the stated defaults for the placement's nodes) and
 * the profile, which must be this model's; the caller frees both. */
static kt_status predict_inputs(const struct kt_bench_options *o, const struct kt_model *m, const char *topology,
                                struct kt_machine **mach, struct kt_profile **prof, kt_err *err)
{
    struct kt_placement *p = NULL;
    *mach = NULL, *prof = NULL;
    kt_status st = kt_tool_placement_resolve(o->placement, m, topology, &p, err);
    if (st == KT_OK && o->machine) {
        if ((st = kt_machine_load(o->machine, mach, err)) == KT_OK)
            st = kt_machine_check_kind(*mach, o->machine, err);
    } else if (st == KT_OK) {
        if (!(*mach = calloc(1, sizeof **mach)))
            st = kt_err_set(err, KT_ERR_NOMEM, "out of memory");
        else
            kt_machine_defaults(*mach, p->n_nodes);
    }
    if (st == KT_OK && (*mach)->n_defaulted > 0)
        fprintf(stderr, "kt-bench: warning: %s: %u figures defaulted (first: %s); run kt-bench machine\n",
                o->machine ? o->machine : "no --machine", (*mach)->n_defaulted, (*mach)->defaulted[0]);
    if (st == KT_OK && o->profile) {
        struct kt_model_identity id;
        kt_model_identity(m, &id);
        if ((st = kt_profile_load(o->profile, prof, err)) == KT_OK)
            st = kt_profile_check_model(*prof, &id, o->profile, err);
    }
    kt_placement_destroy(p);
    if (st != KT_OK) {
        kt_err_prefix(err, "--predict");
        free(*mach), kt_profile_destroy(*prof);
        *mach = NULL, *prof = NULL;
    }
    return st;
}

/* The prediction of the run kt_bench_model makes: a prefill of prompt_tokens
 * in chunks of `chunk`, then gen_tokens decode steps at rising context. */
static kt_status predict(const struct kt_bench_options *o, const struct kt_model *m, const char *topology,
                         const struct kt_machine *mach, const struct kt_profile *prof, uint32_t threads,
                         uint32_t chunk, struct prediction *pr, kt_err *err)
{
    struct kt_placement *p = NULL;
    struct kt_cost_model *c = NULL;
    struct kt_cost_layer *one = NULL;
    const uint32_t n_layer = m->hp.n_layer;
    kt_status st = kt_tool_placement_resolve(o->placement, m, topology, &p, err);
    if (st == KT_OK)
        st = kt_cost_create(m, prof, mach, &c, err);
    if (st == KT_OK) {
        snprintf(pr->machine, sizeof pr->machine, "%s", o->machine ? o->machine : "defaults");
        snprintf(pr->profile, sizeof pr->profile, "%s", o->profile ? o->profile : "uniform routing");
        pr->layers[0] = calloc(n_layer, sizeof *pr->layers[0]);
        pr->layers[1] = calloc(n_layer, sizeof *pr->layers[1]);
        one = calloc(n_layer, sizeof *one);
        if (!pr->layers[0] || !pr->layers[1] || !one)
            st = kt_err_set(err, KT_ERR_NOMEM, "out of memory");
    }
    if (st == KT_OK) {
        const struct kt_cost_query q = {.mode = KT_COST_PREFILL, .tokens = o->prompt_tokens, .threads = threads,
                                        .chunk = chunk};
        st = kt_cost_predict(c, p, &q, pr->layers[0], &pr->step_s[0], err);
    }
    for (uint32_t i = 0; st == KT_OK && i < o->gen_tokens; i++) {
        const struct kt_cost_query q = {.mode = KT_COST_DECODE, .batch = 1, .context = o->prompt_tokens + i,
                                        .threads = threads};
        double step = 0;
        st = kt_cost_predict(c, p, &q, one, &step, err);
        for (uint32_t il = 0; st == KT_OK && il < n_layer; il++)
            add_cost(&pr->layers[1][il], &one[il]);
        pr->step_s[1] += step;
    }
    if (st != KT_OK)
        kt_err_prefix(err, "--predict");
    free(one);
    kt_cost_destroy(c);
    kt_placement_destroy(p);
    return st;
}

static double rel_error(double predicted, double measured)
{
    return measured > 0 ? (predicted - measured) / measured : 0.0;
}

static void print_prediction(const struct phase *ph, const struct kt_cost_layer *pl, uint32_t n_layer)
{
    printf("\n%s per layer, measured / predicted (ms over %u tokens):\n", ph->name, ph->tokens);
    printf("  %5s %17s %17s %17s %17s %17s %7s", "layer", "attention", "router", "experts", "combine", "total",
           "error");
    printf(ph->has_device ? " %17s\n" : "\n", "device");
    double sum_m[6] = {0}, sum_p[6] = {0};
    for (uint32_t il = 0; il <= n_layer; il++) {
        double meas[6], pred[6];
        if (il < n_layer) {
            const struct kt_engine_layer_stats *l = &ph->layers[il];
            const struct kt_cost_layer *c = &pl[il];
            const double m[6] = {l->attention_ns, l->router_ns, l->experts_ns, l->combine_ns, layer_total_ns(l),
                                 l->device_ns};
            const double p[6] = {c->attention_s, c->router_s, c->experts_s, c->combine_s, c->total_s, c->device_s};
            for (int i = 0; i < 6; i++) {
                meas[i] = m[i] * 1e-6, pred[i] = p[i] * 1e3;
                sum_m[i] += meas[i], sum_p[i] += pred[i];
            }
            printf("  %5u", il);
        } else {
            memcpy(meas, sum_m, sizeof meas), memcpy(pred, sum_p, sizeof pred);
            printf("  %5s", "sum");
        }
        for (int i = 0; i < 5; i++)
            printf(" %8.3f %8.3f", meas[i], pred[i]);
        printf(" %+6.1f%%", 100 * rel_error(pred[4], meas[4]));
        if (ph->has_device)
            printf(" %8.3f %8.3f", meas[5], pred[5]);
        printf("\n");
    }
}

static json_t *prediction_json(const struct phase *ph, const struct kt_cost_layer *pl, double step_s,
                               uint32_t n_layer)
{
    json_t *j = json_object(), *jl = json_array();
    for (uint32_t il = 0; il < n_layer; il++) {
        const struct kt_cost_layer *c = &pl[il];
        json_t *x = json_object();
        json_object_set_new(x, "layer", json_integer(il));
        json_object_set_new(x, "attention_ns", json_integer((json_int_t)(c->attention_s * 1e9)));
        json_object_set_new(x, "router_ns", json_integer((json_int_t)(c->router_s * 1e9)));
        json_object_set_new(x, "experts_ns", json_integer((json_int_t)(c->experts_s * 1e9)));
        json_object_set_new(x, "combine_ns", json_integer((json_int_t)(c->combine_s * 1e9)));
        json_object_set_new(x, "total_ns", json_integer((json_int_t)(c->total_s * 1e9)));
        json_object_set_new(x, "device_ns", json_integer((json_int_t)(c->device_s * 1e9)));
        json_object_set_new(x, "device_transfer_ns", json_integer((json_int_t)(c->transfer_s * 1e9)));
        json_object_set_new(x, "error", json_real(rel_error(c->total_s * 1e9, (double)layer_total_ns(&ph->layers[il]))));
        json_array_append_new(jl, x);
    }
    json_object_set_new(j, "step_ns", json_integer((json_int_t)(step_s * 1e9)));
    json_object_set_new(j, "layers", jl);
    return j;
}

/* Under mpirun: rank 0's account of a phase's steps through the pipeline.  At one token a step (kt-bench
 * model's decode) and in prefill chunks the steps go whole, rank after rank: what a step took beyond the
 * ranks' work is the activations' transfer and the messages' latency, beside it what kt-place's link model
 * makes of the step's messages with the hops measured before the run (link_s). */
static void print_pipeline(const char *phase, const struct kt_pipeline_stats *ps, double link_s)
{
    if (ps->steps == 0)
        return;
    uint64_t busy = 0;
    for (int r = 0; r < ps->n_ranks; r++)
        busy += ps->busy_ns[r];
    const double per_step = (double)ps->step_ns / (double)ps->steps * 1e-6;
    const double comm = ps->step_ns > busy ? (double)(ps->step_ns - busy) / (double)ps->steps * 1e-6 : 0;
    printf("pipeline, %-7s        %d ranks, %llu steps of %.3f ms: ranks busy", phase, ps->n_ranks,
           (unsigned long long)ps->steps, per_step);
    for (int r = 0; r < ps->n_ranks; r++)
        printf(" %.3f", (double)ps->busy_ns[r] / (double)ps->steps * 1e-6);
    printf(" ms a step; communication %.3f ms a step (the link model: %.3f); bubble %.0f%%\n", comm, link_s * 1e3,
           100.0 * kt_pipeline_bubble(ps));
}

static json_t *pipeline_json(const struct kt_pipeline_stats *ps, double link_s)
{
    json_t *j = json_object(), *busy = json_array();
    uint64_t sum = 0;
    for (int r = 0; r < ps->n_ranks; r++) {
        json_array_append_new(busy, json_real((double)ps->busy_ns[r] * 1e-9));
        sum += ps->busy_ns[r];
    }
    json_object_set_new(j, "ranks", json_integer(ps->n_ranks));
    json_object_set_new(j, "steps", json_integer((json_int_t)ps->steps));
    json_object_set_new(j, "step_seconds", json_real((double)ps->step_ns * 1e-9));
    json_object_set_new(j, "rank0_wait_seconds", json_real((double)ps->wait_ns * 1e-9));
    json_object_set_new(j, "busy_seconds", busy);
    json_object_set_new(j, "communication_seconds_per_step",
                        json_real(ps->steps && ps->step_ns > sum ? (double)(ps->step_ns - sum) * 1e-9 / ps->steps : 0));
    json_object_set_new(j, "bubble", json_real(kt_pipeline_bubble(ps)));
    json_object_set_new(j, "link_model_seconds_per_step", json_real(link_s));
    json_object_set_new(j, "sent_bytes", json_integer((json_int_t)ps->sent_bytes));
    json_object_set_new(j, "received_bytes", json_integer((json_int_t)ps->received_bytes));
    return j;
}

#define LINK_REPS 50 /* round trips of the small messages when the run measures the hops */

/* The tokens of the run's first prefill step: the prefill chunk's message the hops are timed with. */
static uint32_t prefill_message_tokens(const struct kt_bench_options *o, const struct kt_engine *e)
{
    const uint32_t chunk = kt_engine_max_batch_tokens(e);
    return o->prompt_tokens < chunk ? o->prompt_tokens : chunk;
}

/* kt-place's link model of the run's prefill steps (chunks of the prompt), a step on average. */
static double prefill_link_seconds(const struct kt_bench_link *links, int n_ranks, const struct kt_bench_options *o,
                                   const struct kt_engine *e)
{
    const uint32_t chunk = kt_engine_max_batch_tokens(e), n_embd = kt_engine_n_embd(e);
    double s = 0;
    uint32_t steps = 0;
    for (uint32_t done = 0; done < o->prompt_tokens; done += chunk, steps++)
        s += kt_bench_link_step_seconds(links, n_ranks, n_embd,
                                        o->prompt_tokens - done < chunk ? o->prompt_tokens - done : chunk);
    return steps ? s / steps : 0;
}

/* Ranks > 0 of `mpirun kt-bench model`: this rank's layers, following rank 0's steps until it stops. */
static int follow(const struct kt_bench_options *o, struct kt_transport *t, struct kt_model *m,
                  struct kt_engine_params *ep)
{
    kt_err err = {0};
    struct kt_engine *e = NULL;
    struct kt_pipeline *p = NULL;
    const int rank = kt_transport_rank(t);
    const struct kt_pipeline_params pp = {.timeout_ms = 120000};
    kt_status st = kt_engine_create(m, ep, &e, &err);
    if (st == KT_OK)
        st = kt_pipeline_create(t, e, &pp, &p, &err);
    struct kt_bench_link links[KT_RANK_PLAN_MAX] = {{0}};
    if (st == KT_OK)
        st = kt_bench_ring_links(t, kt_engine_n_embd(e), prefill_message_tokens(o, e), LINK_REPS, links, &err);
    if (st == KT_OK)
        st = kt_pipeline_follow(p, &err);
    if (st != KT_OK) {
        fprintf(stderr, "kt-bench: rank %d: %s\n", rank, err.msg);
        fflush(stderr);
        kt_transport_abort(t, 1);
    }
    struct kt_pipeline_stats ps;
    kt_pipeline_stats(p, &ps);
    fprintf(stderr, "kt-bench: rank %d (%s): layers [%u, %u) of %s, %llu slices, busy %.3f s\n", rank,
            kt_transport_host(t), kt_engine_params(e)->layer_begin, kt_engine_params(e)->layer_end, o->model,
            (unsigned long long)ps.steps, (double)ps.busy_ns[rank] * 1e-9);
    kt_pipeline_destroy(p);
    kt_engine_destroy(e);
    return 0;
}

int kt_bench_model(const struct kt_bench_options *o)
{
    int rc = 1;
    kt_err err = {0};
    struct kt_model *m = NULL;
    struct kt_engine *e = NULL;
    int32_t *prompt = NULL;
    struct kt_batch_token *batch = NULL;
    float *logits = NULL;
    struct phase pre = {.name = "prefill"}, dec = {.name = "decode"};
    uint64_t *routes[2] = {NULL, NULL}; /* (n_layer, n_expert) routed tokens, decode and prefill */
    struct prediction pred = {0};
    struct kt_machine *mach = NULL; /* --predict's */
    struct kt_profile *prof = NULL;
    json_t *root = NULL;
    struct kt_transport *transport = NULL; /* the job: one process, or the ranks of mpirun */
    struct kt_pipeline *pipeline = NULL;
    struct kt_pipeline_stats pipe_stats[2] = {{0}}; /* prefill, decode */
    struct kt_bench_link links[KT_RANK_PLAN_MAX] = {{0}}; /* under mpirun: the hops, measured before the run */
    double link_s[2] = {0, 0};                              /* ... kt-place's link model of a step, prefill, decode */

    if (kt_transport_init(NULL, NULL, &transport, &err) != KT_OK)
        goto fail;
    const int rank = kt_transport_rank(transport), n_ranks = kt_transport_size(transport);
    if (n_ranks > 1 && o->predict) {
        kt_err_set(&err, KT_ERR_UNSUPPORTED, "--predict under mpirun is not supported yet (rank 0 measures its own "
                   "layers only)");
        goto fail;
    }
    if (kt_model_open(o->model, &m, &err) != KT_OK)
        goto fail;
    const uint32_t n_layer = m->hp.n_layer;
    const size_t cells = (size_t)n_layer * m->hp.n_expert;
    const uint64_t n_ctx = (uint64_t)o->prompt_tokens + o->gen_tokens;
    if (kt_tool_check_positions("--prompt-tokens and --gen-tokens", n_ctx, m, o->model, "lower them", &err) != KT_OK)
        goto fail;
    struct kt_engine_params ep = {.n_ctx = (uint32_t)n_ctx, .max_seqs = 1, .n_threads = o->threads,
                                  .kv_type = o->kv_type, .progress = isatty(2) ? stderr : NULL};
    if (o->predict && predict_inputs(o, m, ep.topology, &mach, &prof, &err) != KT_OK)
        goto fail;
    struct kt_engine_plan plan = {0};
    if (o->placement) { /* under mpirun this rank's own part of it (ranks[rank].placement) */
        struct kt_placement *p = NULL;
        kt_status st = kt_tool_placement_resolve_rank(o->placement, m, ep.topology, n_ranks > 1 ? rank : -1, &p,
                                                      &err);
        if (st == KT_OK) {
            kt_placement_describe(p, stderr);
            st = kt_engine_plan_apply(p, &plan, &ep, stderr, &err);
        }
        kt_placement_destroy(p);
        if (st != KT_OK)
            goto fail;
    }
    if (o->kv_type_given) /* --kv-type wins over the config's kv_cache.type */
        ep.kv_type = o->kv_type;
    if (n_ranks > 1 &&
        kt_tool_rank_layers(o->placement, m, n_ranks, rank, &ep.layer_begin, &ep.layer_end, &err) != KT_OK) {
        kt_engine_plan_free(&plan);
        goto fail;
    }
    if (rank > 0) {
        ep.progress = NULL;
        rc = follow(o, transport, m, &ep);
        kt_engine_plan_free(&plan);
        goto done;
    }
    double t_load = kt_bench_now_seconds();
    kt_status created = kt_engine_create(m, &ep, &e, &err);
    kt_engine_plan_free(&plan); /* only read at creation */
    if (created != KT_OK)
        goto fail;
    const struct kt_pipeline_params pp = {.timeout_ms = 120000};
    if (kt_pipeline_create(transport, e, &pp, &pipeline, &err) != KT_OK)
        goto fail;
    t_load = kt_bench_now_seconds() - t_load;
    if (n_ranks > 1 && kt_bench_ring_links(transport, kt_engine_n_embd(e), prefill_message_tokens(o, e), LINK_REPS,
                                           links, &err) != KT_OK)
        goto fail;
    const uint32_t threads = kt_engine_params(e)->n_threads;
    const uint32_t n_vocab = kt_engine_n_vocab(e);

    struct kt_triad_result triad;
    if (kt_stream_triad(0, (int)threads, 5, &triad, &err) != KT_OK)
        goto fail;

    pre.layers = calloc(n_layer, sizeof *pre.layers);
    dec.layers = calloc(n_layer, sizeof *dec.layers);
    prompt = malloc(o->prompt_tokens * sizeof *prompt);
    const uint32_t chunk = kt_engine_max_batch_tokens(e);
    batch = malloc(chunk * sizeof *batch);
    logits = malloc((size_t)n_vocab * sizeof *logits);
    routes[0] = calloc(cells + 1, sizeof *routes[0]);
    routes[1] = calloc(cells + 1, sizeof *routes[1]);
    if (!pre.layers || !dec.layers || !prompt || !batch || !logits || !routes[0] || !routes[1]) {
        kt_err_set(&err, KT_ERR_NOMEM, "out of memory");
        goto fail;
    }
    uint64_t s = o->seed * 0x9e3779b97f4a7c15ull + 0x2545f4914f6cdd1dull;
    for (uint32_t i = 0; i < o->prompt_tokens; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        prompt[i] = (int32_t)(s % n_vocab);
    }
    if (kt_engine_seq_add(e, 0, &err) != KT_OK)
        goto fail;

    /* Unless --cold: the same prompt once untimed, then forgotten, so the
     * figures are a warm engine's (a fresh one first touches the pages of its
     * buffers, lazily mapped, in its first prefill: about 5 ms in the first
     * MoE layer of a 64-token Kimi-K2 slice on the development VM). */
    if (!o->cold && (prefill(e, prompt, o->prompt_tokens, chunk, batch, logits, &err) != KT_OK ||
                     kt_engine_seq_truncate(e, 0, 0, &err) != KT_OK))
        goto fail;
    /* The int8 dot peak on the same threads just before and just after the
     * timed prefill (their mean is the prefill parts' limit: a shared
     * machine's contention moves both sides), at the highest level with a loop. */
    struct kt_peak_result peak = {0}, peak_after = {0};
    int peak_isa = -1;
    for (int isa = (int)kt_cpu_kernels()->isa; isa >= 0 && peak_isa < 0; isa--)
        if (kt_peak_available(KT_PEAK_DOT_INT8, (enum kt_isa)isa))
            peak_isa = isa;
    if (peak_isa >= 0 &&
        kt_peak_measure(KT_PEAK_DOT_INT8, (enum kt_isa)peak_isa, (int)threads, 0.5, 3, &peak, &err) != KT_OK)
        goto fail;
    kt_engine_stats_reset(e);
    kt_pipeline_stats_reset(pipeline);
    double t0 = kt_bench_now_seconds();
    if (prefill(e, prompt, o->prompt_tokens, chunk, batch, logits, &err) != KT_OK)
        goto fail;
    pre.seconds = kt_bench_now_seconds() - t0;
    pre.tokens = o->prompt_tokens;
    take_stats(e, n_layer, &pre, routes, cells);
    kt_pipeline_stats(pipeline, &pipe_stats[0]);
    if (peak_isa >= 0) {
        if (kt_peak_measure(KT_PEAK_DOT_INT8, (enum kt_isa)peak_isa, (int)threads, 0.5, 3, &peak_after, &err) != KT_OK)
            goto fail;
        peak.best_gops = 0.5 * (peak.best_gops + peak_after.best_gops);
    }

    /* Greedy decode, one token per step, in blocks of DECODE_BLOCK tokens
     * with a short triad before each block and after the last: each block's
     * bandwidth is compared with the triads beside it, so a shared
     * machine's drifting memory bandwidth moves both sides of a ratio. */
    dec.seconds = 0.0;
    double block_ratio[KT_BENCH_MAX_BLOCKS];
    uint32_t n_blocks = 0;
    struct kt_triad_result before, after;
    if (kt_stream_triad(0, (int)threads, 2, &before, &err) != KT_OK)
        goto fail;
    double decode_triad_sum = before.best_gbps;
    uint32_t decode_triads = 1;
    kt_pipeline_stats_reset(pipeline);
    for (uint32_t i = 0; i < o->gen_tokens;) {
        struct kt_engine_stats s0, s1;
        kt_engine_stats(e, &s0);
        double block_s = 0.0;
        const uint32_t end = i + DECODE_BLOCK < o->gen_tokens ? i + DECODE_BLOCK : o->gen_tokens;
        for (; i < end; i++) {
            struct kt_batch_token t = {(int32_t)kt_bench_argmax(logits, n_vocab), 0, o->prompt_tokens + i, true};
            double ts = kt_bench_now_seconds();
            if (kt_engine_step(e, &(struct kt_batch){1, &t}, logits, &err) != KT_OK)
                goto fail;
            block_s += kt_bench_now_seconds() - ts;
        }
        dec.seconds += block_s;
        kt_engine_stats(e, &s1);
        if (kt_stream_triad(0, (int)threads, 2, &after, &err) != KT_OK)
            goto fail;
        decode_triad_sum += after.best_gbps, decode_triads++;
        if (n_blocks < KT_BENCH_MAX_BLOCKS && block_s > 0)
            block_ratio[n_blocks++] = (double)(s1.weight_bytes - s0.weight_bytes) / block_s * 1e-9 /
                                      (0.5 * (before.best_gbps + after.best_gbps));
        before = after;
    }
    dec.tokens = o->gen_tokens;
    take_stats(e, n_layer, &dec, routes, cells);
    kt_pipeline_stats(pipeline, &pipe_stats[1]);
    if (o->predict && predict(o, m, ep.topology, mach, prof, threads, chunk, &pred, &err) != KT_OK)
        goto fail;
    /* median block ratio */
    for (uint32_t a = 1; a < n_blocks; a++)
        for (uint32_t b = a; b > 0 && block_ratio[b] < block_ratio[b - 1]; b--) {
            double t = block_ratio[b];
            block_ratio[b] = block_ratio[b - 1];
            block_ratio[b - 1] = t;
        }
    const double median_ratio = n_blocks == 0           ? 0.0
                                : n_blocks % 2 == 1 ? block_ratio[n_blocks / 2]
                                                    : 0.5 * (block_ratio[n_blocks / 2 - 1] + block_ratio[n_blocks / 2]);

    const double per_token = (double)dec.stats.weight_bytes / dec.tokens;
    const double gbps = (double)dec.stats.weight_bytes / dec.seconds * 1e-9;
    printf("kt-bench model: %s, %u layers, %u threads (engine created in %.2f s)\n", o->model, n_layer, threads,
           t_load);
    if (n_ranks > 1)
        printf("pipeline of %d MPI ranks: rank 0 (%s) holds layers [%u, %u), the embedding and the head; its "
               "counters below (weight bytes, pools, the layers' split) are its own layers'\n", n_ranks,
               kt_transport_host(transport), kt_engine_params(e)->layer_begin, kt_engine_params(e)->layer_end);
    printf("\n");
    printf("STREAM triad             %10.2f GB/s  (3 x %zu MiB, best of 5)\n", triad.best_gbps,
           triad.array_bytes >> 20);
    printf("prefill                  %10.2f tok/s (%u tokens in %.3f s)\n", pre.tokens / pre.seconds, pre.tokens,
           pre.seconds);
    printf("decode                   %10.2f tok/s (%u tokens in %.3f s)\n", dec.tokens / dec.seconds, dec.tokens,
           dec.seconds);
    if (n_ranks > 1) {
        link_s[0] = prefill_link_seconds(links, n_ranks, o, e);
        link_s[1] = kt_bench_link_step_seconds(links, n_ranks, kt_engine_n_embd(e), 1);
        print_pipeline("prefill", &pipe_stats[0], link_s[0]);
        print_pipeline("decode", &pipe_stats[1], link_s[1]);
        printf("pipeline, hops           one way, measured before the run through kt's transport:");
        for (int r = 0; r < n_ranks; r++)
            printf("%s %d -> %d %.1f us (+ %.1f us to a rank that waited) + bytes / %.3f GB/s", r ? "," : "",
                   links[r].from, links[r].to, links[r].latency_us, links[r].wake_us, links[r].gbps);
        printf("\n");
    }
    struct kt_kv_cache_stats kvs;
    kt_kv_cache_stats(kt_engine_kv_cache(e), &kvs);
    printf("weight bytes per token   %10.1f MiB\n", per_token / (1 << 20));
    printf("KV cache bytes per token %10llu      (%s rows)\n", (unsigned long long)kvs.bytes_per_token,
           kt_row_type_name(kt_kv_cache_row_type(kt_engine_kv_cache(e))));
    printf("decode weight bandwidth  %10.2f GB/s = %.3f x triad\n", gbps, gbps / triad.best_gbps);
    if (n_blocks > 0)
        printf("decode / adjacent triads %10.3f  (median of %u blocks of %d tokens, %.3f .. %.3f)\n", median_ratio,
               n_blocks, DECODE_BLOCK, block_ratio[0], block_ratio[n_blocks - 1]);
    printf("CPU FFN threads busy     %10.1f%% of decode wall time x %u threads (%.1f%% in prefill)\n",
           100.0 * dec.stats.cpu_experts_busy_ns / (1e9 * dec.seconds * threads), threads,
           100.0 * pre.stats.cpu_experts_busy_ns / (1e9 * pre.seconds * threads));
    for (int i = 0; i < 2; i++) {
        const struct phase *ph = i ? &dec : &pre;
        for (int n = 0; n < nodes_used(ph); n++)
            printf("node %d pool, %-7s    %10.1f ms busy (%.1f%% of wall time, summed over its threads), %llu routed pairs\n", n,
                   i ? "decode" : "prefill", ph->stats.node_busy_ns[n] / 1e6,
                   100.0 * ph->stats.node_busy_ns[n] / (1e9 * ph->seconds), (unsigned long long)ph->stats.node_pairs[n]);
    }
    for (int i = 0; i < 2; i++) {
        const struct phase *ph = i ? &dec : &pre;
        if (!ph->has_device)
            continue;
        printf("device, %-7s          busy %.1f ms of %.1f ms (copies %.1f ms, %.1f MB in, %.1f MB out); "
               "%llu pairs; CPU waited %.1f ms for it\n",
               i ? "decode" : "prefill", ph->device.busy_ns / 1e6, ph->seconds * 1e3, ph->device.transfer_ns / 1e6,
               ph->device.bytes_in / 1e6, ph->device.bytes_out / 1e6, (unsigned long long)ph->stats.device_pairs,
               ph->stats.device_wait_ns / 1e6);
    }
    if (peak.best_gops > 0 && dec.tokens > 0 && pre.tokens > 0 && n_ranks == 1) /* the whole model's work */
        print_parts(m, &pre, &dec, routes, decode_triad_sum / decode_triads, &peak);
    print_phase(&pre, n_layer);
    print_phase(&dec, n_layer);
    if (o->svg && draw_split(o->svg, o->model, &dec, n_layer, &err) != KT_OK)
        goto fail;
    if (o->predict) {
        printf("\nprediction (placement/cost.c; machine: %s; routing: %s): predicted step %.3f ms prefill, "
               "%.3f ms decode (measured %.3f, %.3f)\n",
               pred.machine, pred.profile, pred.step_s[0] * 1e3, pred.step_s[1] * 1e3, pre.seconds * 1e3,
               dec.seconds * 1e3);
        print_prediction(&pre, pred.layers[0], n_layer);
        print_prediction(&dec, pred.layers[1], n_layer);
    }

    root = json_object();
    json_object_set_new(root, "tool", json_string("kt-bench"));
    json_object_set_new(root, "command", json_string("model"));
    json_object_set_new(root, "model", json_string(o->model));
    json_object_set_new(root, "threads", json_integer(threads));
    json_object_set_new(root, "kv_type", json_string(kt_row_type_name(kt_kv_cache_row_type(kt_engine_kv_cache(e)))));
    json_object_set_new(root, "kv_bytes_per_token", json_integer((json_int_t)kvs.bytes_per_token));
    json_object_set_new(root, "n_layer", json_integer(n_layer));
    json_object_set_new(root, "seed", json_integer((json_int_t)o->seed));
    json_object_set_new(root, "engine_create_seconds", json_real(t_load));
    json_t *jt = json_object();
    json_object_set_new(jt, "best_gbps", json_real(triad.best_gbps));
    json_object_set_new(jt, "median_gbps", json_real(triad.median_gbps));
    json_object_set_new(jt, "array_bytes", json_integer((json_int_t)triad.array_bytes));
    json_object_set_new(root, "triad", jt);
    json_object_set_new(root, "prefill", phase_json(&pre, n_layer, triad.best_gbps, false));
    json_object_set_new(root, "decode", phase_json(&dec, n_layer, triad.best_gbps, true));
    json_object_set_new(json_object_get(root, "decode"), "ratio_to_adjacent_triads_median", json_real(median_ratio));
    json_object_set_new(root, "routing", routing_json(m, routes));
    if (n_ranks > 1) {
        json_object_set_new(json_object_get(root, "prefill"), "pipeline", pipeline_json(&pipe_stats[0], link_s[0]));
        json_object_set_new(json_object_get(root, "decode"), "pipeline", pipeline_json(&pipe_stats[1], link_s[1]));
        json_object_set_new(root, "hops", kt_bench_links_json(links, n_ranks));
    }
    if (o->predict) {
        json_t *jp = json_object();
        json_object_set_new(jp, "machine", json_string(pred.machine));
        json_object_set_new(jp, "profile", json_string(pred.profile));
        json_object_set_new(jp, "prefill", prediction_json(&pre, pred.layers[0], pred.step_s[0], n_layer));
        json_object_set_new(jp, "decode", prediction_json(&dec, pred.layers[1], pred.step_s[1], n_layer));
        json_object_set_new(root, "predicted", jp);
    }
    rc = o->json ? kt_bench_write_json(root, o->json) : 0;
    goto done;
fail:
    fflush(stdout);
    if (transport && kt_transport_size(transport) > 1) { /* the other ranks wait on this one: end the job */
        fprintf(stderr, "kt-bench: rank %d: %s\n", kt_transport_rank(transport), err.msg);
        fflush(stderr);
        kt_transport_abort(transport, 1);
    }
    fprintf(stderr, "kt-bench: %s\n", err.msg);
done:
    kt_pipeline_destroy(pipeline); /* rank 0: the others stop */
    json_decref(root);
    free(pre.layers), free(dec.layers);
    free(pred.layers[0]), free(pred.layers[1]);
    free(prompt), free(batch), free(logits);
    free(routes[0]), free(routes[1]);
    free(mach);
    kt_profile_destroy(prof);
    kt_engine_destroy(e);
    kt_model_close(m);
    kt_transport_finalize(transport);
    return rc;
}
