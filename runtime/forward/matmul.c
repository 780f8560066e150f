/*
 * matmul.c - weight views and quantized products (see matmul.h).
 *
 * Every product reads weight rows where the GGUF mapping holds them, a
 * slice of rows at a time for all tokens, so a weight row is fetched from
 * memory once per call however many tokens share it (several tokens: the
 * table's tiled gemm).  Kernels come from the CPU dispatch table (scalar,
 * AVX2 or AVX-512, picked once from CPUID); F32 and BF16 products of many
 * tokens go to oneDNN instead, where it measured faster (onednn_runs), BF16
 * at the amx level to the AMX tiles (amx_bf16_slice).  It
 * must never write a weight or keep state between calls.
 */
#include "matmul.h"

#include "onednn_gemm.h"
#ifdef KT_HAVE_AMX_KERNELS
#include "cpu/amx/packed_amx.h"
#endif

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

/* ---- kernels ---------------------------------------------------------------------- */

const struct kt_cpu_type_kernels *kt_mat_kernels_for(int type)
{
    if (type < 0 || type >= KT_TYPE_COUNT)
        return NULL;
    const struct kt_cpu_type_kernels *k = &kt_cpu_kernels()->type[type];
    return k->vec_dot && k->gemv && k->gemm && k->quantize_act ? k : NULL;
}

/* ---- views ------------------------------------------------------------------------ */

struct kt_mat kt_mat_from_tensor(const struct kt_gguf_tensor *t)
{
    struct kt_mat m = {
        .data = t->data,
        .type = t->type,
        .n_in = t->ne[0],
        .n_out = t->ne[1] * t->ne[2] * t->ne[3],
        .row_bytes = kt_type_row_bytes(t->type, t->ne[0]),
    };
    return m;
}

struct kt_mat kt_mat_f32(const float *data, int64_t n_out, int64_t n_in)
{
    struct kt_mat m = {
        .data = (const uint8_t *)data,
        .type = KT_TYPE_F32,
        .n_in = n_in,
        .n_out = n_out,
        .row_bytes = (size_t)n_in * sizeof(float),
    };
    return m;
}

uint64_t kt_mat_bytes(const struct kt_mat *m)
{
    return m->packed ? kt_packed_bytes(m->packed, m->n_in, m->n_out) : (uint64_t)m->n_out * m->row_bytes;
}

struct kt_mat kt_mat_rows(struct kt_mat m, int64_t first, int64_t n)
{
    if (!m.data) /* a checkpoint's streamed experts: their rows are in the expert store */
        ;
    else if (m.packed) /* whole groups only: callers slice at multiples of 16 */
        m.data = kt_packed_rows(m.packed, m.data, m.n_in, first);
    else
        m.data += (size_t)first * m.row_bytes;
    m.n_out = n;
    return m;
}

size_t kt_act_row_bytes(int weight_type, int64_t n)
{
    return kt_type_row_bytes(kt_mat_kernels_for(weight_type)->vec_dot_type, n);
}

/* ---- activations ------------------------------------------------------------------ */

struct quantize_job {
    kt_from_float_fn quantize;
    const float *x;     /* (n_rows, n) */
    int64_t n;
    uint8_t *xq;        /* (n_rows, row_bytes) */
    size_t row_bytes;
};

static void quantize_task(void *ctx, int64_t begin, int64_t end, int thread)
{
    (void)thread;
    const struct quantize_job *j = ctx;
    for (int64_t t = begin; t < end; t++)
        j->quantize(j->x + t * j->n, j->xq + (size_t)t * j->row_bytes, j->n);
}

void kt_quantize_rows(struct kt_pool *pool, int weight_type, const float *x, int64_t n_rows, int64_t n,
                      void *xq)
{
    const struct kt_cpu_type_kernels *k = kt_mat_kernels_for(weight_type);
    struct quantize_job j = {k->quantize_act, x, n, xq, kt_type_row_bytes(k->vec_dot_type, n)};
    if (n_rows < 8 || !pool) /* a handful of rows: not worth a hand-off */
        quantize_task(&j, 0, n_rows, 0);
    else
        kt_pool_parallel_for(pool, n_rows, 4, quantize_task, &j);
}

/* ---- products --------------------------------------------------------------------- */

/* From this many activation rows on, a product runs the tiled gemm (each
 * weight block unpacked once for several tokens) instead of one gemv per
 * row; both give every output bit for bit as vec_dot does. */
#define KT_MATMUL_GEMM_MIN_ROWS 4

struct matmul_job {
    const struct kt_mat *m;
    kt_gemv_fn gemv;
    kt_gemm_fn gemm;
    const uint8_t *xq;      /* (n_rows, act_bytes) */
    size_t act_bytes;
    int64_t n_rows;
    float *y;               /* (n_rows, y_stride) */
    int64_t y_stride;
};

/* Output rows [begin, end) for every activation row: the slice of weights
 * stays in cache while the activations pass over it. */
static void matmul_task(void *ctx, int64_t begin, int64_t end, int thread)
{
    (void)thread;
    const struct matmul_job *j = ctx;
    const struct kt_mat *m = j->m;
    if (m->packed) {
        const struct kt_mat slice = kt_mat_rows(*m, begin, end - begin);
        kt_mat_gemm(&slice, j->xq, j->act_bytes, j->n_rows, j->y + begin, j->y_stride);
        return;
    }
    const uint8_t *w = m->data + (size_t)begin * m->row_bytes;
    if (j->n_rows >= KT_MATMUL_GEMM_MIN_ROWS) {
        j->gemm(m->n_in, w, m->row_bytes, end - begin, j->xq, j->act_bytes, j->n_rows, j->y + begin, j->y_stride);
        return;
    }
    for (int64_t t = 0; t < j->n_rows; t++)
        j->gemv(m->n_in, &j->y[t * j->y_stride + begin], w, m->row_bytes, j->xq + (size_t)t * j->act_bytes,
                end - begin);
}

/* ---- oneDNN for float weights ------------------------------------------------------ */

/*
 * F32 and BF16 products of at least this many activation rows, over at
 * least KT_MATMUL_ONEDNN_MIN_OUT weight rows, run oneDNN's sgemm
 * (runtime/forward/onednn_gemm.c) instead of the table's gemm.  Measured with
 * `kt-bench kernels` and alone on one core of a Sapphire Rapids VM, 2048 x
 * 7168: oneDNN 1.2-1.8x faster from 64 tokens on (1.3x held to AVX2), kt's
 * gemm faster at 16 tokens and below (oneDNN's packing outweighs it).
 * oneDNN's outputs are not vec_dot's bits: each is within
 * n_in * 2^-24 * sum |w * a| of the exact dot product
 * (tests/test_onednn_gemm.c), so a row computed in a batch of 64 tokens or
 * more can differ in its last bits from the same row in a smaller batch.
 * The scalar level (the reference) never uses it.
 */
#define KT_MATMUL_ONEDNN_MIN_ROWS 64
/* Rows per oneDNN call, fixed whatever the thread count: oneDNN sums
 * narrower slices in another order (any slice under 128 rows measured
 * different bits), so slicing by thread count would make results depend on
 * it.  KT_MATMUL_ONEDNN_MIN_OUT keeps 16 slices for 16 threads; smaller
 * matrices (a router's 256 rows) stay with kt's gemm, which spreads them in
 * slices of 4 rows and up. */
#define KT_MATMUL_ONEDNN_SLICE_ROWS 128
#define KT_MATMUL_ONEDNN_MIN_OUT (16 * KT_MATMUL_ONEDNN_SLICE_ROWS)

/*
 * At the amx level BF16 and FP8_B128 slices run the AMX-BF16 tiles instead:
 * the slice's rows packed for them (kt_packed_bf16_amx, gathered 16 rows at
 * a time; kt_packed_fp8_b128_amx, e4m3 widened exactly to bf16 and the
 * block scales apart) into a buffer of the call, then every token against
 * it, each activation as two bf16 terms (kernels/cpu/amx/packed_amx.c).
 * Within (2^-16 + n_in * 2^-23) * sum |w * a| of the exact dot (FP8: a
 * little more, one step per block), each output a sum over its own row and
 * token only, in an order fixed by n_in (so, like oneDNN's fixed slices,
 * independent of the thread count and of the other tokens).  Measured on
 * one core of an AMX VM (2026-12-03, 2048 x 7168 BF16): the tiles 2.4-3.4 x
 * the avx512 gemm from 8 to 128 tokens, oneDNN 1.2-1.8 x it from 64.
 */
static const struct kt_packed_format *amx_float_format(const struct kt_mat *m)
{
#ifdef KT_HAVE_AMX_KERNELS
    if (kt_cpu_kernels()->isa == KT_ISA_AMX) {
        if (m->type == KT_TYPE_BF16)
            return &kt_packed_bf16_amx;
        if (m->type == KT_TYPE_FP8_B128)
            return &kt_packed_fp8_b128_amx;
    }
#else
    (void)m;
#endif
    return NULL;
}

static bool onednn_runs(const struct kt_mat *m, int64_t n_rows)
{
    return !m->packed && (m->type == KT_TYPE_F32 || m->type == KT_TYPE_BF16 || amx_float_format(m)) &&
           n_rows >= KT_MATMUL_ONEDNN_MIN_ROWS && m->n_out >= KT_MATMUL_ONEDNN_MIN_OUT &&
           kt_cpu_kernels()->isa != KT_ISA_SCALAR;
}

/* The slice through amx_float_format's tiles; false when it did not run
 * (another level, or no memory for the packed slice). */
static bool amx_float_slice(const struct matmul_job *j, const uint8_t *w, int64_t r0, int64_t n)
{
    const struct kt_mat *m = j->m;
    const struct kt_packed_format *f = amx_float_format(m);
    if (!f)
        return false;
    const size_t bytes = (kt_packed_bytes(f, m->n_in, n) + 63) / 64 * 64;
    void *packed = aligned_alloc(64, bytes);
    if (!packed)
        return false;
    f->pack(m->n_in, w, m->row_bytes, n, packed);
    f->gemm(m->n_in, packed, n, j->xq, j->act_bytes, j->n_rows, j->y + r0, j->y_stride);
    free(packed);
    return true;
}

/* Slices [begin, end) of KT_MATMUL_ONEDNN_SLICE_ROWS weight rows through
 * the AMX tiles or oneDNN, for every activation row (F32, as quantize_act
 * copied them); a slice neither can run (no memory for a packed slice or
 * BF16's widened rows) runs the table's gemm. */
static void onednn_task(void *ctx, int64_t begin, int64_t end, int thread)
{
    (void)thread;
    const struct matmul_job *j = ctx;
    const struct kt_mat *m = j->m;
    const float *a = (const float *)j->xq;
    const int64_t a_stride = (int64_t)(j->act_bytes / sizeof(float));
    for (int64_t s = begin; s < end; s++) {
        const int64_t r0 = s * KT_MATMUL_ONEDNN_SLICE_ROWS;
        const int64_t n = m->n_out - r0 < KT_MATMUL_ONEDNN_SLICE_ROWS ? m->n_out - r0 : KT_MATMUL_ONEDNN_SLICE_ROWS;
        const uint8_t *w = m->data + (size_t)r0 * m->row_bytes;
        if (amx_float_slice(j, w, r0, n))
            continue;
        kt_status st = KT_ERR_NOMEM;
        if (m->type == KT_TYPE_F32)
            st = kt_onednn_gemm_f32(m->n_in, (const float *)w, (int64_t)(m->row_bytes / sizeof(float)), n, a,
                                    a_stride, j->n_rows, j->y + r0, j->y_stride, NULL);
        else if (m->type == KT_TYPE_BF16)
            st = kt_onednn_gemm_bf16(m->n_in, (const kt_bf16 *)w, (int64_t)(m->row_bytes / sizeof(kt_bf16)), n, a,
                                     a_stride, j->n_rows, j->y + r0, j->y_stride, NULL);
        if (st != KT_OK)
            j->gemm(m->n_in, w, m->row_bytes, n, j->xq, j->act_bytes, j->n_rows, j->y + r0, j->y_stride);
    }
}

/* Rows per task of the table path for m on n_threads: about 8 slices per
 * thread balance uneven progress without much claiming; at least 4 rows, at
 * most 64 (a slice should stay in L2 for a batch). */
static int64_t table_grain(const struct kt_mat *m, int n_threads)
{
    int64_t grain = m->n_out / (8 * n_threads);
    grain = grain < 4 ? 4 : grain > 64 ? 64 : grain;
    return m->packed ? (grain + 15) / 16 * 16 : grain; /* slices start on group boundaries */
}

void kt_matmul_q(struct kt_pool *pool, const struct kt_mat *m, const void *xq, int64_t n_rows, float *y,
                 int64_t y_stride)
{
    const struct kt_cpu_type_kernels *k = kt_mat_kernels_for(m->type);
    struct matmul_job j = {m, k->gemv, k->gemm, xq, kt_type_row_bytes(k->vec_dot_type, m->n_in), n_rows, y, y_stride};
    int n_threads = pool ? kt_pool_n_threads(pool) : 1;
    if (onednn_runs(m, n_rows)) {
        const int64_t slices = (m->n_out + KT_MATMUL_ONEDNN_SLICE_ROWS - 1) / KT_MATMUL_ONEDNN_SLICE_ROWS;
        if (n_threads == 1)
            onednn_task(&j, 0, slices, 0);
        else
            kt_pool_parallel_for(pool, slices, 1, onednn_task, &j);
        return;
    }
    const int64_t grain = table_grain(m, n_threads);
    if (n_threads == 1)
        matmul_task(&j, 0, m->n_out, 0);
    else
        kt_pool_parallel_for(pool, m->n_out, grain, matmul_task, &j);
}

/* Two products of the same activations in one hand-off (the attention's W_qa
 * and W_kva): slices of the first matrix, then of the second, claimed from
 * one counter, so neither waits at a barrier for the other.  Each row is
 * computed by the same task as alone (matmul_task). */
struct pair_job {
    struct matmul_job j[2];
    int64_t grain[2], tasks0;
};

static void pair_task(void *ctx, int64_t begin, int64_t end, int thread)
{
    const struct pair_job *p = ctx;
    for (int64_t t = begin; t < end; t++) {
        const int which = t >= p->tasks0;
        const int64_t r0 = (which ? t - p->tasks0 : t) * p->grain[which], n = p->j[which].m->n_out;
        matmul_task((void *)&p->j[which], r0, r0 + p->grain[which] < n ? r0 + p->grain[which] : n, thread);
    }
}

void kt_matmul_q_pair(struct kt_pool *pool, const struct kt_mat *a, const struct kt_mat *b, const void *xq,
                      int64_t n_rows, float *ya, float *yb)
{
    const struct kt_cpu_type_kernels *ka = kt_mat_kernels_for(a->type), *kb = kt_mat_kernels_for(b->type);
    const int n_threads = pool ? kt_pool_n_threads(pool) : 1;
    if (n_threads == 1 || ka->vec_dot_type != kb->vec_dot_type || onednn_runs(a, n_rows) || onednn_runs(b, n_rows)) {
        kt_matmul_q(pool, a, xq, n_rows, ya, a->n_out);
        kt_matmul_q(pool, b, xq, n_rows, yb, b->n_out);
        return;
    }
    const size_t act_bytes = kt_type_row_bytes(ka->vec_dot_type, a->n_in);
    struct pair_job p = {.j = {{a, ka->gemv, ka->gemm, xq, act_bytes, n_rows, ya, a->n_out},
                               {b, kb->gemv, kb->gemm, xq, act_bytes, n_rows, yb, b->n_out}},
                         .grain = {table_grain(a, n_threads), table_grain(b, n_threads)}};
    p.tasks0 = (a->n_out + p.grain[0] - 1) / p.grain[0];
    kt_pool_parallel_for(pool, p.tasks0 + (b->n_out + p.grain[1] - 1) / p.grain[1], 1, pair_task, &p);
}

void kt_matvec_q(const struct kt_mat *m, const void *xq, float *y)
{
    if (m->packed)
        m->packed->gemm(m->n_in, m->data, m->n_out, xq, 0, 1, y, m->n_out);
    else
        kt_mat_kernels_for(m->type)->gemv(m->n_in, y, m->data, m->row_bytes, xq, m->n_out);
}

void kt_mat_gemm(const struct kt_mat *m, const void *xq, size_t act_bytes, int64_t n_tok, float *y,
                 int64_t y_stride)
{
    if (m->packed) {
        m->packed->gemm(m->n_in, m->data, m->n_out, xq, act_bytes, n_tok, y, y_stride);
        return;
    }
    const struct kt_cpu_type_kernels *k = kt_mat_kernels_for(m->type);
    if (n_tok >= KT_MATMUL_GEMM_MIN_ROWS) {
        k->gemm(m->n_in, m->data, m->row_bytes, m->n_out, xq, act_bytes, n_tok, y, y_stride);
        return;
    }
    for (int64_t t = 0; t < n_tok; t++)
        k->gemv(m->n_in, y + t * y_stride, m->data, m->row_bytes, (const uint8_t *)xq + (size_t)t * act_bytes,
                m->n_out);
}

void kt_matvec_transposed(const struct kt_mat *m, const float *x, float *y, float *tmp)
{
    const kt_to_float_fn to_float = kt_type_traits(m->type)->to_float;
    memset(y, 0, (size_t)m->n_in * sizeof *y);
    for (int64_t o = 0; o < m->n_out; o++) {
        to_float(m->data + (size_t)o * m->row_bytes, tmp, m->n_in);
        for (int64_t i = 0; i < m->n_in; i++)
            y[i] += x[o] * tmp[i];
    }
}

void kt_mat_dequantize(const struct kt_mat *m, float *out)
{
    const kt_to_float_fn to_float = kt_type_traits(m->type)->to_float;
    for (int64_t o = 0; o < m->n_out; o++)
        to_float(m->data + (size_t)o * m->row_bytes, out + o * m->n_in, m->n_in);
}

void kt_mat_dequantize_transposed(const struct kt_mat *m, float *out, float *tmp)
{
    const kt_to_float_fn to_float = kt_type_traits(m->type)->to_float;
    const int64_t n_in = m->n_in, n_out = m->n_out;
    for (int64_t r0 = 0; r0 < n_out; r0 += KT_MAT_T_ROWS) {
        const int64_t n = n_out - r0 < KT_MAT_T_ROWS ? n_out - r0 : KT_MAT_T_ROWS;
        for (int64_t i = 0; i < n; i++)
            to_float(m->data + (size_t)(r0 + i) * m->row_bytes, tmp + i * n_in, n_in);
        for (int64_t d = 0; d < n_in; d++)
            for (int64_t i = 0; i < n; i++)
                out[d * n_out + r0 + i] = tmp[i * n_in + d];
    }
}
