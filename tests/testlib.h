/*
 * testlib.h - the small harness every kt test program uses.
 *
 * A test program runs its cases in order, prints one line per failed check
 * and a summary line, and exits 0 (all passed), 1 (a check failed) or 77
 * (skipped, with a "skipped: why" line).  Never a test that cannot fail: each
 * KT_CHECK must be able to.
 */
#ifndef KT_TESTLIB_H
#define KT_TESTLIB_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

extern int kt_test_failures;
extern int kt_test_checks;

#define KT_CHECK(cond, ...)                                                            \
    do {                                                                               \
        kt_test_checks++;                                                              \
        if (!(cond)) {                                                                 \
            kt_test_failures++;                                                        \
            fprintf(stderr, "%s:%d: check failed: %s: ", __FILE__, __LINE__, #cond);   \
            fprintf(stderr, __VA_ARGS__);                                              \
            fputc('\n', stderr);                                                       \
        }                                                                              \
    } while (0)

/* Runs one named case and reports it. */
#define KT_RUN(fn)                                                                     \
    do {                                                                               \
        int before_ = kt_test_failures;                                                \
        fn();                                                                          \
        printf("%s %s\n", kt_test_failures == before_ ? "ok  " : "FAIL", #fn);         \
        fflush(stdout);                                                                \
    } while (0)

/* Prints the summary and returns the exit code for main. */
int kt_test_finish(void);

/* Prints "skipped: REASON" and returns 77 for main. */
int kt_test_skip(const char *reason);

/* A fresh scratch path under $KT_TEST_TMP (or /tmp): "<dir>/<name>.<pid>". */
const char *kt_test_path(const char *name);

/* Path of a built tool ("kt-synth") under $KT_BIN_DIR. */
const char *kt_test_tool(const char *name);

/* Runs a shell command; returns its exit status (-1 if it could not run). */
int kt_test_system(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Reads a whole file into a malloc'd buffer; NULL on failure. */
void *kt_test_read_file(const char *path, size_t *bytes);

/* Writes text to ROOT/REL, making the folders on the way (fake /proc and
 * /sys trees); false when it cannot. */
bool kt_test_write_tree_file(const char *root, const char *rel, const char *text);

/* True when both files can be read and hold the same bytes. */
bool kt_test_files_equal(const char *a, const char *b);

/* malloc that never returns NULL: a test that cannot allocate exits 2. */
void *kt_test_xmalloc(size_t bytes);

/* ---- engine runs (testlib_engine.c) ---- */

struct kt_model;
struct kt_engine_params;
struct kt_engine_stats;
struct kt_backend_stats;

/* Writes `kt-synth --preset PRESET EXTRA` to a scratch path (returned in
 * path) and opens it; NULL (after a failed check) if either fails. */
struct kt_model *kt_test_synth_model(const char *preset, const char *extra, char *path, size_t path_size);

/* The same, writing the file only on the first call (while path is "") and
 * opening it again on later ones: one model for a test's many cases. */
struct kt_model *kt_test_synth_once(const char *preset, char *path, size_t path_size);

/* Removes the model's file after closing it. */
void kt_test_synth_remove(struct kt_model *m, const char *path);

/* One engine over m with params: a prefill step of the prompt (logits of
 * every position), then `steps` greedy decode steps feeding back each
 * argmax.  Returns the (n_prompt + steps, n_vocab) logits (malloc'd), or
 * NULL after a failed check; tokens (steps, may be NULL) gets the greedy
 * tokens; stats and device (may be NULL) the engine's and device's counters
 * at the end. */
float *kt_test_engine_greedy(struct kt_model *m, const struct kt_engine_params *params, const int32_t *prompt,
                             uint32_t n_prompt, uint32_t steps, int32_t *tokens, struct kt_engine_stats *stats,
                             struct kt_backend_stats *device);

/* Over rows of V floats: the largest |a - b| of a row over that row's
 * largest |a|, the worst row's (tolerance checks of logits). */
double kt_test_worst_row_diff(const float *a, const float *b, size_t rows, size_t V);

/* The same per-row measure, its q-quantile over the rows (q = 0.5: the
 * median row): for paths whose rounding may flip a near-tied routing choice,
 * which changes that one token's row by far more than the rounding does. */
double kt_test_row_diff_quantile(const float *a, const float *b, size_t rows, size_t V, double q);

/* ---- device memory for the CUDA tests (testlib_cuda.c) ---- */

/* 0 where a CUDA device can be used; else kt_test_skip's code, having printed
 * "skipped: no CUDA device (why)": `int skip = kt_test_skip_without_cuda();
 * if (skip) return skip;` at the top of a CUDA test's main. */
int kt_test_skip_without_cuda(void);

/* bytes of device memory, filled from host when host is not NULL; NULL
 * after a failed check. */
void *kt_test_cuda_copy_in(const void *host, size_t bytes);
/* host = bytes of device memory d (a failed copy fails a check). */
void kt_test_cuda_copy_out(void *host, const void *d, size_t bytes);

/* Deterministic pseudo-random numbers for tests. */
unsigned long long kt_test_rand_u64(unsigned long long *state);
float kt_test_rand_normal(unsigned long long *state);
float kt_test_rand_uniform(unsigned long long *state, float lo, float hi);

#endif
