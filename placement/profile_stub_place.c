/*
 * profile_stub_place.c - PRIVATE STUB of the profile.h functions branch
 * `profile` implements (kt_profile_check_model, kt_profile_probability),
 * for the `place` branch until it lands.  Deleted before merge.
 */
#include "profile.h"

kt_status kt_profile_check_model(const struct kt_profile *p, const struct kt_model_identity *id, const char *name,
                                 kt_err *err)
{
    if (p->n_layer != id->n_layer || (p->n_expert && p->n_expert != id->n_expert))
        return kt_err_set(err, KT_ERR_INVALID, "%s: a profile of %u x %u, not of this model (%u x %u)", name,
                          p->n_layer, p->n_expert, id->n_layer, id->n_expert);
    return KT_OK;
}

double kt_profile_probability(const struct kt_profile *p, enum kt_profile_phase ph, uint32_t il, uint32_t x,
                              uint32_t k)
{
    (void)ph;
    if (!p->n_expert || il >= p->n_layer || x >= p->n_expert)
        return 0;
    double row = 0;
    for (uint32_t e = 0; e < p->n_expert; e++)
        row += kt_profile_count(p, il, e);
    return row > 0 ? k * kt_profile_count(p, il, x) / row : 0;
}
