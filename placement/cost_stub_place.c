/*
 * cost_stub_place.c - PRIVATE STUB of cost.h for the `place` branch while
 * placement/cost.c is written on branch `cost`: simple formulas (bytes over
 * bandwidth, p_active-weighted, mean node loads).  Deleted before merge.
 */
#include "cost.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

struct kt_cost_model {
    const struct kt_model *m;
    struct kt_machine mach;
    uint32_t n_layer, n_expert, k;
    double *prob[2]; /* (n_layer, n_expert) */
};

kt_status kt_cost_create(const struct kt_model *m, const struct kt_profile *prof, const struct kt_machine *mach,
                         struct kt_cost_model **out, kt_err *err)
{
    *out = NULL;
    if (prof && (prof->n_layer != m->hp.n_layer || (prof->n_expert && prof->n_expert != m->hp.n_expert)))
        return kt_err_set(err, KT_ERR_INVALID, "cost model: profile of another shape");
    struct kt_cost_model *c = calloc(1, sizeof *c);
    c->m = m;
    c->mach = *mach;
    c->n_layer = m->hp.n_layer;
    c->n_expert = m->hp.n_expert;
    c->k = m->hp.n_expert_used;
    for (int ph = 0; ph < 2; ph++) {
        c->prob[ph] = calloc((size_t)c->n_layer * (c->n_expert ? c->n_expert : 1), sizeof(double));
        for (uint32_t il = 0; il < c->n_layer; il++)
            for (uint32_t x = 0; x < c->n_expert; x++)
                c->prob[ph][(size_t)il * c->n_expert + x] =
                    prof && prof->n_expert ? kt_profile_probability(prof, (enum kt_profile_phase)ph, il, x, c->k)
                                           : (double)c->k / c->n_expert;
    }
    *out = c;
    return KT_OK;
}

void kt_cost_destroy(struct kt_cost_model *c)
{
    if (!c)
        return;
    free(c->prob[0]);
    free(c->prob[1]);
    free(c);
}

double kt_cost_p_active(const struct kt_cost_model *c, uint32_t il, uint32_t x, const struct kt_cost_query *q)
{
    double T = q->mode == KT_COST_DECODE ? q->batch : q->tokens;
    double p = c->prob[q->mode == KT_COST_PREFILL][(size_t)il * c->n_expert + x];
    return 1.0 - pow(1.0 - (p > 1 ? 1 : p), T);
}

double kt_cost_layer(const struct kt_cost_model *c, const struct kt_placement *p, uint32_t il,
                     const struct kt_expert_home *homes, bool sliced, const struct kt_cost_query *q,
                     struct kt_cost_layer *out)
{
    struct kt_cost_layer s;
    out = out ? out : &s;
    memset(out, 0, sizeof *out);
    const struct kt_layer *L = &c->m->layers[il];
    double T = q->mode == KT_COST_DECODE ? q->batch : q->tokens;
    int nn = c->mach.n_nodes;
    double attn_b = L->attn_q_a ? (double)L->attn_q_a->nbytes * 4 : 1e6;
    bool dev_attn = p->layers[il].attention > 0;
    out->attention_s = attn_b / ((dev_attn ? 100 : 20) * 1e9) + 1e-5 * T / 64;
    if (!L->is_moe || !homes) {
        out->experts_s = 1e-4;
        out->total_s = out->attention_s + out->experts_s;
        return out->total_s;
    }
    double eb = (double)kt_layer_expert_bytes(c->m, il);
    int et = L->ffn_gate_exps ? L->ffn_gate_exps->type : 0;
    double dev = 0, cpu_total = 0, nodes[KT_PLACEMENT_MAX_NODES] = {0};
    for (uint32_t x = 0; x < c->n_expert; x++) {
        double pa = kt_cost_p_active(c, il, x, q);
        double pr = c->prob[q->mode == KT_COST_PREFILL][(size_t)il * c->n_expert + x];
        out->pairs += T * pr;
        if (homes[x].device > 0) {
            dev += pa * eb / 100e9;
            out->device_pairs += T * pr;
        } else {
            int n = homes[x].node >= 0 && homes[x].node < nn ? homes[x].node : 0;
            double t = pa * kt_machine_decode_seconds(c->mach.nodes[n].decode, et, (uint64_t)eb);
            nodes[n] += t;
            cpu_total += t;
        }
    }
    double cpu = 0;
    for (int n = 0; n < nn; n++) {
        out->node_s[n] = sliced ? cpu_total / nn : nodes[n];
        cpu = out->node_s[n] > cpu ? out->node_s[n] : cpu;
    }
    out->device_s = dev;
    out->experts_s = cpu > dev ? cpu : dev;
    out->total_s = out->attention_s + out->experts_s;
    return out->total_s;
}

kt_status kt_cost_predict(const struct kt_cost_model *c, const struct kt_placement *p, const struct kt_cost_query *q,
                          struct kt_cost_layer *layers, double *step_s, kt_err *err)
{
    (void)err;
    double t = 0;
    for (uint32_t il = 0; il < p->n_layer; il++)
        t += kt_cost_layer(c, p, il, p->layers[il].experts, p->layers[il].cpu_sliced, q, &layers[il]);
    *step_s = t + 1e-4;
    return KT_OK;
}
