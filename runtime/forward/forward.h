/*
 * forward.h - what the pieces of the forward step share (internal to
 * engine.c, attention.c, moe.c and step_ops.c; callers use engine.h).
 *
 * The engine holds views of every weight (read in place from the mapped
 * GGUF; routed experts from the expert store unless experts_in_place), the step's activation buffers sized for max_batch_tokens, one
 * scratch area per thread, and the batch as grouped by sequence.  Nothing
 * here allocates during a step: every buffer is sized at creation.
 */
#ifndef KT_FORWARD_H
#define KT_FORWARD_H

#include <stdbool.h>
#include <stdint.h>

#include "backend.h"
#include "engine.h"
#include "engine_test.h"
#include "expert_store.h"
#include "kt_cuda.h"
#include "kv_cache.h"
#include "matmul.h"
#include "moe.h"
#include "cpu/ref/ops.h"
#include "pool.h"

/* One FFN (dense layer, shared experts, or one routed expert once sliced). */
struct kt_ffn_weights {
    struct kt_mat gate, up;     /* {E -> n_ff} */
    struct kt_mat down;         /* {n_ff -> E} */
    int64_t n_ff;
};

struct kt_layer_weights {
    const float *attn_norm;     /* (E) */
    const float *q_a_norm;      /* (qr), NULL when qr == 0 */
    const float *kv_a_norm;     /* (kvr) */
    const float *ffn_norm;      /* (E) */
    struct kt_mat q_a;          /* {E -> qr} (qr > 0) */
    struct kt_mat q_b;          /* {qr -> H*dk} (qr > 0) */
    struct kt_mat q;            /* {E -> H*dk} (qr == 0) */
    struct kt_mat kv_a;         /* {E -> kvr+dr}: [c_raw | k_pe] */
    /* W_UK,h and W_UV,h.  Split files: uk = attn_k_b as H*kvr rows of dn
     * (row h*kvr + r = column r of W_UK,h, the absorbed direction), uv =
     * attn_v_b as H*dv rows of kvr.  Fused files: both are attn_kv_b, H*(dn+dv)
     * rows of kvr; head h's W_UK rows at h*(dn+dv), its W_UV rows after them. */
    struct kt_mat uk, uv;
    /* The absorbed form's views of split uk and uv: copies packed for the
     * level's kernel where it has a format (uk, uv stay in GGUF rows for the
     * expanded form, which dequantizes them), else uk and uv themselves. */
    struct kt_mat uk_abs, uv_abs;
    bool fused_kv_b;
    uint64_t uk_uv_bytes;       /* bytes of attn_k_b + attn_v_b (or attn_kv_b) */
    struct kt_mat out;          /* {H*dv -> E} */

    bool is_moe;
    struct kt_ffn_weights dense;    /* leading dense layers */
    struct kt_ffn_weights shared;   /* shared experts (n_ff = f*Ns; 0 if none) */
    struct kt_mat router;           /* {E -> Ne}, F32 */
    const float *exp_probs_b;       /* (Ne) or NULL */
    /* Stacked experts: expert x is rows [x*f, (x+1)*f) of gate_exps and up_exps and
     * rows [x*E, (x+1)*E) of down_exps.  With ffn_gate_up_exps (gate_up_fused)
     * gate_exps is that tensor: expert x's gate rows [2xf, 2xf+f), up rows after. */
    struct kt_mat gate_exps, up_exps, down_exps;
    bool gate_up_fused;
};

/* The tokens of one sequence in this step: positions start .. start+n-1. */
struct kt_seq_chunk {
    uint32_t seq;
    uint32_t start;             /* the sequence's length before the step */
    uint32_t n;
    uint32_t *tokens;           /* [n] batch indices, in position order */
    bool expanded;              /* attention form for this chunk */
};

/* One FFN's work in a step: its weights and the (token, expert) pairs it
 * serves, pairs first_pair .. first_pair + n_pairs - 1 of pair_token. */
struct kt_ffn_unit {
    struct kt_ffn_weights w;
    uint32_t first_pair, n_pairs;
    uint32_t first_gate_up_task, first_down_task; /* numbered over the step's units */
    const uint8_t *hq_gate, *hq_up; /* h quantized for gate and for up: (T, *_row_bytes) */
    size_t hq_gate_row_bytes, hq_up_row_bytes;
    bool up_shares_gate_rows;       /* up reads gate's format: hq_pairs_up is not filled */
    /* A row-sliced expert (w's data NULL): node n's rows in
     * sliced->slice[n], as layout->slice[n] says; NULL: w holds it whole */
    const struct kt_stored_expert *sliced;
    const struct kt_expert_layout *layout;
};

/* The buffers FFN units compute in (moe.c): the host's, or the device's
 * (the same shapes, in its memory).  T = max_batch_tokens, pairs = T*k + T. */
struct kt_moe_bufs {
    uint8_t *hq[4];             /* (T, hq_row_bytes) h quantized per activation format */
    size_t hq_row_bytes;
    /* (pairs, hq_row_bytes) h of each pair's token as its unit's gate (up)
     * reads it, so a unit's activations are consecutive rows for its gemm */
    uint8_t *hq_pairs_gate, *hq_pairs_up;
    float *act;                 /* (pairs, act_stride) silu(gate) * up per pair */
    size_t act_stride;          /* max n_ff */
    uint8_t *act_q;             /* (pairs, act_q_stride) act in down's activation format */
    size_t act_q_stride;
    float *pair_out;            /* (pairs, E) each pair's FFN output */
};

/* One phase of FFN-unit work for one pool or the device (moe.c): its items
 * are offset + [0, n) of the phase's tasks (or pairs). */
struct kt_units_job {
    struct kt_engine *e;
    const struct kt_moe_bufs *b;
    uint32_t n_units;
    int64_t offset;
    void (*fn)(void *ctx, int64_t begin, int64_t end, int thread); /* the phase's task (timed_task runs it) */
    int node;                   /* the topology node of the pool running it; -1: none */
    /* A row-sliced layer's tasks (slice_first not NULL): item l is in unit
     * u0 + k, the last k < n_sliced_units with slice_first[k] <= l, where
     * this job runs part `slice` of each unit's tasks with node `node`'s
     * shares; offset is unused then. */
    const uint32_t *slice_first;
    uint32_t u0, n_sliced_units;
    int slice;
};

/* What the device's queue runs in a step (kt_fwd_run_device_part): units
 * [u0, n_units), the step's last ones. */
struct kt_device_part {
    struct kt_engine *e;
    uint32_t u0, n_units;
};

/* Batches of at most this many tokens (decode) replay a layer's device
 * part (attention, then in MoE layers the FFN norm and the router) from a
 * graph, one per batch size and context bucket: a graph's MLA is sized for
 * its bucket's longest context (256 << b positions, at most n_ctx), so its
 * launch shapes stay fixed while a short context does not pay for n_ctx. */
#define KT_GRAPH_TOKENS 8
#define KT_GRAPH_BUCKETS 17 /* 256 .. 2^24 positions (n_ctx's limit) */
#define KT_GRAPH_SLOTS (KT_GRAPH_TOKENS * KT_GRAPH_BUCKETS)

/* Heads of one token that the absorbed form runs together, so each cached
 * latent row is read once for all of them (at most this many). */
#define KT_ATTN_HEAD_GROUP 8
/* Cache rows per key block: both forms stream the context in blocks of this
 * many rows (flash attention: an online softmax over the blocks, so no
 * buffer grows with the context); the expanded form gathers each block's
 * latents and multiplies them by W_UK,h and W_UV,h as one tiled product. */
#define KT_ATTN_EXPAND_ROWS 64

/* The engine's accelerator (backend.h) and what lives on it: weights copied
 * there, its step buffers, its graphs.  All zero without a device; device.c
 * creates and destroys it, engine.c and moe.c read it.  Shapes as in struct
 * kt_engine (T = max_batch_tokens). */
struct kt_engine_device {
    struct kt_backend *backend;         /* NULL: no device */
    /* [n_layer * n_expert] an expert's gate, up and down (GGUF rows) in device
     * memory; n_ff == 0: the expert is on the CPU */
    struct kt_ffn_weights *experts;
    struct kt_ffn_weights *shared;      /* [n_layer] shared experts on the device; NULL: on the CPU */
    struct kt_ffn_weights *dense;       /* [n_layer] dense FFNs of the leading layers there; NULL: on the CPU */
    void **blocks;                      /* [n_blocks] its allocations, freed at destroy */
    size_t *block_bytes;                /* [n_blocks] */
    bool *block_retired;                /* [n_blocks] its last reader is queued: freed at the end of the next step */
    uint32_t n_blocks, max_blocks, n_retired;
    /* experts staged in host memory whose copies to the device are queued:
     * freed with the retired blocks (kt_dev_retire) */
    struct kt_expert_upload *retired_uploads;
    bool sizing;                        /* setup's first pass: allocations only add up need_bytes */
    uint64_t work_bytes;                /* of the blocks, working buffers (alloc_work) */
    uint64_t need_bytes;
    float *h;                           /* (T, E) h sent each MoE layer */
    uint32_t *pair_token;               /* (T*k + T) pair_token sent with it */
    struct kt_cuda_ffn_unit *cuda_units; /* (Ne + 1) host: the device's units as kt_cuda_ffn_units takes them */
    /* [n_layer] copies of each layer with its attention weights (norms, MLA
     * projections) in device memory; NULL: attention on the CPU. */
    struct kt_layer_weights *layers;
    float *x;                           /* (T, E) the residual stream sent each layer */
    /* With attention, the FFN norm and router of MoE layers on the device:
     * h in h, logits (T, Ne), experts and weights (T, k) there, and h, the
     * experts and weights come back with x (the layer's expert units then
     * read h where it already is) */
    float *router_logits, *route_weights;
    uint32_t *route_experts;
    /* The device part of each layer (its attention, then in MoE layers the
     * FFN norm and the router), each job fixed to its layer and (for a
     * graph's recording) batch size, so a replay can tell it ran for the
     * wrong one: [n_layer * (KT_GRAPH_TOKENS + 1)], index
     * il * (KT_GRAPH_TOKENS + 1) + n (n = 0: any batch, run directly). */
    struct kt_device_job {
        struct kt_engine *e;
        uint32_t il, n_tok;
    } *jobs;
    /* Decode-sized batches replay each layer's device part from a graph
     * (backend.h) recorded the second time that layer meets that batch size
     * and context bucket (the first runs directly, so every kernel has been
     * loaded before a capture): [n_layer * KT_GRAPH_SLOTS], index
     * il * KT_GRAPH_SLOTS + bucket * KT_GRAPH_TOKENS + n_tok - 1, and
     * graph_seen beside it; NULL: no graphs (none asked for, or a recording
     * failed).  The step's key, set by kt_dev_begin_step: graph_slot, its
     * bucket * KT_GRAPH_TOKENS + n_tok - 1; graph_bound, the context its
     * graphs' MLA is sized for. */
    struct kt_backend_graph **graphs;
    uint8_t *graph_seen;
    uint32_t graph_slot, graph_bound;
    bool graph_mismatch;                /* this step: a replay ran for another batch size (the step fails) */
    /* attention on the device: the KV cache's pool lives in its memory (e->kv
     * addresses it; its copy-on-write copies run on the device's queue). */
    void *kv_pool;
    /* cuda attention (NULL otherwise): [n_layer] each layer's attention
     * weights as kt_cuda_attention_block takes them, the step it runs (device
     * buffers, this step's token count, cache tables), and the host copies
     * of the step's cache tables sent there once per step. */
    struct kt_cuda_attention_layer *cuda_layers;
    struct kt_cuda_attention_step cuda_step;
    uint32_t *step_block_ids;           /* (min(T, max_seqs) * blocks per sequence) the step's block tables */
    uint32_t *step_first_block;         /* (T) where each token's table starts in step_block_ids */
    uint32_t *step_n_kv;                /* (T) each token's context: its position + 1 */
    /* The output head in device memory (data NULL: on the host), the normed
     * rows sent there and the logits it returns (T, E), (T, V) */
    struct kt_mat output;
    float *head_x, *logits;
    struct kt_moe_bufs bufs;            /* the FFN buffers, on the device */
    bool buffers_pinned;                /* the engine's step buffers are page-locked for its copies (cuda) */
    struct kt_expert_cache *cache;      /* the decode-time expert cache (expert_cache.c); NULL: none */
};

/* Per-thread scratch; sizes in comments. */
struct kt_thread_scratch {
    const void **rows;          /* (n_ctx) cache rows of one sequence and layer (of the cache's row type) */
    const float **k_rows;       /* (KT_ATTN_EXPAND_ROWS) expanded keys of one head, one key block */
    const float **v_rows;       /* (KT_ATTN_EXPAND_ROWS) expanded values of one head, one key block */
    float *scores;              /* (KT_ATTN_HEAD_GROUP, KT_ATTN_EXPAND_ROWS) one key block's, per head of a group */
    float *q_max;               /* (max_batch_tokens) expanded form: each query's running score max */
    double *q_sum;              /* (max_batch_tokens) ... and running sum of exp(s - max) */
    float *query;               /* (KT_ATTN_HEAD_GROUP, kvr + dr): [q_abs | q_pe] per head */
    float *o_lat;               /* (KT_ATTN_HEAD_GROUP, kvr) */
    float *tmp;                 /* (max(KT_MAT_T_ROWS dn, kvr)) dequantized rows */
    uint8_t *act_q;             /* (max act row bytes of dn and kvr) a quantized query or latent */
    float *w_uk;                /* (dn, kvr) W_UK,h dequantized */
    float *w_uv;                /* (dv, kvr) W_UV,h dequantized */
    float *k_exp;               /* (KT_ATTN_EXPAND_ROWS, dk) expanded keys [k_nope | k_pe] of one head, one key block */
    float *v_exp;               /* (KT_ATTN_EXPAND_ROWS, dv) expanded values of one head, one key block */
    float *c_block;             /* (KT_ATTN_EXPAND_ROWS, kvr) latents c of consecutive cache rows */
};

/* engine.c: the largest quantized activation row (bytes) any matrix of model m
 * takes, split by what feeds it - block inputs, FFN gate/up inputs, FFN down
 * inputs (dense layers' and MoE layers' apart), attention heads - and the
 * widest dense and MoE FFNs; from the tensor table alone, so the engine's
 * buffers and kt_engine_device_work_bytes size alike. */
struct kt_fwd_act_sizes {
    size_t block_in, ffn_in, head_in;
    size_t dense_down_in, moe_down_in;
    int64_t dense_n_ff, moe_n_ff;
};

struct kt_engine {
    struct kt_model *model;
    struct kt_hparams hp;
    struct kt_engine_params params;
    struct kt_engine_test_params test; /* params.test's knobs (all off without one); params.test points here */
    uint64_t test_steps;        /* steps begun, for test.migrate_every_step */
    kt_engine_layer_hook layer_hook; /* called after each layer (kt_engine_set_layer_hook); NULL: none */
    void *layer_hook_ctx;
    struct kt_engine_stage_hooks stage_hooks; /* kt_engine_set_stage_hooks; step NULL: none */
    struct kt_pool *pool;       /* the step's: attention, matmuls, dense FFNs (never bound) */
    struct kt_kv_cache *kv;
    struct kt_layer_weights *layers; /* [n_layer] */
    struct kt_expert_store *experts; /* routed experts copied out of the file; NULL: read in place */
    struct kt_topology *topo;
    struct kt_pools *pools;     /* one per NUMA node with cores, if more than one node has cores */
    /* [n_pools] where the routed experts run: the node pools, or with one
     * node with cores the step's `pool` alone (a second pool there would
     * compete with it for the same cores) */
    struct kt_pool **expert_pools;
    int n_pools;
    bool help_first_pool;       /* the stepping thread helps expert_pools[0] in a phase (kt_pools_caller_helps) */
    int *node_pool;             /* [topo->n_nodes] pool of each node (0 for nodes without cores) */
    uint32_t *pool_units;       /* [n_pools + 1] the units of pool i this step: [pool_units[i], pool_units[i+1]) */
    struct kt_units_job *pool_jobs; /* [n_pools] */
    /* Row-sliced layers (engine.h layer_sliced) run on n_slices > 1 parts:
     * pool g computes part pool_slice[g] (-1: none; parts in node order) and
     * numbers its share of a step's tasks in slice_first[g * (Ne + 2) ..] */
    int n_slices;
    uint16_t slice_nodes;       /* bit i: node i holds a part (n_slices bits) */
    int *pool_slice;            /* [n_pools] */
    uint32_t *slice_first;      /* [n_pools * (Ne + 2)] */
    struct kt_mat token_embd;   /* {E -> V} rows are embeddings */
    const float *output_norm;   /* (E) */
    struct kt_mat output;       /* {E -> V} */
    struct kt_router router;
    struct kt_rope rope;
    float kq_scale;

    /* The batch of the current step. */
    const struct kt_batch_token *tokens; /* [n_tokens] */
    uint32_t n_tokens;
    struct kt_seq_chunk *chunks;    /* [max_seqs] */
    uint32_t n_chunks;
    uint32_t *chunk_tokens;         /* [2 * max_batch_tokens]: chunks[].tokens, then attention's work list */
    uint32_t *reserve_seqs, *reserve_n; /* [max_seqs] */
    uint32_t *seq_chunk;            /* [max_seqs] chunk index of a sequence, UINT32_MAX if none */

    /* Activations, T = max_batch_tokens. */
    float *x;                   /* (T, E) residual stream */
    float *h;                   /* (T, E) normalised input of a block */
    float *y;                   /* (T, E) a block's output */
    float *cos_sin;             /* (T, dr) RoPE angles of each token's position */
    float *q;                   /* (T, H*dk) */
    float *qa;                  /* (T, qr) */
    float *kv_a;                /* (T, kvr+dr) */
    float *o;                   /* (T, H*dv) attention heads' outputs */
    uint8_t *xq;                /* (T, max act row bytes) quantized matmul input */

    /* MoE step buffers (moe.c). */
    float *router_logits;       /* (T, Ne) */
    uint32_t *route_experts;    /* (T, k) */
    float *route_weights;       /* (T, k) */
    float *router_scratch;      /* (router scratch floats) */
    uint32_t *pair_token;       /* (T*k + T) token of each (token, expert) pair, grouped by unit */
    uint32_t *pair_of;          /* (T, k) pair index of token t's j-th expert */
    uint32_t *expert_pairs;     /* (Ne) pairs routed to each expert */
    uint32_t *expert_unit;      /* (Ne) unit of each expert this step */
    uint32_t *active_experts;   /* (Ne) experts with pairs this step, largest group first */
    int *expert_pool_of;        /* (Ne) the pool running each active expert */
    uint64_t *pool_load;        /* [n_pools] load given to each pool so far this step (moe.c choose_pools) */
    struct kt_ffn_unit *units;  /* (Ne + 1) the step's active experts, then the shared one */
    struct kt_moe_bufs bufs;    /* the host's FFN buffers */
    struct kt_fwd_act_sizes act_sizes; /* what bufs (and the device's) were sized by */
    void **packed_blocks;       /* [n_packed_blocks] host matrices repacked (engine.c), unmapped at destroy */
    size_t *packed_block_bytes;
    uint32_t n_packed_blocks, max_packed_blocks;
    uint32_t n_items[3];        /* the step's pairs, gate/up tasks, down tasks (moe.c) */

    /* The accelerator and what lives on it (all zero without one). */
    struct kt_engine_device dev;

    struct kt_thread_scratch *scratch; /* [n_threads] */
    void *buffers;              /* every buffer above, one allocation (engine.c) */
    uint64_t scratch_bytes;     /* its size */
    struct kt_engine_stats stats;
    struct kt_engine_layer_stats *layer_stats; /* [n_layer] */
    uint64_t step_node_busy[16]; /* the current layer's busy time per node pool (moe.c) */
    /* Routed tokens since creation or the last stats reset (kt_engine_route_counts):
     * route_counts[phase] (n_layer, Ne), KT_ROUTE_DECODE then KT_ROUTE_PREFILL, one
     * allocation; route_tokens[phase] the tokens; token_prefill (T) this step's
     * tokens' phase (1: prefill), set when the step begins. */
    uint64_t *route_counts[2];
    uint64_t route_tokens[2];
    uint8_t *token_prefill;
};

/* out = Attention(h) for every token of the step (attention.c):
 * h, out (n_tokens, E). */
void kt_fwd_attention(struct kt_engine *e, uint32_t il, const float *h, float *out);

/* x += Attention(RMSNorm(x)) for the step's tokens, with layer il's
 * attention weights where they live (host or device copies) (attention.c). */
void kt_fwd_attention_block(struct kt_engine *e, uint32_t il, float *x);

/* out = FFN(h): dense SwiGLU or MoE + shared experts (moe.c):
 * h, out (n_tokens, E). */
void kt_fwd_ffn(struct kt_engine *e, uint32_t il, const float *h, float *out);

/* y = W x: quantizes x (n_rows, m.n_in) into xq and multiplies; y (n_rows, m.n_out) (step_ops.c). */
void kt_fwd_matmul(struct kt_engine *e, const struct kt_mat *m, const float *x, int64_t n_rows, float *y,
                   uint8_t *xq);

/* The same with x already in xq, quantized for m.type (or a type of the same format). */
void kt_fwd_matmul_q(struct kt_engine *e, const struct kt_mat *m, const uint8_t *xq, int64_t n_rows, float *y);

/* ya = A xq and yb = B xq in one hand-off (kt_matmul_q_pair). */
void kt_fwd_matmul_q_pair(struct kt_engine *e, const struct kt_mat *a, const struct kt_mat *b, const uint8_t *xq,
                          int64_t n_rows, float *ya, float *yb);

/* Layer il's attention weights where attention runs: the device's copies
 * when attention_on_device, else the host's. */
static inline const struct kt_layer_weights *kt_fwd_attention_weights(const struct kt_engine *e, uint32_t il)
{
    return e->dev.layers ? &e->dev.layers[il] : &e->layers[il];
}

/* m (in device memory) as the CUDA kernels take it. */
static inline struct kt_cuda_mat kt_fwd_cuda_mat(const struct kt_mat *m)
{
    return (struct kt_cuda_mat){m->type, m->data, m->n_in, m->n_out, m->row_bytes};
}

/* Routed expert x of layer il lives on the device (moe.c). */
bool kt_fwd_expert_on_device(const struct kt_engine *e, uint32_t il, uint32_t x);

/* Expert x of layer L as the file holds it (views of the mapped GGUF). */
struct kt_ffn_weights kt_fwd_expert_gguf(const struct kt_engine *e, const struct kt_layer_weights *L, uint32_t x);

/* MoE layer il's FFN norm and router on the device's copies (moe.c):
 * dev_h = rmsnorm(dev_x), then experts and weights into dev_route_*; the
 * sim's half (runs kt's CPU code) and the GPU's (enqueues kernels). */
void kt_fwd_route_on_device(struct kt_engine *e, uint32_t il);
kt_status kt_fwd_route_on_cuda(struct kt_engine *e, uint32_t il, void *stream, kt_err *err);

/* Runs the device's units of the step (a kt_backend_fn). */
void kt_fwd_run_device_part(void *ctx);

/* Picks each chunk's attention form for this step. */
void kt_fwd_choose_attention_forms(struct kt_engine *e);

struct kt_fwd_act_sizes kt_fwd_act_sizes(const struct kt_model *m);
/* The FFN activation buffers for T tokens and pairs (token, expert) pairs: a
 * dense layer's T rows of its width, or a MoE layer's pairs of its experts'
 * (and shared experts') width, whichever is larger - not pairs of the dense
 * width (V3 / Kimi: 18432 against 2048).  Floats of act, bytes of act_q. */
size_t kt_fwd_act_floats(const struct kt_fwd_act_sizes *s, size_t T, size_t pairs);
size_t kt_fwd_act_q_bytes(const struct kt_fwd_act_sizes *s, size_t T, size_t pairs);
/* The act and act_q strides of the host's and the device's FFN buffers for a
 * dense (moe false) or a MoE layer's step. */
void kt_fwd_set_act_strides(struct kt_engine *e, bool moe);
/* p with every 0 that means a default replaced by that default (engine.h). */
struct kt_engine_params kt_fwd_params_resolved(const struct kt_hparams *hp, const struct kt_engine_params *p);

/* step_ops.c: the clock, x += y over n floats, and the KV cache's shape (its pool on the host). */
uint64_t kt_fwd_now_ns(void);
void kt_fwd_add_rows(float *x, const float *y, size_t n);
struct kt_kv_cache_params kt_fwd_kv_params(const struct kt_engine *e);

/* ---- step_clock.c: the step's time by part, for kt_engine_stats and the layers' stats -------- */

enum kt_step_part { KT_PART_EMBED_HEAD, KT_PART_ATTENTION, KT_PART_COMBINE, KT_PART_FFN, KT_STEP_PARTS };

struct kt_step_clock {
    uint64_t last_ns;                   /* the last lap */
    uint64_t part_ns[KT_STEP_PARTS];    /* this layer's time by part */
    uint64_t router_ns_before;          /* stats.router_ns when the layer began */
    struct kt_backend_stats device_before; /* the device's queue when the layer began */
};

void kt_step_clock_start(struct kt_engine *e, struct kt_step_clock *c);
/* The time since the last lap (or the layer's start) goes to `part`. */
void kt_step_clock_lap(struct kt_engine *e, struct kt_step_clock *c, enum kt_step_part part);
void kt_step_clock_begin_layer(struct kt_engine *e, struct kt_step_clock *c);
void kt_step_clock_end_layer(struct kt_engine *e, struct kt_step_clock *c, uint32_t il);

/* ---- device.c: the accelerator's part of the engine ----------------------------------------- */

/* Places on the device what the params ask for (weights, buffers, the KV
 * cache with attention, graphs); fills e->dev. */
kt_status kt_dev_create(struct kt_engine *e, const struct kt_engine_params *d, kt_err *err);
/* Frees e->dev (syncs first); pinned_buffers: what was page-locked for it. */
void kt_dev_destroy(struct kt_engine *e, void *pinned_buffers);
/* Expert x of MoE layer il onto the device, from the staged copy u (taken
 * on success): its copies queued ahead of the next step; KT_ERR_NOMEM over
 * the budget, and nothing changes (u stays the caller's).  Drop: off it
 * again at once, its device memory retired.  Retire: at the end of a step,
 * what was retired before it is freed (the queue has run its last reader). */
kt_status kt_dev_expert_upload(struct kt_engine *e, uint32_t il, uint32_t x, struct kt_expert_upload *u, kt_err *err);
void kt_dev_expert_drop(struct kt_engine *e, uint32_t il, uint32_t x);
void kt_dev_retire(struct kt_engine *e);
/* ---- expert_cache.c: the decode-time expert cache (engine.h), per MoE layer of a step ----------- */

/* After the step's pairs per expert are counted: hits and misses, and a slot for the most wanted miss. */
void kt_cache_route(struct kt_engine *e, uint32_t il);
/* With the device's units queued, before the CPU's: the next chunk of the loading slot's copy. */
void kt_cache_copy(struct kt_engine *e, uint32_t il);
/* After the layer's sync: the CPU's time and the device's busy time in it size the next chunk. */
void kt_cache_measure(struct kt_engine *e, uint32_t il, uint64_t cpu_ns, uint64_t device_ns);
bool kt_cache_holds(const struct kt_engine *e, uint32_t il, uint32_t x); /* a slot holds or loads x */
void kt_cache_forget(struct kt_engine *e, uint32_t il, uint32_t x);      /* ... not any more */
void kt_cache_stats_reset(struct kt_engine *e);
void kt_cache_flush(struct kt_engine *e); /* every slot empty (after a failed step); NULL cache: nothing */
void kt_cache_destroy(struct kt_engine *e); /* syncs first */

/* Once per step before the layers: the graph slot, and cuda's cache tables and RoPE angles sent. */
void kt_dev_begin_step(struct kt_engine *e);
/* Layer il's attention on the device, on e->x; in MoE layers also the FFN
 * norm and the router, whose h and routing come back: returns true then. */
bool kt_dev_attention_layer(struct kt_engine *e, uint32_t il);
/* logits (n_rows, V) of the n_rows normed rows in e->h, by the device's head. */
void kt_dev_head(struct kt_engine *e, uint32_t n_rows, float *logits);

#endif
