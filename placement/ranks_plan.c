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
    const struct kt_rank_split_input *in;
    uint32_t L;
    int R;
    double *t_prefix;            /* [R][L + 1] prefix sums of layer_s */
    uint64_t *b_prefix;          /* [R][L + 1] prefix sums of layer_bytes */
    uint64_t *d_prefix;          /* [R][L + 1] prefix sums of device_layer_bytes; NULL: no devices */
};

/* Rank r holding layers [a, b): its time with its link, and whether it fits (r == 0: with the head). */
static double stage_time(const struct split *s, int r, uint32_t a, uint32_t b)
{
    const double *t = s->t_prefix + (size_t)r * (s->L + 1);
    return t[b] - t[a] + (r == 0 ? s->in->head_s : 0) + (s->in->link_s ? s->in->link_s[r] : 0);
}

static uint64_t stage_bytes(const struct split *s, int r, uint32_t a, uint32_t b)
{
    const uint64_t *t = s->b_prefix + (size_t)r * (s->L + 1);
    return t[b] - t[a] + (r == 0 ? s->in->head_bytes : 0);
}

static bool has_device(const struct split *s, int r)
{
    return s->d_prefix && s->in->device_capacity[r] > 0;
}

static uint64_t stage_device_bytes(const struct split *s, int r, uint32_t a, uint32_t b)
{
    const uint64_t *t = s->d_prefix + (size_t)r * (s->L + 1);
    return t[b] - t[a] + s->in->device_fixed[r];
}

static bool stage_fits(const struct split *s, int r, uint32_t a, uint32_t b)
{
    return fits(stage_bytes(s, r, a, b), s->in->capacity[r]) &&
           (!has_device(s, r) || stage_device_bytes(s, r, a, b) <= s->in->device_capacity[r]);
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
    char a[32], b[32], c[32];
    /* a device that cannot hold one layer's attention and KV cache with the working buffers */
    for (int r = 0; r < s->R; r++) {
        if (!has_device(s, r))
            continue;
        uint32_t best = 0;
        for (uint32_t il = 1; il < s->L; il++)
            if (stage_device_bytes(s, r, il, il + 1) < stage_device_bytes(s, r, best, best + 1))
                best = il;
        if (stage_device_bytes(s, r, best, best + 1) > s->in->device_capacity[r])
            return kt_err_set(err, KT_ERR_INVALID, "no split of the %u layers over %d ranks fits: rank %d's device "
                              "holds %s, less than one layer's attention and KV cache with the engine's working "
                              "buffers need (%s): give it more memory (--gpu-memory), fewer --kv-tokens, or plan "
                              "the rank without its device", s->L, s->R, r,
                              kt_text_bytes(s->in->device_capacity[r], a, sizeof a),
                              kt_text_bytes(stage_device_bytes(s, r, best, best + 1), b, sizeof b));
    }
    uint64_t need = s->in->head_bytes, have = 0;
    bool unknown = false;
    for (uint32_t il = 0; il < s->L; il++) {
        uint64_t least = UINT64_MAX;
        for (int r = 0; r < s->R; r++)
            if (s->in->layer_bytes[(size_t)r * s->L + il] < least)
                least = s->in->layer_bytes[(size_t)r * s->L + il];
        need += least;
    }
    for (int r = 0; r < s->R; r++) {
        unknown |= s->in->capacity[r] == 0;
        have += s->in->capacity[r];
    }
    if (!unknown && need + kt_meminfo_margin_bytes(need) > have)
        return kt_err_set(err, KT_ERR_INVALID, "no split of the %u layers over %d ranks fits their memory: the model "
                          "needs %s (the embedding and head %s of it on rank 0, the rest with the KV cache of its "
                          "layers) and the loader's margin, the ranks hold %s in all: give more ranks, machines with "
                          "more memory or fewer --kv-tokens", s->L, s->R, kt_text_bytes(need, a, sizeof a),
                          kt_text_bytes(s->in->head_bytes, b, sizeof b), kt_text_bytes(have, c, sizeof c));
    /* the total would fit: some rank cannot hold what contiguity leaves it - rank 0 starts with layer 0 and
     * the head, the last rank ends with the last layer, every rank holds one layer at least */
    const int last = s->R - 1;
    if (!stage_fits(s, 0, 0, 1))
        return kt_err_set(err, KT_ERR_INVALID, "no split of the %u layers over %d ranks fits: rank 0 holds %s, less "
                          "than layer 0 with the embedding and head need (%s, + %s the loader keeps free): give rank "
                          "0 more memory or fewer --kv-tokens", s->L, s->R, kt_text_bytes(s->in->capacity[0], a, sizeof a),
                          kt_text_bytes(stage_bytes(s, 0, 0, 1), b, sizeof b),
                          kt_text_bytes(kt_meminfo_margin_bytes(stage_bytes(s, 0, 0, 1)), c, sizeof c));
    if (last > 0 && !stage_fits(s, last, s->L - 1, s->L))
        return kt_err_set(err, KT_ERR_INVALID, "no split of the %u layers over %d ranks fits: rank %d, the last, "
                          "holds %s, less than the last layer needs (%s, + %s the loader keeps free): give it more "
                          "memory, or put a larger machine last", s->L, s->R, last,
                          kt_text_bytes(s->in->capacity[last], a, sizeof a), kt_text_bytes(stage_bytes(s, last, s->L - 1, s->L), b, sizeof b),
                          kt_text_bytes(kt_meminfo_margin_bytes(stage_bytes(s, last, s->L - 1, s->L)), c, sizeof c));
    for (int r = 1; r < last; r++) {
        bool any = false;
        for (uint32_t il = 1; il + 1 < s->L && !any; il++)
            any = stage_fits(s, r, il, il + 1);
        if (!any)
            return kt_err_set(err, KT_ERR_INVALID, "no split of the %u layers over %d ranks fits: rank %d holds %s, "
                              "less than any one layer needs with the loader's margin: give it more memory or "
                              "fewer --kv-tokens", s->L, s->R, r, kt_text_bytes(s->in->capacity[r], a, sizeof a));
    }
    int worst = -1;
    for (int r = 0; r < s->R; r++)
        if (s->in->capacity[r] && (worst < 0 || s->in->capacity[r] < s->in->capacity[worst]))
            worst = r;
    return kt_err_set(err, KT_ERR_INVALID, "no split of the %u layers over %d ranks into contiguous ranges fits "
                      "every rank's memory%s (the smallest rank, %d, holds %s): give the small ranks more memory, "
                      "reorder the ranks, or use fewer", s->L, s->R, s->d_prefix ? " and device" : "", worst,
                      worst >= 0 ? kt_text_bytes(s->in->capacity[worst], a, sizeof a) : "an unknown amount");
}

kt_status kt_rank_split_with(const struct kt_rank_split_input *in, uint32_t *first, kt_err *err)
{
    const uint32_t n_layer = in->n_layer;
    const int n_ranks = in->n_ranks;
    if (n_ranks < 1 || n_ranks > KT_RANK_PLAN_MAX)
        return kt_err_set(err, KT_ERR_INVALID, "%d ranks: 1 to %d are planned for", n_ranks, KT_RANK_PLAN_MAX);
    if ((uint32_t)n_ranks > n_layer)
        return kt_err_set(err, KT_ERR_INVALID, "%d ranks for %u layers: each rank holds one layer or more",
                          n_ranks, n_layer);
    const bool devices = in->device_layer_bytes && in->device_fixed && in->device_capacity;
    const size_t cells = (size_t)n_ranks * (n_layer + 1);
    struct split s = {.in = in, .L = n_layer, .R = n_ranks,
                      .t_prefix = malloc(cells * sizeof(double)), .b_prefix = malloc(cells * sizeof(uint64_t)),
                      .d_prefix = devices ? malloc(cells * sizeof(uint64_t)) : NULL};
    double *cost = calloc(cells, sizeof *cost);
    uint32_t *from = calloc(cells, sizeof *from);
    kt_status st = KT_OK;
    if (!s.t_prefix || !s.b_prefix || (devices && !s.d_prefix) || !cost || !from) {
        st = kt_err_set(err, KT_ERR_NOMEM, "out of memory");
        goto done;
    }
    for (int r = 0; r < n_ranks; r++) {
        double *t = s.t_prefix + (size_t)r * (n_layer + 1);
        uint64_t *b = s.b_prefix + (size_t)r * (n_layer + 1);
        uint64_t *d = devices ? s.d_prefix + (size_t)r * (n_layer + 1) : NULL;
        t[0] = 0, b[0] = 0;
        if (d)
            d[0] = 0;
        for (uint32_t il = 0; il < n_layer; il++) {
            t[il + 1] = t[il] + in->layer_s[(size_t)r * n_layer + il];
            b[il + 1] = b[il] + in->layer_bytes[(size_t)r * n_layer + il];
            if (d)
                d[il + 1] = d[il] + in->device_layer_bytes[(size_t)r * n_layer + il];
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
    free(s.t_prefix), free(s.b_prefix), free(s.d_prefix), free(cost), free(from);
    return st;
}

kt_status kt_rank_split(uint32_t n_layer, int n_ranks, const double *layer_s, double head_s,
                        const uint64_t *layer_bytes, uint64_t head_bytes, const uint64_t *capacity, uint32_t *first,
                        kt_err *err)
{
    const struct kt_rank_split_input in = {.n_layer = n_layer, .n_ranks = n_ranks, .layer_s = layer_s,
                                           .head_s = head_s, .layer_bytes = layer_bytes, .head_bytes = head_bytes,
                                           .capacity = capacity};
    return kt_rank_split_with(&in, first, err);
}

/* ---- the link between stages ------------------------------------------------------- */

/* One message of n tokens as runtime/dist/pipeline.c sends it: its header (struct msg_header, 160 bytes:
 * kind, counts, the step number, 16 ranks' busy times), a STEP's tokens (struct kt_batch_token, 16 bytes
 * each), padded to 64 bytes (x_offset), then the residual stream, n_embd floats a token. */
uint64_t kt_rank_message_bytes(uint32_t n_tokens, uint32_t n_embd, bool step)
{
    const uint64_t head = 160 + (step ? 16 * (uint64_t)n_tokens : 0);
    return (head + 63) / 64 * 64 + (uint64_t)n_tokens * n_embd * sizeof(float);
}

double kt_rank_link_seconds(const struct kt_machine *from, const struct kt_machine *to, uint32_t n_embd,
                            uint32_t n_tokens, uint32_t messages, bool step)
{
    const double gbps = from->net_gbps < to->net_gbps ? from->net_gbps : to->net_gbps;
    const double lat = from->net_latency_us > to->net_latency_us ? from->net_latency_us : to->net_latency_us;
    if (messages > n_tokens)
        messages = n_tokens; /* no empty slices */
    if (messages < 1)
        messages = 1;
    double s = 0;
    for (uint32_t k = 0; k < messages; k++) { /* pipeline.c's slices: [n k / messages, n (k + 1) / messages) */
        const uint64_t lo = (uint64_t)n_tokens * k / messages, hi = (uint64_t)n_tokens * (k + 1) / messages;
        s += 1e-6 * lat + (double)kt_rank_message_bytes((uint32_t)(hi - lo), n_embd, step) / (gbps * 1e9);
    }
    return s;
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

/* Layer il's attention tensors and router: what an accelerator holding attention holds of it (with the KV cache). */
static uint64_t attention_bytes(const struct kt_model *m, uint32_t il)
{
    const struct kt_layer *L = &m->layers[il];
    const struct kt_gguf_tensor *t[] = {L->attn_norm, L->attn_q_a, L->attn_q_a_norm, L->attn_q_b, L->attn_q,
                                        L->attn_kv_a_mqa, L->attn_kv_a_norm, L->attn_k_b, L->attn_v_b, L->attn_kv_b,
                                        L->attn_output, L->ffn_norm, L->ffn_gate_inp, L->exp_probs_b};
    uint64_t b = 0;
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
        b += bytes_of(t[i]);
    return b;
}

static uint64_t machine_ram(const struct kt_machine *mach)
{
    uint64_t b = 0;
    for (int n = 0; n < mach->n_nodes; n++)
        b += mach->nodes[n].memory_bytes;
    return b;
}

/* The per-rank figures the split works on ([r * L + il]) and what is known of each rank. */
struct figures {
    uint32_t L;
    double *obj, *dec, *pre;     /* layer times: objective, decode step, prefill */
    uint64_t *bytes;             /* in RAM */
    uint64_t *dev_bytes;         /* on the device: attention and KV cache (device ranks) */
    uint64_t capacity[KT_RANK_PLAN_MAX], dev_fixed[KT_RANK_PLAN_MAX], dev_capacity[KT_RANK_PLAN_MAX];
    double link[KT_RANK_PLAN_MAX][3]; /* the outgoing link: objective, decode step, prefill */
    double head[3];              /* rank 0's embedding and head: objective, decode, prefill */
    uint64_t head_bytes;
};

/* Rank r's rows over layers [begin, end) from its plan (and rank 0's head). */
static kt_status take_figures(struct figures *f, const struct kt_model *m, const struct kt_plan *plan,
                              const struct kt_cost_model *cost, int r, uint32_t begin, uint32_t end,
                              struct kt_cost_layer *cl, kt_err *err)
{
    const uint32_t L = f->L;
    const struct kt_placement *p = plan->placement;
    const struct kt_planner_options *po = &plan->options;
    const struct kt_memory_need need = kt_model_memory_need(m, -1, po->kv_tokens, p->kv_bytes_per_value);
    const uint64_t kv_per_layer = need.kv_cache_bytes / L;
    for (uint32_t il = begin; il < end; il++) {
        const size_t i = (size_t)r * L + il;
        f->dec[i] = plan->layers[il].decode_s;
        f->pre[i] = plan->layers[il].prefill_s;
        f->obj[i] = plan->weight_decode * f->dec[i] / po->batch + plan->weight_prefill * f->pre[i] / po->prefill_tokens;
        f->bytes[i] = layer_bytes(m, p, kv_per_layer, il);
        f->dev_bytes[i] = plan->accel && p->layers[il].attention == plan->accel ? attention_bytes(m, il) + kv_per_layer
                                                                                  : 0;
    }
    if (r != 0)
        return KT_OK;
    /* the step's time beyond its layers: the embedding and the head */
    const struct kt_cost_query qd = {.mode = KT_COST_DECODE, .batch = po->batch, .context = po->context};
    const struct kt_cost_query qp = {.mode = KT_COST_PREFILL, .tokens = po->prefill_tokens};
    double step_d = 0, step_p = 0, sum_d = 0, sum_p = 0;
    kt_status st = kt_cost_predict(cost, p, &qd, cl, &step_d, err);
    for (uint32_t il = 0; !st && il < L; il++)
        sum_d += cl[il].total_s;
    if (!st)
        st = kt_cost_predict(cost, p, &qp, cl, &step_p, err);
    for (uint32_t il = 0; !st && il < L; il++)
        sum_p += cl[il].total_s;
    f->head[1] = step_d > sum_d ? step_d - sum_d : 0;
    f->head[2] = step_p > sum_p ? step_p - sum_p : 0;
    f->head[0] = plan->weight_decode * f->head[1] / po->batch + plan->weight_prefill * f->head[2] / po->prefill_tokens;
    return st;
}

/* The links: rank r sends its output to r + 1, the last rank back to rank 0; one rank sends nothing. */
static void take_links(struct figures *f, const struct kt_model *m, const struct kt_plan *plan, int n_ranks,
                       const struct kt_rank_input *in)
{
    const struct kt_planner_options *po = &plan->options;
    const uint32_t n_embd = m->hp.n_embd;
    const uint32_t micro = po->batch >= 2 && n_ranks >= 2 ? (po->batch < (uint32_t)n_ranks ? po->batch : (uint32_t)n_ranks)
                                                           : 1;
    for (int r = 0; r < n_ranks; r++) {
        double *l = f->link[r];
        l[0] = l[1] = l[2] = 0;
        if (n_ranks < 2)
            continue;
        const int to = (r + 1) % n_ranks;
        const bool step = to != 0; /* a STEP carries the tokens, the RESULT back to rank 0 does not */
        l[1] = kt_rank_link_seconds(in[r].mach, in[to].mach, n_embd, po->batch, micro, step);
        l[2] = kt_rank_link_seconds(in[r].mach, in[to].mach, n_embd, po->prefill_tokens, 1, step);
        l[0] = plan->weight_decode * l[1] / po->batch + plan->weight_prefill * l[2] / po->prefill_tokens;
    }
}

static kt_status split_of(const struct figures *f, int n_ranks, bool devices, uint32_t *first, kt_err *err)
{
    double link_s[KT_RANK_PLAN_MAX];
    for (int r = 0; r < n_ranks; r++)
        link_s[r] = f->link[r][0];
    const struct kt_rank_split_input si = {
        .n_layer = f->L, .n_ranks = n_ranks, .layer_s = f->obj, .head_s = f->head[0], .layer_bytes = f->bytes,
        .head_bytes = f->head_bytes, .capacity = f->capacity, .link_s = link_s,
        .device_layer_bytes = devices ? f->dev_bytes : NULL, .device_fixed = devices ? f->dev_fixed : NULL,
        .device_capacity = devices ? f->dev_capacity : NULL};
    return kt_rank_split_with(&si, first, err);
}

/* The stages of the split `first` from the per-rank figures. */
static void fill_stages(struct kt_rank_plan *rp, struct kt_rank_stage *stages, const uint32_t *first,
                        const struct figures *f)
{
    const uint32_t L = f->L;
    for (int r = 0; r < rp->n_ranks; r++) {
        struct kt_rank_stage *s = &stages[r];
        const uint32_t end = r + 1 < rp->n_ranks ? first[r + 1] : L;
        *s = (struct kt_rank_stage){.first = first[r], .last = end - 1, .capacity = f->capacity[r],
                                    .device = f->dev_capacity[r] > 0, .device_capacity = f->dev_capacity[r],
                                    .link_s = f->link[r][0], .link_decode_s = f->link[r][1],
                                    .link_prefill_s = f->link[r][2]};
        s->objective_s = s->link_s, s->decode_s = s->link_decode_s, s->prefill_s = s->link_prefill_s;
        if (r == 0) {
            s->objective_s += f->head[0], s->decode_s += f->head[1], s->prefill_s += f->head[2];
            s->bytes = f->head_bytes;
        }
        if (s->device)
            s->device_bytes = f->dev_fixed[r];
        for (uint32_t il = first[r]; il < end; il++) {
            const size_t i = (size_t)r * L + il;
            s->objective_s += f->obj[i], s->decode_s += f->dec[i], s->prefill_s += f->pre[i];
            s->bytes += f->bytes[i];
            if (s->device)
                s->device_bytes += f->dev_bytes[i];
        }
        s->fits = fits(s->bytes, s->capacity) && (!s->device || s->device_bytes <= s->device_capacity);
    }
}

/* The machine file's accelerator of backend b (the planner's choice: the first one). */
static const struct kt_machine_accel *machine_accel(const struct kt_machine *mach, enum kt_place_backend b)
{
    for (int i = 0; i < mach->n_accel; i++)
        if (mach->accel[i].backend == b)
            return &mach->accel[i];
    return NULL;
}

static const char *rank_name(const struct kt_rank_input *in)
{
    return in->name ? in->name : "machine";
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
    /* each device rank's budget: --gpu-memory's, else its machine file's */
    double budget_gib[KT_RANK_PLAN_MAX] = {0};
    bool devices = false;
    for (int r = 0; r < n_ranks; r++) {
        if (in[r].device == KT_PLACE_CPU)
            continue;
        const struct kt_machine_accel *a = machine_accel(in[r].mach, in[r].device);
        if (!a)
            return kt_err_set(err, KT_ERR_INVALID, "%s: rank %d (%s): the machine file has no %s accelerator", name,
                              r, rank_name(&in[r]), kt_place_backend_name(in[r].device));
        budget_gib[r] = o->gpu_memory_gib > 0 ? o->gpu_memory_gib : (double)a->memory_bytes / GIB;
        if (!(budget_gib[r] > 0))
            return kt_err_set(err, KT_ERR_INVALID, "%s: rank %d (%s): its %s accelerator has no memory budget (the "
                              "machine file says 0 GiB): give --gpu-memory", name, r, rank_name(&in[r]),
                              kt_place_backend_name(in[r].device));
        devices = true;
    }
    struct kt_rank_plan *rp = calloc(1, sizeof *rp);
    const size_t cells = (size_t)n_ranks * L;
    struct figures f = {.L = L, .obj = calloc(cells, sizeof(double)), .dec = calloc(cells, sizeof(double)),
                        .pre = calloc(cells, sizeof(double)), .bytes = calloc(cells, sizeof(uint64_t)),
                        .dev_bytes = calloc(cells, sizeof(uint64_t))};
    struct kt_cost_layer *cl = calloc(L, sizeof *cl);
    struct kt_plan *est[KT_RANK_PLAN_MAX] = {0};
    kt_status st = KT_OK;
    if (!rp || !f.obj || !f.dec || !f.pre || !f.bytes || !f.dev_bytes || !cl) {
        st = kt_err_set(err, KT_ERR_NOMEM, "out of memory");
        goto fail;
    }
    rp->n_ranks = n_ranks;
    f.head_bytes = bytes_of(m->token_embd) + bytes_of(m->output_norm) + (m->output_tied ? 0 : bytes_of(m->output));
    uint32_t first[KT_RANK_PLAN_MAX], even[KT_RANK_PLAN_MAX], prev[KT_RANK_PLAN_MAX], n_est[KT_RANK_PLAN_MAX];
    for (int r = 0; r < n_ranks; r++) {
        const uint32_t n = (uint32_t)n_ranks, base = L / n, extra = L % n, rr = (uint32_t)r;
        even[r] = rr * base + (rr < extra ? rr : extra); /* runtime/dist's kt_pipeline_split */
        n_est[r] = base + (rr < extra ? 1 : 0);
        f.capacity[r] = machine_ram(in[r].mach);
    }
    /* estimates over the whole model, the device ranks' at their stages' density of device bytes, until the
     * split repeats */
    for (int round = 0; round < (devices ? KT_RANK_PLAN_ROUNDS : 1) && !st; round++) {
        for (int r = 0; r < n_ranks && !st; r++) {
            if (round > 0 && in[r].device == KT_PLACE_CPU)
                continue;
            kt_plan_destroy(est[r]);
            est[r] = NULL;
            struct kt_planner_options ro = *o;
            char source[96];
            ro.device = in[r].device;
            ro.stage_begin = ro.stage_end = 0;
            if (ro.device != KT_PLACE_CPU) {
                ro.gpu_memory_gib = budget_gib[r] * L / n_est[r];
                snprintf(source, sizeof source, "its %.3g GiB over the %u layers of its stage, for the estimate",
                         budget_gib[r], n_est[r]);
                ro.budget_source = source;
            }
            if ((st = kt_plan_create(m, name, prof, in[r].mach, in[r].cost, &ro, &est[r], err)) != KT_OK) {
                kt_err_prefix(err, "rank %d (%s)", r, rank_name(&in[r]));
                break;
            }
            est[r]->options.budget_source = NULL; /* for messages while planning: this frame's */
            if ((st = take_figures(&f, m, est[r], in[r].cost, r, 0, L, cl, err)) != KT_OK)
                break;
            if (est[r]->accel) {
                const struct kt_placement_device *d = &est[r]->placement->devices[est[r]->accel];
                f.dev_fixed[r] = d->part_bytes[KT_PART_WORK_BUFFERS];
                f.dev_capacity[r] = (uint64_t)(budget_gib[r] * GIB);
            }
        }
        if (!st && round == 0)
            take_links(&f, m, est[0], n_ranks, in);
        if (!st)
            st = split_of(&f, n_ranks, devices, first, err);
        if (st)
            break;
        rp->rounds = round + 1;
        if (round > 0 && !memcmp(first, prev, (size_t)n_ranks * sizeof *first))
            break;
        memcpy(prev, first, (size_t)n_ranks * sizeof *first);
        for (int r = 0; r < n_ranks; r++)
            n_est[r] = (r + 1 < n_ranks ? first[r + 1] : L) - first[r];
    }
    if (st) {
        if (st != KT_ERR_NOMEM)
            kt_err_prefix(err, "%s", name);
        goto fail;
    }
    fill_stages(rp, rp->even, even, &f); /* the even split by the estimates */
    /* the plans written: a CPU rank's whole-model one, a device rank's of its stage alone */
    for (int r = 0; r < n_ranks && !st; r++) {
        const uint32_t end = r + 1 < n_ranks ? first[r + 1] : L;
        if (in[r].device == KT_PLACE_CPU) {
            rp->plans[r] = est[r];
            est[r] = NULL;
            rp->plans[r]->layer_begin = first[r];
            rp->plans[r]->layer_end = end;
            continue;
        }
        struct kt_planner_options ro = *o;
        char source[96];
        ro.device = in[r].device;
        ro.gpu_memory_gib = budget_gib[r];
        ro.stage_begin = first[r];
        ro.stage_end = end;
        snprintf(source, sizeof source, "%s", o->gpu_memory_gib > 0 ? "--gpu-memory" : rank_name(&in[r]));
        ro.budget_source = source;
        if ((st = kt_plan_create(m, name, prof, in[r].mach, in[r].cost, &ro, &rp->plans[r], err)) != KT_OK) {
            kt_err_prefix(err, "%s: rank %d (%s), layers %u-%u", name, r, rank_name(&in[r]), first[r], end - 1);
            break;
        }
        rp->plans[r]->options.budget_source = NULL;
        st = take_figures(&f, m, rp->plans[r], in[r].cost, r, first[r], end, cl, err);
    }
    if (st)
        goto fail;
    fill_stages(rp, rp->stages, first, &f);
    rp->even_fits = true;
    for (int r = 0; r < n_ranks; r++) {
        rp->even_fits &= rp->even[r].fits;
        const struct kt_plan *plan = rp->plans[r];
        if (plan->accel) { /* what the stage's plan puts there, within the budget its resolution checked */
            rp->stages[r].device_bytes = plan->placement->devices[plan->accel].bytes;
            rp->stages[r].fits = fits(rp->stages[r].bytes, rp->stages[r].capacity) &&
                                 rp->stages[r].device_bytes <= rp->stages[r].device_capacity;
        }
    }
    for (int r = 0; r < n_ranks; r++)
        kt_plan_destroy(est[r]);
    free(f.obj), free(f.dec), free(f.pre), free(f.bytes), free(f.dev_bytes), free(cl);
    rp->plan_s = now_s() - t0;
    *out = rp;
    return KT_OK;
fail:
    for (int r = 0; r < n_ranks; r++)
        kt_plan_destroy(est[r]);
    free(f.obj), free(f.dec), free(f.pre), free(f.bytes), free(f.dev_bytes), free(cl);
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
    kt_text_put(t, "#   %s rank %d: layers %u-%u, decode %.4f ms, prefill %.4f ms, objective %.4f ms a token "
        "(link out %.4f ms a step, %.4f ms a prefill); %s of %s", label, r, s->first, s->last, 1e3 * s->decode_s,
        1e3 * s->prefill_s, 1e3 * s->objective_s, 1e3 * s->link_decode_s, 1e3 * s->link_prefill_s,
        kt_text_bytes(s->bytes, a, sizeof a), s->capacity ? kt_text_bytes(s->capacity, b, sizeof b) : "unknown RAM");
    if (s->device)
        kt_text_put(t, ", device %s of %s", kt_text_bytes(s->device_bytes, a, sizeof a),
            kt_text_bytes(s->device_capacity, b, sizeof b));
    kt_text_put(t, "%s\n", s->fits ? "" : " (does not fit)");
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
        kt_text_put(&t, "# rank %d planned on %s%s%s\n", r, in && in[r].name ? in[r].name : "its machine",
            rp->plans[r]->accel ? " with its accelerator " : "",
            rp->plans[r]->accel ? rp->plans[r]->placement->devices[rp->plans[r]->accel].name : "");
    kt_text_put(&t, "# predicted stages (rank 0 with the embedding and the head; each with sending its output on):\n");
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
