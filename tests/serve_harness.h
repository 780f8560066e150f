/*
 * serve_harness.h - what the kt-serve end-to-end tests share: start
 * kt-serve on a free port (its log in a file), wait until it is ready, talk
 * to it with curl, stop it with SIGTERM and collect its exit status.
 * Header-only: each test program includes it once.
 */
#ifndef KT_SERVE_HARNESS_H
#define KT_SERVE_HARNESS_H

#include <arpa/inet.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "serve_text.h"
#include "testlib.h"

/* KT_RUN for a case that takes one argument. */
#define RUN_WITH(fn, arg)                                                                  \
    do {                                                                                   \
        int before_ = kt_test_failures;                                                    \
        fn(arg);                                                                           \
        printf("%s %s\n", kt_test_failures == before_ ? "ok  " : "FAIL", #fn);             \
        fflush(stdout);                                                                    \
    } while (0)

struct test_server {
    pid_t pid;
    int port;
    char log[1024];
    char via[1200]; /* the prefix curl runs under ("": here; "nsenter --net=...": in the server's namespace) */
};

static inline double harness_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static inline bool have_curl(void)
{
    return kt_test_system("curl --version >/dev/null 2>&1") == 0;
}

/* Makes a model with kt-synth (preset and extra options); false on failure. */
static inline bool make_model(const char *path, const char *preset, const char *extra)
{
    return kt_test_system("%s --preset %s %s -q -o %s >/dev/null 2>&1", kt_test_tool("kt-synth"), preset,
                          extra ? extra : "", path) == 0;
}

/* Starts LAUNCHER kt-serve MODEL --port 0 ARGS (launcher: "" or e.g. "mpirun
 * -np 2"); with wait_ready, returns once /health says 200.  Every curl of the
 * harness runs under via (a command prefix; "": here), for a server whose
 * 127.0.0.1 is another network namespace's. */
static inline bool server_start_in(struct test_server *s, const char *via, const char *launcher, const char *model,
                                   const char *args, bool wait_ready)
{
    snprintf(s->via, sizeof s->via, "%s", via);
    static int n;
    char name[64];
    snprintf(name, sizeof name, "kt-serve-%d.log", n++);
    snprintf(s->log, sizeof s->log, "%s", kt_test_path(name));
    s->port = 0;
    s->pid = fork();
    if (s->pid == 0) {
        /* a test that dies must not leave its server running (holding ctest's output open) */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        char cmd[4096];
        snprintf(cmd, sizeof cmd, "exec %s %s -m %s --port 0 %s 2>%s", launcher, kt_test_tool("kt-serve"), model, args,
                 s->log);
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    for (double t0 = harness_now(); harness_now() - t0 < 120 && !s->port;) {
        size_t len;
        char *text = kt_test_read_file(s->log, &len);
        const char *at = text ? strstr(text, "listening on http://") : NULL;
        const char *colon = at ? strchr(at + 20, ':') : NULL;
        if (colon)
            s->port = atoi(colon + 1);
        free(text);
        int status;
        if (!s->port && waitpid(s->pid, &status, WNOHANG) == s->pid) {
            s->pid = 0;
            break;
        }
        usleep(10000);
    }
    if (!s->port) {
        KT_CHECK(false, "kt-serve did not start (log %s)", s->log);
        return false;
    }
    for (double t0 = harness_now(); wait_ready && harness_now() - t0 < 300;) {
        if (kt_test_system("%s curl -sf -o /dev/null http://127.0.0.1:%d/health", s->via, s->port) == 0)
            return true;
        usleep(20000);
    }
    KT_CHECK(!wait_ready, "kt-serve never became ready (log %s)", s->log);
    return !wait_ready;
}

/* Starts LAUNCHER kt-serve MODEL --port 0 ARGS, curl here. */
static inline bool server_start_under(struct test_server *s, const char *launcher, const char *model, const char *args,
                                      bool wait_ready)
{
    return server_start_in(s, "", launcher, model, args, wait_ready);
}

/* Starts kt-serve MODEL --port 0 ARGS; with wait_ready, returns once /health says 200. */
static inline bool server_start(struct test_server *s, const char *model, const char *args, bool wait_ready)
{
    return server_start_under(s, "", model, args, wait_ready);
}

/* SIGTERM, then its exit status (128+signal if killed; -1 if it would not stop). */
static inline int server_stop(struct test_server *s)
{
    if (s->pid <= 0)
        return -1;
    kill(s->pid, SIGTERM);
    int status = 0;
    for (double t0 = harness_now(); harness_now() - t0 < 120;) {
        if (waitpid(s->pid, &status, WNOHANG) == s->pid) {
            s->pid = 0;
            return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        }
        usleep(10000);
    }
    kill(s->pid, SIGKILL);
    waitpid(s->pid, &status, 0);
    s->pid = 0;
    return -1;
}

/* A TCP connection to the server, for clients curl cannot play (slow, half
 * a request, a reset); -1 on failure. */
static inline int raw_connect(const struct test_server *s)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)s->port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        close(fd);
        fd = -1;
    }
    return fd;
}

static inline bool raw_send(int fd, const char *text)
{
    return send(fd, text, strlen(text), MSG_NOSIGNAL) == (ssize_t)strlen(text);
}

/* Seconds until the server closed fd (read returns 0 or fails; what it
 * sends is read and dropped), or -1 if it is still open after wait_s. */
static inline double raw_wait_closed(int fd, double wait_s)
{
    double t0 = harness_now();
    for (;;) {
        double left = wait_s - (harness_now() - t0);
        if (left <= 0)
            return -1;
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, (int)(left * 1000) + 1) > 0) {
            char buf[4096];
            if (read(fd, buf, sizeof buf) <= 0)
                return harness_now() - t0;
        }
    }
}

/* curl CURL_ARGS http://127.0.0.1:PORT/PATH with body (NULL: none) as JSON;
 * returns the HTTP status (0 if curl failed), the body in out and the
 * response headers in headers (either may be NULL). */
static inline int http(const struct test_server *s, const char *curl_args, const char *path, const char *body,
                struct kt_buf *out, struct kt_buf *headers)
{
    char body_file[1024], out_file[1024], head_file[1024];
    snprintf(body_file, sizeof body_file, "%s", kt_test_path("req.json"));
    snprintf(out_file, sizeof out_file, "%s", kt_test_path("resp.body"));
    snprintf(head_file, sizeof head_file, "%s", kt_test_path("resp.head"));
    if (body) {
        FILE *f = fopen(body_file, "wb");
        if (!f)
            return 0;
        fwrite(body, 1, strlen(body), f);
        fclose(f);
    }
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "%s curl -s --max-time 120 -o %s -D %s -w '%%{http_code}' %s %s%s%s "
                              "http://127.0.0.1:%d%s",
             s->via, out_file, head_file, curl_args ? curl_args : "", body ? "-H 'Content-Type: application/json' " : "",
             body ? "--data-binary @" : "", body ? body_file : "", s->port, path);
    FILE *p = popen(cmd, "r");
    int code = 0;
    if (p) {
        if (fscanf(p, "%d", &code) != 1)
            code = 0;
        pclose(p);
    }
    size_t len = 0;
    char *text;
    if (out) {
        kt_buf_free(out);
        text = kt_test_read_file(out_file, &len);
        kt_buf_append(out, text ? text : "", text ? len : 0);
        free(text);
    }
    if (headers) {
        kt_buf_free(headers);
        text = kt_test_read_file(head_file, &len);
        kt_buf_append(headers, text ? text : "", text ? len : 0);
        free(text);
    }
    unlink(body_file), unlink(out_file), unlink(head_file);
    return code;
}

/* The value of the first sample in Prometheus text whose line starts with
 * series (a name, or a name and the start of its labels); NAN if none. */
static inline double metric_value(const char *text, const char *series)
{
    size_t n = strlen(series);
    for (const char *line = text; line && *line; line = strchr(line, '\n'), line = line ? line + 1 : NULL) {
        if (strncmp(line, series, n) != 0)
            continue;
        const char *end = strchr(line, '\n'), *space = NULL;
        for (const char *c = line; c < (end ? end : line + strlen(line)); c++)
            if (*c == ' ')
                space = c;
        return space ? atof(space + 1) : NAN;
    }
    return NAN;
}

static inline double server_metric(const struct test_server *s, const char *series)
{
    struct kt_buf out = {0};
    http(s, NULL, "/metrics", NULL, &out, NULL);
    double v = metric_value(kt_buf_str(&out), series);
    kt_buf_free(&out);
    return v;
}

/* Polls /metrics until nothing runs or waits; false if that took over wait_s. */
static inline bool wait_idle(const struct test_server *s, double wait_s)
{
    for (double t0 = harness_now(); harness_now() - t0 < wait_s; usleep(100000))
        if (server_metric(s, "vllm:num_requests_running{") == 0 && server_metric(s, "vllm:num_requests_waiting{") == 0)
            return true;
    return false;
}

/* The pid a kt-serve rank printed in the job's log (rank 0: "rank 0 on host, pid
 * N"; others "rank R (host, pid N)"); 0 if none. */
static inline pid_t server_rank_pid(const struct test_server *s, int rank)
{
    size_t n = 0;
    char *text = kt_test_read_file(s->log, &n);
    char mark[64];
    snprintf(mark, sizeof mark, rank == 0 ? "(rank 0 on " : "kt-serve: rank %d (", rank);
    const char *at = text ? strstr(text, mark) : NULL;
    const char *pid = at ? strstr(at, ", pid ") : NULL;
    const pid_t p = pid ? (pid_t)atoi(pid + 6) : 0;
    free(text);
    return p;
}

#endif
