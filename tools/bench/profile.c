/*
 * profile.c - `kt-bench profile`: real prompts through the engine, prefill and
 * greedy decode, and the routing the engine counted written as a routing
 * profile (placement/profile.h) with the model's identity.
 *
 * Prompts: one per line of --prompts (tools/cli/prompts.h: text, or JSON chat
 * messages).  Each is rendered with the model's chat template (generation
 * prompt added), prefilled in chunks and decoded greedily for up to
 * --max-tokens new tokens (an end-of-generation token ends it sooner),
 * --batch prompts at once: a slot that finishes takes the next prompt at
 * once (continuous batching).
 * Every bad input (a missing file, a bad JSON line, no prompts, a model
 * without a chat template) is reported before the model is loaded where it
 * can be, and nothing is written then.  It drives the runtime and prints; it
 * computes no model math itself.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench.h"
#include "engine.h"
#include "placement_opt.h"
#include "preflight.h"
#include "prompts.h"
#include "svg.h"
#include "model.h"
#include "profile.h"
#include "tokenizer.h"

/* ---- the run ------------------------------------------------------------------------- */

/* A sequence slot of the batch. */
struct slot {
    const struct kt_tool_prompt *p; /* NULL: idle */
    uint32_t pos;               /* tokens in the engine's sequence */
    uint32_t generated;         /* new tokens chosen so far */
    int32_t next;               /* the token to decode next (when pos >= n_ids) */
};

struct progress {
    bool tty;
    double t0, last_draw;
};

static void draw(struct progress *pr, size_t done, size_t total, uint64_t tokens, bool final)
{
    double now = kt_bench_now_seconds();
    if (!pr->tty || (!final && now - pr->last_draw < 0.1))
        return;
    pr->last_draw = now;
    const int width = 30;
    int fill = total ? (int)(width * done / total) : width;
    fprintf(stderr, "\rprofile [%.*s%*s] %zu/%zu prompts, %llu tokens, %.1f tok/s%s", fill,
            "##############################", width - fill, "", done, total, (unsigned long long)tokens,
            tokens / (now - pr->t0 > 0 ? now - pr->t0 : 1), final ? "\n" : "");
    fflush(stderr);
}

/* Adds the engine's counts since the last call (last: the counts then) to prof. */
static void add_routing(struct kt_engine *e, struct kt_profile *prof, uint64_t *last[2], uint64_t last_tokens[2],
                        uint64_t *delta, size_t cells)
{
    for (int ph = 0; ph < 2; ph++) {
        uint64_t n = 0;
        const uint64_t *c = kt_engine_route_counts(e, ph, &n);
        if (n == last_tokens[ph])
            continue;
        for (size_t i = 0; i < cells; i++)
            delta[i] = c[i] - last[ph][i], last[ph][i] = c[i];
        kt_profile_add(prof, ph == KT_ROUTE_DECODE ? KT_PROFILE_DECODE : KT_PROFILE_PREFILL, delta,
                       n - last_tokens[ph]);
        last_tokens[ph] = n;
    }
}

/* The layers x experts heat map of routed tokens (both phases); layers
 * without routing (dense ones) have no value. */
static kt_status draw_heatmap(const struct kt_profile *p, const char *path, kt_err *err)
{
    const size_t cells = (size_t)p->n_layer * p->n_expert;
    double *v = malloc((cells ? cells : 1) * sizeof *v);
    if (!v)
        return kt_err_set(err, KT_ERR_NOMEM, "%s: out of memory", path);
    for (uint32_t il = 0; il < p->n_layer; il++) {
        double row = 0;
        for (uint32_t x = 0; x < p->n_expert; x++)
            row += v[(size_t)il * p->n_expert + x] = kt_profile_count(p, il, x);
        for (uint32_t x = 0; row == 0 && x < p->n_expert; x++)
            v[(size_t)il * p->n_expert + x] = NAN;
    }
    char title[256];
    snprintf(title, sizeof title, "%s: routed tokens per expert (%.0f prefill + %.0f decode tokens)",
             p->model.name[0] ? p->model.name : "model", p->tokens[KT_PROFILE_PREFILL], p->tokens[KT_PROFILE_DECODE]);
    kt_status st = kt_svg_heatmap(path, title, p->n_layer, p->n_expert, v, "layer %u", "expert", err);
    free(v);
    return st;
}

/* Share of a layer's routed tokens that went to its hottest eighth of experts. */
static double top_share(const struct kt_profile *p, uint32_t il)
{
    const uint32_t n = p->n_expert, top = n / 8 ? n / 8 : 1;
    double *v = malloc(n * sizeof *v), total = 0, hot = 0;
    if (!v)
        return 0;
    for (uint32_t x = 0; x < n; x++)
        total += v[x] = kt_profile_count(p, il, x);
    for (uint32_t t = 0; t < top; t++) { /* selection of the top counts; n is small */
        uint32_t best = t;
        for (uint32_t x = t + 1; x < n; x++)
            if (v[x] > v[best])
                best = x;
        double swap = v[t];
        v[t] = v[best], v[best] = swap;
        hot += v[t];
    }
    free(v);
    return total > 0 ? hot / total : 0;
}

/* Adds (sign +1) or takes away (-1) every layer's cache counters: around a
 * decode-only step, what it counted. */
static void cache_delta(const struct kt_engine *e, struct kt_expert_cache_stats *acc, int sign)
{
    for (uint32_t il = 0;; il++) { /* until il is past the last layer */
        struct kt_expert_cache_stats s;
        if (!kt_engine_expert_cache_stats(e, (int)il, &s))
            break;
        acc[il].pinned_pairs += (uint64_t)sign * s.pinned_pairs;
        acc[il].hit_pairs += (uint64_t)sign * s.hit_pairs;
        acc[il].miss_pairs += (uint64_t)sign * s.miss_pairs;
        acc[il].uploads += (uint64_t)sign * s.uploads;
        acc[il].upload_bytes += (uint64_t)sign * s.upload_bytes;
    }
}

/* The cache in decode: its hit rate per MoE layer (pairs of experts not homed
 * on the device found in a slot) and the accelerator's share with it. */
static void print_cache(const struct kt_engine *e, const struct kt_model *m, const struct kt_expert_cache_stats *dc,
                        const struct kt_bench_options *o)
{
    struct kt_expert_cache_stats all = {0}, now;
    kt_engine_expert_cache_stats(e, -1, &now);
    for (uint32_t il = 0; il < m->hp.n_layer; il++) {
        all.pinned_pairs += dc[il].pinned_pairs, all.hit_pairs += dc[il].hit_pairs;
        all.miss_pairs += dc[il].miss_pairs, all.uploads += dc[il].uploads;
        all.upload_bytes += dc[il].upload_bytes;
    }
    const double others = (double)(all.hit_pairs + all.miss_pairs);
    const double routed = others + (double)all.pinned_pairs;
    printf("expert cache (%s, %u slots per MoE layer, %.1f MiB of the device): decode hit rate %.2f%% of the pairs "
           "of experts not homed there; routed pairs on the accelerator with it, decode: %.2f%%; %llu uploads "
           "(%.1f MiB) in decode, %llu in all\n",
           o->expert_cache_lfu ? "lfu" : "lru", o->expert_cache_slots, (double)now.device_bytes / 1048576.0,
           others > 0 ? 100.0 * (double)all.hit_pairs / others : 0.0,
           routed > 0 ? 100.0 * (double)(all.pinned_pairs + all.hit_pairs) / routed : 0.0,
           (unsigned long long)all.uploads, (double)all.upload_bytes / 1048576.0, (unsigned long long)now.uploads);
    printf("expert cache hit rate per MoE layer, decode:");
    for (uint32_t il = 0; il < m->hp.n_layer; il++) {
        const double n = (double)(dc[il].hit_pairs + dc[il].miss_pairs);
        if (m->layers[il].is_moe)
            printf(" %u:%.1f%%", il, n > 0 ? 100.0 * (double)dc[il].hit_pairs / n : 0.0);
    }
    printf("\n");
}

int kt_bench_profile(const struct kt_bench_options *o)
{
    int rc = 1;
    kt_err err = {0};
    struct kt_tool_prompts set = {0};
    struct kt_model *m = NULL;
    struct kt_tokenizer *tok = NULL;
    struct kt_engine *e = NULL;
    struct kt_profile *prof = NULL;
    uint8_t *on_device = NULL;
    struct kt_expert_cache_stats *decode_cache = NULL; /* [n_layer] the cache's counters in decode-only steps */
    uint64_t decode_steps = 0, decode_tokens = 0;
    double decode_seconds = 0;
    struct slot *slots = NULL;
    struct kt_batch_token *batch = NULL;
    float *logits = NULL;
    uint64_t *last[2] = {NULL, NULL}, *delta = NULL, last_tokens[2] = {0, 0};
    uint32_t *row_slot = NULL; /* [batch] the slot of each logits row of a step */

    /* what can be checked without the model first (the output files: kt-bench.c): the prompts */
    if (kt_tool_prompts_read(o->prompts, &set, &err) != KT_OK)
        goto fail;
    if (kt_model_open(o->model, &m, &err) != KT_OK)
        goto fail;
    if (kt_tokenizer_create(m->gguf, &tok, &err) != KT_OK) {
        kt_err_prefix(&err, "%s", o->model);
        goto fail;
    }
    if (kt_tool_prompts_tokenize(m, tok, o->prompts, &set, &err) != KT_OK)
        goto fail;
    size_t longest = 0;
    for (size_t i = 0; i < set.n; i++)
        longest = set.items[i].n_ids > longest ? set.items[i].n_ids : longest;
    const uint64_t n_ctx = longest + o->max_tokens;
    if (kt_tool_check_positions("the longest prompt and --max-tokens", n_ctx, m, o->model,
                                "shorten the prompts or lower --max-tokens", &err) != KT_OK)
        goto fail;
    struct kt_engine_params ep = {.n_ctx = (uint32_t)n_ctx, .max_seqs = o->batch, .n_threads = o->threads,
                                  .kv_type = o->kv_type, .progress = isatty(2) ? stderr : NULL};
    struct kt_engine_plan plan = {0};
    if (o->placement && kt_tool_placement_apply(o->placement, m, &ep, &plan, &err) != KT_OK)
        goto fail;
    if (o->kv_type_given) /* --kv-type wins over the config's kv_cache.type */
        ep.kv_type = o->kv_type;
    /* which routed experts the accelerator holds, for the share of routed
     * pairs it served (the plan goes once the engine has copied it) */
    const size_t n_cells = (size_t)m->hp.n_layer * m->hp.n_expert;
    if (ep.expert_on_device && (on_device = malloc(n_cells ? n_cells : 1)) != NULL)
        memcpy(on_device, ep.expert_on_device, n_cells);
    const struct kt_expert_cache_params cache = {
        o->expert_cache_slots, o->expert_cache_lfu ? KT_EXPERT_CACHE_LFU : KT_EXPERT_CACHE_LRU};
    if (o->expert_cache_slots && !ep.device) {
        kt_err_set(&err, KT_ERR_INVALID, "--expert-cache needs a device: a --placement with one");
        goto fail;
    }
    ep.expert_cache = o->expert_cache_slots ? &cache : NULL;
    if (o->expert_cache_slots && !(decode_cache = calloc(m->hp.n_layer, sizeof *decode_cache))) {
        kt_err_set(&err, KT_ERR_NOMEM, "out of memory");
        goto fail;
    }
    kt_status created = kt_engine_create(m, &ep, &e, &err);
    kt_engine_plan_free(&plan);
    if (created != KT_OK)
        goto fail;

    struct kt_model_identity id;
    kt_model_identity(m, &id);
    if (kt_profile_create(m->hp.n_layer, m->hp.n_expert, &id, &prof, &err) != KT_OK)
        goto fail;
    prof->half_life_tokens = o->half_life;
    const size_t cells = (size_t)m->hp.n_layer * m->hp.n_expert;
    const uint32_t n_vocab = kt_engine_n_vocab(e), budget = kt_engine_max_batch_tokens(e);
    slots = calloc(o->batch, sizeof *slots);
    batch = malloc(budget * sizeof *batch);
    logits = malloc((size_t)o->batch * n_vocab * sizeof *logits);
    last[0] = calloc(cells + 1, sizeof *last[0]);
    last[1] = calloc(cells + 1, sizeof *last[1]);
    delta = calloc(cells + 1, sizeof *delta);
    row_slot = malloc(o->batch * sizeof *row_slot);
    if (!row_slot || !slots || !batch || !logits || !last[0] || !last[1] || !delta) {
        kt_err_set(&err, KT_ERR_NOMEM, "out of memory");
        goto fail;
    }
    kt_engine_stats_reset(e);

    struct progress pr = {.tty = isatty(2), .t0 = kt_bench_now_seconds()};
    size_t next_prompt = 0, done = 0;
    uint64_t generated = 0;
    while (done < set.n) {
        /* refill idle slots with the next prompts */
        for (uint32_t s = 0; s < o->batch && next_prompt < set.n; s++)
            if (!slots[s].p) {
                if (kt_engine_seq_add(e, s, &err) != KT_OK)
                    goto fail;
                slots[s] = (struct slot){.p = &set.items[next_prompt++]};
            }
        /* decode tokens first, then prefill chunks within the step's budget */
        uint32_t n = 0, n_rows = 0;
        for (uint32_t s = 0; s < o->batch; s++)
            if (slots[s].p && slots[s].pos >= slots[s].p->n_ids) {
                row_slot[n_rows++] = s;
                batch[n++] = (struct kt_batch_token){slots[s].next, s, slots[s].pos++, true};
            }
        const uint32_t n_decode = n;
        for (uint32_t s = 0; s < o->batch && n < budget; s++) {
            struct slot *sl = &slots[s];
            if (!sl->p || sl->pos >= sl->p->n_ids)
                continue;
            uint32_t take = (uint32_t)(sl->p->n_ids - sl->pos) < budget - n ? (uint32_t)(sl->p->n_ids - sl->pos)
                                                                          : budget - n;
            for (uint32_t i = 0; i < take; i++, sl->pos++)
                batch[n++] = (struct kt_batch_token){sl->p->ids[sl->pos], s, sl->pos, sl->pos + 1 == sl->p->n_ids};
            if (sl->pos == sl->p->n_ids)
                row_slot[n_rows++] = s;
        }
        const bool decode_only = n > 0 && n == n_decode;
        if (decode_only && decode_cache)
            cache_delta(e, decode_cache, -1);
        const double step_t0 = kt_bench_now_seconds();
        if (kt_engine_step(e, &(struct kt_batch){n, batch}, logits, &err) != KT_OK)
            goto fail;
        if (decode_only) { /* every token of the step a decode token */
            decode_seconds += kt_bench_now_seconds() - step_t0;
            decode_steps++;
            decode_tokens += n;
            if (decode_cache)
                cache_delta(e, decode_cache, +1);
        }
        if (o->half_life > 0) /* decay follows the order of the steps */
            add_routing(e, prof, last, last_tokens, delta, cells);
        /* rows come back in batch order: decode rows, then the prefills that ended */
        for (uint32_t r = 0; r < n_rows; r++) {
            struct slot *sl = &slots[row_slot[r]];
            sl->next = (int32_t)kt_bench_argmax(logits + (size_t)r * n_vocab, n_vocab);
            sl->generated++;
            generated++;
            if (sl->generated >= o->max_tokens || kt_token_is_eog(tok, sl->next)) {
                if (kt_engine_seq_remove(e, row_slot[r], &err) != KT_OK)
                    goto fail;
                sl->p = NULL;
                done++;
            }
        }
        struct kt_engine_stats st;
        kt_engine_stats(e, &st);
        draw(&pr, done, set.n, st.tokens, false);
    }
    add_routing(e, prof, last, last_tokens, delta, cells);
    const double seconds = kt_bench_now_seconds() - pr.t0;
    struct kt_engine_stats st;
    kt_engine_stats(e, &st);
    draw(&pr, done, set.n, st.tokens, true);
    if (kt_profile_save(prof, o->output, &err) != KT_OK)
        goto fail;
    if (o->svg && draw_heatmap(prof, o->svg, &err) != KT_OK)
        goto fail;

    printf("kt-bench profile: %s, %zu prompts from %s, up to %u new tokens each, batch %u\n", o->model, set.n,
           o->prompts, o->max_tokens, o->batch);
    printf("routed tokens: %.0f prefill, %.0f decode (%llu generated) in %.2f s (%.1f tok/s)%s\n",
           (double)last_tokens[KT_ROUTE_PREFILL], (double)last_tokens[KT_ROUTE_DECODE],
           (unsigned long long)generated, seconds, (double)st.tokens / seconds,
           o->half_life > 0 ? "; counts decayed" : "");
    if (decode_steps)
        printf("decode: %llu steps of only decode tokens, %.2f ms a step, %.1f tok/s\n",
               (unsigned long long)decode_steps, 1e3 * decode_seconds / (double)decode_steps,
               (double)decode_tokens / decode_seconds);
    if (on_device) {
        for (int ph = 0; ph < KT_PROFILE_PHASES; ph++) {
            double dev = 0, all = 0;
            for (size_t i = 0; i < (size_t)m->hp.n_layer * m->hp.n_expert; i++) {
                all += prof->counts[ph][i];
                dev += on_device[i] ? prof->counts[ph][i] : 0;
            }
            printf("routed pairs on the accelerator, %s: %.2f%% (%.0f of %.0f)\n",
                   ph == KT_PROFILE_DECODE ? "decode" : "prefill", all > 0 ? 100.0 * dev / all : 0.0, dev, all);
        }
    }
    if (decode_cache)
        print_cache(e, m, decode_cache, o);
    printf("share of each MoE layer's routed tokens on its hottest 1/8 of experts:\n");
    for (uint32_t il = 0; il < m->hp.n_layer; il++)
        if (m->layers[il].is_moe)
            printf("  layer %3u  %5.1f%%\n", il, 100.0 * top_share(prof, il));
    printf("wrote %s\n", o->output);
    rc = 0;
    goto done;
fail:
    fprintf(stderr, "kt-bench: %s\n", err.msg);
done:
    free(last[0]), free(last[1]), free(delta), free(row_slot), free(on_device), free(decode_cache);
    free(slots), free(batch), free(logits);
    kt_profile_destroy(prof);
    kt_engine_destroy(e);
    kt_tokenizer_destroy(tok);
    kt_model_close(m);
    kt_tool_prompts_free(&set);
    return rc;
}
