/*
 * rebalance.c - the rebalancer's choice of moves (rebalance.h).
 *
 * A greedy pass over the pending moves (experts whose home differs from the
 * target's, once the hysteresis lets the step move): each round it takes the
 * pending move, or the swap of a move onto a device with one off it, with
 * the best predicted gain per byte that fits the bytes left, applies it to
 * the working homes and goes on until nothing gains or fits.  Replica drops
 * the target makes are applied first; replica adds are candidates like the
 * homes.  A candidate's
 * gain alone is cached with its layer's version and computed again only
 * after that layer changed; a swap's is computed when weighed.
 */
#include "rebalance.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

struct candidate {
    uint32_t layer, expert;
    enum kt_move_kind kind;
    int node;                    /* a replica's node */
    bool done;
    double gain_s;               /* alone, on the working homes */
    uint32_t version;            /* of its layer when gain_s was computed */
};

struct state {
    const struct kt_cost_model *c;
    const struct kt_model *m;
    const struct kt_placement *cur, *target;
    struct kt_cost_query q;
    struct kt_expert_home *homes;  /* [n_layer * n_expert]: the working homes */
    bool *sliced;                  /* [n_layer]: the working row-sliced flags */
    uint32_t *version;             /* [n_layer] */
    double *layer_s;               /* [n_layer]: the working homes' time, at version */
    struct candidate *cand;
    uint32_t n_cand;
    uint64_t free_bytes[KT_PLACEMENT_MAX_DEVICES];
};

static struct kt_expert_home *home_of(struct state *s, uint32_t il, uint32_t x)
{
    return &s->homes[(size_t)il * s->cur->n_expert + x];
}

static double layer_time(struct state *s, uint32_t il)
{
    return kt_cost_layer(s->c, s->cur, il, home_of(s, il, 0), s->sliced[il], &s->q, NULL);
}

static bool same_home(const struct kt_expert_home *a, const struct kt_expert_home *b)
{
    return a->device == b->device && (a->device > 0 || a->node == b->node);
}

static double sliced_time(struct state *s, uint32_t il);
static double whole_time(struct state *s, uint32_t il);

/* The target's home of candidate k, keeping the working replica set (changed only by replica moves). */
static struct kt_expert_home target_home(struct state *s, const struct candidate *k)
{
    if (k->kind != KT_MOVE_HOME) {
        struct kt_expert_home h = *home_of(s, k->layer, k->expert);
        if (k->kind == KT_MOVE_LAYER_SLICE || k->kind == KT_MOVE_LAYER_WHOLE) /* a layer's: no device, no pairing */
            return (struct kt_expert_home){.device = 0, .node = h.device == 0 ? h.node : 0};
        if (k->kind == KT_MOVE_REPLICA_ADD)
            h.replica_nodes |= 1ull << k->node;
        else
            h.replica_nodes &= ~(1ull << k->node);
        return h;
    }
    struct kt_expert_home h = *kt_placement_expert(s->target, k->layer, k->expert);
    h.replica_nodes = home_of(s, k->layer, k->expert)->replica_nodes;
    if (h.device > 0)
        h.replica_nodes = 0;
    return h;
}

/* Time saved by moving candidates a (and b, when not NULL) to their targets. */
static double gain_of(struct state *s, const struct candidate *a, const struct candidate *b)
{
    if (a->kind == KT_MOVE_LAYER_SLICE) /* never paired */
        return s->layer_s[a->layer] - sliced_time(s, a->layer);
    if (a->kind == KT_MOVE_LAYER_WHOLE)
        return s->layer_s[a->layer] - whole_time(s, a->layer);
    const struct candidate *k[2] = {a, b};
    struct kt_expert_home saved[2];
    for (int i = 0; i < 2 && k[i]; i++) {
        saved[i] = *home_of(s, k[i]->layer, k[i]->expert);
        *home_of(s, k[i]->layer, k[i]->expert) = target_home(s, k[i]);
    }
    double gain = s->layer_s[a->layer] - layer_time(s, a->layer);
    if (b && b->layer != a->layer)
        gain += s->layer_s[b->layer] - layer_time(s, b->layer);
    for (int i = 1; i >= 0; i--)
        if (k[i])
            *home_of(s, k[i]->layer, k[i]->expert) = saved[i];
    return gain;
}

/* Layer il's time row-sliced, its replicas gone (the working homes kept). */
static double sliced_time(struct state *s, uint32_t il)
{
    const uint32_t N = s->cur->n_expert;
    uint64_t *saved = malloc(N * sizeof *saved);
    if (!saved)
        return s->layer_s[il]; /* out of memory: no gain, so no move */
    for (uint32_t x = 0; x < N; x++)
        saved[x] = home_of(s, il, x)->replica_nodes, home_of(s, il, x)->replica_nodes = 0;
    s->sliced[il] = true;
    const double t = layer_time(s, il);
    s->sliced[il] = false;
    for (uint32_t x = 0; x < N; x++)
        home_of(s, il, x)->replica_nodes = saved[x];
    free(saved);
    return t;
}

/* Layer il made whole: every CPU expert on its target node (one on the
 * device, or going there, keeps its working home), no replicas. */
static void make_whole(struct state *s, uint32_t il)
{
    for (uint32_t x = 0; x < s->cur->n_expert; x++) {
        struct kt_expert_home *h = home_of(s, il, x);
        const struct kt_expert_home *t = kt_placement_expert(s->target, il, x);
        h->replica_nodes = 0;
        if (h->device == 0)
            h->node = t->device == 0 && t->node >= 0 ? t->node : h->node;
    }
    s->sliced[il] = false;
}

/* Layer il's time made whole (the working homes kept). */
static double whole_time(struct state *s, uint32_t il)
{
    const uint32_t N = s->cur->n_expert;
    struct kt_expert_home *saved = malloc(N * sizeof *saved);
    if (!saved)
        return s->layer_s[il]; /* out of memory: no gain, so no move */
    memcpy(saved, home_of(s, il, 0), N * sizeof *saved);
    make_whole(s, il);
    const double t = layer_time(s, il);
    memcpy(home_of(s, il, 0), saved, N * sizeof *saved);
    s->sliced[il] = true;
    free(saved);
    return t;
}

/* Layer k->layer's time with candidate k made (the working homes kept). */
static double layer_time_with(struct state *s, const struct candidate *k)
{
    struct kt_expert_home *h = home_of(s, k->layer, k->expert), saved = *h;
    *h = target_home(s, k);
    const double t = layer_time(s, k->layer);
    *h = saved;
    return t;
}

/* Room for one more candidate beyond the one per expert (replica candidates); false out of memory. */
static bool grow_candidates(struct state *s, size_t *cap)
{
    if (s->n_cand < *cap)
        return true;
    struct candidate *c = realloc(s->cand, 2 * *cap * sizeof *c);
    if (!c)
        return false;
    s->cand = c, *cap *= 2;
    return true;
}

static double cached_gain(struct state *s, struct candidate *k)
{
    if (k->version != s->version[k->layer]) {
        k->gain_s = gain_of(s, k, NULL);
        k->version = s->version[k->layer];
    }
    return k->gain_s;
}

static void apply(struct state *s, struct candidate *k)
{
    if (k->kind == KT_MOVE_LAYER_WHOLE) {
        make_whole(s, k->layer);
        k->done = true;
        s->version[k->layer]++;
        s->layer_s[k->layer] = layer_time(s, k->layer);
        return;
    }
    if (k->kind == KT_MOVE_LAYER_SLICE) {
        for (uint32_t x = 0; x < s->cur->n_expert; x++)
            home_of(s, k->layer, x)->replica_nodes = 0;
        s->sliced[k->layer] = true;
        k->done = true;
        s->version[k->layer]++;
        s->layer_s[k->layer] = layer_time(s, k->layer);
        return;
    }
    const struct kt_expert_home from = *home_of(s, k->layer, k->expert), to = target_home(s, k);
    const uint64_t eb = k->kind == KT_MOVE_HOME ? kt_layer_expert_bytes(s->m, k->layer) : 0; /* device bytes */
    if (from.device > 0)
        s->free_bytes[from.device] += eb;
    if (to.device > 0)
        s->free_bytes[to.device] -= eb;
    *home_of(s, k->layer, k->expert) = to;
    k->done = true;
    s->version[k->layer]++;
    s->layer_s[k->layer] = layer_time(s, k->layer);
}

/* Bytes a candidate copies: an expert, none for a drop, every expert of the layer for a slice. */
static uint64_t candidate_bytes(const struct state *s, const struct candidate *k)
{
    const uint64_t eb = kt_layer_expert_bytes(s->m, k->layer);
    return k->kind == KT_MOVE_REPLICA_DROP                                        ? 0
           : k->kind == KT_MOVE_LAYER_SLICE || k->kind == KT_MOVE_LAYER_WHOLE ? eb * s->cur->n_expert
                                                                                : eb;
}

static kt_status add_move(struct kt_rebalance *r, uint32_t *cap, struct state *s, struct candidate *k, double gain,
                          int32_t paired_with, kt_err *err)
{
    if (r->n_moves == *cap) {
        const uint32_t n = *cap ? 2 * *cap : 16;
        struct kt_move *mv = realloc(r->moves, n * sizeof *mv);
        if (!mv)
            return kt_err_set(err, KT_ERR_NOMEM, "rebalance: out of memory");
        r->moves = mv, *cap = n;
    }
    const uint64_t eb = candidate_bytes(s, k);
    r->moves[r->n_moves++] = (struct kt_move){k->kind,
                                              k->node,
                                              k->layer,
                                              k->expert,
                                              *home_of(s, k->layer, k->expert),
                                              target_home(s, k),
                                              eb,
                                              gain,
                                              paired_with};
    r->bytes += eb;
    return KT_OK;
}

static kt_status check_shapes(const struct kt_placement *a, const struct kt_placement *b, kt_err *err)
{
    if (a->n_layer != b->n_layer || a->n_expert != b->n_expert || a->n_devices != b->n_devices ||
        a->n_nodes != b->n_nodes)
        return kt_err_set(err, KT_ERR_INVALID,
                          "rebalance: the target plan (%u layers x %u experts, %d devices, %d nodes) is not of the "
                          "placement served (%u x %u, %d devices, %d nodes)",
                          b->n_layer, b->n_expert, b->n_devices, b->n_nodes, a->n_layer, a->n_expert, a->n_devices,
                          a->n_nodes);
    for (uint32_t il = 0; il < a->n_layer; il++)
        if ((a->layers[il].experts == NULL) != (b->layers[il].experts == NULL))
            return kt_err_set(err, KT_ERR_INVALID, "rebalance: layer %u is a MoE layer in one placement only", il);
    return KT_OK;
}

kt_status kt_rebalance_plan(const struct kt_cost_model *c, const struct kt_model *m, const struct kt_placement *cur,
                            const struct kt_placement *target, const struct kt_rebalance_params *rp,
                            struct kt_rebalance *out, kt_err *err)
{
    memset(out, 0, sizeof *out);
    kt_status st = check_shapes(cur, target, err);
    if (st)
        return st;
    const uint32_t L = cur->n_layer, N = cur->n_expert;
    struct state s = {.c = c, .m = m, .cur = cur, .target = target, .q = rp->query};
    s.homes = calloc((size_t)L * (N ? N : 1), sizeof *s.homes);
    s.version = calloc(L ? L : 1, sizeof *s.version);
    s.layer_s = calloc(L ? L : 1, sizeof *s.layer_s);
    s.sliced = calloc(L ? L : 1, sizeof *s.sliced);
    size_t cand_cap = (size_t)L * (N ? N : 1);
    s.cand = calloc(cand_cap, sizeof *s.cand);
    uint32_t cap = 0;
    if (!s.homes || !s.version || !s.layer_s || !s.cand || !s.sliced) {
        st = kt_err_set(err, KT_ERR_NOMEM, "rebalance: out of memory");
        goto done;
    }
    for (int d = 1; d < cur->n_devices && d < KT_PLACEMENT_MAX_DEVICES; d++) {
        const struct kt_placement_device *dev = &cur->devices[d];
        s.free_bytes[d] = dev->budget_bytes == 0 ? UINT64_MAX / 2
                          : dev->budget_bytes > dev->bytes ? dev->budget_bytes - dev->bytes
                                                           : 0;
    }
    double target_s = 0.0;
    for (uint32_t il = 0; il < L; il++) {
        if (!cur->layers[il].experts)
            continue;
        memcpy(home_of(&s, il, 0), cur->layers[il].experts, N * sizeof *s.homes);
        s.sliced[il] = cur->layers[il].cpu_sliced;
        s.layer_s[il] = layer_time(&s, il);
        out->before_s += s.layer_s[il];
        /* a layer sliced or made whole is one move of the whole layer */
        const bool slice = !cur->layers[il].cpu_sliced && target->layers[il].cpu_sliced;
        const bool whole = cur->layers[il].cpu_sliced && !target->layers[il].cpu_sliced;
        const bool to_sliced = cur->layers[il].cpu_sliced || target->layers[il].cpu_sliced;
        target_s += kt_cost_layer(c, cur, il, target->layers[il].experts, target->layers[il].cpu_sliced, &s.q, NULL);
        if ((slice || whole) && grow_candidates(&s, &cand_cap))
            s.cand[s.n_cand++] = (struct candidate){il, 0, slice ? KT_MOVE_LAYER_SLICE : KT_MOVE_LAYER_WHOLE, -1, false,
                                                    0.0, UINT32_MAX};
        for (uint32_t x = 0; x < N; x++) {
            const struct kt_expert_home *a = &cur->layers[il].experts[x], *b = &target->layers[il].experts[x];
            if (!grow_candidates(&s, &cand_cap)) {
                st = kt_err_set(err, KT_ERR_NOMEM, "rebalance: out of memory");
                goto done;
            }
            if (to_sliced && a->device == 0 && b->device == 0)
                continue; /* a sliced layer's CPU experts have no home or replicas to move */
            if (!same_home(a, b)) {
                s.cand[s.n_cand++] = (struct candidate){il, x, KT_MOVE_HOME, -1, false, 0.0, UINT32_MAX};
                continue;
            }
            /* the same CPU node: its replicas, one candidate per node that differs (none in a sliced layer) */
            const uint64_t differ = a->device == 0 && !cur->layers[il].cpu_sliced
                                        ? (a->replica_nodes ^ b->replica_nodes) & ~(1ull << (a->node & 63))
                                        : 0;
            for (int n = 0; n < cur->n_nodes && n < 64; n++)
                if ((differ >> n & 1) && grow_candidates(&s, &cand_cap))
                    s.cand[s.n_cand++] = (struct candidate){
                        il, x, b->replica_nodes >> n & 1 ? KT_MOVE_REPLICA_ADD : KT_MOVE_REPLICA_DROP, n, false, 0.0,
                        UINT32_MAX};
                else if (differ >> n & 1) {
                    st = kt_err_set(err, KT_ERR_NOMEM, "rebalance: out of memory");
                    goto done;
                }
        }
    }
    /* hysteresis: nothing moves unless the target saves enough of the step */
    if (!(target_s < out->before_s * (1.0 - rp->min_gain))) {
        out->n_pending = s.n_cand;
        out->after_s = out->before_s;
        goto done;
    }
    /* the target's replica drops first: they free the node memory its adds may take */
    for (uint32_t i = 0; i < s.n_cand; i++) {
        struct candidate *k = &s.cand[i];
        if (k->kind != KT_MOVE_REPLICA_DROP)
            continue;
        const double gain = s.layer_s[k->layer] - (layer_time_with(&s, k));
        if ((st = add_move(out, &cap, &s, k, gain, -1, err)))
            goto done;
        apply(&s, k);
        out->gain_s += gain;
    }
    uint64_t left = rp->budget_bytes ? rp->budget_bytes : UINT64_MAX;
    for (;;) {
        int best = -1, best_pair = -1;
        double best_ratio = 0.0, best_gain = 0.0;
        uint64_t best_bytes = 0;
        for (uint32_t i = 0; i < s.n_cand; i++) {
            struct candidate *k = &s.cand[i];
            if (k->done)
                continue;
            const struct kt_expert_home to = target_home(&s, k);
            const uint64_t eb = candidate_bytes(&s, k);
            /* alone, where the device has room; and onto a device, as a swap with a
             * pending move off it: the one that loses the least, and the best of
             * its own layer (a layer's hot set changing is a swap within it) */
            int pairs[3] = {-2, -1, -1};
            if (to.device > 0) {
                double least_loss = 0.0, best_local = 0.0;
                for (uint32_t j = 0; j < s.n_cand; j++) {
                    struct candidate *o = &s.cand[j];
                    if (o->done || j == i || home_of(&s, o->layer, o->expert)->device != to.device ||
                        target_home(&s, o).device == to.device ||
                        s.free_bytes[to.device] + kt_layer_expert_bytes(m, o->layer) < eb)
                        continue;
                    const double g = cached_gain(&s, o);
                    if (pairs[1] < 0 || g > least_loss)
                        pairs[1] = (int)j, least_loss = g;
                    if (o->layer == k->layer && (pairs[2] < 0 || g > best_local))
                        pairs[2] = (int)j, best_local = g;
                }
                if (s.free_bytes[to.device] < eb)
                    pairs[0] = -1; /* no room alone */
            }
            for (int v = 0; v < 3; v++) {
                if (pairs[v] == -1 || (v == 2 && pairs[2] == pairs[1]))
                    continue;
                const int pair = v == 0 ? -1 : pairs[v];
                const double gain = pair < 0 ? cached_gain(&s, k) : gain_of(&s, k, &s.cand[pair]);
                const uint64_t bytes = eb + (pair < 0 ? 0 : kt_layer_expert_bytes(m, s.cand[pair].layer));
                if (gain <= 0.0 || bytes > left)
                    continue;
                const double ratio = gain / (double)bytes;
                if (best < 0 || ratio > best_ratio)
                    best = (int)i, best_pair = pair, best_ratio = ratio, best_gain = gain, best_bytes = bytes;
            }
        }
        if (best < 0)
            break;
        int32_t paired_with = -1;
        if (best_pair >= 0) {
            paired_with = (int32_t)out->n_moves;
            if ((st = add_move(out, &cap, &s, &s.cand[best_pair], 0.0, -1, err)))
                goto done;
            apply(&s, &s.cand[best_pair]);
        }
        if ((st = add_move(out, &cap, &s, &s.cand[best], best_gain, paired_with, err)))
            goto done;
        apply(&s, &s.cand[best]);
        left -= best_bytes;
        out->gain_s += best_gain;
    }
    for (uint32_t i = 0; i < s.n_cand; i++)
        out->n_pending += !s.cand[i].done;
    for (uint32_t il = 0; il < L; il++)
        if (cur->layers[il].experts)
            out->after_s += s.layer_s[il];
done:
    free(s.homes), free(s.version), free(s.layer_s), free(s.cand), free(s.sliced);
    if (st)
        kt_rebalance_free(out);
    return st;
}

void kt_rebalance_free(struct kt_rebalance *r)
{
    free(r->moves);
    memset(r, 0, sizeof *r);
}
