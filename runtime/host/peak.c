/*
 * peak.c - runs the throughput loops of kernels/cpu/peak_loops.h on N
 * threads (see peak.h).  Threads start together behind a barrier and the
 * wall time from release to the last thread's finish counts, as in membw.c.
 * It never executes a loop the kernel layer did not hand out.
 */
#include "peak.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

#include "cpu/peak_loops.h"

static double now_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static kt_peak_loop_fn loop_of(enum kt_peak_kind kind, enum kt_isa isa, const char **method, int *width_bits)
{
    const struct kt_peak_loops *l = kt_peak_loops_for(isa);
    if (!l)
        return NULL;
    if (width_bits)
        *width_bits = l->width_bits;
    if (method)
        *method = kind == KT_PEAK_FMA_F32 ? "vfmadd" : l->dot_int8_name;
    return kind == KT_PEAK_FMA_F32 ? l->fma_f32 : kind == KT_PEAK_DOT_INT8 ? l->dot_int8 : NULL;
}

bool kt_peak_available(enum kt_peak_kind kind, enum kt_isa isa)
{
    return loop_of(kind, isa, NULL, NULL) != NULL;
}

const char *kt_peak_kind_name(enum kt_peak_kind kind)
{
    return kind == KT_PEAK_FMA_F32 ? "fma_f32" : kind == KT_PEAK_DOT_INT8 ? "dot_int8" : "unknown";
}

struct peak_run {
    kt_peak_loop_fn fn;
    uint64_t iters;
    pthread_barrier_t start, done;
    pthread_mutex_t gate_lock;
    pthread_cond_t gate;
    int gate_state;             /* 0: wait, 1: run, -1: give up (a thread could not start) */
    float sink[64];
};

struct peak_thread {
    struct peak_run *run;
    int index;
};

static void *peak_worker(void *arg)
{
    struct peak_thread *t = arg;
    struct peak_run *run = t->run;
    pthread_mutex_lock(&run->gate_lock);
    while (run->gate_state == 0)
        pthread_cond_wait(&run->gate, &run->gate_lock);
    int go = run->gate_state > 0;
    pthread_mutex_unlock(&run->gate_lock);
    if (!go)
        return NULL;
    pthread_barrier_wait(&run->start);
    run->fn(run->iters, &run->sink[t->index % 64]);
    pthread_barrier_wait(&run->done);
    return NULL;
}

/* Wall seconds of one run of fn(iters) on every thread; < 0 if threads could not start. */
static double timed_run(kt_peak_loop_fn fn, uint64_t iters, int threads)
{
    struct peak_run run = {.fn = fn, .iters = iters};
    pthread_t *tid = calloc((size_t)threads, sizeof *tid);
    struct peak_thread *ts = calloc((size_t)threads, sizeof *ts);
    double seconds = -1.0;
    if (!tid || !ts)
        goto done;
    pthread_barrier_init(&run.start, NULL, (unsigned)threads);
    pthread_barrier_init(&run.done, NULL, (unsigned)threads);
    pthread_mutex_init(&run.gate_lock, NULL);
    pthread_cond_init(&run.gate, NULL);
    int started = 1;
    for (; started < threads; started++) {
        ts[started] = (struct peak_thread){&run, started};
        if (pthread_create(&tid[started], NULL, peak_worker, &ts[started]) != 0)
            break;
    }
    pthread_mutex_lock(&run.gate_lock);
    run.gate_state = started == threads ? 1 : -1;
    pthread_cond_broadcast(&run.gate);
    pthread_mutex_unlock(&run.gate_lock);
    if (started == threads) {
        pthread_barrier_wait(&run.start);
        double t0 = now_seconds();
        fn(iters, &run.sink[0]);
        pthread_barrier_wait(&run.done);
        seconds = now_seconds() - t0;
    }
    for (int i = 1; i < started; i++)
        pthread_join(tid[i], NULL);
    pthread_cond_destroy(&run.gate);
    pthread_mutex_destroy(&run.gate_lock);
    pthread_barrier_destroy(&run.start);
    pthread_barrier_destroy(&run.done);
done:
    free(tid);
    free(ts);
    return seconds;
}

static int cmp_double(const void *x, const void *y)
{
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

kt_status kt_peak_measure(enum kt_peak_kind kind, enum kt_isa isa, int threads, double seconds, int repeats,
                          struct kt_peak_result *out, kt_err *err)
{
    if (threads < 1 || threads > 4096 || repeats < 1 || repeats > 100 || !(seconds > 0.0) || seconds > 3600.0)
        return kt_err_set(err, KT_ERR_INVALID, "peak: threads %d / repeats %d / seconds %g out of range", threads,
                          repeats, seconds);
    const char *method = NULL;
    int width_bits = 0;
    kt_peak_loop_fn fn = loop_of(kind, isa, &method, &width_bits);
    if (!fn)
        return kt_err_set(err, KT_ERR_UNSUPPORTED, "peak: no %s loop for %s on this CPU or build",
                          kt_peak_kind_name(kind), kt_isa_name(isa));
    /* Calibrate on one thread: double the rounds until a run takes a measurable time. */
    float sink;
    uint64_t iters = 1024;
    double t = 0.0;
    for (;;) {
        double t0 = now_seconds();
        fn(iters, &sink);
        t = now_seconds() - t0;
        if (t >= 0.005 || iters >= (UINT64_C(1) << 40))
            break;
        iters *= 2;
    }
    double per_run = seconds / repeats;
    double target = (double)iters * per_run / (t > 0.0 ? t : 1e-9);
    iters = target < 1024.0 ? 1024 : (uint64_t)target;
    const double ops = (double)fn(1, &sink) * (double)iters * (double)threads; /* ops of one round x rounds */

    double *secs = calloc((size_t)repeats, sizeof *secs);
    if (!secs)
        return kt_err_set(err, KT_ERR_NOMEM, "peak: out of memory");
    for (int r = 0; r < repeats; r++) {
        secs[r] = timed_run(fn, iters, threads);
        if (secs[r] <= 0.0) {
            free(secs);
            return kt_err_set(err, KT_ERR_NOMEM, "peak: could not start %d threads", threads);
        }
    }
    qsort(secs, (size_t)repeats, sizeof *secs, cmp_double);
    *out = (struct kt_peak_result){
        .kind = kind,
        .isa = isa,
        .width_bits = width_bits,
        .method = method,
        .best_gops = ops / secs[0] * 1e-9,
        .median_gops = ops / secs[repeats / 2] * 1e-9,
        .threads = threads,
        .repeats = repeats,
    };
    free(secs);
    return KT_OK;
}
