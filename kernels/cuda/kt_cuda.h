/*
 * kt_cuda.h - C entry points of kt's CUDA kernels.
 *
 * Callable from C whether or not kt was built with CUDA: without it,
 * kt_cuda_device_count() returns 0 and every other entry point fails.  These
 * functions never exit or print; they return a kt_status and, on failure,
 * fill the caller's kt_err (which may be NULL): KT_ERR_INVALID for an
 * argument out of range, KT_ERR_UNSUPPORTED for what the kernels do not
 * read (or no usable device), KT_ERR_NOMEM when device memory runs out,
 * KT_ERR_IO for any other failure CUDA reports.
 */
#ifndef KT_CUDA_H
#define KT_CUDA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "status.h" /* inside the extern "C": nvcc compiles the .cu files as C++ */

/* Number of usable CUDA devices; 0 when built without CUDA, when no driver is
 * loaded or no device is present.  why (may be NULL) gets the reason for 0
 * (KT_ERR_UNSUPPORTED). */
int kt_cuda_device_count(kt_err *why);

/* Dequantizes n elements of a GGML type (enum kt_type) on device 0:
 * host src (kt_type_row_bytes(type, n) bytes) -> host dst (n floats), through
 * device memory.  Supported: F32, F16, BF16, Q8_0, Q4_K, Q5_K, Q6_K. */
kt_status kt_cuda_dequantize_host(int type, const void *src, float *dst, int64_t n, kt_err *err);

/* The same on device pointers, enqueued on stream (a cudaStream_t, NULL = default). */
kt_status kt_cuda_dequantize(int type, const void *d_src, float *d_dst, int64_t n, void *stream, kt_err *err);

/* ---- device memory ------------------------------------------------------------
 * For callers that must not include CUDA's headers (tests, C hosts).  Copies
 * are synchronous: they wait for work queued on the default stream. */

kt_status kt_cuda_alloc(void **d_ptr, size_t bytes, kt_err *err);
void kt_cuda_free(void *d_ptr); /* NULL is fine */
kt_status kt_cuda_copy_to_device(void *d_dst, const void *src, size_t bytes, kt_err *err);
kt_status kt_cuda_copy_to_host(void *dst, const void *d_src, size_t bytes, kt_err *err);
/* Waits for all queued work; reports a kernel's asynchronous failure. */
kt_status kt_cuda_synchronize(kt_err *err);

/*
 * Every entry point below takes device pointers, enqueues on stream (a
 * cudaStream_t, NULL = default) and returns KT_OK, or fails when an
 * argument is out of range or CUDA refuses the launch; a kernel's own
 * failure surfaces at the next synchronizing call.  Shapes in comments are
 * (rows, columns) of row-major float arrays unless stated otherwise.
 */

/* ---- element-wise ops (ops.cu) --------------------------------------------------- */

/* y[r] = x[r] / sqrt(mean(x[r]^2) + eps) * w for rows r < rows of n values,
 * rows x_stride / y_stride floats apart; y is x or does not overlap it.  As
 * kt_rmsnorm: sum of squares in double, so results match it to the last bit
 * except in rare double-rounding cases (<= 1 ulp). */
kt_status kt_cuda_rmsnorm(float *d_y, int64_t y_stride, const float *d_x, int64_t x_stride, const float *d_w,
                          int64_t rows, int64_t n, float eps, void *stream, kt_err *err);

/* In place, for every row r < rows and head h < n_heads, the n_dims values at
 * x + r*row_stride + h*head_stride + offset are rotated in adjacent pairs by
 * cos_sin (rows, n_dims), the table kt_rope_angles gives for row r's
 * position (computed on the host: the same float angles as the CPU, so the
 * result is bit-identical to kt_rope_apply). */
kt_status kt_cuda_rope(float *d_x, int64_t rows, int64_t row_stride, int64_t n_heads, int64_t head_stride,
                       int64_t offset, const float *d_cos_sin, int64_t n_dims, void *stream, kt_err *err);

/* out[i] = silu(gate[i]) * up[i] (n); out may alias either.  As kt_swiglu. */
kt_status kt_cuda_swiglu(float *d_out, const float *d_gate, const float *d_up, int64_t n, void *stream, kt_err *err);

/* y[i] = a[i] + b[i] (n); y may alias either (the residual add). */
kt_status kt_cuda_add(float *d_y, const float *d_a, const float *d_b, int64_t n, void *stream, kt_err *err);

/* In place, each of rows contiguous rows of n values = softmax(row), as
 * kt_softmax: -inf entries become 0, an all -inf row becomes all 0. */
kt_status kt_cuda_softmax(float *d_x, int64_t rows, int64_t n, void *stream, kt_err *err);

/* ---- MoE routing (route.cu) -------------------------------------------------------- */

struct kt_cuda_router {
    uint32_t n_expert;      /* Ne, at most 2048 */
    uint32_t n_used;        /* k, 1..Ne */
    uint32_t n_groups;      /* expert groups (1: no group limit); Ne % n_groups == 0 */
    uint32_t n_group_used;  /* groups kept, <= n_groups */
    int gating;             /* enum kt_gating's values: 1 softmax, 2 sigmoid */
    int norm;               /* expert_weights_norm */
    float scale;            /* expert_weights_scale */
};

/* For each token t < n_tok: experts (n_tok, k) and weights (n_tok, k) from
 * logits (n_tok, Ne) and the selection bias (Ne, or NULL) - kt_moe_route's
 * selection exactly (ties: lowest expert id) for logits without NaN. */
kt_status kt_cuda_route(const struct kt_cuda_router *r, const float *d_logits, const float *d_bias, int64_t n_tok,
                        uint32_t *d_experts, float *d_weights, void *stream, kt_err *err);

/* ---- quantized matmul (gemv.cu, blaslt.cu) ------------------------------------------ */

/* A weight matrix in device memory, GGUF layout: n_out rows of n_in elements. */
struct kt_cuda_mat {
    int type;               /* enum kt_type: F32, F16, BF16, Q8_0, Q4_0, Q5_0, Q4_K, Q5_K, Q6_K or FP8_B128 */
    const void *data;       /* device; 4-byte aligned for F32 and FP8_B128, 2 for the others */
    int64_t n_in, n_out;    /* n_in a multiple of the type's block */
    size_t row_bytes;       /* bytes from a row to the next; 0: kt_type_row_bytes(type, n_in) */
};

enum kt_cuda_matmul_path {
    KT_CUDA_MATMUL_AUTO = 0,   /* GEMV up to 8 tokens, TENSOR above */
    KT_CUDA_MATMUL_GEMV = 1,   /* one warp per weight row, F32 activations, fp32 sums: weight-bandwidth bound */
    KT_CUDA_MATMUL_TENSOR = 2, /* 64x64 tiles dequantized to BF16, tensor cores, fp32 sums (sm_80+) */
};

/* KT_OK when the GPU's matmul reads w, else why not, naming `what`
 * (KT_ERR_UNSUPPORTED: its type; KT_ERR_INVALID: no data, a bad shape or
 * alignment): to refuse weights when they are placed rather than at the
 * first step. */
kt_status kt_cuda_mat_usable(const struct kt_cuda_mat *w, const char *what, kt_err *err);

/* y (n_tok, n_out) = x (n_tok, n_in) . W^T. */
kt_status kt_cuda_matmul(const struct kt_cuda_mat *w, const float *d_x, int64_t n_tok, float *d_y, int path,
                         void *stream, kt_err *err);

/* Scratch bytes kt_cuda_matmul_lt needs for w and n_tok tokens: cuBLASLt's
 * workspace (32 MiB), x in BF16 (n_tok rows of n_in padded to 8) and W in
 * BF16 (n_out such rows; none for BF16 weights whose data and row_bytes are
 * 16-byte aligned: read in place), each part rounded up to 256 bytes.  0 for
 * weights kt_cuda_matmul rejects or n_tok < 1. */
size_t kt_cuda_matmul_lt_scratch_bytes(const struct kt_cuda_mat *w, int64_t n_tok);

/* y (n_tok, n_out) = x (n_tok, n_in) . W^T through cuBLASLt, for prefill-sized
 * batches: W (any type kt_cuda_matmul reads) and x are rounded to BF16
 * (nearest even) in scratch, then one BF16 GEMM with fp32 sums - the TENSOR
 * path's numerics.  scratch: device, 256-byte aligned, at least
 * kt_cuda_matmul_lt_scratch_bytes(w, n_tok), busy until the stream has run
 * this product.  n_tok >= 1.  For weights kt_cuda_matmul reads,
 * KT_ERR_UNSUPPORTED means cuBLASLt offers no algorithm for the shape: the
 * product was not queued, and kt_cuda_matmul can take it instead. */
kt_status kt_cuda_matmul_lt(const struct kt_cuda_mat *w, const float *d_x, int64_t n_tok, float *d_y, void *d_scratch,
                            size_t scratch_bytes, void *stream, kt_err *err);

/* One expert (or the shared experts) and the (token, expert) pairs it serves. */
struct kt_cuda_ffn_unit {
    struct kt_cuda_mat gate, up; /* n_ff rows of n_embd */
    struct kt_cuda_mat down;     /* n_embd rows of n_ff */
    uint32_t first_pair;         /* its pairs are [first_pair, first_pair + n_pairs) */
    uint32_t n_pairs;
};

/* The GPU counterpart of runtime/forward/moe.c's units: for every unit u (a host
 * array) and each of its pairs p,
 *     act[p]      = silu(gate_u . h[pair_token[p]]) * (up_u . h[pair_token[p]])
 *     pair_out[p] = down_u . act[p]
 * h (n_tok, n_embd); pair_token (n_pairs) token of each pair (a token >= n_tok
 * reads zeros); act (n_pairs, act_stride) scratch, act_stride >= every n_ff;
 * pair_out (n_pairs, n_embd).  Units with up to 8 pairs take the GEMV path,
 * larger ones the tensor path. */
kt_status kt_cuda_ffn_units(const struct kt_cuda_ffn_unit *units, uint32_t n_units, const float *d_h, int64_t n_tok,
                            int64_t n_embd, const uint32_t *d_pair_token, uint32_t n_pairs, float *d_act,
                            int64_t act_stride, float *d_pair_out, void *stream, kt_err *err);

/* ---- MLA attention (mla.cu) ------------------------------------------------------------- */

/*
 * One layer's MLA in the absorbed form (docs/deepseek2.md, Attention (MLA)), for
 * decode and prefill alike, over a paged latent cache of F32 rows
 * [c (kv_rank) | k_pe (rope_dim)]: runtime/forward/kv_cache.h's layout, blocks of
 * block_tokens positions of one sequence for every layer.
 */
struct kt_cuda_mla {
    int64_t n_head, nope_dim, rope_dim, v_dim, kv_rank; /* H, dn, dr, dv, kvr; kvr <= 1024, kvr + dr <= 760 */
    float kq_scale;
    struct kt_cuda_mat w_uk; /* attn_k_b: H*kvr rows of dn (row h*kvr + r = column r of W_UK,h) */
    struct kt_cuda_mat w_uv; /* attn_v_b: H*dv rows of kvr */
};

/* Where each query token's context lives: row j (position j) of token t's
 * sequence in this layer is
 *     pool + (block_ids[first_block[t] + j / block_tokens] * block_elems
 *          + layer_offset + (j % block_tokens) * (kv_rank + rope_dim)) elements
 * of row_type (F32, BF16 or F16: kernels/cpu/ref/ops.h, enum kt_row_type;
 * the kernels widen BF16/F16 elements exactly as they load them and round
 * the rows they write to nearest even)
 * and its context is rows j < n_kv[t] (causal: the token's own position is
 * n_kv[t] - 1).  A cache of contiguous rows is one block per token with
 * block_tokens >= its context and layer_offset 0. */
struct kt_cuda_mla_cache {
    void *pool;                 /* device */
    int64_t block_elems;        /* elements from a block to the next (n_layer * block_tokens * row) */
    int64_t block_tokens;       /* positions per block, >= 1 */
    int64_t layer_offset;       /* elements from a block's start to this layer's first row */
    const uint32_t *block_ids;  /* device: the step's block tables, one after another */
    const uint32_t *first_block;/* (n_tok) device: token t's table starts at block_ids[first_block[t]] */
    const uint32_t *n_kv;       /* (n_tok) device: rows in token t's context (0: the token is skipped) */
    int row_type;               /* enum kt_row_type: 0 F32, 1 BF16, 2 F16 */
};

/* The cache rows of n_tok tokens, each at its position n_kv[t] - 1 (tokens
 * with n_kv[t] == 0 are skipped) = [rmsnorm(kv_a[t][0:kvr]) * norm_w |
 * kv_a[t][kvr:] roped by cos_sin[t]]; kv_a (n_tok, kvr + dr), norm_w (kvr),
 * cos_sin (n_tok, dr) from kt_rope_angles.  As runtime/forward/attention.c. */
kt_status kt_cuda_mla_write_rows(const struct kt_cuda_mla *m, const float *d_kv_a, const float *d_norm_w, float eps,
                                 const float *d_cos_sin, const struct kt_cuda_mla_cache *cache, int64_t n_tok,
                                 void *stream, kt_err *err);

/* Scratch bytes kt_cuda_mla_attention needs for n_tok queries whose contexts
 * are at most n_kv_max rows. */
size_t kt_cuda_mla_scratch_bytes(const struct kt_cuda_mla *m, int64_t n_tok, int64_t n_kv_max);

/* out (n_tok, H*dv) = per head h: W_UV,h softmax_t(kq_scale [W_UK,h^T q_nope | q_pe] . row_t) c_t
 * over rows t < n_kv[tok] of the token's context in cache (each n_kv <=
 * n_kv_max: rows past n_kv_max are never read).  q (n_tok, H*(dn+dr)) holds
 * roped queries [q_nope | q_pe] per head.  fp32 throughout; W_UK/W_UV
 * products take F32 activations. */
kt_status kt_cuda_mla_attention(const struct kt_cuda_mla *m, const float *d_q, const struct kt_cuda_mla_cache *cache,
                                int64_t n_tok, int64_t n_kv_max, void *d_scratch, size_t scratch_bytes, float *d_out,
                                void *stream, kt_err *err);

/* ---- one layer's attention block (attention.cu) ----------------------------------------
 *
 * x += W_o MLA(rmsnorm(x) * attn_norm) for n_tok tokens, as runtime/forward/attention.c
 * computes it in the absorbed form:
 *     q = W_qb (rmsnorm(W_qa h) * q_a_norm)   (or W_q h when q_rank == 0)
 *     kv_a = W_kva h;  the token's cache row = [rmsnorm(kv_a[:kvr]) * kv_a_norm | roped kv_a[kvr:]]
 *     q_pe of every head roped; MLA over each token's context (kt_cuda_mla_attention)
 * Every pointer is device memory. */
struct kt_cuda_attention_layer {
    const float *attn_norm;     /* (E) */
    const float *q_a_norm;      /* (q_rank), NULL when q_rank == 0 */
    const float *kv_a_norm;     /* (kvr) */
    struct kt_cuda_mat q_a, q_b;/* {E -> q_rank}, {q_rank -> H*(dn+dr)} when q_rank > 0 */
    struct kt_cuda_mat q;       /* {E -> H*(dn+dr)} when q_rank == 0 */
    struct kt_cuda_mat kv_a;    /* {E -> kvr+dr} */
    struct kt_cuda_mat out;     /* {H*dv -> E} */
    struct kt_cuda_mla mla;     /* shapes, kq_scale, W_UK, W_UV */
    int64_t n_embd, q_rank;
    float eps;                  /* RMSNorm epsilon */
};

/* The step's tokens and the buffers the block works in (device memory). */
/* Batches from which kt_cuda_attention_block's projections take cuBLASLt. */
#define KT_CUDA_LT_MIN_TOKENS 64

struct kt_cuda_attention_step {
    float *x;                   /* (n_tok, E) the residual stream, updated in place */
    int64_t n_tok, n_kv_max;    /* n_kv_max >= every cache.n_kv[t] */
    const float *cos_sin;       /* (n_tok, dr) RoPE table of each token's position (kt_rope_angles) */
    struct kt_cuda_mla_cache cache; /* with this layer's layer_offset */
    float *h;                   /* (n_tok, E) */
    float *qa;                  /* (n_tok, q_rank) when q_rank > 0 */
    float *q;                   /* (n_tok, H*(dn+dr)) */
    float *kv_a;                /* (n_tok, kvr+dr) */
    float *o;                   /* (n_tok, H*dv) */
    float *y;                   /* (n_tok, E) */
    void *mla_scratch;          /* kt_cuda_mla_scratch_bytes(&mla, n_tok, n_kv_max) */
    size_t mla_scratch_bytes;
    /* Optional (NULL: none): projections of at least KT_CUDA_LT_MIN_TOKENS
     * tokens go through kt_cuda_matmul_lt when their scratch fits here. */
    void *lt_scratch;
    size_t lt_scratch_bytes;
};

kt_status kt_cuda_attention_block(const struct kt_cuda_attention_layer *L, const struct kt_cuda_attention_step *s,
                                  void *stream, kt_err *err);

/* ---- device, stream and asynchronous copies (stream.cu), for runtime/forward/backend.c ---------- */

kt_status kt_cuda_set_device(int device, kt_err *err);
kt_status kt_cuda_mem_info(size_t *free_bytes, size_t *total_bytes, kt_err *err);
kt_status kt_cuda_stream_create(void **stream, kt_err *err);
void kt_cuda_stream_destroy(void *stream);
enum kt_cuda_copy_kind { KT_CUDA_TO_HOST = 0, KT_CUDA_TO_DEVICE = 1, KT_CUDA_ON_DEVICE = 2 };
/* A copy on stream of the given kind (enum kt_cuda_copy_kind): host to
 * device, device to host, or within the device. */
kt_status kt_cuda_copy_async(void *dst, const void *src, size_t bytes, int kind, void *stream, kt_err *err);
/* fn(ctx) on a host thread once the stream's earlier work is done; fn must not call CUDA. */
kt_status kt_cuda_launch_host(void *stream, void (*fn)(void *), void *ctx, kt_err *err);
kt_status kt_cuda_stream_synchronize(void *stream, kt_err *err);

/* Timing events (for the backend's busy and transfer times): recorded on a
 * stream; the time between two of them once both have completed. */
kt_status kt_cuda_event_create(void **event, kt_err *err);
void kt_cuda_event_destroy(void *event);
kt_status kt_cuda_event_record(void *event, void *stream, kt_err *err);
kt_status kt_cuda_event_elapsed_ns(void *start, void *end, uint64_t *ns, kt_err *err);

/* Stream capture into a CUDA graph: between begin and end, work queued on
 * stream is recorded instead of run (kernels and device-to-device copies;
 * host copies and host functions do not belong in it); end instantiates
 * the executable graph, which launch queues again as one operation. */
kt_status kt_cuda_capture_begin(void *stream, kt_err *err);
kt_status kt_cuda_capture_end(void *stream, void **graph_exec, kt_err *err);
kt_status kt_cuda_graph_launch(void *graph_exec, void *stream, kt_err *err);
void kt_cuda_graph_destroy(void *graph_exec);

/* Page-locks host memory the stream copies to and from (so they are real
 * asynchronous DMA, not staged); unregister before freeing it. */
kt_status kt_cuda_host_register(void *ptr, size_t bytes, kt_err *err);
void kt_cuda_host_unregister(void *ptr);

#ifdef __cplusplus
}
#endif

#endif
