/*
 * vec_dot_kquant_avx2.c - AVX2 dot products of the K-quant super-blocks
 * (Q4_K, Q5_K, Q6_K weights) against Q8_K activations: the decode hot path.
 *
 * Per super-block of 256 the integer sums of vec_dot_ref.c (sum_q, sum_m) are
 * computed exactly with maddubs/madd.  Four super-blocks' sums are reduced
 * together, their float terms are formed lane-wise with the reference's own
 * expression, and added to a scalar one super-block at a time: results equal
 * the reference bit for bit.  Never reorder that float step, never read past
 * n elements.  Q8_K bsums must be the sums of its qs (quantize_act makes them so).
 *
 * maddubs ranges: weight quants are unsigned (Q4 <= 15, Q5 <= 31, Q6 <= 63),
 * activations >= -128, so a pair sum is at most 2*63*128 = 16128 < 2^15.
 */
#include "cpu/avx2/kernels_avx2.h"
#include "cpu/avx2/simd_avx2.h"

/* ---- Q4_K / Q5_K ------------------------------------------------------------- */

/*
 * The 6-bit scales and mins of kt_k_scale_min as bytes, in both 128-bit
 * halves: bytes 0-7 = sc_0..7, bytes 8-15 = m_0..7.  With the 12 packed
 * bytes as 32-bit words L0 L1 L2:
 *   sc_0..3 = L0 & 0x3f..   sc_4..7 = (L2 & 0x0f..) | (L0 >> 2 & 0x30..)
 *   m_0..3  = L1 & 0x3f..   m_4..7  = (L2 >> 4 & 0x0f..) | (L1 >> 2 & 0x30..)
 * Loads 16 bytes: the 4 after scales[] are the block's next field, never
 * outside the block.
 */
static inline __m256i k_scales_mins(const uint8_t scales[12])
{
    return _mm256_broadcastsi128_si256(k_scales_mins_128(scales));
}

/* Every int16 lane = byte j of v, zero-extended (pshufb index 0x80 writes 0). */
static inline __m256i broadcast_u8_as_i16(__m256i v, int j)
{
    return _mm256_shuffle_epi8(v, _mm256_set1_epi16((short)(0x8000 | j)));
}

/* sum_j m_j * (bsums[2j] + bsums[2j+1]) as 8 int32 lanes (exact): each m_j
 * is widened twice, next to the two bsums of its sub-block. */
static inline __m256i k_min_products(__m256i scales_mins, const int16_t bsums[16])
{
    const __m256i m_twice = _mm256_shuffle_epi8(
        scales_mins, _mm256_setr_epi8(8, -1, 8, -1, 9, -1, 9, -1, 10, -1, 10, -1, 11, -1, 11, -1,
                                      12, -1, 12, -1, 13, -1, 13, -1, 14, -1, 14, -1, 15, -1, 15, -1));
    return _mm256_madd_epi16(m_twice, _mm256_loadu_si256((const __m256i *)bsums));
}

/* One chunk of 64: sub-block 2c from lo (32 quants), 2c+1 from hi, scaled. */
static inline __m256i k_chunk(__m256i scales_mins, int c, __m256i lo, __m256i hi, const int8_t *q8)
{
    const __m256i a_lo = _mm256_loadu_si256((const __m256i *)(q8 + 64 * c));
    const __m256i a_hi = _mm256_loadu_si256((const __m256i *)(q8 + 64 * c + 32));
    const __m256i p_lo = _mm256_madd_epi16(broadcast_u8_as_i16(scales_mins, 2 * c), _mm256_maddubs_epi16(lo, a_lo));
    const __m256i p_hi =
        _mm256_madd_epi16(broadcast_u8_as_i16(scales_mins, 2 * c + 1), _mm256_maddubs_epi16(hi, a_hi));
    return _mm256_add_epi32(p_lo, p_hi);
}

/* Exact sums of one Q4_K super-block, each spread over 8 int32 lanes. */
static inline __m256i q4_K_sums(const struct kt_block_q4_K *x, const struct kt_block_q8_K *y, __m256i *sum_m)
{
    const __m256i low4 = _mm256_set1_epi8(0x0f);
    const __m256i scales_mins = k_scales_mins(x->scales);
    __m256i sumi = _mm256_setzero_si256();
    for (int c = 0; c < 4; c++) { /* byte l of chunk c: element 64c+l low, 64c+32+l high */
        const __m256i bits = _mm256_loadu_si256((const __m256i *)(x->qs + 32 * c));
        const __m256i lo = _mm256_and_si256(bits, low4);
        const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(bits, 4), low4);
        sumi = _mm256_add_epi32(sumi, k_chunk(scales_mins, c, lo, hi, y->qs));
    }
    *sum_m = k_min_products(scales_mins, y->bsums);
    return sumi;
}

/* Q5_K: the same plus a fifth bit; byte l of qh holds bit 2c (element 64c+l)
 * and 2c+1 (64c+32+l), shifted down 2 per chunk so they sit at bits 0 and 1. */
static inline __m256i q5_K_sums(const struct kt_block_q5_K *x, const struct kt_block_q8_K *y, __m256i *sum_m)
{
    const __m256i low4 = _mm256_set1_epi8(0x0f), bit4 = _mm256_set1_epi8(0x10);
    const __m256i scales_mins = k_scales_mins(x->scales);
    __m256i qh = _mm256_loadu_si256((const __m256i *)x->qh);
    __m256i sumi = _mm256_setzero_si256();
    for (int c = 0; c < 4; c++) {
        const __m256i bits = _mm256_loadu_si256((const __m256i *)(x->qs + 32 * c));
        const __m256i lo = _mm256_or_si256(_mm256_and_si256(bits, low4),
                                           _mm256_and_si256(_mm256_slli_epi16(qh, 4), bit4));
        const __m256i hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(bits, 4), low4),
                                           _mm256_and_si256(_mm256_slli_epi16(qh, 3), bit4));
        qh = _mm256_srli_epi16(qh, 2);
        sumi = _mm256_add_epi32(sumi, k_chunk(scales_mins, c, lo, hi, y->qs));
    }
    *sum_m = k_min_products(scales_mins, y->bsums);
    return sumi;
}

/*
 * x: (n/256) weight super-blocks whose first fields are fp16 d, dmin; y: (n/256)
 * Q8_K.  Reference float step per super-block:
 *   sum += d*da*(float)sum_q - dmin*da*(float)sum_m
 */
#define KT_DEFINE_K_ASYM_DOT(fn, block_type, SUMS)                                                \
    void fn(int64_t n, float *out, const void *w, const void *a)                                  \
    {                                                                                             \
        const struct block_type *x = w;                                                           \
        const struct kt_block_q8_K *y = a;                                                        \
        const int64_t nb = n / KT_QK_K;                                                           \
        float sum = 0.0f;                                                                         \
        int64_t i = 0;                                                                            \
        for (; i + 4 <= nb; i += 4) {                                                             \
            prefetch_ahead(&x[i], 4 * sizeof x[i]);                                               \
            __m256i q[4], m[4];                                                                   \
            for (int k = 0; k < 4; k++)                                                           \
                q[k] = SUMS(&x[i + k], &y[i + k], &m[k]);                                         \
            const __m128i sum_q = hsum4_epi32(q[0], q[1], q[2], q[3]);                            \
            const __m128i sum_m = hsum4_epi32(m[0], m[1], m[2], m[3]);                            \
            /* fp16 (d, dmin) of the four blocks -> d0 dmin0 d1 dmin1 | d2 dmin2 d3 dmin3 */   \
            const __m256 dm = _mm256_cvtph_ps(_mm_setr_epi32((int)load_u32(&x[i].d), (int)load_u32(&x[i + 1].d), \
                                                             (int)load_u32(&x[i + 2].d), (int)load_u32(&x[i + 3].d))); \
            const __m128 dm01 = _mm256_castps256_ps128(dm), dm23 = _mm256_extractf128_ps(dm, 1);  \
            const __m128 d = _mm_shuffle_ps(dm01, dm23, _MM_SHUFFLE(2, 0, 2, 0));                 \
            const __m128 dmin = _mm_shuffle_ps(dm01, dm23, _MM_SHUFFLE(3, 1, 3, 1));              \
            const __m128 da = _mm_setr_ps(y[i].d, y[i + 1].d, y[i + 2].d, y[i + 3].d);            \
            const __m128 t = _mm_sub_ps(_mm_mul_ps(_mm_mul_ps(d, da), _mm_cvtepi32_ps(sum_q)),    \
                                        _mm_mul_ps(_mm_mul_ps(dmin, da), _mm_cvtepi32_ps(sum_m)));\
            sum = add_lanes_in_order(sum, t);                                                     \
        }                                                                                         \
        for (; i < nb; i++) {                                                                     \
            __m256i m;                                                                            \
            const int32_t sum_q = hsum_epi32(SUMS(&x[i], &y[i], &m));                             \
            const int32_t sum_m = hsum_epi32(m);                                                  \
            const float d = fp16_to_f32(x[i].d), dmin = fp16_to_f32(x[i].dmin);                   \
            sum += d * y[i].d * (float)sum_q - dmin * y[i].d * (float)sum_m;                      \
        }                                                                                         \
        *out = sum;                                                                               \
    }

KT_DEFINE_K_ASYM_DOT(kt_vec_dot_q4_K_q8_K_avx2, kt_block_q4_K, q4_K_sums)
KT_DEFINE_K_ASYM_DOT(kt_vec_dot_q5_K_q8_K_avx2, kt_block_q5_K, q5_K_sums)

/* ---- Q6_K -------------------------------------------------------------------- */

/*
 * sum_g sc_g * sum_{l in g} (q-32)*a  =  sum_g sc_g * sum q*a  -  32 * sum_g sc_g * bsums_g,
 * with q in [0, 63] unsigned for maddubs.  Each 32-element vector covers groups
 * 2k (low 128-bit half) and 2k+1 (high half), so its scale vector is the even
 * scales in the low half and the odd ones in the high half, broadcast.
 */
/* A vector whose every int16 lane is lane j of v (v's two 128-bit halves equal).
 * Q6_K's scales are signed, so they are widened first and broadcast as words. */
static inline __m256i broadcast_i16(__m256i v, int j)
{
    return _mm256_shuffle_epi8(v, _mm256_set1_epi16((short)((2 * j + 1) << 8 | 2 * j)));
}

static inline __m256i q6_K_sums(const struct kt_block_q6_K *x, const struct kt_block_q8_K *y)
{
    const __m256i low4 = _mm256_set1_epi8(0x0f), bits45 = _mm256_set1_epi8(0x30);
    const __m128i even_odd = _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
    const __m128i sc8 = _mm_loadu_si128((const __m128i *)x->scales);
    const __m256i scales_eo = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(sc8, even_odd));
    const __m256i bsums = _mm256_loadu_si256((const __m256i *)y->bsums);
    const __m256i offset = _mm256_madd_epi16(_mm256_cvtepi8_epi16(sc8), bsums);
    __m256i sumi = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(offset, 5));
    for (int h = 0; h < 2; h++) { /* half of 128 elements = groups 8h .. 8h+7 */
        const uint8_t *ql = x->ql + 64 * h, *qh = x->qh + 32 * h;
        const int8_t *q8 = y->qs + 128 * h;
        const __m256i l0 = _mm256_loadu_si256((const __m256i *)ql);
        const __m256i l1 = _mm256_loadu_si256((const __m256i *)(ql + 32));
        const __m256i hb = _mm256_loadu_si256((const __m256i *)qh);
        const __m256i q[4] = {
            _mm256_or_si256(_mm256_and_si256(l0, low4), _mm256_and_si256(_mm256_slli_epi16(hb, 4), bits45)),
            _mm256_or_si256(_mm256_and_si256(l1, low4), _mm256_and_si256(_mm256_slli_epi16(hb, 2), bits45)),
            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), low4), _mm256_and_si256(hb, bits45)),
            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), low4),
                            _mm256_and_si256(_mm256_srli_epi16(hb, 2), bits45)),
        };
        for (int k = 0; k < 4; k++) { /* elements 128h + 32k .. +31 = groups 8h+2k, 8h+2k+1 */
            const __m256i act = _mm256_loadu_si256((const __m256i *)(q8 + 32 * k));
            const __m256i p = _mm256_maddubs_epi16(q[k], act);
            sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(broadcast_i16(scales_eo, 4 * h + k), p));
        }
    }
    return sumi;
}

/* Reference float step per super-block: sum += d*da*(float)sumi. */
void kt_vec_dot_q6_K_q8_K_avx2(int64_t n, float *out, const void *w, const void *a)
{
    const struct kt_block_q6_K *x = w; /* (n/256) */
    const struct kt_block_q8_K *y = a; /* (n/256) */
    const int64_t nb = n / KT_QK_K;
    float sum = 0.0f;
    int64_t i = 0;
    for (; i + 4 <= nb; i += 4) {
        prefetch_ahead(&x[i], 4 * sizeof x[i]);
        const __m128i sumi = hsum4_epi32(q6_K_sums(&x[i], &y[i]), q6_K_sums(&x[i + 1], &y[i + 1]),
                                         q6_K_sums(&x[i + 2], &y[i + 2]), q6_K_sums(&x[i + 3], &y[i + 3]));
        const __m128 d = four_fp16(x[i].d, x[i + 1].d, x[i + 2].d, x[i + 3].d);
        const __m128 da = _mm_setr_ps(y[i].d, y[i + 1].d, y[i + 2].d, y[i + 3].d);
        sum = add_lanes_in_order(sum, _mm_mul_ps(_mm_mul_ps(d, da), _mm_cvtepi32_ps(sumi)));
    }
    for (; i < nb; i++)
        sum += fp16_to_f32(x[i].d) * y[i].d * (float)hsum_epi32(q6_K_sums(&x[i], &y[i]));
    *out = sum;
}
