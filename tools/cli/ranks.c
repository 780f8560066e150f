/*
 * ranks.c - which layers this rank of an MPI job holds (ranks.h).
 */
#include "ranks.h"

#include "config.h"
#include "pipeline.h"

kt_status kt_tool_rank_layers(const char *placement, const struct kt_model *m, int n_ranks, int rank,
                              uint32_t *begin, uint32_t *end, kt_err *err)
{
    const uint32_t n_layer = m->hp.n_layer;
    if ((uint32_t)n_ranks > n_layer)
        return kt_err_set(err, KT_ERR_INVALID, "%d ranks for the %u layers of the model: run at most %u ranks (each "
                          "holds one layer or more)", n_ranks, n_layer, n_layer);
    struct kt_placement_config *c = NULL;
    kt_status st = placement ? kt_placement_config_load(placement, &c, err) : KT_OK;
    if (st != KT_OK)
        return st;
    const int given = c ? kt_placement_config_ranks(c) : 0;
    if (given == 0) {
        kt_pipeline_split(n_layer, n_ranks, rank, begin, end);
    } else if (given != n_ranks) {
        st = kt_err_set(err, KT_ERR_INVALID, "%s: ranks: lists %d ranks, but mpirun started %d: start as many as "
                        "it lists (mpirun -np %d)", placement, given, n_ranks, given);
    } else {
        uint32_t first, last;
        kt_placement_config_rank_layers(c, given - 1, &first, &last);
        if (last + 1 != n_layer)
            st = kt_err_set(err, KT_ERR_INVALID, "%s: ranks: the last rank ends at layer %u, but the model's last "
                            "layer is %u: the ranks must hold every layer", placement, last, n_layer - 1);
        kt_placement_config_rank_layers(c, rank, &first, &last);
        *begin = first;
        *end = last + 1;
    }
    kt_placement_config_destroy(c);
    return st;
}
