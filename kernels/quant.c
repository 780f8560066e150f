/*
 * quant.c - the GGML type table, fp16/bf16 conversion, block unpacking,
 * dequantization (to_float) and round-to-nearest quantization (from_float).
 *
 * Byte layouts are those of the GGUF specification (quant.h; facts sheet
 * the GGUF specification): a bit here means what it means in a file from the
 * wild.  This file must never change the meaning of a stored bit, never
 * allocate, never keep mutable state and never depend on the CPU it runs on:
 * portable scalar C only.  SIMD versions live in kernels/cpu/<isa>/ and must
 * agree with these functions.
 *
 * Quantizers are "reference" quantizers: the legacy formats (Q4_0 .. Q8_1) and
 * Q8_K follow ggml's *_ref block math exactly; Q4_K / Q5_K / Q6_K use a fast
 * single-pass round-to-nearest (min/max per sub-block, 6- or 8-bit quantized
 * sub-block scales, then every value rounded with its quantized scale) instead
 * of ggml's iterative scale search.  Inputs must be finite.
 */
#include "quant.h"

#include "cpu/ref/vec_dot_ref.h"
#include "hf_formats.h"

#include <ctype.h>
#include <float.h>
#include <math.h>
#include <string.h>

/* ---------------------------------------------------------------------------- */
/* fp16 / bf16                                                                   */
/* ---------------------------------------------------------------------------- */

static inline uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float f32_from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* binary16: sign 1, exponent 5 (bias 15), mantissa 10. */
float kt_fp16_to_fp32(kt_fp16 h)
{
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;

    if (exp == 0x1f) /* inf, or NaN with its payload */
        return f32_from_bits(sign | 0x7f800000u | (mant << 13));
    if (exp == 0) {
        if (mant == 0)
            return f32_from_bits(sign);
        /* subnormal m * 2^-24: shift the leading one up to the implicit bit */
        exp = 127 - 14;
        while (!(mant & 0x400u)) {
            mant <<= 1;
            exp--;
        }
        return f32_from_bits(sign | (exp << 23) | ((mant & 0x3ffu) << 13));
    }
    return f32_from_bits(sign | ((exp + 127 - 15) << 23) | (mant << 13));
}

kt_fp16 kt_fp32_to_fp16(float f)
{
    const uint32_t u = f32_bits(f);
    const uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    const uint32_t a = u & 0x7fffffffu; /* |f| */

    if (a >= 0x7f800000u) { /* inf, or NaN: keep the top payload bits, force quiet */
        if (a == 0x7f800000u)
            return sign | 0x7c00u;
        return (kt_fp16)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
    }
    /* 65520 = 0x477ff000 lies halfway between 65504 (odd mantissa) and 65536:
     * it and everything above round to inf. */
    if (a >= 0x477ff000u)
        return sign | 0x7c00u;
    if (a < 0x38800000u) { /* below 2^-14: a subnormal half, or zero */
        if (a <= 0x33000000u) /* <= 2^-25: zero (2^-25 is a tie, 0 is even) */
            return sign;
        const uint32_t exp = a >> 23;                   /* 102 .. 112 */
        const uint32_t mant = (a & 0x7fffffu) | 0x800000u; /* f = mant * 2^(exp-150) */
        const uint32_t shift = 126 - exp;              /* to units of 2^-24: 14 .. 24 */
        uint32_t h = mant >> shift;
        const uint32_t rest = mant & ((1u << shift) - 1);
        const uint32_t half = 1u << (shift - 1);
        if (rest > half || (rest == half && (h & 1)))
            h++; /* may carry into the smallest normal, which is right */
        return (kt_fp16)(sign | h);
    }
    /* normal: rebias exponent 127 -> 15 and drop 13 mantissa bits, to nearest even;
     * a carry out of the mantissa correctly bumps the exponent (up to inf). */
    uint32_t h = (a >> 13) - ((127u - 15u) << 10);
    const uint32_t rest = a & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1)))
        h++;
    return (kt_fp16)(sign | h);
}

/* bfloat16 is the top half of a binary32. */
float kt_bf16_to_fp32(kt_bf16 h)
{
    return f32_from_bits((uint32_t)h << 16);
}

kt_bf16 kt_fp32_to_bf16(float f)
{
    const uint32_t u = f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) /* NaN: truncate, set the quiet bit */
        return (kt_bf16)((u >> 16) | 0x40u);
    /* add just under half an ulp, plus one more when the kept lsb is odd */
    return (kt_bf16)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/* ---------------------------------------------------------------------------- */
/* block unpacking                                                               */
/* ---------------------------------------------------------------------------- */

/* Legacy blocks: byte qs[j] holds element j in its low nibble and element j+16
 * in its high nibble; Q5 bit 4 of element j is bit j of the little-endian qh. */

static inline uint32_t load_u32_le(const uint8_t b[4])
{
    return (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
}

void kt_unpack_q4_0(const struct kt_block_q4_0 *b, int8_t q[KT_QK])
{
    for (int j = 0; j < KT_QK / 2; j++) {
        q[j] = (int8_t)((b->qs[j] & 0x0f) - 8);
        q[j + KT_QK / 2] = (int8_t)((b->qs[j] >> 4) - 8);
    }
}

void kt_unpack_q4_1(const struct kt_block_q4_1 *b, uint8_t q[KT_QK])
{
    for (int j = 0; j < KT_QK / 2; j++) {
        q[j] = b->qs[j] & 0x0f;
        q[j + KT_QK / 2] = b->qs[j] >> 4;
    }
}

void kt_unpack_q5_0(const struct kt_block_q5_0 *b, int8_t q[KT_QK])
{
    const uint32_t qh = load_u32_le(b->qh);
    for (int j = 0; j < KT_QK / 2; j++) {
        const int lo = (b->qs[j] & 0x0f) | (int)((qh >> j) & 1) << 4;
        const int hi = (b->qs[j] >> 4) | (int)((qh >> (j + 16)) & 1) << 4;
        q[j] = (int8_t)(lo - 16);
        q[j + KT_QK / 2] = (int8_t)(hi - 16);
    }
}

void kt_unpack_q5_1(const struct kt_block_q5_1 *b, uint8_t q[KT_QK])
{
    const uint32_t qh = load_u32_le(b->qh);
    for (int j = 0; j < KT_QK / 2; j++) {
        q[j] = (uint8_t)((b->qs[j] & 0x0f) | ((qh >> j) & 1) << 4);
        q[j + KT_QK / 2] = (uint8_t)((b->qs[j] >> 4) | ((qh >> (j + 16)) & 1) << 4);
    }
}

/*
 * scales[12] of Q4_K / Q5_K, 6-bit scale sc_j and min m_j for sub-blocks 0..7:
 *   bytes 0-3 : low 6 bits sc_0..3, top 2 bits = bits 4-5 of sc_4..7
 *   bytes 4-7 : low 6 bits m_0..3,  top 2 bits = bits 4-5 of m_4..7
 *   bytes 8-11: low nibble = bits 0-3 of sc_4..7, high nibble = bits 0-3 of m_4..7
 */
void kt_k_scale_min(const uint8_t scales[12], int j, uint8_t *sc, uint8_t *m)
{
    if (j < 4) {
        *sc = scales[j] & 63;
        *m = scales[j + 4] & 63;
    } else {
        *sc = (uint8_t)((scales[j + 4] & 0x0f) | (scales[j - 4] >> 6) << 4);
        *m = (uint8_t)((scales[j + 4] >> 4) | (scales[j] >> 6) << 4);
    }
}

static void k_pack_scale_min(const uint8_t sc[8], const uint8_t m[8], uint8_t scales[12])
{
    for (int j = 0; j < 4; j++) {
        scales[j] = (uint8_t)(sc[j] | (sc[j + 4] >> 4) << 6);
        scales[j + 4] = (uint8_t)(m[j] | (m[j + 4] >> 4) << 6);
        scales[j + 8] = (uint8_t)((sc[j + 4] & 0x0f) | (m[j + 4] & 0x0f) << 4);
    }
}

/* Q4_K qs: 4 chunks of 64 elements; byte qs[32c+l] holds element 64c+l in its
 * low nibble and element 64c+32+l in its high nibble. */
void kt_unpack_q4_K(const struct kt_block_q4_K *b, uint8_t q[KT_QK_K], uint8_t sc[8], uint8_t m[8])
{
    for (int j = 0; j < 8; j++)
        kt_k_scale_min(b->scales, j, &sc[j], &m[j]);
    for (int c = 0; c < 4; c++) {
        for (int l = 0; l < 32; l++) {
            q[64 * c + l] = b->qs[32 * c + l] & 0x0f;
            q[64 * c + 32 + l] = b->qs[32 * c + l] >> 4;
        }
    }
}

/* Q5_K: low nibbles as Q4_K; bit 4 of element 64c+l is bit 2c of qh[l], of
 * element 64c+32+l bit 2c+1 of qh[l]. */
void kt_unpack_q5_K(const struct kt_block_q5_K *b, uint8_t q[KT_QK_K], uint8_t sc[8], uint8_t m[8])
{
    for (int j = 0; j < 8; j++)
        kt_k_scale_min(b->scales, j, &sc[j], &m[j]);
    for (int c = 0; c < 4; c++) {
        for (int l = 0; l < 32; l++) {
            q[64 * c + l] = (uint8_t)((b->qs[32 * c + l] & 0x0f) | ((b->qh[l] >> (2 * c)) & 1) << 4);
            q[64 * c + 32 + l] = (uint8_t)((b->qs[32 * c + l] >> 4) | ((b->qh[l] >> (2 * c + 1)) & 1) << 4);
        }
    }
}

/*
 * Q6_K: two halves of 128 elements; in half n, for l < 32, with L = ql + 64n and
 * H = qh + 32n the 6-bit quants of elements 128n + l + {0, 32, 64, 96} are
 *   L[l] low nibble | H[l] bits 0-1,   L[l+32] low nibble | H[l] bits 2-3,
 *   L[l] high nibble | H[l] bits 4-5,  L[l+32] high nibble | H[l] bits 6-7.
 */
void kt_unpack_q6_K(const struct kt_block_q6_K *b, int8_t q[KT_QK_K])
{
    for (int n = 0; n < 2; n++) {
        const uint8_t *ql = b->ql + 64 * n;
        const uint8_t *qh = b->qh + 32 * n;
        int8_t *y = q + 128 * n;
        for (int l = 0; l < 32; l++) {
            y[l + 0] = (int8_t)(((ql[l] & 0x0f) | ((qh[l] >> 0) & 3) << 4) - 32);
            y[l + 32] = (int8_t)(((ql[l + 32] & 0x0f) | ((qh[l] >> 2) & 3) << 4) - 32);
            y[l + 64] = (int8_t)(((ql[l] >> 4) | ((qh[l] >> 4) & 3) << 4) - 32);
            y[l + 96] = (int8_t)(((ql[l + 32] >> 4) | ((qh[l] >> 6) & 3) << 4) - 32);
        }
    }
}

/* ---------------------------------------------------------------------------- */
/* to_float                                                                      */
/* ---------------------------------------------------------------------------- */

static void f32_to_float(const void *src, float *dst, int64_t n)
{
    memcpy(dst, src, (size_t)n * sizeof(float));
}

static void f16_to_float(const void *src, float *dst, int64_t n)
{
    const kt_fp16 *x = src;
    for (int64_t i = 0; i < n; i++)
        dst[i] = kt_fp16_to_fp32(x[i]);
}

static void bf16_to_float(const void *src, float *dst, int64_t n)
{
    const kt_bf16 *x = src;
    for (int64_t i = 0; i < n; i++)
        dst[i] = kt_bf16_to_fp32(x[i]);
}

static void q4_0_to_float(const void *src, float *y, int64_t n)
{
    const struct kt_block_q4_0 *x = src;
    for (int64_t i = 0; i < n / KT_QK; i++, y += KT_QK) {
        int8_t q[KT_QK];
        kt_unpack_q4_0(&x[i], q);
        const float d = kt_fp16_to_fp32(x[i].d);
        for (int j = 0; j < KT_QK; j++)
            y[j] = q[j] * d;
    }
}

static void q4_1_to_float(const void *src, float *y, int64_t n)
{
    const struct kt_block_q4_1 *x = src;
    for (int64_t i = 0; i < n / KT_QK; i++, y += KT_QK) {
        uint8_t q[KT_QK];
        kt_unpack_q4_1(&x[i], q);
        const float d = kt_fp16_to_fp32(x[i].d), m = kt_fp16_to_fp32(x[i].m);
        for (int j = 0; j < KT_QK; j++)
            y[j] = q[j] * d + m;
    }
}

static void q5_0_to_float(const void *src, float *y, int64_t n)
{
    const struct kt_block_q5_0 *x = src;
    for (int64_t i = 0; i < n / KT_QK; i++, y += KT_QK) {
        int8_t q[KT_QK];
        kt_unpack_q5_0(&x[i], q);
        const float d = kt_fp16_to_fp32(x[i].d);
        for (int j = 0; j < KT_QK; j++)
            y[j] = q[j] * d;
    }
}

static void q5_1_to_float(const void *src, float *y, int64_t n)
{
    const struct kt_block_q5_1 *x = src;
    for (int64_t i = 0; i < n / KT_QK; i++, y += KT_QK) {
        uint8_t q[KT_QK];
        kt_unpack_q5_1(&x[i], q);
        const float d = kt_fp16_to_fp32(x[i].d), m = kt_fp16_to_fp32(x[i].m);
        for (int j = 0; j < KT_QK; j++)
            y[j] = q[j] * d + m;
    }
}

static void q8_0_to_float(const void *src, float *y, int64_t n)
{
    const struct kt_block_q8_0 *x = src;
    for (int64_t i = 0; i < n / KT_QK; i++, y += KT_QK) {
        const float d = kt_fp16_to_fp32(x[i].d);
        for (int j = 0; j < KT_QK; j++)
            y[j] = x[i].qs[j] * d;
    }
}

static void q8_1_to_float(const void *src, float *y, int64_t n)
{
    const struct kt_block_q8_1 *x = src;
    for (int64_t i = 0; i < n / KT_QK; i++, y += KT_QK) {
        const float d = kt_fp16_to_fp32(x[i].d);
        for (int j = 0; j < KT_QK; j++)
            y[j] = x[i].qs[j] * d;
    }
}

/* y = d*sc_j*q - dmin*m_j over sub-block j of 32 (Q4_K and Q5_K alike). */
static void k_asym_to_float(float d, float dmin, const uint8_t q[KT_QK_K], const uint8_t sc[8],
                            const uint8_t m[8], float *y)
{
    for (int j = 0; j < 8; j++) {
        const float scale = d * sc[j], min = dmin * m[j];
        for (int l = 0; l < 32; l++)
            y[32 * j + l] = scale * q[32 * j + l] - min;
    }
}

static void q4_K_to_float(const void *src, float *y, int64_t n)
{
    const struct kt_block_q4_K *x = src;
    for (int64_t i = 0; i < n / KT_QK_K; i++, y += KT_QK_K) {
        uint8_t q[KT_QK_K], sc[8], m[8];
        kt_unpack_q4_K(&x[i], q, sc, m);
        k_asym_to_float(kt_fp16_to_fp32(x[i].d), kt_fp16_to_fp32(x[i].dmin), q, sc, m, y);
    }
}

static void q5_K_to_float(const void *src, float *y, int64_t n)
{
    const struct kt_block_q5_K *x = src;
    for (int64_t i = 0; i < n / KT_QK_K; i++, y += KT_QK_K) {
        uint8_t q[KT_QK_K], sc[8], m[8];
        kt_unpack_q5_K(&x[i], q, sc, m);
        k_asym_to_float(kt_fp16_to_fp32(x[i].d), kt_fp16_to_fp32(x[i].dmin), q, sc, m, y);
    }
}

static void q6_K_to_float(const void *src, float *y, int64_t n)
{
    const struct kt_block_q6_K *x = src;
    for (int64_t i = 0; i < n / KT_QK_K; i++, y += KT_QK_K) {
        int8_t q[KT_QK_K];
        kt_unpack_q6_K(&x[i], q);
        const float d = kt_fp16_to_fp32(x[i].d);
        for (int g = 0; g < 16; g++) {
            const float scale = d * x[i].scales[g];
            for (int l = 0; l < 16; l++)
                y[16 * g + l] = scale * q[16 * g + l];
        }
    }
}

static void q8_K_to_float(const void *src, float *y, int64_t n)
{
    const struct kt_block_q8_K *x = src;
    for (int64_t i = 0; i < n / KT_QK_K; i++, y += KT_QK_K)
        for (int j = 0; j < KT_QK_K; j++)
            y[j] = x[i].d * x[i].qs[j];
}

/* ---------------------------------------------------------------------------- */
/* from_float                                                                    */
/* ---------------------------------------------------------------------------- */

/* v clamped to [lo, hi]; NaN gives lo.  Keeps float->int conversions defined. */
static inline float clampf(float v, float lo, float hi)
{
    v = v > lo ? v : lo;
    return v < hi ? v : hi;
}

/* Round to nearest, ties to even, for |v| < 2^22: adding 1.5*2^23 leaves the
 * integer in the low mantissa bits (ggml's nearest_int). */
static inline int nearest_int(float v)
{
    const float t = v + 12582912.0f;
    int32_t i;
    memcpy(&i, &t, sizeof i);
    return (i & 0x007fffff) - 0x00400000;
}

/* 1/d, or 0 when d is 0 or so small (subnormal) that 1/d would overflow: such
 * a block reads back as 0 whatever its quants, so they are all made 0. */
static inline float inverse_or_zero(float d)
{
    return fabsf(d) >= FLT_MIN ? 1.0f / d : 0.0f;
}

/* The element of largest magnitude, sign kept (the first one on ties). */
static inline float signed_absmax(const float *x, int n)
{
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < n; j++) {
        if (amax < fabsf(x[j])) {
            amax = fabsf(x[j]);
            max = x[j];
        }
    }
    return max;
}

static void f32_from_float(const float *src, void *dst, int64_t n)
{
    memcpy(dst, src, (size_t)n * sizeof(float));
}

static void f16_from_float(const float *src, void *dst, int64_t n)
{
    kt_fp16 *y = dst;
    for (int64_t i = 0; i < n; i++)
        y[i] = kt_fp32_to_fp16(src[i]);
}

static void bf16_from_float(const float *src, void *dst, int64_t n)
{
    kt_bf16 *y = dst;
    for (int64_t i = 0; i < n; i++)
        y[i] = kt_fp32_to_bf16(src[i]);
}

/* Q4_0: the largest-magnitude element maps to q = 0 (x = -8d), so d = max / -8;
 * q = trunc(x/d + 8.5) clamped to 15 (ggml's quantize_row_q4_0_ref). */
static void q4_0_from_float(const float *x, void *dst, int64_t n)
{
    struct kt_block_q4_0 *y = dst;
    for (int64_t i = 0; i < n / KT_QK; i++, x += KT_QK) {
        const float d = signed_absmax(x, KT_QK) / -8.0f;
        const float id = inverse_or_zero(d);
        y[i].d = kt_fp32_to_fp16(d);
        for (int j = 0; j < KT_QK / 2; j++) {
            const int lo = (int)clampf(x[j] * id + 8.5f, 0.0f, 15.0f);
            const int hi = (int)clampf(x[j + KT_QK / 2] * id + 8.5f, 0.0f, 15.0f);
            y[i].qs[j] = (uint8_t)(lo | hi << 4);
        }
    }
}

/* Q4_1: d = (max - min) / 15, m = min; q = trunc((x - min)/d + 0.5) <= 15. */
static void q4_1_from_float(const float *x, void *dst, int64_t n)
{
    struct kt_block_q4_1 *y = dst;
    for (int64_t i = 0; i < n / KT_QK; i++, x += KT_QK) {
        float min = x[0], max = x[0];
        for (int j = 1; j < KT_QK; j++) {
            min = x[j] < min ? x[j] : min;
            max = x[j] > max ? x[j] : max;
        }
        const float d = (max - min) / 15.0f;
        const float id = inverse_or_zero(d);
        y[i].d = kt_fp32_to_fp16(d);
        y[i].m = kt_fp32_to_fp16(min);
        for (int j = 0; j < KT_QK / 2; j++) {
            const int lo = (int)clampf((x[j] - min) * id + 0.5f, 0.0f, 15.0f);
            const int hi = (int)clampf((x[j + KT_QK / 2] - min) * id + 0.5f, 0.0f, 15.0f);
            y[i].qs[j] = (uint8_t)(lo | hi << 4);
        }
    }
}

static void store_u32_le(uint8_t b[4], uint32_t v)
{
    b[0] = (uint8_t)v;
    b[1] = (uint8_t)(v >> 8);
    b[2] = (uint8_t)(v >> 16);
    b[3] = (uint8_t)(v >> 24);
}

/* Q5_0: d = max / -16; q = trunc(x/d + 16.5) clamped to 31. */
static void q5_0_from_float(const float *x, void *dst, int64_t n)
{
    struct kt_block_q5_0 *y = dst;
    for (int64_t i = 0; i < n / KT_QK; i++, x += KT_QK) {
        const float d = signed_absmax(x, KT_QK) / -16.0f;
        const float id = inverse_or_zero(d);
        uint32_t qh = 0;
        y[i].d = kt_fp32_to_fp16(d);
        for (int j = 0; j < KT_QK / 2; j++) {
            const uint32_t lo = (uint32_t)clampf(x[j] * id + 16.5f, 0.0f, 31.0f);
            const uint32_t hi = (uint32_t)clampf(x[j + KT_QK / 2] * id + 16.5f, 0.0f, 31.0f);
            y[i].qs[j] = (uint8_t)((lo & 0x0f) | (hi & 0x0f) << 4);
            qh |= (lo >> 4) << j | (hi >> 4) << (j + 16);
        }
        store_u32_le(y[i].qh, qh);
    }
}

/* Q5_1: d = (max - min) / 31, m = min; q = trunc((x - min)/d + 0.5) <= 31. */
static void q5_1_from_float(const float *x, void *dst, int64_t n)
{
    struct kt_block_q5_1 *y = dst;
    for (int64_t i = 0; i < n / KT_QK; i++, x += KT_QK) {
        float min = x[0], max = x[0];
        for (int j = 1; j < KT_QK; j++) {
            min = x[j] < min ? x[j] : min;
            max = x[j] > max ? x[j] : max;
        }
        const float d = (max - min) / 31.0f;
        const float id = inverse_or_zero(d);
        uint32_t qh = 0;
        y[i].d = kt_fp32_to_fp16(d);
        y[i].m = kt_fp32_to_fp16(min);
        for (int j = 0; j < KT_QK / 2; j++) {
            const uint32_t lo = (uint32_t)clampf((x[j] - min) * id + 0.5f, 0.0f, 31.0f);
            const uint32_t hi = (uint32_t)clampf((x[j + KT_QK / 2] - min) * id + 0.5f, 0.0f, 31.0f);
            y[i].qs[j] = (uint8_t)((lo & 0x0f) | (hi & 0x0f) << 4);
            qh |= (lo >> 4) << j | (hi >> 4) << (j + 16);
        }
        store_u32_le(y[i].qh, qh);
    }
}

/* roundf (half away from zero) for |v| < 2^23 without a libm call: the
 * fraction v - trunc(v) is exact, so comparing it with 0.5 decides exactly. */
static inline int round_half_away(float v)
{
    const int t = (int)v;
    const float frac = v - (float)t;
    return t + (frac >= 0.5f) - (frac <= -0.5f);
}

/* Q8_0 / Q8_1: d = amax / 127; q = roundf(x/d) (half away from zero).  Returns
 * the sum of the quants (Q8_1 stores s = d * sum). */
static int q8_block(const float *x, int8_t qs[KT_QK], float *d_out)
{
    float lane[8] = {0}; /* 8 independent maxima: one vector register */
    for (int j = 0; j < KT_QK; j += 8)
        for (int k = 0; k < 8; k++)
            lane[k] = fabsf(x[j + k]) > lane[k] ? fabsf(x[j + k]) : lane[k];
    float amax = 0.0f;
    for (int k = 0; k < 8; k++)
        amax = lane[k] > amax ? lane[k] : amax;
    const float d = amax / 127.0f;
    const float id = inverse_or_zero(d);
    int sum = 0;
    for (int j = 0; j < KT_QK; j++) {
        qs[j] = (int8_t)round_half_away(clampf(x[j] * id, -127.0f, 127.0f));
        sum += qs[j];
    }
    *d_out = d;
    return sum;
}

static void q8_0_from_float(const float *x, void *dst, int64_t n)
{
    struct kt_block_q8_0 *y = dst;
    for (int64_t i = 0; i < n / KT_QK; i++, x += KT_QK) {
        float d;
        q8_block(x, y[i].qs, &d);
        y[i].d = kt_fp32_to_fp16(d);
    }
}

static void q8_1_from_float(const float *x, void *dst, int64_t n)
{
    struct kt_block_q8_1 *y = dst;
    for (int64_t i = 0; i < n / KT_QK; i++, x += KT_QK) {
        float d;
        const int sum = q8_block(x, y[i].qs, &d);
        y[i].d = kt_fp32_to_fp16(d);
        y[i].s = kt_fp32_to_fp16(d * (float)sum);
    }
}

/* Q8_K: the signed max maps to -127 (iscale = -127/max), q = nearest_int (ties
 * to even) capped at 127, d = 1/iscale kept as f32; bsums[g] = sum of qs[16g..16g+15]. */
static void q8_K_from_float(const float *x, void *dst, int64_t n)
{
    struct kt_block_q8_K *y = dst;
    for (int64_t i = 0; i < n / KT_QK_K; i++, x += KT_QK_K) {
        const float max = signed_absmax(x, KT_QK_K);
        if (fabsf(max) < 0x1p-120f) { /* zero, or so small that -127/max would overflow */
            memset(&y[i], 0, sizeof y[i]);
            continue;
        }
        const float iscale = -127.0f / max;
        for (int j = 0; j < KT_QK_K; j++) {
            const int q = nearest_int(clampf(iscale * x[j], -128.0f, 127.0f));
            y[i].qs[j] = (int8_t)q;
        }
        for (int g = 0; g < KT_QK_K / 16; g++) {
            int sum = 0;
            for (int l = 0; l < 16; l++)
                sum += y[i].qs[16 * g + l];
            y[i].bsums[g] = (int16_t)sum;
        }
        y[i].d = 1.0f / iscale;
    }
}

/*
 * Q4_K / Q5_K, round to nearest.  For each sub-block j of 32 values:
 *   lo_j = min(min x, 0), scale_j = (max x - lo_j) / nmax, min_j = -lo_j >= 0.
 * The super-block keeps d = max scale_j / 63 and dmin = max min_j / 63 as fp16;
 * each scale_j and min_j becomes a 6-bit integer against the *rounded* d and
 * dmin, and every value is rounded with the scale and min it will be read back
 * with: q = round((x + dmin*m_j) / (d*sc_j)) in [0, nmax].
 */
static void k_asym_quantize(const float *x, int nmax, uint8_t q[KT_QK_K], uint8_t sc[8], uint8_t m[8],
                            kt_fp16 *d_out, kt_fp16 *dmin_out)
{
    float scale[8], min[8], max_scale = 0.0f, max_min = 0.0f;
    for (int j = 0; j < 8; j++) {
        const float *xs = x + 32 * j;
        /* 8 independent lanes so the compiler can keep them in one vector */
        float lo[8], hi[8];
        for (int k = 0; k < 8; k++)
            lo[k] = hi[k] = xs[k];
        for (int l = 8; l < 32; l += 8) {
            for (int k = 0; k < 8; k++) {
                lo[k] = xs[l + k] < lo[k] ? xs[l + k] : lo[k];
                hi[k] = xs[l + k] > hi[k] ? xs[l + k] : hi[k];
            }
        }
        float mn = 0.0f, mx = hi[0];
        for (int k = 0; k < 8; k++) {
            mn = lo[k] < mn ? lo[k] : mn;
            mx = hi[k] > mx ? hi[k] : mx;
        }
        scale[j] = (mx - mn) / (float)nmax;
        min[j] = -mn;
        max_scale = scale[j] > max_scale ? scale[j] : max_scale;
        max_min = min[j] > max_min ? min[j] : max_min;
    }

    *d_out = kt_fp32_to_fp16(max_scale / 63.0f);
    *dmin_out = kt_fp32_to_fp16(max_min / 63.0f);
    const float d = kt_fp16_to_fp32(*d_out), dmin = kt_fp16_to_fp32(*dmin_out);
    const float id = d > 0.0f ? 1.0f / d : 0.0f, idmin = dmin > 0.0f ? 1.0f / dmin : 0.0f;

    for (int j = 0; j < 8; j++) {
        sc[j] = (uint8_t)nearest_int(clampf(scale[j] * id, 0.0f, 63.0f));
        m[j] = (uint8_t)nearest_int(clampf(min[j] * idmin, 0.0f, 63.0f));
        const float step = d * sc[j], offset = dmin * m[j];
        const float istep = step > 0.0f ? 1.0f / step : 0.0f;
        const float top = (float)nmax;
        const float *xs = x + 32 * j;
        for (int l = 0; l < 32; l++) /* v >= 0 after the clamp: +0.5 and truncate rounds */
            q[32 * j + l] = (uint8_t)(int)clampf((xs[l] + offset) * istep + 0.5f, 0.0f, top);
    }
}

static void q4_K_from_float(const float *x, void *dst, int64_t n)
{
    struct kt_block_q4_K *y = dst;
    for (int64_t i = 0; i < n / KT_QK_K; i++, x += KT_QK_K) {
        uint8_t q[KT_QK_K], sc[8], m[8];
        k_asym_quantize(x, 15, q, sc, m, &y[i].d, &y[i].dmin);
        k_pack_scale_min(sc, m, y[i].scales);
        for (int c = 0; c < 4; c++)
            for (int l = 0; l < 32; l++)
                y[i].qs[32 * c + l] = (uint8_t)(q[64 * c + l] | q[64 * c + 32 + l] << 4);
    }
}

static void q5_K_from_float(const float *x, void *dst, int64_t n)
{
    struct kt_block_q5_K *y = dst;
    for (int64_t i = 0; i < n / KT_QK_K; i++, x += KT_QK_K) {
        uint8_t q[KT_QK_K], sc[8], m[8];
        k_asym_quantize(x, 31, q, sc, m, &y[i].d, &y[i].dmin);
        k_pack_scale_min(sc, m, y[i].scales);
        memset(y[i].qh, 0, sizeof y[i].qh);
        for (int c = 0; c < 4; c++) {
            for (int l = 0; l < 32; l++) {
                const uint8_t lo = q[64 * c + l], hi = q[64 * c + 32 + l];
                y[i].qs[32 * c + l] = (uint8_t)((lo & 0x0f) | (hi & 0x0f) << 4);
                y[i].qh[l] |= (uint8_t)((lo >> 4) << (2 * c) | (hi >> 4) << (2 * c + 1));
            }
        }
    }
}

/*
 * Q6_K, round to nearest.  Sub-block g of 16 values: its signed max maps to
 * q = -32, scale_g = max / -32.  The super-block's largest-magnitude scale maps
 * to int8 -128: d = scale / -128 as fp16; the int8 scales are rounded against
 * the rounded d, and each value with the scale it will be read back with.
 */
static void q6_K_from_float(const float *x, void *dst, int64_t n)
{
    struct kt_block_q6_K *y = dst;
    for (int64_t i = 0; i < n / KT_QK_K; i++, x += KT_QK_K) {
        float scale[16], max_scale = 0.0f;
        for (int g = 0; g < 16; g++) {
            scale[g] = signed_absmax(x + 16 * g, 16) / -32.0f;
            if (fabsf(scale[g]) > fabsf(max_scale))
                max_scale = scale[g];
        }
        memset(&y[i], 0, sizeof y[i]);
        y[i].d = kt_fp32_to_fp16(max_scale / -128.0f);
        const float d = kt_fp16_to_fp32(y[i].d);
        if (d == 0.0f)
            continue; /* all zero, or too small for fp16: the block reads back as 0 */

        uint8_t q[KT_QK_K];
        const float id = 1.0f / d;
        for (int g = 0; g < 16; g++) {
            const int s = nearest_int(clampf(scale[g] * id, -128.0f, 127.0f));
            y[i].scales[g] = (int8_t)s;
            const float step = d * (float)s;
            const float istep = step != 0.0f ? 1.0f / step : 0.0f;
            for (int l = 0; l < 16; l++) /* q-32 in [-32, 31], shifted to [0, 63] */
                q[16 * g + l] = (uint8_t)(int)clampf(x[16 * g + l] * istep + 32.5f, 0.0f, 63.0f);
        }
        for (int nh = 0; nh < 2; nh++) {
            const uint8_t *qn = q + 128 * nh;
            uint8_t *ql = y[i].ql + 64 * nh, *qh = y[i].qh + 32 * nh;
            for (int l = 0; l < 32; l++) {
                const uint8_t q1 = qn[l], q2 = qn[l + 32], q3 = qn[l + 64], q4 = qn[l + 96];
                ql[l] = (uint8_t)((q1 & 0x0f) | (q3 & 0x0f) << 4);
                ql[l + 32] = (uint8_t)((q2 & 0x0f) | (q4 & 0x0f) << 4);
                qh[l] = (uint8_t)((q1 >> 4) | (q2 >> 4) << 2 | (q3 >> 4) << 4 | (q4 >> 4) << 6);
            }
        }
    }
}

/* ---------------------------------------------------------------------------- */
/* native formats: MXFP4 (GGUF type 39) and kt's FP8_B128                        */
/* ---------------------------------------------------------------------------- */

/* Decoding is hf_formats.c's, the formats' definition. */
static void mxfp4_to_float(const void *src, float *dst, int64_t n)
{
    kt_mxfp4_gguf_to_f32(src, dst, n);
}

/* The E2M1 code (0..7) whose doubled magnitude {0,1,2,3,4,6,8,12} is nearest
 * to v >= 0; a tie goes to the even code, as round-to-nearest-even would. */
static uint8_t e2m1_nearest_doubled(float v)
{
    static const float doubled[8] = {0, 1, 2, 3, 4, 6, 8, 12};
    uint8_t best = 0;
    for (uint8_t c = 1; c < 8; c++) {
        const float dc = fabsf(doubled[c] - v), db = fabsf(doubled[best] - v);
        if (dc < db || (dc == db && (c & 1) == 0))
            best = c;
    }
    return best;
}

/* Per block: the smallest scale 2^(e-128) with amax <= 12 * scale (e clamped
 * to 0..254), then every value to its nearest doubled E2M1 code. */
static void mxfp4_from_float(const float *src, void *dst, int64_t n)
{
    struct kt_block_mxfp4 *y = dst;
    for (int64_t i = 0; i < n / KT_QK; i++) {
        const float *x = src + i * KT_QK;
        float amax = 0.0f;
        for (int j = 0; j < KT_QK; j++)
            amax = fabsf(x[j]) > amax ? fabsf(x[j]) : amax;
        int e = 127;
        if (amax > 0.0f) {
            int k;
            const float m = frexpf(amax / 12.0f, &k); /* amax/12 = m * 2^k, m in [0.5, 1) */
            e = 128 + (m > 0.5f ? k : k - 1);
            e = e < 0 ? 0 : e > 254 ? 254 : e;
        }
        const float inv = 1.0f / kt_e8m0_half_to_f32((uint8_t)e);
        struct kt_block_mxfp4 b = {.e = (uint8_t)e};
        for (int j = 0; j < KT_QK; j++) {
            const uint8_t code = (uint8_t)(e2m1_nearest_doubled(fabsf(x[j]) * inv) | (x[j] < 0.0f ? 8u : 0u));
            b.qs[j % 16] |= (uint8_t)(j < 16 ? code : code << 4);
        }
        memcpy(&y[i], &b, sizeof b);
    }
}

/* x = e4m3(q) * d, one F32 multiply: kt_fp8_block_row_to_f32's value. */
static void fp8_b128_to_float(const void *src, float *dst, int64_t n)
{
    const struct kt_block_fp8_b128 *x = src;
    for (int64_t i = 0; i < n; i++)
        dst[i] = kt_fp8_e4m3_to_f32(x[i / KT_QK_FP8].q[i % KT_QK_FP8]) * x[i / KT_QK_FP8].d;
}

/* Per block of 128: d = amax / 448, q = the code nearest to x / d. */
static void fp8_b128_from_float(const float *src, void *dst, int64_t n)
{
    struct kt_block_fp8_b128 *y = dst;
    for (int64_t i = 0; i < n / KT_QK_FP8; i++) {
        const float *x = src + i * KT_QK_FP8;
        float amax = 0.0f;
        for (int j = 0; j < KT_QK_FP8; j++)
            amax = fabsf(x[j]) > amax ? fabsf(x[j]) : amax;
        struct kt_block_fp8_b128 b = {.d = amax > 0.0f ? amax / 448.0f : 1.0f};
        for (int j = 0; j < KT_QK_FP8; j++)
            b.q[j] = kt_f32_to_fp8_e4m3(x[j] / b.d); /* nearest, ties to even, saturating (hf_formats.h) */
        memcpy(&y[i], &b, sizeof b);
    }
}

/* ---------------------------------------------------------------------------- */
/* the traits table                                                              */
/* ---------------------------------------------------------------------------- */

/* Sizes from ggml-common.h / gguf-py GGML_QUANT_SIZES.  Types kt only knows the
 * size of have no to_float; vec_dot_type there is what ggml would use. */
static const struct kt_type_traits type_traits[KT_TYPE_COUNT] = {
    [KT_TYPE_F32] = {"f32", 1, 4, false, f32_to_float, f32_from_float, KT_TYPE_F32, kt_vec_dot_f32_f32_ref},
    [KT_TYPE_F16] = {"f16", 1, 2, false, f16_to_float, f16_from_float, KT_TYPE_F32, kt_vec_dot_f16_f32_ref},
    [KT_TYPE_BF16] = {"bf16", 1, 2, false, bf16_to_float, bf16_from_float, KT_TYPE_F32, kt_vec_dot_bf16_f32_ref},
    [KT_TYPE_Q4_0] = {"q4_0", KT_QK, sizeof(struct kt_block_q4_0), true, q4_0_to_float, q4_0_from_float,
                      KT_TYPE_Q8_0, kt_vec_dot_q4_0_q8_0_ref},
    [KT_TYPE_Q4_1] = {"q4_1", KT_QK, sizeof(struct kt_block_q4_1), true, q4_1_to_float, q4_1_from_float,
                      KT_TYPE_Q8_1, kt_vec_dot_q4_1_q8_1_ref},
    [KT_TYPE_Q5_0] = {"q5_0", KT_QK, sizeof(struct kt_block_q5_0), true, q5_0_to_float, q5_0_from_float,
                      KT_TYPE_Q8_0, kt_vec_dot_q5_0_q8_0_ref},
    [KT_TYPE_Q5_1] = {"q5_1", KT_QK, sizeof(struct kt_block_q5_1), true, q5_1_to_float, q5_1_from_float,
                      KT_TYPE_Q8_1, kt_vec_dot_q5_1_q8_1_ref},
    [KT_TYPE_Q8_0] = {"q8_0", KT_QK, sizeof(struct kt_block_q8_0), true, q8_0_to_float, q8_0_from_float,
                      KT_TYPE_Q8_0, kt_vec_dot_q8_0_q8_0_ref},
    [KT_TYPE_Q8_1] = {"q8_1", KT_QK, sizeof(struct kt_block_q8_1), true, q8_1_to_float, q8_1_from_float,
                      KT_TYPE_Q8_1, NULL},
    [KT_TYPE_Q2_K] = {"q2_K", KT_QK_K, 84, true, NULL, NULL, KT_TYPE_Q8_K, NULL},
    [KT_TYPE_Q3_K] = {"q3_K", KT_QK_K, 110, true, NULL, NULL, KT_TYPE_Q8_K, NULL},
    [KT_TYPE_Q4_K] = {"q4_K", KT_QK_K, sizeof(struct kt_block_q4_K), true, q4_K_to_float, q4_K_from_float,
                      KT_TYPE_Q8_K, kt_vec_dot_q4_K_q8_K_ref},
    [KT_TYPE_Q5_K] = {"q5_K", KT_QK_K, sizeof(struct kt_block_q5_K), true, q5_K_to_float, q5_K_from_float,
                      KT_TYPE_Q8_K, kt_vec_dot_q5_K_q8_K_ref},
    [KT_TYPE_Q6_K] = {"q6_K", KT_QK_K, sizeof(struct kt_block_q6_K), true, q6_K_to_float, q6_K_from_float,
                      KT_TYPE_Q8_K, kt_vec_dot_q6_K_q8_K_ref},
    [KT_TYPE_Q8_K] = {"q8_K", KT_QK_K, sizeof(struct kt_block_q8_K), true, q8_K_to_float, q8_K_from_float,
                      KT_TYPE_Q8_K, NULL},
    [KT_TYPE_IQ2_XXS] = {"iq2_xxs", KT_QK_K, 66, true, NULL, NULL, KT_TYPE_Q8_K, NULL},
    [KT_TYPE_IQ2_XS] = {"iq2_xs", KT_QK_K, 74, true, NULL, NULL, KT_TYPE_Q8_K, NULL},
    [KT_TYPE_IQ3_XXS] = {"iq3_xxs", KT_QK_K, 98, true, NULL, NULL, KT_TYPE_Q8_K, NULL},
    [KT_TYPE_IQ1_S] = {"iq1_s", KT_QK_K, 50, true, NULL, NULL, KT_TYPE_Q8_K, NULL},
    [KT_TYPE_IQ4_NL] = {"iq4_nl", KT_QK, 18, true, NULL, NULL, KT_TYPE_Q8_0, NULL},
    [KT_TYPE_IQ3_S] = {"iq3_s", KT_QK_K, 110, true, NULL, NULL, KT_TYPE_Q8_K, NULL},
    [KT_TYPE_IQ2_S] = {"iq2_s", KT_QK_K, 82, true, NULL, NULL, KT_TYPE_Q8_K, NULL},
    [KT_TYPE_IQ4_XS] = {"iq4_xs", KT_QK_K, 136, true, NULL, NULL, KT_TYPE_Q8_K, NULL},
    [KT_TYPE_I8] = {"i8", 1, 1, false, NULL, NULL, KT_TYPE_I8, NULL},
    [KT_TYPE_I16] = {"i16", 1, 2, false, NULL, NULL, KT_TYPE_I16, NULL},
    [KT_TYPE_I32] = {"i32", 1, 4, false, NULL, NULL, KT_TYPE_I32, NULL},
    [KT_TYPE_I64] = {"i64", 1, 8, false, NULL, NULL, KT_TYPE_I64, NULL},
    [KT_TYPE_F64] = {"f64", 1, 8, false, NULL, NULL, KT_TYPE_F64, NULL},
    [KT_TYPE_IQ1_M] = {"iq1_m", KT_QK_K, 56, true, NULL, NULL, KT_TYPE_Q8_K, NULL},
    [KT_TYPE_TQ1_0] = {"tq1_0", KT_QK_K, 54, true, NULL, NULL, KT_TYPE_Q8_K, NULL},
    [KT_TYPE_TQ2_0] = {"tq2_0", KT_QK_K, 66, true, NULL, NULL, KT_TYPE_Q8_K, NULL},
    [KT_TYPE_MXFP4] = {"mxfp4", KT_QK, sizeof(struct kt_block_mxfp4), true, mxfp4_to_float, mxfp4_from_float,
                       KT_TYPE_Q8_0, kt_vec_dot_mxfp4_q8_0_ref},
    [KT_TYPE_FP8_B128] = {"fp8_b128", KT_QK_FP8, sizeof(struct kt_block_fp8_b128), true, fp8_b128_to_float,
                          fp8_b128_from_float, KT_TYPE_F32, kt_vec_dot_fp8_b128_f32_ref},
};

const struct kt_type_traits *kt_type_traits(int type)
{
    if (type < 0 || type >= KT_TYPE_COUNT || type_traits[type].name == NULL)
        return NULL;
    return &type_traits[type];
}

const char *kt_type_name(int type)
{
    const struct kt_type_traits *t = kt_type_traits(type);
    return t ? t->name : "unknown";
}

int kt_type_from_name(const char *name)
{
    if (!name)
        return -1;
    for (int type = 0; type < KT_TYPE_COUNT; type++) {
        const char *a = type_traits[type].name, *b = name;
        if (!a)
            continue;
        while (*a && *b && tolower((unsigned char)*a) == tolower((unsigned char)*b)) {
            a++;
            b++;
        }
        if (*a == 0 && *b == 0)
            return type;
    }
    return -1;
}

size_t kt_type_row_bytes(int type, int64_t n)
{
    const struct kt_type_traits *t = kt_type_traits(type);
    if (!t || n < 0 || n % t->block_elems != 0)
        return 0;
    return (size_t)(n / t->block_elems) * t->block_bytes;
}
