/*
 * fuzz_hf_tokenizer_tiktoken.c - fuzz target for Kimi's tiktoken.model
 * (kt_hf_tokenizer_parse_tiktoken: hf_tiktoken.c's line reader and merge
 * derivation, hf_tokenizer.c's specials), then kt_tokenizer_create and one
 * tokenization on what it made.
 *
 * The input is tiktoken.model; when it holds a NUL byte, what follows is
 * tokenizer_config.json.  It is parsed twice: without a vocab_size and with
 * one just past the ranks.  An accepted input must give a metadata-only GGUF
 * whose tokenizer.ggml.tokens and token_type have one entry per id, and
 * merges "left right" whose halves are non-empty and join into a token's
 * text; a rejection must name the input's folder.  A broken promise aborts.
 * It must never touch files or keep state between inputs.  kt_fuzz_seeds
 * hands replay.c a small tiktoken.model with a config, its truncations and
 * one-byte changes.
 */
#include "fuzz.h"

#include "gguf.h"
#include "hf_tokenizer.h"
#include "tokenizer.h"

static void require(bool cond, const char *what)
{
    if (!cond) {
        fprintf(stderr, "fuzz_hf_tokenizer_tiktoken: broken promise: %s\n", what);
        abort();
    }
}

/* Every merge splits at its first space after index 0 into two halves whose join is a token (small inputs). */
static void check_merges(const struct kt_gguf_kv *tokens, const struct kt_gguf_kv *merges)
{
    if (tokens->value.arr.count * merges->value.arr.count > 4000000)
        return;
    for (uint64_t m = 0; m < merges->value.arr.count; m++) {
        const struct kt_gguf_str s = merges->value.arr.items[m].str;
        const char *space = s.len > 1 ? memchr(s.ptr + 1, ' ', s.len - 1) : NULL;
        require(space && space + 1 < s.ptr + s.len, "a merge is \"left right\"");
        const size_t left = (size_t)(space - s.ptr), right = s.len - left - 1;
        bool found = false;
        for (uint64_t t = 0; !found && t < tokens->value.arr.count; t++) {
            const struct kt_gguf_str w = tokens->value.arr.items[t].str;
            found = w.len == left + right && memcmp(w.ptr, s.ptr, left) == 0 &&
                    memcmp(w.ptr + left, space + 1, right) == 0;
        }
        require(found, "a merge makes a token");
    }
}

static void parse_once(const char *model, size_t model_len, const char *cfg, size_t cfg_len, uint32_t vocab_size)
{
    struct kt_gguf *g = NULL;
    kt_err err = {0};
    kt_status st = kt_hf_tokenizer_parse_tiktoken(model, model_len, cfg, cfg_len, vocab_size, "fuzz", &g, &err);
    if (st != KT_OK) {
        require(!g, "no GGUF on failure");
        require(strncmp(err.msg, "fuzz", 4) == 0, "message names the input");
        return;
    }
    const struct kt_gguf_kv *tokens = kt_gguf_find_kv(g, "tokenizer.ggml.tokens");
    const struct kt_gguf_kv *types = kt_gguf_find_kv(g, "tokenizer.ggml.token_type");
    const struct kt_gguf_kv *merges = kt_gguf_find_kv(g, "tokenizer.ggml.merges");
    require(tokens && types && merges && tokens->value.arr.count > 0 &&
                tokens->value.arr.count == types->value.arr.count,
            "one type per token");
    require(vocab_size == 0 || tokens->value.arr.count == vocab_size, "vocab_size tokens");
    check_merges(tokens, merges);
    struct kt_tokenizer *t = NULL;
    if (kt_tokenizer_create(g, &t, &err) == KT_OK) {
        int32_t *ids = NULL;
        size_t n = 0;
        kt_tokenize(t, "ab [BOS]c abab\n", 15, true, true, &ids, &n, &err);
        free(ids);
    }
    kt_tokenizer_destroy(t);
    kt_gguf_close(g);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *nul = memchr(data, 0, size);
    const size_t model_len = nul ? (size_t)(nul - data) : size, cfg_len = nul ? size - model_len - 1 : 0;
    char *model = malloc(model_len ? model_len : 1), *cfg = malloc(cfg_len ? cfg_len : 1); /* exactly sized */
    if (!model || !cfg) {
        free(model), free(cfg);
        return 0;
    }
    memcpy(model, data, model_len);
    if (nul)
        memcpy(cfg, nul + 1, cfg_len);
    uint32_t lines = 0;
    for (size_t i = 0; i < model_len; i++)
        lines += model[i] == '\n';
    parse_once(model, model_len, nul ? cfg : NULL, cfg_len, 0);
    parse_once(model, model_len, nul ? cfg : NULL, cfg_len, lines + 3);
    free(model), free(cfg);
    return 0;
}

void kt_fuzz_seeds(kt_fuzz_emit_fn emit)
{
    static const char seed[] = "YQ== 0\nYg== 1\nYw== 2\nYWI= 3\nYmM= 4\nYWJj 5\nIA== 6\nIGE= 7\nYWJhYg== 8\r\n\n"
                               "YWE= 9\nYWFh\t10\n"
                               "\0{\"added_tokens_decoder\": {\"11\": {\"content\": \"[BOS]\", \"special\": true},"
                               " \"13\": {\"content\": \"<|im_end|>\", \"special\": false}}, \"bos_token\": \"[BOS]\","
                               " \"eos_token\": \"<|im_end|>\", \"chat_template\": \"{{x}}\"}";
    static const char *const seeds[] = {seed};
    /* kt_fuzz_mutated_seeds reads up to the NUL: its changes are to the tiktoken.model half; the pair once whole */
    kt_fuzz_mutated_seeds(emit, seeds, 1, "=A0\n /+9\t-", 10);
    emit((const uint8_t *)seed, sizeof seed - 1, "seed-with-config");
}
