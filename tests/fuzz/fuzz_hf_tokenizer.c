/*
 * fuzz_hf_tokenizer.c - fuzz target for a checkpoint's tokenizer.json
 * (kt_hf_tokenizer_parse), then kt_tokenizer_create and one tokenization on
 * what it made.
 *
 * The input is tokenizer.json; when it holds a NUL byte, what follows is
 * tokenizer_config.json.  An accepted pair must give a metadata-only GGUF
 * whose tokenizer.ggml.tokens and token_type have one entry per id; a
 * rejection must name the input's folder.  A broken promise aborts.  It
 * must never touch files or keep state between inputs.  kt_fuzz_seeds hands
 * replay.c a small BPE vocabulary with a config, its truncations and
 * one-byte changes.
 */
#include "fuzz.h"

#include "gguf.h"
#include "hf_tokenizer.h"
#include "tokenizer.h"

static void require(bool cond, const char *what)
{
    if (!cond) {
        fprintf(stderr, "fuzz_hf_tokenizer: broken promise: %s\n", what);
        abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *nul = memchr(data, 0, size);
    const size_t tok_len = nul ? (size_t)(nul - data) : size, cfg_len = nul ? size - tok_len - 1 : 0;
    char *tok = malloc(tok_len ? tok_len : 1), *cfg = malloc(cfg_len ? cfg_len : 1); /* exactly sized */
    if (!tok || !cfg) {
        free(tok), free(cfg);
        return 0;
    }
    memcpy(tok, data, tok_len);
    if (nul)
        memcpy(cfg, nul + 1, cfg_len);
    struct kt_gguf *g = NULL;
    kt_err err = {0};
    kt_status st = kt_hf_tokenizer_parse(tok, tok_len, nul ? cfg : NULL, cfg_len, "deepseek-v3", "fuzz", &g, &err);
    if (st != KT_OK) {
        require(!g, "no GGUF on failure");
        require(strncmp(err.msg, "fuzz", 4) == 0, "message names the input");
    } else {
        const struct kt_gguf_kv *tokens = kt_gguf_find_kv(g, "tokenizer.ggml.tokens");
        const struct kt_gguf_kv *types = kt_gguf_find_kv(g, "tokenizer.ggml.token_type");
        require(tokens && types && tokens->value.arr.count > 0 && tokens->value.arr.count == types->value.arr.count,
                "one type per token");
        struct kt_tokenizer *t = NULL;
        if (kt_tokenizer_create(g, &t, &err) == KT_OK) {
            int32_t *ids = NULL;
            size_t n = 0;
            kt_tokenize(t, "ab <s> c", 8, true, true, &ids, &n, &err);
            free(ids);
        }
        kt_tokenizer_destroy(t);
    }
    kt_gguf_close(g);
    free(tok), free(cfg);
    return 0;
}

void kt_fuzz_seeds(kt_fuzz_emit_fn emit)
{
    static const char seed[] = "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"ab\": 2, \"c\": 3,"
                               " \"\\u0120\": 4}, \"merges\": [\"a b\", [\"ab\", \"c\"]]}, \"added_tokens\": [{\"id\": 6,"
                               " \"content\": \"<s>\", \"special\": true}, {\"id\": 7, \"content\": \"<u>\"}]}"
                               "\0{\"bos_token\": \"<s>\", \"add_bos_token\": true, \"chat_template\": \"{{x}}\"}";
    static const char *const seeds[] = {seed};
    /* kt_fuzz_mutated_seeds reads up to the NUL: its changes are to the tokenizer.json half; the pair once whole */
    kt_fuzz_mutated_seeds(emit, seeds, 1, "\"{}[],:0-1 ab<>\\", 16);
    emit((const uint8_t *)seed, sizeof seed - 1, "seed-with-config");
}
