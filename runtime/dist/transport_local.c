/*
 * transport_local.c - transport.h in a build without MPI: always a job of
 * one process, and a clear refusal when an MPI launcher started it (every
 * rank would otherwise run the whole model alone).
 */
#include "transport.h"

#include <stdlib.h>
#include <unistd.h>

struct kt_transport {
    char host[256];
};

kt_status kt_transport_init(int *argc, char ***argv, struct kt_transport **out, kt_err *err)
{
    (void)argc, (void)argv;
    *out = NULL;
    if (getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMIX_RANK") || getenv("PMI_SIZE"))
        return kt_err_set(err, KT_ERR_UNSUPPORTED, "an MPI launcher started this process, but kt was built without "
                          "MPI: install libopenmpi-dev openmpi-bin and configure with -DKT_MPI=ON");
    struct kt_transport *t = calloc(1, sizeof *t);
    if (!t)
        return kt_err_set(err, KT_ERR_NOMEM, "transport: out of memory");
    if (gethostname(t->host, sizeof t->host - 1) != 0)
        t->host[0] = '?';
    *out = t;
    return KT_OK;
}

void kt_transport_finalize(struct kt_transport *t)
{
    free(t);
}

void kt_transport_abort(struct kt_transport *t, int code)
{
    (void)t;
    _exit(code);
}

int kt_transport_rank(const struct kt_transport *t)
{
    (void)t;
    return 0;
}

int kt_transport_size(const struct kt_transport *t)
{
    (void)t;
    return 1;
}

bool kt_transport_is_mpi(const struct kt_transport *t)
{
    (void)t;
    return false;
}

const char *kt_transport_host(const struct kt_transport *t)
{
    return t->host;
}

kt_status kt_transport_isend(struct kt_transport *t, int to, const void *buf, size_t bytes,
                             struct kt_transport_req *req, kt_err *err)
{
    (void)t, (void)buf, (void)bytes, (void)req;
    return kt_err_set(err, KT_ERR_UNSUPPORTED, "transport: a job of one process has no rank %d", to);
}

kt_status kt_transport_irecv(struct kt_transport *t, int from, void *buf, size_t cap, struct kt_transport_req *req,
                             kt_err *err)
{
    (void)t, (void)buf, (void)cap, (void)req;
    return kt_err_set(err, KT_ERR_UNSUPPORTED, "transport: a job of one process has no rank %d", from);
}

kt_status kt_transport_wait(struct kt_transport *t, struct kt_transport_req *req, int64_t timeout_ms, size_t *bytes,
                            bool *timed_out, kt_err *err)
{
    (void)t, (void)timeout_ms, (void)err;
    if (timed_out)
        *timed_out = false;
    if (bytes)
        *bytes = 0;
    req->active = false;
    return KT_OK;
}

void kt_transport_progress(struct kt_transport *t, struct kt_transport_req *reqs, int n)
{
    (void)t, (void)reqs, (void)n; /* a job of one: nothing is ever in flight */
}

void kt_transport_cancel(struct kt_transport *t, struct kt_transport_req *req)
{
    (void)t;
    req->active = false;
}
