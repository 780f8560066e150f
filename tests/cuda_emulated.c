/*
 * cuda_emulated.c - kt_cuda.h's entry points carried out on the host, for
 * tests that drive the engine's cuda path where no GPU exists (linked into
 * test_hybrid_cuda_emulated in builds without CUDA, in place of no_cuda.c's
 * weak stubs).
 *
 * What it proves is the host side: the cuda backend, the engine's device
 * buffers, the arguments it passes (shapes, strides, paged-cache tables,
 * layer offsets, token counts) and the order of the steps, each read the
 * way kt_cuda.h documents it.  The GPU kernels themselves are proved only by
 * the test_cuda_* programs on a GPU.  "Device" memory is host memory, every
 * stream runs its work at once, events read the host clock and nothing is
 * page-locked.  Stream capture records each kernel entry point with its
 * arguments as CUDA would fix them - values, and the host structs they
 * point to, copied at the call - and a graph launch runs them again with
 * those, so an engine that changed a launch argument between replays would
 * read stale ones here as on a GPU; copies and host functions are refused
 * while capturing, as the engine must not put them in a graph.  Each
 * operation computes from kt's CPU reference pieces (to_float, kt_rmsnorm,
 * kt_rope_apply, kt_moe_route) with F32 activations.
 */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kt_cuda.h"
#include "mla_plan.h"
#include "moe.h"
#include "quant.h"
#include "cpu/ref/ops.h"

/* ---- device, memory, streams, events, graphs ------------------------------------- */

static kt_status refused_while_capturing(const char *what, kt_err *err);

int kt_cuda_device_count(kt_err *why)
{
    (void)why;
    return 1;
}

kt_status kt_cuda_set_device(int device, kt_err *err)
{
    return device == 0 ? KT_OK : kt_err_set(err, KT_ERR_INVALID, "emulated device: only device 0");
}

kt_status kt_cuda_mem_info(size_t *free_bytes, size_t *total_bytes, kt_err *err)
{
    (void)err;
    *free_bytes = *total_bytes = (size_t)4 << 30;
    return KT_OK;
}

kt_status kt_cuda_alloc(void **d_ptr, size_t bytes, kt_err *err)
{
    *d_ptr = aligned_alloc(256, (bytes + 255) / 256 * 256 + 256);
    return *d_ptr ? KT_OK : kt_err_set(err, KT_ERR_NOMEM, "emulated device: out of memory");
}

void kt_cuda_free(void *d_ptr)
{
    free(d_ptr);
}

kt_status kt_cuda_copy_to_device(void *d_dst, const void *src, size_t bytes, kt_err *err)
{
    (void)err;
    memcpy(d_dst, src, bytes);
    return KT_OK;
}

kt_status kt_cuda_copy_to_host(void *dst, const void *d_src, size_t bytes, kt_err *err)
{
    return kt_cuda_copy_to_device(dst, d_src, bytes, err);
}

kt_status kt_cuda_synchronize(kt_err *err)
{
    (void)err;
    return KT_OK;
}

static int stream_token;

kt_status kt_cuda_stream_create(void **stream, kt_err *err)
{
    (void)err;
    *stream = &stream_token;
    return KT_OK;
}

void kt_cuda_stream_destroy(void *stream)
{
    (void)stream;
}

kt_status kt_cuda_copy_async(void *dst, const void *src, size_t bytes, int kind, void *stream, kt_err *err)
{
    (void)stream;
    kt_status st = refused_while_capturing("a copy", err);
    if (st != KT_OK)
        return st;
    if (kind < KT_CUDA_TO_HOST || kind > KT_CUDA_ON_DEVICE || (bytes && (!dst || !src)))
        return kt_err_set(err, KT_ERR_INVALID, "emulated copy: kind %d or NULL pointer", kind);
    memmove(dst, src, bytes);
    return KT_OK;
}

kt_status kt_cuda_launch_host(void *stream, void (*fn)(void *), void *ctx, kt_err *err)
{
    (void)stream;
    kt_status st = refused_while_capturing("a host function", err);
    if (st != KT_OK)
        return st;
    fn(ctx);
    return KT_OK;
}

kt_status kt_cuda_stream_synchronize(void *stream, kt_err *err)
{
    (void)stream, (void)err;
    return KT_OK;
}

kt_status kt_cuda_event_create(void **event, kt_err *err)
{
    *event = calloc(1, sizeof(uint64_t));
    return *event ? KT_OK : kt_err_set(err, KT_ERR_NOMEM, "emulated event: out of memory");
}

void kt_cuda_event_destroy(void *event)
{
    free(event);
}

kt_status kt_cuda_event_record(void *event, void *stream, kt_err *err)
{
    (void)stream, (void)err;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    *(uint64_t *)event = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
    return KT_OK;
}

kt_status kt_cuda_event_elapsed_ns(void *start, void *end, uint64_t *ns, kt_err *err)
{
    (void)err;
    const uint64_t a = *(uint64_t *)start, b = *(uint64_t *)end;
    *ns = b > a ? b - a : 0;
    return KT_OK;
}

/* A recorded call: its runner and a copy of its arguments. */
struct call {
    kt_status (*run)(const void *args, kt_err *err);
    void *args;
};

struct graph {
    struct call *calls;
    size_t n, cap;
    bool failed;
};

static struct graph *capturing; /* the stream being captured (there is one stream) */

/* Runs a kernel entry point now, or records it with its arguments. */
/* Tests arm a failure: the n-th kernel run from now (1: the next), directly
 * or in a graph's replay, fails as a GPU launch would, once. */
int kt_cuda_emulated_fail_call;

static kt_status run_kernel(kt_status (*run)(const void *, kt_err *), const void *args, kt_err *err)
{
    if (kt_cuda_emulated_fail_call > 0 && --kt_cuda_emulated_fail_call == 0)
        return kt_err_set(err, KT_ERR_IO, "emulated kernel failure");
    return run(args, err);
}

static kt_status submit(kt_status (*run)(const void *, kt_err *), const void *args, size_t args_bytes, kt_err *err)
{
    if (!capturing)
        return run_kernel(run, args, err);
    struct graph *g = capturing;
    if (g->n == g->cap) {
        const size_t cap = g->cap ? 2 * g->cap : 16;
        struct call *calls = realloc(g->calls, cap * sizeof *calls);
        if (!calls) {
            g->failed = true;
            return kt_err_set(err, KT_ERR_NOMEM, "emulated capture: out of memory");
        }
        g->calls = calls;
        g->cap = cap;
    }
    void *copy = malloc(args_bytes);
    if (!copy) {
        g->failed = true;
        return kt_err_set(err, KT_ERR_NOMEM, "emulated capture: out of memory");
    }
    memcpy(copy, args, args_bytes);
    g->calls[g->n++] = (struct call){run, copy};
    return KT_OK;
}

/* Copies and host functions do not belong in the engine's graphs. */
static kt_status refused_while_capturing(const char *what, kt_err *err)
{
    if (!capturing)
        return KT_OK;
    capturing->failed = true;
    return kt_err_set(err, KT_ERR_INVALID, "emulated capture: %s while capturing", what);
}

static void graph_free(struct graph *g)
{
    for (size_t i = 0; g && i < g->n; i++)
        free(g->calls[i].args);
    if (g)
        free(g->calls);
    free(g);
}

kt_status kt_cuda_capture_begin(void *stream, kt_err *err)
{
    (void)stream;
    if (capturing)
        return kt_err_set(err, KT_ERR_INVALID, "emulated capture: already capturing");
    capturing = calloc(1, sizeof *capturing);
    return capturing ? KT_OK : kt_err_set(err, KT_ERR_NOMEM, "emulated capture: out of memory");
}

kt_status kt_cuda_capture_end(void *stream, void **graph_exec, kt_err *err)
{
    (void)stream;
    struct graph *g = capturing;
    capturing = NULL;
    *graph_exec = NULL;
    if (!g || g->failed) {
        graph_free(g);
        return kt_err_set(err, KT_ERR_INVALID, "emulated capture: %s",
                          g ? "a call failed while capturing" : "not capturing");
    }
    *graph_exec = g;
    return KT_OK;
}

kt_status kt_cuda_graph_launch(void *graph_exec, void *stream, kt_err *err)
{
    (void)stream;
    const struct graph *g = graph_exec;
    if (!g)
        return kt_err_set(err, KT_ERR_INVALID, "emulated graph launch: no graph");
    kt_status st = refused_while_capturing("a graph launch", err);
    for (size_t i = 0; i < g->n && st == KT_OK; i++)
        st = run_kernel(g->calls[i].run, g->calls[i].args, err);
    return st;
}

void kt_cuda_graph_destroy(void *graph_exec)
{
    graph_free(graph_exec);
}

kt_status kt_cuda_host_register(void *ptr, size_t bytes, kt_err *err)
{
    (void)ptr, (void)bytes;
    return kt_err_set(err, KT_ERR_UNSUPPORTED, "page-locking is not emulated");
}

void kt_cuda_host_unregister(void *ptr)
{
    (void)ptr;
}

/* ---- element-wise ops ---------------------------------------------------------------- */

struct rmsnorm_args {
    float *y;
    int64_t y_stride;
    const float *x;
    int64_t x_stride;
    const float *w;
    int64_t rows, n;
    float eps;
};

static kt_status rmsnorm_run(const void *p, kt_err *err)
{
    const struct rmsnorm_args *a = p;
    if (!a->y || !a->x || !a->w || a->x_stride < a->n || a->y_stride < a->n)
        return kt_err_set(err, KT_ERR_INVALID, "emulated rmsnorm: bad arguments");
    for (int64_t r = 0; r < a->rows; r++)
        kt_rmsnorm(a->y + r * a->y_stride, a->x + r * a->x_stride, a->w, a->n, a->eps);
    return KT_OK;
}

kt_status kt_cuda_rmsnorm(float *d_y, int64_t y_stride, const float *d_x, int64_t x_stride, const float *d_w,
                          int64_t rows, int64_t n, float eps, void *stream, kt_err *err)
{
    (void)stream;
    const struct rmsnorm_args a = {d_y, y_stride, d_x, x_stride, d_w, rows, n, eps};
    return submit(rmsnorm_run, &a, sizeof a, err);
}

struct rope_args {
    float *x;
    int64_t rows, row_stride, n_heads, head_stride, offset;
    const float *cos_sin;
    int64_t n_dims;
};

static kt_status rope_run(const void *p, kt_err *err)
{
    const struct rope_args *a = p;
    if (a->n_heads > 1 && a->head_stride < a->offset + a->n_dims)
        return kt_err_set(err, KT_ERR_INVALID, "emulated rope: heads overlap");
    for (int64_t r = 0; r < a->rows; r++)
        for (int64_t h = 0; h < a->n_heads; h++)
            kt_rope_apply(a->x + r * a->row_stride + h * a->head_stride + a->offset, a->cos_sin + r * a->n_dims,
                          (uint32_t)a->n_dims);
    return KT_OK;
}

kt_status kt_cuda_rope(float *d_x, int64_t rows, int64_t row_stride, int64_t n_heads, int64_t head_stride,
                       int64_t offset, const float *d_cos_sin, int64_t n_dims, void *stream, kt_err *err)
{
    (void)stream;
    const struct rope_args a = {d_x, rows, row_stride, n_heads, head_stride, offset, d_cos_sin, n_dims};
    return submit(rope_run, &a, sizeof a, err);
}

struct elementwise_args {
    float *y;
    const float *a, *b; /* softmax: y in place, rows in b's place as a count */
    int64_t n, rows;
};

static kt_status swiglu_run(const void *p, kt_err *err)
{
    const struct elementwise_args *a = p;
    (void)err;
    kt_swiglu(a->y, a->a, a->b, a->n);
    return KT_OK;
}

static kt_status add_run(const void *p, kt_err *err)
{
    const struct elementwise_args *a = p;
    (void)err;
    for (int64_t i = 0; i < a->n; i++)
        a->y[i] = a->a[i] + a->b[i];
    return KT_OK;
}

static kt_status softmax_run(const void *p, kt_err *err)
{
    const struct elementwise_args *a = p;
    (void)err;
    for (int64_t r = 0; r < a->rows; r++)
        kt_softmax(a->y + r * a->n, a->n);
    return KT_OK;
}

kt_status kt_cuda_swiglu(float *d_out, const float *d_gate, const float *d_up, int64_t n, void *stream, kt_err *err)
{
    (void)stream;
    const struct elementwise_args a = {d_out, d_gate, d_up, n, 1};
    return submit(swiglu_run, &a, sizeof a, err);
}

kt_status kt_cuda_add(float *d_y, const float *d_a, const float *d_b, int64_t n, void *stream, kt_err *err)
{
    (void)stream;
    const struct elementwise_args a = {d_y, d_a, d_b, n, 1};
    return submit(add_run, &a, sizeof a, err);
}

kt_status kt_cuda_softmax(float *d_x, int64_t rows, int64_t n, void *stream, kt_err *err)
{
    (void)stream;
    const struct elementwise_args a = {d_x, NULL, NULL, n, rows};
    return submit(softmax_run, &a, sizeof a, err);
}

struct route_args {
    struct kt_cuda_router r;
    const float *logits, *bias;
    int64_t n_tok;
    uint32_t *experts;
    float *weights;
};

static kt_status route_run(const void *p, kt_err *err)
{
    const struct route_args *a = p;
    const struct kt_router kr = {a->r.n_expert, a->r.n_used, a->r.n_groups, a->r.n_group_used,
                                 (enum kt_gating)a->r.gating, a->r.norm != 0, a->r.scale};
    float *scratch = malloc(kt_router_scratch_floats(&kr) * sizeof(float) + sizeof(float));
    if (!scratch)
        return kt_err_set(err, KT_ERR_NOMEM, "emulated route: out of memory");
    for (int64_t t = 0; t < a->n_tok; t++)
        kt_moe_route(&kr, a->logits + t * a->r.n_expert, a->bias, a->experts + t * a->r.n_used,
                     a->weights + t * a->r.n_used, scratch);
    free(scratch);
    return KT_OK;
}

kt_status kt_cuda_route(const struct kt_cuda_router *r, const float *d_logits, const float *d_bias, int64_t n_tok,
                        uint32_t *d_experts, float *d_weights, void *stream, kt_err *err)
{
    (void)stream;
    const struct route_args a = {*r, d_logits, d_bias, n_tok, d_experts, d_weights};
    return submit(route_run, &a, sizeof a, err);
}

/* ---- matmul --------------------------------------------------------------------------- */

/* y (n_tok, n_out) = x (n_tok, n_in) . W^T, rows of W dequantized, double sums; F32
 * activations (the device's GEMV path), or with x and W rounded to BF16 first
 * (its TENSOR and cuBLASLt paths), so the emulated GPU differs from the CPU as
 * the real one does. */
static float as_bf16(float v)
{
    return kt_bf16_to_fp32(kt_fp32_to_bf16(v));
}

static kt_status matmul(const struct kt_cuda_mat *w, const float *x, int64_t x_stride, int64_t n_tok, float *y,
                        int64_t y_stride, bool bf16, kt_err *err)
{
    const struct kt_type_traits *tr = kt_type_traits(w->type);
    if (!w->data || !tr || !tr->to_float || !x || !y || w->n_in <= 0)
        return kt_err_set(err, KT_ERR_INVALID, "emulated matmul: bad weight or pointer");
    const size_t row_bytes = w->row_bytes ? w->row_bytes : kt_type_row_bytes(w->type, w->n_in);
    float *row = malloc((size_t)w->n_in * sizeof *row);
    if (!row)
        return kt_err_set(err, KT_ERR_NOMEM, "emulated matmul: out of memory");
    for (int64_t o = 0; o < w->n_out; o++) {
        tr->to_float((const uint8_t *)w->data + (size_t)o * row_bytes, row, w->n_in);
        for (int64_t i = 0; bf16 && i < w->n_in; i++)
            row[i] = as_bf16(row[i]);
        for (int64_t t = 0; t < n_tok; t++) {
            double s = 0;
            for (int64_t i = 0; i < w->n_in; i++)
                s += (double)row[i] * (bf16 ? as_bf16(x[t * x_stride + i]) : x[t * x_stride + i]);
            y[t * y_stride + o] = (float)s;
        }
    }
    free(row);
    return KT_OK;
}

kt_status kt_cuda_mat_usable(const struct kt_cuda_mat *w, const char *what, kt_err *err)
{
    const struct kt_type_traits *tr = w ? kt_type_traits(w->type) : NULL;
    if (!w || !w->data || !tr || !tr->to_float || w->n_in <= 0 || w->n_out <= 0)
        return kt_err_set(err, KT_ERR_UNSUPPORTED, "%s: not usable by the emulated GPU", what);
    return KT_OK;
}

struct matmul_args {
    struct kt_cuda_mat w;
    const float *x;
    int64_t n_tok;
    float *y;
    bool bf16;
};

static kt_status matmul_run(const void *p, kt_err *err)
{
    const struct matmul_args *a = p;
    return matmul(&a->w, a->x, a->w.n_in, a->n_tok, a->y, a->w.n_out, a->bf16, err);
}

kt_status kt_cuda_matmul(const struct kt_cuda_mat *w, const float *d_x, int64_t n_tok, float *d_y, int path,
                         void *stream, kt_err *err)
{
    (void)stream;
    const bool bf16 = path == KT_CUDA_MATMUL_TENSOR || (path == KT_CUDA_MATMUL_AUTO && n_tok > 8);
    const struct matmul_args a = {*w, d_x, n_tok, d_y, bf16};
    return submit(matmul_run, &a, sizeof a, err);
}

size_t kt_cuda_matmul_lt_scratch_bytes(const struct kt_cuda_mat *w, int64_t n_tok)
{
    return w && n_tok > 0 ? 256 : 0;
}

kt_status kt_cuda_matmul_lt(const struct kt_cuda_mat *w, const float *d_x, int64_t n_tok, float *d_y, void *d_scratch,
                            size_t scratch_bytes, void *stream, kt_err *err)
{
    if (!d_scratch || scratch_bytes < kt_cuda_matmul_lt_scratch_bytes(w, n_tok))
        return kt_err_set(err, KT_ERR_INVALID, "emulated matmul_lt: scratch");
    return kt_cuda_matmul(w, d_x, n_tok, d_y, KT_CUDA_MATMUL_TENSOR, stream, err);
}

kt_status kt_cuda_ffn_units(const struct kt_cuda_ffn_unit *units, uint32_t n_units, const float *d_h, int64_t n_tok,
                            int64_t n_embd, const uint32_t *d_pair_token, uint32_t n_pairs, float *d_act,
                            int64_t act_stride, float *d_pair_out, void *stream, kt_err *err)
{
    (void)stream;
    kt_status st = refused_while_capturing("FFN units (their unit list changes every step)", err);
    if (st != KT_OK)
        return st;
    for (uint32_t u = 0; u < n_units; u++) {
        const struct kt_cuda_ffn_unit *un = &units[u];
        const int64_t n_ff = un->gate.n_out;
        const bool bf16 = un->n_pairs > 8; /* the TENSOR path's units */
        if (un->first_pair + un->n_pairs > n_pairs || n_ff > act_stride || un->gate.n_in != n_embd)
            return kt_err_set(err, KT_ERR_INVALID, "emulated ffn units: unit %u out of range", u);
        float *gate = malloc((size_t)(n_ff * 2) * sizeof *gate), *hx = malloc((size_t)n_embd * sizeof *hx);
        if (!gate || !hx) {
            free(gate), free(hx);
            return kt_err_set(err, KT_ERR_NOMEM, "emulated ffn units: out of memory");
        }
        for (uint32_t p = un->first_pair; p < un->first_pair + un->n_pairs && st == KT_OK; p++) {
            const uint32_t t = d_pair_token[p];
            for (int64_t i = 0; i < n_embd; i++) /* a token >= n_tok reads zeros */
                hx[i] = t < n_tok ? d_h[(int64_t)t * n_embd + i] : 0.0f;
            float *act = d_act + (int64_t)p * act_stride;
            if ((st = matmul(&un->gate, hx, n_embd, 1, gate, n_ff, bf16, err)) == KT_OK &&
                (st = matmul(&un->up, hx, n_embd, 1, gate + n_ff, n_ff, bf16, err)) == KT_OK) {
                kt_swiglu(act, gate, gate + n_ff, n_ff);
                st = matmul(&un->down, act, n_ff, 1, d_pair_out + (int64_t)p * n_embd, n_embd, bf16, err);
            }
        }
        free(gate), free(hx);
        if (st != KT_OK)
            return st;
    }
    return KT_OK;
}

/* ---- MLA -------------------------------------------------------------------------------- */

/* Row j of token t's context, as struct kt_cuda_mla_cache lays it out. */
static void *cache_row(const struct kt_cuda_mla_cache *c, int64_t t, int64_t j, int64_t D)
{
    const int64_t block = c->block_ids[c->first_block[t] + j / c->block_tokens];
    return (uint8_t *)c->pool + (size_t)(block * c->block_elems + c->layer_offset + (j % c->block_tokens) * D) *
                                    kt_row_type_size((enum kt_row_type)c->row_type);
}

static kt_status check_cache(const struct kt_cuda_mla_cache *c, kt_err *err)
{
    if (!c || !c->pool || !c->block_ids || !c->first_block || !c->n_kv || c->block_tokens < 1 ||
        c->row_type < 0 || c->row_type >= KT_ROW_TYPE_COUNT)
        return kt_err_set(err, KT_ERR_INVALID, "emulated mla: bad cache");
    return KT_OK;
}

/* The shapes mla.cu takes (mla_plan.h), refused as it refuses them. */
static kt_status check_mla_shape(const struct kt_cuda_mla *m, kt_err *err)
{
    if (!m || !mla_shape_supported(m))
        return kt_err_set(err, m ? KT_ERR_UNSUPPORTED : KT_ERR_INVALID, "emulated mla: unsupported shape");
    return KT_OK;
}

/* The GPU path's own sizing (mla_plan.h), so the engine's scratch is checked as a GPU would. */
size_t kt_cuda_mla_scratch_bytes(const struct kt_cuda_mla *m, int64_t n_tok, int64_t n_kv_max)
{
    if (!m || !mla_shape_supported(m) || n_tok <= 0 || n_kv_max < 0)
        return 0;
    return mla_scratch_total(m, n_tok, n_kv_max);
}

struct mla_args {
    struct kt_cuda_mla m;
    struct kt_cuda_mla_cache cache;
    const float *kv_a, *norm_w, *cos_sin; /* rows */
    float eps;
    const float *q;                       /* attention */
    int64_t n_tok, n_kv_max;
    float *out;
};

static kt_status mla_rows_run(const void *p, kt_err *err)
{
    const struct mla_args *a = p;
    const kt_status st = check_cache(&a->cache, err);
    if (st != KT_OK)
        return st;
    const int64_t kvr = a->m.kv_rank, dr = a->m.rope_dim, D = kvr + dr;
    const enum kt_row_type rt = (enum kt_row_type)a->cache.row_type;
    float *row = malloc((size_t)D * sizeof *row);
    if (!row)
        return kt_err_set(err, KT_ERR_NOMEM, "emulated mla: out of memory");
    for (int64_t t = 0; t < a->n_tok; t++) {
        if (a->cache.n_kv[t] == 0)
            continue;
        kt_rmsnorm(row, a->kv_a + t * D, a->norm_w, kvr, a->eps);
        memcpy(row + kvr, a->kv_a + t * D + kvr, (size_t)dr * sizeof *row);
        kt_rope_apply(row + kvr, a->cos_sin + t * dr, (uint32_t)dr);
        kt_row_from_f32(rt, cache_row(&a->cache, t, (int64_t)a->cache.n_kv[t] - 1, D), row, D); /* rounded as stored */
    }
    free(row);
    return KT_OK;
}

kt_status kt_cuda_mla_write_rows(const struct kt_cuda_mla *m, const float *d_kv_a, const float *d_norm_w, float eps,
                                 const float *d_cos_sin, const struct kt_cuda_mla_cache *cache, int64_t n_tok,
                                 void *stream, kt_err *err)
{
    (void)stream;
    kt_status st = check_mla_shape(m, err);
    if (st == KT_OK)
        st = check_cache(cache, err);
    if (st != KT_OK)
        return st;
    const struct mla_args a = {.m = *m, .cache = *cache, .kv_a = d_kv_a, .norm_w = d_norm_w, .cos_sin = d_cos_sin,
                               .eps = eps, .n_tok = n_tok};
    return submit(mla_rows_run, &a, sizeof a, err);
}

static kt_status mla_attention_run(const void *p, kt_err *err)
{
    const struct mla_args *a = p;
    const struct kt_cuda_mla *m = &a->m;
    const struct kt_cuda_mla_cache *cache = &a->cache;
    const float *d_q = a->q;
    float *d_out = a->out;
    const int64_t n_tok = a->n_tok, n_kv_max = a->n_kv_max;
    const int64_t H = m->n_head, dn = m->nope_dim, dr = m->rope_dim, dv = m->v_dim, kvr = m->kv_rank, D = kvr + dr;
    float *query = malloc((size_t)D * sizeof *query), *o_lat = malloc((size_t)kvr * sizeof *o_lat);
    float *scores = malloc((size_t)(n_kv_max > 0 ? n_kv_max : 1) * sizeof *scores);
    float *row = malloc((size_t)D * sizeof *row); /* one cache row, widened */
    const enum kt_row_type rt = (enum kt_row_type)cache->row_type;
    kt_status st =
        query && o_lat && scores && row ? KT_OK : kt_err_set(err, KT_ERR_NOMEM, "emulated mla: out of memory");
    for (int64_t t = 0; t < n_tok && st == KT_OK; t++) {
        const int64_t n_kv = cache->n_kv[t];
        if (n_kv > n_kv_max) {
            st = kt_err_set(err, KT_ERR_INVALID, "emulated mla: token %lld has %lld rows, more than n_kv_max %lld",
                            (long long)t, (long long)n_kv, (long long)n_kv_max);
            break;
        }
        for (int64_t h = 0; h < H && st == KT_OK; h++) {
            const float *q = d_q + (t * H + h) * (dn + dr);
            /* q_abs[r] = W_UK,h column r . q_nope: attn_k_b's row h*kvr + r */
            struct kt_cuda_mat uk = m->w_uk;
            const size_t uk_row = uk.row_bytes ? uk.row_bytes : kt_type_row_bytes(uk.type, dn);
            uk.data = (const uint8_t *)uk.data + (size_t)(h * kvr) * uk_row;
            uk.n_out = kvr;
            st = matmul(&uk, q, dn, 1, query, kvr, false, err);
            memcpy(query + kvr, q + dn, (size_t)dr * sizeof *query);
            for (int64_t j = 0; j < n_kv; j++) {
                kt_row_to_f32(rt, row, cache_row(cache, t, j, D), D);
                double s = 0;
                for (int64_t i = 0; i < D; i++)
                    s += (double)query[i] * row[i];
                scores[j] = (float)s * m->kq_scale;
            }
            kt_softmax(scores, n_kv);
            for (int64_t i = 0; i < kvr; i++)
                o_lat[i] = 0.0f;
            for (int64_t j = 0; j < n_kv; j++) {
                kt_row_to_f32(rt, row, cache_row(cache, t, j, D), kvr);
                for (int64_t i = 0; i < kvr; i++)
                    o_lat[i] += scores[j] * row[i];
            }
            struct kt_cuda_mat uv = m->w_uv;
            const size_t uv_row = uv.row_bytes ? uv.row_bytes : kt_type_row_bytes(uv.type, kvr);
            uv.data = (const uint8_t *)uv.data + (size_t)(h * dv) * uv_row;
            uv.n_out = dv;
            if (st == KT_OK)
                st = matmul(&uv, o_lat, kvr, 1, d_out + (t * H + h) * dv, dv, false, err);
        }
    }
    free(query), free(o_lat), free(scores), free(row);
    return st;
}

kt_status kt_cuda_mla_attention(const struct kt_cuda_mla *m, const float *d_q, const struct kt_cuda_mla_cache *cache,
                                int64_t n_tok, int64_t n_kv_max, void *d_scratch, size_t scratch_bytes, float *d_out,
                                void *stream, kt_err *err)
{
    (void)stream;
    kt_status st = check_mla_shape(m, err);
    if (st == KT_OK)
        st = check_cache(cache, err);
    if (st != KT_OK)
        return st;
    if (!d_scratch || scratch_bytes < kt_cuda_mla_scratch_bytes(m, n_tok, n_kv_max))
        return kt_err_set(err, KT_ERR_INVALID, "emulated mla: scratch");
    const struct mla_args a = {.m = *m, .cache = *cache, .q = d_q, .n_tok = n_tok, .n_kv_max = n_kv_max, .out = d_out};
    return submit(mla_attention_run, &a, sizeof a, err);
}
