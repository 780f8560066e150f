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
    char why[256] = "", reason[320];
    if (kt_cuda_device_count(why, sizeof why) > 0)
        return 0;
    snprintf(reason, sizeof reason, "no CUDA device (%s)", why);
    return kt_test_skip(reason);
}

void *kt_test_cuda_copy_in(const void *host, size_t bytes)
{
    char msg[256] = "";
    void *d = NULL;
    int rc = kt_cuda_alloc(&d, bytes, msg, sizeof msg);
    KT_CHECK(rc == 0, "%s", msg);
    if (rc == 0 && host) {
        rc = kt_cuda_copy_to_device(d, host, bytes, msg, sizeof msg);
        KT_CHECK(rc == 0, "%s", msg);
    }
    return rc == 0 ? d : NULL;
}

void kt_test_cuda_copy_out(void *host, const void *d, size_t bytes)
{
    char msg[256] = "";
    int rc = kt_cuda_copy_to_host(host, d, bytes, msg, sizeof msg);
    KT_CHECK(rc == 0, "%s", msg);
}
