/*
 * endpoints.c - kt-serve's small endpoints: /health, /version, /v1/models,
 * /metrics, /tokenize, /detokenize (vLLM's shapes), and Anthropic's
 * /v1/messages/count_tokens.
 */
#include <stdlib.h>
#include <string.h>

#include "serve_anthropic.h"
#include "serve_response.h"
#include "server.h"

#ifndef KT_VERSION
#define KT_VERSION "0.0.0"
#endif

enum MHD_Result kt_serve_health(struct kt_http_request *rq)
{
    struct kt_server *s = rq->server;
    switch (atomic_load(&s->state)) {
    case KT_SERVER_READY:
        return kt_http_send_json(rq, 200, json_pack("{s:s}", "status", "ok"));
    case KT_SERVER_LOADING:
        return kt_http_send_json(rq, 503, json_pack("{s:s, s:f}", "status", "loading", "progress",
                                                    atomic_load(&s->load_permille) / 1000.0));
    case KT_SERVER_STOPPING:
        return kt_http_send_json(rq, 503, json_pack("{s:s}", "status", "stopping"));
    default:
        return kt_http_send_json(rq, 503, json_pack("{s:s, s:s}", "status", "failed", "error", s->load_error));
    }
}

enum MHD_Result kt_serve_version(struct kt_http_request *rq)
{
    return kt_http_send_json(rq, 200, json_pack("{s:s}", "version", KT_VERSION));
}

static json_t *model_card(const struct kt_server *s)
{
    const char *path = s->o.model, *base = strrchr(path, '/');
    return json_pack("{s:s, s:s, s:I, s:s, s:s, s:I}", "id", s->served_name, "object", "model", "created",
                     (json_int_t)s->created, "owned_by", "kt-serve", "root", base ? base + 1 : path, "max_model_len",
                     (json_int_t)s->sm.n_ctx);
}

enum MHD_Result kt_serve_models(struct kt_http_request *rq, const char *id)
{
    struct kt_server *s = rq->server;
    if (id) {
        if (strcmp(id, s->served_name) == 0)
            return kt_http_send_json(rq, 200, model_card(s));
        struct kt_api_error e;
        kt_api_error_set(&e, 404, "invalid_request_error", "model_not_found", "model",
                         "The model '%.200s' does not exist (this server serves '%s')", id, s->served_name);
        return kt_http_send_error(rq, &e);
    }
    return kt_http_send_json(rq, 200, json_pack("{s:s, s:[o]}", "object", "list", "data", model_card(s)));
}

enum MHD_Result kt_serve_metrics_endpoint(struct kt_http_request *rq)
{
    struct kt_buf out = {0};
    kt_serve_metrics_render(&rq->server->metrics, rq->server->served_name, &out);
    kt_conns_metrics(rq->server, &out);
    if (atomic_load(&rq->server->state) == KT_SERVER_READY)
        kt_serve_placement_metrics(rq->server, &out);
    enum MHD_Result ok = kt_http_send(rq, 200, "text/plain; version=0.0.4; charset=utf-8", kt_buf_str(&out), out.len);
    kt_buf_free(&out);
    return ok;
}

/* ---- tokenize / detokenize ------------------------------------------------------------------------ */

static bool check_model(struct kt_server *s, const json_t *root, struct kt_api_error *e)
{
    const json_t *m = json_object_get(root, "model");
    if (!m || json_is_null(m))
        return true;
    if (json_is_string(m) && strcmp(json_string_value(m), s->served_name) == 0)
        return true;
    kt_api_error_set(e, 404, "invalid_request_error", "model_not_found", "model",
                     "The model '%.200s' does not exist (this server serves '%s')",
                     json_is_string(m) ? json_string_value(m) : "?", s->served_name);
    return false;
}

enum MHD_Result kt_serve_tokenize(struct kt_http_request *rq)
{
    struct kt_server *s = rq->server;
    struct kt_api_error e;
    json_t *root = kt_api_parse_json(kt_buf_str(&rq->body), rq->body.len, &e);
    if (!root)
        return kt_http_send_error(rq, &e);
    char *text = NULL;
    bool add_special = true, token_strs = false, ok = check_model(s, root, &e);
    const json_t *prompt = json_object_get(root, "prompt");
    const json_t *v = json_object_get(root, "add_special_tokens");
    if (ok && v && !json_is_null(v) && !json_is_boolean(v))
        ok = (kt_api_error_invalid(&e, "add_special_tokens", "'add_special_tokens' must be a boolean"), false);
    if (ok && json_is_boolean(v))
        add_special = json_is_true(v);
    v = json_object_get(root, "return_token_strs");
    if (ok && json_is_boolean(v))
        token_strs = json_is_true(v);
    if (ok && json_object_get(root, "messages")) {
        /* the chat form: the prompt the template renders (without kt's generation-time additions) */
        struct kt_api_request r;
        ok = kt_api_request_parse(KT_API_CHAT, kt_buf_str(&rq->body), rq->body.len, &r, &e);
        if (ok) {
            ok = kt_prompt_render_chat(&s->sm, &r, &text, &e);
            kt_api_request_free(&r);
        }
        add_special = false; /* the render carries its BOS */
    } else if (ok && json_is_string(prompt)) {
        text = strndup(json_string_value(prompt), json_string_length(prompt));
    } else if (ok) {
        ok = (kt_api_error_invalid(&e, "prompt", "send 'prompt' (a string) or 'messages'"), false);
    }
    json_decref(root);
    if (!ok) {
        free(text);
        return kt_http_send_error(rq, &e);
    }
    int32_t *ids = NULL;
    size_t n = 0;
    kt_err err = {0};
    if (!text || kt_tokenize(s->tok, text, strlen(text), add_special, true, &ids, &n, &err) != KT_OK) {
        free(text);
        kt_api_error_set(&e, 500, "server_error", NULL, NULL, "tokenizing failed: %.500s", err.msg);
        return kt_http_send_error(rq, &e);
    }
    free(text);
    json_t *tokens = json_array(), *strs = token_strs ? json_array() : json_null();
    for (size_t i = 0; i < n; i++) {
        json_array_append_new(tokens, json_integer(ids[i]));
        if (token_strs) {
            size_t len = 0;
            const char *t = kt_token_text(s->tok, ids[i], &len);
            json_array_append_new(strs, kt_json_text(t, len));
        }
    }
    free(ids);
    return kt_http_send_json(rq, 200, json_pack("{s:I, s:I, s:o, s:o}", "count", (json_int_t)n, "max_model_len",
                                                (json_int_t)s->sm.n_ctx, "tokens", tokens, "token_strs", strs));
}

enum MHD_Result kt_serve_detokenize(struct kt_http_request *rq)
{
    struct kt_server *s = rq->server;
    struct kt_api_error e;
    json_t *root = kt_api_parse_json(kt_buf_str(&rq->body), rq->body.len, &e);
    if (!root)
        return kt_http_send_error(rq, &e);
    bool ok = check_model(s, root, &e);
    const json_t *tokens = json_object_get(root, "tokens");
    if (ok && !json_is_array(tokens))
        ok = (kt_api_error_invalid(&e, "tokens", "'tokens' must be an array of token ids"), false);
    size_t n = ok ? json_array_size(tokens) : 0;
    int32_t *ids = ok ? malloc((n ? n : 1) * sizeof *ids) : NULL;
    for (size_t i = 0; ok && i < n; i++) {
        const json_t *t = json_array_get(tokens, i);
        if (!json_is_integer(t) || json_integer_value(t) < 0 || json_integer_value(t) >= (json_int_t)s->sm.n_vocab)
            ok = (kt_api_error_invalid(&e, "tokens", "tokens[%zu] is not a token id below %u", i, s->sm.n_vocab),
                  false);
        else if (ids)
            ids[i] = (int32_t)json_integer_value(t);
    }
    json_decref(root);
    char *text = NULL;
    size_t len = 0;
    kt_err err = {0};
    if (ok && (!ids || kt_detokenize(s->tok, ids, n, true, &text, &len, &err) != KT_OK))
        ok = (kt_api_error_set(&e, 500, "server_error", NULL, NULL, "detokenizing failed: %.500s", err.msg), false);
    free(ids);
    if (!ok) {
        free(text);
        return kt_http_send_error(rq, &e);
    }
    json_t *j = json_pack("{s:o}", "prompt", kt_json_text(text, len));
    free(text);
    return kt_http_send_json(rq, 200, j);
}

/* The prompt's tokens as /v1/messages would run it: the template's render
 * with kt's additions (thinking, a forced tool call), with no context limit,
 * so a conversation too long to run still gets its count. */
enum MHD_Result kt_serve_count_tokens(struct kt_http_request *rq)
{
    struct kt_server *s = rq->server;
    struct kt_api_request r;
    struct kt_api_error e;
    if (!kt_anthropic_request_parse(kt_buf_str(&rq->body), rq->body.len, true, &r, NULL, &e))
        return kt_http_send_error(rq, &e);
    if (strcmp(r.model, s->served_name) != 0) {
        kt_api_error_set(&e, 404, "not_found_error", NULL, "model",
                         "model: '%.200s' does not exist (this server serves '%s')", r.model, s->served_name);
        kt_api_request_free(&r);
        return kt_http_send_error(rq, &e);
    }
    struct kt_serve_model unlimited = s->sm;
    unlimited.n_ctx = UINT32_MAX;
    struct kt_prompt p;
    bool ok = kt_prompt_prepare(&unlimited, &r, "count", &p, &e);
    kt_api_request_free(&r);
    if (!ok)
        return kt_http_send_error(rq, &e);
    json_t *j = json_pack("{s:I}", "input_tokens", (json_int_t)p.n_ids);
    kt_prompt_free(&p);
    return kt_http_send_json(rq, 200, j);
}
