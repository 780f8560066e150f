/*
 * threadpool.h - a small pool of worker threads with one operation: run a
 * parallel for over [0, n) and wait for it.
 *
 * The calling thread works too (it is thread 0), so a pool of n_threads
 * starts n_threads - 1 workers.  Work is handed out in chunks of `grain`
 * items from an atomic counter, so uneven items balance themselves.  One
 * parallel_for runs at a time per pool (callers never nest or overlap them).
 * A later issue replaces this with NUMA-pinned pools behind the same call; it
 * must never grow scheduling policy its callers depend on beyond "every item
 * runs exactly once, on some thread, before parallel_for returns".
 */
#ifndef KT_THREADPOOL_H
#define KT_THREADPOOL_H

#include <stdint.h>

#include "status.h"

struct kt_threadpool;

/* Runs items [begin, end) on thread `thread` (0 .. n_threads-1). */
typedef void (*kt_parallel_fn)(void *ctx, int64_t begin, int64_t end, int thread);

/* n_threads >= 1 (0: the number of online CPUs). */
kt_status kt_threadpool_create(int n_threads, struct kt_threadpool **out, kt_err *err);
void kt_threadpool_destroy(struct kt_threadpool *p);

int kt_threadpool_n_threads(const struct kt_threadpool *p);

/* Calls fn on chunks of at most `grain` (>= 1) items covering [0, n) exactly
 * once, spread over the pool, and returns when all have run. */
void kt_threadpool_parallel_for(struct kt_threadpool *p, int64_t n, int64_t grain, kt_parallel_fn fn, void *ctx);

#endif
