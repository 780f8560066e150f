/*
 * test_hf_formats.c - the native Hugging Face weight formats decode to F32
 * exactly as their definitions say, bit for bit.
 *
 * Every expectation here is computed from the format's formula in double
 * precision (ldexp of integer significands), never by calling the code under
 * test or sharing its tables: all 256 FP8 E4M3 codes, all 16 E2M1 codes, all
 * 256 E8M0 codes, then whole rows of each layout with shapes that end in
 * partial blocks and groups, buffers at odd addresses, and hand-packed
 * vectors that pin which nibble is which element.
 */
#include "hf_formats.h"
#include "quant.h"
#include "testlib.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static uint32_t bits_of(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

/* A double that is exactly representable or out of range, as the F32 the
 * hardware would give (explicit, so no out-of-range conversion is performed). */
static float to_f32(double v)
{
    if (v > FLT_MAX)
        return INFINITY;
    if (v < -FLT_MAX)
        return -INFINITY;
    return (float)v;
}

/* bit-equal, or both NaN */
static bool same(float got, float want)
{
    return (isnan(got) && isnan(want)) || bits_of(got) == bits_of(want);
}

/* ---- independent definitions ---------------------------------------------------------- */

/* OFP8 E4M3: s.eeee.mmm, bias 7, S.1111.111 NaN, no inf. */
static double e4m3_expected(unsigned code)
{
    unsigned s = code >> 7, e = (code >> 3) & 15, m = code & 7;
    if (e == 15 && m == 7)
        return NAN;
    double mag = e == 0 ? ldexp(m, -9) : ldexp(8 + m, (int)e - 10); /* m/8*2^-6, (1+m/8)*2^(e-7) */
    return s ? -mag : mag;
}

/* E2M1: s.ee.m, bias 1. */
static double e2m1_expected(unsigned code)
{
    unsigned s = (code >> 3) & 1, e = (code >> 1) & 3, m = code & 1;
    double mag = e == 0 ? 0.5 * m : ldexp(2 + m, (int)e - 2); /* (1+m/2)*2^(e-1) */
    return s ? -mag : mag;
}

static double e8m0_expected(unsigned code)
{
    return code == 255 ? NAN : ldexp(1.0, (int)code - 127);
}

static double bf16_expected(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* ---- scalar codes --------------------------------------------------------------------- */

static void fp8_e4m3_all_256_codes_match_the_ofp8_definition(void)
{
    for (unsigned c = 0; c < 256; c++) {
        float got = kt_fp8_e4m3_to_f32((uint8_t)c);
        float want = to_f32(e4m3_expected(c));
        KT_CHECK(same(got, want), "e4m3 0x%02x: got %a want %a", c, got, want);
    }
    /* landmarks of the spec, written out */
    KT_CHECK(kt_fp8_e4m3_to_f32(0x7e) == 448.0f, "largest finite is 448");
    KT_CHECK(kt_fp8_e4m3_to_f32(0xfe) == -448.0f, "-448");
    KT_CHECK(kt_fp8_e4m3_to_f32(0x38) == 1.0f, "0x38 is 1");
    KT_CHECK(kt_fp8_e4m3_to_f32(0x08) == 0x1p-6f, "smallest normal 2^-6");
    KT_CHECK(kt_fp8_e4m3_to_f32(0x01) == 0x1p-9f, "smallest subnormal 2^-9");
    KT_CHECK(kt_fp8_e4m3_to_f32(0x07) == 0x1.cp-7f, "largest subnormal 7/8 * 2^-6");
    KT_CHECK(isnan(kt_fp8_e4m3_to_f32(0x7f)) && isnan(kt_fp8_e4m3_to_f32(0xff)), "S.1111.111 is NaN");
    KT_CHECK(kt_fp8_e4m3_to_f32(0x78) == 256.0f && !isinf(kt_fp8_e4m3_to_f32(0x78)), "S.1111.000 is 256, not inf");
    KT_CHECK(bits_of(kt_fp8_e4m3_to_f32(0x80)) == 0x80000000u, "0x80 is -0");
    int nans = 0;
    for (unsigned c = 0; c < 256; c++)
        nans += isnan(kt_fp8_e4m3_to_f32((uint8_t)c)) != 0;
    KT_CHECK(nans == 2, "exactly two NaN codes, got %d", nans);
}

static void e2m1_all_16_codes_match_the_mx_definition(void)
{
    static const float listed[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f}; /* OCP MX table */
    for (unsigned c = 0; c < 16; c++) {
        float got = kt_e2m1_to_f32((uint8_t)c);
        KT_CHECK(same(got, to_f32(e2m1_expected(c))), "e2m1 0x%x: got %a want %a", c, got, e2m1_expected(c));
        KT_CHECK(fabsf(got) == listed[c & 7] && (signbit(got) != 0) == (c >= 8), "e2m1 0x%x vs the table: %a", c,
                 got);
        KT_CHECK(kt_e2m1_to_f32((uint8_t)(c | 0xf0)) == got, "e2m1 reads only the low nibble (0x%x)", c);
    }
    KT_CHECK(bits_of(kt_e2m1_to_f32(8)) == 0x80000000u, "code 8 is -0");
}

static void e8m0_all_256_codes_match_the_mx_definition(void)
{
    for (unsigned c = 0; c < 256; c++) {
        float got = kt_e8m0_to_f32((uint8_t)c);
        float want = to_f32(e8m0_expected(c));
        KT_CHECK(same(got, want), "e8m0 %u: got %a want %a", c, got, want);
        KT_CHECK(c == 255 || (got > 0 && !isinf(got)), "e8m0 %u is a positive finite power of two", c);
    }
    KT_CHECK(kt_e8m0_to_f32(127) == 1.0f, "127 is 1");
    KT_CHECK(kt_e8m0_to_f32(0) == 0x1p-127f && kt_e8m0_to_f32(0) > 0, "0 is 2^-127 (subnormal, not flushed)");
    KT_CHECK(kt_e8m0_to_f32(254) == 0x1p127f, "254 is 2^127");
    KT_CHECK(isnan(kt_e8m0_to_f32(255)), "255 is NaN");
}

/* ---- INT4 pack-quantized ----------------------------------------------------------------- */

/* Packs rows of q in [-8, 7] the way the format stores them: q + 8 in nibble
 * c % 8 of word c / 8; padding nibbles get pad (any value: they must be ignored). */
static void pack_int4(const int8_t *q, int64_t rows, int64_t cols, uint8_t pad, uint8_t *out)
{
    const int64_t words = (cols + 7) / 8;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t w = 0; w < words; w++) {
            uint32_t word = 0;
            for (int k = 0; k < 8; k++) {
                int64_t c = w * 8 + k;
                uint32_t nib = c < cols ? (uint32_t)(q[r * cols + c] + 8) : pad;
                word |= (nib & 0xfu) << (4 * k);
            }
            uint8_t le[4] = {(uint8_t)word, (uint8_t)(word >> 8), (uint8_t)(word >> 16), (uint8_t)(word >> 24)};
            memcpy(out + (r * words + w) * 4, le, 4);
        }
}

static void int4_pack_nibble_order_is_low_nibble_first_offset_8(void)
{
    /* words 0x76543210 and 0xFEDCBA98 hold q = -8..-1 and 0..7 in element order */
    const uint8_t packed[8] = {0x10, 0x32, 0x54, 0x76, 0x98, 0xba, 0xdc, 0xfe};
    const uint8_t scale[2] = {0x80, 0x3f}; /* BF16 1.0 */
    float out[16];
    kt_int4_pack_row_to_f32(packed, scale, 16, 32, 0, out);
    for (int c = 0; c < 16; c++)
        KT_CHECK(out[c] == (float)(c - 8), "element %d: got %g want %d", c, out[c], c - 8);
}

static void int4_pack_rows_match_the_definition(void)
{
    const int64_t shapes[][3] = {{3, 96, 32}, {4, 72, 32}, {2, 45, 32}, {5, 7, 32}, {2, 64, 16}};
    unsigned long long state = 17;
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const int64_t rows = shapes[si][0], cols = shapes[si][1], group = shapes[si][2];
        const int64_t words = (cols + 7) / 8, groups = (cols + group - 1) / group;
        int8_t *q = kt_test_xmalloc((size_t)(rows * cols));
        uint8_t *packed = kt_test_xmalloc((size_t)(rows * words * 4) + 1);
        uint8_t *scales = kt_test_xmalloc((size_t)(rows * groups * 2) + 1);
        float *out = kt_test_xmalloc((size_t)cols * sizeof(float));
        for (int64_t i = 0; i < rows * cols; i++)
            q[i] = (int8_t)((int)(kt_test_rand_u64(&state) % 16) - 8);
        q[0] = -8;
        q[rows * cols - 1] = 7;
        /* odd addresses: shard data has no alignment */
        pack_int4(q, rows, cols, 0xf, packed + 1);
        for (int64_t i = 0; i < rows * groups; i++) {
            /* finite BF16 of assorted signs and magnitudes (exponent 100..150) */
            uint16_t h = (uint16_t)((kt_test_rand_u64(&state) & 0x807f) | ((100 + kt_test_rand_u64(&state) % 51) << 7));
            if (i == 1)
                h = 0x0001; /* a subnormal scale */
            memcpy(scales + 1 + i * 2, &h, 2);
        }
        int bad = 0;
        for (int64_t r = 0; r < rows; r++) {
            kt_int4_pack_row_to_f32(packed + 1, scales + 1, cols, group, r, out);
            for (int64_t c = 0; c < cols; c++) {
                uint16_t h;
                memcpy(&h, scales + 1 + (r * groups + c / group) * 2, 2);
                float want = to_f32((double)q[r * cols + c] * bf16_expected(h));
                if (!same(out[c], want) && bad++ < 5)
                    KT_CHECK(0, "%lldx%lld g%lld [%lld][%lld]: got %a want %a", (long long)rows, (long long)cols,
                             (long long)group, (long long)r, (long long)c, out[c], want);
            }
        }
        KT_CHECK(bad == 0, "%d mismatches in %lldx%lld", bad, (long long)rows, (long long)cols);
        free(q);
        free(packed);
        free(scales);
        free(out);
    }
}

/* kt_q4_0_from_int4_row: Q4_0's d * (nibble - 8) is q * scale bit for bit
 * for every scale FP16 holds exactly (normals, and subnormals from 2^-17 up
 * with their 7 BF16 mantissa bits); a scale FP16 would round (below 2^-17,
 * past 65504, not finite) or a width not a multiple of 32 is refused. */
static void int4_rows_become_q4_0_exactly_or_are_refused(void)
{
    const int64_t rows = 3, cols = 96, groups = cols / 32;
    unsigned long long state = 23;
    int8_t q[3 * 96];
    uint8_t packed[3 * 12 * 4 + 1], scales[3 * 3 * 2 + 1];
    for (int64_t i = 0; i < rows * cols; i++)
        q[i] = (int8_t)((int)(kt_test_rand_u64(&state) % 16) - 8);
    pack_int4(q, rows, cols, 0, packed + 1);
    /* BF16 scales of exponents 2^-17 .. 2^15 (biased 110 .. 142), any mantissa, either sign */
    for (int64_t i = 0; i < rows * groups; i++) {
        uint16_t h = (uint16_t)((kt_test_rand_u64(&state) & 0x807f) | ((110 + kt_test_rand_u64(&state) % 33) << 7));
        memcpy(scales + 1 + i * 2, &h, 2);
    }
    const uint16_t smallest = (uint16_t)(110u << 7 | 0x01); /* (1 + 2^-7) 2^-17: 129 FP16 subnormal steps */
    memcpy(scales + 1, &smallest, 2);
    struct kt_block_q4_0 blocks[3];
    float want[96], got[96];
    int bad = 0;
    for (int64_t r = 0; r < rows; r++) {
        const bool ok = kt_q4_0_from_int4_row(packed + 1, scales + 1, cols, r, blocks);
        KT_CHECK(ok, "row %lld refused", (long long)r);
        kt_int4_pack_row_to_f32(packed + 1, scales + 1, cols, 32, r, want);
        kt_type_traits(KT_TYPE_Q4_0)->to_float(blocks, got, cols);
        for (int64_t c = 0; ok && c < cols; c++)
            bad += !same(got[c], want[c]);
    }
    KT_CHECK(bad == 0, "%d of %lld values differ from the INT4 decoding", bad, (long long)(rows * cols));
    static const struct {
        uint16_t scale;
        const char *what;
    } refused[] = {
        {(uint16_t)(109u << 7 | 0x01), "(1 + 2^-7) 2^-18: below FP16's last bit"},
        {(uint16_t)(143u << 7), "2^16: past FP16's range"},
        {0x7f80, "infinity"},
        {0x7fc0, "NaN"},
    };
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        uint8_t s[6];
        memcpy(s, scales + 1, 6);
        memcpy(s + 2, &refused[i].scale, 2);
        KT_CHECK(!kt_q4_0_from_int4_row(packed + 1, s, cols, 0, blocks), "a scale of %s taken", refused[i].what);
    }
    KT_CHECK(!kt_q4_0_from_int4_row(packed + 1, scales + 1, 48, 0, blocks) &&
                 !kt_q4_0_from_int4_row(packed + 1, scales + 1, 0, 0, blocks),
             "widths not a positive multiple of 32 taken");
}

/* ---- FP8 with block scales --------------------------------------------------------------- */

static void fp8_block_rows_match_the_definition(void)
{
    /* rows, cols, block rows, block cols: DeepSeek's 128x128 with partial edge
     * blocks both ways, and small blocks so each row crosses many scales */
    const int64_t shapes[][4] = {{130, 200, 128, 128}, {128, 256, 128, 128}, {5, 7, 2, 3}, {1, 300, 128, 128}};
    unsigned long long state = 99;
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const int64_t rows = shapes[si][0], cols = shapes[si][1], br = shapes[si][2], bc = shapes[si][3];
        const int64_t srows = (rows + br - 1) / br, scols = (cols + bc - 1) / bc;
        uint8_t *w = kt_test_xmalloc((size_t)(rows * cols) + 3);
        uint8_t *s = kt_test_xmalloc((size_t)(srows * scols) * 4 + 3);
        float *out = kt_test_xmalloc((size_t)cols * sizeof(float));
        for (int64_t i = 0; i < rows * cols; i++)
            w[3 + i] = (uint8_t)kt_test_rand_u64(&state); /* every code, NaN ones too */
        for (int64_t i = 0; i < srows * scols; i++) {
            float f = ldexpf(1.0f + (float)(kt_test_rand_u64(&state) % 1000) / 1000.0f,
                             (int)(kt_test_rand_u64(&state) % 40) - 30);
            if (i == 0)
                f = 0x1p-140f; /* a subnormal scale */
            memcpy(s + 3 + i * 4, &f, 4);
        }
        int bad = 0;
        for (int64_t r = 0; r < rows; r++) {
            kt_fp8_block_row_to_f32(w + 3, s + 3, cols, br, bc, r, out);
            for (int64_t c = 0; c < cols; c++) {
                float scale;
                memcpy(&scale, s + 3 + ((r / br) * scols + c / bc) * 4, 4);
                /* the double product of two F32s is exact; one rounding to F32 */
                float want = to_f32(e4m3_expected(w[3 + r * cols + c]) * (double)scale);
                if (!same(out[c], want) && bad++ < 5)
                    KT_CHECK(0, "%lldx%lld [%lld][%lld]: got %a want %a", (long long)rows, (long long)cols,
                             (long long)r, (long long)c, out[c], want);
            }
        }
        KT_CHECK(bad == 0, "%d mismatches in %lldx%lld", bad, (long long)rows, (long long)cols);
        free(w);
        free(s);
        free(out);
    }
}

static void fp8_block_scale_follows_row_and_column_blocks(void)
{
    /* 3 rows x 4 cols, blocks 2x2: scales [[1, 2], [4, 8]]; every weight 1.0 (0x38) */
    const uint8_t w[12] = {0x38, 0x38, 0x38, 0x38, 0x38, 0x38, 0x38, 0x38, 0x38, 0x38, 0x38, 0x38};
    const float s[4] = {1, 2, 4, 8};
    const float want[3][4] = {{1, 1, 2, 2}, {1, 1, 2, 2}, {4, 4, 8, 8}};
    for (int r = 0; r < 3; r++) {
        float out[4];
        kt_fp8_block_row_to_f32(w, s, 4, 2, 2, r, out);
        for (int c = 0; c < 4; c++)
            KT_CHECK(out[c] == want[r][c], "[%d][%d] = %g, want %g", r, c, out[c], want[r][c]);
    }
}

/* ---- MXFP4 ---------------------------------------------------------------------------------- */

static const uint8_t k_scale_codes[] = {0, 1, 2, 100, 126, 127, 128, 200, 252, 253, 254, 255};

static void mxfp4_hf_low_nibble_is_the_even_element(void)
{
    uint8_t blocks[16] = {0x21}; /* element 0: code 1 (0.5), element 1: code 2 (1.0) */
    blocks[15] = 0xf7;          /* element 30: code 7 (6), element 31: code 15 (-6) */
    const uint8_t scale = 128;  /* x2 */
    float out[32];
    kt_mxfp4_row_to_f32(blocks, &scale, 32, 0, out);
    KT_CHECK(out[0] == 1.0f && out[1] == 2.0f, "elements 0, 1 = %g %g, want 1 2", out[0], out[1]);
    KT_CHECK(out[30] == 12.0f && out[31] == -12.0f, "elements 30, 31 = %g %g, want 12 -12", out[30], out[31]);
    for (int i = 2; i < 30; i++)
        KT_CHECK(out[i] == 0.0f, "element %d = %g, want 0", i, out[i]);
}

static void mxfp4_hf_rows_match_the_definition(void)
{
    const int64_t rows = 4, cols = 32 * (int64_t)sizeof k_scale_codes;
    const int64_t nb = cols / 32;
    unsigned long long state = 5;
    uint8_t *blocks = kt_test_xmalloc((size_t)(rows * nb * 16) + 1);
    uint8_t *scales = kt_test_xmalloc((size_t)(rows * nb) + 1);
    float *out = kt_test_xmalloc((size_t)cols * sizeof(float));
    for (int64_t i = 0; i < rows * nb * 16; i++)
        blocks[1 + i] = (uint8_t)kt_test_rand_u64(&state);
    for (int64_t i = 0; i < rows * nb; i++)
        scales[1 + i] = k_scale_codes[(i + i / nb) % sizeof k_scale_codes]; /* every code in every row position */
    int bad = 0;
    for (int64_t r = 0; r < rows; r++) {
        kt_mxfp4_row_to_f32(blocks + 1, scales + 1, cols, r, out);
        for (int64_t c = 0; c < cols; c++) {
            uint8_t byte = blocks[1 + (r * nb + c / 32) * 16 + (c % 32) / 2];
            unsigned code = c % 2 ? byte >> 4 : byte & 0xf;
            unsigned e = scales[1 + r * nb + c / 32];
            float want = e == 255 ? NAN : to_f32(e2m1_expected(code) * e8m0_expected(e));
            if (!same(out[c], want) && bad++ < 5)
                KT_CHECK(0, "[%lld][%lld] (code %u, scale %u): got %a want %a", (long long)r, (long long)c, code, e,
                         out[c], want);
        }
    }
    KT_CHECK(bad == 0, "%d mismatches", bad);
    /* a NaN scale makes zeros NaN too (OCP MX: the whole block) */
    uint8_t zeros[16] = {0};
    uint8_t nan_scale = 255;
    kt_mxfp4_row_to_f32(zeros, &nan_scale, 32, 0, out);
    for (int i = 0; i < 32; i++)
        KT_CHECK(isnan(out[i]), "NaN-scaled zero element %d = %g", i, out[i]);
    free(blocks);
    free(scales);
    free(out);
}

static void mxfp4_gguf_blocks_match_ggml(void)
{
    /* pin ggml's split: low nibble of qs[j] is element j, high nibble element j + 16 */
    struct kt_block_mxfp4 one = {.e = 128, .qs = {0x21}};
    float out[32];
    kt_mxfp4_gguf_to_f32(&one, out, 32);
    KT_CHECK(out[0] == 1.0f && out[16] == 2.0f && out[1] == 0.0f, "elements 0, 16, 1 = %g %g %g, want 1 2 0",
             out[0], out[16], out[1]);

    const int64_t nblk = (int64_t)sizeof k_scale_codes;
    unsigned long long state = 8;
    uint8_t *raw = kt_test_xmalloc((size_t)nblk * 17 + 1);
    float *all = kt_test_xmalloc((size_t)nblk * 32 * sizeof(float));
    for (int64_t b = 0; b < nblk; b++) {
        raw[1 + b * 17] = k_scale_codes[b];
        for (int j = 0; j < 16; j++)
            raw[1 + b * 17 + 1 + j] = (uint8_t)kt_test_rand_u64(&state);
    }
    kt_mxfp4_gguf_to_f32(raw + 1, all, nblk * 32);
    int bad = 0;
    for (int64_t b = 0; b < nblk; b++)
        for (int i = 0; i < 32; i++) {
            uint8_t byte = raw[1 + b * 17 + 1 + i % 16];
            unsigned code = i < 16 ? byte & 0xf : byte >> 4;
            unsigned e = raw[1 + b * 17];
            /* ggml: int8 value 2*e2m1 times 2^(e-128), for every e (255 included) */
            float want = to_f32(2.0 * e2m1_expected(code) * ldexp(1.0, (int)e - 128));
            if (!same(all[b * 32 + i], want) && bad++ < 5)
                KT_CHECK(0, "block %lld (e %u) element %d: got %a want %a", (long long)b, e, i, all[b * 32 + i], want);
        }
    KT_CHECK(bad == 0, "%d mismatches", bad);
    free(raw);
    free(all);
}

/* ---- BF16 ------------------------------------------------------------------------------------- */

static void bf16_rows_widen_exactly(void)
{
    const uint16_t h[6] = {0x3f80, 0xc000, 0x0001, 0x7f80, 0x7fc1, 0x8000}; /* 1, -2, subnormal, inf, NaN, -0 */
    uint8_t raw[2 * 6 * 2 + 1];
    for (int i = 0; i < 12; i++) {
        uint16_t v = (uint16_t)(h[i % 6] ^ (i >= 6 ? 0x0010 : 0));
        memcpy(raw + 1 + i * 2, &v, 2);
    }
    for (int r = 0; r < 2; r++) {
        float out[6];
        kt_bf16_row_to_f32(raw + 1, 6, r, out);
        for (int c = 0; c < 6; c++) {
            uint32_t want = (uint32_t)(h[c] ^ (r ? 0x0010 : 0)) << 16;
            KT_CHECK(bits_of(out[c]) == want, "[%d][%d]: bits %08x want %08x", r, c, bits_of(out[c]), want);
        }
    }
}

/* ---- encoders ------------------------------------------------------------------------- */

/* The E4M3 code nearest x by search over every finite code, ties to the even
 * code (mantissa lsb 0), saturating at 448; computed in double. */
static uint8_t e4m3_nearest(float x)
{
    if (isnan(x))
        return 0x7f;
    const uint8_t sign = signbit(x) ? 0x80 : 0;
    const double a = fabs((double)x);
    if (a >= 448.0)
        return sign | 0x7e;
    unsigned best = 0;
    for (unsigned code = 1; code <= 0x7e; code++) {
        const double d = fabs(e4m3_expected(code) - a), db = fabs(e4m3_expected(best) - a);
        if (d < db || (d == db && (code & 1) == 0))
            best = code;
    }
    return sign | (uint8_t)best;
}

static int e4m3_mismatches;

static void check_e4m3(float x)
{
    const uint8_t got = kt_f32_to_fp8_e4m3(x), want = e4m3_nearest(x);
    if (got != want && e4m3_mismatches++ < 8)
        KT_CHECK(got == want, "x %a: code 0x%02x, nearest 0x%02x", (double)x, got, want);
}

static void fp8_e4m3_encoder_rounds_to_the_nearest_code_ties_to_even(void)
{
    e4m3_mismatches = 0;
    for (unsigned code = 0; code < 256; code++) {
        if ((code & 0x7f) == 0x7f)
            continue;
        const float v = (float)e4m3_expected(code);
        KT_CHECK(kt_f32_to_fp8_e4m3(v) == code, "code 0x%02x does not encode back (0x%02x)", code,
                 kt_f32_to_fp8_e4m3(v));
        if ((code & 0x7f) == 0x7e)
            continue;
        /* the midpoint to the next magnitude (exact in F32) is a tie; its neighbours are not */
        const float mid = (float)((e4m3_expected(code) + e4m3_expected(code + 1)) / 2);
        const uint8_t even = (code & 1) ? (uint8_t)(code + 1) : (uint8_t)code;
        KT_CHECK(kt_f32_to_fp8_e4m3(mid) == even, "tie %a after 0x%02x: 0x%02x, want the even 0x%02x", (double)mid,
                 code, kt_f32_to_fp8_e4m3(mid), even);
        check_e4m3(mid);
        check_e4m3(nextafterf(mid, 0.0f));
        check_e4m3(nextafterf(mid, mid * 2.0f));
    }
    /* every 251st F32 from 2^-12 to 512, both signs: subnormals, normals, saturation */
    for (uint32_t u = 0x39800000u; u <= 0x44000000u; u += 251) {
        float x;
        memcpy(&x, &u, sizeof x);
        check_e4m3(x);
        check_e4m3(-x);
    }
    const float special[] = {0.0f, -0.0f, 0x1p-10f, 0x1p-11f, 0x1.8p-10f, 1e-30f, 448.0f, 464.0f, 479.9f, 480.0f,
                             1e9f, INFINITY, -INFINITY, NAN, FLT_MIN, FLT_TRUE_MIN};
    for (size_t i = 0; i < sizeof special / sizeof special[0]; i++) {
        check_e4m3(special[i]);
        check_e4m3(-special[i]);
    }
    KT_CHECK(e4m3_mismatches == 0, "%d inputs encode to another code than the nearest", e4m3_mismatches);
    KT_CHECK(kt_f32_to_fp8_e4m3(1e9f) == 0x7e && kt_f32_to_fp8_e4m3(-INFINITY) == 0xfe &&
                 kt_f32_to_fp8_e4m3(NAN) == 0x7f && kt_f32_to_fp8_e4m3(0x1p-10f) == 0x00 &&
                 kt_f32_to_fp8_e4m3(0x1.8p-10f) == 0x01,
             "saturation, NaN, or the subnormal ties");
}

/* Deterministic test values: a small LCG, uniform in [-amp, amp). */
static float lcg_value(uint64_t *state, float amp)
{
    *state = *state * 6364136223846793005ULL + 1442695040888963407ULL;
    return amp * ((float)(*state >> 40) / (float)(1u << 24) * 2.0f - 1.0f);
}

static void fp8_block_stripe_encoder_meets_its_bound(void)
{
    enum { ROWS = 5, COLS = 300, BC = 128, NB = 3 };
    static float w[ROWS * COLS];
    uint64_t st = 7;
    for (int i = 0; i < ROWS * COLS; i++)
        w[i] = lcg_value(&st, (i % COLS) < BC ? 0.05f : 3.0f); /* blocks of different scales */
    for (int r = 0; r < ROWS; r++) /* the last (partial) block all zero, one tiny value aside */
        for (int c = 2 * BC; c < COLS; c++)
            w[r * COLS + c] = 0.0f;
    w[3 * COLS + 299] = 0x1p-20f;
    w[1 * COLS + 5] = 0.0f;
    static uint8_t q[ROWS * COLS];
    float s[NB];
    kt_fp8_block_stripe_from_f32(w, ROWS, COLS, BC, q, s);
    for (int j = 0; j < NB; j++) {
        float amax = 0;
        for (int r = 0; r < ROWS; r++)
            for (int c = j * BC; c < COLS && c < (j + 1) * BC; c++)
                amax = fmaxf(amax, fabsf(w[r * COLS + c]));
        KT_CHECK(s[j] == amax / 448.0f, "block %d: scale_inv %g, want max %g / 448", j, (double)s[j], (double)amax);
    }
    float row[COLS];
    int bad = 0;
    for (int r = 0; r < ROWS; r++) {
        kt_fp8_block_row_to_f32(q, s, COLS, 128, BC, r, row);
        for (int c = 0; c < COLS; c++) {
            const float x = w[r * COLS + c], sc = s[c / BC];
            const double bound = sc * fmax(fabs((double)x / sc) / 16, 0x1p-10) + fabs((double)x) * 0x1p-22;
            if (q[r * COLS + c] != kt_f32_to_fp8_e4m3(x / sc) || fabs((double)row[c] - x) > bound)
                KT_CHECK(bad++ > 4, "[%d][%d]: %g decodes to %g (bound %g)", r, c, (double)x, (double)row[c], bound);
        }
    }
    KT_CHECK(bad == 0, "%d elements off", bad);
    /* an all-zero block stores scale 1 */
    float zeros[4 * 8] = {0}, one;
    uint8_t zq[4 * 8];
    kt_fp8_block_stripe_from_f32(zeros, 4, 8, 8, zq, &one);
    KT_CHECK(one == 1.0f && zq[0] == 0 && zq[31] == 0, "all-zero block: scale %g", (double)one);
}

static void int4_pack_encoder_round_trips_within_half_a_scale(void)
{
    enum { COLS = 77, GS = 32, GROUPS = 3, WORDS = 10 };
    float w[COLS];
    uint64_t st = 99;
    for (int c = 0; c < COLS; c++)
        w[c] = lcg_value(&st, c < GS ? 0.01f : 2.0f);
    for (int c = GS; c < 2 * GS; c++) /* the second group: exact multiples of its scale, ties included */
        w[c] = (float)((c % 16) - 8) * 0.25f + ((c % 3) == 0 ? 0.125f : 0.0f);
    w[2 * GS + 1] = -w[2 * GS + 1] * 4; /* a negative extreme decides a group's scale */
    uint8_t packed[WORDS * 4 + 1], scales[GROUPS * 2 + 1];
    kt_int4_pack_row_from_f32(w, COLS, GS, packed + 1, scales + 1); /* odd addresses */
    float out[COLS];
    kt_int4_pack_row_to_f32(packed + 1, scales + 1, COLS, GS, 0, out);
    for (int g = 0; g < GROUPS; g++) {
        float amax = 0;
        for (int c = g * GS; c < COLS && c < (g + 1) * GS; c++)
            amax = fmaxf(amax, fabsf(w[c]));
        uint16_t h;
        memcpy(&h, scales + 1 + 2 * g, 2);
        const double scale = bf16_expected(h), want = (double)amax / 7;
        KT_CHECK(fabs(scale - want) <= want * 0x1p-9, "group %d: scale %g, want BF16 of %g", g, scale, want);
        for (int c = g * GS; c < COLS && c < (g + 1) * GS; c++) {
            uint32_t word;
            memcpy(&word, packed + 1 + 4 * (c / 8), 4);
            const int q = (int)((word >> (4 * (c % 8))) & 15) - 8;
            double x = w[c] / (float)scale, rq = nearbyint(x); /* F32 division as the encoder; ties to even */
            rq = fmin(fmax(rq, -8), 7);
            KT_CHECK(q == (int)rq, "[%d]: q %d, want round(%g) = %g", c, q, x, rq);
            KT_CHECK(out[c] == (float)(q * scale), "[%d]: decoded %g is not q * scale", c, (double)out[c]);
            KT_CHECK(fabs((double)out[c] - w[c]) <= scale / 2 * (1 + 0x1p-20) &&
                         fabs((double)out[c] - w[c]) <= amax / 14.0 * (1 + 0x1p-8),
                     "[%d]: |%g - %g| above half a scale (%g)", c, (double)w[c], (double)out[c], scale);
        }
    }
    uint32_t last;
    memcpy(&last, packed + 1 + 4 * (WORDS - 1), 4);
    KT_CHECK((last >> 20) == 0, "padding nibbles past column %d are not 0: word %08x", COLS, last);
}

int main(void)
{
    KT_RUN(fp8_e4m3_all_256_codes_match_the_ofp8_definition);
    KT_RUN(e2m1_all_16_codes_match_the_mx_definition);
    KT_RUN(e8m0_all_256_codes_match_the_mx_definition);
    KT_RUN(int4_pack_nibble_order_is_low_nibble_first_offset_8);
    KT_RUN(int4_pack_rows_match_the_definition);
    KT_RUN(int4_rows_become_q4_0_exactly_or_are_refused);
    KT_RUN(fp8_block_rows_match_the_definition);
    KT_RUN(fp8_block_scale_follows_row_and_column_blocks);
    KT_RUN(mxfp4_hf_low_nibble_is_the_even_element);
    KT_RUN(mxfp4_hf_rows_match_the_definition);
    KT_RUN(mxfp4_gguf_blocks_match_ggml);
    KT_RUN(bf16_rows_widen_exactly);
    KT_RUN(fp8_e4m3_encoder_rounds_to_the_nearest_code_ties_to_even);
    KT_RUN(fp8_block_stripe_encoder_meets_its_bound);
    KT_RUN(int4_pack_encoder_round_trips_within_half_a_scale);
    return kt_test_finish();
}
