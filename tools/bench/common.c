/*
 * common.c - small helpers the kt-bench jobs use: a monotonic clock and
 * writing the JSON document.  Never measures anything.
 */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "bench.h"

double kt_bench_now_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int kt_bench_write_json(void *root, const char *path)
{
    if (json_dump_file((json_t *)root, path, JSON_INDENT(2) | JSON_REAL_PRECISION(6)) != 0) {
        fprintf(stderr, "kt-bench: cannot write %s: %s\n", path, errno ? strerror(errno) : "json_dump_file failed");
        return 1;
    }
    return 0;
}

uint32_t kt_bench_argmax(const float *x, uint32_t n)
{
    uint32_t best = 0;
    for (uint32_t i = 1; i < n; i++)
        if (x[i] > x[best])
            best = i;
    return best;
}
