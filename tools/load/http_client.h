/*
 * http_client.h - the small blocking HTTP/1.1 client kt-load and the server
 * tests use: one request per connection, chunked or sized bodies decoded as
 * they arrive, so a caller can react to each server-sent event.
 */
#ifndef KT_LOAD_HTTP_CLIENT_H
#define KT_LOAD_HTTP_CLIENT_H

#include <stdbool.h>
#include <stddef.h>

#include "serve_text.h"

struct kt_http_client {
    int fd;
    char in[16384];           /* raw bytes read, not yet decoded */
    size_t in_len;
    int status;               /* 0 until the status line was read */
    char content_type[128];
    bool chunked;
    long long remaining;      /* bytes left in this chunk, or of a sized body; -1: read to close */
    bool body_done;
};

/* Connects and sends one request (body may be NULL); Connection: close.
 * false with why filled when the connection or the send failed. */
bool kt_http_client_request(struct kt_http_client *c, const char *host, int port, const char *method,
                            const char *path, const char *api_key, const char *body, double timeout_s, char *why,
                            size_t why_size);

/* Connects and sends request's len bytes as they are - a whole request, or
 * one broken on purpose (the caller may then shutdown(c->fd, SHUT_WR) or
 * close); false with why filled (and c closed) when that failed. */
bool kt_http_client_send(struct kt_http_client *c, const char *host, int port, const void *request, size_t len,
                         double timeout_s, char *why, size_t why_size);

/* Reads until the headers are in (status, content_type) and then appends
 * whatever body bytes arrive to out.  Returns 1 when it appended (or read
 * headers), 0 at the end of the body, -1 on an error or timeout. */
int kt_http_client_read(struct kt_http_client *c, struct kt_buf *out);

/* Reads the whole body. */
bool kt_http_client_read_all(struct kt_http_client *c, struct kt_buf *out);

void kt_http_client_close(struct kt_http_client *c);

#endif
