/*
 * pool.h - kt's one worker-pool mechanism: a pool of threads that runs a
 * parallel for over [0, n), and one such pool per NUMA node.
 *
 * A job is a parallel for: items are claimed in chunks of `grain` from an
 * atomic counter, so uneven items balance themselves.  A job can be run in
 * one call (kt_pool_parallel_for: the caller works too), or submitted to
 * several pools at once (kt_pool_submit on each, kt_pool_help on one, then
 * kt_pool_wait on each): the submitting thread is not a worker, it returns
 * from submit at once and may help before it waits.
 *
 * A node pool's workers are pinned one per physical core of its node and
 * allocate from that node's memory, only on a real topology (on a synthetic
 * one nothing is bound); a pool made by kt_pool_create is never bound.
 *
 * Promises: every item of a job runs exactly once, before kt_pool_wait (or
 * kt_pool_parallel_for) returns; never a lost wakeup.  One thread at a time
 * submits to a given pool; a job never nests inside another job of the same
 * pool.  No scheduling policy beyond that: callers never depend on which
 * worker runs an item.
 */
#ifndef KT_POOL_H
#define KT_POOL_H

#include <stdbool.h>
#include <stdint.h>

#include "status.h"
#include "topology.h"

struct kt_pool;  /* a set of workers */
struct kt_pools; /* one pool per NUMA node that has cores */

/* Runs items [begin, end) on worker `worker`: 0 .. n_workers-1 for the pool's
 * threads, n_workers for a caller that helps (kt_pool_help,
 * kt_pool_parallel_for), so per-worker scratch needs kt_pool_n_threads slots. */
typedef void (*kt_pool_fn)(void *ctx, int64_t begin, int64_t end, int worker);

/* A pool for n_threads threads in all, the caller of kt_pool_parallel_for
 * included (n_threads - 1 workers; 0: the CPUs this process may use, its
 * cgroup's limits included: kt_cpu_budget_read), not bound to any core or
 * node (kt_pool_node is -1). */
kt_status kt_pool_create(int n_threads, struct kt_pool **out, kt_err *err);
/* Waits for a submitted job, then stops and joins the workers. */
void kt_pool_destroy(struct kt_pool *p);

int kt_pool_node(const struct kt_pool *p); /* index into t->nodes; -1: not a node's pool */
int kt_pool_n_workers(const struct kt_pool *p);
/* n_workers + 1: the threads that may run a job's items, a helping caller included. */
int kt_pool_n_threads(const struct kt_pool *p);
/* Workers that could not be pinned to their core / bound to the node's memory
 * (0 on a synthetic topology, where neither is tried). */
int kt_pool_bind_failures(const struct kt_pool *p);

/* Starts fn over [0, n) in chunks of at most grain (< 1: 1) and returns at
 * once; a previous job of the pool is waited for first.  n <= 0: nothing to run. */
void kt_pool_submit(struct kt_pool *p, int64_t n, int64_t grain, kt_pool_fn fn, void *ctx);
/* The calling thread runs unclaimed chunks of the current job as worker
 * n_workers until none is left; it still must call kt_pool_wait. */
void kt_pool_help(struct kt_pool *p);
/* Returns when every item of the current job has run (at once if none). */
void kt_pool_wait(struct kt_pool *p);
/* submit, help, wait; a job of one chunk, or a pool without workers, runs on
 * the caller alone (no hand-off is worth its latency). */
void kt_pool_parallel_for(struct kt_pool *p, int64_t n, int64_t grain, kt_pool_fn fn, void *ctx);

struct kt_pools_config {
    /* Workers per node; 0: one per physical core of the node, minus one core on
     * the first node, left to the control thread, when that node has more than
     * one core.  Workers are pinned to cores in order, starting after that
     * reserved core; more workers than cores share cores round-robin. */
    int threads_per_node;
    /* Cap on workers over all pools (0: none), taken from the largest pools
     * first; every pool keeps at least one worker. */
    int max_threads;
};

/* The pools of topology t, which must outlive them.  cfg may be NULL (defaults). */
kt_status kt_pools_create(const struct kt_topology *t, const struct kt_pools_config *cfg, struct kt_pools **out,
                          kt_err *err);
/* Waits for submitted jobs, then stops and joins every worker. */
void kt_pools_destroy(struct kt_pools *ps);

int kt_pools_count(const struct kt_pools *ps);
struct kt_pool *kt_pools_get(struct kt_pools *ps, int i);
int kt_pools_n_workers(const struct kt_pools *ps); /* total */
/* Whether the thread that submits to the pools should help the first one
 * (kt_pool_help) while the others run: true when the first pool left a core of
 * its node to that thread (fewer workers than cores).  When every core of the
 * node already has a worker - one core per node, or a thread cap that took
 * workers from larger pools - helping would put two threads on one core and
 * make the first node slower than the others, so the caller only waits. */
bool kt_pools_caller_helps(const struct kt_pools *ps);

/* One job per pool for kt_pools_run; n == 0 leaves that pool idle. */
struct kt_pool_job {
    kt_pool_fn fn;
    void *ctx;
    int64_t n, grain;
};

/* Runs jobs[i] on pool i for i < kt_pools_count, all at once (the caller does
 * not help), and waits for all. */
void kt_pools_run(struct kt_pools *ps, const struct kt_pool_job *jobs);

#endif
