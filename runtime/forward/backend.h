/*
 * backend.h - a place other than the host's NUMA pools that holds weights
 * and runs work in order on its own queue (docs/architecture.md, Backends).
 *
 * Two kinds sit behind this header: `sim`, which executes on a host thread
 * of its own but behaves like a separate device - its own memory budget,
 * its own in-order queue, explicit copies in and out that cost
 * latency + bytes / bandwidth - so hybrid placement and CPU/device overlap
 * are exercised on machines without a GPU; and `cuda` (one GPU), whose
 * queue is a CUDA stream and whose FFN units run kt's CUDA kernels
 * (kernels/cuda; a build or machine without CUDA refuses to create one,
 * saying why).  The step code hands a backend whole pieces of a layer (a
 * group of FFN units with their tokens) and never asks which kind it is.
 *
 * Promises: work runs in submission order; kt_backend_sync returns when
 * everything submitted before it has finished; memory beyond the budget is
 * refused with a message naming need and budget, never silently taken.
 * The queue may be fed from one thread at a time.
 */
#ifndef KT_BACKEND_H
#define KT_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "status.h"

enum kt_backend_kind { KT_BACKEND_SIM, KT_BACKEND_CUDA };

struct kt_backend_params {
    enum kt_backend_kind kind;
    const char *name;           /* for messages, e.g. "gpu" */
    uint64_t memory_bytes;      /* the budget (0: none for sim; the free device memory for cuda) */
    double transfer_gbps;       /* sim: bandwidth of copies in and out (0: free) */
    double latency_us;          /* sim: fixed cost of each copy */
    int device;                 /* cuda: device ordinal */
};

struct kt_backend;

/* Work the backend runs on its queue: fn(ctx) on the device side. */
typedef void (*kt_backend_fn)(void *ctx);

struct kt_backend_stats {
    uint64_t busy_ns;           /* time the queue spent running work (copies included) */
    uint64_t transfer_ns;       /* ... of it in copies */
    uint64_t bytes_in, bytes_out;
    uint64_t ops;
    uint64_t graph_launches;    /* replays of recorded graphs (each also one op) */
};

kt_status kt_backend_create(const struct kt_backend_params *p, struct kt_backend **out, kt_err *err);
void kt_backend_destroy(struct kt_backend *b); /* syncs first */

/* Whether a backend of this kind can be created on this machine (the sim:
 * always; cuda: a CUDA device is present); err says why not. */
kt_status kt_backend_available(enum kt_backend_kind kind, kt_err *err);

const char *kt_backend_name(const struct kt_backend *b);
enum kt_backend_kind kt_backend_kind(const struct kt_backend *b);

/* Device memory, counted against the budget; 64-byte aligned.  The sim's
 * memory is host memory the host must only touch through copies. */
kt_status kt_backend_alloc(struct kt_backend *b, size_t bytes, void **ptr, kt_err *err);
void kt_backend_free(struct kt_backend *b, void *ptr, size_t bytes);
uint64_t kt_backend_used_bytes(const struct kt_backend *b);
uint64_t kt_backend_budget_bytes(const struct kt_backend *b);
/* The link's rate for large copies, bytes per ns: sim, its modelled
 * transfer_gbps (0: copies are free); cuda, the fastest copy of 256 KiB or
 * more timed so far (0: none yet). */
double kt_backend_link_bytes_per_ns(struct kt_backend *b);

/* Queued, in order.  src (copy_in) and dst (copy_out) host buffers must stay
 * valid until a later sync. */
void kt_backend_copy_in(struct kt_backend *b, void *dst_device, const void *src_host, size_t bytes);
void kt_backend_copy_out(struct kt_backend *b, void *dst_host, const void *src_device, size_t bytes);
/* sim: fn(ctx) runs on the backend's thread.  cuda: fn(ctx) runs on a host
 * thread in stream order (a host callback that only does host work). */
void kt_backend_launch(struct kt_backend *b, kt_backend_fn fn, void *ctx);
/* Queued, in order: a copy within the device's memory (no link crossed: the
 * sim charges no transfer cost; cuda copies device to device). */
void kt_backend_copy_device(struct kt_backend *b, void *dst_device, const void *src_device, size_t bytes);
void kt_backend_sync(struct kt_backend *b);

/* Work that each kind runs its own way: sim calls host_fn(host_ctx) on its
 * queue (kt's CPU code on device-resident copies); cuda calls
 * cuda_fn(cuda_ctx, stream, err) right away, which enqueues its kernels on
 * the stream and returns KT_OK, or a failure (err says why) that becomes
 * the queue's failure.  The step code writes both halves of each piece of
 * work (an FFN's units, a layer's attention, the router, the output head);
 * the backend never knows which it runs. */
typedef kt_status (*kt_backend_cuda_fn)(void *ctx, void *stream, kt_err *err);
void kt_backend_run(struct kt_backend *b, kt_backend_fn host_fn, void *host_ctx, kt_backend_cuda_fn cuda_fn,
                    void *cuda_ctx);

/* Graphs: a fixed sequence of queued work recorded once and replayed.
 * Between kt_backend_graph_begin and kt_backend_graph_end what is queued is
 * recorded, not run; kt_backend_graph_launch queues the recording again as
 * one operation, with the arguments it was recorded with (so buffers,
 * shapes and pointers must be the same at every launch; only the contents
 * of device memory may change).  cuda: stream capture into an executable
 * CUDA graph, for kernel work only (copies to or from the host stay
 * outside); sim: the recorded operations.  A failed begin or end leaves the
 * queue as it was and the caller runs the work directly. */
struct kt_backend_graph;
kt_status kt_backend_graph_begin(struct kt_backend *b, kt_err *err);
kt_status kt_backend_graph_end(struct kt_backend *b, struct kt_backend_graph **out, kt_err *err);
void kt_backend_graph_launch(struct kt_backend *b, const struct kt_backend_graph *g);
void kt_backend_graph_destroy(struct kt_backend_graph *g); /* NULL is fine; not while a launch of it is queued */

/* Host memory the queue's copies use a lot: cuda page-locks it (true
 * asynchronous copies; a refusal leaves it pageable, which only costs
 * speed, and returns false); the sim has nothing to do.  Unpin before
 * freeing it. */
bool kt_backend_pin_host(struct kt_backend *b, void *ptr, size_t bytes);
void kt_backend_unpin_host(struct kt_backend *b, void *ptr);

/* KT_OK, or the first failure of the queue's work (a cuda copy or kernel
 * launch) since creation or the last call, which forgets it: the step takes
 * it when it ends, so a failed step does not fail the next by itself (a
 * sticky CUDA error fails that one too). */
kt_status kt_backend_take_failure(struct kt_backend *b, kt_err *err);

void kt_backend_stats(const struct kt_backend *b, struct kt_backend_stats *out);
void kt_backend_stats_reset(struct kt_backend *b);

#endif
