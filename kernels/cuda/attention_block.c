/*
 * attention_block.c - one layer's attention block on the GPU (kt_cuda.h,
 * kt_cuda_attention_block): the projections, norms, RoPE, cache writes and
 * MLA of runtime/forward/attention.c in the absorbed form, then the output
 * projection and the residual add, all enqueued on one stream.
 *
 * Plain C: it only strings together the entry points of ops.cu, gemv.cu,
 * blaslt.cu and mla.cu, each of which checks its own arguments, so it is
 * built in every configuration (without CUDA those entry points fail, and
 * test_hybrid_cuda_emulated runs it against a host emulation of them).
 * This file checks what they cannot see (which buffers the layer's shape
 * needs) and stops at the first refusal, so a failed launch leaves the rest
 * of the block unqueued.
 */
#include <stdarg.h>
#include <stdio.h>

#include "kt_cuda.h"

static int fail(char *msg, size_t msg_bytes, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* "attention block: ..." into msg; returns -1. */
static int fail(char *msg, size_t msg_bytes, const char *fmt, ...)
{
    if (msg && msg_bytes) {
        int n = snprintf(msg, msg_bytes, "attention block: ");
        va_list ap;
        va_start(ap, fmt);
        if (n > 0 && (size_t)n < msg_bytes)
            vsnprintf(msg + n, msg_bytes - (size_t)n, fmt, ap);
        va_end(ap);
    }
    return -1;
}

/* y (n_tok, w.n_out) = x (n_tok, w.n_in) . W^T: prefill-sized batches through
 * cuBLASLt when the step has scratch for it and cuBLASLt an algorithm, else
 * kt_cuda_matmul's own path. */
static int project(const struct kt_cuda_mat *w, const float *x, const struct kt_cuda_attention_step *st, float *y,
                   void *stream, char *msg, size_t msg_bytes)
{
    const int64_t n_tok = st->n_tok;
    if (n_tok >= KT_CUDA_LT_MIN_TOKENS && st->lt_scratch) {
        const size_t need = kt_cuda_matmul_lt_scratch_bytes(w, n_tok);
        int rc = KT_CUDA_LT_NO_ALGORITHM;
        if (need && need <= st->lt_scratch_bytes)
            rc = kt_cuda_matmul_lt(w, x, n_tok, y, st->lt_scratch, st->lt_scratch_bytes, stream, msg, msg_bytes);
        if (rc != KT_CUDA_LT_NO_ALGORITHM)
            return rc;
    }
    return kt_cuda_matmul(w, x, n_tok, y, KT_CUDA_MATMUL_AUTO, stream, msg, msg_bytes);
}

int kt_cuda_attention_block(const struct kt_cuda_attention_layer *L, const struct kt_cuda_attention_step *st,
                            void *stream, char *msg, size_t msg_bytes)
{
    if (!L || !st)
        return fail(msg, msg_bytes, "no layer or step");
    const struct kt_cuda_mla *m = &L->mla;
    const int64_t T = st->n_tok, E = L->n_embd, qr = L->q_rank;
    const int64_t H = m->n_head, dn = m->nope_dim, dr = m->rope_dim, dk = dn + dr, kvr = m->kv_rank;
    if (T == 0)
        return 0;
    if (T < 0 || E <= 0 || qr < 0)
        return fail(msg, msg_bytes, "%lld tokens, %lld embedding, q rank %lld", (long long)T, (long long)E,
                    (long long)qr);
    if (!st->x || !st->cos_sin || !st->h || !st->q || !st->kv_a || !st->o || !st->y || !L->attn_norm ||
        !L->kv_a_norm || (qr > 0 && (!st->qa || !L->q_a_norm)))
        return fail(msg, msg_bytes, "a buffer or norm weight is missing");
    const struct kt_cuda_mat *w_q_out = qr > 0 ? &L->q_b : &L->q;
    if ((qr > 0 && (L->q_a.n_in != E || L->q_a.n_out != qr || L->q_b.n_in != qr)) || w_q_out->n_out != H * dk ||
        L->kv_a.n_in != E || L->kv_a.n_out != kvr + dr || L->out.n_in != H * m->v_dim || L->out.n_out != E)
        return fail(msg, msg_bytes, "projection shapes do not match the layer's");

    /* h = rmsnorm(x) * attn_norm */
    if (kt_cuda_rmsnorm(st->h, E, st->x, E, L->attn_norm, T, E, L->eps, stream, msg, msg_bytes))
        return -1;
    /* q = W_qb (rmsnorm(W_qa h) * q_a_norm)  or  W_q h;  kv_a = W_kva h */
    if (qr > 0) {
        if (project(&L->q_a, st->h, st, st->qa, stream, msg, msg_bytes) ||
            kt_cuda_rmsnorm(st->qa, qr, st->qa, qr, L->q_a_norm, T, qr, L->eps, stream, msg, msg_bytes) ||
            project(&L->q_b, st->qa, st, st->q, stream, msg, msg_bytes))
            return -1;
    } else if (project(&L->q, st->h, st, st->q, stream, msg, msg_bytes)) {
        return -1;
    }
    if (project(&L->kv_a, st->h, st, st->kv_a, stream, msg, msg_bytes))
        return -1;
    /* every head's q_pe roped; each token's cache row written; then MLA */
    if (kt_cuda_rope(st->q, T, H * dk, H, dk, dn, st->cos_sin, dr, stream, msg, msg_bytes) ||
        kt_cuda_mla_write_rows(m, st->kv_a, L->kv_a_norm, L->eps, st->cos_sin, &st->cache, T, stream, msg, msg_bytes) ||
        kt_cuda_mla_attention(m, st->q, &st->cache, T, st->n_kv_max, st->mla_scratch, st->mla_scratch_bytes, st->o,
                              stream, msg, msg_bytes))
        return -1;
    /* x += W_o o */
    if (project(&L->out, st->o, st, st->y, stream, msg, msg_bytes) ||
        kt_cuda_add(st->x, st->x, st->y, T * E, stream, msg, msg_bytes))
        return -1;
    return 0;
}
