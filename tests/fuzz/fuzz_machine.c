/*
 * fuzz_machine.c - fuzz target for machine files (kt_machine_parse).
 *
 * Each input is parsed from an exactly-sized copy.  An accepted file must
 * keep the parser's promises: node and accelerator counts within bounds,
 * distinct node indices and accelerator names, every figure finite and
 * non-negative, every expert type's decode rate positive after defaults, at
 * most KT_MACHINE_MAX_DEFAULTED defaulted lines, and a finite decode time
 * for every type.  A rejection must be a format error whose message starts
 * with the input's name.  A broken promise aborts.  It must never touch
 * files or keep state between inputs.  kt_fuzz_seeds hands replay.c a valid
 * file, its truncations and single-byte mutations.
 */
#include "fuzz.h"

#include "machine.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void require(bool cond, const char *what)
{
    if (!cond) {
        fprintf(stderr, "fuzz_machine: broken promise: %s\n", what);
        abort();
    }
}

static bool figure(double x)
{
    return isfinite(x) && x >= 0;
}

static void check_kernels(const struct kt_machine_rate *decode, const double *prefill)
{
    static const int expert_types[] = {KT_TYPE_Q4_K, KT_TYPE_Q5_K, KT_TYPE_Q6_K, KT_TYPE_Q8_0,
                                       KT_TYPE_BF16, KT_TYPE_F16,  KT_TYPE_F32};
    for (int t = 0; t < KT_TYPE_COUNT; t++) {
        require(figure(decode[t].gbps) && figure(decode[t].overhead_us) && figure(prefill[t]), "kernel figures");
        const double s = kt_machine_decode_seconds(decode, t, 1u << 20);
        require(isfinite(s) && s > 0, "decode seconds");
    }
    for (size_t i = 0; i < sizeof expert_types / sizeof expert_types[0]; i++)
        require(decode[expert_types[i]].gbps > 0, "expert types defaulted");
}

static void check_machine(const struct kt_machine *m)
{
    require(m->n_nodes >= 1 && m->n_nodes <= KT_MACHINE_MAX_NODES, "node count");
    require(m->n_accel >= 0 && m->n_accel <= KT_MACHINE_MAX_ACCEL, "accelerator count");
    require(m->n_defaulted <= KT_MACHINE_MAX_DEFAULTED, "defaulted count");
    require(memchr(m->kind, 0, sizeof m->kind) && memchr(m->topology, 0, sizeof m->topology), "strings terminated");
    for (int i = 0; i < m->n_nodes; i++) {
        const struct kt_machine_node *n = &m->nodes[i];
        require(n->node >= 0 && n->node < KT_MACHINE_MAX_NODES, "node index");
        for (int j = 0; j < i; j++)
            require(m->nodes[j].node != n->node, "distinct nodes");
        require(n->triad_gbps > 0 && n->fma_gflops > 0 && n->int8_gops > 0 && isfinite(n->triad_gbps) &&
                    isfinite(n->fma_gflops) && isfinite(n->int8_gops),
                "node peaks");
        check_kernels(n->decode, n->prefill_gflops);
        require(figure(n->f32_cached_gbps), "f32_cached_gbps");
        for (int t = 0; t < KT_TYPE_COUNT; t++)
            require(figure(n->decode_rows[t].gbps) && figure(n->decode_rows[t].overhead_us) &&
                        (n->decode_rows[t].gbps == 0 || n->decode_rows[t].gbps >= 1e-3),
                    "decode_rows");
        require(figure(n->attention_gflops), "attention_gflops");
        for (int t = 0; t < KT_TYPE_COUNT; t++)
            require(figure(n->prefill_rows_gflops[t]) && figure(n->prefill_fixed_gbps[t]) &&
                        figure(n->prefill_rows_fixed_gbps[t]) && figure(n->head_dequant_gelems[t]),
                    "prefill and heads' figures");
    }
    for (int i = 0; i < m->n_accel; i++) {
        const struct kt_machine_accel *a = &m->accel[i];
        require(a->name[0] && memchr(a->name, 0, sizeof a->name), "accelerator name");
        require(a->backend == KT_PLACE_SIM || a->backend == KT_PLACE_CUDA, "accelerator backend");
        for (int j = 0; j < i; j++)
            require(strcmp(m->accel[j].name, a->name) != 0, "distinct accelerators");
        require(a->h2d_gbps > 0 && a->d2h_gbps > 0 && figure(a->latency_us) && isfinite(a->h2d_gbps) &&
                    isfinite(a->d2h_gbps),
                "link figures");
        check_kernels(a->decode, a->prefill_gflops);
        for (int t = 0; t < KT_TYPE_COUNT; t++)
            require(figure(a->prefill_fixed_gbps[t]), "accelerator prefill_fixed_gbps");
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *copy = malloc(size ? size : 1);
    if (!copy)
        return 0;
    memcpy(copy, data, size);
    struct kt_machine *m = NULL;
    kt_err err = {0};
    kt_status s = kt_machine_parse(copy, size, "fuzz.json", &m, &err);
    require((s == KT_OK) == (m != NULL), "machine set exactly on success");
    if (m)
        check_machine(m);
    else
        require((s == KT_ERR_FORMAT || s == KT_ERR_NOMEM) && !strncmp(err.msg, "fuzz.json", 9),
                "format error naming the input");
    free(m);
    free(copy);
    return 0;
}

/* ---- seeds for replay.c ---------------------------------------------------------- */

static const char *const SEEDS[] = {
    "{\"version\": 1, \"kind\": \"AMD EPYC | 1 node | avx512\", \"topology\": \"\",\n"
    " \"nodes\": [{\"node\": 0, \"threads\": 2, \"memory_gib\": 23.4, \"triad_gbps\": 14.5, \"fma_gflops\": 190,\n"
    "  \"int8_gops\": 800, \"f32_cached_gbps\": 90, \"decode_rows\": {\"q8_0\": {\"gbps\": 20, \"overhead_us\": 3}},\n  \"decode\": {\"q4_K\": {\"gbps\": 11.5, \"overhead_us\": 31},\n"
    "  \"f32\": {\"gbps\": 12, \"overhead_us\": 25}}, \"prefill_gflops\": {\"q4_K\": 150, \"bf16\": 90},\n"
    "  \"prefill_fixed_gbps\": {\"q4_K\": 900}, \"prefill_rows_gflops\": {\"q8_0\": 300},\n"
    "  \"prefill_rows_fixed_gbps\": {\"q8_0\": 20}, \"head_dequant_gelems\": {\"q8_0\": 9}, \"attention_gflops\": 40}],\n"
    " \"accelerators\": [{\"name\": \"sim\", \"backend\": \"sim\", \"memory_gib\": 0, \"h2d_gbps\": 25,\n"
    "  \"d2h_gbps\": 25, \"latency_us\": 10, \"decode\": {\"q8_0\": {\"gbps\": 6, \"overhead_us\": 4}},\n"
    "  \"prefill_gflops\": {\"q8_0\": 70}, \"prefill_fixed_gbps\": {\"q8_0\": 18}}]}\n",
    "{\"version\": 1, \"kind\": \"k\", \"nodes\": [{\"node\": 3}, {\"node\": 1, \"triad_gbps\": 0}],\n"
    " \"accelerators\": [{\"name\": \"cuda0\", \"backend\": \"cuda\", \"h2d_gbps\": 0}]}",
};

void kt_fuzz_seeds(kt_fuzz_emit_fn emit)
{
    static const char values[] = {0, ':', '-', '[', '{', '}', ' ', '"', '9', 'e', ',', '.'};
    kt_fuzz_mutated_seeds(emit, SEEDS, sizeof SEEDS / sizeof SEEDS[0], values, sizeof values);
}
