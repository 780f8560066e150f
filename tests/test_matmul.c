/*
 * test_matmul.c - runtime/forward/matmul.c's dequantizers: the transposed one
 * (the expanded attention form's W_UK,h, and kt-bench machine's measure of it)
 * gives exactly kt_mat_dequantize's values with rows and columns swapped, for
 * every row count (whole runs of KT_MAT_T_ROWS and a partial last one), row
 * widths of one and several blocks, quantized and float types, and writes
 * nothing outside its output; kt_matmul_q_pair gives each matrix's outputs
 * bit for bit as kt_matmul_q alone.
 */
#include "testlib.h"

#include "cpu/dispatch.h"
#include "matmul.h"
#include "cpu/packed.h"
#include "pool.h"
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

/* kt_matmul_q_pair gives every output bit for bit what kt_matmul_q gives
 * for each matrix alone: GGUF rows and the level's packed layout, one token
 * and a gemm batch, odd row counts, on pools of 1 and 3 threads. */
static void a_pair_of_products_is_two_products(struct kt_pool *pool, enum kt_type t, bool pack, int64_t n_in,
                                               int64_t out_a, int64_t out_b, int64_t n_tok)
{
    const struct kt_packed_format *f = pack ? kt_mat_kernels_for(t)->packed : NULL;
    if (pack && (!f || out_a < (int64_t)f->rows || out_b < (int64_t)f->rows))
        return;
    const size_t row = kt_type_row_bytes(t, n_in);
    struct kt_mat m[2];
    void *mem[2] = {0};
    unsigned long long rng = 0x70616972ULL ^ (unsigned long long)(t * 977 + n_in + out_a * 3 + out_b * 5 + n_tok);
    float *x = kt_test_xmalloc((size_t)n_in * n_tok * sizeof(float));
    for (int k = 0; k < 2; k++) {
        const int64_t n_out = k ? out_b : out_a;
        uint8_t *w = kt_test_xmalloc((size_t)n_out * row);
        for (int64_t o = 0; o < n_out; o++) {
            for (int64_t i = 0; i < n_in; i++)
                x[i] = kt_test_rand_uniform(&rng, -1, 1);
            kt_type_traits(t)->from_float(x, w + (size_t)o * row, n_in);
        }
        m[k] = (struct kt_mat){.data = w, .type = t, .n_in = n_in, .n_out = n_out, .row_bytes = row};
        mem[k] = w;
        if (f) {
            void *p = aligned_alloc(64, kt_packed_bytes(f, n_in, n_out)); /* the packed kernels load whole groups aligned */
            KT_CHECK(p != NULL, "out of memory");
            if (!p)
                return;
            f->pack(n_in, w, row, n_out, p);
            free(w);
            mem[k] = p, m[k].data = p, m[k].packed = f;
        }
    }
    for (int64_t i = 0; i < n_in * n_tok; i++)
        x[i] = kt_test_rand_uniform(&rng, -3, 3);
    const struct kt_cpu_type_kernels *k = kt_mat_kernels_for(t);
    uint8_t *xq = kt_test_xmalloc(kt_type_row_bytes(k->vec_dot_type, n_in) * (size_t)n_tok);
    kt_quantize_rows(NULL, t, x, n_tok, n_in, xq);
    float *ya = kt_test_xmalloc((size_t)(out_a * n_tok) * sizeof(float)), *yb = kt_test_xmalloc((size_t)(out_b * n_tok) * sizeof(float));
    float *za = kt_test_xmalloc((size_t)(out_a * n_tok) * sizeof(float)), *zb = kt_test_xmalloc((size_t)(out_b * n_tok) * sizeof(float));
    kt_matmul_q_pair(pool, &m[0], &m[1], xq, n_tok, ya, yb);
    kt_matmul_q(pool, &m[0], xq, n_tok, za, out_a);
    kt_matmul_q(pool, &m[1], xq, n_tok, zb, out_b);
    KT_CHECK(memcmp(ya, za, (size_t)(out_a * n_tok) * sizeof(float)) == 0 &&
                 memcmp(yb, zb, (size_t)(out_b * n_tok) * sizeof(float)) == 0,
             "%s%s %lld in, %lld + %lld out, %lld tokens, %d threads: the pair differs from the products alone",
             kt_type_name(t), f ? " packed" : "", (long long)n_in, (long long)out_a, (long long)out_b,
             (long long)n_tok, pool ? kt_pool_n_threads(pool) : 1);
    free(mem[0]), free(mem[1]), free(x), free(xq), free(ya), free(yb), free(za), free(zb);
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
    static const enum kt_type pair_types[] = {KT_TYPE_Q8_0, KT_TYPE_Q4_K, KT_TYPE_F32};
    static const int64_t outs[][2] = {{17, 37}, {64, 16}, {576, 1536}, {5, 3}};
    for (int threads = 1; threads <= 3; threads += 2) {
        struct kt_pool *pool = NULL;
        kt_err err = {0};
        KT_CHECK(kt_pool_create(threads, &pool, &err) == KT_OK, "%s", err.msg);
        for (size_t k = 0; pool && k < sizeof pair_types / sizeof pair_types[0]; k++)
            for (size_t o = 0; o < sizeof outs / sizeof outs[0]; o++)
                for (int pack = 0; pack < 2; pack++)
                    for (int64_t n_tok = 1; n_tok <= 5; n_tok += 4)
                        a_pair_of_products_is_two_products(pool, pair_types[k], pack, 256, outs[o][0], outs[o][1],
                                                           n_tok);
        kt_pool_destroy(pool);
    }
    return kt_test_finish();
}
