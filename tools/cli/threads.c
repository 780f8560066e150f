/*
 * threads.c - the default thread count and the line that explains it (see
 * threads.h).
 */
#include "threads.h"

#include "cgroup.h"

kt_status kt_tool_default_threads(const char *prog, FILE *log, uint32_t *threads, kt_err *err)
{
    struct kt_cpu_budget cpus;
    kt_status st = kt_cpu_budget_read(NULL, &cpus, err);
    if (st != KT_OK)
        return st;
    *threads = (uint32_t)cpus.cpus;
    if (log && cpus.cpus < cpus.online_cpus)
        fprintf(log, "%s: %d thread%s, not one per online CPU (%d): %s; --threads overrides\n", prog, cpus.cpus,
                cpus.cpus == 1 ? "" : "s", cpus.online_cpus, cpus.why);
    return KT_OK;
}
