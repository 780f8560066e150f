/*
 * test_kt_serve_connections.c - kt-serve against slow and idle clients: more
 * clients sending half a request than --max-connections lock nobody out (a
 * new client and /health are answered within a second) and are closed after
 * --client-timeout; a client trickling its request byte by byte is closed
 * at the same deadline; idle keep-alive connections are closed after
 * --idle-timeout; one address holds at most --max-connections-per-client; a
 * stream quiet for longer than --client-timeout (queued behind another) is
 * kept open by pings.
 */
#include <stdlib.h>
#include <string.h>

#include "serve_harness.h"

static char model[1024];

static const char *const half_request =
    "POST /v1/completions HTTP/1.1\r\nHost: kt\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"pr";

/* curl's total time for a request, and its status */
static int timed_http(const struct test_server *s, const char *path, const char *body, double *seconds)
{
    double t0 = harness_now();
    struct kt_buf out = {0};
    int code = http(s, "--max-time 5", path, body, &out, NULL);
    *seconds = harness_now() - t0;
    kt_buf_free(&out);
    return code;
}

static void slow_clients_lock_nobody_out_and_are_closed(void)
{
    struct test_server s;
    if (!server_start(&s, model, "-t 1 -q --max-connections 8 --client-timeout 2 --idle-timeout 2", true))
        return;
    enum { N_SLOW = 12 };
    int slow[N_SLOW];
    double opened[N_SLOW];
    for (int i = 0; i < N_SLOW; i++) {
        slow[i] = raw_connect(&s);
        opened[i] = harness_now();
        KT_CHECK(slow[i] >= 0 && raw_send(slow[i], half_request), "slow client %d", i);
        usleep(20000);
    }
    double health_s, completion_s;
    int health = timed_http(&s, "/health", NULL, &health_s);
    int completion = timed_http(&s, "/v1/completions", "{\"prompt\": \"hi\", \"max_tokens\": 2}", &completion_s);
    KT_CHECK(health == 200 && health_s < 1, "/health behind %d slow clients: %d in %.2f s", N_SLOW, health, health_s);
    KT_CHECK(completion == 200 && completion_s < 1, "a new client behind %d slow clients: %d in %.2f s", N_SLOW,
             completion, completion_s);
    /* the table's reserve was taken back from the oldest; the rest time out */
    for (int i = 0; i < N_SLOW; i++) {
        double closed = slow[i] >= 0 ? raw_wait_closed(slow[i], 6) : -1;
        double after = closed < 0 ? -1 : harness_now() - opened[i];
        KT_CHECK(closed >= 0 && after < 2 + 1.5, "slow client %d: closed %.2f s after it connected (timeout 2 s)", i,
                 after);
        if (slow[i] >= 0)
            close(slow[i]);
    }
    double timed_out = server_metric(&s, "kt:http_connections_closed_total{reason=\"slow_request\"}");
    double for_room = server_metric(&s, "kt:http_connections_closed_total{reason=\"room\"}");
    KT_CHECK(timed_out >= 1 && for_room >= 1 && timed_out + for_room >= N_SLOW,
             "closed: %g for their deadline, %g for room, of %d", timed_out, for_room, N_SLOW);
    KT_CHECK(server_metric(&s, "kt:http_connections{state=\"receiving\"}") == 0, "connections still receiving");
    size_t len = 0;
    char *log = kt_test_read_file(s.log, &len);
    KT_CHECK(log && !strstr(log, "kt-serve: http:"), "closing slow clients is routine, yet logged:\n%.2000s",
             log ? log : "(none)");
    free(log);
    KT_CHECK(server_stop(&s) == 0, "exit status");
}

/* libmicrohttpd's inactivity timeout restarts with every byte; the request's deadline does not. */
static void a_trickling_request_is_closed_at_its_deadline(void)
{
    struct test_server s;
    if (!server_start(&s, model, "-t 1 -q --client-timeout 2 --idle-timeout 2", true))
        return;
    int fd = raw_connect(&s);
    KT_CHECK(fd >= 0 && raw_send(fd, "GET /health HTTP/1.1\r\n"), "request line");
    double t0 = harness_now(), closed_at = -1;
    const char *header = "X-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    for (size_t i = 0; fd >= 0 && closed_at < 0 && harness_now() - t0 < 8; i = (i + 1) % strlen(header)) {
        char byte[2] = {header[i], 0};
        if (!raw_send(fd, byte)) {
            closed_at = harness_now() - t0;
            break;
        }
        double c = raw_wait_closed(fd, 0.3);
        if (c >= 0)
            closed_at = harness_now() - t0;
    }
    KT_CHECK(closed_at >= 1.5 && closed_at < 2 + 1.5, "a request trickled a byte every 0.3 s: closed after %.2f s, "
             "its deadline is 2 s", closed_at);
    if (fd >= 0)
        close(fd);
    KT_CHECK(server_metric(&s, "kt:http_connections_closed_total{reason=\"slow_request\"}") == 1, "counted");
    KT_CHECK(server_stop(&s) == 0, "exit status");
}

static void idle_keep_alive_connections_are_closed(void)
{
    struct test_server s;
    if (!server_start(&s, model, "-t 1 -q --client-timeout 5 --idle-timeout 2", true))
        return;
    int fd = raw_connect(&s);
    KT_CHECK(fd >= 0 && raw_send(fd, "GET /health HTTP/1.1\r\nHost: kt\r\n\r\n"), "request");
    char buf[1024];
    ssize_t n = fd >= 0 ? read(fd, buf, sizeof buf - 1) : -1;
    buf[n > 0 ? n : 0] = 0;
    KT_CHECK(n > 0 && strstr(buf, "HTTP/1.1 200") && !strstr(buf, "Connection: close"), "a kept-alive answer: %s",
             buf);
    double closed = fd >= 0 ? raw_wait_closed(fd, 6) : -1;
    KT_CHECK(closed >= 1.5 && closed < 2 + 1.5, "an idle connection closed after %.2f s, --idle-timeout 2", closed);
    if (fd >= 0)
        close(fd);
    KT_CHECK(server_stop(&s) == 0, "exit status");
}

static void one_address_holds_its_share_only(void)
{
    struct test_server s;
    if (!server_start(&s, model, "-t 1 --max-connections-per-client 3 --idle-timeout 10", true))
        return;
    usleep(500000); /* the readiness check's connection, gone from the table */
    int fds[3];
    for (int i = 0; i < 3; i++)
        fds[i] = raw_connect(&s);
    usleep(100000);
    int extra = raw_connect(&s);
    double closed = extra >= 0 ? raw_wait_closed(extra, 1) : 0;
    KT_CHECK(closed >= 0 && closed < 1, "a 4th connection from one address was not refused");
    if (extra >= 0)
        close(extra);
    for (int i = 0; i < 3; i++) {
        KT_CHECK(fds[i] >= 0 && raw_wait_closed(fds[i], 0.1) < 0, "connection %d of 3 was closed", i);
        if (fds[i] >= 0)
            close(fds[i]);
    }
    usleep(200000);
    KT_CHECK(server_metric(&s, "kt:http_connections_refused_total") >= 1, "the refusal is counted");
    size_t len = 0;
    char *log = kt_test_read_file(s.log, &len);
    KT_CHECK(log && strstr(log, "--max-connections-per-client 3"), "the log names the limit: %s", log ? log : "");
    free(log);
    KT_CHECK(server_stop(&s) == 0, "exit status");
}

static void a_quiet_stream_outlives_the_client_timeout(void)
{
    struct test_server s;
    if (!server_start(&s, model, "-t 1 -q --max-seqs 1 --client-timeout 2 --sse-ping-interval 0", true))
        return;
    /* a long job holds the only sequence for 4 s; the stream waits behind it, silent but for pings */
    kt_test_system("curl -s --max-time 4 -o /dev/null -d '{\"prompt\": \"x\", \"max_tokens\": 3000, \"ignore_eos\": "
                   "true}' http://127.0.0.1:%d/v1/completions &",
                   s.port);
    usleep(300000);
    struct kt_buf out = {0};
    int code = http(&s, "-N", "/v1/completions",
                    "{\"prompt\": \"x\", \"max_tokens\": 3, \"ignore_eos\": true, \"stream\": true}", &out, NULL);
    const char *t = kt_buf_str(&out);
    KT_CHECK(code == 200 && strstr(t, ": ping\n\n") && strstr(t, "\"finish_reason\":\"length\"") &&
                 strstr(t, "data: [DONE]"),
             "a stream queued for 4 s with --client-timeout 2: %.500s", t);
    kt_buf_free(&out);
    KT_CHECK(server_stop(&s) == 0, "exit status");
}

int main(void)
{
    if (!have_curl())
        return kt_test_skip("curl is not installed");
    snprintf(model, sizeof model, "%s", kt_test_path("serve-connections.gguf"));
    if (!make_model(model, "tiny", NULL)) {
        KT_CHECK(false, "kt-synth failed");
        return kt_test_finish();
    }
    KT_RUN(slow_clients_lock_nobody_out_and_are_closed);
    KT_RUN(a_trickling_request_is_closed_at_its_deadline);
    KT_RUN(idle_keep_alive_connections_are_closed);
    KT_RUN(one_address_holds_its_share_only);
    KT_RUN(a_quiet_stream_outlives_the_client_timeout);
    unlink(model);
    return kt_test_finish();
}
