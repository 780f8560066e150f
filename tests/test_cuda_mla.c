/*
 * test_cuda_mla.c - MLA attention on the GPU (absorbed form, latent cache of
 * F32, BF16 or F16 rows) computes what runtime/forward/attention.c's absorbed
 * path computes, for the tiny model's and Kimi-K2's head shapes, decode and
 * prefill, with every row type:
 *   cache rows (norm + rope)         F32: within 1e-6 relative of kt_rmsnorm / kt_rope_apply;
 *                                    BF16 / F16: that row rounded to nearest, within half an
 *                                    ulp of the type (2^-8 / 2^-11 relative, F16 subnormals
 *                                    2^-25) plus that 1e-6
 *   output vs the same math on CPU   (W_UK, W_UV dequantized, F32 activations,
 *                                    kt_attention_head; BF16 / F16: on the rows the GPU
 *                                    stored, widened, which is what the CPU's row kernels
 *                                    read bit for bit)  within 1e-4 of the output's max
 *   output vs kt's CPU numerics      (activations quantized to the weight's
 *                                    vec_dot_type: differs for Q8_0)  within 5e-2 of its max
 * The cache is paged as kv_cache.h pages it (16 positions per block, rows in
 * the second of three layers, blocks handed out in reverse order).
 * Cases: the first token (one row), one decode token over 300 rows (context
 * split across blocks), three sequences of 5/130/257 rows in one launch,
 * a 17-token prefill from position 0 and a 64-token chunk after 40 rows.
 * Skips visibly ("skipped: no CUDA device") where no GPU can be used.  Builds
 * without CUDA also run it against tests/cuda_emulated.c (test_cuda_mla_emulated):
 * that proves the test and the emulation's MLA, not the kernel.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kt_cuda.h"
#include "cpu/ref/ops.h"
#include "quant.h"
#include "testlib.h"

#define MAX_SEQS 4
#define BLOCK_TOKENS 16 /* positions per block of the paged cache */
#define LAYERS 3
#define LAYER 1        /* the layer whose rows the test writes and reads */

struct mla_shape {
    const char *name;
    int64_t H, dn, dr, dv, kvr;
    int w_type;
    float kq_scale;
};

struct mla_case {
    const char *name;
    int n_seqs;
    int64_t n_ctx[MAX_SEQS];        /* rows of each sequence */
    int64_t n_tok;
    int64_t first_pos;              /* queries: the last n_tok positions of sequence 0 ... */
    bool one_per_seq;               /* ... or the last position of each sequence */
};

static const struct mla_shape shapes[] = {
    {"tiny", 8, 32, 16, 32, 128, KT_TYPE_F32, 0.2f},
    {"tiny q5_0", 8, 32, 16, 32, 128, KT_TYPE_Q5_0, 0.2f}, /* attn_k_b as real Q4_K_M files store it */
    {"kimi-k2 f16", 64, 128, 64, 128, 512, KT_TYPE_F16, 0.130861f},
    {"kimi-k2 q8_0", 64, 128, 64, 128, 512, KT_TYPE_Q8_0, 0.130861f},
};

static const struct mla_case cases[] = {
    {"first token", 1, {1}, 1, 0, false},
    {"decode over 300 rows", 1, {300}, 1, 299, false},
    {"3 sequences", 3, {5, 130, 257}, 3, 0, true},
    {"prefill 17", 1, {17}, 17, 0, false},
    {"64 after 40", 1, {104}, 64, 40, false},
};


/* y[r] = W[r] . x for r < n_out: kt's way (x converted to the weight's
 * vec_dot_type, reference dot) when quantize_x, else dequantized W in double. */
static void matvec(int type, const uint8_t *w, int64_t n_out, int64_t n_in, const float *x, float *y, bool quantize_x)
{
    const struct kt_type_traits *tr = kt_type_traits(type);
    const size_t row_bytes = kt_type_row_bytes(type, n_in);
    if (quantize_x) {
        const int act_type = tr->vec_dot_type;
        void *act = (void *)x;
        if (act_type != KT_TYPE_F32) {
            act = kt_test_xmalloc(kt_type_row_bytes(act_type, n_in));
            kt_type_traits(act_type)->from_float(x, act, n_in);
        }
        for (int64_t r = 0; r < n_out; r++)
            tr->vec_dot(n_in, &y[r], w + (size_t)r * row_bytes, act);
        if (act != x)
            free(act);
        return;
    }
    float *row = kt_test_xmalloc((size_t)n_in * sizeof *row);
    for (int64_t r = 0; r < n_out; r++) {
        if (type == KT_TYPE_F32)
            memcpy(row, w + (size_t)r * row_bytes, (size_t)n_in * sizeof *row);
        else
            tr->to_float(w + (size_t)r * row_bytes, row, n_in);
        double s = 0.0;
        for (int64_t i = 0; i < n_in; i++)
            s += (double)row[i] * x[i];
        y[r] = (float)s;
    }
    free(row);
}

static void *random_weights(int type, int64_t n_out, int64_t n_in, unsigned long long *rng)
{
    const size_t row_bytes = kt_type_row_bytes(type, n_in);
    uint8_t *w = kt_test_xmalloc((size_t)n_out * row_bytes);
    float *row = kt_test_xmalloc((size_t)n_in * sizeof *row);
    for (int64_t r = 0; r < n_out; r++) {
        for (int64_t i = 0; i < n_in; i++)
            row[i] = kt_test_rand_normal(rng) / sqrtf((float)n_in);
        if (type == KT_TYPE_F32)
            memcpy(w + (size_t)r * row_bytes, row, (size_t)n_in * sizeof *row);
        else
            kt_type_traits(type)->from_float(row, w + (size_t)r * row_bytes, n_in);
    }
    free(row);
    return w;
}

/* out (T, H*dv) of runtime/forward/attention.c's absorbed path for one token's query rows. */
static void cpu_attention(const struct mla_shape *s, const uint8_t *w_uk, const uint8_t *w_uv, const float *q_t,
                          const float *const *rows, int64_t n_kv, bool quantize_x, float *out_t)
{
    const int64_t H = s->H, dn = s->dn, dr = s->dr, dk = dn + dr, dv = s->dv, kvr = s->kvr;
    float *query = kt_test_xmalloc((size_t)(kvr + dr) * sizeof *query);
    float *o_lat = kt_test_xmalloc((size_t)kvr * sizeof *o_lat);
    float *scores = kt_test_xmalloc((size_t)(n_kv + 1) * sizeof *scores);
    const size_t uk_rows = kt_type_row_bytes(s->w_type, dn) * (size_t)kvr;
    const size_t uv_rows = kt_type_row_bytes(s->w_type, kvr) * (size_t)dv;
    for (int64_t h = 0; h < H; h++) {
        const float *q_h = q_t + h * dk; /* [q_nope | q_pe] */
        matvec(s->w_type, w_uk + (size_t)h * uk_rows, kvr, dn, q_h, query, quantize_x);
        memcpy(query + kvr, q_h + dn, (size_t)dr * sizeof *query);
        kt_attention_head(o_lat, query, rows, rows, n_kv, kvr + dr, kvr, s->kq_scale, scores);
        matvec(s->w_type, w_uv + (size_t)h * uv_rows, dv, kvr, o_lat, out_t + h * dv, quantize_x);
    }
    free(query), free(o_lat), free(scores);
}

static float max_abs(const float *x, int64_t n)
{
    float m = 0.0f;
    for (int64_t i = 0; i < n; i++)
        m = fabsf(x[i]) > m ? fabsf(x[i]) : m;
    return m;
}

/* Elements further than tol * max|want| from want (NaN counts). */
static int64_t count_far(const float *got, const float *want, int64_t n, float tol)
{
    const float bound = tol * max_abs(want, n) + 1e-30f;
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++)
        bad += !(fabsf(got[i] - want[i]) <= bound);
    return bad;
}

static void run_case(const struct mla_shape *s, const struct mla_case *c, enum kt_row_type rt, unsigned long long *rng)
{
    const int64_t H = s->H, dn = s->dn, dr = s->dr, dk = dn + dr, dv = s->dv, kvr = s->kvr, D = kvr + dr;
    const size_t elem = kt_row_type_size(rt);
    const char *tn = kt_row_type_name(rt);
    const float eps = 1e-6f;
    kt_err err = {0};
    kt_status rc;

    /* weights: attn_k_b (H*kvr rows of dn), attn_v_b (H*dv rows of kvr), kv_a_norm */
    uint8_t *w_uk = random_weights(s->w_type, H * kvr, dn, rng);
    uint8_t *w_uv = random_weights(s->w_type, H * dv, kvr, rng);
    float *norm_w = kt_test_xmalloc((size_t)kvr * sizeof *norm_w);
    for (int64_t i = 0; i < kvr; i++)
        norm_w[i] = 1.0f + 0.1f * kt_test_rand_normal(rng);
    struct kt_cuda_mla m = {H, dn, dr, dv, kvr, s->kq_scale, {0}, {0}};
    m.w_uk = (struct kt_cuda_mat){s->w_type, kt_test_cuda_copy_in(w_uk, (size_t)H * kvr * kt_type_row_bytes(s->w_type, dn)),
                                  dn, H * kvr, 0};
    m.w_uv = (struct kt_cuda_mat){s->w_type, kt_test_cuda_copy_in(w_uv, (size_t)H * dv * kt_type_row_bytes(s->w_type, kvr)),
                                  kvr, H * dv, 0};
    float *d_norm_w = kt_test_cuda_copy_in(norm_w, (size_t)kvr * sizeof *norm_w);

    /* every sequence's rows: kv_a and angles of each position; CPU rows; GPU
     * rows through the kernel into a paged pool laid out as kv_cache.h's
     * (BLOCK_TOKENS positions per block, LAYERS layers, this test's rows in
     * layer LAYER), the blocks handed out in reverse so tables matter */
    const struct kt_rope_params rp = {.n_dims = (uint32_t)dr, .freq_base = 50000.0, .factor = 32.0,
                                      .mode = KT_ROPE_YARN, .orig_ctx = 4096, .beta_fast = 32.0, .beta_slow = 1.0,
                                      .magnitude = 1.0};
    struct kt_rope rope;
    KT_CHECK(kt_rope_init(&rope, &rp), "rope init");
    int64_t n_rows = 0, n_blocks = 0, seq_row0[MAX_SEQS], seq_first[MAX_SEQS];
    for (int q = 0; q < c->n_seqs; q++) {
        seq_row0[q] = n_rows;
        seq_first[q] = n_blocks;
        n_rows += c->n_ctx[q];
        n_blocks += (c->n_ctx[q] + BLOCK_TOKENS - 1) / BLOCK_TOKENS;
    }
    const int64_t block_floats = LAYERS * BLOCK_TOKENS * D, layer_offset = LAYER * BLOCK_TOKENS * D;
    uint32_t *block_ids = kt_test_xmalloc((size_t)n_blocks * sizeof *block_ids);
    for (int64_t b = 0; b < n_blocks; b++)
        block_ids[b] = (uint32_t)(n_blocks - 1 - b);
    float *kv_a = kt_test_xmalloc((size_t)(n_rows * D) * sizeof *kv_a);
    float *cos_sin = kt_test_xmalloc((size_t)(n_rows * dr) * sizeof *cos_sin);
    float *cpu_rows = kt_test_xmalloc((size_t)(n_rows * D) * sizeof *cpu_rows);
    const size_t pool_bytes = (size_t)(n_blocks * block_floats) * elem;
    uint8_t *pool = kt_test_xmalloc(pool_bytes);
    float *stored = kt_test_xmalloc((size_t)(n_rows * D) * sizeof *stored); /* the GPU's rows, widened */
    uint32_t *row_first = kt_test_xmalloc((size_t)n_rows * sizeof *row_first);
    uint32_t *row_n_kv = kt_test_xmalloc((size_t)n_rows * sizeof *row_n_kv);
    const float **cpu_row_ptrs = kt_test_xmalloc((size_t)n_rows * sizeof *cpu_row_ptrs);
    for (int q = 0, r = 0; q < c->n_seqs; q++) {
        for (int64_t p = 0; p < c->n_ctx[q]; p++, r++) {
            for (int64_t i = 0; i < D; i++)
                kv_a[r * D + i] = kt_test_rand_normal(rng);
            kt_rope_angles(&rope, (uint32_t)p, cos_sin + r * dr);
            float *row = cpu_rows + r * D;
            kt_rmsnorm(row, kv_a + r * D, norm_w, kvr, eps);
            memcpy(row + kvr, kv_a + r * D + kvr, (size_t)dr * sizeof *row);
            kt_rope_apply(row + kvr, cos_sin + r * dr, (uint32_t)dr);
            row_first[r] = (uint32_t)seq_first[q]; /* row r is the newest row of a context of p + 1 */
            row_n_kv[r] = (uint32_t)(p + 1);
            cpu_row_ptrs[r] = row;
        }
    }
    memset(pool, 0xff, pool_bytes); /* poison, NaN in every row type: a row read before it was written shows */
    void *d_pool = kt_test_cuda_copy_in(pool, pool_bytes);
    uint32_t *d_block_ids = kt_test_cuda_copy_in(block_ids, (size_t)n_blocks * sizeof *block_ids);
    float *d_kv_a = kt_test_cuda_copy_in(kv_a, (size_t)(n_rows * D) * sizeof *kv_a);
    float *d_cos_sin = kt_test_cuda_copy_in(cos_sin, (size_t)(n_rows * dr) * sizeof *cos_sin);
    uint32_t *d_row_first = kt_test_cuda_copy_in(row_first, (size_t)n_rows * sizeof *row_first);
    uint32_t *d_row_n_kv = kt_test_cuda_copy_in(row_n_kv, (size_t)n_rows * sizeof *row_n_kv);
    struct kt_cuda_mla_cache cache = {d_pool, block_floats, BLOCK_TOKENS, layer_offset, d_block_ids, d_row_first,
                                      d_row_n_kv, (int)rt};
    rc = kt_cuda_mla_write_rows(&m, d_kv_a, d_norm_w, eps, d_cos_sin, &cache, n_rows, NULL, &err);
    KT_CHECK(rc == 0, "%s %s %s rows: %s", s->name, c->name, tn, err.msg);
    kt_test_cuda_copy_out(pool, d_pool, pool_bytes);
    /* the F32 row's error, plus half an ulp of the stored type where it rounds */
    const float rel = 1e-6f + (rt == KT_ROW_BF16 ? 0x1p-8f : rt == KT_ROW_F16 ? 0x1p-11f : 0.0f);
    const float abs_floor = rt == KT_ROW_F16 ? 0x1p-25f : 1e-30f;
    int64_t bad = 0;
    for (int q = 0; q < c->n_seqs; q++)
        for (int64_t p = 0; p < c->n_ctx[q]; p++) {
            const float *want = cpu_rows + (seq_row0[q] + p) * D;
            float *row = stored + (seq_row0[q] + p) * D;
            kt_row_to_f32(rt, row,
                          pool + (size_t)(block_ids[seq_first[q] + p / BLOCK_TOKENS] * block_floats + layer_offset +
                                          (p % BLOCK_TOKENS) * D) * elem,
                          D);
            for (int64_t i = 0; i < D; i++)
                bad += !(fabsf(row[i] - want[i]) <= rel * fabsf(want[i]) + abs_floor);
        }
    KT_CHECK(bad == 0, "%s %s %s: %lld cache values differ from the CPU's", s->name, c->name, tn, (long long)bad);
    if (rt != KT_ROW_F32) /* the CPU reads the rows the GPU stored: the same bits, widened as its kernels widen them */
        for (int64_t r = 0; r < n_rows; r++)
            cpu_row_ptrs[r] = stored + r * D;

    /* the queries: token t of sequence seq[t] at position pos[t] */
    const int64_t T = c->n_tok;
    int *seq = kt_test_xmalloc((size_t)T * sizeof *seq);
    uint32_t *n_kv = kt_test_xmalloc((size_t)T * sizeof *n_kv);
    uint32_t *first = kt_test_xmalloc((size_t)T * sizeof *first);
    int64_t n_kv_max = 0;
    for (int64_t t = 0; t < T; t++) {
        seq[t] = c->one_per_seq ? (int)t : 0;
        const int64_t pos = c->one_per_seq ? c->n_ctx[t] - 1 : c->first_pos + t;
        n_kv[t] = (uint32_t)(pos + 1);
        first[t] = (uint32_t)seq_first[seq[t]];
        n_kv_max = pos + 1 > n_kv_max ? pos + 1 : n_kv_max;
    }
    float *q = kt_test_xmalloc((size_t)(T * H * dk) * sizeof *q);
    for (int64_t i = 0; i < T * H * dk; i++)
        q[i] = kt_test_rand_normal(rng);
    float *got = kt_test_xmalloc((size_t)(T * H * dv) * sizeof *got);
    for (int64_t i = 0; i < T * H * dv; i++)
        got[i] = NAN; /* poison: an output never written fails */
    float *d_q = kt_test_cuda_copy_in(q, (size_t)(T * H * dk) * sizeof *q);
    uint32_t *d_first = kt_test_cuda_copy_in(first, (size_t)T * sizeof *first);
    uint32_t *d_n_kv = kt_test_cuda_copy_in(n_kv, (size_t)T * sizeof *n_kv);
    float *d_out = kt_test_cuda_copy_in(got, (size_t)(T * H * dv) * sizeof *got);
    const size_t scratch_bytes = kt_cuda_mla_scratch_bytes(&m, T, n_kv_max);
    KT_CHECK(scratch_bytes > 0, "%s: no scratch size", s->name);
    void *d_scratch = kt_test_cuda_copy_in(NULL, scratch_bytes);
    cache.first_block = d_first;
    cache.n_kv = d_n_kv;
    rc = kt_cuda_mla_attention(&m, d_q, &cache, T, n_kv_max, d_scratch, scratch_bytes, d_out, NULL, &err);
    KT_CHECK(rc == 0, "%s %s %s: %s", s->name, c->name, tn, err.msg);
    kt_test_cuda_copy_out(got, d_out, (size_t)(T * H * dv) * sizeof *got);

    /* the CPU, on its own rows */
    float *same_math = kt_test_xmalloc((size_t)(T * H * dv) * sizeof *same_math);
    float *kt_cpu = kt_test_xmalloc((size_t)(T * H * dv) * sizeof *kt_cpu);
    for (int64_t t = 0; t < T; t++) {
        const float *const *rows = cpu_row_ptrs + seq_row0[seq[t]];
        cpu_attention(s, w_uk, w_uv, q + t * H * dk, rows, n_kv[t], false, same_math + t * H * dv);
        cpu_attention(s, w_uk, w_uv, q + t * H * dk, rows, n_kv[t], true, kt_cpu + t * H * dv);
    }
    bad = count_far(got, same_math, T * H * dv, 1e-4f);
    KT_CHECK(bad == 0, "%s %s %s rows: %lld outputs differ from the same math on the CPU", s->name, c->name, tn,
             (long long)bad);
    bad = count_far(got, kt_cpu, T * H * dv, 5e-2f);
    KT_CHECK(bad == 0, "%s %s %s rows: %lld outputs differ from kt's CPU numerics", s->name, c->name, tn,
             (long long)bad);

    kt_cuda_free((void *)m.w_uk.data), kt_cuda_free((void *)m.w_uv.data), kt_cuda_free(d_norm_w);
    kt_cuda_free(d_pool), kt_cuda_free(d_block_ids), kt_cuda_free(d_row_first), kt_cuda_free(d_row_n_kv);
    kt_cuda_free(d_kv_a), kt_cuda_free(d_cos_sin), kt_cuda_free(d_q), kt_cuda_free(d_first), kt_cuda_free(d_n_kv);
    kt_cuda_free(d_out), kt_cuda_free(d_scratch);
    free(w_uk), free(w_uv), free(norm_w), free(kv_a), free(cos_sin), free(cpu_rows), free(pool), free(stored);
    free(block_ids);
    free(row_first), free(row_n_kv), free(cpu_row_ptrs), free(seq), free(n_kv), free(first), free(q), free(got);
    free(same_math), free(kt_cpu);
}

static void cuda_mla_matches_cpu_attention(void)
{
    unsigned long long rng = 31;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
            for (int rt = 0; rt < KT_ROW_TYPE_COUNT; rt++)
                run_case(&shapes[s], &cases[c], (enum kt_row_type)rt, &rng);
}

static void cuda_mla_rejects_bad_shapes(void)
{
    kt_err err = {0};
    float *d = kt_test_cuda_copy_in(NULL, 1 << 16);
    const uint32_t *u = (const uint32_t *)d;
    struct kt_cuda_mla m = {8, 32, 16, 32, 2048, 0.2f, {KT_TYPE_F32, d, 32, 8 * 2048, 0}, {KT_TYPE_F32, d, 2048, 256, 0}};
    struct kt_cuda_mla_cache cache = {d, 16 * 144, 16, 0, u, u, u, KT_ROW_F32};
    KT_CHECK(kt_cuda_mla_scratch_bytes(&m, 1, 10) == 0, "kv rank 2048 sized");
    KT_CHECK(kt_cuda_mla_attention(&m, d, &cache, 1, 10, d, 1 << 16, d, NULL, &err) != KT_OK && err.msg[0],
             "kv rank 2048 accepted");
    m.kv_rank = 128;
    m.w_uk.n_out = 8 * 128;
    m.w_uv.n_in = 128;
    err.msg[0] = 0;
    KT_CHECK(kt_cuda_mla_attention(&m, d, &cache, 1, 10, d, 16, d, NULL, &err) != KT_OK && err.msg[0],
             "a 16-byte scratch accepted");
    cache.block_tokens = 0;
    err.msg[0] = 0;
    KT_CHECK(kt_cuda_mla_attention(&m, d, &cache, 1, 10, d, 1 << 16, d, NULL, &err) != KT_OK && err.msg[0],
             "blocks of 0 positions accepted");
    cache.block_tokens = 16;
    cache.row_type = KT_ROW_TYPE_COUNT;
    err.msg[0] = 0;
    KT_CHECK(kt_cuda_mla_attention(&m, d, &cache, 1, 10, d, 1 << 16, d, NULL, &err) != KT_OK && err.msg[0],
             "row type %d accepted", KT_ROW_TYPE_COUNT);
    cache.row_type = KT_ROW_F32;
    cache.block_ids = NULL;
    err.msg[0] = 0;
    KT_CHECK(kt_cuda_mla_write_rows(&m, d, d, 1e-6f, d, &cache, 1, NULL, &err) != KT_OK && err.msg[0],
             "a cache without block tables accepted");
    cache.block_ids = u;
    m.rope_dim = 15;
    err.msg[0] = 0;
    KT_CHECK(kt_cuda_mla_write_rows(&m, d, d, 1e-6f, d, &cache, 1, NULL, &err) != KT_OK && err.msg[0],
             "odd rope dims accepted");
    kt_cuda_free(d);
}

int main(void)
{
    const int skip = kt_test_skip_without_cuda();
    if (skip)
        return skip;
    KT_RUN(cuda_mla_matches_cpu_attention);
    KT_RUN(cuda_mla_rejects_bad_shapes);
    return kt_test_finish();
}
