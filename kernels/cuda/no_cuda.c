/*
 * no_cuda.c - the CUDA entry points of a build without CUDA: they report that
 * no device can be used, and the scratch sizes the GPU path would take.  Compiled
 * only when nvcc was not found or KT_CUDA=OFF.
 * (kt_cuda_attention_block is plain C in attention_block.c, built always.)
 */
#include "kt_cuda.h"
#include "lt_plan.h"
#include "mla_plan.h"

/* Weak, so a test may link a host emulation of these entry points in their
 * place (tests/cuda_emulated.c). */
#define KT_WEAK __attribute__((weak))

static kt_status no_cuda(kt_err *err)
{
    return kt_err_set(err, KT_ERR_UNSUPPORTED, "kt was built without CUDA");
}

KT_WEAK int kt_cuda_device_count(kt_err *why)
{
    no_cuda(why);
    return 0;
}

KT_WEAK kt_status kt_cuda_dequantize_host(int type, const void *src, float *dst, int64_t n, kt_err *err)
{
    (void)type, (void)src, (void)dst, (void)n;
    return no_cuda(err);
}

KT_WEAK kt_status kt_cuda_dequantize(int type, const void *d_src, float *d_dst, int64_t n, void *stream, kt_err *err)
{
    (void)stream;
    return kt_cuda_dequantize_host(type, d_src, d_dst, n, err);
}

KT_WEAK kt_status kt_cuda_alloc(void **d_ptr, size_t bytes, kt_err *err)
{
    (void)bytes;
    if (d_ptr)
        *d_ptr = NULL;
    return no_cuda(err);
}

KT_WEAK void kt_cuda_free(void *d_ptr)
{
    (void)d_ptr;
}

KT_WEAK kt_status kt_cuda_copy_to_device(void *d_dst, const void *src, size_t bytes, kt_err *err)
{
    (void)d_dst, (void)src, (void)bytes;
    return no_cuda(err);
}

KT_WEAK kt_status kt_cuda_copy_to_host(void *dst, const void *d_src, size_t bytes, kt_err *err)
{
    (void)dst, (void)d_src, (void)bytes;
    return no_cuda(err);
}

KT_WEAK kt_status kt_cuda_synchronize(kt_err *err)
{
    return no_cuda(err);
}

KT_WEAK kt_status kt_cuda_rmsnorm(float *d_y, int64_t y_stride, const float *d_x, int64_t x_stride, const float *d_w,
                                  int64_t rows, int64_t n, float eps, void *stream, kt_err *err)
{
    (void)d_y, (void)y_stride, (void)d_x, (void)x_stride, (void)d_w, (void)rows, (void)n, (void)eps, (void)stream;
    return no_cuda(err);
}

KT_WEAK kt_status kt_cuda_rope(float *d_x, int64_t rows, int64_t row_stride, int64_t n_heads, int64_t head_stride,
                               int64_t offset, const float *d_cos_sin, int64_t n_dims, void *stream, kt_err *err)
{
    (void)d_x, (void)rows, (void)row_stride, (void)n_heads, (void)head_stride, (void)offset, (void)d_cos_sin,
        (void)n_dims, (void)stream;
    return no_cuda(err);
}

KT_WEAK kt_status kt_cuda_swiglu(float *d_out, const float *d_gate, const float *d_up, int64_t n, void *stream,
                                 kt_err *err)
{
    (void)d_out, (void)d_gate, (void)d_up, (void)n, (void)stream;
    return no_cuda(err);
}

KT_WEAK kt_status kt_cuda_add(float *d_y, const float *d_a, const float *d_b, int64_t n, void *stream, kt_err *err)
{
    (void)d_y, (void)d_a, (void)d_b, (void)n, (void)stream;
    return no_cuda(err);
}

KT_WEAK kt_status kt_cuda_softmax(float *d_x, int64_t rows, int64_t n, void *stream, kt_err *err)
{
    (void)d_x, (void)rows, (void)n, (void)stream;
    return no_cuda(err);
}

KT_WEAK kt_status kt_cuda_route(const struct kt_cuda_router *r, const float *d_logits, const float *d_bias,
                                int64_t n_tok, uint32_t *d_experts, float *d_weights, void *stream, kt_err *err)
{
    (void)r, (void)d_logits, (void)d_bias, (void)n_tok, (void)d_experts, (void)d_weights, (void)stream;
    return no_cuda(err);
}

KT_WEAK kt_status kt_cuda_matmul(const struct kt_cuda_mat *w, const float *d_x, int64_t n_tok, float *d_y, int path,
                                 void *stream, kt_err *err)
{
    (void)w, (void)d_x, (void)n_tok, (void)d_y, (void)path, (void)stream;
    return no_cuda(err);
}

/* The sizes the GPU path would take (lt_plan.h, mla_plan.h): a planner on a host
 * without CUDA reserves what the engine on a GPU host takes. */
KT_WEAK size_t kt_cuda_matmul_lt_scratch_bytes(const struct kt_cuda_mat *w, int64_t n_tok)
{
    if (!w || n_tok <= 0)
        return 0;
    return lt_scratch_total(w, n_tok);
}

KT_WEAK kt_status kt_cuda_matmul_lt(const struct kt_cuda_mat *w, const float *d_x, int64_t n_tok, float *d_y,
                                    void *d_scratch, size_t scratch_bytes, void *stream, kt_err *err)
{
    (void)w, (void)d_x, (void)n_tok, (void)d_y, (void)d_scratch, (void)scratch_bytes, (void)stream;
    return no_cuda(err);
}

KT_WEAK kt_status kt_cuda_ffn_units(const struct kt_cuda_ffn_unit *units, uint32_t n_units, const float *d_h,
                                    int64_t n_tok, int64_t n_embd, const uint32_t *d_pair_token, uint32_t n_pairs,
                                    float *d_act, int64_t act_stride, float *d_pair_out, void *stream, kt_err *err)
{
    (void)units, (void)n_units, (void)d_h, (void)n_tok, (void)n_embd, (void)d_pair_token, (void)n_pairs, (void)d_act,
        (void)act_stride, (void)d_pair_out, (void)stream;
    return no_cuda(err);
}

KT_WEAK kt_status kt_cuda_mla_write_rows(const struct kt_cuda_mla *m, const float *d_kv_a, const float *d_norm_w,
                                         float eps, const float *d_cos_sin, const struct kt_cuda_mla_cache *cache,
                                         int64_t n_tok, void *stream, kt_err *err)
{
    (void)m, (void)d_kv_a, (void)d_norm_w, (void)eps, (void)d_cos_sin, (void)cache, (void)n_tok, (void)stream;
    return no_cuda(err);
}

KT_WEAK size_t kt_cuda_mla_scratch_bytes(const struct kt_cuda_mla *m, int64_t n_tok, int64_t n_kv_max)
{
    if (!m || n_tok <= 0 || n_kv_max < 0)
        return 0;
    return mla_scratch_total(m, n_tok, n_kv_max);
}

KT_WEAK kt_status kt_cuda_mla_attention(const struct kt_cuda_mla *m, const float *d_q,
                                        const struct kt_cuda_mla_cache *cache, int64_t n_tok, int64_t n_kv_max,
                                        void *d_scratch, size_t scratch_bytes, float *d_out, void *stream, kt_err *err)
{
    (void)m, (void)d_q, (void)cache, (void)n_tok, (void)n_kv_max, (void)d_scratch, (void)scratch_bytes, (void)d_out,
        (void)stream;
    return no_cuda(err);
}

KT_WEAK kt_status kt_cuda_set_device(int device, kt_err *err)
{
    (void)device;
    return no_cuda(err);
}

KT_WEAK kt_status kt_cuda_mem_info(size_t *free_bytes, size_t *total_bytes, kt_err *err)
{
    *free_bytes = *total_bytes = 0;
    return no_cuda(err);
}

KT_WEAK kt_status kt_cuda_stream_create(void **stream, kt_err *err)
{
    *stream = NULL;
    return no_cuda(err);
}

KT_WEAK void kt_cuda_stream_destroy(void *stream)
{
    (void)stream;
}

KT_WEAK kt_status kt_cuda_copy_async(void *dst, const void *src, size_t bytes, int kind, void *stream, kt_err *err)
{
    (void)dst, (void)src, (void)bytes, (void)kind, (void)stream;
    return no_cuda(err);
}

KT_WEAK kt_status kt_cuda_launch_host(void *stream, void (*fn)(void *), void *ctx, kt_err *err)
{
    (void)stream, (void)fn, (void)ctx;
    return no_cuda(err);
}

KT_WEAK kt_status kt_cuda_stream_synchronize(void *stream, kt_err *err)
{
    (void)stream;
    return no_cuda(err);
}

KT_WEAK kt_status kt_cuda_event_create(void **event, kt_err *err)
{
    *event = NULL;
    return no_cuda(err);
}

KT_WEAK void kt_cuda_event_destroy(void *event)
{
    (void)event;
}

KT_WEAK kt_status kt_cuda_event_record(void *event, void *stream, kt_err *err)
{
    (void)event, (void)stream;
    return no_cuda(err);
}

KT_WEAK kt_status kt_cuda_event_elapsed_ns(void *start, void *end, uint64_t *ns, kt_err *err)
{
    (void)start, (void)end;
    *ns = 0;
    return no_cuda(err);
}

KT_WEAK kt_status kt_cuda_capture_begin(void *stream, kt_err *err)
{
    (void)stream;
    return no_cuda(err);
}

KT_WEAK kt_status kt_cuda_capture_end(void *stream, void **graph_exec, kt_err *err)
{
    (void)stream;
    *graph_exec = NULL;
    return no_cuda(err);
}

KT_WEAK kt_status kt_cuda_graph_launch(void *graph_exec, void *stream, kt_err *err)
{
    (void)graph_exec, (void)stream;
    return no_cuda(err);
}

KT_WEAK void kt_cuda_graph_destroy(void *graph_exec)
{
    (void)graph_exec;
}

KT_WEAK kt_status kt_cuda_host_register(void *ptr, size_t bytes, kt_err *err)
{
    (void)ptr, (void)bytes;
    return no_cuda(err);
}

KT_WEAK void kt_cuda_host_unregister(void *ptr)
{
    (void)ptr;
}

KT_WEAK kt_status kt_cuda_mat_usable(const struct kt_cuda_mat *w, const char *what, kt_err *err)
{
    (void)w, (void)what;
    return no_cuda(err);
}
