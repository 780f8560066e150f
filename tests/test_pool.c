/*
 * test_pool.c - worker pools (the step's, and one per NUMA node) run every
 * item of every job exactly once, on a worker index in range and never on
 * the submitting thread unless it helps (kt_pool_parallel_for always does);
 * several pools run at once; thousands of tiny back-to-back jobs lose no
 * wakeup; sleeping workers wake for a job and shut down; the default and
 * capped thread counts follow the documented rule; workers on this machine
 * are pinned to one PU each, a pool without a node's are not.
 */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "numa_mem.h"
#include "pool.h"
#include "testlib.h"
#include "topology.h"

#define SYNTH_2X4 "package:2 numa:1 l3:1 core:4 pu:2"

static pthread_t main_thread;

struct count_job {
    atomic_int *hits;     /* [n] times each item ran */
    int max_worker;       /* highest valid worker index */
    atomic_int bad;       /* calls with a bad worker index or an empty range */
    atomic_int on_caller; /* calls made on the submitting thread */
};

static void count_items(void *ctx, int64_t begin, int64_t end, int worker)
{
    struct count_job *j = ctx;
    if (worker < 0 || worker > j->max_worker || begin >= end)
        atomic_fetch_add(&j->bad, 1);
    if (pthread_equal(pthread_self(), main_thread))
        atomic_fetch_add(&j->on_caller, 1);
    for (int64_t i = begin; i < end; i++)
        atomic_fetch_add(&j->hits[i], 1);
}

static struct count_job *count_job_new(int64_t n, int max_worker)
{
    struct count_job *j = calloc(1, sizeof *j);
    j->hits = calloc((size_t)(n > 0 ? n : 1), sizeof *j->hits);
    j->max_worker = max_worker;
    return j;
}

/* Number of items whose hit count is not `times`. */
static int64_t count_job_wrong(struct count_job *j, int64_t n, int times)
{
    int64_t wrong = 0;
    for (int64_t i = 0; i < n; i++)
        wrong += atomic_load(&j->hits[i]) != times;
    return wrong;
}

static void count_job_free(struct count_job *j)
{
    free(j->hits);
    free(j);
}

static struct kt_topology *topology(const char *synthetic)
{
    struct kt_topology *t = NULL;
    kt_err err = {0};
    KT_CHECK(kt_topology_create(synthetic, &t, &err) == KT_OK, "%s", err.msg);
    return t;
}

/* A job on p's workers alone: the caller submits and waits, never helps. */
static void run_on_workers(struct kt_pool *p, int64_t n, int64_t grain, kt_pool_fn fn, void *ctx)
{
    kt_pool_submit(p, n, grain, fn, ctx);
    kt_pool_wait(p);
}

static struct kt_pools *pools(const struct kt_topology *t, int per_node, int cap)
{
    struct kt_pools *ps = NULL;
    kt_err err = {0};
    struct kt_pools_config cfg = {.threads_per_node = per_node, .max_threads = cap};
    KT_CHECK(kt_pools_create(t, &cfg, &ps, &err) == KT_OK, "%s", err.msg);
    return ps;
}

static void default_threads_leave_one_core_of_the_first_node_to_the_caller(void)
{
    struct kt_topology *t = topology(SYNTH_2X4);
    if (!t)
        return;
    struct kt_pools *ps = NULL;
    kt_err err = {0};
    KT_CHECK(kt_pools_create(t, NULL, &ps, &err) == KT_OK, "%s", err.msg);
    if (ps) {
        KT_CHECK(kt_pools_count(ps) == 2, "%d pools", kt_pools_count(ps));
        KT_CHECK(kt_pool_n_workers(kt_pools_get(ps, 0)) == 3 && kt_pool_n_workers(kt_pools_get(ps, 1)) == 4,
                 "%d + %d workers", kt_pool_n_workers(kt_pools_get(ps, 0)), kt_pool_n_workers(kt_pools_get(ps, 1)));
        KT_CHECK(kt_pool_node(kt_pools_get(ps, 1)) == 1, "pool 1 on node %d", kt_pool_node(kt_pools_get(ps, 1)));
        KT_CHECK(kt_pool_bind_failures(kt_pools_get(ps, 0)) == 0, "binding tried on a synthetic topology");
        KT_CHECK(kt_pools_get(ps, 2) == NULL, "pool 2 of 2");
        KT_CHECK(kt_pools_caller_helps(ps), "3 workers on node 0's 4 cores: the caller should help");
        kt_pools_destroy(ps);
    }
    ps = pools(t, 0, 4); /* 3 + 4 capped to 4: taken from the largest first */
    if (ps) {
        KT_CHECK(kt_pools_caller_helps(ps), "2 workers on 4 cores: the caller should help");
        KT_CHECK(kt_pools_n_workers(ps) == 4 && kt_pool_n_workers(kt_pools_get(ps, 0)) == 2,
                 "%d workers, %d on pool 0", kt_pools_n_workers(ps), kt_pool_n_workers(kt_pools_get(ps, 0)));
        kt_pools_destroy(ps);
    }
    ps = (struct kt_pools *)1;
    struct kt_pools_config cfg = {.max_threads = 1};
    KT_CHECK(kt_pools_create(t, &cfg, &ps, &err) == KT_ERR_INVALID && ps == NULL, "a cap below one per pool");
    /* one core a node: every core has a worker, so the caller only waits (a
     * helping caller would put two threads on node 0's core) */
    struct kt_topology *t11 = topology("package:2 numa:1 core:1 pu:1");
    if (t11) {
        ps = pools(t11, 0, 0);
        if (ps) {
            KT_CHECK(kt_pools_n_workers(ps) == 2 && !kt_pools_caller_helps(ps),
                     "2 nodes of 1 core: %d workers, the caller helps: %d", kt_pools_n_workers(ps),
                     kt_pools_caller_helps(ps));
            kt_pools_destroy(ps);
        }
        kt_topology_destroy(t11);
    }
    struct kt_topology *one = topology("numa:1 core:1 pu:2");
    if (one) {
        ps = pools(one, 0, 0);
        if (ps) {
            KT_CHECK(kt_pools_n_workers(ps) == 1, "one-core node: %d workers", kt_pools_n_workers(ps));
            kt_pools_destroy(ps);
        }
        kt_topology_destroy(one);
    }
    kt_topology_destroy(t);
}

static void every_item_runs_exactly_once_for_any_threads_and_grain(void)
{
    struct kt_topology *t = topology(SYNTH_2X4);
    if (!t)
        return;
    const int threads[] = {1, 2, 3, 4, 7};
    const int64_t sizes[] = {0, 1, 2, 7, 64, 1000, 4099};
    const int64_t grains[] = {0, 1, 3, 64, 5000};
    for (size_t a = 0; a < sizeof threads / sizeof threads[0]; a++) {
        struct kt_pools *ps = pools(t, threads[a], 0);
        if (!ps)
            continue;
        struct kt_pool *p = kt_pools_get(ps, 1);
        for (size_t b = 0; b < sizeof sizes / sizeof sizes[0]; b++)
            for (size_t c = 0; c < sizeof grains / sizeof grains[0]; c++) {
                struct count_job *j = count_job_new(sizes[b], threads[a] - 1);
                run_on_workers(p, sizes[b], grains[c], count_items, j);
                KT_CHECK(count_job_wrong(j, sizes[b], 1) == 0 && atomic_load(&j->bad) == 0,
                         "%d threads, n %lld, grain %lld: %lld items wrong, %d bad calls", threads[a],
                         (long long)sizes[b], (long long)grains[c], (long long)count_job_wrong(j, sizes[b], 1),
                         atomic_load(&j->bad));
                KT_CHECK(atomic_load(&j->on_caller) == 0, "the caller ran items without helping");
                count_job_free(j);
            }
        kt_pools_destroy(ps);
    }
    kt_topology_destroy(t);
}

static void a_helping_caller_runs_items_as_the_extra_worker(void)
{
    struct kt_topology *t = topology(SYNTH_2X4);
    struct kt_pools *ps = t ? pools(t, 2, 0) : NULL;
    if (ps) {
        struct kt_pool *p = kt_pools_get(ps, 0);
        const int64_t n = 20000;
        int helped = 0;
        for (int round = 0; round < 50; round++) {
            struct count_job *j = count_job_new(n, kt_pool_n_workers(p));
            kt_pool_submit(p, n, 1, count_items, j);
            kt_pool_help(p);
            kt_pool_wait(p);
            KT_CHECK(count_job_wrong(j, n, 1) == 0 && atomic_load(&j->bad) == 0, "round %d: %lld wrong, %d bad",
                     round, (long long)count_job_wrong(j, n, 1), atomic_load(&j->bad));
            helped += atomic_load(&j->on_caller) > 0;
            count_job_free(j);
        }
        /* Submit returns before any worker can claim 20000 items. */
        KT_CHECK(helped > 0, "the caller never ran an item in 50 rounds");
        kt_pools_destroy(ps);
    }
    kt_topology_destroy(t);
}

static void pools_run_jobs_at_once_and_all_finish(void)
{
    struct kt_topology *t = topology("package:3 numa:1 core:3 pu:1");
    struct kt_pools *ps = t ? pools(t, 0, 0) : NULL;
    if (ps) {
        KT_CHECK(kt_pools_count(ps) == 3, "%d pools", kt_pools_count(ps));
        const int64_t n[3] = {5000, 0, 777};
        struct count_job *j[3];
        struct kt_pool_job jobs[3];
        for (int round = 0; round < 200; round++) {
            for (int i = 0; i < 3; i++) {
                j[i] = count_job_new(n[i], kt_pool_n_workers(kt_pools_get(ps, i)) - 1);
                jobs[i] = (struct kt_pool_job){.fn = count_items, .ctx = j[i], .n = n[i], .grain = 1 + round % 17};
            }
            kt_pools_run(ps, jobs);
            for (int i = 0; i < 3; i++) {
                KT_CHECK(count_job_wrong(j[i], n[i], 1) == 0 && atomic_load(&j[i]->bad) == 0,
                         "round %d pool %d: %lld wrong", round, i, (long long)count_job_wrong(j[i], n[i], 1));
                count_job_free(j[i]);
            }
        }
        kt_pools_destroy(ps);
    }
    kt_topology_destroy(t);
}

/* Thousands of tiny jobs back to back on every pool at once: a lost wakeup
 * hangs here (ctest's timeout), a double run or a skipped item shows in the
 * totals. */
static void tiny_jobs_back_to_back_on_all_pools_lose_nothing(void)
{
    struct kt_topology *t = topology(SYNTH_2X4);
    if (!t)
        return;
    const int threads[] = {1, 2, 4, 8};
    const int jobs_per_pool = 3000;
    for (size_t a = 0; a < sizeof threads / sizeof threads[0]; a++) {
        struct kt_pools *ps = pools(t, threads[a], 0);
        if (!ps)
            continue;
        struct count_job *j[2] = {count_job_new(3, threads[a] - 1), count_job_new(3, threads[a] - 1)};
        for (int k = 0; k < jobs_per_pool; k++) {
            int64_t n = 1 + k % 3;
            for (int i = 0; i < 2; i++)
                kt_pool_submit(kt_pools_get(ps, i), n, 1, count_items, j[i]);
            if (k % 7 == 0) /* sometimes wait late, so the next submit waits for it */
                continue;
            for (int i = 0; i < 2; i++)
                kt_pool_wait(kt_pools_get(ps, i));
        }
        for (int i = 0; i < 2; i++) {
            kt_pool_wait(kt_pools_get(ps, i));
            int expect[3] = {jobs_per_pool, jobs_per_pool / 3 * 2, jobs_per_pool / 3};
            for (int item = 0; item < 3; item++)
                KT_CHECK(atomic_load(&j[i]->hits[item]) == expect[item], "%d threads, pool %d item %d: %d of %d",
                         threads[a], i, item, atomic_load(&j[i]->hits[item]), expect[item]);
            KT_CHECK(atomic_load(&j[i]->bad) == 0 && atomic_load(&j[i]->on_caller) == 0, "bad calls");
            count_job_free(j[i]);
        }
        kt_pools_destroy(ps);
    }
    kt_topology_destroy(t);
}

static void sleeping_workers_wake_for_a_job_and_shut_down(void)
{
    struct kt_topology *t = topology(SYNTH_2X4);
    if (!t)
        return;
    for (int round = 0; round < 5; round++) {
        struct kt_pools *ps = pools(t, 3, 0);
        if (!ps)
            continue;
        usleep(5000); /* well past the spin: every worker is asleep */
        struct count_job *j = count_job_new(100, 2);
        run_on_workers(kt_pools_get(ps, round % 2), 100, 1, count_items, j);
        KT_CHECK(count_job_wrong(j, 100, 1) == 0, "round %d: %lld wrong after waking", round,
                 (long long)count_job_wrong(j, 100, 1));
        count_job_free(j);
        usleep(5000);
        kt_pools_destroy(ps); /* must return: sleeping workers see stop */
    }
    /* Destroy with a job still in flight waits for it. */
    struct kt_pools *ps = pools(t, 2, 0);
    if (ps) {
        struct count_job *j = count_job_new(10000, 1);
        kt_pool_submit(kt_pools_get(ps, 0), 10000, 1, count_items, j);
        kt_pools_destroy(ps);
        KT_CHECK(count_job_wrong(j, 10000, 1) == 0, "destroy returned before the job finished");
        count_job_free(j);
    }
    kt_topology_destroy(t);
}

static void create_and_destroy_a_hundred_times(void)
{
    struct kt_topology *t = topology(SYNTH_2X4);
    if (!t)
        return;
    int ok = 0;
    for (int i = 0; i < 100; i++) {
        struct kt_pools *ps = NULL;
        struct kt_pools_config cfg = {.threads_per_node = 1 + i % 4};
        if (kt_pools_create(t, &cfg, &ps, NULL) == KT_OK) {
            ok++;
            if (i % 2) {
                struct count_job *j = count_job_new(10, 4);
                run_on_workers(kt_pools_get(ps, i % 2), 10, 1, count_items, j);
                ok -= count_job_wrong(j, 10, 1) != 0;
                count_job_free(j);
            }
        }
        kt_pools_destroy(ps);
    }
    KT_CHECK(ok == 100, "%d of 100 create/run/destroy rounds succeeded", ok);
    kt_topology_destroy(t);
}

/* ---- a pool without a node (the step's) ---------------------------------------------- */

/* kt_pool_parallel_for: every item once, on a worker index below
 * kt_pool_n_threads (the caller works too), for any size and grain; on a
 * node's pool as on the step's. */
static void parallel_for_runs_every_item_once_with_the_caller_working(void)
{
    struct kt_topology *t = topology(SYNTH_2X4);
    const int threads[] = {1, 2, 3, 8};
    const int64_t sizes[] = {0, 1, 2, 7, 64, 1000, 4099};
    const int64_t grains[] = {0, 1, 3, 64, 5000};
    for (size_t a = 0; a < sizeof threads / sizeof threads[0]; a++) {
        struct kt_pool *own = NULL;
        kt_err err = {0};
        KT_CHECK(kt_pool_create(threads[a], &own, &err) == KT_OK, "%s", err.msg);
        struct kt_pools *ps = t && threads[a] > 1 ? pools(t, threads[a] - 1, 0) : NULL;
        struct kt_pool *each[2] = {own, ps ? kt_pools_get(ps, 1) : NULL};
        if (own) {
            KT_CHECK(kt_pool_n_threads(own) == threads[a] && kt_pool_n_workers(own) == threads[a] - 1,
                     "%d threads, %d workers; asked %d threads", kt_pool_n_threads(own), kt_pool_n_workers(own),
                     threads[a]);
            KT_CHECK(kt_pool_node(own) == -1 && kt_pool_bind_failures(own) == 0, "node %d", kt_pool_node(own));
        }
        for (int k = 0; k < 2; k++)
            for (size_t b = 0; each[k] && b < sizeof sizes / sizeof sizes[0]; b++)
                for (size_t c = 0; c < sizeof grains / sizeof grains[0]; c++) {
                    struct count_job *j = count_job_new(sizes[b], kt_pool_n_threads(each[k]) - 1);
                    kt_pool_parallel_for(each[k], sizes[b], grains[c], count_items, j);
                    KT_CHECK(count_job_wrong(j, sizes[b], 1) == 0 && atomic_load(&j->bad) == 0,
                             "%s, %d threads, n %lld, grain %lld: %lld items wrong, %d bad calls",
                             k ? "node pool" : "own pool", threads[a], (long long)sizes[b], (long long)grains[c],
                             (long long)count_job_wrong(j, sizes[b], 1), atomic_load(&j->bad));
                    count_job_free(j);
                }
        kt_pool_destroy(own);
        kt_pools_destroy(ps);
    }
    kt_topology_destroy(t);
}

/* A job posted before the workers reach their wait must still be seen by
 * them (this deadlocked once). */
static void jobs_posted_at_creation_are_not_lost(void)
{
    for (int round = 0; round < 200; round++) {
        struct kt_pool *p = NULL;
        kt_err err = {0};
        if (kt_pool_create(4, &p, &err) != KT_OK) {
            KT_CHECK(false, "%s", err.msg);
            return;
        }
        struct count_job *j = count_job_new(16, 3);
        run_on_workers(p, 16, 1, count_items, j);
        kt_pool_parallel_for(p, 16, 1, count_items, j);
        KT_CHECK(count_job_wrong(j, 16, 2) == 0, "round %d: %lld items not run twice", round,
                 (long long)count_job_wrong(j, 16, 2));
        count_job_free(j);
        kt_pool_destroy(p);
    }
}

static void bad_thread_counts_are_rejected(void)
{
    struct kt_pool *p = NULL;
    kt_err err = {0};
    KT_CHECK(kt_pool_create(-1, &p, &err) == KT_ERR_INVALID && !p, "-1 threads accepted");
    KT_CHECK(kt_pool_create(0, &p, &err) == KT_OK && p && kt_pool_n_threads(p) >= 1, "0 (online CPUs): %s",
             err.msg);
    kt_pool_destroy(p);
}

/* ---- this machine ---------------------------------------------------------------- */

struct pin_job {
    atomic_int not_pinned; /* calls on a thread allowed on more than one CPU */
    atomic_int calls;
};

static void check_pinned(void *ctx, int64_t begin, int64_t end, int worker)
{
    (void)begin, (void)end, (void)worker;
    struct pin_job *j = ctx;
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) != 0 || CPU_COUNT(&set) != 1)
        atomic_fetch_add(&j->not_pinned, 1);
    atomic_fetch_add(&j->calls, 1);
    usleep(100); /* let every worker take a turn */
}

static void workers_on_this_machine_are_pinned_to_one_pu(void)
{
    struct kt_topology *t = topology(NULL);
    struct kt_pools *ps = t ? pools(t, 0, 0) : NULL;
    if (ps) {
        for (int i = 0; i < kt_pools_count(ps); i++) {
            struct kt_pool *p = kt_pools_get(ps, i);
            KT_CHECK(kt_pool_bind_failures(p) == 0, "pool %d: %d workers could not be bound", i,
                     kt_pool_bind_failures(p));
            struct pin_job j = {0};
            run_on_workers(p, 64, 1, check_pinned, &j);
            KT_CHECK(atomic_load(&j.calls) == 64 && atomic_load(&j.not_pinned) == 0,
                     "pool %d: %d calls, %d on unpinned threads", i, atomic_load(&j.calls),
                     atomic_load(&j.not_pinned));
        }
        cpu_set_t set;
        KT_CHECK(sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) == t->n_pus,
                 "the caller's affinity changed (%d CPUs)", CPU_COUNT(&set));
        kt_pools_destroy(ps);
    }
    kt_topology_destroy(t);
}

/* A pool made without a node (the step's) binds nothing: its workers keep
 * the caller's CPUs. */
static void a_pool_without_a_node_pins_nothing(void)
{
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) != 0 || CPU_COUNT(&set) < 2)
        return; /* one CPU: a worker could not tell */
    struct kt_pool *p = NULL;
    kt_err err = {0};
    KT_CHECK(kt_pool_create(3, &p, &err) == KT_OK, "%s", err.msg);
    if (p) {
        struct pin_job j = {0};
        run_on_workers(p, 64, 1, check_pinned, &j);
        KT_CHECK(atomic_load(&j.calls) == 64 && atomic_load(&j.not_pinned) == 64, "%d calls, %d on pinned threads",
                 atomic_load(&j.calls), 64 - atomic_load(&j.not_pinned));
    }
    kt_pool_destroy(p);
}

struct alloc_job {
    struct kt_numa_mem *mem;
    int node;
    atomic_int failures;
};

static void alloc_node_local(void *ctx, int64_t begin, int64_t end, int worker)
{
    (void)worker;
    struct alloc_job *j = ctx;
    for (int64_t i = begin; i < end; i++) {
        struct kt_numa_buf b;
        if (kt_numa_alloc(j->mem, j->node, (size_t)(1 + i) * 4096, &b, NULL) != KT_OK) {
            atomic_fetch_add(&j->failures, 1);
            continue;
        }
        memset(b.ptr, (int)i, b.bytes);
        kt_numa_free(j->mem, &b);
    }
}

static void workers_allocate_node_local_buffers_at_once(void)
{
    struct kt_topology *t = topology(NULL);
    struct kt_pools *ps = t ? pools(t, 4, 0) : NULL;
    struct kt_numa_mem *m = NULL;
    if (ps && kt_numa_mem_create(t, &m, NULL) == KT_OK) {
        for (int i = 0; i < kt_pools_count(ps); i++) {
            struct alloc_job j = {.mem = m, .node = kt_pool_node(kt_pools_get(ps, i))};
            run_on_workers(kt_pools_get(ps, i), 512, 1, alloc_node_local, &j);
            KT_CHECK(atomic_load(&j.failures) == 0, "%d allocations failed", atomic_load(&j.failures));
            KT_CHECK(kt_numa_mem_bytes(m, j.node) == 0, "node %d holds %llu after all frees", j.node,
                     (unsigned long long)kt_numa_mem_bytes(m, j.node));
            KT_CHECK(kt_numa_mem_peak_bytes(m, j.node) >= 512 * 4096, "node %d peak %llu", j.node,
                     (unsigned long long)kt_numa_mem_peak_bytes(m, j.node));
        }
    }
    kt_numa_mem_destroy(m);
    kt_pools_destroy(ps);
    kt_topology_destroy(t);
}

int main(void)
{
    alarm(300); /* a lost wake-up hangs: fail instead of waiting for ctest's timeout */
    main_thread = pthread_self();
    unsetenv("KT_TOPOLOGY_SYNTHETIC");
    KT_RUN(default_threads_leave_one_core_of_the_first_node_to_the_caller);
    KT_RUN(every_item_runs_exactly_once_for_any_threads_and_grain);
    KT_RUN(a_helping_caller_runs_items_as_the_extra_worker);
    KT_RUN(pools_run_jobs_at_once_and_all_finish);
    KT_RUN(tiny_jobs_back_to_back_on_all_pools_lose_nothing);
    KT_RUN(sleeping_workers_wake_for_a_job_and_shut_down);
    KT_RUN(create_and_destroy_a_hundred_times);
    KT_RUN(parallel_for_runs_every_item_once_with_the_caller_working);
    KT_RUN(jobs_posted_at_creation_are_not_lost);
    KT_RUN(bad_thread_counts_are_rejected);
    KT_RUN(workers_on_this_machine_are_pinned_to_one_pu);
    KT_RUN(a_pool_without_a_node_pins_nothing);
    KT_RUN(workers_allocate_node_local_buffers_at_once);
    return kt_test_finish();
}
