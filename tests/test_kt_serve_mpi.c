/*
 * test_kt_serve_mpi.c - kt-serve over the ranks of an MPI job: rank 0
 * serves HTTP and drives the steps, the other ranks run their layers.
 * Concurrent greedy requests (continuous batching: their decode steps are
 * batches, split into micro-batches down the pipeline) get the same text
 * from 2 and 3 ranks as from one process; SIGTERM to rank 0 stops the
 * whole job with status 0.  With a kt-place plan over two machines each
 * rank applies its own part of --placement and serves the same text, and
 * so does a job whose rank 1 has a sim device of its own.  Faults: a rank that hangs (SIGSTOP) fails the running request,
 * /health turns 503, and the job exits non-zero within --rank-timeout and a
 * few seconds; a rank killed (SIGKILL) ends the job non-zero too, never a
 * hang.
 *
 * Skipped (visibly) when kt was built without MPI, mpirun or curl is absent.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "serve_harness.h"
#include "testlib.h"

static char mpirun[1024], model[1024];

#define N_REQUESTS 4

static const char *mpirun_cmd(int n)
{
    static char cmd[2048];
    snprintf(cmd, sizeof cmd,
             "%s -np %d --oversubscribe %s --mca btl self,tcp --mca btl_tcp_if_include lo "
             "--mca oob_tcp_if_include lo",
             mpirun, n, getuid() == 0 ? "--allow-run-as-root" : "");
    return cmd;
}

/* N_REQUESTS chat requests at once (curl in the background), each one's
 * reply text into texts[i] (malloc'd; NULL when it failed). */
static void concurrent_requests(const struct test_server *s, char *texts[N_REQUESTS])
{
    char script[8192] = "";
    size_t used = 0;
    for (int i = 0; i < N_REQUESTS; i++) {
        char out[1024];
        snprintf(out, sizeof out, "%s.%d", kt_test_path("mpi-serve-reply"), i);
        used += (size_t)snprintf(script + used, sizeof script - used,
                                 "curl -s --max-time 120 -o %s -H 'Content-Type: application/json' -d "
                                 "'{\"messages\": [{\"role\": \"user\", \"content\": \"Tell me about river %d, "
                                 "please\"}], \"max_tokens\": %d, \"temperature\": 0}' "
                                 "http://127.0.0.1:%d/v1/chat/completions & ",
                                 out, i, 10 + 3 * i, s->port);
    }
    snprintf(script + used, sizeof script - used, "wait");
    KT_CHECK(kt_test_system("%s", script) == 0, "the requests did not run");
    for (int i = 0; i < N_REQUESTS; i++) {
        char out[1024];
        snprintf(out, sizeof out, "%s.%d", kt_test_path("mpi-serve-reply"), i);
        size_t n = 0;
        char *body = kt_test_read_file(out, &n);
        json_t *j = body ? json_loads(body, 0, NULL) : NULL;
        const char *content = json_string_value(
            json_object_get(json_object_get(json_array_get(json_object_get(j, "choices"), 0), "message"), "content"));
        texts[i] = content ? strdup(content) : NULL;
        KT_CHECK(content != NULL, "request %d: no reply text in %s", i, body ? body : "(nothing)");
        json_decref(j);
        free(body);
        unlink(out);
    }
}

static int stop_job(struct test_server *s);

static void ranks_serve_what_one_process_serves(void)
{
    char *one[N_REQUESTS] = {0}, *many[N_REQUESTS] = {0};
    struct test_server s;
    if (!server_start(&s, model, "-t 1 --max-seqs 4", true))
        return;
    concurrent_requests(&s, one);
    KT_CHECK(server_stop(&s) == 0, "kt-serve alone did not stop cleanly (log %s)", s.log);
    for (int n = 2; n <= 3; n++) {
        if (!server_start_under(&s, mpirun_cmd(n), model, "-t 1 --max-seqs 4", true))
            continue;
        concurrent_requests(&s, many);
        for (int i = 0; i < N_REQUESTS; i++) {
            KT_CHECK(one[i] && many[i] && strcmp(one[i], many[i]) == 0,
                     "%d ranks, request %d: '%s', one process: '%s'", n, i, many[i] ? many[i] : "(none)",
                     one[i] ? one[i] : "(none)");
            free(many[i]);
            many[i] = NULL;
        }
        const int rc = stop_job(&s);
        KT_CHECK(rc == 0, "mpirun -np %d kt-serve: SIGTERM to rank 0 gave exit status %d (log %s)", n, rc, s.log);
    }
    for (int i = 0; i < N_REQUESTS; i++)
        free(one[i]);
}

/* Placements described in a log: on node 0 alone, and on nodes 0 and 1. */
static void count_placements(const char *log, int *one_node, int *two_nodes)
{
    size_t n = 0;
    char *text = kt_test_read_file(log, &n);
    *one_node = *two_nodes = 0;
    for (const char *at = text; at && (at = strstr(at, "NUMA nodes: 0: ")); at++) {
        const char *eol = strchr(at, '\n'), *second = strstr(at, "; 1: ");
        if (second && (!eol || second < eol))
            (*two_nodes)++;
        else
            (*one_node)++;
    }
    free(text);
}

/* kt-place over a 1-node and a 2-node machine: under mpirun each rank applies its own part of the file
 * (ranks[r].placement; rank 1 on both nodes of a synthetic topology, rank 0 the dense layer 0 on one),
 * the same text as one process serving the same file. */
static void ranks_serve_with_their_own_placement(void)
{
    char cfg[1024], m0[1024], m1[1024], args[2048];
    snprintf(cfg, sizeof cfg, "%s", kt_test_path("mpi-serve-cluster.yaml"));
    snprintf(m0, sizeof m0, "%s", kt_test_path("mpi-serve-rank0.json"));
    snprintf(m1, sizeof m1, "%s", kt_test_path("mpi-serve-rank1.json"));
    for (int r = 0; r < 2; r++) {
        FILE *f = fopen(r ? m1 : m0, "w");
        KT_CHECK(f != NULL, "cannot write %s", r ? m1 : m0);
        if (!f)
            return;
        fprintf(f, "{\"version\": 1, \"kind\": \"host %d\", \"topology\": \"\", \"nodes\": [%s]}\n", r,
                r ? "{\"node\": 0, \"memory_gib\": 4, \"triad_gbps\": 20}, {\"node\": 1, \"memory_gib\": 4, "
                    "\"triad_gbps\": 20}"
                  : "{\"node\": 0, \"memory_gib\": 4, \"triad_gbps\": 10}");
        fclose(f);
    }
    int rc = kt_test_system("%s -m %s --machine %s --machine %s --kv-tokens 256 -o %s >/dev/null 2>&1",
                            kt_test_tool("kt-place"), model, m0, m1, cfg);
    KT_CHECK(rc == 0, "kt-place --machine x2: exit %d", rc);
    if (rc != 0)
        return;
    snprintf(args, sizeof args, "-t 1 --max-seqs 4 --kv-memory 64 --placement %s", cfg);
    setenv("KT_TOPOLOGY_SYNTHETIC", "numa:2 core:1 pu:1", 1); /* two nodes for rank 1's placement */
    char *one[N_REQUESTS] = {0}, *many[N_REQUESTS] = {0};
    struct test_server s;
    if (server_start(&s, model, args, true)) {
        concurrent_requests(&s, one);
        KT_CHECK(server_stop(&s) == 0, "kt-serve alone did not stop cleanly (log %s)", s.log);
        if (server_start_under(&s, mpirun_cmd(2), model, args, true)) {
            concurrent_requests(&s, many);
            for (int i = 0; i < N_REQUESTS; i++)
                KT_CHECK(one[i] && many[i] && strcmp(one[i], many[i]) == 0,
                         "2 ranks with their placements, request %d: '%s', one process: '%s'", i,
                         many[i] ? many[i] : "(none)", one[i] ? one[i] : "(none)");
            const int stopped = stop_job(&s);
            KT_CHECK(stopped == 0, "mpirun -np 2 kt-serve --placement: SIGTERM gave %d (log %s)", stopped, s.log);
            int on_one = 0, on_two = 0;
            count_placements(s.log, &on_one, &on_two);
            /* each rank describes its own as its stage: rank 0's holds the dense layer 0 alone (kt-place gives
             * the faster rank 1 the MoE layers), no routed expert and so no NUMA line; rank 1's both nodes */
            KT_CHECK(on_one == 0 && on_two == 1, "placements on one node %d, on two %d, want 0 and 1 (log %s)",
                     on_one, on_two, s.log);
            size_t n = 0;
            char *text = kt_test_read_file(s.log, &n);
            KT_CHECK(text && strstr(text, "a pipeline stage: layers 0-0 held") &&
                         strstr(text, "a pipeline stage: layers 1-3 held"),
                     "the ranks did not describe their stages (log %s)", s.log);
            free(text);
        }
    }
    unsetenv("KT_TOPOLOGY_SYNTHETIC");
    for (int i = 0; i < N_REQUESTS; i++)
        free(one[i]), free(many[i]);
}

/* A hybrid stage: rank 1's own placement puts its layers' attention, shared experts and 8 experts a layer on
 * a sim device (which computes what the CPU does): the same text as one CPU process (the file's top level),
 * and rank 1's device did the work. */
static void a_rank_with_a_sim_device_serves_the_same(void)
{
    char cfg[1024], args[2048];
    snprintf(cfg, sizeof cfg, "%s", kt_test_path("mpi-serve-hybrid.yaml"));
    FILE *f = fopen(cfg, "w");
    KT_CHECK(f != NULL, "cannot write %s", cfg);
    if (!f)
        return;
    fputs("version: 1\nattention: cpu\nranks:\n  - layers: 0-1\n  - layers: 2-3\n    placement:\n"
          "      version: 1\n      devices:\n        sim: {backend: sim, memory_gib: 1}\n      attention: sim\n"
          "      shared_experts: sim\n      experts:\n        sim:\n          per_layer: 8\n", f);
    fclose(f);
    snprintf(args, sizeof args, "-t 1 --max-seqs 4 --kv-memory 64 --placement %s", cfg);
    char *one[N_REQUESTS] = {0}, *many[N_REQUESTS] = {0};
    struct test_server s;
    if (!server_start(&s, model, args, true))
        return;
    concurrent_requests(&s, one);
    KT_CHECK(server_stop(&s) == 0, "kt-serve alone did not stop cleanly (log %s)", s.log);
    if (server_start_under(&s, mpirun_cmd(2), model, args, true)) {
        concurrent_requests(&s, many);
        for (int i = 0; i < N_REQUESTS; i++)
            KT_CHECK(one[i] && many[i] && strcmp(one[i], many[i]) == 0,
                     "rank 1 with a sim device, request %d: '%s', one process: '%s'", i, many[i] ? many[i] : "(none)",
                     one[i] ? one[i] : "(none)");
        const int stopped = stop_job(&s);
        KT_CHECK(stopped == 0, "mpirun -np 2 kt-serve, a hybrid rank: SIGTERM gave %d (log %s)", stopped, s.log);
        size_t n = 0;
        char *text = kt_test_read_file(s.log, &n);
        const char *line = text ? strstr(text, "kt-serve: rank 1: stopped") : NULL;
        const char *dev = line ? strstr(line, "its device busy ") : NULL;
        const char *eol = line ? strchr(line, '\n') : NULL;
        KT_CHECK(dev && (!eol || dev < eol) && atof(dev + 16) > 0, "rank 1's device did no work (log %s)", s.log);
        free(text);
    }
    for (int i = 0; i < N_REQUESTS; i++)
        free(one[i]), free(many[i]);
}

/* Waits for the job's exit at most wait_s; its status (128+signal), or -1 if still running. */
static int wait_exit(struct test_server *s, double wait_s)
{
    for (double t0 = harness_now(); harness_now() - t0 < wait_s; usleep(20000)) {
        int status = 0;
        if (waitpid(s->pid, &status, WNOHANG) == s->pid) {
            s->pid = 0;
            return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        }
    }
    return -1;
}

/* SIGTERM to rank 0 (it drains, then stops the other ranks); the job's exit status. */
static int stop_job(struct test_server *s)
{
    const pid_t rank0 = server_rank_pid(s, 0);
    KT_CHECK(rank0 > 0, "no pid of rank 0 in %s", s->log);
    if (rank0 <= 0)
        return server_stop(s);
    kill(rank0, SIGTERM);
    const int rc = wait_exit(s, 120);
    if (rc < 0)
        server_stop(s);
    return rc;
}

static void a_hung_rank_fails_requests_then_the_job(void)
{
    struct test_server s;
    if (!server_start_under(&s, mpirun_cmd(2), model, "-t 1 --rank-timeout 2", true))
        return;
    const pid_t follower = server_rank_pid(&s, 1);
    KT_CHECK(follower > 0, "no pid of rank 1 in %s", s.log);
    if (follower <= 0) {
        server_stop(&s);
        return;
    }
    kill(follower, SIGSTOP);
    const double t0 = harness_now();
    struct kt_buf out = {0};
    int code = http(&s, NULL, "/v1/chat/completions",
                    "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"max_tokens\": 8}", &out, NULL);
    KT_CHECK(code >= 500, "a request while rank 1 hangs: HTTP %d, %s", code, kt_buf_str(&out));
    code = http(&s, NULL, "/health", NULL, &out, NULL); /* the step's failure turned the server to 503 first */
    KT_CHECK(code == 503 && strstr(kt_buf_str(&out), "pipeline"), "/health after the hang: HTTP %d, %s", code,
             kt_buf_str(&out));
    kt_buf_free(&out);
    const int rc = wait_exit(&s, 30);
    KT_CHECK(rc > 0, "the job did not exit non-zero within 30 s of the hang (status %d, log %s)", rc, s.log);
    printf("  hung rank: job exited with status %d after %.1f s\n", rc, harness_now() - t0);
    kill(follower, SIGCONT);
    kill(follower, SIGKILL);
    if (s.pid > 0) {
        kill(s.pid, SIGKILL);
        waitpid(s.pid, NULL, 0);
    }
}

static void a_killed_rank_ends_the_job(void)
{
    struct test_server s;
    if (!server_start_under(&s, mpirun_cmd(2), model, "-t 1 --rank-timeout 2", true))
        return;
    const pid_t follower = server_rank_pid(&s, 1);
    KT_CHECK(follower > 0, "no pid of rank 1 in %s", s.log);
    if (follower > 0)
        kill(follower, SIGKILL);
    const double t0 = harness_now();
    const int rc = wait_exit(&s, 30);
    KT_CHECK(rc > 0, "the job did not exit non-zero within 30 s of rank 1's death (status %d, log %s)", rc, s.log);
    printf("  killed rank: job exited with status %d after %.1f s\n", rc, harness_now() - t0);
    if (s.pid > 0) {
        kill(s.pid, SIGKILL);
        waitpid(s.pid, NULL, 0);
    }
}

int main(void)
{
    const char *have = getenv("KT_HAVE_MPI"), *exe = getenv("KT_MPIEXEC");
    if (!have || strcmp(have, "ON") != 0)
        return kt_test_skip("kt was built without MPI (apt-get install libopenmpi-dev openmpi-bin, then configure "
                            "with -DKT_MPI=ON)");
    if (!exe || !*exe || access(exe, X_OK) != 0)
        return kt_test_skip("mpirun not found (apt-get install openmpi-bin)");
    if (!have_curl())
        return kt_test_skip("curl not found");
    snprintf(mpirun, sizeof mpirun, "%s", exe);
    snprintf(model, sizeof model, "%s", kt_test_path("mpi-serve-tiny.gguf"));
    KT_CHECK(make_model(model, "tiny", NULL), "kt-synth failed");
    KT_RUN(ranks_serve_what_one_process_serves);
    KT_RUN(ranks_serve_with_their_own_placement);
    KT_RUN(a_rank_with_a_sim_device_serves_the_same);
    KT_RUN(a_hung_rank_fails_requests_then_the_job);
    KT_RUN(a_killed_rank_ends_the_job);
    return kt_test_finish();
}
