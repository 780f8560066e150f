/*
 * ranks_plan.h - kt-place over the ranks of an MPI job (runtime/dist): which
 * contiguous layers each rank holds, sized by memory and by predicted time,
 * and each rank's own placement of its layers (planner.h on its own machine
 * file), as one placement config with a `ranks:` section.
 *
 * How the layers are split:
 *  - every rank r's plan of the whole model on its machine (kt_plan_create)
 *    gives each layer's predicted time there (the objective's per-token
 *    time: decode step / batch, prefill / tokens, weighted as the planner's
 *    objective) and its bytes there (weights, the plan's replicas, the KV
 *    cache of kv_tokens positions); rank 0 also holds the embedding and the
 *    output head (their bytes, and the head's predicted time);
 *  - a split fits when every rank's bytes plus the loader's margin
 *    (kt_meminfo_margin_bytes) are within its machine's RAM (the sum of its
 *    nodes' memory_gib; a machine file without memory figures is not checked);
 *  - of the splits that fit, the one whose slowest stage is fastest (the
 *    pipeline's rate with micro-batches), and among those the one with the
 *    most equal stages (least sum of squared stage times): a dynamic program
 *    over (rank, last layer), O(ranks x layers^2).
 * A stage runs on its host's CPU (runtime/dist refuses a device with a layer
 * range), so the ranks' plans are CPU plans.  It never prints.
 */
#ifndef KT_PLACEMENT_RANKS_PLAN_H
#define KT_PLACEMENT_RANKS_PLAN_H

#include <stdbool.h>
#include <stdint.h>

#include "cost.h"
#include "machine.h"
#include "model.h"
#include "planner.h"
#include "profile.h"
#include "status.h"

#define KT_RANK_PLAN_MAX 16 /* as runtime/dist's KT_PIPELINE_MAX_RANKS */

/* One rank's stage of a split. */
struct kt_rank_stage {
    uint32_t first, last;        /* its layers [first, last] */
    double objective_s;          /* predicted per-token time of its layers (+ the head on rank 0) */
    double decode_s, prefill_s;  /* ... as a decode step of the options' batch and a prefill of prefill_tokens */
    uint64_t bytes;              /* what it holds: weights, replicas, KV cache (+ embeddings, head on rank 0) */
    uint64_t capacity;           /* its machine's RAM; 0: unknown (not checked) */
    bool fits;                   /* bytes + the loader's margin <= capacity (true when unknown) */
};

/* What each rank is planned on. */
struct kt_rank_input {
    const struct kt_machine *mach;
    const struct kt_cost_model *cost; /* made from the model, the profile and mach */
    const char *name;                 /* the machine file, for messages ("defaults" when none) */
};

struct kt_rank_plan {
    int n_ranks;
    struct kt_rank_stage stages[KT_RANK_PLAN_MAX]; /* the split chosen */
    struct kt_rank_stage even[KT_RANK_PLAN_MAX];   /* the even split by count (kt_pipeline_split), compared */
    bool even_fits;
    struct kt_plan *plans[KT_RANK_PLAN_MAX];       /* rank r's plan on its machine; its stage's layers are written */
    double plan_s;                                 /* wall time of kt_plan_ranks */
};

/* The split alone, over figures the caller computed: layer_s[r * n_layer +
 * il] and layer_bytes[r * n_layer + il] are layer il's time and bytes on
 * rank r, head_s and head_bytes what rank 0 adds, capacity[r] rank r's RAM
 * (0: unknown).  first[r] receives rank r's first layer (rank r holds
 * [first[r], first[r + 1]), the last up to n_layer).  KT_ERR_INVALID when no
 * split fits (why names the tightest rank), or more ranks than layers. */
kt_status kt_rank_split(uint32_t n_layer, int n_ranks, const double *layer_s, double head_s,
                        const uint64_t *layer_bytes, uint64_t head_bytes, const uint64_t *capacity, uint32_t *first,
                        kt_err *err);

/* Plans m over n_ranks ranks, in[r] for rank r (o->device must be
 * KT_PLACE_CPU).  name (the model's file) prefixes messages. */
kt_status kt_plan_ranks(const struct kt_model *m, const char *name, const struct kt_profile *prof, int n_ranks,
                        const struct kt_rank_input *in, const struct kt_planner_options *o, struct kt_rank_plan **out,
                        kt_err *err);
void kt_rank_plan_destroy(struct kt_rank_plan *rp);

/* The plan as placement config v1 text (malloc'd; NULL out of memory): a
 * CPU top level (what one process runs), then `ranks:` with each rank's
 * layers and, under `placement:`, its own plan of its layers
 * (kt_plan_yaml), the predicted stages as comments. */
char *kt_rank_plan_yaml(const struct kt_rank_plan *rp, const char *model_name, const char *profile_path,
                        const struct kt_rank_input *in);

/* Parses text (name for messages) and checks that it gives rp back: the
 * same ranks and layers, and every rank's placement resolving (on its
 * machine's nodes) to its plan over its layers.  KT_ERR_FORMAT naming the
 * first difference. */
kt_status kt_rank_plan_check_yaml(const struct kt_rank_plan *rp, const char *text, size_t len, const char *name,
                                  const struct kt_model *m, kt_err *err);

#endif
