/*
 * planner.c - kt-place's planner (see planner.h).
 *
 * Cost: the parts on the accelerator come from resolving a small config
 * without experts (plan.c does the byte accounting); the expert slots cost
 * one kt_cost_layer call each (one more where the first slot of a layer does
 * not pay for its copies and a few are tried at once), over a heap of
 * layers; the CPU spread is a sort and a greedy pass per layer and one to
 * three more calls.  O(layers x experts x log experts) in all, with the
 * cost model's own per-call cost on top.
 *
 * While slots are handed out, a layer's CPU experts are predicted as
 * row-sliced (perfectly balanced): the spread chosen afterwards is within 5%
 * of that or is that.
 */
#include "planner.h"

#include "config.h"
#include "text.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const double GIB = 1073741824.0;
static const double RAM_USABLE = 0.9;   /* of a node's memory, for homed experts and replicas */
static const double REPLICA_MIN_GAIN = 0.005; /* replicas are kept only where they save this share of the objective */
static const double SLICE_MIN_GAIN = 0.01; /* a layer is sliced where that saves this share of its objective */

const char *kt_plan_baseline_name(enum kt_plan_baseline b)
{
    switch (b) {
    case KT_BASELINE_BY_INDEX: return "by index";
    case KT_BASELINE_EQUAL_PER_LAYER: return "equal per layer";
    case KT_BASELINE_GLOBAL_TOP: return "global top-N";
    case KT_BASELINE_COUNT: break;
    }
    return "?";
}

/* ---- state ----------------------------------------------------------------------- */

struct heat {
    double v;
    uint32_t x;
};

struct planner {
    const struct kt_model *m;
    const struct kt_profile *prof;
    const struct kt_machine *mach;
    const struct kt_cost_model *cost;
    struct kt_plan *plan;
    struct kt_placement *p;
    struct kt_cost_query qd, qp;      /* decode step, prefill */
    const struct kt_cost_query *qbal; /* the query CPU nodes are balanced by */
    double wd, wp;                    /* objective weights of per-token decode and prefill time */
    int n_nodes;
    double *node_expert_s;            /* [n_layer][n_nodes] one expert's time on a node */
    struct heat *scratch;             /* [n_expert] */
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int hotter(const void *a, const void *b)
{
    const struct heat *x = a, *y = b;
    if (x->v != y->v)
        return x->v > y->v ? -1 : 1;
    return x->x < y->x ? -1 : x->x > y->x;
}

/* Per-token predicted time of layer il as its homes stand: the objective. */
static double objective(const struct planner *pl, uint32_t il, bool sliced)
{
    const struct kt_expert_home *h = pl->p->layers[il].experts;
    double t = 0;
    if (pl->wd > 0)
        t += pl->wd * kt_cost_layer(pl->cost, pl->p, il, h, sliced, &pl->qd, NULL) / pl->qd.batch;
    if (pl->wp > 0)
        t += pl->wp * kt_cost_layer(pl->cost, pl->p, il, h, sliced, &pl->qp, NULL) / pl->qp.tokens;
    return t;
}

/* The routed experts of layer il by the objective's phase, hottest first:
 * each phase's share of the layer's tokens, weighted as the objective is. */
static void order_by_heat(const struct planner *pl, uint32_t il, uint32_t *order)
{
    const uint32_t n = pl->m->hp.n_expert;
    const struct kt_profile *prof = pl->prof;
    const bool counted = prof && prof->n_expert;
    double w[KT_PROFILE_PHASES] = {0, 0};
    for (int ph = 0; counted && ph < KT_PROFILE_PHASES; ph++) {
        double row = 0;
        for (uint32_t x = 0; x < n; x++)
            row += prof->counts[ph][(size_t)il * n + x];
        w[ph] = row > 0 ? (ph == KT_PROFILE_DECODE ? pl->wd : pl->wp) / row : 0;
    }
    if (counted && w[0] == 0 && w[1] == 0) /* the objective's phase has no counts: both phases */
        for (int ph = 0; ph < KT_PROFILE_PHASES; ph++)
            w[ph] = 1;
    for (uint32_t x = 0; x < n; x++) {
        double v = 0;
        for (int ph = 0; counted && ph < KT_PROFILE_PHASES; ph++)
            v += w[ph] * prof->counts[ph][(size_t)il * n + x];
        pl->scratch[x] = (struct heat){v, x};
    }
    qsort(pl->scratch, n, sizeof *pl->scratch, hotter);
    for (uint32_t i = 0; i < n; i++)
        order[i] = pl->scratch[i].x;
}

/* "Hottest" as configs mean it (plan.h): routed tokens of both phases. */
static double config_heat(const struct kt_profile *prof, uint32_t il, uint32_t x)
{
    return prof && prof->n_expert ? kt_profile_count(prof, il, x) : 0.0;
}

static uint64_t tensor_bytes(const struct kt_gguf_tensor *t)
{
    return t ? t->nbytes : 0;
}

/* One expert's decode time on each node (its matrices, at the node's measured rates). */
static void expert_times(struct planner *pl)
{
    const struct kt_model *m = pl->m;
    const uint32_t n_expert = m->hp.n_expert ? m->hp.n_expert : 1;
    for (uint32_t il = 0; il < m->hp.n_layer; il++) {
        const struct kt_layer *L = &m->layers[il];
        const struct kt_gguf_tensor *mats[] = {L->ffn_gate_exps, L->ffn_up_exps, L->ffn_gate_up_exps,
                                               L->ffn_down_exps};
        for (int n = 0; n < pl->n_nodes; n++) {
            double s = 0;
            for (size_t i = 0; i < sizeof mats / sizeof mats[0]; i++)
                if (mats[i])
                    s += kt_machine_decode_seconds(pl->mach->nodes[n].decode, mats[i]->type,
                                                   tensor_bytes(mats[i]) / n_expert);
            pl->node_expert_s[(size_t)il * pl->n_nodes + n] = s;
        }
    }
}

/* ---- bytes ----------------------------------------------------------------------- */

/* Routed-expert and replica bytes of every device and node, from the homes
 * (what plan.c's resolution counts). */
static void recount_experts(struct kt_placement *p, const struct kt_model *m)
{
    for (int d = 0; d < p->n_devices; d++) {
        struct kt_placement_device *dev = &p->devices[d];
        dev->bytes -= dev->part_bytes[KT_PART_ROUTED_EXPERTS] + dev->part_bytes[KT_PART_REPLICAS];
        dev->part_bytes[KT_PART_ROUTED_EXPERTS] = dev->part_bytes[KT_PART_REPLICAS] = 0;
        dev->n_experts = 0;
    }
    memset(p->node_bytes, 0, (size_t)p->n_nodes * sizeof *p->node_bytes);
    memset(p->node_experts, 0, (size_t)p->n_nodes * sizeof *p->node_experts);
    for (uint32_t il = p->stage_end ? p->stage_begin : 0;
         il < (p->stage_end && p->stage_end < p->n_layer ? p->stage_end : p->n_layer); il++) {
        const struct kt_expert_home *homes = p->layers[il].experts;
        const uint64_t eb = kt_layer_expert_bytes(m, il);
        for (uint32_t x = 0; homes && x < p->n_expert; x++) {
            const struct kt_expert_home *h = &homes[x];
            p->devices[h->device].part_bytes[KT_PART_ROUTED_EXPERTS] += eb;
            p->devices[h->device].n_experts++;
            if (h->device == 0) {
                p->node_bytes[h->node] += eb;
                p->node_experts[h->node]++;
            }
            for (int n = 0; n < p->n_nodes; n++)
                if (h->replica_nodes >> n & 1) {
                    p->node_bytes[n] += eb;
                    p->devices[0].part_bytes[KT_PART_REPLICAS] += eb;
                }
        }
    }
    for (int d = 0; d < p->n_devices; d++)
        p->devices[d].bytes += p->devices[d].part_bytes[KT_PART_ROUTED_EXPERTS] + p->devices[d].part_bytes[KT_PART_REPLICAS];
}

static struct kt_placement *copy_placement(const struct kt_placement *src)
{
    struct kt_placement *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    *p = *src;
    p->devices = malloc((size_t)src->n_devices * sizeof *p->devices);
    p->layers = calloc(src->n_layer, sizeof *p->layers);
    p->node_bytes = malloc((size_t)src->n_nodes * sizeof *p->node_bytes);
    p->node_experts = malloc((size_t)src->n_nodes * sizeof *p->node_experts);
    bool ok = p->devices && p->layers && p->node_bytes && p->node_experts;
    for (uint32_t il = 0; ok && il < src->n_layer; il++) {
        p->layers[il] = src->layers[il];
        p->layers[il].experts = NULL;
        if (src->layers[il].experts) {
            p->layers[il].experts = malloc(src->n_expert * sizeof *p->layers[il].experts);
            ok = p->layers[il].experts != NULL;
            if (ok)
                memcpy(p->layers[il].experts, src->layers[il].experts, src->n_expert * sizeof *p->layers[il].experts);
        }
    }
    if (!ok) {
        if (!p->layers)
            p->n_layer = 0;
        kt_placement_destroy(p);
        return NULL;
    }
    memcpy(p->devices, src->devices, (size_t)src->n_devices * sizeof *p->devices);
    memcpy(p->node_bytes, src->node_bytes, (size_t)src->n_nodes * sizeof *p->node_bytes);
    memcpy(p->node_experts, src->node_experts, (size_t)src->n_nodes * sizeof *p->node_experts);
    return p;
}

/* ---- the parts besides routed experts -------------------------------------------- */

static const char *accel_name(enum kt_place_backend b)
{
    return b == KT_PLACE_SIM ? "sim" : "gpu";
}

/* The machine file's accelerator of backend b (the first one). */
static const struct kt_machine_accel *machine_accel(const struct kt_machine *mach, enum kt_place_backend b)
{
    for (int i = 0; i < mach->n_accel; i++)
        if (mach->accel[i].backend == b)
            return &mach->accel[i];
    return NULL;
}

/* What put_parts writes besides the options: the accelerator's budget, link
 * and names (kt-place's own, or those of the placement a plan describes),
 * the KV cache's type, and which parts sit on the accelerator. */
struct parts_text {
    double memory_gib, transfer_gbps, latency_us;
    const char *accel;           /* the device's name: kt-place says "sim" or "gpu" */
    int cuda_device;
    const char *kv_type;         /* "f32", "bf16" or "f16"; NULL: none written (the tool's type, budgeted as f32) */
    bool on_accel[4];            /* attention, shared experts, dense layers, embeddings */
};

/* devices:, attention: ... of a plan (everything but its experts). */
static void put_parts(struct kt_text *t, const struct kt_planner_options *o, const struct parts_text *pt)
{
    kt_text_put(t, "version: 1\n");
    kt_text_put(t, "kv_cache:\n  tokens: %u\n", o->kv_tokens);
    if (pt->kv_type) /* else the tool's --kv-type runs, budgeted as f32 */
        kt_text_put(t, "  type: %s\n", pt->kv_type);
    const char *dev = "cpu";
    if (o->device != KT_PLACE_CPU) {
        dev = pt->accel;
        kt_text_put(t, "devices:\n  %s:\n    backend: %s\n", dev, kt_place_backend_name(o->device));
        if (o->device == KT_PLACE_CUDA)
            kt_text_put(t, "    device: %d\n", pt->cuda_device);
        kt_text_put(t, "    memory_gib: %.17g\n", pt->memory_gib);
        if (o->device == KT_PLACE_SIM)
            kt_text_put(t, "    transfer_gbps: %.17g\n    latency_us: %.17g\n", pt->transfer_gbps, pt->latency_us);
    }
    kt_text_put(t, "attention: %s\n", pt->on_accel[0] ? dev : "cpu");
    kt_text_put(t, "shared_experts: %s\n", pt->on_accel[1] ? dev : "cpu");
    kt_text_put(t, "dense_layers: %s\n", pt->on_accel[2] ? dev : "cpu");
    kt_text_put(t, "embeddings: %s\n", pt->on_accel[3] ? dev : "cpu");
}

/* Resolves the parts alone (every routed expert goes to the CPU). */
static kt_status resolve_parts(struct kt_plan *plan, const struct kt_model *m, int n_nodes, double memory_gib,
                               double transfer_gbps, double latency_us, const bool on_accel[4],
                               struct kt_placement **out, kt_err *err)
{
    struct kt_text t = {0};
    struct parts_text pt = {.memory_gib = memory_gib, .transfer_gbps = transfer_gbps, .latency_us = latency_us,
                            .accel = accel_name(plan->options.device), .kv_type = NULL};
    memcpy(pt.on_accel, on_accel, sizeof pt.on_accel);
    put_parts(&t, &plan->options, &pt);
    kt_text_put(&t, "cpu:\n  nodes: [");
    for (int n = 0; n < n_nodes; n++)
        kt_text_put(&t, "%s%d", n ? ", " : "", n);
    kt_text_put(&t, "]\n");
    if (t.failed) {
        free(t.s);
        return kt_err_set(err, KT_ERR_NOMEM, "planner: out of memory");
    }
    struct kt_placement_config *c = NULL;
    kt_status st = kt_placement_config_parse(t.s, t.len, "kt-place (parts)", &c, err);
    if (!st)
        kt_placement_config_set_stage(c, plan->options.stage_begin, plan->options.stage_end);
    if (!st)
        st = kt_placement_resolve(c, m, n_nodes, NULL, out, err);
    kt_placement_config_destroy(c);
    free(t.s);
    return st;
}

/* Attention + KV cache first, then shared experts, dense layers, embeddings, while they fit. */
static kt_status place_parts(struct planner *pl, const char *name, kt_err *err)
{
    struct kt_plan *plan = pl->plan;
    const struct kt_planner_options *o = &plan->options;
    bool on[4] = {false, false, false, false};
    double gib = 0, gbps = 0, lat = 0;
    if (o->device != KT_PLACE_CPU) {
        const struct kt_machine_accel *a = machine_accel(pl->mach, o->device);
        if (!a)
            return kt_err_set(err, KT_ERR_INVALID, "%s: the machine file has no %s accelerator to plan for "
                              "(run kt-bench machine with the device, or plan without --device)", name,
                              kt_place_backend_name(o->device));
        gib = o->gpu_memory_gib > 0 ? o->gpu_memory_gib : (double)a->memory_bytes / GIB;
        gbps = a->h2d_gbps > 0 ? a->h2d_gbps : 25;
        lat = a->latency_us > 0 ? a->latency_us : 10;
        if (!(gib > 0))
            return kt_err_set(err, KT_ERR_INVALID, "%s: the %s accelerator has no memory budget (%s)", name,
                              kt_place_backend_name(o->device), o->budget_source ? o->budget_source : "machine file");
        /* every part measured once, on an unbounded device */
        struct kt_placement *all = NULL;
        const bool every[4] = {true, true, true, true};
        kt_status st = resolve_parts(plan, pl->m, pl->n_nodes, 1048576.0, gbps, lat, every, &all, err);
        if (st)
            return st;
        const uint64_t *pb = all->devices[1].part_bytes;
        const uint64_t budget = (uint64_t)(gib * GIB);
        /* the engine's working buffers as with every part there (the head's too): at most what it takes */
        uint64_t used = pb[KT_PART_ATTENTION] + pb[KT_PART_KV_CACHE] + pb[KT_PART_WORK_BUFFERS];
        if (used > budget) {
            char a1[32], a2[32], a3[32], a4[32], a5[32];
            st = kt_err_set(err, KT_ERR_INVALID,
                            "%s: attention, its KV cache and the working buffers need %s on the %s accelerator "
                            "(attention and router %s, KV cache %s for %u tokens, working buffers %s) but its budget "
                            "is %s (%s): give more memory or fewer --kv-tokens",
                            name, kt_text_bytes(used, a1, sizeof a1), kt_place_backend_name(o->device),
                            kt_text_bytes(pb[KT_PART_ATTENTION], a2, sizeof a2), kt_text_bytes(pb[KT_PART_KV_CACHE], a3, sizeof a3),
                            o->kv_tokens, kt_text_bytes(pb[KT_PART_WORK_BUFFERS], a5, sizeof a5), kt_text_bytes(budget, a4, sizeof a4),
                            o->budget_source ? o->budget_source : "machine file");
            kt_placement_destroy(all);
            return st;
        }
        on[0] = true;
        const enum kt_place_part next[3] = {KT_PART_SHARED_EXPERTS, KT_PART_DENSE_FFN, KT_PART_EMBEDDINGS};
        /* a stage not starting at 0 holds no embeddings or head (the engine's): none to place */
        const int n_next = o->stage_end && o->stage_begin > 0 ? 2 : 3;
        for (int i = 0; i < n_next; i++)
            if (used + pb[next[i]] <= budget) {
                used += pb[next[i]];
                on[1 + i] = true;
            }
        kt_placement_destroy(all);
    }
    kt_status st = resolve_parts(plan, pl->m, pl->n_nodes, gib, gbps, lat, on, &pl->p, err);
    if (st)
        return st;
    plan->placement = pl->p;
    plan->accel = o->device != KT_PLACE_CPU ? 1 : 0;
    plan->accel_memory_gib = gib;
    plan->accel_transfer_gbps = gbps;
    plan->accel_latency_us = lat;
    if (plan->accel) {
        const struct kt_placement_device *d = &pl->p->devices[1];
        uint64_t other = d->bytes - d->part_bytes[KT_PART_ROUTED_EXPERTS];
        plan->expert_budget_bytes = d->budget_bytes > other ? d->budget_bytes - other : 0;
    }
    /* start from every expert on the CPU, node 0 */
    for (uint32_t il = 0; il < pl->p->n_layer; il++)
        for (uint32_t x = 0; pl->p->layers[il].experts && x < pl->p->n_expert; x++)
            pl->p->layers[il].experts[x] = (struct kt_expert_home){.device = 0, .node = 0};
    return KT_OK;
}

/* ---- accelerator slots: a heap over layers ----------------------------------------- */

struct slot {
    double gain_per_byte;
    double gain;                 /* of the `take` slots together */
    uint32_t il, take;
};

struct slot_heap {
    struct slot *v;
    uint32_t n;
};

static void heap_push(struct slot_heap *h, struct slot s)
{
    uint32_t i = h->n++;
    while (i > 0) {
        uint32_t up = (i - 1) / 2;
        if (h->v[up].gain_per_byte >= s.gain_per_byte)
            break;
        h->v[i] = h->v[up];
        i = up;
    }
    h->v[i] = s;
}

static struct slot heap_pop(struct slot_heap *h)
{
    struct slot top = h->v[0], last = h->v[--h->n];
    uint32_t i = 0;
    for (;;) {
        uint32_t c = 2 * i + 1;
        if (c >= h->n)
            break;
        if (c + 1 < h->n && h->v[c + 1].gain_per_byte > h->v[c].gain_per_byte)
            c++;
        if (h->v[c].gain_per_byte <= last.gain_per_byte)
            break;
        h->v[i] = h->v[c];
        i = c;
    }
    if (h->n)
        h->v[i] = last;
    return top;
}

/* Layer il's next worthwhile step: its next `take` hottest experts onto the
 * accelerator (1, or a few where one alone does not pay for the copies it
 * adds).  False when none fits in `left` bytes or none saves time. */
static bool next_slot(struct planner *pl, uint32_t il, const uint32_t *order, uint32_t k, double cur, uint64_t left,
                      struct slot *out, struct kt_plan_layer *info)
{
    const uint32_t n = pl->m->hp.n_expert;
    const uint64_t eb = kt_layer_expert_bytes(pl->m, il);
    struct kt_expert_home *homes = pl->p->layers[il].experts;
    const bool proxy_sliced = pl->n_nodes > 1;
    info->next_gain_s = 0;
    info->next_fits = false;
    for (uint32_t take = 1; k + take <= n && take <= 64; take *= 2) {
        for (uint32_t i = k; i < k + take; i++)
            homes[order[i]].device = pl->plan->accel;
        const double gain = cur - objective(pl, il, proxy_sliced);
        for (uint32_t i = k; i < k + take; i++)
            homes[order[i]].device = 0;
        const bool fits = (uint64_t)take * eb <= left;
        if (take == 1) {
            info->next_gain_s = gain;
            info->next_fits = fits;
        }
        if (!fits)
            return false;
        if (gain > 0) {
            *out = (struct slot){gain / ((double)take * (double)eb), gain, il, take};
            return true;
        }
    }
    return false;
}

/* Whether layer il is the plan's (its stage's, or every layer). */
static bool in_stage(const struct kt_planner_options *o, uint32_t il)
{
    return o->stage_end == 0 || (il >= o->stage_begin && il < o->stage_end);
}

static kt_status place_accel_experts(struct planner *pl, uint32_t *order /* [n_layer][n_expert] */,
                                     uint64_t budget, kt_err *err)
{
    const uint32_t n_layer = pl->m->hp.n_layer, n = pl->m->hp.n_expert;
    struct kt_plan_layer *info = pl->plan->layers;
    struct slot_heap h = {malloc(n_layer * sizeof *h.v), 0};
    uint32_t *k = calloc(n_layer, sizeof *k);
    double *cur = calloc(n_layer, sizeof *cur);
    if (!h.v || !k || !cur) {
        free(h.v), free(k), free(cur);
        return kt_err_set(err, KT_ERR_NOMEM, "planner: out of memory");
    }
    const bool proxy_sliced = pl->n_nodes > 1;
    uint64_t left = budget;
    for (uint32_t il = 0; il < n_layer; il++) {
        if (!pl->p->layers[il].experts || !in_stage(&pl->plan->options, il))
            continue;
        cur[il] = objective(pl, il, proxy_sliced);
        struct slot s;
        if (next_slot(pl, il, order + (size_t)il * n, 0, cur[il], left, &s, &info[il]))
            heap_push(&h, s);
    }
    while (h.n > 0) {
        struct slot s = heap_pop(&h);
        const uint32_t il = s.il;
        const uint64_t bytes = (uint64_t)s.take * kt_layer_expert_bytes(pl->m, il);
        if (bytes > left) {
            info[il].next_gain_s = s.gain / s.take;
            info[il].next_fits = false;
            continue;
        }
        const uint32_t *ord = order + (size_t)il * n;
        for (uint32_t i = k[il]; i < k[il] + s.take; i++)
            pl->p->layers[il].experts[ord[i]].device = pl->plan->accel;
        k[il] += s.take;
        left -= bytes;
        if (info[il].gpu_experts == 0)
            info[il].first_gain_s = s.gain / s.take;
        info[il].last_gain_s = s.gain / s.take;
        info[il].gpu_experts = k[il];
        cur[il] -= s.gain;
        struct slot next;
        if (next_slot(pl, il, ord, k[il], cur[il], left, &next, &info[il]))
            heap_push(&h, next);
    }
    free(h.v), free(k), free(cur);
    return KT_OK;
}

/* ---- CPU experts over NUMA nodes ---------------------------------------------------- */

/* Whole experts of layer il, hottest first onto the node where it ends the
 * least loaded (preload: time already there); loads gets the experts' own. */
static void home_whole(struct planner *pl, uint32_t il, const double *preload, double *loads)
{
    const uint32_t n = pl->m->hp.n_expert;
    struct kt_expert_home *homes = pl->p->layers[il].experts;
    const double *t = pl->node_expert_s + (size_t)il * pl->n_nodes;
    uint32_t m = 0;
    for (uint32_t x = 0; x < n; x++)
        if (homes[x].device == 0)
            pl->scratch[m++] = (struct heat){kt_cost_p_active(pl->cost, il, x, pl->qbal), x};
    qsort(pl->scratch, m, sizeof *pl->scratch, hotter);
    double total[KT_PLACEMENT_MAX_NODES];
    for (int d = 0; d < pl->n_nodes; d++) {
        total[d] = preload ? preload[d] : 0;
        loads[d] = 0;
    }
    for (uint32_t i = 0; i < m; i++) {
        int best = 0;
        double best_end = INFINITY;
        for (int d = 0; d < pl->n_nodes; d++) {
            double end = total[d] + pl->scratch[i].v * t[d];
            if (end < best_end) {
                best_end = end;
                best = d;
            }
        }
        homes[pl->scratch[i].x].node = best;
        total[best] = best_end;
        loads[best] += pl->scratch[i].v * t[best];
    }
}

double kt_plan_layer_balance(const struct kt_placement *p, const struct kt_cost_layer *l)
{
    double max = 0, sum = 0;
    int k = 0;
    for (int n = 0; n < p->n_nodes && n < KT_PLACEMENT_MAX_NODES; n++) {
        if (!(p->expert_nodes >> n & 1))
            continue;
        sum += l->node_s[n];
        max = l->node_s[n] > max ? l->node_s[n] : max;
        k++;
    }
    /* per step, as the engine measures it: E[busiest node] (cpu_experts_s) over the
     * mean node, not the busiest node's mean - at batch 1 the k active experts fall
     * unevenly on whole-expert homes even when every node's mean is the same */
    max = l->cpu_experts_s > max ? l->cpu_experts_s : max;
    return k > 1 && sum > 0 ? max / (sum / k) : 1.0;
}

static void spread_layer(struct planner *pl, uint32_t il)
{
    struct kt_placement_layer *L = &pl->p->layers[il];
    struct kt_plan_layer *info = &pl->plan->layers[il];
    const uint32_t n = pl->p->n_expert;
    info->balance_whole = info->balance = 1.0;
    L->cpu_sliced = false;
    if (pl->n_nodes == 1) {
        for (uint32_t x = 0; x < n; x++)
            L->experts[x].node = 0;
        return;
    }
    double loads[KT_PLACEMENT_MAX_NODES], pre[KT_PLACEMENT_MAX_NODES];
    struct kt_cost_layer c, all0;
    home_whole(pl, il, NULL, loads);
    kt_cost_layer(pl->cost, pl->p, il, L->experts, false, pl->qbal, &c);
    double ratio = kt_plan_layer_balance(pl->p, &c);
    if (ratio > KT_PLAN_BALANCE_LIMIT) {
        /* The cost model may put more on a node than these experts (the
         * shared experts with node 0's pool) and price an expert otherwise
         * than our estimate: fit node_s = base + scale x load from this spread
         * and from every CPU expert on node 0, then spread again with the
         * bases pre-loaded. */
        int *was = malloc(n * sizeof *was);
        const bool fitted = was != NULL;
        double total = 0;
        for (int d = 0; d < pl->n_nodes; d++)
            total += loads[d] * pl->node_expert_s[(size_t)il * pl->n_nodes] /
                     pl->node_expert_s[(size_t)il * pl->n_nodes + d];
        if (was) {
            for (uint32_t x = 0; x < n; x++) {
                was[x] = L->experts[x].node;
                L->experts[x].node = 0;
            }
            kt_cost_layer(pl->cost, pl->p, il, L->experts, false, pl->qbal, &all0);
            for (uint32_t x = 0; x < n; x++)
                L->experts[x].node = was[x];
            free(was);
        }
        const double scale = fitted && total > loads[0] ? (all0.node_s[0] - c.node_s[0]) / (total - loads[0]) : 0;
        if (scale > 0) {
            for (int d = 0; d < pl->n_nodes; d++) {
                const double base = d == 0 ? c.node_s[0] - scale * loads[0] : all0.node_s[d];
                pre[d] = base > 0 ? base / scale : 0;
            }
            home_whole(pl, il, pre, loads);
            kt_cost_layer(pl->cost, pl->p, il, L->experts, false, pl->qbal, &c);
            const double again = kt_plan_layer_balance(pl->p, &c);
            if (again > ratio)
                home_whole(pl, il, NULL, loads); /* the first spread was better */
            else
                ratio = again;
        }
    }
    info->balance_whole = info->balance = ratio;
    /* Sliced where that makes the layer faster by the objective, or (as
     * before) better balanced past the limit: at batch 1 the k active experts
     * fall unevenly on whole homes however even their means are, and a slice
     * splits each one evenly.  On nodes of unequal speed a whole spread can
     * give the faster node more and stays. */
    kt_cost_layer(pl->cost, pl->p, il, L->experts, true, pl->qbal, &c);
    const double sliced = kt_plan_layer_balance(pl->p, &c);
    const bool faster = objective(pl, il, true) < objective(pl, il, false) * (1 - SLICE_MIN_GAIN);
    if (faster || (ratio > KT_PLAN_BALANCE_LIMIT && sliced < ratio)) {
        L->cpu_sliced = true;
        info->balance = sliced;
    }
}

static void apply_replicas(struct planner *pl, uint32_t R);

/* The hot_per_layer (at most n_expert_used) whose copies fit in every node's RAM and that the
 * objective predicts fastest;
 * none when a layer is row-sliced. */
static void choose_replicas(struct planner *pl)
{
    struct kt_placement *p = pl->p;
    const uint32_t n = p->n_expert;
    pl->plan->replicas_hot_per_layer = 0;
    if (__builtin_popcountll(p->expert_nodes) < 2 || n == 0)
        return;
    /* hot_per_layer copies in every layer, and the engine refuses replicas in a sliced one */
    for (uint32_t il = 0; il < p->n_layer; il++)
        if (p->layers[il].cpu_sliced)
            return;
    const uint32_t R_max = pl->m->hp.n_expert_used < n ? pl->m->hp.n_expert_used : n;
    uint64_t cpu_other = p->devices[0].bytes - p->devices[0].part_bytes[KT_PART_ROUTED_EXPERTS] -
                         p->devices[0].part_bytes[KT_PART_REPLICAS];
    uint64_t extra[KT_PLACEMENT_MAX_NODES][9] = {{0}}; /* [node][R]: replica bytes of the R hottest */
    struct heat top[8];
    for (uint32_t il = 0; il < p->n_layer; il++) {
        const struct kt_expert_home *homes = p->layers[il].experts;
        if (!homes)
            continue;
        uint32_t got = 0; /* the R_max hottest CPU experts, as plan.c orders them */
        for (uint32_t x = 0; x < n; x++) {
            if (homes[x].device != 0)
                continue;
            struct heat hx = {config_heat(pl->prof, il, x), x};
            uint32_t i = got < R_max ? got++ : R_max;
            if (i == R_max && hotter(&hx, &top[R_max - 1]) >= 0)
                continue;
            if (i == R_max)
                i = R_max - 1;
            while (i > 0 && hotter(&hx, &top[i - 1]) < 0) {
                top[i] = top[i - 1];
                i--;
            }
            top[i] = hx;
        }
        const uint64_t eb = kt_layer_expert_bytes(pl->m, il);
        for (int d = 0; d < p->n_nodes; d++) {
            uint64_t acc = 0;
            for (uint32_t r = 0; r < R_max; r++) {
                if (r < got && homes[top[r].x].node != d)
                    acc += eb;
                extra[d][r + 1] += acc;
            }
        }
    }
    uint32_t R_fit = 0; /* the most copies every node's RAM takes */
    for (uint32_t R = R_max; R > 0 && !R_fit; R--) {
        bool fits = true;
        for (int d = 0; d < p->n_nodes && fits; d++) {
            double cap = RAM_USABLE * (double)pl->mach->nodes[d].memory_bytes;
            fits = (double)(p->node_bytes[d] + extra[d][R] + cpu_other) <= cap;
        }
        R_fit = fits ? R : 0;
    }
    /* of those, the count the objective predicts fastest: a copy helps only where the
     * busiest node sheds more than it costs (at batch 1 an even share of a hot expert's
     * pairs can make the nodes' loads vary more, not less); none unless it gains */
    double best = 0;
    for (uint32_t R = 0; R <= R_fit; R++) {
        apply_replicas(pl, R);
        double t = 0;
        for (uint32_t il = 0; il < p->n_layer; il++)
            if (p->layers[il].experts)
                t += objective(pl, il, false);
        if (R == 0 || t < best * (1.0 - REPLICA_MIN_GAIN)) {
            best = t;
            pl->plan->replicas_hot_per_layer = R;
        }
    }
    apply_replicas(pl, 0);
}

/* Sets the replicas plan.c will make of hot_per_layer (its order: both phases' counts, then index). */
static void apply_replicas(struct planner *pl, uint32_t R)
{
    struct kt_placement *p = pl->p;
    for (uint32_t il = 0; il < p->n_layer; il++) {
        struct kt_expert_home *homes = p->layers[il].experts;
        if (!homes)
            continue;
        uint32_t m = 0;
        for (uint32_t x = 0; x < p->n_expert; x++) {
            homes[x].replica_nodes = 0;
            if (homes[x].device == 0)
                pl->scratch[m++] = (struct heat){config_heat(pl->prof, il, x), x};
        }
        if (R == 0 || __builtin_popcountll(p->expert_nodes) < 2)
            continue;
        qsort(pl->scratch, m, sizeof *pl->scratch, hotter);
        for (uint32_t i = 0; i < m && i < R; i++) {
            struct kt_expert_home *h = &homes[pl->scratch[i].x];
            h->replica_nodes = p->expert_nodes & ~(1ull << h->node);
        }
    }
}

/* ---- entry points ----------------------------------------------------------------- */

static kt_status planner_init(struct planner *pl, const struct kt_model *m, const struct kt_profile *prof,
                              const struct kt_machine *mach, const struct kt_cost_model *cost, struct kt_plan *plan,
                              kt_err *err)
{
    const struct kt_planner_options *o = &plan->options;
    *pl = (struct planner){.m = m, .prof = prof, .mach = mach, .cost = cost, .plan = plan, .p = plan->placement};
    pl->n_nodes = mach->n_nodes;
    pl->qd = (struct kt_cost_query){.mode = KT_COST_DECODE, .batch = o->batch, .context = o->context};
    pl->qp = (struct kt_cost_query){.mode = KT_COST_PREFILL, .tokens = o->prefill_tokens};
    pl->qbal = o->objective == KT_PLAN_PREFILL ? &pl->qp : &pl->qd;
    pl->wd = plan->weight_decode;
    pl->wp = plan->weight_prefill;
    pl->node_expert_s = calloc((size_t)m->hp.n_layer * (size_t)(pl->n_nodes > 0 ? pl->n_nodes : 1), sizeof(double));
    pl->scratch = malloc((m->hp.n_expert ? m->hp.n_expert : 1) * sizeof *pl->scratch);
    if (!pl->node_expert_s || !pl->scratch)
        return kt_err_set(err, KT_ERR_NOMEM, "planner: out of memory");
    expert_times(pl);
    return KT_OK;
}

static void planner_free(struct planner *pl)
{
    free(pl->node_expert_s);
    free(pl->scratch);
}

static void set_weights(struct kt_plan *plan, const struct kt_profile *prof)
{
    switch (plan->options.objective) {
    case KT_PLAN_DECODE: plan->weight_decode = 1, plan->weight_prefill = 0; break;
    case KT_PLAN_PREFILL: plan->weight_decode = 0, plan->weight_prefill = 1; break;
    case KT_PLAN_MIXED: {
        /* the profiled workload: its decode and prefill tokens (half each when unknown) */
        double d = prof ? prof->tokens[KT_PROFILE_DECODE] : 0, f = prof ? prof->tokens[KT_PROFILE_PREFILL] : 0;
        if (!(d + f > 0))
            d = f = 1;
        plan->weight_decode = d / (d + f);
        plan->weight_prefill = f / (d + f);
        break;
    }
    }
}

kt_status kt_plan_create(const struct kt_model *m, const char *name, const struct kt_profile *prof,
                         const struct kt_machine *mach, const struct kt_cost_model *cost,
                         const struct kt_planner_options *o, struct kt_plan **out, kt_err *err)
{
    const double t0 = now_s();
    *out = NULL;
    name = name ? name : "model";
    if (mach->n_nodes < 1 || mach->n_nodes > KT_PLACEMENT_MAX_NODES)
        return kt_err_set(err, KT_ERR_INVALID, "%s: the machine file has %d NUMA nodes (1 to %d planned for)", name,
                          mach->n_nodes, KT_PLACEMENT_MAX_NODES);
    if (prof && prof->n_expert && (prof->n_layer != m->hp.n_layer || prof->n_expert != m->hp.n_expert))
        return kt_err_set(err, KT_ERR_INVALID, "%s: a profile of %u layers x %u experts, the model has %u x %u", name,
                          prof->n_layer, prof->n_expert, m->hp.n_layer, m->hp.n_expert);
    if (o->stage_end && (o->stage_begin >= o->stage_end || o->stage_end > m->hp.n_layer))
        return kt_err_set(err, KT_ERR_INVALID, "%s: a stage of layers [%u, %u) of its %u", name, o->stage_begin,
                          o->stage_end, m->hp.n_layer);
    struct kt_plan *plan = calloc(1, sizeof *plan);
    if (!plan)
        return kt_err_set(err, KT_ERR_NOMEM, "planner: out of memory");
    plan->options = *o;
    plan->layer_begin = o->stage_begin;
    plan->layer_end = o->stage_end;
    struct kt_planner_options *po = &plan->options;
    po->kv_tokens = po->kv_tokens ? po->kv_tokens : 4096;
    po->batch = po->batch ? po->batch : 1;
    po->prefill_tokens = po->prefill_tokens ? po->prefill_tokens : 512;
    po->context = po->context ? po->context : 512;
    set_weights(plan, prof);
    plan->layers = calloc(m->hp.n_layer, sizeof *plan->layers);
    struct planner pl;
    uint32_t *order = NULL;
    kt_status st = plan->layers ? planner_init(&pl, m, prof, mach, cost, plan, err)
                                : kt_err_set(err, KT_ERR_NOMEM, "planner: out of memory");
    if (!st)
        st = place_parts(&pl, name, err);
    const uint32_t n = m->hp.n_expert;
    if (!st && !(order = malloc((size_t)m->hp.n_layer * (n ? n : 1) * sizeof *order)))
        st = kt_err_set(err, KT_ERR_NOMEM, "planner: out of memory");
    for (uint32_t il = 0; !st && il < m->hp.n_layer; il++)
        if (pl.p->layers[il].experts)
            order_by_heat(&pl, il, order + (size_t)il * n);
    if (!st && plan->accel)
        st = place_accel_experts(&pl, order, plan->expert_budget_bytes, err);
    for (uint32_t il = 0; !st && il < m->hp.n_layer; il++)
        if (pl.p->layers[il].experts)
            spread_layer(&pl, il);
    if (!st) {
        recount_experts(pl.p, m);
        choose_replicas(&pl);
        apply_replicas(&pl, plan->replicas_hot_per_layer);
        recount_experts(pl.p, m);
        for (uint32_t il = 0; il < m->hp.n_layer; il++) {
            const struct kt_placement_layer *L = &pl.p->layers[il];
            plan->layers[il].decode_s = kt_cost_layer(cost, pl.p, il, L->experts, L->cpu_sliced, &pl.qd, NULL);
            plan->layers[il].prefill_s = kt_cost_layer(cost, pl.p, il, L->experts, L->cpu_sliced, &pl.qp, NULL);
        }
    }
    free(order);
    if (plan->layers)
        planner_free(&pl);
    if (st) {
        kt_plan_destroy(plan);
        return st;
    }
    snprintf(plan->placement->source, sizeof plan->placement->source, "kt-place plan of %s", name);
    plan->plan_s = now_s() - t0;
    *out = plan;
    return KT_OK;
}

void kt_plan_destroy(struct kt_plan *p)
{
    if (!p)
        return;
    kt_placement_destroy(p->placement);
    free(p->layers);
    free(p);
}

/* ---- baselines -------------------------------------------------------------------- */

struct layer_heat {
    double v;
    uint32_t il, x;
};

/* Hottest first; ties to the lower layer, then the lower expert. */
static int hotter_anywhere(const void *a, const void *b)
{
    const struct layer_heat *x = a, *y = b;
    if (x->v != y->v)
        return x->v > y->v ? -1 : 1;
    if (x->il != y->il)
        return x->il < y->il ? -1 : 1;
    return x->x < y->x ? -1 : x->x > y->x;
}

kt_status kt_plan_baseline(const struct kt_plan *plan, const struct kt_model *m, const struct kt_profile *prof,
                           const struct kt_machine *mach, const struct kt_cost_model *cost, enum kt_plan_baseline b,
                           struct kt_placement **out, kt_err *err)
{
    *out = NULL;
    struct kt_plan tmp = *plan;
    tmp.layers = calloc(m->hp.n_layer, sizeof *tmp.layers);
    tmp.placement = copy_placement(plan->placement);
    struct planner pl = {0};
    kt_status st = tmp.layers && tmp.placement ? planner_init(&pl, m, prof, mach, cost, &tmp, err)
                                               : kt_err_set(err, KT_ERR_NOMEM, "planner: out of memory");
    const uint32_t n = m->hp.n_expert;
    struct kt_placement *p = tmp.placement;
    uint32_t n_moe = 0;
    uint64_t eb_max = 0;
    for (uint32_t il = 0; !st && il < p->n_layer; il++) {
        p->layers[il].cpu_sliced = false;
        for (uint32_t x = 0; p->layers[il].experts && x < n; x++)
            p->layers[il].experts[x] = (struct kt_expert_home){.device = 0, .node = 0};
        if (p->layers[il].experts) {
            n_moe++;
            uint64_t eb = kt_layer_expert_bytes(m, il);
            eb_max = eb > eb_max ? eb : eb_max;
        }
    }
    uint64_t left = plan->accel ? plan->expert_budget_bytes : 0;
    if (!st && plan->accel && n_moe && eb_max && b != KT_BASELINE_GLOBAL_TOP) {
        uint64_t per = left / (eb_max * n_moe);
        per = per < n ? per : n;
        for (uint32_t il = 0; il < p->n_layer; il++) {
            if (!p->layers[il].experts)
                continue;
            for (uint32_t x = 0; x < n; x++)
                pl.scratch[x] = (struct heat){b == KT_BASELINE_BY_INDEX ? 0 : config_heat(prof, il, x), x};
            qsort(pl.scratch, n, sizeof *pl.scratch, hotter);
            for (uint32_t i = 0; i < per; i++)
                p->layers[il].experts[pl.scratch[i].x].device = plan->accel;
        }
    } else if (!st && plan->accel && n_moe) {
        struct layer_heat *all = malloc((size_t)n_moe * n * sizeof *all);
        if (!all)
            st = kt_err_set(err, KT_ERR_NOMEM, "planner: out of memory");
        size_t k = 0;
        for (uint32_t il = 0; !st && il < p->n_layer; il++)
            for (uint32_t x = 0; p->layers[il].experts && x < n; x++)
                all[k++] = (struct layer_heat){config_heat(prof, il, x), il, x};
        if (!st)
            qsort(all, k, sizeof *all, hotter_anywhere);
        for (size_t i = 0; !st && i < k; i++) {
            uint64_t eb = kt_layer_expert_bytes(m, all[i].il);
            if (eb > left)
                continue;
            p->layers[all[i].il].experts[all[i].x].device = plan->accel;
            left -= eb;
        }
        free(all);
    }
    for (uint32_t il = 0; !st && il < p->n_layer; il++)
        if (p->layers[il].experts) {
            spread_layer(&pl, il);
            p->layers[il].cpu_sliced = false; /* configs today home experts whole */
        }
    if (!st)
        recount_experts(p, m);
    if (tmp.layers && tmp.placement)
        planner_free(&pl);
    free(tmp.layers);
    if (st) {
        kt_placement_destroy(tmp.placement);
        return st;
    }
    snprintf(p->source, sizeof p->source, "baseline: %s", kt_plan_baseline_name(b));
    *out = p;
    return KT_OK;
}

/* ---- report ----------------------------------------------------------------------- */

kt_status kt_plan_summarize(const struct kt_cost_model *cost, const struct kt_placement *p,
                            const struct kt_planner_options *o, struct kt_plan_summary *out, kt_err *err)
{
    memset(out, 0, sizeof *out);
    struct kt_cost_layer *layers = calloc(p->n_layer ? p->n_layer : 1, sizeof *layers);
    if (!layers)
        return kt_err_set(err, KT_ERR_NOMEM, "planner: out of memory");
    const uint32_t batch = o->batch ? o->batch : 1, tokens = o->prefill_tokens ? o->prefill_tokens : 512;
    struct kt_cost_query qd = {.mode = KT_COST_DECODE, .batch = batch, .context = o->context ? o->context : 512};
    struct kt_cost_query qp = {.mode = KT_COST_PREFILL, .tokens = tokens};
    kt_status st = kt_cost_predict(cost, p, &qp, layers, &out->prefill_s, err);
    if (!st)
        st = kt_cost_predict(cost, p, &qd, layers, &out->decode_step_s, err);
    if (!st) {
        double dev = 0, all = 0, worst = 0, sum = 0;
        uint32_t k = 0;
        for (uint32_t il = 0; il < p->n_layer; il++) {
            dev += layers[il].device_pairs;
            all += layers[il].pairs;
            const struct kt_placement_layer *L = &p->layers[il];
            out->sliced_layers += L->cpu_sliced;
            bool cpu_work = false;
            for (uint32_t x = 0; L->experts && x < p->n_expert; x++) {
                cpu_work |= L->experts[x].device == 0;
                out->accel_experts += L->experts[x].device != 0;
            }
            if (!cpu_work)
                continue;
            double b = kt_plan_layer_balance(p, &layers[il]);
            worst = b > worst ? b : worst;
            sum += b;
            k++;
        }
        out->accel_share = all > 0 ? dev / all : 0;
        out->balance_worst = k ? worst : 1;
        out->balance_mean = k ? sum / k : 1;
        out->decode_tok_s = out->decode_step_s > 0 ? batch / out->decode_step_s : 0;
        out->prefill_tok_s = out->prefill_s > 0 ? tokens / out->prefill_s : 0;
    }
    free(layers);
    return st;
}

/* ---- the config text ---------------------------------------------------------------- */

/* "[0, 5, 9-12]" of the experts of layer il homed where `pick` says. */
static void put_list(struct kt_text *t, const struct kt_expert_home *homes, uint32_t n, int device, int node)
{
    kt_text_put(t, "[");
    bool first = true;
    for (uint32_t x = 0; x < n; x++) {
        bool in = homes[x].device == device && (device != 0 || homes[x].node == node);
        if (!in)
            continue;
        uint32_t last = x;
        while (last + 1 < n && homes[last + 1].device == device && (device != 0 || homes[last + 1].node == node))
            last++;
        if (last == x)
            kt_text_put(t, "%s%u", first ? "" : ", ", x);
        else
            kt_text_put(t, "%s%u-%u", first ? "" : ", ", x, last);
        first = false;
        x = last;
    }
    kt_text_put(t, "]");
}

static bool any_on(const struct kt_expert_home *homes, uint32_t n, int device, int node)
{
    for (uint32_t x = 0; x < n; x++)
        if (homes[x].device == device && (device != 0 || homes[x].node == node))
            return true;
    return false;
}

/* Whether kt_plan_yaml writes layer il of plan (its layer range). */
static bool yaml_layer(const struct kt_plan *plan, uint32_t il)
{
    return plan->layer_end == 0 || (il >= plan->layer_begin && il < plan->layer_end);
}

char *kt_plan_yaml(const struct kt_plan *plan, const char *model_name, const char *profile_path)
{
    const struct kt_placement *p = plan->placement;
    const struct kt_planner_options *o = &plan->options;
    static const char *const objective[] = {"decode", "prefill", "mixed"};
    struct kt_text t = {0};
    bool predicted = false; /* a placement read back from an engine has no predictions */
    for (uint32_t il = 0; il < p->n_layer; il++)
        predicted |= plan->layers[il].decode_s > 0 || plan->layers[il].prefill_s > 0;
    if (plan->description) {
        kt_text_put(&t, "# %s: %s\n# %d NUMA node(s)\n", model_name ? model_name : "a model", plan->description, p->n_nodes);
    } else {
        kt_text_put(&t, "# kt-place plan for %s\n", model_name ? model_name : "a model");
        kt_text_put(&t, "# objective %s (decode batch %u at context %u, prefill of %u tokens); %d NUMA node(s)\n",
            objective[o->objective], o->batch, o->context, o->prefill_tokens, p->n_nodes);
    }
    if (predicted)
        kt_text_put(&t, "# predicted per layer (ms): decode step, prefill; accelerator experts; CPU busiest/mean node\n");
    for (uint32_t il = 0; predicted && il < p->n_layer; il++) {
        if (!yaml_layer(plan, il))
            continue;
        const struct kt_plan_layer *l = &plan->layers[il];
        kt_text_put(&t, "#   layer %3u: decode %.4f  prefill %.4f", il, 1e3 * l->decode_s, 1e3 * l->prefill_s);
        if (p->layers[il].experts)
            kt_text_put(&t, "  accel %u  balance %.3f%s", l->gpu_experts, l->balance,
                p->layers[il].cpu_sliced ? " (row-sliced)" : "");
        kt_text_put(&t, "\n");
    }
    const struct kt_placement_device *acc = plan->accel ? &p->devices[plan->accel] : NULL;
    bool on[4] = {false, false, false, false};
    for (uint32_t il = 0; acc && il < p->n_layer; il++) {
        const struct kt_placement_layer *L = &p->layers[il];
        on[0] |= L->attention == plan->accel;
        on[1] |= L->shared_experts == plan->accel;
        on[2] |= L->dense_ffn == plan->accel;
    }
    on[3] = acc && p->embeddings == plan->accel;
    if (plan->description) {
        kt_text_put(&t, "description: '");
        for (const char *c = plan->description; *c; c++)
            if (*c == '\'')
                kt_text_put(&t, "''"); /* the one escape in YAML's single quotes */
            else
                kt_text_put(&t, "%c", *c);
        kt_text_put(&t, "'\n");
    } else {
        kt_text_put(&t, "description: kt-place plan (objective %s)\n", objective[o->objective]);
    }
    if (profile_path)
        kt_text_put(&t, "profile: '%s'\n", profile_path);
    /* the very text the parts were resolved with: the same budget in bytes, the device's own name */
    struct parts_text pt = {.memory_gib = plan->accel_memory_gib, .transfer_gbps = plan->accel_transfer_gbps,
                            .latency_us = plan->accel_latency_us, .accel = acc ? acc->name : accel_name(o->device),
                            .cuda_device = acc ? acc->cuda_device : 0,
                            .kv_type = p->kv_type_given ? kt_row_type_name(p->kv_type) : NULL};
    memcpy(pt.on_accel, on, sizeof on);
    put_parts(&t, o, &pt);
    const uint32_t n = p->n_expert;
    if (acc && acc->n_experts) {
        kt_text_put(&t, "experts:\n  %s:\n    layers:\n", pt.accel);
        for (uint32_t il = 0; il < p->n_layer; il++) {
            const struct kt_expert_home *homes = p->layers[il].experts;
            if (!homes || !yaml_layer(plan, il) || !any_on(homes, n, plan->accel, -1))
                continue;
            kt_text_put(&t, "      %u: ", il);
            put_list(&t, homes, n, plan->accel, -1);
            kt_text_put(&t, "\n");
        }
    }
    /* the nodes experts may use, and any one that holds experts anyway */
    kt_text_put(&t, "cpu:\n  nodes: [");
    bool first_node = true;
    for (int d = 0; d < p->n_nodes; d++)
        if (p->expert_nodes >> d & 1 || p->node_experts[d]) {
            kt_text_put(&t, "%s%d", first_node ? "" : ", ", d);
            first_node = false;
        }
    kt_text_put(&t, "]\n");
    bool cpu_experts = false; /* in the layers written */
    for (uint32_t il = 0; il < p->n_layer && !cpu_experts; il++)
        for (int d = 0; d < p->n_nodes && !cpu_experts; d++)
            cpu_experts = p->layers[il].experts && yaml_layer(plan, il) && any_on(p->layers[il].experts, n, 0, d);
    if (cpu_experts) {
        kt_text_put(&t, "  assign:\n");
        for (int d = 0; d < p->n_nodes; d++) {
            bool any = false;
            for (uint32_t il = 0; il < p->n_layer && !any; il++)
                any = p->layers[il].experts && yaml_layer(plan, il) && any_on(p->layers[il].experts, n, 0, d);
            if (!any)
                continue;
            kt_text_put(&t, "    %d:\n      layers:\n", d);
            for (uint32_t il = 0; il < p->n_layer; il++) {
                const struct kt_expert_home *homes = p->layers[il].experts;
                if (!homes || !yaml_layer(plan, il) || !any_on(homes, n, 0, d))
                    continue;
                kt_text_put(&t, "        %u: ", il);
                put_list(&t, homes, n, 0, d);
                kt_text_put(&t, "\n");
            }
        }
    }
    if (plan->replicas_hot_per_layer)
        kt_text_put(&t, "  replicas:\n    hot_per_layer: %u\n", plan->replicas_hot_per_layer);
    bool sliced = false;
    for (uint32_t il = 0; il < p->n_layer; il++)
        sliced |= p->layers[il].cpu_sliced && yaml_layer(plan, il);
    if (sliced) {
        kt_text_put(&t, "  sliced: [");
        bool first = true;
        for (uint32_t il = 0; il < p->n_layer; il++) {
            if (!p->layers[il].cpu_sliced || !yaml_layer(plan, il))
                continue;
            uint32_t last = il;
            while (last + 1 < p->n_layer && p->layers[last + 1].cpu_sliced && yaml_layer(plan, last + 1))
                last++;
            if (last == il)
                kt_text_put(&t, "%s%u", first ? "" : ", ", il);
            else
                kt_text_put(&t, "%s%u-%u", first ? "" : ", ", il, last);
            first = false;
            il = last;
        }
        kt_text_put(&t, "]\n");
    }
    if (t.failed) {
        free(t.s);
        return NULL;
    }
    return t.s;
}


kt_status kt_plan_compare_layers(const struct kt_placement *a, const struct kt_placement *b, uint32_t begin,
                                 uint32_t end, kt_err *err)
{
    if (a->n_layer != b->n_layer || a->n_expert != b->n_expert)
        return kt_err_set(err, KT_ERR_INVALID, "%u layers x %u experts against %u x %u", a->n_layer, a->n_expert,
                          b->n_layer, b->n_expert);
    if (end == 0 || end > a->n_layer)
        end = a->n_layer;
    for (uint32_t il = begin; il < end; il++) {
        const struct kt_placement_layer *la = &a->layers[il], *lb = &b->layers[il];
        if (la->cpu_sliced != lb->cpu_sliced)
            return kt_err_set(err, KT_ERR_INVALID, "layer %u is %srow-sliced in one plan only", il,
                              la->cpu_sliced ? "" : "not ");
        if (la->attention != lb->attention || la->shared_experts != lb->shared_experts ||
            la->dense_ffn != lb->dense_ffn)
            return kt_err_set(err, KT_ERR_INVALID, "layer %u: attention, shared experts or dense FFN differ", il);
        if (!la->experts != !lb->experts)
            return kt_err_set(err, KT_ERR_INVALID, "layer %u has routed experts in one plan only", il);
        for (uint32_t x = 0; la->experts && x < a->n_expert; x++) {
            const struct kt_expert_home *ha = &la->experts[x], *hb = &lb->experts[x];
            if (ha->device != hb->device || (ha->device == 0 && ha->node != hb->node) ||
                ha->replica_nodes != hb->replica_nodes)
                return kt_err_set(err, KT_ERR_INVALID,
                                  "layer %u expert %u: device %d node %d replicas %#llx against device %d node %d "
                                  "replicas %#llx", il, x, ha->device, ha->node,
                                  (unsigned long long)ha->replica_nodes, hb->device, hb->node,
                                  (unsigned long long)hb->replica_nodes);
        }
    }
    if (a->embeddings != b->embeddings)
        return kt_err_set(err, KT_ERR_INVALID, "the embeddings are on different devices");
    return KT_OK;
}

kt_status kt_plan_compare(const struct kt_placement *a, const struct kt_placement *b, kt_err *err)
{
    return kt_plan_compare_layers(a, b, 0, 0, err);
}

kt_status kt_plan_check_yaml(const struct kt_plan *p, const char *text, size_t len, const char *name,
                             const struct kt_model *m, kt_err *err)
{
    struct kt_placement_config *c = NULL;
    struct kt_placement *back = NULL;
    kt_status st = kt_placement_config_parse(text, len, name, &c, err);
    if (!st)
        st = kt_placement_resolve(c, m, p->placement->n_nodes, NULL, &back, err);
    if (!st && (st = kt_plan_compare_layers(p->placement, back, p->layer_begin, p->layer_end, err)) != KT_OK)
        kt_err_prefix(err, "%s: the config does not give the plan back", name);
    kt_placement_destroy(back);
    kt_placement_config_destroy(c);
    if (st && st != KT_ERR_NOMEM)
        st = KT_ERR_FORMAT;
    if (err)
        err->status = st;
    return st;
}
