/*
 * kt-run.c - the one-shot command line: describe a model (--info) or
 * generate text from a prompt (-p) or one chat turn (--chat).
 *
 * This file parses arguments; tools/run/ holds the two jobs.  It is a thin
 * main over the runtime: it must never compute model facts itself and only
 * tools/ code prints.  Exit status: 0 done, 1 the model or run failed (one
 * line "kt-run: why"), 2 usage.
 */
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "kv_type.h"
#include "preflight.h"
#include "run.h"

/* ---- arguments ------------------------------------------------------------------ */

#define OPTS(o) ((struct kt_run_options *)(o))

static bool opt_model(void *opts, const char *arg, char *why, size_t why_size)
{
    struct kt_run_options *o = opts;
    if (o->model) {
        snprintf(why, why_size, "more than one model given ('%s' and '%s'): give one", o->model, arg);
        return false;
    }
    o->model = arg;
    return true;
}

static bool opt_info(void *opts, const char *arg, char *why, size_t why_size)
{
    struct kt_run_options *o = opts;
    (void)arg, (void)why, (void)why_size;
    o->info = true;
    return true;
}

KT_CLI_U32_OPTION(opt_ctx, ctx, 1, KT_TOOL_MAX_CTX, "--ctx", "positions; at most the model's context_length")
KT_CLI_U32_OPTION(opt_n_predict, n_predict, 0, KT_TOOL_MAX_CTX, "-n", NULL)
KT_CLI_U32_OPTION(opt_threads, threads, 1, 4096, "--threads", NULL)
KT_CLI_U32_OPTION(opt_batch, batch, 1, 65536, "--batch", "tokens a step")
KT_CLI_U32_OPTION(opt_micro_batches, micro_batches, 1, 16, "--micro-batches", NULL)
KT_CLI_U32_OPTION(opt_rank_timeout, rank_timeout, 1, 86400, "--rank-timeout", "seconds")
KT_CLI_STRING_OPTION(opt_prompt, prompt)
KT_CLI_STRING_OPTION(opt_chat, chat)
KT_CLI_STRING_OPTION(opt_system, system)
KT_CLI_STRING_OPTION(opt_chat_template, chat_template)
KT_CLI_STRING_OPTION(opt_logits_out, logits_out)
KT_CLI_STRING_OPTION(opt_placement, placement)

static bool opt_kv_type(void *opts, const char *arg, char *why, size_t why_size)
{
    ((struct kt_run_options *)opts)->kv_type_given = true;
    return kt_tool_parse_kv_type(arg, &((struct kt_run_options *)opts)->kv_type, why, why_size);
}

static bool opt_gpu_experts(void *opts, const char *arg, char *why, size_t why_size)
{
    struct kt_run_options *o = opts;
    o->gpu_experts_given = true;
    o->n_gpu_experts = 0;
    const char *p = arg;
    for (;;) {
        char item[32];
        size_t n = strcspn(p, ",");
        uint32_t v;
        if (n == 0 || n >= sizeof item) {
            snprintf(why, why_size, "--gpu-experts '%s' is not a comma-separated list of counts: give e.g. 0,8,32",
                     arg);
            return false;
        }
        memcpy(item, p, n);
        item[n] = 0;
        if (!kt_cli_u32_arg("--gpu-experts: the count", item, 0, 1u << 24, "experts per layer", &v, why, why_size))
            return false;
        if (o->n_gpu_experts == KT_RUN_MAX_GPU_COUNTS) {
            snprintf(why, why_size, "--gpu-experts '%s' has more than %d counts: give at most %d", arg,
                     KT_RUN_MAX_GPU_COUNTS, KT_RUN_MAX_GPU_COUNTS);
            return false;
        }
        o->gpu_experts[o->n_gpu_experts++] = (int)v;
        if (!p[n])
            return true;
        p += n + 1;
    }
}

static bool opt_ignore_eos(void *opts, const char *arg, char *why, size_t why_size)
{
    struct kt_run_options *o = opts;
    (void)arg, (void)why, (void)why_size;
    o->ignore_eos = true;
    return true;
}

/* The sampler's ranges (runtime/text/sampler.h), refused here with the option's name. */
static bool opt_temp(void *o, const char *arg, char *why, size_t ws)
{
    return kt_cli_float_arg("--temp", arg, 0, INFINITY, KT_CLI_CLOSED, "0: greedy", &OPTS(o)->temperature, why, ws);
}

static bool opt_top_p(void *o, const char *arg, char *why, size_t ws)
{
    return kt_cli_float_arg("--top-p", arg, 0, 1, KT_CLI_LO_OPEN, "1: off", &OPTS(o)->top_p, why, ws);
}

static bool opt_min_p(void *o, const char *arg, char *why, size_t ws)
{
    return kt_cli_float_arg("--min-p", arg, 0, 1, KT_CLI_CLOSED, "0: off", &OPTS(o)->min_p, why, ws);
}

static bool opt_top_k(void *o, const char *arg, char *why, size_t ws)
{
    uint32_t v;
    if (!kt_cli_u32_arg("--top-k", arg, 0, INT32_MAX, "0: off", &v, why, ws))
        return false;
    OPTS(o)->top_k = (int32_t)v;
    return true;
}

static bool opt_repeat_penalty(void *o, const char *arg, char *why, size_t ws)
{
    return kt_cli_float_arg("--repeat-penalty", arg, 0, INFINITY, KT_CLI_LO_OPEN, "1: off", &OPTS(o)->repeat_penalty,
                            why, ws);
}

static bool opt_presence_penalty(void *o, const char *arg, char *why, size_t ws)
{
    return kt_cli_float_arg("--presence-penalty", arg, -2, 2, KT_CLI_CLOSED, "0: off", &OPTS(o)->presence_penalty, why,
                            ws);
}

static bool opt_frequency_penalty(void *o, const char *arg, char *why, size_t ws)
{
    return kt_cli_float_arg("--frequency-penalty", arg, -2, 2, KT_CLI_CLOSED, "0: off", &OPTS(o)->frequency_penalty,
                            why, ws);
}

static bool opt_seed(void *o, const char *arg, char *why, size_t ws)
{
    if (!kt_cli_u64_arg("--seed", arg, 0, UINT64_MAX, NULL, &OPTS(o)->seed, why, ws))
        return false;
    OPTS(o)->seed_given = true;
    return true;
}

static bool opt_bandwidth(void *opts, const char *arg, char *why, size_t why_size)
{
    struct kt_run_options *o = opts;
    (void)arg, (void)why, (void)why_size;
    o->bandwidth = true;
    return true;
}

static bool opt_quiet(void *opts, const char *arg, char *why, size_t why_size)
{
    struct kt_run_options *o = opts;
    (void)arg, (void)why, (void)why_size;
    o->quiet = true;
    return true;
}

static const struct kt_cli_option options_table[] = {
    {"--model", "-m", "MODEL", 0, "GGUF model file or Hugging Face checkpoint directory (or give it as the first operand)", opt_model},
    {"--info", NULL, NULL, 0, "describe the model: hyperparameters, tensors, memory per placement; with --placement, "
     "a dry run of that plan: where each expert lives, memory per device and node, whether it fits here", opt_info},
    {"--prompt", "-p", "TEXT", 0, "generate a continuation of TEXT", opt_prompt},
    {"--chat", NULL, "TEXT", 0, "generate the reply to one user turn, through the model's chat template", opt_chat},
    {"--system", NULL, "TEXT", 0, "system turn for --chat", opt_system},
    {"--chat-template", NULL, "FILE", 0, "render --chat with this Jinja chat template instead of the model's (with "
     "--info: name how it renders)", opt_chat_template},
    {"--n-predict", "-n", "N", 0, "most tokens to generate (default 128)", opt_n_predict},
    {"--ignore-eos", NULL, NULL, 0, "do not stop at end-of-generation tokens", opt_ignore_eos},
    {"--temp", NULL, "T", 0, "temperature; 0 = greedy (default 0.8)", opt_temp},
    {"--top-k", NULL, "K", 0, "keep the K most likely tokens; 0 = off (default 0)", opt_top_k},
    {"--top-p", NULL, "P", 0, "nucleus sampling; 1 = off (default 0.95)", opt_top_p},
    {"--min-p", NULL, "P", 0, "drop tokens below P x the most likely; 0 = off (default 0)", opt_min_p},
    {"--repeat-penalty", NULL, "R", 0, "repetition penalty over prompt and output; 1 = off", opt_repeat_penalty},
    {"--presence-penalty", NULL, "X", 0, "OpenAI presence penalty in [-2, 2]", opt_presence_penalty},
    {"--frequency-penalty", NULL, "X", 0, "OpenAI frequency penalty in [-2, 2]", opt_frequency_penalty},
    {"--seed", NULL, "S", 0, "sampling seed (default: from the clock, printed)", opt_seed},
    {"--threads", "-t", "N", 0, "worker threads (default: the CPUs this process may use)", opt_threads},
    {"--ctx", NULL, "N", 0, "context length (default: the model's when its KV cache fits half the free memory, "
     "else the largest that does)", opt_ctx},
    {"--batch", NULL, "N", 0, "most tokens a step: prompts longer than N prefill in chunks of N (default 256)", opt_batch},
    {"--micro-batches", NULL, "N", 0, "under mpirun: slices of a decode batch sent down the pipeline one after the "
     "other (default: the number of ranks; 1: none)", opt_micro_batches},
    {"--rank-timeout", NULL, "S", 0, "under mpirun: rank 0 gives up on a step another rank has not answered in S "
     "seconds (default 120)", opt_rank_timeout},
    {"--kv-type", NULL, "T", 0, "KV cache rows: f32, bf16 or f16 (default bf16: half of f32)", opt_kv_type},
    {"--logits-out", NULL, "FILE", 0, "write float32 logits of the last position of every step", opt_logits_out},
    {"--bandwidth", NULL, NULL, 0, "measure a STREAM triad on the same threads; report decode bytes/s against it",
     opt_bandwidth},
    {"--quiet", "-q", NULL, 0, "do not print the generated text (statistics only)", opt_quiet},
    {"--placement", NULL, "FILE", 0, "placement config v1 (configs/*.yaml): experts on NUMA nodes and a device",
     opt_placement},
    {"--gpu-experts", NULL, "LIST", 0, "with --info: routed experts per layer on the GPU to show memory for "
                                    "(default 0,8,32)", opt_gpu_experts},
};
#define N_OPTIONS (sizeof options_table / sizeof options_table[0])

static void usage(FILE *f);

#define SYNOPSIS                                                                                                       \
    "usage: kt-run -m MODEL (-p TEXT | --chat TEXT) [options]\n"                                                      \
    "       kt-run --info [--placement FILE] [options] MODEL\n"

static const struct kt_cli cli = {
    .prog = "kt-run",
    .synopsis = SYNOPSIS,
    .options = options_table,
    .n_options = N_OPTIONS,
    .usage = usage,
    .operand = opt_model, /* the model may be given as the operand */
};

static void usage(FILE *f)
{
    fprintf(f, SYNOPSIS "\noptions:\n");
    kt_cli_print_options(f, &cli, NULL);
    fprintf(f, "\nenvironment:\n"
               "  KT_TOPOLOGY_SYNTHETIC=DESC  see NUMA nodes and cores as hwloc's synthetic description DESC says,\n"
               "                              e.g. \"numa:2 core:4 pu:1\": try a 2-socket --placement on one socket\n"
               "                              (nothing is pinned; README.md, \"Trying a 2-socket plan\")\n");
}

/* Returns -1 to go on, else the exit status. */
static int parse_args(int argc, char **argv, struct kt_run_options *o)
{
    *o = (struct kt_run_options){
        .gpu_experts = {0, 8, 32},
        .n_gpu_experts = 3,
        .n_predict = 128,
        .temperature = 0.8f,
        .top_p = 0.95f,
        .repeat_penalty = 1.0f,
        .kv_type = KT_TOOL_DEFAULT_KV_TYPE,
    };
    int rc = kt_cli_parse(&cli, argc, argv, 1, 0, o);
    if (rc >= 0)
        return rc;
    if (!o->model)
        return kt_cli_usage_error(&cli, "%s", "no model given: give -m MODEL.gguf");
    if (o->prompt && o->chat)
        return kt_cli_usage_error(&cli, "%s", "-p and --chat both given: give one (-p continues raw text, --chat "
                                              "answers a user turn)");
    if (o->chat_template && !o->chat && !o->info)
        return kt_cli_usage_error(&cli, "%s", "--chat-template goes with --chat or --info: give one of them too");
    if (o->chat_template && access(o->chat_template, R_OK) != 0) {
        char why[1200];
        snprintf(why, sizeof why, "--chat-template %s: cannot read: %s", o->chat_template, strerror(errno));
        return kt_cli_usage_error(&cli, "%s", why);
    }
    if (o->system && !o->chat)
        return kt_cli_usage_error(&cli, "%s", "--system goes with --chat: give --chat TEXT too, or drop --system");
    if (!o->info && !o->prompt && !o->chat)
        return kt_cli_usage_error(&cli, "%s", "nothing to do: give -p TEXT, --chat TEXT or --info");
    if (o->info && (o->prompt || o->chat))
        return kt_cli_usage_error(&cli, "%s", "--info describes the model and generates nothing: drop -p/--chat, or "
                                              "run them without --info");
    if (o->gpu_experts_given && !o->info)
        return kt_cli_usage_error(&cli, "%s",
                                  "--gpu-experts picks the rows of --info's memory table: give --info too");
    return -1;
}

int main(int argc, char **argv)
{
    struct kt_run_options o;
    int rc = parse_args(argc, argv, &o);
    if (rc >= 0)
        return rc;
    return o.info ? kt_run_info(&o) : kt_run_generate(&o);
}
