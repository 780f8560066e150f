/*
 * serve_responses.c - OpenAI's Responses API: the request rewritten as a
 * Chat Completions body and checked by serve_request.c, the response object
 * and its event stream from a kt_response, and the LRU store of responses
 * (see serve_responses.h for the mapping).
 */
#include "serve_responses.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tokenizer.h"

/* ---- the store ------------------------------------------------------------------------------- */

struct stored {
    char id[KT_RESPONSES_ID_MAX];
    json_t *object, *input, *output;
    uint64_t used;               /* the store's clock when last put or read */
};

struct kt_responses_store {
    pthread_mutex_t mu;
    struct stored *items;        /* [cap]; an empty slot has object NULL */
    uint32_t cap;
    uint64_t clock;
};

struct kt_responses_store *kt_responses_store_create(uint32_t cap)
{
    struct kt_responses_store *st = calloc(1, sizeof *st);
    if (!st)
        return NULL;
    st->cap = cap;
    if (cap && !(st->items = calloc(cap, sizeof *st->items))) {
        free(st);
        return NULL;
    }
    pthread_mutex_init(&st->mu, NULL);
    return st;
}

static void stored_clear(struct stored *s)
{
    json_decref(s->object), json_decref(s->input), json_decref(s->output);
    *s = (struct stored){0};
}

void kt_responses_store_destroy(struct kt_responses_store *st)
{
    if (!st)
        return;
    for (uint32_t i = 0; i < st->cap; i++)
        stored_clear(&st->items[i]);
    free(st->items);
    pthread_mutex_destroy(&st->mu);
    free(st);
}

static struct stored *find(struct kt_responses_store *st, const char *id)
{
    for (uint32_t i = 0; i < st->cap; i++)
        if (st->items[i].object && strcmp(st->items[i].id, id) == 0)
            return &st->items[i];
    return NULL;
}

bool kt_responses_store_put(struct kt_responses_store *st, const char *id, const json_t *object, const json_t *input,
                            const json_t *output)
{
    if (!st || !st->cap || strlen(id) >= KT_RESPONSES_ID_MAX)
        return false;
    struct stored fresh = {.object = json_deep_copy(object), .input = json_deep_copy(input),
                           .output = json_deep_copy(output)};
    snprintf(fresh.id, sizeof fresh.id, "%s", id);
    if (!fresh.object || !fresh.input || !fresh.output) {
        stored_clear(&fresh);
        return false;
    }
    pthread_mutex_lock(&st->mu);
    struct stored *slot = find(st, id);
    for (uint32_t i = 0; !slot && i < st->cap; i++)
        if (!st->items[i].object)
            slot = &st->items[i];
    if (!slot) { /* full: the least recently used goes */
        slot = &st->items[0];
        for (uint32_t i = 1; i < st->cap; i++)
            if (st->items[i].used < slot->used)
                slot = &st->items[i];
    }
    stored_clear(slot);
    fresh.used = ++st->clock;
    *slot = fresh;
    pthread_mutex_unlock(&st->mu);
    return true;
}

bool kt_responses_store_get(struct kt_responses_store *st, const char *id, json_t **object, json_t **input,
                            json_t **output)
{
    if (!st)
        return false;
    pthread_mutex_lock(&st->mu);
    struct stored *s = find(st, id);
    if (s) {
        s->used = ++st->clock;
        if (object)
            *object = json_deep_copy(s->object);
        if (input)
            *input = json_deep_copy(s->input);
        if (output)
            *output = json_deep_copy(s->output);
    }
    pthread_mutex_unlock(&st->mu);
    return s != NULL;
}

json_t *kt_responses_store_item(struct kt_responses_store *st, const char *item_id)
{
    json_t *found = NULL;
    if (!st)
        return NULL;
    pthread_mutex_lock(&st->mu);
    for (uint32_t i = 0; i < st->cap && !found; i++) {
        if (!st->items[i].object)
            continue;
        size_t k;
        const json_t *item;
        json_array_foreach(st->items[i].output, k, item)
        {
            const char *id = json_string_value(json_object_get(item, "id"));
            if (id && strcmp(id, item_id) == 0) {
                found = json_deep_copy(item);
                st->items[i].used = ++st->clock;
                break;
            }
        }
    }
    pthread_mutex_unlock(&st->mu);
    return found;
}

bool kt_responses_store_delete(struct kt_responses_store *st, const char *id)
{
    if (!st)
        return false;
    pthread_mutex_lock(&st->mu);
    struct stored *s = find(st, id);
    if (s)
        stored_clear(s);
    pthread_mutex_unlock(&st->mu);
    return s != NULL;
}

/* ---- request: input items -> chat messages -------------------------------------------------------- */

static bool is_str(const json_t *v)
{
    return json_is_string(v) && memchr(json_string_value(v), '\0', json_string_length(v)) == NULL;
}

static bool absent(const json_t *v)
{
    return !v || json_is_null(v);
}

static bool nomem(struct kt_api_error *e)
{
    kt_api_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
    return false;
}

/* A message's or an output's content (a string or text parts) as one string appended to b. */
static bool content_text(const json_t *content, const char *where, bool input_types, struct kt_buf *b,
                         struct kt_api_error *e)
{
    if (is_str(content)) {
        kt_buf_append(b, json_string_value(content), json_string_length(content));
        return true;
    }
    if (!json_is_array(content)) {
        kt_api_error_invalid(e, "input", "%s.content must be a string or an array of text parts", where);
        return false;
    }
    size_t i;
    const json_t *part;
    json_array_foreach(content, i, part)
    {
        const char *type = json_string_value(json_object_get(part, "type"));
        const json_t *text = json_object_get(part, "text");
        bool text_type = type && (strcmp(type, "input_text") == 0 || strcmp(type, "output_text") == 0 ||
                                  strcmp(type, "text") == 0);
        if (!text_type) {
            kt_api_error_invalid(e, "input", "%s.content[%zu].type '%.40s' is not supported (kt-serve takes %s)",
                                 where, i, type ? type : "?", input_types ? "input_text and output_text parts"
                                                                          : "input_text parts");
            return false;
        }
        if (!is_str(text)) {
            kt_api_error_invalid(e, "input", "%s.content[%zu].text must be a string", where, i);
            return false;
        }
        kt_buf_append(b, json_string_value(text), json_string_length(text));
    }
    return true;
}

static json_t *buf_string(struct kt_buf *b)
{
    json_t *s = json_stringn(b->bytes ? b->bytes : "", b->len);
    kt_buf_free(b);
    return s;
}

/* The reasoning item's text: its reasoning_text content, else its summary parts. */
static bool reasoning_text(const json_t *item, const char *where, struct kt_buf *b, struct kt_api_error *e)
{
    const json_t *content = json_object_get(item, "content"), *summary = json_object_get(item, "summary");
    const json_t *parts = json_array_size(content) ? content : summary;
    if (!absent(summary) && !json_is_array(summary)) {
        kt_api_error_invalid(e, "input", "%s.summary must be an array", where);
        return false;
    }
    if (!absent(content) && !json_is_array(content)) {
        kt_api_error_invalid(e, "input", "%s.content must be an array", where);
        return false;
    }
    size_t i;
    const json_t *part;
    json_array_foreach(parts, i, part)
    {
        const json_t *text = json_object_get(part, "text");
        if (!is_str(text)) {
            kt_api_error_invalid(e, "input", "%s.%s[%zu].text must be a string", where,
                                 parts == content ? "content" : "summary", i);
            return false;
        }
        if (i && parts == summary)
            kt_buf_puts(b, "\n\n");
        kt_buf_append(b, json_string_value(text), json_string_length(text));
    }
    return true;
}

/* Appends the chat messages for items to messages.  An assistant turn
 * collects the reasoning, message and function_call items that follow one
 * another. */
static bool items_to_messages(const json_t *items, json_t *messages, struct kt_api_error *e)
{
    json_t *asst = NULL; /* the assistant turn being collected (borrowed from messages) */
    size_t i;
    const json_t *item;
    json_array_foreach(items, i, item)
    {
        char where[48];
        snprintf(where, sizeof where, "input[%zu]", i);
        if (!json_is_object(item)) {
            kt_api_error_invalid(e, "input", "%s must be an object", where);
            return false;
        }
        const json_t *type_v = json_object_get(item, "type");
        const char *type = absent(type_v) ? "message" : json_string_value(type_v);
        if (!type) {
            kt_api_error_invalid(e, "input", "%s.type must be a string", where);
            return false;
        }
        struct kt_buf b = {0};
        if (strcmp(type, "message") == 0) {
            const char *role = json_string_value(json_object_get(item, "role"));
            if (!role || (strcmp(role, "user") != 0 && strcmp(role, "assistant") != 0 && strcmp(role, "system") != 0 &&
                          strcmp(role, "developer") != 0)) {
                kt_api_error_invalid(e, "input", "%s.role must be \"user\", \"assistant\", \"system\" or "
                                                 "\"developer\"", where);
                return false;
            }
            if (!content_text(json_object_get(item, "content"), where, strcmp(role, "assistant") == 0, &b, e)) {
                kt_buf_free(&b);
                return false;
            }
            if (b.out_of_memory)
                return (kt_buf_free(&b), nomem(e));
            if (strcmp(role, "assistant") == 0) {
                if (asst) {
                    const char *had = json_string_value(json_object_get(asst, "content"));
                    struct kt_buf joined = {0};
                    kt_buf_puts(&joined, had ? had : "");
                    kt_buf_append(&joined, b.bytes ? b.bytes : "", b.len);
                    kt_buf_free(&b);
                    json_object_set_new(asst, "content", buf_string(&joined));
                } else {
                    asst = json_pack("{s:s, s:o}", "role", "assistant", "content", buf_string(&b));
                    json_array_append_new(messages, asst);
                }
            } else {
                asst = NULL;
                json_array_append_new(messages, json_pack("{s:s, s:o}", "role",
                                                          strcmp(role, "developer") == 0 ? "system" : role, "content",
                                                          buf_string(&b)));
            }
        } else if (strcmp(type, "reasoning") == 0) {
            if (!reasoning_text(item, where, &b, e)) {
                kt_buf_free(&b);
                return false;
            }
            bool fresh_turn = !asst || json_string_length(json_object_get(asst, "content")) ||
                              json_array_size(json_object_get(asst, "tool_calls"));
            if (fresh_turn) {
                asst = json_pack("{s:s, s:s}", "role", "assistant", "content", "");
                json_array_append_new(messages, asst);
            }
            const char *had = json_string_value(json_object_get(asst, "reasoning_content"));
            struct kt_buf joined = {0};
            if (had && *had) {
                kt_buf_puts(&joined, had);
                kt_buf_puts(&joined, "\n\n");
            }
            kt_buf_append(&joined, b.bytes ? b.bytes : "", b.len);
            kt_buf_free(&b);
            json_object_set_new(asst, "reasoning_content", buf_string(&joined));
        } else if (strcmp(type, "function_call") == 0) {
            const json_t *call_id = json_object_get(item, "call_id"), *name = json_object_get(item, "name"),
                         *args = json_object_get(item, "arguments");
            if (!is_str(call_id) || !is_str(name) || !json_string_length(name) || !is_str(args)) {
                kt_api_error_invalid(e, "input", "%s: a function_call needs call_id, name and arguments (strings)",
                                     where);
                return false;
            }
            if (!asst) {
                asst = json_pack("{s:s, s:s}", "role", "assistant", "content", "");
                json_array_append_new(messages, asst);
            }
            json_t *calls = json_object_get(asst, "tool_calls");
            if (!calls) {
                calls = json_array();
                json_object_set_new(asst, "tool_calls", calls);
            }
            json_array_append_new(calls, json_pack("{s:O, s:s, s:{s:O, s:O}}", "id", call_id, "type", "function",
                                                   "function", "name", name, "arguments", args));
        } else if (strcmp(type, "function_call_output") == 0) {
            const json_t *call_id = json_object_get(item, "call_id"), *output = json_object_get(item, "output");
            if (!is_str(call_id)) {
                kt_api_error_invalid(e, "input", "%s.call_id must be a string", where);
                return false;
            }
            if (absent(output) || !content_text(output, where, false, &b, e)) {
                if (absent(output))
                    kt_api_error_invalid(e, "input", "%s.output must be a string or input_text parts", where);
                kt_buf_free(&b);
                return false;
            }
            asst = NULL;
            json_array_append_new(messages, json_pack("{s:s, s:O, s:o}", "role", "tool", "tool_call_id", call_id,
                                                      "content", buf_string(&b)));
        } else {
            kt_api_error_invalid(e, "input", "%s.type '%.40s' is not supported (kt-serve takes message, "
                                             "function_call, function_call_output and reasoning items)",
                                 where, type);
            return false;
        }
    }
    return true;
}

/* ---- request: the other fields ------------------------------------------------------------------- */

/* Flat function tools -> chat's; tools_out and echo_out are new references. */
static bool map_tools(const json_t *tools, json_t **tools_out, json_t **echo_out, struct kt_api_error *e)
{
    *tools_out = NULL;
    *echo_out = json_array();
    if (absent(tools))
        return true;
    if (!json_is_array(tools)) {
        kt_api_error_invalid(e, "tools", "'tools' must be an array");
        return false;
    }
    json_t *chat = json_array();
    size_t i;
    const json_t *t;
    json_array_foreach(tools, i, t)
    {
        char param[48];
        snprintf(param, sizeof param, "tools[%zu]", i);
        const char *type = json_string_value(json_object_get(t, "type"));
        if (!type || strcmp(type, "function") != 0) {
            kt_api_error_invalid(e, param, "%s.type '%.40s' is not supported: kt-serve runs function tools only "
                                           "(no built-in tools)", param, type ? type : "?");
            goto fail;
        }
        const json_t *name = json_object_get(t, "name"), *desc = json_object_get(t, "description"),
                     *params = json_object_get(t, "parameters"), *strict = json_object_get(t, "strict");
        if (!is_str(name) || !json_string_length(name)) {
            kt_api_error_invalid(e, param, "%s.name must be a non-empty string (Responses tools are flat: "
                                           "{type, name, description, parameters})", param);
            goto fail;
        }
        if (!absent(desc) && !is_str(desc)) {
            kt_api_error_invalid(e, param, "%s.description must be a string", param);
            goto fail;
        }
        if (!absent(params) && !json_is_object(params)) {
            kt_api_error_invalid(e, param, "%s.parameters must be an object", param);
            goto fail;
        }
        if (!absent(strict) && !json_is_boolean(strict)) {
            kt_api_error_invalid(e, param, "%s.strict must be a boolean", param);
            goto fail;
        }
        json_t *fn = json_pack("{s:O}", "name", name);
        json_t *flat = json_pack("{s:s, s:O, s:O, s:O, s:O}", "type", "function", "name", name, "description",
                                 absent(desc) ? json_null() : desc, "parameters",
                                 absent(params) ? json_null() : params, "strict",
                                 absent(strict) ? json_true() : strict);
        if (!absent(desc))
            json_object_set(fn, "description", (json_t *)desc);
        if (!absent(params))
            json_object_set(fn, "parameters", (json_t *)params);
        json_array_append_new(chat, json_pack("{s:s, s:o}", "type", "function", "function", fn));
        json_array_append_new(*echo_out, flat);
    }
    *tools_out = chat;
    return true;
fail:
    json_decref(chat);
    return false;
}

/* tool_choice -> chat's form (a new reference; NULL: not given). */
static bool map_tool_choice(const json_t *tc, json_t **out, struct kt_api_error *e)
{
    *out = NULL;
    if (absent(tc))
        return true;
    if (json_is_string(tc)) {
        const char *s = json_string_value(tc);
        if (strcmp(s, "auto") != 0 && strcmp(s, "none") != 0 && strcmp(s, "required") != 0) {
            kt_api_error_invalid(e, "tool_choice", "'tool_choice' must be \"auto\", \"none\", \"required\" or "
                                                   "{\"type\": \"function\", \"name\": ...}");
            return false;
        }
        *out = json_incref((json_t *)tc);
        return true;
    }
    const char *type = json_string_value(json_object_get(tc, "type"));
    const json_t *name = json_object_get(tc, "name");
    if (!type || strcmp(type, "function") != 0 || !is_str(name)) {
        kt_api_error_invalid(e, "tool_choice", "'tool_choice' must be a string or {\"type\": \"function\", "
                                               "\"name\": ...} (kt-serve has no built-in or allowed-tools choices)");
        return false;
    }
    *out = json_pack("{s:s, s:{s:O}}", "type", "function", "function", "name", name);
    return true;
}

/* text.format -> chat's response_format (a new reference; NULL: text). */
static bool map_text_format(const json_t *text, json_t **out, struct kt_api_error *e)
{
    *out = NULL;
    if (absent(text))
        return true;
    if (!json_is_object(text)) {
        kt_api_error_invalid(e, "text", "'text' must be an object");
        return false;
    }
    const json_t *verb = json_object_get(text, "verbosity");
    if (!absent(verb) && !is_str(verb)) {
        kt_api_error_invalid(e, "text.verbosity", "'text.verbosity' must be a string");
        return false;
    }
    const json_t *f = json_object_get(text, "format");
    if (absent(f))
        return true;
    const char *type = json_string_value(json_object_get(f, "type"));
    if (!type) {
        kt_api_error_invalid(e, "text.format", "'text.format' must be an object with a type");
        return false;
    }
    if (strcmp(type, "text") == 0)
        return true;
    if (strcmp(type, "json_object") == 0) {
        *out = json_pack("{s:s}", "type", "json_object");
        return true;
    }
    if (strcmp(type, "json_schema") == 0) {
        const json_t *schema = json_object_get(f, "schema");
        if (!json_is_object(schema)) {
            kt_api_error_invalid(e, "text.format", "'text.format.schema' must be an object");
            return false;
        }
        json_t *js = json_pack("{s:O}", "schema", schema);
        static const char *const keys[] = {"name", "strict", "description"};
        for (int k = 0; k < 3; k++)
            if (!absent(json_object_get(f, keys[k])))
                json_object_set(js, keys[k], json_object_get(f, keys[k]));
        *out = json_pack("{s:s, s:o}", "type", "json_schema", "json_schema", js);
        return true;
    }
    kt_api_error_invalid(e, "text.format", "'text.format.type' must be \"text\", \"json_object\" or \"json_schema\"");
    return false;
}

/* Fields kt cannot honour. */
static bool refuse_unsupported(const json_t *root, struct kt_api_error *e)
{
    const json_t *v = json_object_get(root, "background");
    if (json_is_true(v)) {
        kt_api_error_invalid(e, "background", "'background' is not supported: kt-serve answers while it generates");
        return false;
    }
    static const char *const refused[] = {"conversation", "prompt", "max_tool_calls"};
    for (size_t k = 0; k < sizeof refused / sizeof refused[0]; k++)
        if (!absent(json_object_get(root, refused[k]))) {
            kt_api_error_invalid(e, refused[k], "'%s' is not supported by kt-serve", refused[k]);
            return false;
        }
    v = json_object_get(root, "truncation");
    if (!absent(v) && !(json_is_string(v) && strcmp(json_string_value(v), "disabled") == 0)) {
        kt_api_error_invalid(e, "truncation", "'truncation' must be \"disabled\": kt-serve does not drop input "
                                              "(a prompt past the context is a 400)");
        return false;
    }
    v = json_object_get(root, "include");
    if (!absent(v) && !json_is_array(v)) {
        kt_api_error_invalid(e, "include", "'include' must be an array");
        return false;
    }
    if (json_array_size(v)) {
        kt_api_error_invalid(e, "include", "'include' %.60s is not supported by kt-serve",
                             json_string_value(json_array_get(v, 0)) ? json_string_value(json_array_get(v, 0)) : "");
        return false;
    }
    v = json_object_get(root, "top_logprobs");
    if (!absent(v) && !(json_is_integer(v) && json_integer_value(v) == 0)) {
        kt_api_error_invalid(e, "top_logprobs", "'top_logprobs' is not supported on /v1/responses "
                                                "(use /v1/chat/completions)");
        return false;
    }
    v = json_object_get(root, "service_tier");
    if (!absent(v) && !is_str(v)) {
        kt_api_error_invalid(e, "service_tier", "'service_tier' must be a string");
        return false;
    }
    static const char *const strings[] = {"user", "instructions", "previous_response_id", "prompt_cache_key",
                                          "safety_identifier"};
    for (size_t k = 0; k < sizeof strings / sizeof strings[0]; k++) {
        v = json_object_get(root, strings[k]);
        if (!absent(v) && !is_str(v)) {
            kt_api_error_invalid(e, strings[k], "'%s' must be a string", strings[k]);
            return false;
        }
    }
    v = json_object_get(root, "metadata");
    if (!absent(v)) {
        const char *k;
        const json_t *x;
        bool ok = json_is_object(v) && json_object_size(v) <= 16;
        json_object_foreach((json_t *)v, k, x) ok = ok && is_str(x) && strlen(k) <= 64 && json_string_length(x) <= 512;
        if (!ok) {
            kt_api_error_invalid(e, "metadata", "'metadata' must be an object of at most 16 string values");
            return false;
        }
    }
    v = json_object_get(root, "reasoning");
    if (!absent(v)) {
        const json_t *effort = json_object_get(v, "effort"), *summary = json_object_get(v, "summary");
        if (!json_is_object(v) || (!absent(effort) && !is_str(effort)) || (!absent(summary) && !is_str(summary))) {
            kt_api_error_invalid(e, "reasoning", "'reasoning' must be {\"effort\": ..., \"summary\": ...} (strings)");
            return false;
        }
    }
    return true;
}

/* Copies key from root to chat when given, optionally renamed. */
static void pass(json_t *chat, const json_t *root, const char *key, const char *as)
{
    const json_t *v = json_object_get(root, key);
    if (!absent(v))
        json_object_set(chat, as ? as : key, (json_t *)v);
}

/* v (a new reference) when given, else fallback (stolen; NULL: null). */
static json_t *given(const json_t *v, json_t *fallback)
{
    if (!absent(v)) {
        json_decref(fallback);
        return json_incref((json_t *)v);
    }
    return fallback ? fallback : json_null();
}

/* A chat parser's error in this API's names. */
static void rename_param(struct kt_api_error *e)
{
    static const char *const names[][2] = {{"max_tokens", "max_output_tokens"}, {"response_format", "text.format"},
                                           {"messages", "input"}};
    for (size_t k = 0; k < sizeof names / sizeof names[0]; k++) {
        size_t n = strlen(names[k][0]);
        if (strncmp(e->param, names[k][0], n) == 0 && (e->param[n] == '\0' || e->param[n] == '[' ||
                                                       e->param[n] == '.')) {
            char rest[64], msg[sizeof e->message];
            snprintf(rest, sizeof rest, "%s", e->param + n);
            snprintf(e->param, sizeof e->param, "%s%s", names[k][1], rest);
            snprintf(msg, sizeof msg, "%s: %.700s", names[k][1], e->message);
            snprintf(e->message, sizeof e->message, "%s", msg);
            kt_api_utf8_fix(e->message, sizeof e->message);
            return;
        }
    }
}

bool kt_responses_request_parse(const char *body, size_t len, struct kt_responses_store *store,
                                struct kt_responses_request *out, struct kt_api_error *e)
{
    *out = (struct kt_responses_request){.store = true};
    json_t *root = kt_api_parse_json(body, len, e);
    json_t *chat = NULL, *messages = NULL, *input = NULL, *tools = NULL, *tools_echo = NULL, *tc = NULL, *rf = NULL;
    json_t *prev_in = NULL, *prev_out = NULL;
    char *text = NULL;
    bool ok = false;
    if (!root)
        return false;
    if (!refuse_unsupported(root, e))
        goto done;
    const json_t *v = json_object_get(root, "store");
    if (!absent(v) && !json_is_boolean(v)) {
        kt_api_error_invalid(e, "store", "'store' must be a boolean");
        goto done;
    }
    out->store = absent(v) || json_is_true(v);
    v = json_object_get(root, "max_output_tokens");
    if (!absent(v) && !(json_is_integer(v) && json_integer_value(v) >= 1 && json_integer_value(v) <= INT32_MAX)) {
        kt_api_error_invalid(e, "max_output_tokens", "'max_output_tokens' must be a positive integer");
        goto done;
    }

    /* the conversation: the previous response's items, then this input */
    input = json_array();
    const json_t *prev = json_object_get(root, "previous_response_id");
    if (!absent(prev)) {
        if (!kt_responses_store_get(store, json_string_value(prev), NULL, &prev_in, &prev_out)) {
            kt_api_error_set(e, 400, "invalid_request_error", "previous_response_not_found", "previous_response_id",
                             "Previous response with id '%.100s' not found (kt-serve keeps the last responses stored "
                             "in memory: --responses-store)", json_string_value(prev));
            goto done;
        }
        json_array_extend(input, prev_in);
        json_array_extend(input, prev_out);
    }
    v = json_object_get(root, "input");
    if (is_str(v)) {
        json_array_append_new(input, json_pack("{s:s, s:s, s:[{s:s, s:O}]}", "type", "message", "role", "user",
                                               "content", "type", "input_text", "text", v));
    } else if (json_is_array(v)) {
        /* item references (clients that keep ids send them for stored items) are the items they name */
        size_t i;
        const json_t *item;
        json_array_foreach(v, i, item)
        {
            const char *type = json_string_value(json_object_get(item, "type"));
            if (!type || strcmp(type, "item_reference") != 0) {
                json_array_append(input, (json_t *)item);
                continue;
            }
            const char *ref = json_string_value(json_object_get(item, "id"));
            json_t *found = ref ? kt_responses_store_item(store, ref) : NULL;
            if (!found) {
                kt_api_error_invalid(e, "input", "input[%zu]: item '%.100s' not found (item_reference names an "
                                                 "output item of a stored response)", i, ref ? ref : "?");
                goto done;
            }
            json_array_append_new(input, found);
        }
    } else if (!absent(v)) {
        kt_api_error_invalid(e, "input", "'input' must be a string or an array of input items");
        goto done;
    }
    messages = json_array();
    const json_t *instructions = json_object_get(root, "instructions");
    if (!absent(instructions))
        json_array_append_new(messages, json_pack("{s:s, s:O}", "role", "system", "content", instructions));
    if (!items_to_messages(input, messages, e))
        goto done;
    if (json_array_size(messages) == 0) {
        kt_api_error_invalid(e, "input", "'input' is required: a string or an array of input items");
        goto done;
    }
    if (!map_tools(json_object_get(root, "tools"), &tools, &tools_echo, e) ||
        !map_tool_choice(json_object_get(root, "tool_choice"), &tc, e) ||
        !map_text_format(json_object_get(root, "text"), &rf, e))
        goto done;

    chat = json_pack("{s:O}", "messages", messages);
    if (!chat) {
        nomem(e);
        goto done;
    }
    static const char *const same[] = {"model", "temperature", "top_p", "stream", "parallel_tool_calls", "seed",
                                       "ignore_eos", "kt_test_forced_output", "chat_template_kwargs"};
    for (size_t k = 0; k < sizeof same / sizeof same[0]; k++)
        pass(chat, root, same[k], NULL);
    pass(chat, root, "max_output_tokens", "max_tokens");
    if (tools)
        json_object_set(chat, "tools", tools);
    if (tc)
        json_object_set(chat, "tool_choice", tc);
    if (rf)
        json_object_set(chat, "response_format", rf);
    if (!(text = json_dumps(chat, JSON_COMPACT))) {
        nomem(e);
        goto done;
    }
    if (!kt_api_request_parse(KT_API_CHAT, text, strlen(text), &out->chat, e)) {
        rename_param(e);
        goto done;
    }

    /* what the response object repeats */
    const json_t *reasoning = json_object_get(root, "reasoning");
    const json_t *fmt = json_object_get(json_object_get(root, "text"), "format");
    json_t *echo = out->echo = json_object();
    if (!echo) {
        nomem(e);
        goto done;
    }
    json_object_set_new(echo, "instructions", given(instructions, NULL));
    json_object_set_new(echo, "max_output_tokens", given(json_object_get(root, "max_output_tokens"), NULL));
    json_object_set_new(echo, "previous_response_id", given(prev, NULL));
    json_object_set_new(echo, "tools", tools_echo);
    tools_echo = NULL;
    json_object_set_new(echo, "tool_choice", given(json_object_get(root, "tool_choice"),
                                                   json_string("auto")));
    json_object_set_new(echo, "temperature", json_real(out->chat.sampling.temperature));
    json_object_set_new(echo, "top_p", json_real(out->chat.sampling.top_p));
    json_object_set_new(echo, "parallel_tool_calls", json_boolean(out->chat.parallel_tool_calls));
    json_object_set_new(echo, "store", json_boolean(out->store));
    json_object_set_new(echo, "metadata", given(json_object_get(root, "metadata"), json_object()));
    json_object_set_new(echo, "reasoning",
                        json_pack("{s:o, s:o}", "effort", given(json_object_get(reasoning, "effort"), NULL),
                                  "summary", given(json_object_get(reasoning, "summary"), NULL)));
    json_object_set_new(echo, "text", json_pack("{s:o}", "format", given(fmt, json_pack("{s:s}", "type", "text"))));
    json_object_set_new(echo, "user", given(json_object_get(root, "user"), NULL));
    json_object_set_new(echo, "service_tier", given(json_object_get(root, "service_tier"), json_string("default")));
    json_object_set_new(echo, "truncation", json_string("disabled"));
    out->input = json_incref(input);
    ok = true;
done:
    free(text);
    json_decref(root), json_decref(chat), json_decref(messages), json_decref(input), json_decref(tools);
    json_decref(tools_echo), json_decref(tc), json_decref(rf), json_decref(prev_in), json_decref(prev_out);
    if (!ok)
        kt_responses_request_free(out);
    return ok;
}

void kt_responses_request_free(struct kt_responses_request *r)
{
    kt_api_request_free(&r->chat);
    json_decref(r->input);
    json_decref(r->echo);
    *r = (struct kt_responses_request){0};
}

/* ---- response: items and the object --------------------------------------------------------------- */

enum { OPEN_NONE, OPEN_REASONING, OPEN_MESSAGE, OPEN_CALL };

bool kt_responses_writer_init(struct kt_responses_writer *rw, const struct kt_responses_request *rq, const char *hex)
{
    *rw = (struct kt_responses_writer){.rq = rq, .output = json_array()};
    snprintf(rw->hex, sizeof rw->hex, "%s", hex);
    return rw->output != NULL;
}

void kt_responses_writer_free(struct kt_responses_writer *rw)
{
    json_decref(rw->output);
    rw->output = NULL;
}

static json_t *usage(const struct kt_response *w)
{
    json_int_t in = (json_int_t)w->job->prompt.n_ids, out = (json_int_t)w->ch[0].n_tokens, reasoning = 0;
    const struct kt_buf *r = &w->ch[0].out.reasoning;
    int32_t *ids = NULL;
    size_t n = 0;
    kt_err err = {0};
    /* the thinking's tokens: its text retokenized (the markers around it not counted) */
    if (r->len && kt_tokenize(w->tok, r->bytes, r->len, false, false, &ids, &n, &err) == KT_OK)
        reasoning = (json_int_t)n < out ? (json_int_t)n : out;
    free(ids);
    return json_pack("{s:I, s:{s:I}, s:I, s:{s:I}, s:I}", "input_tokens", in, "input_tokens_details", "cached_tokens",
                     (json_int_t)w->n_cached, "output_tokens", out, "output_tokens_details", "reasoning_tokens",
                     reasoning, "total_tokens", in + out);
}

/* The response object with status; output and usage (NULL: null) are stolen. */
static json_t *response_object(const struct kt_responses_writer *rw, const struct kt_response *w, const char *status,
                               json_t *output, json_t *use)
{
    json_t *j = json_pack("{s:s, s:s, s:I, s:s, s:b, s:n, s:o, s:s}", "id", w->id, "object", "response", "created_at",
                          (json_int_t)w->created, "status", status, "background", 0, "error", "incomplete_details",
                          strcmp(status, "incomplete") == 0 ? json_pack("{s:s}", "reason", "max_output_tokens")
                                                            : json_null(),
                          "model", w->model);
    if (j)
        json_object_update(j, rw->rq->echo);
    json_object_set_new(j, "output", output ? output : json_array());
    json_object_set_new(j, "max_tool_calls", json_null());
    json_object_set_new(j, "top_logprobs", json_integer(0));
    json_object_set_new(j, "usage", use ? use : json_null());
    return j;
}

static void emit(struct kt_responses_writer *rw, struct kt_buf *out, const char *type, json_t *j)
{
    json_t *ev = json_pack("{s:s, s:I}", "type", type, "sequence_number", (json_int_t)rw->seq++);
    char *s = ev && j && json_object_update(ev, j) == 0 ? json_dumps(ev, JSON_COMPACT) : NULL;
    json_decref(ev);
    json_decref(j);
    if (!s) {
        out->out_of_memory = true;
        return;
    }
    kt_buf_printf(out, "event: %s\ndata: %s\n\n", type, s);
    free(s);
}

static void item_id(const struct kt_responses_writer *rw, const char *prefix, size_t index, char *id, size_t size)
{
    snprintf(id, size, "%s_%s%02zx", prefix, rw->hex, index);
}

static json_t *reasoning_item(const char *id, const char *text, size_t len, const char *status)
{
    json_t *summary = json_array();
    if (text)
        json_array_append_new(summary,
                              json_pack("{s:s, s:o}", "type", "summary_text", "text", kt_json_text(text, len)));
    json_t *j = json_pack("{s:s, s:s, s:o}", "type", "reasoning", "id", id, "summary", summary);
    if (status)
        json_object_set_new(j, "status", json_string(status));
    return j;
}

static json_t *text_part(const char *text, size_t len)
{
    return json_pack("{s:s, s:o, s:[], s:[]}", "type", "output_text", "text", kt_json_text(text, len), "annotations",
                     "logprobs");
}

static json_t *message_item(const char *id, const char *text, size_t len, const char *status)
{
    json_t *content = json_array();
    if (text)
        json_array_append_new(content, text_part(text, len));
    return json_pack("{s:s, s:s, s:s, s:s, s:o}", "type", "message", "id", id, "role", "assistant", "status", status,
                     "content", content);
}

static json_t *call_item(const char *id, const struct kt_output_call *c, bool done)
{
    return json_pack("{s:s, s:s, s:o, s:o, s:o, s:s}", "type", "function_call", "id", id, "call_id",
                     kt_json_text(c->id, strlen(c->id)), "name", kt_json_text(c->name, strlen(c->name)), "arguments",
                     done ? kt_json_text(kt_buf_str(&c->arguments), c->arguments.len) : json_string(""), "status",
                     done ? "completed" : "in_progress");
}

/* ---- streaming -------------------------------------------------------------------------------------- */

static size_t output_index(const struct kt_responses_writer *rw)
{
    return json_array_size(rw->output);
}

static void close_open(struct kt_responses_writer *rw, struct kt_output *o, struct kt_buf *out)
{
    size_t index = output_index(rw);
    json_int_t oi = (json_int_t)index;
    char id[KT_RESPONSES_ID_MAX];
    json_t *item = NULL;
    if (rw->open == OPEN_REASONING) {
        item_id(rw, "rs", index, id, sizeof id);
        const char *text = o->reasoning.bytes ? o->reasoning.bytes + rw->reasoning_at : "";
        size_t len = o->reasoning.len - rw->reasoning_at;
        emit(rw, out, "response.reasoning_summary_text.done",
             json_pack("{s:s, s:I, s:i, s:o}", "item_id", id, "output_index", oi, "summary_index", 0, "text",
                       kt_json_text(text, len)));
        emit(rw, out, "response.reasoning_summary_part.done",
             json_pack("{s:s, s:I, s:i, s:{s:s, s:o}}", "item_id", id, "output_index", oi, "summary_index", 0, "part",
                       "type", "summary_text", "text", kt_json_text(text, len)));
        item = reasoning_item(id, text, len, NULL);
        rw->reasoning_at = o->reasoning.len;
    } else if (rw->open == OPEN_MESSAGE) {
        item_id(rw, "msg", index, id, sizeof id);
        const char *text = o->content.bytes ? o->content.bytes + rw->content_at : "";
        size_t len = o->content.len - rw->content_at;
        emit(rw, out, "response.output_text.done",
             json_pack("{s:s, s:I, s:i, s:o, s:[]}", "item_id", id, "output_index", oi, "content_index", 0, "text",
                       kt_json_text(text, len), "logprobs"));
        emit(rw, out, "response.content_part.done",
             json_pack("{s:s, s:I, s:i, s:o}", "item_id", id, "output_index", oi, "content_index", 0, "part",
                       text_part(text, len)));
        item = message_item(id, text, len, rw->cut ? "incomplete" : "completed");
        rw->content_at = o->content.len;
    } else if (rw->open == OPEN_CALL) {
        const struct kt_output_call *c = &o->calls[rw->calls_done];
        item_id(rw, "fc", index, id, sizeof id);
        emit(rw, out, "response.function_call_arguments.done",
             json_pack("{s:s, s:I, s:o, s:o}", "item_id", id, "output_index", oi, "name",
                       kt_json_text(c->name, strlen(c->name)), "arguments",
                       kt_json_text(kt_buf_str(&c->arguments), c->arguments.len)));
        item = call_item(id, c, true);
        if (rw->cut)
            json_object_set_new(item, "status", json_string("incomplete"));
        rw->calls_done++;
    } else {
        return;
    }
    emit(rw, out, "response.output_item.done", json_pack("{s:I, s:O}", "output_index", oi, "item", item));
    json_array_append_new(rw->output, item);
    rw->open = OPEN_NONE;
}

static void open_item(struct kt_responses_writer *rw, struct kt_output *o, struct kt_buf *out, int what)
{
    close_open(rw, o, out);
    size_t index = output_index(rw);
    json_int_t oi = (json_int_t)index;
    char id[KT_RESPONSES_ID_MAX];
    if (what == OPEN_REASONING) {
        item_id(rw, "rs", index, id, sizeof id);
        emit(rw, out, "response.output_item.added",
             json_pack("{s:I, s:o}", "output_index", oi, "item", reasoning_item(id, NULL, 0, NULL)));
        emit(rw, out, "response.reasoning_summary_part.added",
             json_pack("{s:s, s:I, s:i, s:{s:s, s:s}}", "item_id", id, "output_index", oi, "summary_index", 0, "part",
                       "type", "summary_text", "text", ""));
    } else if (what == OPEN_MESSAGE) {
        item_id(rw, "msg", index, id, sizeof id);
        emit(rw, out, "response.output_item.added",
             json_pack("{s:I, s:o}", "output_index", oi, "item", message_item(id, NULL, 0, "in_progress")));
        emit(rw, out, "response.content_part.added",
             json_pack("{s:s, s:I, s:i, s:o}", "item_id", id, "output_index", oi, "content_index", 0, "part",
                       text_part("", 0)));
    } else {
        item_id(rw, "fc", index, id, sizeof id);
        emit(rw, out, "response.output_item.added",
             json_pack("{s:I, s:o}", "output_index", oi, "item", call_item(id, &o->calls[rw->calls_done], false)));
    }
    rw->open = what;
}

/* Emits the events for what the parser placed since the last call (every
 * delta the bytes past the cursors); quiet writes into a scratch buffer. */
static void advance(struct kt_responses_writer *rw, struct kt_output *o, struct kt_buf *out)
{
    char id[KT_RESPONSES_ID_MAX];
    if (o->reasoning.len > o->reasoning_sent) {
        if (rw->open != OPEN_REASONING)
            open_item(rw, o, out, OPEN_REASONING);
        item_id(rw, "rs", output_index(rw), id, sizeof id);
        emit(rw, out, "response.reasoning_summary_text.delta",
             json_pack("{s:s, s:I, s:i, s:o}", "item_id", id, "output_index", (json_int_t)output_index(rw),
                       "summary_index", 0, "delta",
                       kt_json_text(o->reasoning.bytes + o->reasoning_sent, o->reasoning.len - o->reasoning_sent)));
        o->reasoning_sent = o->reasoning.len;
    }
    if (o->content.len > o->content_sent) {
        if (rw->open != OPEN_MESSAGE)
            open_item(rw, o, out, OPEN_MESSAGE);
        item_id(rw, "msg", output_index(rw), id, sizeof id);
        emit(rw, out, "response.output_text.delta",
             json_pack("{s:s, s:I, s:i, s:o, s:[]}", "item_id", id, "output_index", (json_int_t)output_index(rw),
                       "content_index", 0, "delta",
                       kt_json_text(o->content.bytes + o->content_sent, o->content.len - o->content_sent),
                       "logprobs"));
        o->content_sent = o->content.len;
    }
    while (rw->calls_done < o->n_calls) {
        struct kt_output_call *c = &o->calls[rw->calls_done];
        if (rw->open != OPEN_CALL)
            open_item(rw, o, out, OPEN_CALL);
        if (c->arguments.len > c->arguments_sent) {
            item_id(rw, "fc", output_index(rw), id, sizeof id);
            emit(rw, out, "response.function_call_arguments.delta",
                 json_pack("{s:s, s:I, s:o}", "item_id", id, "output_index", (json_int_t)output_index(rw), "delta",
                           kt_json_text(c->arguments.bytes + c->arguments_sent,
                                        c->arguments.len - c->arguments_sent)));
            c->arguments_sent = c->arguments.len;
        }
        if (rw->calls_done + 1 == o->n_calls)
            break; /* the last call may still grow */
        close_open(rw, o, out);
    }
}

static const char *final_status(const struct kt_response *w)
{
    return w->ch[0].finish == KT_FINISH_LENGTH ? "incomplete" : "completed";
}

bool kt_responses_stream(struct kt_responses_writer *rw, struct kt_response *w, struct kt_buf *out)
{
    if (rw->ended)
        return true;
    if (!rw->started) {
        emit(rw, out, "response.created",
             json_pack("{s:o}", "response", response_object(rw, w, "in_progress", NULL, NULL)));
        emit(rw, out, "response.in_progress",
             json_pack("{s:o}", "response", response_object(rw, w, "in_progress", NULL, NULL)));
        rw->started = true;
    }
    struct kt_output *o = &w->ch[0].out;
    advance(rw, o, out);
    if (!w->job_done)
        return false;
    /* a job is done once its choice ended, so the parser placed everything */
    rw->cut = w->ch[0].finish == KT_FINISH_LENGTH; /* the item the limit ended is incomplete */
    close_open(rw, o, out);
    struct kt_api_error e;
    if (kt_response_job_error(w, &e)) {
        /* the server ended it: an error, never a completion */
        const char *code = e.code[0] ? e.code : "server_error";
        emit(rw, out, "error", json_pack("{s:s, s:s, s:n}", "code", code, "message", e.message, "param"));
        json_t *r = response_object(rw, w, "failed", json_deep_copy(rw->output), usage(w));
        json_object_set_new(r, "error", json_pack("{s:s, s:s}", "code", code, "message", e.message));
        emit(rw, out, "response.failed", json_pack("{s:o}", "response", r));
    } else {
        const char *status = final_status(w);
        emit(rw, out, strcmp(status, "incomplete") == 0 ? "response.incomplete" : "response.completed",
             json_pack("{s:o}", "response", response_object(rw, w, status, json_deep_copy(rw->output), usage(w))));
    }
    rw->ended = true;
    return true;
}

json_t *kt_responses_final(struct kt_responses_writer *rw, struct kt_response *w, struct kt_api_error *e)
{
    if (kt_response_job_error(w, e))
        return NULL;
    if (!rw->ended) { /* not streamed: the same items, the events dropped */
        struct kt_buf scratch = {0};
        struct kt_output *o = &w->ch[0].out;
        advance(rw, o, &scratch);
        rw->cut = w->ch[0].finish == KT_FINISH_LENGTH;
        close_open(rw, o, &scratch);
        bool failed = scratch.out_of_memory;
        kt_buf_free(&scratch);
        if (failed) {
            kt_api_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
            return NULL;
        }
    }
    json_t *j = response_object(rw, w, final_status(w), json_deep_copy(rw->output), usage(w));
    if (!j)
        kt_api_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
    return j;
}

const json_t *kt_responses_output(const json_t *object)
{
    return json_object_get(object, "output");
}
