/*
 * test_moe_sliced.c - row-sliced routed experts (engine.h layer_sliced,
 * expert_store.h): every node holds its share of every expert's rows and
 * computes only those, so both nodes of a synthetic two-node topology work
 * on every active expert.
 *
 * Proves: the shares partition each matrix in whole 64-row blocks and are
 * byte for byte the rows (or packed groups) of the whole expert; the logits
 * of a prefill and greedy decode are bit-identical (memcmp) to whole experts
 * on one pool, on kt-synth's tiny and tiny-v3 and on tiny with q4_k experts
 * (packed), with 2 and 5 threads, over 3 nodes (one node's share empty), in
 * some layers only, in the GGUF layout, on a one-node topology (ignored),
 * and with half of every layer's experts and the shared experts on the sim
 * device; each slice node counts every CPU pair (node_pairs equal, their
 * sum twice the whole-expert run's); replicas in a sliced layer and slice
 * nodes without a pool are refused at creation.  A layer sliced while
 * serving and made whole again holds the bytes of a load with those homes,
 * and an engine doing both between steps keeps every logit.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "engine.h"
#include "engine_test.h"
#include "expert_store.h"
#include "model.h"
#include "quant.h"
#include "testlib.h"

#define PROMPT_LEN 12
#define DECODE_STEPS 6
static const int32_t prompt[PROMPT_LEN] = {1, 17, 300, 42, 999, 5, 77, 512, 3, 1000, 64, 128};

static const char *const ONE_NODE = "package:1 numa:1 core:2 pu:1";
static const char *const TWO_NODES = "package:2 numa:1 core:1 pu:1";

/* (PROMPT_LEN + DECODE_STEPS, V) logits of a prefill and greedy decode. */
static float *run(struct kt_model *m, const struct kt_engine_params *extra, struct kt_engine_stats *stats)
{
    struct kt_engine_params p = *extra;
    p.n_ctx = 64;
    p.kv_block_tokens = 8;
    p.max_batch_tokens = 64;
    return kt_test_engine_greedy(m, &p, prompt, PROMPT_LEN, DECODE_STEPS, NULL, stats, NULL);
}

static int32_t argmax(const float *x, uint32_t n)
{
    uint32_t best = 0;
    for (uint32_t i = 1; i < n; i++)
        if (x[i] > x[best])
            best = i;
    return (int32_t)best;
}

/* [n_layer] 1 for the MoE layers in [first, last]. */
static uint8_t *sliced_layers(const struct kt_model *m, uint32_t first, uint32_t last)
{
    uint8_t *s = kt_test_xmalloc(m->hp.n_layer);
    for (uint32_t il = 0; il < m->hp.n_layer; il++)
        s[il] = m->layers[il].is_moe && il >= first && il <= last;
    return s;
}

static void slices_partition_rows_in_whole_blocks(void)
{
    const int64_t sizes[] = {1, 63, 64, 65, 128, 130, 512, 2048, 7168};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
        for (int parts = 1; parts <= 5; parts++) {
            int64_t next = 0, biggest = 0, smallest = INT64_MAX;
            for (int part = 0; part < parts; part++) {
                int64_t first, n;
                kt_expert_slice_rows(sizes[i], parts, part, &first, &n);
                KT_CHECK(first == next && n >= 0, "%lld rows, part %d of %d: starts at %lld, not %lld",
                         (long long)sizes[i], part, parts, (long long)first, (long long)next);
                KT_CHECK(first % KT_EXPERT_SLICE_ROWS == 0 &&
                             (n % KT_EXPERT_SLICE_ROWS == 0 || first + n == sizes[i]),
                         "%lld rows, part %d of %d: [%lld, +%lld) is not whole blocks", (long long)sizes[i], part,
                         parts, (long long)first, (long long)n);
                next = first + n;
                const int64_t blocks = (n + KT_EXPERT_SLICE_ROWS - 1) / KT_EXPERT_SLICE_ROWS;
                biggest = blocks > biggest ? blocks : biggest;
                smallest = blocks < smallest ? blocks : smallest;
            }
            KT_CHECK(next == sizes[i], "%lld rows in %d parts: the parts cover %lld", (long long)sizes[i], parts,
                     (long long)next);
            KT_CHECK(biggest - smallest <= 1, "%lld rows in %d parts: %lld to %lld blocks", (long long)sizes[i],
                     parts, (long long)smallest, (long long)biggest);
        }
}

/* Bytes of rows [first, first + n) of a matrix of n_in-element rows laid
 * out as `packed` (NULL: GGUF rows of row_bytes) at base. */
static const uint8_t *rows_at(const uint8_t *base, const struct kt_packed_format *packed, int64_t n_in,
                              size_t row_bytes, int64_t first)
{
    return packed ? kt_packed_rows(packed, base, n_in, first) : base + (size_t)first * row_bytes;
}

static uint64_t rows_bytes(const struct kt_packed_format *packed, int64_t n_in, size_t row_bytes, int64_t n)
{
    return packed ? kt_packed_bytes(packed, n_in, n) : (uint64_t)n * row_bytes;
}

static void shares_are_the_whole_experts_rows(const char *extra)
{
    char path[1024];
    struct kt_model *m = kt_test_synth_model("tiny", extra, path, sizeof path);
    if (!m)
        return;
    const int64_t f = m->hp.n_ff_exp, E = m->hp.n_embd;
    uint8_t *all = sliced_layers(m, 0, m->hp.n_layer);
    struct kt_expert_store *whole = NULL, *sliced = NULL;
    kt_err err = {0};
    KT_CHECK(kt_expert_store_create(m, NULL, &whole, &err) == KT_OK, "whole store: %s", err.msg);
    KT_CHECK(kt_expert_store_create(m, &(struct kt_expert_store_params){.sliced_layers = all, .slice_nodes = 0x5},
                                    &sliced, &err) == KT_OK,
             "sliced store: %s", err.msg);
    for (uint32_t il = 0; whole && sliced && il < m->hp.n_layer; il++) {
        if (!m->layers[il].is_moe)
            continue;
        const struct kt_expert_layout *wl = kt_expert_store_layout(whole, il);
        const struct kt_expert_layout *sl = kt_expert_store_layout(sliced, il);
        KT_CHECK(sl->sliced && sl->slice_nodes == 0x5 && !wl->sliced, "layer %u: sliced over nodes 0 and 2", il);
        const size_t gate_row = kt_type_row_bytes(m->layers[il].ffn_gate_exps->type, E);
        const size_t up_row = kt_type_row_bytes(m->layers[il].ffn_up_exps->type, E);
        const size_t down_row = kt_type_row_bytes(m->layers[il].ffn_down_exps->type, f);
        int64_t ff_rows = 0, out_rows = 0;
        for (int node = 0; node < KT_EXPERT_MAX_NODES; node++) {
            const struct kt_expert_slice *s = &sl->slice[node];
            if (!(sl->slice_nodes >> node & 1)) {
                KT_CHECK(s->n_ff == 0 && s->n_out == 0, "layer %u: node %d holds no share", il, node);
                continue;
            }
            ff_rows += s->n_ff;
            out_rows += s->n_out;
            for (uint32_t x = 0; x < m->hp.n_expert; x++) {
                const struct kt_stored_expert *we = kt_expert_store_expert(whole, il, x);
                const struct kt_stored_expert *se = kt_expert_store_expert(sliced, il, x);
                KT_CHECK(se->data == NULL && se->slice[node] && se->nodes == 0x5, "layer %u expert %u: shares only",
                         il, x);
                if (!se->slice[node] || !we->data)
                    continue;
                const bool same =
                    !memcmp(se->slice[node] + s->gate_offset,
                            rows_at(we->data + wl->gate_offset, wl->gate_packed, E, gate_row, s->ff_first),
                            rows_bytes(wl->gate_packed, E, gate_row, s->n_ff)) &&
                    !memcmp(se->slice[node] + s->up_offset,
                            rows_at(we->data + wl->up_offset, wl->up_packed, E, up_row, s->ff_first),
                            rows_bytes(wl->up_packed, E, up_row, s->n_ff)) &&
                    !memcmp(se->slice[node] + s->down_offset,
                            rows_at(we->data + wl->down_offset, wl->down_packed, f, down_row, s->out_first),
                            rows_bytes(wl->down_packed, f, down_row, s->n_out));
                KT_CHECK(same, "%s layer %u expert %u: node %d's share differs from the whole expert's rows",
                         extra, il, x, node);
            }
        }
        KT_CHECK(ff_rows == f && out_rows == E, "layer %u: shares hold %lld of %lld and %lld of %lld rows", il,
                 (long long)ff_rows, (long long)f, (long long)out_rows, (long long)E);
    }
    KT_CHECK(!sliced || kt_expert_store_bytes(sliced) > 0, "the sliced store holds bytes");
    kt_expert_store_destroy(whole);
    kt_expert_store_destroy(sliced);

    /* replicas make no sense in a sliced layer; one slice node is no slicing */
    const size_t n_experts = (size_t)m->hp.n_layer * m->hp.n_expert;
    uint16_t *replicas = kt_test_xmalloc(n_experts * sizeof *replicas);
    for (size_t i = 0; i < n_experts; i++)
        replicas[i] = 1u << 1;
    struct kt_expert_store *bad = NULL;
    kt_status st = kt_expert_store_create(
        m, &(struct kt_expert_store_params){.sliced_layers = all, .slice_nodes = 0x3, .replica_nodes = replicas},
        &bad, &err);
    KT_CHECK(st == KT_ERR_INVALID && bad == NULL && strstr(err.msg, "replicas in a row-sliced layer"),
             "replicas in a sliced layer are refused (%d: %s)", st, err.msg);
    st = kt_expert_store_create(m, &(struct kt_expert_store_params){.sliced_layers = all, .slice_nodes = 0x2}, &bad,
                                &err);
    KT_CHECK(st == KT_ERR_INVALID && bad == NULL && strstr(err.msg, "two or more"),
             "a sliced layer over one node is refused (%d: %s)", st, err.msg);
    free(replicas);
    free(all);
    kt_test_synth_remove(m, path);
}

/* A whole layer sliced while serving (kt_expert_store_slice_copy, then
 * _switch), in one move or in parts, holds the bytes a store sliced at load
 * holds, byte for byte, in the same layout; its whole copies are given back
 * (in one move, as much memory as the load; in parts, the same data).  While
 * sliced in part its sliced experts cannot move, its whole ones can, and
 * slicing a sliced expert again or over other nodes is refused. */
static void slicing_a_layer_later_gives_the_loads_shares(const char *extra, uint32_t parts)
{
    char path[1024];
    struct kt_model *m = kt_test_synth_model("tiny", extra, path, sizeof path);
    if (!m)
        return;
    uint8_t *all = sliced_layers(m, 0, m->hp.n_layer);
    struct kt_expert_store *later = NULL, *at_load = NULL;
    kt_err err = {0};
    KT_CHECK(kt_expert_store_create(m, NULL, &later, &err) == KT_OK, "whole store: %s", err.msg);
    KT_CHECK(kt_expert_store_create(m, &(struct kt_expert_store_params){.sliced_layers = all, .slice_nodes = 0x5},
                                    &at_load, &err) == KT_OK,
             "sliced store: %s", err.msg);
    const uint64_t bytes_whole = later ? kt_expert_store_bytes(later) : 0;
    for (uint32_t il = 0; later && at_load && il < m->hp.n_layer; il++) {
        if (!m->layers[il].is_moe)
            continue;
        struct kt_layer_slices *c = NULL;
        const uint32_t Ne = m->hp.n_expert;
        KT_CHECK(kt_expert_store_slice_copy(later, m, il, 0x4, 0, Ne, &c, &err) == KT_ERR_INVALID && !c &&
                     strstr(err.msg, "two or more"),
                 "one node is no slicing: %s", err.msg);
        KT_CHECK(kt_expert_store_slice_copy(later, m, il, 0x5, 2, 2, &c, &err) == KT_ERR_INVALID && !c,
                 "an empty range: %s", err.msg);
        for (uint32_t part = 0; part < parts; part++) {
            const uint32_t x0 = Ne * part / parts, x1 = Ne * (part + 1) / parts;
            KT_CHECK(kt_expert_store_slice_copy(later, m, il, 0x5, x0, x1, &c, &err) == KT_OK && c, "%s", err.msg);
            KT_CHECK(kt_expert_store_layout(later, il)->n_sliced == x0 && !kt_expert_store_layout(later, il)->sliced,
                     "layer %u: experts from %u whole until the switch", il, x0);
            KT_CHECK(c && kt_expert_store_slice_switch(later, c, &err) == KT_OK, "%s", err.msg);
            c = NULL;
            const struct kt_expert_layout *now = kt_expert_store_layout(later, il);
            KT_CHECK(now->n_sliced == x1 && now->sliced == (x1 == Ne) && now->slice_nodes == 0x5,
                     "layer %u after part %u: %u sliced", il, part, now->n_sliced);
            if (x1 == Ne)
                continue;
            struct kt_expert_copy *moved = NULL;
            KT_CHECK(kt_expert_store_copy(later, il, x0, 1, &moved, &err) == KT_ERR_UNSUPPORTED && !moved,
                     "a sliced expert has no home to move: %s", err.msg);
            KT_CHECK(kt_expert_store_copy(later, il, x1, 1, &moved, &err) == KT_OK && moved, "a whole one moves: %s",
                     err.msg);
            kt_expert_copy_discard(moved);
            KT_CHECK(kt_expert_store_expert(later, il, x1)->data && !kt_expert_store_expert(later, il, x0)->data,
                     "layer %u: expert %u whole, %u sliced", il, x1, x0);
            KT_CHECK(kt_expert_store_slice_copy(later, m, il, 0x5, x0, x1 + 1, &c, &err) == KT_ERR_INVALID && !c &&
                         strstr(err.msg, "row-sliced already"),
                     "a sliced expert again: %s", err.msg);
            KT_CHECK(kt_expert_store_slice_copy(later, m, il, 0x3, x1, Ne, &c, &err) == KT_ERR_INVALID && !c &&
                         strstr(err.msg, "sliced over nodes 0x5"),
                     "other slice nodes: %s", err.msg);
        }
        const struct kt_expert_layout *a = kt_expert_store_layout(later, il), *b = kt_expert_store_layout(at_load, il);
        KT_CHECK(a->sliced && a->slice_nodes == 0x5 && !memcmp(a->slice, b->slice, sizeof a->slice) &&
                     a->gate_packed == b->gate_packed && a->down_packed == b->down_packed,
                 "layer %u: the load's sliced layout", il);
        for (uint32_t x = 0; x < m->hp.n_expert; x++)
            for (int node = 0; node < KT_EXPERT_MAX_NODES; node++) {
                const struct kt_stored_expert *se = kt_expert_store_expert(later, il, x);
                const struct kt_stored_expert *le = kt_expert_store_expert(at_load, il, x);
                if (!(0x5 >> node & 1)) {
                    KT_CHECK(!se->slice[node] && !se->copy[node], "layer %u expert %u: nothing on node %d", il, x,
                             node);
                    continue;
                }
                KT_CHECK(se->data == NULL && se->nodes == 0x5 && se->slice[node] &&
                             !memcmp(se->slice[node], le->slice[node], b->slice[node].bytes),
                         "%s layer %u expert %u: node %d's share differs from the load's", extra, il, x, node);
            }
        c = NULL;
        KT_CHECK(kt_expert_store_slice_copy(later, m, il, 0x5, 0, Ne, &c, &err) == KT_ERR_INVALID && !c,
                 "a sliced layer again: %s", err.msg);
    }
    KT_CHECK(!later || !at_load || kt_expert_store_data_bytes(later) == kt_expert_store_data_bytes(at_load),
             "data bytes: sliced later %llu, at load %llu",
             (unsigned long long)(later ? kt_expert_store_data_bytes(later) : 0),
             (unsigned long long)(at_load ? kt_expert_store_data_bytes(at_load) : 0));
    KT_CHECK(!later || !at_load || parts > 1 || kt_expert_store_bytes(later) == kt_expert_store_bytes(at_load),
             "bytes: whole %llu, sliced later %llu, sliced at load %llu", (unsigned long long)bytes_whole,
             (unsigned long long)(later ? kt_expert_store_bytes(later) : 0),
             (unsigned long long)(at_load ? kt_expert_store_bytes(at_load) : 0));
    kt_expert_store_destroy(later);
    kt_expert_store_destroy(at_load);
    free(all);
    kt_test_synth_remove(m, path);
}

static void slicing_later_f32(void)
{
    slicing_a_layer_later_gives_the_loads_shares("", 1);
}

static void slicing_later_q4_k(void)
{
    slicing_a_layer_later_gives_the_loads_shares("--experts-type q4_k", 1);
}

static void slicing_later_in_parts_q4_k(void)
{
    slicing_a_layer_later_gives_the_loads_shares("--experts-type q4_k", 3);
}

/* A layer sliced at load made whole again, in one move or in parts, holds,
 * expert for expert, the bytes a whole load with the same homes holds (in
 * one move as much memory, in parts the same data); a whole layer or expert
 * is refused, and so is a home past the store's nodes. */
static void making_a_layer_whole_gives_the_whole_loads_experts(const char *extra, uint32_t parts)
{
    char path[1024];
    struct kt_model *m = kt_test_synth_model("tiny", extra, path, sizeof path);
    if (!m)
        return;
    const uint32_t L = m->hp.n_layer, Ne = m->hp.n_expert;
    uint8_t *all = sliced_layers(m, 0, L);
    int *homes = kt_test_xmalloc((size_t)L * Ne * sizeof *homes);
    for (size_t i = 0; i < (size_t)L * Ne; i++)
        homes[i] = (i * 7 % 3 == 0) ? 2 : 0; /* nodes 0 and 2, unevenly */
    struct kt_expert_store *whole = NULL, *sliced = NULL;
    kt_err err = {0};
    KT_CHECK(kt_expert_store_create(m, &(struct kt_expert_store_params){.home_nodes = homes}, &whole, &err) == KT_OK,
             "whole store: %s", err.msg);
    KT_CHECK(kt_expert_store_create(m, &(struct kt_expert_store_params){.sliced_layers = all, .slice_nodes = 0x5},
                                    &sliced, &err) == KT_OK,
             "sliced store: %s", err.msg);
    for (uint32_t il = 0; whole && sliced && il < L; il++) {
        if (!m->layers[il].is_moe)
            continue;
        struct kt_layer_whole *c = NULL;
        KT_CHECK(kt_expert_store_whole_copy(whole, il, homes + (size_t)il * Ne, 0, Ne, &c, &err) == KT_ERR_INVALID && !c &&
                     strstr(err.msg, "whole already"),
                 "a whole layer: %s", err.msg);
        int bad[64];
        for (uint32_t x = 0; x < Ne && x < 64; x++)
            bad[x] = x == 3 ? KT_EXPERT_MAX_NODES : 0;
        KT_CHECK(Ne > 64 || (kt_expert_store_whole_copy(sliced, il, bad, 0, Ne, &c, &err) == KT_ERR_INVALID && !c &&
                             strstr(err.msg, "expert 3: home node")),
                 "a home past the nodes: %s", err.msg);
        for (uint32_t part = 0; part < parts; part++) {
            const uint32_t x0 = Ne * part / parts, x1 = Ne * (part + 1) / parts;
            KT_CHECK(kt_expert_store_whole_copy(sliced, il, homes + (size_t)il * Ne, x0, x1, &c, &err) == KT_OK && c,
                     "%s", err.msg);
            KT_CHECK(kt_expert_store_layout(sliced, il)->n_sliced == Ne - x0, "layer %u: sliced until the switch", il);
            KT_CHECK(c && kt_expert_store_whole_switch(sliced, c, &err) == KT_OK, "%s", err.msg);
            c = NULL;
            const struct kt_expert_layout *now = kt_expert_store_layout(sliced, il);
            KT_CHECK(now->n_sliced == Ne - x1 && !now->sliced && (x1 == Ne) == (now->slice_nodes == 0),
                     "layer %u after part %u: %u sliced, nodes 0x%x", il, part, now->n_sliced, now->slice_nodes);
            KT_CHECK(x1 == Ne || (kt_expert_store_whole_copy(sliced, il, homes + (size_t)il * Ne, 0, x1 + 1, &c, &err) ==
                                      KT_ERR_INVALID &&
                                  !c && strstr(err.msg, "whole already")),
                     "a whole expert again: %s", err.msg);
        }
        const struct kt_expert_layout *a = kt_expert_store_layout(sliced, il), *b = kt_expert_store_layout(whole, il);
        KT_CHECK(!a->sliced && a->slice_nodes == 0 && a->expert_bytes == b->expert_bytes &&
                     a->gate_packed == b->gate_packed && a->down_packed == b->down_packed,
                 "layer %u: the whole load's layout", il);
        for (uint32_t x = 0; x < Ne; x++) {
            const struct kt_stored_expert *se = kt_expert_store_expert(sliced, il, x);
            const struct kt_stored_expert *we = kt_expert_store_expert(whole, il, x);
            KT_CHECK(se->data && se->home_node == we->home_node && se->nodes == we->nodes &&
                         se->copy[se->home_node] == se->data && !se->slice[0] && !se->slice[2] &&
                         !memcmp(se->data, we->data, a->expert_bytes),
                     "%s layer %u expert %u: differs from the whole load's (home %d/%d)", extra, il, x, se->home_node,
                     we->home_node);
        }
    }
    KT_CHECK(!whole || !sliced || ((parts > 1 || kt_expert_store_bytes(sliced) == kt_expert_store_bytes(whole)) &&
                                   kt_expert_store_data_bytes(sliced) == kt_expert_store_data_bytes(whole)),
             "bytes: made whole %llu (data %llu), whole at load %llu (data %llu)",
             (unsigned long long)(sliced ? kt_expert_store_bytes(sliced) : 0),
             (unsigned long long)(sliced ? kt_expert_store_data_bytes(sliced) : 0),
             (unsigned long long)(whole ? kt_expert_store_bytes(whole) : 0),
             (unsigned long long)(whole ? kt_expert_store_data_bytes(whole) : 0));
    kt_expert_store_destroy(whole);
    kt_expert_store_destroy(sliced);
    free(all), free(homes);
    kt_test_synth_remove(m, path);
}

static void whole_again_f32(void)
{
    making_a_layer_whole_gives_the_whole_loads_experts("", 1);
}

static void whole_again_q4_k(void)
{
    making_a_layer_whole_gives_the_whole_loads_experts("--experts-type q4_k", 1);
}

static void whole_again_in_parts_q4_k(void)
{
    making_a_layer_whole_gives_the_whole_loads_experts("--experts-type q4_k", 4);
}

/* An engine whose layers are sliced after the prompt and made whole again two
 * decode steps later - odd layers in one move, even ones in two parts, a
 * decode step running between the parts with the layer sliced in part -
 * gives, step for step, the logits of one never sliced. */
static void slicing_and_unslicing_between_steps_keeps_every_logit(void)
{
    char path[1024];
    struct kt_model *m = kt_test_synth_model("tiny", "--experts-type q4_k", path, sizeof path);
    if (!m)
        return;
    const struct kt_engine_params p = {.n_threads = 2, .topology = TWO_NODES, .n_ctx = 64, .kv_block_tokens = 8,
                                       .max_batch_tokens = 64};
    struct kt_engine_stats st;
    float *base = run(m, &p, &st);
    struct kt_engine *e = NULL;
    kt_err err = {0};
    const uint32_t V = m->hp.n_vocab, Ne = m->hp.n_expert;
    float *logits = kt_test_xmalloc((size_t)(PROMPT_LEN + DECODE_STEPS) * V * sizeof *logits);
    struct kt_batch_token bt[PROMPT_LEN];
    for (uint32_t i = 0; i < PROMPT_LEN; i++)
        bt[i] = (struct kt_batch_token){prompt[i], 0, i, true};
    bool ok = base && kt_engine_create(m, &p, &e, &err) == KT_OK && kt_engine_seq_add(e, 0, &err) == KT_OK &&
              kt_engine_step(e, &(struct kt_batch){PROMPT_LEN, bt}, logits, &err) == KT_OK;
    int *homes = kt_test_xmalloc(Ne * sizeof *homes);
    for (uint32_t s = 0; ok && s < DECODE_STEPS; s++) {
        for (uint32_t il = 0; ok && il < m->hp.n_layer && s < 4; il++) {
            const uint32_t half = il % 2 ? Ne : Ne / 2; /* the first part: experts [0, half) */
            const uint32_t x0 = s % 2 ? half : 0, x1 = s % 2 ? Ne : half;
            if (!m->layers[il].is_moe || x0 == x1)
                continue;
            if (s < 2) {
                struct kt_layer_slices *c = NULL;
                ok = kt_engine_layer_slice_copy(e, il, x0, x1, &c, &err) == KT_OK &&
                     kt_engine_layer_slice_switch(e, c, &err) == KT_OK && kt_engine_layer_sliced(e, il) == (x1 == Ne) &&
                     kt_engine_layer_sliced_experts(e, il) == x1 && kt_engine_expert_node(e, il, x0) < 0;
            } else {
                for (uint32_t x = 0; x < Ne; x++)
                    homes[x] = (int)((x + il) % 2);
                struct kt_layer_whole *c = NULL;
                ok = kt_engine_layer_whole_copy(e, il, homes, x0, x1, &c, &err) == KT_OK &&
                     kt_engine_layer_whole_switch(e, c, &err) == KT_OK && !kt_engine_layer_sliced(e, il) &&
                     kt_engine_layer_sliced_experts(e, il) == Ne - x1 &&
                     kt_engine_expert_node(e, il, x0) == (int)((x0 + il) % 2);
            }
            if (!ok)
                fprintf(stderr, "step %u layer %u experts [%u, %u): %s\n", s, il, x0, x1, err.msg);
        }
        const int32_t next = argmax(logits + (size_t)(PROMPT_LEN + s - 1) * V, V);
        struct kt_batch_token t = {next, 0, PROMPT_LEN + s, true};
        ok = ok && kt_engine_step(e, &(struct kt_batch){1, &t}, logits + (size_t)(PROMPT_LEN + s) * V, &err) == KT_OK;
    }
    KT_CHECK(ok, "%s", err.msg);
    KT_CHECK(!ok || memcmp(logits, base, (size_t)(PROMPT_LEN + DECODE_STEPS) * V * sizeof *logits) == 0,
             "logits differ from the never-sliced engine's");
    struct kt_layer_whole *c = NULL;
    KT_CHECK(!e || !ok || (kt_engine_layer_whole_copy(e, 1, homes, 0, Ne, &c, &err) == KT_ERR_INVALID && !c),
             "layer 1 is whole: refused (%s)", err.msg);
    kt_engine_destroy(e);
    free(base), free(logits), free(homes);
    kt_test_synth_remove(m, path);
}

static void shares_are_whole_rows_f32(void)
{
    shares_are_the_whole_experts_rows("");
}

static void shares_are_whole_rows_q4_k(void)
{
    shares_are_the_whole_experts_rows("--experts-type q4_k");
}

static void check_identical(const char *preset, const char *extra)
{
    char path[1024];
    struct kt_model *m = kt_test_synth_model(preset, extra, path, sizeof path);
    if (!m)
        return;
    const size_t n = (size_t)(PROMPT_LEN + DECODE_STEPS) * m->hp.n_vocab;
    const size_t LE = (size_t)m->hp.n_layer * m->hp.n_expert;
    uint8_t *all = sliced_layers(m, 0, m->hp.n_layer), *some = sliced_layers(m, 2, 2);
    uint8_t *half = kt_test_xmalloc(LE);
    for (size_t i = 0; i < LE; i++)
        half[i] = (i % m->hp.n_expert) % 2 == 1;
    const struct kt_backend_params sim = {.kind = KT_BACKEND_SIM, .name = "sim0", .transfer_gbps = 25,
                                          .latency_us = 5};
    struct kt_engine_stats st;
    float *base = run(m, &(struct kt_engine_params){.n_threads = 2, .topology = ONE_NODE}, &st);
    const struct {
        const char *what;
        struct kt_engine_params p;
    } cases[] = {
        {"2 nodes, every MoE layer sliced, 2 threads", {.n_threads = 2, .topology = TWO_NODES, .layer_sliced = all}},
        {"2 nodes, every MoE layer sliced, 5 threads",
         {.n_threads = 5, .topology = "package:2 numa:1 core:3 pu:1", .layer_sliced = all}},
        {"3 nodes (one share of gate/up empty), sliced, 1 thread",
         {.n_threads = 1, .topology = "package:3 numa:1 core:1 pu:1", .layer_sliced = all}},
        {"2 nodes, layer 2 sliced, the others round-robin",
         {.n_threads = 2, .topology = TWO_NODES, .layer_sliced = some,
          .test = &(struct kt_engine_test_params){.experts_round_robin = true}}},
        {"2 nodes, sliced, GGUF layout",
         {.n_threads = 2, .topology = TWO_NODES, .layer_sliced = all,
          .test = &(struct kt_engine_test_params){.keep_gguf_layout = true}}},
        {"1 node, sliced (ignored)", {.n_threads = 2, .topology = ONE_NODE, .layer_sliced = all}},
        {"2 nodes, sliced, half the experts + shared on the sim device",
         {.n_threads = 2, .topology = TWO_NODES, .layer_sliced = all, .device = &sim, .expert_on_device = half,
          .shared_on_device = true}},
        {"2 nodes, sliced, half the experts on the sim device, shared on the CPU",
         {.n_threads = 2, .topology = TWO_NODES, .layer_sliced = all, .device = &sim, .expert_on_device = half}},
    };
    for (size_t c = 0; base && c < sizeof cases / sizeof cases[0]; c++) {
        float *got = run(m, &cases[c].p, &st);
        if (!got)
            continue;
        size_t first = n;
        for (size_t i = 0; i < n && first == n; i++)
            if (memcmp(&got[i], &base[i], sizeof got[i]) != 0)
                first = i;
        KT_CHECK(first == n, "%s %s, %s: logits differ from whole experts on one pool at position %zu, token %zu "
                             "(%.9g vs %.9g)",
                 preset, extra, cases[c].what, first / m->hp.n_vocab, first % m->hp.n_vocab,
                 first < n ? got[first] : 0.0, first < n ? base[first] : 0.0);
        if (cases[c].p.device)
            KT_CHECK(st.device_pairs > 0, "%s, %s: the device ran its experts", preset, cases[c].what);
        printf("  %s %s, %s: node pairs %llu / %llu / %llu, device %llu\n", preset, extra, cases[c].what,
               (unsigned long long)st.node_pairs[0], (unsigned long long)st.node_pairs[1],
               (unsigned long long)st.node_pairs[2], (unsigned long long)st.device_pairs);
        free(got);
    }
    free(base);
    free(all);
    free(some);
    free(half);
    kt_test_synth_remove(m, path);
}

static void tiny_sliced_logits_identical(void)
{
    check_identical("tiny", "");
}

static void tiny_v3_sliced_logits_identical(void)
{
    check_identical("tiny-v3", "");
}

static void tiny_q4_k_sliced_logits_identical(void)
{
    check_identical("tiny", "--experts-type q4_k --shared-type q8_0");
}

/* Both nodes run a share of every CPU pair, in prefill and in decode. */
static void both_nodes_work_on_every_active_expert(void)
{
    char path[1024];
    struct kt_model *m = kt_test_synth_model("tiny", "", path, sizeof path);
    if (!m)
        return;
    uint8_t *all = sliced_layers(m, 0, m->hp.n_layer);
    struct kt_engine_stats whole, sliced;
    float *a = run(m,
                   &(struct kt_engine_params){.n_threads = 2, .topology = TWO_NODES,
                                              .test = &(struct kt_engine_test_params){.experts_round_robin = true}},
                   &whole);
    float *b = run(m, &(struct kt_engine_params){.n_threads = 2, .topology = TWO_NODES, .layer_sliced = all}, &sliced);
    const uint64_t pairs = whole.node_pairs[0] + whole.node_pairs[1];
    uint32_t moe_layers = 0;
    for (uint32_t il = 0; il < m->hp.n_layer; il++)
        moe_layers += m->layers[il].is_moe;
    const uint64_t routed = (uint64_t)moe_layers * m->hp.n_expert_used * (PROMPT_LEN + DECODE_STEPS);
    printf("  whole experts: node 0 ran %llu pairs, node 1 %llu; sliced: %llu and %llu (of %llu routed)\n",
           (unsigned long long)whole.node_pairs[0], (unsigned long long)whole.node_pairs[1],
           (unsigned long long)sliced.node_pairs[0], (unsigned long long)sliced.node_pairs[1],
           (unsigned long long)routed);
    KT_CHECK(pairs == routed, "whole experts: the nodes ran every routed pair once (%llu of %llu)",
             (unsigned long long)pairs, (unsigned long long)routed);
    KT_CHECK(sliced.node_pairs[0] == routed && sliced.node_pairs[1] == routed,
             "sliced: each node ran its share of every routed pair (%llu and %llu of %llu)",
             (unsigned long long)sliced.node_pairs[0], (unsigned long long)sliced.node_pairs[1],
             (unsigned long long)routed);
    KT_CHECK(sliced.cpu_experts_busy_ns > 0, "the pools were busy");
    free(a);
    free(b);
    free(all);
    kt_test_synth_remove(m, path);
}

static void bad_slicing_is_refused(void)
{
    char path[1024];
    struct kt_model *m = kt_test_synth_model("tiny", "", path, sizeof path);
    if (!m)
        return;
    uint8_t *all = sliced_layers(m, 0, m->hp.n_layer);
    const size_t LE = (size_t)m->hp.n_layer * m->hp.n_expert;
    uint16_t *replicas = kt_test_xmalloc(LE * sizeof *replicas);
    for (size_t i = 0; i < LE; i++)
        replicas[i] = 1u << 1;
    const struct {
        const char *what, *says;
        struct kt_engine_params p;
    } cases[] = {
        {"replicas in a sliced layer", "replicas in a row-sliced layer",
         {.topology = TWO_NODES, .layer_sliced = all, .expert_replica_nodes = replicas}},
        {"a slice node without a pool", "no worker pool",
         {.topology = TWO_NODES, .layer_sliced = all, .expert_slice_nodes = 0x5}},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        struct kt_engine_params p = cases[c].p;
        p.n_threads = 2;
        p.n_ctx = 64;
        struct kt_engine *e = NULL;
        kt_err err = {0};
        kt_status st = kt_engine_create(m, &p, &e, &err);
        KT_CHECK(st == KT_ERR_INVALID && e == NULL && strstr(err.msg, cases[c].says), "%s: refused (%d: %s)",
                 cases[c].what, st, err.msg);
        kt_engine_destroy(e);
    }
    free(replicas);
    free(all);
    kt_test_synth_remove(m, path);
}

/* Per layer, each node pool's pairs add up to the step totals, and the
 * busiest / mean balance is recorded for MoE layers (>= 1 by definition). */
static void layer_stats_split_pairs_and_balance_by_node(void)
{
    char path[1024];
    struct kt_model *m = kt_test_synth_model("tiny", "", path, sizeof path);
    if (!m)
        return;
    struct kt_engine *e = NULL;
    kt_err err = {0};
    const struct kt_engine_params p = {.n_ctx = 64, .kv_block_tokens = 8, .max_batch_tokens = 64, .n_threads = 2,
                                       .topology = TWO_NODES};
    KT_CHECK(kt_engine_create(m, &p, &e, &err) == KT_OK, "%s", err.msg);
    struct kt_batch_token toks[PROMPT_LEN];
    for (uint32_t i = 0; i < PROMPT_LEN; i++)
        toks[i] = (struct kt_batch_token){prompt[i], 0, i, false};
    KT_CHECK(e && kt_engine_seq_add(e, 0, &err) == KT_OK, "%s", err.msg);
    KT_CHECK(e && kt_engine_step(e, &(struct kt_batch){PROMPT_LEN, toks}, NULL, &err) == KT_OK, "%s", err.msg);
    struct kt_engine_stats st;
    if (e) {
        kt_engine_stats(e, &st);
        uint64_t sum[16] = {0};
        for (uint32_t il = 0; il < m->hp.n_layer; il++) {
            struct kt_engine_layer_stats ls;
            KT_CHECK(kt_engine_layer_stats(e, il, &ls), "layer %u", il);
            for (int n = 0; n < 16; n++)
                sum[n] += ls.node_pairs[n];
            if (m->layers[il].is_moe) {
                KT_CHECK(ls.node_pairs[0] + ls.node_pairs[1] == (uint64_t)PROMPT_LEN * m->hp.n_expert_used,
                         "layer %u: the nodes ran %llu + %llu pairs", il, (unsigned long long)ls.node_pairs[0],
                         (unsigned long long)ls.node_pairs[1]);
                KT_CHECK(ls.node_busy_max_ns >= ls.node_busy_mean_ns && ls.node_busy_mean_ns > 0,
                         "layer %u: busiest %llu ns, mean %llu ns", il, (unsigned long long)ls.node_busy_max_ns,
                         (unsigned long long)ls.node_busy_mean_ns);
            } else {
                KT_CHECK(ls.node_busy_max_ns == 0 && ls.node_pairs[0] == 0, "dense layer %u has node stats", il);
            }
        }
        KT_CHECK(sum[0] == st.node_pairs[0] && sum[1] == st.node_pairs[1], "layers' pairs add up to the step's");
    }
    kt_engine_destroy(e);
    kt_test_synth_remove(m, path);
}

int main(void)
{
    KT_RUN(slices_partition_rows_in_whole_blocks);
    KT_RUN(shares_are_whole_rows_f32);
    KT_RUN(slicing_later_f32);
    KT_RUN(slicing_later_q4_k);
    KT_RUN(slicing_later_in_parts_q4_k);
    KT_RUN(whole_again_f32);
    KT_RUN(whole_again_q4_k);
    KT_RUN(whole_again_in_parts_q4_k);
    KT_RUN(slicing_and_unslicing_between_steps_keeps_every_logit);
    KT_RUN(shares_are_whole_rows_q4_k);
    KT_RUN(tiny_sliced_logits_identical);
    KT_RUN(tiny_v3_sliced_logits_identical);
    KT_RUN(tiny_q4_k_sliced_logits_identical);
    KT_RUN(both_nodes_work_on_every_active_expert);
    KT_RUN(layer_stats_split_pairs_and_balance_by_node);
    KT_RUN(bad_slicing_is_refused);
    return kt_test_finish();
}
