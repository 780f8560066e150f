/*
 * sse_check.c - the stream checker (see sse_check.h).
 */
#include "sse_check.h"

#include <stdio.h>
#include <string.h>

#include <jansson.h>

void kt_sse_check_init(struct kt_sse_check *c)
{
    memset(c, 0, sizeof *c);
    c->completion_tokens = c->prompt_tokens = c->cached_tokens = -1;
}

void kt_sse_check_free(struct kt_sse_check *c)
{
    kt_buf_free(&c->pending);
    for (size_t k = 0; k < KT_SSE_MAX_CHOICES; k++)
        kt_buf_free(&c->choices[k].content);
}

static void fail(struct kt_sse_check *c, const char *what, const char *data)
{
    if (!c->error[0])
        snprintf(c->error, sizeof c->error, "event %zu: %s: %.80s", c->events, what, data ? data : "");
}

/* One choice of a chunk; returns true when it carried a token. */
static bool check_choice(struct kt_sse_check *c, const json_t *ch, const char *data)
{
    const json_t *index = json_object_get(ch, "index");
    const json_t *delta = json_object_get(ch, "delta");
    const json_t *finish = json_object_get(ch, "finish_reason");
    if (!json_is_integer(index) || json_integer_value(index) < 0 || json_integer_value(index) >= KT_SSE_MAX_CHOICES) {
        fail(c, "a choice without a valid index", data);
        return false;
    }
    size_t k = (size_t)json_integer_value(index);
    struct kt_sse_choice *choice = &c->choices[k];
    if (k >= c->n_choices)
        c->n_choices = k + 1;
    if (!json_is_object(delta)) {
        fail(c, "a choice without a delta", data);
        return false;
    }
    if (!choice->role_seen) {
        const json_t *role = json_object_get(delta, "role");
        if (!json_is_string(role) || strcmp(json_string_value(role), "assistant") != 0)
            fail(c, "a choice's first chunk has no assistant role", data);
        choice->role_seen = true;
        return false;
    }
    if (choice->finished)
        fail(c, "a chunk of a choice after its finish", data);
    if (json_is_string(finish)) {
        choice->finished = true;
        snprintf(choice->finish_reason, sizeof choice->finish_reason, "%s", json_string_value(finish));
    } else if (!json_is_null(finish)) {
        fail(c, "finish_reason is neither null nor a string", data);
    }
    const json_t *content = json_object_get(delta, "content");
    if (json_is_string(content))
        kt_buf_append(&choice->content, json_string_value(content), json_string_length(content));
    size_t i;
    const json_t *call;
    json_array_foreach(json_object_get(delta, "tool_calls"), i, call)
    {
        if (json_is_string(json_object_get(call, "id")))
            choice->tool_calls++;
    }
    return json_object_size(delta) > 0;
}

/* One "data:" payload; returns true when it carried a token. */
static bool check_data(struct kt_sse_check *c, const char *data)
{
    if (c->done) {
        fail(c, "data after [DONE]", data);
        return false;
    }
    if (strcmp(data, "[DONE]") == 0) {
        c->done = true;
        return false;
    }
    json_error_t je;
    json_t *j = json_loads(data, JSON_ALLOW_NUL, &je); /* "\u0000" is valid JSON: a byte token can decode to NUL */
    if (!json_is_object(j)) {
        char why[400];
        const size_t len = strlen(data);
        snprintf(why, sizeof why, "not a JSON object (%s at %d; ends \"%s\")", je.text, je.position,
                 data + (len > 80 ? len - 80 : 0));
        fail(c, why, data);
        json_decref(j);
        return false;
    }
    bool token = false;
    const json_t *err = json_object_get(j, "error");
    const json_t *id = json_object_get(j, "id");
    const json_t *choices = json_object_get(j, "choices");
    const json_t *usage = json_object_get(j, "usage");
    const char *object = json_string_value(json_object_get(j, "object"));
    if (err) {
        fail(c, "error event", data);
    } else if (!json_is_string(id) || !json_is_array(choices) || !object ||
               strcmp(object, "chat.completion.chunk") != 0) {
        fail(c, "not a chat.completion.chunk", data);
    } else {
        if (!c->id[0])
            snprintf(c->id, sizeof c->id, "%s", json_string_value(id));
        else if (strcmp(c->id, json_string_value(id)) != 0)
            fail(c, "the id changed", data);
        if (c->usage_seen)
            fail(c, "a chunk after the usage", data);
        if (json_array_size(choices) == 0) {
            if (!json_is_object(usage))
                fail(c, "a chunk without choices or usage", data);
            for (size_t k = 0; k < c->n_choices; k++)
                if (!c->choices[k].finished)
                    fail(c, "the usage before every choice finished", data);
            c->usage_seen = true;
            c->completion_tokens = json_integer_value(json_object_get(usage, "completion_tokens"));
            c->prompt_tokens = json_integer_value(json_object_get(usage, "prompt_tokens"));
            c->cached_tokens =
                json_integer_value(json_object_get(json_object_get(usage, "prompt_tokens_details"), "cached_tokens"));
        }
        size_t i;
        const json_t *ch;
        json_array_foreach(choices, i, ch) token |= check_choice(c, ch, data);
    }
    json_decref(j);
    return token;
}

size_t kt_sse_check_feed(struct kt_sse_check *c, const char *bytes, size_t len)
{
    size_t tokens = 0;
    kt_buf_append(&c->pending, bytes, len);
    for (;;) {
        char *end = memmem(kt_buf_str(&c->pending), c->pending.len, "\n\n", 2);
        if (!end)
            return tokens;
        size_t n = (size_t)(end - c->pending.bytes);
        *end = 0;
        c->events++;
        if (c->pending.bytes[0] == ':')
            c->pings++;
        else if (strncmp(c->pending.bytes, "data: ", 6) == 0) {
            if (memchr(c->pending.bytes, '\n', n))
                fail(c, "a multi-line event", c->pending.bytes);
            else if (check_data(c, c->pending.bytes + 6))
                tokens++, c->content_events++;
        } else {
            fail(c, "neither a data line nor a comment", c->pending.bytes);
        }
        kt_buf_consume(&c->pending, n + 2);
    }
}

bool kt_sse_check_finish(struct kt_sse_check *c, bool want_usage)
{
    if (c->pending.len)
        fail(c, "bytes after the last event", c->pending.bytes);
    if (!c->done)
        fail(c, "no [DONE]", NULL);
    if (c->n_choices == 0)
        fail(c, "no choice", NULL);
    for (size_t k = 0; k < c->n_choices; k++) {
        char why[64];
        snprintf(why, sizeof why, "choice %zu %s", k,
                 c->choices[k].role_seen ? "has no finish_reason" : "never opened");
        if (!c->choices[k].finished)
            fail(c, why, NULL);
    }
    if (want_usage && !c->usage_seen)
        fail(c, "no usage chunk", NULL);
    return c->error[0] == 0;
}
