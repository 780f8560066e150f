/*
 * http.c - kt-serve's HTTP plumbing on libmicrohttpd: the daemon (one thread
 * per connection, poll()-based), request bodies collected up to the size
 * limit (never MHD's PostProcessor: bodies are JSON), routing, API-key
 * checks, JSON and error responses.  Endpoints live in endpoints.c and
 * generate.c; this file decides nothing about their contents.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "serve_anthropic.h"
#include "server.h"

/* ---- responses ----------------------------------------------------------------------------- */

void kt_http_count(struct kt_server *s, unsigned status)
{
    unsigned cls = status / 100;
    if (cls < 1 || cls > 5)
        return;
    pthread_mutex_lock(&s->metrics.mu);
    s->metrics.http_requests[cls]++;
    pthread_mutex_unlock(&s->metrics.mu);
}

enum MHD_Result kt_http_out_of_memory(const char *what)
{
    fprintf(stderr, "kt-serve: out of memory %s; the connection is closed (free memory, or lower --max-connections, "
                    "--max-body-bytes or --max-seqs)\n", what);
    return MHD_NO;
}

enum MHD_Result kt_http_queue(struct kt_http_request *rq, unsigned status, struct MHD_Response *r)
{
    if (!r)
        return kt_http_out_of_memory("making a response");
    if (rq->request_id[0])
        MHD_add_response_header(r, "X-Request-Id", rq->request_id);
    if (rq->cors_origin[0]) { /* a page of an allowed origin may read this response */
        MHD_add_response_header(r, "Access-Control-Allow-Origin", rq->cors_origin);
        MHD_add_response_header(r, "Access-Control-Expose-Headers", "X-Request-Id, Retry-After");
        if (strcmp(rq->cors_origin, "*") != 0)
            MHD_add_response_header(r, "Vary", "Origin");
    }
    enum MHD_Result ok = MHD_queue_response(rq->conn, status, r);
    MHD_destroy_response(r);
    rq->responded = true;
    kt_http_count(rq->server, status);
    return ok;
}

enum MHD_Result kt_http_send(struct kt_http_request *rq, unsigned status, const char *content_type, const char *body,
                             size_t len)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(len, (void *)body, MHD_RESPMEM_MUST_COPY);
    if (!r)
        return kt_http_out_of_memory("making a response");
    MHD_add_response_header(r, "Content-Type", content_type);
    return kt_http_queue(rq, status, r);
}

enum MHD_Result kt_http_send_json(struct kt_http_request *rq, unsigned status, json_t *j)
{
    char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    if (!s)
        return kt_http_out_of_memory("writing JSON");
    enum MHD_Result ok = kt_http_send(rq, status, "application/json", s, strlen(s));
    free(s);
    return ok;
}

enum MHD_Result kt_http_send_error(struct kt_http_request *rq, const struct kt_api_error *e)
{
    json_t *j = rq->anthropic ? kt_anthropic_error_json(e) : kt_api_error_json(e);
    char *s = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    if (!s)
        return kt_http_out_of_memory("writing JSON");
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(s), s, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(s);
        return kt_http_out_of_memory("making a response");
    }
    MHD_add_response_header(r, "Content-Type", "application/json");
    if (e->http_status == 429 || e->http_status == 503)
        MHD_add_response_header(r, "Retry-After", "1");
    if (e->http_status == 500 || e->http_status == 504)
        MHD_add_response_header(r, "x-should-retry", "false"); /* the same request would fail the same way */
    if (e->http_status == 401)
        MHD_add_response_header(r, "WWW-Authenticate", "Bearer");
    return kt_http_queue(rq, (unsigned)e->http_status, r);
}

bool kt_http_client_gone(struct MHD_Connection *conn)
{
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci)
        return false;
    struct pollfd p = {.fd = ci->connect_fd, .events = POLLRDHUP};
    return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL));
}

/* ---- routing ---------------------------------------------------------------------------------- */

static bool key_matches(const char *given, const char *key)
{
    size_t n = strlen(key), m = strlen(given);
    unsigned diff = (unsigned)(n ^ m);
    for (size_t i = 0; i < n; i++)
        diff |= (unsigned char)key[i] ^ (unsigned char)(i < m ? given[i] : 0);
    return diff == 0; /* constant time in the key's length */
}

static bool authorized(struct kt_http_request *rq)
{
    const char *key = rq->server->o.api_key;
    if (!key)
        return true;
    const char *x = MHD_lookup_connection_value(rq->conn, MHD_HEADER_KIND, "x-api-key"); /* Anthropic's clients */
    if (x && key_matches(x, key))
        return true;
    const char *h = MHD_lookup_connection_value(rq->conn, MHD_HEADER_KIND, "Authorization");
    if (!h || strncasecmp(h, "Bearer ", 7) != 0)
        return false;
    h += 7;
    while (*h == ' ')
        h++;
    return key_matches(h, key);
}

static enum MHD_Result not_found(struct kt_http_request *rq, const char *method, const char *url)
{
    struct kt_api_error e;
    kt_api_error_set(&e, 404, "invalid_request_error", "not_found", NULL, "no route %s %.200s", method, url);
    return kt_http_send_error(rq, &e);
}

static enum MHD_Result wrong_method(struct kt_http_request *rq, const char *method, const char *url, const char *allow)
{
    struct kt_api_error e;
    kt_api_error_set(&e, 405, "invalid_request_error", "method_not_allowed", NULL, "%s %.200s: use %s", method,
                     url, allow);
    return kt_http_send_error(rq, &e);
}

/* ---- CORS --------------------------------------------------------------------------------------- */

/* The Origin header's value when --cors-origins allows it ("*" for any when
 * the list is "*"), else "": a browser then refuses the page the response. */
static void cors_origin(struct kt_http_request *rq)
{
    const char *list = rq->server->o.cors_origins;
    const char *origin = MHD_lookup_connection_value(rq->conn, MHD_HEADER_KIND, "Origin");
    rq->cors_origin[0] = 0;
    if (!list || !origin || strlen(origin) >= sizeof rq->cors_origin)
        return;
    if (strcmp(list, "*") == 0) {
        snprintf(rq->cors_origin, sizeof rq->cors_origin, "*");
        return;
    }
    const size_t n = strlen(origin);
    for (const char *p = list; *p;) {
        const char *end = strchr(p, ',');
        const size_t len = end ? (size_t)(end - p) : strlen(p);
        if (len == n && strncmp(p, origin, n) == 0) {
            snprintf(rq->cors_origin, sizeof rq->cors_origin, "%s", origin);
            return;
        }
        p = end ? end + 1 : p + len;
    }
}

/* A browser's preflight (OPTIONS): 204 with the methods and headers a page
 * may use, and the origin when it is allowed.  No key is asked: a preflight
 * never carries one. */
static enum MHD_Result preflight(struct kt_http_request *rq)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
    if (!r)
        return kt_http_out_of_memory("making a response");
    MHD_add_response_header(r, "Allow", "GET, HEAD, POST, DELETE, OPTIONS");
    if (rq->cors_origin[0]) {
        MHD_add_response_header(r, "Access-Control-Allow-Methods", "GET, HEAD, POST, DELETE, OPTIONS");
        MHD_add_response_header(r, "Access-Control-Allow-Headers",
                                "Authorization, Content-Type, X-Request-Id, x-api-key, anthropic-version, "
                                "anthropic-beta, openai-organization, openai-project, x-stainless-arch, "
                                "x-stainless-lang, x-stainless-os, x-stainless-package-version, x-stainless-retry-count, "
                                "x-stainless-runtime, x-stainless-runtime-version, x-stainless-timeout");
        MHD_add_response_header(r, "Access-Control-Max-Age", "600");
    }
    return kt_http_queue(rq, 204, r);
}

static enum MHD_Result dispatch(struct kt_http_request *rq, const char *url, const char *method)
{
    cors_origin(rq);
    if (strcmp(method, "OPTIONS") == 0)
        return preflight(rq);
    struct kt_server *s = rq->server;
    bool get = strcmp(method, "GET") == 0 || strcmp(method, "HEAD") == 0;
    bool post = strcmp(method, "POST") == 0;
    /* tolerate clients that leave /v1 out */
    const char *path = strncmp(url, "/v1/", 4) == 0 ? url + 3 : url;
    bool api = strncmp(url, "/v1/", 4) == 0 || strcmp(path, "/models") == 0 || strncmp(path, "/models/", 8) == 0 ||
               strcmp(path, "/chat/completions") == 0 || strcmp(path, "/completions") == 0 ||
               strcmp(path, "/tokenize") == 0 || strcmp(path, "/detokenize") == 0 || strncmp(url, "/kt/", 4) == 0;
    rq->anthropic = strcmp(path, "/messages") == 0 || strncmp(path, "/messages/", 10) == 0;
    api = api || rq->anthropic;

    if (strcmp(url, "/health") == 0)
        return get ? kt_serve_health(rq) : wrong_method(rq, method, url, "GET");
    if (strcmp(url, "/version") == 0)
        return get ? kt_serve_version(rq) : wrong_method(rq, method, url, "GET");
    if (strcmp(url, "/metrics") == 0)
        return get ? kt_serve_metrics_endpoint(rq) : wrong_method(rq, method, url, "GET");
    if (strcmp(url, "/dashboard") == 0) /* a static page: its polls of /kt/ carry the key */
        return get ? kt_serve_dashboard(rq) : wrong_method(rq, method, url, "GET");
    if (!api)
        return not_found(rq, method, url);
    if (!authorized(rq)) {
        struct kt_api_error e;
        kt_api_error_set(&e, 401, "invalid_request_error", "invalid_api_key", NULL,
                         "a valid API key is required: send 'Authorization: Bearer <key>' or 'x-api-key: <key>'");
        return kt_http_send_error(rq, &e);
    }
    if (rq->too_large) {
        struct kt_api_error e;
        kt_api_error_set(&e, 413, "invalid_request_error", "request_too_large", NULL,
                         "the request body exceeds %u bytes (--max-body-bytes)", s->o.max_body_bytes);
        return kt_http_send_error(rq, &e);
    }
    int state = atomic_load(&s->state);
    if (state != KT_SERVER_READY) {
        struct kt_api_error e;
        kt_api_error_set(&e, 503, "server_error", state == KT_SERVER_LOADING ? "model_loading" : "unavailable", NULL,
                         state == KT_SERVER_LOADING    ? "the model is still loading; see GET /health"
                         : state == KT_SERVER_STOPPING ? "the server is shutting down"
                                                       : "the server cannot serve: %s",
                         s->load_error);
        return kt_http_send_error(rq, &e);
    }
    if (strcmp(path, "/models") == 0 || strncmp(path, "/models/", 8) == 0)
        return get ? kt_serve_models(rq, path[7] == '/' ? path + 8 : NULL) : wrong_method(rq, method, url, "GET");
    if (strcmp(path, "/chat/completions") == 0)
        return post ? kt_serve_generate(rq, KT_API_CHAT) : wrong_method(rq, method, url, "POST");
    if (strcmp(path, "/completions") == 0)
        return post ? kt_serve_generate(rq, KT_API_COMPLETION) : wrong_method(rq, method, url, "POST");
    if (strcmp(path, "/messages") == 0)
        return post ? kt_serve_messages(rq) : wrong_method(rq, method, url, "POST");
    if (strcmp(path, "/messages/count_tokens") == 0)
        return post ? kt_serve_count_tokens(rq) : wrong_method(rq, method, url, "POST");
    if (strcmp(path, "/tokenize") == 0)
        return post ? kt_serve_tokenize(rq) : wrong_method(rq, method, url, "POST");
    if (strcmp(path, "/detokenize") == 0)
        return post ? kt_serve_detokenize(rq) : wrong_method(rq, method, url, "POST");
    if (strncmp(url, "/v1/responses", 13) == 0 && (url[13] == '\0' || url[13] == '/'))
        return kt_serve_responses(rq, method, url[13] == '/' ? url + 14 : NULL);
    if (strcmp(url, "/kt/profile") == 0)
        return get ? kt_serve_profile_endpoint(rq) : wrong_method(rq, method, url, "GET");
    if (strcmp(url, "/kt/placement") == 0)
        return get ? kt_serve_placement_endpoint(rq) : wrong_method(rq, method, url, "GET");
    if (strcmp(url, "/kt/stats") == 0)
        return get ? kt_serve_stats_endpoint(rq) : wrong_method(rq, method, url, "GET");
    return not_found(rq, method, url);
}

/* ---- libmicrohttpd callbacks -------------------------------------------------------------------- */

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
                                  const char *version, const char *upload_data, size_t *upload_data_size,
                                  void **con_cls)
{
    struct kt_server *s = cls;
    struct kt_http_request *rq = *con_cls;
    (void)version;
    if (!rq) { /* headers are in; the body (if any) follows in later calls */
        rq = calloc(1, sizeof *rq);
        if (!rq)
            return kt_http_out_of_memory("for a new request");
        rq->server = s;
        rq->conn = conn;
        *con_cls = rq;
        const char *id = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "X-Request-Id");
        if (id && strlen(id) < sizeof rq->request_id && strspn(id, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                                                   "0123456789-_.:") == strlen(id))
            snprintf(rq->request_id, sizeof rq->request_id, "%s", id);
        const char *cl = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Content-Length");
        if (cl && strtoull(cl, NULL, 10) > s->o.max_body_bytes) {
            rq->too_large = true;
            kt_conns_request_received(s, conn);
            return dispatch(rq, url, method); /* answer before reading the body; MHD then closes */
        }
        return MHD_YES;
    }
    if (rq->responded) {
        *upload_data_size = 0;
        return MHD_YES;
    }
    if (*upload_data_size) {
        if (!rq->too_large) {
            if (rq->body.len + *upload_data_size > rq->server->o.max_body_bytes) {
                rq->too_large = true;
                kt_buf_free(&rq->body);
            } else {
                kt_buf_append(&rq->body, upload_data, *upload_data_size);
            }
        }
        *upload_data_size = 0;
        return MHD_YES;
    }
    if (rq->body.out_of_memory)
        return kt_http_out_of_memory("collecting a request body");
    kt_conns_request_received(s, conn);
    return dispatch(rq, url, method);
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls, enum MHD_RequestTerminationCode toe)
{
    struct kt_server *s = cls;
    struct kt_http_request *rq = *con_cls;
    kt_conns_request_done(s, conn, toe);
    if (!rq)
        return;
    if (rq->in_flight)
        atomic_fetch_sub(&rq->server->in_flight, 1);
    kt_buf_free(&rq->body);
    free(rq);
    *con_cls = NULL;
}

/* libmicrohttpd's messages for a connection that went away (its client hung
 * up or reset it, or connections.c closed a slow one): routine, and a handler
 * that noticed logs the request itself.  libmicrohttpd passes most messages
 * as "%s\n" with the text an argument, so the filter reads the formatted
 * line, not the format. */
static bool client_went_away(const char *line)
{
    static const char *const starts[] = {
        "Closing connection (application error generating response)", /* a stream saw the client go */
        "Application reported internal error",                         /* a handler saw it (or logged why not) */
        "Connection was closed by remote side with incomplete request",
        "Socket has been disconnected when reading request",
        "Connection socket is closed when reading request due to the error: detected connection closure",
    };
    static const char *const peer_gone[] = {"forcibly closed by remote peer", "no longer available for sending",
                                            "socket is not connected"};
    for (size_t i = 0; i < sizeof starts / sizeof starts[0]; i++)
        if (strncmp(line, starts[i], strlen(starts[i])) == 0)
            return true;
    for (size_t i = 0; i < sizeof peer_gone / sizeof peer_gone[0]; i++)
        if (strstr(line, peer_gone[i]))
            return true;
    return false;
}

static void on_mhd_log(void *cls, const char *fmt, va_list ap)
{
    char line[512];
    vsnprintf(line, sizeof line, fmt, ap);
    if (client_went_away(line))
        return;
    if (strncmp(line, "Server reached connection limit", 31) == 0) {
        kt_conns_log_refusal(cls); /* one line for many */
        return;
    }
    size_t n = strlen(line);
    fprintf(stderr, "kt-serve: http: %s%s", line, n && line[n - 1] == '\n' ? "" : "\n");
}

/* A listening socket on --host:--port, made here rather than by
 * libmicrohttpd so that a refusal can say which address and what to do
 * (libmicrohttpd's own reads "Failed to bind to port 0" for any address it
 * was given).  -1 with why filled. */
static int listen_on(const struct kt_server *s, const struct addrinfo *ai, char *why, size_t why_size)
{
    char where[300];
    snprintf(where, sizeof where, ai->ai_family == AF_INET6 ? "[%s]:%u" : "%s:%u", s->o.host, s->o.port);
    int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) {
        snprintf(why, why_size, "cannot make a socket for %s: %s", where, strerror(errno));
        return -1;
    }
    const int on = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on); /* a port left in TIME_WAIT by a stopped kt-serve */
    if (ai->ai_family == AF_INET6)
        setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &on, sizeof on);
    if (bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(fd, SOMAXCONN) != 0) {
        const int e = errno;
        if (e == EADDRINUSE)
            snprintf(why, why_size, "%s is in use: another program listens there (another kt-serve?): stop it, or "
                                    "give another --port (--port 0 takes any free one)", where);
        else if (e == EADDRNOTAVAIL)
            snprintf(why, why_size, "cannot listen on %s: --host %s is not an address of this machine: give one of "
                                    "its addresses, 127.0.0.1 (this machine only) or 0.0.0.0 (every address)",
                     where, s->o.host);
        else if (e == EACCES)
            snprintf(why, why_size, "cannot listen on %s: ports below 1024 need privileges: give --port 1024 or "
                                    "above (default 8080)", where);
        else
            snprintf(why, why_size, "cannot listen on %s: %s", where, strerror(e));
        close(fd);
        return -1;
    }
    return fd;
}

bool kt_http_start(struct kt_server *s, char *why, size_t why_size)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV}, *ai;
    char port[16];
    snprintf(port, sizeof port, "%u", s->o.port);
    int rc = getaddrinfo(s->o.host, port, &hints, &ai);
    if (rc != 0) {
        snprintf(why, why_size, "--host %s: %s: give an address or a name this machine resolves, e.g. 127.0.0.1",
                 s->o.host, gai_strerror(rc));
        return false;
    }
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_POLL_INTERNAL_THREAD | MHD_USE_ITC | MHD_USE_ERROR_LOG;
    if (ai->ai_family == AF_INET6)
        flags |= MHD_USE_IPv6;
    const int fd = listen_on(s, ai, why, why_size);
    freeaddrinfo(ai);
    if (fd < 0)
        return false;
    if (!kt_conns_start(s, why, why_size)) {
        close(fd);
        return false;
    }
    /* The logger must come first to catch every message.  A connection's
     * inactivity timeout starts at --idle-timeout (it has no request yet);
     * connections.c switches it to --client-timeout while a request is on. */
    s->daemon = MHD_start_daemon(flags, 0, NULL, NULL, on_request, s,
                                 MHD_OPTION_EXTERNAL_LOGGER, on_mhd_log, s,
                                 MHD_OPTION_LISTEN_SOCKET, fd,
                                 MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
                                 MHD_OPTION_NOTIFY_CONNECTION, kt_conns_notify, s,
                                 MHD_OPTION_URI_LOG_CALLBACK, kt_conns_request_begins, s,
                                 MHD_OPTION_CONNECTION_LIMIT, (unsigned)s->o.max_connections,
                                 MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned)s->o.max_connections_per_client,
                                 MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)s->o.idle_timeout_s,
                                 MHD_OPTION_END);
    if (!s->daemon) { /* fd is left open: whether libmicrohttpd closed it on failure is not stated */
        kt_conns_stop(s);
        snprintf(why, why_size, "cannot start the HTTP server on %s:%u (libmicrohttpd refused; its message is above)",
                 s->o.host, s->o.port);
        return false;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->daemon, MHD_DAEMON_INFO_BIND_PORT);
    s->port = di ? di->port : (uint16_t)s->o.port;
    return true;
}

void kt_http_quiesce(struct kt_server *s)
{
    if (s->daemon) {
        MHD_socket fd = MHD_quiesce_daemon(s->daemon);
        if (fd != MHD_INVALID_SOCKET)
            close(fd);
    }
}

void kt_http_stop(struct kt_server *s)
{
    if (s->daemon)
        MHD_stop_daemon(s->daemon);
    s->daemon = NULL;
    kt_conns_stop(s);
}
