/*
 * step_ops.c - what the forward step's pieces share: a matmul on the step's
 * thread pool that counts the weight bytes it reads, the residual add, the
 * KV cache's shape, and the clock.  Called by
 * engine.c, attention.c and moe.c; it calls none of them, so the step's files
 * form no circle (engine.c -> device.c, attention.c, moe.c -> step_ops.c).
 */
#include <time.h>

#include "forward.h"

uint64_t kt_fwd_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

void kt_fwd_matmul_q(struct kt_engine *e, const struct kt_mat *m, const uint8_t *xq, int64_t n_rows, float *y)
{
    kt_matmul_q(e->pool, m, xq, n_rows, y, m->n_out);
    e->stats.weight_bytes += kt_mat_bytes(m);
}

void kt_fwd_matmul_q_pair(struct kt_engine *e, const struct kt_mat *a, const struct kt_mat *b, const uint8_t *xq,
                          int64_t n_rows, float *ya, float *yb)
{
    kt_matmul_q_pair(e->pool, a, b, xq, n_rows, ya, yb);
    e->stats.weight_bytes += kt_mat_bytes(a) + kt_mat_bytes(b);
}

void kt_fwd_matmul(struct kt_engine *e, const struct kt_mat *m, const float *x, int64_t n_rows, float *y,
                   uint8_t *xq)
{
    kt_quantize_rows(e->pool, m->type, x, n_rows, m->n_in, xq);
    kt_fwd_matmul_q(e, m, xq, n_rows, y);
}

void kt_fwd_add_rows(float *x, const float *y, size_t n)
{
    for (size_t i = 0; i < n; i++)
        x[i] += y[i];
}

struct kt_kv_cache_params kt_fwd_kv_params(const struct kt_engine *e)
{
    return (struct kt_kv_cache_params){
        .n_layer = e->hp.n_layer,
        .row_floats = e->hp.kv_lora_rank + e->hp.qk_rope_dim,
        .row_type = e->params.kv_type,
        .block_tokens = e->params.kv_block_tokens,
        .n_blocks = e->params.kv_blocks,
        .max_seqs = e->params.max_seqs,
        .n_ctx = e->params.n_ctx,
    };
}
