/*
 * serve_text.c - byte buffers, split-marker scanning and stop strings for
 * kt-serve (see serve_text.h).  Plain loops over bytes: the texts are a few
 * tokens' worth per call, so clarity beats cleverness here.
 */
#include "serve_text.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- kt_buf ------------------------------------------------------------------------ */

static bool buf_reserve(struct kt_buf *b, size_t extra)
{
    if (b->out_of_memory)
        return false;
    if (extra >= SIZE_MAX - b->len - 1) {
        b->out_of_memory = true;
        return false;
    }
    if (b->len + extra + 1 <= b->cap)
        return true;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < b->len + extra + 1)
        cap = cap > SIZE_MAX / 2 ? b->len + extra + 1 : cap * 2;
    char *p = realloc(b->bytes, cap);
    if (!p) {
        b->out_of_memory = true;
        return false;
    }
    b->bytes = p;
    b->cap = cap;
    return true;
}

void kt_buf_append(struct kt_buf *b, const void *bytes, size_t len)
{
    if (!buf_reserve(b, len))
        return;
    if (len)
        memcpy(b->bytes + b->len, bytes, len);
    b->len += len;
    b->bytes[b->len] = '\0';
}

void kt_buf_puts(struct kt_buf *b, const char *s)
{
    if (s)
        kt_buf_append(b, s, strlen(s));
}

void kt_buf_printf(struct kt_buf *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0 || !buf_reserve(b, (size_t)n))
        return;
    va_start(ap, fmt);
    vsnprintf(b->bytes + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

void kt_buf_consume(struct kt_buf *b, size_t n)
{
    if (n >= b->len) {
        b->len = 0;
    } else {
        memmove(b->bytes, b->bytes + n, b->len - n);
        b->len -= n;
    }
    if (b->bytes)
        b->bytes[b->len] = '\0';
}

void kt_buf_free(struct kt_buf *b)
{
    free(b->bytes);
    *b = (struct kt_buf){0};
}

const char *kt_buf_str(const struct kt_buf *b)
{
    return b->bytes ? b->bytes : "";
}

/* ---- markers ----------------------------------------------------------------------- */

size_t kt_text_scan(const char *text, size_t len, const char *const *markers, size_t n, int *which)
{
    *which = -1;
    size_t best = len, best_len = 0;
    for (size_t m = 0; m < n; m++) {
        size_t ml = strlen(markers[m]);
        if (ml == 0 || ml > len)
            continue;
        const char *hit = memmem(text, len, markers[m], ml);
        if (!hit)
            continue;
        size_t at = (size_t)(hit - text);
        if (at < best || (at == best && ml > best_len)) {
            best = at, best_len = ml;
            *which = (int)m;
        }
    }
    if (*which >= 0)
        return best;
    /* Not found: hold back the longest suffix that a marker could still complete. */
    size_t hold = 0;
    for (size_t m = 0; m < n; m++) {
        size_t ml = strlen(markers[m]);
        size_t most = ml - (ml > 0); /* proper prefixes only */
        if (most > len)
            most = len;
        for (size_t k = most; k > hold; k--)
            if (memcmp(text + len - k, markers[m], k) == 0) {
                hold = k;
                break;
            }
    }
    return len - hold;
}

/* ---- stop strings ------------------------------------------------------------------ */

void kt_stop_init(struct kt_stop *s, const char *const *stops, size_t n_stops)
{
    *s = (struct kt_stop){.stops = stops, .n_stops = n_stops, .matched = -1};
}

bool kt_stop_push(struct kt_stop *s, const char *text, size_t len, struct kt_buf *out)
{
    if (s->matched >= 0)
        return true;
    if (s->n_stops == 0) {
        kt_buf_append(out, text, len);
        return false;
    }
    kt_buf_append(&s->pending, text, len);
    int which;
    size_t safe = kt_text_scan(kt_buf_str(&s->pending), s->pending.len, s->stops, s->n_stops, &which);
    kt_buf_append(out, s->pending.bytes, safe);
    if (which >= 0) {
        s->matched = which;
        kt_buf_consume(&s->pending, s->pending.len);
        return true;
    }
    kt_buf_consume(&s->pending, safe);
    return false;
}

void kt_stop_flush(struct kt_stop *s, struct kt_buf *out)
{
    if (s->matched < 0 && s->pending.len)
        kt_buf_append(out, s->pending.bytes, s->pending.len);
    kt_buf_consume(&s->pending, s->pending.len);
}

void kt_stop_free(struct kt_stop *s)
{
    kt_buf_free(&s->pending);
}
