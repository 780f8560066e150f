/*
 * testlib_engine.c - synthetic models and greedy engine runs shared by the
 * tests that compare placements and layouts (testlib.h).
 */
#include "testlib.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend.h"
#include "engine.h"
#include "model.h"

struct kt_model *kt_test_synth_model(const char *preset, const char *extra, char *path, size_t path_size)
{
    char name[128];
    snprintf(name, sizeof name, "synth-%s.gguf", preset);
    snprintf(path, path_size, "%s", kt_test_path(name));
    int rc = kt_test_system("'%s' --preset %s %s -q -o '%s' > /dev/null 2>&1", kt_test_tool("kt-synth"), preset,
                            extra ? extra : "", path);
    KT_CHECK(rc == 0, "kt-synth --preset %s %s failed (%d)", preset, extra ? extra : "", rc);
    struct kt_model *m = NULL;
    kt_err err = {0};
    if (rc == 0 && kt_model_open(path, &m, &err) != KT_OK)
        KT_CHECK(false, "%s", err.msg);
    return m;
}

struct kt_model *kt_test_synth_once(const char *preset, char *path, size_t path_size)
{
    if (!path[0])
        return kt_test_synth_model(preset, NULL, path, path_size);
    struct kt_model *m = NULL;
    kt_err err = {0};
    KT_CHECK(kt_model_open(path, &m, &err) == KT_OK, "%s", err.msg);
    return m;
}

void kt_test_synth_remove(struct kt_model *m, const char *path)
{
    kt_model_close(m);
    unlink(path);
}

static int32_t argmax(const float *x, uint32_t n)
{
    int32_t best = 0;
    for (uint32_t v = 1; v < n; v++)
        if (x[v] > x[best])
            best = (int32_t)v;
    return best;
}

float *kt_test_engine_greedy(struct kt_model *m, const struct kt_engine_params *params, const int32_t *prompt,
                             uint32_t n_prompt, uint32_t steps, int32_t *tokens, struct kt_engine_stats *stats,
                             struct kt_backend_stats *device)
{
    struct kt_engine *e = NULL;
    kt_err err = {0};
    if (kt_engine_create(m, params, &e, &err) != KT_OK) {
        KT_CHECK(false, "engine: %s", err.msg);
        return NULL;
    }
    uint64_t dev_total = 0, dev_work = 0;
    if (kt_engine_device_bytes(e, &dev_total, &dev_work) == KT_OK) {
        /* what a planner reserves for the working buffers is what the engine took */
        const uint64_t want =
            kt_engine_device_work_bytes(m, params, params->device && params->device->kind == KT_BACKEND_CUDA);
        KT_CHECK(want == dev_work && dev_work > 0 && dev_work <= dev_total,
                 "device working buffers: kt_engine_device_work_bytes says %llu, the engine took %llu (of %llu)",
                 (unsigned long long)want, (unsigned long long)dev_work, (unsigned long long)dev_total);
    }
    const uint32_t V = kt_engine_n_vocab(e);
    float *logits = kt_test_xmalloc((size_t)(n_prompt + steps) * V * sizeof *logits);
    struct kt_batch_token *bt = kt_test_xmalloc((size_t)n_prompt * sizeof *bt);
    for (uint32_t i = 0; i < n_prompt; i++)
        bt[i] = (struct kt_batch_token){prompt[i], 0, i, true};
    bool ok = kt_engine_seq_add(e, 0, &err) == KT_OK &&
              kt_engine_step(e, &(struct kt_batch){n_prompt, bt}, logits, &err) == KT_OK;
    for (uint32_t s = 0; ok && s < steps; s++) {
        const int32_t next = argmax(logits + (size_t)(n_prompt + s - 1) * V, V);
        if (tokens)
            tokens[s] = next;
        struct kt_batch_token t = {next, 0, n_prompt + s, true};
        ok = kt_engine_step(e, &(struct kt_batch){1, &t}, logits + (size_t)(n_prompt + s) * V, &err) == KT_OK;
    }
    KT_CHECK(ok, "step: %s", err.msg);
    if (stats)
        kt_engine_stats(e, stats);
    if (device) {
        memset(device, 0, sizeof *device);
        kt_engine_device_stats(e, device);
    }
    kt_engine_destroy(e);
    free(bt);
    if (!ok) {
        free(logits);
        return NULL;
    }
    return logits;
}

static double row_diff(const float *a, const float *b, size_t V)
{
    double diff = 0, big = 1e-30;
    for (size_t v = 0; v < V; v++) {
        const double d = fabs((double)a[v] - b[v]), x = fabs((double)a[v]);
        diff = d > diff ? d : diff;
        big = x > big ? x : big;
    }
    return diff / big;
}

double kt_test_worst_row_diff(const float *a, const float *b, size_t rows, size_t V)
{
    double worst = 0;
    for (size_t r = 0; r < rows; r++) {
        const double d = row_diff(a + r * V, b + r * V, V);
        worst = d > worst ? d : worst;
    }
    return worst;
}

static int cmp_double(const void *x, const void *y)
{
    const double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

double kt_test_row_diff_quantile(const float *a, const float *b, size_t rows, size_t V, double q)
{
    if (rows == 0)
        return 0;
    double *d = kt_test_xmalloc(rows * sizeof *d);
    for (size_t r = 0; r < rows; r++)
        d[r] = row_diff(a + r * V, b + r * V, V);
    qsort(d, rows, sizeof *d, cmp_double);
    size_t i = (size_t)(q * (double)(rows - 1) + 0.5);
    const double v = d[i < rows ? i : rows - 1];
    free(d);
    return v;
}
