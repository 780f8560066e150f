/*
 * status.h - how kt library code reports failure.
 *
 * Every library function that can fail returns a kt_status and, when given a
 * kt_err, fills it with a message a user can act on (which file, key, tensor,
 * byte offset).  Library code never prints and never exits: only tools/ mains do.
 */
#ifndef KT_STATUS_H
#define KT_STATUS_H

typedef enum kt_status {
    KT_OK = 0,
    KT_ERR_IO = -1,          /* open/read/write/mmap failed */
    KT_ERR_FORMAT = -2,      /* input is malformed (bad GGUF, wrong type or shape) */
    KT_ERR_NOMEM = -3,       /* an allocation failed */
    KT_ERR_INVALID = -4,     /* caller passed an invalid argument */
    KT_ERR_UNSUPPORTED = -5, /* well-formed but not something kt runs */
    KT_ERR_NOT_FOUND = -6,   /* a key or tensor is absent */
} kt_status;

typedef struct kt_err {
    kt_status status;
    char msg[1024];
} kt_err;

/* Sets err (which may be NULL) and returns status, so callers can write
 * `return kt_err_set(err, KT_ERR_FORMAT, "...", ...);`. */
kt_status kt_err_set(kt_err *err, kt_status status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Prepends "prefix: " to an already-set message (adds context on the way up). */
void kt_err_prefix(kt_err *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

const char *kt_status_name(kt_status status);

#endif
