/*
 * serve_prompt.c - from a checked request to prompt tokens, budget, stop
 * strings and output parsing (see serve_prompt.h for what kt adds around
 * the templates).  It reads the tokenizer and never the model's weights.
 */
#include "serve_prompt.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve_grammar.h"
#include "serve_text.h"

kt_chat_traits kt_serve_traits(const struct kt_serve_model *m)
{
    return kt_chat_traits_of(m->format, m->chat_template, m->tok);
}

static bool ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && memcmp(s + n - k, suffix, k) == 0;
}

static void nomem(struct kt_api_error *e)
{
    kt_api_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
}

/* ---- rendering ----------------------------------------------------------------------- */

/* DeepSeek's templates declare no tools: describe them, and the call format
 * the model was trained on, in the system prompt. */
static char *deepseek_tools_system(const char *system, const json_t *tools)
{
    struct kt_buf b = {0};
    char *decl = json_dumps(tools, 0);
    if (system && *system) {
        kt_buf_puts(&b, system);
        kt_buf_puts(&b, "\n\n");
    }
    kt_buf_puts(&b, "You can call the following functions. To call one or more, reply with:\n"
                    "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>FUNCTION_NAME\n"
                    "```json\nARGUMENTS_AS_JSON\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>\n\nFunctions:\n");
    kt_buf_puts(&b, decl);
    free(decl);
    if (!decl || b.out_of_memory) {
        kt_buf_free(&b);
        return NULL;
    }
    return b.bytes;
}

/* A special token's text, malloc'd; NULL without one (or without memory: the template then sees none). */
static char *special_text(const struct kt_tokenizer *tok, int32_t id)
{
    size_t len = 0;
    const char *s = id >= 0 ? kt_token_bytes(tok, id, &len) : NULL;
    return s ? strndup(s, len) : NULL;
}

bool kt_prompt_render_chat(const struct kt_serve_model *m, const struct kt_api_request *r, char **text,
                           struct kt_api_error *e)
{
    *text = NULL;
    if (m->format == KT_CHAT_FORMAT_UNKNOWN) {
        kt_api_error_invalid(e, "messages", "this model has no chat template kt can render; use /v1/completions");
        return false;
    }
    const kt_chat_message *msgs = r->messages.items;
    size_t n = r->messages.count;
    kt_chat_message *patched = NULL;
    char *system = NULL;
    kt_chat_options opts = {.add_generation_prompt = r->add_generation_prompt, .thinking = r->thinking};
    kt_chat_traits traits = kt_serve_traits(m);
    if (r->tools && r->tool_choice != KT_TOOL_CHOICE_NONE && !traits.renders_tools &&
        traits.family == KT_CHAT_FAMILY_DEEPSEEK) {
        bool has_system = n > 0 && msgs[0].role == KT_CHAT_SYSTEM;
        patched = calloc(n + 1, sizeof *patched);
        system = deepseek_tools_system(has_system ? msgs[0].content : NULL, r->tools);
        if (!patched || !system) {
            free(patched), free(system);
            nomem(e);
            return false;
        }
        patched[0] = (kt_chat_message){.role = KT_CHAT_SYSTEM, .content = system};
        memcpy(patched + 1, msgs + has_system, (n - has_system) * sizeof *patched);
        msgs = patched;
        n = n + 1 - has_system;
    } else if (r->tool_choice != KT_TOOL_CHOICE_NONE) {
        opts.tools = r->tools;
    }
    char *bos = NULL, *eos = NULL;
    if (m->format == KT_CHAT_JINJA) { /* the template sees the tokenizer's texts, as in HF */
        opts.template_text = m->chat_template;
        if (m->tok) {
            opts.bos_token = bos = special_text(m->tok, kt_tokenizer_bos(m->tok));
            opts.eos_token = eos = special_text(m->tok, kt_tokenizer_eos(m->tok));
        }
    }
    kt_err err = {0};
    kt_status st = kt_chat_render(m->format, msgs, n, &opts, text, &err);
    free(patched);
    free(system);
    free(bos);
    free(eos);
    if (st == KT_ERR_NOMEM) {
        nomem(e);
        return false;
    }
    if (st != KT_OK) {
        kt_api_error_invalid(e, "messages", "%s", err.msg);
        return false;
    }
    return true;
}

/* Calls made earlier in the conversation: Kimi numbers its call ids globally. */
static size_t earlier_tool_calls(const struct kt_api_request *r)
{
    size_t n = 0;
    for (size_t i = 0; i < r->messages.count; i++)
        n += r->messages.items[i].n_tool_calls;
    return n;
}

/* The opening of a call that tool_choice required / named forces; NULL otherwise. */
static bool tool_prefill(const struct kt_serve_model *m, const struct kt_api_request *r, struct kt_buf *b)
{
    if (r->tool_choice != KT_TOOL_CHOICE_REQUIRED && r->tool_choice != KT_TOOL_CHOICE_NAMED)
        return false;
    bool named = r->tool_choice == KT_TOOL_CHOICE_NAMED;
    if (kt_serve_traits(m).family == KT_CHAT_FAMILY_DEEPSEEK) {
        kt_buf_puts(b, "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>");
        if (named)
            kt_buf_printf(b, "%s\n```json\n", r->tool_choice_name);
    } else {
        kt_buf_puts(b, "<|tool_calls_section_begin|><|tool_call_begin|>functions.");
        if (named)
            kt_buf_printf(b, "%s:%zu<|tool_call_argument_begin|>", r->tool_choice_name, earlier_tool_calls(r));
    }
    return true;
}

/* Thinking on/off around the generation prompt, and how to parse reasoning. */
static void apply_thinking(const struct kt_serve_model *m, const struct kt_api_request *r, struct kt_buf *text,
                           struct kt_output_params *op)
{
    bool off = r->thinking == KT_CHAT_THINKING_OFF;
    bool at_generation = r->add_generation_prompt && r->messages.count > 0 &&
                         r->messages.items[r->messages.count - 1].role != KT_CHAT_TOOL &&
                         r->messages.items[r->messages.count - 1].role != KT_CHAT_ASSISTANT;
    op->reasoning = !off;
    if (m->format == KT_CHAT_JINJA) {
        /* a template kt does not know: its prompt may open the block, as R1's later revision does */
        kt_chat_traits traits = kt_serve_traits(m);
        if (!traits.thinks)
            return;
        const char *s = kt_buf_str(text);
        if (ends_with(s, "<think>\n") || ends_with(s, "<think>")) {
            if (off)
                kt_buf_puts(text, "</think>");
            else
                op->reasoning_open = true;
        } else if (off && at_generation) {
            kt_buf_puts(text, traits.family == KT_CHAT_FAMILY_DEEPSEEK ? "<think>\n\n</think>\n\n" : "<think></think>");
        }
        return;
    }
    switch (m->format) {
    case KT_CHAT_KIMI_K2_THINKING:
        if (off && at_generation)
            kt_buf_puts(text, "<think></think>");
        op->reasoning = true; /* harmless when it was closed in the prompt */
        break;
    case KT_CHAT_DEEPSEEK_R1_THINK:
        if (ends_with(kt_buf_str(text), "<think>\n")) {
            if (off)
                kt_buf_puts(text, "</think>");
            else
                op->reasoning_open = true;
        }
        break;
    case KT_CHAT_DEEPSEEK_R1:
        if (off && at_generation)
            kt_buf_puts(text, "<think>\n\n</think>\n\n");
        break;
    default:
        break;
    }
}

/* ---- tokens ------------------------------------------------------------------------------ */

static bool add_stop(struct kt_prompt *p, const char *s, struct kt_api_error *e)
{
    for (size_t i = 0; i < p->n_stops; i++)
        if (strcmp(p->stops[i], s) == 0)
            return true;
    char **grown = realloc(p->stops, (p->n_stops + 1) * sizeof *grown);
    if (!grown || !(grown[p->n_stops] = strdup(s))) {
        if (grown)
            p->stops = grown;
        nomem(e);
        return false;
    }
    p->stops = grown;
    p->n_stops++;
    return true;
}

static bool tokenize(const struct kt_serve_model *m, const char *text, bool add_special, int32_t **ids, size_t *n,
                     struct kt_api_error *e)
{
    kt_err err = {0};
    if (kt_tokenize(m->tok, text, strlen(text), add_special, true, ids, n, &err) != KT_OK) {
        kt_api_error_set(e, 500, "server_error", NULL, NULL, "tokenizing: %s", err.msg);
        return false;
    }
    return true;
}

bool kt_prompt_prepare(const struct kt_serve_model *m, const struct kt_api_request *r, const char *request_id,
                       struct kt_prompt *out, struct kt_api_error *e)
{
    return kt_prompt_prepare_at(m, r, 0, request_id, out, e);
}

bool kt_prompt_prepare_at(const struct kt_serve_model *m, const struct kt_api_request *r, size_t prompt_index,
                          const char *request_id, struct kt_prompt *out, struct kt_api_error *e)
{
    *out = (struct kt_prompt){0};
    struct kt_buf text = {0};
    bool ok = false;

    for (size_t i = 0; i < r->sampling.n_logit_bias; i++)
        if ((uint32_t)r->sampling.logit_bias[i].token >= m->n_vocab) {
            kt_api_error_invalid(e, "logit_bias", "logit_bias token %d is outside the vocabulary of %u",
                                 r->sampling.logit_bias[i].token, m->n_vocab);
            return false;
        }

    if (r->kind == KT_API_CHAT) {
        char *rendered = NULL;
        if (!kt_prompt_render_chat(m, r, &rendered, e))
            goto done;
        kt_buf_puts(&text, rendered);
        free(rendered);
        out->parse_output = true;
        out->special = true;
        kt_chat_traits traits = kt_serve_traits(m);
        if (r->tools && (r->tool_choice == KT_TOOL_CHOICE_REQUIRED || r->tool_choice == KT_TOOL_CHOICE_NAMED) &&
            traits.family == KT_CHAT_FAMILY_UNKNOWN) {
            kt_api_error_invalid(e, "tool_choice",
                                 "this model's chat template writes no tool-call syntax kt knows (Kimi-K2's or "
                                 "DeepSeek-V3/R1's), so a call cannot be forced; use tool_choice \"auto\" or \"none\"");
            goto done;
        }
        out->output.family = traits.family;
        out->output.tools = r->tool_choice != KT_TOOL_CHOICE_NONE && traits.family != KT_CHAT_FAMILY_UNKNOWN;
        out->output.single_tool_call = !r->parallel_tool_calls;
        apply_thinking(m, r, &text, &out->output);
        struct kt_buf prefill = {0};
        if (tool_prefill(m, r, &prefill)) {
            kt_buf_append(&text, prefill.bytes, prefill.len);
            out->prefill = prefill.bytes;
            if (prefill.out_of_memory || !out->prefill) {
                kt_buf_free(&prefill);
                out->prefill = NULL;
                nomem(e);
                goto done;
            }
        }
        char idp[80];
        snprintf(idp, sizeof idp, "call_%.48s_", request_id ? request_id : "0");
        if (!(out->id_prefix = strdup(idp))) {
            nomem(e);
            goto done;
        }
        out->output.id_prefix = out->id_prefix;
        size_t n_family;
        const char *const *family = kt_chat_family_stop_strings(traits.family, &n_family);
        if (r->ignore_eos)
            n_family = 0; /* their tokens are end-of-generation ones, ignored too */
        for (size_t i = 0; i < n_family; i++)
            if (!add_stop(out, family[i], e))
                goto done;
        if (text.out_of_memory) {
            nomem(e);
            goto done;
        }
        /* The render carries BOS itself where the family has one (as the published templates do). */
        if (!tokenize(m, kt_buf_str(&text), false, &out->ids, &out->n_ids, e))
            goto done;
    } else if (prompt_index >= r->n_prompts) {
        kt_api_error_set(e, 500, "server_error", NULL, NULL, "no prompt %zu in the request", prompt_index);
        goto done;
    } else if (r->prompts[prompt_index].text) {
        const char *ptext = r->prompts[prompt_index].text;
        if (!tokenize(m, ptext, true, &out->ids, &out->n_ids, e))
            goto done;
        if (r->echo && !(out->echo = strdup(ptext))) {
            nomem(e);
            goto done;
        }
    } else {
        const struct kt_api_prompt *q = &r->prompts[prompt_index];
        for (size_t i = 0; i < q->n_ids; i++)
            if ((uint32_t)q->ids[i] >= m->n_vocab) {
                kt_api_error_invalid(e, "prompt", "%s[%zu]: token id %d is outside the vocabulary (ids 0 to %u)",
                                     q->where, i, q->ids[i], m->n_vocab - 1);
                goto done;
            }
        out->ids = malloc((q->n_ids ? q->n_ids : 1) * sizeof *out->ids);
        if (!out->ids) {
            nomem(e);
            goto done;
        }
        memcpy(out->ids, q->ids, q->n_ids * sizeof *out->ids);
        out->n_ids = q->n_ids;
        if (r->echo) {
            kt_err err = {0};
            size_t len;
            if (kt_detokenize(m->tok, out->ids, out->n_ids, false, &out->echo, &len, &err) != KT_OK) {
                nomem(e);
                goto done;
            }
        }
    }
    for (size_t i = 0; i < r->n_stop; i++)
        if (!add_stop(out, r->stop[i], e))
            goto done;

    /* a prompt of a list is named in messages ("prompt[3]: ...") */
    char which[40] = "";
    if (r->kind == KT_API_COMPLETION && r->n_prompts > 1)
        snprintf(which, sizeof which, "%s: ", r->prompts[prompt_index].where);
    if (out->n_ids == 0) {
        kt_api_error_invalid(e, r->kind == KT_API_CHAT ? "messages" : "prompt", "%sthe prompt has no tokens", which);
        goto done;
    }
    /* a prompt only scored (max_tokens 0) may fill the context; one that generates leaves room for a token */
    if (out->n_ids + !r->no_generation > m->n_ctx || (r->max_tokens && out->n_ids + r->max_tokens > m->n_ctx)) {
        kt_api_error_set(e, 400, "invalid_request_error", "context_length_exceeded",
                         r->kind == KT_API_CHAT ? "messages" : "prompt",
                         "%sThis model's maximum context length is %u tokens. However, you requested %zu tokens "
                         "(%zu in the prompt, %u for the completion). Please reduce the length of the prompt "
                         "or of max_tokens.",
                         which, m->n_ctx, out->n_ids + r->max_tokens, out->n_ids, r->max_tokens);
        goto done;
    }
    if (m->kv_positions && out->n_ids >= m->kv_positions) {
        kt_api_error_set(e, 413, "invalid_request_error", "kv_cache_exceeded",
                         r->kind == KT_API_CHAT ? "messages" : "prompt",
                         "The prompt has %zu tokens, but the server's whole KV cache holds %u positions, so it can "
                         "never run. Please shorten the prompt (or start the server with more KV memory).",
                         out->n_ids, m->kv_positions);
        goto done;
    }
    out->max_tokens = r->no_generation ? 0 : r->max_tokens ? r->max_tokens : (uint32_t)(m->n_ctx - out->n_ids);
    if (!kt_serve_grammar_build(m, r, &out->output, &out->grammar, e))
        goto done;

    if (r->forced_output && m->allow_forced_output) {
        kt_err err = {0};
        if (kt_tokenize(m->tok, r->forced_output, strlen(r->forced_output), false, true, &out->forced,
                        &out->n_forced, &err) != KT_OK) {
            nomem(e);
            goto done;
        }
    }
    ok = true;
done:
    kt_buf_free(&text);
    if (!ok)
        kt_prompt_free(out);
    return ok;
}

void kt_prompt_free(struct kt_prompt *p)
{
    free(p->ids);
    for (size_t i = 0; i < p->n_stops; i++)
        free(p->stops[i]);
    free(p->stops);
    free(p->prefill);
    free(p->id_prefix);
    free(p->forced);
    free(p->echo);
    kt_grammar_destroy(p->grammar);
    *p = (struct kt_prompt){0};
}

kt_chat_format kt_serve_chat_template(const struct kt_gguf *g, const char *template_text, char **text, char *why,
                                      size_t why_size)
{
    kt_err err = {0};
    kt_chat_format format = KT_CHAT_FORMAT_UNKNOWN;
    if (text)
        *text = NULL;
    char *copy = NULL;
    if (template_text) {
        copy = strdup(template_text);
    } else {
        struct kt_gguf_str tmpl;
        if (kt_gguf_get_str(g, "tokenizer.chat_template", &tmpl, &err) != KT_OK) {
            snprintf(why, why_size, "the model has no chat template");
            return format;
        }
        copy = strndup(tmpl.ptr, tmpl.len);
    }
    if (!copy) {
        snprintf(why, why_size, "out of memory");
        return format;
    }
    if (kt_chat_format_resolve(copy, &format, &err) != KT_OK) {
        snprintf(why, why_size, "%.300s", err.msg);
        format = KT_CHAT_FORMAT_UNKNOWN;
    } else if (format == KT_CHAT_JINJA && !text) {
        snprintf(why, why_size, "the chat template is none of the revisions kt renders natively");
        format = KT_CHAT_FORMAT_UNKNOWN;
    }
    if (text && format != KT_CHAT_FORMAT_UNKNOWN)
        *text = copy;
    else
        free(copy);
    return format;
}

kt_chat_format kt_serve_chat_format(const struct kt_gguf *g, char *why, size_t why_size)
{
    return kt_serve_chat_template(g, NULL, NULL, why, why_size);
}
