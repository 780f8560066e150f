/*
 * config_internal.h - a validated placement config, as config.c leaves it for
 * plan.c.  Every rule keeps where it was written (line, column, key path) so
 * errors found against a model can name it too.  Ranges are never expanded
 * here: "0-4000000000" costs one entry and is refused against the model.
 */
#ifndef KT_PLACEMENT_CONFIG_INTERNAL_H
#define KT_PLACEMENT_CONFIG_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

#include "config.h"
#include "plan.h"
#include "cpu/ref/ops.h"

#define KT_PLACEMENT_PATH_MAX 160

/* Where something was written: "FILE:LINE:COL: KEY.PATH" in messages. */
struct kt_cfg_where {
    uint32_t line, col;
    char path[KT_PLACEMENT_PATH_MAX];
};

#define KT_PLACEMENT_MAX_RANKS 16   /* as runtime/dist's KT_PIPELINE_MAX_RANKS */

struct kt_id_range {
    uint32_t first, last;        /* inclusive, first <= last */
};

enum kt_expert_set_kind {
    KT_SET_NONE,                 /* not given */
    KT_SET_COUNT,                /* the `count` hottest experts not in any list */
    KT_SET_ALL,                  /* every expert no other rule places */
    KT_SET_LIST,                 /* exactly these experts */
};

struct kt_expert_set {
    enum kt_expert_set_kind kind;
    uint32_t count;
    uint32_t n_ranges;           /* LIST: sorted, disjoint */
    struct kt_id_range *ranges;
    struct kt_cfg_where where;
};

/* One layers: entry, "10-20": 8. */
struct kt_layer_rule {
    struct kt_id_range layers;
    struct kt_expert_set set;
};

/* The routed experts one owner (an accelerator, or a NUMA node under
 * cpu.assign) holds: per_layer for every MoE layer, layers: overriding it. */
struct kt_expert_rules {
    struct kt_expert_set per_layer;
    uint32_t n_layer_rules;      /* sorted by first layer, disjoint */
    struct kt_layer_rule *layer_rules;
};

struct kt_cfg_device {
    char name[32];
    enum kt_place_backend backend;
    int cuda_device;
    double memory_gib;           /* 0 for cpu: unchecked */
    double transfer_gbps, latency_us;
    struct kt_cfg_where where;   /* the devices.NAME entry */
    struct kt_expert_rules experts;
};

struct kt_cfg_node_rules {
    int node;
    struct kt_cfg_where where;
    struct kt_expert_rules experts;
};

struct kt_cfg_use {              /* attention: gpu */
    int device;                  /* index into devices, -1 when not given */
    struct kt_cfg_where where;
};

/* cpu.sliced: the MoE layers whose CPU experts are row-sliced over cpu.nodes. */
struct kt_cfg_sliced {
    bool all;                    /* every MoE layer */
    uint32_t n_ranges;           /* sorted, disjoint */
    struct kt_id_range *ranges;
    struct kt_cfg_where *where;  /* [n_ranges] where each range was written */
};

struct kt_placement_config {
    char name[256];              /* as given, for messages */
    char *description;           /* may be NULL */
    char *profile;               /* joined to the config's directory; NULL: none */
    struct kt_cfg_where profile_where;
    uint32_t kv_tokens;
    uint32_t kv_bytes_per_value; /* of kv_type */
    enum kt_row_type kv_type;    /* kv_cache.type; absent: f32, the widest, for the estimates */
    bool kv_type_given;          /* the file says kv_cache.type: the engine runs with it */
    int n_devices;               /* devices[0] is cpu */
    struct kt_cfg_device devices[KT_PLACEMENT_MAX_DEVICES];
    struct kt_cfg_use attention, shared_experts, dense_layers, embeddings;
    bool nodes_auto;
    int n_nodes;                 /* explicit cpu.nodes */
    int nodes[KT_PLACEMENT_MAX_NODES];
    struct kt_cfg_where node_where[KT_PLACEMENT_MAX_NODES];
    int n_assign;
    struct kt_cfg_node_rules assign[KT_PLACEMENT_MAX_NODES];
    uint32_t replicas_hot_per_layer;
    struct kt_cfg_sliced sliced;
    /* ranks: the layers of each rank of an MPI job (runtime/dist), in rank
     * order, contiguous from layer 0; n_ranks 0: none given */
    int n_ranks;
    struct kt_id_range rank_layers[KT_PLACEMENT_MAX_RANKS];
    /* ranks[r].placement: rank r's own config (owned; NULL: the file's top level serves it) */
    struct kt_placement_config *rank_placement[KT_PLACEMENT_MAX_RANKS];
    /* the stage a rank's own config is for (its ranks[r].layers, [begin, end)); 0, 0: every layer */
    uint32_t stage_begin, stage_end;
};

#endif
