/*
 * meminfo.c - /proc/meminfo parsing, the cgroup limit beside it, and the
 * fits-in-memory check (see meminfo.h).  Reads small text files; never
 * allocates beyond a stdio buffer and never caches what it read (memory
 * changes under us).
 */
#include "meminfo.h"

#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#define GIB (1024.0 * 1024.0 * 1024.0)

/* ROOT/proc/meminfo; root NULL: /proc/meminfo. */
static void meminfo_path(const char *root, char *path, size_t size)
{
    snprintf(path, size, "%s/proc/meminfo", root && strcmp(root, "/") ? root : "");
}

kt_status kt_meminfo_read(const char *root, struct kt_meminfo *out, kt_err *err)
{
    char path[KT_CGROUP_PATH_MAX];
    meminfo_path(root, path, sizeof path);
    memset(out, 0, sizeof *out);
    FILE *f = fopen(path, "r");
    if (!f)
        return kt_err_set(err, KT_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    char line[256];
    bool have_total = false, have_available = false;
    uint64_t mem_free = 0, cached = 0;
    while (fgets(line, sizeof line, f)) {
        char key[64];
        uint64_t kib;
        if (sscanf(line, "%63[^:]: %" SCNu64, key, &kib) != 2)
            continue;
        if (!strcmp(key, "MemTotal")) {
            out->total_bytes = kib * 1024;
            have_total = true;
        } else if (!strcmp(key, "MemAvailable")) {
            out->host_available_bytes = kib * 1024;
            have_available = true;
        } else if (!strcmp(key, "MemFree")) {
            mem_free = kib * 1024;
        } else if (!strcmp(key, "Cached")) {
            cached = kib * 1024;
        }
    }
    fclose(f);
    if (!have_total)
        return kt_err_set(err, KT_ERR_FORMAT, "%s: no MemTotal line", path);
    if (!have_available) /* kernels before 3.14: the old estimate */
        out->host_available_bytes = mem_free + cached;
    out->available_bytes = out->host_available_bytes;
    kt_status st = kt_cgroup_memory_read(root, &out->cgroup, err);
    if (st != KT_OK)
        return st;
    if (out->cgroup.limited && out->cgroup.room_bytes < out->available_bytes)
        out->available_bytes = out->cgroup.room_bytes;
    return KT_OK;
}

uint64_t kt_meminfo_margin_bytes(uint64_t need_bytes)
{
    return (512ull << 20) + need_bytes / 64;
}

kt_status kt_meminfo_check(const char *root, const char *what, uint64_t need_bytes, kt_err *err)
{
    struct kt_meminfo mi;
    kt_status st = kt_meminfo_read(root, &mi, err);
    if (st != KT_OK)
        return st;
    const uint64_t margin = kt_meminfo_margin_bytes(need_bytes);
    if (need_bytes + margin <= mi.available_bytes)
        return KT_OK;
    const struct kt_cgroup_memory *cg = &mi.cgroup;
    if (cg->limited && cg->room_bytes < mi.host_available_bytes)
        return kt_err_set(err, KT_ERR_NOMEM,
                          "%s needs %.2f GiB (+ %.2f GiB margin) but only %.2f GiB is available to this process's "
                          "cgroup: its memory limit is %.2f GiB (%s), %.2f GiB of it in use (the host has %.2f GiB "
                          "available); raise the limit (docker run --memory, systemd MemoryMax=, or write %s) or "
                          "load a smaller model",
                          what, need_bytes / GIB, margin / GIB, cg->room_bytes / GIB, cg->limit_bytes / GIB,
                          cg->limit_path, cg->used_bytes / GIB, mi.host_available_bytes / GIB,
                          cg->version == 2 ? "memory.max" : "memory.limit_in_bytes");
    char path[KT_CGROUP_PATH_MAX];
    meminfo_path(root, path, sizeof path);
    return kt_err_set(err, KT_ERR_NOMEM,
                      "%s needs %.2f GiB (+ %.2f GiB margin) but only %.2f GiB is available "
                      "(MemAvailable in %s; %.2f GiB total): free memory or load a smaller model",
                      what, need_bytes / GIB, margin / GIB, mi.available_bytes / GIB, path, mi.total_bytes / GIB);
}
