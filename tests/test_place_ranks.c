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
 * line); kt-place writes the file (and nothing when it refuses).
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
    /* a rank with a device is refused: a stage runs on its host's CPU */
    const struct kt_planner_options sim = {.device = KT_PLACE_SIM};
    err = (kt_err){0};
    KT_CHECK(kt_plan_ranks(m, "kimi", NULL, 2, in, &sim, &none, &err) == KT_ERR_INVALID &&
                 strstr(err.msg, "host's CPU"),
             "a device: %s", err.msg);
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
    /* usage: a device, or --ranks against the machine files' count */
    rc = kt_test_system("%s -m %s --ranks 2 --device sim -o %s >%s 2>&1", kt_test_tool("kt-place"), kimi, out, log);
    text = kt_test_read_file(log, &n);
    KT_CHECK(rc == 2 && text && strstr(text, "host's CPU"), "--ranks with --device: exit %d, %s", rc,
             text ? text : "");
    free(text);
    rc = kt_test_system("%s -m %s --ranks 3 --machine %s --machine %s -o %s >%s 2>&1", kt_test_tool("kt-place"), kimi,
                        small, large, out, log);
    KT_CHECK(rc == 2, "--ranks 3 with 2 machine files: exit %d", rc);
    unlink(kimi);
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
    return kt_test_finish();
}
