/*
 * engine.h - the inference engine: runs forward steps of a deepseek2 model
 * over batches of tokens from many sequences, with a paged latent KV cache,
 * on the CPU pools and optionally an accelerator, and returns logits.
 *
 * A step takes any mix of prefill chunks and decode tokens.  Each token
 * names its sequence and position; a sequence's tokens in a batch must
 * continue it exactly (positions length, length+1, ... in batch order).
 * Logits come back for the tokens that ask for them, in batch order.
 * Results of a token do not depend on what else is in the batch.
 *
 * Typical use (kt-run):
 *     kt_engine_create(model, &(struct kt_engine_params){.n_ctx = 4096}, &e, &err);
 *     kt_engine_seq_add(e, 0, &err);
 *     prefill: tokens {tok[i], seq 0, pos i, want_logits = (i == n-1)} in chunks
 *              of at most kt_engine_max_batch_tokens(e);
 *     decode:  one token {next, seq 0, pos n, true} per step;
 *     kt_engine_destroy(e);  then kt_model_close(model).
 *
 * The engine reads weights in place from the model's mapping (the model
 * must outlive it), except routed experts: those it copies at creation into
 * an expert store (expert_store.h: per-expert buffers in node-local memory,
 * file pages dropped as it goes), and the host's matrices it repacks where
 * the kernels have a packed format - neither in the `reference` form.  It
 * never prints (load progress goes to params.progress when given), and
 * reports every bad batch (unknown sequence, gap in positions, context or
 * cache exhausted) as KT_ERR_INVALID before changing any state.
 */
#ifndef KT_ENGINE_H
#define KT_ENGINE_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "kv_cache.h"
#include "model.h"
#include "cpu/ref/ops.h"
#include "status.h"

struct kt_backend_params;
struct kt_expert_cache_params;

struct kt_engine_test_params; /* engine_test.h: knobs only tests set */


struct kt_engine_params {
    uint32_t n_ctx;             /* most positions per sequence; 0: min(context_length, 4096) */
    uint32_t max_seqs;          /* sequence ids 0 .. max_seqs-1; 0: 1 */
    uint32_t n_threads;         /* 0: the CPUs this process may use (cgroup limits included: kt_cpu_budget_read) */
    uint32_t kv_block_tokens;   /* positions per KV block; 0: 16 */
    uint32_t kv_blocks;         /* blocks in the KV pool; 0: enough for every sequence at n_ctx */
    enum kt_row_type kv_type;   /* element type of the latent KV cache's rows; 0: KT_ROW_F32 (kv_cache.h) */
    uint32_t max_batch_tokens;  /* most tokens per step; 0: 256 */
    /* Routed experts run on one worker pool per NUMA node (pool.h) of this
     * topology: NULL, this machine (or KT_TOPOLOGY_SYNTHETIC); else an hwloc
     * synthetic description ("package:2 numa:1 core:1 pu:1"), whose threads are
     * never pinned.  Each expert's tasks run on the pool of its home node (node 0
     * when experts_in_place), all pools at once, the stepping thread helping the
     * first node's pool when that node has a core without a worker (else it only
     * waits: kt_pools_caller_helps); shared experts go with the first node.  The pools have
     * n_threads - 1 workers in all (at least one per pool, at most one per
     * physical core of a real node, and one core of the first node left to the
     * stepping thread), so n_threads still counts every thread that works.
     * A topology with one node (with cores) has one pool: the step's own
     * (n_threads - 1 workers, not pinned), as a second pool's threads would
     * compete with it for the same cores. */
    const char *topology;
    /* [n_layer * n_expert] home node and replica nodes (bit i: node i) of each
     * routed expert, as a placement plan gives them (expert_store.h); NULL:
     * experts_round_robin or node 0, no replicas. */
    const int *expert_home_nodes;
    const uint16_t *expert_replica_nodes;
    /* [n_layer] 1: layer il's routed CPU experts are row-sliced
     * (expert_store.h) over the nodes of expert_slice_nodes (0: every node
     * with a pool; each must have one): every node holds its share of every
     * expert's rows in its own memory, and its pool computes only those rows
     * of every active expert (gate and up: its part of the intermediate;
     * then down: its part of the outputs, from the whole intermediate), so
     * every node works on every active expert and the logits are
     * bit-identical to whole experts.  The layer's shared experts (on the
     * CPU) are split over the same pools by rows, read where they lie; its
     * experts on the device stay whole there; replicas in it are refused;
     * home nodes only label it.  NULL, one pool (one node with cores) or one
     * slice node: every layer runs whole experts; dense layers' entries and
     * experts_in_place ignore it. */
    const uint8_t *layer_sliced;
    uint16_t expert_slice_nodes;
    /* An accelerator (backend.h) holding the routed experts marked in
     * expert_on_device ([n_layer * n_expert], 1: on it) and, with
     * shared_on_device, every layer's shared experts; it runs them on its
     * queue while the CPU runs the rest.  NULL: CPU only.  Needs the expert
     * store (not experts_in_place). */
    const struct kt_backend_params *device;
    const uint8_t *expert_on_device;
    bool shared_on_device;
    /* Every layer's attention (norm, MLA projections, attention, residual)
     * and, in MoE layers, the FFN norm and router on the device, their
     * weights copied there (x goes there each layer and comes back with h
     * and the routing: one round trip), and the KV cache's pool in its
     * memory (counted against its budget; forks copy blocks on its queue).
     * cuda runs kt_cuda_attention_block (absorbed MLA, fp32; cuBLASLt for
     * projections of 64 tokens or more) and kt_cuda_route; the sim runs the
     * CPU code on its queue with the host's scratch.  Needs split attn_k_b /
     * attn_v_b on cuda. */
    bool attention_on_device;
    bool dense_on_device;       /* the leading dense layers' FFNs on the device */
    /* The output head (the final norm stays on the host) on the device, its
     * vocabulary matrix copied there; the embedding lookup, one row per
     * token, stays on the host. */
    bool output_on_device;
    /* The decode-time expert cache (kt_engine_expert_cache_start below),
     * started at creation; NULL: none.  Needs a device. */
    const struct kt_expert_cache_params *expert_cache;
    FILE *progress;             /* expert-store load progress (bytes, GB/s, ETA); NULL: silent */
    /* The reference form of the engine, for checks that compare a placement
     * against it (tools/cli/check.h): every weight is read in place from the
     * file's GGUF rows by the CPU kernels - no expert store, no repacking, so
     * it costs no second copy of the weights, and each step reads the
     * mapping: slower than the packed layouts, and bit-exact to them where
     * the packed format is exact (kernels/cpu/packed.h; AMX's BF16 one is
     * not).  Refused with a device; the placement fields (home and replica
     * nodes, slicing) are ignored: the routed experts run on the first
     * node's pool. */
    bool reference;
    /* A pipeline stage (runtime/dist): the engine holds and runs layers
     * [layer_begin, layer_end) only - their experts in its store, their
     * matrices packed, nothing of the other layers read - and, when its
     * range starts at 0, the embedding and the output head.  It steps with
     * kt_engine_step_layers / kt_engine_head (kt_engine_step only through
     * stage hooks).  0, 0: every layer.  With a device, only the range's
     * attention, dense and shared FFNs and experts go to it (the head only
     * when the range starts at 0). */
    uint32_t layer_begin, layer_end;
    const struct kt_engine_test_params *test; /* NULL except in tests (engine_test.h) */
};

struct kt_batch_token {
    int32_t token;              /* token id < n_vocab */
    uint32_t seq;               /* a sequence added with kt_engine_seq_add */
    uint32_t pos;               /* the sequence's next position */
    bool want_logits;           /* return this token's logits */
};

struct kt_batch {
    uint32_t n_tokens;
    const struct kt_batch_token *tokens; /* [n_tokens] */
};

/* Cumulative counters since creation or the last reset. */
struct kt_engine_stats {
    uint64_t steps, tokens;
    uint64_t attention_ns;      /* norms, projections, RoPE, cache writes, attention, output projection */
    uint64_t router_ns;         /* router logits and top-k */
    uint64_t experts_ns;        /* routed and shared experts, combine */
    uint64_t other_ns;          /* embedding, dense FFN layers, final norm, output head */
    uint64_t weight_bytes;      /* weight bytes read (each matrix counted once per step it is used) */
    uint64_t absorbed_tokens;   /* tokens whose attention ran in the absorbed form */
    uint64_t expanded_tokens;   /* ... in the expanded form */
    uint64_t embed_head_ns;     /* embedding lookup, final norm and output head (also in other_ns) */
    /* routed (token, expert) pairs run by the pool of topology node i (with
     * pools); in a row-sliced layer every slice node counts every pair of a
     * CPU expert (it runs its share of each) */
    uint64_t node_pairs[16];
    uint64_t device_pairs;      /* (token, FFN) pairs run on the device, shared experts' included */
    uint64_t device_routed_pairs; /* ... of them, routed experts' (homed there or in its expert cache) */
    uint64_t device_wait_ns;    /* time the step waited for the device after its own expert work */
    uint64_t cpu_experts_busy_ns; /* CPU threads' time in expert and dense FFN tasks, summed over threads */
    uint64_t node_busy_ns[16];  /* ... of it, the threads of topology node i's pool (with pools) */
    /* ... of it by thread: index i is thread i of its pool (a pool's workers
     * 0 .. n-1, then a caller that helps it), summed over pools, i < 16 */
    uint64_t thread_busy_ns[16];
    uint64_t experts_moved;     /* routed experts that changed home (node or device) between steps */
    uint64_t experts_moved_bytes; /* ... bytes copied for them */
};

/* One layer's share of the steps since creation or the last reset; the four
 * parts cover the layer's whole time, without overlap. */
struct kt_engine_layer_stats {
    uint64_t attention_ns;      /* attention norm, attention, its residual add */
    uint64_t attention_proj_ns; /* ... of it the host's projections (W_qa, W_qb or W_q, W_kva, W_o) with
                                   their activations' quantization; the rest is norms, RoPE and the heads */
    uint64_t router_ns;         /* router logits and top-k (0 in dense layers) */
    uint64_t experts_ns;        /* the rest of the FFN: routed and shared experts and their weighted
                                   sum (moe.c times that sum with the experts), or the dense FFN */
    uint64_t combine_ns;        /* FFN input norm and the FFN's residual add */
    /* The device's queue busy with this layer (when there is one), which
     * overlaps the parts above: its kernels or sim work, and its copies */
    uint64_t device_ns;
    uint64_t device_transfer_ns; /* ... of it in copies over the link */
    /* With more than one node pool: each node pool's routed (token, expert)
     * pairs and threads' busy time in this layer (as kt_engine_stats' node_*),
     * and per step the busiest pool's busy time and the pools' mean, summed
     * over steps: node_busy_max_ns / node_busy_mean_ns is the layer's
     * busiest / mean node balance as the steps measured it. */
    uint64_t node_pairs[16];
    uint64_t node_busy_ns[16];
    uint64_t node_busy_max_ns, node_busy_mean_ns;
};

struct kt_engine;

/* Checks that every weight type can be multiplied, sizes scratch for
 * max_batch_tokens and the KV pool, and starts the threads. */
kt_status kt_engine_create(struct kt_model *m, const struct kt_engine_params *p, struct kt_engine **out,
                           kt_err *err);
void kt_engine_destroy(struct kt_engine *e);

/* Sequences (see kv_cache.h): add an empty one, drop one, fork dst from src
 * (shares the prefix copy-on-write), or cut one back to n_tokens positions. */
kt_status kt_engine_seq_add(struct kt_engine *e, uint32_t seq, kt_err *err);
kt_status kt_engine_seq_remove(struct kt_engine *e, uint32_t seq, kt_err *err);
kt_status kt_engine_seq_fork(struct kt_engine *e, uint32_t src, uint32_t dst, kt_err *err);
kt_status kt_engine_seq_truncate(struct kt_engine *e, uint32_t seq, uint32_t n_tokens, kt_err *err);
uint32_t kt_engine_seq_length(const struct kt_engine *e, uint32_t seq); /* 0 if not in use */

/* One forward step.  logits: (number of tokens with want_logits, n_vocab)
 * floats, may be NULL if none is wanted.  On error every sequence is as it
 * was (a failure of the device's work included) and the next step may run. */
kt_status kt_engine_step(struct kt_engine *e, const struct kt_batch *b, float *logits, kt_err *err);

/* A pipeline stage's part of a step (params.layer_begin/layer_end): checks
 * b and reserves its KV rows as kt_engine_step does, then runs this
 * engine's layers on x_in - (n_tokens, n_embd), the residual stream the
 * previous stage returned; NULL: the embedding of b's tokens (a range that
 * starts at 0) - and writes the stream after its last layer to x_out
 * (n_tokens, n_embd).  want_logits is ignored here. */
kt_status kt_engine_step_layers(struct kt_engine *e, const struct kt_batch *b, const float *x_in, float *x_out,
                                kt_err *err);
/* logits (tokens of b with want_logits, n_vocab) = output . RMSNorm(x) of
 * those tokens' rows of x (n_tokens, n_embd): the end of a step whose last
 * layer ran elsewhere.  An engine whose range starts at 0; no state changes. */
kt_status kt_engine_head(struct kt_engine *e, const struct kt_batch *b, const float *x, float *logits, kt_err *err);

/* Stage hooks (runtime/dist installs them on the first stage of a
 * pipeline): kt_engine_step calls step() in place of its own work, which
 * runs the whole pipeline (kt_engine_step_layers, other processes,
 * kt_engine_head); each sequence operation, after it succeeded here, calls
 * seq() so the other stages do the same (an error there is returned).  So
 * callers (kt-run, the scheduler) drive a pipeline as they drive one
 * engine.  NULL h: none. */
enum kt_engine_seq_op { KT_SEQ_ADD = 1, KT_SEQ_REMOVE, KT_SEQ_FORK, KT_SEQ_TRUNCATE };
struct kt_engine_stage_hooks {
    void *ctx;
    kt_status (*step)(void *ctx, struct kt_engine *e, const struct kt_batch *b, float *logits, kt_err *err);
    /* op's arguments: seq (and for FORK dst = arg, for TRUNCATE n_tokens = arg) */
    kt_status (*seq)(void *ctx, enum kt_engine_seq_op op, uint32_t seq, uint32_t arg, kt_err *err);
    /* After each layer of a step (kt_engine_step_layers included), on the
     * stepping thread: lets the messages in flight move on while the layers
     * compute (runtime/dist).  Any of the three may be NULL. */
    void (*progress)(void *ctx);
};
void kt_engine_set_stage_hooks(struct kt_engine *e, const struct kt_engine_stage_hooks *h);
/* Applies a sequence operation as kt_engine_seq_* do, without the hooks (what the other stages run). */
kt_status kt_engine_seq_apply(struct kt_engine *e, enum kt_engine_seq_op op, uint32_t seq, uint32_t arg, kt_err *err);
/* The layers this engine runs: [*begin, *end). */
void kt_engine_layer_range(const struct kt_engine *e, uint32_t *begin, uint32_t *end);
uint32_t kt_engine_n_embd(const struct kt_engine *e);
uint32_t kt_engine_n_layer(const struct kt_engine *e); /* the model's, not this stage's */

/* A hook called after each layer of every step, on the stepping thread,
 * with the residual stream x: (n_tokens, n_embd) floats, the step's tokens
 * in batch order, as the next layer reads it (host memory, valid during the
 * call only; the hook must not use the engine).  For checks that compare
 * two engines layer by layer (tools/cli/check.h).  Set, or cleared with fn
 * NULL, between steps; without one a step pays one branch per layer, and
 * the hook's own time is counted in no layer's stats. */
typedef void (*kt_engine_layer_hook)(void *ctx, uint32_t il, const float *x, uint32_t n_tokens, uint32_t n_embd);
void kt_engine_set_layer_hook(struct kt_engine *e, kt_engine_layer_hook fn, void *ctx);

uint32_t kt_engine_n_vocab(const struct kt_engine *e);
uint32_t kt_engine_max_batch_tokens(const struct kt_engine *e);
const struct kt_engine_params *kt_engine_params(const struct kt_engine *e); /* with defaults filled in */
const struct kt_kv_cache *kt_engine_kv_cache(const struct kt_engine *e);    /* for kt_kv_cache_stats */
uint64_t kt_engine_scratch_bytes(const struct kt_engine *e);                /* activations and thread scratch */
uint64_t kt_engine_expert_store_bytes(const struct kt_engine *e);           /* 0 when experts_in_place */

/* Moving a routed expert to another NUMA node while serving
 * (expert_store.h): kt_engine_expert_copy copies expert x of layer il into
 * node `node`'s memory - any thread, also while a step runs;
 * kt_engine_expert_switch makes the copy its home between two steps, on the
 * stepping thread (never during a step), and the next step runs it on that
 * node's pool: the same bytes, bit-identical logits.  kt_engine_move_expert
 * does both between steps.  `node` must have cores in the engine's topology;
 * row-sliced experts do not move (KT_ERR_UNSUPPORTED), nor to a
 * node holding a copy of them (KT_ERR_INVALID); replicas stay where they
 * are; a failed switch leaves the old home serving.  An
 * expert on the device moves its CPU copy (where it runs once off the
 * device).  kt_engine_expert_node: the node of that copy; -1 for a dense
 * layer, a sliced expert, or experts read in place. */
struct kt_expert_copy;
kt_status kt_engine_expert_copy(const struct kt_engine *e, uint32_t il, uint32_t x, int node,
                                struct kt_expert_copy **out, kt_err *err);
kt_status kt_engine_expert_switch(struct kt_engine *e, struct kt_expert_copy *c, kt_err *err);
kt_status kt_engine_move_expert(struct kt_engine *e, uint32_t il, uint32_t x, int node, kt_err *err);
int kt_engine_expert_node(const struct kt_engine *e, uint32_t il, uint32_t x);
/* Replicas the same way: a copy made by kt_engine_expert_copy (to a node
 * without a copy of the expert) becomes one more of its copies between two
 * steps (kt_engine_expert_add_replica; the pools then spread its tokens over
 * the nodes holding it); kt_engine_expert_drop_replica gives one back (not
 * its home).  kt_engine_expert_replica_nodes: bit i, a replica on node i. */
kt_status kt_engine_expert_add_replica(struct kt_engine *e, struct kt_expert_copy *c, kt_err *err);
kt_status kt_engine_expert_drop_replica(struct kt_engine *e, uint32_t il, uint32_t x, int node, kt_err *err);
uint16_t kt_engine_expert_replica_nodes(const struct kt_engine *e, uint32_t il, uint32_t x);
/* A whole layer row-sliced while serving (expert_store.h), in one move or in
 * parts: the shares of experts [x0, x1) on every node with a pool are made by
 * kt_engine_layer_slice_copy (any thread, while steps run, no other move of
 * the layer meanwhile) and those experts switch between two steps
 * (kt_engine_layer_slice_switch, on the stepping thread), their whole copies
 * given back; the same bytes, so bit-identical logits, also while the layer
 * is sliced in part (its sliced experts run on every node, the rest whole).
 * KT_ERR_UNSUPPORTED with pools on fewer than two nodes.
 * kt_engine_layer_sliced: whether every CPU expert of layer il is sliced now;
 * kt_engine_layer_sliced_experts: how many are.
 * kt_engine_layer_move_experts: the most experts of layer il one such copy
 * (slice) or its inverse (!slice) may take for its memory to stay within
 * `budget` bytes (at least 1; n_expert where nothing is sliced). */
struct kt_layer_slices;
kt_status kt_engine_layer_slice_copy(const struct kt_engine *e, uint32_t il, uint32_t x0, uint32_t x1,
                                     struct kt_layer_slices **out, kt_err *err);
kt_status kt_engine_layer_slice_switch(struct kt_engine *e, struct kt_layer_slices *c, kt_err *err);
bool kt_engine_layer_sliced(const struct kt_engine *e, uint32_t il);
uint32_t kt_engine_layer_sliced_experts(const struct kt_engine *e, uint32_t il);
uint32_t kt_engine_layer_move_experts(const struct kt_engine *e, uint32_t il, bool slice, uint64_t budget);
/* And back: experts [x0, x1) of layer il made whole again, expert x homed on
 * node homes[x] (a node with a pool; homes indexed by expert), the same way
 * (kt_engine_layer_whole_copy any thread, kt_engine_layer_whole_switch on the
 * stepping thread): bit-identical. */
struct kt_layer_whole;
kt_status kt_engine_layer_whole_copy(const struct kt_engine *e, uint32_t il, const int *homes, uint32_t x0, uint32_t x1,
                                     struct kt_layer_whole **out, kt_err *err);
kt_status kt_engine_layer_whole_switch(struct kt_engine *e, struct kt_layer_whole *c, kt_err *err);

/* Moving a routed expert between the host and the device (an engine with
 * one).  kt_engine_expert_upload_read stages expert x of layer il in host
 * memory in the device's layout (its GGUF rows; a checkpoint's converted) -
 * any thread, also while a step runs, so the file's pages (which the expert
 * store's load dropped from the page cache) are read there and not on the
 * stepping thread.  kt_engine_expert_to_device, on the stepping thread
 * between steps, queues the staged copy ahead of the next step's work (never
 * waited for here; u NULL: staged there and then) and the next step runs it
 * there; it takes u on success; KT_ERR_NOMEM when the device's budget cannot
 * take it, and nothing changes (u stays the caller's, to discard or try
 * again).  kt_engine_expert_off_device gives it back to its CPU home (the
 * expert store keeps every expert's CPU copy) at once, without waiting for
 * the device: its device memory, and a staged copy, are freed at the end of
 * the next step, when the steps that could read them are done.  The sim
 * device computes what the CPU does, bit for bit; CUDA within the tolerance
 * of tests/test_hybrid_sim.c. */
struct kt_expert_upload;
kt_status kt_engine_expert_upload_read(const struct kt_engine *e, uint32_t il, uint32_t x,
                                       struct kt_expert_upload **out, kt_err *err);
uint64_t kt_expert_upload_bytes(const struct kt_expert_upload *u);
void kt_expert_upload_discard(struct kt_expert_upload *u);
kt_status kt_engine_expert_to_device(struct kt_engine *e, uint32_t il, uint32_t x, struct kt_expert_upload *u,
                                     kt_err *err);
kt_status kt_engine_expert_off_device(struct kt_engine *e, uint32_t il, uint32_t x, kt_err *err);
bool kt_engine_expert_on_device(const struct kt_engine *e, uint32_t il, uint32_t x);

/* A decode-time expert cache on the device (an engine with one): beside the
 * experts homed there, slots_per_layer slots in every MoE layer hold copies
 * of experts the last steps routed to (LRU: the most recently routed; LFU:
 * the most routed pairs, decayed per step), taken from the device's budget
 * at start (KT_ERR_NOMEM naming need and room when it has too little, and
 * nothing changes).  A routed expert not on the device runs on the CPU in
 * that step, while its copy is queued in chunks sized to the time the
 * device's queue idles while the CPU works (measured every step); no step
 * waits for a copy; from the step after its last chunk it runs on the
 * device.  The cache never changes a result (the sim computes what the CPU
 * does, bit for bit; cuda within test_hybrid_sim's tolerance).  Experts
 * homed on the device (kt_engine_expert_on_device) are not the cache's;
 * kt_engine_expert_to_device takes an expert out of the cache first. */
enum kt_expert_cache_policy { KT_EXPERT_CACHE_LRU, KT_EXPERT_CACHE_LFU };
struct kt_expert_cache_params {
    uint32_t slots_per_layer;   /* 1 .. n_expert */
    enum kt_expert_cache_policy policy;
};
/* Counters since the start or the last kt_engine_stats_reset. */
struct kt_expert_cache_stats {
    uint64_t pinned_pairs;      /* routed (token, expert) pairs of experts homed on the device */
    uint64_t hit_pairs;         /* ... of other experts, found in a slot */
    uint64_t miss_pairs;        /* ... computed on the CPU */
    uint64_t uploads;           /* experts copied in whole */
    uint64_t upload_bytes;      /* bytes queued for copies */
    uint64_t chunks;            /* copies queued (an expert takes one or more) */
    uint64_t evictions;         /* live experts whose slot another took */
    uint32_t slots, resident;   /* slots, and of them live ones, now */
    uint64_t device_bytes;      /* the slots' device memory */
};
kt_status kt_engine_expert_cache_start(struct kt_engine *e, const struct kt_expert_cache_params *p, kt_err *err);
/* Layer il's counters, or with il < 0 every layer's summed; false: no cache. */
bool kt_engine_expert_cache_stats(const struct kt_engine *e, int il, struct kt_expert_cache_stats *out);
/* Expert x of layer il is live in a slot now (between steps). */
bool kt_engine_expert_cached(const struct kt_engine *e, uint32_t il, uint32_t x);

void kt_engine_stats(const struct kt_engine *e, struct kt_engine_stats *s);
void kt_engine_stats_reset(struct kt_engine *e); /* also resets every layer's and the device's stats and the routing counts */

/* Routing, counted every step for routing profiles (placement/profile.h).  A
 * token is a prefill token when its sequence has more than one token in the
 * step (a prompt chunk), else a decode token (one new token of a sequence).
 * Returns the (n_layer, n_expert) counts of phase's tokens routed to each
 * (layer, expert) since creation or the last kt_engine_stats_reset (dense
 * layers' rows stay 0; each token adds n_expert_used to each MoE layer's
 * row) and in *n_tokens (may be NULL) that phase's tokens; NULL for another
 * phase.  The routing is wherever the router ran, the device included.  The
 * array is the engine's: read it between steps, never during one. */
enum { KT_ROUTE_DECODE, KT_ROUTE_PREFILL };
const uint64_t *kt_engine_route_counts(const struct kt_engine *e, int phase, uint64_t *n_tokens);

/* The device's queue statistics (busy, transfer time and bytes); KT_ERR_NOT_FOUND without one. */
struct kt_backend_stats;
kt_status kt_engine_device_stats(const struct kt_engine *e, struct kt_backend_stats *out);
/* The device's name as its placement config names it ("sim", "gpu0"); NULL without one. */
const char *kt_engine_device_name(const struct kt_engine *e);
/* Device memory an engine keeps besides weights and the KV cache: its working
 * buffers for max_batch_tokens tokens (the FFN's pairs, h, and with attention
 * there the residual stream and routing - on cuda also the attention's step
 * buffers and MLA and cuBLASLt scratch - and with the head there its rows and
 * logits), for model m and params p (0s: the defaults).  From the tensor table
 * alone: what a planner reserves on a device that holds anything (placement
 * counts it as the "working buffers" part).  cuda: the device is a GPU. */
uint64_t kt_engine_device_work_bytes(const struct kt_model *m, const struct kt_engine_params *p, bool cuda);
/* Host memory an engine for model m with params p takes besides the file
 * it maps, from the tensor table alone (before creation): the packed copies
 * of the matrices the host multiplies whole (attention projections, dense
 * FFNs, shared experts, the output head, each where the device does not
 * run it and the CPU level has a packed format for its type; the split
 * W_UK / W_UV's copies for the absorbed form where heads fill whole packed
 * groups) and the KV
 * cache when attention stays on the host.  The routed experts are the
 * placement's and the expert store's to count. */
struct kt_engine_host_bytes {
    uint64_t packed;
    uint64_t kv_cache;
};
struct kt_engine_host_bytes kt_engine_host_bytes(const struct kt_model *m, const struct kt_engine_params *p);
/* Bytes of the host matrices this engine packed (what kt_engine_host_bytes
 * predicted as `packed`). */
uint64_t kt_engine_host_packed_bytes(const struct kt_engine *e);
/* What the engine's device holds in all, and of it working buffers; KT_ERR_NOT_FOUND without a device. */
kt_status kt_engine_device_bytes(const struct kt_engine *e, uint64_t *total, uint64_t *work);

/* Layer il's counters (il < n_layer); false if il is out of range. */
bool kt_engine_layer_stats(const struct kt_engine *e, uint32_t il, struct kt_engine_layer_stats *out);

/* The RoPE a model's hyperparameters define: the file's YaRN β (as HF and
 * DeepSeek's code use them; llama.cpp ignores them for deepseek2, which
 * differs for Kimi-K2's 1 / 1: docs/deepseek2.md, RoPE/YaRN), magnitude
 * rope.scaling.attn_factor (times 1 + 0.1 ln s when a YaRN file has no
 * yarn_log_multiplier, as HF's get_mscale(s, 1) / get_mscale(s, 0)). */
void kt_engine_rope_params(const struct kt_hparams *hp, struct kt_rope_params *rp);

#endif
