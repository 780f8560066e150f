/*
 * fuzz_serve_responses.c - fuzz target for kt-serve's Responses API request
 * parsing (serve_responses.h): each input is a /v1/responses body parsed
 * against a store holding one response (so previous_response_id and
 * item_reference resolve when an input names it); an accepted request is
 * rendered through every chat format kt knows (serve_prompt.h).  Promises
 * checked: a refusal is a 400 or 500 naming a reason, an accepted request is
 * a chat request with messages and its echoed fields and input items, in range.
 * The store is made and freed per input: no state is kept between inputs.
 */
#include "fuzz.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve_prompt.h"
#include "serve_responses.h"

static void require(bool cond, const char *what)
{
    if (!cond) {
        fprintf(stderr, "fuzz_serve_responses: broken promise: %s\n", what);
        abort();
    }
}

static struct kt_responses_store *one_stored(void)
{
    struct kt_responses_store *st = kt_responses_store_create(2);
    json_error_t je;
    json_t *input = json_loads("[{\"role\": \"user\", \"content\": \"hi\"}]", 0, &je);
    json_t *output =
        json_loads("[{\"type\": \"reasoning\", \"id\": \"rs_a00\", \"summary\": [{\"type\": "
                   "\"summary_text\", \"text\": \"t\"}]}, {\"type\": \"message\", \"id\": \"msg_a01\", "
                   "\"role\": \"assistant\", \"content\": [{\"type\": \"output_text\", \"text\": \"yo\"}]}, "
                   "{\"type\": \"function_call\", \"id\": \"fc_a02\", \"call_id\": \"functions.f:0\", "
                   "\"name\": \"f\", \"arguments\": \"{}\"}]",
                   0, &je);
    json_t *object = json_pack("{s:s, s:O}", "id", "resp_a", "output", output);
    require(st && input && output && object && kt_responses_store_put(st, "resp_a", object, input, output),
            "the store takes a response");
    json_decref(input), json_decref(output), json_decref(object);
    return st;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct kt_responses_store *st = one_stored();
    struct kt_responses_request r;
    struct kt_api_error e = {0};
    if (!kt_responses_request_parse((const char *)data, size, st, &r, &e)) {
        require(e.http_status == 400 || e.http_status == 500, "a refusal is a 400 or a 500");
        require(e.message[0] != '\0', "a refusal says why");
        kt_responses_store_destroy(st);
        return 0;
    }
    require(r.chat.kind == KT_API_CHAT && r.chat.n == 1 && r.chat.messages.count > 0, "one chat with messages");
    require(r.chat.sampling.temperature >= 0 && r.chat.sampling.temperature <= 2, "temperature in range");
    require(json_is_object(r.echo) && json_is_array(r.input), "echoed fields and input items");
    require(json_is_array(json_object_get(r.echo, "tools")), "tools echoed as a list");
    for (int f = 1; f < KT_CHAT_FORMAT_COUNT; f++) {
        struct kt_serve_model m = {.format = (kt_chat_format)f, .n_ctx = 4096, .n_vocab = 1000};
        char *text = NULL;
        struct kt_api_error re = {0};
        bool ok = kt_prompt_render_chat(&m, &r.chat, &text, &re);
        require(ok == (text != NULL), "a render returns text exactly on success");
        require(ok || re.message[0], "a failed render says why");
        free(text);
    }
    kt_responses_request_free(&r);
    kt_responses_store_destroy(st);
    return 0;
}

/* ---- seeds for replay.c ------------------------------------------------------------------------- */

static const char *const seeds[] = {
    "{\"model\": \"kimi\", \"instructions\": \"Be brief.\", \"input\": \"Hi\", \"max_output_tokens\": 16, "
    "\"temperature\": 0.7, \"top_p\": 0.9, \"metadata\": {\"a\": \"b\"}, \"store\": false}",
    "{\"input\": [{\"role\": \"developer\", \"content\": [{\"type\": \"input_text\", \"text\": \"x\"}]}, {\"role\": "
    "\"user\", \"content\": \"weather?\"}, {\"type\": \"reasoning\", \"summary\": [{\"type\": \"summary_text\", "
    "\"text\": \"r\"}]}, {\"type\": \"function_call\", \"call_id\": \"c1\", \"name\": \"get_weather\", \"arguments\": "
    "\"{}\"}, {\"type\": \"function_call_output\", \"call_id\": \"c1\", \"output\": \"sunny\"}], \"tools\": "
    "[{\"type\": \"function\", \"name\": \"get_weather\", \"parameters\": {\"type\": \"object\"}, \"strict\": true}], "
    "\"tool_choice\": {\"type\": \"function\", \"name\": \"get_weather\"}, \"parallel_tool_calls\": false, "
    "\"stream\": true, \"text\": {\"format\": {\"type\": \"text\"}}, \"reasoning\": {\"effort\": \"low\"}}",
    "{\"previous_response_id\": \"resp_a\", \"input\": [{\"type\": \"item_reference\", \"id\": \"fc_a02\"}, "
    "{\"type\": \"function_call_output\", \"call_id\": \"functions.f:0\", \"output\": [{\"type\": \"input_text\", "
    "\"text\": \"ok\"}]}], \"tool_choice\": \"required\", \"tools\": [{\"type\": \"function\", \"name\": \"f\"}]}",
    "{\"input\": \"x\", \"text\": {\"format\": {\"type\": \"json_schema\", \"name\": \"n\", \"schema\": {\"type\": "
    "\"object\"}}}}",
};

void kt_fuzz_seeds(kt_fuzz_emit_fn emit)
{
    static const char values[] = {'"', '{', '}', '[', ']', ',', ':', '0', 'x', '\0', '\\'};
    kt_fuzz_mutated_seeds(emit, seeds, sizeof seeds / sizeof seeds[0], values, sizeof values);
}
