/*
 * test_kt_serve_load.c - a bounded load test on loopback: kt-load runs
 * concurrent streaming clients against kt-serve (more clients than
 * sequences, so requests queue; every fourth client hangs up after its first
 * token).  Every response that ran to the end must be a well-formed event
 * stream with the promised usage, the server must end idle with every
 * request accounted for, and it must exit 0 on SIGTERM (which, in the ASan
 * build, also means LeakSanitizer found no leak).
 */
#include <stdlib.h>
#include <string.h>

#include "serve_harness.h"

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
        int status = server_stop(&s);
        KT_CHECK(status == 0, "kt-serve exit status %d after SIGTERM (see %s)", status, s.log);
    }
    unlink(model);
    return kt_test_finish();
}
