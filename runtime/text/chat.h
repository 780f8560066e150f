/*
 * chat.h - chat templates: OpenAI-style messages in, the exact prompt text
 * the model was trained on out.
 *
 * kt recognises the template a GGUF file carries (tokenizer.chat_template)
 * as one of the published revisions below and renders it natively, byte for
 * byte as HF transformers renders that revision (jinja2 with trim_blocks and
 * lstrip_blocks, tojson = Python json.dumps with ensure_ascii=False), which
 * tests/golden/chat proves.  Any other template (a community fix, another
 * model's) is rendered by the Jinja interpreter (jinja.h) as KT_CHAT_JINJA,
 * never approximated by a near revision: a prompt that differs from training
 * by one newline is a different prompt.
 *
 * Rendering never tokenizes and never touches the model; the text may contain
 * special-token strings (from the template and from user content alike).
 */
#ifndef KT_CHAT_H
#define KT_CHAT_H

#include <stdbool.h>
#include <stddef.h>

#include <jansson.h>

#include "status.h"

/* One value per template revision kt renders; see kt_chat_format_detect. */
typedef enum kt_chat_format {
    KT_CHAT_FORMAT_UNKNOWN = 0,
    KT_CHAT_KIMI_K2_INSTRUCT,          /* Kimi-K2-Instruct, July 2025: tools JSON right after the header */
    KT_CHAT_KIMI_K2_INSTRUCT_TOOLS_NL, /* "# Tools" header; a bare {% endif %} puts "\n" after system/tool headers */
    KT_CHAT_KIMI_K2_INSTRUCT_TOOLS,    /* "# Tools" header, that endif fixed (August 2025) */
    KT_CHAT_KIMI_K2_INSTRUCT_0905,     /* as above, and a trailing turn stays open without a generation prompt */
    KT_CHAT_KIMI_K2_THINKING,          /* Kimi-K2-Thinking: <think> blocks, reasoning kept after the last plain answer */
    KT_CHAT_DEEPSEEK_V3_0324,          /* DeepSeek-V3-0324: "<｜Assistant｜>" follows every user turn */
    KT_CHAT_DEEPSEEK_R1,               /* DeepSeek-R1, January 2025: generation prompt "<｜Assistant｜>" */
    KT_CHAT_DEEPSEEK_R1_THINK,         /* DeepSeek-R1, later revision: generation prompt "<｜Assistant｜><think>\n" */
    KT_CHAT_FORMAT_COUNT,              /* the native revisions are 1 .. COUNT-1 */
    /* Not a revision: kt_chat_options.template_text rendered by the Jinja
     * interpreter; kt_chat_traits_of finds its family from the template text. */
    KT_CHAT_JINJA = KT_CHAT_FORMAT_COUNT,
} kt_chat_format;

/* Identifies the revision from the template text by the substrings that
 * decide its output (listed in chat.c); KT_ERR_UNSUPPORTED with a message
 * naming what was seen when no known revision matches. */
kt_status kt_chat_format_detect(const char *template_text, kt_chat_format *format, kt_err *err);

/* How kt renders a template: the revision kt_chat_format_detect names when
 * its native renderer writes what the template writes for a few probe
 * conversations (a template that adds to a known revision fails that), or
 * else KT_CHAT_JINJA when the interpreter parses it.  Fails with
 * KT_ERR_UNSUPPORTED when there is no template or it is not Jinja that kt
 * parses (the message names the line). */
kt_status kt_chat_format_resolve(const char *template_text, kt_chat_format *format, kt_err *err);

/* "kimi-k2-instruct", "deepseek-r1-think", ..., "jinja"; "unknown" for anything else. */
const char *kt_chat_format_name(kt_chat_format format);

/* Whether the template renders a tools declaration.  The DeepSeek-V3/R1
 * templates do not: kt then renders no declaration either (as HF does), and a
 * server must describe the tools in the system prompt or refuse the request.
 * KT_CHAT_JINJA: true (the template is given `tools`; what it does with them is its own). */
bool kt_chat_format_renders_tools(kt_chat_format format);

/* Texts that end a generation for the format's family (their published generation configs):
 * Kimi "<|im_end|>", "[EOS]", "[EOT]" and "<|im_middle|>" (a new header
 * started); DeepSeek "<｜end▁of▁sentence｜>"; none for KT_CHAT_JINJA, whose
 * family kt_chat_traits_of finds (kt_chat_family_stop_strings then; the
 * tokenizer's end-of-generation tokens always stop).  Static storage, *count set. */
const char *const *kt_chat_stop_strings(kt_chat_format format, size_t *count);

/* The model family behind a template: its tool-call syntax (serve_output.h
 * parses it, serve_grammar.h forces it) and its stop strings. */
typedef enum kt_chat_family {
    KT_CHAT_FAMILY_UNKNOWN = 0, /* no tool-call syntax kt knows: calls are not parsed or forced */
    KT_CHAT_FAMILY_KIMI,        /* <|tool_calls_section_begin|> <|tool_call_begin|> ID <|tool_call_argument_begin|> ... */
    KT_CHAT_FAMILY_DEEPSEEK,    /* <｜tool▁calls▁begin｜> <｜tool▁call▁begin｜> TYPE <｜tool▁sep｜> NAME ```json ... (V3, R1) */
} kt_chat_family;

/* What a server needs to know about a format beyond rendering it. */
typedef struct kt_chat_traits {
    kt_chat_family family;
    bool thinks;        /* the model may reason in <think> ... </think> before its answer */
    bool renders_tools; /* the template declares the request's tools itself (kt_chat_format_renders_tools) */
} kt_chat_traits;

struct kt_tokenizer;

/* A native format's traits are its revision's.  KT_CHAT_JINJA's come from
 * template_text, else from tok (may be NULL): the family is the one whose
 * tool-call markers the template writes (Kimi's section markers; DeepSeek's
 * with the V3/R1 call form "TYPE<｜tool▁sep｜>NAME\n```json" - a DeepSeek
 * template with another call form, as V3.1's, is UNKNOWN rather than misread);
 * a template that writes none takes the family whose section-begin marker is
 * a special token of tok's vocabulary.  thinks: the template mentions
 * "<think>" or "</think>".  renders_tools: the template reads `tools`. */
kt_chat_traits kt_chat_traits_of(kt_chat_format format, const char *template_text, const struct kt_tokenizer *tok);

/* "kimi", "deepseek", "unknown". */
const char *kt_chat_family_name(kt_chat_family family);

/* The family's stop strings (kt_chat_stop_strings); none for UNKNOWN. */
const char *const *kt_chat_family_stop_strings(kt_chat_family family, size_t *count);

typedef enum kt_chat_role {
    KT_CHAT_SYSTEM,
    KT_CHAT_USER,
    KT_CHAT_ASSISTANT,
    KT_CHAT_TOOL,
} kt_chat_role;

typedef struct kt_chat_tool_call {
    const char *id;        /* e.g. "functions.get_weather:0", kept verbatim; NULL renders as "" */
    const char *name;      /* function name, never NULL */
    const char *arguments; /* JSON text, rendered verbatim, never NULL */
} kt_chat_tool_call;

/* One turn.  NULL strings mean "absent"; a NULL content renders exactly as
 * an empty one in every supported template (tool turns must have content). */
typedef struct kt_chat_message {
    kt_chat_role role;
    const char *content;
    const char *name;              /* Kimi headers show it in place of the role */
    const char *tool_call_id;      /* tool turns: the call answered */
    const char *reasoning_content; /* assistant turns: rendered by Kimi-K2-Thinking only */
    const kt_chat_tool_call *tool_calls;
    size_t n_tool_calls;           /* 0: a plain turn */
} kt_chat_message;

/* Messages parsed from JSON; owns every string it points to. */
typedef struct kt_chat_messages {
    kt_chat_message *items; /* [count] */
    size_t count;
} kt_chat_messages;

/* Parses an OpenAI chat "messages" array.  Accepted: role system, user,
 * assistant or tool; content a string, null, or an array of {"type":"text",
 * "text":...} parts (concatenated, as Kimi's template does with parts);
 * name; tool_call_id; reasoning_content (or its alias "reasoning");
 * tool_calls [{id, type:"function", function:{name, arguments}}] on assistant
 * turns, where arguments given as a JSON string are kept verbatim and as an
 * object or array are serialised as Python's json.dumps would (the templates'
 * tojson).  An empty or null tool_calls is the same as none.  Errors are
 * KT_ERR_INVALID naming the place ("messages[2].tool_calls[0].function.name:
 * ..."), KT_ERR_UNSUPPORTED for image or audio parts.  Unknown fields are
 * ignored.  On failure *out is left empty. */
kt_status kt_chat_messages_from_json(const json_t *messages, kt_chat_messages *out, kt_err *err);

void kt_chat_messages_free(kt_chat_messages *messages);

typedef enum kt_chat_thinking {
    KT_CHAT_THINKING_DEFAULT, /* chat_template_kwargs.thinking not given */
    KT_CHAT_THINKING_ON,
    KT_CHAT_THINKING_OFF,
} kt_chat_thinking;

typedef struct kt_chat_options {
    bool add_generation_prompt;
    const json_t *tools;      /* the request's "tools" array, or NULL */
    const char *tools_json;   /* the same as JSON text; used only when tools is NULL */
    /* chat_template_kwargs.thinking.  None of the supported revisions reads
     * it (Kimi-K2-Thinking always thinks, DeepSeek-R1 prompts "<think>\n"
     * in its later revision); it is accepted and changes nothing, as in HF. */
    kt_chat_thinking thinking;
    /* DeepSeek renders start with bos_token, as HF's do: tokenize the prompt
     * without adding a second BOS (as the published templates do).  NULL: "<｜begin▁of▁sentence｜>". */
    const char *bos_token;
    const char *eos_token;    /* NULL: the family's own; no supported revision prints it */
    /* KT_CHAT_JINJA: the template's source.  The interpreter sees the
     * variables HF passes: messages (as kt_chat_messages_from_json normalised
     * them, a NULL content as ""), tools (none when empty), documents (none), add_generation_prompt,
     * bos_token and eos_token (when given), and thinking / enable_thinking
     * (when not DEFAULT). */
    const char *template_text;
} kt_chat_options;

/* Renders messages[0..n) into a malloc'd NUL-terminated *out (free() it).
 * Fails with KT_ERR_INVALID for malformed input (tools not an array, a tool
 * turn without content, tool calls outside assistant turns) and
 * KT_ERR_UNSUPPORTED for KT_CHAT_FORMAT_UNKNOWN (and KT_CHAT_JINJA without
 * template_text); a KT_CHAT_JINJA template's own failures are kt_jinja_render's. */
kt_status kt_chat_render(kt_chat_format format, const kt_chat_message *messages, size_t n,
                         const kt_chat_options *options, char **out, kt_err *err);

#endif
