/*
 * model.c - reads a deepseek2 GGUF's hyperparameters from the exact keys
 * llama.cpp's converters write, and builds the per-layer tensor table,
 * checking every tensor's presence, shape and type against them.
 *
 * It describes a file and never computes with its weights: no tensor data is
 * read here, only tensor infos and metadata.  It never prints and never
 * exits; every failure is a status with a message that names the key or
 * tensor, what was expected and what the file has.  The first problem found
 * is the one reported, in a fixed order (hyperparameters, then token_embd,
 * output_norm, output, then layer by layer in the order of struct kt_layer,
 * then the metadata against the rest of the file: layers past block_count,
 * tensors of parts the keys say are absent, special token ids).
 */
#include "model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hf_model.h"
#include "hf_tensors.h"
#include "quant.h"

#define KEY(k) "deepseek2." k

/* No real model dimension comes near this; it keeps the shape products
 * computed below far from int64 overflow. */
#define KT_MODEL_MAX_DIM (1u << 24)

/* No model stretches RoPE positions by more (DeepSeek-V3: 40, Kimi-K2: 32). */
#define KT_MAX_ROPE_FACTOR 1024.0f

const char *kt_tensor_class_name(enum kt_tensor_class c)
{
    switch (c) {
    case KT_CLASS_EMBED_OUTPUT: return "embeddings/output";
    case KT_CLASS_ATTENTION: return "attention";
    case KT_CLASS_DENSE_FFN: return "dense FFN";
    case KT_CLASS_ROUTER: return "router";
    case KT_CLASS_SHARED_EXPERTS: return "shared experts";
    case KT_CLASS_ROUTED_EXPERTS: return "routed experts";
    case KT_CLASS_COUNT: break;
    }
    return "unknown";
}

const char *kt_rope_scaling_name(enum kt_rope_scaling s)
{
    switch (s) {
    case KT_ROPE_SCALING_NONE: return "none";
    case KT_ROPE_SCALING_LINEAR: return "linear";
    case KT_ROPE_SCALING_YARN: return "yarn";
    }
    return "unknown";
}

const char *kt_gating_name(enum kt_gating g)
{
    switch (g) {
    case KT_GATING_SOFTMAX: return "softmax";
    case KT_GATING_SIGMOID: return "sigmoid";
    }
    return "unknown";
}

/* ---- metadata readers ---------------------------------------------------------- */

static kt_status missing_key(const char *key, kt_err *err)
{
    return kt_err_set(err, KT_ERR_NOT_FOUND, "%s: required key is missing", key);
}

/* An unsigned integer key stored in any integer width.  Absent: dflt, or an
 * error when required. */
static kt_status read_u32(const struct kt_gguf *g, const char *key, bool required, uint32_t dflt,
                          uint32_t *out, kt_err *err)
{
    if (!kt_gguf_find_kv(g, key)) {
        *out = dflt;
        return required ? missing_key(key, err) : KT_OK;
    }
    return kt_gguf_get_uint32(g, key, out, err);
}

static bool is_integer_type(enum kt_gguf_type t)
{
    switch (t) {
    case KT_GGUF_UINT8: case KT_GGUF_INT8: case KT_GGUF_UINT16: case KT_GGUF_INT16:
    case KT_GGUF_UINT32: case KT_GGUF_INT32: case KT_GGUF_UINT64: case KT_GGUF_INT64:
        return true;
    default:
        return false;
    }
}

/* A key llama.cpp reads with get_key_or_arr: one integer, or one integer per
 * layer.  kt runs one width for all layers, so an array is accepted only when
 * its values are all equal. */
static kt_status read_u32_per_layer(const struct kt_gguf *g, const char *key, uint32_t n_layer, bool required,
                                    uint32_t dflt, uint32_t *out, kt_err *err)
{
    const struct kt_gguf_kv *kv = kt_gguf_find_kv(g, key);
    if (!kv || kv->value.type != KT_GGUF_ARRAY)
        return read_u32(g, key, required, dflt, out, err);

    const struct kt_gguf_array *a = &kv->value.arr;
    if (!is_integer_type(a->elem_type))
        return kt_err_set(err, KT_ERR_FORMAT, "%s: array of %s, expected integers (one per layer)", key,
                          kt_gguf_type_name(a->elem_type));
    if (a->count != n_layer)
        return kt_err_set(err, KT_ERR_FORMAT, "%s: per-layer array has %llu values, block_count is %u", key,
                          (unsigned long long)a->count, n_layer);
    int64_t first = 0;
    for (uint64_t i = 0; i < a->count; i++) {
        int64_t v;
        if (!kt_gguf_array_int(a, i, &v) || v < 0 || v > (int64_t)UINT32_MAX)
            return kt_err_set(err, KT_ERR_FORMAT, "%s: value %llu of the per-layer array is out of range", key,
                              (unsigned long long)i);
        if (i == 0)
            first = v;
        else if (v != first)
            return kt_err_set(err, KT_ERR_UNSUPPORTED,
                              "%s: per-layer values differ (layer 0: %lld, layer %llu: %lld); "
                              "kt needs one value for all layers",
                              key, (long long)first, (unsigned long long)i, (long long)v);
    }
    *out = (uint32_t)first;
    return KT_OK;
}

static kt_status read_f32(const struct kt_gguf *g, const char *key, bool required, float dflt, float *out,
                          kt_err *err)
{
    if (!kt_gguf_find_kv(g, key)) {
        *out = dflt;
        return required ? missing_key(key, err) : KT_OK;
    }
    double v;
    kt_status st = kt_gguf_get_float(g, key, &v, err);
    if (st != KT_OK)
        return st;
    if (!isfinite(v))
        return kt_err_set(err, KT_ERR_FORMAT, "%s: value is not finite", key);
    *out = (float)v;
    return KT_OK;
}

/* Copies a string value into buf (truncating); "" when absent. */
static kt_status read_str(const struct kt_gguf *g, const char *key, char *buf, size_t size, kt_err *err)
{
    buf[0] = 0;
    if (!kt_gguf_find_kv(g, key))
        return KT_OK;
    struct kt_gguf_str s;
    kt_status st = kt_gguf_get_str(g, key, &s, err);
    if (st != KT_OK)
        return st;
    size_t n = s.len < size - 1 ? (size_t)s.len : size - 1;
    memcpy(buf, s.ptr, n);
    buf[n] = 0;
    return KT_OK;
}

static bool str_is(struct kt_gguf_str s, const char *lit)
{
    return s.len == strlen(lit) && memcmp(s.ptr, lit, s.len) == 0;
}

/* ---- hyperparameters ------------------------------------------------------------ */

static kt_status check_dim(const char *key, uint32_t v, kt_err *err)
{
    if (v == 0)
        return kt_err_set(err, KT_ERR_FORMAT, "%s: must be greater than 0", key);
    if (v > KT_MODEL_MAX_DIM)
        return kt_err_set(err, KT_ERR_FORMAT, "%s: %u is implausibly large (limit %u)", key, v, KT_MODEL_MAX_DIM);
    return KT_OK;
}

static kt_status read_rope(const struct kt_gguf *g, struct kt_hparams *hp, kt_err *err)
{
    kt_status st;
    if ((st = read_f32(g, KEY("rope.freq_base"), false, 10000.0f, &hp->rope_freq_base, err)) != KT_OK)
        return st;
    if (!(hp->rope_freq_base > 1.0f))
        return kt_err_set(err, KT_ERR_FORMAT, "%s: %g must be greater than 1", KEY("rope.freq_base"),
                          (double)hp->rope_freq_base);

    /* factor 0 or absent means no scaling, as in llama.cpp; older files used rope.scale_linear */
    float factor = 0.0f;
    if ((st = read_f32(g, KEY("rope.scaling.factor"), false, 0.0f, &factor, err)) != KT_OK)
        return st;
    if (factor == 0.0f && (st = read_f32(g, KEY("rope.scale_linear"), false, 0.0f, &factor, err)) != KT_OK)
        return st;
    if (factor < 0.0f)
        return kt_err_set(err, KT_ERR_FORMAT, "%s: %g must not be negative", KEY("rope.scaling.factor"),
                          (double)factor);
    hp->rope_scaling_factor = factor == 0.0f ? 1.0f : factor;

    /* Type absent: llama.cpp assumes "linear", which with factor 1 is no scaling. */
    const char *type_key = KEY("rope.scaling.type");
    if (!kt_gguf_find_kv(g, type_key)) {
        hp->rope_scaling = hp->rope_scaling_factor != 1.0f ? KT_ROPE_SCALING_LINEAR : KT_ROPE_SCALING_NONE;
    } else {
        struct kt_gguf_str s;
        if ((st = kt_gguf_get_str(g, type_key, &s, err)) != KT_OK)
            return st;
        if (str_is(s, "none"))
            hp->rope_scaling = KT_ROPE_SCALING_NONE;
        else if (str_is(s, "linear"))
            hp->rope_scaling = KT_ROPE_SCALING_LINEAR;
        else if (str_is(s, "yarn"))
            hp->rope_scaling = KT_ROPE_SCALING_YARN;
        else
            return kt_err_set(err, KT_ERR_UNSUPPORTED, "%s: \"%.*s\" is not supported (none, linear, yarn)",
                              type_key, (int)(s.len > 32 ? 32 : s.len), s.ptr);
    }

    /* A scaling type stretches positions by its factor: without one (absent
     * or 0) it would silently be no scaling at all.  YaRN extends the context,
     * so its factor is at least 1 (40 in DeepSeek-V3, 32 in Kimi-K2). */
    const char *factor_key = KEY("rope.scaling.factor");
    if (hp->rope_scaling != KT_ROPE_SCALING_NONE && factor == 0.0f)
        return kt_err_set(err, KT_ERR_FORMAT,
                          "%s: %s, but %s is \"%s\", which needs a factor (%s); fix the key, or set the type to "
                          "\"none\"",
                          factor_key, kt_gguf_find_kv(g, factor_key) ? "0" : "missing", type_key,
                          kt_rope_scaling_name(hp->rope_scaling),
                          hp->rope_scaling == KT_ROPE_SCALING_YARN ? "at least 1" : "above 0");
    if (hp->rope_scaling == KT_ROPE_SCALING_YARN && factor < 1.0f)
        return kt_err_set(err, KT_ERR_FORMAT,
                          "%s: %g, but %s is \"yarn\", which extends the context by a factor of at least 1",
                          factor_key, (double)factor, type_key);
    if (factor > KT_MAX_ROPE_FACTOR)
        return kt_err_set(err, KT_ERR_FORMAT, "%s: %g is implausibly large (at most %g)", factor_key, (double)factor,
                          (double)KT_MAX_ROPE_FACTOR);

    if ((st = read_u32(g, KEY("rope.scaling.original_context_length"), false, hp->n_ctx_train, &hp->rope_orig_ctx,
                       err)) != KT_OK)
        return st;
    if (hp->rope_orig_ctx == 0)
        return kt_err_set(err, KT_ERR_FORMAT, "%s: must be greater than 0", KEY("rope.scaling.original_context_length"));
    if ((st = read_f32(g, KEY("rope.scaling.yarn_log_multiplier"), false, 0.0f, &hp->yarn_log_multiplier, err)) !=
        KT_OK)
        return st;
    /* DeepSeek's definition defaults β to 32/1; a file's values are used when
     * present, as HF does (llama.cpp ignores them for deepseek2: docs/deepseek2.md, RoPE/YaRN). */
    if ((st = read_f32(g, KEY("rope.scaling.yarn_beta_fast"), false, 32.0f, &hp->yarn_beta_fast, err)) != KT_OK)
        return st;
    if ((st = read_f32(g, KEY("rope.scaling.yarn_beta_slow"), false, 1.0f, &hp->yarn_beta_slow, err)) != KT_OK)
        return st;
    if (!(hp->yarn_beta_fast > 0.0f))
        return kt_err_set(err, KT_ERR_FORMAT, "%s: %g must be positive", KEY("rope.scaling.yarn_beta_fast"),
                          (double)hp->yarn_beta_fast);
    if (!(hp->yarn_beta_slow > 0.0f))
        return kt_err_set(err, KT_ERR_FORMAT, "%s: %g must be positive", KEY("rope.scaling.yarn_beta_slow"),
                          (double)hp->yarn_beta_slow);
    /* mscale = 1 + 0.1 L ln s and the attention factor scale every score: both must stay positive. */
    if (!(hp->yarn_log_multiplier >= 0.0f))
        return kt_err_set(err, KT_ERR_FORMAT, "%s: %g must not be negative", KEY("rope.scaling.yarn_log_multiplier"),
                          (double)hp->yarn_log_multiplier);
    if ((st = read_f32(g, KEY("rope.scaling.attn_factor"), false, 1.0f, &hp->rope_attn_factor, err)) != KT_OK)
        return st;
    if (!(hp->rope_attn_factor > 0.0f))
        return kt_err_set(err, KT_ERR_FORMAT, "%s: %g must be positive", KEY("rope.scaling.attn_factor"),
                          (double)hp->rope_attn_factor);
    return KT_OK;
}

static kt_status read_moe(const struct kt_gguf *g, struct kt_hparams *hp, kt_err *err)
{
    kt_status st;
    /* Expert keys are required only when the file has MoE layers. */
    bool moe = hp->n_dense_lead < hp->n_layer;
    if ((st = read_u32(g, KEY("expert_count"), moe, 0, &hp->n_expert, err)) != KT_OK ||
        (st = read_u32_per_layer(g, KEY("expert_used_count"), hp->n_layer, moe, 0, &hp->n_expert_used, err)) !=
            KT_OK ||
        (st = read_u32_per_layer(g, KEY("expert_feed_forward_length"), hp->n_layer, moe, 0, &hp->n_ff_exp, err)) !=
            KT_OK ||
        (st = read_u32(g, KEY("expert_shared_count"), moe, 0, &hp->n_expert_shared, err)) != KT_OK ||
        (st = read_u32(g, KEY("expert_group_count"), false, 0, &hp->n_expert_groups, err)) != KT_OK ||
        (st = read_u32(g, KEY("expert_group_used_count"), false, 0, &hp->n_group_used, err)) != KT_OK)
        return st;

    /* No groups (absent, 0 or 1) is one group holding every expert.  A group
     * count without a used count restricts nothing: every group is used. */
    if (hp->n_expert_groups == 0)
        hp->n_expert_groups = 1;
    if (hp->n_group_used == 0)
        hp->n_group_used = hp->n_expert_groups;

    uint32_t gating = 0;
    if ((st = read_u32(g, KEY("expert_gating_func"), false, 0, &gating, err)) != KT_OK)
        return st;
    if (gating == 0 || gating == 1)
        hp->gating = KT_GATING_SOFTMAX; /* 0/absent: files older than the key, all softmax */
    else if (gating == 2)
        hp->gating = KT_GATING_SIGMOID;
    else
        return kt_err_set(err, KT_ERR_UNSUPPORTED,
                          "%s: %u is not supported (1 = softmax, 2 = sigmoid)", KEY("expert_gating_func"), gating);

    if ((st = read_f32(g, KEY("expert_weights_scale"), false, 0.0f, &hp->expert_weights_scale, err)) != KT_OK)
        return st;
    if (hp->expert_weights_scale == 0.0f)
        hp->expert_weights_scale = 1.0f;
    hp->expert_weights_norm = false;
    if (kt_gguf_find_kv(g, KEY("expert_weights_norm")) &&
        (st = kt_gguf_get_bool(g, KEY("expert_weights_norm"), &hp->expert_weights_norm, err)) != KT_OK)
        return st;

    if (!moe)
        return KT_OK;
    if ((st = check_dim(KEY("expert_count"), hp->n_expert, err)) != KT_OK ||
        (st = check_dim(KEY("expert_used_count"), hp->n_expert_used, err)) != KT_OK ||
        (st = check_dim(KEY("expert_feed_forward_length"), hp->n_ff_exp, err)) != KT_OK)
        return st;
    if (hp->n_expert_shared > 64)
        return kt_err_set(err, KT_ERR_FORMAT, "%s: %u is implausibly large", KEY("expert_shared_count"),
                          hp->n_expert_shared);
    if (hp->n_expert_used > hp->n_expert)
        return kt_err_set(err, KT_ERR_FORMAT, "%s: %u exceeds expert_count %u", KEY("expert_used_count"),
                          hp->n_expert_used, hp->n_expert);
    if (hp->n_expert % hp->n_expert_groups != 0)
        return kt_err_set(err, KT_ERR_FORMAT, "%s: expert_count %u is not divisible by %u groups",
                          KEY("expert_group_count"), hp->n_expert, hp->n_expert_groups);
    if (hp->n_group_used > hp->n_expert_groups)
        return kt_err_set(err, KT_ERR_FORMAT, "%s: %u exceeds expert_group_count %u", KEY("expert_group_used_count"),
                          hp->n_group_used, hp->n_expert_groups);
    uint64_t selectable = (uint64_t)hp->n_group_used * (hp->n_expert / hp->n_expert_groups);
    if (hp->n_expert_used > selectable)
        return kt_err_set(err, KT_ERR_FORMAT,
                          "%s: %u experts cannot be chosen from %u of %u groups of %u experts",
                          KEY("expert_used_count"), hp->n_expert_used, hp->n_group_used, hp->n_expert_groups,
                          hp->n_expert / hp->n_expert_groups);
    if (!(hp->expert_weights_scale > 0.0f))
        return kt_err_set(err, KT_ERR_FORMAT, "%s: %g must be positive", KEY("expert_weights_scale"),
                          (double)hp->expert_weights_scale);
    return KT_OK;
}

kt_status kt_hparams_read(const struct kt_gguf *g, struct kt_hparams *hp, kt_err *err)
{
    memset(hp, 0, sizeof *hp);
    kt_status st;

    struct kt_gguf_str arch;
    if (!kt_gguf_find_kv(g, "general.architecture"))
        return missing_key("general.architecture", err);
    if ((st = kt_gguf_get_str(g, "general.architecture", &arch, err)) != KT_OK)
        return st;
    if (!str_is(arch, "deepseek2"))
        return kt_err_set(err, KT_ERR_UNSUPPORTED, "general.architecture: \"%.*s\" is not supported (kt runs deepseek2)",
                          (int)(arch.len > 64 ? 64 : arch.len), arch.ptr);

    if ((st = read_u32(g, KEY("block_count"), true, 0, &hp->n_layer, err)) != KT_OK ||
        (st = check_dim(KEY("block_count"), hp->n_layer, err)) != KT_OK ||
        (st = read_u32(g, KEY("context_length"), true, 0, &hp->n_ctx_train, err)) != KT_OK ||
        (st = read_u32(g, KEY("embedding_length"), true, 0, &hp->n_embd, err)) != KT_OK ||
        (st = check_dim(KEY("embedding_length"), hp->n_embd, err)) != KT_OK ||
        (st = read_u32(g, KEY("leading_dense_block_count"), false, 0, &hp->n_dense_lead, err)) != KT_OK)
        return st;
    if (hp->n_ctx_train == 0)
        return kt_err_set(err, KT_ERR_FORMAT, "%s: must be greater than 0", KEY("context_length"));
    if (hp->n_dense_lead > hp->n_layer)
        return kt_err_set(err, KT_ERR_FORMAT, "%s: %u exceeds block_count %u", KEY("leading_dense_block_count"),
                          hp->n_dense_lead, hp->n_layer);

    /* Attention. */
    if ((st = read_u32_per_layer(g, KEY("attention.head_count"), hp->n_layer, true, 0, &hp->n_head, err)) != KT_OK ||
        (st = check_dim(KEY("attention.head_count"), hp->n_head, err)) != KT_OK ||
        (st = read_u32_per_layer(g, KEY("attention.head_count_kv"), hp->n_layer, false, hp->n_head, &hp->n_head_kv,
                                 err)) != KT_OK ||
        (st = read_u32(g, KEY("attention.q_lora_rank"), false, 0, &hp->q_lora_rank, err)) != KT_OK ||
        (st = read_u32(g, KEY("attention.kv_lora_rank"), true, 0, &hp->kv_lora_rank, err)) != KT_OK ||
        (st = check_dim(KEY("attention.kv_lora_rank"), hp->kv_lora_rank, err)) != KT_OK ||
        (st = read_u32(g, KEY("rope.dimension_count"), true, 0, &hp->qk_rope_dim, err)) != KT_OK ||
        (st = check_dim(KEY("rope.dimension_count"), hp->qk_rope_dim, err)) != KT_OK ||
        (st = read_f32(g, KEY("attention.layer_norm_rms_epsilon"), true, 0.0f, &hp->rms_eps, err)) != KT_OK)
        return st;
    /* MLA files store one KV head (split attn_k_b/attn_v_b) or, in older
     * fused files, head_count of them; kt needs neither, but any other count
     * says the file is not the model its tensors describe. */
    if (hp->n_head_kv != 1 && hp->n_head_kv != hp->n_head)
        return kt_err_set(err, KT_ERR_FORMAT,
                          "%s: %u, but an MLA model stores 1 (split attn_k_b/attn_v_b) or head_count %u (fused "
                          "attn_kv_b); fix the key",
                          KEY("attention.head_count_kv"), hp->n_head_kv, hp->n_head);
    if (hp->q_lora_rank && (st = check_dim(KEY("attention.q_lora_rank"), hp->q_lora_rank, err)) != KT_OK)
        return st;
    if (hp->qk_rope_dim % 2 != 0)
        return kt_err_set(err, KT_ERR_FORMAT, "%s: %u must be even (RoPE rotates pairs)", KEY("rope.dimension_count"),
                          hp->qk_rope_dim);
    if (!(hp->rms_eps > 0.0f))
        return kt_err_set(err, KT_ERR_FORMAT, "%s: %g must be positive", KEY("attention.layer_norm_rms_epsilon"),
                          (double)hp->rms_eps);

    /* Head dims: split MLA files carry them in *_mla keys (key_length and
     * value_length then describe the latent cache row); legacy files in
     * key_length/value_length, defaulting to E/H as in llama.cpp. */
    uint32_t k_mla = 0, v_mla = 0, k_len = 0, v_len = 0;
    bool has_k_mla = kt_gguf_find_kv(g, KEY("attention.key_length_mla")) != NULL;
    bool has_v_mla = kt_gguf_find_kv(g, KEY("attention.value_length_mla")) != NULL;
    if ((st = read_u32(g, KEY("attention.key_length_mla"), false, 0, &k_mla, err)) != KT_OK ||
        (st = read_u32(g, KEY("attention.value_length_mla"), false, 0, &v_mla, err)) != KT_OK ||
        (st = read_u32(g, KEY("attention.key_length"), false, hp->n_embd / hp->n_head, &k_len, err)) != KT_OK ||
        (st = read_u32(g, KEY("attention.value_length"), false, hp->n_embd / hp->n_head, &v_len, err)) != KT_OK)
        return st;
    if (has_k_mla != has_v_mla)
        return kt_err_set(err, KT_ERR_FORMAT, "%s: present without %s", has_k_mla ? KEY("attention.key_length_mla")
                          : KEY("attention.value_length_mla"), has_k_mla ? KEY("attention.value_length_mla")
                          : KEY("attention.key_length_mla"));
    hp->mla_split = has_k_mla && k_mla != 0 && v_mla != 0;
    const char *k_key = hp->mla_split ? KEY("attention.key_length_mla") : KEY("attention.key_length");
    const char *v_key = hp->mla_split ? KEY("attention.value_length_mla") : KEY("attention.value_length");
    uint32_t dk = hp->mla_split ? k_mla : k_len;
    uint32_t dv = hp->mla_split ? v_mla : v_len;
    if (dk <= hp->qk_rope_dim)
        return kt_err_set(err, KT_ERR_FORMAT, "%s: %u must exceed rope.dimension_count %u (it is nope + rope dims)",
                          k_key, dk, hp->qk_rope_dim);
    if ((st = check_dim(k_key, dk, err)) != KT_OK || (st = check_dim(v_key, dv, err)) != KT_OK)
        return st;
    hp->qk_nope_dim = dk - hp->qk_rope_dim;
    hp->v_head_dim = dv;
    if (hp->mla_split) {
        /* Split files describe the latent cache row here; check when present. */
        if (kt_gguf_find_kv(g, KEY("attention.key_length")) && k_len != hp->kv_lora_rank + hp->qk_rope_dim)
            return kt_err_set(err, KT_ERR_FORMAT, "%s: %u, expected kv_lora_rank + rope dims = %u in a split MLA file",
                              KEY("attention.key_length"), k_len, hp->kv_lora_rank + hp->qk_rope_dim);
        if (kt_gguf_find_kv(g, KEY("attention.value_length")) && v_len != hp->kv_lora_rank)
            return kt_err_set(err, KT_ERR_FORMAT, "%s: %u, expected kv_lora_rank = %u in a split MLA file",
                              KEY("attention.value_length"), v_len, hp->kv_lora_rank);
    }

    /* Dense FFN width: needed only when the file has dense layers. */
    bool dense = hp->n_dense_lead > 0;
    if ((st = read_u32_per_layer(g, KEY("feed_forward_length"), hp->n_layer, dense, 0, &hp->n_ff, err)) != KT_OK)
        return st;
    if (dense && (st = check_dim(KEY("feed_forward_length"), hp->n_ff, err)) != KT_OK)
        return st;

    if ((st = read_rope(g, hp, err)) != KT_OK || (st = read_moe(g, hp, err)) != KT_OK)
        return st;

    /* Vocabulary: vocab_size, else the tokenizer's token list. */
    if (kt_gguf_find_kv(g, KEY("vocab_size"))) {
        if ((st = kt_gguf_get_uint32(g, KEY("vocab_size"), &hp->n_vocab, err)) != KT_OK)
            return st;
    } else if (kt_gguf_find_kv(g, "tokenizer.ggml.tokens")) {
        const struct kt_gguf_array *a;
        if ((st = kt_gguf_get_array(g, "tokenizer.ggml.tokens", &a, err)) != KT_OK)
            return st;
        if (a->count > UINT32_MAX)
            return kt_err_set(err, KT_ERR_FORMAT, "tokenizer.ggml.tokens: %llu tokens is too many",
                              (unsigned long long)a->count);
        hp->n_vocab = (uint32_t)a->count;
    } else {
        return kt_err_set(err, KT_ERR_NOT_FOUND, "%s: missing, and no tokenizer.ggml.tokens to count instead",
                          KEY("vocab_size"));
    }
    return check_dim(KEY("vocab_size"), hp->n_vocab, err);
}

double kt_hparams_yarn_mscale(const struct kt_hparams *hp)
{
    /* HF/DeepSeek yarn_get_mscale(factor, mscale_all_dim); the file stores
     * 0.1 x mscale_all_dim in yarn_log_multiplier. */
    double s = hp->rope_scaling_factor;
    double mscale_all_dim = hp->yarn_log_multiplier / 0.1;
    if (hp->rope_scaling != KT_ROPE_SCALING_YARN || s <= 1.0 || mscale_all_dim == 0.0)
        return 1.0;
    return 1.0 + 0.1 * mscale_all_dim * log(s);
}

double kt_hparams_kq_scale(const struct kt_hparams *hp)
{
    double m = kt_hparams_yarn_mscale(hp);
    return m * m / sqrt((double)hp->qk_nope_dim + hp->qk_rope_dim);
}

/* ---- tensor table ---------------------------------------------------------------- */

enum tensor_kind {
    KIND_MATRIX, /* a weight: any type kt can dequantize */
    KIND_F32,    /* norms, router, selection bias: always f32 in GGUF files */
};

struct table_builder {
    const struct kt_gguf *g;
    struct kt_model *m;
    bool *used; /* [n_tensors] */
};

static size_t fmt_shape(char *buf, size_t size, uint32_t n, const int64_t *ne)
{
    size_t k = (size_t)snprintf(buf, size, "{");
    for (uint32_t i = 0; i < n && k < size; i++)
        k += (size_t)snprintf(buf + k, size - k, "%s%lld", i ? ", " : "", (long long)ne[i]);
    if (k < size)
        k += (size_t)snprintf(buf + k, size - k, "}");
    return k;
}

/*
 * Looks up "blk.IL.SUFFIX" (or SUFFIX when il < 0) and checks it.  Absent and
 * not required: *out = NULL.  why says, for a missing tensor, what makes it
 * required; legend names the expected dims.
 */
static kt_status take(struct table_builder *b, int il, const char *suffix, bool required, const char *why,
                      enum tensor_kind kind, enum kt_tensor_class cls, uint32_t n, const int64_t *want,
                      const char *legend, const struct kt_gguf_tensor **out, kt_err *err)
{
    char name[KT_GGUF_MAX_NAME + 16];
    if (il >= 0)
        snprintf(name, sizeof name, "blk.%d.%s", il, suffix);
    else
        snprintf(name, sizeof name, "%s", suffix);

    *out = NULL;
    const struct kt_gguf_tensor *t = kt_gguf_find_tensor(b->g, name);
    if (!t) {
        if (!required)
            return KT_OK;
        return kt_err_set(err, KT_ERR_NOT_FOUND, "%s: tensor is missing%s%s%s", name, why ? " (" : "",
                          why ? why : "", why ? ")" : "");
    }

    for (uint32_t i = 0; i < KT_GGUF_MAX_DIMS; i++) {
        int64_t expect = i < n ? want[i] : 1;
        if (t->ne[i] != expect) {
            char have_s[128], want_s[128];
            fmt_shape(have_s, sizeof have_s, t->n_dims, t->ne);
            fmt_shape(want_s, sizeof want_s, n, want);
            return kt_err_set(err, KT_ERR_FORMAT, "%s: shape %s expected %s (%s)", name, have_s, want_s, legend);
        }
    }

    const struct kt_type_traits *tr = kt_type_traits(t->type);
    if (kind == KIND_F32 && t->type != KT_TYPE_F32)
        return kt_err_set(err, KT_ERR_FORMAT, "%s: type %s, expected f32 (norms and router tensors are f32)", name,
                          kt_type_name(t->type));
    if (kind == KIND_MATRIX && (!tr || !tr->to_float))
        return kt_err_set(err, KT_ERR_UNSUPPORTED, "%s: type %s is not supported (kt cannot dequantize it)", name,
                          kt_type_name(t->type));

    size_t idx = (size_t)(t - b->g->tensors);
    if (!b->used[idx]) { /* a tied output is token_embd: count its bytes once */
        b->used[idx] = true;
        struct kt_model *m = b->m;
        m->class_bytes[cls] += t->nbytes;
        m->class_tensors[cls]++;
        if (t->type >= 0 && t->type < 64)
            m->class_types[cls] |= 1ull << t->type;
        int64_t elems = 1;
        for (uint32_t i = 0; i < KT_GGUF_MAX_DIMS; i++)
            elems *= t->ne[i];
        m->n_params += (uint64_t)elems;
        m->n_tensors_used++;
    }
    *out = t;
    return KT_OK;
}

#define DIMS(...) (const int64_t[]){__VA_ARGS__}

static kt_status take_attention(struct table_builder *b, int il, struct kt_layer *L, kt_err *err)
{
    const struct kt_hparams *hp = &b->m->hp;
    const int64_t E = hp->n_embd, H = hp->n_head, qr = hp->q_lora_rank, kvr = hp->kv_lora_rank;
    const int64_t dn = hp->qk_nope_dim, dr = hp->qk_rope_dim, dv = hp->v_head_dim;
    const enum kt_tensor_class C = KT_CLASS_ATTENTION;
    const char *split_why = "split MLA: attention.key_length_mla is set";
    const char *fused_why = "fused MLA: no attention.key_length_mla";
    kt_status st;

    if ((st = take(b, il, "attn_norm.weight", true, NULL, KIND_F32, C, 1, DIMS(E), "n_embd", &L->attn_norm, err)))
        return st;
    if (qr > 0) {
        const char *why = "attention.q_lora_rank > 0";
        if ((st = take(b, il, "attn_q_a.weight", true, why, KIND_MATRIX, C, 2, DIMS(E, qr), "n_embd, q_lora_rank",
                       &L->attn_q_a, err)) ||
            (st = take(b, il, "attn_q_a_norm.weight", true, why, KIND_F32, C, 1, DIMS(qr), "q_lora_rank",
                       &L->attn_q_a_norm, err)) ||
            (st = take(b, il, "attn_q_b.weight", true, why, KIND_MATRIX, C, 2, DIMS(qr, H * (dn + dr)),
                       "q_lora_rank, head_count*(dn+dr)", &L->attn_q_b, err)))
            return st;
    } else if ((st = take(b, il, "attn_q.weight", true, "no attention.q_lora_rank", KIND_MATRIX, C, 2,
                          DIMS(E, H * (dn + dr)), "n_embd, head_count*(dn+dr)", &L->attn_q, err))) {
        return st;
    }
    if ((st = take(b, il, "attn_kv_a_mqa.weight", true, NULL, KIND_MATRIX, C, 2, DIMS(E, kvr + dr),
                   "n_embd, kv_lora_rank+dr", &L->attn_kv_a_mqa, err)) ||
        (st = take(b, il, "attn_kv_a_norm.weight", true, NULL, KIND_F32, C, 1, DIMS(kvr), "kv_lora_rank",
                   &L->attn_kv_a_norm, err)))
        return st;
    if (hp->mla_split) {
        if ((st = take(b, il, "attn_k_b.weight", true, split_why, KIND_MATRIX, C, 3, DIMS(dn, kvr, H),
                       "dn, kv_lora_rank, head_count", &L->attn_k_b, err)) ||
            (st = take(b, il, "attn_v_b.weight", true, split_why, KIND_MATRIX, C, 3, DIMS(kvr, dv, H),
                       "kv_lora_rank, dv, head_count", &L->attn_v_b, err)))
            return st;
    } else if ((st = take(b, il, "attn_kv_b.weight", true, fused_why, KIND_MATRIX, C, 2, DIMS(kvr, H * (dn + dv)),
                          "kv_lora_rank, head_count*(dn+dv)", &L->attn_kv_b, err))) {
        return st;
    }
    return take(b, il, "attn_output.weight", true, NULL, KIND_MATRIX, C, 2, DIMS(H * dv, E), "head_count*dv, n_embd",
                &L->attn_output, err);
}

static kt_status take_ffn(struct table_builder *b, int il, struct kt_layer *L, kt_err *err)
{
    const struct kt_hparams *hp = &b->m->hp;
    const int64_t E = hp->n_embd, F = hp->n_ff, f = hp->n_ff_exp, Ne = hp->n_expert, Ns = hp->n_expert_shared;
    kt_status st;

    if ((st = take(b, il, "ffn_norm.weight", true, NULL, KIND_F32, KT_CLASS_DENSE_FFN, 1, DIMS(E), "n_embd",
                   &L->ffn_norm, err)))
        return st;

    L->is_moe = (uint32_t)il >= hp->n_dense_lead;
    if (!L->is_moe) {
        const enum kt_tensor_class C = KT_CLASS_DENSE_FFN;
        const char *why = "dense layer: below leading_dense_block_count";
        if ((st = take(b, il, "ffn_gate.weight", true, why, KIND_MATRIX, C, 2, DIMS(E, F), "n_embd, n_ff",
                       &L->ffn_gate, err)) ||
            (st = take(b, il, "ffn_up.weight", true, why, KIND_MATRIX, C, 2, DIMS(E, F), "n_embd, n_ff", &L->ffn_up,
                       err)))
            return st;
        return take(b, il, "ffn_down.weight", true, why, KIND_MATRIX, C, 2, DIMS(F, E), "n_ff, n_embd", &L->ffn_down,
                    err);
    }

    const char *why = "MoE layer";
    const enum kt_tensor_class R = KT_CLASS_ROUTED_EXPERTS;
    if ((st = take(b, il, "ffn_gate_inp.weight", true, why, KIND_F32, KT_CLASS_ROUTER, 2, DIMS(E, Ne),
                   "n_embd, n_expert", &L->ffn_gate_inp, err)) ||
        (st = take(b, il, "exp_probs_b.bias", false, NULL, KIND_F32, KT_CLASS_ROUTER, 1, DIMS(Ne), "n_expert",
                   &L->exp_probs_b, err)))
        return st;
    /* The fused gate+up slab is preferred when present, as in llama.cpp. */
    if ((st = take(b, il, "ffn_gate_up_exps.weight", false, NULL, KIND_MATRIX, R, 3, DIMS(E, 2 * f, Ne),
                   "n_embd, 2*n_ff_exp, n_expert", &L->ffn_gate_up_exps, err)))
        return st;
    if (!L->ffn_gate_up_exps) {
        const char *why_sep = "MoE layer without ffn_gate_up_exps";
        if ((st = take(b, il, "ffn_gate_exps.weight", true, why_sep, KIND_MATRIX, R, 3, DIMS(E, f, Ne),
                       "n_embd, n_ff_exp, n_expert", &L->ffn_gate_exps, err)) ||
            (st = take(b, il, "ffn_up_exps.weight", true, why_sep, KIND_MATRIX, R, 3, DIMS(E, f, Ne),
                       "n_embd, n_ff_exp, n_expert", &L->ffn_up_exps, err)))
            return st;
    }
    if ((st = take(b, il, "ffn_down_exps.weight", true, why, KIND_MATRIX, R, 3, DIMS(f, E, Ne),
                   "n_ff_exp, n_embd, n_expert", &L->ffn_down_exps, err)))
        return st;
    if (Ns == 0)
        return KT_OK;
    const enum kt_tensor_class S = KT_CLASS_SHARED_EXPERTS;
    const char *why_sh = "expert_shared_count > 0";
    if ((st = take(b, il, "ffn_gate_shexp.weight", true, why_sh, KIND_MATRIX, S, 2, DIMS(E, f * Ns),
                   "n_embd, n_ff_exp*n_expert_shared", &L->ffn_gate_shexp, err)) ||
        (st = take(b, il, "ffn_up_shexp.weight", true, why_sh, KIND_MATRIX, S, 2, DIMS(E, f * Ns),
                   "n_embd, n_ff_exp*n_expert_shared", &L->ffn_up_shexp, err)))
        return st;
    return take(b, il, "ffn_down_shexp.weight", true, why_sh, KIND_MATRIX, S, 2, DIMS(f * Ns, E),
                "n_ff_exp*n_expert_shared, n_embd", &L->ffn_down_shexp, err);
}

static kt_status build_table(struct table_builder *b, kt_err *err)
{
    struct kt_model *m = b->m;
    const int64_t E = m->hp.n_embd, V = m->hp.n_vocab;
    const enum kt_tensor_class C = KT_CLASS_EMBED_OUTPUT;
    kt_status st;

    if ((st = take(b, -1, "token_embd.weight", true, NULL, KIND_MATRIX, C, 2, DIMS(E, V), "n_embd, n_vocab",
                   &m->token_embd, err)) ||
        (st = take(b, -1, "output_norm.weight", true, NULL, KIND_F32, C, 1, DIMS(E), "n_embd", &m->output_norm,
                   err)) ||
        (st = take(b, -1, "output.weight", false, NULL, KIND_MATRIX, C, 2, DIMS(E, V), "n_embd, n_vocab", &m->output,
                   err)))
        return st;
    m->output_tied = m->output == NULL;
    if (m->output_tied)
        m->output = m->token_embd;

    for (uint32_t il = 0; il < m->hp.n_layer; il++) {
        if ((st = take_attention(b, (int)il, &m->layers[il], err)) || (st = take_ffn(b, (int)il, &m->layers[il], err)))
            return st;
    }
    return KT_OK;
}

/* ---- metadata against the file's other tensors ------------------------------------ */

/* Layers past block_count the file may hold: multi-token-prediction layers. */
#define KT_MODEL_MAX_MTP_LAYERS 16

/* N of a "blk.N.REST" tensor name and REST; false for other names. */
static bool block_number(const char *name, uint32_t *il, const char **rest)
{
    if (strncmp(name, "blk.", 4) != 0 || name[4] < '0' || name[4] > '9')
        return false;
    uint64_t n = 0;
    const char *p = name + 4;
    for (; *p >= '0' && *p <= '9'; p++)
        if ((n = n * 10 + (uint64_t)(*p - '0')) > UINT32_MAX)
            return false;
    if (*p != '.')
        return false;
    *il = (uint32_t)n;
    *rest = p + 1;
    return true;
}

static bool holds(const uint32_t *list, uint32_t n, uint32_t v)
{
    for (uint32_t i = 0; i < n; i++)
        if (list[i] == v)
            return true;
    return false;
}

/* Every blk.N tensor belongs to a layer block_count counts, except the
 * layers after the last that hold "nextn." tensors: multi-token prediction
 * (DeepSeek-V3's MTP), which kt does not run. */
static kt_status check_layer_count(const struct kt_gguf *g, uint32_t n_layer, kt_err *err)
{
    uint32_t mtp[KT_MODEL_MAX_MTP_LAYERS], n_mtp = 0, il, top = 0;
    const char *rest, *first = NULL;
    for (uint64_t i = 0; i < g->n_tensors && n_mtp < KT_MODEL_MAX_MTP_LAYERS; i++)
        if (block_number(g->tensors[i].name, &il, &rest) && il >= n_layer && !strncmp(rest, "nextn.", 6) &&
            !holds(mtp, n_mtp, il))
            mtp[n_mtp++] = il;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        if (!block_number(g->tensors[i].name, &il, &rest) || il < n_layer || holds(mtp, n_mtp, il))
            continue;
        first = first ? first : g->tensors[i].name;
        top = il > top ? il : top;
    }
    if (!first)
        return KT_OK;
    return kt_err_set(err, KT_ERR_FORMAT,
                      "%s: %u, but the file holds tensors of layers up to blk.%u (%s is the first): the key must "
                      "count every layer (only MTP layers, with nextn.* tensors, may follow the last); fix the key",
                      KEY("block_count"), n_layer, top, first);
}

/* Tensors of parts the metadata says the model lacks: a MoE layer's router or
 * experts in a layer leading_dense_block_count makes dense, shared experts
 * with expert_shared_count 0.  Left alone they would be ignored in silence
 * and the model would compute something else. */
static kt_status check_unclaimed_parts(const struct kt_gguf *g, const struct kt_hparams *hp, kt_err *err)
{
    static const char *const moe_parts[] = {"ffn_gate_inp.weight", "ffn_gate_exps.weight", "ffn_gate_up_exps.weight",
                                            "ffn_down_exps.weight"};
    static const char *const shared_parts[] = {"ffn_gate_shexp.weight", "ffn_up_shexp.weight", "ffn_down_shexp.weight"};
    char name[KT_GGUF_MAX_NAME + 16];
    for (uint32_t il = 0; il < hp->n_layer; il++) {
        const bool dense = il < hp->n_dense_lead;
        for (size_t i = 0; dense && i < sizeof moe_parts / sizeof moe_parts[0]; i++) {
            snprintf(name, sizeof name, "blk.%u.%s", il, moe_parts[i]);
            if (kt_gguf_find_tensor(g, name))
                return kt_err_set(err, KT_ERR_FORMAT,
                                  "%s: %u makes layer %u dense, but %s (a MoE layer's tensor) is in the file; fix "
                                  "the key",
                                  KEY("leading_dense_block_count"), hp->n_dense_lead, il, name);
        }
        for (size_t i = 0; !dense && hp->n_expert_shared == 0 && i < sizeof shared_parts / sizeof shared_parts[0];
             i++) {
            snprintf(name, sizeof name, "blk.%u.%s", il, shared_parts[i]);
            const struct kt_gguf_tensor *t = kt_gguf_find_tensor(g, name);
            if (!t)
                continue;
            const int64_t width = strstr(shared_parts[i], "down") ? t->ne[0] : t->ne[1];
            char hint[128] = "";
            if (hp->n_ff_exp && width > 0 && width % hp->n_ff_exp == 0)
                snprintf(hint, sizeof hint, ": its width %lld is %lld x expert_feed_forward_length %u",
                         (long long)width, (long long)(width / hp->n_ff_exp), hp->n_ff_exp);
            return kt_err_set(err, KT_ERR_FORMAT,
                              "%s: 0, but %s (shared experts) is in the file%s; set the key to the model's number "
                              "of shared experts",
                              KEY("expert_shared_count"), name, hint);
        }
    }
    return KT_OK;
}

/* The tokenizer's list fits the embedding, and every special token id the
 * tokenizer keys name (bos, eos, eot, padding, ...) is one of its tokens. */
static kt_status check_token_ids(const struct kt_gguf *g, uint32_t n_vocab, kt_err *err)
{
    const char *tokens_key = "tokenizer.ggml.tokens";
    const struct kt_gguf_kv *tokens = kt_gguf_find_kv(g, tokens_key);
    uint64_t n_tokens = n_vocab;
    if (tokens && tokens->value.type == KT_GGUF_ARRAY) {
        n_tokens = tokens->value.arr.count;
        if (n_tokens > n_vocab)
            return kt_err_set(err, KT_ERR_FORMAT,
                              "%s: %llu tokens, but token_embd.weight has rows for %u (vocab_size): ids %u and up "
                              "would have no embedding; the tokenizer belongs to another model",
                              tokens_key, (unsigned long long)n_tokens, n_vocab, n_vocab);
    }
    static const char prefix[] = "tokenizer.ggml.", suffix[] = "_token_id";
    for (uint64_t i = 0; i < g->n_kv; i++) {
        const char *key = g->kv[i].key;
        const size_t n = strlen(key);
        if (n <= strlen(prefix) + strlen(suffix) || strncmp(key, prefix, strlen(prefix)) ||
            strcmp(key + n - strlen(suffix), suffix))
            continue;
        int64_t id;
        kt_status st = kt_gguf_get_int(g, key, &id, err);
        if (st != KT_OK)
            return st;
        if (id < 0 || (uint64_t)id >= n_tokens)
            return kt_err_set(err, KT_ERR_FORMAT,
                              "%s: %lld is not a token: the vocabulary has %llu (ids 0 .. %llu, from %s); fix the "
                              "key",
                              key, (long long)id, (unsigned long long)n_tokens, (unsigned long long)n_tokens - 1,
                              tokens ? tokens_key : KEY("vocab_size"));
    }
    return KT_OK;
}

kt_status kt_model_from_gguf(struct kt_gguf *g, struct kt_model **out, kt_err *err)
{
    *out = NULL;
    struct kt_model *m = calloc(1, sizeof *m);
    bool *used = NULL;
    kt_status st = KT_ERR_NOMEM;
    if (!m)
        goto fail_nomem;
    if ((st = kt_hparams_read(g, &m->hp, err)) != KT_OK)
        goto fail;
    /* Each layer has at least 8 tensors; this bounds the allocation a
     * corrupt block_count could ask for. */
    if (m->hp.n_layer > g->n_tensors) {
        st = kt_err_set(err, KT_ERR_FORMAT, "%s: %u layers, but the file has only %llu tensors", KEY("block_count"),
                        m->hp.n_layer, (unsigned long long)g->n_tensors);
        goto fail;
    }
    if ((st = read_str(g, "general.architecture", m->arch, sizeof m->arch, err)) != KT_OK ||
        (st = read_str(g, "general.name", m->name, sizeof m->name, err)) != KT_OK)
        goto fail;

    m->layers = calloc(m->hp.n_layer, sizeof *m->layers);
    used = calloc(g->n_tensors ? g->n_tensors : 1, sizeof *used);
    if (!m->layers || !used) {
        st = KT_ERR_NOMEM;
        goto fail_nomem;
    }
    struct table_builder b = {.g = g, .m = m, .used = used};
    if ((st = build_table(&b, err)) != KT_OK || (st = check_layer_count(g, m->hp.n_layer, err)) != KT_OK ||
        (st = check_unclaimed_parts(g, &m->hp, err)) != KT_OK ||
        (st = check_token_ids(g, m->hp.n_vocab, err)) != KT_OK)
        goto fail;

    for (uint64_t i = 0; i < g->n_tensors; i++) {
        if (!used[i]) {
            m->n_tensors_extra++;
            m->extra_bytes += g->tensors[i].nbytes;
        }
    }
    free(used);
    m->gguf = g;
    *out = m;
    return KT_OK;

fail_nomem:
    kt_err_set(err, KT_ERR_NOMEM, "out of memory building the tensor table");
fail:
    free(used);
    if (m)
        free(m->layers);
    free(m);
    return st;
}

kt_status kt_model_open(const char *path, struct kt_model **out, kt_err *err)
{
    *out = NULL;
    struct stat sb;
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) { /* a Hugging Face checkpoint */
        struct kt_gguf *g;
        struct kt_hf_weights *hf;
        kt_status st = kt_hf_model_open(path, &g, &hf, err);
        if (st != KT_OK)
            return st;
        if ((st = kt_model_from_gguf(g, out, err)) != KT_OK) {
            kt_err_prefix(err, "%s", path);
            kt_gguf_close(g);
            return st;
        }
        (*out)->hf = hf;
        return KT_OK;
    }
    struct kt_gguf *g;
    kt_status st = kt_gguf_open(path, &g, err);
    if (st != KT_OK)
        return st;
    st = kt_model_from_gguf(g, out, err);
    if (st != KT_OK) {
        kt_err_prefix(err, "%s", path); /* like kt_gguf_open's, every message names the file */
        kt_gguf_close(g);
    }
    return st;
}

void kt_model_close(struct kt_model *m)
{
    if (!m)
        return;
    kt_gguf_close(m->gguf);
    free(m->layers);
    free(m);
}

kt_status kt_model_weights_ready(const struct kt_model *m, void (*progress)(void *ctx, uint64_t bytes), void *ctx,
                                 kt_err *err)
{
    return m->hf ? kt_hf_weights_ready(m->hf, progress, ctx, err) : KT_OK;
}

uint64_t kt_model_converted_bytes(const struct kt_model *m)
{
    uint64_t bytes = 0;
    for (uint64_t i = 0; i < m->gguf->n_tensors; i++)
        if (m->gguf->tensors[i].source == KT_TENSOR_DEFERRED)
            bytes += m->gguf->tensors[i].nbytes;
    return bytes;
}

bool kt_model_experts_streamed(const struct kt_model *m)
{
    return m->hf != NULL;
}

kt_status kt_model_read_expert(const struct kt_model *m, const struct kt_gguf_tensor *t, uint32_t x, void *dst,
                               kt_err *err)
{
    return kt_model_read_expert_rows(m, t, x, 0, t->ne[1], dst, err);
}

kt_status kt_model_read_expert_rows(const struct kt_model *m, const struct kt_gguf_tensor *t, uint32_t x,
                                    int64_t first, int64_t n, void *dst, kt_err *err)
{
    if (m->hf)
        return kt_hf_read_expert_rows(m->hf, t, x, first, n, dst, err);
    const size_t row = kt_type_row_bytes(t->type, t->ne[0]);
    if (!t->data || x >= (uint64_t)t->ne[2] || first < 0 || n < 0 || first > t->ne[1] - n)
        return kt_err_set(err, KT_ERR_INVALID, "%s: rows %lld + %lld of expert %u of %s are not in the file",
                          m->gguf->path, (long long)first, (long long)n, x, t->name);
    memcpy(dst, (const uint8_t *)t->data + ((size_t)x * (size_t)t->ne[1] + (size_t)first) * row, (size_t)n * row);
    return KT_OK;
}

void kt_model_expert_advise(const struct kt_model *m, const struct kt_gguf_tensor *t, uint32_t x,
                            enum kt_expert_advice advice)
{
    if (m->hf) {
        if (advice == KT_EXPERT_WILL_NEED)
            kt_hf_expert_will_need(m->hf, t, x);
        return;
    }
    if (!t || !t->data || t->ne[2] <= 0 || x >= (uint64_t)t->ne[2])
        return;
    const uint64_t slab = t->nbytes / (uint64_t)t->ne[2];
    const uintptr_t page = sysconf(_SC_PAGESIZE) > 0 ? (uintptr_t)sysconf(_SC_PAGESIZE) : 4096;
    const uintptr_t from = (uintptr_t)t->data + (uintptr_t)(slab * x), to = from + (uintptr_t)slab;
    if (advice == KT_EXPERT_WILL_NEED) { /* the pages it touches */
        const uintptr_t lo = from / page * page;
        madvise((void *)lo, to - lo, MADV_WILLNEED);
        return;
    }
    const uintptr_t lo = (from + page - 1) / page * page, hi = to / page * page; /* only pages wholly its own */
    if (hi > lo)
        madvise((void *)lo, hi - lo, MADV_DONTNEED);
}

/* ---- memory ------------------------------------------------------------------------ */

static uint64_t sat_mul(uint64_t a, uint64_t b)
{
    uint64_t r;
    return __builtin_mul_overflow(a, b, &r) ? UINT64_MAX : r;
}

uint64_t kt_layer_expert_bytes(const struct kt_model *m, uint32_t il)
{
    const struct kt_layer *L = &m->layers[il];
    if (!L->is_moe || m->hp.n_expert == 0)
        return 0;
    uint64_t slab = L->ffn_down_exps->nbytes;
    if (L->ffn_gate_up_exps)
        slab += L->ffn_gate_up_exps->nbytes;
    else
        slab += L->ffn_gate_exps->nbytes + L->ffn_up_exps->nbytes;
    return slab / m->hp.n_expert; /* exact: ne2 is the outermost dim, each expert a whole slab */
}

struct kt_memory_need kt_model_memory_need(const struct kt_model *m, int gpu_experts_per_layer, uint32_t ctx,
                                           uint32_t kv_bytes_per_value)
{
    struct kt_memory_need need = {0};
    const struct kt_hparams *hp = &m->hp;
    /* The latent row (c | k_pe) is what kt caches in both MLA forms: a fused
     * attn_kv_b is split into its k_b/v_b halves, never expanded per head. */
    need.kv_cache_bytes = sat_mul(sat_mul(sat_mul(hp->n_layer, ctx), (uint64_t)hp->kv_lora_rank + hp->qk_rope_dim),
                                  kv_bytes_per_value);

    uint64_t total = 0;
    for (int c = 0; c < KT_CLASS_COUNT; c++)
        total += m->class_bytes[c];

    if (gpu_experts_per_layer < 0) {
        need.cpu_bytes = total + need.kv_cache_bytes;
        return need;
    }
    uint64_t n_gpu = (uint64_t)gpu_experts_per_layer < hp->n_expert ? (uint64_t)gpu_experts_per_layer : hp->n_expert;
    uint64_t gpu = total - m->class_bytes[KT_CLASS_ROUTED_EXPERTS];
    for (uint32_t il = 0; il < hp->n_layer; il++)
        gpu += n_gpu * kt_layer_expert_bytes(m, il);
    need.gpu_bytes = gpu + need.kv_cache_bytes;
    need.cpu_bytes = total - gpu;
    if (need.gpu_bytes < gpu)
        need.gpu_bytes = UINT64_MAX;
    return need;
}

/* FNV-1a, 64-bit. */
static uint64_t fnv1a(uint64_t h, const void *data, size_t n)
{
    const unsigned char *p = data;
    for (size_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

void kt_model_identity(const struct kt_model *m, struct kt_model_identity *out)
{
    const struct kt_hparams *hp = &m->hp;
    memset(out, 0, sizeof *out);
    snprintf(out->name, sizeof out->name, "%s", m->name);
    snprintf(out->arch, sizeof out->arch, "%s", m->arch);
    out->n_layer = hp->n_layer;
    out->n_expert = hp->n_expert;
    out->n_expert_used = hp->n_expert_used;
    out->n_embd = hp->n_embd;
    out->n_ff_exp = hp->n_ff_exp;
    /* The shape-defining hyperparameters, then every tensor's name and
     * dimensions in table order; types are left out on purpose. */
    const uint32_t shape[] = {hp->n_layer,   hp->n_embd,        hp->n_ff,        hp->n_head,
                              hp->n_head_kv, hp->q_lora_rank,   hp->kv_lora_rank, hp->qk_nope_dim,
                              hp->qk_rope_dim, hp->v_head_dim,  hp->n_dense_lead, hp->n_expert,
                              hp->n_expert_used, hp->n_expert_shared, hp->n_ff_exp, hp->n_vocab};
    uint64_t h = fnv1a(14695981039346656037ull, m->arch, strlen(m->arch));
    h = fnv1a(h, shape, sizeof shape);
    for (uint64_t i = 0; i < m->gguf->n_tensors; i++) {
        const struct kt_gguf_tensor *t = &m->gguf->tensors[i];
        h = fnv1a(h, t->name, strlen(t->name) + 1);
        h = fnv1a(h, t->ne, sizeof t->ne);
    }
    out->fingerprint = h ? h : 1;
}
