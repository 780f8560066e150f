/*
 * pool.h - one worker pool per NUMA node, for the routed experts on CPU.
 *
 * Each pool's workers are pinned one per physical core of its node and
 * allocate from that node's memory (only on a real topology; on a synthetic
 * one nothing is bound).  A job is a parallel for over [0, n): items are
 * claimed in chunks of `grain` from an atomic counter, so uneven items balance
 * themselves.  Several pools run jobs at once (kt_pool_submit on each, then
 * kt_pool_wait on each, or kt_pools_run).  The thread that submits (the
 * attention/control thread) is not a worker: it returns from submit at once
 * and may help with kt_pool_help before it waits.
 *
 * Promises: every item of a job runs exactly once, before kt_pool_wait returns;
 * never a lost wakeup.  One thread at a time submits to a given pool; a job
 * never nests inside another job of the same pool.
 */
#ifndef KT_POOL_H
#define KT_POOL_H

#include <stdbool.h>
#include <stdint.h>

#include "status.h"
#include "topology.h"

struct kt_pool;  /* the workers of one NUMA node */
struct kt_pools; /* one pool per NUMA node that has cores */

/* Runs items [begin, end) on worker `worker`: 0 .. n_workers-1 for the pool's
 * threads, n_workers for a caller inside kt_pool_help (so per-worker scratch
 * needs n_workers + 1 slots). */
typedef void (*kt_pool_fn)(void *ctx, int64_t begin, int64_t end, int worker);

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

int kt_pool_node(const struct kt_pool *p); /* index into t->nodes */
int kt_pool_n_workers(const struct kt_pool *p);
/* Workers that could not be pinned to their core / bound to the node's memory
 * (0 on a synthetic topology, where neither is tried). */
int kt_pool_bind_failures(const struct kt_pool *p);

/* Starts fn over [0, n) in chunks of at most grain (>= 1) and returns at once;
 * a previous job of the pool is waited for first.  n <= 0: nothing to run. */
void kt_pool_submit(struct kt_pool *p, int64_t n, int64_t grain, kt_pool_fn fn, void *ctx);
/* The calling thread runs unclaimed chunks of the current job as worker
 * n_workers until none is left; it still must call kt_pool_wait. */
void kt_pool_help(struct kt_pool *p);
/* Returns when every item of the current job has run (at once if none). */
void kt_pool_wait(struct kt_pool *p);
/* submit + wait. */
void kt_pool_parallel_for(struct kt_pool *p, int64_t n, int64_t grain, kt_pool_fn fn, void *ctx);

/* One job per pool for kt_pools_run; n == 0 leaves that pool idle. */
struct kt_pool_job {
    kt_pool_fn fn;
    void *ctx;
    int64_t n, grain;
};

/* Runs jobs[i] on pool i for i < kt_pools_count, all at once, and waits for all. */
void kt_pools_run(struct kt_pools *ps, const struct kt_pool_job *jobs);

#endif
