/*
 * test_kt_bench_machine.c - `kt-bench machine` end to end: on a synthetic
 * 2-node topology it writes a machine file that loads without a defaulted
 * entry, with both nodes, the topology it ran under, the sim's link as
 * given and a positive figure for every expert weight type, of this
 * machine's kind under that topology; bad arguments exit 2, an unwritable output or a bad
 * topology exit 1 before measuring and write nothing.  It checks shapes,
 * never a speed (no timed assertions).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "machine.h"
#include "testlib.h"

static const enum kt_type expert_types[] = {KT_TYPE_Q4_K, KT_TYPE_Q5_K, KT_TYPE_Q6_K, KT_TYPE_Q8_0,
                                            KT_TYPE_BF16, KT_TYPE_F16,  KT_TYPE_F32};

static void machine_file_of_two_synthetic_nodes_loads_complete(void)
{
    const char *path = kt_test_path("machine.json"), *out = kt_test_path("machine.txt");
    int rc = kt_test_system("'%s' machine -t 2 --seconds 0.01 --topology 'package:2 numa:1 core:1 pu:1' "
                            "--sim-transfer-gbps 12 --sim-latency-us 3 -o '%s' > '%s' 2>&1",
                            kt_test_tool("kt-bench"), path, out);
    KT_CHECK(rc == 0, "kt-bench machine exited %d", rc);
    size_t n = 0;
    char *table = kt_test_read_file(out, &n);
    KT_CHECK(table && strstr(table, "node1") && strstr(table, "sim ") && strstr(table, "q4_K"), "table: %s",
             table ? table : "(none)");
    free(table);
    struct kt_machine *m = NULL;
    kt_err err = {0};
    KT_CHECK(kt_machine_load(path, &m, &err) == KT_OK, "%s", err.msg);
    if (m) {
        KT_CHECK(m->n_defaulted == 0, "%u entries defaulted, first: %s", m->n_defaulted, m->defaulted[0]);
        KT_CHECK(m->n_nodes == 2 && m->nodes[0].node != m->nodes[1].node, "%d nodes", m->n_nodes);
        KT_CHECK(!strcmp(m->topology, "package:2 numa:1 core:1 pu:1"), "topology '%s'", m->topology);
        KT_CHECK(strstr(m->kind, " | 2 nodes | ") != NULL, "kind '%s' names the 2 nodes measured", m->kind);
        setenv("KT_TOPOLOGY_SYNTHETIC", "package:2 numa:1 core:1 pu:1", 1); /* as the planner would run */
        KT_CHECK(kt_machine_check_kind(m, path, &err) == KT_OK, "%s", err.msg);
        unsetenv("KT_TOPOLOGY_SYNTHETIC");
        for (int i = 0; i < m->n_nodes; i++) {
            const struct kt_machine_node *nd = &m->nodes[i];
            KT_CHECK(nd->threads >= 1 && nd->memory_bytes > 0 && nd->triad_gbps > 0 && nd->fma_gflops > 0 &&
                         nd->int8_gops > 0,
                     "node %d references", i);
            for (size_t k = 0; k < sizeof expert_types / sizeof expert_types[0]; k++)
                KT_CHECK(nd->decode[expert_types[k]].gbps > 0 && nd->decode[expert_types[k]].overhead_us >= 0 &&
                             nd->prefill_gflops[expert_types[k]] > 0,
                         "node %d %s", i, kt_type_name(expert_types[k]));
        }
        KT_CHECK(m->n_accel >= 1 && !strcmp(m->accel[0].name, "sim") && m->accel[0].backend == KT_PLACE_SIM,
                 "the sim comes first");
        KT_CHECK(m->accel[0].h2d_gbps == 12 && m->accel[0].d2h_gbps == 12 && m->accel[0].latency_us == 3,
                 "sim link %g/%g GB/s %g us", m->accel[0].h2d_gbps, m->accel[0].d2h_gbps, m->accel[0].latency_us);
        for (size_t k = 0; k < sizeof expert_types / sizeof expert_types[0]; k++)
            KT_CHECK(m->accel[0].decode[expert_types[k]].gbps > 0 && m->accel[0].prefill_gflops[expert_types[k]] > 0 &&
                         m->accel[0].prefill_fixed_gbps[expert_types[k]] > 0,
                     "sim %s", kt_type_name(expert_types[k]));
        KT_CHECK(m->nodes[0].decode_rows[KT_TYPE_Q8_0].gbps > 0 && m->nodes[0].decode_rows[KT_TYPE_F32].gbps > 0 &&
                     m->nodes[0].decode_rows[KT_TYPE_Q4_K].gbps == 0 && m->nodes[0].f32_cached_gbps > 0,
                 "node 0's attention figures");
        KT_CHECK(m->nodes[0].head_dequant_gelems[KT_TYPE_Q8_0] > 0 && m->nodes[0].head_dequant_gelems[KT_TYPE_Q4_K] == 0 &&
                     m->nodes[0].attention_gflops > 0 && m->nodes[0].prefill_rows_fixed_gbps[KT_TYPE_Q8_0] > 0 &&
                     m->nodes[0].prefill_fixed_gbps[KT_TYPE_Q4_K] > 0,
                 "node 0's prefill fixed parts and expanded heads' figures");
    }
    free(m);
    unlink(path);
    unlink(out);
}

static void bad_arguments_exit_2_and_bad_places_exit_1_writing_nothing(void)
{
    const char *bench = kt_test_tool("kt-bench");
    KT_CHECK(kt_test_system("'%s' machine --seconds 0 > /dev/null 2>&1", bench) == 2, "--seconds 0");
    KT_CHECK(kt_test_system("'%s' machine --json x.json > /dev/null 2>&1", bench) == 2, "--json is not machine's");
    KT_CHECK(kt_test_system("'%s' machine --sim-transfer-gbps 0 > /dev/null 2>&1", bench) == 2, "a link of 0");
    KT_CHECK(kt_test_system("'%s' machine -o > /dev/null 2>&1", bench) == 2, "-o without a file");

    const char *msg = kt_test_path("machine-err.txt");
    int rc = kt_test_system("'%s' machine -o /nonexistent-kt-dir/m.json > /dev/null 2> '%s'", bench, msg);
    size_t n = 0;
    char *text = kt_test_read_file(msg, &n);
    KT_CHECK(rc == 1 && text && strstr(text, "-o /nonexistent-kt-dir/m.json: the folder /nonexistent-kt-dir"),
             "rc %d: %s", rc, text ? text : "");
    free(text);

    const char *path = kt_test_path("machine-bad-topology.json");
    rc = kt_test_system("'%s' machine --topology 'no such thing' -o '%s' > /dev/null 2> '%s'", bench, path, msg);
    text = kt_test_read_file(msg, &n);
    KT_CHECK(rc == 1 && text && strstr(text, "topology"), "rc %d: %s", rc, text ? text : "");
    KT_CHECK(access(path, F_OK) != 0, "nothing written for a bad topology");
    free(text);
    unlink(msg);
}

int main(void)
{
    KT_RUN(bad_arguments_exit_2_and_bad_places_exit_1_writing_nothing);
    KT_RUN(machine_file_of_two_synthetic_nodes_loads_complete);
    return kt_test_finish();
}
