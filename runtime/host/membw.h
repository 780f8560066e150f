/*
 * membw.h - memory bandwidth reference: a STREAM triad (a = b + s*c) run on
 * the caller's thread count, so kernel throughput can be reported as a ratio
 * measured in the same run on the same cores.  Never prints.
 */
#ifndef KT_MEMBW_H
#define KT_MEMBW_H

#include <stddef.h>

#include "status.h"

struct kt_triad_result {
    double best_gbps;     /* STREAM convention: 3 x 8 bytes per element (2 read, 1 written) */
    double median_gbps;
    size_t array_bytes;   /* bytes of each of the three arrays */
    int threads;
    int repeats;
};

/* array_bytes: size of each array (0 = 256 MiB, well past any cache).
 * threads >= 1; repeats >= 1 (best and median over repeats). */
kt_status kt_stream_triad(size_t array_bytes, int threads, int repeats, struct kt_triad_result *out, kt_err *err);

#endif
