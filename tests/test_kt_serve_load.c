/*
 * test_kt_serve_load.c - a bounded load test on loopback: kt-load runs
 * concurrent streaming clients against kt-serve (more clients than
 * sequences, so requests queue; every fourth client hangs up after its first
 * token).  Every response that ran to the end must be a well-formed event
 * stream with the promised usage, the server must end idle with every
 * request accounted for, and it must exit 0 on SIGTERM (which, in the ASan
 * build, also means LeakSanitizer found no leak).  Then kt-load --prompts:
 * a file's prompts run in order, and a bad file stops it before any request,
 * as do nothing listening (said once), --json into a missing folder, a
 * --temperature the server would refuse and a slip of an option's name.
 */
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "serve_harness.h"

/* vllm:request_success_total for one finished_reason (-1 if /metrics lacks it). */
static long long finished(const struct test_server *s, const char *reason)
{
    struct kt_buf out = {0}, key = {0};
    http(s, NULL, "/metrics", NULL, &out, NULL);
    kt_buf_printf(&key, "finished_reason=\"%s\"} ", reason);
    const char *at = strstr(kt_buf_str(&out), kt_buf_str(&key));
    long long n = at ? atoll(at + key.len) : -1;
    kt_buf_free(&out), kt_buf_free(&key);
    return n;
}

static bool write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "wb");
    if (!f)
        return false;
    bool ok = fputs(text, f) >= 0;
    return fclose(f) == 0 && ok;
}

/* A messages line (sent as it is), a text line and a blank line: 5 requests
 * take the 2 prompts in turn, all succeed, and --json names the file. */
static void prompts_file_requests_all_succeed(const struct test_server *s)
{
    char prompts[1024], json[1024];
    snprintf(prompts, sizeof prompts, "%s", kt_test_path("prompts.jsonl"));
    snprintf(json, sizeof json, "%s", kt_test_path("load.json"));
    KT_CHECK(write_text(prompts, "{\"messages\": [{\"role\": \"system\", \"content\": \"Answer briefly.\"}, "
                                 "{\"role\": \"user\", \"content\": \"Name a river.\"}]}\n"
                                 "Describe a stone bridge in winter.\n"
                                 "\n"),
             "cannot write %s", prompts);
    long long before = finished(s, "length");
    int rc = kt_test_system("%s --port %d -c 2 -n 5 --max-tokens 4 --prompts %s --seed 7 --temperature 0.5 "
                            "--timeout 120 --json %s >/dev/null",
                            kt_test_tool("kt-load"), s->port, prompts, json);
    KT_CHECK(rc == 0, "kt-load --prompts: exit %d", rc);
    json_error_t err;
    json_t *j = json_load_file(json, 0, &err);
    KT_CHECK(j, "kt-load --json: %s", err.text);
    KT_CHECK(json_integer_value(json_object_get(j, "requests")) == 5 &&
                 json_integer_value(json_object_get(j, "ok")) == 5 &&
                 json_integer_value(json_object_get(j, "completion_tokens")) == 20,
             "5 requests of 4 tokens, all ok");
    KT_CHECK(json_integer_value(json_object_get(j, "prompt_count")) == 2, "2 prompts: the blank line skipped");
    const char *named = json_string_value(json_object_get(j, "prompts"));
    KT_CHECK(named && !strcmp(named, prompts), "--json names the prompt file, not '%s'", named ? named : "(none)");
    json_decref(j);
    long long after = before;
    for (double t0 = harness_now(); harness_now() - t0 < 30 && after - before < 5; usleep(100000))
        after = finished(s, "length");
    KT_CHECK(before >= 0 && after - before == 5, "the server finished %lld requests, not 5", after - before);
    unlink(prompts), unlink(json);
}

/* A malformed line, an empty file and a missing one: exit 1 with the file
 * (and line) named, and nothing reaches the server. */
static void bad_prompts_file_fails_before_any_request(const struct test_server *s)
{
    char prompts[1024], log[1024];
    snprintf(prompts, sizeof prompts, "%s", kt_test_path("bad.jsonl"));
    snprintf(log, sizeof log, "%s", kt_test_path("kt-load.err"));
    struct {
        const char *text, *error; /* file contents (NULL: no file), the error after "PATH" */
    } cases[] = {
        {"A plain prompt.\n\n{\"messages\": [{\"role\": \"user\", \"content\": \"unterminated\"}\n",
         ":3: not valid JSON"},
        {"{\"messages\": \"not an array\"}\n", ":1: a JSON line must be an object with a non-empty \"messages\" array"},
        {"", " holds no prompts"},
        {NULL, ": No such file or directory"},
    };
    long long before = finished(s, "length");
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        unlink(prompts);
        if (cases[k].text)
            KT_CHECK(write_text(prompts, cases[k].text), "cannot write %s", prompts);
        int rc = kt_test_system("%s --port %d -n 2 --max-tokens 4 --prompts %s --timeout 120 >/dev/null 2>%s",
                                kt_test_tool("kt-load"), s->port, prompts, log);
        size_t len;
        char *err = kt_test_read_file(log, &len);
        struct kt_buf want = {0};
        kt_buf_printf(&want, "%s%s", prompts, cases[k].error);
        KT_CHECK(rc == 1, "case %zu: exit %d, not 1", k, rc);
        KT_CHECK(err && strstr(err, kt_buf_str(&want)), "case %zu: no '%s' in: %s", k, kt_buf_str(&want),
                 err ? err : "(nothing)");
        free(err);
        kt_buf_free(&want);
    }
    KT_CHECK(finished(s, "length") == before, "a request reached the server");
    unlink(prompts), unlink(log);
}

/* Refusals before the run, one line each and no request sent: nothing
 * listening (said once, not per request), --json into a missing folder, a
 * --temperature the server would refuse, and a slip of an option's name. */
static void bad_runs_are_refused_before_any_request(const struct test_server *s)
{
    char log[1024];
    snprintf(log, sizeof log, "%s", kt_test_path("kt-load-refused.err"));
    /* a port nothing listens on: bound, then closed */
    int fd = socket(AF_INET, SOCK_STREAM, 0), free_port = 0;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t alen = sizeof a;
    if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 && getsockname(fd, (struct sockaddr *)&a, &alen) == 0)
        free_port = ntohs(a.sin_port);
    if (fd >= 0)
        close(fd);
    char nobody[256];
    snprintf(nobody, sizeof nobody,
             "kt-load: nothing answers at 127.0.0.1:%d (connect 127.0.0.1:%d: Connection refused): start kt-serve "
             "there, or give --host and --port\n",
             free_port, free_port);
    struct {
        int port, want_rc;
        const char *args, *want;
    } cases[] = {
        {free_port, 1, "-n 50", nobody},
        {s->port, 1, "-n 2 --json /nonexistent-dir/out.json",
         "kt-load: --json /nonexistent-dir/out.json: the folder /nonexistent-dir: No such file or directory"},
        {s->port, 2, "-n 2 --temperature 3",
         "kt-load: --temperature '3' is out of range: give a number in [0, 2] (OpenAI's range)"},
        {s->port, 2, "-n 2 --concurency 4", "kt-load: unknown option '--concurency': did you mean '--concurrency'?"},
    };
    long long before = finished(s, "length");
    for (size_t k = 0; free_port && k < sizeof cases / sizeof cases[0]; k++) {
        int rc = kt_test_system("%s --port %d --max-tokens 4 %s >/dev/null 2>%s", kt_test_tool("kt-load"),
                                cases[k].port, cases[k].args, log);
        size_t len;
        char *err = kt_test_read_file(log, &len);
        KT_CHECK(rc == cases[k].want_rc && err && !strncmp(err, cases[k].want, strlen(cases[k].want)) &&
                     (rc == 2 || strchr(err, '\n') == err + len - 1),
                 "'%s': exit %d (want %d), stderr: %s", cases[k].args, rc, cases[k].want_rc, err ? err : "");
        free(err);
    }
    KT_CHECK(free_port && finished(s, "length") == before, "a request reached the server");
    unlink(log);
}


int main(void)
{
    if (!have_curl())
        return kt_test_skip("curl is not installed");
    char model[1024];
    snprintf(model, sizeof model, "%s", kt_test_path("load-tiny.gguf"));
    if (!make_model(model, "tiny", NULL)) {
        KT_CHECK(false, "kt-synth failed");
        return kt_test_finish();
    }
    struct test_server s;
    if (server_start(&s, model,
                     "-t 2 -q --served-model-name load-tiny --max-seqs 4 --max-waiting 64 --max-batch-tokens 32 "
                     "--prefix-cache 4",
                     true)) {
        int rc = kt_test_system("%s --port %d -c 12 -n 48 --max-tokens 16 --prompt-words 40 --disconnect-every 4 "
                                "--timeout 120",
                                kt_test_tool("kt-load"), s.port);
        KT_CHECK(rc == 0, "kt-load found failed or malformed responses (exit %d)", rc);
        /* a second wave while hung-up requests are still being cleaned up */
        rc = kt_test_system("%s --port %d -c 6 -n 12 --max-tokens 8 --prompt-words 10 --disconnect-every 3 --timeout 120",
                            kt_test_tool("kt-load"), s.port);
        KT_CHECK(rc == 0, "second wave: exit %d", rc);
        struct kt_buf out = {0};
        bool idle = false;
        for (double t0 = harness_now(); harness_now() - t0 < 30 && !idle;) {
            http(&s, NULL, "/metrics", NULL, &out, NULL);
            idle = strstr(kt_buf_str(&out), "vllm:num_requests_running{model_name=\"load-tiny\"} 0\n") != NULL;
            if (!idle)
                usleep(100000);
        }
        KT_CHECK(idle, "requests still running: %.400s", kt_buf_str(&out));
        /* 48 + 12 requests: 36 + 8 ran to the end, 12 + 4 hung up */
        KT_CHECK(strstr(kt_buf_str(&out), "finished_reason=\"length\"} 44\n") &&
                     strstr(kt_buf_str(&out), "finished_reason=\"abort\"} 16\n"),
                 "every request accounted for");
        KT_CHECK(http(&s, NULL, "/health", NULL, &out, NULL) == 200, "healthy after the load");
        kt_buf_free(&out);
        RUN_WITH(prompts_file_requests_all_succeed, &s);
        RUN_WITH(bad_prompts_file_fails_before_any_request, &s);
        RUN_WITH(bad_runs_are_refused_before_any_request, &s);
        int status = server_stop(&s);
        KT_CHECK(status == 0, "kt-serve exit status %d after SIGTERM (see %s)", status, s.log);
    }
    unlink(model);
    return kt_test_finish();
}
