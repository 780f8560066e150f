/*
 * test_kt_run_netns.c - kt-run over two "hosts" for real (runtime/dist): two
 * network namespaces joined by a veth pair, one rank in each, OpenMPI over
 * TCP between them (tests/netns_harness.h makes and removes them), prints
 * the same greedy tokens as one process and writes logits within 1e-6 of
 * its (tiny and tiny-v3, the prompt prefilled in chunks).
 *
 * Checked besides the equality: rank 1 ran in b (its log names b's
 * hostname), and the stream crossed the veth (b's interface received and
 * sent at least the residual stream of every token: /proc/net/dev in b).
 *
 * Skipped (visibly) without MPI, mpirun, root, CAP_SYS_ADMIN + CAP_NET_ADMIN,
 * `ip` (iproute2), or nsenter/unshare (util-linux).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model.h"
#include "mpi_harness.h"
#include "netns_harness.h"
#include "testlib.h"

#define RUN_TIMEOUT_S 90     /* one mpirun (it takes about a second on tiny) */
#define WATCHDOG_S 400       /* the whole test, under ctest's 600 s */

/* "prompt tokens N" from a kt-run log; 0 when absent. */
static unsigned prompt_tokens(const char *tag)
{
    char path[1024];
    snprintf(path, sizeof path, "%s.log", kt_test_path(tag));
    size_t n = 0;
    char *text = kt_test_read_file(path, &n);
    const char *at = text ? strstr(text, "prompt tokens") : NULL;
    unsigned v = 0;
    if (!at || sscanf(at, "prompt tokens %u", &v) != 1)
        v = 0;
    free(text);
    return v;
}

static void two_namespaces_match_one_process(const char *preset)
{
    char model[1024], single[64], tag[64];
    snprintf(model, sizeof model, "%s.gguf", kt_test_path(preset));
    int rc = kt_test_system("%s --preset %s -o %s >/dev/null 2>&1", kt_test_tool("kt-synth"), preset, model);
    KT_CHECK(rc == 0, "kt-synth --preset %s: %d", preset, rc);
    if (rc != 0)
        return;
    const uint32_t n_embd = netns_model_n_embd(model);
    KT_CHECK(n_embd > 0, "cannot open %s", model);
    snprintf(single, sizeof single, "netns-%s-1", preset);
    rc = mpi_run_kt_run("", model, single, RUN_TIMEOUT_S);
    KT_CHECK(rc == 0, "kt-run alone on %s: exit %d", preset, rc);

    uint64_t rx0 = 0, tx0 = 0, rx1 = 0, tx1 = 0;
    KT_CHECK(netns_veth_b_bytes(&rx0, &tx0), "no counters of %s in %s", netns.if_b, netns.ns_b);
    snprintf(tag, sizeof tag, "netns-%s-2", preset);
    rc = mpi_run_kt_run(netns_mpirun(), model, tag, RUN_TIMEOUT_S);
    char log[1024];
    snprintf(log, sizeof log, "%s.log", kt_test_path(tag));
    size_t n = 0;
    char *text = kt_test_read_file(log, &n);
    KT_CHECK(rc == 0, "kt-run over %s and %s on %s: exit %d:\n%s", netns.ns_a, netns.ns_b, preset, rc,
             text ? text : "");
    if (rc == 0) {
        mpi_compare_runs(single, tag);
        char want[128];
        snprintf(want, sizeof want, "rank 1 (%s)", netns.host_b);
        KT_CHECK(text && strstr(text, want), "rank 1 did not run in %s (no \"%s\" in its log):\n%s", netns.ns_b, want,
                 text ? text : "");
        /* every token's residual stream went a -> b and back */
        const unsigned n_prompt = prompt_tokens(single);
        const uint64_t floor = (uint64_t)(n_prompt + 11) * n_embd * sizeof(float);
        KT_CHECK(n_prompt > 0, "no prompt token count in %s.log", kt_test_path(single));
        KT_CHECK(netns_veth_b_bytes(&rx1, &tx1), "no counters of %s in %s", netns.if_b, netns.ns_b);
        KT_CHECK(rx1 - rx0 >= floor && tx1 - tx0 >= floor,
                 "%s carried %" PRIu64 " bytes in and %" PRIu64 " out, less than the stream's %" PRIu64, netns.if_b,
                 rx1 - rx0, tx1 - tx0, floor);
        printf("%s: %s received %" PRIu64 " and sent %" PRIu64 " bytes (the stream alone: %" PRIu64 " each way)\n",
               preset, netns.if_b, rx1 - rx0, tx1 - tx0, floor);
    }
    free(text);
}

static void tiny_over_two_namespaces_matches_one_process(void)
{
    two_namespaces_match_one_process("tiny");
}

static void tiny_v3_over_two_namespaces_matches_one_process(void)
{
    two_namespaces_match_one_process("tiny-v3");
}

int main(void)
{
    const char *why = netns_unavailable();
    if (why)
        return kt_test_skip(why);
    if (netns_setup("test_kt_run_netns", WATCHDOG_S)) {
        KT_RUN(tiny_over_two_namespaces_matches_one_process);
        KT_RUN(tiny_v3_over_two_namespaces_matches_one_process);
    }
    netns_teardown();
    return kt_test_finish();
}
