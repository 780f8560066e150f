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
 * stream runs its work at once, events read the host clock, stream capture
 * is refused (so the engine's fallback from graphs runs) and nothing is
 * page-locked.  Each operation computes from kt's CPU reference pieces
 * (to_float, kt_rmsnorm, kt_rope_apply, kt_moe_route) with F32 activations.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kt_cuda.h"
#include "moe.h"
#include "quant.h"
#include "cpu/ref/ops.h"

/* ---- device, memory, streams, events, graphs ------------------------------------- */

int kt_cuda_device_count(char *why, size_t why_bytes)
{
    (void)why, (void)why_bytes;
    return 1;
}

int kt_cuda_set_device(int device, char *msg, size_t msg_bytes)
{
    (void)msg, (void)msg_bytes;
    return device == 0 ? 0 : -1;
}

int kt_cuda_mem_info(size_t *free_bytes, size_t *total_bytes, char *msg, size_t msg_bytes)
{
    (void)msg, (void)msg_bytes;
    *free_bytes = *total_bytes = (size_t)4 << 30;
    return 0;
}

int kt_cuda_alloc(void **d_ptr, size_t bytes, char *msg, size_t msg_bytes)
{
    *d_ptr = aligned_alloc(256, (bytes + 255) / 256 * 256 + 256);
    if (!*d_ptr && msg && msg_bytes)
        snprintf(msg, msg_bytes, "emulated device: out of memory");
    return *d_ptr ? 0 : -1;
}

void kt_cuda_free(void *d_ptr)
{
    free(d_ptr);
}

int kt_cuda_copy_to_device(void *d_dst, const void *src, size_t bytes, char *msg, size_t msg_bytes)
{
    (void)msg, (void)msg_bytes;
    memcpy(d_dst, src, bytes);
    return 0;
}

int kt_cuda_copy_to_host(void *dst, const void *d_src, size_t bytes, char *msg, size_t msg_bytes)
{
    return kt_cuda_copy_to_device(dst, d_src, bytes, msg, msg_bytes);
}

int kt_cuda_synchronize(char *msg, size_t msg_bytes)
{
    (void)msg, (void)msg_bytes;
    return 0;
}

static int stream_token;

int kt_cuda_stream_create(void **stream, char *msg, size_t msg_bytes)
{
    (void)msg, (void)msg_bytes;
    *stream = &stream_token;
    return 0;
}

void kt_cuda_stream_destroy(void *stream)
{
    (void)stream;
}

int kt_cuda_copy_async(void *dst, const void *src, size_t bytes, int kind, void *stream, char *msg, size_t msg_bytes)
{
    (void)stream;
    if (kind < KT_CUDA_TO_HOST || kind > KT_CUDA_ON_DEVICE || (bytes && (!dst || !src))) {
        snprintf(msg, msg_bytes, "emulated copy: kind %d or NULL pointer", kind);
        return -1;
    }
    memmove(dst, src, bytes);
    return 0;
}

int kt_cuda_launch_host(void *stream, void (*fn)(void *), void *ctx, char *msg, size_t msg_bytes)
{
    (void)stream, (void)msg, (void)msg_bytes;
    fn(ctx);
    return 0;
}

int kt_cuda_stream_synchronize(void *stream, char *msg, size_t msg_bytes)
{
    (void)stream, (void)msg, (void)msg_bytes;
    return 0;
}

int kt_cuda_event_create(void **event, char *msg, size_t msg_bytes)
{
    (void)msg, (void)msg_bytes;
    *event = calloc(1, sizeof(uint64_t));
    return *event ? 0 : -1;
}

void kt_cuda_event_destroy(void *event)
{
    free(event);
}

int kt_cuda_event_record(void *event, void *stream, char *msg, size_t msg_bytes)
{
    (void)stream, (void)msg, (void)msg_bytes;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    *(uint64_t *)event = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
    return 0;
}

int kt_cuda_event_elapsed_ns(void *start, void *end, uint64_t *ns, char *msg, size_t msg_bytes)
{
    (void)msg, (void)msg_bytes;
    const uint64_t a = *(uint64_t *)start, b = *(uint64_t *)end;
    *ns = b > a ? b - a : 0;
    return 0;
}

int kt_cuda_capture_begin(void *stream, char *msg, size_t msg_bytes)
{
    (void)stream;
    snprintf(msg, msg_bytes, "graphs are not emulated");
    return -1;
}

int kt_cuda_capture_end(void *stream, void **graph_exec, char *msg, size_t msg_bytes)
{
    (void)stream;
    *graph_exec = NULL;
    snprintf(msg, msg_bytes, "graphs are not emulated");
    return -1;
}

int kt_cuda_graph_launch(void *graph_exec, void *stream, char *msg, size_t msg_bytes)
{
    (void)graph_exec, (void)stream;
    snprintf(msg, msg_bytes, "graphs are not emulated");
    return -1;
}

void kt_cuda_graph_destroy(void *graph_exec)
{
    (void)graph_exec;
}

int kt_cuda_host_register(void *ptr, size_t bytes, char *msg, size_t msg_bytes)
{
    (void)ptr, (void)bytes;
    snprintf(msg, msg_bytes, "page-locking is not emulated");
    return -1;
}

void kt_cuda_host_unregister(void *ptr)
{
    (void)ptr;
}

/* ---- element-wise ops ---------------------------------------------------------------- */

int kt_cuda_rmsnorm(float *d_y, int64_t y_stride, const float *d_x, int64_t x_stride, const float *d_w, int64_t rows,
                    int64_t n, float eps, void *stream, char *msg, size_t msg_bytes)
{
    (void)stream;
    if (!d_y || !d_x || !d_w || x_stride < n || y_stride < n) {
        snprintf(msg, msg_bytes, "emulated rmsnorm: bad arguments");
        return -1;
    }
    for (int64_t r = 0; r < rows; r++)
        kt_rmsnorm(d_y + r * y_stride, d_x + r * x_stride, d_w, n, eps);
    return 0;
}

int kt_cuda_rope(float *d_x, int64_t rows, int64_t row_stride, int64_t n_heads, int64_t head_stride, int64_t offset,
                 const float *d_cos_sin, int64_t n_dims, void *stream, char *msg, size_t msg_bytes)
{
    (void)stream;
    if (n_heads > 1 && head_stride < offset + n_dims) {
        snprintf(msg, msg_bytes, "emulated rope: heads overlap");
        return -1;
    }
    for (int64_t r = 0; r < rows; r++)
        for (int64_t h = 0; h < n_heads; h++)
            kt_rope_apply(d_x + r * row_stride + h * head_stride + offset, d_cos_sin + r * n_dims, (uint32_t)n_dims);
    return 0;
}

int kt_cuda_swiglu(float *d_out, const float *d_gate, const float *d_up, int64_t n, void *stream, char *msg,
                   size_t msg_bytes)
{
    (void)stream, (void)msg, (void)msg_bytes;
    kt_swiglu(d_out, d_gate, d_up, n);
    return 0;
}

int kt_cuda_add(float *d_y, const float *d_a, const float *d_b, int64_t n, void *stream, char *msg, size_t msg_bytes)
{
    (void)stream, (void)msg, (void)msg_bytes;
    for (int64_t i = 0; i < n; i++)
        d_y[i] = d_a[i] + d_b[i];
    return 0;
}

int kt_cuda_softmax(float *d_x, int64_t rows, int64_t n, void *stream, char *msg, size_t msg_bytes)
{
    (void)stream, (void)msg, (void)msg_bytes;
    for (int64_t r = 0; r < rows; r++)
        kt_softmax(d_x + r * n, n);
    return 0;
}

int kt_cuda_route(const struct kt_cuda_router *r, const float *d_logits, const float *d_bias, int64_t n_tok,
                  uint32_t *d_experts, float *d_weights, void *stream, char *msg, size_t msg_bytes)
{
    (void)stream;
    const struct kt_router kr = {r->n_expert, r->n_used, r->n_groups, r->n_group_used, (enum kt_gating)r->gating,
                                 r->norm != 0, r->scale};
    float *scratch = malloc(kt_router_scratch_floats(&kr) * sizeof(float) + sizeof(float));
    if (!scratch) {
        snprintf(msg, msg_bytes, "emulated route: out of memory");
        return -1;
    }
    for (int64_t t = 0; t < n_tok; t++)
        kt_moe_route(&kr, d_logits + t * r->n_expert, d_bias, d_experts + t * r->n_used, d_weights + t * r->n_used,
                     scratch);
    free(scratch);
    return 0;
}

/* ---- matmul --------------------------------------------------------------------------- */

/* y (n_tok, n_out) = x (n_tok, n_in) . W^T, rows of W dequantized, F32 activations, double sums. */
static int matmul(const struct kt_cuda_mat *w, const float *x, int64_t x_stride, int64_t n_tok, float *y,
                  int64_t y_stride, char *msg, size_t msg_bytes)
{
    const struct kt_type_traits *tr = kt_type_traits(w->type);
    if (!w->data || !tr || !tr->to_float || !x || !y || w->n_in <= 0) {
        snprintf(msg, msg_bytes, "emulated matmul: bad weight or pointer");
        return -1;
    }
    const size_t row_bytes = w->row_bytes ? w->row_bytes : kt_type_row_bytes(w->type, w->n_in);
    float *row = malloc((size_t)w->n_in * sizeof *row);
    if (!row) {
        snprintf(msg, msg_bytes, "emulated matmul: out of memory");
        return -1;
    }
    for (int64_t o = 0; o < w->n_out; o++) {
        tr->to_float((const uint8_t *)w->data + (size_t)o * row_bytes, row, w->n_in);
        for (int64_t t = 0; t < n_tok; t++) {
            double s = 0;
            for (int64_t i = 0; i < w->n_in; i++)
                s += (double)row[i] * x[t * x_stride + i];
            y[t * y_stride + o] = (float)s;
        }
    }
    free(row);
    return 0;
}

int kt_cuda_matmul(const struct kt_cuda_mat *w, const float *d_x, int64_t n_tok, float *d_y, int path, void *stream,
                   char *msg, size_t msg_bytes)
{
    (void)path, (void)stream;
    return matmul(w, d_x, w->n_in, n_tok, d_y, w->n_out, msg, msg_bytes);
}

size_t kt_cuda_matmul_lt_scratch_bytes(const struct kt_cuda_mat *w, int64_t n_tok)
{
    return w && n_tok > 0 ? 256 : 0;
}

int kt_cuda_matmul_lt(const struct kt_cuda_mat *w, const float *d_x, int64_t n_tok, float *d_y, void *d_scratch,
                      size_t scratch_bytes, void *stream, char *msg, size_t msg_bytes)
{
    if (!d_scratch || scratch_bytes < kt_cuda_matmul_lt_scratch_bytes(w, n_tok)) {
        snprintf(msg, msg_bytes, "emulated matmul_lt: scratch");
        return -1;
    }
    return kt_cuda_matmul(w, d_x, n_tok, d_y, KT_CUDA_MATMUL_AUTO, stream, msg, msg_bytes);
}

int kt_cuda_ffn_units(const struct kt_cuda_ffn_unit *units, uint32_t n_units, const float *d_h, int64_t n_tok,
                      int64_t n_embd, const uint32_t *d_pair_token, uint32_t n_pairs, float *d_act,
                      int64_t act_stride, float *d_pair_out, void *stream, char *msg, size_t msg_bytes)
{
    (void)stream;
    for (uint32_t u = 0; u < n_units; u++) {
        const struct kt_cuda_ffn_unit *un = &units[u];
        const int64_t n_ff = un->gate.n_out;
        if (un->first_pair + un->n_pairs > n_pairs || n_ff > act_stride || un->gate.n_in != n_embd) {
            snprintf(msg, msg_bytes, "emulated ffn units: unit %u out of range", u);
            return -1;
        }
        float *gate = malloc((size_t)(n_ff * 2) * sizeof *gate), *hx = malloc((size_t)n_embd * sizeof *hx);
        if (!gate || !hx) {
            free(gate), free(hx);
            snprintf(msg, msg_bytes, "emulated ffn units: out of memory");
            return -1;
        }
        int rc = 0;
        for (uint32_t p = un->first_pair; p < un->first_pair + un->n_pairs && rc == 0; p++) {
            const uint32_t t = d_pair_token[p];
            for (int64_t i = 0; i < n_embd; i++) /* a token >= n_tok reads zeros */
                hx[i] = t < n_tok ? d_h[(int64_t)t * n_embd + i] : 0.0f;
            float *act = d_act + (int64_t)p * act_stride;
            rc = matmul(&un->gate, hx, n_embd, 1, gate, n_ff, msg, msg_bytes) ||
                 matmul(&un->up, hx, n_embd, 1, gate + n_ff, n_ff, msg, msg_bytes);
            if (rc == 0) {
                kt_swiglu(act, gate, gate + n_ff, n_ff);
                rc = matmul(&un->down, act, n_ff, 1, d_pair_out + (int64_t)p * n_embd, n_embd, msg, msg_bytes);
            }
        }
        free(gate), free(hx);
        if (rc)
            return -1;
    }
    return 0;
}

/* ---- MLA -------------------------------------------------------------------------------- */

/* Row j of token t's context, as struct kt_cuda_mla_cache lays it out. */
static float *cache_row(const struct kt_cuda_mla_cache *c, int64_t t, int64_t j, int64_t D)
{
    const int64_t block = c->block_ids[c->first_block[t] + j / c->block_tokens];
    return c->pool + block * c->block_floats + c->layer_offset + (j % c->block_tokens) * D;
}

static int check_cache(const struct kt_cuda_mla_cache *c, char *msg, size_t msg_bytes)
{
    if (!c || !c->pool || !c->block_ids || !c->first_block || !c->n_kv || c->block_tokens < 1) {
        snprintf(msg, msg_bytes, "emulated mla: bad cache");
        return -1;
    }
    return 0;
}

size_t kt_cuda_mla_scratch_bytes(const struct kt_cuda_mla *m, int64_t n_tok, int64_t n_kv_max)
{
    (void)n_kv_max;
    return m && n_tok > 0 ? 256 : 0;
}

int kt_cuda_mla_write_rows(const struct kt_cuda_mla *m, const float *d_kv_a, const float *d_norm_w, float eps,
                           const float *d_cos_sin, const struct kt_cuda_mla_cache *cache, int64_t n_tok,
                           void *stream, char *msg, size_t msg_bytes)
{
    (void)stream;
    if (check_cache(cache, msg, msg_bytes))
        return -1;
    const int64_t kvr = m->kv_rank, dr = m->rope_dim, D = kvr + dr;
    for (int64_t t = 0; t < n_tok; t++) {
        if (cache->n_kv[t] == 0)
            continue;
        float *row = cache_row(cache, t, (int64_t)cache->n_kv[t] - 1, D);
        kt_rmsnorm(row, d_kv_a + t * D, d_norm_w, kvr, eps);
        memcpy(row + kvr, d_kv_a + t * D + kvr, (size_t)dr * sizeof *row);
        kt_rope_apply(row + kvr, d_cos_sin + t * dr, (uint32_t)dr);
    }
    return 0;
}

int kt_cuda_mla_attention(const struct kt_cuda_mla *m, const float *d_q, const struct kt_cuda_mla_cache *cache,
                          int64_t n_tok, int64_t n_kv_max, void *d_scratch, size_t scratch_bytes, float *d_out,
                          void *stream, char *msg, size_t msg_bytes)
{
    (void)stream;
    if (check_cache(cache, msg, msg_bytes))
        return -1;
    if (!d_scratch || scratch_bytes < kt_cuda_mla_scratch_bytes(m, n_tok, n_kv_max)) {
        snprintf(msg, msg_bytes, "emulated mla: scratch");
        return -1;
    }
    const int64_t H = m->n_head, dn = m->nope_dim, dr = m->rope_dim, dv = m->v_dim, kvr = m->kv_rank, D = kvr + dr;
    float *query = malloc((size_t)D * sizeof *query), *o_lat = malloc((size_t)kvr * sizeof *o_lat);
    float *scores = malloc((size_t)(n_kv_max > 0 ? n_kv_max : 1) * sizeof *scores);
    int rc = query && o_lat && scores ? 0 : -1;
    for (int64_t t = 0; t < n_tok && rc == 0; t++) {
        const int64_t n_kv = cache->n_kv[t];
        if (n_kv > n_kv_max) {
            snprintf(msg, msg_bytes, "emulated mla: token %lld has %lld rows, more than n_kv_max %lld", (long long)t,
                     (long long)n_kv, (long long)n_kv_max);
            rc = -1;
            break;
        }
        for (int64_t h = 0; h < H && rc == 0; h++) {
            const float *q = d_q + (t * H + h) * (dn + dr);
            /* q_abs[r] = W_UK,h column r . q_nope: attn_k_b's row h*kvr + r */
            struct kt_cuda_mat uk = m->w_uk;
            const size_t uk_row = uk.row_bytes ? uk.row_bytes : kt_type_row_bytes(uk.type, dn);
            uk.data = (const uint8_t *)uk.data + (size_t)(h * kvr) * uk_row;
            uk.n_out = kvr;
            rc = matmul(&uk, q, dn, 1, query, kvr, msg, msg_bytes);
            memcpy(query + kvr, q + dn, (size_t)dr * sizeof *query);
            for (int64_t j = 0; j < n_kv; j++) {
                const float *row = cache_row(cache, t, j, D);
                double s = 0;
                for (int64_t i = 0; i < D; i++)
                    s += (double)query[i] * row[i];
                scores[j] = (float)s * m->kq_scale;
            }
            kt_softmax(scores, n_kv);
            for (int64_t i = 0; i < kvr; i++)
                o_lat[i] = 0.0f;
            for (int64_t j = 0; j < n_kv; j++) {
                const float *row = cache_row(cache, t, j, D);
                for (int64_t i = 0; i < kvr; i++)
                    o_lat[i] += scores[j] * row[i];
            }
            struct kt_cuda_mat uv = m->w_uv;
            const size_t uv_row = uv.row_bytes ? uv.row_bytes : kt_type_row_bytes(uv.type, kvr);
            uv.data = (const uint8_t *)uv.data + (size_t)(h * dv) * uv_row;
            uv.n_out = dv;
            if (rc == 0)
                rc = matmul(&uv, o_lat, kvr, 1, d_out + (t * H + h) * dv, dv, msg, msg_bytes);
        }
    }
    free(query), free(o_lat), free(scores);
    return rc;
}
