/*
 * route.cu - DeepSeek MoE routing on the GPU: one block per token turns its
 * router logits into the k experts it uses and their weights, with exactly
 * runtime/forward/moe.c's kt_moe_route semantics (docs/deepseek2.md, MoE routing):
 *
 *     prob = sigmoid(z) or softmax(z);  sel = prob + bias
 *     groups: score = best + second best sel; keep the n_group_used best; sel = -inf elsewhere
 *     k times: the untaken expert with the largest sel, ties to the lowest id
 *     w_j = prob[idx_j], / max(sum w, 6.103515625e-5) if norm, * scale
 *
 * Every float step is the CPU's, unfused and in its order; exp is taken in
 * double and rounded once (kt_dev_expf), which agrees with glibc's expf but
 * for rare last-bit cases, so the selection is the CPU's.  The sequential
 * parts (group choice, weight normalisation) run on one thread exactly as
 * the CPU writes them.  Cost: k block-wide argmax passes over Ne; a few
 * microseconds per layer, latency-bound.
 */
#include "common.cuh"

#define ROUTE_THREADS 256
#define ROUTE_WARPS (ROUTE_THREADS / 32)
#define ROUTE_MAX_EXPERTS 2048
#define ROUTE_NONE 0xffffffffu

struct route_args {
    const float *logits; /* (n_tok, Ne) */
    const float *bias;   /* (Ne) or NULL */
    uint32_t *experts;   /* (n_tok, k) */
    float *weights;      /* (n_tok, k) */
    uint32_t n_expert, k, n_groups, n_group_used;
    int sigmoid, norm;
    float scale;
};

/* (v, i) ranks above (bv, bi): larger value, ties to the lower index; ROUTE_NONE ranks last. */
static __device__ __forceinline__ bool ranks_above(float v, uint32_t i, float bv, uint32_t bi)
{
    return i != ROUTE_NONE && (bi == ROUTE_NONE || v > bv || (v == bv && i < bi));
}

__global__ static void __launch_bounds__(ROUTE_THREADS) route_tokens(const struct route_args a)
{
    extern __shared__ float sm[];
    float *prob = sm;                                          /* (Ne) gating scores: they weigh */
    float *sel = prob + a.n_expert;                            /* (Ne) selection scores: they pick */
    float *group_score = sel + a.n_expert;                     /* (G) */
    unsigned char *taken = (unsigned char *)(group_score + a.n_groups); /* (Ne) */
    unsigned char *group_kept = taken + a.n_expert;           /* (G) */
    __shared__ float best_v[ROUTE_WARPS];
    __shared__ uint32_t best_i[ROUTE_WARPS];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const uint32_t Ne = a.n_expert, G = a.n_groups;
    const int64_t t = blockIdx.x;
    const float *z = a.logits + t * Ne;

    for (uint32_t e = tid; e < Ne; e += ROUTE_THREADS) {
        prob[e] = a.sigmoid ? kt_dev_sigmoid(z[e]) : z[e];
        taken[e] = 0;
    }
    if (!a.sigmoid) { /* kt_softmax: each thread rewrites only its own entries */
        float max = -INFINITY;
        for (uint32_t e = tid; e < Ne; e += ROUTE_THREADS)
            max = fmaxf(max, prob[e]);
        max = kt_block_max(max);
        if (max == -INFINITY) {
            for (uint32_t e = tid; e < Ne; e += ROUTE_THREADS)
                prob[e] = 0.0f;
        } else {
            double sum = 0.0;
            for (uint32_t e = tid; e < Ne; e += ROUTE_THREADS) {
                prob[e] = kt_dev_expf(__fsub_rn(prob[e], max));
                sum += prob[e];
            }
            sum = kt_block_sum_double(sum);
            const float inv = (float)(1.0 / sum);
            for (uint32_t e = tid; e < Ne; e += ROUTE_THREADS)
                prob[e] = __fmul_rn(prob[e], inv);
        }
    }
    for (uint32_t e = tid; e < Ne; e += ROUTE_THREADS)
        sel[e] = __fadd_rn(prob[e], a.bias ? a.bias[e] : 0.0f);
    __syncthreads();

    /* Group limit: the scan per group and the choice of groups are the CPU's loops. */
    if (G > 1 && a.n_group_used < G) {
        const uint32_t per = Ne / G;
        for (uint32_t g = tid; g < G; g += ROUTE_THREADS) {
            float best = -INFINITY, second = -INFINITY;
            for (uint32_t e = g * per; e < (g + 1) * per; e++) {
                if (sel[e] > best) {
                    second = best;
                    best = sel[e];
                } else if (sel[e] > second) {
                    second = sel[e];
                }
            }
            group_score[g] = per > 1 ? __fadd_rn(best, second) : best;
            group_kept[g] = 0;
        }
        __syncthreads();
        if (tid == 0) {
            for (uint32_t i = 0; i < a.n_group_used; i++) {
                uint32_t best = ROUTE_NONE;
                for (uint32_t g = 0; g < G; g++)
                    if (!group_kept[g] && (best == ROUTE_NONE || group_score[g] > group_score[best]))
                        best = g;
                group_kept[best] = 1;
            }
        }
        __syncthreads();
        for (uint32_t e = tid; e < Ne; e += ROUTE_THREADS)
            if (!group_kept[e / per])
                sel[e] = -INFINITY;
        __syncthreads();
    }

    /* The k best selection scores, best first. */
    uint32_t *experts = a.experts + t * a.k;
    float *weights = a.weights + t * a.k;
    for (uint32_t j = 0; j < a.k; j++) {
        float bv = -INFINITY;
        uint32_t bi = ROUTE_NONE;
        for (uint32_t e = tid; e < Ne; e += ROUTE_THREADS)
            if (!taken[e] && ranks_above(sel[e], e, bv, bi)) {
                bv = sel[e];
                bi = e;
            }
        for (int o = 16; o > 0; o >>= 1) {
            const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
            const uint32_t oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (ranks_above(ov, oi, bv, bi)) {
                bv = ov;
                bi = oi;
            }
        }
        if (lane == 0) {
            best_v[warp] = bv;
            best_i[warp] = bi;
        }
        __syncthreads();
        if (tid == 0) {
            for (int w = 1; w < ROUTE_WARPS; w++)
                if (ranks_above(best_v[w], best_i[w], bv, bi)) {
                    bv = best_v[w];
                    bi = best_i[w];
                }
            /* bi is valid: k <= Ne leaves an untaken expert */
            taken[bi] = 1;
            experts[j] = bi;
            weights[j] = prob[bi];
        }
        __syncthreads(); /* taken and best_* are reused next round */
    }

    if (tid == 0) {
        if (a.norm) {
            float sum = 0.0f;
            for (uint32_t j = 0; j < a.k; j++)
                sum = __fadd_rn(sum, weights[j]);
            const float denom = sum > 6.103515625e-5f ? sum : 6.103515625e-5f;
            for (uint32_t j = 0; j < a.k; j++)
                weights[j] = __fdiv_rn(weights[j], denom);
        }
        for (uint32_t j = 0; j < a.k; j++)
            weights[j] = __fmul_rn(weights[j], a.scale);
    }
}

extern "C" kt_status kt_cuda_route(const struct kt_cuda_router *r, const float *d_logits, const float *d_bias,
                                   int64_t n_tok, uint32_t *d_experts, float *d_weights, void *stream, kt_err *err)
{
    if (!r)
        return kt_err_set(err, KT_ERR_INVALID, "route: no router");
    const uint32_t Ne = r->n_expert, G = r->n_groups;
    if (Ne == 0 || Ne > ROUTE_MAX_EXPERTS || r->n_used == 0 || r->n_used > Ne || G == 0 || Ne % G != 0 ||
        r->n_group_used > G || (r->gating != 1 && r->gating != 2))
        return kt_err_set(err, KT_ERR_INVALID,
                          "route: bad router (%u experts (at most %d), top-%u, %u of %u groups, gating %d)", Ne,
                          ROUTE_MAX_EXPERTS, r->n_used, r->n_group_used, G, r->gating);
    if (n_tok < 0 || n_tok > KT_CUDA_MAX_GRID_X)
        return kt_err_set(err, KT_ERR_INVALID, "route: bad token count %lld", (long long)n_tok);
    if (n_tok == 0)
        return KT_OK;
    if (!d_logits || !d_experts || !d_weights)
        return kt_err_set(err, KT_ERR_INVALID, "route: NULL pointer");
    struct route_args a = {d_logits, d_bias, d_experts, d_weights, Ne, r->n_used, G, r->n_group_used,
                           r->gating == 2, r->norm != 0, r->scale};
    const size_t smem = (2 * (size_t)Ne + G) * sizeof(float) + Ne + G;
    route_tokens<<<(unsigned)n_tok, ROUTE_THREADS, smem, (cudaStream_t)stream>>>(a);
    return kt_cuda_launched("route launch", err);
}
