/*
 * test_langchain.c - kt-serve as LangChain's ChatOpenAI (npm
 * @langchain/openai + @langchain/core, pinned in
 * tests/langchain/package-lock.json) sees it: withStructuredOutput by
 * json_schema (strict), by function calling (a named tool_choice) and by
 * json mode, one at a time and batched, and a schema kt cannot follow as a
 * 400.  The model is random, so only constrained decoding makes the output
 * parse; the script validates every result against its schema.  Run on the
 * Kimi-K2 (tiny) and DeepSeek-V3 (tiny-v3) families, whose tool-call syntaxes
 * differ.  The cases live in tests/langchain/langchain.test.mjs; this program
 * starts the servers and runs them.  Skips when node or the packages (`npm ci`
 * in tests/langchain, which ./dev.sh test runs) are missing.
 */
#include <stdlib.h>
#include <string.h>

#include "serve_harness.h"

static void run_family(const char *script, const char *preset, const char *name)
{
    char model[1024], file[64];
    snprintf(file, sizeof file, "langchain-%s.gguf", preset);
    snprintf(model, sizeof model, "%s", kt_test_path(file));
    if (!make_model(model, preset, NULL)) {
        KT_CHECK(false, "kt-synth --preset %s failed", preset);
        return;
    }
    char args[256];
    snprintf(args, sizeof args, "-t 2 -q --served-model-name %s", name);
    struct test_server s;
    if (server_start(&s, model, args, true)) {
        int rc = kt_test_system("node %s http://127.0.0.1:%d/v1 %s", script, s.port, name);
        KT_CHECK(rc == 0, "the LangChain cases failed on %s (exit %d)", preset, rc);
        int status = server_stop(&s);
        KT_CHECK(status == 0, "kt-serve exit status %d (log %s)", status, s.log);
    }
    unlink(model);
}

int main(void)
{
    const char *src = getenv("KT_SOURCE_DIR");
    char openai[1024], core[1024], script[1024];
    snprintf(openai, sizeof openai, "%s/tests/langchain/node_modules/@langchain/openai/package.json",
             src ? src : ".");
    snprintf(core, sizeof core, "%s/tests/langchain/node_modules/@langchain/core/package.json", src ? src : ".");
    snprintf(script, sizeof script, "%s/tests/langchain/langchain.test.mjs", src ? src : ".");
    if (kt_test_system("node --version >/dev/null 2>&1") != 0)
        return kt_test_skip("node is not installed");
    if (access(openai, R_OK) != 0 || access(core, R_OK) != 0)
        return kt_test_skip("LangChain (@langchain/openai, @langchain/core) is not installed: run `npm ci` in "
                            "tests/langchain (./dev.sh test does)");
    if (!have_curl())
        return kt_test_skip("curl is not installed");
    run_family(script, "tiny", "kimi-k2-tiny");
    run_family(script, "tiny-v3", "deepseek-v3-tiny");
    return kt_test_finish();
}
