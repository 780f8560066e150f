/*
 * test_machine.c - the machine file (placement/machine.h): a saved file loads
 * back to the same figures, every class of bad input is refused with the
 * file and JSON path in the message and nothing stored, missing entries get
 * their stated defaults with one `defaulted` line each, and a file from
 * another machine kind is refused.
 */
#include "machine.h"
#include "testlib.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static bool close_to(double a, double b)
{
    return fabs(a - b) <= 1e-9 * fabs(b) + 1e-12;
}

/* A machine with every figure distinct: 2 nodes, a sim and a cuda accelerator. */
static void example(struct kt_machine *m)
{
    kt_machine_defaults(m, 2);
    m->n_defaulted = 0;
    snprintf(m->topology, sizeof m->topology, "package:2 numa:1 core:1 pu:1");
    for (int i = 0; i < 2; i++) {
        struct kt_machine_node *n = &m->nodes[i];
        n->node = i;
        n->threads = 3 + (uint32_t)i;
        n->memory_bytes = (uint64_t)(12 + i) << 30;
        n->triad_gbps = 31.25 + i;
        n->fma_gflops = 410.5 + i;
        n->int8_gops = 1650.75 + i;
        n->f32_cached_gbps = 120.25 + i;
        n->decode_rows[KT_TYPE_Q8_0] = (struct kt_machine_rate){21.5 + i, 3.25};
        n->prefill_rows_gflops[KT_TYPE_Q8_0] = 410.5 + i;
        n->prefill_rows_fixed_gbps[KT_TYPE_Q8_0] = 22.75 + i;
        n->head_dequant_gelems[KT_TYPE_Q8_0] = 6.5 + i;
        n->attention_gflops = 44.25 + i;
        for (int t = 0; t < KT_TYPE_COUNT; t++)
            if (n->decode[t].gbps > 0) {
                n->decode[t] = (struct kt_machine_rate){17.125 + t + i, 11.5 + t};
                n->prefill_gflops[t] = 99.5 + 3 * t + i;
                n->prefill_fixed_gbps[t] = 60.5 + 2 * t + i;
            }
    }
    m->n_accel = 2;
    m->accel[1] = m->accel[0];
    snprintf(m->accel[1].name, sizeof m->accel[1].name, "cuda0");
    m->accel[1].backend = KT_PLACE_CUDA;
    m->accel[1].shares_host = false;
    m->accel[1].memory_bytes = (uint64_t)80 << 30;
    m->accel[1].h2d_gbps = 24.5;
    m->accel[1].d2h_gbps = 26.5;
    m->accel[1].latency_us = 7.25;
    m->accel[1].decode[KT_TYPE_Q4_K] = (struct kt_machine_rate){2800.5, 4.5};
    m->accel[0].prefill_fixed_gbps[KT_TYPE_Q8_0] = 18.5;
}

static void round_trip_keeps_every_figure(void)
{
    struct kt_machine *m = kt_test_xmalloc(sizeof *m), *back = NULL;
    example(m);
    const char *path = kt_test_path("machine.json");
    kt_err err = {0};
    KT_CHECK(kt_machine_save(m, path, &err) == KT_OK, "%s", err.msg);
    KT_CHECK(kt_machine_load(path, &back, &err) == KT_OK, "%s", err.msg);
    if (back) {
        KT_CHECK(back->n_defaulted == 0, "%u defaulted, first: %s", back->n_defaulted, back->defaulted[0]);
        KT_CHECK(!strcmp(back->kind, m->kind) && !strcmp(back->topology, m->topology), "kind and topology");
        KT_CHECK(back->n_nodes == 2 && back->n_accel == 2, "%d nodes, %d accelerators", back->n_nodes, back->n_accel);
        for (int i = 0; i < 2; i++) {
            const struct kt_machine_node *a = &m->nodes[i], *b = &back->nodes[i];
            KT_CHECK(a->node == b->node && a->threads == b->threads && a->memory_bytes == b->memory_bytes,
                     "node %d header", i);
            KT_CHECK(close_to(b->triad_gbps, a->triad_gbps) && close_to(b->fma_gflops, a->fma_gflops) &&
                         close_to(b->int8_gops, a->int8_gops),
                     "node %d peaks", i);
            for (int t = 0; t < KT_TYPE_COUNT; t++)
                KT_CHECK(close_to(b->decode[t].gbps, a->decode[t].gbps) &&
                             close_to(b->decode[t].overhead_us, a->decode[t].overhead_us) &&
                             close_to(b->prefill_gflops[t], a->prefill_gflops[t]) &&
                             close_to(b->prefill_fixed_gbps[t], a->prefill_fixed_gbps[t]),
                         "node %d type %d", i, t);
            KT_CHECK(close_to(b->f32_cached_gbps, a->f32_cached_gbps) &&
                         close_to(b->decode_rows[KT_TYPE_Q8_0].gbps, a->decode_rows[KT_TYPE_Q8_0].gbps) &&
                         close_to(b->decode_rows[KT_TYPE_Q8_0].overhead_us, a->decode_rows[KT_TYPE_Q8_0].overhead_us) &&
                         b->decode_rows[KT_TYPE_F32].gbps == 0,
                     "node %d attention figures", i);
            KT_CHECK(close_to(b->prefill_rows_gflops[KT_TYPE_Q8_0], a->prefill_rows_gflops[KT_TYPE_Q8_0]) &&
                         close_to(b->prefill_rows_fixed_gbps[KT_TYPE_Q8_0], a->prefill_rows_fixed_gbps[KT_TYPE_Q8_0]) &&
                         close_to(b->head_dequant_gelems[KT_TYPE_Q8_0], a->head_dequant_gelems[KT_TYPE_Q8_0]) &&
                         close_to(b->attention_gflops, a->attention_gflops) && b->head_dequant_gelems[KT_TYPE_F32] == 0,
                     "node %d prefill rows and heads' figures", i);
        }
        for (int i = 0; i < 2; i++) {
            const struct kt_machine_accel *a = &m->accel[i], *b = &back->accel[i];
            KT_CHECK(!strcmp(a->name, b->name) && a->backend == b->backend && a->memory_bytes == b->memory_bytes &&
                         a->shares_host == b->shares_host,
                     "accelerator %d header", i);
            KT_CHECK(close_to(b->h2d_gbps, a->h2d_gbps) && close_to(b->d2h_gbps, a->d2h_gbps) &&
                         close_to(b->latency_us, a->latency_us),
                     "accelerator %d link", i);
            KT_CHECK(close_to(b->decode[KT_TYPE_Q4_K].gbps, a->decode[KT_TYPE_Q4_K].gbps), "accelerator %d q4_K", i);
            KT_CHECK(close_to(b->prefill_fixed_gbps[KT_TYPE_Q8_0], a->prefill_fixed_gbps[KT_TYPE_Q8_0]),
                     "accelerator %d prefill_fixed_gbps", i);
        }
    }
    kt_machine_check_kind(back ? back : m, path, &err); /* this host's kind: must pass */
    KT_CHECK(back && kt_machine_check_kind(back, path, &err) == KT_OK, "%s", err.msg);
    free(back);
    free(m);
    unlink(path);
}

static kt_status parse(const char *text, struct kt_machine **m, kt_err *err)
{
    return kt_machine_parse(text, strlen(text), "m.json", m, err);
}

#define NODE0 "{\"node\": 0, \"threads\": 2, \"memory_gib\": 1, \"triad_gbps\": 10, \"fma_gflops\": 50, " \
              "\"int8_gops\": 200, \"decode\": {\"q4_K\": {\"gbps\": 9, \"overhead_us\": 15}}, "            \
              "\"prefill_gflops\": {\"q4_K\": 60}}"
#define HEAD "{\"version\": 1, \"kind\": \"k\", "

static void bad_inputs_are_refused_with_file_and_path(void)
{
    static const struct {
        const char *text, *want;
    } cases[] = {
        {"", "m.json:"},
        {"[1]", "expected a JSON object"},
        {"{\"version\": 2, \"kind\": \"k\", \"nodes\": [" NODE0 "]}", "version: expected 1"},
        {"{\"version\": 1, \"nodes\": [" NODE0 "]}", "kind:"},
        {HEAD "\"nodes\": []}", "nodes: expected an array"},
        {HEAD "\"nodes\": [" NODE0 "], \"colour\": 1}", "unknown key 'colour'"},
        {HEAD "\"nodes\": [{\"node\": 0, \"speed\": 1}]}", "nodes[0]: unknown key 'speed'"},
        {HEAD "\"nodes\": [{\"node\": 0, \"triad_gbps\": -1}]}", "nodes[0].triad_gbps: expected a non-negative"},
        {HEAD "\"nodes\": [{\"node\": 0, \"triad_gbps\": \"fast\"}]}", "nodes[0].triad_gbps: expected a non-negative"},
        {HEAD "\"nodes\": [{\"node\": 0, \"triad_gbps\": NaN}]}", "m.json:1:"},
        {HEAD "\"nodes\": [{\"node\": 0, \"fma_gflops\": 1e300}]}", "beyond any real machine"},
        {HEAD "\"nodes\": [{\"node\": 0, \"decode\": {\"q9_Z\": {\"gbps\": 1}}}]}", "nodes[0].decode.q9_Z: unknown weight type"},
        {HEAD "\"nodes\": [{\"node\": 0, \"decode\": {\"q4_K\": {\"gbps\": 0}}}]}", "nodes[0].decode.q4_K: gbps"},
        {HEAD "\"nodes\": [{\"node\": 0, \"decode\": {\"q4_K\": {\"gbps\": 1, \"x\": 2}}}]}", "unknown key 'x'"},
        {HEAD "\"nodes\": [{\"node\": 0, \"decode\": {\"q4_K\": {\"gbps\": 1}, \"Q4_k\": {\"gbps\": 2}}}]}",
         "type given twice"},
        {HEAD "\"nodes\": [{\"node\": 0, \"prefill_gflops\": {\"f32\": -3}}]}", "nodes[0].prefill_gflops.f32"},
        {HEAD "\"nodes\": [{\"node\": 0, \"f32_cached_gbps\": -3}]}", "nodes[0].f32_cached_gbps"},
        {HEAD "\"nodes\": [{\"node\": 0, \"attention_gflops\": -1}]}", "nodes[0].attention_gflops"},
        {HEAD "\"nodes\": [{\"node\": 0, \"attention_gflops\": 1e-9}]}", "nodes[0].attention_gflops: expected 0 (unknown) or at least"},
        {HEAD "\"nodes\": [{\"node\": 0, \"prefill_gflops\": {\"q4_K\": 1e-200}}]}", "nodes[0].prefill_gflops.q4_K: expected 0"},
        {HEAD "\"nodes\": [{\"node\": 0, \"head_dequant_gelems\": {\"q8_0\": \"x\"}}]}", "nodes[0].head_dequant_gelems.q8_0"},
        {HEAD "\"nodes\": [{\"node\": 0, \"prefill_fixed_gbps\": {\"q9_9\": 1}}]}", "nodes[0].prefill_fixed_gbps"},
        {HEAD "\"nodes\": [{\"node\": 0, \"decode_rows\": {\"q8_0\": {\"gbps\": 0.0001}}}]}", "nodes[0].decode_rows.q8_0: gbps"},
        {HEAD "\"nodes\": [{\"node\": 0}, {\"node\": 0}]}", "nodes[1].node: node 0 is also nodes[0]"},
        {HEAD "\"nodes\": [{\"threads\": 2}]}", "nodes[0]: node: missing"},
        {HEAD "\"nodes\": [{\"node\": 1.5}]}", "nodes[0].node: expected an integer"},
        {HEAD "\"nodes\": [{\"node\": 0}], \"accelerators\": [{\"name\": \"g\", \"backend\": \"tpu\"}]}",
         "accelerators[0].backend: expected \"sim\" or \"cuda\""},
        {HEAD "\"nodes\": [{\"node\": 0}], \"accelerators\": [{\"backend\": \"sim\"}]}", "accelerators[0]: name: missing"},
        {HEAD "\"nodes\": [{\"node\": 0}], \"accelerators\": [{\"name\": \"a\", \"backend\": \"sim\"},"
              "{\"name\": \"a\", \"backend\": \"cuda\"}]}",
         "accelerators[1].name: 'a' is also"},
        {HEAD "\"nodes\": [{\"node\": 0}], \"accelerators\": [{\"name\": \"s\", \"backend\": \"sim\", \"latency_us\": -2}]}",
         "accelerators[0].latency_us"},
        {HEAD "\"nodes\": [{\"node\": 0, \"node\": 1}]}", "m.json:1:"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct kt_machine *m = (struct kt_machine *)&m;
        kt_err err = {0};
        kt_status st = parse(cases[i].text, &m, &err);
        KT_CHECK(st == KT_ERR_FORMAT && m == NULL, "case %zu accepted: %s", i, cases[i].text);
        KT_CHECK(!strncmp(err.msg, "m.json", 6) && strstr(err.msg, cases[i].want), "case %zu: '%s' lacks '%s'", i,
                 err.msg, cases[i].want);
        free(m);
    }
    kt_err err = {0};
    struct kt_machine *m = NULL;
    char many[4096] = HEAD "\"nodes\": [";
    for (int i = 0; i <= KT_MACHINE_MAX_NODES; i++)
        snprintf(many + strlen(many), sizeof many - strlen(many), "%s{\"node\": %d}", i ? ", " : "", i);
    strcat(many, "]}");
    KT_CHECK(parse(many, &m, &err) == KT_ERR_FORMAT && !m && strstr(err.msg, "m.json: nodes: 65 nodes is too many"),
             "%s", err.msg);
    KT_CHECK(kt_machine_load(kt_test_path("no-such-machine.json"), &m, &err) == KT_ERR_IO && !m, "missing file");
}

static void missing_entries_get_stated_defaults(void)
{
    struct kt_machine *m = NULL;
    kt_err err = {0};
    KT_CHECK(parse(HEAD "\"nodes\": [" NODE0 "]}", &m, &err) == KT_OK, "%s", err.msg);
    if (!m)
        return;
    /* q4_K was given; the six other expert types get a decode and a prefill line each */
    KT_CHECK(m->n_defaulted == 12, "%u defaulted lines", m->n_defaulted);
    KT_CHECK(m->nodes[0].decode[KT_TYPE_Q4_K].gbps == 9 && m->nodes[0].decode[KT_TYPE_Q4_K].overhead_us == 15,
             "measured figure kept");
    KT_CHECK(close_to(m->nodes[0].decode[KT_TYPE_Q8_0].gbps, KT_MACHINE_DEFAULT_DECODE_SHARE * 10), "q8_0 %g",
             m->nodes[0].decode[KT_TYPE_Q8_0].gbps);
    KT_CHECK(close_to(m->nodes[0].prefill_gflops[KT_TYPE_F32], KT_MACHINE_DEFAULT_PREFILL_SHARE * 50), "f32 prefill");
    bool named = false;
    for (uint32_t i = 0; i < m->n_defaulted; i++)
        named = named || strstr(m->defaulted[i], "nodes[0].decode.q6_K") != NULL;
    KT_CHECK(named, "a line names nodes[0].decode.q6_K");
    free(m);

    /* a bare node and a bare sim: every figure defaulted, the overflow counted on the last line */
    KT_CHECK(parse(HEAD "\"nodes\": [{\"node\": 0}], \"accelerators\": [{\"name\": \"sim\", \"backend\": \"sim\"}]}",
                   &m, &err) == KT_OK,
             "%s", err.msg);
    if (!m)
        return;
    KT_CHECK(m->n_defaulted == KT_MACHINE_MAX_DEFAULTED, "%u lines", m->n_defaulted);
    KT_CHECK(strstr(m->defaulted[KT_MACHINE_MAX_DEFAULTED - 1], "more entries assumed") != NULL, "%s",
             m->defaulted[KT_MACHINE_MAX_DEFAULTED - 1]);
    KT_CHECK(m->nodes[0].triad_gbps == KT_MACHINE_DEFAULT_TRIAD_GBPS, "triad default");
    KT_CHECK(m->accel[0].h2d_gbps == KT_MACHINE_DEFAULT_LINK_GBPS &&
                 m->accel[0].latency_us == KT_MACHINE_DEFAULT_LINK_LATENCY_US,
             "sim link defaults");
    KT_CHECK(m->accel[0].shares_host, "a sim runs on the host's cores unless the file says otherwise");
    free(m);

    /* "shares_host": false plans the sim as a device of its own; not a boolean: refused */
    KT_CHECK(parse(HEAD "\"nodes\": [{\"node\": 0}], \"accelerators\": [{\"name\": \"sim\", \"backend\": \"sim\", "
                        "\"shares_host\": false}]}",
                   &m, &err) == KT_OK,
             "%s", err.msg);
    if (m)
        KT_CHECK(!m->accel[0].shares_host, "shares_host false kept");
    free(m);
    m = NULL;
    KT_CHECK(parse(HEAD "\"nodes\": [{\"node\": 0}], \"accelerators\": [{\"name\": \"sim\", \"backend\": \"sim\", "
                        "\"shares_host\": 1}]}",
                   &m, &err) == KT_ERR_FORMAT &&
                 strstr(err.msg, "accelerators[0].shares_host") && strstr(err.msg, "true or false"),
             "shares_host 1 refused: %s", err.msg);
    free(m);

    struct kt_machine d;
    kt_machine_defaults(&d, 3);
    KT_CHECK(d.accel[0].shares_host, "the default sim shares the host");
    KT_CHECK(d.n_nodes == 3 && d.n_accel == 1 && d.accel[0].backend == KT_PLACE_SIM, "defaults' shape");
    KT_CHECK(d.n_defaulted > 0, "defaults say so");
    KT_CHECK(kt_machine_check_kind(&d, "defaults", &err) == KT_OK, "%s", err.msg);
}

static void another_kind_is_refused(void)
{
    struct kt_machine *m = NULL;
    kt_err err = {0};
    KT_CHECK(parse("{\"version\": 1, \"kind\": \"Imaginary CPU 9000 | 8 nodes | amx\", \"nodes\": [{\"node\": 0}]}", &m,
                   &err) == KT_OK,
             "%s", err.msg);
    if (!m)
        return;
    KT_CHECK(kt_machine_check_kind(m, "other.json", &err) == KT_ERR_INVALID, "another kind accepted");
    KT_CHECK(strstr(err.msg, "other.json: measured on Imaginary CPU 9000 | 8 nodes | amx, this machine is") != NULL,
             "%s", err.msg);
    char kind[160];
    kt_machine_this_kind(kind, sizeof kind);
    KT_CHECK(strstr(kind, " | ") && strstr(kind, " node"), "kind '%s'", kind);
    free(m);
}

static void decode_seconds_follow_the_fit(void)
{
    struct kt_machine_rate r[KT_TYPE_COUNT] = {{0, 0}};
    r[KT_TYPE_Q4_K] = (struct kt_machine_rate){10, 20};
    r[KT_TYPE_BF16] = (struct kt_machine_rate){40, 5};
    KT_CHECK(close_to(kt_machine_decode_seconds(r, KT_TYPE_Q4_K, 1000000000), 20e-6 + 0.1), "q4_K");
    /* q5_K has no figures: q4_K is nearest in bits per weight */
    KT_CHECK(close_to(kt_machine_decode_seconds(r, KT_TYPE_Q5_K, 2000000000), 20e-6 + 0.2), "q5_K from q4_K");
    KT_CHECK(close_to(kt_machine_decode_seconds(r, KT_TYPE_F16, 4000000000), 5e-6 + 0.1), "f16 from bf16 (same bits per weight)");
}

int main(void)
{
    KT_RUN(round_trip_keeps_every_figure);
    KT_RUN(bad_inputs_are_refused_with_file_and_path);
    KT_RUN(missing_entries_get_stated_defaults);
    KT_RUN(another_kind_is_refused);
    KT_RUN(decode_seconds_follow_the_fit);
    return kt_test_finish();
}
