/*
 * serve_grammar.c - a request's output grammar (see serve_grammar.h).
 */
#include "serve_grammar.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json_schema.h"

#define MAX_PARALLEL_CALLS 16

struct build {
    struct kt_grammar *g;
    const struct kt_tokenizer *tok;
    kt_err err;
    kt_status st;
};

/* Each helper does nothing once a step failed, so a sequence of them reads
 * as the syntax it builds. */
static uint32_t lit(struct build *b, const char *text)
{
    uint32_t n = 0;
    if (b->st == KT_OK)
        b->st = kt_grammar_literal(b->g, text, strlen(text), &n, &b->err);
    return n;
}

/* A marker: its special token when the vocabulary has one, else its text. */
static uint32_t marker(struct build *b, const char *text)
{
    uint32_t n = 0;
    int32_t id = kt_token_find(b->tok, text, strlen(text));
    if (id >= 0 && kt_token_type(b->tok, id) != KT_TOK_NORMAL && kt_token_type(b->tok, id) != KT_TOK_BYTE) {
        if (b->st == KT_OK)
            b->st = kt_grammar_token(b->g, id, &n, &b->err);
        return n;
    }
    return lit(b, text);
}

static uint32_t seq(struct build *b, const uint32_t *items, size_t n_items)
{
    uint32_t n = 0;
    if (b->st == KT_OK)
        b->st = kt_grammar_seq(b->g, items, n_items, &n, &b->err);
    return n;
}

/* One of the strings, as raw text. */
static void choices(struct build *b, const json_t *list, uint32_t *node)
{
    size_t n = json_array_size(list);
    const char **texts = calloc(n, sizeof *texts);
    size_t *lens = calloc(n, sizeof *lens);
    if (!texts || !lens) {
        b->st = KT_ERR_NOMEM;
    } else {
        for (size_t i = 0; i < n; i++) {
            texts[i] = json_string_value(json_array_get(list, i));
            lens[i] = json_string_length(json_array_get(list, i));
        }
        b->st = kt_grammar_literals(b->g, texts, lens, n, node, &b->err);
    }
    free(texts);
    free(lens);
}

static const json_t *tool_function(const json_t *tool)
{
    return json_object_get(tool, "function");
}

static const char *tool_name(const json_t *tool)
{
    return json_string_value(json_object_get(tool_function(tool), "name"));
}

/* The arguments' grammar: the parameters schema, or any object without one. */
static bool arguments(struct build *b, const json_t *tool, size_t index, uint32_t *node, struct kt_api_error *e)
{
    if (b->st != KT_OK)
        return false;
    const json_t *params = json_object_get(tool_function(tool), "parameters");
    kt_err err = {0};
    kt_status st = params && !json_is_null(params) ? kt_json_schema_compile(b->g, params, node, &err)
                                                   : kt_json_any_object(b->g, node, &err);
    if (st == KT_OK)
        return true;
    char param[64];
    snprintf(param, sizeof param, "tools[%zu]", index);
    if (st == KT_ERR_NOMEM)
        kt_api_error_set(e, 500, "server_error", NULL, param, "out of memory");
    else
        kt_api_error_invalid(e, param, "tool_choice forces a call of '%.64s', but kt cannot follow its parameters: "
                                       "tools[%zu].function.parameters at %s", tool_name(tool), index, err.msg);
    b->st = st;
    return false;
}

/* One call after the family's opening, from the name on, of any tool
 * (args[i]: tool i's arguments): DeepSeek NAME "\n```json\n" ARGS "\n```"
 * <call_end>; Kimi NAME ":" INDEX <arg_begin> ARGS <call_end>, INDEX the
 * call's number in the conversation (Kimi numbers call ids globally). */
static uint32_t any_call(struct build *b, bool deepseek, const json_t *tools, const uint32_t *args, size_t index)
{
    size_t n = json_array_size(tools);
    uint32_t *alts = calloc(n, sizeof *alts), node = 0;
    if (!alts) {
        b->st = KT_ERR_NOMEM;
        return 0;
    }
    for (size_t i = 0; i < n && b->st == KT_OK; i++) {
        const char *name = tool_name(json_array_get(tools, i));
        char *head = malloc(strlen(name) + 32);
        if (!head) {
            b->st = KT_ERR_NOMEM;
            break;
        }
        if (deepseek)
            sprintf(head, "%s\n```json\n", name);
        else
            sprintf(head, "%s:%zu", name, index);
        uint32_t h = lit(b, head);
        free(head);
        if (deepseek) {
            uint32_t items[] = {h, args[i], lit(b, "\n```"), marker(b, "<｜tool▁call▁end｜>")};
            alts[i] = seq(b, items, 4);
        } else {
            uint32_t items[] = {h, marker(b, "<|tool_call_argument_begin|>"), args[i], marker(b, "<|tool_call_end|>")};
            alts[i] = seq(b, items, 4);
        }
    }
    if (b->st == KT_OK)
        b->st = kt_grammar_alt(b->g, alts, n, &node, &b->err);
    free(alts);
    return node;
}

/* Calls made earlier in the conversation. */
static size_t earlier_calls(const struct kt_api_request *r)
{
    size_t n = 0;
    for (size_t i = 0; i < r->messages.count; i++)
        n += r->messages.items[i].n_tool_calls;
    return n;
}

static bool tool_grammar(struct build *b, const struct kt_serve_model *m, const struct kt_api_request *r,
                         uint32_t *root, struct kt_api_error *e)
{
    bool deepseek = kt_serve_traits(m).family == KT_CHAT_FAMILY_DEEPSEEK;
    const char *section_end = deepseek ? "<｜tool▁calls▁end｜>" : "<|tool_calls_section_end|>";
    size_t n_tools = json_array_size(r->tools);
    if (r->tool_choice == KT_TOOL_CHOICE_NAMED) {
        /* the prompt holds the call up to its arguments */
        size_t i = 0;
        while (i < n_tools && strcmp(tool_name(json_array_get(r->tools, i)), r->tool_choice_name))
            i++;
        uint32_t args;
        if (!arguments(b, json_array_get(r->tools, i), i, &args, e))
            return false;
        uint32_t close_ds[] = {args, lit(b, "\n```"), marker(b, "<｜tool▁call▁end｜>"), marker(b, section_end)};
        uint32_t close_kimi[] = {args, marker(b, "<|tool_call_end|>"), marker(b, section_end)};
        *root = deepseek ? seq(b, close_ds, 4) : seq(b, close_kimi, 3);
        return b->st == KT_OK;
    }
    uint32_t *args = calloc(n_tools, sizeof *args);
    if (!args) {
        b->st = KT_ERR_NOMEM;
        return false;
    }
    for (size_t i = 0; i < n_tools; i++)
        if (!arguments(b, json_array_get(r->tools, i), i, &args[i], e))
            goto done;
    /* the calls after the first, innermost first: each optional, each opening the next */
    size_t first_index = deepseek ? 0 : earlier_calls(r);
    size_t n_calls = r->parallel_tool_calls ? MAX_PARALLEL_CALLS : 1;
    uint32_t rest = seq(b, NULL, 0); /* no more calls */
    for (size_t k = n_calls; k-- > 1 && b->st == KT_OK;) {
        uint32_t call = any_call(b, deepseek, r->tools, args, first_index + k), opening;
        if (deepseek) {
            uint32_t items[] = {marker(b, "<｜tool▁call▁begin｜>"), lit(b, "function"), marker(b, "<｜tool▁sep｜>")};
            opening = seq(b, items, 3);
        } else {
            uint32_t items[] = {marker(b, "<|tool_call_begin|>"), lit(b, "functions.")};
            opening = seq(b, items, 2);
        }
        uint32_t more[] = {opening, call, rest}, alts[2] = {seq(b, more, 3), seq(b, NULL, 0)};
        if (b->st == KT_OK)
            b->st = kt_grammar_alt(b->g, alts, 2, &rest, &b->err);
    }
    uint32_t items[] = {any_call(b, deepseek, r->tools, args, first_index), rest, marker(b, section_end)};
    *root = seq(b, items, 3);
done:
    free(args);
    return b->st == KT_OK;
}

/* Whether the model reasons in a <think> block the grammar can delimit (both markers special tokens). */
static bool reasons(const struct build *b, const struct kt_serve_model *m, const struct kt_output_params *op)
{
    int32_t open = kt_token_find(b->tok, "<think>", 7), close = kt_token_find(b->tok, "</think>", 8);
    return op && op->reasoning && kt_serve_traits(m).thinks && close >= 0 &&
           kt_token_type(b->tok, close) != KT_TOK_NORMAL &&
           (op->reasoning_open || (open >= 0 && kt_token_type(b->tok, open) != KT_TOK_NORMAL));
}

/* A thinking model's reasoning block, then body: <think> TEXT </think> (optional;
 * only TEXT </think> when the prompt opened the block), a little whitespace.
 * With a budget the block is required and TEXT is at most that many tokens:
 * then </think> is the only token left, and the answer follows. */
static uint32_t after_reasoning(struct build *b, const struct kt_serve_model *m, const struct kt_output_params *op,
                                uint32_t budget, uint32_t body)
{
    if (!reasons(b, m, op))
        return body;
    static const char *const ws[] = {" ", "\n"};
    static const size_t ws_lens[] = {1, 1};
    uint32_t text = 0, space = 0, spaces = 0, closing = marker(b, "</think>");
    if (b->st == KT_OK)
        b->st = kt_grammar_text_budget(b->g, "</think>", 8, budget ? budget : KT_GRAMMAR_UNBOUNDED, &text, &b->err);
    if (b->st == KT_OK)
        b->st = kt_grammar_literals(b->g, ws, ws_lens, 2, &space, &b->err);
    if (b->st == KT_OK)
        b->st = kt_grammar_repeat(b->g, space, 0, 4, &spaces, &b->err);
    uint32_t tail[] = {text, closing, spaces};
    uint32_t block = seq(b, tail, 3);
    if (!op->reasoning_open && budget) {
        uint32_t full[] = {marker(b, "<think>"), block};
        block = seq(b, full, 2);
    } else if (!op->reasoning_open) {
        uint32_t full[] = {marker(b, "<think>"), block};
        uint32_t alts[] = {seq(b, full, 2), seq(b, NULL, 0)};
        if (b->st == KT_OK)
            b->st = kt_grammar_alt(b->g, alts, 2, &block, &b->err);
    }
    uint32_t items[] = {block, body};
    return seq(b, items, 2);
}

bool kt_serve_grammar_build(const struct kt_serve_model *m, const struct kt_api_request *r,
                            const struct kt_output_params *op, struct kt_grammar **out, struct kt_api_error *e)
{
    *out = NULL;
    bool tools = r->kind == KT_API_CHAT && r->tools &&
                 (r->tool_choice == KT_TOOL_CHOICE_REQUIRED || r->tool_choice == KT_TOOL_CHOICE_NAMED);
    struct build b = {.tok = m->tok};
    /* a thinking budget alone: the bounded block, then anything */
    bool budget_only = !tools && r->response_format == KT_RESPONSE_TEXT && r->thinking_budget && reasons(&b, m, op);
    if (!tools && r->response_format == KT_RESPONSE_TEXT && !budget_only)
        return true;
    e->http_status = 0;
    b.st = kt_grammar_create(&b.g, &b.err);
    uint32_t root = 0;
    if (b.st == KT_OK) {
        if (tools)
            tool_grammar(&b, m, r, &root, e);
        else if (budget_only)
            b.st = kt_grammar_any(b.g, &root, &b.err);
        else if (r->response_format == KT_RESPONSE_JSON_OBJECT)
            b.st = kt_json_any_object(b.g, &root, &b.err);
        else if (r->response_format == KT_RESPONSE_REGEX)
            b.st = kt_grammar_regex(b.g, json_string_value(r->response_schema), json_string_length(r->response_schema),
                                    &root, &b.err);
        else if (r->response_format == KT_RESPONSE_CHOICE)
            choices(&b, r->response_schema, &root);
        else
            b.st = kt_json_schema_compile(b.g, r->response_schema, &root, &b.err);
    }
    if (b.st == KT_OK && !tools)
        root = after_reasoning(&b, m, op, r->thinking_budget, root);
    if (b.st == KT_OK)
        b.st = kt_grammar_set_root(b.g, root, &b.err);
    if (b.st != KT_OK) {
        if (e->http_status == 0) { /* not already said by arguments() */
            if (b.st == KT_ERR_NOMEM)
                kt_api_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
            else
                kt_api_error_invalid(e, tools ? "tools" : "response_format", "the output's grammar: %s", b.err.msg);
        }
        kt_grammar_destroy(b.g);
        return false;
    }
    *out = b.g;
    return true;
}
