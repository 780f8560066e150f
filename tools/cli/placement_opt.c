/*
 * placement_opt.c - --placement FILE for the tools (see placement_opt.h).
 */
#include "placement_opt.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kt_cuda.h"
#include "meminfo.h"
#include "preflight.h"
#include "topology.h"

kt_status kt_tool_placement_load(const char *path, const struct kt_model *m, const char *topology,
                                 struct kt_placement_config **config, struct kt_placement **out, kt_err *err)
{
    return kt_tool_placement_load_rank(path, m, topology, -1, config, out, err);
}

kt_status kt_tool_placement_load_rank(const char *path, const struct kt_model *m, const char *topology, int rank,
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
    /* an MPI job's rank with a placement of its own (ranks[rank].placement): that one */
    const struct kt_placement_config *own =
        st == KT_OK && rank >= 0 ? kt_placement_config_rank_placement(*config, rank) : NULL;
    if (st == KT_OK)
        st = kt_placement_resolve(own ? own : *config, m, topo->n_nodes, NULL, out, err);
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
    return kt_tool_placement_resolve_rank(path, m, topology, -1, out, err);
}

kt_status kt_tool_placement_resolve_rank(const char *path, const struct kt_model *m, const char *topology, int rank,
                                         struct kt_placement **out, kt_err *err)
{
    struct kt_placement_config *c = NULL;
    kt_status st = kt_tool_placement_load_rank(path, m, topology, rank, &c, out, err);
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

/* ---- a dry run ----------------------------------------------------------------------------------- */

static bool at_place(const struct kt_expert_home *h, int device, int node)
{
    return h->device == device && (device != 0 || h->node == node);
}

void kt_tool_print_homes(FILE *f, const struct kt_placement *p, uint32_t il, int device, int node)
{
    enum { MAX_GROUPS = 8 }; /* past this many, "..." and the count say the rest */
    const struct kt_expert_home *h = p->layers[il].experts;
    uint32_t n = 0, groups = 0;
    uint32_t *x = malloc((p->n_expert + 1) * sizeof *x); /* the experts there, ascending */
    for (uint32_t e = 0; x && h && e < p->n_expert; e++)
        if (at_place(&h[e], device, node))
            x[n++] = e;
    /* runs "3-9", strided runs of three or more "37,39,...,383" (experts dealt over nodes), single experts */
    for (uint32_t i = 0; i < n && groups < MAX_GROUPS; groups++) {
        uint32_t j = i;
        while (j + 1 < n && x[j + 1] == x[j] + 1)
            j++;
        const char *sep = i ? "," : "";
        if (j > i) {
            fprintf(f, "%s%u-%u", sep, x[i], x[j]);
        } else if (i + 2 < n && x[i + 2] - x[i + 1] == x[i + 1] - x[i]) {
            for (j = i + 2; j + 1 < n && x[j + 1] - x[j] == x[i + 1] - x[i];)
                j++;
            fprintf(f, j == i + 2 ? "%s%u,%u,%u" : "%s%u,%u,...,%u", sep, x[i], x[i + 1], x[j]);
        } else {
            fprintf(f, "%s%u", sep, x[i]);
        }
        i = j + 1;
        if (groups + 1 == MAX_GROUPS && i < n)
            fprintf(f, ",...");
    }
    fprintf(f, "%s (%u)", n ? "" : "none", n);
    free(x);
}

/* Layers a and b hold the same experts at the same places (replicas and slicing too). */
static bool same_homes(const struct kt_placement_layer *a, const struct kt_placement_layer *b, uint32_t n_expert)
{
    if (a->cpu_sliced != b->cpu_sliced)
        return false;
    for (uint32_t x = 0; x < n_expert; x++)
        if (a->experts[x].device != b->experts[x].device || a->experts[x].node != b->experts[x].node ||
            a->experts[x].replica_nodes != b->experts[x].replica_nodes)
            return false;
    return true;
}

void kt_tool_print_layer_homes(FILE *f, const struct kt_placement *p)
{
    for (uint32_t il = 0; il < p->n_layer; il++) {
        const struct kt_placement_layer *L = &p->layers[il];
        if (!L->is_moe || !L->experts)
            continue;
        uint32_t last = il;
        while (last + 1 < p->n_layer && p->layers[last + 1].is_moe && p->layers[last + 1].experts &&
               same_homes(L, &p->layers[last + 1], p->n_expert))
            last++;
        fprintf(f, last == il ? "  layer %u:" : "  layers %u-%u:", il, last);
        bool any = false;
        for (int d = 1; d < p->n_devices; d++) {
            bool here = false;
            for (uint32_t x = 0; x < p->n_expert && !here; x++)
                here = L->experts[x].device == d;
            if (!here)
                continue;
            fprintf(f, "%s %s ", any ? ";" : "", p->devices[d].name);
            kt_tool_print_homes(f, p, il, d, -1);
            any = true;
        }
        uint32_t replicated = 0;
        for (int n = 0; n < p->n_nodes; n++) {
            bool here = false;
            for (uint32_t x = 0; x < p->n_expert; x++) {
                here = here || at_place(&L->experts[x], 0, n);
                replicated += n == 0 && L->experts[x].replica_nodes != 0;
            }
            if (!here)
                continue;
            fprintf(f, "%s node %d ", any ? ";" : "", n);
            kt_tool_print_homes(f, p, il, 0, n);
            any = true;
        }
        if (L->cpu_sliced)
            fprintf(f, "; the CPU's experts row-sliced over every expert node");
        if (replicated)
            fprintf(f, "; %u replicated", replicated);
        fputc('\n', f);
        il = last;
    }
}

static double gib(uint64_t bytes)
{
    return (double)bytes / (1024.0 * 1024.0 * 1024.0);
}

/* Device d's bytes, with the engine's own KV pool (ep->kv_blocks) in place of the placement's estimate
 * (kv_cache.tokens) where attention, so the pool, is there. */
static uint64_t device_bytes(const struct kt_model *m, const struct kt_placement *p, const struct kt_engine_params *ep,
                             int d)
{
    const struct kt_placement_device *dev = &p->devices[d];
    if (!ep->device || !ep->attention_on_device || p->layers[0].attention != d)
        return dev->bytes;
    struct kt_engine_params host = *ep;
    host.device = NULL;
    host.attention_on_device = false;
    return dev->bytes - dev->part_bytes[KT_PART_KV_CACHE] + kt_engine_host_bytes(m, &host).kv_cache;
}

/* The host memory the plan needs, by part (kt_tool_placement_fits). */
struct host_need {
    uint64_t experts, sim, displaced, kv, packed, converted;
};

static struct host_need host_need(const struct kt_model *m, const struct kt_placement *p,
                                  const struct kt_engine_params *ep)
{
    const struct kt_placement_device *cpu = &p->devices[0];
    const struct kt_engine_host_bytes engine = kt_engine_host_bytes(m, ep); /* the engine's own, as it allocates */
    struct host_need h = {.experts = cpu->part_bytes[KT_PART_ROUTED_EXPERTS] + cpu->part_bytes[KT_PART_REPLICAS],
                          .kv = engine.kv_cache, .packed = engine.packed,
                          .converted = kt_model_converted_bytes(m)}; /* a checkpoint's, in memory of their own */
    for (int d = 1; d < p->n_devices; d++) {
        const struct kt_placement_device *dev = &p->devices[d];
        if (dev->backend == KT_PLACE_SIM)
            h.sim += device_bytes(m, p, ep, d); /* the sim's memory is the host's */
        else if (dev->backend == KT_PLACE_CUDA && !ep->device)
            h.displaced += dev->part_bytes[KT_PART_ROUTED_EXPERTS]; /* no GPU: its experts run on node 0 */
    }
    return h;
}

bool kt_tool_placement_fits(FILE *f, const struct kt_model *m, const struct kt_placement *p,
                            const struct kt_engine_params *ep, kt_err *why)
{
    const struct host_need h = host_need(m, p, ep);
    const uint64_t experts = h.experts, sim = h.sim, displaced = h.displaced, kv = h.kv, packed = h.packed;
    bool fits = true;
    fprintf(f, "memory this plan needs\n");
    for (int n = 0; n < p->n_nodes; n++)
        if (p->node_bytes[n] || (p->expert_nodes >> n & 1))
            fprintf(f, "  node %-12d %9.3f GiB  routed experts (%u homed here, replicas included in the bytes)\n", n,
                    gib(p->node_bytes[n]), p->node_experts[n]);
    for (int d = 1; d < p->n_devices; d++) {
        const struct kt_placement_device *dev = &p->devices[d];
        const uint64_t bytes = device_bytes(m, p, ep, d);
        fprintf(f, "  %-17s %9.3f GiB  of its %.3f GiB budget (%s%s)\n", dev->name, gib(bytes),
                gib(dev->budget_bytes), kt_place_backend_name(dev->backend),
                bytes != dev->bytes ? "; the KV pool as the engine makes it" : "");
        if (dev->backend == KT_PLACE_CUDA && ep->device) {
            size_t free_bytes = 0, total = 0;
            kt_err e = {0};
            if (kt_cuda_mem_info(&free_bytes, &total, &e) != KT_OK) {
                fprintf(f, "  %s: its free memory cannot be read (%s)\n", dev->name, e.msg);
            } else if (bytes > free_bytes) {
                fits = false;
                kt_err_set(why, KT_ERR_NOMEM, "'%s' needs %.2f GiB but the GPU has %.2f GiB free of %.2f: lower its "
                                              "memory_gib or its experts in the placement",
                           dev->name, gib(bytes), gib(free_bytes), gib(total));
            }
        }
    }
    const uint64_t converted = h.converted;
    const uint64_t host = experts + sim + displaced + kv + packed + converted;
    fprintf(f, "  %-17s %9.3f GiB  routed experts and replicas %.3f, sim memory %.3f, a GPU's experts without one "
               "%.3f, KV cache %.3f, host matrices packed %.3f, converted from a checkpoint %.3f (weights read in "
               "place from the file are not counted)\n",
            "host in all", gib(host), gib(experts), gib(sim), gib(displaced), gib(kv), gib(packed), gib(converted));
    kt_err e = {0};
    if (fits && kt_meminfo_check(NULL, "this plan", host, &e) != KT_OK) {
        fits = false;
        if (e.status == KT_ERR_NOMEM)
            kt_err_set(why, e.status, "%s, or place more experts on a device", e.msg);
        else
            *why = e;
    }
    if (fits)
        fprintf(f, "fits this machine: yes (%.3f GiB + %.3f GiB margin of host memory is available: the loader's "
                   "check)\n",
                gib(host), gib(kt_meminfo_margin_bytes(host)));
    else
        fprintf(f, "fits this machine: no: %s\n", why->msg);
    return fits;
}

/* ---- the KV pool and the context, from memory ------------------------------------------------------ */

static double mib(uint64_t bytes)
{
    return (double)bytes / (1024.0 * 1024.0);
}

kt_status kt_tool_kv_pool_size(const struct kt_model *m, const struct kt_placement *p,
                               const struct kt_engine_params *ep, const struct kt_tool_kv_request *rq,
                               struct kt_tool_kv_pool *out, kt_err *err)
{
    memset(out, 0, sizeof *out);
    const uint32_t bt = rq->block_tokens ? rq->block_tokens : 16;
    const uint32_t train = m->hp.n_ctx_train;
    const uint32_t model_ctx = !train ? KT_TOOL_DEFAULT_CTX : train < KT_TOOL_MAX_CTX ? train : KT_TOOL_MAX_CTX;
    const uint32_t want_ctx = rq->ctx ? rq->ctx : model_ctx;
    const uint32_t max_seqs = rq->max_seqs ? rq->max_seqs : 1;
    /* one block's bytes as the engine stores rows (kt_engine_host_bytes counts a host pool) */
    struct kt_engine_params probe = *ep;
    probe.device = NULL;
    probe.attention_on_device = false;
    probe.kv_block_tokens = bt, probe.kv_blocks = 1, probe.n_ctx = bt, probe.max_seqs = 1;
    const uint64_t block_bytes = kt_engine_host_bytes(m, &probe).kv_cache;
    if (!block_bytes)
        return kt_err_set(err, KT_ERR_INVALID, "KV cache: a block of %u positions has no bytes", bt);
    out->block_tokens = bt;
    out->bytes_per_token = block_bytes / bt;
    out->on_device = ep->device && ep->attention_on_device;
    /* the most the pool is worth: max_seqs sequences at the full context never preempt */
    const uint64_t worth_blocks = (uint64_t)max_seqs * ((want_ctx + bt - 1) / bt);
    uint64_t blocks;
    const char *whence;
    char room_text[160] = "";
    if (rq->kv_memory_mib > 0) {
        blocks = (uint64_t)(rq->kv_memory_mib * 1048576.0) / block_bytes;
        whence = "--kv-memory";
        if (blocks == 0)
            return kt_err_set(err, KT_ERR_INVALID, "--kv-memory %g MiB holds no KV block (a block of %u positions "
                                                   "takes %.3f MiB): give at least %.3f",
                              rq->kv_memory_mib, bt, mib(block_bytes), mib(block_bytes));
    } else {
        uint64_t room = 0;
        if (out->on_device) {
            /* what the attention device's budget leaves once its weights and working buffers are in */
            const int d = p->layers[0].attention;
            const struct kt_placement_device *dev = &p->devices[d > 0 && d < p->n_devices ? d : 0];
            struct kt_engine_params wp = *ep;
            wp.n_ctx = want_ctx;
            const uint64_t held = dev->bytes - dev->part_bytes[KT_PART_KV_CACHE] - dev->part_bytes[KT_PART_WORK_BUFFERS] +
                                  kt_engine_device_work_bytes(m, &wp, dev->backend == KT_PLACE_CUDA);
            room = dev->budget_bytes > held ? (dev->budget_bytes - held) / 10 * 9 : 0;
            whence = "9/10 of what the attention device's budget leaves";
            snprintf(room_text, sizeof room_text, "; '%s' budget %.1f MiB, its weights and buffers %.1f MiB",
                     dev->name, mib(dev->budget_bytes), mib(held));
            if (!dev->budget_bytes) { /* an unbudgeted device: as much as the worst case wants */
                room = worth_blocks * block_bytes;
                whence = "max-seqs x ctx (the device has no budget)";
                room_text[0] = 0;
            }
        } else {
            /* half of what the host can still give once everything else of the plan is in */
            const struct host_need h = host_need(m, p, ep);
            const uint64_t other = h.experts + h.sim + h.displaced + h.packed + h.converted;
            struct kt_meminfo mi;
            kt_err e = {0};
            if (kt_meminfo_read(NULL, &mi, &e) != KT_OK)
                return kt_err_set(err, e.status, "KV cache: how much memory is free cannot be read (%s): give "
                                                 "--kv-memory MiB", e.msg);
            const uint64_t held = other + kt_meminfo_margin_bytes(other);
            room = mi.available_bytes > held ? (mi.available_bytes - held) / 2 : 0;
            whence = "half of the host memory free beyond the plan's";
            snprintf(room_text, sizeof room_text, "; %.1f MiB available, the plan's other needs and margin %.1f MiB",
                     mib(mi.available_bytes), mib(held));
        }
        blocks = room / block_bytes;
        if (blocks >= worth_blocks) {
            blocks = worth_blocks;
            whence = "max-seqs x ctx: no preemption needed";
        }
        /* too little left: one sequence at the old default context, and the memory check that follows (the
         * loader's, kt_tool_placement_fits) says what does not fit */
        const uint32_t floor_ctx = want_ctx < KT_TOOL_DEFAULT_CTX ? want_ctx : KT_TOOL_DEFAULT_CTX;
        const uint64_t floor_blocks = (floor_ctx + bt - 1) / bt;
        if (blocks < floor_blocks) {
            blocks = floor_blocks < worth_blocks ? floor_blocks : worth_blocks;
            whence = "memory is short: one sequence at the default context";
        }
    }
    if (blocks > UINT32_MAX / bt)
        blocks = UINT32_MAX / bt;
    out->n_blocks = (uint32_t)blocks;
    out->bytes = blocks * block_bytes;
    const uint64_t positions = blocks * bt;
    int n = snprintf(out->line, sizeof out->line, "KV cache: %.1f MiB %s (%s%s): %u blocks of %u positions, %llu "
                                                  "positions at %llu bytes each; ",
                     mib(out->bytes), out->on_device ? "on the attention device" : "on the host", whence, room_text,
                     out->n_blocks, bt, (unsigned long long)positions, (unsigned long long)out->bytes_per_token);
    size_t at = n > 0 && (size_t)n < sizeof out->line ? (size_t)n : sizeof out->line - 1;
    if (rq->ctx) {
        out->n_ctx = rq->ctx;
        if (positions < rq->ctx)
            snprintf(out->line + at, sizeof out->line - at, "--ctx %u is more than the pool holds: a prompt longer "
                                                           "than %llu tokens is refused, a sequence stops there",
                     rq->ctx, (unsigned long long)positions);
        else
            snprintf(out->line + at, sizeof out->line - at, "--ctx %u", rq->ctx);
    } else if (positions >= model_ctx) {
        out->n_ctx = model_ctx;
        snprintf(out->line + at, sizeof out->line - at, "--ctx %u (%s)", model_ctx,
                 train ? "the model's context_length" : "the model states none");
    } else {
        out->n_ctx = (uint32_t)(positions / bt * bt);
        snprintf(out->line + at, sizeof out->line - at, "--ctx %u, the largest one sequence fits in the pool (the "
                                                       "model's context_length %u needs %.1f MiB: give --kv-memory "
                                                       "for it)",
                 out->n_ctx, model_ctx, mib((uint64_t)((model_ctx + bt - 1) / bt) * block_bytes));
    }
    return KT_OK;
}
