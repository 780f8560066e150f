/*
 * test_synth.c - kt-synth writes deepseek2 files with a real family's layout,
 * reproducibly, with the weight statistics and router skew it promises; bad
 * options are refused saying the value meant or the range; and the progress
 * reporter it drives reports what it should.
 *
 * Files are read back with the GGUF reader and the model loader, never
 * through the generator's own tables: expected shapes, tensor order, key
 * values and stds are written out here from docs/deepseek2.md.  Router
 * selection is recomputed here from the file's router weights and bias with
 * the routing of docs/deepseek2.md, MoE routing.  Everything runs on the tiny presets (plus
 * plan-only checks of the real-dimension slices) so it takes seconds, also
 * under ASan.
 */
#include "gguf.h"
#include "model.h"
#include "progress.h"
#include "quant.h"
#include "synth.h"
#include "testlib.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- helpers ---------------------------------------------------------------------- */

static bool file_exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

/* Writes a preset through the library, with a few overrides (layers 0, experts
 * type -1: the preset's). */
static bool synth(const char *path, const char *preset, uint64_t seed, double skew, uint32_t threads, uint32_t layers,
                  int experts_type)
{
    kt_err err = {0};
    struct kt_synth_config cfg;
    struct kt_synth_plan *plan = NULL;
    bool ok = kt_synth_preset(preset, &cfg, &err) == KT_OK;
    if (ok) {
        cfg.seed = seed;
        cfg.skew = skew;
        cfg.n_threads = threads;
        cfg.n_layer = layers ? layers : cfg.n_layer;
        cfg.types[KT_SYNTH_ROLE_EXPERTS] = experts_type >= 0 ? experts_type : cfg.types[KT_SYNTH_ROLE_EXPERTS];
        ok = kt_synth_plan_create(&cfg, &plan, &err) == KT_OK && kt_synth_write(plan, path, NULL, &err) == KT_OK;
    }
    if (!ok)
        fprintf(stderr, "synth %s: %s\n", preset, err.msg);
    kt_synth_plan_destroy(plan);
    return ok;
}

static struct kt_gguf *open_gguf(const char *path)
{
    kt_err err = {0};
    struct kt_gguf *g = NULL;
    if (kt_gguf_open(path, &g, &err) != KT_OK)
        fprintf(stderr, "open %s: %s\n", path, err.msg);
    return g;
}

static int64_t get_int(const struct kt_gguf *g, const char *key)
{
    int64_t v = -1;
    if (kt_gguf_get_int(g, key, &v, NULL) != KT_OK)
        return -12345;
    return v;
}

static double get_float(const struct kt_gguf *g, const char *key)
{
    double v = NAN;
    kt_gguf_get_float(g, key, &v, NULL);
    return v;
}

static bool str_is(const struct kt_gguf *g, const char *key, const char *want)
{
    struct kt_gguf_str s;
    return kt_gguf_get_str(g, key, &s, NULL) == KT_OK && s.len == strlen(want) && memcmp(s.ptr, want, s.len) == 0;
}

static bool key_type_is(const struct kt_gguf *g, const char *key, enum kt_gguf_type t)
{
    const struct kt_gguf_kv *kv = kt_gguf_find_kv(g, key);
    return kv && kv->value.type == t;
}

static bool shape_is(const struct kt_gguf_tensor *t, uint32_t n_dims, int64_t a, int64_t b, int64_t c)
{
    return t && t->n_dims == n_dims && t->ne[0] == a && (n_dims < 2 || t->ne[1] == b) && (n_dims < 3 || t->ne[2] == c);
}

/* Dequantized values of a whole tensor (malloc'd). */
static float *tensor_floats(const struct kt_gguf_tensor *t, int64_t *n_out)
{
    const struct kt_type_traits *tr = kt_type_traits(t->type);
    int64_t n = t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3];
    float *x = malloc((size_t)n * sizeof *x);
    if (!x || !tr || !tr->to_float) {
        free(x);
        return NULL;
    }
    tr->to_float(t->data, x, n);
    *n_out = n;
    return x;
}

struct stats {
    double mean, sd;
    bool finite;
};

static struct stats tensor_stats(const struct kt_gguf_tensor *t)
{
    struct stats s = {NAN, NAN, false};
    int64_t n = 0;
    float *x = t ? tensor_floats(t, &n) : NULL;
    if (!x)
        return s;
    double sum = 0, sum2 = 0;
    s.finite = true;
    for (int64_t i = 0; i < n; i++) {
        s.finite = s.finite && isfinite(x[i]);
        sum += x[i];
        sum2 += (double)x[i] * x[i];
    }
    s.mean = sum / (double)n;
    s.sd = sqrt(sum2 / (double)n - s.mean * s.mean);
    free(x);
    return s;
}

/* The tensor names of a deepseek2 file in llama.cpp's converter's order. */
static int expected_names(char names[][KT_GGUF_MAX_NAME], int n_layer, int n_dense)
{
    static const char *const attn[] = {"attn_norm", "attn_q_a", "attn_q_a_norm", "attn_q_b", "attn_kv_a_mqa",
                                       "attn_kv_a_norm", "attn_k_b", "attn_v_b", "attn_output", "ffn_norm"};
    static const char *const dense[] = {"ffn_gate", "ffn_up", "ffn_down"};
    static const char *const moe[] = {"ffn_gate_inp", "exp_probs_b", "ffn_gate_exps", "ffn_up_exps",
                                      "ffn_down_exps", "ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp"};
    int n = 0;
    snprintf(names[n++], KT_GGUF_MAX_NAME, "token_embd.weight");
    snprintf(names[n++], KT_GGUF_MAX_NAME, "output_norm.weight");
    snprintf(names[n++], KT_GGUF_MAX_NAME, "output.weight");
    for (int l = 0; l < n_layer; l++) {
        for (size_t i = 0; i < sizeof attn / sizeof *attn; i++)
            snprintf(names[n++], KT_GGUF_MAX_NAME, "blk.%d.%s.weight", l, attn[i]);
        bool is_dense = l < n_dense;
        size_t k = is_dense ? 3 : 8;
        for (size_t i = 0; i < k; i++)
            snprintf(names[n++], KT_GGUF_MAX_NAME, "blk.%d.%s.%s", l, is_dense ? dense[i] : moe[i],
                     !is_dense && i == 1 ? "bias" : "weight");
    }
    return n;
}

/* ---- layout and metadata ------------------------------------------------------------ */

/* Shapes of the tiny presets: E 512, H 8, qr 192, kvr 128, dn 32, dr 16, dv 32,
 * F 1024, f 128, 32 experts, 4 layers of which the first is dense. */
static void check_tiny_tensors(const struct kt_gguf *g, int attn_type, int expert_type)
{
    char names[128][KT_GGUF_MAX_NAME];
    int n = expected_names(names, 4, 1);
    KT_CHECK(g->n_tensors == (uint64_t)n, "%llu tensors, expected %d", (unsigned long long)g->n_tensors, n);
    for (int i = 0; i < n && (uint64_t)i < g->n_tensors; i++)
        KT_CHECK(strcmp(g->tensors[i].name, names[i]) == 0, "tensor %d is %s, expected %s", i, g->tensors[i].name,
                 names[i]);

    const struct kt_gguf_tensor *t;
    int64_t V = get_int(g, "deepseek2.vocab_size");
    t = kt_gguf_find_tensor(g, "token_embd.weight");
    KT_CHECK(shape_is(t, 2, 512, V, 1), "token_embd shape");
    t = kt_gguf_find_tensor(g, "output.weight");
    KT_CHECK(shape_is(t, 2, 512, V, 1), "output shape");
    KT_CHECK(shape_is(kt_gguf_find_tensor(g, "blk.0.ffn_gate.weight"), 2, 512, 1024, 1), "dense ffn_gate");
    KT_CHECK(shape_is(kt_gguf_find_tensor(g, "blk.0.ffn_down.weight"), 2, 1024, 512, 1), "dense ffn_down");
    KT_CHECK(shape_is(kt_gguf_find_tensor(g, "blk.2.attn_q_a.weight"), 2, 512, 192, 1), "attn_q_a");
    KT_CHECK(shape_is(kt_gguf_find_tensor(g, "blk.2.attn_q_b.weight"), 2, 192, 8 * 48, 1), "attn_q_b");
    KT_CHECK(shape_is(kt_gguf_find_tensor(g, "blk.2.attn_kv_a_mqa.weight"), 2, 512, 144, 1), "attn_kv_a_mqa");
    KT_CHECK(shape_is(kt_gguf_find_tensor(g, "blk.2.attn_kv_a_norm.weight"), 1, 128, 1, 1), "attn_kv_a_norm");
    KT_CHECK(shape_is(kt_gguf_find_tensor(g, "blk.2.attn_k_b.weight"), 3, 32, 128, 8), "attn_k_b {dn, kvr, H}");
    KT_CHECK(shape_is(kt_gguf_find_tensor(g, "blk.2.attn_v_b.weight"), 3, 128, 32, 8), "attn_v_b {kvr, dv, H}");
    KT_CHECK(shape_is(kt_gguf_find_tensor(g, "blk.2.attn_output.weight"), 2, 256, 512, 1), "attn_output");
    KT_CHECK(shape_is(kt_gguf_find_tensor(g, "blk.2.ffn_gate_inp.weight"), 2, 512, 32, 1), "router");
    KT_CHECK(shape_is(kt_gguf_find_tensor(g, "blk.2.exp_probs_b.bias"), 1, 32, 1, 1), "exp_probs_b");
    KT_CHECK(shape_is(kt_gguf_find_tensor(g, "blk.2.ffn_gate_exps.weight"), 3, 512, 128, 32), "gate_exps");
    KT_CHECK(shape_is(kt_gguf_find_tensor(g, "blk.2.ffn_up_exps.weight"), 3, 512, 128, 32), "up_exps");
    KT_CHECK(shape_is(kt_gguf_find_tensor(g, "blk.2.ffn_down_exps.weight"), 3, 128, 512, 32), "down_exps");
    KT_CHECK(shape_is(kt_gguf_find_tensor(g, "blk.2.ffn_gate_shexp.weight"), 2, 512, 128, 1), "gate_shexp");
    KT_CHECK(shape_is(kt_gguf_find_tensor(g, "blk.2.ffn_down_shexp.weight"), 2, 128, 512, 1), "down_shexp");

    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const struct kt_gguf_tensor *x = &g->tensors[i];
        bool f32_only = x->n_dims == 1 || strstr(x->name, "ffn_gate_inp");
        if (f32_only)
            KT_CHECK(x->type == KT_TYPE_F32, "%s is %s, expected f32", x->name, kt_type_name(x->type));
        if (strstr(x->name, "attn_q_a.") || strstr(x->name, "attn_kv_a_mqa."))
            KT_CHECK(x->type == attn_type, "%s is %s", x->name, kt_type_name(x->type));
        if (strstr(x->name, "_exps.") && x->ne[0] % 256 == 0)
            KT_CHECK(x->type == expert_type, "%s is %s", x->name, kt_type_name(x->type));
    }
}

static void tiny_has_kimi_k2_metadata_and_layout(void)
{
    const char *path = kt_test_path("tiny.gguf");
    int rc = kt_test_system("%s --preset tiny -q -o %s > /dev/null", kt_test_tool("kt-synth"), path);
    KT_CHECK(rc == 0, "kt-synth --preset tiny exited %d", rc);
    struct kt_gguf *g = open_gguf(path);
    KT_CHECK(g != NULL, "tiny file opens");
    if (!g)
        return;
    KT_CHECK(str_is(g, "general.architecture", "deepseek2"), "architecture");
    KT_CHECK(key_type_is(g, "general.name", KT_GGUF_STRING), "general.name");
    KT_CHECK(key_type_is(g, "general.alignment", KT_GGUF_UINT32) && get_int(g, "general.alignment") == 32, "alignment");
    KT_CHECK(get_int(g, "general.file_type") == 0, "all-f32 file_type %lld", (long long)get_int(g, "general.file_type"));
    KT_CHECK(!kt_gguf_find_kv(g, "general.quantization_version"), "no quantization_version in an f32 file");
    struct { const char *key; int64_t want; } ints[] = {
        {"block_count", 4}, {"context_length", 131072}, {"embedding_length", 512}, {"feed_forward_length", 1024},
        {"attention.head_count", 8}, {"attention.head_count_kv", 1}, {"attention.key_length", 144},
        {"attention.value_length", 128}, {"attention.key_length_mla", 48}, {"attention.value_length_mla", 32},
        {"attention.q_lora_rank", 192}, {"attention.kv_lora_rank", 128}, {"rope.dimension_count", 16},
        {"leading_dense_block_count", 1}, {"expert_count", 32}, {"expert_used_count", 8},
        {"expert_feed_forward_length", 128}, {"expert_shared_count", 1}, {"expert_group_count", 1},
        {"expert_group_used_count", 1}, {"expert_gating_func", 2}, {"rope.scaling.original_context_length", 4096},
    };
    for (size_t i = 0; i < sizeof ints / sizeof *ints; i++) {
        char key[128];
        snprintf(key, sizeof key, "deepseek2.%s", ints[i].key);
        KT_CHECK(key_type_is(g, key, KT_GGUF_UINT32), "%s is u32", key);
        KT_CHECK(get_int(g, key) == ints[i].want, "%s = %lld, expected %lld", key, (long long)get_int(g, key),
                 (long long)ints[i].want);
    }
    struct { const char *key; double want; } floats[] = {
        {"rope.freq_base", 50000}, {"attention.layer_norm_rms_epsilon", 1e-6}, {"expert_weights_scale", 2.827},
        {"rope.scaling.factor", 32}, {"rope.scaling.yarn_log_multiplier", 0.1},
        {"rope.scaling.yarn_beta_fast", 1}, {"rope.scaling.yarn_beta_slow", 1},
    };
    for (size_t i = 0; i < sizeof floats / sizeof *floats; i++) {
        char key[128];
        snprintf(key, sizeof key, "deepseek2.%s", floats[i].key);
        KT_CHECK(key_type_is(g, key, KT_GGUF_FLOAT32), "%s is f32", key);
        KT_CHECK(fabs(get_float(g, key) - floats[i].want) <= 1e-6 * fabs(floats[i].want), "%s = %g, expected %g", key,
                 get_float(g, key), floats[i].want);
    }
    bool norm = false;
    KT_CHECK(kt_gguf_get_bool(g, "deepseek2.expert_weights_norm", &norm, NULL) == KT_OK && norm, "weights_norm");
    KT_CHECK(str_is(g, "deepseek2.rope.scaling.type", "yarn"), "yarn");
    KT_CHECK(str_is(g, "tokenizer.ggml.model", "gpt2"), "tokenizer model");
    KT_CHECK(str_is(g, "tokenizer.ggml.pre", "kimi-k2"), "tokenizer pre");
    const struct kt_gguf_array *tokens = NULL;
    KT_CHECK(kt_gguf_get_array(g, "tokenizer.ggml.tokens", &tokens, NULL) == KT_OK, "tokens");
    int64_t V = get_int(g, "deepseek2.vocab_size");
    KT_CHECK(tokens && (int64_t)tokens->count == V, "vocab_size %lld matches the token list", (long long)V);
    KT_CHECK(V >= 512 && V <= 4096, "a ~1k vocabulary, got %lld", (long long)V);
    check_tiny_tensors(g, KT_TYPE_F32, KT_TYPE_F32);
    kt_gguf_close(g);

    kt_err err = {0};
    struct kt_model *m = NULL;
    KT_CHECK(kt_model_open(path, &m, &err) == KT_OK, "kt_model_open: %s", err.msg);
    if (m) {
        KT_CHECK(m->hp.mla_split && m->hp.n_expert == 32 && m->hp.n_dense_lead == 1 && m->hp.gating == KT_GATING_SIGMOID,
                 "model hparams");
        KT_CHECK(m->hp.qk_nope_dim == 32 && m->hp.qk_rope_dim == 16 && m->hp.v_head_dim == 32, "head dims");
        KT_CHECK(m->layers[3].is_moe && !m->layers[0].is_moe && m->layers[3].exp_probs_b, "layer kinds");
        kt_model_close(m);
    }
    unlink(path);
}

static void tiny_v3_has_deepseek_v3_routing_and_rope(void)
{
    const char *path = kt_test_path("tiny-v3.gguf");
    KT_CHECK(synth(path, "tiny-v3", 1, 1.0, 2, 0, -1), "tiny-v3 written");
    struct kt_gguf *g = open_gguf(path);
    if (!g)
        return;
    KT_CHECK(get_int(g, "deepseek2.expert_group_count") == 4, "groups");
    KT_CHECK(get_int(g, "deepseek2.expert_group_used_count") == 2, "groups used");
    KT_CHECK(get_int(g, "deepseek2.context_length") == 163840, "context");
    KT_CHECK(fabs(get_float(g, "deepseek2.expert_weights_scale") - 2.5) < 1e-6, "scale");
    KT_CHECK(get_float(g, "deepseek2.rope.freq_base") == 10000, "freq_base");
    KT_CHECK(get_float(g, "deepseek2.rope.scaling.factor") == 40, "yarn factor");
    KT_CHECK(get_float(g, "deepseek2.rope.scaling.yarn_beta_fast") == 32, "beta fast");
    KT_CHECK(get_float(g, "deepseek2.rope.scaling.yarn_beta_slow") == 1, "beta slow");
    KT_CHECK(get_int(g, "deepseek2.expert_gating_func") == 2, "sigmoid");
    KT_CHECK(str_is(g, "tokenizer.ggml.pre", "deepseek-v3"), "deepseek tokenizer");
    check_tiny_tensors(g, KT_TYPE_F32, KT_TYPE_F32);
    kt_gguf_close(g);
    kt_err err = {0};
    struct kt_model *m = NULL;
    KT_CHECK(kt_model_open(path, &m, &err) == KT_OK, "kt_model_open: %s", err.msg);
    if (m) {
        KT_CHECK(m->hp.n_expert_groups == 4 && m->hp.n_group_used == 2, "model groups");
        kt_model_close(m);
    }
    unlink(path);
}

/* ---- reproducibility ---------------------------------------------------------------- */

static void same_seed_gives_same_bytes_on_any_thread_count(void)
{
    const char *a = kt_test_path("seed7-t1.gguf"), *b = kt_test_path("seed7-t2.gguf");
    const char *c = kt_test_path("seed8-t2.gguf");
    KT_CHECK(synth(a, "tiny", 7, 1.0, 1, 2, KT_TYPE_Q4_K), "write a");
    KT_CHECK(synth(b, "tiny", 7, 1.0, 3, 2, KT_TYPE_Q4_K), "write b");
    KT_CHECK(synth(c, "tiny", 8, 1.0, 2, 2, KT_TYPE_Q4_K), "write c");
    KT_CHECK(kt_test_files_equal(a, b), "seed 7 on 1 and 3 threads differs");
    KT_CHECK(!kt_test_files_equal(a, c), "seeds 7 and 8 give the same file");
    /* Different seeds differ in the weights themselves, not just somewhere. */
    struct kt_gguf *ga = open_gguf(a), *gc = open_gguf(c);
    if (ga && gc) {
        const struct kt_gguf_tensor *ta = kt_gguf_find_tensor(ga, "blk.1.ffn_down_exps.weight");
        const struct kt_gguf_tensor *tc = kt_gguf_find_tensor(gc, "blk.1.ffn_down_exps.weight");
        KT_CHECK(ta && tc && ta->nbytes == tc->nbytes && memcmp(ta->data, tc->data, ta->nbytes) != 0,
                 "expert weights do not depend on the seed");
        KT_CHECK(ga->data_offset == gc->data_offset, "same layout for both seeds");
    }
    kt_gguf_close(ga);
    kt_gguf_close(gc);
    unlink(a);
    unlink(b);
    unlink(c);
}

/* ---- types ------------------------------------------------------------------------- */

static void type_options_are_honoured_with_block_fallbacks(void)
{
    const char *path = kt_test_path("tiny-q.gguf"), *log = kt_test_path("tiny-q.log");
    int rc = kt_test_system("%s --preset tiny -q -o %s --experts-type q4_k --dense-type q8_0 --attn-type q4_k "
                            "--output-type q6_k --ffn-type q5_1 > /dev/null 2> %s",
                            kt_test_tool("kt-synth"), path, log);
    KT_CHECK(rc == 0, "kt-synth with type options exited %d", rc);
    struct kt_gguf *g = open_gguf(path);
    if (!g)
        return;
    struct { const char *name; int type; } want[] = {
        {"token_embd.weight", KT_TYPE_Q8_0},          /* --dense-type */
        {"output.weight", KT_TYPE_Q6_K},              /* --output-type overrides --dense-type */
        {"output_norm.weight", KT_TYPE_F32},
        {"blk.0.ffn_gate.weight", KT_TYPE_Q5_1},      /* --ffn-type */
        {"blk.0.ffn_down.weight", KT_TYPE_Q5_1},
        {"blk.1.attn_q_a.weight", KT_TYPE_Q4_K},      /* ne0 512 */
        {"blk.1.attn_q_b.weight", KT_TYPE_Q5_0},      /* ne0 192: q4_K falls back */
        {"blk.1.attn_kv_a_mqa.weight", KT_TYPE_Q4_K},
        {"blk.1.attn_k_b.weight", KT_TYPE_Q5_0},      /* ne0 = dn = 32 */
        {"blk.1.attn_v_b.weight", KT_TYPE_Q5_0},      /* ne0 = kvr = 128 */
        {"blk.1.attn_output.weight", KT_TYPE_Q4_K},   /* ne0 256 */
        {"blk.1.ffn_gate_inp.weight", KT_TYPE_F32},
        {"blk.1.exp_probs_b.bias", KT_TYPE_F32},
        {"blk.1.ffn_gate_exps.weight", KT_TYPE_Q4_K},
        {"blk.1.ffn_up_exps.weight", KT_TYPE_Q4_K},
        {"blk.1.ffn_down_exps.weight", KT_TYPE_Q5_0}, /* ne0 = f = 128 */
        {"blk.1.ffn_gate_shexp.weight", KT_TYPE_Q8_0},
        {"blk.1.ffn_down_shexp.weight", KT_TYPE_Q8_0},
    };
    for (size_t i = 0; i < sizeof want / sizeof *want; i++) {
        const struct kt_gguf_tensor *t = kt_gguf_find_tensor(g, want[i].name);
        KT_CHECK(t && t->type == want[i].type, "%s is %s, expected %s", want[i].name, t ? kt_type_name(t->type) : "-",
                 kt_type_name(want[i].type));
    }
    KT_CHECK(get_int(g, "general.file_type") == 15, "q4_K experts make a Q4_K_M file_type, got %lld",
             (long long)get_int(g, "general.file_type"));
    KT_CHECK(get_int(g, "general.quantization_version") == 2, "quantization_version 2");
    check_tiny_tensors(g, KT_TYPE_Q4_K, KT_TYPE_Q4_K);

    /* Quantized weights stay finite with the intended std (RTN noise is < 1%). */
    struct { const char *name; double sd; } sds[] = {
        {"token_embd.weight", 1.0},
        {"blk.1.attn_q_a.weight", 1 / sqrt(512.0)},
        {"blk.1.attn_k_b.weight", 1 / sqrt(128.0)},
        {"blk.1.attn_output.weight", 1 / sqrt(256.0) / sqrt(8.0)},
        {"blk.1.ffn_gate_exps.weight", 1 / sqrt(512.0)},
        {"blk.1.ffn_down_exps.weight", 1 / sqrt(128.0) / sqrt(8.0)},
        {"output.weight", 1 / sqrt(512.0)},
    };
    for (size_t i = 0; i < sizeof sds / sizeof *sds; i++) {
        struct stats s = tensor_stats(kt_gguf_find_tensor(g, sds[i].name));
        KT_CHECK(s.finite && fabs(s.sd / sds[i].sd - 1) < 0.05 && fabs(s.mean) < 0.05 * sds[i].sd,
                 "%s: sd %g (want %g), mean %g", sds[i].name, s.sd, sds[i].sd, s.mean);
    }
    kt_gguf_close(g);

    size_t n = 0;
    char *text = kt_test_read_file(log, &n);
    KT_CHECK(text && strstr(text, "q4_K written as q5_0"), "the fallback is reported: %s", text ? text : "(no log)");
    int lines = 0;
    for (char *p = text; p && *p; p++)
        lines += *p == '\n';
    KT_CHECK(lines == 1, "one line per fallback kind, got %d:\n%s", lines, text ? text : "");
    free(text);

    kt_err err = {0};
    struct kt_model *m = NULL;
    KT_CHECK(kt_model_open(path, &m, &err) == KT_OK, "kt_model_open of the quantized file: %s", err.msg);
    kt_model_close(m);
    unlink(path);
    unlink(log);
}

static void f32_weights_have_intended_statistics(void)
{
    const char *path = kt_test_path("tiny-stats.gguf");
    KT_CHECK(synth(path, "tiny", 3, 1.0, 2, 0, -1), "write");
    struct kt_gguf *g = open_gguf(path);
    if (!g)
        return;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const struct kt_gguf_tensor *t = &g->tensors[i];
        struct stats s = tensor_stats(t);
        KT_CHECK(s.finite, "%s has non-finite values", t->name);
        if (strstr(t->name, "_norm.")) /* 1 + uniform noise of std 0.02 */
            KT_CHECK(fabs(s.mean - 1) < 0.01 && s.sd > 0.005 && s.sd < 0.04, "%s: mean %g sd %g", t->name, s.mean, s.sd);
        if (strstr(t->name, "exp_probs_b")) /* small: |b| of a selection bias, not a logit */
            KT_CHECK(fabs(s.mean) < 0.01 && s.sd > 0.05 && s.sd < 0.5, "%s: mean %g sd %g", t->name, s.mean, s.sd);
    }
    struct { const char *name; double sd; } sds[] = {
        {"token_embd.weight", 1.0},
        {"output.weight", 1 / sqrt(512.0)},
        {"blk.0.ffn_gate.weight", 1 / sqrt(512.0)},
        {"blk.0.ffn_down.weight", 1 / sqrt(1024.0) / sqrt(8.0)},
        {"blk.2.attn_q_b.weight", 1 / sqrt(192.0)},
        {"blk.2.attn_v_b.weight", 1 / sqrt(128.0)},
        {"blk.2.ffn_gate_inp.weight", 1 / sqrt(512.0)},
        {"blk.2.ffn_up_exps.weight", 1 / sqrt(512.0)},
        {"blk.2.ffn_down_shexp.weight", 1 / sqrt(128.0) / sqrt(8.0)},
    };
    for (size_t i = 0; i < sizeof sds / sizeof *sds; i++) {
        struct stats s = tensor_stats(kt_gguf_find_tensor(g, sds[i].name));
        KT_CHECK(fabs(s.sd / sds[i].sd - 1) < 0.03 && fabs(s.mean) < 0.05 * sds[i].sd, "%s: sd %g (want %g), mean %g",
                 sds[i].name, s.sd, sds[i].sd, s.mean);
    }
    kt_gguf_close(g);
    unlink(path);
}

static void slice_plans_use_real_dimensions(void)
{
    kt_err err = {0};
    struct kt_synth_config cfg;
    struct kt_synth_plan *p = NULL;
    KT_CHECK(kt_synth_preset("kimi-k2-slice", &cfg, &err) == KT_OK, "preset");
    cfg.vocab_merges = 16; /* plans only: a small vocabulary builds fast */
    cfg.n_layer = 1;
    cfg.n_expert = 8;
    cfg.types[KT_SYNTH_ROLE_ATTN] = KT_TYPE_Q4_K;
    KT_CHECK(kt_synth_plan_create(&cfg, &p, &err) == KT_OK, "plan: %s", err.msg);
    if (p) {
        KT_CHECK(p->n_dense_lead == 0, "a one-layer slice is MoE");
        const struct kt_synth_tensor *kb = NULL, *qb = NULL, *ge = NULL, *emb = NULL;
        for (uint32_t i = 0; i < p->n_tensors; i++) {
            const struct kt_synth_tensor *t = &p->tensors[i];
            kb = strcmp(t->name, "blk.0.attn_k_b.weight") == 0 ? t : kb;
            qb = strcmp(t->name, "blk.0.attn_q_b.weight") == 0 ? t : qb;
            ge = strcmp(t->name, "blk.0.ffn_gate_exps.weight") == 0 ? t : ge;
            emb = strcmp(t->name, "token_embd.weight") == 0 ? t : emb;
        }
        KT_CHECK(kb && kb->ne[0] == 128 && kb->ne[1] == 512 && kb->ne[2] == 64 && kb->type == KT_TYPE_Q5_0 &&
                     kb->requested_type == KT_TYPE_Q4_K,
                 "Kimi attn_k_b {128, 512, 64} as q5_0");
        KT_CHECK(qb && qb->ne[0] == 1536 && qb->ne[1] == 64 * 192 && qb->type == KT_TYPE_Q4_K, "attn_q_b {1536, 12288}");
        KT_CHECK(ge && ge->ne[0] == 7168 && ge->ne[1] == 2048 && ge->ne[2] == 8 && ge->type == KT_TYPE_Q4_K, "gate_exps");
        KT_CHECK(emb && emb->type == KT_TYPE_Q8_0, "q8_0 outside the experts by default");
        KT_CHECK(p->n_fallbacks == 1 && p->fallbacks[0].requested == KT_TYPE_Q4_K &&
                     p->fallbacks[0].used == KT_TYPE_Q5_0 && strcmp(p->fallbacks[0].first_tensor, "blk.0.attn_k_b.weight") == 0,
                 "one fallback kind, first at attn_k_b");
        KT_CHECK(p->file_type == 15, "Q4_K_M file type");
    }
    kt_synth_plan_destroy(p);
    p = NULL;

    uint32_t layers[] = {1, 2, 4, 6}, dense[] = {0, 1, 3, 3};
    for (int i = 0; i < 4; i++) {
        KT_CHECK(kt_synth_preset("deepseek-v3-slice", &cfg, &err) == KT_OK, "preset");
        cfg.vocab_merges = 16;
        cfg.n_layer = layers[i];
        KT_CHECK(kt_synth_plan_create(&cfg, &p, &err) == KT_OK, "plan: %s", err.msg);
        KT_CHECK(p && p->n_dense_lead == dense[i], "V3 slice of %u layers has %u dense", layers[i], dense[i]);
        if (p && i == 3) {
            const struct kt_synth_tensor *t = &p->tensors[p->n_tensors - 1];
            KT_CHECK(strcmp(t->name, "blk.5.ffn_down_shexp.weight") == 0 && t->ne[0] == 2048 && t->ne[1] == 7168,
                     "last tensor %s", t->name);
            for (uint32_t j = 0; j < p->n_tensors; j++)
                if (strcmp(p->tensors[j].name, "blk.3.attn_v_b.weight") == 0)
                    KT_CHECK(p->tensors[j].ne[0] == 512 && p->tensors[j].ne[1] == 128 && p->tensors[j].ne[2] == 128,
                             "V3 attn_v_b {512, 128, 128}");
        }
        kt_synth_plan_destroy(p);
        p = NULL;
    }

    /* A legacy 32-block on rows that are not a multiple of 32 becomes f16. */
    KT_CHECK(kt_synth_preset("tiny", &cfg, &err) == KT_OK, "preset");
    cfg.vocab_merges = 16;
    cfg.qk_nope_dim = 16;
    cfg.types[KT_SYNTH_ROLE_ATTN] = KT_TYPE_Q8_0;
    KT_CHECK(kt_synth_plan_create(&cfg, &p, &err) == KT_OK, "plan: %s", err.msg);
    if (p) {
        for (uint32_t j = 0; j < p->n_tensors; j++)
            if (strstr(p->tensors[j].name, "attn_k_b"))
                KT_CHECK(p->tensors[j].type == KT_TYPE_F16, "%s is %s", p->tensors[j].name,
                         kt_type_name(p->tensors[j].type));
    }
    kt_synth_plan_destroy(p);
}

/* ---- router skew ---------------------------------------------------------------------- */

/* Selection counts of one MoE layer for n_tokens random RMS-normalised hidden
 * states (times ffn_norm), routed as docs/deepseek2.md, MoE routing says: sigmoid scores, bias for
 * selection, group-limited top-k (group score = sum of its 2 best). */
static bool route_counts(const struct kt_gguf *g, int layer, int n_tokens, uint64_t *counts)
{
    char name[64];
    snprintf(name, sizeof name, "blk.%d.ffn_gate_inp.weight", layer);
    const struct kt_gguf_tensor *wr = kt_gguf_find_tensor(g, name);
    snprintf(name, sizeof name, "blk.%d.exp_probs_b.bias", layer);
    const struct kt_gguf_tensor *wb = kt_gguf_find_tensor(g, name);
    snprintf(name, sizeof name, "blk.%d.ffn_norm.weight", layer);
    const struct kt_gguf_tensor *wn = kt_gguf_find_tensor(g, name);
    int64_t E = get_int(g, "deepseek2.embedding_length"), Ne = get_int(g, "deepseek2.expert_count");
    int64_t k = get_int(g, "deepseek2.expert_used_count"), G = get_int(g, "deepseek2.expert_group_count");
    int64_t Gu = get_int(g, "deepseek2.expert_group_used_count");
    if (!wr || !wb || !wn || wr->type != KT_TYPE_F32 || Ne > 64 || E > 1024 || G < 1 || Ne % G)
        return false;
    const float *W = wr->data, *b = wb->data, *nw = wn->data;
    float h[1024], sel[64];
    unsigned long long rng = 12345;
    memset(counts, 0, (size_t)Ne * sizeof *counts);
    for (int tok = 0; tok < n_tokens; tok++) {
        double ss = 0;
        for (int64_t i = 0; i < E; i++) {
            h[i] = kt_test_rand_normal(&rng);
            ss += (double)h[i] * h[i];
        }
        float inv = (float)(1 / sqrt(ss / (double)E + 1e-6));
        for (int64_t i = 0; i < E; i++)
            h[i] *= inv * nw[i];
        for (int64_t e = 0; e < Ne; e++) {
            double z = 0;
            for (int64_t i = 0; i < E; i++)
                z += (double)W[e * E + i] * h[i];
            sel[e] = (float)(1 / (1 + exp(-z))) + b[e];
        }
        if (G > 1) {
            int64_t per = Ne / G;
            float gscore[64];
            for (int64_t gi = 0; gi < G; gi++) {
                float best = -INFINITY, second = -INFINITY;
                for (int64_t j = 0; j < per; j++) {
                    float v = sel[gi * per + j];
                    if (v > best) {
                        second = best;
                        best = v;
                    } else if (v > second) {
                        second = v;
                    }
                }
                gscore[gi] = best + second;
            }
            bool keep[64] = {false};
            for (int64_t r = 0; r < Gu; r++) {
                int64_t arg = -1;
                for (int64_t gi = 0; gi < G; gi++)
                    if (!keep[gi] && (arg < 0 || gscore[gi] > gscore[arg]))
                        arg = gi;
                keep[arg] = true;
            }
            for (int64_t e = 0; e < Ne; e++)
                if (!keep[e / per])
                    sel[e] = -INFINITY;
        }
        for (int64_t r = 0; r < k; r++) {
            int64_t arg = -1;
            for (int64_t e = 0; e < Ne; e++)
                if (sel[e] != -INFINITY && (arg < 0 || sel[e] > sel[arg]))
                    arg = e;
            if (arg < 0)
                return false;
            counts[arg]++;
            sel[arg] = -INFINITY;
        }
    }
    return true;
}

static int cmp_desc(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

/* Share of all selections taken by the top quarter of experts. */
static double top_quarter_share(const uint64_t *counts, int n)
{
    uint64_t sorted[64], total = 0, top = 0;
    memcpy(sorted, counts, (size_t)n * sizeof *counts);
    qsort(sorted, (size_t)n, sizeof *sorted, cmp_desc);
    for (int i = 0; i < n; i++) {
        total += sorted[i];
        top += i < n / 4 ? sorted[i] : 0;
    }
    return total ? (double)top / (double)total : 0;
}

static void skew_concentrates_router_selection(void)
{
    const char *presets[] = {"tiny", "tiny-v3"};
    for (int pi = 0; pi < 2; pi++) {
        const char *skewed = kt_test_path("skewed.gguf"), *flat = kt_test_path("flat.gguf");
        KT_CHECK(synth(skewed, presets[pi], 5, 1.0, 2, 2, -1), "write skewed");
        KT_CHECK(synth(flat, presets[pi], 5, 0.0, 2, 2, -1), "write flat");
        struct kt_gguf *gs = open_gguf(skewed), *gf = open_gguf(flat);
        uint64_t cs[32], cf[32];
        bool ok = gs && gf && route_counts(gs, 1, 3000, cs) && route_counts(gf, 1, 3000, cf);
        KT_CHECK(ok, "%s: routing computed", presets[pi]);
        if (ok) {
            double s = top_quarter_share(cs, 32), f = top_quarter_share(cf, 32);
            printf("  %s: top 25%% of experts take %.1f%% of selections at skew 1, %.1f%% at skew 0\n", presets[pi],
                   100 * s, 100 * f);
            KT_CHECK(s > 0.5, "%s skew 1: top quarter takes %.3f", presets[pi], s);
            KT_CHECK(f < 0.33, "%s skew 0: top quarter takes %.3f", presets[pi], f);
            /* The hot experts are the ones the seeded ranking prefers. */
            kt_err err = {0};
            struct kt_synth_config cfg;
            struct kt_synth_plan *plan = NULL;
            uint32_t rank[32];
            kt_synth_preset(presets[pi], &cfg, &err);
            cfg.seed = 5;
            cfg.n_layer = 2;
            KT_CHECK(kt_synth_plan_create(&cfg, &plan, &err) == KT_OK &&
                         kt_synth_expert_ranks(plan, 1, rank, &err) == KT_OK,
                     "ranks: %s", err.msg);
            int hottest = 0;
            for (int e = 1; e < 32; e++)
                hottest = cs[e] > cs[hottest] ? e : hottest;
            uint64_t rank1 = 0, rank32 = 0;
            for (int e = 0; e < 32; e++) {
                rank1 = rank[e] == 1 ? cs[e] : rank1;
                rank32 = rank[e] == 32 ? cs[e] : rank32;
            }
            KT_CHECK(rank[hottest] <= 3, "%s: hottest expert %d has rank %u", presets[pi], hottest, rank[hottest]);
            uint64_t by_rank[33] = {0};
            for (int e = 0; e < 32; e++)
                by_rank[rank[e]] = cs[e];
            if (pi == 0) {
                /* Zipf 1 over 32 experts, top-8, one pick per token: f = 1, 1, .78, .59, .47, .39, .33, .29, ... */
                double r48 = (double)by_rank[4] / (double)(by_rank[8] + 1);
                KT_CHECK(by_rank[1] > 2700 && by_rank[2] > 2700, "ranks 1, 2 picked by nearly every token: %llu %llu",
                         (unsigned long long)by_rank[1], (unsigned long long)by_rank[2]);
                KT_CHECK(r48 > 1.5 && r48 < 2.7, "rank 4 / rank 8 frequency %.2f, Zipf 1 says 2", r48);
                printf("  tiny: picks per 3000 tokens by rank 1..8: %llu %llu %llu %llu %llu %llu %llu %llu, rank 32: %llu\n",
                       (unsigned long long)by_rank[1], (unsigned long long)by_rank[2], (unsigned long long)by_rank[3],
                       (unsigned long long)by_rank[4], (unsigned long long)by_rank[5], (unsigned long long)by_rank[6],
                       (unsigned long long)by_rank[7], (unsigned long long)by_rank[8], (unsigned long long)by_rank[32]);
            }
            /* Group-limited routing lets cold experts in a hot group in: a weaker ratio for tiny-v3. */
            KT_CHECK(rank1 > (pi == 0 ? 10 : 3) * (rank32 + 1), "%s: rank 1 chosen %llu times, rank 32 %llu", presets[pi],
                     (unsigned long long)rank1, (unsigned long long)rank32);
            kt_synth_plan_destroy(plan);
        }
        kt_gguf_close(gs);
        kt_gguf_close(gf);
        unlink(skewed);
        unlink(flat);
    }
}

/* ---- command line ---------------------------------------------------------------------- */

/* --header-only: the header a full write gives, the full size, the data a hole
 * that reads as zeros; a real-size Kimi-K2 opens as a model and takes ~no disk. */
static void header_only_writes_the_full_header_and_a_hole(void)
{
    const char *full = kt_test_path("ho-full.gguf"), *hole = kt_test_path("ho-hole.gguf");
    kt_err err = {0};
    struct kt_synth_config cfg;
    struct kt_synth_plan *plan = NULL;
    bool ok = kt_synth_preset("tiny", &cfg, &err) == KT_OK && kt_synth_plan_create(&cfg, &plan, &err) == KT_OK &&
              kt_synth_write(plan, full, NULL, &err) == KT_OK && kt_synth_write_header_only(plan, hole, &err) == KT_OK;
    KT_CHECK(ok, "tiny full and header-only: %s", err.msg);
    kt_synth_plan_destroy(plan);
    if (!ok)
        return;
    char tmp[1100];
    snprintf(tmp, sizeof tmp, "%s.tmp", hole);
    KT_CHECK(!file_exists(tmp), "%s left behind", tmp);
    size_t nf = 0, nh = 0;
    uint8_t *a = kt_test_read_file(full, &nf), *b = kt_test_read_file(hole, &nh);
    struct kt_gguf *g = open_gguf(hole);
    KT_CHECK(a && b && g, "read back");
    if (a && b && g) {
        KT_CHECK(nf == nh, "header-only tiny is %zu bytes, the full one %zu", nh, nf);
        KT_CHECK(g->data_offset < nh && memcmp(a, b, (size_t)g->data_offset) == 0, "headers differ");
        size_t nonzero = 0;
        for (size_t i = (size_t)g->data_offset; i < nh; i++)
            nonzero += b[i] != 0;
        KT_CHECK(nonzero == 0, "%zu data bytes are not zero", nonzero);
    }
    kt_gguf_close(g);
    free(a);
    free(b);
    unlink(full);
    unlink(hole);

    /* Kimi-K2's real dimensions through the tool */
    const char *k2 = kt_test_path("k2-header.gguf"), *log = kt_test_path("k2-header.log");
    int rc = kt_test_system("%s --preset kimi-k2-slice --layers 61 --experts 384 --header-only -o %s > %s",
                            kt_test_tool("kt-synth"), k2, log);
    KT_CHECK(rc == 0, "kt-synth --header-only exited %d", rc);
    size_t nlog = 0;
    char *out = kt_test_read_file(log, &nlog);
    KT_CHECK(out && strstr(out, "header only") && strstr(out, "on disk"), "output: %s", out ? out : "(none)");
    free(out);
    struct stat st;
    KT_CHECK(stat(k2, &st) == 0, "%s missing", k2);
    g = rc == 0 ? open_gguf(k2) : NULL;
    if (g) {
        /* the size the writer's packed layout gives: the data section ends at the
         * last tensor's aligned end */
        const struct kt_gguf_tensor *last = &g->tensors[g->n_tensors - 1];
        uint64_t want = g->data_offset + (last->offset + last->nbytes + g->alignment - 1) / g->alignment * g->alignment;
        KT_CHECK((uint64_t)st.st_size == want, "size %lld, expected %llu", (long long)st.st_size,
                 (unsigned long long)want);
        KT_CHECK(st.st_size > (off_t)500e9, "Kimi-K2 at Q4_K is over 500 GB, got %lld", (long long)st.st_size);
        KT_CHECK((uint64_t)st.st_blocks * 512 < (4u << 20), "%llu bytes on disk",
                 (unsigned long long)st.st_blocks * 512);
        kt_gguf_close(g);
    }
    struct kt_model *m = NULL;
    KT_CHECK(rc == 0 && kt_model_open(k2, &m, &err) == KT_OK, "kt_model_open: %s", err.msg);
    if (m)
        KT_CHECK(m->hp.n_layer == 61 && m->hp.n_expert == 384, "%u layers x %u experts", m->hp.n_layer,
                 m->hp.n_expert);
    kt_model_close(m);
    unlink(k2);
    unlink(log);
}

static void invalid_options_fail_cleanly(void)
{
    const char *tool = kt_test_tool("kt-synth");
    const char *path = kt_test_path("bad.gguf");
    struct { const char *args; int want; } cases[] = {
        {"--preset nosuch", 2},
        {"", 2},
        {"--preset tiny --experts-type q9_9", 2},
        {"--preset tiny --dense-type q8_k", 2},
        {"--preset deepseek-v3-slice --experts 60", 2},
        {"--preset deepseek-v3-slice --experts 8", 2},
        {"--preset tiny --experts 4", 2},
        {"--preset tiny --layers 0", 2},
        {"--preset tiny --threads 0", 2},
        {"--preset tiny --skew -1", 2},
        {"--preset tiny --route-skew 1", 2},
        {"--preset tiny --route-skew 2:1", 2},
        {"--preset tiny --route-skew a:b", 2},
        {"--preset tiny --route-skew 0:17", 2},
        {"--preset tiny --skew 1 --route-skew 0:1", 2},
        {"--preset tiny --route-input 1", 2},
        {"--preset tiny --route-input -0.1", 2},
        {"--preset tiny --route-input x", 2},
        {"--preset tiny --seed abc", 2},
        {"--preset tiny --bogus", 2},
        {"--preset tiny --layers", 2},
        {"--preset tiny extra", 2},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        int rc = kt_test_system("%s %s -q -o %s > /dev/null 2>&1", tool, cases[i].args, path);
        KT_CHECK(rc == cases[i].want, "'%s' exited %d, expected %d", cases[i].args, rc, cases[i].want);
        KT_CHECK(!file_exists(path), "'%s' left a file", cases[i].args);
    }
    /* what the refusals say: the value meant, the range */
    static const struct {
        const char *args, *want;
    } said[] = {
        {"--preset tny", "kt-synth: --preset 'tny' is not one of tiny, tiny-v3, tiny-thinking, tiny-r1, tiny-long, "
                         "kimi-k2-slice or deepseek-v3-slice: did you mean 'tiny'?\n"},
        {"--preset tiny --layres 3", "kt-synth: unknown option '--layres': did you mean '--layers'?\n"},
        {"--preset tiny --layers 0", "kt-synth: --layers '0' is out of range: give a whole number from 1 to 256"},
        {"--preset tiny --experts-type q4k", "kt-synth: --experts-type: unknown type 'q4k'"},
        {"--preset tiny --skew -1", "kt-synth: --skew '-1' is out of range: give a number in [0, 16] (0: uniform)"},
    };
    const char *said_log = kt_test_path("said.log");
    for (size_t i = 0; i < sizeof said / sizeof *said; i++) {
        int said_rc = kt_test_system("%s %s -q -o %s > /dev/null 2> %s", tool, said[i].args, path, said_log);
        size_t said_n = 0;
        char *said_text = kt_test_read_file(said_log, &said_n);
        KT_CHECK(said_rc == 2 && said_text && !strncmp(said_text, said[i].want, strlen(said[i].want)) &&
                     (i != 3 || strstr(said_text, "did you mean 'q4_k'?")),
                 "'%s': exit %d: %s", said[i].args, said_rc, said_text ? said_text : "");
        free(said_text);
    }
    unlink(said_log);
    int rc = kt_test_system("%s --preset tiny -q -o /nonexistent-dir/x.gguf > /dev/null 2>&1", tool);
    KT_CHECK(rc == 1, "unwritable path exited %d, expected 1", rc);
    rc = kt_test_system("%s --preset tiny --layers 3 --route-skew 0.5:1.5 --route-input 0.5 -q -o %s > /dev/null", tool,
                        path);
    KT_CHECK(rc == 0 && file_exists(path), "--route-skew and --route-input: exit %d", rc);
    unlink(path);
    rc = kt_test_system("%s --help | grep -q -- --route-input", tool);
    KT_CHECK(rc == 0, "--help lists the options (%d)", rc);
    const char *err_log = kt_test_path("bad.log");
    kt_test_system("%s --preset deepseek-v3-slice --experts 60 -o %s 2> %s", tool, path, err_log);
    size_t n = 0;
    char *text = kt_test_read_file(err_log, &n);
    KT_CHECK(text && strstr(text, "divisible"), "the error says why: %s", text ? text : "");
    free(text);
    unlink(err_log);
}

/* ---- progress ----------------------------------------------------------------------------- */

static char *stream_text(FILE *f)
{
    fflush(f);
    long n = ftell(f);
    rewind(f);
    char *buf = calloc(1, (size_t)(n > 0 ? n : 0) + 1);
    if (buf && n > 0 && fread(buf, 1, (size_t)n, f) != (size_t)n)
        buf[0] = 0;
    return buf;
}

static int count_char(const char *s, char c)
{
    int n = 0;
    for (; s && *s; s++)
        n += *s == c;
    return n;
}

static void progress_log_mode_reports_each_tenth_and_a_total(void)
{
    FILE *f = tmpfile();
    KT_CHECK(f != NULL, "tmpfile");
    if (!f)
        return;
    struct kt_progress *p = kt_progress_create(f, "load", 1000, KT_PROGRESS_LOG);
    for (int i = 0; i < 100; i++)
        kt_progress_add(p, 10);
    KT_CHECK(kt_progress_done_bytes(p) == 1000, "counted %llu", (unsigned long long)kt_progress_done_bytes(p));
    kt_progress_finish(p);
    kt_progress_finish(p); /* once only */
    kt_progress_destroy(p);
    char *text = stream_text(f);
    fclose(f);
    KT_CHECK(text != NULL, "read back");
    if (!text)
        return;
    KT_CHECK(count_char(text, '\n') == 10, "9 tenths and a total, got:\n%s", text);
    KT_CHECK(count_char(text, '\r') == 0, "no redraws in log mode");
    KT_CHECK(strstr(text, "load:  10%") && strstr(text, "load:  90%") && !strstr(text, "100%"), "tenths:\n%s",
             text);
    KT_CHECK(strstr(text, "(1000 bytes) in ") && strstr(text, "MB/s"), "total line:\n%s", text);
    free(text);
}

static void progress_tty_mode_redraws_one_line(void)
{
    FILE *f = tmpfile();
    if (!f)
        return;
    uint64_t total = 3ull << 30;
    struct kt_progress *p = kt_progress_create(f, "write", total, KT_PROGRESS_TTY);
    for (int i = 0; i < 3000; i++)
        kt_progress_add(p, 1 << 20);
    usleep(120 * 1000);
    kt_progress_add(p, total - 3000ull * (1 << 20)); /* due now: one redraw */
    kt_progress_finish(p);
    kt_progress_destroy(p);
    char *text = stream_text(f);
    fclose(f);
    KT_CHECK(text != NULL, "read back");
    if (!text)
        return;
    int redraws = count_char(text, '\r');
    KT_CHECK(redraws >= 2 && redraws <= 4, "throttled redraws, got %d", redraws);
    KT_CHECK(count_char(text, '\n') == 2, "the bar line ends, then the total line:\n%s", text);
    KT_CHECK(strstr(text, "[####") && strstr(text, "100%") && strstr(text, "3.00/3.00 GiB") &&
                 strstr(text, "ETA"),
             "bar, bytes and ETA:\n%s", text);
    free(text);

    /* No stream: counts silently. */
    p = kt_progress_create(NULL, "quiet", 10, KT_PROGRESS_AUTO);
    kt_progress_add(p, 4);
    kt_progress_finish(p);
    KT_CHECK(kt_progress_done_bytes(p) == 4, "silent reporter counts");
    kt_progress_destroy(p);
}

int main(void)
{
    KT_RUN(tiny_has_kimi_k2_metadata_and_layout);
    KT_RUN(tiny_v3_has_deepseek_v3_routing_and_rope);
    KT_RUN(same_seed_gives_same_bytes_on_any_thread_count);
    KT_RUN(type_options_are_honoured_with_block_fallbacks);
    KT_RUN(f32_weights_have_intended_statistics);
    KT_RUN(slice_plans_use_real_dimensions);
    KT_RUN(skew_concentrates_router_selection);
    KT_RUN(header_only_writes_the_full_header_and_a_hole);
    KT_RUN(invalid_options_fail_cleanly);
    KT_RUN(progress_log_mode_reports_each_tenth_and_a_total);
    KT_RUN(progress_tty_mode_redraws_one_line);
    return kt_test_finish();
}
