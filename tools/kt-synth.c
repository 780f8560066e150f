/*
 * kt-synth.c - writes a synthetic deepseek2 GGUF file: the exact layout of a
 * real family (Kimi-K2 or DeepSeek-V3) with seeded random weights, so every
 * part of kt can be tested and timed without downloading a model.
 *
 * Only parses options, prints and exits; the generator lives in tools/synth.
 * Exit status: 0 written, 1 failed (I/O, memory), 2 bad usage.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "progress.h"
#include "quant.h"
#include "synth.h"

#define EXIT_USAGE 2

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

static int usage_error(const char *fmt, const char *arg)
{
    fprintf(stderr, "kt-synth: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\n(kt-synth --help for usage)\n");
    return EXIT_USAGE;
}

static bool parse_u64(const char *s, uint64_t max, uint64_t *out)
{
    if (!s || !*s || *s == '-')
        return false;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 0);
    if (errno || *end || v > max)
        return false;
    *out = v;
    return true;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

enum {
    OPT_PRESET = 256, OPT_LAYERS, OPT_EXPERTS, OPT_SEED, OPT_SKEW, OPT_THREADS, OPT_MERGES, OPT_ROUTE_SKEW, OPT_ROUTE_INPUT,
    OPT_EXPERTS_TYPE, OPT_SHARED_TYPE, OPT_ATTN_TYPE, OPT_FFN_TYPE, OPT_EMBD_TYPE, OPT_OUTPUT_TYPE, OPT_DENSE_TYPE,
    OPT_HEADER_ONLY,
};

int main(int argc, char **argv)
{
    static const struct option opts[] = {
        {"preset", required_argument, NULL, OPT_PRESET},
        {"output", required_argument, NULL, 'o'},
        {"layers", required_argument, NULL, OPT_LAYERS},
        {"experts", required_argument, NULL, OPT_EXPERTS},
        {"seed", required_argument, NULL, OPT_SEED},
        {"skew", required_argument, NULL, OPT_SKEW},
        {"route-skew", required_argument, NULL, OPT_ROUTE_SKEW},
        {"route-input", required_argument, NULL, OPT_ROUTE_INPUT},
        {"threads", required_argument, NULL, OPT_THREADS},
        {"vocab-merges", required_argument, NULL, OPT_MERGES},
        {"experts-type", required_argument, NULL, OPT_EXPERTS_TYPE},
        {"shared-type", required_argument, NULL, OPT_SHARED_TYPE},
        {"attn-type", required_argument, NULL, OPT_ATTN_TYPE},
        {"ffn-type", required_argument, NULL, OPT_FFN_TYPE},
        {"embd-type", required_argument, NULL, OPT_EMBD_TYPE},
        {"output-type", required_argument, NULL, OPT_OUTPUT_TYPE},
        {"dense-type", required_argument, NULL, OPT_DENSE_TYPE},
        {"header-only", no_argument, NULL, OPT_HEADER_ONLY},
        {"quiet", no_argument, NULL, 'q'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    const char *preset = NULL, *output = NULL, *layers = NULL, *experts = NULL, *seed = NULL, *skew = NULL;
    const char *threads = NULL, *merges = NULL, *dense_type = NULL, *route_skew = NULL, *route_input = NULL;
    const char *role_type[KT_SYNTH_ROLE_COUNT] = {0};
    bool quiet = false, header_only = false;
    int opt;
    opterr = 0;
    while ((opt = getopt_long(argc, argv, ":o:qh", opts, NULL)) != -1) {
        switch (opt) {
        case OPT_PRESET: preset = optarg; break;
        case 'o': output = optarg; break;
        case OPT_LAYERS: layers = optarg; break;
        case OPT_EXPERTS: experts = optarg; break;
        case OPT_SEED: seed = optarg; break;
        case OPT_SKEW: skew = optarg; break;
        case OPT_ROUTE_SKEW: route_skew = optarg; break;
        case OPT_ROUTE_INPUT: route_input = optarg; break;
        case OPT_THREADS: threads = optarg; break;
        case OPT_MERGES: merges = optarg; break;
        case OPT_EXPERTS_TYPE: role_type[KT_SYNTH_ROLE_EXPERTS] = optarg; break;
        case OPT_SHARED_TYPE: role_type[KT_SYNTH_ROLE_SHARED] = optarg; break;
        case OPT_ATTN_TYPE: role_type[KT_SYNTH_ROLE_ATTN] = optarg; break;
        case OPT_FFN_TYPE: role_type[KT_SYNTH_ROLE_FFN] = optarg; break;
        case OPT_EMBD_TYPE: role_type[KT_SYNTH_ROLE_EMBD] = optarg; break;
        case OPT_OUTPUT_TYPE: role_type[KT_SYNTH_ROLE_OUTPUT] = optarg; break;
        case OPT_DENSE_TYPE: dense_type = optarg; break;
        case OPT_HEADER_ONLY: header_only = true; break;
        case 'q': quiet = true; break;
        case 'h': usage(stdout); return 0;
        case ':': return usage_error("option %s needs a value", argv[optind - 1]);
        default: return usage_error("unknown option %s", argv[optind - 1]);
        }
    }
    if (optind < argc)
        return usage_error("unexpected argument '%s'", argv[optind]);
    if (!preset)
        return usage_error("%s", "--preset is required (tiny, tiny-v3, kimi-k2-slice, deepseek-v3-slice)");

    kt_err err = {0};
    struct kt_synth_config cfg;
    if (kt_synth_preset(preset, &cfg, &err) != KT_OK)
        return usage_error("%s", err.msg);

    uint64_t v;
    if (layers) {
        if (!parse_u64(layers, KT_SYNTH_MAX_LAYERS, &v) || v == 0)
            return usage_error("--layers '%s': expected 1 .. 256", layers);
        cfg.n_layer = (uint32_t)v;
    }
    if (experts) {
        if (!parse_u64(experts, KT_SYNTH_MAX_EXPERTS, &v) || v == 0)
            return usage_error("--experts '%s': expected 1 .. 1024", experts);
        cfg.n_expert = (uint32_t)v;
    }
    if (seed) {
        if (!parse_u64(seed, UINT64_MAX, &v))
            return usage_error("--seed '%s': expected a non-negative integer", seed);
        cfg.seed = v;
    }
    if (skew) {
        char *end;
        errno = 0;
        double s = strtod(skew, &end);
        if (errno || *end || !*skew || !isfinite(s))
            return usage_error("--skew '%s': expected a number", skew);
        cfg.skew = s;
    }
    if (route_skew) {
        if (skew)
            return usage_error("%s", "--skew and --route-skew both set the router skew: give one");
        char *colon = strchr(route_skew, ':'), *end;
        double lo = NAN, hi = NAN;
        if (colon) {
            errno = 0;
            lo = strtod(route_skew, &end);
            if (errno || end != colon || end == route_skew)
                lo = NAN;
            hi = strtod(colon + 1, &end);
            if (errno || *end || end == colon + 1)
                hi = NAN;
        }
        if (!(lo >= 0 && hi >= lo && hi <= 16))
            return usage_error("--route-skew '%s': expected MIN:MAX with 0 <= MIN <= MAX <= 16", route_skew);
        cfg.skew = lo;
        cfg.skew_max = hi;
    }
    if (route_input) {
        char *end;
        errno = 0;
        double r = strtod(route_input, &end);
        if (errno || *end || !*route_input || !(r >= 0 && r < 1))
            return usage_error("--route-input '%s': expected a number in [0, 1)", route_input);
        cfg.route_input = r;
    }
    if (threads) {
        if (!parse_u64(threads, 1024, &v) || v == 0)
            return usage_error("--threads '%s': expected 1 .. 1024", threads);
        cfg.n_threads = (uint32_t)v;
    }
    if (merges) {
        if (!parse_u64(merges, 1u << 20, &v))
            return usage_error("--vocab-merges '%s': expected a non-negative integer", merges);
        cfg.vocab_merges = (uint32_t)v;
    }
    if (dense_type) {
        int t = kt_synth_parse_type(dense_type, &err);
        if (t < 0)
            return usage_error("--dense-type: %s", err.msg);
        for (int r = 0; r < KT_SYNTH_ROLE_COUNT; r++)
            if (r != KT_SYNTH_ROLE_EXPERTS)
                cfg.types[r] = t;
    }
    for (int r = 0; r < KT_SYNTH_ROLE_COUNT; r++) {
        if (!role_type[r])
            continue;
        int t = kt_synth_parse_type(role_type[r], &err);
        if (t < 0)
            return usage_error("%s", err.msg);
        cfg.types[r] = t;
    }

    char default_path[64];
    if (!output) {
        snprintf(default_path, sizeof default_path, "%s.gguf", cfg.preset);
        output = default_path;
    }

    struct kt_synth_plan *plan = NULL;
    kt_status s = kt_synth_plan_create(&cfg, &plan, &err);
    if (s != KT_OK) {
        if (s == KT_ERR_INVALID)
            return usage_error("%s", err.msg);
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
