/*
 * ranks_plan.h - kt-place over the ranks of an MPI job (runtime/dist): which
 * contiguous layers each rank holds, sized by memory and by predicted time,
 * and each rank's own placement of its layers (planner.h on its own machine
 * file, with its own accelerator when it has one: a hybrid stage), as one
 * placement config with a `ranks:` section.
 *
 * How the layers are split:
 *  - every rank r's plan of the whole model on its machine (kt_plan_create)
 *    gives each layer's predicted time there (the objective's per-token
 *    time: decode step / batch, prefill / tokens, weighted as the planner's
 *    objective) and its bytes there (weights, the plan's replicas, the KV
 *    cache of kv_tokens positions); rank 0 also holds the embedding and the
 *    output head (their bytes, and the head's predicted time);
 *  - a rank with a device (kt_rank_input.device) is planned hybrid: as its
 *    stage will hold about n layers, its whole-model estimate gets the
 *    device's budget x n_layer / n (the density of device bytes a stage of n
 *    layers has), n first the even split's count, then the count the split
 *    gave, until the split repeats (at most KT_RANK_PLAN_ROUNDS rounds);
 *  - every stage adds the time to send its output on over the link to the
 *    next rank (the last one's back to rank 0, for the head): per message
 *    latency_us + bytes / bandwidth, with the slower of the two hosts'
 *    `network` figures (machine.h), the bytes what runtime/dist/pipeline.c
 *    sends - a header, the tokens and n_embd floats a token; a decode batch
 *    of B >= 2 tokens goes in min(B, ranks) micro-batches, a prefill whole;
 *  - a split fits when every rank's bytes plus the loader's margin
 *    (kt_meminfo_margin_bytes) are within its machine's RAM (the sum of its
 *    nodes' memory_gib; a machine file without memory figures is not
 *    checked), and a device rank's stage's attention and KV cache with the
 *    engine's working buffers within its device's budget (the rest of the
 *    device - shared experts, hot experts - is filled by the stage's plan);
 *  - of the splits that fit, the one whose slowest stage is fastest (the
 *    pipeline's rate with micro-batches), and among those the one with the
 *    most equal stages (least sum of squared stage times): a dynamic program
 *    over (rank, last layer), O(ranks x layers^2).
 * A device rank's written plan is then made for its stage alone
 * (kt_planner_options.stage_begin): the device's budget holds that stage's
 * parts and experts, the placement it writes resolves as that stage
 * (ranks[r].placement counts ranks[r].layers).  A CPU rank's plan is its
 * whole-model one.  It never prints.
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
#define KT_RANK_PLAN_ROUNDS 4 /* estimates of the device ranks' stages, at most */

/* One rank's stage of a split. */
struct kt_rank_stage {
    uint32_t first, last;        /* its layers [first, last] */
    double objective_s;          /* predicted per-token time of its layers (+ the head on rank 0) and its link */
    double decode_s, prefill_s;  /* ... as a decode step of the options' batch and a prefill of prefill_tokens */
    double link_s;               /* of objective_s: sending its output on (the objective's per-token time) */
    double link_decode_s, link_prefill_s; /* of decode_s and prefill_s: the same for a step and a prefill */
    uint64_t bytes;              /* what it holds: weights, replicas, KV cache (+ embeddings, head on rank 0) */
    uint64_t capacity;           /* its machine's RAM; 0: unknown (not checked) */
    bool device;                 /* the rank plans its stage with its accelerator */
    /* on its device: the planned split, what the stage's plan puts there; the even split, what it must hold
     * (its layers' attention and KV cache, the working buffers) */
    uint64_t device_bytes, device_capacity;
    bool fits;                   /* bytes + the loader's margin <= capacity (true when unknown), the device's too */
};

/* What each rank is planned on. */
struct kt_rank_input {
    const struct kt_machine *mach;
    const struct kt_cost_model *cost; /* made from the model, the profile and mach */
    const char *name;                 /* the machine file, for messages ("defaults" when none) */
    /* KT_PLACE_CPU: its host's CPU alone; else its machine's accelerator of this backend (a hybrid stage) */
    enum kt_place_backend device;
};

struct kt_rank_plan {
    int n_ranks;
    struct kt_rank_stage stages[KT_RANK_PLAN_MAX]; /* the split chosen */
    struct kt_rank_stage even[KT_RANK_PLAN_MAX];   /* the even split by count (kt_pipeline_split), compared */
    bool even_fits;
    struct kt_plan *plans[KT_RANK_PLAN_MAX];       /* rank r's plan on its machine; its stage's layers are written */
    int rounds;                                    /* splits made (1 without device ranks) */
    double plan_s;                                 /* wall time of kt_plan_ranks */
};

/* The split over figures the caller computed (n_ranks x n_layer arrays
 * indexed [r * n_layer + il]). */
struct kt_rank_split_input {
    uint32_t n_layer;
    int n_ranks;
    const double *layer_s;           /* layer il's time on rank r */
    double head_s;                   /* what rank 0 adds */
    const uint64_t *layer_bytes;     /* layer il's bytes in rank r's RAM */
    uint64_t head_bytes;
    const uint64_t *capacity;        /* [n_ranks] RAM; 0: unknown */
    const double *link_s;            /* [n_ranks] what sending its output on adds to rank r's stage; NULL: nothing */
    /* Devices (all three NULL: none): what layer il must have on rank r's device (attention and KV cache),
     * what the device holds whatever its layers (working buffers), and its budget (0: no device). */
    const uint64_t *device_layer_bytes, *device_fixed, *device_capacity;
};

/* first[r] receives rank r's first layer (rank r holds [first[r],
 * first[r + 1]), the last up to n_layer).  KT_ERR_INVALID when no split fits
 * (why names the tightest rank), or more ranks than layers. */
kt_status kt_rank_split_with(const struct kt_rank_split_input *in, uint32_t *first, kt_err *err);
/* The same without links or devices. */
kt_status kt_rank_split(uint32_t n_layer, int n_ranks, const double *layer_s, double head_s,
                        const uint64_t *layer_bytes, uint64_t head_bytes, const uint64_t *capacity, uint32_t *first,
                        kt_err *err);

/* Bytes of one message of n_tokens tokens as runtime/dist/pipeline.c sends
 * it (step: a STEP, with the tokens; else the RESULT back to rank 0); what
 * kt-bench model's pipeline counts (test_kt_run_mpi checks the two agree). */
uint64_t kt_rank_message_bytes(uint32_t n_tokens, uint32_t n_embd, bool step);

/* Seconds to send n_tokens tokens' residual stream of n_embd floats from a
 * host to the next (step: a STEP message with the tokens, else the RESULT
 * back to rank 0) in `messages` micro-batches as runtime/dist/pipeline.c
 * slices them, over the slower of the two hosts' networks. */
double kt_rank_link_seconds(const struct kt_machine *from, const struct kt_machine *to, uint32_t n_embd,
                            uint32_t n_tokens, uint32_t messages, bool step);

/* Plans m over n_ranks ranks, in[r] for rank r (o->device is not used:
 * in[r].device says; o->gpu_memory_gib > 0 is every device rank's budget,
 * else its machine file's).  name (the model's file) prefixes messages. */
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
