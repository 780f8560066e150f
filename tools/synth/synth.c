/*
 * synth.c - kt-synth's presets and plan: which tensors a deepseek2 file of a
 * given family has, in which order, with which shapes and types.
 *
 * The layout is that of llama.cpp's converter for the split-MLA form
 * (docs/deepseek2.md, Hyperparameters); the quantizer's block-size fallback is
 * llama.cpp's (a K-quant on a row that is not a multiple of 256 becomes the
 * legacy type of similar size).  Nothing here touches the disk (write.c does)
 * or draws a weight (init.c does); nothing here prints.
 */
#include "synth.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "init.h"
#include "templates.h"
#include "route.h"
#include "quant.h"

/* ---- presets --------------------------------------------------------------------- */

/* Kimi-K2-Instruct (0711) routing, RoPE and context (the published config.json). */
static void kimi_semantics(struct kt_synth_config *c)
{
    c->family = KT_SYNTH_KIMI;
    c->n_expert_used = 8;
    c->n_expert_shared = 1;
    c->n_expert_groups = 1;
    c->n_group_used = 1;
    c->gating = 2;
    c->expert_weights_scale = 2.827f;
    c->expert_weights_norm = true;
    c->n_ctx_train = 131072;
    c->rope_freq_base = 50000.0f;
    c->rope_scaling_factor = 32.0f;
    c->rope_orig_ctx = 4096;
    c->yarn_log_multiplier = 0.1f;
    c->yarn_beta_fast = 1.0f;
    c->yarn_beta_slow = 1.0f;
    c->n_dense_max = 1;
}

/* DeepSeek-V3/R1 routing, RoPE and context (the published config.json). */
static void deepseek_v3_semantics(struct kt_synth_config *c)
{
    c->family = KT_SYNTH_DEEPSEEK;
    c->n_expert_used = 8;
    c->n_expert_shared = 1;
    c->n_expert_groups = 8;
    c->n_group_used = 4;
    c->gating = 2;
    c->expert_weights_scale = 2.5f;
    c->expert_weights_norm = true;
    c->n_ctx_train = 163840;
    c->rope_freq_base = 10000.0f;
    c->rope_scaling_factor = 40.0f;
    c->rope_orig_ctx = 4096;
    c->yarn_log_multiplier = 0.1f;
    c->yarn_beta_fast = 32.0f;
    c->yarn_beta_slow = 1.0f;
    c->n_dense_max = 3;
}

/* The real per-layer attention and FFN dimensions of V3 and Kimi-K2. */
static void real_dims(struct kt_synth_config *c)
{
    c->n_embd = 7168;
    c->n_ff = 18432;
    c->n_ff_exp = 2048;
    c->q_lora_rank = 1536;
    c->kv_lora_rank = 512;
    c->qk_nope_dim = 128;
    c->qk_rope_dim = 64;
    c->v_head_dim = 128;
    c->n_layer = 4;
    c->n_expert = 64;
}

/* The tiny presets: every dimension a multiple of 32 so every legacy type
 * fits, small enough to write in well under a second.  Hidden 512, dense FFN
 * 1024 (2x hidden), expert FFN 128 (a quarter of hidden, like Kimi's 2048 of
 * 7168), MLA ranks at Kimi's ratios to hidden. */
static void tiny_dims(struct kt_synth_config *c)
{
    c->n_embd = 512;
    c->n_ff = 1024;
    c->n_ff_exp = 128;
    c->n_head = 8;
    c->q_lora_rank = 192;
    c->kv_lora_rank = 128;
    c->qk_nope_dim = 32;
    c->qk_rope_dim = 16;
    c->v_head_dim = 32;
    c->n_layer = 4;
    c->n_expert = 32;
}

/* tiny-long: tiny's layout with the smallest attention that keeps every code path
 * (2 heads: the expanded form and the head groups still split across two
 * threads; rope 8: four rotated pairs), for long-context tests, whose cost
 * is the attention's per (query, key, head) pair: hidden 64, dense FFN 128,
 * expert FFN 32, q rank 32, kv rank 32, nope 8, rope 8, v 8.  Rows of 8
 * are no multiple of 32: a legacy type asked for attn_k_b falls back to F16. */
static void tiny_long_dims(struct kt_synth_config *c)
{
    c->n_embd = 64;
    c->n_ff = 128;
    c->n_ff_exp = 32;
    c->n_head = 2;
    c->q_lora_rank = 32;
    c->kv_lora_rank = 32;
    c->qk_nope_dim = 8;
    c->qk_rope_dim = 8;
    c->v_head_dim = 8;
    c->n_layer = 4;
    c->n_expert = 32;
}

static void set_types(struct kt_synth_config *c, int experts, int rest)
{
    for (int r = 0; r < KT_SYNTH_ROLE_COUNT; r++)
        c->types[r] = rest;
    c->types[KT_SYNTH_ROLE_EXPERTS] = experts;
}

kt_status kt_synth_preset(const char *name, struct kt_synth_config *cfg, kt_err *err)
{
    struct kt_synth_config c = {0};
    if (!name)
        return kt_err_set(err, KT_ERR_INVALID, "no preset given");
    if (strcmp(name, "tiny") == 0) {
        kimi_semantics(&c);
        tiny_dims(&c);
        set_types(&c, KT_TYPE_F32, KT_TYPE_F32);
        snprintf(c.name, sizeof c.name, "kt-synth tiny (Kimi-K2 layout)");
    } else if (strcmp(name, "tiny-long") == 0) {
        kimi_semantics(&c);
        tiny_long_dims(&c);
        set_types(&c, KT_TYPE_F32, KT_TYPE_F32);
        snprintf(c.name, sizeof c.name, "kt-synth tiny-long (Kimi-K2 layout, minimal attention)");
    } else if (strcmp(name, "tiny-v3") == 0) {
        deepseek_v3_semantics(&c);
        tiny_dims(&c);
        c.n_dense_max = 1;
        c.n_expert_groups = 4; /* V3's group-limited routing at tiny scale: 4 groups of 8 */
        c.n_group_used = 2;
        set_types(&c, KT_TYPE_F32, KT_TYPE_F32);
        snprintf(c.name, sizeof c.name, "kt-synth tiny-v3 (DeepSeek-V3 layout)");
    } else if (strcmp(name, "tiny-thinking") == 0) {
        kimi_semantics(&c);
        tiny_dims(&c);
        set_types(&c, KT_TYPE_F32, KT_TYPE_F32);
        c.chat_template = kt_synth_chat_template_revision(KT_SYNTH_CHAT_KIMI_K2_THINKING);
        snprintf(c.name, sizeof c.name, "kt-synth tiny-thinking (Kimi-K2-Thinking template)");
    } else if (strcmp(name, "tiny-r1") == 0) {
        deepseek_v3_semantics(&c);
        tiny_dims(&c);
        c.n_dense_max = 1;
        c.n_expert_groups = 4;
        c.n_group_used = 2;
        set_types(&c, KT_TYPE_F32, KT_TYPE_F32);
        c.chat_template = kt_synth_chat_template_revision(KT_SYNTH_CHAT_DEEPSEEK_R1);
        snprintf(c.name, sizeof c.name, "kt-synth tiny-r1 (DeepSeek-R1 template)");
    } else if (strcmp(name, "kimi-k2-slice") == 0) {
        kimi_semantics(&c);
        real_dims(&c);
        c.n_head = 64;
        set_types(&c, KT_TYPE_Q4_K, KT_TYPE_Q8_0);
        snprintf(c.name, sizeof c.name, "kt-synth kimi-k2-slice (Kimi-K2 layout)");
    } else if (strcmp(name, "deepseek-v3-slice") == 0) {
        deepseek_v3_semantics(&c);
        real_dims(&c);
        c.n_head = 128;
        set_types(&c, KT_TYPE_Q4_K, KT_TYPE_Q8_0);
        snprintf(c.name, sizeof c.name, "kt-synth deepseek-v3-slice (DeepSeek-V3 layout)");
    } else {
        return kt_err_set(err, KT_ERR_INVALID,
                          "unknown preset '%s' (presets: tiny, tiny-v3, tiny-thinking, tiny-r1, tiny-long, "
                          "kimi-k2-slice, deepseek-v3-slice)", name);
    }
    snprintf(c.preset, sizeof c.preset, "%s", name);
    c.rms_eps = 1e-6f;
    c.vocab_merges = KT_SYNTH_DEFAULT_MERGES;
    c.seed = 1;
    c.skew = strncmp(name, "tiny", 4) == 0 ? KT_SYNTH_TINY_SKEW : KT_SYNTH_SLICE_SKEW;
    c.n_threads = 0;
    *cfg = c;
    return KT_OK;
}

/* ---- types ----------------------------------------------------------------------- */

int kt_synth_parse_type(const char *name, kt_err *err)
{
    int t = name ? kt_type_from_name(name) : -1;
    const struct kt_type_traits *tr = t >= 0 ? kt_type_traits(t) : NULL;
    if (!tr) {
        kt_err_set(err, KT_ERR_INVALID,
                   "unknown type '%s' (try f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q4_k, q5_k, q6_k)",
                   name ? name : "(null)");
        return -1;
    }
    /* q8_1 and q8_K are activation formats: no model file stores them. */
    if (t == KT_TYPE_Q8_1 || t == KT_TYPE_Q8_K || (t != KT_TYPE_F32 && !tr->from_float)) {
        kt_err_set(err, KT_ERR_INVALID, "type '%s' cannot be written by kt-synth (no reference quantizer)", tr->name);
        return -1;
    }
    return t;
}

/* llama.cpp's quantizer fallback for a row length the type's block does not
 * divide (llama.cpp's converter does the same): K-quants become the legacy type of similar size, and
 * anything that still does not fit (a legacy 32-block on a row that is not a
 * multiple of 32) becomes F16, which fits every row. */
static int fallback_type(int t, int64_t ne0)
{
    const struct kt_type_traits *tr = kt_type_traits(t);
    if (ne0 % tr->block_elems == 0)
        return t;
    int f;
    switch (t) {
    case KT_TYPE_Q4_K: f = KT_TYPE_Q5_0; break;
    case KT_TYPE_Q5_K: f = KT_TYPE_Q5_1; break;
    case KT_TYPE_Q6_K: f = KT_TYPE_Q8_0; break;
    case KT_TYPE_Q2_K:
    case KT_TYPE_Q3_K: f = KT_TYPE_Q4_0; break;
    default: f = KT_TYPE_F16; break;
    }
    const struct kt_type_traits *ftr = kt_type_traits(f);
    if (ne0 % ftr->block_elems != 0 || (f != KT_TYPE_F16 && !ftr->from_float))
        f = KT_TYPE_F16;
    return f;
}

uint32_t kt_synth_file_type(int t)
{
    switch (t) {
    case KT_TYPE_F32: return 0;   /* ALL_F32 */
    case KT_TYPE_F16: return 1;   /* MOSTLY_F16 */
    case KT_TYPE_Q4_0: return 2;
    case KT_TYPE_Q4_1: return 3;
    case KT_TYPE_Q8_0: return 7;
    case KT_TYPE_Q5_0: return 8;
    case KT_TYPE_Q5_1: return 9;
    case KT_TYPE_Q2_K: return 10;
    case KT_TYPE_Q3_K: return 12; /* Q3_K_M */
    case KT_TYPE_Q4_K: return 15; /* Q4_K_M */
    case KT_TYPE_Q5_K: return 17; /* Q5_K_M */
    case KT_TYPE_Q6_K: return 18;
    case KT_TYPE_BF16: return 32;
    default: return 0;
    }
}

/* ---- validation ------------------------------------------------------------------ */

static kt_status check_config(const struct kt_synth_config *c, kt_err *err)
{
    struct { const char *what; uint32_t v; } dims[] = {
        {"layers", c->n_layer},           {"hidden size", c->n_embd},          {"dense FFN width", c->n_ff},
        {"expert FFN width", c->n_ff_exp}, {"heads", c->n_head},               {"q_lora_rank", c->q_lora_rank},
        {"kv_lora_rank", c->kv_lora_rank}, {"qk_nope_head_dim", c->qk_nope_dim}, {"qk_rope_head_dim", c->qk_rope_dim},
        {"v_head_dim", c->v_head_dim},    {"experts", c->n_expert},            {"experts per token", c->n_expert_used},
        {"expert groups", c->n_expert_groups}, {"groups used", c->n_group_used},
    };
    for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++)
        if (dims[i].v == 0)
            return kt_err_set(err, KT_ERR_INVALID, "%s must be at least 1", dims[i].what);
    if (c->n_layer > KT_SYNTH_MAX_LAYERS)
        return kt_err_set(err, KT_ERR_INVALID, "--layers %u: at most %d", c->n_layer, KT_SYNTH_MAX_LAYERS);
    if (c->n_expert > KT_SYNTH_MAX_EXPERTS)
        return kt_err_set(err, KT_ERR_INVALID, "--experts %u: at most %d", c->n_expert, KT_SYNTH_MAX_EXPERTS);
    if (c->n_expert_used > c->n_expert)
        return kt_err_set(err, KT_ERR_INVALID, "--experts %u is fewer than the %u experts used per token (top-k)",
                          c->n_expert, c->n_expert_used);
    if (c->n_expert % c->n_expert_groups != 0)
        return kt_err_set(err, KT_ERR_INVALID, "--experts %u is not divisible by the %u expert groups of %s",
                          c->n_expert, c->n_expert_groups, c->preset);
    if (c->n_group_used > c->n_expert_groups)
        return kt_err_set(err, KT_ERR_INVALID, "%u groups used of only %u", c->n_group_used, c->n_expert_groups);
    uint32_t per_group = c->n_expert / c->n_expert_groups;
    if (c->n_expert_groups > 1 && per_group < 2)
        return kt_err_set(err, KT_ERR_INVALID,
                          "--experts %u gives %u expert per group; group-limited routing scores a group by its "
                          "2 best experts, so it needs at least %u experts",
                          c->n_expert, per_group, 2 * c->n_expert_groups);
    if (c->n_expert_used > per_group * c->n_group_used)
        return kt_err_set(err, KT_ERR_INVALID,
                          "--experts %u: the %u groups used hold %u experts, fewer than the top-%u needs (at least %u)",
                          c->n_expert, c->n_group_used, per_group * c->n_group_used, c->n_expert_used,
                          (c->n_expert_used + c->n_group_used - 1) / c->n_group_used * c->n_expert_groups);
    if (c->gating != 1 && c->gating != 2)
        return kt_err_set(err, KT_ERR_INVALID, "gating function %u: 1 (softmax) or 2 (sigmoid)", c->gating);
    if (!(c->skew >= 0 && c->skew <= 16))
        return kt_err_set(err, KT_ERR_INVALID, "--skew %g: must be in [0, 16]", c->skew);
    if (!(c->skew_max <= 16))
        return kt_err_set(err, KT_ERR_INVALID, "--route-skew maximum %g: must be at most 16", c->skew_max);
    if (!(c->route_input >= 0 && c->route_input < 1))
        return kt_err_set(err, KT_ERR_INVALID, "--route-input %g: must be in [0, 1)", c->route_input);
    if (c->route_input > 0 && (c->kv_lora_rank < KT_SYNTH_CLASS_COUNT || c->v_head_dim < KT_SYNTH_CLASS_COUNT))
        return kt_err_set(err, KT_ERR_INVALID, "--route-input needs kv_lora_rank and v_head_dim of at least %d",
                          KT_SYNTH_CLASS_COUNT);
    if (c->n_threads > 1024)
        return kt_err_set(err, KT_ERR_INVALID, "--threads %u: at most 1024", c->n_threads);
    for (int r = 0; r < KT_SYNTH_ROLE_COUNT; r++) {
        const struct kt_type_traits *tr = kt_type_traits(c->types[r]);
        if (!tr || (c->types[r] != KT_TYPE_F32 && !tr->from_float) || c->types[r] == KT_TYPE_Q8_K ||
            c->types[r] == KT_TYPE_Q8_1)
            return kt_err_set(err, KT_ERR_INVALID, "type id %d cannot be written", c->types[r]);
    }
    return KT_OK;
}

/* ---- plan ------------------------------------------------------------------------ */

struct plan_builder {
    struct kt_synth_plan *plan;
    uint32_t cap;
    kt_err *err;
};

static void note_fallback(struct kt_synth_plan *p, const struct kt_synth_tensor *t)
{
    for (uint32_t i = 0; i < p->n_fallbacks; i++) {
        struct kt_synth_fallback *f = &p->fallbacks[i];
        if (f->requested == t->requested_type && f->used == t->type) {
            f->count++;
            return;
        }
    }
    if (p->n_fallbacks == KT_SYNTH_MAX_FALLBACKS)
        return; /* at most one per (requested, used) pair exists; the table has room for all of them */
    struct kt_synth_fallback *f = &p->fallbacks[p->n_fallbacks++];
    f->requested = t->requested_type;
    f->used = t->type;
    f->count = 1;
    snprintf(f->first_tensor, sizeof f->first_tensor, "%s", t->name);
}

/* Appends one tensor.  ne0 is the contiguous (input) dimension; std is the
 * std of its values (init.c). */
static kt_status add(struct plan_builder *b, int32_t layer, const char *suffix, enum kt_synth_role role,
                     enum kt_synth_init init, float std, uint32_t n_dims, int64_t ne0, int64_t ne1, int64_t ne2)
{
    struct kt_synth_plan *p = b->plan;
    if (p->n_tensors == b->cap) {
        uint32_t cap = b->cap ? 2 * b->cap : 64;
        struct kt_synth_tensor *t = realloc(p->tensors, cap * sizeof *t);
        if (!t)
            return kt_err_set(b->err, KT_ERR_NOMEM, "out of memory planning tensors");
        p->tensors = t;
        b->cap = cap;
    }
    struct kt_synth_tensor *t = &p->tensors[p->n_tensors];
    memset(t, 0, sizeof *t);
    if (layer >= 0)
        snprintf(t->name, sizeof t->name, "blk.%d.%s", (int)layer, suffix);
    else
        snprintf(t->name, sizeof t->name, "%s", suffix);
    t->n_dims = n_dims;
    t->ne[0] = ne0;
    t->ne[1] = n_dims > 1 ? ne1 : 1;
    t->ne[2] = n_dims > 2 ? ne2 : 1;
    t->ne[3] = 1;
    t->role = role;
    t->layer = layer;
    t->init = (int)init;
    t->init_std = std;
    t->requested_type = role == KT_SYNTH_ROLE_F32 ? KT_TYPE_F32 : p->cfg.types[role];
    t->type = fallback_type(t->requested_type, ne0);
    if (t->type != t->requested_type)
        note_fallback(p, t);
    uint64_t rows = (uint64_t)t->ne[1] * (uint64_t)t->ne[2];
    t->nbytes = (uint64_t)kt_type_row_bytes(t->type, ne0) * rows;
    if (t->nbytes == 0)
        return kt_err_set(b->err, KT_ERR_INVALID, "%s: cannot size %lld elements of %s", t->name, (long long)ne0,
                          kt_type_name(t->type));
    if (kt_type_traits(t->type)->is_quantized)
        p->quantized = true;
    p->data_bytes += t->nbytes;
    p->n_tensors++;
    return KT_OK;
}

/* Every tensor of the file, in the order of llama.cpp's converter: token_embd,
 * output_norm, output, then per block attention, then the dense FFN or the
 * router, the routed experts and the shared expert. */
static kt_status build_tensors(struct plan_builder *b)
{
    const struct kt_synth_config *c = &b->plan->cfg;
    const int64_t E = c->n_embd, V = b->plan->vocab.n_tokens, H = c->n_head;
    const int64_t qr = c->q_lora_rank, kvr = c->kv_lora_rank, dn = c->qk_nope_dim, dr = c->qk_rope_dim;
    const int64_t dv = c->v_head_dim, F = c->n_ff, f = c->n_ff_exp, Ne = c->n_expert;
    const int64_t fs = (int64_t)c->n_ff_exp * c->n_expert_shared;
    /* Output projections feed the residual stream: 1/sqrt(2 n_layer) more keeps
     * its growth over all layers bounded (GPT-2's residual scaling). */
    const double res = 1.0 / sqrt(2.0 * c->n_layer);
#define IN(fan_in) ((float)(1.0 / sqrt((double)(fan_in))))
#define OUT(fan_in) ((float)(res / sqrt((double)(fan_in))))
    kt_status s = KT_OK;
#define ADD(layer, name, role, init, std, nd, a, bb, cc)                                                            \
    do {                                                                                                           \
        if ((s = add(b, layer, name, role, init, std, nd, a, bb, cc)) != KT_OK)                                    \
            return s;                                                                                              \
    } while (0)

    /* With --route-input the embedding carries the token's class (route.h); without, plain noise. */
    const enum kt_synth_init embd_init = c->route_input > 0 ? KT_SYNTH_INIT_EMBED_CLASS : KT_SYNTH_INIT_UNIFORM;
    ADD(-1, "token_embd.weight", KT_SYNTH_ROLE_EMBD, embd_init, 1.0f, 2, E, V, 1);
    ADD(-1, "output_norm.weight", KT_SYNTH_ROLE_F32, KT_SYNTH_INIT_NORM, KT_SYNTH_NORM_NOISE_STD, 1, E, 1, 1);
    ADD(-1, "output.weight", KT_SYNTH_ROLE_OUTPUT, KT_SYNTH_INIT_UNIFORM, IN(E), 2, E, V, 1);
    for (int32_t l = 0; l < (int32_t)c->n_layer; l++) {
        const enum kt_synth_role A = KT_SYNTH_ROLE_ATTN, N = KT_SYNTH_ROLE_F32;
        ADD(l, "attn_norm.weight", N, KT_SYNTH_INIT_NORM, KT_SYNTH_NORM_NOISE_STD, 1, E, 1, 1);
        ADD(l, "attn_q_a.weight", A, KT_SYNTH_INIT_UNIFORM, IN(E), 2, E, qr, 1);
        ADD(l, "attn_q_a_norm.weight", N, KT_SYNTH_INIT_NORM, KT_SYNTH_NORM_NOISE_STD, 1, qr, 1, 1);
        ADD(l, "attn_q_b.weight", A, KT_SYNTH_INIT_UNIFORM, IN(qr), 2, qr, H * (dn + dr), 1);
        /* With --route-input attention carries the context's token classes (init.c, fill_attn_class). */
        const bool cls = c->route_input > 0;
        ADD(l, "attn_kv_a_mqa.weight", A, cls ? KT_SYNTH_INIT_KV_A_CLASS : KT_SYNTH_INIT_UNIFORM, IN(E), 2, E, kvr + dr, 1);
        ADD(l, "attn_kv_a_norm.weight", N, KT_SYNTH_INIT_NORM, KT_SYNTH_NORM_NOISE_STD, 1, kvr, 1, 1);
        /* k_b is kv_b_proj's key half transposed: its fan-in in the model is the
         * latent (kvr), although its rows are dn wide. */
        ADD(l, "attn_k_b.weight", A, KT_SYNTH_INIT_UNIFORM, IN(kvr), 3, dn, kvr, H);
        ADD(l, "attn_v_b.weight", A, cls ? KT_SYNTH_INIT_V_B_CLASS : KT_SYNTH_INIT_UNIFORM, IN(kvr), 3, kvr, dv, H);
        ADD(l, "attn_output.weight", A, cls ? KT_SYNTH_INIT_OUT_CLASS : KT_SYNTH_INIT_UNIFORM, OUT(H * dv), 2, H * dv, E,
            1);
        ADD(l, "ffn_norm.weight", N, KT_SYNTH_INIT_NORM, KT_SYNTH_NORM_NOISE_STD, 1, E, 1, 1);
        if ((uint32_t)l < b->plan->n_dense_lead) {
            const enum kt_synth_role D = KT_SYNTH_ROLE_FFN;
            ADD(l, "ffn_gate.weight", D, KT_SYNTH_INIT_UNIFORM, IN(E), 2, E, F, 1);
            ADD(l, "ffn_up.weight", D, KT_SYNTH_INIT_UNIFORM, IN(E), 2, E, F, 1);
            ADD(l, "ffn_down.weight", D, KT_SYNTH_INIT_UNIFORM, OUT(F), 2, F, E, 1);
            continue;
        }
        const enum kt_synth_role X = KT_SYNTH_ROLE_EXPERTS, S = KT_SYNTH_ROLE_SHARED;
        ADD(l, "ffn_gate_inp.weight", N, c->route_input > 0 ? KT_SYNTH_INIT_ROUTER_CLASS : KT_SYNTH_INIT_UNIFORM, IN(E), 2,
            E, Ne, 1);
        ADD(l, "exp_probs_b.bias", N, KT_SYNTH_INIT_ROUTER_BIAS, KT_SYNTH_BIAS_NOISE_STD, 1, Ne, 1, 1);
        ADD(l, "ffn_gate_exps.weight", X, KT_SYNTH_INIT_UNIFORM, IN(E), 3, E, f, Ne);
        ADD(l, "ffn_up_exps.weight", X, KT_SYNTH_INIT_UNIFORM, IN(E), 3, E, f, Ne);
        ADD(l, "ffn_down_exps.weight", X, KT_SYNTH_INIT_UNIFORM, OUT(f), 3, f, E, Ne);
        if (fs > 0) {
            ADD(l, "ffn_gate_shexp.weight", S, KT_SYNTH_INIT_UNIFORM, IN(E), 2, E, fs, 1);
            ADD(l, "ffn_up_shexp.weight", S, KT_SYNTH_INIT_UNIFORM, IN(E), 2, E, fs, 1);
            ADD(l, "ffn_down_shexp.weight", S, KT_SYNTH_INIT_UNIFORM, OUT(fs), 2, fs, E, 1);
        }
    }
#undef ADD
#undef IN
#undef OUT
    return s;
}

kt_status kt_synth_plan_create(const struct kt_synth_config *cfg, struct kt_synth_plan **out, kt_err *err)
{
    if (!cfg || !out)
        return kt_err_set(err, KT_ERR_INVALID, "kt_synth_plan_create: NULL argument");
    *out = NULL;
    kt_status s = check_config(cfg, err);
    if (s != KT_OK)
        return s;
    struct kt_synth_plan *p = calloc(1, sizeof *p);
    if (!p)
        return kt_err_set(err, KT_ERR_NOMEM, "out of memory planning %s", cfg->preset);
    p->cfg = *cfg;
    p->n_dense_lead = cfg->n_dense_max < cfg->n_layer - 1 ? cfg->n_dense_max : cfg->n_layer - 1;
    p->file_type = kt_synth_file_type(cfg->types[KT_SYNTH_ROLE_EXPERTS]);
    s = kt_synth_vocab_build(cfg->family, cfg->vocab_merges, &p->vocab, err);
    if (s != KT_OK) {
        kt_err_prefix(err, "building the %s vocabulary", cfg->preset);
        free(p);
        return s;
    }
    if (cfg->chat_template)
        p->vocab.chat_template = cfg->chat_template;
    p->layer_skew = malloc(cfg->n_layer * sizeof *p->layer_skew);
    p->skew_bias = malloc((size_t)cfg->n_layer * cfg->n_expert * sizeof *p->skew_bias);
    if (!p->layer_skew || !p->skew_bias) {
        kt_synth_plan_destroy(p);
        return kt_err_set(err, KT_ERR_NOMEM, "out of memory planning %s", cfg->preset);
    }
    kt_synth_layer_skews(p);
    if (cfg->route_input > 0) {
        p->token_class = malloc(p->vocab.n_tokens);
        p->class_dir = malloc((size_t)KT_SYNTH_CLASS_COUNT * cfg->n_embd * sizeof *p->class_dir);
        if (!p->token_class || !p->class_dir) {
            kt_synth_plan_destroy(p);
            return kt_err_set(err, KT_ERR_NOMEM, "out of memory planning %s", cfg->preset);
        }
        for (uint32_t t = 0; t < p->vocab.n_tokens; t++)
            p->token_class[t] = (uint8_t)kt_synth_token_class(p->vocab.tokens[t], p->vocab.token_types[t]);
        kt_synth_class_directions(p);
    }
    s = kt_synth_fit_skew(p, err);
    if (s != KT_OK) {
        kt_synth_plan_destroy(p);
        return s;
    }
    struct plan_builder b = {.plan = p, .err = err};
    s = build_tensors(&b);
    if (s != KT_OK) {
        kt_synth_plan_destroy(p);
        return s;
    }
    *out = p;
    return KT_OK;
}

void kt_synth_plan_destroy(struct kt_synth_plan *plan)
{
    if (!plan)
        return;
    kt_synth_vocab_free(&plan->vocab);
    free(plan->tensors);
    free(plan->skew_bias);
    free(plan->layer_skew);
    free(plan->token_class);
    free(plan->class_dir);
    free(plan);
}

kt_status kt_synth_expert_ranks(const struct kt_synth_plan *plan, uint32_t layer, uint32_t *rank_of_expert,
                                kt_err *err)
{
    if (!plan || !rank_of_expert || layer >= plan->cfg.n_layer || layer < plan->n_dense_lead)
        return kt_err_set(err, KT_ERR_INVALID, "layer %u is not a MoE layer of this plan", layer);
    kt_synth_rank_experts(plan->cfg.seed, layer, plan->cfg.n_expert, rank_of_expert);
    return KT_OK;
}
