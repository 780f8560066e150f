/*
 * serve_request.c - OpenAI request parsing and checking (see serve_request.h).
 *
 * Each field has one small reader that accepts null as absent and reports a
 * wrong type or range as a 400 naming the field, so the checks read like the
 * API reference.  Ranges follow OpenAI (and vLLM for its extensions).
 */
#include "serve_request.h"

#include "grammar.h"
#include "json_schema.h"
#include "unicode.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- errors ------------------------------------------------------------------------ */

/* s (a buffer of cap bytes, NUL-terminated) made well-formed UTF-8: a
 * message quotes the client's bytes (a field name, a value cut at %.40s),
 * and a JSON string must be UTF-8, so ill-formed parts become U+FFFD and a
 * code point cut by the buffer's end is dropped. */
void kt_api_utf8_fix(char *s, size_t cap)
{
    const size_t n = strlen(s);
    if (kt_utf8_valid(s, n))
        return;
    char tmp[3 * sizeof ((struct kt_api_error *)0)->message];
    size_t m = n < sizeof tmp / 3 ? kt_utf8_sanitize(s, n, tmp) : 0;
    if (m >= cap) {
        m = cap - 1;
        while (m > 0 && ((unsigned char)tmp[m] & 0xC0) == 0x80) /* not inside a code point */
            m--;
    }
    memcpy(s, tmp, m);
    s[m] = 0;
}

static void error_vset(struct kt_api_error *e, int status, const char *type, const char *code, const char *param,
                       const char *fmt, va_list ap)
{
    e->http_status = status;
    snprintf(e->type, sizeof e->type, "%s", type ? type : "");
    snprintf(e->code, sizeof e->code, "%s", code ? code : "");
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    kt_api_utf8_fix(e->param, sizeof e->param);
    kt_api_utf8_fix(e->message, sizeof e->message);
}

void kt_api_error_set(struct kt_api_error *e, int http_status, const char *type, const char *code,
                      const char *param, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    error_vset(e, http_status, type, code, param, fmt, ap);
    va_end(ap);
}

void kt_api_error_invalid(struct kt_api_error *e, const char *param, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    error_vset(e, 400, "invalid_request_error", NULL, param, fmt, ap);
    va_end(ap);
}

json_t *kt_api_error_json(const struct kt_api_error *e)
{
    json_t *inner = json_object();
    json_object_set_new(inner, "message", json_string(e->message[0] ? e->message : "error"));
    json_object_set_new(inner, "type", json_string(e->type[0] ? e->type : "server_error"));
    json_object_set_new(inner, "param", e->param[0] ? json_string(e->param) : json_null());
    json_object_set_new(inner, "code", e->code[0] ? json_string(e->code) : json_null());
    json_t *outer = json_object();
    json_object_set_new(outer, "error", inner);
    return outer;
}

/* ---- JSON -------------------------------------------------------------------------- */

static bool depth_ok(const json_t *v, int depth)
{
    if (depth > KT_API_MAX_JSON_DEPTH)
        return false;
    if (json_is_array(v)) {
        size_t i;
        const json_t *x;
        json_array_foreach(v, i, x) if (!depth_ok(x, depth + 1)) return false;
    } else if (json_is_object(v)) {
        const char *k;
        const json_t *x;
        json_object_foreach((json_t *)v, k, x) if (!depth_ok(x, depth + 1)) return false;
    }
    return true;
}

json_t *kt_api_parse_json(const char *body, size_t len, struct kt_api_error *e)
{
    json_error_t je;
    json_t *root = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);
    if (!root) {
        kt_api_error_invalid(e, NULL, "the request body is not valid JSON: %s (line %d, column %d)", je.text,
                             je.line, je.column);
        return NULL;
    }
    if (!json_is_object(root)) {
        json_decref(root);
        kt_api_error_invalid(e, NULL, "the request body must be a JSON object");
        return NULL;
    }
    if (!depth_ok(root, 0)) {
        json_decref(root);
        kt_api_error_invalid(e, NULL, "the request body nests deeper than %d levels", KT_API_MAX_JSON_DEPTH);
        return NULL;
    }
    return root;
}

static const char *type_name(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    case JSON_NULL: return "null";
    }
    return "a value";
}

/* Each reader: absent or null leaves *out alone and succeeds. */

static bool get_bool(const json_t *o, const char *key, bool *out, struct kt_api_error *e)
{
    const json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v))
        return true;
    if (!json_is_boolean(v)) {
        kt_api_error_invalid(e, key, "'%s' must be a boolean, not %s", key, type_name(v));
        return false;
    }
    *out = json_is_true(v);
    return true;
}

static bool get_number(const json_t *o, const char *key, double lo, double hi, bool *given, double *out,
                       struct kt_api_error *e)
{
    const json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v))
        return true;
    if (!json_is_number(v)) {
        kt_api_error_invalid(e, key, "'%s' must be a number, not %s", key, type_name(v));
        return false;
    }
    double x = json_number_value(v);
    if (!(x >= lo && x <= hi)) {
        kt_api_error_invalid(e, key, "'%s' must be in [%g, %g], got %g", key, lo, hi, x);
        return false;
    }
    *out = x;
    if (given)
        *given = true;
    return true;
}

static bool get_float(const json_t *o, const char *key, double lo, double hi, float *out, struct kt_api_error *e)
{
    double x = *out;
    if (!get_number(o, key, lo, hi, NULL, &x, e))
        return false;
    *out = (float)x;
    return true;
}

static bool get_int(const json_t *o, const char *key, long long lo, long long hi, bool *given, long long *out,
                    struct kt_api_error *e)
{
    const json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v))
        return true;
    long long x;
    if (json_is_integer(v)) {
        x = json_integer_value(v);
    } else if (json_is_real(v) && json_real_value(v) == floor(json_real_value(v)) &&
               fabs(json_real_value(v)) < 9e15) {
        x = (long long)json_real_value(v); /* 5.0 is an integer to most clients */
    } else {
        kt_api_error_invalid(e, key, "'%s' must be an integer, not %s", key, type_name(v));
        return false;
    }
    if (x < lo || x > hi) {
        kt_api_error_invalid(e, key, "'%s' must be in [%lld, %lld], got %lld", key, lo, hi, x);
        return false;
    }
    *out = x;
    if (given)
        *given = true;
    return true;
}

static char *dup_json_string(const json_t *v)
{
    size_t len = json_string_length(v);
    char *s = malloc(len + 1);
    if (s) {
        memcpy(s, json_string_value(v), len);
        s[len] = '\0';
    }
    return s;
}

static bool no_nul(const json_t *v)
{
    return memchr(json_string_value(v), '\0', json_string_length(v)) == NULL;
}

static bool get_string(const json_t *o, const char *key, char **out, struct kt_api_error *e)
{
    const json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v))
        return true;
    if (!json_is_string(v) || !no_nul(v)) {
        kt_api_error_invalid(e, key, "'%s' must be a string%s", key, json_is_string(v) ? " without NUL" : "");
        return false;
    }
    free(*out);
    *out = dup_json_string(v);
    if (!*out) {
        kt_api_error_set(e, 500, "server_error", NULL, key, "out of memory");
        return false;
    }
    return true;
}

/* ---- fields shared by both endpoints ------------------------------------------------ */

static bool add_stop(struct kt_api_request *r, const json_t *v, const char *param, struct kt_api_error *e)
{
    if (!json_is_string(v) || !no_nul(v)) {
        kt_api_error_invalid(e, param, "'stop' must be a string or an array of strings");
        return false;
    }
    if (json_string_length(v) == 0)
        return true; /* an empty stop string never matches usefully */
    if (json_string_length(v) > KT_API_MAX_STOP_BYTES) {
        kt_api_error_invalid(e, param, "stop strings may be at most %d bytes", KT_API_MAX_STOP_BYTES);
        return false;
    }
    if (r->n_stop == KT_API_MAX_STOP) {
        kt_api_error_invalid(e, "stop", "at most %d stop strings", KT_API_MAX_STOP);
        return false;
    }
    if (!r->stop && !(r->stop = calloc(KT_API_MAX_STOP, sizeof *r->stop)))
        goto nomem;
    if (!(r->stop[r->n_stop] = dup_json_string(v)))
        goto nomem;
    r->n_stop++;
    return true;
nomem:
    kt_api_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
    return false;
}

static bool parse_stop(struct kt_api_request *r, const json_t *root, struct kt_api_error *e)
{
    const json_t *v = json_object_get(root, "stop");
    if (!v || json_is_null(v))
        return true;
    if (!json_is_array(v))
        return add_stop(r, v, "stop", e);
    size_t i;
    const json_t *x;
    json_array_foreach(v, i, x) if (!add_stop(r, x, "stop", e)) return false;
    return true;
}

static bool parse_logit_bias(struct kt_api_request *r, const json_t *root, struct kt_api_error *e)
{
    const json_t *v = json_object_get(root, "logit_bias");
    if (!v || json_is_null(v))
        return true;
    if (!json_is_object(v)) {
        kt_api_error_invalid(e, "logit_bias", "'logit_bias' must be an object mapping token ids to biases");
        return false;
    }
    size_t n = json_object_size(v);
    if (n > KT_API_MAX_LOGIT_BIAS) {
        kt_api_error_invalid(e, "logit_bias", "at most %d logit_bias entries", KT_API_MAX_LOGIT_BIAS);
        return false;
    }
    if (n == 0)
        return true;
    if (!(r->logit_bias = calloc(n, sizeof *r->logit_bias))) {
        kt_api_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
        return false;
    }
    const char *key;
    const json_t *x;
    size_t i = 0;
    json_object_foreach((json_t *)v, key, x)
    {
        char *end;
        long id = strtol(key, &end, 10);
        if (!*key || *end || id < 0 || id > INT32_MAX) {
            kt_api_error_invalid(e, "logit_bias", "logit_bias key '%.32s' is not a token id", key);
            return false;
        }
        if (!json_is_number(x) || !(json_number_value(x) >= -100 && json_number_value(x) <= 100)) {
            kt_api_error_invalid(e, "logit_bias", "logit_bias values must be numbers in [-100, 100]");
            return false;
        }
        r->logit_bias[i++] = (struct kt_logit_bias){.token = (int32_t)id, .bias = (float)json_number_value(x)};
    }
    r->sampling.logit_bias = r->logit_bias;
    r->sampling.n_logit_bias = i;
    return true;
}

/* ---- structured outputs -------------------------------------------------------------- */

/* Compiles schema as kt-serve will (json_schema.h), to refuse a schema it
 * cannot follow now rather than after the prompt is prefilled. */
static bool check_schema(const json_t *schema, const char *param, struct kt_api_error *e)
{
    struct kt_grammar *g = NULL;
    kt_err err = {0};
    uint32_t node;
    kt_status st = kt_grammar_create(&g, &err);
    if (st == KT_OK)
        st = kt_json_schema_compile(g, schema, &node, &err);
    kt_grammar_destroy(g);
    if (st == KT_ERR_NOMEM) {
        kt_api_error_set(e, 500, "server_error", NULL, param, "out of memory");
        return false;
    }
    if (st != KT_OK) {
        kt_api_error_invalid(e, param, "%s at %s", param, err.msg);
        return false;
    }
    return true;
}

/* A schema given as an object (or a boolean), or as JSON text (vLLM's
 * guided_json and structured_outputs.json take both). */
static bool take_schema(struct kt_api_request *r, const json_t *v, const char *param, struct kt_api_error *e)
{
    json_t *schema = NULL;
    if (json_is_object(v) || json_is_boolean(v)) {
        schema = json_incref((json_t *)v);
    } else if (json_is_string(v)) {
        json_error_t je;
        schema = json_loadb(json_string_value(v), json_string_length(v), JSON_DECODE_ANY, &je);
        if (!schema) {
            kt_api_error_invalid(e, param, "'%s' is not valid JSON: %s", param, je.text);
            return false;
        }
        if (!depth_ok(schema, 0)) {
            json_decref(schema);
            kt_api_error_invalid(e, param, "'%s' nests deeper than %d levels", param, KT_API_MAX_JSON_DEPTH);
            return false;
        }
    } else {
        kt_api_error_invalid(e, param, "'%s' must be a JSON Schema (an object)", param);
        return false;
    }
    if (!check_schema(schema, param, e)) {
        json_decref(schema);
        return false;
    }
    r->response_format = KT_RESPONSE_JSON_SCHEMA;
    r->response_schema = schema;
    return true;
}

/* vLLM's guided_regex / structured_outputs.regex: the whole output matches. */
static bool take_regex(struct kt_api_request *r, const json_t *v, const char *param, struct kt_api_error *e)
{
    if (!json_is_string(v) || !no_nul(v)) {
        kt_api_error_invalid(e, param, "'%s' must be a string (a regular expression)", param);
        return false;
    }
    struct kt_grammar *g = NULL;
    kt_err err = {0};
    uint32_t node;
    kt_status st = kt_grammar_create(&g, &err);
    if (st == KT_OK)
        st = kt_grammar_regex(g, json_string_value(v), json_string_length(v), &node, &err);
    kt_grammar_destroy(g);
    if (st != KT_OK) {
        if (st == KT_ERR_NOMEM)
            kt_api_error_set(e, 500, "server_error", NULL, param, "out of memory");
        else
            kt_api_error_invalid(e, param, "'%s': %s", param, err.msg);
        return false;
    }
    r->response_format = KT_RESPONSE_REGEX;
    r->response_schema = json_incref((json_t *)v);
    return true;
}

/* vLLM's guided_choice / structured_outputs.choice: the output is one of the strings. */
static bool take_choice(struct kt_api_request *r, const json_t *v, const char *param, struct kt_api_error *e)
{
    size_t n = json_array_size(v);
    if (!json_is_array(v) || n == 0 || n > KT_API_MAX_CHOICES) {
        kt_api_error_invalid(e, param, "'%s' must be an array of 1 to %d strings", param, KT_API_MAX_CHOICES);
        return false;
    }
    for (size_t i = 0; i < n; i++) {
        const json_t *c = json_array_get(v, i);
        if (!json_is_string(c) || json_string_length(c) == 0 || !no_nul(c)) {
            kt_api_error_invalid(e, param, "%s[%zu] must be a non-empty string", param, i);
            return false;
        }
        for (size_t j = 0; j < i; j++)
            if (json_equal(c, json_array_get(v, j))) {
                kt_api_error_invalid(e, param, "%s[%zu] repeats %s[%zu]", param, i, param, j);
                return false;
            }
    }
    r->response_format = KT_RESPONSE_CHOICE;
    r->response_schema = json_incref((json_t *)v);
    return true;
}

static bool given(const json_t *root, const char *key)
{
    const json_t *v = json_object_get(root, key);
    return v && !json_is_null(v);
}

/* response_format (OpenAI), guided_json and structured_outputs (vLLM): one of them. */
static bool parse_structured(struct kt_api_request *r, const json_t *root, struct kt_api_error *e)
{
    static const char *const fields[] = {"response_format", "guided_json", "structured_outputs", "guided_regex",
                                         "guided_choice"};
    int n_given = 0;
    for (int i = 0; i < 5; i++)
        n_given += given(root, fields[i]);
    if (given(root, "guided_grammar")) {
        kt_api_error_invalid(e, "guided_grammar", "'guided_grammar' is not supported (kt-serve takes JSON schemas, "
                                                  "regular expressions and choices)");
        return false;
    }
    const json_t *rf = json_object_get(root, "response_format");
    const json_t *gj = json_object_get(root, "guided_json");
    const json_t *so = json_object_get(root, "structured_outputs");
    if (given(root, "response_format")) {
        const json_t *t = json_is_object(rf) ? json_object_get(rf, "type") : NULL;
        const char *type = json_is_string(t) ? json_string_value(t) : NULL;
        if (!type) {
            kt_api_error_invalid(e, "response_format", "'response_format' must be an object with a 'type' (\"text\", "
                                                       "\"json_object\" or \"json_schema\")");
            return false;
        }
        if (strcmp(type, "text") == 0) {
            n_given--; /* asks for nothing */
        } else if (strcmp(type, "json_object") == 0) {
            r->response_format = KT_RESPONSE_JSON_OBJECT;
        } else if (strcmp(type, "json_schema") == 0) {
            const json_t *js = json_object_get(rf, "json_schema");
            if (!json_is_object(js)) {
                kt_api_error_invalid(e, "response_format", "response_format.json_schema must be an object with "
                                                           "'name' and 'schema'");
                return false;
            }
            const json_t *name = json_object_get(js, "name"), *strict = json_object_get(js, "strict");
            if (name && !json_is_null(name) && !json_is_string(name)) {
                kt_api_error_invalid(e, "response_format", "response_format.json_schema.name must be a string");
                return false;
            }
            if (strict && !json_is_null(strict) && !json_is_boolean(strict)) {
                kt_api_error_invalid(e, "response_format", "response_format.json_schema.strict must be a boolean");
                return false;
            }
            const json_t *schema = json_object_get(js, "schema");
            if (!schema || json_is_null(schema)) {
                kt_api_error_invalid(e, "response_format", "response_format.json_schema.schema is required");
                return false;
            }
            if (!json_is_object(schema) && !json_is_boolean(schema)) {
                kt_api_error_invalid(e, "response_format", "response_format.json_schema.schema must be an object");
                return false;
            }
            if (!take_schema(r, schema, "response_format.json_schema.schema", e)) {
                snprintf(e->param, sizeof e->param, "response_format");
                return false;
            }
        } else {
            kt_api_error_invalid(e, "response_format", "response_format type '%.40s' is not supported (give \"text\", "
                                                       "\"json_object\" or \"json_schema\")", type);
            return false;
        }
    }
    if (n_given > 1) {
        kt_api_error_invalid(e, "response_format", "give one of 'response_format', 'guided_json', 'guided_regex', "
                                                   "'guided_choice' and 'structured_outputs', not several");
        return false;
    }
    if (given(root, "guided_json") && !take_schema(r, gj, "guided_json", e))
        return false;
    if (given(root, "guided_regex") && !take_regex(r, json_object_get(root, "guided_regex"), "guided_regex", e))
        return false;
    if (given(root, "guided_choice") && !take_choice(r, json_object_get(root, "guided_choice"), "guided_choice", e))
        return false;
    if (given(root, "structured_outputs")) {
        if (!json_is_object(so)) {
            kt_api_error_invalid(e, "structured_outputs", "'structured_outputs' must be an object");
            return false;
        }
        const char *key;
        const json_t *v;
        int n_kinds = 0;
        json_object_foreach((json_t *)so, key, v)
        {
            if (json_is_null(v) || json_is_false(v) || strcmp(key, "disable_any_whitespace") == 0 ||
                strcmp(key, "disable_fallback") == 0 || strcmp(key, "disable_additional_properties") == 0 ||
                strcmp(key, "whitespace_pattern") == 0)
                continue;
            n_kinds++;
            if (strcmp(key, "json") == 0) {
                if (!take_schema(r, v, "structured_outputs.json", e))
                    return false;
            } else if (strcmp(key, "json_object") == 0 && json_is_true(v)) {
                r->response_format = KT_RESPONSE_JSON_OBJECT;
            } else if (strcmp(key, "regex") == 0) {
                if (!take_regex(r, v, "structured_outputs.regex", e))
                    return false;
            } else if (strcmp(key, "choice") == 0) {
                if (!take_choice(r, v, "structured_outputs.choice", e))
                    return false;
            } else {
                kt_api_error_invalid(e, "structured_outputs", "structured_outputs.%.40s is not supported (kt-serve "
                                                              "takes 'json', 'json_object', 'regex' and 'choice')",
                                     key);
                return false;
            }
        }
        if (n_kinds > 1) {
            kt_api_error_invalid(e, "structured_outputs", "structured_outputs: give one of 'json', 'json_object', "
                                                          "'regex' and 'choice'");
            return false;
        }
    }
    return true;
}

/* Sampling, limits, streaming and the extensions both endpoints accept. */
/* vLLM's extra sampling and rendering fields kt-serve does not carry out: a
 * request that sets one (to anything but its no-op value) gets a 400 naming
 * it, since a 200 that silently did otherwise would be wrong output.  The
 * ones it does honour (ignore_eos, repetition_penalty, min_p, top_k, guided_*,
 * structured_outputs, chat_template_kwargs, add_generation_prompt) are parsed
 * where they act. */
static bool refuse_unhonoured_extensions(const json_t *root, struct kt_api_error *e)
{
    static const struct {
        const char *name;
        int harmless; /* 0: only null; 1: also false; 2: also true (the default); 3: also 0 / an empty list */
    } fields[] = {
        {"continue_final_message", 1},      {"min_tokens", 3},
        {"stop_token_ids", 3},              {"include_stop_str_in_output", 1}, {"skip_special_tokens", 2},
        {"spaces_between_special_tokens", 2}, {"truncate_prompt_tokens", 0}, {"use_beam_search", 1},
        {"length_penalty", 0},              {"allowed_token_ids", 0},      {"bad_words", 3},
        {"return_tokens_as_token_ids", 1},  {"guided_whitespace_pattern", 0}, {"logits_processors", 3},
        {"documents", 0},                   {"mm_processor_kwargs", 0},    {"chat_template", 0},
        {"priority", 3},
    };
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) {
        const json_t *v = json_object_get(root, fields[i].name);
        const int h = fields[i].harmless;
        if (!v || json_is_null(v) || (h >= 1 && json_is_false(v)) || (h == 2 && json_is_true(v)) ||
            (h == 3 && ((json_is_integer(v) && json_integer_value(v) == 0) ||
                        (json_is_array(v) && json_array_size(v) == 0) || json_is_false(v))))
            continue;
        kt_api_error_invalid(e, fields[i].name, "'%s' is not supported by kt-serve yet (it would be ignored, so the "
                             "request is refused): drop it", fields[i].name);
        return false;
    }
    return true;
}

/* prompt_logprobs (vLLM): 0 .. KT_LOGPROBS_MAX_TOP alternatives per prompt
 * token.  vLLM's -1 (the whole vocabulary) and streaming (vLLM drops the
 * field from chunks) are refused rather than answered otherwise. */
static bool parse_prompt_logprobs(struct kt_api_request *r, const json_t *root, struct kt_api_error *e)
{
    long long k = 0;
    bool given = false;
    if (!get_int(root, "prompt_logprobs", -1, INT32_MAX, &given, &k, e))
        return false;
    if (!given)
        return true;
    if (k < 0 || k > KT_LOGPROBS_MAX_TOP) {
        kt_api_error_invalid(e, "prompt_logprobs", "'prompt_logprobs' must be from 0 to %d alternatives per prompt "
                             "token, got %lld%s", KT_LOGPROBS_MAX_TOP, k,
                             k < 0 ? " (-1, the whole vocabulary, is not supported)" : "");
        return false;
    }
    if (r->stream) {
        kt_api_error_invalid(e, "prompt_logprobs", "'prompt_logprobs' is not available with 'stream': true");
        return false;
    }
    r->prompt_logprobs = true;
    r->prompt_top_logprobs = (uint32_t)k;
    return true;
}

static bool parse_common(struct kt_api_request *r, const json_t *root, struct kt_api_error *e)
{
    long long v;
    if (!get_string(root, "model", &r->model, e) || !get_bool(root, "stream", &r->stream, e))
        return false;
    const json_t *so = json_object_get(root, "stream_options");
    if (so && !json_is_null(so)) {
        if (!json_is_object(so)) {
            kt_api_error_invalid(e, "stream_options", "'stream_options' must be an object");
            return false;
        }
        if (!r->stream) {
            kt_api_error_invalid(e, "stream_options", "'stream_options' is only allowed when 'stream' is true");
            return false;
        }
        if (!get_bool(so, "include_usage", &r->include_usage, e)) {
            snprintf(e->param, sizeof e->param, "stream_options.include_usage");
            return false;
        }
    }
    v = 1;
    if (!get_int(root, "n", 1, KT_API_MAX_N, NULL, &v, e))
        return false;
    r->n = (uint32_t)v;
    /* max_tokens 0 on /v1/completions: the prompt alone (echoed and scored, as lm-eval-harness asks) */
    v = 0;
    bool max_given = false;
    if (!get_int(root, "max_tokens", r->kind == KT_API_COMPLETION ? 0 : 1, INT32_MAX, &max_given, &v, e) ||
        !get_int(root, "max_completion_tokens", 1, INT32_MAX, &max_given, &v, e))
        return false;
    r->max_tokens = (uint32_t)v;
    r->no_generation = max_given && v == 0;
    if (!parse_prompt_logprobs(r, root, e))
        return false;

    struct kt_sampler_params *s = &r->sampling;
    if (!get_float(root, "temperature", 0, 2, &s->temperature, e) || !get_float(root, "top_p", 0, 1, &s->top_p, e) ||
        !get_float(root, "min_p", 0, 1, &s->min_p, e) ||
        !get_float(root, "presence_penalty", -2, 2, &s->presence_penalty, e) ||
        !get_float(root, "frequency_penalty", -2, 2, &s->frequency_penalty, e) ||
        !get_float(root, "repetition_penalty", 1e-6, 100, &s->repetition_penalty, e))
        return false;
    if (!(s->top_p > 0)) {
        kt_api_error_invalid(e, "top_p", "'top_p' must be in (0, 1]");
        return false;
    }
    v = 0;
    if (!get_int(root, "top_k", -1, INT32_MAX, NULL, &v, e))
        return false;
    s->top_k = (int32_t)v;
    if (!get_int(root, "seed", INT64_MIN, INT64_MAX, &r->seed_given, &v, e))
        return false;
    if (r->seed_given)
        s->seed = (uint64_t)v;
    if (!parse_stop(r, root, e) || !parse_logit_bias(r, root, e) || !get_bool(root, "ignore_eos", &r->ignore_eos, e) ||
        !get_string(root, "kt_test_forced_output", &r->forced_output, e))
        return false;

    const json_t *best_of = json_object_get(root, "best_of");
    if (best_of && !json_is_null(best_of) &&
        !(json_is_integer(best_of) && json_integer_value(best_of) == (json_int_t)r->n)) {
        kt_api_error_invalid(e, "best_of", "'best_of' is not supported (only best_of == n)");
        return false;
    }
    return parse_structured(r, root, e) && refuse_unhonoured_extensions(root, e);
}

/* ---- chat ---------------------------------------------------------------------------- */

static bool parse_tools(struct kt_api_request *r, const json_t *root, struct kt_api_error *e)
{
    const json_t *tools = json_object_get(root, "tools");
    if (tools && !json_is_null(tools)) {
        if (!json_is_array(tools)) {
            kt_api_error_invalid(e, "tools", "'tools' must be an array");
            return false;
        }
        size_t i;
        const json_t *t;
        json_array_foreach(tools, i, t)
        {
            const json_t *type = json_is_object(t) ? json_object_get(t, "type") : NULL;
            const json_t *fn = json_is_object(t) ? json_object_get(t, "function") : NULL;
            const json_t *name = json_is_object(fn) ? json_object_get(fn, "name") : NULL;
            char param[48];
            snprintf(param, sizeof param, "tools[%zu]", i);
            if (!json_is_string(type) || strcmp(json_string_value(type), "function") != 0) {
                kt_api_error_invalid(e, param, "%s.type must be \"function\"", param);
                return false;
            }
            if (!json_is_string(name) || json_string_length(name) == 0 || !no_nul(name)) {
                kt_api_error_invalid(e, param, "%s.function.name must be a non-empty string", param);
                return false;
            }
            const json_t *params = json_object_get(fn, "parameters");
            if (params && !json_is_null(params) && !json_is_object(params)) {
                kt_api_error_invalid(e, param, "%s.function.parameters must be an object", param);
                return false;
            }
        }
        if (json_array_size(tools) > 0)
            r->tools = json_incref((json_t *)tools);
    }
    r->tool_choice = r->tools ? KT_TOOL_CHOICE_AUTO : KT_TOOL_CHOICE_NONE;
    const json_t *tc = json_object_get(root, "tool_choice");
    if (tc && !json_is_null(tc)) {
        if (json_is_string(tc)) {
            const char *s = json_string_value(tc);
            if (strcmp(s, "none") == 0)
                r->tool_choice = KT_TOOL_CHOICE_NONE;
            else if (strcmp(s, "auto") == 0)
                r->tool_choice = r->tools ? KT_TOOL_CHOICE_AUTO : KT_TOOL_CHOICE_NONE;
            else if (strcmp(s, "required") == 0)
                r->tool_choice = KT_TOOL_CHOICE_REQUIRED;
            else {
                kt_api_error_invalid(e, "tool_choice", "'tool_choice' must be \"none\", \"auto\", \"required\" "
                                                       "or a function object");
                return false;
            }
        } else {
            const json_t *fn = json_is_object(tc) ? json_object_get(tc, "function") : NULL;
            const json_t *name = json_is_object(fn) ? json_object_get(fn, "name") : NULL;
            if (!json_is_string(name) || !no_nul(name)) {
                kt_api_error_invalid(e, "tool_choice",
                                     "'tool_choice' must be a string or {\"type\": \"function\", \"function\": "
                                     "{\"name\": ...}}");
                return false;
            }
            r->tool_choice = KT_TOOL_CHOICE_NAMED;
            if (!(r->tool_choice_name = dup_json_string(name))) {
                kt_api_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
                return false;
            }
        }
        if (r->tool_choice == KT_TOOL_CHOICE_REQUIRED || r->tool_choice == KT_TOOL_CHOICE_NAMED) {
            if (!r->tools) {
                kt_api_error_invalid(e, "tool_choice", "'tool_choice' needs 'tools'");
                return false;
            }
        }
        if (r->tool_choice == KT_TOOL_CHOICE_NAMED) {
            bool found = false;
            size_t i;
            const json_t *t;
            json_array_foreach(r->tools, i, t)
            {
                const json_t *name = json_object_get(json_object_get(t, "function"), "name");
                found = found || strcmp(json_string_value(name), r->tool_choice_name) == 0;
            }
            if (!found) {
                kt_api_error_invalid(e, "tool_choice", "tool_choice names '%.64s', which is not in 'tools'",
                                     r->tool_choice_name);
                return false;
            }
        }
    }
    r->parallel_tool_calls = true;
    return get_bool(root, "parallel_tool_calls", &r->parallel_tool_calls, e);
}

static bool parse_template_kwargs(struct kt_api_request *r, const json_t *root, struct kt_api_error *e)
{
    const json_t *kw = json_object_get(root, "chat_template_kwargs");
    if (!kw || json_is_null(kw))
        return true;
    if (!json_is_object(kw)) {
        kt_api_error_invalid(e, "chat_template_kwargs", "'chat_template_kwargs' must be an object");
        return false;
    }
    static const char *const keys[] = {"thinking", "enable_thinking"};
    for (int k = 0; k < 2; k++) {
        const json_t *v = json_object_get(kw, keys[k]);
        if (!v || json_is_null(v))
            continue;
        if (!json_is_boolean(v)) {
            char param[64];
            snprintf(param, sizeof param, "chat_template_kwargs.%s", keys[k]);
            kt_api_error_invalid(e, param, "'%s' must be a boolean", param);
            return false;
        }
        r->thinking = json_is_true(v) ? KT_CHAT_THINKING_ON : KT_CHAT_THINKING_OFF;
    }
    return true;
}

/* "developer" is OpenAI's new name for "system"; chat.h knows only the latter. */
static json_t *messages_with_developer_as_system(const json_t *messages)
{
    json_t *copy = json_deep_copy(messages);
    size_t i;
    json_t *m;
    json_array_foreach(copy, i, m)
    {
        const json_t *role = json_object_get(m, "role");
        if (json_is_string(role) && strcmp(json_string_value(role), "developer") == 0)
            json_object_set_new(m, "role", json_string("system"));
    }
    return copy;
}

static bool parse_chat(struct kt_api_request *r, const json_t *root, struct kt_api_error *e)
{
    const json_t *messages = json_object_get(root, "messages");
    if (!json_is_array(messages) || json_array_size(messages) == 0) {
        kt_api_error_invalid(e, "messages", "'messages' must be a non-empty array");
        return false;
    }
    json_t *copy = messages_with_developer_as_system(messages);
    if (!copy) {
        kt_api_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
        return false;
    }
    kt_err err = {0};
    kt_status st = kt_chat_messages_from_json(copy, &r->messages, &err);
    json_decref(copy);
    if (st != KT_OK) {
        if (st == KT_ERR_NOMEM)
            kt_api_error_set(e, 500, "server_error", NULL, "messages", "%s", err.msg);
        else
            kt_api_error_invalid(e, "messages", "%s", err.msg);
        return false;
    }
    bool logprobs = false;
    long long top = 0;
    if (!get_bool(root, "logprobs", &logprobs, e) || !get_int(root, "top_logprobs", 0, KT_LOGPROBS_MAX_TOP, NULL, &top, e))
        return false;
    if (top > 0 && !logprobs) {
        kt_api_error_invalid(e, "top_logprobs", "'top_logprobs' needs 'logprobs' set to true");
        return false;
    }
    r->logprobs = logprobs;
    r->top_logprobs = (uint32_t)top;
    r->add_generation_prompt = true;
    return parse_tools(r, root, e) && parse_template_kwargs(r, root, e) &&
           get_bool(root, "add_generation_prompt", &r->add_generation_prompt, e);
}

/* ---- completions --------------------------------------------------------------------- */

static bool is_token_id(const json_t *x)
{
    return json_is_integer(x) && json_integer_value(x) >= 0 && json_integer_value(x) <= INT32_MAX;
}

/* Token ids: every element an integer in [0, INT32_MAX]; p->where names the
 * array in errors ("prompt", or "prompt[2]" in a list of prompts). */
static bool take_prompt_ids(struct kt_api_prompt *p, const json_t *arr, struct kt_api_error *e)
{
    size_t n = json_array_size(arr);
    for (size_t i = 0; i < n; i++) {
        const json_t *x = json_array_get(arr, i);
        if (is_token_id(x))
            continue;
        char what[64];
        if (json_is_number(x))
            snprintf(what, sizeof what, "%.17g", json_number_value(x));
        else
            snprintf(what, sizeof what, "%s", type_name(x));
        kt_api_error_invalid(e, "prompt", "'prompt' must be a string or an array of token ids (integers from 0 to "
                                          "%d): %s[%zu] is %s", INT32_MAX, p->where, i, what);
        return false;
    }
    if (n == 0) {
        kt_api_error_invalid(e, "prompt", "%s is an empty list of token ids", p->where);
        return false;
    }
    if (!(p->ids = malloc(n * sizeof *p->ids))) {
        kt_api_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
        return false;
    }
    for (size_t i = 0; i < n; i++)
        p->ids[i] = (int32_t)json_integer_value(json_array_get(arr, i));
    p->n_ids = n;
    return true;
}

static bool take_prompt_text(struct kt_api_prompt *p, const json_t *s, struct kt_api_error *e)
{
    if (!no_nul(s)) {
        kt_api_error_invalid(e, "prompt", "%s must be a string without NUL", p->where);
        return false;
    }
    if (!(p->text = dup_json_string(s))) {
        kt_api_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
        return false;
    }
    return true;
}

/* 'prompt' as OpenAI takes it: a string, an array of token ids, or a list
 * of strings or of token-id arrays (one kind throughout); a list of one is
 * that prompt. */
static bool parse_prompts(struct kt_api_request *r, const json_t *p, struct kt_api_error *e)
{
    if (!p) {
        kt_api_error_invalid(e, "prompt", "'prompt' is required: a string, an array of token ids, or a list of "
                                          "either");
        return false;
    }
    if (!json_is_string(p) && !json_is_array(p)) {
        kt_api_error_invalid(e, "prompt", "'prompt' must be a string or an array of token ids, not %s", type_name(p));
        return false;
    }
    if (json_is_array(p) && json_array_size(p) == 0) {
        kt_api_error_invalid(e, "prompt", "'prompt' is an empty list: give a string, token ids, or a list of them");
        return false;
    }
    /* a list of prompts: its first element says of which kind */
    const json_t *first = json_is_array(p) ? json_array_get(p, 0) : NULL;
    const bool list = first && (json_is_string(first) || json_is_array(first));
    const size_t n = list ? json_array_size(p) : 1;
    if (n > KT_API_MAX_PROMPTS) {
        kt_api_error_invalid(e, "prompt", "'prompt' lists %zu prompts; at most %d in one request", n,
                             KT_API_MAX_PROMPTS);
        return false;
    }
    if (!(r->prompts = calloc(n, sizeof *r->prompts))) {
        kt_api_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
        return false;
    }
    r->n_prompts = n;
    for (size_t i = 0; i < n; i++) {
        struct kt_api_prompt *q = &r->prompts[i];
        const json_t *x = list ? json_array_get(p, i) : p;
        if (list)
            snprintf(q->where, sizeof q->where, "prompt[%zu]", i);
        else
            snprintf(q->where, sizeof q->where, "prompt");
        if (list && json_typeof(x) != json_typeof(first)) {
            kt_api_error_invalid(e, "prompt", "prompt[%zu] is %s, but prompt[0] is %s: a list of prompts holds "
                                              "strings only or token-id arrays only", i, type_name(x),
                                 type_name(first));
            return false;
        }
        if (!(json_is_string(x) ? take_prompt_text(q, x, e) : take_prompt_ids(q, x, e)))
            return false;
    }
    return true;
}

static bool parse_completion(struct kt_api_request *r, const json_t *root, struct kt_api_error *e)
{
    if (!parse_prompts(r, json_object_get(root, "prompt"), e))
        return false;
    long long lp = -1;
    if (!get_int(root, "logprobs", 0, 5, NULL, &lp, e) || !get_bool(root, "echo", &r->echo, e))
        return false;
    r->logprobs = lp >= 0;
    r->top_logprobs = lp > 0 ? (uint32_t)lp : 0;
    const json_t *suffix = json_object_get(root, "suffix");
    if (suffix && !json_is_null(suffix)) {
        kt_api_error_invalid(e, "suffix", "'suffix' is not supported");
        return false;
    }
    return true;
}

/* ---- entry points -------------------------------------------------------------------- */

bool kt_api_request_parse(enum kt_api_kind kind, const char *body, size_t len, struct kt_api_request *out,
                          struct kt_api_error *e)
{
    *out = (struct kt_api_request){.kind = kind, .n = 1};
    out->sampling = kt_sampler_params_default();
    json_t *root = kt_api_parse_json(body, len, e);
    if (!root)
        return false;
    bool ok = parse_common(out, root, e) && (kind == KT_API_CHAT ? parse_chat(out, root, e)
                                                                 : parse_completion(out, root, e));
    json_decref(root);
    if (!ok)
        kt_api_request_free(out);
    return ok;
}

void kt_api_request_free(struct kt_api_request *r)
{
    free(r->model);
    free(r->logit_bias);
    for (size_t i = 0; i < r->n_stop; i++)
        free(r->stop[i]);
    free(r->stop);
    kt_chat_messages_free(&r->messages);
    json_decref(r->tools);
    json_decref(r->response_schema);
    free(r->tool_choice_name);
    for (size_t i = 0; i < r->n_prompts; i++) {
        free(r->prompts[i].text);
        free(r->prompts[i].ids);
    }
    free(r->prompts);
    free(r->forced_output);
    *r = (struct kt_api_request){0};
}
