/*
 * gemm_kquant_avx512.c - AVX-512 VNNI prefill products for Q5_K and Q6_K
 * weights against Q8_K activations: y[t][r] = dot(W[r], A[t]) for many
 * tokens t at once, on CPUs with AVX-512 VNNI.
 *
 * The scheme of gemm_avx512.c's Q4_K: register tile one weight row x 8
 * tokens.  Each 64-element chunk of a super-block is unpacked once into a
 * 64-byte register of unsigned quants (Q5_K <= 31, Q6_K <= 63) and fed to
 * vpdpbusd against 8 activation rows; a vpdpbusd lane (4 products, at most
 * 4 * 63 * 128 = 32256) fits an int16, so vpdpwssd by a scale held in the
 * lane's low word (high word 0) multiplies and accumulates it exactly.  The
 * integer sums of a (super-block, token) pair therefore equal the
 * reference's, and each token's float accumulator (one lane) takes that
 * super-block's term with the reference's expression, in block order: every
 * output equals vec_dot (and kernels/cpu/ref) bit for bit.  This file must
 * never merge two super-blocks' integer sums before their float scale, never
 * reorder or fuse (FMA) the float steps (-ffp-contract=off), and never read a
 * weight or activation row past its n elements.
 *
 * Per token group (8 tokens; a short last group repeats its last token and
 * stores only the real ones) a small scratch holds what every row of a panel
 * reuses: the tokens' float scales and, for Q5_K, the pair sums
 * bsums[2j] + bsums[2j+1] laid out for vpdpwssd against the 6-bit mins.
 * Cache tile: a panel of rows that fits in L2 runs against every token
 * group, so weights come from memory once per call.  If the scratch cannot
 * be allocated the call falls back to one vec_dot per pair.
 */
#if !defined(__AVX512F__) || !defined(__AVX512BW__) || !defined(__AVX512VL__) || !defined(__AVX512VNNI__)
#error "gemm_kquant_avx512.c needs the AVX-512 level flags (kernels/CMakeLists.txt sets them for cpu/avx512/*.c)"
#endif

#include "cpu/avx512/gemm_kquant_avx512.h"
#include "cpu/avx2/kernels_avx2.h"
#include "cpu/avx2/simd_avx2.h"

#include <stdbool.h>
#include <stdlib.h>

/* Weight bytes of one row panel: about a third of a 2 MiB L2, leaving room
 * for the token group's scratch and activation rows. */
#define KT_KGEMM512_PANEL_BYTES (640 * 1024)
#define KT_KGEMM512_TOKENS 8

static inline int64_t min_i64(int64_t a, int64_t b)
{
    return a < b ? a : b;
}

/* What every row of a panel reads for one token group. */
struct token_group {
    const struct kt_block_q8_K *tok[KT_KGEMM512_TOKENS]; /* (n/256) each; a short group repeats its last */
    float *dtab;   /* (nb, 8): token k's float scale of super-block i */
    int16_t *bst;  /* (nb, 64), Q5_K only: see q5_K_prepare */
};

/* Per 128-bit lane q: [sum of a's lane q, b's, c's, d's] (exact int32 sums). */
static inline __m512i tree4(__m512i a, __m512i b, __m512i c, __m512i d)
{
    const __m512i ab = _mm512_add_epi32(_mm512_unpacklo_epi32(a, b), _mm512_unpackhi_epi32(a, b));
    const __m512i cd = _mm512_add_epi32(_mm512_unpacklo_epi32(c, d), _mm512_unpackhi_epi32(c, d));
    return _mm512_add_epi32(_mm512_unpacklo_epi64(ab, cd), _mm512_unpackhi_epi64(ab, cd));
}

/* Lane k = the sum of s[k]'s 16 lanes (exact). */
static inline __m256i sum_tokens(const __m512i s[KT_KGEMM512_TOKENS])
{
    const __m512i x03 = tree4(s[0], s[1], s[2], s[3]), x47 = tree4(s[4], s[5], s[6], s[7]);
    /* lane q of x03 / x47: tokens 0-3 / 4-7 over 128-bit lane q; fold the 4 lanes */
    const __m512i z = _mm512_add_epi32(_mm512_shuffle_i32x4(x03, x47, _MM_SHUFFLE(2, 0, 2, 0)),
                                       _mm512_shuffle_i32x4(x03, x47, _MM_SHUFFLE(3, 1, 3, 1)));
    const __m512i zp = _mm512_shuffle_i32x4(z, z, _MM_SHUFFLE(3, 1, 2, 0));
    return _mm256_add_epi32(_mm512_castsi512_si256(zp), _mm512_extracti64x4_epi64(zp, 1));
}

/* Every token's float scale per super-block: dtab[i][k]. */
static void scales_prepare(int64_t nb, struct token_group *g)
{
    for (int64_t i = 0; i < nb; i++)
        for (int k = 0; k < KT_KGEMM512_TOKENS; k++)
            g->dtab[i * 8 + k] = g->tok[k][i].d;
}

typedef void (*prepare_fn)(int64_t nb, struct token_group *g);
/* out[k] = dot(row w, token k of g). */
typedef void (*tile_fn)(int64_t nb, const void *w, const struct token_group *g, float out[KT_KGEMM512_TOKENS]);

static size_t round_up_64(size_t bytes)
{
    return (bytes + 63) & ~(size_t)63;
}

static void kgemm512_drive(int64_t n, const void *w, size_t row_bytes, int64_t n_rows, const void *a,
                           size_t act_bytes, int64_t n_tok, float *y, int64_t y_stride, bool with_bst,
                           prepare_fn prepare, tile_fn tile, kt_vec_dot_fn dot)
{
    const uint8_t *wb = w, *ab = a;
    const int64_t nb = n / KT_QK_K;
    struct token_group g = {{0}, NULL, NULL};
    if (nb > 0) {
        g.dtab = aligned_alloc(64, round_up_64((size_t)nb * 8 * sizeof(float)));
        g.bst = with_bst ? aligned_alloc(64, (size_t)nb * 64 * sizeof(int16_t)) : NULL;
    }
    if (!g.dtab || (with_bst && !g.bst)) {
        for (int64_t t = 0; t < n_tok; t++)
            for (int64_t r = 0; r < n_rows; r++)
                dot(n, &y[t * y_stride + r], wb + (size_t)r * row_bytes, ab + (size_t)t * act_bytes);
        goto done;
    }
    int64_t panel = (int64_t)(KT_KGEMM512_PANEL_BYTES / (row_bytes ? row_bytes : 1));
    panel = panel < 1 ? 1 : panel;
    for (int64_t r0 = 0; r0 < n_rows; r0 += panel) {
        const int64_t r1 = min_i64(r0 + panel, n_rows);
        for (int64_t t = 0; t < n_tok; t += KT_KGEMM512_TOKENS) {
            const int64_t nt = min_i64(KT_KGEMM512_TOKENS, n_tok - t);
            for (int k = 0; k < KT_KGEMM512_TOKENS; k++)
                g.tok[k] = (const void *)(ab + (size_t)(t + min_i64(k, nt - 1)) * act_bytes);
            prepare(nb, &g);
            for (int64_t r = r0; r < r1; r++) {
                float out[KT_KGEMM512_TOKENS];
                tile(nb, wb + (size_t)r * row_bytes, &g, out);
                for (int64_t k = 0; k < nt; k++)
                    y[(t + k) * y_stride + r] = out[k];
            }
        }
    }
done:
    free(g.dtab);
    free(g.bst);
}

/* ---- Q5_K x Q8_K --------------------------------------------------------------- */

/* sc_0..7 in bytes 0-7, m_0..7 in bytes 8-15 (kt_k_scale_min's unpacking;
 * reads the 4 bytes after scales[], inside the block). */
static inline __m128i scales_mins_k(const uint8_t scales[12])
{
    return k_scales_mins_128(scales);
}

/*
 * Scales and, per super-block i, bst[i][h][4k + j%4] (int16, j = 4h + j%4):
 * S_j = bsums[2j] + bsums[2j+1] of token k (|S_j| <= 32 * 128), so int32
 * lane 2k + p of half h holds S_{4h+2p}, S_{4h+2p+1}.
 */
static void q5_K_prepare(int64_t nb, struct token_group *g)
{
    scales_prepare(nb, g);
    for (int64_t i = 0; i < nb; i++)
        for (int k = 0; k < KT_KGEMM512_TOKENS; k++) {
            const struct kt_block_q8_K *y = &g->tok[k][i];
            for (int j = 0; j < 8; j++)
                g->bst[i * 64 + (j / 4) * 32 + 4 * k + j % 4] = (int16_t)(y->bsums[2 * j] + y->bsums[2 * j + 1]);
        }
}

/*
 * out[k] = dot(row x, token k): per super-block
 *   sum += (d*da)*(float)sum_q - (dmin*da)*(float)sum_m
 * as kt_vec_dot_q5_K_q8_K_ref, lane k = token k.  Chunk c's 32 bytes of qs
 * are elements 64c .. 64c+63 (low nibbles, then high); byte l of qh adds 16
 * to element 64c+l when bit 2c is set and to 64c+32+l when bit 2c+1 is.
 */
static void q5_K_tile(int64_t nb, const void *w, const struct token_group *g, float out[KT_KGEMM512_TOKENS])
{
    const struct kt_block_q5_K *x = w; /* (nb) */
    const __m512i shift = _mm512_setr_epi64(0, 0, 0, 0, 4, 4, 4, 4);
    const __m512i low4 = _mm512_set1_epi8(0x0f), sixteen = _mm512_set1_epi8(0x10);
    const __m512i ma_idx = _mm512_setr_epi32(4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5);
    const __m512i mb_idx = _mm512_setr_epi32(6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++) {
        const __m128i sm = scales_mins_k(x[i].scales);
        const __m512i sm32 = _mm512_cvtepu8_epi32(sm); /* lanes 0-7 sc_j, 8-15 m_j */
        const __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)x[i].qh));
        __m512i sq[KT_KGEMM512_TOKENS];
        for (int k = 0; k < KT_KGEMM512_TOKENS; k++)
            sq[k] = _mm512_setzero_si512();
        for (int c = 0; c < 4; c++) {
            const __m512i bits = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(x[i].qs + 32 * c)));
            const __m512i fifth_bit = _mm512_inserti64x4(_mm512_set1_epi8((char)(1 << (2 * c))),
                                                         _mm256_set1_epi8((char)(1 << (2 * c + 1))), 1);
            const __m512i nibbles = _mm512_and_si512(_mm512_srlv_epi64(bits, shift), low4);
            const __m512i q =
                _mm512_mask_add_epi8(nibbles, _mm512_test_epi8_mask(qh, fifth_bit), nibbles, sixteen);
            const __m512i sc = _mm512_permutexvar_epi32(
                _mm512_setr_epi32(2 * c, 2 * c, 2 * c, 2 * c, 2 * c, 2 * c, 2 * c, 2 * c, 2 * c + 1, 2 * c + 1,
                                  2 * c + 1, 2 * c + 1, 2 * c + 1, 2 * c + 1, 2 * c + 1, 2 * c + 1),
                sm32);
            for (int k = 0; k < KT_KGEMM512_TOKENS; k++) {
                const __m512i p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), q,
                                                      _mm512_loadu_si512((const void *)(g->tok[k][i].qs + 64 * c)));
                sq[k] = _mm512_dpwssd_epi32(sq[k], p, sc);
            }
        }
        const __m256i sum_q = sum_tokens(sq);
        /* sum_j m_j * S_j: lanes 2k, 2k+1 of ms are token k's halves */
        const __m512i m16 = _mm512_zextsi256_si512(_mm256_cvtepu8_epi16(sm)); /* int32 lane 4+p: m_2p, m_2p+1 */
        __m512i ms = _mm512_dpwssd_epi32(_mm512_setzero_si512(), _mm512_load_si512((const void *)(g->bst + i * 64)),
                                         _mm512_permutexvar_epi32(ma_idx, m16));
        ms = _mm512_dpwssd_epi32(ms, _mm512_load_si512((const void *)(g->bst + i * 64 + 32)),
                                 _mm512_permutexvar_epi32(mb_idx, m16));
        const __m256i sum_m = _mm512_cvtepi64_epi32(_mm512_add_epi32(ms, _mm512_srli_epi64(ms, 32)));
        const __m256 d = _mm256_set1_ps(fp16_to_f32(x[i].d)), dmin = _mm256_set1_ps(fp16_to_f32(x[i].dmin));
        const __m256 da = _mm256_loadu_ps(g->dtab + i * 8);
        const __m256 t = _mm256_sub_ps(_mm256_mul_ps(_mm256_mul_ps(d, da), _mm256_cvtepi32_ps(sum_q)),
                                       _mm256_mul_ps(_mm256_mul_ps(dmin, da), _mm256_cvtepi32_ps(sum_m)));
        acc = _mm256_add_ps(acc, t);
    }
    _mm256_storeu_ps(out, acc);
}

void kt_gemm_q5_K_q8_K_avx512(int64_t n, const void *w, size_t row_bytes, int64_t n_rows, const void *a,
                              size_t act_bytes, int64_t n_tok, float *y, int64_t y_stride)
{
    kgemm512_drive(n, w, row_bytes, n_rows, a, act_bytes, n_tok, y, y_stride, true, q5_K_prepare, q5_K_tile,
                   kt_vec_dot_q5_K_q8_K_avx2);
}

/* ---- Q6_K x Q8_K --------------------------------------------------------------- */

/*
 * out[k] = dot(row x, token k): per super-block  sum += (d*da)*(float)sumi
 * with sumi = sum_g sc_g * sum_{l in g} q*qa - 32 * sum_g sc_g * bsums_g
 * (q in [0, 63]), as kt_vec_dot_q6_K_q8_K_ref, lane k = token k.  Half h
 * (elements 128h .. 128h+127) is two registers: lo = elements 128h .. +63
 * (ql[64h ..] low nibbles, qh bits 0-1 then 2-3), hi = elements 128h+64 ..
 * +63 (ql high nibbles, qh bits 4-5 then 6-7); 128-bit lane j of lo is group
 * 8h+j, of hi group 8h+4+j.
 */
static void q6_K_tile(int64_t nb, const void *w, const struct token_group *g, float out[KT_KGEMM512_TOKENS])
{
    const struct kt_block_q6_K *x = w; /* (nb) */
    const __m512i low4 = _mm512_set1_epi8(0x0f), bits45 = _mm512_set1_epi8(0x30);
    const __m512i lo_shift = _mm512_setr_epi64(4, 4, 4, 4, 2, 2, 2, 2); /* left: bits 0-1, 2-3 to 4-5 */
    const __m512i hi_shift = _mm512_setr_epi64(0, 0, 0, 0, 2, 2, 2, 2); /* right: bits 4-5, 6-7 to 4-5 */
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++) {
        const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)x[i].scales));
        const __m512i sc32 = _mm512_cvtepu16_epi32(sc16); /* lane g: sc_g in the low word, 0 above */
        const __m256i sc_neg32 = _mm256_sub_epi16(_mm256_setzero_si256(), _mm256_slli_epi16(sc16, 5));
        __m512i sq[KT_KGEMM512_TOKENS];
        for (int k = 0; k < KT_KGEMM512_TOKENS; k++) /* -32 * sum_g sc_g * bsums_g, |.| < 2^27 */
            sq[k] = _mm512_zextsi256_si512(
                _mm256_madd_epi16(sc_neg32, _mm256_loadu_si256((const __m256i *)g->tok[k][i].bsums)));
        for (int h = 0; h < 2; h++) {
            const __m512i ql = _mm512_loadu_si512((const void *)(x[i].ql + 64 * h));
            const __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(x[i].qh + 32 * h)));
            const __m512i lo = _mm512_or_si512(_mm512_and_si512(ql, low4),
                                               _mm512_and_si512(_mm512_sllv_epi64(qh, lo_shift), bits45));
            const __m512i hi = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), low4),
                                               _mm512_and_si512(_mm512_srlv_epi64(qh, hi_shift), bits45));
            const int g0 = 8 * h;
            const __m512i sc_lo = _mm512_permutexvar_epi32(
                _mm512_setr_epi32(g0, g0, g0, g0, g0 + 1, g0 + 1, g0 + 1, g0 + 1, g0 + 2, g0 + 2, g0 + 2, g0 + 2,
                                  g0 + 3, g0 + 3, g0 + 3, g0 + 3),
                sc32);
            const __m512i sc_hi = _mm512_permutexvar_epi32(
                _mm512_setr_epi32(g0 + 4, g0 + 4, g0 + 4, g0 + 4, g0 + 5, g0 + 5, g0 + 5, g0 + 5, g0 + 6, g0 + 6,
                                  g0 + 6, g0 + 6, g0 + 7, g0 + 7, g0 + 7, g0 + 7),
                sc32);
            for (int k = 0; k < KT_KGEMM512_TOKENS; k++) {
                const int8_t *q8 = g->tok[k][i].qs + 128 * h;
                const __m512i p_lo =
                    _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, _mm512_loadu_si512((const void *)q8));
                const __m512i p_hi =
                    _mm512_dpbusd_epi32(_mm512_setzero_si512(), hi, _mm512_loadu_si512((const void *)(q8 + 64)));
                sq[k] = _mm512_dpwssd_epi32(_mm512_dpwssd_epi32(sq[k], p_lo, sc_lo), p_hi, sc_hi);
            }
        }
        const __m256i sumi = sum_tokens(sq);
        const __m256 d = _mm256_set1_ps(fp16_to_f32(x[i].d));
        const __m256 da = _mm256_loadu_ps(g->dtab + i * 8);
        acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_mul_ps(d, da), _mm256_cvtepi32_ps(sumi)));
    }
    _mm256_storeu_ps(out, acc);
}

void kt_gemm_q6_K_q8_K_avx512(int64_t n, const void *w, size_t row_bytes, int64_t n_rows, const void *a,
                              size_t act_bytes, int64_t n_tok, float *y, int64_t y_stride)
{
    kgemm512_drive(n, w, row_bytes, n_rows, a, act_bytes, n_tok, y, y_stride, false, scales_prepare, q6_K_tile,
                   kt_vec_dot_q6_K_q8_K_avx2);
}
