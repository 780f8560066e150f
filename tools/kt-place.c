/*
 * kt-place.c - the planner CLI: reads a model's header, a routing profile
 * and a machine file, plans where every part and routed expert lives
 * (placement/planner.h), checks that the config it writes resolves back to
 * exactly that plan, writes it atomically and prints what the cost model
 * predicts for it against three baselines of the same accelerator memory.
 *
 * Exit status: 0 written, 1 bad input or a plan that cannot be made (named
 * on stderr, nothing written), 2 usage.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "cli.h"
#include "config.h"
#include "cost.h"
#include "machine.h"
#include "model.h"
#include "placement_opt.h"
#include "planner.h"
#include "rebalance.h"
#include "profile.h"
#include "ranks_plan.h"
#include "small_file.h"
#include "svg.h"
#include "topology.h"

struct place_options {
    const char *model, *profile, *machine, *output, *device, *objective, *evaluate, *svg, *moves_from;
    double min_gain;             /* --min-gain: the rebalancer's hysteresis */
    double move_budget_mib;      /* --move-budget-mib: bytes of moves in a round; 0: no limit */
    int baseline;                /* -1: the planner's plan; else the enum kt_plan_baseline to write */
    double gpu_memory_gib;
    uint32_t kv_tokens, batch, prefill_tokens, context;
    const char *machines[16];    /* --machine, one per rank when repeated */
    int n_machines;
    uint32_t ranks;              /* --ranks: an MPI job of this many ranks */
    bool explain;
};

#define OPTS(o) ((struct place_options *)(o))
KT_CLI_STRING_OPTION(opt_model, model)
KT_CLI_STRING_OPTION(opt_profile, profile)
static bool opt_machine(void *o, const char *arg, char *why, size_t ws)
{
    struct place_options *po = OPTS(o);
    if (po->n_machines == 16) {
        snprintf(why, ws, "--machine given more than 16 times (one per rank, 16 ranks at most)");
        return false;
    }
    po->machines[po->n_machines++] = arg;
    po->machine = po->machines[0];
    return true;
}
KT_CLI_U32_OPTION(opt_ranks, ranks, 1, 16, "--ranks", "MPI ranks")
KT_CLI_STRING_OPTION(opt_output, output)
KT_CLI_STRING_OPTION(opt_evaluate, evaluate)
KT_CLI_STRING_OPTION(opt_svg, svg)
KT_CLI_STRING_OPTION(opt_moves_from, moves_from)
KT_CLI_U32_OPTION(opt_kv, kv_tokens, 1, 1u << 24, "--kv-tokens", NULL)
KT_CLI_U32_OPTION(opt_batch, batch, 1, 4096, "--batch", "decode tokens per step")
KT_CLI_U32_OPTION(opt_prefill, prefill_tokens, 1, 1u << 20, "--prefill-tokens", NULL)
KT_CLI_U32_OPTION(opt_context, context, 1, 1u << 24, "--context", "positions already cached")
KT_CLI_DOUBLE_OPTION(opt_gpu_memory, gpu_memory_gib, 0, 1048576, KT_CLI_LO_OPEN, "--gpu-memory", "GiB")
KT_CLI_DOUBLE_OPTION(opt_min_gain, min_gain, 0, 1, KT_CLI_HI_OPEN, "--min-gain", "a share of the step")
KT_CLI_DOUBLE_OPTION(opt_move_budget, move_budget_mib, 0, 1e9, KT_CLI_LO_OPEN, "--move-budget-mib", "MiB")

static bool opt_device(void *o, const char *arg, char *why, size_t ws)
{
    static const char *const devices[] = {"cuda", "sim", "cpu"};
    OPTS(o)->device = arg;
    if (strcasecmp(arg, "gpu") == 0) { /* the nearest word, cpu, is the opposite */
        snprintf(why, ws, "--device '%s' is not one of cuda, sim or cpu: a GPU is 'cuda'", arg);
        return false;
    }
    return kt_cli_choice_arg("--device", arg, devices, 3, why, ws) >= 0;
}

static bool opt_objective(void *o, const char *arg, char *why, size_t ws)
{
    static const char *const objectives[] = {"decode", "prefill", "mixed"};
    OPTS(o)->objective = arg;
    return kt_cli_choice_arg("--objective", arg, objectives, 3, why, ws) >= 0;
}

static bool opt_baseline(void *o, const char *arg, char *why, size_t ws)
{
    static const char *const names[KT_BASELINE_COUNT] = {"index", "equal", "top"};
    OPTS(o)->baseline = kt_cli_choice_arg("--baseline", arg, names, KT_BASELINE_COUNT, why, ws);
    return OPTS(o)->baseline >= 0;
}

static bool opt_explain(void *o, const char *arg, char *why, size_t ws)
{
    (void)arg, (void)why, (void)ws;
    OPTS(o)->explain = true;
    return true;
}

static const struct kt_cli_option options_table[] = {
    {"--model", "-m", "MODEL", 0, "the model (a GGUF file or a checkpoint directory); only its headers are read", opt_model},
    {"--profile", NULL, "FILE", 0, "routing profile (kt-bench profile); without one, routing is taken as uniform",
     opt_profile},
    {"--machine", NULL, "FILE", 0, "machine file (kt-bench machine); without one, stated defaults.  Repeated: one per "
     "MPI rank, in rank order (plans the ranks: layer ranges, each rank's placement; its `network` gives the "
     "link to the next rank)", opt_machine},
    {"--ranks", NULL, "N", 0, "plan an MPI job of N ranks (runtime/dist): each rank's contiguous layers by "
     "memory and predicted time, and its own placement of them (every rank on the --machine file)", opt_ranks},
    {"--device", NULL, "cuda|sim|cpu", 0, "plan for this accelerator (default, or cpu: none, CPU only); with --ranks, "
     "every rank whose machine file lists one of this backend plans its stage hybrid on it, the others on "
     "their CPU", opt_device},
    {"--gpu-memory", NULL, "GIB", 0, "the accelerator's budget (default: the machine file's; --ranks: every device "
     "rank's)", opt_gpu_memory},
    {"--kv-tokens", NULL, "N", 0, "KV cache the accelerator holds room for (default 4096; --ranks: each rank's "
     "RAM, for its layers)", opt_kv},
    {"--batch", NULL, "B", 0, "decode tokens per step (default 1)", opt_batch},
    {"--prefill-tokens", NULL, "N", 0, "prompt length the prefill figures are for (default 512)", opt_prefill},
    {"--context", NULL, "N", 0, "decode: positions already cached (default 512)", opt_context},
    {"--objective", NULL, "decode|prefill|mixed", 0,
     "what to make fast (default decode; mixed: the profile's decode and prefill tokens)", opt_objective},
    {"--explain", NULL, NULL, 0, "say why each layer got its slots and list its expert homes", opt_explain},
    {"--output", "-o", "FILE", 0, "the placement config to write (required)", opt_output},
    {"--baseline", NULL, "index|equal|top", 0,
     "write this baseline instead of the plan: experts by index, an equal count per layer by frequency, or a "
     "global top-N by frequency (KTransformers' choice), with the plan's accelerator memory",
     opt_baseline},
    {"--evaluate", NULL, "PLAN", 0, "predict an existing placement config instead of planning (no -o)", opt_evaluate},
    {"--svg", NULL, "FILE", 0, "also draw the plan: each expert's home and per-layer predicted time per place",
     opt_svg},
    {"--moves-from", NULL, "SERVED", 0,
     "also list the expert moves a rebalancer would make from the placement config SERVED to the plan, best "
     "predicted gain per byte first",
     opt_moves_from},
    {"--min-gain", NULL, "SHARE", 0, "--moves-from: move only when the plan saves more than this share of the step "
     "(default 0.02)", opt_min_gain},
    {"--move-budget-mib", NULL, "MIB", 0, "--moves-from: bytes of moves in one round (default: no limit)",
     opt_move_budget},
};

static void usage(FILE *f);
#define SYNOPSIS                                                                                                       \
    "usage: kt-place -m MODEL --profile profile.json --machine machine.json [--device cuda|sim]\n"                    \
    "                [--gpu-memory GIB] [--kv-tokens N] [--batch B] [--objective decode|prefill|mixed]\n"             \
    "                [--explain] [--svg FILE] [--baseline index|equal|top]\n"                                        \
    "                [--moves-from SERVED.yaml [--min-gain S] [--move-budget-mib M]] -o plan.yaml\n"                 \
    "       kt-place -m MODEL [--profile P] (--ranks N [--machine M] | --machine M0 --machine M1 ...)\n"           \
    "                [--device cuda|sim [--gpu-memory GIB]] -o cluster.yaml\n" \
    "       kt-place -m MODEL [--profile P] [--machine M] --evaluate plan.yaml\n"
static const struct kt_cli cli = {.prog = "kt-place", .synopsis = SYNOPSIS, .options = options_table,
                                  .n_options = sizeof options_table / sizeof options_table[0], .usage = usage};

static void usage(FILE *f)
{
    fprintf(f, SYNOPSIS "\n"
               "Plans where a model's parts and routed experts live (accelerator slots by marginal gain,\n"
               "CPU experts balanced over NUMA nodes) and writes a placement config v1 that kt-serve,\n"
               "kt-run and kt-bench load.\n\noptions:\n");
    kt_cli_print_options(f, &cli, NULL);
}

/* ---- report ------------------------------------------------------------------------------------------ */

static void print_summary(const char *label, const struct kt_plan_summary *s, const struct kt_plan_summary *ref)
{
    printf("  %-18s %10.2f %12.1f %9.1f%% %8.3f %8.3f %7u", label, s->decode_tok_s, s->prefill_tok_s,
           100.0 * s->accel_share, s->balance_worst, s->balance_mean, s->accel_experts);
    if (ref && ref != s && s->decode_tok_s > 0)
        printf("   plan decodes %.2fx", ref->decode_tok_s / s->decode_tok_s);
    printf("\n");
}

static void explain(const struct kt_plan *plan)
{
    const struct kt_placement *p = plan->placement;
    const char *acc = plan->accel ? p->devices[plan->accel].name : NULL;
    printf("\nwhy each layer got its slots (objective time per token; gains in microseconds)\n");
    for (uint32_t il = 0; il < p->n_layer; il++) {
        const struct kt_placement_layer *L = &p->layers[il];
        const struct kt_plan_layer *l = &plan->layers[il];
        printf("layer %u: decode %.3f ms, prefill %.3f ms", il, 1e3 * l->decode_s, 1e3 * l->prefill_s);
        if (!L->experts) {
            printf(" (dense)\n");
            continue;
        }
        printf("\n");
        if (acc) {
            if (l->gpu_experts)
                printf("  %s: %u slots, the first saved %.3f us, the last %.3f us; ", acc, l->gpu_experts,
                       1e6 * l->first_gain_s, 1e6 * l->last_gain_s);
            else
                printf("  %s: no slots; ", acc);
            if (l->gpu_experts == p->n_expert)
                printf("every expert is there\n");
            else if (!l->next_fits)
                printf("the next would save %.3f us but the memory was spent on larger gains\n",
                       1e6 * l->next_gain_s);
            else
                printf("the next would save %.3f us: %s\n", 1e6 * l->next_gain_s,
                       l->next_gain_s > 0 ? "memory ran out before its turn" : "not worth its copies");
        }
        if (p->n_nodes > 1)
            printf("  CPU nodes: whole experts give busiest/mean %.3f -> %s (%.3f)\n", l->balance_whole,
                   L->cpu_sliced ? "row-sliced over every node" : "whole experts", l->balance);
        if (acc) {
            printf("  %s: ", acc);
            kt_tool_print_homes(stdout, p, il, plan->accel, -1);
            printf("\n");
        }
        for (int n = 0; n < p->n_nodes; n++) {
            printf("  node %d: ", n);
            kt_tool_print_homes(stdout, p, il, 0, n);
            printf("\n");
        }
    }
}

/* ---- baselines, evaluation and the picture ------------------------------------------------------------ */

/* Layer il's predicted times of placement p, decode and prefill, into layers. */
static kt_status predict_layers(const struct kt_cost_model *cost, const struct kt_placement *p,
                                const struct kt_planner_options *po, struct kt_cost_layer *dec,
                                struct kt_cost_layer *pre, kt_err *err)
{
    double step = 0;
    const struct kt_cost_query qd = {.mode = KT_COST_DECODE, .batch = po->batch, .context = po->context};
    const struct kt_cost_query qp = {.mode = KT_COST_PREFILL, .tokens = po->prefill_tokens};
    kt_status st = kt_cost_predict(cost, p, &qd, dec, &step, err);
    return st ? st : pre ? kt_cost_predict(cost, p, &qp, pre, &step, err) : KT_OK;
}

/* The config text of a baseline placement: the plan's with bp in place of
 * its placement, no replicas (baselines have none), and bp's own predicted
 * per-layer times as the comments. */
static char *baseline_yaml(const struct kt_plan *plan, struct kt_placement *bp, const struct kt_cost_model *cost,
                           const char *model_name, const char *profile_path, kt_err *err)
{
    const uint32_t L = bp->n_layer;
    struct kt_cost_layer *dec = calloc(L, sizeof *dec), *pre = calloc(L, sizeof *pre);
    struct kt_plan_layer *layers = calloc(L, sizeof *layers);
    char *text = NULL;
    if (!dec || !pre || !layers)
        kt_err_set(err, KT_ERR_NOMEM, "out of memory");
    else if (predict_layers(cost, bp, &plan->options, dec, pre, err) == KT_OK) {
        struct kt_plan b = *plan;
        b.placement = bp;
        b.layers = layers;
        b.replicas_hot_per_layer = 0;
        for (uint32_t il = 0; il < L; il++) {
            layers[il] = plan->layers[il];
            layers[il].decode_s = dec[il].total_s;
            layers[il].prefill_s = pre[il].total_s;
        }
        if (!(text = kt_plan_yaml(&b, model_name, profile_path)))
            kt_err_set(err, KT_ERR_NOMEM, "out of memory");
    }
    free(dec), free(pre), free(layers);
    return text;
}

/* The placement config at path resolved on m for mach's nodes (profile_path
 * may be NULL: the config's own); *c and *p are the caller's to destroy. */
static kt_status load_placement(const char *path, const struct kt_model *m, const struct kt_machine *mach,
                                const char *profile_path, struct kt_placement_config **c, struct kt_placement **p,
                                kt_err *err)
{
    kt_status st = kt_placement_config_load(path, c, err);
    return st ? st : kt_placement_resolve(*c, m, mach->n_nodes, profile_path, p, err);
}

/* kt-place --evaluate: what the cost model predicts for an existing config
 * on this model, profile and machine. */
static int evaluate(const char *path, const struct kt_model *m, const struct kt_profile *prof, const char *profile_path,
                    const struct kt_machine *mach, const struct kt_cost_model *cost,
                    const struct kt_planner_options *po)
{
    kt_err err = {0};
    struct kt_placement_config *c = NULL;
    struct kt_placement *p = NULL;
    struct kt_plan_summary s;
    (void)prof;
    int rc = 1;
    if (load_placement(path, m, mach, profile_path, &c, &p, &err) != KT_OK ||
        kt_plan_summarize(cost, p, po, &s, &err) != KT_OK) {
        fprintf(stderr, "kt-place: %s\n", err.msg);
    } else {
        printf("kt-place: %s evaluated (decode batch %u at context %u; prefill of %u tokens)\n", path, po->batch,
               po->context, po->prefill_tokens);
        printf("predicted decode: %.3f ms a step, %.2f tok/s\n", 1e3 * s.decode_step_s, s.decode_tok_s);
        printf("predicted prefill: %.1f tok/s\n", s.prefill_tok_s);
        printf("routed pairs on the accelerator (decode, by the profile): %.2f%% (%u experts there)\n",
               100.0 * s.accel_share, s.accel_experts);
        printf("busiest / mean CPU node per MoE layer: worst %.3f, mean %.3f; %u layer(s) row-sliced\n",
               s.balance_worst, s.balance_mean, s.sliced_layers);
        rc = 0;
    }
    kt_placement_destroy(p);
    kt_placement_config_destroy(c);
    return rc;
}

/* kt-place --svg: each layer's experts coloured by where they live (hottest
 * first when there is a profile) beside each layer's predicted decode time
 * per place (CPU nodes' expert work, the accelerator's busy time). */
static kt_status draw_plan(const char *path, const struct kt_plan *plan, const struct kt_profile *prof,
                           const struct kt_cost_model *cost, kt_err *err)
{
    const struct kt_placement *p = plan->placement;
    const uint32_t L = p->n_layer, N = p->n_expert;
    const int n_nodes = p->n_nodes < KT_SVG_MAX_CATEGORIES - 1 ? p->n_nodes : KT_SVG_MAX_CATEGORIES - 1;
    const uint32_t n_places = (uint32_t)n_nodes + (plan->accel ? 1 : 0);
    char names[KT_SVG_MAX_CATEGORIES][48];
    const char *name_ptr[KT_SVG_MAX_CATEGORIES];
    for (int n = 0; n < n_nodes; n++)
        snprintf(names[n], sizeof names[n], "cpu node %d", n);
    if (plan->accel)
        snprintf(names[n_nodes], sizeof names[n_nodes], "%s", p->devices[plan->accel].name);
    for (uint32_t i = 0; i < n_places; i++)
        name_ptr[i] = names[i];
    uint8_t *place = malloc((size_t)L * N + 1);
    double *heat = prof ? malloc(((size_t)L * N + 1) * sizeof *heat) : NULL;
    double *time = malloc(((size_t)L * n_places + 1) * sizeof *time);
    struct kt_cost_layer *dec = calloc(L, sizeof *dec);
    kt_status st = KT_OK;
    if (!place || (prof && !heat) || !time || !dec)
        st = kt_err_set(err, KT_ERR_NOMEM, "%s: out of memory", path);
    if (!st)
        st = predict_layers(cost, p, &plan->options, dec, NULL, err);
    if (!st) {
        for (uint32_t il = 0; il < L; il++) {
            for (uint32_t x = 0; x < N; x++) {
                const struct kt_expert_home *h = p->layers[il].experts ? &p->layers[il].experts[x] : NULL;
                place[(size_t)il * N + x] = !h ? KT_SVG_NO_PLACE
                                            : h->device == 0 ? (uint8_t)(h->node < n_nodes ? h->node : 0)
                                                             : (uint8_t)n_nodes;
                if (heat)
                    heat[(size_t)il * N + x] = kt_profile_count(prof, il, x);
            }
            for (int n = 0; n < n_nodes; n++)
                time[(size_t)il * n_places + n] = 1e3 * dec[il].node_s[n];
            if (plan->accel)
                time[(size_t)il * n_places + n_nodes] = 1e3 * dec[il].device_s;
        }
        const struct kt_svg_plan sp = {.title = "kt-place: where each routed expert lives",
                                       .row_label_fmt = "layer %u",
                                       .n_layers = L,
                                       .n_experts = N,
                                       .place = place,
                                       .n_places = n_places,
                                       .place_names = name_ptr,
                                       .heat = heat,
                                       .n_devices = n_places,
                                       .device_names = name_ptr,
                                       .time = time,
                                       .time_label = "predicted decode ms per step"};
        st = kt_svg_plan(path, &sp, err);
    }
    free(place), free(heat), free(time), free(dec);
    return st;
}

/* ---- main -------------------------------------------------------------------------------------------- */


/* Where a home is, for the moves' report: the device's name, or the CPU node. */
static const char *home_name(const struct kt_placement *p, const struct kt_expert_home *h, char *buf, size_t cap)
{
    if (h->device > 0 && h->device < p->n_devices)
        snprintf(buf, cap, "%s", p->devices[h->device].name);
    else
        snprintf(buf, cap, "node %d", h->node);
    return buf;
}

/* kt-place --moves-from: the moves a rebalancer (placement/rebalance.h) would
 * make from the placement config `path`, resolved on this model and machine,
 * to the plan, as a report (malloc'd; printed once the plan is written). */
static char *moves_report(const char *path, const struct kt_model *m, const struct kt_machine *mach,
                          const struct kt_cost_model *cost, const struct kt_plan *plan, const struct place_options *o,
                          kt_err *err)
{
    struct kt_placement_config *c = NULL;
    struct kt_placement *cur = NULL;
    struct kt_rebalance r = {0};
    char *text = NULL;
    size_t len = 0;
    const struct kt_rebalance_params rp = {
        .query = {.mode = KT_COST_DECODE, .batch = plan->options.batch, .context = plan->options.context},
        .min_gain = o->min_gain,
        .budget_bytes = (uint64_t)(o->move_budget_mib * 1048576.0),
    };
    if (load_placement(path, m, mach, NULL, &c, &cur, err) == KT_OK &&
        kt_rebalance_plan(cost, m, cur, plan->placement, &rp, &r, err) == KT_OK) {
        FILE *f = open_memstream(&text, &len);
        if (!f) {
            kt_err_set(err, KT_ERR_NOMEM, "out of memory");
        } else {
            fprintf(f, "moves from %s to the plan (min gain %.3g of the step%s): %u, %.1f MiB; predicted "
                       "decode step of the MoE layers %.3f -> %.3f ms; %u home(s) left as served\n",
                    path, o->min_gain, rp.budget_bytes ? ", within the round's bytes" : "", r.n_moves,
                    (double)r.bytes / 1048576.0, 1e3 * r.before_s, 1e3 * r.after_s, r.n_pending);
            for (uint32_t i = 0; i < r.n_moves; i++) {
                const struct kt_move *mv = &r.moves[i];
                char from[48], to[48];
                if (mv->kind == KT_MOVE_LAYER_SLICE)
                    fprintf(f, "  %3u. layer %u: every expert row-sliced over the nodes, %.1f MiB", i + 1, mv->layer,
                            (double)mv->bytes / 1048576.0);
                else if (mv->kind == KT_MOVE_LAYER_WHOLE)
                    fprintf(f, "  %3u. layer %u: made whole again, every expert on its node, %.1f MiB", i + 1,
                            mv->layer, (double)mv->bytes / 1048576.0);
                else if (mv->kind != KT_MOVE_HOME)
                    fprintf(f, "  %3u. layer %u expert %u: a replica on node %d %s (home %s), %.1f MiB", i + 1,
                            mv->layer, mv->expert, mv->node, mv->kind == KT_MOVE_REPLICA_ADD ? "added" : "dropped",
                            home_name(cur, &mv->from, from, sizeof from), (double)mv->bytes / 1048576.0);
                else
                    fprintf(f, "  %3u. layer %u expert %u: %s -> %s, %.1f MiB", i + 1, mv->layer, mv->expert,
                            home_name(cur, &mv->from, from, sizeof from), home_name(cur, &mv->to, to, sizeof to),
                            (double)mv->bytes / 1048576.0);
                if (mv->kind == KT_MOVE_REPLICA_DROP)
                    fprintf(f, ", %s %.4f ms\n", mv->gain_s < 0 ? "costs" : "saves", 1e3 * fabs(mv->gain_s));
                else if (mv->paired_with >= 0)
                    fprintf(f, ", saves %.4f ms with move %d (a swap)\n", 1e3 * mv->gain_s,
                            mv->paired_with + 1);
                else if (mv->gain_s > 0)
                    fprintf(f, ", saves %.4f ms\n", 1e3 * mv->gain_s);
                else
                    fprintf(f, " (first half of a swap)\n");
            }
            if (fclose(f) != 0 || !text) {
                free(text);
                text = NULL;
                kt_err_set(err, KT_ERR_NOMEM, "out of memory");
            }
        }
    }
    kt_rebalance_free(&r);
    kt_placement_destroy(cur);
    kt_placement_config_destroy(c);
    return text;
}
static int fail(const char *msg)
{
    fprintf(stderr, "kt-place: %s\n", msg);
    return 1;
}

/* ---- an MPI job's ranks ------------------------------------------------------------------------------ */

static void print_stages(const char *label, const struct kt_rank_plan *rp, const struct kt_rank_stage *st)
{
    double slowest = 0, sum = 0;
    for (int r = 0; r < rp->n_ranks; r++) {
        const struct kt_rank_stage *s = &st[r];
        char cap[32];
        if (s->capacity)
            snprintf(cap, sizeof cap, "%.2f GiB", (double)s->capacity / 1073741824.0);
        else
            snprintf(cap, sizeof cap, "unknown");
        char dev[48] = "-";
        if (s->device)
            snprintf(dev, sizeof dev, "%.2f/%.2f", (double)s->device_bytes / 1073741824.0,
                     (double)s->device_capacity / 1073741824.0);
        printf("  %-10s %4d %6u-%-6u %12.4f %13.4f %9.4f %10.2f %12s %12s%s\n", label, r, s->first, s->last,
               1e3 * s->decode_s, 1e3 * s->prefill_s, 1e3 * s->link_decode_s, (double)s->bytes / 1073741824.0, cap,
               dev, s->fits ? "" : "  does not fit");
        slowest = s->decode_s > slowest ? s->decode_s : slowest;
        sum += s->decode_s;
    }
    printf("  %-10s slowest stage %.4f ms a decode step, %.4f ms through every stage\n", label, 1e3 * slowest,
           1e3 * sum);
}

/* kt-place --ranks N / --machine F repeated: the layer ranges and each rank's placement, written atomically. */
static int plan_ranks(const struct place_options *o, const struct kt_model *m, const struct kt_profile *prof,
                      const char *profile_abs, const struct kt_planner_options *po)
{
    const int n_ranks = o->ranks ? (int)o->ranks : o->n_machines;
    struct kt_machine *mach[KT_RANK_PLAN_MAX] = {0};
    struct kt_cost_model *cost[KT_RANK_PLAN_MAX] = {0};
    struct kt_rank_input in[KT_RANK_PLAN_MAX];
    struct kt_rank_plan *rp = NULL;
    char *text = NULL;
    kt_err err = {0};
    int rc = 1;
    int n_nodes = 1;
    if (o->n_machines == 0) {
        struct kt_topology *topo = NULL;
        if (kt_topology_create(NULL, &topo, &err) == KT_OK)
            n_nodes = topo->n_nodes;
        kt_topology_destroy(topo);
        fprintf(stderr, "kt-place: warning: no --machine: planning every rank with stated defaults for %d NUMA "
                "node(s), memory not checked\n", n_nodes);
    }
    for (int r = 0; r < n_ranks; r++) {
        /* one file for every rank, or one per rank; a rank's file comes from its own host: no kind check */
        const char *file = o->n_machines == 0 ? NULL : o->machines[o->n_machines == 1 ? 0 : r];
        if (r > 0 && o->n_machines <= 1) { /* the same machine: the same figures */
            in[r] = (struct kt_rank_input){.mach = mach[0], .cost = cost[0], .name = in[0].name};
            continue;
        }
        if (file) {
            if (kt_machine_load(file, &mach[r], &err) != KT_OK) {
                fail(err.msg);
                goto done;
            }
            for (uint32_t i = 0; i < mach[r]->n_defaulted; i++)
                fprintf(stderr, "kt-place: warning: %s: %s\n", file, mach[r]->defaulted[i]);
        } else {
            if (!(mach[r] = calloc(1, sizeof *mach[r]))) {
                fail("out of memory");
                goto done;
            }
            kt_machine_defaults(mach[r], n_nodes);
        }
        if (kt_cost_create(m, prof, mach[r], &cost[r], &err) != KT_OK) {
            fprintf(stderr, "kt-place: rank %d (%s): %s\n", r, file ? file : "defaults", err.msg);
            goto done;
        }
        in[r] = (struct kt_rank_input){.mach = mach[r], .cost = cost[r], .name = file ? file : "the stated defaults"};
        if (!mach[r]->network_given)
            fprintf(stderr, "kt-place: warning: rank %d (%s): no network figures: %g GB/s and %g us a message "
                    "assumed for its link to the other ranks (mpirun kt-bench network --machine FILE measures "
                    "them)\n", r, in[r].name, mach[r]->net_gbps,
                    mach[r]->net_latency_us);
    }
    /* --device: every rank whose machine has an accelerator of that backend plans its stage with it */
    int n_devices = 0;
    for (int r = 0; r < n_ranks; r++) {
        in[r].device = KT_PLACE_CPU;
        for (int i = 0; po->device != KT_PLACE_CPU && i < in[r].mach->n_accel; i++)
            if (in[r].mach->accel[i].backend == po->device)
                in[r].device = po->device;
        n_devices += in[r].device != KT_PLACE_CPU;
    }
    if (po->device != KT_PLACE_CPU && n_devices == 0) {
        fprintf(stderr, "kt-place: --device %s: no rank's machine file has a %s accelerator (kt-bench machine on "
                "the rank's host with the device lists it)\n", o->device, kt_place_backend_name(po->device));
        goto done;
    }
    if (kt_plan_ranks(m, o->model, prof, n_ranks, in, po, &rp, &err) != KT_OK) {
        fail(err.msg);
        goto done;
    }
    for (int r = 0; r < n_ranks; r++)
        if (profile_abs)
            snprintf(rp->plans[r]->placement->profile, sizeof rp->plans[r]->placement->profile, "%s", profile_abs);
    if (!(text = kt_rank_plan_yaml(rp, o->model, profile_abs, in))) {
        fail("out of memory");
        goto done;
    }
    if (kt_rank_plan_check_yaml(rp, text, strlen(text), o->output, m, &err) != KT_OK) {
        fprintf(stderr, "kt-place: %s (nothing written)\n", err.msg);
        goto done;
    }
    if (kt_write_file_atomic(o->output, text, strlen(text), &err) != KT_OK) {
        fail(err.msg);
        goto done;
    }
    printf("kt-place: %s -> %s: %d MPI ranks planned in %.1f ms (run: mpirun -np %d kt-serve -m MODEL "
           "--placement %s)\n", o->model, o->output, n_ranks, 1e3 * rp->plan_s, n_ranks, o->output);
    for (int r = 0; r < n_ranks; r++) {
        const struct kt_plan *plan = rp->plans[r];
        printf("  rank %d: %s, %d NUMA node(s)", r, in[r].name, plan->placement->n_nodes);
        if (plan->accel)
            printf(", its %s (%s) with %.2f GiB", plan->placement->devices[plan->accel].name,
                   kt_place_backend_name(in[r].device), plan->accel_memory_gib);
        printf("; network %g GB/s, %g us a message%s\n", in[r].mach->net_gbps, in[r].mach->net_latency_us,
               in[r].mach->network_given ? "" : " (assumed)");
    }
    if (rp->rounds > 1)
        printf("  (the device ranks' estimates took %d splits to settle)\n", rp->rounds);
    printf("predicted stages (decode batch %u at context %u; prefill of %u tokens; rank 0 with the embedding and "
           "the head; each with its link: sending its output to the next rank, the last to rank 0):\n",
           po->batch ? po->batch : 1, po->context ? po->context : 512, po->prefill_tokens ? po->prefill_tokens : 512);
    printf("  %-10s %4s %13s %12s %13s %9s %10s %12s %12s\n", "split", "rank", "layers", "decode ms", "prefill ms",
           "link ms", "holds GiB", "RAM", "device GiB");
    print_stages("planned", rp, rp->stages);
    print_stages("even", rp, rp->even);
    if (!rp->even_fits)
        printf("  (the even split by layer count does not fit every rank's memory)\n");
    rc = 0;
done:
    free(text);
    kt_rank_plan_destroy(rp);
    for (int r = 0; r < n_ranks; r++) {
        kt_cost_destroy(cost[r]);
        free(mach[r]);
    }
    return rc;
}

int main(int argc, char **argv)
{
    struct place_options o = {.objective = "decode", .baseline = -1, .min_gain = 0.02};
    int rc = kt_cli_parse(&cli, argc, argv, 1, 0, &o);
    if (rc >= 0)
        return rc;
    if (!o.model)
        return kt_cli_usage_error(&cli, "%s", "-m MODEL is required");
    if (!o.output && !o.evaluate)
        return kt_cli_usage_error(&cli, "%s", "-o FILE is required");
    if (o.evaluate && o.moves_from)
        return kt_cli_usage_error(&cli, "%s", "--moves-from lists moves to a new plan: not with --evaluate");
    if (o.evaluate && (o.output || o.baseline >= 0 || o.svg))
        return kt_cli_usage_error(&cli, "%s", "--evaluate writes nothing: no -o, --baseline or --svg with it");
    const bool ranks = o.ranks > 0 || o.n_machines > 1;
    if (o.n_machines > 1 && o.ranks && (int)o.ranks != o.n_machines)
        return kt_cli_usage_error(&cli, "%s", "--ranks N with several --machine files: give one --machine per rank "
                                  "(as many as --ranks), or one for every rank");
    if (ranks && (o.evaluate || o.baseline >= 0 || o.svg || o.moves_from || o.explain))
        return kt_cli_usage_error(&cli, "%s", "planning ranks (--ranks, or --machine repeated) writes the ranks' "
                                  "config: not with --evaluate, --baseline, --svg, --moves-from or --explain");
    kt_err err = {0};
    struct kt_model *m = NULL;
    struct kt_profile *prof = NULL;
    struct kt_machine *mach = NULL;
    struct kt_cost_model *cost = NULL;
    struct kt_plan *plan = NULL;
    char *text = NULL, *profile_abs = NULL, *moves = NULL;
    rc = 1;
    if (kt_model_open(o.model, &m, &err) != KT_OK) {
        fail(err.msg);
        goto done;
    }
    if (o.profile) {
        struct kt_model_identity id;
        kt_model_identity(m, &id);
        if (kt_profile_load(o.profile, &prof, &err) != KT_OK ||
            kt_profile_check_model(prof, &id, o.profile, &err) != KT_OK) {
            fail(err.msg);
            goto done;
        }
        if (!(profile_abs = realpath(o.profile, NULL))) {
            fprintf(stderr, "kt-place: %s: cannot resolve its path\n", o.profile);
            goto done;
        }
    } else {
        fprintf(stderr, "kt-place: warning: no --profile: routing taken as uniform, hot experts by index\n");
    }
    if (ranks) {
        const struct kt_planner_options rpo = {
            .device = !o.device || strcmp(o.device, "cpu") == 0 ? KT_PLACE_CPU
                      : strcmp(o.device, "cuda") == 0        ? KT_PLACE_CUDA
                                                             : KT_PLACE_SIM,
            .gpu_memory_gib = o.gpu_memory_gib,
            .kv_tokens = o.kv_tokens,
            .batch = o.batch,
            .prefill_tokens = o.prefill_tokens,
            .context = o.context,
            .objective = strcmp(o.objective, "prefill") == 0 ? KT_PLAN_PREFILL
                         : strcmp(o.objective, "mixed") == 0 ? KT_PLAN_MIXED
                                                             : KT_PLAN_DECODE,
        };
        rc = plan_ranks(&o, m, prof, profile_abs, &rpo);
        goto done;
    }
    if (o.machine) {
        if (kt_machine_load(o.machine, &mach, &err) != KT_OK || kt_machine_check_kind(mach, o.machine, &err) != KT_OK) {
            fail(err.msg);
            goto done;
        }
    } else {
        struct kt_topology *topo = NULL;
        int n_nodes = 1;
        if (kt_topology_create(NULL, &topo, &err) == KT_OK)
            n_nodes = topo->n_nodes;
        kt_topology_destroy(topo);
        if (!(mach = calloc(1, sizeof *mach))) {
            fail("out of memory");
            goto done;
        }
        kt_machine_defaults(mach, n_nodes);
        fprintf(stderr, "kt-place: warning: no --machine: planning with stated defaults for %d NUMA node(s)\n",
                n_nodes);
    }
    for (uint32_t i = 0; i < mach->n_defaulted; i++)
        fprintf(stderr, "kt-place: warning: %s: %s\n", o.machine ? o.machine : "machine", mach->defaulted[i]);
    if (kt_cost_create(m, prof, mach, &cost, &err) != KT_OK) {
        fail(err.msg);
        goto done;
    }
    char budget_source[128];
    if (o.gpu_memory_gib > 0)
        snprintf(budget_source, sizeof budget_source, "--gpu-memory %g", o.gpu_memory_gib);
    else
        snprintf(budget_source, sizeof budget_source, "%s", o.machine ? o.machine : "the machine defaults");
    struct kt_planner_options po = {
        .device = !o.device || strcmp(o.device, "cpu") == 0 ? KT_PLACE_CPU
                  : strcmp(o.device, "cuda") == 0        ? KT_PLACE_CUDA
                                                         : KT_PLACE_SIM,
        .gpu_memory_gib = o.gpu_memory_gib,
        .budget_source = budget_source,
        .kv_tokens = o.kv_tokens,
        .batch = o.batch ? o.batch : 1,
        .prefill_tokens = o.prefill_tokens ? o.prefill_tokens : 512,
        .context = o.context ? o.context : 512,
        .objective = strcmp(o.objective, "prefill") == 0 ? KT_PLAN_PREFILL
                     : strcmp(o.objective, "mixed") == 0 ? KT_PLAN_MIXED
                                                         : KT_PLAN_DECODE,
    };
    if (o.evaluate) {
        rc = evaluate(o.evaluate, m, prof, o.profile, mach, cost, &po);
        goto done;
    }
    if (kt_plan_create(m, o.model, prof, mach, cost, &po, &plan, &err) != KT_OK) {
        fail(err.msg);
        goto done;
    }
    if (profile_abs)
        snprintf(plan->placement->profile, sizeof plan->placement->profile, "%s", profile_abs);
    if (!(text = kt_plan_yaml(plan, o.model, profile_abs))) {
        fail("out of memory");
        goto done;
    }
    if (kt_plan_check_yaml(plan, text, strlen(text), o.output, m, &err) != KT_OK) {
        fprintf(stderr, "kt-place: %s (nothing written)\n", err.msg);
        goto done;
    }
    struct kt_plan_summary s_plan, s_base[KT_BASELINE_COUNT];
    if (kt_plan_summarize(cost, plan->placement, &plan->options, &s_plan, &err) != KT_OK) {
        fail(err.msg);
        goto done;
    }
    int n_base = 0;
    if (plan->accel)
        n_base = KT_BASELINE_COUNT;
    for (int b = 0; b < n_base; b++) {
        struct kt_placement *bp = NULL;
        kt_status st = kt_plan_baseline(plan, m, prof, mach, cost, b, &bp, &err);
        if (!st)
            st = kt_plan_summarize(cost, bp, &plan->options, &s_base[b], &err);
        if (!st && b == o.baseline) {
            free(text);
            if (!(text = baseline_yaml(plan, bp, cost, o.model, profile_abs, &err)))
                st = err.status ? err.status : KT_ERR_NOMEM;
        }
        kt_placement_destroy(bp);
        if (st) {
            fail(err.msg);
            goto done;
        }
    }
    if (o.baseline >= 0 && !plan->accel) {
        fail("--baseline: the baselines differ only in the accelerator's experts; give --device cuda or sim");
        goto done;
    }
    if (o.moves_from && !(moves = moves_report(o.moves_from, m, mach, cost, plan, &o, &err))) {
        fprintf(stderr, "kt-place: --moves-from %s (nothing written)\n", err.msg);
        goto done;
    }
    if (o.svg && draw_plan(o.svg, plan, prof, cost, &err) != KT_OK) {
        fail(err.msg);
        goto done;
    }
    if (kt_write_file_atomic(o.output, text, strlen(text), &err) != KT_OK) {
        fail(err.msg);
        goto done;
    }
    if (o.baseline >= 0)
        printf("kt-place: wrote the baseline '%s' to %s, not the plan\n", kt_plan_baseline_name(o.baseline),
               o.output);
    const struct kt_planner_options *po2 = &plan->options;
    printf("kt-place: %s -> %s: planned in %.1f ms for %d NUMA node(s)%s%s\n", o.model, o.output, 1e3 * plan->plan_s,
           plan->placement->n_nodes, plan->accel ? " and " : "",
           plan->accel ? plan->placement->devices[plan->accel].name : "");
    kt_placement_describe(plan->placement, stdout);
    printf("predicted (decode batch %u at context %u; prefill of %u tokens):\n", po2->batch, po2->context,
           po2->prefill_tokens);
    printf("  %-18s %10s %12s %10s %8s %8s %7s\n", "placement", "decode t/s", "prefill t/s", "on accel",
           "worst", "mean", "experts");
    print_summary("kt-place", &s_plan, NULL);
    for (int b = 0; b < n_base; b++)
        print_summary(kt_plan_baseline_name(b), &s_base[b], &s_plan);
    printf("  (worst, mean: busiest / mean CPU node per MoE layer; %u layer(s) row-sliced; replicas: %u hottest "
           "CPU experts per layer)\n", s_plan.sliced_layers, plan->replicas_hot_per_layer);
    if (o.explain)
        explain(plan);
    if (moves)
        fputs(moves, stdout);
    rc = 0;
done:
    free(text);
    free(profile_abs);
    free(moves);
    kt_plan_destroy(plan);
    kt_cost_destroy(cost);
    free(mach);
    kt_profile_destroy(prof);
    kt_model_close(m);
    return rc;
}
