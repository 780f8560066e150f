/*
 * transport.h - the processes of a job and the bytes between them: MPI
 * (OpenMPI) when the build has it and the process was started by mpirun,
 * else a job of one process.  Point-to-point only, non-blocking, and every
 * wait bounded by a timeout: a rank that dies or hangs becomes an error
 * here (MPI_ERRORS_RETURN), never a hang.
 *
 * Waiting polls (MPI_Test) and sleeps between polls, so a rank that waits
 * leaves its cores to the ranks that compute (on an oversubscribed machine
 * a spinning MPI wait would take them).
 */
#ifndef KT_TRANSPORT_H
#define KT_TRANSPORT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "status.h"

struct kt_transport;

/* A send or receive in flight; zeroed: none. */
struct kt_transport_req {
    bool active;
    bool failed;                /* kt_transport_progress saw it fail: its wait says so */
    uint64_t impl[2];           /* the MPI_Request */
};

/* MPI_Init_thread (MPI_THREAD_SERIALIZED: one thread at a time, any
 * thread) when an MPI launcher started this process (its environment says
 * so), else a job of one without MPI.  KT_ERR_UNSUPPORTED when mpirun
 * started it but the build has no MPI. */
kt_status kt_transport_init(int *argc, char ***argv, struct kt_transport **out, kt_err *err);
/* MPI_Finalize (after every rank's last message). */
void kt_transport_finalize(struct kt_transport *t);
/* Ends the whole job with code (MPI_Abort): for a rank that cannot go on
 * while others may wait on it, or are hung. */
void kt_transport_abort(struct kt_transport *t, int code);

int kt_transport_rank(const struct kt_transport *t);
int kt_transport_size(const struct kt_transport *t);
bool kt_transport_is_mpi(const struct kt_transport *t);
const char *kt_transport_host(const struct kt_transport *t); /* this process's host name */

/* Starts sending bytes to rank `to` / receiving at most cap bytes from
 * rank `from` (one tag: messages between two ranks arrive in order). */
kt_status kt_transport_isend(struct kt_transport *t, int to, const void *buf, size_t bytes,
                             struct kt_transport_req *req, kt_err *err);
kt_status kt_transport_irecv(struct kt_transport *t, int from, void *buf, size_t cap, struct kt_transport_req *req,
                             kt_err *err);
/* Waits for req at most timeout_ms (< 0: without a limit); *bytes (may be
 * NULL): a receive's size.  KT_ERR_IO when the peer failed, or did not
 * answer in time (*timed_out true, req still active; timed_out may be NULL).  A request not
 * active returns at once. */
kt_status kt_transport_wait(struct kt_transport *t, struct kt_transport_req *req, int64_t timeout_ms, size_t *bytes,
                            bool *timed_out, kt_err *err);
/* Cancels a request still active (a receive no one will answer). */
void kt_transport_cancel(struct kt_transport *t, struct kt_transport_req *req);
/* Lets the requests in flight move on, without waiting: each active one of
 * reqs[0..n) is tested once, and one that completed becomes inactive.  For
 * a rank that computes while its sends are in flight: MPI moves a large
 * message (past the transport's eager limit, e.g. OpenMPI's 64 KiB over
 * TCP) only while the sender is inside an MPI call, so without this a send
 * started before a long computation would not leave before it ends.  A
 * request that failed stays active, marked: its wait reports the failure. */
void kt_transport_progress(struct kt_transport *t, struct kt_transport_req *reqs, int n);

#endif
