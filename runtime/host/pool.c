/*
 * pool.c - worker pools: start-up binding, job hand-off, shutdown; the step's
 * pool (kt_pool_create, never bound) and the NUMA node pools (kt_pools_create)
 * are the same thing, started with or without a node to bind to.
 *
 * A job is published by bumping the pool's generation under its mutex after
 * the job fields are written; idle workers spin on the generation for a short
 * time (a decode step runs hundreds of short jobs and a condition-variable
 * wake costs tens of microseconds), then sleep on `wake`.  `pending` counts
 * workers still inside the job; the one that takes it to zero signals `done`
 * under the mutex, so a waiter that checked `pending` under the mutex cannot
 * miss it.  The submitter only touches the job fields while `pending` is zero,
 * so no worker reads them mid-change.  It must never run an item twice, return
 * from a wait before every item has finished, or bind on a synthetic topology.
 */
#include "pool.h"

#include "cgroup.h"

#include <hwloc.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Loads an idle worker (or a waiting caller) spins on before it sleeps, about
 * 10 µs.  A plain load loop: with `pause` and a 50 µs spin, hand-offs were
 * 2-4x slower on a busy shared VM (pause-loop exits; a spinning thread spends
 * the time slice its working twin then lacks) and kt-bench decode 10% slower. */
#define SPIN_ITERATIONS 20000
#define MAX_WORKERS_PER_POOL 4096

struct worker_arg {
    struct kt_pool *pool;
    int worker;
};

struct kt_pool {
    const struct kt_topology *topo; /* NULL: never bound (kt_pool_create) */
    int node;      /* index into topo->nodes; -1 without a topology */
    int n_workers;
    int n_started; /* threads created, joined at destroy */
    pthread_t *threads;       /* [n_workers] */
    struct worker_arg *args;  /* [n_workers] */
    int *worker_pu;           /* [n_workers] OS PU to pin to (with a topology) */

    pthread_mutex_t mutex;
    pthread_cond_t wake; /* workers wait for a new generation or stop */
    pthread_cond_t done; /* the submitter waits for pending == 0 or for start-up */
    int n_ready;         /* workers past start-up (under mutex) */

    /* The current job: written by the submitter only while pending == 0,
     * before generation is bumped (release); read by workers after they see
     * the new generation (acquire). */
    kt_pool_fn fn;
    void *ctx;
    int64_t n, grain;
    atomic_int_fast64_t next;  /* first unclaimed item */
    atomic_int pending;        /* workers not yet done with the current job */
    atomic_uint generation;    /* bumped once per job */
    atomic_bool stop;
    atomic_int bind_failures;
    bool in_flight;            /* submitter's view: a job awaits kt_pool_wait */
};

struct kt_pools {
    int n_pools;
    struct kt_pool *pools; /* [n_pools] */
    bool caller_helps;     /* the first pool has fewer workers than its node has cores */
};

static void run_items(struct kt_pool *p, int worker)
{
    const int64_t n = p->n, grain = p->grain;
    for (;;) {
        int64_t begin = atomic_fetch_add_explicit(&p->next, grain, memory_order_relaxed);
        if (begin >= n)
            return;
        int64_t end = begin + grain < n ? begin + grain : n;
        p->fn(p->ctx, begin, end, worker);
    }
}

/* Pins the calling worker to its PU and its allocations to the pool's node. */
static void bind_worker(struct kt_pool *p, int worker)
{
    const struct kt_topology *t = p->topo;
    if (!t || t->synthetic)
        return;
    hwloc_topology_t hw = t->hwloc;
    hwloc_bitmap_t cpus = hwloc_bitmap_alloc();
    hwloc_bitmap_t nodes = hwloc_bitmap_alloc();
    bool ok = cpus && nodes;
    if (ok) {
        hwloc_bitmap_only(cpus, (unsigned)p->worker_pu[worker]);
        ok = hwloc_set_cpubind(hw, cpus, HWLOC_CPUBIND_THREAD) == 0;
        hwloc_bitmap_only(nodes, (unsigned)t->nodes[p->node].os_index);
        ok = hwloc_set_membind(hw, nodes, HWLOC_MEMBIND_BIND, HWLOC_MEMBIND_THREAD | HWLOC_MEMBIND_BYNODESET) == 0
             && ok;
    }
    hwloc_bitmap_free(cpus);
    hwloc_bitmap_free(nodes);
    if (!ok)
        atomic_fetch_add(&p->bind_failures, 1);
}

/* Returns once the generation differs from `seen` or the pool is stopping. */
static void wait_for_job(struct kt_pool *p, unsigned seen)
{
    for (int i = 0; i < SPIN_ITERATIONS; i++)
        if (atomic_load_explicit(&p->generation, memory_order_acquire) != seen ||
            atomic_load_explicit(&p->stop, memory_order_relaxed))
            return;
    pthread_mutex_lock(&p->mutex);
    while (atomic_load(&p->generation) == seen && !atomic_load(&p->stop))
        pthread_cond_wait(&p->wake, &p->mutex);
    pthread_mutex_unlock(&p->mutex);
}

static void *worker_main(void *arg_)
{
    struct worker_arg *arg = arg_;
    struct kt_pool *p = arg->pool;
    const int worker = arg->worker;
    bind_worker(p, worker);

    pthread_mutex_lock(&p->mutex);
    unsigned seen = atomic_load(&p->generation);
    p->n_ready++;
    pthread_cond_broadcast(&p->done);
    pthread_mutex_unlock(&p->mutex);

    for (;;) {
        wait_for_job(p, seen);
        if (atomic_load(&p->stop))
            return NULL; /* stop is only set with no job in flight */
        seen = atomic_load_explicit(&p->generation, memory_order_acquire);
        run_items(p, worker);
        if (atomic_fetch_sub_explicit(&p->pending, 1, memory_order_acq_rel) == 1) {
            pthread_mutex_lock(&p->mutex);
            pthread_cond_broadcast(&p->done);
            pthread_mutex_unlock(&p->mutex);
        }
    }
}

/* Stops and joins the started workers; frees what pool_start allocated. */
static void pool_stop(struct kt_pool *p)
{
    if (p->threads) {
        kt_pool_wait(p);
        pthread_mutex_lock(&p->mutex);
        atomic_store(&p->stop, true);
        pthread_cond_broadcast(&p->wake);
        pthread_mutex_unlock(&p->mutex);
        for (int i = 0; i < p->n_started; i++)
            pthread_join(p->threads[i], NULL);
        pthread_mutex_destroy(&p->mutex);
        pthread_cond_destroy(&p->wake);
        pthread_cond_destroy(&p->done);
    }
    free(p->threads);
    free(p->args);
    free(p->worker_pu);
}

/* Starts n_workers (>= 0) on node `node` of t, pinned from core `first_core`
 * on (t NULL: node -1, never bound), and waits until all are past start-up
 * (bound and listening). */
static kt_status pool_start(struct kt_pool *p, const struct kt_topology *t, int node, int n_workers,
                            int first_core, kt_err *err)
{
    p->topo = t;
    p->node = node;
    p->n_workers = n_workers;
    p->threads = calloc((size_t)n_workers + 1, sizeof *p->threads);
    p->args = calloc((size_t)n_workers + 1, sizeof *p->args);
    p->worker_pu = calloc((size_t)n_workers + 1, sizeof *p->worker_pu);
    if (!p->threads || !p->args || !p->worker_pu) {
        free(p->threads);
        p->threads = NULL; /* nothing initialised yet for pool_stop to undo */
        return kt_err_set(err, KT_ERR_NOMEM, "pool: out of memory");
    }
    pthread_mutex_init(&p->mutex, NULL);
    pthread_cond_init(&p->wake, NULL);
    pthread_cond_init(&p->done, NULL);
    atomic_init(&p->next, 0);
    atomic_init(&p->pending, 0);
    atomic_init(&p->generation, 0);
    atomic_init(&p->stop, false);
    atomic_init(&p->bind_failures, 0);

    const struct kt_topo_node *tn = t ? &t->nodes[node] : NULL;
    for (int w = 0; w < n_workers; w++) {
        p->worker_pu[w] = tn ? tn->core_pu[(first_core + w) % tn->n_cores] : -1;
        p->args[w] = (struct worker_arg){.pool = p, .worker = w};
        if (pthread_create(&p->threads[w], NULL, worker_main, &p->args[w]) != 0)
            return kt_err_set(err, KT_ERR_NOMEM, "pool: could not start worker %d of %d on node %d", w,
                              n_workers, tn ? tn->os_index : -1);
        p->n_started++;
    }
    pthread_mutex_lock(&p->mutex);
    while (p->n_ready < n_workers)
        pthread_cond_wait(&p->done, &p->mutex);
    pthread_mutex_unlock(&p->mutex);
    return KT_OK;
}

kt_status kt_pool_create(int n_threads, struct kt_pool **out, kt_err *err)
{
    *out = NULL;
    if (n_threads == 0) {
        struct kt_cpu_budget cpus;
        kt_status st = kt_cpu_budget_read(NULL, &cpus, err);
        if (st != KT_OK)
            return st;
        n_threads = cpus.cpus < MAX_WORKERS_PER_POOL ? cpus.cpus : MAX_WORKERS_PER_POOL;
    }
    if (n_threads < 1 || n_threads > MAX_WORKERS_PER_POOL)
        return kt_err_set(err, KT_ERR_INVALID, "pool: %d threads (1 .. %d)", n_threads, MAX_WORKERS_PER_POOL);
    struct kt_pool *p = calloc(1, sizeof *p);
    if (!p)
        return kt_err_set(err, KT_ERR_NOMEM, "pool: out of memory");
    kt_status st = pool_start(p, NULL, -1, n_threads - 1, 0, err);
    if (st != KT_OK) {
        kt_pool_destroy(p);
        return st;
    }
    *out = p;
    return KT_OK;
}

void kt_pool_destroy(struct kt_pool *p)
{
    if (!p)
        return;
    pool_stop(p);
    free(p);
}

kt_status kt_pools_create(const struct kt_topology *t, const struct kt_pools_config *cfg, struct kt_pools **out,
                          kt_err *err)
{
    *out = NULL;
    struct kt_pools_config c = cfg ? *cfg : (struct kt_pools_config){0};
    if (c.threads_per_node < 0 || c.threads_per_node > MAX_WORKERS_PER_POOL || c.max_threads < 0)
        return kt_err_set(err, KT_ERR_INVALID, "pools: %d threads per node (0 .. %d), cap %d (>= 0)",
                          c.threads_per_node, MAX_WORKERS_PER_POOL, c.max_threads);

    kt_status st = KT_OK;
    int *node_of_pool = NULL, *workers = NULL;
    struct kt_pools *ps = calloc(1, sizeof *ps);
    if (!ps)
        return kt_err_set(err, KT_ERR_NOMEM, "pools: out of memory");
    node_of_pool = calloc((size_t)t->n_nodes, sizeof *node_of_pool);
    workers = calloc((size_t)t->n_nodes, sizeof *workers);
    if (!node_of_pool || !workers) {
        st = kt_err_set(err, KT_ERR_NOMEM, "pools: out of memory");
        goto fail;
    }
    int n_pools = 0, total = 0;
    for (int i = 0; i < t->n_nodes; i++) {
        int cores = t->nodes[i].n_cores;
        if (cores == 0)
            continue; /* memory-only node (CXL, HBM): no pool */
        int reserved = n_pools == 0 && cores > 1 ? 1 : 0;
        workers[n_pools] = c.threads_per_node ? c.threads_per_node : cores - reserved;
        node_of_pool[n_pools++] = i;
        total += workers[n_pools - 1];
    }
    if (c.max_threads && c.max_threads < n_pools) {
        st = kt_err_set(err, KT_ERR_INVALID, "pools: cap of %d threads is below one per node (%d nodes with cores)",
                        c.max_threads, n_pools);
        goto fail;
    }
    while (c.max_threads && total > c.max_threads) {
        int largest = 0;
        for (int i = 1; i < n_pools; i++)
            if (workers[i] > workers[largest])
                largest = i;
        workers[largest]--;
        total--;
    }

    ps->caller_helps = n_pools > 0 && workers[0] < t->nodes[node_of_pool[0]].n_cores;
    ps->pools = calloc((size_t)n_pools, sizeof *ps->pools);
    if (!ps->pools) {
        st = kt_err_set(err, KT_ERR_NOMEM, "pools: out of memory");
        goto fail;
    }
    for (int i = 0; i < n_pools; i++) {
        int first_core = i == 0 && t->nodes[node_of_pool[i]].n_cores > 1 ? 1 : 0;
        ps->n_pools++; /* counted before start, so fail: undoes a partial start */
        st = pool_start(&ps->pools[i], t, node_of_pool[i], workers[i], first_core, err);
        if (st != KT_OK)
            goto fail;
    }
    free(node_of_pool);
    free(workers);
    *out = ps;
    return KT_OK;
fail:
    free(node_of_pool);
    free(workers);
    kt_pools_destroy(ps);
    return st;
}

void kt_pools_destroy(struct kt_pools *ps)
{
    if (!ps)
        return;
    for (int i = 0; i < ps->n_pools; i++)
        pool_stop(&ps->pools[i]);
    free(ps->pools);
    free(ps);
}

int kt_pools_count(const struct kt_pools *ps)
{
    return ps->n_pools;
}

struct kt_pool *kt_pools_get(struct kt_pools *ps, int i)
{
    return i >= 0 && i < ps->n_pools ? &ps->pools[i] : NULL;
}

int kt_pools_n_workers(const struct kt_pools *ps)
{
    int total = 0;
    for (int i = 0; i < ps->n_pools; i++)
        total += ps->pools[i].n_workers;
    return total;
}

bool kt_pools_caller_helps(const struct kt_pools *ps)
{
    return ps->caller_helps;
}

int kt_pool_node(const struct kt_pool *p)
{
    return p->node;
}

int kt_pool_n_workers(const struct kt_pool *p)
{
    return p->n_workers;
}

int kt_pool_n_threads(const struct kt_pool *p)
{
    return p->n_workers + 1;
}

int kt_pool_bind_failures(const struct kt_pool *p)
{
    return atomic_load(&p->bind_failures);
}

void kt_pool_submit(struct kt_pool *p, int64_t n, int64_t grain, kt_pool_fn fn, void *ctx)
{
    kt_pool_wait(p);
    if (n <= 0)
        return;
    pthread_mutex_lock(&p->mutex);
    p->fn = fn;
    p->ctx = ctx;
    p->n = n;
    p->grain = grain < 1 ? 1 : grain;
    atomic_store_explicit(&p->next, 0, memory_order_relaxed);
    atomic_store_explicit(&p->pending, p->n_workers, memory_order_relaxed);
    atomic_fetch_add_explicit(&p->generation, 1, memory_order_release);
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mutex);
    p->in_flight = true;
}

void kt_pool_help(struct kt_pool *p)
{
    if (p->in_flight)
        run_items(p, p->n_workers);
}

void kt_pool_wait(struct kt_pool *p)
{
    if (!p->in_flight)
        return;
    for (int i = 0; i < SPIN_ITERATIONS && atomic_load_explicit(&p->pending, memory_order_acquire) != 0; i++)
        continue;
    if (atomic_load_explicit(&p->pending, memory_order_acquire) != 0) {
        pthread_mutex_lock(&p->mutex);
        while (atomic_load(&p->pending) != 0)
            pthread_cond_wait(&p->done, &p->mutex);
        pthread_mutex_unlock(&p->mutex);
    }
    p->in_flight = false;
}

void kt_pool_parallel_for(struct kt_pool *p, int64_t n, int64_t grain, kt_pool_fn fn, void *ctx)
{
    if (n <= 0)
        return;
    if (p->n_workers == 0 || n <= grain) {
        kt_pool_wait(p);
        fn(ctx, 0, n, p->n_workers);
        return;
    }
    kt_pool_submit(p, n, grain, fn, ctx);
    kt_pool_help(p);
    kt_pool_wait(p);
}

void kt_pools_run(struct kt_pools *ps, const struct kt_pool_job *jobs)
{
    for (int i = 0; i < ps->n_pools; i++)
        kt_pool_submit(&ps->pools[i], jobs[i].n, jobs[i].grain, jobs[i].fn, jobs[i].ctx);
    for (int i = 0; i < ps->n_pools; i++)
        kt_pool_wait(&ps->pools[i]);
}
