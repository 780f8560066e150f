/*
 * expert_store.h - the routed experts of every MoE layer, copied out of the
 * GGUF file into anonymous memory at load (docs/architecture.md).
 *
 * Each (layer, expert) gets one contiguous buffer holding its three matrices:
 *
 *     expert buffer = [gate rows (f) | up rows (f) | down rows (E)]
 *
 * each repacked for the kernel level in use (kernels/cpu/packed.h: groups
 * of 8 or 16 rows interleaved for SIMD lanes or AMX tiles) when that level
 * has a packed format for the matrix's type, else in the file's GGUF rows
 * (with ffn_gate_up_exps the gate and up halves of that tensor's expert slab
 * become the first two matrices).  Each matrix starts on a 64-byte boundary.  In the file an expert's three
 * slabs lie in three tensors hundreds of MiB apart; here they are adjacent,
 * so one expert streams from one region and can later be moved, replicated
 * or bound to a NUMA node as a unit.  Buffers start on 4 KiB boundaries
 * inside one 2 MiB-aligned, huge-page-advised mapping per layer.
 *
 * Every expert has a home NUMA node (params: home_nodes, else round_robin_nodes,
 * else 0) and optional replicas on other nodes (replica_nodes); each copy
 * lives in a per-(layer, node) mapping bound to that node, so a node's pool
 * reads node-local memory.
 *
 * A row-sliced layer (sliced_layers) holds no whole expert: each node of
 * slice_nodes holds, in its own mapping, its share of every expert's rows
 *
 *     node share = [gate rows ff_first.. (n_ff) | up rows ff_first.. (n_ff) | down rows out_first.. (n_out)]
 *
 * (kt_expert_slice_rows: whole blocks of KT_EXPERT_SLICE_ROWS rows, so a
 * share's packed groups are the same bytes as the whole matrix's), and the
 * node's pool computes only those rows of each expert: every node works on
 * every active expert, so a step is as balanced as the shares.  Replicas are byte-identical copies of the home
 * buffer, made once the layer is loaded.  An expert can move to another node
 * between steps (below); moves to GPUs are later work.
 *
 * The load reads with pread() on its own descriptor (file pages are never
 * mapped into the process), in chunks of at most 32 MiB, and drops the
 * pages it read from the page cache as it goes, so peak memory stays near
 * the store's size.  Before allocating anything it checks MemAvailable and
 * refuses a load that cannot fit.  It never prints on its own: progress goes
 * to the caller's stream, if any.  A store is read-only after creation and
 * may be read from any number of threads; only a move (below) changes it.
 */
#ifndef KT_EXPERT_STORE_H
#define KT_EXPERT_STORE_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "cpu/packed.h"

#include "model.h"
#include "status.h"

/* Nodes a store can place copies on (topology node indices 0..15). */
#define KT_EXPERT_MAX_NODES 16

struct kt_expert_store_params {
    FILE *progress;             /* bytes, GB/s and ETA of the load; NULL: silent */
    /* The memory check reads proc/meminfo and the cgroup files under this
     * directory; NULL: "/" (tests pass a fake tree). */
    const char *host_root;
    /* [n_layer * n_expert] home node of expert x of layer il at il * n_expert
     * + x (entries of dense layers ignored); NULL: round_robin_nodes. */
    const int *home_nodes;
    /* 0 or 1: every expert homes on node 0.  n > 1: expert x of every layer
     * homes on node x % n, for dispatch tests on synthetic topologies. */
    int round_robin_nodes;
    /* [n_layer * n_expert] bit i set: a replica on node i (the home's own bit
     * is ignored); NULL: none. */
    const uint16_t *replica_nodes;
    /* Keep every expert in the GGUF layout even where the level has a
     * packed format (for tests and for comparing the two). */
    bool keep_gguf_layout;
    /* [n_layer] 1: layer il is row-sliced over the nodes of slice_nodes
     * (entries of dense layers ignored); NULL: none.  A sliced layer takes
     * no replicas (KT_ERR_INVALID: every node already holds a share of every
     * expert); its home nodes are kept as given, for reports only. */
    const uint8_t *sliced_layers;
    uint16_t slice_nodes;       /* bit i: node i holds a share; at least two bits when sliced_layers is set */
    /* Host memory the engine takes besides the experts (its packed
     * matrices, its KV cache: kt_engine_host_bytes), counted in the one
     * memory check made before anything is read. */
    uint64_t other_host_bytes;
    /* Only layers [layer_begin, layer_end) (a pipeline stage: runtime/dist):
     * the others' experts are neither planned, counted nor read (their
     * entries stay empty, as a dense layer's).  0, 0: every layer. */
    uint32_t layer_begin, layer_end;
};

/* Rows are sliced in whole blocks of this many (moe.c's rows per task, a
 * multiple of every packed group), so a node's share of a matrix runs the
 * same kernel calls on the same bytes as the whole matrix does. */
#define KT_EXPERT_SLICE_ROWS 256

/* Rows [*first, *first + *n) of n_rows that part `part` of n_parts holds:
 * whole blocks of KT_EXPERT_SLICE_ROWS (the last block may be short), split
 * as evenly as blocks allow, in order; *n is 0 for a part left without a
 * block (more parts than blocks). */
void kt_expert_slice_rows(int64_t n_rows, int n_parts, int part, int64_t *first, int64_t *n);

/* One (layer, expert). */
struct kt_stored_expert {
    const uint8_t *data;        /* (expert_bytes) [gate | up | down], in home_node's memory; NULL when sliced */
    int home_node;
    uint16_t nodes;             /* bit i: a copy on node i (the home's bit included); sliced: a share */
    const uint8_t *copy[KT_EXPERT_MAX_NODES]; /* the copy on node i, NULL if none; copy[home_node] == data */
    /* Sliced layers: node i's share ([gate | up | down] as layout.slice[i]
     * says), in node i's memory; NULL where it holds none. */
    const uint8_t *slice[KT_EXPERT_MAX_NODES];
};

/* Node i's share of each expert of a row-sliced layer. */
struct kt_expert_slice {
    int64_t ff_first, n_ff;     /* rows [ff_first, ff_first + n_ff) of gate and of up (the intermediate) */
    int64_t out_first, n_out;   /* rows [out_first, out_first + n_out) of down (the outputs) */
    uint64_t gate_offset, up_offset, down_offset; /* in the share, each 64-byte aligned */
    uint64_t bytes;             /* down_offset + down bytes */
};

/* Where the slabs lie inside every expert buffer of one layer. */
struct kt_expert_layout {
    uint64_t gate_offset;       /* 0 */
    uint64_t up_offset;         /* gate bytes, rounded up to 64 */
    uint64_t down_offset;       /* up_offset + up bytes, rounded up to 64 */
    uint64_t expert_bytes;      /* down_offset + down bytes */
    /* The format each matrix was repacked into; NULL: GGUF rows. */
    const struct kt_packed_format *gate_packed, *up_packed, *down_packed;
    /* Row-sliced: no expert buffer (offsets above unused); node i of
     * slice_nodes (its part, in node order, of popcount(slice_nodes)) holds
     * slice[i] of every expert. */
    bool sliced;
    uint16_t slice_nodes;
    struct kt_expert_slice slice[KT_EXPERT_MAX_NODES];
    /* Experts row-sliced now: n_expert when sliced; 0 < n_sliced < n_expert
     * while a rebalancer slices the layer (or makes it whole) in parts, the
     * rest whole (their data set), slice_nodes and slice[] valid as soon as
     * one expert is sliced. */
    uint32_t n_sliced;
};

struct kt_expert_store;

/* Copies every routed expert of m out of m->gguf->path.  KT_ERR_NOMEM (with
 * needed and free GiB) if it cannot fit (replicas counted); KT_ERR_IO naming
 * the tensor, expert and byte offset if the file cannot be read in full;
 * KT_ERR_INVALID for a home or replica node >= KT_EXPERT_MAX_NODES, sliced
 * layers with fewer than two slice nodes, or replicas in a sliced layer. */
kt_status kt_expert_store_create(const struct kt_model *m, const struct kt_expert_store_params *p,
                                 struct kt_expert_store **out, kt_err *err);
void kt_expert_store_destroy(struct kt_expert_store *s);

/* Expert x of layer il; NULL data for dense layers. */
const struct kt_stored_expert *kt_expert_store_expert(const struct kt_expert_store *s, uint32_t il, uint32_t x);
const struct kt_expert_layout *kt_expert_store_layout(const struct kt_expert_store *s, uint32_t il);

/* Bytes the store holds (all mappings, padding included); the bytes of
 * expert data it copied; seconds the load took. */
uint64_t kt_expert_store_bytes(const struct kt_expert_store *s);
uint64_t kt_expert_store_data_bytes(const struct kt_expert_store *s);
double kt_expert_store_load_s(const struct kt_expert_store *s);

/*
 * Moving an expert to another node while the engine serves (issue 13):
 * kt_expert_store_copy makes a copy of expert x of layer il in node `node`'s
 * memory (any thread, while steps run: it only reads the expert);
 * kt_expert_store_switch makes that copy the expert's home - between two
 * steps, on the thread that runs them, as no step may be reading the expert
 * then - and gives the old copy's memory back at once (its own mapping is
 * unmapped; a slot of the layer's load-time mapping keeps its address space,
 * counted in kt_expert_store_bytes, and returns its pages).  The bytes are
 * the same, so the logits are bit-identical.  Only whole experts move
 * (KT_ERR_UNSUPPORTED for a sliced expert), to a node without a copy of them
 * (KT_ERR_INVALID); an expert's replicas stay where they are.  One copy of
 * an expert at a time.  A failed switch (KT_ERR_NOMEM) discards the copy and
 * leaves the old home serving; an unused copy goes with
 * kt_expert_copy_discard.
 *
 * Replicas the same way: kt_expert_store_add_replica makes a copy one more
 * of the expert's copies (its home stays), between two steps;
 * kt_expert_store_drop_replica gives one back (never the home).
 */
struct kt_expert_copy;
kt_status kt_expert_store_copy(const struct kt_expert_store *s, uint32_t il, uint32_t x, int node,
                               struct kt_expert_copy **out, kt_err *err);
kt_status kt_expert_store_switch(struct kt_expert_store *s, struct kt_expert_copy *c, kt_err *err);
kt_status kt_expert_store_add_replica(struct kt_expert_store *s, struct kt_expert_copy *c, kt_err *err);
kt_status kt_expert_store_drop_replica(struct kt_expert_store *s, uint32_t il, uint32_t x, int node, kt_err *err);
void kt_expert_copy_discard(struct kt_expert_copy *c);
uint64_t kt_expert_copy_bytes(const struct kt_expert_copy *c); /* the memory it holds */

/*
 * Slicing a whole layer while the engine serves (the rebalancer's way to even
 * the nodes at batch 1), in one move or in parts of a few experts each, so the
 * memory a move holds stays within a budget however large the layer:
 * kt_expert_store_slice_copy cuts experts [x0, x1) of layer il (each whole)
 * into the shares of slice_nodes (>= 2 nodes; the layer's own slice nodes if
 * some experts are sliced already), each share in its node's memory - any
 * thread, while steps run: it only reads the experts, and no other move of
 * that layer may be made meanwhile - with the same bytes a load sliced from
 * the start puts there (whole blocks of packed rows are contiguous);
 * kt_expert_store_slice_switch makes those experts sliced between two steps
 * and gives back their whole copies (homes and replicas).  Once every expert
 * is sliced the layer is (layout.sliced); until then the engine runs its
 * sliced experts over the slice nodes and the rest whole, the same results.
 * KT_ERR_INVALID for an empty range, an expert in it sliced already, fewer
 * than two nodes or other nodes than the layer's slice nodes; KT_ERR_NOMEM
 * leaves the experts whole.  m is the model the store was made for.
 * kt_expert_store_slice_bytes: the memory a copy of n_experts experts holds;
 * kt_expert_store_whole_bytes: one whole expert's (its buffer, rounded up).
 */
struct kt_layer_slices;
kt_status kt_expert_store_slice_copy(const struct kt_expert_store *s, const struct kt_model *m, uint32_t il,
                                     uint16_t slice_nodes, uint32_t x0, uint32_t x1, struct kt_layer_slices **out,
                                     kt_err *err);
kt_status kt_expert_store_slice_switch(struct kt_expert_store *s, struct kt_layer_slices *c, kt_err *err);
void kt_layer_slices_discard(struct kt_layer_slices *c);
uint64_t kt_layer_slices_bytes(const struct kt_layer_slices *c); /* the memory it holds */
uint64_t kt_expert_store_slice_bytes(const struct kt_expert_store *s, const struct kt_model *m, uint32_t il,
                                     uint16_t slice_nodes, uint32_t n_experts);
uint64_t kt_expert_store_whole_bytes(const struct kt_expert_store *s, uint32_t il);

/*
 * Making sliced experts whole again while serving (the rebalancer undoes a
 * slice the live profile no longer pays for), in one move or in parts:
 * kt_expert_store_whole_copy puts experts [x0, x1) (each sliced) back
 * together from the nodes' shares, expert x into the memory of homes[x] (one
 * mapping per node; homes is indexed by expert) - any thread, while steps
 * run, no other move of that layer meanwhile - with the bytes a whole load
 * puts there; kt_expert_store_whole_switch makes them whole between two steps
 * and gives back their shares.  KT_ERR_INVALID for an empty range, an expert
 * in it whole already or a home past KT_EXPERT_MAX_NODES; KT_ERR_NOMEM leaves
 * them sliced.
 */
struct kt_layer_whole;
kt_status kt_expert_store_whole_copy(const struct kt_expert_store *s, uint32_t il, const int *homes, uint32_t x0,
                                     uint32_t x1, struct kt_layer_whole **out, kt_err *err);
kt_status kt_expert_store_whole_switch(struct kt_expert_store *s, struct kt_layer_whole *c, kt_err *err);
void kt_layer_whole_discard(struct kt_layer_whole *c);
uint64_t kt_layer_whole_bytes(const struct kt_layer_whole *c); /* the memory it holds */

#endif
