/*
 * test_kt_bench.c - kt-bench end to end: `kernels` writes JSON whose every
 * number is positive and finite and whose every ratio is in (0, 100) (a unit check: contention moves ratios), with a
 * result per weight type and measured level; `model` on a tiny synthetic
 * model reports each layer and its per-layer split adds up to the steps'
 * wall time; bad arguments exit 2 with usage, a missing model exits 1.
 * It checks shapes and consistency, never a speed (no timed assertions).
 */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testlib.h"

#if defined(__SANITIZE_ADDRESS__)
#define KERNELS_ARGS "--seconds 0.01 --prefill-tokens 2 --isa avx2" /* sanitizers: one level, shortest runs */
#else
#define KERNELS_ARGS "--seconds 0.05 --prefill-tokens 4 --isa avx2,avx512" /* scalar passes over a GiB are slow */
#endif

static const char *const bench_types[] = {"q4_K", "q5_K", "q6_K", "q8_0", "bf16", "f16", "f32"};

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
        KT_CHECK(n % 7 == 0 && found == (int)(n / 7), "%s: %d results of %zu", bench_types[t], found, n);
    }
    json_decref(root);
    remove(json_path);
}

static void model_reports_every_layer_and_splits_add_up(void)
{
    const char *model = kt_test_path("tiny.gguf"), *json_path = kt_test_path("model.json");
    int rc = kt_test_system("'%s' --preset tiny -o '%s' > /dev/null 2>&1", kt_test_tool("kt-synth"), model);
    KT_CHECK(rc == 0, "kt-synth exited %d", rc);
    rc = kt_test_system("'%s' model -m '%s' --prompt-tokens 16 --gen-tokens 4 --threads 2 --json '%s' > /dev/null",
                        kt_test_tool("kt-bench"), model, json_path);
    KT_CHECK(rc == 0, "kt-bench model exited %d", rc);
    json_error_t je;
    json_t *root = json_load_file(json_path, 0, &je);
    KT_CHECK(root != NULL, "cannot parse %s: %s", json_path, je.text);
    if (root) {
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
    remove(model);
    remove(json_path);
}

static void bad_arguments_exit_2_with_usage(void)
{
    const char *out = kt_test_path("usage.txt");
    const char *bench = kt_test_tool("kt-bench");
    const char *cases[] = {"", "frobnicate", "kernels --seconds abc", "kernels --threads 0", "kernels --isa sse9",
                           "kernels -m x.gguf", "model", "model -m a.gguf --gen-tokens", "kernels --bogus"};
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

static void missing_model_exits_1_with_a_message(void)
{
    const char *out = kt_test_path("missing.txt");
    int rc = kt_test_system("'%s' model -m /nonexistent/model.gguf > /dev/null 2> '%s'", kt_test_tool("kt-bench"),
                            out);
    KT_CHECK(rc == 1, "exited %d, want 1", rc);
    size_t text_bytes = 0;
    char *text = kt_test_read_file(out, &text_bytes);
    KT_CHECK(text && strstr(text, "kt-bench: ") && strstr(text, "/nonexistent/model.gguf"), "message: %s",
             text ? text : "(none)");
    free(text);
    remove(out);
}

int main(void)
{
    KT_RUN(bad_arguments_exit_2_with_usage);
    KT_RUN(missing_model_exits_1_with_a_message);
    KT_RUN(model_reports_every_layer_and_splits_add_up);
    KT_RUN(kernels_json_has_every_field_positive_and_ratios_in_range);
    return kt_test_finish();
}
