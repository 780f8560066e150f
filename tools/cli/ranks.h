/*
 * ranks.h - the layers each rank of an MPI job holds, for kt-run and
 * kt-serve: the placement config's ranks: section when it has one (as many
 * ranks as mpirun started, ending at the model's last layer), else an even
 * split (kt_pipeline_split).
 */
#ifndef KT_TOOLS_RANKS_H
#define KT_TOOLS_RANKS_H

#include <stdint.h>

#include "model.h"
#include "status.h"

/* Rank `rank` of n_ranks: layers [*begin, *end).  placement: the
 * --placement file, or NULL. */
kt_status kt_tool_rank_layers(const char *placement, const struct kt_model *m, int n_ranks, int rank,
                              uint32_t *begin, uint32_t *end, kt_err *err);

#endif
