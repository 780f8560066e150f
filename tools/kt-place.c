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

#include "cli.h"
#include "cost.h"
#include "machine.h"
#include "model.h"
#include "planner.h"
#include "profile.h"
#include "small_file.h"
#include "topology.h"

struct place_options {
    const char *model, *profile, *machine, *output, *device, *objective;
    double gpu_memory_gib;
    uint32_t kv_tokens, batch, prefill_tokens, context;
    bool explain;
};

#define OPTS(o) ((struct place_options *)(o))
KT_CLI_STRING_OPTION(opt_model, model)
KT_CLI_STRING_OPTION(opt_profile, profile)
KT_CLI_STRING_OPTION(opt_machine, machine)
KT_CLI_STRING_OPTION(opt_output, output)
KT_CLI_U32_OPTION(opt_kv, kv_tokens, 1, 1u << 24, "--kv-tokens")
KT_CLI_U32_OPTION(opt_batch, batch, 1, 4096, "--batch")
KT_CLI_U32_OPTION(opt_prefill, prefill_tokens, 1, 1u << 20, "--prefill-tokens")
KT_CLI_U32_OPTION(opt_context, context, 1, 1u << 24, "--context")

static bool opt_device(void *o, const char *arg, char *why, size_t ws)
{
    OPTS(o)->device = arg;
    return strcmp(arg, "cuda") == 0 || strcmp(arg, "sim") == 0 || kt_cli_invalid(why, ws, "--device", arg);
}

static bool opt_objective(void *o, const char *arg, char *why, size_t ws)
{
    OPTS(o)->objective = arg;
    return strcmp(arg, "decode") == 0 || strcmp(arg, "prefill") == 0 || strcmp(arg, "mixed") == 0 ||
           kt_cli_invalid(why, ws, "--objective", arg);
}

static bool opt_gpu_memory(void *o, const char *arg, char *why, size_t ws)
{
    return (kt_cli_parse_double(arg, &OPTS(o)->gpu_memory_gib) && OPTS(o)->gpu_memory_gib > 0 &&
            OPTS(o)->gpu_memory_gib <= 1048576) ||
           kt_cli_invalid(why, ws, "--gpu-memory", arg);
}

static bool opt_explain(void *o, const char *arg, char *why, size_t ws)
{
    (void)arg, (void)why, (void)ws;
    OPTS(o)->explain = true;
    return true;
}

static const struct kt_cli_option options_table[] = {
    {"--model", "-m", "MODEL", 0, "the model (GGUF); only its header is read", opt_model},
    {"--profile", NULL, "FILE", 0, "routing profile (kt-bench profile); without one, routing is taken as uniform",
     opt_profile},
    {"--machine", NULL, "FILE", 0, "machine file (kt-bench machine); without one, stated defaults", opt_machine},
    {"--device", NULL, "cuda|sim", 0, "plan for this accelerator (default: none, CPU only)", opt_device},
    {"--gpu-memory", NULL, "GIB", 0, "the accelerator's budget (default: the machine file's)", opt_gpu_memory},
    {"--kv-tokens", NULL, "N", 0, "KV cache the accelerator holds room for (default 4096)", opt_kv},
    {"--batch", NULL, "B", 0, "decode tokens per step (default 1)", opt_batch},
    {"--prefill-tokens", NULL, "N", 0, "prompt length the prefill figures are for (default 512)", opt_prefill},
    {"--context", NULL, "N", 0, "decode: positions already cached (default 512)", opt_context},
    {"--objective", NULL, "decode|prefill|mixed", 0,
     "what to make fast (default decode; mixed: the profile's decode and prefill tokens)", opt_objective},
    {"--explain", NULL, NULL, 0, "say why each layer got its slots and list its expert homes", opt_explain},
    {"--output", "-o", "FILE", 0, "the placement config to write (required)", opt_output},
};

static void usage(FILE *f);
static const struct kt_cli cli = {.prog = "kt-place", .options = options_table,
                                  .n_options = sizeof options_table / sizeof options_table[0], .usage = usage};

static void usage(FILE *f)
{
    fprintf(f, "usage: kt-place -m MODEL --profile profile.json --machine machine.json [--device cuda|sim]\n"
               "                [--gpu-memory GIB] [--kv-tokens N] [--batch B] [--objective decode|prefill|mixed]\n"
               "                [--explain] -o plan.yaml\n\n"
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

/* "0-3, 7, 9-12" of layer il's experts where keep says. */
static void print_homes(const struct kt_placement *p, uint32_t il, int device, int node)
{
    const struct kt_expert_home *h = p->layers[il].experts;
    bool first = true;
    uint32_t count = 0;
    for (uint32_t x = 0; x < p->n_expert; x++) {
        if (h[x].device != device || (device == 0 && h[x].node != node))
            continue;
        uint32_t last = x;
        while (last + 1 < p->n_expert && h[last + 1].device == device && (device != 0 || h[last + 1].node == node))
            last++;
        printf(last == x ? "%s%u" : "%s%u-%u", first ? "" : ",", x, last);
        count += last - x + 1;
        first = false;
        x = last;
    }
    printf("%s (%u)", first ? "none" : "", count);
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
            print_homes(p, il, plan->accel, -1);
            printf("\n");
        }
        for (int n = 0; n < p->n_nodes; n++) {
            printf("  node %d: ", n);
            print_homes(p, il, 0, n);
            printf("\n");
        }
    }
}

/* ---- main -------------------------------------------------------------------------------------------- */

static int fail(const char *msg)
{
    fprintf(stderr, "kt-place: %s\n", msg);
    return 1;
}

int main(int argc, char **argv)
{
    struct place_options o = {.objective = "decode"};
    int rc = kt_cli_parse(&cli, argc, argv, 1, 0, &o);
    if (rc >= 0)
        return rc;
    if (!o.model)
        return kt_cli_usage_error(&cli, "%s", "-m MODEL is required");
    if (!o.output)
        return kt_cli_usage_error(&cli, "%s", "-o FILE is required");
    kt_err err = {0};
    struct kt_model *m = NULL;
    struct kt_profile *prof = NULL;
    struct kt_machine *mach = NULL;
    struct kt_cost_model *cost = NULL;
    struct kt_plan *plan = NULL;
    char *text = NULL, *profile_abs = NULL;
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
        .device = !o.device ? KT_PLACE_CPU : strcmp(o.device, "cuda") == 0 ? KT_PLACE_CUDA : KT_PLACE_SIM,
        .gpu_memory_gib = o.gpu_memory_gib,
        .budget_source = budget_source,
        .kv_tokens = o.kv_tokens,
        .batch = o.batch,
        .prefill_tokens = o.prefill_tokens,
        .context = o.context,
        .objective = strcmp(o.objective, "prefill") == 0 ? KT_PLAN_PREFILL
                     : strcmp(o.objective, "mixed") == 0 ? KT_PLAN_MIXED
                                                         : KT_PLAN_DECODE,
    };
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
    for (int b = 0; plan->accel && b < KT_BASELINE_COUNT; b++, n_base++) {
        struct kt_placement *bp = NULL;
        kt_status st = kt_plan_baseline(plan, m, prof, mach, cost, b, &bp, &err);
        if (!st)
            st = kt_plan_summarize(cost, bp, &plan->options, &s_base[b], &err);
        kt_placement_destroy(bp);
        if (st) {
            fail(err.msg);
            goto done;
        }
    }
    if (kt_write_file_atomic(o.output, text, strlen(text), &err) != KT_OK) {
        fail(err.msg);
        goto done;
    }
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
    rc = 0;
done:
    free(text);
    free(profile_abs);
    kt_plan_destroy(plan);
    kt_cost_destroy(cost);
    free(mach);
    kt_profile_destroy(prof);
    kt_model_close(m);
    return rc;
}
