/*
 * meminfo.h - how much memory this process can still get: the host's
 * MemAvailable (/proc/meminfo) or, in a container, what its cgroup's limit
 * leaves (cgroup.h), whichever is less; and the check every large
 * allocation runs before it starts.
 *
 * A load that cannot fit must be refused before the first byte is
 * allocated, with a message saying what is needed, what is free and which
 * limit decides; a half-loaded 600 GB model that dies in the OOM killer
 * helps nobody.  This module only reads and compares; it never allocates
 * weights or prints.
 */
#ifndef KT_MEMINFO_H
#define KT_MEMINFO_H

#include <stdint.h>

#include "cgroup.h"
#include "status.h"

struct kt_meminfo {
    uint64_t total_bytes;          /* MemTotal */
    uint64_t host_available_bytes; /* MemAvailable (MemFree + Cached on kernels without it) */
    struct kt_cgroup_memory cgroup; /* the tightest cgroup limit on this process, if any */
    uint64_t available_bytes;      /* what this process can still get: the less of the two */
};

/* Reads ROOT/proc/meminfo and the cgroup files under ROOT (cgroup.h); root
 * NULL: "/" (tests pass a fake tree). */
kt_status kt_meminfo_read(const char *root, struct kt_meminfo *out, kt_err *err);

/* Headroom kept free beyond what a load of need_bytes asks for: 512 MiB
 * (scratch, KV cache, the allocator) + 1/64 of the load (page tables, the
 * page cache the load itself passes through). */
uint64_t kt_meminfo_margin_bytes(uint64_t need_bytes);

/* KT_OK if need_bytes + margin fits in what is available; otherwise
 * KT_ERR_NOMEM with "WHAT needs N GiB (+ M GiB margin) but only F GiB is
 * available" and the limit that decides: MemAvailable, or the cgroup's
 * limit with its file, its use and how to raise it.  I/O or format errors
 * of the files read are returned as they are. */
kt_status kt_meminfo_check(const char *root, const char *what, uint64_t need_bytes, kt_err *err);

#endif
