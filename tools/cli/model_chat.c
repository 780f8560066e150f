/*
 * model_chat.c - see model_chat.h.
 */
#include "model_chat.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf.h"

kt_status kt_tool_read_chat_template(const char *path, char **out, kt_err *err)
{
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f)
        return kt_err_set(err, KT_ERR_IO, "--chat-template %s: cannot read: %s", path, strerror(errno));
    size_t len = 0, cap = 4096;
    char *buf = malloc(cap);
    kt_status st = buf ? KT_OK : kt_err_set(err, KT_ERR_NOMEM, "out of memory");
    while (st == KT_OK) {
        if (len + 1 == cap) {
            char *bigger = cap < ((size_t)64 << 20) ? realloc(buf, cap * 2) : NULL;
            if (!bigger) {
                st = cap < ((size_t)64 << 20) ? kt_err_set(err, KT_ERR_NOMEM, "out of memory")
                                              : kt_err_set(err, KT_ERR_INVALID, "--chat-template %s: over 64 MiB", path);
                break;
            }
            buf = bigger;
            cap *= 2;
        }
        size_t n = fread(buf + len, 1, cap - 1 - len, f);
        len += n;
        if (n == 0) {
            if (ferror(f))
                st = kt_err_set(err, KT_ERR_IO, "--chat-template %s: cannot read: %s", path, strerror(errno));
            break;
        }
    }
    fclose(f);
    if (st != KT_OK) {
        free(buf);
        return st;
    }
    buf[len] = '\0';
    if (strlen(buf) != len) {
        free(buf);
        return kt_err_set(err, KT_ERR_INVALID, "--chat-template %s: the file holds a NUL byte", path);
    }
    *out = buf;
    return KT_OK;
}

kt_status kt_tool_chat_template(const struct kt_model *m, const char *override_path, const char *needed_for,
                                kt_chat_format *format, char **text, kt_err *err)
{
    *format = KT_CHAT_FORMAT_UNKNOWN;
    *text = NULL;
    char *tmpl_text = NULL;
    kt_status st;
    if (override_path) {
        st = kt_tool_read_chat_template(override_path, &tmpl_text, err);
    } else {
        struct kt_gguf_str tmpl;
        st = kt_gguf_get_str(m->gguf, "tokenizer.chat_template", &tmpl, err);
        if (st != KT_OK) {
            kt_err_prefix(err, "%s", needed_for);
            return st;
        }
        tmpl_text = strndup(tmpl.ptr, tmpl.len);
        st = tmpl_text ? KT_OK : kt_err_set(err, KT_ERR_NOMEM, "out of memory");
    }
    if (st == KT_OK && (st = kt_chat_format_resolve(tmpl_text, format, err)) != KT_OK && override_path)
        kt_err_prefix(err, "--chat-template %s", override_path);
    if (st == KT_OK)
        *text = tmpl_text;
    else
        free(tmpl_text);
    return st;
}

static char *special_text(const struct kt_tokenizer *tok, int32_t id)
{
    size_t len = 0;
    const char *s = id >= 0 ? kt_token_bytes(tok, id, &len) : NULL;
    return s ? strndup(s, len) : NULL;
}

void kt_tool_chat_special_texts(const struct kt_tokenizer *tok, char **bos, char **eos)
{
    *bos = special_text(tok, kt_tokenizer_bos(tok));
    *eos = special_text(tok, kt_tokenizer_eos(tok));
}
