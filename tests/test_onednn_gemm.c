/*
 * test_onednn_gemm.c - runtime/forward/onednn_gemm.c: oneDNN's float products are
 * the dot products within the bound onednn_gemm.h states, on odd shapes and
 * padded strides, write nothing outside their outputs, reject bad shapes,
 * and never start a thread; kt_matmul_q takes that path for large F32 and
 * BF16 products, with the same bits for any thread count.
 *
 * The bound: |y - exact| <= n_in * 2^-24 * sum_i |a_i * w_i| (any float
 * summation order), exact = the sum in double of the same products (BF16
 * weights widened exactly).  The largest error seen (n_in >= 256), as a
 * share of that bound, is printed, never asserted.
 */
#include "testlib.h"

#include "matmul.h"
#include "onednn_gemm.h"
#include "quant.h"
#include "pool.h"
#ifdef KT_HAVE_AMX_KERNELS
#include "cpu/amx/packed_amx.h"
#endif

#include <dirent.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static unsigned long long g_rng = 0x6f6e65646e6eULL;

static const float SENTINEL = -12345.678f;

/* Threads of this process (entries of /proc/self/task); -1 if unreadable. */
static int thread_count(void)
{
    DIR *d = opendir("/proc/self/task");
    if (!d)
        return -1;
    int n = 0;
    for (struct dirent *e; (e = readdir(d));)
        n += e->d_name[0] != '.';
    closedir(d);
    return n;
}

/* sum_i w[o][i] * a[t][i] in double (rows w_stride and a_stride apart), and
 * sum_i |w[o][i] * a[t][i]| in *mag. */
static double exact_dot(const float *w, int64_t w_stride, const float *a, int64_t a_stride, int64_t n_in, int64_t o,
                        int64_t t, double *mag)
{
    double exact = 0.0, m = 0.0;
    for (int64_t i = 0; i < n_in; i++) {
        const double p = (double)w[o * w_stride + i] * a[t * a_stride + i];
        exact += p;
        m += fabs(p);
    }
    *mag = m;
    return exact;
}

/*
 * One shape: weights (n_out, w_stride) of F32 or BF16, activations (n_tok,
 * a_stride), outputs (n_tok, y_stride) with sentinels past n_out.  Returns
 * the outputs outside the bound (or clobbered sentinels); *worst is the
 * largest |error| / bound seen.
 */
static int product_within_bound(bool bf16, int64_t n_in, int64_t n_out, int64_t n_tok, double *worst)
{
    const int64_t w_stride = n_in + 3, a_stride = n_in + 5, y_stride = n_out + 2;
    float *wf = kt_test_xmalloc((size_t)(n_out * w_stride) * sizeof *wf); /* weights as F32 (widened BF16) */
    kt_bf16 *wb = kt_test_xmalloc((size_t)(n_out * w_stride) * sizeof *wb);
    float *a = kt_test_xmalloc((size_t)(n_tok * a_stride) * sizeof *a);
    float *y = kt_test_xmalloc((size_t)(n_tok * y_stride) * sizeof *y);
    for (int64_t i = 0; i < n_out * w_stride; i++) {
        const float v = kt_test_rand_normal(&g_rng) * (kt_test_rand_u64(&g_rng) % 50 == 0 ? 30.0f : 1.0f);
        wb[i] = kt_fp32_to_bf16(v);
        wf[i] = bf16 ? kt_bf16_to_fp32(wb[i]) : v;
    }
    for (int64_t i = 0; i < n_tok * a_stride; i++)
        a[i] = kt_test_rand_normal(&g_rng);
    for (int64_t i = 0; i < n_tok * y_stride; i++)
        y[i] = SENTINEL;
    kt_err err = {0};
    const kt_status st = bf16 ? kt_onednn_gemm_bf16(n_in, wb, w_stride, n_out, a, a_stride, n_tok, y, y_stride, &err)
                              : kt_onednn_gemm_f32(n_in, wf, w_stride, n_out, a, a_stride, n_tok, y, y_stride, &err);
    KT_CHECK(st == KT_OK, "%s %lldx%lldx%lld: %s", bf16 ? "bf16" : "f32", (long long)n_tok, (long long)n_out,
             (long long)n_in, err.msg);
    int bad = 0;
    for (int64_t t = 0; t < n_tok; t++)
        for (int64_t o = 0; o < y_stride; o++) {
            const float got = y[t * y_stride + o];
            if (o >= n_out) {
                bad += memcmp(&got, &SENTINEL, sizeof got) != 0;
                continue;
            }
            double mag;
            const double exact = exact_dot(wf, w_stride, a, a_stride, n_in, o, t, &mag);
            const double bound = (double)n_in * 0x1p-24 * mag + 0x1p-126, error = fabs((double)got - exact);
            if (n_in >= 256) /* shorter sums: one rounding can be the whole bound */
                *worst = error / bound > *worst ? error / bound : *worst;
            if (!(error <= bound) && bad++ < 3)
                fprintf(stderr, "  %s %lldx%lldx%lld: y[%lld][%lld] = %.9g, exact %.9g, bound %.3g\n",
                        bf16 ? "bf16" : "f32", (long long)n_tok, (long long)n_out, (long long)n_in, (long long)t,
                        (long long)o, got, exact, bound);
        }
    free(wf), free(wb), free(a), free(y);
    return bad;
}

static void products_are_dot_products_within_the_stated_bound(void)
{
    const int64_t n_ins[] = {1, 7, 33, 256, 1283}, n_outs[] = {1, 7, 17, 131}, n_toks[] = {1, 5, 8, 13};
    for (int bf16 = 0; bf16 < 2; bf16++) {
        int bad = 0, shapes = 0;
        double worst = 0.0;
        for (size_t i = 0; i < sizeof n_ins / sizeof n_ins[0]; i++)
            for (size_t o = 0; o < sizeof n_outs / sizeof n_outs[0]; o++)
                for (size_t t = 0; t < sizeof n_toks / sizeof n_toks[0]; t++, shapes++)
                    bad += product_within_bound(bf16, n_ins[i], n_outs[o], n_toks[t], &worst);
        /* a model-sized row: 2 blocks of widened BF16 rows */
        bad += product_within_bound(bf16, 7168, 129, 13, &worst);
        KT_CHECK(bad == 0, "%s: %d outputs outside the bound (or clobbered sentinels) over %d shapes",
                 bf16 ? "bf16" : "f32", bad, shapes + 1);
        printf("  info: %s: largest error at n_in >= 256: %.2g of the stated bound\n", bf16 ? "bf16" : "f32", worst);
    }
}

static void empty_products_are_zero_and_bad_shapes_are_refused(void)
{
    float a[4] = {1, 2, 3, 4}, w[4] = {1, 1, 1, 1}, y[4] = {SENTINEL, SENTINEL, SENTINEL, SENTINEL};
    kt_err err = {0};
    KT_CHECK(kt_onednn_gemm_f32(0, w, 0, 2, a, 0, 2, y, 2, &err) == KT_OK, "n_in 0: %s", err.msg);
    KT_CHECK(y[0] == 0.0f && y[1] == 0.0f && y[2] == 0.0f && y[3] == 0.0f, "n_in 0 gives %g %g %g %g", y[0], y[1],
             y[2], y[3]);
    KT_CHECK(kt_onednn_gemm_f32(4, w, 3, 1, a, 4, 1, y, 1, &err) == KT_ERR_INVALID, "w_stride < n_in accepted");
    KT_CHECK(kt_onednn_gemm_bf16(4, (const kt_bf16 *)w, 4, 2, a, 4, 1, y, 1, &err) == KT_ERR_INVALID,
             "y_stride < n_out accepted");
}

/* oneDNN here runs on OpenMP, which would start a team on a large product
 * (and keep it); kt's pool owns the cores, so calls must leave the thread
 * count as it was.  Runs first: a team started by an earlier case would hide
 * a later one. */
static void calls_start_no_threads(void)
{
    const int before = thread_count();
    if (before < 0) {
        printf("  skipped: /proc/self/task unreadable\n");
        return;
    }
    const int64_t n_in = 1024, n_out = 512, n_tok = 64;
    float *w = kt_test_xmalloc((size_t)(n_out * n_in) * sizeof *w);
    float *a = kt_test_xmalloc((size_t)(n_tok * n_in) * sizeof *a);
    kt_bf16 *wb = kt_test_xmalloc((size_t)(n_out * n_in) * sizeof *wb);
    float *y = kt_test_xmalloc((size_t)(n_tok * n_out) * sizeof *y);
    for (int64_t i = 0; i < n_out * n_in; i++)
        w[i] = kt_test_rand_uniform(&g_rng, -1, 1), wb[i] = kt_fp32_to_bf16(w[i]);
    for (int64_t i = 0; i < n_tok * n_in; i++)
        a[i] = kt_test_rand_uniform(&g_rng, -1, 1);
    kt_err err = {0};
    for (int rep = 0; rep < 3; rep++) {
        KT_CHECK(kt_onednn_gemm_f32(n_in, w, n_in, n_out, a, n_in, n_tok, y, n_out, &err) == KT_OK, "%s", err.msg);
        KT_CHECK(kt_onednn_gemm_bf16(n_in, wb, n_in, n_out, a, n_in, n_tok, y, n_out, &err) == KT_OK, "%s", err.msg);
    }
    const int after = thread_count();
    KT_CHECK(after == before, "threads before %d, after %d: oneDNN started its own", before, after);
    free(w), free(a), free(wb), free(y);
}

/*
 * kt_matmul_q sends F32 and BF16 products of 64 tokens or more over 2048
 * rows or more to oneDNN (runtime/forward/matmul.c): within the bound, not vec_dot's
 * bits everywhere (so that path is the one taken; at the scalar level it is
 * never taken; BF16 at the amx level goes to the AMX tiles instead, within
 * their bound and equal to kt_packed_bf16_amx's bits), and the same bits for
 * 1 and 3 threads (fixed 128-row slices),
 * and no thread left behind once the pools are gone.
 */
static void matmul_sends_large_float_products_to_onednn(void)
{
    const int64_t n_in = 333, n_out = 2048 + 77, n_tok = 70;
    const bool scalar = kt_cpu_kernels()->isa == KT_ISA_SCALAR;
    const int threads_before = thread_count();
    struct kt_pool *one = NULL, *three = NULL;
    kt_err err = {0};
    KT_CHECK(kt_pool_create(1, &one, &err) == KT_OK && kt_pool_create(3, &three, &err) == KT_OK, "%s",
             err.msg);
    if (!one || !three)
        goto done;
    const int types[] = {KT_TYPE_F32, KT_TYPE_BF16};
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        const int type = types[ti];
        float *wf = kt_test_xmalloc((size_t)(n_out * n_in) * sizeof *wf); /* (n_out, n_in), widened for BF16 */
        kt_bf16 *wb = kt_test_xmalloc((size_t)(n_out * n_in) * sizeof *wb);
        float *x = kt_test_xmalloc((size_t)(n_tok * n_in) * sizeof *x);
        uint8_t *xq = kt_test_xmalloc((size_t)n_tok * kt_act_row_bytes(type, n_in));
        float *y1 = kt_test_xmalloc((size_t)(n_tok * n_out) * sizeof *y1);
        float *y3 = kt_test_xmalloc((size_t)(n_tok * n_out) * sizeof *y3);
        for (int64_t i = 0; i < n_out * n_in; i++) {
            wb[i] = kt_fp32_to_bf16(kt_test_rand_normal(&g_rng));
            wf[i] = kt_bf16_to_fp32(wb[i]);
        }
        for (int64_t i = 0; i < n_tok * n_in; i++)
            x[i] = kt_test_rand_normal(&g_rng);
        const struct kt_mat m = type == KT_TYPE_F32 ? kt_mat_f32(wf, n_out, n_in)
                                                    : (struct kt_mat){.data = (const uint8_t *)wb, .type = type,
                                                                      .n_in = n_in, .n_out = n_out,
                                                                      .row_bytes = (size_t)n_in * sizeof(kt_bf16)};
        kt_quantize_rows(one, type, x, n_tok, n_in, xq);
        kt_matmul_q(one, &m, xq, n_tok, y1, n_out);
        kt_matmul_q(three, &m, xq, n_tok, y3, n_out);
        KT_CHECK(memcmp(y1, y3, (size_t)(n_tok * n_out) * sizeof *y1) == 0, "%s: 1 and 3 threads give other bits",
                 kt_type_name(type));
        const struct kt_cpu_type_kernels *k = kt_mat_kernels_for(type);
        const size_t act_bytes = kt_act_row_bytes(type, n_in);
        int bad = 0, not_vec_dot = 0;
        /* oneDNN: any float order; the amx level's BF16 tiles: two bf16 terms per activation, fp32 sums */
        const bool amx_tiles = type == KT_TYPE_BF16 && kt_cpu_kernels()->isa == KT_ISA_AMX;
        const double bound_per_mag = amx_tiles ? 0x1p-16 + (double)n_in * 0x1p-23 : (double)n_in * 0x1p-24;
        for (int64_t t = 0; t < n_tok; t++)
            for (int64_t o = 0; o < n_out; o++) {
                double mag;
                const double exact = exact_dot(wf, n_in, x, n_in, n_in, o, t, &mag);
                const float got = y1[t * n_out + o];
                bad += !(fabs((double)got - exact) <= bound_per_mag * mag + 0x1p-126);
                float want;
                k->vec_dot(n_in, &want, m.data + (size_t)o * m.row_bytes, xq + (size_t)t * act_bytes);
                not_vec_dot += memcmp(&got, &want, sizeof got) != 0;
            }
        KT_CHECK(bad == 0, "%s: %d of %lld outputs outside the bound", kt_type_name(type), bad,
                 (long long)(n_tok * n_out));
        KT_CHECK(scalar ? not_vec_dot == 0 : not_vec_dot > 0,
                 "%s: %d outputs differ from vec_dot at the %s level (oneDNN %s)", kt_type_name(type), not_vec_dot,
                 kt_isa_name(kt_cpu_kernels()->isa), scalar ? "ran at the reference level" : "was not used");
#ifdef KT_HAVE_AMX_KERNELS
        if (amx_tiles) {
            /* the amx level's BF16 goes to the tiles: the packed format's bits exactly */
            const struct kt_packed_format *f = &kt_packed_bf16_amx;
            const size_t bytes = (kt_packed_bytes(f, n_in, n_out) + 63) / 64 * 64;
            void *packed = aligned_alloc(64, bytes);
            float *yt = kt_test_xmalloc((size_t)(n_tok * n_out) * sizeof *yt);
            KT_CHECK(packed != NULL, "no memory for the packed matrix");
            if (packed) {
                f->pack(n_in, m.data, m.row_bytes, n_out, packed);
                f->gemm(n_in, packed, n_out, xq, act_bytes, n_tok, yt, n_out);
                KT_CHECK(memcmp(yt, y1, (size_t)(n_tok * n_out) * sizeof *yt) == 0,
                         "bf16 at the amx level: not the AMX tiles' bits");
            }
            free(packed), free(yt);
        }
#endif
        free(wf), free(wb), free(x), free(xq), free(y1), free(y3);
    }
done:
    kt_pool_destroy(one);
    kt_pool_destroy(three);
    KT_CHECK(thread_count() == threads_before, "threads before %d, after the pools are gone %d: oneDNN started its own",
             threads_before, thread_count());
}


/*
 * FP8_B128 products of that size go to the AMX tiles at the amx level (the
 * packed format's bits, within its bound, the same for 1 and 3 threads) and
 * to the table's gemm everywhere else (vec_dot's bits: oneDNN has no FP8).
 */
static void matmul_sends_large_fp8_products_to_the_amx_tiles(void)
{
    const int64_t n_in = 384, n_out = 2048 + 77, n_tok = 70;
    const int type = KT_TYPE_FP8_B128;
    const struct kt_type_traits *tr = kt_type_traits(type);
    const bool amx = kt_cpu_kernels()->isa == KT_ISA_AMX;
    struct kt_pool *one = NULL, *three = NULL;
    kt_err err = {0};
    KT_CHECK(kt_pool_create(1, &one, &err) == KT_OK && kt_pool_create(3, &three, &err) == KT_OK, "%s",
             err.msg);
    const size_t row_bytes = kt_type_row_bytes(type, n_in), act_bytes = kt_act_row_bytes(type, n_in);
    uint8_t *w = kt_test_xmalloc(row_bytes * (size_t)n_out);
    float *wf = kt_test_xmalloc((size_t)(n_out * n_in) * sizeof *wf); /* the reference's weights */
    float *x = kt_test_xmalloc((size_t)(n_tok * n_in) * sizeof *x);
    uint8_t *xq = kt_test_xmalloc((size_t)n_tok * act_bytes);
    float *y1 = kt_test_xmalloc((size_t)(n_tok * n_out) * sizeof *y1);
    float *y3 = kt_test_xmalloc((size_t)(n_tok * n_out) * sizeof *y3);
    float *yt = kt_test_xmalloc((size_t)(n_tok * n_out) * sizeof *yt);
    for (int64_t o = 0; o < n_out; o++) {
        for (int64_t i = 0; i < n_in; i++)
            wf[o * n_in + i] = kt_test_rand_normal(&g_rng);
        tr->from_float(wf + o * n_in, w + (size_t)o * row_bytes, n_in);
        tr->to_float(w + (size_t)o * row_bytes, wf + o * n_in, n_in);
    }
    for (int64_t i = 0; i < n_tok * n_in; i++)
        x[i] = kt_test_rand_normal(&g_rng);
    if (!one || !three)
        goto done;
    const struct kt_mat m = {.data = w, .type = type, .n_in = n_in, .n_out = n_out, .row_bytes = row_bytes};
    kt_quantize_rows(one, type, x, n_tok, n_in, xq);
    kt_matmul_q(one, &m, xq, n_tok, y1, n_out);
    kt_matmul_q(three, &m, xq, n_tok, y3, n_out);
    KT_CHECK(memcmp(y1, y3, (size_t)(n_tok * n_out) * sizeof *y1) == 0, "fp8: 1 and 3 threads give other bits");
    const struct kt_cpu_type_kernels *k = kt_mat_kernels_for(type);
    for (int64_t t = 0; t < n_tok; t++)
        for (int64_t o = 0; o < n_out; o++)
            k->vec_dot(n_in, &yt[t * n_out + o], w + (size_t)o * row_bytes, xq + (size_t)t * act_bytes);
#ifdef KT_HAVE_AMX_KERNELS
    if (amx) {
        const struct kt_packed_format *f = &kt_packed_fp8_b128_amx;
        void *packed = aligned_alloc(64, (kt_packed_bytes(f, n_in, n_out) + 63) / 64 * 64);
        KT_CHECK(packed != NULL, "no memory for the packed matrix");
        if (packed) {
            f->pack(n_in, w, row_bytes, n_out, packed);
            f->gemm(n_in, packed, n_out, xq, act_bytes, n_tok, yt, n_out);
        }
        free(packed);
    }
#endif
    KT_CHECK(memcmp(yt, y1, (size_t)(n_tok * n_out) * sizeof *yt) == 0, "fp8 at the %s level: not %s bits",
             kt_isa_name(kt_cpu_kernels()->isa), amx ? "the AMX tiles'" : "vec_dot's");
    int bad = 0;
    const double steps = (double)n_in + 2.0 * (double)n_in / KT_QK_FP8;
    for (int64_t t = 0; t < n_tok; t++)
        for (int64_t o = 0; o < n_out; o++) {
            double mag;
            const double exact = exact_dot(wf, n_in, x, n_in, n_in, o, t, &mag);
            bad += !(fabs((double)y1[t * n_out + o] - exact) <= (0x1p-16 + 0x1p-23 + steps * 0x1p-23) * mag + 0x1p-126);
        }
    KT_CHECK(bad == 0, "fp8: %d of %lld outputs outside the bound", bad, (long long)(n_tok * n_out));
done:
    free(w), free(wf), free(x), free(xq), free(y1), free(y3), free(yt);
    kt_pool_destroy(one);
    kt_pool_destroy(three);
}
int main(void)
{
    KT_RUN(calls_start_no_threads);
    KT_RUN(products_are_dot_products_within_the_stated_bound);
    KT_RUN(empty_products_are_zero_and_bad_shapes_are_refused);
    KT_RUN(matmul_sends_large_float_products_to_onednn);
    KT_RUN(matmul_sends_large_fp8_products_to_the_amx_tiles);
    return kt_test_finish();
}
