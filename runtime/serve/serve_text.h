/*
 * serve_text.h - the text plumbing kt-serve's parts share: a growable byte
 * buffer, the scan for markers that may arrive split across chunks, and the
 * stop-string matcher that holds back text which could still become a stop.
 *
 * Nothing here allocates behind the caller's back except kt_buf's own
 * storage, and nothing fails on any input bytes.
 */
#ifndef KT_SERVE_TEXT_H
#define KT_SERVE_TEXT_H

#include <stdbool.h>
#include <stddef.h>

/* ---- kt_buf: bytes, always NUL-terminated once anything was appended ------------ */

struct kt_buf {
    char *bytes;
    size_t len, cap;
    bool out_of_memory; /* sticky: appends after a failed one do nothing */
};

void kt_buf_append(struct kt_buf *b, const void *bytes, size_t len);
void kt_buf_puts(struct kt_buf *b, const char *s);
void kt_buf_printf(struct kt_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void kt_buf_consume(struct kt_buf *b, size_t n); /* drops the first n bytes */
void kt_buf_free(struct kt_buf *b);
/* The contents as a C string ("" when empty); the buffer keeps ownership. */
const char *kt_buf_str(const struct kt_buf *b);

/* ---- markers ---------------------------------------------------------------------- */

/*
 * Looks for the earliest of markers[0..n) in text[0..len) (the longest one
 * when several start at the same offset).  Found: returns its offset, sets
 * *which to its index.  Not found: *which = -1 and returns how many leading
 * bytes are safe to release: len minus the longest suffix of text that is a
 * proper prefix of some marker (the part a later chunk could complete).
 */
size_t kt_text_scan(const char *text, size_t len, const char *const *markers, size_t n, int *which);

/* ---- stop strings ------------------------------------------------------------------ */

/* Matches a stream of text against stop strings, releasing only text that
 * can no longer be part of one.  Zero-initialise; kt_stop_free when done. */
struct kt_stop {
    const char *const *stops; /* borrowed; empty strings are ignored */
    size_t n_stops;
    struct kt_buf pending;    /* text not yet released */
    int matched;              /* index of the stop that matched, -1 while none */
};

void kt_stop_init(struct kt_stop *s, const char *const *stops, size_t n_stops);

/* Appends text; writes what is now safe to out.  Returns true when a stop
 * string completed: the text before it went to out, it and everything after
 * it are dropped, and s->matched names it.  After a match, pushes do nothing. */
bool kt_stop_push(struct kt_stop *s, const char *text, size_t len, struct kt_buf *out);

/* End of stream: the held-back text is released (no stop can complete). */
void kt_stop_flush(struct kt_stop *s, struct kt_buf *out);
void kt_stop_free(struct kt_stop *s);

#endif
