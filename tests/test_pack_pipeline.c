/*
 * test_pack_pipeline.c - the loader's packer threads (pack_pipeline.h).
 *
 * Proves: every submitted job runs exactly once on the bytes staged for it,
 * whatever the number of packers and however many jobs are in flight; the
 * staging slots are reused (the loader never holds more than n + 1 buffers);
 * drain waits for the last job; a pipeline destroyed with nothing submitted,
 * or with a slot taken and never submitted (the loader's read failed), shuts
 * down cleanly.
 */
#include "pack_pipeline.h"
#include "testlib.h"

#include <stdlib.h>
#include <string.h>

#define SLOT_BYTES 4096
#define N_JOBS 500

struct job {
    uint32_t *out;  /* (SLOT_BYTES / 4) where the "packed" words go */
    uint32_t *runs; /* times this job ran */
};

/* out[i] = staged[i] * 3 + 1: a stand-in for packing. */
static void fake_pack(const void *ctx, const uint8_t *staged)
{
    const struct job *j = ctx;
    const uint32_t *in = (const uint32_t *)staged;
    for (size_t i = 0; i < SLOT_BYTES / 4; i++)
        j->out[i] = in[i] * 3 + 1;
    __atomic_add_fetch(j->runs, 1, __ATOMIC_RELAXED);
}

static void every_job_runs_once_on_its_own_bytes(void)
{
    for (int threads = 1; threads <= 4; threads++) {
        struct kt_pack_pipeline *p = kt_pack_pipeline_create(threads, SLOT_BYTES);
        KT_CHECK(p != NULL, "pipeline with %d packers", threads);
        if (!p)
            continue;
        uint32_t *out = kt_test_xmalloc((size_t)N_JOBS * SLOT_BYTES);
        uint32_t *runs = calloc(N_JOBS, sizeof *runs);
        uint8_t *seen[64];
        int n_seen = 0;
        for (uint32_t k = 0; k < N_JOBS; k++) {
            uint8_t *buf = kt_pack_pipeline_acquire(p);
            bool known = false;
            for (int i = 0; i < n_seen; i++)
                known |= seen[i] == buf;
            if (!known && n_seen < 64)
                seen[n_seen++] = buf;
            uint32_t *w = (uint32_t *)buf;
            for (size_t i = 0; i < SLOT_BYTES / 4; i++)
                w[i] = k * 1000u + (uint32_t)i;
            struct job j = {out + (size_t)k * (SLOT_BYTES / 4), runs + k};
            kt_pack_pipeline_submit(p, buf, fake_pack, &j, sizeof j);
        }
        kt_pack_pipeline_drain(p);
        uint32_t bad = 0, wrong_runs = 0;
        for (uint32_t k = 0; k < N_JOBS; k++) {
            wrong_runs += runs[k] != 1;
            for (size_t i = 0; i < SLOT_BYTES / 4; i++)
                bad += out[(size_t)k * (SLOT_BYTES / 4) + i] != (k * 1000u + (uint32_t)i) * 3 + 1;
        }
        KT_CHECK(wrong_runs == 0, "%d packers: %u jobs did not run exactly once", threads, wrong_runs);
        KT_CHECK(bad == 0, "%d packers: %u words packed from the wrong bytes", threads, bad);
        KT_CHECK(n_seen <= threads + 1, "%d packers: %d distinct staging buffers (at most %d)", threads, n_seen,
                 threads + 1);
        kt_pack_pipeline_destroy(p);
        free(out);
        free(runs);
    }
}

static void shuts_down_with_nothing_or_an_unsubmitted_slot(void)
{
    struct kt_pack_pipeline *p = kt_pack_pipeline_create(2, SLOT_BYTES);
    KT_CHECK(p != NULL, "pipeline");
    kt_pack_pipeline_destroy(p);
    p = kt_pack_pipeline_create(2, SLOT_BYTES);
    if (p) {
        uint8_t *a = kt_pack_pipeline_acquire(p);
        KT_CHECK(a != NULL, "a slot");
        kt_pack_pipeline_destroy(p); /* the read into `a` "failed": never submitted */
    }
    kt_pack_pipeline_destroy(NULL);
}

int main(void)
{
    KT_RUN(every_job_runs_once_on_its_own_bytes);
    KT_RUN(shuts_down_with_nothing_or_an_unsubmitted_slot);
    return kt_test_finish();
}
