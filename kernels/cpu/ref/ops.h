/*
 * ops.h - the scalar reference ops of a deepseek2 forward pass, written to be
 * read: RMSNorm, softmax, SiLU/SwiGLU, RoPE with YaRN (adjacent-pair, GPT-J
 * mode) and one attention head.  Each function is the formula of
 * docs/deepseek2.md in plain loops; tests compare them with the
 * formulas evaluated in double.
 *
 * These never allocate, never print, and never read past the lengths they
 * are given.  Faster kernels may replace them; they must never trade clarity
 * for speed.  Like everything under kernels/, this depends on nothing of kt's.
 */
#ifndef KT_OPS_H
#define KT_OPS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- norms and activations --------------------------------------------------- */

/* y = x / sqrt(mean(x^2) + eps) * w over n values (y may alias x).  The sum of
 * squares is accumulated in double, as ggml does. */
void kt_rmsnorm(float *y, const float *x, const float *w, int64_t n, float eps);

/* x = softmax(x) in place.  -inf entries (masked) become exactly 0; a row
 * that is entirely -inf has nothing to attend to and becomes all 0 (never NaN). */
void kt_softmax(float *x, int64_t n);

float kt_sigmoid(float x);                   /* 1 / (1 + e^-x) */
float kt_silu(float x);                      /* x * sigmoid(x) */

/* out[i] = silu(gate[i]) * up[i]: the SwiGLU activation (out may alias either). */
void kt_swiglu(float *out, const float *gate, const float *up, int64_t n);

/* ---- small vector helpers ------------------------------------------------------ */

float kt_dot_f32(const float *a, const float *b, int64_t n); /* sum a[i] b[i], in eight interleaved partial sums */
void kt_axpy_f32(float *y, float a, const float *x, int64_t n); /* y += a x */
/* out[t * out_stride] = scale * kt_dot_f32(x, rows[t], n), t < n_rows: attention's scores. */
void kt_dot_rows_f32(const float *x, const float *const *rows, int64_t n_rows, int64_t n, float scale, float *out,
                     int64_t out_stride);

/* ---- attention's cached rows: F32, BF16 or F16 ------------------------------------- */

/* The element type of the latent KV cache's rows.  BF16 and F16 widen to
 * float exactly, so the row ops below on such rows are bit for bit the F32
 * ops on the widened rows; only the store (kt_row_from_f32) rounds. */
enum kt_row_type { KT_ROW_F32 = 0, KT_ROW_BF16 = 1, KT_ROW_F16 = 2, KT_ROW_TYPE_COUNT };

size_t kt_row_type_size(enum kt_row_type t);      /* bytes per element: 4, 2, 2 */
const char *kt_row_type_name(enum kt_row_type t); /* "f32", "bf16", "f16" */
/* "f32", "bf16", "f16" (any case) -> *out; false for anything else. */
bool kt_row_type_parse(const char *name, enum kt_row_type *out);

/* dst (n elements of t) = src rounded to nearest even (F32: copied). */
void kt_row_from_f32(enum kt_row_type t, void *dst, const float *src, int64_t n);
/* dst (n floats) = src (n elements of t), exact. */
void kt_row_to_f32(enum kt_row_type t, float *dst, const void *src, int64_t n);
/* Element i of a row of t. */
const void *kt_row_at(enum kt_row_type t, const void *row, int64_t i);

/* kt_dot_rows_f32 and kt_axpy_f32 on rows of type t (each element widened first). */
void kt_dot_rows_typed(enum kt_row_type t, const float *x, const void *const *rows, int64_t n_rows, int64_t n,
                       float scale, float *out, int64_t out_stride);
void kt_axpy_typed(enum kt_row_type t, float *y, float a, const void *x, int64_t n);
/* Several queries against the same rows, and several outputs over the same
 * rows: attention's heads of one token over one key block.
 *   out[q * out_stride + r] = scale * dot(x + q * x_stride, rows[r], n)   for q < n_x, r < n_rows
 *   y_g += a[g * a_stride + r] * rows[r], r = 0, 1, .. in turn           for g < n_y, y_g = y + g * y_stride
 * (kt_dot_rows_typed per query; kt_axpy_typed once per row, in row order). */
void kt_dot_rows_multi_typed(enum kt_row_type t, const float *x, int64_t x_stride, int64_t n_x,
                             const void *const *rows, int64_t n_rows, int64_t n, float scale, float *out,
                             int64_t out_stride);
void kt_axpy_rows_typed(enum kt_row_type t, float *y, int64_t y_stride, int64_t n_y, const float *a, int64_t a_stride,
                        const void *const *rows, int64_t n_rows, int64_t n);

/* ---- RoPE with YaRN ---------------------------------------------------------------- */

#define KT_ROPE_MAX_DIMS 512

enum kt_rope_mode {
    KT_ROPE_PLAIN = 0, /* θ_i = p b^(-2i/R) / s (s = 1: no scaling; s > 1: linear) */
    KT_ROPE_YARN = 1,  /* per-pair blend of extrapolated and interpolated θ (§4.3) */
};

struct kt_rope_params {
    uint32_t n_dims;      /* R: rotated dims (qk_rope_head_dim), even */
    double freq_base;     /* b */
    double factor;        /* s = 1 / freq_scale; 1 for none */
    enum kt_rope_mode mode;
    uint32_t orig_ctx;    /* n_orig: YaRN's original context length */
    double beta_fast;     /* YaRN ramp bounds (the file's; DeepSeek default 32 / 1) */
    double beta_slow;
    double magnitude;     /* M: cos and sin are multiplied by it (1 for every model kt knows) */
};

/* Precomputed per-pair inverse frequencies: θ_i(p) = p * inv_freq[i]. */
struct kt_rope {
    uint32_t n_dims;
    double magnitude;
    double ramp_lo, ramp_hi;  /* YaRN: pairs i <= lo extrapolate, i >= hi interpolate (0, 0 if plain) */
    double inv_freq[KT_ROPE_MAX_DIMS / 2];
};

/* false if n_dims is 0, odd or above KT_ROPE_MAX_DIMS, or base/factor are not positive. */
bool kt_rope_init(struct kt_rope *r, const struct kt_rope_params *p);

/* cos_sin[2i] = M cos θ_i(pos), cos_sin[2i+1] = M sin θ_i(pos)   (n_dims) */
void kt_rope_angles(const struct kt_rope *r, uint32_t pos, float *cos_sin);

/* Rotates adjacent pairs of x (n_dims) by the angles kt_rope_angles gave:
 * x'[2i] = x[2i] c - x[2i+1] s,  x'[2i+1] = x[2i] s + x[2i+1] c. */
void kt_rope_apply(float *x, const float *cos_sin, uint32_t n_dims);

/* ---- attention ------------------------------------------------------------------- */

/*
 * One attention head over n_kv positions:
 *     s_t = scale * (q . k[t])          t < n_kv
 *     p   = softmax(s)
 *     out = sum_t p_t v[t]
 * q (dk), k[t] (dk), v[t] (dv), out (dv), scores (n_kv) scratch.  Rows are
 * given by pointer so keys may live in paged cache blocks, and k[t] and v[t]
 * may alias (MLA's value is the first kv_lora_rank values of its key row).
 * Causal masking is the caller's choice of n_kv.
 */
void kt_attention_head(float *out, const float *q, const float *const *k, const float *const *v, int64_t n_kv,
                       int64_t dk, int64_t dv, float scale, float *scores);

#ifdef __cplusplus
}
#endif

#endif
