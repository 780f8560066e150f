/*
 * plan.c - resolves a placement config against a model (see plan.h).
 *
 * Per MoE layer the routed experts are handed out in four rounds, so the
 * result never depends on the order of keys in the file:
 *   1. explicit lists, of every device and node (an expert named twice is an error);
 *   2. counts, accelerators in the order of devices:, then cpu.assign nodes,
 *      each taking the hottest experts still free;
 *   3. 'all', at most one per layer, takes whatever is still free;
 *   4. the rest go to the CPU, spread over cpu.nodes: each node may hold its
 *      share of the layer's CPU experts (an equal split; the remainder to the
 *      nodes holding fewest so far), and hottest first each expert goes to the
 *      node under its share with the least routed load this layer.  Memory
 *      stays balanced to one expert, load as well as the shares allow.
 * A layer of cpu.sliced keeps these homes (they say where its bytes are
 * counted) but its CPU experts run row-sliced over every expert node, so it
 * takes no replicas.
 * It must never allocate anything sized by the config rather than the model.
 */
#include "plan.h"
#include "text.h"

#include "config_internal.h"
#include "engine.h"
#include "profile.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

static const double GIB = 1073741824.0;

const char *kt_place_backend_name(enum kt_place_backend b)
{
    switch (b) {
    case KT_PLACE_CPU: return "cpu";
    case KT_PLACE_CUDA: return "cuda";
    case KT_PLACE_SIM: return "sim";
    }
    return "?";
}

const char *kt_place_part_name(enum kt_place_part part)
{
    switch (part) {
    case KT_PART_ATTENTION: return "attention";
    case KT_PART_DENSE_FFN: return "dense FFN";
    case KT_PART_SHARED_EXPERTS: return "shared experts";
    case KT_PART_ROUTED_EXPERTS: return "routed experts";
    case KT_PART_REPLICAS: return "replicas";
    case KT_PART_EMBEDDINGS: return "embeddings";
    case KT_PART_KV_CACHE: return "KV cache";
    case KT_PART_WORK_BUFFERS: return "working buffers";
    case KT_PART_COUNT: break;
    }
    return "?";
}

void kt_placement_destroy(struct kt_placement *p)
{
    if (!p)
        return;
    if (p->layers)
        for (uint32_t il = 0; il < p->n_layer; il++)
            free(p->layers[il].experts);
    free(p->layers);
    free(p->devices);
    free(p->node_bytes);
    free(p->node_experts);
    free(p);
}

/* malloc'd copy of n bytes at src (NULL when src is); *ok false when memory ran out. */
static void *copy_of(const void *src, size_t n, bool *ok)
{
    if (!src)
        return NULL;
    void *d = malloc(n ? n : 1);
    if (!d)
        *ok = false;
    else
        memcpy(d, src, n);
    return d;
}

struct kt_placement *kt_placement_clone(const struct kt_placement *p)
{
    struct kt_placement *c = malloc(sizeof *c);
    if (!c)
        return NULL;
    *c = *p;
    bool ok = true;
    c->devices = copy_of(p->devices, (size_t)p->n_devices * sizeof *p->devices, &ok);
    c->node_bytes = copy_of(p->node_bytes, (size_t)p->n_nodes * sizeof *p->node_bytes, &ok);
    c->node_experts = copy_of(p->node_experts, (size_t)p->n_nodes * sizeof *p->node_experts, &ok);
    c->layers = calloc(p->n_layer ? p->n_layer : 1, sizeof *c->layers);
    ok = ok && c->layers;
    for (uint32_t il = 0; ok && il < p->n_layer; il++) {
        c->layers[il] = p->layers[il];
        c->layers[il].experts = copy_of(p->layers[il].experts, (size_t)p->n_expert * sizeof *p->layers[il].experts, &ok);
    }
    if (!ok) {
        if (!c->layers)
            c->n_layer = 0;
        kt_placement_destroy(c);
        return NULL;
    }
    return c;
}

const struct kt_expert_home *kt_placement_expert(const struct kt_placement *p, uint32_t il, uint32_t x)
{
    if (il >= p->n_layer || x >= p->n_expert || !p->layers[il].experts)
        return NULL;
    return &p->layers[il].experts[x];
}

/* ---- resolution state ------------------------------------------------------------ */

struct hot {
    double tokens;
    uint32_t x;
};

struct resolver {
    const struct kt_placement_config *c;
    const struct kt_model *m;
    struct kt_placement *p;
    struct kt_profile *profile;  /* NULL: hottest = lowest index */
    kt_err *err;
    int n_owners;                /* devices, then cpu.assign entries */
    int *claim;                  /* [n_expert] owner, -1 free (this layer) */
    const struct kt_expert_set **claimed_by; /* [n_expert] */
    struct hot *order;           /* [n_expert] this layer's experts, hottest first */
    uint32_t *node_layer_count;  /* [n_nodes] CPU experts on each node, this layer */
    uint32_t *node_share;        /* [n_nodes] how many of this layer's CPU experts each may hold */
    double *node_layer_tokens;   /* [n_nodes] their routed tokens */
};

static kt_status fail(struct resolver *r, const struct kt_cfg_where *w, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static kt_status fail(struct resolver *r, const struct kt_cfg_where *w, const char *fmt, ...)
{
    char what[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return kt_err_set(r->err, KT_ERR_FORMAT, "%s:%u:%u: %s: %s", r->c->name, w->line, w->col, w->path, what);
}

static const struct kt_expert_rules *owner_rules(const struct resolver *r, int owner)
{
    return owner < r->c->n_devices ? &r->c->devices[owner].experts : &r->c->assign[owner - r->c->n_devices].experts;
}

/* The set an owner's rules give layer il (a layers: entry beats per_layer). */
static const struct kt_expert_set *set_for_layer(const struct kt_expert_rules *rules, uint32_t il)
{
    for (uint32_t i = 0; i < rules->n_layer_rules; i++)
        if (rules->layer_rules[i].layers.first <= il && il <= rules->layer_rules[i].layers.last)
            return &rules->layer_rules[i].set;
    return &rules->per_layer;
}

static bool set_is_empty(const struct kt_expert_set *s)
{
    return s->kind == KT_SET_NONE || (s->kind == KT_SET_COUNT && s->count == 0) ||
           (s->kind == KT_SET_LIST && s->n_ranges == 0);
}

/* ---- checks against the model ---------------------------------------------------- */

static kt_status check_set(struct resolver *r, const struct kt_expert_set *s)
{
    uint32_t n_expert = r->m->hp.n_expert;
    if (s->kind == KT_SET_COUNT && s->count > n_expert)
        return fail(r, &s->where, "%u experts per layer, but the model has %u", s->count, n_expert);
    if (s->kind == KT_SET_LIST && s->n_ranges > 0 && s->ranges[s->n_ranges - 1].last >= n_expert)
        return fail(r, &s->where, "expert %u does not exist (the model has %u per layer)",
                    s->ranges[s->n_ranges - 1].last, n_expert);
    return KT_OK;
}

static kt_status check_rules(struct resolver *r, const struct kt_expert_rules *rules)
{
    const struct kt_hparams *hp = &r->m->hp;
    kt_status st = check_set(r, &rules->per_layer);
    for (uint32_t i = 0; i < rules->n_layer_rules && !st; i++) {
        const struct kt_layer_rule *lr = &rules->layer_rules[i];
        if (lr->layers.last >= hp->n_layer)
            return fail(r, &lr->set.where, "layer %u does not exist (the model has %u, 0-%u)", lr->layers.last,
                        hp->n_layer, hp->n_layer - 1);
        for (uint32_t il = lr->layers.first; il <= lr->layers.last && !set_is_empty(&lr->set); il++)
            if (!r->m->layers[il].is_moe)
                return fail(r, &lr->set.where,
                            "layer %u is dense: it has no routed experts (the first %u layers are dense)", il,
                            hp->n_dense_lead);
        st = check_set(r, &lr->set);
    }
    return st;
}

static kt_status check_nodes(struct resolver *r, int n_numa_nodes)
{
    const struct kt_placement_config *c = r->c;
    struct kt_placement *p = r->p;
    if (c->nodes_auto) {
        p->expert_nodes = n_numa_nodes == 64 ? ~0ull : (1ull << n_numa_nodes) - 1;
    } else {
        for (int i = 0; i < c->n_nodes; i++) {
            if (c->nodes[i] >= n_numa_nodes)
                return fail(r, &c->node_where[i], "NUMA node %d does not exist (this machine has %d)", c->nodes[i],
                            n_numa_nodes);
            p->expert_nodes |= 1ull << c->nodes[i];
        }
    }
    for (int a = 0; a < c->n_assign; a++)
        if (c->assign[a].node >= n_numa_nodes)
            return fail(r, &c->assign[a].where, "NUMA node %d does not exist (this machine has %d)",
                        c->assign[a].node, n_numa_nodes);
    return KT_OK;
}

static kt_status load_profile(struct resolver *r, const char *profile_override)
{
    const char *path = profile_override ? profile_override : r->c->profile;
    if (!path)
        return KT_OK;
    kt_status st = kt_profile_load(path, &r->profile, r->err);
    if (st == KT_OK && (r->profile->n_layer != r->m->hp.n_layer ||
                        (r->profile->n_expert != 0 && r->profile->n_expert != r->m->hp.n_expert)))
        st = kt_err_set(r->err, KT_ERR_FORMAT, "%s: a profile of %u layers x %u experts, but the model has %u x %u",
                        path, r->profile->n_layer, r->profile->n_expert, r->m->hp.n_layer, r->m->hp.n_expert);
    if (st && !profile_override)
        kt_err_prefix(r->err, "%s:%u:%u: profile", r->c->name, r->c->profile_where.line, r->c->profile_where.col);
    if (st == KT_OK)
        snprintf(r->p->profile, sizeof r->p->profile, "%s", path);
    return st;
}

/* ---- experts of one layer -------------------------------------------------------- */

static int hottest_first(const void *a, const void *b)
{
    const struct hot *x = a, *y = b;
    if (x->tokens != y->tokens)
        return x->tokens > y->tokens ? -1 : 1;
    return x->x < y->x ? -1 : x->x > y->x;
}

static void sort_by_heat(struct resolver *r, uint32_t il)
{
    uint32_t n = r->m->hp.n_expert;
    const struct kt_profile *prof = r->profile;
    for (uint32_t x = 0; x < n; x++) {
        r->order[x].x = x;
        r->order[x].tokens = prof && prof->n_expert ? kt_profile_count(prof, il, x) : 0;
    }
    qsort(r->order, n, sizeof *r->order, hottest_first);
}

static kt_status claim(struct resolver *r, uint32_t il, uint32_t x, int owner, const struct kt_expert_set *s)
{
    if (r->claim[x] >= 0)
        return fail(r, &s->where, "layer %u: expert %u is also placed by %s (line %u)", il, x,
                    r->claimed_by[x]->where.path, r->claimed_by[x]->where.line);
    r->claim[x] = owner;
    r->claimed_by[x] = s;
    return KT_OK;
}

/* Rounds 1-3 of the file comment. */
static kt_status claim_layer(struct resolver *r, uint32_t il)
{
    uint32_t n_expert = r->m->hp.n_expert;
    kt_status st = KT_OK;
    for (int o = 0; o < r->n_owners && !st; o++) {
        const struct kt_expert_set *s = set_for_layer(owner_rules(r, o), il);
        for (uint32_t i = 0; s->kind == KT_SET_LIST && i < s->n_ranges && !st; i++)
            for (uint32_t x = s->ranges[i].first; x <= s->ranges[i].last && !st; x++)
                st = claim(r, il, x, o, s);
    }
    for (int o = 0; o < r->n_owners && !st; o++) {
        const struct kt_expert_set *s = set_for_layer(owner_rules(r, o), il);
        uint32_t want = s->kind == KT_SET_COUNT ? s->count : 0, got = 0;
        for (uint32_t i = 0; i < n_expert && got < want; i++)
            if (r->claim[r->order[i].x] < 0) {
                r->claim[r->order[i].x] = o;
                r->claimed_by[r->order[i].x] = s;
                got++;
            }
        if (got < want)
            st = fail(r, &s->where, "layer %u: %u experts asked for, but only %u of its %u are left by the other rules",
                      il, want, got, n_expert);
    }
    const struct kt_expert_set *all = NULL;
    for (int o = 0; o < r->n_owners && !st; o++) {
        const struct kt_expert_set *s = set_for_layer(owner_rules(r, o), il);
        if (s->kind != KT_SET_ALL)
            continue;
        if (all)
            return fail(r, &s->where, "layer %u: %s (line %u) already takes all the rest", il, all->where.path,
                        all->where.line);
        all = s;
        for (uint32_t x = 0; x < n_expert; x++)
            if (r->claim[x] < 0) {
                r->claim[x] = o;
                r->claimed_by[x] = s;
            }
    }
    return st;
}

/* The node that takes the next spread expert (round 4). */
/* Each spread node's share of the layer's n_cpu CPU experts: n_cpu / k, and one
 * more for the n_cpu % k nodes holding the fewest experts so far, so the odd
 * ones rotate over the layers. */
static void set_shares(struct resolver *r, uint32_t n_cpu)
{
    const struct kt_placement *p = r->p;
    uint32_t k = (uint32_t)__builtin_popcountll(p->expert_nodes), base = n_cpu / k;
    for (int n = 0; n < p->n_nodes; n++)
        r->node_share[n] = p->expert_nodes >> n & 1 ? base : 0;
    for (uint32_t extra = n_cpu % k; extra > 0; extra--) {
        int best = -1;
        for (int n = 0; n < p->n_nodes; n++)
            if (p->expert_nodes >> n & 1 && r->node_share[n] == base &&
                (best < 0 || p->node_experts[n] < p->node_experts[best]))
                best = n;
        r->node_share[best]++;
    }
}

/* The node under its share with the least routed load this layer (then the
 * fewest experts, then the lowest number). */
static int pick_node(const struct resolver *r)
{
    const struct kt_placement *p = r->p;
    int best = -1;
    for (int n = 0; n < p->n_nodes; n++) {
        if (r->node_layer_count[n] >= r->node_share[n])
            continue;
        if (best < 0 || r->node_layer_tokens[n] < r->node_layer_tokens[best] ||
            (r->node_layer_tokens[n] == r->node_layer_tokens[best] &&
             r->node_layer_count[n] < r->node_layer_count[best]))
            best = n;
    }
    return best;
}

static void home_layer(struct resolver *r, uint32_t il)
{
    struct kt_placement *p = r->p;
    const struct kt_placement_config *c = r->c;
    uint32_t n_expert = r->m->hp.n_expert, n_cpu = 0;
    struct kt_expert_home *homes = p->layers[il].experts;
    memset(r->node_layer_count, 0, (size_t)p->n_nodes * sizeof *r->node_layer_count);
    memset(r->node_layer_tokens, 0, (size_t)p->n_nodes * sizeof *r->node_layer_tokens);
    for (uint32_t i = 0; i < n_expert; i++) {
        uint32_t x = r->order[i].x;
        int o = r->claim[x];
        homes[x] = (struct kt_expert_home){.device = 0, .node = -1};
        if (o > 0 && o < c->n_devices) {
            homes[x].device = o;
            continue;
        }
        n_cpu++;
        if (o >= c->n_devices) {
            homes[x].node = c->assign[o - c->n_devices].node;
            r->node_layer_count[homes[x].node]++;
            r->node_layer_tokens[homes[x].node] += r->order[i].tokens;
        }
    }
    set_shares(r, n_cpu);
    for (uint32_t i = 0; i < n_expert; i++) {
        uint32_t x = r->order[i].x;
        if (homes[x].device != 0 || homes[x].node >= 0)
            continue;
        int n = pick_node(r); /* the shares add up to the CPU experts, so one is found */
        if (n < 0)
            n = __builtin_ctzll(p->expert_nodes);
        homes[x].node = n;
        r->node_layer_count[n]++;
        r->node_layer_tokens[n] += r->order[i].tokens;
        p->node_experts[n]++;
    }
    for (uint32_t x = 0; x < n_expert; x++)
        if (homes[x].device == 0 && r->claim[x] >= c->n_devices)
            p->node_experts[homes[x].node]++;
    /* a sliced layer takes none: every node already holds a share of every expert */
    uint32_t replicas =
        __builtin_popcountll(p->expert_nodes) > 1 && !p->layers[il].cpu_sliced ? c->replicas_hot_per_layer : 0;
    for (uint32_t i = 0; i < n_expert && replicas > 0; i++) {
        struct kt_expert_home *h = &homes[r->order[i].x];
        if (h->device == 0) {
            h->replica_nodes = p->expert_nodes & ~(1ull << h->node);
            replicas--;
        }
    }
}

/* ---- bytes ----------------------------------------------------------------------- */

static uint64_t bytes_of(const struct kt_gguf_tensor *t)
{
    return t ? t->nbytes : 0;
}

static void count_bytes(struct kt_placement *p, const struct kt_model *m)
{
    struct kt_memory_need need = kt_model_memory_need(m, -1, p->kv_tokens, p->kv_bytes_per_value);
    uint64_t kv_per_layer = need.kv_cache_bytes / m->hp.n_layer;
    struct kt_placement_device *d = p->devices;
    /* a stage holds its layers alone, and the embeddings and head when it starts at 0 */
    const uint32_t begin = p->stage_end ? p->stage_begin : 0;
    const uint32_t end = p->stage_end && p->stage_end < p->n_layer ? p->stage_end : p->n_layer;
    /* the homing counted every layer's experts per node as it went: from here, those held */
    memset(p->node_experts, 0, (size_t)p->n_nodes * sizeof *p->node_experts);
    if (begin == 0)
        d[p->embeddings].part_bytes[KT_PART_EMBEDDINGS] +=
            bytes_of(m->token_embd) + bytes_of(m->output_norm) + (m->output_tied ? 0 : bytes_of(m->output));
    for (uint32_t il = begin; il < end; il++) {
        const struct kt_layer *L = &m->layers[il];
        const struct kt_placement_layer *pl = &p->layers[il];
        const struct kt_gguf_tensor *attn[] = {L->attn_norm, L->attn_q_a, L->attn_q_a_norm, L->attn_q_b,
                                               L->attn_q, L->attn_kv_a_mqa, L->attn_kv_a_norm, L->attn_k_b,
                                               L->attn_v_b, L->attn_kv_b, L->attn_output, L->ffn_norm,
                                               L->ffn_gate_inp, L->exp_probs_b};
        for (size_t i = 0; i < sizeof attn / sizeof attn[0]; i++)
            d[pl->attention].part_bytes[KT_PART_ATTENTION] += bytes_of(attn[i]);
        d[pl->attention].part_bytes[KT_PART_KV_CACHE] += kv_per_layer;
        if (pl->dense_ffn >= 0)
            d[pl->dense_ffn].part_bytes[KT_PART_DENSE_FFN] +=
                bytes_of(L->ffn_gate) + bytes_of(L->ffn_up) + bytes_of(L->ffn_down);
        if (pl->shared_experts >= 0)
            d[pl->shared_experts].part_bytes[KT_PART_SHARED_EXPERTS] +=
                bytes_of(L->ffn_gate_shexp) + bytes_of(L->ffn_up_shexp) + bytes_of(L->ffn_down_shexp);
        uint64_t expert_bytes = kt_layer_expert_bytes(m, il);
        for (uint32_t x = 0; pl->experts && x < p->n_expert; x++) {
            const struct kt_expert_home *h = &pl->experts[x];
            int copies = __builtin_popcountll(h->replica_nodes);
            d[h->device].part_bytes[KT_PART_ROUTED_EXPERTS] += expert_bytes;
            d[h->device].n_experts++;
            d[0].part_bytes[KT_PART_REPLICAS] += (uint64_t)copies * expert_bytes;
            if (h->device == 0) {
                p->node_bytes[h->node] += expert_bytes;
                p->node_experts[h->node]++;
            }
            for (int n = 0; n < p->n_nodes; n++)
                if (h->replica_nodes >> n & 1)
                    p->node_bytes[n] += expert_bytes;
        }
    }
    /* an accelerator that holds anything also holds the engine's working buffers */
    for (int i = 1; i < p->n_devices; i++) {
        uint64_t held = 0;
        for (int part = 0; part < KT_PART_COUNT; part++)
            held += d[i].part_bytes[part];
        if (!held)
            continue;
        struct kt_engine_params ep = {.n_ctx = p->kv_tokens, .kv_type = p->kv_type,
                                      .attention_on_device = begin < end && p->layers[begin].attention == i,
                                      .output_on_device = begin == 0 && p->embeddings == i};
        d[i].part_bytes[KT_PART_WORK_BUFFERS] = kt_engine_device_work_bytes(m, &ep, d[i].backend == KT_PLACE_CUDA);
    }
    for (int i = 0; i < p->n_devices; i++)
        for (int part = 0; part < KT_PART_COUNT; part++)
            d[i].bytes += d[i].part_bytes[part];
}

static void parts_text(const struct kt_placement_device *d, char *out, size_t cap)
{
    size_t used = 0;
    out[0] = 0;
    for (int part = 0; part < KT_PART_COUNT && used < cap; part++) {
        char b[32];
        if (!d->part_bytes[part])
            continue;
        int n = snprintf(out + used, cap - used, "%s%s %s", used ? ", " : "", kt_place_part_name(part),
                         kt_text_bytes(d->part_bytes[part], b, sizeof b));
        used += n > 0 ? (size_t)n : 0;
    }
}

static kt_status check_budgets(struct resolver *r)
{
    const struct kt_placement *p = r->p;
    for (int i = 1; i < p->n_devices; i++) {
        const struct kt_placement_device *d = &p->devices[i];
        if (d->bytes <= d->budget_bytes)
            continue;
        char need[32], parts[512];
        parts_text(d, parts, sizeof parts);
        return fail(r, &r->c->devices[i].where,
                    "the plan needs %s on '%s' but memory_gib is %g (%s; %u routed experts; KV cache for %u tokens)",
                    kt_text_bytes(d->bytes, need, sizeof need), d->name, r->c->devices[i].memory_gib, parts, d->n_experts,
                    p->kv_tokens);
    }
    return KT_OK;
}

/* ---- entry point ----------------------------------------------------------------- */

static kt_status alloc_plan(struct resolver *r, int n_numa_nodes)
{
    const struct kt_model *m = r->m;
    struct kt_placement *p = calloc(1, sizeof *p);
    r->p = p;
    if (!p)
        return kt_err_set(r->err, KT_ERR_NOMEM, "out of memory for a placement plan");
    uint32_t n_expert = m->hp.n_expert;
    p->n_layer = m->hp.n_layer;
    p->n_expert = n_expert;
    p->n_nodes = n_numa_nodes;
    p->n_devices = r->c->n_devices;
    p->devices = calloc((size_t)p->n_devices, sizeof *p->devices);
    p->layers = calloc(p->n_layer, sizeof *p->layers);
    p->node_bytes = calloc((size_t)n_numa_nodes, sizeof *p->node_bytes);
    p->node_experts = calloc((size_t)n_numa_nodes, sizeof *p->node_experts);
    r->claim = malloc((n_expert ? n_expert : 1) * sizeof *r->claim);
    r->claimed_by = malloc((n_expert ? n_expert : 1) * sizeof *r->claimed_by);
    r->order = malloc((n_expert ? n_expert : 1) * sizeof *r->order);
    r->node_layer_count = calloc((size_t)n_numa_nodes, sizeof *r->node_layer_count);
    r->node_share = calloc((size_t)n_numa_nodes, sizeof *r->node_share);
    r->node_layer_tokens = calloc((size_t)n_numa_nodes, sizeof *r->node_layer_tokens);
    bool ok = p->devices && p->layers && p->node_bytes && p->node_experts && r->claim && r->claimed_by && r->order &&
              r->node_layer_count && r->node_layer_tokens && r->node_share;
    for (uint32_t il = 0; ok && il < p->n_layer; il++)
        if (m->layers[il].is_moe && n_expert)
            ok = (p->layers[il].experts = calloc(n_expert, sizeof *p->layers[il].experts)) != NULL;
    return ok ? KT_OK : kt_err_set(r->err, KT_ERR_NOMEM, "out of memory for a placement plan");
}

static void fill_devices(struct resolver *r)
{
    const struct kt_placement_config *c = r->c;
    struct kt_placement *p = r->p;
    snprintf(p->source, sizeof p->source, "%s", c->name);
    p->kv_tokens = c->kv_tokens;
    p->kv_bytes_per_value = c->kv_bytes_per_value;
    p->kv_type = c->kv_type;
    p->kv_type_given = c->kv_type_given;
    p->stage_begin = c->stage_begin;
    p->stage_end = c->stage_end;
    for (int i = 0; i < c->n_devices; i++) {
        struct kt_placement_device *d = &p->devices[i];
        const struct kt_cfg_device *cd = &c->devices[i];
        memcpy(d->name, cd->name, sizeof d->name);
        d->backend = cd->backend;
        d->cuda_device = cd->cuda_device;
        d->transfer_gbps = cd->transfer_gbps;
        d->latency_us = cd->latency_us;
        d->budget_bytes = (uint64_t)(cd->memory_gib * GIB);
    }
    int attention = c->attention.device;
    p->embeddings = c->embeddings.device >= 0 ? c->embeddings.device : attention;
    for (uint32_t il = 0; il < p->n_layer; il++) {
        struct kt_placement_layer *pl = &p->layers[il];
        pl->is_moe = r->m->layers[il].is_moe;
        pl->attention = attention;
        pl->dense_ffn = pl->is_moe ? -1 : c->dense_layers.device >= 0 ? c->dense_layers.device : attention;
        pl->shared_experts = !pl->is_moe || r->m->hp.n_expert_shared == 0 ? -1
                             : c->shared_experts.device >= 0      ? c->shared_experts.device
                                                                  : attention;
    }
}

/* cpu.sliced: which MoE layers have their CPU experts row-sliced. */
static kt_status mark_sliced(struct resolver *r)
{
    const struct kt_cfg_sliced *s = &r->c->sliced;
    struct kt_placement *p = r->p;
    const struct kt_hparams *hp = &r->m->hp;
    for (uint32_t i = 0; i < s->n_ranges; i++) {
        if (s->ranges[i].last >= hp->n_layer)
            return fail(r, &s->where[i], "layer %u does not exist (the model has %u, 0-%u)", s->ranges[i].last,
                        hp->n_layer, hp->n_layer - 1);
        for (uint32_t il = s->ranges[i].first; il <= s->ranges[i].last; il++) {
            if (!p->layers[il].is_moe)
                return fail(r, &s->where[i],
                            "layer %u is dense: it has no routed experts to slice (the first %u layers are dense)",
                            il, hp->n_dense_lead);
            p->layers[il].cpu_sliced = true;
        }
    }
    for (uint32_t il = 0; s->all && il < p->n_layer; il++)
        p->layers[il].cpu_sliced = p->layers[il].is_moe;
    return KT_OK;
}

kt_status kt_placement_resolve(const struct kt_placement_config *c, const struct kt_model *m, int n_numa_nodes,
                               const char *profile_override, struct kt_placement **out, kt_err *err)
{
    *out = NULL;
    if (n_numa_nodes < 1 || n_numa_nodes > KT_PLACEMENT_MAX_NODES)
        return kt_err_set(err, KT_ERR_INVALID, "placement: %d NUMA nodes (kt handles 1 to %d)", n_numa_nodes,
                          KT_PLACEMENT_MAX_NODES);
    if (m->hp.n_layer == 0)
        return kt_err_set(err, KT_ERR_INVALID, "placement: the model has no layers");
    if (c->stage_end && (c->stage_begin >= c->stage_end || c->stage_end > m->hp.n_layer))
        return kt_err_set(err, KT_ERR_FORMAT, "%s: a rank's placement for layers %u-%u, of a model of %u layers",
                          c->name, c->stage_begin, c->stage_end - 1, m->hp.n_layer);
    struct resolver r = {.c = c, .m = m, .err = err, .n_owners = c->n_devices + c->n_assign};
    kt_status st = alloc_plan(&r, n_numa_nodes);
    if (!st)
        st = load_profile(&r, profile_override);
    if (!st)
        st = check_nodes(&r, n_numa_nodes);
    for (int o = 0; o < r.n_owners && !st; o++)
        st = check_rules(&r, owner_rules(&r, o));
    if (!st)
        fill_devices(&r);
    if (!st)
        st = mark_sliced(&r);
    for (uint32_t il = 0; il < m->hp.n_layer && !st; il++) {
        if (!r.p->layers[il].experts)
            continue;
        sort_by_heat(&r, il);
        memset(r.claim, 0xff, m->hp.n_expert * sizeof *r.claim);
        if (!(st = claim_layer(&r, il)))
            home_layer(&r, il);
    }
    if (!st) {
        count_bytes(r.p, m);
        st = check_budgets(&r);
    }
    free(r.claim);
    free(r.claimed_by);
    free(r.order);
    free(r.node_layer_count);
    free(r.node_share);
    free(r.node_layer_tokens);
    kt_profile_destroy(r.profile);
    if (st) {
        kt_placement_destroy(r.p);
        return st;
    }
    *out = r.p;
    return KT_OK;
}

/* ---- description ----------------------------------------------------------------- */

enum layer_part { LP_ATTENTION, LP_DENSE, LP_SHARED, LP_SLICED };

static int layer_device(const struct kt_placement_layer *pl, enum layer_part which)
{
    if (which == LP_SLICED) /* the cpu's, when its experts are row-sliced */
        return pl->cpu_sliced ? 0 : -1;
    return which == LP_ATTENTION ? pl->attention : which == LP_DENSE ? pl->dense_ffn : pl->shared_experts;
}

/* The layers a placement holds: its stage's, or every layer. */
static void held_layers(const struct kt_placement *p, uint32_t *begin, uint32_t *end)
{
    *begin = p->stage_end ? p->stage_begin : 0;
    *end = p->stage_end && p->stage_end < p->n_layer ? p->stage_end : p->n_layer;
}

/* The layers (of those held) whose `which` is on device, as runs: "0-3" or "1, 5-60"; "" when none. */
static void layer_runs(const struct kt_placement *p, int device, enum layer_part which, char *out, size_t cap)
{
    size_t used = 0;
    uint32_t begin, end;
    held_layers(p, &begin, &end);
    out[0] = 0;
    for (uint32_t il = begin; il < end && used < cap; il++) {
        if (layer_device(&p->layers[il], which) != device)
            continue;
        uint32_t last = il;
        while (last + 1 < end && layer_device(&p->layers[last + 1], which) == device)
            last++;
        int n = last == il ? snprintf(out + used, cap - used, "%s%u", used ? ", " : "", il)
                           : snprintf(out + used, cap - used, "%s%u-%u", used ? ", " : "", il, last);
        used += n > 0 ? (size_t)n : 0;
        il = last;
    }
}

static void describe(const struct kt_placement *p, FILE *out)
{
    static const char *const part_names[] = {"attention", "dense FFN", "shared experts"};
    uint32_t n_moe = 0;
    for (uint32_t il = 0; il < p->n_layer; il++)
        n_moe += p->layers[il].is_moe;
    fprintf(out, "placement %s: %u layers (%u dense, %u MoE) of %u routed experts; hot experts by %s%s; "
                 "KV cache for %u tokens (%s)\n",
            p->source, p->n_layer, p->n_layer - n_moe, n_moe, p->n_expert, p->profile[0] ? "profile " : "index",
            p->profile, p->kv_tokens, kt_row_type_name(p->kv_type));
    uint32_t begin, end;
    held_layers(p, &begin, &end);
    if (p->stage_end) /* a rank's stage: what follows counts its layers alone */
        fprintf(out, "  a pipeline stage: layers %u-%u held\n", begin, end - 1);
    for (int i = 0; i < p->n_devices; i++) {
        const struct kt_placement_device *d = &p->devices[i];
        char a[32], b[32], runs[512], parts[512];
        fprintf(out, "  %s (%s", d->name, kt_place_backend_name(d->backend));
        if (d->backend == KT_PLACE_CUDA)
            fprintf(out, " device %d", d->cuda_device);
        if (d->backend == KT_PLACE_SIM)
            fprintf(out, ", %g GB/s, %g us", d->transfer_gbps, d->latency_us);
        fprintf(out, "): %s", kt_text_bytes(d->bytes, a, sizeof a));
        if (d->budget_bytes)
            fprintf(out, " of %s (%.0f%%)", kt_text_bytes(d->budget_bytes, b, sizeof b),
                    100.0 * (double)d->bytes / (double)d->budget_bytes);
        fputc('\n', out);
        for (int which = LP_ATTENTION; which <= LP_SHARED; which++) {
            layer_runs(p, i, which, runs, sizeof runs);
            if (runs[0])
                fprintf(out, "    %s: layers %s\n", part_names[which], runs);
        }
        if (p->embeddings == i && begin == 0)
            fprintf(out, "    embeddings and output\n");
        if (d->n_experts) {
            uint32_t lo = UINT32_MAX, hi = 0;
            for (uint32_t il = begin; il < end; il++) {
                uint32_t n = 0;
                for (uint32_t x = 0; p->layers[il].experts && x < p->n_expert; x++)
                    n += p->layers[il].experts[x].device == i;
                if (p->layers[il].is_moe) {
                    lo = n < lo ? n : lo;
                    hi = n > hi ? n : hi;
                }
            }
            if (lo == hi)
                fprintf(out, "    routed experts: %u (%u per MoE layer)\n", d->n_experts, lo);
            else
                fprintf(out, "    routed experts: %u (%u to %u per MoE layer)\n", d->n_experts, lo, hi);
        }
        parts_text(d, parts, sizeof parts);
        if (parts[0])
            fprintf(out, "    bytes: %s\n", parts);
    }
    if (!p->devices[0].n_experts)
        return;
    fprintf(out, "  NUMA nodes:");
    for (int n = 0; n < p->n_nodes; n++) {
        char a[32];
        const uint32_t homed = p->node_experts[n]; /* of the layers held */
        if (p->expert_nodes >> n & 1 || homed)
            fprintf(out, " %d: %u experts, %s;", n, homed, kt_text_bytes(p->node_bytes[n], a, sizeof a));
    }
    uint32_t replicated = 0;
    for (uint32_t il = begin; il < end; il++)
        for (uint32_t x = 0; p->layers[il].experts && x < p->n_expert; x++)
            replicated += p->layers[il].experts[x].replica_nodes != 0;
    fprintf(out, " %u experts replicated\n", replicated);
    char runs[512], nodes[256] = "";
    layer_runs(p, 0, LP_SLICED, runs, sizeof runs);
    for (int n = 0; runs[0] && n < p->n_nodes; n++)
        if (p->expert_nodes >> n & 1)
            snprintf(nodes + strlen(nodes), sizeof nodes - strlen(nodes), "%s%d", nodes[0] ? ", " : "", n);
    if (runs[0])
        fprintf(out, "  row-sliced CPU experts: layers %s, each expert's rows split over nodes %s\n", runs, nodes);
}

/* The text is made first and written with one call: on an unbuffered stderr
 * that several MPI ranks share, line by line it interleaved with theirs. */
void kt_placement_describe(const struct kt_placement *p, FILE *out)
{
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f) { /* out of memory: line by line */
        describe(p, out);
        return;
    }
    describe(p, f);
    if (fclose(f) == 0)
        fwrite(text, 1, len, out);
    free(text);
}
