/*
 * dispatch.c - fills the CPU kernel table once, from CPUID and KT_ISA.
 *
 * One table per level the CPU supports, built on first use under pthread_once
 * and never written again; this is kt's one piece of global mutable state.
 * A level's rows may only point at code whose instructions that level
 * guarantees: the table for a level above isa_max is never built, so nothing
 * can hand out an AVX2 kernel on a CPU without AVX2.
 *
 * Levels and their rows today:
 *   scalar  kernels/cpu/ref dot products, quant.c from_float for activations,
 *           ops.c's float row ops (attention scores, axpy)
 *   avx2    kernels/cpu/avx2 for F32/F16/BF16, Q8_0/Q4_0/Q5_0, Q4_K/Q5_K/Q6_K,
 *           MXFP4 and FP8_B128 (vec_dot_native_avx2.c)
 *           and the Q8_0/Q8_K quantizers; the scalar rows for the rest
 *           (Q4_1/Q5_1 against Q8_1); float row ops f32_rows_avx2.c
 *           gemm: kernels/cpu/avx2/gemm_avx2.c for Q8_0 and Q4_K,
 *           gemm_kquant_avx2.c for Q5_K and Q6_K, gemm_float_avx2.c for
 *           F32/F16/BF16, a loop over vec_dot for the rest
 *           packed: Q4_K, Q8_0 and Q4_0 expert weights 8 rows per group
 *           (kernels/cpu/avx2/packed_avx2.c)
 *   avx512  kernels/cpu/avx512 vec_dot (VNNI) for Q8_0, Q4_0, Q4_K and MXFP4,
 *           FP8_B128 (fp8_avx512.c, with a four-row gemv), and tiled gemms for Q8_0, Q4_K, Q5_K, Q6_K (VNNI),
 *           FP8_B128 and F32/F16/BF16 over the avx2
 *           rows (each level's features include AVX2's)
 *           (Q4_0's gemm: a loop over its AVX-512 vec_dot)
 *           packed: Q4_K, Q8_0 and Q4_0 expert weights 16 rows per group
 *           for vpdpbusd (kernels/cpu/avx512/packed_avx512.c)
 *   amx     the avx512 rows, with Q8_0, Q4_0 and Q4_K weights packed for
 *           AMX tiles (kernels/cpu/amx/packed_amx.c: the avx512 layouts,
 *           AVX-512 below a few tokens; its BF16 tiles are not used, see
 *           fill_amx)
 */
#include "cpu/dispatch.h"

#include "cpu/cpu_features.h"
#include "cpu/ref/ops.h"
#include "cpu/ref/vec_dot_ref.h"

#include <pthread.h>
#include <stdlib.h>
#include <strings.h>

#ifdef KT_HAVE_AVX2_KERNELS
#include "cpu/avx2/f32_rows_avx2.h"
#include "cpu/avx2/gemm_avx2.h"
#include "cpu/avx2/gemm_float_avx2.h"
#include "cpu/avx2/gemm_kquant_avx2.h"
#include "cpu/avx2/gemv_q4k_avx2.h"
#include "cpu/avx2/kernels_avx2.h"
#include "cpu/avx2/packed_avx2.h"
#endif
#ifdef KT_HAVE_AVX512_KERNELS
#include "cpu/avx512/kernels_avx512.h"
#endif

#define KT_ISA_LEVELS (KT_ISA_AMX + 1)

static struct {
    struct kt_cpu_features features;
    enum kt_isa selected;
    struct kt_cpu_kernels level[KT_ISA_LEVELS]; /* built for levels <= isa_max */
} g_cpu;
static pthread_once_t g_cpu_once = PTHREAD_ONCE_INIT;

/* ---- rows -------------------------------------------------------------------- */

/*
 * A GEMV is one vec_dot per row (bit-identical by construction); the SIMD dot
 * products prefetch past the end of their row, which here is the next row.
 */
#define KT_DEFINE_GEMV(type, vec_dot)                                                             \
    static void gemv_##vec_dot(int64_t n, float *out, const void *w, size_t row_bytes, const void *a, \
                               int64_t n_rows)                                                    \
    {                                                                                             \
        for (int64_t r = 0; r < n_rows; r++)                                                      \
            vec_dot(n, &out[r], (const char *)w + (size_t)r * row_bytes, a);                      \
    }                                                                                             \
    static void gemm_##vec_dot(int64_t n, const void *w, size_t row_bytes, int64_t n_rows, const void *a, \
                               size_t act_bytes, int64_t n_tok, float *y, int64_t y_stride)       \
    {                                                                                             \
        for (int64_t t = 0; t < n_tok; t++)                                                       \
            gemv_##vec_dot(n, &y[t * y_stride], w, row_bytes, (const char *)a + (size_t)t * act_bytes, n_rows); \
    }
#define KT_DOT_ROW(type, vec_dot) {type, vec_dot, gemv_##vec_dot, gemm_##vec_dot},

struct dot_row {
    enum kt_type type;
    kt_vec_dot_fn vec_dot;
    kt_gemv_fn gemv;
    kt_gemm_fn gemm; /* a loop over gemv unless a tiled kernel replaces it */
};

/* The reference dot products (the traits table's vec_dot, one per type). */
#define KT_SCALAR_DOTS(X)                                                                         \
    X(KT_TYPE_F32, kt_vec_dot_f32_f32_ref)                                                        \
    X(KT_TYPE_F16, kt_vec_dot_f16_f32_ref)                                                        \
    X(KT_TYPE_BF16, kt_vec_dot_bf16_f32_ref)                                                      \
    X(KT_TYPE_Q8_0, kt_vec_dot_q8_0_q8_0_ref)                                                     \
    X(KT_TYPE_Q4_0, kt_vec_dot_q4_0_q8_0_ref)                                                     \
    X(KT_TYPE_Q5_0, kt_vec_dot_q5_0_q8_0_ref)                                                     \
    X(KT_TYPE_Q4_1, kt_vec_dot_q4_1_q8_1_ref)                                                     \
    X(KT_TYPE_Q5_1, kt_vec_dot_q5_1_q8_1_ref)                                                     \
    X(KT_TYPE_Q4_K, kt_vec_dot_q4_K_q8_K_ref)                                                     \
    X(KT_TYPE_Q5_K, kt_vec_dot_q5_K_q8_K_ref)                                                     \
    X(KT_TYPE_Q6_K, kt_vec_dot_q6_K_q8_K_ref)                                                     \
    X(KT_TYPE_MXFP4, kt_vec_dot_mxfp4_q8_0_ref)                                                   \
    X(KT_TYPE_FP8_B128, kt_vec_dot_fp8_b128_f32_ref)

KT_SCALAR_DOTS(KT_DEFINE_GEMV)
static const struct dot_row scalar_dots[] = {KT_SCALAR_DOTS(KT_DOT_ROW)};

/* The reference's typed row ops, one function per row type for the table. */
#define KT_REF_ROWS(NAME, TYPE)                                                                                    \
    static void dot_rows_##NAME##_ref(const float *x, const void *const *rows, int64_t n_rows, int64_t n,          \
                                      float scale, float *out, int64_t out_stride)                                 \
    {                                                                                                              \
        kt_dot_rows_typed(TYPE, x, rows, n_rows, n, scale, out, out_stride);                                       \
    }                                                                                                              \
    static void axpy_##NAME##_ref(float *y, float a, const void *x, int64_t n)                                     \
    {                                                                                                              \
        kt_axpy_typed(TYPE, y, a, x, n);                                                                           \
    }                                                                                                              \
    static void dot_rows_multi_##NAME##_ref(const float *x, int64_t x_stride, int64_t n_x,                         \
                                            const void *const *rows, int64_t n_rows, int64_t n, float scale,       \
                                            float *out, int64_t out_stride)                                        \
    {                                                                                                              \
        kt_dot_rows_multi_typed(TYPE, x, x_stride, n_x, rows, n_rows, n, scale, out, out_stride);                  \
    }                                                                                                              \
    static void axpy_rows_##NAME##_ref(float *y, int64_t y_stride, int64_t n_y, const float *a, int64_t a_stride,  \
                                       const void *const *rows, int64_t n_rows, int64_t n)                         \
    {                                                                                                              \
        kt_axpy_rows_typed(TYPE, y, y_stride, n_y, a, a_stride, rows, n_rows, n);                                  \
    }
KT_REF_ROWS(f32, KT_ROW_F32)
KT_REF_ROWS(bf16, KT_ROW_BF16)
KT_REF_ROWS(f16, KT_ROW_F16)

/* Rows for the scalar dot products, activations quantized by quant.c. */
static void fill_scalar(struct kt_cpu_kernels *t)
{
    t->f32.dot_rows = kt_dot_rows_f32;
    t->f32.axpy = kt_axpy_f32;
    t->row[KT_ROW_F32] = (struct kt_cpu_row_kernels){dot_rows_f32_ref, axpy_f32_ref, dot_rows_multi_f32_ref,
                                                        axpy_rows_f32_ref};
    t->row[KT_ROW_BF16] = (struct kt_cpu_row_kernels){dot_rows_bf16_ref, axpy_bf16_ref, dot_rows_multi_bf16_ref,
                                                        axpy_rows_bf16_ref};
    t->row[KT_ROW_F16] = (struct kt_cpu_row_kernels){dot_rows_f16_ref, axpy_f16_ref, dot_rows_multi_f16_ref,
                                                        axpy_rows_f16_ref};
    for (size_t k = 0; k < sizeof scalar_dots / sizeof scalar_dots[0]; k++) {
        const struct kt_type_traits *w = kt_type_traits(scalar_dots[k].type);
        struct kt_cpu_type_kernels *row = &t->type[scalar_dots[k].type];
        row->vec_dot = scalar_dots[k].vec_dot;
        row->gemv = scalar_dots[k].gemv;
        row->gemm = scalar_dots[k].gemm;
        row->quantize_act = kt_type_traits(w->vec_dot_type)->from_float;
        row->vec_dot_type = w->vec_dot_type;
    }
}

#ifdef KT_HAVE_AVX2_KERNELS
#define KT_AVX2_DOTS(X)                                                                           \
    X(KT_TYPE_F32, kt_vec_dot_f32_f32_avx2)                                                       \
    X(KT_TYPE_F16, kt_vec_dot_f16_f32_avx2)                                                       \
    X(KT_TYPE_BF16, kt_vec_dot_bf16_f32_avx2)                                                     \
    X(KT_TYPE_Q8_0, kt_vec_dot_q8_0_q8_0_avx2)                                                    \
    X(KT_TYPE_Q4_0, kt_vec_dot_q4_0_q8_0_avx2)                                                    \
    X(KT_TYPE_Q5_0, kt_vec_dot_q5_0_q8_0_avx2)                                                    \
    X(KT_TYPE_Q4_K, kt_vec_dot_q4_K_q8_K_avx2)                                                    \
    X(KT_TYPE_Q5_K, kt_vec_dot_q5_K_q8_K_avx2)                                                    \
    X(KT_TYPE_Q6_K, kt_vec_dot_q6_K_q8_K_avx2)                                                    \
    X(KT_TYPE_MXFP4, kt_vec_dot_mxfp4_q8_0_avx2)                                                  \
    X(KT_TYPE_FP8_B128, kt_vec_dot_fp8_b128_f32_avx2)

KT_AVX2_DOTS(KT_DEFINE_GEMV)
static const struct dot_row avx2_dots[] = {KT_AVX2_DOTS(KT_DOT_ROW)};

static const struct {
    enum kt_type act;
    kt_from_float_fn quantize;
} avx2_quantizers[] = {
    {KT_TYPE_Q8_0, kt_quantize_q8_0_avx2},
    {KT_TYPE_Q8_K, kt_quantize_q8_K_avx2},
};

/* Tiled products that replace the loop over vec_dot. */
static const struct {
    enum kt_type type;
    kt_gemm_fn gemm;
} avx2_gemms[] = {
    {KT_TYPE_Q8_0, kt_gemm_q8_0_q8_0_avx2},
    {KT_TYPE_Q4_K, kt_gemm_q4_K_q8_K_avx2},
    {KT_TYPE_Q5_K, kt_gemm_q5_K_q8_K_avx2},
    {KT_TYPE_Q6_K, kt_gemm_q6_K_q8_K_avx2},
    {KT_TYPE_F32, kt_gemm_f32_f32_avx2},
    {KT_TYPE_F16, kt_gemm_f16_f32_avx2},
    {KT_TYPE_BF16, kt_gemm_bf16_f32_avx2},
};

/* The scalar rows with the AVX2 kernels laid over them. */
static void fill_avx2(struct kt_cpu_kernels *t)
{
    fill_scalar(t);
    t->f32.dot_rows = kt_dot_rows_f32_avx2;
    t->f32.axpy = kt_axpy_f32_avx2;
    t->row[KT_ROW_F32] = (struct kt_cpu_row_kernels){kt_dot_rows_f32_any_avx2, kt_axpy_f32_any_avx2,
                                                        kt_dot_rows_multi_f32_avx2, kt_axpy_rows_f32_avx2};
    t->row[KT_ROW_BF16] = (struct kt_cpu_row_kernels){kt_dot_rows_bf16_avx2, kt_axpy_bf16_avx2,
                                                        kt_dot_rows_multi_bf16_avx2, kt_axpy_rows_bf16_avx2};
    t->row[KT_ROW_F16] = (struct kt_cpu_row_kernels){kt_dot_rows_f16_avx2, kt_axpy_f16_avx2,
                                                        kt_dot_rows_multi_f16_avx2, kt_axpy_rows_f16_avx2};
    for (size_t k = 0; k < sizeof avx2_dots / sizeof avx2_dots[0]; k++) {
        t->type[avx2_dots[k].type].vec_dot = avx2_dots[k].vec_dot;
        t->type[avx2_dots[k].type].gemv = avx2_dots[k].gemv;
        t->type[avx2_dots[k].type].gemm = avx2_dots[k].gemm;
    }
    for (size_t k = 0; k < sizeof avx2_gemms / sizeof avx2_gemms[0]; k++)
        t->type[avx2_gemms[k].type].gemm = avx2_gemms[k].gemm;
    t->type[KT_TYPE_Q4_K].gemv = kt_gemv_q4_K_q8_K_avx2; /* four rows per pass, bit for bit vec_dot */
    t->type[KT_TYPE_Q4_K].packed = &kt_packed_q4_K_avx2; /* 8 rows per group, vpmaddubsw */
    t->type[KT_TYPE_Q8_0].packed = &kt_packed_q8_0_avx2;
    t->type[KT_TYPE_Q4_0].packed = &kt_packed_q4_0_avx2; /* Kimi-K2's INT4 group-32 experts */
    for (int type = 0; type < KT_TYPE_COUNT; type++) {
        struct kt_cpu_type_kernels *row = &t->type[type];
        for (size_t k = 0; row->vec_dot && k < sizeof avx2_quantizers / sizeof avx2_quantizers[0]; k++)
            if (row->vec_dot_type == avx2_quantizers[k].act)
                row->quantize_act = avx2_quantizers[k].quantize;
    }
}
#else
/* Not an x86-64 build: the scalar rows stand in (isa_max is scalar anyway). */
static void fill_avx2(struct kt_cpu_kernels *t)
{
    fill_scalar(t);
}
#endif

#ifdef KT_HAVE_AVX512_KERNELS
#define KT_AVX512_DOTS(X)                                                                         \
    X(KT_TYPE_Q8_0, kt_vec_dot_q8_0_q8_0_avx512)                                                  \
    X(KT_TYPE_Q4_0, kt_vec_dot_q4_0_q8_0_avx512)                                                  \
    X(KT_TYPE_Q4_K, kt_vec_dot_q4_K_q8_K_avx512)                                                  \
    X(KT_TYPE_MXFP4, kt_vec_dot_mxfp4_q8_0_avx512)                                                \
    X(KT_TYPE_FP8_B128, kt_vec_dot_fp8_b128_f32_avx512)

KT_AVX512_DOTS(KT_DEFINE_GEMV)
static const struct dot_row avx512_dots[] = {KT_AVX512_DOTS(KT_DOT_ROW)};

#include "cpu/avx512/gemm_avx512.h"
#include "cpu/avx512/gemm_float_avx512.h"
#include "cpu/avx512/gemm_kquant_avx512.h"
#include "cpu/avx512/packed_avx512.h"
#include "cpu/avx512/rows_avx512.h"

/* The avx2 rows with the AVX-512 dot products and tiled gemms
 * (kernels/cpu/avx512/gemm_avx512.c, gemm_kquant_avx512.c, gemm_float_avx512.c)
 * laid over them. */
static void fill_avx512(struct kt_cpu_kernels *t)
{
    fill_avx2(t);
    for (size_t k = 0; k < sizeof avx512_dots / sizeof avx512_dots[0]; k++) {
        t->type[avx512_dots[k].type].vec_dot = avx512_dots[k].vec_dot;
        t->type[avx512_dots[k].type].gemv = avx512_dots[k].gemv;
    }
    t->type[KT_TYPE_Q8_0].gemm = kt_gemm_q8_0_q8_0_avx512;
    t->type[KT_TYPE_Q4_0].gemm = gemm_kt_vec_dot_q4_0_q8_0_avx512; /* no tiled gemm: the packed row is Q4_0's prefill */
    t->type[KT_TYPE_Q4_K].gemm = kt_gemm_q4_K_q8_K_avx512;
    t->type[KT_TYPE_Q5_K].gemm = kt_gemm_q5_K_q8_K_avx512;
    t->type[KT_TYPE_Q6_K].gemm = kt_gemm_q6_K_q8_K_avx512;
    t->type[KT_TYPE_F32].gemm = kt_gemm_f32_f32_avx512;
    t->type[KT_TYPE_F16].gemm = kt_gemm_f16_f32_avx512;
    t->type[KT_TYPE_BF16].gemm = kt_gemm_bf16_f32_avx512;
    t->type[KT_TYPE_FP8_B128].gemm = kt_gemm_fp8_b128_f32_avx512; /* 4 tokens per decoded block */
    t->type[KT_TYPE_FP8_B128].gemv = kt_gemv_fp8_b128_f32_avx512; /* 4 rows per activation load */
    t->type[KT_TYPE_Q4_K].packed = &kt_packed_q4_K_avx512; /* 16 rows per group, vpdpbusd */
    t->type[KT_TYPE_Q8_0].packed = &kt_packed_q8_0_avx512;
    t->type[KT_TYPE_Q4_0].packed = &kt_packed_q4_0_avx512;
    t->row[KT_ROW_F32].dot_rows = kt_dot_rows_f32_avx512; /* two rows per zmm, the same bits */
    t->row[KT_ROW_BF16].dot_rows = kt_dot_rows_bf16_avx512;
    t->row[KT_ROW_F16].dot_rows = kt_dot_rows_f16_avx512;
    t->row[KT_ROW_F32].dot_rows_multi = kt_dot_rows_multi_f32_avx512; /* each row load shared by 4 queries */
    t->row[KT_ROW_BF16].dot_rows_multi = kt_dot_rows_multi_bf16_avx512;
    t->row[KT_ROW_F16].dot_rows_multi = kt_dot_rows_multi_f16_avx512;
    t->row[KT_ROW_F32].axpy_rows = kt_axpy_rows_f32_avx512; /* 8 outputs x 32 elements in registers */
    t->row[KT_ROW_BF16].axpy_rows = kt_axpy_rows_bf16_avx512;
    t->row[KT_ROW_F16].axpy_rows = kt_axpy_rows_f16_avx512;
}
#else
static void fill_avx512(struct kt_cpu_kernels *t)
{
    fill_avx2(t);
}
#endif

#ifdef KT_HAVE_AMX_KERNELS
#include "cpu/amx/packed_amx.h"

/* The avx512 rows, integer weights packed for AMX tiles.  BF16 is not in
 * the table, though its tiles are a float GEMM's accuracy (each activation
 * split into two bf16 terms, hi = bf16(a) and lo = bf16(a - hi): 2^-16 +
 * n * 2^-23 of sum |w a| at worst, against 2^-8 with one term): every
 * placement must give the same bits (kt-bench check's file-reading
 * reference, the sim device, a token alone or in a batch), and packed rows
 * alone would take the tiles while GGUF rows and decode-sized calls keep
 * the AVX-512 float order.  Measured with the level packing BF16 (an AMX
 * host, 2026-12-03): test_hf_model's check of an INT4 directory at worst row
 * 0.088 instead of 0 (0.169 with one term), test_hybrid_sim's INT4
 * checkpoint unequal to CPU-only.  The tiles serve BF16 where the engine
 * already leaves vec_dot's bits, whatever the placement: the large
 * products that went to oneDNN (runtime/forward/matmul.c, amx_bf16_slice,
 * which packs each slice per call). */
static void fill_amx(struct kt_cpu_kernels *t)
{
    fill_avx512(t);
    t->type[KT_TYPE_Q8_0].packed = &kt_packed_q8_0_amx;
    t->type[KT_TYPE_Q4_0].packed = &kt_packed_q4_0_amx;
    t->type[KT_TYPE_Q4_K].packed = &kt_packed_q4_K_amx;
}
#else
/* The compiler could not emit AMX: the avx512 rows stand in. */
static void fill_amx(struct kt_cpu_kernels *t)
{
    fill_avx512(t);
}
#endif

/* ---- the one-time initialisation --------------------------------------------- */

/* KT_ISA's level, or -1 when unset or not a level's name. */
static int isa_from_env(void)
{
    const char *s = getenv("KT_ISA");
    if (!s || !*s)
        return -1;
    for (int isa = 0; isa < KT_ISA_LEVELS; isa++)
        if (strcasecmp(s, kt_isa_name((enum kt_isa)isa)) == 0)
            return isa;
    return -1;
}

static void cpu_init(void)
{
    kt_cpu_features_detect(&g_cpu.features);
    const enum kt_isa isa_max = kt_cpu_features_isa_max(&g_cpu.features);
    for (int isa = 0; isa <= (int)isa_max; isa++) {
        struct kt_cpu_kernels *t = &g_cpu.level[isa];
        if (isa == KT_ISA_SCALAR)
            fill_scalar(t);
        else if (isa == KT_ISA_AVX2)
            fill_avx2(t);
        else if (isa == KT_ISA_AVX512)
            fill_avx512(t);
        else
            fill_amx(t);
        t->isa = (enum kt_isa)isa;
        t->isa_max = isa_max;
    }
    /* a forced level above what the CPU has falls back to the best it has */
    const int forced = isa_from_env();
    g_cpu.selected = forced >= 0 && forced < (int)isa_max ? (enum kt_isa)forced : isa_max;
}

const struct kt_cpu_kernels *kt_cpu_kernels(void)
{
    pthread_once(&g_cpu_once, cpu_init);
    return &g_cpu.level[g_cpu.selected];
}

const struct kt_cpu_kernels *kt_cpu_kernels_for(enum kt_isa isa)
{
    pthread_once(&g_cpu_once, cpu_init);
    if ((int)isa < 0 || isa > g_cpu.level[KT_ISA_SCALAR].isa_max)
        return NULL;
    return &g_cpu.level[isa];
}

const struct kt_cpu_features *kt_cpu_features(void)
{
    pthread_once(&g_cpu_once, cpu_init);
    return &g_cpu.features;
}

const char *kt_isa_name(enum kt_isa isa)
{
    static const char *const names[KT_ISA_LEVELS] = {"scalar", "avx2", "avx512", "amx"};
    return (int)isa >= 0 && isa < KT_ISA_LEVELS ? names[isa] : "unknown";
}
