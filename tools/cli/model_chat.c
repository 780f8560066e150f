/*
 * model_chat.c - see model_chat.h.
 */
#include "model_chat.h"

#include <stdlib.h>
#include <string.h>

#include "gguf.h"

kt_status kt_tool_chat_format(const struct kt_model *m, const char *needed_for, kt_chat_format *out, kt_err *err)
{
    struct kt_gguf_str tmpl;
    kt_status st = kt_gguf_get_str(m->gguf, "tokenizer.chat_template", &tmpl, err);
    if (st != KT_OK) {
        kt_err_prefix(err, "%s", needed_for);
        return st;
    }
    char *tmpl_text = strndup(tmpl.ptr, tmpl.len);
    if (!tmpl_text)
        return kt_err_set(err, KT_ERR_NOMEM, "out of memory");
    st = kt_chat_format_detect(tmpl_text, out, err);
    free(tmpl_text);
    return st;
}
