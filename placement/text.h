/*
 * text.h - text built up with printf, for the planners' config and report
 * output: kt_text_put appends (growing the buffer); a failure (out of
 * memory, a bad format) sticks in failed and later puts do nothing, so a
 * writer checks once at the end.  s is the caller's to free.
 */
#ifndef KT_PLACEMENT_TEXT_H
#define KT_PLACEMENT_TEXT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct kt_text {
    char *s;
    size_t len, cap;
    bool failed;
};

void kt_text_put(struct kt_text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* "1.23 GiB" or "45.6 MiB" into buf; returns buf. */
const char *kt_text_bytes(uint64_t bytes, char *buf, size_t cap);

#endif
