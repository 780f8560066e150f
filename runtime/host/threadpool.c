/*
 * threadpool.c - the worker pool behind kt_threadpool_parallel_for.
 *
 * A job is published by bumping a generation counter under the mutex; idle
 * workers spin on it briefly (a decode step runs hundreds of short parallel
 * regions, and a condition-variable wake costs tens of microseconds) and then
 * sleep on the condition variable.  Items are claimed in chunks from an
 * atomic counter; the last worker to finish wakes the caller.  It must never
 * run a job's items twice or return before every item has finished.
 */
#include "threadpool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Spins of an idle worker (or the waiting caller) before it sleeps: ~50 µs. */
#define SPIN_ITERATIONS 20000

struct kt_threadpool {
    int n_threads;              /* caller included */
    pthread_t *workers;         /* [n_threads - 1] */
    pthread_mutex_t mutex;
    pthread_cond_t wake;        /* workers wait for a new generation */
    pthread_cond_t done;        /* the caller waits for pending == 0 */

    /* The current job; written by the caller before generation is bumped. */
    kt_parallel_fn fn;
    void *ctx;
    int64_t n, grain;
    atomic_int_fast64_t next;   /* first unclaimed item */
    atomic_int pending;         /* workers still inside the job */
    atomic_uint generation;     /* bumped once per job */
    bool stop;
};

struct worker_arg {
    struct kt_threadpool *pool;
    int thread;
};

static void run_items(struct kt_threadpool *p, int thread)
{
    for (;;) {
        int64_t begin = atomic_fetch_add(&p->next, p->grain);
        if (begin >= p->n)
            return;
        int64_t end = begin + p->grain < p->n ? begin + p->grain : p->n;
        p->fn(p->ctx, begin, end, thread);
    }
}

static void *worker_main(void *arg_)
{
    struct worker_arg *arg = arg_;
    struct kt_threadpool *p = arg->pool;
    const int thread = arg->thread;
    free(arg);
    unsigned seen = 0; /* the generation at creation: a job posted before this thread runs still counts */
    for (;;) {
        /* Wait for a new generation: spin a little, then sleep. */
        int spins = 0;
        while (atomic_load_explicit(&p->generation, memory_order_acquire) == seen && spins < SPIN_ITERATIONS)
            spins++;
        pthread_mutex_lock(&p->mutex);
        while (atomic_load(&p->generation) == seen && !p->stop)
            pthread_cond_wait(&p->wake, &p->mutex);
        bool stop = p->stop;
        seen = atomic_load(&p->generation);
        pthread_mutex_unlock(&p->mutex);
        if (stop)
            return NULL;

        run_items(p, thread);
        if (atomic_fetch_sub(&p->pending, 1) == 1) {
            pthread_mutex_lock(&p->mutex);
            pthread_cond_signal(&p->done);
            pthread_mutex_unlock(&p->mutex);
        }
    }
}

kt_status kt_threadpool_create(int n_threads, struct kt_threadpool **out, kt_err *err)
{
    *out = NULL;
    if (n_threads == 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        n_threads = n > 0 ? (int)n : 1;
    }
    if (n_threads < 1 || n_threads > 4096)
        return kt_err_set(err, KT_ERR_INVALID, "thread pool: %d threads (1 .. 4096)", n_threads);

    struct kt_threadpool *p = calloc(1, sizeof *p);
    if (!p)
        return kt_err_set(err, KT_ERR_NOMEM, "thread pool: out of memory");
    p->n_threads = n_threads;
    pthread_mutex_init(&p->mutex, NULL);
    pthread_cond_init(&p->wake, NULL);
    pthread_cond_init(&p->done, NULL);
    atomic_init(&p->next, 0);
    atomic_init(&p->pending, 0);
    atomic_init(&p->generation, 0);
    p->workers = calloc((size_t)n_threads, sizeof *p->workers);
    if (!p->workers) {
        kt_threadpool_destroy(p);
        return kt_err_set(err, KT_ERR_NOMEM, "thread pool: out of memory");
    }
    for (int i = 1; i < n_threads; i++) {
        struct worker_arg *arg = malloc(sizeof *arg);
        if (arg)
            *arg = (struct worker_arg){.pool = p, .thread = i};
        if (!arg || pthread_create(&p->workers[i - 1], NULL, worker_main, arg) != 0) {
            free(arg);
            p->n_threads = i; /* destroy joins the i - 1 started so far */
            kt_threadpool_destroy(p);
            return kt_err_set(err, KT_ERR_NOMEM, "thread pool: could not start thread %d of %d", i, n_threads);
        }
    }
    *out = p;
    return KT_OK;
}

void kt_threadpool_destroy(struct kt_threadpool *p)
{
    if (!p)
        return;
    if (p->workers) {
        pthread_mutex_lock(&p->mutex);
        p->stop = true;
        pthread_cond_broadcast(&p->wake);
        pthread_mutex_unlock(&p->mutex);
        for (int i = 1; i < p->n_threads; i++)
            pthread_join(p->workers[i - 1], NULL);
    }
    pthread_mutex_destroy(&p->mutex);
    pthread_cond_destroy(&p->wake);
    pthread_cond_destroy(&p->done);
    free(p->workers);
    free(p);
}

int kt_threadpool_n_threads(const struct kt_threadpool *p)
{
    return p->n_threads;
}

void kt_threadpool_parallel_for(struct kt_threadpool *p, int64_t n, int64_t grain, kt_parallel_fn fn, void *ctx)
{
    if (n <= 0)
        return;
    if (grain < 1)
        grain = 1;
    /* One chunk, or no workers: no hand-off is worth its latency. */
    if (p->n_threads == 1 || n <= grain) {
        fn(ctx, 0, n, 0);
        return;
    }

    pthread_mutex_lock(&p->mutex);
    p->fn = fn;
    p->ctx = ctx;
    p->n = n;
    p->grain = grain;
    atomic_store(&p->next, 0);
    atomic_store(&p->pending, p->n_threads - 1);
    atomic_fetch_add_explicit(&p->generation, 1, memory_order_release);
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mutex);

    run_items(p, 0);

    int spins = 0;
    while (atomic_load_explicit(&p->pending, memory_order_acquire) != 0 && spins < SPIN_ITERATIONS)
        spins++;
    pthread_mutex_lock(&p->mutex);
    while (atomic_load(&p->pending) != 0)
        pthread_cond_wait(&p->done, &p->mutex);
    pthread_mutex_unlock(&p->mutex);
}
