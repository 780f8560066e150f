/*
 * prompts.c - prompt files (see prompts.h).
 */
#include "prompts.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

#include "model_chat.h"

void kt_tool_prompts_free(struct kt_tool_prompts *s)
{
    for (size_t i = 0; i < s->n; i++) {
        kt_chat_messages_free(&s->items[i].messages);
        free(s->items[i].ids);
    }
    free(s->items);
    *s = (struct kt_tool_prompts){0};
}

/* Appends msgs (taking them) to s; frees them on failure. */
static kt_status append(struct kt_tool_prompts *s, kt_chat_messages *msgs, unsigned line, kt_err *err)
{
    if (s->n == s->cap) {
        size_t ncap = s->cap ? 2 * s->cap : 64;
        struct kt_tool_prompt *p = realloc(s->items, ncap * sizeof *p);
        if (!p) {
            kt_chat_messages_free(msgs);
            return kt_err_set(err, KT_ERR_NOMEM, "out of memory reading prompts");
        }
        s->items = p, s->cap = ncap;
    }
    s->items[s->n++] = (struct kt_tool_prompt){.messages = *msgs, .line = line};
    return KT_OK;
}

/* A plain text line: one user message owning a copy of the text. */
static kt_status text_message(const char *text, size_t len, kt_chat_messages *out, kt_err *err)
{
    json_t *arr = json_pack("[{s:s, s:s%}]", "role", "user", "content", text, len);
    if (!arr)
        return kt_err_set(err, KT_ERR_FORMAT, "not valid UTF-8 text");
    kt_status st = kt_chat_messages_from_json(arr, out, err);
    json_decref(arr);
    return st;
}

kt_status kt_tool_prompts_add_text(struct kt_tool_prompts *s, const char *text, kt_err *err)
{
    kt_chat_messages msgs = {0};
    kt_status st = text_message(text, strlen(text), &msgs, err);
    return st != KT_OK ? st : append(s, &msgs, (unsigned)s->n + 1, err);
}

kt_status kt_tool_prompts_read(const char *path, struct kt_tool_prompts *s, kt_err *err)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return kt_err_set(err, KT_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    const size_t before = s->n;
    kt_status st = KT_OK;
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    for (unsigned no = 1; st == KT_OK && (len = getline(&line, &cap, f)) >= 0; no++) {
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r'))
            line[--len] = 0;
        size_t lead = strspn(line, " \t");
        if ((size_t)len == lead)
            continue; /* blank */
        if (strlen(line) != (size_t)len) {
            st = kt_err_set(err, KT_ERR_FORMAT, "%s:%u: a NUL byte in the line", path, no);
            break;
        }
        kt_chat_messages msgs = {0};
        if (line[lead] == '{' || line[lead] == '[') {
            json_error_t jerr;
            json_t *j = json_loadb(line, (size_t)len, JSON_REJECT_DUPLICATES, &jerr);
            json_t *arr = json_is_array(j) ? j : json_object_get(j, "messages");
            if (!j)
                st = kt_err_set(err, KT_ERR_FORMAT, "%s:%u:%d: bad JSON: %s", path, no, jerr.column, jerr.text);
            else if (!json_is_array(arr) || json_array_size(arr) == 0)
                st = kt_err_set(err, KT_ERR_FORMAT,
                                "%s:%u: expected {\"messages\": [...]} or an array of chat messages, not empty", path,
                                no);
            else if ((st = kt_chat_messages_from_json(arr, &msgs, err)) != KT_OK)
                kt_err_prefix(err, "%s:%u", path, no);
            json_decref(j);
        } else if ((st = text_message(line, (size_t)len, &msgs, err)) != KT_OK) {
            kt_err_prefix(err, "%s:%u", path, no);
        }
        if (st == KT_OK && (st = append(s, &msgs, no, err)) != KT_OK)
            kt_err_prefix(err, "%s", path);
    }
    if (st == KT_OK && ferror(f))
        st = kt_err_set(err, KT_ERR_IO, "%s: cannot read: %s", path, strerror(errno));
    if (st == KT_OK && s->n == before)
        st = kt_err_set(err, KT_ERR_FORMAT, "%s: no prompts (one per line: text, or JSON chat messages)", path);
    free(line);
    fclose(f);
    return st;
}

kt_status kt_tool_prompts_tokenize(const struct kt_model *m, const struct kt_tokenizer *tok, const char *source,
                                   struct kt_tool_prompts *s, kt_err *err)
{
    kt_chat_format format;
    char *tmpl = NULL;
    kt_status st = kt_tool_chat_template(m, NULL, "the prompts are chat messages, but the model has no chat template",
                                         &format, &tmpl, err);
    if (st == KT_OK)
        st = kt_tool_prompts_tokenize_with(format, tmpl, tok, source, s, err);
    free(tmpl);
    return st;
}

kt_status kt_tool_prompts_tokenize_with(kt_chat_format format, const char *tmpl, const struct kt_tokenizer *tok,
                                        const char *source, struct kt_tool_prompts *s, kt_err *err)
{
    char *bos = NULL, *eos = NULL;
    kt_status st = KT_OK;
    if (format == KT_CHAT_JINJA)
        kt_tool_chat_special_texts(tok, &bos, &eos);
    for (size_t i = 0; st == KT_OK && i < s->n; i++) {
        struct kt_tool_prompt *p = &s->items[i];
        char *text = NULL;
        kt_chat_options opts = {.add_generation_prompt = true, .bos_token = bos, .eos_token = eos,
                                .template_text = tmpl};
        /* the render carries BOS itself where the family has one */
        if ((st = kt_chat_render(format, p->messages.items, p->messages.count, &opts, &text, err)) == KT_OK)
            st = kt_tokenize(tok, text, strlen(text), false, true, &p->ids, &p->n_ids, err);
        free(text);
        if (st != KT_OK)
            kt_err_prefix(err, "%s:%u", source, p->line);
        else if (p->n_ids == 0)
            st = kt_err_set(err, KT_ERR_INVALID, "%s:%u: the prompt has no tokens", source, p->line);
    }
    free(bos), free(eos);
    return st;
}
