/*
 * test_cuda_dequant.c - the CUDA dequantization kernels produce exactly what
 * the scalar reference produces, for every type they support, on odd lengths.
 * Skips visibly ("skipped: no CUDA device") where no GPU can be used.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kt_cuda.h"
#include "quant.h"
#include "testlib.h"

static void cuda_dequant_matches_reference(void)
{
    static const int types[] = {KT_TYPE_F32,  KT_TYPE_F16,  KT_TYPE_BF16, KT_TYPE_Q8_0,    KT_TYPE_Q4_0,
                                KT_TYPE_Q4_K, KT_TYPE_Q5_K, KT_TYPE_Q6_K, KT_TYPE_FP8_B128};
    static const int64_t blocks[] = {1, 3, 7, 129};
    unsigned long long rng = 42;
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
        const struct kt_type_traits *tr = kt_type_traits(types[t]);
        for (size_t b = 0; b < sizeof blocks / sizeof blocks[0]; b++) {
            int64_t n = blocks[b] * (tr->block_elems > 1 ? tr->block_elems : 256) + (tr->block_elems > 1 ? 0 : 5);
            float *x = malloc((size_t)n * sizeof *x), *want = malloc((size_t)n * sizeof *want);
            float *got = malloc((size_t)n * sizeof *got);
            void *q = malloc(kt_type_row_bytes(types[t], n));
            for (int64_t i = 0; i < n; i++)
                x[i] = kt_test_rand_normal(&rng) * (i % 97 == 0 ? 8.0f : 1.0f);
            tr->from_float(x, q, n);
            tr->to_float(q, want, n);
            kt_err err = {0};
            kt_status rc = kt_cuda_dequantize_host(types[t], q, got, n, &err);
            KT_CHECK(rc == 0, "%s n=%lld: %s", tr->name, (long long)n, err.msg);
            int64_t bad = 0;
            for (int64_t i = 0; rc == 0 && i < n; i++)
                bad += memcmp(&got[i], &want[i], sizeof(float)) != 0;
            KT_CHECK(bad == 0, "%s n=%lld: %lld elements differ from the reference", tr->name, (long long)n,
                     (long long)bad);
            free(x), free(want), free(got), free(q);
        }
    }
}

static void cuda_dequant_rejects_unsupported_type(void)
{
    kt_err err = {0};
    struct kt_block_q4_0 blk = {0};
    float out[32];
    KT_CHECK(kt_cuda_dequantize_host(KT_TYPE_Q4_0, &blk, out, 32, &err) == KT_ERR_UNSUPPORTED, "q4_0 accepted");
    KT_CHECK(err.msg[0] != 0, "no message");
}

int main(void)
{
    const int skip = kt_test_skip_without_cuda();
    if (skip)
        return skip;
    KT_RUN(cuda_dequant_matches_reference);
    KT_RUN(cuda_dequant_rejects_unsupported_type);
    return kt_test_finish();
}
