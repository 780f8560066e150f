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
 * there and back each layer, the KV cache lives in device memory), the
 * dense layers' FFNs and the output head; with the experts on it the device
 * really ran work (queue ops, bytes in and out, pairs counted); forked
 * sequences whose KV cache is on the device copy their shared block there
 * and still give CPU-only's logits; the device's budget counts the KV pool;
 * and a budget the placement does not fit is refused at creation naming
 * the device and its budget.  This is the everywhere-run stand-in for the
 * cuda+cpu comparison, which runs too where a GPU exists (same greedy
 * tokens, logits within 1e-3; an 80-token prefill through cuBLASLt within
 * 2e-2) and says it skipped otherwise.
 */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend.h"
#include "engine.h"
#include "engine_test.h"
#include "kt_cuda.h"
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

/* Which routed experts a case puts on the device: none, the lower half of
 * each layer's, or all ([n_layer * n_expert] each). */
struct expert_masks {
    uint8_t *none, *half, *all;
};

static struct expert_masks make_masks(const struct kt_model *m)
{
    const size_t LE = (size_t)m->hp.n_layer * m->hp.n_expert;
    struct expert_masks x = {kt_test_xmalloc(LE), kt_test_xmalloc(LE), kt_test_xmalloc(LE)};
    for (size_t i = 0; i < LE; i++) {
        x.none[i] = 0;
        x.half[i] = (i % m->hp.n_expert) < m->hp.n_expert / 2;
        x.all[i] = 1;
    }
    return x;
}

static void free_masks(struct expert_masks *x)
{
    free(x->none);
    free(x->half);
    free(x->all);
}

static void hybrid_matches_cpu_only(const char *preset, const char *extra)
{
    char path[1024];
    struct kt_model *m = kt_test_synth_model(preset, extra, path, sizeof path);
    if (!m)
        return;
    const uint32_t L = m->hp.n_layer;
    const size_t n = (size_t)(PROMPT_LEN + DECODE_STEPS) * m->hp.n_vocab;
    struct expert_masks masks = make_masks(m);
    const uint8_t *none = masks.none, *half = masks.half, *all = masks.all;
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
        {"sim, attention + dense + shared + half the experts + output head (tiny-sim.yaml)",
         {.device = &sim, .expert_on_device = half, .shared_on_device = true, .attention_on_device = true,
          .dense_on_device = true, .output_on_device = true},
         true},
        {"sim, attention only", {.device = &sim, .attention_on_device = true}, false},
        {"sim, attention only, no graphs", {.device = &sim, .attention_on_device = true, .test = &(struct kt_engine_test_params){.no_device_graphs = true}},
         false},
        {"sim, every expert + shared, 2 nodes",
         {.device = &sim, .expert_on_device = all, .shared_on_device = true, .topology = "package:2 numa:1 core:1 pu:1",
          .test = &(struct kt_engine_test_params){.experts_round_robin = true}},
         true},
        {"sim, half the experts + shared, one expert per layer on or off the device before every step",
         {.device = &sim, .expert_on_device = half, .shared_on_device = true,
          .test = &(struct kt_engine_test_params){.migrate_every_step = true}},
         true},
        {"sim, attention on it, 2 nodes, experts moving on, off and between nodes every step",
         {.device = &sim, .expert_on_device = half, .attention_on_device = true,
          .topology = "package:2 numa:1 core:1 pu:1",
          .test = &(struct kt_engine_test_params){.experts_round_robin = true, .migrate_every_step = true}},
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
        if (cases[c].p.test && cases[c].p.test->migrate_every_step)
            KT_CHECK(st.experts_moved >= (uint64_t)(PROMPT_LEN + DECODE_STEPS) / 2,
                     "%s, %s: experts moved (%llu moves)", preset, cases[c].what,
                     (unsigned long long)st.experts_moved);
        else
            KT_CHECK(st.experts_moved == 0, "%s, %s: nothing moved", preset, cases[c].what);
        if (cases[c].p.attention_on_device) {
            KT_CHECK(dev.ops >= 3 * (uint64_t)L * (1 + DECODE_STEPS),
                     "%s, %s: each layer's attention went through the device", preset, cases[c].what);
            /* decode steps after the first replay each layer's graph
             * (attention, then in MoE layers the FFN norm and router); the
             * first runs directly, and so does the prompt (12 tokens) */
            const uint64_t graphs = cases[c].p.test && cases[c].p.test->no_device_graphs ? 0 : (uint64_t)L * (DECODE_STEPS - 1);
            KT_CHECK(dev.graph_launches == graphs, "%s, %s: %llu graph launches, %llu expected", preset,
                     cases[c].what, (unsigned long long)dev.graph_launches, (unsigned long long)graphs);
        }
        printf("  %s, %s: %llu pairs on the device, %.2f ms busy (%.2f ms copying)\n", preset, cases[c].what,
               (unsigned long long)st.device_pairs, dev.busy_ns / 1e6, dev.transfer_ns / 1e6);
        free(got);
    }
    free(base);
    free_masks(&masks);
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

/* A prompt on sequence 0, a fork of it into sequence 1 mid-block, then
 * both decoding different tokens in one batch: (FORK_STEPS * 2, V) logits.
 * The fork's first write copies the shared partial block - on the device's
 * queue when the KV cache lives there. */
#define FORK_STEPS 4
static float *run_forked(struct kt_model *m, const struct kt_engine_params *extra)
{
    struct kt_engine_params p = *extra;
    p.n_ctx = 64;
    p.max_seqs = 2;
    p.max_batch_tokens = 32;
    p.n_threads = 2;
    struct kt_engine *e = NULL;
    kt_err err = {0};
    if (kt_engine_create(m, &p, &e, &err) != KT_OK) {
        KT_CHECK(false, "engine: %s", err.msg);
        return NULL;
    }
    const uint32_t V = kt_engine_n_vocab(e);
    float *logits = kt_test_xmalloc((size_t)2 * FORK_STEPS * V * sizeof *logits);
    struct kt_batch_token bt[PROMPT_LEN];
    for (uint32_t i = 0; i < PROMPT_LEN; i++)
        bt[i] = (struct kt_batch_token){prompt[i], 0, i, i == PROMPT_LEN - 1};
    bool ok = kt_engine_seq_add(e, 0, &err) == KT_OK &&
              kt_engine_step(e, &(struct kt_batch){PROMPT_LEN, bt}, logits, &err) == KT_OK &&
              kt_engine_seq_fork(e, 0, 1, &err) == KT_OK;
    memset(logits, 0, (size_t)2 * FORK_STEPS * V * sizeof *logits);
    for (uint32_t s = 0, pos1 = PROMPT_LEN; ok && s < FORK_STEPS; s++) { /* sequence 1 skips odd steps */
        const struct kt_batch_token two[2] = {{(int32_t)(7 + s), 0, PROMPT_LEN + s, true},
                                              {(int32_t)(900 - s), 1, pos1, true}};
        const uint32_t n = s % 2 ? 1 : 2;
        ok = kt_engine_step(e, &(struct kt_batch){n, two}, logits + (size_t)2 * s * V, &err) == KT_OK;
        pos1 += n - 1;
    }
    KT_CHECK(ok, "forked step: %s", err.msg);
    kt_engine_destroy(e);
    if (!ok) {
        free(logits);
        return NULL;
    }
    return logits;
}

/* With attention on the device its KV cache lives there: forks copy their
 * shared block on the device's queue and give CPU-only's logits, and the
 * pool counts against the device's budget (a pool the budget cannot hold is
 * refused at creation; on the host the same pool is fine). */
static void kv_cache_on_the_device(void)
{
    char path[1024];
    struct kt_model *m = kt_test_synth_model("tiny", "", path, sizeof path);
    if (!m)
        return;
    const struct kt_backend_params sim = {.kind = KT_BACKEND_SIM, .name = "sim0", .transfer_gbps = 25};
    float *base = run_forked(m, &(struct kt_engine_params){0});
    float *got = run_forked(m, &(struct kt_engine_params){.device = &sim, .attention_on_device = true});
    if (base && got)
        KT_CHECK(!memcmp(base, got, (size_t)2 * FORK_STEPS * m->hp.n_vocab * sizeof *got),
                 "forked sequences with the KV cache on the device give CPU-only's logits");
    free(base);
    free(got);

    /* BF16 rows: the sim runs the CPU's attention on them, so the same bits as
     * a BF16 cache on the host, and within the BF16 tolerance of F32 rows
     * (tests/test_forward.c, kv_cache_row_types_match_f32_within_tolerance; measured 1.27e-3) */
    float *host_bf16 = run_forked(m, &(struct kt_engine_params){.kv_type = KT_ROW_BF16});
    float *sim_bf16 = run_forked(m, &(struct kt_engine_params){.device = &sim, .attention_on_device = true,
                                                               .kv_type = KT_ROW_BF16});
    float *host_f32 = run_forked(m, &(struct kt_engine_params){0});
    if (host_bf16 && sim_bf16 && host_f32) {
        KT_CHECK(!memcmp(host_bf16, sim_bf16, (size_t)2 * FORK_STEPS * m->hp.n_vocab * sizeof *sim_bf16),
                 "a BF16 KV cache on the device gives the host's BF16 logits");
        const double d = kt_test_worst_row_diff(host_f32, sim_bf16, 2 * FORK_STEPS, m->hp.n_vocab);
        printf("  sim, BF16 KV cache on the device: worst row diff %.3g against F32 rows\n", d);
        KT_CHECK(d > 0 && d <= 5e-3, "BF16 rows on the device within 5e-3 of F32 rows (%.3g)", d);
    }
    free(host_bf16);
    free(sim_bf16);
    free(host_f32);

    const struct kt_backend_params small = {.kind = KT_BACKEND_SIM, .name = "small-gpu", .memory_bytes = 64u << 20};
    struct kt_engine_params p = {.n_ctx = 64, .n_threads = 1, .kv_blocks = 40000, .device = &small};
    struct kt_engine *e = NULL;
    kt_err err = {0};
    KT_CHECK(kt_engine_create(m, &p, &e, &err) == KT_OK, "a large KV pool on the host: %s", err.msg);
    kt_engine_destroy(e);
    e = NULL;
    p.attention_on_device = true;
    KT_CHECK(kt_engine_create(m, &p, &e, &err) == KT_ERR_NOMEM && !e, "the same pool on a 64 MiB device refused");
    KT_CHECK(strstr(err.msg, "small-gpu") && strstr(err.msg, "budget"), "message names device and budget: %s", err.msg);
    printf("  %s\n", err.msg);
    kt_test_synth_remove(m, path);
}

/* One model's splits on the GPU against CPU-only: no routed experts (the
 * shared experts and dense FFNs only), half, or all of them, with and
 * without attention (and the KV cache and output head) there. */
static void cuda_splits_match_cpu_only(const char *preset)
{
    char path[1024];
    struct kt_model *m = kt_test_synth_model(preset, "", path, sizeof path);
    if (!m)
        return;
    const size_t V = m->hp.n_vocab;
    struct expert_masks masks = make_masks(m);
    const uint8_t *none = masks.none, *half = masks.half, *all = masks.all;
    const struct kt_backend_params gpu = {.kind = KT_BACKEND_CUDA, .name = "gpu"};
    const struct {
        const char *what;
        struct kt_engine_params p;
    } cases[] = {
        {"no routed experts, shared + dense",
         {.device = &gpu, .expert_on_device = none, .shared_on_device = true, .dense_on_device = true}},
        {"half the experts + shared + dense",
         {.device = &gpu, .expert_on_device = half, .shared_on_device = true, .dense_on_device = true}},
        {"every expert", {.device = &gpu, .expert_on_device = all}},
        {"attention + half the experts + shared + dense + output head",
         {.device = &gpu, .expert_on_device = half, .shared_on_device = true, .dense_on_device = true,
          .attention_on_device = true, .output_on_device = true}},
        {"everything (GPU-only)",
         {.device = &gpu, .expert_on_device = all, .shared_on_device = true, .dense_on_device = true,
          .attention_on_device = true, .output_on_device = true}},
        {"attention + half the experts, one expert per layer on or off the GPU before every step",
         {.device = &gpu, .expert_on_device = half, .attention_on_device = true,
          .test = &(struct kt_engine_test_params){.migrate_every_step = true}}},
        {"attention + half the experts + a cache of 4 slots per layer for the others",
         {.device = &gpu, .expert_on_device = half, .attention_on_device = true,
          .expert_cache = &(struct kt_expert_cache_params){4, KT_EXPERT_CACHE_LRU},
          .test = &(struct kt_engine_test_params){.expert_cache_unthrottled = true}}},
    };
    int32_t base_tokens[DECODE_STEPS], tokens[DECODE_STEPS];
    struct kt_engine_stats st;
    struct kt_backend_stats dev;
    float *base = run(m, &(struct kt_engine_params){0}, base_tokens, &st, &dev);
    for (size_t c = 0; base && c < sizeof cases / sizeof cases[0]; c++) {
        float *got = run(m, &cases[c].p, tokens, &st, &dev);
        if (!got)
            continue;
        const double d = kt_test_worst_row_diff(base, got, PROMPT_LEN + DECODE_STEPS, V);
        printf("  cuda, %s, %s: worst row diff %.3g of the row's largest logit; device busy %.2f ms (%.2f ms "
               "copying)\n",
               preset, cases[c].what, d, dev.busy_ns / 1e6, dev.transfer_ns / 1e6);
        KT_CHECK(d <= 1e-2, "cuda, %s, %s: logits within 1e-2 of CPU-only (%.3g)", preset, cases[c].what, d);
        KT_CHECK(!memcmp(tokens, base_tokens, sizeof tokens), "cuda, %s, %s: greedy tokens equal CPU-only's", preset,
                 cases[c].what);
        KT_CHECK(st.device_pairs > 0 && dev.busy_ns > 0, "cuda, %s, %s: the GPU ran pairs and was timed", preset,
                 cases[c].what);
        if (cases[c].p.attention_on_device) /* decode steps replayed CUDA graphs */
            KT_CHECK(dev.graph_launches > 0, "cuda, %s, %s: graphs replayed", preset, cases[c].what);
        free(got);
    }
    free(base);
    free_masks(&masks);
    kt_test_synth_remove(m, path);
}

/* The same splits on a real GPU (and on tests/cuda_emulated.c, which rounds
 * as the GPU does).  tiny's weights are F32 and so are the CPU's activations;
 * the GPU's products of up to 8 tokens are F32 too (GEMV), but larger ones -
 * the 12-token prompt's dense and shared FFN, units of more than 8 pairs, the
 * attention projections from 64 tokens - round x and W to BF16 (TENSOR,
 * cuBLASLt; kernels/cuda/README.md, "Numerics").  So:
 *   - a prompt of 8 tokens or fewer takes F32 paths only: logits within 1e-4
 *     of each row's largest;
 *   - the 12-token prompt: within 1e-2 (an H200 gave 2.5e-3 .. 5.9e-3, the
 *     emulation 2.5e-3 .. 6.5e-3), and the greedy tokens are CPU-only's;
 *   - long prompts (80 and 250 tokens): BF16's ~0.4% per product can flip a
 *     near-tied top-k choice of some token, whose row then moves by ~10%
 *     (H200: worst rows 0.126 and 0.133; the emulation 0.126 and 0.155), so
 *     the median row is held within 1e-2 and 9 rows in 10 within 3e-2.
 * With attention there too, the KV cache lives in GPU memory and the fork
 * scenario's copy-on-write runs on the GPU. */
/* A prompt of 8 tokens, then decode: every GPU product takes an F32 path, so
 * the whole model on the GPU stays within 1e-4 of CPU-only. */
static void cuda_f32_paths_match_cpu_only_closely(const char *preset)
{
    char path[1024];
    struct kt_model *m = kt_test_synth_model(preset, "", path, sizeof path);
    if (!m)
        return;
    struct expert_masks masks = make_masks(m);
    const struct kt_backend_params gpu = {.kind = KT_BACKEND_CUDA, .name = "gpu"};
    const struct kt_engine_params all = {.device = &gpu, .expert_on_device = masks.all, .shared_on_device = true,
                                         .dense_on_device = true, .attention_on_device = true,
                                         .output_on_device = true};
    enum { SHORT = 8, STEPS = 8 };
    int32_t base_tokens[STEPS], tokens[STEPS];
    float *base = kt_test_engine_greedy(m, &(struct kt_engine_params){0}, prompt, SHORT, STEPS, base_tokens, NULL, NULL);
    float *got = kt_test_engine_greedy(m, &all, prompt, SHORT, STEPS, tokens, NULL, NULL);
    if (base && got) {
        const double d = kt_test_worst_row_diff(base, got, SHORT + STEPS, m->hp.n_vocab);
        printf("  cuda, %s, an 8-token prompt (F32 products only), everything on the GPU: worst row diff %.3g\n",
               preset, d);
        KT_CHECK(d <= 1e-4, "cuda, %s, F32 paths: logits within 1e-4 of CPU-only (%.3g)", preset, d);
        KT_CHECK(!memcmp(tokens, base_tokens, sizeof tokens), "cuda, %s, F32 paths: greedy tokens equal", preset);
    }
    free(base);
    free(got);
    free_masks(&masks);
    kt_test_synth_remove(m, path);
}

/* Long prompts through the BF16 paths: the median row within 1e-2, 9 in 10
 * within 3e-2 (a flipped routing choice moves its token's row alone). */
/* A BF16 (and F16) KV cache on the GPU: its kernels write rows rounded and
 * read them widened, as the CPU's attention does, so everything on the GPU
 * gives CPU-only's logits with the same row type within the F32 paths' 1e-4,
 * and the same greedy tokens. */
static void cuda_half_kv_cache_matches_cpu_only_closely(const char *preset)
{
    char path[1024];
    struct kt_model *m = kt_test_synth_model(preset, "", path, sizeof path);
    if (!m)
        return;
    struct expert_masks masks = make_masks(m);
    const struct kt_backend_params gpu = {.kind = KT_BACKEND_CUDA, .name = "gpu"};
    const enum kt_row_type types[] = {KT_ROW_BF16, KT_ROW_F16};
    enum { SHORT = 8, STEPS = 8 };
    for (size_t k = 0; k < 2; k++) {
        const struct kt_engine_params all = {.device = &gpu, .expert_on_device = masks.all, .shared_on_device = true,
                                             .dense_on_device = true, .attention_on_device = true,
                                             .output_on_device = true, .kv_type = types[k]};
        int32_t base_tokens[STEPS], tokens[STEPS];
        float *base = kt_test_engine_greedy(m, &(struct kt_engine_params){.kv_type = types[k]}, prompt, SHORT, STEPS,
                                            base_tokens, NULL, NULL);
        float *got = kt_test_engine_greedy(m, &all, prompt, SHORT, STEPS, tokens, NULL, NULL);
        if (base && got) {
            const double d = kt_test_worst_row_diff(base, got, SHORT + STEPS, m->hp.n_vocab);
            printf("  cuda, %s, %s KV cache, everything on the GPU: worst row diff %.3g against CPU-only %s\n", preset,
                   kt_row_type_name(types[k]), d, kt_row_type_name(types[k]));
            KT_CHECK(d <= 1e-4, "cuda, %s, %s KV: logits within 1e-4 of CPU-only's (%.3g)", preset,
                     kt_row_type_name(types[k]), d);
            KT_CHECK(!memcmp(tokens, base_tokens, sizeof tokens), "cuda, %s, %s KV: greedy tokens equal", preset,
                     kt_row_type_name(types[k]));
        }
        free(base);
        free(got);
    }
    free_masks(&masks);
    kt_test_synth_remove(m, path);
}

static void long_tolerance_check(const char *what, const float *base, const float *got, size_t rows, size_t V)
{
    const double med = kt_test_row_diff_quantile(base, got, rows, V, 0.5),
                 p90 = kt_test_row_diff_quantile(base, got, rows, V, 0.9),
                 worst = kt_test_worst_row_diff(base, got, rows, V);
    printf("  cuda, %s: row diffs median %.3g, 90th percentile %.3g, worst %.3g\n", what, med, p90, worst);
    KT_CHECK(med <= 1e-2 && p90 <= 3e-2, "cuda, %s: median row within 1e-2 (%.3g), 9 in 10 within 3e-2 (%.3g)",
             what, med, p90);
}

static void cuda_hybrid_matches_cpu_only_within_tolerance(void)
{
    kt_err why = {0};
    if (kt_cuda_device_count(&why) == 0) {
        printf("  skipped: no CUDA device (%s); the sim cases above ran\n", why.msg);
        return;
    }
    cuda_splits_match_cpu_only("tiny");
    cuda_splits_match_cpu_only("tiny-v3");
    cuda_f32_paths_match_cpu_only_closely("tiny");
    cuda_f32_paths_match_cpu_only_closely("tiny-v3");
    cuda_half_kv_cache_matches_cpu_only_closely("tiny");
    char path[1024];
    struct kt_model *m = kt_test_synth_model("tiny", "", path, sizeof path);
    if (!m)
        return;
    const size_t LE = (size_t)m->hp.n_layer * m->hp.n_expert, V = m->hp.n_vocab;
    uint8_t *half = calloc(LE, 1);
    for (size_t i = 0; i < LE; i++)
        half[i] = (i % m->hp.n_expert) < m->hp.n_expert / 2;
    const struct kt_backend_params gpu = {.kind = KT_BACKEND_CUDA, .name = "gpu"};
    const struct kt_engine_params hybrid = {.device = &gpu, .expert_on_device = half, .shared_on_device = true,
                                            .dense_on_device = true, .attention_on_device = true,
                                            .output_on_device = true};
    /* a prefill of 80 tokens: the attention projections go through cuBLASLt
     * (BF16 operands, so a looser bound) */
    enum { LONG = 80 };
    int32_t long_prompt[LONG];
    for (int i = 0; i < LONG; i++)
        long_prompt[i] = (int32_t)((i * 37 + 1) % V);
    struct kt_engine_params lp = hybrid;
    lp.n_ctx = 128;
    lp.max_batch_tokens = LONG;
    lp.n_threads = 2;
    float *long_base = kt_test_engine_greedy(m, &(struct kt_engine_params){.n_ctx = 128, .max_batch_tokens = LONG,
                                                                           .n_threads = 2},
                                             long_prompt, LONG, 1, NULL, NULL, NULL);
    float *long_got = kt_test_engine_greedy(m, &lp, long_prompt, LONG, 1, NULL, NULL, NULL);
    if (long_base && long_got) {
        long_tolerance_check("an 80-token prefill with attention through cuBLASLt", long_base, long_got, LONG + 1, V);
    }
    free(long_base);
    free(long_got);

    /* decode across a graph bucket's edge: contexts 251 .. 262 cross 256,
     * where the graphs sized for 256 positions give way to those for 512 */
    enum { EDGE = 250, EDGE_STEPS = 12 };
    int32_t edge_prompt[EDGE], edge_base_tokens[EDGE_STEPS], edge_tokens[EDGE_STEPS];
    for (int i = 0; i < EDGE; i++)
        edge_prompt[i] = (int32_t)((i * 53 + 7) % V);
    struct kt_engine_params ep = hybrid;
    ep.n_ctx = 512;
    ep.max_batch_tokens = 256;
    ep.n_threads = 2;
    float *edge_base = kt_test_engine_greedy(m, &(struct kt_engine_params){.n_ctx = 512, .max_batch_tokens = 256,
                                                                           .n_threads = 2},
                                             edge_prompt, EDGE, EDGE_STEPS, edge_base_tokens, NULL, NULL);
    struct kt_backend_stats edge_dev;
    float *edge_got = kt_test_engine_greedy(m, &ep, edge_prompt, EDGE, EDGE_STEPS, edge_tokens, NULL, &edge_dev);
    if (edge_base && edge_got) {
        long_tolerance_check("decode from 250 to 262 positions (a graph bucket edge)", edge_base, edge_got,
                             EDGE + EDGE_STEPS, V);
        printf("    %llu graph launches\n", (unsigned long long)edge_dev.graph_launches);
        KT_CHECK(!memcmp(edge_tokens, edge_base_tokens, sizeof edge_tokens), "cuda bucket edge: greedy tokens equal");
        KT_CHECK(edge_dev.graph_launches > 0, "cuda bucket edge: graphs replayed");
    }
    free(edge_base);
    free(edge_got);

    float *fork_base = run_forked(m, &(struct kt_engine_params){0});
    float *fork_got = run_forked(m, &hybrid);
    if (fork_base && fork_got) {
        const double d = kt_test_worst_row_diff(fork_base, fork_got, 2 * FORK_STEPS, V);
        printf("  cuda, forked sequences with the KV cache on the GPU: worst row diff %.3g\n", d);
        KT_CHECK(d <= 1e-2, "cuda forked sequences within 1e-2 of CPU-only (%.3g)", d);
    }
    free(fork_base);
    free(fork_got);
    free(half);
    kt_test_synth_remove(m, path);
}

/* What an engine of model m with params p holds on its device (0 if it cannot be made). */
static uint64_t device_bytes_of(struct kt_model *m, const struct kt_engine_params *p)
{
    struct kt_engine *e = NULL;
    kt_err err = {0};
    uint64_t total = 0, work = 0;
    if (kt_engine_create(m, p, &e, &err) == KT_OK)
        kt_engine_device_bytes(e, &total, &work);
    KT_CHECK(e != NULL, "engine: %s", err.msg);
    kt_engine_destroy(e);
    return total;
}

/* An expert moving onto a device whose budget is spent is refused and
 * changes nothing; after another expert moves off, it fits, and the logits
 * stay CPU-only's. */
static void device_moves_stay_within_the_budget(void)
{
    char path[1024];
    struct kt_model *m = kt_test_synth_model("tiny", "", path, sizeof path);
    if (!m)
        return;
    struct expert_masks masks = make_masks(m);
    struct kt_backend_params sim = {.kind = KT_BACKEND_SIM, .name = "sim0"};
    struct kt_engine_params p = {.n_ctx = 64, .max_batch_tokens = 32, .n_threads = 2, .device = &sim,
                                 .expert_on_device = masks.half};
    struct kt_engine *e = NULL;
    kt_err err = {0};
    uint64_t work = 0;
    const uint64_t need = device_bytes_of(m, &p); /* what this placement takes on the device */
    sim.memory_bytes = need; /* exactly full */
    const uint32_t N = m->hp.n_expert, il = m->hp.n_dense_lead, on = 0, off = N - 1;
    float *base = NULL, *got = NULL;
    if (kt_engine_create(m, &p, &e, &err) != KT_OK) {
        KT_CHECK(0, "engine at a budget of %llu bytes: %s", (unsigned long long)need, err.msg);
        goto done;
    }
    KT_CHECK(kt_engine_expert_on_device(e, il, on) && !kt_engine_expert_on_device(e, il, off), "start");
    kt_status st = kt_engine_expert_to_device(e, il, off, NULL, &err);
    KT_CHECK(st == KT_ERR_NOMEM && strstr(err.msg, "sim0"), "over the budget: refused naming the device (%s: %s)",
             kt_status_name(st), err.msg);
    KT_CHECK(!kt_engine_expert_on_device(e, il, off), "the refused expert stays on the CPU");
    KT_CHECK(kt_engine_expert_to_device(e, il, on, NULL, &err) == KT_ERR_INVALID, "an expert already there: refused");
    KT_CHECK(kt_engine_expert_off_device(e, il, off, &err) == KT_ERR_INVALID, "an expert not there: refused");
    KT_CHECK(kt_engine_expert_off_device(e, il, on, &err) == KT_OK, "off: %s", err.msg);
    KT_CHECK(kt_engine_expert_to_device(e, il, off, NULL, &err) == KT_OK, "then it fits: %s", err.msg);
    KT_CHECK(kt_engine_expert_on_device(e, il, off) && !kt_engine_expert_on_device(e, il, on), "swapped");
    uint64_t total = 0;
    kt_engine_device_bytes(e, &total, &work);
    KT_CHECK(total == need, "the device holds what it held (%llu vs %llu bytes)", (unsigned long long)total,
             (unsigned long long)need);
    struct kt_engine_stats s;
    kt_engine_stats(e, &s);
    KT_CHECK(s.experts_moved == 2, "two moves counted (%llu)", (unsigned long long)s.experts_moved);
    if (m->hp.n_dense_lead > 0)
        KT_CHECK(kt_engine_expert_to_device(e, 0, 0, NULL, &err) == KT_ERR_INVALID, "a dense layer has no routed experts");
    kt_engine_destroy(e);
    e = NULL;
    /* the swapped placement decodes as CPU-only does */
    int32_t base_tokens[DECODE_STEPS], tokens[DECODE_STEPS];
    base = run(m, &(struct kt_engine_params){0}, base_tokens, NULL, NULL);
    masks.half[(size_t)il * N + on] = 0, masks.half[(size_t)il * N + off] = 1;
    got = run(m, &p, tokens, NULL, NULL);
    KT_CHECK(base && got && !memcmp(base, got, (size_t)(PROMPT_LEN + DECODE_STEPS) * m->hp.n_vocab * sizeof *got),
             "the swapped placement's logits equal CPU-only's");
    if (kt_engine_create(m, &(struct kt_engine_params){.n_ctx = 64, .n_threads = 1}, &e, &err) == KT_OK)
        KT_CHECK(kt_engine_expert_to_device(e, il, on, NULL, &err) == KT_ERR_UNSUPPORTED, "no device: refused");
done:
    kt_engine_destroy(e);
    free(base), free(got);
    free_masks(&masks);
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

/* One step of engine e: `n` tokens of seq 0 from position pos, the last one's logits. */
static kt_status step_seq0(struct kt_engine *e, const int32_t *tok, uint32_t n, uint32_t pos, float *logits,
                           kt_err *err)
{
    struct kt_batch_token bt[PROMPT_LEN];
    for (uint32_t i = 0; i < n; i++)
        bt[i] = (struct kt_batch_token){.token = tok[i], .seq = 0, .pos = pos + i, .want_logits = i + 1 == n};
    return kt_engine_step(e, &(struct kt_batch){n, bt}, logits, err);
}

/* kt-synth's tiny: a GGUF, or (hf_weights: kt-synth's --hf-weights kind)
 * a checkpoint directory at the test path named tag. */
static struct kt_model *open_tiny(const char *hf_weights, const char *tag, char *path, size_t path_size)
{
    if (!hf_weights)
        return kt_test_synth_model("tiny", "", path, path_size);
    struct kt_model *m = NULL;
    snprintf(path, path_size, "%s", kt_test_path(tag));
    kt_test_system("rm -rf '%s'", path);
    kt_err err = {0};
    KT_CHECK(kt_test_system("'%s' --preset tiny --format hf --hf-weights %s -q -o '%s' >/dev/null 2>&1",
                            kt_test_tool("kt-synth"), hf_weights, path) == 0 &&
                 kt_model_open(path, &m, &err) == KT_OK,
             "checkpoint %s: %s", hf_weights, err.msg);
    return m;
}

static void close_tiny(struct kt_model *m, const char *hf_weights, const char *path)
{
    if (hf_weights) {
        kt_model_close(m);
        kt_test_system("rm -rf '%s'", path);
    } else {
        kt_test_synth_remove(m, path);
    }
}

/* An engine of params p and a CPU-only one, sequence 0 added to both, the
 * prompt stepped through both: true when their logits are the same bits
 * (*e and *ref NULL when they could not be made). */
static bool lockstep_prompt(struct kt_model *m, const struct kt_engine_params *p, struct kt_engine **e,
                            struct kt_engine **ref, float *got, float *want, const char *name)
{
    kt_err err = {0};
    const size_t V = m->hp.n_vocab;
    if (kt_engine_create(m, p, e, &err) != KT_OK ||
        kt_engine_create(m, &(struct kt_engine_params){.n_ctx = 64, .max_batch_tokens = 32, .n_threads = 2}, ref,
                         &err) != KT_OK ||
        kt_engine_seq_add(*e, 0, &err) != KT_OK || kt_engine_seq_add(*ref, 0, &err) != KT_OK) {
        KT_CHECK(0, "%s: engines: %s", name, err.msg);
        kt_engine_destroy(*e);
        kt_engine_destroy(*ref);
        *e = *ref = NULL;
        return false;
    }
    const bool same = step_seq0(*e, prompt, PROMPT_LEN, 0, got, &err) == KT_OK &&
                      step_seq0(*ref, prompt, PROMPT_LEN, 0, want, &err) == KT_OK && !memcmp(got, want, V * sizeof *got);
    KT_CHECK(same, "%s: the prompt's logits equal CPU-only's (%s)", name, err.msg);
    return same;
}

/* The expert cache on the device (engine.h): an engine with a cache of 4
 * slots per layer and an engine without a device decode in lockstep - after
 * the prompt, each steps the other's greedy token - and every step's logits
 * are bit-identical (the sim computes what the CPU does) while the cache
 * fills, hits and evicts; the routed pairs add up (pinned + hit + miss);
 * a slow link splits each upload into chunks (the device idle a fixed 200 us
 * per layer there: measured, it depends on how fast this host is, and a
 * 16-core host outran the sim so it was never idle); kt_engine_expert_to_device
 * takes a cached expert out of the cache; and a cache the device's budget
 * cannot take is refused naming need and room, changing nothing. */
static void expert_cache_matches_cpu_only_on(enum kt_expert_cache_policy policy, double link_gbps, uint64_t idle_ns,
                                             bool chunked, const char *hf_weights)
{
    char path[1024];
    /* a checkpoint directory: its experts converted into the cache's host rows chunk by chunk */
    struct kt_model *m = open_tiny(hf_weights, "cache-hf", path, sizeof path);
    if (!m)
        return;
    const char *name = hf_weights ? hf_weights : policy == KT_EXPERT_CACHE_LFU ? "lfu" : "lru";
    const size_t V = m->hp.n_vocab;
    const uint32_t Ne = m->hp.n_expert, k = m->hp.n_expert_used, STEPS = 40, SLOTS = 4;
    struct expert_masks masks = make_masks(m);
    uint8_t *two = masks.none; /* experts 0 and 1 of each layer homed on the device, the rest cached or not */
    for (size_t i = 0; i < (size_t)m->hp.n_layer * Ne; i++)
        two[i] = i % Ne < 2;
    const struct kt_backend_params sim = {.kind = KT_BACKEND_SIM, .name = "sim0", .transfer_gbps = link_gbps,
                                          .latency_us = 2};
    const struct kt_expert_cache_params cp = {SLOTS, policy};
    const struct kt_engine_params p = {.n_ctx = 64, .max_batch_tokens = 32, .n_threads = 2, .device = &sim,
                                       .expert_on_device = two, .attention_on_device = true, .expert_cache = &cp,
                                       .test = &(struct kt_engine_test_params){.expert_cache_idle_ns = idle_ns}};
    struct kt_engine *e = NULL, *ref = NULL;
    kt_err err = {0};
    float *got = kt_test_xmalloc(V * sizeof *got), *want = kt_test_xmalloc(V * sizeof *want);
    bool same = lockstep_prompt(m, &p, &e, &ref, got, want, name);
    if (!e || !ref)
        goto done;
    uint32_t differ = 0;
    for (uint32_t s = 0; s < STEPS && same; s++) {
        int32_t next = 0; /* greedy, with a twist every few steps so the routing moves around */
        for (uint32_t v = 1; v < V; v++)
            next = want[v] > want[next] ? (int32_t)v : next;
        next = s % 5 == 4 ? (next * 7 + (int32_t)s) % (int32_t)V : next;
        if (step_seq0(e, &next, 1, PROMPT_LEN + s, got, &err) != KT_OK ||
            step_seq0(ref, &next, 1, PROMPT_LEN + s, want, &err) != KT_OK) {
            KT_CHECK(0, "%s: step %u: %s", name, s, err.msg);
            break;
        }
        differ += memcmp(got, want, V * sizeof *got) != 0;
    }
    KT_CHECK(same && differ == 0, "%s: %u of %u decode steps' logits differ from CPU-only's", name, differ, STEPS);
    struct kt_expert_cache_stats cs;
    KT_CHECK(kt_engine_expert_cache_stats(e, -1, &cs), "%s: the engine has a cache", name);
    const uint32_t n_moe = m->hp.n_layer - m->hp.n_dense_lead;
    const uint64_t routed = (uint64_t)(PROMPT_LEN + STEPS) * k * n_moe;
    printf("  %s, link %.1f GB/s: %llu pinned, %llu hit, %llu missed pairs; %llu uploads in %llu chunks (%.2f MiB), "
           "%llu evictions, %u of %u slots live\n",
           name, link_gbps, (unsigned long long)cs.pinned_pairs, (unsigned long long)cs.hit_pairs,
           (unsigned long long)cs.miss_pairs, (unsigned long long)cs.uploads, (unsigned long long)cs.chunks,
           cs.upload_bytes / 1048576.0, (unsigned long long)cs.evictions, cs.resident, cs.slots);
    KT_CHECK(cs.pinned_pairs + cs.hit_pairs + cs.miss_pairs == routed,
             "%s: pinned + hit + missed pairs = every routed pair (%llu + %llu + %llu vs %llu)", name,
             (unsigned long long)cs.pinned_pairs, (unsigned long long)cs.hit_pairs, (unsigned long long)cs.miss_pairs,
             (unsigned long long)routed);
    KT_CHECK(cs.pinned_pairs > 0 && cs.hit_pairs > 0 && cs.miss_pairs > 0, "%s: pinned, hit and missed pairs", name);
    KT_CHECK(cs.slots == SLOTS * n_moe && cs.resident > 0 && cs.resident <= cs.slots && cs.uploads >= cs.resident,
             "%s: slots live (%u of %u) after %llu uploads", name, cs.resident, cs.slots,
             (unsigned long long)cs.uploads);
    KT_CHECK(chunked ? cs.chunks > cs.uploads : cs.chunks >= cs.uploads,
             "%s: %llu chunks for %llu uploads (slow link: more chunks than uploads)", name,
             (unsigned long long)cs.chunks, (unsigned long long)cs.uploads);
    struct kt_engine_stats st;
    kt_engine_stats(e, &st);
    KT_CHECK(st.experts_moved == 0, "%s: the cache homes nothing (%llu moves)", name,
             (unsigned long long)st.experts_moved);
    /* a cached expert homed on the device leaves the cache */
    for (uint32_t il = m->hp.n_dense_lead, x = 0; x < Ne; x++) {
        struct kt_expert_cache_stats before, after;
        kt_engine_expert_cache_stats(e, (int)il, &before);
        if (kt_engine_expert_on_device(e, il, x) || before.resident == 0)
            continue;
        if (kt_engine_expert_to_device(e, il, x, NULL, &err) != KT_OK) { /* x was not cached: home it, then off again */
            KT_CHECK(0, "%s: to the device: %s", name, err.msg);
            break;
        }
        kt_engine_expert_cache_stats(e, (int)il, &after);
        if (after.resident < before.resident) {
            KT_CHECK(kt_engine_expert_on_device(e, il, x), "%s: expert %u homed on the device after the cache", name, x);
            break;
        }
        kt_engine_expert_off_device(e, il, x, &err);
    }
    KT_CHECK(step_seq0(e, prompt, 1, PROMPT_LEN + STEPS, got, &err) == KT_OK &&
                 step_seq0(ref, prompt, 1, PROMPT_LEN + STEPS, want, &err) == KT_OK &&
                 !memcmp(got, want, V * sizeof *got),
             "%s: after the moves the logits still equal CPU-only's", name);
done:
    kt_engine_destroy(e);
    kt_engine_destroy(ref);
    free(got), free(want);
    free_masks(&masks);
    close_tiny(m, hf_weights, path);
}

/* An expert staged for the device by another thread while the engine steps. */
struct staging {
    const struct kt_engine *e;
    uint32_t il, x;
    struct kt_expert_upload *u;
    kt_err err;
};

static void *stage_upload(void *arg)
{
    struct staging *st = arg;
    kt_engine_expert_upload_read(st->e, st->il, st->x, &st->u, &st->err);
    return NULL;
}

/* The rebalancer's device moves (engine.h): every decode step, a second
 * thread stages an expert not on the device while the engine steps; between
 * two steps one expert goes off the device and the staged one onto it.  The
 * device's budget is exactly what the placement took, so the swap fits only
 * because the expert given back is freed there and then (the one step that
 * could still read it has finished).  Given back, an expert's memory is not
 * freed at once (off_device does not wait for the device's queue) but at the
 * end of the next step; a staged copy of another expert is refused and stays
 * the caller's; the logits equal CPU-only's every step.  On a GGUF (the
 * file's rows copied) and on a checkpoint (an FP8 expert converted as it is
 * staged). */
static void staged_device_moves_on(const char *hf_weights)
{
    char path[1024];
    struct kt_model *m = open_tiny(hf_weights, "staged-hf", path, sizeof path);
    if (!m)
        return;
    const char *name = hf_weights ? hf_weights : "gguf";
    const size_t V = m->hp.n_vocab;
    const uint32_t Ne = m->hp.n_expert, il = m->hp.n_dense_lead, STEPS = 12;
    struct expert_masks masks = make_masks(m);
    struct kt_backend_params sim = {.kind = KT_BACKEND_SIM, .name = "sim0", .transfer_gbps = 25, .latency_us = 2};
    struct kt_engine_params p = {.n_ctx = 64, .max_batch_tokens = 32, .n_threads = 2, .device = &sim,
                                 .expert_on_device = masks.half};
    const uint64_t need = device_bytes_of(m, &p);
    sim.memory_bytes = need; /* exactly full */
    struct kt_engine *e = NULL, *ref = NULL;
    kt_err err = {0};
    float *got = kt_test_xmalloc(V * sizeof *got), *want = kt_test_xmalloc(V * sizeof *want);
    bool same = lockstep_prompt(m, &p, &e, &ref, got, want, name);
    if (!e || !ref)
        goto done;
    uint32_t differ = 0, swaps = 0, held_after_off = 0, freed_after_step = 0;
    for (uint32_t s = 0; s < STEPS && same; s++) {
        uint32_t on = Ne, off = Ne; /* one expert on the device, one not: they trade places */
        for (uint32_t x = 0; x < Ne; x++) {
            const bool there = kt_engine_expert_on_device(e, il, x);
            on = there && on == Ne && x >= s % Ne ? x : on;
            off = !there && off == Ne && x >= (s * 3) % Ne ? x : off;
        }
        for (uint32_t x = 0; x < Ne && (on == Ne || off == Ne); x++) {
            on = on == Ne && kt_engine_expert_on_device(e, il, x) ? x : on;
            off = off == Ne && !kt_engine_expert_on_device(e, il, x) ? x : off;
        }
        struct staging stg = {.e = e, .il = il, .x = off};
        pthread_t t;
        const bool threaded = pthread_create(&t, NULL, stage_upload, &stg) == 0;
        int32_t next = 0;
        for (uint32_t v = 1; v < V; v++)
            next = want[v] > want[next] ? (int32_t)v : next;
        const kt_status a = step_seq0(e, &next, 1, PROMPT_LEN + s, got, &err); /* while the copy is staged */
        if (threaded)
            pthread_join(t, NULL);
        else
            stage_upload(&stg);
        if (a != KT_OK || step_seq0(ref, &next, 1, PROMPT_LEN + s, want, &err) != KT_OK || !stg.u) {
            KT_CHECK(0, "%s: step %u: %s %s", name, s, err.msg, stg.err.msg);
            kt_expert_upload_discard(stg.u);
            break;
        }
        differ += memcmp(got, want, V * sizeof *got) != 0;
        KT_CHECK(kt_engine_expert_to_device(e, il, on == 0 ? 1 : 0, stg.u, &err) != KT_OK,
                 "%s: a staged copy of another expert is refused", name);
        uint64_t total = 0, work = 0;
        if (kt_engine_expert_off_device(e, il, on, &err) == KT_OK) { /* no step between: nothing freed yet */
            kt_engine_device_bytes(e, &total, &work);
            held_after_off += total == need; /* still there until a step has run */
        }
        if (kt_engine_expert_to_device(e, il, off, stg.u, &err) == KT_OK)
            swaps++;
        else {
            KT_CHECK(0, "%s: step %u: onto the device: %s", name, s, err.msg);
            kt_expert_upload_discard(stg.u);
        }
        KT_CHECK(kt_engine_expert_on_device(e, il, off) && !kt_engine_expert_on_device(e, il, on),
                 "%s: step %u: experts %u and %u swapped", name, s, on, off);
        kt_engine_device_bytes(e, &total, &work);
        KT_CHECK(total == need, "%s: step %u: the device holds what it held (%llu vs %llu bytes)", name, s,
                 (unsigned long long)total, (unsigned long long)need);
    }
    /* one more expert given back: its memory is held until the next step ends, and that step's logits are
     * still CPU-only's */
    uint32_t more = Ne;
    for (uint32_t x = 0; x < Ne && more == Ne; x++)
        more = kt_engine_expert_on_device(e, il, x) ? x : more;
    uint64_t total = 0, work = 0;
    if (same && more < Ne && kt_engine_expert_off_device(e, il, more, &err) == KT_OK) {
        kt_engine_device_bytes(e, &total, &work);
        held_after_off += total == need;
        int32_t next = 0;
        for (uint32_t v = 1; v < V; v++)
            next = want[v] > want[next] ? (int32_t)v : next;
        KT_CHECK(step_seq0(e, &next, 1, PROMPT_LEN + STEPS, got, &err) == KT_OK &&
                     step_seq0(ref, &next, 1, PROMPT_LEN + STEPS, want, &err) == KT_OK &&
                     !memcmp(got, want, V * sizeof *got),
                 "%s: the step after it equals CPU-only's (%s)", name, err.msg);
        kt_engine_device_bytes(e, &total, &work);
        freed_after_step += total < need;
    }
    KT_CHECK(same && differ == 0, "%s: %u of %u decode steps' logits differ from CPU-only's", name, differ, STEPS);
    KT_CHECK(swaps == STEPS, "%s: %u of %u swaps made within the full budget", name, swaps, STEPS);
    KT_CHECK(held_after_off == STEPS + 1 && freed_after_step == 1,
             "%s: given back, an expert's device memory is held until a step ends (%u of %u times), then freed (%u)",
             name, held_after_off, STEPS + 1, freed_after_step);
    printf("  %s: %u swaps with a staged copy each, logits equal to CPU-only's every step\n", name, swaps);
done:
    kt_engine_destroy(e);
    kt_engine_destroy(ref);
    free(got), free(want);
    free_masks(&masks);
    close_tiny(m, hf_weights, path);
}

static void staged_device_moves_match_cpu_only(void)
{
    staged_device_moves_on(NULL);
    staged_device_moves_on("fp8");
}

static void expert_cache_matches_cpu_only(enum kt_expert_cache_policy policy, double link_gbps, uint64_t idle_ns,
                                          bool chunked)
{
    expert_cache_matches_cpu_only_on(policy, link_gbps, idle_ns, chunked, NULL);
}

/* A checkpoint's INT4 and FP8 experts are never in memory whole: the cache
 * converts each into its host rows as the chunks need them (a slow link:
 * many chunks an expert), with the same logits as CPU-only. */
static void expert_cache_on_a_checkpoint_matches_cpu_only(void)
{
    expert_cache_matches_cpu_only_on(KT_EXPERT_CACHE_LRU, 0.2, 200000, true, "int4-experts"); /* Q4_0: 1/7 of F32 */
    expert_cache_matches_cpu_only_on(KT_EXPERT_CACHE_LFU, 25, 0, false, "fp8");
}

static void expert_cache_lru_matches_cpu_only(void)
{
    expert_cache_matches_cpu_only(KT_EXPERT_CACHE_LRU, 25, 0, false);
}

static void expert_cache_lfu_matches_cpu_only(void)
{
    expert_cache_matches_cpu_only(KT_EXPERT_CACHE_LFU, 25, 0, false);
}

static void expert_cache_uploads_in_chunks_over_a_slow_link(void)
{
    expert_cache_matches_cpu_only(KT_EXPERT_CACHE_LRU, 2, 200000, true);
}

/* A cache the device's remaining budget cannot take is refused, naming the
 * device, the need and the room; the engine and its device are as they were. */
static void expert_cache_over_the_budget_is_refused(void)
{
    char path[1024];
    struct kt_model *m = kt_test_synth_model("tiny", "", path, sizeof path);
    if (!m)
        return;
    struct expert_masks masks = make_masks(m);
    struct kt_backend_params sim = {.kind = KT_BACKEND_SIM, .name = "sim0"};
    struct kt_engine_params p = {.n_ctx = 64, .max_batch_tokens = 32, .n_threads = 1, .device = &sim,
                                 .expert_on_device = masks.half};
    struct kt_engine *e = NULL;
    kt_err err = {0};
    uint64_t work = 0, after = 0;
    const struct kt_expert_cache_params cp = {8, KT_EXPERT_CACHE_LRU};
    const uint64_t need = device_bytes_of(m, &p);
    p.expert_cache = &cp;
    const uint64_t with_cache = device_bytes_of(m, &p);
    KT_CHECK(with_cache > need, "the cache takes device memory (%llu vs %llu bytes)", (unsigned long long)with_cache,
             (unsigned long long)need);
    sim.memory_bytes = with_cache - 1; /* one byte short */
    p.expert_cache = NULL;
    if (kt_engine_create(m, &p, &e, &err) != KT_OK) {
        KT_CHECK(0, "engine: %s", err.msg);
        goto done;
    }
    kt_status st = kt_engine_expert_cache_start(e, &cp, &err);
    KT_CHECK(st == KT_ERR_NOMEM && strstr(err.msg, "sim0") && strstr(err.msg, "MiB free"),
             "refused naming the device and the room (%s: %s)", kt_status_name(st), err.msg);
    printf("  %s\n", err.msg);
    kt_engine_device_bytes(e, &after, &work);
    struct kt_expert_cache_stats cs;
    KT_CHECK(after == need && !kt_engine_expert_cache_stats(e, -1, &cs), "nothing changed (%llu vs %llu bytes)",
             (unsigned long long)after, (unsigned long long)need);
    KT_CHECK(kt_engine_expert_cache_start(e, &(struct kt_expert_cache_params){0, KT_EXPERT_CACHE_LRU}, &err) ==
                 KT_ERR_INVALID,
             "0 slots: refused");
    KT_CHECK(kt_engine_expert_cache_start(e, &(struct kt_expert_cache_params){1, KT_EXPERT_CACHE_LRU}, &err) == KT_OK,
             "1 slot fits: %s", err.msg);
    KT_CHECK(kt_engine_expert_cache_start(e, &cp, &err) == KT_ERR_INVALID, "a second start: refused");
    kt_engine_destroy(e), e = NULL;
    if (kt_engine_create(m, &(struct kt_engine_params){.n_ctx = 64, .n_threads = 1}, &e, &err) == KT_OK)
        KT_CHECK(kt_engine_expert_cache_start(e, &cp, &err) == KT_ERR_UNSUPPORTED, "no device: refused");
done:
    kt_engine_destroy(e);
    free_masks(&masks);
    kt_test_synth_remove(m, path);
}

#ifdef KT_TEST_CUDA_EMULATED
extern int kt_cuda_emulated_fail_call; /* cuda_emulated.c */

/* A step that fails on the device (a kernel launch fails in the middle of
 * it) reports the device's error, leaves every sequence as it was (KV length
 * included) and the engine usable: the same step again gives the logits of
 * an engine that never failed, and so does the step after it. */
static void failed_device_step_changes_nothing(void)
{
    char path[1024];
    struct kt_model *m = kt_test_synth_model("tiny", "", path, sizeof path);
    if (!m)
        return;
    const size_t V = m->hp.n_vocab;
    struct expert_masks masks = make_masks(m);
    const struct kt_backend_params gpu = {.kind = KT_BACKEND_CUDA, .name = "gpu"};
    const struct kt_engine_params p = {.n_ctx = 64, .max_batch_tokens = 32, .n_threads = 2, .device = &gpu,
                                       .expert_on_device = masks.half, .shared_on_device = true,
                                       .attention_on_device = true, .output_on_device = true};
    struct kt_engine *e = NULL, *ref = NULL;
    kt_err err = {0};
    float *got = kt_test_xmalloc(V * sizeof *got), *want = kt_test_xmalloc(V * sizeof *want);
    if (kt_engine_create(m, &p, &e, &err) != KT_OK || kt_engine_create(m, &p, &ref, &err) != KT_OK ||
        kt_engine_seq_add(e, 0, &err) != KT_OK || kt_engine_seq_add(ref, 0, &err) != KT_OK) {
        KT_CHECK(0, "engines: %s", err.msg);
        goto done;
    }
    KT_CHECK(step_seq0(e, prompt, PROMPT_LEN, 0, got, &err) == KT_OK, "prefill: %s", err.msg);
    KT_CHECK(step_seq0(ref, prompt, PROMPT_LEN, 0, want, &err) == KT_OK, "prefill: %s", err.msg);
    const int32_t next[2] = {7, 11};
    for (uint32_t fail_at = 1; fail_at <= 3; fail_at++) { /* the first, second, third kernel of the step */
        kt_cuda_emulated_fail_call = (int)fail_at;
        err = (kt_err){0};
        const kt_status st = step_seq0(e, next, 1, PROMPT_LEN, got, &err);
        KT_CHECK(st == KT_ERR_IO && strstr(err.msg, "emulated kernel failure"),
                 "kernel %u of the step fails: the step reports it (%s: %s)", fail_at, kt_status_name(st), err.msg);
        KT_CHECK(kt_engine_seq_length(e, 0) == PROMPT_LEN, "after the failed step the sequence holds %u positions",
                 kt_engine_seq_length(e, 0));
    }
    kt_cuda_emulated_fail_call = 0;
    for (uint32_t i = 0; i < 2; i++) {
        KT_CHECK(step_seq0(e, &next[i], 1, PROMPT_LEN + i, got, &err) == KT_OK, "the next step runs: %s", err.msg);
        KT_CHECK(step_seq0(ref, &next[i], 1, PROMPT_LEN + i, want, &err) == KT_OK, "reference: %s", err.msg);
        KT_CHECK(!memcmp(got, want, V * sizeof *got), "step %u after the failures gives the logits of an engine "
                 "that never failed", i);
    }
    KT_CHECK(kt_engine_seq_length(e, 0) == PROMPT_LEN + 2, "the sequence grew by the two steps that ran");
done:
    kt_cuda_emulated_fail_call = 0;
    kt_engine_destroy(e);
    kt_engine_destroy(ref);
    free(got);
    free(want);
    free_masks(&masks);
    kt_test_synth_remove(m, path);
}

/* A failed step empties the expert cache (a slot's copy may have been what
 * failed): slots live before, none after; the next steps run, refill it and
 * stay within the GPU's tolerance of CPU-only. */
static void a_failed_step_empties_the_expert_cache(void)
{
    char path[1024];
    struct kt_model *m = kt_test_synth_model("tiny", "", path, sizeof path);
    if (!m)
        return;
    const size_t V = m->hp.n_vocab;
    struct expert_masks masks = make_masks(m);
    const struct kt_backend_params gpu = {.kind = KT_BACKEND_CUDA, .name = "gpu"};
    const struct kt_expert_cache_params cache = {4, KT_EXPERT_CACHE_LRU};
    const struct kt_engine_params p = {.n_ctx = 64, .max_batch_tokens = 32, .n_threads = 2, .device = &gpu,
                                       .expert_on_device = masks.half, .attention_on_device = true,
                                       .expert_cache = &cache,
                                       .test = &(struct kt_engine_test_params){.expert_cache_unthrottled = true}};
    struct kt_engine *e = NULL, *ref = NULL;
    kt_err err = {0};
    float *got = kt_test_xmalloc(V * sizeof *got), *want = kt_test_xmalloc(V * sizeof *want);
    if (kt_engine_create(m, &p, &e, &err) != KT_OK ||
        kt_engine_create(m, &(struct kt_engine_params){.n_ctx = 64, .max_batch_tokens = 32, .n_threads = 2}, &ref,
                         &err) != KT_OK ||
        kt_engine_seq_add(e, 0, &err) != KT_OK || kt_engine_seq_add(ref, 0, &err) != KT_OK) {
        KT_CHECK(0, "engines: %s", err.msg);
        goto done;
    }
    /* the prompt in two chunks: the second runs experts the first put in slots */
    for (uint32_t at = 0; at < PROMPT_LEN; at += PROMPT_LEN / 2) {
        KT_CHECK(step_seq0(e, prompt + at, PROMPT_LEN / 2, at, got, &err) == KT_OK, "prefill: %s", err.msg);
        KT_CHECK(step_seq0(ref, prompt + at, PROMPT_LEN / 2, at, want, &err) == KT_OK, "prefill: %s", err.msg);
    }
    struct kt_expert_cache_stats cs;
    kt_engine_expert_cache_stats(e, -1, &cs);
    KT_CHECK(cs.resident > 0 && cs.hit_pairs > 0, "the prompt filled slots (%u) and hit them (%llu pairs)",
             cs.resident, (unsigned long long)cs.hit_pairs);
    const int32_t next[3] = {7, 11, 13};
    kt_cuda_emulated_fail_call = 2;
    KT_CHECK(step_seq0(e, next, 1, PROMPT_LEN, got, &err) == KT_ERR_IO, "the step fails: %s", err.msg);
    kt_cuda_emulated_fail_call = 0;
    kt_engine_expert_cache_stats(e, -1, &cs);
    KT_CHECK(cs.resident == 0, "after the failed step no slot is live (%u)", cs.resident);
    for (uint32_t i = 0; i < 3; i++) {
        KT_CHECK(step_seq0(e, &next[i], 1, PROMPT_LEN + i, got, &err) == KT_OK, "step %u: %s", i, err.msg);
        KT_CHECK(step_seq0(ref, &next[i], 1, PROMPT_LEN + i, want, &err) == KT_OK, "reference: %s", err.msg);
        const double d = kt_test_worst_row_diff(got, want, 1, V);
        KT_CHECK(d <= 1e-3, "step %u after the failure: logits within 1e-3 of CPU-only (%.3g)", i, d);
    }
    kt_engine_expert_cache_stats(e, -1, &cs);
    KT_CHECK(cs.resident > 0, "the cache refilled (%u slots live)", cs.resident);
done:
    kt_cuda_emulated_fail_call = 0;
    kt_engine_destroy(e);
    kt_engine_destroy(ref);
    free(got), free(want);
    free_masks(&masks);
    kt_test_synth_remove(m, path);
}
#endif

int main(void)
{
#ifdef KT_TEST_CUDA_EMULATED /* only the cuda cases, against tests/cuda_emulated.c */
    printf("kt_cuda.h emulated on the host: the engine's cuda path, not the GPU kernels\n");
    KT_RUN(cuda_hybrid_matches_cpu_only_within_tolerance);
    KT_RUN(failed_device_step_changes_nothing);
    KT_RUN(a_failed_step_empties_the_expert_cache);
    return kt_test_finish();
#endif
    KT_RUN(tiny_hybrid_matches_cpu_only);
    KT_RUN(tiny_v3_hybrid_matches_cpu_only);
    KT_RUN(tiny_q4_k_hybrid_matches_cpu_only);
    KT_RUN(cuda_hybrid_matches_cpu_only_within_tolerance);
    KT_RUN(kv_cache_on_the_device);
    KT_RUN(device_moves_stay_within_the_budget);
    KT_RUN(staged_device_moves_match_cpu_only);
    KT_RUN(placement_over_the_budget_is_refused);
    KT_RUN(expert_cache_lru_matches_cpu_only);
    KT_RUN(expert_cache_lfu_matches_cpu_only);
    KT_RUN(expert_cache_uploads_in_chunks_over_a_slow_link);
    KT_RUN(expert_cache_on_a_checkpoint_matches_cpu_only);
    KT_RUN(expert_cache_over_the_budget_is_refused);
    return kt_test_finish();
}
