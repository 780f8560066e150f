/*
 * status.c - error message helpers.  Must never allocate: it runs on the
 * out-of-memory path too.
 */
#include "status.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

kt_status kt_err_set(kt_err *err, kt_status status, const char *fmt, ...)
{
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
        err->status = status;
    }
    return status;
}

void kt_err_prefix(kt_err *err, const char *fmt, ...)
{
    if (!err)
        return;
    char joined[sizeof err->msg];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(joined, sizeof joined, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n + 2 >= sizeof joined)
        return;
    size_t used = (size_t)n;
    joined[used++] = ':';
    joined[used++] = ' ';
    size_t rest = strnlen(err->msg, sizeof err->msg - 1);
    if (rest > sizeof joined - 1 - used)
        rest = sizeof joined - 1 - used; /* keep the prefix; cut the tail of the message */
    memcpy(joined + used, err->msg, rest);
    joined[used + rest] = 0;
    memcpy(err->msg, joined, sizeof err->msg);
}

const char *kt_status_name(kt_status status)
{
    switch (status) {
    case KT_OK: return "ok";
    case KT_ERR_IO: return "i/o error";
    case KT_ERR_FORMAT: return "format error";
    case KT_ERR_NOMEM: return "out of memory";
    case KT_ERR_INVALID: return "invalid argument";
    case KT_ERR_UNSUPPORTED: return "unsupported";
    case KT_ERR_NOT_FOUND: return "not found";
    }
    return "unknown status";
}
