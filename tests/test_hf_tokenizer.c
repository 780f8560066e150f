/*
 * test_hf_tokenizer.c - a checkpoint directory's tokenizer files read as a
 * GGUF's tokenizer: kt-synth writes the tiny (Kimi-K2 family) and tiny-v3
 * (DeepSeek-V3 family) models as GGUF files and, with the same seed, as
 * directories (tokenizer.json, tokenizer_config.json, config.json); the
 * directory's tokenizer has the GGUF's vocabulary (every token's text and
 * type), BOS/EOS, add_bos and pre-tokenizer, tokenizes a set of texts (prose,
 * code, CJK, emoji, special tokens) to the same ids with and without special
 * parsing, and carries the same chat template.  Malformed and unsupported
 * tokenizer files are refused naming the file and field.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

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
    "   leading spaces and trailing   ",
    "",
};

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

static void a_directory_without_the_files_says_what_is_missing(void)
{
    char dir[1024], path[1200];
    snprintf(dir, sizeof dir, "%s", kt_test_path("tok-missing"));
    mkdir(dir, 0755);
    struct kt_gguf *g = NULL;
    kt_err err = {0};
    KT_CHECK(kt_hf_tokenizer_read(dir, &g, &err) != KT_OK && !g && strstr(err.msg, "config.json"), "no config: %s",
             err.msg);
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    KT_CHECK(f && fputs("{\"model_type\": \"llama\"}", f) >= 0 && fclose(f) == 0, "writing %s", path);
    KT_CHECK(kt_hf_tokenizer_read(dir, &g, &err) == KT_ERR_UNSUPPORTED && strstr(err.msg, "\"llama\""), "llama: %s",
             err.msg);
    f = fopen(path, "w");
    KT_CHECK(f && fputs("{\"model_type\": \"kimi_k2\"}", f) >= 0 && fclose(f) == 0, "writing %s", path);
    snprintf(path, sizeof path, "%s/tiktoken.model", dir);
    f = fopen(path, "w");
    KT_CHECK(f && fputs("IQ== 0\n", f) >= 0 && fclose(f) == 0, "writing %s", path);
    KT_CHECK(kt_hf_tokenizer_read(dir, &g, &err) == KT_ERR_UNSUPPORTED && strstr(err.msg, "tiktoken"),
             "tiktoken only: %s", err.msg);
    unlink(path);
    KT_CHECK(kt_hf_tokenizer_read(dir, &g, &err) != KT_OK && strstr(err.msg, "tokenizer.json"), "nothing: %s",
             err.msg);
    snprintf(path, sizeof path, "%s/config.json", dir);
    unlink(path);
    rmdir(dir);
}

int main(void)
{
    KT_RUN(tiny_directory_tokenizes_as_its_gguf);
    KT_RUN(tiny_v3_directory_tokenizes_as_its_gguf);
    KT_RUN(bad_tokenizer_files_are_refused);
    KT_RUN(a_directory_without_the_files_says_what_is_missing);
    return kt_test_finish();
}
