/*
 * prompts.h - prompt files for the tools that run real prompts (kt-bench
 * profile, kt-bench check): one prompt a line, rendered with the model's
 * chat template and tokenized.
 *
 * A line starting with '{' or '[' is JSON: {"messages": [...]} or a bare
 * array of OpenAI chat messages; any other line is the text of one user
 * message; blank lines are skipped.  Reading needs no model, so a bad file
 * is reported before one is loaded.  Errors name the file and line.
 */
#ifndef KT_TOOL_PROMPTS_H
#define KT_TOOL_PROMPTS_H

#include <stddef.h>
#include <stdint.h>

#include "chat.h"
#include "model.h"
#include "status.h"
#include "tokenizer.h"

struct kt_tool_prompt {
    kt_chat_messages messages;
    int32_t *ids;               /* [n_ids] after kt_tool_prompts_tokenize */
    size_t n_ids;
    unsigned line;              /* in its file (added as text: its place in the set, from 1) */
};

struct kt_tool_prompts {
    struct kt_tool_prompt *items;
    size_t n, cap;
};

/* Every prompt line of path appended to s (messages only); an error when it
 * holds none. */
kt_status kt_tool_prompts_read(const char *path, struct kt_tool_prompts *s, kt_err *err);
/* One user message of text appended to s. */
kt_status kt_tool_prompts_add_text(struct kt_tool_prompts *s, const char *text, kt_err *err);
/* Renders every prompt with m's chat template (generation prompt added) and
 * tokenizes it; errors are prefixed with source (the file) and the line. */
kt_status kt_tool_prompts_tokenize(const struct kt_model *m, const struct kt_tokenizer *tok, const char *source,
                                   struct kt_tool_prompts *s, kt_err *err);
/* The same with a template already resolved (format, and its text for
 * KT_CHAT_JINJA): kt-serve --self-check renders with the server's own
 * (--chat-template's, when given). */
kt_status kt_tool_prompts_tokenize_with(kt_chat_format format, const char *tmpl, const struct kt_tokenizer *tok,
                                        const char *source, struct kt_tool_prompts *s, kt_err *err);
void kt_tool_prompts_free(struct kt_tool_prompts *s);

#endif
