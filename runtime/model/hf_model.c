/*
 * hf_model.c - a checkpoint directory as a GGUF model (see hf_model.h for
 * the forms and what is read when).
 *
 * The table is built from hf_tensors.c's names (the module tree DeepSeek-V3
 * and Kimi-K2 share), one kt tensor per GGUF name:
 *   token_embd <- model.embed_tokens, output_norm <- model.norm, output <- lm_head
 *   blk.L.attn_norm <- input_layernorm, attn_q_a / attn_q_a_norm / attn_q_b
 *   (or attn_q) <- self_attn.q_a_proj / q_a_layernorm / q_b_proj (q_proj),
 *   attn_kv_a_mqa / attn_kv_a_norm / attn_kv_b <- kv_a_proj_with_mqa /
 *   kv_a_layernorm, attn_k_b + attn_v_b <- kv_b_proj (split, as llama.cpp's
 *   files are: the same table as a converted GGUF's), attn_output <- o_proj,
 *   ffn_norm <- post_attention_layernorm; dense ffn_{gate,up,down} <- mlp.*_proj;
 *   ffn_gate_inp / exp_probs_b.bias <- mlp.gate / e_score_correction_bias,
 *   ffn_{gate,up,down}_exps <- mlp.experts.X.*_proj stacked on the outer dim,
 *   ffn_{gate,up,down}_shexp <- mlp.shared_experts.*_proj.
 * A linear stored (out, in) is the GGUF tensor {in, out}: the same rows.
 *
 * It never writes to a shard, and never keeps a shard page it read for an
 * expert: the pages are given back (MADV_DONTNEED) right after the
 * conversion, so the expert store's copy is the only one in memory.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "hf_model.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "gguf.h"
#include "hf_config.h"
#include "hf_formats.h"
#include "hf_tensors.h"
#include "hf_tokenizer.h"
#include "model.h"
#include "quant.h"
#include "safetensors.h"

#define NAME_BYTES 160
#define DATA_ALIGN 64

/* Where one kt tensor's bytes come from. */
enum kv_b_half { WHOLE = 0, K_B, V_B };

struct tensor_src {
    struct kt_hf_linear lin;        /* a linear or a vector (PLAIN, its weight the values) */
    struct kt_hf_linear *experts;   /* streamed: [n_expert], into kt_hf_weights.expert_lins */
    enum kv_b_half half;            /* attn_k_b / attn_v_b: lin is kv_b_proj, split as below */
};

struct kt_hf_weights {
    char dir[512];
    struct kt_gguf *meta, *tok;     /* config.json's and the tokenizer's keys */
    struct kt_st_dir *st;
    struct kt_hf_quant q;
    struct kt_hparams hp;
    struct kt_gguf_kv *kv;          /* [n_kv]: meta's then tok's records, shallow */
    uint64_t n_kv;
    struct kt_gguf_tensor *tensors; /* [n_tensors] the table */
    struct tensor_src *src;         /* [n_tensors] */
    uint64_t n_tensors, cap;
    struct kt_hf_linear *expert_lins; /* [MoE layers * 3 * n_expert] */
    size_t n_expert_lins;
    uint64_t stored_bytes;
    /* the deferred tensors' memory: a memfd so that an engine's
     * MADV_DONTNEED of a matrix it packed (as it does to file pages) keeps
     * the values for the next engine made from this model */
    uint8_t *converted;
    size_t converted_bytes;
    pthread_mutex_t lock;
    bool ready;
    kt_status ready_status;
    char ready_msg[sizeof(((kt_err *)0)->msg)];
};

static uint64_t round_up(uint64_t n, uint64_t a)
{
    return (n + a - 1) / a * a;
}

static size_t st_elem_bytes(enum kt_st_dtype t)
{
    return t == KT_ST_F32 ? 4 : t == KT_ST_BF16 || t == KT_ST_F16 ? 2 : 1;
}

/* ---- which kt type a stored linear becomes ------------------------------------------------ */

static int linear_type(const struct kt_hf_linear *l, const struct kt_hf_quant *q)
{
    switch (l->stored) {
    case KT_HF_STORED_PLAIN:
        return l->weight->dtype == KT_ST_BF16 ? KT_TYPE_BF16 : l->weight->dtype == KT_ST_F16 ? KT_TYPE_F16 : KT_TYPE_F32;
    case KT_HF_STORED_FP8:
        return q->block_rows == KT_QK_FP8 && q->block_cols == KT_QK_FP8 && l->in % KT_QK_FP8 == 0 ? KT_TYPE_FP8_B128
                                                                                                  : KT_TYPE_F32;
    case KT_HF_STORED_INT4:
        return q->group_size == KT_QK && l->in % KT_QK == 0 ? KT_TYPE_Q4_0 : KT_TYPE_F32;
    }
    return KT_TYPE_F32;
}

/* Rows [r0, r0 + n) of l as kt type `type` at dst (n rows of
 * kt_type_row_bytes(type, in)); messages name the stored tensor. */
static kt_status convert_rows(const struct kt_hf_weights *w, const struct kt_hf_linear *l, int type, int64_t r0,
                              int64_t n, uint8_t *dst, kt_err *err)
{
    const int64_t in = (int64_t)l->in, out = (int64_t)l->out;
    const size_t row_bytes = kt_type_row_bytes(type, in);
    const uint8_t *src = l->weight->data;
    for (int64_t r = r0; r < r0 + n; r++, dst += row_bytes) {
        bool ok = true;
        switch (l->stored) {
        case KT_HF_STORED_PLAIN: {
            const size_t es = st_elem_bytes(l->weight->dtype);
            const uint8_t *row = src + (size_t)r * (size_t)in * es;
            if (type != KT_TYPE_F32 || l->weight->dtype == KT_ST_F32) {
                memcpy(dst, row, (size_t)in * es);
            } else if (l->weight->dtype == KT_ST_BF16) {
                kt_bf16_row_to_f32(src, in, r, (float *)(void *)dst);
            } else {
                float *f = (float *)(void *)dst;
                for (int64_t c = 0; c < in; c++) {
                    kt_fp16 h;
                    memcpy(&h, row + 2 * c, 2);
                    f[c] = kt_fp16_to_fp32(h);
                }
            }
            break;
        }
        case KT_HF_STORED_FP8:
            if (type == KT_TYPE_FP8_B128)
                ok = kt_fp8_b128_from_hf(src, l->scale->data, out, in, r, dst);
            else
                kt_fp8_block_row_to_f32(src, l->scale->data, in, w->q.block_rows, w->q.block_cols, r,
                                        (float *)(void *)dst);
            break;
        case KT_HF_STORED_INT4:
            if (type == KT_TYPE_Q4_0)
                ok = kt_q4_0_from_int4_row(src, l->scale->data, in, r, dst);
            else
                kt_int4_pack_row_to_f32(src, l->scale->data, in, w->q.group_size, r, (float *)(void *)dst);
            break;
        }
        if (!ok)
            return kt_err_set(err, KT_ERR_FORMAT,
                              "%s: %s row %" PRId64 " cannot become %s without rounding (%s): kt loads these "
                              "weights only losslessly", w->dir, l->weight->name, r, kt_type_name(type),
                              l->stored == KT_HF_STORED_FP8 ? "an E4M3 NaN code or a scale that is not finite"
                                                            : "a scale FP16 cannot hold exactly: below 2^-17, past "
                                                              "65504 or not finite");
    }
    return KT_OK;
}

/* Gives the whole pages inside [p, p + n) of a shard mapping back: read
 * again from the file if ever touched again. */
static void drop_pages(const void *p, uint64_t n)
{
    const long page = sysconf(_SC_PAGESIZE) > 0 ? sysconf(_SC_PAGESIZE) : 4096;
    const uintptr_t lo = round_up((uintptr_t)p, (uint64_t)page);
    const uintptr_t hi = ((uintptr_t)p + n) / (uintptr_t)page * (uintptr_t)page;
    if (hi > lo)
        madvise((void *)lo, hi - lo, MADV_DONTNEED);
}

/* Asks the kernel to read l's pages ahead (a mapping faults 4 KiB at a time otherwise). */
static void will_need(const struct kt_hf_linear *l)
{
    const long page = sysconf(_SC_PAGESIZE) > 0 ? sysconf(_SC_PAGESIZE) : 4096;
    const struct kt_st_tensor *parts[2] = {l->weight, l->scale};
    for (int i = 0; i < 2; i++) {
        if (!parts[i])
            continue;
        const uintptr_t lo = (uintptr_t)parts[i]->data / (uintptr_t)page * (uintptr_t)page;
        madvise((void *)lo, (uintptr_t)parts[i]->data + parts[i]->bytes - lo, MADV_WILLNEED);
    }
}

static void drop_linear(const struct kt_hf_linear *l)
{
    drop_pages(l->weight->data, l->weight->bytes);
    if (l->scale)
        drop_pages(l->scale->data, l->scale->bytes);
}

/* ---- kv_b_proj as attn_k_b / attn_v_b ----------------------------------------------------- */

/* kv_b_proj (H*(dn+dv), kvr) holds per head h its dn key rows, then its dv
 * value rows.  kt's split form, as llama.cpp's converter writes it
 * (convert_hf_to_gguf.py, DeepseekV2Model): attn_v_b {kvr, dv, H} is the value
 * rows as they are (row h*dv + j = kv_b row h*(dn+dv) + dn + j); attn_k_b
 * {dn, kvr, H} the key rows transposed per head (row h*kvr + c, element i =
 * kv_b[h*(dn+dv) + i][c]).  The types: v_b a linear's (linear_type); k_b the
 * stored dtype for plain weights, FP8_B128 when each k_b row lies in one
 * 128 x 128 scale block (dn and dn + dv multiples of 128, as in every real
 * model), else F32 by the definition. */
static int k_b_type(const struct kt_hf_linear *kv_b, const struct kt_hf_quant *q, uint32_t dn, uint32_t dv)
{
    if (kv_b->stored == KT_HF_STORED_PLAIN)
        return linear_type(kv_b, q);
    if (kv_b->stored == KT_HF_STORED_FP8 && q->block_rows == KT_QK_FP8 && q->block_cols == KT_QK_FP8 &&
        dn % KT_QK_FP8 == 0 && (dn + dv) % KT_QK_FP8 == 0)
        return KT_TYPE_FP8_B128;
    return KT_TYPE_F32;
}

static kt_status convert_k_b(const struct kt_hf_weights *w, const struct kt_hf_linear *l, int type, uint8_t *dst,
                             kt_err *err)
{
    const int64_t dn = w->hp.qk_nope_dim, dv = w->hp.v_head_dim, H = w->hp.n_head, kvr = (int64_t)l->in;
    const size_t row_bytes = kt_type_row_bytes(type, dn);
    const uint8_t *src = l->weight->data;
    float *rows = NULL; /* F32: one head's dn key rows of kvr values, decoded */
    if (type == KT_TYPE_F32 && !(rows = malloc((size_t)(dn * kvr) * sizeof *rows)))
        return kt_err_set(err, KT_ERR_NOMEM, "%s: out of memory splitting %s", w->dir, l->weight->name);
    kt_status st = KT_OK;
    for (int64_t h = 0; h < H && st == KT_OK; h++) {
        const int64_t r0 = h * (dn + dv);
        if (rows)
            st = convert_rows(w, l, KT_TYPE_F32, r0, dn, (uint8_t *)rows, err);
        for (int64_t c = 0; c < kvr && st == KT_OK; c++) {
            uint8_t *out = dst + (size_t)(h * kvr + c) * row_bytes;
            if (rows) {
                for (int64_t i = 0; i < dn; i++)
                    memcpy(out + 4 * i, &rows[i * kvr + c], 4);
            } else if (type == KT_TYPE_FP8_B128) {
                struct kt_block_fp8_b128 *b = (struct kt_block_fp8_b128 *)(void *)out;
                const uint64_t scale_cols = (l->in + KT_QK_FP8 - 1) / KT_QK_FP8;
                memcpy(&b->d, (const uint8_t *)l->scale->data + 4 * ((uint64_t)r0 / KT_QK_FP8 * scale_cols +
                                                                      (uint64_t)c / KT_QK_FP8),
                       4);
                for (int64_t i = 0; i < dn; i++)
                    b->q[i] = src[(size_t)(r0 + i) * (size_t)kvr + (size_t)c];
                if (!kt_fp8_b128_check_row(out, dn))
                    st = kt_err_set(err, KT_ERR_FORMAT, "%s: %s: an E4M3 NaN code or a scale that is not finite",
                                    w->dir, l->weight->name);
            } else { /* BF16 / F16: two bytes an element */
                for (int64_t i = 0; i < dn; i++)
                    memcpy(out + 2 * i, src + 2 * ((size_t)(r0 + i) * (size_t)kvr + (size_t)c), 2);
            }
        }
    }
    free(rows);
    return st;
}

static kt_status convert_v_b(const struct kt_hf_weights *w, const struct kt_hf_linear *l, int type, uint8_t *dst,
                             kt_err *err)
{
    const int64_t dn = w->hp.qk_nope_dim, dv = w->hp.v_head_dim, H = w->hp.n_head;
    const size_t head_bytes = (size_t)dv * kt_type_row_bytes(type, (int64_t)l->in);
    kt_status st = KT_OK;
    for (int64_t h = 0; h < H && st == KT_OK; h++)
        st = convert_rows(w, l, type, h * (dn + dv) + dn, dv, dst + (size_t)h * head_bytes, err);
    return st;
}

/* ---- the table -------------------------------------------------------------------------- */

struct builder {
    struct kt_hf_weights *w;
    kt_err *err;
};

static struct kt_gguf_tensor *add_tensor(struct builder *b, const char *name, int type, uint32_t n_dims,
                                         const int64_t *ne, struct tensor_src **src)
{
    struct kt_hf_weights *w = b->w;
    if (w->n_tensors == w->cap) {
        const uint64_t cap = w->cap ? 2 * w->cap : 256;
        struct kt_gguf_tensor *t = realloc(w->tensors, cap * sizeof *t);
        if (t)
            w->tensors = t;
        struct tensor_src *s = t ? realloc(w->src, cap * sizeof *s) : NULL;
        if (!t || !s) {
            kt_err_set(b->err, KT_ERR_NOMEM, "%s: out of memory building the tensor table", w->dir);
            return NULL;
        }
        w->src = s;
        w->cap = cap;
    }
    struct kt_gguf_tensor *t = &w->tensors[w->n_tensors];
    *src = &w->src[w->n_tensors++];
    memset(t, 0, sizeof *t);
    memset(*src, 0, sizeof **src);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->n_dims = n_dims;
    uint64_t rows = 1;
    for (uint32_t i = 0; i < KT_GGUF_MAX_DIMS; i++) {
        t->ne[i] = i < n_dims ? ne[i] : 1;
        if (i > 0)
            rows *= (uint64_t)t->ne[i];
    }
    t->type = type;
    t->nbytes = rows * kt_type_row_bytes(type, t->ne[0]);
    return t;
}

/* A matrix tensor {in, out} from linear l: in place when its type is the
 * stored one and the data is aligned for it, else deferred. */
static kt_status add_linear(struct builder *b, const char *name, const struct kt_hf_linear *l)
{
    struct tensor_src *src;
    const int type = linear_type(l, &b->w->q);
    struct kt_gguf_tensor *t = add_tensor(b, name, type, 2, (const int64_t[]){(int64_t)l->in, (int64_t)l->out}, &src);
    if (!t)
        return KT_ERR_NOMEM;
    src->lin = *l;
    /* a plain linear keeps its dtype (linear_type): its rows are the tensor's */
    if (l->stored == KT_HF_STORED_PLAIN && (uintptr_t)l->weight->data % st_elem_bytes(l->weight->dtype) == 0) {
        t->data = l->weight->data;
        t->source = KT_TENSOR_MAPPED;
    } else {
        t->source = KT_TENSOR_DEFERRED;
    }
    b->w->stored_bytes += l->weight->bytes + (l->scale ? l->scale->bytes : 0);
    return KT_OK;
}

/* An F32 tensor of shape ne (n_dims) from float values stored (rows, cols) in tensor v. */
static kt_status add_f32(struct builder *b, const char *name, const struct kt_st_tensor *v, uint32_t n_dims,
                         const int64_t *ne)
{
    struct tensor_src *src;
    struct kt_gguf_tensor *t = add_tensor(b, name, KT_TYPE_F32, n_dims, ne, &src);
    if (!t)
        return KT_ERR_NOMEM;
    const uint64_t cols = (uint64_t)ne[0];
    src->lin = (struct kt_hf_linear){KT_HF_STORED_PLAIN, v->numel / cols, cols, v, NULL};
    if (v->dtype == KT_ST_F32 && (uintptr_t)v->data % 4 == 0) {
        t->data = v->data;
        t->source = KT_TENSOR_MAPPED;
    } else {
        t->source = KT_TENSOR_DEFERRED;
    }
    b->w->stored_bytes += v->bytes;
    return KT_OK;
}

static kt_status find(struct builder *b, const struct kt_hf_quant *q, const char *module, uint64_t out, uint64_t in,
                      struct kt_hf_linear *l)
{
    kt_status st = kt_hf_find_linear(b->w->st, q, module, out, in, l, b->err);
    if (st != KT_OK)
        kt_err_prefix(b->err, "%s", b->w->dir);
    return st;
}

static kt_status linear(struct builder *b, const char *gguf_name, const char *module, uint64_t out, uint64_t in)
{
    struct kt_hf_linear l;
    kt_status st = find(b, &b->w->q, module, out, in, &l);
    return st ? st : add_linear(b, gguf_name, &l);
}

/* A vector of n floats (norm, bias) as F32; optional ones may be absent. */
static kt_status vector(struct builder *b, const char *gguf_name, const char *name, uint64_t n, bool required)
{
    const struct kt_st_tensor *v = kt_st_find(b->w->st, name);
    if (!v)
        return required ? kt_err_set(b->err, KT_ERR_NOT_FOUND, "%s: %s: missing", b->w->dir, name) : KT_OK;
    if (v->rank != 1 || v->shape[0] != n || (v->dtype != KT_ST_F32 && v->dtype != KT_ST_BF16 && v->dtype != KT_ST_F16))
        return kt_err_set(b->err, KT_ERR_FORMAT, "%s: %s: expected BF16, F16 or F32 of %" PRIu64 " values, found %s "
                          "of %" PRIu64 " values", b->w->dir, name, n, kt_st_dtype_name(v->dtype), v->numel);
    return add_f32(b, gguf_name, v, 1, (const int64_t[]){(int64_t)n});
}

/* One stacked expert tensor: every expert's linear, all of one kt type. */
static kt_status experts(struct builder *b, uint32_t il, const char *gguf_part, const char *hf_part, uint64_t out,
                         uint64_t in)
{
    struct kt_hf_weights *w = b->w;
    const uint32_t Ne = w->hp.n_expert;
    struct kt_hf_linear *lins = &w->expert_lins[w->n_expert_lins];
    char module[NAME_BYTES], name[KT_GGUF_MAX_NAME];
    int type = -1;
    for (uint32_t x = 0; x < Ne; x++) {
        snprintf(module, sizeof module, "model.layers.%u.mlp.experts.%u.%s", il, x, hf_part);
        kt_status st = find(b, &w->q, module, out, in, &lins[x]);
        if (st != KT_OK)
            return st;
        const int tx = linear_type(&lins[x], &w->q);
        if (type >= 0 && tx != type)
            return kt_err_set(b->err, KT_ERR_UNSUPPORTED, "%s: %s is stored as %s but expert 0's as %s: kt needs "
                              "one form for all experts of a layer", w->dir, module, kt_type_name(tx),
                              kt_type_name(type));
        type = tx;
        w->stored_bytes += lins[x].weight->bytes + (lins[x].scale ? lins[x].scale->bytes : 0);
    }
    w->n_expert_lins += Ne;
    snprintf(name, sizeof name, "blk.%u.%s", il, gguf_part);
    struct tensor_src *src;
    struct kt_gguf_tensor *t =
        add_tensor(b, name, type, 3, (const int64_t[]){(int64_t)in, (int64_t)out, (int64_t)Ne}, &src);
    if (!t)
        return KT_ERR_NOMEM;
    t->source = KT_TENSOR_STREAMED;
    src->experts = lins;
    return KT_OK;
}

/* kv_b_proj as the split attn_k_b and attn_v_b, both deferred (see above). */
static kt_status kv_b(struct builder *b, uint32_t il, const char *module)
{
    const struct kt_hparams *hp = &b->w->hp;
    const uint64_t H = hp->n_head, dn = hp->qk_nope_dim, dv = hp->v_head_dim, kvr = hp->kv_lora_rank;
    struct kt_hf_linear l;
    kt_status st = find(b, &b->w->q, module, H * (dn + dv), kvr, &l);
    if (st != KT_OK)
        return st;
    char name[KT_GGUF_MAX_NAME];
    struct tensor_src *src;
    snprintf(name, sizeof name, "blk.%u.attn_k_b.weight", il);
    struct kt_gguf_tensor *t = add_tensor(b, name, k_b_type(&l, &b->w->q, (uint32_t)dn, (uint32_t)dv), 3,
                                          (const int64_t[]){(int64_t)dn, (int64_t)kvr, (int64_t)H}, &src);
    if (!t)
        return KT_ERR_NOMEM;
    t->source = KT_TENSOR_DEFERRED;
    src->lin = l, src->half = K_B;
    snprintf(name, sizeof name, "blk.%u.attn_v_b.weight", il);
    if (!(t = add_tensor(b, name, linear_type(&l, &b->w->q), 3, (const int64_t[]){(int64_t)kvr, (int64_t)dv,
                         (int64_t)H}, &src)))
        return KT_ERR_NOMEM;
    t->source = KT_TENSOR_DEFERRED;
    src->lin = l, src->half = V_B;
    b->w->stored_bytes += l.weight->bytes + (l.scale ? l.scale->bytes : 0);
    return KT_OK;
}

static kt_status build_layer(struct builder *b, uint32_t il)
{
    const struct kt_hparams *hp = &b->w->hp;
    const uint64_t E = hp->n_embd, H = hp->n_head, qr = hp->q_lora_rank, kvr = hp->kv_lora_rank;
    const uint64_t dn = hp->qk_nope_dim, dr = hp->qk_rope_dim, dv = hp->v_head_dim;
    char hf[NAME_BYTES], gg[KT_GGUF_MAX_NAME];
    kt_status st;
#define HF(s) (snprintf(hf, sizeof hf, "model.layers.%u.%s", il, s), hf)
#define GG(s) (snprintf(gg, sizeof gg, "blk.%u.%s", il, s), gg)
    if ((st = vector(b, GG("attn_norm.weight"), HF("input_layernorm.weight"), E, true)))
        return st;
    if (qr > 0) {
        if ((st = linear(b, GG("attn_q_a.weight"), HF("self_attn.q_a_proj"), qr, E)) ||
            (st = vector(b, GG("attn_q_a_norm.weight"), HF("self_attn.q_a_layernorm.weight"), qr, true)) ||
            (st = linear(b, GG("attn_q_b.weight"), HF("self_attn.q_b_proj"), H * (dn + dr), qr)))
            return st;
    } else if ((st = linear(b, GG("attn_q.weight"), HF("self_attn.q_proj"), H * (dn + dr), E))) {
        return st;
    }
    if ((st = linear(b, GG("attn_kv_a_mqa.weight"), HF("self_attn.kv_a_proj_with_mqa"), kvr + dr, E)) ||
        (st = vector(b, GG("attn_kv_a_norm.weight"), HF("self_attn.kv_a_layernorm.weight"), kvr, true)) ||
        (st = kv_b(b, il, HF("self_attn.kv_b_proj"))) ||
        (st = linear(b, GG("attn_output.weight"), HF("self_attn.o_proj"), E, H * dv)) ||
        (st = vector(b, GG("ffn_norm.weight"), HF("post_attention_layernorm.weight"), E, true)))
        return st;
    if (il < hp->n_dense_lead) {
        const uint64_t F = hp->n_ff;
        if ((st = linear(b, GG("ffn_gate.weight"), HF("mlp.gate_proj"), F, E)) ||
            (st = linear(b, GG("ffn_up.weight"), HF("mlp.up_proj"), F, E)))
            return st;
        return linear(b, GG("ffn_down.weight"), HF("mlp.down_proj"), E, F);
    }
    const uint64_t f = hp->n_ff_exp, Ne = hp->n_expert, Fs = f * hp->n_expert_shared;
    const struct kt_hf_quant plain = {.format = KT_HF_WEIGHTS_PLAIN};
    struct kt_hf_linear router;
    if ((st = find(b, &plain, HF("mlp.gate"), Ne, E, &router)) ||
        (st = add_f32(b, GG("ffn_gate_inp.weight"), router.weight, 2, (const int64_t[]){(int64_t)E, (int64_t)Ne})) ||
        (st = vector(b, GG("exp_probs_b.bias"), HF("mlp.gate.e_score_correction_bias"), Ne, false)) ||
        (st = experts(b, il, "ffn_gate_exps.weight", "gate_proj", f, E)) ||
        (st = experts(b, il, "ffn_up_exps.weight", "up_proj", f, E)) ||
        (st = experts(b, il, "ffn_down_exps.weight", "down_proj", E, f)))
        return st;
    if (Fs > 0 && ((st = linear(b, GG("ffn_gate_shexp.weight"), HF("mlp.shared_experts.gate_proj"), Fs, E)) ||
                   (st = linear(b, GG("ffn_up_shexp.weight"), HF("mlp.shared_experts.up_proj"), Fs, E)) ||
                   (st = linear(b, GG("ffn_down_shexp.weight"), HF("mlp.shared_experts.down_proj"), E, Fs))))
        return st;
#undef HF
#undef GG
    return KT_OK;
}

static kt_status build_table(struct builder *b)
{
    struct kt_hf_weights *w = b->w;
    const struct kt_hparams *hp = &w->hp;
    const uint32_t n_moe = hp->n_layer > hp->n_dense_lead ? hp->n_layer - hp->n_dense_lead : 0;
    if (hp->n_expert && !(w->expert_lins = calloc((size_t)n_moe * 3 * hp->n_expert, sizeof *w->expert_lins)))
        return kt_err_set(b->err, KT_ERR_NOMEM, "%s: out of memory", w->dir);
    const struct kt_hf_quant plain = {.format = KT_HF_WEIGHTS_PLAIN};
    struct kt_hf_linear embd;
    kt_status st;
    if ((st = find(b, &plain, "model.embed_tokens", hp->n_vocab, hp->n_embd, &embd)) ||
        (st = add_linear(b, "token_embd.weight", &embd)) ||
        (st = vector(b, "output_norm.weight", "model.norm.weight", hp->n_embd, true)) ||
        (st = linear(b, "output.weight", "lm_head", hp->n_vocab, hp->n_embd)))
        return st;
    for (uint32_t il = 0; il < hp->n_layer; il++)
        if ((st = build_layer(b, il)))
            return st;
    return KT_OK;
}

/* ---- open and close ----------------------------------------------------------------------- */

static void weights_free(struct kt_hf_weights *w)
{
    if (!w)
        return;
    if (w->converted)
        munmap(w->converted, w->converted_bytes);
    kt_st_close(w->st);
    kt_gguf_close(w->meta);
    kt_gguf_close(w->tok);
    free(w->kv);
    free(w->tensors);
    free(w->src);
    free(w->expert_lins);
    pthread_mutex_destroy(&w->lock);
    free(w);
}

static void release(void *owner)
{
    weights_free(owner);
}

#define N_SPLIT_KEYS 5

/* The keys of the split MLA form the table has (attn_k_b / attn_v_b), as in
 * llama.cpp's files: one KV head, key/value_length the latent row, the head
 * dims in *_mla.  config.json's keys (hf_config.c) describe the fused form. */
static void split_mla_keys(struct kt_hf_weights *w)
{
    const struct kt_hparams *hp = &w->hp;
    static const char *const keys[N_SPLIT_KEYS] = {
        "deepseek2.attention.head_count_kv", "deepseek2.attention.key_length", "deepseek2.attention.value_length",
        "deepseek2.attention.key_length_mla", "deepseek2.attention.value_length_mla"};
    const uint32_t values[N_SPLIT_KEYS] = {1, hp->kv_lora_rank + hp->qk_rope_dim, hp->kv_lora_rank,
                                           hp->qk_nope_dim + hp->qk_rope_dim, hp->v_head_dim};
    for (int k = 0; k < N_SPLIT_KEYS; k++) {
        uint64_t i = 0;
        while (i < w->n_kv && strcmp(w->kv[i].key, keys[k]) != 0)
            i++;
        if (i == w->n_kv) /* a new record */
            w->kv[w->n_kv++] = (struct kt_gguf_kv){.key = (char *)keys[k]};
        w->kv[i].value = (struct kt_gguf_value){.type = KT_GGUF_UINT32, .u32 = values[k]};
    }
}

kt_status kt_hf_model_open(const char *dir, struct kt_gguf **out, struct kt_hf_weights **weights, kt_err *err)
{
    *out = NULL;
    *weights = NULL;
    struct kt_hf_weights *w = calloc(1, sizeof *w);
    if (!w)
        return kt_err_set(err, KT_ERR_NOMEM, "%s: out of memory", dir);
    pthread_mutex_init(&w->lock, NULL);
    snprintf(w->dir, sizeof w->dir, "%s", dir);
    kt_status st = kt_hf_config_read(dir, &w->meta, &w->q, err);
    if (st == KT_OK)
        st = kt_hparams_read(w->meta, &w->hp, err);
    if (st == KT_OK && w->q.format == KT_HF_WEIGHTS_MXFP4)
        st = kt_err_set(err, KT_ERR_UNSUPPORTED, "MXFP4 checkpoints of deepseek2 models have no tensor naming kt "
                        "has confirmed yet");
    if (st == KT_OK)
        st = kt_hf_tokenizer_read(dir, &w->tok, err);
    if (st == KT_OK)
        st = kt_st_open_dir(dir, &w->st, err);
    if (st != KT_OK) {
        kt_err_prefix(err, "%s", dir);
        weights_free(w);
        return st;
    }
    struct builder b = {w, err};
    if ((st = build_table(&b)) != KT_OK) {
        weights_free(w);
        return st;
    }
    w->n_kv = w->meta->n_kv + w->tok->n_kv;
    if (!(w->kv = malloc((w->n_kv + N_SPLIT_KEYS) * sizeof *w->kv))) {
        weights_free(w);
        return kt_err_set(err, KT_ERR_NOMEM, "%s: out of memory", dir);
    }
    memcpy(w->kv, w->meta->kv, w->meta->n_kv * sizeof *w->kv);
    memcpy(w->kv + w->meta->n_kv, w->tok->kv, w->tok->n_kv * sizeof *w->kv);
    split_mla_keys(w);
    /* from here the GGUF owns w: it is released when the GGUF closes, also on failure */
    st = kt_gguf_from_parts(w->kv, w->n_kv, w->tensors, w->n_tensors, release, w, dir, out, err);
    if (st == KT_OK)
        *weights = w;
    return st;
}

/* ---- reading ------------------------------------------------------------------------------ */

static kt_status make_ready(struct kt_hf_weights *w, void (*progress)(void *ctx, uint64_t bytes), void *ctx,
                            kt_err *err)
{
    size_t bytes = 0;
    for (uint64_t i = 0; i < w->n_tensors; i++)
        if (w->tensors[i].source == KT_TENSOR_DEFERRED)
            bytes += round_up(w->tensors[i].nbytes, DATA_ALIGN);
    if (bytes == 0)
        return KT_OK;
    const int fd = memfd_create("kt-converted", MFD_CLOEXEC);
    if (fd < 0)
        return kt_err_set(err, KT_ERR_IO, "%s: memfd_create: %s", w->dir, strerror(errno));
    void *p = MAP_FAILED;
    if (ftruncate(fd, (off_t)bytes) == 0)
        p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    const int map_errno = errno;
    close(fd);
    if (p == MAP_FAILED)
        return kt_err_set(err, KT_ERR_NOMEM, "%s: cannot map %zu bytes for the converted weights: %s", w->dir, bytes,
                          strerror(map_errno));
    w->converted = p;
    w->converted_bytes = bytes;
    uint8_t *at = p;
    for (uint64_t i = 0; i < w->n_tensors; i++) {
        struct kt_gguf_tensor *t = &w->tensors[i];
        if (t->source != KT_TENSOR_DEFERRED)
            continue;
        const struct kt_hf_linear *l = &w->src[i].lin;
        kt_status st = w->src[i].half == K_B   ? convert_k_b(w, l, t->type, at, err)
                       : w->src[i].half == V_B ? convert_v_b(w, l, t->type, at, err)
                                               : convert_rows(w, l, t->type, 0, (int64_t)l->out, at, err);
        if (st != KT_OK)
            return st;
        if (w->src[i].half != K_B) /* v_b, made next, reads the same pages */
            drop_linear(l);
        t->data = at;
        at += round_up(t->nbytes, DATA_ALIGN);
        if (progress)
            progress(ctx, t->nbytes);
    }
    return KT_OK;
}

kt_status kt_hf_weights_ready(struct kt_hf_weights *w, void (*progress)(void *ctx, uint64_t bytes), void *ctx,
                              kt_err *err)
{
    pthread_mutex_lock(&w->lock);
    if (!w->ready) {
        kt_err e = {0};
        w->ready_status = make_ready(w, progress, ctx, &e);
        snprintf(w->ready_msg, sizeof w->ready_msg, "%s", e.msg);
        w->ready = true;
    }
    const kt_status st = w->ready_status;
    if (st != KT_OK)
        kt_err_set(err, st, "%s", w->ready_msg);
    pthread_mutex_unlock(&w->lock);
    return st;
}

kt_status kt_hf_read_expert(struct kt_hf_weights *w, const struct kt_gguf_tensor *t, uint32_t x, void *dst,
                            kt_err *err)
{
    return kt_hf_read_expert_rows(w, t, x, 0, t->ne[1], dst, err);
}

void kt_hf_expert_will_need(const struct kt_hf_weights *w, const struct kt_gguf_tensor *t, uint32_t x)
{
    const uintptr_t at = (uintptr_t)t - (uintptr_t)w->tensors;
    const uint64_t i = at / sizeof *t;
    if (at % sizeof *t == 0 && i < w->n_tensors && t->source == KT_TENSOR_STREAMED && x < (uint64_t)t->ne[2])
        will_need(&w->src[i].experts[x]);
}

kt_status kt_hf_read_expert_rows(struct kt_hf_weights *w, const struct kt_gguf_tensor *t, uint32_t x, int64_t first,
                                 int64_t n, void *dst, kt_err *err)
{
    const uintptr_t at = (uintptr_t)t - (uintptr_t)w->tensors; /* wraps past n_tensors when t is not ours */
    const uint64_t i = at / sizeof *t;
    if (at % sizeof *t || i >= w->n_tensors || t->source != KT_TENSOR_STREAMED || x >= (uint64_t)t->ne[2] ||
        first < 0 || n < 0 || first > t->ne[1] - n)
        return kt_err_set(err, KT_ERR_INVALID, "%s: %s expert %u rows %lld + %lld are not a streamed expert's of this "
                          "checkpoint", w->dir, t->name, x, (long long)first, (long long)n);
    const struct kt_hf_linear *l = &w->src[i].experts[x];
    if (first == 0 && x == 0)
        will_need(l);
    if (first == 0 && x + 1 < (uint64_t)t->ne[2]) /* the next expert's pages read ahead while this one converts */
        will_need(&w->src[i].experts[x + 1]);
    kt_status st = convert_rows(w, l, t->type, first, n, dst, err);
    if (first + n == t->ne[1])
        drop_linear(l);
    return st;
}

uint64_t kt_hf_stored_bytes(const struct kt_hf_weights *w)
{
    return w ? w->stored_bytes : 0;
}
