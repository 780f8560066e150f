/*
 * test_model.c - proves that kt_model reads deepseek2 hyperparameters from the
 * exact keys real files carry, accepts every tensor layout of the family
 * (split and fused MLA, q-LoRA or plain attn_q, separate or fused expert
 * slabs, tied output, per-layer array keys), rejects each single defect with
 * the right status and a message naming the tensor or key, refuses metadata
 * the rest of the file contradicts (layers past block_count, shared experts
 * the keys deny, special token ids past the vocabulary) naming both sides and
 * out-of-range hyperparameters (KV heads, RoPE factors), computes memory
 * needs to the byte, and that kt-run --info reports all of it.
 *
 * Every model here is written by the test with the kt_gguf writer from a
 * description (lists of keys and tensors) that a case breaks one item at a
 * time.  It must never depend on files it did not write (kt-synth's presets
 * are checked only when that tool is built).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gguf.h"
#include "model.h"
#include "quant.h"
#include "testlib.h"

/* ---- a model described as lists of keys and tensors ------------------------------ */

#define MAX_KEYS 64
#define MAX_TENSORS 96
#define MAX_LAYERS 8

enum key_kind { K_U8, K_U16, K_U32, K_I32, K_U64, K_F32, K_BOOL, K_STR, K_U32_ARRAY, K_TOKENS };

struct key_entry {
    char name[96];
    enum key_kind kind;
    uint64_t u;
    float f;
    char str[64];
    uint32_t arr[MAX_LAYERS];
    uint32_t n_arr;
};

struct tensor_entry {
    char name[KT_GGUF_MAX_NAME];
    int type;
    uint32_t n_dims;
    int64_t ne[4];
};

struct spec {
    struct key_entry keys[MAX_KEYS];
    int n_keys;
    struct tensor_entry tensors[MAX_TENSORS];
    int n_tensors;
};

/* The family's knobs, at toy sizes. */
struct cfg {
    uint32_t n_layer, n_dense, E, F, H, qr, kvr, dn, dr, dv, f, Ne, k, Ns, groups, group_used, V;
    uint32_t gating;      /* 0: key not written */
    float weights_scale;  /* 0: key not written */
    bool weights_norm;    /* written only when true, as the converter does */
    bool split;           /* attn_k_b/attn_v_b + *_mla keys, else attn_kv_b */
    bool probs_bias;      /* exp_probs_b.bias */
    bool gate_up_fused;   /* ffn_gate_up_exps */
    bool tied;            /* no output.weight */
    bool arrays;          /* per-layer arrays for the keys that may be arrays */
    bool vocab_key;       /* vocab_size written (else counted from the tokens) */
    bool beta_keys;       /* yarn_beta_fast/slow written */
    float beta_fast, beta_slow;
    int matrix_type, expert_type;
};

/* DeepSeek-V3 in miniature: split MLA, q-LoRA, sigmoid, 4 groups, bias. */
static struct cfg v3_like(void)
{
    return (struct cfg){
        .n_layer = 3, .n_dense = 1, .E = 64, .F = 96, .H = 4, .qr = 32, .kvr = 32, .dn = 16, .dr = 8, .dv = 16,
        .f = 32, .Ne = 8, .k = 2, .Ns = 1, .groups = 4, .group_used = 2, .V = 300,
        .gating = 2, .weights_scale = 2.5f, .weights_norm = true, .split = true, .probs_bias = true,
        .vocab_key = true, .matrix_type = KT_TYPE_F32, .expert_type = KT_TYPE_F32,
    };
}

/* DeepSeek-V2-Lite in miniature: fused attn_kv_b, plain attn_q, softmax, no bias. */
static struct cfg v2lite_like(void)
{
    return (struct cfg){
        .n_layer = 3, .n_dense = 1, .E = 64, .F = 96, .H = 2, .qr = 0, .kvr = 32, .dn = 16, .dr = 8, .dv = 16,
        .f = 32, .Ne = 8, .k = 3, .Ns = 2, .groups = 1, .group_used = 1, .V = 260,
        .gating = 1, .weights_scale = 1.0f, .weights_norm = false, .split = false, .probs_bias = false,
        .vocab_key = false, .matrix_type = KT_TYPE_F32, .expert_type = KT_TYPE_F32,
    };
}

static struct key_entry *add_key(struct spec *s, const char *name, enum key_kind kind)
{
    struct key_entry *k = &s->keys[s->n_keys++];
    memset(k, 0, sizeof *k);
    snprintf(k->name, sizeof k->name, "%s", name);
    k->kind = kind;
    return k;
}

static void key_u(struct spec *s, const char *name, uint64_t v) { add_key(s, name, K_U32)->u = v; }
static void key_f(struct spec *s, const char *name, float v) { add_key(s, name, K_F32)->f = v; }

static void key_str(struct spec *s, const char *name, const char *v)
{
    snprintf(add_key(s, name, K_STR)->str, sizeof s->keys[0].str, "%s", v);
}

/* A key that may be one value or one per layer. */
static void key_per_layer(struct spec *s, const struct cfg *c, const char *name, uint32_t v)
{
    if (!c->arrays) {
        key_u(s, name, v);
        return;
    }
    struct key_entry *k = add_key(s, name, K_U32_ARRAY);
    k->n_arr = c->n_layer;
    for (uint32_t i = 0; i < c->n_layer; i++)
        k->arr[i] = v;
}

static struct key_entry *find_key(struct spec *s, const char *name)
{
    for (int i = 0; i < s->n_keys; i++)
        if (!strcmp(s->keys[i].name, name))
            return &s->keys[i];
    return NULL;
}

static void drop_key(struct spec *s, const char *name)
{
    struct key_entry *k = find_key(s, name);
    if (!k)
        return;
    int i = (int)(k - s->keys);
    memmove(&s->keys[i], &s->keys[i + 1], (size_t)(s->n_keys - i - 1) * sizeof *k);
    s->n_keys--;
}

static void add_tensor(struct spec *s, int il, const char *suffix, int type, uint32_t n_dims, int64_t ne0, int64_t ne1,
                       int64_t ne2)
{
    struct tensor_entry *t = &s->tensors[s->n_tensors++];
    if (il >= 0)
        snprintf(t->name, sizeof t->name, "blk.%d.%s", il, suffix);
    else
        snprintf(t->name, sizeof t->name, "%s", suffix);
    t->type = type;
    t->n_dims = n_dims;
    t->ne[0] = ne0;
    t->ne[1] = ne1;
    t->ne[2] = ne2;
    t->ne[3] = 1;
}

static struct tensor_entry *find_tensor(struct spec *s, const char *name)
{
    for (int i = 0; i < s->n_tensors; i++)
        if (!strcmp(s->tensors[i].name, name))
            return &s->tensors[i];
    return NULL;
}

static void drop_tensor(struct spec *s, const char *name)
{
    struct tensor_entry *t = find_tensor(s, name);
    if (!t)
        return;
    int i = (int)(t - s->tensors);
    memmove(&s->tensors[i], &s->tensors[i + 1], (size_t)(s->n_tensors - i - 1) * sizeof *t);
    s->n_tensors--;
}

#define D "deepseek2."

static void spec_build(struct spec *s, const struct cfg *c)
{
    memset(s, 0, sizeof *s);
    key_str(s, "general.architecture", "deepseek2");
    key_str(s, "general.name", c->split ? "tiny-v3-like" : "tiny-v2-lite-like");
    key_u(s, D "block_count", c->n_layer);
    key_u(s, D "context_length", 8192);
    key_u(s, D "embedding_length", c->E);
    key_per_layer(s, c, D "feed_forward_length", c->F);
    key_per_layer(s, c, D "attention.head_count", c->H);
    key_per_layer(s, c, D "attention.head_count_kv", c->split ? 1 : c->H);
    if (c->split) {
        key_u(s, D "attention.key_length", c->kvr + c->dr);
        key_u(s, D "attention.value_length", c->kvr);
        key_u(s, D "attention.key_length_mla", c->dn + c->dr);
        key_u(s, D "attention.value_length_mla", c->dv);
    } else {
        key_u(s, D "attention.key_length", c->dn + c->dr);
        key_u(s, D "attention.value_length", c->dv);
    }
    if (c->qr)
        key_u(s, D "attention.q_lora_rank", c->qr);
    key_u(s, D "attention.kv_lora_rank", c->kvr);
    key_f(s, D "attention.layer_norm_rms_epsilon", 1e-6f);
    key_u(s, D "rope.dimension_count", c->dr);
    key_f(s, D "rope.freq_base", 10000.0f);
    key_str(s, D "rope.scaling.type", "yarn");
    key_f(s, D "rope.scaling.factor", 40.0f);
    key_u(s, D "rope.scaling.original_context_length", 4096);
    key_f(s, D "rope.scaling.yarn_log_multiplier", c->split ? 0.1f : 0.0707f);
    if (c->beta_keys) {
        key_f(s, D "rope.scaling.yarn_beta_fast", c->beta_fast);
        key_f(s, D "rope.scaling.yarn_beta_slow", c->beta_slow);
    }
    key_u(s, D "leading_dense_block_count", c->n_dense);
    key_u(s, D "expert_count", c->Ne);
    key_per_layer(s, c, D "expert_used_count", c->k);
    key_per_layer(s, c, D "expert_feed_forward_length", c->f);
    key_u(s, D "expert_shared_count", c->Ns);
    key_u(s, D "expert_group_count", c->groups);
    key_u(s, D "expert_group_used_count", c->group_used);
    if (c->weights_scale != 0.0f)
        key_f(s, D "expert_weights_scale", c->weights_scale);
    if (c->weights_norm)
        add_key(s, D "expert_weights_norm", K_BOOL)->u = 1;
    if (c->gating)
        key_u(s, D "expert_gating_func", c->gating);
    if (c->vocab_key)
        key_u(s, D "vocab_size", c->V);
    key_str(s, "tokenizer.ggml.model", "gpt2");
    key_str(s, "tokenizer.ggml.pre", c->split ? "deepseek-v3" : "deepseek-llm");
    add_key(s, "tokenizer.ggml.tokens", K_TOKENS)->u = c->V;

    const int F32 = KT_TYPE_F32, M = c->matrix_type, X = c->expert_type;
    const int64_t E = c->E, H = c->H, dk = c->dn + c->dr;
    add_tensor(s, -1, "token_embd.weight", M, 2, E, c->V, 1);
    add_tensor(s, -1, "output_norm.weight", F32, 1, E, 1, 1);
    if (!c->tied)
        add_tensor(s, -1, "output.weight", M, 2, E, c->V, 1);
    for (int il = 0; il < (int)c->n_layer; il++) {
        add_tensor(s, il, "attn_norm.weight", F32, 1, E, 1, 1);
        if (c->qr) {
            add_tensor(s, il, "attn_q_a.weight", M, 2, E, c->qr, 1);
            add_tensor(s, il, "attn_q_a_norm.weight", F32, 1, c->qr, 1, 1);
            add_tensor(s, il, "attn_q_b.weight", M, 2, c->qr, H * dk, 1);
        } else {
            add_tensor(s, il, "attn_q.weight", M, 2, E, H * dk, 1);
        }
        add_tensor(s, il, "attn_kv_a_mqa.weight", M, 2, E, c->kvr + c->dr, 1);
        add_tensor(s, il, "attn_kv_a_norm.weight", F32, 1, c->kvr, 1, 1);
        if (c->split) {
            add_tensor(s, il, "attn_k_b.weight", M, 3, c->dn, c->kvr, H);
            add_tensor(s, il, "attn_v_b.weight", M, 3, c->kvr, c->dv, H);
        } else {
            add_tensor(s, il, "attn_kv_b.weight", M, 2, c->kvr, H * (c->dn + c->dv), 1);
        }
        add_tensor(s, il, "attn_output.weight", M, 2, H * c->dv, E, 1);
        add_tensor(s, il, "ffn_norm.weight", F32, 1, E, 1, 1);
        if (il < (int)c->n_dense) {
            add_tensor(s, il, "ffn_gate.weight", M, 2, E, c->F, 1);
            add_tensor(s, il, "ffn_up.weight", M, 2, E, c->F, 1);
            add_tensor(s, il, "ffn_down.weight", M, 2, c->F, E, 1);
            continue;
        }
        add_tensor(s, il, "ffn_gate_inp.weight", F32, 2, E, c->Ne, 1);
        if (c->probs_bias)
            add_tensor(s, il, "exp_probs_b.bias", F32, 1, c->Ne, 1, 1);
        if (c->gate_up_fused) {
            add_tensor(s, il, "ffn_gate_up_exps.weight", X, 3, E, 2 * c->f, c->Ne);
        } else {
            add_tensor(s, il, "ffn_gate_exps.weight", X, 3, E, c->f, c->Ne);
            add_tensor(s, il, "ffn_up_exps.weight", X, 3, E, c->f, c->Ne);
        }
        add_tensor(s, il, "ffn_down_exps.weight", X, 3, c->f, E, c->Ne);
        if (c->Ns) {
            add_tensor(s, il, "ffn_gate_shexp.weight", M, 2, E, c->f * c->Ns, 1);
            add_tensor(s, il, "ffn_up_shexp.weight", M, 2, E, c->f * c->Ns, 1);
            add_tensor(s, il, "ffn_down_shexp.weight", M, 2, c->f * c->Ns, E, 1);
        }
    }
}

static bool set_key(struct kt_gguf_writer *w, const struct key_entry *k, kt_err *err)
{
    struct kt_gguf_value v = {0};
    switch (k->kind) {
    case K_U8: v.type = KT_GGUF_UINT8; v.u8 = (uint8_t)k->u; break;
    case K_U16: v.type = KT_GGUF_UINT16; v.u16 = (uint16_t)k->u; break;
    case K_U32: v.type = KT_GGUF_UINT32; v.u32 = (uint32_t)k->u; break;
    case K_I32: v.type = KT_GGUF_INT32; v.i32 = (int32_t)k->u; break;
    case K_U64: v.type = KT_GGUF_UINT64; v.u64 = k->u; break;
    case K_F32: v.type = KT_GGUF_FLOAT32; v.f32 = k->f; break;
    case K_BOOL: v.type = KT_GGUF_BOOL; v.b = k->u != 0; break;
    case K_STR: return kt_gguf_writer_set_str(w, k->name, k->str, err) == KT_OK;
    case K_U32_ARRAY:
        return kt_gguf_writer_set_array(w, k->name, KT_GGUF_UINT32, k->arr, k->n_arr, err) == KT_OK;
    case K_TOKENS: {
        char **tok = calloc(k->u, sizeof *tok);
        char *text = calloc(k->u, 24);
        for (uint64_t i = 0; i < k->u; i++) {
            tok[i] = text + 24 * i;
            snprintf(tok[i], 24, "t%llu", (unsigned long long)i);
        }
        bool ok = kt_gguf_writer_set_str_array(w, k->name, (const char *const *)tok, k->u, err) == KT_OK;
        free(text);
        free(tok);
        return ok;
    }
    }
    return kt_gguf_writer_set(w, k->name, &v, err) == KT_OK;
}

static uint64_t tensor_bytes(const struct tensor_entry *t)
{
    return (uint64_t)kt_type_row_bytes(t->type, t->ne[0]) * (uint64_t)(t->ne[1] * t->ne[2] * t->ne[3]);
}

/* Writes the spec to path; tensor data is zeros except norms, which are ones. */
static bool spec_write(const struct spec *s, const char *path)
{
    kt_err err = {0};
    struct kt_gguf_writer *w = NULL;
    bool ok = kt_gguf_writer_create(path, &w, &err) == KT_OK;
    for (int i = 0; ok && i < s->n_keys; i++)
        ok = set_key(w, &s->keys[i], &err);
    for (int i = 0; ok && i < s->n_tensors; i++) {
        const struct tensor_entry *t = &s->tensors[i];
        ok = kt_gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, &err) == KT_OK;
    }
    ok = ok && kt_gguf_writer_write_header(w, &err) == KT_OK;
    for (int i = 0; ok && i < s->n_tensors; i++) {
        const struct tensor_entry *t = &s->tensors[i];
        uint64_t n = tensor_bytes(t);
        char *data = calloc(n ? n : 1, 1);
        if (t->type == KT_TYPE_F32 && strstr(t->name, "norm"))
            for (uint64_t j = 0; j < n / 4; j++)
                ((float *)data)[j] = 1.0f;
        ok = data && kt_gguf_writer_write_data(w, data, n, &err) == KT_OK;
        free(data);
    }
    ok = ok && kt_gguf_writer_finish(w, &err) == KT_OK;
    kt_gguf_writer_destroy(w);
    KT_CHECK(ok, "writing %s: %s", path, err.msg);
    return ok;
}

/* Writes the spec and opens it; returns the status, model in *out when OK. */
static kt_status open_spec(const struct spec *s, struct kt_model **out, kt_err *err)
{
    const char *path = kt_test_path("model.gguf");
    *out = NULL;
    memset(err, 0, sizeof *err);
    if (!spec_write(s, path))
        return KT_ERR_IO;
    return kt_model_open(path, out, err);
}

/* The message after the "PATH: " prefix kt_model_open puts on every message. */
static const char *msg_body(const kt_err *err)
{
    const char *path = kt_test_path("model.gguf");
    size_t n = strlen(path);
    if (strncmp(err->msg, path, n) == 0 && err->msg[n] == ':' && err->msg[n + 1] == ' ')
        return err->msg + n + 2;
    return err->msg;
}

/* Opens s, expects status want and a message starting with prefix. */
static void expect_failure(const struct spec *s, kt_status want, const char *prefix, const char *what)
{
    struct kt_model *m;
    kt_err err;
    kt_status st = open_spec(s, &m, &err);
    KT_CHECK(st == want, "%s: status %s, expected %s (%s)", what, kt_status_name(st), kt_status_name(want), err.msg);
    KT_CHECK(m == NULL, "%s: a model was returned on failure", what);
    KT_CHECK(strncmp(msg_body(&err), prefix, strlen(prefix)) == 0, "%s: message '%s' does not start with '%s'", what,
             err.msg, prefix);
    kt_model_close(m);
}

static bool has_tensor(const struct kt_gguf_tensor *t, const char *name)
{
    return t && !strcmp(t->name, name);
}

/* ---- hyperparameters --------------------------------------------------------------- */

static void v3_like_hparams_and_table(void)
{
    struct cfg c = v3_like();
    static struct spec s;
    spec_build(&s, &c);
    struct kt_model *m;
    kt_err err;
    KT_CHECK(open_spec(&s, &m, &err) == KT_OK, "%s", err.msg);
    if (!m)
        return;
    const struct kt_hparams *hp = &m->hp;
    KT_CHECK(!strcmp(m->arch, "deepseek2") && !strcmp(m->name, "tiny-v3-like"), "arch %s name %s", m->arch, m->name);
    KT_CHECK(hp->n_layer == 3 && hp->n_ctx_train == 8192 && hp->n_embd == 64 && hp->n_ff == 96, "dims");
    KT_CHECK(hp->n_head == 4 && hp->n_head_kv == 1, "heads %u kv %u", hp->n_head, hp->n_head_kv);
    KT_CHECK(hp->q_lora_rank == 32 && hp->kv_lora_rank == 32, "ranks %u %u", hp->q_lora_rank, hp->kv_lora_rank);
    KT_CHECK(hp->qk_nope_dim == 16 && hp->qk_rope_dim == 8 && hp->v_head_dim == 16, "head dims %u %u %u",
             hp->qk_nope_dim, hp->qk_rope_dim, hp->v_head_dim);
    KT_CHECK(hp->mla_split, "split MLA expected");
    KT_CHECK(hp->rms_eps == 1e-6f, "eps %g", (double)hp->rms_eps);
    KT_CHECK(hp->rope_freq_base == 10000.0f && hp->rope_scaling == KT_ROPE_SCALING_YARN, "rope");
    KT_CHECK(hp->rope_scaling_factor == 40.0f && hp->rope_orig_ctx == 4096, "yarn factor/orig ctx");
    KT_CHECK(hp->yarn_log_multiplier == 0.1f, "log multiplier %g", (double)hp->yarn_log_multiplier);
    KT_CHECK(hp->yarn_beta_fast == 32.0f && hp->yarn_beta_slow == 1.0f, "β defaults %g/%g", (double)hp->yarn_beta_fast,
             (double)hp->yarn_beta_slow);
    KT_CHECK(hp->rope_attn_factor == 1.0f, "attn factor %g", (double)hp->rope_attn_factor);
    KT_CHECK(hp->n_dense_lead == 1 && hp->n_expert == 8 && hp->n_expert_used == 2 && hp->n_expert_shared == 1 &&
                 hp->n_ff_exp == 32,
             "experts");
    KT_CHECK(hp->n_expert_groups == 4 && hp->n_group_used == 2, "groups %u/%u", hp->n_expert_groups, hp->n_group_used);
    KT_CHECK(hp->gating == KT_GATING_SIGMOID, "gating %d", hp->gating);
    KT_CHECK(hp->expert_weights_scale == 2.5f && hp->expert_weights_norm, "weights scale/norm");
    KT_CHECK(hp->n_vocab == 300, "vocab %u", hp->n_vocab);
    /* s = 40, mscale_all_dim = 1: 1 + 0.1 ln 40 (docs/deepseek2.md, RoPE/YaRN) */
    KT_CHECK(fabs(kt_hparams_yarn_mscale(hp) - 1.368888) < 1e-6, "mscale %.7f", kt_hparams_yarn_mscale(hp));
    KT_CHECK(fabs(kt_hparams_kq_scale(hp) - 1.368888 * 1.368888 / sqrt(24.0)) < 1e-5, "kq_scale %.7f",
             kt_hparams_kq_scale(hp));

    /* The table. */
    KT_CHECK(has_tensor(m->token_embd, "token_embd.weight") && has_tensor(m->output, "output.weight") &&
                 !m->output_tied && has_tensor(m->output_norm, "output_norm.weight"),
             "globals");
    const struct kt_layer *L0 = &m->layers[0], *L2 = &m->layers[2];
    KT_CHECK(!L0->is_moe && L2->is_moe, "is_moe");
    KT_CHECK(has_tensor(L0->ffn_gate, "blk.0.ffn_gate.weight") && has_tensor(L0->ffn_down, "blk.0.ffn_down.weight") &&
                 !L0->ffn_gate_inp && !L0->ffn_down_exps,
             "dense layer 0");
    KT_CHECK(has_tensor(L2->attn_q_a, "blk.2.attn_q_a.weight") && has_tensor(L2->attn_q_b, "blk.2.attn_q_b.weight") &&
                 !L2->attn_q,
             "q-LoRA");
    KT_CHECK(has_tensor(L2->attn_k_b, "blk.2.attn_k_b.weight") && has_tensor(L2->attn_v_b, "blk.2.attn_v_b.weight") &&
                 !L2->attn_kv_b,
             "split MLA tensors");
    KT_CHECK(has_tensor(L2->ffn_gate_inp, "blk.2.ffn_gate_inp.weight") &&
                 has_tensor(L2->exp_probs_b, "blk.2.exp_probs_b.bias"),
             "router");
    KT_CHECK(has_tensor(L2->ffn_gate_exps, "blk.2.ffn_gate_exps.weight") &&
                 has_tensor(L2->ffn_up_exps, "blk.2.ffn_up_exps.weight") && !L2->ffn_gate_up_exps &&
                 has_tensor(L2->ffn_down_exps, "blk.2.ffn_down_exps.weight"),
             "routed experts");
    KT_CHECK(has_tensor(L2->ffn_down_shexp, "blk.2.ffn_down_shexp.weight") && !L2->ffn_gate && !L2->ffn_up,
             "shared experts");
    KT_CHECK(m->n_tensors_used == (uint32_t)s.n_tensors && m->n_tensors_extra == 0, "used %u extra %u",
             m->n_tensors_used, m->n_tensors_extra);
    /* 3 + layer 0: 9 attention + 4 ffn; layers 1, 2: 9 + 1 + 2 router + 3 routed + 3 shared */
    KT_CHECK(m->n_tensors_used == 3 + 13 + 2 * 18, "tensor count %u", m->n_tensors_used);
    KT_CHECK(m->class_tensors[KT_CLASS_ATTENTION] == 27 && m->class_tensors[KT_CLASS_ROUTER] == 4 &&
                 m->class_tensors[KT_CLASS_ROUTED_EXPERTS] == 6 && m->class_tensors[KT_CLASS_SHARED_EXPERTS] == 6 &&
                 m->class_tensors[KT_CLASS_DENSE_FFN] == 6 && m->class_tensors[KT_CLASS_EMBED_OUTPUT] == 3,
             "class tensor counts");
    KT_CHECK(m->class_types[KT_CLASS_ROUTED_EXPERTS] == 1ull << KT_TYPE_F32, "types mask");
    kt_model_close(m);
}

static void v2lite_like_hparams_and_table(void)
{
    struct cfg c = v2lite_like();
    static struct spec s;
    spec_build(&s, &c);
    struct kt_model *m;
    kt_err err;
    KT_CHECK(open_spec(&s, &m, &err) == KT_OK, "%s", err.msg);
    if (!m)
        return;
    const struct kt_hparams *hp = &m->hp;
    KT_CHECK(!hp->mla_split && hp->q_lora_rank == 0, "fused form, no q-LoRA");
    KT_CHECK(hp->qk_nope_dim == 16 && hp->v_head_dim == 16 && hp->n_head_kv == 2, "legacy head dims %u %u kv %u",
             hp->qk_nope_dim, hp->v_head_dim, hp->n_head_kv);
    KT_CHECK(hp->gating == KT_GATING_SOFTMAX && hp->expert_weights_scale == 1.0f && !hp->expert_weights_norm,
             "V2-Lite routing");
    KT_CHECK(hp->n_expert_groups == 1 && hp->n_group_used == 1, "groups %u/%u", hp->n_expert_groups, hp->n_group_used);
    KT_CHECK(hp->n_vocab == 260, "vocab from tokenizer.ggml.tokens: %u", hp->n_vocab);
    /* mscale_all_dim 0.707: 1 + 0.0707 ln 40 */
    KT_CHECK(fabs(kt_hparams_yarn_mscale(hp) - (1.0 + 0.0707 * log(40.0))) < 1e-6, "mscale %.7f",
             kt_hparams_yarn_mscale(hp));
    const struct kt_layer *L1 = &m->layers[1];
    KT_CHECK(has_tensor(L1->attn_q, "blk.1.attn_q.weight") && !L1->attn_q_a && !L1->attn_q_b, "plain attn_q");
    KT_CHECK(has_tensor(L1->attn_kv_b, "blk.1.attn_kv_b.weight") && !L1->attn_k_b && !L1->attn_v_b, "fused kv_b");
    KT_CHECK(L1->exp_probs_b == NULL, "no selection bias");
    KT_CHECK(has_tensor(L1->ffn_up_shexp, "blk.1.ffn_up_shexp.weight") && L1->ffn_up_shexp->ne[1] == 64,
             "Ns = 2 shared width");
    kt_model_close(m);
}

static void fused_gate_up_tied_output_and_extras(void)
{
    struct cfg c = v3_like();
    c.gate_up_fused = true;
    c.tied = true;
    static struct spec s;
    spec_build(&s, &c);
    add_tensor(&s, 3, "nextn.eh_proj.weight", KT_TYPE_F32, 2, 128, 64, 1); /* an MTP layer kt does not run */
    struct kt_model *m;
    kt_err err;
    KT_CHECK(open_spec(&s, &m, &err) == KT_OK, "%s", err.msg);
    if (!m)
        return;
    const struct kt_layer *L1 = &m->layers[1];
    KT_CHECK(has_tensor(L1->ffn_gate_up_exps, "blk.1.ffn_gate_up_exps.weight") && !L1->ffn_gate_exps &&
                 !L1->ffn_up_exps,
             "fused gate+up");
    KT_CHECK(m->output_tied && m->output == m->token_embd, "tied output");
    KT_CHECK(m->n_tensors_extra == 1 && m->extra_bytes == 128 * 64 * 4, "extra %u / %llu bytes", m->n_tensors_extra,
             (unsigned long long)m->extra_bytes);
    /* token_embd counted once: 64*300 + output_norm 64 floats */
    KT_CHECK(m->class_bytes[KT_CLASS_EMBED_OUTPUT] == (64 * 300 + 64) * 4, "embed bytes %llu",
             (unsigned long long)m->class_bytes[KT_CLASS_EMBED_OUTPUT]);
    /* one expert = gate+up {64, 64} + down {32, 64} floats */
    KT_CHECK(kt_layer_expert_bytes(m, 1) == (64 * 64 + 32 * 64) * 4, "expert bytes %llu",
             (unsigned long long)kt_layer_expert_bytes(m, 1));
    kt_model_close(m);

    /* Both forms present: the fused slab is preferred, the separate ones are extras. */
    c.gate_up_fused = false;
    spec_build(&s, &c);
    for (int il = 1; il < 3; il++) {
        char name[64];
        snprintf(name, sizeof name, "blk.%d.ffn_down_exps.weight", il);
        int at = (int)(find_tensor(&s, name) - s.tensors);
        memmove(&s.tensors[at + 1], &s.tensors[at], (size_t)(s.n_tensors - at) * sizeof s.tensors[0]);
        s.n_tensors++;
        snprintf(s.tensors[at].name, sizeof s.tensors[at].name, "blk.%d.ffn_gate_up_exps.weight", il);
        s.tensors[at].ne[0] = 64; /* {E, 2f, Ne} */
        s.tensors[at].ne[1] = 64;
    }
    KT_CHECK(open_spec(&s, &m, &err) == KT_OK, "%s", err.msg);
    if (!m)
        return;
    KT_CHECK(m->layers[2].ffn_gate_up_exps && !m->layers[2].ffn_gate_exps && m->n_tensors_extra == 4,
             "fused preferred, extras %u", m->n_tensors_extra);
    kt_model_close(m);
}

static void per_layer_arrays_and_any_integer_width(void)
{
    struct cfg c = v3_like();
    c.arrays = true;
    c.beta_keys = true;
    c.beta_fast = 1.0f; /* Kimi-K2 writes β 1/1; kt follows the file */
    c.beta_slow = 1.0f;
    static struct spec s;
    spec_build(&s, &c);
    find_key(&s, D "block_count")->kind = K_U16;
    find_key(&s, D "context_length")->kind = K_U64;
    find_key(&s, D "attention.kv_lora_rank")->kind = K_U8;
    find_key(&s, D "expert_count")->kind = K_I32;
    struct kt_model *m;
    kt_err err;
    KT_CHECK(open_spec(&s, &m, &err) == KT_OK, "%s", err.msg);
    if (!m)
        return;
    const struct kt_hparams *hp = &m->hp;
    KT_CHECK(hp->n_layer == 3 && hp->n_ctx_train == 8192 && hp->kv_lora_rank == 32 && hp->n_expert == 8,
             "integer widths");
    KT_CHECK(hp->n_head == 4 && hp->n_head_kv == 1 && hp->n_ff == 96 && hp->n_expert_used == 2 && hp->n_ff_exp == 32,
             "per-layer arrays");
    KT_CHECK(hp->yarn_beta_fast == 1.0f && hp->yarn_beta_slow == 1.0f, "β from the file");
    kt_model_close(m);

    /* Unequal per-layer values: kt runs one width for all layers. */
    static const char *array_keys[] = {D "attention.head_count", D "attention.head_count_kv", D "feed_forward_length",
                                       D "expert_used_count", D "expert_feed_forward_length"};
    for (size_t i = 0; i < sizeof array_keys / sizeof array_keys[0]; i++) {
        spec_build(&s, &c);
        find_key(&s, array_keys[i])->arr[2] += 1;
        expect_failure(&s, KT_ERR_UNSUPPORTED, array_keys[i], "unequal per-layer array");
        spec_build(&s, &c);
        find_key(&s, array_keys[i])->n_arr = 2;
        expect_failure(&s, KT_ERR_FORMAT, array_keys[i], "per-layer array of the wrong length");
    }
}

static void reference_kq_scales(void)
{
    /* docs/deepseek2.md, RoPE/YaRN: kq_scale for the real models (dk = 192). */
    static const struct { float s, log_mul; double kq; } rows[] = {
        {32.0f, 0.1f, 0.130861},   /* Kimi-K2 */
        {64.0f, 0.1f, 0.144680},   /* Kimi-K2-0905 */
        {40.0f, 0.1f, 0.135234},   /* DeepSeek-V3 */
        {40.0f, 0.0707f, 0.114721} /* DeepSeek-V2-Lite */
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        struct kt_hparams hp = {.qk_nope_dim = 128, .qk_rope_dim = 64, .rope_scaling = KT_ROPE_SCALING_YARN,
                                .rope_scaling_factor = rows[i].s, .yarn_log_multiplier = rows[i].log_mul};
        KT_CHECK(fabs(kt_hparams_kq_scale(&hp) - rows[i].kq) < 2e-6, "row %zu: %.6f vs %.6f", i,
                 kt_hparams_kq_scale(&hp), rows[i].kq);
    }
    struct kt_hparams none = {.qk_nope_dim = 128, .qk_rope_dim = 64, .rope_scaling = KT_ROPE_SCALING_NONE,
                              .rope_scaling_factor = 40.0f, .yarn_log_multiplier = 0.1f};
    KT_CHECK(fabs(kt_hparams_kq_scale(&none) - 1.0 / sqrt(192.0)) < 1e-9, "no YaRN: 1/sqrt(dk)");
}

/* ---- single defects -------------------------------------------------------------- */

static bool is_optional(const char *name)
{
    return strstr(name, "exp_probs_b") || !strcmp(name, "output.weight");
}

static void each_missing_tensor_is_named(void)
{
    struct cfg cfgs[2] = {v3_like(), v2lite_like()};
    cfgs[1].gate_up_fused = true;
    static struct spec base, s;
    int n_cases = 0;
    for (int ci = 0; ci < 2; ci++) {
        spec_build(&base, &cfgs[ci]);
        for (int i = 0; i < base.n_tensors; i++) {
            const char *name = base.tensors[i].name;
            s = base;
            drop_tensor(&s, name);
            if (is_optional(name)) {
                struct kt_model *m;
                kt_err err;
                KT_CHECK(open_spec(&s, &m, &err) == KT_OK, "dropping optional %s: %s", name, err.msg);
                kt_model_close(m);
                continue;
            }
            char prefix[128];
            snprintf(prefix, sizeof prefix, "%s: tensor is missing", name);
            /* Without the fused slab the separate gate and up slabs are required. */
            const char *fused = strstr(name, "ffn_gate_up_exps");
            if (fused)
                snprintf(prefix, sizeof prefix, "%.*sffn_gate_exps.weight: tensor is missing", (int)(fused - name),
                         name);
            expect_failure(&s, KT_ERR_NOT_FOUND, prefix, name);
            n_cases++;
        }
    }
    KT_CHECK(n_cases > 80, "only %d missing-tensor cases", n_cases);
}

static void each_wrong_dim_is_named(void)
{
    struct cfg c = v3_like();
    static struct spec base, s;
    spec_build(&base, &c);
    for (int i = 0; i < base.n_tensors; i++) {
        const struct tensor_entry *t = &base.tensors[i];
        char prefix[128];
        snprintf(prefix, sizeof prefix, "%s: shape {", t->name);
        for (uint32_t d = 0; d < t->n_dims; d++) {
            s = base;
            s.tensors[i].ne[d] += 1;
            expect_failure(&s, KT_ERR_FORMAT, prefix, t->name);
        }
        /* A trailing dim that is not 1. */
        s = base;
        s.tensors[i].ne[t->n_dims] = 2;
        s.tensors[i].n_dims++;
        expect_failure(&s, KT_ERR_FORMAT, prefix, t->name);
        /* Trailing dims of 1 are the same shape. */
        s = base;
        s.tensors[i].n_dims = 4;
        struct kt_model *m;
        kt_err err;
        KT_CHECK(open_spec(&s, &m, &err) == KT_OK, "%s with n_dims 4: %s", t->name, err.msg);
        kt_model_close(m);
    }

    /* The exact message, with the legend of the expected dims. */
    s = base;
    find_tensor(&s, "blk.1.attn_k_b.weight")->ne[2] = 5;
    expect_failure(&s, KT_ERR_FORMAT,
                   "blk.1.attn_k_b.weight: shape {16, 32, 5} expected {16, 32, 4} (dn, kv_lora_rank, head_count)",
                   "exact shape message");
    s = base;
    find_tensor(&s, "blk.2.ffn_down_exps.weight")->n_dims = 2;
    find_tensor(&s, "blk.2.ffn_down_exps.weight")->ne[2] = 1;
    expect_failure(&s, KT_ERR_FORMAT,
                   "blk.2.ffn_down_exps.weight: shape {32, 64} expected {32, 64, 8} (n_ff_exp, n_embd, n_expert)",
                   "missing expert dim");
}

static void wrong_and_unsupported_types_are_named(void)
{
    struct cfg c = v3_like();
    static struct spec base, s;
    spec_build(&base, &c);

    int unsupported = -1; /* a type kt knows the size of but cannot dequantize */
    for (int t = 0; t < KT_TYPE_COUNT && unsupported < 0; t++) {
        const struct kt_type_traits *tr = kt_type_traits(t);
        if (tr && !tr->to_float && tr->block_elems == 1)
            unsupported = t;
    }
    KT_CHECK(unsupported >= 0, "no type without to_float to test with");

    int n_f32 = 0, n_matrix = 0;
    for (int i = 0; i < base.n_tensors; i++) {
        const struct tensor_entry *t = &base.tensors[i];
        bool must_be_f32 = t->n_dims == 1 || strstr(t->name, "ffn_gate_inp");
        char prefix[128];
        s = base;
        if (must_be_f32) {
            s.tensors[i].type = KT_TYPE_F16;
            snprintf(prefix, sizeof prefix, "%s: type f16, expected f32", t->name);
            expect_failure(&s, KT_ERR_FORMAT, prefix, t->name);
            n_f32++;
        } else if (unsupported >= 0) {
            s.tensors[i].type = unsupported;
            snprintf(prefix, sizeof prefix, "%s: type %s is not supported", t->name, kt_type_name(unsupported));
            expect_failure(&s, KT_ERR_UNSUPPORTED, prefix, t->name);
            n_matrix++;
        }
    }
    KT_CHECK(n_f32 == 1 + 3 * 4 + 2 * 2 && n_matrix > 30, "f32 cases %d, matrix cases %d", n_f32, n_matrix);

    /* Weight matrices in any type kt can dequantize are accepted. */
    c.matrix_type = KT_TYPE_F16;
    c.expert_type = KT_TYPE_Q8_0;
    spec_build(&s, &c);
    struct kt_model *m;
    kt_err err;
    KT_CHECK(open_spec(&s, &m, &err) == KT_OK, "f16/q8_0: %s", err.msg);
    if (m) {
        KT_CHECK(m->class_types[KT_CLASS_ROUTED_EXPERTS] == 1ull << KT_TYPE_Q8_0, "expert types");
        KT_CHECK(m->class_types[KT_CLASS_ATTENTION] == ((1ull << KT_TYPE_F16) | (1ull << KT_TYPE_F32)),
                 "attention types");
    }
    kt_model_close(m);
}

static void key_defects_are_named(void)
{
    struct cfg c = v3_like();
    static struct spec base, s;
    spec_build(&base, &c);

    static const char *required[] = {
        "general.architecture", D "block_count", D "context_length", D "embedding_length",
        D "feed_forward_length", D "attention.head_count", D "attention.kv_lora_rank", D "rope.dimension_count",
        D "attention.layer_norm_rms_epsilon", D "expert_count", D "expert_used_count",
        D "expert_feed_forward_length", D "expert_shared_count",
    };
    for (size_t i = 0; i < sizeof required / sizeof required[0]; i++) {
        s = base;
        drop_key(&s, required[i]);
        char prefix[128];
        snprintf(prefix, sizeof prefix, "%s: required key is missing", required[i]);
        expect_failure(&s, KT_ERR_NOT_FOUND, prefix, required[i]);
    }

    /* Optional keys fall back to their defaults. */
    s = base;
    drop_key(&s, D "vocab_size");
    drop_key(&s, D "expert_gating_func");
    drop_key(&s, D "expert_weights_scale");
    drop_key(&s, D "expert_group_count");
    drop_key(&s, D "expert_group_used_count");
    drop_key(&s, D "rope.scaling.type");
    drop_key(&s, D "rope.scaling.factor");
    drop_key(&s, D "rope.scaling.original_context_length");
    drop_key(&s, D "rope.freq_base");
    struct kt_model *m;
    kt_err err;
    KT_CHECK(open_spec(&s, &m, &err) == KT_OK, "defaults: %s", err.msg);
    if (m) {
        const struct kt_hparams *hp = &m->hp;
        KT_CHECK(hp->n_vocab == 300 && hp->gating == KT_GATING_SOFTMAX && hp->expert_weights_scale == 1.0f,
                 "vocab/gating/scale defaults");
        KT_CHECK(hp->n_expert_groups == 1 && hp->n_group_used == 1, "group defaults");
        KT_CHECK(hp->rope_scaling == KT_ROPE_SCALING_NONE && hp->rope_scaling_factor == 1.0f &&
                     hp->rope_orig_ctx == 8192 && hp->rope_freq_base == 10000.0f,
                 "rope defaults");
        KT_CHECK(kt_hparams_yarn_mscale(hp) == 1.0, "no YaRN, no mscale");
    }
    kt_model_close(m);

    /* Without q_lora_rank the file must have a plain attn_q. */
    s = base;
    drop_key(&s, D "attention.q_lora_rank");
    expect_failure(&s, KT_ERR_NOT_FOUND, "blk.0.attn_q.weight: tensor is missing", "no q_lora_rank");
    /* Without the *_mla keys it is the fused form. */
    s = base;
    drop_key(&s, D "attention.key_length_mla");
    drop_key(&s, D "attention.value_length_mla");
    find_key(&s, D "attention.key_length")->u = 24;
    find_key(&s, D "attention.value_length")->u = 16;
    expect_failure(&s, KT_ERR_NOT_FOUND, "blk.0.attn_kv_b.weight: tensor is missing", "no *_mla keys");
    s = base;
    drop_key(&s, D "attention.value_length_mla");
    expect_failure(&s, KT_ERR_FORMAT, D "attention.key_length_mla: present without", "half of the mla keys");

    struct { const char *key; uint64_t value; kt_status want; const char *prefix; } bad[] = {
        {D "expert_gating_func", 7, KT_ERR_UNSUPPORTED, D "expert_gating_func: 7 is not supported"},
        {D "expert_used_count", 9, KT_ERR_FORMAT, D "expert_used_count: 9 exceeds expert_count 8"},
        {D "expert_group_count", 3, KT_ERR_FORMAT, D "expert_group_count: expert_count 8 is not divisible"},
        {D "expert_group_used_count", 5, KT_ERR_FORMAT, D "expert_group_used_count: 5 exceeds"},
        {D "leading_dense_block_count", 4, KT_ERR_FORMAT, D "leading_dense_block_count: 4 exceeds block_count 3"},
        {D "attention.kv_lora_rank", 0, KT_ERR_FORMAT, D "attention.kv_lora_rank: must be greater than 0"},
        {D "embedding_length", 0, KT_ERR_FORMAT, D "embedding_length: must be greater than 0"},
        {D "block_count", 0, KT_ERR_FORMAT, D "block_count: must be greater than 0"},
        {D "rope.dimension_count", 7, KT_ERR_FORMAT, D "rope.dimension_count: 7 must be even"},
        {D "attention.key_length_mla", 8, KT_ERR_FORMAT, D "attention.key_length_mla: 8 must exceed"},
        {D "attention.key_length", 100, KT_ERR_FORMAT, D "attention.key_length: 100, expected"},
        {D "expert_count", 0, KT_ERR_FORMAT, D "expert_count: must be greater than 0"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        s = base;
        find_key(&s, bad[i].key)->u = bad[i].value;
        expect_failure(&s, bad[i].want, bad[i].prefix, bad[i].key);
    }

    s = base;
    snprintf(find_key(&s, "general.architecture")->str, sizeof s.keys[0].str, "llama");
    expect_failure(&s, KT_ERR_UNSUPPORTED, "general.architecture: \"llama\" is not supported", "wrong arch");
    s = base;
    snprintf(find_key(&s, D "rope.scaling.type")->str, sizeof s.keys[0].str, "longrope");
    expect_failure(&s, KT_ERR_UNSUPPORTED, D "rope.scaling.type: \"longrope\" is not supported", "rope type");
    s = base;
    find_key(&s, D "block_count")->kind = K_STR;
    expect_failure(&s, KT_ERR_FORMAT, "metadata key '" D "block_count'", "string where an integer belongs");

    /* An all-dense file needs no expert keys. */
    struct cfg dense = v3_like();
    dense.n_dense = dense.n_layer;
    spec_build(&s, &dense);
    drop_key(&s, D "expert_count");
    drop_key(&s, D "expert_used_count");
    drop_key(&s, D "expert_feed_forward_length");
    drop_key(&s, D "expert_shared_count");
    KT_CHECK(open_spec(&s, &m, &err) == KT_OK, "all dense: %s", err.msg);
    if (m)
        KT_CHECK(!m->layers[2].is_moe && m->class_bytes[KT_CLASS_ROUTED_EXPERTS] == 0, "all dense");
    kt_model_close(m);
}

/* ---- metadata against the tensors ---------------------------------------------------- */

/* Opens s, expects KT_ERR_FORMAT and a message holding every needle (both
 * sides of the contradiction). */
static void expect_contradiction(const struct spec *s, const char *what, const char *const *needles, size_t n)
{
    struct kt_model *m;
    kt_err err;
    kt_status st = open_spec(s, &m, &err);
    KT_CHECK(st == KT_ERR_FORMAT && m == NULL, "%s: status %s (%s)", what, kt_status_name(st), err.msg);
    for (size_t i = 0; i < n; i++)
        KT_CHECK(strstr(err.msg, needles[i]), "%s: message lacks '%s': %s", what, needles[i], err.msg);
    kt_model_close(m);
}

#define EXPECT_CONTRADICTION(s, what, ...)                                                                         \
    expect_contradiction(s, what, (const char *const[]){__VA_ARGS__},                                              \
                         sizeof((const char *const[]){__VA_ARGS__}) / sizeof(const char *))

static void expect_opens(const struct spec *s, const char *what)
{
    struct kt_model *m;
    kt_err err;
    KT_CHECK(open_spec(s, &m, &err) == KT_OK, "%s: %s", what, err.msg);
    kt_model_close(m);
}

static void layer_count_must_cover_every_layer_in_the_file(void)
{
    struct cfg c = v3_like();
    c.n_layer = 4;
    static struct spec base, s;
    spec_build(&base, &c);
    expect_opens(&base, "4 layers");

    s = base;
    find_key(&s, D "block_count")->u = 1;
    EXPECT_CONTRADICTION(&s, "block_count 1 of 4", D "block_count: 1, but", "layers up to blk.3",
                         "blk.1.attn_norm.weight is the first");
    s = base;
    find_key(&s, D "block_count")->u = 3;
    EXPECT_CONTRADICTION(&s, "block_count 3 of 4", D "block_count: 3, but", "up to blk.3", "blk.3.attn_norm.weight");

    /* An MTP layer after the last (DeepSeek-V3's blk.61) is not a layer block_count counts. */
    s = base;
    find_key(&s, D "block_count")->u = 3;
    add_tensor(&s, 3, "nextn.enorm.weight", KT_TYPE_F32, 1, 64, 1, 1);
    struct kt_model *m;
    kt_err err;
    KT_CHECK(open_spec(&s, &m, &err) == KT_OK, "a 4th layer with nextn.* tensors is MTP: %s", err.msg);
    if (m)
        KT_CHECK(m->hp.n_layer == 3 && m->n_tensors_extra > 10, "MTP tensors are extras: %u", m->n_tensors_extra);
    kt_model_close(m);
    /* ... but only right after: a layer beyond without them is refused. */
    add_tensor(&s, 5, "attn_norm.weight", KT_TYPE_F32, 1, 64, 1, 1);
    EXPECT_CONTRADICTION(&s, "a stray layer after MTP", D "block_count: 3", "up to blk.5", "blk.5.attn_norm.weight");
}

static void tensors_the_keys_say_are_absent_are_refused(void)
{
    static struct spec s;
    struct cfg c = v3_like();
    spec_build(&s, &c);
    find_key(&s, D "expert_shared_count")->u = 0;
    EXPECT_CONTRADICTION(&s, "shared count 0 (V3)", D "expert_shared_count: 0, but blk.1.ffn_gate_shexp.weight",
                         "its width 32 is 1 x expert_feed_forward_length 32");
    c = v2lite_like();
    spec_build(&s, &c);
    find_key(&s, D "expert_shared_count")->u = 0;
    EXPECT_CONTRADICTION(&s, "shared count 0 (V2-Lite)", "blk.1.ffn_gate_shexp.weight", "64 is 2 x");
    /* Only the down projection left: still shared experts. */
    spec_build(&s, &c);
    find_key(&s, D "expert_shared_count")->u = 0;
    for (int il = 1; il < 3; il++) {
        char name[64];
        snprintf(name, sizeof name, "blk.%d.ffn_gate_shexp.weight", il);
        drop_tensor(&s, name);
        snprintf(name, sizeof name, "blk.%d.ffn_up_shexp.weight", il);
        drop_tensor(&s, name);
    }
    EXPECT_CONTRADICTION(&s, "down_shexp only", "blk.1.ffn_down_shexp.weight (shared experts)");

    /* A layer leading_dense_block_count makes dense that also holds a router and experts. */
    c = v3_like();
    spec_build(&s, &c);
    find_key(&s, D "leading_dense_block_count")->u = 2;
    add_tensor(&s, 1, "ffn_gate.weight", KT_TYPE_F32, 2, 64, 96, 1);
    add_tensor(&s, 1, "ffn_up.weight", KT_TYPE_F32, 2, 64, 96, 1);
    add_tensor(&s, 1, "ffn_down.weight", KT_TYPE_F32, 2, 96, 64, 1);
    EXPECT_CONTRADICTION(&s, "dense layer with a router", D "leading_dense_block_count: 2 makes layer 1 dense",
                         "blk.1.ffn_gate_inp.weight");
}

static void hyperparameters_out_of_range_are_refused(void)
{
    struct cfg c = v3_like();
    static struct spec base, s;
    spec_build(&base, &c);

    /* head_count_kv: 1 (split) or head_count; the fused form stores head_count. */
    static const uint64_t bad_kv[] = {0, 9, 2};
    for (size_t i = 0; i < sizeof bad_kv / sizeof bad_kv[0]; i++) {
        s = base;
        find_key(&s, D "attention.head_count_kv")->u = bad_kv[i];
        char want[64];
        snprintf(want, sizeof want, D "attention.head_count_kv: %llu, but", (unsigned long long)bad_kv[i]);
        EXPECT_CONTRADICTION(&s, want, want, "or head_count 4");
    }
    s = base;
    find_key(&s, D "attention.head_count_kv")->u = 4;
    expect_opens(&s, "head_count_kv = head_count");

    /* A scaling type needs its factor; YaRN's is at least 1. */
    s = base;
    find_key(&s, D "rope.scaling.factor")->f = 0.0f;
    EXPECT_CONTRADICTION(&s, "yarn factor 0", D "rope.scaling.factor: 0, but " D "rope.scaling.type is \"yarn\"",
                         "at least 1");
    s = base;
    drop_key(&s, D "rope.scaling.factor");
    EXPECT_CONTRADICTION(&s, "yarn without factor", D "rope.scaling.factor: missing, but");
    s = base;
    find_key(&s, D "rope.scaling.factor")->f = 0.5f;
    EXPECT_CONTRADICTION(&s, "yarn factor 0.5", D "rope.scaling.factor: 0.5, but", "at least 1");
    s = base;
    snprintf(find_key(&s, D "rope.scaling.type")->str, sizeof s.keys[0].str, "linear");
    find_key(&s, D "rope.scaling.factor")->f = 0.0f;
    EXPECT_CONTRADICTION(&s, "linear factor 0", "is \"linear\", which needs a factor (above 0)");
    s = base;
    find_key(&s, D "rope.scaling.factor")->f = 5000.0f;
    EXPECT_CONTRADICTION(&s, "factor 5000", D "rope.scaling.factor: 5000 is implausibly large");
    s = base;
    key_f(&s, D "rope.scaling.attn_factor", 0.0f);
    EXPECT_CONTRADICTION(&s, "attn_factor 0", D "rope.scaling.attn_factor: 0 must be positive");
    s = base;
    find_key(&s, D "rope.scaling.yarn_log_multiplier")->f = -0.1f;
    EXPECT_CONTRADICTION(&s, "negative log multiplier", D "rope.scaling.yarn_log_multiplier: -0.1 must not be");
    /* No scaling with factor 0 is no scaling, as before. */
    s = base;
    snprintf(find_key(&s, D "rope.scaling.type")->str, sizeof s.keys[0].str, "none");
    find_key(&s, D "rope.scaling.factor")->f = 0.0f;
    expect_opens(&s, "type none, factor 0");
}

static void special_token_ids_must_be_in_the_vocabulary(void)
{
    struct cfg c = v3_like(); /* V 300 */
    static struct spec base, s;
    spec_build(&base, &c);
    static const struct {
        const char *key;
        enum key_kind kind;
        uint64_t v;
        const char *want;
    } bad[] = {
        {"tokenizer.ggml.bos_token_id", K_U32, 1043, "tokenizer.ggml.bos_token_id: 1043 is not a token"},
        {"tokenizer.ggml.eos_token_id", K_U32, 1u << 31, "tokenizer.ggml.eos_token_id: 2147483648 is not a token"},
        {"tokenizer.ggml.eos_token_id", K_U32, 99999, "tokenizer.ggml.eos_token_id: 99999 is not a token"},
        {"tokenizer.ggml.padding_token_id", K_U32, 300, "tokenizer.ggml.padding_token_id: 300 is not a token"},
        {"tokenizer.ggml.eot_token_id", K_I32, (uint64_t)-1, "tokenizer.ggml.eot_token_id: -1 is not a token"},
        {"tokenizer.ggml.bos_token_id", K_U64, 1ull << 40, "1099511627776 is not a token"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        s = base;
        add_key(&s, bad[i].key, bad[i].kind)->u = bad[i].v;
        EXPECT_CONTRADICTION(&s, bad[i].want, bad[i].want, "the vocabulary has 300 (ids 0 .. 299",
                             "tokenizer.ggml.tokens");
    }
    s = base;
    key_u(&s, "tokenizer.ggml.bos_token_id", 0);
    key_u(&s, "tokenizer.ggml.eos_token_id", 299);
    expect_opens(&s, "ids 0 and 299");

    /* More tokens than the embedding has rows. */
    s = base;
    find_key(&s, "tokenizer.ggml.tokens")->u = 310;
    EXPECT_CONTRADICTION(&s, "310 tokens for 300 rows", "tokenizer.ggml.tokens: 310 tokens, but token_embd.weight "
                         "has rows for 300");

    /* kt-run says so and exits 1 instead of running. */
    const char *tool = kt_test_tool("kt-run");
    if (access(tool, X_OK) != 0)
        return;
    s = base;
    key_u(&s, "tokenizer.ggml.bos_token_id", 1043);
    const char *model = kt_test_path("bad-bos.gguf"), *errp = kt_test_path("bad-bos.err");
    if (!spec_write(&s, model))
        return;
    int rc = kt_test_system("'%s' -m '%s' -p hi -n 1 >/dev/null 2>'%s'", tool, model, errp);
    size_t n;
    char *etext = kt_test_read_file(errp, &n);
    KT_CHECK(rc == 1 && etext && strstr(etext, "tokenizer.ggml.bos_token_id: 1043 is not a token"),
             "kt-run on a bos id past the vocabulary: exit %d, '%s'", rc, etext ? etext : "");
    free(etext);
    unlink(model);
    unlink(errp);
}

/* ---- memory ------------------------------------------------------------------------ */

static void memory_need_matches_hand_count(void)
{
    struct cfg c = v3_like();
    static struct spec s;
    spec_build(&s, &c);
    struct kt_model *m;
    kt_err err;
    KT_CHECK(open_spec(&s, &m, &err) == KT_OK, "%s", err.msg);
    if (!m)
        return;
    /* All f32 (4 bytes), E 64, F 96, H 4, qr 32, kvr 32, dn 16, dr 8, dv 16, f 32, Ne 8, Ns 1, V 300, 3 layers:
     * attention/layer 64 + 64*32 + 32 + 32*4*24 + 64*40 + 32 + 16*32*4 + 32*16*4 + 64*64 = 16000 floats
     * embed/output 64*300*2 + 64 = 38464; dense 3*64 (ffn_norm) + 3*64*96 = 18624
     * router 2*(64*8 + 8) = 1040; shared 2*3*64*32 = 12288; routed 2*3*64*32*8 = 98304 */
    const uint64_t attention = 3 * 16000 * 4, embed = 38464 * 4, dense = 18624 * 4, router = 1040 * 4;
    const uint64_t shared = 12288 * 4, routed = 98304 * 4, one_expert = 3 * 64 * 32 * 4;
    KT_CHECK(m->class_bytes[KT_CLASS_ATTENTION] == attention, "attention %llu",
             (unsigned long long)m->class_bytes[KT_CLASS_ATTENTION]);
    KT_CHECK(m->class_bytes[KT_CLASS_EMBED_OUTPUT] == embed && m->class_bytes[KT_CLASS_DENSE_FFN] == dense &&
                 m->class_bytes[KT_CLASS_ROUTER] == router && m->class_bytes[KT_CLASS_SHARED_EXPERTS] == shared &&
                 m->class_bytes[KT_CLASS_ROUTED_EXPERTS] == routed,
             "class bytes");
    KT_CHECK(kt_layer_expert_bytes(m, 0) == 0 && kt_layer_expert_bytes(m, 1) == one_expert, "expert bytes %llu",
             (unsigned long long)kt_layer_expert_bytes(m, 1));
    const uint64_t total = 866880, kv = 3 * 100 * (32 + 8) * 2; /* = 24000 */
    KT_CHECK(attention + embed + dense + router + shared + routed == total, "hand total");

    struct kt_memory_need n = kt_model_memory_need(m, -1, 100, 2);
    KT_CHECK(n.kv_cache_bytes == kv && n.gpu_bytes == 0 && n.cpu_bytes == total + kv, "all CPU: %llu %llu %llu",
             (unsigned long long)n.kv_cache_bytes, (unsigned long long)n.gpu_bytes, (unsigned long long)n.cpu_bytes);
    n = kt_model_memory_need(m, 0, 100, 2);
    KT_CHECK(n.gpu_bytes == 497664 && n.cpu_bytes == 393216, "N=0: %llu %llu", (unsigned long long)n.gpu_bytes,
             (unsigned long long)n.cpu_bytes);
    n = kt_model_memory_need(m, 3, 100, 2);
    KT_CHECK(n.gpu_bytes == 497664 + 3 * 2 * one_expert && n.cpu_bytes == 393216 - 3 * 2 * one_expert,
             "N=3: %llu %llu", (unsigned long long)n.gpu_bytes, (unsigned long long)n.cpu_bytes);
    n = kt_model_memory_need(m, 100, 100, 4); /* capped at 8; f32 cache */
    KT_CHECK(n.kv_cache_bytes == 2 * kv && n.gpu_bytes == total + 2 * kv && n.cpu_bytes == 0, "N=all: %llu %llu",
             (unsigned long long)n.gpu_bytes, (unsigned long long)n.cpu_bytes);
    kt_model_close(m);

    /* q8_0 experts: gate/up rows of 64 = 2 blocks (68 bytes), down rows of 32 = 1 block (34 bytes). */
    c.expert_type = KT_TYPE_Q8_0;
    spec_build(&s, &c);
    KT_CHECK(open_spec(&s, &m, &err) == KT_OK, "%s", err.msg);
    if (!m)
        return;
    KT_CHECK(kt_layer_expert_bytes(m, 2) == 68 * 32 * 2 + 34 * 64, "q8_0 expert bytes %llu",
             (unsigned long long)kt_layer_expert_bytes(m, 2));
    KT_CHECK(m->class_bytes[KT_CLASS_ROUTED_EXPERTS] == 2 * 8 * (68 * 32 * 2 + 34 * 64), "q8_0 routed bytes");
    kt_model_close(m);
}

/* ---- kt-run ------------------------------------------------------------------------ */

static char *slurp(const char *path)
{
    size_t n;
    char *text = kt_test_read_file(path, &n);
    return text ? text : calloc(1, 1);
}

static int count_lines(const char *text)
{
    int n = 0;
    for (; *text; text++)
        n += *text == '\n';
    return n;
}

static void kt_run_info_reports_the_model(void)
{
    const char *tool = kt_test_tool("kt-run");
    KT_CHECK(access(tool, X_OK) == 0, "%s is not built", tool);
    if (access(tool, X_OK) != 0)
        return;
    struct cfg c = v3_like();
    c.expert_type = KT_TYPE_Q8_0;
    static struct spec s;
    spec_build(&s, &c);
    const char *model = kt_test_path("kt-run-model.gguf");
    const char *out = kt_test_path("kt-run.out");
    const char *errp = kt_test_path("kt-run.err");
    if (!spec_write(&s, model))
        return;

    int rc = kt_test_system("'%s' --info '%s' --gpu-experts 3 >'%s' 2>'%s'", tool, model, out, errp);
    char *text = slurp(out), *etext = slurp(errp);
    KT_CHECK(rc == 0, "exit %d: %s", rc, etext);
    static const char *expect[] = {
        "GGUF version", "tiny-v3-like", "deepseek2", "gpt2, pre deepseek-v3", "tokenizer tokens", "300",
        "kv LoRA rank", "split (attn_k_b, attn_v_b)", "yarn", "sigmoid", "kq_scale", "routed experts",
        "q8_0", "attention", "f32", "memory at context 4096 (KV cache bf16", "all on CPU", "attention+shared on GPU",
        "+ 3 experts/layer on GPU",
    };
    for (size_t i = 0; i < sizeof expect / sizeof expect[0]; i++)
        KT_CHECK(strstr(text, expect[i]), "output lacks '%s':\n%s", expect[i], text);
    KT_CHECK(!strstr(text, "+ 8 experts"), "only the asked counts are shown");
    KT_CHECK(etext[0] == 0, "stderr not empty: %s", etext);

    /* --kv-type: the memory table counts the rows at their size (bf16 by default, half of f32). */
    rc = kt_test_system("'%s' --info '%s' --kv-type f32 >'%s' 2>'%s'", tool, model, out, errp);
    char *f32_text = slurp(out);
    const char *bf16_at = strstr(text, "GiB; "), *f32_at = strstr(f32_text, "GiB; ");
    unsigned long long bf16_bytes = 0, f32_bytes = 0;
    KT_CHECK(rc == 0 && strstr(f32_text, "(KV cache f32") && bf16_at && f32_at &&
                 sscanf(bf16_at, "GiB; %llu bytes per token", &bf16_bytes) == 1 &&
                 sscanf(f32_at, "GiB; %llu bytes per token", &f32_bytes) == 1 && bf16_bytes > 0 &&
                 f32_bytes == 2 * bf16_bytes,
             "--kv-type f32: exit %d, %llu bytes per token against bf16's %llu\n%s", rc, f32_bytes, bf16_bytes,
             f32_text);
    free(f32_text);
    rc = kt_test_system("'%s' --info '%s' --kv-type q4 >'%s' 2>'%s'", tool, model, out, errp);
    char *bad_text = slurp(errp);
    KT_CHECK(rc == 2 && strstr(bad_text, "--kv-type 'q4' is not a KV cache type: give f32, bf16 or f16"),
             "--kv-type q4: exit %d: %s", rc, bad_text);
    free(bad_text);
    free(text);
    free(etext);

    /* -m form, --ctx, the default counts capped at the model's 8 experts. */
    rc = kt_test_system("'%s' -m '%s' --info --ctx=64 >'%s' 2>'%s'", tool, model, out, errp);
    text = slurp(out);
    const char *all = strstr(text, "+ all 8 experts/layer on GPU");
    KT_CHECK(rc == 0 && strstr(text, "memory at context 64") && all, "-m/--ctx: exit %d\n%s", rc, text);
    KT_CHECK(!all || !strstr(all + 1, "+ all 8 experts"), "8 and 32 both mean all 8 experts: one row\n%s", text);
    free(text);

    /* Bad input: exit 1, one line naming the file and the problem. */
    const char *missing = kt_test_path("no-such-model.gguf");
    rc = kt_test_system("'%s' --info '%s' >'%s' 2>'%s'", tool, missing, out, errp);
    etext = slurp(errp);
    char prefix[1200];
    snprintf(prefix, sizeof prefix, "kt-run: %s: ", missing);
    KT_CHECK(rc == 1 && !strncmp(etext, prefix, strlen(prefix)) && count_lines(etext) == 1, "missing file: %d '%s'",
             rc, etext);
    free(etext);

    drop_tensor(&s, "blk.2.attn_v_b.weight");
    spec_write(&s, model);
    rc = kt_test_system("'%s' --info '%s' >'%s' 2>'%s'", tool, model, out, errp);
    etext = slurp(errp);
    snprintf(prefix, sizeof prefix, "kt-run: %s: blk.2.attn_v_b.weight: tensor is missing", model);
    KT_CHECK(rc == 1 && !strncmp(etext, prefix, strlen(prefix)) && count_lines(etext) == 1, "bad model: %d '%s'",
             rc, etext);
    free(etext);

    /* Usage errors: exit 2 with the usage text. */
    static const char *bad_args[] = {"", "--info", "--bogus x.gguf", "--info --ctx abc x.gguf",
                                     "--info --ctx 0 x.gguf", "--info --gpu-experts 1,,2 x.gguf", "x.gguf",
                                     "--info a.gguf b.gguf", "--info -m a.gguf b.gguf"};
    for (size_t i = 0; i < sizeof bad_args / sizeof bad_args[0]; i++) {
        rc = kt_test_system("'%s' %s >'%s' 2>'%s'", tool, bad_args[i], out, errp);
        etext = slurp(errp);
        KT_CHECK(rc == 2 && strstr(etext, "kt-run: ") && strstr(etext, "usage:"), "'%s': exit %d, '%s'", bad_args[i],
                 rc, etext);
        free(etext);
    }
    rc = kt_test_system("'%s' --help >'%s' 2>'%s'", tool, out, errp);
    text = slurp(out);
    KT_CHECK(rc == 0 && strstr(text, "usage:") && strstr(text, "--gpu-experts"), "--help: %d", rc);
    free(text);
    unlink(model);
    unlink(out);
    unlink(errp);
}

static void kt_synth_presets_open(void)
{
    const char *tool = kt_test_tool("kt-synth");
    if (access(tool, X_OK) != 0) {
        printf("note: %s not built; preset check not run\n", tool);
        return;
    }
    static const char *presets[] = {"tiny", "tiny-v3"};
    for (size_t i = 0; i < 2; i++) {
        const char *path = kt_test_path(presets[i]);
        int rc = kt_test_system("'%s' --preset %s -q -o '%s' >/dev/null", tool, presets[i], path);
        KT_CHECK(rc == 0, "kt-synth --preset %s: exit %d", presets[i], rc);
        struct kt_model *m = NULL;
        kt_err err = {0};
        KT_CHECK(rc != 0 || kt_model_open(path, &m, &err) == KT_OK, "preset %s: %s", presets[i], err.msg);
        KT_CHECK(rc != 0 || (m && m->n_tensors_extra == 0), "preset %s has tensors kt does not use", presets[i]);
        /* advice on an expert's pages loses nothing: given back, they read again from the file */
        const struct kt_layer *L = m ? &m->layers[m->hp.n_layer - 1] : NULL;
        if (L && L->is_moe) {
            const struct kt_gguf_tensor *t = L->ffn_down_exps;
            const size_t slab = (size_t)(t->nbytes / (uint64_t)t->ne[2]);
            uint8_t *before = kt_test_xmalloc(slab), *after = kt_test_xmalloc(slab);
            const uint32_t x = (uint32_t)t->ne[2] - 1;
            kt_model_expert_advise(m, t, x, KT_EXPERT_WILL_NEED);
            KT_CHECK(kt_model_read_expert(m, t, x, before, &err) == KT_OK, "read: %s", err.msg);
            kt_model_expert_advise(m, t, x, KT_EXPERT_DONE);
            kt_model_expert_advise(m, t, (uint32_t)t->ne[2], KT_EXPERT_DONE); /* past the last: nothing */
            KT_CHECK(kt_model_read_expert(m, t, x, after, &err) == KT_OK && !memcmp(before, after, slab),
                     "preset %s: expert %u's bytes after its pages were given back", presets[i], x);
            free(before), free(after);
        }
        kt_model_close(m);
        unlink(path);
    }
}

int main(void)
{
    KT_RUN(v3_like_hparams_and_table);
    KT_RUN(v2lite_like_hparams_and_table);
    KT_RUN(fused_gate_up_tied_output_and_extras);
    KT_RUN(per_layer_arrays_and_any_integer_width);
    KT_RUN(reference_kq_scales);
    KT_RUN(each_missing_tensor_is_named);
    KT_RUN(each_wrong_dim_is_named);
    KT_RUN(wrong_and_unsupported_types_are_named);
    KT_RUN(key_defects_are_named);
    KT_RUN(layer_count_must_cover_every_layer_in_the_file);
    KT_RUN(tensors_the_keys_say_are_absent_are_refused);
    KT_RUN(hyperparameters_out_of_range_are_refused);
    KT_RUN(special_token_ids_must_be_in_the_vocabulary);
    KT_RUN(memory_need_matches_hand_count);
    KT_RUN(kt_run_info_reports_the_model);
    KT_RUN(kt_synth_presets_open);
    unlink(kt_test_path("model.gguf"));
    return kt_test_finish();
}
