/*
 * serve_anthropic.c - the Messages API's request and response JSON (see
 * serve_anthropic.h for the mapping).  The request is rewritten into the
 * OpenAI message and tool forms and handed to chat.h's parser, so both APIs
 * render through one path; the response reads the kt_response the OpenAI
 * writer fills (its parsed reasoning, content and calls).
 */
#include "serve_anthropic.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- errors ---------------------------------------------------------------------------------- */

static void nomem(struct kt_api_error *e)
{
    kt_api_error_set(e, 500, "api_error", NULL, NULL, "out of memory");
}

json_t *kt_anthropic_error_json(const struct kt_api_error *e)
{
    const char *type;
    switch (e->http_status) {
    case 400: type = "invalid_request_error"; break;
    case 401: type = "authentication_error"; break;
    case 403: type = "permission_error"; break;
    case 404: type = "not_found_error"; break;
    case 413: type = "request_too_large"; break;
    case 429: type = "rate_limit_error"; break;
    case 503:
    case 529: type = "overloaded_error"; break;
    case 504: type = "timeout_error"; break;
    default: type = e->http_status >= 400 && e->http_status < 500 ? "invalid_request_error" : "api_error"; break;
    }
    return json_pack("{s:s, s:{s:s, s:s}}", "type", "error", "error", "type", type, "message",
                     e->message[0] ? e->message : "error");
}

/* ---- small readers ----------------------------------------------------------------------------- */

static bool is_str(const json_t *v)
{
    return json_is_string(v) && memchr(json_string_value(v), '\0', json_string_length(v)) == NULL;
}

static bool present(const json_t *v)
{
    return v && !json_is_null(v);
}

/* Every key of o is in allowed (NULL-terminated); else Anthropic's refusal. */
static bool only_fields(const json_t *o, const char *where, const char *const *allowed, struct kt_api_error *e)
{
    const char *key;
    const json_t *v;
    json_object_foreach((json_t *)o, key, v)
    {
        bool known = false;
        for (size_t i = 0; allowed[i] && !known; i++)
            known = strcmp(key, allowed[i]) == 0;
        if (!known) {
            kt_api_error_invalid(e, key, "%s%s%.64s: Extra inputs are not permitted", where, where[0] ? "." : "",
                                 key);
            return false;
        }
    }
    return true;
}

static bool want_object(const json_t *v, const char *where, struct kt_api_error *e)
{
    if (json_is_object(v))
        return true;
    kt_api_error_invalid(e, where, "%s: Input should be an object", where);
    return false;
}

static bool want_string(const json_t *v, const char *where, struct kt_api_error *e)
{
    if (is_str(v))
        return true;
    kt_api_error_invalid(e, where, "%s: %s", where, v ? "Input should be a valid string" : "Field required");
    return false;
}

/* Optional cache_control on a block: {"type": "ephemeral", "ttl"?}. */
static bool check_cache_control(const json_t *block, const char *where, struct kt_api_error *e)
{
    const json_t *cc = json_object_get(block, "cache_control");
    if (!present(cc))
        return true;
    char at[160];
    snprintf(at, sizeof at, "%.120s.cache_control", where);
    static const char *const fields[] = {"type", "ttl", NULL};
    const json_t *t = json_object_get(cc, "type");
    if (!want_object(cc, at, e) || !only_fields(cc, at, fields, e))
        return false;
    if (!is_str(t) || strcmp(json_string_value(t), "ephemeral") != 0) {
        kt_api_error_invalid(e, at, "%s.type: Input should be 'ephemeral'", at);
        return false;
    }
    return true;
}

/* A text block {"type":"text","text":...} (cache_control, citations accepted). */
static bool check_text_block(const json_t *b, const char *where, struct kt_api_error *e)
{
    static const char *const fields[] = {"type", "text", "cache_control", "citations", NULL};
    char at[160];
    snprintf(at, sizeof at, "%.120s.text", where);
    return only_fields(b, where, fields, e) && want_string(json_object_get(b, "text"), at, e) &&
           check_cache_control(b, where, e);
}

static const char *block_type(const json_t *b, const char *where, struct kt_api_error *e)
{
    if (!want_object(b, where, e))
        return NULL;
    const json_t *t = json_object_get(b, "type");
    if (!is_str(t)) {
        kt_api_error_invalid(e, where, "%s.type: Field required", where);
        return NULL;
    }
    return json_string_value(t);
}

static void unsupported_block(const char *type, const char *where, struct kt_api_error *e)
{
    kt_api_error_invalid(e, where, "%s: content blocks of type '%.40s' are not supported by kt-serve (text, tool_use, "
                                   "tool_result and thinking are)", where, type);
}

/* A string, or text blocks, as one OpenAI content value (a string or parts). */
static json_t *text_content(const json_t *v, const char *where, struct kt_api_error *e)
{
    if (is_str(v))
        return json_incref((json_t *)v);
    if (!json_is_array(v)) {
        kt_api_error_invalid(e, where, "%s: Input should be a valid string or a list of text blocks", where);
        return NULL;
    }
    json_t *parts = json_array();
    size_t i;
    const json_t *b;
    json_array_foreach(v, i, b)
    {
        char at[160];
        snprintf(at, sizeof at, "%.120s.%zu", where, i);
        const char *type = block_type(b, at, e);
        if (!type)
            goto fail;
        if (strcmp(type, "text") != 0) {
            unsupported_block(type, at, e);
            goto fail;
        }
        if (!check_text_block(b, at, e))
            goto fail;
        json_array_append_new(parts, json_pack("{s:s, s:O}", "type", "text", "text", json_object_get(b, "text")));
    }
    return parts;
fail:
    json_decref(parts);
    return NULL;
}

/* ---- tool ids ------------------------------------------------------------------------------------ */

#define TOOL_ID_PREFIX "toolu_kt_"

char *kt_anthropic_tool_id(const char *model_id)
{
    struct kt_buf b = {0};
    kt_buf_puts(&b, TOOL_ID_PREFIX);
    for (const unsigned char *c = (const unsigned char *)model_id; *c; c++) {
        if ((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') || *c == '-')
            kt_buf_append(&b, (const char *)c, 1);
        else
            kt_buf_printf(&b, "_%02X", *c);
    }
    if (b.out_of_memory) {
        kt_buf_free(&b);
        return NULL;
    }
    return b.bytes;
}

static int hex_digit(char c)
{
    return c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

char *kt_anthropic_model_tool_id(const char *id)
{
    size_t n = strlen(TOOL_ID_PREFIX);
    if (strncmp(id, TOOL_ID_PREFIX, n) != 0)
        return strdup(id);
    struct kt_buf b = {0};
    kt_buf_append(&b, "", 0);
    bool ours = true;
    for (const char *c = id + n; *c && ours; c++) {
        if (*c != '_') {
            ours = (*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') || *c == '-';
            kt_buf_append(&b, c, 1);
            continue;
        }
        int hi = hex_digit(c[1]), lo = hi < 0 ? -1 : hex_digit(c[2]);
        ours = hi >= 0 && lo >= 0 && (hi || lo);
        char byte = (char)(hi * 16 + lo);
        kt_buf_append(&b, &byte, 1);
        c += ours ? 2 : 0;
    }
    json_t *utf8 = ours && !b.out_of_memory ? json_stringn(b.bytes, b.len) : NULL; /* kt's ids decode to UTF-8 */
    json_decref(utf8);
    if (!utf8) { /* not one kt made: kept whole */
        bool nomem_ = b.out_of_memory;
        kt_buf_free(&b);
        return nomem_ ? NULL : strdup(id);
    }
    return b.bytes;
}

/* ---- messages --------------------------------------------------------------------------------------- */

/* Appends a user turn with parts (taking them) unless there are none. */
static void flush_user(json_t *out, json_t **parts)
{
    if (json_array_size(*parts))
        json_array_append_new(out, json_pack("{s:s, s:o}", "role", "user", "content", *parts));
    else
        json_decref(*parts);
    *parts = json_array();
}

static bool tool_result(const json_t *b, const char *at, json_t *out, struct kt_api_error *e)
{
    static const char *const fields[] = {"type", "tool_use_id", "content", "is_error", "cache_control",
                                         "toolset_name", NULL};
    char where[160];
    snprintf(where, sizeof where, "%.120s.tool_use_id", at);
    const json_t *id = json_object_get(b, "tool_use_id"), *err = json_object_get(b, "is_error");
    if (!only_fields(b, at, fields, e) || !want_string(id, where, e) || !check_cache_control(b, at, e))
        return false;
    if (present(err) && !json_is_boolean(err)) {
        kt_api_error_invalid(e, at, "%s.is_error: Input should be a valid boolean", at);
        return false;
    }
    snprintf(where, sizeof where, "%.120s.toolset_name", at);
    if (present(json_object_get(b, "toolset_name")) && !want_string(json_object_get(b, "toolset_name"), where, e))
        return false;
    struct kt_buf text = {0};
    if (json_is_true(err))
        kt_buf_puts(&text, "Error: ");
    const json_t *c = json_object_get(b, "content");
    if (present(c)) {
        snprintf(where, sizeof where, "%.120s.content", at);
        json_t *content = text_content(c, where, e);
        if (!content) {
            kt_buf_free(&text);
            return false;
        }
        if (json_is_string(content)) {
            kt_buf_append(&text, json_string_value(content), json_string_length(content));
        } else {
            size_t i;
            const json_t *p;
            json_array_foreach(content, i, p)
            {
                const json_t *t = json_object_get(p, "text");
                kt_buf_append(&text, json_string_value(t), json_string_length(t));
            }
        }
        json_decref(content);
    }
    char *model_id = kt_anthropic_model_tool_id(json_string_value(id));
    json_t *turn = model_id ? json_pack("{s:s, s:s, s:s%}", "role", "tool", "tool_call_id", model_id, "content",
                                        kt_buf_str(&text), text.len)
                            : NULL;
    free(model_id);
    bool ok = turn && !text.out_of_memory;
    kt_buf_free(&text);
    if (!ok) {
        json_decref(turn);
        nomem(e);
        return false;
    }
    json_array_append_new(out, turn);
    return true;
}

static bool user_turn(const json_t *content, const char *at, json_t *out, struct kt_api_error *e)
{
    if (is_str(content)) {
        json_array_append_new(out, json_pack("{s:s, s:O}", "role", "user", "content", content));
        return true;
    }
    json_t *parts = json_array();
    size_t i;
    const json_t *b;
    json_array_foreach(content, i, b)
    {
        char where[160];
        snprintf(where, sizeof where, "%.120s.%zu", at, i);
        const char *type = block_type(b, where, e);
        if (!type)
            goto fail;
        if (strcmp(type, "text") == 0) {
            if (!check_text_block(b, where, e))
                goto fail;
            json_array_append_new(parts, json_pack("{s:s, s:O}", "type", "text", "text", json_object_get(b, "text")));
        } else if (strcmp(type, "tool_result") == 0) {
            flush_user(out, &parts); /* text before a result stays before it */
            if (!tool_result(b, where, out, e))
                goto fail;
        } else if (strcmp(type, "tool_use") == 0 || strcmp(type, "thinking") == 0 ||
                   strcmp(type, "redacted_thinking") == 0) {
            kt_api_error_invalid(e, where, "%s: '%s' blocks belong in assistant messages", where, type);
            goto fail;
        } else {
            unsupported_block(type, where, e);
            goto fail;
        }
    }
    if (json_array_size(content) == 0)
        json_array_append_new(out, json_pack("{s:s, s:s}", "role", "user", "content", ""));
    flush_user(out, &parts);
    json_decref(parts);
    return true;
fail:
    json_decref(parts);
    return false;
}

static bool assistant_turn(const json_t *content, const char *at, json_t *out, struct kt_api_error *e)
{
    if (is_str(content)) {
        json_array_append_new(out, json_pack("{s:s, s:O}", "role", "assistant", "content", content));
        return true;
    }
    json_t *parts = json_array(), *calls = json_array();
    struct kt_buf reasoning = {0};
    bool has_reasoning = false;
    size_t i;
    const json_t *b;
    json_array_foreach(content, i, b)
    {
        char where[160], field[160];
        snprintf(where, sizeof where, "%.120s.%zu", at, i);
        const char *type = block_type(b, where, e);
        if (!type)
            goto fail;
        if (strcmp(type, "text") == 0) {
            if (!check_text_block(b, where, e))
                goto fail;
            json_array_append_new(parts, json_pack("{s:s, s:O}", "type", "text", "text", json_object_get(b, "text")));
        } else if (strcmp(type, "tool_use") == 0) {
            static const char *const fields[] = {"type", "id", "name", "input", "cache_control", "caller",
                                                 "toolset_name", NULL};
            const json_t *id = json_object_get(b, "id"), *name = json_object_get(b, "name");
            const json_t *input = json_object_get(b, "input");
            if (!only_fields(b, where, fields, e) || !check_cache_control(b, where, e))
                goto fail;
            snprintf(field, sizeof field, "%.120s.id", where);
            if (!want_string(id, field, e))
                goto fail;
            snprintf(field, sizeof field, "%.120s.name", where);
            if (!want_string(name, field, e))
                goto fail;
            snprintf(field, sizeof field, "%.120s.input", where);
            if (!want_object(input, field, e))
                goto fail;
            const json_t *caller = json_object_get(b, "caller");
            if (present(caller) && !(json_is_object(caller) && json_object_size(caller) == 1 &&
                                     is_str(json_object_get(caller, "type")) &&
                                     strcmp(json_string_value(json_object_get(caller, "type")), "direct") == 0)) {
                kt_api_error_invalid(e, where, "%s.caller: kt-serve has no code execution: only {'type': 'direct'}",
                                     where);
                goto fail;
            }
            snprintf(field, sizeof field, "%.120s.toolset_name", where);
            if (present(json_object_get(b, "toolset_name")) && !want_string(json_object_get(b, "toolset_name"), field, e))
                goto fail;
            char *model_id = kt_anthropic_model_tool_id(json_string_value(id));
            json_t *call = model_id ? json_pack("{s:s, s:s, s:{s:O, s:O}}", "id", model_id, "type", "function",
                                                "function", "name", name, "arguments", input)
                                    : NULL;
            free(model_id);
            if (!call) {
                nomem(e);
                goto fail;
            }
            json_array_append_new(calls, call);
        } else if (strcmp(type, "thinking") == 0) {
            static const char *const fields[] = {"type", "thinking", "signature", NULL};
            snprintf(field, sizeof field, "%.120s.thinking", where);
            if (!only_fields(b, where, fields, e) || !want_string(json_object_get(b, "thinking"), field, e))
                goto fail;
            const json_t *t = json_object_get(b, "thinking");
            kt_buf_append(&reasoning, json_string_value(t), json_string_length(t));
            has_reasoning = true;
        } else if (strcmp(type, "redacted_thinking") == 0) {
            static const char *const fields[] = {"type", "data", NULL};
            if (!only_fields(b, where, fields, e)) /* opaque to kt: not rendered */
                goto fail;
        } else if (strcmp(type, "tool_result") == 0) {
            kt_api_error_invalid(e, where, "%s: 'tool_result' blocks belong in user messages", where);
            goto fail;
        } else {
            unsupported_block(type, where, e);
            goto fail;
        }
    }
    json_t *turn = json_pack("{s:s, s:o}", "role", "assistant", "content", parts);
    parts = NULL;
    if (json_array_size(calls))
        json_object_set(turn, "tool_calls", calls);
    if (has_reasoning)
        json_object_set_new(turn, "reasoning_content", json_stringn(kt_buf_str(&reasoning), reasoning.len));
    json_array_append_new(out, turn);
    json_decref(calls);
    kt_buf_free(&reasoning);
    return true;
fail:
    json_decref(parts);
    json_decref(calls);
    kt_buf_free(&reasoning);
    return false;
}

/* The OpenAI messages array of system + messages. */
static json_t *openai_messages(const json_t *root, struct kt_api_error *e)
{
    json_t *out = json_array();
    const json_t *system = json_object_get(root, "system");
    if (present(system)) {
        json_t *content = text_content(system, "system", e);
        if (!content)
            goto fail;
        json_array_append_new(out, json_pack("{s:s, s:o}", "role", "system", "content", content));
    }
    const json_t *messages = json_object_get(root, "messages");
    if (!messages) {
        kt_api_error_invalid(e, "messages", "messages: Field required");
        goto fail;
    }
    if (!json_is_array(messages) || json_array_size(messages) == 0) {
        kt_api_error_invalid(e, "messages", "messages: Input should be a non-empty list");
        goto fail;
    }
    size_t i;
    const json_t *m;
    json_array_foreach(messages, i, m)
    {
        static const char *const fields[] = {"role", "content", NULL};
        char at[64], field[160];
        snprintf(at, sizeof at, "messages.%zu", i);
        if (!want_object(m, at, e) || !only_fields(m, at, fields, e))
            goto fail;
        const json_t *role = json_object_get(m, "role"), *content = json_object_get(m, "content");
        bool user = is_str(role) && strcmp(json_string_value(role), "user") == 0;
        bool assistant = is_str(role) && strcmp(json_string_value(role), "assistant") == 0;
        if (!user && !assistant) {
            kt_api_error_invalid(e, at, "%s.role: Input should be 'user' or 'assistant'", at);
            goto fail;
        }
        snprintf(field, sizeof field, "%.120s.content", at);
        if (!is_str(content) && !json_is_array(content)) {
            kt_api_error_invalid(e, field, "%s: %s", field,
                                 content ? "Input should be a valid string or a list of content blocks"
                                         : "Field required");
            goto fail;
        }
        if (!(user ? user_turn(content, field, out, e) : assistant_turn(content, field, out, e)))
            goto fail;
        if (assistant && i + 1 == json_array_size(messages)) {
            kt_api_error_invalid(e, at, "%s: the last message is the assistant's: kt-serve does not continue an "
                                        "assistant turn (prefill); end with a user message", at);
            goto fail;
        }
    }
    return out;
fail:
    json_decref(out);
    return NULL;
}

/* ---- tools ----------------------------------------------------------------------------------------------- */

/* A custom tool's newer fields: eager_input_streaming is a latency hint (kt sends a call's
 * input whole either way); the others need what kt lacks. */
static bool tool_extras_ok(const json_t *t, const char *at, struct kt_api_error *e)
{
    const json_t *callers = json_object_get(t, "allowed_callers"), *eager = json_object_get(t, "eager_input_streaming");
    const json_t *examples = json_object_get(t, "input_examples");
    if (present(eager) && !json_is_boolean(eager)) {
        kt_api_error_invalid(e, at, "%s.eager_input_streaming: Input should be a valid boolean", at);
        return false;
    }
    if (present(callers)) {
        size_t i;
        const json_t *c;
        bool direct = json_is_array(callers);
        json_array_foreach(callers, i, c) direct = direct && is_str(c) && strcmp(json_string_value(c), "direct") == 0;
        if (!direct) {
            kt_api_error_invalid(e, at, "%s.allowed_callers: kt-serve has no code execution: only 'direct' calls", at);
            return false;
        }
    }
    if (json_is_true(json_object_get(t, "defer_loading"))) {
        kt_api_error_invalid(e, at, "%s.defer_loading: kt-serve has no tool search to load a deferred tool", at);
        return false;
    }
    if (present(examples) && !(json_is_array(examples) && json_array_size(examples) == 0)) {
        kt_api_error_invalid(e, at, "%s.input_examples: not supported by kt-serve (the chat templates declare no "
                                    "examples)", at);
        return false;
    }
    return true;
}

static bool parse_tools(struct kt_api_request *r, const json_t *root, struct kt_api_error *e)
{
    const json_t *tools = json_object_get(root, "tools");
    if (present(tools)) {
        if (!json_is_array(tools)) {
            kt_api_error_invalid(e, "tools", "tools: Input should be a valid list");
            return false;
        }
        json_t *converted = json_array();
        size_t i;
        const json_t *t;
        json_array_foreach(tools, i, t)
        {
            static const char *const fields[] = {"type", "name", "description", "input_schema", "cache_control",
                                                 "strict", "eager_input_streaming", "allowed_callers",
                                                 "defer_loading", "input_examples", NULL};
            char at[48], field[160];
            snprintf(at, sizeof at, "tools.%zu", i);
            if (!want_object(t, at, e))
                goto fail;
            const json_t *type = json_object_get(t, "type");
            if (present(type) && !(is_str(type) && strcmp(json_string_value(type), "custom") == 0)) {
                kt_api_error_invalid(e, at, "%s.type: '%.60s' is not supported by kt-serve: Anthropic-defined and "
                                            "server tools need Anthropic's own implementation; declare a custom tool "
                                            "with input_schema", at, is_str(type) ? json_string_value(type) : "?");
                goto fail;
            }
            if (!only_fields(t, at, fields, e) || !check_cache_control(t, at, e))
                goto fail;
            const json_t *name = json_object_get(t, "name"), *desc = json_object_get(t, "description");
            const json_t *schema = json_object_get(t, "input_schema"), *strict = json_object_get(t, "strict");
            snprintf(field, sizeof field, "%.120s.name", at);
            if (!want_string(name, field, e))
                goto fail;
            if (json_string_length(name) == 0) {
                kt_api_error_invalid(e, field, "%s: String should have at least 1 character", field);
                goto fail;
            }
            snprintf(field, sizeof field, "%.120s.description", at);
            if (present(desc) && !want_string(desc, field, e))
                goto fail;
            snprintf(field, sizeof field, "%.120s.input_schema", at);
            if (!schema) {
                kt_api_error_invalid(e, field, "%s: Field required", field);
                goto fail;
            }
            if (!want_object(schema, field, e))
                goto fail;
            const json_t *stype = json_object_get(schema, "type");
            if (!is_str(stype) || strcmp(json_string_value(stype), "object") != 0) {
                kt_api_error_invalid(e, field, "%s.type: Input should be 'object'", field);
                goto fail;
            }
            if (json_is_true(strict)) {
                kt_api_error_invalid(e, at, "%s.strict: kt-serve has no constrained decoding to hold a tool's input "
                                            "to its schema", at);
                goto fail;
            }
            if (!tool_extras_ok(t, at, e))
                goto fail;
            json_t *fn = json_pack("{s:O}", "name", name);
            if (present(desc))
                json_object_set(fn, "description", (json_t *)desc);
            json_object_set(fn, "parameters", (json_t *)schema);
            json_array_append_new(converted, json_pack("{s:s, s:o}", "type", "function", "function", fn));
        }
        if (json_array_size(converted))
            r->tools = converted;
        else
            json_decref(converted);
        goto tool_choice;
    fail:
        json_decref(converted);
        return false;
    }
tool_choice:
    r->tool_choice = r->tools ? KT_TOOL_CHOICE_AUTO : KT_TOOL_CHOICE_NONE;
    r->parallel_tool_calls = true;
    const json_t *tc = json_object_get(root, "tool_choice");
    if (!present(tc))
        return true;
    static const char *const fields[] = {"type", "name", "disable_parallel_tool_use", NULL};
    const json_t *type = json_object_get(tc, "type"), *name = json_object_get(tc, "name");
    const json_t *dp = json_object_get(tc, "disable_parallel_tool_use");
    if (!want_object(tc, "tool_choice", e) || !only_fields(tc, "tool_choice", fields, e))
        return false;
    const char *t = is_str(type) ? json_string_value(type) : "";
    if (strcmp(t, "auto") == 0) {
        r->tool_choice = r->tools ? KT_TOOL_CHOICE_AUTO : KT_TOOL_CHOICE_NONE;
    } else if (strcmp(t, "none") == 0) {
        r->tool_choice = KT_TOOL_CHOICE_NONE;
    } else if (strcmp(t, "any") == 0) {
        r->tool_choice = KT_TOOL_CHOICE_REQUIRED;
    } else if (strcmp(t, "tool") == 0) {
        if (!want_string(name, "tool_choice.name", e))
            return false;
        r->tool_choice = KT_TOOL_CHOICE_NAMED;
        if (!(r->tool_choice_name = strdup(json_string_value(name)))) {
            nomem(e);
            return false;
        }
    } else {
        kt_api_error_invalid(e, "tool_choice", "tool_choice.type: Input should be 'auto', 'any', 'tool' or 'none'");
        return false;
    }
    if (present(name) && r->tool_choice != KT_TOOL_CHOICE_NAMED) {
        kt_api_error_invalid(e, "tool_choice", "tool_choice.name: Extra inputs are not permitted");
        return false;
    }
    if ((r->tool_choice == KT_TOOL_CHOICE_REQUIRED || r->tool_choice == KT_TOOL_CHOICE_NAMED) && !r->tools) {
        kt_api_error_invalid(e, "tool_choice", "tool_choice: '%s' needs tools", t);
        return false;
    }
    if (r->tool_choice == KT_TOOL_CHOICE_NAMED) {
        bool found = false;
        size_t i;
        const json_t *x;
        json_array_foreach(r->tools, i, x)
        {
            const json_t *n = json_object_get(json_object_get(x, "function"), "name");
            found = found || strcmp(json_string_value(n), r->tool_choice_name) == 0;
        }
        if (!found) {
            kt_api_error_invalid(e, "tool_choice", "tool_choice names the tool '%.64s', which is not in tools",
                                 r->tool_choice_name);
            return false;
        }
    }
    if (present(dp)) {
        if (!json_is_boolean(dp)) {
            kt_api_error_invalid(e, "tool_choice", "tool_choice.disable_parallel_tool_use: Input should be a valid "
                                                   "boolean");
            return false;
        }
        r->parallel_tool_calls = !json_is_true(dp);
    }
    return true;
}

/* ---- the request ------------------------------------------------------------------------------------------ */

static bool get_number(const json_t *root, const char *key, double lo, double hi, bool lo_open, float *out,
                       struct kt_api_error *e)
{
    const json_t *v = json_object_get(root, key);
    if (!present(v))
        return true;
    double x = json_number_value(v);
    if (!json_is_number(v) || !(x >= lo && x <= hi) || (lo_open && x == lo)) {
        kt_api_error_invalid(e, key, "%s: Input should be a number %s %g and <= %g", key, lo_open ? ">" : ">=", lo,
                             hi);
        return false;
    }
    *out = (float)x;
    return true;
}

static bool get_integer(const json_t *root, const char *key, long long lo, long long hi, long long *out,
                        struct kt_api_error *e)
{
    const json_t *v = json_object_get(root, key);
    if (!present(v))
        return true;
    if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi) {
        kt_api_error_invalid(e, key, "%s: Input should be an integer from %lld to %lld", key, lo, hi);
        return false;
    }
    *out = json_integer_value(v);
    return true;
}

static bool parse_stop_sequences(struct kt_api_request *r, const json_t *root, struct kt_api_error *e)
{
    const json_t *v = json_object_get(root, "stop_sequences");
    if (!present(v))
        return true;
    if (!json_is_array(v)) {
        kt_api_error_invalid(e, "stop_sequences", "stop_sequences: Input should be a valid list");
        return false;
    }
    if (json_array_size(v) > KT_API_MAX_STOP) {
        kt_api_error_invalid(e, "stop_sequences", "stop_sequences: kt-serve takes at most %d", KT_API_MAX_STOP);
        return false;
    }
    if (json_array_size(v) && !(r->stop = calloc(json_array_size(v), sizeof *r->stop))) {
        nomem(e);
        return false;
    }
    size_t i;
    const json_t *s;
    json_array_foreach(v, i, s)
    {
        if (!is_str(s) || json_string_length(s) > KT_API_MAX_STOP_BYTES) {
            kt_api_error_invalid(e, "stop_sequences", "stop_sequences.%zu: Input should be a string of at most %d "
                                                      "bytes", i, KT_API_MAX_STOP_BYTES);
            return false;
        }
        if (json_string_length(s) == 0)
            continue; /* matches nothing usefully */
        if (!(r->stop[r->n_stop] = strdup(json_string_value(s)))) {
            nomem(e);
            return false;
        }
        r->n_stop++;
    }
    return true;
}

/* An optional string field, read and dropped (accepted, changes nothing in kt). */
static bool optional_string(const json_t *o, const char *key, struct kt_api_error *e)
{
    const json_t *v = json_object_get(o, key);
    return !present(v) || want_string(v, key, e);
}

/* An optional string field that must be one of values (NULL-terminated); *at its index or -1. */
static bool one_of(const json_t *o, const char *key, const char *where, const char *const *values, int *at,
                   struct kt_api_error *e)
{
    const json_t *v = json_object_get(o, key);
    if (at)
        *at = -1;
    if (!present(v))
        return true;
    for (int i = 0; values[i]; i++)
        if (is_str(v) && strcmp(json_string_value(v), values[i]) == 0) {
            if (at)
                *at = i;
            return true;
        }
    char list[160] = "";
    for (int i = 0; values[i]; i++)
        snprintf(list + strlen(list), sizeof list - strlen(list), "%s'%s'", i ? ", " : "", values[i]);
    kt_api_error_invalid(e, where, "%s: Input should be one of %s", where, list);
    return false;
}

/* Fields of the current API that ask nothing kt must do differently, and the ones it cannot do. */
static bool parse_service_fields(const json_t *root, bool count_tokens, struct kt_api_error *e)
{
    static const char *const speeds[] = {"standard", "fast", NULL};
    static const char *const efforts[] = {"low", "medium", "high", "xhigh", "max", NULL};
    int speed;
    if (!check_cache_control(root, "", e) || !optional_string(root, "user_profile_id", e) ||
        !optional_string(root, "workspace_id", e) || !one_of(root, "speed", "speed", speeds, &speed, e))
        return false;
    if (speed == 1) {
        kt_api_error_invalid(e, "speed", "speed: 'fast' is not available on kt-serve (one speed: 'standard')");
        return false;
    }
    const json_t *oc = json_object_get(root, "output_config");
    if (present(oc)) {
        static const char *const fields[] = {"effort", "format", NULL};
        if (!want_object(oc, "output_config", e) || !only_fields(oc, "output_config", fields, e) ||
            !one_of(oc, "effort", "output_config.effort", efforts, NULL, e)) /* a hint the families have no knob for */
            return false;
        if (present(json_object_get(oc, "format"))) {
            kt_api_error_invalid(e, "output_config", "output_config.format: structured outputs are not supported on "
                                                     "/v1/messages by kt-serve");
            return false;
        }
    }
    if (count_tokens)
        return true;
    static const char *const tiers[] = {"auto", "standard_only", NULL};
    if (!one_of(root, "service_tier", "service_tier", tiers, NULL, e) || !optional_string(root, "inference_geo", e))
        return false;
    const json_t *md = json_object_get(root, "metadata");
    static const char *const md_fields[] = {"user_id", NULL};
    if (present(md) && (!want_object(md, "metadata", e) || !only_fields(md, "metadata", md_fields, e)))
        return false;
    const json_t *uid = json_object_get(md, "user_id");
    if (present(uid) && !want_string(uid, "metadata.user_id", e))
        return false;
    const json_t *diag = json_object_get(root, "diagnostics");
    static const char *const diag_fields[] = {"previous_message_id", NULL};
    if (present(diag) && (!want_object(diag, "diagnostics", e) || !only_fields(diag, "diagnostics", diag_fields, e)))
        return false;
    const json_t *prev = json_object_get(diag, "previous_message_id");
    return !present(prev) || want_string(prev, "diagnostics.previous_message_id", e);
}

/* thinking: enabled (budget_tokens) / adaptive / between_tools / disabled, each but the last with display. */
static bool parse_thinking(struct kt_api_request *r, const json_t *root, bool count_tokens,
                           struct kt_anthropic_options *opts, struct kt_api_error *e)
{
    const json_t *th = json_object_get(root, "thinking");
    if (!present(th))
        return true;
    static const char *const types[] = {"enabled", "adaptive", "between_tools", "disabled", NULL};
    static const char *const displays[] = {"summarized", "omitted", NULL};
    static const char *const enabled_fields[] = {"type", "budget_tokens", "display", NULL};
    static const char *const adaptive_fields[] = {"type", "display", NULL};
    static const char *const bare_fields[] = {"type", NULL};
    static const char *const wheres[] = {"thinking.enabled", "thinking.adaptive", "thinking.between_tools",
                                         "thinking.disabled"};
    int type, display;
    if (!want_object(th, "thinking", e) || !one_of(th, "type", "thinking.type", types, &type, e))
        return false;
    if (type < 0) {
        kt_api_error_invalid(e, "thinking", "thinking.type: Field required");
        return false;
    }
    const char *const *fields = type == 0 ? enabled_fields : type == 1 ? adaptive_fields : bare_fields;
    if (!only_fields(th, wheres[type], fields, e) || !one_of(th, "display", "thinking.display", displays, &display, e))
        return false;
    opts->omit_thinking = display == 1;
    if (type == 0) {
        const json_t *budget = json_object_get(th, "budget_tokens");
        if (!json_is_integer(budget) || json_integer_value(budget) < 1024) {
            kt_api_error_invalid(e, "thinking", "thinking.enabled.budget_tokens: %s",
                                 budget ? "Input should be an integer greater than or equal to 1024" : "Field required");
            return false;
        }
        if (!count_tokens && json_integer_value(budget) >= (json_int_t)r->max_tokens) {
            kt_api_error_invalid(e, "thinking", "`max_tokens` must be greater than `thinking.budget_tokens`");
            return false;
        }
        json_int_t n = json_integer_value(budget);
        r->thinking_budget = n > (json_int_t)UINT32_MAX - 1 ? UINT32_MAX - 1 : (uint32_t)n; /* the grammar enforces it */
    }
    /* adaptive and between_tools leave it to the model: its template decides, as without the field */
    r->thinking = type == 0 ? KT_CHAT_THINKING_ON : type == 3 ? KT_CHAT_THINKING_OFF : KT_CHAT_THINKING_DEFAULT;
    return true;
}

static bool parse_root(struct kt_api_request *r, const json_t *root, bool count_tokens,
                       struct kt_anthropic_options *opts, struct kt_api_error *e)
{
    static const char *const fields[] = {"model", "messages", "system", "tools", "tool_choice", "thinking",
                                         "max_tokens", "metadata", "stop_sequences", "stream", "temperature",
                                         "top_p", "top_k", "service_tier", "cache_control", "diagnostics",
                                         "inference_geo", "output_config", "speed", "user_profile_id",
                                         "workspace_id", "kt_test_forced_output", NULL};
    static const char *const count_fields[] = {"model", "messages", "system", "tools", "tool_choice", "thinking",
                                               "cache_control", "output_config", "speed", "user_profile_id",
                                               "workspace_id", NULL};
    static const char *const refused[] = {"container", "mcp_servers", "context_management"};
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++)
        if (present(json_object_get(root, refused[i]))) {
            kt_api_error_invalid(e, refused[i], "%s: not supported by kt-serve", refused[i]);
            return false;
        }
    if (!only_fields(root, "", count_tokens ? count_fields : fields, e))
        return false;
    const json_t *model = json_object_get(root, "model");
    if (!want_string(model, "model", e) || !(r->model = strdup(json_string_value(model))))
        return e->http_status ? false : (nomem(e), false);
    if (!parse_service_fields(root, count_tokens, e))
        return false;

    if (!count_tokens) {
        const json_t *mt = json_object_get(root, "max_tokens");
        if (!mt) {
            kt_api_error_invalid(e, "max_tokens", "max_tokens: Field required");
            return false;
        }
        long long v = 0;
        if (!get_integer(root, "max_tokens", 1, INT32_MAX, &v, e))
            return false;
        r->max_tokens = (uint32_t)v;
        const json_t *stream = json_object_get(root, "stream");
        if (present(stream) && !json_is_boolean(stream)) {
            kt_api_error_invalid(e, "stream", "stream: Input should be a valid boolean");
            return false;
        }
        r->stream = json_is_true(stream);
        /* the older API's sampling fields (the current one leaves sampling to the model) */
        struct kt_sampler_params *s = &r->sampling;
        if (!get_number(root, "temperature", 0, 1, false, &s->temperature, e) ||
            !get_number(root, "top_p", 0, 1, true, &s->top_p, e))
            return false;
        v = 0;
        if (!get_integer(root, "top_k", 0, INT32_MAX, &v, e))
            return false;
        s->top_k = (int32_t)v;
        if (!parse_stop_sequences(r, root, e))
            return false;
        const json_t *forced = json_object_get(root, "kt_test_forced_output");
        if (present(forced) && (!want_string(forced, "kt_test_forced_output", e) ||
                                !(r->forced_output = strdup(json_string_value(forced)))))
            return e->http_status ? false : (nomem(e), false);
    }
    if (!parse_thinking(r, root, count_tokens, opts, e) || !parse_tools(r, root, e))
        return false;

    json_t *messages = openai_messages(root, e);
    if (!messages)
        return false;
    kt_err err = {0};
    kt_status st = kt_chat_messages_from_json(messages, &r->messages, &err);
    json_decref(messages);
    if (st == KT_ERR_NOMEM) {
        nomem(e);
        return false;
    }
    if (st != KT_OK) {
        kt_api_error_invalid(e, "messages", "%s", err.msg);
        return false;
    }
    r->add_generation_prompt = true;
    return true;
}

bool kt_anthropic_request_parse(const char *body, size_t len, bool count_tokens, struct kt_api_request *out,
                                struct kt_anthropic_options *opts, struct kt_api_error *e)
{
    struct kt_anthropic_options ignored;
    if (!opts)
        opts = &ignored;
    *opts = (struct kt_anthropic_options){0};
    *out = (struct kt_api_request){.kind = KT_API_CHAT, .n = 1};
    out->sampling = kt_sampler_params_default();
    *e = (struct kt_api_error){0};
    json_t *root = kt_api_parse_json(body, len, e);
    if (!root)
        return false;
    bool ok = parse_root(out, root, count_tokens, opts, e);
    json_decref(root);
    if (!ok)
        kt_api_request_free(out);
    return ok;
}

/* ---- the response ------------------------------------------------------------------------------------------- */

enum { BLOCK_NONE, BLOCK_THINKING, BLOCK_TEXT };

/* Thinking blocks carry a signature in Anthropic's API; kt's proves nothing
 * and is ignored when it comes back. */
static const char SIGNATURE[] = "kt-serve";

bool kt_anthropic_writer_init(struct kt_anthropic_writer *a, const struct kt_api_request *r,
                              const struct kt_anthropic_options *opts)
{
    *a = (struct kt_anthropic_writer){.omit_thinking = opts && opts->omit_thinking};
    if (r->n_stop && !(a->stops = calloc(r->n_stop, sizeof *a->stops)))
        return false;
    for (size_t i = 0; i < r->n_stop; i++) {
        if (!(a->stops[i] = strdup(r->stop[i]))) {
            kt_anthropic_writer_free(a);
            return false;
        }
        a->n_stops++;
    }
    return true;
}

void kt_anthropic_writer_free(struct kt_anthropic_writer *a)
{
    for (size_t i = 0; i < a->n_stops; i++)
        free(a->stops[i]);
    free(a->stops);
    *a = (struct kt_anthropic_writer){0};
}

/* A call's input: its arguments as a JSON object (new reference); NULL when they are not one. */
static json_t *call_input(const struct kt_output_call *call)
{
    size_t len = call->arguments.len, at = 0;
    const char *s = kt_buf_str(&call->arguments);
    while (at < len && (s[at] == ' ' || s[at] == '\n' || s[at] == '\t' || s[at] == '\r'))
        at++;
    if (at == len)
        return json_object(); /* a call without arguments */
    json_t *j = json_loadb(s, len, JSON_REJECT_DUPLICATES, NULL);
    if (json_is_object(j))
        return j;
    json_decref(j);
    return NULL;
}

static bool model_ended(const struct kt_response_choice *rc)
{
    return rc->finish == KT_FINISH_STOP || rc->finish == KT_FINISH_LENGTH;
}

/* stop_reason and stop_sequence of a finished choice. */
static const char *stop_reason(const struct kt_anthropic_writer *a, const struct kt_response *w, bool tool_use,
                               const char **sequence)
{
    const struct kt_response_choice *rc = &w->ch[0];
    *sequence = NULL;
    if (rc->finish == KT_FINISH_LENGTH)
        return "max_tokens";
    if (tool_use)
        return "tool_use";
    if (rc->stop_index >= 0 && (size_t)rc->stop_index < w->job->prompt.n_stops) {
        const char *matched = w->job->prompt.stops[rc->stop_index];
        for (size_t i = 0; i < a->n_stops; i++)
            if (strcmp(a->stops[i], matched) == 0) {
                *sequence = a->stops[i];
                return "stop_sequence";
            }
    }
    return "end_turn";
}

static json_t *usage_json(const struct kt_response *w, bool with_input)
{
    json_int_t prompt = (json_int_t)w->job->prompt.n_ids, cached = (json_int_t)w->n_cached;
    json_t *u = json_object();
    if (with_input) {
        json_object_set_new(u, "input_tokens", json_integer(prompt - (cached < prompt ? cached : prompt)));
        json_object_set_new(u, "cache_creation_input_tokens", json_integer(0));
        json_object_set_new(u, "cache_read_input_tokens", json_integer(cached < prompt ? cached : prompt));
    }
    json_object_set_new(u, "output_tokens", json_integer((json_int_t)w->ch[0].n_tokens));
    return u;
}

static json_t *message_json(const struct kt_response *w, json_t *content)
{
    return json_pack("{s:s, s:s, s:s, s:s, s:o, s:n, s:n, s:o}", "id", w->id, "type", "message", "role", "assistant",
                     "model", w->model, "content", content, "stop_reason", "stop_sequence", "usage",
                     usage_json(w, true));
}

static json_t *tool_use_json(const struct kt_output_call *call, json_t *input)
{
    char *id = kt_anthropic_tool_id(call->id);
    json_t *j = json_pack("{s:s, s:s, s:o, s:o, s:{s:s}}", "type", "tool_use", "id", id ? id : "toolu_kt_", "name",
                          kt_json_text(call->name, strlen(call->name)), "input", input, "caller", "type", "direct");
    free(id);
    return j;
}

static json_t *text_block(const char *s, size_t len)
{
    return json_pack("{s:s, s:o}", "type", "text", "text", kt_json_text(s, len));
}

json_t *kt_anthropic_final(struct kt_anthropic_writer *a, struct kt_response *w, struct kt_api_error *e)
{
    if (kt_response_job_error(w, e))
        return NULL;
    struct kt_output *o = &w->ch[0].out;
    json_t *content = json_array();
    if (o->reasoning.len) {
        size_t shown = a->omit_thinking ? 0 : o->reasoning.len; /* display "omitted" */
        json_array_append_new(content, json_pack("{s:s, s:o, s:s}", "type", "thinking", "thinking",
                                                 kt_json_text(o->reasoning.bytes, shown), "signature", SIGNATURE));
    }
    if (o->content.len)
        json_array_append_new(content, text_block(o->content.bytes, o->content.len));
    bool tool_use = false;
    for (size_t i = 0; i < o->n_calls; i++) {
        json_t *input = call_input(&o->calls[i]);
        if (input) {
            json_array_append_new(content, tool_use_json(&o->calls[i], input));
            tool_use = true;
        } else {
            json_array_append_new(content, text_block(o->calls[i].arguments.bytes, o->calls[i].arguments.len));
        }
    }
    json_t *j = message_json(w, content);
    if (!j) {
        nomem(e);
        return NULL;
    }
    const char *sequence;
    json_object_set_new(j, "stop_reason", json_string(stop_reason(a, w, tool_use, &sequence)));
    json_object_set_new(j, "stop_sequence", sequence ? json_string(sequence) : json_null());
    return j;
}

/* ---- streaming ------------------------------------------------------------------------------------------------- */

static void event(struct kt_buf *out, const char *name, json_t *data)
{
    char *s = data ? json_dumps(data, JSON_COMPACT) : NULL;
    json_decref(data);
    if (!s) {
        out->out_of_memory = true;
        return;
    }
    kt_buf_printf(out, "event: %s\ndata: %s\n\n", name, s);
    free(s);
}

static void block_start(struct kt_anthropic_writer *a, struct kt_buf *out, json_t *block)
{
    event(out, "content_block_start",
          json_pack("{s:s, s:I, s:o}", "type", "content_block_start", "index", (json_int_t)a->index, "content_block",
                    block));
}

static void block_delta(struct kt_anthropic_writer *a, struct kt_buf *out, json_t *delta)
{
    event(out, "content_block_delta",
          json_pack("{s:s, s:I, s:o}", "type", "content_block_delta", "index", (json_int_t)a->index, "delta", delta));
}

static void block_stop(struct kt_anthropic_writer *a, struct kt_buf *out)
{
    event(out, "content_block_stop", json_pack("{s:s, s:I}", "type", "content_block_stop", "index",
                                               (json_int_t)a->index));
    a->index++;
}

static void close_open(struct kt_anthropic_writer *a, struct kt_buf *out)
{
    if (a->open == BLOCK_THINKING)
        block_delta(a, out, json_pack("{s:s, s:s}", "type", "signature_delta", "signature", SIGNATURE));
    if (a->open != BLOCK_NONE)
        block_stop(a, out);
    a->open = BLOCK_NONE;
}

static void open_as(struct kt_anthropic_writer *a, struct kt_buf *out, int kind)
{
    if (a->open == kind)
        return;
    close_open(a, out);
    if (kind == BLOCK_THINKING)
        block_start(a, out, json_pack("{s:s, s:s, s:s}", "type", "thinking", "thinking", "", "signature", ""));
    else
        block_start(a, out, json_pack("{s:s, s:s}", "type", "text", "text", ""));
    a->open = kind;
}

/* One whole block for a call: a tool_use with its input (true), or the text of arguments that are no object. */
static bool stream_call(struct kt_anthropic_writer *a, struct kt_buf *out, const struct kt_output_call *call)
{
    json_t *input = call_input(call);
    close_open(a, out);
    if (!input) {
        open_as(a, out, BLOCK_TEXT);
        block_delta(a, out, json_pack("{s:s, s:o}", "type", "text_delta", "text",
                                      kt_json_text(call->arguments.bytes, call->arguments.len)));
        close_open(a, out);
        return false;
    }
    char *json = json_dumps(input, JSON_COMPACT);
    json_decref(input);
    block_start(a, out, tool_use_json(call, json_object()));
    block_delta(a, out, json_pack("{s:s, s:s}", "type", "input_json_delta", "partial_json", json ? json : "{}"));
    free(json);
    block_stop(a, out);
    return true;
}

bool kt_anthropic_stream(struct kt_anthropic_writer *a, struct kt_response *w, struct kt_buf *out)
{
    if (a->ended)
        return true;
    if (!a->started) {
        json_t *m = message_json(w, json_array());
        json_object_set_new(json_object_get(m, "usage"), "output_tokens", json_integer(0));
        event(out, "message_start", json_pack("{s:s, s:o}", "type", "message_start", "message", m));
        kt_buf_puts(out, KT_ANTHROPIC_PING);
        a->started = true;
    }
    struct kt_response_choice *rc = &w->ch[0];
    struct kt_output *o = &rc->out;
    if (o->reasoning.len > o->reasoning_sent) {
        open_as(a, out, BLOCK_THINKING);
        if (!a->omit_thinking) /* display "omitted": the block and its signature, not its text */
            block_delta(a, out, json_pack("{s:s, s:o}", "type", "thinking_delta", "thinking",
                                          kt_json_text(o->reasoning.bytes + o->reasoning_sent,
                                                       o->reasoning.len - o->reasoning_sent)));
        o->reasoning_sent = o->reasoning.len;
    }
    if (o->content.len > o->content_sent) {
        open_as(a, out, BLOCK_TEXT);
        block_delta(a, out, json_pack("{s:s, s:o}", "type", "text_delta", "text",
                                      kt_json_text(o->content.bytes + o->content_sent,
                                                   o->content.len - o->content_sent)));
        o->content_sent = o->content.len;
    }
    /* a call is whole once the next began or the model ended the output */
    size_t whole = model_ended(rc) ? o->n_calls : o->n_calls ? o->n_calls - 1 : 0;
    for (; a->calls_sent < whole; a->calls_sent++)
        a->tool_use_sent = stream_call(a, out, &o->calls[a->calls_sent]) || a->tool_use_sent;
    if (!w->job_done)
        return false;
    struct kt_api_error e;
    if (kt_response_job_error(w, &e)) {
        /* the server ended it: no message_stop, so no client takes it for a whole answer */
        event(out, "error", kt_anthropic_error_json(&e));
        a->ended = true;
        return true;
    }
    close_open(a, out);
    const char *sequence;
    const char *reason = stop_reason(a, w, a->tool_use_sent, &sequence);
    event(out, "message_delta",
          json_pack("{s:s, s:{s:s, s:o}, s:o}", "type", "message_delta", "delta", "stop_reason", reason,
                    "stop_sequence", sequence ? json_string(sequence) : json_null(), "usage", usage_json(w, true)));
    event(out, "message_stop", json_pack("{s:s}", "type", "message_stop"));
    a->ended = true;
    return true;
}
