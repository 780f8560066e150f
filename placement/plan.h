/*
 * plan.h - a placement config resolved against one model and machine: for
 * every layer the device of each of its parts, for every routed expert its
 * home (a device, and on CPU a NUMA node) and replicas, and the bytes each
 * device and node will hold.  A plan is plain data, read-only once made; it
 * allocates nothing on any device and never checks that a device exists.
 *
 * "Hottest" everywhere means most routed tokens in the profile (a tie, or no
 * profile at all, goes to the lower expert index).
 */
#ifndef KT_PLACEMENT_PLAN_H
#define KT_PLACEMENT_PLAN_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "config.h"
#include "model.h"
#include "cpu/ref/ops.h"
#include "status.h"

#define KT_PLACEMENT_MAX_DEVICES 8 /* cpu included */
#define KT_PLACEMENT_MAX_NODES 64  /* NUMA nodes: replica sets are 64-bit masks */

enum kt_place_backend {
    KT_PLACE_CPU = 0,          /* NUMA node pools */
    KT_PLACE_CUDA = 1,         /* one GPU */
    KT_PLACE_SIM = 2,          /* a CPU-executed stand-in for a GPU */
};

const char *kt_place_backend_name(enum kt_place_backend b);

/* What a device's bytes are spent on. */
enum kt_place_part {
    KT_PART_ATTENTION,           /* attn_*, ffn_norm, router (ffn_gate_inp, exp_probs_b) */
    KT_PART_DENSE_FFN,           /* ffn_gate/up/down of the leading dense layers */
    KT_PART_SHARED_EXPERTS,
    KT_PART_ROUTED_EXPERTS,      /* experts homed here */
    KT_PART_REPLICAS,            /* extra copies of hot CPU experts */
    KT_PART_EMBEDDINGS,          /* token_embd, output_norm, output */
    KT_PART_KV_CACHE,            /* estimate: kv_tokens x n_layer x (kvr + dr) x bytes per value */
    KT_PART_WORK_BUFFERS,        /* the engine's working buffers on an accelerator (kt_engine_device_work_bytes) */
    KT_PART_COUNT,
};

const char *kt_place_part_name(enum kt_place_part p);

struct kt_placement_device {
    char name[32];               /* "cpu" for devices[0]; else the config's name */
    enum kt_place_backend backend;
    int cuda_device;             /* cuda: the ordinal; else 0 */
    double transfer_gbps;        /* sim: modelled host<->device bandwidth; else 0 */
    double latency_us;           /* sim: modelled per-transfer latency; else 0 */
    uint64_t budget_bytes;       /* memory_gib in bytes; 0 for cpu (not checked) */
    uint64_t part_bytes[KT_PART_COUNT];
    uint64_t bytes;              /* sum of part_bytes; <= budget_bytes when budgeted */
    uint32_t n_experts;          /* routed experts homed here, all layers */
};

struct kt_expert_home {
    int device;                  /* index into kt_placement.devices; 0 = cpu */
    int node;                    /* cpu: NUMA node (topology index); -1 on an accelerator */
    uint64_t replica_nodes;      /* bit n: a copy on node n as well (never the home node) */
};

struct kt_placement_layer {
    bool is_moe;
    int attention;               /* device of attention, norms, router and this layer's KV cache */
    int dense_ffn;               /* dense layers; -1 in MoE layers */
    int shared_experts;          /* MoE layers with shared experts; else -1 */
    struct kt_expert_home *experts; /* [n_expert] in MoE layers; NULL in dense ones */
    /* The layer's CPU experts are row-sliced over every node of expert_nodes
     * (config cpu.sliced): each node holds and runs its share of the rows of
     * every such expert, so every step is balanced; their home node is then
     * only where the bytes are counted from.  Bit-identical to unsliced. */
    bool cpu_sliced;
};

struct kt_placement {
    char source[256];            /* the config's name */
    char profile[256];           /* the profile that chose hot experts; "" when by index */
    uint32_t kv_tokens;          /* KV cache the budget holds room for */
    uint32_t kv_bytes_per_value; /* 2 (bf16, f16) or 4 (f32) */
    enum kt_row_type kv_type;    /* kv_cache.type (f32 when the config has none) */
    bool kv_type_given;          /* the config states it: kt_engine_plan_apply sets the engine's row type */
    int n_devices;
    struct kt_placement_device *devices; /* [n_devices]; [0] is the cpu */
    int embeddings;              /* device of token_embd, output_norm, output */
    uint32_t n_layer, n_expert;
    struct kt_placement_layer *layers; /* [n_layer] */
    int n_nodes;                 /* NUMA nodes of the machine it was resolved for */
    uint64_t expert_nodes;       /* bit n: node n may hold routed experts (cpu.nodes) */
    uint64_t *node_bytes;        /* [n_nodes] routed-expert bytes homed or replicated on each */
    uint32_t *node_experts;      /* [n_nodes] routed experts homed on each (of the stage's layers) */
    /* A pipeline stage (runtime/dist: ranks[r].placement): the rank holds layers
     * [stage_begin, stage_end) only, so the bytes and the budgets count those
     * (the embeddings and the head only when the stage starts at 0), as the
     * engine loads them.  0, 0: every layer. */
    uint32_t stage_begin, stage_end;
};

/* Resolves c against m on a machine with n_numa_nodes nodes (1..64).
 * profile_override, when not NULL, replaces the config's profile.  Errors
 * (KT_ERR_FORMAT unless I/O or memory) name the config line: an expert or
 * layer the model lacks, routed experts asked of a dense layer, more experts
 * claimed than a layer has, one expert placed twice, a node the machine
 * lacks, a profile of another shape, or a device over its memory budget
 * (with the need broken down). */
kt_status kt_placement_resolve(const struct kt_placement_config *c, const struct kt_model *m, int n_numa_nodes,
                               const char *profile_override, struct kt_placement **out, kt_err *err);
void kt_placement_destroy(struct kt_placement *p);
/* A deep copy of p; NULL out of memory. */
struct kt_placement *kt_placement_clone(const struct kt_placement *p);

/* Expert x of layer il; NULL in dense layers or out of range. */
const struct kt_expert_home *kt_placement_expert(const struct kt_placement *p, uint32_t il, uint32_t x);

/* A few lines per device: its layers' parts, routed experts, bytes by part and budget. */
void kt_placement_describe(const struct kt_placement *p, FILE *out);

#endif
