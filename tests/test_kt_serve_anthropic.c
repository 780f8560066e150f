/*
 * test_kt_serve_anthropic.c - Anthropic's Messages API on kt-serve: the
 * request mapping (serve_anthropic.h) read back from the parsed request -
 * system, text blocks, tool_use / tool_result / thinking turns, tools,
 * tool_choice, thinking, stop_sequences, kt's tool ids turned back into the
 * model's - and every refusal in Anthropic's terms; then end to end over
 * HTTP with curl on the tiny model: the message object, the exact event
 * order of a stream (text; thinking, text and a tool call), a tool round
 * trip, stop_sequences, the max_tokens stop, count_tokens against the usage,
 * 400 / 401 / 404 / 405 in Anthropic's error shape, x-api-key, DeepSeek's made-up
 * call ids and thinking, thinking.budget_tokens closing the block in time
 * (Kimi-K2-Thinking and DeepSeek-R1), and a stream the server ended (timeout, drain)
 * ending with an error event and no message_stop.
 */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "serve_anthropic.h"
#include "serve_harness.h"

static char kimi[1024], deepseek[1024];

static json_t *parse(const struct kt_buf *b)
{
    json_error_t je;
    json_t *j = json_loads(kt_buf_str(b), 0, &je);
    KT_CHECK(j != NULL, "not JSON: %.300s", kt_buf_str(b));
    return j;
}

static const char *str(const json_t *o, const char *key)
{
    const char *s = json_string_value(json_object_get(o, key));
    return s ? s : "(none)";
}

/* ---- the request mapping, in process --------------------------------------------------------------- */

static bool parse_opts(const char *body, struct kt_api_request *r, struct kt_anthropic_options *opts)
{
    struct kt_api_error e;
    bool ok = kt_anthropic_request_parse(body, strlen(body), false, r, opts, &e);
    KT_CHECK(ok, "refused (%d): %s: %.200s", e.http_status, e.message, body);
    return ok;
}

static bool parse_ok(const char *body, struct kt_api_request *r)
{
    return parse_opts(body, r, NULL);
}

/* A 400 whose message contains want. */
static void refused(const char *body, bool count_tokens, const char *want)
{
    struct kt_api_request r;
    struct kt_api_error e;
    bool ok = kt_anthropic_request_parse(body, strlen(body), count_tokens, &r, NULL, &e);
    KT_CHECK(!ok && e.http_status == 400 && strstr(e.message, want), "%.200s: expected a 400 saying '%s', got %d '%s'",
             body, want, ok ? 200 : e.http_status, ok ? "" : e.message);
    if (ok)
        kt_api_request_free(&r);
}

static void conversation_maps_onto_the_chat_messages(void)
{
    struct kt_api_request r;
    const char *body =
        "{\"model\": \"m\", \"max_tokens\": 2048, \"system\": [{\"type\": \"text\", \"text\": \"Be \"}, {\"type\": "
        "\"text\", \"text\": \"brief.\", \"cache_control\": {\"type\": \"ephemeral\"}}], \"messages\": ["
        "{\"role\": \"user\", \"content\": \"Weather in Paris?\"},"
        "{\"role\": \"assistant\", \"content\": [{\"type\": \"thinking\", \"thinking\": \"use the tool\", "
        "\"signature\": \"kt-serve\"}, {\"type\": \"redacted_thinking\", \"data\": \"xx\"}, {\"type\": \"text\", "
        "\"text\": \"Checking.\"}, {\"type\": \"tool_use\", \"id\": \"toolu_kt_functions_2Eget_5Fweather_3A0\", "
        "\"name\": \"get_weather\", \"input\": {\"city\": \"Paris\"}}, {\"type\": \"tool_use\", \"id\": "
        "\"toolu_01A09q90qw90lq917835lq9\", \"name\": \"get_time\", \"input\": {}}]},"
        "{\"role\": \"user\", \"content\": [{\"type\": \"tool_result\", \"tool_use_id\": "
        "\"toolu_kt_functions_2Eget_5Fweather_3A0\", \"content\": [{\"type\": \"text\", \"text\": \"sunny\"}]}, "
        "{\"type\": \"tool_result\", \"tool_use_id\": \"toolu_01A09q90qw90lq917835lq9\", \"content\": \"no clock\", "
        "\"is_error\": true}, {\"type\": \"text\", \"text\": \"And \"}, {\"type\": \"text\", \"text\": \"tomorrow?\"}]}],"
        "\"tools\": [{\"name\": \"get_weather\", \"description\": \"Weather of a city\", \"input_schema\": {\"type\": "
        "\"object\", \"properties\": {\"city\": {\"type\": \"string\"}}}}, {\"name\": \"get_time\", \"input_schema\": "
        "{\"type\": \"object\"}}], \"tool_choice\": {\"type\": \"tool\", \"name\": \"get_time\", "
        "\"disable_parallel_tool_use\": true}, \"thinking\": {\"type\": \"enabled\", \"budget_tokens\": 1024}, "
        "\"stop_sequences\": [\"END\", \"\"], \"temperature\": 0.5, \"top_p\": 0.9, \"top_k\": 7, "
        "\"metadata\": {\"user_id\": \"u1\"}, \"stream\": true, \"service_tier\": \"auto\"}";
    if (!parse_ok(body, &r))
        return;
    const kt_chat_message *m = r.messages.items;
    KT_CHECK(r.kind == KT_API_CHAT && r.n == 1 && r.max_tokens == 2048 && r.stream && strcmp(r.model, "m") == 0,
             "request fields");
    KT_CHECK(r.messages.count == 6, "system, user, assistant, two tool turns, user: %zu turns", r.messages.count);
    if (r.messages.count == 6) {
        KT_CHECK(m[0].role == KT_CHAT_SYSTEM && strcmp(m[0].content, "Be brief.") == 0, "system: '%s'", m[0].content);
        KT_CHECK(m[1].role == KT_CHAT_USER && strcmp(m[1].content, "Weather in Paris?") == 0, "user");
        KT_CHECK(m[2].role == KT_CHAT_ASSISTANT && strcmp(m[2].content, "Checking.") == 0 &&
                     m[2].reasoning_content && strcmp(m[2].reasoning_content, "use the tool") == 0,
                 "assistant text and thinking");
        KT_CHECK(m[2].n_tool_calls == 2 && strcmp(m[2].tool_calls[0].id, "functions.get_weather:0") == 0 &&
                     strcmp(m[2].tool_calls[0].name, "get_weather") == 0 &&
                     strcmp(m[2].tool_calls[0].arguments, "{\"city\": \"Paris\"}") == 0,
                 "kt's tool id back to the model's, input as the template's JSON: %s %s",
                 m[2].n_tool_calls ? m[2].tool_calls[0].id : "-", m[2].n_tool_calls ? m[2].tool_calls[0].arguments : "-");
        KT_CHECK(m[2].n_tool_calls == 2 && strcmp(m[2].tool_calls[1].id, "toolu_01A09q90qw90lq917835lq9") == 0,
                 "an id kt did not make stays as it is");
        KT_CHECK(m[3].role == KT_CHAT_TOOL && strcmp(m[3].tool_call_id, "functions.get_weather:0") == 0 &&
                     strcmp(m[3].content, "sunny") == 0,
                 "tool_result with text blocks");
        KT_CHECK(m[4].role == KT_CHAT_TOOL && strcmp(m[4].tool_call_id, "toolu_01A09q90qw90lq917835lq9") == 0 &&
                     strcmp(m[4].content, "Error: no clock") == 0,
                 "is_error: '%s'", m[4].content);
        KT_CHECK(m[5].role == KT_CHAT_USER && strcmp(m[5].content, "And tomorrow?") == 0, "user text after the results");
    }
    const json_t *fn = json_object_get(json_array_get(r.tools, 0), "function");
    KT_CHECK(json_array_size(r.tools) == 2 && strcmp(str(json_array_get(r.tools, 0), "type"), "function") == 0 &&
                 strcmp(str(fn, "name"), "get_weather") == 0 && strcmp(str(fn, "description"), "Weather of a city") == 0 &&
                 json_is_object(json_object_get(fn, "parameters")),
             "tools as function tools");
    KT_CHECK(r.tool_choice == KT_TOOL_CHOICE_NAMED && strcmp(r.tool_choice_name, "get_time") == 0 &&
                 !r.parallel_tool_calls,
             "tool_choice tool, no parallel calls");
    KT_CHECK(r.thinking == KT_CHAT_THINKING_ON, "thinking enabled");
    KT_CHECK(r.n_stop == 1 && strcmp(r.stop[0], "END") == 0, "stop_sequences");
    KT_CHECK(r.sampling.temperature == 0.5f && r.sampling.top_p == 0.9f && r.sampling.top_k == 7, "sampling");
    kt_api_request_free(&r);

    struct {
        const char *choice;
        enum kt_tool_choice want;
    } choices[] = {{"", KT_TOOL_CHOICE_AUTO},
                   {", \"tool_choice\": {\"type\": \"auto\"}", KT_TOOL_CHOICE_AUTO},
                   {", \"tool_choice\": {\"type\": \"any\"}", KT_TOOL_CHOICE_REQUIRED},
                   {", \"tool_choice\": {\"type\": \"none\"}", KT_TOOL_CHOICE_NONE}};
    for (size_t i = 0; i < sizeof choices / sizeof choices[0]; i++) {
        char b[512];
        snprintf(b, sizeof b, "{\"model\": \"m\", \"max_tokens\": 4, \"messages\": [{\"role\": \"user\", \"content\": "
                              "\"x\"}], \"tools\": [{\"name\": \"f\", \"input_schema\": {\"type\": \"object\"}}]%s}",
                 choices[i].choice);
        if (parse_ok(b, &r)) {
            KT_CHECK(r.tool_choice == choices[i].want && r.parallel_tool_calls, "tool_choice '%s': %d",
                     choices[i].choice, (int)r.tool_choice);
            kt_api_request_free(&r);
        }
    }
    if (parse_ok("{\"model\": \"m\", \"max_tokens\": 4, \"thinking\": {\"type\": \"disabled\"}, \"messages\": "
                 "[{\"role\": \"user\", \"content\": []}]}", &r)) {
        KT_CHECK(r.thinking == KT_CHAT_THINKING_OFF && r.tool_choice == KT_TOOL_CHOICE_NONE && !r.tools &&
                     r.messages.count == 1 && r.messages.items[0].role == KT_CHAT_USER,
                 "thinking disabled; no tools; an empty user turn");
        kt_api_request_free(&r);
    }
    /* count_tokens takes no max_tokens */
    struct kt_api_error e;
    const char *count = "{\"model\": \"m\", \"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}";
    KT_CHECK(kt_anthropic_request_parse(count, strlen(count), true, &r, NULL, &e), "count_tokens body: %s", e.message);
    kt_api_request_free(&r);

    /* the current API's fields that ask nothing kt must do differently */
    struct kt_anthropic_options opts = {0};
    if (parse_opts("{\"model\": \"m\", \"max_tokens\": 4, \"cache_control\": {\"type\": \"ephemeral\", \"ttl\": \"1h\"}, "
                   "\"output_config\": {\"effort\": \"high\"}, \"speed\": \"standard\", \"inference_geo\": \"us\", "
                   "\"diagnostics\": {\"previous_message_id\": \"msg_1\"}, \"user_profile_id\": \"p\", \"workspace_id\": "
                   "\"w\", \"thinking\": {\"type\": \"adaptive\", \"display\": \"omitted\"}, \"tools\": [{\"name\": \"f\", "
                   "\"input_schema\": {\"type\": \"object\"}, \"eager_input_streaming\": true, \"allowed_callers\": "
                   "[\"direct\"], \"defer_loading\": false}], \"messages\": [{\"role\": \"user\", \"content\": \"x\"}, "
                   "{\"role\": \"assistant\", \"content\": [{\"type\": \"tool_use\", \"id\": \"a\", \"name\": \"f\", "
                   "\"input\": {}, \"caller\": {\"type\": \"direct\"}}]}, {\"role\": \"user\", \"content\": [{\"type\": "
                   "\"tool_result\", \"tool_use_id\": \"a\", \"content\": \"r\", \"toolset_name\": null}]}]}",
                   &r, &opts)) {
        KT_CHECK(r.thinking == KT_CHAT_THINKING_DEFAULT && opts.omit_thinking, "adaptive: the template decides; omitted");
        kt_api_request_free(&r);
    }
    if (parse_opts("{\"model\": \"m\", \"max_tokens\": 4, \"thinking\": {\"type\": \"between_tools\"}, "
                   "\"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}", &r, &opts)) {
        KT_CHECK(r.thinking == KT_CHAT_THINKING_DEFAULT && !opts.omit_thinking, "between_tools");
        kt_api_request_free(&r);
    }
}

static void tool_ids_round_trip(void)
{
    static const char *const ids[] = {"functions.get_weather:0", "call_abc_1", "x", "functions.a-b_c.d:12", "caf\xC3\xA9"};
    for (size_t i = 0; i < sizeof ids / sizeof ids[0]; i++) {
        char *out = kt_anthropic_tool_id(ids[i]);
        char *back = out ? kt_anthropic_model_tool_id(out) : NULL;
        KT_CHECK(out && strncmp(out, "toolu_", 6) == 0 && strspn(out, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRST"
                                                                   "UVWXYZ0123456789_-") == strlen(out),
                 "'%s' -> '%s': Anthropic's id characters", ids[i], out ? out : "");
        KT_CHECK(back && strcmp(back, ids[i]) == 0, "'%s' -> '%s' -> '%s'", ids[i], out ? out : "", back ? back : "");
        free(out), free(back);
    }
    static const char *const foreign[] = {"toolu_01A09q90qw90lq917835lq9", "toolu_kt_bad_zz", "toolu_kt_nul_00",
                                          "toolu_kt__FF", "toolu_kt_a.b", "toolu_kt_cut_4",
                                          "plain"};
    for (size_t i = 0; i < sizeof foreign / sizeof foreign[0]; i++) {
        char *back = kt_anthropic_model_tool_id(foreign[i]);
        KT_CHECK(back && strcmp(back, foreign[i]) == 0, "'%s' kept: '%s'", foreign[i], back ? back : "");
        free(back);
    }
}

static void malformed_requests_are_refused_as_anthropic_does(void)
{
    const char *hi = "\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]";
    char b[1024];
    refused("{", false, "not valid JSON");
    refused("[]", false, "JSON object");
    snprintf(b, sizeof b, "{\"model\": \"m\", %s}", hi);
    refused(b, false, "max_tokens: Field required");
    snprintf(b, sizeof b, "{\"max_tokens\": 4, %s}", hi);
    refused(b, false, "model: Field required");
    refused("{\"model\": \"m\", \"max_tokens\": 4}", false, "messages: Field required");
    refused("{\"model\": \"m\", \"max_tokens\": 4, \"messages\": []}", false, "non-empty");
    struct {
        const char *extra, *want;
    } cases[] = {
        {"\"max_tokens\": 0", "max_tokens"},
        {"\"max_tokens\": 4, \"foo\": 1", "foo: Extra inputs are not permitted"},
        {"\"max_tokens\": 4, \"n\": 2", "n: Extra inputs are not permitted"},
        {"\"max_tokens\": 4, \"temperature\": 1.5", "temperature"},
        {"\"max_tokens\": 4, \"top_p\": 0", "top_p"},
        {"\"max_tokens\": 4, \"top_k\": -1", "top_k"},
        {"\"max_tokens\": 4, \"stream\": \"yes\"", "stream"},
        {"\"max_tokens\": 4, \"stop_sequences\": \"END\"", "stop_sequences"},
        {"\"max_tokens\": 4, \"stop_sequences\": [1]", "stop_sequences.0"},
        {"\"max_tokens\": 4, \"metadata\": {\"user\": \"x\"}", "metadata.user: Extra inputs"},
        {"\"max_tokens\": 4, \"mcp_servers\": []", "mcp_servers: not supported"},
        {"\"max_tokens\": 4, \"container\": \"c\"", "container: not supported"},
        {"\"max_tokens\": 4, \"service_tier\": \"priority\"", "service_tier"},
        {"\"max_tokens\": 4, \"system\": 5", "system"},
        {"\"max_tokens\": 4, \"system\": [{\"type\": \"image\"}]", "system.0: content blocks of type 'image'"},
        {"\"max_tokens\": 4, \"thinking\": {\"type\": \"enabled\"}", "budget_tokens: Field required"},
        {"\"max_tokens\": 4000, \"thinking\": {\"type\": \"enabled\", \"budget_tokens\": 100}", "1024"},
        {"\"max_tokens\": 1024, \"thinking\": {\"type\": \"enabled\", \"budget_tokens\": 1024}", "max_tokens"},
        {"\"max_tokens\": 4, \"thinking\": {\"type\": \"sometimes\"}", "thinking.type"},
        {"\"max_tokens\": 4, \"thinking\": {\"type\": \"disabled\", \"display\": \"omitted\"}",
         "thinking.disabled.display: Extra inputs"},
        {"\"max_tokens\": 4, \"thinking\": {\"type\": \"adaptive\", \"display\": \"full\"}", "thinking.display"},
        {"\"max_tokens\": 4, \"speed\": \"fast\"", "speed: 'fast'"},
        {"\"max_tokens\": 4, \"output_config\": {\"format\": {\"type\": \"json_schema\"}}", "structured outputs"},
        {"\"max_tokens\": 4, \"output_config\": {\"effort\": \"extreme\"}", "output_config.effort"},
        {"\"max_tokens\": 4, \"diagnostics\": {\"trace\": true}", "diagnostics.trace: Extra inputs"},
        {"\"max_tokens\": 4, \"tools\": [{\"name\": \"f\", \"input_schema\": {\"type\": \"object\"}, "
         "\"allowed_callers\": [\"code_execution_20250825\"]}]",
         "allowed_callers"},
        {"\"max_tokens\": 4, \"tools\": [{\"name\": \"f\", \"input_schema\": {\"type\": \"object\"}, "
         "\"defer_loading\": true}]",
         "defer_loading"},
        {"\"max_tokens\": 4, \"tools\": [{\"name\": \"f\", \"input_schema\": {\"type\": \"object\"}, "
         "\"input_examples\": [{\"a\": 1}]}]",
         "input_examples"},
        {"\"max_tokens\": 4, \"tools\": {}", "tools"},
        {"\"max_tokens\": 4, \"tools\": [{\"name\": \"f\"}]", "tools.0.input_schema: Field required"},
        {"\"max_tokens\": 4, \"tools\": [{\"name\": \"\", \"input_schema\": {\"type\": \"object\"}}]", "tools.0.name"},
        {"\"max_tokens\": 4, \"tools\": [{\"name\": \"f\", \"input_schema\": {\"type\": \"string\"}}]", "'object'"},
        {"\"max_tokens\": 4, \"tools\": [{\"type\": \"bash_20250124\", \"name\": \"bash\"}]", "bash_20250124"},
        {"\"max_tokens\": 4, \"tools\": [{\"name\": \"f\", \"input_schema\": {\"type\": \"object\"}, \"x\": 1}]",
         "tools.0.x: Extra inputs"},
        {"\"max_tokens\": 4, \"tools\": [{\"name\": \"f\", \"input_schema\": {\"type\": \"object\"}, \"strict\": true}]",
         "constrained decoding"},
        {"\"max_tokens\": 4, \"tool_choice\": {\"type\": \"any\"}", "needs tools"},
        {"\"max_tokens\": 4, \"tool_choice\": {\"type\": \"required\"}", "tool_choice.type"},
        {"\"max_tokens\": 4, \"tool_choice\": \"auto\"", "tool_choice"},
        {"\"max_tokens\": 4, \"tools\": [{\"name\": \"f\", \"input_schema\": {\"type\": \"object\"}}], \"tool_choice\": "
         "{\"type\": \"tool\", \"name\": \"g\"}",
         "'g', which is not in tools"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(b, sizeof b, "{\"model\": \"m\", %s, %s}", cases[i].extra, hi);
        refused(b, false, cases[i].want);
    }
    struct {
        const char *messages, *want;
    } turns[] = {
        {"[{\"role\": \"system\", \"content\": \"x\"}]", "messages.0.role"},
        {"[{\"role\": \"user\"}]", "messages.0.content: Field required"},
        {"[{\"role\": \"user\", \"content\": \"x\", \"name\": \"n\"}]", "messages.0.name: Extra inputs"},
        {"[{\"role\": \"user\", \"content\": 5}]", "messages.0.content"},
        {"[{\"role\": \"user\", \"content\": [{\"type\": \"image\", \"source\": {}}]}]",
         "messages.0.content.0: content blocks of type 'image' are not supported"},
        {"[{\"role\": \"user\", \"content\": [{\"text\": \"x\"}]}]", "messages.0.content.0.type: Field required"},
        {"[{\"role\": \"user\", \"content\": [{\"type\": \"text\"}]}]", "messages.0.content.0.text"},
        {"[{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"x\", \"cache_control\": {\"type\": "
         "\"forever\"}}]}]",
         "ephemeral"},
        {"[{\"role\": \"user\", \"content\": [{\"type\": \"tool_use\", \"id\": \"a\", \"name\": \"f\", \"input\": {}}]}]",
         "belong in assistant messages"},
        {"[{\"role\": \"user\", \"content\": [{\"type\": \"tool_result\"}]}]", "tool_use_id: Field required"},
        {"[{\"role\": \"user\", \"content\": [{\"type\": \"tool_result\", \"tool_use_id\": \"a\", \"is_error\": 1}]}]",
         "is_error"},
        {"[{\"role\": \"user\", \"content\": [{\"type\": \"tool_result\", \"tool_use_id\": \"a\", \"content\": "
         "[{\"type\": \"image\"}]}]}]",
         "messages.0.content.0.content.0: content blocks of type 'image'"},
        {"[{\"role\": \"user\", \"content\": \"x\"}, {\"role\": \"assistant\", \"content\": [{\"type\": \"tool_use\", "
         "\"id\": \"a\", \"name\": \"f\", \"input\": \"{}\"}]}, {\"role\": \"user\", \"content\": \"y\"}]",
         "messages.1.content.0.input: Input should be an object"},
        {"[{\"role\": \"user\", \"content\": \"x\"}, {\"role\": \"assistant\", \"content\": [{\"type\": "
         "\"tool_result\", \"tool_use_id\": \"a\"}]}, {\"role\": \"user\", \"content\": \"y\"}]",
         "belong in user messages"},
        {"[{\"role\": \"user\", \"content\": \"x\"}, {\"role\": \"assistant\", \"content\": \"The answer is\"}]",
         "prefill"},
        {"[{\"role\": \"user\", \"content\": \"x\"}, {\"role\": \"assistant\", \"content\": [{\"type\": \"tool_use\", "
         "\"id\": \"a\", \"name\": \"f\", \"input\": {}, \"caller\": {\"type\": \"code_execution_20250825\"}}]}, "
         "{\"role\": \"user\", \"content\": \"y\"}]",
         "caller"},
    };
    for (size_t i = 0; i < sizeof turns / sizeof turns[0]; i++) {
        snprintf(b, sizeof b, "{\"model\": \"m\", \"max_tokens\": 4, \"messages\": %s}", turns[i].messages);
        refused(b, false, turns[i].want);
    }
    snprintf(b, sizeof b, "{\"model\": \"m\", \"max_tokens\": 4, %s}", hi);
    refused(b, true, "max_tokens: Extra inputs are not permitted");

    struct kt_api_error e = {.http_status = 400};
    snprintf(e.message, sizeof e.message, "bad");
    json_t *j = kt_anthropic_error_json(&e);
    KT_CHECK(strcmp(str(j, "type"), "error") == 0 &&
                 strcmp(str(json_object_get(j, "error"), "type"), "invalid_request_error") == 0 &&
                 strcmp(str(json_object_get(j, "error"), "message"), "bad") == 0 && json_object_size(j) == 2,
             "the error shape");
    json_decref(j);
    static const struct {
        int status;
        const char *type;
    } types[] = {{401, "authentication_error"}, {404, "not_found_error"}, {413, "request_too_large"},
                 {429, "rate_limit_error"},     {500, "api_error"},       {503, "overloaded_error"},
                 {504, "timeout_error"}};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        e.http_status = types[i].status;
        j = kt_anthropic_error_json(&e);
        KT_CHECK(strcmp(str(json_object_get(j, "error"), "type"), types[i].type) == 0, "%d: %s", types[i].status,
                 str(json_object_get(j, "error"), "type"));
        json_decref(j);
    }
}

/* ---- over HTTP -------------------------------------------------------------------------------------------- */

/* Expects status and Anthropic's error shape with the error type and a message containing want. */
static void expect_error(const struct test_server *s, const char *args, const char *path, const char *body,
                         int status, const char *type, const char *want)
{
    struct kt_buf out = {0};
    int got = http(s, args, path, body, &out, NULL);
    json_t *j = parse(&out);
    json_t *e = json_object_get(j, "error");
    KT_CHECK(got == status && strcmp(str(j, "type"), "error") == 0 && strcmp(str(e, "type"), type) == 0 &&
                 strstr(str(e, "message"), want),
             "%s %.100s: expected %d %s '%s', got %d %.300s", path, body ? body : "", status, type, want, got,
             kt_buf_str(&out));
    json_decref(j);
    kt_buf_free(&out);
}

/* A stream's events: names[i] and data[i] (new references), n of them. */
struct events {
    char names[8192][24];
    json_t *data[8192];
    size_t n;
    bool well_formed; /* every event "event: NAME\ndata: JSON\n\n" with data.type == NAME */
    size_t later_pings; /* ping events after the first, not in names / data */
};

static void events_parse(const char *t, struct events *ev)
{
    ev->n = 0;
    ev->later_pings = 0;
    ev->well_formed = true;
    while (*t) {
        const char *end = strstr(t, "\n\n");
        if (!end || strncmp(t, "event: ", 7) != 0) {
            ev->well_formed = false;
            return;
        }
        const char *nl = strchr(t, '\n');
        if (nl >= end || strncmp(nl + 1, "data: ", 6) != 0 || ev->n == 8192) {
            ev->well_formed = false;
            return;
        }
        snprintf(ev->names[ev->n], sizeof ev->names[0], "%.*s", (int)(nl - t - 7), t + 7);
        json_t *d = json_loadb(nl + 7, (size_t)(end - nl - 7), 0, NULL);
        ev->data[ev->n] = d;
        if (!d || strcmp(str(d, "type"), ev->names[ev->n]) != 0)
            ev->well_formed = false;
        /* Anthropic may ping anywhere; after the first (right after message_start) they are set aside */
        if (strcmp(ev->names[ev->n], "ping") == 0 && ev->n > 1) {
            ev->later_pings++;
            json_decref(d);
        } else {
            ev->n++;
        }
        t = end + 2;
    }
}

static void events_free(struct events *ev)
{
    for (size_t i = 0; i < ev->n; i++)
        json_decref(ev->data[i]);
    ev->n = 0;
}

/* The sequence a whole stream must have: message_start, ping, then blocks
 * (start, deltas, stop) at indices 0, 1, ..., message_delta, message_stop.
 * Fills kinds (the blocks' types, comma-separated) and texts[i] (a block's
 * text, thinking or partial_json joined). */
static bool events_in_order(const struct events *ev, char *kinds, size_t kinds_size, struct kt_buf *texts,
                            size_t max_blocks, const char *what)
{
    size_t i = 0, block = 0;
    kinds[0] = '\0';
    bool ok = ev->well_formed && ev->n >= 4 && strcmp(ev->names[0], "message_start") == 0 &&
              strcmp(ev->names[1], "ping") == 0;
    for (i = 2; ok && i < ev->n && strcmp(ev->names[i], "content_block_start") == 0; block++) {
        const json_t *cb = json_object_get(ev->data[i], "content_block");
        ok = block < max_blocks && json_integer_value(json_object_get(ev->data[i], "index")) == (json_int_t)block;
        if (!ok)
            break;
        snprintf(kinds + strlen(kinds), kinds_size - strlen(kinds), "%s%s", block ? "," : "", str(cb, "type"));
        for (i++; i < ev->n && strcmp(ev->names[i], "content_block_delta") == 0; i++) {
            const json_t *d = json_object_get(ev->data[i], "delta");
            ok = ok && json_integer_value(json_object_get(ev->data[i], "index")) == (json_int_t)block;
            const char *dt = str(d, "type");
            const char *piece = strcmp(dt, "text_delta") == 0       ? str(d, "text")
                                : strcmp(dt, "thinking_delta") == 0   ? str(d, "thinking")
                                : strcmp(dt, "input_json_delta") == 0 ? str(d, "partial_json")
                                                                      : "";
            if (strcmp(dt, "signature_delta") == 0)
                ok = ok && strcmp(str(cb, "type"), "thinking") == 0;
            kt_buf_puts(&texts[block], piece);
        }
        ok = ok && i < ev->n && strcmp(ev->names[i], "content_block_stop") == 0 &&
             json_integer_value(json_object_get(ev->data[i], "index")) == (json_int_t)block;
        i++;
    }
    ok = ok && i + 2 == ev->n && strcmp(ev->names[i], "message_delta") == 0 &&
         strcmp(ev->names[i + 1], "message_stop") == 0;
    KT_CHECK(ok, "%s: events out of order at %zu of %zu", what, i, ev->n);
    if (!ok)
        for (size_t k = 0; k < ev->n; k++)
            fprintf(stderr, "  %zu %s\n", k, ev->names[k]);
    return ok;
}

static const char *stop_reason_of(const struct events *ev)
{
    const json_t *d = ev->n ? json_object_get(ev->data[ev->n - 2], "delta") : NULL;
    return str(d, "stop_reason");
}

static void message_object(const struct test_server *s)
{
    struct kt_buf out = {0};
    const char *conversation = "\"model\": \"kimi\", \"system\": \"Be brief.\", \"messages\": [{\"role\": \"user\", "
                               "\"content\": \"Say hello.\"}]";
    char body[512];
    snprintf(body, sizeof body, "{%s, \"max_tokens\": 5, \"temperature\": 0, \"kt_test_forced_output\": \"one two "
                                "three four five six seven\"}", conversation);
    int code = http(s, NULL, "/v1/messages", body, &out, NULL);
    json_t *j = parse(&out);
    json_t *content = json_object_get(j, "content"), *usage = json_object_get(j, "usage");
    KT_CHECK(code == 200 && strncmp(str(j, "id"), "msg_", 4) == 0 && strcmp(str(j, "type"), "message") == 0 &&
                 strcmp(str(j, "role"), "assistant") == 0 && strcmp(str(j, "model"), "kimi") == 0,
             "message: %s", kt_buf_str(&out));
    KT_CHECK(json_array_size(content) == 1 && strcmp(str(json_array_get(content, 0), "type"), "text") == 0 &&
                 strncmp("one two three four five six seven", str(json_array_get(content, 0), "text"),
                         strlen(str(json_array_get(content, 0), "text"))) == 0 &&
                 strlen(str(json_array_get(content, 0), "text")) > 3,
             "the text of 5 tokens: %s", kt_buf_str(&out));
    KT_CHECK(strcmp(str(j, "stop_reason"), "max_tokens") == 0 && json_is_null(json_object_get(j, "stop_sequence")),
             "max_tokens stop: %s", kt_buf_str(&out));
    json_int_t input = json_integer_value(json_object_get(usage, "input_tokens")) +
                       json_integer_value(json_object_get(usage, "cache_read_input_tokens"));
    KT_CHECK(json_integer_value(json_object_get(usage, "output_tokens")) == 5 && input > 0 &&
                 json_is_integer(json_object_get(usage, "cache_creation_input_tokens")),
             "usage: %s", kt_buf_str(&out));
    json_decref(j);

    /* count_tokens: the same prompt's tokens; tools add their declaration */
    snprintf(body, sizeof body, "{%s}", conversation);
    code = http(s, NULL, "/v1/messages/count_tokens", body, &out, NULL);
    j = parse(&out);
    KT_CHECK(code == 200 && json_integer_value(json_object_get(j, "input_tokens")) == input &&
                 json_object_size(j) == 1,
             "count_tokens %s, the message's usage %lld", kt_buf_str(&out), (long long)input);
    json_decref(j);
    snprintf(body, sizeof body, "{%s, \"tools\": [{\"name\": \"get_weather\", \"input_schema\": {\"type\": "
                                "\"object\"}}]}", conversation);
    code = http(s, NULL, "/v1/messages/count_tokens", body, &out, NULL);
    j = parse(&out);
    KT_CHECK(code == 200 && json_integer_value(json_object_get(j, "input_tokens")) > input, "with tools: %s",
             kt_buf_str(&out));
    json_decref(j);

    /* stop_sequences: the text before it, and which one */
    code = http(s, NULL, "/v1/messages",
                "{\"model\": \"kimi\", \"max_tokens\": 50, \"stop_sequences\": [\"never\", \"STOP\"], \"messages\": "
                "[{\"role\": \"user\", \"content\": \"x\"}], \"kt_test_forced_output\": \"abc STOP def<|im_end|>\"}",
                &out, NULL);
    j = parse(&out);
    KT_CHECK(code == 200 && strcmp(str(j, "stop_reason"), "stop_sequence") == 0 &&
                 strcmp(str(j, "stop_sequence"), "STOP") == 0 &&
                 strcmp(str(json_array_get(json_object_get(j, "content"), 0), "text"), "abc ") == 0,
             "stop_sequence: %s", kt_buf_str(&out));
    json_decref(j);
    /* the model's own end is end_turn, though it is a stop string inside kt */
    code = http(s, NULL, "/v1/messages",
                "{\"model\": \"kimi\", \"max_tokens\": 50, \"messages\": [{\"role\": \"user\", \"content\": \"x\"}], "
                "\"kt_test_forced_output\": \"done.<|im_end|>\"}",
                &out, NULL);
    j = parse(&out);
    KT_CHECK(code == 200 && strcmp(str(j, "stop_reason"), "end_turn") == 0 &&
                 json_is_null(json_object_get(j, "stop_sequence")) &&
                 strcmp(str(json_array_get(json_object_get(j, "content"), 0), "text"), "done.") == 0,
             "end_turn: %s", kt_buf_str(&out));
    json_decref(j);
    kt_buf_free(&out);
}

static void streamed_text_in_anthropic_order(const struct test_server *s)
{
    struct kt_buf out = {0}, headers = {0}, texts[4] = {{0}};
    int code = http(s, "-N", "/v1/messages",
                    "{\"model\": \"kimi\", \"max_tokens\": 50, \"stream\": true, \"messages\": [{\"role\": \"user\", "
                    "\"content\": \"x\"}], \"kt_test_forced_output\": \"Hello, streaming world.<|im_end|>\"}",
                    &out, &headers);
    static struct events ev; /* large: not on the stack */
    events_parse(kt_buf_str(&out), &ev);
    char kinds[128];
    KT_CHECK(code == 200 && strstr(kt_buf_str(&headers), "text/event-stream"), "stream: %d", code);
    if (events_in_order(&ev, kinds, sizeof kinds, texts, 4, "text stream")) {
        const json_t *m = json_object_get(ev.data[0], "message");
        KT_CHECK(strncmp(str(m, "id"), "msg_", 4) == 0 && json_array_size(json_object_get(m, "content")) == 0 &&
                     json_is_null(json_object_get(m, "stop_reason")) &&
                     json_is_integer(json_object_get(json_object_get(m, "usage"), "input_tokens")),
                 "message_start: %.300s", kt_buf_str(&out));
        KT_CHECK(strcmp(kinds, "text") == 0 && strcmp(kt_buf_str(&texts[0]), "Hello, streaming world.") == 0,
                 "blocks '%s', text '%s'", kinds, kt_buf_str(&texts[0]));
        const json_t *cb = json_object_get(ev.data[2], "content_block");
        KT_CHECK(strcmp(str(cb, "text"), "") == 0, "a text block starts empty");
        KT_CHECK(strcmp(stop_reason_of(&ev), "end_turn") == 0 &&
                     json_integer_value(json_object_get(json_object_get(ev.data[ev.n - 2], "usage"),
                                                        "output_tokens")) > 0,
                 "message_delta: %.300s", kt_buf_str(&out));
    }
    events_free(&ev);
    for (int i = 0; i < 4; i++)
        kt_buf_free(&texts[i]);

    /* max_tokens on a stream */
    code = http(s, "-N", "/v1/messages",
                "{\"model\": \"kimi\", \"max_tokens\": 3, \"stream\": true, \"messages\": [{\"role\": \"user\", "
                "\"content\": \"x\"}], \"kt_test_forced_output\": \"a b c d e f g\"}",
                &out, NULL);
    events_parse(kt_buf_str(&out), &ev);
    if (events_in_order(&ev, kinds, sizeof kinds, texts, 4, "max_tokens stream"))
        KT_CHECK(strcmp(stop_reason_of(&ev), "max_tokens") == 0 && texts[0].len > 0 &&
                     strncmp("a b c d e f g", kt_buf_str(&texts[0]), texts[0].len) == 0 &&
                     json_integer_value(json_object_get(json_object_get(ev.data[ev.n - 2], "usage"),
                                                        "output_tokens")) == 3,
                 "max_tokens: '%s' %.300s", kt_buf_str(&texts[0]), kt_buf_str(&out));
    events_free(&ev);
    for (int i = 0; i < 4; i++)
        kt_buf_free(&texts[i]);
    kt_buf_free(&out);
    kt_buf_free(&headers);
}

static const char *const tools_json =
    "\"tools\": [{\"name\": \"get_weather\", \"description\": \"Weather of a city\", \"input_schema\": {\"type\": "
    "\"object\", \"properties\": {\"city\": {\"type\": \"string\"}}, \"required\": [\"city\"]}}]";
static const char *const forced_call =
    "\"kt_test_forced_output\": \"<think>need the tool</think>Checking.<|tool_calls_section_begin|><|tool_call_begin|>"
    "functions.get_weather:0<|tool_call_argument_begin|>{\\\"city\\\": \\\"Paris\\\"}<|tool_call_end|>"
    "<|tool_calls_section_end|><|im_end|>\"";

static void tool_use_out_and_tool_result_in(const struct test_server *s)
{
    struct kt_buf out = {0}, texts[4] = {{0}};
    char body[2048];
    snprintf(body, sizeof body, "{\"model\": \"kimi\", \"max_tokens\": 100, \"messages\": [{\"role\": \"user\", "
                                "\"content\": \"Weather in Paris?\"}], %s, %s}", tools_json, forced_call);
    int code = http(s, NULL, "/v1/messages", body, &out, NULL);
    json_t *j = parse(&out);
    json_t *content = json_object_get(j, "content");
    json_t *think = json_array_get(content, 0), *text = json_array_get(content, 1), *use = json_array_get(content, 2);
    KT_CHECK(code == 200 && json_array_size(content) == 3 && strcmp(str(j, "stop_reason"), "tool_use") == 0,
             "tool_use: %s", kt_buf_str(&out));
    KT_CHECK(strcmp(str(think, "type"), "thinking") == 0 && strcmp(str(think, "thinking"), "need the tool") == 0 &&
                 json_is_string(json_object_get(think, "signature")),
             "thinking block: %s", kt_buf_str(&out));
    KT_CHECK(strcmp(str(text, "type"), "text") == 0 && strcmp(str(text, "text"), "Checking.") == 0, "text block");
    json_t *want_input = json_pack("{s:s}", "city", "Paris");
    KT_CHECK(strcmp(str(use, "type"), "tool_use") == 0 && strncmp(str(use, "id"), "toolu_", 6) == 0 &&
                 strcmp(str(use, "name"), "get_weather") == 0 &&
                 strcmp(str(json_object_get(use, "caller"), "type"), "direct") == 0 &&
                 json_equal(json_object_get(use, "input"), want_input),
             "tool_use block: %s", kt_buf_str(&out));
    char id[128];
    snprintf(id, sizeof id, "%s", str(use, "id"));
    json_decref(j);

    /* the same, streamed: thinking (with its signature), text, tool_use with the input in one piece */
    snprintf(body, sizeof body, "{\"model\": \"kimi\", \"max_tokens\": 100, \"stream\": true, \"messages\": "
                                "[{\"role\": \"user\", \"content\": \"Weather in Paris?\"}], %s, %s}",
             tools_json, forced_call);
    code = http(s, "-N", "/v1/messages", body, &out, NULL);
    static struct events ev; /* large: not on the stack */
    events_parse(kt_buf_str(&out), &ev);
    char kinds[128];
    if (events_in_order(&ev, kinds, sizeof kinds, texts, 4, "tool stream")) {
        KT_CHECK(strcmp(kinds, "thinking,text,tool_use") == 0, "blocks: %s", kinds);
        KT_CHECK(strcmp(kt_buf_str(&texts[0]), "need the tool") == 0 && strcmp(kt_buf_str(&texts[1]), "Checking.") == 0,
                 "thinking '%s', text '%s'", kt_buf_str(&texts[0]), kt_buf_str(&texts[1]));
        json_t *input = json_loads(kt_buf_str(&texts[2]), 0, NULL);
        KT_CHECK(json_equal(input, want_input), "partial_json joined: '%s'", kt_buf_str(&texts[2]));
        json_decref(input);
        KT_CHECK(strcmp(stop_reason_of(&ev), "tool_use") == 0, "stop_reason %s", stop_reason_of(&ev));
        bool signature = false, tool_start_ok = false;
        for (size_t i = 0; i < ev.n; i++) {
            const json_t *d = json_object_get(ev.data[i], "delta");
            signature = signature || strcmp(str(d, "type"), "signature_delta") == 0;
            const json_t *cb = json_object_get(ev.data[i], "content_block");
            if (strcmp(str(cb, "type"), "tool_use") == 0)
                tool_start_ok = strcmp(str(cb, "id"), id) == 0 && strcmp(str(cb, "name"), "get_weather") == 0 &&
                                json_object_size(json_object_get(cb, "input")) == 0;
        }
        KT_CHECK(signature && tool_start_ok, "signature_delta %d, tool_use start (same id, empty input) %d", signature,
                 tool_start_ok);
    }
    events_free(&ev);
    for (int i = 0; i < 4; i++)
        kt_buf_free(&texts[i]);
    json_decref(want_input);

    /* the result goes back with the id kt gave: it renders as the model's own id */
    const char *round = "{\"model\": \"kimi\", %s\"messages\": [{\"role\": \"user\", \"content\": \"Weather in Paris?\"}, "
                        "{\"role\": \"assistant\", \"content\": [{\"type\": \"text\", \"text\": \"Checking.\"}, "
                        "{\"type\": \"tool_use\", \"id\": \"%s\", \"name\": \"get_weather\", \"input\": {\"city\": "
                        "\"Paris\"}}]}, {\"role\": \"user\", \"content\": [{\"type\": \"tool_result\", \"tool_use_id\": "
                        "\"%s\", \"content\": \"sunny\"}]}], %s%s}";
    snprintf(body, sizeof body, round, "\"max_tokens\": 20, ", id, id, tools_json,
             ", \"kt_test_forced_output\": \"Sunny in Paris.<|im_end|>\"");
    code = http(s, NULL, "/v1/messages", body, &out, NULL);
    j = parse(&out);
    KT_CHECK(code == 200 && strcmp(str(j, "stop_reason"), "end_turn") == 0 &&
                 strcmp(str(json_array_get(json_object_get(j, "content"), 0), "text"), "Sunny in Paris.") == 0,
             "after the tool result: %s", kt_buf_str(&out));
    json_decref(j);
    snprintf(body, sizeof body, round, "", id, id, tools_json, "");
    code = http(s, NULL, "/v1/messages/count_tokens", body, &out, NULL);
    j = parse(&out);
    json_int_t anthropic_count = json_integer_value(json_object_get(j, "input_tokens"));
    json_decref(j);
    /* the OpenAI form of the same conversation, with the model's id, tokenizes alike */
    snprintf(body, sizeof body,
             "{\"messages\": [{\"role\": \"user\", \"content\": \"Weather in Paris?\"}, {\"role\": \"assistant\", "
             "\"content\": \"Checking.\", \"tool_calls\": [{\"id\": \"functions.get_weather:0\", \"type\": "
             "\"function\", \"function\": {\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}}]}, "
             "{\"role\": \"tool\", \"tool_call_id\": \"functions.get_weather:0\", \"content\": \"sunny\"}], "
             "\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": "
             "\"Weather of a city\", \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": "
             "\"string\"}}, \"required\": [\"city\"]}}}]}");
    int code2 = http(s, NULL, "/tokenize", body, &out, NULL);
    j = parse(&out);
    KT_CHECK(code == 200 && code2 == 200 && anthropic_count > 0 &&
                 json_integer_value(json_object_get(j, "count")) == anthropic_count,
             "count_tokens %lld, the OpenAI form's /tokenize %s", (long long)anthropic_count, kt_buf_str(&out));
    json_decref(j);

    /* tool_choice any: the prompt opens the call, the model writes its id and arguments */
    snprintf(body, sizeof body, "{\"model\": \"kimi\", \"max_tokens\": 100, \"messages\": [{\"role\": \"user\", "
                                "\"content\": \"Rome?\"}], %s, \"tool_choice\": {\"type\": \"tool\", \"name\": "
                                "\"get_weather\"}, \"kt_test_forced_output\": \"{\\\"city\\\": \\\"Rome\\\"}"
                                "<|tool_call_end|><|tool_calls_section_end|><|im_end|>\"}", tools_json);
    code = http(s, NULL, "/v1/messages", body, &out, NULL);
    j = parse(&out);
    use = json_array_get(json_object_get(j, "content"), 0);
    KT_CHECK(code == 200 && strcmp(str(use, "type"), "tool_use") == 0 && strcmp(str(use, "name"), "get_weather") == 0 &&
                 strcmp(str(json_object_get(use, "input"), "city"), "Rome") == 0 &&
                 strcmp(str(j, "stop_reason"), "tool_use") == 0,
             "named tool_choice: %s", kt_buf_str(&out));
    json_decref(j);

    /* thinking display "omitted": the block and its signature stay, its text goes */
    snprintf(body, sizeof body, "{\"model\": \"kimi\", \"max_tokens\": 100, \"thinking\": {\"type\": \"adaptive\", "
                                "\"display\": \"omitted\"}, \"messages\": [{\"role\": \"user\", \"content\": \"Weather in "
                                "Paris?\"}], %s, %s}", tools_json, forced_call);
    code = http(s, NULL, "/v1/messages", body, &out, NULL);
    j = parse(&out);
    think = json_array_get(json_object_get(j, "content"), 0);
    KT_CHECK(code == 200 && strcmp(str(think, "type"), "thinking") == 0 && strcmp(str(think, "thinking"), "") == 0 &&
                 strcmp(str(think, "signature"), "kt-serve") == 0 &&
                 strcmp(str(json_array_get(json_object_get(j, "content"), 1), "text"), "Checking.") == 0,
             "omitted thinking: %s", kt_buf_str(&out));
    json_decref(j);
    snprintf(body, sizeof body, "{\"model\": \"kimi\", \"max_tokens\": 100, \"stream\": true, \"thinking\": {\"type\": "
                                "\"adaptive\", \"display\": \"omitted\"}, \"messages\": [{\"role\": \"user\", \"content\": "
                                "\"Weather in Paris?\"}], %s, %s}", tools_json, forced_call);
    code = http(s, "-N", "/v1/messages", body, &out, NULL);
    events_parse(kt_buf_str(&out), &ev);
    if (events_in_order(&ev, kinds, sizeof kinds, texts, 4, "omitted thinking stream"))
        KT_CHECK(strcmp(kinds, "thinking,text,tool_use") == 0 && texts[0].len == 0 && strstr(kt_buf_str(&out),
                 "\"signature_delta\"") && !strstr(kt_buf_str(&out), "thinking_delta"),
                 "omitted thinking, streamed: %s", kinds);
    events_free(&ev);
    for (int i = 0; i < 4; i++)
        kt_buf_free(&texts[i]);

    /* two calls: two tool_use blocks, streamed one after the other; disable_parallel_tool_use keeps the first */
    const char *two = "\"kt_test_forced_output\": \"<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
                      "<|tool_call_argument_begin|>{\\\"city\\\": \\\"Paris\\\"}<|tool_call_end|><|tool_call_begin|>"
                      "functions.get_weather:1<|tool_call_argument_begin|>{\\\"city\\\": \\\"Rome\\\"}<|tool_call_end|>"
                      "<|tool_calls_section_end|><|im_end|>\"";
    for (int disable = 0; disable < 2; disable++) {
        snprintf(body, sizeof body, "{\"model\": \"kimi\", \"max_tokens\": 100, \"stream\": true, \"messages\": "
                                    "[{\"role\": \"user\", \"content\": \"Paris and Rome?\"}], %s, %s%s}", tools_json, two,
                 disable ? ", \"tool_choice\": {\"type\": \"auto\", \"disable_parallel_tool_use\": true}" : "");
        code = http(s, "-N", "/v1/messages", body, &out, NULL);
        events_parse(kt_buf_str(&out), &ev);
        if (events_in_order(&ev, kinds, sizeof kinds, texts, 4, "two calls")) {
            KT_CHECK(strcmp(kinds, disable ? "tool_use" : "tool_use,tool_use") == 0 &&
                         strcmp(kt_buf_str(&texts[0]), "{\"city\":\"Paris\"}") == 0 &&
                         (disable || strcmp(kt_buf_str(&texts[1]), "{\"city\":\"Rome\"}") == 0) &&
                         strcmp(stop_reason_of(&ev), "tool_use") == 0,
                     "%s: blocks %s, inputs '%s' '%s'", disable ? "one call allowed" : "two calls", kinds,
                     kt_buf_str(&texts[0]), kt_buf_str(&texts[1]));
            KT_CHECK(disable || strstr(kt_buf_str(&out), "toolu_kt_functions_2Eget_5Fweather_3A1"), "the second id");
        }
        events_free(&ev);
        for (int i = 0; i < 4; i++)
            kt_buf_free(&texts[i]);
    }

    /* arguments that are no JSON object cannot be a tool_use: they come as text */
    code = http(s, NULL, "/v1/messages",
                "{\"model\": \"kimi\", \"max_tokens\": 100, \"messages\": [{\"role\": \"user\", \"content\": \"x\"}], "
                "\"tools\": [{\"name\": \"f\", \"input_schema\": {\"type\": \"object\"}}], \"kt_test_forced_output\": "
                "\"<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>[1, 2"
                "<|tool_call_end|><|tool_calls_section_end|><|im_end|>\"}",
                &out, NULL);
    j = parse(&out);
    KT_CHECK(code == 200 && strcmp(str(j, "stop_reason"), "end_turn") == 0 &&
                 strcmp(str(json_array_get(json_object_get(j, "content"), 0), "text"), "[1, 2") == 0,
             "bad arguments: %s", kt_buf_str(&out));
    json_decref(j);
    kt_buf_free(&out);
}

/* A quiet stream (a long prefill) pings with Anthropic's ping event, never an SSE comment. */
static void quiet_streams_ping(const struct test_server *s)
{
    struct kt_buf body = {0}, out = {0}, texts[4] = {{0}};
    kt_buf_puts(&body, "{\"model\": \"kimi\", \"max_tokens\": 2, \"stream\": true, \"messages\": [{\"role\": \"user\", "
                       "\"content\": \"");
    for (int i = 0; i < 150; i++) /* ~600 tokens: 40 steps of 16 */
        kt_buf_puts(&body, "river stone ");
    kt_buf_puts(&body, "\"}], \"kt_test_forced_output\": \"a b\"}");
    int code = http(s, "-N", "/v1/messages", kt_buf_str(&body), &out, NULL);
    static struct events ev; /* large: not on the stack */
    events_parse(kt_buf_str(&out), &ev);
    size_t pings = ev.later_pings + (ev.n > 1 && strcmp(ev.names[1], "ping") == 0);
    bool comment = strncmp(kt_buf_str(&out), ":", 1) == 0 || strstr(kt_buf_str(&out), "\n:");
    KT_CHECK(code == 200 && ev.well_formed && pings >= 2 && !comment,
             "%zu ping events during a %zu-byte prompt's prefill: %.400s", pings, body.len, kt_buf_str(&out));
    char kinds[64];
    events_in_order(&ev, kinds, sizeof kinds, texts, 4, "a stream with pings");
    events_free(&ev);
    for (int i = 0; i < 4; i++)
        kt_buf_free(&texts[i]);
    kt_buf_free(&body);
    kt_buf_free(&out);
}

static void errors_in_anthropic_shape(const struct test_server *s)
{
    const char *m = "/v1/messages";
    expect_error(s, NULL, m, "{", 400, "invalid_request_error", "not valid JSON");
    expect_error(s, NULL, m, "{\"model\": \"kimi\", \"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}", 400,
                 "invalid_request_error", "max_tokens: Field required");
    expect_error(s, NULL, m,
                 "{\"model\": \"kimi\", \"max_tokens\": 4, \"frequency_penalty\": 1, \"messages\": [{\"role\": "
                 "\"user\", \"content\": \"x\"}]}",
                 400, "invalid_request_error", "frequency_penalty: Extra inputs are not permitted");
    expect_error(s, NULL, m,
                 "{\"model\": \"claude-sonnet-4-5\", \"max_tokens\": 4, \"messages\": [{\"role\": \"user\", "
                 "\"content\": \"x\"}]}",
                 404, "not_found_error", "claude-sonnet-4-5");
    expect_error(s, NULL, "/v1/messages/count_tokens",
                 "{\"model\": \"claude-sonnet-4-5\", \"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}", 404,
                 "not_found_error", "claude-sonnet-4-5");
    expect_error(s, NULL, m,
                 "{\"model\": \"kimi\", \"max_tokens\": 100000, \"messages\": [{\"role\": \"user\", \"content\": "
                 "\"x\"}]}",
                 400, "invalid_request_error", "maximum context length");
    expect_error(s, NULL, m, NULL, 405, "invalid_request_error", "use POST");
    expect_error(s, "-X POST", "/v1/messages/batches", "{}", 404, "not_found_error", "no route");
}

/* DeepSeek's family: made-up call ids round-trip, <think> is a thinking block, thinking disabled keeps it text. */
static void deepseek_tool_use_and_thinking(void)
{
    struct test_server s;
    if (!server_start(&s, deepseek, "-t 2 -q --served-model-name ds --test-forced-output", true))
        return;
    struct kt_buf out = {0};
    const char *tool = "\"tools\": [{\"name\": \"get_time\", \"input_schema\": {\"type\": \"object\"}}]";
    char body[2048];
    snprintf(body, sizeof body,
             "{\"model\": \"ds\", \"max_tokens\": 100, \"messages\": [{\"role\": \"user\", \"content\": \"time?\"}], %s, "
             "\"kt_test_forced_output\": \"<think>hm</think><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function"
             "<｜tool▁sep｜>get_time\\n```json\\n{}\\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜><｜end▁of▁sentence｜>\"}",
             tool);
    int code = http(&s, NULL, "/v1/messages", body, &out, NULL);
    json_t *j = parse(&out);
    json_t *content = json_object_get(j, "content");
    json_t *think = json_array_get(content, 0), *use = json_array_get(content, 1);
    KT_CHECK(code == 200 && json_array_size(content) == 2 && strcmp(str(think, "thinking"), "hm") == 0 &&
                 strcmp(str(use, "name"), "get_time") == 0 && json_object_size(json_object_get(use, "input")) == 0 &&
                 strncmp(str(use, "id"), "toolu_kt_call_5F", 16) == 0 && strcmp(str(j, "stop_reason"), "tool_use") == 0,
             "DeepSeek tool_use: %s", kt_buf_str(&out));
    char id[160];
    snprintf(id, sizeof id, "%s", str(use, "id"));
    char *model_id = kt_anthropic_model_tool_id(id);
    KT_CHECK(model_id && strncmp(model_id, "call_", 5) == 0, "the id back: %s", model_id ? model_id : "");
    free(model_id);
    json_decref(j);
    snprintf(body, sizeof body,
             "{\"model\": \"ds\", \"max_tokens\": 10, \"messages\": [{\"role\": \"user\", \"content\": \"time?\"}, "
             "{\"role\": \"assistant\", \"content\": [{\"type\": \"tool_use\", \"id\": \"%s\", \"name\": \"get_time\", "
             "\"input\": {}}]}, {\"role\": \"user\", \"content\": [{\"type\": \"tool_result\", \"tool_use_id\": \"%s\", "
             "\"content\": \"noon\"}]}], %s, \"kt_test_forced_output\": \"Noon.<｜end▁of▁sentence｜>\"}",
             id, id, tool);
    code = http(&s, NULL, "/v1/messages", body, &out, NULL);
    j = parse(&out);
    KT_CHECK(code == 200 && strcmp(str(json_array_get(json_object_get(j, "content"), 0), "text"), "Noon.") == 0 &&
                 strcmp(str(j, "stop_reason"), "end_turn") == 0,
             "after the result: %s", kt_buf_str(&out));
    json_decref(j);
    code = http(&s, NULL, "/v1/messages",
                "{\"model\": \"ds\", \"max_tokens\": 10, \"thinking\": {\"type\": \"disabled\"}, \"messages\": "
                "[{\"role\": \"user\", \"content\": \"x\"}], \"kt_test_forced_output\": \"<think>a</think>b"
                "<｜end▁of▁sentence｜>\"}",
                &out, NULL);
    j = parse(&out);
    content = json_object_get(j, "content");
    KT_CHECK(code == 200 && json_array_size(content) == 1 &&
                 strcmp(str(json_array_get(content, 0), "text"), "<think>a</think>b") == 0,
             "thinking disabled: no thinking block: %s", kt_buf_str(&out));
    json_decref(j);
    kt_buf_free(&out);
    KT_CHECK(server_stop(&s) == 0, "exit status");
}

/* thinking.enabled.budget_tokens is kept for the grammar, which closes the block after that many tokens:
 * a greedy random model, which would otherwise reason until max_tokens, answers after at most the budget. */
static void thinking_budget_closes_the_block(void)
{
    struct kt_api_request r;
    if (parse_ok("{\"model\": \"m\", \"max_tokens\": 5000, \"thinking\": {\"type\": \"enabled\", \"budget_tokens\": "
                 "2048}, \"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}",
                 &r)) {
        KT_CHECK(r.thinking_budget == 2048 && r.thinking == KT_CHAT_THINKING_ON, "budget %u", r.thinking_budget);
        kt_api_request_free(&r);
    }
    if (parse_ok("{\"model\": \"m\", \"max_tokens\": 5, \"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}", &r)) {
        KT_CHECK(r.thinking_budget == 0, "no budget without thinking");
        kt_api_request_free(&r);
    }
    static const char *const presets[] = {"tiny-thinking", "tiny-r1"};
    for (size_t p = 0; p < 2; p++) {
        char model[1024], file[64];
        snprintf(file, sizeof file, "anthropic-%s.gguf", presets[p]);
        snprintf(model, sizeof model, "%s", kt_test_path(file));
        struct test_server s;
        if (!make_model(model, presets[p], NULL) || !server_start(&s, model, "-t 2 -q --served-model-name m", true)) {
            KT_CHECK(false, "%s: no server", presets[p]);
            continue;
        }
        struct kt_buf out = {0};
        int code = http(&s, NULL, "/v1/messages",
                        "{\"model\": \"m\", \"max_tokens\": 1100, \"temperature\": 0, \"thinking\": {\"type\": "
                        "\"enabled\", \"budget_tokens\": 1024}, \"messages\": [{\"role\": \"user\", \"content\": "
                        "\"Think about rivers.\"}]}",
                        &out, NULL);
        json_t *j = parse(&out);
        const json_t *content = json_object_get(j, "content"), *think = json_array_get(content, 0);
        const json_t *text = json_array_get(content, 1);
        const char *stop = str(j, "stop_reason");
        KT_CHECK(code == 200 && strcmp(str(think, "type"), "thinking") == 0 && strlen(str(think, "thinking")) > 0,
                 "%s: a thinking block first: %.300s", presets[p], kt_buf_str(&out));
        /* closed within the budget: an answer follows, or the turn ended right after the block */
        KT_CHECK((text && strcmp(str(text, "type"), "text") == 0) || strcmp(stop, "end_turn") == 0,
                 "%s: the block was not closed (stop_reason %s, %zu blocks, %lld output tokens)", presets[p], stop,
                 json_array_size(content),
                 (long long)json_integer_value(json_object_get(json_object_get(j, "usage"), "output_tokens")));
        json_decref(j);
        kt_buf_free(&out);
        KT_CHECK(server_stop(&s) == 0, "exit status");
        unlink(model);
    }
}

static void api_key_as_x_api_key(void)
{
    struct test_server s;
    if (!server_start(&s, kimi, "-t 1 -q --served-model-name kimi --api-key sesame", true))
        return;
    const char *body = "{\"model\": \"kimi\", \"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}";
    expect_error(&s, NULL, "/v1/messages/count_tokens", body, 401, "authentication_error", "x-api-key");
    expect_error(&s, "-H 'x-api-key: sesam'", "/v1/messages/count_tokens", body, 401, "authentication_error", "key");
    KT_CHECK(http(&s, "-H 'x-api-key: sesame'", "/v1/messages/count_tokens", body, NULL, NULL) == 200, "x-api-key");
    KT_CHECK(http(&s, "-H 'Authorization: Bearer sesame'", "/v1/messages/count_tokens", body, NULL, NULL) == 200,
             "a bearer token");
    KT_CHECK(http(&s, "-H 'x-api-key: sesame'", "/v1/models", NULL, NULL, NULL) == 200, "x-api-key on the OpenAI routes");
    KT_CHECK(server_stop(&s) == 0, "exit status");
}

/* A stream the server ended: its last event is an error, and there is no message_stop. */
static void check_ended_stream(const char *t, const char *what, const char *type)
{
    static struct events ev; /* large: not on the stack */
    events_parse(t, &ev);
    bool stop = false;
    for (size_t i = 0; i < ev.n; i++)
        stop = stop || strcmp(ev.names[i], "message_stop") == 0 || strcmp(ev.names[i], "message_delta") == 0;
    const json_t *last = ev.n ? ev.data[ev.n - 1] : NULL;
    KT_CHECK(ev.well_formed && ev.n >= 3 && strcmp(ev.names[0], "message_start") == 0 && !stop &&
                 strcmp(ev.names[ev.n - 1], "error") == 0 &&
                 strcmp(str(json_object_get(last, "error"), "type"), type) == 0,
             "%s: must end with an error event (%s) and no message_stop: ...%.600s", what, type,
             strlen(t) > 600 ? t + strlen(t) - 600 : t);
    events_free(&ev);
}

static void long_forced_body(char *body, size_t size, const char *extra)
{
    struct kt_buf b = {0};
    kt_buf_printf(&b, "{\"model\": \"kimi\", \"max_tokens\": 4000, \"stream\": true%s, \"messages\": [{\"role\": "
                      "\"user\", \"content\": \"x\"}], \"kt_test_forced_output\": \"", extra);
    for (int i = 0; i < 1500; i++)
        kt_buf_puts(&b, "river ");
    kt_buf_puts(&b, "\"}");
    snprintf(body, size, "%s", kt_buf_str(&b));
    kt_buf_free(&b);
}

static void server_ended_streams_end_with_an_error_event(void)
{
    struct test_server s;
    if (!server_start(&s, kimi,
                      "-t 1 -q --served-model-name kimi --request-timeout 1 --ctx 8192 --test-forced-output "
                      "--shutdown-timeout 1",
                      true))
        return;
    static char body[16384];
    long_forced_body(body, sizeof body, "");
    struct kt_buf out = {0};
    KT_CHECK(http(&s, "-N", "/v1/messages", body, &out, NULL) == 200, "stream: %.300s", kt_buf_str(&out));
    check_ended_stream(kt_buf_str(&out), "a timed-out stream", "timeout_error");
    kt_buf_free(&out);
    KT_CHECK(server_stop(&s) == 0, "exit status");

    /* drained: SIGTERM with a stream still running past --shutdown-timeout */
    if (!server_start(&s, kimi, "-t 1 -q --served-model-name kimi --ctx 8192 --test-forced-output --shutdown-timeout 1",
                      true))
        return;
    char file[1024], req[1024];
    snprintf(file, sizeof file, "%s", kt_test_path("drained-messages"));
    snprintf(req, sizeof req, "%s", kt_test_path("drained-messages.json"));
    FILE *f = fopen(req, "wb");
    if (f) {
        fputs(body, f);
        fclose(f);
    }
    unlink(file);
    kt_test_system("curl -sN --max-time 120 -o %s --data-binary @%s http://127.0.0.1:%d/v1/messages &", file, req,
                   s.port);
    size_t len = 0;
    char *text = NULL;
    for (double t0 = harness_now(); harness_now() - t0 < 30 && !(text && strstr(text, "content_block_delta"));
         usleep(20000)) {
        free(text);
        text = kt_test_read_file(file, &len);
    }
    KT_CHECK(text && strstr(text, "content_block_delta"), "the stream never began");
    free(text);
    text = NULL;
    KT_CHECK(server_stop(&s) == 0, "exit status after the drain");
    for (double t0 = harness_now(); harness_now() - t0 < 20; usleep(50000)) {
        free(text);
        text = kt_test_read_file(file, &len);
        if (text && strstr(text, "event: error"))
            break;
    }
    usleep(200000);
    free(text);
    text = kt_test_read_file(file, &len);
    check_ended_stream(text ? text : "", "a drained stream", "overloaded_error");
    free(text);
    unlink(file), unlink(req);
}

int main(void)
{
    KT_RUN(conversation_maps_onto_the_chat_messages);
    KT_RUN(tool_ids_round_trip);
    KT_RUN(malformed_requests_are_refused_as_anthropic_does);
    if (!have_curl())
        return kt_test_skip("curl is not installed (the HTTP cases need it)");
    snprintf(kimi, sizeof kimi, "%s", kt_test_path("anthropic-kimi.gguf"));
    snprintf(deepseek, sizeof deepseek, "%s", kt_test_path("anthropic-deepseek.gguf"));
    if (!make_model(kimi, "tiny", NULL) || !make_model(deepseek, "tiny-v3", NULL)) {
        KT_CHECK(false, "kt-synth failed");
        return kt_test_finish();
    }
    struct test_server s;
    if (server_start(&s, kimi, "-t 2 -q --served-model-name kimi --ctx 8192 --test-forced-output --max-batch-tokens 16 "
                                 "--sse-ping-interval 0.02",
                     true)) {
        RUN_WITH(message_object, &s);
        RUN_WITH(streamed_text_in_anthropic_order, &s);
        RUN_WITH(tool_use_out_and_tool_result_in, &s);
        RUN_WITH(quiet_streams_ping, &s);
        RUN_WITH(errors_in_anthropic_shape, &s);
        KT_CHECK(server_stop(&s) == 0, "exit status");
    }
    KT_RUN(deepseek_tool_use_and_thinking);
    KT_RUN(thinking_budget_closes_the_block);
    KT_RUN(api_key_as_x_api_key);
    KT_RUN(server_ended_streams_end_with_an_error_event);
    unlink(kimi), unlink(deepseek);
    return kt_test_finish();
}
