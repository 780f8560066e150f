/*
 * test_backend_sim.c - the sim backend (backend.h): a device simulated on a
 * host thread.
 *
 * Proves: operations run in submission order, one at a time, and none runs
 * before the ones ahead of it have finished (a launch held on a gate keeps a
 * later copy from landing); submitting does not wait for the device; sync
 * returns only after everything submitted before it; each copy occupies the
 * device for at least latency + bytes / bandwidth (a lower bound, so the
 * check cannot flake on a slow machine) and is counted in the stats;
 * allocations beyond the budget are refused naming need and budget, and
 * freeing gives the budget back; a graph records without running and
 * replays its recording in order at each launch; a cuda device in a build or on a machine
 * that cannot run one is refused with a message.
 */
#include "backend.h"
#include "testlib.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

struct gate {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int open, entered;
};

static void wait_at_gate(void *ctx)
{
    struct gate *g = ctx;
    pthread_mutex_lock(&g->mu);
    g->entered = 1;
    pthread_cond_broadcast(&g->cv);
    while (!g->open)
        pthread_cond_wait(&g->cv, &g->mu);
    pthread_mutex_unlock(&g->mu);
}

struct log {
    int entries[64];
    int n;
};

static struct log g_log;
static int g_ids[64];

static void append(void *ctx)
{
    g_log.entries[g_log.n++] = *(int *)ctx;
}

static struct kt_backend *sim(uint64_t budget, double gbps, double latency_us)
{
    struct kt_backend *b = NULL;
    kt_err err = {0};
    struct kt_backend_params p = {.kind = KT_BACKEND_SIM, .name = "sim0", .memory_bytes = budget,
                                  .transfer_gbps = gbps, .latency_us = latency_us};
    KT_CHECK(kt_backend_create(&p, &b, &err) == KT_OK, "%s", err.msg);
    return b;
}

static void work_runs_in_submission_order(void)
{
    struct kt_backend *b = sim(0, 0, 0);
    if (!b)
        return;
    g_log.n = 0;
    for (int i = 0; i < 40; i++) {
        g_ids[i] = i;
        kt_backend_launch(b, append, &g_ids[i]);
    }
    kt_backend_sync(b);
    int in_order = g_log.n == 40;
    for (int i = 0; in_order && i < 40; i++)
        in_order = g_log.entries[i] == i;
    KT_CHECK(in_order, "40 launches ran in order before sync returned (%d ran)", g_log.n);
    kt_backend_destroy(b);
}

static void a_copy_waits_for_the_work_ahead_of_it(void)
{
    struct kt_backend *b = sim(1 << 20, 0, 0);
    if (!b)
        return;
    kt_err err = {0};
    void *dev = NULL;
    KT_CHECK(kt_backend_alloc(b, 4096, &dev, &err) == KT_OK, "%s", err.msg);
    char src[4096], back[4096];
    memset(src, 0x5a, sizeof src);
    memset(back, 0, sizeof back);
    if (dev)
        memset(dev, 0, 4096);
    struct gate g = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0};
    kt_backend_launch(b, wait_at_gate, &g);
    if (dev) {
        kt_backend_copy_in(b, dev, src, sizeof src);
        kt_backend_copy_out(b, back, dev, sizeof back);
    }
    /* submitting returned while the device is held at the gate */
    pthread_mutex_lock(&g.mu);
    while (!g.entered)
        pthread_cond_wait(&g.cv, &g.mu);
    const int landed_early = dev && ((unsigned char *)dev)[0] != 0;
    g.open = 1;
    pthread_cond_broadcast(&g.cv);
    pthread_mutex_unlock(&g.mu);
    KT_CHECK(!landed_early, "the copy ran while the launch ahead of it was still running");
    kt_backend_sync(b);
    KT_CHECK(memcmp(back, src, sizeof src) == 0, "copy in then out gives the bytes back after sync");
    kt_backend_free(b, dev, 4096);
    kt_backend_destroy(b);
}

static void copies_cost_latency_plus_bytes_over_bandwidth(void)
{
    const double gbps = 1.0, latency_us = 200;
    struct kt_backend *b = sim(0, gbps, latency_us);
    if (!b)
        return;
    kt_err err = {0};
    void *dev = NULL;
    const size_t bytes = 4 << 20;
    char *host = kt_test_xmalloc(bytes);
    memset(host, 1, bytes);
    KT_CHECK(kt_backend_alloc(b, bytes, &dev, &err) == KT_OK, "%s", err.msg);
    if (dev) {
        kt_backend_copy_in(b, dev, host, bytes);
        kt_backend_copy_out(b, host, dev, bytes);
        kt_backend_sync(b);
    }
    struct kt_backend_stats st;
    kt_backend_stats(b, &st);
    const double want_ns = 2 * (latency_us * 1e3 + (double)bytes / gbps);
    KT_CHECK(st.transfer_ns >= (uint64_t)want_ns, "two 4 MiB copies at 1 GB/s took %.2f ms of device time (>= %.2f)",
             st.transfer_ns / 1e6, want_ns / 1e6);
    KT_CHECK(st.bytes_in == bytes && st.bytes_out == bytes && st.ops == 2, "stats: in %llu out %llu ops %llu",
             (unsigned long long)st.bytes_in, (unsigned long long)st.bytes_out, (unsigned long long)st.ops);
    printf("  2 x 4 MiB at 1 GB/s + 200 us: %.2f ms of device time\n", st.transfer_ns / 1e6);
    kt_backend_free(b, dev, bytes);
    free(host);
    kt_backend_destroy(b);
}

static void memory_beyond_the_budget_is_refused(void)
{
    struct kt_backend *b = sim(1 << 20, 0, 0);
    if (!b)
        return;
    kt_err err = {0};
    void *a = NULL, *c = NULL;
    KT_CHECK(kt_backend_alloc(b, 768 << 10, &a, &err) == KT_OK, "%s", err.msg);
    KT_CHECK(kt_backend_alloc(b, 512 << 10, &c, &err) == KT_ERR_NOMEM && c == NULL, "over budget refused");
    KT_CHECK(strstr(err.msg, "sim0") && strstr(err.msg, "budget"), "message names device and budget: %s", err.msg);
    kt_backend_free(b, a, 768 << 10);
    KT_CHECK(kt_backend_used_bytes(b) == 0, "free gives the budget back");
    KT_CHECK(kt_backend_alloc(b, 512 << 10, &c, &err) == KT_OK, "fits after the free: %s", err.msg);
    kt_backend_free(b, c, 512 << 10);
    kt_backend_destroy(b);
}

/* A graph records what is queued between begin and end without running it;
 * each launch runs the recording again, in order, after what is ahead of
 * it; a second recording at once is refused; counted in the stats. */
static void graphs_record_then_replay_in_order(void)
{
    struct kt_backend *b = sim(0, 0, 0);
    if (!b)
        return;
    kt_err err = {0};
    g_log.n = 0;
    for (int i = 0; i < 8; i++)
        g_ids[i] = i;
    int *dev = NULL, src = 41, out = 0;
    KT_CHECK(kt_backend_alloc(b, sizeof *dev, (void **)&dev, &err) == KT_OK, "%s", err.msg);
    struct kt_backend_graph *g = NULL;
    KT_CHECK(kt_backend_graph_begin(b, &err) == KT_OK, "begin: %s", err.msg);
    KT_CHECK(kt_backend_graph_begin(b, &err) == KT_ERR_INVALID, "a second recording at once refused");
    kt_backend_launch(b, append, &g_ids[1]);
    kt_backend_copy_device(b, dev, &src, sizeof src); /* (a host pointer here: the sim cannot tell) */
    kt_backend_launch(b, append, &g_ids[2]);
    KT_CHECK(kt_backend_graph_end(b, &g, &err) == KT_OK && g, "end: %s", err.msg);
    kt_backend_sync(b);
    KT_CHECK(g_log.n == 0, "recording ran nothing (%d entries)", g_log.n);
    kt_backend_launch(b, append, &g_ids[0]);
    kt_backend_graph_launch(b, g);
    src = 42;
    kt_backend_graph_launch(b, g);
    kt_backend_copy_out(b, &out, dev, sizeof out);
    kt_backend_sync(b);
    const int want[] = {0, 1, 2, 1, 2};
    KT_CHECK(g_log.n == 5 && !memcmp(g_log.entries, want, sizeof want), "replayed twice, in order (%d entries)",
             g_log.n);
    KT_CHECK(out == 42, "the replayed copy read the source as it was at replay (%d)", out);
    struct kt_backend_stats st;
    kt_backend_stats(b, &st);
    KT_CHECK(st.graph_launches == 2, "2 graph launches counted (%llu)", (unsigned long long)st.graph_launches);
    struct kt_backend_graph *none = NULL;
    KT_CHECK(kt_backend_graph_end(b, &none, &err) == KT_ERR_INVALID && !none, "end without begin refused");
    kt_backend_graph_destroy(g);
    kt_backend_free(b, dev, sizeof *dev);
    kt_backend_destroy(b);
}

static void cuda_device_without_support_is_refused(void)
{
    struct kt_backend *b = NULL;
    kt_err err = {0};
    struct kt_backend_params p = {.kind = KT_BACKEND_CUDA, .name = "gpu"};
    KT_CHECK(kt_backend_create(&p, &b, &err) == KT_ERR_UNSUPPORTED && b == NULL, "cuda refused");
    KT_CHECK(strstr(err.msg, "gpu") != NULL, "message names the device: %s", err.msg);
}

int main(void)
{
    KT_RUN(work_runs_in_submission_order);
    KT_RUN(a_copy_waits_for_the_work_ahead_of_it);
    KT_RUN(copies_cost_latency_plus_bytes_over_bandwidth);
    KT_RUN(memory_beyond_the_budget_is_refused);
    KT_RUN(graphs_record_then_replay_in_order);
    KT_RUN(cuda_device_without_support_is_refused);
    return kt_test_finish();
}
