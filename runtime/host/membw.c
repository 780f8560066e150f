/*
 * membw.c - STREAM triad on N threads (see membw.h).  Each thread first
 * touches its own slice so pages land on its node, then all threads run the
 * triad between barriers; the slowest thread's time counts.  Must never be
 * used as a timed assertion in tests: it measures, it does not judge.
 */
#include "membw.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct triad_shared {
    double *a, *b, *c;    /* [n] each */
    size_t n;
    int threads;
    int repeats;
    pthread_barrier_t barrier;
    pthread_mutex_t gate_lock;
    pthread_cond_t gate;
    int gate_state;       /* 0: wait, 1: run, -1: give up (a thread could not start) */
    double *seconds;      /* [repeats]: wall time of each repeat (thread 0 measures) */
};

struct triad_thread {
    struct triad_shared *sh;
    int index;
};

static double now_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void *triad_worker(void *arg)
{
    struct triad_thread *t = arg;
    struct triad_shared *sh = t->sh;
    pthread_mutex_lock(&sh->gate_lock);
    while (sh->gate_state == 0)
        pthread_cond_wait(&sh->gate, &sh->gate_lock);
    int run = sh->gate_state > 0;
    pthread_mutex_unlock(&sh->gate_lock);
    if (!run)
        return NULL;
    size_t lo = sh->n * (size_t)t->index / (size_t)sh->threads;
    size_t hi = sh->n * (size_t)(t->index + 1) / (size_t)sh->threads;
    double *a = sh->a, *b = sh->b, *c = sh->c;
    for (size_t i = lo; i < hi; i++) {  /* first touch: pages near this thread */
        a[i] = 0.0;
        b[i] = 1.0;
        c[i] = 2.0;
    }
    const double s = 3.0;
    for (int r = 0; r < sh->repeats; r++) {
        pthread_barrier_wait(&sh->barrier);
        double t0 = t->index == 0 ? now_seconds() : 0.0;
        for (size_t i = lo; i < hi; i++)
            a[i] = b[i] + s * c[i];
        pthread_barrier_wait(&sh->barrier);
        if (t->index == 0)
            sh->seconds[r] = now_seconds() - t0;
    }
    return NULL;
}

static int cmp_double(const void *x, const void *y)
{
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

kt_status kt_stream_triad(size_t array_bytes, int threads, int repeats, struct kt_triad_result *out, kt_err *err)
{
    if (threads < 1 || threads > 4096 || repeats < 1 || repeats > 1000 || !out)
        return kt_err_set(err, KT_ERR_INVALID, "stream triad: threads %d / repeats %d out of range", threads,
                          repeats);
    if (array_bytes == 0)
        array_bytes = (size_t)256 << 20;
    struct triad_shared sh = {.n = array_bytes / sizeof(double), .threads = threads, .repeats = repeats};
    if (sh.n < (size_t)threads)
        return kt_err_set(err, KT_ERR_INVALID, "stream triad: %zu-byte arrays are too small", array_bytes);
    kt_status st = KT_OK;
    struct triad_thread *ts = calloc((size_t)threads, sizeof *ts);
    pthread_t *tid = calloc((size_t)threads, sizeof *tid);
    sh.seconds = calloc((size_t)repeats, sizeof *sh.seconds);
    sh.a = aligned_alloc(64, sh.n * sizeof(double));
    sh.b = aligned_alloc(64, sh.n * sizeof(double));
    sh.c = aligned_alloc(64, sh.n * sizeof(double));
    if (!ts || !tid || !sh.seconds || !sh.a || !sh.b || !sh.c) {
        st = kt_err_set(err, KT_ERR_NOMEM, "stream triad: cannot allocate 3 x %zu bytes", array_bytes);
        goto done;
    }
    if (pthread_barrier_init(&sh.barrier, NULL, (unsigned)threads) != 0) {
        st = kt_err_set(err, KT_ERR_NOMEM, "stream triad: cannot create a barrier");
        goto done;
    }
    pthread_mutex_init(&sh.gate_lock, NULL);
    pthread_cond_init(&sh.gate, NULL);
    int started = 1;
    for (; started < threads; started++) {
        ts[started] = (struct triad_thread){.sh = &sh, .index = started};
        if (pthread_create(&tid[started], NULL, triad_worker, &ts[started]) != 0)
            break;
    }
    pthread_mutex_lock(&sh.gate_lock);
    sh.gate_state = started == threads ? 1 : -1;
    pthread_cond_broadcast(&sh.gate);
    pthread_mutex_unlock(&sh.gate_lock);
    ts[0] = (struct triad_thread){.sh = &sh, .index = 0};
    if (started == threads)
        triad_worker(&ts[0]);
    for (int i = 1; i < started; i++)
        pthread_join(tid[i], NULL);
    pthread_cond_destroy(&sh.gate);
    pthread_mutex_destroy(&sh.gate_lock);
    if (started < threads) {
        pthread_barrier_destroy(&sh.barrier);
        st = kt_err_set(err, KT_ERR_NOMEM, "stream triad: could only start %d of %d threads", started, threads);
        goto done;
    }
    pthread_barrier_destroy(&sh.barrier);

    qsort(sh.seconds, (size_t)repeats, sizeof *sh.seconds, cmp_double);
    double bytes = 3.0 * (double)sh.n * sizeof(double);
    *out = (struct kt_triad_result){
        .best_gbps = bytes / sh.seconds[0] * 1e-9,
        .median_gbps = bytes / sh.seconds[repeats / 2] * 1e-9,
        .array_bytes = sh.n * sizeof(double),
        .threads = threads,
        .repeats = repeats,
    };
done:
    free(sh.a), free(sh.b), free(sh.c);
    free(sh.seconds), free(ts), free(tid);
    return st;
}
