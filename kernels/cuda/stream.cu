/*
 * stream.cu - what the cuda backend (runtime/forward/backend.c) needs from the CUDA
 * runtime that C code cannot reach without CUDA's headers: choosing the
 * device, its free memory, one stream, asynchronous copies on it, host
 * functions in stream order, and waiting for the stream.  Errors come back
 * as a kt_status with CUDA's text (kt_cuda_fail); nothing here aborts.
 */
#include "common.cuh"

extern "C" kt_status kt_cuda_set_device(int device, kt_err *err)
{
    cudaError_t e = cudaSetDevice(device);
    return e == cudaSuccess ? KT_OK : kt_cuda_fail(err, "set device", e);
}

extern "C" kt_status kt_cuda_mem_info(size_t *free_bytes, size_t *total_bytes, kt_err *err)
{
    cudaError_t e = cudaMemGetInfo(free_bytes, total_bytes);
    return e == cudaSuccess ? KT_OK : kt_cuda_fail(err, "memory info", e);
}

extern "C" kt_status kt_cuda_stream_create(void **stream, kt_err *err)
{
    cudaStream_t s = NULL;
    cudaError_t e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    *stream = e == cudaSuccess ? (void *)s : NULL;
    return e == cudaSuccess ? KT_OK : kt_cuda_fail(err, "create stream", e);
}

extern "C" void kt_cuda_stream_destroy(void *stream)
{
    if (stream)
        cudaStreamDestroy((cudaStream_t)stream);
}

extern "C" kt_status kt_cuda_copy_async(void *dst, const void *src, size_t bytes, int kind, void *stream, kt_err *err)
{
    static const cudaMemcpyKind kinds[] = {cudaMemcpyDeviceToHost, cudaMemcpyHostToDevice, cudaMemcpyDeviceToDevice};
    static const char *const what[] = {"copy to host", "copy to device", "copy within the device"};
    if (kind < KT_CUDA_TO_HOST || kind > KT_CUDA_ON_DEVICE)
        return kt_err_set(err, KT_ERR_INVALID, "async copy: unknown kind %d", kind);
    if (bytes == 0)
        return KT_OK;
    if (!dst || !src)
        return kt_err_set(err, KT_ERR_INVALID, "async copy: NULL pointer");
    cudaError_t e = cudaMemcpyAsync(dst, src, bytes, kinds[kind], (cudaStream_t)stream);
    return e == cudaSuccess ? KT_OK : kt_cuda_fail(err, what[kind], e);
}

extern "C" kt_status kt_cuda_launch_host(void *stream, void (*fn)(void *), void *ctx, kt_err *err)
{
    cudaError_t e = cudaLaunchHostFunc((cudaStream_t)stream, fn, ctx);
    return e == cudaSuccess ? KT_OK : kt_cuda_fail(err, "host function in stream", e);
}

extern "C" kt_status kt_cuda_stream_synchronize(void *stream, kt_err *err)
{
    cudaError_t e = cudaStreamSynchronize((cudaStream_t)stream);
    return e == cudaSuccess ? KT_OK : kt_cuda_fail(err, "stream synchronize", e);
}

extern "C" kt_status kt_cuda_event_create(void **event, kt_err *err)
{
    cudaEvent_t ev = NULL;
    cudaError_t e = cudaEventCreate(&ev); /* timing enabled */
    *event = e == cudaSuccess ? (void *)ev : NULL;
    return e == cudaSuccess ? KT_OK : kt_cuda_fail(err, "create event", e);
}

extern "C" void kt_cuda_event_destroy(void *event)
{
    if (event)
        cudaEventDestroy((cudaEvent_t)event);
}

extern "C" kt_status kt_cuda_event_record(void *event, void *stream, kt_err *err)
{
    cudaError_t e = cudaEventRecord((cudaEvent_t)event, (cudaStream_t)stream);
    return e == cudaSuccess ? KT_OK : kt_cuda_fail(err, "record event", e);
}

extern "C" kt_status kt_cuda_event_elapsed_ns(void *start, void *end, uint64_t *ns, kt_err *err)
{
    float ms = 0.0f;
    cudaError_t e = cudaEventElapsedTime(&ms, (cudaEvent_t)start, (cudaEvent_t)end);
    *ns = e == cudaSuccess && ms > 0.0f ? (uint64_t)((double)ms * 1e6) : 0;
    return e == cudaSuccess ? KT_OK : kt_cuda_fail(err, "event elapsed time", e);
}

extern "C" kt_status kt_cuda_capture_begin(void *stream, kt_err *err)
{
    cudaError_t e = cudaStreamBeginCapture((cudaStream_t)stream, cudaStreamCaptureModeThreadLocal);
    return e == cudaSuccess ? KT_OK : kt_cuda_fail(err, "begin graph capture", e);
}

extern "C" kt_status kt_cuda_capture_end(void *stream, void **graph_exec, kt_err *err)
{
    cudaGraph_t graph = NULL;
    cudaGraphExec_t exec = NULL;
    *graph_exec = NULL;
    cudaError_t e = cudaStreamEndCapture((cudaStream_t)stream, &graph);
    if (e != cudaSuccess)
        return kt_cuda_fail(err, "end graph capture", e);
    e = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph); /* the executable graph keeps what it needs */
    if (e != cudaSuccess)
        return kt_cuda_fail(err, "instantiate graph", e);
    *graph_exec = (void *)exec;
    return KT_OK;
}

extern "C" kt_status kt_cuda_graph_launch(void *graph_exec, void *stream, kt_err *err)
{
    cudaError_t e = cudaGraphLaunch((cudaGraphExec_t)graph_exec, (cudaStream_t)stream);
    return e == cudaSuccess ? KT_OK : kt_cuda_fail(err, "launch graph", e);
}

extern "C" void kt_cuda_graph_destroy(void *graph_exec)
{
    if (graph_exec)
        cudaGraphExecDestroy((cudaGraphExec_t)graph_exec);
}

extern "C" kt_status kt_cuda_host_register(void *ptr, size_t bytes, kt_err *err)
{
    cudaError_t e = cudaHostRegister(ptr, bytes, cudaHostRegisterDefault);
    return e == cudaSuccess ? KT_OK : kt_cuda_fail(err, "pin host memory", e);
}

extern "C" void kt_cuda_host_unregister(void *ptr)
{
    if (ptr)
        cudaHostUnregister(ptr);
}
