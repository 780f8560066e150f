/*
 * step_clock.c - the step's time, split the way kt_engine_stats and
 * kt_engine_layer_stats report it, kept out of the step's main line: the step
 * calls a lap at the end of each part, and a layer's laps (and the device's
 * queue time during the layer) go to that layer's counters when it ends.
 * moe.c counts the router and expert time inside the FFN itself; the FFN lap
 * gives the layer the rest.
 */
#include "forward.h"

void kt_step_clock_start(struct kt_engine *e, struct kt_step_clock *c)
{
    (void)e;
    *c = (struct kt_step_clock){.last_ns = kt_fwd_now_ns()};
}

void kt_step_clock_lap(struct kt_engine *e, struct kt_step_clock *c, enum kt_step_part part)
{
    const uint64_t now = kt_fwd_now_ns(), dt = now - c->last_ns;
    c->last_ns = now;
    c->part_ns[part] += dt;
    switch (part) {
    case KT_PART_EMBED_HEAD:
        e->stats.other_ns += dt;
        e->stats.embed_head_ns += dt;
        break;
    case KT_PART_ATTENTION: e->stats.attention_ns += dt; break;
    case KT_PART_COMBINE: e->stats.other_ns += dt; break;
    case KT_PART_FFN: /* moe.c and the dense FFN count their own */
    case KT_STEP_PARTS: break;
    }
}

void kt_step_clock_begin_layer(struct kt_engine *e, struct kt_step_clock *c)
{
    c->part_ns[KT_PART_ATTENTION] = c->part_ns[KT_PART_COMBINE] = c->part_ns[KT_PART_FFN] = 0;
    c->router_ns_before = e->stats.router_ns;
    if (e->dev.backend)
        kt_backend_stats(e->dev.backend, &c->device_before);
    c->last_ns = kt_fwd_now_ns();
}

void kt_step_clock_end_layer(struct kt_engine *e, struct kt_step_clock *c, uint32_t il)
{
    struct kt_engine_layer_stats *ls = &e->layer_stats[il];
    const uint64_t router = e->stats.router_ns - c->router_ns_before, ffn = c->part_ns[KT_PART_FFN];
    ls->attention_ns += c->part_ns[KT_PART_ATTENTION];
    ls->router_ns += router;
    ls->experts_ns += ffn > router ? ffn - router : 0;
    ls->combine_ns += c->part_ns[KT_PART_COMBINE];
    if (e->dev.backend) { /* the layer synced with the device: its queue time is counted */
        struct kt_backend_stats now;
        kt_backend_stats(e->dev.backend, &now);
        ls->device_ns += now.busy_ns - c->device_before.busy_ns;
        ls->device_transfer_ns += now.transfer_ns - c->device_before.transfer_ns;
    }
}
