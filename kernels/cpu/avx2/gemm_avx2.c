/*
 * gemm_avx2.c - AVX2 prefill products: y[t][r] = dot(W[r], A[t]) for many
 * tokens t at once (Q8_0 and Q4_K weights), the compute-bound side of the
 * CPU expert path.
 *
 * Register tile: one weight row x 4 tokens.  Each weight block is loaded and
 * unpacked once and multiplied into 4 activation rows; the 4 results of a
 * block are reduced together and each token's float accumulator (one lane)
 * takes that block's term exactly as vec_dot's scalar sum does, in block
 * order.  So every output equals vec_dot bit for bit; this file must never
 * merge two blocks' integer sums before their float scale, nor reorder the
 * float adds.  Cache tile: a panel of rows that fits in L2 is run against
 * every group of 4 tokens, so weights come from memory once per call.
 * Token counts that are not a multiple of 4 finish with vec_dot itself.
 */
#include "cpu/avx2/gemm_avx2.h"
#include "cpu/avx2/kernels_avx2.h"
#include "cpu/avx2/simd_avx2.h"

/* Weight bytes of one row panel: about half of a 2 MiB L2, leaving room for
 * the 4 activation rows streaming through L1. */
#define KT_GEMM_PANEL_BYTES (768 * 1024)
#define KT_GEMM_TOKENS 4

/* out[k] = dot(w, a row k) for the 4 activation rows at a + k * act_bytes. */
typedef void (*tile_fn)(int64_t n, const void *w, const uint8_t *a, size_t act_bytes, float out[KT_GEMM_TOKENS]);

static inline void gemm_drive(int64_t n, const void *w, size_t row_bytes, int64_t n_rows, const void *a,
                              size_t act_bytes, int64_t n_tok, float *y, int64_t y_stride, tile_fn tile,
                              kt_vec_dot_fn dot)
{
    const uint8_t *wb = w, *ab = a;
    int64_t panel = (int64_t)(KT_GEMM_PANEL_BYTES / (row_bytes ? row_bytes : 1));
    panel = panel < 1 ? 1 : panel;
    for (int64_t r0 = 0; r0 < n_rows; r0 += panel) {
        const int64_t r1 = r0 + panel < n_rows ? r0 + panel : n_rows;
        int64_t t = 0;
        for (; t + KT_GEMM_TOKENS <= n_tok; t += KT_GEMM_TOKENS) {
            for (int64_t r = r0; r < r1; r++) {
                float out[KT_GEMM_TOKENS];
                tile(n, wb + (size_t)r * row_bytes, ab + (size_t)t * act_bytes, act_bytes, out);
                for (int k = 0; k < KT_GEMM_TOKENS; k++)
                    y[(t + k) * y_stride + r] = out[k];
            }
        }
        for (; t < n_tok; t++)
            for (int64_t r = r0; r < r1; r++)
                dot(n, &y[t * y_stride + r], wb + (size_t)r * row_bytes, ab + (size_t)t * act_bytes);
    }
}

/* ---- Q8_0 x Q8_0 --------------------------------------------------------------- */

/* Per block: sum += (dw * da) * (float)sumi, as kt_vec_dot_q8_0_q8_0_ref. */
static void q8_0_tile(int64_t n, const void *w, const uint8_t *a, size_t act_bytes, float out[KT_GEMM_TOKENS])
{
    const struct kt_block_q8_0 *x = w; /* (n/32) */
    const struct kt_block_q8_0 *y0 = (const void *)a, *y1 = (const void *)(a + act_bytes),
                               *y2 = (const void *)(a + 2 * act_bytes), *y3 = (const void *)(a + 3 * act_bytes);
    const __m256i ones = _mm256_set1_epi16(1);
    __m128 acc = _mm_setzero_ps();
    for (int64_t i = 0; i < n / KT_QK; i++) {
        /* |w| once per block; the sign moves onto each token's quants (in [-127, 127]) */
        const __m256i q = _mm256_loadu_si256((const __m256i *)x[i].qs);
        const __m256i aq = _mm256_sign_epi8(q, q);
#define KT_Q8_DOT(yk) \
    _mm256_madd_epi16(_mm256_maddubs_epi16(aq, _mm256_sign_epi8(_mm256_loadu_si256((const __m256i *)yk[i].qs), q)), ones)
        const __m128i sumi = hsum4_epi32(KT_Q8_DOT(y0), KT_Q8_DOT(y1), KT_Q8_DOT(y2), KT_Q8_DOT(y3));
#undef KT_Q8_DOT
        const __m128 dw = _mm_set1_ps(fp16_to_f32(x[i].d));
        const __m128 da = four_fp16(y0[i].d, y1[i].d, y2[i].d, y3[i].d);
        acc = _mm_add_ps(acc, _mm_mul_ps(_mm_mul_ps(dw, da), _mm_cvtepi32_ps(sumi)));
    }
    _mm_storeu_ps(out, acc);
}

void kt_gemm_q8_0_q8_0_avx2(int64_t n, const void *w, size_t row_bytes, int64_t n_rows, const void *a,
                            size_t act_bytes, int64_t n_tok, float *y, int64_t y_stride)
{
    gemm_drive(n, w, row_bytes, n_rows, a, act_bytes, n_tok, y, y_stride, q8_0_tile, kt_vec_dot_q8_0_q8_0_avx2);
}

/* ---- Q4_K x Q8_K --------------------------------------------------------------- */

/* The 6-bit scales (bytes 0-7) and mins (bytes 8-15) of a Q4_K/Q5_K block in
 * both 128-bit halves; the same unpacking as vec_dot_kquant_avx2.c's
 * k_scales_mins (reads the 4 bytes after scales[], inside the block). */
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
 * with sum_q = sum_j sc_j * sum_{l in j} q*qa and sum_m = sum_j m_j * (bsums[2j] + bsums[2j+1]),
 * as kt_vec_dot_q4_K_q8_K_ref.  maddubs pairs: 2 * 15 * 128 < 2^15.
 */
static void q4_K_tile(int64_t n, const void *w, const uint8_t *a, size_t act_bytes, float out[KT_GEMM_TOKENS])
{
    const struct kt_block_q4_K *x = w; /* (n/256) */
    const struct kt_block_q8_K *y[KT_GEMM_TOKENS];
    for (int k = 0; k < KT_GEMM_TOKENS; k++)
        y[k] = (const void *)(a + (size_t)k * act_bytes);
    const __m256i low4 = _mm256_set1_epi8(0x0f);
    const __m256i m_twice_idx = _mm256_setr_epi8(8, -1, 8, -1, 9, -1, 9, -1, 10, -1, 10, -1, 11, -1, 11, -1, 12, -1,
                                                 12, -1, 13, -1, 13, -1, 14, -1, 14, -1, 15, -1, 15, -1);
    __m128 acc = _mm_setzero_ps();
    for (int64_t i = 0; i < n / KT_QK_K; i++) {
        const __m256i sm = scales_mins_k(x[i].scales);
        __m256i sq[KT_GEMM_TOKENS], smin[KT_GEMM_TOKENS];
        for (int k = 0; k < KT_GEMM_TOKENS; k++)
            sq[k] = _mm256_setzero_si256();
        for (int c = 0; c < 4; c++) { /* byte l of chunk c: element 64c+l low nibble, 64c+32+l high */
            const __m256i bits = _mm256_loadu_si256((const __m256i *)(x[i].qs + 32 * c));
            const __m256i lo = _mm256_and_si256(bits, low4);
            const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(bits, 4), low4);
            const __m256i sc_lo = byte_as_i16(sm, 2 * c), sc_hi = byte_as_i16(sm, 2 * c + 1);
            for (int k = 0; k < KT_GEMM_TOKENS; k++) {
                const int8_t *q8 = y[k][i].qs + 64 * c;
                const __m256i p_lo =
                    _mm256_madd_epi16(sc_lo, _mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i *)q8)));
                const __m256i p_hi = _mm256_madd_epi16(
                    sc_hi, _mm256_maddubs_epi16(hi, _mm256_loadu_si256((const __m256i *)(q8 + 32))));
                sq[k] = _mm256_add_epi32(sq[k], _mm256_add_epi32(p_lo, p_hi));
            }
        }
        const __m256i m_twice = _mm256_shuffle_epi8(sm, m_twice_idx);
        for (int k = 0; k < KT_GEMM_TOKENS; k++)
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

void kt_gemm_q4_K_q8_K_avx2(int64_t n, const void *w, size_t row_bytes, int64_t n_rows, const void *a,
                            size_t act_bytes, int64_t n_tok, float *y, int64_t y_stride)
{
    gemm_drive(n, w, row_bytes, n_rows, a, act_bytes, n_tok, y, y_stride, q4_K_tile, kt_vec_dot_q4_K_q8_K_avx2);
}
