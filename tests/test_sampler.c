/*
 * test_sampler.c - the per-sequence sampler: greedy and its limits, seeded
 * determinism, the distributions drawn under temperature, top-k, top-p and
 * min-p, exact penalty / bias / ban arithmetic, raw log-probabilities, hostile
 * logits and parameter validation, at toy and at Kimi-K2 vocabulary size.
 *
 * Expected distributions and kept sets are worked out by hand (or by a naive
 * sort in double precision here), never by calling the sampler a second way.
 * Draws use fixed seeds, so every bound is deterministic.  This program must
 * never time-assert: the throughput lines are information, not checks.
 */
#include "testlib.h"

#include "sampler.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define KIMI_VOCAB 163840
#define N_DRAWS 200000
/* Chi-square bound for <= 8 degrees of freedom: p < 1e-6 under the null. */
#define CHI2_BOUND 40.0

/* ---------------------------------------------------------------------------- */
/* helpers                                                                       */
/* ---------------------------------------------------------------------------- */

static struct kt_sampler *make_sampler(const struct kt_sampler_params *params, uint32_t n_vocab,
                                       const int32_t *prompt, size_t n_prompt)
{
    struct kt_sampler *s = NULL;
    kt_err err = {0};
    kt_status st = kt_sampler_create(params, n_vocab, prompt, n_prompt, &s, &err);
    if (st != KT_OK) {
        fprintf(stderr, "kt_sampler_create: %s\n", err.msg);
        exit(2);
    }
    return s;
}

/* Samples once from a copy of logits (the sampler overwrites its input). */
static int32_t sample_copy(struct kt_sampler *s, const float *logits, float *work, uint32_t n)
{
    kt_err err = {0};
    int32_t token = -1;
    memcpy(work, logits, n * sizeof *work);
    kt_status st = kt_sampler_sample(s, work, &token, &err);
    KT_CHECK(st == KT_OK, "sample failed: %s", err.msg);
    return token;
}

/* Draws n_draws tokens from one sampler and counts them per token. */
static void draw_counts(const struct kt_sampler_params *params, const float *logits, uint32_t n,
                        int n_draws, long *counts)
{
    struct kt_sampler *s = make_sampler(params, n, NULL, 0);
    float *work = kt_test_xmalloc(n * sizeof *work);
    memset(counts, 0, n * sizeof *counts);
    for (int d = 0; d < n_draws; d++) {
        int32_t t = sample_copy(s, logits, work, n);
        if (t >= 0 && (uint32_t)t < n)
            counts[t]++;
    }
    free(work);
    kt_sampler_destroy(s);
}

/* softmax(logits / temperature) restricted to the tokens with keep[i], in double. */
static void softmax_kept(const float *logits, uint32_t n, double temperature, const bool *keep,
                         double *probs)
{
    double max = -INFINITY, total = 0.0;
    for (uint32_t i = 0; i < n; i++)
        if (keep[i] && logits[i] > max)
            max = logits[i];
    for (uint32_t i = 0; i < n; i++) {
        probs[i] = keep[i] ? exp(((double)logits[i] - max) / temperature) : 0.0;
        total += probs[i];
    }
    for (uint32_t i = 0; i < n; i++)
        probs[i] /= total;
}

/* Checks counts against probs: no draw where probs is 0, chi-square elsewhere. */
static void check_distribution(const char *what, const long *counts, const double *probs,
                               uint32_t n, int n_draws)
{
    double chi2 = 0.0;
    for (uint32_t i = 0; i < n; i++) {
        if (probs[i] == 0.0) {
            KT_CHECK(counts[i] == 0, "%s: token %u drawn %ld times but must never be", what, i,
                     counts[i]);
            continue;
        }
        double expected = probs[i] * n_draws;
        chi2 += (counts[i] - expected) * (counts[i] - expected) / expected;
    }
    KT_CHECK(chi2 < CHI2_BOUND, "%s: chi-square %.2f over %d draws exceeds %.0f", what, chi2,
             n_draws, CHI2_BOUND);
}

/* Logits whose softmax at temperature 1 is exactly probs (up to float rounding). */
static void logits_from_probs(const double *probs, uint32_t n, float *logits)
{
    for (uint32_t i = 0; i < n; i++)
        logits[i] = (float)log(probs[i]);
}

static void random_logits(unsigned long long *rng, float *logits, uint32_t n, float scale)
{
    for (uint32_t i = 0; i < n; i++)
        logits[i] = scale * kt_test_rand_normal(rng);
}

/* Ranking order: value descending, token id ascending. */
static const float *rank_values;
static int by_rank(const void *a, const void *b)
{
    int32_t i = *(const int32_t *)a, j = *(const int32_t *)b;
    if (rank_values[i] != rank_values[j])
        return rank_values[i] > rank_values[j] ? -1 : 1;
    return i < j ? -1 : 1;
}

static int32_t *ranked_ids(const float *logits, uint32_t n)
{
    int32_t *ids = kt_test_xmalloc(n * sizeof *ids);
    for (uint32_t i = 0; i < n; i++)
        ids[i] = (int32_t)i;
    rank_values = logits;
    qsort(ids, n, sizeof *ids, by_rank);
    return ids;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---------------------------------------------------------------------------- */
/* greedy                                                                        */
/* ---------------------------------------------------------------------------- */

static void greedy_picks_argmax_and_lowest_id_on_ties(void)
{
    struct kt_sampler_params p = kt_sampler_params_default();
    p.temperature = 0.0f;
    const float unique[6] = {0.5f, -1.0f, 3.25f, 3.0f, -INFINITY, 2.0f};
    const float tied[6] = {1.0f, 4.0f, -2.0f, 4.0f, 4.0f, 3.9f};
    float work[6];
    struct kt_sampler *s = make_sampler(&p, 6, NULL, 0);
    for (int r = 0; r < 20; r++) {
        int32_t a = sample_copy(s, unique, work, 6);
        int32_t b = sample_copy(s, tied, work, 6);
        KT_CHECK(a == 2, "greedy picked %d, argmax is 2", a);
        KT_CHECK(b == 1, "greedy picked %d among ties 1, 3, 4: lowest id is 1", b);
    }
    KT_CHECK(kt_sampler_n_generated(s) == 40, "recorded %llu generated tokens, expected 40",
             (unsigned long long)kt_sampler_n_generated(s));
    KT_CHECK(kt_sampler_generated_count(s, 2) == 20 && kt_sampler_generated_count(s, 1) == 20 &&
                 kt_sampler_generated_count(s, 0) == 0,
             "per-token generated counts wrong: %u %u %u", kt_sampler_generated_count(s, 2),
             kt_sampler_generated_count(s, 1), kt_sampler_generated_count(s, 0));
    kt_sampler_destroy(s);
}

static void small_temperature_matches_greedy(void)
{
    enum { V = 500 };
    float logits[V], work[V];
    unsigned long long rng = 7;
    /* A shuffled ladder 0.00, 0.01, ...: every gap is >= 0.01, so at T = 1e-4
     * the runner-up has probability e^-100 against the maximum. */
    for (int i = 0; i < V; i++)
        logits[i] = 0.01f * (float)i;
    for (int i = V - 1; i > 0; i--) {
        int j = (int)(kt_test_rand_u64(&rng) % (unsigned long long)(i + 1));
        float t = logits[i];
        logits[i] = logits[j];
        logits[j] = t;
    }
    struct kt_sampler_params greedy = kt_sampler_params_default();
    greedy.temperature = 0.0f;
    struct kt_sampler *g = make_sampler(&greedy, V, NULL, 0);
    const float temperatures[3] = {1e-4f, 3e-5f, KT_SAMPLER_GREEDY_TEMPERATURE};
    for (int k = 0; k < 3; k++) {
        struct kt_sampler_params p = kt_sampler_params_default();
        p.temperature = temperatures[k];
        p.seed = 99 + (uint64_t)k;
        struct kt_sampler *s = make_sampler(&p, V, NULL, 0);
        int mismatches = 0;
        for (int r = 0; r < 200; r++) {
            /* rotate the logits so the argmax moves */
            float rotated[V];
            for (int i = 0; i < V; i++)
                rotated[i] = logits[(i + 37 * r) % V];
            if (sample_copy(s, rotated, work, V) != sample_copy(g, rotated, work, V))
                mismatches++;
        }
        KT_CHECK(mismatches == 0, "T=%g: %d of 200 draws differ from greedy",
                 (double)temperatures[k], mismatches);
        kt_sampler_destroy(s);
    }
    kt_sampler_destroy(g);
}

static void top_k_one_equals_greedy(void)
{
    enum { V = 4096 };
    float *logits = kt_test_xmalloc(V * sizeof *logits), *work = kt_test_xmalloc(V * sizeof *work);
    unsigned long long rng = 11;
    struct kt_sampler_params gp = kt_sampler_params_default(), kp = kt_sampler_params_default();
    gp.temperature = 0.0f;
    kp.temperature = 1.5f;
    kp.top_k = 1;
    kp.seed = 5;
    struct kt_sampler *g = make_sampler(&gp, V, NULL, 0), *k = make_sampler(&kp, V, NULL, 0);
    int mismatches = 0;
    for (int r = 0; r < 100; r++) {
        random_logits(&rng, logits, V, 2.0f);
        /* Round to a coarse grid so the maximum is often tied. */
        for (int i = 0; i < V; i++)
            logits[i] = roundf(logits[i]);
        if (sample_copy(g, logits, work, V) != sample_copy(k, logits, work, V))
            mismatches++;
    }
    KT_CHECK(mismatches == 0, "top_k=1 differs from greedy on %d of 100 rows", mismatches);
    kt_sampler_destroy(g);
    kt_sampler_destroy(k);
    free(logits);
    free(work);
}

/* ---------------------------------------------------------------------------- */
/* determinism                                                                   */
/* ---------------------------------------------------------------------------- */

static void same_seed_repeats_and_other_seed_differs(void)
{
    enum { V = 1000, STEPS = 300 };
    float *logits = kt_test_xmalloc(V * sizeof *logits), *work = kt_test_xmalloc(V * sizeof *work);
    int32_t runs[3][STEPS];
    const uint64_t seeds[3] = {1234, 1234, 1235};
    for (int run = 0; run < 3; run++) {
        struct kt_sampler_params p = kt_sampler_params_default();
        p.temperature = 0.9f;
        p.top_p = 0.95f;
        p.frequency_penalty = 0.1f;
        p.seed = seeds[run];
        struct kt_sampler *s = make_sampler(&p, V, NULL, 0);
        unsigned long long rng = 77; /* the same logits sequence every run */
        for (int t = 0; t < STEPS; t++) {
            random_logits(&rng, logits, V, 1.0f);
            runs[run][t] = sample_copy(s, logits, work, V);
        }
        kt_sampler_destroy(s);
    }
    int same = 0, differ = 0;
    for (int t = 0; t < STEPS; t++) {
        same += runs[0][t] == runs[1][t];
        differ += runs[0][t] != runs[2][t];
    }
    KT_CHECK(same == STEPS, "same seed: only %d of %d tokens repeat", same, STEPS);
    KT_CHECK(differ > STEPS / 2, "another seed: only %d of %d tokens differ", differ, STEPS);
    free(logits);
    free(work);
}

/* top_k off (0, -1, >= V) and a top_k that keeps every live token all leave
 * the same survivors, so the same seed must draw the same tokens. */
static void top_k_keeping_every_live_token_changes_nothing(void)
{
    enum { V = 300, STEPS = 200, LIVE = V - 40 };
    float logits[V], work[V];
    unsigned long long rng = 3;
    random_logits(&rng, logits, V, 1.5f);
    for (int i = 0; i < V; i += V / 40)
        logits[i] = -INFINITY; /* 40 masked tokens */
    const int32_t top_ks[5] = {0, -1, V, V + 5, LIVE};
    int32_t seq[5][STEPS];
    for (int c = 0; c < 5; c++) {
        struct kt_sampler_params p = kt_sampler_params_default();
        p.top_k = top_ks[c];
        p.seed = 42;
        struct kt_sampler *s = make_sampler(&p, V, NULL, 0);
        for (int t = 0; t < STEPS; t++)
            seq[c][t] = sample_copy(s, logits, work, V);
        kt_sampler_destroy(s);
    }
    for (int c = 1; c < 5; c++) {
        int diff = 0;
        for (int t = 0; t < STEPS; t++)
            diff += seq[c][t] != seq[0][t];
        KT_CHECK(diff == 0, "top_k=%d: %d of %d tokens differ from top_k=0", top_ks[c], diff,
                 STEPS);
    }
}

/* ---------------------------------------------------------------------------- */
/* distributions                                                                 */
/* ---------------------------------------------------------------------------- */

static void draws_follow_softmax_over_temperature(void)
{
    const float logits[8] = {1.0f, 0.2f, -0.5f, 2.0f, 1.7f, 0.0f, -1.0f, 0.9f};
    const bool all[8] = {true, true, true, true, true, true, true, true};
    const float temperatures[3] = {0.7f, 1.0f, 1.8f};
    long counts[8];
    double probs[8];
    for (int k = 0; k < 3; k++) {
        struct kt_sampler_params p = kt_sampler_params_default();
        p.temperature = temperatures[k];
        p.seed = 2024 + (uint64_t)k;
        draw_counts(&p, logits, 8, N_DRAWS, counts);
        softmax_kept(logits, 8, temperatures[k], all, probs);
        char what[64];
        snprintf(what, sizeof what, "softmax at T=%.1f", (double)temperatures[k]);
        check_distribution(what, counts, probs, 8, N_DRAWS);
    }
    /* The bound has teeth: the T=0.7 draws are far from the T=1 softmax. */
    struct kt_sampler_params p = kt_sampler_params_default();
    p.temperature = 0.7f;
    p.seed = 2024;
    draw_counts(&p, logits, 8, N_DRAWS, counts);
    softmax_kept(logits, 8, 1.0, all, probs);
    double chi2 = 0.0;
    for (int i = 0; i < 8; i++)
        chi2 += (counts[i] - probs[i] * N_DRAWS) * (counts[i] - probs[i] * N_DRAWS) /
                (probs[i] * N_DRAWS);
    KT_CHECK(chi2 > 100 * CHI2_BOUND, "T=0.7 draws look like T=1 (chi-square %.1f)", chi2);
}

static void top_k_keeps_the_k_best_renormalised(void)
{
    const float logits[6] = {1.0f, 3.0f, 2.0f, 0.5f, 2.5f, -1.0f};
    const bool keep[6] = {false, true, true, false, true, false}; /* 3.0, 2.5, 2.0 */
    long counts[6];
    double probs[6];
    struct kt_sampler_params p = kt_sampler_params_default();
    p.top_k = 3;
    p.temperature = 1.3f;
    p.seed = 8;
    draw_counts(&p, logits, 6, N_DRAWS, counts);
    softmax_kept(logits, 6, 1.3, keep, probs);
    check_distribution("top_k=3", counts, probs, 6, N_DRAWS);
}

static void top_k_breaks_ties_by_lower_id(void)
{
    const float logits[5] = {1.0f, 2.0f, 2.0f, 2.0f, 0.0f};
    const bool keep[5] = {false, true, true, false, false};
    long counts[5];
    double probs[5];
    struct kt_sampler_params p = kt_sampler_params_default();
    p.top_k = 2;
    p.seed = 9;
    draw_counts(&p, logits, 5, N_DRAWS, counts);
    softmax_kept(logits, 5, 1.0, keep, probs);
    check_distribution("top_k=2 over a three-way tie", counts, probs, 5, N_DRAWS);
}

static void top_p_keeps_the_shortest_prefix_reaching_p(void)
{
    /* Ranked 0.4 (id 0), 0.25 (2), 0.2 (4), 0.1 (1), 0.05 (3): the mass ranked
     * above each is 0, 0.4, 0.65, 0.85, 0.95, so p = 0.7 keeps ids 0, 2, 4. */
    const double given[5] = {0.4, 0.1, 0.25, 0.05, 0.2};
    const bool keep[5] = {true, false, true, false, true};
    float logits[5];
    long counts[5];
    double probs[5];
    logits_from_probs(given, 5, logits);
    struct kt_sampler_params p = kt_sampler_params_default();
    p.top_p = 0.7f;
    p.seed = 10;
    draw_counts(&p, logits, 5, N_DRAWS, counts);
    softmax_kept(logits, 5, 1.0, keep, probs);
    check_distribution("top_p=0.7", counts, probs, 5, N_DRAWS);
}

static void top_p_ranks_ties_by_lower_id(void)
{
    /* 0.3, 0.3, 0.3, 0.1 with p = 0.5: id 0 (0 above), id 1 (0.3 above) stay;
     * id 2 has 0.6 ranked above it. */
    const double given[4] = {0.3, 0.3, 0.3, 0.1};
    const bool keep[4] = {true, true, false, false};
    float logits[4];
    long counts[4];
    double probs[4];
    logits_from_probs(given, 4, logits);
    struct kt_sampler_params p = kt_sampler_params_default();
    p.top_p = 0.5f;
    p.seed = 12;
    draw_counts(&p, logits, 4, N_DRAWS, counts);
    softmax_kept(logits, 4, 1.0, keep, probs);
    check_distribution("top_p=0.5 over ties", counts, probs, 4, N_DRAWS);
}

static void top_p_applies_to_the_top_k_renormalised(void)
{
    const double given[5] = {0.4, 0.25, 0.2, 0.1, 0.05};
    float logits[5];
    long counts[5];
    double probs[5];
    logits_from_probs(given, 5, logits);

    /* top_p alone: ranked-above masses 0, 0.4, 0.65 -> ids 0, 1. */
    const bool keep_p[5] = {true, true, false, false, false};
    struct kt_sampler_params p = kt_sampler_params_default();
    p.top_p = 0.6f;
    p.seed = 13;
    draw_counts(&p, logits, 5, N_DRAWS, counts);
    softmax_kept(logits, 5, 1.0, keep_p, probs);
    check_distribution("top_p=0.6", counts, probs, 5, N_DRAWS);

    /* top_k=2 first renormalises to 0.615, 0.385: id 1 has 0.615 >= 0.6 above it. */
    const bool keep_kp[5] = {true, false, false, false, false};
    p.top_k = 2;
    draw_counts(&p, logits, 5, N_DRAWS, counts);
    softmax_kept(logits, 5, 1.0, keep_kp, probs);
    check_distribution("top_k=2 then top_p=0.6", counts, probs, 5, N_DRAWS);
}

static void min_p_keeps_tokens_above_a_fraction_of_the_best(void)
{
    const double given[5] = {0.5, 0.2, 0.15, 0.1, 0.05};
    float logits[5];
    long counts[5];
    double probs[5];
    logits_from_probs(given, 5, logits);

    /* T=1, min_p 0.25: threshold 0.125 keeps 0.5, 0.2, 0.15. */
    const bool keep_a[5] = {true, true, true, false, false};
    struct kt_sampler_params p = kt_sampler_params_default();
    p.min_p = 0.25f;
    p.seed = 14;
    draw_counts(&p, logits, 5, N_DRAWS, counts);
    softmax_kept(logits, 5, 1.0, keep_a, probs);
    check_distribution("min_p=0.25", counts, probs, 5, N_DRAWS);

    /* min_p comes after temperature.  T=1, min_p 0.5: only 0.5 itself (0.2/0.5 = 0.4).
     * T=2 flattens to sqrt: ratios 1, 0.632, 0.548, 0.447, 0.316 -> ids 0, 1, 2. */
    const bool keep_b[5] = {true, false, false, false, false};
    const bool keep_c[5] = {true, true, true, false, false};
    p.min_p = 0.5f;
    draw_counts(&p, logits, 5, N_DRAWS, counts);
    softmax_kept(logits, 5, 1.0, keep_b, probs);
    check_distribution("min_p=0.5 at T=1", counts, probs, 5, N_DRAWS);
    p.temperature = 2.0f;
    draw_counts(&p, logits, 5, N_DRAWS, counts);
    softmax_kept(logits, 5, 2.0, keep_c, probs);
    check_distribution("min_p=0.5 at T=2", counts, probs, 5, N_DRAWS);
}

/* ---------------------------------------------------------------------------- */
/* masked and hostile logits                                                     */
/* ---------------------------------------------------------------------------- */

static void masked_tokens_are_never_drawn(void)
{
    enum { V = 64 };
    float logits[V], work[V];
    for (int i = 0; i < V; i++)
        logits[i] = -INFINITY;
    logits[41] = -3.0f;
    struct kt_sampler_params configs[4];
    for (int c = 0; c < 4; c++)
        configs[c] = kt_sampler_params_default();
    configs[0].temperature = 0.0f;
    configs[1].temperature = 2.0f;
    configs[2].top_k = 5;
    configs[2].top_p = 0.3f;
    configs[3].min_p = 0.9f;
    configs[3].presence_penalty = 1.0f;
    configs[3].repetition_penalty = 1.5f;
    for (int c = 0; c < 4; c++) {
        struct kt_sampler *s = make_sampler(&configs[c], V, NULL, 0);
        int wrong = 0;
        for (int r = 0; r < 100; r++)
            wrong += sample_copy(s, logits, work, V) != 41;
        KT_CHECK(wrong == 0, "config %d: drew a -inf token %d times", c, wrong);
        kt_sampler_destroy(s);
    }

    /* Masked tokens among live ones: never drawn, even at high temperature. */
    unsigned long long rng = 21;
    random_logits(&rng, logits, V, 1.0f);
    for (int i = 0; i < V; i += 2)
        logits[i] = -INFINITY;
    struct kt_sampler_params p = kt_sampler_params_default();
    p.temperature = 5.0f;
    struct kt_sampler *s = make_sampler(&p, V, NULL, 0);
    int even = 0;
    for (int r = 0; r < 5000; r++)
        even += sample_copy(s, logits, work, V) % 2 == 0;
    KT_CHECK(even == 0, "drew masked (even) tokens %d times", even);
    kt_sampler_destroy(s);
}

static void hostile_logits_are_rejected(void)
{
    enum { V = 16 };
    float logits[V];
    int32_t token = -7;
    kt_err err = {0};
    struct kt_sampler_params p = kt_sampler_params_default();
    for (int greedy = 0; greedy < 2; greedy++) {
        p.temperature = greedy ? 0.0f : 1.0f;
        struct kt_sampler *s = make_sampler(&p, V, NULL, 0);

        for (int i = 0; i < V; i++)
            logits[i] = (float)i;
        logits[9] = NAN;
        kt_status st = kt_sampler_sample(s, logits, &token, &err);
        KT_CHECK(st == KT_ERR_INVALID, "NaN logit: status %s", kt_status_name(st));
        KT_CHECK(strstr(err.msg, "NaN") && strstr(err.msg, "9"),
                 "NaN message names neither the problem nor the token: %s", err.msg);

        for (int i = 0; i < V; i++)
            logits[i] = (float)i;
        logits[3] = INFINITY;
        st = kt_sampler_sample(s, logits, &token, &err);
        KT_CHECK(st == KT_ERR_INVALID, "+inf logit: status %s", kt_status_name(st));
        KT_CHECK(strstr(err.msg, "+inf") != NULL, "+inf message: %s", err.msg);

        for (int i = 0; i < V; i++)
            logits[i] = -INFINITY;
        st = kt_sampler_sample(s, logits, &token, &err);
        KT_CHECK(st == KT_ERR_INVALID, "all -inf: status %s", kt_status_name(st));
        KT_CHECK(strstr(err.msg, "masked") != NULL, "all -inf message: %s", err.msg);

        KT_CHECK(token == -7, "a failed sample wrote a token (%d)", token);
        KT_CHECK(kt_sampler_n_generated(s) == 0, "a failed sample was recorded");
        kt_sampler_destroy(s);
    }

    /* Huge logits stay finite through the softmax; a penalty that overflows is capped. */
    struct kt_sampler_params q = kt_sampler_params_default();
    q.repetition_penalty = 1e-30f;
    const int32_t prompt[1] = {2};
    struct kt_sampler *s = make_sampler(&q, V, prompt, 1);
    for (int i = 0; i < V; i++)
        logits[i] = -3.0e38f;
    logits[2] = 3.0e38f; /* divided by 1e-30: overflows to +inf without the cap */
    logits[5] = 3.0e38f;
    kt_status st = kt_sampler_sample(s, logits, &token, &err);
    KT_CHECK(st == KT_OK && token == 2, "overflowing penalty: status %s token %d",
             kt_status_name(st), token);
    kt_sampler_destroy(s);
}

/* ---------------------------------------------------------------------------- */
/* penalties, bias, bans                                                         */
/* ---------------------------------------------------------------------------- */

static void penalties_change_logits_by_the_formulas(void)
{
    enum { V = 8 };
    const int32_t prompt[3] = {1, 2, 2};
    struct kt_logit_bias bias[3] = {{5, 1.5f}, {5, 0.5f}, {0, -0.25f}};
    struct kt_sampler_params p = kt_sampler_params_default();
    p.repetition_penalty = 2.0f;
    p.frequency_penalty = 0.5f;
    p.presence_penalty = 0.25f;
    p.logit_bias = bias;
    p.n_logit_bias = 3;
    struct kt_sampler *s = make_sampler(&p, V, prompt, 3);
    bias[0].bias = 100.0f; /* the sampler copied the bias; later edits must not leak in */
    kt_err err = {0};
    const int32_t generated[4] = {3, 4, 3, 1};
    for (int i = 0; i < 4; i++)
        KT_CHECK(kt_sampler_accept(s, generated[i], &err) == KT_OK, "accept: %s", err.msg);
    KT_CHECK(kt_sampler_ban(s, 7, true, &err) == KT_OK, "ban: %s", err.msg);
    KT_CHECK(kt_sampler_ban(s, 6, true, &err) == KT_OK, "ban: %s", err.msg);
    KT_CHECK(kt_sampler_ban(s, 6, false, &err) == KT_OK, "unban: %s", err.msg);

    float logits[V] = {1.0f, 2.0f, -1.5f, 3.0f, -2.0f, 0.5f, 4.0f, 0.0f};
    KT_CHECK(kt_sampler_adjust_logits(s, logits, &err) == KT_OK, "adjust: %s", err.msg);
    const float expected[V] = {
        1.0f - 0.25f,               /* 0: bias only */
        2.0f / 2 - 0.5f - 0.25f,    /* 1: prompt + generated once: divided, then freq 1 + presence */
        -1.5f * 2,                  /* 2: prompt only: multiplied, no freq/presence */
        3.0f / 2 - 0.5f * 2 - 0.25f, /* 3: generated twice */
        -2.0f * 2 - 0.5f - 0.25f,   /* 4: generated once, negative */
        0.5f + 1.5f + 0.5f,         /* 5: two bias entries add */
        4.0f,                       /* 6: banned then unbanned */
        -INFINITY,                  /* 7: banned */
    };
    for (int i = 0; i < V; i++)
        KT_CHECK(logits[i] == expected[i], "token %d: adjusted logit %.9g, expected %.9g", i,
                 (double)logits[i], (double)expected[i]);
    kt_sampler_destroy(s);

    /* presence/frequency ignore the prompt; repetition alone ignores nothing seen. */
    struct kt_sampler_params q = kt_sampler_params_default();
    q.frequency_penalty = -1.0f;
    q.presence_penalty = 2.0f;
    s = make_sampler(&q, V, prompt, 3);
    float row[V] = {1, 1, 1, 1, 1, 1, 1, 1};
    KT_CHECK(kt_sampler_accept(s, 6, &err) == KT_OK, "accept: %s", err.msg);
    KT_CHECK(kt_sampler_adjust_logits(s, row, &err) == KT_OK, "adjust: %s", err.msg);
    for (int i = 0; i < V; i++) {
        float want = i == 6 ? 1.0f + 1.0f - 2.0f : 1.0f;
        KT_CHECK(row[i] == want, "freq/presence: token %d is %g, expected %g", i, (double)row[i],
                 (double)want);
    }
    kt_sampler_destroy(s);
}

static void penalties_steer_later_samples(void)
{
    const float logits[3] = {2.0f, 1.9f, 1.0f};
    float work[3];
    struct kt_sampler_params p = kt_sampler_params_default();
    p.temperature = 0.0f;
    p.presence_penalty = 0.2f;
    struct kt_sampler *s = make_sampler(&p, 3, NULL, 0);
    int32_t a = sample_copy(s, logits, work, 3);
    int32_t b = sample_copy(s, logits, work, 3); /* 2.0 - 0.2 = 1.8 < 1.9 */
    int32_t c = sample_copy(s, logits, work, 3); /* 1.8 vs 1.7 */
    KT_CHECK(a == 0 && b == 1 && c == 0, "presence penalty: drew %d %d %d, expected 0 1 0", a, b,
             c);
    kt_sampler_destroy(s);

    /* Repetition penalty from the prompt alone: 2.0 / 1.1 = 1.82 < 1.9. */
    struct kt_sampler_params q = kt_sampler_params_default();
    q.temperature = 0.0f;
    q.repetition_penalty = 1.1f;
    const int32_t prompt[2] = {0, 0};
    s = make_sampler(&q, 3, prompt, 2);
    a = sample_copy(s, logits, work, 3);
    KT_CHECK(a == 1, "repetition penalty over the prompt: drew %d, expected 1", a);
    kt_sampler_destroy(s);
}

static void bias_and_bans_steer_greedy(void)
{
    const float logits[5] = {0.0f, 5.0f, 1.0f, -1.0f, 4.0f};
    float work[5];
    kt_err err = {0};
    const struct kt_logit_bias bias[1] = {{3, 10.0f}};
    struct kt_sampler_params p = kt_sampler_params_default();
    p.temperature = 0.0f;
    p.logit_bias = bias;
    p.n_logit_bias = 1;
    struct kt_sampler *s = make_sampler(&p, 5, NULL, 0);
    KT_CHECK(sample_copy(s, logits, work, 5) == 3, "bias +10 should make token 3 win");
    kt_sampler_ban(s, 3, true, &err);
    KT_CHECK(sample_copy(s, logits, work, 5) == 1, "banned 3: argmax 1 should win");
    kt_sampler_ban(s, 1, true, &err);
    KT_CHECK(sample_copy(s, logits, work, 5) == 4, "banned 3 and 1: 4 should win");
    kt_sampler_ban(s, 3, false, &err);
    KT_CHECK(sample_copy(s, logits, work, 5) == 3, "unbanned 3 should win again");
    KT_CHECK(kt_sampler_ban(s, 5, true, &err) == KT_ERR_INVALID, "ban outside the vocabulary");
    KT_CHECK(kt_sampler_ban(s, -1, true, &err) == KT_ERR_INVALID, "ban of a negative id");
    kt_sampler_destroy(s);

    /* Banning every live token leaves nothing to draw: an error, not a crash. */
    p.n_logit_bias = 0;
    p.temperature = 1.0f;
    s = make_sampler(&p, 5, NULL, 0);
    for (int32_t t = 0; t < 5; t++)
        kt_sampler_ban(s, t, true, &err);
    int32_t token = -1;
    memcpy(work, logits, sizeof work);
    KT_CHECK(kt_sampler_sample(s, work, &token, &err) == KT_ERR_INVALID,
             "every token banned must fail");
    kt_sampler_destroy(s);
}

/* A grammar's mask (kt_sampler_set_allowed): greedy and drawn samples keep to it. */
static void allowed_mask_restricts_greedy_and_drawn_samples(void)
{
    enum { N = 70 };
    float logits[N], work[N];
    for (int i = 0; i < N; i++)
        logits[i] = (float)(i % 7);
    uint32_t mask[3] = {0, 0, 0};
    mask[0] |= 1u << 3;  /* logit 3 */
    mask[1] |= 1u << 1;  /* token 33: logit 5 */
    mask[2] |= 1u << 4;  /* token 68: logit 5, a partial last word */
    struct kt_sampler_params p = kt_sampler_params_default();
    p.temperature = 0.0f;
    struct kt_sampler *s = make_sampler(&p, N, NULL, 0);
    kt_sampler_set_allowed(s, mask);
    KT_CHECK(sample_copy(s, logits, work, N) == 33, "greedy: the best allowed token, lowest id on ties");
    kt_sampler_set_allowed(s, NULL);
    KT_CHECK(sample_copy(s, logits, work, N) == 6, "without the mask: the argmax");
    kt_sampler_destroy(s);
    p.temperature = 1.5f;
    p.seed = 7;
    s = make_sampler(&p, N, NULL, 0);
    kt_sampler_set_allowed(s, mask);
    int seen[N] = {0};
    for (int k = 0; k < 600; k++)
        seen[sample_copy(s, logits, work, N)]++;
    KT_CHECK(seen[3] + seen[33] + seen[68] == 600, "every draw allowed");
    KT_CHECK(seen[3] > 0 && seen[33] > 0 && seen[68] > 0, "each allowed token drawn (%d %d %d)", seen[3], seen[33],
             seen[68]);
    uint32_t none[3] = {0, 0, 0};
    kt_sampler_set_allowed(s, none);
    int32_t token;
    kt_err err = {0};
    memcpy(work, logits, sizeof work);
    KT_CHECK(kt_sampler_sample(s, work, &token, &err) == KT_ERR_INVALID, "an empty mask is an error");
    kt_sampler_destroy(s);
}

/* ---------------------------------------------------------------------------- */
/* log-probabilities                                                             */
/* ---------------------------------------------------------------------------- */

/* Naive log-softmax in double. */
static void naive_log_softmax(const float *logits, uint32_t n, double *out)
{
    double max = -INFINITY, total = 0.0;
    for (uint32_t i = 0; i < n; i++)
        max = fmax(max, logits[i]);
    for (uint32_t i = 0; i < n; i++)
        total += exp((double)logits[i] - max);
    for (uint32_t i = 0; i < n; i++)
        out[i] = (double)logits[i] - max - log(total);
}

static bool close_logprob(double got, double want)
{
    if (isinf(want))
        return got == want;
    return fabs(got - want) <= 2e-5 + 1e-6 * fabs(want);
}

static void logprobs_equal_naive_log_softmax(void)
{
    enum { V = 1000 };
    float logits[V];
    double ref[V];
    unsigned long long rng = 31;
    random_logits(&rng, logits, V, 3.0f);
    logits[17] = logits[500] = logits[900] = 20.0f; /* a tie at the top */
    logits[600] = 19.0f;
    logits[5] = logits[6] = -INFINITY;
    naive_log_softmax(logits, V, ref);
    int32_t *ranked = ranked_ids(logits, V);

    kt_err err = {0};
    struct kt_logprobs lp;
    const int32_t tokens[5] = {17, 600, 5, 0, 999};
    for (int k = 0; k < 5; k++) {
        int32_t t = tokens[k];
        kt_status st = kt_logprobs_compute(logits, V, t, KT_LOGPROBS_MAX_TOP, &lp, &err);
        KT_CHECK(st == KT_OK, "logprobs: %s", err.msg);
        KT_CHECK(lp.token == t && close_logprob(lp.logprob, ref[t]),
                 "token %d: logprob %.7g, naive %.7g", t, (double)lp.logprob, ref[t]);
        KT_CHECK(lp.n_top == KT_LOGPROBS_MAX_TOP, "n_top %u", lp.n_top);
        for (uint32_t j = 0; j < lp.n_top; j++) {
            int32_t want = ranked[j];
            KT_CHECK(lp.top[j].token == want && close_logprob(lp.top[j].logprob, ref[want]),
                     "top %u: token %d (%.7g), expected %d (%.7g)", j, lp.top[j].token,
                     (double)lp.top[j].logprob, want, ref[want]);
        }
    }
    KT_CHECK(lp.top[0].token == 17 && lp.top[1].token == 500 && lp.top[2].token == 900,
             "tied top tokens not in id order: %d %d %d", lp.top[0].token, lp.top[1].token,
             lp.top[2].token);
    KT_CHECK(kt_logprobs_compute(logits, V, 3, 0, &lp, &err) == KT_OK && lp.n_top == 0,
             "n_top 0 must return no top list");
    KT_CHECK(kt_logprobs_compute(logits, 4, 3, 20, &lp, &err) == KT_OK && lp.n_top == 4,
             "n_top is capped at the vocabulary (%u)", lp.n_top);
    KT_CHECK(kt_logprobs_compute(logits, V, 3, 21, &lp, &err) == KT_ERR_INVALID,
             "n_top 21 must be rejected");
    KT_CHECK(kt_logprobs_compute(logits, V, V, 1, &lp, &err) == KT_ERR_INVALID,
             "token outside the vocabulary must be rejected");
    logits[77] = NAN;
    KT_CHECK(kt_logprobs_compute(logits, V, 3, 1, &lp, &err) == KT_ERR_INVALID,
             "NaN must be rejected");
    free(ranked);
}

static void sample_reports_raw_and_sampled_logprobs(void)
{
    enum { V = 6 };
    const float logits[V] = {1.0f, 3.0f, 2.0f, 0.5f, 2.5f, -1.0f};
    const int32_t prompt[1] = {1};
    double ref[V];
    naive_log_softmax(logits, V, ref);
    /* Processed: the repetition penalty takes token 1 from 3.0 to 2.0, so the
     * top 3 are 4 (2.5), 1 (2.0), 2 (2.0), at temperature 0.5. */
    const float processed[V] = {1.0f, 2.0f, 2.0f, 0.5f, 2.5f, -1.0f};
    const bool keep[V] = {false, true, true, false, true, false};
    double probs[V];
    softmax_kept(processed, V, 0.5, keep, probs);
    struct kt_sampler_params p = kt_sampler_params_default();
    p.temperature = 0.5f;
    p.top_k = 3;
    p.repetition_penalty = 1.5f;
    kt_err err = {0};
    float work[V];
    int seen[V] = {0};
    /* A fresh sampler per draw: a drawn token would be penalised from then on. */
    for (int r = 0; r < 200; r++) {
        p.seed = 17 + (uint64_t)r;
        struct kt_sampler *s = make_sampler(&p, V, prompt, 1);
        struct kt_logprobs lp;
        int32_t token = -1;
        memcpy(work, logits, sizeof work);
        kt_status st = kt_sampler_sample_logprobs(s, work, 3, &token, &lp, &err);
        kt_sampler_destroy(s);
        KT_CHECK(st == KT_OK, "sample: %s", err.msg);
        if (st != KT_OK || token < 0 || token >= V)
            break;
        seen[token]++;
        KT_CHECK(keep[token], "drew token %d outside the processed top 3", token);
        KT_CHECK(lp.token == token && close_logprob(lp.logprob, ref[token]),
                 "raw logprob of %d: %.7g, naive %.7g", token, (double)lp.logprob, ref[token]);
        KT_CHECK(close_logprob(lp.sampled_logprob, log(probs[token])),
                 "sampled logprob of %d: %.7g, expected %.7g", token, (double)lp.sampled_logprob,
                 log(probs[token]));
        KT_CHECK(lp.n_top == 3 && lp.top[0].token == 1 && lp.top[1].token == 4 &&
                     lp.top[2].token == 2,
                 "raw top 3 should be 1, 4, 2: got %d %d %d", lp.top[0].token, lp.top[1].token,
                 lp.top[2].token);
    }
    KT_CHECK(seen[1] && seen[2] && seen[4], "all three survivors should appear in 200 draws");

    /* Greedy: the draw was certain. */
    p = kt_sampler_params_default();
    p.temperature = 0.0f;
    struct kt_sampler *s = make_sampler(&p, V, NULL, 0);
    struct kt_logprobs lp;
    int32_t token = -1;
    memcpy(work, logits, sizeof work);
    KT_CHECK(kt_sampler_sample_logprobs(s, work, 2, &token, &lp, &err) == KT_OK, "greedy: %s",
             err.msg);
    KT_CHECK(token == 1 && lp.sampled_logprob == 0.0f && close_logprob(lp.logprob, ref[1]),
             "greedy logprobs: token %d sampled %g raw %g", token, (double)lp.sampled_logprob,
             (double)lp.logprob);
    KT_CHECK(kt_sampler_sample_logprobs(s, work, 21, &token, &lp, &err) == KT_ERR_INVALID,
             "top_logprobs 21 must be rejected");
    kt_sampler_destroy(s);
}

/* ---------------------------------------------------------------------------- */
/* parameter validation                                                          */
/* ---------------------------------------------------------------------------- */

static void invalid_parameters_are_rejected_by_name(void)
{
    const struct kt_logit_bias bad_token[1] = {{100, 1.0f}};
    const struct kt_logit_bias bad_bias[1] = {{3, NAN}};
    struct {
        const char *name;
        struct kt_sampler_params p;
    } cases[18];
    int n = 0;
#define BAD_CASE(field_name, stmt)                                                           \
    do {                                                                                     \
        cases[n].name = field_name;                                                          \
        cases[n].p = kt_sampler_params_default();                                            \
        struct kt_sampler_params *q = &cases[n].p;                                           \
        stmt;                                                                                \
        n++;                                                                                 \
    } while (0)
    BAD_CASE("temperature", q->temperature = -0.1f);
    BAD_CASE("temperature", q->temperature = NAN);
    BAD_CASE("temperature", q->temperature = INFINITY);
    BAD_CASE("top_k", q->top_k = -2);
    BAD_CASE("top_p", q->top_p = 0.0f);
    BAD_CASE("top_p", q->top_p = 1.01f);
    BAD_CASE("top_p", q->top_p = NAN);
    BAD_CASE("min_p", q->min_p = -0.01f);
    BAD_CASE("min_p", q->min_p = 1.5f);
    BAD_CASE("presence_penalty", q->presence_penalty = 2.5f);
    BAD_CASE("presence_penalty", q->presence_penalty = -2.01f);
    BAD_CASE("frequency_penalty", q->frequency_penalty = -3.0f);
    BAD_CASE("frequency_penalty", q->frequency_penalty = NAN);
    BAD_CASE("repetition_penalty", q->repetition_penalty = 0.0f);
    BAD_CASE("repetition_penalty", q->repetition_penalty = -1.0f);
    BAD_CASE("logit_bias", (q->logit_bias = bad_token, q->n_logit_bias = 1));
    BAD_CASE("logit_bias", (q->logit_bias = bad_bias, q->n_logit_bias = 1));
    BAD_CASE("logit_bias", (q->logit_bias = NULL, q->n_logit_bias = 2));
#undef BAD_CASE
    for (int i = 0; i < n; i++) {
        kt_err err = {0};
        struct kt_sampler *s = (struct kt_sampler *)(uintptr_t)1; /* must be reset to NULL */
        kt_status st = kt_sampler_create(&cases[i].p, 100, NULL, 0, &s, &err);
        KT_CHECK(st == KT_ERR_INVALID && s == NULL, "case %d (%s): status %s", i, cases[i].name,
                 kt_status_name(st));
        KT_CHECK(strstr(err.msg, cases[i].name) != NULL, "case %d: message does not name %s: %s",
                 i, cases[i].name, err.msg);
    }

    /* The edges of every range are valid. */
    struct kt_sampler_params edge = kt_sampler_params_default();
    edge.temperature = 0.0f;
    edge.top_k = -1;
    edge.top_p = 1.0f;
    edge.min_p = 1.0f;
    edge.presence_penalty = -2.0f;
    edge.frequency_penalty = 2.0f;
    edge.repetition_penalty = 1e-3f;
    kt_err err = {0};
    KT_CHECK(kt_sampler_params_validate(&edge, 100, &err) == KT_OK, "edges rejected: %s",
             err.msg);
    edge.min_p = 0.0f;
    edge.presence_penalty = 2.0f;
    edge.frequency_penalty = -2.0f;
    edge.top_p = 1e-6f;
    KT_CHECK(kt_sampler_params_validate(&edge, 100, &err) == KT_OK, "edges rejected: %s",
             err.msg);

    /* Vocabulary, prompt and accepted tokens are checked too. */
    struct kt_sampler_params p = kt_sampler_params_default();
    struct kt_sampler *s = NULL;
    const int32_t bad_prompt[3] = {1, 100, 2};
    KT_CHECK(kt_sampler_create(&p, 0, NULL, 0, &s, &err) == KT_ERR_INVALID, "empty vocabulary");
    KT_CHECK(kt_sampler_create(&p, 100, bad_prompt, 3, &s, &err) == KT_ERR_INVALID &&
                 strstr(err.msg, "prompt"),
             "prompt token outside the vocabulary: %s", err.msg);
    KT_CHECK(kt_sampler_create(&p, 100, NULL, 3, &s, &err) == KT_ERR_INVALID,
             "NULL prompt with tokens");
    s = make_sampler(&p, 100, NULL, 0);
    KT_CHECK(kt_sampler_accept(s, 100, &err) == KT_ERR_INVALID, "accept outside the vocabulary");
    KT_CHECK(kt_sampler_accept(s, 99, &err) == KT_OK && kt_sampler_generated_count(s, 99) == 1,
             "accept of the last id");
    kt_sampler_destroy(s);
}

/* ---------------------------------------------------------------------------- */
/* Kimi-K2 vocabulary size                                                       */
/* ---------------------------------------------------------------------------- */

/* log of the total weight exp((z - zmax) / T) over ranked[0 .. n_kept). */
static double log_kept_mass(const float *logits, const int32_t *ranked, uint32_t n_kept, double t)
{
    double zmax = logits[ranked[0]], total = 0.0;
    for (uint32_t r = 0; r < n_kept; r++)
        total += exp(((double)logits[ranked[r]] - zmax) / t);
    return log(total);
}

/* How many of the ranked tokens survive top-k, then top-p, then min-p, in
 * double precision straight from the definitions. */
static uint32_t reference_kept(const float *logits, const int32_t *ranked, uint32_t n, double t,
                               int32_t top_k, double top_p, double min_p)
{
    const double zmax = logits[ranked[0]];
    uint32_t kept = top_k > 0 && (uint32_t)top_k < n ? (uint32_t)top_k : n;
    if (top_p < 1.0) {
        double total = 0.0, above = 0.0;
        for (uint32_t r = 0; r < kept; r++)
            total += exp(((double)logits[ranked[r]] - zmax) / t);
        uint32_t m = 0;
        while (m < kept && above < top_p * total)
            above += exp(((double)logits[ranked[m++]] - zmax) / t);
        kept = m;
    }
    while (kept > 1 && exp(((double)logits[ranked[kept - 1]] - zmax) / t) < min_p)
        kept--;
    return kept;
}

struct truncation_case {
    const char *what;
    float temperature;
    int32_t top_k;
    float top_p, min_p;
};

/* Draws from logits (n) under each case and checks every draw against the
 * sorted reference: ranked inside the kept prefix, and the sampler's
 * sampled_logprob implying exactly the reference's kept weight. */
static void check_truncation_against_reference(const float *logits, uint32_t n,
                                               const struct truncation_case *cases, int n_cases,
                                               int n_draws, bool print)
{
    float *work = kt_test_xmalloc(n * sizeof *work);
    int32_t *rank_of = kt_test_xmalloc(n * sizeof *rank_of);
    int32_t *ranked = ranked_ids(logits, n);
    for (uint32_t r = 0; r < n; r++)
        rank_of[ranked[r]] = (int32_t)r;
    const double zmax = logits[ranked[0]];
    for (int c = 0; c < n_cases; c++) {
        const struct truncation_case *tc = &cases[c];
        const double t = tc->temperature;
        const uint32_t n_kept =
            reference_kept(logits, ranked, n, t, tc->top_k, tc->top_p, tc->min_p);
        const double want_log_mass = log_kept_mass(logits, ranked, n_kept, t);
        /* One token more or fewer moves the kept weight by at least this share
         * of it; the tolerance must stay below it for the check to see that. */
        const double edge_share =
            fmin(exp(((double)logits[ranked[n_kept - 1]] - zmax) / t - want_log_mass),
                 n_kept < n ? exp(((double)logits[ranked[n_kept]] - zmax) / t - want_log_mass)
                            : 1.0);
        const double tolerance = fmax(fmin(1e-4, 0.5 * edge_share), 2e-6);
        KT_CHECK(tolerance < edge_share, "%s: the kept-weight check cannot see one token (%g)",
                 tc->what, edge_share);
        struct kt_sampler_params p = kt_sampler_params_default();
        p.temperature = tc->temperature;
        p.top_k = tc->top_k;
        p.top_p = tc->top_p;
        p.min_p = tc->min_p;
        p.seed = 600 + (uint64_t)c;
        struct kt_sampler *s = make_sampler(&p, n, NULL, 0);
        int outside = 0, mass_off = 0;
        uint32_t deepest = 0;
        for (int d = 0; d < n_draws; d++) {
            struct kt_logprobs lp;
            int32_t token = -1;
            kt_err err = {0};
            memcpy(work, logits, n * sizeof *work);
            if (kt_sampler_sample_logprobs(s, work, 0, &token, &lp, &err) != KT_OK) {
                KT_CHECK(false, "%s: %s", tc->what, err.msg);
                break;
            }
            uint32_t r = (uint32_t)rank_of[token];
            deepest = r > deepest ? r : deepest;
            outside += r >= n_kept;
            /* sampled_logprob = (z - zmax) / T - log(kept weight) */
            double got_log_mass = ((double)logits[token] - zmax) / t - lp.sampled_logprob;
            mass_off += fabs(got_log_mass - want_log_mass) > tolerance;
        }
        KT_CHECK(outside == 0, "%s: %d draws ranked beyond the %u kept", tc->what, outside,
                 n_kept);
        KT_CHECK(mass_off == 0, "%s: kept weight differs from the reference in %d draws",
                 tc->what, mass_off);
        if (print)
            printf("     %-22s keeps %6u of %u tokens; deepest draw at rank %u\n", tc->what,
                   n_kept, n, deepest);
        kt_sampler_destroy(s);
    }
    free(ranked);
    free(rank_of);
    free(work);
}

static void large_vocab_truncation_matches_a_sorted_reference(void)
{
    const uint32_t V = KIMI_VOCAB;
    float *logits = kt_test_xmalloc(V * sizeof *logits);
    unsigned long long rng = 4242;
    random_logits(&rng, logits, V, 2.5f);
    const struct truncation_case cases[] = {
        {"top_k=50", 0.8f, 50, 1.0f, 0.0f},            /* heap */
        {"top_k=10000", 0.8f, 10000, 1.0f, 0.0f},      /* radix by count over the row */
        {"top_p=0.9", 0.8f, 0, 0.9f, 0.0f},            /* radix by weight above a floor */
        {"top_p=0.5 T=2", 2.0f, 0, 0.5f, 0.0f},        /* a wide nucleus */
        {"min_p=0.01", 0.8f, 0, 1.0f, 0.01f},
        {"top_k=40 top_p=0.7", 0.8f, 40, 0.7f, 0.0f},  /* top-p inside the top k */
        {"k=2000 p=0.95 min_p=.02", 1.2f, 2000, 0.95f, 0.02f},
    };
    check_truncation_against_reference(logits, V, cases, (int)(sizeof cases / sizeof cases[0]),
                                       200, true);
    free(logits);
}

/* Coarse logits (many exact ties): the heap (small k) and the radix (large
 * k) must both break ties by lower id, as must top-p at its boundary. */
static void truncation_breaks_ties_by_lower_id_on_both_paths(void)
{
    enum { V = 6000 };
    float *logits = kt_test_xmalloc(V * sizeof *logits);
    unsigned long long rng = 99;
    random_logits(&rng, logits, V, 2.0f);
    for (int i = 0; i < V; i++)
        logits[i] = roundf(logits[i]);
    const struct truncation_case cases[] = {
        {"heap top_k=300", 1.0f, 300, 1.0f, 0.0f},
        {"radix top_k=2500", 1.0f, 2500, 1.0f, 0.0f},
        {"top_p=0.6", 1.0f, 0, 0.6f, 0.0f},
        {"top_k=700 top_p=0.3", 1.0f, 700, 0.3f, 0.0f},
    };
    check_truncation_against_reference(logits, V, cases, (int)(sizeof cases / sizeof cases[0]),
                                       2000, false);

    /* One heavy token among equal light ones: top-p's boundary falls inside a
     * tie of thousands, close to the floor below which the row is not looked at. */
    for (int i = 0; i < V; i++)
        logits[i] = 0.0f;
    logits[7] = 3.0f;
    const struct truncation_case flat[] = {
        {"top_p=0.5 one heavy", 1.0f, 0, 0.5f, 0.0f},
        {"top_p=0.95 one heavy", 1.0f, 0, 0.95f, 0.0f},
        {"top_k=3000 one heavy", 1.0f, 3000, 1.0f, 0.0f},
    };
    check_truncation_against_reference(logits, V, flat, (int)(sizeof flat / sizeof flat[0]), 2000,
                                       false);
    free(logits);
}

static void print_sampling_throughput(void)
{
    const uint32_t V = KIMI_VOCAB;
    float *logits = kt_test_xmalloc(V * sizeof *logits), *work = kt_test_xmalloc(V * sizeof *work);
    unsigned long long rng = 5;
    random_logits(&rng, logits, V, 3.0f);
    int32_t prompt[2000];
    for (int i = 0; i < 2000; i++)
        prompt[i] = (int32_t)(kt_test_rand_u64(&rng) % V);

    struct {
        const char *what;
        float temperature, top_p, min_p, rep, freq;
        int32_t top_k;
        uint32_t n_top;
        bool logprobs;
    } configs[] = {
        {"greedy", 0.0f, 1.0f, 0.0f, 1.0f, 0.0f, 0, 0, false},
        {"T=0.7", 0.7f, 1.0f, 0.0f, 1.0f, 0.0f, 0, 0, false},
        {"T=0.7 top_k=50", 0.7f, 1.0f, 0.0f, 1.0f, 0.0f, 50, 0, false},
        {"T=0.7 top_p=0.9", 0.7f, 0.9f, 0.0f, 1.0f, 0.0f, 0, 0, false},
        {"T=0.7 min_p=0.05", 0.7f, 1.0f, 0.05f, 1.0f, 0.0f, 0, 0, false},
        {"k=40 p=0.95 min_p=.05", 0.7f, 0.95f, 0.05f, 1.0f, 0.0f, 40, 0, false},
        {"+penalties (2k prompt)", 0.7f, 0.95f, 0.0f, 1.1f, 0.3f, 40, 0, false},
        {"+logprobs top 20", 0.7f, 0.95f, 0.0f, 1.0f, 0.0f, 40, 20, true},
    };
    const int n_configs = (int)(sizeof configs / sizeof configs[0]);
    for (int c = 0; c < n_configs; c++) {
        struct kt_sampler_params p = kt_sampler_params_default();
        p.temperature = configs[c].temperature;
        p.top_k = configs[c].top_k;
        p.top_p = configs[c].top_p;
        p.min_p = configs[c].min_p;
        p.repetition_penalty = configs[c].rep;
        p.frequency_penalty = configs[c].freq;
        struct kt_sampler *s = make_sampler(&p, V, prompt, 2000);
        /* At least 20 draws and 0.2 s: enough to time, short under sanitizers.
         * The best draw is printed beside the mean: this machine may be shared. */
        double spent_s = 0.0, best_s = INFINITY;
        const double start_s = now_s();
        int reps = 0;
        for (; reps < 20 || (reps < 1000 && now_s() - start_s < 0.2); reps++) {
            memcpy(work, logits, V * sizeof *work);
            struct kt_logprobs lp;
            int32_t token;
            kt_err err = {0};
            const double t0 = now_s();
            kt_status st = configs[c].logprobs
                               ? kt_sampler_sample_logprobs(s, work, configs[c].n_top, &token,
                                                            &lp, &err)
                               : kt_sampler_sample(s, work, &token, &err);
            const double dt = now_s() - t0;
            spent_s += dt;
            best_s = dt < best_s ? dt : best_s;
            KT_CHECK(st == KT_OK, "%s: %s", configs[c].what, err.msg);
        }
        printf("     V=%u %-24s mean %7.1f us, best %7.1f us per token\n", V, configs[c].what,
               spent_s / reps * 1e6, best_s * 1e6);
        kt_sampler_destroy(s);
    }
    free(logits);
    free(work);
}

int main(void)
{
    KT_RUN(greedy_picks_argmax_and_lowest_id_on_ties);
    KT_RUN(small_temperature_matches_greedy);
    KT_RUN(top_k_one_equals_greedy);
    KT_RUN(same_seed_repeats_and_other_seed_differs);
    KT_RUN(top_k_keeping_every_live_token_changes_nothing);
    KT_RUN(draws_follow_softmax_over_temperature);
    KT_RUN(top_k_keeps_the_k_best_renormalised);
    KT_RUN(top_k_breaks_ties_by_lower_id);
    KT_RUN(top_p_keeps_the_shortest_prefix_reaching_p);
    KT_RUN(top_p_ranks_ties_by_lower_id);
    KT_RUN(top_p_applies_to_the_top_k_renormalised);
    KT_RUN(min_p_keeps_tokens_above_a_fraction_of_the_best);
    KT_RUN(masked_tokens_are_never_drawn);
    KT_RUN(hostile_logits_are_rejected);
    KT_RUN(penalties_change_logits_by_the_formulas);
    KT_RUN(penalties_steer_later_samples);
    KT_RUN(bias_and_bans_steer_greedy);
    KT_RUN(allowed_mask_restricts_greedy_and_drawn_samples);
    KT_RUN(logprobs_equal_naive_log_softmax);
    KT_RUN(sample_reports_raw_and_sampled_logprobs);
    KT_RUN(invalid_parameters_are_rejected_by_name);
    KT_RUN(truncation_breaks_ties_by_lower_id_on_both_paths);
    KT_RUN(large_vocab_truncation_matches_a_sorted_reference);
    KT_RUN(print_sampling_throughput);
    return kt_test_finish();
}
