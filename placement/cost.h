/*
 * cost.h - the cost model: predicted time of each layer of a decode step at
 * batch B and of a prefill of P tokens, for a model, a plan (plan.h), a
 * routing profile (profile.h) and a machine file (machine.h).  It is checked
 * against kt-bench model's measured per-layer times (kt-bench model
 * --predict) and is what kt-place and the rebalancer optimise.
 *
 * Decode: per CPU node the expected bytes of its active experts at batch B
 * (expected distinct active experts from the profile's probabilities, and
 * the node's expected busiest-step load, not its mean) over its measured
 * rate; the device's attention, shared and resident experts and transfers;
 * the device and the CPU pools run at once and the layer waits for the
 * slower.  Prefill: FLOPs over measured throughput, the same overlap.
 */
#ifndef KT_PLACEMENT_COST_H
#define KT_PLACEMENT_COST_H

#include <stdbool.h>
#include <stdint.h>

#include "machine.h"
#include "model.h"
#include "plan.h"
#include "profile.h"
#include "status.h"

enum kt_cost_mode { KT_COST_DECODE, KT_COST_PREFILL };

struct kt_cost_query {
    enum kt_cost_mode mode;
    uint32_t batch;              /* decode: tokens per step (one per sequence), >= 1 */
    uint32_t tokens;             /* prefill: prompt tokens P, >= 1 */
    uint32_t context;            /* positions already cached per sequence */
    uint32_t threads;            /* the engine's n_threads; 0: the machine file's */
    uint32_t chunk;              /* prefill: tokens per step (the engine's max_batch_tokens); 0: 256 */
};

/* One layer's prediction, split as kt_engine_layer_stats measures it: the
 * four host parts do not overlap; the device's busy time overlaps them. */
struct kt_cost_layer {
    double attention_s, router_s, experts_s, combine_s;
    double device_s, transfer_s;             /* the accelerator's queue busy, and of it copies */
    double node_s[KT_PLACEMENT_MAX_NODES];   /* each CPU node's routed-expert time (busiest-step expectation) */
    double cpu_experts_s;                    /* the CPU pools' routed and shared experts: E[busiest node's step] */
    double device_experts_s;                 /* the device's expert units with their copies */
    double total_s;                          /* the layer's wall time */
    double device_pairs;                     /* expected routed (token, expert) pairs on accelerators per step */
    double pairs;                            /* ... in all */
};

struct kt_cost_model;

/* Prepares per-layer, per-expert probabilities (prof; NULL: uniform routing)
 * and the model's byte and FLOP counts.  Refuses a profile of another model
 * or shape, and a machine file without the nodes the plans will use. */
kt_status kt_cost_create(const struct kt_model *m, const struct kt_profile *prof, const struct kt_machine *mach,
                         struct kt_cost_model **out, kt_err *err);
void kt_cost_destroy(struct kt_cost_model *c);

/* layers [p->n_layer]; *step_s: the whole step (layers, embedding, head). */
kt_status kt_cost_predict(const struct kt_cost_model *c, const struct kt_placement *p, const struct kt_cost_query *q,
                          struct kt_cost_layer *layers, double *step_s, kt_err *err);

/* Layer il alone with its routed experts where homes[n_expert] says and
 * the other parts where p says: what the planner evaluates many times.
 * sliced: the layer's CPU experts are row-sliced over p's expert nodes. */
double kt_cost_layer(const struct kt_cost_model *c, const struct kt_placement *p, uint32_t il,
                     const struct kt_expert_home *homes, bool sliced, const struct kt_cost_query *q,
                     struct kt_cost_layer *out);

/* Probability that expert x of layer il is used by at least one of the
 * batch's tokens in one step of the query's shape: 1 - (1 - p)^B. */
double kt_cost_p_active(const struct kt_cost_model *c, uint32_t il, uint32_t x, const struct kt_cost_query *q);

#endif
