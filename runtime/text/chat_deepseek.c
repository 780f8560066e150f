/*
 * chat_deepseek.c - the DeepSeek-R1 and DeepSeek-V3-0324 chat templates,
 * written out as the C their one-line Jinja sources amount to.
 *
 * Their quirks are the model's training format and are kept on purpose:
 * R1 never resets is_first/is_output_first, so a second round of tool calls
 * loses its "<｜Assistant｜><｜tool▁calls▁begin｜>" opener (and its content)
 * and a second round of results its "<｜tool▁outputs▁begin｜>"; R1 strips
 * reasoning up to the last "</think>" only from plain answers; neither
 * renders tool declarations or call ids.  Never "fix" them here.
 * A NULL content is "" (the templates would raise; "" is what they print for
 * the one branch that tests for none).
 */
#include <string.h>

#include "chat_internal.h"

#define EOS "<｜end▁of▁sentence｜>"

static const char *text_or_empty(const char *s)
{
    return s ? s : "";
}

/* bos_token, then every system message's content joined by "\n\n". */
static void system_prompt(const kt_chat_message *messages, size_t n, const char *bos,
                          kt_chat_text *out)
{
    kt_chat_text_puts(out, bos);
    bool first = true;
    for (size_t i = 0; i < n; i++) {
        if (messages[i].role != KT_CHAT_SYSTEM)
            continue;
        if (!first)
            kt_chat_text_puts(out, "\n\n");
        first = false;
        kt_chat_text_puts(out, messages[i].content);
    }
}

/* "function<｜tool▁sep｜>NAME\n```json\nARGS\n```<｜tool▁call▁end｜>" */
static void call_body(const kt_chat_tool_call *call, kt_chat_text *out)
{
    kt_chat_text_puts(out, "function<｜tool▁sep｜>");
    kt_chat_text_puts(out, call->name);
    kt_chat_text_puts(out, "\n```json\n");
    kt_chat_text_puts(out, call->arguments);
    kt_chat_text_puts(out, "\n```<｜tool▁call▁end｜>");
}

void kt_chat_render_deepseek_r1(const kt_chat_revision *rev, const kt_chat_message *messages,
                                size_t n, const char *bos_token, bool add_generation_prompt,
                                kt_chat_text *out)
{
    bool is_first = false, is_tool = false, is_output_first = true; /* the template's ns */
    system_prompt(messages, n, bos_token, out);
    for (size_t i = 0; i < n; i++) {
        const kt_chat_message *m = &messages[i];
        const char *content = text_or_empty(m->content);
        switch (m->role) {
        case KT_CHAT_USER:
            is_tool = false;
            kt_chat_text_puts(out, "<｜User｜>");
            kt_chat_text_puts(out, content);
            break;
        case KT_CHAT_ASSISTANT:
            if (m->n_tool_calls) {
                is_tool = false;
                for (size_t c = 0; c < m->n_tool_calls; c++) {
                    if (!is_first) {
                        kt_chat_text_puts(out, "<｜Assistant｜>");
                        kt_chat_text_puts(out, content);
                        kt_chat_text_puts(out, "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>");
                        is_first = true;
                    } else {
                        kt_chat_text_puts(out, "\n<｜tool▁call▁begin｜>");
                    }
                    call_body(&m->tool_calls[c], out);
                }
                kt_chat_text_puts(out, "<｜tool▁calls▁end｜>" EOS);
            } else if (is_tool) {
                kt_chat_text_puts(out, "<｜tool▁outputs▁end｜>");
                kt_chat_text_puts(out, content);
                kt_chat_text_puts(out, EOS);
                is_tool = false;
            } else {
                const char *answer = content;
                for (const char *p = strstr(content, "</think>"); p; p = strstr(p + 1, "</think>"))
                    answer = p + strlen("</think>");
                kt_chat_text_puts(out, "<｜Assistant｜>");
                kt_chat_text_puts(out, answer);
                kt_chat_text_puts(out, EOS);
            }
            break;
        case KT_CHAT_TOOL:
            is_tool = true;
            kt_chat_text_puts(out, is_output_first ? "<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>"
                                                   : "<｜tool▁output▁begin｜>");
            is_output_first = false;
            kt_chat_text_puts(out, content);
            kt_chat_text_puts(out, "<｜tool▁output▁end｜>");
            break;
        case KT_CHAT_SYSTEM:
            break;
        }
    }
    if (is_tool)
        kt_chat_text_puts(out, "<｜tool▁outputs▁end｜>");
    if (add_generation_prompt && !is_tool)
        kt_chat_text_puts(out, rev->generation_prompt);
}

/* V3-0324 opens the assistant turn right after each user turn, resets its
 * per-round flags at every tool-call turn, and writes no reasoning split. */
void kt_chat_render_deepseek_v3_0324(const kt_chat_message *messages, size_t n,
                                     const char *bos_token, bool add_generation_prompt,
                                     kt_chat_text *out)
{
    bool is_first = false, is_tool = false, is_output_first = true, is_last_user = false;
    system_prompt(messages, n, bos_token, out);
    for (size_t i = 0; i < n; i++) {
        const kt_chat_message *m = &messages[i];
        const char *content = text_or_empty(m->content);
        switch (m->role) {
        case KT_CHAT_USER:
            is_tool = false;
            is_first = false;
            is_last_user = true;
            kt_chat_text_puts(out, "<｜User｜>");
            kt_chat_text_puts(out, content);
            kt_chat_text_puts(out, "<｜Assistant｜>");
            break;
        case KT_CHAT_ASSISTANT:
            is_last_user = false;
            if (m->n_tool_calls) {
                if (is_tool)
                    kt_chat_text_puts(out, "<｜tool▁outputs▁end｜>");
                is_first = false;
                is_tool = false;
                is_output_first = true;
                for (size_t c = 0; c < m->n_tool_calls; c++) {
                    if (!is_first) {
                        kt_chat_text_puts(out, content);
                        kt_chat_text_puts(out, "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>");
                        is_first = true;
                    } else {
                        kt_chat_text_puts(out, "\n<｜tool▁call▁begin｜>");
                    }
                    call_body(&m->tool_calls[c], out);
                }
                kt_chat_text_puts(out, "<｜tool▁calls▁end｜>" EOS);
            } else if (is_tool) {
                kt_chat_text_puts(out, "<｜tool▁outputs▁end｜>");
                kt_chat_text_puts(out, content);
                kt_chat_text_puts(out, EOS);
                is_tool = false;
            } else {
                kt_chat_text_puts(out, content);
                kt_chat_text_puts(out, EOS);
            }
            break;
        case KT_CHAT_TOOL:
            is_last_user = false;
            is_tool = true;
            kt_chat_text_puts(out, is_output_first ? "<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>"
                                                   : "\n<｜tool▁output▁begin｜>");
            is_output_first = false;
            kt_chat_text_puts(out, content);
            kt_chat_text_puts(out, "<｜tool▁output▁end｜>");
            break;
        case KT_CHAT_SYSTEM:
            break;
        }
    }
    if (is_tool)
        kt_chat_text_puts(out, "<｜tool▁outputs▁end｜>");
    if (add_generation_prompt && !is_last_user && !is_tool)
        kt_chat_text_puts(out, "<｜Assistant｜>");
}
