/*
 * test_kernels_native.c - the CPU kernels of the native checkpoint formats:
 * GGUF MXFP4 against Q8_0 activations and kt's block FP8 (FP8_B128) against
 * F32, on odd shapes at every kernel level this CPU has.
 *
 * What is proved:
 *   - each reference dot equals the formats' definition (hf_formats' exact
 *     decoders, then a dot in double) within a stated bound: MXFP4 exactly
 *     against the dequantized Q8_0 activation up to float rounding of the
 *     per-block terms, and within the Q8_0 rounding (da/2 per element)
 *     against the float activation; FP8 within float summation error;
 *   - every SIMD vec_dot, gemv and gemm equals the scalar reference bit for
 *     bit (integer sums exact for MXFP4; the reference's 64 FMA lanes and
 *     their halving order for FP8), including E8M0 edge scales, every E4M3
 *     code and subnormals;
 *   - kt_fp8_b128_from_hf copies the 128x128 block scales into each row and
 *     decodes bit for bit like kt_fp8_block_row_to_f32, and refuses shapes,
 *     NaN codes and non-finite scales it cannot represent.
 */
#include "testlib.h"

#include "cpu/dispatch.h"
#include "cpu/ref/vec_dot_ref.h"
#include "hf_formats.h"
#include "quant.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static unsigned long long g_rng = 0x6e61746976656b74ULL;

static uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

/* The scalar level first, then every SIMD level this CPU has. */
static int all_levels(enum kt_isa out[KT_ISA_AMX + 1])
{
    int count = 0;
    for (int isa = KT_ISA_SCALAR; isa <= KT_ISA_AMX; isa++)
        if (kt_cpu_kernels_for((enum kt_isa)isa))
            out[count++] = (enum kt_isa)isa;
    return count;
}

/* Activations: gaussian with 1% outliers 100x larger; row kind 3 all +-1. */
static void make_act(float *x, int64_t n, int kind)
{
    for (int64_t i = 0; i < n; i++) {
        x[i] = kt_test_rand_normal(&g_rng) * (kt_test_rand_u64(&g_rng) % 100 == 0 ? 100.0f : 1.0f);
        if (kind % 4 == 3)
            x[i] = kt_test_rand_u64(&g_rng) & 1 ? 1.0f : -1.0f;
    }
}

/* ---- MXFP4 -------------------------------------------------------------------- */

/* One row of n/32 MXFP4 blocks: random nibbles, scales 2^-10 .. 2^9, and on
 * some rows the E8M0 edge scales 0, 1 (F32 subnormal scales) and 2. */
static void make_mxfp4_row(struct kt_block_mxfp4 *x, int64_t n, int64_t row)
{
    for (int64_t i = 0; i < n / 32; i++) {
        x[i].e = (uint8_t)(118 + kt_test_rand_u64(&g_rng) % 20);
        for (int j = 0; j < 16; j++)
            x[i].qs[j] = (uint8_t)kt_test_rand_u64(&g_rng);
        if (row % 3 == 2)
            x[i].e = (uint8_t)(i % 3); /* 2^-128, 2^-127, 2^-126 */
    }
}

/* The reference dot is the definition's within the activation's rounding:
 * against the dequantized Q8_0 activation it is exact up to float rounding of
 * each block's term and of their sum; against the float activation it also
 * carries the Q8_0 error, at most da/2 per element, so sum_b da_b/2 * sum|w|. */
static void mxfp4_reference_matches_to_float_within_activation_rounding(void)
{
    const int64_t cols[] = {32, 64, 96, 7168};
    int checked = 0, nonzero = 0;
    double worst = 0.0;
    for (size_t ci = 0; ci < sizeof cols / sizeof cols[0]; ci++) {
        const int64_t n = cols[ci];
        struct kt_block_mxfp4 *w = kt_test_xmalloc((size_t)(n / 32) * sizeof *w);
        struct kt_block_q8_0 *a = kt_test_xmalloc((size_t)(n / 32) * sizeof *a);
        float *x = kt_test_xmalloc((size_t)n * sizeof *x), *wf = kt_test_xmalloc((size_t)n * sizeof *wf);
        float *af = kt_test_xmalloc((size_t)n * sizeof *af);
        for (int64_t row = 0; row < 17; row++) {
            make_mxfp4_row(w, n, row % 3 == 2 ? 0 : row); /* the subnormal scales are another test's */
            make_act(x, n, (int)row);
            kt_type_traits(KT_TYPE_Q8_0)->from_float(x, a, n);
            kt_type_traits(KT_TYPE_MXFP4)->to_float(w, wf, n);
            kt_type_traits(KT_TYPE_Q8_0)->to_float(a, af, n);
            float ref;
            kt_vec_dot_mxfp4_q8_0_ref(n, &ref, w, a);
            double exact_q = 0.0, exact_x = 0.0, mag_q = 0.0, q8_err = 0.0;
            for (int64_t i = 0; i < n; i++) {
                exact_q += (double)wf[i] * af[i];
                exact_x += (double)wf[i] * x[i];
                mag_q += fabs((double)wf[i] * af[i]);
                q8_err += fabs((double)wf[i]) * 0.5 * kt_fp16_to_fp32(a[i / 32].d);
            }
            /* per block: 2 roundings of the term, one of the running sum */
            const double float_bound = (3.0 * (double)(n / 32) + 1.0) * 0x1p-24 * mag_q;
            const double e1 = fabs(ref - exact_q), e2 = fabs(ref - exact_x);
            KT_CHECK(e1 <= float_bound, "n=%lld row %lld: |ref - dot(w, dequant a)| = %.3g > %.3g", (long long)n,
                     (long long)row, e1, float_bound);
            /* the fp16 scale's own rounding (2^-11 relative) joins the Q8_0 quant rounding */
            KT_CHECK(e2 <= float_bound + q8_err * (1.0 + 0x1p-10) + 0x1p-10 * mag_q,
                     "n=%lld row %lld: |ref - dot(w, x)| = %.3g beyond the Q8_0 rounding %.3g", (long long)n,
                     (long long)row, e2, q8_err);
            worst = mag_q > 0 && e1 / mag_q > worst ? e1 / mag_q : worst;
            checked++;
            nonzero += ref != 0.0f;
        }
        free(w);
        free(a);
        free(x);
        free(wf);
        free(af);
    }
    KT_CHECK(nonzero > checked / 2, "only %d of %d reference dots nonzero", nonzero, checked);
    printf("  mxfp4: worst |ref - dot(w, dequant a)| / sum|w*a| = %.2e over %d rows\n", worst, checked);
}

/* vec_dot, gemv and gemm of every level against the scalar reference, bit for
 * bit: rows 1, 3, 17; cols 32, 64, 96 and 288 (past the 8-block loops);
 * tokens 1..9. */
static void mxfp4_kernels_equal_the_reference_bit_for_bit(void)
{
    enum kt_isa lv[KT_ISA_AMX + 1];
    const int nl = all_levels(lv);
    const int64_t rows_list[] = {1, 3, 17}, cols[] = {32, 64, 96, 288};
    enum { MAX_ROWS = 17, MAX_TOK = 9, MAX_N = 288 };
    struct kt_block_mxfp4 *w = kt_test_xmalloc(MAX_ROWS * (MAX_N / 32) * sizeof *w);
    struct kt_block_q8_0 *a = kt_test_xmalloc(MAX_TOK * (MAX_N / 32) * sizeof *a);
    float *x = kt_test_xmalloc(MAX_N * sizeof *x), ref[MAX_TOK][MAX_ROWS], y[MAX_TOK * MAX_ROWS];
    int compared = 0, differ = 0, nonzero = 0;
    for (size_t ci = 0; ci < sizeof cols / sizeof cols[0]; ci++) {
        const int64_t n = cols[ci], nb = n / 32;
        const size_t row_bytes = (size_t)nb * sizeof *w, act_bytes = (size_t)nb * sizeof *a;
        for (int64_t r = 0; r < MAX_ROWS; r++)
            make_mxfp4_row(w + r * nb, n, r);
        for (int64_t t = 0; t < MAX_TOK; t++) {
            make_act(x, n, (int)t);
            kt_type_traits(KT_TYPE_Q8_0)->from_float(x, a + t * nb, n);
        }
        for (int64_t t = 0; t < MAX_TOK; t++)
            for (int64_t r = 0; r < MAX_ROWS; r++) {
                kt_vec_dot_mxfp4_q8_0_ref(n, &ref[t][r], w + r * nb, a + t * nb);
                nonzero += ref[t][r] != 0.0f;
            }
        for (int l = 0; l < nl; l++) {
            const struct kt_cpu_type_kernels *k = &kt_cpu_kernels_for(lv[l])->type[KT_TYPE_MXFP4];
            for (size_t ri = 0; ri < sizeof rows_list / sizeof rows_list[0]; ri++) {
                const int64_t n_rows = rows_list[ri];
                for (int64_t r = 0; r < n_rows; r++) {
                    float one;
                    k->vec_dot(n, &one, w + r * nb, a + 2 * nb);
                    differ += f32_bits(one) != f32_bits(ref[2][r]);
                }
                float out[MAX_ROWS];
                k->gemv(n, out, w, row_bytes, a + 5 * nb, n_rows);
                for (int64_t r = 0; r < n_rows; r++)
                    differ += f32_bits(out[r]) != f32_bits(ref[5][r]);
                for (int64_t n_tok = 1; n_tok <= MAX_TOK; n_tok++) {
                    k->gemm(n, w, row_bytes, n_rows, a, act_bytes, n_tok, y, MAX_ROWS);
                    for (int64_t t = 0; t < n_tok; t++)
                        for (int64_t r = 0; r < n_rows; r++) {
                            const bool bad = f32_bits(y[t * MAX_ROWS + r]) != f32_bits(ref[t][r]);
                            if (bad && differ < 3)
                                fprintf(stderr, "  %s n=%lld rows=%lld tok=%lld (%lld,%lld): %.9g vs ref %.9g\n",
                                        kt_isa_name(lv[l]), (long long)n, (long long)n_rows, (long long)n_tok,
                                        (long long)t, (long long)r, y[t * MAX_ROWS + r], ref[t][r]);
                            differ += bad;
                            compared++;
                        }
                }
            }
        }
    }
    KT_CHECK(differ == 0, "mxfp4: %d of %d outputs differ from the scalar reference (must be bit-exact)", differ,
             compared);
    KT_CHECK(nonzero > 3 * 17 * 9 / 2, "mxfp4: only %d nonzero reference dots", nonzero);
    printf("  mxfp4: %d gemm outputs at %d levels\n", compared, nl);
    free(w);
    free(a);
    free(x);
}

/* The scale 2^(e-128) at its edges: e = 0 and 1 are F32 subnormals and still
 * exact, so a block of +6 (doubled 12) against all-127 quants with da = 1 is
 * 12 * 127 * 32 * 2^(e-128) exactly at every level; e = 255 is 2^127 (not
 * NaN, as ggml reads it) and overflows to +inf. */
static void mxfp4_edge_scales_are_exact_or_overflow(void)
{
    enum kt_isa lv[KT_ISA_AMX + 1];
    const int nl = all_levels(lv);
    struct kt_block_mxfp4 w[8];
    struct kt_block_q8_0 a[8];
    float x[256];
    for (int i = 0; i < 256; i++)
        x[i] = 127.0f; /* d = 1, every quant 127 */
    kt_type_traits(KT_TYPE_Q8_0)->from_float(x, a, 256);
    const uint8_t edges[] = {0, 1, 2, 127, 128, 200, 255};
    for (size_t ei = 0; ei < sizeof edges / sizeof edges[0]; ei++) {
        for (int b = 0; b < 8; b++) {
            w[b].e = edges[ei];
            memset(w[b].qs, 0x77, sizeof w[b].qs); /* every element +6 */
        }
        const double want = 8.0 * 32.0 * 12.0 * 127.0 * ldexp(1.0, (int)edges[ei] - 128);
        for (int l = 0; l < nl; l++) {
            float got;
            kt_cpu_kernels_for(lv[l])->type[KT_TYPE_MXFP4].vec_dot(256, &got, w, a);
            if (edges[ei] == 255)
                KT_CHECK(isinf(got) && got > 0, "%s e=255: %.9g, want +inf", kt_isa_name(lv[l]), got);
            else
                KT_CHECK((double)got == want, "%s e=%d: %.9g, want %.9g", kt_isa_name(lv[l]), edges[ei], got, want);
        }
    }
}

/* ---- FP8_B128 ----------------------------------------------------------------- */

/* A (rows, cols) F8_E4M3 weight with every non-NaN code, and its (ceil(rows /
 * 128), cols / 128) F32 weight_scale_inv, normal and subnormal scales mixed. */
static void make_hf_fp8(uint8_t *weight, float *scale_inv, int64_t rows, int64_t cols)
{
    for (int64_t i = 0; i < rows * cols; i++) {
        uint8_t c = (uint8_t)(kt_test_rand_u64(&g_rng) % 4 == 0 ? (unsigned long long)i : kt_test_rand_u64(&g_rng));
        weight[i] = (c & 0x7f) == 0x7f ? (uint8_t)(c ^ 0x10) : c;
    }
    const int64_t srows = (rows + 127) / 128, scols = cols / 128;
    for (int64_t i = 0; i < srows * scols; i++)
        scale_inv[i] = i % 7 == 6 ? 0x1p-140f : kt_test_rand_uniform(&g_rng, 1e-5f, 1e-3f);
}

/* from_hf then to_float is kt_fp8_block_row_to_f32 bit for bit, each row
 * carrying its 128-row block's scales; then the refusals. */
static void fp8_from_hf_decodes_like_the_block_format(void)
{
    const int64_t rows = 300, cols = 384, nb = cols / 128; /* three 128-row scale blocks, the last partial */
    uint8_t *weight = kt_test_xmalloc((size_t)(rows * cols));
    float *scale = kt_test_xmalloc((size_t)(3 * nb) * sizeof *scale);
    make_hf_fp8(weight, scale, rows, cols);
    struct kt_block_fp8_b128 *row = kt_test_xmalloc((size_t)nb * sizeof *row);
    float want[384], got[384];
    int differ = 0, scales_wrong = 0;
    for (int64_t r = 0; r < rows; r++) {
        KT_CHECK(kt_fp8_b128_from_hf(weight, scale, rows, cols, r, row), "row %lld refused", (long long)r);
        for (int64_t j = 0; j < nb; j++)
            scales_wrong += f32_bits(row[j].d) != f32_bits(scale[(r / 128) * nb + j]);
        KT_CHECK(kt_fp8_b128_check_row(row, cols), "row %lld fails its own check", (long long)r);
        kt_fp8_block_row_to_f32(weight, scale, cols, 128, 128, r, want);
        kt_type_traits(KT_TYPE_FP8_B128)->to_float(row, got, cols);
        for (int64_t c = 0; c < cols; c++)
            differ += f32_bits(want[c]) != f32_bits(got[c]);
    }
    KT_CHECK(differ == 0, "%d decoded values differ from kt_fp8_block_row_to_f32", differ);
    KT_CHECK(scales_wrong == 0, "%d blocks carry the wrong 128x128 scale", scales_wrong);

    /* shapes it cannot represent */
    KT_CHECK(!kt_fp8_b128_from_hf(weight, scale, rows, 200, 0, row), "cols 200 accepted");
    KT_CHECK(!kt_fp8_b128_from_hf(weight, scale, rows, 0, 0, row), "cols 0 accepted");
    KT_CHECK(!kt_fp8_b128_from_hf(weight, scale, rows, cols, rows, row), "row past the end accepted");
    KT_CHECK(!kt_fp8_b128_from_hf(weight, scale, rows, cols, -1, row), "negative row accepted");
    /* NaN codes and non-finite scales */
    const uint8_t nan_codes[] = {0x7f, 0xff};
    for (int k = 0; k < 2; k++) {
        const uint8_t keep = weight[5 * cols + 300];
        weight[5 * cols + 300] = nan_codes[k];
        KT_CHECK(!kt_fp8_b128_from_hf(weight, scale, rows, cols, 5, row), "NaN code 0x%02x accepted", nan_codes[k]);
        KT_CHECK(kt_fp8_b128_from_hf(weight, scale, rows, cols, 6, row), "a NaN in row 5 refuses row 6");
        weight[5 * cols + 300] = keep;
    }
    const float bad_scales[] = {INFINITY, -INFINITY, NAN};
    for (int k = 0; k < 3; k++) {
        const float keep = scale[nb + 1];
        scale[nb + 1] = bad_scales[k];
        KT_CHECK(!kt_fp8_b128_from_hf(weight, scale, rows, cols, 130, row), "scale %g accepted", bad_scales[k]);
        scale[nb + 1] = keep;
    }
    KT_CHECK(kt_fp8_b128_from_hf(weight, scale, rows, cols, 130, row), "row 130 refused after the repairs");
    row[2].q[17] = 0xff;
    KT_CHECK(!kt_fp8_b128_check_row(row, cols), "check_row misses a NaN code");
    row[2].q[17] = 0x7e;
    row[1].d = INFINITY;
    KT_CHECK(!kt_fp8_b128_check_row(row, cols), "check_row misses an infinite scale");
    free(weight);
    free(scale);
    free(row);
}

/* FP8 rows for the kernel tests: converted from a random HF tensor. */
static void make_fp8_rows(struct kt_block_fp8_b128 *w, int64_t n_rows, int64_t n)
{
    uint8_t *weight = kt_test_xmalloc((size_t)(n_rows * n));
    float *scale = kt_test_xmalloc((size_t)(((n_rows + 127) / 128) * (n / 128)) * sizeof *scale);
    make_hf_fp8(weight, scale, n_rows, n);
    for (int64_t r = 0; r < n_rows; r++)
        if (!kt_fp8_b128_from_hf(weight, scale, n_rows, n, r, w + r * (n / 128))) {
            fprintf(stderr, "from_hf refused a valid row\n");
            exit(2);
        }
    free(weight);
    free(scale);
}

/* The reference is the definition within float summation: |ref - dot in
 * double of to_float(w) and a| <= (n/64 + 6) * 2^-24 * sum|w*a| (n/64 fused
 * adds per lane, 6 halvings). */
static void fp8_reference_within_float_summation_of_the_definition(void)
{
    const int64_t cols[] = {128, 384, 7168};
    double worst = 0.0;
    int checked = 0, nonzero = 0;
    for (size_t ci = 0; ci < sizeof cols / sizeof cols[0]; ci++) {
        const int64_t n = cols[ci];
        struct kt_block_fp8_b128 *w = kt_test_xmalloc((size_t)(17 * (n / 128)) * sizeof *w);
        float *x = kt_test_xmalloc((size_t)n * sizeof *x), *wf = kt_test_xmalloc((size_t)n * sizeof *wf);
        make_fp8_rows(w, 17, n);
        for (int64_t r = 0; r < 17; r++) {
            make_act(x, n, (int)r);
            kt_type_traits(KT_TYPE_FP8_B128)->to_float(w + r * (n / 128), wf, n);
            float ref;
            kt_vec_dot_fp8_b128_f32_ref(n, &ref, w + r * (n / 128), x);
            double exact = 0.0, mag = 0.0;
            for (int64_t i = 0; i < n; i++) {
                exact += (double)wf[i] * x[i];
                mag += fabs((double)wf[i] * x[i]);
            }
            const double err = fabs(ref - exact), bound = ((double)n / 64.0 + 6.0) * 0x1p-24 * mag;
            KT_CHECK(err <= bound, "n=%lld row %lld: |ref - exact| = %.3g > %.3g", (long long)n, (long long)r, err,
                     bound);
            worst = mag > 0 && err / mag > worst ? err / mag : worst;
            checked++;
            nonzero += ref != 0.0f;
        }
        free(w);
        free(x);
        free(wf);
    }
    KT_CHECK(nonzero > checked / 2, "only %d of %d reference dots nonzero", nonzero, checked);
    printf("  fp8_b128: worst |ref - exact| / sum|w*a| = %.2e over %d rows\n", worst, checked);
}

/* Block scales at and around 2^8, where d * 2^120 stops being a finite F32
 * (the SIMD levels' fast path multiplies by it, their other path by 2^120
 * and d), and large ones whose products stay finite. */
static const float fp8_large_scales[] = {0x1.fffffep7f, 0x1p8f, -0x1.8p8f, 0x1p100f, -0x1.fffffep7f, 1000.0f};

/* vec_dot, gemv and gemm of every level equal the reference bit for bit: rows
 * 1, 3, 4, 5, 8, 17 (the gemv's four-row passes and the rows left over); cols 128,
 * 384 and 1152; tokens 1..9; every E4M3 code but NaN, subnormal scales among
 * them, and a second round with every third block's scale from
 * fp8_large_scales (a four-row pass then holds blocks of both kinds). */
static void fp8_kernels_equal_the_reference_bit_for_bit(void)
{
    enum kt_isa lv[KT_ISA_AMX + 1];
    const int nl = all_levels(lv);
    const int64_t rows_list[] = {1, 3, 4, 5, 8, 17}, cols[] = {128, 384, 1152};
    enum { MAX_ROWS = 17, MAX_TOK = 9, MAX_N = 1152 };
    struct kt_block_fp8_b128 *w = kt_test_xmalloc(MAX_ROWS * (MAX_N / 128) * sizeof *w);
    float *a = kt_test_xmalloc((size_t)MAX_TOK * (MAX_N + 3) * sizeof *a); /* rows 3 floats apart: unaligned */
    float ref[MAX_TOK][MAX_ROWS], y[MAX_TOK * MAX_ROWS];
    int compared = 0, differ = 0, nonzero = 0, large = 0;
    for (size_t pass = 0; pass < 2 * sizeof cols / sizeof cols[0]; pass++) {
        const size_t ci = pass % (sizeof cols / sizeof cols[0]);
        const int64_t n = cols[ci], nb = n / 128;
        const size_t row_bytes = (size_t)nb * sizeof *w, act_bytes = (size_t)(n + 3) * sizeof *a;
        make_fp8_rows(w, MAX_ROWS, n);
        if (pass >= sizeof cols / sizeof cols[0])
            for (int64_t j = 1; j < MAX_ROWS * nb; j += 3, large++)
                w[j].d = fp8_large_scales[(size_t)j % (sizeof fp8_large_scales / sizeof fp8_large_scales[0])];
        for (int64_t t = 0; t < MAX_TOK; t++)
            make_act(a + t * (n + 3), n, (int)t);
        for (int64_t t = 0; t < MAX_TOK; t++)
            for (int64_t r = 0; r < MAX_ROWS; r++) {
                kt_vec_dot_fp8_b128_f32_ref(n, &ref[t][r], w + r * nb, a + t * (n + 3));
                nonzero += ref[t][r] != 0.0f;
            }
        for (int l = 0; l < nl; l++) {
            const struct kt_cpu_type_kernels *k = &kt_cpu_kernels_for(lv[l])->type[KT_TYPE_FP8_B128];
            for (size_t ri = 0; ri < sizeof rows_list / sizeof rows_list[0]; ri++) {
                const int64_t n_rows = rows_list[ri];
                for (int64_t r = 0; r < n_rows; r++) {
                    float one;
                    k->vec_dot(n, &one, w + r * nb, a + 4 * (n + 3));
                    differ += f32_bits(one) != f32_bits(ref[4][r]);
                }
                float out[MAX_ROWS];
                k->gemv(n, out, w, row_bytes, a + 7 * (n + 3), n_rows);
                for (int64_t r = 0; r < n_rows; r++)
                    differ += f32_bits(out[r]) != f32_bits(ref[7][r]);
                for (int64_t n_tok = 1; n_tok <= MAX_TOK; n_tok++) {
                    k->gemm(n, w, row_bytes, n_rows, a, act_bytes, n_tok, y, MAX_ROWS);
                    for (int64_t t = 0; t < n_tok; t++)
                        for (int64_t r = 0; r < n_rows; r++) {
                            const bool bad = f32_bits(y[t * MAX_ROWS + r]) != f32_bits(ref[t][r]);
                            if (bad && differ < 3)
                                fprintf(stderr, "  %s n=%lld rows=%lld tok=%lld (%lld,%lld): %.9g vs ref %.9g\n",
                                        kt_isa_name(lv[l]), (long long)n, (long long)n_rows, (long long)n_tok,
                                        (long long)t, (long long)r, y[t * MAX_ROWS + r], ref[t][r]);
                            differ += bad;
                            compared++;
                        }
                }
            }
        }
    }
    KT_CHECK(differ == 0, "fp8_b128: %d of %d outputs differ from the scalar reference (must be bit-exact)", differ,
             compared);
    KT_CHECK(nonzero > 2 * 3 * 17 * 9 / 2, "fp8_b128: only %d nonzero reference dots", nonzero);
    KT_CHECK(large > 0, "no block took a large scale");
    printf("  fp8_b128: %d gemm outputs at %d levels, %d blocks with large scales\n", compared, nl, large);
    free(w);
    free(a);
}

/* Every code through every level's widening: a row whose element i is code
 * i % 256 (NaN codes replaced by 0), dotted with a one-hot activation, is
 * to_float's value for that element (lanes holding +0 add nothing), under
 * normal, subnormal and large scales. */
static void fp8_every_code_widens_exactly_at_every_level(void)
{
    enum kt_isa lv[KT_ISA_AMX + 1];
    const int nl = all_levels(lv);
    enum { N = 512 };
    struct kt_block_fp8_b128 w[N / 128];
    for (int i = 0; i < N; i++)
        w[i / 128].q[i % 128] = (i & 0x7f) == 0x7f ? 0 : (uint8_t)i;
    w[0].d = 0.75f;
    w[1].d = 0x1p-130f;       /* subnormal scale: products round once, like to_float */
    w[2].d = 0x1.fffffep7f;   /* the largest scale times 2^120 still finite */
    w[3].d = -0x1p8f;         /* the smallest that is not: the SIMD levels' other path */
    float wf[N], x[N];
    kt_type_traits(KT_TYPE_FP8_B128)->to_float(w, wf, N);
    int differ = 0;
    for (int l = 0; l < nl; l++)
        for (int i = 0; i < N; i++) {
            memset(x, 0, sizeof x);
            x[i] = 1.0f;
            float got;
            kt_cpu_kernels_for(lv[l])->type[KT_TYPE_FP8_B128].vec_dot(N, &got, w, x);
            const float want = wf[i] + 0.0f; /* -0 plus the other lanes' +0 is +0 */
            if (f32_bits(got) != f32_bits(want) && differ++ < 3)
                fprintf(stderr, "  %s code 0x%02x: %.9g, want %.9g\n", kt_isa_name(lv[l]), w[i / 128].q[i % 128], got,
                        want);
        }
    KT_CHECK(differ == 0, "%d widened codes differ from to_float", differ);
}

int main(void)
{
    KT_RUN(mxfp4_reference_matches_to_float_within_activation_rounding);
    KT_RUN(mxfp4_kernels_equal_the_reference_bit_for_bit);
    KT_RUN(mxfp4_edge_scales_are_exact_or_overflow);
    KT_RUN(fp8_from_hf_decodes_like_the_block_format);
    KT_RUN(fp8_reference_within_float_summation_of_the_definition);
    KT_RUN(fp8_kernels_equal_the_reference_bit_for_bit);
    KT_RUN(fp8_every_code_widens_exactly_at_every_level);
    return kt_test_finish();
}
