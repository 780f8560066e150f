/*
 * transport_mpi.c - transport.h over MPI (built with KT_MPI), and a job of
 * one process when no MPI launcher started this one.  Errors come back as
 * codes (MPI_ERRORS_RETURN on MPI_COMM_WORLD), never as MPI's own abort.
 */
#include "transport.h"

#include <assert.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <mpi.h>

static_assert(sizeof(MPI_Request) <= sizeof(((struct kt_transport_req *)0)->impl), "MPI_Request fits the request");

struct kt_transport {
    bool mpi;
    int rank, size;
    char host[256];
};

/* The environment an MPI launcher gives its processes (OpenMPI, PMIx, MPICH's hydra / PMI). */
static bool launched_by_mpi(void)
{
    static const char *const vars[] = {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_SIZE", "PMI_RANK"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++)
        if (getenv(vars[i]))
            return true;
    return false;
}

static kt_status mpi_error(kt_err *err, int code, const char *what)
{
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(code, text, &len) != MPI_SUCCESS)
        snprintf(text, sizeof text, "MPI error %d", code);
    return kt_err_set(err, KT_ERR_IO, "%s: %s", what, text);
}

kt_status kt_transport_init(int *argc, char ***argv, struct kt_transport **out, kt_err *err)
{
    *out = NULL;
    struct kt_transport *t = calloc(1, sizeof *t);
    if (!t)
        return kt_err_set(err, KT_ERR_NOMEM, "transport: out of memory");
    t->size = 1;
    if (gethostname(t->host, sizeof t->host - 1) != 0)
        snprintf(t->host, sizeof t->host, "?");
    if (!launched_by_mpi()) {
        *out = t;
        return KT_OK;
    }
    int provided = 0;
    int rc = MPI_Init_thread(argc, argv, MPI_THREAD_SERIALIZED, &provided);
    if (rc != MPI_SUCCESS) {
        free(t);
        return kt_err_set(err, KT_ERR_IO, "MPI_Init_thread failed (%d)", rc);
    }
    t->mpi = true;
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    if (provided < MPI_THREAD_SERIALIZED) {
        MPI_Finalize();
        free(t);
        return kt_err_set(err, KT_ERR_UNSUPPORTED, "MPI gives thread level %d, kt needs MPI_THREAD_SERIALIZED (%d): "
                          "the scheduler thread, not main, sends the steps", provided, MPI_THREAD_SERIALIZED);
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &t->rank);
    MPI_Comm_size(MPI_COMM_WORLD, &t->size);
    *out = t;
    return KT_OK;
}

void kt_transport_finalize(struct kt_transport *t)
{
    if (!t)
        return;
    if (t->mpi)
        MPI_Finalize();
    free(t);
}

void kt_transport_abort(struct kt_transport *t, int code)
{
    if (t && t->mpi)
        MPI_Abort(MPI_COMM_WORLD, code);
    _exit(code);
}

int kt_transport_rank(const struct kt_transport *t)
{
    return t->rank;
}

int kt_transport_size(const struct kt_transport *t)
{
    return t->size;
}

bool kt_transport_is_mpi(const struct kt_transport *t)
{
    return t->mpi;
}

const char *kt_transport_host(const struct kt_transport *t)
{
    return t->host;
}

static kt_status check_peer(const struct kt_transport *t, int peer, size_t bytes, kt_err *err)
{
    if (!t->mpi || peer < 0 || peer >= t->size || peer == t->rank)
        return kt_err_set(err, KT_ERR_INVALID, "transport: rank %d of %d cannot talk to rank %d", t->rank, t->size,
                          peer);
    if (bytes > (size_t)INT32_MAX)
        return kt_err_set(err, KT_ERR_INVALID, "transport: a message of %zu bytes is over MPI's int count", bytes);
    return KT_OK;
}

kt_status kt_transport_isend(struct kt_transport *t, int to, const void *buf, size_t bytes,
                             struct kt_transport_req *req, kt_err *err)
{
    kt_status st = check_peer(t, to, bytes, err);
    if (st != KT_OK)
        return st;
    MPI_Request r;
    int rc = MPI_Isend(buf, (int)bytes, MPI_BYTE, to, 0, MPI_COMM_WORLD, &r);
    if (rc != MPI_SUCCESS)
        return mpi_error(err, rc, "MPI_Isend");
    memcpy(req->impl, &r, sizeof r);
    req->active = true;
    return KT_OK;
}

kt_status kt_transport_irecv(struct kt_transport *t, int from, void *buf, size_t cap, struct kt_transport_req *req,
                             kt_err *err)
{
    kt_status st = check_peer(t, from, cap, err);
    if (st != KT_OK)
        return st;
    MPI_Request r;
    int rc = MPI_Irecv(buf, (int)cap, MPI_BYTE, from, 0, MPI_COMM_WORLD, &r);
    if (rc != MPI_SUCCESS)
        return mpi_error(err, rc, "MPI_Irecv");
    memcpy(req->impl, &r, sizeof r);
    req->active = true;
    return KT_OK;
}

/* The longest sleep between two polls of a wait: within its first second, after it. */
#define SLEEP_STEP_NS 100000L
#define SLEEP_IDLE_NS 1000000L

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

kt_status kt_transport_wait(struct kt_transport *t, struct kt_transport_req *req, int64_t timeout_ms, size_t *bytes,
                            bool *timed_out, kt_err *err)
{
    (void)t;
    if (timed_out)
        *timed_out = false;
    if (!req->active)
        return KT_OK;
    if (req->failed) {
        req->active = req->failed = false;
        return kt_err_set(err, KT_ERR_IO, "a message to or from a peer rank failed");
    }
    MPI_Request r;
    memcpy(&r, req->impl, sizeof r);
    const int64_t start = now_ms(), deadline = timeout_ms < 0 ? INT64_MAX : start + timeout_ms;
    /* A few tight polls (a step's answer is often there), then sleeps from 10 us, doubling up
     * to SLEEP_STEP_NS for the first second: an answer is seen when a sleep ends, so with 1 ms
     * sleeps each hop of a step came ~0.5 ms late on average (1.2 ms of a 2-rank decode step);
     * past a second (a follower waiting for requests) up to SLEEP_IDLE_NS, which costs an idle
     * rank almost no CPU. */
    long sleep_ns = 0;
    for (int polls = 0;; polls++) {
        int done = 0;
        MPI_Status status;
        int rc = MPI_Test(&r, &done, &status);
        if (rc != MPI_SUCCESS) {
            req->active = false;
            return mpi_error(err, rc, "waiting for a peer rank");
        }
        if (done) {
            req->active = false;
            if (bytes) {
                int count = 0;
                MPI_Get_count(&status, MPI_BYTE, &count);
                *bytes = count > 0 ? (size_t)count : 0;
            }
            return KT_OK;
        }
        memcpy(req->impl, &r, sizeof r);
        if (now_ms() >= deadline) {
            if (timed_out)
                *timed_out = true;
            return kt_err_set(err, KT_ERR_IO, "no answer from the peer rank within %lld ms", (long long)timeout_ms);
        }
        if (polls < 64)
            continue;
        const long cap = now_ms() - start < 1000 ? SLEEP_STEP_NS : SLEEP_IDLE_NS;
        sleep_ns = sleep_ns ? (sleep_ns * 2 > cap ? cap : sleep_ns * 2) : 10000;
        struct timespec ts = {0, sleep_ns};
        while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
        }
    }
}

void kt_transport_progress(struct kt_transport *t, struct kt_transport_req *reqs, int n)
{
    (void)t;
    for (int i = 0; i < n; i++) {
        if (!reqs[i].active)
            continue;
        MPI_Request r;
        memcpy(&r, reqs[i].impl, sizeof r);
        int done = 0;
        if (MPI_Test(&r, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS)
            reqs[i].failed = true; /* (MPI may have freed it) its wait reports the failure */
        else if (done)
            reqs[i].active = false;
        memcpy(reqs[i].impl, &r, sizeof r);
    }
}

void kt_transport_cancel(struct kt_transport *t, struct kt_transport_req *req)
{
    (void)t;
    if (!req->active)
        return;
    if (req->failed) { /* nothing left to cancel */
        req->active = req->failed = false;
        return;
    }
    MPI_Request r;
    memcpy(&r, req->impl, sizeof r);
    MPI_Cancel(&r);
    MPI_Request_free(&r);
    req->active = false;
}
