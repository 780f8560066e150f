/*
 * test_serve_grammar.c - the grammars kt-serve puts on a request's output
 * (serve_grammar.h), on the synthetic models' real tokenizers: a thinking
 * model may reason in its own block before the JSON (and must close it when
 * the prompt opened it), other models start with the JSON; a thinking budget
 * makes the block required and forces </think> after that many tokens; a forced tool
 * call in Kimi-K2's and DeepSeek's syntax takes only declared names, the
 * family's markers as their special tokens, arguments valid for that tool,
 * and Kimi's call index in the conversation.
 */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gguf.h"
#include "grammar.h"
#include "serve_grammar.h"
#include "serve_request.h"
#include "testlib.h"

struct model {
    struct kt_gguf *gguf;
    struct kt_tokenizer *tok;
    struct kt_grammar_vocab *vocab;
};

static bool model_open(struct model *md, const char *preset)
{
    char path[1024];
    snprintf(path, sizeof path, "%s", kt_test_path(preset));
    if (kt_test_system("%s --preset %s -q -o %s", kt_test_tool("kt-synth"), preset, path) != 0)
        return false;
    kt_err err = {0};
    bool ok = kt_gguf_open(path, &md->gguf, &err) == KT_OK && kt_tokenizer_create(md->gguf, &md->tok, &err) == KT_OK &&
              kt_grammar_vocab_from_tokenizer(md->tok, (uint32_t)kt_tokenizer_n_vocab(md->tok), &md->vocab, &err) ==
                  KT_OK;
    KT_CHECK(ok, "%s: %s", preset, err.msg);
    unlink(path);
    return ok;
}

static void model_close(struct model *md)
{
    kt_grammar_vocab_destroy(md->vocab);
    kt_tokenizer_destroy(md->tok);
    kt_gguf_close(md->gguf);
}

static int32_t token(const struct model *md, const char *text)
{
    int32_t id = kt_token_find(md->tok, text, strlen(text));
    KT_CHECK(id >= 0, "no token '%s'", text);
    return id;
}

static bool allowed(struct kt_grammar_matcher *m, const struct model *md, int32_t id)
{
    uint32_t words = kt_grammar_vocab_mask_words(md->vocab);
    uint32_t *mask = calloc(words, sizeof *mask);
    kt_grammar_matcher_fill_mask(m, mask);
    bool in = (mask[id >> 5] >> (id & 31)) & 1;
    free(mask);
    return in;
}

/* The grammar of a chat request body for a model of format, output parsed as op says,
 * with a thinking budget (Anthropic's budget_tokens; 0: none). */
static struct kt_grammar_matcher *matcher_budget(const struct model *md, kt_chat_format format,
                                                 const struct kt_output_params *op, const char *body,
                                                 uint32_t budget, struct kt_grammar **g)
{
    struct kt_api_request r;
    struct kt_api_error e = {0};
    *g = NULL;
    if (!kt_api_request_parse(KT_API_CHAT, body, strlen(body), &r, &e)) {
        KT_CHECK(false, "parse: %s", e.message);
        return NULL;
    }
    r.thinking_budget = budget;
    struct kt_serve_model m = {.tok = md->tok, .format = format, .n_ctx = 4096,
                               .n_vocab = (uint32_t)kt_tokenizer_n_vocab(md->tok)};
    bool ok = kt_serve_grammar_build(&m, &r, op, g, &e);
    kt_api_request_free(&r);
    KT_CHECK(ok && *g, "build: %s", e.message);
    struct kt_grammar_matcher *mt = NULL;
    kt_err err = {0};
    if (*g)
        KT_CHECK(kt_grammar_matcher_create(*g, md->vocab, &mt, &err) == KT_OK, "%s", err.msg);
    return mt;
}

static struct kt_grammar_matcher *matcher_for(const struct model *md, kt_chat_format format,
                                              const struct kt_output_params *op, const char *body,
                                              struct kt_grammar **g)
{
    return matcher_budget(md, format, op, body, 0, g);
}

static const char *const json_body =
    "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"response_format\": {\"type\": \"json_schema\", "
    "\"json_schema\": {\"name\": \"n\", \"schema\": {\"type\": \"object\", \"properties\": {\"a\": {\"type\": "
    "\"integer\"}}, \"required\": [\"a\"]}}}}";

static void a_thinking_model_may_reason_before_the_json(const struct model *kimi)
{
    struct kt_output_params op = {.family = KT_CHAT_FAMILY_KIMI, .reasoning = true};
    struct kt_grammar *g;
    struct kt_grammar_matcher *m = matcher_for(kimi, KT_CHAT_KIMI_K2_THINKING, &op, json_body, &g);
    if (!m)
        return;
    int32_t open = token(kimi, "<think>"), close = token(kimi, "</think>"), brace = token(kimi, "{");
    kt_err err = {0};
    KT_CHECK(allowed(m, kimi, open) && allowed(m, kimi, brace) && !allowed(m, kimi, close), "think or answer");
    KT_CHECK(kt_grammar_matcher_accept_token(m, open, &err) == KT_OK, "%s", err.msg);
    KT_CHECK(kt_grammar_matcher_accept_bytes(m, "Let me see {a: 1}", 17), "reasoning is any text");
    KT_CHECK(!kt_grammar_matcher_accept_bytes(m, "so </think>", 11), "but not the closing token's text");
    KT_CHECK(allowed(m, kimi, close), "the block may close");
    KT_CHECK(kt_grammar_matcher_accept_token(m, close, &err) == KT_OK, "%s", err.msg);
    KT_CHECK(!kt_grammar_matcher_accept_bytes(m, "ok", 2), "then only the JSON");
    KT_CHECK(kt_grammar_matcher_accept_bytes(m, "\n\n{\"a\": 7}", 10) && kt_grammar_matcher_closed(m), "the JSON");
    kt_grammar_matcher_destroy(m);
    kt_grammar_destroy(g);

    /* an instruct model starts with the JSON */
    m = matcher_for(kimi, KT_CHAT_KIMI_K2_INSTRUCT_0905, &op, json_body, &g);
    if (m) {
        KT_CHECK(!allowed(m, kimi, open) && allowed(m, kimi, brace), "no reasoning block");
        kt_grammar_matcher_destroy(m);
        kt_grammar_destroy(g);
    }
}

static void an_opened_block_must_close_first(const struct model *ds)
{
    struct kt_output_params op = {.family = KT_CHAT_FAMILY_DEEPSEEK, .reasoning = true, .reasoning_open = true};
    struct kt_grammar *g;
    struct kt_grammar_matcher *m = matcher_for(ds, KT_CHAT_DEEPSEEK_R1_THINK, &op, json_body, &g);
    if (!m)
        return;
    int32_t close = token(ds, "</think>");
    kt_err err = {0};
    KT_CHECK(allowed(m, ds, close), "the block may close at once");
    KT_CHECK(kt_grammar_matcher_accept_bytes(m, "{\"a\": 1}", 8) && !kt_grammar_matcher_complete(m),
             "JSON-looking text is still reasoning");
    KT_CHECK(kt_grammar_matcher_accept_token(m, close, &err) == KT_OK, "%s", err.msg);
    KT_CHECK(kt_grammar_matcher_accept_bytes(m, "{\"a\":-3}", 8) && kt_grammar_matcher_closed(m), "the JSON");
    kt_grammar_matcher_destroy(m);
    kt_grammar_destroy(g);
}

static uint32_t mask_count(struct kt_grammar_matcher *m, const struct model *md)
{
    uint32_t *mask = calloc(kt_grammar_vocab_mask_words(md->vocab), sizeof *mask);
    uint32_t n = mask ? kt_grammar_matcher_fill_mask(m, mask) : 0;
    free(mask);
    return n;
}

static void a_thinking_budget_closes_the_block_after_that_many_tokens(const struct model *kimi)
{
    static const char *const text_body = "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}";
    struct kt_output_params op = {.family = KT_CHAT_FAMILY_KIMI, .reasoning = true};
    int32_t open = token(kimi, "<think>"), close = token(kimi, "</think>"), brace = token(kimi, "{");
    int32_t word = token(kimi, "a"), section = token(kimi, "<|tool_calls_section_begin|>");
    uint32_t n_vocab = (uint32_t)kt_tokenizer_n_vocab(kimi->tok);
    kt_err err = {0};
    for (uint32_t budget = 1; budget <= 7; budget += 3) {
        struct kt_grammar *g;
        struct kt_grammar_matcher *m = matcher_budget(kimi, KT_CHAT_KIMI_K2_THINKING, &op, text_body, budget, &g);
        if (!m)
            return;
        KT_CHECK(mask_count(m, kimi) == 1 && allowed(m, kimi, open), "budget %u: the block is required", budget);
        KT_CHECK(kt_grammar_matcher_accept_token(m, open, &err) == KT_OK, "%s", err.msg);
        for (uint32_t i = 0; i < budget; i++) {
            KT_CHECK(allowed(m, kimi, word) && allowed(m, kimi, close) && !allowed(m, kimi, section),
                     "budget %u, token %u: reasoning text or the close", budget, i);
            KT_CHECK(kt_grammar_matcher_accept_token(m, word, &err) == KT_OK, "%s", err.msg);
        }
        KT_CHECK(mask_count(m, kimi) == 1 && allowed(m, kimi, close), "budget %u spent: only </think> (%u allowed)",
                 budget, mask_count(m, kimi));
        KT_CHECK(!kt_grammar_matcher_can_accept(m, word), "budget %u spent: no more text", budget);
        KT_CHECK(kt_grammar_matcher_accept_token(m, close, &err) == KT_OK, "%s", err.msg);
        /* the answer is free: text, special tokens (a tool call), the end */
        KT_CHECK(mask_count(m, kimi) == n_vocab, "after the block every token (%u of %u)", mask_count(m, kimi),
                 n_vocab);
        KT_CHECK(kt_grammar_matcher_accept_token(m, section, &err) == KT_OK &&
                     kt_grammar_matcher_accept_token(m, word, &err) == KT_OK && kt_grammar_matcher_complete(m),
                 "%s", err.msg);
        kt_grammar_matcher_destroy(m);
        kt_grammar_destroy(g);
    }
    /* with a schema: the bounded block, then the JSON */
    struct kt_grammar *g;
    struct kt_grammar_matcher *m = matcher_budget(kimi, KT_CHAT_KIMI_K2_THINKING, &op, json_body, 2, &g);
    if (!m)
        return;
    KT_CHECK(!allowed(m, kimi, brace), "the block comes first");
    KT_CHECK(kt_grammar_matcher_accept_token(m, open, &err) == KT_OK && kt_grammar_matcher_accept_token(m, word, &err) == KT_OK &&
                 kt_grammar_matcher_accept_token(m, word, &err) == KT_OK,
             "%s", err.msg);
    KT_CHECK(!allowed(m, kimi, word) && allowed(m, kimi, close), "two tokens spent");
    KT_CHECK(kt_grammar_matcher_accept_token(m, close, &err) == KT_OK, "%s", err.msg);
    KT_CHECK(kt_grammar_matcher_accept_bytes(m, "{\"a\": 7}", 8) && kt_grammar_matcher_closed(m), "the JSON");
    kt_grammar_matcher_destroy(m);
    kt_grammar_destroy(g);
    /* an instruct model has no block to bound: no grammar at all */
    struct kt_api_request r;
    struct kt_api_error e = {0};
    if (kt_api_request_parse(KT_API_CHAT, text_body, strlen(text_body), &r, &e)) {
        r.thinking_budget = 4;
        struct kt_serve_model sm = {.tok = kimi->tok, .format = KT_CHAT_KIMI_K2_INSTRUCT_0905, .n_ctx = 4096,
                                    .n_vocab = n_vocab};
        g = NULL;
        KT_CHECK(kt_serve_grammar_build(&sm, &r, &op, &g, &e) && g == NULL, "instruct: no grammar");
        kt_grammar_destroy(g);
        kt_api_request_free(&r);
    }
}

static const char *const tools_body =
    "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}, {\"role\": \"assistant\", \"content\": \"\", "
    "\"tool_calls\": [{\"id\": \"functions.get_time:0\", \"type\": \"function\", \"function\": {\"name\": "
    "\"get_time\", \"arguments\": \"{}\"}}]}, {\"role\": \"tool\", \"tool_call_id\": \"functions.get_time:0\", "
    "\"content\": \"noon\"}], \"tool_choice\": \"required\", \"parallel_tool_calls\": false, \"tools\": ["
    "{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"parameters\": {\"type\": \"object\", "
    "\"properties\": {\"city\": {\"type\": \"string\"}}, \"required\": [\"city\"]}}}, {\"type\": \"function\", "
    "\"function\": {\"name\": \"get_time\", \"parameters\": {\"type\": \"object\", \"properties\": {\"zone\": "
    "{\"type\": \"integer\"}}, \"required\": [\"zone\"]}}}]}";

static void kimi_forced_call_takes_declared_names_and_its_index(const struct model *kimi)
{
    struct kt_output_params op = {.family = KT_CHAT_FAMILY_KIMI};
    struct kt_grammar *g;
    /* after the prompt's "<|tool_calls_section_begin|><|tool_call_begin|>functions." */
    struct kt_grammar_matcher *m = matcher_for(kimi, KT_CHAT_KIMI_K2_INSTRUCT_0905, &op, tools_body, &g);
    if (!m)
        return;
    kt_err err = {0};
    KT_CHECK(!kt_grammar_matcher_can_accept(m, token(kimi, "x")), "no undeclared name");
    KT_CHECK(!kt_grammar_matcher_accept_bytes(m, "get_time:0", 10), "one earlier call: this one is number 1");
    KT_CHECK(kt_grammar_matcher_accept_bytes(m, "get_time:1", 10), "a declared name, the next index");
    KT_CHECK(!kt_grammar_matcher_accept_bytes(m, "{", 1), "the argument marker is a token, not text");
    KT_CHECK(kt_grammar_matcher_accept_token(m, token(kimi, "<|tool_call_argument_begin|>"), &err) == KT_OK, "%s",
             err.msg);
    KT_CHECK(!kt_grammar_matcher_accept_bytes(m, "{\"city\"", 7), "get_time's arguments, not get_weather's");
    KT_CHECK(kt_grammar_matcher_accept_bytes(m, "{\"zone\": 2}", 11), "arguments");
    KT_CHECK(kt_grammar_matcher_accept_token(m, token(kimi, "<|tool_call_end|>"), &err) == KT_OK, "%s", err.msg);
    KT_CHECK(!kt_grammar_matcher_can_accept(m, token(kimi, "<|tool_call_begin|>")), "one call only");
    KT_CHECK(kt_grammar_matcher_accept_token(m, token(kimi, "<|tool_calls_section_end|>"), &err) == KT_OK, "%s",
             err.msg);
    KT_CHECK(kt_grammar_matcher_closed(m), "then the reply ends");
    kt_grammar_matcher_destroy(m);
    kt_grammar_destroy(g);
}

static void deepseek_forced_call_in_its_syntax(const struct model *ds)
{
    struct kt_output_params op = {.family = KT_CHAT_FAMILY_DEEPSEEK};
    struct kt_grammar *g;
    struct kt_grammar_matcher *m = matcher_for(ds, KT_CHAT_DEEPSEEK_V3_0324, &op, tools_body, &g);
    if (!m)
        return;
    kt_err err = {0};
    const char *head = "get_weather\n```json\n{\"city\": \"Oslo\"}\n```";
    KT_CHECK(kt_grammar_matcher_accept_bytes(m, head, strlen(head)), "name, fence, arguments, fence");
    KT_CHECK(kt_grammar_matcher_accept_token(m, token(ds, "<｜tool▁call▁end｜>"), &err) == KT_OK, "%s", err.msg);
    KT_CHECK(kt_grammar_matcher_accept_token(m, token(ds, "<｜tool▁calls▁end｜>"), &err) == KT_OK, "%s", err.msg);
    KT_CHECK(kt_grammar_matcher_closed(m), "then the reply ends");
    kt_grammar_matcher_destroy(m);
    kt_grammar_destroy(g);
}

/* KT_RUN for a case on one model. */
#define RUN_ON(fn, arg)                                                                    \
    do {                                                                                   \
        int before_ = kt_test_failures;                                                    \
        fn(arg);                                                                           \
        printf("%s %s\n", kt_test_failures == before_ ? "ok  " : "FAIL", #fn);             \
        fflush(stdout);                                                                    \
    } while (0)

int main(void)
{
    struct model kimi = {0}, ds = {0};
    if (model_open(&kimi, "tiny")) {
        RUN_ON(a_thinking_model_may_reason_before_the_json, &kimi);
        RUN_ON(a_thinking_budget_closes_the_block_after_that_many_tokens, &kimi);
        RUN_ON(kimi_forced_call_takes_declared_names_and_its_index, &kimi);
    }
    if (model_open(&ds, "tiny-v3")) {
        RUN_ON(an_opened_block_must_close_first, &ds);
        RUN_ON(deepseek_forced_call_in_its_syntax, &ds);
    }
    model_close(&kimi);
    model_close(&ds);
    return kt_test_finish();
}
