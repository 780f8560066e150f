/*
 * test_check.c - the correctness check (tools/cli/check.h) and the two
 * engine features it stands on.
 *
 * Proves: the engine's reference form gives the logits of every weight read
 * in place from its GGUF rows (the test knobs experts_in_place +
 * keep_gguf_layout), holds no expert store and refuses a device; the layer
 * hook sees every layer of every step with the step's rows, changes no
 * logit, and stops when cleared; the divergence measure is relative to the
 * reference's largest value and infinite on a NaN or an infinity; the check
 * passes a CPU-only candidate and one with the sim device (attention, dense
 * layer, shared and half the routed experts, head: configs/tiny-sim.yaml)
 * at divergence 0 on every row, over prompts longer than a prefill chunk;
 * it fails a candidate whose weights were perturbed (a copy of the model
 * file with one layer's norm scaled, or NaN) and names that layer, or the
 * head when the output norm was; and it refuses a candidate too short for
 * the prompts or whose sequence is taken, saying what to change.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend.h"
#include "check.h"
#include "engine.h"
#include "engine_test.h"
#include "kt_cuda.h"
#include "model.h"
#include "quant.h"
#include "testlib.h"

/* Quantized experts and matrices: the candidate's expert store and host
 * matrices are repacked, the reference reads the GGUF rows. */
#define SYNTH_ARGS "--experts-type q4_k --dense-type q8_0"

static char model_path[1024];

/* A prompt of n random token ids (seeded) below n_vocab. */
static int32_t *random_prompt(uint32_t n, uint32_t n_vocab, unsigned long long seed)
{
    int32_t *ids = kt_test_xmalloc(n * sizeof *ids);
    for (uint32_t i = 0; i < n; i++)
        ids[i] = (int32_t)(kt_test_rand_u64(&seed) % n_vocab);
    return ids;
}

static struct kt_model *open_model(const char *path)
{
    struct kt_model *m = NULL;
    kt_err err = {0};
    KT_CHECK(kt_model_open(path, &m, &err) == KT_OK, "%s", err.msg);
    return m;
}

/* ---- the engine's reference form and layer hook --------------------------------------------- */

static void reference_form_reads_gguf_rows_and_refuses_a_device(void)
{
    struct kt_model *m = open_model(model_path);
    if (!m)
        return;
    enum { N = 12, STEPS = 4 };
    int32_t *prompt = random_prompt(N, m->hp.n_vocab, 7);
    const struct kt_engine_params in_place = {
        .n_ctx = 64, .n_threads = 2,
        .test = &(struct kt_engine_test_params){.experts_in_place = true, .keep_gguf_layout = true}};
    const struct kt_engine_params reference = {.n_ctx = 64, .n_threads = 2, .reference = true};
    float *a = kt_test_engine_greedy(m, &in_place, prompt, N, STEPS, NULL, NULL, NULL);
    float *b = kt_test_engine_greedy(m, &reference, prompt, N, STEPS, NULL, NULL, NULL);
    KT_CHECK(a && b && !memcmp(a, b, (size_t)(N + STEPS) * m->hp.n_vocab * sizeof *a),
             "the reference form's logits are those of every weight read in place");
    free(a);
    free(b);

    struct kt_engine *e = NULL;
    kt_err err = {0};
    KT_CHECK(kt_engine_create(m, &reference, &e, &err) == KT_OK, "%s", err.msg);
    KT_CHECK(e && kt_engine_expert_store_bytes(e) == 0, "the reference form holds no expert store");
    kt_engine_destroy(e);

    const struct kt_backend_params sim = {.kind = KT_BACKEND_SIM, .name = "sim0", .transfer_gbps = 25};
    struct kt_engine_params with_device = reference;
    with_device.device = &sim;
    e = NULL;
    kt_status st = kt_engine_create(m, &with_device, &e, &err);
    KT_CHECK(st == KT_ERR_INVALID && !e && strstr(err.msg, "reference") && strstr(err.msg, "sim0"),
             "a device is refused, named: %d '%s'", (int)st, err.msg);
    kt_engine_destroy(e);
    free(prompt);
    kt_model_close(m);
}

struct hook_log {
    uint32_t calls, next_layer, n_layer, n_embd, want_tokens;
    bool in_order;
    float *last_x;              /* (want_tokens, n_embd) after the last layer */
};

static void log_layer(void *ctx, uint32_t il, const float *x, uint32_t n_tokens, uint32_t n_embd)
{
    struct hook_log *h = ctx;
    h->in_order = h->in_order && il == h->next_layer && n_tokens == h->want_tokens && n_embd == h->n_embd;
    h->next_layer = il + 1 == h->n_layer ? 0 : il + 1;
    h->calls++;
    if (il + 1 == h->n_layer && n_tokens == h->want_tokens && n_embd == h->n_embd)
        memcpy(h->last_x, x, (size_t)n_tokens * n_embd * sizeof *x);
}

static void layer_hook_sees_every_layer_of_every_step(void)
{
    struct kt_model *m = open_model(model_path);
    if (!m)
        return;
    const uint32_t L = m->hp.n_layer, E = m->hp.n_embd, V = m->hp.n_vocab;
    enum { N = 9 };
    int32_t *prompt = random_prompt(N, V, 11);
    struct kt_engine *plain = NULL, *hooked = NULL;
    kt_err err = {0};
    const struct kt_engine_params p = {.n_ctx = 32, .n_threads = 2};
    KT_CHECK(kt_engine_create(m, &p, &plain, &err) == KT_OK && kt_engine_create(m, &p, &hooked, &err) == KT_OK,
             "%s", err.msg);
    struct hook_log log = {.n_layer = L, .n_embd = E, .want_tokens = N, .in_order = true,
                           .last_x = kt_test_xmalloc((size_t)N * E * sizeof(float))};
    float *a = kt_test_xmalloc((size_t)N * V * sizeof *a), *b = kt_test_xmalloc((size_t)N * V * sizeof *b);
    struct kt_batch_token bt[N];
    for (uint32_t i = 0; i < N; i++)
        bt[i] = (struct kt_batch_token){prompt[i], 0, i, true};
    if (plain && hooked) {
        kt_engine_set_layer_hook(hooked, log_layer, &log);
        bool ok = kt_engine_seq_add(plain, 0, &err) == KT_OK && kt_engine_seq_add(hooked, 0, &err) == KT_OK &&
                  kt_engine_step(plain, &(struct kt_batch){N, bt}, a, &err) == KT_OK &&
                  kt_engine_step(hooked, &(struct kt_batch){N, bt}, b, &err) == KT_OK;
        KT_CHECK(ok, "%s", err.msg);
        KT_CHECK(log.calls == L && log.in_order, "a %u-token step: %u calls for %u layers, in order %d", N, log.calls,
                 L, log.in_order);
        KT_CHECK(!memcmp(a, b, (size_t)N * V * sizeof *a), "the hook changed no logit");
        float nonzero = 0;
        for (size_t i = 0; i < (size_t)N * E; i++)
            nonzero = fabsf(log.last_x[i]) > nonzero ? fabsf(log.last_x[i]) : nonzero;
        KT_CHECK(nonzero > 0 && isfinite(nonzero), "the last layer's residual stream was handed over (max %g)",
                 nonzero);
        /* decode steps: one row each, every layer again */
        log.want_tokens = 1;
        for (uint32_t s = 0; ok && s < 3; s++) {
            struct kt_batch_token t = {prompt[s], 0, N + s, true};
            ok = kt_engine_step(hooked, &(struct kt_batch){1, &t}, b, &err) == KT_OK;
        }
        KT_CHECK(ok && log.calls == 4 * L && log.in_order, "3 decode steps: %u calls, in order %d", log.calls,
                 log.in_order);
        kt_engine_set_layer_hook(hooked, NULL, NULL);
        struct kt_batch_token t = {prompt[3], 0, N + 3, true};
        KT_CHECK(kt_engine_step(hooked, &(struct kt_batch){1, &t}, b, &err) == KT_OK && log.calls == 4 * L,
                 "a cleared hook is not called (%u calls)", log.calls);
    }
    kt_engine_destroy(plain);
    kt_engine_destroy(hooked);
    free(log.last_x);
    free(a);
    free(b);
    free(prompt);
    kt_model_close(m);
}

/* ---- the measure ----------------------------------------------------------------------------- */

static void divergence_is_relative_to_the_reference_and_infinite_on_nan(void)
{
    const float ref[4] = {1, 2, -4, 0.5f}, same[4] = {1, 2, -4, 0.5f}, off[4] = {1, 2.5f, -4, 0.5f};
    KT_CHECK(kt_check_divergence(ref, same, 4) == 0, "equal rows: 0");
    KT_CHECK(fabs(kt_check_divergence(ref, off, 4) - 0.5 / 4) < 1e-12, "0.5 off, largest |ref| 4: %g",
             kt_check_divergence(ref, off, 4));
    const float nan_row[4] = {1, NAN, -4, 0.5f}, inf_row[4] = {INFINITY, 2, -4, 0.5f};
    KT_CHECK(isinf(kt_check_divergence(ref, nan_row, 4)), "a NaN in the candidate: infinite");
    KT_CHECK(isinf(kt_check_divergence(inf_row, ref, 4)), "an infinity in the reference: infinite");
    const float zeros[2] = {0, 0}, small[2] = {0, 1e-20f};
    KT_CHECK(kt_check_divergence(zeros, small, 2) > 1e6, "a zero reference row: any difference is huge");
}

/* ---- the check ------------------------------------------------------------------------------- */

enum { LONG_PROMPT = 80, SHORT_PROMPT = 5, MAX_TOKENS = 6 };

/* Two prompts, one longer than a prefill chunk (64) */
struct prompts {
    int32_t *ids[2];
    struct kt_check_prompt p[2];
};

static struct prompts make_prompts(uint32_t n_vocab)
{
    struct prompts s = {.ids = {random_prompt(LONG_PROMPT, n_vocab, 3), random_prompt(SHORT_PROMPT, n_vocab, 5)}};
    s.p[0] = (struct kt_check_prompt){s.ids[0], LONG_PROMPT};
    s.p[1] = (struct kt_check_prompt){s.ids[1], SHORT_PROMPT};
    return s;
}

/* Runs the check of a candidate created over `candidate_model` with params
 * cp; returns its status (the report filled either way). */
static kt_status check(struct kt_model *m, struct kt_model *candidate_model, const struct kt_engine_params *cp,
                       const struct prompts *s, struct kt_check_report *report, kt_err *err)
{
    struct kt_engine *e = NULL;
    *report = (struct kt_check_report){0};
    kt_status st = kt_engine_create(candidate_model, cp, &e, err);
    KT_CHECK(st == KT_OK, "candidate: %s", err->msg);
    if (st != KT_OK)
        return st;
    const struct kt_check_params params = {.max_tokens = MAX_TOKENS, .n_threads = 2};
    st = kt_check_run(m, e, s->p, 2, &params, report, err);
    kt_engine_destroy(e);
    return st;
}

/* Rows, steps and tokens as the lockstep makes them (no tokenizer: no early end). */
static void check_report_shape(const struct kt_check_report *r, const char *what)
{
    KT_CHECK(r->n_prompts == 2 && r->max_tokens == MAX_TOKENS && r->n_layer == 4, "%s: %zu prompts", what,
             r->n_prompts);
    const uint32_t lens[2] = {LONG_PROMPT, SHORT_PROMPT}, chunks[2] = {2, 1};
    uint64_t rows = 0;
    for (size_t i = 0; i < r->n_prompts && i < 2; i++) {
        const struct kt_check_prompt_report *pr = &r->prompts[i];
        rows += pr->n_rows;
        uint32_t generated = 0;
        for (uint32_t k = 0; k < pr->n_rows; k++) {
            generated += pr->rows[k].generated;
            KT_CHECK(pr->rows[k].pos == k, "%s, prompt %zu: row %u is position %u", what, i, k, pr->rows[k].pos);
        }
        KT_CHECK(pr->n_prompt == lens[i] && pr->n_rows == lens[i] + MAX_TOKENS - 1 && generated == MAX_TOKENS &&
                     pr->n_steps == chunks[i] + MAX_TOKENS - 1,
                 "%s, prompt %zu: %u rows, %u generated, %u steps", what, i, pr->n_rows, generated, pr->n_steps);
        KT_CHECK(pr->rows[pr->n_rows - 1].step == pr->n_steps - 1, "%s, prompt %zu: steps numbered", what, i);
    }
    KT_CHECK(r->tokens == rows && r->reference_ns > 0 && r->candidate_ns > 0, "%s: %llu tokens for %llu rows", what,
             (unsigned long long)r->tokens, (unsigned long long)rows);
}

static void check_passes_cpu_only_and_sim_device_candidates(void)
{
    struct kt_model *m = open_model(model_path);
    if (!m)
        return;
    struct prompts s = make_prompts(m->hp.n_vocab);
    const size_t LE = (size_t)m->hp.n_layer * m->hp.n_expert;
    uint8_t *half = kt_test_xmalloc(LE);
    for (size_t i = 0; i < LE; i++)
        half[i] = (i % m->hp.n_expert) < m->hp.n_expert / 2;
    const struct kt_backend_params sim = {.kind = KT_BACKEND_SIM, .name = "sim", .transfer_gbps = 25,
                                          .latency_us = 10};
    const struct {
        const char *what;
        struct kt_engine_params p;
    } cases[] = {
        {"CPU-only", {.n_ctx = 128, .n_threads = 2}},
        {"CPU-only, 2 nodes, experts round-robin",
         {.n_ctx = 128, .n_threads = 2, .topology = "package:2 numa:1 core:1 pu:1",
          .test = &(struct kt_engine_test_params){.experts_round_robin = true}}},
        {"sim: attention, dense, shared, half the experts, head (tiny-sim.yaml)",
         {.n_ctx = 128, .n_threads = 2, .device = &sim, .expert_on_device = half, .shared_on_device = true,
          .attention_on_device = true, .dense_on_device = true, .output_on_device = true}},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        struct kt_check_report r;
        kt_err err = {0};
        kt_status st = check(m, m, &cases[c].p, &s, &r, &err);
        KT_CHECK(st == KT_OK && r.pass, "%s: %s", cases[c].what, st == KT_OK ? "FAIL" : err.msg);
        if (st == KT_OK) {
            check_report_shape(&r, cases[c].what);
            for (size_t i = 0; i < r.n_prompts; i++) {
                const struct kt_check_prompt_report *pr = &r.prompts[i];
                printf("  %s, prompt %zu: median %g, 9 in 10 %g, worst %g\n", cases[c].what, i + 1, pr->median,
                       pr->p90, pr->worst);
                /* the packed formats here are exact, the sim computes what the CPU does */
                KT_CHECK(pr->pass && pr->worst == 0 && pr->break_row < 0 && !pr->layer_divergence &&
                             pr->break_layer < 0 && pr->parted_row < 0,
                         "%s, prompt %zu: worst row %g, break row %d, parted row %d", cases[c].what, i + 1, pr->worst,
                         pr->break_row, pr->parted_row);
            }
        }
        kt_check_report_free(&r);
    }
    free(half);
    free(s.ids[0]);
    free(s.ids[1]);
    kt_model_close(m);
}

/* Everything on a CUDA device (a GPU, or tests/cuda_emulated.c's host
 * emulation in test_check_cuda_emulated): products of more than 8 tokens
 * round through BF16 there, so the 80-token prompt's rows differ from the
 * reference's, within the tolerance: the check passes with nonzero numbers.
 * F32 weights, as test_hybrid_sim's bounds were set on: with quantized
 * ones the CPU reference also rounds its activations to 8 bits where the
 * GPU keeps floats, which on tiny's random weights alone moves the median
 * row to about 1e-2 (0.0104 / 0.0133 on q8_0 + q4_k): such a candidate is
 * held to KT_CHECK_MEDIAN_TOL_GPU_Q / KT_CHECK_P90_TOL_GPU_Q, which the second
 * model here (the slices' mix of types) proves. */
static void check_passes_a_gpu_placement_within_tolerance_on(const char *synth_args)
{
    kt_err why = {0};
    if (kt_cuda_device_count(&why) == 0) {
        printf("  skipped: no CUDA device (%s); test_check_cuda_emulated runs this case\n", why.msg);
        return;
    }
    printf("  tiny %s\n", synth_args ? synth_args : "(f32)");
    char f32_path[1024];
    struct kt_model *m = kt_test_synth_model("tiny", synth_args, f32_path, sizeof f32_path);
    if (!m)
        return;
    struct prompts s = make_prompts(m->hp.n_vocab);
    const size_t LE = (size_t)m->hp.n_layer * m->hp.n_expert;
    uint8_t *all = kt_test_xmalloc(LE);
    memset(all, 1, LE);
    const struct kt_backend_params gpu = {.kind = KT_BACKEND_CUDA, .name = "gpu"};
    const struct kt_engine_params p = {.n_ctx = 128, .n_threads = 2, .device = &gpu, .expert_on_device = all,
                                       .shared_on_device = true, .dense_on_device = true, .attention_on_device = true,
                                       .output_on_device = true};
    struct kt_check_report r;
    kt_err err = {0};
    kt_status st = check(m, m, &p, &s, &r, &err);
    KT_CHECK(st == KT_OK && r.pass, "everything on the GPU: %s", st == KT_OK ? "FAIL" : err.msg);
    /* integer-dot weights on a GPU: the wider stated tolerance; F32 ones: the default */
    KT_CHECK(r.median_tol == (synth_args ? KT_CHECK_MEDIAN_TOL_GPU_Q : KT_CHECK_MEDIAN_TOL) &&
                 r.p90_tol == (synth_args ? KT_CHECK_P90_TOL_GPU_Q : KT_CHECK_P90_TOL),
             "tolerances %g / %g", r.median_tol, r.p90_tol);
    if (st == KT_OK) {
        check_report_shape(&r, "everything on the GPU");
        for (size_t i = 0; i < r.n_prompts; i++) {
            const struct kt_check_prompt_report *pr = &r.prompts[i];
            printf("  everything on the GPU, prompt %zu (%u tokens): median %.3g, 9 in 10 %.3g, worst %.3g, first "
                   "row over %g: %d, starting at layer %d\n",
                   i + 1, pr->n_prompt, pr->median, pr->p90, pr->worst, r.median_tol, pr->break_row, pr->break_layer);
            KT_CHECK(pr->break_row < 0 || (pr->layer_divergence && pr->break_layer >= 0 &&
                                           pr->break_layer <= (int32_t)r.n_layer),
                     "prompt %zu: a row over the tolerance has its layers", i + 1);
        }
        KT_CHECK(r.prompts[0].worst > 0, "the 80-token prompt's BF16 products differ from the reference (%g)",
                 r.prompts[0].worst);
    }
    kt_check_report_free(&r);
    free(all);
    free(s.ids[0]);
    free(s.ids[1]);
    kt_test_synth_remove(m, f32_path);
}

static void check_passes_a_gpu_placement_within_tolerance(void)
{
    check_passes_a_gpu_placement_within_tolerance_on(NULL);
    check_passes_a_gpu_placement_within_tolerance_on("--dense-type q8_0 --experts-type q4_k");
}

/* A copy of the model file at dst with the F32 tensor t multiplied by scale
 * (NaN: every value NaN). */
static bool write_perturbed_copy(const struct kt_model *m, const char *dst, const struct kt_gguf_tensor *t, float scale)
{
    size_t bytes = 0;
    uint8_t *file = kt_test_read_file(model_path, &bytes);
    const uint64_t at = m->gguf->data_offset + t->offset;
    bool ok = file && t->type == KT_TYPE_F32 && at + t->nbytes <= bytes;
    KT_CHECK(ok, "cannot perturb %s", t->name);
    for (uint64_t i = 0; ok && i < t->nbytes / sizeof(float); i++) {
        float v;
        memcpy(&v, file + at + i * sizeof v, sizeof v);
        v = isnan(scale) ? NAN : v * scale;
        memcpy(file + at + i * sizeof v, &v, sizeof v);
    }
    FILE *f = ok ? fopen(dst, "wb") : NULL;
    ok = f && fwrite(file, 1, bytes, f) == bytes;
    if (f)
        ok = fclose(f) == 0 && ok;
    KT_CHECK(ok, "cannot write %s", dst);
    free(file);
    return ok;
}

/* The candidate reads a copy of the file with one norm perturbed: layer 2's
 * FFN input norm, layer 1's compressed-KV norm (the attention block's input
 * norm would not do: MLA normalises its latents again, so a one-token
 * attention would not see it), NaN in layer 3, or the output norm (every
 * layer agrees; the head is named). */
static void check_fails_a_perturbed_candidate_and_names_the_layer(void)
{
    struct kt_model *m = open_model(model_path);
    if (!m)
        return;
    struct prompts s = make_prompts(m->hp.n_vocab);
    const uint32_t L = m->hp.n_layer;
    const struct {
        uint32_t layer;         /* where the divergence starts; L: the head */
        const struct kt_gguf_tensor *norm;
        float scale;
    } cases[] = {{2, m->layers[2].ffn_norm, 8.0f},
                 {1, m->layers[1].attn_kv_a_norm, 8.0f},
                 {3, m->layers[3].ffn_norm, NAN},
                 {L, m->output_norm, 8.0f}};
    char copy[1024];
    snprintf(copy, sizeof copy, "%s", kt_test_path("perturbed.gguf"));
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const char *what = cases[c].norm->name;
        if (!write_perturbed_copy(m, copy, cases[c].norm, cases[c].scale))
            continue;
        struct kt_model *bad = open_model(copy);
        struct kt_check_report r = {0};
        kt_err err = {0};
        if (bad && check(m, bad, &(struct kt_engine_params){.n_ctx = 128, .n_threads = 2}, &s, &r, &err) == KT_OK) {
            const struct kt_check_prompt_report *pr = &r.prompts[0];
            printf("  %s x %g: prompt 1 median %g, worst %g, first row over the tolerance %d, starts at layer %d of "
                   "%u:",
                   what, cases[c].scale, pr->median, pr->worst, pr->break_row, pr->break_layer, r.n_layer);
            for (uint32_t il = 0; pr->layer_divergence && il < r.n_layer; il++)
                printf(" %g", pr->layer_divergence[il]);
            printf("\n");
            KT_CHECK(!r.pass, "%s x %g: the check fails", what, cases[c].scale);
            for (size_t i = 0; i < r.n_prompts; i++) {
                pr = &r.prompts[i];
                KT_CHECK(!pr->pass && pr->break_row == 0 && pr->layer_divergence &&
                             pr->break_layer == (int32_t)cases[c].layer,
                         "%s x %g, prompt %zu: break row %d, layer %d", what, cases[c].scale, i + 1, pr->break_row,
                         pr->break_layer);
                for (uint32_t il = 0; pr->layer_divergence && il < r.n_layer; il++)
                    KT_CHECK(il < cases[c].layer ? pr->layer_divergence[il] == 0 : pr->layer_divergence[il] > 1e-3,
                             "%s, prompt %zu, layer %u: residual divergence %g", what, i + 1, il,
                             pr->layer_divergence[il]);
                if (isnan(cases[c].scale))
                    KT_CHECK(isinf(pr->median) && isinf(pr->worst), "NaN logits: median %g, worst %g", pr->median,
                             pr->worst);
            }
        }
        kt_check_report_free(&r);
        kt_model_close(bad);
        unlink(copy);
    }
    free(s.ids[0]);
    free(s.ids[1]);
    kt_model_close(m);
}

static void check_refuses_a_candidate_it_cannot_run_saying_why(void)
{
    struct kt_model *m = open_model(model_path);
    if (!m)
        return;
    struct prompts s = make_prompts(m->hp.n_vocab);
    struct kt_engine *e = NULL;
    kt_err err = {0};
    struct kt_check_report r = {0};
    /* 80 + 6 positions needed, 64 held */
    KT_CHECK(kt_engine_create(m, &(struct kt_engine_params){.n_ctx = 64, .n_threads = 2}, &e, &err) == KT_OK, "%s",
             err.msg);
    const struct kt_check_params params = {.max_tokens = MAX_TOKENS};
    kt_status st = e ? kt_check_run(m, e, s.p, 2, &params, &r, &err) : KT_ERR_INVALID;
    KT_CHECK(st == KT_ERR_INVALID && strstr(err.msg, "n_ctx >= 86") && !r.pass, "too short: %d '%s'", (int)st,
             err.msg);
    kt_check_report_free(&r);
    kt_engine_destroy(e);

    /* the candidate's sequence is in use */
    e = NULL;
    KT_CHECK(kt_engine_create(m, &(struct kt_engine_params){.n_ctx = 128, .n_threads = 2}, &e, &err) == KT_OK, "%s",
             err.msg);
    st = e && kt_engine_seq_add(e, 0, &err) == KT_OK ? kt_check_run(m, e, s.p, 2, &params, &r, &err) : KT_ERR_INVALID;
    KT_CHECK(st != KT_OK && strstr(err.msg, "sequence 0") && strstr(err.msg, "pick a free one") && !r.pass,
             "a taken sequence: %d '%s'", (int)st, err.msg);
    kt_check_report_free(&r);
    /* and none at all */
    st = e ? kt_check_run(m, e, s.p, 0, &params, &r, &err) : KT_ERR_INVALID;
    KT_CHECK(st == KT_ERR_INVALID && strstr(err.msg, "no prompts"), "no prompts: '%s'", err.msg);
    kt_check_report_free(&r);
    kt_engine_destroy(e);
    free(s.ids[0]);
    free(s.ids[1]);
    kt_model_close(m);
}

int main(void)
{
    const int rc = kt_test_system("'%s' --preset tiny " SYNTH_ARGS " -q -o '%s' > /dev/null 2>&1",
                                  kt_test_tool("kt-synth"), kt_test_path("check.gguf"));
    snprintf(model_path, sizeof model_path, "%s", kt_test_path("check.gguf"));
    KT_CHECK(rc == 0, "kt-synth exited %d", rc);
#ifdef KT_TEST_CUDA_EMULATED /* only the GPU case, against tests/cuda_emulated.c */
    printf("kt_cuda.h emulated on the host: the engine's cuda path, not the GPU kernels\n");
    KT_RUN(check_passes_a_gpu_placement_within_tolerance);
    unlink(model_path);
    return kt_test_finish();
#endif
    KT_RUN(divergence_is_relative_to_the_reference_and_infinite_on_nan);
    KT_RUN(reference_form_reads_gguf_rows_and_refuses_a_device);
    KT_RUN(layer_hook_sees_every_layer_of_every_step);
    KT_RUN(check_passes_cpu_only_and_sim_device_candidates);
    KT_RUN(check_passes_a_gpu_placement_within_tolerance);
    KT_RUN(check_fails_a_perturbed_candidate_and_names_the_layer);
    KT_RUN(check_refuses_a_candidate_it_cannot_run_saying_why);
    unlink(model_path);
    return kt_test_finish();
}
