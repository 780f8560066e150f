/*
 * kt-synth.c - writes a synthetic deepseek2 GGUF file: the exact layout of a
 * real family (Kimi-K2 or DeepSeek-V3) with seeded random weights, so every
 * part of kt can be tested and timed without downloading a model.
 *
 * Only parses options (the tools' shared table, tools/cli/cli.h), prints and
 * exits; the generator lives in tools/synth.
 * Exit status: 0 written, 1 failed (I/O, memory), 2 bad usage.
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "cli.h"
#include "progress.h"
#include "quant.h"
#include "synth.h"

static void usage(FILE *out)
{
    fprintf(out,
            "usage: kt-synth --preset NAME [-o FILE] [options]\n"
            "\n"
            "Writes a deepseek2 GGUF file laid out like a real model family, with seeded\n"
            "random weights.\n"
            "\n"
            "presets:\n"
            "  tiny               Kimi-K2 semantics, hidden 512, 4 layers (1 dense), 32 experts top-8\n"
            "  tiny-v3            the same dims with DeepSeek-V3 routing (4 groups, 2 used), RoPE, tokenizer\n"
            "  tiny-thinking      tiny with the Kimi-K2-Thinking chat template (reasoning in <think>)\n"
            "  tiny-r1            tiny-v3 with the DeepSeek-R1 chat template\n"
            "  tiny-long          tiny with the smallest attention (2 heads, kv rank 32, rope 8,\n"
            "                     hidden 64): long-context tests, whose cost is per (query, key, head)\n"
            "  kimi-k2-slice      Kimi-K2's real per-layer dims; --layers (4), --experts (64)\n"
            "  deepseek-v3-slice  DeepSeek-V3's real per-layer dims, up to 3 dense layers;\n"
            "                     --layers (4), --experts (64, a multiple of the 8 groups)\n"
            "\n"
            "options:\n"
            "  -o, --output FILE     output path (default: <preset>.gguf)\n"
            "  --layers N            block count (slices keep at least one MoE layer)\n"
            "  --experts N           routed experts per MoE layer\n"
            "  --seed S              weight seed (default 1); same seed, same bytes\n"
            "  --skew S              Zipf exponent of router preference: the rank-r expert is picked\n"
            "                        ~ r^-S as often (default %.1f for tiny presets, %.1f for slices;\n"
            "                        0 = uniform)\n"
            "  --route-skew MIN:MAX  layers differ in concentration: the MoE layers' Zipf exponents are\n"
            "                        spread evenly over MIN..MAX and dealt to the layers in a seeded\n"
            "                        order (e.g. 0.2:1.5); replaces --skew\n"
            "  --route-input R       routing depends on the input: a share R in [0, 1) of each token\n"
            "                        embedding is the direction of its class (prose words, code symbols\n"
            "                        and indentation, digits, non-ASCII scripts), so code, prose and\n"
            "                        other languages prefer different experts (e.g. 0.5; default 0)\n"
            "  --threads N           generator threads (default: online CPUs)\n"
            "  --vocab-merges N      BPE merges in the vocabulary (default %d)\n"
            "  --experts-type T      routed experts (ffn_*_exps)\n"
            "  --shared-type T       shared expert (ffn_*_shexp)\n"
            "  --attn-type T         attention matrices\n"
            "  --ffn-type T          dense FFN layers\n"
            "  --embd-type T         token_embd\n"
            "  --output-type T       output (lm_head)\n"
            "  --dense-type T        every matrix but the routed experts; the options above override it\n"
            "  --format gguf|hf      gguf (default): one GGUF file; hf: a Hugging Face checkpoint\n"
            "                        directory (-o DIR, default <preset>-hf; new or empty) of the same\n"
            "                        random model: config.json, safetensors shards and index,\n"
            "                        tokenizer.json, tokenizer_config.json\n"
            "  --hf-weights W        how --format hf stores weights: bf16 (everything BF16), fp8 (block\n"
            "                        FP8 128x128 in the layers, like DeepSeek-V3) or int4-experts\n"
            "                        (compressed-tensors INT4 g32 routed experts, the rest BF16, like\n"
            "                        Kimi-K2-Thinking).  Default: int4-experts for Kimi presets, fp8 for\n"
            "                        DeepSeek-V3's\n"
            "  --hf-shard-mib N      --format hf shard size limit in MiB (default 4096)\n"
            "  --header-only         write the header (metadata, tensor table) and leave the data a\n"
            "                        hole: the file has its full size but takes ~1 MB on disk (on a\n"
            "                        file system with sparse files) and every weight reads as zero.\n"
            "                        For planning only (kt-place, kt_model_open on a real-size model,\n"
            "                        e.g. --preset kimi-k2-slice --layers 61 --experts 384); kt-run\n"
            "                        on it computes garbage\n"
            "  -q, --quiet           no progress line\n"
            "  -h, --help            this text\n"
            "\n"
            "types: f32 f16 bf16 q8_0 q4_0 q4_1 q5_0 q5_1 q4_k q5_k q6_k.  Defaults: tiny presets all\n"
            "f32; slices q4_k experts, q8_0 elsewhere.  Norms, the router and exp_probs_b are always\n"
            "f32.  A K-quant on rows that are not a multiple of 256 falls back as llama.cpp's\n"
            "quantizer does (q4_k->q5_0, q5_k->q5_1, q6_k->q8_0); a 32-block type on rows that are\n"
            "not a multiple of 32 falls back to f16.\n",
            KT_SYNTH_TINY_SKEW, KT_SYNTH_SLICE_SKEW, KT_SYNTH_DEFAULT_MERGES);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- options ------------------------------------------------------------------------------- */

/* What the command line asked for; applied over the preset's defaults. */
struct synth_options {
    const char *preset, *output, *dense_type, *role_type[KT_SYNTH_ROLE_COUNT];
    uint32_t layers, experts, threads, merges;
    uint64_t seed;
    double skew, skew_max, route_input;
    const char *format, *hf_weights;
    uint32_t hf_shard_mib;
    bool seed_given, skew_given, route_skew_given, route_input_given, merges_given, quiet, header_only;
};

#define OPTS(o) ((struct synth_options *)(o))
KT_CLI_STRING_OPTION(opt_output, output)
KT_CLI_U32_OPTION(opt_layers, layers, 1, KT_SYNTH_MAX_LAYERS, "--layers", "blocks")
KT_CLI_U32_OPTION(opt_experts, experts, 1, KT_SYNTH_MAX_EXPERTS, "--experts", "routed experts per MoE layer")
KT_CLI_U32_OPTION(opt_threads, threads, 1, 1024, "--threads", NULL)

static bool opt_preset(void *o, const char *arg, char *why, size_t ws)
{
    static const char *const presets[] = {"tiny", "tiny-v3", "tiny-thinking", "tiny-r1", "tiny-long",
                                          "kimi-k2-slice", "deepseek-v3-slice"};
    OPTS(o)->preset = arg;
    return kt_cli_choice_arg("--preset", arg, presets, 7, why, ws) >= 0;
}

static bool opt_seed(void *o, const char *arg, char *why, size_t ws)
{
    OPTS(o)->seed_given = true;
    return kt_cli_u64_arg("--seed", arg, 0, UINT64_MAX, NULL, &OPTS(o)->seed, why, ws);
}

static bool opt_merges(void *o, const char *arg, char *why, size_t ws)
{
    OPTS(o)->merges_given = true;
    return kt_cli_u32_arg("--vocab-merges", arg, 0, 1u << 20, NULL, &OPTS(o)->merges, why, ws);
}

static bool opt_skew(void *o, const char *arg, char *why, size_t ws)
{
    OPTS(o)->skew_given = true;
    return kt_cli_double_arg("--skew", arg, 0, 16, KT_CLI_CLOSED, "0: uniform", &OPTS(o)->skew, why, ws);
}

static bool opt_route_skew(void *o, const char *arg, char *why, size_t ws)
{
    char *colon = strchr(arg, ':'), *end;
    double lo = NAN, hi = NAN;
    if (colon) {
        errno = 0;
        lo = strtod(arg, &end);
        if (errno || end != colon || end == arg)
            lo = NAN;
        hi = strtod(colon + 1, &end);
        if (errno || *end || end == colon + 1)
            hi = NAN;
    }
    if (!(lo >= 0 && hi >= lo && hi <= 16)) {
        snprintf(why, ws, "--route-skew '%s' is not MIN:MAX with 0 <= MIN <= MAX <= 16: give e.g. 0.2:1.5", arg);
        return false;
    }
    OPTS(o)->skew = lo, OPTS(o)->skew_max = hi, OPTS(o)->route_skew_given = true;
    return true;
}

static bool opt_route_input(void *o, const char *arg, char *why, size_t ws)
{
    OPTS(o)->route_input_given = true;
    return kt_cli_double_arg("--route-input", arg, 0, 1, KT_CLI_HI_OPEN, "a share of each token embedding",
                             &OPTS(o)->route_input, why, ws);
}

/* A weight type kt-synth can write, checked here: "--experts-type 'q4k' ...". */
static bool type_option(const char *name, const char *arg, const char **field, char *why, size_t ws)
{
    static const char *const types[] = {"f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q4_k",
                                        "q5_k", "q6_k"};
    kt_err err = {0};
    if (kt_synth_parse_type(arg, &err) >= 0) {
        *field = arg;
        return true;
    }
    char hint[128];
    kt_cli_suggest(arg, types, sizeof types / sizeof types[0], hint, sizeof hint);
    snprintf(why, ws, "%s: %s%s%s", name, err.msg, hint[0] ? "; " : "", hint);
    return false;
}

#define TYPE_OPTION(fn, name, role)                                                                                 \
    static bool fn(void *o, const char *arg, char *why, size_t ws)                                                  \
    {                                                                                                               \
        return type_option(name, arg, &OPTS(o)->role_type[role], why, ws);                                          \
    }
TYPE_OPTION(opt_experts_type, "--experts-type", KT_SYNTH_ROLE_EXPERTS)
TYPE_OPTION(opt_shared_type, "--shared-type", KT_SYNTH_ROLE_SHARED)
TYPE_OPTION(opt_attn_type, "--attn-type", KT_SYNTH_ROLE_ATTN)
TYPE_OPTION(opt_ffn_type, "--ffn-type", KT_SYNTH_ROLE_FFN)
TYPE_OPTION(opt_embd_type, "--embd-type", KT_SYNTH_ROLE_EMBD)
TYPE_OPTION(opt_output_type, "--output-type", KT_SYNTH_ROLE_OUTPUT)

static bool opt_dense_type(void *o, const char *arg, char *why, size_t ws)
{
    return type_option("--dense-type", arg, &OPTS(o)->dense_type, why, ws);
}

static bool opt_format(void *o, const char *arg, char *why, size_t ws)
{
    static const char *const formats[] = {"gguf", "hf"};
    OPTS(o)->format = arg;
    return kt_cli_choice_arg("--format", arg, formats, 2, why, ws) >= 0;
}

static bool opt_hf_weights(void *o, const char *arg, char *why, size_t ws)
{
    static const char *const weights[] = {"bf16", "fp8", "int4-experts"};
    OPTS(o)->hf_weights = arg;
    return kt_cli_choice_arg("--hf-weights", arg, weights, 3, why, ws) >= 0;
}

KT_CLI_U32_OPTION(opt_hf_shard_mib, hf_shard_mib, 1, 1u << 20, "--hf-shard-mib", "MiB per shard")

static bool opt_header_only(void *o, const char *arg, char *why, size_t ws)
{
    (void)arg, (void)why, (void)ws;
    OPTS(o)->header_only = true;
    return true;
}

static bool opt_quiet(void *o, const char *arg, char *why, size_t ws)
{
    (void)arg, (void)why, (void)ws;
    OPTS(o)->quiet = true;
    return true;
}

/* The help text lists them (usage); the table parses them. */
static const struct kt_cli_option options_table[] = {
    {"--preset", NULL, "NAME", 0, "", opt_preset},
    {"--output", "-o", "FILE", 0, "", opt_output},
    {"--layers", NULL, "N", 0, "", opt_layers},
    {"--experts", NULL, "N", 0, "", opt_experts},
    {"--seed", NULL, "S", 0, "", opt_seed},
    {"--skew", NULL, "S", 0, "", opt_skew},
    {"--route-skew", NULL, "MIN:MAX", 0, "", opt_route_skew},
    {"--route-input", NULL, "R", 0, "", opt_route_input},
    {"--threads", NULL, "N", 0, "", opt_threads},
    {"--vocab-merges", NULL, "N", 0, "", opt_merges},
    {"--experts-type", NULL, "T", 0, "", opt_experts_type},
    {"--shared-type", NULL, "T", 0, "", opt_shared_type},
    {"--attn-type", NULL, "T", 0, "", opt_attn_type},
    {"--ffn-type", NULL, "T", 0, "", opt_ffn_type},
    {"--embd-type", NULL, "T", 0, "", opt_embd_type},
    {"--output-type", NULL, "T", 0, "", opt_output_type},
    {"--dense-type", NULL, "T", 0, "", opt_dense_type},
    {"--format", NULL, "gguf|hf", 0, "", opt_format},
    {"--hf-weights", NULL, "W", 0, "", opt_hf_weights},
    {"--hf-shard-mib", NULL, "N", 0, "", opt_hf_shard_mib},
    {"--header-only", NULL, NULL, 0, "", opt_header_only},
    {"--quiet", "-q", NULL, 0, "", opt_quiet},
};

static const struct kt_cli cli = {.prog = "kt-synth",
                                  .synopsis = "usage: kt-synth --preset NAME [-o FILE] [options]\n",
                                  .options = options_table,
                                  .n_options = sizeof options_table / sizeof options_table[0],
                                  .usage = usage};

/* ---- main --------------------------------------------------------------------------------- */

int main(int argc, char **argv)
{
    struct synth_options o = {0};
    int rc = kt_cli_parse(&cli, argc, argv, 1, 0, &o);
    if (rc >= 0)
        return rc;
    if (!o.preset)
        return kt_cli_usage_error(&cli, "%s", "no preset given: give --preset tiny, tiny-v3, tiny-thinking, tiny-r1, "
                                              "tiny-long, kimi-k2-slice or deepseek-v3-slice");
    if (o.skew_given && o.route_skew_given)
        return kt_cli_usage_error(&cli, "%s", "--skew and --route-skew both set the router skew: give one");

    const bool hf = o.format && strcmp(o.format, "hf") == 0;
    if (!hf && (o.hf_weights || o.hf_shard_mib))
        return kt_cli_usage_error(&cli, "%s", "--hf-weights and --hf-shard-mib apply to --format hf only");
    if (hf && o.header_only)
        return kt_cli_usage_error(&cli, "%s", "--header-only writes a GGUF file: it does not go with --format hf");
    if (hf && o.dense_type)
        return kt_cli_usage_error(&cli, "%s", "--dense-type sets GGUF types: with --format hf give --hf-weights");
    for (int r = 0; r < KT_SYNTH_ROLE_COUNT; r++)
        if (hf && o.role_type[r])
            return kt_cli_usage_error(&cli, "%s", "the --*-type options set GGUF types: with --format hf give "
                                                  "--hf-weights");

    kt_err err = {0};
    struct kt_synth_config cfg;
    if (kt_synth_preset(o.preset, &cfg, &err) != KT_OK)
        return kt_cli_usage_error(&cli, "%s", err.msg);
    if (o.layers)
        cfg.n_layer = o.layers;
    if (o.experts)
        cfg.n_expert = o.experts;
    if (o.seed_given)
        cfg.seed = o.seed;
    if (o.skew_given)
        cfg.skew = o.skew;
    if (o.route_skew_given)
        cfg.skew = o.skew, cfg.skew_max = o.skew_max;
    if (o.route_input_given)
        cfg.route_input = o.route_input;
    if (o.threads)
        cfg.n_threads = o.threads;
    if (o.merges_given)
        cfg.vocab_merges = o.merges;
    if (o.dense_type) {
        const int t = kt_synth_parse_type(o.dense_type, &err);
        for (int r = 0; r < KT_SYNTH_ROLE_COUNT; r++)
            if (r != KT_SYNTH_ROLE_EXPERTS)
                cfg.types[r] = t;
    }
    for (int r = 0; r < KT_SYNTH_ROLE_COUNT; r++)
        if (o.role_type[r])
            cfg.types[r] = kt_synth_parse_type(o.role_type[r], &err);
    const bool quiet = o.quiet, header_only = o.header_only;
    const char *output = o.output;

    char default_path[64];
    if (!output) {
        snprintf(default_path, sizeof default_path, hf ? "%s-hf" : "%s.gguf", cfg.preset);
        output = default_path;
    }

    struct kt_synth_plan *plan = NULL;
    kt_status s = kt_synth_plan_create(&cfg, &plan, &err);
    if (s != KT_OK) {
        if (s == KT_ERR_INVALID)
            return kt_cli_usage_error(&cli, "%s", err.msg);
        fprintf(stderr, "kt-synth: %s\n", err.msg);
        return 1;
    }
    for (uint32_t i = 0; i < plan->n_fallbacks; i++) {
        const struct kt_synth_fallback *f = &plan->fallbacks[i];
        fprintf(stderr, "kt-synth: %s written as %s in %u tensor%s whose rows don't fit its blocks (first: %s)\n",
                kt_type_name(f->requested), kt_type_name(f->used), f->count, f->count == 1 ? "" : "s",
                f->first_tensor);
    }

    double t0 = now_s();
    struct kt_progress *progress = NULL;
    if (hf) {
        struct kt_synth_hf_options ho = {kt_synth_hf_default_weights(&cfg),
                                         (uint64_t)(o.hf_shard_mib ? o.hf_shard_mib : 4096) << 20};
        if (o.hf_weights && kt_synth_hf_weights_parse(o.hf_weights, &ho.weights, &err) != KT_OK) {
            kt_synth_plan_destroy(plan);
            return kt_cli_usage_error(&cli, "%s", err.msg);
        }
        char label[96];
        snprintf(label, sizeof label, "kt-synth %s", output);
        uint64_t bytes = 0;
        uint32_t shards = 0;
        s = kt_synth_hf_size(plan, &ho, &bytes, &shards, &err);
        progress = quiet || s != KT_OK ? NULL : kt_progress_create(stderr, label, bytes, KT_PROGRESS_AUTO);
        if (s == KT_OK)
            s = kt_synth_write_hf(plan, output, &ho, progress, &bytes, &shards, &err);
        if (s == KT_OK)
            kt_progress_finish(progress);
        kt_progress_destroy(progress);
        kt_synth_plan_destroy(plan);
        if (s != KT_OK) {
            fprintf(stderr, "kt-synth: %s\n", err.msg);
            return s == KT_ERR_INVALID ? 2 : 1;
        }
        char size[32];
        kt_format_bytes(size, sizeof size, bytes);
        static const char *const weights[] = {"bf16", "fp8", "int4-experts"};
        printf("wrote %s/: %s weights, %" PRIu64 " tensor bytes (%s) in %u shard%s, %.2f s\n", output,
               weights[ho.weights], bytes, size, shards, shards == 1 ? "" : "s", now_s() - t0);
        return 0;
    }
    if (header_only) {
        s = kt_synth_write_header_only(plan, output, &err);
    } else {
        char label[96];
        snprintf(label, sizeof label, "kt-synth %s", output);
        progress = quiet ? NULL : kt_progress_create(stderr, label, plan->data_bytes, KT_PROGRESS_AUTO);
        s = kt_synth_write(plan, output, progress, &err);
    }
    if (s == KT_OK)
        kt_progress_finish(progress);
    kt_progress_destroy(progress);
    double seconds = now_s() - t0;
    uint32_t n_tensors = plan->n_tensors;
    kt_synth_plan_destroy(plan);
    if (s != KT_OK) {
        fprintf(stderr, "kt-synth: %s\n", err.msg);
        return 1;
    }

    struct stat st;
    bool have_st = stat(output, &st) == 0;
    uint64_t file_bytes = have_st ? (uint64_t)st.st_size : 0;
    char size[32];
    kt_format_bytes(size, sizeof size, file_bytes);
    if (header_only) {
        char disk[32];
        kt_format_bytes(disk, sizeof disk, have_st ? (uint64_t)st.st_blocks * 512u : 0);
        printf("wrote %s: %" PRIu64 " bytes (%s; %s on disk), %u tensors, header only: the data reads as zeros "
               "(for planning, not for running), %.2f s\n",
               output, file_bytes, size, disk, n_tensors, seconds);
        return 0;
    }
    printf("wrote %s: %" PRIu64 " bytes (%s), %u tensors, %.2f s\n", output, file_bytes, size, n_tensors, seconds);
    return 0;
}
