/*
 * test_ai_sdk.c - kt-serve as the AI SDK (npm `ai` + `@ai-sdk/openai`,
 * pinned in tests/openai-sdk/package-lock.json) sees it through the
 * provider's default model, which speaks the Responses API: generateText
 * (text, usage, a length finish), streamText with reasoning and a tool call,
 * a two-step tool round trip (the SDK sends its items back by reference),
 * structured outputs (Output.object with generateText and streamText,
 * generateObject on the Responses and the chat model: a random model's JSON
 * that parses and validates against the schema), errors as APICallError.
 * The cases live in tests/openai-sdk/ai-sdk.test.mjs; this program starts
 * the server and runs them.  Skips when node or the packages (`npm ci` in
 * tests/openai-sdk, which ./dev.sh test runs) are missing.
 */
#include <stdlib.h>
#include <string.h>

#include "serve_harness.h"

int main(void)
{
    const char *src = getenv("KT_SOURCE_DIR");
    char provider[1024], ai[1024], script[1024];
    snprintf(provider, sizeof provider, "%s/tests/openai-sdk/node_modules/@ai-sdk/openai/package.json",
             src ? src : ".");
    snprintf(ai, sizeof ai, "%s/tests/openai-sdk/node_modules/ai/package.json", src ? src : ".");
    snprintf(script, sizeof script, "%s/tests/openai-sdk/ai-sdk.test.mjs", src ? src : ".");
    if (kt_test_system("node --version >/dev/null 2>&1") != 0)
        return kt_test_skip("node is not installed");
    if (access(provider, R_OK) != 0 || access(ai, R_OK) != 0)
        return kt_test_skip("the AI SDK (ai, @ai-sdk/openai) is not installed: run `npm ci` in tests/openai-sdk "
                            "(./dev.sh test does)");
    if (!have_curl())
        return kt_test_skip("curl is not installed");
    char model[1024];
    snprintf(model, sizeof model, "%s", kt_test_path("ai-sdk-tiny.gguf"));
    if (!make_model(model, "tiny", NULL)) {
        KT_CHECK(false, "kt-synth failed");
        return kt_test_finish();
    }
    struct test_server s;
    if (server_start(&s, model, "-t 2 -q --served-model-name kimi-k2-tiny --test-forced-output", true)) {
        int rc = kt_test_system("node %s http://127.0.0.1:%d/v1 kimi-k2-tiny", script, s.port);
        KT_CHECK(rc == 0, "the AI SDK cases failed (exit %d)", rc);
        int status = server_stop(&s);
        KT_CHECK(status == 0, "kt-serve exit status %d (log %s)", status, s.log);
    }
    unlink(model);
    return kt_test_finish();
}
