/*
 * test_kt_bench.c - kt-bench end to end: `kernels` writes JSON whose every
 * number is positive and finite and whose every ratio is in (0, 100) (a unit check: contention moves ratios), with a
 * result per weight type and measured level; `model` on a tiny synthetic
 * model reports each layer and its per-layer split adds up to the steps'
 * wall time; `check` passes CPU-only and on the sim (configs/tiny-sim.yaml)
 * with every row in its JSON; bad arguments exit 2 with usage and say what
 * to do (the command or option meant, the commands an option belongs to, a
 * number's range), an unwritable --json is refused before measuring, a
 * missing model exits 1.
 * It checks shapes and consistency, never a speed (no timed assertions).
 */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model.h"
#include "profile.h"
#include "testlib.h"

#if defined(__SANITIZE_ADDRESS__)
#define KERNELS_ARGS "--seconds 0.01 --prefill-tokens 2 --isa avx2" /* sanitizers: one level, shortest runs */
#else
#define KERNELS_ARGS "--seconds 0.05 --prefill-tokens 4 --isa avx2,avx512" /* scalar passes over a GiB are slow */
#endif

static const char *const bench_types[] = {"q4_K", "q5_K", "q6_K", "q8_0", "bf16", "f16", "f32", "mxfp4", "fp8_b128"};
#define N_BENCH_TYPES (int)(sizeof bench_types / sizeof bench_types[0])

/* Every number under j is finite and > 0 (router_ns may be 0: dense layers
 * have none); every key with "ratio" holds a number in (0, 100). */
static void check_numbers(json_t *j, const char *key, const char *where)
{
    if (json_is_object(j)) {
        const char *k;
        json_t *v;
        json_object_foreach(j, k, v) check_numbers(v, k, where);
    } else if (json_is_array(j)) {
        size_t i;
        json_t *v;
        json_array_foreach(j, i, v) check_numbers(v, key, where);
    } else if (json_is_number(j)) {
        double x = json_number_value(j);
        bool may_be_zero = key && (!strcmp(key, "router_ns") || !strcmp(key, "layer") || !strcmp(key, "seed"));
        KT_CHECK(isfinite(x) && (x > 0 || (may_be_zero && x == 0)), "%s: %s = %g", where, key ? key : "?", x);
        /* Ratios are measured against peaks and triads taken a moment apart;
         * on a shared machine (or beside other tests) either side can be
         * squeezed, so only a unit mistake (orders of magnitude) fails here. */
        if (key && strstr(key, "ratio"))
            KT_CHECK(x > 0 && x < 100, "%s: %s = %g not in (0, 100)", where, key, x);
    }
}

static double num(json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    KT_CHECK(json_is_number(v), "field %s missing", key);
    return v ? json_number_value(v) : NAN;
}

static void kernels_json_has_every_field_positive_and_ratios_in_range(void)
{
    const char *json_path = kt_test_path("kernels.json");
    int rc = kt_test_system("'%s' kernels --threads 2 " KERNELS_ARGS " --json '%s' > /dev/null",
                            kt_test_tool("kt-bench"), json_path);
    KT_CHECK(rc == 0, "kt-bench kernels exited %d", rc);
    json_error_t je;
    json_t *root = json_load_file(json_path, 0, &je);
    KT_CHECK(root != NULL, "cannot parse %s: %s", json_path, je.text);
    if (!root)
        return;
    check_numbers(root, NULL, "kernels");
    json_t *triad = json_object_get(root, "triad");
    KT_CHECK(num(triad, "best_gbps") > 0, "triad");
    KT_CHECK(num(root, "fma_peak_gflops") > 0, "fma peak");
    KT_CHECK(num(root, "int8_peak_gops") > 0, "int8 peak");
    KT_CHECK(json_array_size(json_object_get(root, "peaks")) >= 2, "fewer than 2 peaks");
    json_t *results = json_object_get(root, "kernels");
    size_t n = json_array_size(results);
    /* every type at one level at least, and every measured level has every type */
    for (size_t t = 0; t < sizeof bench_types / sizeof bench_types[0]; t++) {
        int found = 0;
        size_t i;
        json_t *r;
        json_array_foreach(results, i, r)
        {
            if (strcmp(json_string_value(json_object_get(r, "type")), bench_types[t]))
                continue;
            found++;
            json_t *d = json_object_get(r, "decode"), *p = json_object_get(r, "prefill");
            KT_CHECK(num(d, "gbps") > 0 && num(d, "ratio_to_triad") > 0, "%s decode", bench_types[t]);
            KT_CHECK(num(d, "weight_bytes") > 2 * 7168.0 * 2048 * 0.5, "%s decode working set", bench_types[t]);
            KT_CHECK(num(p, "gflops") > 0 && num(p, "ratio_to_peak") > 0, "%s prefill", bench_types[t]);
        }
        KT_CHECK(found >= 1, "no result for %s", bench_types[t]);
        KT_CHECK(n % N_BENCH_TYPES == 0 && found == (int)(n / N_BENCH_TYPES), "%s: %d results of %zu", bench_types[t],
                 found, n);
    }
    /* each packed decode row beside its own triads (taken just before and after it) */
    json_t *packed = json_object_get(root, "packed");
    size_t ip;
    json_t *pr;
    json_array_foreach(packed, ip, pr)
    {
        json_t *d = json_object_get(pr, "decode");
        const char *name = json_string_value(json_object_get(pr, "format"));
        KT_CHECK(num(d, "adjacent_triad_gbps") > 0 && num(d, "ratio_to_adjacent_triad") > 0, "%s: adjacent triad",
                 name ? name : "?");
        KT_CHECK(fabs(num(d, "ratio_to_adjacent_triad") * num(d, "adjacent_triad_gbps") - num(d, "gbps")) <=
                     1e-4 * num(d, "gbps"), /* 6 significant digits in the JSON */
                 "%s: ratio_to_adjacent_triad is not gbps over adjacent_triad_gbps", name ? name : "?");
    }
    json_decref(root);
    remove(json_path);
}

/* kt-bench model --json's "routing": rows per layer (tiny: layer 0 dense, 32
 * experts top-8), each MoE layer's row summing to its phase's tokens x 8. */
static void check_routing(json_t *routing, double decode_tokens, double prefill_tokens)
{
    KT_CHECK(json_is_object(routing), "no routing object");
    const char *phases[] = {"decode", "prefill"};
    for (int ph = 0; ph < 2; ph++) {
        json_t *rows = json_object_get(routing, phases[ph]);
        KT_CHECK(json_array_size(rows) == 4, "routing.%s: %zu rows", phases[ph], json_array_size(rows));
        for (size_t il = 0; il < json_array_size(rows); il++) {
            json_t *row = json_array_get(rows, il);
            KT_CHECK(json_array_size(row) == (il == 0 ? 0 : 32), "routing.%s[%zu]: %zu experts", phases[ph], il,
                     json_array_size(row));
            double sum = 0;
            for (size_t x = 0; x < json_array_size(row); x++)
                sum += json_integer_value(json_array_get(row, x));
            if (il > 0)
                KT_CHECK(sum == 8 * (ph ? prefill_tokens : decode_tokens), "routing.%s[%zu] sums to %g",
                         phases[ph], il, sum);
        }
    }
}

static void model_reports_every_layer_and_splits_add_up(void)
{
    const char *model = kt_test_path("tiny.gguf"), *json_path = kt_test_path("model.json");
    int rc = kt_test_system("'%s' --preset tiny -o '%s' > /dev/null 2>&1", kt_test_tool("kt-synth"), model);
    KT_CHECK(rc == 0, "kt-synth exited %d", rc);
    char svg[1024];
    snprintf(svg, sizeof svg, "%s", kt_test_path("model-split.svg"));
    rc = kt_test_system("'%s' model -m '%s' --prompt-tokens 16 --gen-tokens 4 --threads 2 --json '%s' --svg '%s' > /dev/null",
                        kt_test_tool("kt-bench"), model, json_path, svg);
    KT_CHECK(rc == 0, "kt-bench model exited %d", rc);
    {
        size_t n = 0;
        char *text = kt_test_read_file(svg, &n);
        KT_CHECK(text && strstr(text, "<svg") && strstr(text, "attention") && strstr(text, "router") &&
                     strstr(text, "experts") && strstr(text, "combine") && strstr(text, "</svg>"),
                 "--svg drew the per-layer split");
        for (int il = 0; text && il < 4; il++) {
            char label[32];
            snprintf(label, sizeof label, ">layer %d<", il);
            KT_CHECK(strstr(text, label) != NULL, "%s has no label '%s'", svg, label);
        }
        free(text);
    }
    json_error_t je;
    json_t *root = json_load_file(json_path, 0, &je);
    KT_CHECK(root != NULL, "cannot parse %s: %s", json_path, je.text);
    if (root) {
        /* routing counts may be 0: checked on their own */
        json_t *routing = json_incref(json_object_get(root, "routing"));
        json_object_del(root, "routing");
        check_routing(routing, 4, 16);
        json_decref(routing);
        check_numbers(root, NULL, "model");
        const double n_layer = num(root, "n_layer");
        KT_CHECK(n_layer == 4, "tiny has 4 layers, JSON says %g", n_layer);
        const char *phases[] = {"prefill", "decode"};
        for (int ph = 0; ph < 2; ph++) {
            json_t *p = json_object_get(root, phases[ph]);
            KT_CHECK(num(p, "tokens") == (ph ? 4 : 16), "%s tokens", phases[ph]);
            KT_CHECK(num(p, "tok_per_s") > 0, "%s tok/s", phases[ph]);
            json_t *layers = json_object_get(p, "layers");
            KT_CHECK(json_array_size(layers) == (size_t)n_layer, "%s: %zu layer entries", phases[ph],
                     json_array_size(layers));
            double sum[4] = {0}, total = 0;
            const char *parts[4] = {"attention_ns", "router_ns", "experts_ns", "combine_ns"};
            size_t i;
            json_t *l;
            json_array_foreach(layers, i, l)
            {
                KT_CHECK(num(l, "layer") == (double)i, "layer index");
                double lt = 0;
                for (int k = 0; k < 4; k++)
                    lt += num(l, parts[k]), sum[k] += num(l, parts[k]);
                KT_CHECK(fabs(lt - num(l, "total_ns")) <= 1, "layer %zu total", i);
                KT_CHECK(num(l, "attention_ns") > 0 && num(l, "experts_ns") > 0, "layer %zu has no time", i);
                total += lt;
            }
            /* the per-layer split covers the step: layers + embedding/head = wall time */
            const double wall = num(p, "wall_ns");
            KT_CHECK(fabs(total - num(p, "layers_ns")) <= 4, "%s layers_ns", phases[ph]);
            KT_CHECK(fabs(total + num(p, "embed_head_ns") - wall) <= 0.1 * wall, "%s: layers %g + head %g vs wall %g",
                     phases[ph], total, num(p, "embed_head_ns"), wall);
            KT_CHECK(fabs(sum[0] - num(p, "attention_ns")) <= 0.1 * num(p, "attention_ns"), "%s attention",
                     phases[ph]);
            KT_CHECK(fabs(sum[1] - num(p, "router_ns")) <= 0.1 * num(p, "router_ns"), "%s router", phases[ph]);
        }
        json_t *d = json_object_get(root, "decode");
        KT_CHECK(num(d, "weight_bytes_per_token") > 0 && num(d, "ratio_to_triad") > 0, "decode bandwidth");
        json_decref(root);
    }
    /* --cold: no untimed prefill first; by default it is not counted (the routing sums above) */
    rc = kt_test_system("'%s' model -m '%s' --prompt-tokens 16 --gen-tokens 4 --threads 2 --cold --json '%s' > /dev/null",
                        kt_test_tool("kt-bench"), model, json_path);
    KT_CHECK(rc == 0, "kt-bench model --cold exited %d", rc);
    root = json_load_file(json_path, 0, &je);
    KT_CHECK(root != NULL, "cannot parse %s: %s", json_path, je.text);
    if (root) {
        check_routing(json_object_get(root, "routing"), 4, 16);
        KT_CHECK(num(json_object_get(root, "prefill"), "steps") == 1, "--cold: one prefill step timed");
        json_decref(root);
    }
    remove(model);
    remove(json_path);
}


/* kt-bench model --predict: the cost model's split of every layer beside the
 * measured one, decode and prefill, CPU-only and on the sim device (tiny-sim),
 * with stated defaults when no machine file is given; a machine file that
 * cannot be read fails the run, naming it. */
static void model_predict_reports_every_layer(void)
{
    const char *model = kt_test_path("tiny-p.gguf"), *json_path = kt_test_path("predict.json");
    const char *src = getenv("KT_SOURCE_DIR");
    char plan[1024];
    snprintf(plan, sizeof plan, "%s/configs/tiny-sim.yaml", src ? src : ".");
    int rc = kt_test_system("'%s' --preset tiny -o '%s' > /dev/null 2>&1", kt_test_tool("kt-synth"), model);
    KT_CHECK(rc == 0, "kt-synth exited %d", rc);
    for (int with_sim = 0; with_sim < 2; with_sim++) {
        char placement[1100] = "";
        if (with_sim)
            snprintf(placement, sizeof placement, "--placement '%s'", plan);
        remove(json_path);
        rc = kt_test_system("'%s' model -m '%s' %s --prompt-tokens 16 --gen-tokens 4 --threads 2 --predict --json '%s' "
                            "> /dev/null 2>&1",
                            kt_test_tool("kt-bench"), model, placement, json_path);
        KT_CHECK(rc == 0, "kt-bench model --predict %s exited %d", placement, rc);
        json_error_t je;
        json_t *root = json_load_file(json_path, 0, &je);
        KT_CHECK(root != NULL, "cannot parse %s: %s", json_path, je.text);
        json_t *pred = json_object_get(root, "predicted");
        KT_CHECK(pred && json_is_string(json_object_get(pred, "machine")), "a \"predicted\" object naming its machine");
        const char *phases[] = {"prefill", "decode"};
        for (int ph = 0; pred && ph < 2; ph++) {
            json_t *p = json_object_get(pred, phases[ph]), *layers = json_object_get(p, "layers");
            KT_CHECK(json_array_size(layers) == 4, "%s: %zu predicted layers", phases[ph], json_array_size(layers));
            double sum = 0;
            size_t i;
            json_t *l;
            json_array_foreach(layers, i, l)
            {
                const double parts = num(l, "attention_ns") + num(l, "router_ns") + num(l, "experts_ns") +
                                     num(l, "combine_ns");
                KT_CHECK(num(l, "total_ns") > 0 && fabs(parts - num(l, "total_ns")) <= 4, "%s layer %zu: %g vs %g",
                         phases[ph], i, parts, num(l, "total_ns"));
                KT_CHECK(isfinite(num(l, "error")) && num(l, "error") > -1, "%s layer %zu error %g", phases[ph], i,
                         num(l, "error"));
                KT_CHECK(with_sim ? num(l, "device_ns") > 0 : num(l, "device_ns") == 0, "%s layer %zu device %g",
                         phases[ph], i, num(l, "device_ns"));
                sum += num(l, "total_ns");
            }
            KT_CHECK(num(p, "step_ns") > sum, "%s: the step %g covers its layers %g", phases[ph], num(p, "step_ns"), sum);
        }
        json_decref(root);
    }
    const char *out = kt_test_path("predict.out");
    rc = kt_test_system("'%s' model -m '%s' --prompt-tokens 4 --gen-tokens 1 --predict --machine /nonexistent/m.json "
                        "> '%s' 2>&1",
                        kt_test_tool("kt-bench"), model, out);
    size_t text_bytes = 0;
    char *text = kt_test_read_file(out, &text_bytes);
    KT_CHECK(rc == 1 && text && strstr(text, "/nonexistent/m.json"), "an unreadable machine file: rc %d, '%s'", rc,
             text ? text : "");
    free(text);
    remove(out);
    remove(model);
    remove(json_path);
}

/* kt-bench profile: prompt lines of every kind through prefill and greedy
 * decode, batch 2; the profile file carries the model's identity and counts
 * that add up to its token totals (tiny: layer 0 dense, 32 experts top-8). */
static void profile_writes_counts_that_add_up_to_the_tokens(void)
{
    const char *model = kt_test_path("tiny-profile.gguf"), *prompts = kt_test_path("prompts.txt"),
               *out = kt_test_path("profile.json"), *decayed = kt_test_path("profile-decayed.json");
    int rc = kt_test_system("'%s' --preset tiny -o '%s' > /dev/null 2>&1", kt_test_tool("kt-synth"), model);
    KT_CHECK(rc == 0, "kt-synth exited %d", rc);
    FILE *f = fopen(prompts, "w");
    KT_CHECK(f != NULL, "cannot write %s", prompts);
    if (!f)
        return;
    fputs("Hello there, how are you?\n\n"
          "{\"messages\": [{\"role\": \"system\", \"content\": \"Be terse.\"}, {\"role\": \"user\", \"content\": \"A poem.\"}]}\n"
          "[{\"role\": \"user\", \"content\": \"def f(x): return x * 2\"}]\n"
          "\xd0\x9f\xd1\x80\xd0\xb8\xd0\xb2\xd0\xb5\xd1\x82\n",
          f);
    fclose(f);
    const char *svg = kt_test_path("profile.svg"), *report = kt_test_path("profile-report.txt");
    rc = kt_test_system("'%s' profile -m '%s' --prompts '%s' --max-tokens 5 --batch 2 --threads 2 -o '%s' --svg '%s' "
                        "--placement '%s/configs/tiny-sim.yaml' > '%s' 2>/dev/null",
                        kt_test_tool("kt-bench"), model, prompts, out, svg, getenv("KT_SOURCE_DIR"), report);
    KT_CHECK(rc == 0, "kt-bench profile exited %d", rc);
    {
        size_t n_text = 0, n_lines = 0;
        char *text = kt_test_read_file(svg, &n_text), *lines = kt_test_read_file(report, &n_lines);
        KT_CHECK(text && strstr(text, "<svg") && strstr(text, "layer 3") && strstr(text, "</svg>"),
                 "--svg drew the heat map");
        /* tiny-sim.yaml puts 16 of the 32 experts of each layer on the sim */
        KT_CHECK(lines && strstr(lines, "routed pairs on the accelerator, decode: ") && strstr(lines, "decode: "),
                 "the report gives the accelerator's share and the decode steps:\n%s", lines ? lines : "");
        free(text);
        free(lines);
    }
    struct kt_profile *p = NULL;
    struct kt_model *m = NULL;
    kt_err err = {0};
    KT_CHECK(kt_profile_load(out, &p, &err) == KT_OK, "%s", err.msg);
    KT_CHECK(kt_model_open(model, &m, &err) == KT_OK, "%s", err.msg);
    if (p && m) {
        struct kt_model_identity id;
        kt_model_identity(m, &id);
        KT_CHECK(p->model.fingerprint == id.fingerprint && kt_profile_check_model(p, &id, out, &err) == KT_OK,
                 "the profile names its model: %s", err.msg);
        KT_CHECK(p->n_layer == 4 && p->n_expert == 32 && p->half_life_tokens == 0, "shape");
        /* 4 prompts x 5 new tokens, the last of each never stepped: 16 decode tokens */
        KT_CHECK(p->tokens[KT_PROFILE_DECODE] == 16, "decode tokens %g", p->tokens[KT_PROFILE_DECODE]);
        KT_CHECK(p->tokens[KT_PROFILE_PREFILL] > 4 * 5, "prefill tokens %g", p->tokens[KT_PROFILE_PREFILL]);
        for (int ph = 0; ph < 2; ph++)
            for (uint32_t il = 0; il < 4; il++) {
                double sum = 0;
                for (uint32_t x = 0; x < 32; x++)
                    sum += p->counts[ph][il * 32 + x];
                KT_CHECK(sum == (il == 0 ? 0 : 8 * p->tokens[ph]), "phase %d layer %u: %g routed", ph, il, sum);
            }
    }
    /* with a half-life the totals decay below the plain ones */
    rc = kt_test_system("'%s' profile -m '%s' --prompts '%s' --max-tokens 5 --batch 2 --threads 2 --half-life 50 "
                        "-o '%s' > /dev/null",
                        kt_test_tool("kt-bench"), model, prompts, decayed);
    KT_CHECK(rc == 0, "kt-bench profile --half-life exited %d", rc);
    struct kt_profile *q = NULL;
    KT_CHECK(kt_profile_load(decayed, &q, &err) == KT_OK, "%s", err.msg);
    KT_CHECK(p && q && q->half_life_tokens == 50 && q->tokens[KT_PROFILE_DECODE] < p->tokens[KT_PROFILE_DECODE] &&
                 q->tokens[KT_PROFILE_DECODE] > 0,
             "decayed decode tokens %g", q ? q->tokens[KT_PROFILE_DECODE] : -1);
    kt_profile_destroy(p);
    kt_profile_destroy(q);
    kt_model_close(m);

    /* bad prompt files: a message naming the file (and line), nothing written */
    const char *bad = kt_test_path("bad-prompts.txt"), *msg = kt_test_path("profile-msg.txt"),
               *none = kt_test_path("none.json");
    static const struct {
        const char *text, *needle;
    } cases[] = {
        {NULL, ": cannot open"},
        {"\n   \n", ": no prompts"},
        {"fine\n{\"messages\": [}\n", ":2:"},
        {"[{\"role\": \"robot\", \"content\": \"x\"}]\n", ":1: messages[0].role"},
        {"{\"prompt\": \"x\"}\n", ":1: expected {\"messages\""},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        remove(bad);
        if (cases[i].text && (f = fopen(bad, "w")) != NULL) {
            fputs(cases[i].text, f);
            fclose(f);
        }
        rc = kt_test_system("'%s' profile -m '%s' --prompts '%s' -o '%s' > /dev/null 2> '%s'",
                            kt_test_tool("kt-bench"), model, bad, none, msg);
        size_t n = 0;
        char *text = kt_test_read_file(msg, &n);
        char want[2048];
        snprintf(want, sizeof want, "kt-bench: %s%s", bad, cases[i].needle);
        KT_CHECK(rc == 1 && text && strstr(text, want), "case %zu: rc %d, message %s, want %s", i, rc,
                 text ? text : "(none)", want);
        KT_CHECK(!kt_test_read_file(none, &n), "case %zu: a profile was written", i);
        free(text);
    }
    remove(bad), remove(msg), remove(model), remove(prompts), remove(out), remove(decayed);
}

/* kt-bench check on tiny: the built-in prompts CPU-only and through
 * configs/tiny-sim.yaml, and --prompts lines; exit 0, a table naming each
 * prompt with its numbers and PASS, and JSON with every row (divergence 0:
 * both placements compute the reference's bits).  A prompt file that cannot
 * be read exits 1 naming it. */
static void check_passes_cpu_only_and_on_the_sim_with_every_row_reported(void)
{
    const char *model = kt_test_path("tiny-check.gguf"), *json_path = kt_test_path("check.json"),
               *report = kt_test_path("check-report.txt"), *prompts = kt_test_path("check-prompts.txt");
    int rc = kt_test_system("'%s' --preset tiny -o '%s' > /dev/null 2>&1", kt_test_tool("kt-synth"), model);
    KT_CHECK(rc == 0, "kt-synth exited %d", rc);
    FILE *f = fopen(prompts, "w");
    KT_CHECK(f != NULL, "cannot write %s", prompts);
    if (!f)
        return;
    fputs("Name three rivers.\n\n[{\"role\": \"user\", \"content\": \"for i in range(3): print(i)\"}]\n", f);
    fclose(f);
    char placement[1100];
    snprintf(placement, sizeof placement, "--placement '%s/configs/tiny-sim.yaml'", getenv("KT_SOURCE_DIR"));
    const struct {
        const char *args;
        size_t n_prompts;
        const char *labels[3];
    } cases[] = {
        {"", 3, {"prose", "code", "chinese"}},
        {placement, 3, {"prose", "code", "chinese"}},
        {"--prompts", 2, {"line 1", "line 3"}},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        remove(json_path);
        rc = kt_test_system("'%s' check -m '%s' %s %s --max-tokens 4 -t 2 --json '%s' > '%s' 2>/dev/null",
                            kt_test_tool("kt-bench"), model, cases[c].args, c == 2 ? prompts : "", json_path, report);
        KT_CHECK(rc == 0, "kt-bench check %s exited %d", cases[c].args, rc);
        size_t n = 0;
        char *text = kt_test_read_file(report, &n);
        KT_CHECK(text && strstr(text, "median") && strstr(text, "9 in 10") && strstr(text, "\nPASS: ") &&
                     !strstr(text, "FAIL"),
                 "%s: the report gives the numbers and PASS:\n%s", cases[c].args, text ? text : "");
        for (size_t i = 0; text && i < cases[c].n_prompts; i++)
            KT_CHECK(strstr(text, cases[c].labels[i]) != NULL, "%s: no prompt '%s' in the report", cases[c].args,
                     cases[c].labels[i]);
        free(text);
        json_error_t je;
        json_t *root = json_load_file(json_path, 0, &je);
        KT_CHECK(root != NULL, "cannot parse %s: %s", json_path, je.text);
        json_t *ps = json_object_get(root, "prompts");
        KT_CHECK(json_is_true(json_object_get(root, "pass")) && json_array_size(ps) == cases[c].n_prompts &&
                     num(root, "n_layer") == 4 && num(root, "max_tokens") == 4,
                 "%s: pass, %zu prompts", cases[c].args, json_array_size(ps));
        size_t i;
        json_t *p;
        json_array_foreach(ps, i, p)
        {
            json_t *rows = json_object_get(p, "rows");
            const double prompt_tokens = num(p, "prompt_tokens");
            size_t generated = 0, k;
            json_t *row;
            json_array_foreach(rows, k, row)
            {
                generated += json_is_true(json_object_get(row, "generated"));
                KT_CHECK(num(row, "pos") == (double)k && num(row, "divergence") == 0 &&
                             num(row, "ref_token") == num(row, "cand_token"),
                         "%s, prompt %zu, row %zu", cases[c].args, i, k);
            }
            /* up to 4 new tokens: an end-of-generation token may end one sooner */
            KT_CHECK(prompt_tokens > 0 && json_array_size(rows) + 1 == prompt_tokens + generated && generated >= 1 &&
                         generated <= 4,
                     "%s, prompt %zu: %zu rows, %g prompt tokens, %zu generated", cases[c].args, i,
                     json_array_size(rows), prompt_tokens, generated);
            KT_CHECK(!strcmp(json_string_value(json_object_get(p, "label")), cases[c].labels[i]) &&
                         json_is_true(json_object_get(p, "pass")) && json_is_null(json_object_get(p, "break")) &&
                         num(p, "median") == 0 && num(p, "worst") == 0,
                     "%s, prompt %zu: label, pass, no break, 0", cases[c].args, i);
        }
        json_decref(root);
    }
    rc = kt_test_system("'%s' check -m '%s' --prompts /nonexistent/prompts.txt > /dev/null 2> '%s'",
                        kt_test_tool("kt-bench"), model, report);
    size_t n = 0;
    char *text = kt_test_read_file(report, &n);
    KT_CHECK(rc == 1 && text && strstr(text, "kt-bench: /nonexistent/prompts.txt: cannot open"),
             "a missing prompt file: rc %d, '%s'", rc, text ? text : "");
    free(text);
    remove(model), remove(json_path), remove(report), remove(prompts);
}

static void bad_arguments_exit_2_with_usage(void)
{
    const char *out = kt_test_path("usage.txt");
    const char *bench = kt_test_tool("kt-bench");
    const char *cases[] = {"", "frobnicate", "kernels --seconds abc", "kernels --threads 0", "kernels --isa sse9",
                           "kernels -m x.gguf", "model", "model -m a.gguf --gen-tokens", "kernels --bogus",
                           "profile -m a.gguf -o p.json", "profile --prompts p.txt -o p.json",
                           "profile -m a.gguf --prompts p.txt", "profile -m a.gguf --prompts p.txt -o p.json --batch 0",
                           "check", "check --placement p.yaml", "check -m a.gguf --max-tokens 0",
                           "check -m a.gguf --batch 2"};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int rc = kt_test_system("'%s' %s > /dev/null 2> '%s'", bench, cases[i], out);
        KT_CHECK(rc == 2, "'kt-bench %s' exited %d, want 2", cases[i], rc);
        size_t text_bytes = 0;
        char *text = kt_test_read_file(out, &text_bytes);
        KT_CHECK(text && strstr(text, "usage: kt-bench"), "'kt-bench %s' printed no usage", cases[i]);
        free(text);
    }
    remove(out);
}

/* Usage errors say what to do: the command or option meant, the commands an
 * option belongs to, a number's range, what a command lacks; an output file
 * that cannot be written is refused before anything is measured. */
static void bad_arguments_say_what_to_do(void)
{
    const char *out = kt_test_path("say.txt");
    const char *bench = kt_test_tool("kt-bench");
    struct {
        const char *args;
        int want_rc;
        const char *want;
    } cases[] = {
        {"kernel", 2, "kt-bench: the command 'kernel' is not one of kernels, model, machine, profile, check, "
                      "grammar or network: did you mean 'kernels'?"},
        {"kernels -m x.gguf", 2, "kt-bench: --model does not apply to kernels: it is an option of model, profile, "
                                 "check, grammar and network"},
        {"kernels --seconds 0", 2, "kt-bench: --seconds '0' is out of range: give a number in [0.01, 600]"},
        {"model -m a.gguf --gen-token 4", 2, "kt-bench: unknown option '--gen-token': did you mean '--gen-tokens'?"},
        {"model -m a.gguf --machine m.json", 2, "kt-bench: --machine and --profile feed --predict's cost model"},
        {"profile -m a.gguf", 2, "kt-bench: profile: give --prompts FILE (the prompts to route) and -o PROFILE.json"},
        {"kernels --json /nonexistent-dir/k.json", 1,
         "kt-bench: --json /nonexistent-dir/k.json: the folder /nonexistent-dir: No such file or directory"},
        /* before the experts' memory check a real-size model fails on */
        {"model -m HUGE --prompt-tokens 1000000 --gen-tokens 1000", 1,
         "kt-bench: --prompt-tokens and --gen-tokens need 1001000 positions, more than "},
        {"check -m HUGE --max-tokens 200000", 1, "kt-bench: the longest prompt and --max-tokens need "},
    };
    char huge[1024];
    snprintf(huge, sizeof huge, "%s", kt_test_path("say-k2-header.gguf"));
    KT_CHECK(kt_test_system("'%s' --preset kimi-k2-slice --layers 61 --experts 384 --header-only -q -o '%s' "
                            "> /dev/null",
                            kt_test_tool("kt-synth"), huge) == 0,
             "kt-synth --header-only");
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char args[2048];
        const char *mark = strstr(cases[i].args, "HUGE");
        if (mark)
            snprintf(args, sizeof args, "%.*s%s%s", (int)(mark - cases[i].args), cases[i].args, huge, mark + 4);
        else
            snprintf(args, sizeof args, "%s", cases[i].args);
        int rc = kt_test_system("'%s' %s > /dev/null 2> '%s'", bench, args, out);
        size_t n = 0;
        char *text = kt_test_read_file(out, &n);
        KT_CHECK(rc == cases[i].want_rc && text && !strncmp(text, cases[i].want, strlen(cases[i].want)) &&
                     (!mark || strstr(text, "(context_length 131072): ")),
                 "'kt-bench %s': exit %d (want %d), stderr:\n%s", cases[i].args, rc, cases[i].want_rc,
                 text ? text : "");
        free(text);
    }
    remove(out), remove(huge);
}

static void missing_model_exits_1_with_a_message(void)
{
    const char *out = kt_test_path("missing.txt");
    const char *commands[] = {"model", "check"};
    for (size_t c = 0; c < 2; c++) {
        int rc = kt_test_system("'%s' %s -m /nonexistent/model.gguf > /dev/null 2> '%s'", kt_test_tool("kt-bench"),
                                commands[c], out);
        KT_CHECK(rc == 1, "%s exited %d, want 1", commands[c], rc);
        size_t text_bytes = 0;
        char *text = kt_test_read_file(out, &text_bytes);
        KT_CHECK(text && strstr(text, "kt-bench: ") && strstr(text, "/nonexistent/model.gguf"), "%s: message: %s",
                 commands[c], text ? text : "(none)");
        free(text);
    }
    remove(out);
}

static void grammar_reports_the_mask_cost_of_a_document(void)
{
    const char *json = kt_test_path("grammar.json");
    int rc = kt_test_system("'%s' grammar --vocab 20000 --seed 3 --json '%s' > /dev/null", kt_test_tool("kt-bench"), json);
    KT_CHECK(rc == 0, "kt-bench grammar exited %d", rc);
    json_t *j = json_load_file(json, 0, NULL);
    KT_CHECK(j != NULL, "no JSON");
    if (j) {
        KT_CHECK(num(j, "vocab_tokens") == 20000 && json_is_true(json_object_get(j, "synthetic_vocab")), "vocabulary");
        double tokens = num(j, "document_tokens");
        KT_CHECK(tokens > 100 && tokens < 973, "the document in %g tokens", tokens);
        json_t *all = json_object_get(j, "all"), *cpu = json_object_get(j, "cpu all");
        KT_CHECK(num(all, "tokens") == tokens + 1 && num(cpu, "tokens") == tokens + 1, "a mask per token and at the end");
        KT_CHECK(num(all, "median_ms") <= num(all, "p99_ms") && num(all, "p99_ms") <= num(all, "worst_ms"),
                 "percentiles in order");
        check_numbers(j, NULL, "grammar");
        json_decref(j);
    }
    remove(json);
    rc = kt_test_system("'%s' grammar --vocab 100 > /dev/null 2>&1", kt_test_tool("kt-bench"));
    KT_CHECK(rc == 2, "--vocab 100 exited %d, want 2 (usage)", rc);
}

int main(void)
{
    KT_RUN(bad_arguments_exit_2_with_usage);
    KT_RUN(bad_arguments_say_what_to_do);
    KT_RUN(missing_model_exits_1_with_a_message);
    KT_RUN(grammar_reports_the_mask_cost_of_a_document);
    KT_RUN(model_reports_every_layer_and_splits_add_up);
    KT_RUN(model_predict_reports_every_layer);
    KT_RUN(profile_writes_counts_that_add_up_to_the_tokens);
    KT_RUN(check_passes_cpu_only_and_on_the_sim_with_every_row_reported);
    KT_RUN(kernels_json_has_every_field_positive_and_ratios_in_range);
    return kt_test_finish();
}
