/*
 * placement_opt.c - --placement FILE for the tools (see placement_opt.h).
 */
#include "placement_opt.h"

#include <stdio.h>
#include <string.h>

#include "topology.h"

kt_status kt_tool_placement_load(const char *path, const struct kt_model *m, const char *topology,
                                 struct kt_placement_config **config, struct kt_placement **out, kt_err *err)
{
    static const char cpu_only[] = "version: 1\ndescription: every weight on the CPU\nattention: cpu\n";
    struct kt_topology *topo = NULL;
    *out = NULL;
    *config = NULL;
    kt_status st = path ? kt_placement_config_load(path, config, err)
                        : kt_placement_config_parse(cpu_only, strlen(cpu_only), "cpu only", config, err);
    if (st == KT_OK)
        st = kt_topology_create(topology, &topo, err);
    if (st == KT_OK)
        st = kt_placement_resolve(*config, m, topo->n_nodes, NULL, out, err);
    kt_topology_destroy(topo);
    if (st != KT_OK) {
        kt_placement_config_destroy(*config);
        *config = NULL;
    }
    return st;
}

kt_status kt_tool_placement_resolve(const char *path, const struct kt_model *m, const char *topology,
                                    struct kt_placement **out, kt_err *err)
{
    struct kt_placement_config *c = NULL;
    kt_status st = kt_tool_placement_load(path, m, topology, &c, out, err);
    kt_placement_config_destroy(c);
    return st;
}

kt_status kt_tool_placement_apply(const char *path, const struct kt_model *m, struct kt_engine_params *ep,
                                  struct kt_engine_plan *plan, kt_err *err)
{
    struct kt_placement *p = NULL;
    kt_status st = kt_tool_placement_resolve(path, m, ep->topology, &p, err);
    if (st == KT_OK) {
        kt_placement_describe(p, stderr);
        st = kt_engine_plan_apply(p, plan, ep, stderr, err);
    }
    kt_placement_destroy(p);
    return st;
}
