/*
 * gemm_avx512.c - AVX-512 VNNI prefill products: y[t][r] = dot(W[r], A[t])
 * for many tokens t at once (Q8_0 and Q4_K weights against Q8_0 / Q8_K
 * activations), the compute-bound side of the CPU expert path on CPUs with
 * AVX-512 VNNI.
 *
 * Register tile: one weight row x 8 tokens.  Each weight block is loaded and
 * unpacked once and fed to vpdpbusd against 8 activation rows; the integer
 * sums of one (block, token) pair are exact (vpdpbusd does not saturate, and
 * every partial fits its lane), and each token's float accumulator (one lane)
 * takes that block's term with the reference's expression, in block order.
 * So every output equals vec_dot (any level's: they all equal
 * kernels/cpu/ref) bit for bit.  This file must never merge two blocks'
 * integer sums before their float scale, never reorder or fuse (FMA) the
 * float steps (-ffp-contract=off), and never read a weight or activation row
 * past its n elements.
 *
 * Per token group (8 tokens; a short last group repeats its last token and
 * stores only the real ones) the activations are first rearranged into a
 * small scratch buffer reused by every row of a panel:
 *   Q8_0: quants with the sign bit flipped (a + 128 as unsigned bytes, so
 *         vpdpbusd takes the signed weights as they are; 128 * sum(w) comes
 *         off through the accumulator's start value), laid out four blocks
 *         per 64 bytes so that one vpdpbusd lane group is one block, and the
 *         fp16 scales widened to float;
 *   Q4_K: the float scales and the pair sums bsums[2j] + bsums[2j+1], laid
 *         out for vpdpwssd against the 6-bit mins.
 * Cache tile: a panel of rows that fits in L2 is run against every token
 * group, so weights come from memory once per call.  If the scratch buffer
 * cannot be allocated the call falls back to one vec_dot per pair.
 */
#if !defined(__AVX512F__) || !defined(__AVX512BW__) || !defined(__AVX512VL__) || !defined(__AVX512VNNI__)
#error "gemm_avx512.c needs the AVX-512 level flags (kernels/CMakeLists.txt sets them for cpu/avx512/*.c)"
#endif

#include "cpu/avx512/gemm_avx512.h"
#include "cpu/avx2/simd_avx2.h"
#include "cpu/avx512/kernels_avx512.h"

#include <stdlib.h>

/* Weight bytes of one row panel: about a third of a 2 MiB L2, leaving room
 * for the token group's scratch and activation rows. */
#define KT_GEMM512_PANEL_BYTES (640 * 1024)
#define KT_GEMM512_TOKENS 8

static inline int64_t min_i64(int64_t a, int64_t b)
{
    return a < b ? a : b;
}

/* Per 128-bit lane q: [sum of a's lane q, b's, c's, d's] (exact int32 sums). */
static inline __m512i tree4(__m512i a, __m512i b, __m512i c, __m512i d)
{
    const __m512i ab = _mm512_add_epi32(_mm512_unpacklo_epi32(a, b), _mm512_unpackhi_epi32(a, b));
    const __m512i cd = _mm512_add_epi32(_mm512_unpacklo_epi32(c, d), _mm512_unpackhi_epi32(c, d));
    return _mm512_add_epi32(_mm512_unpacklo_epi64(ab, cd), _mm512_unpackhi_epi64(ab, cd));
}

/* Row pointers of one token group; a short group repeats its last token. */
static inline void group_tokens(const uint8_t *a, size_t act_bytes, int64_t t, int64_t nt,
                                const void *tok[KT_GEMM512_TOKENS])
{
    for (int k = 0; k < KT_GEMM512_TOKENS; k++)
        tok[k] = a + (size_t)(t + min_i64(k, nt - 1)) * act_bytes;
}

/* ---- Q8_0 x Q8_0 --------------------------------------------------------------- */

/*
 * Scratch of one token group, per group g of 4 blocks (4g .. 4g+3):
 *   pack[g][k][h]: 64 bytes, 128-bit lane b = qs[16h .. 16h+15] of block 4g+b
 *                  of token k, each byte ^ 0x80 (zeros past the last block);
 *   dtab[g][k/4][b][k%4]: the float of block 4g+b's scale for token k.
 */
static void q8_0_prepare(int64_t nb, const void *tok[KT_GEMM512_TOKENS], uint8_t *pack, float *dtab)
{
    const __m128i flip = _mm_set1_epi8((char)0x80);
    const int64_t ng = (nb + 3) / 4;
    for (int64_t g = 0; g < ng; g++)
        for (int k = 0; k < KT_GEMM512_TOKENS; k++) {
            const struct kt_block_q8_0 *y = tok[k];
            for (int b = 0; b < 4; b++) {
                const int64_t i = 4 * g + b;
                uint8_t *p = pack + ((size_t)(g * KT_GEMM512_TOKENS + k) * 2) * 64 + 16 * b;
                float *d = &dtab[g * 32 + (k / 4) * 16 + b * 4 + k % 4];
                if (i < nb) {
                    _mm_storeu_si128((__m128i *)p, _mm_xor_si128(_mm_loadu_si128((const __m128i *)y[i].qs), flip));
                    _mm_storeu_si128((__m128i *)(p + 64),
                                     _mm_xor_si128(_mm_loadu_si128((const __m128i *)(y[i].qs + 16)), flip));
                    *d = fp16_to_f32(y[i].d);
                } else {
                    _mm_storeu_si128((__m128i *)p, _mm_setzero_si128());
                    _mm_storeu_si128((__m128i *)(p + 64), _mm_setzero_si128());
                    *d = 0.0f;
                }
            }
        }
}

/* Lane b = bytes 16h .. 16h+15 of block b's quants, for the nbv blocks at x. */
static inline __m512i q8_0_weights(const struct kt_block_q8_0 *x, int h, int nbv)
{
    __m512i v = _mm512_setzero_si512();
    for (int b = 0; b < nbv; b++)
        v = _mm512_mask_broadcast_i32x4(v, (__mmask16)(0xf << (4 * b)),
                                        _mm_loadu_si128((const __m128i *)(x[b].qs + 16 * h)));
    return v;
}

/* out[k] = dot(row x, token k): per block sum += (dw * da) * (float)sumi, as
 * kt_vec_dot_q8_0_q8_0_ref, lane k of acc = token k. */
static void q8_0_tile(int64_t nb, const struct kt_block_q8_0 *x, const uint8_t *pack, const float *dtab,
                      float out[KT_GEMM512_TOKENS])
{
    const __m512i c80 = _mm512_set1_epi8((char)0x80);
    const __m512i dw_idx = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    __m128 acc_lo = _mm_setzero_ps(), acc_hi = _mm_setzero_ps(); /* tokens 0-3, 4-7 */
    const int64_t ng = (nb + 3) / 4;
    for (int64_t g = 0; g < ng; g++) {
        const struct kt_block_q8_0 *xb = x + 4 * g;
        const int nbv = (int)min_i64(4, nb - 4 * g);
        const __m512i w0 = q8_0_weights(xb, 0, nbv), w1 = q8_0_weights(xb, 1, nbv);
        /* sum (a+128)*w - 128*sum(w) = sum a*w, every partial well inside int32 */
        const __m512i bias = _mm512_sub_epi32(
            _mm512_setzero_si512(), _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), c80, w0), c80, w1));
        const uint8_t *p = pack + (size_t)g * KT_GEMM512_TOKENS * 128;
        __m512i s[KT_GEMM512_TOKENS];
        for (int k = 0; k < KT_GEMM512_TOKENS; k++)
            s[k] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(bias, _mm512_load_si512((const void *)(p + 128 * k)), w0),
                                       _mm512_load_si512((const void *)(p + 128 * k + 64)), w1);
        /* lane b of x03 / x47: block 4g+b for tokens 0-3 / 4-7 */
        const __m512 x03 = _mm512_cvtepi32_ps(tree4(s[0], s[1], s[2], s[3]));
        const __m512 x47 = _mm512_cvtepi32_ps(tree4(s[4], s[5], s[6], s[7]));
        const kt_fp16 z = 0;
        const __m128 dw4 = four_fp16(xb[0].d, nbv > 1 ? xb[1].d : z, nbv > 2 ? xb[2].d : z, nbv > 3 ? xb[3].d : z);
        const __m512 dw = _mm512_permutexvar_ps(dw_idx, _mm512_castps128_ps512(dw4));
        const __m512 t03 = _mm512_mul_ps(_mm512_mul_ps(dw, _mm512_load_ps(dtab + g * 32)), x03);
        const __m512 t47 = _mm512_mul_ps(_mm512_mul_ps(dw, _mm512_load_ps(dtab + g * 32 + 16)), x47);
        if (nbv == 4) {
            acc_lo = _mm_add_ps(acc_lo, _mm512_castps512_ps128(t03));
            acc_hi = _mm_add_ps(acc_hi, _mm512_castps512_ps128(t47));
            acc_lo = _mm_add_ps(acc_lo, _mm512_extractf32x4_ps(t03, 1));
            acc_hi = _mm_add_ps(acc_hi, _mm512_extractf32x4_ps(t47, 1));
            acc_lo = _mm_add_ps(acc_lo, _mm512_extractf32x4_ps(t03, 2));
            acc_hi = _mm_add_ps(acc_hi, _mm512_extractf32x4_ps(t47, 2));
            acc_lo = _mm_add_ps(acc_lo, _mm512_extractf32x4_ps(t03, 3));
            acc_hi = _mm_add_ps(acc_hi, _mm512_extractf32x4_ps(t47, 3));
        } else {
            float f03[16], f47[16];
            _mm512_storeu_ps(f03, t03);
            _mm512_storeu_ps(f47, t47);
            for (int b = 0; b < nbv; b++) {
                acc_lo = _mm_add_ps(acc_lo, _mm_loadu_ps(f03 + 4 * b));
                acc_hi = _mm_add_ps(acc_hi, _mm_loadu_ps(f47 + 4 * b));
            }
        }
    }
    _mm_storeu_ps(out, acc_lo);
    _mm_storeu_ps(out + 4, acc_hi);
}

void kt_gemm_q8_0_q8_0_avx512(int64_t n, const void *w, size_t row_bytes, int64_t n_rows, const void *a,
                              size_t act_bytes, int64_t n_tok, float *y, int64_t y_stride)
{
    const uint8_t *wb = w, *ab = a;
    const int64_t nb = n / KT_QK, ng = (nb + 3) / 4;
    uint8_t *pack = ng > 0 ? aligned_alloc(64, (size_t)ng * KT_GEMM512_TOKENS * 128) : NULL;
    float *dtab = ng > 0 ? aligned_alloc(64, (size_t)ng * 32 * sizeof(float)) : NULL;
    if (!pack || !dtab) {
        for (int64_t t = 0; t < n_tok; t++)
            for (int64_t r = 0; r < n_rows; r++)
                kt_vec_dot_q8_0_q8_0_avx512(n, &y[t * y_stride + r], wb + (size_t)r * row_bytes,
                                            ab + (size_t)t * act_bytes);
        free(pack);
        free(dtab);
        return;
    }
    int64_t panel = (int64_t)(KT_GEMM512_PANEL_BYTES / (row_bytes ? row_bytes : 1));
    panel = panel < 1 ? 1 : panel;
    for (int64_t r0 = 0; r0 < n_rows; r0 += panel) {
        const int64_t r1 = min_i64(r0 + panel, n_rows);
        for (int64_t t = 0; t < n_tok; t += KT_GEMM512_TOKENS) {
            const int64_t nt = min_i64(KT_GEMM512_TOKENS, n_tok - t);
            const void *tok[KT_GEMM512_TOKENS];
            group_tokens(ab, act_bytes, t, nt, tok);
            q8_0_prepare(nb, tok, pack, dtab);
            for (int64_t r = r0; r < r1; r++) {
                float out[KT_GEMM512_TOKENS];
                q8_0_tile(nb, (const void *)(wb + (size_t)r * row_bytes), pack, dtab, out);
                for (int64_t k = 0; k < nt; k++)
                    y[(t + k) * y_stride + r] = out[k];
            }
        }
    }
    free(pack);
    free(dtab);
}

/* ---- Q4_K x Q8_K --------------------------------------------------------------- */

/* sc_0..7 in bytes 0-7, m_0..7 in bytes 8-15 (kt_k_scale_min's unpacking, as
 * vec_dot_avx512.c; reads the 4 bytes after scales[], inside the block). */
static inline __m128i scales_mins_k(const uint8_t scales[12])
{
    return k_scales_mins_128(scales);
}

/*
 * Scratch of one token group, per super-block i:
 *   dtab[i][k]: token k's float scale;
 *   bst[i][h][4k + j%4] (int16, j = 4h + j%4): S_j = bsums[2j] + bsums[2j+1]
 *   of token k (|S_j| <= 32 * 128), so int32 lane 2k + p of half h holds
 *   S_{4h+2p}, S_{4h+2p+1}.
 */
static void q4_K_prepare(int64_t nb, const void *tok[KT_GEMM512_TOKENS], float *dtab, int16_t *bst)
{
    for (int64_t i = 0; i < nb; i++)
        for (int k = 0; k < KT_GEMM512_TOKENS; k++) {
            const struct kt_block_q8_K *y = (const struct kt_block_q8_K *)tok[k] + i;
            dtab[i * 8 + k] = y->d;
            for (int j = 0; j < 8; j++)
                bst[i * 64 + (j / 4) * 32 + 4 * k + j % 4] = (int16_t)(y->bsums[2 * j] + y->bsums[2 * j + 1]);
        }
}

/*
 * out[k] = dot(row x, token k): per super-block
 *   sum += (d*da)*(float)sum_q - (dmin*da)*(float)sum_m
 * as kt_vec_dot_q4_K_q8_K_ref, lane k = token k.  Chunk c's 32 bytes are
 * elements 64c .. 64c+63 (low nibbles, then high), unpacked once into a
 * 64-byte register for all 8 tokens; a vpdpbusd lane (4 products <= 15 * 128)
 * fits an int16, so vpdpwssd by a scale in the lane's low word (high word 0)
 * multiplies and accumulates it exactly.
 */
static void q4_K_tile(int64_t nb, const struct kt_block_q4_K *x, const void *tok[KT_GEMM512_TOKENS],
                      const float *dtab, const int16_t *bst, float out[KT_GEMM512_TOKENS])
{
    const __m512i shift = _mm512_setr_epi64(0, 0, 0, 0, 4, 4, 4, 4);
    const __m512i low4 = _mm512_set1_epi8(0x0f);
    const __m512i ma_idx = _mm512_setr_epi32(4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5);
    const __m512i mb_idx = _mm512_setr_epi32(6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7);
    const struct kt_block_q8_K *y[KT_GEMM512_TOKENS];
    for (int k = 0; k < KT_GEMM512_TOKENS; k++)
        y[k] = tok[k];
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++) {
        const __m128i sm = scales_mins_k(x[i].scales);
        const __m512i sm32 = _mm512_cvtepu8_epi32(sm); /* lanes 0-7 sc_j, 8-15 m_j */
        __m512i sq[KT_GEMM512_TOKENS];
        for (int k = 0; k < KT_GEMM512_TOKENS; k++)
            sq[k] = _mm512_setzero_si512();
        for (int c = 0; c < 4; c++) {
            const __m512i bits = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(x[i].qs + 32 * c)));
            const __m512i q = _mm512_and_si512(_mm512_srlv_epi64(bits, shift), low4);
            const __m512i sc = _mm512_permutexvar_epi32(
                _mm512_setr_epi32(2 * c, 2 * c, 2 * c, 2 * c, 2 * c, 2 * c, 2 * c, 2 * c, 2 * c + 1, 2 * c + 1,
                                  2 * c + 1, 2 * c + 1, 2 * c + 1, 2 * c + 1, 2 * c + 1, 2 * c + 1),
                sm32);
            for (int k = 0; k < KT_GEMM512_TOKENS; k++) {
                const __m512i p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), q,
                                                      _mm512_loadu_si512((const void *)(y[k][i].qs + 64 * c)));
                sq[k] = _mm512_dpwssd_epi32(sq[k], p, sc);
            }
        }
        /* lane q of x03 / x47: tokens 0-3 / 4-7 over 128-bit lane q; fold the 4 lanes */
        const __m512i x03 = tree4(sq[0], sq[1], sq[2], sq[3]), x47 = tree4(sq[4], sq[5], sq[6], sq[7]);
        const __m512i z = _mm512_add_epi32(_mm512_shuffle_i32x4(x03, x47, _MM_SHUFFLE(2, 0, 2, 0)),
                                           _mm512_shuffle_i32x4(x03, x47, _MM_SHUFFLE(3, 1, 3, 1)));
        const __m512i zp = _mm512_shuffle_i32x4(z, z, _MM_SHUFFLE(3, 1, 2, 0));
        const __m256i sum_q = _mm256_add_epi32(_mm512_castsi512_si256(zp), _mm512_extracti64x4_epi64(zp, 1));
        /* sum_j m_j * S_j: lanes 2k, 2k+1 of ms are token k's halves */
        const __m512i m16 = _mm512_zextsi256_si512(_mm256_cvtepu8_epi16(sm)); /* int32 lane 4+p: m_2p, m_2p+1 */
        __m512i ms = _mm512_dpwssd_epi32(_mm512_setzero_si512(), _mm512_load_si512((const void *)(bst + i * 64)),
                                         _mm512_permutexvar_epi32(ma_idx, m16));
        ms = _mm512_dpwssd_epi32(ms, _mm512_load_si512((const void *)(bst + i * 64 + 32)),
                                 _mm512_permutexvar_epi32(mb_idx, m16));
        const __m256i sum_m = _mm512_cvtepi64_epi32(_mm512_add_epi32(ms, _mm512_srli_epi64(ms, 32)));
        const __m256 d = _mm256_set1_ps(fp16_to_f32(x[i].d)), dmin = _mm256_set1_ps(fp16_to_f32(x[i].dmin));
        const __m256 da = _mm256_load_ps(dtab + i * 8);
        const __m256 t = _mm256_sub_ps(_mm256_mul_ps(_mm256_mul_ps(d, da), _mm256_cvtepi32_ps(sum_q)),
                                       _mm256_mul_ps(_mm256_mul_ps(dmin, da), _mm256_cvtepi32_ps(sum_m)));
        acc = _mm256_add_ps(acc, t);
    }
    _mm256_storeu_ps(out, acc);
}

void kt_gemm_q4_K_q8_K_avx512(int64_t n, const void *w, size_t row_bytes, int64_t n_rows, const void *a,
                              size_t act_bytes, int64_t n_tok, float *y, int64_t y_stride)
{
    const uint8_t *wb = w, *ab = a;
    const int64_t nb = n / KT_QK_K;
    float *dtab = nb > 0 ? aligned_alloc(64, (size_t)(nb + 1) / 2 * 2 * 8 * sizeof(float)) : NULL;
    int16_t *bst = nb > 0 ? aligned_alloc(64, (size_t)nb * 64 * sizeof(int16_t)) : NULL;
    if (!dtab || !bst) {
        for (int64_t t = 0; t < n_tok; t++)
            for (int64_t r = 0; r < n_rows; r++)
                kt_vec_dot_q4_K_q8_K_avx512(n, &y[t * y_stride + r], wb + (size_t)r * row_bytes,
                                            ab + (size_t)t * act_bytes);
        free(dtab);
        free(bst);
        return;
    }
    int64_t panel = (int64_t)(KT_GEMM512_PANEL_BYTES / (row_bytes ? row_bytes : 1));
    panel = panel < 1 ? 1 : panel;
    for (int64_t r0 = 0; r0 < n_rows; r0 += panel) {
        const int64_t r1 = min_i64(r0 + panel, n_rows);
        for (int64_t t = 0; t < n_tok; t += KT_GEMM512_TOKENS) {
            const int64_t nt = min_i64(KT_GEMM512_TOKENS, n_tok - t);
            const void *tok[KT_GEMM512_TOKENS];
            group_tokens(ab, act_bytes, t, nt, tok);
            q4_K_prepare(nb, tok, dtab, bst);
            for (int64_t r = r0; r < r1; r++) {
                float out[KT_GEMM512_TOKENS];
                q4_K_tile(nb, (const void *)(wb + (size_t)r * row_bytes), tok, dtab, bst, out);
                for (int64_t k = 0; k < nt; k++)
                    y[(t + k) * y_stride + r] = out[k];
            }
        }
    }
    free(dtab);
    free(bst);
}
