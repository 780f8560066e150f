/*
 * topology.h - what the machine looks like to kt: NUMA nodes, the physical
 * cores of each, cache sizes and the CPU kernel level, read once through hwloc.
 *
 * A topology is either this machine or an hwloc synthetic description
 * ("package:2 numa:1 l3:1 core:4 pu:2"), so NUMA logic is tested on one-node
 * machines.  It is read-only after creation and must never be used to bind a
 * thread or memory when it is synthetic (its PUs are not this machine's).
 */
#ifndef KT_TOPOLOGY_H
#define KT_TOPOLOGY_H

#include <stdbool.h>
#include <stdint.h>

#include "cpu/dispatch.h"
#include "status.h"

struct kt_topo_node {
    int os_index;          /* the node number the kernel (libnuma, mbind) uses */
    int n_cores;           /* physical cores whose PUs are local to this node; may be 0 */
    int *core_pu;          /* [n_cores] OS index of the one PU per core that kt pins to */
    int n_pus;             /* all PUs of the node, hyperthreads included */
    uint64_t memory_bytes; /* local memory, 0 if hwloc does not know */
};

struct kt_topology {
    bool synthetic;            /* true: described, not measured; never bind with it */
    int n_nodes;
    struct kt_topo_node *nodes; /* [n_nodes] in hwloc's logical order */
    int n_cores, n_pus;        /* totals over the machine */
    uint64_t l2_bytes;         /* size of one L2 (per core on current x86), 0 if unknown */
    uint64_t l3_bytes;         /* size of one L3 instance, 0 if unknown */
    int n_l3;                  /* number of L3 instances */
    enum kt_isa isa_max;       /* the best CPU kernel level of the machine kt runs on */
    void *hwloc;               /* hwloc_topology_t, for pool.c and numa_mem.c only */
    char *summary;             /* see kt_topology_summary */
};

/* Reads the topology: of this machine when synthetic is NULL and the environment
 * variable KT_TOPOLOGY_SYNTHETIC is unset or empty, else of the synthetic
 * description (the argument wins over the environment). */
kt_status kt_topology_create(const char *synthetic, struct kt_topology **out, kt_err *err);
void kt_topology_destroy(struct kt_topology *t);

/* One line for logs, e.g. "2 NUMA nodes (synthetic), 8 cores, 16 PUs; node 0:
 * 4 cores, 64 GiB; node 1: ...; L2 1 MiB, L3 32 MiB x 2; ISA avx512".  Owned by
 * the topology; never printed by kt itself. */
const char *kt_topology_summary(const struct kt_topology *t);

#endif
