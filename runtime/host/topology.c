/*
 * topology.c - builds struct kt_topology from hwloc.
 *
 * Each physical core is assigned to the first NUMA node whose cpuset contains
 * its PUs; its first PU is the one kt pins to (one worker per core: the
 * sibling hyperthread shares the core's load/store units and L2, which expert
 * kernels already saturate).  It must never bind anything: binding is pool.c's
 * and numa_mem.c's, and only on a topology that is not synthetic.
 */
#include "topology.h"

#include <hwloc.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SUMMARY_BYTES 4096

/* Appends to a fixed buffer, truncating quietly (a summary, not data). */
static void append(char *buf, size_t *used, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void append(char *buf, size_t *used, const char *fmt, ...)
{
    if (*used >= SUMMARY_BYTES - 1)
        return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf + *used, SUMMARY_BYTES - *used, fmt, ap);
    va_end(ap);
    if (n > 0)
        *used += (size_t)n < SUMMARY_BYTES - *used ? (size_t)n : SUMMARY_BYTES - 1 - *used;
}

static void format_bytes(char *out, size_t size, uint64_t bytes)
{
    if (bytes >= (1ull << 30) && bytes % (1ull << 30) == 0)
        snprintf(out, size, "%llu GiB", (unsigned long long)(bytes >> 30));
    else if (bytes >= (1ull << 30))
        snprintf(out, size, "%.1f GiB", (double)bytes / (double)(1ull << 30));
    else if (bytes >= (1ull << 20))
        snprintf(out, size, "%llu MiB", (unsigned long long)(bytes >> 20));
    else
        snprintf(out, size, "%llu KiB", (unsigned long long)(bytes >> 10));
}

static kt_status build_summary(struct kt_topology *t, kt_err *err)
{
    t->summary = malloc(SUMMARY_BYTES);
    if (!t->summary)
        return kt_err_set(err, KT_ERR_NOMEM, "topology: out of memory");
    char *s = t->summary;
    size_t used = 0;
    s[0] = '\0';
    char mem[32];
    append(s, &used, "%d NUMA node%s%s, %d cores, %d PUs", t->n_nodes, t->n_nodes == 1 ? "" : "s",
           t->synthetic ? " (synthetic)" : "", t->n_cores, t->n_pus);
    for (int i = 0; i < t->n_nodes; i++) {
        const struct kt_topo_node *n = &t->nodes[i];
        format_bytes(mem, sizeof mem, n->memory_bytes);
        append(s, &used, "; node %d: %d cores", n->os_index, n->n_cores);
        if (n->memory_bytes)
            append(s, &used, ", %s", mem);
    }
    if (t->l2_bytes) {
        format_bytes(mem, sizeof mem, t->l2_bytes);
        append(s, &used, "; L2 %s", mem);
    }
    if (t->l3_bytes) {
        format_bytes(mem, sizeof mem, t->l3_bytes);
        append(s, &used, "; L3 %s x %d", mem, t->n_l3);
    }
    append(s, &used, "; ISA %s", kt_isa_name(t->isa_max));
    return KT_OK;
}

/* The first NUMA node (logical index into t->nodes) local to `set`, or -1. */
static int node_of(hwloc_topology_t hw, hwloc_const_cpuset_t set)
{
    int n_nodes = hwloc_get_nbobjs_by_type(hw, HWLOC_OBJ_NUMANODE);
    for (int i = 0; i < n_nodes; i++) {
        hwloc_obj_t node = hwloc_get_obj_by_type(hw, HWLOC_OBJ_NUMANODE, (unsigned)i);
        if (node->cpuset && hwloc_bitmap_intersects(node->cpuset, set))
            return i;
    }
    return -1;
}

static kt_status fill(struct kt_topology *t, kt_err *err)
{
    hwloc_topology_t hw = t->hwloc;
    int n_nodes = hwloc_get_nbobjs_by_type(hw, HWLOC_OBJ_NUMANODE);
    int n_cores = hwloc_get_nbobjs_by_type(hw, HWLOC_OBJ_CORE);
    int n_pus = hwloc_get_nbobjs_by_type(hw, HWLOC_OBJ_PU);
    if (n_nodes < 1 || n_pus < 1)
        return kt_err_set(err, KT_ERR_UNSUPPORTED, "topology: hwloc reports %d NUMA nodes and %d PUs", n_nodes,
                          n_pus);
    t->n_nodes = n_nodes;
    t->n_pus = n_pus;
    t->nodes = calloc((size_t)n_nodes, sizeof *t->nodes);
    if (!t->nodes)
        return kt_err_set(err, KT_ERR_NOMEM, "topology: out of memory");
    for (int i = 0; i < n_nodes; i++) {
        hwloc_obj_t node = hwloc_get_obj_by_type(hw, HWLOC_OBJ_NUMANODE, (unsigned)i);
        t->nodes[i].os_index = (int)node->os_index;
        t->nodes[i].memory_bytes = node->attr ? node->attr->numanode.local_memory : 0;
        t->nodes[i].n_pus = node->cpuset ? hwloc_bitmap_weight(node->cpuset) : 0;
        /* Every core could be on this node; trimmed by n_cores. */
        t->nodes[i].core_pu = calloc(n_cores > 0 ? (size_t)n_cores : 1, sizeof(int));
        if (!t->nodes[i].core_pu)
            return kt_err_set(err, KT_ERR_NOMEM, "topology: out of memory");
    }

    if (n_cores > 0) {
        for (int c = 0; c < n_cores; c++) {
            hwloc_obj_t core = hwloc_get_obj_by_type(hw, HWLOC_OBJ_CORE, (unsigned)c);
            int node = node_of(hw, core->cpuset);
            int pu = hwloc_bitmap_first(core->cpuset);
            if (node < 0 || pu < 0)
                continue; /* a core no NUMA node claims: not usable for a pool */
            struct kt_topo_node *n = &t->nodes[node];
            n->core_pu[n->n_cores++] = pu;
            t->n_cores++;
        }
    } else {
        /* hwloc found no cores (some VMs): treat each PU as a core. */
        for (int p = 0; p < n_pus; p++) {
            hwloc_obj_t obj = hwloc_get_obj_by_type(hw, HWLOC_OBJ_PU, (unsigned)p);
            int node = node_of(hw, obj->cpuset);
            if (node < 0)
                continue;
            struct kt_topo_node *n = &t->nodes[node];
            int *grown = realloc(n->core_pu, (size_t)(n->n_cores + 1) * sizeof *grown);
            if (!grown)
                return kt_err_set(err, KT_ERR_NOMEM, "topology: out of memory");
            n->core_pu = grown;
            n->core_pu[n->n_cores++] = (int)obj->os_index;
            t->n_cores++;
        }
    }
    if (t->n_cores < 1)
        return kt_err_set(err, KT_ERR_UNSUPPORTED, "topology: no core is local to any NUMA node");

    hwloc_obj_t l2 = hwloc_get_obj_by_type(hw, HWLOC_OBJ_L2CACHE, 0);
    hwloc_obj_t l3 = hwloc_get_obj_by_type(hw, HWLOC_OBJ_L3CACHE, 0);
    t->l2_bytes = l2 && l2->attr ? l2->attr->cache.size : 0;
    t->l3_bytes = l3 && l3->attr ? l3->attr->cache.size : 0;
    t->n_l3 = hwloc_get_nbobjs_by_type(hw, HWLOC_OBJ_L3CACHE);
    t->isa_max = kt_cpu_kernels()->isa_max;
    return build_summary(t, err);
}

kt_status kt_topology_create(const char *synthetic, struct kt_topology **out, kt_err *err)
{
    *out = NULL;
    if (!synthetic) {
        const char *env = getenv("KT_TOPOLOGY_SYNTHETIC");
        if (env && env[0])
            synthetic = env;
    }
    struct kt_topology *t = calloc(1, sizeof *t);
    if (!t)
        return kt_err_set(err, KT_ERR_NOMEM, "topology: out of memory");
    kt_status st = KT_OK;
    hwloc_topology_t hw;
    if (hwloc_topology_init(&hw) != 0) {
        st = kt_err_set(err, KT_ERR_NOMEM, "topology: hwloc_topology_init failed");
        goto fail;
    }
    t->hwloc = hw;
    t->synthetic = synthetic != NULL;
    if (synthetic && hwloc_topology_set_synthetic(hw, synthetic) != 0) {
        st = kt_err_set(err, KT_ERR_INVALID, "topology: bad hwloc synthetic description \"%s\"", synthetic);
        goto fail;
    }
    if (hwloc_topology_load(hw) != 0) {
        st = kt_err_set(err, KT_ERR_IO, "topology: hwloc_topology_load failed%s%s",
                        synthetic ? " for synthetic " : "", synthetic ? synthetic : "");
        goto fail;
    }
    st = fill(t, err);
    if (st != KT_OK)
        goto fail;
    *out = t;
    return KT_OK;
fail:
    kt_topology_destroy(t);
    return st;
}

void kt_topology_destroy(struct kt_topology *t)
{
    if (!t)
        return;
    if (t->nodes)
        for (int i = 0; i < t->n_nodes; i++)
            free(t->nodes[i].core_pu);
    free(t->nodes);
    free(t->summary);
    if (t->hwloc)
        hwloc_topology_destroy((hwloc_topology_t)t->hwloc);
    free(t);
}

const char *kt_topology_summary(const struct kt_topology *t)
{
    return t->summary;
}
