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
#include "kt_cuda.h"

/* y (n_tok, w.n_out) = x (n_tok, w.n_in) . W^T: prefill-sized batches through
 * cuBLASLt when the step has scratch for it and cuBLASLt an algorithm, else
 * kt_cuda_matmul's own path. */
static kt_status project(const struct kt_cuda_mat *w, const float *x, const struct kt_cuda_attention_step *st, float *y,
                         void *stream, kt_err *err)
{
    const int64_t n_tok = st->n_tok;
    if (n_tok >= KT_CUDA_LT_MIN_TOKENS && st->lt_scratch) {
        const size_t need = kt_cuda_matmul_lt_scratch_bytes(w, n_tok);
        if (need && need <= st->lt_scratch_bytes) {
            const kt_status s = kt_cuda_matmul_lt(w, x, n_tok, y, st->lt_scratch, st->lt_scratch_bytes, stream, err);
            if (s != KT_ERR_UNSUPPORTED) /* UNSUPPORTED: cuBLASLt has no algorithm, nothing was queued */
                return s;
        }
    }
    return kt_cuda_matmul(w, x, n_tok, y, KT_CUDA_MATMUL_AUTO, stream, err);
}

kt_status kt_cuda_attention_block(const struct kt_cuda_attention_layer *L, const struct kt_cuda_attention_step *st,
                                  void *stream, kt_err *err)
{
    if (!L || !st)
        return kt_err_set(err, KT_ERR_INVALID, "attention block: no layer or step");
    const struct kt_cuda_mla *m = &L->mla;
    const int64_t T = st->n_tok, E = L->n_embd, qr = L->q_rank;
    const int64_t H = m->n_head, dn = m->nope_dim, dr = m->rope_dim, dk = dn + dr, kvr = m->kv_rank;
    if (T == 0)
        return KT_OK;
    if (T < 0 || E <= 0 || qr < 0)
        return kt_err_set(err, KT_ERR_INVALID, "attention block: %lld tokens, %lld embedding, q rank %lld",
                          (long long)T, (long long)E, (long long)qr);
    if (!st->x || !st->cos_sin || !st->h || !st->q || !st->kv_a || !st->o || !st->y || !L->attn_norm ||
        !L->kv_a_norm || (qr > 0 && (!st->qa || !L->q_a_norm)))
        return kt_err_set(err, KT_ERR_INVALID, "attention block: a buffer or norm weight is missing");
    const struct kt_cuda_mat *w_q_out = qr > 0 ? &L->q_b : &L->q;
    if ((qr > 0 && (L->q_a.n_in != E || L->q_a.n_out != qr || L->q_b.n_in != qr)) || w_q_out->n_out != H * dk ||
        L->kv_a.n_in != E || L->kv_a.n_out != kvr + dr || L->out.n_in != H * m->v_dim || L->out.n_out != E)
        return kt_err_set(err, KT_ERR_INVALID, "attention block: projection shapes do not match the layer's");

    kt_status s;
    /* h = rmsnorm(x) * attn_norm */
    if ((s = kt_cuda_rmsnorm(st->h, E, st->x, E, L->attn_norm, T, E, L->eps, stream, err)) != KT_OK)
        return s;
    /* q = W_qb (rmsnorm(W_qa h) * q_a_norm)  or  W_q h;  kv_a = W_kva h */
    if (qr > 0) {
        if ((s = project(&L->q_a, st->h, st, st->qa, stream, err)) != KT_OK ||
            (s = kt_cuda_rmsnorm(st->qa, qr, st->qa, qr, L->q_a_norm, T, qr, L->eps, stream, err)) != KT_OK ||
            (s = project(&L->q_b, st->qa, st, st->q, stream, err)) != KT_OK)
            return s;
    } else if ((s = project(&L->q, st->h, st, st->q, stream, err)) != KT_OK) {
        return s;
    }
    if ((s = project(&L->kv_a, st->h, st, st->kv_a, stream, err)) != KT_OK)
        return s;
    /* every head's q_pe roped; each token's cache row written; then MLA */
    if ((s = kt_cuda_rope(st->q, T, H * dk, H, dk, dn, st->cos_sin, dr, stream, err)) != KT_OK ||
        (s = kt_cuda_mla_write_rows(m, st->kv_a, L->kv_a_norm, L->eps, st->cos_sin, &st->cache, T, stream, err)) !=
            KT_OK ||
        (s = kt_cuda_mla_attention(m, st->q, &st->cache, T, st->n_kv_max, st->mla_scratch, st->mla_scratch_bytes, st->o,
                                   stream, err)) != KT_OK)
        return s;
    /* x += W_o o */
    if ((s = project(&L->out, st->o, st, st->y, stream, err)) != KT_OK ||
        (s = kt_cuda_add(st->x, st->x, st->y, T * E, stream, err)) != KT_OK)
        return s;
    return KT_OK;
}
