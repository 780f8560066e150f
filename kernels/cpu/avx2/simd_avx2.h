/*
 * simd_avx2.h - small inline helpers shared by the AVX2 kernel files.
 *
 * Include this only from files compiled with -mavx2 -mfma -mf16c (those under
 * kernels/cpu/avx2/): its inline functions must never be instantiated in a
 * file that runs before CPUID has been checked.
 */
#ifndef KT_SIMD_AVX2_H
#define KT_SIMD_AVX2_H

#if !defined(__AVX2__) || !defined(__FMA__) || !defined(__F16C__)
#error "simd_avx2.h needs -mavx2 -mfma -mf16c (kernels/CMakeLists.txt sets them for cpu/avx2/*.c)"
#endif

#include <float.h>
#include <immintrin.h>
#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "quant.h"

/*
 * Weight rows stream from DRAM once per token: the kernels prefetch this far
 * ahead of the bytes they are reading (past the end of a row that is the next
 * row, which is what a GEMV reads next).  A prefetch never faults.  Measured
 * on a Sapphire Rapids VM, one thread streaming Q4_K rows: ~55% of a STREAM
 * triad without it, 85-90% from 3 KiB on (no gain beyond 8 KiB, nor from T1).
 */
#define KT_AVX2_PREFETCH_BYTES 4096

/* Prefetches the lines of [p, p + bytes) KT_AVX2_PREFETCH_BYTES ahead (the
 * address is formed as an integer: it may lie past the end of the object). */
static inline void prefetch_ahead(const void *p, size_t bytes)
{
    for (size_t off = 0; off < bytes; off += 64)
        _mm_prefetch((const char *)((uintptr_t)p + KT_AVX2_PREFETCH_BYTES + off), _MM_HINT_T0);
}

/* fp16 -> fp32, exact (F16C), the same value as kt_fp16_to_fp32. */
static inline float fp16_to_f32(kt_fp16 h)
{
    return _cvtsh_ss(h);
}

static inline uint32_t load_u32(const void *p)
{
    uint32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* Four fp16 scalars widened exactly (packed with integer ops, which keeps the
 * vector ports free for the dot products). */
static inline __m128 four_fp16(kt_fp16 a, kt_fp16 b, kt_fp16 c, kt_fp16 d)
{
    const uint64_t packed = (uint64_t)a | (uint64_t)b << 16 | (uint64_t)c << 32 | (uint64_t)d << 48;
    return _mm_cvtph_ps(_mm_cvtsi64_si128((long long)packed));
}

/* sum += t[0]; sum += t[1]; ... in lane order, as a scalar loop would. */
static inline float add_lanes_in_order(float sum, __m128 t)
{
    float lane[4];
    _mm_storeu_ps(lane, t);
    sum += lane[0];
    sum += lane[1];
    sum += lane[2];
    sum += lane[3];
    return sum;
}

static inline float hsum_ps(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* Sums of the int32 lanes (exact, wrapping like any int32 sum). */
static inline int32_t hsum_epi32_128(__m128i s)
{
    s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm_cvtsi128_si32(s);
}

static inline int32_t hsum_epi32(__m256i v)
{
    return hsum_epi32_128(_mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1)));
}

/* [sum(v0), sum(v1), sum(v2), sum(v3)]: four 8-lane int32 reductions at once. */
static inline __m128i hsum4_epi32(__m256i v0, __m256i v1, __m256i v2, __m256i v3)
{
    const __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(v0, v1), _mm256_hadd_epi32(v2, v3));
    return _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
}

/* 32 4-bit values of a legacy block: byte j's low nibble -> byte j, its high
 * nibble -> byte j+16 (elements 0..15 and 16..31), each in [0, 15]. */
/* The 6-bit scales sc_0..7 (bytes 0-7) and mins m_0..7 (bytes 8-15) of a
 * Q4_K/Q5_K block: kt_k_scale_min's unpacking.  The 16-byte load reads the
 * 4 bytes after scales[12], which lie inside the block (its quants). */
static inline __m128i k_scales_mins_128(const uint8_t scales[12])
{
    const __m128i v = _mm_loadu_si128((const __m128i *)scales);
    const __m128i words = _mm_shuffle_epi32(v, _MM_SHUFFLE(2, 1, 2, 0));
    const __m128i tops = _mm_shuffle_epi32(v, _MM_SHUFFLE(1, 1, 0, 0));
    const __m128i low = _mm_and_si128(_mm_srlv_epi32(words, _mm_setr_epi32(0, 0, 0, 4)),
                                      _mm_setr_epi32(0x3f3f3f3f, 0x0f0f0f0f, 0x3f3f3f3f, 0x0f0f0f0f));
    const __m128i high = _mm_and_si128(_mm_srli_epi32(tops, 2), _mm_setr_epi32(0, 0x30303030, 0, 0x30303030));
    return _mm_or_si128(low, high);
}

static inline __m256i unpack_nibbles_32(const uint8_t qs[16])
{
    const __m256i both = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)qs));
    const __m256i shifted = _mm256_srlv_epi32(both, _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4));
    return _mm256_and_si256(shifted, _mm256_set1_epi8(0x0f));
}

/* Byte j = 0xff if bit j of the 32-bit value is set, else 0. */
static inline __m256i bits_to_bytes_32(uint32_t bits)
{
    const __m256i spread = _mm256_shuffle_epi8(
        _mm256_set1_epi32((int)bits),
        _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0x0000000000000000));
    /* every byte of spread holds the 8 bits of its group; OR in all bits but bit (j % 8) */
    const __m256i others = _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe);
    return _mm256_cmpeq_epi8(_mm256_or_si256(spread, others), _mm256_set1_epi64x(-1));
}

/* Eight int32 lanes summing x[k]*y[k] over 32 signed bytes, exact.  y must not
 * hold -128 (it is negated where x < 0); x may be anything. */
static inline __m256i dot_i8_32(__m256i x, __m256i y)
{
    const __m256i ax = _mm256_sign_epi8(x, x); /* |x|: -128 becomes 0x80 = 128 unsigned */
    const __m256i sy = _mm256_sign_epi8(y, x);
    return _mm256_madd_epi16(_mm256_maddubs_epi16(ax, sy), _mm256_set1_epi16(1));
}

/* ---- native formats (MXFP4, FP8_B128) ------------------------------------------ */

/* 2^(e-128), exact: kt_e8m0_half_to_f32 with integer ops. */
static inline float e8m0_half_f32(uint8_t e)
{
    const uint32_t u = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* The 32 doubled E2M1 values of an MXFP4 block (16 bytes: low nibbles elements
 * 0..15, high nibbles 16..31) as signed bytes in [-12, 12]: kt_unpack_mxfp4. */
static inline __m256i mxfp4_quants_32(const uint8_t qs[16])
{
    const __m256i doubled = _mm256_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12, 0, 1, 2, 3, 4,
                                             6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12);
    return _mm256_shuffle_epi8(doubled, unpack_nibbles_32(qs));
}

/* Eight E4M3 codes (no NaN codes) as F32 e4m3(q) * 2^-120, exactly: the
 * sign-extended code shifted by 20 puts the 7 magnitude bits at F32 bit 20
 * (the exponent field e4 + 0, so e4 = 0 is a subnormal F32, as E4M3's
 * subnormals) and copies of the sign at bits 31..27, of which the mask keeps
 * bit 31.  Three integer ops; the reference's weight e4m3(q) * d is then one
 * multiply by fp8_scale_2p120's d * 2^120 (or, where that overflows, by
 * 2^120, exact, then by d).  Needs MXCSR's DAZ off (the C default), like
 * every kernel here. */
static inline __m256 e4m3x8_scaled(const uint8_t q[8])
{
    const __m256i s = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)q));
    return _mm256_castsi256_ps(_mm256_and_si256(_mm256_slli_epi32(s, 20), _mm256_set1_epi32((int)0x87f00000u)));
}

/* *d120 = d * 2^120 (exact unless it overflows: a power of two scaling up);
 * true when that is finite, so that e4m3(q) * 2^-120 * (d * 2^120) is the
 * exact product e4m3(q) * d rounded once, the reference's weight.  False for
 * |d| >= 2^8 (and non-finite d): multiply by 2^120 and d separately. */
static inline bool fp8_scale_2p120(float d, float *d120)
{
    *d120 = d * 0x1p120f;
    return fabsf(*d120) <= FLT_MAX;
}

#endif
