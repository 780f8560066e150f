/*
 * test_hybrid_sim.c - routed and shared experts on a sim device (backend.h)
 * while the CPU runs the rest of each MoE layer.
 *
 * Proves, on kt-synth's tiny (Kimi family) and tiny-v3 (DeepSeek family),
 * prefill + greedy decode: a device holding no experts, half of each
 * layer's routed experts with the shared experts, or every expert, gives
 * logits bit-identical to CPU-only - the device runs the same kernels on
 * copies of the same bytes, and the combine sums in selection order
 * wherever a pair ran - so the greedy tokens are the same too; the same
 * with every layer's attention on the device (the residual stream goes
 * there and back each layer) and the dense layers' FFNs; with the
 * experts on it the device really ran work (queue ops, bytes in and out,
 * pairs counted); and a budget the placement does not fit is refused at
 * creation naming the device and its budget.  This is the everywhere-run
 * stand-in for the cuda+cpu comparison, which runs too where a GPU exists
 * (same greedy tokens, logits within 1e-3) and says it skipped otherwise.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend.h"
#include "engine.h"
#include "model.h"
#include "testlib.h"

#define PROMPT_LEN 12
#define DECODE_STEPS 6
static const int32_t prompt[PROMPT_LEN] = {1, 17, 300, 42, 999, 5, 77, 512, 3, 1000, 64, 128};

/* (PROMPT_LEN + DECODE_STEPS, V) logits, the greedy tokens and the counters. */
static float *run(struct kt_model *m, const struct kt_engine_params *extra, int32_t *tokens,
                  struct kt_engine_stats *stats, struct kt_backend_stats *dev)
{
    struct kt_engine_params p = *extra;
    p.n_ctx = 64;
    p.max_batch_tokens = 32;
    p.n_threads = 2;
    return kt_test_engine_greedy(m, &p, prompt, PROMPT_LEN, DECODE_STEPS, tokens, stats, dev);
}

static void hybrid_matches_cpu_only(const char *preset, const char *extra)
{
    char path[1024];
    struct kt_model *m = kt_test_synth_model(preset, extra, path, sizeof path);
    if (!m)
        return;
    const uint32_t L = m->hp.n_layer, Ne = m->hp.n_expert;
    const size_t n = (size_t)(PROMPT_LEN + DECODE_STEPS) * m->hp.n_vocab;
    uint8_t *none = calloc((size_t)L * Ne, 1), *half = calloc((size_t)L * Ne, 1), *all = calloc((size_t)L * Ne, 1);
    for (size_t i = 0; i < (size_t)L * Ne; i++) {
        half[i] = (i % Ne) < Ne / 2;
        all[i] = 1;
    }
    const struct kt_backend_params sim = {.kind = KT_BACKEND_SIM, .name = "sim0", .transfer_gbps = 25,
                                          .latency_us = 5};
    int32_t base_tokens[DECODE_STEPS], tokens[DECODE_STEPS];
    struct kt_engine_stats st;
    struct kt_backend_stats dev;
    float *base = run(m, &(struct kt_engine_params){0}, base_tokens, &st, &dev);
    const struct {
        const char *what;
        struct kt_engine_params p;
        bool works;
    } cases[] = {
        {"sim, no experts on it", {.device = &sim, .expert_on_device = none}, false},
        {"sim, half the experts + shared", {.device = &sim, .expert_on_device = half, .shared_on_device = true}, true},
        {"sim, every expert", {.device = &sim, .expert_on_device = all}, true},
        {"sim, attention + dense + shared + half the experts (tiny-sim.yaml)",
         {.device = &sim, .expert_on_device = half, .shared_on_device = true, .attention_on_device = true,
          .dense_on_device = true},
         true},
        {"sim, attention only", {.device = &sim, .attention_on_device = true}, false},
        {"sim, every expert + shared, 2 nodes",
         {.device = &sim, .expert_on_device = all, .shared_on_device = true, .topology = "package:2 numa:1 core:1 pu:1",
          .experts_round_robin = true},
         true},
    };
    for (size_t c = 0; base && c < sizeof cases / sizeof cases[0]; c++) {
        float *got = run(m, &cases[c].p, tokens, &st, &dev);
        if (!got)
            continue;
        size_t first = n;
        for (size_t i = 0; i < n && first == n; i++)
            if (memcmp(&got[i], &base[i], sizeof got[i]) != 0)
                first = i;
        KT_CHECK(first == n, "%s, %s: logits differ from CPU-only at position %zu (%.9g vs %.9g)", preset,
                 cases[c].what, first / m->hp.n_vocab, first < n ? got[first] : 0.0, first < n ? base[first] : 0.0);
        KT_CHECK(!memcmp(tokens, base_tokens, sizeof tokens), "%s, %s: greedy tokens differ", preset, cases[c].what);
        if (cases[c].works)
            KT_CHECK(st.device_pairs > 0 && dev.ops > 0 && dev.bytes_in > 0 && dev.bytes_out > 0,
                     "%s, %s: the device did the work (%llu pairs, %llu ops)", preset, cases[c].what,
                     (unsigned long long)st.device_pairs, (unsigned long long)dev.ops);
        else
            KT_CHECK(st.device_pairs == 0, "%s, %s: no expert ran on the device", preset, cases[c].what);
        if (cases[c].p.attention_on_device)
            KT_CHECK(dev.ops >= 3 * (uint64_t)L * (1 + DECODE_STEPS), "%s, %s: each layer's attention went through the device",
                     preset, cases[c].what);
        printf("  %s, %s: %llu pairs on the device, %.2f ms busy (%.2f ms copying)\n", preset, cases[c].what,
               (unsigned long long)st.device_pairs, dev.busy_ns / 1e6, dev.transfer_ns / 1e6);
        free(got);
    }
    free(base);
    free(none);
    free(half);
    free(all);
    kt_test_synth_remove(m, path);
}

static void tiny_hybrid_matches_cpu_only(void)
{
    hybrid_matches_cpu_only("tiny", "");
}

static void tiny_v3_hybrid_matches_cpu_only(void)
{
    hybrid_matches_cpu_only("tiny-v3", "");
}

static void tiny_q4_k_hybrid_matches_cpu_only(void)
{
    hybrid_matches_cpu_only("tiny", "--experts-type q4_k --shared-type q8_0");
}

/* The same split on a real GPU: its kernels take F32 activations and sum in
 * another order, so logits agree within 1e-3 of each row's largest and the
 * greedy tokens are the same (tiny's F32 weights: the CPU's activations are
 * F32 too). */
static void cuda_hybrid_matches_cpu_only_within_tolerance(void)
{
    char why[256] = "";
    if (kt_cuda_device_count(why, sizeof why) == 0) {
        printf("  skipped: no CUDA device (%s); the sim cases above ran\n", why);
        return;
    }
    char path[1024];
    struct kt_model *m = kt_test_synth_model("tiny", "", path, sizeof path);
    if (!m)
        return;
    const size_t LE = (size_t)m->hp.n_layer * m->hp.n_expert;
    uint8_t *half = calloc(LE, 1);
    for (size_t i = 0; i < LE; i++)
        half[i] = (i % m->hp.n_expert) < m->hp.n_expert / 2;
    const struct kt_backend_params gpu = {.kind = KT_BACKEND_CUDA, .name = "gpu"};
    int32_t base_tokens[DECODE_STEPS], tokens[DECODE_STEPS];
    struct kt_engine_stats st;
    struct kt_backend_stats dev;
    float *base = run(m, &(struct kt_engine_params){0}, base_tokens, &st, &dev);
    float *got = run(m, &(struct kt_engine_params){.device = &gpu, .expert_on_device = half, .shared_on_device = true,
                                                   .dense_on_device = true},
                     tokens, &st, &dev);
    if (base && got) {
        const double d = kt_test_worst_row_diff(base, got, PROMPT_LEN + DECODE_STEPS, m->hp.n_vocab);
        printf("  cuda, half the experts + shared + dense: worst row diff %.3g of the row's largest logit\n", d);
        KT_CHECK(d <= 1e-3, "cuda hybrid logits within 1e-3 of CPU-only (%.3g)", d);
        KT_CHECK(!memcmp(tokens, base_tokens, sizeof tokens), "cuda hybrid greedy tokens equal CPU-only's");
        KT_CHECK(st.device_pairs > 0, "the GPU ran pairs");
    }
    free(base);
    free(got);
    free(half);
    kt_test_synth_remove(m, path);
}

static void placement_over_the_budget_is_refused(void)
{
    char path[1024];
    struct kt_model *m = kt_test_synth_model("tiny", "", path, sizeof path);
    if (!m)
        return;
    uint8_t *all = calloc((size_t)m->hp.n_layer * m->hp.n_expert, 1);
    memset(all, 1, (size_t)m->hp.n_layer * m->hp.n_expert);
    const struct kt_backend_params sim = {.kind = KT_BACKEND_SIM, .name = "small-gpu", .memory_bytes = 1 << 20};
    struct kt_engine_params p = {.n_ctx = 64, .n_threads = 1, .device = &sim, .expert_on_device = all};
    struct kt_engine *e = NULL;
    kt_err err = {0};
    KT_CHECK(kt_engine_create(m, &p, &e, &err) == KT_ERR_NOMEM && e == NULL, "over budget refused");
    KT_CHECK(strstr(err.msg, "small-gpu") && strstr(err.msg, "budget"), "message names device and budget: %s", err.msg);
    printf("  %s\n", err.msg);
    free(all);
    kt_test_synth_remove(m, path);
}

int main(void)
{
    KT_RUN(tiny_hybrid_matches_cpu_only);
    KT_RUN(tiny_v3_hybrid_matches_cpu_only);
    KT_RUN(tiny_q4_k_hybrid_matches_cpu_only);
    KT_RUN(cuda_hybrid_matches_cpu_only_within_tolerance);
    KT_RUN(placement_over_the_budget_is_refused);
    return kt_test_finish();
}
