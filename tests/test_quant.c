/*
 * test_quant.c - the quant formats: traits table, fp16/bf16 conversion,
 * dequantization of hand-built blocks, quantize -> dequantize error bounds and
 * the scalar reference dot products.
 *
 * Expected values here come from the GGUF layout written out by hand (or from
 * plain arithmetic on the input), never from calling the code under test a
 * second way.  This program must never time-assert: the one throughput figure
 * it prints is information, not a check.
 */
#include "testlib.h"

#include "quant.h"

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---------------------------------------------------------------------------- */
/* helpers                                                                       */
/* ---------------------------------------------------------------------------- */

static float from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static uint32_t to_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

/* Dequantizes n elements of a row through the traits table. */
static void dequant(int type, const void *q, float *y, int64_t n)
{
    kt_type_traits(type)->to_float(q, y, n);
}

/* The types kt computes with: to_float and from_float both present. */
static const int computed_types[] = {
    KT_TYPE_F32, KT_TYPE_F16, KT_TYPE_BF16, KT_TYPE_Q4_0, KT_TYPE_Q4_1, KT_TYPE_Q5_0, KT_TYPE_Q5_1,
    KT_TYPE_Q8_0, KT_TYPE_Q8_1, KT_TYPE_Q4_K, KT_TYPE_Q5_K, KT_TYPE_Q6_K, KT_TYPE_Q8_K,
};
#define N_COMPUTED (int)(sizeof computed_types / sizeof computed_types[0])

/* ---------------------------------------------------------------------------- */
/* traits table                                                                  */
/* ---------------------------------------------------------------------------- */

/* Written from gguf-py GGML_QUANT_SIZES / ggml-common.h, not from quant.c. */
static const struct {
    int type;
    const char *name;
    int64_t elems;
    size_t bytes;
} ggml_sizes[] = {
    {KT_TYPE_F32, "f32", 1, 4},           {KT_TYPE_F16, "f16", 1, 2},
    {KT_TYPE_Q4_0, "q4_0", 32, 18},       {KT_TYPE_Q4_1, "q4_1", 32, 20},
    {KT_TYPE_Q5_0, "q5_0", 32, 22},       {KT_TYPE_Q5_1, "q5_1", 32, 24},
    {KT_TYPE_Q8_0, "q8_0", 32, 34},       {KT_TYPE_Q8_1, "q8_1", 32, 36},
    {KT_TYPE_Q2_K, "q2_K", 256, 84},      {KT_TYPE_Q3_K, "q3_K", 256, 110},
    {KT_TYPE_Q4_K, "q4_K", 256, 144},     {KT_TYPE_Q5_K, "q5_K", 256, 176},
    {KT_TYPE_Q6_K, "q6_K", 256, 210},     {KT_TYPE_Q8_K, "q8_K", 256, 292},
    {KT_TYPE_IQ2_XXS, "iq2_xxs", 256, 66}, {KT_TYPE_IQ2_XS, "iq2_xs", 256, 74},
    {KT_TYPE_IQ3_XXS, "iq3_xxs", 256, 98}, {KT_TYPE_IQ1_S, "iq1_s", 256, 50},
    {KT_TYPE_IQ4_NL, "iq4_nl", 32, 18},   {KT_TYPE_IQ3_S, "iq3_s", 256, 110},
    {KT_TYPE_IQ2_S, "iq2_s", 256, 82},    {KT_TYPE_IQ4_XS, "iq4_xs", 256, 136},
    {KT_TYPE_I8, "i8", 1, 1},             {KT_TYPE_I16, "i16", 1, 2},
    {KT_TYPE_I32, "i32", 1, 4},           {KT_TYPE_I64, "i64", 1, 8},
    {KT_TYPE_F64, "f64", 1, 8},           {KT_TYPE_IQ1_M, "iq1_m", 256, 56},
    {KT_TYPE_BF16, "bf16", 1, 2},         {KT_TYPE_TQ1_0, "tq1_0", 256, 54},
    {KT_TYPE_TQ2_0, "tq2_0", 256, 66},    {KT_TYPE_MXFP4, "mxfp4", 32, 17},
    {KT_TYPE_FP8_B128, "fp8_b128", 128, 132}, /* kt-internal: no GGUF file holds it */
};
#define N_GGML_SIZES (int)(sizeof ggml_sizes / sizeof ggml_sizes[0])

static void traits_table_matches_ggml_sizes(void)
{
    for (int i = 0; i < N_GGML_SIZES; i++) {
        const struct kt_type_traits *t = kt_type_traits(ggml_sizes[i].type);
        KT_CHECK(t != NULL, "type %d has no traits", ggml_sizes[i].type);
        if (!t)
            continue;
        KT_CHECK(strcmp(t->name, ggml_sizes[i].name) == 0, "type %d named %s", ggml_sizes[i].type, t->name);
        KT_CHECK(t->block_elems == ggml_sizes[i].elems, "%s block_elems %lld", t->name, (long long)t->block_elems);
        KT_CHECK(t->block_bytes == ggml_sizes[i].bytes, "%s block_bytes %zu", t->name, t->block_bytes);
        KT_CHECK(t->is_quantized == (t->block_elems > 1), "%s is_quantized %d", t->name, t->is_quantized);
        KT_CHECK(kt_type_traits(t->vec_dot_type) != NULL, "%s vec_dot_type %d unknown", t->name, t->vec_dot_type);
    }
    /* the C structs agree with the table */
    KT_CHECK(sizeof(struct kt_block_q4_0) == kt_type_traits(KT_TYPE_Q4_0)->block_bytes, "q4_0 struct");
    KT_CHECK(sizeof(struct kt_block_q5_1) == kt_type_traits(KT_TYPE_Q5_1)->block_bytes, "q5_1 struct");
    KT_CHECK(sizeof(struct kt_block_q8_1) == kt_type_traits(KT_TYPE_Q8_1)->block_bytes, "q8_1 struct");
    KT_CHECK(sizeof(struct kt_block_q4_K) == kt_type_traits(KT_TYPE_Q4_K)->block_bytes, "q4_K struct");
    KT_CHECK(sizeof(struct kt_block_q6_K) == kt_type_traits(KT_TYPE_Q6_K)->block_bytes, "q6_K struct");
    KT_CHECK(sizeof(struct kt_block_q8_K) == kt_type_traits(KT_TYPE_Q8_K)->block_bytes, "q8_K struct");
}

static void unknown_type_ids_have_no_traits(void)
{
    int known = 0;
    for (int id = -5; id < KT_TYPE_COUNT + 20; id++) {
        bool listed = false;
        for (int i = 0; i < N_GGML_SIZES; i++)
            listed |= ggml_sizes[i].type == id;
        known += listed;
        KT_CHECK((kt_type_traits(id) != NULL) == listed, "id %d: traits %p, listed %d", id,
                 (const void *)kt_type_traits(id), listed);
        if (!listed)
            KT_CHECK(strcmp(kt_type_name(id), "unknown") == 0, "id %d named %s", id, kt_type_name(id));
    }
    KT_CHECK(known == N_GGML_SIZES, "%d known ids", known);
    KT_CHECK(kt_type_traits(4) == NULL && kt_type_traits(5) == NULL, "ids 4 and 5 are unused");
    KT_CHECK(kt_type_traits(1 << 30) == NULL, "huge id");
}

static void computed_types_have_math_and_dot_products(void)
{
    static const struct {
        int type, vec_dot_type;
        bool has_dot;
    } want[] = {
        {KT_TYPE_F32, KT_TYPE_F32, true},   {KT_TYPE_F16, KT_TYPE_F32, true},   {KT_TYPE_BF16, KT_TYPE_F32, true},
        {KT_TYPE_Q4_0, KT_TYPE_Q8_0, true}, {KT_TYPE_Q5_0, KT_TYPE_Q8_0, true}, {KT_TYPE_Q8_0, KT_TYPE_Q8_0, true},
        {KT_TYPE_Q4_1, KT_TYPE_Q8_1, true}, {KT_TYPE_Q5_1, KT_TYPE_Q8_1, true}, {KT_TYPE_Q4_K, KT_TYPE_Q8_K, true},
        {KT_TYPE_Q5_K, KT_TYPE_Q8_K, true}, {KT_TYPE_Q6_K, KT_TYPE_Q8_K, true}, {KT_TYPE_Q8_1, KT_TYPE_Q8_1, false},
        {KT_TYPE_Q8_K, KT_TYPE_Q8_K, false}, {KT_TYPE_MXFP4, KT_TYPE_Q8_0, true}, {KT_TYPE_FP8_B128, KT_TYPE_F32, true},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        const struct kt_type_traits *t = kt_type_traits(want[i].type);
        KT_CHECK(t->to_float != NULL && t->from_float != NULL, "%s lacks to/from_float", t->name);
        KT_CHECK(t->vec_dot_type == (enum kt_type)want[i].vec_dot_type, "%s vec_dot_type %d", t->name,
                 t->vec_dot_type);
        KT_CHECK((t->vec_dot != NULL) == want[i].has_dot, "%s vec_dot %s", t->name, t->vec_dot ? "set" : "NULL");
    }
    /* types whose math kt does not implement say so with NULL */
    KT_CHECK(kt_type_traits(KT_TYPE_Q2_K)->to_float == NULL, "q2_K to_float");
    KT_CHECK(kt_type_traits(KT_TYPE_IQ4_XS)->vec_dot == NULL, "iq4_xs vec_dot");
}

static void type_names_round_trip_case_insensitively(void)
{
    for (int i = 0; i < N_GGML_SIZES; i++) {
        const char *name = ggml_sizes[i].name;
        KT_CHECK(strcmp(kt_type_name(ggml_sizes[i].type), name) == 0, "name of %d", ggml_sizes[i].type);
        KT_CHECK(kt_type_from_name(name) == ggml_sizes[i].type, "%s -> %d", name, kt_type_from_name(name));
        char upper[32];
        size_t k = 0;
        for (; name[k] && k + 1 < sizeof upper; k++)
            upper[k] = (char)(name[k] >= 'a' && name[k] <= 'z' ? name[k] - 32 : name[k]);
        upper[k] = 0;
        KT_CHECK(kt_type_from_name(upper) == ggml_sizes[i].type, "%s -> %d", upper, kt_type_from_name(upper));
    }
    KT_CHECK(kt_type_from_name("Q4_k") == KT_TYPE_Q4_K, "Q4_k");
    KT_CHECK(kt_type_from_name("Bf16") == KT_TYPE_BF16, "Bf16");
    KT_CHECK(kt_type_from_name("q4_K_M") == -1, "a file type is not a tensor type");
    KT_CHECK(kt_type_from_name("q4") == -1, "a prefix is not a name");
    KT_CHECK(kt_type_from_name("f32 ") == -1, "trailing space");
    KT_CHECK(kt_type_from_name("") == -1, "empty");
    KT_CHECK(kt_type_from_name(NULL) == -1, "NULL");
    KT_CHECK(strcmp(kt_type_name(KT_TYPE_Q4_K), "q4_K") == 0, "ggml spells K upper-case");
}

static void row_bytes_count_whole_blocks_only(void)
{
    KT_CHECK(kt_type_row_bytes(KT_TYPE_Q4_K, 7168) == 28 * 144, "q4_K 7168: %zu", kt_type_row_bytes(KT_TYPE_Q4_K, 7168));
    KT_CHECK(kt_type_row_bytes(KT_TYPE_Q5_0, 128) == 4 * 22, "q5_0 128");
    KT_CHECK(kt_type_row_bytes(KT_TYPE_Q8_0, 96) == 3 * 34, "q8_0 96");
    KT_CHECK(kt_type_row_bytes(KT_TYPE_F32, 7) == 28, "f32 7");
    KT_CHECK(kt_type_row_bytes(KT_TYPE_BF16, 3) == 6, "bf16 3");
    KT_CHECK(kt_type_row_bytes(KT_TYPE_MXFP4, 64) == 34, "mxfp4 64");
    KT_CHECK(kt_type_row_bytes(KT_TYPE_Q4_K, 100) == 0, "partial super-block");
    KT_CHECK(kt_type_row_bytes(KT_TYPE_Q4_0, 33) == 0, "partial block");
    KT_CHECK(kt_type_row_bytes(KT_TYPE_Q4_0, -32) == 0, "negative n");
    KT_CHECK(kt_type_row_bytes(4, 32) == 0, "unused id");
    KT_CHECK(kt_type_row_bytes(KT_TYPE_COUNT, 32) == 0, "id past the table");
}

/* ---------------------------------------------------------------------------- */
/* fp16 / bf16                                                                   */
/* ---------------------------------------------------------------------------- */

static void fp16_edge_cases_convert_exactly(void)
{
    static const struct {
        uint32_t f32; /* input bits */
        uint16_t f16; /* expected */
    } cases[] = {
        {0x00000000, 0x0000}, /* +0 */
        {0x80000000, 0x8000}, /* -0 */
        {0x3f800000, 0x3c00}, /* 1 */
        {0xc0000000, 0xc000}, /* -2 */
        {0x3eaaaaab, 0x3555}, /* 1/3 */
        {0x477fe000, 0x7bff}, /* 65504, the largest half */
        {0x477fefff, 0x7bff}, /* just below 65520 */
        {0x477ff000, 0x7c00}, /* 65520: tie with 65536 -> even -> inf */
        {0x49742400, 0x7c00}, /* 1e6 overflows */
        {0xc9742400, 0xfc00}, /* -1e6 */
        {0x7f800000, 0x7c00}, /* inf */
        {0xff800000, 0xfc00}, /* -inf */
        {0x7f7fffff, 0x7c00}, /* FLT_MAX */
        {0x33800000, 0x0001}, /* 2^-24, smallest subnormal */
        {0x33000000, 0x0000}, /* 2^-25: tie between 0 and 2^-24 -> 0 */
        {0x33000001, 0x0001}, /* just above 2^-25 */
        {0xb3000000, 0x8000}, /* -2^-25 -> -0 */
        {0x33c00000, 0x0002}, /* 1.5 * 2^-24: tie 1|2 -> 2 */
        {0x34200000, 0x0002}, /* 2.5 * 2^-24: tie 2|3 -> 2 */
        {0x387fc000, 0x03ff}, /* 1023 * 2^-24, largest subnormal */
        {0x387fe000, 0x0400}, /* 1023.5 * 2^-24: tie -> even = smallest normal */
        {0x38800000, 0x0400}, /* 2^-14 */
        {0x3f801000, 0x3c00}, /* 1 + 2^-11: tie -> even 1 */
        {0x3f803000, 0x3c02}, /* 1 + 3*2^-11: tie -> even 1 + 2^-9 */
        {0x3f801001, 0x3c01}, /* just above the tie */
        {0x45001000, 0x6800}, /* 2049 -> 2048 */
        {0x45003000, 0x6802}, /* 2051 -> 2052 */
        {0x00000001, 0x0000}, /* f32 subnormal -> 0 */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const uint16_t h = kt_fp32_to_fp16(from_bits(cases[i].f32));
        KT_CHECK(h == cases[i].f16, "f32 0x%08x -> f16 0x%04x, want 0x%04x", cases[i].f32, h, cases[i].f16);
    }
    KT_CHECK(kt_fp16_to_fp32(0x0001) == ldexpf(1.0f, -24), "smallest subnormal");
    KT_CHECK(kt_fp16_to_fp32(0x03ff) == ldexpf(1023.0f, -24), "largest subnormal");
    KT_CHECK(kt_fp16_to_fp32(0x8001) == -ldexpf(1.0f, -24), "negative subnormal");
    KT_CHECK(kt_fp16_to_fp32(0x0400) == ldexpf(1.0f, -14), "smallest normal");
    KT_CHECK(kt_fp16_to_fp32(0x7bff) == 65504.0f, "largest half");
    KT_CHECK(kt_fp16_to_fp32(0x3c01) == 1.0f + ldexpf(1.0f, -10), "1 + ulp");
    KT_CHECK(isinf(kt_fp16_to_fp32(0x7c00)) && kt_fp16_to_fp32(0x7c00) > 0, "inf");
    KT_CHECK(isinf(kt_fp16_to_fp32(0xfc00)) && kt_fp16_to_fp32(0xfc00) < 0, "-inf");
    KT_CHECK(to_bits(kt_fp16_to_fp32(0x8000)) == 0x80000000u, "-0 keeps its sign");
    KT_CHECK(isnan(kt_fp16_to_fp32(0x7e00)) && isnan(kt_fp16_to_fp32(0x7c01)), "NaN halves read as NaN");

    /* NaN stays NaN, sign kept, even when the payload would be cut away */
    const uint32_t nans[] = {0x7fc00000, 0x7f800001, 0xffc00000, 0x7fbfffff};
    for (size_t i = 0; i < sizeof nans / sizeof nans[0]; i++) {
        const uint16_t h = kt_fp32_to_fp16(from_bits(nans[i]));
        KT_CHECK((h & 0x7c00) == 0x7c00 && (h & 0x03ff) != 0, "NaN 0x%08x -> 0x%04x", nans[i], h);
        KT_CHECK((h >> 15) == (nans[i] >> 31), "NaN 0x%08x sign", nans[i]);
    }
}

/* Every half reads as the value its fields define and converts back to itself. */
static void fp16_every_half_round_trips(void)
{
    int bad_value = 0, bad_trip = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        const float f = kt_fp16_to_fp32((kt_fp16)h);
        const uint32_t exp = (h >> 10) & 31, mant = h & 1023;
        const double sign = (h & 0x8000) ? -1.0 : 1.0;
        if (exp == 31) {
            bad_value += mant ? !isnan(f) : !(isinf(f) && (f > 0) == (sign > 0));
            bad_trip += mant ? !(isnan(kt_fp16_to_fp32(kt_fp32_to_fp16(f)))) : kt_fp32_to_fp16(f) != h;
            continue;
        }
        const double want = exp == 0 ? sign * ldexp((double)mant, -24) : sign * ldexp(1024.0 + mant, (int)exp - 25);
        bad_value += (double)f != want || (h == 0x8000 && !signbit(f));
        bad_trip += kt_fp32_to_fp16(f) != h;
    }
    KT_CHECK(bad_value == 0, "%d halves read wrong", bad_value);
    KT_CHECK(bad_trip == 0, "%d halves do not round trip", bad_trip);
}

/* On random finite floats the chosen half is the nearest, ties to even mantissa. */
static void fp16_rounds_to_nearest_even(void)
{
    unsigned long long rng = 12345;
    int bad = 0;
    for (int i = 0; i < 400000; i++) {
        const unsigned long long r = kt_test_rand_u64(&rng);
        const uint32_t exp = 100 + (uint32_t)(r % 43); /* 2^-27 .. 2^15 */
        uint32_t mant = (uint32_t)(r >> 8) & 0x7fffff;
        if (i % 4 == 0) /* bias toward ties and near-ties */
            mant = (mant & ~0x1fffu) | 0x1000u | (uint32_t)((r >> 40) & 1);
        const uint32_t bits = (uint32_t)((r >> 63) << 31) | exp << 23 | mant;
        const float f = from_bits(bits);
        if (fabsf(f) >= 65520.0f)
            continue;
        const uint16_t h = kt_fp32_to_fp16(f);
        const uint16_t mag = h & 0x7fff;
        const double err = fabs((double)kt_fp16_to_fp32(h) - f);
        for (int step = -1; step <= 1; step += 2) {
            const int nm = (int)mag + step;
            if (nm < 0 || nm > 0x7bff)
                continue;
            const uint16_t nh = (uint16_t)((h & 0x8000) | nm);
            const double nerr = fabs((double)kt_fp16_to_fp32(nh) - f);
            if (nerr < err || (nerr == err && (h & 1)))
                bad++;
        }
    }
    KT_CHECK(bad == 0, "%d conversions not nearest-even", bad);
}

static void bf16_edge_cases_convert_exactly(void)
{
    static const struct {
        uint32_t f32;
        uint16_t bf16;
    } cases[] = {
        {0x3f800000, 0x3f80}, /* 1 */
        {0x80000000, 0x8000}, /* -0 */
        {0x3f808000, 0x3f80}, /* tie, lsb even: down */
        {0x3f818000, 0x3f82}, /* tie, lsb odd: up */
        {0x3f808001, 0x3f81}, /* above the tie */
        {0x3f807fff, 0x3f80}, /* below the tie */
        {0x7f7fffff, 0x7f80}, /* FLT_MAX rounds to inf */
        {0x7f7f7fff, 0x7f7f}, /* largest that stays finite */
        {0x7f800000, 0x7f80}, /* inf */
        {0xff800000, 0xff80}, /* -inf */
        {0x00018000, 0x0002}, /* subnormal tie, odd: up */
        {0x00008000, 0x0000}, /* subnormal tie, even: down */
        {0x80008000, 0x8000}, /* negative subnormal tie -> -0 */
        {0xffc00000, 0xffc0}, /* -qNaN */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const uint16_t b = kt_fp32_to_bf16(from_bits(cases[i].f32));
        KT_CHECK(b == cases[i].bf16, "f32 0x%08x -> bf16 0x%04x, want 0x%04x", cases[i].f32, b, cases[i].bf16);
    }
    /* a signaling NaN whose payload sits in the dropped half stays a (quiet) NaN */
    const uint16_t snan = kt_fp32_to_bf16(from_bits(0x7f800001));
    KT_CHECK((snan & 0x7f80) == 0x7f80 && (snan & 0x40), "sNaN -> 0x%04x", snan);
    KT_CHECK(to_bits(kt_bf16_to_fp32(0x3f80)) == 0x3f800000u, "bf16 1");
    KT_CHECK(to_bits(kt_bf16_to_fp32(0xc2f7)) == 0xc2f70000u, "bf16 is the top half");
    KT_CHECK(to_bits(kt_bf16_to_fp32(0x0001)) == 0x00010000u, "bf16 subnormal");
    KT_CHECK(isnan(kt_bf16_to_fp32(0x7fc0)), "bf16 NaN");
}

/* ---------------------------------------------------------------------------- */
/* hand-built blocks                                                             */
/* ---------------------------------------------------------------------------- */

/* fp16 bit patterns of the scales used below */
#define H_0_125 0x3000
#define H_0_25 0x3400
#define H_0_5 0x3800
#define H_1 0x3c00
#define H_2 0x4000
#define H_MINUS_1 0xbc00

static void q4_0_block_dequantizes_as_spec(void)
{
    struct kt_block_q4_0 b = {.d = H_0_5};
    for (int j = 0; j < 16; j++)
        b.qs[j] = (uint8_t)(j | (15 - j) << 4);
    float y[32];
    dequant(KT_TYPE_Q4_0, &b, y, 32);
    /* element j: low nibble j, element j+16: high nibble 15-j; x = 0.5*(q-8) */
    KT_CHECK(y[0] == -4.0f && y[15] == 3.5f && y[16] == 3.5f && y[31] == -4.0f, "%g %g %g %g", y[0], y[15], y[16],
             y[31]);
    int bad = 0;
    for (int j = 0; j < 16; j++)
        bad += y[j] != 0.5f * (j - 8) || y[j + 16] != 0.5f * (7 - j);
    KT_CHECK(bad == 0, "%d q4_0 values wrong", bad);
}

static void q4_1_block_dequantizes_as_spec(void)
{
    struct kt_block_q4_1 b = {.d = H_0_25, .m = H_MINUS_1};
    for (int j = 0; j < 16; j++)
        b.qs[j] = (uint8_t)(j | (15 - j) << 4);
    float y[32];
    dequant(KT_TYPE_Q4_1, &b, y, 32);
    KT_CHECK(y[0] == -1.0f && y[15] == 2.75f && y[16] == 2.75f && y[31] == -1.0f, "%g %g %g %g", y[0], y[15], y[16],
             y[31]);
    int bad = 0;
    for (int j = 0; j < 16; j++)
        bad += y[j] != 0.25f * j - 1.0f || y[j + 16] != 0.25f * (15 - j) - 1.0f;
    KT_CHECK(bad == 0, "%d q4_1 values wrong", bad);
}

/* 5-bit values v[0..31] -> qs nibbles + qh bits (little-endian u32, bit j = bit 4 of element j) */
static void pack_q5(const int v[32], uint8_t qs[16], uint8_t qh[4])
{
    uint32_t h = 0;
    for (int j = 0; j < 16; j++) {
        qs[j] = (uint8_t)((v[j] & 15) | (v[j + 16] & 15) << 4);
        h |= (uint32_t)(v[j] >> 4) << j | (uint32_t)(v[j + 16] >> 4) << (j + 16);
    }
    qh[0] = (uint8_t)h, qh[1] = (uint8_t)(h >> 8), qh[2] = (uint8_t)(h >> 16), qh[3] = (uint8_t)(h >> 24);
}

static void q5_0_block_with_high_bits_dequantizes_as_spec(void)
{
    /* literal: qs all zero; qh bytes 01 00 01 80 set bit 0 (element 0), bit 16
     * (element 16) and bit 31 (element 31): those read d*(16-16) = 0, all others d*(0-16) */
    struct kt_block_q5_0 lit = {.d = H_2, .qh = {0x01, 0x00, 0x01, 0x80}};
    float y[32];
    dequant(KT_TYPE_Q5_0, &lit, y, 32);
    KT_CHECK(y[0] == 0.0f && y[16] == 0.0f && y[31] == 0.0f, "%g %g %g", y[0], y[16], y[31]);
    KT_CHECK(y[1] == -32.0f && y[15] == -32.0f && y[17] == -32.0f && y[30] == -32.0f, "%g %g %g %g", y[1], y[15],
             y[17], y[30]);

    int v[32];
    for (int j = 0; j < 32; j++)
        v[j] = (7 * j + 3) % 32; /* half of them >= 16: high bit set */
    struct kt_block_q5_0 b = {.d = H_2};
    pack_q5(v, b.qs, b.qh);
    dequant(KT_TYPE_Q5_0, &b, y, 32);
    KT_CHECK(y[0] == -26.0f && y[3] == 16.0f, "v0=3 -> %g, v3=24 -> %g", y[0], y[3]);
    int bad = 0;
    for (int j = 0; j < 32; j++)
        bad += y[j] != 2.0f * (v[j] - 16);
    KT_CHECK(bad == 0, "%d q5_0 values wrong", bad);
}

static void q5_1_block_with_high_bits_dequantizes_as_spec(void)
{
    int v[32];
    for (int j = 0; j < 32; j++)
        v[j] = (11 * j + 5) % 32;
    struct kt_block_q5_1 b = {.d = H_0_5, .m = H_1};
    pack_q5(v, b.qs, b.qh);
    float y[32];
    dequant(KT_TYPE_Q5_1, &b, y, 32);
    KT_CHECK(y[0] == 3.5f && y[1] == 9.0f, "%g %g", y[0], y[1]); /* v0 = 5, v1 = 16 */
    int bad = 0;
    for (int j = 0; j < 32; j++)
        bad += y[j] != 0.5f * v[j] + 1.0f;
    KT_CHECK(bad == 0, "%d q5_1 values wrong", bad);
}

static void q8_blocks_dequantize_as_spec(void)
{
    struct kt_block_q8_0 b0 = {.d = H_0_25};
    struct kt_block_q8_1 b1 = {.d = H_0_25, .s = H_1};
    for (int j = 0; j < 32; j++)
        b0.qs[j] = b1.qs[j] = (int8_t)(j * 8 - 128);
    float y0[32], y1[32];
    dequant(KT_TYPE_Q8_0, &b0, y0, 32);
    dequant(KT_TYPE_Q8_1, &b1, y1, 32);
    KT_CHECK(y0[0] == -32.0f && y0[31] == 30.0f, "%g %g", y0[0], y0[31]);
    int bad = 0;
    for (int j = 0; j < 32; j++)
        bad += y0[j] != 0.25f * (j * 8 - 128) || y1[j] != y0[j];
    KT_CHECK(bad == 0, "%d q8_0/q8_1 values wrong", bad);

    struct kt_block_q8_K bk = {.d = 0.1f};
    for (int j = 0; j < 256; j++)
        bk.qs[j] = (int8_t)(j - 128);
    float yk[256];
    dequant(KT_TYPE_Q8_K, &bk, yk, 256);
    bad = 0;
    for (int j = 0; j < 256; j++)
        bad += yk[j] != 0.1f * (float)(j - 128);
    KT_CHECK(bad == 0, "%d q8_K values wrong (d is f32)", bad);
}

/*
 * Q4_K / Q5_K test scales.  6-bit sc = {1, 2, 3, 63, 40, 17, 5, 33},
 * m = {0, 1, 63, 7, 50, 2, 31, 60}, packed by hand:
 *   bytes 0-3 : sc_j | (sc_{j+4} >> 4) << 6  = 1|2<<6, 2|1<<6, 3|0<<6, 63|2<<6 = 81 42 03 bf
 *   bytes 4-7 : m_j  | (m_{j+4} >> 4) << 6   = 0|3<<6, 1|0<<6, 63|1<<6, 7|3<<6 = c0 01 7f c7
 *   bytes 8-11: (sc_{j+4} & 15) | (m_{j+4} & 15) << 4 = 8|2<<4, 1|2<<4, 5|15<<4, 1|12<<4 = 28 21 f5 c1
 */
static const uint8_t k_scales[12] = {0x81, 0x42, 0x03, 0xbf, 0xc0, 0x01, 0x7f, 0xc7, 0x28, 0x21, 0xf5, 0xc1};
static const int k_sc[8] = {1, 2, 3, 63, 40, 17, 5, 33};
static const int k_m[8] = {0, 1, 63, 7, 50, 2, 31, 60};

static void k_scale_min_unpacks_all_eight_sub_blocks(void)
{
    for (int j = 0; j < 8; j++) {
        uint8_t sc, m;
        kt_k_scale_min(k_scales, j, &sc, &m);
        KT_CHECK(sc == k_sc[j] && m == k_m[j], "sub-block %d: sc %d m %d, want %d %d", j, sc, m, k_sc[j], k_m[j]);
    }
}

/* Q4_K nibble of element e: chunk c = e/64; byte qs[32c + e%32]; high nibble for e%64 >= 32. */
static int q4_K_nibble(const uint8_t qs[128], int e)
{
    const uint8_t byte = qs[32 * (e / 64) + e % 32];
    return (e % 64) >= 32 ? byte >> 4 : byte & 15;
}

static void q4_K_block_dequantizes_as_spec(void)
{
    struct kt_block_q4_K b = {.d = H_0_5, .dmin = H_0_25};
    memcpy(b.scales, k_scales, 12);
    for (int i = 0; i < 128; i++)
        b.qs[i] = (uint8_t)(i * 37 + 11);
    float y[256];
    dequant(KT_TYPE_Q4_K, &b, y, 256);
    /* element 128: sub-block 4, low nibble of qs[64] = 0x4b -> 11: 0.5*40*11 - 0.25*50 = 207.5
     * element 255: sub-block 7, high nibble of qs[127] = 0x66 -> 6: 0.5*33*6 - 0.25*60 = 84 */
    KT_CHECK(y[128] == 207.5f, "y[128] = %g", y[128]);
    KT_CHECK(y[255] == 84.0f, "y[255] = %g", y[255]);
    int bad = 0;
    for (int e = 0; e < 256; e++)
        bad += y[e] != 0.5f * k_sc[e / 32] * q4_K_nibble(b.qs, e) - 0.25f * k_m[e / 32];
    KT_CHECK(bad == 0, "%d q4_K values wrong", bad);
}

static void q5_K_block_with_high_bits_dequantizes_as_spec(void)
{
    struct kt_block_q5_K b = {.d = H_0_5, .dmin = H_0_25};
    memcpy(b.scales, k_scales, 12);
    for (int i = 0; i < 128; i++)
        b.qs[i] = (uint8_t)(i * 37 + 11);
    for (int l = 0; l < 32; l++)
        b.qh[l] = (uint8_t)(l * 29 + 5);
    float y[256];
    dequant(KT_TYPE_Q5_K, &b, y, 256);
    /* element 0: nibble 11, qh[0] = 0b101 bit 0 set -> 27: 0.5*1*27 - 0 = 13.5
     * element 255: nibble 6, qh[31] = 0x88 bit 7 set -> 22: 0.5*33*22 - 0.25*60 = 348
     * element 128: nibble 11, qh[0] bit 4 clear -> 11: 207.5 as in Q4_K */
    KT_CHECK(y[0] == 13.5f, "y[0] = %g", y[0]);
    KT_CHECK(y[255] == 348.0f, "y[255] = %g", y[255]);
    KT_CHECK(y[128] == 207.5f, "y[128] = %g", y[128]);
    int bad = 0, high = 0;
    for (int e = 0; e < 256; e++) {
        /* bit 4 of element e: bit (2*chunk + upper half) of qh[e % 32] */
        const int bit = (b.qh[e % 32] >> (2 * (e / 64) + ((e % 64) >= 32))) & 1;
        high += bit;
        bad += y[e] != 0.5f * k_sc[e / 32] * (q4_K_nibble(b.qs, e) + 16 * bit) - 0.25f * k_m[e / 32];
    }
    KT_CHECK(bad == 0, "%d q5_K values wrong", bad);
    KT_CHECK(high > 64 && high < 192, "pattern sets %d high bits", high);
}

/* Q6_K: 6-bit value v of element e lands, per the spec, in half n = e/128,
 * r = e%128, quarter g = r/32, l = r%32: low 4 bits in ql[64n + l + 32*(g&1)]
 * (high nibble for g >= 2), high 2 bits at bit 2g of qh[32n + l]. */
static void pack_q6_K_value(struct kt_block_q6_K *b, int e, int v)
{
    const int n = e / 128, r = e % 128, g = r / 32, l = r % 32;
    uint8_t *ql = &b->ql[64 * n + l + 32 * (g & 1)];
    *ql = (uint8_t)(g >= 2 ? (*ql & 0x0f) | (v & 15) << 4 : (*ql & 0xf0) | (v & 15));
    b->qh[32 * n + l] = (uint8_t)((b->qh[32 * n + l] & ~(3 << (2 * g))) | (v >> 4) << (2 * g));
}

static void q6_K_block_with_negative_scales_dequantizes_as_spec(void)
{
    static const int8_t scales[16] = {-128, -1, 5, 127, -7, 0, 64, -64, 1, 2, 3, -3, 100, -100, 33, -33};
    struct kt_block_q6_K b = {.d = H_0_125};
    memcpy(b.scales, scales, 16);
    int v[256];
    for (int e = 0; e < 256; e++) {
        v[e] = (e * 13 + 7) % 64;
        pack_q6_K_value(&b, e, v[e]);
    }
    float y[256];
    dequant(KT_TYPE_Q6_K, &b, y, 256);
    /* element 0: v = 7 -> -25, scale -128: 0.125*-128*-25 = 400
     * element 255: v = 58 -> 26, scale -33: 0.125*-33*26 = -107.25 */
    KT_CHECK(y[0] == 400.0f, "y[0] = %g", y[0]);
    KT_CHECK(y[255] == -107.25f, "y[255] = %g", y[255]);
    int bad = 0;
    for (int e = 0; e < 256; e++)
        bad += y[e] != 0.125f * scales[e / 16] * (v[e] - 32);
    KT_CHECK(bad == 0, "%d q6_K values wrong", bad);
}

/* ---------------------------------------------------------------------------- */
/* quantizers that follow ggml's reference rules exactly                         */
/* ---------------------------------------------------------------------------- */

static void q8_0_quantizes_with_roundf_like_ggml(void)
{
    float x[32] = {127.0f, 63.5f, -63.5f, 0.5f, -0.5f, 0.49f, -127.0f, 1.5f};
    struct kt_block_q8_0 b;
    kt_type_traits(KT_TYPE_Q8_0)->from_float(x, &b, 32);
    /* amax 127 -> d = 1; roundf rounds half away from zero */
    static const int8_t want[8] = {127, 64, -64, 1, -1, 0, -127, 2};
    KT_CHECK(b.d == H_1, "d 0x%04x", b.d);
    KT_CHECK(memcmp(b.qs, want, 8) == 0, "qs %d %d %d %d %d %d %d %d", b.qs[0], b.qs[1], b.qs[2], b.qs[3], b.qs[4],
             b.qs[5], b.qs[6], b.qs[7]);

    struct kt_block_q8_1 b1;
    kt_type_traits(KT_TYPE_Q8_1)->from_float(x, &b1, 32);
    KT_CHECK(b1.d == H_1 && memcmp(b1.qs, want, 8) == 0, "q8_1 like q8_0");
    KT_CHECK(kt_fp16_to_fp32(b1.s) == 2.0f, "s = d*sum(q) = 2, got %g", kt_fp16_to_fp32(b1.s)); /* 127+64-64+1-1-127+2 */
}

static void q8_K_maps_signed_max_to_minus_127_and_rounds_ties_to_even(void)
{
    float *x = calloc(256, sizeof *x);
    x[0] = 127.0f; /* signed max: iscale = -1, d = -1 */
    x[1] = 0.5f;
    x[2] = 1.5f;
    x[3] = 2.5f;
    x[4] = -126.5f;
    x[17] = 3.0f;
    struct kt_block_q8_K b;
    kt_type_traits(KT_TYPE_Q8_K)->from_float(x, &b, 256);
    KT_CHECK(b.d == -1.0f, "d %g", b.d);
    KT_CHECK(b.qs[0] == -127 && b.qs[1] == 0 && b.qs[2] == -2 && b.qs[3] == -2 && b.qs[4] == 126, "qs %d %d %d %d %d",
             b.qs[0], b.qs[1], b.qs[2], b.qs[3], b.qs[4]);
    KT_CHECK(b.bsums[0] == -127 + 0 - 2 - 2 + 126 && b.bsums[1] == -3, "bsums %d %d", b.bsums[0], b.bsums[1]);
    int bad = 0;
    for (int g = 2; g < 16; g++)
        bad += b.bsums[g] != 0;
    KT_CHECK(bad == 0, "%d nonzero bsums of zero groups", bad);
    free(x);
}

/* The reference sheet's rules, spelled out with libm: Q8_0 q = roundf(x * 127/amax)
 * with d = amax/127; Q8_K q = rint(x * -127/max) (ties to even) capped at 127. */
static void q8_quantizers_match_reference_rule_bit_for_bit(void)
{
    const int64_t n = 256 * 40;
    float *x = kt_test_xmalloc(sizeof(float) * n);
    unsigned long long rng = 77;
    for (int64_t i = 0; i < n; i++) {
        x[i] = kt_test_rand_normal(&rng) * (i < n / 2 ? 1.0f : 1e-3f);
        if (i % 256 < 32) /* blocks with amax 127, d = 1: x = k + 0.5 are exact ties */
            x[i] = i % 32 == 0 ? 127.0f : (float)((int)(kt_test_rand_u64(&rng) % 252) - 126) + 0.5f;
    }
    struct kt_block_q8_0 *q0 = kt_test_xmalloc(kt_type_row_bytes(KT_TYPE_Q8_0, n));
    struct kt_block_q8_1 *q1 = kt_test_xmalloc(kt_type_row_bytes(KT_TYPE_Q8_1, n));
    struct kt_block_q8_K *qk = kt_test_xmalloc(kt_type_row_bytes(KT_TYPE_Q8_K, n));
    kt_type_traits(KT_TYPE_Q8_0)->from_float(x, q0, n);
    kt_type_traits(KT_TYPE_Q8_1)->from_float(x, q1, n);
    kt_type_traits(KT_TYPE_Q8_K)->from_float(x, qk, n);

    int bad0 = 0, bad1 = 0, badk = 0;
    for (int64_t b = 0; b < n / 32; b++) {
        const float *xb = x + 32 * b;
        float amax = 0.0f;
        for (int j = 0; j < 32; j++)
            amax = fmaxf(amax, fabsf(xb[j]));
        const float d = amax / 127.0f, id = d ? 1.0f / d : 0.0f;
        bad0 += q0[b].d != kt_fp32_to_fp16(d);
        bad1 += q1[b].d != kt_fp32_to_fp16(d);
        for (int j = 0; j < 32; j++) {
            bad0 += q0[b].qs[j] != (int8_t)roundf(xb[j] * id);
            bad1 += q1[b].qs[j] != (int8_t)roundf(xb[j] * id);
        }
    }
    for (int64_t b = 0; b < n / 256; b++) {
        const float *xb = x + 256 * b;
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < 256; j++)
            if (fabsf(xb[j]) > amax)
                amax = fabsf(xb[j]), max = xb[j];
        const float iscale = -127.0f / max;
        badk += qk[b].d != 1.0f / iscale;
        for (int j = 0; j < 256; j++)
            badk += qk[b].qs[j] != (int8_t)fminf(127.0f, rintf(iscale * xb[j]));
    }
    KT_CHECK(bad0 == 0, "%d q8_0 fields differ from the reference rule", bad0);
    KT_CHECK(bad1 == 0, "%d q8_1 fields differ from the reference rule", bad1);
    KT_CHECK(badk == 0, "%d q8_K fields differ from the reference rule", badk);
    free(x), free(q0), free(q1), free(qk);
}

static void q4_0_quantizes_like_ggml_reference(void)
{
    float x[32] = {-8.0f, 7.0f, 8.0f, 0.5f, -0.5f, 0.49f, -4.2f};
    struct kt_block_q4_0 b;
    kt_type_traits(KT_TYPE_Q4_0)->from_float(x, &b, 32);
    /* first largest magnitude -8 -> d = -8/-8 = 1; q = trunc(x + 8.5) capped at 15 */
    float y[32];
    dequant(KT_TYPE_Q4_0, &b, y, 32);
    KT_CHECK(b.d == H_1, "d 0x%04x", b.d);
    KT_CHECK(y[0] == -8.0f && y[1] == 7.0f && y[2] == 7.0f && y[3] == 1.0f && y[4] == 0.0f && y[5] == 0.0f &&
                 y[6] == -4.0f,
             "%g %g %g %g %g %g %g", y[0], y[1], y[2], y[3], y[4], y[5], y[6]);
}

/* ---------------------------------------------------------------------------- */
/* quantize -> dequantize                                                        */
/* ---------------------------------------------------------------------------- */

static void block_minmax(const float *x, int n, float *mn, float *mx, float *amax)
{
    *mn = *mx = x[0];
    *amax = 0.0f;
    for (int i = 0; i < n; i++) {
        *mn = fminf(*mn, x[i]);
        *mx = fmaxf(*mx, x[i]);
        *amax = fmaxf(*amax, fabsf(x[i]));
    }
}

/* K-quant asymmetric bound over one super-block: S = largest sub-block step
 * (range incl. 0 / nmax), M = largest sub-block min magnitude. */
static double k_asym_bound(const float *x, int nmax, double s_factor)
{
    double S = 0, M = 0;
    for (int j = 0; j < 8; j++) {
        float mn, mx, amax;
        block_minmax(x + 32 * j, 32, &mn, &mx, &amax);
        mn = fminf(mn, 0.0f);
        S = fmax(S, (mx - mn) / nmax);
        M = fmax(M, -mn);
    }
    return s_factor * S + M / 100.0;
}

/* Largest error a block may show after quantize -> dequantize, from the
 * format's step size: rounding is half a step, clipping of the value opposite
 * the signed max costs up to one step, fp16 scales add 2^-11 relative. */
static double block_error_bound(int type, const float *x)
{
    float mn, mx, amax;
    switch (type) {
    case KT_TYPE_Q8_0:
    case KT_TYPE_Q8_1:
        block_minmax(x, 32, &mn, &mx, &amax);
        return amax * (1.0 / 254 + 1.0 / 2048) * 1.01;
    case KT_TYPE_Q8_K:
        block_minmax(x, 256, &mn, &mx, &amax);
        return amax / 254.0 * 1.01;
    case KT_TYPE_Q4_0:
        block_minmax(x, 32, &mn, &mx, &amax);
        return amax * (1.0 / 8 + 1.0 / 2048) * 1.01;
    case KT_TYPE_Q5_0:
        block_minmax(x, 32, &mn, &mx, &amax);
        return amax * (1.0 / 16 + 1.0 / 2048) * 1.01;
    case KT_TYPE_Q4_1:
        block_minmax(x, 32, &mn, &mx, &amax);
        return 0.505 * (mx - mn) / 15 + (fabsf(mn) + (mx - mn)) / 2048;
    case KT_TYPE_Q5_1:
        block_minmax(x, 32, &mn, &mx, &amax);
        return 0.505 * (mx - mn) / 31 + (fabsf(mn) + (mx - mn)) / 2048;
    case KT_TYPE_Q4_K: /* 0.5 step + up to 7.5 super-steps of scale rounding (S/63 each) */
        return k_asym_bound(x, 15, 0.65);
    case KT_TYPE_Q5_K: /* 0.5 step + up to 15.5 super-steps (S/63 each) */
        return k_asym_bound(x, 31, 0.80);
    case KT_TYPE_Q6_K: {
        double S = 0; /* one step of the largest group + 16 super-steps (S/128 each) */
        for (int g = 0; g < 16; g++) {
            block_minmax(x + 16 * g, 16, &mn, &mx, &amax);
            S = fmax(S, amax / 32.0);
        }
        return 1.15 * S;
    }
    case KT_TYPE_F16:
        return fabsf(x[0]) * ldexp(1, -11) + ldexp(1, -25);
    case KT_TYPE_BF16:
        return fabsf(x[0]) * ldexp(1, -8);
    default: /* F32 */
        return 0.0;
    }
}

/* Quantizes rows one by one (row stride = row bytes), dequantizes, checks each
 * block against its bound.  Returns the error sum of squares. */
static double round_trip_rows(int type, const float *x, int64_t rows, int64_t n, float *y, const char *what)
{
    const struct kt_type_traits *t = kt_type_traits(type);
    const size_t row_bytes = kt_type_row_bytes(type, n);
    uint8_t *q = kt_test_xmalloc(row_bytes * (size_t)rows);
    for (int64_t r = 0; r < rows; r++)
        t->from_float(x + r * n, q + r * row_bytes, n);
    for (int64_t r = 0; r < rows; r++)
        t->to_float(q + r * row_bytes, y + r * n, n);

    double sse = 0.0, worst = 0.0;
    int64_t bad = 0, worst_at = -1;
    for (int64_t b = 0; b < rows * n / t->block_elems; b++) {
        const float *xb = x + b * t->block_elems;
        const float *yb = y + b * t->block_elems;
        const double bound = block_error_bound(type, xb) + 1e-30;
        for (int64_t i = 0; i < t->block_elems; i++) {
            const double err = fabs((double)yb[i] - xb[i]);
            sse += err * err;
            if (!(err <= bound)) {
                bad++;
                if (err / bound > worst)
                    worst = err / bound, worst_at = b * t->block_elems + i;
            }
        }
    }
    KT_CHECK(bad == 0, "%s %s: %lld values over bound, worst %.3gx at %lld (x %g y %g)", t->name, what,
             (long long)bad, worst, (long long)worst_at, worst_at >= 0 ? x[worst_at] : 0.0,
             worst_at >= 0 ? y[worst_at] : 0.0);
    free(q);
    return sse;
}

static void quantize_round_trip_stays_within_format_error_bounds(void)
{
    /* relative rms error allowed on N(0,1) data; theory: step/sqrt(12) / sigma */
    static const struct {
        int type;
        double max_rel_rms;
    } rms[] = {
        {KT_TYPE_F32, 0.0},     {KT_TYPE_F16, 3e-4},    {KT_TYPE_BF16, 2.5e-3}, {KT_TYPE_Q8_0, 0.007},
        {KT_TYPE_Q8_1, 0.007},  {KT_TYPE_Q8_K, 0.009},  {KT_TYPE_Q4_0, 0.10},   {KT_TYPE_Q4_1, 0.10},
        {KT_TYPE_Q5_0, 0.05},   {KT_TYPE_Q5_1, 0.05},   {KT_TYPE_Q4_K, 0.10},   {KT_TYPE_Q5_K, 0.05},
        {KT_TYPE_Q6_K, 0.025},
    };
    const int64_t n = 768; /* 3 super-blocks, 24 legacy blocks */
    const int64_t row_counts[] = {3, 7};
    const float magnitudes[] = {1e-2f, 1.0f, 100.0f};
    float *x = kt_test_xmalloc(sizeof(float) * 7 * n), *y = kt_test_xmalloc(sizeof(float) * 7 * n);
    unsigned long long rng = 7;

    for (size_t t = 0; t < sizeof rms / sizeof rms[0]; t++) {
        for (size_t rc = 0; rc < 2; rc++) {
            for (size_t mg = 0; mg < 3; mg++) {
                const int64_t rows = row_counts[rc];
                double ss = 0.0;
                for (int64_t i = 0; i < rows * n; i++) {
                    x[i] = magnitudes[mg] * kt_test_rand_normal(&rng);
                    ss += (double)x[i] * x[i];
                }
                char what[64];
                snprintf(what, sizeof what, "%lld rows x %g", (long long)rows, magnitudes[mg]);
                const double sse = round_trip_rows(rms[t].type, x, rows, n, y, what);
                const double rel = sqrt(sse / ss);
                KT_CHECK(rel <= rms[t].max_rel_rms, "%s %s: relative rms error %.4g > %.4g",
                         kt_type_name(rms[t].type), what, rel, rms[t].max_rel_rms);
                if (rc == 1 && mg == 1)
                    printf("     %-5s relative rms error on N(0,1): %.5f\n", kt_type_name(rms[t].type), rel);
            }
        }
    }
    free(x);
    free(y);
}

/* A row of 4 super-blocks: zeros, constant +0.37, constant -1.25, and N(0,1)
 * with one outlier of 1000. */
static void quantize_handles_zero_constant_and_outlier_blocks(void)
{
    const int64_t n = 1024;
    float *x = kt_test_xmalloc(sizeof(float) * n), *y = kt_test_xmalloc(sizeof(float) * n);
    unsigned long long rng = 99;
    for (int64_t i = 0; i < n; i++)
        x[i] = i < 256 ? 0.0f : i < 512 ? 0.37f : i < 768 ? -1.25f : kt_test_rand_normal(&rng);
    x[800] = 1000.0f;

    for (int t = 0; t < N_COMPUTED; t++) {
        const int type = computed_types[t];
        const char *name = kt_type_name(type);
        round_trip_rows(type, x, 1, n, y, "special row");
        int nonzero = 0, bad_const = 0, nonfinite = 0;
        for (int64_t i = 0; i < n; i++)
            nonfinite += !isfinite(y[i]);
        for (int64_t i = 0; i < 256; i++)
            nonzero += y[i] != 0.0f;
        for (int64_t i = 256; i < 768; i++)
            bad_const += !(fabsf(y[i] - x[i]) <= fabsf(x[i]) * 0x1p-8f);
        KT_CHECK(nonfinite == 0, "%s: %d non-finite values", name, nonfinite);
        KT_CHECK(nonzero == 0, "%s: zero block reads %d nonzero values", name, nonzero);
        KT_CHECK(bad_const == 0, "%s: %d constant values off by more than 2^-8", name, bad_const);
        KT_CHECK(fabsf(y[800] - 1000.0f) <= 1000.0f * 0x1p-6f, "%s: outlier reads %g", name, y[800]);
    }
    free(x);
    free(y);
}

/* Blocks far below the scale format's range (subnormal floats, 1e-37) read back
 * as zero with zero quants, not as garbage from an overflowed 1/d. */
static void quantize_reads_tiny_blocks_as_zero(void)
{
    const int64_t n = 512;
    float *x = kt_test_xmalloc(sizeof(float) * n), *y = kt_test_xmalloc(sizeof(float) * n);
    unsigned long long rng = 11;
    for (int64_t i = 0; i < n; i++)
        x[i] = (i < 256 ? 1e-39f : 1e-37f) * kt_test_rand_normal(&rng);
    for (int64_t i = 0; i < n; i += 7)
        x[i] = 0.0f;
    for (int t = 0; t < N_COMPUTED; t++) {
        const int type = computed_types[t];
        if (!kt_type_traits(type)->is_quantized)
            continue;
        uint8_t *q = kt_test_xmalloc(kt_type_row_bytes(type, n));
        kt_type_traits(type)->from_float(x, q, n);
        kt_type_traits(type)->to_float(q, y, n);
        int bad = 0;
        for (int64_t i = 0; i < n; i++)
            bad += !(fabsf(y[i] - x[i]) <= 1e-36f);
        KT_CHECK(bad == 0, "%s: %d tiny values read back wrong", kt_type_name(type), bad);
        if (type == KT_TYPE_Q8_0 || type == KT_TYPE_Q8_K) {
            const struct kt_block_q8_0 *b0 = (const void *)q;
            const struct kt_block_q8_K *bk = (const void *)q;
            int nonzero = 0;
            for (int64_t i = 0; i < (type == KT_TYPE_Q8_0 ? 8 : 1); i++) /* the subnormal blocks */
                for (int j = 0; j < 32; j++)
                    nonzero += type == KT_TYPE_Q8_0 ? b0[i].qs[j] != 0 : bk[0].qs[32 * i + j] != 0;
            KT_CHECK(nonzero == 0, "%s: %d nonzero quants in subnormal blocks", kt_type_name(type), nonzero);
        }
        free(q);
    }
    free(x);
    free(y);
}

static void q8_1_carries_its_scaled_sum(void)
{
    float x[64];
    unsigned long long rng = 3;
    for (int i = 0; i < 64; i++)
        x[i] = kt_test_rand_normal(&rng);
    struct kt_block_q8_1 b[2];
    kt_type_traits(KT_TYPE_Q8_1)->from_float(x, b, 64);
    for (int i = 0; i < 2; i++) {
        int sum = 0;
        for (int j = 0; j < 32; j++)
            sum += b[i].qs[j];
        const float want = kt_fp16_to_fp32(b[i].d) * sum, s = kt_fp16_to_fp32(b[i].s);
        KT_CHECK(fabsf(s - want) <= fabsf(want) * 0x1p-10f, "block %d: s %g, d*sum %g", i, s, want);
    }
}

/* ---------------------------------------------------------------------------- */
/* reference dot products                                                        */
/* ---------------------------------------------------------------------------- */

static void vec_dot_equals_dot_of_dequantized_rows(void)
{
    static const int weight_types[] = {KT_TYPE_F32, KT_TYPE_F16, KT_TYPE_BF16, KT_TYPE_Q8_0, KT_TYPE_Q4_0,
                                       KT_TYPE_Q5_0, KT_TYPE_Q4_1, KT_TYPE_Q5_1, KT_TYPE_Q4_K, KT_TYPE_Q5_K,
                                       KT_TYPE_Q6_K};
    const int ks[] = {1, 3, 7};
    unsigned long long rng = 2024;
    for (size_t t = 0; t < sizeof weight_types / sizeof weight_types[0]; t++) {
        const struct kt_type_traits *wt = kt_type_traits(weight_types[t]);
        const struct kt_type_traits *at = kt_type_traits(wt->vec_dot_type);
        for (int ki = 0; ki < 3; ki++) {
            /* plain floats get shapes that are no multiple of anything */
            const int64_t n = wt->block_elems > 1 ? wt->block_elems * ks[ki] : 32 * ks[ki] + 5;
            float *w = kt_test_xmalloc(sizeof(float) * n), *a = kt_test_xmalloc(sizeof(float) * n);
            float *wd = kt_test_xmalloc(sizeof(float) * n), *ad = kt_test_xmalloc(sizeof(float) * n);
            for (int64_t i = 0; i < n; i++) {
                w[i] = 0.3f * kt_test_rand_normal(&rng) + (i % 64 < 32 ? 0.2f : -0.1f); /* nonzero mins */
                a[i] = 2.0f * kt_test_rand_normal(&rng);
            }
            if (n >= 64)
                for (int64_t i = 32; i < 64; i++)
                    a[i] = 0.0f; /* an all-zero activation block */
            void *wq = kt_test_xmalloc(kt_type_row_bytes(weight_types[t], n));
            void *aq = kt_test_xmalloc(kt_type_row_bytes(wt->vec_dot_type, n));
            wt->from_float(w, wq, n);
            at->from_float(a, aq, n);
            wt->to_float(wq, wd, n);
            at->to_float(aq, ad, n);

            double want = 0.0, mag = 0.0;
            for (int64_t i = 0; i < n; i++) {
                want += (double)wd[i] * ad[i];
                mag += fabs((double)wd[i] * ad[i]);
            }
            double tol = 4e-6 * mag + 1e-30;
            if (wt->vec_dot_type == KT_TYPE_Q8_1) {
                /* the dot uses s = fp16(d*sum q), not sum of the dequantized activations */
                const struct kt_block_q8_1 *ab = aq;
                for (int64_t b = 0; b < n / 32; b++) {
                    const kt_fp16 m = weight_types[t] == KT_TYPE_Q4_1 ? ((const struct kt_block_q4_1 *)wq)[b].m
                                                                       : ((const struct kt_block_q5_1 *)wq)[b].m;
                    tol += fabsf(kt_fp16_to_fp32(m)) * fabsf(kt_fp16_to_fp32(ab[b].s)) * 0x1p-9;
                }
            }
            float got = NAN;
            wt->vec_dot(n, &got, wq, aq);
            KT_CHECK(fabs(got - want) <= tol, "%s . %s n=%lld: %.9g, want %.9g (tol %.3g)", wt->name, at->name,
                     (long long)n, got, want, tol);
            free(w), free(a), free(wd), free(ad), free(wq), free(aq);
        }
    }
}

/* The Q4_K min term comes from Q8_K's bsums: changing one moves the dot by
 * exactly -dmin*m_0*da*delta. */
static void q4_K_dot_takes_min_term_from_bsums(void)
{
    struct kt_block_q4_K w = {.d = H_0_5, .dmin = H_0_25};
    memcpy(w.scales, k_scales, 12); /* m_0 = 0, m_1 = 1 */
    memset(w.qs, 0x35, sizeof w.qs);
    struct kt_block_q8_K a = {.d = 0.5f};
    for (int j = 0; j < 256; j++)
        a.qs[j] = (int8_t)(j % 7 - 3);
    for (int g = 0; g < 16; g++) {
        int s = 0;
        for (int l = 0; l < 16; l++)
            s += a.qs[16 * g + l];
        a.bsums[g] = (int16_t)s;
    }
    const kt_vec_dot_fn dot = kt_type_traits(KT_TYPE_Q4_K)->vec_dot;
    float before, after;
    dot(256, &before, &w, &a);
    a.bsums[2] += 10; /* sub-block 1 (m_1 = 1): dot moves by -0.25*1*0.5*10 */
    dot(256, &after, &w, &a);
    KT_CHECK(after - before == -1.25f, "bsum change moved the dot by %g", after - before);
}

/* ---------------------------------------------------------------------------- */
/* throughput (printed, never asserted)                                          */
/* ---------------------------------------------------------------------------- */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void print_quantize_throughput(void)
{
    const int64_t n = (int64_t)1 << 22;
    float *x = kt_test_xmalloc(sizeof(float) * n);
    unsigned long long rng = 5;
    for (int64_t i = 0; i < n; i++)
        x[i] = 0.02f * kt_test_rand_normal(&rng);
    const int types[] = {KT_TYPE_Q4_K, KT_TYPE_Q5_K, KT_TYPE_Q6_K, KT_TYPE_Q8_0};
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
        void *q = kt_test_xmalloc(kt_type_row_bytes(types[t], n));
        double best = 1e30;
        for (int rep = 0; rep < 3; rep++) {
            const double t0 = now_s();
            kt_type_traits(types[t])->from_float(x, q, n);
            best = fmin(best, now_s() - t0);
        }
        printf("     %-5s from_float: %.0f M values/s (1 thread)\n", kt_type_name(types[t]), n / best * 1e-6);
        free(q);
    }
    free(x);
}

int main(void)
{
    KT_RUN(traits_table_matches_ggml_sizes);
    KT_RUN(unknown_type_ids_have_no_traits);
    KT_RUN(computed_types_have_math_and_dot_products);
    KT_RUN(type_names_round_trip_case_insensitively);
    KT_RUN(row_bytes_count_whole_blocks_only);
    KT_RUN(fp16_edge_cases_convert_exactly);
    KT_RUN(fp16_every_half_round_trips);
    KT_RUN(fp16_rounds_to_nearest_even);
    KT_RUN(bf16_edge_cases_convert_exactly);
    KT_RUN(q4_0_block_dequantizes_as_spec);
    KT_RUN(q4_1_block_dequantizes_as_spec);
    KT_RUN(q5_0_block_with_high_bits_dequantizes_as_spec);
    KT_RUN(q5_1_block_with_high_bits_dequantizes_as_spec);
    KT_RUN(q8_blocks_dequantize_as_spec);
    KT_RUN(k_scale_min_unpacks_all_eight_sub_blocks);
    KT_RUN(q4_K_block_dequantizes_as_spec);
    KT_RUN(q5_K_block_with_high_bits_dequantizes_as_spec);
    KT_RUN(q6_K_block_with_negative_scales_dequantizes_as_spec);
    KT_RUN(q8_0_quantizes_with_roundf_like_ggml);
    KT_RUN(q8_K_maps_signed_max_to_minus_127_and_rounds_ties_to_even);
    KT_RUN(q8_quantizers_match_reference_rule_bit_for_bit);
    KT_RUN(q4_0_quantizes_like_ggml_reference);
    KT_RUN(quantize_round_trip_stays_within_format_error_bounds);
    KT_RUN(quantize_handles_zero_constant_and_outlier_blocks);
    KT_RUN(quantize_reads_tiny_blocks_as_zero);
    KT_RUN(q8_1_carries_its_scaled_sum);
    KT_RUN(vec_dot_equals_dot_of_dequantized_rows);
    KT_RUN(q4_K_dot_takes_min_term_from_bsums);
    KT_RUN(print_quantize_throughput);
    return kt_test_finish();
}
