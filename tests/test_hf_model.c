/*
 * test_hf_model.c - a Hugging Face checkpoint directory loaded and run as a
 * model (runtime/model/hf_model.c): kt-synth's tiny model written as a GGUF
 * (F32) and as BF16, block-FP8 (DeepSeek-V3's form) and INT4-experts
 * (Kimi-K2-Thinking's form) directories, the same random values.
 *
 *  - every tensor gets the kt type its stored form maps to, in place or
 *    converted (hf_model.h's table), and nothing is converted before the
 *    weights are made ready;
 *  - every streamed expert slab, and every converted dense tensor, equals the
 *    format's definition decoded from the checkpoint's own tensors, bit for
 *    bit (kernels/hf_formats.h's decoders);
 *  - logits of a prompt through the engine against the F32 GGUF, within the
 *    bound the format's rounding allows (measured values in the comment at
 *    the bounds), and against the reference forward on the checkpoint's own
 *    weights, where only the activations' 8-bit rounding separates them;
 *  - kt-bench check's core on a directory: its reference form (the experts
 *    read into a store in their GGUF rows) and a CPU-only and a sim-device
 *    candidate agree at divergence 0, and a second engine made from the same
 *    model reads the same weights; everything on a GPU (a real one, or
 *    tests/cuda_emulated.c's emulation) within the check's GPU tolerances;
 *  - kt-run (--info, a prompt, a dry run of a plan), kt-place take a directory;
 *  - an INT4 scale FP16 cannot hold exactly refuses the load, naming the tensor.
 */
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend.h"
#include "check.h"
#include "engine.h"
#include "hf_formats.h"
#include "kt_cuda.h"
#include "model.h"
#include "quant.h"
#include "reference_forward.h"
#include "safetensors.h"
#include "testlib.h"

enum { GGUF_F32, DIR_BF16, DIR_FP8, DIR_INT4, N_FORMS };
static const char *const form_names[N_FORMS] = {"gguf-f32", "bf16", "fp8", "int4-experts"};
static char paths[N_FORMS][1024];

#define N_PROMPT 16
static const int32_t prompt[N_PROMPT] = {1, 17, 300, 42, 999, 5, 77, 512, 3, 1000, 64, 128, 255, 700, 11, 2};

static bool make_models(void)
{
    for (int f = 0; f < N_FORMS; f++) {
        char name[64];
        snprintf(name, sizeof name, "hf-model-%s", form_names[f]);
        snprintf(paths[f], sizeof paths[f], "%s", kt_test_path(name));
        kt_test_system("rm -rf '%s'", paths[f]);
        const int rc = f == GGUF_F32
                           ? kt_test_system("'%s' --preset tiny -q -o '%s' >/dev/null 2>&1", kt_test_tool("kt-synth"),
                                            paths[f])
                           : kt_test_system("'%s' --preset tiny --format hf --hf-weights %s -q -o '%s' >/dev/null 2>&1",
                                            kt_test_tool("kt-synth"), form_names[f], paths[f]);
        KT_CHECK(rc == 0, "kt-synth %s: %d", form_names[f], rc);
        if (rc != 0)
            return false;
    }
    return true;
}

static struct kt_model *open_form(int f)
{
    struct kt_model *m = NULL;
    kt_err err = {0};
    KT_CHECK(kt_model_open(paths[f], &m, &err) == KT_OK, "%s: %s", form_names[f], err.msg);
    return m;
}

static const struct kt_gguf_tensor *tensor(const struct kt_model *m, const char *name)
{
    const struct kt_gguf_tensor *t = kt_gguf_find_tensor(m->gguf, name);
    KT_CHECK(t != NULL, "%s: not in the table", name);
    return t;
}

static void expect(const struct kt_model *m, const char *name, int type, int source, const char *what)
{
    const struct kt_gguf_tensor *t = tensor(m, name);
    if (t)
        KT_CHECK(t->type == type && t->source == source, "%s, %s: type %s source %d, expected %s source %d", what,
                 name, kt_type_name(t->type), t->source, kt_type_name(type), source);
}

/* ---- the table ---------------------------------------------------------------------------- */

static void each_stored_form_becomes_its_kt_type(void)
{
    struct kt_model *bf = open_form(DIR_BF16), *fp = open_form(DIR_FP8), *i4 = open_form(DIR_INT4);
    if (!bf || !fp || !i4)
        goto done;
    const int M = KT_TENSOR_MAPPED, D = KT_TENSOR_DEFERRED, S = KT_TENSOR_STREAMED;
    expect(bf, "token_embd.weight", KT_TYPE_BF16, M, "bf16");
    expect(bf, "blk.1.attn_q_b.weight", KT_TYPE_BF16, M, "bf16");
    expect(bf, "blk.1.attn_norm.weight", KT_TYPE_F32, D, "bf16 norm");
    expect(bf, "blk.1.ffn_gate_inp.weight", KT_TYPE_F32, D, "bf16 router");
    expect(bf, "blk.1.ffn_gate_exps.weight", KT_TYPE_BF16, S, "bf16 experts");
    /* tiny's E = 512 and kvr = 128 are multiples of 128, q_lora_rank 192 is not */
    expect(fp, "blk.1.attn_q_a.weight", KT_TYPE_FP8_B128, D, "fp8");
    expect(fp, "blk.1.attn_v_b.weight", KT_TYPE_FP8_B128, D, "fp8 (kvr 128 wide rows)");
    expect(fp, "blk.1.attn_k_b.weight", KT_TYPE_F32, D, "fp8 (tiny's dn 32: a k_b row spans no whole block)");
    expect(bf, "blk.1.attn_k_b.weight", KT_TYPE_BF16, D, "bf16 k_b");
    expect(fp, "blk.1.attn_q_b.weight", KT_TYPE_F32, D, "fp8, 192 columns");
    expect(fp, "blk.1.ffn_down_exps.weight", KT_TYPE_FP8_B128, S, "fp8 experts");
    expect(fp, "output.weight", KT_TYPE_BF16, M, "fp8 head");
    expect(i4, "blk.1.ffn_up_exps.weight", KT_TYPE_Q4_0, S, "int4 experts");
    expect(i4, "blk.1.attn_output.weight", KT_TYPE_BF16, M, "int4 (attention left unquantized)");
    expect(i4, "blk.1.ffn_gate_shexp.weight", KT_TYPE_BF16, M, "int4 (shared experts left unquantized)");
    const struct kt_gguf_tensor *t = tensor(fp, "blk.1.attn_q_a.weight");
    KT_CHECK(t && !t->data, "a deferred tensor has data before the weights are made ready");
    kt_err err = {0};
    KT_CHECK(kt_model_weights_ready(fp, NULL, NULL, &err) == KT_OK && kt_model_weights_ready(fp, NULL, NULL, &err) == KT_OK, "%s", err.msg);
    KT_CHECK(t && t->data, "a deferred tensor has no data after the weights are made ready");
    /* the same table as the GGUF's: names and shapes (the identity's
     * fingerprint, so profiles and plans made on one hold for the other) and
     * element counts */
    struct kt_model *g = open_form(GGUF_F32);
    if (g) {
        struct kt_model_identity a, c;
        kt_model_identity(g, &a);
        kt_model_identity(i4, &c);
        KT_CHECK(a.fingerprint == c.fingerprint && i4->hp.mla_split && i4->hp.n_head_kv == 1,
                 "fingerprints %llx (gguf) vs %llx (checkpoint), split %d", (unsigned long long)a.fingerprint,
                 (unsigned long long)c.fingerprint, (int)i4->hp.mla_split);
        KT_CHECK(g->n_params == i4->n_params && g->hp.n_vocab == i4->hp.n_vocab, "parameters %llu vs %llu",
                 (unsigned long long)g->n_params, (unsigned long long)i4->n_params);
        KT_CHECK(kt_layer_expert_bytes(i4, 1) == 3 * (uint64_t)g->hp.n_ff_exp * g->hp.n_embd / 32 * 18,
                 "an INT4 expert is %llu bytes of Q4_0", (unsigned long long)kt_layer_expert_bytes(i4, 1));
    }
    kt_model_close(g);
done:
    kt_model_close(bf), kt_model_close(fp), kt_model_close(i4);
}

/* ---- the values: the formats' definitions --------------------------------------------------- */

/* Row r of HF linear `module` (out x in) decoded by the definition. */
static bool decode_row(const struct kt_st_dir *d, const char *module, int64_t in, int64_t r, float *out)
{
    char name[200];
    snprintf(name, sizeof name, "%s.weight_packed", module);
    const struct kt_st_tensor *packed = kt_st_find(d, name);
    if (packed) {
        snprintf(name, sizeof name, "%s.weight_scale", module);
        kt_int4_pack_row_to_f32(packed->data, kt_st_find(d, name)->data, in, 32, r, out);
        return true;
    }
    snprintf(name, sizeof name, "%s.weight", module);
    const struct kt_st_tensor *w = kt_st_find(d, name);
    if (!w)
        return false;
    if (w->dtype == KT_ST_F8_E4M3) {
        snprintf(name, sizeof name, "%s.weight_scale_inv", module);
        kt_fp8_block_row_to_f32(w->data, kt_st_find(d, name)->data, in, 128, 128, r, out);
    } else if (w->dtype == KT_ST_BF16) {
        kt_bf16_row_to_f32(w->data, in, r, out);
    } else {
        memcpy(out, (const float *)w->data + r * in, (size_t)in * sizeof *out);
    }
    return true;
}

/* Every row of kt tensor t (rows from `data`) against module's decoded rows. */
static uint64_t mismatches(const struct kt_st_dir *d, const char *module, int type, const void *data, int64_t in,
                           int64_t rows)
{
    float *a = malloc((size_t)in * sizeof *a), *b = malloc((size_t)in * sizeof *b);
    const size_t row_bytes = kt_type_row_bytes(type, in);
    uint64_t bad = 0;
    for (int64_t r = 0; r < rows; r++) {
        kt_type_traits(type)->to_float((const uint8_t *)data + (size_t)r * row_bytes, a, in);
        if (!decode_row(d, module, in, r, b)) {
            bad++;
            break;
        }
        bad += memcmp(a, b, (size_t)in * sizeof *a) != 0;
    }
    free(a), free(b);
    return bad;
}

/* attn_k_b / attn_v_b against kv_b_proj decoded: v_b row h*dv + j is kv_b
 * row h*(dn+dv) + dn + j, k_b row h*kvr + c element i is kv_b[h*(dn+dv) + i][c]. */
static uint64_t kv_b_mismatches(const struct kt_model *m, const struct kt_st_dir *d, uint32_t il)
{
    const struct kt_hparams *hp = &m->hp;
    const int64_t dn = hp->qk_nope_dim, dv = hp->v_head_dim, H = hp->n_head, kvr = hp->kv_lora_rank;
    const struct kt_layer *L = &m->layers[il];
    char module[200];
    snprintf(module, sizeof module, "model.layers.%u.self_attn.kv_b_proj", il);
    float *row = malloc((size_t)kvr * sizeof *row), *k = malloc((size_t)dn * sizeof *k);
    float *v = malloc((size_t)kvr * sizeof *v);
    uint64_t bad = 0;
    const size_t k_row = kt_type_row_bytes(L->attn_k_b->type, dn), v_row = kt_type_row_bytes(L->attn_v_b->type, kvr);
    for (int64_t h = 0; h < H; h++)
        for (int64_t r = 0; r < dn + dv; r++) {
            if (!decode_row(d, module, kvr, h * (dn + dv) + r, row))
                return 1;
            if (r >= dn) {
                kt_type_traits(L->attn_v_b->type)
                    ->to_float((const uint8_t *)L->attn_v_b->data + (size_t)(h * dv + r - dn) * v_row, v, kvr);
                bad += memcmp(v, row, (size_t)kvr * sizeof *v) != 0;
                continue;
            }
            for (int64_t c = 0; c < kvr; c++) {
                kt_type_traits(L->attn_k_b->type)
                    ->to_float((const uint8_t *)L->attn_k_b->data + (size_t)(h * kvr + c) * k_row, k, dn);
                bad += memcmp(&k[r], &row[c], sizeof *k) != 0;
            }
        }
    free(row), free(k), free(v);
    return bad;
}

static void experts_and_converted_tensors_are_the_formats_definition(void)
{
    for (int f = DIR_BF16; f < N_FORMS; f++) {
        struct kt_model *m = open_form(f);
        struct kt_st_dir *d = NULL;
        kt_err err = {0};
        KT_CHECK(kt_st_open_dir(paths[f], &d, &err) == KT_OK, "%s", err.msg);
        if (!m || !d || kt_model_weights_ready(m, NULL, NULL, &err) != KT_OK) {
            KT_CHECK(false, "%s: %s", form_names[f], err.msg);
            kt_model_close(m), kt_st_close(d);
            continue;
        }
        const struct kt_hparams *hp = &m->hp;
        uint64_t bad = 0, rows = 0;
        char module[200];
        for (uint32_t il = hp->n_dense_lead; il < hp->n_layer; il++) {
            const struct kt_layer *L = &m->layers[il];
            const struct kt_gguf_tensor *mats[3] = {L->ffn_gate_exps, L->ffn_up_exps, L->ffn_down_exps};
            static const char *const parts[3] = {"gate_proj", "up_proj", "down_proj"};
            for (int i = 0; i < 3; i++) {
                const struct kt_gguf_tensor *t = mats[i];
                uint8_t *slab = malloc((size_t)(t->nbytes / (uint64_t)t->ne[2]));
                for (uint32_t x = 0; x < hp->n_expert; x++) {
                    if (kt_model_read_expert(m, t, x, slab, &err) != KT_OK) {
                        KT_CHECK(false, "%s: %s", form_names[f], err.msg);
                        break;
                    }
                    snprintf(module, sizeof module, "model.layers.%u.mlp.experts.%u.%s", il, x, parts[i]);
                    bad += mismatches(d, module, t->type, slab, t->ne[0], t->ne[1]);
                    rows += (uint64_t)t->ne[1];
                }
                free(slab);
            }
            /* converted and in-place dense tensors alike */
            snprintf(module, sizeof module, "model.layers.%u.self_attn.q_a_proj", il);
            bad += mismatches(d, module, L->attn_q_a->type, L->attn_q_a->data, L->attn_q_a->ne[0], L->attn_q_a->ne[1]);
            snprintf(module, sizeof module, "model.layers.%u.self_attn.q_b_proj", il);
            bad += mismatches(d, module, L->attn_q_b->type, L->attn_q_b->data, L->attn_q_b->ne[0], L->attn_q_b->ne[1]);
            snprintf(module, sizeof module, "model.layers.%u.mlp.gate", il);
            bad += mismatches(d, module, L->ffn_gate_inp->type, L->ffn_gate_inp->data, L->ffn_gate_inp->ne[0],
                              L->ffn_gate_inp->ne[1]);
            snprintf(module, sizeof module, "model.layers.%u.input_layernorm", il);
            bad += mismatches(d, module, KT_TYPE_F32, L->attn_norm->data, hp->n_embd, 1);
            bad += kv_b_mismatches(m, d, il);
        }
        printf("     %s: %llu expert rows and each MoE layer's q_a, q_b, router and norm compared\n", form_names[f],
               (unsigned long long)rows);
        KT_CHECK(bad == 0 && rows > 0, "%s: %llu rows differ from the format's definition", form_names[f],
                 (unsigned long long)bad);
        kt_st_close(d);
        kt_model_close(m);
    }
}

/* ---- logits --------------------------------------------------------------------------------- */

static float *engine_logits(struct kt_model *m, const struct kt_engine_params *p)
{
    struct kt_engine *e = NULL;
    kt_err err = {0};
    if (kt_engine_create(m, p, &e, &err) != KT_OK) {
        KT_CHECK(false, "engine: %s", err.msg);
        return NULL;
    }
    const uint32_t V = kt_engine_n_vocab(e);
    float *logits = malloc((size_t)N_PROMPT * V * sizeof *logits);
    struct kt_batch_token bt[N_PROMPT];
    for (uint32_t i = 0; i < N_PROMPT; i++)
        bt[i] = (struct kt_batch_token){prompt[i], 0, i, true};
    KT_CHECK(kt_engine_seq_add(e, 0, &err) == KT_OK, "%s", err.msg);
    KT_CHECK(kt_engine_step(e, &(struct kt_batch){N_PROMPT, bt}, logits, &err) == KT_OK, "step: %s", err.msg);
    kt_engine_destroy(e);
    return logits;
}

/* Mean and smallest cosine of the rows of a and b. */
static void cosines(const float *a, const float *b, uint32_t n, uint32_t V, double *mean, double *min)
{
    *mean = 0, *min = 1;
    for (uint32_t p = 0; p < n; p++) {
        double xy = 0, xx = 0, yy = 0;
        for (uint32_t i = 0; i < V; i++) {
            const double x = a[(size_t)p * V + i], y = b[(size_t)p * V + i];
            xy += x * y, xx += x * x, yy += y * y;
        }
        const double c = isnan(xy / sqrt(xx * yy)) ? -1 : xy / sqrt(xx * yy);
        *mean += c / n;
        *min = fmin(*min, c);
    }
}

/*
 * Bounds against the F32 GGUF (the same values before kt-synth rounded them
 * to the format) and against the reference forward on the directory's own
 * weights.  Measured (seed 1, this file's prompt, mean / min cosine): bf16
 * 0.99968 / 0.99499 vs f32 (the minimum where a near tie in routing flips an
 * expert); fp8 (E4M3: 3 mantissa bits, a scale per 128 x 128) 0.99703 /
 * 0.98781; int4 experts (4 bits, a scale per 32) 0.99734 / 0.98741.  Against
 * their own reference bf16 and fp8 1.000000 (their products take F32
 * activations), int4's Q4_0 experts 0.99899 / 0.98408 (Q8_0 activations, and
 * one routing flip).
 */
static void logits_match_the_gguf_within_the_formats_rounding(void)
{
    const struct {
        int form;
        double mean, min, own_mean, own_min;
    } bounds[] = {{DIR_BF16, 0.999, 0.99, 0.99999, 0.99999},
                  {DIR_FP8, 0.99, 0.98, 0.99999, 0.99999},
                  {DIR_INT4, 0.99, 0.98, 0.998, 0.97}};
    struct kt_model *g = open_form(GGUF_F32);
    const struct kt_engine_params p = {.n_ctx = 64, .max_seqs = 1, .n_threads = 2, .max_batch_tokens = 64};
    float *f32 = g ? engine_logits(g, &p) : NULL;
    for (size_t b = 0; f32 && b < sizeof bounds / sizeof bounds[0]; b++) {
        struct kt_model *m = open_form(bounds[b].form);
        if (!m)
            continue;
        const uint32_t V = m->hp.n_vocab;
        float *got = engine_logits(m, &p);
        double *ref = ref_forward(m, prompt, N_PROMPT);
        float *reff = malloc((size_t)N_PROMPT * V * sizeof *reff);
        for (size_t i = 0; i < (size_t)N_PROMPT * V; i++)
            reff[i] = (float)ref[i];
        double mean, min, own_mean, own_min;
        if (got) {
            cosines(got, f32, N_PROMPT, V, &mean, &min);
            cosines(got, reff, N_PROMPT, V, &own_mean, &own_min);
            printf("     %s: vs the f32 GGUF mean cosine %.6f, min %.6f; vs its own reference %.6f / %.6f\n",
                   form_names[bounds[b].form], mean, min, own_mean, own_min);
            KT_CHECK(mean > bounds[b].mean && min > bounds[b].min, "%s vs f32: mean %.6f (> %g), min %.6f (> %g)",
                     form_names[bounds[b].form], mean, bounds[b].mean, min, bounds[b].min);
            KT_CHECK(own_mean > bounds[b].own_mean && own_min > bounds[b].own_min,
                     "%s vs its reference: mean %.6f (> %g), min %.6f (> %g)", form_names[bounds[b].form], own_mean,
                     bounds[b].own_mean, own_min, bounds[b].own_min);
        }
        free(got), free(ref), free(reff);
        kt_model_close(m);
    }
    free(f32);
    kt_model_close(g);
}

/* ---- the check's core: reference form, sim device, a second engine ---------------------------- */

static void check_of_a_directory_passes_at_zero_divergence(void)
{
    struct kt_model *m = open_form(DIR_INT4);
    if (!m)
        return;
    const size_t LE = (size_t)m->hp.n_layer * m->hp.n_expert;
    uint8_t *half = kt_test_xmalloc(LE);
    for (size_t i = 0; i < LE; i++)
        half[i] = (i % m->hp.n_expert) < m->hp.n_expert / 2;
    const struct kt_backend_params sim = {.kind = KT_BACKEND_SIM, .name = "sim", .transfer_gbps = 25};
    const struct kt_engine_params cases[] = {
        {.n_ctx = 128, .n_threads = 2},
        {.n_ctx = 128, .n_threads = 2, .device = &sim, .expert_on_device = half, .shared_on_device = true,
         .attention_on_device = true, .dense_on_device = true, .output_on_device = true},
    };
    const struct kt_check_prompt prompts[1] = {{prompt, N_PROMPT}};
    for (size_t c = 0; c < 2; c++) {
        struct kt_engine *e = NULL;
        kt_err err = {0};
        struct kt_check_report r = {0};
        kt_status st = kt_engine_create(m, &cases[c], &e, &err);
        KT_CHECK(st == KT_OK, "candidate %zu: %s", c, err.msg);
        if (st == KT_OK)
            st = kt_check_run(m, e, prompts, 1, &(struct kt_check_params){.max_tokens = 6, .n_threads = 2}, &r, &err);
        KT_CHECK(st == KT_OK && r.pass && r.n_prompts == 1 && r.prompts[0].worst == 0, "%s: %s, worst row %g",
                 c ? "sim" : "CPU-only", st == KT_OK ? "ran" : err.msg, r.n_prompts ? r.prompts[0].worst : -1.0);
        kt_check_report_free(&r);
        kt_engine_destroy(e);
    }
    free(half);
    kt_model_close(m);
}

/* ---- a scale that cannot be held exactly ------------------------------------------------------ */

static void an_int4_scale_fp16_cannot_hold_refuses_the_load(void)
{
    struct kt_st_dir *d = NULL;
    kt_err err = {0};
    KT_CHECK(kt_st_open_dir(paths[DIR_INT4], &d, &err) == KT_OK, "%s", err.msg);
    if (!d)
        return;
    const char *name = "model.layers.2.mlp.experts.5.up_proj.weight_scale";
    const struct kt_st_tensor *s = kt_st_find(d, name);
    char shard[1100];
    snprintf(shard, sizeof shard, "%s", s ? d->shards[s->shard].path : "");
    const uint64_t at = s ? s->file_offset : 0;
    kt_st_close(d);
    KT_CHECK(s != NULL, "%s: not found", name);
    const int fd = s ? open(shard, O_WRONLY) : -1;
    const uint16_t tiny_scale = 0x35ff; /* BF16 2^-20 x (1 + 127/128): as an FP16 subnormal it would lose bits */
    KT_CHECK(fd >= 0 && pwrite(fd, &tiny_scale, 2, (off_t)at) == 2, "cannot patch %s", shard);
    if (fd >= 0)
        close(fd);
    struct kt_model *m = open_form(DIR_INT4);
    struct kt_engine *e = NULL;
    if (m) {
        kt_status st = kt_engine_create(m, &(struct kt_engine_params){.n_ctx = 32, .n_threads = 1}, &e, &err);
        KT_CHECK(st == KT_ERR_FORMAT && !e && strstr(err.msg, "model.layers.2.mlp.experts.5.up_proj.weight_packed") &&
                     strstr(err.msg, "FP16"),
                 "status %d: %s", (int)st, err.msg);
        kt_engine_destroy(e);
    }
    kt_model_close(m);
}

/* ---- the tools: -m DIR wherever -m FILE.gguf goes ------------------------------------------- */

static void the_tools_take_a_directory(void)
{
    char out[1100];
    snprintf(out, sizeof out, "%s", kt_test_path("hf-model-tool.out"));
    size_t n = 0;
    const char *dir = paths[DIR_FP8];
    KT_CHECK(kt_test_system("'%s' --info '%s' > '%s' 2>&1", kt_test_tool("kt-run"), dir, out) == 0, "kt-run --info");
    char *text = kt_test_read_file(out, &n);
    KT_CHECK(text && strstr(text, "checkpoint") && strstr(text, "block FP8") && strstr(text, "converted from a "
             "checkpoint") == NULL, "kt-run --info: %s", text ? text : "(nothing)");
    free(text);
    KT_CHECK(kt_test_system("'%s' -m '%s' -p 'The river' -n 6 --temp 0 -t 2 > '%s' 2>&1", kt_test_tool("kt-run"), dir,
                            out) == 0,
             "kt-run -m DIR");
    text = kt_test_read_file(out, &n);
    KT_CHECK(text && strstr(text, "peak memory"), "kt-run -m DIR: %s", text ? text : "(nothing)");
    free(text);
    char plan[1100];
    snprintf(plan, sizeof plan, "%s", kt_test_path("hf-model-plan.yaml"));
    KT_CHECK(kt_test_system("'%s' -m '%s' -o '%s' > '%s' 2>&1", kt_test_tool("kt-place"), dir, plan, out) == 0,
             "kt-place -m DIR");
    /* the plan names the directory's model and dry-runs against it, the checkpoint's conversions counted */
    KT_CHECK(kt_test_system("'%s' --info --placement '%s' '%s' > '%s' 2>&1", kt_test_tool("kt-run"), plan, dir, out) ==
                 0,
             "kt-run --info --placement");
    text = kt_test_read_file(out, &n);
    KT_CHECK(text && strstr(text, "converted from a checkpoint") && strstr(text, "fits this machine: yes"),
             "dry run: %s", text ? text : "(nothing)");
    free(text);
    unlink(plan);
    unlink(out);
}

/* Everything on a CUDA device (tests/cuda_emulated.c's host emulation in
 * test_hf_model_cuda_emulated): a checkpoint's split attention, its Q4_0 or
 * FP8_B128 experts read through host buffers for their upload, within the
 * check's tolerances for a GPU. */
static void check_of_a_directory_on_a_gpu(void)
{
    kt_err why = {0};
    if (kt_cuda_device_count(&why) == 0) {
        printf("  skipped: no CUDA device (%s); test_hf_model_cuda_emulated runs this case\n", why.msg);
        return;
    }
    const int forms[] = {DIR_INT4, DIR_FP8};
    for (size_t f = 0; f < 2; f++) {
        struct kt_model *m = open_form(forms[f]);
        if (!m)
            continue;
        const size_t LE = (size_t)m->hp.n_layer * m->hp.n_expert;
        uint8_t *all = kt_test_xmalloc(LE);
        memset(all, 1, LE);
        const struct kt_backend_params gpu = {.kind = KT_BACKEND_CUDA, .name = "gpu"};
        const struct kt_engine_params p = {.n_ctx = 128, .n_threads = 2, .device = &gpu, .expert_on_device = all,
                                           .shared_on_device = true, .dense_on_device = true,
                                           .attention_on_device = true, .output_on_device = true};
        const struct kt_check_prompt prompts[1] = {{prompt, N_PROMPT}};
        struct kt_engine *e = NULL;
        kt_err err = {0};
        struct kt_check_report r = {0};
        kt_status st = kt_engine_create(m, &p, &e, &err);
        KT_CHECK(st == KT_OK, "%s on the GPU: %s", form_names[forms[f]], err.msg);
        if (st == KT_OK)
            st = kt_check_run(m, e, prompts, 1, &(struct kt_check_params){.max_tokens = 6, .n_threads = 2}, &r, &err);
        if (st == KT_OK && r.n_prompts == 1)
            printf("     %s on the GPU: median %.3g, 9 in 10 %.3g, worst %.3g (tolerances %g / %g)\n",
                   form_names[forms[f]], r.prompts[0].median, r.prompts[0].p90, r.prompts[0].worst, r.median_tol,
                   r.p90_tol);
        KT_CHECK(st == KT_OK && r.pass, "%s on the GPU: %s", form_names[forms[f]], st == KT_OK ? "FAIL" : err.msg);
        kt_check_report_free(&r);
        kt_engine_destroy(e);
        free(all);
        kt_model_close(m);
    }
}

int main(void)
{
#ifdef KT_TEST_CUDA_EMULATED /* only the GPU case, against tests/cuda_emulated.c */
    printf("kt_cuda.h emulated on the host: the engine's cuda path, not the GPU kernels\n");
    if (make_models())
        KT_RUN(check_of_a_directory_on_a_gpu);
    for (int f = 0; f < N_FORMS; f++)
        kt_test_system("rm -rf '%s'", paths[f]);
    return kt_test_finish();
#endif
    if (make_models()) {
        KT_RUN(each_stored_form_becomes_its_kt_type);
        KT_RUN(experts_and_converted_tensors_are_the_formats_definition);
        KT_RUN(logits_match_the_gguf_within_the_formats_rounding);
        KT_RUN(check_of_a_directory_passes_at_zero_divergence);
        KT_RUN(check_of_a_directory_on_a_gpu);
        KT_RUN(the_tools_take_a_directory);
        KT_RUN(an_int4_scale_fp16_cannot_hold_refuses_the_load);
    }
    for (int f = 0; f < N_FORMS; f++)
        kt_test_system("rm -rf '%s'", paths[f]);
    return kt_test_finish();
}
