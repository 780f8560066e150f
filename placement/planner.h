/*
 * planner.h - kt-place's planner: from a model's header, a routing profile
 * and a machine file, a placement (plan.h) chosen by the cost model
 * (cost.h), and the placement config v1 text (configs/README.md) that
 * kt-serve, kt-run and kt-bench load to get exactly that placement back.
 *
 * What it decides, in this order:
 *  1. attention with the router and the KV cache, then shared experts, dense
 *     layers and embeddings go on the accelerator while they fit (a budget
 *     that cannot hold attention and the KV cache is an error);
 *  2. the accelerator's remaining bytes go to routed experts one slot at a
 *     time, to the layer whose next hottest expert lowers the objective's
 *     predicted time the most per byte (a heap over layers), not a fixed
 *     count per layer;
 *  3. per layer, the CPU experts go whole to NUMA nodes (hottest first onto
 *     the least loaded node) when that puts the busiest node within 5% of the
 *     mean by predicted time, else the layer is row-sliced over every node;
 *  4. the hottest CPU experts of every layer are copied to every other node
 *     where the nodes' RAM allows (cpu.replicas.hot_per_layer), unless a layer
 *     is row-sliced (the engine refuses replicas there).
 * It never reads tensor data and never prints.
 */
#ifndef KT_PLACEMENT_PLANNER_H
#define KT_PLACEMENT_PLANNER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cost.h"
#include "machine.h"
#include "model.h"
#include "plan.h"
#include "profile.h"
#include "status.h"

#define KT_PLAN_BALANCE_LIMIT 1.05 /* busiest / mean CPU node per layer, by predicted time */

enum kt_plan_objective { KT_PLAN_DECODE, KT_PLAN_PREFILL, KT_PLAN_MIXED };

struct kt_planner_options {
    enum kt_place_backend device;  /* KT_PLACE_CPU: no accelerator; else CUDA or SIM */
    double gpu_memory_gib;         /* > 0: the accelerator's budget; 0: the machine file's */
    const char *budget_source;     /* names where the budget came from, for messages */
    uint32_t kv_tokens;            /* KV cache the accelerator holds room for; 0: 4096 */
    uint32_t batch;                /* decode tokens per step; 0: 1 */
    uint32_t prefill_tokens;       /* prompt of the prefill objective; 0: 512 */
    uint32_t context;              /* decode: positions cached per sequence; 0: 512 */
    enum kt_plan_objective objective;
    /* A pipeline stage (ranks_plan.h): only layers [stage_begin, stage_end) are the rank's, so the
     * accelerator's budget holds their attention, KV cache, FFNs and experts alone (the embeddings and
     * head only when the stage starts at 0) and no other layer's expert goes there; the plan's
     * layer_begin/layer_end are set to it.  0, 0: every layer. */
    uint32_t stage_begin, stage_end;
};

/* Why a layer got what it got (kt-place --explain). */
struct kt_plan_layer {
    uint32_t gpu_experts;
    double first_gain_s;           /* objective time the layer's first slot saved (0: none taken) */
    double last_gain_s;            /* ... its last slot */
    double next_gain_s;            /* what the best slot it did not get would have saved */
    bool next_fits;                /* that slot fitted in the bytes left when planning stopped */
    double balance_whole;          /* busiest / mean CPU node with whole experts (1: one node or none) */
    double balance;                /* ... as planned (sliced or whole) */
    double decode_s, prefill_s;    /* the layer's predicted times as planned */
};

struct kt_plan {
    struct kt_placement *placement;  /* the plan; owned */
    struct kt_plan_layer *layers;    /* [n_layer] */
    struct kt_planner_options options; /* with defaults filled */
    int accel;                       /* the accelerator's index in placement->devices; 0: none */
    uint64_t expert_budget_bytes;    /* accelerator bytes left for routed experts by the other parts */
    double accel_memory_gib;         /* the accelerator's budget as written (memory_gib) */
    double accel_transfer_gbps, accel_latency_us; /* sim: its modelled link, from the machine file */
    uint32_t replicas_hot_per_layer;
    double weight_decode, weight_prefill; /* the objective: weights of per-token decode and prefill time */
    double plan_s;                   /* wall time of kt_plan_create */
    const char *description;         /* kt_plan_yaml's header and description; NULL: kt-place's (objective) */
    /* kt_plan_yaml and kt_plan_check_yaml: only layers [layer_begin, layer_end) (a rank's stage, ranks_plan.h);
     * layer_end 0: every layer */
    uint32_t layer_begin, layer_end;
};

/* Plans m for prof (NULL: uniform routing) on mach with the cost model cost
 * (made from the same three).  name (the model's file) prefixes messages. */
kt_status kt_plan_create(const struct kt_model *m, const char *name, const struct kt_profile *prof,
                         const struct kt_machine *mach, const struct kt_cost_model *cost,
                         const struct kt_planner_options *o, struct kt_plan **out, kt_err *err);
void kt_plan_destroy(struct kt_plan *p);

/* The placements kt-place compares against: the same parts on the
 * accelerator and the same bytes for routed experts there, chosen by a
 * rule; CPU experts spread whole over the nodes the same way. */
enum kt_plan_baseline {
    KT_BASELINE_BY_INDEX,          /* an equal count per layer, lowest expert numbers */
    KT_BASELINE_EQUAL_PER_LAYER,   /* an equal count per layer, hottest */
    KT_BASELINE_GLOBAL_TOP,        /* the hottest (layer, expert) pairs of the whole model (KTransformers) */
    KT_BASELINE_COUNT,
};
const char *kt_plan_baseline_name(enum kt_plan_baseline b);
kt_status kt_plan_baseline(const struct kt_plan *plan, const struct kt_model *m, const struct kt_profile *prof,
                           const struct kt_machine *mach, const struct kt_cost_model *cost, enum kt_plan_baseline b,
                           struct kt_placement **out, kt_err *err);

/* What kt-place reports of a placement, by the cost model. */
struct kt_plan_summary {
    double decode_step_s, decode_tok_s;   /* at the options' batch and context */
    double prefill_s, prefill_tok_s;      /* of the options' prefill_tokens */
    double accel_share;                   /* routed (token, expert) pairs on accelerators, decode */
    double balance_worst, balance_mean;   /* busiest / mean CPU node over the MoE layers with CPU experts */
    uint32_t sliced_layers, accel_experts;
};
kt_status kt_plan_summarize(const struct kt_cost_model *cost, const struct kt_placement *p,
                            const struct kt_planner_options *o, struct kt_plan_summary *out, kt_err *err);

/* Busiest / mean of layer il's CPU nodes (the plan's expert nodes) by a
 * cost-model prediction, per step as the engine measures it (E[busiest
 * node] over the mean node); 1 when fewer than two nodes have work. */
double kt_plan_layer_balance(const struct kt_placement *p, const struct kt_cost_layer *l);

/* The plan as placement config v1 text (malloc'd, NUL-terminated; NULL out
 * of memory): explicit lists per layer for the accelerator (by its name in
 * the placement) and per node, cpu.replicas, cpu.sliced, the KV cache's type,
 * and the predicted per-layer times as comments when the layers carry any.
 * profile_path (absolute, or relative to where the file will live; may be
 * NULL) is written as `profile:` so replicas pick the experts planned. */
char *kt_plan_yaml(const struct kt_plan *p, const char *model_name, const char *profile_path);

/* Loads text as a config would be (name for messages), resolves it against
 * m on n_nodes nodes and checks every expert's home, replicas and the
 * sliced layers equal the plan's; KT_ERR_FORMAT naming the first difference. */
kt_status kt_plan_check_yaml(const struct kt_plan *p, const char *text, size_t len, const char *name,
                             const struct kt_model *m, kt_err *err);

/* KT_OK when a and b home every expert alike (device, node, replicas) and
 * slice the same layers; else KT_ERR_INVALID naming the first difference. */
kt_status kt_plan_compare(const struct kt_placement *a, const struct kt_placement *b, kt_err *err);
/* The same over layers [begin, end) alone (end 0: every layer), and the embeddings. */
kt_status kt_plan_compare_layers(const struct kt_placement *a, const struct kt_placement *b, uint32_t begin,
                                 uint32_t end, kt_err *err);

#endif
