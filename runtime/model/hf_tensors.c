/*
 * hf_tensors.c - a checkpoint's tensors against its deepseek2 model (see
 * hf_tensors.h).  Names as DeepSeek-V3's modeling code and Kimi-K2's (the same
 * module tree) give them:
 *   model.embed_tokens.weight (V, E); model.norm.weight (E); lm_head.weight (V, E)
 *   model.layers.L.input_layernorm.weight, .post_attention_layernorm.weight (E)
 *   model.layers.L.self_attn.q_a_proj (qr, E), .q_a_layernorm (qr), .q_b_proj (H*(dn+dr), qr)
 *     or .q_proj (H*(dn+dr), E) without q_lora_rank;
 *     .kv_a_proj_with_mqa (kvr+dr, E), .kv_a_layernorm (kvr), .kv_b_proj (H*(dn+dv), kvr),
 *     .o_proj (E, H*dv)
 *   dense layers: model.layers.L.mlp.{gate,up}_proj (F, E), .down_proj (E, F)
 *   MoE layers: model.layers.L.mlp.gate.weight (Ne, E), .gate.e_score_correction_bias (Ne),
 *     .experts.X.{gate,up}_proj (f, E), .down_proj (E, f),
 *     .shared_experts.{gate,up}_proj (f*Ns, E), .down_proj (E, f*Ns)
 * (shapes outermost first, as safetensors stores them: a linear is (out, in)).
 */
#include "hf_tensors.h"

#include "gguf.h"
#include "safetensors.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#define NAME_BYTES 160

static uint64_t ceil_div(uint64_t a, uint64_t b)
{
    return a / b + (a % b != 0);
}

static bool is_float(enum kt_st_dtype t)
{
    return t == KT_ST_BF16 || t == KT_ST_F16 || t == KT_ST_F32;
}

static bool shape_is(const struct kt_st_tensor *t, uint64_t a, uint64_t b)
{
    return t->rank == 2 && t->shape[0] == a && t->shape[1] == b;
}

static kt_status wrong(const struct kt_st_tensor *t, const char *expected, uint64_t a, uint64_t b, kt_err *err)
{
    char shape[96] = "";
    for (uint32_t i = 0, n = 0; i < t->rank && n < sizeof shape; i++)
        n += (uint32_t)snprintf(shape + n, sizeof shape - n, "%s%" PRIu64, i ? ", " : "", t->shape[i]);
    return kt_err_set(err, KT_ERR_FORMAT, "%s: expected %s (%" PRIu64 ", %" PRIu64 "), found %s (%s)", t->name,
                      expected, a, b, kt_st_dtype_name(t->dtype), shape);
}

static const char *format_name(enum kt_hf_weight_format f)
{
    switch (f) {
    case KT_HF_WEIGHTS_PLAIN: return "unquantized";
    case KT_HF_WEIGHTS_FP8_BLOCK: return "block FP8";
    case KT_HF_WEIGHTS_INT4_GROUP: return "compressed-tensors INT4";
    case KT_HF_WEIGHTS_MXFP4: return "MXFP4";
    }
    return "?";
}

static kt_status find_int4(const struct kt_st_dir *dir, const struct kt_hf_quant *q, const char *module,
                           const struct kt_st_tensor *packed, uint64_t out, uint64_t in, struct kt_hf_linear *lin,
                           kt_err *err)
{
    char name[NAME_BYTES];
    if (q->format != KT_HF_WEIGHTS_INT4_GROUP)
        return kt_err_set(err, KT_ERR_FORMAT, "%s: INT4 pack-quantized parts in a checkpoint whose "
                          "quantization_config says %s", packed->name, format_name(q->format));
    snprintf(name, sizeof name, "%s.weight", module);
    if (kt_st_find(dir, name))
        return kt_err_set(err, KT_ERR_FORMAT, "%s: both weight and weight_packed: which one is the module?", module);
    if (packed->dtype != KT_ST_I32 || !shape_is(packed, out, ceil_div(in, 8)))
        return wrong(packed, "I32", out, ceil_div(in, 8), err);
    snprintf(name, sizeof name, "%s.weight_scale", module);
    const struct kt_st_tensor *scale = kt_st_find(dir, name);
    if (!scale)
        return kt_err_set(err, KT_ERR_NOT_FOUND, "%s: missing (%s has weight_packed)", name, module);
    if (scale->dtype != KT_ST_BF16 || !shape_is(scale, out, ceil_div(in, q->group_size)))
        return wrong(scale, "BF16", out, ceil_div(in, q->group_size), err);
    snprintf(name, sizeof name, "%s.weight_shape", module);
    const struct kt_st_tensor *shape = kt_st_find(dir, name);
    if (shape) { /* optional; when there, it must say what the packing says */
        int64_t v[2] = {0, 0};
        if (shape->rank == 1 && shape->shape[0] == 2 && (shape->dtype == KT_ST_I64 || shape->dtype == KT_ST_I32)) {
            for (int i = 0; i < 2; i++) {
                if (shape->dtype == KT_ST_I64) {
                    memcpy(&v[i], (const uint8_t *)shape->data + 8 * i, 8);
                } else {
                    int32_t w;
                    memcpy(&w, (const uint8_t *)shape->data + 4 * i, 4);
                    v[i] = w;
                }
            }
        }
        if (v[0] < 0 || v[1] < 0 || (uint64_t)v[0] != out || (uint64_t)v[1] != in)
            return kt_err_set(err, KT_ERR_FORMAT, "%s: expected the two integers %" PRIu64 ", %" PRIu64
                              " (out, in), found %s of %" PRIu64 " values (%" PRId64 ", %" PRId64 ")", name, out,
                              in, kt_st_dtype_name(shape->dtype), shape->numel, v[0], v[1]);
    }
    *lin = (struct kt_hf_linear){KT_HF_STORED_INT4, out, in, packed, scale};
    return KT_OK;
}

kt_status kt_hf_find_linear(const struct kt_st_dir *dir, const struct kt_hf_quant *q, const char *module, uint64_t out,
                            uint64_t in, struct kt_hf_linear *lin, kt_err *err)
{
    char name[NAME_BYTES];
    if ((size_t)snprintf(name, sizeof name, "%s.weight_packed", module) >= sizeof name)
        return kt_err_set(err, KT_ERR_INVALID, "%s: module name too long", module);
    const struct kt_st_tensor *packed = kt_st_find(dir, name);
    if (packed)
        return find_int4(dir, q, module, packed, out, in, lin, err);
    snprintf(name, sizeof name, "%s.weight", module);
    const struct kt_st_tensor *w = kt_st_find(dir, name);
    if (!w)
        return kt_err_set(err, KT_ERR_NOT_FOUND, "%s: missing (nor %s.weight_packed)", name, module);
    if (is_float(w->dtype)) {
        if (!shape_is(w, out, in))
            return wrong(w, "a (out, in) matrix", out, in, err);
        *lin = (struct kt_hf_linear){KT_HF_STORED_PLAIN, out, in, w, NULL};
        return KT_OK;
    }
    if (w->dtype != KT_ST_F8_E4M3)
        return wrong(w, "BF16, F16, F32 or F8_E4M3", out, in, err);
    if (q->format != KT_HF_WEIGHTS_FP8_BLOCK)
        return kt_err_set(err, KT_ERR_FORMAT, "%s: F8_E4M3 in a checkpoint whose quantization_config says %s", name,
                          format_name(q->format));
    if (!shape_is(w, out, in))
        return wrong(w, "F8_E4M3", out, in, err);
    snprintf(name, sizeof name, "%s.weight_scale_inv", module);
    const struct kt_st_tensor *s = kt_st_find(dir, name);
    if (!s)
        return kt_err_set(err, KT_ERR_NOT_FOUND, "%s: missing (%s.weight is F8_E4M3)", name, module);
    const uint64_t rows = ceil_div(out, q->block_rows), cols = ceil_div(in, q->block_cols);
    if (s->dtype != KT_ST_F32 || !shape_is(s, rows, cols))
        return wrong(s, "F32 block scales", rows, cols, err);
    *lin = (struct kt_hf_linear){KT_HF_STORED_FP8, out, in, w, s};
    return KT_OK;
}

/* ---- the whole model ------------------------------------------------------------------------ */

struct walk {
    const struct kt_st_dir *dir;
    const struct kt_hf_quant *q;
    struct kt_hf_inventory *inv;
    kt_err *err;
};

static kt_status linear(struct walk *w, enum kt_tensor_class c, const char *module, uint64_t out, uint64_t in)
{
    struct kt_hf_linear lin;
    kt_status st = kt_hf_find_linear(w->dir, w->q, module, out, in, &lin, w->err);
    if (st != KT_OK)
        return st;
    w->inv->class_bytes[c] += lin.weight->bytes + (lin.scale ? lin.scale->bytes : 0);
    w->inv->class_linears[c]++;
    w->inv->stored_linears[lin.stored]++;
    w->inv->n_used += 1 + (lin.scale != NULL);
    if (lin.stored == KT_HF_STORED_INT4) {
        char name[NAME_BYTES];
        snprintf(name, sizeof name, "%s.weight_shape", module);
        const struct kt_st_tensor *shape = kt_st_find(w->dir, name);
        if (shape)
            w->inv->class_bytes[c] += shape->bytes, w->inv->n_used++;
    }
    return KT_OK;
}

/* A vector (norm weight, selection bias) of n floats; absent and optional: KT_OK. */
static kt_status vector(struct walk *w, enum kt_tensor_class c, const char *name, uint64_t n, bool required)
{
    const struct kt_st_tensor *t = kt_st_find(w->dir, name);
    if (!t)
        return required ? kt_err_set(w->err, KT_ERR_NOT_FOUND, "%s: missing", name) : KT_OK;
    if (!is_float(t->dtype) || t->rank != 1 || t->shape[0] != n)
        return kt_err_set(w->err, KT_ERR_FORMAT, "%s: expected BF16, F16 or F32 of %" PRIu64 " values, found %s of "
                          "rank %u (%" PRIu64 " values)", name, n, kt_st_dtype_name(t->dtype), t->rank, t->numel);
    w->inv->class_bytes[c] += t->bytes;
    w->inv->n_used++;
    return KT_OK;
}

static kt_status layer(struct walk *w, const struct kt_hparams *hp, uint32_t il)
{
    const uint64_t E = hp->n_embd, H = hp->n_head, qr = hp->q_lora_rank, kvr = hp->kv_lora_rank;
    const uint64_t dn = hp->qk_nope_dim, dr = hp->qk_rope_dim, dv = hp->v_head_dim;
    char p[96], n[NAME_BYTES];
    snprintf(p, sizeof p, "model.layers.%u", il);
    const enum kt_tensor_class A = KT_CLASS_ATTENTION;
    kt_status st = KT_OK;
#define NAME(fmt, ...) (snprintf(n, sizeof n, "%s." fmt, p, __VA_ARGS__), n)
    if ((st = vector(w, A, NAME("%s", "input_layernorm.weight"), E, true)))
        return st;
    if (qr > 0) {
        if ((st = linear(w, A, NAME("%s", "self_attn.q_a_proj"), qr, E)) ||
            (st = vector(w, A, NAME("%s", "self_attn.q_a_layernorm.weight"), qr, true)) ||
            (st = linear(w, A, NAME("%s", "self_attn.q_b_proj"), H * (dn + dr), qr)))
            return st;
    } else if ((st = linear(w, A, NAME("%s", "self_attn.q_proj"), H * (dn + dr), E))) {
        return st;
    }
    if ((st = linear(w, A, NAME("%s", "self_attn.kv_a_proj_with_mqa"), kvr + dr, E)) ||
        (st = vector(w, A, NAME("%s", "self_attn.kv_a_layernorm.weight"), kvr, true)) ||
        (st = linear(w, A, NAME("%s", "self_attn.kv_b_proj"), H * (dn + dv), kvr)) ||
        (st = linear(w, A, NAME("%s", "self_attn.o_proj"), E, H * dv)))
        return st;
    const bool dense = il < hp->n_dense_lead;
    if ((st = vector(w, KT_CLASS_DENSE_FFN, NAME("%s", "post_attention_layernorm.weight"), E, true)))
        return st;
    if (dense) {
        const uint64_t F = hp->n_ff;
        if ((st = linear(w, KT_CLASS_DENSE_FFN, NAME("%s", "mlp.gate_proj"), F, E)) ||
            (st = linear(w, KT_CLASS_DENSE_FFN, NAME("%s", "mlp.up_proj"), F, E)) ||
            (st = linear(w, KT_CLASS_DENSE_FFN, NAME("%s", "mlp.down_proj"), E, F)))
            return st;
        return KT_OK;
    }
    const uint64_t f = hp->n_ff_exp, Ne = hp->n_expert, Fs = f * hp->n_expert_shared;
    /* the router stays unquantized in every checkpoint kt reads */
    struct kt_hf_quant plain = {.format = KT_HF_WEIGHTS_PLAIN};
    struct kt_hf_linear gate;
    if ((st = kt_hf_find_linear(w->dir, &plain, NAME("%s", "mlp.gate"), Ne, E, &gate, w->err)))
        return st;
    w->inv->class_bytes[KT_CLASS_ROUTER] += gate.weight->bytes, w->inv->n_used++;
    if ((st = vector(w, KT_CLASS_ROUTER, NAME("%s", "mlp.gate.e_score_correction_bias"), Ne, false)))
        return st;
    for (uint32_t x = 0; x < Ne; x++) {
        static const char *const parts[3] = {"gate_proj", "up_proj", "down_proj"};
        for (int i = 0; i < 3; i++)
            if ((st = linear(w, KT_CLASS_ROUTED_EXPERTS, NAME("mlp.experts.%u.%s", x, parts[i]), i == 2 ? E : f,
                             i == 2 ? f : E)))
                return st;
    }
    if (Fs > 0 && ((st = linear(w, KT_CLASS_SHARED_EXPERTS, NAME("%s", "mlp.shared_experts.gate_proj"), Fs, E)) ||
                   (st = linear(w, KT_CLASS_SHARED_EXPERTS, NAME("%s", "mlp.shared_experts.up_proj"), Fs, E)) ||
                   (st = linear(w, KT_CLASS_SHARED_EXPERTS, NAME("%s", "mlp.shared_experts.down_proj"), E, Fs))))
        return st;
#undef NAME
    return KT_OK;
}

kt_status kt_hf_inventory(const struct kt_st_dir *dir, const struct kt_hparams *hp, const struct kt_hf_quant *q,
                          struct kt_hf_inventory *inv, kt_err *err)
{
    memset(inv, 0, sizeof *inv);
    if (q->format == KT_HF_WEIGHTS_MXFP4)
        return kt_err_set(err, KT_ERR_UNSUPPORTED, "MXFP4 checkpoints of deepseek2 models have no tensor naming kt "
                          "has confirmed yet (gpt-oss's fused expert tensors are another model)");
    struct walk w = {dir, q, inv, err};
    struct kt_hf_quant plain = {.format = KT_HF_WEIGHTS_PLAIN};
    kt_status st;
    struct kt_hf_linear embd;
    if ((st = kt_hf_find_linear(dir, &plain, "model.embed_tokens", hp->n_vocab, hp->n_embd, &embd, err)))
        return st;
    inv->class_bytes[KT_CLASS_EMBED_OUTPUT] += embd.weight->bytes, inv->n_used++;
    if ((st = vector(&w, KT_CLASS_EMBED_OUTPUT, "model.norm.weight", hp->n_embd, true)) ||
        (st = linear(&w, KT_CLASS_EMBED_OUTPUT, "lm_head", hp->n_vocab, hp->n_embd)))
        return st;
    for (uint32_t il = 0; il < hp->n_layer; il++)
        if ((st = layer(&w, hp, il)))
            return st;
    uint64_t all = 0, used = 0;
    for (uint64_t i = 0; i < dir->n_tensors; i++)
        all += dir->tensors[i].bytes;
    for (int c = 0; c < KT_CLASS_COUNT; c++)
        used += inv->class_bytes[c];
    inv->n_unused = dir->n_tensors - inv->n_used;
    inv->unused_bytes = all - used;
    return KT_OK;
}

/* ---- what a directory is, for a tool given one ---------------------------------------------- */

kt_status kt_hf_describe(const char *dir, char *out, size_t out_size, kt_err *err)
{
    struct kt_gguf *meta = NULL;
    struct kt_st_dir *d = NULL;
    struct kt_hf_quant q;
    struct kt_hparams hp;
    struct kt_hf_inventory inv;
    kt_status st = kt_hf_config_read(dir, &meta, &q, err);
    if (st == KT_OK)
        st = kt_hparams_read(meta, &hp, err);
    if (st == KT_OK)
        st = kt_st_open_dir(dir, &d, err);
    if (st == KT_OK)
        st = kt_hf_inventory(d, &hp, &q, &inv, err);
    if (st == KT_OK) {
        struct kt_gguf_str name = {0};
        kt_err e2 = {0};
        kt_gguf_get_str(meta, "general.name", &name, &e2);
        uint64_t bytes = 0;
        for (int c = 0; c < KT_CLASS_COUNT; c++)
            bytes += inv.class_bytes[c];
        static const char *const formats[] = {"unquantized", "block FP8", "compressed-tensors INT4", "MXFP4"};
        snprintf(out, out_size, "%.*s: %u layers, %u experts (%u used), %s, %.2f GiB in %u shard%s (routed experts "
                 "%.2f GiB)", (int)(name.len < 96 ? name.len : 96), name.ptr, hp.n_layer, hp.n_expert,
                 hp.n_expert_used, formats[q.format], (double)bytes / (1u << 30), d->n_shards,
                 d->n_shards == 1 ? "" : "s", (double)inv.class_bytes[KT_CLASS_ROUTED_EXPERTS] / (1u << 30));
    }
    kt_st_close(d);
    kt_gguf_close(meta);
    return st;
}
