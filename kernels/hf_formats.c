/*
 * hf_formats.c - scalar decoding of the native Hugging Face weight formats
 * (see hf_formats.h).  This is the definition the fast kernels are tested
 * against, so it reads like the formats' specifications: one element at a
 * time, every bit position spelled out, no lookup tables built at run time.
 * It must never round where the format does not, and never read past the
 * bytes a shape implies.
 *
 * Where each layout was confirmed (sources read, not copied):
 *   INT4 pack-quantized  vllm-project/compressed-tensors,
 *                        src/compressed_tensors/compressors/quantized_compressors/pack_quantized.py
 *                        (pack_to_int32 / unpack_from_int32: value + 8, element i of
 *                        a word at bit 4i) and quantization/lifecycle/forward.py
 *                        (group strategy: x_q * scale, zero point 0 when symmetric)
 *   FP8 block scales     deepseek-ai/DeepSeek-V3, inference/kernel.py (weight_dequant:
 *                        y = float(x) * s[row / 128][col / 128], ceil-divided grid)
 *   MXFP4 (HF)           openai/gpt-oss, gpt_oss/torch/weights.py (_get_mxfp4_tensor:
 *                        low nibble -> even element, ldexp(value, scale - 127))
 *   MXFP4 (GGUF)         ggml-org/llama.cpp, ggml/src/ggml-quants.c (dequantize_row_mxfp4:
 *                        low nibbles elements 0..15, high 16..31) and ggml-impl.h
 *                        (ggml_e8m0_to_fp32_half)
 *   E4M3, E2M1, E8M0     OCP 8-bit Floating Point Specification (OFP8) rev 1.0 and
 *                        OCP Microscaling Formats (MX) v1.0
 */
#include "hf_formats.h"

#include "quant.h"

#include <math.h>
#include <string.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "hf_formats.c reads little-endian tensor bytes in host order: little-endian hosts only"
#endif

static float f32_from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* ---- scalar codes ------------------------------------------------------------------ */

float kt_fp8_e4m3_to_f32(uint8_t code)
{
    const uint32_t sign = (uint32_t)(code & 0x80u) << 24;
    const uint32_t exp = (code >> 3) & 0xfu;
    const uint32_t mant = code & 0x7u;
    if (exp == 0xfu && mant == 0x7u) /* the only NaN pattern; e4m3fn has no inf */
        return f32_from_bits(sign | 0x7fc00000u);
    if (exp == 0) { /* subnormal: mant/8 * 2^-6 = mant * 2^-9, exact in F32 */
        const float mag = (float)mant * 0x1p-9f;
        return sign ? -mag : mag;
    }
    /* normal: (1 + mant/8) * 2^(exp-7); F32 exponent field exp - 7 + 127 */
    return f32_from_bits(sign | (exp + 120u) << 23 | mant << 20);
}

float kt_e2m1_to_f32(uint8_t code)
{
    /* magnitudes of s.ee.m: e=0 is subnormal m * 0.5, else (1 + m/2) * 2^(e-1) */
    static const float magnitude[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    const float mag = magnitude[code & 0x7u];
    return (code & 0x8u) ? -mag : mag;
}

float kt_e8m0_to_f32(uint8_t code)
{
    if (code == 0xffu)
        return f32_from_bits(0x7fc00000u);
    if (code == 0) /* 2^-127 is below F32's normal range: the subnormal with bit 22 set */
        return f32_from_bits(0x00400000u);
    return f32_from_bits((uint32_t)code << 23);
}

/* ---- rows ---------------------------------------------------------------------------- */

static uint32_t load_u32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

static float load_f32(const uint8_t *p)
{
    float v;
    memcpy(&v, p, sizeof v);
    return v;
}

static float load_bf16(const uint8_t *p)
{
    kt_bf16 v;
    memcpy(&v, p, sizeof v);
    return kt_bf16_to_fp32(v);
}

static int64_t ceil_div(int64_t a, int64_t b)
{
    return (a + b - 1) / b;
}

void kt_int4_pack_row_to_f32(const void *weight_packed, const void *weight_scale, int64_t cols,
                             int64_t group_size, int64_t row, float *out)
{
    const int64_t words = ceil_div(cols, 8), groups = ceil_div(cols, group_size);
    const uint8_t *packed = (const uint8_t *)weight_packed + (size_t)(row * words) * 4; /* (rows, words) I32 */
    const uint8_t *scale = (const uint8_t *)weight_scale + (size_t)(row * groups) * 2;  /* (rows, groups) BF16 */
    for (int64_t c = 0; c < cols; c++) {
        const uint32_t word = load_u32(packed + (size_t)(c / 8) * 4);
        const int q = (int)((word >> (4 * (c % 8))) & 0xfu) - 8;
        out[c] = (float)q * load_bf16(scale + (size_t)(c / group_size) * 2);
    }
}

void kt_fp8_block_row_to_f32(const void *weight, const void *weight_scale_inv, int64_t cols, int64_t block_rows,
                             int64_t block_cols, int64_t row, float *out)
{
    const int64_t scale_cols = ceil_div(cols, block_cols);
    const uint8_t *w = (const uint8_t *)weight + (size_t)(row * cols);                      /* (rows, cols) F8_E4M3 */
    const uint8_t *s = (const uint8_t *)weight_scale_inv + (size_t)((row / block_rows) * scale_cols) * 4; /* F32 */
    for (int64_t c = 0; c < cols; c++)
        out[c] = kt_fp8_e4m3_to_f32(w[c]) * load_f32(s + (size_t)(c / block_cols) * 4);
}

void kt_mxfp4_row_to_f32(const void *blocks, const void *scales, int64_t cols, int64_t row, float *out)
{
    const int64_t n_blocks = cols / 32;
    const uint8_t *b = (const uint8_t *)blocks + (size_t)(row * n_blocks) * 16; /* (rows, cols/32, 16) U8 */
    const uint8_t *e = (const uint8_t *)scales + (size_t)(row * n_blocks);      /* (rows, cols/32) E8M0 */
    for (int64_t i = 0; i < n_blocks; i++) {
        const float scale = kt_e8m0_to_f32(e[i]);
        for (int j = 0; j < 16; j++) {
            const uint8_t byte = b[i * 16 + j];
            out[i * 32 + 2 * j] = kt_e2m1_to_f32(byte & 0xfu) * scale;
            out[i * 32 + 2 * j + 1] = kt_e2m1_to_f32(byte >> 4) * scale;
        }
    }
}

void kt_bf16_row_to_f32(const void *weight, int64_t cols, int64_t row, float *out)
{
    const uint8_t *w = (const uint8_t *)weight + (size_t)(row * cols) * 2; /* (rows, cols) BF16 */
    for (int64_t c = 0; c < cols; c++)
        out[c] = load_bf16(w + (size_t)c * 2);
}

/* ggml's "half" E8M0: 2^(e-128), applied to e2m1 values doubled to integers */
float kt_e8m0_half_to_f32(uint8_t e)
{
    if (e < 2) /* 2^-128 and 2^-127: F32 subnormals */
        return f32_from_bits(0x00200000u << e);
    return f32_from_bits((uint32_t)(e - 1) << 23);
}

void kt_mxfp4_gguf_to_f32(const void *blocks, float *out, int64_t n)
{
    const struct kt_block_mxfp4 *x = blocks;
    for (int64_t i = 0; i < n / 32; i++) {
        struct kt_block_mxfp4 b;
        memcpy(&b, &x[i], sizeof b);
        const float d = kt_e8m0_half_to_f32(b.e);
        for (int j = 0; j < 16; j++) {
            out[i * 32 + j] = 2.0f * kt_e2m1_to_f32(b.qs[j] & 0xfu) * d;
            out[i * 32 + j + 16] = 2.0f * kt_e2m1_to_f32(b.qs[j] >> 4) * d;
        }
    }
}

void kt_unpack_mxfp4(const struct kt_block_mxfp4 *b, int8_t q[32])
{
    for (int j = 0; j < 16; j++) {
        q[j] = (int8_t)(2.0f * kt_e2m1_to_f32(b->qs[j] & 0xfu));
        q[j + 16] = (int8_t)(2.0f * kt_e2m1_to_f32(b->qs[j] >> 4));
    }
}

/* ---- block FP8 as FP8_B128 ----------------------------------------------------------- */

static bool e4m3_is_nan(uint8_t code)
{
    return (code & 0x7fu) == 0x7fu;
}

static bool f32_is_finite(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return (u & 0x7f800000u) != 0x7f800000u;
}

bool kt_fp8_b128_from_hf(const void *weight, const void *weight_scale_inv, int64_t rows, int64_t cols,
                         int64_t row, void *dst_row)
{
    if (cols <= 0 || cols % KT_QK_FP8 != 0 || row < 0 || row >= rows)
        return false;
    const int64_t n_blocks = cols / KT_QK_FP8;
    const uint8_t *w = (const uint8_t *)weight + (size_t)(row * cols);                           /* (rows, cols) */
    const uint8_t *s = (const uint8_t *)weight_scale_inv + (size_t)((row / 128) * n_blocks) * 4; /* (.., cols/128) */
    struct kt_block_fp8_b128 *dst = dst_row;
    for (int64_t j = 0; j < n_blocks; j++) {
        struct kt_block_fp8_b128 b;
        b.d = load_f32(s + (size_t)j * 4);
        memcpy(b.q, w + (size_t)j * KT_QK_FP8, KT_QK_FP8);
        if (!f32_is_finite(b.d))
            return false;
        for (int i = 0; i < KT_QK_FP8; i++)
            if (e4m3_is_nan(b.q[i]))
                return false;
        memcpy(&dst[j], &b, sizeof b);
    }
    return true;
}

bool kt_fp8_b128_check_row(const void *row, int64_t n)
{
    const struct kt_block_fp8_b128 *x = row;
    for (int64_t j = 0; j < n / KT_QK_FP8; j++) {
        struct kt_block_fp8_b128 b;
        memcpy(&b, &x[j], sizeof b);
        if (!f32_is_finite(b.d))
            return false;
        for (int i = 0; i < KT_QK_FP8; i++)
            if (e4m3_is_nan(b.q[i]))
                return false;
    }
    return true;
}

/* ---- encoders ------------------------------------------------------------------------ */

/* x (0 <= x < 2^23) rounded to an integer, ties to even: exact, whatever the
 * rounding mode (the fraction of a float below 2^23 is exact). */
static float round_half_even(float x)
{
    const float whole = floorf(x), frac = x - whole;
    if (frac > 0.5f || (frac == 0.5f && fmodf(whole, 2.0f) != 0.0f))
        return whole + 1.0f;
    return whole;
}

uint8_t kt_f32_to_fp8_e4m3(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    const uint8_t sign = (uint8_t)((u >> 24) & 0x80u);
    const uint32_t mag = u & 0x7fffffffu;
    if (mag > 0x7f800000u)
        return 0x7f; /* NaN (the sign is dropped: e4m3fn's NaNs are S.1111.111 either way) */
    if (mag >= 0x43e00000u) /* 448 and up, infinity included: saturate */
        return sign | 0x7e;
    if (mag < 0x3c800000u) { /* below 2^-6: a multiple of 2^-9; code 8 (= 8 x 2^-9) is the smallest normal */
        float a;
        memcpy(&a, &mag, sizeof a);
        return sign | (uint8_t)round_half_even(a * 512.0f);
    }
    /* normal: keep 3 of the 23 mantissa bits, ties to even; a carry into the
     * exponent is the next binade's code (the encoding is monotonic) */
    const uint32_t exp = (mag >> 23) - 120u; /* E4M3 exponent field, 1 .. 15 */
    uint32_t code = exp << 3 | ((mag >> 20) & 0x7u);
    const uint32_t rest = mag & 0xfffffu, half = 0x80000u;
    if (rest > half || (rest == half && (code & 1u)))
        code++;
    return sign | (uint8_t)code; /* < 448 rounds to at most 0x7e: the NaN code is never reached */
}

void kt_fp8_block_stripe_from_f32(const float *w, int64_t rows, int64_t cols, int64_t block_cols, uint8_t *q,
                                  float *scale_inv)
{
    for (int64_t c0 = 0, j = 0; c0 < cols; c0 += block_cols, j++) {
        const int64_t c1 = c0 + block_cols < cols ? c0 + block_cols : cols;
        float amax = 0.0f;
        for (int64_t r = 0; r < rows; r++)
            for (int64_t c = c0; c < c1; c++)
                amax = fmaxf(amax, fabsf(w[r * cols + c]));
        const float s = amax > 0.0f ? amax / 448.0f : 1.0f;
        scale_inv[j] = s;
        for (int64_t r = 0; r < rows; r++)
            for (int64_t c = c0; c < c1; c++)
                q[r * cols + c] = kt_f32_to_fp8_e4m3(w[r * cols + c] / s);
    }
}

void kt_int4_pack_row_from_f32(const float *w, int64_t cols, int64_t group_size, void *packed_row, void *scale_row)
{
    uint8_t *packed = packed_row, *scales = scale_row;
    memset(packed, 0, (size_t)ceil_div(cols, 8) * 4);
    for (int64_t g0 = 0, g = 0; g0 < cols; g0 += group_size, g++) {
        const int64_t g1 = g0 + group_size < cols ? g0 + group_size : cols;
        float amax = 0.0f;
        for (int64_t c = g0; c < g1; c++)
            amax = fmaxf(amax, fabsf(w[c]));
        const kt_bf16 scale_bits = kt_fp32_to_bf16(amax / 7.0f);
        const float scale = kt_bf16_to_fp32(scale_bits);
        memcpy(scales + (size_t)g * 2, &scale_bits, 2);
        for (int64_t c = g0; c < g1; c++) {
            float v = scale > 0.0f ? w[c] / scale : 0.0f;
            v = fminf(fmaxf(v, -8.0f), 7.0f);
            const int q = v < 0.0f ? -(int)round_half_even(-v) : (int)round_half_even(v);
            uint32_t word = load_u32(packed + (size_t)(c / 8) * 4);
            word |= (uint32_t)(q + 8) << (4 * (c % 8));
            memcpy(packed + (size_t)(c / 8) * 4, &word, 4);
        }
    }
}

/* ---- INT4 pack-quantized as Q4_0 ------------------------------------------------------ */

/* The 8 nibbles of w (nibble k in bits 4k..4k+3) as the low nibbles of 8 bytes (nibble k in byte k). */
static uint64_t spread_nibbles(uint32_t w)
{
    uint64_t x = w;
    x = (x | x << 16) & 0x0000ffff0000ffffull;
    x = (x | x << 8) & 0x00ff00ff00ff00ffull;
    return (x | x << 4) & 0x0f0f0f0f0f0f0f0full;
}

bool kt_q4_0_from_int4_row(const void *weight_packed, const void *weight_scale, int64_t cols, int64_t row, void *dst)
{
    if (cols <= 0 || cols % 32 != 0 || row < 0)
        return false;
    const int64_t words = cols / 8, groups = cols / 32;
    const uint8_t *packed = (const uint8_t *)weight_packed + (size_t)(row * words) * 4; /* (rows, words) I32 */
    const uint8_t *scale = (const uint8_t *)weight_scale + (size_t)(row * groups) * 2;  /* (rows, groups) BF16 */
    struct kt_block_q4_0 *out = dst;
    for (int64_t g = 0; g < groups; g++) {
        const float s = load_bf16(scale + (size_t)g * 2);
        const kt_fp16 d = kt_fp32_to_fp16(s);
        if (!isfinite(s) || kt_fp16_to_fp32(d) != s) /* the scale must survive as FP16 exactly */
            return false;
        /* element c of the group is nibble c % 8 of word c / 8; Q4_0's byte j
         * holds element j low and j + 16 high: words 0, 1 give the low
         * nibbles of bytes 0-7, 8-15, words 2, 3 their high nibbles */
        struct kt_block_q4_0 b = {.d = d};
        const uint8_t *wg = packed + (size_t)g * 16;
        for (int half = 0; half < 2; half++) {
            const uint64_t bytes = spread_nibbles(load_u32(wg + 4 * half)) |
                                   spread_nibbles(load_u32(wg + 4 * (half + 2))) << 4;
            for (int j = 0; j < 8; j++)
                b.qs[8 * half + j] = (uint8_t)(bytes >> (8 * j));
        }
        memcpy(&out[g], &b, sizeof b);
    }
    return true;
}
