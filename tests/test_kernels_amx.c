/*
 * test_kernels_amx.c - the AMX packed formats (kernels/cpu/amx) against the
 * scalar reference, through the tile emulator on any CPU with AVX-512 and
 * through the real tiles where the CPU has AMX.
 *
 * First the emulator itself: its instructions against hand-worked cases of
 * the SDM's semantics (wrapping int32 sums, signed/unsigned bytes, per-step
 * rounding and DAZ/FTZ of TDPBF16PS) and its faults where the CPU raises #UD.
 * Then the formats (tests/amx_emulated.c builds packed_amx.c with emulated
 * tiles, which take every token count; the real ones hand decode-sized calls
 * to the AVX-512 kernels over the same layouts, and the .tiles formats do
 * not): Q8_0, Q4_0 and Q4_K must equal kt_vec_dot_*_ref bit for bit for every
 * (row, token) pair on odd shapes; BF16, whose activations are split into
 * two bf16 terms (hi = bf16(a), lo = bf16(a - hi)) and summed in fp32, must
 * stay within
 *     |y - ref| <= (2^-16 + n * 2^-23) * sum_i |w_i * a_i|
 * of the f32 reference and within n * 2^-23 * sum_i |w_i| (|hi_i| + |lo_i|)
 * of the exact sum on the two terms (the tight bound catches layout
 * mistakes).  Every format must leave outputs outside n_rows x n_tok alone,
 * touch nothing past its buffers (each ends at a guard page, and activation
 * rows are padded with NaN), define every byte it packs, serve row slices by
 * whole groups, and give a token the same floats whatever batch it is in.
 */
#include "testlib.h"

#define KT_AMX_EMULATE 1
#include "cpu/amx/amx_ops.h"
#include "cpu/amx/packed_amx.h"
#include "cpu/dispatch.h"
#include "hf_formats.h"
#include "quant.h"

#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#ifdef KT_TEST_AMX_EMULATED /* tests/amx_emulated.c, with the avx512 level's flags */
extern const struct kt_packed_format kt_packed_q8_0_amx_emulated;
extern const struct kt_packed_format kt_packed_q4_0_amx_emulated;
extern const struct kt_packed_format kt_packed_q4_K_amx_emulated;
extern const struct kt_packed_format kt_packed_bf16_amx_emulated;
extern const struct kt_packed_format kt_packed_fp8_b128_amx_emulated;
#endif

/* ---------------------------------------------------------------------------- */
/* helpers                                                                       */
/* ---------------------------------------------------------------------------- */

static unsigned long long g_rng = 0x616d78746b74ULL;

static uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static void put_fp16(uint8_t *p, float v)
{
    const kt_fp16 h = kt_fp32_to_fp16(v);
    memcpy(p, &h, sizeof h);
}

static uint8_t rand_byte(void)
{
    return (uint8_t)kt_test_rand_u64(&g_rng);
}

/* An emulated register file with tiles (rows, colsb) configured. */
static void configure(struct kt_amx_tiles *s, const int shape[][2], int n_tiles)
{
    struct kt_amx_tilecfg cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < n_tiles; t++) {
        cfg.rows[t] = (uint8_t)shape[t][0];
        cfg.colsb[t] = (uint16_t)shape[t][1];
    }
    kt_amx_config(s, &cfg);
}

/* ---------------------------------------------------------------------------- */
/* the emulator follows the SDM                                                  */
/* ---------------------------------------------------------------------------- */

/* C (3 x 5 dwords) += A (3 x 3 dwords) . B (3 x 5 dwords), four byte
 * products per dword pair, int32 wrapping; A signed (TDPBSSD) or unsigned
 * (TDPBUSD); loads zero what lies past rows x colsb, stores write only it. */
static void emulated_int8_tiles_follow_the_sdm(void)
{
    enum { M = 3, K = 3, N = 5 };
    const int shape[3][2] = {{M, 4 * K}, {K, 4 * N}, {M, 4 * N}}; /* A, B, C */
    uint8_t a[M][64], b[K][64];
    int32_t c0[M][16];
    for (int pass = 0; pass < 2; pass++) {
        const bool a_unsigned = pass == 1;
        for (int m = 0; m < M; m++)
            for (int i = 0; i < 64; i++)
                a[m][i] = rand_byte(); /* bytes past colsb too: the load must not take them */
        for (int k = 0; k < K; k++)
            for (int i = 0; i < 64; i++)
                b[k][i] = rand_byte();
        for (int m = 0; m < M; m++)
            for (int n = 0; n < 16; n++)
                c0[m][n] = (int32_t)(uint32_t)kt_test_rand_u64(&g_rng);
        c0[0][0] = INT32_MAX; /* and a sum that must wrap: */
        memset(a[0], 0x7f, 4 * K);
        for (int k = 0; k < K; k++)
            memset(&b[k][0], 0x7f, 4);

        struct kt_amx_tiles s;
        configure(&s, shape, 3);
        kt_amx_load(&s, 0, a, 64);
        kt_amx_load(&s, 1, b, 64);
        kt_amx_load(&s, 2, c0, 64);
        bool clean = true;
        for (int t = 0; t < 3; t++)
            for (int r = 0; r < KT_AMX_MAX_ROWS; r++)
                for (int i = 0; i < KT_AMX_MAX_COLSB; i++)
                    if ((r >= shape[t][0] || i >= shape[t][1]) && s.tile[t][r][i])
                        clean = false;
        KT_CHECK(clean, "a tile load kept bytes past its rows x colsb");
        if (a_unsigned)
            kt_amx_dpbusd(&s, 2, 0, 1);
        else
            kt_amx_dpbssd(&s, 2, 0, 1);
        int32_t got[M][8];
        memset(got, 0x5a, sizeof got);
        kt_amx_store(&s, 2, got, sizeof got[0]);
        int wrong = 0;
        for (int m = 0; m < M; m++) {
            for (int n = 0; n < N; n++) {
                uint32_t want = (uint32_t)c0[m][n];
                for (int k = 0; k < K; k++)
                    for (int i = 0; i < 4; i++) {
                        const int32_t x = a_unsigned ? (int32_t)a[m][4 * k + i] : (int32_t)(int8_t)a[m][4 * k + i];
                        want += (uint32_t)(x * (int32_t)(int8_t)b[k][4 * n + i]);
                    }
                wrong += (uint32_t)got[m][n] != want;
            }
            for (int n = N; n < 8; n++)
                wrong += (uint32_t)got[m][n] != 0x5a5a5a5au; /* past colsb: not written */
        }
        KT_CHECK(wrong == 0, "%s: %d dwords differ from the SDM's sums", a_unsigned ? "tdpbusd" : "tdpbssd", wrong);
        const uint32_t wrapped = (uint32_t)INT32_MAX + 4u * K * 127u * 127u;
        KT_CHECK(!a_unsigned ? (uint32_t)got[0][0] == wrapped : true, "tdpbssd did not wrap: %u, want %u",
                 (unsigned)got[0][0], (unsigned)wrapped);
        kt_amx_zero(&s, 2);
        kt_amx_store(&s, 2, got, sizeof got[0]);
        KT_CHECK(got[M - 1][N - 1] == 0 && got[0][0] == 0, "tilezero left a value");
        kt_amx_release(&s);
    }
}

static kt_bf16 bf16_of(float f)
{
    return kt_fp32_to_bf16(f);
}

/* One C element (1 x 1) += the K pairs of A's row . B's column. */
static float emulated_bf16_dot(float c_in, const kt_bf16 *a_pairs, const kt_bf16 *b_pairs, int K)
{
    const int shape[3][2] = {{1, 4 * K}, {K, 4}, {1, 4}};
    struct kt_amx_tiles s;
    uint8_t b[16][4];
    for (int k = 0; k < K; k++)
        memcpy(b[k], &b_pairs[2 * k], 4);
    configure(&s, shape, 3);
    kt_amx_load(&s, 0, a_pairs, 64);
    kt_amx_load(&s, 1, b, 4);
    kt_amx_load(&s, 2, &c_in, 4);
    kt_amx_dpbf16ps(&s, 2, 0, 1);
    float out;
    kt_amx_store(&s, 2, &out, 4);
    kt_amx_release(&s);
    return out;
}

/* TDPBF16PS: products in pair order, each accumulation rounded to nearest
 * even on its own; denormal inputs read as zero, denormal results flushed. */
static void emulated_bf16_tiles_round_each_accumulation(void)
{
    /* pairing: (1,2 | 3,4) . (5,6 | 7,8) */
    const kt_bf16 a1[4] = {bf16_of(1), bf16_of(2), bf16_of(3), bf16_of(4)};
    const kt_bf16 b1[4] = {bf16_of(5), bf16_of(6), bf16_of(7), bf16_of(8)};
    const float d1 = emulated_bf16_dot(0.5f, a1, b1, 2);
    KT_CHECK(d1 == 70.5f, "0.5 + 1*5 + 2*6 + 3*7 + 4*8 = %g, want 70.5", d1);

    /* 1 + 4 * 2^-24: each step alone is a tie that rounds back to 1 */
    const kt_bf16 t = bf16_of(ldexpf(1.0f, -12));
    const kt_bf16 a2[4] = {t, t, t, t}, b2[4] = {t, t, t, t};
    const float d2 = emulated_bf16_dot(1.0f, a2, b2, 2);
    KT_CHECK(d2 == 1.0f, "1 + 4 * 2^-24 accumulated one step at a time = %.9g, want 1", d2);

    /* a denormal bf16 (2^-133) times 2^100 is read as 0 */
    const kt_bf16 a3[2] = {0x0001, 0}, b3[2] = {bf16_of(ldexpf(1.0f, 100)), 0};
    const float d3 = emulated_bf16_dot(0.0f, a3, b3, 1);
    KT_CHECK(f32_bits(d3) == 0, "denormal input not treated as zero: %g", d3);

    /* -2^-70 * 2^-70 = -2^-140, a denormal result, flushed to -0 (the pair's
     * second product, so no +0 step follows to turn it into +0) */
    const kt_bf16 a4[2] = {0, bf16_of(-ldexpf(1.0f, -70))}, b4[2] = {0, bf16_of(ldexpf(1.0f, -70))};
    const float d4 = emulated_bf16_dot(0.0f, a4, b4, 1);
    KT_CHECK(f32_bits(d4) == 0x80000000u, "denormal result not flushed to -0: %g (bits %08x)", d4,
             (unsigned)f32_bits(d4));
}

/* Runs bad(s) in a child; true if it aborted (the CPU's #UD). */
static bool aborts(void (*bad)(void))
{
    fflush(NULL);
    const pid_t pid = fork();
    if (pid == 0) {
        if (!freopen("/dev/null", "w", stderr))
            _exit(3);
        bad();
        _exit(0);
    }
    int status = 0;
    if (pid < 0 || waitpid(pid, &status, 0) != pid)
        return false;
    return WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT;
}

static void load_before_config(void)
{
    struct kt_amx_tiles s;
    uint8_t buf[64] = {0};
    memset(&s, 0, sizeof s);
    kt_amx_load(&s, 0, buf, 64);
}

static void dot_with_mismatched_k(void)
{
    const int shape[3][2] = {{4, 32}, {4, 64}, {4, 64}}; /* A has 8 dwords per row, B 4 rows */
    struct kt_amx_tiles s;
    configure(&s, shape, 3);
    kt_amx_dpbssd(&s, 2, 0, 1);
}

static void dot_with_mismatched_m(void)
{
    const int shape[3][2] = {{4, 32}, {8, 64}, {5, 64}};
    struct kt_amx_tiles s;
    configure(&s, shape, 3);
    kt_amx_dpbssd(&s, 2, 0, 1);
}

static void dot_reusing_a_tile(void)
{
    const int shape[2][2] = {{16, 64}, {16, 64}};
    struct kt_amx_tiles s;
    configure(&s, shape, 2);
    kt_amx_dpbf16ps(&s, 1, 0, 0);
}

static void dot_after_release(void)
{
    const int shape[3][2] = {{4, 32}, {8, 64}, {4, 64}};
    struct kt_amx_tiles s;
    configure(&s, shape, 3);
    kt_amx_release(&s);
    kt_amx_dpbssd(&s, 2, 0, 1);
}

static void valid_dot(void)
{
    const int shape[3][2] = {{4, 32}, {8, 64}, {4, 64}};
    struct kt_amx_tiles s;
    configure(&s, shape, 3);
    kt_amx_dpbssd(&s, 2, 0, 1);
    kt_amx_release(&s);
}

static void emulated_tiles_fault_where_the_cpu_would(void)
{
    KT_CHECK(!aborts(valid_dot), "a valid configuration faulted");
    KT_CHECK(aborts(load_before_config), "tileloadd without ldtilecfg did not fault");
    KT_CHECK(aborts(dot_with_mismatched_k), "A's K != B's rows did not fault");
    KT_CHECK(aborts(dot_with_mismatched_m), "C's rows != A's rows did not fault");
    KT_CHECK(aborts(dot_reusing_a_tile), "a dot product with A == B did not fault");
    KT_CHECK(aborts(dot_after_release), "a dot product after tilerelease did not fault");
}

/* ---------------------------------------------------------------------------- */
/* the packed formats against the reference                                      */
/* ---------------------------------------------------------------------------- */

#ifdef KT_TEST_AMX_EMULATED

static const float SENTINEL = -12345.678f;

/*
 * Weight row r of n elements in the GGUF layout.  kind 0: gaussian values
 * with outliers, quantized; kind 1 (Q8_0, Q4_0, Q4_K): random bits with
 * finite scales; kind 2: every code at its extreme (Q8_0 -128, Q4_0 code 0
 * (-8) or, every other such row, 15 (+7); Q4_K nibble 15 with every 6-bit
 * scale and min 63) and d random in [0.5, 1): against make_act's
 * all-positive tokens the block sums are large and carry low bits, so a
 * product associated otherwise than the reference's (dw * da) * sumi rounds
 * differently.  BF16 rows are kind 0, scaled by 2^(r%5-2).
 */
static void make_row(int type, int64_t n, int64_t r, uint8_t *w)
{
    const struct kt_type_traits *tr = kt_type_traits(type);
    const int kind = type == KT_TYPE_BF16 || type == KT_TYPE_FP8_B128 ? 0 : (int)(r % 3);
    if (kind == 0) {
        float *x = kt_test_xmalloc((size_t)n * sizeof *x);
        const float scale = ldexpf(0.5f, (int)(r % 5) - 2);
        for (int64_t i = 0; i < n; i++)
            x[i] = scale * kt_test_rand_normal(&g_rng) * (kt_test_rand_u64(&g_rng) % 64 == 0 ? 30.0f : 1.0f);
        tr->from_float(x, w, n);
        free(x);
        return;
    }
    for (int64_t b = 0; b < n / tr->block_elems; b++) {
        uint8_t *blk = w + (size_t)b * tr->block_bytes;
        for (size_t i = 0; i < tr->block_bytes; i++)
            blk[i] = kind == 1                ? rand_byte()
                     : type == KT_TYPE_Q8_0   ? 0x80
                     : type == KT_TYPE_Q4_0   ? (r % 2 ? 0xff : 0x00)
                                              : 0xff;
        /* d: first in every block type here */
        put_fp16(blk, kind == 1 ? 0.05f * kt_test_rand_normal(&g_rng) : kt_test_rand_uniform(&g_rng, 0.5f, 1.0f));
        if (type == KT_TYPE_Q4_K)
            put_fp16(blk + 2, kind == 1 ? 0.05f * kt_test_rand_normal(&g_rng) : 0.5f); /* dmin */
    }
}

/* Activation t (F32): gaussian with outliers; every 4th token all +-1 (every
 * quant at its limit); every 6th (from t = 5) all in [0.5, 1) (quants 64 ..
 * 127, large block sums); every 5th with its first half zero. */
static void make_act(int64_t n, int64_t t, float *x)
{
    for (int64_t i = 0; i < n; i++) {
        x[i] = kt_test_rand_normal(&g_rng) * (kt_test_rand_u64(&g_rng) % 100 == 0 ? 50.0f : 1.0f);
        if (t % 4 == 3)
            x[i] = kt_test_rand_u64(&g_rng) & 1 ? 1.0f : -1.0f;
        if (t % 6 == 5)
            x[i] = kt_test_rand_uniform(&g_rng, 0.5f, 1.0f);
        if (t % 5 == 4 && i < n / 2)
            x[i] = 0.0f;
    }
}

/* bytes that end where an inaccessible page begins: a kernel reading or
 * writing one byte past them crashes the test.  The start is as aligned as
 * bytes is (64 for a packed matrix). */
static size_t page_round(size_t bytes)
{
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    return (bytes + page - 1) / page * page;
}

static void *guarded_alloc(size_t bytes)
{
    const size_t span = page_round(bytes), page = (size_t)sysconf(_SC_PAGESIZE);
    uint8_t *base = mmap(NULL, span + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base == MAP_FAILED || mprotect(base + span, page, PROT_NONE) != 0)
        exit(2);
    return base + span - bytes;
}

static void guarded_free(void *p, size_t bytes)
{
    const size_t span = page_round(bytes);
    munmap((uint8_t *)p + bytes - span, span + (size_t)sysconf(_SC_PAGESIZE));
}

/* One problem: GGUF rows (padded), activations as quantize_act wrote them
 * (rows padded with NaN bytes, which poison any product that reads them),
 * the packed matrix 64-byte aligned; each ends at a guard page. */
struct problem {
    int type;
    int64_t n, n_rows, n_tok;
    size_t row_bytes, act_bytes, packed_bytes;
    uint8_t *w, *a, *packed;
};

static void problem_make(struct problem *p, const struct kt_packed_format *f, int type, int64_t n, int64_t n_rows,
                         int64_t n_tok)
{
    const struct kt_type_traits *tr = kt_type_traits(type);
    p->type = type;
    p->n = n;
    p->n_rows = n_rows;
    p->n_tok = n_tok;
    p->row_bytes = kt_type_row_bytes(type, n) + 8;
    p->act_bytes = kt_type_row_bytes(tr->vec_dot_type, n) + 4;
    p->packed_bytes = kt_packed_bytes(f, n, n_rows);
    p->w = guarded_alloc(p->row_bytes * (size_t)n_rows);
    p->a = guarded_alloc(p->act_bytes * (size_t)n_tok);
    p->packed = guarded_alloc(p->packed_bytes);
    memset(p->a, 0xff, p->act_bytes * (size_t)n_tok);
    float *x = kt_test_xmalloc((size_t)n * sizeof *x);
    for (int64_t r = 0; r < n_rows; r++)
        make_row(type, n, r, p->w + (size_t)r * p->row_bytes);
    for (int64_t t = 0; t < n_tok; t++) {
        make_act(n, t, x);
        kt_type_traits(tr->vec_dot_type)->from_float(x, p->a + (size_t)t * p->act_bytes, n);
    }
    free(x);
    memset(p->packed, 0xa5, p->packed_bytes);
    f->pack(n, p->w, p->row_bytes, n_rows, p->packed);
}

static void problem_free(struct problem *p)
{
    guarded_free(p->w, p->row_bytes * (size_t)p->n_rows);
    guarded_free(p->a, p->act_bytes * (size_t)p->n_tok);
    guarded_free(p->packed, p->packed_bytes);
}

/* Per format, over all its shapes. */
struct tally {
    int outputs, differ, nonzero, clobbered;
    double worst_vs_ref, worst_vs_rounded; /* BF16: error / its bound, the worst seen */
};

/* For BF16 row r, token t: the exact sum on the kernel's two bf16 terms of
 * each activation (hi = bf16(a), lo = bf16(a - hi)), its sum of |products|,
 * and sum |w_i a_i|. */
static void bf16_bounds(const struct problem *p, int64_t r, int64_t t, double *rounded_sum, double *abs_ref,
                        double *abs_rounded)
{
    const kt_bf16 *w = (const void *)(p->w + (size_t)r * p->row_bytes);
    const float *a = (const void *)(p->a + (size_t)t * p->act_bytes);
    double s = 0, ar = 0, arr = 0;
    for (int64_t i = 0; i < p->n; i++) {
        const float hi = kt_bf16_to_fp32(kt_fp32_to_bf16(a[i]));
        const float lo = kt_bf16_to_fp32(kt_fp32_to_bf16(a[i] - hi));
        const double wi = kt_bf16_to_fp32(w[i]);
        s += wi * hi + wi * lo;
        ar += fabs(wi * a[i]);
        arr += fabs(wi * hi) + fabs(wi * lo);
    }
    *rounded_sum = s;
    *abs_ref = ar;
    *abs_rounded = arr;
}

/* FP8_B128's version of bf16_bounds: the exact sum on the kernel's terms,
 * sum_b d_b * sum e4m3(q_i) * (hi_i + lo_i), and sum |w_i a_i| with w_i the
 * reference's fp32(e4m3(q_i) * d_b). */
static void fp8_bounds(const struct problem *p, int64_t r, int64_t t, double *rounded_sum, double *abs_ref,
                       double *abs_rounded)
{
    const struct kt_block_fp8_b128 *w = (const void *)(p->w + (size_t)r * p->row_bytes);
    const float *a = (const void *)(p->a + (size_t)t * p->act_bytes);
    double s = 0, ar = 0, arr = 0;
    for (int64_t i = 0; i < p->n; i++) {
        const struct kt_block_fp8_b128 *b = &w[i / KT_QK_FP8];
        const double e = kt_fp8_e4m3_to_f32(b->q[i % KT_QK_FP8]), d = b->d;
        const float hi = kt_bf16_to_fp32(kt_fp32_to_bf16(a[i]));
        const float lo = kt_bf16_to_fp32(kt_fp32_to_bf16(a[i] - hi));
        s += d * e * hi + d * e * lo;
        ar += fabs((double)(float)(e * d) * a[i]);
        arr += fabs(d * e * hi) + fabs(d * e * lo);
    }
    *rounded_sum = s;
    *abs_ref = ar;
    *abs_rounded = arr;
}

/* Runs the format on one shape and compares every pair with the reference. */
static void check_shape(const struct kt_packed_format *f, int type, int64_t n, int64_t n_rows, int64_t n_tok,
                        struct tally *tl)
{
    struct problem p;
    problem_make(&p, f, type, n, n_rows, n_tok);
    const int64_t y_stride = n_rows + 3;
    const size_t y_bytes = (size_t)(y_stride * n_tok) * sizeof(float);
    float *y = guarded_alloc(y_bytes);
    for (int64_t i = 0; i < y_stride * n_tok; i++)
        y[i] = SENTINEL;
    f->gemm(n, p.packed, n_rows, p.a, p.act_bytes, n_tok, y, y_stride);
    const kt_vec_dot_fn ref = kt_type_traits(type)->vec_dot;
    for (int64_t t = 0; t < n_tok; t++)
        for (int64_t r = 0; r < y_stride; r++) {
            const float got = y[t * y_stride + r];
            if (r >= n_rows) {
                tl->clobbered += f32_bits(got) != f32_bits(SENTINEL);
                continue;
            }
            float want = NAN;
            ref(n, &want, p.w + (size_t)r * p.row_bytes, p.a + (size_t)t * p.act_bytes);
            tl->outputs++;
            tl->nonzero += want != 0.0f;
            bool bad;
            if (f->exact) {
                bad = f32_bits(got) != f32_bits(want);
            } else {
                double rounded, abs_ref, abs_rounded;
                /* FP8: each block's sum is scaled and added once more, and the
                 * reference's own weights are rounded (2^-24 each) */
                const bool fp8 = type == KT_TYPE_FP8_B128;
                (fp8 ? fp8_bounds : bf16_bounds)(&p, r, t, &rounded, &abs_ref, &abs_rounded);
                const double steps = (double)n + (fp8 ? 2.0 * (double)n / KT_QK_FP8 : 0.0);
                const double bound_ref = (ldexp(1, -16) + (fp8 ? ldexp(1, -23) : 0) + steps * ldexp(1, -23)) * abs_ref + 1e-30;
                const double bound_rounded = steps * ldexp(1, -23) * abs_rounded + 1e-30;
                const double e_ref = fabs((double)got - want) / bound_ref;
                const double e_rounded = fabs((double)got - rounded) / bound_rounded;
                tl->worst_vs_ref = fmax(tl->worst_vs_ref, e_ref);
                tl->worst_vs_rounded = fmax(tl->worst_vs_rounded, e_rounded);
                bad = !(e_ref <= 1.0 && e_rounded <= 1.0);
            }
            if (bad && tl->differ++ < 3)
                fprintf(stderr, "  %s n=%lld rows=%lld tok=%lld: y[%lld][%lld] = %.9g, reference %.9g\n", f->name,
                        (long long)n, (long long)n_rows, (long long)n_tok, (long long)t, (long long)r, got, want);
        }
    guarded_free(y, y_bytes);
    problem_free(&p);
}

/* pack defines every byte (two packs over different garbage agree), groups
 * are whole 64-byte lines, and a row slice from a group boundary on gives
 * the full run's floats; so does one token run alone (no batch dependence). */
static void check_slices(const struct kt_packed_format *f, int type, int64_t n)
{
    const int64_t n_rows = 37, n_tok = 21;
    struct problem p;
    problem_make(&p, f, type, n, n_rows, n_tok);
    const size_t bytes = p.packed_bytes;
    uint8_t *again = guarded_alloc(bytes);
    memset(again, 0x5a, bytes);
    f->pack(n, p.w, p.row_bytes, n_rows, again);
    KT_CHECK(memcmp(again, p.packed, bytes) == 0, "%s n=%lld: pack leaves bytes undefined", f->name, (long long)n);
    KT_CHECK(f->group_bytes(n) % 64 == 0, "%s n=%lld: group of %zu bytes", f->name, (long long)n, f->group_bytes(n));
    guarded_free(again, bytes);

    float *full = kt_test_xmalloc((size_t)(n_rows * n_tok) * sizeof *full);
    float *part = kt_test_xmalloc((size_t)(n_rows * n_tok) * sizeof *part);
    f->gemm(n, p.packed, n_rows, p.a, p.act_bytes, n_tok, full, n_rows);
    const int64_t first = f->rows; /* the second group on */
    f->gemm(n, kt_packed_rows(f, p.packed, n, first), n_rows - first, p.a, p.act_bytes, n_tok, part, n_rows);
    int differ = 0;
    for (int64_t t = 0; t < n_tok; t++)
        for (int64_t r = first; r < n_rows; r++)
            differ += f32_bits(part[t * n_rows + r - first]) != f32_bits(full[t * n_rows + r]);
    KT_CHECK(differ == 0, "%s n=%lld: %d outputs of a row slice differ from the full run", f->name, (long long)n,
             differ);
    differ = 0;
    for (int64_t t = 0; t < n_tok; t += 5) {
        f->gemm(n, p.packed, n_rows, p.a + (size_t)t * p.act_bytes, p.act_bytes, 1, part, n_rows);
        for (int64_t r = 0; r < n_rows; r++)
            differ += f32_bits(part[r]) != f32_bits(full[t * n_rows + r]);
    }
    KT_CHECK(differ == 0, "%s n=%lld: %d outputs of a token run alone differ from its batch's", f->name,
             (long long)n, differ);
    free(full);
    free(part);
    problem_free(&p);
}

/* Every shape of the brief for one format; then the verdict. */
static void check_format(const struct kt_packed_format *f, int type, const int64_t *ns, int n_ns)
{
    const int64_t rows[] = {1, 15, 17, 33}, toks[] = {1, 3, 15, 16, 17, 40};
    struct tally tl = {0};
    KT_CHECK(f->rows == 16, "%s: %u rows per group", f->name, f->rows);
    for (int ni = 0; ni < n_ns; ni++) {
        for (size_t ri = 0; ri < sizeof rows / sizeof rows[0]; ri++)
            for (size_t ti = 0; ti < sizeof toks / sizeof toks[0]; ti++)
                check_shape(f, type, ns[ni], rows[ri], toks[ti], &tl);
        check_slices(f, type, ns[ni]);
    }
    check_shape(f, type, ns[0], 48, 70, &tl); /* past one 64-token chunk, whole groups */
    KT_CHECK(tl.differ == 0, "%s: %d of %d outputs %s", f->name, tl.differ, tl.outputs,
             f->exact ? "differ from the reference" : "outside the bf16 tolerance");
    KT_CHECK(tl.clobbered == 0, "%s: %d outputs past n_rows written", f->name, tl.clobbered);
    KT_CHECK(tl.nonzero > tl.outputs / 2, "%s: only %d of %d reference outputs nonzero", f->name, tl.nonzero,
             tl.outputs);
    if (!f->exact)
        printf("  info: %s worst error / bound: %.3g vs the f32 reference, %.3g vs the exact sum on the two bf16 "
               "terms\n",
               f->name, tl.worst_vs_ref, tl.worst_vs_rounded);
}

static const int64_t q8_0_ns[] = {32, 96, 2048};
static const int64_t q4_0_ns[] = {32, 96, 2048, 7168}; /* 7168: Kimi-K2's hidden size */
static const int64_t q4_K_ns[] = {256, 512, 7168};
static const int64_t bf16_ns[] = {64, 96, 100, 120, 7168}; /* any n: K steps of 32, zero-padded */
static const int64_t fp8_ns[] = {128, 384, 7168}; /* blocks of 128 */
#define COUNT(a) ((int)(sizeof(a) / sizeof((a)[0])))

static void emulated_q8_0_equals_the_reference_bit_for_bit(void)
{
    check_format(&kt_packed_q8_0_amx_emulated, KT_TYPE_Q8_0, q8_0_ns, COUNT(q8_0_ns));
}

static void emulated_q4_0_equals_the_reference_bit_for_bit(void)
{
    check_format(&kt_packed_q4_0_amx_emulated, KT_TYPE_Q4_0, q4_0_ns, COUNT(q4_0_ns));
}

static void emulated_q4_K_equals_the_reference_bit_for_bit(void)
{
    check_format(&kt_packed_q4_K_amx_emulated, KT_TYPE_Q4_K, q4_K_ns, COUNT(q4_K_ns));
}

static void emulated_bf16_stays_within_the_bf16_tolerance(void)
{
    check_format(&kt_packed_bf16_amx_emulated, KT_TYPE_BF16, bf16_ns, COUNT(bf16_ns));
}

static void emulated_fp8_stays_within_its_tolerance(void)
{
    check_format(&kt_packed_fp8_b128_amx_emulated, KT_TYPE_FP8_B128, fp8_ns, COUNT(fp8_ns));
}

/* The same checks on the real tiles, where the CPU (and kernel) allow AMX. */
static void real_tiles_equal_the_reference(void)
{
    const struct kt_cpu_kernels *amx = kt_cpu_kernels_for(KT_ISA_AMX);
    if (!amx) {
        printf("  skipped: no AMX (the emulated tiles were tested)\n");
        return;
    }
    const struct kt_packed_format *q8_0 = amx->type[KT_TYPE_Q8_0].packed;
    const struct kt_packed_format *q4_0 = amx->type[KT_TYPE_Q4_0].packed;
    const struct kt_packed_format *q4_K = amx->type[KT_TYPE_Q4_K].packed;
    if (!q8_0 || !q4_0 || !q4_K || !strstr(q8_0->name, ".amx") || !strstr(q4_0->name, ".amx") ||
        !strstr(q4_K->name, ".amx")) {
        printf("  skipped: kt was built without AMX kernels (the compiler lacks -mamx-*)\n");
        return;
    }
    check_format(q8_0, KT_TYPE_Q8_0, q8_0_ns, COUNT(q8_0_ns));
    check_format(q4_0, KT_TYPE_Q4_0, q4_0_ns, COUNT(q4_0_ns));
    check_format(q4_K, KT_TYPE_Q4_K, q4_K_ns, COUNT(q4_K_ns));
#ifdef KT_HAVE_AMX_KERNELS
    /* BF16: built, not in the level's table (kernels/cpu/dispatch.c, fill_amx) */
    KT_CHECK(amx->type[KT_TYPE_BF16].packed != &kt_packed_bf16_amx, "the amx level packs BF16 for its tiles");
    check_format(&kt_packed_bf16_amx, KT_TYPE_BF16, bf16_ns, COUNT(bf16_ns));
    check_format(&kt_packed_fp8_b128_amx, KT_TYPE_FP8_B128, fp8_ns, COUNT(fp8_ns));
    /* the tiles at every token count (the formats above hand decode-sized calls to AVX-512) */
    check_format(&kt_packed_q8_0_amx_tiles, KT_TYPE_Q8_0, q8_0_ns, COUNT(q8_0_ns));
    check_format(&kt_packed_q4_0_amx_tiles, KT_TYPE_Q4_0, q4_0_ns, COUNT(q4_0_ns));
    check_format(&kt_packed_q4_K_amx_tiles, KT_TYPE_Q4_K, q4_K_ns, COUNT(q4_K_ns));
#endif
}

/* The amx level's integer formats read the avx512 level's layouts (one packed
 * copy serves both kernels): the same bytes for the same rows. */
static void integer_formats_share_the_avx512_layouts(void)
{
    const struct kt_cpu_kernels *avx512 = kt_cpu_kernels_for(KT_ISA_AVX512);
    const int types[] = {KT_TYPE_Q8_0, KT_TYPE_Q4_0, KT_TYPE_Q4_K};
    const struct kt_packed_format *amx[] = {&kt_packed_q8_0_amx_emulated, &kt_packed_q4_0_amx_emulated,
                                            &kt_packed_q4_K_amx_emulated};
    for (int i = 0; i < 3; i++) {
        const struct kt_packed_format *ref = avx512->type[types[i]].packed;
        const int64_t n = types[i] == KT_TYPE_Q4_K ? 512 : 96, n_rows = 21;
        struct problem p;
        problem_make(&p, amx[i], types[i], n, n_rows, 1);
        KT_CHECK(ref && strstr(ref->name, ".avx512") && ref->group_bytes(n) == amx[i]->group_bytes(n),
                 "%s: group bytes differ from the avx512 format's", amx[i]->name);
        uint8_t *theirs = guarded_alloc(p.packed_bytes);
        ref->pack(n, p.w, p.row_bytes, n_rows, theirs);
        KT_CHECK(memcmp(theirs, p.packed, p.packed_bytes) == 0, "%s: packs other bytes than %s", amx[i]->name,
                 ref->name);
        guarded_free(theirs, p.packed_bytes);
        problem_free(&p);
    }
}
#endif /* KT_TEST_AMX_EMULATED */

int main(void)
{
    KT_RUN(emulated_int8_tiles_follow_the_sdm);
    KT_RUN(emulated_bf16_tiles_round_each_accumulation);
    KT_RUN(emulated_tiles_fault_where_the_cpu_would);
#ifdef KT_TEST_AMX_EMULATED
    /* the emulated kernels' non-tile steps are AVX-512: nothing of theirs runs before this */
    if (!kt_cpu_kernels_for(KT_ISA_AVX512)) {
        if (kt_test_failures)
            return kt_test_finish();
        return kt_test_skip("no AVX-512");
    }
    KT_RUN(emulated_q8_0_equals_the_reference_bit_for_bit);
    KT_RUN(emulated_q4_0_equals_the_reference_bit_for_bit);
    KT_RUN(emulated_q4_K_equals_the_reference_bit_for_bit);
    KT_RUN(emulated_fp8_stays_within_its_tolerance);
    KT_RUN(emulated_bf16_stays_within_the_bf16_tolerance);
    KT_RUN(real_tiles_equal_the_reference);
    KT_RUN(integer_formats_share_the_avx512_layouts);
    return kt_test_finish();
#else
    if (kt_test_failures)
        return kt_test_finish();
    return kt_test_skip("not an x86-64 build (the AMX kernels were not emulated)");
#endif
}
