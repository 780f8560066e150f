/*
 * ranks_plan.c - kt-place over the ranks of an MPI job (ranks_plan.h).
 */
#include "ranks_plan.h"

#include "config.h"
#include "text.h"
#include "meminfo.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define GIB (1024.0 * 1024.0 * 1024.0)

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static bool fits(uint64_t bytes, uint64_t capacity)
{
    return capacity == 0 || bytes + kt_meminfo_margin_bytes(bytes) <= capacity;
}

/* ---- the split ------------------------------------------------------------------- */

struct split {
    uint32_t L;
    int R;
    const double *layer_s;
    double head_s;
    const uint64_t *layer_bytes;
    uint64_t head_bytes;
    const uint64_t *capacity;
    double *t_prefix;            /* [R][L + 1] prefix sums of layer_s */
    uint64_t *b_prefix;          /* [R][L + 1] prefix sums of layer_bytes */
};

/* Rank r holding layers [a, b): its time, and whether it fits (r == 0: with the head). */
static double stage_time(const struct split *s, int r, uint32_t a, uint32_t b)
{
    const double *t = s->t_prefix + (size_t)r * (s->L + 1);
    return t[b] - t[a] + (r == 0 ? s->head_s : 0);
}

static uint64_t stage_bytes(const struct split *s, int r, uint32_t a, uint32_t b)
{
    const uint64_t *t = s->b_prefix + (size_t)r * (s->L + 1);
    return t[b] - t[a] + (r == 0 ? s->head_bytes : 0);
}

static bool stage_fits(const struct split *s, int r, uint32_t a, uint32_t b)
{
    return fits(stage_bytes(s, r, a, b), s->capacity[r]);
}

/* One pass of the program: cost[r][j] the best over ranks 0..r holding
 * layers [0, j).  limit < 0: minimise the slowest stage; else minimise the
 * sum of squared stage times with every stage within limit.  Returns the
 * best whole split's cost (INFINITY: none) and fills first[]. */
static double program(const struct split *s, double limit, double *cost, uint32_t *from, uint32_t *first)
{
    const uint32_t L = s->L;
    const int R = s->R;
    for (size_t i = 0; i < (size_t)R * (L + 1); i++)
        cost[i] = INFINITY;
    for (int r = 0; r < R; r++) {
        /* rank r ends at layer j - 1: it holds at least one layer, and the later ranks one each */
        for (uint32_t j = (uint32_t)r + 1; j + (uint32_t)(R - 1 - r) <= L; j++) {
            double best = INFINITY;
            uint32_t arg = 0;
            for (uint32_t a = (uint32_t)r; a < j; a++) {
                const double before = r == 0 ? (a == 0 ? 0 : INFINITY) : cost[(size_t)(r - 1) * (L + 1) + a];
                if (!isfinite(before) || !stage_fits(s, r, a, j))
                    continue;
                const double t = stage_time(s, r, a, j);
                double c;
                if (limit < 0) {
                    c = t > before ? t : before;
                } else {
                    if (t > limit)
                        continue;
                    c = before + t * t;
                }
                if (c < best) {
                    best = c;
                    arg = a;
                }
            }
            cost[(size_t)r * (L + 1) + j] = best;
            from[(size_t)r * (L + 1) + j] = arg;
        }
    }
    const double total = cost[(size_t)(R - 1) * (L + 1) + L];
    if (isfinite(total)) {
        uint32_t j = L;
        for (int r = R - 1; r >= 0; r--) {
            first[r] = from[(size_t)r * (L + 1) + j];
            j = first[r];
        }
    }
    return total;
}

/* Why no split fits: the total against the ranks' memory, else the tightest rank. */
static kt_status no_fit(const struct split *s, kt_err *err)
{
    uint64_t need = s->head_bytes, have = 0;
    bool unknown = false;
    for (uint32_t il = 0; il < s->L; il++) {
        uint64_t least = UINT64_MAX;
        for (int r = 0; r < s->R; r++)
            if (s->layer_bytes[(size_t)r * s->L + il] < least)
                least = s->layer_bytes[(size_t)r * s->L + il];
        need += least;
    }
    for (int r = 0; r < s->R; r++) {
        unknown |= s->capacity[r] == 0;
        have += s->capacity[r];
    }
    char a[32], b[32], c[32];
    if (!unknown && need + kt_meminfo_margin_bytes(need) > have)
        return kt_err_set(err, KT_ERR_INVALID, "no split of the %u layers over %d ranks fits their memory: the model "
                          "needs %s (the embedding and head %s of it on rank 0, the rest with the KV cache of its "
                          "layers) and the loader's margin, the ranks hold %s in all: give more ranks, machines with "
                          "more memory or fewer --kv-tokens", s->L, s->R, kt_text_bytes(need, a, sizeof a),
                          kt_text_bytes(s->head_bytes, b, sizeof b), kt_text_bytes(have, c, sizeof c));
    /* the total would fit: some rank cannot hold what contiguity leaves it - rank 0 starts with layer 0 and
     * the head, the last rank ends with the last layer, every rank holds one layer at least */
    const int last = s->R - 1;
    if (!stage_fits(s, 0, 0, 1))
        return kt_err_set(err, KT_ERR_INVALID, "no split of the %u layers over %d ranks fits: rank 0 holds %s, less "
                          "than layer 0 with the embedding and head need (%s, + %s the loader keeps free): give rank "
                          "0 more memory or fewer --kv-tokens", s->L, s->R, kt_text_bytes(s->capacity[0], a, sizeof a),
                          kt_text_bytes(stage_bytes(s, 0, 0, 1), b, sizeof b),
                          kt_text_bytes(kt_meminfo_margin_bytes(stage_bytes(s, 0, 0, 1)), c, sizeof c));
    if (last > 0 && !stage_fits(s, last, s->L - 1, s->L))
        return kt_err_set(err, KT_ERR_INVALID, "no split of the %u layers over %d ranks fits: rank %d, the last, "
                          "holds %s, less than the last layer needs (%s, + %s the loader keeps free): give it more "
                          "memory, or put a larger machine last", s->L, s->R, last,
                          kt_text_bytes(s->capacity[last], a, sizeof a), kt_text_bytes(stage_bytes(s, last, s->L - 1, s->L), b, sizeof b),
                          kt_text_bytes(kt_meminfo_margin_bytes(stage_bytes(s, last, s->L - 1, s->L)), c, sizeof c));
    for (int r = 1; r < last; r++) {
        bool any = false;
        for (uint32_t il = 1; il + 1 < s->L && !any; il++)
            any = stage_fits(s, r, il, il + 1);
        if (!any)
            return kt_err_set(err, KT_ERR_INVALID, "no split of the %u layers over %d ranks fits: rank %d holds %s, "
                              "less than any one layer needs with the loader's margin: give it more memory or "
                              "fewer --kv-tokens", s->L, s->R, r, kt_text_bytes(s->capacity[r], a, sizeof a));
    }
    int worst = -1;
    for (int r = 0; r < s->R; r++)
        if (s->capacity[r] && (worst < 0 || s->capacity[r] < s->capacity[worst]))
            worst = r;
    return kt_err_set(err, KT_ERR_INVALID, "no split of the %u layers over %d ranks into contiguous ranges fits "
                      "every rank's memory (the smallest rank, %d, holds %s): give the small ranks more memory, "
                      "reorder the ranks, or use fewer", s->L, s->R, worst,
                      worst >= 0 ? kt_text_bytes(s->capacity[worst], a, sizeof a) : "an unknown amount");
}

kt_status kt_rank_split(uint32_t n_layer, int n_ranks, const double *layer_s, double head_s,
                        const uint64_t *layer_bytes, uint64_t head_bytes, const uint64_t *capacity, uint32_t *first,
                        kt_err *err)
{
    if (n_ranks < 1 || n_ranks > KT_RANK_PLAN_MAX)
        return kt_err_set(err, KT_ERR_INVALID, "%d ranks: 1 to %d are planned for", n_ranks, KT_RANK_PLAN_MAX);
    if ((uint32_t)n_ranks > n_layer)
        return kt_err_set(err, KT_ERR_INVALID, "%d ranks for %u layers: each rank holds one layer or more",
                          n_ranks, n_layer);
    const size_t cells = (size_t)n_ranks * (n_layer + 1);
    struct split s = {.L = n_layer, .R = n_ranks, .layer_s = layer_s, .head_s = head_s, .layer_bytes = layer_bytes,
                      .head_bytes = head_bytes, .capacity = capacity,
                      .t_prefix = malloc(cells * sizeof(double)), .b_prefix = malloc(cells * sizeof(uint64_t))};
    double *cost = calloc(cells, sizeof *cost);
    uint32_t *from = calloc(cells, sizeof *from);
    kt_status st = KT_OK;
    if (!s.t_prefix || !s.b_prefix || !cost || !from) {
        st = kt_err_set(err, KT_ERR_NOMEM, "out of memory");
        goto done;
    }
    for (int r = 0; r < n_ranks; r++) {
        double *t = s.t_prefix + (size_t)r * (n_layer + 1);
        uint64_t *b = s.b_prefix + (size_t)r * (n_layer + 1);
        t[0] = 0, b[0] = 0;
        for (uint32_t il = 0; il < n_layer; il++) {
            t[il + 1] = t[il] + layer_s[(size_t)r * n_layer + il];
            b[il + 1] = b[il] + layer_bytes[(size_t)r * n_layer + il];
        }
    }
    const double slowest = program(&s, -1, cost, from, first);
    if (!isfinite(slowest)) {
        st = no_fit(&s, err);
        goto done;
    }
    /* the most equal of the splits as fast as the fastest (a rounding's slack) */
    uint32_t eq[KT_RANK_PLAN_MAX];
    if (isfinite(program(&s, slowest * (1 + 1e-12) + 1e-15, cost, from, eq)))
        memcpy(first, eq, (size_t)n_ranks * sizeof *first);
done:
    free(s.t_prefix), free(s.b_prefix), free(cost), free(from);
    return st;
}

/* ---- a plan per rank --------------------------------------------------------------- */

static uint64_t bytes_of(const struct kt_gguf_tensor *t)
{
    return t ? t->nbytes : 0;
}

/* Layer il's bytes on a rank as p places it: its weights, its experts' replicas and its KV cache. */
static uint64_t layer_bytes(const struct kt_model *m, const struct kt_placement *p, uint64_t kv_per_layer,
                            uint32_t il)
{
    const struct kt_layer *L = &m->layers[il];
    const struct kt_gguf_tensor *t[] = {L->attn_norm,     L->attn_q_a,      L->attn_q_a_norm,   L->attn_q_b,
                                        L->attn_q,        L->attn_kv_a_mqa, L->attn_kv_a_norm,  L->attn_k_b,
                                        L->attn_v_b,      L->attn_kv_b,     L->attn_output,     L->ffn_norm,
                                        L->ffn_gate_inp,  L->exp_probs_b,   L->ffn_gate,        L->ffn_up,
                                        L->ffn_down,      L->ffn_gate_shexp, L->ffn_up_shexp,   L->ffn_down_shexp};
    uint64_t b = kv_per_layer;
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
        b += bytes_of(t[i]);
    const uint64_t expert = kt_layer_expert_bytes(m, il);
    const struct kt_placement_layer *pl = &p->layers[il];
    for (uint32_t x = 0; pl->experts && x < p->n_expert; x++)
        b += expert * (1 + (uint64_t)__builtin_popcountll(pl->experts[x].replica_nodes));
    return b;
}

static uint64_t machine_ram(const struct kt_machine *mach)
{
    uint64_t b = 0;
    for (int n = 0; n < mach->n_nodes; n++)
        b += mach->nodes[n].memory_bytes;
    return b;
}

/* The stages of the split `first` from the per-rank figures. */
static void fill_stages(struct kt_rank_plan *rp, struct kt_rank_stage *stages, const uint32_t *first, uint32_t L,
                        const double *obj, const double *dec, const double *pre, const uint64_t *bytes,
                        const double head[3], uint64_t head_bytes, const uint64_t *capacity)
{
    for (int r = 0; r < rp->n_ranks; r++) {
        struct kt_rank_stage *s = &stages[r];
        const uint32_t end = r + 1 < rp->n_ranks ? first[r + 1] : L;
        *s = (struct kt_rank_stage){.first = first[r], .last = end - 1, .capacity = capacity[r]};
        if (r == 0) {
            s->objective_s = head[0], s->decode_s = head[1], s->prefill_s = head[2];
            s->bytes = head_bytes;
        }
        for (uint32_t il = first[r]; il < end; il++) {
            const size_t i = (size_t)r * L + il;
            s->objective_s += obj[i], s->decode_s += dec[i], s->prefill_s += pre[i];
            s->bytes += bytes[i];
        }
        s->fits = fits(s->bytes, s->capacity);
    }
}

kt_status kt_plan_ranks(const struct kt_model *m, const char *name, const struct kt_profile *prof, int n_ranks,
                        const struct kt_rank_input *in, const struct kt_planner_options *o, struct kt_rank_plan **out,
                        kt_err *err)
{
    const double t0 = now_s();
    *out = NULL;
    name = name ? name : "model";
    const uint32_t L = m->hp.n_layer;
    if (n_ranks < 1 || n_ranks > KT_RANK_PLAN_MAX)
        return kt_err_set(err, KT_ERR_INVALID, "%s: %d ranks: 1 to %d are planned for", name, n_ranks,
                          KT_RANK_PLAN_MAX);
    if ((uint32_t)n_ranks > L)
        return kt_err_set(err, KT_ERR_INVALID, "%s: %d ranks for its %u layers: each rank holds one layer or more",
                          name, n_ranks, L);
    if (o->device != KT_PLACE_CPU)
        return kt_err_set(err, KT_ERR_INVALID, "%s: a rank of an MPI job runs its layers on its host's CPU "
                          "(runtime/dist): plan the ranks without --device", name);
    struct kt_rank_plan *rp = calloc(1, sizeof *rp);
    const size_t cells = (size_t)n_ranks * L;
    double *obj = calloc(cells, sizeof *obj), *dec = calloc(cells, sizeof *dec), *pre = calloc(cells, sizeof *pre);
    uint64_t *bytes = calloc(cells, sizeof *bytes), capacity[KT_RANK_PLAN_MAX] = {0};
    struct kt_cost_layer *cl = calloc(L, sizeof *cl);
    kt_status st = KT_OK;
    if (!rp || !obj || !dec || !pre || !bytes || !cl) {
        st = kt_err_set(err, KT_ERR_NOMEM, "out of memory");
        goto fail;
    }
    rp->n_ranks = n_ranks;
    double head[3] = {0, 0, 0}; /* rank 0's embedding and head: objective, decode, prefill */
    const uint64_t head_bytes =
        bytes_of(m->token_embd) + bytes_of(m->output_norm) + (m->output_tied ? 0 : bytes_of(m->output));
    for (int r = 0; r < n_ranks && !st; r++) {
        if ((st = kt_plan_create(m, name, prof, in[r].mach, in[r].cost, o, &rp->plans[r], err)) != KT_OK) {
            kt_err_prefix(err, "rank %d (%s)", r, in[r].name ? in[r].name : "machine");
            break;
        }
        const struct kt_plan *plan = rp->plans[r];
        const struct kt_placement *p = plan->placement;
        const struct kt_planner_options *po = &plan->options;
        const struct kt_memory_need need = kt_model_memory_need(m, -1, po->kv_tokens, p->kv_bytes_per_value);
        const uint64_t kv_per_layer = need.kv_cache_bytes / L;
        for (uint32_t il = 0; il < L; il++) {
            const size_t i = (size_t)r * L + il;
            dec[i] = plan->layers[il].decode_s;
            pre[i] = plan->layers[il].prefill_s;
            obj[i] = plan->weight_decode * dec[i] / po->batch + plan->weight_prefill * pre[i] / po->prefill_tokens;
            bytes[i] = layer_bytes(m, p, kv_per_layer, il);
        }
        capacity[r] = machine_ram(in[r].mach);
        if (r == 0) { /* the step's time beyond its layers: the embedding and the head */
            const struct kt_cost_query qd = {.mode = KT_COST_DECODE, .batch = po->batch, .context = po->context};
            const struct kt_cost_query qp = {.mode = KT_COST_PREFILL, .tokens = po->prefill_tokens};
            double step_d = 0, step_p = 0, sum_d = 0, sum_p = 0;
            st = kt_cost_predict(in[0].cost, p, &qd, cl, &step_d, err);
            for (uint32_t il = 0; !st && il < L; il++)
                sum_d += cl[il].total_s;
            if (!st)
                st = kt_cost_predict(in[0].cost, p, &qp, cl, &step_p, err);
            for (uint32_t il = 0; !st && il < L; il++)
                sum_p += cl[il].total_s;
            head[1] = step_d > sum_d ? step_d - sum_d : 0;
            head[2] = step_p > sum_p ? step_p - sum_p : 0;
            head[0] = plan->weight_decode * head[1] / po->batch + plan->weight_prefill * head[2] / po->prefill_tokens;
        }
    }
    uint32_t first[KT_RANK_PLAN_MAX], even[KT_RANK_PLAN_MAX];
    if (!st)
        st = kt_rank_split(L, n_ranks, obj, head[0], bytes, head_bytes, capacity, first, err);
    if (st) {
        if (st != KT_ERR_NOMEM)
            kt_err_prefix(err, "%s", name);
        goto fail;
    }
    for (int r = 0; r < n_ranks; r++) {
        const uint32_t n = (uint32_t)n_ranks, base = L / n, extra = L % n, rr = (uint32_t)r;
        even[r] = rr * base + (rr < extra ? rr : extra); /* runtime/dist's kt_pipeline_split */
    }
    fill_stages(rp, rp->stages, first, L, obj, dec, pre, bytes, head, head_bytes, capacity);
    fill_stages(rp, rp->even, even, L, obj, dec, pre, bytes, head, head_bytes, capacity);
    rp->even_fits = true;
    for (int r = 0; r < n_ranks; r++) {
        rp->even_fits &= rp->even[r].fits;
        rp->plans[r]->layer_begin = rp->stages[r].first;
        rp->plans[r]->layer_end = rp->stages[r].last + 1;
    }
    free(obj), free(dec), free(pre), free(bytes), free(cl);
    rp->plan_s = now_s() - t0;
    *out = rp;
    return KT_OK;
fail:
    free(obj), free(dec), free(pre), free(bytes), free(cl);
    kt_rank_plan_destroy(rp);
    return st;
}

void kt_rank_plan_destroy(struct kt_rank_plan *rp)
{
    if (!rp)
        return;
    for (int r = 0; r < KT_RANK_PLAN_MAX; r++)
        kt_plan_destroy(rp->plans[r]);
    free(rp);
}

/* ---- the config text ------------------------------------------------------------- */

/* text's lines, each indented by `indent` spaces. */
static void put_indented(struct kt_text *t, const char *text, int indent)
{
    for (const char *line = text; *line;) {
        const char *nl = strchr(line, '\n');
        const int len = (int)(nl ? nl - line : (ptrdiff_t)strlen(line));
        kt_text_put(t, "%*s%.*s\n", len ? indent : 0, "", len, line);
        line += len + (nl ? 1 : 0);
    }
}

static void put_stage(struct kt_text *t, const char *label, int r, const struct kt_rank_stage *s)
{
    char a[32], b[32];
    kt_text_put(t, "#   %s rank %d: layers %u-%u, decode %.4f ms, prefill %.4f ms, objective %.4f ms a token; %s of %s%s\n",
        label, r, s->first, s->last, 1e3 * s->decode_s, 1e3 * s->prefill_s, 1e3 * s->objective_s,
        kt_text_bytes(s->bytes, a, sizeof a), s->capacity ? kt_text_bytes(s->capacity, b, sizeof b) : "unknown RAM",
        s->fits ? "" : " (does not fit)");
}

char *kt_rank_plan_yaml(const struct kt_rank_plan *rp, const char *model_name, const char *profile_path,
                        const struct kt_rank_input *in)
{
    struct kt_text t = {0};
    static const char *const objective[] = {"decode", "prefill", "mixed"};
    const struct kt_planner_options *o = &rp->plans[0]->options;
    kt_text_put(&t, "# kt-place plan of %s over %d MPI ranks (runtime/dist): layer ranges by memory and predicted time\n",
        model_name ? model_name : "a model", rp->n_ranks);
    kt_text_put(&t, "# objective %s (decode batch %u at context %u, prefill of %u tokens); KV cache of %u tokens a rank\n",
        objective[o->objective], o->batch, o->context, o->prefill_tokens, o->kv_tokens);
    for (int r = 0; r < rp->n_ranks; r++)
        kt_text_put(&t, "# rank %d planned on %s\n", r, in && in[r].name ? in[r].name : "its machine");
    kt_text_put(&t, "# predicted stages (rank 0 with the embedding and the head):\n");
    for (int r = 0; r < rp->n_ranks; r++)
        put_stage(&t, "planned", r, &rp->stages[r]);
    for (int r = 0; r < rp->n_ranks; r++)
        put_stage(&t, "even split", r, &rp->even[r]);
    kt_text_put(&t, "version: 1\ndescription: kt-place plan over %d MPI ranks (objective %s)\n", rp->n_ranks,
        objective[o->objective]);
    if (profile_path)
        kt_text_put(&t, "profile: '%s'\n", profile_path);
    kt_text_put(&t, "attention: cpu\nranks:\n");
    for (int r = 0; r < rp->n_ranks; r++) {
        kt_text_put(&t, "  - layers: %u-%u\n    placement:\n", rp->stages[r].first, rp->stages[r].last);
        char *sub = kt_plan_yaml(rp->plans[r], model_name, profile_path);
        if (!sub) {
            t.failed = true;
            break;
        }
        put_indented(&t, sub, 6);
        free(sub);
    }
    if (t.failed) {
        free(t.s);
        return NULL;
    }
    return t.s;
}

kt_status kt_rank_plan_check_yaml(const struct kt_rank_plan *rp, const char *text, size_t len, const char *name,
                                  const struct kt_model *m, kt_err *err)
{
    struct kt_placement_config *c = NULL;
    kt_status st = kt_placement_config_parse(text, len, name, &c, err);
    if (!st && kt_placement_config_ranks(c) != rp->n_ranks)
        st = kt_err_set(err, KT_ERR_FORMAT, "%s: ranks: %d ranks, the plan has %d", name,
                        kt_placement_config_ranks(c), rp->n_ranks);
    for (int r = 0; !st && r < rp->n_ranks; r++) {
        uint32_t first, last;
        kt_placement_config_rank_layers(c, r, &first, &last);
        const struct kt_placement_config *sub = kt_placement_config_rank_placement(c, r);
        if (first != rp->stages[r].first || last != rp->stages[r].last || !sub) {
            st = kt_err_set(err, KT_ERR_FORMAT, "%s: ranks[%d]: layers %u-%u%s, the plan's are %u-%u", name, r, first,
                            last, sub ? "" : " without a placement", rp->stages[r].first, rp->stages[r].last);
            break;
        }
        const struct kt_plan *plan = rp->plans[r];
        struct kt_placement *back = NULL;
        st = kt_placement_resolve(sub, m, plan->placement->n_nodes, NULL, &back, err);
        if (!st && (st = kt_plan_compare_layers(plan->placement, back, plan->layer_begin, plan->layer_end, err)))
            kt_err_prefix(err, "%s: ranks[%d].placement does not give the rank's plan back", name, r);
        kt_placement_destroy(back);
    }
    kt_placement_config_destroy(c);
    if (st && st != KT_ERR_NOMEM)
        st = KT_ERR_FORMAT;
    if (err)
        err->status = st;
    return st;
}
