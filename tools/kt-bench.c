/*
 * kt-bench.c - kt's benchmark: `kernels` measures the CPU kernels against a
 * STREAM triad and compute peaks taken in the same run; `model` runs prefill
 * and greedy decode of a model with the engine and splits each layer's time;
 * `profile` writes the routing of real prompts; `machine` measures what the
 * cost model needs; `check` compares a placement's logits with a CPU
 * reference engine's on the same tokens (tools/bench/check.c).
 *
 * This file parses arguments; tools/bench/ holds the jobs.  It must never
 * compute a result itself.  Exit status: 0 done, 1 the run failed (one line
 * "kt-bench: why"), 2 usage - and for check, 2 when the check fails.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "check.h"
#include "cli.h"
#include "cpu/dispatch.h"
#include "machine.h"
#include "threads.h"

/* ---- arguments ------------------------------------------------------------------ */

enum { FOR_KERNELS = 1, FOR_MODEL = 2, FOR_BOTH = 3, FOR_MACHINE = 4, FOR_PROFILE = 8, FOR_CHECK = 16 };

static bool opt_threads(void *opts, const char *arg, char *why, size_t why_size)
{
    struct kt_bench_options *o = opts;
    return kt_cli_parse_u32(arg, 1, 4096, &o->threads) || kt_cli_invalid(why, why_size, "--threads", arg);
}

static bool opt_json(void *opts, const char *arg, char *why, size_t why_size)
{
    struct kt_bench_options *o = opts;
    (void)why, (void)why_size;
    o->json = arg;
    return true;
}

static bool opt_seconds(void *opts, const char *arg, char *why, size_t why_size)
{
    struct kt_bench_options *o = opts;
    double v;
    if (!kt_cli_parse_double(arg, &v) || v < 0.01 || v > 600.0)
        return kt_cli_invalid(why, why_size, "--seconds (0.01 to 600)", arg);
    o->seconds = v;
    return true;
}

static bool opt_prefill_tokens(void *opts, const char *arg, char *why, size_t why_size)
{
    struct kt_bench_options *o = opts;
    return kt_cli_parse_u32(arg, 1, 4096, &o->prefill_tokens) || kt_cli_invalid(why, why_size, "--prefill-tokens", arg);
}

static bool opt_isa(void *opts, const char *arg, char *why, size_t why_size)
{
    struct kt_bench_options *o = opts;
    const char *p = arg;
    for (;;) {
        size_t n = strcspn(p, ",");
        int found = -1;
        for (int i = 0; i < 4 && found < 0; i++)
            if (strlen(kt_isa_name((enum kt_isa)i)) == n && !strncmp(p, kt_isa_name((enum kt_isa)i), n))
                found = i;
        if (found < 0)
            return kt_cli_invalid(why, why_size, "--isa (scalar,avx2,avx512,amx)", arg);
        o->isa_mask |= 1u << found;
        if (!p[n])
            return true;
        p += n + 1;
    }
}

static bool opt_model(void *opts, const char *arg, char *why, size_t why_size)
{
    struct kt_bench_options *o = opts;
    if (o->model) {
        snprintf(why, why_size, "more than one model given ('%s')", arg);
        return false;
    }
    o->model = arg;
    return true;
}

static bool opt_prompt_tokens(void *opts, const char *arg, char *why, size_t why_size)
{
    struct kt_bench_options *o = opts;
    return kt_cli_parse_u32(arg, 1, 1u << 20, &o->prompt_tokens) || kt_cli_invalid(why, why_size, "--prompt-tokens", arg);
}

static bool opt_gen_tokens(void *opts, const char *arg, char *why, size_t why_size)
{
    struct kt_bench_options *o = opts;
    return kt_cli_parse_u32(arg, 1, 1u << 20, &o->gen_tokens) || kt_cli_invalid(why, why_size, "--gen-tokens", arg);
}

static bool opt_seed(void *opts, const char *arg, char *why, size_t why_size)
{
    struct kt_bench_options *o = opts;
    return kt_cli_parse_u64(arg, 0, UINT64_MAX, &o->seed) || kt_cli_invalid(why, why_size, "--seed", arg);
}

static bool opt_placement(void *opts, const char *arg, char *why, size_t why_size)
{
    (void)why, (void)why_size;
    ((struct kt_bench_options *)opts)->placement = arg;
    return true;
}

static bool opt_prompts(void *opts, const char *arg, char *why, size_t why_size)
{
    (void)why, (void)why_size;
    ((struct kt_bench_options *)opts)->prompts = arg;
    return true;
}

static bool opt_output(void *opts, const char *arg, char *why, size_t why_size)
{
    (void)why, (void)why_size;
    ((struct kt_bench_options *)opts)->output = arg;
    return true;
}

static bool opt_svg(void *opts, const char *arg, char *why, size_t why_size)
{
    (void)why, (void)why_size;
    ((struct kt_bench_options *)opts)->svg = arg;
    return true;
}

static bool opt_max_tokens(void *opts, const char *arg, char *why, size_t why_size)
{
    struct kt_bench_options *o = opts;
    return kt_cli_parse_u32(arg, 1, 1u << 20, &o->max_tokens) || kt_cli_invalid(why, why_size, "--max-tokens", arg);
}

static bool opt_batch(void *opts, const char *arg, char *why, size_t why_size)
{
    struct kt_bench_options *o = opts;
    return kt_cli_parse_u32(arg, 1, 256, &o->batch) || kt_cli_invalid(why, why_size, "--batch (1 to 256)", arg);
}

static bool opt_half_life(void *opts, const char *arg, char *why, size_t why_size)
{
    struct kt_bench_options *o = opts;
    double v;
    if (!kt_cli_parse_double(arg, &v) || !(v >= 0) || v > 1e18)
        return kt_cli_invalid(why, why_size, "--half-life (tokens, 0: no decay)", arg);
    o->half_life = v;
    return true;
}

static bool opt_expert_cache(void *opts, const char *arg, char *why, size_t why_size)
{
    struct kt_bench_options *o = opts;
    return kt_cli_parse_u32(arg, 0, 65536, &o->expert_cache_slots) ||
           kt_cli_invalid(why, why_size, "--expert-cache (slots per MoE layer; 0: off)", arg);
}

static bool opt_expert_cache_policy(void *opts, const char *arg, char *why, size_t why_size)
{
    return kt_cli_parse_cache_policy(arg, &((struct kt_bench_options *)opts)->expert_cache_lfu) ||
           kt_cli_invalid(why, why_size, "--expert-cache-policy (lru or lfu)", arg);
}

static bool opt_topology(void *opts, const char *arg, char *why, size_t why_size)
{
    (void)why, (void)why_size;
    ((struct kt_bench_options *)opts)->topology = arg;
    return true;
}

static bool opt_sim_transfer(void *opts, const char *arg, char *why, size_t why_size)
{
    double v;
    if (!kt_cli_parse_double(arg, &v) || !(v > 0) || v > 1e6)
        return kt_cli_invalid(why, why_size, "--sim-transfer-gbps (above 0)", arg);
    ((struct kt_bench_options *)opts)->sim_transfer_gbps = v;
    return true;
}

static bool opt_sim_latency(void *opts, const char *arg, char *why, size_t why_size)
{
    double v;
    if (!kt_cli_parse_double(arg, &v) || !(v >= 0) || v > 1e6)
        return kt_cli_invalid(why, why_size, "--sim-latency-us (0 or more)", arg);
    ((struct kt_bench_options *)opts)->sim_latency_us = v;
    return true;
}

static bool opt_cold(void *opts, const char *arg, char *why, size_t why_size)
{
    (void)arg, (void)why, (void)why_size;
    ((struct kt_bench_options *)opts)->cold = true;
    return true;
}

static bool opt_predict(void *opts, const char *arg, char *why, size_t why_size)
{
    (void)arg, (void)why, (void)why_size;
    ((struct kt_bench_options *)opts)->predict = true;
    return true;
}

static bool opt_machine(void *opts, const char *arg, char *why, size_t why_size)
{
    (void)why, (void)why_size;
    ((struct kt_bench_options *)opts)->machine = arg;
    return true;
}

static bool opt_profile(void *opts, const char *arg, char *why, size_t why_size)
{
    (void)why, (void)why_size;
    ((struct kt_bench_options *)opts)->profile = arg;
    return true;
}

static const struct kt_cli_option options_table[] = {
    {"--threads", "-t", "N", FOR_BOTH | FOR_PROFILE | FOR_MACHINE | FOR_CHECK,
     "threads (default: the CPUs this process may use)", opt_threads},
    {"--json", NULL, "FILE", FOR_BOTH | FOR_CHECK, "also write the results as JSON to FILE", opt_json},
    {"--seconds", NULL, "S", FOR_KERNELS | FOR_MACHINE, "time per measurement (default 1; machine: per point, 0.3)",
     opt_seconds},
    {"--prefill-tokens", NULL, "N", FOR_KERNELS, "tokens of the prefill shape (default 128)", opt_prefill_tokens},
    {"--isa", NULL, "LIST", FOR_KERNELS, "levels whose kernels to measure, e.g. avx2,avx512 (default: all)",
     opt_isa},
    {"--model", "-m", "MODEL", FOR_MODEL | FOR_PROFILE | FOR_CHECK, "GGUF model file", opt_model},
    {"--prompt-tokens", NULL, "N", FOR_MODEL, "random prompt tokens to prefill (default 128)", opt_prompt_tokens},
    {"--gen-tokens", NULL, "N", FOR_MODEL, "tokens to decode greedily (default 32)", opt_gen_tokens},
    {"--seed", NULL, "S", FOR_MODEL, "seed of the random prompt (default 1)", opt_seed},
    {"--cold", NULL, NULL, FOR_MODEL, "time a fresh engine's first prefill (default: after one untimed, same prompt)",
     opt_cold},
    {"--placement", NULL, "FILE", FOR_MODEL | FOR_PROFILE | FOR_CHECK, "placement config v1 (configs/*.yaml)",
     opt_placement},
    {"--prompts", NULL, "FILE", FOR_PROFILE | FOR_CHECK,
     "prompts, one a line: text, or JSON chat messages (check: default, 3 built-in ones)", opt_prompts},
    {"--max-tokens", NULL, "N", FOR_PROFILE | FOR_CHECK, "new tokens per prompt, greedy (default 64; check: 16)",
     opt_max_tokens},
    {"--batch", NULL, "N", FOR_PROFILE, "prompts decoding at once (default 1)", opt_batch},
    {"--half-life", NULL, "T", FOR_PROFILE, "decay counts with this half-life in tokens (default 0: none)",
     opt_half_life},
    {"--expert-cache", NULL, "SLOTS", FOR_PROFILE,
     "the placement's device also caches SLOTS experts per MoE layer (kt-serve --expert-cache; default 0: off)",
     opt_expert_cache},
    {"--expert-cache-policy", NULL, "P", FOR_PROFILE, "lru (default) or lfu", opt_expert_cache_policy},
    {"--output", "-o", "FILE", FOR_PROFILE | FOR_MACHINE, "the routing profile, or the machine file, to write (JSON)",
     opt_output},
    {"--svg", NULL, "FILE", FOR_MODEL | FOR_PROFILE,
     "also draw a picture: profile, the layers x experts heat map; model, each layer's time split", opt_svg},
    {"--topology", NULL, "SYNTH", FOR_MACHINE, "hwloc synthetic topology, e.g. \"package:2 numa:1 core:1 pu:1\"",
     opt_topology},
    {"--sim-transfer-gbps", NULL, "G", FOR_MACHINE, "the sim's modelled link bandwidth (default 25)", opt_sim_transfer},
    {"--sim-latency-us", NULL, "U", FOR_MACHINE, "the sim's modelled copy latency (default 10)", opt_sim_latency},
    {"--predict", NULL, NULL, FOR_MODEL, "also predict each layer's time (cost model) beside the measured", opt_predict},
    {"--machine", NULL, "FILE", FOR_MODEL, "--predict: machine file (kt-bench machine; default: stated defaults)",
     opt_machine},
    {"--profile", NULL, "FILE", FOR_MODEL, "--predict: routing profile (default: uniform routing)", opt_profile},
};
#define N_OPTIONS (sizeof options_table / sizeof options_table[0])

static void usage(FILE *f);

static const struct kt_cli cli = {
    .prog = "kt-bench",
    .options = options_table,
    .n_options = N_OPTIONS,
    .usage = usage,
    .operand = NULL, /* no operands */
};

static const char *command_label(unsigned commands)
{
    switch (commands) {
    case FOR_KERNELS: return "kernels";
    case FOR_MODEL: return "model";
    case FOR_PROFILE: return "profile";
    case FOR_MODEL | FOR_PROFILE: return "mod/prof";
    case FOR_MACHINE: return "machine";
    case FOR_KERNELS | FOR_MACHINE: return "kern/mch";
    case FOR_PROFILE | FOR_MACHINE: return "prof/mch";
    case FOR_PROFILE | FOR_CHECK: return "prof/chk";
    case FOR_CHECK: return "check";
    default: return "";
    }
}

static void usage(FILE *f)
{
    fprintf(f, "usage: kt-bench kernels [--threads N] [--json FILE] [--seconds S] [--prefill-tokens N]\n"
               "       kt-bench model -m MODEL [--placement FILE] [--prompt-tokens N] [--gen-tokens N] [--threads N]\n"
               "                      [--json FILE] [--predict [--machine FILE] [--profile FILE]]\n"
               "       kt-bench profile -m MODEL --prompts FILE [--max-tokens N] [--batch N] [--half-life T]\n"
               "                        -o PROFILE.json\n"
               "       kt-bench machine [-t N] [--topology SYNTH] [--seconds S] -o machine.json\n"
               "       kt-bench check -m MODEL [--placement FILE] [--prompts FILE] [--max-tokens N] [-t N]\n"
               "                      [--json FILE]\n"
               "\n  kernels  STREAM triad, FMA and int8 dot peaks, then every CPU kernel per weight type\n"
               "           and instruction set at a decode shape (GB/s, / triad) and a prefill shape\n"
               "           (GFLOP/s, / peak)\n"
               "  model    prefill and greedy decode speed, weight bytes per token / triad, and each\n"
               "           layer's time split into attention, router, experts and combine\n"
               "  profile  prompts through prefill and greedy decode; writes the routing the engine\n"
               "           counted (tokens per layer and expert, decode and prefill apart) as a profile\n"
               "  machine  what the cost model needs on this host, per NUMA node (triad, peaks, the expert\n"
               "           path's decode rate and prefill GFLOP/s per weight type) and per accelerator\n"
               "  check    is the placement right on this machine: prompts through it and through a CPU\n"
               "           reference reading every weight from the file, on the same tokens; every row of\n"
               "           logits compared (a prompt passes with its median row <= 1e-2 and 9 in 10 <= 3e-2),\n"
               "           and the layer named where they start to part; exit 0 PASS, 2 FAIL, 1 error\n\noptions:\n");
    kt_cli_print_options(f, &cli, command_label);
}

/* Returns -1 to go on, else the exit status. */
static int parse_args(int argc, char **argv, struct kt_bench_options *o)
{
    *o = (struct kt_bench_options){.prefill_tokens = 128, .prompt_tokens = 128, .gen_tokens = 32, .seed = 1,
                                   .batch = 1, .sim_transfer_gbps = KT_MACHINE_DEFAULT_LINK_GBPS,
                                   .sim_latency_us = KT_MACHINE_DEFAULT_LINK_LATENCY_US};
    if (argc >= 2 && (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help"))) {
        usage(stdout);
        return 0;
    }
    if (argc < 2)
        return kt_cli_usage_error(&cli, "%s", "no command given (kernels, model, profile, machine or check)");
    unsigned which;
    if (!strcmp(argv[1], "kernels"))
        which = FOR_KERNELS;
    else if (!strcmp(argv[1], "model"))
        which = FOR_MODEL;
    else if (!strcmp(argv[1], "profile"))
        which = FOR_PROFILE;
    else if (!strcmp(argv[1], "machine"))
        which = FOR_MACHINE;
    else if (!strcmp(argv[1], "check"))
        which = FOR_CHECK;
    else
        return kt_cli_usage_error(&cli, "unknown command '%s' (kernels, model, profile, machine or check)", argv[1]);
    o->command = argv[1];
    int rc = kt_cli_parse(&cli, argc, argv, 2, which, o);
    if (rc >= 0)
        return rc;
    if (!o->seconds)
        o->seconds = which == FOR_MACHINE ? 0.3 : 1.0;
    if (which == FOR_MODEL && !o->model)
        return kt_cli_usage_error(&cli, "%s", "model: no model given (-m MODEL)");
    if (which == FOR_CHECK && !o->model)
        return kt_cli_usage_error(&cli, "%s", "check: no model given (-m MODEL)");
    if (!o->max_tokens)
        o->max_tokens = which == FOR_CHECK ? KT_CHECK_MAX_TOKENS : 64;
    if (which == FOR_PROFILE && (!o->model || !o->prompts || !o->output))
        return kt_cli_usage_error(&cli, "%s", "profile: needs -m MODEL, --prompts FILE and -o PROFILE.json");
    return -1;
}

int main(int argc, char **argv)
{
    struct kt_bench_options o;
    int rc = parse_args(argc, argv, &o);
    if (rc >= 0)
        return rc;
    kt_err err = {0};
    if (!o.threads && kt_tool_default_threads("kt-bench", stderr, &o.threads, &err) != KT_OK) {
        fprintf(stderr, "kt-bench: %s\n", err.msg);
        return 1;
    }
    if (!strcmp(o.command, "profile"))
        return kt_bench_profile(&o);
    if (!strcmp(o.command, "machine"))
        return kt_bench_machine(&o);
    if (!strcmp(o.command, "check"))
        return kt_bench_check(&o);
    return !strcmp(o.command, "kernels") ? kt_bench_kernels(&o) : kt_bench_model(&o);
}
