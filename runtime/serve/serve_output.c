/*
 * serve_output.c - the streaming reasoning / tool-call parser (see
 * serve_output.h).  One state machine for both families: each state looks
 * for its own set of markers with kt_text_scan, releases what precedes them
 * to the part it fills, and holds back what a marker could still complete.
 */
#include "serve_output.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum state {
    ST_START,     /* deciding whether the output opens with <think> */
    ST_REASONING,
    ST_CONTENT,
    ST_SECTION,   /* inside a tool section, between calls */
    ST_CALL_HEAD, /* Kimi: the call id; DeepSeek: the call type */
    ST_CALL_NAME, /* DeepSeek: the function name, up to the newline */
    ST_FENCE,     /* DeepSeek: the optional "```json\n" before the arguments */
    ST_ARGS,
    ST_DISCARD,   /* after the one call parallel_tool_calls=false allows */
};

static const char THINK_OPEN[] = "<think>";
static const char *const think_close[] = {"</think>"};

/* Kimi-K2 markers (one token each). */
static const char *const kimi_section_begin[] = {"<|tool_calls_section_begin|>", "<|tool_call_section_begin|>",
                                                  "<|tool_call_begin|>"};
static const char *const kimi_reasoning_end[] = {"</think>", "<|tool_calls_section_begin|>",
                                                  "<|tool_call_section_begin|>", "<|tool_call_begin|>"};
static const char *const kimi_section[] = {"<|tool_call_begin|>", "<|tool_calls_section_end|>",
                                           "<|tool_call_section_end|>"};
static const char *const kimi_head_end[] = {"<|tool_call_argument_begin|>"};
static const char *const kimi_args_end[] = {"<|tool_call_end|>", "<|tool_calls_section_end|>",
                                            "<|tool_call_section_end|>"};

/* DeepSeek-V3/R1 markers, with the drifted spellings of the section begin. */
static const char *const ds_section_begin[] = {"<｜tool▁calls▁begin｜>", "<｜tool_calls_begin｜>",
                                               "<｜tool calls begin｜>", "<｜tool\\_calls\\_begin｜>",
                                               "<｜tool▁calls｜>", "<｜tool▁call▁begin｜>"};
static const char *const ds_reasoning_end[] = {"</think>", "<｜tool▁calls▁begin｜>", "<｜tool_calls_begin｜>",
                                               "<｜tool calls begin｜>", "<｜tool\\_calls\\_begin｜>",
                                               "<｜tool▁calls｜>"};
static const char *const ds_section[] = {"<｜tool▁call▁begin｜>", "<｜tool▁calls▁end｜>"};
static const char *const ds_head_end[] = {"<｜tool▁sep｜>"};
static const char *const ds_name_end[] = {"\n"};
static const char DS_FENCE[] = "```json\n";
static const char *const ds_args_end[] = {"\n```<｜tool▁call▁end｜>", "<｜tool▁call▁end｜>",
                                          "<｜tool▁calls▁end｜>"};
#define DS_CALL_BEGIN_INDEX 5 /* ds_section_begin[5] opens a call, not a section */
#define KIMI_CALL_BEGIN_INDEX 2

#define COUNT(a) (sizeof(a) / sizeof((a)[0]))

static bool is_kimi(const struct kt_output *o)
{
    return o->params.family != KT_CHAT_FAMILY_DEEPSEEK;
}

void kt_output_init(struct kt_output *o, const struct kt_output_params *params)
{
    *o = (struct kt_output){.params = *params};
    o->state = !params->reasoning ? ST_CONTENT : params->reasoning_open ? ST_REASONING : ST_START;
}

void kt_output_free(struct kt_output *o)
{
    kt_buf_free(&o->pending);
    kt_buf_free(&o->head);
    kt_buf_free(&o->content);
    kt_buf_free(&o->reasoning);
    for (size_t i = 0; i < o->n_calls; i++) {
        free(o->calls[i].id);
        free(o->calls[i].name);
        kt_buf_free(&o->calls[i].arguments);
    }
    free(o->calls);
    *o = (struct kt_output){0};
}

static char *dup_trimmed(const char *s, size_t len)
{
    while (len && (*s == ' ' || *s == '\n' || *s == '\t' || *s == '\r'))
        s++, len--;
    while (len && (s[len - 1] == ' ' || s[len - 1] == '\n' || s[len - 1] == '\t' || s[len - 1] == '\r'))
        len--;
    char *out = malloc(len + 1);
    if (out) {
        memcpy(out, s, len);
        out[len] = '\0';
    }
    return out;
}

/* Kimi: "functions.get_weather:0" -> "get_weather". */
static char *kimi_name_of(const char *id)
{
    const char *s = strncmp(id, "functions.", 10) == 0 ? id + 10 : id;
    size_t len = strlen(s);
    const char *colon = strrchr(s, ':');
    if (colon && colon[1] && strspn(colon + 1, "0123456789") == strlen(colon + 1))
        len = (size_t)(colon - s);
    return dup_trimmed(s, len);
}

/* Starts call number n_calls with the given id (owned) and name (owned). */
static void add_call(struct kt_output *o, char *id, char *name)
{
    if (!id || !name || (o->n_calls == o->cap_calls && o->cap_calls > 64 * 1024)) {
        free(id), free(name);
        o->out_of_memory = true;
        return;
    }
    if (o->n_calls == o->cap_calls) {
        size_t cap = o->cap_calls ? 2 * o->cap_calls : 4;
        struct kt_output_call *c = realloc(o->calls, cap * sizeof *c);
        if (!c) {
            free(id), free(name);
            o->out_of_memory = true;
            return;
        }
        o->calls = c, o->cap_calls = cap;
    }
    o->calls[o->n_calls++] = (struct kt_output_call){.id = id, .name = name};
}

static struct kt_buf *args_of_last_call(struct kt_output *o)
{
    return o->n_calls ? &o->calls[o->n_calls - 1].arguments : NULL;
}

/* Appends to buffer dst (NULL: drop) and consumes n pending bytes. */
static void release(struct kt_output *o, struct kt_buf *dst, size_t n)
{
    if (dst)
        kt_buf_append(dst, o->pending.bytes, n);
    kt_buf_consume(&o->pending, n);
}

/* Where the text of a state goes. */
static struct kt_buf *sink_of(struct kt_output *o, int state)
{
    switch (state) {
    case ST_REASONING: return &o->reasoning;
    case ST_START:
    case ST_CONTENT: return &o->content;
    case ST_CALL_HEAD:
    case ST_CALL_NAME: return &o->head;
    case ST_ARGS: return args_of_last_call(o);
    default: return NULL; /* ST_SECTION, ST_FENCE, ST_DISCARD */
    }
}

/* One move of the state machine; false when it needs more text. */
static bool step(struct kt_output *o)
{
    const bool kimi = is_kimi(o);
    const char *const *markers = NULL;
    size_t n = 0;
    const char *text = kt_buf_str(&o->pending);
    size_t len = o->pending.len;

    switch (o->state) {
    case ST_START: {
        size_t k = strlen(THINK_OPEN);
        if (len < k && memcmp(text, THINK_OPEN, len) == 0)
            return false;
        if (len >= k && memcmp(text, THINK_OPEN, k) == 0) {
            release(o, NULL, k);
            o->state = ST_REASONING;
        } else {
            o->state = ST_CONTENT;
        }
        return true;
    }
    case ST_REASONING:
        if (!o->params.tools)
            markers = think_close, n = COUNT(think_close);
        else if (kimi)
            markers = kimi_reasoning_end, n = COUNT(kimi_reasoning_end);
        else
            markers = ds_reasoning_end, n = COUNT(ds_reasoning_end);
        break;
    case ST_CONTENT:
        if (!o->params.tools) {
            release(o, &o->content, len);
            return false;
        }
        markers = kimi ? kimi_section_begin : ds_section_begin;
        n = kimi ? COUNT(kimi_section_begin) : COUNT(ds_section_begin);
        break;
    case ST_SECTION:
        markers = kimi ? kimi_section : ds_section;
        n = kimi ? COUNT(kimi_section) : COUNT(ds_section);
        break;
    case ST_CALL_HEAD:
        markers = kimi ? kimi_head_end : ds_head_end;
        n = 1;
        break;
    case ST_CALL_NAME:
        markers = ds_name_end, n = 1;
        break;
    case ST_FENCE: {
        size_t k = strlen(DS_FENCE);
        if (len < k && memcmp(text, DS_FENCE, len) == 0)
            return false;
        if (len >= k && memcmp(text, DS_FENCE, k) == 0)
            release(o, NULL, k);
        o->state = ST_ARGS;
        return true;
    }
    case ST_ARGS:
        markers = kimi ? kimi_args_end : ds_args_end;
        n = kimi ? COUNT(kimi_args_end) : COUNT(ds_args_end);
        break;
    case ST_DISCARD:
    default:
        release(o, NULL, len);
        return false;
    }

    int which;
    size_t at = kt_text_scan(text, len, markers, n, &which);
    release(o, sink_of(o, o->state), at);
    if (which < 0)
        return false;
    const char *marker = markers[which];
    release(o, NULL, strlen(marker));

    switch (o->state) {
    case ST_REASONING:
        o->state = which == 0 ? ST_CONTENT : ST_SECTION;
        if (which > 0 && ((kimi && strcmp(marker, "<|tool_call_begin|>") == 0)))
            o->state = ST_CALL_HEAD;
        break;
    case ST_CONTENT:
        o->state = (kimi ? which == KIMI_CALL_BEGIN_INDEX : which == DS_CALL_BEGIN_INDEX) ? ST_CALL_HEAD
                                                                                       : ST_SECTION;
        break;
    case ST_SECTION:
        o->state = which == 0 ? ST_CALL_HEAD : ST_CONTENT;
        break;
    case ST_CALL_HEAD:
        if (kimi) {
            char *id = dup_trimmed(kt_buf_str(&o->head), o->head.len);
            add_call(o, id, id ? kimi_name_of(id) : NULL);
            o->state = ST_ARGS;
        } else {
            o->state = ST_CALL_NAME; /* the type ("function") is not kept */
        }
        kt_buf_consume(&o->head, o->head.len);
        break;
    case ST_CALL_NAME: {
        char id[96];
        snprintf(id, sizeof id, "%s%zu", o->params.id_prefix ? o->params.id_prefix : "call_", o->n_calls);
        add_call(o, strdup(id), dup_trimmed(kt_buf_str(&o->head), o->head.len));
        kt_buf_consume(&o->head, o->head.len);
        o->state = ST_FENCE;
        break;
    }
    case ST_ARGS:
        if (o->params.single_tool_call)
            o->state = ST_DISCARD;
        else
            o->state = which == 0 || (!kimi && which == 1) ? ST_SECTION : ST_CONTENT;
        break;
    }
    return true;
}

void kt_output_push(struct kt_output *o, const char *text, size_t len)
{
    kt_buf_append(&o->pending, text, len);
    while (step(o))
        ;
    if (o->pending.out_of_memory || o->content.out_of_memory || o->reasoning.out_of_memory)
        o->out_of_memory = true;
}

void kt_output_finish(struct kt_output *o)
{
    while (step(o))
        ;
    size_t len = o->pending.len;
    switch (o->state) {
    case ST_START:
    case ST_CONTENT:
    case ST_REASONING:
        release(o, sink_of(o, o->state), len);
        break;
    case ST_ARGS:
        if (!is_kimi(o)) { /* a fence cut short: "\n`" .. "\n```" */
            const char *t = kt_buf_str(&o->pending);
            while (len && (t[len - 1] == '`' || t[len - 1] == '\n'))
                len--;
        }
        release(o, args_of_last_call(o), len);
        break;
    default:
        break; /* a call cut off before its arguments is dropped */
    }
    kt_buf_consume(&o->pending, o->pending.len);
    kt_buf_consume(&o->head, o->head.len);
}
