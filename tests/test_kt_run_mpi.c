/*
 * test_kt_run_mpi.c - kt-run over the ranks of an MPI job (runtime/dist):
 * `mpirun -np N --oversubscribe kt-run ...` on this one machine, the
 * model's layers split over N ranks, prints the same greedy tokens as one
 * process and writes logits within 1e-6 of its, for 2 and 3 ranks, on
 * both families (tiny: Kimi-K2 layout; tiny-v3: DeepSeek-V3, a dense first
 * layer), with a prompt prefilled in several chunks (--batch); more ranks
 * than layers is refused with a message and a non-zero exit; a placement
 * config's ranks: section sets uneven ranges (and must list as many ranks
 * as the job has); each rank applies its own part of a kt-place plan over
 * two machines (ranks[r].placement: rank 1 on two NUMA nodes, rank 0 on
 * one) with the same text and logits, and a rank with a sim device of its own
 * (a hybrid stage) too, hand-written and as kt-place --device sim plans it
 * for a rank whose machine file has a sim; `mpirun kt-bench model` reports once,
 * with each phase's pipeline account and the link model's figure beside it; `mpirun kt-bench
 * network` measures every hop of the ring and writes each rank's into its machine file.
 *
 * Skipped (visibly) when kt was built without MPI or mpirun is absent.
 */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "machine.h"
#include "model.h"
#include "mpi_harness.h"
#include "ranks_plan.h"
#include "testlib.h"

static char mpirun[1024];

/* mpirun with what this machine needs: root allowed (CI runs as root in a
 * fresh Debian root), oversubscription (2 cores, 3 ranks), and the TCP and
 * self transports only (shared-memory single copy is not there in every
 * container). */
static const char *mpirun_cmd(int n)
{
    static char cmd[2048];
    snprintf(cmd, sizeof cmd,
             "%s -np %d --oversubscribe %s --mca btl self,tcp --mca btl_tcp_if_include lo "
             "--mca oob_tcp_if_include lo",
             mpirun, n, getuid() == 0 ? "--allow-run-as-root" : "");
    return cmd;
}

static void ranks_match_one_process(const char *preset)
{
    char model[1024], single[64];
    snprintf(model, sizeof model, "%s", kt_test_path(preset));
    strcat(model, ".gguf");
    int rc = kt_test_system("%s --preset %s -o %s >/dev/null 2>&1", kt_test_tool("kt-synth"), preset, model);
    KT_CHECK(rc == 0, "kt-synth --preset %s: %d", preset, rc);
    snprintf(single, sizeof single, "mpi-%s-1", preset);
    rc = mpi_run_kt_run("", model, single, 300);
    KT_CHECK(rc == 0, "kt-run alone on %s: exit %d", preset, rc);
    for (int n = 2; n <= 3; n++) {
        char tag[64];
        snprintf(tag, sizeof tag, "mpi-%s-%d", preset, n);
        rc = mpi_run_kt_run(mpirun_cmd(n), model, tag, 300);
        KT_CHECK(rc == 0, "mpirun -np %d kt-run on %s: exit %d (see %s.log)", n, preset, rc, kt_test_path(tag));
        if (rc == 0)
            mpi_compare_runs(single, tag);
    }
}

static void tiny_over_2_and_3_ranks_matches_one_process(void)
{
    ranks_match_one_process("tiny");
}

static void tiny_v3_over_2_and_3_ranks_matches_one_process(void)
{
    ranks_match_one_process("tiny-v3");
}

/* configs' ranks: section: rank 0 holds layer 0 alone, rank 1 layers 1-3 -
 * the same text and logits; a job of another size than it lists is refused. */
static void placement_ranks_set_uneven_layers(void)
{
    char model[1024], cfg[1024];
    snprintf(model, sizeof model, "%s.gguf", kt_test_path("tiny"));
    snprintf(cfg, sizeof cfg, "%s", kt_test_path("mpi-ranks.yaml"));
    FILE *f = fopen(cfg, "w");
    KT_CHECK(f != NULL, "cannot write %s", cfg);
    if (!f)
        return;
    fputs("version: 1\nattention: cpu\nranks:\n  - layers: 0-0\n  - layers: 1-3\n", f);
    fclose(f);
    char with_cfg[3000];
    snprintf(with_cfg, sizeof with_cfg, "%s", model);
    /* mpi_run_kt_run takes the model path; the option rides along after it */
    strcat(with_cfg, " --placement ");
    strcat(with_cfg, cfg);
    int rc = mpi_run_kt_run(mpirun_cmd(2), with_cfg, "mpi-tiny-ranks", 300);
    KT_CHECK(rc == 0, "mpirun -np 2 kt-run --placement (ranks 0-0, 1-3): exit %d", rc);
    if (rc == 0)
        mpi_compare_runs("mpi-tiny-1", "mpi-tiny-ranks");
    char log[1024];
    snprintf(log, sizeof log, "%s.log", kt_test_path("mpi-tiny-ranks"));
    size_t n = 0;
    char *text = kt_test_read_file(log, &n);
    KT_CHECK(text && strstr(text, "layers [0, 1)") && strstr(text, "layers [1, 4)"),
             "the ranks did not hold layers 0-0 and 1-3: %s", text ? text : "");
    free(text);
    const char *bad = kt_test_path("mpi-ranks-3.log");
    rc = kt_test_system("timeout 120 %s %s -m %s --placement %s -p hi -n 2 -t 1 >/dev/null 2>%s", mpirun_cmd(3),
                        kt_test_tool("kt-run"), model, cfg, bad);
    text = kt_test_read_file(bad, &n);
    KT_CHECK(rc != 0 && text && strstr(text, "lists 2 ranks, but mpirun started 3"),
             "3 ranks for a 2-rank config: exit %d, %s", rc, text ? text : "");
    free(text);
}

/* A machine file of `nodes` nodes (kt-place's figures for another host). */
static void write_machine(const char *path, int nodes, double triad)
{
    FILE *f = fopen(path, "w");
    KT_CHECK(f != NULL, "cannot write %s", path);
    if (!f)
        return;
    fprintf(f, "{\"version\": 1, \"kind\": \"a rank's host\", \"topology\": \"\", \"nodes\": [");
    for (int n = 0; n < nodes; n++)
        fprintf(f, "%s{\"node\": %d, \"threads\": 1, \"memory_gib\": 4, \"triad_gbps\": %g}", n ? ", " : "", n,
                triad);
    fprintf(f, "], \"accelerators\": []}\n");
    fclose(f);
}

/* kt-place over a 1-node and a 2-node machine writes each rank's own placement (ranks[r].placement); under
 * mpirun every rank applies its own (rank 1 spreads its layers' experts over two nodes of a synthetic
 * topology, rank 0 keeps one): the same text and logits as one process with the same file. */
static void each_rank_applies_its_own_placement(void)
{
    char model[1024], cfg[1024], m0[1024], m1[1024];
    snprintf(model, sizeof model, "%s.gguf", kt_test_path("tiny"));
    snprintf(cfg, sizeof cfg, "%s", kt_test_path("mpi-cluster.yaml"));
    snprintf(m0, sizeof m0, "%s", kt_test_path("mpi-rank0.json"));
    snprintf(m1, sizeof m1, "%s", kt_test_path("mpi-rank1.json"));
    write_machine(m0, 1, 10);
    write_machine(m1, 2, 20);
    int rc = kt_test_system("%s -m %s --machine %s --machine %s --kv-tokens 128 -o %s >/dev/null 2>&1",
                            kt_test_tool("kt-place"), model, m0, m1, cfg);
    KT_CHECK(rc == 0, "kt-place --machine x2: exit %d", rc);
    if (rc != 0)
        return;
    char with_cfg[3000];
    snprintf(with_cfg, sizeof with_cfg, "%s --placement %s", model, cfg);
    setenv("KT_TOPOLOGY_SYNTHETIC", "numa:2 core:1 pu:1", 1); /* two nodes for rank 1's placement */
    rc = mpi_run_kt_run("", with_cfg, "mpi-cluster-1", 300);
    KT_CHECK(rc == 0, "kt-run --placement (one process): exit %d", rc);
    const int rc2 = mpi_run_kt_run(mpirun_cmd(2), with_cfg, "mpi-cluster-2", 300);
    unsetenv("KT_TOPOLOGY_SYNTHETIC");
    KT_CHECK(rc2 == 0, "mpirun -np 2 kt-run --placement (each rank its own): exit %d", rc2);
    if (rc == 0 && rc2 == 0)
        mpi_compare_runs("mpi-cluster-1", "mpi-cluster-2");
    char log[1024];
    snprintf(log, sizeof log, "%s.log", kt_test_path("mpi-cluster-2"));
    size_t n = 0;
    char *text = kt_test_read_file(log, &n);
    /* each rank describes its placement as its stage: rank 0's own holds the dense layer 0 alone (kt-place
     * gives the faster rank 1 the MoE layers), so no routed expert and no NUMA line, rank 1's both nodes (the
     * file's top level, which one process runs, spreads over both: a rank that ran it would name them twice) */
    int one_node = 0, two_nodes = 0;
    for (const char *at = text; at && (at = strstr(at, "NUMA nodes: 0: ")); at++) {
        const char *eol = strchr(at, '\n');
        const char *second = strstr(at, "; 1: ");
        if (second && (!eol || second < eol))
            two_nodes++;
        else
            one_node++;
    }
    KT_CHECK(one_node == 0 && two_nodes == 1, "placements on one node %d, on two %d (want 0 and 1): %s", one_node,
             two_nodes, text ? text : "");
    KT_CHECK(text && strstr(text, "a pipeline stage: layers 0-0 held") && strstr(text, "a pipeline stage: layers 1-3 held"),
             "the ranks did not describe their stages: %s", text ? text : "");
    free(text);
}

/* A hybrid stage: rank 1's own placement puts its layers' attention and 8 experts a layer on a sim device,
 * rank 0 runs on the CPU; the sim computes what the CPU does, so the text and logits are one CPU process's
 * (the file's top level), and rank 1's device did the work. */
static void a_rank_with_a_sim_device(void)
{
    char model[1024], cfg[1024];
    snprintf(model, sizeof model, "%s.gguf", kt_test_path("tiny"));
    snprintf(cfg, sizeof cfg, "%s", kt_test_path("mpi-hybrid.yaml"));
    FILE *f = fopen(cfg, "w");
    KT_CHECK(f != NULL, "cannot write %s", cfg);
    if (!f)
        return;
    fputs("version: 1\nattention: cpu\nranks:\n  - layers: 0-1\n  - layers: 2-3\n    placement:\n"
          "      version: 1\n      devices:\n        sim: {backend: sim, memory_gib: 1}\n      attention: sim\n"
          "      shared_experts: sim\n      experts:\n        sim:\n          per_layer: 8\n", f);
    fclose(f);
    char with_cfg[3000];
    snprintf(with_cfg, sizeof with_cfg, "%s --placement %s", model, cfg);
    int rc = mpi_run_kt_run("", with_cfg, "mpi-hybrid-1", 300);
    KT_CHECK(rc == 0, "kt-run --placement (one process, CPU): exit %d", rc);
    const int rc2 = mpi_run_kt_run(mpirun_cmd(2), with_cfg, "mpi-hybrid-2", 300);
    KT_CHECK(rc2 == 0, "mpirun -np 2 kt-run, rank 1 with a sim device: exit %d", rc2);
    if (rc == 0 && rc2 == 0)
        mpi_compare_runs("mpi-hybrid-1", "mpi-hybrid-2");
    char log[1024];
    snprintf(log, sizeof log, "%s.log", kt_test_path("mpi-hybrid-2"));
    size_t n = 0;
    char *text = kt_test_read_file(log, &n);
    const char *line = text ? strstr(text, "kt-run: rank 1 (") : NULL;
    const char *dev = line ? strstr(line, "its device busy ") : NULL;
    const char *eol = line ? strchr(line, '\n') : NULL;
    KT_CHECK(dev && (!eol || dev < eol) && atof(dev + 16) > 0, "rank 1's device did no work: %s", text ? text : "");
    free(text);
}

/* kt-place --device sim over a CPU host and a host with a sim: rank 1's own placement is its stage planned
 * hybrid (attention and its layers' experts on its sim, within the budget); under mpirun each rank applies
 * its own and the text and logits are one CPU process's (the file's top level), rank 1's device busy. */
static void kt_place_plans_a_hybrid_rank(void)
{
    char model[1024], cfg[1024], m0[1024], m1[1024];
    snprintf(model, sizeof model, "%s.gguf", kt_test_path("tiny"));
    snprintf(cfg, sizeof cfg, "%s", kt_test_path("mpi-place-hybrid.yaml"));
    snprintf(m0, sizeof m0, "%s", kt_test_path("mpi-cpu-host.json"));
    snprintf(m1, sizeof m1, "%s", kt_test_path("mpi-sim-host.json"));
    write_machine(m0, 1, 10);
    FILE *f = fopen(m1, "w");
    KT_CHECK(f != NULL, "cannot write %s", m1);
    if (!f)
        return;
    fputs("{\"version\": 1, \"kind\": \"a rank's host with a sim\", \"nodes\": [{\"node\": 0, \"threads\": 1, "
          "\"memory_gib\": 4, \"triad_gbps\": 10}], \"accelerators\": [{\"name\": \"sim\", \"backend\": \"sim\", "
          "\"memory_gib\": 1, \"shares_host\": false}], \"network\": {\"bandwidth_gbps\": 10, \"latency_us\": 5}}\n",
          f);
    fclose(f);
    const char *log = kt_test_path("mpi-place-hybrid.log");
    int rc = kt_test_system("%s -m %s --machine %s --machine %s --device sim --kv-tokens 128 -o %s >%s 2>&1",
                            kt_test_tool("kt-place"), model, m0, m1, cfg, log);
    size_t n = 0;
    char *text = kt_test_read_file(log, &n);
    KT_CHECK(rc == 0 && text && strstr(text, "its sim (sim)"), "kt-place --device sim: exit %d: %s", rc,
             text ? text : "");
    free(text);
    if (rc != 0)
        return;
    char with_cfg[3000];
    snprintf(with_cfg, sizeof with_cfg, "%s --placement %s", model, cfg);
    rc = mpi_run_kt_run("", with_cfg, "mpi-place-hybrid-1", 300);
    KT_CHECK(rc == 0, "kt-run --placement (one process, CPU): exit %d", rc);
    const int rc2 = mpi_run_kt_run(mpirun_cmd(2), with_cfg, "mpi-place-hybrid-2", 300);
    KT_CHECK(rc2 == 0, "mpirun -np 2 kt-run with kt-place's hybrid rank 1: exit %d", rc2);
    if (rc == 0 && rc2 == 0)
        mpi_compare_runs("mpi-place-hybrid-1", "mpi-place-hybrid-2");
    char run_log[1024];
    snprintf(run_log, sizeof run_log, "%s.log", kt_test_path("mpi-place-hybrid-2"));
    text = kt_test_read_file(run_log, &n);
    const char *line = text ? strstr(text, "kt-run: rank 1 (") : NULL;
    const char *dev = line ? strstr(line, "its device busy ") : NULL;
    const char *eol = line ? strchr(line, '\n') : NULL;
    KT_CHECK(dev && (!eol || dev < eol) && atof(dev + 16) > 0, "rank 1's device did no work: %s", text ? text : "");
    free(text);
}

/* mpirun -np 2 kt-bench model: rank 0 reports, with each phase's pipeline account (steps, every rank's busy
 * time, the communication a step, the bubble) in its text and its JSON; the ranks: section's layers hold. */
static void kt_bench_model_over_ranks(void)
{
    char model[1024], cfg[1024], json[1024], out[1024], log[1024];
    snprintf(model, sizeof model, "%s.gguf", kt_test_path("tiny"));
    snprintf(cfg, sizeof cfg, "%s", kt_test_path("mpi-bench-ranks.yaml"));
    snprintf(json, sizeof json, "%s", kt_test_path("mpi-bench.json"));
    snprintf(out, sizeof out, "%s", kt_test_path("mpi-bench.txt"));
    snprintf(log, sizeof log, "%s", kt_test_path("mpi-bench.log"));
    FILE *f = fopen(cfg, "w");
    KT_CHECK(f != NULL, "cannot write %s", cfg);
    if (!f)
        return;
    fputs("version: 1\nattention: cpu\nranks:\n  - layers: 0-0\n  - layers: 1-3\n", f);
    fclose(f);
    int rc = kt_test_system("timeout 300 %s %s model -m %s --placement %s -t 1 --prompt-tokens 32 --gen-tokens 8 "
                            "--json %s >%s 2>%s", mpirun_cmd(2), kt_test_tool("kt-bench"), model, cfg, json, out, log);
    KT_CHECK(rc == 0, "mpirun -np 2 kt-bench model: exit %d (see %s)", rc, log);
    size_t n = 0;
    char *text = kt_test_read_file(out, &n), *err = kt_test_read_file(log, &n);
    KT_CHECK(text && strstr(text, "pipeline of 2 MPI ranks") && strstr(text, "pipeline, decode") &&
                 strstr(text, "communication") && strstr(text, "bubble"),
             "no pipeline lines: %s", text ? text : "");
    KT_CHECK(err && strstr(err, "layers [1, 4)"), "rank 1 did not hold layers 1-3: %s", err ? err : "");
    /* one report: rank 0's */
    const char *report = text ? strstr(text, "kt-bench model:") : NULL;
    KT_CHECK(report && !strstr(report + 1, "kt-bench model:"), "not one report: %s", text ? text : "");
    free(text), free(err);
    char *body = kt_test_read_file(json, &n);
    json_t *j = body ? json_loads(body, 0, NULL) : NULL;
    json_t *pd = json_object_get(json_object_get(j, "decode"), "pipeline");
    json_t *busy = json_object_get(pd, "busy_seconds");
    KT_CHECK(json_integer_value(json_object_get(pd, "ranks")) == 2 &&
                 json_integer_value(json_object_get(pd, "steps")) == 8,
             "decode pipeline: %s", body ? body : "(no JSON)");
    KT_CHECK(json_array_size(busy) == 2 && json_real_value(json_array_get(busy, 0)) > 0 &&
                 json_real_value(json_array_get(busy, 1)) > 0,
             "busy seconds of both ranks");
    const double bubble = json_real_value(json_object_get(pd, "bubble"));
    const double comm = json_real_value(json_object_get(pd, "communication_seconds_per_step"));
    KT_CHECK(bubble > 0 && bubble < 1 && comm >= 0 && comm < 1, "bubble %g, communication %g s a step", bubble, comm);
    /* beside it kt-place's link model of the step, from the two hops measured before the run */
    const double link = json_real_value(json_object_get(pd, "link_model_seconds_per_step"));
    json_t *hops = json_object_get(j, "hops");
    KT_CHECK(link > 0 && link < 1 && json_array_size(hops) == 2 &&
                 json_integer_value(json_object_get(json_array_get(hops, 1), "from")) == 1 &&
                 json_integer_value(json_object_get(json_array_get(hops, 1), "to")) == 0 &&
                 json_real_value(json_object_get(json_array_get(hops, 0), "bandwidth_gbps")) > 0,
             "the link model's step %g s, hops %s", link, body ? body : "");
    /* the bytes kt-place's link model prices (placement/ranks_plan.h): rank 0 sends each batch-1 decode step
     * as one STEP of one token and gets one RESULT back */
    struct kt_model *m = NULL;
    kt_err kerr = {0};
    KT_CHECK(kt_model_open(model, &m, &kerr) == KT_OK, "%s", kerr.msg);
    if (m) {
        const json_int_t sent = json_integer_value(json_object_get(pd, "sent_bytes"));
        const json_int_t got = json_integer_value(json_object_get(pd, "received_bytes"));
        const uint64_t want_sent = 8 * kt_rank_message_bytes(1, m->hp.n_embd, true);
        const uint64_t want_got = 8 * kt_rank_message_bytes(1, m->hp.n_embd, false);
        KT_CHECK((uint64_t)sent == want_sent && (uint64_t)got == want_got,
                 "rank 0 sent %lld bytes in 8 decode steps and received %lld; the link model says %llu and %llu",
                 (long long)sent, (long long)got, (unsigned long long)want_sent, (unsigned long long)want_got);
    }
    kt_model_close(m);
    json_decref(j);
    free(body);
}

/* Rank r's machine file of kt_bench_network_measures_every_hop: net-m%r.json with r in. */
static void net_machine_path(int r, char *buf, size_t size)
{
    snprintf(buf, size, "%s%d.json", kt_test_path("net-m"), r);
}

/* mpirun -np 3 kt-bench network: every hop of the ring (0 -> 1 -> 2 -> 0) measured through kt's transport,
 * its figures positive and finite, the pipeline's messages priced by the fitted line within reason; each rank
 * writes its own hop into its machine file ("%r"), which then loads with its network given; one process
 * alone is refused with a message naming mpirun, a missing machine file fails the job. */
static void kt_bench_network_measures_every_hop(void)
{
    char pattern[1024], path[1024], json[1024], out[1024], log[1024];
    snprintf(pattern, sizeof pattern, "%s%%r.json", kt_test_path("net-m"));
    snprintf(json, sizeof json, "%s", kt_test_path("net.json"));
    snprintf(out, sizeof out, "%s", kt_test_path("net.txt"));
    snprintf(log, sizeof log, "%s", kt_test_path("net.log"));
    for (int r = 0; r < 3; r++) {
        net_machine_path(r, path, sizeof path);
        write_machine(path, 1, 20);
    }
    int rc = kt_test_system("timeout 120 %s %s network --machine %s --prefill-tokens 32 --json %s >%s 2>%s",
                            mpirun_cmd(3), kt_test_tool("kt-bench"), pattern, json, out, log);
    KT_CHECK(rc == 0, "mpirun -np 3 kt-bench network: exit %d (see %s)", rc, log);
    size_t n = 0;
    char *text = kt_test_read_file(out, &n);
    KT_CHECK(text && strstr(text, "0 -> 1") && strstr(text, "1 -> 2") && strstr(text, "2 -> 0") &&
                 strstr(text, "GB/s"),
             "not every hop printed: %s", text ? text : "");
    free(text);
    char *body = kt_test_read_file(json, &n);
    json_t *j = body ? json_loads(body, 0, NULL) : NULL;
    json_t *hops = json_object_get(j, "hops");
    KT_CHECK(json_integer_value(json_object_get(j, "ranks")) == 3 && json_array_size(hops) == 3,
             "hops: %s", body ? body : "(no JSON)");
    for (size_t i = 0; i < json_array_size(hops); i++) {
        json_t *h = json_array_get(hops, i);
        const double lat = json_real_value(json_object_get(h, "latency_us"));
        const double gbps = json_real_value(json_object_get(h, "bandwidth_gbps"));
        const double d = json_real_value(json_object_get(h, "decode_message_us"));
        const double p = json_real_value(json_object_get(h, "prefill_message_us"));
        const double pf = json_real_value(json_object_get(h, "prefill_message_fit_us"));
        KT_CHECK(json_integer_value(json_object_get(h, "from")) == (json_int_t)i &&
                     json_integer_value(json_object_get(h, "to")) == (json_int_t)((i + 1) % 3),
                 "hop %zu is not %zu -> %zu", i, i, (i + 1) % 3);
        KT_CHECK(lat > 0 && lat < 1e6 && gbps > 0 && gbps < 1e4 && d > 0 && p > d && pf > 0,
                 "hop %zu: latency %g us, %g GB/s, decode message %g us, prefill message %g us (fit %g)", i, lat,
                 gbps, d, p, pf);
        /* the prefill message (32 tokens, 0.9 MiB) is in the line's range: the fit within 10x of it even on a
         * loaded machine */
        KT_CHECK(pf < 10 * p && p < 10 * pf, "hop %zu: prefill message %g us, the line says %g", i, p, pf);
    }
    json_decref(j);
    free(body);
    for (int r = 0; r < 3; r++) {
        net_machine_path(r, path, sizeof path);
        struct kt_machine *m = NULL;
        kt_err err = {0};
        KT_CHECK(kt_machine_load(path, &m, &err) == KT_OK, "%s", err.msg);
        KT_CHECK(m && m->network_given && m->net_gbps > 0 && m->net_latency_us > 0 && m->n_nodes == 1,
                 "rank %d's machine file: network %s, %g GB/s, %g us", r, m && m->network_given ? "given" : "missing",
                 m ? m->net_gbps : 0, m ? m->net_latency_us : 0);
        free(m);
    }
    /* alone: refused, naming mpirun */
    rc = kt_test_system("timeout 60 %s network >/dev/null 2>%s", kt_test_tool("kt-bench"), log);
    text = kt_test_read_file(log, &n);
    KT_CHECK(rc != 0 && text && strstr(text, "mpirun -np 2"), "one process: exit %d, %s", rc, text ? text : "");
    free(text);
    /* a rank without its machine file: the job fails, saying which */
    rc = kt_test_system("timeout 120 %s %s network --machine %s >/dev/null 2>%s", mpirun_cmd(2),
                        kt_test_tool("kt-bench"), kt_test_path("net-none-%r.json"), log);
    text = kt_test_read_file(log, &n);
    KT_CHECK(rc != 0 && text && strstr(text, "net-none-"), "no machine file: exit %d, %s", rc, text ? text : "");
    free(text);
}

static void more_ranks_than_layers_is_refused(void)
{
    char model[1024];
    snprintf(model, sizeof model, "%s.gguf", kt_test_path("tiny"));
    const char *log = kt_test_path("mpi-too-many.log");
    int rc = kt_test_system("timeout 120 %s %s -m %s -p hi -n 2 -t 1 >/dev/null 2>%s", mpirun_cmd(5),
                            kt_test_tool("kt-run"), model, log);
    KT_CHECK(rc != 0, "5 ranks for 4 layers ran (exit 0)");
    size_t n = 0;
    char *text = kt_test_read_file(log, &n);
    KT_CHECK(text && strstr(text, "5 ranks for the 4 layers"), "no message about the ranks: %s", text ? text : "");
    free(text);
}

int main(void)
{
    const char *have = getenv("KT_HAVE_MPI"), *exe = getenv("KT_MPIEXEC");
    if (!have || strcmp(have, "ON") != 0)
        return kt_test_skip("kt was built without MPI (apt-get install libopenmpi-dev openmpi-bin, then configure "
                            "with -DKT_MPI=ON)");
    if (!exe || !*exe || access(exe, X_OK) != 0)
        return kt_test_skip("mpirun not found (apt-get install openmpi-bin)");
    snprintf(mpirun, sizeof mpirun, "%s", exe);
    KT_RUN(tiny_over_2_and_3_ranks_matches_one_process);
    KT_RUN(tiny_v3_over_2_and_3_ranks_matches_one_process);
    KT_RUN(placement_ranks_set_uneven_layers);
    KT_RUN(each_rank_applies_its_own_placement);
    KT_RUN(a_rank_with_a_sim_device);
    KT_RUN(kt_place_plans_a_hybrid_rank);
    KT_RUN(kt_bench_model_over_ranks);
    KT_RUN(kt_bench_network_measures_every_hop);
    KT_RUN(more_ranks_than_layers_is_refused);
    return kt_test_finish();
}
