/*
 * hf_config.c - config.json of a DeepSeek-V3 / Kimi-K2 checkpoint as deepseek2.*
 * GGUF keys (see hf_config.h).
 *
 * The mapping, field by field (HF name -> GGUF key, as llama.cpp's converter
 * writes them for deepseek2):
 *   num_hidden_layers -> block_count; max_position_embeddings -> context_length;
 *   hidden_size -> embedding_length; intermediate_size -> feed_forward_length;
 *   num_attention_heads -> attention.head_count, and head_count_kv the same
 *   (kv_b_proj is one fused matrix: key_length = qk_nope + qk_rope,
 *   value_length = v_head_dim); q_lora_rank, kv_lora_rank; qk_rope_head_dim ->
 *   rope.dimension_count; rms_norm_eps; first_k_dense_replace ->
 *   leading_dense_block_count; n_routed_experts -> expert_count;
 *   num_experts_per_tok -> expert_used_count; moe_intermediate_size ->
 *   expert_feed_forward_length; n_shared_experts; n_group, topk_group ->
 *   expert_group_count, expert_group_used_count; scoring_func sigmoid|softmax
 *   -> expert_gating_func 2|1; routed_scaling_factor -> expert_weights_scale;
 *   norm_topk_prob -> expert_weights_norm; rope_theta -> rope.freq_base;
 *   rope_scaling {type|rope_type, factor, original_max_position_embeddings,
 *   beta_fast, beta_slow, mscale_all_dim} -> rope.scaling.* with
 *   yarn_log_multiplier = 0.1 * mscale_all_dim; vocab_size.
 * Never: guessing a missing field (kt_hparams_read then names the GGUF key
 * that is missing, and the message says which config field feeds it).
 */
#include "hf_config.h"

#include "gguf.h"
#include "small_file.h"

#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_KEYS 48 /* read_model and read_rope_scaling add at most 32 */
#define KEY_BYTES 64
#define STR_BYTES 128

/* What the metadata-only GGUF's records point into (released at close). */
struct meta_owner {
    struct kt_gguf_kv kv[MAX_KEYS];
    char keys[MAX_KEYS][KEY_BYTES];
    char strs[MAX_KEYS][STR_BYTES];
    uint32_t n;
};

static struct kt_gguf_kv *add(struct meta_owner *o, const char *key)
{
    struct kt_gguf_kv *kv = &o->kv[o->n];
    snprintf(o->keys[o->n], KEY_BYTES, "%s", key);
    kv->key = o->keys[o->n];
    o->n++;
    return kv;
}

static void add_u32(struct meta_owner *o, const char *key, uint32_t v)
{
    struct kt_gguf_kv *kv = add(o, key);
    kv->value.type = KT_GGUF_UINT32, kv->value.u32 = v;
}

static void add_f32(struct meta_owner *o, const char *key, float v)
{
    struct kt_gguf_kv *kv = add(o, key);
    kv->value.type = KT_GGUF_FLOAT32, kv->value.f32 = v;
}

static void add_bool(struct meta_owner *o, const char *key, bool v)
{
    struct kt_gguf_kv *kv = add(o, key);
    kv->value.type = KT_GGUF_BOOL, kv->value.b = v;
}

static void add_str(struct meta_owner *o, const char *key, const char *v)
{
    char *s = o->strs[o->n];
    snprintf(s, STR_BYTES, "%s", v);
    struct kt_gguf_kv *kv = add(o, key);
    kv->value.type = KT_GGUF_STRING, kv->value.str = (struct kt_gguf_str){s, strlen(s)};
}

/* ---- reading fields ---------------------------------------------------------------------- */

struct reader {
    const json_t *cfg;
    const char *label;
    kt_err *err;
    kt_status st;
};

static bool failed(struct reader *r, kt_status st, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static bool failed(struct reader *r, kt_status st, const char *fmt, ...)
{
    if (r->st != KT_OK)
        return false;
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    r->st = kt_err_set(r->err, st, "%s: %s", r->label, msg);
    return false;
}

/* An integer field into key (absent: no key, and kt_hparams_read decides). */
static void map_uint(struct reader *r, struct meta_owner *o, const json_t *from, const char *field, const char *key)
{
    const json_t *v = json_object_get(from, field);
    if (!v || json_is_null(v))
        return;
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > (json_int_t)UINT32_MAX) {
        failed(r, KT_ERR_FORMAT, "%s must be a whole number from 0 to %u (for %s)", field, UINT32_MAX, key);
        return;
    }
    add_u32(o, key, (uint32_t)json_integer_value(v));
}

static bool number(struct reader *r, const json_t *from, const char *field, double *out)
{
    const json_t *v = json_object_get(from, field);
    if (!v || json_is_null(v))
        return false;
    if (!json_is_number(v) || !isfinite(json_number_value(v)))
        return failed(r, KT_ERR_FORMAT, "%s must be a number", field);
    *out = json_number_value(v);
    return true;
}

static void map_float(struct reader *r, struct meta_owner *o, const json_t *from, const char *field, const char *key)
{
    double v = 0;
    if (number(r, from, field, &v))
        add_f32(o, key, (float)v);
}

static const char *string(struct reader *r, const json_t *from, const char *field)
{
    const json_t *v = json_object_get(from, field);
    if (!v || json_is_null(v))
        return NULL;
    if (!json_is_string(v)) {
        failed(r, KT_ERR_FORMAT, "%s must be a string", field);
        return NULL;
    }
    return json_string_value(v);
}

/* ---- quantization_config ----------------------------------------------------------------- */

static void read_fp8(struct reader *r, const json_t *q, struct kt_hf_quant *out)
{
    const char *fmt = string(r, q, "fmt");
    if (fmt && strcmp(fmt, "e4m3") != 0) {
        failed(r, KT_ERR_UNSUPPORTED, "quantization_config.fmt \"%.32s\": kt reads FP8 weights as e4m3", fmt);
        return;
    }
    const json_t *bs = json_object_get(q, "weight_block_size");
    if (!json_is_array(bs) || json_array_size(bs) != 2 || !json_is_integer(json_array_get(bs, 0)) ||
        !json_is_integer(json_array_get(bs, 1)) || json_integer_value(json_array_get(bs, 0)) < 1 ||
        json_integer_value(json_array_get(bs, 1)) < 1 || json_integer_value(json_array_get(bs, 0)) > 65536 ||
        json_integer_value(json_array_get(bs, 1)) > 65536) {
        failed(r, KT_ERR_UNSUPPORTED, "quantization_config.weight_block_size must be [rows, cols] of block scales "
                                      "(per-tensor or per-channel FP8 is not supported)");
        return;
    }
    out->format = KT_HF_WEIGHTS_FP8_BLOCK;
    out->block_rows = (uint32_t)json_integer_value(json_array_get(bs, 0));
    out->block_cols = (uint32_t)json_integer_value(json_array_get(bs, 1));
}

static void read_compressed_tensors(struct reader *r, const json_t *q, struct kt_hf_quant *out)
{
    const char *format = string(r, q, "format");
    if (!format || strcmp(format, "pack-quantized") != 0) {
        failed(r, KT_ERR_UNSUPPORTED, "quantization_config.format \"%.40s\": kt reads compressed-tensors "
                                      "\"pack-quantized\" checkpoints", format ? format : "(missing)");
        return;
    }
    const json_t *groups = json_object_get(q, "config_groups");
    if (!json_is_object(groups) || json_object_size(groups) != 1) {
        failed(r, KT_ERR_UNSUPPORTED, "quantization_config.config_groups must hold one group (it has %zu)",
               json_is_object(groups) ? json_object_size(groups) : (size_t)0);
        return;
    }
    const json_t *w = json_object_get(json_object_iter_value(json_object_iter((json_t *)groups)), "weights");
    const json_t *bits = json_object_get(w, "num_bits"), *gs = json_object_get(w, "group_size");
    const char *type = string(r, w, "type"), *strategy = string(r, w, "strategy");
    if (r->st != KT_OK)
        return;
    if (!json_is_object(w) || !json_is_integer(bits) || json_integer_value(bits) != 4 || !type ||
        strcmp(type, "int") != 0 || !json_is_true(json_object_get(w, "symmetric")) || !strategy ||
        strcmp(strategy, "group") != 0 || !json_is_integer(gs) || json_integer_value(gs) < 8 ||
        json_integer_value(gs) > 4096 || json_integer_value(gs) % 8 != 0) {
        failed(r, KT_ERR_UNSUPPORTED, "quantization_config.config_groups: kt reads weights of num_bits 4, type "
                                      "\"int\", symmetric, strategy \"group\" with a group_size that is a multiple "
                                      "of 8");
        return;
    }
    if (json_object_get(q, "config_groups") && json_object_get(w, "dynamic") && json_is_true(json_object_get(w, "dynamic"))) {
        failed(r, KT_ERR_UNSUPPORTED, "quantization_config: dynamic weight quantization is not a stored format");
        return;
    }
    out->format = KT_HF_WEIGHTS_INT4_GROUP;
    out->group_size = (uint32_t)json_integer_value(gs);
    const json_t *ignore = json_object_get(q, "ignore");
    size_t i;
    const json_t *item;
    json_array_foreach(ignore, i, item) {
        if (!json_is_string(item) || json_string_length(item) >= sizeof out->ignore[0]) {
            failed(r, KT_ERR_FORMAT, "quantization_config.ignore[%zu] must be a name shorter than %zu bytes", i,
                   sizeof out->ignore[0]);
            return;
        }
        if (out->n_ignore == KT_HF_MAX_IGNORE) {
            failed(r, KT_ERR_UNSUPPORTED, "quantization_config.ignore lists more than %d names", KT_HF_MAX_IGNORE);
            return;
        }
        snprintf(out->ignore[out->n_ignore++], sizeof out->ignore[0], "%s", json_string_value(item));
    }
}

static void read_quant(struct reader *r, struct kt_hf_quant *out)
{
    memset(out, 0, sizeof *out);
    const json_t *q = json_object_get(r->cfg, "quantization_config");
    if (!q || json_is_null(q))
        return;
    if (!json_is_object(q)) {
        failed(r, KT_ERR_FORMAT, "quantization_config must be an object");
        return;
    }
    const char *method = string(r, q, "quant_method");
    if (!method) {
        failed(r, KT_ERR_FORMAT, "quantization_config.quant_method is missing");
        return;
    }
    snprintf(out->method, sizeof out->method, "%s", method);
    if (strcmp(method, "fp8") == 0)
        read_fp8(r, q, out);
    else if (strcmp(method, "compressed-tensors") == 0)
        read_compressed_tensors(r, q, out);
    else if (strcmp(method, "mxfp4") == 0)
        out->format = KT_HF_WEIGHTS_MXFP4;
    else
        failed(r, KT_ERR_UNSUPPORTED, "quantization_config.quant_method \"%.32s\" is not supported (fp8, "
                                      "compressed-tensors, mxfp4)", method);
}

/* ---- the model --------------------------------------------------------------------------- */

#define KEY(k) "deepseek2." k

static bool supported_architecture(const json_t *cfg)
{
    static const char *const known[] = {"DeepseekV3ForCausalLM", "DeepseekV2ForCausalLM", "KimiK2ForCausalLM"};
    const json_t *a = json_array_get(json_object_get(cfg, "architectures"), 0);
    for (size_t i = 0; json_is_string(a) && i < sizeof known / sizeof known[0]; i++)
        if (strcmp(json_string_value(a), known[i]) == 0)
            return true;
    return false;
}

static void read_rope_scaling(struct reader *r, struct meta_owner *o, const json_t *cfg)
{
    const json_t *rs = json_object_get(cfg, "rope_scaling");
    if (!rs || json_is_null(rs))
        return;
    if (!json_is_object(rs)) {
        failed(r, KT_ERR_FORMAT, "rope_scaling must be an object or null");
        return;
    }
    const char *type = string(r, rs, "type");
    if (!type)
        type = string(r, rs, "rope_type");
    if (!type) {
        failed(r, KT_ERR_FORMAT, "rope_scaling has no type");
        return;
    }
    add_str(o, KEY("rope.scaling.type"), type); /* kt_hparams_read refuses types it does not run */
    map_float(r, o, rs, "factor", KEY("rope.scaling.factor"));
    map_uint(r, o, rs, "original_max_position_embeddings", KEY("rope.scaling.original_context_length"));
    map_float(r, o, rs, "beta_fast", KEY("rope.scaling.yarn_beta_fast"));
    map_float(r, o, rs, "beta_slow", KEY("rope.scaling.yarn_beta_slow"));
    double mscale = 0, mscale_all_dim = 0;
    const bool has_m = number(r, rs, "mscale", &mscale), has_all = number(r, rs, "mscale_all_dim", &mscale_all_dim);
    if (has_all)
        add_f32(o, KEY("rope.scaling.yarn_log_multiplier"), (float)(0.1 * mscale_all_dim));
    /* the rotary mscale is yarn(mscale) / yarn(mscale_all_dim): 1 only when they agree */
    if (strcmp(type, "yarn") == 0 && has_m && mscale != (has_all ? mscale_all_dim : 0))
        failed(r, KT_ERR_UNSUPPORTED, "rope_scaling.mscale %g differs from mscale_all_dim %g: kt's YaRN assumes "
                                      "they agree (as DeepSeek-V3 and Kimi-K2 ship)", mscale, mscale_all_dim);
}

static void read_model(struct reader *r, struct meta_owner *o, const json_t *cfg, const char *name)
{
    add_str(o, "general.architecture", "deepseek2");
    add_str(o, "general.name", name);
    map_uint(r, o, cfg, "num_hidden_layers", KEY("block_count"));
    map_uint(r, o, cfg, "max_position_embeddings", KEY("context_length"));
    map_uint(r, o, cfg, "hidden_size", KEY("embedding_length"));
    map_uint(r, o, cfg, "intermediate_size", KEY("feed_forward_length"));
    map_uint(r, o, cfg, "num_attention_heads", KEY("attention.head_count"));
    map_uint(r, o, cfg, "num_attention_heads", KEY("attention.head_count_kv")); /* fused kv_b_proj */
    map_uint(r, o, cfg, "q_lora_rank", KEY("attention.q_lora_rank"));
    map_uint(r, o, cfg, "kv_lora_rank", KEY("attention.kv_lora_rank"));
    map_uint(r, o, cfg, "qk_rope_head_dim", KEY("rope.dimension_count"));
    map_float(r, o, cfg, "rms_norm_eps", KEY("attention.layer_norm_rms_epsilon"));
    const json_t *nope = json_object_get(cfg, "qk_nope_head_dim"), *rope = json_object_get(cfg, "qk_rope_head_dim");
    if (json_is_integer(nope) && json_is_integer(rope) && json_integer_value(nope) >= 0 &&
        json_integer_value(rope) >= 0 && json_integer_value(nope) + json_integer_value(rope) <= (json_int_t)UINT32_MAX)
        add_u32(o, KEY("attention.key_length"), (uint32_t)(json_integer_value(nope) + json_integer_value(rope)));
    else if (nope && !json_is_integer(nope))
        failed(r, KT_ERR_FORMAT, "qk_nope_head_dim must be a whole number");
    map_uint(r, o, cfg, "v_head_dim", KEY("attention.value_length"));
    map_uint(r, o, cfg, "first_k_dense_replace", KEY("leading_dense_block_count"));
    map_uint(r, o, cfg, "n_routed_experts", KEY("expert_count"));
    map_uint(r, o, cfg, "num_experts_per_tok", KEY("expert_used_count"));
    map_uint(r, o, cfg, "moe_intermediate_size", KEY("expert_feed_forward_length"));
    map_uint(r, o, cfg, "n_shared_experts", KEY("expert_shared_count"));
    map_uint(r, o, cfg, "n_group", KEY("expert_group_count"));
    map_uint(r, o, cfg, "topk_group", KEY("expert_group_used_count"));
    map_float(r, o, cfg, "routed_scaling_factor", KEY("expert_weights_scale"));
    map_float(r, o, cfg, "rope_theta", KEY("rope.freq_base"));
    map_uint(r, o, cfg, "vocab_size", KEY("vocab_size"));
    const json_t *norm = json_object_get(cfg, "norm_topk_prob");
    if (norm && !json_is_boolean(norm))
        failed(r, KT_ERR_FORMAT, "norm_topk_prob must be true or false");
    else if (norm)
        add_bool(o, KEY("expert_weights_norm"), json_is_true(norm));
    const char *scoring = string(r, cfg, "scoring_func");
    if (scoring && strcmp(scoring, "sigmoid") != 0 && strcmp(scoring, "softmax") != 0)
        failed(r, KT_ERR_UNSUPPORTED, "scoring_func \"%.32s\" is not supported (sigmoid, softmax)", scoring);
    else if (scoring)
        add_u32(o, KEY("expert_gating_func"), strcmp(scoring, "sigmoid") == 0 ? 2 : 1);
    /* every layer after the dense ones is MoE: kt's deepseek2 has no other layout */
    const json_t *freq = json_object_get(cfg, "moe_layer_freq");
    if (freq && !(json_is_integer(freq) && json_integer_value(freq) == 1))
        failed(r, KT_ERR_UNSUPPORTED, "moe_layer_freq must be 1 (every layer after first_k_dense_replace is MoE)");
    const json_t *tied = json_object_get(cfg, "tie_word_embeddings");
    if (json_is_true(tied))
        failed(r, KT_ERR_UNSUPPORTED, "tie_word_embeddings true: DeepSeek-V3 and Kimi-K2 checkpoints have their "
                                      "own lm_head");
    read_rope_scaling(r, o, cfg);
}

static void release_owner(void *owner)
{
    free(owner);
}

kt_status kt_hf_config_parse(const char *text, size_t len, const char *label, struct kt_gguf **meta,
                             struct kt_hf_quant *quant, kt_err *err)
{
    *meta = NULL;
    memset(quant, 0, sizeof *quant);
    json_error_t je;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    if (!root)
        return kt_err_set(err, KT_ERR_FORMAT, "%s: not JSON (line %d, column %d): %s", label, je.line, je.column,
                          je.text);
    const json_t *cfg = root;
    kt_status st = KT_OK;
    if (!json_is_object(root)) {
        st = kt_err_set(err, KT_ERR_FORMAT, "%s: not a JSON object", label);
        goto done;
    }
    /* Kimi-K2.5 (a vision-language model): the language model's config is text_config */
    const json_t *text_cfg = json_object_get(root, "text_config");
    if (json_is_object(text_cfg))
        cfg = text_cfg;
    if (!supported_architecture(cfg) && !supported_architecture(root)) {
        const json_t *a = json_array_get(json_object_get(cfg, "architectures"), 0);
        st = kt_err_set(err, KT_ERR_UNSUPPORTED, "%s: architectures[0] \"%.64s\" is not supported (kt runs "
                        "DeepseekV3ForCausalLM and the models built on it: DeepSeek-V3/R1, Kimi-K2)", label,
                        json_is_string(a) ? json_string_value(a) : "(missing)");
        goto done;
    }
    struct meta_owner *o = calloc(1, sizeof *o);
    if (!o) {
        st = kt_err_set(err, KT_ERR_NOMEM, "%s: out of memory", label);
        goto done;
    }
    struct reader r = {cfg, label, err, KT_OK};
    const char *slash = strrchr(label, '/');
    char folder[STR_BYTES] = "";
    if (slash && slash > label) { /* ".../Kimi-K2-Thinking/config.json" names Kimi-K2-Thinking */
        const char *start = slash - 1;
        while (start > label && start[-1] != '/')
            start--;
        snprintf(folder, sizeof folder, "%.*s", (int)(slash - start), start);
    }
    const char *name = string(&r, root, "_name_or_path");
    read_model(&r, o, cfg, name && *name ? name : folder);
    r.cfg = json_object_get(root, "quantization_config") ? root : cfg;
    read_quant(&r, quant);
    if (r.st != KT_OK) {
        free(o);
        st = r.st;
        goto done;
    }
    st = kt_gguf_from_parts(o->kv, o->n, NULL, 0, release_owner, o, label, meta, err);
done:
    json_decref(root);
    return st;
}

kt_status kt_hf_config_read(const char *dir, struct kt_gguf **meta, struct kt_hf_quant *quant, kt_err *err)
{
    *meta = NULL;
    char path[4096];
    if ((size_t)snprintf(path, sizeof path, "%s/config.json", dir) >= sizeof path)
        return kt_err_set(err, KT_ERR_INVALID, "%s: path too long", dir);
    char *text = NULL;
    size_t len = 0;
    kt_status st = kt_read_small_file(path, 1u << 20, &text, &len, err);
    if (st == KT_OK)
        st = kt_hf_config_parse(text, len, path, meta, quant, err);
    free(text);
    return st;
}
