/*
 * test_kernels_packed.c - the packed expert layouts (kernels/cpu/packed.h,
 * each level's `packed` row for Q4_K, Q8_0 and Q4_0) against the scalar
 * reference vec_dot.
 *
 * For every level this CPU has and every packed format in its table: pack
 * GGUF rows (quantized by quant.c's reference quantizers, random bits and
 * extreme codes), run the format's gemm on odd shapes (rows around the group
 * size, tokens around the register tiles, n around the k chunks) and compare
 * every (row, token) output with kt_vec_dot_*_ref: memcmp-equal, as every
 * format here says it is exact, and no output outside the n_rows x n_tok
 * block may change.  Buffers are exact-size heap blocks so ASan sees any
 * read past them, and once more end at a guard page (the kernels' asm reads
 * are invisible to ASan).  Then the packing itself: padding rows are zero
 * bytes and every byte is written, slices from a group boundary give the
 * full matrix's floats, and a token's outputs do not depend on its batch.
 * On a CPU without AVX-512 the AVX-512 cases say so and pass.
 */
#include "testlib.h"

#include "cpu/dispatch.h"
#include "quant.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

/* ---------------------------------------------------------------------------- */
/* helpers                                                                       */
/* ---------------------------------------------------------------------------- */

static unsigned long long g_rng = 0x7061636b6564ULL;

static const float SENTINEL = -31415.926f;

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

/* A 64-byte aligned block of exactly `bytes` (a multiple of 64), as the
 * expert store hands out. */
static void *aligned_buffer(size_t bytes)
{
    void *p = aligned_alloc(64, bytes ? bytes : 64);
    if (!p) {
        fprintf(stderr, "out of memory\n");
        exit(2);
    }
    return p;
}

/*
 * Weight row r of n elements: r % 3 == 0 quantized gaussians with outliers,
 * 1 random bits with finite scales, 2 extreme codes (Q8_0 all -128, Q4_K all
 * 15 with every 6-bit scale and min 63, Q4_0 all code 0 (-8) or, every other
 * such row, all 15 (+7)), which push every integer sum to its bound.  The
 * extreme rows' d is random in [0.5, 1) (a full fp16 mantissa): against
 * make_act's all-positive tokens their block sums are large and carry low
 * bits, so a product of d, da and sumi associated otherwise than the
 * reference's (dw * da) * sumi rounds differently, and the test sees it.
 */
static void make_row(int type, int64_t n, int64_t r, uint8_t *w)
{
    const struct kt_type_traits *t = kt_type_traits(type);
    const int kind = (int)(r % 3);
    if (kind == 0) {
        float *x = kt_test_xmalloc((size_t)n * sizeof *x);
        for (int64_t i = 0; i < n; i++)
            x[i] = 0.5f * kt_test_rand_normal(&g_rng) * (kt_test_rand_u64(&g_rng) % 64 == 0 ? 50.0f : 1.0f);
        t->from_float(x, w, n);
        free(x);
        return;
    }
    for (int64_t b = 0; b < n / t->block_elems; b++) {
        uint8_t *blk = w + (size_t)b * t->block_bytes;
        for (size_t k = 0; k < t->block_bytes; k++)
            blk[k] = kind == 1               ? (uint8_t)kt_test_rand_u64(&g_rng)
                     : type == KT_TYPE_Q8_0  ? 0x80
                     : type == KT_TYPE_Q4_0  ? (r % 2 ? 0xff : 0x00)
                                             : 0xff;
        /* d: the first field of every block type here */
        put_fp16(blk, kind == 1 ? kt_test_rand_normal(&g_rng) * 0.05f : kt_test_rand_uniform(&g_rng, 0.5f, 1.0f));
        if (type == KT_TYPE_Q4_K)
            put_fp16(blk + 2, kind == 1 ? kt_test_rand_normal(&g_rng) * 0.05f : 0.5f); /* dmin */
    }
}

/* Activation t: gaussians with outliers; every 4th all +-1 (each quant at
 * its limit); every 6th (from t = 5) all in [0.5, 1): quants 64 .. 127 of
 * one sign, large block sums; every 5th with its first half zero. */
static void make_act(int64_t n, int64_t t, float *x)
{
    for (int64_t i = 0; i < n; i++) {
        x[i] = kt_test_rand_normal(&g_rng) * (kt_test_rand_u64(&g_rng) % 100 == 0 ? 100.0f : 1.0f);
        if (t % 4 == 3)
            x[i] = kt_test_rand_u64(&g_rng) & 1 ? 1.0f : -1.0f;
        if (t % 6 == 5)
            x[i] = kt_test_rand_uniform(&g_rng, 0.5f, 1.0f);
        if (t % 5 == 4 && i < n / 2)
            x[i] = 0.0f;
    }
}

/* One problem: GGUF rows, their packed copy, activations, outputs. */
struct problem {
    const struct kt_packed_format *f;
    int type;
    int64_t n, n_rows, n_tok, y_stride;
    size_t row_bytes, act_bytes, packed_bytes;
    uint8_t *w;      /* (n_rows, row_bytes), GGUF layout */
    uint8_t *packed; /* kt_packed_bytes(f, n, n_rows) */
    uint8_t *a;      /* (n_tok, act_bytes), as quantize_act wrote it */
    float *y;        /* (n_tok, y_stride), SENTINEL outside the outputs */
};

/* act_pad: bytes after each activation row (0: rows back to back, and the
 * last one ends the buffer). */
static void problem_make(struct problem *p, const struct kt_cpu_type_kernels *k, int type, int64_t n,
                         int64_t n_rows, int64_t n_tok, size_t act_pad)
{
    *p = (struct problem){.f = k->packed, .type = type, .n = n, .n_rows = n_rows, .n_tok = n_tok};
    p->y_stride = n_rows + 5;
    p->row_bytes = kt_type_row_bytes(type, n);
    p->act_bytes = kt_type_row_bytes(k->vec_dot_type, n) + act_pad;
    p->packed_bytes = kt_packed_bytes(p->f, n, n_rows);
    p->w = kt_test_xmalloc(p->row_bytes * (size_t)n_rows);
    p->packed = aligned_buffer(p->packed_bytes);
    p->a = kt_test_xmalloc(p->act_bytes * (size_t)n_tok);
    p->y = kt_test_xmalloc((size_t)(p->y_stride * n_tok) * sizeof *p->y);
    float *x = kt_test_xmalloc((size_t)n * sizeof *x);
    for (int64_t r = 0; r < n_rows; r++)
        make_row(type, n, r, p->w + (size_t)r * p->row_bytes);
    for (int64_t t = 0; t < n_tok; t++) {
        make_act(n, t, x);
        memset(p->a + (size_t)t * p->act_bytes, 0x7f, p->act_bytes);
        k->quantize_act(x, p->a + (size_t)t * p->act_bytes, n);
    }
    free(x);
    memset(p->packed, 0xa5, p->packed_bytes);
    p->f->pack(n, p->w, p->row_bytes, n_rows, p->packed);
    for (int64_t i = 0; i < p->y_stride * n_tok; i++)
        p->y[i] = SENTINEL;
}

static void problem_free(struct problem *p)
{
    free(p->w);
    free(p->packed);
    free(p->a);
    free(p->y);
}

/* Lines of detail printed per format: the first few differences say enough. */
static int g_detail_lines;

/* Outputs that differ from the reference or sentinels that changed; *nonzero
 * counts nonzero references (a comparison of zeros proves little). */
static int problem_check(const struct problem *p, const char *what, int *nonzero)
{
    const kt_vec_dot_fn ref = kt_type_traits(p->type)->vec_dot;
    int differ = 0;
    for (int64_t t = 0; t < p->n_tok; t++)
        for (int64_t r = 0; r < p->y_stride; r++) {
            const float got = p->y[t * p->y_stride + r];
            float want = SENTINEL;
            if (r < p->n_rows) {
                ref(p->n, &want, p->w + (size_t)r * p->row_bytes, p->a + (size_t)t * p->act_bytes);
                *nonzero += want != 0.0f;
            }
            if (f32_bits(got) != f32_bits(want) && differ++ < 3 && g_detail_lines++ < 6)
                fprintf(stderr, "  %s %s n=%lld rows=%lld tok=%lld: y[%lld][%lld] = %.9g, want %.9g\n", p->f->name,
                        what, (long long)p->n, (long long)p->n_rows, (long long)p->n_tok, (long long)t,
                        (long long)r, got, want);
        }
    return differ;
}

/* Calls fn(level, type) for each Q4_K / Q8_0 / Q4_0 packed row of each level this CPU has. */
static int for_each_format(void (*fn)(const struct kt_cpu_kernels *k, int type))
{
    int formats = 0;
    for (int isa = KT_ISA_SCALAR; isa <= KT_ISA_AMX; isa++) {
        const struct kt_cpu_kernels *k = kt_cpu_kernels_for((enum kt_isa)isa);
        for (int type = 0; k && type < KT_TYPE_COUNT; type++)
            if (k->type[type].packed && (type == KT_TYPE_Q4_K || type == KT_TYPE_Q8_0 || type == KT_TYPE_Q4_0)) {
                g_detail_lines = 0;
                fn(k, type);
                formats++;
            }
    }
    return formats;
}

/* The n of each shape test: Q4_K in super-blocks, Q8_0 and Q4_0 in blocks
 * (odd ones, and 2048 and 7168, which 33 tokens split into several k chunks). */
static int shape_ns(int type, const int64_t **ns)
{
    static const int64_t q4_K[] = {256, 512, 7168}, legacy[] = {32, 96, 2048, 7168};
    *ns = type == KT_TYPE_Q4_K ? q4_K : legacy;
    return type == KT_TYPE_Q4_K ? 3 : 4;
}

/* ---------------------------------------------------------------------------- */
/* the formats and their table rows                                             */
/* ---------------------------------------------------------------------------- */

static void check_format_row(const struct kt_cpu_kernels *k, int type)
{
    const struct kt_packed_format *f = k->type[type].packed;
    KT_CHECK(f->name && f->group_bytes && f->pack && f->gemm, "%s %s: incomplete format", kt_isa_name(k->isa),
             kt_type_name(type));
    KT_CHECK(f->rows >= 1 && f->rows <= 16 && 16 % f->rows == 0, "%s: %u rows per group", f->name, f->rows);
    KT_CHECK(f->exact, "%s: not exact (this test holds it to bit for bit)", f->name);
    const int64_t be = kt_type_traits(type)->block_elems;
    for (int64_t n = be; n <= 64 * be; n += be)
        KT_CHECK(f->group_bytes(n) % 64 == 0 && f->group_bytes(n) > 0, "%s: group_bytes(%lld) = %zu", f->name,
                 (long long)n, f->group_bytes(n));
    if (k->isa <= KT_ISA_AVX512) /* these levels promise it: decode streams the packed bytes */
        KT_CHECK(kt_packed_bytes(f, 7168, 2048) <= kt_type_row_bytes(type, 7168) * 2048 * 21 / 20,
                 "%s: packed 2048 x 7168 is %zu bytes, more than 5%% over the GGUF rows", f->name,
                 kt_packed_bytes(f, 7168, 2048));
}

static void formats_are_complete_aligned_and_per_level(void)
{
    const int formats = for_each_format(check_format_row);
    const struct kt_cpu_kernels *avx2 = kt_cpu_kernels_for(KT_ISA_AVX2);
    const struct kt_cpu_kernels *avx512 = kt_cpu_kernels_for(KT_ISA_AVX512);
    const struct kt_cpu_kernels *scalar = kt_cpu_kernels_for(KT_ISA_SCALAR);
    KT_CHECK(!scalar->type[KT_TYPE_Q4_K].packed && !scalar->type[KT_TYPE_Q8_0].packed &&
                 !scalar->type[KT_TYPE_Q4_0].packed,
             "the scalar level keeps the GGUF layout");
    if (avx2) {
        KT_CHECK(avx2->type[KT_TYPE_Q4_K].packed && avx2->type[KT_TYPE_Q8_0].packed && avx2->type[KT_TYPE_Q4_0].packed,
                 "avx2 lacks a packed row");
        KT_CHECK(formats > 0, "no packed format on a CPU with AVX2");
    }
    if (!avx512) {
        printf("  skipped: no AVX-512 (F/BW/VL/VNNI/BF16) on this CPU\n");
        return;
    }
    const int own[] = {KT_TYPE_Q4_K, KT_TYPE_Q8_0, KT_TYPE_Q4_0};
    for (size_t i = 0; i < sizeof own / sizeof own[0]; i++) {
        const int type = own[i];
        KT_CHECK(avx512->type[type].packed && avx512->type[type].packed != avx2->type[type].packed,
                 "%s: avx512 has no packed row of its own", kt_type_name(type));
    }
}

/* ---------------------------------------------------------------------------- */
/* gemm = reference vec_dot for every pair                                       */
/* ---------------------------------------------------------------------------- */

static void check_odd_shapes(const struct kt_cpu_kernels *k, int type)
{
    const int64_t rows[] = {1, 15, 17, 33}, toks[] = {1, 3, 5, 8, 13, 17, 33};
    const int64_t *ns;
    const int n_ns = shape_ns(type, &ns);
    int differ = 0, nonzero = 0, outputs = 0;
    for (int ni = 0; ni < n_ns; ni++)
        for (size_t ri = 0; ri < sizeof rows / sizeof rows[0]; ri++)
            for (size_t ti = 0; ti < sizeof toks / sizeof toks[0]; ti++) {
                struct problem p;
                problem_make(&p, &k->type[type], type, ns[ni], rows[ri], toks[ti], ti % 2 ? 0 : 12);
                p.f->gemm(p.n, p.packed, p.n_rows, p.a, p.act_bytes, p.n_tok, p.y, p.y_stride);
                differ += problem_check(&p, kt_isa_name(k->isa), &nonzero);
                outputs += (int)(p.n_rows * p.n_tok);
                problem_free(&p);
            }
    KT_CHECK(differ == 0, "%s: %d of %d outputs differ from the reference (or wrote outside)",
             k->type[type].packed->name, differ, outputs);
    KT_CHECK(nonzero > outputs * 3 / 4, "%s: only %d of %d references nonzero", k->type[type].packed->name, nonzero,
             outputs);
}

static void packed_gemm_equals_the_reference_bit_for_bit_on_odd_shapes(void)
{
    if (for_each_format(check_odd_shapes) == 0)
        printf("  skipped: no level with packed formats on this CPU\n");
    if (!kt_cpu_kernels_for(KT_ISA_AVX512))
        printf("  skipped: no AVX-512 (F/BW/VL/VNNI/BF16) on this CPU\n");
}

/* Many tokens at a short n: Q8_0's term buffer splits the tokens (over 2048). */
static void check_many_tokens(const struct kt_cpu_kernels *k, int type)
{
    const int64_t n = type == KT_TYPE_Q4_K ? 256 : 64;
    struct problem p;
    problem_make(&p, &k->type[type], type, n, 19, 2100, 0);
    p.f->gemm(p.n, p.packed, p.n_rows, p.a, p.act_bytes, p.n_tok, p.y, p.y_stride);
    int nonzero = 0;
    const int differ = problem_check(&p, kt_isa_name(k->isa), &nonzero);
    KT_CHECK(differ == 0, "%s: %d of %lld outputs differ at 2100 tokens", p.f->name, differ,
             (long long)(p.n_rows * p.n_tok));
    problem_free(&p);
}

static void packed_gemm_equals_the_reference_for_thousands_of_tokens(void)
{
    for_each_format(check_many_tokens);
}

/* `bytes` ending exactly at an inaccessible page: a read past the end faults
 * (asm reads included, which ASan does not see).  *base and *span for
 * guarded_free. */
static uint8_t *guarded(size_t bytes, void **base, size_t *span)
{
    const size_t page = (size_t)sysconf(_SC_PAGESIZE), pages = (bytes + page - 1) / page + 1;
    *span = pages * page;
    *base = mmap(NULL, *span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (*base == MAP_FAILED || mprotect((uint8_t *)*base + (pages - 1) * page, page, PROT_NONE) != 0) {
        fprintf(stderr, "cannot map a guarded buffer\n");
        exit(2);
    }
    return (uint8_t *)*base + (pages - 1) * page - bytes;
}

/* Activations and packed weights that end at a guard page, for 1, 16 and 17
 * tokens and rows ending inside a group: the last token's last block and the
 * last group are read, nothing after them. */
static void check_guarded(const struct kt_cpu_kernels *k, int type)
{
    const int64_t toks[] = {1, 16, 17};
    const int64_t n = type == KT_TYPE_Q4_K ? 512 : 96;
    int differ = 0;
    for (size_t ti = 0; ti < sizeof toks / sizeof toks[0]; ti++) {
        struct problem p;
        problem_make(&p, &k->type[type], type, n, 2 * (int64_t)k->type[type].packed->rows + 1, toks[ti], 0);
        void *abase, *wbase;
        size_t aspan, wspan;
        uint8_t *a = guarded(p.act_bytes * (size_t)p.n_tok, &abase, &aspan);
        uint8_t *w = guarded(p.packed_bytes, &wbase, &wspan);
        memcpy(a, p.a, p.act_bytes * (size_t)p.n_tok);
        memcpy(w, p.packed, p.packed_bytes);
        p.f->gemm(p.n, w, p.n_rows, a, p.act_bytes, p.n_tok, p.y, p.y_stride);
        int nonzero = 0;
        differ += problem_check(&p, kt_isa_name(k->isa), &nonzero);
        munmap(abase, aspan);
        munmap(wbase, wspan);
        problem_free(&p);
    }
    KT_CHECK(differ == 0, "%s: %d outputs differ with guarded buffers", k->type[type].packed->name, differ);
}

static void reads_nothing_past_the_activations_or_the_packed_weights(void)
{
    for_each_format(check_guarded);
}

/* ---------------------------------------------------------------------------- */
/* packing                                                                       */
/* ---------------------------------------------------------------------------- */

/*
 * Packed with n_rows ending inside a group (a), and with the same rows plus
 * random ones filling that group (b): the bytes where a and b differ are the
 * padding rows' (or bytes pack never wrote, which start as different
 * garbage), and every one of them must be zero in a; the full groups must
 * match byte for byte.  Then the padding rows read as zero rows: a gemm over
 * the whole last group gives +0 for them.
 */
static void check_padding(const struct kt_cpu_kernels *k, int type)
{
    const struct kt_packed_format *f = k->type[type].packed;
    const int64_t n = type == KT_TYPE_Q4_K ? 768 : 96; /* Q8_0: an odd block count pads a pair */
    const int64_t n_rows = 2 * (int64_t)f->rows + 3, full = 3 * (int64_t)f->rows;
    const size_t row_bytes = kt_type_row_bytes(type, n), gb = f->group_bytes(n);
    uint8_t *w = kt_test_xmalloc(row_bytes * (size_t)full);
    for (int64_t r = 0; r < full; r++)
        make_row(type, n, r + 1, w + (size_t)r * row_bytes); /* +1: random bits in the padding rows */
    const size_t bytes = kt_packed_bytes(f, n, n_rows);
    KT_CHECK(bytes == kt_packed_bytes(f, n, full) && bytes == 3 * gb, "%s: %zu bytes for 3 groups", f->name, bytes);
    uint8_t *a = aligned_buffer(bytes), *b = aligned_buffer(bytes);
    memset(a, 0xa5, bytes);
    memset(b, 0x5a, bytes);
    f->pack(n, w, row_bytes, n_rows, a);
    f->pack(n, w, row_bytes, full, b);
    size_t padding = 0, dirty = 0;
    for (size_t i = 0; i < bytes; i++) {
        if (a[i] == b[i])
            continue;
        if (i < 2 * gb)
            dirty++; /* a full group depends on rows past it */
        padding++;
        dirty += a[i] != 0;
    }
    KT_CHECK(dirty == 0, "%s: %zu padding bytes not zero (or full groups differ)", f->name, dirty);
    KT_CHECK(padding > 0, "%s: the padding rows changed no byte: a vacuous comparison", f->name);

    /* gemm over the whole last group: padding rows give +0 */
    const struct kt_cpu_type_kernels *kr = &k->type[type];
    const size_t act_bytes = kt_type_row_bytes(kr->vec_dot_type, n);
    uint8_t *act = kt_test_xmalloc(act_bytes);
    float *x = kt_test_xmalloc((size_t)n * sizeof *x), y[48];
    make_act(n, 0, x);
    kr->quantize_act(x, act, n);
    for (int i = 0; i < 48; i++)
        y[i] = SENTINEL;
    f->gemm(n, a, full, act, act_bytes, 1, y, full);
    int nonzero_padding = 0;
    for (int64_t r = n_rows; r < full; r++)
        nonzero_padding += f32_bits(y[r]) != 0;
    KT_CHECK(nonzero_padding == 0, "%s: %d padding rows give a nonzero (or -0) output", f->name, nonzero_padding);
    free(w);
    free(a);
    free(b);
    free(act);
    free(x);
}

static void pack_zero_fills_padding_rows_and_defines_every_byte(void)
{
    for_each_format(check_padding);
}

/* Slices from each group boundary (kt_packed_rows) give the full matrix's
 * floats for their rows. */
static void check_slices(const struct kt_cpu_kernels *k, int type)
{
    const int64_t n = type == KT_TYPE_Q4_K ? 512 : 160;
    struct problem p;
    problem_make(&p, &k->type[type], type, n, 3 * (int64_t)k->type[type].packed->rows + 2, 5, 0);
    p.f->gemm(p.n, p.packed, p.n_rows, p.a, p.act_bytes, p.n_tok, p.y, p.y_stride);
    float *ys = kt_test_xmalloc((size_t)(p.y_stride * p.n_tok) * sizeof *ys);
    int differ = 0;
    for (int64_t first = p.f->rows; first < p.n_rows; first += p.f->rows) {
        for (int64_t i = 0; i < p.y_stride * p.n_tok; i++)
            ys[i] = SENTINEL;
        p.f->gemm(p.n, kt_packed_rows(p.f, p.packed, p.n, first), p.n_rows - first, p.a, p.act_bytes, p.n_tok, ys,
                  p.y_stride);
        for (int64_t t = 0; t < p.n_tok; t++)
            for (int64_t r = 0; r < p.y_stride; r++) {
                const float want = r < p.n_rows - first ? p.y[t * p.y_stride + first + r] : SENTINEL;
                differ += f32_bits(ys[t * p.y_stride + r]) != f32_bits(want);
            }
    }
    KT_CHECK(differ == 0, "%s: %d slice outputs differ from the full matrix's", p.f->name, differ);
    problem_free(&p);
    free(ys);
}

static void row_slices_from_group_boundaries_match_the_full_matrix(void)
{
    for_each_format(check_slices);
}

/* A token's floats do not depend on its batch: 21 tokens at once, then each
 * alone from the same activation bytes. */
static void check_batch_independence(const struct kt_cpu_kernels *k, int type)
{
    struct problem p;
    problem_make(&p, &k->type[type], type, 1024, 18, 21, 4);
    p.f->gemm(p.n, p.packed, p.n_rows, p.a, p.act_bytes, p.n_tok, p.y, p.y_stride);
    float one[18];
    int differ = 0;
    for (int64_t t = 0; t < p.n_tok; t++) {
        p.f->gemm(p.n, p.packed, p.n_rows, p.a + (size_t)t * p.act_bytes, p.act_bytes, 1, one, p.n_rows);
        differ += memcmp(one, &p.y[t * p.y_stride], sizeof one) != 0;
    }
    KT_CHECK(differ == 0, "%s: %d tokens give other floats alone than in a batch", p.f->name, differ);
    problem_free(&p);
}

static void a_tokens_outputs_do_not_depend_on_its_batch(void)
{
    for_each_format(check_batch_independence);
}

/* ---------------------------------------------------------------------------- */
/* measurements (printed, never asserted)                                        */
/* ---------------------------------------------------------------------------- */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* GB/s of GGUF bytes packed (the expert store packs at load). */
static void print_pack_speed(const struct kt_cpu_kernels *k, int type)
{
    const struct kt_packed_format *f = k->type[type].packed;
    const int64_t n = 7168, n_rows = 256;
    const size_t row_bytes = kt_type_row_bytes(type, n);
    uint8_t *w = kt_test_xmalloc(row_bytes * (size_t)n_rows), *dst = aligned_buffer(kt_packed_bytes(f, n, n_rows));
    for (int64_t r = 0; r < n_rows; r++)
        make_row(type, n, 3 * r + 1, w + (size_t)r * row_bytes);
    double best = 1e9;
    for (int rep = 0; rep < 5; rep++) {
        const double t0 = now_s();
        f->pack(n, w, row_bytes, n_rows, dst);
        const double t = now_s() - t0;
        best = t < best ? t : best;
    }
    printf("  info: %s packs %.2f GB/s of GGUF rows (one thread)\n", f->name,
           (double)row_bytes * (double)n_rows / best * 1e-9);
    free(w);
    free(dst);
}

static void packing_speed_is_printed(void)
{
    for_each_format(print_pack_speed);
}

int main(void)
{
    KT_RUN(formats_are_complete_aligned_and_per_level);
    KT_RUN(packed_gemm_equals_the_reference_bit_for_bit_on_odd_shapes);
    KT_RUN(packed_gemm_equals_the_reference_for_thousands_of_tokens);
    KT_RUN(reads_nothing_past_the_activations_or_the_packed_weights);
    KT_RUN(pack_zero_fills_padding_rows_and_defines_every_byte);
    KT_RUN(row_slices_from_group_boundaries_match_the_full_matrix);
    KT_RUN(a_tokens_outputs_do_not_depend_on_its_batch);
    KT_RUN(packing_speed_is_printed);
    return kt_test_finish();
}
