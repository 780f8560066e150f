/*
 * connections.c - what libmicrohttpd does not do for kt-serve's connections:
 * a deadline on a request's arrival, and room for new clients while slow
 * ones fill the connection table.  libmicrohttpd does the rest: its
 * inactivity timeout (MHD_OPTION_CONNECTION_TIMEOUT, set per connection
 * here: --idle-timeout between requests, --client-timeout within one) closes
 * idle keep-alive connections and transfers that stall either way; its
 * limits refuse connections past --max-connections and past
 * --max-connections-per-client from one address.
 *
 * An inactivity timeout restarts with every byte, so a client trickling a
 * byte a second would hold its connection for ever; and 600 such clients
 * fill any table.  So every connection is tracked here in one of three
 * states - idle (no request begun), receiving (its request line is in, the
 * request is not complete) and active (kt-serve is answering) - and:
 *
 *   - a watchdog thread closes a connection receiving for --client-timeout
 *     seconds, or idle for --idle-timeout (a request line trickled byte by
 *     byte), however busy it kept the socket;
 *   - the last `reserve` slots of the table are kept for clients that have a
 *     request to make: a new connection that finds fewer free closes the
 *     connection that has owed its request the longest (idle or receiving).
 *     So /health, /metrics and new API clients are answered at once however
 *     many slow clients connect, without a listener of their own (which
 *     would leave API clients out, and be one more port to secure).
 *     Connections being answered are never closed for room: those are
 *     bounded by --max-seqs + --max-waiting (the rest get 429 and go idle).
 *
 * Closing is shutdown(2) on the socket: its libmicrohttpd thread sees the
 * end and closes the connection itself.  The table's lock is held across
 * it, and a connection leaves the table (MHD_CONNECTION_NOTIFY_CLOSED)
 * before libmicrohttpd closes its descriptor, so a descriptor shut down here
 * is never one that was reused.
 */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "server.h"

enum conn_state { CONN_IDLE, CONN_RECEIVING, CONN_ACTIVE, CONN_STATE_COUNT };

struct conn {
    struct conn *prev, *next;     /* the table, in order of `since` within a state's life: oldest first */
    struct MHD_Connection *mhd;
    int fd;
    enum conn_state state;
    double since;                 /* monotonic seconds: when the state began */
    bool closing;                 /* shut down here; leaves the table when libmicrohttpd closes it */
    bool for_room;                /* shut down for a new client */
};

enum close_reason { CLOSED_SLOW_REQUEST, CLOSED_IDLE, CLOSED_FOR_ROOM, CLOSE_REASON_COUNT };

struct kt_conn_table {
    struct kt_server *server;
    pthread_mutex_t mu;
    pthread_cond_t wake;          /* the watchdog: a new deadline, or stop */
    pthread_t watchdog;
    bool watchdog_started, stop;
    struct conn *head, *tail;
    uint32_t n_open, n_closing, n_state[CONN_STATE_COUNT];
    uint32_t reserve;             /* slots kept for clients with a request to make */
    uint64_t closed[CLOSE_REASON_COUNT];
    uint64_t refused;             /* turned away by libmicrohttpd's limits */
    uint64_t refused_logged;
    double refusal_logged_at;     /* monotonic seconds; 0: never */
};

/* ---- the table (mu held) ----------------------------------------------------------------- */

static void set_state(struct kt_conn_table *t, struct conn *c, enum conn_state state)
{
    t->n_state[c->state]--;
    t->n_state[state]++;
    c->state = state;
    c->since = kt_monotonic_s();
    /* the youngest last, so the oldest owing a request is found first */
    if (c != t->tail) {
        if (c->prev)
            c->prev->next = c->next;
        else
            t->head = c->next;
        c->next->prev = c->prev;
        c->prev = t->tail, c->next = NULL;
        t->tail->next = c;
        t->tail = c;
    }
}

static void close_conn(struct kt_conn_table *t, struct conn *c)
{
    c->closing = true;
    t->n_closing++;
    shutdown(c->fd, SHUT_RDWR);
}

/* Counts a connection leaving the table: closed for room, or past its
 * deadline - libmicrohttpd's inactivity timer and the watchdog fall together
 * for a silent client, and either may close it - or else (its client hung
 * up) not at all. */
static void count_close(struct kt_conn_table *t, const struct conn *c, double now)
{
    const struct kt_serve_options *o = &t->server->o;
    const double slack_s = 0.05; /* libmicrohttpd counts from its last read, a moment before `since` */
    if (c->for_room)
        t->closed[CLOSED_FOR_ROOM]++;
    else if (c->state == CONN_RECEIVING && now - c->since >= o->client_timeout_s - slack_s)
        t->closed[CLOSED_SLOW_REQUEST]++;
    else if (c->state == CONN_IDLE && now - c->since >= o->idle_timeout_s - slack_s)
        t->closed[CLOSED_IDLE]++;
}

static double deadline(const struct kt_conn_table *t, const struct conn *c)
{
    const struct kt_serve_options *o = &t->server->o;
    if (c->closing || c->state == CONN_ACTIVE)
        return INFINITY;
    if (c->state == CONN_RECEIVING)
        return c->since + o->client_timeout_s;
    return c->since + o->idle_timeout_s + 1; /* libmicrohttpd closes a silent one at --idle-timeout; this one trickles */
}

/* ---- the watchdog ------------------------------------------------------------------------------ */

static void *watchdog_main(void *arg)
{
    struct kt_conn_table *t = arg;
    pthread_mutex_lock(&t->mu);
    while (!t->stop) {
        double now = kt_monotonic_s(), next = INFINITY;
        for (struct conn *c = t->head; c; c = c->next) {
            double d = deadline(t, c);
            if (d <= now)
                close_conn(t, c);
            else if (d < next)
                next = d;
        }
        if (isinf(next)) {
            pthread_cond_wait(&t->wake, &t->mu);
            continue;
        }
        double at = next + 0.01, whole = floor(at); /* the condition variable runs on CLOCK_MONOTONIC, as kt_monotonic_s */
        struct timespec until = {(time_t)whole, (long)((at - whole) * 1e9)};
        pthread_cond_timedwait(&t->wake, &t->mu, &until);
    }
    pthread_mutex_unlock(&t->mu);
    return NULL;
}

/* ---- libmicrohttpd's callbacks ----------------------------------------------------------------- */

static struct conn *tracked(struct MHD_Connection *mhd)
{
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(mhd, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci ? ci->socket_context : NULL;
}

void kt_conns_notify(void *cls, struct MHD_Connection *mhd, void **socket_context,
                     enum MHD_ConnectionNotificationCode code)
{
    struct kt_server *s = cls;
    struct kt_conn_table *t = s->conns;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(mhd, MHD_CONNECTION_INFO_CONNECTION_FD);
        struct conn *c = ci ? calloc(1, sizeof *c) : NULL;
        *socket_context = c;
        if (!c) {
            fprintf(stderr, "kt-serve: out of memory tracking a new connection; it is served untracked\n");
            return;
        }
        *c = (struct conn){.mhd = mhd, .fd = ci->connect_fd, .state = CONN_IDLE, .since = kt_monotonic_s()};
        pthread_mutex_lock(&t->mu);
        c->prev = t->tail;
        if (t->tail)
            t->tail->next = c;
        else
            t->head = c;
        t->tail = c;
        t->n_open++;
        t->n_state[CONN_IDLE]++;
        /* keep the reserve free: close the connection that has owed its request the longest */
        if (t->n_open - t->n_closing + t->reserve > s->o.max_connections)
            for (struct conn *x = t->head; x && x != c; x = x->next)
                if (!x->closing && x->state != CONN_ACTIVE) {
                    x->for_room = true;
                    close_conn(t, x);
                    break;
                }
        pthread_cond_signal(&t->wake);
        pthread_mutex_unlock(&t->mu);
        return;
    }
    struct conn *c = *socket_context; /* MHD_CONNECTION_NOTIFY_CLOSED: before the descriptor is closed */
    if (!c)
        return;
    pthread_mutex_lock(&t->mu);
    if (c->prev)
        c->prev->next = c->next;
    else
        t->head = c->next;
    if (c->next)
        c->next->prev = c->prev;
    else
        t->tail = c->prev;
    count_close(t, c, kt_monotonic_s());
    t->n_open--;
    t->n_closing -= c->closing;
    t->n_state[c->state]--;
    pthread_mutex_unlock(&t->mu);
    free(c);
    *socket_context = NULL;
}

void *kt_conns_request_begins(void *cls, const char *uri, struct MHD_Connection *mhd)
{
    struct kt_server *s = cls;
    struct kt_conn_table *t = s->conns;
    (void)uri;
    MHD_set_connection_option(mhd, MHD_CONNECTION_OPTION_TIMEOUT, (unsigned)s->o.client_timeout_s);
    struct conn *c = tracked(mhd);
    if (c) {
        pthread_mutex_lock(&t->mu);
        set_state(t, c, CONN_RECEIVING);
        pthread_cond_signal(&t->wake);
        pthread_mutex_unlock(&t->mu);
    }
    return NULL; /* the request's context: on_request in http.c makes it */
}

void kt_conns_request_received(struct kt_server *s, struct MHD_Connection *mhd)
{
    struct conn *c = tracked(mhd);
    if (!c)
        return;
    pthread_mutex_lock(&s->conns->mu);
    set_state(s->conns, c, CONN_ACTIVE);
    pthread_mutex_unlock(&s->conns->mu);
}

void kt_conns_request_done(struct kt_server *s, struct MHD_Connection *mhd, enum MHD_RequestTerminationCode toe)
{
    struct conn *c = tracked(mhd);
    if (toe != MHD_REQUEST_TERMINATED_COMPLETED_OK || !c)
        return; /* the connection is closing */
    MHD_set_connection_option(mhd, MHD_CONNECTION_OPTION_TIMEOUT, (unsigned)s->o.idle_timeout_s);
    pthread_mutex_lock(&s->conns->mu);
    set_state(s->conns, c, CONN_IDLE);
    pthread_cond_signal(&s->conns->wake);
    pthread_mutex_unlock(&s->conns->mu);
}

void kt_conns_log_refusal(struct kt_server *s)
{
    struct kt_conn_table *t = s->conns;
    if (!t)
        return;
    pthread_mutex_lock(&t->mu);
    t->refused++;
    double now = kt_monotonic_s();
    bool log = t->refusal_logged_at == 0 || now - t->refusal_logged_at >= 10;
    uint64_t n = t->refused - t->refused_logged;
    if (log) {
        t->refusal_logged_at = now;
        t->refused_logged = t->refused;
    }
    uint32_t open = t->n_open;
    pthread_mutex_unlock(&t->mu);
    if (log)
        fprintf(stderr, "kt-serve: http: refused %llu connection%s (%u open): the table is full (--max-connections %u) "
                        "or one address holds its share (--max-connections-per-client %u); at most one such line "
                        "every 10 s\n",
                (unsigned long long)n, n == 1 ? "" : "s", open, s->o.max_connections, s->o.max_connections_per_client);
}

void kt_conns_metrics(struct kt_server *s, struct kt_buf *out)
{
    struct kt_conn_table *t = s->conns;
    if (!t)
        return;
    pthread_mutex_lock(&t->mu);
    kt_buf_printf(out, "# HELP kt:http_connections Open HTTP connections by state.\n# TYPE kt:http_connections gauge\n"
                       "kt:http_connections{state=\"idle\"} %u\nkt:http_connections{state=\"receiving\"} %u\n"
                       "kt:http_connections{state=\"active\"} %u\n",
                  t->n_state[CONN_IDLE], t->n_state[CONN_RECEIVING], t->n_state[CONN_ACTIVE]);
    kt_buf_printf(out, "# HELP kt:http_connections_closed_total Connections kt-serve closed: slow_request (the "
                       "request not in within --client-timeout), idle (no request for --idle-timeout), room (for a "
                       "new client).\n# TYPE kt:http_connections_closed_total counter\n"
                       "kt:http_connections_closed_total{reason=\"slow_request\"} %llu\n"
                       "kt:http_connections_closed_total{reason=\"idle\"} %llu\n"
                       "kt:http_connections_closed_total{reason=\"room\"} %llu\n"
                       "# HELP kt:http_connections_refused_total Connections refused at --max-connections or "
                       "--max-connections-per-client.\n"
                       "# TYPE kt:http_connections_refused_total counter\nkt:http_connections_refused_total %llu\n",
                  (unsigned long long)t->closed[CLOSED_SLOW_REQUEST], (unsigned long long)t->closed[CLOSED_IDLE],
                  (unsigned long long)t->closed[CLOSED_FOR_ROOM], (unsigned long long)t->refused);
    pthread_mutex_unlock(&t->mu);
}

/* ---- life cycle ------------------------------------------------------------------------------------ */

uint32_t kt_conns_reserved(uint32_t max_connections)
{
    uint32_t r = max_connections / 8 > 2 ? max_connections / 8 : 2;
    return r < max_connections ? r : max_connections - 1; /* --max-connections 1 or 2: one slot stays usable */
}

bool kt_conns_start(struct kt_server *s, char *why, size_t why_size)
{
    struct kt_conn_table *t = calloc(1, sizeof *t);
    if (!t) {
        snprintf(why, why_size, "out of memory for the connection table");
        return false;
    }
    t->server = s;
    t->reserve = kt_conns_reserved(s->o.max_connections);
    pthread_mutex_init(&t->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&t->wake, &ca);
    pthread_condattr_destroy(&ca);
    int rc = pthread_create(&t->watchdog, NULL, watchdog_main, t);
    if (rc != 0) {
        snprintf(why, why_size, "cannot start the connection watchdog thread: %s", strerror(rc));
        pthread_mutex_destroy(&t->mu);
        pthread_cond_destroy(&t->wake);
        free(t);
        return false;
    }
    t->watchdog_started = true;
    s->conns = t;
    return true;
}

void kt_conns_stop(struct kt_server *s)
{
    struct kt_conn_table *t = s->conns;
    if (!t)
        return;
    pthread_mutex_lock(&t->mu);
    t->stop = true;
    pthread_cond_signal(&t->wake);
    pthread_mutex_unlock(&t->mu);
    if (t->watchdog_started)
        pthread_join(t->watchdog, NULL);
    for (struct conn *c = t->head, *next; c; c = next) { /* none once the daemon stopped */
        next = c->next;
        free(c);
    }
    pthread_mutex_destroy(&t->mu);
    pthread_cond_destroy(&t->wake);
    free(t);
    s->conns = NULL;
}
