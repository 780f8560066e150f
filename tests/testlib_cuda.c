/*
 * testlib_cuda.c - device copies shared by the CUDA kernel tests
 * (testlib.h); in a build without CUDA they fail their check, and the tests
 * skip before calling them.
 */
#include "testlib.h"

#include <stdio.h>

#include "kt_cuda.h"

int kt_test_skip_without_cuda(void)
{
    kt_err why = {0};
    char reason[sizeof why.msg + 32];
    if (kt_cuda_device_count(&why) > 0)
        return 0;
    snprintf(reason, sizeof reason, "no CUDA device (%s)", why.msg);
    return kt_test_skip(reason);
}

void *kt_test_cuda_copy_in(const void *host, size_t bytes)
{
    kt_err err = {0};
    void *d = NULL;
    kt_status st = kt_cuda_alloc(&d, bytes, &err);
    KT_CHECK(st == KT_OK, "%s", err.msg);
    if (st == KT_OK && host) {
        st = kt_cuda_copy_to_device(d, host, bytes, &err);
        KT_CHECK(st == KT_OK, "%s", err.msg);
    }
    return st == KT_OK ? d : NULL;
}

void kt_test_cuda_copy_out(void *host, const void *d, size_t bytes)
{
    kt_err err = {0};
    kt_status st = kt_cuda_copy_to_host(host, d, bytes, &err);
    KT_CHECK(st == KT_OK, "%s", err.msg);
}
