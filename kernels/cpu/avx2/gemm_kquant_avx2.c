/*
 * gemm_kquant_avx2.c - AVX2 prefill products for Q5_K and Q6_K weights
 * against Q8_K activations: y[t][r] = dot(W[r], A[t]) for many tokens t at
 * once, the compute-bound side of the CPU path for those types.
 *
 * The scheme of gemm_avx2.c's Q4_K: register tile one weight row x 4 tokens.
 * Each super-block is loaded and unpacked once and multiplied into 4
 * activation rows; a (super-block, token) pair's integer sums are the exact
 * sums of vec_dot_kquant_avx2.c (and so of kernels/cpu/ref), the 4 tokens'
 * sums are reduced together and each token's float accumulator (one lane)
 * takes that super-block's term with the reference's expression, in block
 * order.  So every output equals vec_dot bit for bit; this file must never
 * merge two super-blocks' integer sums before their float scale, never
 * reorder or fuse the float steps (-ffp-contract=off), and never read a
 * weight or activation row past its n elements.  Cache tile: a panel of rows
 * that fits in L2 runs against every group of 4 tokens, so weights come from
 * memory once per call; token counts that are not a multiple of 4 finish
 * with vec_dot itself.
 *
 * maddubs ranges: weight quants are unsigned (Q5 <= 31, Q6 <= 63), Q8_K
 * quants >= -128, so a pair sum is at most 2 * 63 * 128 = 16128 < 2^15.
 */
#include "cpu/avx2/gemm_kquant_avx2.h"
#include "cpu/avx2/kernels_avx2.h"
#include "cpu/avx2/simd_avx2.h"

/* Weight bytes of one row panel: about half of a 2 MiB L2, leaving room for
 * the 4 activation rows streaming through L1. */
#define KT_KGEMM_PANEL_BYTES (768 * 1024)
#define KT_KGEMM_TOKENS 4

/* out[k] = dot(w, activation row k) for the 4 rows at a + k * act_bytes. */
typedef void (*tile_fn)(int64_t n, const void *w, const uint8_t *a, size_t act_bytes, float out[KT_KGEMM_TOKENS]);

static inline void kgemm_drive(int64_t n, const void *w, size_t row_bytes, int64_t n_rows, const void *a,
                               size_t act_bytes, int64_t n_tok, float *y, int64_t y_stride, tile_fn tile,
                               kt_vec_dot_fn dot)
{
    const uint8_t *wb = w, *ab = a;
    int64_t panel = (int64_t)(KT_KGEMM_PANEL_BYTES / (row_bytes ? row_bytes : 1));
    panel = panel < 1 ? 1 : panel;
    for (int64_t r0 = 0; r0 < n_rows; r0 += panel) {
        const int64_t r1 = r0 + panel < n_rows ? r0 + panel : n_rows;
        int64_t t = 0;
        for (; t + KT_KGEMM_TOKENS <= n_tok; t += KT_KGEMM_TOKENS)
            for (int64_t r = r0; r < r1; r++) {
                float out[KT_KGEMM_TOKENS];
                tile(n, wb + (size_t)r * row_bytes, ab + (size_t)t * act_bytes, act_bytes, out);
                for (int k = 0; k < KT_KGEMM_TOKENS; k++)
                    y[(t + k) * y_stride + r] = out[k];
            }
        for (; t < n_tok; t++)
            for (int64_t r = r0; r < r1; r++)
                dot(n, &y[t * y_stride + r], wb + (size_t)r * row_bytes, ab + (size_t)t * act_bytes);
    }
}

/* The 4 activation rows of a tile as Q8_K super-block arrays. */
static inline void tile_tokens(const uint8_t *a, size_t act_bytes, const struct kt_block_q8_K *y[KT_KGEMM_TOKENS])
{
    for (int k = 0; k < KT_KGEMM_TOKENS; k++)
        y[k] = (const void *)(a + (size_t)k * act_bytes);
}

/* ---- Q5_K x Q8_K --------------------------------------------------------------- */

/* sc_0..7 in bytes 0-7 and m_0..7 in bytes 8-15 of both 128-bit halves:
 * kt_k_scale_min's unpacking, as vec_dot_kquant_avx2.c (the 16-byte load
 * reads the 4 bytes after scales[], inside the block). */
static inline __m256i scales_mins_k(const uint8_t scales[12])
{
    return _mm256_broadcastsi128_si256(k_scales_mins_128(scales));
}

/* Every int16 lane = byte j of v, zero-extended. */
static inline __m256i byte_as_i16(__m256i v, int j)
{
    return _mm256_shuffle_epi8(v, _mm256_set1_epi16((short)(0x8000 | j)));
}

/*
 * Per super-block, lane k = token k:
 *   sum += (d*da)*(float)sum_q - (dmin*da)*(float)sum_m
 * with sum_q = sum_j sc_j * sum_{l in j} q*qa, q = low nibble | fifth bit
 * from qh, and sum_m = sum_j m_j * (bsums[2j] + bsums[2j+1]), as
 * kt_vec_dot_q5_K_q8_K_ref.  Byte l of qh holds the fifth bit of element
 * 64c+l at bit 2c and of 64c+32+l at bit 2c+1.
 */
static void q5_K_tile(int64_t n, const void *w, const uint8_t *a, size_t act_bytes, float out[KT_KGEMM_TOKENS])
{
    const struct kt_block_q5_K *x = w; /* (n/256) */
    const struct kt_block_q8_K *y[KT_KGEMM_TOKENS];
    tile_tokens(a, act_bytes, y);
    const __m256i low4 = _mm256_set1_epi8(0x0f), bit4 = _mm256_set1_epi8(0x10);
    const __m256i m_twice_idx = _mm256_setr_epi8(8, -1, 8, -1, 9, -1, 9, -1, 10, -1, 10, -1, 11, -1, 11, -1, 12, -1,
                                                 12, -1, 13, -1, 13, -1, 14, -1, 14, -1, 15, -1, 15, -1);
    __m128 acc = _mm_setzero_ps();
    for (int64_t i = 0; i < n / KT_QK_K; i++) {
        const __m256i sm = scales_mins_k(x[i].scales);
        __m256i qh = _mm256_loadu_si256((const __m256i *)x[i].qh);
        __m256i sq[KT_KGEMM_TOKENS], smin[KT_KGEMM_TOKENS];
        for (int k = 0; k < KT_KGEMM_TOKENS; k++)
            sq[k] = _mm256_setzero_si256();
        for (int c = 0; c < 4; c++) { /* byte l of chunk c: element 64c+l low nibble, 64c+32+l high */
            const __m256i bits = _mm256_loadu_si256((const __m256i *)(x[i].qs + 32 * c));
            const __m256i lo = _mm256_or_si256(_mm256_and_si256(bits, low4),
                                               _mm256_and_si256(_mm256_slli_epi16(qh, 4), bit4));
            const __m256i hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(bits, 4), low4),
                                               _mm256_and_si256(_mm256_slli_epi16(qh, 3), bit4));
            qh = _mm256_srli_epi16(qh, 2);
            const __m256i sc_lo = byte_as_i16(sm, 2 * c), sc_hi = byte_as_i16(sm, 2 * c + 1);
            for (int k = 0; k < KT_KGEMM_TOKENS; k++) {
                const int8_t *q8 = y[k][i].qs + 64 * c;
                const __m256i p_lo =
                    _mm256_madd_epi16(sc_lo, _mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i *)q8)));
                const __m256i p_hi = _mm256_madd_epi16(
                    sc_hi, _mm256_maddubs_epi16(hi, _mm256_loadu_si256((const __m256i *)(q8 + 32))));
                sq[k] = _mm256_add_epi32(sq[k], _mm256_add_epi32(p_lo, p_hi));
            }
        }
        const __m256i m_twice = _mm256_shuffle_epi8(sm, m_twice_idx);
        for (int k = 0; k < KT_KGEMM_TOKENS; k++)
            smin[k] = _mm256_madd_epi16(m_twice, _mm256_loadu_si256((const __m256i *)y[k][i].bsums));
        const __m128i sum_q = hsum4_epi32(sq[0], sq[1], sq[2], sq[3]);
        const __m128i sum_m = hsum4_epi32(smin[0], smin[1], smin[2], smin[3]);
        const __m128 d = _mm_set1_ps(fp16_to_f32(x[i].d)), dmin = _mm_set1_ps(fp16_to_f32(x[i].dmin));
        const __m128 da = _mm_setr_ps(y[0][i].d, y[1][i].d, y[2][i].d, y[3][i].d);
        const __m128 t = _mm_sub_ps(_mm_mul_ps(_mm_mul_ps(d, da), _mm_cvtepi32_ps(sum_q)),
                                    _mm_mul_ps(_mm_mul_ps(dmin, da), _mm_cvtepi32_ps(sum_m)));
        acc = _mm_add_ps(acc, t);
    }
    _mm_storeu_ps(out, acc);
}

void kt_gemm_q5_K_q8_K_avx2(int64_t n, const void *w, size_t row_bytes, int64_t n_rows, const void *a,
                            size_t act_bytes, int64_t n_tok, float *y, int64_t y_stride)
{
    kgemm_drive(n, w, row_bytes, n_rows, a, act_bytes, n_tok, y, y_stride, q5_K_tile, kt_vec_dot_q5_K_q8_K_avx2);
}

/* ---- Q6_K x Q8_K --------------------------------------------------------------- */

/* Every int16 lane = int16 lane j of v (v's two 128-bit halves equal). */
static inline __m256i word_as_i16(__m256i v, int j)
{
    return _mm256_shuffle_epi8(v, _mm256_set1_epi16((short)((2 * j + 1) << 8 | 2 * j)));
}

/*
 * Per super-block, lane k = token k:  sum += (d*da)*(float)sumi  with
 *   sumi = sum_g sc_g * sum_{l in g} (q-32)*qa
 *        = sum_g sc_g * sum_{l in g} q*qa  -  32 * sum_g sc_g * bsums_g
 * as kt_vec_dot_q6_K_q8_K_ref (q in [0, 63] unsigned for maddubs).  A
 * 32-element vector covers groups 2v (low 128-bit half) and 2v+1 (high), so
 * its scale vector is the even scales in the low half, the odd ones in the
 * high half, broadcast.
 */
static void q6_K_tile(int64_t n, const void *w, const uint8_t *a, size_t act_bytes, float out[KT_KGEMM_TOKENS])
{
    const struct kt_block_q6_K *x = w; /* (n/256) */
    const struct kt_block_q8_K *y[KT_KGEMM_TOKENS];
    tile_tokens(a, act_bytes, y);
    const __m256i low4 = _mm256_set1_epi8(0x0f), bits45 = _mm256_set1_epi8(0x30);
    const __m128i even_odd = _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
    __m128 acc = _mm_setzero_ps();
    for (int64_t i = 0; i < n / KT_QK_K; i++) {
        const __m128i sc8 = _mm_loadu_si128((const __m128i *)x[i].scales);
        const __m256i scales_eo = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(sc8, even_odd));
        const __m256i sc16 = _mm256_cvtepi8_epi16(sc8);
        __m256i sq[KT_KGEMM_TOKENS];
        for (int k = 0; k < KT_KGEMM_TOKENS; k++) {
            const __m256i offset = _mm256_madd_epi16(sc16, _mm256_loadu_si256((const __m256i *)y[k][i].bsums));
            sq[k] = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(offset, 5));
        }
        for (int h = 0; h < 2; h++) { /* half of 128 elements = groups 8h .. 8h+7 */
            const uint8_t *ql = x[i].ql + 64 * h, *qhp = x[i].qh + 32 * h;
            const __m256i l0 = _mm256_loadu_si256((const __m256i *)ql);
            const __m256i l1 = _mm256_loadu_si256((const __m256i *)(ql + 32));
            const __m256i hb = _mm256_loadu_si256((const __m256i *)qhp);
            for (int v = 0; v < 4; v++) { /* elements 128h + 32v .. +31 = groups 8h+2v, 8h+2v+1 */
                __m256i q;
                if (v == 0)
                    q = _mm256_or_si256(_mm256_and_si256(l0, low4), _mm256_and_si256(_mm256_slli_epi16(hb, 4), bits45));
                else if (v == 1)
                    q = _mm256_or_si256(_mm256_and_si256(l1, low4), _mm256_and_si256(_mm256_slli_epi16(hb, 2), bits45));
                else if (v == 2)
                    q = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), low4), _mm256_and_si256(hb, bits45));
                else
                    q = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), low4),
                                        _mm256_and_si256(_mm256_srli_epi16(hb, 2), bits45));
                const __m256i sc = word_as_i16(scales_eo, 4 * h + v);
                for (int k = 0; k < KT_KGEMM_TOKENS; k++) {
                    const __m256i act = _mm256_loadu_si256((const __m256i *)(y[k][i].qs + 128 * h + 32 * v));
                    sq[k] = _mm256_add_epi32(sq[k], _mm256_madd_epi16(sc, _mm256_maddubs_epi16(q, act)));
                }
            }
        }
        const __m128i sumi = hsum4_epi32(sq[0], sq[1], sq[2], sq[3]);
        const __m128 d = _mm_set1_ps(fp16_to_f32(x[i].d));
        const __m128 da = _mm_setr_ps(y[0][i].d, y[1][i].d, y[2][i].d, y[3][i].d);
        acc = _mm_add_ps(acc, _mm_mul_ps(_mm_mul_ps(d, da), _mm_cvtepi32_ps(sumi)));
    }
    _mm_storeu_ps(out, acc);
}

void kt_gemm_q6_K_q8_K_avx2(int64_t n, const void *w, size_t row_bytes, int64_t n_rows, const void *a,
                            size_t act_bytes, int64_t n_tok, float *y, int64_t y_stride)
{
    kgemm_drive(n, w, row_bytes, n_rows, a, act_bytes, n_tok, y, y_stride, q6_K_tile, kt_vec_dot_q6_K_q8_K_avx2);
}
