/*
 * engine_plan.c - plan -> engine parameters (see engine_plan.h).
 */
#include "engine_plan.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>


void kt_engine_plan_free(struct kt_engine_plan *out)
{
    free(out->home_nodes);
    free(out->replica_nodes);
    free(out->on_device);
    free(out->layer_sliced);
    memset(out, 0, sizeof *out);
}

/* Makes d (a device index > 0) the plan's one accelerator; a second one is refused. */
static kt_status use_device(const struct kt_placement *p, uint32_t il, int *device, int d, kt_err *err)
{
    if (*device && *device != d)
        return kt_err_set(err, KT_ERR_UNSUPPORTED, "%s: layer %u: work on two accelerators (%s and %s)", p->source,
                          il, p->devices[*device].name, p->devices[d].name);
    *device = d;
    return KT_OK;
}

kt_status kt_engine_plan_apply(const struct kt_placement *p, struct kt_engine_plan *out, struct kt_engine_params *ep,
                               FILE *log, kt_err *err)
{
    memset(out, 0, sizeof *out);
    const size_t n = (size_t)p->n_layer * p->n_expert;
    out->home_nodes = calloc(n ? n : 1, sizeof *out->home_nodes);
    out->replica_nodes = calloc(n ? n : 1, sizeof *out->replica_nodes);
    out->on_device = calloc(n ? n : 1, 1);
    out->layer_sliced = calloc(p->n_layer ? p->n_layer : 1, 1);
    if (!out->home_nodes || !out->replica_nodes || !out->on_device || !out->layer_sliced) {
        kt_engine_plan_free(out);
        return kt_err_set(err, KT_ERR_NOMEM, "placement: out of memory");
    }
    int device = 0;              /* the one accelerator with attention, experts or shared experts */
    int shared_layers = 0, shared_on_device = 0;
    uint32_t attention_on_device = 0, dense_layers = 0, dense_on_device = 0;
    uint32_t sliced_layers = 0;
    kt_status st = KT_OK;
    for (uint32_t il = 0; il < p->n_layer && st == KT_OK; il++) {
        const struct kt_placement_layer *L = &p->layers[il];
        out->layer_sliced[il] = L->is_moe && L->cpu_sliced;
        sliced_layers += out->layer_sliced[il];
        if (!L->is_moe) {
            dense_layers++;
            if (L->dense_ffn > 0 && (st = use_device(p, il, &device, L->dense_ffn, err)) == KT_OK)
                dense_on_device++;
        }
        if (st == KT_OK && L->attention > 0 && (st = use_device(p, il, &device, L->attention, err)) == KT_OK)
            attention_on_device++;
        if (L->is_moe && L->shared_experts >= 0) {
            shared_layers++;
            if (st == KT_OK && L->shared_experts > 0 &&
                (st = use_device(p, il, &device, L->shared_experts, err)) == KT_OK)
                shared_on_device++;
        }
        for (uint32_t x = 0; L->experts && x < p->n_expert && st == KT_OK; x++) {
            const struct kt_expert_home *h = &L->experts[x];
            const size_t at = (size_t)il * p->n_expert + x;
            if (h->device > 0) {
                st = use_device(p, il, &device, h->device, err);
                out->on_device[at] = 1;
                continue;
            }
            if (h->node >= KT_EXPERT_MAX_NODES || (h->replica_nodes >> KT_EXPERT_MAX_NODES) != 0)
                st = kt_err_set(err, KT_ERR_UNSUPPORTED, "%s: layer %u expert %u: NUMA nodes beyond %d", p->source, il,
                                x, KT_EXPERT_MAX_NODES - 1);
            out->home_nodes[at] = h->node < 0 ? 0 : h->node;
            out->replica_nodes[at] = (uint16_t)h->replica_nodes;
        }
    }
    if (p->kv_type_given) /* the config chose the KV cache's rows; its estimates counted them */
        ep->kv_type = p->kv_type;
    if (st == KT_OK && sliced_layers && (p->expert_nodes >> KT_EXPERT_MAX_NODES) != 0)
        st = kt_err_set(err, KT_ERR_UNSUPPORTED, "%s: %u layers row-sliced over NUMA nodes beyond %d", p->source,
                        sliced_layers, KT_EXPERT_MAX_NODES - 1);
    if (st == KT_OK && p->embeddings > 0) /* the output head goes there; the lookup stays on the host */
        st = use_device(p, p->n_layer - 1, &device, p->embeddings, err);
    if (st == KT_OK && attention_on_device && attention_on_device != p->n_layer)
        st = kt_err_set(err, KT_ERR_UNSUPPORTED,
                        "%s: attention on the device in %u of %u layers: kt runs it all on one side", p->source,
                        attention_on_device, p->n_layer);
    if (st == KT_OK && dense_on_device && dense_on_device != dense_layers)
        st = kt_err_set(err, KT_ERR_UNSUPPORTED, "%s: dense FFNs on the device in %u of %u dense layers", p->source,
                        dense_on_device, dense_layers);
    if (st == KT_OK && shared_on_device && shared_on_device != shared_layers)
        st = kt_err_set(err, KT_ERR_UNSUPPORTED,
                        "%s: shared experts on the device in %d of %d layers: kt runs them all on one side", p->source,
                        shared_on_device, shared_layers);
    if (st != KT_OK) {
        kt_engine_plan_free(out);
        return st;
    }

    ep->expert_home_nodes = out->home_nodes;
    ep->expert_replica_nodes = out->replica_nodes;
    ep->layer_sliced = out->layer_sliced;
    ep->expert_slice_nodes = (uint16_t)p->expert_nodes;
    kt_err why = {0};
    if (device && p->devices[device].backend == KT_PLACE_CUDA && kt_backend_available(KT_BACKEND_CUDA, &why) != KT_OK) {
        /* what the plan gives the GPU runs on the CPU: experts at home on node 0 */
        if (log)
            fprintf(log, "kt: %s: running CPU-only; what %s places on '%s' runs on the CPU\n", why.msg,
                    p->source, p->devices[device].name);
        device = 0;
    }
    if (device) {
        const struct kt_placement_device *d = &p->devices[device];
        snprintf(out->device_name, sizeof out->device_name, "%s", d->name);
        out->device = (struct kt_backend_params){
            .kind = d->backend == KT_PLACE_CUDA ? KT_BACKEND_CUDA : KT_BACKEND_SIM,
            .name = out->device_name,
            .memory_bytes = d->budget_bytes,
            .transfer_gbps = d->transfer_gbps,
            .latency_us = d->latency_us,
            .device = d->cuda_device,
        };
        ep->device = &out->device;
        ep->expert_on_device = out->on_device;
        ep->shared_on_device = shared_on_device > 0;
        ep->attention_on_device = attention_on_device > 0;
        ep->dense_on_device = dense_on_device > 0;
        ep->output_on_device = p->embeddings > 0;
        if (log && ep->output_on_device)
            fprintf(log, "kt: %s: the output head runs on '%s'; the embedding lookup (one row per token) stays on "
                         "the CPU\n",
                    p->source, d->name);
    }
    return KT_OK;
}
