/*
 * attention.c - MLA attention of one layer for every token of a step
 * (docs/deepseek2.md, Attention (MLA)), on the latent KV cache.
 *
 * Per token at position p:
 *     q      = W_qb norm(W_qa h)   (or W_q h)      H heads of [q_nope (dn) | q_pe (dr)]
 *     [c_raw | k_pe] = W_kva h;  c = norm(c_raw)
 *     q_pe, k_pe roped at p;  cache row p = [c (kvr) | k_pe (dr)]
 * then per head, over cached positions t <= p, one of two exact forms:
 *     absorbed:  q_abs = W_UK,h^T q_nope;  s_t = [q_abs | q_pe] . row_t
 *                o_lat = sum_t P_t c_t;   o_h = W_UV,h o_lat
 *     expanded:  k_t = [W_UK,h c_t | k_pe_t], v_t = W_UV,h c_t (HF's form)
 *                s_t = [q_nope | q_pe] . k_t;  o_h = sum_t P_t v_t
 * with P = softmax(kq_scale * s) and finally a = W_o concat_h(o_h).
 * Both forms give the same numbers up to rounding; absorbed costs less per
 * context position (decode), expanded less per query (long prefill chunks).
 * Both stream the context in key blocks of KT_ATTN_EXPAND_ROWS rows with an
 * online softmax (flash attention: running max and sum, the output rescaled
 * when the max moves), so long contexts cost no buffer that grows with them
 * (only the row table) and every row is read once per query group.  Rows are
 * read in the cache's type (F32, BF16 or F16, widened exactly as they load).
 *
 * It never allocates (scratch is sized at engine creation) and never writes
 * a cache row of another sequence or position than the token's own.
 */
#include <math.h>
#include <string.h>

#include "forward.h"

/* ---- choosing the form -------------------------------------------------------- */

/* Multiply-adds per head of a chunk of n queries at positions start.. in each
 * form: absorbed pays W_UK/W_UV per query and a kvr-wide row per (query,
 * position); expanded pays them per context position (plus dequantizing the
 * head's weights) and a head-wide row per (query, position). */
void kt_fwd_choose_attention_forms(struct kt_engine *e)
{
    const double kvr = e->hp.kv_lora_rank, dr = e->hp.qk_rope_dim;
    const double dk = e->hp.qk_nope_dim + dr, dv = e->hp.v_head_dim;
    const double w = kvr * (e->hp.qk_nope_dim + dv); /* elements of W_UK,h and W_UV,h */
    for (uint32_t c = 0; c < e->n_chunks; c++) {
        struct kt_seq_chunk *ch = &e->chunks[c];
        double n = ch->n, n_ctx = (double)ch->start + ch->n;
        double pairs = n * ch->start + n * (n + 1) / 2; /* (query, position) pairs, causal */
        double absorbed = n * w + pairs * (2 * kvr + dr);
        double expanded = w + n_ctx * w + pairs * (dk + dv);
        switch (e->dev.cuda_layers ? KT_ATTENTION_ABSORBED : e->test.attention_form) { /* the GPU has one form */
        case KT_ATTENTION_ABSORBED: ch->expanded = false; break;
        case KT_ATTENTION_EXPANDED: ch->expanded = true; break;
        default: ch->expanded = expanded < absorbed; break;
        }
    }
}

/* ---- per-head weights ------------------------------------------------------------ */

/* W_UK,h in the file's orientation: split, kvr rows of dn; fused, dn rows of kvr. */
static struct kt_mat uk_head(const struct kt_engine *e, const struct kt_layer_weights *L, uint32_t h)
{
    const int64_t kvr = e->hp.kv_lora_rank, dn = e->hp.qk_nope_dim, dv = e->hp.v_head_dim;
    return L->fused_kv_b ? kt_mat_rows(L->uk, h * (dn + dv), dn) : kt_mat_rows(L->uk, h * kvr, kvr);
}

/* W_UV,h: dv rows of kvr in both forms. */
static struct kt_mat uv_head(const struct kt_engine *e, const struct kt_layer_weights *L, uint32_t h)
{
    const int64_t dn = e->hp.qk_nope_dim, dv = e->hp.v_head_dim;
    return L->fused_kv_b ? kt_mat_rows(L->uv, h * (dn + dv) + dn, dv) : kt_mat_rows(L->uv, h * dv, dv);
}

/* The absorbed form's W_UK,h (split files: kvr rows of dn) and W_UV,h, packed where the engine packed them. */
static struct kt_mat uk_head_abs(const struct kt_engine *e, const struct kt_layer_weights *L, uint32_t h)
{
    const int64_t kvr = e->hp.kv_lora_rank;
    return L->fused_kv_b ? uk_head(e, L, h) : kt_mat_rows(L->uk_abs, h * kvr, kvr);
}

static struct kt_mat uv_head_abs(const struct kt_engine *e, const struct kt_layer_weights *L, uint32_t h)
{
    const int64_t dv = e->hp.v_head_dim;
    return L->fused_kv_b ? uv_head(e, L, h) : kt_mat_rows(L->uv_abs, h * dv, dv);
}

/* q_abs (kvr) = W_UK,h^T q_nope (dn). */
static void absorb_query(const struct kt_engine *e, const struct kt_layer_weights *L, uint32_t h, const float *q_nope,
                         float *q_abs, struct kt_thread_scratch *s)
{
    struct kt_mat uk = uk_head_abs(e, L, h);
    if (L->fused_kv_b) {
        kt_matvec_transposed(&uk, q_nope, q_abs, s->tmp);
    } else {
        kt_quantize_rows(NULL, uk.type, q_nope, 1, e->hp.qk_nope_dim, s->act_q);
        kt_matvec_q(&uk, s->act_q, q_abs);
    }
}

/* w_uk (dn, kvr) = W_UK,h and w_uv (dv, kvr) = W_UV,h as floats. */
static void dequantize_head(const struct kt_engine *e, const struct kt_layer_weights *L, uint32_t h,
                            struct kt_thread_scratch *s)
{
    struct kt_mat uk = uk_head(e, L, h), uv = uv_head(e, L, h);
    if (L->fused_kv_b)
        kt_mat_dequantize(&uk, s->w_uk);
    else /* attn_k_b row r is column r of W_UK,h */
        kt_mat_dequantize_transposed(&uk, s->w_uk, s->tmp);
    kt_mat_dequantize(&uv, s->w_uv);
}

/* ---- the two forms ------------------------------------------------------------------ */

struct attention_job {
    struct kt_engine *e;
    uint32_t il;
    const uint32_t *items;      /* absorbed: batch indices of tokens; expanded: chunk indices */
    uint32_t group;             /* absorbed: heads per item (<= KT_ATTN_HEAD_GROUP) */
};

/* One key block of an online softmax (flash attention).  sc (n scores)
 * becomes exp(s - m) for the running max *m, which first moves to the
 * block's max if that is larger; the running sum *sum and the output acc
 * (n_acc) are rescaled to the new max before the block's terms join them.
 * After the last block acc / sum is softmax-weighted sum of the values, the
 * same as kt_softmax's up to rounding (the sum in double, as there). */
static void online_softmax_block(float *sc, int64_t n, float *m, double *sum, float *acc, int64_t n_acc)
{
    float block_max = *m;
    for (int64_t i = 0; i < n; i++)
        block_max = sc[i] > block_max ? sc[i] : block_max;
    if (block_max == -INFINITY) { /* nothing to attend to yet */
        for (int64_t i = 0; i < n; i++)
            sc[i] = 0.0f;
        return;
    }
    if (block_max > *m) {
        const float alpha = *m == -INFINITY ? 0.0f : expf(*m - block_max);
        for (int64_t i = 0; *sum > 0.0 && i < n_acc; i++) /* acc is all 0 until a term joined */
            acc[i] *= alpha;
        *sum *= alpha;
        *m = block_max;
    }
    double block_sum = 0.0;
    for (int64_t i = 0; i < n; i++) {
        sc[i] = expf(sc[i] - block_max);
        block_sum += sc[i];
    }
    *sum += block_sum;
}

/* acc (n) /= sum: the softmax's normalisation, after the last block (no
 * terms: attend to nothing, all 0). */
static void online_softmax_finish(float *acc, int64_t n, double sum)
{
    const float inv = sum > 0.0 ? (float)(1.0 / sum) : 0.0f;
    for (int64_t i = 0; i < n; i++)
        acc[i] *= inv;
}

/* Item i = (token items[i / n_groups], heads of group i % n_groups): the
 * group's queries against the latent rows, streamed in key blocks of
 * KT_ATTN_EXPAND_ROWS rows (online softmax): each block's scores for all of
 * the group's heads in one pass over its rows (dot_rows_multi), then their
 * outputs summed over the block in registers (axpy_rows), the rows widened
 * once per tile of heads rather than once per head.  Rows are read in the cache's
 * own type (BF16/F16 widened exactly on the fly).  Each head's arithmetic is
 * the same whatever the group, so grouping changes no bit of the result. */
static void absorbed_task(void *ctx, int64_t begin, int64_t end, int thread)
{
    const struct attention_job *j = ctx;
    struct kt_engine *e = j->e;
    const struct kt_layer_weights *L = kt_fwd_attention_weights(e, j->il);
    struct kt_thread_scratch *s = &e->scratch[thread];
    const uint32_t H = e->hp.n_head, dn = e->hp.qk_nope_dim, dr = e->hp.qk_rope_dim;
    const uint32_t dk = dn + dr, dv = e->hp.v_head_dim, kvr = e->hp.kv_lora_rank, row = kvr + dr;
    const uint32_t n_groups = (H + j->group - 1) / j->group;
    const struct kt_cpu_row_kernels *rk = &kt_cpu_kernels()->row[kt_kv_cache_row_type(e->kv)];
    const uint32_t B = KT_ATTN_EXPAND_ROWS;

    for (int64_t i = begin; i < end; i++) {
        const uint32_t b = j->items[i / n_groups], h0 = (uint32_t)(i % n_groups) * j->group;
        const uint32_t G = h0 + j->group <= H ? j->group : H - h0;
        const struct kt_batch_token *tok = &e->tokens[b];
        const uint32_t n_kv = tok->pos + 1; /* causal: positions 0 .. pos */
        float m[KT_ATTN_HEAD_GROUP];
        double sum[KT_ATTN_HEAD_GROUP];

        for (uint32_t g = 0; g < G; g++) {                 /* query_g = [q_abs (kvr) | q_pe (dr)] */
            const float *q_h = e->q + ((size_t)b * H + h0 + g) * dk; /* [q_nope | q_pe] */
            float *query = s->query + (size_t)g * row;
            absorb_query(e, L, h0 + g, q_h, query, s);
            memcpy(query + kvr, q_h + dn, dr * sizeof(float));
            memset(s->o_lat + (size_t)g * kvr, 0, kvr * sizeof(float));
            m[g] = -INFINITY;
            sum[g] = 0.0;
        }
        kt_kv_cache_rows(e->kv, tok->seq, j->il, n_kv, s->rows);
        /* keys are whole rows [c | k_pe], values their first kvr elements: c */
        for (uint32_t t0 = 0; t0 < n_kv; t0 += B) {
            const uint32_t nt = n_kv - t0 < B ? n_kv - t0 : B;
            rk->dot_rows_multi(s->query, row, G, s->rows + t0, nt, row, e->kq_scale, s->scores, B);
            for (uint32_t g = 0; g < G; g++)
                online_softmax_block(s->scores + (size_t)g * B, nt, &m[g], &sum[g], s->o_lat + (size_t)g * kvr, kvr);
            rk->axpy_rows(s->o_lat, kvr, G, s->scores, B, s->rows + t0, nt, kvr);
        }

        for (uint32_t g = 0; g < G; g++) {
            online_softmax_finish(s->o_lat + (size_t)g * kvr, kvr, sum[g]);
            struct kt_mat uv = uv_head_abs(e, L, h0 + g);  /* o_h = W_UV,h o_lat */
            kt_quantize_rows(NULL, uv.type, s->o_lat + (size_t)g * kvr, 1, kvr, s->act_q);
            kt_matvec_q(&uv, s->act_q, e->o + ((size_t)b * H + h0 + g) * dv);
        }
    }
}

/* Item i = (chunk items[i / H], head i % H): every query of one sequence's
 * chunk against keys and values expanded per key block of its context
 * (each block's K and V made once for all of the chunk's queries), with an
 * online softmax per query: the outputs accumulate in place, so nothing
 * grows with the context but the row table. */
static void expanded_task(void *ctx, int64_t begin, int64_t end, int thread)
{
    const struct attention_job *j = ctx;
    struct kt_engine *e = j->e;
    const struct kt_layer_weights *L = kt_fwd_attention_weights(e, j->il);
    struct kt_thread_scratch *s = &e->scratch[thread];
    const uint32_t H = e->hp.n_head, dn = e->hp.qk_nope_dim, dr = e->hp.qk_rope_dim;
    const uint32_t dk = dn + dr, dv = e->hp.v_head_dim, kvr = e->hp.kv_lora_rank;
    const enum kt_row_type rt = kt_kv_cache_row_type(e->kv);
    const struct kt_cpu_row_kernels *vk = &kt_cpu_kernels()->row[KT_ROW_F32]; /* the expanded values are floats */
    const uint32_t B = KT_ATTN_EXPAND_ROWS;

    for (int64_t i = begin; i < end; i++) {
        const struct kt_seq_chunk *ch = &e->chunks[j->items[i / H]];
        const uint32_t h = (uint32_t)(i % H);
        const uint32_t n_ctx = ch->start + ch->n;

        dequantize_head(e, L, h, s);
        const struct kt_mat w_uk = kt_mat_f32(s->w_uk, dn, kvr), w_uv = kt_mat_f32(s->w_uv, dv, kvr);
        kt_kv_cache_rows(e->kv, ch->seq, j->il, n_ctx, s->rows);
        for (uint32_t q = 0; q < ch->n; q++) {
            memset(e->o + ((size_t)ch->tokens[q] * H + h) * dv, 0, dv * sizeof(float));
            s->q_max[q] = -INFINITY;
            s->q_sum[q] = 0.0;
        }
        for (uint32_t t0 = 0; t0 < n_ctx; t0 += B) {
            const uint32_t nt = n_ctx - t0 < B ? n_ctx - t0 : B;
            /* k_nope = W_UK,h c and v = W_UV,h c for the block at once (F32
             * weights take c as it is; each output is the float the row's own
             * matvec gives, kt_mat_gemm), the block's latents widened first */
            for (uint32_t t = 0; t < nt; t++)
                kt_row_to_f32(rt, s->c_block + (size_t)t * kvr, s->rows[t0 + t], kvr);
            kt_mat_gemm(&w_uk, s->c_block, kvr * sizeof(float), nt, s->k_exp, dk);
            kt_mat_gemm(&w_uv, s->c_block, kvr * sizeof(float), nt, s->v_exp, dv);
            for (uint32_t t = 0; t < nt; t++) {
                float *k = s->k_exp + (size_t)t * dk; /* [k_nope | k_pe] */
                kt_row_to_f32(rt, k + dn, kt_row_at(rt, s->rows[t0 + t], kvr), dr);
                s->k_rows[t] = k;
                s->v_rows[t] = s->v_exp + (size_t)t * dv;
            }
            /* queries whose causal window reaches into the block: positions
             * >= t0.  Those that see the whole block go in groups of up to
             * KT_ATTN_HEAD_GROUP with consecutive batch indices (their q_h
             * and outputs a fixed stride apart): each key and value row is
             * read once for the group (dot_rows_multi, axpy_rows), each
             * query's arithmetic the same as alone.  The rest (the block
             * holds their diagonal) one at a time, over their nk keys. */
            for (uint32_t q = t0 > ch->start ? t0 - ch->start : 0; q < ch->n;) {
                const uint32_t b = ch->tokens[q], limit = ch->start + q + 1; /* positions < limit */
                const uint32_t nk = limit - t0 < nt ? limit - t0 : nt;
                uint32_t G = 1;
                while (nk == nt && G < KT_ATTN_HEAD_GROUP && q + G < ch->n && ch->tokens[q + G] == b + G)
                    G++; /* later queries of the chunk see at least as far */
                const float *q_h = e->q + ((size_t)b * H + h) * dk; /* [q_nope | q_pe] */
                float *out = e->o + ((size_t)b * H + h) * dv;
                vk->dot_rows_multi(q_h, (int64_t)H * dk, G, (const void *const *)s->k_rows, nk, dk, e->kq_scale,
                                   s->scores, B);
                for (uint32_t g = 0; g < G; g++)
                    online_softmax_block(s->scores + (size_t)g * B, nk, &s->q_max[q + g], &s->q_sum[q + g],
                                         out + (size_t)g * H * dv, dv);
                vk->axpy_rows(out, (int64_t)H * dv, G, s->scores, B, (const void *const *)s->v_rows, nk, dv);
                q += G;
            }
        }
        for (uint32_t q = 0; q < ch->n; q++)
            online_softmax_finish(e->o + ((size_t)ch->tokens[q] * H + h) * dv, dv, s->q_sum[q]);
    }
}

/* ---- the layer --------------------------------------------------------------------- */

void kt_fwd_attention(struct kt_engine *e, uint32_t il, const float *h, float *out)
{
    const struct kt_hparams *hp = &e->hp;
    const struct kt_layer_weights *L = kt_fwd_attention_weights(e, il);
    const uint32_t T = e->n_tokens, H = hp->n_head, qr = hp->q_lora_rank;
    const uint32_t dn = hp->qk_nope_dim, dr = hp->qk_rope_dim, dk = dn + dr, kvr = hp->kv_lora_rank;

    /* h feeds W_qa (or W_q) and W_kva: converted once when both take one format.
     * Then queries (T, H*dk) and the compressed KV (T, kvr+dr). */
    const struct kt_mat *w_q_in = qr > 0 ? &L->q_a : &L->q;
    uint64_t t_proj = kt_fwd_now_ns();
    if (kt_mat_kernels_for(L->kv_a.type)->vec_dot_type == kt_mat_kernels_for(w_q_in->type)->vec_dot_type) {
        kt_quantize_rows(e->pool, w_q_in->type, h, T, w_q_in->n_in, e->xq); /* both in one hand-off */
        kt_fwd_matmul_q_pair(e, w_q_in, &L->kv_a, e->xq, T, qr > 0 ? e->qa : e->q, e->kv_a);
    } else {
        kt_fwd_matmul(e, w_q_in, h, T, qr > 0 ? e->qa : e->q, e->xq);
        kt_fwd_matmul(e, &L->kv_a, h, T, e->kv_a, e->xq);
    }
    if (qr > 0) {
        for (uint32_t t = 0; t < T; t++)
            kt_rmsnorm(e->qa + (size_t)t * qr, e->qa + (size_t)t * qr, L->q_a_norm, qr, hp->rms_eps);
        kt_fwd_matmul(e, &L->q_b, e->qa, T, e->q, e->xq);
    }
    e->layer_stats[il].attention_proj_ns += kt_fwd_now_ns() - t_proj;

    /* Each token's cache row [c | k_pe] and its roped q_pe.  All rows of the
     * step are written before any head reads, so a chunk sees itself. */
    for (uint32_t t = 0; t < T; t++) {
        const struct kt_batch_token *tok = &e->tokens[t];
        float *kv = e->kv_a + (size_t)t * (kvr + dr); /* made the row in place, then stored in the cache's type */
        const float *cs = e->cos_sin + (size_t)t * dr;
        kt_rmsnorm(kv, kv, L->kv_a_norm, kvr, hp->rms_eps);
        kt_rope_apply(kv + kvr, cs, dr);
        kt_row_from_f32(kt_kv_cache_row_type(e->kv), kt_kv_cache_row(e->kv, tok->seq, il, tok->pos), kv, kvr + dr);
        for (uint32_t hd = 0; hd < H; hd++)
            kt_rope_apply(e->q + ((size_t)t * H + hd) * dk + dn, cs, dr);
    }
    e->stats.weight_bytes += L->uk_uv_bytes;

    /* Heads: absorbed tokens by (token, head), expanded chunks by (chunk, head). */
    uint32_t *items = e->chunk_tokens + T; /* free space after the chunks' token lists */
    uint32_t n_absorbed = 0, n_expanded = 0;
    for (uint32_t c = 0; c < e->n_chunks; c++)
        if (!e->chunks[c].expanded)
            for (uint32_t q = 0; q < e->chunks[c].n; q++)
                items[n_absorbed++] = e->chunks[c].tokens[q];
    /* Heads per absorbed item: as many as share a row read, while leaving
     * at least two items per thread. */
    const uint32_t threads = (uint32_t)kt_pool_n_threads(e->pool);
    uint32_t group = n_absorbed ? (uint32_t)(((uint64_t)n_absorbed * H) / (2u * threads)) : 1;
    group = group < 1 ? 1 : group > KT_ATTN_HEAD_GROUP ? KT_ATTN_HEAD_GROUP : group;
    struct attention_job job = {e, il, items, group};
    kt_pool_parallel_for(e->pool, (int64_t)n_absorbed * ((H + group - 1) / group), 1, absorbed_task, &job);
    for (uint32_t c = 0; c < e->n_chunks; c++)
        if (e->chunks[c].expanded)
            items[n_expanded++] = c;
    kt_pool_parallel_for(e->pool, (int64_t)n_expanded * H, 1, expanded_task, &job);

    /* a = W_o concat_h(o_h)   (T, E) */
    t_proj = kt_fwd_now_ns();
    kt_fwd_matmul(e, &L->out, e->o, T, out, e->xq);
    e->layer_stats[il].attention_proj_ns += kt_fwd_now_ns() - t_proj;
}

void kt_fwd_attention_block(struct kt_engine *e, uint32_t il, float *x)
{
    const uint32_t T = e->n_tokens, E = e->hp.n_embd;
    const struct kt_layer_weights *L = kt_fwd_attention_weights(e, il);
    for (uint32_t t = 0; t < T; t++)
        kt_rmsnorm(e->h + (size_t)t * E, x + (size_t)t * E, L->attn_norm, E, e->hp.rms_eps);
    kt_fwd_attention(e, il, e->h, e->y);
    kt_fwd_add_rows(x, e->y, (size_t)T * E);
}
