/*
 * test_dashboard.c - kt-serve's GET /dashboard in a real browser: Debian's
 * chromium, headless, driven by playwright-core (pinned in
 * tests/dashboard/package-lock.json).  The checks live in
 * tests/dashboard/dashboard.test.mjs; this program serves a tiny model twice
 * on two synthetic NUMA nodes - with a sim device and an expert cache on it,
 * then CPU only behind an API key - sends it chat requests so the heat map
 * fills, and runs them.
 * The screenshots land in the test directory (dashboard.png,
 * dashboard-cpu.png).  Skips when node, chromium or playwright-core (`npm ci`
 * in tests/dashboard, which ./dev.sh test runs) is missing.
 */
#include <stdlib.h>
#include <string.h>

#include "serve_harness.h"

#define CHROMIUM "/usr/bin/chromium"

/* A few chat requests, so the live profile - the heat map - has routed tokens. */
static void send_traffic(const struct test_server *s)
{
    struct kt_buf out = {0};
    for (int i = 0; i < 4; i++) {
        char body[256];
        snprintf(body, sizeof body,
                 "{\"messages\":[{\"role\":\"user\",\"content\":\"Tell me about rivers, part %d.\"}],"
                 "\"max_tokens\":16,\"seed\":%d}",
                 i, i);
        int code = http(s, "-H 'Authorization: Bearer dash-key'", "/v1/chat/completions", body, &out, NULL);
        KT_CHECK(code == 200, "chat request %d: HTTP %d %s", i, code, kt_buf_str(&out));
    }
    kt_buf_free(&out);
}

/* Serves model with args, sends traffic, runs the browser checks (screenshot to shot). */
static void dashboard_in_chromium(const char *script, const char *model, const char *args, const char *key,
                                  const char *shot)
{
    struct test_server s;
    if (!server_start(&s, model, args, true))
        return;
    send_traffic(&s);
    int rc = kt_test_system("node %s %d %s %s %s", script, s.port, shot, CHROMIUM, key ? key : "");
    KT_CHECK(rc == 0, "the dashboard checks failed (exit %d; kt-serve log %s)", rc, s.log);
    int status = server_stop(&s);
    KT_CHECK(status == 0, "kt-serve exit status %d (log %s)", status, s.log);
}

int main(void)
{
    const char *src = getenv("KT_SOURCE_DIR");
    char playwright[1024], script[1024], placement[1024];
    snprintf(playwright, sizeof playwright, "%s/tests/dashboard/node_modules/playwright-core/package.json",
             src ? src : ".");
    snprintf(script, sizeof script, "%s/tests/dashboard/dashboard.test.mjs", src ? src : ".");
    snprintf(placement, sizeof placement, "%s/configs/tiny-sim.yaml", src ? src : ".");
    if (kt_test_system("node --version >/dev/null 2>&1") != 0)
        return kt_test_skip("node is not installed");
    if (access(CHROMIUM, X_OK) != 0)
        return kt_test_skip(CHROMIUM " is not installed (apt-get install chromium; ./dev.sh test does)");
    if (access(playwright, R_OK) != 0)
        return kt_test_skip("playwright-core is not installed: run `npm ci` in tests/dashboard (./dev.sh test does)");
    if (!have_curl())
        return kt_test_skip("curl is not installed");

    char model[1024];
    snprintf(model, sizeof model, "%s", kt_test_path("dashboard-tiny.gguf"));
    if (!make_model(model, "tiny", NULL)) {
        KT_CHECK(false, "kt-synth failed");
        return kt_test_finish();
    }
    setenv("KT_TOPOLOGY_SYNTHETIC", "numa:2 core:1 pu:1", 1); /* two CPU places on any machine */
    char args[2048], shot[1024];

    /* places: node 0, node 1 and the sim device, with an expert cache there */
    snprintf(args, sizeof args, "-t 2 -q --placement '%s' --expert-cache 4", placement);
    snprintf(shot, sizeof shot, "%s", kt_test_path("dashboard.png"));
    dashboard_in_chromium(script, model, args, NULL, shot);

    /* no device: places node 0 and node 1; the page's polls carry the key from its URL */
    snprintf(shot, sizeof shot, "%s", kt_test_path("dashboard-cpu.png"));
    dashboard_in_chromium(script, model, "-t 2 -q --api-key dash-key", "dash-key", shot);

    unlink(model);
    return kt_test_finish();
}
