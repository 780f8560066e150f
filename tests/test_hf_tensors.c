/*
 * test_hf_tensors.c - a checkpoint directory's tensors against its model:
 * kt-synth's tiny model's hyperparameters written as BF16, block-FP8 (like
 * DeepSeek-V3) and INT4-experts (like Kimi-K2-Thinking) checkpoints, with an
 * MTP layer kt does not use; each is matched tensor for tensor and summed by
 * class to the bytes computed here from the shapes; a missing expert matrix,
 * a wrong shape, FP8 weights without scales or in an INT4 checkpoint, a
 * scale grid of the wrong size, an INT4 weight_shape that disagrees and a
 * module stored twice are refused naming the tensor.  kt_model_open given a
 * checkpoint directory opens it as its model.
 *
 * The shards are written sparse (header, then a hole): only headers and
 * weight_shape values are read, never a weight.
 */
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hf_config.h"
#include "hf_tensors.h"
#include "model.h"
#include "safetensors.h"
#include "testlib.h"

enum form { PLAIN, FP8, INT4 };

/* One tensor of the checkpoint being written. */
struct entry {
    char name[160];
    const char *dtype;
    uint64_t shape[2];
    int rank;
    uint64_t bytes;
    int64_t value[2]; /* weight_shape's values */
};

struct ckpt {
    struct entry *e;
    size_t n, cap;
    uint64_t class_bytes[KT_CLASS_COUNT];
    /* the change a refusal case makes */
    const char *drop;      /* a tensor left out */
    const char *reshape;   /* a tensor given one more row */
    int64_t shape_value;   /* != 0: every weight_shape's first value */
};

static uint64_t ceil_div(uint64_t a, uint64_t b)
{
    return (a + b - 1) / b;
}

static void put(struct ckpt *c, enum kt_tensor_class cls, const char *name, const char *dtype, int bits, int rank,
                uint64_t a, uint64_t b)
{
    if (c->drop && strcmp(name, c->drop) == 0)
        return;
    if (c->n == c->cap) {
        c->cap = c->cap ? 2 * c->cap : 256;
        c->e = realloc(c->e, c->cap * sizeof *c->e);
        KT_CHECK(c->e != NULL, "out of memory");
    }
    struct entry *e = &c->e[c->n++];
    memset(e, 0, sizeof *e);
    snprintf(e->name, sizeof e->name, "%s", name);
    e->dtype = dtype, e->rank = rank;
    e->shape[0] = a + (c->reshape && strcmp(name, c->reshape) == 0), e->shape[1] = rank == 2 ? b : 0;
    e->bytes = e->shape[0] * (rank == 2 ? b : 1) * (uint64_t)bits / 8;
    if ((int)cls >= 0)
        c->class_bytes[cls] += e->bytes;
}

static void linear(struct ckpt *c, enum kt_tensor_class cls, enum form f, const char *module, uint64_t out, uint64_t in)
{
    char n[320];
    if (f == PLAIN) {
        snprintf(n, sizeof n, "%s.weight", module);
        put(c, cls, n, "BF16", 16, 2, out, in);
    } else if (f == FP8) {
        snprintf(n, sizeof n, "%s.weight", module);
        put(c, cls, n, "F8_E4M3", 8, 2, out, in);
        snprintf(n, sizeof n, "%s.weight_scale_inv", module);
        put(c, cls, n, "F32", 32, 2, ceil_div(out, 128), ceil_div(in, 128));
    } else {
        snprintf(n, sizeof n, "%s.weight_packed", module);
        put(c, cls, n, "I32", 32, 2, out, ceil_div(in, 8));
        snprintf(n, sizeof n, "%s.weight_scale", module);
        put(c, cls, n, "BF16", 16, 2, out, ceil_div(in, 32));
        snprintf(n, sizeof n, "%s.weight_shape", module);
        put(c, cls, n, "I64", 64, 1, 2, 0);
        if (c->n && strcmp(c->e[c->n - 1].name, n) == 0) {
            c->e[c->n - 1].value[0] = c->shape_value ? c->shape_value : (int64_t)out;
            c->e[c->n - 1].value[1] = (int64_t)in;
        }
    }
}

static void vec(struct ckpt *c, enum kt_tensor_class cls, const char *name, const char *dtype, uint64_t n)
{
    put(c, cls, name, dtype, strcmp(dtype, "F32") == 0 ? 32 : 16, 1, n, 0);
}

/* The tensors of a model of hp: attention and the rest in `dense_form`, routed experts in `expert_form`. */
static void describe(struct ckpt *c, const struct kt_hparams *hp, enum form dense_form, enum form expert_form)
{
    const uint64_t E = hp->n_embd, H = hp->n_head, qr = hp->q_lora_rank, kvr = hp->kv_lora_rank;
    const uint64_t dn = hp->qk_nope_dim, dr = hp->qk_rope_dim, dv = hp->v_head_dim, V = hp->n_vocab;
    const enum kt_tensor_class A = KT_CLASS_ATTENTION;
    put(c, KT_CLASS_EMBED_OUTPUT, "model.embed_tokens.weight", "BF16", 16, 2, V, E);
    vec(c, KT_CLASS_EMBED_OUTPUT, "model.norm.weight", "BF16", E);
    linear(c, KT_CLASS_EMBED_OUTPUT, PLAIN, "lm_head", V, E);
    char p[300];
    for (uint32_t il = 0; il < hp->n_layer; il++) {
#define M(fmt, ...) (snprintf(p, sizeof p, "model.layers.%u." fmt, il, __VA_ARGS__), p)
        vec(c, A, M("%s", "input_layernorm.weight"), "BF16", E);
        linear(c, A, dense_form, M("%s", "self_attn.q_a_proj"), qr, E);
        vec(c, A, M("%s", "self_attn.q_a_layernorm.weight"), "BF16", qr);
        linear(c, A, dense_form, M("%s", "self_attn.q_b_proj"), H * (dn + dr), qr);
        linear(c, A, dense_form, M("%s", "self_attn.kv_a_proj_with_mqa"), kvr + dr, E);
        vec(c, A, M("%s", "self_attn.kv_a_layernorm.weight"), "BF16", kvr);
        linear(c, A, dense_form, M("%s", "self_attn.kv_b_proj"), H * (dn + dv), kvr);
        linear(c, A, dense_form, M("%s", "self_attn.o_proj"), E, H * dv);
        vec(c, KT_CLASS_DENSE_FFN, M("%s", "post_attention_layernorm.weight"), "BF16", E);
        if (il < hp->n_dense_lead) {
            linear(c, KT_CLASS_DENSE_FFN, dense_form, M("%s", "mlp.gate_proj"), hp->n_ff, E);
            linear(c, KT_CLASS_DENSE_FFN, dense_form, M("%s", "mlp.up_proj"), hp->n_ff, E);
            linear(c, KT_CLASS_DENSE_FFN, dense_form, M("%s", "mlp.down_proj"), E, hp->n_ff);
            continue;
        }
        const uint64_t f = hp->n_ff_exp, Fs = f * hp->n_expert_shared;
        put(c, KT_CLASS_ROUTER, M("%s", "mlp.gate.weight"), "BF16", 16, 2, hp->n_expert, E);
        vec(c, KT_CLASS_ROUTER, M("%s", "mlp.gate.e_score_correction_bias"), "F32", hp->n_expert);
        for (uint32_t x = 0; x < hp->n_expert; x++) {
            linear(c, KT_CLASS_ROUTED_EXPERTS, expert_form, M("mlp.experts.%u.gate_proj", x), f, E);
            linear(c, KT_CLASS_ROUTED_EXPERTS, expert_form, M("mlp.experts.%u.up_proj", x), f, E);
            linear(c, KT_CLASS_ROUTED_EXPERTS, expert_form, M("mlp.experts.%u.down_proj", x), E, f);
        }
        linear(c, KT_CLASS_SHARED_EXPERTS, dense_form, M("%s", "mlp.shared_experts.gate_proj"), Fs, E);
        linear(c, KT_CLASS_SHARED_EXPERTS, dense_form, M("%s", "mlp.shared_experts.up_proj"), Fs, E);
        linear(c, KT_CLASS_SHARED_EXPERTS, dense_form, M("%s", "mlp.shared_experts.down_proj"), E, Fs);
#undef M
    }
    /* the MTP layer DeepSeek-V3 ships after the last: kt does not use it */
    snprintf(p, sizeof p, "model.layers.%u.eh_proj.weight", hp->n_layer);
    put(c, (enum kt_tensor_class)-1, p, "BF16", 16, 2, E, 2 * E);
}

/* Writes the entries as two shards and an index into dir (sparse data). */
static bool write_ckpt(const char *dir, const struct ckpt *c)
{
    mkdir(dir, 0755);
    json_t *map = json_object();
    bool ok = true;
    for (int s = 0; s < 2 && ok; s++) {
        json_t *header = json_object();
        uint64_t at = 0;
        for (size_t i = (size_t)s; i < c->n; i += 2) {
            const struct entry *e = &c->e[i];
            json_t *shape = json_array();
            for (int d = 0; d < e->rank; d++)
                json_array_append_new(shape, json_integer((json_int_t)e->shape[d]));
            json_object_set_new(header, e->name, json_pack("{s:s, s:o, s:[I, I]}", "dtype", e->dtype, "shape", shape,
                                                           "data_offsets", (json_int_t)at,
                                                           (json_int_t)(at + e->bytes)));
            at += e->bytes;
            char shard[48];
            snprintf(shard, sizeof shard, "model-0000%d-of-00002.safetensors", s + 1);
            json_object_set_new(map, e->name, json_string(shard));
        }
        char *text = json_dumps(header, JSON_COMPACT);
        char path[1200];
        snprintf(path, sizeof path, "%s/model-0000%d-of-00002.safetensors", dir, s + 1);
        int fd = open(path, O_CREAT | O_TRUNC | O_WRONLY, 0644);
        const uint64_t len = strlen(text);
        ok = fd >= 0 && write(fd, &len, 8) == 8 && write(fd, text, len) == (ssize_t)len &&
             ftruncate(fd, (off_t)(8 + len + at)) == 0;
        /* weight_shape values: the only data anything reads */
        uint64_t off = 0;
        for (size_t i = (size_t)s; ok && i < c->n; i += 2) {
            const struct entry *e = &c->e[i];
            if (e->value[1])
                ok = pwrite(fd, e->value, 16, (off_t)(8 + len + off)) == 16;
            off += e->bytes;
        }
        if (fd >= 0)
            close(fd);
        free(text);
        json_decref(header);
    }
    json_t *root = json_pack("{s:{}, s:o}", "metadata", "weight_map", map); /* takes map */
    char *index = root ? json_dumps(root, JSON_COMPACT) : NULL;
    json_decref(root);
    char path[1200];
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    FILE *f = fopen(path, "w");
    ok = ok && index && f && fputs(index, f) >= 0;
    if (f)
        ok = fclose(f) == 0 && ok;
    free(index);
    return ok;
}

static void remove_ckpt(const char *dir)
{
    char path[1200];
    for (int s = 1; s <= 2; s++) {
        snprintf(path, sizeof path, "%s/model-0000%d-of-00002.safetensors", dir, s);
        unlink(path);
    }
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    unlink(path);
    rmdir(dir);
}

static struct kt_hparams g_hp;

static bool tiny_hparams(void)
{
    const char *path = kt_test_path("hf-tensors.gguf");
    struct kt_model *m = NULL;
    kt_err err = {0};
    bool ok = kt_test_system("%s --preset tiny --header-only -o %s >/dev/null 2>&1", kt_test_tool("kt-synth"),
                             path) == 0 &&
              kt_model_open(path, &m, &err) == KT_OK;
    KT_CHECK(ok, "tiny model: %s", err.msg);
    if (ok)
        g_hp = m->hp;
    kt_model_close(m);
    unlink(path);
    return ok;
}

/* Writes the checkpoint of c, runs the inventory under q; the status and inventory. */
static kt_status inventory(struct ckpt *c, const struct kt_hf_quant *q, struct kt_hf_inventory *inv, kt_err *err)
{
    const char *dir = kt_test_path("hf-ckpt");
    kt_status st = KT_ERR_IO;
    struct kt_st_dir *d = NULL;
    if (!write_ckpt(dir, c))
        kt_err_set(err, KT_ERR_IO, "could not write %s", dir);
    else if ((st = kt_st_open_dir(dir, &d, err)) == KT_OK)
        st = kt_hf_inventory(d, &g_hp, q, inv, err);
    kt_st_close(d);
    remove_ckpt(dir);
    return st;
}

static const struct kt_hf_quant q_plain = {.format = KT_HF_WEIGHTS_PLAIN};
static const struct kt_hf_quant q_fp8 = {.format = KT_HF_WEIGHTS_FP8_BLOCK, .block_rows = 128, .block_cols = 128};
static const struct kt_hf_quant q_int4 = {.format = KT_HF_WEIGHTS_INT4_GROUP, .group_size = 32};

static void checkpoints_are_matched_and_summed_by_class(void)
{
    static const struct {
        const char *what;
        enum form dense, experts;
        const struct kt_hf_quant *q;
    } kinds[] = {
        {"BF16", PLAIN, PLAIN, &q_plain},
        {"block FP8 (DeepSeek-V3)", FP8, FP8, &q_fp8},
        {"INT4 experts (Kimi-K2-Thinking)", PLAIN, INT4, &q_int4},
    };
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
        struct ckpt c = {0};
        describe(&c, &g_hp, kinds[k].dense, kinds[k].experts);
        struct kt_hf_inventory inv;
        kt_err err = {0};
        kt_status st = inventory(&c, kinds[k].q, &inv, &err);
        KT_CHECK(st == KT_OK, "%s: %s", kinds[k].what, err.msg);
        for (int cls = 0; st == KT_OK && cls < KT_CLASS_COUNT; cls++)
            KT_CHECK(inv.class_bytes[cls] == c.class_bytes[cls], "%s: class %s: %llu bytes, the shapes say %llu",
                     kinds[k].what, kt_tensor_class_name((enum kt_tensor_class)cls),
                     (unsigned long long)inv.class_bytes[cls], (unsigned long long)c.class_bytes[cls]);
        const uint32_t moe = g_hp.n_layer - g_hp.n_dense_lead;
        const uint32_t experts = 3 * moe * g_hp.n_expert;
        const uint32_t others = 1 + 5 * g_hp.n_layer + 3 * g_hp.n_dense_lead + 3 * moe;
        KT_CHECK(st != KT_OK || (inv.n_unused == 1 && inv.unused_bytes == 2ull * 2 * g_hp.n_embd * g_hp.n_embd &&
                                 inv.n_used + inv.n_unused == c.n &&
                                 inv.class_linears[KT_CLASS_ROUTED_EXPERTS] == experts &&
                                 inv.stored_linears[kinds[k].experts == INT4 ? KT_HF_STORED_INT4
                                                    : kinds[k].experts == FP8 ? KT_HF_STORED_FP8
                                                                              : KT_HF_STORED_PLAIN] >= experts &&
                                 inv.stored_linears[0] + inv.stored_linears[1] + inv.stored_linears[2] ==
                                     experts + others),
                 "%s: used %llu unused %llu (%llu bytes) of %zu; expert linears %u; stored %u/%u/%u", kinds[k].what,
                 (unsigned long long)inv.n_used, (unsigned long long)inv.n_unused,
                 (unsigned long long)inv.unused_bytes, c.n, inv.class_linears[KT_CLASS_ROUTED_EXPERTS],
                 inv.stored_linears[0], inv.stored_linears[1], inv.stored_linears[2]);
        free(c.e);
    }
}

static void bad_checkpoints_are_refused_naming_the_tensor(void)
{
    static const struct {
        enum form dense, experts;
        const struct kt_hf_quant *q;
        const char *drop, *reshape;
        int64_t shape_value;
        kt_status st;
        const char *says;
    } cases[] = {
        {PLAIN, PLAIN, &q_plain, "model.layers.2.mlp.experts.5.down_proj.weight", NULL, 0, KT_ERR_NOT_FOUND,
         "model.layers.2.mlp.experts.5.down_proj.weight: missing"},
        {PLAIN, PLAIN, &q_plain, NULL, "model.layers.1.self_attn.o_proj.weight", 0, KT_ERR_FORMAT,
         "model.layers.1.self_attn.o_proj.weight: expected a (out, in) matrix"},
        {PLAIN, PLAIN, &q_plain, "model.norm.weight", NULL, 0, KT_ERR_NOT_FOUND, "model.norm.weight: missing"},
        {FP8, FP8, &q_int4, NULL, NULL, 0, KT_ERR_FORMAT, "F8_E4M3 in a checkpoint whose quantization_config says "
                                                          "compressed-tensors INT4"},
        {FP8, FP8, &q_fp8, "model.layers.0.self_attn.q_b_proj.weight_scale_inv", NULL, 0, KT_ERR_NOT_FOUND,
         "model.layers.0.self_attn.q_b_proj.weight_scale_inv: missing"},
        {FP8, FP8, &q_fp8, NULL, "model.layers.3.mlp.experts.0.up_proj.weight_scale_inv", 0, KT_ERR_FORMAT,
         "up_proj.weight_scale_inv: expected F32 block scales"},
        {PLAIN, INT4, &q_fp8, NULL, NULL, 0, KT_ERR_FORMAT, "INT4 pack-quantized parts in a checkpoint whose "
                                                            "quantization_config says block FP8"},
        {PLAIN, INT4, &q_int4, NULL, NULL, 7, KT_ERR_FORMAT, "weight_shape: expected the two integers"},
        {PLAIN, INT4, &q_int4, "model.layers.1.mlp.experts.0.gate_proj.weight_scale", NULL, 0, KT_ERR_NOT_FOUND,
         "model.layers.1.mlp.experts.0.gate_proj.weight_scale: missing"},
        {PLAIN, INT4, &q_int4, NULL, "model.layers.1.mlp.experts.3.down_proj.weight_packed", 0, KT_ERR_FORMAT,
         "model.layers.1.mlp.experts.3.down_proj.weight_packed: expected I32"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct ckpt c = {.drop = cases[i].drop, .reshape = cases[i].reshape, .shape_value = cases[i].shape_value};
        describe(&c, &g_hp, cases[i].dense, cases[i].experts);
        struct kt_hf_inventory inv;
        kt_err err = {0};
        kt_status st = inventory(&c, cases[i].q, &inv, &err);
        KT_CHECK(st == cases[i].st && strstr(err.msg, cases[i].says), "case %zu: status %d, \"%s\"", i, (int)st,
                 err.msg);
        free(c.e);
    }
    /* one module stored twice: as a plain weight and as INT4 parts */
    struct ckpt c = {0};
    describe(&c, &g_hp, PLAIN, INT4);
    put(&c, KT_CLASS_ROUTED_EXPERTS, "model.layers.1.mlp.experts.0.gate_proj.weight", "BF16", 16, 2, g_hp.n_ff_exp,
        g_hp.n_embd);
    struct kt_hf_inventory inv;
    kt_err err = {0};
    kt_status st = inventory(&c, &q_int4, &inv, &err);
    KT_CHECK(st == KT_ERR_FORMAT && strstr(err.msg, "both weight and weight_packed"), "status %d, \"%s\"", (int)st,
             err.msg);
    free(c.e);
}

/* kt_model_open on a directory: a checkpoint opens as a model of its
 * config's shape (its table built from headers: test_hf_model loads and runs
 * one); another directory says what it lacks. */
static void a_model_path_that_is_a_checkpoint_opens_as_its_model(void)
{
    char dir[1024];
    snprintf(dir, sizeof dir, "%s", kt_test_path("hf-describe"));
    kt_test_system("rm -rf '%s'", dir);
    KT_CHECK(kt_test_system("%s --preset tiny --format hf --hf-weights int4-experts -q -o '%s' >/dev/null 2>&1",
                            kt_test_tool("kt-synth"), dir) == 0,
             "kt-synth --format hf");
    struct kt_model *m = NULL;
    kt_err err = {0};
    KT_CHECK(kt_model_open(dir, &m, &err) == KT_OK && m && m->hp.n_layer == 4 && m->hp.n_expert == 32 &&
                 m->hp.n_expert_used == 8 && kt_model_experts_streamed(m),
             "%s", err.msg);
    kt_model_close(m);
    m = NULL;
    kt_test_system("rm -rf '%s'", dir);
    mkdir(dir, 0755);
    KT_CHECK(kt_model_open(dir, &m, &err) != KT_OK && !m && strstr(err.msg, dir) && strstr(err.msg, "config.json"),
             "an empty directory: %s", err.msg);
    rmdir(dir);
}

int main(void)
{
    if (tiny_hparams()) {
        KT_RUN(checkpoints_are_matched_and_summed_by_class);
        KT_RUN(bad_checkpoints_are_refused_naming_the_tensor);
        KT_RUN(a_model_path_that_is_a_checkpoint_opens_as_its_model);
    }
    return kt_test_finish();
}
