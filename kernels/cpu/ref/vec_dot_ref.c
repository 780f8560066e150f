/*
 * vec_dot_ref.c - scalar reference dot products: the definition of what every
 * CPU kernel of kt computes for one row of weights against one activation row.
 *
 * Read this to learn the formats: each function unpacks a block into plain
 * integers (quant.h's kt_unpack_*), sums integer products exactly, and applies
 * the block's float scales once per block or sub-block, like llama.cpp's
 * generic kernels.  These must never be optimized at the cost of clarity and
 * must never read outside n elements; faster kernels are tested against them.
 */
#include "vec_dot_ref.h"

#include "quant.h"
#include "hf_formats.h"

#include <math.h>

/* ---- plain floats ------------------------------------------------------------ */
/* Weights F32 / F16 / BF16, activations F32; summed in double. */

void kt_vec_dot_f32_f32_ref(int64_t n, float *out, const void *w, const void *a)
{
    const float *x = w; /* (n) */
    const float *y = a; /* (n) */
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++)
        sum += (double)x[i] * y[i];
    *out = (float)sum;
}

void kt_vec_dot_f16_f32_ref(int64_t n, float *out, const void *w, const void *a)
{
    const kt_fp16 *x = w; /* (n) */
    const float *y = a;   /* (n) */
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++)
        sum += (double)kt_fp16_to_fp32(x[i]) * y[i];
    *out = (float)sum;
}

void kt_vec_dot_bf16_f32_ref(int64_t n, float *out, const void *w, const void *a)
{
    const kt_bf16 *x = w; /* (n) */
    const float *y = a;   /* (n) */
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++)
        sum += (double)kt_bf16_to_fp32(x[i]) * y[i];
    *out = (float)sum;
}

/* ---- legacy blocks · Q8_0 ---------------------------------------------------- */
/* Per block of 32: w = dw*qw, a = da*qa  =>  dot = dw*da * sum(qw*qa). */

void kt_vec_dot_q8_0_q8_0_ref(int64_t n, float *out, const void *w, const void *a)
{
    const struct kt_block_q8_0 *x = w; /* (n/32) blocks */
    const struct kt_block_q8_0 *y = a; /* (n/32) blocks */
    float sum = 0.0f;
    for (int64_t i = 0; i < n / KT_QK; i++) {
        int32_t sumi = 0;
        for (int j = 0; j < KT_QK; j++)
            sumi += x[i].qs[j] * y[i].qs[j];
        sum += kt_fp16_to_fp32(x[i].d) * kt_fp16_to_fp32(y[i].d) * (float)sumi;
    }
    *out = sum;
}

/* Q4_0: qw = nibble - 8 in [-8, 7]. */
void kt_vec_dot_q4_0_q8_0_ref(int64_t n, float *out, const void *w, const void *a)
{
    const struct kt_block_q4_0 *x = w;
    const struct kt_block_q8_0 *y = a;
    float sum = 0.0f;
    for (int64_t i = 0; i < n / KT_QK; i++) {
        int8_t q[KT_QK];
        kt_unpack_q4_0(&x[i], q);
        int32_t sumi = 0;
        for (int j = 0; j < KT_QK; j++)
            sumi += q[j] * y[i].qs[j];
        sum += kt_fp16_to_fp32(x[i].d) * kt_fp16_to_fp32(y[i].d) * (float)sumi;
    }
    *out = sum;
}

/* Q5_0: qw = 5-bit value - 16 in [-16, 15]. */
void kt_vec_dot_q5_0_q8_0_ref(int64_t n, float *out, const void *w, const void *a)
{
    const struct kt_block_q5_0 *x = w;
    const struct kt_block_q8_0 *y = a;
    float sum = 0.0f;
    for (int64_t i = 0; i < n / KT_QK; i++) {
        int8_t q[KT_QK];
        kt_unpack_q5_0(&x[i], q);
        int32_t sumi = 0;
        for (int j = 0; j < KT_QK; j++)
            sumi += q[j] * y[i].qs[j];
        sum += kt_fp16_to_fp32(x[i].d) * kt_fp16_to_fp32(y[i].d) * (float)sumi;
    }
    *out = sum;
}

/* ---- legacy blocks with a min · Q8_1 ----------------------------------------- */
/* w = dw*qw + mw, a = da*qa:  dot = dw*da*sum(qw*qa) + mw*(da*sum(qa)),
 * and Q8_1 carries s = da*sum(qa) (as fp16), so the min term costs nothing. */

void kt_vec_dot_q4_1_q8_1_ref(int64_t n, float *out, const void *w, const void *a)
{
    const struct kt_block_q4_1 *x = w;
    const struct kt_block_q8_1 *y = a;
    float sum = 0.0f;
    for (int64_t i = 0; i < n / KT_QK; i++) {
        uint8_t q[KT_QK];
        kt_unpack_q4_1(&x[i], q);
        int32_t sumi = 0;
        for (int j = 0; j < KT_QK; j++)
            sumi += q[j] * y[i].qs[j];
        sum += kt_fp16_to_fp32(x[i].d) * kt_fp16_to_fp32(y[i].d) * (float)sumi
             + kt_fp16_to_fp32(x[i].m) * kt_fp16_to_fp32(y[i].s);
    }
    *out = sum;
}

void kt_vec_dot_q5_1_q8_1_ref(int64_t n, float *out, const void *w, const void *a)
{
    const struct kt_block_q5_1 *x = w;
    const struct kt_block_q8_1 *y = a;
    float sum = 0.0f;
    for (int64_t i = 0; i < n / KT_QK; i++) {
        uint8_t q[KT_QK];
        kt_unpack_q5_1(&x[i], q);
        int32_t sumi = 0;
        for (int j = 0; j < KT_QK; j++)
            sumi += q[j] * y[i].qs[j];
        sum += kt_fp16_to_fp32(x[i].d) * kt_fp16_to_fp32(y[i].d) * (float)sumi
             + kt_fp16_to_fp32(x[i].m) * kt_fp16_to_fp32(y[i].s);
    }
    *out = sum;
}

/* ---- K-quants · Q8_K --------------------------------------------------------- */
/*
 * Q4_K / Q5_K super-block of 256 = 8 sub-blocks j of 32:
 *   w = d*sc_j*q - dmin*m_j,  a = da*qa
 *   dot = d*da * sum_j sc_j * sum_{l in j} q*qa  -  dmin*da * sum_j m_j * sum_{l in j} qa
 * and sum_{l in j} qa is bsums[2j] + bsums[2j+1] (Q8_K sums groups of 16).
 */
static float k_asym_dot(float d, float dmin, const uint8_t q[KT_QK_K], const uint8_t sc[8],
                        const uint8_t m[8], const struct kt_block_q8_K *y)
{
    int32_t sum_q = 0, sum_m = 0;
    for (int j = 0; j < 8; j++) {
        int32_t s = 0;
        for (int l = 0; l < 32; l++)
            s += q[32 * j + l] * y->qs[32 * j + l];
        sum_q += sc[j] * s;
        sum_m += m[j] * (y->bsums[2 * j] + y->bsums[2 * j + 1]);
    }
    return d * y->d * (float)sum_q - dmin * y->d * (float)sum_m;
}

void kt_vec_dot_q4_K_q8_K_ref(int64_t n, float *out, const void *w, const void *a)
{
    const struct kt_block_q4_K *x = w; /* (n/256) super-blocks */
    const struct kt_block_q8_K *y = a; /* (n/256) super-blocks */
    float sum = 0.0f;
    for (int64_t i = 0; i < n / KT_QK_K; i++) {
        uint8_t q[KT_QK_K], sc[8], m[8];
        kt_unpack_q4_K(&x[i], q, sc, m);
        sum += k_asym_dot(kt_fp16_to_fp32(x[i].d), kt_fp16_to_fp32(x[i].dmin), q, sc, m, &y[i]);
    }
    *out = sum;
}

void kt_vec_dot_q5_K_q8_K_ref(int64_t n, float *out, const void *w, const void *a)
{
    const struct kt_block_q5_K *x = w;
    const struct kt_block_q8_K *y = a;
    float sum = 0.0f;
    for (int64_t i = 0; i < n / KT_QK_K; i++) {
        uint8_t q[KT_QK_K], sc[8], m[8];
        kt_unpack_q5_K(&x[i], q, sc, m);
        sum += k_asym_dot(kt_fp16_to_fp32(x[i].d), kt_fp16_to_fp32(x[i].dmin), q, sc, m, &y[i]);
    }
    *out = sum;
}

/*
 * Q6_K super-block of 256 = 16 groups g of 16, signed int8 scale per group:
 *   w = d*scales_g*(q-32),  dot = d*da * sum_g scales_g * sum_{l in g} (q-32)*qa
 */
void kt_vec_dot_q6_K_q8_K_ref(int64_t n, float *out, const void *w, const void *a)
{
    const struct kt_block_q6_K *x = w;
    const struct kt_block_q8_K *y = a;
    float sum = 0.0f;
    for (int64_t i = 0; i < n / KT_QK_K; i++) {
        int8_t q[KT_QK_K];
        kt_unpack_q6_K(&x[i], q);
        int32_t sumi = 0;
        for (int g = 0; g < 16; g++) {
            int32_t s = 0;
            for (int l = 0; l < 16; l++)
                s += q[16 * g + l] * y[i].qs[16 * g + l];
            sumi += x[i].scales[g] * s;
        }
        sum += kt_fp16_to_fp32(x[i].d) * y[i].d * (float)sumi;
    }
    *out = sum;
}

/* ---- native formats ---------------------------------------------------------- */

/*
 * MXFP4 · Q8_0.  Per block of 32: w = 2^(e-128) * qw with qw = 2 * e2m1 an
 * integer in [-12, 12], a = da*qa, so dot = (2^(e-128) * da) * sum(qw*qa),
 * the integer sum exact, like Q4_0's.  2^(e-128) is exact for every e
 * (kt_e8m0_half_to_f32: 0 and 1 are F32 subnormals, 255 is 2^127 as ggml
 * reads it, not NaN); the product with da is one rounding, exact unless it
 * leaves F32's normal range (e near 0 or 255 only: subnormal or inf, as
 * to_float's values would be).
 */
void kt_vec_dot_mxfp4_q8_0_ref(int64_t n, float *out, const void *w, const void *a)
{
    const struct kt_block_mxfp4 *x = w; /* (n/32) blocks */
    const struct kt_block_q8_0 *y = a;  /* (n/32) blocks */
    float sum = 0.0f;
    for (int64_t i = 0; i < n / KT_QK; i++) {
        int8_t q[KT_QK];
        kt_unpack_mxfp4(&x[i], q);
        int32_t sumi = 0;
        for (int j = 0; j < KT_QK; j++)
            sumi += q[j] * y[i].qs[j];
        sum += kt_e8m0_half_to_f32(x[i].e) * kt_fp16_to_fp32(y[i].d) * (float)sumi;
    }
    *out = sum;
}

/*
 * FP8_B128 · F32.  Each weight is to_float's value e4m3(q) * d (one multiply),
 * and element i is fused-multiply-added into partial sum i % KT_FP8_LANES in
 * element order; the 64 partial sums are then halved pairwise (lane l takes
 * lane l + 32, then l + 16, ... l + 1).  A SIMD level keeps those 64 lanes in
 * registers, so it reproduces this bit for bit.  Against the exact dot the
 * error is that of float summation: at most about (n/64 + 6) * 2^-24 *
 * sum |w*a|.  Rows must hold no NaN codes (kt_fp8_b128_check_row).
 */
void kt_vec_dot_fp8_b128_f32_ref(int64_t n, float *out, const void *w, const void *a)
{
    const struct kt_block_fp8_b128 *x = w; /* (n/128) blocks */
    const float *y = a;                    /* (n) */
    float lane[KT_FP8_LANES] = {0};
    for (int64_t i = 0; i < n; i++) {
        const struct kt_block_fp8_b128 *b = &x[i / KT_QK_FP8];
        const float wi = kt_fp8_e4m3_to_f32(b->q[i % KT_QK_FP8]) * b->d;
        lane[i % KT_FP8_LANES] = fmaf(wi, y[i], lane[i % KT_FP8_LANES]);
    }
    for (int half = KT_FP8_LANES / 2; half >= 1; half /= 2)
        for (int l = 0; l < half; l++)
            lane[l] = lane[l] + lane[l + half];
    *out = lane[0];
}
