/*
 * http_client.c - a blocking HTTP/1.1 client for one request per connection
 * (see http_client.h).  It trusts nothing it reads: sizes are checked and a
 * malformed response is an error, never a crash.
 */
#include "http_client.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

bool kt_http_client_send(struct kt_http_client *c, const char *host, int port, const void *request, size_t len,
                         double timeout_s, char *why, size_t why_size)
{
    memset(c, 0, sizeof *c);
    c->fd = -1;
    c->remaining = -1;
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *ai;
    char port_s[16];
    snprintf(port_s, sizeof port_s, "%d", port);
    int rc = getaddrinfo(host, port_s, &hints, &ai);
    if (rc != 0) {
        snprintf(why, why_size, "%s: %s", host, gai_strerror(rc));
        return false;
    }
    c->fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (c->fd < 0 || connect(c->fd, ai->ai_addr, ai->ai_addrlen) != 0) {
        snprintf(why, why_size, "connect %s:%d: %s", host, port, strerror(errno));
        freeaddrinfo(ai);
        kt_http_client_close(c);
        return false;
    }
    freeaddrinfo(ai);
    time_t whole = (time_t)timeout_s;
    struct timeval tv = {.tv_sec = whole, .tv_usec = (suseconds_t)((timeout_s - (double)whole) * 1e6)};
    setsockopt(c->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(c->fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    int one = 1;
    setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    const char *bytes = request;
    for (size_t sent = 0; sent < len;) {
        ssize_t n = send(c->fd, bytes + sent, len - sent, MSG_NOSIGNAL);
        if (n <= 0) {
            snprintf(why, why_size, "send: %s", strerror(errno));
            kt_http_client_close(c);
            return false;
        }
        sent += (size_t)n;
    }
    return true;
}

bool kt_http_client_request(struct kt_http_client *c, const char *host, int port, const char *method,
                            const char *path, const char *api_key, const char *body, double timeout_s, char *why,
                            size_t why_size)
{
    struct kt_buf req = {0};
    size_t body_len = body ? strlen(body) : 0;
    kt_buf_printf(&req, "%s %s HTTP/1.1\r\nHost: %s:%d\r\nConnection: close\r\nAccept: */*\r\n", method, path, host,
                  port);
    if (api_key)
        kt_buf_printf(&req, "Authorization: Bearer %s\r\n", api_key);
    if (body)
        kt_buf_printf(&req, "Content-Type: application/json\r\nContent-Length: %zu\r\n", body_len);
    kt_buf_puts(&req, "\r\n");
    if (body)
        kt_buf_append(&req, body, body_len);
    bool ok;
    if (req.out_of_memory) {
        memset(c, 0, sizeof *c);
        c->fd = -1;
        snprintf(why, why_size, "out of memory building the request");
        ok = false;
    } else {
        ok = kt_http_client_send(c, host, port, req.bytes, req.len, timeout_s, why, why_size);
    }
    kt_buf_free(&req);
    return ok;
}

void kt_http_client_close(struct kt_http_client *c)
{
    if (c->fd >= 0)
        close(c->fd);
    c->fd = -1;
}

/* Reads more raw bytes; false on error, timeout or a closed connection (*closed set). */
static bool fill(struct kt_http_client *c, bool *closed)
{
    *closed = false;
    if (c->in_len == sizeof c->in)
        return false;
    ssize_t n = recv(c->fd, c->in + c->in_len, sizeof c->in - c->in_len, 0);
    if (n == 0)
        *closed = true;
    if (n <= 0)
        return false;
    c->in_len += (size_t)n;
    return true;
}

static void drop(struct kt_http_client *c, size_t n)
{
    memmove(c->in, c->in + n, c->in_len - n);
    c->in_len -= n;
}

static int read_headers(struct kt_http_client *c)
{
    for (;;) {
        char *end = memmem(c->in, c->in_len, "\r\n\r\n", 4);
        if (end) {
            size_t head = (size_t)(end - c->in) + 4;
            *end = 0;
            int major, minor;
            if (sscanf(c->in, "HTTP/%d.%d %d", &major, &minor, &c->status) != 3 || c->status < 100)
                return -1;
            bool sized = false;
            for (char *line = strstr(c->in, "\r\n"); line; line = strstr(line + 2, "\r\n")) {
                char *h = line + 2, *colon = strchr(h, ':'), *eol = strstr(h, "\r\n");
                if (!colon || (eol && colon > eol))
                    continue;
                char *v = colon + 1;
                while (*v == ' ')
                    v++;
                size_t vlen = eol ? (size_t)(eol - v) : strlen(v);
                if (strncasecmp(h, "Content-Type:", 13) == 0)
                    snprintf(c->content_type, sizeof c->content_type, "%.*s", (int)vlen, v);
                else if (strncasecmp(h, "Transfer-Encoding:", 18) == 0 && strncasecmp(v, "chunked", 7) == 0)
                    c->chunked = true;
                else if (strncasecmp(h, "Content-Length:", 15) == 0)
                    c->remaining = strtoll(v, NULL, 10), sized = true;
            }
            if (c->chunked)
                c->remaining = 0; /* the first chunk size line comes next */
            else if (!sized)
                c->remaining = -1;
            drop(c, head);
            return 1;
        }
        bool closed;
        if (!fill(c, &closed))
            return -1;
    }
}

int kt_http_client_read(struct kt_http_client *c, struct kt_buf *out)
{
    if (c->fd < 0)
        return -1;
    if (c->status == 0)
        return read_headers(c);
    for (;;) {
        if (c->body_done)
            return 0;
        if (!c->chunked) {
            if (c->remaining == 0) {
                c->body_done = true;
                return 0;
            }
            if (c->in_len) {
                size_t n = c->remaining >= 0 && (size_t)c->remaining < c->in_len ? (size_t)c->remaining : c->in_len;
                kt_buf_append(out, c->in, n);
                drop(c, n);
                if (c->remaining > 0)
                    c->remaining -= (long long)n;
                return 1;
            }
        } else if (c->remaining > 0 && c->in_len) {
            size_t n = (size_t)c->remaining < c->in_len ? (size_t)c->remaining : c->in_len;
            kt_buf_append(out, c->in, n);
            drop(c, n);
            c->remaining -= (long long)n;
            return 1;
        } else if (c->remaining == 0) {
            /* "\r\n" after a chunk (not before the first), then "SIZE\r\n" */
            char *eol = memmem(c->in, c->in_len, "\r\n", 2);
            if (eol == c->in) {
                drop(c, 2);
                continue;
            }
            if (eol) {
                char *end;
                long long size = strtoll(c->in, &end, 16);
                if (end == c->in || size < 0)
                    return -1;
                drop(c, (size_t)(eol - c->in) + 2);
                if (size == 0) {
                    c->body_done = true;
                    return 0;
                }
                c->remaining = size;
                continue;
            }
        }
        bool closed;
        if (!fill(c, &closed)) {
            if (closed && !c->chunked && c->remaining < 0) {
                c->body_done = true;
                return 0;
            }
            return -1;
        }
    }
}

bool kt_http_client_read_all(struct kt_http_client *c, struct kt_buf *out)
{
    int r;
    while ((r = kt_http_client_read(c, out)) > 0)
        ;
    return r == 0;
}
