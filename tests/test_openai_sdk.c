/*
 * test_openai_sdk.c - kt-serve as the official openai SDK (npm `openai`,
 * pinned in tests/openai-sdk/package-lock.json) sees it: models, chat,
 * streaming with usage, tool calls (Kimi ids kept), reasoning_content,
 * completions, the Responses API (create, stream, a tool round trip,
 * previous_response_id, retrieve / input items / delete), errors as the
 * SDK's typed exceptions, client aborts.  The
 * cases live in tests/openai-sdk/sdk.test.mjs; this program starts the
 * server and runs them.  Skips when node or the SDK (`npm ci` in
 * tests/openai-sdk, which ./dev.sh test runs) is missing.
 */
#include <stdlib.h>
#include <string.h>

#include "serve_harness.h"

int main(void)
{
    const char *src = getenv("KT_SOURCE_DIR");
    char sdk[1024], script[1024];
    snprintf(sdk, sizeof sdk, "%s/tests/openai-sdk/node_modules/openai/package.json", src ? src : ".");
    snprintf(script, sizeof script, "%s/tests/openai-sdk/sdk.test.mjs", src ? src : ".");
    if (kt_test_system("node --version >/dev/null 2>&1") != 0)
        return kt_test_skip("node is not installed");
    if (access(sdk, R_OK) != 0)
        return kt_test_skip("the openai SDK is not installed: run `npm ci` in tests/openai-sdk (./dev.sh test does)");
    if (!have_curl())
        return kt_test_skip("curl is not installed");
    char model[1024];
    snprintf(model, sizeof model, "%s", kt_test_path("sdk-tiny.gguf"));
    if (!make_model(model, "tiny", NULL)) {
        KT_CHECK(false, "kt-synth failed");
        return kt_test_finish();
    }
    struct test_server s;
    if (server_start(&s, model, "-t 2 -q --served-model-name kimi-k2-tiny --test-forced-output", true)) {
        int rc = kt_test_system("node %s http://127.0.0.1:%d/v1 kimi-k2-tiny", script, s.port);
        KT_CHECK(rc == 0, "the SDK cases failed (exit %d)", rc);
        int status = server_stop(&s);
        KT_CHECK(status == 0, "kt-serve exit status %d (log %s)", status, s.log);
    }
    unlink(model);
    return kt_test_finish();
}
