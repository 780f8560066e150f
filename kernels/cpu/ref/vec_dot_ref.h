/*
 * vec_dot_ref.h - scalar reference dot products, one per (weight type,
 * activation type) pair that kt computes with.
 *
 * Each has the kt_vec_dot_fn shape: *out = dot(w, a) over n elements, w of the
 * weight type, a of that type's vec_dot_type (quant.h), n a multiple of the
 * block size.  These are the definition the SIMD kernels are tested against;
 * they must never trade clarity for speed.
 */
#ifndef KT_VEC_DOT_REF_H
#define KT_VEC_DOT_REF_H

#include <stdint.h>

/* plain floats: activations stay F32 */
void kt_vec_dot_f32_f32_ref(int64_t n, float *out, const void *w, const void *a);
void kt_vec_dot_f16_f32_ref(int64_t n, float *out, const void *w, const void *a);
void kt_vec_dot_bf16_f32_ref(int64_t n, float *out, const void *w, const void *a);

/* legacy 32-element blocks against 8-bit activations */
void kt_vec_dot_q8_0_q8_0_ref(int64_t n, float *out, const void *w, const void *a);
void kt_vec_dot_q4_0_q8_0_ref(int64_t n, float *out, const void *w, const void *a);
void kt_vec_dot_q5_0_q8_0_ref(int64_t n, float *out, const void *w, const void *a);
void kt_vec_dot_q4_1_q8_1_ref(int64_t n, float *out, const void *w, const void *a);
void kt_vec_dot_q5_1_q8_1_ref(int64_t n, float *out, const void *w, const void *a);

/* K-quant 256-element super-blocks against Q8_K */
void kt_vec_dot_q4_K_q8_K_ref(int64_t n, float *out, const void *w, const void *a);
void kt_vec_dot_q5_K_q8_K_ref(int64_t n, float *out, const void *w, const void *a);
void kt_vec_dot_q6_K_q8_K_ref(int64_t n, float *out, const void *w, const void *a);

/* native formats: GGUF MXFP4 against Q8_0; kt's block FP8 against F32 in
 * KT_FP8_LANES interleaved partial sums (the order every SIMD level keeps) */
#define KT_FP8_LANES 64
void kt_vec_dot_mxfp4_q8_0_ref(int64_t n, float *out, const void *w, const void *a);
void kt_vec_dot_fp8_b128_f32_ref(int64_t n, float *out, const void *w, const void *a);

#endif
