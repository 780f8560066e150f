/*
 * memory.cu - device memory for C callers that cannot include CUDA's
 * headers: allocation, synchronous copies and a full synchronize, each
 * reporting CUDA's error text instead of aborting.
 */
#include "common.cuh"

extern "C" int kt_cuda_alloc(void **d_ptr, size_t bytes, char *msg, size_t msg_bytes)
{
    if (!d_ptr)
        return kt_cuda_failf(msg, msg_bytes, "alloc: no pointer to fill");
    *d_ptr = NULL;
    cudaError_t e = cudaMalloc(d_ptr, bytes ? bytes : 1);
    if (e != cudaSuccess) {
        *d_ptr = NULL;
        return kt_cuda_failf(msg, msg_bytes, "cudaMalloc of %zu bytes: %s", bytes, cudaGetErrorString(e));
    }
    return 0;
}

extern "C" void kt_cuda_free(void *d_ptr)
{
    if (d_ptr)
        cudaFree(d_ptr);
}

extern "C" int kt_cuda_copy_to_device(void *d_dst, const void *src, size_t bytes, char *msg, size_t msg_bytes)
{
    if (bytes == 0)
        return 0;
    if (!d_dst || !src)
        return kt_cuda_failf(msg, msg_bytes, "copy to device: NULL pointer");
    cudaError_t e = cudaMemcpy(d_dst, src, bytes, cudaMemcpyHostToDevice);
    return e == cudaSuccess ? 0 : kt_cuda_fail(msg, msg_bytes, "copy to device", e);
}

extern "C" int kt_cuda_copy_to_host(void *dst, const void *d_src, size_t bytes, char *msg, size_t msg_bytes)
{
    if (bytes == 0)
        return 0;
    if (!dst || !d_src)
        return kt_cuda_failf(msg, msg_bytes, "copy to host: NULL pointer");
    cudaError_t e = cudaMemcpy(dst, d_src, bytes, cudaMemcpyDeviceToHost);
    return e == cudaSuccess ? 0 : kt_cuda_fail(msg, msg_bytes, "copy to host", e);
}

extern "C" int kt_cuda_synchronize(char *msg, size_t msg_bytes)
{
    cudaError_t e = cudaDeviceSynchronize();
    return e == cudaSuccess ? 0 : kt_cuda_fail(msg, msg_bytes, "synchronize", e);
}
