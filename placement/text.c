/*
 * text.c - text built up with printf (text.h).
 */
#include "text.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

void kt_text_put(struct kt_text *t, const char *fmt, ...)
{
    if (t->failed)
        return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(t->s ? t->s + t->len : NULL, t->s ? t->cap - t->len : 0, fmt, ap);
        va_end(ap);
        if (n < 0) {
            t->failed = true;
            return;
        }
        if (t->s && t->len + (size_t)n < t->cap) {
            t->len += (size_t)n;
            return;
        }
        size_t cap = t->cap ? 2 * t->cap : 4096;
        while (cap < t->len + (size_t)n + 1)
            cap *= 2;
        char *s = realloc(t->s, cap);
        if (!s) {
            t->failed = true;
            return;
        }
        t->s = s;
        t->cap = cap;
    }
}

const char *kt_text_bytes(uint64_t bytes, char *buf, size_t cap)
{
    if (bytes >= (1ull << 30))
        snprintf(buf, cap, "%.2f GiB", (double)bytes / (double)(1ull << 30));
    else
        snprintf(buf, cap, "%.1f MiB", (double)bytes / (1 << 20));
    return buf;
}
