/*
 * fp8_avx512.c - AVX-512 products of kt's block FP8 (FP8_B128) weights with
 * F32 activations: the decode dot product, the decode gemv (four rows per
 * pass) and the prefill gemm.
 *
 * All keep kt_vec_dot_fp8_b128_f32_ref's order: weight i is e4m3(q) * d
 * rounded once (block_weights: the codes widened with three integer ops to
 * e4m3(q) * 2^-120, exactly, then one multiply by d * 2^120), fused-multiply-
 * added into lane i % 64 of four 16-lane registers, and the 64 lanes are
 * halved pairwise (l + 32, + 16, + 8, then hsum_ps's + 4, + 2, + 1).  So each
 * output equals the reference, and every other level's, bit for bit.  The
 * gemv runs four rows against each activation load; the gemm decodes each
 * 128-element block once into eight registers and feeds it to the
 * accumulators of 4 tokens (24 of the 32 registers; 8 tokens would spill).
 * Never change an element's lane or the halving order, never read past a
 * row's n elements (only prefetches aim further); rows must hold no E4M3 NaN
 * codes (kt_fp8_b128_check_row).
 */
#if !defined(__AVX512F__) || !defined(__AVX512BW__) || !defined(__AVX512VL__)
#error "fp8_avx512.c needs the AVX-512 level flags (kernels/CMakeLists.txt sets them for cpu/avx512/*.c)"
#endif

#include "cpu/avx2/simd_avx2.h"
#include "cpu/avx512/gemm_avx512.h"
#include "cpu/avx512/kernels_avx512.h"
#include "cpu/ref/vec_dot_ref.h"

/* Weight bytes of one row panel, run against every token group (see gemm_avx512.c). */
#define KT_FP8_PANEL_BYTES (640 * 1024)
#define KT_FP8_TOKENS 4
#define KT_FP8_GEMV_ROWS 4
/* Per row of the gemv: how far ahead of the block being read the prefetches aim. */
#define KT_FP8_GEMV_PREFETCH 2048

static_assert(KT_FP8_LANES == 64, "four registers of 16 lanes");

/* Sixteen codes as F32 e4m3(q) * 2^-120, exactly: the sign-extended code
 * shifted by 20 puts the 7 magnitude bits at F32 bit 20 (the exponent field
 * e4 + 0, so e4 = 0 is a subnormal F32, as E4M3's subnormals) and copies of
 * the sign at bits 31..27, of which the mask keeps bit 31. */
static inline __m512 e4m3x16_scaled(const uint8_t q[16])
{
    const __m512i s = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)q));
    return _mm512_castsi512_ps(_mm512_and_si512(_mm512_slli_epi32(s, 20), _mm512_set1_epi32((int)0x87f00000u)));
}

/* The rare path, |d| >= 2^8 (fp8_scale_2p120 false): e4m3(q) * 2^-120 *
 * 2^120 (exact) * d, rounded once as well.  Needs MXCSR's DAZ off (the C
 * default), like every kernel here. */
static inline void block_weights_large_scale(const struct kt_block_fp8_b128 *b, __m512 wv[8])
{
    const __m512 d = _mm512_set1_ps(b->d);
    for (int c = 0; c < 8; c++)
        wv[c] = _mm512_mul_ps(_mm512_mul_ps(e4m3x16_scaled(b->q + 16 * c), _mm512_set1_ps(0x1p120f)), d);
}

/* Block b's 128 weights e4m3(q) * d as wv[c] = elements 16c .. 16c+15. */
static inline void block_weights(const struct kt_block_fp8_b128 *b, __m512 wv[8])
{
    float d120;
    if (!fp8_scale_2p120(b->d, &d120)) {
        block_weights_large_scale(b, wv);
        return;
    }
    const __m512 m = _mm512_set1_ps(d120);
    for (int c = 0; c < 8; c++)
        wv[c] = _mm512_mul_ps(e4m3x16_scaled(b->q + 16 * c), m);
}

/* The reference's halving of the 64 lanes acc[0..3] (lanes 16k .. 16k+15). */
static inline float lanes_sum(const __m512 acc[4])
{
    const __m512 h32 = _mm512_add_ps(acc[0], acc[2]); /* lanes 0-15: l + (l + 32) */
    const __m512 h32b = _mm512_add_ps(acc[1], acc[3]); /* lanes 16-31 */
    const __m512 h16 = _mm512_add_ps(h32, h32b);      /* l + (l + 16) */
    return hsum_ps(_mm256_add_ps(_mm512_castps512_ps256(h16), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(h16), 1))));
}

void kt_vec_dot_fp8_b128_f32_avx512(int64_t n, float *out, const void *w, const void *a)
{
    const struct kt_block_fp8_b128 *x = w; /* (n/128) blocks */
    const float *y = a;                    /* (n) */
    __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
    for (int64_t i = 0; i < n / KT_QK_FP8; i++) {
        prefetch_ahead(&x[i], sizeof x[i]);
        __m512 wv[8];
        block_weights(&x[i], wv);
        const float *yb = y + i * KT_QK_FP8;
        for (int c = 0; c < 8; c++) /* elements 16c .. 16c+15: lanes 16(c%4) .. */
            acc[c % 4] = _mm512_fmadd_ps(wv[c], _mm512_loadu_ps(yb + 16 * c), acc[c % 4]);
    }
    *out = lanes_sum(acc);
}

/* ---- gemv: four rows per pass --------------------------------------------------- */

/* Prefetches the lines of block i of a row KT_FP8_GEMV_PREFETCH bytes ahead;
 * past the row's end, the same offset in the row next_row bytes further on
 * (the one the next pass reads).  Prefetches never fault. */
static inline void prefetch_row_ahead(uintptr_t row, size_t off, size_t row_bytes, size_t next_row)
{
    const size_t ahead = off + KT_FP8_GEMV_PREFETCH;
    const uintptr_t p = ahead < row_bytes ? row + ahead : row + next_row + (ahead - row_bytes);
    _mm_prefetch((const char *)p, _MM_HINT_T0);
    _mm_prefetch((const char *)(p + 64), _MM_HINT_T0);
    _mm_prefetch((const char *)(p + sizeof(struct kt_block_fp8_b128) - 1), _MM_HINT_T0);
}

/* out4[k] = vec_dot(row[k], y) for four rows. */
static void fp8_rows4(int64_t nb, const struct kt_block_fp8_b128 *const row[KT_FP8_GEMV_ROWS], size_t row_bytes,
                      const float *y, float out4[KT_FP8_GEMV_ROWS])
{
    const size_t next_row = KT_FP8_GEMV_ROWS * row_bytes;
    __m512 acc[KT_FP8_GEMV_ROWS][4];
    for (int k = 0; k < KT_FP8_GEMV_ROWS; k++)
        for (int j = 0; j < 4; j++)
            acc[k][j] = _mm512_setzero_ps();
    for (int64_t i = 0; i < nb; i++) {
        const float *yb = y + i * KT_QK_FP8;
        __m512 m[KT_FP8_GEMV_ROWS];
        bool large = false;
        for (int k = 0; k < KT_FP8_GEMV_ROWS; k++) {
            prefetch_row_ahead((uintptr_t)row[k], (size_t)i * sizeof row[k][i], row_bytes, next_row);
            float d120;
            large |= !fp8_scale_2p120(row[k][i].d, &d120);
            m[k] = _mm512_set1_ps(d120);
        }
        if (__builtin_expect(large, 0)) {
            for (int k = 0; k < KT_FP8_GEMV_ROWS; k++) {
                __m512 wv[8];
                block_weights(&row[k][i], wv);
                for (int c = 0; c < 8; c++)
                    acc[k][c % 4] = _mm512_fmadd_ps(wv[c], _mm512_loadu_ps(yb + 16 * c), acc[k][c % 4]);
            }
            continue;
        }
        for (int c = 0; c < 8; c++) {
            const __m512 yc = _mm512_loadu_ps(yb + 16 * c);
            for (int k = 0; k < KT_FP8_GEMV_ROWS; k++)
                acc[k][c % 4] =
                    _mm512_fmadd_ps(_mm512_mul_ps(e4m3x16_scaled(row[k][i].q + 16 * c), m[k]), yc, acc[k][c % 4]);
        }
    }
    for (int k = 0; k < KT_FP8_GEMV_ROWS; k++)
        out4[k] = lanes_sum(acc[k]);
}

void kt_gemv_fp8_b128_f32_avx512(int64_t n, float *out, const void *w, size_t row_bytes, const void *a,
                                 int64_t n_rows)
{
    const uint8_t *base = w;
    const int64_t nb = n / KT_QK_FP8;
    int64_t r0 = 0;
    for (; r0 + KT_FP8_GEMV_ROWS <= n_rows; r0 += KT_FP8_GEMV_ROWS) {
        const struct kt_block_fp8_b128 *row[KT_FP8_GEMV_ROWS];
        for (int k = 0; k < KT_FP8_GEMV_ROWS; k++)
            row[k] = (const void *)(base + (size_t)(r0 + k) * row_bytes);
        fp8_rows4(nb, row, row_bytes, a, out + r0);
    }
    for (; r0 < n_rows; r0++) /* the last n_rows % 4 */
        kt_vec_dot_fp8_b128_f32_avx512(n, &out[r0], base + (size_t)r0 * row_bytes, a);
}

/* ---- gemm: four tokens per decoded block ---------------------------------------- */

static inline int64_t min_i64(int64_t a, int64_t b)
{
    return a < b ? a : b;
}

/* out[k] = dot(row x, token k) for the KT_FP8_TOKENS rows tok[]: vec_dot's
 * lanes, one set per token. */
static void fp8_tile(int64_t nb, const struct kt_block_fp8_b128 *x, const float *const tok[KT_FP8_TOKENS],
                     float out[KT_FP8_TOKENS])
{
    __m512 acc[KT_FP8_TOKENS][4];
    for (int k = 0; k < KT_FP8_TOKENS; k++)
        for (int j = 0; j < 4; j++)
            acc[k][j] = _mm512_setzero_ps();
    for (int64_t i = 0; i < nb; i++) {
        __m512 wv[8];
        block_weights(&x[i], wv);
        for (int k = 0; k < KT_FP8_TOKENS; k++) {
            const float *yb = tok[k] + i * KT_QK_FP8;
            for (int c = 0; c < 8; c++)
                acc[k][c % 4] = _mm512_fmadd_ps(wv[c], _mm512_loadu_ps(yb + 16 * c), acc[k][c % 4]);
        }
    }
    for (int k = 0; k < KT_FP8_TOKENS; k++)
        out[k] = lanes_sum(acc[k]);
}
void kt_gemm_fp8_b128_f32_avx512(int64_t n, const void *w, size_t row_bytes, int64_t n_rows, const void *a,
                                 size_t act_bytes, int64_t n_tok, float *y, int64_t y_stride)
{
    const uint8_t *wb = w, *ab = a;
    const int64_t nb = n / KT_QK_FP8;
    int64_t panel = (int64_t)(KT_FP8_PANEL_BYTES / (row_bytes ? row_bytes : 1));
    panel = panel < 1 ? 1 : panel;
    for (int64_t r0 = 0; r0 < n_rows; r0 += panel) {
        const int64_t r1 = min_i64(r0 + panel, n_rows);
        for (int64_t t = 0; t < n_tok; t += KT_FP8_TOKENS) {
            const int64_t nt = min_i64(KT_FP8_TOKENS, n_tok - t);
            const float *tok[KT_FP8_TOKENS]; /* a short group repeats its last token */
            for (int k = 0; k < KT_FP8_TOKENS; k++)
                tok[k] = (const float *)(const void *)(ab + (size_t)(t + min_i64(k, nt - 1)) * act_bytes);
            for (int64_t r = r0; r < r1; r++) {
                float out[KT_FP8_TOKENS];
                fp8_tile(nb, (const void *)(wb + (size_t)r * row_bytes), tok, out);
                for (int64_t k = 0; k < nt; k++)
                    y[(t + k) * y_stride + r] = out[k];
            }
        }
    }
}
