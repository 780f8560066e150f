/*
 * hf_tokenizer.c - tokenizer.json / tokenizer_config.json as tokenizer.ggml.*
 * keys (see hf_tokenizer.h).  Token types are GGUF's numbers (tokenizer.h
 * names them; the model layer may not include it): 1 normal, 3 control, 4
 * user-defined, 5 unused.
 */
#include "hf_tokenizer.h"

#include "gguf.h"
#include "small_file.h"

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_TOKENS (1u << 30)
#define TYPE_NORMAL 1
#define TYPE_CONTROL 3
#define TYPE_USER_DEFINED 4
#define TYPE_UNUSED 5

enum { K_MODEL, K_PRE, K_TOKENS, K_TYPES, K_MERGES, K_BOS, K_EOS, K_ADD_BOS, K_ADD_EOS, K_TEMPLATE, N_KEYS };

/* What the metadata-only GGUF points into (released at close). */
struct tok_owner {
    struct kt_gguf_kv kv[N_KEYS];
    struct kt_gguf_value *tokens, *merges; /* [n_tokens], [n_merges] */
    int32_t *types;                        /* [n_tokens] */
    char **texts;                          /* [n_tokens] owned copies; NULL: a [PAD<id>] made here */
    char **merge_texts;                    /* [n_merges] */
    uint32_t n_tokens, n_merges;
    char pre[32], *chat_template;
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
            return kt_err_set(err, KT_ERR_FORMAT, "%s/tokenizer.json: id %u is both \"%.40s\" and \"%.40s\"", label,
                              id, o->texts[id], text);
        }
        if (type != TYPE_NORMAL)
            o->types[id] = type;
        return KT_OK;
    }
    if (!(o->texts[id] = malloc(len + 1)))
        return kt_err_set(err, KT_ERR_NOMEM, "%s/tokenizer.json: out of memory", label);
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

/* A token named in tokenizer_config.json ("<s>" or {"content": "<s>"}): its id, -1 when not given. */
static kt_status named_token(const struct tok_owner *o, const json_t *cfg, const char *field, const char *label,
                             int64_t *id, kt_err *err)
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
    return kt_err_set(err, KT_ERR_FORMAT, "%s/tokenizer_config.json: %s \"%.40s\" is not a token of tokenizer.json",
                      label, field, json_string_value(v));
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

static void set_str(struct kt_gguf_kv *kv, const char *key, const char *v)
{
    kv->key = (char *)key;
    kv->value = (struct kt_gguf_value){.type = KT_GGUF_STRING, .str = str_of(v)};
}

static void set_strings(struct kt_gguf_kv *kv, const char *key, struct kt_gguf_value *items, uint32_t n)
{
    kv->key = (char *)key;
    kv->value = (struct kt_gguf_value){.type = KT_GGUF_ARRAY,
                                       .arr = {.elem_type = KT_GGUF_STRING, .count = n, .items = items}};
}

/* The config's settings: bos/eos ids, add_bos_token, chat_template; keys written into o->kv from *n on. */
static kt_status read_config(struct tok_owner *o, const json_t *cfg, const char *label, uint32_t *n, kt_err *err)
{
    int64_t bos = -1, eos = -1;
    kt_status st;
    if ((st = named_token(o, cfg, "bos_token", label, &bos, err)) || (st = named_token(o, cfg, "eos_token", label, &eos, err)))
        return st;
    if (bos >= 0)
        set_u32(&o->kv[(*n)++], "tokenizer.ggml.bos_token_id", (uint32_t)bos);
    if (eos >= 0)
        set_u32(&o->kv[(*n)++], "tokenizer.ggml.eos_token_id", (uint32_t)eos);
    const json_t *add_bos = json_object_get(cfg, "add_bos_token");
    if (add_bos && !json_is_boolean(add_bos))
        return kt_err_set(err, KT_ERR_FORMAT, "%s/tokenizer_config.json: add_bos_token must be true or false", label);
    set_bool(&o->kv[(*n)++], "tokenizer.ggml.add_bos_token", json_is_true(add_bos));
    set_bool(&o->kv[(*n)++], "tokenizer.ggml.add_eos_token", false);
    const json_t *tpl = json_object_get(cfg, "chat_template");
    if (json_is_array(tpl)) { /* [{"name": "default", "template": ...}, ...] */
        size_t i;
        const json_t *item, *chosen = NULL;
        json_array_foreach(tpl, i, item)
            if (json_is_string(json_object_get(item, "name")) &&
                strcmp(json_string_value(json_object_get(item, "name")), "default") == 0)
                chosen = json_object_get(item, "template");
        tpl = chosen;
    }
    if (tpl && !json_is_string(tpl))
        return kt_err_set(err, KT_ERR_FORMAT, "%s/tokenizer_config.json: chat_template must be a string (or a list "
                          "with a \"default\" one)", label);
    if (tpl) {
        if (!(o->chat_template = strdup(json_string_value(tpl))))
            return kt_err_set(err, KT_ERR_NOMEM, "%s: out of memory", label);
        set_str(&o->kv[(*n)++], "tokenizer.chat_template", o->chat_template);
    }
    return KT_OK;
}

kt_status kt_hf_tokenizer_parse(const char *tokenizer_json, size_t tokenizer_len, const char *config_json,
                                size_t config_len, const char *pre, const char *label, struct kt_gguf **out,
                                kt_err *err)
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
    if (config_json && !(cfg = json_loadb(config_json, config_len, JSON_REJECT_DUPLICATES, &je))) {
        st = kt_err_set(err, KT_ERR_FORMAT, "%s/tokenizer_config.json: not JSON (line %d, column %d): %s", label,
                        je.line, je.column, je.text);
        goto done;
    }
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
    snprintf(o->pre, sizeof o->pre, "%s", pre);
    if ((st = read_tokens(o, vocab, added, label, err)) || (st = read_merges(o, json_object_get(model, "merges"), label, err)))
        goto done;
    uint32_t n = 0;
    set_str(&o->kv[n++], "tokenizer.ggml.model", "gpt2");
    set_str(&o->kv[n++], "tokenizer.ggml.pre", o->pre);
    set_strings(&o->kv[n++], "tokenizer.ggml.tokens", o->tokens, o->n_tokens);
    o->kv[n].key = "tokenizer.ggml.token_type";
    o->kv[n++].value = (struct kt_gguf_value){
        .type = KT_GGUF_ARRAY, .arr = {.elem_type = KT_GGUF_INT32, .count = o->n_tokens, .data = o->types}};
    set_strings(&o->kv[n++], "tokenizer.ggml.merges", o->merges, o->n_merges);
    if (cfg && (st = read_config(o, cfg, label, &n, err)))
        goto done;
    st = kt_gguf_from_parts(o->kv, n, NULL, 0, release_owner, o, label, out, err);
    o = NULL; /* kt_gguf_from_parts released it on failure */
done:
    release_owner(o);
    json_decref(tok), json_decref(cfg);
    return st;
}

/* The pre-tokenizer config.json's model_type names. */
static kt_status family_pre(const char *dir, const char **pre, kt_err *err)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    char *text = NULL;
    size_t len = 0;
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
    json_decref(cfg);
    return st;
}

kt_status kt_hf_tokenizer_read(const char *dir, struct kt_gguf **out, kt_err *err)
{
    *out = NULL;
    const char *pre = NULL;
    kt_status st = family_pre(dir, &pre, err);
    if (st != KT_OK)
        return st;
    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    char *tok = NULL, *cfg = NULL;
    size_t tok_len = 0, cfg_len = 0;
    if ((st = kt_read_small_file(path, 256u << 20, &tok, &tok_len, err)) != KT_OK) {
        snprintf(path, sizeof path, "%s/tiktoken.model", dir);
        FILE *f = fopen(path, "rb");
        if (f) { /* Kimi ships its vocabulary as tiktoken ranks */
            fclose(f);
            st = kt_err_set(err, KT_ERR_UNSUPPORTED, "%s: a tiktoken vocabulary without tokenizer.json: kt does not "
                            "read tiktoken.model yet", dir);
        }
        return st;
    }
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    kt_err e2 = {0};
    const bool have_cfg = kt_read_small_file(path, 64u << 20, &cfg, &cfg_len, &e2) == KT_OK;
    st = kt_hf_tokenizer_parse(tok, tok_len, have_cfg ? cfg : NULL, cfg_len, pre, dir, out, err);
    free(tok), free(cfg);
    return st;
}
