/*
 * float_dot_finish.h - the last steps of vec_dot_float_avx2.c's sum, for
 * the float gemms (gemm_float_avx2.c, gemm_float_avx512.c) that run its 32
 * float lanes for several (row, token) pairs at once and must end exactly
 * as it does.
 *
 * vec_dot_float_avx2.c keeps 4 accumulators of 8 lanes: lane e of acc_j
 * takes w[i+8j+e]*a[i+8j+e] by FMA for every full chunk of 32 (i = 0, 32,
 * ...).  After them it adds the 8-element chunks into acc0 (FMA), reduces
 * (acc0+acc1)+(acc2+acc3) with hsum_ps, and adds the last n % 8 products
 * one by one.  This is that code, step for step; it must never change the
 * order or fuse a step vec_dot does not fuse (included only from files
 * built with -mavx2 -mfma -ffp-contract=off).
 */
#ifndef KT_FLOAT_DOT_FINISH_H
#define KT_FLOAT_DOT_FINISH_H

#include "cpu/avx2/simd_avx2.h"

/* dot = the finish of acc0..acc3 over the n_tail elements after the last
 * full chunk of 32, whose weights are w_tail (already widened to float) and
 * activations a_tail. */
static inline float float_dot_finish(__m256 acc0, __m256 acc1, __m256 acc2, __m256 acc3, const float *w_tail,
                                     const float *a_tail, int64_t n_tail)
{
    int64_t i = 0;
    for (; i + 8 <= n_tail; i += 8)
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(w_tail + i), _mm256_loadu_ps(a_tail + i), acc0);
    float sum = hsum_ps(_mm256_add_ps(_mm256_add_ps(acc0, acc1), _mm256_add_ps(acc2, acc3)));
    for (; i < n_tail; i++)
        sum += w_tail[i] * a_tail[i];
    return sum;
}

#endif
