/*
 * engine_plan.h - a resolved placement (plan.h) turned into the engine's
 * parameters (engine.h): expert homes and replicas on NUMA nodes, routed and
 * shared experts on the accelerator.
 *
 * The engine runs attention (with the KV cache), dense FFNs, routed and
 * shared experts and the output head on one accelerator; the embedding
 * lookup (one row per token) stays on the host wherever the plan puts the
 * embeddings, and one log line says so.  A plan using more than one
 * accelerator, or attention, dense FFNs or shared experts on a device in
 * some layers only, is refused.  It never changes what the plan says about
 * experts.  Row-sliced layers (cpu_sliced) are sliced over the plan's
 * expert_nodes.
 */
#ifndef KT_PLACEMENT_ENGINE_PLAN_H
#define KT_PLACEMENT_ENGINE_PLAN_H

#include <stdint.h>
#include <stdio.h>

#include "backend.h"
#include "engine.h"
#include "expert_store.h"
#include "plan.h"
#include "status.h"

/* Arrays the parameters point into; owned, freed by kt_engine_plan_free. */
struct kt_engine_plan {
    int *home_nodes;            /* [n_layer * n_expert] */
    uint16_t *replica_nodes;    /* [n_layer * n_expert] */
    uint8_t *on_device;         /* [n_layer * n_expert]; NULL when no expert is on a device */
    uint8_t *layer_sliced;      /* [n_layer] the plan's cpu_sliced */
    struct kt_backend_params device;
    char device_name[32];
};

/* Fills ep's placement fields from p (other fields untouched); log gets the
 * lines about pieces that run elsewhere than planned (NULL: silent). */
kt_status kt_engine_plan_apply(const struct kt_placement *p, struct kt_engine_plan *out, struct kt_engine_params *ep,
                               FILE *log, kt_err *err);
void kt_engine_plan_free(struct kt_engine_plan *out);

#endif
