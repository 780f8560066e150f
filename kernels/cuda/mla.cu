/*
 * mla.cu - MLA attention of one layer on the GPU, absorbed form, for decode
 * and prefill alike (docs/deepseek2.md, Attention (MLA); runtime/forward/attention.c is
 * the CPU twin):
 *
 *     q_lat[t,h] = [W_UK,h^T q_nope[t,h] (kvr) | q_pe[t,h] (dr)]      per-head GEMV
 *     o_lat[t,h] = sum_j softmax_j(kq_scale q_lat[t,h] . row_j) c_j    rows j < n_kv[t]
 *     out[t,h]   = W_UV,h o_lat[t,h]                                   per-head GEMV
 *
 * The latent cache (F32, BF16 or F16 rows: read widened, written rounded) is
 * paged as runtime/forward/kv_cache.h pages it (struct
 * kt_cuda_mla_cache): row j = position j = [c (kvr) | k_pe (dr)] sits in block
 * j / block_tokens of the token's table, so one launch serves tokens of many
 * sequences, each with its own table and context length.
 *
 * The middle step is flash-decoding: a block takes one token, 8 heads (one
 * warp each for scores and the online softmax) and a slice of the context,
 * streaming it 8 rows at a time through shared memory; all 8 heads share
 * each row read (MQA).  Short batches split the context across blocks and a
 * second kernel merges the slices' (max, sum, partial output).  fp32
 * throughout, CUDA's expf (<= 2 ulp).  Cost per (query, position, head):
 * kvr + dr + kvr multiply-adds on CUDA cores - fine for decode, ~3x the
 * expanded form's work for long prefill (a tensor-core prefill is future
 * work).
 */
#include "common.cuh"
#include "mla_plan.h"

/* tile sizes and shape limits: mla_plan.h */

static_assert(MLA_HEADS * 32 == MLA_THREADS, "one warp per head");
static_assert(MLA_ROWS <= 32, "one lane per row of a tile");

struct mla_args {
    const float *q_lat;        /* (T, H, D) */
    struct kt_cuda_mla_cache cache; /* (T) contexts of n_kv[t] rows of D */
    int64_t n_kv_max, split_rows;
    int H, kvr, D, n_split;
    float scale;
    float *o_lat;              /* (T, H, kvr) */
    float *part_o;             /* (T, H, n_split, kvr): unnormalised slice outputs */
    float *part_ml;            /* (T, H, n_split, 2): slice max and sum */
};

/* Element i of a cache row of type `type` (enum kt_row_type), widened
 * exactly: BF16 is the top half of a float, F16 goes through the hardware
 * conversion (exact as well). */
__device__ static inline float mla_load(const void *row, int64_t i, int type)
{
    if (type == 1)
        return __uint_as_float((unsigned)((const unsigned short *)row)[i] << 16);
    if (type == 2)
        return __half2float(__ushort_as_half(((const unsigned short *)row)[i]));
    return ((const float *)row)[i];
}

/* ... and stored, rounded to nearest even. */
__device__ static inline void mla_store(void *row, int64_t i, float x, int type)
{
    if (type == 1)
        ((unsigned short *)row)[i] = __bfloat16_as_ushort(__float2bfloat16_rn(x));
    else if (type == 2)
        ((unsigned short *)row)[i] = __half_as_ushort(__float2half_rn(x));
    else
        ((float *)row)[i] = x;
}

/* Row j of token t's context (struct kt_cuda_mla_cache). */
__device__ static inline unsigned char *mla_row(const struct kt_cuda_mla_cache &c, int64_t t, int64_t j, int64_t D)
{
    const int64_t block = c.block_ids[c.first_block[t] + j / c.block_tokens];
    const int64_t elem = c.row_type == 0 ? 4 : 2;
    return (unsigned char *)c.pool + (block * c.block_elems + c.layer_offset + (j % c.block_tokens) * D) * elem;
}

/* Block (token, head group, context slice). */
__global__ static void __launch_bounds__(MLA_THREADS) mla_attend(const struct mla_args a)
{
    extern __shared__ float sm[];
    float *qs = sm;                            /* (MLA_HEADS, D) the heads' query rows */
    float *ks = qs + MLA_HEADS * a.D;          /* (MLA_ROWS, D) the tile's cache rows */
    float *ps = ks + MLA_ROWS * a.D;           /* (MLA_HEADS, MLA_ROWS) the tile's exp(s - m) */
    float *alpha = ps + MLA_HEADS * MLA_ROWS;  /* (MLA_HEADS) rescale of the running output */
    float *stat = alpha + MLA_HEADS;           /* (MLA_HEADS, 2) final max and sum */
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int64_t t = blockIdx.x;
    const int h0 = blockIdx.y * MLA_HEADS, split = blockIdx.z;
    const int nh = a.H - h0 < MLA_HEADS ? a.H - h0 : MLA_HEADS;
    const int64_t n_kv = a.cache.n_kv[t] < a.n_kv_max ? (int64_t)a.cache.n_kv[t] : a.n_kv_max;
    const int64_t jb = split * a.split_rows, je = jb + a.split_rows < n_kv ? jb + a.split_rows : n_kv;
    __shared__ const unsigned char *tile[MLA_ROWS]; /* the tile's rows in the cache */

    for (int i = tid; i < MLA_HEADS * a.D; i += MLA_THREADS) {
        const int hh = i / a.D;
        qs[i] = hh < nh ? a.q_lat[(t * a.H + h0 + hh) * a.D + i % a.D] : 0.0f;
    }
    float o[MLA_HEADS][MLA_MAX_COLS];
#pragma unroll
    for (int hh = 0; hh < MLA_HEADS; hh++)
#pragma unroll
        for (int i = 0; i < MLA_MAX_COLS; i++)
            o[hh][i] = 0.0f;
    float m_run = -INFINITY, l_run = 0.0f; /* head `warp`'s running max and sum, the same in every lane */

    for (int64_t j0 = jb; j0 < je; j0 += MLA_ROWS) {
        const int nr = (int)(je - j0 < MLA_ROWS ? je - j0 : MLA_ROWS);
        __syncthreads(); /* qs written; the previous tile's ks, ps, alpha and rows read */
        if (tid < nr)
            tile[tid] = mla_row(a.cache, t, j0 + tid, a.D);
        __syncthreads();
        for (int i = tid; i < MLA_ROWS * a.D; i += MLA_THREADS) {
            const int jj = i / a.D;
            ks[i] = jj < nr ? mla_load(tile[jj], i % a.D, a.cache.row_type) : 0.0f; /* widened once per tile */
        }
        __syncthreads();

        /* scores of head `warp`: lane jj keeps row jj's */
        float s_mine = -INFINITY;
        for (int jj = 0; jj < MLA_ROWS; jj++) {
            float s = 0.0f;
            for (int d = lane; d < a.D; d += 32)
                s += qs[warp * a.D + d] * ks[jj * a.D + d];
            s = kt_warp_sum(s);
            if (lane == jj && jj < nr)
                s_mine = s * a.scale;
        }
        const float m_new = fmaxf(m_run, kt_warp_max(s_mine));
        const float p = s_mine == -INFINITY ? 0.0f : expf(s_mine - m_new);
        const float al = m_run == -INFINITY ? 0.0f : expf(m_run - m_new);
        l_run = l_run * al + kt_warp_sum(p);
        m_run = m_new;
        if (lane < MLA_ROWS)
            ps[warp * MLA_ROWS + lane] = p;
        if (lane == 0)
            alpha[warp] = al;
        __syncthreads();

        /* o[h][c] = o[h][c] alpha_h + sum_jj p[h][jj] c_jj[c] for this thread's columns */
#pragma unroll
        for (int hh = 0; hh < MLA_HEADS; hh++) {
            const float al_h = alpha[hh];
#pragma unroll
            for (int i = 0; i < MLA_MAX_COLS; i++) {
                const int c = tid + i * MLA_THREADS;
                if (c < a.kvr) {
                    float acc = o[hh][i] * al_h;
#pragma unroll
                    for (int jj = 0; jj < MLA_ROWS; jj++)
                        acc += ps[hh * MLA_ROWS + jj] * ks[jj * a.D + c];
                    o[hh][i] = acc;
                }
            }
        }
    }

    if (lane == 0) {
        stat[2 * warp] = m_run;
        stat[2 * warp + 1] = l_run;
    }
    __syncthreads();
#pragma unroll
    for (int hh = 0; hh < MLA_HEADS; hh++) {
        if (hh >= nh)
            break;
        const int64_t th = t * a.H + h0 + hh;
        const float l = stat[2 * hh + 1];
#pragma unroll
        for (int i = 0; i < MLA_MAX_COLS; i++) {
            const int c = tid + i * MLA_THREADS;
            if (c >= a.kvr)
                continue;
            if (a.n_split == 1)
                a.o_lat[th * a.kvr + c] = l > 0.0f ? o[hh][i] / l : 0.0f; /* no rows: attend to nothing */
            else
                a.part_o[(th * a.n_split + split) * a.kvr + c] = o[hh][i];
        }
    }
    if (a.n_split > 1 && tid < nh) {
        float *ml = a.part_ml + ((t * a.H + h0 + tid) * a.n_split + split) * 2;
        ml[0] = stat[2 * tid];
        ml[1] = stat[2 * tid + 1];
    }
}

/* Block (token * H + head): merges the context slices. */
__global__ static void __launch_bounds__(MLA_THREADS) mla_combine(const struct mla_args a)
{
    const int64_t th = blockIdx.x;
    const float *ml = a.part_ml + th * a.n_split * 2;
    float *out = a.o_lat + th * a.kvr;
    float m = -INFINITY;
    for (int s = 0; s < a.n_split; s++)
        if (ml[2 * s + 1] > 0.0f)
            m = fmaxf(m, ml[2 * s]);
    if (m == -INFINITY) { /* no slice saw a row */
        for (int c = threadIdx.x; c < a.kvr; c += MLA_THREADS)
            out[c] = 0.0f;
        return;
    }
    float l = 0.0f;
    for (int s = 0; s < a.n_split; s++)
        if (ml[2 * s + 1] > 0.0f)
            l += ml[2 * s + 1] * expf(ml[2 * s] - m);
    for (int c = threadIdx.x; c < a.kvr; c += MLA_THREADS) {
        float acc = 0.0f;
        for (int s = 0; s < a.n_split; s++)
            if (ml[2 * s + 1] > 0.0f)
                acc += expf(ml[2 * s] - m) * a.part_o[(th * a.n_split + s) * a.kvr + c];
        out[c] = acc / l;
    }
}

/* q_lat[t,h][kvr + i] = q[t,h][dn + i]: the rope part of the query rows. */
__global__ static void __launch_bounds__(MLA_THREADS)
    mla_copy_pe(float *q_lat, const float *q, int64_t n_tok, int64_t H, int64_t dn, int64_t dr, int64_t kvr)
{
    const int64_t n = n_tok * H * dr;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t th = i / dr, d = i % dr;
        q_lat[th * (kvr + dr) + kvr + d] = q[th * (dn + dr) + dn + d];
    }
}

/* Cache rows of the step's tokens: [rmsnorm(c_raw) * w | roped k_pe].  Block per token. */
__global__ static void __launch_bounds__(MLA_THREADS)
    mla_rows(const float *kv_a, const float *norm_w, float eps, const float *cos_sin,
             const struct kt_cuda_mla_cache cache, int64_t kvr, int64_t dr)
{
    const int64_t t = blockIdx.x;
    if (cache.n_kv[t] == 0) /* the same for the whole block */
        return;
    unsigned char *row = mla_row(cache, t, (int64_t)cache.n_kv[t] - 1, kvr + dr);
    const int type = cache.row_type;
    const float *kv = kv_a + t * (kvr + dr);
    double sum_sq = 0.0;
    for (int64_t i = threadIdx.x; i < kvr; i += blockDim.x)
        sum_sq += (double)kv[i] * kv[i];
    sum_sq = kt_block_sum_double(sum_sq);
    const float scale = (float)(1.0 / sqrt(sum_sq / (double)kvr + (double)eps));
    for (int64_t i = threadIdx.x; i < kvr; i += blockDim.x)
        mla_store(row, i, __fmul_rn(__fmul_rn(kv[i], scale), norm_w[i]), type);
    const float *cs = cos_sin + t * dr;
    for (int64_t i = threadIdx.x; i < dr / 2; i += blockDim.x) {
        const float x0 = kv[kvr + 2 * i], x1 = kv[kvr + 2 * i + 1], c = cs[2 * i], s = cs[2 * i + 1];
        mla_store(row, kvr + 2 * i, __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s)), type);
        mla_store(row, kvr + 2 * i + 1, __fadd_rn(__fmul_rn(x0, s), __fmul_rn(x1, c)), type);
    }
}

/* ---- host side ------------------------------------------------------------------------ */

/* The cache description's own fields (the arrays are on the device). */
static kt_status check_cache(const struct kt_cuda_mla_cache *c, kt_err *err)
{
    if (!c || !c->pool || !c->block_ids || !c->first_block || !c->n_kv)
        return kt_err_set(err, KT_ERR_INVALID, "mla: cache pointer missing");
    if (c->block_tokens < 1 || c->block_elems < 0 || c->layer_offset < 0 || c->row_type < 0 || c->row_type > 2)
        return kt_err_set(err, KT_ERR_INVALID,
                          "mla: bad cache layout (%lld positions per block, %lld elements per block, layer offset "
                          "%lld, row type %d)",
                          (long long)c->block_tokens, (long long)c->block_elems, (long long)c->layer_offset,
                          c->row_type);
    return KT_OK;
}

static kt_status check_shape(const struct kt_cuda_mla *m, bool weights, kt_err *err)
{
    if (!m)
        return kt_err_set(err, KT_ERR_INVALID, "mla: no shape");
    const int64_t H = m->n_head, dn = m->nope_dim, dr = m->rope_dim, dv = m->v_dim, kvr = m->kv_rank;
    if (!mla_shape_supported(m))
        return kt_err_set(err, KT_ERR_UNSUPPORTED,
                          "mla: unsupported shape (%lld heads, nope %lld, rope %lld, v %lld, kv rank %lld; "
                          "kv rank <= %d, kv rank + rope <= 760)", (long long)H, (long long)dn, (long long)dr,
                          (long long)dv, (long long)kvr, MLA_MAX_COLS * MLA_THREADS);
    if (!weights)
        return KT_OK;
    kt_status st;
    if ((st = kt_cuda_mat_check(&m->w_uk, "mla w_uk", err)) != KT_OK ||
        (st = kt_cuda_mat_check(&m->w_uv, "mla w_uv", err)) != KT_OK)
        return st;
    if (m->w_uk.n_in != dn || m->w_uk.n_out != H * kvr || m->w_uv.n_in != kvr || m->w_uv.n_out != H * dv)
        return kt_err_set(err, KT_ERR_INVALID, "mla: w_uk %lldx%lld / w_uv %lldx%lld do not match the shape",
                          (long long)m->w_uk.n_out, (long long)m->w_uk.n_in, (long long)m->w_uv.n_out,
                          (long long)m->w_uv.n_in);
    return KT_OK;
}

extern "C" size_t kt_cuda_mla_scratch_bytes(const struct kt_cuda_mla *m, int64_t n_tok, int64_t n_kv_max)
{
    if (check_shape(m, false, NULL) != KT_OK || n_tok <= 0 || n_kv_max < 0)
        return 0;
    return mla_scratch_total(m, n_tok, n_kv_max);
}

extern "C" kt_status kt_cuda_mla_write_rows(const struct kt_cuda_mla *m, const float *d_kv_a, const float *d_norm_w,
                                            float eps, const float *d_cos_sin, const struct kt_cuda_mla_cache *cache,
                                            int64_t n_tok, void *stream, kt_err *err)
{
    kt_status st = check_shape(m, false, err);
    if (st != KT_OK)
        return st;
    if (n_tok < 0 || n_tok > KT_CUDA_MAX_GRID_X)
        return kt_err_set(err, KT_ERR_INVALID, "mla rows: bad token count %lld", (long long)n_tok);
    if (n_tok == 0)
        return KT_OK;
    if (!d_kv_a || !d_norm_w || !d_cos_sin)
        return kt_err_set(err, KT_ERR_INVALID, "mla rows: NULL pointer");
    if ((st = check_cache(cache, err)) != KT_OK)
        return st;
    mla_rows<<<(unsigned)n_tok, MLA_THREADS, 0, (cudaStream_t)stream>>>(d_kv_a, d_norm_w, eps, d_cos_sin, *cache,
                                                                         m->kv_rank, m->rope_dim);
    return kt_cuda_launched("mla rows launch", err);
}

extern "C" kt_status kt_cuda_mla_attention(const struct kt_cuda_mla *m, const float *d_q,
                                           const struct kt_cuda_mla_cache *cache, int64_t n_tok, int64_t n_kv_max,
                                           void *d_scratch, size_t scratch_bytes, float *d_out, void *stream,
                                           kt_err *err)
{
    kt_status st = check_shape(m, true, err);
    if (st != KT_OK)
        return st;
    if (n_tok < 0 || n_tok > KT_CUDA_MAX_GRID_X / m->n_head || n_kv_max < 0 || n_kv_max > UINT32_MAX)
        return kt_err_set(err, KT_ERR_INVALID, "mla: bad token count %lld or context %lld", (long long)n_tok,
                          (long long)n_kv_max);
    if (n_tok == 0)
        return KT_OK;
    if (!d_q || !d_scratch || !d_out)
        return kt_err_set(err, KT_ERR_INVALID, "mla: NULL pointer");
    if ((st = check_cache(cache, err)) != KT_OK)
        return st;
    size_t part[4];
    int64_t n_split, split_rows;
    mla_scratch_parts(m, n_tok, n_kv_max, part, &n_split, &split_rows);
    if (scratch_bytes < part[0] + part[1] + part[2] + part[3])
        return kt_err_set(err, KT_ERR_INVALID, "mla: scratch of %zu bytes, %zu needed", scratch_bytes,
                          part[0] + part[1] + part[2] + part[3]);
    const int64_t H = m->n_head, dn = m->nope_dim, dr = m->rope_dim, dv = m->v_dim, kvr = m->kv_rank;
    const int64_t D = kvr + dr;
    cudaStream_t s = (cudaStream_t)stream;
    uint8_t *base = (uint8_t *)d_scratch;
    struct mla_args a = {};
    a.q_lat = (const float *)base;
    a.o_lat = (float *)(base + part[0]);
    a.part_o = n_split > 1 ? (float *)(base + part[0] + part[1]) : NULL;
    a.part_ml = n_split > 1 ? (float *)(base + part[0] + part[1] + part[2]) : NULL;
    a.cache = *cache;
    a.n_kv_max = n_kv_max;
    a.split_rows = split_rows;
    a.H = (int)H;
    a.kvr = (int)kvr;
    a.D = (int)D;
    a.n_split = (int)n_split;
    a.scale = m->kq_scale;

    /* q_lat[t,h][0:kvr] = W_UK,h^T q_nope[t,h]: head h's kvr rows of attn_k_b against q_nope */
    struct kt_cuda_mm_args mm = {};
    mm.type = m->w_uk.type;
    mm.w = (const uint8_t *)m->w_uk.data;
    mm.row_bytes = kt_cuda_mat_row_bytes(&m->w_uk);
    mm.n_in = dn;
    mm.n_out = kvr;
    mm.w_batch_rows = kvr;
    mm.x = d_q;
    mm.x_stride = H * (dn + dr);
    mm.x_batch = dn + dr;
    mm.y = (float *)a.q_lat;
    mm.y_stride = H * D;
    mm.y_batch = D;
    mm.n_tok = n_tok;
    mm.n_batch = H;
    mm.epilogue = KT_CUDA_MM_STORE;
    if ((st = kt_cuda_mm(&mm, KT_CUDA_MATMUL_GEMV, s, err)) != KT_OK)
        return st;
    const int64_t n_pe = n_tok * H * dr, pe_blocks = (n_pe + MLA_THREADS - 1) / MLA_THREADS;
    mla_copy_pe<<<(unsigned)(pe_blocks < 65535 ? pe_blocks : 65535), MLA_THREADS, 0, s>>>((float *)a.q_lat, d_q,
                                                                                           n_tok, H, dn, dr, kvr);
    if ((st = kt_cuda_launched("mla q_pe copy launch", err)) != KT_OK)
        return st;

    const dim3 grid((unsigned)n_tok, (unsigned)((H + MLA_HEADS - 1) / MLA_HEADS), (unsigned)n_split);
    mla_attend<<<grid, MLA_THREADS, mla_smem_bytes(D), s>>>(a);
    if ((st = kt_cuda_launched("mla attention launch", err)) != KT_OK)
        return st;
    if (n_split > 1) {
        mla_combine<<<(unsigned)(n_tok * H), MLA_THREADS, 0, s>>>(a);
        if ((st = kt_cuda_launched("mla combine launch", err)) != KT_OK)
            return st;
    }

    /* out[t,h] = W_UV,h o_lat[t,h]: head h's dv rows of attn_v_b */
    mm.type = m->w_uv.type;
    mm.w = (const uint8_t *)m->w_uv.data;
    mm.row_bytes = kt_cuda_mat_row_bytes(&m->w_uv);
    mm.n_in = kvr;
    mm.n_out = dv;
    mm.w_batch_rows = dv;
    mm.x = a.o_lat;
    mm.x_stride = H * kvr;
    mm.x_batch = kvr;
    mm.y = d_out;
    mm.y_stride = H * dv;
    mm.y_batch = dv;
    return kt_cuda_mm(&mm, KT_CUDA_MATMUL_GEMV, s, err);
}
