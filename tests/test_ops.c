/*
 * test_ops.c - the scalar reference ops (kernels/cpu/ref/ops.h) against the
 * formulas of docs/deepseek2.md evaluated plainly in double, on
 * random inputs and odd shapes; YaRN's ramp and the softmax scale against
 * the reference's tables.
 *
 * Tolerances are relative to the largest magnitude involved: a float result
 * of an O(n) computation carries a few float ulps (1.2e-7 each); 1e-5 leaves
 * room for that and nothing else (a wrong formula is off by far more).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "cpu/ref/ops.h"
#include "model.h"
#include "testlib.h"

static unsigned long long rng = 0x0ddba11ULL;

static void fill_normal(float *x, int64_t n, float scale)
{
    for (int64_t i = 0; i < n; i++)
        x[i] = scale * kt_test_rand_normal(&rng);
}

/* max |a - b| / max(max |b|, floor) */
static double rel_err(const float *a, const double *b, int64_t n, double floor)
{
    double max_b = floor, max_d = 0.0;
    for (int64_t i = 0; i < n; i++) {
        if (fabs(b[i]) > max_b)
            max_b = fabs(b[i]);
        double d = fabs((double)a[i] - b[i]);
        if (!(d <= max_d)) /* NaN propagates as a failure */
            max_d = isnan(d) ? INFINITY : d;
    }
    return max_d / max_b;
}

static const int64_t odd_sizes[] = {1, 2, 3, 7, 31, 64, 129, 512, 1000, 7168};
#define N_SIZES (sizeof odd_sizes / sizeof odd_sizes[0])

/* ---- norms and activations ------------------------------------------------------------ */

static void rmsnorm_matches_double_formula(void)
{
    for (size_t s = 0; s < N_SIZES; s++) {
        const int64_t n = odd_sizes[s];
        float *x = malloc(n * sizeof *x), *w = malloc(n * sizeof *w), *y = malloc(n * sizeof *y);
        double *ref = malloc(n * sizeof *ref);
        const float scales[] = {1e-3f, 1.0f, 300.0f};
        for (int k = 0; k < 3; k++) {
            fill_normal(x, n, scales[k]);
            fill_normal(w, n, 1.0f);
            const float eps = k == 0 ? 1e-6f : 1e-5f;
            double ss = 0.0;
            for (int64_t i = 0; i < n; i++)
                ss += (double)x[i] * x[i];
            double inv = 1.0 / sqrt(ss / n + eps);
            for (int64_t i = 0; i < n; i++)
                ref[i] = x[i] * inv * w[i];
            kt_rmsnorm(y, x, w, n, eps);
            double e = rel_err(y, ref, n, 1e-30);
            KT_CHECK(e < 1e-5, "n %lld scale %g: relative error %g", (long long)n, (double)scales[k], e);
            kt_rmsnorm(x, x, w, n, eps); /* in place gives the same */
            KT_CHECK(memcmp(x, y, n * sizeof *x) == 0, "n %lld: in-place result differs", (long long)n);
        }
        free(x), free(w), free(y), free(ref);
    }
}

static void softmax_matches_double_formula_with_masked_entries(void)
{
    for (size_t s = 0; s < N_SIZES; s++) {
        const int64_t n = odd_sizes[s];
        float *x = malloc(n * sizeof *x);
        double *ref = malloc(n * sizeof *ref);
        for (int k = 0; k < 3; k++) {
            fill_normal(x, n, k == 2 ? 200.0f : 3.0f);
            if (k >= 1) /* mask every third entry, never all of them */
                for (int64_t i = 1; i < n; i += 3)
                    x[i] = -INFINITY;
            double max = -INFINITY, sum = 0.0;
            for (int64_t i = 0; i < n; i++)
                max = x[i] > max ? x[i] : max;
            for (int64_t i = 0; i < n; i++)
                sum += exp((double)x[i] - max);
            for (int64_t i = 0; i < n; i++)
                ref[i] = exp((double)x[i] - max) / sum;
            kt_softmax(x, n);
            double e = rel_err(x, ref, n, 1e-30);
            KT_CHECK(e < 1e-5, "n %lld case %d: relative error %g", (long long)n, k, e);
            for (int64_t i = 1; k >= 1 && i < n; i += 3)
                KT_CHECK(x[i] == 0.0f, "n %lld: masked entry %lld is %g, not 0", (long long)n, (long long)i, (double)x[i]);
        }
        free(x), free(ref);
    }
    float all_masked[5] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY};
    kt_softmax(all_masked, 5);
    for (int i = 0; i < 5; i++)
        KT_CHECK(all_masked[i] == 0.0f, "all-masked row: entry %d is %g, expected 0", i, (double)all_masked[i]);
    float one = -7.0f;
    kt_softmax(&one, 1);
    KT_CHECK(one == 1.0f, "softmax of one value is %g", (double)one);
}

static void silu_sigmoid_swiglu_match_double_formulas(void)
{
    const int64_t n = 1001;
    float g[1001], u[1001], out[1001];
    double ref[1001];
    for (int64_t i = 0; i < n; i++) {
        g[i] = -100.0f + 200.0f * (float)i / (float)(n - 1); /* includes ±100 and 0 */
        u[i] = kt_test_rand_normal(&rng);
    }
    double max_sig = 0.0, max_silu = 0.0;
    for (int64_t i = 0; i < n; i++) {
        double sig = 1.0 / (1.0 + exp(-(double)g[i]));
        max_sig = fmax(max_sig, fabs(kt_sigmoid(g[i]) - sig));
        max_silu = fmax(max_silu, fabs(kt_silu(g[i]) - g[i] * sig) / fmax(1.0, fabs(g[i] * sig)));
        ref[i] = g[i] * sig * u[i];
    }
    KT_CHECK(max_sig < 1e-6, "sigmoid error %g", max_sig);
    KT_CHECK(max_silu < 1e-6, "silu relative error %g", max_silu);
    kt_swiglu(out, g, u, n);
    double e = rel_err(out, ref, n, 1e-30);
    KT_CHECK(e < 1e-6, "swiglu relative error %g", e);
    KT_CHECK(kt_silu(0.0f) == 0.0f && isfinite(kt_silu(-1000.0f)) && kt_silu(1000.0f) == 1000.0f,
             "silu at 0, -1000, 1000: %g %g %g", (double)kt_silu(0.0f), (double)kt_silu(-1000.0f),
             (double)kt_silu(1000.0f));
}

/* ---- RoPE with YaRN ------------------------------------------------------------------ */

/* Reference §4.3, term by term, in double. */
struct ref_rope {
    int R;
    double b, s, beta_fast, beta_slow, M;
    double n_orig;
    int yarn;
};

static double ref_corr_dim(const struct ref_rope *p, double beta)
{
    return p->R * log(p->n_orig / (2.0 * 3.14159265358979323846 * beta)) / (2.0 * log(p->b));
}

static void ref_rope_apply(const struct ref_rope *p, int64_t pos, const float *x, double *out)
{
    double lo = fmax(0.0, floor(ref_corr_dim(p, p->beta_fast)));
    double hi = fmin(p->R - 1, ceil(ref_corr_dim(p, p->beta_slow)));
    for (int i = 0; i < p->R / 2; i++) {
        double theta_ext = (double)pos * pow(p->b, -2.0 * i / p->R);
        double theta_int = theta_ext / p->s;
        double ramp = 1.0 - fmin(1.0, fmax(0.0, (i - lo) / fmax(0.001, hi - lo)));
        double gamma = p->yarn ? ramp : 0.0;
        double theta = theta_int * (1.0 - gamma) + theta_ext * gamma;
        out[2 * i] = p->M * (x[2 * i] * cos(theta) - x[2 * i + 1] * sin(theta));
        out[2 * i + 1] = p->M * (x[2 * i] * sin(theta) + x[2 * i + 1] * cos(theta));
    }
}

static void check_rope(const char *what, const struct ref_rope *p)
{
    struct kt_rope_params rp = {
        .n_dims = (uint32_t)p->R, .freq_base = p->b, .factor = p->s, .mode = p->yarn ? KT_ROPE_YARN : KT_ROPE_PLAIN,
        .orig_ctx = (uint32_t)p->n_orig, .beta_fast = p->beta_fast, .beta_slow = p->beta_slow, .magnitude = p->M,
    };
    struct kt_rope r;
    KT_CHECK(kt_rope_init(&r, &rp), "%s: kt_rope_init refused", what);
    const uint32_t positions[] = {0, 1, 2, 7, 100, 4095, 4096, 65537, 131071};
    float x[KT_ROPE_MAX_DIMS], y[KT_ROPE_MAX_DIMS], cs[KT_ROPE_MAX_DIMS];
    double ref[KT_ROPE_MAX_DIMS];
    for (size_t k = 0; k < sizeof positions / sizeof positions[0]; k++) {
        fill_normal(x, p->R, 1.0f);
        memcpy(y, x, p->R * sizeof *y);
        kt_rope_angles(&r, positions[k], cs);
        kt_rope_apply(y, cs, (uint32_t)p->R);
        ref_rope_apply(p, positions[k], x, ref);
        double e = rel_err(y, ref, p->R, 1.0);
        KT_CHECK(e < 2e-6, "%s, position %u: error %g", what, positions[k], e);
    }
}

static void rope_yarn_matches_reference_formulas(void)
{
    /* Kimi-K2 with its file's β 1/1 (HF/official), Kimi-K2 as llama.cpp runs
     * it (β 32/1), DeepSeek-V3 (β 32/1), the tiny presets' dims, no scaling,
     * linear scaling, and a magnitude other than 1. */
    struct ref_rope kimi = {64, 50000, 32, 1, 1, 1.0, 4096, 1};
    struct ref_rope kimi_llama = {64, 50000, 32, 32, 1, 1.0, 4096, 1};
    struct ref_rope v3 = {64, 10000, 40, 32, 1, 1.0, 4096, 1};
    struct ref_rope tiny = {16, 50000, 32, 1, 1, 1.0, 4096, 1};
    struct ref_rope tiny_v3 = {16, 10000, 40, 32, 1, 1.0, 4096, 1};
    struct ref_rope plain = {64, 10000, 1, 32, 1, 1.0, 4096, 0};
    struct ref_rope linear = {32, 10000, 4, 32, 1, 1.0, 4096, 0};
    struct ref_rope scaled = {64, 10000, 40, 32, 1, 1.0 + 0.1 * log(40.0), 4096, 1};
    check_rope("kimi-k2 beta 1/1", &kimi);
    check_rope("kimi-k2 beta 32/1", &kimi_llama);
    check_rope("deepseek-v3 beta 32/1", &v3);
    check_rope("tiny", &tiny);
    check_rope("tiny-v3", &tiny_v3);
    check_rope("no scaling", &plain);
    check_rope("linear s=4", &linear);
    check_rope("magnitude 1+0.1 ln 40", &scaled);
}

/* Reference §4.3's table: lo, hi of each model's ramp. */
static void rope_yarn_ramp_bounds_match_reference_table(void)
{
    struct {
        const char *model;
        double base, beta_fast, beta_slow;
        double lo, hi;
    } rows[] = {
        {"DeepSeek-V3 (beta 32/1)", 10000, 32, 1, 10, 23},
        {"Kimi-K2 (file beta 1/1)", 50000, 1, 1, 19, 20},
        {"Kimi-K2 (llama.cpp beta 32/1)", 50000, 32, 1, 8, 20},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        struct kt_rope_params rp = {64, rows[i].base, 32, KT_ROPE_YARN, 4096, rows[i].beta_fast, rows[i].beta_slow, 1};
        struct kt_rope r;
        KT_CHECK(kt_rope_init(&r, &rp), "%s: init failed", rows[i].model);
        KT_CHECK(r.ramp_lo == rows[i].lo && r.ramp_hi == rows[i].hi, "%s: ramp %g..%g, reference %g..%g",
                 rows[i].model, r.ramp_lo, r.ramp_hi, rows[i].lo, rows[i].hi);
        /* pairs at or below lo keep the trained frequency, at or above hi are stretched s times */
        double trained_lo = pow(rows[i].base, -2.0 * rows[i].lo / 64), trained_hi = pow(rows[i].base, -2.0 * rows[i].hi / 64);
        KT_CHECK(fabs(r.inv_freq[(int)rows[i].lo] - trained_lo) < 1e-15 * fmax(1.0, trained_lo) + 1e-300,
                 "%s: pair %g is not extrapolated", rows[i].model, rows[i].lo);
        KT_CHECK(fabs(r.inv_freq[(int)rows[i].hi] - trained_hi / 32) <= 1e-12 * trained_hi,
                 "%s: pair %g is not interpolated", rows[i].model, rows[i].hi);
    }
}

static void rope_rotates_adjacent_pairs_not_halves(void)
{
    struct kt_rope_params rp = {16, 10000, 1, KT_ROPE_PLAIN, 4096, 32, 1, 1};
    struct kt_rope r;
    KT_CHECK(kt_rope_init(&r, &rp), "init failed");
    float x[16] = {0}, cs[16];
    x[0] = 1.0f; /* GPT-J pairs (0,1); NeoX would pair (0,8) */
    kt_rope_angles(&r, 1, cs);
    kt_rope_apply(x, cs, 16);
    KT_CHECK(fabsf(x[0] - cosf(1.0f)) < 1e-6f && fabsf(x[1] - sinf(1.0f)) < 1e-6f && x[8] == 0.0f,
             "pair 0 at position 1: x0 %g x1 %g x8 %g", (double)x[0], (double)x[1], (double)x[8]);
    float y[16], z[16];
    fill_normal(y, 16, 1.0f);
    memcpy(z, y, sizeof y);
    kt_rope_angles(&r, 0, cs);
    kt_rope_apply(z, cs, 16);
    KT_CHECK(memcmp(y, z, sizeof y) == 0, "position 0 is not the identity");
    struct kt_rope_params bad = {15, 10000, 1, KT_ROPE_PLAIN, 4096, 32, 1, 1};
    KT_CHECK(!kt_rope_init(&r, &bad), "odd rope dimension accepted");
}

/* ---- the softmax scale ---------------------------------------------------------------- */

/* Reference §4.4's table (dk = 192). */
static void kq_scale_matches_reference_table(void)
{
    struct {
        const char *model;
        float s, mscale_all_dim;
        double kq_scale, mscale;
    } rows[] = {
        {"Kimi-K2 (0711)", 32, 1.0f, 0.130861, 1.346574},
        {"Kimi-K2-0905", 64, 1.0f, 0.144680, 1.415888},
        {"DeepSeek-V3", 40, 1.0f, 0.135234, 1.368888},
        {"DeepSeek-V2-Lite", 40, 0.707f, 0.114721, 1.260804},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        struct kt_hparams hp = {0};
        hp.qk_nope_dim = 128;
        hp.qk_rope_dim = 64;
        hp.rope_scaling = KT_ROPE_SCALING_YARN;
        hp.rope_scaling_factor = rows[i].s;
        hp.yarn_log_multiplier = 0.1f * rows[i].mscale_all_dim;
        hp.rope_attn_factor = 1.0f;
        hp.rope_freq_base = 10000;
        hp.rope_orig_ctx = 4096;
        hp.yarn_beta_fast = 32;
        hp.yarn_beta_slow = 1;
        double kq = kt_hparams_kq_scale(&hp), ms = kt_hparams_yarn_mscale(&hp);
        KT_CHECK(fabs(kq - rows[i].kq_scale) < 1e-6, "%s: kq_scale %.7f, reference %.6f", rows[i].model, kq,
                 rows[i].kq_scale);
        KT_CHECK(fabs(ms - rows[i].mscale) < 1e-6, "%s: mscale %.7f, reference %.6f", rows[i].model, ms,
                 rows[i].mscale);
        /* The rotation's own magnitude is 1 for all of them (§4.4 "net effect"). */
        struct kt_rope_params rp;
        kt_engine_rope_params(&hp, &rp);
        KT_CHECK(rp.magnitude == 1.0 && rp.mode == KT_ROPE_YARN && rp.factor == rows[i].s,
                 "%s: rope magnitude %g mode %d factor %g", rows[i].model, rp.magnitude, (int)rp.mode, rp.factor);
    }
}

/* ---- attention ------------------------------------------------------------------------ */

static void attention_head_matches_double_formula(void)
{
    const int64_t n_kvs[] = {1, 2, 5, 33, 300};
    const int64_t dk = 48, dv = 32;
    for (size_t c = 0; c < sizeof n_kvs / sizeof n_kvs[0]; c++) {
        const int64_t n = n_kvs[c];
        float *keys = malloc(n * dk * sizeof *keys), *vals = malloc(n * dv * sizeof *vals);
        const float **k = malloc(n * sizeof *k), **v = malloc(n * sizeof *v), **kv = malloc(n * sizeof *kv);
        float q[48], out[48], scores[300];
        double ref[48], s[300];
        fill_normal(keys, n * dk, 1.0f);
        fill_normal(vals, n * dv, 1.0f);
        fill_normal(q, dk, 1.0f);
        for (int64_t t = 0; t < n; t++) {
            k[t] = keys + (n - 1 - t) * dk; /* rows in any memory order */
            v[t] = vals + t * dv;
            kv[t] = keys + t * dk;
        }
        const float scale = 0.1443f;
        for (int pass = 0; pass < 2; pass++) {
            /* pass 1: values alias the keys' first dv floats (MLA's latent rows) */
            const float *const *vv = pass ? kv : v;
            const float *const *kk = pass ? kv : k;
            double max = -INFINITY, sum = 0.0;
            for (int64_t t = 0; t < n; t++) {
                s[t] = 0.0;
                for (int64_t i = 0; i < dk; i++)
                    s[t] += (double)q[i] * kk[t][i];
                s[t] *= scale;
                max = fmax(max, s[t]);
            }
            for (int64_t t = 0; t < n; t++)
                sum += exp(s[t] - max);
            for (int64_t j = 0; j < dv; j++) {
                ref[j] = 0.0;
                for (int64_t t = 0; t < n; t++)
                    ref[j] += exp(s[t] - max) / sum * vv[t][j];
            }
            kt_attention_head(out, q, kk, vv, n, dk, dv, scale, scores);
            double e = rel_err(out, ref, dv, 1e-3);
            KT_CHECK(e < 1e-5, "n_kv %lld pass %d: relative error %g", (long long)n, pass, e);
        }
        free(keys), free(vals), free(k), free(v), free(kv);
    }
}

int main(void)
{
    KT_RUN(rmsnorm_matches_double_formula);
    KT_RUN(softmax_matches_double_formula_with_masked_entries);
    KT_RUN(silu_sigmoid_swiglu_match_double_formulas);
    KT_RUN(rope_yarn_matches_reference_formulas);
    KT_RUN(rope_yarn_ramp_bounds_match_reference_table);
    KT_RUN(rope_rotates_adjacent_pairs_not_halves);
    KT_RUN(kq_scale_matches_reference_table);
    KT_RUN(attention_head_matches_double_formula);
    return kt_test_finish();
}
