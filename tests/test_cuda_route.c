/*
 * test_cuda_route.c - routing on the GPU picks exactly the experts
 * kt_moe_route picks (same order, ties to the lowest id) with weights within
 * 1e-6 relative, for the routers of Kimi-K2, DeepSeek-V3, V2 and V2-Lite,
 * the tiny presets, and edge cases: groups of one expert, fewer selectable
 * experts than k (masked -inf picks), logits full of exact ties.
 * Skips visibly ("skipped: no CUDA device") where no GPU can be used.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kt_cuda.h"
#include "moe.h"
#include "testlib.h"

struct router_case {
    const char *name;
    uint32_t n_expert, n_used, n_groups, n_group_used;
    enum kt_gating gating;
    bool norm, bias;
    float scale;
};

static const struct router_case cases[] = {
    {"kimi-k2", 384, 8, 1, 1, KT_GATING_SIGMOID, true, true, 2.827f},
    {"deepseek-v3", 256, 8, 8, 4, KT_GATING_SIGMOID, true, true, 2.5f},
    {"tiny-v3", 32, 8, 4, 2, KT_GATING_SIGMOID, true, true, 2.5f},
    {"deepseek-v2", 160, 6, 8, 3, KT_GATING_SOFTMAX, false, false, 16.0f},
    {"v2-lite", 64, 6, 1, 1, KT_GATING_SOFTMAX, false, false, 1.0f},
    {"groups-of-one", 8, 3, 8, 2, KT_GATING_SIGMOID, true, true, 1.0f},
    {"k-above-kept-experts", 16, 6, 4, 1, KT_GATING_SIGMOID, true, true, 1.0f}, /* 2 picks among -inf */
    {"odd-softmax-norm", 37, 5, 1, 1, KT_GATING_SOFTMAX, true, true, 1.5f},
};


/* Routes T tokens both ways; ties: logits and bias rounded to a coarse grid. */
static void route_both_ways(const struct router_case *c, int64_t T, bool ties, unsigned long long *rng)
{
    const uint32_t Ne = c->n_expert, k = c->n_used;
    float *logits = kt_test_xmalloc((size_t)T * Ne * sizeof *logits);
    float *bias = kt_test_xmalloc((size_t)Ne * sizeof *bias);
    for (int64_t i = 0; i < T * Ne; i++) {
        logits[i] = 2.0f * kt_test_rand_normal(rng);
        if (ties)
            logits[i] = roundf(logits[i] * 2.0f) / 2.0f;
    }
    for (uint32_t e = 0; e < Ne; e++) {
        bias[e] = 0.05f * kt_test_rand_normal(rng);
        if (ties)
            bias[e] = roundf(bias[e] * 10.0f) / 10.0f;
    }

    struct kt_router r = {.n_expert = Ne, .n_used = k, .n_groups = c->n_groups, .n_group_used = c->n_group_used,
                          .gating = c->gating, .norm = c->norm, .scale = c->scale};
    float *scratch = kt_test_xmalloc(kt_router_scratch_floats(&r) * sizeof *scratch);
    uint32_t *want_e = kt_test_xmalloc((size_t)T * k * sizeof *want_e), *got_e = kt_test_xmalloc((size_t)T * k * 4);
    float *want_w = kt_test_xmalloc((size_t)T * k * sizeof *want_w), *got_w = kt_test_xmalloc((size_t)T * k * 4);
    for (int64_t t = 0; t < T; t++)
        kt_moe_route(&r, logits + t * Ne, c->bias ? bias : NULL, want_e + t * k, want_w + t * k, scratch);

    const struct kt_cuda_router cr = {Ne, k, c->n_groups, c->n_group_used, (int)c->gating, c->norm, c->scale};
    float *d_logits = kt_test_cuda_copy_in(logits, (size_t)T * Ne * sizeof *logits);
    float *d_bias = c->bias ? kt_test_cuda_copy_in(bias, (size_t)Ne * sizeof *bias) : NULL;
    uint32_t *d_e = kt_test_cuda_copy_in(NULL, (size_t)T * k * sizeof *d_e);
    float *d_w = kt_test_cuda_copy_in(NULL, (size_t)T * k * sizeof *d_w);
    kt_err err = {0};
    kt_status rc = kt_cuda_route(&cr, d_logits, d_bias, T, d_e, d_w, NULL, &err);
    KT_CHECK(rc == 0, "%s: %s", c->name, err.msg);
    kt_test_cuda_copy_out(got_e, d_e, (size_t)T * k * sizeof *got_e);
    kt_test_cuda_copy_out(got_w, d_w, (size_t)T * k * sizeof *got_w);
    int64_t bad_e = 0, bad_w = 0;
    for (int64_t i = 0; rc == 0 && i < T * k; i++) {
        bad_e += got_e[i] != want_e[i];
        bad_w += !(fabsf(got_w[i] - want_w[i]) <= 1e-6f * fabsf(want_w[i]) + 1e-12f);
    }
    KT_CHECK(bad_e == 0, "%s T=%lld%s: %lld selections differ", c->name, (long long)T, ties ? " (ties)" : "",
             (long long)bad_e);
    KT_CHECK(bad_w == 0, "%s T=%lld%s: %lld weights differ", c->name, (long long)T, ties ? " (ties)" : "",
             (long long)bad_w);
    kt_cuda_free(d_logits), kt_cuda_free(d_bias), kt_cuda_free(d_e), kt_cuda_free(d_w);
    free(logits), free(bias), free(scratch), free(want_e), free(got_e), free(want_w), free(got_w);
}

static void cuda_route_matches_kt_moe_route(void)
{
    static const int64_t tokens[] = {1, 3, 17, 64};
    unsigned long long rng = 11;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
        for (size_t t = 0; t < sizeof tokens / sizeof tokens[0]; t++)
            route_both_ways(&cases[c], tokens[t], false, &rng);
}

static void cuda_route_breaks_ties_like_the_cpu(void)
{
    unsigned long long rng = 12;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
        route_both_ways(&cases[c], 64, true, &rng);
}

static void cuda_route_rejects_bad_routers(void)
{
    kt_err err = {0};
    float *d = kt_test_cuda_copy_in(NULL, 64 * sizeof(float));
    const struct kt_cuda_router not_divisible = {10, 2, 3, 1, 2, 1, 1.0f}, k_too_big = {8, 9, 1, 1, 2, 1, 1.0f},
                                bad_gating = {8, 2, 1, 1, 7, 1, 1.0f};
    KT_CHECK(kt_cuda_route(&not_divisible, d, NULL, 1, (uint32_t *)d, d, NULL, &err) != KT_OK && err.msg[0],
             "10 experts in 3 groups accepted");
    err.msg[0] = 0;
    KT_CHECK(kt_cuda_route(&k_too_big, d, NULL, 1, (uint32_t *)d, d, NULL, &err) != KT_OK && err.msg[0],
             "top-9 of 8 accepted");
    err.msg[0] = 0;
    KT_CHECK(kt_cuda_route(&bad_gating, d, NULL, 1, (uint32_t *)d, d, NULL, &err) != KT_OK && err.msg[0],
             "gating 7 accepted");
    kt_cuda_free(d);
}

int main(void)
{
    const int skip = kt_test_skip_without_cuda();
    if (skip)
        return skip;
    KT_RUN(cuda_route_matches_kt_moe_route);
    KT_RUN(cuda_route_breaks_ties_like_the_cpu);
    KT_RUN(cuda_route_rejects_bad_routers);
    return kt_test_finish();
}
