/*
 * test_moe_pools.c - routed experts dispatched to per-NUMA-node pools
 * (engine.h `topology`, moe.c): the logits are bit-identical to the routed
 * experts run on one pool (a synthetic one-node topology: the step's pool),
 * on kt-synth's tiny and tiny-v3, for prefill and decode, with experts homed
 * round-robin over a synthetic two-node topology, and with every expert homed
 * on node 0 but replicated on node 1 (then node 1's pool must take a share of
 * the pairs: replicas spread the work), and with an expert of every layer moved
 * to another node before every step; a moved expert runs on its new node's
 * pool, and what cannot move is refused; every thread of an 8-thread pool
 * runs expert tasks at batch 1 and in a prefill; and decode speed on this
 * machine, printed each way.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "engine.h"
#include "engine_test.h"
#include "expert_store.h"
#include "model.h"
#include "testlib.h"

#define PROMPT_LEN 12
#define DECODE_STEPS 8
static const int32_t prompt[PROMPT_LEN] = {1, 17, 300, 42, 999, 5, 77, 512, 3, 1000, 64, 128};

static const char *const ONE_NODE = "package:1 numa:1 core:2 pu:1";
static const char *const TWO_NODES = "package:2 numa:1 core:1 pu:1";

static struct kt_model *open_synth(const char *preset, char *path, size_t path_size)
{
    return kt_test_synth_model(preset, "", path, path_size);
}

static void remove_synth(struct kt_model *m, const char *path)
{
    kt_test_synth_remove(m, path);
}

static struct kt_engine *engine(struct kt_model *m, const struct kt_engine_params *extra)
{
    struct kt_engine_params p = *extra;
    p.n_ctx = 64;
    p.kv_block_tokens = 8;
    p.max_batch_tokens = 64;
    struct kt_engine *e = NULL;
    kt_err err = {0};
    KT_CHECK(kt_engine_create(m, &p, &e, &err) == KT_OK, "engine: %s", err.msg);
    return e;
}

/* Logits of every prompt position (one prefill step), then of DECODE_STEPS
 * greedy decode steps: (PROMPT_LEN + DECODE_STEPS, V), malloc'd. */
static float *run(struct kt_model *m, const struct kt_engine_params *extra)
{
    struct kt_engine_params p = *extra;
    p.n_ctx = 64;
    p.kv_block_tokens = 8;
    p.max_batch_tokens = 64;
    return kt_test_engine_greedy(m, &p, prompt, PROMPT_LEN, DECODE_STEPS, NULL, NULL, NULL);
}

static void check_identical(const char *preset)
{
    char path[1024];
    struct kt_model *m = open_synth(preset, path, sizeof path);
    if (!m)
        return;
    const size_t n = (size_t)(PROMPT_LEN + DECODE_STEPS) * m->hp.n_vocab;
    const size_t n_experts = (size_t)m->hp.n_layer * m->hp.n_expert;
    int *homes = calloc(n_experts, sizeof *homes); /* all node 0 */
    uint16_t *replicas = calloc(n_experts, sizeof *replicas);
    for (size_t i = 0; replicas && i < n_experts; i++)
        replicas[i] = 1u << 1;
    float *base = run(m, &(struct kt_engine_params){.n_threads = 2, .topology = ONE_NODE});
    const struct {
        const char *what;
        struct kt_engine_params p;
    } cases[] = {
        {"2 nodes, round-robin homes, 2 threads",
         {.n_threads = 2, .topology = TWO_NODES, .test = &(struct kt_engine_test_params){.experts_round_robin = true}}},
        {"2 nodes, round-robin homes, 5 threads",
         {.n_threads = 5, .topology = "package:2 numa:1 core:3 pu:1", .test = &(struct kt_engine_test_params){.experts_round_robin = true}}},
        {"3 nodes, round-robin homes, 1 thread",
         {.n_threads = 1, .topology = "package:3 numa:1 core:1 pu:1", .test = &(struct kt_engine_test_params){.experts_round_robin = true}}},
        {"2 nodes, experts in place", {.n_threads = 2, .topology = TWO_NODES, .test = &(struct kt_engine_test_params){.experts_in_place = true}}},
        {"2 nodes, homes on node 0, replicas on node 1",
         {.n_threads = 2, .topology = TWO_NODES, .expert_home_nodes = homes, .expert_replica_nodes = replicas}},
        {"2 nodes, an expert of every layer moved to the other node before every step",
         {.n_threads = 2, .topology = TWO_NODES,
          .test = &(struct kt_engine_test_params){.experts_round_robin = true, .migrate_every_step = true}}},
        {"3 nodes, an expert of every layer moved to the next node before every step",
         {.n_threads = 1, .topology = "package:3 numa:1 core:1 pu:1",
          .test = &(struct kt_engine_test_params){.experts_round_robin = true, .migrate_every_step = true}}},
        {"this machine", {.n_threads = 2}},
    };
    for (size_t c = 0; base && c < sizeof cases / sizeof cases[0]; c++) {
        float *got = run(m, &cases[c].p);
        if (!got)
            continue;
        size_t first = n;
        for (size_t i = 0; i < n && first == n; i++)
            if (memcmp(&got[i], &base[i], sizeof got[i]) != 0)
                first = i;
        KT_CHECK(first == n, "%s, %s: logits differ from the one-pool run at position %zu, token %zu (%.9g vs %.9g)",
                 preset, cases[c].what, first / m->hp.n_vocab, first % m->hp.n_vocab, first < n ? got[first] : 0.0,
                 first < n ? base[first] : 0.0);
        free(got);
    }
    free(base);
    free(homes);
    free(replicas);
    remove_synth(m, path);
}

static void replicas_spread_pairs_over_both_nodes(void)
{
    char path[1024];
    struct kt_model *m = open_synth("tiny", path, sizeof path);
    if (!m)
        return;
    const size_t n_experts = (size_t)m->hp.n_layer * m->hp.n_expert;
    int *homes = calloc(n_experts, sizeof *homes);
    uint16_t *replicas = calloc(n_experts, sizeof *replicas);
    for (size_t i = 0; i < n_experts; i++)
        replicas[i] = 1u << 1;
    const struct kt_engine_params with = {
        .n_threads = 2, .topology = TWO_NODES, .expert_home_nodes = homes, .expert_replica_nodes = replicas};
    const struct kt_engine_params without = {.n_threads = 2, .topology = TWO_NODES, .expert_home_nodes = homes};
    uint64_t pairs[2][2] = {{0}};
    for (int r = 0; r < 2; r++) {
        struct kt_engine *e = engine(m, r ? &with : &without);
        if (!e)
            continue;
        struct kt_batch_token bt[PROMPT_LEN];
        for (uint32_t i = 0; i < PROMPT_LEN; i++)
            bt[i] = (struct kt_batch_token){prompt[i], 0, i, false};
        kt_err err = {0};
        KT_CHECK(kt_engine_seq_add(e, 0, &err) == KT_OK && kt_engine_step(e, &(struct kt_batch){PROMPT_LEN, bt}, NULL,
                                                                          &err) == KT_OK,
                 "prefill: %s", err.msg);
        struct kt_engine_stats st;
        kt_engine_stats(e, &st);
        pairs[r][0] = st.node_pairs[0];
        pairs[r][1] = st.node_pairs[1];
        printf("  %s replicas: node 0 ran %llu pairs, node 1 %llu\n", r ? "with" : "without",
               (unsigned long long)pairs[r][0], (unsigned long long)pairs[r][1]);
        kt_engine_destroy(e);
    }
    KT_CHECK(pairs[0][0] > 0 && pairs[0][1] == 0, "without replicas every pair runs on node 0 (home)");
    const uint64_t total = pairs[1][0] + pairs[1][1];
    KT_CHECK(total == pairs[0][0] && pairs[1][1] * 4 >= total && pairs[1][0] * 4 >= total,
             "with replicas on node 1 both nodes take at least a quarter of the pairs (%llu / %llu)",
             (unsigned long long)pairs[1][0], (unsigned long long)pairs[1][1]);
    free(homes);
    free(replicas);
    remove_synth(m, path);
}

/* kt_engine_move_expert: a moved expert runs on its new node's pool from the
 * next step; what cannot move is refused with a reason and stays. */
static void moved_experts_run_on_their_new_node(void)
{
    char path[1024];
    struct kt_model *m = open_synth("tiny", path, sizeof path);
    if (!m)
        return;
    const size_t n_experts = (size_t)m->hp.n_layer * m->hp.n_expert;
    int *homes = calloc(n_experts, sizeof *homes); /* all on node 0 */
    uint16_t *replicas = calloc(n_experts, sizeof *replicas);
    struct kt_engine *e = engine(m, &(struct kt_engine_params){.n_threads = 2, .topology = TWO_NODES,
                                                                 .expert_home_nodes = homes});
    kt_err err = {0};
    uint32_t il = 0;
    while (il < m->hp.n_layer && !m->layers[il].is_moe)
        il++;
    if (e) {
        const uint64_t before = kt_engine_expert_store_bytes(e);
        for (uint32_t x = 0; x < m->hp.n_expert; x++) /* every expert of every MoE layer to node 1 */
            for (uint32_t l = 0; l < m->hp.n_layer; l++)
                if (m->layers[l].is_moe)
                    KT_CHECK(kt_engine_move_expert(e, l, x, 1, &err) == KT_OK, "layer %u expert %u: %s", l, x, err.msg);
        KT_CHECK(kt_engine_expert_store_bytes(e) > before, "the moved copies are counted");
        struct kt_batch_token bt[PROMPT_LEN];
        for (uint32_t i = 0; i < PROMPT_LEN; i++)
            bt[i] = (struct kt_batch_token){prompt[i], 0, i, false};
        KT_CHECK(kt_engine_seq_add(e, 0, &err) == KT_OK &&
                     kt_engine_step(e, &(struct kt_batch){PROMPT_LEN, bt}, NULL, &err) == KT_OK,
                 "prefill: %s", err.msg);
        struct kt_engine_stats st;
        kt_engine_stats(e, &st);
        KT_CHECK(st.node_pairs[0] == 0 && st.node_pairs[1] > 0, "after the moves node 1 runs every pair (%llu / %llu)",
                 (unsigned long long)st.node_pairs[0], (unsigned long long)st.node_pairs[1]);
        struct {
            uint32_t il, x;
            int node;
            kt_status want;
            const char *needle;
        } bad[] = {
            {il, 0, 1, KT_ERR_INVALID, "already has a copy on node 1"},
            {il, 0, 7, KT_ERR_INVALID, "not a node with cores"},
            {il, m->hp.n_expert, 0, KT_ERR_INVALID, "no routed expert"},
        };
        for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
            err = (kt_err){0};
            KT_CHECK(kt_engine_move_expert(e, bad[i].il, bad[i].x, bad[i].node, &err) == bad[i].want &&
                         strstr(err.msg, bad[i].needle),
                     "refusal %zu: %s", i, err.msg);
        }
        kt_engine_destroy(e);
    }
    for (size_t i = 0; replicas && i < n_experts; i++)
        replicas[i] = 1u << 1;
    e = engine(m, &(struct kt_engine_params){.n_threads = 2, .topology = TWO_NODES, .expert_home_nodes = homes,
                                             .expert_replica_nodes = replicas});
    if (e) { /* replicas come and go between steps: node 1's pool takes a share only while it holds them */
        err = (kt_err){0};
        KT_CHECK(kt_engine_move_expert(e, il, 0, 1, &err) == KT_ERR_INVALID && strstr(err.msg, "copy on node 1"),
                 "onto its replica's node: %s", err.msg);
        KT_CHECK(kt_engine_expert_drop_replica(e, il, 0, 0, &err) == KT_ERR_INVALID && strstr(err.msg, "home"),
                 "its home is no replica: %s", err.msg);
        KT_CHECK(kt_engine_expert_replica_nodes(e, il, 0) == 2, "a replica on node 1");
        for (uint32_t l = 0; l < m->hp.n_layer; l++)
            for (uint32_t x = 0; m->layers[l].is_moe && x < m->hp.n_expert; x++)
                KT_CHECK(kt_engine_expert_drop_replica(e, l, x, 1, &err) == KT_OK, "drop: %s", err.msg);
        KT_CHECK(kt_engine_expert_replica_nodes(e, il, 0) == 0 &&
                     kt_engine_expert_drop_replica(e, il, 0, 1, &err) == KT_ERR_INVALID,
                 "dropped, and not twice: %s", err.msg);
        struct kt_batch_token bt[PROMPT_LEN];
        for (uint32_t i = 0; i < PROMPT_LEN; i++)
            bt[i] = (struct kt_batch_token){prompt[i], 0, i, false};
        struct kt_engine_stats st;
        KT_CHECK(kt_engine_seq_add(e, 0, &err) == KT_OK &&
                     kt_engine_step(e, &(struct kt_batch){PROMPT_LEN / 2, bt}, NULL, &err) == KT_OK,
                 "a step without replicas: %s", err.msg);
        kt_engine_stats(e, &st);
        KT_CHECK(st.node_pairs[0] > 0 && st.node_pairs[1] == 0, "without replicas node 0 runs every pair (%llu / %llu)",
                 (unsigned long long)st.node_pairs[0], (unsigned long long)st.node_pairs[1]);
        const uint64_t before = kt_engine_expert_store_bytes(e);
        for (uint32_t l = 0; l < m->hp.n_layer; l++)
            for (uint32_t x = 0; m->layers[l].is_moe && x < m->hp.n_expert; x++) {
                struct kt_expert_copy *c = NULL;
                KT_CHECK(kt_engine_expert_copy(e, l, x, 1, &c, &err) == KT_OK &&
                             kt_engine_expert_add_replica(e, c, &err) == KT_OK,
                         "add: %s", err.msg);
            }
        KT_CHECK(kt_engine_expert_replica_nodes(e, il, 0) == 2 && kt_engine_expert_store_bytes(e) > before,
                 "replicas back on node 1, their copies counted");
        kt_engine_stats_reset(e);
        KT_CHECK(kt_engine_step(e, &(struct kt_batch){PROMPT_LEN / 2, bt + PROMPT_LEN / 2}, NULL, &err) == KT_OK,
                 "a step with replicas: %s", err.msg);
        kt_engine_stats(e, &st);
        KT_CHECK(st.node_pairs[0] > 0 && st.node_pairs[1] > 0, "with replicas both nodes run pairs (%llu / %llu)",
                 (unsigned long long)st.node_pairs[0], (unsigned long long)st.node_pairs[1]);
        kt_engine_destroy(e);
    }
    free(homes);
    free(replicas);
    remove_synth(m, path);
}

static void tiny_logits_identical_on_node_pools(void)
{
    check_identical("tiny");
}

static void tiny_v3_logits_identical_on_node_pools(void)
{
    check_identical("tiny-v3");
}

static void store_homes_experts_round_robin(void)
{
    char path[1024];
    struct kt_model *m = open_synth("tiny", path, sizeof path);
    if (!m)
        return;
    for (int nodes = 0; nodes <= 3; nodes++) {
        struct kt_expert_store *s = NULL;
        kt_err err = {0};
        struct kt_expert_store_params sp = {.round_robin_nodes = nodes};
        KT_CHECK(kt_expert_store_create(m, &sp, &s, &err) == KT_OK, "store: %s", err.msg);
        if (!s)
            continue;
        uint32_t seen = 0;
        for (uint32_t il = 0; il < m->hp.n_layer; il++) {
            if (!m->layers[il].is_moe)
                continue;
            for (uint32_t x = 0; x < m->hp.n_expert; x++) {
                const int want = nodes > 1 ? (int)(x % (uint32_t)nodes) : 0;
                const int got = kt_expert_store_expert(s, il, x)->home_node;
                KT_CHECK(got == want, "%d nodes: layer %u expert %u homes on %d, not %d", nodes, il, x, got, want);
                seen |= 1u << got;
            }
        }
        KT_CHECK(seen == (nodes > 1 ? (1u << nodes) - 1 : 1u), "%d nodes: homes used 0x%x", nodes, seen);
        kt_expert_store_destroy(s);
    }
    remove_synth(m, path);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Best decode tokens/s over a few runs of 48 steps after the prompt. */
static double decode_tok_s(struct kt_model *m, const struct kt_engine_params *p)
{
    struct kt_engine *e = engine(m, p);
    if (!e)
        return 0.0;
    const uint32_t V = kt_engine_n_vocab(e);
    float *logits = malloc((size_t)PROMPT_LEN * V * sizeof *logits);
    struct kt_batch_token bt[PROMPT_LEN];
    double best = 0.0;
    kt_err err = {0};
    for (int rep = 0; rep < 5; rep++) {
        for (uint32_t i = 0; i < PROMPT_LEN; i++)
            bt[i] = (struct kt_batch_token){prompt[i], 0, i, i + 1 == PROMPT_LEN};
        kt_engine_seq_remove(e, 0, &err);
        KT_CHECK(kt_engine_seq_add(e, 0, &err) == KT_OK, "%s", err.msg);
        KT_CHECK(kt_engine_step(e, &(struct kt_batch){PROMPT_LEN, bt}, logits, &err) == KT_OK, "%s", err.msg);
        const int steps = 48;
        double t0 = now_s();
        for (int s = 0; s < steps; s++) {
            struct kt_batch_token t = {prompt[s % PROMPT_LEN], 0, PROMPT_LEN + (uint32_t)s, true};
            KT_CHECK(kt_engine_step(e, &(struct kt_batch){1, &t}, logits, &err) == KT_OK, "%s", err.msg);
        }
        double tps = steps / (now_s() - t0);
        if (tps > best)
            best = tps;
    }
    free(logits);
    kt_engine_destroy(e);
    return best;
}

static void decode_speed_on_this_machine(void)
{
    char path[1024];
    struct kt_model *m = open_synth("tiny", path, sizeof path);
    if (!m)
        return;
    const double pool = decode_tok_s(m, &(struct kt_engine_params){.n_threads = 2, .topology = ONE_NODE});
    const double here = decode_tok_s(m, &(struct kt_engine_params){.n_threads = 2});
    const double two = decode_tok_s(m, &(struct kt_engine_params){.n_threads = 2, .topology = TWO_NODES,
                                                                    .test = &(struct kt_engine_test_params){.experts_round_robin = true}});
    printf("tiny decode, 2 threads: one pool (synthetic 1 node) %.1f tok/s, default (this machine) %.1f tok/s, "
           "synthetic 2-node pools %.1f tok/s\n",
           pool, here, two);
    KT_CHECK(pool > 0.0 && here > 0.0 && two > 0.0, "no decode speed measured");
    remove_synth(m, path);
}

/* The routed and shared experts' work is split into (expert, 64-row) tasks,
 * not experts alone, so every thread of a pool works at batch 1 - with 8
 * threads and only top-k + 1 units to run - and in a prefill: each thread
 * index's expert busy time is positive in both phases (a 32-token prefill
 * run 8 times, 24 decode steps). */
static void every_thread_works_at_batch_1_and_in_prefill(void)
{
    char path[1024];
    struct kt_model *m = open_synth("tiny", path, sizeof path);
    if (!m)
        return;
    enum { THREADS = 8, PREFILL = 32, STEPS = 24 }; /* engine(): 64 positions */
    const struct kt_engine_params p = {.n_threads = THREADS, .topology = "package:1 numa:1 core:8 pu:1"};
    struct kt_engine *e = engine(m, &p);
    kt_err err = {0};
    struct kt_batch_token bt[PREFILL];
    for (uint32_t i = 0; i < PREFILL; i++)
        bt[i] = (struct kt_batch_token){(int32_t)(i * 37 % m->hp.n_vocab), 0, i, false};
    KT_CHECK(e && kt_engine_seq_add(e, 0, &err) == KT_OK, "%s", err.msg);
    for (int phase = 0; e && phase < 2; phase++) {
        kt_engine_stats_reset(e);
        if (phase == 0) { /* the prompt 8 times over (8 threads share 2 cores here: one may sit out a step) */
            for (int r = 0; r < 8; r++)
                KT_CHECK(kt_engine_seq_truncate(e, 0, 0, &err) == KT_OK &&
                             kt_engine_step(e, &(struct kt_batch){PREFILL, bt}, NULL, &err) == KT_OK,
                         "prefill: %s", err.msg);
        } else {
            for (uint32_t s = 0; s < STEPS; s++) {
                struct kt_batch_token t = {(int32_t)(s * 11 % m->hp.n_vocab), 0, PREFILL + s, false};
                KT_CHECK(kt_engine_step(e, &(struct kt_batch){1, &t}, NULL, &err) == KT_OK, "decode: %s", err.msg);
            }
        }
        struct kt_engine_stats st;
        kt_engine_stats(e, &st);
        int idle = 0;
        printf("  %s, expert busy ms by thread:", phase ? "decode (batch 1)" : "prefill (32 tokens)");
        for (int i = 0; i < THREADS; i++) {
            printf(" %.2f", st.thread_busy_ns[i] * 1e-6);
            idle += st.thread_busy_ns[i] == 0;
        }
        printf("\n");
        KT_CHECK(idle == 0, "%s: %d of %d threads ran no expert task", phase ? "decode" : "prefill", idle, THREADS);
        KT_CHECK(st.thread_busy_ns[THREADS] == 0, "a thread index past the pool's %d threads", THREADS);
    }
    kt_engine_destroy(e);
    remove_synth(m, path);
}

int main(void)
{
    KT_RUN(every_thread_works_at_batch_1_and_in_prefill);
    KT_RUN(store_homes_experts_round_robin);
    KT_RUN(tiny_logits_identical_on_node_pools);
    KT_RUN(replicas_spread_pairs_over_both_nodes);
    KT_RUN(moved_experts_run_on_their_new_node);
    KT_RUN(tiny_v3_logits_identical_on_node_pools);
    KT_RUN(decode_speed_on_this_machine);
    return kt_test_finish();
}
