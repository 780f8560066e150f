/*
 * test_kt_serve_structured.c - structured outputs end to end over HTTP, on
 * tiny models with random weights (whose unconstrained output is noise, so
 * whatever well-formed output comes back is the grammar's doing):
 * response_format json_schema returns JSON valid against the schema, greedy
 * and sampled, in every choice and streamed; json_object an object; vLLM's
 * guided_json (also on /v1/completions) and structured_outputs the same;
 * guided_regex and guided_choice give raw text that matches; a
 * schema kt cannot follow is a 400 naming where; a pattern holds (POSIX
 * regexec checks it); tool_choice "required" and
 * a named function give a parsed call of a declared tool whose arguments
 * validate against its parameters, in Kimi-K2's and DeepSeek's syntax;
 * thinking models (Kimi-K2-Thinking, DeepSeek-R1 and its later revision,
 * whose prompt opens the block) reason in free text and the schema holds
 * for the content after </think>.
 */
#include <jansson.h>
#include <regex.h>
#include <stdlib.h>
#include <string.h>

#include "schema_validate.h"
#include "serve_harness.h"

static char kimi[1024], deepseek[1024];

static json_t *post(const struct test_server *s, const char *path, const char *body, int *code)
{
    struct kt_buf out = {0};
    *code = http(s, NULL, path, body, &out, NULL);
    json_error_t je;
    json_t *j = json_loads(kt_buf_str(&out), 0, &je);
    KT_CHECK(j != NULL, "not JSON: %.300s", kt_buf_str(&out));
    if (*code != 200)
        fprintf(stderr, "%s -> %d: %.400s\n", path, *code, kt_buf_str(&out));
    kt_buf_free(&out);
    return j;
}

static const char *str(const json_t *o, const char *key)
{
    const char *v = json_string_value(json_object_get(o, key));
    return v ? v : "";
}

/* content (or completion text) parses and validates; finish_reason is stop */
static void check_valid(const json_t *choice, const char *text, const json_t *schema, const char *what)
{
    json_error_t je;
    json_t *v = json_loads(text, JSON_DECODE_ANY, &je);
    KT_CHECK(v != NULL, "%s: '%.300s' does not parse: %s", what, text, je.text);
    KT_CHECK(!v || validate(schema, schema, v, 0), "%s: '%.300s' does not validate", what, text);
    const json_t *code = json_object_get(v, "code");
    regex_t re;
    if (code && regcomp(&re, "^[A-Z]{2}-[0-9]{3}$", REG_EXTENDED | REG_NOSUB) == 0) {
        KT_CHECK(json_is_string(code) && regexec(&re, json_string_value(code), 0, NULL, 0) == 0,
                 "%s: code '%s' does not match its pattern", what, json_string_value(code));
        regfree(&re);
    }
    KT_CHECK(strcmp(str(choice, "finish_reason"), "stop") == 0, "%s: finish_reason %s ('%.200s')", what,
             str(choice, "finish_reason"), text);
    json_decref(v);
}

static const char *const person =
    "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":12},\"age\":{\"type\":"
    "\"integer\"},\"tags\":{\"type\":\"array\",\"items\":{\"enum\":[\"a\",\"b\",\"c\"]},\"maxItems\":3},\"ok\":"
    "{\"type\":\"boolean\"},\"note\":{\"anyOf\":[{\"type\":\"string\",\"maxLength\":4},{\"type\":\"null\"}]},"
    "\"code\":{\"type\":\"string\",\"pattern\":\"^[A-Z]{2}-[0-9]{3}$\"}},"
    "\"required\":[\"name\",\"age\",\"tags\",\"ok\",\"note\",\"code\"],\"additionalProperties\":false}";

/* '"', ']' and '}' favoured: random weights otherwise write long strings (byte tokens are ids 0..255) */
static const char *const closing_bias = "\"logit_bias\": {\"34\": 4, \"93\": 4, \"125\": 4}";

static void json_schema_output_validates(const struct test_server *s)
{
    json_t *schema = json_loads(person, 0, NULL);
    char body[4096];
    for (int seed = 0; seed < 4; seed++) {
        snprintf(body, sizeof body,
                 "{\"messages\": [{\"role\": \"user\", \"content\": \"A person, please.\"}], \"max_tokens\": 600, "
                 "\"temperature\": %s, \"seed\": %d, \"n\": %d, \"response_format\": {\"type\": \"json_schema\", "
                 "\"json_schema\": {\"name\": \"person\", \"strict\": true, \"schema\": %s}}}",
                 seed == 0 ? "0" : "1", seed, seed == 3 ? 2 : 1, person);
        int code;
        json_t *j = post(s, "/v1/chat/completions", body, &code);
        KT_CHECK(code == 200, "status %d", code);
        json_t *choices = json_object_get(j, "choices");
        KT_CHECK(json_array_size(choices) == (seed == 3 ? 2u : 1u), "choices");
        for (size_t c = 0; c < json_array_size(choices); c++) {
            json_t *choice = json_array_get(choices, c);
            char what[64];
            snprintf(what, sizeof what, "seed %d choice %zu", seed, c);
            check_valid(choice, str(json_object_get(choice, "message"), "content"), schema, what);
        }
        json_decref(j);
    }
    json_decref(schema);
}

static void json_schema_streamed_output_validates(const struct test_server *s)
{
    char body[4096];
    snprintf(body, sizeof body,
             "{\"messages\": [{\"role\": \"user\", \"content\": \"Stream one.\"}], \"max_tokens\": 600, \"stream\": "
             "true, \"seed\": 9, \"response_format\": {\"type\": \"json_schema\", \"json_schema\": {\"name\": \"p\", "
             "\"schema\": %s}}}", person);
    struct kt_buf out = {0}, text = {0};
    int code = http(s, "-N", "/v1/chat/completions", body, &out, NULL);
    KT_CHECK(code == 200, "status %d", code);
    const char *finish = NULL;
    json_t *last = NULL;
    for (const char *p = kt_buf_str(&out); (p = strstr(p, "data: ")) != NULL;) {
        p += 6;
        const char *end = strstr(p, "\n\n");
        if (!end || strncmp(p, "[DONE]", 6) == 0)
            break;
        json_t *ev = json_loadb(p, (size_t)(end - p), 0, NULL);
        json_t *choice = json_array_get(json_object_get(ev, "choices"), 0);
        const char *delta = json_string_value(json_object_get(json_object_get(choice, "delta"), "content"));
        if (delta)
            kt_buf_puts(&text, delta);
        if (json_is_string(json_object_get(choice, "finish_reason"))) {
            json_decref(last);
            last = json_incref(choice);
            finish = json_string_value(json_object_get(choice, "finish_reason"));
        }
        json_decref(ev);
        p = end;
    }
    json_t *schema = json_loads(person, 0, NULL);
    KT_CHECK(finish != NULL, "no finish_reason: %.300s", kt_buf_str(&out));
    if (last)
        check_valid(last, kt_buf_str(&text), schema, "streamed");
    json_decref(last);
    json_decref(schema);
    kt_buf_free(&out);
    kt_buf_free(&text);
}

static void json_object_output_is_an_object(const struct test_server *s)
{
    int stopped = 0;
    for (int seed = 0; seed < 3; seed++) {
        char body[1024];
        snprintf(body, sizeof body,
                 "{\"messages\": [{\"role\": \"user\", \"content\": \"JSON please\"}], \"max_tokens\": 400, \"seed\": "
                 "%d, %s, \"response_format\": {\"type\": \"json_object\"}}", seed, closing_bias);
        int code;
        json_t *j = post(s, "/v1/chat/completions", body, &code);
        json_t *choice = json_array_get(json_object_get(j, "choices"), 0);
        const char *content = str(json_object_get(choice, "message"), "content");
        KT_CHECK(code == 200 && content[0] == '{', "'%.200s'", content);
        if (strcmp(str(choice, "finish_reason"), "stop") == 0) {
            stopped++;
            json_t *v = json_loads(content, 0, NULL);
            KT_CHECK(json_is_object(v), "'%.300s' is no JSON object", content);
            json_decref(v);
        }
        json_decref(j);
    }
    KT_CHECK(stopped >= 2, "only %d of 3 objects ended within 400 tokens", stopped);
}

static void vllm_fields_map_onto_the_same(const struct test_server *s)
{
    const char *arr = "{\"type\":\"array\",\"items\":{\"type\":\"integer\"},\"minItems\":1,\"maxItems\":3}";
    json_t *schema = json_loads(arr, 0, NULL);
    char body[2048];
    int code;
    snprintf(body, sizeof body, "{\"prompt\": \"Numbers:\", \"max_tokens\": 200, \"guided_json\": %s}", arr);
    json_t *j = post(s, "/v1/completions", body, &code);
    json_t *choice = json_array_get(json_object_get(j, "choices"), 0);
    KT_CHECK(code == 200, "completions guided_json");
    check_valid(choice, str(choice, "text"), schema, "completions guided_json");
    json_decref(j);
    /* guided_json as JSON text */
    snprintf(body, sizeof body,
             "{\"messages\": [{\"role\": \"user\", \"content\": \"n\"}], \"max_tokens\": 200, \"seed\": 3, "
             "\"guided_json\": \"%s\"}", "{\\\"type\\\":\\\"array\\\",\\\"items\\\":{\\\"type\\\":\\\"integer\\\"},"
             "\\\"minItems\\\":1,\\\"maxItems\\\":3}");
    j = post(s, "/v1/chat/completions", body, &code);
    choice = json_array_get(json_object_get(j, "choices"), 0);
    KT_CHECK(code == 200, "chat guided_json text");
    check_valid(choice, str(json_object_get(choice, "message"), "content"), schema, "chat guided_json text");
    json_decref(j);
    snprintf(body, sizeof body,
             "{\"messages\": [{\"role\": \"user\", \"content\": \"n\"}], \"max_tokens\": 200, \"temperature\": 0, "
             "\"structured_outputs\": {\"json\": %s}}", arr);
    j = post(s, "/v1/chat/completions", body, &code);
    choice = json_array_get(json_object_get(j, "choices"), 0);
    KT_CHECK(code == 200, "structured_outputs");
    check_valid(choice, str(json_object_get(choice, "message"), "content"), schema, "structured_outputs");
    json_decref(j);
    json_decref(schema);
}

static void regex_and_choice_constrain_raw_text(const struct test_server *s)
{
    regex_t re;
    KT_CHECK(regcomp(&re, "^[A-Z][a-z]{1,6}-[0-9]{2}$", REG_EXTENDED | REG_NOSUB) == 0, "regcomp");
    static const char *const bodies[] = {
        "{\"messages\": [{\"role\": \"user\", \"content\": \"id?\"}], \"max_tokens\": 60, \"seed\": 1, "
        "\"guided_regex\": \"[A-Z][a-z]{1,6}-[0-9]{2}\"}",
        "{\"messages\": [{\"role\": \"user\", \"content\": \"id?\"}], \"max_tokens\": 60, \"temperature\": 0, "
        "\"structured_outputs\": {\"regex\": \"[A-Z][a-z]{1,6}-[0-9]{2}\"}}",
    };
    for (int i = 0; i < 2; i++) {
        int code;
        json_t *j = post(s, "/v1/chat/completions", bodies[i], &code);
        json_t *choice = json_array_get(json_object_get(j, "choices"), 0);
        const char *text = str(json_object_get(choice, "message"), "content");
        KT_CHECK(code == 200 && regexec(&re, text, 0, NULL, 0) == 0, "regex %d: '%s'", i, text);
        KT_CHECK(strcmp(str(choice, "finish_reason"), "stop") == 0, "regex %d: %s", i, str(choice, "finish_reason"));
        json_decref(j);
    }
    regfree(&re);
    static const char *const choice_bodies[] = {
        "{\"prompt\": \"Pick:\", \"max_tokens\": 20, \"seed\": 4, \"guided_choice\": [\"left\", \"right\", \"lefty\"]}",
        "{\"messages\": [{\"role\": \"user\", \"content\": \"?\"}], \"max_tokens\": 20, \"seed\": 5, "
        "\"structured_outputs\": {\"choice\": [\"left\", \"right\", \"lefty\"]}}",
    };
    for (int i = 0; i < 2; i++) {
        int code;
        json_t *j = post(s, i == 0 ? "/v1/completions" : "/v1/chat/completions", choice_bodies[i], &code);
        json_t *choice = json_array_get(json_object_get(j, "choices"), 0);
        const char *text = i == 0 ? str(choice, "text") : str(json_object_get(choice, "message"), "content");
        KT_CHECK(code == 200 && (!strcmp(text, "left") || !strcmp(text, "right") || !strcmp(text, "lefty")),
                 "choice %d: '%s'", i, text);
        json_decref(j);
    }
}

static void bad_schemas_are_400s_naming_the_place(const struct test_server *s)
{
    static const struct {
        const char *fields, *param, *message;
    } cases[] = {
        {"\"response_format\": {\"type\": \"json_schema\", \"json_schema\": {\"name\": \"x\", \"schema\": {\"type\": "
         "\"object\", \"properties\": {\"x\": {\"type\": \"string\", \"pattern\": \"(?=a)\"}}}}}",
         "response_format", "#/properties/x/pattern: pattern: lookaround"},
        {"\"response_format\": {\"type\": \"json_schema\", \"json_schema\": {\"name\": \"x\", \"schema\": {\"type\": "
         "\"obj\"}}}", "response_format", "#/type: unknown type 'obj'"},
        {"\"response_format\": {\"type\": \"json_schema\", \"json_schema\": {\"name\": \"x\"}}", "response_format",
         "schema is required"},
        {"\"response_format\": {\"type\": \"regex\"}", "response_format", "'regex' is not supported"},
        {"\"guided_json\": {\"$ref\": \"#/$defs/none\"}", "guided_json", "#/$ref: '#/$defs/none' does not resolve"},
        {"\"guided_json\": \"{not json\"", "guided_json", "not valid JSON"},
        {"\"structured_outputs\": {\"grammar\": \"root ::= x\"}", "structured_outputs", "structured_outputs.grammar"},
        {"\"guided_grammar\": \"root ::= x\"", "guided_grammar", "not supported"},
        {"\"guided_regex\": \"a(b\"", "guided_regex", "without its ')'"},
        {"\"guided_choice\": [\"a\", \"a\"]", "guided_choice", "repeats"},
        {"\"guided_json\": {}, \"response_format\": {\"type\": \"json_object\"}", "response_format", "give one of"},
        {"\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": {\"type\": \"object\", "
         "\"properties\": {\"d\": {\"type\": \"string\", \"format\": \"date\"}}}}}], \"tool_choice\": \"required\"",
         "tools[0]", "#/properties/d/format"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char body[2048];
        snprintf(body, sizeof body, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"max_tokens\": 4, %s}",
                 cases[i].fields);
        int code;
        json_t *j = post(s, "/v1/chat/completions", body, &code);
        json_t *e = json_object_get(j, "error");
        KT_CHECK(code == 400, "%s: status %d", cases[i].fields, code);
        KT_CHECK(strcmp(str(e, "param"), cases[i].param) == 0, "%s: param '%s'", cases[i].fields, str(e, "param"));
        KT_CHECK(strstr(str(e, "message"), cases[i].message) != NULL, "%s: message '%s'", cases[i].fields,
                 str(e, "message"));
        json_decref(j);
    }
    /* auto tool choice with such parameters is no error: nothing is forced */
    int code;
    json_t *j = post(s, "/v1/chat/completions",
                     "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"max_tokens\": 2, \"tools\": [{\"type\": "
                     "\"function\", \"function\": {\"name\": \"f\", \"parameters\": {\"type\": \"string\", \"format\": "
                     "\"date\"}}}]}", &code);
    KT_CHECK(code == 200, "auto tool choice: status %d", code);
    json_decref(j);
}

static const char *const weather_tools =
    "[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"parameters\": {\"type\": \"object\", "
    "\"properties\": {\"city\": {\"type\": \"string\", \"maxLength\": 8}, \"unit\": {\"enum\": [\"c\", \"f\"]}}, "
    "\"required\": [\"city\", \"unit\"], \"additionalProperties\": false}}}, {\"type\": \"function\", \"function\": "
    "{\"name\": \"get_time\", \"parameters\": {\"type\": \"object\", \"properties\": {\"zone\": {\"type\": \"integer\"}}, "
    "\"required\": [\"zone\"]}}}]";

/* Every call names a declared tool and its arguments validate against that tool's parameters. */
static void check_calls(const json_t *j, const char *only, bool parallel, const char *what)
{
    json_t *tools = json_loads(weather_tools, 0, NULL);
    json_t *choice = json_array_get(json_object_get(j, "choices"), 0);
    json_t *calls = json_object_get(json_object_get(choice, "message"), "tool_calls");
    KT_CHECK(json_array_size(calls) >= 1, "%s: no tool call: %s", what, json_dumps(choice, 0));
    KT_CHECK(parallel || json_array_size(calls) == 1, "%s: %zu calls", what, json_array_size(calls));
    KT_CHECK(strcmp(str(choice, "finish_reason"), "tool_calls") == 0, "%s: finish_reason %s", what,
             str(choice, "finish_reason"));
    for (size_t i = 0; i < json_array_size(calls); i++) {
        json_t *fn = json_object_get(json_array_get(calls, i), "function");
        const char *name = str(fn, "name");
        if (strncmp(what, "kimi required", 13) == 0) { /* Kimi numbers its calls in the conversation */
            char id[96];
            snprintf(id, sizeof id, "functions.%s:%zu", name, i);
            KT_CHECK(strcmp(str(json_array_get(calls, i), "id"), id) == 0, "%s: id %s, expected %s", what,
                     str(json_array_get(calls, i), "id"), id);
        }
        const json_t *params = NULL;
        for (size_t t = 0; t < json_array_size(tools); t++)
            if (strcmp(str(json_object_get(json_array_get(tools, t), "function"), "name"), name) == 0)
                params = json_object_get(json_object_get(json_array_get(tools, t), "function"), "parameters");
        KT_CHECK(params != NULL, "%s: call of an undeclared tool '%s'", what, name);
        KT_CHECK(!only || strcmp(name, only) == 0, "%s: called '%s', not '%s'", what, name, only);
        json_t *args = json_loads(str(fn, "arguments"), 0, NULL);
        KT_CHECK(args && params && validate(params, params, args, 0), "%s: arguments '%s' of %s do not validate", what,
                 str(fn, "arguments"), name);
        json_decref(args);
    }
    json_decref(tools);
}

static void forced_tool_calls(const struct test_server *s, const char *family)
{
    char body[4096], what[64];
    for (int seed = 0; seed < 3; seed++) {
        snprintf(body, sizeof body,
                 "{\"messages\": [{\"role\": \"user\", \"content\": \"What is the weather?\"}], \"max_tokens\": 300, "
                 "\"seed\": %d, %s, \"tools\": %s, \"tool_choice\": \"required\", \"parallel_tool_calls\": %s}",
                 seed, closing_bias, weather_tools, seed == 2 ? "true" : "false");
        int code;
        json_t *j = post(s, "/v1/chat/completions", body, &code);
        snprintf(what, sizeof what, "%s required, seed %d", family, seed);
        KT_CHECK(code == 200, "%s: status %d", what, code);
        check_calls(j, NULL, seed == 2, what);
        json_decref(j);
        snprintf(body, sizeof body,
                 "{\"messages\": [{\"role\": \"user\", \"content\": \"Time?\"}], \"max_tokens\": 300, \"seed\": %d, %s, "
                 "\"tools\": %s, \"tool_choice\": {\"type\": \"function\", \"function\": {\"name\": \"%s\"}}}",
                 seed, closing_bias, weather_tools, seed == 1 ? "get_weather" : "get_time");
        j = post(s, "/v1/chat/completions", body, &code);
        snprintf(what, sizeof what, "%s named, seed %d", family, seed);
        KT_CHECK(code == 200, "%s: status %d", what, code);
        check_calls(j, seed == 1 ? "get_weather" : "get_time", false, what);
        json_decref(j);
    }
}

static void kimi_tool_choice_forces_a_valid_call(const struct test_server *s)
{
    forced_tool_calls(s, "kimi");
}

static void deepseek_tool_choice_forces_a_valid_call(void)
{
    struct test_server s;
    if (!server_start(&s, deepseek, "-t 2 -q --max-seqs 2 --ctx 4096", true))
        return;
    forced_tool_calls(&s, "deepseek");
    KT_CHECK(server_stop(&s) == 0, "exit status");
}

/* The last token id of text as /tokenize gives it (a special token's id). */
static int last_token(const struct test_server *s, const char *text)
{
    char body[256];
    snprintf(body, sizeof body, "{\"prompt\": \"%s\"}", text);
    int code;
    json_t *j = post(s, "/tokenize", body, &code);
    json_t *tokens = json_object_get(j, "tokens");
    int id = code == 200 && json_array_size(tokens) ? (int)json_integer_value(json_array_get(tokens, json_array_size(tokens) - 1)) : -1;
    json_decref(j);
    return id;
}

/* A thinking model reasons in free text first, then the schema holds for the content after </think>:
 * Kimi-K2-Thinking and DeepSeek-R1 (the model opens the block) and R1's later revision (the prompt opens it). */
static void thinking_models_reason_then_answer_in_the_schema(void)
{
    static const struct {
        const char *preset, *template_file;
    } cases[] = {{"tiny-thinking", NULL}, {"tiny-r1", NULL}, {"tiny-r1", "deepseek-r1-think.jinja"}};
    json_t *schema = json_loads(person, 0, NULL);
    const char *src = getenv("KT_SOURCE_DIR");
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        char model[1024], file[64], args[1400] = "-t 2 -q --ctx 4096";
        snprintf(file, sizeof file, "structured-think-%zu.gguf", c);
        snprintf(model, sizeof model, "%s", kt_test_path(file));
        if (cases[c].template_file)
            snprintf(args, sizeof args, "-t 2 -q --ctx 4096 --chat-template %s/tests/golden/chat/%s", src ? src : ".",
                     cases[c].template_file);
        struct test_server s;
        if (!make_model(model, cases[c].preset, NULL) || !server_start(&s, model, args, true)) {
            KT_CHECK(false, "%s: no server", cases[c].preset);
            continue;
        }
        int open = last_token(&s, "<think>"), close = last_token(&s, "</think>");
        KT_CHECK(open >= 0 && close >= 0 && open != close, "%s: think tokens %d %d", cases[c].preset, open, close);
        for (int seed = 1; seed <= 2; seed++) {
            /* the model is steered into its block (a random one seldom opens it) and, after a while, out */
            char body[4096];
            snprintf(body, sizeof body,
                     "{\"messages\": [{\"role\": \"user\", \"content\": \"A person, please.\"}], \"max_tokens\": 800, "
                     "\"seed\": %d, \"logit_bias\": {\"34\": 4, \"93\": 4, \"125\": 4, \"%d\": 100, \"%d\": 4}, "
                     "\"response_format\": {\"type\": \"json_schema\", \"json_schema\": {\"name\": \"person\", "
                     "\"strict\": true, \"schema\": %s}}}",
                     seed, open, close, person);
            int code;
            json_t *j = post(&s, "/v1/chat/completions", body, &code);
            json_t *choice = json_array_get(json_object_get(j, "choices"), 0);
            const json_t *msg = json_object_get(choice, "message");
            char what[96];
            snprintf(what, sizeof what, "%s%s seed %d", cases[c].preset, cases[c].template_file ? " (r1-think)" : "",
                     seed);
            KT_CHECK(code == 200, "%s: status %d", what, code);
            KT_CHECK(strlen(str(msg, "reasoning_content")) > 0, "%s: no reasoning (%s)", what,
                     json_dumps(j, JSON_COMPACT));
            check_valid(choice, str(msg, "content"), schema, what);
            json_decref(j);
        }
        KT_CHECK(server_stop(&s) == 0, "exit status");
        unlink(model);
    }
    json_decref(schema);
}

int main(void)
{
    if (!have_curl())
        return kt_test_skip("curl is not installed");
    snprintf(kimi, sizeof kimi, "%s", kt_test_path("structured-kimi.gguf"));
    snprintf(deepseek, sizeof deepseek, "%s", kt_test_path("structured-deepseek.gguf"));
    if (!make_model(kimi, "tiny", NULL) || !make_model(deepseek, "tiny-v3", NULL)) {
        KT_CHECK(false, "kt-synth failed");
        return kt_test_finish();
    }
    struct test_server s;
    if (server_start(&s, kimi, "-t 2 -q --max-seqs 2 --ctx 4096", true)) {
        RUN_WITH(json_schema_output_validates, &s);
        RUN_WITH(json_schema_streamed_output_validates, &s);
        RUN_WITH(json_object_output_is_an_object, &s);
        RUN_WITH(vllm_fields_map_onto_the_same, &s);
        RUN_WITH(regex_and_choice_constrain_raw_text, &s);
        RUN_WITH(bad_schemas_are_400s_naming_the_place, &s);
        RUN_WITH(kimi_tool_choice_forces_a_valid_call, &s);
        KT_CHECK(server_stop(&s) == 0, "exit status");
    }
    KT_RUN(deepseek_tool_choice_forces_a_valid_call);
    KT_RUN(thinking_models_reason_then_answer_in_the_schema);
    unlink(kimi), unlink(deepseek);
    return kt_test_finish();
}
