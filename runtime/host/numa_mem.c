/*
 * numa_mem.c - node-local buffers: mmap, trim to a huge-page boundary,
 * madvise(MADV_HUGEPAGE), then mbind(MPOL_BIND) to the node before any page
 * is touched, so first-touch from any thread lands on the node.
 *
 * It must never call libnuma functions that report through numa_error /
 * numa_warn (they print); only numa_available() and the mbind() wrapper.
 */
#include "numa_mem.h"

#include <errno.h>
#include <numa.h>
#include <numaif.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define HUGE_PAGE_BYTES ((size_t)2 << 20)

struct kt_numa_mem {
    const struct kt_topology *topo;
    bool binds;
    size_t page_bytes;
    _Atomic uint64_t *bytes; /* [n_nodes] held now */
    _Atomic uint64_t *peak;  /* [n_nodes] */
};

kt_status kt_numa_mem_create(const struct kt_topology *t, struct kt_numa_mem **out, kt_err *err)
{
    *out = NULL;
    struct kt_numa_mem *m = calloc(1, sizeof *m);
    if (!m)
        return kt_err_set(err, KT_ERR_NOMEM, "numa memory: out of memory");
    m->topo = t;
    m->binds = !t->synthetic && numa_available() >= 0;
    long page = sysconf(_SC_PAGESIZE);
    m->page_bytes = page > 0 ? (size_t)page : 4096;
    m->bytes = calloc((size_t)t->n_nodes, sizeof *m->bytes);
    m->peak = calloc((size_t)t->n_nodes, sizeof *m->peak);
    if (!m->bytes || !m->peak) {
        kt_numa_mem_destroy(m);
        return kt_err_set(err, KT_ERR_NOMEM, "numa memory: out of memory");
    }
    *out = m;
    return KT_OK;
}

void kt_numa_mem_destroy(struct kt_numa_mem *m)
{
    if (!m)
        return;
    free((void *)m->bytes);
    free((void *)m->peak);
    free(m);
}

bool kt_numa_mem_binds(const struct kt_numa_mem *m)
{
    return m->binds;
}

static bool bind_to_node(void *ptr, size_t len, int os_node)
{
    enum { WORD_BITS = 8 * sizeof(unsigned long), MAX_NODES = 4096 };
    unsigned long mask[MAX_NODES / WORD_BITS] = {0};
    if (os_node < 0 || os_node >= MAX_NODES)
        return false;
    mask[os_node / WORD_BITS] = 1ul << (os_node % WORD_BITS);
    /* The kernel reads maxnode - 1 bits. */
    return mbind(ptr, len, MPOL_BIND, mask, (unsigned long)(os_node / WORD_BITS + 1) * WORD_BITS + 1, 0) == 0;
}

kt_status kt_numa_alloc(struct kt_numa_mem *m, int node, size_t bytes, struct kt_numa_buf *out, kt_err *err)
{
    memset(out, 0, sizeof *out);
    if (node < 0 || node >= m->topo->n_nodes || bytes == 0)
        return kt_err_set(err, KT_ERR_INVALID, "numa memory: %zu bytes on node %d (nodes 0 .. %d)", bytes, node,
                          m->topo->n_nodes - 1);
    size_t align = bytes >= HUGE_PAGE_BYTES ? HUGE_PAGE_BYTES : m->page_bytes;
    if (bytes > SIZE_MAX - 2 * align)
        return kt_err_set(err, KT_ERR_NOMEM, "numa memory: %zu bytes is too large", bytes);
    size_t len = (bytes + align - 1) / align * align;
    size_t extra = align - m->page_bytes; /* slack to move the start to an align boundary */
    char *raw = mmap(NULL, len + extra, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED)
        return kt_err_set(err, KT_ERR_NOMEM, "numa memory: mmap of %zu bytes for node %d failed: %s", len, node,
                          strerror(errno));
    char *ptr = (char *)(((uintptr_t)raw + align - 1) / align * align);
    if (ptr > raw)
        munmap(raw, (size_t)(ptr - raw));
    if (raw + len + extra > ptr + len)
        munmap(ptr + len, (size_t)(raw + len + extra - (ptr + len)));

    out->ptr = ptr;
    out->bytes = bytes;
    out->mapped_bytes = len;
    out->node = node;
#ifdef MADV_HUGEPAGE
    out->huge = align == HUGE_PAGE_BYTES && madvise(ptr, len, MADV_HUGEPAGE) == 0;
#endif
    out->bound = m->binds && bind_to_node(ptr, len, m->topo->nodes[node].os_index);

    uint64_t held = atomic_fetch_add(&m->bytes[node], bytes) + bytes;
    uint64_t peak = atomic_load(&m->peak[node]);
    while (held > peak && !atomic_compare_exchange_weak(&m->peak[node], &peak, held)) {
    }
    return KT_OK;
}

void kt_numa_free(struct kt_numa_mem *m, struct kt_numa_buf *buf)
{
    if (!buf->ptr)
        return;
    munmap(buf->ptr, buf->mapped_bytes);
    atomic_fetch_sub(&m->bytes[buf->node], buf->bytes);
    memset(buf, 0, sizeof *buf);
}

uint64_t kt_numa_mem_bytes(const struct kt_numa_mem *m, int node)
{
    return node >= 0 && node < m->topo->n_nodes ? atomic_load(&m->bytes[node]) : 0;
}

uint64_t kt_numa_mem_peak_bytes(const struct kt_numa_mem *m, int node)
{
    return node >= 0 && node < m->topo->n_nodes ? atomic_load(&m->peak[node]) : 0;
}
