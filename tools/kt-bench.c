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
#include "kv_type.h"
#include "cpu/dispatch.h"
#include "machine.h"
#include "preflight.h"
#include "threads.h"

/* ---- arguments ------------------------------------------------------------------ */

enum { FOR_KERNELS = 1, FOR_MODEL = 2, FOR_BOTH = 3, FOR_MACHINE = 4, FOR_PROFILE = 8, FOR_CHECK = 16, FOR_GRAMMAR = 32,
       FOR_NETWORK = 64 };
static const char *const command_names[] = {"kernels", "model", "machine", "profile", "check", "grammar",
                                             "network"}; /* by bit */

#define OPTS(o) ((struct kt_bench_options *)(o))

KT_CLI_U32_OPTION(opt_threads, threads, 1, 4096, "--threads", NULL)
KT_CLI_U32_OPTION(opt_prefill_tokens, prefill_tokens, 1, 4096, "--prefill-tokens", NULL)
KT_CLI_U32_OPTION(opt_prompt_tokens, prompt_tokens, 1, 1u << 20, "--prompt-tokens", NULL)
KT_CLI_U32_OPTION(opt_gen_tokens, gen_tokens, 1, 1u << 20, "--gen-tokens", NULL)
KT_CLI_U32_OPTION(opt_max_tokens, max_tokens, 1, 1u << 20, "--max-tokens", NULL)
KT_CLI_U32_OPTION(opt_vocab, vocab_tokens, 512, 1u << 24, "--vocab", "tokens")
KT_CLI_U32_OPTION(opt_batch, batch, 1, 256, "--batch", "prompts at once")
KT_CLI_U32_OPTION(opt_expert_cache, expert_cache_slots, 0, 65536, "--expert-cache", "slots per MoE layer; 0: off")
KT_CLI_DOUBLE_OPTION(opt_seconds, seconds, 0.01, 600, KT_CLI_CLOSED, "--seconds", NULL)
KT_CLI_DOUBLE_OPTION(opt_half_life, half_life, 0, 1e18, KT_CLI_CLOSED, "--half-life", "tokens; 0: no decay")
KT_CLI_DOUBLE_OPTION(opt_sim_transfer, sim_transfer_gbps, 0, 1e6, KT_CLI_LO_OPEN, "--sim-transfer-gbps", "GB/s")
KT_CLI_DOUBLE_OPTION(opt_sim_latency, sim_latency_us, 0, 1e6, KT_CLI_CLOSED, "--sim-latency-us", "microseconds")
KT_CLI_STRING_OPTION(opt_json, json)
KT_CLI_STRING_OPTION(opt_placement, placement)

static bool opt_kv_type(void *opts, const char *arg, char *why, size_t why_size)
{
    ((struct kt_bench_options *)opts)->kv_type_given = true;
    return kt_tool_parse_kv_type(arg, &((struct kt_bench_options *)opts)->kv_type, why, why_size);
}
KT_CLI_STRING_OPTION(opt_prompts, prompts)
KT_CLI_STRING_OPTION(opt_output, output)
KT_CLI_STRING_OPTION(opt_svg, svg)
KT_CLI_STRING_OPTION(opt_topology, topology)
KT_CLI_STRING_OPTION(opt_machine, machine)
KT_CLI_STRING_OPTION(opt_profile, profile)

static bool opt_isa(void *opts, const char *arg, char *why, size_t why_size)
{
    struct kt_bench_options *o = opts;
    const char *names[4];
    for (int i = 0; i < 4; i++)
        names[i] = kt_isa_name((enum kt_isa)i);
    const char *p = arg;
    for (;;) {
        char item[32];
        size_t n = strcspn(p, ",");
        snprintf(item, sizeof item, "%.*s", (int)(n < sizeof item ? n : sizeof item - 1), p);
        int found = kt_cli_choice_arg("--isa: the level", item, names, 4, why, why_size);
        if (found < 0)
            return false;
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
        snprintf(why, why_size, "more than one model given ('%s' and '%s'): give one", o->model, arg);
        return false;
    }
    o->model = arg;
    return true;
}

static bool opt_seed(void *o, const char *arg, char *why, size_t ws)
{
    return kt_cli_u64_arg("--seed", arg, 0, UINT64_MAX, NULL, &OPTS(o)->seed, why, ws);
}

static bool opt_expert_cache_policy(void *o, const char *arg, char *why, size_t ws)
{
    OPTS(o)->expert_cache_policy_given = true;
    return kt_cli_cache_policy_arg(arg, &OPTS(o)->expert_cache_lfu, why, ws);
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

static const struct kt_cli_option options_table[] = {
    {"--threads", "-t", "N", FOR_BOTH | FOR_PROFILE | FOR_MACHINE | FOR_CHECK,
     "threads (default: the CPUs this process may use)", opt_threads},
    {"--json", NULL, "FILE", FOR_BOTH | FOR_CHECK | FOR_GRAMMAR | FOR_NETWORK, "also write the results as JSON to FILE",
     opt_json},
    {"--seconds", NULL, "S", FOR_KERNELS | FOR_MACHINE, "time per measurement (default 1; machine: per point, 0.3)",
     opt_seconds},
    {"--prefill-tokens", NULL, "N", FOR_KERNELS | FOR_NETWORK,
     "tokens of the prefill shape, or of the prefill chunk's message (default 128)", opt_prefill_tokens},
    {"--isa", NULL, "LIST", FOR_KERNELS, "levels whose kernels to measure, e.g. avx2,avx512 (default: all)",
     opt_isa},
    {"--model", "-m", "MODEL", FOR_MODEL | FOR_PROFILE | FOR_CHECK | FOR_GRAMMAR | FOR_NETWORK,
     "GGUF model file or Hugging Face checkpoint directory (grammar: a GGUF file, for its tokenizer; network: "
     "for its width, default 7168)", opt_model},
    {"--vocab", NULL, "N", FOR_GRAMMAR, "tokens of the synthetic vocabulary without -m (default 163840, Kimi-K2's)",
     opt_vocab},
    {"--prompt-tokens", NULL, "N", FOR_MODEL, "random prompt tokens to prefill (default 128)", opt_prompt_tokens},
    {"--gen-tokens", NULL, "N", FOR_MODEL, "tokens to decode greedily (default 32)", opt_gen_tokens},
    {"--seed", NULL, "S", FOR_MODEL | FOR_GRAMMAR, "seed of the random prompt or vocabulary (default 1)", opt_seed},
    {"--cold", NULL, NULL, FOR_MODEL, "time a fresh engine's first prefill (default: after one untimed, same prompt)",
     opt_cold},
    {"--placement", NULL, "FILE", FOR_MODEL | FOR_PROFILE | FOR_CHECK, "placement config v1 (configs/*.yaml)",
     opt_placement},
    {"--kv-type", NULL, "T", FOR_MODEL | FOR_PROFILE, "KV cache rows: f32, bf16 or f16 (default bf16)", opt_kv_type},
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
    {"--machine", NULL, "FILE", FOR_MODEL | FOR_NETWORK,
     "--predict: machine file (kt-bench machine; default: stated defaults); network: each rank's, its \"%r\" the "
     "rank, into which it writes its link",
     opt_machine},
    {"--profile", NULL, "FILE", FOR_MODEL, "--predict: routing profile (default: uniform routing)", opt_profile},
};
#define N_OPTIONS (sizeof options_table / sizeof options_table[0])

static void usage(FILE *f);

#define N_COMMANDS (sizeof command_names / sizeof command_names[0])
#define SYNOPSIS                                                                                                       \
    "usage: kt-bench kernels [--threads N] [--json FILE] [--seconds S] [--prefill-tokens N]\n"                       \
    "       kt-bench model -m MODEL [--placement FILE] [--prompt-tokens N] [--gen-tokens N] [--threads N]\n"          \
    "                      [--json FILE] [--predict [--machine FILE] [--profile FILE]]\n"                             \
    "       kt-bench profile -m MODEL --prompts FILE [--max-tokens N] [--batch N] [--half-life T]\n"                  \
    "                        -o PROFILE.json\n"                                                                      \
    "       kt-bench machine [-t N] [--topology SYNTH] [--seconds S] -o machine.json\n"                               \
    "       kt-bench check -m MODEL [--placement FILE] [--prompts FILE] [--max-tokens N] [-t N]\n"                    \
    "                      [--json FILE]\n" \
    "       kt-bench grammar [-m MODEL | --vocab N] [--seed S] [--json FILE]\n"                 \
    "       mpirun -np N kt-bench network [-m MODEL] [--prefill-tokens N] [--machine FILE] [--json FILE]\n"

static const struct kt_cli cli = {
    .prog = "kt-bench",
    .synopsis = SYNOPSIS,
    .command_names = command_names,
    .n_commands = N_COMMANDS,
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
    case FOR_GRAMMAR: return "grammar";
    case FOR_MODEL | FOR_GRAMMAR: return "mod/gram";
    case FOR_MODEL | FOR_PROFILE | FOR_CHECK | FOR_GRAMMAR | FOR_NETWORK: return "m/p/c/g/n";
    case FOR_BOTH | FOR_CHECK | FOR_GRAMMAR | FOR_NETWORK: return "k/m/c/g/n";
    case FOR_KERNELS | FOR_NETWORK: return "kern/net";
    case FOR_MODEL | FOR_NETWORK: return "mod/net";
    default: return "";
    }
}

static void usage(FILE *f)
{
    fprintf(f, SYNOPSIS
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
               "           and the layer named where they start to part; exit 0 PASS, 2 FAIL, 1 error\n"
               "  grammar  what constrained decoding costs: the token mask of a JSON schema per generated token\n"
               "           over a large vocabulary (the model's tokenizer, or a synthetic one)\n"
               "  network  under mpirun: the link between the ranks hop by hop round the ring (latency,\n"
               "           bandwidth, the pipeline's decode and prefill messages), through kt's transport;\n"
               "           writes each rank's into its machine file (kt-place's link model)\n\noptions:\n");
    kt_cli_print_options(f, &cli, command_label);
}

/* Returns -1 to go on, else the exit status. */
static int parse_args(int argc, char **argv, struct kt_bench_options *o)
{
    *o = (struct kt_bench_options){.prefill_tokens = 128, .prompt_tokens = 128, .gen_tokens = 32, .seed = 1,
                                   .kv_type = KT_TOOL_DEFAULT_KV_TYPE,
                                   .batch = 1, .vocab_tokens = 163840, .sim_transfer_gbps = KT_MACHINE_DEFAULT_LINK_GBPS,
                                   .sim_latency_us = KT_MACHINE_DEFAULT_LINK_LATENCY_US};
    if (argc >= 2 && (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help"))) {
        usage(stdout);
        return 0;
    }
    if (argc < 2)
        return kt_cli_usage_error(&cli, "%s",
                                  "no command given: give one of kernels, model, profile, machine, check, grammar or "
                                  "network");
    char why[512];
    int index = kt_cli_choice_arg("the command", argv[1], command_names, N_COMMANDS, why, sizeof why);
    if (index < 0)
        return kt_cli_usage_error(&cli, "%s", why);
    const unsigned which = 1u << index;
    o->command = argv[1];
    int rc = kt_cli_parse(&cli, argc, argv, 2, which, o);
    if (rc >= 0)
        return rc;
    if (!o->seconds)
        o->seconds = which == FOR_MACHINE ? 0.3 : 1.0;
    if ((which & (FOR_MODEL | FOR_PROFILE | FOR_CHECK)) && !o->model) {
        snprintf(why, sizeof why, "%s: no model given: give -m MODEL.gguf", o->command);
        return kt_cli_usage_error(&cli, "%s", why);
    }
    if (!o->max_tokens)
        o->max_tokens = which == FOR_CHECK ? KT_CHECK_MAX_TOKENS : 64;
    if (which == FOR_PROFILE && (!o->prompts || !o->output)) {
        snprintf(why, sizeof why, "profile: give %s%s%s", o->prompts ? "" : "--prompts FILE (the prompts to route)",
                 !o->prompts && !o->output ? " and " : "", o->output ? "" : "-o PROFILE.json (where to write it)");
        return kt_cli_usage_error(&cli, "%s", why);
    }
    if (which == FOR_MODEL && !o->predict && (o->machine || o->profile))
        return kt_cli_usage_error(&cli, "%s",
                                  "--machine and --profile feed --predict's cost model: give --predict too, or "
                                  "drop them");
    if (o->expert_cache_policy_given && !o->expert_cache_slots)
        return kt_cli_usage_error(&cli, "%s", "--expert-cache-policy picks what --expert-cache SLOTS keeps: give "
                                              "--expert-cache too");
    return -1;
}

int main(int argc, char **argv)
{
    struct kt_bench_options o;
    int rc = parse_args(argc, argv, &o);
    if (rc >= 0)
        return rc;
    /* the files a run writes, before it measures for minutes or loads a model */
    kt_err err = {0};
    if ((o.json && kt_tool_check_writable("--json", o.json, &err) != KT_OK) ||
        (o.svg && kt_tool_check_writable("--svg", o.svg, &err) != KT_OK) ||
        (o.output && kt_tool_check_writable("-o", o.output, &err) != KT_OK)) {
        fprintf(stderr, "kt-bench: %s\n", err.msg);
        return 1;
    }
    if (!strcmp(o.command, "network")) /* no threads of its own */
        return kt_bench_network(&o);
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
    if (!strcmp(o.command, "grammar"))
        return kt_bench_grammar(&o);
    return !strcmp(o.command, "kernels") ? kt_bench_kernels(&o) : kt_bench_model(&o);
}
