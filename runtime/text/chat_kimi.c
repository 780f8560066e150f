/*
 * chat_kimi.c - the Kimi-K2 chat templates (Instruct revisions and
 * Thinking), written out as the C their Jinja sources amount to under HF's
 * trim_blocks/lstrip_blocks.  Each quirk of a revision's whitespace is a
 * field of kt_chat_revision, pinned by the substrings chat.c detects.
 *
 * Input is already validated; these functions only append, and must never
 * add, drop or reorder a byte relative to the template (tests/golden/chat).
 */
#include <stdint.h>

#include "chat_internal.h"

#define KIMI_DEFAULT_SYSTEM \
    "<|im_system|>system<|im_middle|>You are Kimi, an AI assistant created by Moonshot AI.<|im_end|>"
#define KIMI_GENERATION_PROMPT "<|im_assistant|>assistant<|im_middle|>"

static const char *const role_words[] = {"system", "user", "assistant", "tool"};

/* `message.get('name') or message['role']`: an empty name falls back too.
 * system, tool (and any other role) share <|im_system|>. */
static void header(const kt_chat_message *m, bool newline_after_system_header, kt_chat_text *out)
{
    const char *name = m->name && m->name[0] ? m->name : role_words[m->role];
    kt_chat_text_puts(out, m->role == KT_CHAT_USER        ? "<|im_user|>"
                           : m->role == KT_CHAT_ASSISTANT ? "<|im_assistant|>"
                                                          : "<|im_system|>");
    kt_chat_text_puts(out, name);
    kt_chat_text_puts(out, "<|im_middle|>");
    if (newline_after_system_header && m->role != KT_CHAT_USER && m->role != KT_CHAT_ASSISTANT)
        kt_chat_text_puts(out, "\n");
}

/* Ids are the caller's, verbatim (Kimi was trained on functions.NAME:IDX). */
static void tool_calls(const kt_chat_message *m, kt_chat_text *out)
{
    kt_chat_text_puts(out, "<|tool_calls_section_begin|>");
    for (size_t i = 0; i < m->n_tool_calls; i++) {
        kt_chat_text_puts(out, "<|tool_call_begin|>");
        kt_chat_text_puts(out, m->tool_calls[i].id);
        kt_chat_text_puts(out, "<|tool_call_argument_begin|>");
        kt_chat_text_puts(out, m->tool_calls[i].arguments);
        kt_chat_text_puts(out, "<|tool_call_end|>");
    }
    kt_chat_text_puts(out, "<|tool_calls_section_end|>");
}

void kt_chat_render_kimi_instruct(const kt_chat_revision *rev, const kt_chat_message *messages,
                                  size_t n, const json_t *tools, bool add_generation_prompt,
                                  kt_chat_text *out)
{
    if (tools) {
        kt_chat_text_puts(out, "<|im_system|>tool_declare<|im_middle|>");
        if (rev->tools_header)
            kt_chat_text_puts(out, "\n  # Tools\n  ");
        kt_chat_text_json(out, tools);
        kt_chat_text_puts(out, "<|im_end|>");
    }
    for (size_t i = 0; i < n; i++) {
        const kt_chat_message *m = &messages[i];
        if (i == 0 && m->role != KT_CHAT_SYSTEM)
            kt_chat_text_puts(out, KIMI_DEFAULT_SYSTEM);
        header(m, rev->newline_after_system_header, out);
        if (m->role == KT_CHAT_ASSISTANT && m->n_tool_calls) {
            kt_chat_text_puts(out, m->content);
            tool_calls(m, out);
        } else if (m->role == KT_CHAT_TOOL) {
            /* The content line keeps its four spaces of indentation: lstrip_blocks
             * strips before block tags only, not before {{ }}. */
            kt_chat_text_puts(out, "## Return of ");
            kt_chat_text_puts(out, m->tool_call_id);
            kt_chat_text_puts(out, "\n    ");
            kt_chat_text_puts(out, m->content);
        } else {
            kt_chat_text_puts(out, m->content);
        }
        if (!rev->open_last_turn || add_generation_prompt || i + 1 < n)
            kt_chat_text_puts(out, "<|im_end|>");
    }
    if (add_generation_prompt)
        kt_chat_text_puts(out, KIMI_GENERATION_PROMPT);
}

/* Turns up to the last assistant answer without tool calls are history and
 * lose their reasoning (<think></think>); later turns, the agentic tool loop
 * in progress, keep it. */
void kt_chat_render_kimi_thinking(const kt_chat_message *messages, size_t n, const json_t *tools,
                                  bool add_generation_prompt, kt_chat_text *out)
{
    size_t history_end = 0; /* messages[0..history_end) are history */
    for (size_t i = n; i-- > 0;) {
        if (messages[i].role == KT_CHAT_ASSISTANT && messages[i].n_tool_calls == 0) {
            history_end = i + 1;
            break;
        }
    }
    if (tools) {
        kt_chat_text_puts(out, "<|im_system|>tool_declare<|im_middle|>");
        kt_chat_text_json(out, tools);
        kt_chat_text_puts(out, "<|im_end|>");
    }
    if (n == 0 || messages[0].role != KT_CHAT_SYSTEM)
        kt_chat_text_puts(out, KIMI_DEFAULT_SYSTEM);
    for (size_t i = 0; i < n; i++) {
        const kt_chat_message *m = &messages[i];
        header(m, false, out);
        if (m->role == KT_CHAT_ASSISTANT) {
            kt_chat_text_puts(out, "<think>");
            if (i >= history_end)
                kt_chat_text_puts(out, m->reasoning_content);
            kt_chat_text_puts(out, "</think>");
            kt_chat_text_puts(out, m->content);
            if (m->n_tool_calls)
                tool_calls(m, out);
        } else if (m->role == KT_CHAT_TOOL) {
            kt_chat_text_puts(out, "## Return of ");
            kt_chat_text_puts(out, m->tool_call_id);
            kt_chat_text_puts(out, "\n");
            kt_chat_text_puts(out, m->content);
        } else {
            kt_chat_text_puts(out, m->content);
        }
        kt_chat_text_puts(out, "<|im_end|>");
    }
    if (add_generation_prompt)
        kt_chat_text_puts(out, KIMI_GENERATION_PROMPT);
}
