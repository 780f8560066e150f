/*
 * placement_opt.h - the --placement FILE option shared by kt-run and
 * kt-bench: load a placement config v1, resolve it against the model on this
 * machine's NUMA nodes, describe it on stderr, and set the engine's
 * placement parameters.
 */
#ifndef KT_TOOLS_PLACEMENT_OPT_H
#define KT_TOOLS_PLACEMENT_OPT_H

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

#endif
