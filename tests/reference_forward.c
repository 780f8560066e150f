/*
 * reference_forward.c - the deepseek2 forward pass, naively, in double.
 *
 * Read it top to bottom like llama2.c's run.c: small math helpers, then one
 * function per block of the model, then ref_forward, which strings them
 * together.  Each block cites the section of docs/deepseek2.md it follows.
 *
 * Notation (docs/deepseek2.md "Hyperparameters"): E hidden size, H heads,
 * qr q-LoRA rank, kvr KV latent rank, dn/dr/dv the no-RoPE, RoPE and value
 * head dims (dk = dn + dr), F dense FFN width, f expert width, Ne experts,
 * k experts used, Ns shared experts, V vocabulary, n tokens.
 *
 * Weights are dequantized to float and kept in GGUF order: a matrix with
 * ne = {in, out} is `out` rows of `in` values, so y[o] = sum_i W[o*in + i] x[i].
 */
#include "reference_forward.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "quant.h"

/* ---- helpers ------------------------------------------------------------------------------ */

float *ref_dequantize(const struct kt_gguf_tensor *t)
{
    int64_t n = t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3];
    float *out = malloc((size_t)n * sizeof *out);
    kt_type_traits(t->type)->to_float(t->data, out, n);
    return out;
}

/* A stacked expert tensor {cols, rows, Ne} dequantized, expert by expert
 * through kt_model_read_expert when the model streams its experts (a
 * checkpoint directory), else in place. */
static float *ref_dequantize_experts(const struct kt_model *m, const struct kt_gguf_tensor *t)
{
    if (!kt_model_experts_streamed(m))
        return ref_dequantize(t);
    const int64_t per = t->ne[0] * t->ne[1], slab = (int64_t)(t->nbytes / (uint64_t)t->ne[2]);
    float *out = malloc((size_t)(per * t->ne[2]) * sizeof *out);
    uint8_t *buf = malloc((size_t)slab);
    kt_err err = {0};
    for (int64_t x = 0; out && buf && x < t->ne[2]; x++) {
        if (kt_model_read_expert(m, t, (uint32_t)x, buf, &err) != KT_OK) {
            fprintf(stderr, "reference forward: %s\n", err.msg);
            abort();
        }
        kt_type_traits(t->type)->to_float(buf, out + x * per, per);
    }
    free(buf);
    return out;
}

/* y (rows) = W (rows, cols) x (cols) */
static void matvec(double *y, const float *W, const double *x, int64_t rows, int64_t cols)
{
    for (int64_t o = 0; o < rows; o++) {
        double s = 0.0;
        for (int64_t i = 0; i < cols; i++)
            s += (double)W[o * cols + i] * x[i];
        y[o] = s;
    }
}

static double silu(double x)
{
    return x / (1.0 + exp(-x));
}

/* ---- RMSNorm (docs/deepseek2.md "RMSNorm") ------------------------------------------------- */

/* y (n) = x / sqrt(mean(x^2) + eps) * w; y may be x. */
static void rmsnorm(double *y, const double *x, const float *w, int64_t n, double eps)
{
    double ss = 0.0;
    for (int64_t i = 0; i < n; i++)
        ss += x[i] * x[i];
    double inv = 1.0 / sqrt(ss / n + eps);
    for (int64_t i = 0; i < n; i++)
        y[i] = x[i] * inv * w[i];
}

/* ---- RoPE/YaRN (docs/deepseek2.md "RoPE/YaRN") --------------------------------------------- */

/* Rotates one dr-vector x in place for position p: pairs (x[2i], x[2i+1])
 * turn by theta_i, YaRN's blend of the extrapolated angle p*b^(-2i/dr) and
 * the interpolated one (divided by s), with the file's beta_fast/beta_slow. */
static void rope_yarn(const struct kt_hparams *hp, double *x, int64_t p)
{
    const double R = hp->qk_rope_dim, b = hp->rope_freq_base, s = hp->rope_scaling_factor;
    const double n_orig = hp->rope_orig_ctx, pi = 3.14159265358979323846;
    /* dims below lo rotate fast (extrapolate), above hi slow (interpolate) */
    double c_fast = R * log(n_orig / (2 * pi * hp->yarn_beta_fast)) / (2 * log(b));
    double c_slow = R * log(n_orig / (2 * pi * hp->yarn_beta_slow)) / (2 * log(b));
    double lo = fmax(0, floor(c_fast)), hi = fmin(R - 1, ceil(c_slow));
    for (uint32_t i = 0; i < hp->qk_rope_dim / 2; i++) {
        double th_ext = p * pow(b, -2.0 * i / R), th_int = th_ext / s;
        double gamma = 1.0 - fmin(1.0, fmax(0.0, (i - lo) / fmax(0.001, hi - lo)));
        double th = th_int * (1 - gamma) + th_ext * gamma;
        double x0 = x[2 * i], x1 = x[2 * i + 1];
        x[2 * i] = x0 * cos(th) - x1 * sin(th);
        x[2 * i + 1] = x0 * sin(th) + x1 * cos(th);
    }
}

/* Softmax scale of attention scores: mscale^2 / sqrt(dk), mscale = 1 + 0.1 mscale_all_dim ln s. */
static double kq_scale(const struct kt_hparams *hp)
{
    const double mscale = 1.0 + 0.1 * (hp->yarn_log_multiplier / 0.1) * log(hp->rope_scaling_factor);
    return mscale * mscale / sqrt((double)(hp->qk_nope_dim + hp->qk_rope_dim));
}

/* ---- Attention (MLA) (docs/deepseek2.md "Attention (MLA)") --------------------------------- */

/* A layer's attention weights, dequantized; uk/uv per head from attn_k_b /
 * attn_v_b (split files) or attn_kv_b (fused, legacy files). */
struct mla_weights {
    float *q_a;  /* (qr, E), or NULL without q-LoRA */
    float *q_b;  /* (H*dk, qr) */
    float *q;    /* (H*dk, E) without q-LoRA */
    float *kv_a; /* (kvr+dr, E) */
    float *uk;   /* (H, dn, kvr): k_nope of head h = uk[h] c */
    float *uv;   /* (H, dv, kvr): v of head h = uv[h] c */
    float *wo;   /* (E, H*dv) */
};

static struct mla_weights mla_load(const struct kt_hparams *hp, const struct kt_layer *L)
{
    const int64_t H = hp->n_head, kvr = hp->kv_lora_rank, dn = hp->qk_nope_dim, dv = hp->v_head_dim;
    struct mla_weights w = {0};
    w.q_a = L->attn_q_a ? ref_dequantize(L->attn_q_a) : NULL;
    w.q_b = L->attn_q_b ? ref_dequantize(L->attn_q_b) : NULL;
    w.q = L->attn_q ? ref_dequantize(L->attn_q) : NULL;
    w.kv_a = ref_dequantize(L->attn_kv_a_mqa);
    w.wo = ref_dequantize(L->attn_output);
    w.uk = malloc((size_t)(H * dn * kvr) * sizeof *w.uk);
    w.uv = malloc((size_t)(H * dv * kvr) * sizeof *w.uv);
    if (L->attn_k_b) { /* attn_k_b {dn, kvr, H}: [h][r][d]; attn_v_b {kvr, dv, H}: [h][j][r] */
        float *k_b = ref_dequantize(L->attn_k_b), *v_b = ref_dequantize(L->attn_v_b);
        for (int64_t h = 0; h < H; h++)
            for (int64_t d = 0; d < dn; d++)
                for (int64_t r = 0; r < kvr; r++)
                    w.uk[(h * dn + d) * kvr + r] = k_b[(h * kvr + r) * dn + d];
        memcpy(w.uv, v_b, (size_t)(H * dv * kvr) * sizeof *w.uv);
        free(k_b), free(v_b);
    } else { /* attn_kv_b {kvr, H(dn+dv)}: head h's rows are its dn key rows, then its dv value rows */
        float *kv_b = ref_dequantize(L->attn_kv_b);
        for (int64_t h = 0; h < H; h++) {
            memcpy(w.uk + h * dn * kvr, kv_b + h * (dn + dv) * kvr, (size_t)(dn * kvr) * sizeof *w.uk);
            memcpy(w.uv + h * dv * kvr, kv_b + (h * (dn + dv) + dn) * kvr, (size_t)(dv * kvr) * sizeof *w.uv);
        }
        free(kv_b);
    }
    return w;
}

static void mla_free(struct mla_weights *w)
{
    free(w->q_a), free(w->q_b), free(w->q), free(w->kv_a), free(w->uk), free(w->uv), free(w->wo);
}

/* x (n, E) += MLA attention of RMSNorm(x), causal, for positions from .. n-1
 * (every position's key and value, since they attend to all earlier ones).
 * Expanded form: keys and values are materialised per head from the latent.
 * cache_type < 0 keeps the latent row [c | k_pe] in double; a GGUF type
 * (F32, F16, BF16) rounds it as a KV cache of that type stores it (to float,
 * then to the type, to nearest even) before keys and values are made.
 *   q  (H, dk)      = W_qb RMSNorm(W_qa h)   (or W_q h), RoPE on each head's last dr
 *   [c | k_pe]      = W_kva h                (kvr + dr); c = RMSNorm(c), RoPE(k_pe)
 *   k_h (dk)        = [uk_h c | k_pe]        (k_pe shared by all heads)
 *   v_h (dv)        = uv_h c
 *   o_h (dv)        = sum_t softmax_t(kq_scale q_h . k_h,t) v_h,t
 *   x              += W_o [o_0 .. o_H-1]     (E) */
static void mla_attention(const struct kt_model *m, const struct kt_layer *L, double *x, int64_t n, int64_t from,
                          int cache_type)
{
    const struct kt_hparams *hp = &m->hp;
    const int64_t E = hp->n_embd, H = hp->n_head, qr = hp->q_lora_rank, kvr = hp->kv_lora_rank;
    const int64_t dn = hp->qk_nope_dim, dr = hp->qk_rope_dim, dk = dn + dr, dv = hp->v_head_dim;
    const double eps = hp->rms_eps, scale = kq_scale(hp);
    struct mla_weights w = mla_load(hp, L);
    double *h = malloc(E * sizeof *h), *qa = malloc((qr ? qr : 1) * sizeof *qa);
    double *kv = malloc((kvr + dr) * sizeof *kv);
    double *q = malloc(n * H * dk * sizeof *q);  /* (n, H, dk) */
    double *k = malloc(n * H * dk * sizeof *k);  /* (n, H, dk) */
    double *v = malloc(n * H * dv * sizeof *v);  /* (n, H, dv) */
    double *o = malloc(H * dv * sizeof *o), *s = malloc(n * sizeof *s), *y = malloc(E * sizeof *y);
    float *row = malloc((kvr + dr) * sizeof *row), *stored = malloc((kvr + dr) * sizeof *stored);

    /* queries, keys and values of every position (before x changes) */
    for (int64_t p = 0; p < n; p++) {
        rmsnorm(h, x + p * E, L->attn_norm->data, E, eps);
        if (p >= from && qr) { /* a query only where attention is computed */
            matvec(qa, w.q_a, h, qr, E);
            rmsnorm(qa, qa, L->attn_q_a_norm->data, qr, eps);
            matvec(q + p * H * dk, w.q_b, qa, H * dk, qr);
        } else if (p >= from) {
            matvec(q + p * H * dk, w.q, h, H * dk, E);
        }
        matvec(kv, w.kv_a, h, kvr + dr, E);
        rmsnorm(kv, kv, L->attn_kv_a_norm->data, kvr, eps); /* c: the first kvr values */
        rope_yarn(hp, kv + kvr, p);                         /* k_pe: the last dr */
        if (cache_type >= 0) { /* the row as the cache keeps it */
            for (int64_t i = 0; i < kvr + dr; i++)
                row[i] = (float)kv[i];
            const struct kt_type_traits *tr = kt_type_traits(cache_type);
            if (cache_type != KT_TYPE_F32) {
                tr->from_float(row, stored, kvr + dr);
                tr->to_float(stored, row, kvr + dr);
            }
            for (int64_t i = 0; i < kvr + dr; i++)
                kv[i] = row[i];
        }
        for (int64_t hd = 0; hd < H; hd++) {
            if (p >= from)
                rope_yarn(hp, q + (p * H + hd) * dk + dn, p);
            double *kh = k + (p * H + hd) * dk, *vh = v + (p * H + hd) * dv;
            matvec(kh, w.uk + hd * dn * kvr, kv, dn, kvr);
            memcpy(kh + dn, kv + kvr, dr * sizeof *kh);
            matvec(vh, w.uv + hd * dv * kvr, kv, dv, kvr);
        }
    }
    /* causal softmax attention per head, output projection, residual */
    for (int64_t p = from; p < n; p++) {
        for (int64_t hd = 0; hd < H; hd++) {
            const double *qh = q + (p * H + hd) * dk;
            double mx = -INFINITY, sum = 0.0;
            for (int64_t t = 0; t <= p; t++) {
                s[t] = 0.0;
                for (int64_t d = 0; d < dk; d++)
                    s[t] += qh[d] * k[(t * H + hd) * dk + d];
                s[t] *= scale;
                mx = fmax(mx, s[t]);
            }
            for (int64_t t = 0; t <= p; t++)
                sum += exp(s[t] - mx);
            for (int64_t j = 0; j < dv; j++) {
                o[hd * dv + j] = 0.0;
                for (int64_t t = 0; t <= p; t++)
                    o[hd * dv + j] += exp(s[t] - mx) / sum * v[(t * H + hd) * dv + j];
            }
        }
        matvec(y, w.wo, o, E, H * dv);
        for (int64_t i = 0; i < E; i++)
            x[p * E + i] += y[i];
    }
    mla_free(&w);
    free(h), free(qa), free(kv), free(q), free(k), free(v), free(o), free(s), free(y);
    free(row), free(stored);
}

/* ---- Dense FFN (docs/deepseek2.md "Dense FFN") --------------------------------------------- */

/* y (E) = W_down (silu(W_gate h) * W_up h); gate/up (w, E), down (E, w).
 * The same SwiGLU serves dense layers, each routed expert and the shared experts. */
static void swiglu_ffn(double *y, const float *gate, const float *up, const float *down, const double *h, int64_t E,
                       int64_t w)
{
    double *g = malloc(w * sizeof *g), *u = malloc(w * sizeof *u);
    matvec(g, gate, h, w, E);
    matvec(u, up, h, w, E);
    for (int64_t i = 0; i < w; i++)
        g[i] = silu(g[i]) * u[i];
    matvec(y, down, g, E, w);
    free(g), free(u);
}

/* x (n, E) += DenseFFN(RMSNorm(x)), width F. */
static void dense_ffn_block(const struct kt_model *m, const struct kt_layer *L, double *x, int64_t n)
{
    const int64_t E = m->hp.n_embd;
    float *g = ref_dequantize(L->ffn_gate), *u = ref_dequantize(L->ffn_up), *d = ref_dequantize(L->ffn_down);
    double *h = malloc(E * sizeof *h), *y = malloc(E * sizeof *y);
    for (int64_t p = 0; p < n; p++) {
        rmsnorm(h, x + p * E, L->ffn_norm->data, E, m->hp.rms_eps);
        swiglu_ffn(y, g, u, d, h, E, m->hp.n_ff);
        for (int64_t i = 0; i < E; i++)
            x[p * E + i] += y[i];
    }
    free(g), free(u), free(d), free(h), free(y);
}

/* ---- MoE routing (docs/deepseek2.md "MoE routing") ----------------------------------------- */

struct scored {
    double v;
    uint32_t i;
};

static int by_score_desc(const void *a, const void *b)
{
    const struct scored *x = a, *y = b;
    if (x->v != y->v)
        return x->v > y->v ? -1 : 1;
    return x->i < y->i ? -1 : 1; /* ties: lower index first */
}

/* prob = sigmoid(z) or softmax(z); sel = prob + bias picks, prob weighs:
 * groups ranked by the sum of their two best sel, all but n_group_used
 * groups masked, the k best sel taken in order, weights prob of those,
 * normalised (when norm) and multiplied by scale. */
double ref_route(const struct kt_router *r, const double *z, const float *bias, uint32_t *idx, double *w)
{
    double margin = INFINITY;
    const uint32_t Ne = r->n_expert, G = r->n_groups, per = Ne / G;
    double *prob = malloc(Ne * sizeof *prob);
    struct scored *sel = malloc(Ne * sizeof *sel), *grp = malloc(G * sizeof *grp), *tmp = malloc(per * sizeof *tmp);
    double mx = -INFINITY, sum = 0.0;
    for (uint32_t e = 0; e < Ne; e++)
        mx = fmax(mx, z[e]);
    for (uint32_t e = 0; e < Ne; e++)
        sum += exp(z[e] - mx);
    for (uint32_t e = 0; e < Ne; e++) {
        prob[e] = r->gating == KT_GATING_SIGMOID ? 1.0 / (1.0 + exp(-z[e])) : exp(z[e] - mx) / sum;
        sel[e] = (struct scored){prob[e] + (bias ? bias[e] : 0.0), e};
    }
    if (G > 1) { /* group-limited: groups are contiguous runs of per experts */
        for (uint32_t g = 0; g < G; g++) {
            memcpy(tmp, sel + g * per, per * sizeof *tmp);
            qsort(tmp, per, sizeof *tmp, by_score_desc);
            grp[g] = (struct scored){tmp[0].v + (per > 1 ? tmp[1].v : 0.0), g};
        }
        qsort(grp, G, sizeof *grp, by_score_desc);
        for (uint32_t k = 1; k < G; k++)
            margin = fmin(margin, grp[k - 1].v - grp[k].v);
        for (uint32_t k = r->n_group_used; k < G; k++)
            for (uint32_t e = grp[k].i * per; e < (grp[k].i + 1) * per; e++)
                sel[e].v = -INFINITY;
    }
    qsort(sel, Ne, sizeof *sel, by_score_desc);
    for (uint32_t j = 1; j <= r->n_used && j < Ne; j++)
        if (sel[j].v > -INFINITY)
            margin = fmin(margin, sel[j - 1].v - sel[j].v);
    double wsum = 0.0;
    for (uint32_t j = 0; j < r->n_used; j++) {
        idx[j] = sel[j].i;
        w[j] = prob[sel[j].i]; /* unbiased */
        wsum += w[j];
    }
    for (uint32_t j = 0; j < r->n_used; j++) {
        if (r->norm)
            w[j] /= fmax(wsum, 6.103515625e-5);
        w[j] *= r->scale;
    }
    free(prob), free(sel), free(grp), free(tmp);
    return margin;
}

/* ---- MoE FFN and shared experts (docs/deepseek2.md "MoE routing", "Shared experts") -------- */

/* x (n, E) += sum_j w_j Expert_idx_j(h) + SharedFFN(h), h = RMSNorm(x).
 *   z (Ne)          = W_router h
 *   idx, w (k)      = ref_route(z)
 *   expert e        = SwiGLU of width f with slices e of gate/up {E, f, Ne}, down {f, E, Ne}
 *   shared          = SwiGLU of width f*Ns, weight 1 */
static void moe_block(const struct kt_model *m, const struct kt_layer *L, double *x, int64_t n, uint32_t *routes,
                      double *margin)
{
    const struct kt_hparams *hp = &m->hp;
    const int64_t E = hp->n_embd, f = hp->n_ff_exp, fs = f * hp->n_expert_shared;
    struct kt_router router;
    kt_router_from_hparams(hp, &router);
    float *rw = ref_dequantize(L->ffn_gate_inp), *g = NULL, *u = NULL;
    if (L->ffn_gate_up_exps) { /* fused {E, 2f, Ne}: expert e's gate rows, then its up rows */
        float *gu = ref_dequantize(L->ffn_gate_up_exps);
        g = malloc((size_t)(hp->n_expert * f * E) * sizeof *g);
        u = malloc((size_t)(hp->n_expert * f * E) * sizeof *u);
        for (int64_t e = 0; e < hp->n_expert; e++) {
            memcpy(g + e * f * E, gu + (2 * e) * f * E, (size_t)(f * E) * sizeof *g);
            memcpy(u + e * f * E, gu + (2 * e + 1) * f * E, (size_t)(f * E) * sizeof *u);
        }
        free(gu);
    } else {
        g = ref_dequantize_experts(m, L->ffn_gate_exps);
        u = ref_dequantize_experts(m, L->ffn_up_exps);
    }
    float *d = ref_dequantize_experts(m, L->ffn_down_exps);
    float *gs = fs ? ref_dequantize(L->ffn_gate_shexp) : NULL, *us = fs ? ref_dequantize(L->ffn_up_shexp) : NULL;
    float *ds = fs ? ref_dequantize(L->ffn_down_shexp) : NULL;
    double *h = malloc(E * sizeof *h), *y = malloc(E * sizeof *y), *acc = malloc(E * sizeof *acc);
    double *z = malloc(hp->n_expert * sizeof *z), *w = malloc(router.n_used * sizeof *w);
    uint32_t *idx = malloc(router.n_used * sizeof *idx);
    for (int64_t p = 0; p < n; p++) {
        rmsnorm(h, x + p * E, L->ffn_norm->data, E, hp->rms_eps);
        matvec(z, rw, h, hp->n_expert, E);
        double gap = ref_route(&router, z, L->exp_probs_b ? L->exp_probs_b->data : NULL, idx, w);
        if (margin && gap < *margin)
            *margin = gap;
        if (routes)
            memcpy(routes + p * router.n_used, idx, router.n_used * sizeof *idx);
        for (int64_t i = 0; i < E; i++)
            acc[i] = 0.0;
        for (uint32_t j = 0; j < router.n_used; j++) { /* summed in selection order */
            const int64_t e = idx[j];
            swiglu_ffn(y, g + e * f * E, u + e * f * E, d + e * E * f, h, E, f);
            for (int64_t i = 0; i < E; i++)
                acc[i] += w[j] * y[i];
        }
        if (fs) {
            swiglu_ffn(y, gs, us, ds, h, E, fs);
            for (int64_t i = 0; i < E; i++)
                acc[i] += y[i];
        }
        for (int64_t i = 0; i < E; i++)
            x[p * E + i] += acc[i];
    }
    free(rw), free(g), free(u), free(d), free(gs), free(us), free(ds);
    free(h), free(y), free(acc), free(z), free(w), free(idx);
}

/* ---- Output head (docs/deepseek2.md "Output head") ----------------------------------------- */

/* logits (n, V) = W_out RMSNorm(x) */
static void head(const struct kt_model *m, const double *x, int64_t n, double *logits)
{
    const int64_t E = m->hp.n_embd, V = m->hp.n_vocab;
    float *out = ref_dequantize(m->output);
    double *h = malloc(E * sizeof *h);
    for (int64_t p = 0; p < n; p++) {
        rmsnorm(h, x + p * E, m->output_norm->data, E, m->hp.rms_eps);
        matvec(logits + p * V, out, h, V, E);
    }
    free(out), free(h);
}

/* ---- the forward pass ----------------------------------------------------------------------- */

double *ref_forward(const struct kt_model *m, const int32_t *toks, int64_t n)
{
    return ref_forward_routed(m, toks, n, NULL, NULL);
}

double *ref_forward_routed(const struct kt_model *m, const int32_t *toks, int64_t n, uint32_t *routes, double *margin)
{
    const int64_t k = m->hp.n_expert_used;
    const int64_t E = m->hp.n_embd, V = m->hp.n_vocab;
    double *x = malloc(n * E * sizeof *x); /* (n, E) the residual stream */
    float *embd = ref_dequantize(m->token_embd);
    for (int64_t p = 0; p < n; p++) /* token embedding: row toks[p] of token_embd {E, V} */
        for (int64_t i = 0; i < E; i++)
            x[p * E + i] = embd[toks[p] * E + i];
    free(embd);
    for (uint32_t il = 0; il < m->hp.n_layer; il++) {
        const struct kt_layer *L = &m->layers[il];
        mla_attention(m, L, x, n, 0, -1);
        if (L->is_moe)
            moe_block(m, L, x, n, routes ? routes + il * n * k : NULL, margin);
        else
            dense_ffn_block(m, L, x, n);
    }
    double *logits = malloc(n * V * sizeof *logits);
    head(m, x, n, logits);
    free(x);
    return logits;
}

/* Only a one-layer model's last positions: a position reaches the logits of
 * a later one only through its key and value, which depend on its token
 * alone, so each earlier position costs its row and nothing quadratic. */
double *ref_forward_last(const struct kt_model *m, const int32_t *toks, int64_t n, int64_t n_last, int cache_type)
{
    if (m->hp.n_layer != 1 || n_last < 1 || n_last > n)
        return NULL;
    const int64_t E = m->hp.n_embd, V = m->hp.n_vocab, from = n - n_last;
    double *x = malloc(n * E * sizeof *x); /* (n, E) the residual stream */
    float *embd = ref_dequantize(m->token_embd);
    for (int64_t p = 0; p < n; p++)
        for (int64_t i = 0; i < E; i++)
            x[p * E + i] = embd[toks[p] * E + i];
    free(embd);
    const struct kt_layer *L = &m->layers[0];
    mla_attention(m, L, x, n, from, cache_type);
    if (L->is_moe)
        moe_block(m, L, x + from * E, n_last, NULL, NULL);
    else
        dense_ffn_block(m, L, x + from * E, n_last);
    double *logits = malloc(n_last * V * sizeof *logits);
    head(m, x + from * E, n_last, logits);
    free(x);
    return logits;
}
