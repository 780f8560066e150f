/*
 * threads.h - the thread count kt-run, kt-serve and kt-bench use when
 * --threads is not given: the CPUs this process may keep busy, its
 * container's cgroup limits included (runtime/host/cgroup.h), with a line on
 * stderr saying which limit made it fewer than the online CPUs.
 */
#ifndef KT_TOOLS_THREADS_H
#define KT_TOOLS_THREADS_H

#include <stdint.h>
#include <stdio.h>

#include "status.h"

/* *threads = the CPU budget; when it is below the online CPUs, log (may be
 * NULL) gets "PROG: N threads, not one per online CPU (M): WHY; --threads
 * overrides".  Errors name the cgroup file that could not be read. */
kt_status kt_tool_default_threads(const char *prog, FILE *log, uint32_t *threads, kt_err *err);

#endif
