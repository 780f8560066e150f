/*
 * hf_tokenizer.c - tokenizer.json or tiktoken.model, with
 * tokenizer_config.json and chat_template.jinja, as tokenizer.ggml.* keys
 * (see hf_tokenizer.h; hf_tiktoken.c reads tiktoken.model's lines).  Token
 * types are GGUF's numbers (tokenizer.h names them; the model layer may not
 * include it): 1 normal, 3 control, 4 user-defined, 5 unused.
 */
#include "hf_tokenizer.h"

#include "gguf.h"
#include "hf_tiktoken.h"
#include "small_file.h"

#include <errno.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define MAX_TOKENS (1u << 30)
#define KIMI_RESERVED 256 /* tokenization_kimi.py: num_reserved_special_tokens */
/* Kimi's tiktoken.model holds 163,584 lines (the base64 of a token, mostly a few bytes, and its rank); the
 * limit bounds a hostile file's memory (a small multiple of its size) and time (hf_tiktoken.h) */
#define TIKTOKEN_MAX_BYTES (32u << 20)
#define TYPE_NORMAL 1
#define TYPE_CONTROL 3
#define TYPE_USER_DEFINED 4
#define TYPE_UNUSED 5

enum { K_MODEL, K_PRE, K_TOKENS, K_TYPES, K_MERGES, K_BOS, K_EOS, K_PAD, K_ADD_BOS, K_ADD_EOS, K_TEMPLATE, N_KEYS };

/* What the metadata-only GGUF points into (released at close). */
struct tok_owner {
    struct kt_gguf_kv kv[N_KEYS];
    struct kt_gguf_value *tokens, *merges; /* [n_tokens], [n_merges] */
    int32_t *types;                        /* [n_tokens] */
    char **texts;                          /* [n_tokens] owned copies; NULL: a [PAD<id>] made here */
    char **merge_texts;                    /* [n_merges] */
    uint32_t n_tokens, n_merges;
    char pre[32], *chat_template;
    size_t chat_template_len;
    const char *file; /* the file the vocabulary came from, for messages */
};

static void release_owner(void *p)
{
    struct tok_owner *o = p;
    if (!o)
        return;
    for (uint32_t i = 0; o->texts && i < o->n_tokens; i++)
        free(o->texts[i]);
    for (uint32_t i = 0; o->merge_texts && i < o->n_merges; i++)
        free(o->merge_texts[i]);
    free(o->texts), free(o->merge_texts), free(o->tokens), free(o->merges), free(o->types);
    free(o->chat_template);
    free(o);
}

static struct kt_gguf_str str_of(const char *s)
{
    return (struct kt_gguf_str){s, strlen(s)};
}

/* Token id `id` gets text (len bytes) and type; KT_ERR_FORMAT when it has another text already. */
static kt_status put_token(struct tok_owner *o, uint32_t id, const char *text, size_t len, int32_t type, const char *label,
                      kt_err *err)
{
    if (o->texts[id]) {
        if (strlen(o->texts[id]) != len || memcmp(o->texts[id], text, len) != 0) {
            return kt_err_set(err, KT_ERR_FORMAT, "%s/%s: id %u is both \"%.40s\" and \"%.40s\"", label, o->file,
                              id, o->texts[id], text);
        }
        if (type != TYPE_NORMAL)
            o->types[id] = type;
        return KT_OK;
    }
    if (!(o->texts[id] = malloc(len + 1)))
        return kt_err_set(err, KT_ERR_NOMEM, "%s/%s: out of memory", label, o->file);
    memcpy(o->texts[id], text, len);
    o->texts[id][len] = '\0';
    o->types[id] = type;
    return KT_OK;
}

static bool token_id(const json_t *v, json_int_t *id)
{
    *id = json_is_integer(v) ? json_integer_value(v) : -1;
    return *id >= 0 && *id < (json_int_t)MAX_TOKENS;
}

/* The vocabulary: vocab, then added_tokens; ids never given become unused pads. */
static kt_status read_tokens(struct tok_owner *o, const json_t *vocab, const json_t *added, const char *label,
                             kt_err *err)
{
    json_int_t max_id = -1, id;
    const char *text;
    const json_t *v;
    size_t i;
    json_object_foreach((json_t *)vocab, text, v) {
        if (!token_id(v, &id))
            return kt_err_set(err, KT_ERR_FORMAT, "%s/tokenizer.json: model.vocab[\"%.40s\"] must be an id from 0 "
                              "to 2^30", label, text);
        max_id = id > max_id ? id : max_id;
    }
    json_array_foreach(added, i, v) {
        if (!json_is_object(v) || !token_id(json_object_get(v, "id"), &id) ||
            !json_is_string(json_object_get(v, "content")))
            return kt_err_set(err, KT_ERR_FORMAT, "%s/tokenizer.json: added_tokens[%zu] needs an id (0 to 2^30) and "
                              "a content string", label, i);
        max_id = id > max_id ? id : max_id;
    }
    if (max_id < 0)
        return kt_err_set(err, KT_ERR_FORMAT, "%s/tokenizer.json: no tokens", label);
    o->n_tokens = (uint32_t)max_id + 1;
    o->texts = calloc(o->n_tokens, sizeof *o->texts);
    o->types = calloc(o->n_tokens, sizeof *o->types);
    o->tokens = calloc(o->n_tokens, sizeof *o->tokens);
    if (!o->texts || !o->types || !o->tokens)
        return kt_err_set(err, KT_ERR_NOMEM, "%s/tokenizer.json: out of memory for %u tokens", label, o->n_tokens);
    json_object_foreach((json_t *)vocab, text, v) {
        token_id(v, &id);
        kt_status st = put_token(o, (uint32_t)id, text, strlen(text), TYPE_NORMAL, label, err);
        if (st != KT_OK)
            return st;
    }
    json_array_foreach(added, i, v) {
        token_id(json_object_get(v, "id"), &id);
        const json_t *c = json_object_get(v, "content");
        kt_status st = put_token(o, (uint32_t)id, json_string_value(c), json_string_length(c),
                                 json_is_true(json_object_get(v, "special")) ? TYPE_CONTROL : TYPE_USER_DEFINED, label,
                                 err);
        if (st != KT_OK)
            return st;
    }
    for (uint32_t t = 0; t < o->n_tokens; t++) {
        if (!o->texts[t]) {
            char pad[32];
            snprintf(pad, sizeof pad, "[PAD%u]", t);
            kt_status st = put_token(o, t, pad, strlen(pad), TYPE_UNUSED, label, err);
            if (st != KT_OK)
                return st;
        }
        o->tokens[t] = (struct kt_gguf_value){.type = KT_GGUF_STRING, .str = str_of(o->texts[t])};
    }
    return KT_OK;
}

static kt_status read_merges(struct tok_owner *o, const json_t *merges, const char *label, kt_err *err)
{
    if (merges && !json_is_array(merges))
        return kt_err_set(err, KT_ERR_FORMAT, "%s/tokenizer.json: model.merges must be an array", label);
    o->n_merges = (uint32_t)json_array_size(merges);
    o->merge_texts = calloc(o->n_merges ? o->n_merges : 1, sizeof *o->merge_texts);
    o->merges = calloc(o->n_merges ? o->n_merges : 1, sizeof *o->merges);
    if (!o->merge_texts || !o->merges)
        return kt_err_set(err, KT_ERR_NOMEM, "%s/tokenizer.json: out of memory for %u merges", label, o->n_merges);
    size_t i;
    const json_t *m;
    json_array_foreach(merges, i, m) {
        const json_t *a = json_array_get(m, 0), *b = json_array_get(m, 1);
        char *text = NULL;
        if (json_is_string(m) && strchr(json_string_value(m), ' ')) {
            text = strdup(json_string_value(m));
        } else if (json_is_array(m) && json_array_size(m) == 2 && json_is_string(a) && json_is_string(b)) {
            const size_t la = json_string_length(a), lb = json_string_length(b);
            if ((text = malloc(la + lb + 2))) {
                memcpy(text, json_string_value(a), la);
                text[la] = ' ';
                memcpy(text + la + 1, json_string_value(b), lb);
                text[la + lb + 1] = '\0';
            }
        } else {
            return kt_err_set(err, KT_ERR_FORMAT, "%s/tokenizer.json: model.merges[%zu] must be \"a b\" or [\"a\", "
                              "\"b\"]", label, i);
        }
        if (!text)
            return kt_err_set(err, KT_ERR_NOMEM, "%s/tokenizer.json: out of memory", label);
        o->merge_texts[i] = text;
        o->merges[i] = (struct kt_gguf_value){.type = KT_GGUF_STRING, .str = str_of(text)};
    }
    return KT_OK;
}

/* A token named in tokenizer_config.json ("<s>" or {"content": "<s>"}): its id, -1 when not given (or, when
 * not required, not a token). */
static kt_status named_token(const struct tok_owner *o, const json_t *cfg, const char *field, bool required,
                             const char *label, int64_t *id, kt_err *err)
{
    *id = -1;
    const json_t *v = json_object_get(cfg, field);
    if (json_is_object(v))
        v = json_object_get(v, "content");
    if (!v || json_is_null(v))
        return KT_OK;
    if (!json_is_string(v))
        return kt_err_set(err, KT_ERR_FORMAT, "%s/tokenizer_config.json: %s must be a token text", label, field);
    for (uint32_t t = 0; t < o->n_tokens; t++)
        if (strcmp(o->texts[t], json_string_value(v)) == 0) {
            *id = t;
            return KT_OK;
        }
    if (!required)
        return KT_OK;
    return kt_err_set(err, KT_ERR_FORMAT, "%s/tokenizer_config.json: %s \"%.40s\" is not a token of %s", label,
                      field, json_string_value(v), o->file);
}

static void set_u32(struct kt_gguf_kv *kv, const char *key, uint32_t v)
{
    kv->key = (char *)key;
    kv->value = (struct kt_gguf_value){.type = KT_GGUF_UINT32, .u32 = v};
}

static void set_bool(struct kt_gguf_kv *kv, const char *key, bool v)
{
    kv->key = (char *)key;
    kv->value = (struct kt_gguf_value){.type = KT_GGUF_BOOL, .b = v};
}

static void set_str(struct kt_gguf_kv *kv, const char *key, const char *v, size_t len)
{
    kv->key = (char *)key;
    kv->value = (struct kt_gguf_value){.type = KT_GGUF_STRING, .str = {v, len}};
}

static void set_strings(struct kt_gguf_kv *kv, const char *key, struct kt_gguf_value *items, uint32_t n)
{
    kv->key = (char *)key;
    kv->value = (struct kt_gguf_value){.type = KT_GGUF_ARRAY,
                                       .arr = {.elem_type = KT_GGUF_STRING, .count = n, .items = items}};
}

/* The chat template: chat_template.jinja's text when the directory has one (it replaces the config's, as
 * transformers' from_pretrained does), else tokenizer_config.json's chat_template: a string, or a list of
 * {"name", "template"} whose "default" one is taken. */
static kt_status read_template(struct tok_owner *o, const json_t *cfg, const char *jinja, size_t jinja_len,
                               const char *label, kt_err *err)
{
    const char *text = jinja;
    size_t len = jinja_len;
    if (!jinja) {
        const json_t *tpl = json_object_get(cfg, "chat_template");
        if (json_is_array(tpl)) {
            size_t i;
            const json_t *item, *chosen = NULL;
            json_array_foreach(tpl, i, item)
                if (json_is_string(json_object_get(item, "name")) &&
                    strcmp(json_string_value(json_object_get(item, "name")), "default") == 0)
                    chosen = json_object_get(item, "template");
            tpl = chosen;
        }
        if (tpl && !json_is_string(tpl))
            return kt_err_set(err, KT_ERR_FORMAT, "%s/tokenizer_config.json: chat_template must be a string (or a "
                              "list with a \"default\" one)", label);
        if (!tpl)
            return KT_OK;
        text = json_string_value(tpl);
        len = json_string_length(tpl);
    }
    if (!(o->chat_template = malloc(len + 1)))
        return kt_err_set(err, KT_ERR_NOMEM, "%s: out of memory", label);
    memcpy(o->chat_template, text, len);
    o->chat_template[len] = '\0';
    o->chat_template_len = len;
    return KT_OK;
}

/* The config's settings: bos/eos/pad ids, add_bos_token; keys written into o->kv from *n on. */
static kt_status read_config(struct tok_owner *o, const json_t *cfg, const char *label, uint32_t *n, kt_err *err)
{
    int64_t bos = -1, eos = -1, pad = -1;
    kt_status st;
    if ((st = named_token(o, cfg, "bos_token", true, label, &bos, err)) ||
        (st = named_token(o, cfg, "eos_token", true, label, &eos, err)) ||
        (st = named_token(o, cfg, "pad_token", false, label, &pad, err)))
        return st;
    if (bos >= 0)
        set_u32(&o->kv[(*n)++], "tokenizer.ggml.bos_token_id", (uint32_t)bos);
    if (eos >= 0)
        set_u32(&o->kv[(*n)++], "tokenizer.ggml.eos_token_id", (uint32_t)eos);
    if (pad >= 0)
        set_u32(&o->kv[(*n)++], "tokenizer.ggml.padding_token_id", (uint32_t)pad);
    const json_t *add_bos = json_object_get(cfg, "add_bos_token");
    if (add_bos && !json_is_boolean(add_bos))
        return kt_err_set(err, KT_ERR_FORMAT, "%s/tokenizer_config.json: add_bos_token must be true or false", label);
    set_bool(&o->kv[(*n)++], "tokenizer.ggml.add_bos_token", json_is_true(add_bos));
    set_bool(&o->kv[(*n)++], "tokenizer.ggml.add_eos_token", false);
    return KT_OK;
}

/* o's tokens and merges made: the keys, the config's settings and the template, as a metadata-only GGUF.
 * Takes o (released on failure). */
static kt_status finish(struct tok_owner *o, const json_t *cfg, const char *jinja, size_t jinja_len,
                        const char *label, struct kt_gguf **out, kt_err *err)
{
    uint32_t n = 0;
    kt_status st;
    set_str(&o->kv[n++], "tokenizer.ggml.model", "gpt2", 4);
    set_str(&o->kv[n++], "tokenizer.ggml.pre", o->pre, strlen(o->pre));
    set_strings(&o->kv[n++], "tokenizer.ggml.tokens", o->tokens, o->n_tokens);
    o->kv[n].key = "tokenizer.ggml.token_type";
    o->kv[n++].value = (struct kt_gguf_value){
        .type = KT_GGUF_ARRAY, .arr = {.elem_type = KT_GGUF_INT32, .count = o->n_tokens, .data = o->types}};
    set_strings(&o->kv[n++], "tokenizer.ggml.merges", o->merges, o->n_merges);
    if ((cfg && (st = read_config(o, cfg, label, &n, err)) != KT_OK) ||
        (st = read_template(o, cfg, jinja, jinja_len, label, err)) != KT_OK) {
        release_owner(o);
        return st;
    }
    if (o->chat_template)
        set_str(&o->kv[n++], "tokenizer.chat_template", o->chat_template, o->chat_template_len);
    return kt_gguf_from_parts(o->kv, n, NULL, 0, release_owner, o, label, out, err); /* releases o on failure */
}

static kt_status load_config(const char *config_json, size_t config_len, const char *label, json_t **cfg,
                             kt_err *err)
{
    json_error_t je;
    *cfg = NULL;
    if (config_json && !(*cfg = json_loadb(config_json, config_len, JSON_REJECT_DUPLICATES, &je)))
        return kt_err_set(err, KT_ERR_FORMAT, "%s/tokenizer_config.json: not JSON (line %d, column %d): %s", label,
                          je.line, je.column, je.text);
    if (*cfg && !json_is_object(*cfg)) {
        json_decref(*cfg);
        *cfg = NULL;
        return kt_err_set(err, KT_ERR_FORMAT, "%s/tokenizer_config.json: not a JSON object", label);
    }
    return KT_OK;
}

static kt_status parse_tokenizer_json(const char *tokenizer_json, size_t tokenizer_len, const char *config_json,
                                      size_t config_len, const char *jinja, size_t jinja_len, const char *pre,
                                      const char *label, struct kt_gguf **out, kt_err *err)
{
    *out = NULL;
    json_error_t je;
    json_t *tok = json_loadb(tokenizer_json, tokenizer_len, JSON_REJECT_DUPLICATES, &je), *cfg = NULL;
    kt_status st = KT_OK;
    struct tok_owner *o = NULL;
    if (!tok) {
        st = kt_err_set(err, KT_ERR_FORMAT, "%s/tokenizer.json: not JSON (line %d, column %d): %s", label, je.line,
                        je.column, je.text);
        goto done;
    }
    if ((st = load_config(config_json, config_len, label, &cfg, err)) != KT_OK)
        goto done;
    const json_t *model = json_object_get(tok, "model");
    const char *type = json_string_value(json_object_get(model, "type"));
    if (!type || strcmp(type, "BPE") != 0) {
        st = kt_err_set(err, KT_ERR_UNSUPPORTED, "%s/tokenizer.json: model.type \"%.32s\": kt reads byte-level BPE "
                        "tokenizers", label, type ? type : "(missing)");
        goto done;
    }
    const json_t *vocab = json_object_get(model, "vocab"), *added = json_object_get(tok, "added_tokens");
    if (!json_is_object(vocab) || (added && !json_is_array(added) && !json_is_null(added))) {
        st = kt_err_set(err, KT_ERR_FORMAT, "%s/tokenizer.json: model.vocab must be an object and added_tokens a "
                        "list", label);
        goto done;
    }
    if (!(o = calloc(1, sizeof *o))) {
        st = kt_err_set(err, KT_ERR_NOMEM, "%s: out of memory", label);
        goto done;
    }
    o->file = "tokenizer.json";
    snprintf(o->pre, sizeof o->pre, "%s", pre);
    if ((st = read_tokens(o, vocab, added, label, err)) || (st = read_merges(o, json_object_get(model, "merges"), label, err)))
        goto done;
    st = finish(o, cfg, jinja, jinja_len, label, out, err);
    o = NULL;
done:
    release_owner(o);
    json_decref(tok), json_decref(cfg);
    return st;
}

kt_status kt_hf_tokenizer_parse(const char *tokenizer_json, size_t tokenizer_len, const char *config_json,
                                size_t config_len, const char *pre, const char *label, struct kt_gguf **out,
                                kt_err *err)
{
    return parse_tokenizer_json(tokenizer_json, tokenizer_len, config_json, config_len, NULL, 0, pre, label, out,
                                err);
}

/* ---- tiktoken.model ------------------------------------------------------------------------ */

/* An id key of added_tokens_decoder ("163584"): its value, or -1. */
static int64_t decoder_id(const char *key)
{
    int64_t id = 0;
    if (!*key || (key[0] == '0' && key[1]))
        return -1;
    for (const char *c = key; *c; c++) {
        if (*c < '0' || *c > '9' || id >= (int64_t)MAX_TOKENS)
            return -1;
        id = id * 10 + (*c - '0');
    }
    return id < (int64_t)MAX_TOKENS ? id : -1;
}

/* Kimi's token list (tokenization_kimi.py, and llama.cpp's converter over it): ids below n_ranks are
 * tiktoken's ranks, NORMAL; the 256 ids after them are its special tokens, every one CONTROL whatever
 * "special" says, named by added_tokens_decoder or else <|reserved_token_ID|>; ids from there up to
 * config.json's vocab_size (when given) are unused [PAD<id>] as the converter writes them. */
static kt_status tiktoken_tokens(struct tok_owner *o, struct kt_tiktoken *tk, const json_t *cfg,
                                 uint32_t vocab_size, const char *label, kt_err *err)
{
    const uint32_t n_ranks = tk->n_ranks;
    if (vocab_size && vocab_size < n_ranks)
        return kt_err_set(err, KT_ERR_FORMAT, "%s: config.json's vocab_size %u is below tiktoken.model's %u ranks",
                          label, vocab_size, n_ranks);
    o->n_tokens = vocab_size ? vocab_size : n_ranks + KIMI_RESERVED;
    const uint32_t special_end = n_ranks + KIMI_RESERVED < o->n_tokens ? n_ranks + KIMI_RESERVED : o->n_tokens;
    o->texts = calloc(o->n_tokens, sizeof *o->texts);
    o->types = calloc(o->n_tokens, sizeof *o->types);
    o->tokens = calloc(o->n_tokens, sizeof *o->tokens);
    if (!o->texts || !o->types || !o->tokens)
        return kt_err_set(err, KT_ERR_NOMEM, "%s: out of memory for %u tokens", label, o->n_tokens);
    for (uint32_t r = 0; r < n_ranks; r++) { /* taken from tk */
        o->texts[r] = tk->texts[r];
        tk->texts[r] = NULL;
        o->types[r] = TYPE_NORMAL;
    }
    const json_t *decoder = json_object_get(cfg, "added_tokens_decoder"), *v;
    if (decoder && !json_is_object(decoder))
        return kt_err_set(err, KT_ERR_FORMAT, "%s/tokenizer_config.json: added_tokens_decoder must be an object of "
                          "id -> token", label);
    const char *key;
    o->file = "tokenizer_config.json";
    json_object_foreach((json_t *)decoder, key, v) {
        const int64_t id = decoder_id(key);
        const json_t *content = json_object_get(v, "content");
        if (id < 0 || !json_is_string(content) || json_string_length(content) == 0)
            return kt_err_set(err, KT_ERR_FORMAT, "%s/tokenizer_config.json: added_tokens_decoder[\"%.20s\"] needs "
                              "an id (0 to 2^30) and a content string", label, key);
        if (id < n_ranks)
            return kt_err_set(err, KT_ERR_FORMAT, "%s/tokenizer_config.json: added_tokens_decoder[\"%.20s\"] is "
                              "rank %lld of tiktoken.model", label, key, (long long)id);
        if (id >= special_end)
            return kt_err_set(err, KT_ERR_FORMAT, "%s/tokenizer_config.json: added_tokens_decoder[\"%.20s\"] is "
                              "not one of the %u special ids %u..%u after tiktoken.model's %u ranks (a truncated "
                              "tiktoken.model?)", label, key, special_end - n_ranks, n_ranks, special_end - 1,
                              n_ranks);
        kt_status st = put_token(o, (uint32_t)id, json_string_value(content), json_string_length(content),
                                 TYPE_CONTROL, label, err);
        if (st != KT_OK)
            return st;
    }
    o->file = "tiktoken.model";
    for (uint32_t t = n_ranks; t < o->n_tokens; t++) {
        if (!o->texts[t]) {
            char name[40];
            if (t < special_end)
                snprintf(name, sizeof name, "<|reserved_token_%u|>", t);
            else
                snprintf(name, sizeof name, "[PAD%u]", t);
            kt_status st = put_token(o, t, name, strlen(name), t < special_end ? TYPE_CONTROL : TYPE_UNUSED, label,
                                     err);
            if (st != KT_OK)
                return st;
        }
    }
    for (uint32_t t = 0; t < o->n_tokens; t++)
        o->tokens[t] = (struct kt_gguf_value){.type = KT_GGUF_STRING, .str = str_of(o->texts[t])};
    /* the merges, taken from tk */
    o->n_merges = tk->n_merges;
    o->merge_texts = tk->merges;
    tk->merges = NULL;
    tk->n_merges = 0;
    if (!(o->merges = calloc(o->n_merges ? o->n_merges : 1, sizeof *o->merges)))
        return kt_err_set(err, KT_ERR_NOMEM, "%s: out of memory for %u merges", label, o->n_merges);
    for (uint32_t i = 0; i < o->n_merges; i++)
        o->merges[i] = (struct kt_gguf_value){.type = KT_GGUF_STRING, .str = str_of(o->merge_texts[i])};
    return KT_OK;
}

static kt_status parse_tiktoken(const char *model, size_t model_len, const char *config_json, size_t config_len,
                                const char *jinja, size_t jinja_len, uint32_t vocab_size, const char *label,
                                struct kt_gguf **out, kt_err *err)
{
    *out = NULL;
    json_t *cfg = NULL;
    struct kt_tiktoken tk = {0};
    struct tok_owner *o = NULL;
    char file[4200];
    snprintf(file, sizeof file, "%s/tiktoken.model", label);
    kt_status st = load_config(config_json, config_len, label, &cfg, err);
    if (st == KT_OK)
        st = kt_tiktoken_parse(model, model_len, file, &tk, err);
    if (st != KT_OK)
        goto done;
    if (!(o = calloc(1, sizeof *o))) {
        st = kt_err_set(err, KT_ERR_NOMEM, "%s: out of memory", label);
        goto done;
    }
    snprintf(o->pre, sizeof o->pre, "kimi-k2"); /* the split pattern is tokenization_kimi.py's, not the file's */
    if ((st = tiktoken_tokens(o, &tk, cfg, vocab_size, label, err)) != KT_OK)
        goto done;
    st = finish(o, cfg, jinja, jinja_len, label, out, err);
    o = NULL;
done:
    release_owner(o);
    kt_tiktoken_free(&tk);
    json_decref(cfg);
    return st;
}

kt_status kt_hf_tokenizer_parse_tiktoken(const char *model, size_t model_len, const char *config_json,
                                         size_t config_len, uint32_t vocab_size, const char *label,
                                         struct kt_gguf **out, kt_err *err)
{
    return parse_tiktoken(model, model_len, config_json, config_len, NULL, 0, vocab_size, label, out, err);
}

/* ---- a directory ----------------------------------------------------------------------------- */

/* config.json's pre-tokenizer (named by model_type) and vocab_size (top level or text_config's; 0 if neither). */
static kt_status read_family(const char *dir, const char **pre, uint32_t *vocab_size, kt_err *err)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    char *text = NULL;
    size_t len = 0;
    *vocab_size = 0;
    kt_status st = kt_read_small_file(path, 1u << 20, &text, &len, err);
    if (st != KT_OK)
        return st;
    json_t *cfg = json_loadb(text, len, 0, NULL);
    free(text);
    const char *type = json_string_value(json_object_get(cfg, "model_type"));
    *pre = !type                           ? NULL
           : strcmp(type, "deepseek_v3") == 0 ? "deepseek-v3"
           : strcmp(type, "kimi_k2") == 0 || strcmp(type, "kimi_k25") == 0 ? "kimi-k2"
                                                                           : NULL;
    if (!*pre)
        st = kt_err_set(err, KT_ERR_UNSUPPORTED, "%s: model_type \"%.32s\" names no pre-tokenizer kt knows "
                        "(deepseek_v3, kimi_k2, kimi_k25)", path, type ? type : "(missing)");
    const json_t *vs = json_object_get(cfg, "vocab_size");
    if (!vs)
        vs = json_object_get(json_object_get(cfg, "text_config"), "vocab_size");
    if (st == KT_OK && vs) {
        const json_int_t v = json_is_integer(vs) ? json_integer_value(vs) : 0;
        if (v <= 0 || v > (json_int_t)MAX_TOKENS)
            st = kt_err_set(err, KT_ERR_FORMAT, "%s: vocab_size must be a count of tokens from 1 to 2^30", path);
        else
            *vocab_size = (uint32_t)v;
    }
    json_decref(cfg);
    return st;
}

/* DIR/name into *text when it exists (*text NULL when it does not); an unreadable one is an error. */
static kt_status read_optional(const char *dir, const char *name, size_t max_bytes, char **text, size_t *len,
                               kt_err *err)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    *text = NULL;
    *len = 0;
    struct stat sb;
    if (stat(path, &sb) != 0 && errno == ENOENT)
        return KT_OK;
    return kt_read_small_file(path, max_bytes, text, len, err);
}

kt_status kt_hf_tokenizer_read(const char *dir, struct kt_gguf **out, kt_err *err)
{
    *out = NULL;
    const char *pre = NULL;
    uint32_t vocab_size = 0;
    kt_status st = read_family(dir, &pre, &vocab_size, err);
    if (st != KT_OK)
        return st;
    char *tok = NULL, *tiktoken = NULL, *cfg = NULL, *jinja = NULL;
    size_t tok_len = 0, tiktoken_len = 0, cfg_len = 0, jinja_len = 0;
    if ((st = read_optional(dir, "tokenizer.json", 256u << 20, &tok, &tok_len, err)) != KT_OK ||
        (!tok &&
         (st = read_optional(dir, "tiktoken.model", TIKTOKEN_MAX_BYTES, &tiktoken, &tiktoken_len, err)) != KT_OK) ||
        (st = read_optional(dir, "tokenizer_config.json", 64u << 20, &cfg, &cfg_len, err)) != KT_OK ||
        (st = read_optional(dir, "chat_template.jinja", 16u << 20, &jinja, &jinja_len, err)) != KT_OK)
        goto done;
    if (jinja && memchr(jinja, '\0', jinja_len)) {
        st = kt_err_set(err, KT_ERR_FORMAT, "%s/chat_template.jinja: a NUL byte in the template", dir);
        goto done;
    }
    if (tok) {
        st = parse_tokenizer_json(tok, tok_len, cfg, cfg_len, jinja, jinja_len, pre, dir, out, err);
    } else if (tiktoken) {
        if (strcmp(pre, "kimi-k2") != 0)
            st = kt_err_set(err, KT_ERR_UNSUPPORTED, "%s: tiktoken.model without tokenizer.json, but config.json's "
                            "model_type is not Kimi's: kt knows the split pattern of Kimi's tiktoken tokenizer only",
                            dir);
        else
            st = parse_tiktoken(tiktoken, tiktoken_len, cfg, cfg_len, jinja, jinja_len, vocab_size, dir, out, err);
    } else {
        st = kt_err_set(err, KT_ERR_NOT_FOUND, "%s: no tokenizer.json (DeepSeek) or tiktoken.model (Kimi)", dir);
    }
done:
    free(tok), free(tiktoken), free(cfg), free(jinja);
    return st;
}
