/*
 * hf.c - kt-synth's Hugging Face checkpoint directories: the plan's random
 * model (the very values its GGUF file holds, drawn by init.c from the same
 * seed) written as config.json, safetensors shards with their index, and
 * tokenizer files, under the module names DeepSeek-V3's and Kimi-K2's
 * modeling code uses (runtime/model/hf_tensors.c lists them).
 *
 * Weights are stored as the real checkpoints store them: BF16 everywhere
 * (--hf-weights bf16), block FP8 in the decoder layers like DeepSeek-V3
 * (fp8), or INT4 pack-quantized routed experts like Kimi-K2-Thinking
 * (int4-experts); the encoders are kernels/hf_formats.c's.  The GGUF file's
 * split attn_k_b / attn_v_b become the fused kv_b_proj by inverting
 * llama.cpp's converter (convert_hf_to_gguf.py, DeepseekV2Model.modify_tensors:
 * kv_b viewed (H, dn + dv, kvr) is split [dn, dv] along dim 1 and the key half
 * transposed), so row h*(dn+dv) + i, column c of kv_b_proj is
 *   attn_k_b[h][c][i]       (i < dn; GGUF ne (dn, kvr, H), plan row h*kvr + c)
 *   attn_v_b[h][i - dn][c]  (i >= dn; GGUF ne (kvr, dv, H), plan row h*dv + i - dn).
 *
 * Memory: one module at a time, 128 rows at a time (the FP8 block height),
 * written in place with pwrite; nothing is held for the whole model.  Writes
 * only into a new or empty directory, and removes what it wrote on failure.
 * Library code: never prints.
 */
#include "synth.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hf_formats.h"
#include "init.h"
#include "quant.h"
#include "safetensors.h"

#define STRIPE_ROWS 128 /* rows drawn at once: the FP8 block height */
#define FP8_BLOCK 128
#define INT4_GROUP 32
#define NAME_BYTES 160   /* a tensor: the module and a suffix */
#define MODULE_BYTES 128
#define MAX_FILES 100000

/* ---- what to write --------------------------------------------------------------------- */

enum stored { STORED_BF16, STORED_F32, STORED_FP8, STORED_INT4 };

/* One tensor of a shard. */
struct part {
    char name[NAME_BYTES];
    enum kt_st_dtype dtype;
    uint32_t rank;
    uint64_t shape[2];
    uint64_t bytes;
    uint64_t offset; /* in its shard's data section */
};

/* One module (a linear's weight and scales, or a vector): written together,
 * into one shard. */
struct item {
    enum stored stored;
    uint32_t src;       /* plan tensor the rows come from */
    int64_t src_v;      /* kv_b_proj: attn_v_b's plan index (src is attn_k_b); else -1 */
    uint64_t row0;      /* first plan row (an expert's: X * out) */
    uint64_t out, in;   /* rows x cols; a vector is 1 x n */
    uint32_t n_parts;
    struct part parts[3];
    uint32_t shard;
    uint64_t bytes;
};

struct hf_writer {
    const struct kt_synth_plan *plan;
    const struct kt_synth_hf_options *opt;
    struct item *items;
    uint32_t n_items, cap;
    uint32_t n_shards;
    uint64_t total_bytes;
    kt_err *err;
    /* row buffers, sized for the widest module */
    float *f32;         /* STRIPE_ROWS x in */
    uint8_t *bytes;     /* STRIPE_ROWS x in x 4 */
    uint8_t *scales;    /* STRIPE_ROWS x ceil(in / 32) x 2, or ceil(in / 128) x 4 */
    float *kb;          /* kv_b_proj: one head's attn_k_b rows, kvr x dn */
    int64_t kb_head;
};

static uint64_t ceil_div(uint64_t a, uint64_t b)
{
    return (a + b - 1) / b;
}

static int64_t plan_index(const struct kt_synth_plan *p, const char *name)
{
    for (uint32_t i = 0; i < p->n_tensors; i++)
        if (strcmp(p->tensors[i].name, name) == 0)
            return i;
    return -1;
}

static struct item *new_item(struct hf_writer *w)
{
    if (w->n_items == w->cap) {
        uint32_t cap = w->cap ? 2 * w->cap : 256;
        struct item *it = realloc(w->items, cap * sizeof *it);
        if (!it)
            return NULL;
        w->items = it, w->cap = cap;
    }
    struct item *it = &w->items[w->n_items++];
    memset(it, 0, sizeof *it);
    it->src_v = -1;
    return it;
}

static void add_part(struct item *it, const char *module, const char *suffix, enum kt_st_dtype dtype, uint32_t rank,
                     uint64_t d0, uint64_t d1)
{
    struct part *p = &it->parts[it->n_parts++];
    if (suffix)
        snprintf(p->name, sizeof p->name, "%s.%s", module, suffix);
    else
        snprintf(p->name, sizeof p->name, "%s", module); /* a vector: "...weight", "...bias" */
    p->dtype = dtype, p->rank = rank, p->shape[0] = d0, p->shape[1] = d1;
    p->bytes = (rank == 1 ? d0 : d0 * d1) * kt_st_dtype_bits(dtype) / 8;
    it->bytes += p->bytes;
}

/* A module from plan tensor gguf_name (rows row0 .. row0 + out - 1), stored as s. */
static kt_status add_item(struct hf_writer *w, const char *module, const char *gguf_name, uint64_t row0,
                          uint64_t out, uint64_t in, bool vector, enum stored s)
{
    const int64_t src = plan_index(w->plan, gguf_name);
    if (src < 0)
        return kt_err_set(w->err, KT_ERR_INVALID, "the plan has no %s for %s", gguf_name, module);
    const struct kt_synth_tensor *t = &w->plan->tensors[src];
    if ((uint64_t)t->ne[0] != in || (uint64_t)(t->ne[1] * t->ne[2]) < row0 + out)
        return kt_err_set(w->err, KT_ERR_INVALID, "%s: %s has no %" PRIu64 " x %" PRIu64 " rows at %" PRIu64, module,
                          gguf_name, out, in, row0);
    struct item *it = new_item(w);
    if (!it)
        return kt_err_set(w->err, KT_ERR_NOMEM, "out of memory planning %s", module);
    it->stored = s, it->src = (uint32_t)src, it->row0 = row0, it->out = out, it->in = in;
    if (vector) {
        add_part(it, module, NULL, s == STORED_F32 ? KT_ST_F32 : KT_ST_BF16, 1, in, 0);
        return KT_OK;
    }
    switch (s) {
    case STORED_BF16: add_part(it, module, "weight", KT_ST_BF16, 2, out, in); break;
    case STORED_F32: add_part(it, module, "weight", KT_ST_F32, 2, out, in); break;
    case STORED_FP8:
        add_part(it, module, "weight", KT_ST_F8_E4M3, 2, out, in);
        add_part(it, module, "weight_scale_inv", KT_ST_F32, 2, ceil_div(out, FP8_BLOCK), ceil_div(in, FP8_BLOCK));
        break;
    case STORED_INT4:
        add_part(it, module, "weight_packed", KT_ST_I32, 2, out, ceil_div(in, 8));
        add_part(it, module, "weight_scale", KT_ST_BF16, 2, out, ceil_div(in, INT4_GROUP));
        add_part(it, module, "weight_shape", KT_ST_I64, 1, 2, 0);
        break;
    }
    return KT_OK;
}

/* add_item with the layer's prefixes: model.layers.L.module from blk.L.gguf (l < 0: the names as given). */
static kt_status module_item(struct hf_writer *w, int l, const char *module, const char *gguf, uint64_t row0,
                             uint64_t out, uint64_t in, bool vector, enum stored st)
{
    char m[MODULE_BYTES], g[KT_GGUF_MAX_NAME];
    if (l >= 0) {
        snprintf(m, sizeof m, "model.layers.%d.%s", l, module);
        snprintf(g, sizeof g, "blk.%d.%s", l, gguf);
    } else {
        snprintf(m, sizeof m, "%s", module);
        snprintf(g, sizeof g, "%s", gguf);
    }
    return add_item(w, m, g, row0, out, in, vector, st);
}

/* kv_b_proj (H*(dn+dv), kvr) from the plan's attn_k_b and attn_v_b (see the top of this file). */
static kt_status add_kv_b(struct hf_writer *w, uint32_t l, enum stored s)
{
    const struct kt_synth_config *c = &w->plan->cfg;
    const uint64_t H = c->n_head, kvr = c->kv_lora_rank, dn = c->qk_nope_dim, dv = c->v_head_dim;
    char m[MODULE_BYTES], k_b[KT_GGUF_MAX_NAME], v_b[KT_GGUF_MAX_NAME];
    snprintf(m, sizeof m, "model.layers.%u.self_attn.kv_b_proj", l);
    snprintf(k_b, sizeof k_b, "blk.%u.attn_k_b.weight", l);
    snprintf(v_b, sizeof v_b, "blk.%u.attn_v_b.weight", l);
    const int64_t ki = plan_index(w->plan, k_b), vi = plan_index(w->plan, v_b);
    if (ki < 0 || vi < 0)
        return kt_err_set(w->err, KT_ERR_INVALID, "the plan has no %s", ki < 0 ? k_b : v_b);
    const struct kt_synth_tensor *kt = &w->plan->tensors[ki], *vt = &w->plan->tensors[vi];
    if ((uint64_t)kt->ne[0] != dn || (uint64_t)kt->ne[1] != kvr || (uint64_t)kt->ne[2] != H ||
        (uint64_t)vt->ne[0] != kvr || (uint64_t)vt->ne[1] != dv || (uint64_t)vt->ne[2] != H)
        return kt_err_set(w->err, KT_ERR_INVALID, "%s / %s do not have the split MLA shapes", k_b, v_b);
    struct item *it = new_item(w);
    if (!it)
        return kt_err_set(w->err, KT_ERR_NOMEM, "out of memory planning %s", m);
    it->stored = s, it->src = (uint32_t)ki, it->src_v = vi, it->out = H * (dn + dv), it->in = kvr;
    if (s == STORED_FP8) {
        add_part(it, m, "weight", KT_ST_F8_E4M3, 2, it->out, kvr);
        add_part(it, m, "weight_scale_inv", KT_ST_F32, 2, ceil_div(it->out, FP8_BLOCK), ceil_div(kvr, FP8_BLOCK));
    } else {
        add_part(it, m, "weight", KT_ST_BF16, 2, it->out, kvr);
    }
    return KT_OK;
}

/* Every module of the checkpoint, in the modeling code's order. */
static kt_status plan_items(struct hf_writer *w)
{
    const struct kt_synth_plan *p = w->plan;
    const struct kt_synth_config *c = &p->cfg;
    const uint64_t E = c->n_embd, V = p->vocab.n_tokens, H = c->n_head, qr = c->q_lora_rank;
    const uint64_t kvr = c->kv_lora_rank, dn = c->qk_nope_dim, dr = c->qk_rope_dim, dv = c->v_head_dim;
    const uint64_t F = c->n_ff, f = c->n_ff_exp, Fs = f * c->n_expert_shared;
    const enum kt_synth_hf_weights mode = w->opt->weights;
    /* DeepSeek-V3 quantizes every linear of the decoder layers; Kimi-K2-Thinking only the routed experts */
    const enum stored dense = mode == KT_SYNTH_HF_FP8 ? STORED_FP8 : STORED_BF16;
    const enum stored expert = mode == KT_SYNTH_HF_FP8 ? STORED_FP8
                               : mode == KT_SYNTH_HF_INT4_EXPERTS ? STORED_INT4 : STORED_BF16;
    const enum stored B = STORED_BF16;
    kt_status s;
    /* module (layer l's, l >= 0) from GGUF tensor gguf's rows row0.., out x in; VEC: a vector of n */
#define ITEM(l, module, gguf, row0, out, in, st)                                                                    \
    if ((s = module_item(w, l, module, gguf, row0, out, in, false, st)) != KT_OK)                                  \
    return s
#define VEC(l, module, gguf, n, st)                                                                                 \
    if ((s = module_item(w, l, module, gguf, 0, 1, n, true, st)) != KT_OK)                                         \
    return s
    ITEM(-1, "model.embed_tokens", "token_embd.weight", 0, V, E, B);
    for (int l = 0; l < (int)c->n_layer; l++) {
        VEC(l, "input_layernorm.weight", "attn_norm.weight", E, B);
        ITEM(l, "self_attn.q_a_proj", "attn_q_a.weight", 0, qr, E, dense);
        VEC(l, "self_attn.q_a_layernorm.weight", "attn_q_a_norm.weight", qr, B);
        ITEM(l, "self_attn.q_b_proj", "attn_q_b.weight", 0, H * (dn + dr), qr, dense);
        ITEM(l, "self_attn.kv_a_proj_with_mqa", "attn_kv_a_mqa.weight", 0, kvr + dr, E, dense);
        VEC(l, "self_attn.kv_a_layernorm.weight", "attn_kv_a_norm.weight", kvr, B);
        if ((s = add_kv_b(w, (uint32_t)l, dense)) != KT_OK)
            return s;
        ITEM(l, "self_attn.o_proj", "attn_output.weight", 0, E, H * dv, dense);
        VEC(l, "post_attention_layernorm.weight", "ffn_norm.weight", E, B);
        if ((uint32_t)l < p->n_dense_lead) {
            ITEM(l, "mlp.gate_proj", "ffn_gate.weight", 0, F, E, dense);
            ITEM(l, "mlp.up_proj", "ffn_up.weight", 0, F, E, dense);
            ITEM(l, "mlp.down_proj", "ffn_down.weight", 0, E, F, dense);
            continue;
        }
        /* the router stays BF16 (its bias F32) in every real checkpoint */
        ITEM(l, "mlp.gate", "ffn_gate_inp.weight", 0, c->n_expert, E, B);
        VEC(l, "mlp.gate.e_score_correction_bias", "exp_probs_b.bias", c->n_expert, STORED_F32);
        for (uint32_t x = 0; x < c->n_expert; x++) { /* expert x: rows x*out.. of the stacked GGUF tensors */
            char part[64];
            snprintf(part, sizeof part, "mlp.experts.%u.gate_proj", x);
            ITEM(l, part, "ffn_gate_exps.weight", (uint64_t)x * f, f, E, expert);
            snprintf(part, sizeof part, "mlp.experts.%u.up_proj", x);
            ITEM(l, part, "ffn_up_exps.weight", (uint64_t)x * f, f, E, expert);
            snprintf(part, sizeof part, "mlp.experts.%u.down_proj", x);
            ITEM(l, part, "ffn_down_exps.weight", (uint64_t)x * E, E, f, expert);
        }
        if (Fs > 0) {
            ITEM(l, "mlp.shared_experts.gate_proj", "ffn_gate_shexp.weight", 0, Fs, E, dense);
            ITEM(l, "mlp.shared_experts.up_proj", "ffn_up_shexp.weight", 0, Fs, E, dense);
            ITEM(l, "mlp.shared_experts.down_proj", "ffn_down_shexp.weight", 0, E, Fs, dense);
        }
    }
    VEC(-1, "model.norm.weight", "output_norm.weight", E, B);
    ITEM(-1, "lm_head", "output.weight", 0, V, E, B);
#undef ITEM
#undef VEC
    return KT_OK;
}

/* Shards in order, each up to shard_bytes (a module bigger than that alone);
 * offsets within each. */
static void assign_shards(struct hf_writer *w)
{
    uint64_t used = 0;
    uint32_t shard = 0;
    for (uint32_t i = 0; i < w->n_items; i++) {
        struct item *it = &w->items[i];
        if (used > 0 && used + it->bytes > w->opt->shard_bytes)
            shard++, used = 0;
        it->shard = shard;
        for (uint32_t k = 0; k < it->n_parts; k++) {
            it->parts[k].offset = used;
            used += it->parts[k].bytes;
        }
        w->total_bytes += it->bytes;
    }
    w->n_shards = shard + 1;
}

/* ---- values ------------------------------------------------------------------------------ */

/* Rows r0 .. r0 + n - 1 of the module, n x in floats. */
static void draw_rows(struct hf_writer *w, const struct item *it, uint64_t r0, uint64_t n, float *out)
{
    const struct kt_synth_plan *p = w->plan;
    if (it->src_v < 0) {
        for (uint64_t i = 0; i < n; i++)
            kt_synth_init_row(p, it->src, it->row0 + r0 + i, out + i * it->in);
        return;
    }
    const uint64_t kvr = p->cfg.kv_lora_rank, dn = p->cfg.qk_nope_dim, dv = p->cfg.v_head_dim;
    for (uint64_t i = 0; i < n; i++) {
        const uint64_t r = r0 + i, h = r / (dn + dv), j = r % (dn + dv);
        float *row = out + i * kvr;
        if (j >= dn) { /* the value half: attn_v_b's row h*dv + (j - dn) as it is */
            kt_synth_init_row(p, (uint32_t)it->src_v, h * dv + (j - dn), row);
            continue;
        }
        if (w->kb_head != (int64_t)h) { /* the key half: head h's attn_k_b, (kvr, dn), transposed */
            for (uint64_t c = 0; c < kvr; c++)
                kt_synth_init_row(p, it->src, h * kvr + c, w->kb + c * dn);
            w->kb_head = (int64_t)h;
        }
        for (uint64_t c = 0; c < kvr; c++)
            row[c] = w->kb[c * dn + j];
    }
}

static kt_status write_at(struct hf_writer *w, int fd, const char *path, const void *buf, size_t n, uint64_t at)
{
    const uint8_t *b = buf;
    while (n > 0) {
        ssize_t k = pwrite(fd, b, n, (off_t)at);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return kt_err_set(w->err, KT_ERR_IO, "%s: write failed: %s", path, k < 0 ? strerror(errno) : "no space");
        b += k, n -= (size_t)k, at += (uint64_t)k;
    }
    return KT_OK;
}

/* The module's tensors, stripe by stripe, at base (the shard's data section). */
static kt_status write_item(struct hf_writer *w, const struct item *it, int fd, const char *path, uint64_t base,
                            struct kt_progress *progress)
{
    const uint64_t in = it->in, words = ceil_div(in, 8), groups = ceil_div(in, INT4_GROUP);
    const struct part *p0 = &it->parts[0], *p1 = &it->parts[1];
    kt_status s = KT_OK;
    w->kb_head = -1;
    for (uint64_t r0 = 0; s == KT_OK && r0 < it->out; r0 += STRIPE_ROWS) {
        const uint64_t n = it->out - r0 < STRIPE_ROWS ? it->out - r0 : STRIPE_ROWS;
        draw_rows(w, it, r0, n, w->f32);
        uint64_t done = 0;
        switch (it->stored) {
        case STORED_F32:
            s = write_at(w, fd, path, w->f32, n * in * 4, base + p0->offset + r0 * in * 4);
            done = n * in * 4;
            break;
        case STORED_BF16: {
            kt_bf16 *b = (kt_bf16 *)(void *)w->bytes;
            for (uint64_t i = 0; i < n * in; i++)
                b[i] = kt_fp32_to_bf16(w->f32[i]);
            s = write_at(w, fd, path, b, n * in * 2, base + p0->offset + r0 * in * 2);
            done = n * in * 2;
            break;
        }
        case STORED_FP8: {
            const uint64_t scale_cols = ceil_div(in, FP8_BLOCK);
            kt_fp8_block_stripe_from_f32(w->f32, (int64_t)n, (int64_t)in, FP8_BLOCK, w->bytes,
                                         (float *)(void *)w->scales);
            if ((s = write_at(w, fd, path, w->bytes, n * in, base + p0->offset + r0 * in)) == KT_OK)
                s = write_at(w, fd, path, w->scales, scale_cols * 4,
                             base + p1->offset + r0 / FP8_BLOCK * scale_cols * 4);
            done = n * in + scale_cols * 4;
            break;
        }
        case STORED_INT4:
            for (uint64_t i = 0; i < n; i++)
                kt_int4_pack_row_from_f32(w->f32 + i * in, (int64_t)in, INT4_GROUP, w->bytes + i * words * 4,
                                          w->scales + i * groups * 2);
            if ((s = write_at(w, fd, path, w->bytes, n * words * 4, base + p0->offset + r0 * words * 4)) == KT_OK)
                s = write_at(w, fd, path, w->scales, n * groups * 2, base + p1->offset + r0 * groups * 2);
            done = n * (words * 4 + groups * 2);
            break;
        }
        kt_progress_add(progress, done);
    }
    if (s == KT_OK && it->stored == STORED_INT4) { /* weight_shape: I64 [out, in] */
        const int64_t shape[2] = {(int64_t)it->out, (int64_t)in};
        s = write_at(w, fd, path, shape, sizeof shape, base + it->parts[2].offset);
        kt_progress_add(progress, sizeof shape);
    }
    return s;
}

/* ---- files --------------------------------------------------------------------------------- */

/* The files written so far, removed again if the whole does not succeed. */
struct written {
    char **paths;
    uint32_t n;
};

static kt_status remember(struct written *wr, const char *path, kt_err *err)
{
    char **p = realloc(wr->paths, (wr->n + 1) * sizeof *p);
    char *copy = strdup(path);
    if (!p || !copy) {
        free(copy);
        if (p)
            wr->paths = p;
        return kt_err_set(err, KT_ERR_NOMEM, "out of memory");
    }
    wr->paths = p;
    wr->paths[wr->n++] = copy;
    return KT_OK;
}

static void shard_name(char *out, size_t n, uint32_t shard, uint32_t n_shards)
{
    snprintf(out, n, "model-%05u-of-%05u.safetensors", shard + 1, n_shards);
}

static const char *dtype_name(enum kt_st_dtype t)
{
    return kt_st_dtype_name(t);
}

/* The shard's JSON header, padded with spaces to a multiple of 8 bytes (as
 * the safetensors library writes it, so the data section is aligned). */
static char *shard_header(const struct hf_writer *w, uint32_t shard, size_t *len)
{
    json_t *h = json_object();
    json_object_set_new(h, "__metadata__", json_pack("{s:s}", "format", "pt"));
    for (uint32_t i = 0; i < w->n_items; i++) {
        const struct item *it = &w->items[i];
        if (it->shard != shard)
            continue;
        for (uint32_t k = 0; k < it->n_parts; k++) {
            const struct part *p = &it->parts[k];
            json_t *shape = json_array();
            for (uint32_t d = 0; d < p->rank; d++)
                json_array_append_new(shape, json_integer((json_int_t)p->shape[d]));
            json_object_set_new(h, p->name,
                                json_pack("{s:s, s:o, s:[I, I]}", "dtype", dtype_name(p->dtype), "shape", shape,
                                          "data_offsets", (json_int_t)p->offset, (json_int_t)(p->offset + p->bytes)));
        }
    }
    char *text = json_dumps(h, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(h);
    if (!text)
        return NULL;
    size_t n = strlen(text), padded = (n + 7) / 8 * 8;
    char *out = realloc(text, padded + 1);
    if (!out) {
        free(text);
        return NULL;
    }
    memset(out + n, ' ', padded - n);
    out[padded] = '\0';
    *len = padded;
    return out;
}

static kt_status write_shard(struct hf_writer *w, const char *dir, uint32_t shard, struct written *files,
                             struct kt_progress *progress)
{
    char name[64], path[4096];
    shard_name(name, sizeof name, shard, w->n_shards);
    snprintf(path, sizeof path, "%s/%s", dir, name);
    size_t hlen = 0;
    char *header = shard_header(w, shard, &hlen);
    if (!header)
        return kt_err_set(w->err, KT_ERR_NOMEM, "%s: out of memory for the header", path);
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) {
        free(header);
        return kt_err_set(w->err, KT_ERR_IO, "%s: cannot create: %s", path, strerror(errno));
    }
    kt_status s = remember(files, path, w->err);
    uint64_t data = 0;
    for (uint32_t i = 0; i < w->n_items; i++)
        if (w->items[i].shard == shard)
            data += w->items[i].bytes;
    const uint64_t len64 = hlen, base = 8 + hlen;
    if (s == KT_OK)
        s = write_at(w, fd, path, &len64, 8, 0);
    if (s == KT_OK)
        s = write_at(w, fd, path, header, hlen, 8);
    if (s == KT_OK && ftruncate(fd, (off_t)(base + data)) != 0)
        s = kt_err_set(w->err, KT_ERR_IO, "%s: cannot size to %" PRIu64 " bytes: %s", path, base + data,
                       strerror(errno));
    for (uint32_t i = 0; s == KT_OK && i < w->n_items; i++)
        if (w->items[i].shard == shard)
            s = write_item(w, &w->items[i], fd, path, base, progress);
    if (close(fd) != 0 && s == KT_OK)
        s = kt_err_set(w->err, KT_ERR_IO, "%s: close failed: %s", path, strerror(errno));
    free(header);
    return s;
}

static kt_status write_text(const char *dir, const char *name, const char *text, struct written *files, kt_err *err)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wx");
    if (!f)
        return kt_err_set(err, KT_ERR_IO, "%s: cannot create: %s", path, strerror(errno));
    kt_status s = remember(files, path, err);
    const size_t n = strlen(text);
    if (fwrite(text, 1, n, f) != n && s == KT_OK)
        s = kt_err_set(err, KT_ERR_IO, "%s: write failed: %s", path, strerror(errno));
    if (fclose(f) != 0 && s == KT_OK)
        s = kt_err_set(err, KT_ERR_IO, "%s: write failed: %s", path, strerror(errno));
    return s;
}

static kt_status write_json(const char *dir, const char *name, json_t *j, struct written *files, kt_err *err)
{
    char *text = j ? json_dumps(j, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_ENSURE_ASCII) : NULL;
    json_decref(j);
    if (!text)
        return kt_err_set(err, KT_ERR_NOMEM, "%s: out of memory", name);
    kt_status s = write_text(dir, name, text, files, err);
    free(text);
    return s;
}

static kt_status write_index(const struct hf_writer *w, const char *dir, struct written *files)
{
    json_t *map = json_object();
    for (uint32_t i = 0; i < w->n_items; i++) {
        char name[64];
        shard_name(name, sizeof name, w->items[i].shard, w->n_shards);
        for (uint32_t k = 0; k < w->items[i].n_parts; k++)
            json_object_set_new(map, w->items[i].parts[k].name, json_string(name));
    }
    json_t *j = json_pack("{s:{s:I}, s:o}", "metadata", "total_size", (json_int_t)w->total_bytes, "weight_map", map);
    return write_json(dir, KT_ST_INDEX_FILE, j, files, w->err);
}

/* ---- config.json ----------------------------------------------------------------------------- */

/* The shortest decimal that reads back as v (what the config's number must give as an F32). */
static void shortest(char *out, size_t n, float v)
{
    if (v == floorf(v) && fabsf(v) < 1e9f) { /* whole numbers as the real configs write them: 50000.0 */
        snprintf(out, n, "%.1f", (double)v);
        return;
    }
    for (int digits = 1; digits <= 9; digits++) {
        snprintf(out, n, "%.*g", digits, (double)v);
        if ((float)strtod(out, NULL) == v)
            return;
    }
}

/* mscale_all_dim m such that hf_config's yarn_log_multiplier, (float)(0.1 * m), is v. */
static void mscale_for(char *out, size_t n, float v)
{
    const double m = (double)v / 0.1;
    for (int digits = 1; digits <= 17; digits++) {
        snprintf(out, n, "%.*g", digits, m);
        if ((float)(0.1 * strtod(out, NULL)) == v)
            return;
    }
}

#define INT4_IGNORE                                                                                                \
    "[\"lm_head\", \"re:.*self_attn.*\", \"re:.*shared_experts.*\", \"re:.*mlp\\\\.(gate|up|gate_up|down)_proj.*\"]"

/* config.json: the fields hf_config.c reads (its header comment maps them to
 * the GGUF keys write.c sets), plus the ones the real configs carry. */
static kt_status write_config(const struct hf_writer *w, const char *dir, struct written *files)
{
    const struct kt_synth_plan *p = w->plan;
    const struct kt_synth_config *c = &p->cfg;
    char eps[32], scale[32], theta[32], factor[32], fast[32], slow[32], mscale[32];
    shortest(eps, sizeof eps, c->rms_eps);
    shortest(scale, sizeof scale, c->expert_weights_scale);
    shortest(theta, sizeof theta, c->rope_freq_base);
    shortest(factor, sizeof factor, c->rope_scaling_factor);
    shortest(fast, sizeof fast, c->yarn_beta_fast);
    shortest(slow, sizeof slow, c->yarn_beta_slow);
    mscale_for(mscale, sizeof mscale, c->yarn_log_multiplier);
    json_t *name = json_string(c->name);
    char *name_json = name ? json_dumps(name, JSON_ENCODE_ANY) : NULL;
    json_decref(name);
    const char *quant = "";
    if (w->opt->weights == KT_SYNTH_HF_FP8)
        quant = ",\n  \"quantization_config\": {\"activation_scheme\": \"dynamic\", \"fmt\": \"e4m3\", "
                "\"quant_method\": \"fp8\", \"weight_block_size\": [128, 128]}";
    else if (w->opt->weights == KT_SYNTH_HF_INT4_EXPERTS)
        quant = ",\n  \"quantization_config\": {\"config_groups\": {\"group_0\": {\"input_activations\": null, "
                "\"output_activations\": null, \"targets\": [\"Linear\"], \"weights\": {\"actorder\": null, "
                "\"block_structure\": null, \"dynamic\": false, \"group_size\": 32, \"num_bits\": 4, "
                "\"observer\": \"minmax\", \"observer_kwargs\": {}, \"strategy\": \"group\", \"symmetric\": true, "
                "\"type\": \"int\"}}}, \"format\": \"pack-quantized\", \"ignore\": " INT4_IGNORE ", "
                "\"kv_cache_scheme\": null, \"quant_method\": \"compressed-tensors\", "
                "\"quantization_status\": \"compressed\"}";
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f || !name_json) {
        if (f)
            fclose(f);
        free(text);
        free(name_json);
        return kt_err_set(w->err, KT_ERR_NOMEM, "config.json: out of memory");
    }
    fprintf(f,
            "{\n  \"architectures\": [\"DeepseekV3ForCausalLM\"],\n  \"model_type\": \"%s\",\n"
            "  \"_name_or_path\": %s,\n  \"vocab_size\": %u,\n  \"hidden_size\": %u,\n  \"intermediate_size\": %u,\n"
            "  \"moe_intermediate_size\": %u,\n  \"num_hidden_layers\": %u,\n  \"num_nextn_predict_layers\": 0,\n"
            "  \"num_attention_heads\": %u,\n  \"num_key_value_heads\": %u,\n  \"n_shared_experts\": %u,\n"
            "  \"n_routed_experts\": %u,\n  \"routed_scaling_factor\": %s,\n  \"kv_lora_rank\": %u,\n"
            "  \"q_lora_rank\": %u,\n  \"qk_rope_head_dim\": %u,\n  \"v_head_dim\": %u,\n  \"qk_nope_head_dim\": %u,\n"
            "  \"topk_method\": \"noaux_tc\",\n  \"n_group\": %u,\n  \"topk_group\": %u,\n"
            "  \"num_experts_per_tok\": %u,\n  \"moe_layer_freq\": 1,\n  \"first_k_dense_replace\": %u,\n"
            "  \"norm_topk_prob\": %s,\n  \"scoring_func\": \"%s\",\n  \"hidden_act\": \"silu\",\n"
            "  \"max_position_embeddings\": %u,\n  \"initializer_range\": 0.02,\n  \"rms_norm_eps\": %s,\n"
            "  \"use_cache\": true,\n  \"bos_token_id\": %u,\n  \"eos_token_id\": %u,\n  \"rope_theta\": %s,\n"
            "  \"rope_scaling\": {\"type\": \"yarn\", \"factor\": %s, \"original_max_position_embeddings\": %u,"
            " \"beta_fast\": %s, \"beta_slow\": %s, \"mscale\": %s, \"mscale_all_dim\": %s},\n"
            "  \"attention_bias\": false,\n  \"attention_dropout\": 0.0,\n  \"tie_word_embeddings\": false,\n"
            "  \"torch_dtype\": \"bfloat16\"%s\n}\n",
            c->family == KT_SYNTH_KIMI ? "kimi_k2" : "deepseek_v3", name_json, p->vocab.n_tokens, c->n_embd, c->n_ff,
            c->n_ff_exp, c->n_layer, c->n_head, c->n_head, c->n_expert_shared, c->n_expert, scale, c->kv_lora_rank,
            c->q_lora_rank, c->qk_rope_dim, c->v_head_dim, c->qk_nope_dim, c->n_expert_groups, c->n_group_used,
            c->n_expert_used, p->n_dense_lead, c->expert_weights_norm ? "true" : "false",
            c->gating == 2 ? "sigmoid" : "softmax", c->n_ctx_train, eps, p->vocab.bos_id, p->vocab.eos_id, theta,
            factor, c->rope_orig_ctx, fast, slow, mscale, mscale, quant);
    free(name_json);
    if (fclose(f) != 0) {
        free(text);
        return kt_err_set(w->err, KT_ERR_NOMEM, "config.json: out of memory");
    }
    kt_status s = write_text(dir, "config.json", text, files, w->err);
    free(text);
    return s;
}

/* ---- tokenizer files ----------------------------------------------------------------------- */

/* The vocabulary the GGUF file carries in tokenizer.ggml.* as the family's
 * real checkpoint ships it.
 *
 * DeepSeek: tokenizer.json (tokenizers' format: a byte-level BPE model whose
 * vocab is every token text -> id and whose merges are tokenizer.ggml.merges
 * in rank order; the control tokens (type 3) and user-defined ones (type 4)
 * also as added_tokens, special only for control) and tokenizer_config.json
 * (chat_template, the BOS/EOS/pad token texts, add_bos_token).  The
 * pre-tokenizer is written as byte-level with GPT-2's split pattern; the
 * family's own split (tokenizer.ggml.pre: "deepseek-v3") is named in
 * tokenizer_config.json's "kt_pre_tokenizer", not spelled out.
 *
 * Kimi (like Kimi-K2-Thinking's directory): tiktoken.model, one line per
 * normal token, "base64(its bytes) id" (the id is the tiktoken rank), then
 * tokenizer_config.json with the specials in added_tokens_decoder (the
 * tool-call markers "special": false, as Moonshot's file has them; kt's
 * reader types them all control, as llama.cpp's converter does) and the
 * TikTokenTokenizer fields, and chat_template.jinja (Kimi's repositories
 * ship the template as that file).  The merges are not written: a reader
 * derives them from the ranks. */

static kt_status write_tokenizer_json(const struct kt_synth_plan *plan, const char *dir, struct written *files,
                                      kt_err *err)
{
    const struct kt_synth_vocab *v = &plan->vocab;
    json_t *vocab = json_object(), *merges = json_array(), *added = json_array(), *decoder = json_object();
    for (uint32_t i = 0; i < v->n_tokens; i++) {
        json_object_set_new(vocab, v->tokens[i], json_integer(i));
        const bool control = v->token_types[i] == KT_TOKEN_CONTROL;
        if (!control && v->token_types[i] != KT_TOKEN_USER_DEFINED)
            continue;
        json_t *t = json_pack("{s:I, s:s, s:b, s:b, s:b, s:b, s:b}", "id", (json_int_t)i, "content", v->tokens[i],
                              "single_word", 0, "lstrip", 0, "rstrip", 0, "normalized", !control, "special",
                              control);
        json_array_append(added, t);
        char id[16];
        snprintf(id, sizeof id, "%u", i);
        json_object_set_new(decoder, id, json_deep_copy(t));
        json_object_del(json_object_get(decoder, id), "id");
        json_decref(t);
    }
    for (uint32_t i = 0; i < v->n_merges; i++)
        json_array_append_new(merges, json_string(v->merges[i]));
    json_t *tok = json_pack(
        "{s:s, s:n, s:n, s:o, s:n, s:{s:s, s:b, s:b, s:b}, s:n, s:{s:s, s:b, s:b, s:b},"
        " s:{s:s, s:n, s:n, s:n, s:n, s:b, s:b, s:b, s:o, s:o}}",
        "version", "1.0", "truncation", "padding", "added_tokens", added, "normalizer", "pre_tokenizer", "type",
        "ByteLevel", "add_prefix_space", 0, "trim_offsets", 1, "use_regex", 1, "post_processor", "decoder", "type",
        "ByteLevel", "add_prefix_space", 1, "trim_offsets", 1, "use_regex", 1, "model", "type", "BPE", "dropout",
        "unk_token", "continuing_subword_prefix", "end_of_word_suffix", "fuse_unk", 0, "byte_fallback", 0,
        "ignore_merges", 0, "vocab", vocab, "merges", merges);
    kt_status s = write_json(dir, "tokenizer.json", tok, files, err);
    if (s != KT_OK) {
        json_decref(decoder);
        return s;
    }
    json_t *cfg = json_pack("{s:b, s:b, s:s, s:s, s:o, s:o, s:b, s:I, s:s, s:s, s:s}", "add_bos_token", v->add_bos,
                            "add_eos_token", 0, "bos_token", v->tokens[v->bos_id], "eos_token",
                            v->tokens[v->eos_id], "pad_token",
                            v->pad_id >= 0 ? json_string(v->tokens[v->pad_id]) : json_null(),
                            "added_tokens_decoder", decoder, "clean_up_tokenization_spaces", 0,
                            "model_max_length", (json_int_t)plan->cfg.n_ctx_train, "tokenizer_class",
                            "PreTrainedTokenizerFast", "kt_pre_tokenizer", v->pre, "chat_template",
                            v->chat_template);
    return write_json(dir, "tokenizer_config.json", cfg, files, err);
}

/* The byte GPT-2's bytes_to_unicode maps to code point c (the inverse of
 * vocab.c's table), or -1 if c stands for no byte. */
static int byte_of_code_point(uint32_t c)
{
    if ((c >= 0x21 && c <= 0x7E) || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE && c <= 0xFF))
        return (int)c;
    if (c >= 0x100 && c <= 0x120)
        return (int)(c - 0x100);
    if (c >= 0x121 && c <= 0x142)
        return (int)(c - 0x121 + 0x7F);
    return c == 0x143 ? 0xAD : -1;
}

/* A byte-level token text's bytes as base64 (NUL-terminated at out, room for 4 * strlen(text) / 3 + 5); false if
 * the text is not byte-level. */
static bool token_base64(const char *text, char *out)
{
    static const char alphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    unsigned char bytes[3];
    size_t nb = 0, o = 0;
    for (const unsigned char *p = (const unsigned char *)text; *p || nb > 0;) {
        if (*p) {
            uint32_t c = *p++;
            if (c >= 0x80) { /* the table's code points are all below U+0800: two UTF-8 bytes */
                if ((c & 0xE0) != 0xC0 || (*p & 0xC0) != 0x80)
                    return false;
                c = (c & 0x1F) << 6 | (*p++ & 0x3F);
            }
            const int b = byte_of_code_point(c);
            if (b < 0)
                return false;
            bytes[nb++] = (unsigned char)b;
            if (nb < 3)
                continue;
        }
        const uint32_t w = (uint32_t)bytes[0] << 16 | (nb > 1 ? (uint32_t)bytes[1] << 8 : 0) | (nb > 2 ? bytes[2] : 0);
        out[o++] = alphabet[w >> 18];
        out[o++] = alphabet[(w >> 12) & 63];
        out[o++] = nb > 1 ? alphabet[(w >> 6) & 63] : '=';
        out[o++] = nb > 2 ? alphabet[w & 63] : '=';
        nb = 0;
    }
    out[o] = '\0';
    return o > 0;
}

static bool kimi_tool_marker(const char *text)
{
    return strncmp(text, "<|tool_", 7) == 0;
}

static kt_status write_tiktoken(const struct kt_synth_plan *plan, const char *dir, struct written *files,
                                kt_err *err)
{
    const struct kt_synth_vocab *v = &plan->vocab;
    uint32_t n_ranks = 0;
    while (n_ranks < v->n_tokens && v->token_types[n_ranks] == KT_TOKEN_NORMAL)
        n_ranks++;
    for (uint32_t i = n_ranks; i < v->n_tokens; i++)
        if (v->token_types[i] != KT_TOKEN_CONTROL)
            return kt_err_set(err, KT_ERR_INVALID, "tiktoken.model: token %u is neither a rank nor a special", i);
    char *text = NULL, line[4 * 1024];
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    kt_status s = f ? KT_OK : kt_err_set(err, KT_ERR_NOMEM, "tiktoken.model: out of memory");
    for (uint32_t r = 0; s == KT_OK && r < n_ranks; r++) {
        if (strlen(v->tokens[r]) * 4 / 3 + 5 > sizeof line || !token_base64(v->tokens[r], line))
            s = kt_err_set(err, KT_ERR_INVALID, "tiktoken.model: token %u is no byte-level text", r);
        else
            fprintf(f, "%s %u\n", line, r);
    }
    if (f && fclose(f) != 0 && s == KT_OK)
        s = kt_err_set(err, KT_ERR_NOMEM, "tiktoken.model: out of memory");
    if (s == KT_OK)
        s = write_text(dir, "tiktoken.model", text, files, err);
    free(text);
    if (s != KT_OK)
        return s;

    static const char *const additional[] = {"<|im_end|>", "<|im_user|>", "<|im_assistant|>",
                                             "<|start_header_id|>", "<|end_header_id|>", "[EOT]",
                                             "<|im_system|>", "<|im_middle|>"};
    json_t *decoder = json_object(), *extra = json_array();
    for (uint32_t i = n_ranks; i < v->n_tokens; i++) {
        char id[16];
        snprintf(id, sizeof id, "%u", i);
        json_object_set_new(decoder, id,
                            json_pack("{s:s, s:b, s:b, s:b, s:b, s:b}", "content", v->tokens[i], "lstrip", 0,
                                      "normalized", 0, "rstrip", 0, "single_word", 0, "special",
                                      !kimi_tool_marker(v->tokens[i])));
        for (size_t a = 0; a < sizeof additional / sizeof additional[0]; a++)
            if (strcmp(v->tokens[i], additional[a]) == 0)
                json_array_append_new(extra, json_string(additional[a]));
    }
    int64_t unk = -1;
    for (uint32_t i = n_ranks; i < v->n_tokens; i++)
        if (strcmp(v->tokens[i], "[UNK]") == 0)
            unk = i;
    json_t *cfg = json_pack("{s:o, s:o, s:{s:[s, n]}, s:s, s:b, s:s, s:{}, s:I, s:o, s:s, s:o}",
                            "added_tokens_decoder", decoder, "additional_special_tokens", extra, "auto_map",
                            "AutoTokenizer", "tokenization_kimi.TikTokenTokenizer", "bos_token",
                            v->tokens[v->bos_id], "clean_up_tokenization_spaces", 0, "eos_token",
                            v->tokens[v->eos_id], "extra_special_tokens", "model_max_length",
                            (json_int_t)plan->cfg.n_ctx_train, "pad_token",
                            v->pad_id >= 0 ? json_string(v->tokens[v->pad_id]) : json_null(), "tokenizer_class",
                            "TikTokenTokenizer", "unk_token", unk >= 0 ? json_string(v->tokens[unk]) : json_null());
    if ((s = write_json(dir, "tokenizer_config.json", cfg, files, err)) != KT_OK)
        return s;
    return write_text(dir, "chat_template.jinja", v->chat_template, files, err);
}

static kt_status write_tokenizer(const struct kt_synth_plan *plan, const char *dir, struct written *files,
                                 kt_err *err)
{
    return plan->cfg.family == KT_SYNTH_KIMI ? write_tiktoken(plan, dir, files, err)
                                             : write_tokenizer_json(plan, dir, files, err);
}

/* ---- the directory ------------------------------------------------------------------------- */

kt_status kt_synth_hf_weights_parse(const char *name, enum kt_synth_hf_weights *out, kt_err *err)
{
    static const char *const names[] = {"bf16", "fp8", "int4-experts"};
    for (int i = 0; name && i < 3; i++)
        if (strcmp(name, names[i]) == 0) {
            *out = (enum kt_synth_hf_weights)i;
            return KT_OK;
        }
    return kt_err_set(err, KT_ERR_INVALID, "--hf-weights '%s': give bf16 (every tensor BF16), fp8 (block FP8 like "
                      "DeepSeek-V3) or int4-experts (INT4 routed experts like Kimi-K2-Thinking)", name ? name : "");
}

enum kt_synth_hf_weights kt_synth_hf_default_weights(const struct kt_synth_config *cfg)
{
    return cfg->family == KT_SYNTH_KIMI ? KT_SYNTH_HF_INT4_EXPERTS : KT_SYNTH_HF_FP8;
}

/* A new directory, or an existing empty one (created: set when this call made it). */
static kt_status prepare_dir(const char *dir, bool *created, kt_err *err)
{
    *created = false;
    if (mkdir(dir, 0755) == 0) {
        *created = true;
        return KT_OK;
    }
    if (errno != EEXIST)
        return kt_err_set(err, KT_ERR_IO, "%s: cannot create the directory: %s", dir, strerror(errno));
    DIR *d = opendir(dir);
    if (!d)
        return kt_err_set(err, KT_ERR_INVALID, "%s exists and is not a directory kt-synth can read: %s", dir,
                          strerror(errno));
    const struct dirent *e;
    bool empty = true;
    while (empty && (e = readdir(d)) != NULL)
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0)
            empty = false;
    closedir(d);
    if (!empty)
        return kt_err_set(err, KT_ERR_INVALID, "%s exists and is not empty: kt-synth writes a checkpoint only into a "
                          "new or empty directory (it never mixes its files with others)", dir);
    return KT_OK;
}

static uint64_t widest_in(const struct hf_writer *w)
{
    uint64_t in = 1;
    for (uint32_t i = 0; i < w->n_items; i++)
        if (w->items[i].in > in)
            in = w->items[i].in;
    return in;
}

kt_status kt_synth_hf_size(const struct kt_synth_plan *plan, const struct kt_synth_hf_options *opt,
                           uint64_t *total_bytes, uint32_t *n_shards, kt_err *err)
{
    if (!plan || !opt || opt->shard_bytes == 0)
        return kt_err_set(err, KT_ERR_INVALID, "kt_synth_hf_size: NULL argument or a zero shard size");
    struct hf_writer w = {.plan = plan, .opt = opt, .err = err, .kb_head = -1};
    kt_status s = plan_items(&w);
    if (s == KT_OK) {
        assign_shards(&w);
        *total_bytes = w.total_bytes;
        *n_shards = w.n_shards;
    }
    free(w.items);
    return s;
}

kt_status kt_synth_write_hf(const struct kt_synth_plan *plan, const char *dir, const struct kt_synth_hf_options *opt,
                            struct kt_progress *progress, uint64_t *total_bytes, uint32_t *n_shards, kt_err *err)
{
    if (!plan || !dir || !opt)
        return kt_err_set(err, KT_ERR_INVALID, "kt_synth_write_hf: NULL argument");
    if (opt->shard_bytes == 0)
        return kt_err_set(err, KT_ERR_INVALID, "the shard size must be at least 1 byte");
    struct hf_writer w = {.plan = plan, .opt = opt, .err = err, .kb_head = -1};
    struct written files = {0};
    bool created = false;
    kt_status s = plan_items(&w);
    if (s == KT_OK) {
        assign_shards(&w);
        if (w.n_shards > MAX_FILES - 1)
            s = kt_err_set(err, KT_ERR_INVALID, "%u shards: give a larger shard size", w.n_shards);
    }
    if (s == KT_OK)
        s = prepare_dir(dir, &created, err);
    if (s != KT_OK)
        goto done;
    const uint64_t in = widest_in(&w);
    w.f32 = malloc(STRIPE_ROWS * in * sizeof *w.f32);
    w.bytes = malloc(STRIPE_ROWS * in * 4);
    w.scales = malloc(STRIPE_ROWS * ceil_div(in, INT4_GROUP) * 2 + ceil_div(in, FP8_BLOCK) * 4);
    w.kb = malloc((size_t)plan->cfg.kv_lora_rank * plan->cfg.qk_nope_dim * sizeof *w.kb);
    if (!w.f32 || !w.bytes || !w.scales || !w.kb) {
        s = kt_err_set(err, KT_ERR_NOMEM, "out of memory for row buffers (%" PRIu64 " columns)", in);
        goto done;
    }
    for (uint32_t shard = 0; s == KT_OK && shard < w.n_shards; shard++)
        s = write_shard(&w, dir, shard, &files, progress);
    if (s == KT_OK)
        s = write_index(&w, dir, &files);
    if (s == KT_OK)
        s = write_tokenizer(plan, dir, &files, err);
    if (s == KT_OK) /* last: a directory without config.json is no checkpoint */
        s = write_config(&w, dir, &files);
done:
    if (s != KT_OK) {
        for (uint32_t i = 0; i < files.n; i++)
            unlink(files.paths[i]);
        if (created)
            rmdir(dir);
    } else {
        if (total_bytes)
            *total_bytes = w.total_bytes;
        if (n_shards)
            *n_shards = w.n_shards;
    }
    for (uint32_t i = 0; i < files.n; i++)
        free(files.paths[i]);
    free(files.paths);
    free(w.items);
    free(w.f32);
    free(w.bytes);
    free(w.scales);
    free(w.kb);
    return s;
}
