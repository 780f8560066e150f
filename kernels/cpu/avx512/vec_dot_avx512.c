/*
 * vec_dot_avx512.c - AVX-512 VNNI dot products for the decode hot path:
 * Q8_0, Q4_0 and Q4_K weights against Q8_0 / Q8_K activations (and MXFP4).
 *
 * vpdpbusd multiplies unsigned by signed bytes and sums 4 products per int32
 * lane without saturation, so integer sums are exact; each block's (or
 * super-block's) float term is then formed with the reference's expression
 * and added to one scalar in block order, as vec_dot_ref.c does: results
 * equal the reference bit for bit.  Never reorder that float sum, never read
 * past n elements.  Q8_0 activations must lie in [-127, 127] and Q8_K bsums
 * must be the sums of its qs (quantize_act makes them so).
 */
#if !defined(__AVX512F__) || !defined(__AVX512BW__) || !defined(__AVX512VL__) || !defined(__AVX512VNNI__)
#error "vec_dot_avx512.c needs the AVX-512 level flags (kernels/CMakeLists.txt sets them for cpu/avx512/*.c)"
#endif

#include "cpu/avx512/kernels_avx512.h"
#include "cpu/avx2/simd_avx2.h"
#include "hf_formats.h"

/* ---- Q8_0 x Q8_0 --------------------------------------------------------------- */

/* The 32 quants of two blocks side by side (blocks are 34 bytes apart). */
static inline __m512i two_blocks_q8_0(const struct kt_block_q8_0 *b)
{
    const __m256i lo = _mm256_loadu_si256((const __m256i *)b[0].qs);
    const __m256i hi = _mm256_loadu_si256((const __m256i *)b[1].qs);
    return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}

/* 16 int32 lanes of w*a products, exact: |w| (as unsigned; -128 -> 128) times
 * a with w's sign (AVX-512 has no vpsignb: negate where w < 0; a != -128). */
static inline __m512i dot_i8_64(__m512i w, __m512i a)
{
    const __m512i sa = _mm512_mask_sub_epi8(a, _mm512_movepi8_mask(w), _mm512_setzero_si512(), a);
    return _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_abs_epi8(w), sa);
}

static inline __m256i lo256(__m512i v) { return _mm512_castsi512_si256(v); }
static inline __m256i hi256(__m512i v) { return _mm512_extracti64x4_epi64(v, 1); }

/* Eight fp16 scalars of consecutive blocks (stride in bytes), widened exactly. */
static inline __m256 eight_fp16(const void *first, size_t stride)
{
    const uint8_t *p = first;
    kt_fp16 h[8];
    for (int k = 0; k < 8; k++)
        memcpy(&h[k], p + (size_t)k * stride, sizeof h[k]);
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)h));
}

/* Per block: sum += (dw * da) * (float)sumi, as kt_vec_dot_q8_0_q8_0_ref. */
void kt_vec_dot_q8_0_q8_0_avx512(int64_t n, float *out, const void *w, const void *a)
{
    const struct kt_block_q8_0 *x = w; /* (n/32) */
    const struct kt_block_q8_0 *y = a; /* (n/32) */
    const int64_t nb = n / KT_QK;
    float sum = 0.0f;
    int64_t i = 0;
    for (; i + 8 <= nb; i += 8) {
        prefetch_ahead(&x[i], 8 * sizeof x[i]);
        __m512i s[4]; /* s[j]: lanes 0-7 block i+2j, lanes 8-15 block i+2j+1 */
        for (int j = 0; j < 4; j++)
            s[j] = dot_i8_64(two_blocks_q8_0(&x[i + 2 * j]), two_blocks_q8_0(&y[i + 2 * j]));
        const __m128i sum03 = hsum4_epi32(lo256(s[0]), hi256(s[0]), lo256(s[1]), hi256(s[1]));
        const __m128i sum47 = hsum4_epi32(lo256(s[2]), hi256(s[2]), lo256(s[3]), hi256(s[3]));
        const __m256 sumi = _mm256_cvtepi32_ps(_mm256_setr_m128i(sum03, sum47));
        const __m256 t = _mm256_mul_ps(_mm256_mul_ps(eight_fp16(&x[i].d, sizeof x[i]), eight_fp16(&y[i].d, sizeof y[i])),
                                       sumi);
        sum = add_lanes_in_order(sum, _mm256_castps256_ps128(t));
        sum = add_lanes_in_order(sum, _mm256_extractf128_ps(t, 1));
    }
    for (; i < nb; i++) {
        const __m256i wq = _mm256_loadu_si256((const __m256i *)x[i].qs);
        const __m256i aq = _mm256_loadu_si256((const __m256i *)y[i].qs);
        const __m256i sa = _mm256_mask_sub_epi8(aq, _mm256_movepi8_mask(wq), _mm256_setzero_si256(), aq);
        const int32_t sumi = hsum_epi32(_mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_abs_epi8(wq), sa));
        sum += fp16_to_f32(x[i].d) * fp16_to_f32(y[i].d) * (float)sumi;
    }
    *out = sum;
}

/* ---- Q4_0 x Q8_0 --------------------------------------------------------------- */

/* The 32 codes (0..15, element order) of two blocks side by side (18 bytes apart). */
static inline __m512i two_blocks_q4_0(const struct kt_block_q4_0 *b)
{
    return _mm512_inserti64x4(_mm512_castsi256_si512(unpack_nibbles_32(b[0].qs)), unpack_nibbles_32(b[1].qs), 1);
}

/* 16 int32 lanes of (q-8)*a products, exact for any activation bytes: the
 * codes are vpdpbusd's unsigned operand as they are, and 8 * sum a (one
 * vpdpbusd of 8s) comes off; each lane's partials stay below 2^13. */
static inline __m512i dot_q4_0_64(__m512i q, __m512i a)
{
    return _mm512_sub_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), q, a),
                            _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8(8), a));
}

/* Per block: sum += (dw * da) * (float)sumi, as kt_vec_dot_q4_0_q8_0_ref. */
void kt_vec_dot_q4_0_q8_0_avx512(int64_t n, float *out, const void *w, const void *a)
{
    const struct kt_block_q4_0 *x = w; /* (n/32) */
    const struct kt_block_q8_0 *y = a; /* (n/32) */
    const int64_t nb = n / KT_QK;
    float sum = 0.0f;
    int64_t i = 0;
    for (; i + 8 <= nb; i += 8) {
        prefetch_ahead(&x[i], 8 * sizeof x[i]);
        __m512i s[4]; /* s[j]: lanes 0-7 block i+2j, lanes 8-15 block i+2j+1 */
        for (int j = 0; j < 4; j++)
            s[j] = dot_q4_0_64(two_blocks_q4_0(&x[i + 2 * j]), two_blocks_q8_0(&y[i + 2 * j]));
        const __m128i sum03 = hsum4_epi32(lo256(s[0]), hi256(s[0]), lo256(s[1]), hi256(s[1]));
        const __m128i sum47 = hsum4_epi32(lo256(s[2]), hi256(s[2]), lo256(s[3]), hi256(s[3]));
        const __m256 sumi = _mm256_cvtepi32_ps(_mm256_setr_m128i(sum03, sum47));
        const __m256 t = _mm256_mul_ps(_mm256_mul_ps(eight_fp16(&x[i].d, sizeof x[i]), eight_fp16(&y[i].d, sizeof y[i])),
                                       sumi);
        sum = add_lanes_in_order(sum, _mm256_castps256_ps128(t));
        sum = add_lanes_in_order(sum, _mm256_extractf128_ps(t, 1));
    }
    for (; i < nb; i++) {
        const __m256i aq = _mm256_loadu_si256((const __m256i *)y[i].qs);
        const __m256i p = _mm256_sub_epi32(_mm256_dpbusd_epi32(_mm256_setzero_si256(), unpack_nibbles_32(x[i].qs), aq),
                                           _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_set1_epi8(8), aq));
        sum += fp16_to_f32(x[i].d) * fp16_to_f32(y[i].d) * (float)hsum_epi32(p);
    }
    *out = sum;
}

/* ---- Q4_K x Q8_K --------------------------------------------------------------- */

/* sc_0..7 in bytes 0-7, m_0..7 in bytes 8-15 (kt_k_scale_min's unpacking; reads
 * the 4 bytes after scales[], which are inside the block). */
static inline __m128i scales_mins_k(const uint8_t scales[12])
{
    return k_scales_mins_128(scales);
}

/*
 * Exact sum_q (16 lanes) and sum_m (8 lanes) of one super-block.  Chunk c's 32
 * bytes hold element 64c+l (low nibble) and 64c+32+l (high nibble): broadcast
 * to both 256-bit halves and shifted by 0 / 4, they are elements 64c..64c+63
 * in order, against one 64-byte activation load.  A dpbusd lane sums 4
 * products <= 15*128, so it fits an int16 and vpmaddwd by a scale held in the
 * lane's low word multiplies it exactly.
 */
static inline __m512i q4_K_sums(const struct kt_block_q4_K *x, const struct kt_block_q8_K *y, __m256i *sum_m)
{
    const __m128i sm = scales_mins_k(x->scales);
    const __m512i sm32 = _mm512_cvtepu8_epi32(sm); /* lanes 0-7 sc_j, 8-15 m_j */
    const __m512i shift = _mm512_setr_epi64(0, 0, 0, 0, 4, 4, 4, 4);
    const __m512i low4 = _mm512_set1_epi8(0x0f);
    __m512i sumi = _mm512_setzero_si512();
    for (int c = 0; c < 4; c++) {
        const __m512i bits = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(x->qs + 32 * c)));
        const __m512i q = _mm512_and_si512(_mm512_srlv_epi64(bits, shift), low4);
        const __m512i p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), q,
                                              _mm512_loadu_si512((const void *)(y->qs + 64 * c)));
        const __m512i sc = _mm512_permutexvar_epi32(
            _mm512_setr_epi32(2 * c, 2 * c, 2 * c, 2 * c, 2 * c, 2 * c, 2 * c, 2 * c, 2 * c + 1, 2 * c + 1,
                              2 * c + 1, 2 * c + 1, 2 * c + 1, 2 * c + 1, 2 * c + 1, 2 * c + 1),
            sm32);
        sumi = _mm512_add_epi32(sumi, _mm512_madd_epi16(p, sc));
    }
    /* sum_j m_j * (bsums[2j] + bsums[2j+1]): each m_j widened twice, next to its two bsums */
    const __m256i m_twice = _mm256_shuffle_epi8(
        _mm256_broadcastsi128_si256(sm),
        _mm256_setr_epi8(8, -1, 8, -1, 9, -1, 9, -1, 10, -1, 10, -1, 11, -1, 11, -1, 12, -1, 12, -1, 13, -1, 13, -1,
                         14, -1, 14, -1, 15, -1, 15, -1));
    *sum_m = _mm256_madd_epi16(m_twice, _mm256_loadu_si256((const __m256i *)y->bsums));
    return sumi;
}

static inline __m256i fold512(__m512i v)
{
    return _mm256_add_epi32(lo256(v), hi256(v));
}

/* Per super-block: sum += (d*da)*(float)sum_q - (dmin*da)*(float)sum_m, as the reference. */
void kt_vec_dot_q4_K_q8_K_avx512(int64_t n, float *out, const void *w, const void *a)
{
    const struct kt_block_q4_K *x = w; /* (n/256) */
    const struct kt_block_q8_K *y = a; /* (n/256) */
    const int64_t nb = n / KT_QK_K;
    float sum = 0.0f;
    int64_t i = 0;
    for (; i + 4 <= nb; i += 4) {
        prefetch_ahead(&x[i], 4 * sizeof x[i]);
        __m256i q[4], m[4];
        for (int k = 0; k < 4; k++)
            q[k] = fold512(q4_K_sums(&x[i + k], &y[i + k], &m[k]));
        const __m128i sum_q = hsum4_epi32(q[0], q[1], q[2], q[3]);
        const __m128i sum_m = hsum4_epi32(m[0], m[1], m[2], m[3]);
        const __m128 d = four_fp16(x[i].d, x[i + 1].d, x[i + 2].d, x[i + 3].d);
        const __m128 dmin = four_fp16(x[i].dmin, x[i + 1].dmin, x[i + 2].dmin, x[i + 3].dmin);
        const __m128 da = _mm_setr_ps(y[i].d, y[i + 1].d, y[i + 2].d, y[i + 3].d);
        const __m128 t = _mm_sub_ps(_mm_mul_ps(_mm_mul_ps(d, da), _mm_cvtepi32_ps(sum_q)),
                                    _mm_mul_ps(_mm_mul_ps(dmin, da), _mm_cvtepi32_ps(sum_m)));
        sum = add_lanes_in_order(sum, t);
    }
    for (; i < nb; i++) {
        __m256i m;
        const int32_t sum_q = hsum_epi32(fold512(q4_K_sums(&x[i], &y[i], &m)));
        const int32_t sum_m = hsum_epi32(m);
        const float d = fp16_to_f32(x[i].d), dmin = fp16_to_f32(x[i].dmin);
        sum += d * y[i].d * (float)sum_q - dmin * y[i].d * (float)sum_m;
    }
    *out = sum;
}

/* ---- MXFP4 x Q8_0 -------------------------------------------------------------- */

/* The doubled E2M1 values of two blocks side by side (blocks are 17 bytes apart). */
static inline __m512i two_blocks_mxfp4(const struct kt_block_mxfp4 *b)
{
    return _mm512_inserti64x4(_mm512_castsi256_si512(mxfp4_quants_32(b[0].qs)), mxfp4_quants_32(b[1].qs), 1);
}

/* Per block: sum += (2^(e-128) * da) * (float)sumi, as kt_vec_dot_mxfp4_q8_0_ref. */
void kt_vec_dot_mxfp4_q8_0_avx512(int64_t n, float *out, const void *w, const void *a)
{
    const struct kt_block_mxfp4 *x = w; /* (n/32) */
    const struct kt_block_q8_0 *y = a;  /* (n/32) */
    const int64_t nb = n / KT_QK;
    float sum = 0.0f;
    int64_t i = 0;
    for (; i + 8 <= nb; i += 8) {
        prefetch_ahead(&x[i], 8 * sizeof x[i]);
        __m512i s[4]; /* s[j]: lanes 0-7 block i+2j, lanes 8-15 block i+2j+1 */
        for (int j = 0; j < 4; j++)
            s[j] = dot_i8_64(two_blocks_mxfp4(&x[i + 2 * j]), two_blocks_q8_0(&y[i + 2 * j]));
        const __m128i sum03 = hsum4_epi32(lo256(s[0]), hi256(s[0]), lo256(s[1]), hi256(s[1]));
        const __m128i sum47 = hsum4_epi32(lo256(s[2]), hi256(s[2]), lo256(s[3]), hi256(s[3]));
        const __m256 sumi = _mm256_cvtepi32_ps(_mm256_setr_m128i(sum03, sum47));
        float dw[8];
        for (int k = 0; k < 8; k++)
            dw[k] = e8m0_half_f32(x[i + k].e);
        const __m256 t = _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(dw), eight_fp16(&y[i].d, sizeof y[i])), sumi);
        sum = add_lanes_in_order(sum, _mm256_castps256_ps128(t));
        sum = add_lanes_in_order(sum, _mm256_extractf128_ps(t, 1));
    }
    for (; i < nb; i++) {
        const __m256i wq = mxfp4_quants_32(x[i].qs);
        const __m256i aq = _mm256_loadu_si256((const __m256i *)y[i].qs);
        const __m256i sa = _mm256_mask_sub_epi8(aq, _mm256_movepi8_mask(wq), _mm256_setzero_si256(), aq);
        const int32_t sumi = hsum_epi32(_mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_abs_epi8(wq), sa));
        sum += e8m0_half_f32(x[i].e) * fp16_to_f32(y[i].d) * (float)sumi;
    }
    *out = sum;
}
