/*
 * numa_mem.h - large buffers (expert weights, pool scratch) in one NUMA node's
 * memory, with transparent huge pages where the kernel offers them, and a
 * count of the bytes held on each node.
 *
 * Memory is bound to the node (mbind) only on a real topology with NUMA
 * support (libnuma's numa_available() >= 0); otherwise it is a plain
 * page-aligned mapping and the count still records the node asked for.  It
 * must never print (libnuma's error hooks are not used) and never hand out
 * memory that is not zero-filled and page-aligned.
 */
#ifndef KT_NUMA_MEM_H
#define KT_NUMA_MEM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "status.h"
#include "topology.h"

struct kt_numa_mem; /* an allocator over one topology, with per-node counts */

/* One buffer; owned by whoever holds it until kt_numa_free. */
struct kt_numa_buf {
    void *ptr;        /* page-aligned (2 MiB-aligned from 2 MiB up), zero-filled */
    size_t bytes;     /* as asked */
    size_t mapped_bytes;
    int node;         /* index into topology->nodes */
    bool bound;       /* pages are bound to the node (false: fallback, or mbind refused) */
    bool huge;        /* MADV_HUGEPAGE was accepted */
};

/* t must outlive the allocator. */
kt_status kt_numa_mem_create(const struct kt_topology *t, struct kt_numa_mem **out, kt_err *err);
/* Buffers still held are the caller's leak; kt_numa_mem_bytes shows them. */
void kt_numa_mem_destroy(struct kt_numa_mem *m);

/* True when allocations are really bound to nodes (see the top of this file). */
bool kt_numa_mem_binds(const struct kt_numa_mem *m);

/* Allocates bytes (> 0) on node `node` (0 .. n_nodes-1).  Thread-safe. */
kt_status kt_numa_alloc(struct kt_numa_mem *m, int node, size_t bytes, struct kt_numa_buf *out, kt_err *err);
/* Frees buf (a zeroed buf is ignored) and zeroes it.  Thread-safe. */
void kt_numa_free(struct kt_numa_mem *m, struct kt_numa_buf *buf);

/* Bytes (as asked) currently held on node / its peak since creation. */
uint64_t kt_numa_mem_bytes(const struct kt_numa_mem *m, int node);
uint64_t kt_numa_mem_peak_bytes(const struct kt_numa_mem *m, int node);

#endif
