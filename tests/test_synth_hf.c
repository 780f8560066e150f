/*
 * test_synth_hf.c - kt-synth --format hf writes the model of its GGUF file
 * (same preset, same seed) as a Hugging Face checkpoint kt's readers accept:
 * config.json gives the GGUF's hyperparameters, the tensors are those
 * hf_tensors.c expects with the bytes their shapes imply, and the stored
 * values decode to the GGUF's F32 values: BF16 exactly rounded, FP8 and INT4
 * equal to re-encoding them and within the formats' error bounds, the fused
 * kv_b_proj equal to what attn_k_b / attn_v_b hold.  The tokenizer files
 * are the family's: Kimi's tiktoken.model (each line the base64 of a normal
 * token's bytes and its id, decoded here with this file's own base64 and
 * GPT-2 byte table), tokenizer_config.json with the specials and
 * chat_template.jinja, like Kimi-K2-Thinking's directory; DeepSeek's
 * tokenizer.json and tokenizer_config.json.  A non-empty output directory and
 * unknown --hf-weights values are refused.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gguf.h"
#include "hf_config.h"
#include "hf_formats.h"
#include "hf_tensors.h"
#include "model.h"
#include "quant.h"
#include "safetensors.h"
#include "testlib.h"

static struct kt_gguf *gguf; /* the tiny preset's all-F32 GGUF, seed 1 */
static struct kt_hparams ghp;

static uint64_t cdiv(uint64_t a, uint64_t b)
{
    return (a + b - 1) / b;
}

/* Row `row` (counted over ne1*ne2) of an F32 GGUF tensor. */
static const float *gguf_row(const char *name, uint64_t row)
{
    const struct kt_gguf_tensor *t = kt_gguf_find_tensor(gguf, name);
    return t && t->type == KT_TYPE_F32 ? (const float *)t->data + row * (uint64_t)t->ne[0] : NULL;
}

static bool open_gguf(void)
{
    if (gguf)
        return true;
    const char *path = kt_test_path("synth-hf.gguf");
    kt_err err = {0};
    if (kt_test_system("%s --preset tiny -q -o %s >/dev/null 2>&1", kt_test_tool("kt-synth"), path) != 0 ||
        kt_gguf_open(path, &gguf, &err) != KT_OK || kt_hparams_read(gguf, &ghp, &err) != KT_OK) {
        KT_CHECK(false, "the tiny GGUF: %s", err.msg);
        return false;
    }
    unlink(path); /* the mapping stays */
    return true;
}

/* kt-synth --preset preset --format hf EXTRA -o a fresh directory; NULL (after a failed check) if it fails. */
static const char *write_hf(const char *preset, const char *extra)
{
    const char *dir = kt_test_path("synth-hf-dir");
    int rc = kt_test_system("%s --preset %s --format hf %s -q -o %s >/dev/null", kt_test_tool("kt-synth"), preset,
                            extra, dir);
    KT_CHECK(rc == 0, "kt-synth --preset %s --format hf %s: exit %d", preset, extra, rc);
    return rc == 0 ? dir : NULL;
}

static void remove_dir(const char *dir)
{
    kt_test_system("rm -rf '%s'", dir);
}

/* ---- what each stored form must hold -------------------------------------------------- */

static uint64_t stored_bytes(enum kt_hf_stored s, uint64_t out, uint64_t in)
{
    switch (s) {
    case KT_HF_STORED_PLAIN: return out * in * 2; /* BF16 */
    case KT_HF_STORED_FP8: return out * in + cdiv(out, 128) * cdiv(in, 128) * 4;
    case KT_HF_STORED_INT4: return out * cdiv(in, 8) * 4 + out * cdiv(in, 32) * 2 + 16; /* + weight_shape */
    }
    return 0;
}

/* Decodes the module's stored (out x in) matrix and compares it with want
 * (the GGUF's F32 values), as its stored form demands. */
static void check_values(const struct kt_st_dir *d, const struct kt_hf_quant *q, const char *module, uint64_t out,
                         uint64_t in, const float *want, enum kt_hf_stored expect_stored)
{
    struct kt_hf_linear lin;
    kt_err err = {0};
    if (kt_hf_find_linear(d, q, module, out, in, &lin, &err) != KT_OK) {
        KT_CHECK(false, "%s: %s", module, err.msg);
        return;
    }
    KT_CHECK(lin.stored == expect_stored, "%s: stored as %d, want %d", module, lin.stored, expect_stored);
    float *row = kt_test_xmalloc(in * sizeof *row);
    /* FP8: each 128 x 128 block's scale from the GGUF values, max |w| / 448 (1 for an all-zero block) */
    const uint64_t bcols = cdiv(in, 128);
    float *bscale = kt_test_xmalloc(cdiv(out, 128) * bcols * sizeof *bscale);
    for (uint64_t b = 0; b < cdiv(out, 128) * bcols; b++) {
        float amax = 0;
        for (uint64_t i = b / bcols * 128; i < out && i < b / bcols * 128 + 128; i++)
            for (uint64_t j = b % bcols * 128; j < in && j < b % bcols * 128 + 128; j++)
                amax = fmaxf(amax, fabsf(want[i * in + j]));
        bscale[b] = amax > 0 ? amax / 448.0f : 1.0f;
    }
    int bad = 0;
    for (uint64_t r = 0; r < out; r++) {
        const float *w = want + r * in;
        switch (lin.stored) {
        case KT_HF_STORED_PLAIN:
            kt_bf16_row_to_f32(lin.weight->data, (int64_t)in, (int64_t)r, row);
            for (uint64_t c = 0; c < in; c++)
                if (row[c] != kt_bf16_to_fp32(kt_fp32_to_bf16(w[c])) && bad++ < 3)
                    KT_CHECK(false, "%s[%llu][%llu]: %g, want BF16 of %g", module, (unsigned long long)r,
                             (unsigned long long)c, (double)row[c], (double)w[c]);
            break;
        case KT_HF_STORED_FP8: {
            kt_fp8_block_row_to_f32(lin.weight->data, lin.scale->data, (int64_t)in, 128, 128, (int64_t)r, row);
            const uint8_t *codes = (const uint8_t *)lin.weight->data + r * in;
            for (uint64_t c = 0; c < in; c++) {
                const float s = bscale[r / 128 * bcols + c / 128];
                float stored;
                memcpy(&stored, (const uint8_t *)lin.scale->data + (r / 128 * bcols + c / 128) * 4, 4);
                const double bound = s * fmax(fabs((double)w[c] / s) / 16, 0x1p-10) + fabs((double)w[c]) * 0x1p-22;
                if ((stored != s || codes[c] != kt_f32_to_fp8_e4m3(w[c] / s) || fabs((double)row[c] - w[c]) > bound) &&
                    bad++ < 3)
                    KT_CHECK(false, "%s[%llu][%llu]: code 0x%02x scale %g decodes to %g; want code 0x%02x scale %g, "
                             "|error| <= %g of %g", module, (unsigned long long)r, (unsigned long long)c, codes[c],
                             (double)stored, (double)row[c], kt_f32_to_fp8_e4m3(w[c] / s), (double)s, bound,
                             (double)w[c]);
            }
            break;
        }
        case KT_HF_STORED_INT4: {
            kt_int4_pack_row_to_f32(lin.weight->data, lin.scale->data, (int64_t)in, 32, (int64_t)r, row);
            for (uint64_t c = 0; c < in; c++) {
                float amax = 0;
                for (uint64_t j = c / 32 * 32; j < in && j < c / 32 * 32 + 32; j++)
                    amax = fmaxf(amax, fabsf(w[j]));
                const float s = kt_bf16_to_fp32(kt_fp32_to_bf16(amax / 7.0f));
                const float qv = s > 0 ? fminf(fmaxf(nearbyintf(w[c] / s), -8.0f), 7.0f) : 0.0f;
                if ((row[c] != qv * s || fabs((double)row[c] - w[c]) > s / 2.0 * (1 + 0x1p-20)) && bad++ < 3)
                    KT_CHECK(false, "%s[%llu][%llu]: %g, want %g x %g (of %g, within half a scale)", module,
                             (unsigned long long)r, (unsigned long long)c, (double)row[c], (double)qv, (double)s,
                             (double)w[c]);
            }
            break;
        }
        }
    }
    KT_CHECK(bad == 0, "%s: %d values differ", module, bad);
    free(bscale);
    free(row);
}

/* rows row0 .. row0+out-1 of a GGUF tensor, out x in */
static float *gguf_matrix(const char *name, uint64_t row0, uint64_t out, uint64_t in)
{
    float *m = kt_test_xmalloc(out * in * sizeof *m);
    for (uint64_t r = 0; r < out; r++) {
        const float *src = gguf_row(name, row0 + r);
        if (!src) {
            KT_CHECK(false, "%s: no F32 row %llu in the GGUF", name, (unsigned long long)(row0 + r));
            free(m);
            return NULL;
        }
        memcpy(m + r * in, src, in * sizeof *m);
    }
    return m;
}

/* ---- one directory ------------------------------------------------------------------------- */

static void check_directory(const char *mode, enum kt_hf_weight_format format, enum kt_hf_stored dense,
                            enum kt_hf_stored experts, const char *extra)
{
    if (!open_gguf())
        return;
    char opts[128];
    snprintf(opts, sizeof opts, "--hf-weights %s %s", mode, extra);
    const char *dir = write_hf("tiny", opts);
    if (!dir)
        return;
    kt_err err = {0};
    struct kt_gguf *meta = NULL;
    struct kt_hf_quant q;
    struct kt_hparams hp;
    struct kt_st_dir *d = NULL;
    if (kt_hf_config_read(dir, &meta, &q, &err) != KT_OK || kt_hparams_read(meta, &hp, &err) != KT_OK ||
        kt_st_open_dir(dir, &d, &err) != KT_OK) {
        KT_CHECK(false, "%s: %s", mode, err.msg);
        goto done;
    }
    /* the directory's MLA is fused (one kv_b_proj): the head-count of KV and mla_split differ by design */
    hp.n_head_kv = ghp.n_head_kv, hp.mla_split = ghp.mla_split;
    KT_CHECK(memcmp(&hp, &ghp, sizeof hp) == 0, "%s: config.json's hyperparameters differ from the GGUF's", mode);
    KT_CHECK(q.format == format, "%s: quantization %d, want %d", mode, q.format, format);
    if (format == KT_HF_WEIGHTS_FP8_BLOCK)
        KT_CHECK(q.block_rows == 128 && q.block_cols == 128, "fp8 blocks %u x %u", q.block_rows, q.block_cols);
    if (format == KT_HF_WEIGHTS_INT4_GROUP)
        KT_CHECK(q.group_size == 32 && q.n_ignore == 4 && strcmp(q.ignore[0], "lm_head") == 0,
                 "int4: group %u, %u ignored", q.group_size, q.n_ignore);

    struct kt_hf_inventory inv;
    if (kt_hf_inventory(d, &hp, &q, &inv, &err) != KT_OK) {
        KT_CHECK(false, "%s: inventory: %s", mode, err.msg);
        goto done;
    }
    const uint64_t E = hp.n_embd, V = hp.n_vocab, H = hp.n_head, qr = hp.q_lora_rank, kvr = hp.kv_lora_rank;
    const uint64_t dn = hp.qk_nope_dim, dr = hp.qk_rope_dim, dv = hp.v_head_dim, F = hp.n_ff, f = hp.n_ff_exp;
    const uint64_t Ne = hp.n_expert, Fs = f * hp.n_expert_shared, L = hp.n_layer, Ld = hp.n_dense_lead;
    uint64_t want[KT_CLASS_COUNT] = {0};
    want[KT_CLASS_EMBED_OUTPUT] = 2 * V * E * 2 + E * 2;
    want[KT_CLASS_ATTENTION] =
        L * (E * 2 + qr * 2 + kvr * 2 + stored_bytes(dense, qr, E) + stored_bytes(dense, H * (dn + dr), qr) +
             stored_bytes(dense, kvr + dr, E) + stored_bytes(dense, H * (dn + dv), kvr) +
             stored_bytes(dense, E, H * dv));
    want[KT_CLASS_DENSE_FFN] = L * E * 2 + Ld * (2 * stored_bytes(dense, F, E) + stored_bytes(dense, E, F));
    want[KT_CLASS_ROUTER] = (L - Ld) * (Ne * E * 2 + Ne * 4);
    want[KT_CLASS_SHARED_EXPERTS] = (L - Ld) * (2 * stored_bytes(dense, Fs, E) + stored_bytes(dense, E, Fs));
    want[KT_CLASS_ROUTED_EXPERTS] = (L - Ld) * Ne * (2 * stored_bytes(experts, f, E) + stored_bytes(experts, E, f));
    for (int c = 0; c < KT_CLASS_COUNT; c++)
        KT_CHECK(inv.class_bytes[c] == want[c], "%s: class %d holds %llu bytes, its shapes %llu", mode, c,
                 (unsigned long long)inv.class_bytes[c], (unsigned long long)want[c]);
    KT_CHECK(inv.n_unused == 0 && inv.unused_bytes == 0, "%s: %llu tensors nobody uses", mode,
             (unsigned long long)inv.n_unused);

    /* values: an attention matrix, the fused kv_b_proj, an expert's down_proj, the router and its bias */
    float *m = gguf_matrix("blk.1.attn_q_b.weight", 0, H * (dn + dr), qr);
    if (m)
        check_values(d, &q, "model.layers.1.self_attn.q_b_proj", H * (dn + dr), qr, m, dense);
    free(m);
    m = gguf_matrix("blk.2.ffn_down_exps.weight", 5 * E, E, f); /* expert 5: rows 5E .. 6E-1 */
    if (m)
        check_values(d, &q, "model.layers.2.mlp.experts.5.down_proj", E, f, m, experts);
    free(m);
    struct kt_hf_quant plain = {.format = KT_HF_WEIGHTS_PLAIN};
    m = gguf_matrix("blk.3.ffn_gate_inp.weight", 0, Ne, E);
    if (m)
        check_values(d, &plain, "model.layers.3.mlp.gate", Ne, E, m, KT_HF_STORED_PLAIN);
    free(m);
    const struct kt_st_tensor *bias = kt_st_find(d, "model.layers.3.mlp.gate.e_score_correction_bias");
    const float *gb = gguf_row("blk.3.exp_probs_b.bias", 0);
    KT_CHECK(bias && gb && bias->dtype == KT_ST_F32 && bias->numel == Ne && memcmp(bias->data, gb, Ne * 4) == 0,
             "%s: e_score_correction_bias is not exp_probs_b's F32 values", mode);
    /* kv_b_proj row h*(dn+dv) + i, column c: attn_k_b[h][c][i] (i < dn), attn_v_b[h][i-dn][c] */
    m = kt_test_xmalloc(H * (dn + dv) * kvr * sizeof *m);
    bool have = true;
    for (uint64_t h = 0; h < H; h++)
        for (uint64_t i = 0; i < dn + dv; i++)
            for (uint64_t c = 0; c < kvr; c++) {
                const float *src = i < dn ? gguf_row("blk.0.attn_k_b.weight", h * kvr + c)
                                          : gguf_row("blk.0.attn_v_b.weight", h * dv + (i - dn));
                if (!src) {
                    have = false;
                    continue;
                }
                m[(h * (dn + dv) + i) * kvr + c] = i < dn ? src[i] : src[c];
            }
    KT_CHECK(have, "the GGUF lacks F32 attn_k_b / attn_v_b");
    if (have)
        check_values(d, &q, "model.layers.0.self_attn.kv_b_proj", H * (dn + dv), kvr, m, dense);
    free(m);
done:
    kt_st_close(d);
    kt_gguf_close(meta);
    remove_dir(dir);
}

static void bf16_directory_holds_the_ggufs_values_rounded(void)
{
    check_directory("bf16", KT_HF_WEIGHTS_PLAIN, KT_HF_STORED_PLAIN, KT_HF_STORED_PLAIN, "");
}

static void int4_experts_directory_holds_the_ggufs_values_quantized(void)
{
    check_directory("int4-experts", KT_HF_WEIGHTS_INT4_GROUP, KT_HF_STORED_PLAIN, KT_HF_STORED_INT4, "");
}

static void fp8_directory_holds_the_ggufs_values_quantized(void)
{
    check_directory("fp8", KT_HF_WEIGHTS_FP8_BLOCK, KT_HF_STORED_FP8, KT_HF_STORED_FP8, "");
}

/* Small shards: several files, each module whole in one, each within the limit. */
static void shards_split_at_the_size_limit(void)
{
    const char *dir = write_hf("tiny-v3", "--hf-weights bf16 --hf-shard-mib 4");
    if (!dir)
        return;
    kt_err err = {0};
    struct kt_st_dir *d = NULL;
    struct kt_gguf *meta = NULL;
    struct kt_hf_quant q;
    struct kt_hparams hp;
    struct kt_hf_inventory inv;
    if (kt_st_open_dir(dir, &d, &err) != KT_OK || kt_hf_config_read(dir, &meta, &q, &err) != KT_OK ||
        kt_hparams_read(meta, &hp, &err) != KT_OK || kt_hf_inventory(d, &hp, &q, &inv, &err) != KT_OK) {
        KT_CHECK(false, "%s", err.msg);
    } else {
        KT_CHECK(d->n_shards >= 10, "%u shards of <= 4 MiB for ~45 MiB", d->n_shards);
        for (uint32_t s = 0; s < d->n_shards; s++) {
            const uint64_t data = d->shards[s].file_bytes - d->shards[s].data_offset;
            KT_CHECK(data <= 4u << 20 || d->shards[s].n_tensors == 1, "shard %u: %llu bytes in %llu tensors", s,
                     (unsigned long long)data, (unsigned long long)d->shards[s].n_tensors);
            char name[64];
            snprintf(name, sizeof name, "model-%05u-of-%05u.safetensors", s + 1, d->n_shards);
            KT_CHECK(strstr(d->shards[s].path, name) != NULL, "shard %u is %s", s, d->shards[s].path);
        }
        KT_CHECK(hp.n_expert_groups == 4 && hp.n_group_used == 2 && q.format == KT_HF_WEIGHTS_PLAIN,
                 "tiny-v3's routing groups: %u / %u", hp.n_expert_groups, hp.n_group_used);
    }
    const struct kt_st_tensor *up = d ? kt_st_find(d, "model.layers.1.mlp.experts.31.up_proj.weight") : NULL,
                              *gate = d ? kt_st_find(d, "model.layers.1.mlp.experts.31.gate_proj.weight") : NULL;
    KT_CHECK(up && gate, "expert 31's projections are in the directory");
    kt_st_close(d);
    kt_gguf_close(meta);
    /* the tokenizer files are there and carry the template */
    char path[1100];
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    size_t n = 0;
    char *text = kt_test_read_file(path, &n);
    KT_CHECK(text && strstr(text, "\"chat_template\"") && strstr(text, "\"eos_token\""),
             "tokenizer_config.json has no chat_template or eos_token");
    free(text);
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    text = kt_test_read_file(path, &n);
    KT_CHECK(text && strstr(text, "\"BPE\"") && strstr(text, "\"merges\"") && strstr(text, "\"added_tokens\""),
             "tokenizer.json is no BPE model with merges and added tokens");
    free(text);
    char other[1100];
    snprintf(path, sizeof path, "%s/tiktoken.model", dir);
    snprintf(other, sizeof other, "%s/chat_template.jinja", dir);
    KT_CHECK(access(path, F_OK) != 0 && access(other, F_OK) != 0, "DeepSeek's directory has Kimi's files");
    remove_dir(dir);
}

/* ---- Kimi's tokenizer files ---------------------------------------------------------------------- */

static int b64_digit(char c)
{
    const char *digits = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    const char *at = c ? strchr(digits, c) : NULL;
    return at ? (int)(at - digits) : -1;
}

/* Base64 (padded) of n chars at s into out; the byte count, or -1. */
static int b64_bytes(const char *s, size_t n, unsigned char *out)
{
    int o = 0;
    uint32_t acc = 0;
    int bits = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] == '=')
            return i + 2 >= n ? o : -1;
        const int d = b64_digit(s[i]);
        if (d < 0)
            return -1;
        acc = acc << 6 | (uint32_t)d, bits += 6;
        if (bits >= 8) {
            bits -= 8;
            out[o++] = (unsigned char)(acc >> bits);
        }
    }
    return o;
}

/* GPT-2's byte-level text of n bytes (the table built as bytes_to_unicode builds it). */
static void byte_level_text(const unsigned char *p, int n, char *out)
{
    uint32_t cp[256];
    int next = 0;
    for (int b = 0; b < 256; b++) {
        const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        cp[b] = printable ? (uint32_t)b : 256u + (uint32_t)next++;
    }
    size_t o = 0;
    for (int i = 0; i < n; i++) {
        const uint32_t c = cp[p[i]];
        if (c < 0x80) {
            out[o++] = (char)c;
        } else {
            out[o++] = (char)(0xC0 | c >> 6);
            out[o++] = (char)(0x80 | (c & 0x3F));
        }
    }
    out[o] = '\0';
}

static void kimi_directory_ships_tiktoken_like_kimi_k2_thinking(void)
{
    if (!open_gguf())
        return;
    const char *dir = write_hf("tiny", "--hf-weights bf16");
    if (!dir)
        return;
    const struct kt_gguf_kv *tokens = kt_gguf_find_kv(gguf, "tokenizer.ggml.tokens");
    struct kt_gguf_str tpl = {0};
    kt_err err = {0};
    KT_CHECK(tokens && kt_gguf_get_str(gguf, "tokenizer.chat_template", &tpl, &err) == KT_OK, "the GGUF's tokenizer");
    char path[1100];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    KT_CHECK(access(path, F_OK) != 0, "Kimi's directory has a tokenizer.json");
    snprintf(path, sizeof path, "%s/tiktoken.model", dir);
    size_t n = 0;
    char *text = kt_test_read_file(path, &n);
    uint32_t lines = 0, wrong = 0;
    for (char *line = text, *nl; text && line < text + n; line = nl + 1) {
        if (!(nl = memchr(line, '\n', (size_t)(text + n - line)))) {
            wrong++;
            break;
        }
        char *space = memchr(line, ' ', (size_t)(nl - line));
        unsigned char bytes[1024];
        char want[2100];
        const int nb = space ? b64_bytes(line, (size_t)(space - line), bytes) : -1;
        if (nb <= 0 || strtoul(space + 1, NULL, 10) != lines || lines >= tokens->value.arr.count) {
            wrong++;
        } else {
            byte_level_text(bytes, nb, want);
            const struct kt_gguf_str t = tokens->value.arr.items[lines].str;
            wrong += t.len != strlen(want) || memcmp(t.ptr, want, t.len) != 0;
        }
        lines++;
    }
    KT_CHECK(text && strncmp(text, "AA== 0\n", 7) == 0 && strstr(text, "\nIA== 32\n") && lines == 256 + 768 &&
                 wrong == 0,
             "tiktoken.model: %u lines, %u not the GGUF's token with its id", lines, wrong);
    free(text);
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    text = kt_test_read_file(path, &n);
    KT_CHECK(text && strstr(text, "\"1024\": {\n      \"content\": \"[BOS]\"") &&
                 strstr(text, "\"content\": \"<|tool_call_begin|>\",\n      \"lstrip\": false,\n      "
                              "\"normalized\": false,\n      \"rstrip\": false,\n      \"single_word\": false,\n"
                              "      \"special\": false") &&
                 strstr(text, "\"tokenizer_class\": \"TikTokenTokenizer\"") &&
                 strstr(text, "\"eos_token\": \"[EOS]\"") &&
                 !strstr(text, "chat_template"),
             "tokenizer_config.json: not Kimi's form");
    free(text);
    snprintf(path, sizeof path, "%s/chat_template.jinja", dir);
    text = kt_test_read_file(path, &n);
    KT_CHECK(text && n == tpl.len && memcmp(text, tpl.ptr, n) == 0, "chat_template.jinja is not the GGUF's template");
    free(text);
    remove_dir(dir);
}

/* ---- refusals ------------------------------------------------------------------------------- */

static bool file_has(const char *path, const char *needle)
{
    size_t n = 0;
    char *text = kt_test_read_file(path, &n);
    bool found = text && strstr(text, needle);
    free(text);
    return found;
}

static void a_non_empty_directory_and_unknown_weights_are_refused(void)
{
    const char *dir = kt_test_path("synth-hf-full"), *log = kt_test_path("synth-hf.log");
    char keep[1100];
    snprintf(keep, sizeof keep, "%s/notes.txt", dir);
    KT_CHECK(mkdir(dir, 0755) == 0 && kt_test_write_tree_file(dir, "notes.txt", "mine\n"), "setting up %s", dir);
    int rc = kt_test_system("%s --preset tiny --format hf -q -o %s 2>%s >/dev/null", kt_test_tool("kt-synth"), dir,
                            log);
    KT_CHECK(rc == 2 && file_has(log, "not empty"), "a non-empty directory: exit %d", rc);
    char config[1100];
    snprintf(config, sizeof config, "%s/config.json", dir);
    KT_CHECK(access(keep, F_OK) == 0 && access(config, F_OK) != 0, "the directory was changed");
    remove_dir(dir);

    rc = kt_test_system("%s --preset tiny --format hf --hf-weights int3 -q -o %s 2>%s >/dev/null",
                        kt_test_tool("kt-synth"), dir, log);
    KT_CHECK(rc == 2 && file_has(log, "--hf-weights") && file_has(log, "int4-experts") && access(dir, F_OK) != 0,
             "--hf-weights int3: exit %d", rc);
    rc = kt_test_system("%s --preset tiny --hf-weights fp8 -q -o %s 2>%s >/dev/null", kt_test_tool("kt-synth"), dir,
                        log);
    KT_CHECK(rc == 2 && file_has(log, "--format hf"), "--hf-weights without --format hf: exit %d", rc);
    rc = kt_test_system("%s --preset tiny --format hf --experts-type q4_k -q -o %s 2>%s >/dev/null",
                        kt_test_tool("kt-synth"), dir, log);
    KT_CHECK(rc == 2 && file_has(log, "--hf-weights"), "a GGUF type with --format hf: exit %d", rc);
    unlink(log);
    remove_dir(dir);
}

int main(void)
{
    KT_RUN(bf16_directory_holds_the_ggufs_values_rounded);
    KT_RUN(int4_experts_directory_holds_the_ggufs_values_quantized);
    KT_RUN(fp8_directory_holds_the_ggufs_values_quantized);
    KT_RUN(shards_split_at_the_size_limit);
    KT_RUN(kimi_directory_ships_tiktoken_like_kimi_k2_thinking);
    KT_RUN(a_non_empty_directory_and_unknown_weights_are_refused);
    kt_gguf_close(gguf);
    return kt_test_finish();
}
