/*
 * test_matmul.c - runtime/forward/matmul.c's dequantizers: the transposed one
 * (the expanded attention form's W_UK,h, and kt-bench machine's measure of it)
 * gives exactly kt_mat_dequantize's values with rows and columns swapped, for
 * every row count (whole runs of KT_MAT_T_ROWS and a partial last one), row
 * widths of one and several blocks, quantized and float types, and writes
 * nothing outside its output.
 */
#include "testlib.h"

#include "matmul.h"
#include "quant.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static const float SENTINEL = -12345.678f;

static void transposed_is_the_transpose(enum kt_type t, int64_t n_in, int64_t n_out)
{
    const size_t row = kt_type_row_bytes(t, n_in);
    uint8_t *w = kt_test_xmalloc((size_t)n_out * row);
    float *x = kt_test_xmalloc((size_t)n_in * sizeof(float));
    float *plain = kt_test_xmalloc((size_t)n_in * n_out * sizeof(float));
    float *out = kt_test_xmalloc(((size_t)n_in * n_out + 2) * sizeof(float)); /* a sentinel each side */
    float *tmp = kt_test_xmalloc((size_t)KT_MAT_T_ROWS * n_in * sizeof(float));
    unsigned long long rng = 0x7472616e73ULL ^ (unsigned long long)(t * 131 + n_in * 7 + n_out);
    for (int64_t o = 0; o < n_out; o++) {
        for (int64_t i = 0; i < n_in; i++)
            x[i] = kt_test_rand_uniform(&rng, -2, 2);
        kt_type_traits(t)->from_float(x, w + (size_t)o * row, n_in);
    }
    const struct kt_mat m = {.data = w, .type = t, .n_in = n_in, .n_out = n_out, .row_bytes = row};
    kt_mat_dequantize(&m, plain);
    for (size_t i = 0; i < (size_t)n_in * n_out + 2; i++)
        out[i] = SENTINEL;
    kt_mat_dequantize_transposed(&m, out + 1, tmp);
    int64_t wrong = 0;
    for (int64_t o = 0; o < n_out; o++)
        for (int64_t i = 0; i < n_in; i++)
            wrong += memcmp(&out[1 + i * n_out + o], &plain[o * n_in + i], sizeof(float)) != 0;
    KT_CHECK(wrong == 0, "%s %lld x %lld: %lld values differ from the plain dequantization", kt_type_name(t),
             (long long)n_out, (long long)n_in, (long long)wrong);
    KT_CHECK(out[0] == SENTINEL && out[(size_t)n_in * n_out + 1] == SENTINEL, "%s %lld x %lld: wrote outside",
             kt_type_name(t), (long long)n_out, (long long)n_in);
    free(w), free(x), free(plain), free(out), free(tmp);
}

int main(void)
{
    static const enum kt_type types[] = {KT_TYPE_Q8_0, KT_TYPE_BF16, KT_TYPE_F16, KT_TYPE_F32, KT_TYPE_Q4_K};
    static const int64_t rows[] = {1, 15, 16, 17, 37, 512};
    for (size_t k = 0; k < sizeof types / sizeof types[0]; k++) {
        const int64_t block = kt_type_traits(types[k])->block_elems ? kt_type_traits(types[k])->block_elems : 1;
        const int64_t widths[] = {block < 32 ? 32 : block, 3 * (block < 32 ? 32 : block)};
        for (size_t r = 0; r < sizeof rows / sizeof rows[0]; r++)
            for (size_t c = 0; c < 2; c++)
                transposed_is_the_transpose(types[k], widths[c], rows[r]);
    }
    return kt_test_finish();
}
