/*
 * test_kt_run.c - kt-run end to end: the logits it writes with --logits-out
 * are exactly the engine's for the same prompt, and its greedy decode feeds
 * back the argmax of each row; runs are deterministic for a seed; --chat works
 * through both families' templates; --placement configs/tiny-sim.yaml (half
 * the routed experts and the shared experts on a sim device) writes the same
 * logits as CPU-only, on both families; bad input fails with a message.
 */
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "model.h"
#include "kt_cuda.h"
#include "testlib.h"
#include "tokenizer.h"

static char kimi_model[1024], deepseek_model[1024];

static bool make_models(void)
{
    snprintf(kimi_model, sizeof kimi_model, "%s", kt_test_path("kt-run-tiny.gguf"));
    snprintf(deepseek_model, sizeof deepseek_model, "%s", kt_test_path("kt-run-tiny-v3.gguf"));
    int a = kt_test_system("%s --preset tiny -o %s >/dev/null 2>&1", kt_test_tool("kt-synth"), kimi_model);
    int b = kt_test_system("%s --preset tiny-v3 -o %s >/dev/null 2>&1", kt_test_tool("kt-synth"), deepseek_model);
    KT_CHECK(a == 0 && b == 0, "kt-synth failed: %d %d", a, b);
    return a == 0 && b == 0;
}

static int argmax(const float *x, uint32_t n)
{
    int best = 0;
    for (uint32_t i = 1; i < n; i++)
        if (x[i] > x[best])
            best = (int)i;
    return best;
}

/* Recomputes, with the engine directly, what greedy kt-run must have written. */
static void check_against_engine(const char *model_path, const char *prompt, const float *rows, size_t n_rows)
{
    struct kt_model *m = NULL;
    struct kt_tokenizer *tok = NULL;
    struct kt_engine *e = NULL;
    kt_err err = {0};
    int32_t *ids = NULL;
    size_t n_ids = 0;
    float *logits = NULL;
    if (kt_model_open(model_path, &m, &err) != KT_OK || kt_tokenizer_create(m->gguf, &tok, &err) != KT_OK ||
        kt_tokenize(tok, prompt, strlen(prompt), true, true, &ids, &n_ids, &err) != KT_OK ||
        /* kt-run's default KV cache rows (bf16) */
        kt_engine_create(m, &(struct kt_engine_params){.n_ctx = 256, .n_threads = 2, .kv_type = KT_ROW_BF16}, &e,
                         &err) != KT_OK ||
        kt_engine_seq_add(e, 0, &err) != KT_OK) {
        KT_CHECK(false, "setup: %s", err.msg);
        goto done;
    }
    uint32_t nv = kt_engine_n_vocab(e);
    logits = malloc(nv * sizeof *logits);
    struct kt_batch_token *b = calloc(n_ids, sizeof *b);
    for (size_t i = 0; i < n_ids; i++)
        b[i] = (struct kt_batch_token){.token = ids[i], .pos = (uint32_t)i, .want_logits = i + 1 == n_ids};
    kt_status st = kt_engine_step(e, &(struct kt_batch){.n_tokens = (uint32_t)n_ids, .tokens = b}, logits, &err);
    free(b);
    KT_CHECK(st == KT_OK, "prefill: %s", err.msg);
    uint32_t pos = (uint32_t)n_ids;
    for (size_t r = 0; r < n_rows && st == KT_OK; r++) {
        KT_CHECK(memcmp(logits, rows + r * nv, nv * sizeof *logits) == 0, "row %zu differs from the engine's", r);
        struct kt_batch_token t = {.token = argmax(logits, nv), .pos = pos++, .want_logits = true};
        if (r + 1 < n_rows)
            st = kt_engine_step(e, &(struct kt_batch){.n_tokens = 1, .tokens = &t}, logits, &err);
    }
done:
    free(logits);
    free(ids);
    kt_engine_destroy(e);
    kt_tokenizer_destroy(tok);
    kt_model_close(m);
}

static void kt_run_greedy_logits_equal_the_engine(void)
{
    const char *prompt = "Hello world, the river runs";
    const char *out = kt_test_path("kt-run.logits");
    int rc = kt_test_system("%s -m %s -p '%s' -n 6 --temp 0 --ignore-eos -t 2 -q --logits-out %s 2>/dev/null",
                            kt_test_tool("kt-run"), kimi_model, prompt, out);
    KT_CHECK(rc == 0, "kt-run exit %d", rc);
    size_t bytes = 0;
    float *rows = kt_test_read_file(out, &bytes);
    struct kt_model *m = NULL;
    kt_err err = {0};
    KT_CHECK(kt_model_open(kimi_model, &m, &err) == KT_OK, "%s", err.msg);
    size_t row_bytes = m ? (size_t)m->hp.n_vocab * sizeof(float) : 1;
    /* 6 tokens generated: the prefill row, then 5 decode steps (the last token is not fed back). */
    KT_CHECK(rows && bytes == 6 * row_bytes, "logits file has %zu bytes, want %zu", bytes, 6 * row_bytes);
    if (rows && bytes == 6 * row_bytes)
        check_against_engine(kimi_model, prompt, rows, 6);
    kt_model_close(m);
    free(rows);
    remove(out);
}

/* A plan for a GPU on a machine without one runs CPU-only and says so in one line. */
static void kt_run_gpu_plan_without_a_gpu_runs_cpu_only(void)
{
    const char *gpu_yaml = kt_test_path("gpu-placement.yaml");
    FILE *g = fopen(gpu_yaml, "w");
    if (g) {
        fputs("version: 1\ndevices:\n  gpu:\n    backend: cuda\n    memory_gib: 1\nattention: gpu\nexperts:\n  gpu:\n"
              "    per_layer: 16\n",
              g);
        fclose(g);
    }
    const bool have_gpu = kt_cuda_device_count(NULL) > 0;
    const char *a = kt_test_path("kt-run-cpu.logits"), *b = kt_test_path("kt-run-gpu.logits");
    const char *log = kt_test_path("kt-run-gpu.log");
    int ra = kt_test_system("%s -m %s -p 'The river runs' -n 6 --temp 0 --ignore-eos -t 2 -q --logits-out %s 2>/dev/null",
                            kt_test_tool("kt-run"), kimi_model, a);
    int rb = kt_test_system("%s -m %s -p 'The river runs' -n 6 --temp 0 --ignore-eos -t 2 -q --logits-out %s "
                            "--placement %s 2>%s",
                            kt_test_tool("kt-run"), kimi_model, b, gpu_yaml, log);
    KT_CHECK(ra == 0 && rb == 0, "kt-run exit %d (cpu) %d (gpu plan, see %s)", ra, rb, log);
    size_t n_log = 0;
    char *gpu_log = kt_test_read_file(log, &n_log);
    if (!have_gpu) {
        KT_CHECK(gpu_log && strstr(gpu_log, "no CUDA device") && strstr(gpu_log, "running CPU-only"),
                 "the log says the GPU plan runs CPU-only: %s", gpu_log ? gpu_log : "(none)");
        KT_CHECK(kt_test_files_equal(a, b), "a GPU plan without a GPU gives CPU-only's logits");
    }
    free(gpu_log);
    remove(a), remove(b), remove(log), remove(gpu_yaml);
}

static void kt_run_placement_tiny_sim_matches_cpu_only(void)
{
    const char *models[] = {kimi_model, deepseek_model};
    for (int i = 0; i < 2; i++) {
        const char *a = kt_test_path("kt-run-cpu.logits"), *b = kt_test_path("kt-run-sim.logits");
        const char *log = kt_test_path("kt-run-sim.log");
        int ra = kt_test_system("%s -m %s -p 'The river runs' -n 6 --temp 0 --ignore-eos -t 2 -q --logits-out %s "
                                "2>/dev/null",
                                kt_test_tool("kt-run"), models[i], a);
        int rb = kt_test_system("%s -m %s -p 'The river runs' -n 6 --temp 0 --ignore-eos -t 2 -q --logits-out %s "
                                "--placement %s/configs/tiny-sim.yaml 2>%s",
                                kt_test_tool("kt-run"), models[i], b, getenv("KT_SOURCE_DIR"), log);
        KT_CHECK(ra == 0 && rb == 0, "%s: kt-run exit %d (cpu) %d (tiny-sim, see %s)", models[i], ra, rb, log);
        KT_CHECK(kt_test_files_equal(a, b), "%s: logits with tiny-sim.yaml differ from CPU-only", models[i]);
        size_t n = 0;
        char *text = kt_test_read_file(log, &n);
        KT_CHECK(text && strstr(text, "sim (sim") && strstr(text, "routed experts: 48"),
                 "%s: the placement was described on stderr", models[i]);
        free(text);
        remove(a);
        remove(b);
        remove(log);
    }
    const char *bad = kt_test_path("bad-placement.yaml");
    FILE *f = fopen(bad, "w");
    if (f) {
        fputs("version: 1\nattention: gpu\n", f);
        fclose(f);
    }
    const char *log = kt_test_path("kt-run-bad.log");
    int rc = kt_test_system("%s -m %s -p hi -n 1 -q --placement %s 2>%s", kt_test_tool("kt-run"), kimi_model, bad, log);
    size_t n = 0;
    char *text = kt_test_read_file(log, &n);
    KT_CHECK(rc != 0 && text && strstr(text, "bad-placement.yaml") && strstr(text, ":2:12: attention: unknown device"),
             "an unknown device fails naming file:line:column: %s",
             text ? text : "(no output)");
    free(text);
    remove(bad);
    remove(log);
}

static void kt_run_is_deterministic_for_a_seed(void)
{
    const char *a = kt_test_path("kt-run-a.txt"), *b = kt_test_path("kt-run-b.txt");
    const char *fmt = "%s -m %s -p 'Once upon a time' -n 16 --seed 42 --temp 0.9 --ignore-eos -t 2 >%s 2>/dev/null";
    KT_CHECK(kt_test_system(fmt, kt_test_tool("kt-run"), kimi_model, a) == 0, "first run");
    KT_CHECK(kt_test_system(fmt, kt_test_tool("kt-run"), kimi_model, b) == 0, "second run");
    size_t na = 0, nb = 0;
    char *ta = kt_test_read_file(a, &na), *tb = kt_test_read_file(b, &nb);
    KT_CHECK(ta && tb && na > 1 && na == nb && memcmp(ta, tb, na) == 0, "outputs differ (%zu vs %zu bytes)", na, nb);
    free(ta), free(tb);
    remove(a), remove(b);
}

static void kt_run_chat_renders_each_family(void)
{
    const char *models[] = {kimi_model, deepseek_model};
    const char *formats[] = {"kimi-k2-instruct", "deepseek-v3-0324"};
    for (int i = 0; i < 2; i++) {
        const char *errp = kt_test_path("kt-run-chat.err");
        int rc = kt_test_system("%s -m %s --system 'Be brief.' --chat 'What is a river?' -n 8 -t 2 -q 2>%s",
                                kt_test_tool("kt-run"), models[i], errp);
        size_t n = 0;
        char *text = kt_test_read_file(errp, &n);
        KT_CHECK(rc == 0, "%s: exit %d: %s", formats[i], rc, text ? text : "");
        KT_CHECK(text && strstr(text, formats[i]) && strstr(text, "prompt tokens") && strstr(text, "decode"),
                 "%s: statistics missing: %s", formats[i], text ? text : "");
        free(text);
        remove(errp);
    }
}

static void kt_run_rejects_bad_input_with_a_message(void)
{
    const char *errp = kt_test_path("kt-run-bad.err");
    struct {
        const char *args;
        int want_rc;
        const char *want;
    } cases[] = {
        {"-m /nonexistent.gguf -p hi", 1, "nonexistent"},
        {"-m MODEL -p hi --chat hi", 2, "-p and --chat both given: give one"},
        {"-m MODEL --system x -p hi", 2, "--system goes with --chat"},
        {"-m MODEL -p 'a long prompt that will not fit' --ctx 3", 1, "positions: give --ctx "},
        {"-m MODEL -p hi --temp -1", 2, "--temp '-1' is out of range: give a number >= 0"},
        {"-m MODEL -p hi --top-p 0", 2, "--top-p '0' is out of range: give a number in (0, 1]"},
        {"-m MODEL -p hi --logits-out /nonexistent-dir/x", 1, "--logits-out /nonexistent-dir/x: the folder"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char args[2048];
        const char *mark = strstr(cases[i].args, "MODEL");
        if (mark)
            snprintf(args, sizeof args, "%.*s%s%s", (int)(mark - cases[i].args), cases[i].args, kimi_model,
                     mark + 5);
        else
            snprintf(args, sizeof args, "%s", cases[i].args);
        int rc = kt_test_system("%s %s -n 2 -q >/dev/null 2>%s", kt_test_tool("kt-run"), args, errp);
        size_t n = 0;
        char *text = kt_test_read_file(errp, &n);
        KT_CHECK(rc == cases[i].want_rc && text && strstr(text, "kt-run: ") && strstr(text, cases[i].want),
                 "'%s': exit %d (want %d), stderr '%s'", cases[i].args, rc, cases[i].want_rc, text ? text : "");
        free(text);
    }
    remove(errp);
}

/* A real-size Kimi-K2 written header-only (541 GiB of holes): a run that got
 * as far as loading its experts is refused for memory on any test machine,
 * so each refusal below that names something else came before a weight was
 * read.  The control run with nothing wrong shows that premise. */
static void kt_run_refuses_bad_input_before_reading_a_weight(void)
{
    char huge[1024], bad_yaml[1024], errp[1024];
    snprintf(huge, sizeof huge, "%s", kt_test_path("kt-run-k2-header.gguf"));
    snprintf(bad_yaml, sizeof bad_yaml, "%s", kt_test_path("kt-run-bad-plan.yaml"));
    snprintf(errp, sizeof errp, "%s", kt_test_path("kt-run-early.err"));
    int rc = kt_test_system("%s --preset kimi-k2-slice --layers 61 --experts 384 --header-only -q -o %s >/dev/null",
                            kt_test_tool("kt-synth"), huge);
    KT_CHECK(rc == 0, "kt-synth --header-only: exit %d", rc);
    FILE *f = fopen(bad_yaml, "w");
    if (f) {
        fputs("version: 1\nexperts:\n  cpu:\n    per_layer: lots\n", f);
        fclose(f);
    }
    rc = kt_test_system("%s -m %s -p hi -n 1 -q >/dev/null 2>%s", kt_test_tool("kt-run"), huge, errp);
    size_t n = 0;
    char *text = kt_test_read_file(errp, &n);
    const bool premise = rc == 1 && text && strstr(text, "needs") && strstr(text, "is available");
    KT_CHECK(premise, "the control run is refused for memory: exit %d, '%s'", rc, text ? text : "");
    free(text);
    struct {
        const char *args;
        int want_rc;
        const char *want;
    } cases[] = {
        {"-p hi --ctx 200000", 1, "--ctx 200000 is more than"},
        {"-p hi --ctx 200000", 1, "(context_length 131072): give --ctx 131072 or less"},
        {"-p hi --logits-out /nonexistent-dir/x", 1, "--logits-out /nonexistent-dir/x: the folder /nonexistent-dir"},
        {"-p hi --placement BAD", 1, ":3:3: experts: CPU experts are placed under cpu:"},
        {"-p 'a prompt longer than four tokens, by far' --ctx 4", 1, "the context holds 4 positions: give --ctx "},
        {"-p hi --temp -1", 2, "--temp '-1' is out of range: give a number >= 0 (0: greedy)"},
        {"-p hi --ctx 999999999", 2, "--ctx '999999999' is out of range: give a whole number from 1 to 16777216"},
        {"-p hi --top-k 1.5", 2, "--top-k '1.5' is not a whole number: give a whole number from 0 to 2147483647"},
        {"-p hi --repeat-penalty 0", 2, "--repeat-penalty '0' is out of range: give a number > 0 (1: off)"},
        {"-p hi --frequency-penalty 3", 2, "--frequency-penalty '3' is out of range: give a number in [-2, 2]"},
        {"-p hi --gpu-experts 8", 2, "--gpu-experts picks the rows of --info's memory table: give --info too"},
    };
    for (size_t i = 0; premise && i < sizeof cases / sizeof cases[0]; i++) {
        char args[1400];
        const char *mark = strstr(cases[i].args, "BAD");
        if (mark)
            snprintf(args, sizeof args, "%.*s%s%s", (int)(mark - cases[i].args), cases[i].args, bad_yaml, mark + 3);
        else
            snprintf(args, sizeof args, "%s", cases[i].args);
        rc = kt_test_system("%s -m %s %s -n 1 -q >/dev/null 2>%s", kt_test_tool("kt-run"), huge, args, errp);
        text = kt_test_read_file(errp, &n);
        KT_CHECK(rc == cases[i].want_rc && text && strstr(text, cases[i].want) && !strstr(text, "is available") &&
                     !strstr(text, "loading experts"),
                 "'%s': exit %d (want %d), stderr '%s'", cases[i].args, rc, cases[i].want_rc, text ? text : "");
        free(text);
    }
    remove(huge), remove(bad_yaml), remove(errp);
}

/* A slip of an option's name is answered with the option meant, then the
 * synopsis, not the whole help (the line stays on the screen). */
static void kt_run_suggests_the_option_meant(void)
{
    const char *errp = kt_test_path("kt-run-typo.err");
    struct {
        const char *args, *want;
    } cases[] = {
        {"--tmep 0.5", "kt-run: unknown option '--tmep': did you mean '--temp'?\n"},
        {"--temperature 0.5", "kt-run: unknown option '--temperature': did you mean '--temp'?\n"},
        {"--top 5", "kt-run: unknown option '--top': did you mean '--top-k' or '--top-p'?\n"},
        {"--n-predict=4 --ctx-size 64", "kt-run: unknown option '--ctx-size': did you mean '--ctx'?\n"},
        {"--bogus", "kt-run: unknown option '--bogus'\n"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int rc = kt_test_system("%s -m %s -p hi %s >/dev/null 2>%s", kt_test_tool("kt-run"), kimi_model,
                                cases[i].args, errp);
        size_t n = 0;
        char *text = kt_test_read_file(errp, &n);
        KT_CHECK(rc == 2 && text && !strncmp(text, cases[i].want, strlen(cases[i].want)) &&
                     strstr(text, "usage: kt-run -m MODEL") && strstr(text, "'kt-run --help' lists every option") &&
                     !strstr(text, "--bandwidth"),
                 "'%s': exit %d, stderr:\n%s", cases[i].args, rc, text ? text : "");
        free(text);
    }
    remove(errp);
}

/* --info --placement is a dry run: the plan as kt-run would run it - each
 * MoE layer's expert homes, compactly; memory per device and node; whether
 * it fits (the loader's memory check) - and nothing is loaded. */
static void kt_run_info_placement_is_a_dry_run(void)
{
    const char *out = kt_test_path("kt-run-dry.out"), *errp = kt_test_path("kt-run-dry.err");
    int rc = kt_test_system("%s --info %s --placement %s/configs/tiny-sim.yaml >%s 2>%s", kt_test_tool("kt-run"),
                            kimi_model, getenv("KT_SOURCE_DIR"), out, errp);
    size_t n = 0;
    char *text = kt_test_read_file(out, &n), *etext = kt_test_read_file(errp, &n);
    static const char *const want[] = {
        "placement (a dry run: nothing is loaded)",
        "sim (sim, 25 GB/s, 10 us)",
        "expert homes, per MoE layer",
        "  layers 1-3: sim 0-15 (16); node 0 16-31 (16)\n",
        "memory this plan needs",
        "  node 0 ",
        "routed experts (48 homed here",
        "of its 0.500 GiB budget (sim",
        "host in all",
        "fits this machine: yes",
    };
    KT_CHECK(rc == 0, "exit %d: %s", rc, etext ? etext : "");
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        KT_CHECK(text && strstr(text, want[i]), "the dry run lacks '%s':\n%s", want[i], text ? text : "");
    KT_CHECK(etext && !strstr(etext, "loading experts"), "nothing loaded: %s", etext ? etext : "");
    free(text), free(etext);

    /* two NUMA nodes: the CPU's experts dealt over them, shown as strided runs */
    rc = kt_test_system("KT_TOPOLOGY_SYNTHETIC='numa:2 core:1 pu:1' %s --info %s --placement %s/configs/tiny-sim.yaml "
                        ">%s 2>%s",
                        kt_test_tool("kt-run"), kimi_model, getenv("KT_SOURCE_DIR"), out, errp);
    text = kt_test_read_file(out, &n);
    KT_CHECK(rc == 0 && text && strstr(text, "sim 0-15 (16); node 0 16,18,...,30 (8); node 1 17,19,...,31 (8)") &&
                 strstr(text, "  node 1 "),
             "two nodes: exit %d\n%s", rc, text ? text : "");
    free(text);

    /* a plan that does not fit: a real-size model header, every expert on the CPU */
    char huge[1024];
    snprintf(huge, sizeof huge, "%s", kt_test_path("kt-run-dry-k2.gguf"));
    rc = kt_test_system("%s --preset kimi-k2-slice --layers 61 --experts 384 --header-only -q -o %s >/dev/null",
                        kt_test_tool("kt-synth"), huge);
    rc = rc ? rc : kt_test_system("%s --info %s --placement %s/configs/cpu-only.yaml >%s 2>%s", kt_test_tool("kt-run"),
                                  huge, getenv("KT_SOURCE_DIR"), out, errp);
    text = kt_test_read_file(out, &n), etext = kt_test_read_file(errp, &n);
    KT_CHECK(rc == 1 && text && strstr(text, "  layers 1-60: node 0 0-383 (384)\n") &&
                 strstr(text, "fits this machine: no: this plan needs") &&
                 etext && strstr(etext, "kt-run: the plan does not fit this machine: this plan needs") &&
                 strstr(etext, "place more experts on a device"),
             "a 541 GiB plan: exit %d\n%s\n%s", rc, text ? text : "", etext ? etext : "");
    free(text), free(etext);
    remove(huge), remove(out), remove(errp);
}

int main(void)
{
    if (!make_models())
        return kt_test_finish();
    KT_RUN(kt_run_greedy_logits_equal_the_engine);
    KT_RUN(kt_run_is_deterministic_for_a_seed);
    KT_RUN(kt_run_placement_tiny_sim_matches_cpu_only);
    KT_RUN(kt_run_gpu_plan_without_a_gpu_runs_cpu_only);
    KT_RUN(kt_run_chat_renders_each_family);
    KT_RUN(kt_run_rejects_bad_input_with_a_message);
    KT_RUN(kt_run_refuses_bad_input_before_reading_a_weight);
    KT_RUN(kt_run_suggests_the_option_meant);
    KT_RUN(kt_run_info_placement_is_a_dry_run);
    remove(kimi_model);
    remove(deepseek_model);
    return kt_test_finish();
}
