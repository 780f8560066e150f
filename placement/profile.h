/*
 * profile.h - routing profile: how many tokens the router sent to each
 * expert of each layer, the measurement placement chooses hot experts by.
 *
 * File format (JSON, version 1):
 *
 *     {"version": 1, "model": "Kimi-K2", "layers": [[], [12, 0, 7, ...], ...]}
 *
 * layers has one array per model layer: empty for a layer without data (dense
 * layers), else one non-negative number per routed expert, the same count in
 * every non-empty row.  Counts may be fractional (decayed).  "model" is
 * informational.
 */
#ifndef KT_PLACEMENT_PROFILE_H
#define KT_PLACEMENT_PROFILE_H

#include <stddef.h>
#include <stdint.h>

#include "status.h"

struct kt_profile {
    char model[128];
    uint32_t n_layer;
    uint32_t n_expert;           /* 0 when every row is empty */
    double *tokens;              /* (n_layer, n_expert): routed tokens; 0 in empty rows */
};

/* Reads a profile file (at most 64 MiB).  KT_ERR_IO when it cannot be read,
 * KT_ERR_FORMAT "FILE: where: problem" when it is malformed. */
kt_status kt_profile_load(const char *path, struct kt_profile **out, kt_err *err);
kt_status kt_profile_parse(const char *text, size_t len, const char *name, struct kt_profile **out, kt_err *err);

/* An all-zero profile of the given shape, for callers that count. */
kt_status kt_profile_create(uint32_t n_layer, uint32_t n_expert, const char *model, struct kt_profile **out,
                            kt_err *err);

/* Writes p as JSON; rows that are all zero are written empty. */
kt_status kt_profile_save(const struct kt_profile *p, const char *path, kt_err *err);

void kt_profile_destroy(struct kt_profile *p);

#endif
