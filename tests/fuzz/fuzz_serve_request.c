/*
 * fuzz_serve_request.c - fuzz target for kt-serve's request parsing: each
 * input is an HTTP body parsed as a chat and as a text completion request
 * (serve_request.h) and as an Anthropic Messages and count_tokens body
 * (serve_anthropic.h); accepted chat requests are rendered through every chat
 * format kt knows (serve_prompt.h), and the input also runs through the
 * streaming output parser (serve_output.h) of both families in uneven
 * pieces.  Promises checked: a refusal is a 400 or 500 naming a reason, an
 * accepted request's values are in their ranges, the parser never produces
 * more text than it was given.  It must never keep state between inputs.
 */
#include "fuzz.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve_anthropic.h"
#include "serve_output.h"
#include "serve_prompt.h"
#include "serve_request.h"

static void require(bool cond, const char *what)
{
    if (!cond) {
        fprintf(stderr, "fuzz_serve_request: broken promise: %s\n", what);
        abort();
    }
}

static void check_request(enum kt_api_kind kind, const uint8_t *data, size_t size)
{
    struct kt_api_request r;
    struct kt_api_error e = {0};
    if (!kt_api_request_parse(kind, (const char *)data, size, &r, &e)) {
        require(e.http_status == 400 || e.http_status == 500, "a refusal is a 400 or a 500");
        require(e.message[0] != '\0', "a refusal says why");
        json_t *env = kt_api_error_json(&e);
        require(env && json_object_get(env, "error"), "the envelope builds");
        json_decref(env);
        return;
    }
    require(r.kind == kind && r.n >= 1 && r.n <= KT_API_MAX_N, "n in range");
    require(r.n_stop <= KT_API_MAX_STOP && r.top_logprobs <= KT_LOGPROBS_MAX_TOP, "stop and logprobs in range");
    require(r.sampling.temperature >= 0 && r.sampling.temperature <= 2, "temperature in range");
    require(r.sampling.top_p > 0 && r.sampling.top_p <= 1, "top_p in range");
    if (kind == KT_API_CHAT) {
        require(r.messages.count > 0, "chat has messages");
        for (int f = 1; f < KT_CHAT_FORMAT_COUNT; f++) {
            struct kt_serve_model m = {.format = (kt_chat_format)f, .n_ctx = 4096, .n_vocab = 1000};
            char *text = NULL;
            struct kt_api_error re = {0};
            bool ok = kt_prompt_render_chat(&m, &r, &text, &re);
            require(ok == (text != NULL), "a render returns text exactly on success");
            require(ok || re.message[0], "a failed render says why");
            free(text);
        }
    } else {
        require(r.n_prompts >= 1 && r.n_prompts <= KT_API_MAX_PROMPTS, "a completion has prompts");
        for (size_t i = 0; i < r.n_prompts; i++)
            require((r.prompts[i].text != NULL) != (r.prompts[i].ids != NULL) &&
                        (r.prompts[i].text || r.prompts[i].n_ids > 0),
                    "each prompt is text or a non-empty list of ids");
        require(!r.no_generation || r.max_tokens == 0, "max_tokens 0 asks for nothing generated");
        /* each prompt prepares against a tiny vocabulary (no tokenizer: id prompts only) or is refused with a 400 */
        struct kt_serve_model m = {.n_ctx = 64, .n_vocab = 1000};
        for (size_t i = 0; i < r.n_prompts && i < 8 && !r.echo && r.response_format == KT_RESPONSE_TEXT; i++) {
            if (r.prompts[i].text)
                continue;
            struct kt_prompt p;
            struct kt_api_error pe = {0};
            if (kt_prompt_prepare_at(&m, &r, i, "f", &p, &pe))
                kt_prompt_free(&p);
            else
                require(pe.http_status == 400 && pe.message[0], "a prompt refused is a 400 saying why");
        }
    }
    require(!r.prompt_logprobs || (r.prompt_top_logprobs <= KT_LOGPROBS_MAX_TOP && !r.stream),
            "prompt_logprobs in range, never streamed");
    kt_api_request_free(&r);
}

static void check_anthropic(bool count_tokens, const uint8_t *data, size_t size)
{
    struct kt_api_request r;
    struct kt_api_error e = {0};
    if (!kt_anthropic_request_parse((const char *)data, size, count_tokens, &r, NULL, &e)) {
        require(e.http_status == 400 || e.http_status == 500, "an Anthropic refusal is a 400 or a 500");
        require(e.message[0] != '\0', "an Anthropic refusal says why");
        json_t *env = kt_anthropic_error_json(&e);
        require(env && json_object_get(env, "error"), "the Anthropic error shape builds");
        json_decref(env);
        return;
    }
    require(r.kind == KT_API_CHAT && r.n == 1 && r.model && r.messages.count > 0, "a Messages request is one chat");
    require(count_tokens || r.max_tokens >= 1, "max_tokens given");
    require(r.sampling.temperature >= 0 && r.sampling.temperature <= 1, "Anthropic's temperature range");
    require(r.sampling.top_p > 0 && r.sampling.top_p <= 1 && r.n_stop <= KT_API_MAX_STOP, "top_p and stops in range");
    require((r.tool_choice == KT_TOOL_CHOICE_NONE) || r.tools, "a tool choice has tools");
    for (size_t i = 0; i < r.messages.count; i++)
        for (size_t c = 0; c < r.messages.items[i].n_tool_calls; c++) {
            char *id = kt_anthropic_tool_id(r.messages.items[i].tool_calls[c].id);
            char *back = id ? kt_anthropic_model_tool_id(id) : NULL;
            require(!id || (back && strcmp(back, r.messages.items[i].tool_calls[c].id) == 0), "tool ids round-trip");
            free(id), free(back);
        }
    for (int f = 1; f < KT_CHAT_FORMAT_COUNT; f++) {
        struct kt_serve_model m = {.format = (kt_chat_format)f, .n_ctx = 4096, .n_vocab = 1000};
        char *text = NULL;
        struct kt_api_error re = {0};
        bool ok = kt_prompt_render_chat(&m, &r, &text, &re);
        require(ok == (text != NULL) && (ok || re.message[0]), "a Messages render returns text or says why");
        free(text);
    }
    kt_api_request_free(&r);
}

static void check_output(const uint8_t *data, size_t size)
{
    static const kt_chat_family families[] = {KT_CHAT_FAMILY_KIMI, KT_CHAT_FAMILY_DEEPSEEK};
    for (int f = 0; f < 2; f++) {
        struct kt_output_params p = {.family = families[f], .reasoning = true, .tools = true,
                                     .single_tool_call = size % 2 == 0, .reasoning_open = size % 3 == 0};
        struct kt_output o;
        kt_output_init(&o, &p);
        for (size_t at = 0, k = 1; at < size; at += k, k = k % 13 + 1)
            kt_output_push(&o, (const char *)data + at, at + k <= size ? k : size - at);
        kt_output_finish(&o);
        size_t total = o.content.len + o.reasoning.len;
        for (size_t i = 0; i < o.n_calls; i++) {
            require(o.calls[i].id && o.calls[i].name, "a call has an id and a name");
            total += o.calls[i].arguments.len;
        }
        require(total <= size, "the parser never adds text");
        kt_output_free(&o);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    check_request(KT_API_CHAT, data, size);
    check_request(KT_API_COMPLETION, data, size);
    check_anthropic(false, data, size);
    check_anthropic(true, data, size);
    check_output(data, size);
    return 0;
}

/* ---- seeds for replay.c ------------------------------------------------------------------------- */

static const char *const seeds[] = {
    "{\"model\": \"kimi\", \"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"}, {\"role\": \"user\", "
    "\"content\": \"Hi\"}], \"max_tokens\": 16, \"temperature\": 0.7, \"top_p\": 0.9, \"top_k\": 40, \"min_p\": 0.05, "
    "\"seed\": 1, \"stop\": [\"\\n\\n\", \"END\"], \"n\": 2, \"presence_penalty\": 0.5, \"frequency_penalty\": -0.5}",
    "{\"messages\": [{\"role\": \"developer\", \"content\": [{\"type\": \"text\", \"text\": \"x\"}]}, {\"role\": "
    "\"user\", \"content\": \"weather?\"}, {\"role\": \"assistant\", \"content\": null, \"tool_calls\": [{\"id\": "
    "\"functions.get_weather:0\", \"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"arguments\": "
    "{\"city\": \"Paris\"}}}]}, {\"role\": \"tool\", \"tool_call_id\": \"functions.get_weather:0\", \"content\": "
    "\"sunny\"}], \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"parameters\": "
    "{\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}}}}}], \"tool_choice\": {\"type\": "
    "\"function\", \"function\": {\"name\": \"get_weather\"}}, \"parallel_tool_calls\": false, \"stream\": true, "
    "\"stream_options\": {\"include_usage\": true}, \"chat_template_kwargs\": {\"thinking\": false}, \"logprobs\": "
    "true, \"top_logprobs\": 5, \"logit_bias\": {\"12\": -100}}",
    "{\"prompt\": \"The river\", \"max_tokens\": 8, \"echo\": true, \"logprobs\": 3, \"best_of\": 1}",
    "{\"prompt\": [1, 2, 3], \"max_completion_tokens\": 4, \"ignore_eos\": true, \"kt_test_forced_output\": \"x\"}",
    /* lm-eval-harness's loglikelihood request (local-completions): token-id prompts, echo, max_tokens 1 */
    "{\"model\": \"m\", \"prompt\": [[1, 2, 3], [4, 5, 999, 1001]], \"temperature\": 0, \"max_tokens\": 1, "
    "\"logprobs\": 1, \"seed\": 1234, \"echo\": true}",
    "{\"prompt\": [\"The river\", \"\\u4e2d\\u6587\"], \"max_tokens\": 0, \"echo\": true, \"logprobs\": 0, "
    "\"prompt_logprobs\": 2, \"n\": 2}",
    "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"prompt_logprobs\": 20, \"max_tokens\": 1}",
    ("<think>plan</think>Text<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>"
     "{\"a\": 1}<|tool_call_end|><|tool_calls_section_end|>"),
    "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>g\n```json\n{}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
    /* Anthropic Messages */
    "{\"model\": \"m\", \"max_tokens\": 2048, \"system\": [{\"type\": \"text\", \"text\": \"Be brief.\", "
    "\"cache_control\": {\"type\": \"ephemeral\"}}], \"messages\": [{\"role\": \"user\", \"content\": \"hi\"}, "
    "{\"role\": \"assistant\", \"content\": [{\"type\": \"thinking\", \"thinking\": \"t\", \"signature\": \"s\"}, "
    "{\"type\": \"text\", \"text\": \"ok\"}, {\"type\": \"tool_use\", \"id\": \"toolu_kt_functions_2Ef_3A0\", "
    "\"name\": \"f\", \"input\": {\"a\": 1}}]}, {\"role\": \"user\", \"content\": [{\"type\": \"tool_result\", "
    "\"tool_use_id\": \"toolu_kt_functions_2Ef_3A0\", \"content\": [{\"type\": \"text\", \"text\": \"r\"}], "
    "\"is_error\": true}, {\"type\": \"text\", \"text\": \"next\"}]}], \"tools\": [{\"name\": \"f\", "
    "\"description\": \"d\", \"input_schema\": {\"type\": \"object\"}}], \"tool_choice\": {\"type\": \"tool\", "
    "\"name\": \"f\", \"disable_parallel_tool_use\": true}, \"thinking\": {\"type\": \"enabled\", "
    "\"budget_tokens\": 1024}, \"stop_sequences\": [\"END\"], \"temperature\": 0.5, \"top_k\": 5, \"stream\": true, "
    "\"metadata\": {\"user_id\": \"u\"}}",
    "{\"model\": \"m\", \"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"x\"}]}], "
    "\"thinking\": {\"type\": \"disabled\"}, \"tools\": [{\"type\": \"custom\", \"name\": \"g\", "
    "\"input_schema\": {\"type\": \"object\"}}], \"tool_choice\": {\"type\": \"any\"}}",
};

void kt_fuzz_seeds(kt_fuzz_emit_fn emit)
{
    char label[64];
    uint8_t m[4096];
    for (size_t s = 0; s < sizeof seeds / sizeof seeds[0]; s++) {
        size_t n = strlen(seeds[s]);
        snprintf(label, sizeof label, "seed%zu", s);
        emit((const uint8_t *)seeds[s], n, label);
        for (size_t cut = 0; cut < n; cut += 7) {
            snprintf(label, sizeof label, "seed%zu-truncated-%zu", s, cut);
            emit((const uint8_t *)seeds[s], cut, label);
        }
        for (size_t i = 0; i < n && n <= sizeof m; i += 3) {
            static const uint8_t values[] = {'"', '}', ']', '0', '-', 0x00, 0xff, 'n'};
            for (size_t v = 0; v < sizeof values; v++) {
                memcpy(m, seeds[s], n);
                m[i] = values[v];
                snprintf(label, sizeof label, "seed%zu-byte%zu=%02x", s, i, values[v]);
                emit(m, n, label);
            }
        }
    }
}
