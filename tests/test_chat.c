/*
 * test_chat.c - kt's native chat templates against the golden renders of the
 * models' own Jinja templates (tests/golden/chat, made by render.mjs with
 * @huggingface/jinja and checked against Python jinja2), plus revision
 * detection, the OpenAI message parser's errors and the Python-exact JSON.
 *
 * The goldens are data: when a render differs, kt is wrong (or the golden
 * was made from a different template); never regenerate them from kt.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat.h"
#include "testlib.h"

/* kt-synth's embedded templates: detection must hold for exactly these bytes. */
#include "templates.h"

/* ------------------------------------------------------------- helpers --- */

static const char *golden_dir(void)
{
    static char dir[1024];
    const char *src = getenv("KT_SOURCE_DIR");
    if (src) {
        snprintf(dir, sizeof dir, "%s/tests/golden/chat", src);
    } else { /* run by hand: this file's directory */
        const char *slash = strrchr(__FILE__, '/');
        int len = slash ? (int)(slash - __FILE__) : 1;
        snprintf(dir, sizeof dir, "%.*s/golden/chat", len, slash ? __FILE__ : ".");
    }
    return dir;
}

static char *read_golden_file(const char *name)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/%s", golden_dir(), name);
    size_t bytes = 0;
    char *text = kt_test_read_file(path, &bytes);
    KT_CHECK(text != NULL, "cannot read %s", path);
    return text;
}

static json_t *load_golden_json(const char *name)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/%s", golden_dir(), name);
    json_error_t jerr;
    json_t *doc = json_load_file(path, 0, &jerr);
    KT_CHECK(doc != NULL, "%s: %s (line %d)", path, jerr.text, jerr.line);
    return doc;
}

static kt_chat_format format_named(const char *name)
{
    for (int f = 0; f < KT_CHAT_FORMAT_COUNT; f++)
        if (strcmp(kt_chat_format_name((kt_chat_format)f), name) == 0)
            return (kt_chat_format)f;
    return KT_CHAT_FORMAT_UNKNOWN;
}

/* Prints where two renders part, with some context on each side. */
static void report_difference(const char *what, const char *got, const char *want)
{
    size_t i = 0;
    while (got[i] && got[i] == want[i])
        i++;
    size_t from = i > 60 ? i - 60 : 0;
    fprintf(stderr, "%s: first difference at byte %zu\n  kt:     \"%.140s\"\n  golden: \"%.140s\"\n", what, i,
            got + from, want + from);
}

/* Renders messages_json (a JSON array) with format; NULL on failure. */
static char *render_json(kt_chat_format format, const char *messages_json,
                         const kt_chat_options *options, kt_err *err)
{
    json_error_t jerr;
    json_t *doc = json_loads(messages_json, 0, &jerr);
    KT_CHECK(doc != NULL, "bad test JSON: %s", jerr.text);
    kt_chat_messages messages;
    char *out = NULL;
    if (kt_chat_messages_from_json(doc, &messages, err) == KT_OK) {
        kt_chat_render(format, messages.items, messages.count, options, &out, err);
        kt_chat_messages_free(&messages);
    }
    json_decref(doc);
    return out;
}

/* --------------------------------------------------------------- cases --- */

static void chat_renders_match_goldens_for_every_template_and_case(void)
{
    json_t *cases = load_golden_json("cases.json");
    json_t *goldens = load_golden_json("goldens.json");
    if (!cases || !goldens)
        goto done;
    size_t i, j;
    json_t *tmpl, *c;
    int renders = 0;
    json_array_foreach(json_object_get(cases, "templates"), i, tmpl) {
        const char *file = json_string_value(json_object_get(tmpl, "file"));
        const char *want_name = json_string_value(json_object_get(tmpl, "format"));
        char *text = read_golden_file(file);
        if (!text)
            continue;
        kt_err err = {0};
        kt_chat_format format;
        kt_status st = kt_chat_format_detect(text, &format, &err);
        KT_CHECK(st == KT_OK, "%s: %s", file, err.msg);
        KT_CHECK(format == format_named(want_name), "%s detected as %s, want %s", file,
                 kt_chat_format_name(format), want_name);
        free(text);
        if (st != KT_OK)
            continue;
        json_array_foreach(json_object_get(cases, "cases"), j, c) {
            const char *case_name = json_string_value(json_object_get(c, "name"));
            const char *want = json_string_value(json_object_get(json_object_get(goldens, file), case_name));
            KT_CHECK(want != NULL, "no golden for %s / %s", file, case_name);
            if (!want)
                continue;
            kt_chat_messages messages;
            st = kt_chat_messages_from_json(json_object_get(c, "messages"), &messages, &err);
            KT_CHECK(st == KT_OK, "%s: messages: %s", case_name, err.msg);
            if (st != KT_OK)
                continue;
            json_t *thinking = json_object_get(c, "thinking");
            kt_chat_options options = {
                .add_generation_prompt = json_is_true(json_object_get(c, "add_generation_prompt")),
                .tools = json_object_get(c, "tools"),
                .thinking = !thinking ? KT_CHAT_THINKING_DEFAULT
                            : json_is_true(thinking) ? KT_CHAT_THINKING_ON : KT_CHAT_THINKING_OFF,
                .bos_token = json_string_value(json_object_get(tmpl, "bos_token")),
                .eos_token = json_string_value(json_object_get(tmpl, "eos_token")),
            };
            char *out = NULL;
            st = kt_chat_render(format, messages.items, messages.count, &options, &out, &err);
            KT_CHECK(st == KT_OK, "%s / %s: %s", file, case_name, err.msg);
            if (out) {
                bool same = strcmp(out, want) == 0;
                KT_CHECK(same, "%s / %s differs from the golden render", file, case_name);
                if (!same)
                    report_difference(case_name, out, want);
                renders++;
            }
            free(out);
            kt_chat_messages_free(&messages);
        }
    }
    KT_CHECK(renders == 8 * 20, "compared %d renders, want 160 (8 templates x 20 cases)", renders);
done:
    json_decref(cases);
    json_decref(goldens);
}

static void chat_detects_kt_synth_templates_as_the_golden_revisions(void)
{
    static const struct {
        enum kt_synth_family family;
        kt_chat_format format;
        const char *golden;
    } expect[] = {
        {KT_SYNTH_KIMI, KT_CHAT_KIMI_K2_INSTRUCT, "kimi-k2-instruct.jinja"},
        {KT_SYNTH_DEEPSEEK, KT_CHAT_DEEPSEEK_V3_0324, "deepseek-v3-0324.jinja"},
    };
    for (size_t i = 0; i < sizeof expect / sizeof expect[0]; i++) {
        const char *text = kt_synth_chat_template(expect[i].family);
        kt_err err = {0};
        kt_chat_format format;
        KT_CHECK(kt_chat_format_detect(text, &format, &err) == KT_OK, "kt-synth template %zu: %s", i, err.msg);
        KT_CHECK(format == expect[i].format, "kt-synth template %zu detected as %s", i, kt_chat_format_name(format));
        /* The golden template is the very text kt-synth embeds in its GGUF files. */
        char *golden = read_golden_file(expect[i].golden);
        KT_CHECK(golden && strcmp(golden, text) == 0, "%s is not kt-synth's template", expect[i].golden);
        free(golden);
    }
    /* the revisions the tiny-thinking and tiny-r1 presets carry */
    static const struct {
        enum kt_synth_chat_revision revision;
        kt_chat_format format;
        const char *golden;
    } revisions[] = {
        {KT_SYNTH_CHAT_KIMI_K2_THINKING, KT_CHAT_KIMI_K2_THINKING, "kimi-k2-thinking.jinja"},
        {KT_SYNTH_CHAT_DEEPSEEK_R1, KT_CHAT_DEEPSEEK_R1, "deepseek-r1.jinja"},
    };
    for (size_t i = 0; i < sizeof revisions / sizeof revisions[0]; i++) {
        const char *text = kt_synth_chat_template_revision(revisions[i].revision);
        kt_err err = {0};
        kt_chat_format format;
        KT_CHECK(text && kt_chat_format_detect(text, &format, &err) == KT_OK, "revision %zu: %s", i, err.msg);
        KT_CHECK(text && format == revisions[i].format, "revision %zu detected as %s", i, kt_chat_format_name(format));
        char *golden = read_golden_file(revisions[i].golden);
        KT_CHECK(golden && text && strcmp(golden, text) == 0, "%s is not kt-synth's template", revisions[i].golden);
        free(golden);
    }
}

/* Returns a copy of text with the first `from` replaced by `to`; NULL if absent. */
static char *replace_once(const char *text, const char *from, const char *to)
{
    const char *at = strstr(text, from);
    if (!at)
        return NULL;
    size_t head = (size_t)(at - text), from_len = strlen(from), to_len = strlen(to);
    char *out = malloc(strlen(text) - from_len + to_len + 1);
    memcpy(out, text, head);
    memcpy(out + head, to, to_len);
    strcpy(out + head + to_len, at + from_len);
    return out;
}

static void chat_detection_refuses_unknown_templates_and_revisions(void)
{
    kt_err err = {0};
    kt_chat_format format = KT_CHAT_KIMI_K2_THINKING;
    KT_CHECK(kt_chat_format_detect(NULL, &format, &err) == KT_ERR_UNSUPPORTED, "NULL template");
    KT_CHECK(format == KT_CHAT_FORMAT_UNKNOWN, "format not reset");
    KT_CHECK(kt_chat_format_detect("", &format, &err) == KT_ERR_UNSUPPORTED, "empty template");
    const char *chatml = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
                         "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}";
    KT_CHECK(kt_chat_format_detect(chatml, &format, &err) == KT_ERR_UNSUPPORTED, "ChatML accepted");
    KT_CHECK(strstr(err.msg, "not recognised") != NULL, "message: %s", err.msg);

    /* Each mutation changes output bytes the renderers would not reproduce. */
    static const struct {
        const char *file, *from, *to, *family_in_message;
    } mutations[] = {
        /* llama.cpp's first Kimi copy defaults to another system prompt */
        {"kimi-k2-instruct.jinja", "You are Kimi, an AI assistant created by Moonshot AI.",
         "You are a helpful assistant", "Kimi-K2"},
        {"kimi-k2-instruct.jinja", "## Return of {{ message.tool_call_id }}\n    {{",
         "## Return of {{ message.tool_call_id }}\n{{", "Kimi-K2"},
        /* the later Kimi-K2-Thinking revision writes compact tools JSON */
        {"kimi-k2-thinking.jinja", "tools | tojson()", "tools | tojson(separators=(',', ':'))", "Kimi-K2"},
        /* llama.cpp's own Thinking variant synthesises ids */
        {"kimi-k2-thinking.jinja", "{%- set formatted_id = tool_call['id'] -%}",
         "{%- set formatted_id = 'functions.' + tool_call['function']['name'] + ':' + "
         "(tool_response_queue.ids|length|string) -%}",
         "Kimi-K2"},
        {"kimi-k2-thinking.jinja", "{%- break -%}", "", "Kimi-K2"},
        /* DeepSeek-V3 (December 2024) prefixes later tool outputs with a newline */
        {"deepseek-r1.jinja", "{%- else %}{{'<｜tool▁output▁begin｜>'", "{%- else %}{{'\\n<｜tool▁output▁begin｜>'",
         "DeepSeek"},
        {"deepseek-r1-think.jinja", "<think>\\n", "<think>\\n\\n", "DeepSeek"},
        /* R1-0528 keeps V3-0324's shape but strips reasoning */
        {"deepseek-v3-0324.jinja", "{% set content = message['content'] %}",
         "{% set content = message['content'] %}{% if '</think>' in content %}"
         "{% set content = content.split('</think>')[-1] %}{% endif %}",
         "DeepSeek"},
    };
    for (size_t i = 0; i < sizeof mutations / sizeof mutations[0]; i++) {
        char *text = read_golden_file(mutations[i].file);
        char *mutated = text ? replace_once(text, mutations[i].from, mutations[i].to) : NULL;
        KT_CHECK(mutated != NULL, "mutation %zu: pattern not in %s", i, mutations[i].file);
        if (mutated) {
            kt_status st = kt_chat_format_detect(mutated, &format, &err);
            KT_CHECK(st == KT_ERR_UNSUPPORTED, "mutation %zu of %s accepted as %s", i, mutations[i].file,
                     kt_chat_format_name(format));
            KT_CHECK(strstr(err.msg, mutations[i].family_in_message) && strstr(err.msg, "closest"),
                     "mutation %zu: message \"%s\"", i, err.msg);
        }
        free(mutated);
        free(text);
    }
}

static void chat_detection_accepts_either_newline_spelling_in_deepseek_literals(void)
{
    /* deepseek-v3-0324.jinja carries real newlines in its string literals,
     * deepseek-r1*.jinja the two characters "\n"; both render a newline. */
    static const struct {
        const char *file;
        kt_chat_format format;
    } files[] = {
        {"deepseek-v3-0324.jinja", KT_CHAT_DEEPSEEK_V3_0324},
        {"deepseek-r1.jinja", KT_CHAT_DEEPSEEK_R1},
        {"deepseek-r1-think.jinja", KT_CHAT_DEEPSEEK_R1_THINK},
    };
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        char *text = read_golden_file(files[i].file);
        if (!text)
            continue;
        size_t len = strlen(text), o = 0;
        char *other = malloc(2 * len + 1); /* the other spelling */
        bool has_real = strchr(text, '\n') != NULL;
        for (size_t k = 0; k < len; k++) {
            if (has_real && text[k] == '\n') {
                other[o++] = '\\';
                other[o++] = 'n';
            } else if (!has_real && text[k] == '\\' && text[k + 1] == 'n') {
                other[o++] = '\n';
                k++;
            } else {
                other[o++] = text[k];
            }
        }
        other[o] = '\0';
        KT_CHECK(strcmp(other, text) != 0, "%s: no newline to respell", files[i].file);
        kt_err err = {0};
        kt_chat_format format;
        KT_CHECK(kt_chat_format_detect(other, &format, &err) == KT_OK && format == files[i].format,
                 "%s respelled: %s (%s)", files[i].file, kt_chat_format_name(format), err.msg);
        free(other);
        free(text);
    }
}

static void chat_messages_from_json_names_index_and_field_of_each_error(void)
{
    static const struct {
        const char *json;
        kt_status status;
        const char *message;
    } bad[] = {
        {"{}", KT_ERR_INVALID, "messages: expected an array, got object"},
        {"[\"hi\"]", KT_ERR_INVALID, "messages[0]: expected an object, got string"},
        {"[{\"content\": \"hi\"}]", KT_ERR_INVALID, "messages[0].role: missing"},
        {"[{\"role\": \"user\", \"content\": \"a\"}, {\"role\": 7}]", KT_ERR_INVALID,
         "messages[1].role: expected a string, got integer"},
        {"[{\"role\": \"developer\", \"content\": \"a\"}]", KT_ERR_INVALID,
         "messages[0].role: unknown role \"developer\""},
        {"[{\"role\": \"user\", \"content\": 5}]", KT_ERR_INVALID,
         "messages[0].content: expected a string, an array of content parts or null, got integer"},
        {"[{\"role\": \"user\", \"content\": [\"x\"]}]", KT_ERR_INVALID,
         "messages[0].content[0]: expected an object, got string"},
        {"[{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": 1}]}]", KT_ERR_INVALID,
         "messages[0].content[0].text: expected a string, got integer"},
        {"[{\"role\": \"user\", \"content\": [{\"text\": \"x\"}]}]", KT_ERR_INVALID,
         "messages[0].content[0].type: expected a string, got nothing"},
        {"[{\"role\": \"user\", \"content\": [{\"type\": \"image_url\", \"image_url\": {\"url\": \"x\"}}]}]",
         KT_ERR_UNSUPPORTED, "messages[0].content[0]: \"image_url\" parts are not supported"},
        {"[{\"role\": \"user\", \"content\": \"a\", \"name\": false}]", KT_ERR_INVALID,
         "messages[0].name: expected a string, got boolean"},
        {"[{\"role\": \"assistant\", \"content\": \"a\", \"reasoning_content\": {}}]", KT_ERR_INVALID,
         "messages[0].reasoning_content: expected a string, got object"},
        {"[{\"role\": \"tool\", \"tool_call_id\": \"x\"}]", KT_ERR_INVALID,
         "messages[0].content: a tool message needs content"},
        {"[{\"role\": \"tool\", \"content\": \"r\", \"tool_call_id\": 3}]", KT_ERR_INVALID,
         "messages[0].tool_call_id: expected a string, got integer"},
        {"[{\"role\": \"user\", \"content\": \"a\", \"tool_calls\": [{\"function\": {\"name\": \"f\", "
         "\"arguments\": \"{}\"}}]}]",
         KT_ERR_INVALID, "messages[0].tool_calls: only assistant messages carry tool calls"},
        {"[{\"role\": \"assistant\", \"tool_calls\": {}}]", KT_ERR_INVALID,
         "messages[0].tool_calls: expected an array, got object"},
        {"[{\"role\": \"user\", \"content\": \"q\"}, {\"role\": \"assistant\", \"tool_calls\": [7]}]",
         KT_ERR_INVALID, "messages[1].tool_calls[0]: expected an object, got integer"},
        {"[{\"role\": \"assistant\", \"tool_calls\": [{\"type\": \"custom\", \"function\": {\"name\": \"f\", "
         "\"arguments\": \"{}\"}}]}]",
         KT_ERR_INVALID, "messages[0].tool_calls[0].type: expected \"function\""},
        {"[{\"role\": \"assistant\", \"tool_calls\": [{\"id\": \"a\"}]}]", KT_ERR_INVALID,
         "messages[0].tool_calls[0].function: expected an object, got nothing"},
        {"[{\"role\": \"assistant\", \"tool_calls\": [{\"function\": {\"arguments\": \"{}\"}}]}]",
         KT_ERR_INVALID, "messages[0].tool_calls[0].function.name: expected a non-empty string, got nothing"},
        {"[{\"role\": \"assistant\", \"tool_calls\": [{\"function\": {\"name\": \"\", \"arguments\": \"{}\"}}]}]",
         KT_ERR_INVALID, "messages[0].tool_calls[0].function.name: expected a non-empty string, got string"},
        {"[{\"role\": \"assistant\", \"tool_calls\": [{\"function\": {\"name\": \"f\"}}, 1]}]", KT_ERR_INVALID,
         "messages[0].tool_calls[0].function.arguments: expected a JSON string or object, got nothing"},
        {"[{\"role\": \"assistant\", \"tool_calls\": [{\"function\": {\"name\": \"f\", \"arguments\": \"{}\"}}, "
         "{\"id\": 1, \"function\": {\"name\": \"g\", \"arguments\": \"{}\"}}]}]",
         KT_ERR_INVALID, "messages[0].tool_calls[1].id: expected a string, got integer"},
        {"[{\"role\": \"assistant\", \"tool_calls\": [{\"function\": {\"name\": \"f\", \"arguments\": 2}}]}]",
         KT_ERR_INVALID, "messages[0].tool_calls[0].function.arguments: expected a JSON string or object, got integer"},
        {"[{\"role\": \"user\", \"content\": \"a\\u0000b\"}]", KT_ERR_INVALID,
         "messages[0].content: contains a NUL character"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        json_error_t jerr;
        json_t *doc = json_loads(bad[i].json, JSON_ALLOW_NUL, &jerr);
        KT_CHECK(doc != NULL, "case %zu: bad test JSON: %s", i, jerr.text);
        kt_chat_messages messages = {(kt_chat_message *)1, 99};
        kt_err err = {0};
        kt_status st = kt_chat_messages_from_json(doc, &messages, &err);
        KT_CHECK(st == bad[i].status, "case %zu: status %s, want %s (%s)", i, kt_status_name(st),
                 kt_status_name(bad[i].status), err.msg);
        KT_CHECK(strncmp(err.msg, bad[i].message, strlen(bad[i].message)) == 0, "case %zu: message \"%s\"", i,
                 err.msg);
        KT_CHECK(messages.items == NULL && messages.count == 0, "case %zu: output not emptied", i);
        json_decref(doc);
    }
}

static void chat_messages_from_json_keeps_fields_and_serialises_object_arguments(void)
{
    const char *json = "[{\"role\": \"assistant\", \"content\": [], \"name\": \"bot\", \"reasoning\": \"why\","
                       " \"tool_calls\": [{\"id\": \"functions.f:0\", \"function\": {\"name\": \"f\","
                       " \"arguments\": {\"b\": [1, 1.0, 1e-05, 0.0001, 1e16, 1e15, -0.0, 5e-324,"
                       " 1.7976931348623157e308, 0.3, 9007199254740993, -5, 123456789.123],"
                       " \"a\": {\"é\": \"\\\"\\\\\\n\\u0001\\u007f\"}, \"c\": null}}}]},"
                       " {\"role\": \"tool\", \"content\": [{\"type\": \"text\", \"text\": \"x\"}],"
                       " \"tool_call_id\": \"functions.f:0\", \"tool_calls\": []},"
                       " {\"role\": \"assistant\", \"content\": null, \"tool_calls\": null}]";
    json_t *doc = json_loads(json, 0, NULL);
    kt_chat_messages m;
    kt_err err = {0};
    KT_CHECK(kt_chat_messages_from_json(doc, &m, &err) == KT_OK, "%s", err.msg);
    json_decref(doc);
    if (m.count != 3) {
        KT_CHECK(m.count == 3, "count %zu", m.count);
        kt_chat_messages_free(&m);
        return;
    }
    KT_CHECK(m.items[0].role == KT_CHAT_ASSISTANT && strcmp(m.items[0].content, "") == 0, "empty parts");
    KT_CHECK(strcmp(m.items[0].name, "bot") == 0, "name");
    KT_CHECK(strcmp(m.items[0].reasoning_content, "why") == 0, "reasoning alias");
    KT_CHECK(m.items[0].n_tool_calls == 1 && strcmp(m.items[0].tool_calls[0].id, "functions.f:0") == 0, "id");
    const char *want = "{\"b\": [1, 1.0, 1e-05, 0.0001, 1e+16, 1000000000000000.0, -0.0, 5e-324, "
                       "1.7976931348623157e+308, 0.3, 9007199254740993, -5, 123456789.123], "
                       "\"a\": {\"é\": \"\\\"\\\\\\n\\u0001\x7f\"}, \"c\": null}";
    KT_CHECK(strcmp(m.items[0].tool_calls[0].arguments, want) == 0, "arguments %s", m.items[0].tool_calls[0].arguments);
    KT_CHECK(m.items[1].role == KT_CHAT_TOOL && strcmp(m.items[1].content, "x") == 0, "tool parts");
    KT_CHECK(m.items[1].n_tool_calls == 0, "empty tool_calls is none");
    KT_CHECK(m.items[2].content == NULL && m.items[2].n_tool_calls == 0, "null content and tool_calls");
    kt_chat_messages_free(&m);
}

static void chat_render_refuses_invalid_input(void)
{
    kt_chat_message tool_without_content = {.role = KT_CHAT_TOOL, .tool_call_id = "x"};
    kt_chat_tool_call call = {.id = "functions.f:0", .name = "f", .arguments = "{}"};
    kt_chat_message user_with_calls = {.role = KT_CHAT_USER, .content = "a", .tool_calls = &call, .n_tool_calls = 1};
    kt_chat_tool_call nameless = {.arguments = "{}"};
    kt_chat_message bad_call = {.role = KT_CHAT_ASSISTANT, .tool_calls = &nameless, .n_tool_calls = 1};
    kt_chat_message bad_role = {.role = (kt_chat_role)9, .content = "a"};
    kt_chat_message user = {.role = KT_CHAT_USER, .content = "hi"};
    kt_err err = {0};
    char *out = (char *)1;
    KT_CHECK(kt_chat_render(KT_CHAT_DEEPSEEK_R1, &tool_without_content, 1, NULL, &out, &err) == KT_ERR_INVALID &&
                 strstr(err.msg, "messages[0].content"),
             "tool without content: %s", err.msg);
    KT_CHECK(out == NULL, "out not cleared");
    KT_CHECK(kt_chat_render(KT_CHAT_KIMI_K2_THINKING, &user_with_calls, 1, NULL, &out, &err) == KT_ERR_INVALID,
             "user tool calls");
    KT_CHECK(kt_chat_render(KT_CHAT_KIMI_K2_INSTRUCT, &bad_call, 1, NULL, &out, &err) == KT_ERR_INVALID,
             "nameless call");
    KT_CHECK(kt_chat_render(KT_CHAT_KIMI_K2_INSTRUCT, &bad_role, 1, NULL, &out, &err) == KT_ERR_INVALID, "role 9");
    KT_CHECK(kt_chat_render(KT_CHAT_FORMAT_UNKNOWN, &user, 1, NULL, &out, &err) == KT_ERR_UNSUPPORTED, "unknown");
    kt_chat_options options = {.tools_json = "[{\"type\": \"function\""};
    KT_CHECK(kt_chat_render(KT_CHAT_KIMI_K2_INSTRUCT, &user, 1, &options, &out, &err) == KT_ERR_INVALID &&
                 strstr(err.msg, "tools: not JSON"),
             "truncated tools: %s", err.msg);
    options.tools_json = "{\"type\": \"function\"}";
    KT_CHECK(kt_chat_render(KT_CHAT_KIMI_K2_INSTRUCT, &user, 1, &options, &out, &err) == KT_ERR_INVALID &&
                 strstr(err.msg, "tools: expected an array, got object"),
             "object tools: %s", err.msg);
    KT_CHECK(out == NULL, "out set on failure");
}

static void chat_tools_as_text_or_object_and_thinking_flag_render_alike(void)
{
    const char *tools_text = "[{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": "
                             "{\"x\": 1.0, \"y\": \"é\"}}}]";
    json_t *tools = json_loads(tools_text, 0, NULL);
    const char *messages = "[{\"role\": \"user\", \"content\": \"hi\"}]";
    for (int f = 1; f < KT_CHAT_FORMAT_COUNT; f++) {
        kt_err err = {0};
        kt_chat_options base = {.add_generation_prompt = true, .tools = tools};
        char *with_object = render_json((kt_chat_format)f, messages, &base, &err);
        kt_chat_options as_text = {.add_generation_prompt = true, .tools_json = tools_text,
                                   .thinking = KT_CHAT_THINKING_OFF};
        char *with_text = render_json((kt_chat_format)f, messages, &as_text, &err);
        as_text.thinking = KT_CHAT_THINKING_ON;
        char *thinking_on = render_json((kt_chat_format)f, messages, &as_text, &err);
        const char *name = kt_chat_format_name((kt_chat_format)f);
        KT_CHECK(with_object && with_text && thinking_on, "%s: %s", name, err.msg);
        if (with_object && with_text && thinking_on) {
            KT_CHECK(strcmp(with_object, with_text) == 0 && strcmp(with_text, thinking_on) == 0, "%s differs", name);
            bool declared = strstr(with_object, "{\"x\": 1.0, \"y\": \"é\"}") != NULL;
            KT_CHECK(declared == kt_chat_format_renders_tools((kt_chat_format)f), "%s: tools declared %d", name,
                     declared);
        }
        free(with_object);
        free(with_text);
        free(thinking_on);
    }
    json_decref(tools);
}

static void chat_stop_strings_and_names_per_family(void)
{
    size_t n = 9;
    const char *const *stops = kt_chat_stop_strings(KT_CHAT_KIMI_K2_THINKING, &n);
    KT_CHECK(n == 4 && strcmp(stops[0], "<|im_end|>") == 0 && strcmp(stops[3], "<|im_middle|>") == 0, "kimi stops");
    stops = kt_chat_stop_strings(KT_CHAT_DEEPSEEK_V3_0324, &n);
    KT_CHECK(n == 1 && strcmp(stops[0], "<｜end▁of▁sentence｜>") == 0, "deepseek stops");
    stops = kt_chat_stop_strings(KT_CHAT_FORMAT_UNKNOWN, &n);
    KT_CHECK(n == 0 && stops == NULL, "unknown stops");
    KT_CHECK(strcmp(kt_chat_format_name((kt_chat_format)99), "unknown") == 0, "out of range name");
    for (int a = 0; a < KT_CHAT_FORMAT_COUNT; a++)
        for (int b = a + 1; b < KT_CHAT_FORMAT_COUNT; b++)
            KT_CHECK(strcmp(kt_chat_format_name((kt_chat_format)a), kt_chat_format_name((kt_chat_format)b)) != 0,
                     "formats %d and %d share a name", a, b);
}

static void chat_kimi_ids_are_verbatim_and_deepseek_default_bos_is_added(void)
{
    const char *messages = "[{\"role\": \"assistant\", \"content\": null, \"tool_calls\": [{\"id\": "
                           "\"call_59adf\", \"function\": {\"name\": \"f\", \"arguments\": \"{}\"}}]},"
                           " {\"role\": \"tool\", \"tool_call_id\": \"call_59adf\", \"content\": \"ok\"}]";
    kt_err err = {0};
    char *kimi = render_json(KT_CHAT_KIMI_K2_INSTRUCT, messages, NULL, &err);
    KT_CHECK(kimi && strstr(kimi, "<|tool_call_begin|>call_59adf<|tool_call_argument_begin|>{}") &&
                 strstr(kimi, "## Return of call_59adf\n    ok<|im_end|>"),
             "kimi: %s", kimi ? kimi : err.msg);
    char *r1 = render_json(KT_CHAT_DEEPSEEK_R1, messages, NULL, &err);
    const char *r1_start = "<｜begin▁of▁sentence｜><｜Assistant｜><｜tool▁calls▁begin｜>";
    KT_CHECK(r1 && strncmp(r1, r1_start, strlen(r1_start)) == 0 &&
                 !strstr(r1, "call_59adf"),
             "r1: %s", r1 ? r1 : err.msg);
    free(kimi);
    free(r1);
}

int main(void)
{
    KT_RUN(chat_renders_match_goldens_for_every_template_and_case);
    KT_RUN(chat_detects_kt_synth_templates_as_the_golden_revisions);
    KT_RUN(chat_detection_refuses_unknown_templates_and_revisions);
    KT_RUN(chat_detection_accepts_either_newline_spelling_in_deepseek_literals);
    KT_RUN(chat_messages_from_json_names_index_and_field_of_each_error);
    KT_RUN(chat_messages_from_json_keeps_fields_and_serialises_object_arguments);
    KT_RUN(chat_render_refuses_invalid_input);
    KT_RUN(chat_tools_as_text_or_object_and_thinking_flag_render_alike);
    KT_RUN(chat_stop_strings_and_names_per_family);
    KT_RUN(chat_kimi_ids_are_verbatim_and_deepseek_default_bos_is_added);
    return kt_test_finish();
}
