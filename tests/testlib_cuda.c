/*
 * testlib_cuda.c - device copies shared by the CUDA kernel tests
 * (testlib.h); in a build without CUDA they fail their check, and the tests
 * skip before calling them.
 */
#include "testlib.h"

#include "kt_cuda.h"

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
