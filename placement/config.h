/*
 * config.h - placement config v1: a YAML file (configs/README.md has the
 * schema) saying which device holds attention, shared experts, dense layers
 * and embeddings, how many or which routed experts each accelerator holds per
 * layer, and how the rest are spread over CPU NUMA nodes.
 *
 * Loading checks everything that can be checked without a model: syntax,
 * unknown keys, types, ranges, duplicates and device names.  Each error is
 * KT_ERR_FORMAT with a message "FILE:LINE:COL: KEY.PATH: problem".  What
 * depends on the model (expert and layer numbers, memory budgets) is checked
 * by kt_placement_resolve (plan.h), with the same kind of message.
 */
#ifndef KT_PLACEMENT_CONFIG_H
#define KT_PLACEMENT_CONFIG_H

#include <stdint.h>

#include <stddef.h>

#include "status.h"

struct kt_placement_config;

/* Reads and validates the file at path (at most 16 MiB). */
kt_status kt_placement_config_load(const char *path, struct kt_placement_config **out, kt_err *err);

/* The same over text[0..len); name is used in messages and its directory
 * anchors a relative profile path. */
kt_status kt_placement_config_parse(const char *text, size_t len, const char *name,
                                    struct kt_placement_config **out, kt_err *err);

void kt_placement_config_destroy(struct kt_placement_config *c);

/* The profile file the config names (relative paths already joined to the
 * config's directory), or NULL when it names none. */
const char *kt_placement_config_profile(const struct kt_placement_config *c);
/* cpu.replicas.hot_per_layer (0: none). */
uint32_t kt_placement_config_replicas_hot_per_layer(const struct kt_placement_config *c);
/* ranks: an MPI job's layer ranges (runtime/dist): how many ranks it gives (0: no ranks:
 * section), and rank r's first and last layer (r < that; contiguous from 0 in
 * rank order, checked at load; that the last ends at the model's last layer is
 * the tools' check). */
int kt_placement_config_ranks(const struct kt_placement_config *c);
void kt_placement_config_rank_layers(const struct kt_placement_config *c, int rank, uint32_t *first, uint32_t *last);
/* ranks[rank].placement: that rank's own config (its devices, NUMA nodes and its layers' experts, a
 * placement config v1 of its own, which kt_placement_resolve takes), or NULL when the entry has none (the
 * file's top level then serves every rank).  Owned by c. */
const struct kt_placement_config *kt_placement_config_rank_placement(const struct kt_placement_config *c, int rank);
/* Resolve c as a pipeline stage of layers [begin, end) (0, 0: every layer): its bytes and device budgets
 * count those layers alone (kt_placement.stage_begin).  A rank's own config (ranks[r].placement) is
 * that of its ranks[r].layers already; kt-place's planner sets it for a rank's stage. */
void kt_placement_config_set_stage(struct kt_placement_config *c, uint32_t begin, uint32_t end);

#endif
