/*
 * placement_opt.c - --placement FILE for the tools (see placement_opt.h).
 */
#include "placement_opt.h"

#include <stdio.h>

#include "config.h"
#include "plan.h"
#include "topology.h"

kt_status kt_tool_placement_apply(const char *path, const struct kt_model *m, struct kt_engine_params *ep,
                                  struct kt_engine_plan *plan, kt_err *err)
{
    struct kt_placement_config *c = NULL;
    struct kt_placement *p = NULL;
    struct kt_topology *topo = NULL;
    kt_status st = kt_placement_config_load(path, &c, err);
    if (st == KT_OK)
        st = kt_topology_create(ep->topology, &topo, err);
    if (st == KT_OK)
        st = kt_placement_resolve(c, m, topo->n_nodes, NULL, &p, err);
    if (st == KT_OK) {
        kt_placement_describe(p, stderr);
        st = kt_engine_plan_apply(p, plan, ep, stderr, err);
    }
    kt_placement_destroy(p);
    kt_topology_destroy(topo);
    kt_placement_config_destroy(c);
    return st;
}
