/*
 * cost.c - the cost model (cost.h): each layer's predicted time for a decode
 * step at batch B or a prefill of P tokens, split as kt_engine_layer_stats
 * measures it, from the model's byte and multiply-add counts, a routing
 * profile's probabilities and a machine file's measured rates.  Pure
 * arithmetic: it allocates only in kt_cost_create and never touches a
 * device, a thread or a file.
 *
 * Units: seconds, bytes, multiply-adds (MACs; 2 FLOPs each); rates as the
 * machine file gives them (GB/s = 1e9 bytes/s, GFLOP/s = 1e9 FLOP/s).
 *
 * A matrix (a projection, one expert's gate, up or down) of `bytes` of
 * weights and n_in x n_out MACs per token, for T tokens, on a place whose
 * rates are (decode gbps and overhead_us, prefill gflops) for its type:
 *
 *     t(mat, T) = bytes / gbps + 2 n_in n_out T / gflops
 *
 * (streaming the weights and multiplying do not overlap: at decode the first
 * term rules, in prefill the second; kt-bench machine fits gbps and
 * overhead_us to the MoE step at 1 to 8 experts and takes gflops as the rate
 * of extra tokens' FLOPs).  From KT_COST_GEMM_TOKENS tokens on (a gemm, not
 * a gemv) the first term is bytes / prefill_fixed_gbps where the machine file
 * has it: the measured line's value at no tokens, which packed kernels
 * mostly hide behind the multiplying and GGUF-row gemms pay more than once.
 * overhead_us is a whole MoE step's on a place (its four pool phases): once
 * per step for each place with units to run (a node
 * with an active expert or the shared experts, the device, a dense FFN), a
 * quarter of it for a single host matmul (one phase).  A type without figures takes the
 * measured type nearest in bits per weight (decode), the lowest measured
 * prefill rate, or the node's FMA peak / 4.  Rates were measured with
 * node.threads threads; an engine with fewer scales them by threads /
 * node.threads.  Host matrices (attention, router, dense FFNs, the head) run
 * on the step's pool and read the first node's memory: node 0's rates.
 *
 * Attention of T tokens of one sequence at positions c .. c+T-1, in the form
 * the engine picks per chunk (attention.c: fewer MACs wins): its projections
 * t(q_a) + t(q_b) + t(kv_a) + t(out), and the heads, with pairs = T c +
 * T (T + 1) / 2 (query, position) pairs:
 *     absorbed  overhead + T (W_UK + W_UV bytes) / gbps of decode_rows (per-head
 *               gemv in GGUF rows, one call for the step's tokens)
 *               + 4 H pairs (2 kvr + dr) / f32_cached_gbps
 *     expanded  H ((dn + dv) kvr / head_dequant_gelems[W_UK type]
 *               + 4 (c + T) (dn + dv) kvr / f32_cached_gbps
 *               + 2 pairs (dk + dv) / attention_gflops)
 * (f32 products over a head's matrices and cache rows, which stay in cache;
 * 4 bytes read per MAC; without the head figures, 4 bytes per weight and
 * per pair's MAC at f32_cached_gbps).  A prefill runs in chunks of q->chunk tokens.
 *
 * Routed experts at T tokens a step (decode: the batch; prefill: a chunk):
 * with p_x the profile's probability that one token routes to expert x
 * (uniform k / n_expert without a profile), expert x is active in a step
 * with probability
 *
 *     p_active(x) = 1 - (1 - p_x)^T
 *
 * and then serves T p_x / p_active(x) tokens on average, costing t_x (its
 * three matrices at that token count, on the rates of where it lives).  On
 * a CPU node n the step's load is C_n t_n, with C_n the number of its active
 * experts - a Poisson-binomial over its experts' p_active, exact by dynamic
 * programming while its support is small (mean + 8 sd + 8 <= KT_COST_DP_MAX),
 * else a normal of the same mean and variance - and t_n their p_active-
 * weighted mean time.  The nodes run at once, so the routed experts take
 * E[max_n C_n t_n] (nodes taken as independent; one node: E[C_0] t_0): at
 * batch 1 the k experts fall unevenly on the nodes and the busiest one sets
 * the pace.  Row-sliced layers (cpu_sliced) split every active CPU expert's
 * bytes evenly over the expert nodes: max_n E[C] t_n / nodes.  A replicated
 * expert (copies on k nodes; the engine runs it on the least loaded) counts
 * on each copy's node with probability p_active / k: the even share, which
 * overstates the busiest node a little where the engine balances better.
 * The shared experts (when on the CPU) run with the first node's pool: node 0's load
 * gains their time.  The device's experts and shared experts run on its
 * queue, one unit after another: their expected time plus the copies (h up
 * unless attention is there, the pairs' token ids up, the device pairs'
 * outputs down).  CPU pools and the device run at once and the FFN waits
 * for the slower; a sim device's memory and cores are the host's, so their
 * bytes together over the triad bound it as well, and so do their cores
 * (CPU time x threads + the sim's, whose copies spin too, over the machine's
 * threads).  Then the weighted sum
 * of the k outputs (and the shared): T (k + 1) E floats read and written at
 * the triad rate.
 *
 * The device's part of a layer with attention there: x up, attention (and
 * in MoE layers the FFN norm and router), x back, and in MoE layers h and
 * the routing back: one copy each of latency_us + bytes / gbps, on the link
 * the plan gives a sim device, else the machine file's accelerator's.  The
 * host waits for it: it is the layer's attention time.  The sim runs
 * attention (and the head) on the host's thread pool over its copies in GGUF
 * rows (prefill_rows_gflops), but
 * its FFN units on its own one thread: the machine file's sim figures.
 *
 * Combine (the FFN norm, unless the device returned h, and the residual
 * add): 6 (or 3) T E floats at the triad rate.  The router: t(router, T)
 * plus T k n_expert scalar steps of top-k at 1 ns each.  The step adds the
 * embedding rows and the output head for the tokens that want logits (the
 * last of a prefill, every decode token).
 */
#include "cost.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define KT_COST_DP_MAX 64        /* exact Poisson-binomial up to this many active experts per node */
#define KT_COST_NORMAL_POINTS 33 /* points of a normal node-load distribution */
#define TOPK_STEP_S 1e-9         /* one scalar compare-and-branch of the top-k loop */
#define DEFAULT_CHUNK 256u       /* the engine's default max_batch_tokens */
#define KT_COST_PA_CACHE 1024    /* experts whose p_active one layer evaluation keeps */
#define KT_COST_GEMM_TOKENS 4    /* a product of this many tokens runs a gemm (runtime/forward/matmul.c) */

/* One matrix call: weight bytes, multiply-adds per token. */
struct cost_mat {
    int type;
    uint64_t bytes;
    double macs;
};

struct cost_ffn {
    struct cost_mat gate, up, down;
};

struct cost_layer_data {
    bool is_moe, has_shared;
    struct cost_mat proj[4];     /* q_a, q_b (or q), kv_a, out */
    int n_proj;
    struct cost_mat uk_uv;       /* W_UK and W_UV, read per token in the absorbed form */
    struct cost_mat router;
    struct cost_ffn dense, shared, expert;
};

struct kt_cost_model {
    struct kt_hparams hp;
    struct kt_machine mach;
    uint32_t n_layer, n_expert;
    struct cost_layer_data *layers; /* [n_layer] */
    double *prob[2];                /* [n_layer * n_expert] per token, decode and prefill */
    struct cost_mat output;
    uint64_t embd_row_bytes;
};

/* A place's rates: a rate table, prefill figures and a thread factor. */
struct rates {
    const struct kt_machine_rate *decode; /* [KT_TYPE_COUNT] */
    const double *prefill;                /* [KT_TYPE_COUNT] */
    double fma_gflops;                    /* fallback when no prefill figure exists */
    double scale;                         /* threads used / threads measured, at most 1 */
    double triad_gbps;                    /* norms, sums and copies in host memory */
    double mem_gbps;                      /* the memory bus a sim device shares with the host (0: none) */
    const struct kt_machine_rate *rows;   /* [KT_TYPE_COUNT] GGUF-row gemv; NULL: decode's */
    double f32_cached_gbps;               /* attention heads' f32 products */
    const double *fixed;                  /* [KT_TYPE_COUNT] prefill_fixed_gbps; NULL or 0: decode's */
    const double *dequant;                /* [KT_TYPE_COUNT] head_dequant_gelems; NULL or 0: f32_cached's */
    double attention_gflops;              /* 0: f32_cached's */
};

/* ---- model data -------------------------------------------------------------------------- */

static struct cost_mat mat_of(const struct kt_gguf_tensor *t)
{
    if (!t)
        return (struct cost_mat){0};
    return (struct cost_mat){t->type, t->nbytes, (double)t->ne[0] * (double)t->ne[1]};
}

/* One expert's slab of a stacked [.., .., n_expert] tensor (or of a fused gate_up, half of it). */
static struct cost_mat expert_slab(const struct kt_gguf_tensor *t, uint32_t n_expert, uint32_t parts)
{
    struct cost_mat m = mat_of(t);
    if (!t || n_expert == 0)
        return m;
    m.bytes /= (uint64_t)n_expert * parts;
    m.macs /= parts;
    return m;
}

static void build_layer(const struct kt_model *m, uint32_t il, struct cost_layer_data *d)
{
    const struct kt_layer *t = &m->layers[il];
    const uint32_t Ne = m->hp.n_expert;
    memset(d, 0, sizeof *d);
    d->is_moe = t->is_moe;
    if (t->attn_q_a) {
        d->proj[d->n_proj++] = mat_of(t->attn_q_a);
        d->proj[d->n_proj++] = mat_of(t->attn_q_b);
    } else {
        d->proj[d->n_proj++] = mat_of(t->attn_q);
    }
    d->proj[d->n_proj++] = mat_of(t->attn_kv_a_mqa);
    d->proj[d->n_proj++] = mat_of(t->attn_output);
    if (t->attn_kv_b) {
        d->uk_uv = mat_of(t->attn_kv_b);
    } else {
        struct cost_mat k = mat_of(t->attn_k_b), v = mat_of(t->attn_v_b);
        d->uk_uv = (struct cost_mat){k.type, k.bytes + v.bytes, 0};
    }
    if (!t->is_moe) {
        d->dense = (struct cost_ffn){mat_of(t->ffn_gate), mat_of(t->ffn_up), mat_of(t->ffn_down)};
        return;
    }
    d->router = mat_of(t->ffn_gate_inp);
    if (t->ffn_gate_up_exps) {
        d->expert.gate = expert_slab(t->ffn_gate_up_exps, Ne, 2);
        d->expert.up = d->expert.gate;
    } else {
        d->expert.gate = expert_slab(t->ffn_gate_exps, Ne, 1);
        d->expert.up = expert_slab(t->ffn_up_exps, Ne, 1);
    }
    d->expert.down = expert_slab(t->ffn_down_exps, Ne, 1);
    d->has_shared = t->ffn_gate_shexp != NULL;
    if (d->has_shared)
        d->shared = (struct cost_ffn){mat_of(t->ffn_gate_shexp), mat_of(t->ffn_up_shexp), mat_of(t->ffn_down_shexp)};
}

/* ---- rates ------------------------------------------------------------------------------- */

/* The decode rate of type t, or of the measured type nearest in bytes per weight. */
static struct kt_machine_rate decode_rate(const struct kt_machine_rate *r, int t)
{
    if (t >= 0 && t < KT_TYPE_COUNT && r[t].gbps > 0)
        return r[t];
    const struct kt_type_traits *want = t >= 0 && t < KT_TYPE_COUNT ? kt_type_traits(t) : NULL;
    const double want_bpw = want && want->block_elems ? 8.0 * want->block_bytes / want->block_elems : 4.0;
    int best = -1;
    double best_d = INFINITY;
    for (int i = 0; i < KT_TYPE_COUNT; i++) {
        if (r[i].gbps <= 0)
            continue;
        const struct kt_type_traits *tr = kt_type_traits(i);
        const double bpw = tr && tr->block_elems ? 8.0 * tr->block_bytes / tr->block_elems : 4.0;
        if (fabs(bpw - want_bpw) < best_d)
            best_d = fabs(bpw - want_bpw), best = i;
    }
    return best >= 0 ? r[best] : (struct kt_machine_rate){20.0, 5.0}; /* no figure at all */
}

static double prefill_gflops(const struct rates *r, int t)
{
    if (t >= 0 && t < KT_TYPE_COUNT && r->prefill[t] > 0)
        return r->prefill[t];
    double lowest = 0;
    for (int i = 0; i < KT_TYPE_COUNT; i++)
        if (r->prefill[i] > 0 && (lowest == 0 || r->prefill[i] < lowest))
            lowest = r->prefill[i];
    if (lowest > 0)
        return lowest;
    return r->fma_gflops > 0 ? r->fma_gflops / 4 : 50.0;
}

/* Seconds to stream m's weights in a call of T tokens: the decode rate d's,
 * or from KT_COST_GEMM_TOKENS on the measured prefill line's fixed part. */
static double read_seconds(const struct rates *r, const struct cost_mat *m, const struct kt_machine_rate *d, double T)
{
    const double fixed = r->fixed && T >= KT_COST_GEMM_TOKENS && m->type >= 0 && m->type < KT_TYPE_COUNT
                             ? r->fixed[m->type]
                             : 0.0;
    return (double)m->bytes / ((fixed > 0 ? fixed : d->gbps) * 1e9 * r->scale);
}

/* t(mat, T): one call of m for T tokens. */
static double mat_seconds(const struct rates *r, const struct cost_mat *m, double T)
{
    if (m->bytes == 0 || T <= 0)
        return 0.0;
    const struct kt_machine_rate d = decode_rate(r->decode, m->type);
    const double read_s = read_seconds(r, m, &d, T);
    const double mac_s = 2.0 * m->macs * T / (prefill_gflops(r, m->type) * 1e9 * r->scale);
    return d.overhead_us * 1e-6 / 4 + read_s + mac_s; /* one of the fitted step's four pool phases */
}

/* One FFN unit (gate, up, down) for T tokens inside a step: no overhead of its own. */
static double unit_seconds(const struct rates *r, const struct cost_ffn *f, double T)
{
    const struct cost_mat *m[3] = {&f->gate, &f->up, &f->down};
    double s = 0.0;
    for (int i = 0; i < 3; i++) {
        if (m[i]->bytes == 0 || T <= 0)
            continue;
        const struct kt_machine_rate d = decode_rate(r->decode, m[i]->type);
        s += read_seconds(r, m[i], &d, T) +
             2.0 * m[i]->macs * T / (prefill_gflops(r, m[i]->type) * 1e9 * r->scale);
    }
    return s;
}

/* The fixed cost of one MoE step's units on a place (its four pool phases), as fitted for f's type. */
static double step_overhead(const struct rates *r, const struct cost_ffn *f)
{
    return decode_rate(r->decode, f->gate.type).overhead_us * 1e-6;
}

/* unit_seconds(T) = a[T >= KT_COST_GEMM_TOKENS] + b T for T > 0: an expert's
 * time at any token count without the rate look-ups, for the per-expert loop. */
struct ffn_line {
    double a[2], b;
};

static struct ffn_line ffn_affine(const struct rates *r, const struct cost_ffn *f)
{
    const double g = KT_COST_GEMM_TOKENS, tg = unit_seconds(r, f, g);
    struct ffn_line l = {.b = unit_seconds(r, f, g + 1) - tg};
    l.a[0] = unit_seconds(r, f, 1.0) - l.b;
    l.a[1] = tg - l.b * g;
    return l;
}

static double ffn_at(const struct ffn_line *l, double tokens)
{
    return l->a[tokens >= KT_COST_GEMM_TOKENS] + l->b * tokens;
}

static double threads_of(const struct kt_cost_model *c, const struct kt_cost_query *q)
{
    return q->threads ? (double)q->threads : c->mach.nodes[0].threads ? (double)c->mach.nodes[0].threads : 1.0;
}

static struct rates node_rates(const struct kt_cost_model *c, int node, double threads)
{
    if (node < 0 || node >= c->mach.n_nodes)
        node = 0;
    const struct kt_machine_node *n = &c->mach.nodes[node];
    double scale = n->threads ? threads / n->threads : 1.0;
    scale = scale > 1.0 ? 1.0 : scale < 1e-3 ? 1e-3 : scale;
    const double triad = n->triad_gbps > 0 ? n->triad_gbps : 10.0;
    const double cached = n->f32_cached_gbps > 0 ? n->f32_cached_gbps : decode_rate(n->decode, KT_TYPE_F32).gbps;
    bool rows = false;
    for (int t = 0; t < KT_TYPE_COUNT && !rows; t++)
        rows = n->decode_rows[t].gbps > 0;
    return (struct rates){n->decode, n->prefill_gflops, n->fma_gflops, scale, triad, n->triad_gbps,
                          rows ? n->decode_rows : NULL, cached, n->prefill_fixed_gbps, n->head_dequant_gelems,
                          n->attention_gflops};
}

/* The host's rates for matrices kept in GGUF rows (what a sim device holds and
 * runs on the step's pool: its attention projections and the head):
 * prefill_rows_gflops and prefill_rows_fixed_gbps where measured, else node
 * 0's packed figures (the decode rate for the fixed part).  Decode
 * keeps the packed rates: a whole matrix streams at the same GB/s either way
 * (decode_rows, fitted to per-head gemvs of 256 KiB, would add their
 * overhead to every projection). */
static struct rates gguf_rows_rates(const struct kt_cost_model *c, struct rates r)
{
    const struct kt_machine_node *n = &c->mach.nodes[0];
    r.fixed = n->prefill_rows_fixed_gbps; /* a packed kernel's fixed part says nothing of GGUF rows' */
    for (int t = 0; t < KT_TYPE_COUNT; t++)
        if (n->prefill_rows_gflops[t] > 0) {
            r.prefill = n->prefill_rows_gflops;
            break;
        }
    return r;
}

/* The machine file's accelerator for plan device d: the same name, else the first of its backend. */
static const struct kt_machine_accel *accel_for(const struct kt_cost_model *c, const struct kt_placement *p, int d)
{
    if (d <= 0 || d >= p->n_devices)
        return NULL;
    const struct kt_placement_device *pd = &p->devices[d];
    for (int i = 0; i < c->mach.n_accel; i++)
        if (strcmp(c->mach.accel[i].name, pd->name) == 0 && c->mach.accel[i].backend == pd->backend)
            return &c->mach.accel[i];
    for (int i = 0; i < c->mach.n_accel; i++)
        if (c->mach.accel[i].backend == pd->backend)
            return &c->mach.accel[i];
    return NULL;
}

/* The accelerator's own rates (the sim's: its one thread's). */
static struct rates accel_rates(const struct kt_machine_accel *a)
{
    return (struct rates){a->decode, a->prefill_gflops, 0.0, 1.0, 10.0, 0.0, NULL, decode_rate(a->decode, KT_TYPE_F32).gbps,
                          a->prefill_fixed_gbps, NULL, 0.0};
}

/* One copy over plan device d's link. */
static double copy_seconds(const struct kt_placement *p, const struct kt_machine_accel *a, int d, double bytes,
                           bool up)
{
    const struct kt_placement_device *pd = &p->devices[d];
    double gbps = pd->transfer_gbps, lat_us = pd->latency_us;
    if (pd->backend != KT_PLACE_SIM || (gbps <= 0 && lat_us <= 0)) { /* the sim's link is what its config says */
        gbps = a ? (up ? a->h2d_gbps : a->d2h_gbps) : 0;
        lat_us = a ? a->latency_us : 0;
    }
    return lat_us * 1e-6 + (gbps > 0 ? bytes / (gbps * 1e9) : 0.0);
}

/* ---- creation ---------------------------------------------------------------------------- */

/* row[n_expert] = the per-token probabilities of layer il in phase ph
 * (KT_PROFILE_PHASES: both) as kt_profile_probability defines them -
 * count / tokens, or without token totals the row scaled to sum to k -
 * for a whole row at once (kt_profile_probability sums the row per expert);
 * returns their sum (0: no data). */
static double profile_row(const struct kt_profile *p, int ph, uint32_t il, double k, double *row)
{
    if (!p->n_expert || il >= p->n_layer)
        return 0.0;
    double tokens = 0.0, sum = 0.0;
    for (int q = 0; q < KT_PROFILE_PHASES; q++)
        tokens += ph == KT_PROFILE_PHASES || q == ph ? p->tokens[q] : 0.0;
    for (uint32_t x = 0; x < p->n_expert; x++) {
        row[x] = 0.0;
        for (int q = 0; q < KT_PROFILE_PHASES; q++)
            row[x] += ph == KT_PROFILE_PHASES || q == ph ? p->counts[q][(size_t)il * p->n_expert + x] : 0.0;
        sum += row[x];
    }
    const double scale = tokens > 0 ? 1.0 / tokens : sum > 0 ? k / sum : 0.0;
    for (uint32_t x = 0; x < p->n_expert; x++)
        row[x] *= scale;
    return sum * scale;
}

kt_status kt_cost_create(const struct kt_model *m, const struct kt_profile *prof, const struct kt_machine *mach,
                         struct kt_cost_model **out, kt_err *err)
{
    *out = NULL;
    if (!m || !mach)
        return kt_err_set(err, KT_ERR_INVALID, "cost model: a model and a machine are needed");
    if (mach->n_nodes < 1 || mach->n_nodes > KT_MACHINE_MAX_NODES)
        return kt_err_set(err, KT_ERR_INVALID, "cost model: the machine file has %d NUMA nodes (1 .. %d)",
                          mach->n_nodes, KT_MACHINE_MAX_NODES);
    const struct kt_hparams *hp = &m->hp;
    if (prof) {
        struct kt_model_identity id;
        kt_model_identity(m, &id);
        kt_status st = kt_profile_check_model(prof, &id, "profile", err);
        if (st != KT_OK)
            return st;
        if (prof->n_layer != hp->n_layer || (prof->n_expert != 0 && prof->n_expert != hp->n_expert))
            return kt_err_set(err, KT_ERR_INVALID,
                              "cost model: the profile has %u layers x %u experts, the model %u x %u", prof->n_layer,
                              prof->n_expert, hp->n_layer, hp->n_expert);
    }
    struct kt_cost_model *c = calloc(1, sizeof *c);
    const size_t n = (size_t)hp->n_layer * hp->n_expert;
    if (c) {
        c->layers = calloc(hp->n_layer ? hp->n_layer : 1, sizeof *c->layers);
        c->prob[0] = calloc(n ? n : 1, sizeof(double));
        c->prob[1] = calloc(n ? n : 1, sizeof(double));
    }
    if (!c || !c->layers || !c->prob[0] || !c->prob[1]) {
        kt_cost_destroy(c);
        return kt_err_set(err, KT_ERR_NOMEM, "cost model: out of memory");
    }
    c->hp = *hp;
    c->mach = *mach;
    c->n_layer = hp->n_layer;
    c->n_expert = hp->n_expert;
    for (uint32_t il = 0; il < hp->n_layer; il++)
        build_layer(m, il, &c->layers[il]);
    c->output = mat_of(m->output);
    c->embd_row_bytes = m->token_embd ? m->token_embd->nbytes / (m->token_embd->ne[1] ? m->token_embd->ne[1] : 1) : 0;

    /* Per-token probabilities: the phase's own counts, else both phases', else uniform k / n. */
    const double k = hp->n_expert_used, uniform = hp->n_expert ? k / hp->n_expert : 0.0;
    for (uint32_t il = 0; il < hp->n_layer; il++) {
        for (int ph = 0; ph < 2; ph++) {
            double *row = c->prob[ph] + (size_t)il * hp->n_expert;
            double sum = prof ? profile_row(prof, ph, il, k, row) : 0.0;
            if (!(sum > 0) && prof)
                sum = profile_row(prof, KT_PROFILE_PHASES, il, k, row);
            for (uint32_t x = 0; x < hp->n_expert; x++)
                row[x] = !(sum > 0) ? uniform : row[x] > 1.0 ? 1.0 : row[x] < 0.0 ? 0.0 : row[x];
        }
    }
    *out = c;
    return KT_OK;
}

void kt_cost_destroy(struct kt_cost_model *c)
{
    if (!c)
        return;
    free(c->layers);
    free(c->prob[0]);
    free(c->prob[1]);
    free(c);
}

/* ---- routed experts: distinct active, busiest node ---------------------------------------- */

static double tokens_per_step(const struct kt_cost_query *q)
{
    if (q->mode == KT_COST_DECODE)
        return q->batch ? q->batch : 1;
    const uint32_t chunk = q->chunk ? q->chunk : DEFAULT_CHUNK;
    const uint32_t P = q->tokens ? q->tokens : 1;
    return P < chunk ? P : chunk;
}

static double p_active(double p, double T)
{
    if (p <= 0)
        return 0.0;
    if (p >= 1)
        return 1.0;
    if (T == 1.0) /* decode at batch 1, what the planner asks most */
        return p;
    return -expm1(T * log1p(-p));
}

double kt_cost_p_active(const struct kt_cost_model *c, uint32_t il, uint32_t x, const struct kt_cost_query *q)
{
    if (!c || il >= c->n_layer || x >= c->n_expert)
        return 0.0;
    const double p = c->prob[q->mode == KT_COST_PREFILL][(size_t)il * c->n_expert + x];
    return p_active(p, tokens_per_step(q));
}

/* A discrete distribution of a node's load: n points (value ascending, probability). */
struct load_dist {
    int n;
    double v[KT_COST_DP_MAX + 1], pr[KT_COST_DP_MAX + 1];
};

/* The Poisson-binomial DP (v[i] = i, pr[0 .. top] its probabilities) one
 * more Bernoulli(p); counts beyond cap (negligible mass, chosen at mean +
 * 8 sd + 8) stay at cap. */
static void pb_add(struct load_dist *d, int *top, int cap, double p)
{
    double *f = d->pr;
    if (*top < cap) {
        f[*top + 1] = f[*top] * p;
        for (int i = *top; i > 0; i--)
            f[i] = f[i] * (1 - p) + f[i - 1] * p;
        f[0] *= 1 - p;
        ++*top;
    } else {
        f[*top] += f[*top - 1] * p; /* cap >= 8 > 0 */
        for (int i = *top - 1; i > 0; i--)
            f[i] = f[i] * (1 - p) + f[i - 1] * p;
        f[0] *= 1 - p;
    }
    for (int i = 0; i <= *top; i++)
        d->v[i] = i;
}

/* A normal(mean, var) count on KT_COST_NORMAL_POINTS points over +-4 sd, clipped to [0, n_max]. */
static void load_dist_normal(struct load_dist *d, double mean, double var, double n_max)
{
    const double sd = sqrt(var);
    double total = 0.0;
    d->n = KT_COST_NORMAL_POINTS;
    for (int i = 0; i < d->n; i++) {
        const double z = -4.0 + 8.0 * i / (d->n - 1);
        const double cnt = mean + z * sd;
        d->v[i] = cnt < 0 ? 0 : cnt > n_max ? n_max : cnt;
        d->pr[i] = exp(-0.5 * z * z);
        total += d->pr[i];
    }
    for (int i = 0; i < d->n; i++)
        d->pr[i] /= total;
}
/* E[max_n X_n] for independent discrete X_n (values ascending within each). */
static double expected_max(const struct load_dist *d, int n_dist)
{
    if (n_dist == 0)
        return 0.0;
    int idx[KT_PLACEMENT_MAX_NODES] = {0};
    double cdf[KT_PLACEMENT_MAX_NODES] = {0};
    double prev_prod = 0.0, e = 0.0;
    for (;;) { /* sweep the merged values upward */
        double v = INFINITY;
        for (int i = 0; i < n_dist; i++)
            if (idx[i] < d[i].n && d[i].v[idx[i]] < v)
                v = d[i].v[idx[i]];
        if (v == INFINITY)
            break;
        double prod = 1.0;
        for (int i = 0; i < n_dist; i++) {
            while (idx[i] < d[i].n && d[i].v[idx[i]] <= v)
                cdf[i] += d[i].pr[idx[i]++];
            prod *= cdf[i] > 1.0 ? 1.0 : cdf[i];
        }
        e += v * (prod - prev_prod);
        prev_prod = prod;
    }
    return e;
}

/* ---- one layer --------------------------------------------------------------------------- */

/* Attention of T tokens at positions c .. c+T-1 of one sequence (the host
 * or the sim's pool: rates r); heads at the F32 rate. */
static double attention_seconds(const struct kt_cost_model *c, const struct cost_layer_data *d,
                                const struct rates *r, double T, double ctx)
{
    const struct kt_hparams *hp = &c->hp;
    double s = 0.0;
    for (int i = 0; i < d->n_proj; i++)
        s += mat_seconds(r, &d->proj[i], T);
    const double kvr = hp->kv_lora_rank, dr = hp->qk_rope_dim, dn = hp->qk_nope_dim, dv = hp->v_head_dim;
    const double dk = dn + dr, w = kvr * (dn + dv), H = hp->n_head;
    const double pairs = T * ctx + T * (T + 1) / 2;
    const double absorbed = T * w + pairs * (2 * kvr + dr);
    const double expanded = w + (ctx + T) * w + pairs * (dk + dv);
    if (expanded < absorbed) {
        /* per head: W_UK,h and W_UV,h dequantized, keys and values expanded, scores and sums */
        const double cached = r->f32_cached_gbps * 1e9 * r->scale;
        const int t = d->uk_uv.type;
        const double dq = r->dequant && t >= 0 && t < KT_TYPE_COUNT ? r->dequant[t] : 0.0;
        s += H * (dq > 0 ? w / (dq * 1e9 * r->scale) : 4.0 * w / cached) + 4.0 * H * (ctx + T) * w / cached +
             (r->attention_gflops > 0 ? 2.0 * H * pairs * (dk + dv) / (r->attention_gflops * 1e9 * r->scale)
                                      : 4.0 * H * pairs * (dk + dv) / cached);
    } else {
        const struct kt_machine_rate ur = decode_rate(r->rows ? r->rows : r->decode, d->uk_uv.type);
        s += (r->rows ? ur.overhead_us * 1e-6 : 0.0) + T * (double)d->uk_uv.bytes / (ur.gbps * 1e9 * r->scale) +
             4.0 * H * pairs * (2 * kvr + dr) / (r->f32_cached_gbps * 1e9 * r->scale);
    }
    return s;
}

/* Copies of the device's attention round trip in a layer: x up; x, and in MoE layers h and the routing, down. */
static double attention_copies(const struct kt_cost_model *c, const struct kt_placement *p,
                               const struct kt_machine_accel *a, int d, bool moe, double T)
{
    const double x_bytes = T * c->hp.n_embd * 4.0, route_bytes = T * c->hp.n_expert_used * 4.0;
    double s = copy_seconds(p, a, d, x_bytes, true) + copy_seconds(p, a, d, x_bytes, false);
    if (moe)
        s += copy_seconds(p, a, d, x_bytes, false) + 2 * copy_seconds(p, a, d, route_bytes, false);
    return s;
}

/* The nodes holding a CPU expert: its home and its replicas' (bit n: node n);
 * node 0 for a home the machine lacks. */
static uint64_t copy_nodes(const struct kt_expert_home *h, int n_nodes)
{
    const uint64_t valid = n_nodes >= 64 ? ~0ull : (1ull << n_nodes) - 1;
    const uint64_t copies = h ? ((h->node >= 0 && h->node < n_nodes ? 1ull << h->node : 0) | h->replica_nodes) & valid : 0;
    return copies ? copies : 1;
}

/* One step of layer il at T tokens (context ctx, the step's first position). */
static void layer_step(const struct kt_cost_model *c, const struct kt_placement *p, uint32_t il,
                       const struct kt_expert_home *homes, bool sliced, const struct kt_cost_query *q, double T,
                       double ctx, struct kt_cost_layer *o)
{
    const struct cost_layer_data *d = &c->layers[il];
    const struct kt_placement_layer *pl = &p->layers[il];
    const struct kt_hparams *hp = &c->hp;
    const double threads = threads_of(c, q), E = hp->n_embd;
    const int n_nodes = c->mach.n_nodes;
    const struct rates host = node_rates(c, 0, threads);
    memset(o, 0, sizeof *o);

    /* The one accelerator of the layer, if any part is there. */
    int dev = pl->attention > 0 ? pl->attention : pl->dense_ffn > 0 ? pl->dense_ffn : pl->shared_experts > 0 ? pl->shared_experts : 0;
    for (uint32_t x = 0; !dev && homes && x < c->n_expert; x++)
        dev = homes[x].device > 0 ? homes[x].device : 0;
    dev = dev < p->n_devices ? dev : 0;
    const struct kt_machine_accel *acc = dev ? accel_for(c, p, dev) : NULL;
    /* the sim on the host's cores and memory, unless the machine file plans it as a device of its own */
    const bool sim = dev && p->devices[dev].backend == KT_PLACE_SIM && (!acc || acc->shares_host);
    static const struct kt_machine_accel none; /* an accelerator the file lacks: no rates (the defaults) */
    const struct rates dr = accel_rates(acc ? acc : &none);

    /* attention (with the FFN norm and router when there) */
    const bool attn_dev = pl->attention > 0 && dev;
    if (attn_dev) {
        const struct rates ar = sim ? gguf_rows_rates(c, host) : dr; /* the sim: on the host's pool, GGUF rows */
        double work = attention_seconds(c, d, &ar, T, ctx);
        if (d->is_moe)
            work += mat_seconds(&ar, &d->router, T) + T * hp->n_expert_used * hp->n_expert * TOPK_STEP_S +
                    T * E * 8.0 / (ar.triad_gbps * 1e9);
        const double copies = attention_copies(c, p, acc, dev, d->is_moe, T);
        o->attention_s = work + copies;
        o->device_s += work + copies;
        o->transfer_s += copies;
    } else {
        o->attention_s = attention_seconds(c, d, &host, T, ctx) + T * E * 8.0 / (host.triad_gbps * 1e9);
    }
    /* combine: FFN norm (unless h came back) and the residual add */
    o->combine_s = T * E * 4.0 * ((attn_dev && d->is_moe) ? 3.0 : 6.0) / (host.triad_gbps * 1e9);

    if (!d->is_moe) {
        if (pl->dense_ffn > 0 && dev) {
            const double copies = copy_seconds(p, acc, dev, T * E * 4, true) + copy_seconds(p, acc, dev, T * 4, true) +
                                  copy_seconds(p, acc, dev, T * E * 4, false);
            const double work = step_overhead(&dr, &d->dense) + unit_seconds(&dr, &d->dense, T);
            o->experts_s = work + copies;
            o->device_s += work + copies;
            o->transfer_s += copies;
        } else {
            o->experts_s = step_overhead(&host, &d->dense) + unit_seconds(&host, &d->dense, T);
        }
        o->total_s = o->attention_s + o->router_s + o->experts_s + o->combine_s;
        return;
    }

    /* router (on the host unless it ran with attention on the device) */
    if (!attn_dev)
        o->router_s = mat_seconds(&host, &d->router, T) + T * hp->n_expert_used * hp->n_expert * TOPK_STEP_S;

    /* routed experts: per CPU node the count distribution of its active experts and their mean time */
    const double *prob = c->prob[q->mode == KT_COST_PREFILL] + (size_t)il * c->n_expert;
    double node_pa[KT_PLACEMENT_MAX_NODES] = {0}, node_var[KT_PLACEMENT_MAX_NODES] = {0};
    double node_count[KT_PLACEMENT_MAX_NODES] = {0}; /* experts that may be active */
    double node_none[KT_PLACEMENT_MAX_NODES], none_active = 1.0; /* P(no active expert): per node, on the CPU */
    for (int n = 0; n < n_nodes; n++)
        node_none[n] = 1.0;
    double node_t[KT_PLACEMENT_MAX_NODES] = {0}; /* sum of p_active x t_x, then the mean */
    double dev_s = 0.0, dev_pairs = 0.0, cpu_pa = 0.0, cpu_t = 0.0, cpu_bytes = 0.0, dev_bytes = 0.0;
    const double expert_bytes = (double)(d->expert.gate.bytes + d->expert.up.bytes + d->expert.down.bytes);
    const double shared_bytes = (double)(d->shared.gate.bytes + d->shared.up.bytes + d->shared.down.bytes);
    struct rates nr[KT_PLACEMENT_MAX_NODES];
    const double node_threads = threads / n_nodes;
    struct ffn_line node_line[KT_PLACEMENT_MAX_NODES], dev_line = {{0, 0}, 0};
    for (int n = 0; n < n_nodes; n++) {
        nr[n] = node_rates(c, n, n_nodes > 1 ? node_threads : threads);
        node_line[n] = ffn_affine(&nr[n], &d->expert);
    }
    if (dev)
        dev_line = ffn_affine(&dr, &d->expert);
    double pa_of[KT_COST_PA_CACHE]; /* p_active of the first experts, for the DP pass */
    /* per-node lists of p_active for the DP: kept in one pass per node (n_expert x nodes, cheap) */
    for (uint32_t x = 0; x < c->n_expert; x++) {
        const double pa = p_active(prob[x], T);
        if (x < KT_COST_PA_CACHE)
            pa_of[x] = pa;
        o->pairs += T * prob[x];
        if (pa <= 0)
            continue;
        const double tokens = T * prob[x] / pa;
        const struct kt_expert_home *h = homes ? &homes[x] : NULL;
        if (h && h->device > 0) {
            dev_s += pa * ffn_at(&dev_line, tokens);
            dev_bytes += pa * expert_bytes;
            dev_pairs += T * prob[x];
            continue;
        }
        /* on each of its k copies' nodes with probability pa / k */
        const uint64_t copies = copy_nodes(h, n_nodes);
        const double share = pa / __builtin_popcountll(copies);
        for (int n = 0; n < n_nodes && n < 64; n++) {
            if (!(copies >> n & 1))
                continue;
            node_pa[n] += share;
            node_none[n] *= 1 - share;
            node_var[n] += share * (1 - share);
            node_count[n] += 1;
            node_t[n] += share * ffn_at(&node_line[n], tokens);
        }
        none_active *= 1 - pa;
        cpu_bytes += pa * expert_bytes;
        cpu_pa += pa;
        cpu_t += pa * tokens;
    }
    o->device_pairs = dev_pairs;
    const bool shared_dev = d->has_shared && pl->shared_experts > 0 && dev;
    if (shared_dev) {
        dev_s += unit_seconds(&dr, &d->shared, T);
        dev_bytes += shared_bytes;
    }
    /* the outputs that come back: the routed pairs' and, with the shared experts there, every token's */
    const double out_rows = dev_pairs + (shared_dev ? T : 0.0);
    /* the shared experts (on the CPU) go with the first node's pool */
    const double shared_cpu = d->has_shared && !shared_dev ? unit_seconds(&nr[0], &d->shared, T) : 0.0;
    /* a node with work pays its step's overhead once */
    double ov[KT_PLACEMENT_MAX_NODES];
    for (int n = 0; n < n_nodes; n++)
        ov[n] = step_overhead(&nr[n], &d->expert);
    cpu_bytes += d->has_shared && !shared_dev ? shared_bytes : 0.0;
    double cpu_s = 0.0;
    const uint64_t nodes_mask = p->expert_nodes ? p->expert_nodes : 1;
    int n_slices = 0;
    for (int n = 0; n < n_nodes && n < 64; n++)
        n_slices += (int)((nodes_mask >> n) & 1);
    if (sliced && n_slices > 1) {
        /* every node runs 1 / n_slices of every active expert: the slowest node's share */
        const double mean_tokens = cpu_pa > 0 ? cpu_t / cpu_pa : 0;
        /* and, as moe.c does in a sliced layer, 1 / n_slices of the shared experts' rows */
        const double shared_share = shared_cpu / n_slices;
        for (int n = 0; n < n_nodes && n < 64; n++) {
            if (!((nodes_mask >> n) & 1))
                continue;
            const double t = cpu_pa * unit_seconds(&nr[n], &d->expert, mean_tokens) / n_slices + shared_share +
                             ov[n] * (1 - (shared_cpu > 0 ? 0 : none_active));
            o->node_s[n] = t;
            cpu_s = t > cpu_s ? t : cpu_s;
        }
    } else if (n_nodes == 1) {
        cpu_s = node_t[0] + shared_cpu + ov[0] * (1 - (shared_cpu > 0 ? 0 : node_none[0]));
        o->node_s[0] = cpu_s;
    } else {
        /* each node's count of active experts: a Poisson-binomial, by DP
         * where its support is small (one more pass over the experts), else
         * a normal of its mean and variance; then E[max] over the nodes */
        struct load_dist dist[KT_PLACEMENT_MAX_NODES];
        int cap[KT_PLACEMENT_MAX_NODES], top[KT_PLACEMENT_MAX_NODES];
        bool any_dp = false;
        for (int n = 0; n < n_nodes; n++) {
            o->node_s[n] = node_t[n] + (n == 0 ? shared_cpu : 0) + ov[n] * (1 - (n == 0 && shared_cpu > 0 ? 0 : node_none[n]));
            const double hi = node_pa[n] + 8.0 * sqrt(node_var[n]) + 8.0;
            cap[n] = node_pa[n] > 0 && hi <= KT_COST_DP_MAX ? (int)hi : -1;
            top[n] = 0;
            if (cap[n] >= 0) {
                any_dp = true;
                dist[n].pr[0] = 1.0;
            } else {
                load_dist_normal(&dist[n], node_pa[n], node_var[n], node_count[n]);
            }
        }
        for (uint32_t x = 0; any_dp && x < c->n_expert; x++) {
            const struct kt_expert_home *h = homes ? &homes[x] : NULL;
            if (h && h->device > 0)
                continue;
            const uint64_t copies = copy_nodes(h, n_nodes);
            const double share = (x < KT_COST_PA_CACHE ? pa_of[x] : p_active(prob[x], T)) / __builtin_popcountll(copies);
            for (int n = 0; n < n_nodes && n < 64; n++)
                if ((copies >> n & 1) && cap[n] >= 0 && share > 0)
                    pb_add(&dist[n], &top[n], cap[n], share);
        }
        int n_dist = 0;
        for (int n = 0; n < n_nodes; n++) {
            if (node_pa[n] <= 0 && !(n == 0 && shared_cpu > 0))
                continue;
            if (node_pa[n] <= 0)
                dist[n] = (struct load_dist){.n = 1, .pr = {1.0}};
            else if (cap[n] >= 0)
                dist[n].n = top[n] + 1;
            const double t_mean = node_pa[n] > 0 ? node_t[n] / node_pa[n] : 0.0;
            for (int i = 0; i < dist[n].n; i++)
                dist[n].v[i] = dist[n].v[i] * t_mean + (n == 0 ? shared_cpu : 0.0) +
                               (dist[n].v[i] > 0 || (n == 0 && shared_cpu > 0) ? ov[n] : 0.0);
            if (n_dist != n)
                dist[n_dist] = dist[n];
            n_dist++;
        }
        cpu_s = expected_max(dist, n_dist);
    }
    /* the device's units: h up (unless attention is there), pair ids up, outputs down */
    double dev_total = 0.0;
    if (dev_s > 0) {
        dev_s += step_overhead(&dr, &d->expert);
        const double copies = (attn_dev ? 0.0 : copy_seconds(p, acc, dev, T * E * 4, true)) +
                              copy_seconds(p, acc, dev, (o->pairs + T) * 4, true) +
                              copy_seconds(p, acc, dev, out_rows * E * 4, false);
        dev_total = dev_s + copies;
        o->device_s += dev_total;
        o->transfer_s += copies;
    }
    /* out = sum of the k outputs (and the shared): read them, read and write out */
    const double weighted_sum = T * (hp->n_expert_used + d->has_shared) * E * 8.0 / (host.triad_gbps * 1e9);
    o->cpu_experts_s = cpu_s;
    o->device_experts_s = dev_total;
    double ffn_s = cpu_s > dev_total ? cpu_s : dev_total;
    if (sim && dev_total > 0) {
        /* the sim's memory is the host's (one bus for both), and its thread
         * one more on the host's cores (copies spin on it too): while both run,
         * the pools' threads and the sim's share the cores - each at cores /
         * (threads + 1) of a core when they outnumber them - and the side with
         * more work then runs alone */
        const double bus_s = host.mem_gbps > 0 ? (cpu_bytes + dev_bytes) / (host.mem_gbps * 1e9 * host.scale) : 0.0;
        double cores = 0.0;
        for (int n = 0; n < n_nodes; n++)
            cores += c->mach.nodes[n].threads;
        const double share = cores > 0 && threads + 1 > cores ? cores / (threads + 1) : 1.0;
        const double both = cpu_s < dev_total ? cpu_s : dev_total;
        const double core_s = (cpu_s > dev_total ? cpu_s : dev_total) + both * (1 / share - 1);
        ffn_s = bus_s > ffn_s ? bus_s : ffn_s;
        ffn_s = core_s > ffn_s ? core_s : ffn_s;
    }
    o->experts_s = ffn_s + weighted_sum;
    o->total_s = o->attention_s + o->router_s + o->experts_s + o->combine_s;
}

static void add_layer(struct kt_cost_layer *acc, const struct kt_cost_layer *s)
{
    acc->attention_s += s->attention_s, acc->router_s += s->router_s, acc->experts_s += s->experts_s;
    acc->combine_s += s->combine_s, acc->device_s += s->device_s, acc->transfer_s += s->transfer_s;
    acc->cpu_experts_s += s->cpu_experts_s, acc->device_experts_s += s->device_experts_s;
    for (int n = 0; n < KT_PLACEMENT_MAX_NODES; n++)
        acc->node_s[n] += s->node_s[n];
    acc->total_s += s->total_s, acc->device_pairs += s->device_pairs, acc->pairs += s->pairs;
}

double kt_cost_layer(const struct kt_cost_model *c, const struct kt_placement *p, uint32_t il,
                     const struct kt_expert_home *homes, bool sliced, const struct kt_cost_query *q,
                     struct kt_cost_layer *out)
{
    struct kt_cost_layer sink;
    out = out ? out : &sink;
    memset(out, 0, sizeof *out);
    if (!c || !p || !q || il >= c->n_layer || il >= p->n_layer)
        return 0.0;
    if (q->mode == KT_COST_DECODE) {
        layer_step(c, p, il, homes, sliced, q, q->batch ? q->batch : 1, q->context, out);
        return out->total_s;
    }
    /* prefill: chunk by chunk; chunks of the same size cost the same but for their context */
    const uint32_t chunk = q->chunk ? q->chunk : DEFAULT_CHUNK, P = q->tokens ? q->tokens : 1;
    for (uint32_t s = 0; s < P; s += chunk) {
        const uint32_t T = P - s < chunk ? P - s : chunk;
        struct kt_cost_layer one;
        layer_step(c, p, il, homes, sliced, q, T, (double)q->context + s, &one);
        add_layer(out, &one);
    }
    return out->total_s;
}

kt_status kt_cost_predict(const struct kt_cost_model *c, const struct kt_placement *p, const struct kt_cost_query *q,
                          struct kt_cost_layer *layers, double *step_s, kt_err *err)
{
    if (!c || !p || !q)
        return kt_err_set(err, KT_ERR_INVALID, "cost model: no model, plan or query");
    if (p->n_layer != c->n_layer || (p->n_expert != c->n_expert && p->n_expert != 0))
        return kt_err_set(err, KT_ERR_INVALID, "cost model: %s is a plan of %u layers x %u experts, the model has %u x %u",
                          p->source, p->n_layer, p->n_expert, c->n_layer, c->n_expert);
    if (q->mode == KT_COST_DECODE ? q->batch == 0 : q->tokens == 0)
        return kt_err_set(err, KT_ERR_INVALID, "cost model: a %s of 0 tokens",
                          q->mode == KT_COST_DECODE ? "decode step" : "prefill");
    for (int d = 1; d < p->n_devices; d++)
        if (p->devices[d].backend != KT_PLACE_CPU && !accel_for(c, p, d))
            return kt_err_set(err, KT_ERR_INVALID, "cost model: the machine file has no %s accelerator for device '%s'",
                              kt_place_backend_name(p->devices[d].backend), p->devices[d].name);
    for (uint32_t il = 0; il < p->n_layer; il++)
        for (uint32_t x = 0; p->layers[il].experts && x < p->n_expert; x++) {
            const struct kt_expert_home *h = &p->layers[il].experts[x];
            if (h->device == 0 && h->node >= c->mach.n_nodes)
                return kt_err_set(err, KT_ERR_INVALID,
                                  "cost model: %s homes layer %u expert %u on NUMA node %d; the machine file has %d",
                                  p->source, il, x, h->node, c->mach.n_nodes);
        }
    double total = 0.0;
    for (uint32_t il = 0; il < p->n_layer; il++)
        total += kt_cost_layer(c, p, il, p->layers[il].experts, p->layers[il].cpu_sliced, q, &layers[il]);

    /* embedding rows, and the head for the tokens that want logits */
    const double threads = threads_of(c, q);
    const struct rates host = node_rates(c, 0, threads);
    const double T = q->mode == KT_COST_DECODE ? q->batch : q->tokens;
    const double wanted = q->mode == KT_COST_DECODE ? q->batch : 1;
    total += T * (double)c->embd_row_bytes / (host.triad_gbps * 1e9);
    if (p->embeddings > 0 && p->embeddings < p->n_devices) {
        const struct kt_machine_accel *a = accel_for(c, p, p->embeddings);
        const bool sim = p->devices[p->embeddings].backend == KT_PLACE_SIM && (!a || a->shares_host);
        const struct rates ar = a ? accel_rates(a) : host;
        const struct rates rows = gguf_rows_rates(c, host);
        total += mat_seconds(sim ? &rows : &ar, &c->output, wanted) +
                 copy_seconds(p, a, p->embeddings, wanted * c->hp.n_embd * 4.0, true) +
                 copy_seconds(p, a, p->embeddings, wanted * c->hp.n_vocab * 4.0, false);
    } else {
        total += mat_seconds(&host, &c->output, wanted);
    }
    if (step_s)
        *step_s = total;
    return KT_OK;
}
