/*
 * model_chat.h - how a model's chat template renders, for the tools that
 * render chat messages (kt-run --chat, kt-bench profile and check,
 * kt-serve --self-check): one of kt's native revisions, or the Jinja
 * interpreter for any other template (chat.h).
 */
#ifndef KT_TOOL_MODEL_CHAT_H
#define KT_TOOL_MODEL_CHAT_H

#include "chat.h"
#include "model.h"
#include "status.h"
#include "tokenizer.h"

/* The format of m's tokenizer.chat_template, or of the file override_path
 * (--chat-template) when not NULL (KT_ERR_IO naming it when unreadable).
 * *text gets the template, malloc'd (free it): KT_CHAT_JINJA renders it.  Without a template the error says `needed_for` ("--chat
 * needs the model's chat template"). */
kt_status kt_tool_chat_template(const struct kt_model *m, const char *override_path, const char *needed_for,
                                kt_chat_format *format, char **text, kt_err *err);

/* The whole of a --chat-template file, malloc'd; KT_ERR_IO naming it when unreadable. */
kt_status kt_tool_read_chat_template(const char *path, char **text, kt_err *err);

/* The tokenizer's BOS and EOS texts as a KT_CHAT_JINJA template sees them
 * (bos_token, eos_token): malloc'd, NULL when the model has none. */
void kt_tool_chat_special_texts(const struct kt_tokenizer *tok, char **bos, char **eos);

#endif
