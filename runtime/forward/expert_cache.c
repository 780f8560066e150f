/*
 * expert_cache.c - the decode-time expert cache on the device (engine.h,
 * kt_engine_expert_cache_start): beside the experts a placement homes on
 * the device, a pool of slots per MoE layer holds copies of the experts the
 * last steps routed to, chosen by LRU or LFU.
 *
 * How a step meets it, per MoE layer (moe.c calls in this order):
 *   kt_cache_route   - counts the step's pairs as pinned / hit / miss, updates
 *                      recency and frequency, and when no slot of the layer
 *                      is loading, gives the most wanted missed expert a slot
 *                      (an empty one, or the least recently / frequently used
 *                      ready one the step does not route to);
 *   kt_cache_copy    - after the device's units are queued and before the
 *                      CPU's run: queues the next chunk of the loading slot's
 *                      copy, at most the layer's byte budget; once the last
 *                      chunk is queued the expert is live, and the next step
 *                      runs it there (the queue is in order, so it reads the
 *                      whole copy);
 *   kt_cache_measure - after the layer's sync: the CPU part's time minus the
 *                      device's busy time (copies included) is the link's
 *                      spare time in this layer; the next budget is this
 *                      chunk plus that time's worth of bytes (less when the
 *                      step waited), so uploads ride in the device's idle
 *                      time and the CPU computes every miss meanwhile.
 * An evicted slot was not routed this step and every earlier step synced,
 * so nothing reads it while its next copy lands.  The cache never changes a
 * result: the device computes each expert as the CPU does (sim: bit for bit;
 * cuda: within test_hybrid_sim's tolerance).
 */
#include <stdlib.h>
#include <string.h>

#include "forward.h"

#define SEGMENT_ALIGN 256                /* each matrix of a slot starts aligned for the kernels */
#define MIN_CHUNK_BYTES (16u << 10)      /* smaller chunks are not worth a copy's latency */
#define SPARE_USE 0.9                    /* of the measured spare time, what the next chunk may take */
#define LFU_DECAY 0.95f                  /* per step a layer is routed */

struct cache_slot {
    uint32_t expert;                     /* UINT32_MAX: empty */
    uint64_t loaded;                     /* bytes of it queued so far */
    bool ready;                          /* all queued: the expert runs here */
    int64_t rows[3];                     /* a checkpoint's: rows of gate, up, down read into the layer's host */
};

struct cache_layer {
    uint8_t *mem;                        /* device memory: slots * slot_bytes */
    uint64_t slot_bytes;
    uint64_t seg_offset[3], seg_bytes[3]; /* gate, up, down within a slot */
    struct cache_slot *slots;            /* [slots] */
    int32_t *slot_of;                    /* [Ne] the slot holding (or loading) expert x; -1: none */
    uint64_t *last_used;                 /* [Ne] the step that last routed to it (LRU) */
    float *freq;                         /* [Ne] decayed routed pairs (LFU) */
    int32_t loading;                     /* the slot being copied; -1: none */
    uint32_t copied;                     /* the expert whose last chunk this step queued (its file pages go
                                            after the layer's sync); UINT32_MAX: none */
    /* a checkpoint's experts are never in memory whole: the one loading is
     * read (converted) here first, [gate | up | down] at seg_offset; made at
     * the layer's first load and reused, since a load starts only in a step
     * after the last one's copies finished */
    uint8_t *host;
    uint64_t budget_bytes;               /* what the next chunk may copy */
    uint64_t chunk_bytes;                /* what this step's chunk copied */
    struct kt_expert_cache_stats stats;
};

struct kt_expert_cache {
    struct kt_expert_cache_params p;
    struct cache_layer *layers;          /* [n_layer]; slots NULL in dense layers */
    uint32_t first_moe;                  /* the first MoE layer: each step meets it first */
    uint64_t step;                       /* steps the cache has seen */
    uint8_t *staging;                    /* cuda: a host buffer page-locked for the copies; NULL: sim */
    uint64_t staging_bytes;
    bool staging_pinned;
};

static uint64_t align_up(uint64_t n)
{
    return (n + SEGMENT_ALIGN - 1) / SEGMENT_ALIGN * SEGMENT_ALIGN;
}

void kt_cache_destroy(struct kt_engine *e)
{
    struct kt_expert_cache *c = e->dev.cache;
    if (!c)
        return;
    kt_backend_sync(e->dev.backend);
    for (uint32_t il = 0; c->layers && il < e->hp.n_layer; il++) {
        struct cache_layer *cl = &c->layers[il];
        if (cl->slots)
            for (uint32_t s = 0; s < c->p.slots_per_layer; s++)
                if (cl->slots[s].ready)
                    memset(&e->dev.experts[(size_t)il * e->hp.n_expert + cl->slots[s].expert], 0,
                           sizeof *e->dev.experts);
        if (cl->mem)
            kt_backend_free(e->dev.backend, cl->mem, (size_t)(cl->slot_bytes * c->p.slots_per_layer));
        free(cl->slots);
        free(cl->host);
        free(cl->slot_of);
        free(cl->last_used);
        free(cl->freq);
    }
    if (c->staging_pinned)
        kt_backend_unpin_host(e->dev.backend, c->staging);
    free(c->staging);
    free(c->layers);
    free(c);
    e->dev.cache = NULL;
}

kt_status kt_engine_expert_cache_start(struct kt_engine *e, const struct kt_expert_cache_params *p, kt_err *err)
{
    if (!e->dev.backend)
        return kt_err_set(err, KT_ERR_UNSUPPORTED, "expert cache: this engine has no device");
    if (e->dev.cache)
        return kt_err_set(err, KT_ERR_INVALID, "expert cache: already started");
    if (p->slots_per_layer == 0 || p->slots_per_layer > e->hp.n_expert)
        return kt_err_set(err, KT_ERR_INVALID, "expert cache: %u slots per layer (1 .. %u, the experts per layer)",
                          p->slots_per_layer, e->hp.n_expert);
    if (p->policy != KT_EXPERT_CACHE_LRU && p->policy != KT_EXPERT_CACHE_LFU)
        return kt_err_set(err, KT_ERR_INVALID, "expert cache: unknown policy %d", (int)p->policy);
    const uint32_t Ne = e->hp.n_expert, S = p->slots_per_layer;
    struct kt_expert_cache *c = calloc(1, sizeof *c);
    if (!c || !(c->layers = calloc(e->hp.n_layer, sizeof *c->layers))) {
        free(c);
        return kt_err_set(err, KT_ERR_NOMEM, "expert cache: out of memory");
    }
    c->p = *p;
    e->dev.cache = c;
    kt_status st = KT_OK;
    uint64_t largest = 0, need = 0;
    c->first_moe = UINT32_MAX;
    for (uint32_t il = 0; il < e->hp.n_layer && st == KT_OK; il++) {
        if (!e->layers[il].is_moe)
            continue;
        if (c->first_moe == UINT32_MAX)
            c->first_moe = il;
        struct cache_layer *cl = &c->layers[il];
        const struct kt_ffn_weights w = kt_fwd_expert_gguf(e, &e->layers[il], 0);
        const struct kt_mat *m[3] = {&w.gate, &w.up, &w.down};
        for (int i = 0; i < 3; i++) {
            const struct kt_cuda_mat cm = kt_fwd_cuda_mat(m[i]);
            if (kt_backend_kind(e->dev.backend) == KT_BACKEND_CUDA &&
                (st = kt_cuda_mat_usable(&cm, kt_type_name(m[i]->type), err)) != KT_OK)
                break;
            cl->seg_offset[i] = cl->slot_bytes;
            cl->seg_bytes[i] = kt_mat_bytes(m[i]);
            cl->slot_bytes += align_up(cl->seg_bytes[i]);
        }
        if (st != KT_OK)
            break;
        largest = cl->slot_bytes > largest ? cl->slot_bytes : largest;
        cl->slots = calloc(S, sizeof *cl->slots);
        cl->slot_of = malloc(Ne * sizeof *cl->slot_of);
        cl->last_used = calloc(Ne, sizeof *cl->last_used);
        cl->freq = calloc(Ne, sizeof *cl->freq);
        if (!cl->slots || !cl->slot_of || !cl->last_used || !cl->freq) {
            st = kt_err_set(err, KT_ERR_NOMEM, "expert cache: out of memory");
            break;
        }
        for (uint32_t s = 0; s < S; s++)
            cl->slots[s].expert = UINT32_MAX;
        for (uint32_t x = 0; x < Ne; x++)
            cl->slot_of[x] = -1;
        cl->loading = -1;
        cl->copied = UINT32_MAX;
        cl->stats.slots = S;
        need += cl->slot_bytes * S;
    }
    /* the whole need against what the budget has left, before taking any of it */
    const uint64_t budget = kt_backend_budget_bytes(e->dev.backend), used = kt_backend_used_bytes(e->dev.backend);
    if (st == KT_OK && budget && need > budget - used)
        st = kt_err_set(err, KT_ERR_NOMEM,
                        "expert cache: %u slots per layer need %.1f MiB of device '%s', which has %.1f MiB free "
                        "(of %.1f MiB): fewer slots, or fewer experts homed there",
                        S, (double)need / (1 << 20), kt_backend_name(e->dev.backend),
                        (double)(budget - used) / (1 << 20), (double)budget / (1 << 20));
    for (uint32_t il = 0; il < e->hp.n_layer && st == KT_OK; il++)
        if (c->layers[il].slots)
            st = kt_backend_alloc(e->dev.backend, (size_t)(c->layers[il].slot_bytes * S), (void **)&c->layers[il].mem,
                                  err);
    if (st == KT_OK && kt_backend_kind(e->dev.backend) == KT_BACKEND_CUDA) {
        /* the file's pages are pageable: a copy from them would hold the host */
        c->staging_bytes = largest;
        if (!(c->staging = aligned_alloc(4096, (size_t)align_up(largest + 4095) / 4096 * 4096)))
            st = kt_err_set(err, KT_ERR_NOMEM, "expert cache: out of memory");
        else
            c->staging_pinned = kt_backend_pin_host(e->dev.backend, c->staging, (size_t)largest);
    }
    if (st != KT_OK)
        kt_cache_destroy(e);
    return st;
}

/* Slot s of layer il gives up its expert (live or loading). */
static void evict(struct kt_engine *e, uint32_t il, int32_t s)
{
    struct cache_layer *cl = &e->dev.cache->layers[il];
    struct cache_slot *slot = &cl->slots[s];
    if (slot->expert == UINT32_MAX)
        return;
    if (slot->ready) {
        memset(&e->dev.experts[(size_t)il * e->hp.n_expert + slot->expert], 0, sizeof *e->dev.experts);
        cl->stats.resident--;
        cl->stats.evictions++;
    }
    if (cl->loading == s)
        cl->loading = -1;
    cl->slot_of[slot->expert] = -1;
    *slot = (struct cache_slot){.expert = UINT32_MAX};
}

bool kt_cache_holds(const struct kt_engine *e, uint32_t il, uint32_t x)
{
    const struct kt_expert_cache *c = e->dev.cache;
    return c && c->layers[il].slots && c->layers[il].slot_of[x] >= 0;
}

void kt_cache_forget(struct kt_engine *e, uint32_t il, uint32_t x)
{
    if (kt_cache_holds(e, il, x))
        evict(e, il, e->dev.cache->layers[il].slot_of[x]);
}

/* The slot a new expert takes: an empty one, else the ready one least worth
 * keeping that this step does not route to (LFU: only one less wanted than
 * `want`); -1: none. */
static int32_t victim(const struct kt_engine *e, const struct cache_layer *cl, uint64_t step, float want)
{
    const struct kt_expert_cache *c = e->dev.cache;
    int32_t best = -1;
    for (uint32_t s = 0; s < c->p.slots_per_layer; s++) {
        const struct cache_slot *slot = &cl->slots[s];
        if (slot->expert == UINT32_MAX)
            return (int32_t)s;
        if (!slot->ready || cl->last_used[slot->expert] == step)
            continue;
        if (c->p.policy == KT_EXPERT_CACHE_LFU ? cl->freq[slot->expert] >= want : false)
            continue;
        if (best < 0 ||
            (c->p.policy == KT_EXPERT_CACHE_LFU
                 ? cl->freq[slot->expert] < cl->freq[cl->slots[best].expert]
                 : cl->last_used[slot->expert] < cl->last_used[cl->slots[best].expert]))
            best = (int32_t)s;
    }
    return best;
}

void kt_cache_route(struct kt_engine *e, uint32_t il)
{
    struct kt_expert_cache *c = e->dev.cache;
    struct cache_layer *cl = &c->layers[il];
    const uint32_t Ne = e->hp.n_expert;
    c->step += il == c->first_moe; /* the step's first MoE layer advances the clock */
    const uint64_t step = c->step;

    uint32_t want = UINT32_MAX;
    float want_score = 0;
    for (uint32_t x = 0; x < Ne; x++) {
        const uint32_t n = e->expert_pairs[x];
        if (c->p.policy == KT_EXPERT_CACHE_LFU)
            cl->freq[x] = cl->freq[x] * LFU_DECAY + (float)n;
        if (!n)
            continue;
        cl->last_used[x] = step;
        const int32_t s = cl->slot_of[x];
        if (s >= 0 && cl->slots[s].ready) {
            cl->stats.hit_pairs += n;
        } else if (kt_fwd_expert_on_device(e, il, x)) {
            cl->stats.pinned_pairs += n;
        } else {
            cl->stats.miss_pairs += n;
            const float score = c->p.policy == KT_EXPERT_CACHE_LFU ? cl->freq[x] : (float)n;
            if (s < 0 && (want == UINT32_MAX || score > want_score))
                want = x, want_score = score;
        }
    }
    if (cl->loading >= 0 || want == UINT32_MAX)
        return;
    const int32_t s = victim(e, cl, step, want_score);
    if (s < 0)
        return;
    evict(e, il, s);
    cl->slots[s] = (struct cache_slot){.expert = want};
    cl->slot_of[want] = s;
    cl->loading = s;
    /* the file's pages of all three matrices read ahead now, while the first chunks copy: the later chunks
     * find them in memory instead of faulting them in from disk inside a step */
    const struct kt_layer *t = &e->model->layers[il];
    const struct kt_gguf_tensor *slabs[3] = {t->ffn_gate_exps, t->ffn_up_exps, t->ffn_down_exps};
    for (int i = 0; i < 3; i++)
        kt_model_expert_advise(e->model, slabs[i], want, KT_EXPERT_WILL_NEED);
}

/* A checkpoint's expert, converted into cl->host as its chunks need it:
 * bytes [0, end) of segment i (and the rest of the row end falls in), the
 * rows already converted counted in slot->rows[i].  False (the slot
 * emptied) when it cannot be read. */
static bool read_streamed(struct kt_engine *e, uint32_t il, struct cache_layer *cl, struct cache_slot *slot, int i,
                          uint64_t end)
{
    const struct kt_layer *t = &e->model->layers[il];
    const struct kt_gguf_tensor *slabs[3] = {t->ffn_gate_exps, t->ffn_up_exps, t->ffn_down_exps};
    const struct kt_gguf_tensor *slab = slabs[i];
    bool ok = slab != NULL;
    if (ok && !cl->host)
        ok = (cl->host = malloc((size_t)cl->slot_bytes)) != NULL;
    if (ok) {
        const uint64_t row = kt_type_row_bytes(slab->type, slab->ne[0]);
        const int64_t want = (int64_t)((end + row - 1) / row); /* rows covering [0, end) */
        kt_err err = {0};
        if (want > slot->rows[i])
            ok = kt_model_read_expert_rows(e->model, slab, slot->expert, slot->rows[i], want - slot->rows[i],
                                           cl->host + cl->seg_offset[i] + (uint64_t)slot->rows[i] * row,
                                           &err) == KT_OK;
        if (ok && want > slot->rows[i])
            slot->rows[i] = want;
    }
    if (!ok)
        evict(e, il, cl->loading);
    return ok;
}

void kt_cache_copy(struct kt_engine *e, uint32_t il)
{
    struct kt_expert_cache *c = e->dev.cache;
    struct cache_layer *cl = &c->layers[il];
    cl->chunk_bytes = 0;
    if (cl->loading < 0)
        return;
    struct cache_slot *slot = &cl->slots[cl->loading];
    const uint64_t total = cl->seg_bytes[0] + cl->seg_bytes[1] + cl->seg_bytes[2];
    uint64_t n = total - slot->loaded;
    if (n > cl->budget_bytes && !e->test.expert_cache_unthrottled)
        n = cl->budget_bytes;
    if (n < MIN_CHUNK_BYTES && n < total - slot->loaded)
        return; /* no spare time measured yet, or too little of it */
    const struct kt_ffn_weights w = kt_fwd_expert_gguf(e, &e->layers[il], slot->expert);
    const bool streamed = kt_model_experts_streamed(e->model);
    const uint8_t *src[3] = {w.gate.data, w.up.data, w.down.data};
    if (streamed)
        for (int i = 0; i < 3; i++)
            src[i] = cl->host ? cl->host + cl->seg_offset[i] : NULL; /* made at the first read_streamed */
    uint8_t *const base = cl->mem + (uint64_t)cl->loading * cl->slot_bytes;
    /* [slot->loaded, end) of the three segments laid end to end */
    const uint64_t end = slot->loaded + n;
    uint64_t at = slot->loaded, staged = 0, seg_start = 0;
    for (int i = 0; i < 3; seg_start += cl->seg_bytes[i], i++) {
        const uint64_t seg_end = seg_start + cl->seg_bytes[i];
        if (at >= end || at >= seg_end)
            continue;
        const uint64_t off = at - seg_start, len = (end < seg_end ? end : seg_end) - at;
        if (streamed && !read_streamed(e, il, cl, slot, i, off + len))
            return; /* the slot was given up; the expert keeps running where it is */
        if (streamed)
            src[i] = cl->host + cl->seg_offset[i];
        const void *from = src[i] + off;
        if (c->staging) { /* cuda: from page-locked memory, so the copy is asynchronous */
            memcpy(c->staging + staged, from, (size_t)len);
            from = c->staging + staged;
            staged += len;
        }
        kt_backend_copy_in(e->dev.backend, base + cl->seg_offset[i] + off, from, (size_t)len);
        at += len;
    }
    slot->loaded += n;
    cl->chunk_bytes = n;
    cl->stats.chunks++;
    cl->stats.upload_bytes += n;
    if (slot->loaded == total) { /* the next step's units, queued after these copies, run it here */
        struct kt_ffn_weights live = w;
        live.gate.data = base + cl->seg_offset[0];
        live.up.data = base + cl->seg_offset[1];
        live.down.data = base + cl->seg_offset[2];
        e->dev.experts[(size_t)il * e->hp.n_expert + slot->expert] = live;
        slot->ready = true;
        cl->loading = -1;
        cl->copied = slot->expert;
        cl->stats.uploads++;
        cl->stats.resident++;
    }
}

void kt_cache_measure(struct kt_engine *e, uint32_t il, uint64_t cpu_ns, uint64_t device_ns)
{
    struct cache_layer *cl = &e->dev.cache->layers[il];
    if (cl->copied != UINT32_MAX) { /* the queue has run its copies: the file's pages can go */
        const struct kt_layer *t = &e->model->layers[il];
        const struct kt_gguf_tensor *slabs[3] = {t->ffn_gate_exps, t->ffn_up_exps, t->ffn_down_exps};
        for (int i = 0; i < 3; i++)
            kt_model_expert_advise(e->model, slabs[i], cl->copied, KT_EXPERT_DONE);
        cl->copied = UINT32_MAX;
    }
    /* the link's rate for large copies (not the small per-step copies, whose
     * latency dominates); none known yet: copy a whole slot, which measures it */
    const double bytes_per_ns = kt_backend_link_bytes_per_ns(e->dev.backend);
    double next = (double)cl->chunk_bytes;
    if (bytes_per_ns > 0 && e->test.expert_cache_idle_ns)
        next = (double)e->test.expert_cache_idle_ns * bytes_per_ns * SPARE_USE;
    else if (bytes_per_ns > 0)
        next += ((double)cpu_ns - (double)device_ns) * bytes_per_ns * SPARE_USE;
    else
        next = (double)cl->slot_bytes;
    cl->budget_bytes = next <= 0 ? 0 : next >= (double)cl->slot_bytes ? cl->slot_bytes : (uint64_t)next;
}

bool kt_engine_expert_cache_stats(const struct kt_engine *e, int il, struct kt_expert_cache_stats *out)
{
    const struct kt_expert_cache *c = e->dev.cache;
    memset(out, 0, sizeof *out);
    if (!c || il >= (int)e->hp.n_layer)
        return false;
    for (uint32_t j = il < 0 ? 0 : (uint32_t)il; j < (il < 0 ? e->hp.n_layer : (uint32_t)il + 1); j++) {
        const struct kt_expert_cache_stats *s = &c->layers[j].stats;
        out->pinned_pairs += s->pinned_pairs;
        out->hit_pairs += s->hit_pairs;
        out->miss_pairs += s->miss_pairs;
        out->uploads += s->uploads;
        out->upload_bytes += s->upload_bytes;
        out->chunks += s->chunks;
        out->evictions += s->evictions;
        out->slots += s->slots;
        out->resident += s->resident;
        out->device_bytes += c->layers[j].slot_bytes * s->slots;
    }
    return true;
}

void kt_cache_stats_reset(struct kt_engine *e)
{
    struct kt_expert_cache *c = e->dev.cache;
    for (uint32_t il = 0; c && il < e->hp.n_layer; il++) {
        struct kt_expert_cache_stats *s = &c->layers[il].stats;
        *s = (struct kt_expert_cache_stats){.slots = s->slots, .resident = s->resident};
    }
}

bool kt_engine_expert_cached(const struct kt_engine *e, uint32_t il, uint32_t x)
{
    const struct kt_expert_cache *c = e->dev.cache;
    if (!c || il >= e->hp.n_layer || x >= e->hp.n_expert || !c->layers[il].slots)
        return false;
    const int32_t s = c->layers[il].slot_of[x];
    return s >= 0 && c->layers[il].slots[s].ready;
}

void kt_cache_flush(struct kt_engine *e)
{
    struct kt_expert_cache *c = e->dev.cache;
    for (uint32_t il = 0; c && il < e->hp.n_layer; il++)
        for (uint32_t s = 0; c->layers[il].slots && s < c->p.slots_per_layer; s++)
            evict(e, il, (int32_t)s);
}
