/*
 * test_place_ranks.c - kt-place over the ranks of an MPI job
 * (placement/ranks_plan.h, kt-place --ranks / --machine per rank).
 *
 * Proves: the split balances predicted stage time, counts rank 0's
 * embedding and head, gives a faster rank more layers, and keeps every
 * rank within its memory - each case one where the even split by count
 * (what runtime/dist does without a plan) is worse or does not fit; a
 * split that cannot fit is refused naming why; a Kimi-K2-shaped header
 * (61 layers, a dense first layer) over a small and a large machine gets a
 * plan whose config resolves back to each rank's plan over its layers;
 * the config's ranks[r].placement is read (and bad ones refused with the
 * line); kt-place writes the file (and nothing when it refuses).  The
 * links: a message costs latency + bytes / bandwidth of the slower host by
 * pipeline.c's message sizes (checked by hand), every Kimi-K2 stage carries
 * exactly its link's time, a slow link moves layers (split alone, and a slow
 * third host over 3 ranks); bad `network` figures are refused naming the key.
 * Devices: a rank with a device gets more layers than on its CPU alone, its
 * plan's experts only in its stage and within its budget (12 GiB holds fewer
 * than 64), its written placement resolving as its stage; a device too small
 * for one layer's attention is refused; kt-place --device sim plans the rank
 * whose machine file has a sim.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config.h"
#include "cost.h"
#include "machine.h"
#include "meminfo.h"
#include "model.h"
#include "plan.h"
#include "ranks_plan.h"
#include "testlib.h"

#define GIB (1ull << 30)

/* ---- the split alone ------------------------------------------------------------ */

/* 8 layers: 0-1 dense and cheap (1 ms, 1 GiB), 2-7 MoE (4 ms, 10 GiB), the same on both ranks. */
static void fill_dense_then_moe(double *t, uint64_t *b, int ranks, double slower_rank1)
{
    for (int r = 0; r < ranks; r++)
        for (int il = 0; il < 8; il++) {
            t[r * 8 + il] = (il < 2 ? 1e-3 : 4e-3) * (r == 1 ? slower_rank1 : 1);
            b[r * 8 + il] = il < 2 ? GIB : 10 * GIB;
        }
}

static void split_balances_time_not_count(void)
{
    double t[16];
    uint64_t b[16];
    const uint64_t cap[2] = {0, 0}; /* memory unknown: time alone */
    uint32_t first[2];
    kt_err err = {0};
    fill_dense_then_moe(t, b, 2, 1);
    /* even 4/4: 10 ms and 16 ms; 5/3: 14 and 12 - the slowest stage 14 < 16 */
    KT_CHECK(kt_rank_split(8, 2, t, 0, b, 0, cap, first, &err) == KT_OK, "%s", err.msg);
    KT_CHECK(first[0] == 0 && first[1] == 5, "rank 1 starts at layer %u, want 5 (the even split's 4 is slower)",
             first[1]);
    /* rank 0's head (3 ms) moves a layer back: 4/4 is 13 and 16, 5/3 is 17 and 12 */
    KT_CHECK(kt_rank_split(8, 2, t, 3e-3, b, 0, cap, first, &err) == KT_OK, "%s", err.msg);
    KT_CHECK(first[1] == 4, "with the head on rank 0, rank 1 starts at layer %u, want 4", first[1]);
}

static void a_faster_rank_gets_more_layers(void)
{
    double t[18];
    uint64_t b[18];
    const uint64_t cap[2] = {0, 0};
    uint32_t first[2];
    kt_err err = {0};
    for (int i = 0; i < 18; i++) {
        t[i] = i < 9 ? 1e-3 : 2e-3; /* rank 1 is twice as slow */
        b[i] = GIB;
    }
    KT_CHECK(kt_rank_split(9, 2, t, 0, b, 0, cap, first, &err) == KT_OK, "%s", err.msg);
    KT_CHECK(first[1] == 6, "rank 1 (twice as slow) starts at layer %u, want 6 (6 ms each; even 5/4: 5 and 8)",
             first[1]);
}

static void split_keeps_every_rank_within_its_memory(void)
{
    double t[16];
    uint64_t b[16];
    uint32_t first[2];
    kt_err err = {0};
    fill_dense_then_moe(t, b, 2, 1);
    /* rank 0 has 20 GiB: the even split's 22 GiB (4 layers) does not fit; 3 layers (12 GiB) do */
    const uint64_t cap[2] = {20 * GIB, 200 * GIB};
    KT_CHECK(kt_rank_split(8, 2, t, 0, b, 0, cap, first, &err) == KT_OK, "%s", err.msg);
    KT_CHECK(first[1] == 3, "rank 1 starts at layer %u, want 3 (rank 0 holds at most 3 layers)", first[1]);
    /* the embedding and head count on rank 0: 9 GiB more leaves room for the two dense layers only */
    KT_CHECK(kt_rank_split(8, 2, t, 0, b, 9 * GIB, cap, first, &err) == KT_OK, "%s", err.msg);
    KT_CHECK(first[1] == 2, "with a 9 GiB head, rank 1 starts at layer %u, want 2", first[1]);
}

static void three_equal_ranks_split_evenly(void)
{
    double t[18];
    uint64_t b[18];
    const uint64_t cap[3] = {0, 0, 0};
    uint32_t first[3];
    kt_err err = {0};
    for (int i = 0; i < 18; i++)
        t[i] = 1e-3, b[i] = GIB;
    KT_CHECK(kt_rank_split(6, 3, t, 0, b, 0, cap, first, &err) == KT_OK, "%s", err.msg);
    KT_CHECK(first[0] == 0 && first[1] == 2 && first[2] == 4, "3 ranks of 6 equal layers: %u %u %u", first[0],
             first[1], first[2]);
}

static void a_split_that_cannot_fit_is_refused(void)
{
    double t[16];
    uint64_t b[16];
    uint32_t first[2];
    kt_err err = {0};
    fill_dense_then_moe(t, b, 2, 1);
    const uint64_t small[2] = {30 * GIB, 30 * GIB}; /* the model is 62 GiB */
    KT_CHECK(kt_rank_split(8, 2, t, 0, b, 0, small, first, &err) == KT_ERR_INVALID, "62 GiB fitted in 60");
    KT_CHECK(strstr(err.msg, "fits their memory") && strstr(err.msg, "60.00 GiB"), "message: %s", err.msg);
    /* enough in all, but rank 1 cannot hold even one MoE layer */
    const uint64_t lopsided[2] = {200 * GIB, 5 * GIB};
    err = (kt_err){0};
    KT_CHECK(kt_rank_split(8, 2, t, 0, b, 0, lopsided, first, &err) == KT_ERR_INVALID, "rank 1 held a layer");
    KT_CHECK(strstr(err.msg, "rank 1, the last") && strstr(err.msg, "less than the last layer"), "message: %s",
             err.msg);
    err = (kt_err){0};
    const uint64_t cap[3] = {0, 0, 0};
    double t3[27];
    uint64_t b3[27];
    for (int i = 0; i < 27; i++)
        t3[i] = 1e-3, b3[i] = GIB;
    KT_CHECK(kt_rank_split(2, 3, t3, 0, b3, 0, cap, first, &err) == KT_ERR_INVALID &&
                 strstr(err.msg, "3 ranks for 2 layers"),
             "3 ranks for 2 layers: %s", err.msg);
}

/* ---- a Kimi-K2-shaped header over two machines ------------------------------------------ */
/* (at 200 GiB the small machine's rank 0 would take layers 0-20, 597 ms against rank 1's 610: time-bound;
 * at 150 GiB, below, memory binds) */

static char kimi[1024];

static struct kt_model *kimi_header(void)
{
    if (!kimi[0])
        return kt_test_synth_model("kimi-k2-slice", "--layers 61 --experts 384 --header-only", kimi, sizeof kimi);
    struct kt_model *m = NULL;
    kt_err err = {0};
    KT_CHECK(kt_model_open(kimi, &m, &err) == KT_OK, "%s", err.msg);
    return m;
}

static void machine(struct kt_machine *mach, int nodes, double gib_per_node, double triad)
{
    kt_machine_defaults(mach, nodes);
    for (int n = 0; n < nodes; n++) {
        mach->nodes[n].memory_bytes = (uint64_t)(gib_per_node * (double)GIB);
        mach->nodes[n].triad_gbps = triad;
        for (int ty = 0; ty < KT_TYPE_COUNT; ty++)
            if (mach->nodes[n].decode[ty].gbps > 0)
                mach->nodes[n].decode[ty].gbps = 0.7 * triad;
    }
}

static void kimi_over_a_small_and_a_large_machine(void)
{
    struct kt_model *m = kimi_header();
    if (!m)
        return;
    KT_CHECK(m->hp.n_layer == 61 && m->hp.n_dense_lead >= 1, "%u layers, %u dense", m->hp.n_layer,
             m->hp.n_dense_lead);
    struct kt_machine small, large;
    machine(&small, 1, 150, 40);  /* 150 GiB: much less than half the model */
    machine(&large, 2, 512, 60);  /* 1 TiB over two faster nodes */
    struct kt_cost_model *cs = NULL, *cl = NULL;
    kt_err err = {0};
    KT_CHECK(kt_cost_create(m, NULL, &small, &cs, &err) == KT_OK && kt_cost_create(m, NULL, &large, &cl, &err) == KT_OK,
             "%s", err.msg);
    const struct kt_rank_input in[2] = {{.mach = &small, .cost = cs, .name = "small"},
                                        {.mach = &large, .cost = cl, .name = "large"}};
    const struct kt_planner_options o = {.device = KT_PLACE_CPU, .kv_tokens = 8192};
    struct kt_rank_plan *rp = NULL;
    KT_CHECK(kt_plan_ranks(m, "kimi", NULL, 2, in, &o, &rp, &err) == KT_OK, "%s", err.msg);
    if (rp) {
        const struct kt_rank_stage *s = rp->stages;
        printf("  kimi: rank 0 layers %u-%u (%.1f GiB of %.1f), rank 1 layers %u-%u (%.1f GiB of %.1f); decode "
               "%.1f / %.1f ms; even split fits: %d\n", s[0].first, s[0].last, (double)s[0].bytes / GIB,
               (double)s[0].capacity / GIB, s[1].first, s[1].last, (double)s[1].bytes / GIB,
               (double)s[1].capacity / GIB, 1e3 * s[0].decode_s, 1e3 * s[1].decode_s, rp->even_fits);
        KT_CHECK(!rp->even_fits, "the even split fitted the 150 GiB rank");
        KT_CHECK(s[0].first == 0 && s[1].first == s[0].last + 1 && s[1].last == 60, "ranges %u-%u %u-%u", s[0].first,
                 s[0].last, s[1].first, s[1].last);
        KT_CHECK(s[0].last < 30, "rank 0 holds layers 0-%u, no fewer than the even split's 0-30", s[0].last);
        for (int r = 0; r < 2; r++)
            KT_CHECK(s[r].fits && s[r].bytes + kt_meminfo_margin_bytes(s[r].bytes) <= s[r].capacity,
                     "rank %d: %.1f GiB in %.1f", r, (double)s[r].bytes / GIB, (double)s[r].capacity / GIB);
        /* memory bound rank 0, not time: one more MoE layer would not fit, though its stage is the faster */
        const uint64_t more = s[0].bytes + (uint64_t)m->hp.n_expert * kt_layer_expert_bytes(m, s[0].last + 1);
        KT_CHECK(more + kt_meminfo_margin_bytes(more) > s[0].capacity, "rank 0 had room for layer %u", s[0].last + 1);
        KT_CHECK(s[0].decode_s < s[1].decode_s, "rank 0 %.3f ms, rank 1 %.3f ms", 1e3 * s[0].decode_s,
                 1e3 * s[1].decode_s);
        char *text = kt_rank_plan_yaml(rp, "kimi", NULL, in);
        KT_CHECK(text != NULL, "no text");
        if (text) {
            KT_CHECK(kt_rank_plan_check_yaml(rp, text, strlen(text), "kimi-ranks.yaml", m, &err) == KT_OK, "%s",
                     err.msg);
            struct kt_placement_config *c = NULL;
            KT_CHECK(kt_placement_config_parse(text, strlen(text), "kimi-ranks.yaml", &c, &err) == KT_OK, "%s",
                     err.msg);
            if (c) {
                /* rank 1's own placement: its machine's two nodes, its layers' experts spread over both */
                struct kt_placement *p1 = NULL;
                const struct kt_placement_config *own = kt_placement_config_rank_placement(c, 1);
                KT_CHECK(own && kt_placement_resolve(own, m, 2, NULL, &p1, &err) == KT_OK, "%s", err.msg);
                if (p1) {
                    const uint32_t il = s[1].first;
                    uint32_t on[2] = {0, 0};
                    for (uint32_t x = 0; x < p1->n_expert; x++)
                        on[p1->layers[il].experts[x].node & 1]++;
                    KT_CHECK(p1->layers[il].cpu_sliced || (on[0] > 0 && on[1] > 0),
                             "layer %u on rank 1: %u and %u experts on its nodes", il, on[0], on[1]);
                }
                kt_placement_destroy(p1);
                KT_CHECK(kt_placement_config_rank_placement(c, 0) != NULL, "rank 0 has no placement");
            }
            kt_placement_config_destroy(c);
        }
        free(text);
    }
    /* the same model on two small machines: refused, naming the memory */
    const struct kt_rank_input twice[2] = {{.mach = &small, .cost = cs, .name = "small"},
                                           {.mach = &small, .cost = cs, .name = "small"}};
    struct kt_rank_plan *none = NULL;
    err = (kt_err){0};
    KT_CHECK(kt_plan_ranks(m, "kimi", NULL, 2, twice, &o, &none, &err) == KT_ERR_INVALID && !none,
             "two 150 GiB ranks took Kimi-K2");
    KT_CHECK(strstr(err.msg, "kimi") && strstr(err.msg, "fits their memory"), "message: %s", err.msg);
    /* a rank whose machine lacks the accelerator asked of it */
    struct kt_rank_input asked[2] = {in[0], in[1]};
    large.n_accel = 0;
    asked[1].device = KT_PLACE_SIM;
    err = (kt_err){0};
    KT_CHECK(kt_plan_ranks(m, "kimi", NULL, 2, asked, &o, &none, &err) == KT_ERR_INVALID &&
                 strstr(err.msg, "rank 1 (large)") && strstr(err.msg, "no sim accelerator"),
             "a device its machine lacks: %s", err.msg);
    kt_rank_plan_destroy(rp);
    kt_cost_destroy(cs);
    kt_cost_destroy(cl);
    kt_model_close(m);
}

/* ---- the config's ranks[r].placement --------------------------------------------------- */

static void parse_expect(const char *text, const char *want)
{
    struct kt_placement_config *c = NULL;
    kt_err err = {0};
    kt_status st = kt_placement_config_parse(text, strlen(text), "r.yaml", &c, &err);
    if (!want) {
        KT_CHECK(st == KT_OK, "refused: %s", err.msg);
    } else {
        KT_CHECK(st == KT_ERR_FORMAT && strstr(err.msg, want), "want '%s', got %s", want,
                 st ? err.msg : "accepted");
    }
    kt_placement_config_destroy(c);
}

static void config_reads_each_ranks_placement(void)
{
    parse_expect("version: 1\nattention: cpu\nranks:\n  - layers: 0-1\n    placement:\n      version: 1\n"
                 "      attention: cpu\n      cpu:\n        nodes: [0]\n  - layers: 2-3\n",
                 NULL);
    parse_expect("version: 1\nattention: cpu\nranks:\n  - layers: 0-1\n    placement: 3\n", "r.yaml:5:16: "
                 "ranks[0].placement");
    parse_expect("version: 1\nattention: cpu\nranks:\n  - layers: 0-3\n    placement:\n      version: 1\n"
                 "      attention: gpu0\n", "r.yaml:7:18");
    parse_expect("version: 1\nattention: cpu\nranks:\n  - layers: 0-3\n    placement:\n      version: 1\n"
                 "      attention: cpu\n      ranks:\n        - layers: 0-3\n", "cannot list ranks");
    parse_expect("version: 1\nattention: cpu\nranks:\n  - layers: 0-3\n    placement:\n      attention: cpu\n",
                 "version: missing");
    parse_expect("version: 1\nattention: cpu\nranks:\n  - layers: 0-3\n    machine: a.json\n", "unknown key "
                 "'machine'");
    /* what the accessor gives */
    const char *text = "version: 1\nattention: cpu\nranks:\n  - layers: 0-1\n  - layers: 2-3\n    placement:\n"
                       "      version: 1\n      attention: cpu\n      kv_cache:\n        tokens: 77\n";
    struct kt_placement_config *c = NULL;
    kt_err err = {0};
    KT_CHECK(kt_placement_config_parse(text, strlen(text), "r.yaml", &c, &err) == KT_OK, "%s", err.msg);
    if (c) {
        KT_CHECK(kt_placement_config_rank_placement(c, 0) == NULL, "rank 0 got a placement");
        KT_CHECK(kt_placement_config_rank_placement(c, 1) != NULL, "rank 1 has none");
        KT_CHECK(kt_placement_config_rank_placement(c, 2) == NULL && kt_placement_config_rank_placement(c, -1) == NULL,
                 "out of range");
    }
    kt_placement_config_destroy(c);
}

/* ---- the tool ------------------------------------------------------------------------ */

static void write_machine(const char *path, int nodes, double gib, double triad)
{
    FILE *f = fopen(path, "w");
    KT_CHECK(f != NULL, "cannot write %s", path);
    if (!f)
        return;
    fprintf(f, "{\"version\": 1, \"kind\": \"another host\", \"topology\": \"\", \"nodes\": [");
    for (int n = 0; n < nodes; n++)
        fprintf(f, "%s{\"node\": %d, \"threads\": 8, \"memory_gib\": %g, \"triad_gbps\": %g}", n ? ", " : "", n, gib,
                triad);
    fprintf(f, "], \"accelerators\": []}\n");
    fclose(f);
}

static void kt_place_writes_the_ranks_config(void)
{
    if (!kimi[0]) {
        struct kt_model *m = kimi_header();
        kt_model_close(m);
    }
    char small[1024], large[1024], out[1024], log[1024];
    snprintf(small, sizeof small, "%s", kt_test_path("ranks-small.json"));
    snprintf(large, sizeof large, "%s", kt_test_path("ranks-large.json"));
    snprintf(out, sizeof out, "%s", kt_test_path("ranks-kimi.yaml"));
    snprintf(log, sizeof log, "%s", kt_test_path("ranks-kimi.log"));
    write_machine(small, 1, 200, 40);
    write_machine(large, 2, 512, 60);
    unlink(out);
    int rc = kt_test_system("%s -m %s --machine %s --machine %s --kv-tokens 8192 -o %s >%s 2>&1",
                            kt_test_tool("kt-place"), kimi, small, large, out, log);
    size_t n = 0;
    char *text = kt_test_read_file(log, &n);
    KT_CHECK(rc == 0 && text && strstr(text, "2 MPI ranks planned") && strstr(text, "does not fit"),
             "kt-place: exit %d, %s", rc, text ? text : "");
    free(text);
    struct kt_placement_config *c = NULL;
    kt_err err = {0};
    KT_CHECK(kt_placement_config_load(out, &c, &err) == KT_OK, "%s", err.msg);
    if (c) {
        uint32_t a, b;
        KT_CHECK(kt_placement_config_ranks(c) == 2, "%d ranks", kt_placement_config_ranks(c));
        kt_placement_config_rank_layers(c, 1, &a, &b);
        KT_CHECK(a > 0 && a <= 30 && b == 60, "rank 1 holds %u-%u", a, b);
    }
    kt_placement_config_destroy(c);
    /* two small machines: refused, nothing written */
    unlink(out);
    rc = kt_test_system("%s -m %s --machine %s --machine %s -o %s >%s 2>&1", kt_test_tool("kt-place"), kimi, small,
                        small, out, log);
    text = kt_test_read_file(log, &n);
    KT_CHECK(rc == 1 && text && strstr(text, "fits their memory") && access(out, F_OK) != 0,
             "two small machines: exit %d, %s", rc, text ? text : "");
    free(text);
    /* --device sim on the stated defaults (a sim of 0 GiB): refused, naming the missing budget */
    rc = kt_test_system("%s -m %s --ranks 2 --device sim -o %s >%s 2>&1", kt_test_tool("kt-place"), kimi, out, log);
    text = kt_test_read_file(log, &n);
    KT_CHECK(rc == 1 && text && strstr(text, "no memory budget") && strstr(text, "--gpu-memory"),
             "--ranks with --device on defaults: exit %d, %s", rc, text ? text : "");
    free(text);
    /* --device cuda where no rank's machine has one */
    rc = kt_test_system("%s -m %s --machine %s --machine %s --device cuda -o %s >%s 2>&1", kt_test_tool("kt-place"),
                        kimi, small, large, out, log);
    text = kt_test_read_file(log, &n);
    KT_CHECK(rc == 1 && text && strstr(text, "no rank's machine file has a cuda accelerator"),
             "--device cuda without one: exit %d, %s", rc, text ? text : "");
    free(text);
    rc = kt_test_system("%s -m %s --ranks 3 --machine %s --machine %s -o %s >%s 2>&1", kt_test_tool("kt-place"), kimi,
                        small, large, out, log);
    KT_CHECK(rc == 2, "--ranks 3 with 2 machine files: exit %d", rc);
}

/* ---- the link between stages ------------------------------------------------------------- */

static void the_link_costs_latency_and_bytes(void)
{
    struct kt_machine a, b;
    kt_machine_defaults(&a, 1);
    kt_machine_defaults(&b, 1);
    KT_CHECK(a.net_gbps == 1.25 && a.net_latency_us == 50 && !a.network_given, "defaults %g GB/s %g us",
             a.net_gbps, a.net_latency_us);
    a.net_gbps = 1, a.net_latency_us = 100; /* the slower host sets both figures */
    b.net_gbps = 10, b.net_latency_us = 20;
    /* 4 tokens in 2 STEP messages: each a 160-byte header and 2 tokens of 16 bytes (192, a multiple of 64) and
     * 2 x 7168 floats */
    double want = 2 * (100e-6 + (192.0 + 2 * 7168 * 4) / 1e9), got = kt_rank_link_seconds(&a, &b, 7168, 4, 2, true);
    KT_CHECK(fabs(got - want) < 1e-12 && kt_rank_link_seconds(&b, &a, 7168, 4, 2, true) == got,
             "4 tokens in 2: %.9g s, want %.9g", got, want);
    /* 3 tokens in one STEP: 160 + 48 = 208 bytes of header, padded to 256 */
    want = 100e-6 + (256.0 + 3 * 7168 * 4) / 1e9, got = kt_rank_link_seconds(&a, &b, 7168, 3, 1, true);
    KT_CHECK(fabs(got - want) < 1e-12, "3 tokens: %.9g s, want %.9g", got, want);
    /* 5 tokens in 2 STEPs, sliced as the pipeline does (2 then 3): headers of 192 and 256 bytes */
    want = 2 * 100e-6 + (192.0 + 256.0 + 5 * 7168 * 4) / 1e9, got = kt_rank_link_seconds(&a, &b, 7168, 5, 2, true);
    KT_CHECK(fabs(got - want) < 1e-12, "a step of 5 tokens in 2: %.9g s, want %.9g", got, want);
    /* the RESULT back to rank 0 carries no tokens: 192-byte headers */
    want = 2 * 100e-6 + (2 * 192.0 + 5 * 7168 * 4) / 1e9, got = kt_rank_link_seconds(&a, &b, 7168, 5, 2, false);
    KT_CHECK(fabs(got - want) < 1e-12, "a result of 5 tokens: %.9g s, want %.9g", got, want);
}

static void a_slow_link_moves_layers(void)
{
    double t[27];
    uint64_t b[27];
    const uint64_t cap[3] = {0, 0, 0};
    uint32_t first[3];
    kt_err err = {0};
    for (int i = 0; i < 27; i++)
        t[i] = 1e-3, b[i] = GIB;
    double link[3] = {0, 0, 0};
    struct kt_rank_split_input in = {.n_layer = 9, .n_ranks = 3, .layer_s = t, .layer_bytes = b, .capacity = cap,
                                     .link_s = link};
    KT_CHECK(kt_rank_split_with(&in, first, &err) == KT_OK && first[1] == 3 && first[2] == 6, "%s: %u %u",
             err.msg, first[1], first[2]);
    /* rank 1's link out costs 2.5 layers: 4/1/4 (4, 3.5, 4 ms) beats 3/3/3 (3, 5.5, 3) and 4/2/3 (4, 4.5, 3) */
    link[1] = 2.5e-3;
    KT_CHECK(kt_rank_split_with(&in, first, &err) == KT_OK && first[1] == 4 && first[2] == 5,
             "with rank 1's link slow: %u %u, want 4 5 (%s)", first[1], first[2], err.msg);
    /* the same cost on every link moves nothing */
    link[0] = link[1] = link[2] = 2.5e-3;
    KT_CHECK(kt_rank_split_with(&in, first, &err) == KT_OK && first[1] == 3 && first[2] == 6,
             "every link alike: %u %u", first[1], first[2]);
}

/* Kimi-K2 over equal machines: the stages carry the link's time by the bytes the pipeline sends, and a slow
 * host's links move layers off its stage and its predecessor's. */
static void kimi_stages_pay_their_links(void)
{
    struct kt_model *m = kimi_header();
    if (!m)
        return;
    struct kt_machine fast, slow;
    machine(&fast, 2, 512, 60);
    machine(&slow, 2, 512, 60);
    slow.net_gbps = 0.01, slow.net_latency_us = 1000;
    struct kt_cost_model *cf = NULL, *cs = NULL;
    kt_err err = {0};
    KT_CHECK(kt_cost_create(m, NULL, &fast, &cf, &err) == KT_OK && kt_cost_create(m, NULL, &slow, &cs, &err) == KT_OK,
             "%s", err.msg);
    const struct kt_planner_options o = {.kv_tokens = 8192};
    const struct kt_rank_input ff[2] = {{.mach = &fast, .cost = cf, .name = "fast"}, {.mach = &fast, .cost = cf, .name = "fast"}};
    const struct kt_rank_input fs[2] = {{.mach = &fast, .cost = cf, .name = "fast"}, {.mach = &slow, .cost = cs, .name = "slow"}};
    struct kt_rank_plan *a = NULL, *b = NULL;
    KT_CHECK(kt_plan_ranks(m, "kimi", NULL, 2, ff, &o, &a, &err) == KT_OK, "%s", err.msg);
    KT_CHECK(kt_plan_ranks(m, "kimi", NULL, 2, fs, &o, &b, &err) == KT_OK, "%s", err.msg);
    if (a && b) {
        /* one token a decode step, each way one message of 192 header bytes and 7168 floats; the prefill's 512
         * tokens go whole: 160 + 512 x 16 header bytes (8352, padded to 8384) to rank 1, 192 back */
        const double step = 1e-3 + (192.0 + 7168 * 4) / 1e7;
        const double pre_out = 1e-3 + (8384.0 + 512.0 * 7168 * 4) / 1e7, pre_back = 1e-3 + (192.0 + 512.0 * 7168 * 4) / 1e7;
        const double fast_step = 50e-6 + (192.0 + 7168 * 4) / 1.25e9;
        for (int r = 0; r < 2; r++) {
            KT_CHECK(fabs(b->stages[r].link_decode_s - step) < 1e-12 && fabs(a->stages[r].link_decode_s - fast_step) < 1e-12,
                     "rank %d's link a step: %.9g s slow (want %.9g), %.9g fast (want %.9g)", r,
                     b->stages[r].link_decode_s, step, a->stages[r].link_decode_s, fast_step);
            KT_CHECK(a->stages[r].first == b->stages[r].first, "rank %d starts at %u and %u: equal links on both "
                     "stages moved layers", r, a->stages[r].first, b->stages[r].first);
            /* the decode objective: the step's time a token, link included */
            const double dd = b->stages[r].decode_s - a->stages[r].decode_s, want = step - fast_step;
            KT_CHECK(fabs(dd - want) < 1e-9 && fabs(b->stages[r].objective_s - a->stages[r].objective_s - want) < 1e-9,
                     "rank %d's stage grew %.9g s, want %.9g", r, dd, want);
        }
        KT_CHECK(fabs(b->stages[0].link_prefill_s - pre_out) < 1e-9 && fabs(b->stages[1].link_prefill_s - pre_back) < 1e-9,
                 "prefill links %.9g %.9g, want %.9g %.9g", b->stages[0].link_prefill_s, b->stages[1].link_prefill_s,
                 pre_out, pre_back);
        char *text = kt_rank_plan_yaml(b, "kimi", NULL, fs);
        KT_CHECK(text && strstr(text, "link out"), "no link in the comments");
        free(text);
    }
    kt_rank_plan_destroy(a);
    kt_rank_plan_destroy(b);
    /* three ranks, the last one's host slow (50 ms a message): its stage and rank 1's (which sends to it) pay
     * it, so rank 0 takes more layers */
    slow.net_gbps = 1.25, slow.net_latency_us = 50000;
    kt_cost_destroy(cs);
    cs = NULL;
    KT_CHECK(kt_cost_create(m, NULL, &slow, &cs, &err) == KT_OK, "%s", err.msg);
    const struct kt_rank_input f3[3] = {ff[0], ff[0], ff[0]};
    const struct kt_rank_input s3[3] = {ff[0], ff[0], {.mach = &slow, .cost = cs, .name = "slow"}};
    a = b = NULL;
    KT_CHECK(kt_plan_ranks(m, "kimi", NULL, 3, f3, &o, &a, &err) == KT_OK, "%s", err.msg);
    KT_CHECK(kt_plan_ranks(m, "kimi", NULL, 3, s3, &o, &b, &err) == KT_OK, "%s", err.msg);
    if (a && b) {
        printf("  3 ranks: rank 0 holds layers 0-%u with fast links, 0-%u with the last host's slow\n",
               a->stages[0].last, b->stages[0].last);
        KT_CHECK(b->stages[0].last > a->stages[0].last, "rank 0 holds 0-%u with slow links, 0-%u without",
                 b->stages[0].last, a->stages[0].last);
        KT_CHECK(b->stages[1].link_decode_s > 0.05 && b->stages[2].link_decode_s > 0.05 &&
                     b->stages[0].link_decode_s < 1e-3,
                 "links %.4g %.4g %.4g s", b->stages[0].link_decode_s, b->stages[1].link_decode_s,
                 b->stages[2].link_decode_s);
    }
    kt_rank_plan_destroy(a);
    kt_rank_plan_destroy(b);
    kt_cost_destroy(cf);
    kt_cost_destroy(cs);
    kt_model_close(m);
}

/* ---- a rank with a device of its own ------------------------------------------------------- */

/* mach with a device of `gib` planned as a GPU (the sim entry, not sharing the host, at GPU rates). */
static void with_device(struct kt_machine *mach, double gib)
{
    struct kt_machine_accel *a = &mach->accel[0];
    mach->n_accel = 1;
    a->memory_bytes = (uint64_t)(gib * (double)GIB);
    a->shares_host = false;
    for (int ty = 0; ty < KT_TYPE_COUNT; ty++) {
        a->decode[ty] = (struct kt_machine_rate){.gbps = 1000, .overhead_us = 10};
        a->prefill_gflops[ty] = 50000;
    }
}

/* The experts rank r's plan puts on its device, and whether any lies outside its stage. */
static uint32_t device_experts(const struct kt_rank_plan *rp, int r, bool *outside)
{
    const struct kt_plan *plan = rp->plans[r];
    const struct kt_placement *p = plan->placement;
    uint32_t n = 0;
    *outside = false;
    for (uint32_t il = 0; il < p->n_layer; il++)
        for (uint32_t x = 0; p->layers[il].experts && x < p->n_expert; x++)
            if (p->layers[il].experts[x].device != 0) {
                n++;
                *outside |= il < rp->stages[r].first || il > rp->stages[r].last;
            }
    return n;
}

/* The written config resolves rank r's own placement as its stage, within its device's budget. */
static void check_rank_placement(const struct kt_rank_plan *rp, const struct kt_rank_input *in, int r,
                                 const struct kt_model *m, double budget_gib)
{
    kt_err err = {0};
    char *text = kt_rank_plan_yaml(rp, "kimi", NULL, in);
    KT_CHECK(text != NULL, "no text");
    if (!text)
        return;
    KT_CHECK(kt_rank_plan_check_yaml(rp, text, strlen(text), "hybrid.yaml", m, &err) == KT_OK, "%s", err.msg);
    struct kt_placement_config *c = NULL;
    KT_CHECK(kt_placement_config_parse(text, strlen(text), "hybrid.yaml", &c, &err) == KT_OK, "%s", err.msg);
    const struct kt_placement_config *own = c ? kt_placement_config_rank_placement(c, r) : NULL;
    struct kt_placement *p = NULL;
    KT_CHECK(own && kt_placement_resolve(own, m, in[r].mach->n_nodes, NULL, &p, &err) == KT_OK, "%s", err.msg);
    if (p) {
        KT_CHECK(p->n_devices == 2 && p->stage_begin == rp->stages[r].first && p->stage_end == rp->stages[r].last + 1,
                 "%d devices, stage %u-%u", p->n_devices, p->stage_begin, p->stage_end);
        KT_CHECK(p->n_devices == 2 && p->devices[1].bytes <= (uint64_t)(budget_gib * (double)GIB) &&
                     p->devices[1].bytes == rp->stages[r].device_bytes,
                 "rank %d's device holds %llu bytes of %g GiB (the stage says %llu)", r,
                 (unsigned long long)(p->n_devices == 2 ? p->devices[1].bytes : 0), budget_gib,
                 (unsigned long long)rp->stages[r].device_bytes);
        KT_CHECK(p->layers[rp->stages[r].first].attention == 1, "rank %d's attention is not on its device", r);
    }
    kt_placement_destroy(p);
    kt_placement_config_destroy(c);
    free(text);
}

static void a_device_rank_gets_more_layers(void)
{
    struct kt_model *m = kimi_header();
    if (!m)
        return;
    struct kt_machine cpu, hyb;
    machine(&cpu, 1, 1024, 40);
    cpu.n_accel = 0;
    machine(&hyb, 1, 1024, 40); /* the same RAM and CPU, and a 64 GiB device */
    with_device(&hyb, 64);
    struct kt_cost_model *cc = NULL, *ch = NULL;
    kt_err err = {0};
    KT_CHECK(kt_cost_create(m, NULL, &cpu, &cc, &err) == KT_OK && kt_cost_create(m, NULL, &hyb, &ch, &err) == KT_OK,
             "%s", err.msg);
    const struct kt_planner_options o = {.kv_tokens = 8192};
    struct kt_rank_input in[2] = {{.mach = &cpu, .cost = cc, .name = "cpu"},
                                  {.mach = &hyb, .cost = ch, .name = "hybrid", .device = KT_PLACE_CPU}};
    struct kt_rank_plan *without = NULL, *with = NULL;
    KT_CHECK(kt_plan_ranks(m, "kimi", NULL, 2, in, &o, &without, &err) == KT_OK, "%s", err.msg);
    in[1].device = KT_PLACE_SIM;
    KT_CHECK(kt_plan_ranks(m, "kimi", NULL, 2, in, &o, &with, &err) == KT_OK, "%s", err.msg);
    if (without && with) {
        const struct kt_rank_stage *a = &without->stages[1], *s = &with->stages[1];
        const uint32_t n_cpu = a->last - a->first + 1, n_dev = s->last - s->first + 1;
        printf("  rank 1 on its CPU: layers %u-%u (%.1f ms a step); with its device: %u-%u (%.1f ms, %.1f of %.1f "
               "GiB there, %d splits)\n", a->first, a->last, 1e3 * a->decode_s, s->first, s->last, 1e3 * s->decode_s,
               (double)s->device_bytes / GIB, (double)s->device_capacity / GIB, with->rounds);
        KT_CHECK(n_dev > n_cpu, "rank 1 holds %u layers with its device, %u without", n_dev, n_cpu);
        KT_CHECK(s->decode_s / n_dev < a->decode_s / n_cpu, "its layers are no faster with the device");
        KT_CHECK(s->device && s->fits && s->device_bytes <= 64 * GIB && s->device_capacity == 64 * GIB,
                 "device %d, %llu bytes of %llu", s->device, (unsigned long long)s->device_bytes,
                 (unsigned long long)s->device_capacity);
        KT_CHECK(!with->stages[0].device && with->plans[0]->accel == 0, "rank 0 got a device");
        bool outside = false;
        const uint32_t n = device_experts(with, 1, &outside);
        KT_CHECK(n > 0 && !outside, "%u experts on rank 1's device, %s outside its stage", n, outside ? "some" : "none");
        check_rank_placement(with, in, 1, m, 64);
    }
    kt_rank_plan_destroy(without);
    kt_rank_plan_destroy(with);
    kt_cost_destroy(cc);
    kt_cost_destroy(ch);
    kt_model_close(m);
}

static void a_small_device_holds_no_more_than_its_budget(void)
{
    struct kt_model *m = kimi_header();
    if (!m)
        return;
    struct kt_machine cpu, big, small, tiny;
    machine(&cpu, 1, 1024, 40);
    cpu.n_accel = 0;
    machine(&big, 1, 1024, 40);
    with_device(&big, 64);
    machine(&small, 1, 1024, 40);
    with_device(&small, 12);
    machine(&tiny, 1, 1024, 40);
    with_device(&tiny, 0.05);
    struct kt_cost_model *cc = NULL, *cb = NULL, *cs = NULL, *ct = NULL;
    kt_err err = {0};
    KT_CHECK(kt_cost_create(m, NULL, &cpu, &cc, &err) == KT_OK && kt_cost_create(m, NULL, &big, &cb, &err) == KT_OK &&
                 kt_cost_create(m, NULL, &small, &cs, &err) == KT_OK && kt_cost_create(m, NULL, &tiny, &ct, &err) == KT_OK,
             "%s", err.msg);
    const struct kt_planner_options o = {.kv_tokens = 8192};
    const struct kt_rank_input ib[2] = {{.mach = &cpu, .cost = cc, .name = "cpu"},
                                        {.mach = &big, .cost = cb, .name = "big", .device = KT_PLACE_SIM}};
    const struct kt_rank_input is[2] = {{.mach = &cpu, .cost = cc, .name = "cpu"},
                                        {.mach = &small, .cost = cs, .name = "small", .device = KT_PLACE_SIM}};
    struct kt_rank_plan *pb = NULL, *ps = NULL;
    KT_CHECK(kt_plan_ranks(m, "kimi", NULL, 2, ib, &o, &pb, &err) == KT_OK, "%s", err.msg);
    KT_CHECK(kt_plan_ranks(m, "kimi", NULL, 2, is, &o, &ps, &err) == KT_OK, "%s", err.msg);
    if (pb && ps) {
        bool outside = false;
        const uint32_t nb = device_experts(pb, 1, &outside), ns = device_experts(ps, 1, &outside);
        const struct kt_plan *plan = ps->plans[1];
        const struct kt_placement_device *d = &plan->placement->devices[plan->accel];
        printf("  rank 1's device: %u experts in 64 GiB, %u in 12 GiB (%.2f GiB used)\n", nb, ns,
               (double)d->bytes / GIB);
        KT_CHECK(!outside && ns < nb, "%u experts in 12 GiB, %u in 64", ns, nb);
        /* every byte there within the budget: the experts no more than what the other parts left */
        const uint64_t eb = kt_layer_expert_bytes(m, ps->stages[1].first);
        KT_CHECK(d->bytes <= 12 * GIB && (uint64_t)d->n_experts * eb <= 12 * GIB - (d->bytes - d->part_bytes[KT_PART_ROUTED_EXPERTS]),
                 "%llu bytes, %u experts of %llu bytes in 12 GiB", (unsigned long long)d->bytes, d->n_experts,
                 (unsigned long long)eb);
        check_rank_placement(ps, is, 1, m, 12);
    }
    kt_rank_plan_destroy(pb);
    kt_rank_plan_destroy(ps);
    /* 50 MiB holds not one layer's attention: refused, naming the rank and its budget */
    const struct kt_rank_input it[2] = {{.mach = &cpu, .cost = cc, .name = "cpu"},
                                        {.mach = &tiny, .cost = ct, .name = "tiny-device", .device = KT_PLACE_SIM}};
    struct kt_rank_plan *none = NULL;
    err = (kt_err){0};
    KT_CHECK(kt_plan_ranks(m, "kimi", NULL, 2, it, &o, &none, &err) == KT_ERR_INVALID && !none &&
                 strstr(err.msg, "rank 1 (tiny-device)") && strstr(err.msg, "budget"),
             "a 50 MiB device: %s", err.msg);
    kt_cost_destroy(cc);
    kt_cost_destroy(cb);
    kt_cost_destroy(cs);
    kt_cost_destroy(ct);
    kt_model_close(m);
}

/* ---- machine files ------------------------------------------------------------------------- */

static void network_expect(const char *network, const char *want)
{
    char text[512];
    snprintf(text, sizeof text, "{\"version\": 1, \"kind\": \"k\", \"nodes\": [{\"node\": 0, \"threads\": 1, "
             "\"memory_gib\": 4, \"triad_gbps\": 10}]%s%s}", network ? ", \"network\": " : "", network ? network : "");
    struct kt_machine *mach = NULL;
    kt_err err = {0};
    const kt_status st = kt_machine_parse(text, strlen(text), "m.json", &mach, &err);
    if (want)
        KT_CHECK(st == KT_ERR_FORMAT && strstr(err.msg, want), "%s: want '%s', got %s", network, want,
                 st ? err.msg : "accepted");
    else
        KT_CHECK(st == KT_OK, "%s refused: %s", network ? network : "no network", err.msg);
    free(mach);
}

static void bad_network_figures_are_refused(void)
{
    network_expect("{\"bandwidth_gbps\": -1}", "m.json: network.bandwidth_gbps: expected a non-negative number");
    network_expect("{\"bandwidth_gbps\": \"fast\"}", "network.bandwidth_gbps: expected a non-negative number");
    network_expect("{\"bandwidth_gbps\": 0}", "network.bandwidth_gbps: expected a positive number");
    network_expect("{\"latency_us\": -5}", "network.latency_us: expected a non-negative number");
    network_expect("{\"latency_us\": 1e9}", "network.latency_us: 1e+09 is beyond any real machine");
    network_expect("{\"speed\": 1}", "network: unknown key 'speed' (known: bandwidth_gbps, latency_us)");
    network_expect("3", "network: expected an object");
    network_expect(NULL, NULL);
    network_expect("{\"latency_us\": 0}", NULL);
    /* given figures are kept, missing ones defaulted, and a save keeps them */
    const char *text = "{\"version\": 1, \"kind\": \"k\", \"nodes\": [{\"node\": 0}], \"network\": "
                       "{\"bandwidth_gbps\": 12.5}}";
    struct kt_machine *mach = NULL, *back = NULL;
    kt_err err = {0};
    KT_CHECK(kt_machine_parse(text, strlen(text), "m.json", &mach, &err) == KT_OK, "%s", err.msg);
    if (mach) {
        KT_CHECK(mach->network_given && mach->net_gbps == 12.5 && mach->net_latency_us == 50, "%g GB/s %g us",
                 mach->net_gbps, mach->net_latency_us);
        const char *path = kt_test_path("network-machine.json");
        KT_CHECK(kt_machine_save(mach, path, &err) == KT_OK && kt_machine_load(path, &back, &err) == KT_OK, "%s",
                 err.msg);
        KT_CHECK(back && back->network_given && back->net_gbps == 12.5 && back->net_latency_us == 50,
                 "saved and loaded: %g GB/s", back ? back->net_gbps : 0);
        unlink(path);
    }
    free(mach);
    free(back);
}

/* kt-place --device sim over a CPU machine and one with a sim: rank 1 plans its stage hybrid, the file
 * loads and rank 1's placement resolves with its device and its layers' experts there. */
static void kt_place_plans_a_hybrid_rank(void)
{
    struct kt_model *m = kimi_header();
    if (!m)
        return;
    char cpu[1024], hyb[1024], out[1024], log[1024];
    snprintf(cpu, sizeof cpu, "%s", kt_test_path("ranks-cpu.json"));
    snprintf(hyb, sizeof hyb, "%s", kt_test_path("ranks-hybrid.json"));
    snprintf(out, sizeof out, "%s", kt_test_path("ranks-hybrid.yaml"));
    snprintf(log, sizeof log, "%s", kt_test_path("ranks-hybrid.log"));
    write_machine(cpu, 1, 1024, 40);
    FILE *f = fopen(hyb, "w");
    KT_CHECK(f != NULL, "cannot write %s", hyb);
    if (f) {
        fprintf(f, "{\"version\": 1, \"kind\": \"a host with a device\", \"nodes\": [{\"node\": 0, \"threads\": 8, "
                "\"memory_gib\": 1024, \"triad_gbps\": 40}], \"accelerators\": [{\"name\": \"sim\", \"backend\": "
                "\"sim\", \"memory_gib\": 48, \"shares_host\": false}], \"network\": {\"bandwidth_gbps\": 12.5, "
                "\"latency_us\": 5}}\n");
        fclose(f);
    }
    unlink(out);
    int rc = kt_test_system("%s -m %s --machine %s --machine %s --device sim --kv-tokens 8192 -o %s >%s 2>&1",
                            kt_test_tool("kt-place"), kimi, cpu, hyb, out, log);
    size_t n = 0;
    char *text = kt_test_read_file(log, &n);
    KT_CHECK(rc == 0 && text && strstr(text, "its sim (sim) with 48.00 GiB") && strstr(text, "link ms") &&
                 strstr(text, "network 12.5 GB/s, 5 us") && strstr(text, "rank 0 (") && strstr(text, "assumed"),
             "kt-place --device sim: exit %d, %s", rc, text ? text : "");
    free(text);
    struct kt_placement_config *c = NULL;
    kt_err err = {0};
    KT_CHECK(kt_placement_config_load(out, &c, &err) == KT_OK, "%s", err.msg);
    const struct kt_placement_config *own = c ? kt_placement_config_rank_placement(c, 1) : NULL;
    struct kt_placement *p = NULL;
    KT_CHECK(own && kt_placement_resolve(own, m, 1, NULL, &p, &err) == KT_OK, "%s", err.msg);
    if (p) {
        uint32_t first, last, on = 0, off = 0;
        kt_placement_config_rank_layers(c, 1, &first, &last);
        for (uint32_t il = 0; il < p->n_layer; il++)
            for (uint32_t x = 0; p->layers[il].experts && x < p->n_expert; x++)
                if (p->layers[il].experts[x].device && il >= first && il <= last)
                    on++;
                else if (p->layers[il].experts[x].device)
                    off++;
        KT_CHECK(p->n_devices == 2 && p->devices[1].backend == KT_PLACE_SIM && p->layers[first].attention == 1 &&
                     p->devices[1].bytes <= 48 * GIB,
                 "rank 1's placement: %d devices", p->n_devices);
        KT_CHECK(on > 0 && off == 0, "%u experts of its layers on its device, %u of others", on, off);
    }
    kt_placement_destroy(p);
    KT_CHECK(c && kt_placement_config_rank_placement(c, 0), "rank 0 has no placement");
    kt_placement_config_destroy(c);
    /* a rank's machine file with a bad network figure: refused naming the file and the key, nothing written */
    f = fopen(hyb, "w");
    if (f) {
        fprintf(f, "{\"version\": 1, \"kind\": \"k\", \"nodes\": [{\"node\": 0, \"memory_gib\": 1024}], "
                "\"network\": {\"bandwidth_gbps\": -1}}\n");
        fclose(f);
    }
    unlink(out);
    rc = kt_test_system("%s -m %s --machine %s --machine %s -o %s >%s 2>&1", kt_test_tool("kt-place"), kimi, cpu, hyb,
                        out, log);
    text = kt_test_read_file(log, &n);
    KT_CHECK(rc == 1 && text && strstr(text, "ranks-hybrid.json") &&
                 strstr(text, "network.bandwidth_gbps: expected a non-negative number") && access(out, F_OK) != 0,
             "a bad network figure: exit %d, %s", rc, text ? text : "");
    free(text);
    kt_model_close(m);
}

int main(void)
{
    KT_RUN(split_balances_time_not_count);
    KT_RUN(a_faster_rank_gets_more_layers);
    KT_RUN(split_keeps_every_rank_within_its_memory);
    KT_RUN(three_equal_ranks_split_evenly);
    KT_RUN(a_split_that_cannot_fit_is_refused);
    KT_RUN(kimi_over_a_small_and_a_large_machine);
    KT_RUN(config_reads_each_ranks_placement);
    KT_RUN(kt_place_writes_the_ranks_config);
    KT_RUN(the_link_costs_latency_and_bytes);
    KT_RUN(a_slow_link_moves_layers);
    KT_RUN(kimi_stages_pay_their_links);
    KT_RUN(a_device_rank_gets_more_layers);
    KT_RUN(a_small_device_holds_no_more_than_its_budget);
    KT_RUN(bad_network_figures_are_refused);
    KT_RUN(kt_place_plans_a_hybrid_rank);
    unlink(kimi);
    return kt_test_finish();
}
