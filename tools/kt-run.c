/*
 * kt-run.c - the one-shot command line: describe a model (--info) or
 * generate text from a prompt (-p) or one chat turn (--chat).
 *
 * This file parses arguments; tools/run/ holds the two jobs.  It is a thin
 * main over the runtime: it must never compute model facts itself and only
 * tools/ code prints.  Exit status: 0 done, 1 the model or run failed (one
 * line "kt-run: why"), 2 usage.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "run.h"

/* ---- arguments ------------------------------------------------------------------ */

static bool opt_model(void *opts, const char *arg, char *why, size_t why_size)
{
    struct kt_run_options *o = opts;
    if (o->model) {
        snprintf(why, why_size, "more than one model given ('%s')", arg);
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

static bool opt_ctx(void *opts, const char *arg, char *why, size_t why_size)
{
    struct kt_run_options *o = opts;
    return kt_cli_parse_u32(arg, 1, UINT32_MAX, &o->ctx) || kt_cli_invalid(why, why_size, "--ctx", arg);
}

static bool opt_gpu_experts(void *opts, const char *arg, char *why, size_t why_size)
{
    struct kt_run_options *o = opts;
    o->n_gpu_experts = 0;
    const char *p = arg;
    for (;;) {
        char item[32];
        size_t n = strcspn(p, ",");
        uint32_t v;
        if (n == 0 || n >= sizeof item) {
            snprintf(why, why_size, "--gpu-experts: '%s' is not a comma-separated list of counts", arg);
            return false;
        }
        memcpy(item, p, n);
        item[n] = 0;
        if (!kt_cli_parse_u32(item, 0, 1u << 24, &v)) {
            snprintf(why, why_size, "--gpu-experts: '%s' is not a count of experts", item);
            return false;
        }
        if (o->n_gpu_experts == KT_RUN_MAX_GPU_COUNTS) {
            snprintf(why, why_size, "--gpu-experts: at most %d counts", KT_RUN_MAX_GPU_COUNTS);
            return false;
        }
        o->gpu_experts[o->n_gpu_experts++] = (int)v;
        if (!p[n])
            return true;
        p += n + 1;
    }
}

static bool opt_prompt(void *opts, const char *arg, char *why, size_t why_size)
{
    struct kt_run_options *o = opts;
    (void)why, (void)why_size;
    o->prompt = arg;
    return true;
}

static bool opt_chat(void *opts, const char *arg, char *why, size_t why_size)
{
    struct kt_run_options *o = opts;
    (void)why, (void)why_size;
    o->chat = arg;
    return true;
}

static bool opt_system(void *opts, const char *arg, char *why, size_t why_size)
{
    struct kt_run_options *o = opts;
    (void)why, (void)why_size;
    o->system = arg;
    return true;
}

static bool opt_n_predict(void *opts, const char *arg, char *why, size_t why_size)
{
    struct kt_run_options *o = opts;
    return kt_cli_parse_u32(arg, 0, UINT32_MAX, &o->n_predict) || kt_cli_invalid(why, why_size, "-n", arg);
}

static bool opt_ignore_eos(void *opts, const char *arg, char *why, size_t why_size)
{
    struct kt_run_options *o = opts;
    (void)arg, (void)why, (void)why_size;
    o->ignore_eos = true;
    return true;
}

static bool opt_temp(void *opts, const char *arg, char *why, size_t why_size)
{
    struct kt_run_options *o = opts;
    return kt_cli_parse_float(arg, &o->temperature) || kt_cli_invalid(why, why_size, "--temp", arg);
}

static bool opt_top_p(void *opts, const char *arg, char *why, size_t why_size)
{
    struct kt_run_options *o = opts;
    return kt_cli_parse_float(arg, &o->top_p) || kt_cli_invalid(why, why_size, "--top-p", arg);
}

static bool opt_min_p(void *opts, const char *arg, char *why, size_t why_size)
{
    struct kt_run_options *o = opts;
    return kt_cli_parse_float(arg, &o->min_p) || kt_cli_invalid(why, why_size, "--min-p", arg);
}

static bool opt_top_k(void *opts, const char *arg, char *why, size_t why_size)
{
    struct kt_run_options *o = opts;
    uint32_t v;
    if (!kt_cli_parse_u32(arg, 0, INT32_MAX, &v))
        return kt_cli_invalid(why, why_size, "--top-k", arg);
    o->top_k = (int32_t)v;
    return true;
}

static bool opt_repeat_penalty(void *opts, const char *arg, char *why, size_t why_size)
{
    struct kt_run_options *o = opts;
    return kt_cli_parse_float(arg, &o->repeat_penalty) || kt_cli_invalid(why, why_size, "--repeat-penalty", arg);
}

static bool opt_presence_penalty(void *opts, const char *arg, char *why, size_t why_size)
{
    struct kt_run_options *o = opts;
    return kt_cli_parse_float(arg, &o->presence_penalty) || kt_cli_invalid(why, why_size, "--presence-penalty", arg);
}

static bool opt_frequency_penalty(void *opts, const char *arg, char *why, size_t why_size)
{
    struct kt_run_options *o = opts;
    return kt_cli_parse_float(arg, &o->frequency_penalty) || kt_cli_invalid(why, why_size, "--frequency-penalty", arg);
}

static bool opt_seed(void *opts, const char *arg, char *why, size_t why_size)
{
    struct kt_run_options *o = opts;
    if (!kt_cli_parse_u64(arg, 0, UINT64_MAX, &o->seed))
        return kt_cli_invalid(why, why_size, "--seed", arg);
    o->seed_given = true;
    return true;
}

static bool opt_threads(void *opts, const char *arg, char *why, size_t why_size)
{
    struct kt_run_options *o = opts;
    return kt_cli_parse_u32(arg, 1, 4096, &o->threads) || kt_cli_invalid(why, why_size, "--threads", arg);
}

static bool opt_logits_out(void *opts, const char *arg, char *why, size_t why_size)
{
    struct kt_run_options *o = opts;
    (void)why, (void)why_size;
    o->logits_out = arg;
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

static bool opt_placement(void *opts, const char *arg, char *why, size_t why_size)
{
    (void)why, (void)why_size;
    ((struct kt_run_options *)opts)->placement = arg;
    return true;
}

static const struct kt_cli_option options_table[] = {
    {"--model", "-m", "MODEL", 0, "GGUF model file (or give it as the first operand)", opt_model},
    {"--info", NULL, NULL, 0, "describe the model: hyperparameters, tensors, memory per placement", opt_info},
    {"--prompt", "-p", "TEXT", 0, "generate a continuation of TEXT", opt_prompt},
    {"--chat", NULL, "TEXT", 0, "generate the reply to one user turn, through the model's chat template", opt_chat},
    {"--system", NULL, "TEXT", 0, "system turn for --chat", opt_system},
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
    {"--ctx", NULL, "N", 0, "context length (default 4096, or the model's if smaller)", opt_ctx},
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

static const struct kt_cli cli = {
    .prog = "kt-run",
    .options = options_table,
    .n_options = N_OPTIONS,
    .usage = usage,
    .operand = opt_model, /* the model may be given as the operand */
};

static void usage(FILE *f)
{
    fprintf(f, "usage: kt-run -m MODEL (-p TEXT | --chat TEXT) [options]\n"
               "       kt-run --info [options] MODEL\n\noptions:\n");
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
    };
    int rc = kt_cli_parse(&cli, argc, argv, 1, 0, o);
    if (rc >= 0)
        return rc;
    if (!o->model)
        return kt_cli_usage_error(&cli, "%s", "no model given");
    if (o->prompt && o->chat)
        return kt_cli_usage_error(&cli, "%s", "give -p or --chat, not both");
    if (o->system && !o->chat)
        return kt_cli_usage_error(&cli, "%s", "--system goes with --chat");
    if (!o->info && !o->prompt && !o->chat)
        return kt_cli_usage_error(&cli, "%s", "nothing to do: give -p TEXT, --chat TEXT or --info");
    if (o->info && (o->prompt || o->chat))
        return kt_cli_usage_error(&cli, "%s", "--info describes the model; run generation separately");
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
