/*
 * placement_opt.h - the --placement FILE option shared by kt-run, kt-bench
 * and kt-serve: load a placement config v1, resolve it against the model on
 * this machine's NUMA nodes, describe it on stderr, and set the engine's
 * placement parameters; and what a dry run of a plan shows (kt-run --info
 * --placement): each expert's home, compactly, and whether the plan fits
 * this machine.
 */
#ifndef KT_TOOLS_PLACEMENT_OPT_H
#define KT_TOOLS_PLACEMENT_OPT_H

#include <stdbool.h>
#include <stdio.h>

#include "config.h"
#include "engine.h"
#include "engine_plan.h"
#include "model.h"
#include "plan.h"
#include "status.h"

/* ep's placement fields from the config at path; plan keeps what they point
 * to alive until kt_engine_plan_free.  Errors name the file (and line). */
kt_status kt_tool_placement_apply(const char *path, const struct kt_model *m, struct kt_engine_params *ep,
                                  struct kt_engine_plan *plan, kt_err *err);

/* The config at path (NULL: everything on the CPU) and its plan on the
 * machine's NUMA nodes (topology as the engine's params give it); both the
 * caller's to destroy.  resolve: the plan alone. */
kt_status kt_tool_placement_load(const char *path, const struct kt_model *m, const char *topology,
                                 struct kt_placement_config **config, struct kt_placement **out, kt_err *err);
kt_status kt_tool_placement_resolve(const char *path, const struct kt_model *m, const char *topology,
                                    struct kt_placement **out, kt_err *err);
/* The same for rank `rank` of an MPI job (runtime/dist; -1: not one): where
 * the config's ranks[rank] has a placement of its own, *out is that one
 * resolved (its NUMA nodes and its layers' experts on this rank's machine);
 * else the file's top level.  *config is still the whole file. */
kt_status kt_tool_placement_load_rank(const char *path, const struct kt_model *m, const char *topology, int rank,
                                      struct kt_placement_config **config, struct kt_placement **out, kt_err *err);
kt_status kt_tool_placement_resolve_rank(const char *path, const struct kt_model *m, const char *topology, int rank,
                                         struct kt_placement **out, kt_err *err);

/* Layer il's routed experts at one place - a device (device > 0), or CPU
 * node `node` (device 0) - as "0-3,7,9-12 (9)", or "none (0)". */
void kt_tool_print_homes(FILE *f, const struct kt_placement *p, uint32_t il, int device, int node);

/* Every MoE layer's expert homes, one line per run of layers placed alike:
 * "layers 1-60: gpu 0-7 (8); node 0 8-191 (184); node 1 192-383 (192)". */
void kt_tool_print_layer_homes(FILE *f, const struct kt_placement *p);

/* What the plan needs of this machine once ep (from kt_engine_plan_apply on
 * p) runs model m: printed per place, then the verdict.  The host's part -
 * routed experts and replicas copied into node memory, the sim's memory, a
 * GPU's experts when no GPU is there to take them, and the engine's own
 * (kt_engine_host_bytes: the KV cache on the CPU, the host matrices packed)
 * - goes through the check the loader makes (kt_meminfo_check); a GPU's
 * through its free memory.  Returns whether it fits; why says why not. */
bool kt_tool_placement_fits(FILE *f, const struct kt_model *m, const struct kt_placement *p,
                            const struct kt_engine_params *ep, kt_err *why);

/*
 * The KV cache's block pool and the context, from memory.  The pool is
 * shared by every sequence, which takes blocks as it grows (kv_cache.h; the
 * scheduler preempts when it runs out): its size is memory, not max_seqs x
 * ctx.  kv_memory_mib > 0 sets it; else it takes half of the host memory
 * free beyond what the rest of plan p needs (kt_tool_placement_fits' parts
 * and margin), or with attention on a device 9/10 of what that device's
 * budget leaves beside its weights and working buffers - never more than
 * max_seqs sequences at the full context need.  The context is ctx when
 * given (it may exceed the pool: the line says what that means), else the
 * model's context_length when one sequence of it fits the pool, else the
 * largest that does.  line says all of it in one log line.
 */
struct kt_tool_kv_request {
    uint32_t ctx;           /* --ctx; 0: from memory */
    uint32_t max_seqs;      /* sequences at once; 0: 1 */
    double kv_memory_mib;   /* --kv-memory; 0: from memory */
    uint32_t block_tokens;  /* 0: 16 */
};
struct kt_tool_kv_pool {
    uint32_t n_ctx;            /* positions per sequence */
    uint32_t n_blocks, block_tokens;
    uint64_t bytes, bytes_per_token;
    bool on_device;            /* the pool is the attention device's */
    char line[640];
};
kt_status kt_tool_kv_pool_size(const struct kt_model *m, const struct kt_placement *p,
                               const struct kt_engine_params *ep, const struct kt_tool_kv_request *rq,
                               struct kt_tool_kv_pool *out, kt_err *err);

#endif
