/*
 * ops.c - scalar reference ops of the deepseek2 forward pass (see ops.h).
 *
 * Each function is the formula it names, in plain loops, so a reader learns
 * the model from here.  Nothing here allocates, prints, or knows about
 * models, files or threads; it must never grow SIMD or special cases that
 * hide the math (faster kernels live beside it and are tested against it).
 */
#include "ops.h"

#include <math.h>
#include <strings.h>

#include "quant.h"

#define KT_PI 3.14159265358979323846

/* ---- norms and activations --------------------------------------------------- */

void kt_rmsnorm(float *y, const float *x, const float *w, int64_t n, float eps)
{
    double sum_sq = 0.0;
    for (int64_t i = 0; i < n; i++)
        sum_sq += (double)x[i] * x[i];
    const float scale = (float)(1.0 / sqrt(sum_sq / (double)n + eps));
    for (int64_t i = 0; i < n; i++)
        y[i] = x[i] * scale * w[i];
}

void kt_softmax(float *x, int64_t n)
{
    float max = -INFINITY;
    for (int64_t i = 0; i < n; i++)
        if (x[i] > max)
            max = x[i];
    if (max == -INFINITY) { /* everything masked: attend to nothing */
        for (int64_t i = 0; i < n; i++)
            x[i] = 0.0f;
        return;
    }
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++) {
        x[i] = expf(x[i] - max); /* exp(-inf) = 0: masked entries drop out */
        sum += x[i];
    }
    const float inv = (float)(1.0 / sum);
    for (int64_t i = 0; i < n; i++)
        x[i] *= inv;
}

float kt_sigmoid(float x)
{
    return 1.0f / (1.0f + expf(-x));
}

float kt_silu(float x)
{
    return x / (1.0f + expf(-x));
}

void kt_swiglu(float *out, const float *gate, const float *up, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        out[i] = kt_silu(gate[i]) * up[i];
}

/* ---- small vector helpers ------------------------------------------------------ */

float kt_dot_f32(const float *a, const float *b, int64_t n)
{
    /* Eight interleaved partial sums: the same products, summed in an order
     * the compiler may keep in vector registers (one running sum may not). */
    float part[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++)
            part[j] += a[i + j] * b[i + j];
    float sum = 0.0f;
    for (; i < n; i++)
        sum += a[i] * b[i];
    for (int j = 0; j < 8; j++)
        sum += part[j];
    return sum;
}

void kt_axpy_f32(float *y, float a, const float *x, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        y[i] += a * x[i];
}

void kt_dot_rows_f32(const float *x, const float *const *rows, int64_t n_rows, int64_t n, float scale, float *out,
                     int64_t out_stride)
{
    for (int64_t t = 0; t < n_rows; t++)
        out[t * out_stride] = scale * kt_dot_f32(x, rows[t], n);
}

/* ---- attention's cached rows: F32, BF16 or F16 ------------------------------------- */

size_t kt_row_type_size(enum kt_row_type t)
{
    return t == KT_ROW_F32 ? sizeof(float) : sizeof(uint16_t);
}

const char *kt_row_type_name(enum kt_row_type t)
{
    return t == KT_ROW_BF16 ? "bf16" : t == KT_ROW_F16 ? "f16" : "f32";
}

bool kt_row_type_parse(const char *name, enum kt_row_type *out)
{
    for (int t = 0; name && t < KT_ROW_TYPE_COUNT; t++)
        if (strcasecmp(name, kt_row_type_name((enum kt_row_type)t)) == 0) {
            *out = (enum kt_row_type)t;
            return true;
        }
    return false;
}

void kt_row_from_f32(enum kt_row_type t, void *dst, const float *src, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        if (t == KT_ROW_BF16)
            ((kt_bf16 *)dst)[i] = kt_fp32_to_bf16(src[i]);
        else if (t == KT_ROW_F16)
            ((kt_fp16 *)dst)[i] = kt_fp32_to_fp16(src[i]);
        else
            ((float *)dst)[i] = src[i];
    }
}

/* Element i of a row of t, widened to float. */
static float row_elem(enum kt_row_type t, const void *row, int64_t i)
{
    return t == KT_ROW_BF16  ? kt_bf16_to_fp32(((const kt_bf16 *)row)[i])
           : t == KT_ROW_F16 ? kt_fp16_to_fp32(((const kt_fp16 *)row)[i])
                             : ((const float *)row)[i];
}

void kt_row_to_f32(enum kt_row_type t, float *dst, const void *src, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        dst[i] = row_elem(t, src, i);
}

const void *kt_row_at(enum kt_row_type t, const void *row, int64_t i)
{
    return (const uint8_t *)row + (size_t)i * kt_row_type_size(t);
}

/* kt_dot_f32's sum with b widened element by element. */
static float dot_typed(enum kt_row_type t, const float *a, const void *b, int64_t n)
{
    float part[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++)
            part[j] += a[i + j] * row_elem(t, b, i + j);
    float sum = 0.0f;
    for (; i < n; i++)
        sum += a[i] * row_elem(t, b, i);
    for (int j = 0; j < 8; j++)
        sum += part[j];
    return sum;
}

void kt_dot_rows_typed(enum kt_row_type t, const float *x, const void *const *rows, int64_t n_rows, int64_t n,
                       float scale, float *out, int64_t out_stride)
{
    for (int64_t r = 0; r < n_rows; r++)
        out[r * out_stride] = scale * dot_typed(t, x, rows[r], n);
}

void kt_axpy_typed(enum kt_row_type t, float *y, float a, const void *x, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        y[i] += a * row_elem(t, x, i);
}

void kt_dot_rows_multi_typed(enum kt_row_type t, const float *x, int64_t x_stride, int64_t n_x,
                             const void *const *rows, int64_t n_rows, int64_t n, float scale, float *out,
                             int64_t out_stride)
{
    for (int64_t q = 0; q < n_x; q++)
        kt_dot_rows_typed(t, x + q * x_stride, rows, n_rows, n, scale, out + q * out_stride, 1);
}

void kt_axpy_rows_typed(enum kt_row_type t, float *y, int64_t y_stride, int64_t n_y, const float *a, int64_t a_stride,
                        const void *const *rows, int64_t n_rows, int64_t n)
{
    for (int64_t g = 0; g < n_y; g++)
        for (int64_t r = 0; r < n_rows; r++)
            kt_axpy_typed(t, y + g * y_stride, a[g * a_stride + r], rows[r], n);
}

/* ---- RoPE with YaRN ---------------------------------------------------------------- */

/* YaRN's correction dimension: the (fractional) pair index whose wavelength
 * turns beta times over the original context, C(β) = R ln(n_orig / (2π β)) / (2 ln b). */
static double yarn_corr_dim(double n_dims, double n_orig, double beta, double base)
{
    return n_dims * log(n_orig / (beta * 2.0 * KT_PI)) / (2.0 * log(base));
}

bool kt_rope_init(struct kt_rope *r, const struct kt_rope_params *p)
{
    if (p->n_dims == 0 || p->n_dims % 2 != 0 || p->n_dims > KT_ROPE_MAX_DIMS || !(p->freq_base > 0.0) ||
        !(p->factor > 0.0))
        return false;
    const double R = p->n_dims, s = p->factor;
    r->n_dims = p->n_dims;
    r->magnitude = p->magnitude;
    r->ramp_lo = r->ramp_hi = 0.0;
    if (p->mode == KT_ROPE_YARN) {
        r->ramp_lo = fmax(0.0, floor(yarn_corr_dim(R, p->orig_ctx, p->beta_fast, p->freq_base)));
        r->ramp_hi = fmin(R - 1.0, ceil(yarn_corr_dim(R, p->orig_ctx, p->beta_slow, p->freq_base)));
    }
    for (uint32_t i = 0; i < p->n_dims / 2; i++) {
        double inv_extrapolated = pow(p->freq_base, -2.0 * i / R); /* the trained frequency */
        double inv_interpolated = inv_extrapolated / s;            /* stretched s times */
        double gamma = 0.0;                                        /* 1: keep trained, 0: stretch */
        if (p->mode == KT_ROPE_YARN) {
            double t = (i - r->ramp_lo) / fmax(0.001, r->ramp_hi - r->ramp_lo);
            gamma = 1.0 - fmin(1.0, fmax(0.0, t));
        }
        r->inv_freq[i] = inv_interpolated * (1.0 - gamma) + inv_extrapolated * gamma;
    }
    return true;
}

void kt_rope_angles(const struct kt_rope *r, uint32_t pos, float *cos_sin)
{
    for (uint32_t i = 0; i < r->n_dims / 2; i++) {
        double theta = (double)pos * r->inv_freq[i];
        cos_sin[2 * i] = (float)(r->magnitude * cos(theta));
        cos_sin[2 * i + 1] = (float)(r->magnitude * sin(theta));
    }
}

void kt_rope_apply(float *x, const float *cos_sin, uint32_t n_dims)
{
    for (uint32_t i = 0; i < n_dims; i += 2) {
        const float c = cos_sin[i], s = cos_sin[i + 1];
        const float x0 = x[i], x1 = x[i + 1];
        x[i] = x0 * c - x1 * s;
        x[i + 1] = x0 * s + x1 * c;
    }
}

/* ---- attention ------------------------------------------------------------------- */

void kt_attention_head(float *out, const float *q, const float *const *k, const float *const *v, int64_t n_kv,
                       int64_t dk, int64_t dv, float scale, float *scores)
{
    for (int64_t t = 0; t < n_kv; t++)
        scores[t] = scale * kt_dot_f32(q, k[t], dk);
    kt_softmax(scores, n_kv);
    for (int64_t j = 0; j < dv; j++)
        out[j] = 0.0f;
    for (int64_t t = 0; t < n_kv; t++)
        kt_axpy_f32(out, scores[t], v[t], dv);
}
