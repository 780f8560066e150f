/*
 * init.c - kt-synth's weight values: a counter-based seeding (splitmix64 over
 * seed, tensor and row) feeding xoshiro256**, uniform draws, and the router
 * skew.  Must never depend on which thread draws a row, or in which order.
 *
 * Scale.  A weight with fan-in n is uniform with std 1/sqrt(n), so a
 * projection of an RMS-normalised vector has entries of std ~1; projections
 * that write the residual stream are scaled down by a further 1/sqrt(2 L) so
 * the residual stays O(1) through every layer (synth.c picks the stds).
 *
 * Skew.  The DeepSeek router selects the top-k of score + exp_probs_b (the
 * bias picks experts but does not weight them; docs/deepseek2.md, MoE routing).  For a random
 * RMS-normalised hidden state the router rows (std 1/sqrt(E)) give logits z_e
 * that are ~N(0, 1) and independent across experts, so exp_probs_b alone
 * decides how often each expert is picked.  --skew S asks that the expert of
 * rank r (a seeded ranking per layer) be selected with frequency
 * f_r = min(1, c * r^-S), c such that the f_r sum to k (an expert is picked at
 * most once per token).  kt_synth_fit_skew finds the bias per rank that does
 * it on a fixed sample of N(0, 1) logits: each round every expert takes its
 * best response to the others' biases (the bias that wins exactly f_r * T of
 * the T sample tokens against the k-th best of the others), and the biases
 * move half way there; 16 rounds converge to within sampling noise.
 * Group-limited routing (V3) is left out of the fit on purpose: with it Zipf
 * rates are infeasible (two always-picked experts in different groups would
 * lock every other group out) and fitting toward them saturates the bias.  It
 * flattens the realised skew somewhat; the ranking still holds.  The router
 * rows themselves stay unskewed, so the routing weights (the unbiased
 * scores) keep their scale.
 *
 * Per layer.  --route-skew MIN:MAX gives each MoE layer its own exponent
 * (kt_synth_layer_skews); each distinct exponent is fitted once.
 *
 * Input.  --route-input R mixes each token's embedding with its class's
 * direction (route.h, fill_class_embedding) and gives router rows per-class
 * affinities (fill_class_router), scaled so logits stay ~N(0, 1) over a mix
 * of classes: the skew fit's assumption holds; attention carries the
 * context's non-prose classes (fill_attn_class).
 */
#include "init.h"
#include "route.h"

#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- random numbers -------------------------------------------------------------- */

static inline uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

#define GOLDEN 0x9e3779b97f4a7c15ULL

struct rng {
    uint64_t s[4];
};

/* A stream for (seed, a, b): the splitmix64 hash of the triple expanded into a
 * xoshiro256** state by splitmix64 steps (never all zero). */
static void rng_init(struct rng *r, uint64_t seed, uint64_t a, uint64_t b)
{
    uint64_t key = mix64(seed + GOLDEN);
    key = mix64(key ^ (a + 1) * GOLDEN);
    key = mix64(key ^ (b + 1) * 0xd1b54a32d192ed03ULL);
    for (int i = 0; i < 4; i++) {
        key += GOLDEN;
        r->s[i] = mix64(key);
    }
}

static inline uint64_t rotl(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

static inline uint64_t rng_next(struct rng *r)
{
    uint64_t *s = r->s;
    const uint64_t out = rotl(s[1] * 5, 7) * 9;
    const uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return out;
}

/* n values uniform on (-a, a) (std a/sqrt(3)) plus offset: two 24-bit draws per
 * 64-bit output, as the odd integers -(2^24-1) .. 2^24-1 so the mean is 0. */
static void fill_uniform(struct rng *r, float *out, int64_t n, float std, float offset)
{
    const float scale = std * 1.7320508075688772f / 16777216.0f;
    int64_t i = 0;
    for (; i + 1 < n; i += 2) {
        uint64_t x = rng_next(r);
        int32_t u0 = (int32_t)(x >> 40) * 2 - 16777215;
        int32_t u1 = (int32_t)((x >> 16) & 0xffffff) * 2 - 16777215;
        out[i] = (float)u0 * scale + offset;
        out[i + 1] = (float)u1 * scale + offset;
    }
    if (i < n) {
        int32_t u0 = (int32_t)(rng_next(r) >> 40) * 2 - 16777215;
        out[i] = (float)u0 * scale + offset;
    }
}

/* ---- router skew ----------------------------------------------------------------- */

#define RANK_STREAM 0x52414e4bULL /* "RANK": keeps ranking streams apart from tensor rows */

void kt_synth_rank_experts(uint64_t seed, uint32_t layer, uint32_t n_expert, uint32_t *rank_of_expert)
{
    struct rng r;
    rng_init(&r, seed ^ RANK_STREAM, UINT64_MAX - 1, layer);
    for (uint32_t e = 0; e < n_expert; e++)
        rank_of_expert[e] = e + 1;
    for (uint32_t i = n_expert; i > 1; i--) { /* Fisher-Yates */
        uint32_t j = (uint32_t)(rng_next(&r) % i);
        uint32_t t = rank_of_expert[i - 1];
        rank_of_expert[i - 1] = rank_of_expert[j];
        rank_of_expert[j] = t;
    }
}

/* f_r = min(1, c r^-S) with sum k: the largest ranks are capped one by one. */
static void zipf_targets(uint32_t n, uint32_t k, double skew, double *f)
{
    uint32_t capped = 0;
    double c = 0;
    for (;;) {
        double rest = 0;
        for (uint32_t r = capped + 1; r <= n; r++)
            rest += pow((double)r, -skew);
        c = (double)(k - capped) / rest;
        if (capped + 1 < k && c * pow((double)(capped + 1), -skew) > 1.0)
            capped++;
        else
            break;
    }
    for (uint32_t r = 1; r <= n; r++)
        f[r - 1] = r <= capped ? 1.0 : fmin(1.0, c * pow((double)r, -skew));
}

static double rng_normal(struct rng *r)
{
    /* Only the calibration sample is normal; weights are uniform. */
    double u1 = ((double)(rng_next(r) >> 11) + 1.0) * 0x1p-53;
    double u2 = (double)(rng_next(r) >> 11) * 0x1p-53;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

#define FIT_ROUNDS 16
#define FIT_STEP 0.5 /* damping: move half way to each round's best response */
#define FIT_STREAM 0x534b4557ULL /* "SKEW" */

/* The calibration sample and scratch of one fit. */
struct skew_fit {
    uint32_t n, k, T;
    float *score;       /* [n][T] router scores of N(0, 1) logits, expert-major */
    float *kth, *kth1;  /* [T] k-th and (k+1)-th largest score + bias of each token */
    float *gap;         /* [T] per expert: the bias it would need to be picked in token t */
    float *topv;        /* [T][k+1] running top-(k+1) of each token, descending */
    uint32_t *n_top;    /* [T] entries used in topv */
};

/* The k-th and (k+1)-th largest of score + b in every token of the sample,
 * walking the sample in memory order. */
static void thresholds(struct skew_fit *f, const double *b)
{
    const uint32_t kk = f->k + 1;
    memset(f->n_top, 0, f->T * sizeof *f->n_top);
    for (uint32_t e = 0; e < f->n; e++) {
        const float *se = f->score + (size_t)e * f->T, be = (float)b[e];
        for (uint32_t t = 0; t < f->T; t++) {
            float x = se[t] + be, *tv = f->topv + (size_t)t * kk;
            uint32_t m = f->n_top[t];
            if (m == kk && x <= tv[kk - 1])
                continue;
            uint32_t i = m < kk ? m++ : kk - 1;
            for (; i > 0 && tv[i - 1] < x; i--)
                tv[i] = tv[i - 1];
            tv[i] = x;
            f->n_top[t] = m;
        }
    }
    for (uint32_t t = 0; t < f->T; t++) {
        f->kth[t] = f->topv[(size_t)t * kk + f->k - 1];
        f->kth1[t] = f->topv[(size_t)t * kk + f->k];
    }
}

static void swap_f(float *x, uint32_t i, uint32_t j)
{
    float t = x[i];
    x[i] = x[j];
    x[j] = t;
}

/* The i-th smallest of x[0..n) (quickselect, three-way partition).  Reorders
 * x so that x[0..i) <= x[i] <= x[i+1..n). */
static float select_nth(float *x, uint32_t n, uint32_t i)
{
    uint32_t lo = 0, hi = n; /* the answer is in [lo, hi) */
    while (hi - lo > 1) {
        const float pivot = x[lo + (hi - lo) / 2];
        uint32_t lt = lo, j = lo, gt = hi; /* [lo,lt) < pivot, [lt,j) == pivot, [gt,hi) > pivot */
        while (j < gt) {
            if (x[j] < pivot)
                swap_f(x, lt++, j++);
            else if (x[j] > pivot)
                swap_f(x, j, --gt);
            else
                j++;
        }
        if (i < lt)
            hi = lt;
        else if (i >= gt)
            lo = gt;
        else
            return pivot;
    }
    return x[lo];
}

/* out[r - 1]: the bias of the expert of rank r for one exponent (see above). */
static kt_status fit_one(const struct kt_synth_config *c, double skew, float *out, kt_err *err)
{
    const uint32_t n = c->n_expert, k = c->n_expert_used;
    memset(out, 0, n * sizeof *out);
    if (skew == 0 || k >= n)
        return KT_OK;
    struct skew_fit f = {.n = n, .k = k};
    f.T = 128 * n / k; /* ~128 picks per expert on average */
    f.T = f.T < 2048 ? 2048 : f.T > 8192 ? 8192 : f.T;
    f.score = malloc((size_t)f.T * n * sizeof *f.score);
    f.kth = malloc(f.T * sizeof *f.kth);
    f.kth1 = malloc(f.T * sizeof *f.kth1);
    f.gap = malloc(f.T * sizeof *f.gap);
    f.topv = malloc((size_t)f.T * (k + 1) * sizeof *f.topv);
    f.n_top = malloc(f.T * sizeof *f.n_top);
    double *target = malloc(n * sizeof *target), *b = calloc(n, sizeof *b), *best = malloc(n * sizeof *best);
    kt_status s = KT_OK;
    if (!f.score || !f.kth || !f.kth1 || !f.gap || !f.topv || !f.n_top || !target || !b || !best) {
        s = kt_err_set(err, KT_ERR_NOMEM, "out of memory fitting the router skew");
        goto done;
    }
    struct rng r;
    rng_init(&r, FIT_STREAM, n, c->gating);
    float *sum = calloc(f.T, sizeof *sum); /* softmax denominators */
    if (!sum) {
        s = kt_err_set(err, KT_ERR_NOMEM, "out of memory fitting the router skew");
        goto done;
    }
    for (uint32_t t = 0; t < f.T; t++) {
        for (uint32_t e = 0; e < n; e++) {
            double z = rng_normal(&r);
            float v = (float)(c->gating == 1 ? exp(z) : 1.0 / (1.0 + exp(-z)));
            f.score[(size_t)e * f.T + t] = v;
            sum[t] += v;
        }
    }
    if (c->gating == 1)
        for (uint32_t e = 0; e < n; e++)
            for (uint32_t t = 0; t < f.T; t++)
                f.score[(size_t)e * f.T + t] /= sum[t];
    free(sum);
    /* Expert e of the sample is the expert of rank e + 1.  Each round, every
     * expert's best response to the others' biases: in token t it is picked
     * iff score + b beats the k-th largest of the others, i.e. iff b exceeds
     * gap_t; the bias picking it in target*T tokens is that quantile of gap. */
    zipf_targets(n, k, skew, target);
    for (int round = 0; round < FIT_ROUNDS; round++) {
        thresholds(&f, b);
        for (uint32_t e = 0; e < n; e++) {
            for (uint32_t t = 0; t < f.T; t++) {
                float st = f.score[(size_t)e * f.T + t];
                float others = st + (float)b[e] >= f.kth[t] ? f.kth1[t] : f.kth[t]; /* k-th largest without e */
                f.gap[t] = others - st;
            }
            double want = target[e] * f.T;
            uint32_t m = (uint32_t)(want + 0.5);
            if (m == 0)
                best[e] = select_nth(f.gap, f.T, 0) - 1e-3;
            else if (m >= f.T)
                best[e] = select_nth(f.gap, f.T, f.T - 1) + 1e-3;
            else { /* between the m-th and (m+1)-th smallest gaps */
                float lo = select_nth(f.gap, f.T, m - 1), hi = f.gap[m];
                for (uint32_t t = m + 1; t < f.T; t++) /* select_nth left the larger ones above m-1 */
                    hi = f.gap[t] < hi ? f.gap[t] : hi;
                best[e] = 0.5 * ((double)lo + (double)hi);
            }
        }
        for (uint32_t e = 0; e < n; e++) {
            b[e] += FIT_STEP * (best[e] - b[e]);
            /* scores lie in (0, 1): beyond +-2 an expert is always or never picked */
            b[e] = b[e] < -2.0 ? -2.0 : b[e] > 2.0 ? 2.0 : b[e];
        }
    }
    double mean = 0;
    for (uint32_t e = 0; e < n; e++)
        mean += b[e] / n;
    for (uint32_t e = 0; e < n; e++)
        out[e] = (float)(b[e] - mean);
done:
    free(f.score);
    free(f.kth);
    free(f.kth1);
    free(f.gap);
    free(f.topv);
    free(f.n_top);
    free(target);
    free(b);
    free(best);
    return s;
}


/* Layers whose exponent no earlier MoE layer has: each is fitted once, on
 * fit_workers threads taking them in turn (fits are independent and each is
 * deterministic, so the thread count never changes a byte). */
struct fit_work {
    struct kt_synth_plan *plan;
    const uint32_t *layers;     /* [n_layers] to fit */
    uint32_t n_layers, stride, first;
    kt_status status;
    kt_err err;
};

static void *fit_worker(void *arg)
{
    struct fit_work *w = arg;
    const uint32_t n = w->plan->cfg.n_expert;
    for (uint32_t i = w->first; i < w->n_layers && w->status == KT_OK; i += w->stride) {
        const uint32_t l = w->layers[i];
        w->status = fit_one(&w->plan->cfg, w->plan->layer_skew[l], w->plan->skew_bias + (size_t)l * n, &w->err);
    }
    return NULL;
}

kt_status kt_synth_fit_skew(struct kt_synth_plan *plan, kt_err *err)
{
    const struct kt_synth_config *c = &plan->cfg;
    const uint32_t n = c->n_expert;
    uint32_t fit[KT_SYNTH_MAX_LAYERS], n_fit = 0, same_as[KT_SYNTH_MAX_LAYERS];
    for (uint32_t l = plan->n_dense_lead; l < c->n_layer; l++) {
        uint32_t same = plan->n_dense_lead; /* the first MoE layer of the same exponent */
        while (same < l && plan->layer_skew[same] != plan->layer_skew[l])
            same++;
        same_as[l] = same;
        if (same == l)
            fit[n_fit++] = l;
    }
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    uint32_t n_threads = c->n_threads ? c->n_threads : online > 0 ? (uint32_t)online : 1;
    n_threads = n_threads < n_fit ? n_threads : n_fit;
    struct fit_work work[64];
    pthread_t threads[64];
    n_threads = n_threads > 64 ? 64 : n_threads < 1 ? 1 : n_threads;
    bool started[64] = {false};
    for (uint32_t t = 0; t < n_threads; t++)
        work[t] = (struct fit_work){.plan = plan, .layers = fit, .n_layers = n_fit, .stride = n_threads, .first = t};
    for (uint32_t t = 1; t < n_threads; t++)
        started[t] = pthread_create(&threads[t], NULL, fit_worker, &work[t]) == 0;
    fit_worker(&work[0]);
    for (uint32_t t = 1; t < n_threads; t++) {
        if (started[t])
            pthread_join(threads[t], NULL);
        else
            fit_worker(&work[t]); /* it could not start: this thread does its share */
    }
    kt_status s = KT_OK;
    for (uint32_t t = 0; t < n_threads && s == KT_OK; t++)
        if (work[t].status != KT_OK)
            s = kt_err_set(err, work[t].status, "%s", work[t].err.msg);
    for (uint32_t l = 0; l < c->n_layer; l++) {
        float *out = plan->skew_bias + (size_t)l * n;
        if (l < plan->n_dense_lead)
            memset(out, 0, n * sizeof *out);
        else if (same_as[l] != l)
            memcpy(out, plan->skew_bias + (size_t)same_as[l] * n, n * sizeof *out);
    }
    return s;
}

#define LAYER_SKEW_STREAM 0x4c534b57ULL /* "LSKW" */

void kt_synth_layer_skews(struct kt_synth_plan *plan)
{
    const struct kt_synth_config *c = &plan->cfg;
    const uint32_t L = c->n_layer, D = plan->n_dense_lead, M = L - D;
    uint32_t order[KT_SYNTH_MAX_LAYERS];
    for (uint32_t j = 0; j < M; j++)
        order[j] = j;
    struct rng r;
    rng_init(&r, c->seed ^ LAYER_SKEW_STREAM, UINT64_MAX - 2, 0);
    for (uint32_t i = M; i > 1; i--) { /* Fisher-Yates */
        uint32_t j = (uint32_t)(rng_next(&r) % i), t = order[i - 1];
        order[i - 1] = order[j];
        order[j] = t;
    }
    for (uint32_t l = 0; l < L; l++) {
        if (l < D)
            plan->layer_skew[l] = 0;
        else if (c->skew_max <= c->skew || M == 1)
            plan->layer_skew[l] = c->skew;
        else
            plan->layer_skew[l] = c->skew + (c->skew_max - c->skew) * order[l - D] / (M - 1);
    }
}

#define CLASS_STREAM 0x434c4153ULL /* "CLAS" */

void kt_synth_class_directions(struct kt_synth_plan *plan)
{
    const uint32_t E = plan->cfg.n_embd;
    struct rng r;
    rng_init(&r, plan->cfg.seed ^ CLASS_STREAM, UINT64_MAX - 3, 0);
    for (uint32_t c = 0; c < KT_SYNTH_CLASS_COUNT; c++) {
        float *u = plan->class_dir + (size_t)c * E;
        for (uint32_t i = 0; i < E; i++)
            u[i] = (float)rng_normal(&r);
        for (int pass = 0; pass < 2; pass++) /* Gram-Schmidt, twice for float accuracy */
            for (uint32_t p = 0; p < c; p++) {
                const float *v = plan->class_dir + (size_t)p * E;
                double dot = 0;
                for (uint32_t i = 0; i < E; i++)
                    dot += (double)u[i] * v[i];
                for (uint32_t i = 0; i < E; i++)
                    u[i] -= (float)(dot * v[i]);
            }
        double ss = 0;
        for (uint32_t i = 0; i < E; i++)
            ss += (double)u[i] * u[i];
        const double inv = 1.0 / sqrt(ss);
        for (uint32_t i = 0; i < E; i++)
            u[i] = (float)(u[i] * inv);
    }
}

static void fill_router_bias(const struct kt_synth_plan *plan, uint32_t layer, struct rng *r, float *out,
                             float noise_std)
{
    uint32_t n = plan->cfg.n_expert;
    uint32_t rank[KT_SYNTH_MAX_EXPERTS];
    kt_synth_rank_experts(plan->cfg.seed, layer, n, rank);
    fill_uniform(r, out, n, noise_std, 0.0f);
    const float *bias = plan->skew_bias + (size_t)layer * n;
    for (uint32_t e = 0; e < n; e++)
        out[e] += bias[rank[e] - 1];
}

/* Token `token`'s embedding: sqrt(1 - R) parts uniform noise of std `std` and
 * sqrt(R) parts its class direction scaled to the same RMS (std sqrt(E) * u
 * has RMS std), R = route_input; a token without a class is noise alone. */
static void fill_class_embedding(const struct kt_synth_plan *plan, uint64_t token, struct rng *r, float *out,
                                 int64_t n, float std)
{
    const unsigned c = token < plan->vocab.n_tokens ? plan->token_class[token] : KT_SYNTH_CLASS_NONE;
    if (c >= KT_SYNTH_CLASS_COUNT) {
        fill_uniform(r, out, n, std, 0.0f);
        return;
    }
    const double R = plan->cfg.route_input;
    fill_uniform(r, out, n, (float)(std * sqrt(1.0 - R)), 0.0f);
    const float *u = plan->class_dir + (size_t)c * (size_t)n;
    const float a = (float)(std * sqrt(R * (double)n));
    for (int64_t i = 0; i < n; i++)
        out[i] += a * u[i];
}


#define AFFINITY_STREAM 0x41464654ULL /* "AFFT" */

/* Router row of expert `expert` in `layer`: sqrt(1 - R) parts the usual noise
 * (std `std` = 1/sqrt(E)) plus sum_c a_c u_c / sqrt(E), a_c ~ N(0, 1) seeded
 * per (layer, expert, class).  For a state sqrt(1-R) n + sqrt(R E) u_c the
 * logit is sqrt(1-R)^2 noise + a class-fixed part of variance R (2 - R):
 * still ~N(0, 1) over tokens (the skew fit's assumption), but a share
 * R (2 - R) of it is decided by the class. */
static void fill_class_router(const struct kt_synth_plan *plan, uint32_t layer, uint64_t expert, struct rng *r,
                              float *out, int64_t n, float std)
{
    const double R = plan->cfg.route_input;
    fill_uniform(r, out, n, (float)(std * sqrt(1.0 - R)), 0.0f);
    struct rng ra;
    rng_init(&ra, plan->cfg.seed ^ AFFINITY_STREAM, layer, expert);
    for (uint32_t c = 0; c < KT_SYNTH_CLASS_COUNT; c++) {
        const float a = (float)(rng_normal(&ra) / sqrt((double)n));
        const float *u = plan->class_dir + (size_t)c * (size_t)n;
        for (int64_t i = 0; i < n; i++)
            out[i] += a * u[i];
    }
}


/* Attention carries the context's non-prose classes (route.h, Context):
 * latent dim c (c = code, digits, script) of attn_kv_a_mqa reads u_c
 * (KV_CLASS_LATENT for a token of class c, ~0 otherwise), value dim c of
 * every head copies latent dim c, and attn_output writes value dim c of
 * every head along u_c, so each position's residual gains up to
 * CONTEXT_CLASS_SHARE x sqrt(R E) u_c per layer (a context all of class c;
 * its attention-weighted share otherwise): half of a token's own class.
 * Stronger sharing made every position alike (measured in
 * test_synth_routing: 1.0 and 2.0 set the sets closer, 0.3 code too close to
 * prose).  Prose is not carried: it is what the chat template speaks. */
#define KV_CLASS_LATENT 3.0
#define CONTEXT_CLASS_SHARE 0.5
static void fill_attn_class(const struct kt_synth_plan *plan, const struct kt_synth_tensor *t, uint64_t row,
                            struct rng *r, float *out)
{
    const struct kt_synth_config *c = &plan->cfg;
    const int64_t n = t->ne[0];
    const double R = c->route_input, E = c->n_embd;
    fill_uniform(r, out, n, t->init_std, 0.0f);
    switch ((enum kt_synth_init)t->init) {
    case KT_SYNTH_INIT_KV_A_CLASS: /* row = latent dim, n = E */
        if (row < KT_SYNTH_CLASS_COUNT && row != KT_SYNTH_CLASS_PROSE) {
            const float *u = plan->class_dir + row * (uint64_t)n, a = (float)(KV_CLASS_LATENT / sqrt(R * E));
            for (int64_t i = 0; i < n; i++)
                out[i] += a * u[i];
        }
        break;
    case KT_SYNTH_INIT_V_B_CLASS: /* row = head * dv + value dim, n = kvr */
        if (row % c->v_head_dim < KT_SYNTH_CLASS_COUNT && row % c->v_head_dim != KT_SYNTH_CLASS_PROSE)
            out[row % c->v_head_dim] += 1.0f;
        break;
    case KT_SYNTH_INIT_OUT_CLASS: { /* row = residual dim, n = H * dv */
        const float a = (float)(CONTEXT_CLASS_SHARE * sqrt(R * E) / (c->n_head * KV_CLASS_LATENT));
        for (uint32_t h = 0; h < c->n_head; h++)
            for (uint32_t k = KT_SYNTH_CLASS_PROSE + 1; k < KT_SYNTH_CLASS_COUNT; k++)
                out[(size_t)h * c->v_head_dim + k] += a * plan->class_dir[(size_t)k * (size_t)E + row];
        break;
    }
    default:
        break;
    }
}

/* ---- rows ------------------------------------------------------------------------ */

void kt_synth_init_row(const struct kt_synth_plan *plan, uint32_t tensor_index, uint64_t row, float *out)
{
    const struct kt_synth_tensor *t = &plan->tensors[tensor_index];
    struct rng r;
    rng_init(&r, plan->cfg.seed, tensor_index, row);
    switch ((enum kt_synth_init)t->init) {
    case KT_SYNTH_INIT_UNIFORM:
        fill_uniform(&r, out, t->ne[0], t->init_std, 0.0f);
        break;
    case KT_SYNTH_INIT_NORM:
        fill_uniform(&r, out, t->ne[0], t->init_std, 1.0f);
        break;
    case KT_SYNTH_INIT_ROUTER_BIAS:
        fill_router_bias(plan, (uint32_t)t->layer, &r, out, t->init_std);
        break;
    case KT_SYNTH_INIT_EMBED_CLASS:
        fill_class_embedding(plan, row, &r, out, t->ne[0], t->init_std);
        break;
    case KT_SYNTH_INIT_ROUTER_CLASS:
        fill_class_router(plan, (uint32_t)t->layer, row, &r, out, t->ne[0], t->init_std);
        break;
    case KT_SYNTH_INIT_KV_A_CLASS:
    case KT_SYNTH_INIT_V_B_CLASS:
    case KT_SYNTH_INIT_OUT_CLASS:
        fill_attn_class(plan, t, row, &r, out);
        break;
    }
}
