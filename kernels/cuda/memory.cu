/*
 * memory.cu - device memory for C callers that cannot include CUDA's
 * headers: allocation, synchronous copies and a full synchronize, each
 * reporting CUDA's error text (kt_cuda_fail) instead of aborting.
 */
#include "common.cuh"

extern "C" kt_status kt_cuda_alloc(void **d_ptr, size_t bytes, kt_err *err)
{
    if (!d_ptr)
        return kt_err_set(err, KT_ERR_INVALID, "alloc: no pointer to fill");
    *d_ptr = NULL;
    cudaError_t e = cudaMalloc(d_ptr, bytes ? bytes : 1);
    if (e != cudaSuccess) {
        *d_ptr = NULL;
        char what[64];
        snprintf(what, sizeof what, "cudaMalloc of %zu bytes", bytes);
        return kt_cuda_fail(err, what, e);
    }
    return KT_OK;
}

extern "C" void kt_cuda_free(void *d_ptr)
{
    if (d_ptr)
        cudaFree(d_ptr);
}

extern "C" kt_status kt_cuda_copy_to_device(void *d_dst, const void *src, size_t bytes, kt_err *err)
{
    if (bytes == 0)
        return KT_OK;
    if (!d_dst || !src)
        return kt_err_set(err, KT_ERR_INVALID, "copy to device: NULL pointer");
    cudaError_t e = cudaMemcpy(d_dst, src, bytes, cudaMemcpyHostToDevice);
    return e == cudaSuccess ? KT_OK : kt_cuda_fail(err, "copy to device", e);
}

extern "C" kt_status kt_cuda_copy_to_host(void *dst, const void *d_src, size_t bytes, kt_err *err)
{
    if (bytes == 0)
        return KT_OK;
    if (!dst || !d_src)
        return kt_err_set(err, KT_ERR_INVALID, "copy to host: NULL pointer");
    cudaError_t e = cudaMemcpy(dst, d_src, bytes, cudaMemcpyDeviceToHost);
    return e == cudaSuccess ? KT_OK : kt_cuda_fail(err, "copy to host", e);
}

extern "C" kt_status kt_cuda_synchronize(kt_err *err)
{
    cudaError_t e = cudaDeviceSynchronize();
    return e == cudaSuccess ? KT_OK : kt_cuda_fail(err, "synchronize", e);
}
