/*
 * test_kt_serve_template_family.c - chat templates kt renders only with its
 * Jinja interpreter (--chat-template) still get their family's tool calls
 * parsed and forced and its stop strings: a community-patched Kimi-K2
 * template (tests/golden/chat), a DeepSeek-R1 template patched here to
 * declare tools, and a template that writes no tool markers at all (the
 * vocabulary's special tokens decide).  DeepSeek-V3.1's template, whose call
 * form kt does not parse, gets a 400 for a forced call instead of a call in
 * the wrong syntax.  Tiny models with random weights: a sampled call that
 * comes back well-formed is the grammar's doing.
 */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "schema_validate.h"
#include "serve_harness.h"

static const char *golden_dir(void)
{
    static char dir[1024];
    const char *src = getenv("KT_SOURCE_DIR");
    snprintf(dir, sizeof dir, "%s/tests/golden/chat", src ? src : "tests");
    return dir;
}

static char *read_golden(const char *name)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/%s", golden_dir(), name);
    size_t len = 0;
    char *text = kt_test_read_file(path, &len);
    KT_CHECK(text != NULL, "cannot read %s", path);
    return text;
}

static bool write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "wb");
    bool ok = f && fputs(text, f) >= 0;
    if (f)
        ok = fclose(f) == 0 && ok;
    KT_CHECK(ok, "cannot write %s", path);
    return ok;
}

/* text with the first `from` replaced by `to`, malloc'd; NULL when from is absent. */
static char *patch(const char *text, const char *from, const char *to)
{
    const char *at = text ? strstr(text, from) : NULL;
    KT_CHECK(at != NULL, "patch: '%s' not found", from);
    if (!at)
        return NULL;
    size_t head = (size_t)(at - text), n = strlen(text) - strlen(from) + strlen(to);
    char *out = malloc(n + 1);
    if (out)
        snprintf(out, n + 1, "%.*s%s%s", (int)head, text, to, at + strlen(from));
    return out;
}

static const char *const weather_tools =
    "[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"parameters\": {\"type\": \"object\", "
    "\"properties\": {\"city\": {\"type\": \"string\", \"maxLength\": 12}}, \"required\": [\"city\"], "
    "\"additionalProperties\": false}}}]";

/* POSTs {messages: [user], tools, ...extra} to /v1/chat/completions; the parsed reply. */
static json_t *chat(const struct test_server *s, const char *extra, int *code)
{
    char body[4096];
    snprintf(body, sizeof body,
             "{\"messages\": [{\"role\": \"user\", \"content\": \"Weather in Paris?\"}], \"tools\": %s, "
             "\"max_tokens\": 400%s%s}",
             weather_tools, extra ? ", " : "", extra ? extra : "");
    struct kt_buf out = {0};
    *code = http(s, NULL, "/v1/chat/completions", body, &out, NULL);
    json_t *j = json_loads(kt_buf_str(&out), 0, NULL);
    KT_CHECK(j != NULL, "not JSON: %.300s", kt_buf_str(&out));
    if (*code != 200)
        fprintf(stderr, "-> %d: %.400s\n", *code, kt_buf_str(&out));
    kt_buf_free(&out);
    return j;
}

static const json_t *message(const json_t *j)
{
    return json_object_get(json_array_get(json_object_get(j, "choices"), 0), "message");
}

static const char *finish(const json_t *j)
{
    const char *f = json_string_value(json_object_get(json_array_get(json_object_get(j, "choices"), 0), "finish_reason"));
    return f ? f : "";
}

static const char *str(const json_t *o, const char *key)
{
    const char *v = json_string_value(json_object_get(o, key));
    return v ? v : "";
}

/* calls of get_weather (one when want_city is given: that forced call) whose arguments parse and validate,
 * their ids as the family makes them (Kimi's "functions.NAME:IDX" written by the model, DeepSeek's made up
 * "call_..."): the syntax the model wrote */
static void check_call(const json_t *j, const char *want_city, const char *id_prefix, const char *what)
{
    const json_t *calls = json_object_get(message(j), "tool_calls");
    size_t n = json_array_size(calls);
    KT_CHECK((want_city ? n == 1 : n >= 1) && strcmp(finish(j), "tool_calls") == 0, "%s: %zu calls, finish %s (%s)",
             what, n, finish(j), json_dumps(j, JSON_COMPACT));
    json_t *tools = json_loads(weather_tools, 0, NULL);
    const json_t *schema = json_object_get(json_object_get(json_array_get(tools, 0), "function"), "parameters");
    for (size_t i = 0; i < n; i++) {
        const json_t *fn = json_object_get(json_array_get(calls, i), "function");
        KT_CHECK(strcmp(str(fn, "name"), "get_weather") == 0, "%s: name '%s'", what, str(fn, "name"));
        const char *id = str(json_array_get(calls, i), "id");
        KT_CHECK(strncmp(id, id_prefix, strlen(id_prefix)) == 0, "%s: id '%s', not the family's '%s...'", what, id,
                 id_prefix);
        json_t *args = json_loads(str(fn, "arguments"), 0, NULL);
        KT_CHECK(args && validate(schema, schema, args, 0), "%s: arguments '%s' do not validate", what,
                 str(fn, "arguments"));
        if (want_city)
            KT_CHECK(strcmp(str(args, "city"), want_city) == 0, "%s: city '%s'", what, str(args, "city"));
        json_decref(args);
    }
    json_decref(tools);
}

/* The family's own call, forced as the model's tokens, comes back parsed; a sampled call under
 * tool_choice "required" is a well-formed call in that syntax. */
static void family_calls_are_parsed_and_forced(const struct test_server *s, const char *forced_call,
                                               const char *id_prefix)
{
    char extra[1024];
    int code;
    snprintf(extra, sizeof extra, "\"kt_test_forced_output\": \"%s\"", forced_call);
    json_t *j = chat(s, extra, &code);
    KT_CHECK(code == 200, "forced call: %d", code);
    check_call(j, "Paris", id_prefix, "forced call");
    json_decref(j);
    for (int seed = 1; seed <= 3; seed++) {
        snprintf(extra, sizeof extra, "\"tool_choice\": \"required\", \"seed\": %d, \"parallel_tool_calls\": %s, "
                 "\"logit_bias\": {\"34\": 4, \"125\": 4}", seed, seed == 3 ? "true" : "false");
        j = chat(s, extra, &code);
        KT_CHECK(code == 200, "required: %d", code);
        char what[32];
        snprintf(what, sizeof what, "required, seed %d", seed);
        check_call(j, NULL, id_prefix, what);
        json_decref(j);
    }
    j = chat(s, "\"tool_choice\": {\"type\": \"function\", \"function\": {\"name\": \"get_weather\"}}, \"seed\": 7, "
                "\"logit_bias\": {\"34\": 4, \"125\": 4}", &code);
    KT_CHECK(code == 200, "named: %d", code);
    check_call(j, NULL, id_prefix, "named");
    json_decref(j);
}

static void a_patched_kimi_template_parses_forces_and_stops(const char *model)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/kimi-k2-instruct-0905-patched.jinja", golden_dir());
    char args[1400];
    snprintf(args, sizeof args, "-t 2 -q --test-forced-output --chat-template %s", path);
    struct test_server s;
    if (!server_start(&s, model, args, true))
        return;
    size_t len;
    char *log = kt_test_read_file(s.log, &len);
    KT_CHECK(log && strstr(log, "interpreter"), "the log says the interpreter renders it: %s", log ? log : "");
    free(log);
    family_calls_are_parsed_and_forced(
        &s, "Let me check.<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
            "<|tool_call_argument_begin|>{\\\"city\\\": \\\"Paris\\\"}<|tool_call_end|><|tool_calls_section_end|>"
            "<|im_end|>",
        "functions.get_weather:");
    /* Kimi's stop strings hold: "[EOS]" as text ends the reply */
    int code;
    json_t *j = chat(&s, "\"kt_test_forced_output\": \"Sunny.[EOS]and more\"", &code);
    KT_CHECK(code == 200 && strcmp(str(message(j), "content"), "Sunny.") == 0 && strcmp(finish(j), "stop") == 0,
             "stop string: '%s' %s", str(message(j), "content"), finish(j));
    json_decref(j);
    KT_CHECK(server_stop(&s) == 0, "exit status");
}

static void a_patched_r1_template_parses_forces_and_reasons(const char *model)
{
    /* a community-style fix: R1's template, which declares no tools, made to list them */
    char *r1 = read_golden("deepseek-r1.jinja");
    char *listed = patch(r1, "{{ bos_token }}{{ ns.system_prompt }}",
                         "{{ bos_token }}{{ ns.system_prompt }}{% if tools %}{{ '\\n\\nTools: ' + (tools | tojson) }}"
                         "{% endif %}");
    /* and one joint changed, so that no native revision matches (kt renders it with the interpreter) */
    char *patched = listed ? patch(listed, "ns.system_prompt + '\\n\\n' + message['content']",
                                   "ns.system_prompt + '\\n' + message['content']")
                           : NULL;
    free(listed);
    char path[1024];
    snprintf(path, sizeof path, "%s", kt_test_path("family-r1-patched.jinja"));
    free(r1);
    if (!patched || !write_file(path, patched)) {
        free(patched);
        return;
    }
    free(patched);
    char args[1400];
    snprintf(args, sizeof args, "-t 2 -q --test-forced-output --chat-template %s", path);
    struct test_server s;
    if (server_start(&s, model, args, true)) {
        size_t len;
        char *log = kt_test_read_file(s.log, &len);
        KT_CHECK(log && strstr(log, "interpreter"), "the log says the interpreter renders it: %s", log ? log : "");
        free(log);
        family_calls_are_parsed_and_forced(
            &s, "<think>The tool knows.</think><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>"
                "get_weather\\n```json\\n{\\\"city\\\": \\\"Paris\\\"}\\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>"
                "<｜end▁of▁sentence｜>",
            "call_");
        int code;
        json_t *j = chat(&s, "\"kt_test_forced_output\": \"<think>Paris is north.</think>Cool.<｜end▁of▁sentence｜>\"",
                         &code);
        KT_CHECK(code == 200 && strcmp(str(message(j), "reasoning_content"), "Paris is north.") == 0 &&
                     strcmp(str(message(j), "content"), "Cool.") == 0,
                 "reasoning split: %s", json_dumps(j, JSON_COMPACT));
        json_decref(j);
        KT_CHECK(server_stop(&s) == 0, "exit status");
    }
    unlink(path);
}

static void a_template_without_markers_takes_the_vocabularys_family(const char *model)
{
    char path[1024];
    snprintf(path, sizeof path, "%s", kt_test_path("family-plain.jinja"));
    if (!write_file(path, "{% for m in messages %}<|im_{{ m.role }}|>{{ m.role }}<|im_middle|>{{ m.content }}"
                          "<|im_end|>{% endfor %}{% if add_generation_prompt %}<|im_assistant|>assistant"
                          "<|im_middle|>{% endif %}"))
        return;
    char args[1400];
    snprintf(args, sizeof args, "-t 2 -q --test-forced-output --chat-template %s", path);
    struct test_server s;
    if (server_start(&s, model, args, true)) {
        family_calls_are_parsed_and_forced(
            &s, "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>"
                "{\\\"city\\\": \\\"Paris\\\"}<|tool_call_end|><|tool_calls_section_end|><|im_end|>",
            "functions.get_weather:");
        KT_CHECK(server_stop(&s) == 0, "exit status");
    }
    unlink(path);
}

static void a_call_form_kt_does_not_parse_is_not_forced(const char *model)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/deepseek-v3.1.jinja", golden_dir());
    char args[1400];
    snprintf(args, sizeof args, "-t 2 -q --chat-template %s", path);
    struct test_server s;
    if (!server_start(&s, model, args, true))
        return;
    int code;
    json_t *j = chat(&s, "\"tool_choice\": \"required\"", &code);
    const json_t *err = json_object_get(j, "error");
    KT_CHECK(code == 400 && strcmp(str(err, "param"), "tool_choice") == 0 && strstr(str(err, "message"), "syntax"),
             "V3.1 forced call: %d %s", code, json_dumps(j, JSON_COMPACT));
    json_decref(j);
    j = chat(&s, "\"seed\": 1", &code);
    KT_CHECK(code == 200, "an ordinary chat still answers: %d", code);
    json_decref(j);
    KT_CHECK(server_stop(&s) == 0, "exit status");
}

int main(void)
{
    if (!have_curl())
        return kt_test_skip("curl is not installed");
    char kimi[1024], deepseek[1024];
    snprintf(kimi, sizeof kimi, "%s", kt_test_path("family-kimi.gguf"));
    snprintf(deepseek, sizeof deepseek, "%s", kt_test_path("family-deepseek.gguf"));
    if (!make_model(kimi, "tiny", NULL) || !make_model(deepseek, "tiny-v3", NULL)) {
        KT_CHECK(false, "kt-synth failed");
        return kt_test_finish();
    }
    RUN_WITH(a_patched_kimi_template_parses_forces_and_stops, kimi);
    RUN_WITH(a_patched_r1_template_parses_forces_and_reasons, deepseek);
    RUN_WITH(a_template_without_markers_takes_the_vocabularys_family, kimi);
    RUN_WITH(a_call_form_kt_does_not_parse_is_not_forced, deepseek);
    unlink(kimi), unlink(deepseek);
    return kt_test_finish();
}
