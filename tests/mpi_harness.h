/*
 * mpi_harness.h - what the kt-run-over-ranks tests share (test_kt_run_mpi,
 * test_kt_run_netns): one greedy kt-run under a launcher (empty: one
 * process), and the check that two runs printed the same text and wrote
 * logits within 1e-6 of each other.
 */
#ifndef KT_TEST_MPI_HARNESS_H
#define KT_TEST_MPI_HARNESS_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testlib.h"

static const char *const mpi_prompt = "The quick brown fox jumps over the lazy dog, then naps in the sun";

/* Runs kt-run greedy (12 tokens, -t 1: the ranks share the cores, the prompt
 * prefilled in chunks of 5) under launcher, bounded by timeout_s: text to
 * <tag>.txt, logits to <tag>.bin, stderr to <tag>.log; its exit status. */
static inline int mpi_run_kt_run(const char *launcher, const char *model, const char *tag, int timeout_s)
{
    char txt[1024], bin[1024], log[1024];
    snprintf(txt, sizeof txt, "%s.txt", kt_test_path(tag));
    snprintf(bin, sizeof bin, "%s.bin", kt_test_path(tag));
    snprintf(log, sizeof log, "%s.log", kt_test_path(tag));
    return kt_test_system("timeout -k 5 %d %s %s -m %s -p '%s' -n 12 --temp 0 --ignore-eos -t 1 --batch 5 "
                          "--ctx 128 --logits-out %s >%s 2>%s",
                          timeout_s, launcher, kt_test_tool("kt-run"), model, mpi_prompt, bin, txt, log);
}

/* Checks that runs tag_a and tag_b printed the same text and wrote as many
 * logits, each within 1e-6 (NaN fails). */
static inline void mpi_compare_runs(const char *tag_a, const char *tag_b)
{
    char a[1024], b[1024];
    size_t na = 0, nb = 0;
    snprintf(a, sizeof a, "%s.txt", kt_test_path(tag_a));
    snprintf(b, sizeof b, "%s.txt", kt_test_path(tag_b));
    char *ta = kt_test_read_file(a, &na), *tb = kt_test_read_file(b, &nb);
    KT_CHECK(ta && tb && na > 0 && na == nb && memcmp(ta, tb, na) == 0,
             "%s and %s print different text (%zu and %zu bytes)", tag_a, tag_b, na, nb);
    free(ta), free(tb);
    snprintf(a, sizeof a, "%s.bin", kt_test_path(tag_a));
    snprintf(b, sizeof b, "%s.bin", kt_test_path(tag_b));
    float *la = kt_test_read_file(a, &na), *lb = kt_test_read_file(b, &nb);
    KT_CHECK(la && lb && na > 0 && na == nb && na % sizeof(float) == 0,
             "%s and %s wrote logits of %zu and %zu bytes", tag_a, tag_b, na, nb);
    if (la && lb && na == nb) {
        double worst = 0;
        size_t at = 0;
        for (size_t i = 0; i < na / sizeof(float); i++) {
            const double d = fabs((double)la[i] - (double)lb[i]);
            if (!(d <= worst)) /* NaN counts as the worst */
                worst = isnan(d) ? INFINITY : d, at = i;
        }
        KT_CHECK(worst <= 1e-6, "%s vs %s: logit %zu differs by %g", tag_a, tag_b, at, worst);
    }
    free(la), free(lb);
}

#endif
