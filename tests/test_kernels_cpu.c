/*
 * test_kernels_cpu.c - the CPU kernel table: feature detection, KT_ISA
 * forcing, table completeness, and every SIMD kernel against its scalar twin.
 *
 * The scalar rows are the reference (kernels/cpu/ref, quant.c); a SIMD row
 * must give the same bytes (activation quantizers), the same float bit for bit
 * (quantized dot products: exact integer sums, reference float order), or the
 * same value within float summation error (F32/F16/BF16 dots, which the
 * reference sums in double).  Levels this CPU lacks are reported as skipped,
 * never silently passed.  This program must never time-assert: the bandwidth
 * figures it prints at the end are information, not checks.
 */
#include "testlib.h"

#include "cpu/cpu_features.h"
#include "cpu/dispatch.h"
#include "cpu/ref/ops.h"
#include "quant.h"

#include <math.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

/* ---------------------------------------------------------------------------- */
/* helpers                                                                       */
/* ---------------------------------------------------------------------------- */

static unsigned long long g_rng = 0x6b746b65726e656cULL;

static uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static const struct kt_cpu_kernels *scalar_kernels(void)
{
    return kt_cpu_kernels_for(KT_ISA_SCALAR);
}

/* Levels above scalar whose tables exist on this CPU, for comparison loops. */
static int simd_levels(enum kt_isa out[KT_ISA_AMX])
{
    int count = 0;
    for (int isa = KT_ISA_AVX2; isa <= KT_ISA_AMX; isa++)
        if (kt_cpu_kernels_for((enum kt_isa)isa))
            out[count++] = (enum kt_isa)isa;
    return count;
}

/* Weight types with a reference dot product (the rows every level must have). */
static bool has_reference_dot(int type)
{
    const struct kt_type_traits *t = kt_type_traits(type);
    return t && t->vec_dot;
}

/*
 * A buffer whose last byte sits just before a PROT_NONE page, so a kernel
 * that reads or writes one byte past its n elements faults.
 */
struct guarded {
    void *map;
    size_t map_bytes;
    void *data;
};

static void *guarded_alloc(struct guarded *g, size_t bytes)
{
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    const size_t data_pages = (bytes + page - 1) / page;
    g->map_bytes = (data_pages + 1) * page;
    g->map = mmap(NULL, g->map_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (g->map == MAP_FAILED || mprotect((char *)g->map + data_pages * page, page, PROT_NONE) != 0) {
        fprintf(stderr, "mmap guard failed\n");
        exit(2);
    }
    g->data = (char *)g->map + data_pages * page - bytes;
    return g->data;
}

static void guarded_free(struct guarded *g)
{
    munmap(g->map, g->map_bytes);
}

/* ---------------------------------------------------------------------------- */
/* test data                                                                     */
/* ---------------------------------------------------------------------------- */

enum weight_pattern {
    W_RANDOM_BITS, /* every quant and scale bit random; fp16 scales finite */
    W_QUANTIZED,   /* from_float of gaussian values with outliers */
    W_ZERO_BLOCKS, /* random bits with every third block all zero bytes */
    W_MAX,         /* extreme quants (all-min / all-max codes) and maximal sub-block scales */
    W_PATTERNS
};
static const char *const weight_pattern_names[W_PATTERNS] = {"random-bits", "quantized", "zero-blocks", "max"};

enum act_pattern {
    A_GAUSSIAN,    /* with 1% outliers 100x larger */
    A_ZERO_BLOCKS, /* every third activation block zero */
    A_MAX,         /* +-1: every quant at +-127 */
    A_PATTERNS
};
static const char *const act_pattern_names[A_PATTERNS] = {"gaussian", "zero-blocks", "max"};

/* Offsets of a block type's fp16 scale fields, to make random bits finite. */
static int fp16_fields(int type, size_t offsets[2])
{
    switch (type) {
    case KT_TYPE_Q4_0: offsets[0] = offsetof(struct kt_block_q4_0, d); return 1;
    case KT_TYPE_Q5_0: offsets[0] = offsetof(struct kt_block_q5_0, d); return 1;
    case KT_TYPE_Q8_0: offsets[0] = offsetof(struct kt_block_q8_0, d); return 1;
    case KT_TYPE_Q4_1:
        offsets[0] = offsetof(struct kt_block_q4_1, d);
        offsets[1] = offsetof(struct kt_block_q4_1, m);
        return 2;
    case KT_TYPE_Q5_1:
        offsets[0] = offsetof(struct kt_block_q5_1, d);
        offsets[1] = offsetof(struct kt_block_q5_1, m);
        return 2;
    case KT_TYPE_Q4_K:
        offsets[0] = offsetof(struct kt_block_q4_K, d);
        offsets[1] = offsetof(struct kt_block_q4_K, dmin);
        return 2;
    case KT_TYPE_Q5_K:
        offsets[0] = offsetof(struct kt_block_q5_K, d);
        offsets[1] = offsetof(struct kt_block_q5_K, dmin);
        return 2;
    case KT_TYPE_Q6_K: offsets[0] = offsetof(struct kt_block_q6_K, d); return 1;
    default: return 0;
    }
}

static void put_fp16(uint8_t *block, size_t offset, float v)
{
    const kt_fp16 h = kt_fp32_to_fp16(v);
    memcpy(block + offset, &h, sizeof h);
}

/* Gaussian floats, 1% of them 100x larger. */
static void gaussian_with_outliers(float *x, int64_t n, float scale)
{
    for (int64_t i = 0; i < n; i++) {
        x[i] = scale * kt_test_rand_normal(&g_rng);
        if (kt_test_rand_u64(&g_rng) % 100 == 0)
            x[i] *= 100.0f;
    }
}

/* Extreme codes for one block of a quantized type (odd blocks: the other end). */
static void max_block(int type, uint8_t *b, size_t bytes, bool odd)
{
    switch (type) {
    case KT_TYPE_Q8_0: /* qs all -128 or all 127 */
        memset(b, odd ? 0x7f : 0x80, bytes);
        put_fp16(b, offsetof(struct kt_block_q8_0, d), 2.0f);
        break;
    case KT_TYPE_Q4_K:
    case KT_TYPE_Q5_K: /* q all 15/31 or all 0; every 6-bit scale and min 63 */
        memset(b, odd ? 0x00 : 0xff, bytes);
        memset(b + offsetof(struct kt_block_q4_K, scales), 0xff, 12);
        put_fp16(b, offsetof(struct kt_block_q4_K, d), 1.0f);
        put_fp16(b, offsetof(struct kt_block_q4_K, dmin), 0.5f);
        break;
    case KT_TYPE_Q6_K: /* q-32 all -32 with scales -128, or all 31 with scales 127 */
        memset(b, odd ? 0xff : 0x00, bytes);
        memset(b + offsetof(struct kt_block_q6_K, scales), odd ? 0x7f : 0x80, 16);
        put_fp16(b, offsetof(struct kt_block_q6_K, d), 1.0f);
        break;
    case KT_TYPE_MXFP4: /* every value -6 or +6 (doubled -12 / 12) at the scale 2^3 */
        memset(b, odd ? 0xff : 0x77, bytes);
        b[0] = 130;
        break;
    case KT_TYPE_FP8_B128: { /* every code -448 or +448 */
        memset(b, odd ? 0xfe : 0x7e, bytes);
        const float d = odd ? 0.25f : 1.0f;
        memcpy(b, &d, sizeof d);
        break;
    }
    default: { /* legacy 4/5-bit: all codes 0 or all codes max */
        memset(b, odd ? 0xff : 0x00, bytes);
        size_t off[2];
        const int count = fp16_fields(type, off);
        for (int k = 0; k < count; k++)
            put_fp16(b, off[k], k == 0 ? 3.0f : -1.0f);
    }
    }
}

/* Random bits of the native formats made usable: MXFP4 scales 2^-10 .. 2^9
 * (2^127 would overflow every sum), FP8_B128 finite scales and no NaN codes
 * (refused at load). */
static void tame_native_block(int type, uint8_t *blk, int64_t b)
{
    if (type == KT_TYPE_MXFP4)
        blk[0] = (uint8_t)(118 + blk[0] % 20);
    if (type == KT_TYPE_FP8_B128) {
        const float d = kt_test_rand_normal(&g_rng) * (b % 5 == 4 ? 30.0f : 0.002f);
        memcpy(blk, &d, sizeof d);
        for (size_t i = sizeof d; i < sizeof(struct kt_block_fp8_b128); i++)
            blk[i] = (blk[i] & 0x7f) == 0x7f ? blk[i] ^ 1 : blk[i];
    }
}

/* n elements of weight type `type` in `pattern` into w (kt_type_row_bytes). */
static void make_weights(int type, int64_t n, enum weight_pattern pattern, void *w)
{
    const struct kt_type_traits *t = kt_type_traits(type);
    const size_t block_bytes = t->block_bytes;
    const int64_t nb = n / t->block_elems;
    uint8_t *bytes = w;

    if (!t->is_quantized || pattern == W_QUANTIZED) {
        float *x = kt_test_xmalloc((size_t)n * sizeof *x);
        gaussian_with_outliers(x, n, 0.5f);
        if (!t->is_quantized && pattern == W_ZERO_BLOCKS)
            for (int64_t i = 0; i < n; i++)
                x[i] = (i / 8) % 3 == 1 ? 0.0f : x[i];
        if (!t->is_quantized && pattern == W_MAX) /* largest finite magnitudes, both signs */
            for (int64_t i = 0; i < n; i++)
                x[i] = (i & 1 ? -1.0f : 1.0f) * (type == KT_TYPE_F16 ? 65504.0f : 1e30f);
        t->from_float(x, w, n);
        free(x);
        return;
    }
    for (int64_t b = 0; b < nb; b++) {
        uint8_t *blk = bytes + (size_t)b * block_bytes;
        if (pattern == W_MAX) {
            max_block(type, blk, block_bytes, b & 1);
            continue;
        }
        for (size_t k = 0; k < block_bytes; k++)
            blk[k] = (uint8_t)kt_test_rand_u64(&g_rng);
        size_t off[2];
        const int count = fp16_fields(type, off);
        for (int k = 0; k < count; k++) /* finite, occasionally large scales */
            put_fp16(blk, off[k], kt_test_rand_normal(&g_rng) * (b % 5 == 4 ? 300.0f : 0.02f));
        tame_native_block(type, blk, b);
        if (pattern == W_ZERO_BLOCKS && b % 3 == 1)
            memset(blk, 0, block_bytes);
    }
}

/* n activation floats in `pattern`; zero blocks are zeroed `block` at a time. */
static void make_activations(float *x, int64_t n, enum act_pattern pattern, int64_t block)
{
    gaussian_with_outliers(x, n, 1.0f);
    if (pattern == A_ZERO_BLOCKS)
        for (int64_t i = 0; i < n; i++)
            x[i] = (i / block) % 3 == 0 ? 0.0f : x[i];
    if (pattern == A_MAX)
        for (int64_t i = 0; i < n; i++)
            x[i] = kt_test_rand_u64(&g_rng) & 1 ? 1.0f : -1.0f;
}

/* ---------------------------------------------------------------------------- */
/* detection and the table                                                       */
/* ---------------------------------------------------------------------------- */

/* Linux's /proc/cpuinfo flags reflect CPUID masked by what the kernel enabled,
 * the same rule kt_cpu_features_detect applies with XGETBV. */
static bool cpuinfo_flags(char *flags, size_t cap)
{
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f)
        return false;
    char line[8192];
    bool found = false;
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "flags", 5) == 0) {
            const char *colon = strchr(line, ':');
            snprintf(flags, cap, " %s", colon ? colon + 1 : "");
            char *nl = strchr(flags, '\n');
            if (nl)
                *nl = ' ';
            found = true;
            break;
        }
    }
    fclose(f);
    return found;
}

static bool has_flag(const char *flags, const char *name)
{
    char needle[64];
    snprintf(needle, sizeof needle, " %s ", name);
    return strstr(flags, needle) != NULL;
}

static void detected_features_match_proc_cpuinfo(void)
{
    const struct kt_cpu_features *f = kt_cpu_features();
    const struct kt_cpu_kernels *k = kt_cpu_kernels();
    printf("  cpu: avx2=%d fma=%d f16c=%d avx512f=%d bw=%d vl=%d vnni=%d bf16=%d "
           "amx_tile=%d amx_int8=%d amx_bf16=%d amx_permitted=%d -> isa_max=%s, isa=%s\n",
           f->avx2, f->fma, f->f16c, f->avx512f, f->avx512bw, f->avx512vl, f->avx512vnni, f->avx512bf16,
           f->amx_tile, f->amx_int8, f->amx_bf16, f->amx_permitted, kt_isa_name(k->isa_max), kt_isa_name(k->isa));
    KT_CHECK(k->isa_max == kt_cpu_features_isa_max(f), "table isa_max %d, features say %d", k->isa_max,
             kt_cpu_features_isa_max(f));

    char flags[8192];
    if (!cpuinfo_flags(flags, sizeof flags)) {
        printf("  skipped: no /proc/cpuinfo flags to compare with\n");
        return;
    }
    const struct {
        const char *flag;
        bool detected;
    } pairs[] = {
        {"avx2", f->avx2},         {"fma", f->fma},           {"f16c", f->f16c},
        {"avx512f", f->avx512f},   {"avx512bw", f->avx512bw}, {"avx512vl", f->avx512vl},
        {"avx512_vnni", f->avx512vnni}, {"avx512_bf16", f->avx512bf16}, {"amx_tile", f->amx_tile},
        {"amx_int8", f->amx_int8}, {"amx_bf16", f->amx_bf16},
    };
    for (size_t i = 0; i < sizeof pairs / sizeof pairs[0]; i++)
        KT_CHECK(has_flag(flags, pairs[i].flag) == pairs[i].detected, "%s: cpuinfo %d, detected %d", pairs[i].flag,
                 has_flag(flags, pairs[i].flag), pairs[i].detected);
}

static void each_supported_level_has_a_table_and_no_other(void)
{
    const struct kt_cpu_kernels *k = kt_cpu_kernels();
    KT_CHECK(k != NULL, "no table");
    KT_CHECK(k->isa <= k->isa_max, "selected %s above isa_max %s", kt_isa_name(k->isa), kt_isa_name(k->isa_max));
    if (!getenv("KT_ISA"))
        KT_CHECK(k->isa == k->isa_max, "without KT_ISA the best level is used: %s vs %s", kt_isa_name(k->isa),
                 kt_isa_name(k->isa_max));
    KT_CHECK(kt_cpu_kernels() == k, "the table moved between calls");
    for (int isa = KT_ISA_SCALAR; isa <= KT_ISA_AMX; isa++) {
        const struct kt_cpu_kernels *t = kt_cpu_kernels_for((enum kt_isa)isa);
        if (isa <= (int)k->isa_max) {
            KT_CHECK(t != NULL, "no table for supported level %s", kt_isa_name((enum kt_isa)isa));
            KT_CHECK(t && (int)t->isa == isa && t->isa_max == k->isa_max, "level %s table mislabelled",
                     kt_isa_name((enum kt_isa)isa));
        } else {
            KT_CHECK(t == NULL, "a table for unsupported level %s", kt_isa_name((enum kt_isa)isa));
        }
    }
    KT_CHECK(kt_cpu_kernels_for((enum kt_isa)7) == NULL, "a table for a level that does not exist");
    KT_CHECK(kt_cpu_kernels_for((enum kt_isa)-1) == NULL, "a table for a negative level");
    KT_CHECK(strcmp(kt_isa_name(KT_ISA_AVX512), "avx512") == 0 && strcmp(kt_isa_name((enum kt_isa)9), "unknown") == 0,
             "isa names");
}

static void every_row_with_a_reference_dot_is_filled_at_every_level(void)
{
    for (int isa = KT_ISA_SCALAR; isa <= KT_ISA_AMX; isa++) {
        const struct kt_cpu_kernels *t = kt_cpu_kernels_for((enum kt_isa)isa);
        if (!t)
            continue;
        for (int type = 0; type < KT_TYPE_COUNT; type++) {
            const struct kt_cpu_type_kernels *row = &t->type[type];
            if (has_reference_dot(type)) {
                const struct kt_type_traits *tr = kt_type_traits(type);
                KT_CHECK(row->vec_dot && row->quantize_act && row->gemv, "%s: %s row incomplete",
                         kt_isa_name((enum kt_isa)isa), tr->name);
                KT_CHECK(row->vec_dot_type == tr->vec_dot_type, "%s: %s activation type %d, traits say %d",
                         kt_isa_name((enum kt_isa)isa), tr->name, row->vec_dot_type, tr->vec_dot_type);
            } else {
                KT_CHECK(!row->vec_dot && !row->quantize_act && !row->gemv, "%s: type %d has a row but no reference",
                         kt_isa_name((enum kt_isa)isa), type);
            }
        }
    }
}

static void scalar_level_is_the_reference(void)
{
    const struct kt_cpu_kernels *s = scalar_kernels();
    for (int type = 0; type < KT_TYPE_COUNT; type++) {
        if (!has_reference_dot(type))
            continue;
        const struct kt_type_traits *tr = kt_type_traits(type);
        KT_CHECK(s->type[type].vec_dot == tr->vec_dot, "%s: scalar vec_dot is not the reference", tr->name);
        KT_CHECK(s->type[type].quantize_act == kt_type_traits(tr->vec_dot_type)->from_float,
                 "%s: scalar quantize_act is not quant.c's from_float", tr->name);
    }
}

static void avx2_rows_use_simd_kernels_for_the_hot_types(void)
{
    const struct kt_cpu_kernels *avx2 = kt_cpu_kernels_for(KT_ISA_AVX2);
    if (!avx2) {
        printf("  skipped: no AVX2 (with FMA and F16C) on this CPU\n");
        return;
    }
    const int simd_types[] = {KT_TYPE_F32, KT_TYPE_F16, KT_TYPE_BF16, KT_TYPE_Q8_0, KT_TYPE_Q4_0,
                              KT_TYPE_Q5_0, KT_TYPE_Q4_K, KT_TYPE_Q5_K, KT_TYPE_Q6_K,
                              KT_TYPE_MXFP4, KT_TYPE_FP8_B128};
    for (size_t i = 0; i < sizeof simd_types / sizeof simd_types[0]; i++) {
        const int type = simd_types[i];
        KT_CHECK(avx2->type[type].vec_dot != scalar_kernels()->type[type].vec_dot, "%s: avx2 row is the reference",
                 kt_type_name(type));
        if (avx2->type[type].vec_dot_type != KT_TYPE_F32)
            KT_CHECK(avx2->type[type].quantize_act != scalar_kernels()->type[type].quantize_act,
                     "%s: avx2 activation quantizer is the reference", kt_type_name(type));
    }
    /* AVX-512 and AMX have their own rows only where their kernels exist (Q8_0,
     * Q4_0, Q4_K, MXFP4 and FP8_B128 vec_dot/gemv for AVX-512 today, which AMX
     * shares, and the tiled
     * gemms of Q5_K, Q6_K, F32, F16 and BF16 over the AVX2 dots); every other
     * entry is the AVX2 one, and every row keeps the activation format of the
     * AVX2 row. */
    for (int isa = KT_ISA_AVX512; isa <= KT_ISA_AMX; isa++) {
        const struct kt_cpu_kernels *t = kt_cpu_kernels_for((enum kt_isa)isa);
        if (!t) {
            printf("  skipped: no %s on this CPU\n", isa == KT_ISA_AVX512 ? "AVX-512 (F/BW/VL/VNNI/BF16)" : "AMX");
            continue;
        }
        for (int type = 0; type < KT_TYPE_COUNT; type++) {
            const struct kt_cpu_type_kernels *r = &t->type[type], *a = &avx2->type[type];
            /* AMX is the avx512 rows with expert weights packed for tiles
             * (kernels/cpu/dispatch.c), so it has AVX-512's Q8_0 and Q4_K dots
             * too; this was first seen on a CPU with AMX (an H200 host) */
            bool own = type == KT_TYPE_Q8_0 || type == KT_TYPE_Q4_0 || type == KT_TYPE_Q4_K || type == KT_TYPE_MXFP4 ||
                       type == KT_TYPE_FP8_B128;
            const bool own_gemm = type == KT_TYPE_Q5_K || type == KT_TYPE_Q6_K || type == KT_TYPE_F32 ||
                                  type == KT_TYPE_F16 || type == KT_TYPE_BF16;
            KT_CHECK(r->vec_dot_type == a->vec_dot_type && r->quantize_act == a->quantize_act,
                     "%s %s: activation format differs from avx2", kt_isa_name((enum kt_isa)isa), kt_type_name(type));
            const struct kt_cpu_kernels *k512 = kt_cpu_kernels_for(KT_ISA_AVX512); /* AMX implies it */
            const struct kt_cpu_type_kernels *v = k512 ? &k512->type[type] : r;
            if (own)
                KT_CHECK(r->vec_dot && r->vec_dot != a->vec_dot && r->vec_dot == v->vec_dot && r->gemv == v->gemv,
                         "%s %s: expected AVX-512's own vec_dot and gemv", kt_isa_name((enum kt_isa)isa),
                         kt_type_name(type));
            else
                KT_CHECK(r->vec_dot == a->vec_dot && r->gemv == a->gemv && (r->gemm != a->gemm) == own_gemm,
                         "%s %s: differs from the avx2 row", kt_isa_name((enum kt_isa)isa), kt_type_name(type));
        }
        printf("  %s: detected\n", kt_isa_name((enum kt_isa)isa));
    }
}

/* The child prints "<isa> <isa_max>" for the environment it was given. */
static int print_isa_and_exit(void)
{
    const struct kt_cpu_kernels *k = kt_cpu_kernels();
    printf("%s %s\n", kt_isa_name(k->isa), kt_isa_name(k->isa_max));
    return 0;
}

/* Runs this program as a child with KT_ISA=value; fills "isa isa_max". */
static bool child_isa(const char *value, char *out, size_t cap)
{
    char self[4096];
    const ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    if (len <= 0)
        return false;
    self[len] = 0;
    char cmd[4300];
    snprintf(cmd, sizeof cmd, "KT_ISA='%s' '%s' --print-isa", value, self);
    FILE *p = popen(cmd, "r");
    if (!p)
        return false;
    const bool got = fgets(out, (int)cap, p) != NULL;
    const int status = pclose(p);
    char *nl = strchr(out, '\n');
    if (nl)
        *nl = 0;
    return got && status == 0;
}

static void kt_isa_env_forces_a_level_at_or_below_the_cpu(void)
{
    const enum kt_isa max = kt_cpu_kernels()->isa_max;
    const char *max_name = kt_isa_name(max);
    const struct {
        const char *env;
        enum kt_isa want;
    } cases[] = {
        {"scalar", KT_ISA_SCALAR},
        {"AVX2", max >= KT_ISA_AVX2 ? KT_ISA_AVX2 : max}, /* case-insensitive */
        {"avx512", max >= KT_ISA_AVX512 ? KT_ISA_AVX512 : max},
        {"amx", max}, /* above what most CPUs have: falls back, no SIGILL */
        {"sse9", max}, /* not a level: ignored */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char got[128] = "", want[128];
        snprintf(want, sizeof want, "%s %s", kt_isa_name(cases[i].want), max_name);
        KT_CHECK(child_isa(cases[i].env, got, sizeof got), "child with KT_ISA=%s failed", cases[i].env);
        KT_CHECK(strcmp(got, want) == 0, "KT_ISA=%s: got \"%s\", want \"%s\"", cases[i].env, got, want);
        printf("  KT_ISA=%-7s -> %s\n", cases[i].env, got);
    }
}

/* ---------------------------------------------------------------------------- */
/* conversions and activation quantizers                                         */
/* ---------------------------------------------------------------------------- */

/*
 * Every finite fp16 / bf16 value, placed in lane `pos` of a 32-element row and
 * dotted with a one-hot activation, comes back exactly as quant.c widens it:
 * the SIMD widening (F16C, shift) agrees on all 2^16 inputs.
 */
static void half_widening_agrees_with_quant_c_on_every_value(void)
{
    enum kt_isa levels[KT_ISA_AMX];
    const int nl = simd_levels(levels);
    if (nl == 0) {
        printf("  skipped: no SIMD level on this CPU\n");
        return;
    }
    for (int l = 0; l < nl; l++) {
        const struct kt_cpu_kernels *t = kt_cpu_kernels_for(levels[l]);
        int bad16 = 0, badbf = 0;
        for (uint32_t h = 0; h < 65536; h++) {
            const int pos = (int)(h % 32);
            float act[32] = {0};
            uint16_t w[32] = {0};
            act[pos] = 1.0f;
            w[pos] = (uint16_t)h;
            float r;
            if ((h & 0x7c00u) != 0x7c00u) { /* finite fp16 */
                t->type[KT_TYPE_F16].vec_dot(32, &r, w, act);
                bad16 += r != kt_fp16_to_fp32((kt_fp16)h);
            }
            if ((h & 0x7f80u) != 0x7f80u) { /* finite bf16 */
                t->type[KT_TYPE_BF16].vec_dot(32, &r, w, act);
                badbf += r != kt_bf16_to_fp32((kt_bf16)h);
            }
        }
        KT_CHECK(bad16 == 0, "%s: %d fp16 values widen differently", kt_isa_name(levels[l]), bad16);
        KT_CHECK(badbf == 0, "%s: %d bf16 values widen differently", kt_isa_name(levels[l]), badbf);
    }
}

/* Rows that stress the quantizers: ties, equal magnitudes, scale extremes. */
static void quantizer_input(float *x, int64_t n, int variant)
{
    /* even variants: one kind and one scale for the whole row, so Q8_K's
     * 256-blocks see it too; odd variants: kinds cycle every 32 */
    const float row_scale = powf(10.0f, kt_test_rand_uniform(&g_rng, -9.0f, 7.5f));
    for (int64_t b = 0; b < n / 32; b++) {
        float *v = x + 32 * b;
        const int kind = variant % 2 ? (int)((b + variant) % 8) : (variant / 2) % 8;
        /* magnitude spans fp16 subnormal d (Q8_0), normal, and d overflowing fp16 */
        const float scale = variant % 2 ? powf(10.0f, kt_test_rand_uniform(&g_rng, -9.0f, 7.5f)) : row_scale;
        for (int j = 0; j < 32; j++)
            v[j] = scale * kt_test_rand_normal(&g_rng);
        switch (kind) {
        case 0: /* amax 127: Q8_0 d = 1, so x.5 values are exact ties */
        case 1:
            for (int j = 0; j < 32; j++)
                v[j] = (float)((int)(kt_test_rand_u64(&g_rng) % 253) - 126) + 0.5f * (float)(j & 1);
            v[kind == 0 ? 3 : 17] = kind == 0 ? 127.0f : -127.0f;
            break;
        case 2: /* -m and +m of largest magnitude, in one 8-lane group and across
                 * groups: the first one decides the sign of Q8_K's scale */
            for (int j = 0; j < 32; j++)
                v[j] = fabsf(v[j]) >= 3.0f * scale ? 0.0f : v[j];
            v[2] = -3.0f * scale;
            v[6] = 3.0f * scale;
            v[20] = 3.0f * scale;
            break;
        case 3: /* all zero */
            memset(v, 0, 32 * sizeof *v);
            break;
        case 4: /* tiny: Q8_K treats |max| < 2^-120 as zero, Q8_0 a subnormal d as zero */
            for (int j = 0; j < 32; j++)
                v[j] = 0x1p-121f * kt_test_rand_uniform(&g_rng, -1.0f, 1.0f);
            break;
        case 5: /* Q8_0 d exactly halfway between two normal fp16 values (a rounding tie) */
        {
            const kt_fp16 h = (kt_fp16)(0x0400 + kt_test_rand_u64(&g_rng) % 0x7000);
            const float d = 0.5f * (kt_fp16_to_fp32(h) + kt_fp16_to_fp32((kt_fp16)(h + 1)));
            for (int j = 0; j < 32; j++)
                v[j] = kt_test_rand_uniform(&g_rng, -126.0f, 126.0f) * d;
            v[9] = 127.0f * d;
            break;
        }
        case 6: /* fp16-subnormal halfway d */
        {
            const float d = (float)(2 * (int)(kt_test_rand_u64(&g_rng) % 1000) + 1) * 0x1p-25f;
            for (int j = 0; j < 32; j++)
                v[j] = kt_test_rand_uniform(&g_rng, -127.0f, 127.0f) * d;
            v[0] = -127.0f * d;
            break;
        }
        default:
            break; /* plain gaussian at the block's scale */
        }
    }
}

static void activation_quantizers_match_reference_bit_for_bit(void)
{
    enum kt_isa levels[KT_ISA_AMX];
    const int nl = simd_levels(levels);
    if (nl == 0) {
        printf("  skipped: no SIMD level on this CPU\n");
        return;
    }
    const int act_types[] = {KT_TYPE_Q8_0, KT_TYPE_Q8_K, KT_TYPE_Q8_1, KT_TYPE_F32};
    const int weight_for[] = {KT_TYPE_Q8_0, KT_TYPE_Q4_K, KT_TYPE_Q4_1, KT_TYPE_F32};
    const int64_t max_n = 7168;
    float *x = kt_test_xmalloc((size_t)max_n * sizeof *x);
    const size_t cap = kt_type_row_bytes(KT_TYPE_F32, max_n) + 64; /* the largest of the four */
    uint8_t *ref = kt_test_xmalloc(cap), *got = kt_test_xmalloc(cap);
    for (int l = 0; l < nl; l++) {
        const struct kt_cpu_kernels *t = kt_cpu_kernels_for(levels[l]);
        for (size_t a = 0; a < sizeof act_types / sizeof act_types[0]; a++) {
            const struct kt_type_traits *at = kt_type_traits(act_types[a]);
            const kt_from_float_fn simd = t->type[weight_for[a]].quantize_act;
            int mismatched_rows = 0;
            for (int variant = 0; variant < 64; variant++) {
                const int64_t blocks = variant < 8 ? variant + 1 : 1 + (int64_t)(kt_test_rand_u64(&g_rng) % 28);
                const int64_t n = variant == 63 ? max_n : blocks * KT_QK_K;
                quantizer_input(x, n, variant);
                const size_t bytes = kt_type_row_bytes(act_types[a], n);
                memset(ref, 0xa5, cap);
                memset(got, 0x5a, cap);
                at->from_float(x, ref, n);
                simd(x, got, n);
                if (memcmp(ref, got, bytes) != 0) {
                    size_t k = 0;
                    while (ref[k] == got[k])
                        k++;
                    if (mismatched_rows++ == 0)
                        fprintf(stderr, "  %s %s: n=%lld variant %d first differs at byte %zu (%02x vs %02x)\n",
                                kt_isa_name(levels[l]), at->name, (long long)n, variant, k, ref[k], got[k]);
                }
                KT_CHECK(got[bytes] == 0x5a, "%s %s wrote past its row", kt_isa_name(levels[l]), at->name);
            }
            KT_CHECK(mismatched_rows == 0, "%s %s: %d of 64 rows differ from quant.c", kt_isa_name(levels[l]), at->name,
                     mismatched_rows);
        }
    }
    free(x);
    free(ref);
    free(got);
}

/* ---------------------------------------------------------------------------- */
/* dot products                                                                  */
/* ---------------------------------------------------------------------------- */

/* Row lengths: 1, 3, 6, 7, 13 blocks and a real hidden size (7168); float
 * types also get lengths that exercise every tail of the 32/8/1 loops. */
static int lengths_for(int type, int64_t n[12])
{
    const int64_t be = kt_type_traits(type)->block_elems;
    if (be == 1) {
        const int64_t f[] = {1, 3, 7, 13, 31, 33, 40, 257, 7168, 7171};
        memcpy(n, f, sizeof f);
        return (int)(sizeof f / sizeof f[0]);
    }
    const int64_t blocks[] = {1, 3, 6, 7, 13};
    int c = 0;
    for (size_t i = 0; i < sizeof blocks / sizeof blocks[0]; i++)
        n[c++] = blocks[i] * be;
    n[c++] = 7168;
    return c;
}

static double sum_abs_products(int type, int64_t n, const void *w, const float *x)
{
    float *wf = kt_test_xmalloc((size_t)n * sizeof *wf);
    kt_type_traits(type)->to_float(w, wf, n);
    double s = 0.0;
    for (int64_t i = 0; i < n; i++)
        s += fabs((double)wf[i] * x[i]);
    free(wf);
    return s;
}

static void simd_dots_match_scalar_twins(void)
{
    enum kt_isa levels[KT_ISA_AMX];
    const int nl = simd_levels(levels);
    if (nl == 0) {
        printf("  skipped: no AVX2 (with FMA and F16C) on this CPU\n");
        return;
    }
    const struct kt_cpu_kernels *s = scalar_kernels();
    const int64_t max_n = 7171;
    float *x = kt_test_xmalloc((size_t)max_n * sizeof *x);
    void *w = kt_test_xmalloc(kt_type_row_bytes(KT_TYPE_F32, max_n));
    void *act = kt_test_xmalloc(kt_type_row_bytes(KT_TYPE_F32, max_n));
    double worst_float_err = 0.0;
    for (int l = 0; l < nl; l++) {
        const struct kt_cpu_kernels *t = kt_cpu_kernels_for(levels[l]);
        for (int type = 0; type < KT_TYPE_COUNT; type++) {
            if (!has_reference_dot(type))
                continue;
            const struct kt_type_traits *tr = kt_type_traits(type);
            const bool exact = tr->is_quantized;
            int64_t lengths[12];
            const int nlen = lengths_for(type, lengths);
            int compared = 0, nonzero = 0, failed = 0;
            for (int li = 0; li < nlen; li++) {
                const int64_t n = lengths[li];
                for (int wp = 0; wp < W_PATTERNS; wp++) {
                    for (int ap = 0; ap < A_PATTERNS; ap++) {
                        make_weights(type, n, (enum weight_pattern)wp, w);
                        const int64_t act_block = kt_type_traits(tr->vec_dot_type)->block_elems;
                        make_activations(x, n, (enum act_pattern)ap, act_block > 8 ? act_block : 8);
                        s->type[type].quantize_act(x, act, n);
                        float ref = NAN, got = NAN;
                        s->type[type].vec_dot(n, &ref, w, act);
                        t->type[type].vec_dot(n, &got, w, act);
                        bool ok;
                        if (exact) {
                            ok = f32_bits(ref) == f32_bits(got);
                        } else {
                            const double bound = sum_abs_products(type, n, w, x);
                            const double err = fabs((double)ref - (double)got);
                            ok = err <= ((double)n / 32.0 + 20.0) * 0x1p-24 * bound;
                            if (bound > 0.0 && err / bound > worst_float_err)
                                worst_float_err = err / bound;
                        }
                        ok = ok && isfinite(ref);
                        if (!ok && failed++ < 3)
                            fprintf(stderr, "  %s %s n=%lld weights %s, activations %s: ref %.9g, simd %.9g\n",
                                    kt_isa_name(levels[l]), tr->name, (long long)n, weight_pattern_names[wp],
                                    act_pattern_names[ap], ref, got);
                        compared++;
                        nonzero += ref != 0.0f;
                    }
                }
            }
            KT_CHECK(failed == 0, "%s %s: %d of %d dot products differ from the reference%s", kt_isa_name(levels[l]),
                     tr->name, failed, compared, exact ? " (must be bit-exact)" : "");
            KT_CHECK(nonzero > compared / 2, "%s %s: only %d of %d reference results nonzero: a vacuous comparison",
                     kt_isa_name(levels[l]), tr->name, nonzero, compared);
        }
    }
    printf("  float dots: worst |simd - ref| / sum|w*a| = %.2e\n", worst_float_err);
    free(x);
    free(w);
    free(act);
}

/* The float row ops (attention scores and axpy) of every SIMD level give the
 * scalar twin's bits on odd lengths and row counts (tails of 1-7 elements,
 * 1-3 rows past a group of four), misaligned rows, a strided output, and
 * values that cancel. */
static void f32_row_ops_match_scalar_twins_on_odd_shapes(void)
{
    enum kt_isa levels[KT_ISA_AMX];
    const int nl = simd_levels(levels);
    if (nl == 0) {
        printf("  skipped: no AVX2 (with FMA and F16C) on this CPU\n");
        return;
    }
    const struct kt_cpu_kernels *s = scalar_kernels();
    enum { MAX_N = 583, MAX_ROWS = 13, STRIDE = 3 };
    float *x = kt_test_xmalloc((MAX_N + 1) * sizeof *x);
    float *data = kt_test_xmalloc((size_t)MAX_ROWS * (MAX_N + 1) * sizeof *data);
    float ref[MAX_ROWS * STRIDE], got[MAX_ROWS * STRIDE], y_ref[MAX_N], y_got[MAX_N];
    const float *rows[MAX_ROWS];
    uint64_t seed = 0x243f6a8885a308d3ull;
    for (int64_t i = 0; i < (int64_t)MAX_ROWS * (MAX_N + 1); i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        data[i] = ((float)(int32_t)(seed >> 32) * 0x1p-31f) * (i % 7 == 0 ? 1e3f : 1.0f); /* mixed magnitudes */
    }
    for (int64_t i = 0; i < MAX_N + 1; i++)
        x[i] = data[i * 5 % ((int64_t)MAX_ROWS * MAX_N)] - 0.25f;
    const int64_t lengths[] = {1, 3, 7, 8, 9, 15, 17, 64, 127, 192, 513, 576, 583};
    int compared = 0, failed = 0, nonzero = 0;
    for (int l = 0; l < nl; l++) {
        const struct kt_cpu_f32_kernels *t = &kt_cpu_kernels_for(levels[l])->f32;
        for (size_t li = 0; li < sizeof lengths / sizeof lengths[0]; li++) {
            const int64_t n = lengths[li];
            for (int64_t n_rows = 1; n_rows <= MAX_ROWS; n_rows++) {
                for (int64_t r = 0; r < n_rows; r++) /* odd offsets: rows not 32-byte aligned */
                    rows[r] = data + r * (MAX_N + 1) + (r % 2);
                const float *xs = x + (n_rows % 2);
                for (int i = 0; i < MAX_ROWS * STRIDE; i++)
                    ref[i] = got[i] = -1.0f;
                s->f32.dot_rows(xs, rows, n_rows, n, 0.0883883f, ref, STRIDE);
                t->dot_rows(xs, rows, n_rows, n, 0.0883883f, got, STRIDE);
                for (int i = 0; i < MAX_ROWS * STRIDE; i++) {
                    const bool ok = f32_bits(ref[i]) == f32_bits(got[i]);
                    if (!ok && failed++ < 3)
                        fprintf(stderr, "  %s dot_rows n=%lld rows=%lld out %d: ref %.9g, simd %.9g\n",
                                kt_isa_name(levels[l]), (long long)n, (long long)n_rows, i, ref[i], got[i]);
                    compared++;
                    nonzero += i % STRIDE == 0 && i / STRIDE < n_rows && ref[i] != 0.0f;
                }
            }
            for (int64_t i = 0; i < n; i++)
                y_ref[i] = y_got[i] = data[(i * 3 + 1) % MAX_N];
            s->f32.axpy(y_ref, -0.7310586f, rows[1], n);
            t->axpy(y_got, -0.7310586f, rows[1], n);
            for (int64_t i = 0; i < n; i++) {
                if (f32_bits(y_ref[i]) != f32_bits(y_got[i]) && failed++ < 3)
                    fprintf(stderr, "  %s axpy n=%lld element %lld: ref %.9g, simd %.9g\n", kt_isa_name(levels[l]),
                            (long long)n, (long long)i, y_ref[i], y_got[i]);
                compared++;
            }
        }
    }
    KT_CHECK(s->f32.dot_rows == kt_dot_rows_f32 && s->f32.axpy == kt_axpy_f32, "the scalar level is ops.c's twins");
    KT_CHECK(failed == 0, "%d of %d float row results differ from the scalar twins (must be bit-exact)", failed,
             compared);
    KT_CHECK(nonzero > compared / (4 * STRIDE), "only %d nonzero scores: a vacuous comparison", nonzero);
    free(x);
    free(data);
}

/* The cache-row ops (scores and axpy on F32, BF16 or F16 rows) of every level
 * give the reference's bits (kt_dot_rows_typed, kt_axpy_typed) on odd
 * lengths and row counts, rows at odd element offsets and a strided output;
 * the reference on BF16/F16 rows gives kt_dot_rows_f32's bits on the rows
 * widened (so the cache's type changes only what was stored); and a row
 * ending at a guard page is never read past. */
static void cache_row_ops_match_the_reference_on_odd_shapes(void)
{
    enum { MAX_N = 583, MAX_ROWS = 13, STRIDE = 3 };
    const int64_t lengths[] = {1, 3, 7, 8, 9, 15, 17, 64, 127, 192, 513, 576, 583};
    float *x = kt_test_xmalloc((MAX_N + 1) * sizeof *x);
    float *data = kt_test_xmalloc((size_t)MAX_ROWS * (MAX_N + 1) * sizeof *data);
    float *wide = kt_test_xmalloc((size_t)MAX_ROWS * (MAX_N + 1) * sizeof *wide);
    uint8_t *stored = kt_test_xmalloc((size_t)MAX_ROWS * (MAX_N + 1) * sizeof(float));
    float ref[MAX_ROWS * STRIDE], got[MAX_ROWS * STRIDE], y_ref[MAX_N], y_got[MAX_N];
    const void *rows[MAX_ROWS];
    const float *wide_rows[MAX_ROWS];
    uint64_t seed = 0x13198a2e03707344ull;
    for (int64_t i = 0; i < (int64_t)MAX_ROWS * (MAX_N + 1); i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        data[i] = ((float)(int32_t)(seed >> 32) * 0x1p-31f) * (i % 7 == 0 ? 30.0f : 1.0f); /* within F16's range */
    }
    for (int64_t i = 0; i < MAX_N + 1; i++)
        x[i] = data[i * 5 % ((int64_t)MAX_ROWS * MAX_N)] - 0.25f;
    int compared = 0, failed = 0, nonzero = 0, levels = 0;
    for (int rt = 0; rt < KT_ROW_TYPE_COUNT; rt++) {
        const enum kt_row_type t = (enum kt_row_type)rt;
        kt_row_from_f32(t, stored, data, (int64_t)MAX_ROWS * (MAX_N + 1));
        kt_row_to_f32(t, wide, stored, (int64_t)MAX_ROWS * (MAX_N + 1));
        for (int isa = KT_ISA_SCALAR; isa <= KT_ISA_AMX; isa++) {
            const struct kt_cpu_kernels *k = kt_cpu_kernels_for((enum kt_isa)isa);
            if (!k)
                continue;
            levels += rt == 0;
            const struct kt_cpu_row_kernels *r = &k->row[t];
            for (size_t li = 0; li < sizeof lengths / sizeof lengths[0]; li++) {
                const int64_t n = lengths[li];
                for (int64_t n_rows = 1; n_rows <= MAX_ROWS; n_rows++) {
                    for (int64_t j = 0; j < n_rows; j++) { /* odd element offsets: rows not 16-byte aligned */
                        const int64_t at = j * (MAX_N + 1) + (j % 2);
                        rows[j] = kt_row_at(t, stored, at);
                        wide_rows[j] = wide + at;
                    }
                    const float *xs = x + (n_rows % 2);
                    for (int i = 0; i < MAX_ROWS * STRIDE; i++)
                        ref[i] = got[i] = -1.0f;
                    kt_dot_rows_typed(t, xs, rows, n_rows, n, 0.0883883f, ref, STRIDE);
                    r->dot_rows(xs, rows, n_rows, n, 0.0883883f, got, STRIDE);
                    for (int i = 0; i < MAX_ROWS * STRIDE; i++) {
                        const bool ok = f32_bits(ref[i]) == f32_bits(got[i]);
                        if (!ok && failed++ < 3)
                            fprintf(stderr, "  %s %s dot_rows n=%lld rows=%lld out %d: ref %.9g, got %.9g\n",
                                    kt_isa_name((enum kt_isa)isa), kt_row_type_name(t), (long long)n,
                                    (long long)n_rows, i, ref[i], got[i]);
                        compared++;
                        nonzero += i % STRIDE == 0 && i / STRIDE < n_rows && ref[i] != 0.0f;
                    }
                    if (isa == KT_ISA_SCALAR) { /* widening is exact: the F32 op on the widened rows agrees */
                        kt_dot_rows_f32(xs, wide_rows, n_rows, n, 0.0883883f, got, STRIDE);
                        for (int i = 0; i < MAX_ROWS * STRIDE; i++)
                            if (f32_bits(ref[i]) != f32_bits(got[i]) && failed++ < 3)
                                fprintf(stderr, "  %s widened n=%lld: %.9g vs %.9g\n", kt_row_type_name(t),
                                        (long long)n, ref[i], got[i]);
                    }
                }
                for (int64_t i = 0; i < n; i++)
                    y_ref[i] = y_got[i] = data[(i * 3 + 1) % MAX_N];
                kt_axpy_typed(t, y_ref, -0.7310586f, rows[1], n);
                r->axpy(y_got, -0.7310586f, rows[1], n);
                for (int64_t i = 0; i < n; i++) {
                    if (f32_bits(y_ref[i]) != f32_bits(y_got[i]) && failed++ < 3)
                        fprintf(stderr, "  %s %s axpy n=%lld element %lld: ref %.9g, got %.9g\n",
                                kt_isa_name((enum kt_isa)isa), kt_row_type_name(t), (long long)n, (long long)i,
                                y_ref[i], y_got[i]);
                    compared++;
                }
                /* the row's last element is the last byte before a guard page */
                struct guarded g;
                void *end_row = guarded_alloc(&g, (size_t)n * kt_row_type_size(t));
                memcpy(end_row, stored, (size_t)n * kt_row_type_size(t));
                const void *one[1] = {end_row};
                r->dot_rows(x, one, 1, n, 1.0f, got, 1);
                r->axpy(y_got, 0.5f, end_row, n);
                guarded_free(&g);
            }
        }
    }
    KT_CHECK(failed == 0, "%d of %d cache-row results differ from the reference (must be bit-exact)", failed,
             compared);
    KT_CHECK(levels >= 1 && nonzero > compared / (8 * STRIDE), "%d levels, only %d nonzero scores: vacuous", levels,
             nonzero);
    free(x);
    free(data);
    free(wide);
    free(stored);
}

/* The forms for several heads over one key block (dot_rows_multi,
 * axpy_rows) of every level give the reference's bits on odd query, output,
 * row and element counts (every tile and remainder of the SIMD kernels),
 * strided queries, scores and outputs, rows at odd offsets; nothing outside
 * the outputs is written, and a row ending at a guard page is never read
 * past. */
static void heads_row_ops_match_the_reference_on_odd_shapes(void)
{
    enum { MAX_N = 583, MAX_ROWS = 19, MAX_Q = 11, X_STRIDE = MAX_N + 3, OUT_STRIDE = MAX_ROWS + 2 };
    const int64_t lengths[] = {1, 7, 8, 9, 16, 17, 31, 32, 33, 48, 64, 127, 513, 576, 583};
    const int64_t row_counts[] = {1, 2, 3, 7, 8, 9, 10, 16, 17, 19};
    const int64_t query_counts[] = {1, 2, 3, 4, 5, 7, 8, 9, 11};
    const size_t n_x = (size_t)MAX_Q * X_STRIDE, n_out = (size_t)MAX_Q * OUT_STRIDE;
    float *x = kt_test_xmalloc(n_x * sizeof *x), *data = kt_test_xmalloc((size_t)MAX_ROWS * (MAX_N + 1) * sizeof *data);
    float *y_ref = kt_test_xmalloc(n_x * sizeof *y_ref), *y_got = kt_test_xmalloc(n_x * sizeof *y_got);
    float *ref = kt_test_xmalloc(n_out * sizeof *ref), *got = kt_test_xmalloc(n_out * sizeof *got);
    uint8_t *stored = kt_test_xmalloc((size_t)MAX_ROWS * (MAX_N + 1) * sizeof(float));
    const void *rows[MAX_ROWS];
    uint64_t seed = 0x452821e638d01377ull;
    for (int64_t i = 0; i < (int64_t)MAX_ROWS * (MAX_N + 1); i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        data[i] = ((float)(int32_t)(seed >> 32) * 0x1p-31f) * (i % 5 == 0 ? 20.0f : 1.0f);
    }
    for (size_t i = 0; i < n_x; i++)
        x[i] = data[(i * 7 + 3) % ((size_t)MAX_ROWS * MAX_N)] + 0.125f;
    int compared = 0, failed = 0, scores = 0, nonzero = 0, levels = 0;
    for (int rt = 0; rt < KT_ROW_TYPE_COUNT; rt++) {
        const enum kt_row_type t = (enum kt_row_type)rt;
        kt_row_from_f32(t, stored, data, (int64_t)MAX_ROWS * (MAX_N + 1));
        for (int isa = KT_ISA_SCALAR; isa <= KT_ISA_AMX; isa++) {
            const struct kt_cpu_kernels *k = kt_cpu_kernels_for((enum kt_isa)isa);
            if (!k)
                continue;
            levels += rt == 0;
            const struct kt_cpu_row_kernels *r = &k->row[t];
            for (size_t li = 0; li < sizeof lengths / sizeof lengths[0]; li++)
                for (size_t ri = 0; ri < sizeof row_counts / sizeof row_counts[0]; ri++)
                    for (size_t qi = 0; qi < sizeof query_counts / sizeof query_counts[0]; qi++) {
                        const int64_t n = lengths[li], n_rows = row_counts[ri], n_q = query_counts[qi];
                        for (int64_t j = 0; j < n_rows; j++)
                            rows[j] = kt_row_at(t, stored, j * (MAX_N + 1) + (j + qi) % 2);
                        for (size_t i = 0; i < n_out; i++)
                            ref[i] = got[i] = -1.0f;
                        kt_dot_rows_multi_typed(t, x, X_STRIDE, n_q, rows, n_rows, n, 0.0883883f, ref, OUT_STRIDE);
                        r->dot_rows_multi(x, X_STRIDE, n_q, rows, n_rows, n, 0.0883883f, got, OUT_STRIDE);
                        for (size_t i = 0; i < n_out; i++) {
                            if (f32_bits(ref[i]) != f32_bits(got[i]) && failed++ < 3)
                                fprintf(stderr, "  %s %s dot_rows_multi n=%lld rows=%lld queries=%lld out %zu: ref %.9g, got %.9g\n",
                                        kt_isa_name((enum kt_isa)isa), kt_row_type_name(t), (long long)n,
                                        (long long)n_rows, (long long)n_q, i, ref[i], got[i]);
                            const bool score = (int64_t)(i / OUT_STRIDE) < n_q && (int64_t)(i % OUT_STRIDE) < n_rows;
                            scores += score;
                            nonzero += score && ref[i] != 0.0f;
                            compared++;
                        }
                        /* the scores as weights: y_g += ref[g][r] * rows[r], the outputs strided */
                        for (size_t i = 0; i < n_x; i++)
                            y_ref[i] = y_got[i] = data[(i * 3 + 1) % MAX_N];
                        kt_axpy_rows_typed(t, y_ref, X_STRIDE, n_q, ref, OUT_STRIDE, rows, n_rows, n);
                        r->axpy_rows(y_got, X_STRIDE, n_q, ref, OUT_STRIDE, rows, n_rows, n);
                        for (size_t i = 0; i < n_x; i++) {
                            if (f32_bits(y_ref[i]) != f32_bits(y_got[i]) && failed++ < 3)
                                fprintf(stderr, "  %s %s axpy_rows n=%lld rows=%lld outputs=%lld element %zu: ref %.9g, got %.9g\n",
                                        kt_isa_name((enum kt_isa)isa), kt_row_type_name(t), (long long)n,
                                        (long long)n_rows, (long long)n_q, i, y_ref[i], y_got[i]);
                            compared++;
                        }
                    }
            for (size_t li = 0; li < sizeof lengths / sizeof lengths[0]; li++) {
                /* every row's last element is the last byte before a guard page */
                const int64_t n = lengths[li];
                struct guarded g;
                void *end_row = guarded_alloc(&g, (size_t)n * kt_row_type_size(t));
                memcpy(end_row, stored, (size_t)n * kt_row_type_size(t));
                const void *same[MAX_ROWS];
                for (int j = 0; j < MAX_ROWS; j++)
                    same[j] = end_row;
                r->dot_rows_multi(x, X_STRIDE, MAX_Q, same, MAX_ROWS, n, 1.0f, got, OUT_STRIDE);
                r->axpy_rows(y_got, X_STRIDE, MAX_Q, got, OUT_STRIDE, same, MAX_ROWS, n);
                guarded_free(&g);
            }
        }
    }
    KT_CHECK(failed == 0, "%d of %d results for several heads differ from the reference (must be bit-exact)", failed,
             compared);
    KT_CHECK(levels >= 1 && nonzero > scores * 9 / 10, "%d levels, only %d nonzero scores of %d: vacuous", levels,
             nonzero, scores);
    free(x);
    free(data);
    free(y_ref);
    free(y_got);
    free(ref);
    free(got);
    free(stored);
}

/* A kernel that reads one element past n faults on the guard page. */
static void kernels_stay_inside_their_rows(void)
{
    enum kt_isa all[KT_ISA_AMX + 1] = {KT_ISA_SCALAR};
    const int nl = 1 + simd_levels(all + 1);
    float *x = kt_test_xmalloc(7171 * sizeof *x);
    for (int l = 0; l < nl; l++) {
        const struct kt_cpu_kernels *t = kt_cpu_kernels_for(all[l]);
        for (int type = 0; type < KT_TYPE_COUNT; type++) {
            if (!has_reference_dot(type))
                continue;
            const struct kt_type_traits *tr = kt_type_traits(type);
            const int64_t n = tr->block_elems == 1 ? 7171 : 13 * tr->block_elems;
            struct guarded gw, ga, gx;
            void *w = guarded_alloc(&gw, kt_type_row_bytes(type, n));
            void *act = guarded_alloc(&ga, kt_type_row_bytes(tr->vec_dot_type, n));
            float *xg = guarded_alloc(&gx, (size_t)n * sizeof *xg);
            make_weights(type, n, W_RANDOM_BITS, w);
            make_activations(x, n, A_GAUSSIAN, 32);
            memcpy(xg, x, (size_t)n * sizeof *xg);
            t->type[type].quantize_act(xg, act, n); /* reads xg, writes act: both end at a guard */
            float ref, got;
            scalar_kernels()->type[type].vec_dot(n, &ref, w, act);
            t->type[type].vec_dot(n, &got, w, act);
            KT_CHECK(isfinite(got), "%s %s: non-finite result", kt_isa_name(all[l]), tr->name);
            guarded_free(&gw);
            guarded_free(&ga);
            guarded_free(&gx);
        }
    }
    free(x);
}

/* gemv = one vec_dot per row, bit for bit, at every level. */
static void gemv_equals_one_vec_dot_per_row(void)
{
    enum kt_isa all[KT_ISA_AMX + 1] = {KT_ISA_SCALAR};
    const int nl = 1 + simd_levels(all + 1);
    const int64_t n = 512, n_rows = 11;
    float x[512], out[11];
    for (int l = 0; l < nl; l++) {
        const struct kt_cpu_kernels *t = kt_cpu_kernels_for(all[l]);
        for (int type = 0; type < KT_TYPE_COUNT; type++) {
            if (!has_reference_dot(type))
                continue;
            const struct kt_type_traits *tr = kt_type_traits(type);
            const size_t row_bytes = kt_type_row_bytes(type, n) + 16; /* rows need not be packed */
            uint8_t *w = kt_test_xmalloc(row_bytes * (size_t)n_rows);
            void *act = kt_test_xmalloc(kt_type_row_bytes(tr->vec_dot_type, n));
            for (int64_t r = 0; r < n_rows; r++)
                make_weights(type, n, (enum weight_pattern)(r % W_PATTERNS), w + (size_t)r * row_bytes);
            make_activations(x, n, A_GAUSSIAN, 32);
            t->type[type].quantize_act(x, act, n);
            for (int64_t r = 0; r < n_rows; r++)
                out[r] = NAN;
            t->type[type].gemv(n, out, w, row_bytes, act, n_rows);
            int differ = 0;
            for (int64_t r = 0; r < n_rows; r++) {
                float one;
                t->type[type].vec_dot(n, &one, w + (size_t)r * row_bytes, act);
                differ += f32_bits(one) != f32_bits(out[r]);
            }
            KT_CHECK(differ == 0, "%s %s: %d of %lld gemv rows differ from vec_dot", kt_isa_name(all[l]), tr->name,
                     differ, (long long)n_rows);
            free(w);
            free(act);
        }
    }
}

/* gemv again on odd row counts and lengths, rows packed and the weights and
 * activation ending at a PROT_NONE page: each row still equals vec_dot. */
static void gemv_odd_shapes_in_bounds(void)
{
    enum kt_isa all[KT_ISA_AMX + 1] = {KT_ISA_SCALAR};
    const int nl = 1 + simd_levels(all + 1);
    const int64_t rows[] = {1, 2, 3, 5, 7, 33}, blocks[] = {1, 3, 7, 28};
    float *x = kt_test_xmalloc(28 * 256 * sizeof *x), out[33];
    for (int l = 0; l < nl; l++) {
        const struct kt_cpu_kernels *t = kt_cpu_kernels_for(all[l]);
        for (int type = 0; type < KT_TYPE_COUNT; type++) {
            if (!has_reference_dot(type))
                continue;
            const struct kt_type_traits *tr = kt_type_traits(type);
            for (size_t bi = 0; bi < sizeof blocks / sizeof blocks[0]; bi++) {
                const int64_t n = blocks[bi] * 256;
                const size_t row_bytes = kt_type_row_bytes(type, n);
                make_activations(x, n, A_GAUSSIAN, 32);
                struct guarded ga;
                void *act = guarded_alloc(&ga, kt_type_row_bytes(tr->vec_dot_type, n));
                t->type[type].quantize_act(x, act, n);
                for (size_t ri = 0; ri < sizeof rows / sizeof rows[0]; ri++) {
                    const int64_t n_rows = rows[ri];
                    struct guarded gw;
                    uint8_t *w = guarded_alloc(&gw, row_bytes * (size_t)n_rows);
                    for (int64_t r = 0; r < n_rows; r++)
                        make_weights(type, n, (enum weight_pattern)((r + ri) % W_PATTERNS), w + (size_t)r * row_bytes);
                    for (int64_t r = 0; r < 33; r++)
                        out[r] = NAN;
                    t->type[type].gemv(n, out, w, row_bytes, act, n_rows);
                    int differ = 0;
                    for (int64_t r = 0; r < n_rows; r++) {
                        float one;
                        t->type[type].vec_dot(n, &one, w + (size_t)r * row_bytes, act);
                        differ += f32_bits(one) != f32_bits(out[r]);
                    }
                    for (int64_t r = n_rows; r < 33; r++)
                        differ += !isnan(out[r]);
                    KT_CHECK(differ == 0, "%s %s: %d of %lld gemv rows differ from vec_dot (%lld blocks)",
                             kt_isa_name(all[l]), tr->name, differ, (long long)n_rows, (long long)blocks[bi]);
                    guarded_free(&gw);
                }
                guarded_free(&ga);
            }
        }
    }
    free(x);
}

/* ---------------------------------------------------------------------------- */
/* bandwidth report (printed, never asserted)                                    */
/* ---------------------------------------------------------------------------- */

#if defined(__SANITIZE_ADDRESS__)
static const bool sanitized = true; /* timings would measure the sanitizer */
#else
static const bool sanitized = false;
#endif

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

struct stream_job {
    const struct kt_cpu_type_kernels *row; /* NULL: the triad */
    int64_t n;
    const uint8_t *w;
    size_t row_bytes;
    const void *act;
    float *out;
    int64_t r0, r1; /* rows, or triad elements */
    float *a;
    const float *b, *c;
};

static void *stream_run(void *p)
{
    struct stream_job *j = p;
    if (j->row) {
        j->row->gemv(j->n, j->out + j->r0, j->w + (size_t)j->r0 * j->row_bytes, j->row_bytes, j->act, j->r1 - j->r0);
    } else {
        float *restrict a = j->a;
        const float *restrict b = j->b, *restrict c = j->c;
        for (int64_t i = j->r0; i < j->r1; i++)
            a[i] = b[i] + 3.0f * c[i];
    }
    return NULL;
}

/* Wall time of one run of the job's rows (or elements) split over `threads`. */
static double stream_once(const struct stream_job *base, int64_t count, int threads)
{
    struct stream_job jobs[2];
    pthread_t tid[2];
    for (int k = 0; k < threads; k++) {
        jobs[k] = *base;
        jobs[k].r0 = count * k / threads;
        jobs[k].r1 = count * (k + 1) / threads;
    }
    const double t0 = now_s();
    for (int k = 1; k < threads; k++)
        pthread_create(&tid[k], NULL, stream_run, &jobs[k]);
    stream_run(&jobs[0]);
    for (int k = 1; k < threads; k++)
        pthread_join(tid[k], NULL);
    return now_s() - t0;
}

static void *big_alloc(size_t bytes)
{
    void *p = NULL;
    if (posix_memalign(&p, 2u << 20, bytes) != 0) {
        fprintf(stderr, "out of memory\n");
        exit(2);
    }
    madvise(p, bytes, MADV_HUGEPAGE); /* as the expert store will; ignored where unsupported */
    return p;
}

/*
 * GB/s of weight bytes for GEMVs over a KT_BENCH_MB (default 64) MiB matrix
 * of rows of 7168, 1 and 2 threads, against a triad a = b + 3c over three
 * arrays as large as the matrix together.  Runs are interleaved and the best
 * of each kept, so every ratio compares numbers taken under the same load.
 */
static void print_weight_streaming_bandwidth(void)
{
    if (sanitized) {
        printf("  info: bandwidth not measured under sanitizers\n");
        return;
    }
    enum { N_TYPES = 3, REPS = 9 };
    const int types[N_TYPES] = {KT_TYPE_Q4_K, KT_TYPE_Q8_0, KT_TYPE_Q6_K};
    const char *mb_env = getenv("KT_BENCH_MB");
    const size_t matrix_bytes = (size_t)(mb_env && atoi(mb_env) > 0 ? atoi(mb_env) : 64) << 20;
    const int64_t n = 7168;
    const struct kt_cpu_kernels *k = kt_cpu_kernels();
    float *x = kt_test_xmalloc((size_t)n * sizeof *x);
    make_activations(x, n, A_GAUSSIAN, 32);

    /* jobs[0]: triad; jobs[1 + t]: GEMV of types[t]; count[] rows or elements, bytes[] moved */
    struct stream_job jobs[1 + N_TYPES];
    int64_t count[1 + N_TYPES];
    double bytes[1 + N_TYPES];
    const int64_t ne = (int64_t)(matrix_bytes / 3 / sizeof(float));
    float *a = big_alloc((size_t)ne * sizeof *a), *b = big_alloc((size_t)ne * sizeof *b);
    float *c = big_alloc((size_t)ne * sizeof *c);
    for (int64_t i = 0; i < ne; i++) {
        a[i] = 0.0f;
        b[i] = (float)(i & 7);
        c[i] = 0.5f;
    }
    jobs[0] = (struct stream_job){.a = a, .b = b, .c = c};
    count[0] = ne;
    bytes[0] = 3.0 * (double)ne * sizeof(float);
    for (int t = 0; t < N_TYPES; t++) {
        const size_t row_bytes = kt_type_row_bytes(types[t], n);
        const int64_t rows = (int64_t)(matrix_bytes / row_bytes);
        uint8_t *w = big_alloc((size_t)rows * row_bytes);
        for (int64_t r = 0; r < rows; r++) { /* 64 random rows repeated: the bytes still stream */
            if (r < 64)
                make_weights(types[t], n, W_RANDOM_BITS, w + (size_t)r * row_bytes);
            else
                memcpy(w + (size_t)r * row_bytes, w + (size_t)(r % 64) * row_bytes, row_bytes);
        }
        void *act = kt_test_xmalloc(kt_type_row_bytes(k->type[types[t]].vec_dot_type, n));
        k->type[types[t]].quantize_act(x, act, n);
        jobs[1 + t] = (struct stream_job){.row = &k->type[types[t]], .n = n, .w = w, .row_bytes = row_bytes,
                                          .act = act, .out = kt_test_xmalloc((size_t)rows * sizeof(float))};
        count[1 + t] = rows;
        bytes[1 + t] = (double)rows * (double)row_bytes;
    }

    double best[1 + N_TYPES][3];
    for (int j = 0; j < 1 + N_TYPES; j++)
        best[j][1] = best[j][2] = 1e30;
    for (int rep = 0; rep < REPS; rep++) {
        for (int j = 0; j < 1 + N_TYPES; j++) {
            for (int th = 1; th <= 2; th++) {
                const double dt = stream_once(&jobs[j], count[j], th);
                best[j][th] = dt < best[j][th] ? dt : best[j][th];
            }
        }
    }
    printf("  info: triad a=b+3c over %zu MiB: %.2f GB/s 1 thread, %.2f GB/s 2 threads\n", matrix_bytes >> 20,
           bytes[0] / best[0][1] / 1e9, bytes[0] / best[0][2] / 1e9);
    for (int t = 0; t < N_TYPES; t++) {
        const double g1 = bytes[1 + t] / best[1 + t][1] / 1e9, g2 = bytes[1 + t] / best[1 + t][2] / 1e9;
        struct stream_job scalar = jobs[1 + t];
        scalar.row = &scalar_kernels()->type[types[t]];
        const double gs = bytes[1 + t] / stream_once(&scalar, count[1 + t], 1) / 1e9;
        printf("  info: %s GEMV, rows of %lld, %zu MiB, %s: %.2f GB/s 1 thread (%.0f%% of triad), "
               "%.2f GB/s 2 threads (%.0f%%); scalar reference %.2f GB/s\n",
               kt_type_name(types[t]), (long long)n, matrix_bytes >> 20, kt_isa_name(k->isa), g1,
               100.0 * g1 / (bytes[0] / best[0][1] / 1e9), g2, 100.0 * g2 / (bytes[0] / best[0][2] / 1e9), gs);
        free((void *)jobs[1 + t].w);
        free((void *)jobs[1 + t].act);
        free(jobs[1 + t].out);
    }
    free(a);
    free(b);
    free(c);
    free(x);
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "--print-isa") == 0)
        return print_isa_and_exit();
    KT_RUN(detected_features_match_proc_cpuinfo);
    KT_RUN(each_supported_level_has_a_table_and_no_other);
    KT_RUN(every_row_with_a_reference_dot_is_filled_at_every_level);
    KT_RUN(scalar_level_is_the_reference);
    KT_RUN(avx2_rows_use_simd_kernels_for_the_hot_types);
    KT_RUN(kt_isa_env_forces_a_level_at_or_below_the_cpu);
    KT_RUN(half_widening_agrees_with_quant_c_on_every_value);
    KT_RUN(activation_quantizers_match_reference_bit_for_bit);
    KT_RUN(simd_dots_match_scalar_twins);
    KT_RUN(f32_row_ops_match_scalar_twins_on_odd_shapes);
    KT_RUN(cache_row_ops_match_the_reference_on_odd_shapes);
    KT_RUN(heads_row_ops_match_the_reference_on_odd_shapes);
    KT_RUN(kernels_stay_inside_their_rows);
    KT_RUN(gemv_equals_one_vec_dot_per_row);
    KT_RUN(gemv_odd_shapes_in_bounds);
    KT_RUN(print_weight_streaming_bandwidth);
    return kt_test_finish();
}
