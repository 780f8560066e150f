/*
 * test_kt_serve_startup.c - kt-serve refuses early and says what to do
 * (issue 14).  A missing model, a file that is not GGUF, --ctx past the
 * model's context_length or too short for --self-check, a bad machine file
 * and --plan-out into a missing folder are refused before it listens (no
 * "listening" line; on a real-size model written header-only, before the
 * experts' memory check that a run without them reaches); a number out of
 * range states its range, a slip of an option's name gets the option meant;
 * a port in use names the address and what to do, as does an address that
 * is not this machine's.  --self-check passes the engine CPU-only and on
 * configs/tiny-sim.yaml with one PASS line before it listens, and leaves the
 * engine clean: one sequence serves (--max-seqs 1, no prefix cache: the
 * check's sequence was removed) and the routing profile counts only what was
 * served.  It refuses to serve a copy of the model with layer 2's FFN norm
 * scaled, checked against the original (exit 3, the numbers, the layer).
 * Its prompts are rendered with the template the server serves with
 * (--chat-template's when given).
 */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "model.h"
#include "profile.h"
#include "quant.h"
#include "serve_harness.h"

static char tiny[1024];

/* Runs kt-serve ARGS (with -m MODEL unless model is NULL) to its exit; its
 * status, and its stderr in err_text (malloc'd). */
static int serve_exit(const char *model, const char *args, char **err_text)
{
    char log[1024];
    snprintf(log, sizeof log, "%s", kt_test_path("startup.log"));
    int rc = kt_test_system("timeout 120 %s %s%s --port 0 -t 2 %s >/dev/null 2>%s", kt_test_tool("kt-serve"),
                            model ? "-m " : "", model ? model : "", args, log);
    size_t len;
    *err_text = kt_test_read_file(log, &len);
    unlink(log);
    return rc;
}

static void bad_input_is_refused_before_listening(void)
{
    char huge[1024], text_file[1024];
    snprintf(huge, sizeof huge, "%s", kt_test_path("startup-k2-header.gguf"));
    snprintf(text_file, sizeof text_file, "%s", kt_test_path("startup-not-gguf.gguf"));
    FILE *f = fopen(text_file, "w");
    if (f) {
        fputs("this is not a model\n", f);
        fclose(f);
    }
    KT_CHECK(make_model(huge, "kimi-k2-slice", "--layers 61 --experts 384 --header-only"), "kt-synth --header-only");
    /* the control: nothing wrong but the machine's memory, refused before listening too (the loader's
     * check, made early), not after the progress bar has run */
    char *err = NULL;
    int rc = serve_exit(huge, "", &err);
    const bool premise = rc == 1 && err && !strstr(err, "listening on") && strstr(err, "kt-serve: this plan needs") &&
                         strstr(err, "is available");
    KT_CHECK(premise, "the control is refused for memory before listening: exit %d: %s", rc, err ? err : "");
    free(err);
    struct {
        const char *model, *args, *want;
    } cases[] = {
        {"/nonexistent-dir/nope.gguf", "", "kt-serve: /nonexistent-dir/nope.gguf: cannot open: No such file"},
        {text_file, "", "not a GGUF file"},
        {huge, "--ctx 200000", "--ctx 200000 is more than"},
        {huge, "--ctx 200000", "(context_length 131072): give --ctx 131072 or less"},
        {huge, "--machine /nonexistent-dir/machine.json", "--machine: /nonexistent-dir/machine.json"},
        {huge, "--plan-out /nonexistent-dir/plan.yaml", "--plan-out /nonexistent-dir/plan.yaml: the folder"},
        {huge, "--profile-out /nonexistent-dir/p.json", "--profile-out /nonexistent-dir/p.json: the folder"},
        {huge, "--expert-cache 4", "--expert-cache 4 needs a device: give a --placement with one"},
        {huge, "--self-check --ctx 20", "--self-check needs --ctx "},
    };
    for (size_t i = 0; premise && i < sizeof cases / sizeof cases[0]; i++) {
        char args[1400];
        snprintf(args, sizeof args, "%s", cases[i].args);
        rc = serve_exit(cases[i].model, args, &err);
        KT_CHECK(rc == 1 && err && strstr(err, cases[i].want) && !strstr(err, "listening") &&
                     !strstr(err, "is available"),
                 "-m %s %s: exit %d: %s", cases[i].model, cases[i].args, rc, err ? err : "");
        free(err);
    }
    /* --self-check renders its prompts with the template the server serves with: one given by
     * --chat-template that pads every prompt past --ctx is refused for it, while with the model's own
     * the check's preparation passes and the memory check refuses, as the control's */
    char padded[1024];
    snprintf(padded, sizeof padded, "%s", kt_test_path("startup-padded.jinja"));
    f = fopen(padded, "w");
    if (f) {
        fputs("{% for i in range(3000) %}padding {% endfor %}{% for m in messages %}{{ m.content }}{% endfor %}", f);
        fclose(f);
    }
    rc = premise ? serve_exit(huge, "--self-check --ctx 2048", &err) : -1;
    KT_CHECK(!premise || (rc == 1 && err && strstr(err, "is available") && !strstr(err, "--self-check needs")),
             "the model's template: exit %d: %s", rc, err ? err : "");
    free(err);
    err = NULL;
    char args[1400];
    snprintf(args, sizeof args, "--self-check --ctx 2048 --chat-template %s", padded);
    rc = premise ? serve_exit(huge, args, &err) : -1;
    KT_CHECK(!premise || (rc == 1 && err && strstr(err, "--self-check needs --ctx ") && !strstr(err, "listening")),
             "--chat-template's template: exit %d: %s", rc, err ? err : "");
    free(err);
    unlink(huge), unlink(text_file), unlink(padded);
}

static void usage_errors_state_the_range_or_the_option_meant(void)
{
    struct {
        const char *args, *want;
    } cases[] = {
        {"--ctx 100000000", "kt-serve: --ctx '100000000' is out of range: give a whole number from 16 to 16777216"},
        {"--max-seqs 0", "kt-serve: --max-seqs '0' is out of range: give a whole number from 1 to 4096"},
        {"--port 70000", "kt-serve: --port '70000' is out of range: give a whole number from 0 to 65535 (0: any"},
        {"--request-timeout -1", "kt-serve: --request-timeout '-1' is out of range: give a number in [0, 1e+09]"},
        {"--rebalance-interval 0.001", "give 0 (off) or a number in [0.01, 1e+06]"},
        {"--expert-cache-policy mru", "--expert-cache-policy 'mru' is not one of lru or lfu: did you mean 'lru'?"},
        {"--expert-cache-policy lfu", "--expert-cache-policy picks what --expert-cache SLOTS keeps"},
        {"--max-seq 4", "kt-serve: unknown option '--max-seq': did you mean '--max-seqs'?"},
        {"--self-chek", "kt-serve: unknown option '--self-chek': did you mean '--self-check'?"},
        {"--max-batch-tokens 4 --max-seqs 8", "--max-batch-tokens 4 is below --max-seqs 8"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *err = NULL;
        int rc = serve_exit(tiny, cases[i].args, &err);
        KT_CHECK(rc == 2 && err && strstr(err, cases[i].want) && strstr(err, "'kt-serve --help' lists every option") &&
                     !strstr(err, "--idle-timeout"),
                 "%s: exit %d: %s", cases[i].args, rc, err ? err : "");
        free(err);
    }
}

static void a_port_in_use_names_the_address_and_the_fix(void)
{
    struct test_server a;
    if (!server_start(&a, tiny, "-t 2 -q", false))
        return;
    char args[64], *err = NULL;
    snprintf(args, sizeof args, "-q --port %d", a.port);
    /* serve_exit passes --port 0 first; the later --port wins */
    int rc = serve_exit(tiny, args, &err);
    char want[128];
    snprintf(want, sizeof want, "kt-serve: 127.0.0.1:%d is in use: another program listens there (another kt-serve?)",
             a.port);
    KT_CHECK(rc == 1 && err && strstr(err, want) && strstr(err, "give another --port (--port 0 takes any free one)") &&
                 !strstr(err, "Failed to bind"),
             "exit %d: %s", rc, err ? err : "");
    free(err);
    rc = serve_exit(tiny, "-q --host 192.0.2.1", &err); /* TEST-NET-1: no machine's own */
    KT_CHECK(rc == 1 && err && strstr(err, "cannot listen on 192.0.2.1:0: --host 192.0.2.1 is not an address of this "
                                           "machine"),
             "exit %d: %s", rc, err ? err : "");
    free(err);
    KT_CHECK(server_stop(&a) == 0, "the first server stops cleanly");
}

/* The tokens GET /kt/profile counts, decode and prefill together. */
static double profile_tokens(const struct test_server *s)
{
    struct kt_buf out = {0};
    double t = -1;
    if (http(s, NULL, "/kt/profile", NULL, &out, NULL) == 200) {
        const char *path = kt_test_path("startup-profile.json");
        FILE *f = fopen(path, "w");
        if (f) {
            fputs(kt_buf_str(&out), f);
            fclose(f);
        }
        struct kt_profile *p = NULL;
        kt_err err = {0};
        if (kt_profile_load(path, &p, &err) == KT_OK)
            t = p->tokens[0] + p->tokens[1];
        KT_CHECK(p != NULL, "profile: %s", err.msg);
        kt_profile_destroy(p);
        unlink(path);
    }
    kt_buf_free(&out);
    return t;
}

static void self_check_passes_before_listening_and_leaves_the_engine_clean(const char *placement)
{
    char args[1400];
    snprintf(args, sizeof args, "-t 2 -q --self-check --max-seqs 1 --prefix-cache 0 --profile-half-life 0%s%s%s",
             placement ? " --placement " : "", placement ? getenv("KT_SOURCE_DIR") : "", placement ? placement : "");
    struct test_server s;
    if (!server_start(&s, tiny, args, true))
        return;
    size_t len = 0;
    char *log = kt_test_read_file(s.log, &len);
    const char *pass = log ? strstr(log, "kt-serve: --self-check PASS: 3 prompts, ") : NULL;
    const char *listen = log ? strstr(log, "listening on") : NULL;
    KT_CHECK(pass && listen && pass < listen && strstr(pass, "largest median 0 (at most 0.01)") &&
                 strstr(pass, "largest 9-in-10 0 (at most 0.03)"),
             "%s: one PASS line, then listening (CPU and sim agree exactly):\n%s", placement ? placement : "cpu",
             log ? log : "");
    free(log);
    KT_CHECK(profile_tokens(&s) == 0, "%s: the check's tokens are not in the profile", placement ? placement : "cpu");
    struct kt_buf out = {0};
    long served = 0;
    for (int r = 0; r < 2; r++) { /* one engine sequence: each request needs the check's to be gone */
        int code = http(&s, NULL, "/v1/completions",
                        "{\"prompt\": \"The river\", \"max_tokens\": 4, \"temperature\": 0, \"ignore_eos\": true}",
                        &out, NULL);
        json_error_t je;
        json_t *j = json_loads(kt_buf_str(&out), 0, &je), *usage = json_object_get(j, "usage");
        KT_CHECK(code == 200 && json_integer_value(json_object_get(usage, "completion_tokens")) == 4,
                 "request %d: %d %s", r, code, kt_buf_str(&out));
        /* its prompt and every generated token but the last, which is never stepped */
        served += (long)json_integer_value(json_object_get(usage, "prompt_tokens")) + 3;
        json_decref(j);
    }
    const double counted = profile_tokens(&s);
    KT_CHECK(counted == (double)served, "%s: the profile counts %g tokens; %ld were served",
             placement ? placement : "cpu", counted, served);
    kt_buf_free(&out);
    KT_CHECK(server_stop(&s) == 0, "exit status");
}

/* A copy of the model with layer 2's FFN norm times 8. */
static bool write_perturbed_copy(const char *dst)
{
    struct kt_model *m = NULL;
    kt_err err = {0};
    size_t bytes = 0;
    uint8_t *file = kt_test_read_file(tiny, &bytes);
    bool ok = file && kt_model_open(tiny, &m, &err) == KT_OK;
    const struct kt_gguf_tensor *t = ok ? m->layers[2].ffn_norm : NULL;
    const uint64_t at = t ? m->gguf->data_offset + t->offset : 0;
    ok = ok && t->type == KT_TYPE_F32 && at + t->nbytes <= bytes;
    for (uint64_t i = 0; ok && i < t->nbytes / sizeof(float); i++) {
        float v;
        memcpy(&v, file + at + i * sizeof v, sizeof v);
        v *= 8;
        memcpy(file + at + i * sizeof v, &v, sizeof v);
    }
    FILE *f = ok ? fopen(dst, "wb") : NULL;
    ok = f && fwrite(file, 1, bytes, f) == bytes;
    if (f)
        ok = fclose(f) == 0 && ok;
    KT_CHECK(ok, "cannot write a perturbed copy of %s to %s: %s", tiny, dst, err.msg);
    kt_model_close(m);
    free(file);
    return ok;
}

static void self_check_fail_refuses_to_serve(void)
{
    char copy[1024], args[2200];
    snprintf(copy, sizeof copy, "%s", kt_test_path("startup-perturbed.gguf"));
    if (!write_perturbed_copy(copy))
        return;
    snprintf(args, sizeof args, "--self-check --test-self-check-reference %s", tiny);
    char *err = NULL;
    int rc = serve_exit(copy, args, &err);
    KT_CHECK(rc == 3 && err && strstr(err, "kt-serve: --self-check FAIL: prompt 1 (prose, ") &&
                 strstr(err, "(at most 0.01), 9 rows in 10 within ") && strstr(err, "(at most 0.03), worst row ") &&
                 strstr(err, "the divergence starts at layer 2\n") &&
                 strstr(err, "--self-check failed: not serving") && !strstr(err, "listening"),
             "exit %d: %s", rc, err ? err : "");
    free(err);
    unlink(copy);
}

int main(void)
{
    if (!have_curl())
        return kt_test_skip("curl is not installed");
    snprintf(tiny, sizeof tiny, "%s", kt_test_path("startup-tiny.gguf"));
    if (!make_model(tiny, "tiny", NULL)) {
        KT_CHECK(false, "kt-synth failed");
        return kt_test_finish();
    }
    KT_RUN(bad_input_is_refused_before_listening);
    KT_RUN(usage_errors_state_the_range_or_the_option_meant);
    KT_RUN(a_port_in_use_names_the_address_and_the_fix);
    RUN_WITH(self_check_passes_before_listening_and_leaves_the_engine_clean, NULL);
    RUN_WITH(self_check_passes_before_listening_and_leaves_the_engine_clean, "/configs/tiny-sim.yaml");
    KT_RUN(self_check_fail_refuses_to_serve);
    unlink(tiny);
    return kt_test_finish();
}
