/*
 * meminfo.h - how much memory the machine can give us, from /proc/meminfo,
 * and the check every large allocation runs before it starts.
 *
 * A load that cannot fit must be refused before the first byte is
 * allocated, with a message saying what is needed and what is free; a
 * half-loaded 600 GB model that dies in the OOM killer helps nobody.  This
 * module only reads and compares; it never allocates weights or prints.
 */
#ifndef KT_MEMINFO_H
#define KT_MEMINFO_H

#include <stdint.h>

#include "status.h"

struct kt_meminfo {
    uint64_t total_bytes;     /* MemTotal */
    uint64_t available_bytes; /* MemAvailable (MemFree + Cached on kernels without it) */
};

/* Parses a meminfo file; path NULL: /proc/meminfo (tests pass a fake one). */
kt_status kt_meminfo_read(const char *path, struct kt_meminfo *out, kt_err *err);

/* Headroom kept free beyond what a load of need_bytes asks for: 512 MiB
 * (scratch, KV cache, the allocator) + 1/64 of the load (page tables, the
 * page cache the load itself passes through). */
uint64_t kt_meminfo_margin_bytes(uint64_t need_bytes);

/* KT_OK if need_bytes + margin fits in MemAvailable; otherwise KT_ERR_NOMEM
 * with "WHAT needs N GiB (+ M GiB margin) but only F GiB is available (...)".
 * I/O or format errors of the meminfo file are returned as they are. */
kt_status kt_meminfo_check(const char *path, const char *what, uint64_t need_bytes, kt_err *err);

#endif
