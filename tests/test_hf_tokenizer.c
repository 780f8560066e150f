/*
 * test_hf_tokenizer.c - a checkpoint directory's tokenizer files read as a
 * GGUF's tokenizer: kt-synth writes the tiny (Kimi-K2 family: tiktoken.model,
 * tokenizer_config.json, chat_template.jinja) and tiny-v3 (DeepSeek-V3
 * family: tokenizer.json, tokenizer_config.json) models as GGUF files and,
 * with the same seed, as directories; the directory's tokenizer has the
 * GGUF's vocabulary (every token's text and type), merges (for Kimi: derived
 * from the ranks, equal one for one to the ones training recorded),
 * BOS/EOS, add_bos and pre-tokenizer, tokenizes a set of texts (prose, code,
 * CJK, emoji, special tokens) to the same ids with and without special
 * parsing, and carries the same chat template, recognised as the same
 * revision.  A hand-written tiktoken.model gives the merges and specials the
 * conversion rule implies, and a pseudo-random 6000-rank one the merges a
 * plain implementation of llama.cpp's loop gives; a template kt does not render reaches the chat
 * layer and is refused there, as a GGUF's is.  Malformed and unsupported
 * tokenizer files (tokenizer.json, tiktoken.model, tokenizer_config.json) are
 * refused naming the file and field or line.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "chat.h"
#include "gguf.h"
#include "hf_tokenizer.h"
#include "model.h"
#include "testlib.h"
#include "tokenizer.h"

static const char *const texts[] = {
    "Hello, world! The river runs to the sea and the sea runs to the sky.",
    "def f(x):\n    return {'a': [1, 2, 3], \"b\": x ** 2}  # comment\n\n\tindented\r\n",
    "数学是科学的语言。日本語のテキストも。한국어 문장입니다.",
    "Emoji: 🙂🚀 and accents: café, naïve, Ångström; numbers 1234567890 3.14159",
    "<|im_start|>user\nHi<|im_end|><|im_start|>assistant\n",
    ("<|im_system|>system<|im_middle|>You are Kimi.<|im_end|><|im_user|>user<|im_middle|>写一首诗<|im_end|>"
     "<|im_assistant|>assistant<|im_middle|><think>[EOS]<|tool_call_begin|>[BOS]"), /* one text */
    "<｜begin▁of▁sentence｜><｜User｜>こんにちは 👋🏽<｜Assistant｜><think>\n</think>\n\n<｜end▁of▁sentence｜>",
    "for (int i = 0; i < n; i++) { sum += a[i] * b[i]; }  // 0x7fff_ffff\n#include <stdio.h>\r\n",
    "   leading spaces and trailing   ",
    "",
};

/* The GGUF's tokenizer.ggml.merges and the directory's, one for one. */
static bool same_merges(const struct kt_gguf *a, const struct kt_gguf *b, uint64_t *na, uint64_t *nb)
{
    const struct kt_gguf_kv *x = kt_gguf_find_kv(a, "tokenizer.ggml.merges");
    const struct kt_gguf_kv *y = kt_gguf_find_kv(b, "tokenizer.ggml.merges");
    *na = x ? x->value.arr.count : 0;
    *nb = y ? y->value.arr.count : 0;
    if (!x || !y || *na != *nb)
        return false;
    for (uint64_t i = 0; i < *na; i++) {
        const struct kt_gguf_str p = x->value.arr.items[i].str, q = y->value.arr.items[i].str;
        if (p.len != q.len || memcmp(p.ptr, q.ptr, p.len) != 0)
            return false;
    }
    return true;
}

/* The chat layer's verdict on g's template: the revision it renders, or its refusal. */
static kt_status template_format(const struct kt_gguf *g, kt_chat_format *format, kt_err *err)
{
    struct kt_gguf_str tpl = {0};
    *format = KT_CHAT_FORMAT_UNKNOWN;
    kt_status st = kt_gguf_get_str(g, "tokenizer.chat_template", &tpl, err);
    if (st != KT_OK)
        return st;
    char *text = strndup(tpl.ptr, tpl.len);
    st = text ? kt_chat_format_detect(text, format, err) : KT_ERR_NOMEM;
    free(text);
    return st;
}

static bool file_exists(const char *dir, const char *name)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    struct stat sb;
    return stat(path, &sb) == 0;
}

static bool write_file(const char *dir, const char *name, const char *text)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    bool ok = f && fputs(text, f) >= 0;
    if (f && fclose(f) != 0)
        ok = false;
    return ok;
}

static bool same_template(const struct kt_gguf *a, const struct kt_gguf *b)
{
    struct kt_gguf_str x = {0}, y = {0};
    kt_err err = {0};
    const bool ha = kt_gguf_get_str(a, "tokenizer.chat_template", &x, &err) == KT_OK;
    const bool hb = kt_gguf_get_str(b, "tokenizer.chat_template", &y, &err) == KT_OK;
    return ha == hb && (!ha || (x.len == y.len && memcmp(x.ptr, y.ptr, x.len) == 0));
}

static void a_directory_tokenizes_as_its_gguf(const char *preset)
{
    char gguf[1024], dir[1024];
    snprintf(gguf, sizeof gguf, "%s", kt_test_path("tok.gguf"));
    snprintf(dir, sizeof dir, "%s", kt_test_path("tok-hf"));
    kt_test_system("rm -rf '%s'", dir);
    const bool written = kt_test_system("%s --preset %s -q -o '%s' >/dev/null 2>&1 && %s --preset %s --format hf "
                                        "--hf-weights bf16 -q -o '%s' >/dev/null 2>&1",
                                        kt_test_tool("kt-synth"), preset, gguf, kt_test_tool("kt-synth"), preset,
                                        dir) == 0;
    KT_CHECK(written, "kt-synth %s: GGUF and directory", preset);
    struct kt_model *m = NULL;
    struct kt_gguf *hf = NULL;
    struct kt_tokenizer *a = NULL, *b = NULL;
    kt_err err = {0};
    if (!written || kt_model_open(gguf, &m, &err) != KT_OK || kt_tokenizer_create(m->gguf, &a, &err) != KT_OK ||
        kt_hf_tokenizer_read(dir, &hf, &err) != KT_OK || kt_tokenizer_create(hf, &b, &err) != KT_OK) {
        KT_CHECK(false, "%s: %s", preset, err.msg);
        goto done;
    }
    KT_CHECK(kt_tokenizer_n_vocab(a) == kt_tokenizer_n_vocab(b) && kt_tokenizer_bos(a) == kt_tokenizer_bos(b) &&
                 kt_tokenizer_eos(a) == kt_tokenizer_eos(b) && kt_tokenizer_add_bos(a) == kt_tokenizer_add_bos(b) &&
                 strcmp(kt_tokenizer_pre(a), kt_tokenizer_pre(b)) == 0,
             "%s: vocab %d/%d, bos %d/%d, eos %d/%d, add_bos %d/%d, pre %s/%s", preset, kt_tokenizer_n_vocab(a),
             kt_tokenizer_n_vocab(b), kt_tokenizer_bos(a), kt_tokenizer_bos(b), kt_tokenizer_eos(a),
             kt_tokenizer_eos(b), kt_tokenizer_add_bos(a), kt_tokenizer_add_bos(b), kt_tokenizer_pre(a),
             kt_tokenizer_pre(b));
    int differ = 0;
    for (int32_t id = 0; id < kt_tokenizer_n_vocab(a); id++) {
        size_t la = 0, lb = 0;
        const char *ta = kt_token_text(a, id, &la), *tb = kt_token_text(b, id, &lb);
        differ += !ta || !tb || la != lb || memcmp(ta, tb, la) != 0 || kt_token_type(a, id) != kt_token_type(b, id);
    }
    KT_CHECK(differ == 0, "%s: %d tokens differ in text or type", preset, differ);
    const bool kimi = strcmp(preset, "tiny") == 0;
    KT_CHECK(file_exists(dir, kimi ? "tiktoken.model" : "tokenizer.json") &&
                 !file_exists(dir, kimi ? "tokenizer.json" : "tiktoken.model") &&
                 file_exists(dir, "chat_template.jinja") == kimi,
             "%s: the directory holds the family's tokenizer files", preset);
    uint64_t merges_gguf = 0, merges_dir = 0;
    KT_CHECK(same_merges(m->gguf, hf, &merges_gguf, &merges_dir) && merges_gguf > 0,
             "%s: %llu merges in the GGUF, %llu from the directory, or they differ", preset,
             (unsigned long long)merges_gguf, (unsigned long long)merges_dir);
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++)
        for (int special = 0; special < 2; special++) {
            int32_t *ia = NULL, *ib = NULL;
            size_t na = 0, nb = 0;
            KT_CHECK(kt_tokenize(a, texts[i], strlen(texts[i]), true, special, &ia, &na, &err) == KT_OK &&
                         kt_tokenize(b, texts[i], strlen(texts[i]), true, special, &ib, &nb, &err) == KT_OK &&
                         na == nb && (na == 0 || memcmp(ia, ib, na * sizeof *ia) == 0),
                     "%s: text %zu (special %d): %zu ids from the GGUF, %zu from the directory", preset, i, special,
                     na, nb);
            free(ia), free(ib);
        }
    KT_CHECK(same_template(m->gguf, hf), "%s: the chat templates differ", preset);
    uint32_t pad_gguf = 0, pad_dir = 1;
    KT_CHECK(kt_gguf_get_uint32(m->gguf, "tokenizer.ggml.padding_token_id", &pad_gguf, &err) == KT_OK &&
                 kt_gguf_get_uint32(hf, "tokenizer.ggml.padding_token_id", &pad_dir, &err) == KT_OK && pad_gguf == pad_dir,
             "%s: padding id %u in the GGUF, %u from the directory", preset, pad_gguf, pad_dir);
    kt_chat_format fa, fb;
    kt_err ea = {0}, eb = {0};
    KT_CHECK(template_format(m->gguf, &fa, &ea) == KT_OK && template_format(hf, &fb, &eb) == KT_OK && fa == fb,
             "%s: the GGUF's template is %s (%s), the directory's %s (%s)", preset, kt_chat_format_name(fa), ea.msg,
             kt_chat_format_name(fb), eb.msg);
done:
    kt_tokenizer_destroy(a), kt_tokenizer_destroy(b);
    kt_gguf_close(hf);
    kt_model_close(m);
    unlink(gguf);
    kt_test_system("rm -rf '%s'", dir);
}

static void tiny_directory_tokenizes_as_its_gguf(void)
{
    a_directory_tokenizes_as_its_gguf("tiny");
}

static void tiny_v3_directory_tokenizes_as_its_gguf(void)
{
    a_directory_tokenizes_as_its_gguf("tiny-v3");
}

static void bad_tokenizer_files_are_refused(void)
{
    static const char ok_cfg[] = "{\"bos_token\": \"<s>\", \"eos_token\": {\"content\": \"</s>\"}}";
    static const struct {
        const char *tok, *cfg;
        kt_status st;
        const char *says;
    } cases[] = {
        {"{\"model\": {\"type\": \"WordPiece\", \"vocab\": {\"a\": 0}}}", NULL, KT_ERR_UNSUPPORTED,
         "model.type \"WordPiece\""},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 0}}}", NULL, KT_ERR_FORMAT, "id 0 is both"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": -1}}}", NULL, KT_ERR_FORMAT, "model.vocab[\"a\"]"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 1073741824}}}", NULL, KT_ERR_FORMAT, "model.vocab[\"a\"]"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [7]}}", NULL, KT_ERR_FORMAT,
         "model.merges[0]"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}}, \"added_tokens\": [{\"id\": 1}]}", NULL,
         KT_ERR_FORMAT, "added_tokens[0]"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"<s>\": 0}}}", ok_cfg, KT_ERR_FORMAT,
         "eos_token \"</s>\" is not a token"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {}}}", NULL, KT_ERR_FORMAT, "no tokens"},
        {"{\"model\": ", NULL, KT_ERR_FORMAT, "tokenizer.json: not JSON"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"<s>\": 0, \"</s>\": 1}}}", "{\"chat_template\": 3}",
         KT_ERR_FORMAT, "chat_template must be a string"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct kt_gguf *g = NULL;
        kt_err err = {0};
        kt_status st = kt_hf_tokenizer_parse(cases[i].tok, strlen(cases[i].tok), cases[i].cfg,
                                             cases[i].cfg ? strlen(cases[i].cfg) : 0, "deepseek-v3", "ckpt", &g, &err);
        KT_CHECK(st == cases[i].st && !g && strstr(err.msg, cases[i].says) && strstr(err.msg, "ckpt/"),
                 "case %zu: status %d, \"%s\"", i, (int)st, err.msg);
        kt_gguf_close(g);
    }
    /* gaps become unused pads; pairs of merges read as strings; a default template out of a list */
    const char *tok = "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"ab\": 3},"
                      " \"merges\": [[\"a\", \"b\"]]}, \"added_tokens\": [{\"id\": 4, \"content\": \"<x>\","
                      " \"special\": true}]}";
    const char *cfg = "{\"chat_template\": [{\"name\": \"tool_use\", \"template\": \"T\"}, {\"name\": \"default\","
                      " \"template\": \"D\"}]}";
    struct kt_gguf *g = NULL;
    struct kt_tokenizer *t = NULL;
    kt_err err = {0};
    KT_CHECK(kt_hf_tokenizer_parse(tok, strlen(tok), cfg, strlen(cfg), "deepseek-v3", "ckpt", &g, &err) == KT_OK &&
                 kt_tokenizer_create(g, &t, &err) == KT_OK,
             "%s", err.msg);
    size_t len = 0;
    const char *pad = t ? kt_token_text(t, 2, &len) : NULL;
    struct kt_gguf_str tpl = {0};
    const struct kt_gguf_kv *merges = g ? kt_gguf_find_kv(g, "tokenizer.ggml.merges") : NULL;
    KT_CHECK(t && kt_tokenizer_n_vocab(t) == 5 && pad && len == 6 && memcmp(pad, "[PAD2]", 6) == 0 &&
                 kt_token_type(t, 2) == KT_TOK_UNUSED && kt_token_type(t, 4) == KT_TOK_CONTROL && merges &&
                 merges->value.arr.count == 1 && merges->value.arr.items[0].str.len == 3 &&
                 memcmp(merges->value.arr.items[0].str.ptr, "a b", 3) == 0 &&
                 kt_gguf_get_str(g, "tokenizer.chat_template", &tpl, &err) == KT_OK && tpl.len == 1 && tpl.ptr[0] == 'D',
             "pads, merges, the default template");
    kt_tokenizer_destroy(t);
    kt_gguf_close(g);
}

/* Ranks 0..17 by hand: the merges are the two-part splits BPE over the lower ranks reaches. */
static const char hand_model[] = "YQ== 0\nYg== 1\nYw== 2\nYWI= 3\nYmM= 4\nYWJj 5\neA== 6\neQ== 7\neg== 8\n"
                                 "eHl6 9\nIA== 10\nIGE= 11\nYWJhYg== 12\nYmNh 13\r\n\nCg==\t14\nrQ== 15\nYWE= 16\n"
                                 "YWFh 17\n";
static const char hand_config[] = "{\"added_tokens_decoder\": {\"18\": {\"content\": \"[BOS]\", \"special\": true},"
                                  " \"20\": {\"content\": \"<|im_end|>\", \"special\": false}},"
                                  " \"bos_token\": \"[BOS]\", \"eos_token\": \"<|im_end|>\"}";

static void tiktoken_ranks_give_the_merges_bpe_reaches(void)
{
    /* ab and bc from single bytes; abc as ab + c (ab's rank 3 is below bc's 4); xyz: three parts, no merge;
     * abab: ab + ab; bca: bc + a; aaa: the leftmost aa first, so aa + a */
    static const char *const want[] = {"a b", "b c", "ab c", "\xc4\xa0 a", "ab ab", "bc a", "a a", "aa a"};
    struct kt_gguf *g = NULL;
    struct kt_tokenizer *t = NULL;
    kt_err err = {0};
    KT_CHECK(kt_hf_tokenizer_parse_tiktoken(hand_model, strlen(hand_model), hand_config, strlen(hand_config), 22,
                                            "ckpt", &g, &err) == KT_OK &&
                 kt_tokenizer_create(g, &t, &err) == KT_OK,
             "%s", err.msg);
    if (!t)
        goto done;
    const struct kt_gguf_kv *merges = kt_gguf_find_kv(g, "tokenizer.ggml.merges");
    bool same = merges && merges->value.arr.count == sizeof want / sizeof want[0];
    for (size_t i = 0; same && i < sizeof want / sizeof want[0]; i++)
        same = merges->value.arr.items[i].str.len == strlen(want[i]) &&
               memcmp(merges->value.arr.items[i].str.ptr, want[i], strlen(want[i])) == 0;
    KT_CHECK(same, "the merges: %llu of them", merges ? (unsigned long long)merges->value.arr.count : 0ull);
    /* byte-level texts: space, newline and the soft hyphen 0xAD map to U+0120, U+010A, U+0143 */
    static const struct {
        int32_t id;
        const char *text;
        enum kt_tok_type type;
    } tokens[] = {
        {5, "abc", KT_TOK_NORMAL},         {10, "\xc4\xa0", KT_TOK_NORMAL},
        {11, "\xc4\xa0" "a", KT_TOK_NORMAL}, {14, "\xc4\x8a", KT_TOK_NORMAL},
        {15, "\xc5\x83", KT_TOK_NORMAL},    {18, "[BOS]", KT_TOK_CONTROL},
        {19, "<|reserved_token_19|>", KT_TOK_CONTROL}, {20, "<|im_end|>", KT_TOK_CONTROL},
        {21, "<|reserved_token_21|>", KT_TOK_CONTROL},
    };
    for (size_t i = 0; i < sizeof tokens / sizeof tokens[0]; i++) {
        size_t len = 0;
        const char *text = kt_token_text(t, tokens[i].id, &len);
        KT_CHECK(text && len == strlen(tokens[i].text) && memcmp(text, tokens[i].text, len) == 0 &&
                     kt_token_type(t, tokens[i].id) == tokens[i].type,
                 "token %d: \"%.*s\" type %d", tokens[i].id, (int)len, text ? text : "",
                 kt_token_type(t, tokens[i].id));
    }
    KT_CHECK(kt_tokenizer_n_vocab(t) == 22 && kt_tokenizer_bos(t) == 18 && kt_tokenizer_eos(t) == 20 &&
                 !kt_tokenizer_add_bos(t) && strcmp(kt_tokenizer_pre(t), "kimi-k2") == 0,
             "vocab %d, bos %d, eos %d", kt_tokenizer_n_vocab(t), kt_tokenizer_bos(t), kt_tokenizer_eos(t));
    int32_t *ids = NULL;
    size_t n = 0;
    KT_CHECK(kt_tokenize(t, "[BOS]abc", 8, false, true, &ids, &n, &err) == KT_OK && n == 2 && ids[0] == 18 &&
                 ids[1] == 5,
             "[BOS]abc: %zu ids", n);
    free(ids);
    kt_tokenizer_destroy(t);
    kt_gguf_close(g);
    /* without vocab_size: the 256 special ids; past them, up to vocab_size, unused pads */
    t = NULL, g = NULL;
    KT_CHECK(kt_hf_tokenizer_parse_tiktoken(hand_model, strlen(hand_model), NULL, 0, 0, "ckpt", &g, &err) == KT_OK &&
                 kt_tokenizer_create(g, &t, &err) == KT_OK && kt_tokenizer_n_vocab(t) == 18 + 256 &&
                 kt_token_type(t, 273) == KT_TOK_CONTROL,
             "no config: %s", err.msg);
    kt_tokenizer_destroy(t);
    kt_gguf_close(g);
    t = NULL, g = NULL;
    size_t len = 0;
    KT_CHECK(kt_hf_tokenizer_parse_tiktoken(hand_model, strlen(hand_model), NULL, 0, 277, "ckpt", &g, &err) == KT_OK &&
                 kt_tokenizer_create(g, &t, &err) == KT_OK && kt_tokenizer_n_vocab(t) == 277 &&
                 kt_token_type(t, 274) == KT_TOK_UNUSED && kt_token_text(t, 276, &len) && len == 8,
             "vocab_size 277: %s", err.msg);
done:
    kt_tokenizer_destroy(t);
    kt_gguf_close(g);
}

/* ---- the merge rule against a plain implementation of it, on a vocabulary BPE training did not make ---- */

#define RANDOM_RANKS 6000
#define RANDOM_MAX_BYTES 12

struct random_vocab {
    unsigned char bytes[RANDOM_RANKS][RANDOM_MAX_BYTES];
    int len[RANDOM_RANKS];
    int slot[16384]; /* rank + 1 by FNV of the bytes, 0 empty */
};

static unsigned slot_of(const struct random_vocab *v, const unsigned char *p, int n)
{
    uint32_t h = 2166136261u;
    for (int i = 0; i < n; i++)
        h = (h ^ p[i]) * 16777619u;
    unsigned k = h & 16383;
    while (v->slot[k] && (v->len[v->slot[k] - 1] != n || memcmp(v->bytes[v->slot[k] - 1], p, (size_t)n) != 0))
        k = (k + 1) & 16383;
    return k;
}

static int rank_of_bytes(const struct random_vocab *v, const unsigned char *p, int n)
{
    return n <= RANDOM_MAX_BYTES ? v->slot[slot_of(v, p, n)] - 1 : -1;
}

/* The converter's loop as it reads: parts as byte strings, the lowest-ranked pair (first of equals) merged
 * while its rank is below the token's; the merge text when two parts remain. */
static bool plain_merge(const struct random_vocab *v, int q, char *out)
{
    unsigned char part[RANDOM_MAX_BYTES][RANDOM_MAX_BYTES];
    int plen[RANDOM_MAX_BYTES], parts = v->len[q];
    for (int i = 0; i < parts; i++)
        part[i][0] = v->bytes[q][i], plen[i] = 1;
    for (;;) {
        int best = -1, best_rank = 0;
        for (int i = 0; i + 1 < parts; i++) {
            unsigned char joined[2 * RANDOM_MAX_BYTES];
            memcpy(joined, part[i], (size_t)plen[i]);
            memcpy(joined + plen[i], part[i + 1], (size_t)plen[i + 1]);
            const int r = rank_of_bytes(v, joined, plen[i] + plen[i + 1]);
            if (r >= 0 && (best < 0 || r < best_rank))
                best = i, best_rank = r;
        }
        if (best < 0 || best_rank >= q)
            break;
        memcpy(part[best] + plen[best], part[best + 1], (size_t)plen[best + 1]);
        plen[best] += plen[best + 1];
        for (int i = best + 1; i + 1 < parts; i++)
            memcpy(part[i], part[i + 1], (size_t)plen[i + 1]), plen[i] = plen[i + 1];
        parts--;
    }
    if (parts != 2)
        return false;
    size_t o = 0;
    for (int side = 0; side < 2; side++) {
        if (side)
            out[o++] = ' ';
        for (int i = 0; i < plen[side]; i++) { /* GPT-2's byte table, written out */
            const unsigned b = part[side][i];
            const bool same = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
            const unsigned c = same ? b : b <= 0x20 ? 0x100 + b : b <= 0xA0 ? 0x121 + (b - 0x7F) : 0x143;
            if (c < 0x80) {
                out[o++] = (char)c;
            } else {
                out[o++] = (char)(0xC0 | c >> 6);
                out[o++] = (char)(0x80 | (c & 0x3F));
            }
        }
    }
    out[o] = '\0';
    return true;
}

static void tiktoken_merges_follow_the_converters_rule_on_random_ranks(void)
{
    struct random_vocab *v = calloc(1, sizeof *v);
    char *model = malloc(RANDOM_RANKS * 32);
    struct kt_gguf *g = NULL;
    kt_err err = {0};
    if (!v || !model) {
        KT_CHECK(false, "out of memory");
        goto done;
    }
    /* 256 bytes, then tokens each the concatenation of two earlier ones (some reachable by merges, some not) */
    uint64_t x = 88172645463325252ull;
    int n = 0;
    size_t at = 0;
    while (n < RANDOM_RANKS) {
        unsigned char t[2 * RANDOM_MAX_BYTES];
        int len = 1;
        if (n < 256) {
            t[0] = (unsigned char)n;
        } else {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            const int a = (int)(x % (uint64_t)n), b = (int)((x >> 32) % (uint64_t)n);
            len = v->len[a] + v->len[b];
            if (len > RANDOM_MAX_BYTES)
                continue;
            memcpy(t, v->bytes[a], (size_t)v->len[a]);
            memcpy(t + v->len[a], v->bytes[b], (size_t)v->len[b]);
        }
        const unsigned k = slot_of(v, t, len);
        if (v->slot[k])
            continue;
        memcpy(v->bytes[n], t, (size_t)len);
        v->len[n] = len;
        v->slot[k] = n + 1;
        static const char b64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        for (int i = 0; i < len; i += 3) {
            const uint32_t w = (uint32_t)t[i] << 16 | (i + 1 < len ? (uint32_t)t[i + 1] << 8 : 0) |
                               (i + 2 < len ? t[i + 2] : 0);
            model[at++] = b64[w >> 18], model[at++] = b64[(w >> 12) & 63];
            model[at++] = i + 1 < len ? b64[(w >> 6) & 63] : '=';
            model[at++] = i + 2 < len ? b64[w & 63] : '=';
        }
        at += (size_t)sprintf(model + at, " %d\n", n);
        n++;
    }
    KT_CHECK(kt_hf_tokenizer_parse_tiktoken(model, at, NULL, 0, 0, "random", &g, &err) == KT_OK, "%s", err.msg);
    const struct kt_gguf_kv *merges = g ? kt_gguf_find_kv(g, "tokenizer.ggml.merges") : NULL;
    uint64_t m = 0, differ = 0, none = 0;
    for (int q = 256; merges && q < RANDOM_RANKS; q++) {
        char want[4 * RANDOM_MAX_BYTES + 2];
        if (!plain_merge(v, q, want)) {
            none++;
            continue;
        }
        const struct kt_gguf_str got = m < merges->value.arr.count ? merges->value.arr.items[m].str
                                                                   : (struct kt_gguf_str){"", 0};
        differ += got.len != strlen(want) || memcmp(got.ptr, want, got.len) != 0;
        m++;
    }
    KT_CHECK(merges && m == merges->value.arr.count && differ == 0 && none > 0 && m > 1000,
             "%llu merges expected (%llu tokens without one), %llu made, %llu differ", (unsigned long long)m,
             (unsigned long long)none, merges ? (unsigned long long)merges->value.arr.count : 0ull,
             (unsigned long long)differ);
done:
    kt_gguf_close(g);
    free(v), free(model);
}

static void bad_tiktoken_files_are_refused(void)
{
    char long_line[2000], long_token[1500];
    memset(long_line, 'A', 1600), strcpy(long_line + 1600, " 0\n");
    memset(long_token, 'A', 1368), strcpy(long_token + 1368, " 0\n"); /* 1026 bytes: a line short enough */
    static const char two[] = "YQ== 0\nYg== 1\n";
    const struct {
        const char *model, *cfg;
        uint32_t vocab_size;
        const char *says;
    } cases[] = {
        {"YQ== 0\nY!== 1\n", NULL, 0, "tiktoken.model:2: \"Y!==\" is not base64"},
        {"YR== 0\n", NULL, 0, "tiktoken.model:1: \"YR==\" is not base64"},
        {"YQ= 0\n", NULL, 0, "is not base64"},
        {"YQ== 0\nYg== 0\n", NULL, 0, "tiktoken.model:2: rank 0 where rank 1 belongs: a rank given twice"},
        {"YQ== 0\n\nYg== 2\n", NULL, 0, "tiktoken.model:3: rank 2 where rank 1 belongs: ranks are missing"},
        {"YQ== 1073741824\n", NULL, 0, "tiktoken.model:1: rank 1073741824: ranks must be below 2^30"},
        {"YQ== 99999999999999999999999\n", NULL, 0, "ranks must be below 2^30"},
        {"YQ== -1\n", NULL, 0, "tiktoken.model:1: not \"BASE64 RANK\""},
        {"YQ== 0 7\n", NULL, 0, "tiktoken.model:1: not \"BASE64 RANK\""},
        {"YQ== 0\nYQ== 1\n", NULL, 0, "rank 1 has the bytes of rank 0"},
        {"YQ== 0\nYg== 1\nYw", NULL, 0, "tiktoken.model:3: not \"BASE64 RANK\" (the file ends in the middle"},
        {"YQ== 0\nYg== 1\nYWI 2", NULL, 0, "tiktoken.model:3: \"YWI\" is not base64 (the file ends"},
        {"YQ==\0 0\n", NULL, 0, "is not base64"},
        {"", NULL, 0, "tiktoken.model: no tokens"},
        {"\n\r\n", NULL, 0, "tiktoken.model: no tokens"},
        {long_line, NULL, 0, "tiktoken.model:1: a line of 1602 bytes"},
        {long_token, NULL, 0, "tiktoken.model:1: a token of 1026 bytes"},
        {two, "{\"added_tokens_decoder\": {\"1\": {\"content\": \"x\"}}}", 0, "[\"1\"] is rank 1 of tiktoken.model"},
        {two, "{\"added_tokens_decoder\": {\"300\": {\"content\": \"x\"}}}", 0,
         "[\"300\"] is not one of the 256 special ids 2..257 after tiktoken.model's 2 ranks (a truncated"},
        {two, "{\"added_tokens_decoder\": {\"5\": {\"content\": \"x\"}}}", 4, "not one of the 2 special ids 2..3"},
        {two, "{\"added_tokens_decoder\": {\"02\": {\"content\": \"x\"}}}", 0, "[\"02\"] needs an id"},
        {two, "{\"added_tokens_decoder\": {\"2\": {\"special\": true}}}", 0, "[\"2\"] needs an id"},
        {two, "{\"added_tokens_decoder\": []}", 0, "added_tokens_decoder must be an object"},
        {two, "{\"bos_token\": \"[BOS]\"}", 0, "bos_token \"[BOS]\" is not a token of tiktoken.model"},
        {two, "{\"chat_template\": 3}", 0, "chat_template must be a string"},
        {two, "[1]", 0, "tokenizer_config.json: not a JSON object"},
        {two, NULL, 1, "config.json's vocab_size 1 is below tiktoken.model's 2 ranks"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct kt_gguf *g = NULL;
        kt_err err = {0};
        const size_t len = i == 12 ? 8 : strlen(cases[i].model); /* case 12 holds a NUL */
        kt_status st = kt_hf_tokenizer_parse_tiktoken(cases[i].model, len, cases[i].cfg,
                                                      cases[i].cfg ? strlen(cases[i].cfg) : 0, cases[i].vocab_size,
                                                      "ckpt", &g, &err);
        KT_CHECK(st == KT_ERR_FORMAT && !g && strstr(err.msg, cases[i].says) && strncmp(err.msg, "ckpt", 4) == 0,
                 "case %zu: status %d, \"%s\"", i, (int)st, err.msg);
        kt_gguf_close(g);
    }
}

static void a_directory_without_the_files_says_what_is_missing(void)
{
    char dir[1024];
    snprintf(dir, sizeof dir, "%s", kt_test_path("tok-missing"));
    kt_test_system("rm -rf '%s'", dir);
    mkdir(dir, 0755);
    struct kt_gguf *g = NULL;
    struct kt_tokenizer *t = NULL;
    kt_err err = {0};
    KT_CHECK(kt_hf_tokenizer_read(dir, &g, &err) != KT_OK && !g && strstr(err.msg, "config.json"), "no config: %s",
             err.msg);
    KT_CHECK(write_file(dir, "config.json", "{\"model_type\": \"llama\"}"), "writing config.json");
    KT_CHECK(kt_hf_tokenizer_read(dir, &g, &err) == KT_ERR_UNSUPPORTED && strstr(err.msg, "\"llama\""), "llama: %s",
             err.msg);
    KT_CHECK(write_file(dir, "config.json", "{\"model_type\": \"deepseek_v3\"}") &&
                 write_file(dir, "tiktoken.model", "IQ== 0\n"),
             "writing the files");
    KT_CHECK(kt_hf_tokenizer_read(dir, &g, &err) == KT_ERR_UNSUPPORTED && strstr(err.msg, "Kimi"),
             "tiktoken for DeepSeek: %s", err.msg);
    /* Kimi-K2.5 keeps vocab_size in text_config */
    KT_CHECK(write_file(dir, "config.json", "{\"model_type\": \"kimi_k25\", \"text_config\": {\"vocab_size\": 3}}"),
             "writing config.json");
    size_t len = 0;
    const char *text = NULL;
    KT_CHECK(kt_hf_tokenizer_read(dir, &g, &err) == KT_OK && kt_tokenizer_create(g, &t, &err) == KT_OK &&
                 kt_tokenizer_n_vocab(t) == 3 && (text = kt_token_text(t, 0, &len)) && len == 1 && text[0] == '!' &&
                 kt_token_type(t, 2) == KT_TOK_CONTROL,
             "tiktoken only: %s", err.msg);
    kt_tokenizer_destroy(t), kt_gguf_close(g);
    t = NULL, g = NULL;
    /* chat_template.jinja replaces the config's template; without it the config's counts */
    struct kt_gguf_str tpl = {0};
    KT_CHECK(write_file(dir, "tokenizer_config.json", "{\"chat_template\": \"CONFIG\"}") &&
                 write_file(dir, "chat_template.jinja", "JINJA {{ x }}\n"),
             "writing the templates");
    KT_CHECK(kt_hf_tokenizer_read(dir, &g, &err) == KT_OK &&
                 kt_gguf_get_str(g, "tokenizer.chat_template", &tpl, &err) == KT_OK && tpl.len == 14 &&
                 memcmp(tpl.ptr, "JINJA {{ x }}\n", 14) == 0,
             "chat_template.jinja: %s", err.msg);
    kt_gguf_close(g);
    g = NULL;
    char path[1200];
    snprintf(path, sizeof path, "%s/chat_template.jinja", dir);
    unlink(path);
    KT_CHECK(kt_hf_tokenizer_read(dir, &g, &err) == KT_OK &&
                 kt_gguf_get_str(g, "tokenizer.chat_template", &tpl, &err) == KT_OK && tpl.len == 6 &&
                 memcmp(tpl.ptr, "CONFIG", 6) == 0,
             "the config's template: %s", err.msg);
    kt_gguf_close(g);
    g = NULL;
    snprintf(path, sizeof path, "%s/tiktoken.model", dir);
    unlink(path);
    KT_CHECK(kt_hf_tokenizer_read(dir, &g, &err) != KT_OK && strstr(err.msg, "tokenizer.json") &&
                 strstr(err.msg, "tiktoken.model"),
             "nothing: %s", err.msg);
    kt_test_system("rm -rf '%s'", dir);
}

/* A directory whose template kt does not render loads, and the chat layer refuses it as it refuses a GGUF
 * carrying the same template, naming what it is. */
static void an_unrendered_template_is_refused_by_the_chat_layer(void)
{
    char dir[1024];
    snprintf(dir, sizeof dir, "%s", kt_test_path("tok-chatml"));
    kt_test_system("rm -rf '%s'", dir);
    const bool written = kt_test_system("%s --preset tiny --format hf --hf-weights bf16 -q -o '%s' >/dev/null 2>&1",
                                        kt_test_tool("kt-synth"), dir) == 0;
    static const char chatml[] = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                                 "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";
    char path[1200];
    snprintf(path, sizeof path, "%s/chat_template.jinja", dir);
    unlink(path);
    KT_CHECK(written && write_file(dir, "chat_template.jinja", chatml), "kt-synth tiny with a ChatML template");
    struct kt_gguf *g = NULL;
    kt_err err = {0}, want = {0};
    kt_chat_format format, want_format;
    KT_CHECK(kt_hf_tokenizer_read(dir, &g, &err) == KT_OK, "%s", err.msg);
    const kt_status st = g ? template_format(g, &format, &err) : KT_ERR_INVALID;
    const kt_status want_st = kt_chat_format_detect(chatml, &want_format, &want);
    KT_CHECK(st == KT_ERR_UNSUPPORTED && want_st == st && strcmp(err.msg, want.msg) == 0 &&
                 strstr(err.msg, "chat template not recognised"),
             "ChatML: \"%s\" (a GGUF: \"%s\")", err.msg, want.msg);
    kt_gguf_close(g);
    kt_test_system("rm -rf '%s'", dir);
}

int main(void)
{
    KT_RUN(tiny_directory_tokenizes_as_its_gguf);
    KT_RUN(tiny_v3_directory_tokenizes_as_its_gguf);
    KT_RUN(bad_tokenizer_files_are_refused);
    KT_RUN(tiktoken_ranks_give_the_merges_bpe_reaches);
    KT_RUN(tiktoken_merges_follow_the_converters_rule_on_random_ranks);
    KT_RUN(bad_tiktoken_files_are_refused);
    KT_RUN(a_directory_without_the_files_says_what_is_missing);
    KT_RUN(an_unrendered_template_is_refused_by_the_chat_layer);
    return kt_test_finish();
}
