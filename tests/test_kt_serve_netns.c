/*
 * test_kt_serve_netns.c - kt-serve over two "hosts" for real (runtime/dist,
 * tools/serve): a 2-rank job, rank 0 (HTTP, scheduler, embedding and head)
 * in network namespace a and rank 1 in b, the two joined by a veth pair and
 * OpenMPI over TCP between them (tests/netns_harness.h makes and removes
 * them).  The requests go to rank 0's port on a's own 127.0.0.1 (curl run
 * in a), and one of the two sent at once comes from b to rank 0's address on
 * the veth (rank 0 listens on every address of a: its loopback and the veth).
 *
 * Checked: a greedy chat answer is the one a single kt-serve gives for the
 * same prompt (tiny), two concurrent requests (one of them from b, over
 * the veth: b has no other way to a) both complete, well formed and as one
 * process answers them; rank 0 ran in a and rank 1 in b (their
 * /proc/PID/ns/net, and rank 1's log names b's hostname); the residual
 * stream of every token crossed the veth both ways (b's /proc/net/dev); the
 * job stops with status 0 on SIGTERM to rank 0, no process of it left; and
 * a run killed midway (SIGTERM to a test process holding a live job, as
 * ctest's timeout or the watchdog would) leaves no namespace or process.
 *
 * Skipped (visibly) without MPI, mpirun, root, CAP_SYS_ADMIN + CAP_NET_ADMIN,
 * `ip` (iproute2), nsenter/unshare (util-linux), or curl.
 */
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "model.h"
#include "netns_harness.h"
#include "serve_harness.h"
#include "testlib.h"

#define WATCHDOG_S 110 /* the whole test, under ctest's 120 s for it */
#define CURL_MAX_S 40  /* one request */
#define CHILD_WATCHDOG_S 45 /* the stopped-midway case's job (its start takes seconds) */
/* the same on both sides; no prefix cache, so every prompt token goes down the ring */
#define SERVE_ARGS "-t 1 --max-seqs 2 --ctx 256 --prefix-cache 0 --rank-timeout 30"
/* ... and the job's rank 0 listens on a's addresses (its loopback and the veth), for b's request */
#define JOB_ARGS SERVE_ARGS " --host 0.0.0.0"

static char model[1024];
static uint32_t n_embd;

/* The prompts: alone (greedy), then the two sent at once. */
static const char *const prompts[3] = {"Tell me about the river, please", "Count the stones by the road",
                                       "Why is the sky dark at night?"};
static const unsigned max_tokens[3] = {12, 9, 14};

/* One reply: its text and token counts (text NULL: none or malformed). */
struct reply {
    char *text;
    long long prompt_tokens, completion_tokens;
};

/* Parses a chat completion and checks it is well formed (object, id,
 * created, model, one choice with the assistant's message and a finish
 * reason, usage adding up within max_tokens); fills r. */
static void parse_reply(const char *what, const char *body, unsigned max, struct reply *r)
{
    *r = (struct reply){0};
    json_error_t jerr;
    json_t *j = body ? json_loads(body, 0, &jerr) : NULL;
    json_t *choices = json_object_get(j, "choices"), *c0 = json_array_get(choices, 0);
    json_t *msg = json_object_get(c0, "message"), *usage = json_object_get(j, "usage");
    const char *object = json_string_value(json_object_get(j, "object"));
    const char *id = json_string_value(json_object_get(j, "id"));
    const char *role = json_string_value(json_object_get(msg, "role"));
    const char *content = json_string_value(json_object_get(msg, "content"));
    const char *finish = json_string_value(json_object_get(c0, "finish_reason"));
    const json_t *pt = json_object_get(usage, "prompt_tokens"), *ct = json_object_get(usage, "completion_tokens");
    const json_t *tt = json_object_get(usage, "total_tokens");
    const bool ok = j && object && strcmp(object, "chat.completion") == 0 && id && *id &&
                    json_is_integer(json_object_get(j, "created")) && json_is_string(json_object_get(j, "model")) &&
                    json_array_size(choices) == 1 && json_integer_value(json_object_get(c0, "index")) == 0 && role &&
                    strcmp(role, "assistant") == 0 && content && finish &&
                    (strcmp(finish, "length") == 0 || strcmp(finish, "stop") == 0) && json_is_integer(pt) &&
                    json_is_integer(ct) && json_is_integer(tt) && json_integer_value(pt) > 0 &&
                    json_integer_value(ct) >= 1 && json_integer_value(ct) <= (json_int_t)max &&
                    json_integer_value(tt) == json_integer_value(pt) + json_integer_value(ct) &&
                    (strcmp(finish, "length") != 0 || json_integer_value(ct) == (json_int_t)max);
    KT_CHECK(ok, "%s: not a well-formed chat completion: %s", what, body ? body : "(nothing)");
    if (ok) {
        r->text = strdup(content);
        r->prompt_tokens = json_integer_value(pt);
        r->completion_tokens = json_integer_value(ct);
    }
    json_decref(j);
}

/* Requests prompts[first..first+n) at once (curl in the background, in the
 * server's namespace; request from_b, if one of them, from b to a's veth
 * address), each reply parsed into replies[i]. */
static void ask(const struct test_server *s, int first, int n, int from_b, struct reply *replies)
{
    char script[8192] = "";
    size_t used = 0;
    for (int i = first; i < first + n; i++) {
        char out[1024];
        snprintf(out, sizeof out, "%s.%d", kt_test_path("netns-serve-reply"), i);
        unlink(out);
        used += (size_t)snprintf(script + used, sizeof script - used,
                                 "%s curl -s --max-time %d -o %s -H 'Content-Type: application/json' -d "
                                 "'{\"messages\": [{\"role\": \"user\", \"content\": \"%s\"}], \"max_tokens\": %u, "
                                 "\"temperature\": 0}' http://%s:%d/v1/chat/completions & ",
                                 i == from_b ? netns_in_b() : s->via, CURL_MAX_S, out, prompts[i], max_tokens[i],
                                 i == from_b ? netns.addr_a : "127.0.0.1", s->port);
    }
    snprintf(script + used, sizeof script - used, "wait");
    KT_CHECK(kt_test_system("%s", script) == 0, "the requests did not run");
    for (int i = first; i < first + n; i++) {
        char out[1024], what[64];
        snprintf(out, sizeof out, "%s.%d", kt_test_path("netns-serve-reply"), i);
        snprintf(what, sizeof what, "request %d (port %d%s)", i, s->port, i == from_b ? ", from b" : "");
        size_t bytes = 0;
        char *body = kt_test_read_file(out, &bytes);
        parse_reply(what, body, max_tokens[i], &replies[i]);
        free(body);
        unlink(out);
    }
}

/* Waits until rank 0 has logged the pipeline (it does once ready) and rank 1
 * its layers, at most wait_s; the two pids (0 where missing). */
static void rank_pids(const struct test_server *s, double wait_s, pid_t *rank0, pid_t *rank1)
{
    for (double t0 = harness_now(); harness_now() - t0 < wait_s; usleep(20000))
        if ((*rank0 = server_rank_pid(s, 0)) > 0 && (*rank1 = server_rank_pid(s, 1)) > 0)
            return;
}

/* SIGTERM to rank 0 (it drains, then stops rank 1); the job's exit status
 * (128+signal), or -1 when it did not end within wait_s (then killed). */
static int stop_job(struct test_server *s, pid_t rank0, double wait_s)
{
    kill(rank0, SIGTERM);
    for (double t0 = harness_now(); harness_now() - t0 < wait_s; usleep(20000)) {
        int status = 0;
        if (waitpid(s->pid, &status, WNOHANG) == s->pid) {
            s->pid = 0;
            return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        }
    }
    kill(s->pid, SIGKILL);
    waitpid(s->pid, NULL, 0);
    s->pid = 0;
    return -1;
}

/* No such process, or only its zombie (killed, its parent gone: init reaps it when it does). */
static bool gone(pid_t pid)
{
    if (pid <= 0)
        return false;
    if (kill(pid, 0) != 0 && errno == ESRCH)
        return true;
    char path[64], stat_line[512];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    const char *state = f && fgets(stat_line, sizeof stat_line, f) ? strrchr(stat_line, ')') : NULL;
    if (f)
        fclose(f);
    return !f || (state && (state[2] == 'Z' || state[2] == 'X'));
}

static void free_replies(struct reply *r, int n)
{
    for (int i = 0; i < n; i++)
        free(r[i].text);
}

static void two_namespaces_serve_what_one_process_serves(void)
{
    struct reply one[3], two[3];
    struct test_server s;
    memset(one, 0, sizeof one), memset(two, 0, sizeof two);
    if (!server_start(&s, model, SERVE_ARGS, true))
        return;
    ask(&s, 0, 1, -1, one);
    ask(&s, 1, 2, -1, one);
    KT_CHECK(server_stop(&s) == 0, "kt-serve alone did not stop cleanly (log %s)", s.log);

    uint64_t rx0 = 0, tx0 = 0, rx1 = 0, tx1 = 0;
    KT_CHECK(netns_veth_b_bytes(&rx0, &tx0), "no counters of %s in %s", netns.if_b, netns.ns_b);
    const double t0 = harness_now();
    if (!server_start_in(&s, netns_in_a(), netns_mpirun(), model, JOB_ARGS, true)) {
        free_replies(one, 3);
        return;
    }
    const double ready_s = harness_now() - t0;
    pid_t rank0 = 0, rank1 = 0;
    rank_pids(&s, 10, &rank0, &rank1);
    KT_CHECK(rank0 > 0 && rank1 > 0, "no pids of ranks 0 and 1 in %s", s.log);
    const char in0 = netns_of_pid(rank0), in1 = netns_of_pid(rank1);
    KT_CHECK(in0 == 'a', "rank 0 (pid %d) is not in %s (%c)", (int)rank0, netns.ns_a, in0 ? in0 : '-');
    KT_CHECK(in1 == 'b', "rank 1 (pid %d) is not in %s (%c)", (int)rank1, netns.ns_b, in1 ? in1 : '-');

    const double t1 = harness_now();
    ask(&s, 0, 1, -1, two);
    const double alone_s = harness_now() - t1;
    ask(&s, 1, 2, 2, two); /* the second from b */
    const double pair_s = harness_now() - t1 - alone_s;
    for (int i = 0; i < 3; i++)
        KT_CHECK(one[i].text && two[i].text && strcmp(one[i].text, two[i].text) == 0 &&
                     one[i].completion_tokens == two[i].completion_tokens,
                 "request %d over %s and %s: '%s', one process: '%s'", i, netns.ns_a, netns.ns_b,
                 two[i].text ? two[i].text : "(none)", one[i].text ? one[i].text : "(none)");
    const int rc = rank0 > 0 ? stop_job(&s, rank0, 30) : server_stop(&s);
    KT_CHECK(rc == 0, "SIGTERM to rank 0 gave exit status %d (log %s)", rc, s.log);
    KT_CHECK(gone(rank0) && gone(rank1), "a rank outlived the job: rank 0 (pid %d) %s, rank 1 (pid %d) %s",
             (int)rank0, gone(rank0) ? "gone" : "left", (int)rank1, gone(rank1) ? "gone" : "left");

    size_t n = 0;
    char *text = kt_test_read_file(s.log, &n);
    char want[128];
    snprintf(want, sizeof want, "rank 1 (%s, pid", netns.host_b);
    KT_CHECK(text && strstr(text, want), "rank 1 did not run in %s (no \"%s\" in %s)", netns.ns_b, want, s.log);
    /* the pair really ran together: a decode batch of both went down the ring as two slices */
    const char *report = text ? strstr(text, "kt-serve: pipeline of 2 ranks: ") : NULL;
    unsigned long long steps = 0, slices = 0;
    KT_CHECK(report && sscanf(report, "kt-serve: pipeline of 2 ranks: %llu steps in %llu slices", &steps, &slices) == 2 &&
                 slices > steps,
             "no decode step carried both requests (%llu steps in %llu slices; log %s)", steps, slices, s.log);
    free(text);

    /* every computed token's residual stream went a -> b and back: the prompt, then each token but the last */
    uint64_t tokens = 0;
    for (int i = 0; i < 3; i++)
        tokens += (uint64_t)(two[i].prompt_tokens + two[i].completion_tokens - 1);
    const uint64_t floor = tokens * n_embd * sizeof(float);
    KT_CHECK(netns_veth_b_bytes(&rx1, &tx1), "no counters of %s in %s", netns.if_b, netns.ns_b);
    KT_CHECK(tokens > 0 && rx1 - rx0 >= floor && tx1 - tx0 >= floor,
             "%s carried %" PRIu64 " bytes in and %" PRIu64 " out, less than the stream's %" PRIu64, netns.if_b,
             rx1 - rx0, tx1 - tx0, floor);
    printf("  ready in %.2f s; one request %.2f s, two at once %.2f s (%llu steps in %llu slices); %s received %" PRIu64
           " and sent %" PRIu64 " bytes (the stream of %" PRIu64 " tokens alone: %" PRIu64 " each way)\n",
           ready_s, alone_s, pair_s, steps, slices, netns.if_b, rx1 - rx0, tx1 - tx0, tokens, floor);
    free_replies(one, 3);
    free_replies(two, 3);
}

/* A test process that holds namespaces and a serving job, stopped by
 * SIGTERM (ctest's timeout, a ^C; the watchdog's SIGALRM takes the same
 * path): its namespaces and every process of the job are gone after. */
static void a_run_stopped_midway_leaves_nothing(void)
{
    int fds[2];
    const bool piped = pipe(fds) == 0;
    KT_CHECK(piped, "pipe: %s", strerror(errno));
    if (!piped)
        return;
    const pid_t child = fork();
    if (child == 0) {
        prctl(PR_SET_PDEATHSIG, SIGTERM); /* the test killed meanwhile: clean up at once, not at the watchdog */
        close(fds[0]);
        pid_t pids[2] = {0, 0};
        struct test_server s;
        if (netns_setup("test_kt_serve_netns (child)", CHILD_WATCHDOG_S) &&
            server_start_in(&s, netns_in_a(), netns_mpirun(), model, SERVE_ARGS, true))
            rank_pids(&s, 10, &pids[0], &pids[1]);
        const bool sent = write(fds[1], pids, sizeof pids) == (ssize_t)sizeof pids;
        (void)sent;
        for (;;)
            pause(); /* until the parent's SIGTERM runs the cleanup */
    }
    close(fds[1]);
    pid_t pids[2] = {0, 0};
    const bool got = child > 0 && read(fds[0], pids, sizeof pids) == (ssize_t)sizeof pids;
    close(fds[0]);
    KT_CHECK(got && pids[0] > 0 && pids[1] > 0, "the child's job did not start (pids %d, %d)", (int)pids[0],
             (int)pids[1]);
    if (child <= 0)
        return;
    kill(child, SIGTERM);
    int status = 0;
    bool exited = false;
    for (double t0 = harness_now(); harness_now() - t0 < 20 && !exited; usleep(20000))
        exited = waitpid(child, &status, WNOHANG) == child;
    if (!exited) {
        kill(child, SIGKILL);
        waitpid(child, &status, 0);
    }
    KT_CHECK(exited && WIFEXITED(status) && WEXITSTATUS(status) == 1,
             "the child did not exit 1 within 20 s of SIGTERM (status %#x)", status);
    char a[128], b[128];
    struct stat st;
    snprintf(a, sizeof a, "/run/netns/" NETNS_PREFIX "a-%d", (int)child);
    snprintf(b, sizeof b, "/run/netns/" NETNS_PREFIX "b-%d", (int)child);
    KT_CHECK(stat(a, &st) != 0 && stat(b, &st) != 0, "%s or %s is left", a, b);
    /* the ranks were killed (SIGKILL) by the cleanup; reaped by init or mpirun as they go */
    bool left = true;
    for (double t0 = harness_now(); harness_now() - t0 < 5 && left; usleep(20000))
        left = !gone(pids[0]) || !gone(pids[1]);
    KT_CHECK(!left, "a rank is left: rank 0 (pid %d) %s, rank 1 (pid %d) %s", (int)pids[0],
             gone(pids[0]) ? "gone" : "left", (int)pids[1], gone(pids[1]) ? "gone" : "left");
}

int main(void)
{
    const char *why = netns_unavailable();
    if (why)
        return kt_test_skip(why);
    if (!have_curl())
        return kt_test_skip("curl not found");
    snprintf(model, sizeof model, "%s", kt_test_path("netns-serve-tiny.gguf"));
    KT_CHECK(make_model(model, "tiny", NULL), "kt-synth failed");
    n_embd = netns_model_n_embd(model);
    KT_CHECK(n_embd > 0, "cannot open %s", model);
    if (n_embd == 0)
        return kt_test_finish();
    if (netns_setup("test_kt_serve_netns", WATCHDOG_S))
        KT_RUN(two_namespaces_serve_what_one_process_serves);
    netns_teardown();
    KT_RUN(a_run_stopped_midway_leaves_nothing);
    return kt_test_finish();
}
