/*
 * chat.c - template recognition, OpenAI message parsing and the Python-exact
 * JSON writer behind kt_chat_render; the per-family renderers live in
 * chat_kimi.c and chat_deepseek.c, the Jinja interpreter that renders every
 * other template in jinja*.c.
 *
 * Recognition is deliberately strict: a revision is named only when every
 * substring that decides its output is present, so a template kt has not
 * been taught goes to the interpreter rather than being rendered almost
 * right by a near revision.  Nothing here prints, exits or keeps state
 * between calls.
 */
#include "chat.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat_internal.h"
#include "jinja.h"
#include "tokenizer.h"

/* ---------------------------------------------------------------- text --- */

static bool text_reserve(kt_chat_text *text, size_t extra)
{
    if (text->out_of_memory)
        return false;
    if (text->len + extra + 1 <= text->cap)
        return true;
    size_t cap = text->cap ? text->cap : 256;
    while (cap < text->len + extra + 1) {
        if (cap > SIZE_MAX / 2) {
            text->out_of_memory = true;
            return false;
        }
        cap *= 2;
    }
    char *bytes = realloc(text->bytes, cap);
    if (!bytes) {
        text->out_of_memory = true;
        return false;
    }
    text->bytes = bytes;
    text->cap = cap;
    return true;
}

void kt_chat_text_append(kt_chat_text *text, const char *bytes, size_t len)
{
    if (!text_reserve(text, len))
        return;
    memcpy(text->bytes + text->len, bytes, len);
    text->len += len;
    text->bytes[text->len] = '\0';
}

void kt_chat_text_puts(kt_chat_text *text, const char *str)
{
    if (str)
        kt_chat_text_append(text, str, strlen(str));
}

/* ------------------------------------------------ JSON as Python writes it --- */

/* json.dumps escapes '"', '\\' and the C0 controls (\b \f \n \r \t by name,
 * the rest as \u00xx); with ensure_ascii=False everything else is raw. */
static void write_json_string(kt_chat_text *text, const char *s, size_t len)
{
    kt_chat_text_append(text, "\"", 1);
    size_t run = 0; /* start of the pending unescaped run */
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        const char *esc = NULL;
        char hex[7];
        switch (c) {
        case '"': esc = "\\\""; break;
        case '\\': esc = "\\\\"; break;
        case '\b': esc = "\\b"; break;
        case '\f': esc = "\\f"; break;
        case '\n': esc = "\\n"; break;
        case '\r': esc = "\\r"; break;
        case '\t': esc = "\\t"; break;
        default:
            if (c < 0x20) {
                snprintf(hex, sizeof hex, "\\u%04x", c);
                esc = hex;
            }
        }
        if (esc) {
            kt_chat_text_append(text, s + run, i - run);
            kt_chat_text_puts(text, esc);
            run = i + 1;
        }
    }
    kt_chat_text_append(text, s + run, len - run);
    kt_chat_text_append(text, "\"", 1);
}

void kt_chat_python_float(double x, char *buf, size_t size, bool json)
{
    if (isnan(x)) {
        snprintf(buf, size, "%s", json ? "NaN" : "nan");
        return;
    }
    if (isinf(x)) {
        snprintf(buf, size, "%s", x < 0 ? (json ? "-Infinity" : "-inf") : (json ? "Infinity" : "inf"));
        return;
    }
    if (x == 0) {
        snprintf(buf, size, "%s", signbit(x) ? "-0.0" : "0.0");
        return;
    }
    char sci[40];
    for (int precision = 1; precision <= 17; precision++) {
        snprintf(sci, sizeof sci, "%.*e", precision - 1, x);
        if (strtod(sci, NULL) == x)
            break;
    }
    const char *p = sci;
    char digits[24];
    size_t nd = 0;
    bool negative = *p == '-';
    if (negative)
        p++;
    for (; *p && *p != 'e'; p++)
        if (*p != '.')
            digits[nd++] = *p;
    while (nd > 1 && digits[nd - 1] == '0')
        nd--;
    int point = atoi(p + 1) + 1; /* x = 0.digits * 10^point */
    size_t o = 0;
    char out[64];
    if (negative)
        out[o++] = '-';
    if (point <= -4 || point > 16) {
        out[o++] = digits[0];
        if (nd > 1) {
            out[o++] = '.';
            memcpy(out + o, digits + 1, nd - 1);
            o += nd - 1;
        }
        o += (size_t)snprintf(out + o, sizeof out - o, "e%+03d", point - 1);
    } else if (point <= 0) {
        out[o++] = '0';
        out[o++] = '.';
        for (int i = point; i < 0; i++)
            out[o++] = '0';
        memcpy(out + o, digits, nd);
        o += nd;
    } else if ((size_t)point >= nd) {
        memcpy(out + o, digits, nd);
        o += nd;
        for (size_t i = nd; i < (size_t)point; i++)
            out[o++] = '0';
        out[o++] = '.';
        out[o++] = '0';
    } else {
        memcpy(out + o, digits, (size_t)point);
        o += (size_t)point;
        out[o++] = '.';
        memcpy(out + o, digits + point, nd - (size_t)point);
        o += nd - (size_t)point;
    }
    out[o] = '\0';
    snprintf(buf, size, "%s", out);
}

static void write_python_float(kt_chat_text *text, double x)
{
    char buf[64];
    kt_chat_python_float(x, buf, sizeof buf, true);
    kt_chat_text_puts(text, buf);
}

void kt_chat_text_json(kt_chat_text *text, const json_t *value)
{
    char buf[32];
    switch (json_typeof(value)) {
    case JSON_OBJECT: {
        kt_chat_text_append(text, "{", 1);
        bool first = true;
        for (void *it = json_object_iter((json_t *)value); it;
             it = json_object_iter_next((json_t *)value, it)) {
            if (!first)
                kt_chat_text_append(text, ", ", 2);
            first = false;
            write_json_string(text, json_object_iter_key(it), json_object_iter_key_len(it));
            kt_chat_text_append(text, ": ", 2);
            kt_chat_text_json(text, json_object_iter_value(it));
        }
        kt_chat_text_append(text, "}", 1);
        break;
    }
    case JSON_ARRAY:
        kt_chat_text_append(text, "[", 1);
        for (size_t i = 0; i < json_array_size(value); i++) {
            if (i)
                kt_chat_text_append(text, ", ", 2);
            kt_chat_text_json(text, json_array_get(value, i));
        }
        kt_chat_text_append(text, "]", 1);
        break;
    case JSON_STRING:
        write_json_string(text, json_string_value(value), json_string_length(value));
        break;
    case JSON_INTEGER:
        snprintf(buf, sizeof buf, "%" JSON_INTEGER_FORMAT, json_integer_value(value));
        kt_chat_text_puts(text, buf);
        break;
    case JSON_REAL:
        write_python_float(text, json_real_value(value));
        break;
    case JSON_TRUE: kt_chat_text_puts(text, "true"); break;
    case JSON_FALSE: kt_chat_text_puts(text, "false"); break;
    case JSON_NULL: kt_chat_text_puts(text, "null"); break;
    }
}

/* ----------------------------------------------------------- revisions --- */

/*
 * What identifies each revision.  Templates are matched after turning the
 * two characters "\n" into a newline, because the same DeepSeek template
 * circulates with either spelling inside its Jinja string literals (both
 * render a newline).  Every string listed under `required` decides bytes of
 * the output; `forbidden` separates revisions that share them.
 */
#define KIMI_DEFAULT_SYSTEM \
    "<|im_system|>system<|im_middle|>You are Kimi, an AI assistant created by Moonshot AI.<|im_end|>"
#define KIMI_TOOL_CALL                                                                      \
    "<|tool_call_begin|>{{ formatted_id }}<|tool_call_argument_begin|>{% if "              \
    "tool_call['function']['arguments'] is string %}{{ tool_call['function']['arguments'] " \
    "}}{% else %}{{ tool_call['function']['arguments'] | tojson }}{% endif %}<|tool_call_end|>"
#define KIMI_MEDIA "<|media_start|>image<|media_content|><|media_pad|><|media_end|>"
#define KIMI_INSTRUCT_COMMON                                                                  \
    "{%- if loop.first and messages[0]['role'] != 'system' -%}", KIMI_DEFAULT_SYSTEM,         \
        "message.get('name') or", "<|im_user|>{{role_name}}<|im_middle|>",                    \
        "<|im_assistant|>{{role_name}}<|im_middle|>",                                         \
        "{%- if message['role'] == 'assistant' and message.get('tool_calls') -%}",            \
        "{%- if message['content'] -%}{{ message['content'] }}{%- endif -%}",                  \
        "{%- set formatted_id = tool_call['id'] -%}", KIMI_TOOL_CALL,                         \
        "## Return of {{ message.tool_call_id }}\n    {{ message['content'] }}", KIMI_MEDIA,   \
        "{%- if add_generation_prompt -%}\n  <|im_assistant|>assistant<|im_middle|>"
#define KIMI_TOOLS_PLAIN "<|im_system|>tool_declare<|im_middle|>{{ tools | tojson }}<|im_end|>"
#define KIMI_TOOLS_HEADER \
    "<|im_system|>tool_declare<|im_middle|>\n  # Tools\n  {{ tools | tojson }}<|im_end|>"
#define KIMI_SYSTEM_HEADER_BARE_ENDIF "<|im_system|>{{role_name}}<|im_middle|>\n  {% endif %}"
#define KIMI_SYSTEM_HEADER_ENDIF "<|im_system|>{{role_name}}<|im_middle|>\n  {%- endif -%}"
#define KIMI_IM_END_ALWAYS "  <|im_end|>\n{%- endfor -%}"
#define KIMI_IM_END_OPEN_LAST \
    "{% if (loop.last and add_generation_prompt) or not loop.last %}<|im_end|>{% endif %}"

#define R1_COMMON                                                                              \
    "is_first_sp=true) %}", "{{ bos_token }}{{ ns.system_prompt }}",                           \
        "ns.system_prompt + '\n\n' + message['content']",                                       \
        "{{'<｜User｜>' + message['content']}}",                                                \
        "{%- if message['role'] == 'assistant' and 'tool_calls' in message %}",                \
        "{%- if message['content'] is none %}{{'<｜Assistant｜><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>' + " \
        "tool['type'] + '<｜tool▁sep｜>' + tool['function']['name'] + '\n' + '```json' + '\n' + " \
        "tool['function']['arguments'] + '\n' + '```' + '<｜tool▁call▁end｜>'}}",              \
        "{%- else %}{{'<｜Assistant｜>' + message['content'] + '<｜tool▁calls▁begin｜>",       \
        "{%- else %}{{'\n' + '<｜tool▁call▁begin｜>' + tool['type'] + '<｜tool▁sep｜>'",       \
        "{{'<｜tool▁calls▁end｜><｜end▁of▁sentence｜>'}}",                                       \
        "{%- if ns.is_tool %}{{'<｜tool▁outputs▁end｜>' + message['content'] + '<｜end▁of▁sentence｜>'}}", \
        "{% if '</think>' in content %}{% set content = content.split('</think>')[-1] %}{% endif %}" \
        "{{'<｜Assistant｜>' + content + '<｜end▁of▁sentence｜>'}}",                             \
        "{{'<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>' + message['content'] + '<｜tool▁output▁end｜>'}}", \
        "{%- else %}{{'<｜tool▁output▁begin｜>' + message['content'] + '<｜tool▁output▁end｜>'}}", \
        "{% if ns.is_tool %}{{'<｜tool▁outputs▁end｜>'}}{% endif %}"

typedef struct revision_pattern {
    kt_chat_format format;
    const char *required[24];
    const char *forbidden[4];
} revision_pattern;

static const revision_pattern patterns[] = {
    {KT_CHAT_KIMI_K2_INSTRUCT,
     {KIMI_INSTRUCT_COMMON, KIMI_TOOLS_PLAIN, KIMI_SYSTEM_HEADER_ENDIF, KIMI_IM_END_ALWAYS},
     {"# Tools"}},
    {KT_CHAT_KIMI_K2_INSTRUCT_TOOLS_NL,
     {KIMI_INSTRUCT_COMMON, KIMI_TOOLS_HEADER, KIMI_SYSTEM_HEADER_BARE_ENDIF, KIMI_IM_END_ALWAYS},
     {NULL}},
    {KT_CHAT_KIMI_K2_INSTRUCT_TOOLS,
     {KIMI_INSTRUCT_COMMON, KIMI_TOOLS_HEADER, KIMI_SYSTEM_HEADER_ENDIF, KIMI_IM_END_ALWAYS},
     {NULL}},
    {KT_CHAT_KIMI_K2_INSTRUCT_0905,
     {KIMI_INSTRUCT_COMMON, KIMI_TOOLS_HEADER, KIMI_SYSTEM_HEADER_ENDIF, KIMI_IM_END_OPEN_LAST},
     {NULL}},
    {KT_CHAT_KIMI_K2_THINKING,
     {"{%- for idx in range(messages|length-1, -1, -1) -%}",
      "{%- if messages[idx]['role'] == 'assistant' and not messages[idx].get('tool_calls') -%}",
      "{%- break -%}",
      "{%- set hist_msgs = messages[:ns.last_non_tool_call_assistant_msg+1] -%}",
      "{%- if messages|length == 0 or messages[0]['role'] != 'system' -%}", KIMI_DEFAULT_SYSTEM,
      "message.get('name') or", "<|im_user|>{{role_name}}<|im_middle|>",
      "<|im_assistant|>{{role_name}}<|im_middle|>", "<|im_system|>{{role_name}}<|im_middle|>",
      "{%- set formatted_id = tool_call['id'] -%}", KIMI_TOOL_CALL, KIMI_MEDIA,
      "<think></think>{{render_content(message)}}",
      "{%- set rc = message.get('reasoning_content', '') -%}",
      "<think>{{rc}}</think>{{render_content(message)}}",
      "## Return of {{ tool_call_id }}\n{{render_content(message)}}",
      "{%- if add_generation_prompt -%}\n  <|im_assistant|>assistant<|im_middle|>"},
     {"tojson(separators", "tool_response_queue", "thinking"}},
    {KT_CHAT_DEEPSEEK_V3_0324,
     {"is_last_user=false) %}", "{{ bos_token }}{{ ns.system_prompt }}",
      "ns.system_prompt + '\n\n' + message['content']",
      "{%- set ns.is_last_user = true -%}{{'<｜User｜>' + message['content'] + '<｜Assistant｜>'}}",
      "{%- if message['role'] == 'assistant' and message['tool_calls'] is defined and "
      "message['tool_calls'] is not none %}",
      "{%- if ns.is_tool %}{{'<｜tool▁outputs▁end｜>'}}{%- endif %}{%- set ns.is_first = false %}"
      "{%- set ns.is_tool = false -%}{%- set ns.is_output_first = true %}",
      "{%- if message['content'] is none %}{{'<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>' + "
      "tool['type'] + '<｜tool▁sep｜>' + tool['function']['name'] + '\n' + '```json' + '\n' + "
      "tool['function']['arguments'] + '\n' + '```' + '<｜tool▁call▁end｜>'}}",
      "{%- else %}{{message['content'] + '<｜tool▁calls▁begin｜>",
      "{%- else %}{{'\n' + '<｜tool▁call▁begin｜>' + tool['type'] + '<｜tool▁sep｜>'",
      "{{'<｜tool▁calls▁end｜><｜end▁of▁sentence｜>'}}",
      "{%- if ns.is_tool %}{{'<｜tool▁outputs▁end｜>' + message['content'] + '<｜end▁of▁sentence｜>'}}",
      "{{content + '<｜end▁of▁sentence｜>'}}",
      "{{'<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>' + message['content'] + '<｜tool▁output▁end｜>'}}",
      "{{'\n<｜tool▁output▁begin｜>' + message['content'] + '<｜tool▁output▁end｜>'}}",
      "{% if add_generation_prompt and not ns.is_last_user and not ns.is_tool %}"
      "{{'<｜Assistant｜>'}}{% endif %}"},
     {"</think>", "thinking"}},
    {KT_CHAT_DEEPSEEK_R1,
     {R1_COMMON, "{% if add_generation_prompt and not ns.is_tool %}{{'<｜Assistant｜>'}}{% endif %}"},
     {"is_last_user", "thinking"}},
    {KT_CHAT_DEEPSEEK_R1_THINK,
     {R1_COMMON,
      "{% if add_generation_prompt and not ns.is_tool %}{{'<｜Assistant｜><think>\n'}}{% endif %}"},
     {"is_last_user", "thinking"}},
};

static const kt_chat_revision revisions[] = {
    {KT_CHAT_FORMAT_UNKNOWN, "unknown", false, false, false, false, NULL},
    {KT_CHAT_KIMI_K2_INSTRUCT, "kimi-k2-instruct", true, false, false, false, NULL},
    {KT_CHAT_KIMI_K2_INSTRUCT_TOOLS_NL, "kimi-k2-instruct-tools-nl", true, true, true, false, NULL},
    {KT_CHAT_KIMI_K2_INSTRUCT_TOOLS, "kimi-k2-instruct-tools", true, true, false, false, NULL},
    {KT_CHAT_KIMI_K2_INSTRUCT_0905, "kimi-k2-instruct-0905", true, true, false, true, NULL},
    {KT_CHAT_KIMI_K2_THINKING, "kimi-k2-thinking", true, false, false, false, NULL},
    {KT_CHAT_DEEPSEEK_V3_0324, "deepseek-v3-0324", false, false, false, false, "<｜Assistant｜>"},
    {KT_CHAT_DEEPSEEK_R1, "deepseek-r1", false, false, false, false, "<｜Assistant｜>"},
    {KT_CHAT_DEEPSEEK_R1_THINK, "deepseek-r1-think", false, false, false, false,
     "<｜Assistant｜><think>\n"},
};
_Static_assert(sizeof revisions / sizeof revisions[0] == KT_CHAT_FORMAT_COUNT,
               "one revision row per kt_chat_format");

const kt_chat_revision *kt_chat_revision_of(kt_chat_format format)
{
    if ((unsigned)format >= KT_CHAT_FORMAT_COUNT)
        format = KT_CHAT_FORMAT_UNKNOWN;
    return &revisions[format];
}

const char *kt_chat_format_name(kt_chat_format format)
{
    return format == KT_CHAT_JINJA ? "jinja" : kt_chat_revision_of(format)->name;
}

bool kt_chat_format_renders_tools(kt_chat_format format)
{
    return format == KT_CHAT_JINJA || kt_chat_revision_of(format)->is_kimi;
}

const char *const *kt_chat_family_stop_strings(kt_chat_family family, size_t *count)
{
    static const char *const kimi[] = {"<|im_end|>", "[EOS]", "[EOT]", "<|im_middle|>"};
    static const char *const deepseek[] = {"<｜end▁of▁sentence｜>"};
    switch (family) {
    case KT_CHAT_FAMILY_KIMI:
        *count = sizeof kimi / sizeof kimi[0];
        return kimi;
    case KT_CHAT_FAMILY_DEEPSEEK:
        *count = sizeof deepseek / sizeof deepseek[0];
        return deepseek;
    default:
        *count = 0;
        return NULL;
    }
}

static kt_chat_family revision_family(const kt_chat_revision *rev)
{
    if (rev->format == KT_CHAT_FORMAT_UNKNOWN)
        return KT_CHAT_FAMILY_UNKNOWN;
    return rev->is_kimi ? KT_CHAT_FAMILY_KIMI : KT_CHAT_FAMILY_DEEPSEEK;
}

const char *const *kt_chat_stop_strings(kt_chat_format format, size_t *count)
{
    return kt_chat_family_stop_strings(revision_family(kt_chat_revision_of(format)), count);
}

const char *kt_chat_family_name(kt_chat_family family)
{
    return family == KT_CHAT_FAMILY_KIMI ? "kimi" : family == KT_CHAT_FAMILY_DEEPSEEK ? "deepseek" : "unknown";
}

static bool special_in_vocab(const struct kt_tokenizer *tok, const char *text)
{
    int32_t id = tok ? kt_token_find(tok, text, strlen(text)) : -1;
    return id >= 0 && kt_token_type(tok, id) != KT_TOK_NORMAL && kt_token_type(tok, id) != KT_TOK_BYTE &&
           kt_token_type(tok, id) != KT_TOK_UNDEFINED;
}

kt_chat_traits kt_chat_traits_of(kt_chat_format format, const char *template_text, const struct kt_tokenizer *tok)
{
    if (format != KT_CHAT_JINJA) {
        const kt_chat_revision *rev = kt_chat_revision_of(format);
        return (kt_chat_traits){
            .family = revision_family(rev),
            .thinks = format == KT_CHAT_KIMI_K2_THINKING || format == KT_CHAT_DEEPSEEK_R1 ||
                      format == KT_CHAT_DEEPSEEK_R1_THINK,
            .renders_tools = kt_chat_format_renders_tools(format),
        };
    }
    const char *t = template_text ? template_text : "";
    kt_chat_traits traits = {.thinks = strstr(t, "<think>") || strstr(t, "</think>"),
                             .renders_tools = strstr(t, "tools") != NULL};
    if (strstr(t, "<|tool_calls_section_begin|>") && strstr(t, "<|tool_call_begin|>"))
        traits.family = KT_CHAT_FAMILY_KIMI;
    else if (strstr(t, "<｜tool▁calls▁begin｜>") || strstr(t, "<｜tool▁call▁begin｜>"))
        /* V3 and R1 write "TYPE<｜tool▁sep｜>NAME" then a ```json fence; V3.1 "NAME<｜tool▁sep｜>ARGS", which kt does not parse */
        traits.family = strstr(t, "```json") && strstr(t, "<｜tool▁sep｜>") ? KT_CHAT_FAMILY_DEEPSEEK
                                                                               : KT_CHAT_FAMILY_UNKNOWN;
    else if (special_in_vocab(tok, "<|tool_calls_section_begin|>"))
        traits.family = KT_CHAT_FAMILY_KIMI;
    else if (special_in_vocab(tok, "<｜tool▁calls▁begin｜>"))
        traits.family = KT_CHAT_FAMILY_DEEPSEEK;
    return traits;
}

/* The template with each two-character "\n" turned into a newline. */
static char *unescape_newlines(const char *template_text)
{
    size_t len = strlen(template_text);
    char *out = malloc(len + 1);
    if (!out)
        return NULL;
    size_t o = 0;
    for (size_t i = 0; i < len; i++) {
        if (template_text[i] == '\\' && template_text[i + 1] == 'n') {
            out[o++] = '\n';
            i++;
        } else {
            out[o++] = template_text[i];
        }
    }
    out[o] = '\0';
    return out;
}

kt_status kt_chat_format_detect(const char *template_text, kt_chat_format *format, kt_err *err)
{
    *format = KT_CHAT_FORMAT_UNKNOWN;
    if (!template_text || !template_text[0])
        return kt_err_set(err, KT_ERR_UNSUPPORTED, "the model has no chat template");
    char *text = unescape_newlines(template_text);
    if (!text)
        return kt_err_set(err, KT_ERR_NOMEM, "out of memory reading the chat template");

    const char *family = NULL;
    if (strstr(text, "<|tool_calls_section_begin|>") && strstr(text, "<|tool_call_begin|>"))
        family = "Kimi-K2";
    else if (strstr(text, "<｜tool▁calls▁begin｜>") && strstr(text, "<｜tool▁sep｜>"))
        family = "DeepSeek";

    /* The revision that matches every pin wins; otherwise report the nearest. */
    const revision_pattern *nearest = NULL;
    const char *nearest_missing = NULL;
    int nearest_score = -1;
    for (size_t p = 0; family && p < sizeof patterns / sizeof patterns[0]; p++) {
        const revision_pattern *pat = &patterns[p];
        if (kt_chat_revision_of(pat->format)->is_kimi != (family[0] == 'K'))
            continue;
        int score = 0;
        const char *missing = NULL;
        for (size_t i = 0; i < sizeof pat->required / sizeof pat->required[0] && pat->required[i]; i++) {
            if (strstr(text, pat->required[i]))
                score++;
            else if (!missing)
                missing = pat->required[i];
        }
        for (size_t i = 0; i < sizeof pat->forbidden / sizeof pat->forbidden[0] && pat->forbidden[i]; i++)
            if (strstr(text, pat->forbidden[i]) && !missing)
                missing = pat->forbidden[i];
        if (!missing) {
            *format = pat->format;
            free(text);
            return KT_OK;
        }
        if (score > nearest_score) {
            nearest = pat;
            nearest_missing = missing;
            nearest_score = score;
        }
    }
    free(text);
    if (!family)
        return kt_err_set(err, KT_ERR_UNSUPPORTED,
                          "chat template not recognised: kt renders Kimi-K2 and DeepSeek-V3/R1 "
                          "templates, and this one has neither family's tool-call markers");
    bool forbidden = false;
    for (size_t i = 0; i < sizeof nearest->forbidden / sizeof nearest->forbidden[0]; i++)
        forbidden |= nearest->forbidden[i] == nearest_missing;
    return kt_err_set(err, KT_ERR_UNSUPPORTED,
                      "%s chat template revision not recognised (closest: %s, which %s \"%.120s\"); "
                      "rendering another revision would not reproduce the model's training prompt",
                      family, kt_chat_format_name(nearest->format),
                      forbidden ? "does not contain" : "needs", nearest_missing);
}

static kt_status render_jinja(const kt_chat_message *messages, size_t n, const json_t *tools,
                              const kt_chat_options *options, char **out, kt_err *err);

/* Whether the native renderer of format writes what the template itself
 * writes for a few probe conversations (plain turns, a tool call and its
 * result, reasoning, tools declared, with and without a generation prompt):
 * the substrings detection pins cannot see statements a template adds.  A
 * template the interpreter cannot render keeps the native renderer. */
static bool native_matches_template(kt_chat_format format, const char *template_text)
{
    static const kt_chat_tool_call call = {"functions.get_weather:0", "get_weather", "{\"city\": \"Paris\"}"};
    static const kt_chat_message plain[] = {
        {.role = KT_CHAT_SYSTEM, .content = "Be brief."},
        {.role = KT_CHAT_USER, .content = "Hi"},
        {.role = KT_CHAT_ASSISTANT, .content = "Hello.", .reasoning_content = "greet"},
        {.role = KT_CHAT_USER, .content = "Weather?"},
    };
    static const kt_chat_message tools_turns[] = {
        {.role = KT_CHAT_USER, .content = "Weather in Paris?"},
        {.role = KT_CHAT_ASSISTANT, .content = "", .tool_calls = &call, .n_tool_calls = 1},
        {.role = KT_CHAT_TOOL, .content = "sunny", .tool_call_id = "functions.get_weather:0"},
    };
    const char *tools = "[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"parameters\": "
                        "{\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}}}}}]";
    json_t *tools_json = json_loads(tools, 0, NULL);
    bool same = true;
    for (int probe = 0; probe < 4 && same && tools_json; probe++) {
        kt_chat_options o = {.add_generation_prompt = probe % 2 == 0, .tools = probe >= 2 ? tools_json : NULL,
                             .bos_token = "<｜begin▁of▁sentence｜>", .eos_token = "<｜end▁of▁sentence｜>",
                             .template_text = template_text};
        const kt_chat_message *m = probe < 2 ? plain : tools_turns;
        size_t n = probe < 2 ? sizeof plain / sizeof plain[0] : sizeof tools_turns / sizeof tools_turns[0];
        char *native = NULL, *jinja = NULL;
        kt_err e = {0};
        if (kt_chat_render(format, m, n, &o, &native, &e) == KT_OK &&
            render_jinja(m, n, o.tools, &o, &jinja, &e) == KT_OK)
            same = strcmp(native, jinja) == 0;
        free(native);
        free(jinja);
    }
    json_decref(tools_json);
    return same;
}

kt_status kt_chat_format_resolve(const char *template_text, kt_chat_format *format, kt_err *err)
{
    kt_err why = {0};
    kt_status st = kt_chat_format_detect(template_text, format, &why);
    if (st == KT_OK && !native_matches_template(*format, template_text)) {
        *format = KT_CHAT_JINJA; /* a known revision with something added: only the interpreter renders it */
        return KT_OK;
    }
    if (st != KT_ERR_UNSUPPORTED || !template_text || !template_text[0]) {
        if (st != KT_OK && err)
            *err = why;
        return st;
    }
    kt_jinja_template *t = NULL;
    st = kt_jinja_parse(template_text, strlen(template_text), &t, &why);
    kt_jinja_destroy(t);
    if (st == KT_ERR_NOMEM)
        return kt_err_set(err, st, "%s", why.msg);
    if (st != KT_OK)
        return kt_err_set(err, KT_ERR_UNSUPPORTED, "chat template not recognised and not rendered: %s", why.msg);
    *format = KT_CHAT_JINJA;
    return KT_OK;
}

/* ------------------------------------------------------ JSON messages --- */

static char *dup_bytes(const char *s, size_t len)
{
    char *out = malloc(len + 1);
    if (out) {
        memcpy(out, s, len);
        out[len] = '\0';
    }
    return out;
}

static const char *json_type_name(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "object";
    case JSON_ARRAY: return "array";
    case JSON_STRING: return "string";
    case JSON_INTEGER: return "integer";
    case JSON_REAL: return "number";
    case JSON_TRUE:
    case JSON_FALSE: return "boolean";
    case JSON_NULL: return "null";
    }
    return "value";
}

/* A JSON string as a C string; *out NULL when value is absent or null. */
static kt_status get_string(const json_t *value, const char *where, const char *field,
                            char **out, kt_err *err)
{
    *out = NULL;
    if (!value || json_is_null(value))
        return KT_OK;
    if (!json_is_string(value))
        return kt_err_set(err, KT_ERR_INVALID, "%s.%s: expected a string, got %s", where, field,
                          json_type_name(value));
    size_t len = json_string_length(value);
    if (memchr(json_string_value(value), '\0', len))
        return kt_err_set(err, KT_ERR_INVALID, "%s.%s: contains a NUL character", where, field);
    *out = dup_bytes(json_string_value(value), len);
    return *out ? KT_OK : kt_err_set(err, KT_ERR_NOMEM, "%s.%s: out of memory", where, field);
}

/* content: a string, null, or text parts concatenated in order. */
static kt_status get_content(const json_t *value, const char *where, char **out, kt_err *err)
{
    *out = NULL;
    if (!value || json_is_null(value) || json_is_string(value))
        return get_string(value, where, "content", out, err);
    if (!json_is_array(value))
        return kt_err_set(err, KT_ERR_INVALID,
                          "%s.content: expected a string, an array of content parts or null, got %s",
                          where, json_type_name(value));
    kt_chat_text text = {0};
    kt_chat_text_append(&text, "", 0); /* an empty array is "" */
    for (size_t i = 0; i < json_array_size(value); i++) {
        const json_t *part = json_array_get(value, i);
        if (!json_is_object(part)) {
            free(text.bytes);
            return kt_err_set(err, KT_ERR_INVALID, "%s.content[%zu]: expected an object, got %s",
                              where, i, json_type_name(part));
        }
        const json_t *type = json_object_get(part, "type");
        if (!json_is_string(type)) {
            free(text.bytes);
            return kt_err_set(err, KT_ERR_INVALID, "%s.content[%zu].type: expected a string, got %s",
                              where, i, type ? json_type_name(type) : "nothing");
        }
        if (strcmp(json_string_value(type), "text") != 0) {
            free(text.bytes);
            return kt_err_set(err, KT_ERR_UNSUPPORTED,
                              "%s.content[%zu]: \"%s\" parts are not supported; kt serves text-only "
                              "models", where, i, json_string_value(type));
        }
        const json_t *part_text = json_object_get(part, "text");
        if (!json_is_string(part_text)) {
            free(text.bytes);
            return kt_err_set(err, KT_ERR_INVALID, "%s.content[%zu].text: expected a string, got %s",
                              where, i, part_text ? json_type_name(part_text) : "nothing");
        }
        size_t len = json_string_length(part_text);
        if (memchr(json_string_value(part_text), '\0', len)) {
            free(text.bytes);
            return kt_err_set(err, KT_ERR_INVALID, "%s.content[%zu].text: contains a NUL character",
                              where, i);
        }
        kt_chat_text_append(&text, json_string_value(part_text), len);
    }
    if (text.out_of_memory) {
        free(text.bytes);
        return kt_err_set(err, KT_ERR_NOMEM, "%s.content: out of memory", where);
    }
    *out = text.bytes;
    return KT_OK;
}

static kt_status get_tool_call(const json_t *call, const char *where, kt_chat_tool_call *out,
                               kt_err *err)
{
    if (!json_is_object(call))
        return kt_err_set(err, KT_ERR_INVALID, "%s: expected an object, got %s", where,
                          json_type_name(call));
    const json_t *type = json_object_get(call, "type");
    if (type && !(json_is_string(type) && strcmp(json_string_value(type), "function") == 0))
        return kt_err_set(err, KT_ERR_INVALID, "%s.type: expected \"function\"", where);
    char *s = NULL;
    kt_status st = get_string(json_object_get(call, "id"), where, "id", &s, err);
    out->id = s;
    if (st != KT_OK)
        return st;
    const json_t *function = json_object_get(call, "function");
    if (!json_is_object(function))
        return kt_err_set(err, KT_ERR_INVALID, "%s.function: expected an object, got %s", where,
                          function ? json_type_name(function) : "nothing");
    const json_t *name = json_object_get(function, "name");
    if (!json_is_string(name) || json_string_length(name) == 0)
        return kt_err_set(err, KT_ERR_INVALID, "%s.function.name: expected a non-empty string, got %s",
                          where, name ? json_type_name(name) : "nothing");
    st = get_string(name, where, "function.name", &s, err);
    out->name = s;
    if (st != KT_OK)
        return st;
    const json_t *args = json_object_get(function, "arguments");
    if (json_is_string(args)) {
        st = get_string(args, where, "function.arguments", &s, err);
        out->arguments = s;
        return st;
    }
    if (!json_is_object(args) && !json_is_array(args))
        return kt_err_set(err, KT_ERR_INVALID,
                          "%s.function.arguments: expected a JSON string or object, got %s", where,
                          args ? json_type_name(args) : "nothing");
    kt_chat_text text = {0};
    kt_chat_text_json(&text, args);
    if (text.out_of_memory) {
        free(text.bytes);
        return kt_err_set(err, KT_ERR_NOMEM, "%s.function.arguments: out of memory", where);
    }
    out->arguments = text.bytes;
    return KT_OK;
}

static kt_status get_message(const json_t *msg, size_t index, kt_chat_message *out, kt_err *err)
{
    char where[48];
    snprintf(where, sizeof where, "messages[%zu]", index);
    if (!json_is_object(msg))
        return kt_err_set(err, KT_ERR_INVALID, "%s: expected an object, got %s", where,
                          json_type_name(msg));
    const json_t *role = json_object_get(msg, "role");
    if (!role)
        return kt_err_set(err, KT_ERR_INVALID, "%s.role: missing", where);
    if (!json_is_string(role))
        return kt_err_set(err, KT_ERR_INVALID, "%s.role: expected a string, got %s", where,
                          json_type_name(role));
    static const char *const roles[] = {"system", "user", "assistant", "tool"};
    size_t r = 0;
    while (r < 4 && strcmp(json_string_value(role), roles[r]) != 0)
        r++;
    if (r == 4)
        return kt_err_set(err, KT_ERR_INVALID,
                          "%s.role: unknown role \"%.40s\" (expected system, user, assistant or tool)",
                          where, json_string_value(role));
    out->role = (kt_chat_role)r;

    char *s = NULL;
    kt_status st = get_content(json_object_get(msg, "content"), where, &s, err);
    out->content = s;
    if (st == KT_OK) {
        st = get_string(json_object_get(msg, "name"), where, "name", &s, err);
        out->name = s;
    }
    if (st == KT_OK) {
        st = get_string(json_object_get(msg, "tool_call_id"), where, "tool_call_id", &s, err);
        out->tool_call_id = s;
    }
    if (st == KT_OK) {
        const char *field = "reasoning_content";
        const json_t *reasoning = json_object_get(msg, field);
        if (!reasoning || json_is_null(reasoning)) {
            field = "reasoning";
            reasoning = json_object_get(msg, field);
        }
        st = get_string(reasoning, where, field, &s, err);
        out->reasoning_content = s;
    }
    if (st != KT_OK)
        return st;
    if (out->role == KT_CHAT_TOOL && !out->content)
        return kt_err_set(err, KT_ERR_INVALID, "%s.content: a tool message needs content", where);

    const json_t *calls = json_object_get(msg, "tool_calls");
    if (!calls || json_is_null(calls) || (json_is_array(calls) && json_array_size(calls) == 0))
        return KT_OK;
    if (out->role != KT_CHAT_ASSISTANT)
        return kt_err_set(err, KT_ERR_INVALID, "%s.tool_calls: only assistant messages carry tool calls",
                          where);
    if (!json_is_array(calls))
        return kt_err_set(err, KT_ERR_INVALID, "%s.tool_calls: expected an array, got %s", where,
                          json_type_name(calls));
    kt_chat_tool_call *list = calloc(json_array_size(calls), sizeof *list);
    if (!list)
        return kt_err_set(err, KT_ERR_NOMEM, "%s.tool_calls: out of memory", where);
    out->tool_calls = list;
    out->n_tool_calls = json_array_size(calls);
    for (size_t i = 0; i < out->n_tool_calls; i++) {
        char call_where[112];
        snprintf(call_where, sizeof call_where, "%s.tool_calls[%zu]", where, i);
        st = get_tool_call(json_array_get(calls, i), call_where, &list[i], err);
        if (st != KT_OK)
            return st;
    }
    return KT_OK;
}

void kt_chat_messages_free(kt_chat_messages *messages)
{
    if (!messages)
        return;
    for (size_t i = 0; i < messages->count; i++) {
        kt_chat_message *m = &messages->items[i];
        free((char *)m->content);
        free((char *)m->name);
        free((char *)m->tool_call_id);
        free((char *)m->reasoning_content);
        for (size_t c = 0; c < m->n_tool_calls; c++) {
            free((char *)m->tool_calls[c].id);
            free((char *)m->tool_calls[c].name);
            free((char *)m->tool_calls[c].arguments);
        }
        free((kt_chat_tool_call *)m->tool_calls);
    }
    free(messages->items);
    messages->items = NULL;
    messages->count = 0;
}

kt_status kt_chat_messages_from_json(const json_t *messages, kt_chat_messages *out, kt_err *err)
{
    out->items = NULL;
    out->count = 0;
    if (!json_is_array(messages))
        return kt_err_set(err, KT_ERR_INVALID, "messages: expected an array, got %s",
                          messages ? json_type_name(messages) : "nothing");
    size_t n = json_array_size(messages);
    if (n == 0)
        return KT_OK;
    out->items = calloc(n, sizeof *out->items);
    if (!out->items)
        return kt_err_set(err, KT_ERR_NOMEM, "messages: out of memory");
    for (size_t i = 0; i < n; i++) {
        out->count = i + 1; /* the partly filled one is freed too */
        kt_status st = get_message(json_array_get(messages, i), i, &out->items[i], err);
        if (st != KT_OK) {
            kt_chat_messages_free(out);
            return st;
        }
    }
    return KT_OK;
}

/* --------------------------------------------------------------- render --- */

static kt_status check_messages(const kt_chat_message *messages, size_t n, kt_err *err)
{
    for (size_t i = 0; i < n; i++) {
        const kt_chat_message *m = &messages[i];
        if ((unsigned)m->role > KT_CHAT_TOOL)
            return kt_err_set(err, KT_ERR_INVALID, "messages[%zu]: role %d is not a kt_chat_role", i,
                              (int)m->role);
        if (m->role == KT_CHAT_TOOL && !m->content)
            return kt_err_set(err, KT_ERR_INVALID, "messages[%zu].content: a tool message needs content", i);
        if (m->n_tool_calls && m->role != KT_CHAT_ASSISTANT)
            return kt_err_set(err, KT_ERR_INVALID,
                              "messages[%zu].tool_calls: only assistant messages carry tool calls", i);
        if (m->n_tool_calls && !m->tool_calls)
            return kt_err_set(err, KT_ERR_INVALID, "messages[%zu].tool_calls: NULL with %zu calls", i,
                              m->n_tool_calls);
        for (size_t c = 0; c < m->n_tool_calls; c++)
            if (!m->tool_calls[c].name || !m->tool_calls[c].arguments)
                return kt_err_set(err, KT_ERR_INVALID,
                                  "messages[%zu].tool_calls[%zu]: a call needs a name and arguments", i, c);
    }
    return KT_OK;
}

/* ------------------------------------------------- the Jinja fallback --- */

static int set_str(json_t *obj, const char *key, const char *value)
{
    return value ? json_object_set_new(obj, key, json_string_nocheck(value)) : 0;
}

/* The message as HF's templates see it after kt_chat_messages_from_json:
 * absent fields absent, content "" for NULL, every call of type "function"
 * with its arguments as JSON text (tests/golden/chat/README.md). */
static json_t *message_json(const kt_chat_message *m)
{
    static const char *const roles[] = {"system", "user", "assistant", "tool"};
    json_t *o = json_object();
    if (!o || set_str(o, "role", roles[m->role]) || set_str(o, "content", m->content ? m->content : "") ||
        set_str(o, "name", m->name) || set_str(o, "tool_call_id", m->tool_call_id) ||
        set_str(o, "reasoning_content", m->reasoning_content))
        goto fail;
    if (m->n_tool_calls) {
        json_t *calls = json_array();
        if (!calls || json_object_set_new(o, "tool_calls", calls))
            goto fail;
        for (size_t c = 0; c < m->n_tool_calls; c++) {
            const kt_chat_tool_call *tc = &m->tool_calls[c];
            json_t *call = json_object(), *fn;
            if (!call || json_array_append_new(calls, call) || set_str(call, "id", tc->id) ||
                set_str(call, "type", "function") || !(fn = json_object()) ||
                json_object_set_new(call, "function", fn) || set_str(fn, "name", tc->name) ||
                set_str(fn, "arguments", tc->arguments))
                goto fail;
        }
    }
    return o;
fail:
    json_decref(o);
    return NULL;
}

static kt_status render_jinja(const kt_chat_message *messages, size_t n, const json_t *tools,
                              const kt_chat_options *options, char **out, kt_err *err)
{
    kt_status st = KT_ERR_NOMEM;
    kt_jinja_template *t = NULL;
    json_t *ctx = json_object(), *list = json_array();
    if (!ctx || !list || json_object_set(ctx, "messages", list))
        goto nomem;
    for (size_t i = 0; i < n; i++) {
        json_t *m = message_json(&messages[i]);
        if (!m || json_array_append_new(list, m))
            goto nomem;
    }
    /* transformers passes tools=None and documents=None when there are none */
    if (json_object_set_new(ctx, "tools", tools ? json_incref((json_t *)tools) : json_null()) ||
        json_object_set_new(ctx, "documents", json_null()) ||
        json_object_set_new(ctx, "add_generation_prompt", json_boolean(options->add_generation_prompt)) ||
        set_str(ctx, "bos_token", options->bos_token) || set_str(ctx, "eos_token", options->eos_token))
        goto nomem;
    if (options->thinking != KT_CHAT_THINKING_DEFAULT) {
        bool on = options->thinking == KT_CHAT_THINKING_ON;
        if (json_object_set_new(ctx, "thinking", json_boolean(on)) ||
            json_object_set_new(ctx, "enable_thinking", json_boolean(on)))
            goto nomem;
    }
    st = kt_jinja_parse(options->template_text, strlen(options->template_text), &t, err);
    if (st == KT_OK)
        st = kt_jinja_render(t, ctx, NULL, out, NULL, err);
    goto done;
nomem:
    st = kt_err_set(err, KT_ERR_NOMEM, "out of memory rendering the chat prompt");
done:
    kt_jinja_destroy(t);
    json_decref(list);
    json_decref(ctx);
    return st;
}

kt_status kt_chat_render(kt_chat_format format, const kt_chat_message *messages, size_t n,
                         const kt_chat_options *options, char **out, kt_err *err)
{
    *out = NULL;
    static const kt_chat_options no_options = {0};
    if (!options)
        options = &no_options;
    const kt_chat_revision *rev = kt_chat_revision_of(format);
    if (format == KT_CHAT_JINJA && !options->template_text)
        return kt_err_set(err, KT_ERR_UNSUPPORTED, "a Jinja chat format needs the template text");
    if (rev->format == KT_CHAT_FORMAT_UNKNOWN && format != KT_CHAT_JINJA)
        return kt_err_set(err, KT_ERR_UNSUPPORTED, "no chat template format to render with");
    if (n && !messages)
        return kt_err_set(err, KT_ERR_INVALID, "messages: NULL with %zu messages", n);
    kt_status st = check_messages(messages, n, err);
    if (st != KT_OK)
        return st;

    json_t *parsed_tools = NULL;
    const json_t *tools = options->tools;
    if (!tools && options->tools_json) {
        json_error_t jerr;
        parsed_tools = json_loads(options->tools_json, JSON_DECODE_ANY, &jerr);
        if (!parsed_tools)
            return kt_err_set(err, KT_ERR_INVALID, "tools: not JSON (line %d, column %d: %s)", jerr.line,
                              jerr.column, jerr.text);
        tools = parsed_tools;
    }
    if (tools && !json_is_null(tools) && !json_is_array(tools)) {
        st = kt_err_set(err, KT_ERR_INVALID, "tools: expected an array, got %s", json_type_name(tools));
        json_decref(parsed_tools);
        return st;
    }
    if (tools && json_array_size(tools) == 0)
        tools = NULL; /* `{% if tools %}` is false for [] and null */

    if (format == KT_CHAT_JINJA) {
        st = render_jinja(messages, n, tools, options, out, err);
        json_decref(parsed_tools);
        return st;
    }
    const char *bos = options->bos_token ? options->bos_token : "<｜begin▁of▁sentence｜>";
    bool agp = options->add_generation_prompt;
    kt_chat_text text = {0};
    kt_chat_text_append(&text, "", 0);
    switch (rev->format) {
    case KT_CHAT_KIMI_K2_INSTRUCT:
    case KT_CHAT_KIMI_K2_INSTRUCT_TOOLS_NL:
    case KT_CHAT_KIMI_K2_INSTRUCT_TOOLS:
    case KT_CHAT_KIMI_K2_INSTRUCT_0905:
        kt_chat_render_kimi_instruct(rev, messages, n, tools, agp, &text);
        break;
    case KT_CHAT_KIMI_K2_THINKING:
        kt_chat_render_kimi_thinking(messages, n, tools, agp, &text);
        break;
    case KT_CHAT_DEEPSEEK_V3_0324:
        kt_chat_render_deepseek_v3_0324(messages, n, bos, agp, &text);
        break;
    case KT_CHAT_DEEPSEEK_R1:
    case KT_CHAT_DEEPSEEK_R1_THINK:
        kt_chat_render_deepseek_r1(rev, messages, n, bos, agp, &text);
        break;
    default:
        break;
    }
    json_decref(parsed_tools);
    if (text.out_of_memory) {
        free(text.bytes);
        return kt_err_set(err, KT_ERR_NOMEM, "out of memory rendering the chat prompt");
    }
    *out = text.bytes;
    return KT_OK;
}
