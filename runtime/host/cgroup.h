/*
 * cgroup.h - the limits a container puts on this process: how much more
 * memory its cgroup lets it take, and how many CPUs it may keep busy, from
 * cgroup v2 or v1.  The kernel's OOM killer acts on a group's limit, not on
 * the host's free memory, so a load that checks only MemAvailable can be
 * killed half way in a 2 GiB container on a 500 GiB host.
 *
 * Everything is read from files under a root directory (NULL: "/"; tests
 * pass a fake tree): proc/self/cgroup names this process's groups,
 * proc/self/mountinfo where each hierarchy is mounted, and then the files of
 * every group from this process's own up to the mount's top, the tightest
 * counting (a parent's limit binds its children).  A group without a limit
 * file has no limit there; a file the kernel would never write (garbage) is
 * an error naming the file and what it holds.  Reads only; never caches.
 */
#ifndef KT_CGROUP_H
#define KT_CGROUP_H

#include <stdbool.h>
#include <stdint.h>

#include "status.h"

#define KT_CGROUP_PATH_MAX 1024

struct kt_cgroup_memory {
    bool limited;               /* some group on the path has a memory limit */
    int version;                /* 1 or 2: the hierarchy the limit is in */
    uint64_t limit_bytes;       /* the limit of the group with the least room left */
    uint64_t used_bytes;        /* that group's usage, less its inactive page cache (reclaimed first) */
    uint64_t room_bytes;        /* limit - used; 0 when the group is at or over its limit */
    char limit_path[KT_CGROUP_PATH_MAX]; /* the file limit_bytes came from (memory.max, memory.limit_in_bytes) */
    /* Why no limit could be read although this process is in a memory
     * cgroup (its hierarchy is not mounted, its directory is not there); "":
     * nothing was missed. */
    char note[KT_CGROUP_PATH_MAX + 128];
};

/* Fills out; KT_OK with limited false when no group limits memory. */
kt_status kt_cgroup_memory_read(const char *root, struct kt_cgroup_memory *out, kt_err *err);

struct kt_cpu_budget {
    int online_cpus;            /* sysconf(_SC_NPROCESSORS_ONLN) */
    /* The threads to run by default: the least of the online CPUs, the CPUs
     * this process may run on (sched_getaffinity), its cgroup's cpuset
     * (cpuset.cpus.effective, v1 cpuset.effective_cpus) and its CPU quota
     * (cpu.max, v1 cpu.cfs_quota_us / cpu.cfs_period_us), rounded up: a
     * quota of 1.5 CPUs runs 2 threads, throttled a quarter of each period.
     * At least 1. */
    int cpus;
    /* When cpus < online_cpus: which limit decided and where it was read,
     * e.g. "the cgroup's CPU quota is 1.50 CPUs (/sys/fs/cgroup/a/cpu.max:
     * 150000 100000)"; "" otherwise. */
    char why[KT_CGROUP_PATH_MAX + 128];
};

kt_status kt_cpu_budget_read(const char *root, struct kt_cpu_budget *out, kt_err *err);

#endif
