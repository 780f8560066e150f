/*
 * model_chat.h - the chat format of a model's own template, for the tools
 * that render chat messages (kt-run --chat, kt-bench profile).
 */
#ifndef KT_TOOL_MODEL_CHAT_H
#define KT_TOOL_MODEL_CHAT_H

#include "chat.h"
#include "model.h"
#include "status.h"

/* The format of m's tokenizer.chat_template; without one, the error says
 * `needed_for` ("--chat needs the model's chat template"). */
kt_status kt_tool_chat_format(const struct kt_model *m, const char *needed_for, kt_chat_format *out, kt_err *err);

#endif
