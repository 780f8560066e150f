/*
 * float_dot_finish.h - the last steps of vec_dot_float_avx2.c's sum, for
 * the float gemms (gemm_float_avx2.c, gemm_float_avx512.c) that run its 32
 * float lanes for several (row, token) pairs at once and must end exactly
 * as it does.
 *
 * vec_dot_float_avx2.c keeps 4 accumulators of 8 lanes: lane e of the 32
 * takes w[i+e]*a[i+e] by FMA for every full chunk of 32 (i = 0, 32, ...).
 * After them it adds the 8-element chunks into acc0 (FMA), reduces
 * (acc0+acc1)+(acc2+acc3) and that vector's 8 lanes in hsum_ps's order, and
 * adds the last n % 8 products one by one.  This must never change that
 * order or fuse a step vec_dot does not fuse (included only from files
 * built with -ffp-contract=off).
 */
#ifndef KT_FLOAT_DOT_FINISH_H
#define KT_FLOAT_DOT_FINISH_H

#include <math.h>
#include <stdint.h>
#include <string.h>

/* dot = finish of the 32 lanes (natural order: lane e took elements
 * 32c + e) over the n_tail elements after the last full chunk of 32, whose
 * weights are w_tail (already widened to float) and activations a_tail. */
static inline float float_dot_finish(const float lanes[32], const float *w_tail, const float *a_tail, int64_t n_tail)
{
    float acc[32];
    memcpy(acc, lanes, sizeof acc);
    int64_t i = 0;
    for (; i + 8 <= n_tail; i += 8)
        for (int l = 0; l < 8; l++)
            acc[l] = fmaf(w_tail[i + l], a_tail[i + l], acc[l]);
    float v[8];
    for (int l = 0; l < 8; l++)
        v[l] = (acc[l] + acc[8 + l]) + (acc[16 + l] + acc[24 + l]);
    /* hsum_ps: halves, then (s0 + s2) + (s1 + s3) */
    const float s0 = v[0] + v[4], s1 = v[1] + v[5], s2 = v[2] + v[6], s3 = v[3] + v[7];
    float sum = (s0 + s2) + (s1 + s3);
    for (; i < n_tail; i++)
        sum += w_tail[i] * a_tail[i];
    return sum;
}

#endif
