/*
 * vec_dot_native_avx2.c - AVX2 dot products of the native checkpoint formats:
 * GGUF MXFP4 against Q8_0 activations, kt's block FP8 (FP8_B128) against F32.
 *
 * MXFP4: the nibbles become doubled E2M1 integers through one byte shuffle,
 * the 32 products of a block are summed exactly in int32 like Q4_0's, and
 * each block adds (2^(e-128) * da) * (float)sumi to a scalar in block order:
 * bit for bit kt_vec_dot_mxfp4_q8_0_ref.
 *
 * FP8_B128: codes widen to F32 times 2^-120 with three integer ops
 * (simd_avx2.h, e4m3x8_scaled), one multiply by d * 2^120 makes each the
 * reference's e4m3(q) * d, and they are fused-multiply-added into the reference's 64
 * interleaved lanes (eight registers of 8), which are then halved pairwise
 * in its order: bit for bit kt_vec_dot_fp8_b128_f32_ref.  Never change the
 * lane of an element or the order of the halving, never read past n
 * elements; rows must hold no E4M3 NaN codes (refused at load).
 */
#include "cpu/avx2/kernels_avx2.h"
#include "cpu/avx2/simd_avx2.h"
#include "cpu/ref/vec_dot_ref.h"
#include "hf_formats.h"

void kt_vec_dot_mxfp4_q8_0_avx2(int64_t n, float *out, const void *w, const void *a)
{
    const struct kt_block_mxfp4 *x = w; /* (n/32) blocks */
    const struct kt_block_q8_0 *y = a;  /* (n/32) blocks */
    const int64_t nb = n / KT_QK;
    float sum = 0.0f;
    int64_t i = 0;
    for (; i + 4 <= nb; i += 4) {
        prefetch_ahead(&x[i], 4 * sizeof x[i]);
        __m256i s[4];
        for (int k = 0; k < 4; k++)
            s[k] = dot_i8_32(mxfp4_quants_32(x[i + k].qs), _mm256_loadu_si256((const __m256i *)y[i + k].qs));
        const __m128 dw = _mm_setr_ps(e8m0_half_f32(x[i].e), e8m0_half_f32(x[i + 1].e), e8m0_half_f32(x[i + 2].e),
                                      e8m0_half_f32(x[i + 3].e));
        const __m128 da = four_fp16(y[i].d, y[i + 1].d, y[i + 2].d, y[i + 3].d);
        const __m128 t = _mm_mul_ps(_mm_mul_ps(dw, da), _mm_cvtepi32_ps(hsum4_epi32(s[0], s[1], s[2], s[3])));
        sum = add_lanes_in_order(sum, t);
    }
    for (; i < nb; i++) {
        const __m256i aq = _mm256_loadu_si256((const __m256i *)y[i].qs);
        const int32_t sumi = hsum_epi32(dot_i8_32(mxfp4_quants_32(x[i].qs), aq));
        sum += e8m0_half_f32(x[i].e) * fp16_to_f32(y[i].d) * (float)sumi;
    }
    *out = sum;
}

/* The reference's halving of 64 lanes held as acc[0..7] (lanes 8k .. 8k+7). */
static inline float fp8_lanes_sum(__m256 acc[8])
{
    for (int k = 0; k < 4; k++) /* lane l += lane l + 32 */
        acc[k] = _mm256_add_ps(acc[k], acc[k + 4]);
    for (int k = 0; k < 2; k++) /* l += l + 16 */
        acc[k] = _mm256_add_ps(acc[k], acc[k + 2]);
    return hsum_ps(_mm256_add_ps(acc[0], acc[1])); /* l + 8, then hsum_ps: + 4, + 2, + 1 */
}

/* Block b into the lanes when |d| >= 2^8: each weight e4m3(q) * 2^-120 * 2^120
 * (exact) * d, rounded once as well. */
static inline void fp8_block_large_scale(const struct kt_block_fp8_b128 *b, const float *yb, __m256 acc[8])
{
    const __m256 d = _mm256_set1_ps(b->d);
    for (int h = 0; h < 2; h++)
        for (int k = 0; k < 8; k++) {
            const __m256 v = _mm256_mul_ps(e4m3x8_scaled(b->q + 64 * h + 8 * k), _mm256_set1_ps(0x1p120f));
            acc[k] = _mm256_fmadd_ps(_mm256_mul_ps(v, d), _mm256_loadu_ps(yb + 64 * h + 8 * k), acc[k]);
        }
}

void kt_vec_dot_fp8_b128_f32_avx2(int64_t n, float *out, const void *w, const void *a)
{
    const struct kt_block_fp8_b128 *x = w; /* (n/128) blocks */
    const float *y = a;                    /* (n) */
    __m256 acc[8];
    for (int k = 0; k < 8; k++)
        acc[k] = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / KT_QK_FP8; i++) {
        prefetch_ahead(&x[i], sizeof x[i]);
        const float *yb = y + i * KT_QK_FP8;
        float d120;
        if (!fp8_scale_2p120(x[i].d, &d120)) {
            fp8_block_large_scale(&x[i], yb, acc);
            continue;
        }
        const __m256 m = _mm256_set1_ps(d120);
        for (int h = 0; h < 2; h++) /* elements 64h .. 64h+63: lanes 0..63 */
            for (int k = 0; k < 8; k++)
                acc[k] = _mm256_fmadd_ps(_mm256_mul_ps(e4m3x8_scaled(x[i].q + 64 * h + 8 * k), m),
                                         _mm256_loadu_ps(yb + 64 * h + 8 * k), acc[k]);
    }
    *out = fp8_lanes_sum(acc);
}
