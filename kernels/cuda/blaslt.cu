/*
 * blaslt.cu - dense products through cuBLASLt: y (n_tok, n_out) = x (n_tok, n_in) . W^T
 * for every weight type kt_cuda_matmul reads.  W (through gemv.cu's reader) and
 * x are rounded to BF16 in the caller's scratch, then one BF16 x BF16 GEMM with
 * fp32 sums writes y in F32: the TENSOR path's numerics at cuBLAS's speed.  For
 * prefill-sized batches, where one pass over W to dequantize it is paid back;
 * decode stays on kt_cuda_matmul's GEMV.
 *
 * Never allocates device memory (the scratch holds the copies and cuBLASLt's
 * workspace); the only state is the process's cuBLASLt handle.
 */
#include <cublasLt.h>
#include <pthread.h>

#include "common.cuh"
#include "lt_plan.h"

/* ---- the handle -------------------------------------------------------------------- */

/* Created on first use under lt_lock; a failed creation (no usable device yet)
 * is retried by the next call.  Never destroyed: an atexit cublasLtDestroy may
 * run after the CUDA runtime has torn its context down, and process exit
 * releases it anyway.  kt drives one device (README, Limits). */
static pthread_mutex_t lt_lock = PTHREAD_MUTEX_INITIALIZER;
static cublasLtHandle_t lt_handle;

/* "matmul_lt: what: <cuBLASLt's text> (status)" into err; returns its status
 * (never KT_ERR_UNSUPPORTED: that one means "no algorithm, take another path"). */
static kt_status lt_fail(kt_err *err, const char *what, cublasStatus_t st)
{
    const kt_status status = st == CUBLAS_STATUS_ALLOC_FAILED    ? KT_ERR_NOMEM
                             : st == CUBLAS_STATUS_INVALID_VALUE ? KT_ERR_INVALID
                                                                 : KT_ERR_IO;
    return kt_err_set(err, status, "matmul_lt: %s: %s (%d)", what, cublasLtGetStatusString(st), (int)st);
}

static kt_status lt_get_handle(cublasLtHandle_t *handle, kt_err *err)
{
    cublasStatus_t st = CUBLAS_STATUS_SUCCESS;
    pthread_mutex_lock(&lt_lock);
    if (!lt_handle) {
        cublasLtHandle_t created = NULL;
        st = cublasLtCreate(&created);
        if (st == CUBLAS_STATUS_SUCCESS)
            lt_handle = created;
    }
    *handle = lt_handle;
    pthread_mutex_unlock(&lt_lock);
    return st == CUBLAS_STATUS_SUCCESS ? KT_OK : lt_fail(err, "create handle", st);
}

/* ---- scratch (its sizes: lt_plan.h) ------------------------------------------------- */

/* The largest power of two up to 256 dividing p's address: the heuristic
 * assumes 256-byte aligned buffers unless told otherwise. */
static uint32_t alignment_of(const void *p)
{
    uint32_t a = 256;
    while (a > 1 && (uintptr_t)p % a != 0)
        a >>= 1;
    return a;
}

/* ---- the GEMM ---------------------------------------------------------------------- */

#define LT_TRY(call, what)                                                                                             \
    do {                                                                                                               \
        if ((st = (call)) != CUBLAS_STATUS_SUCCESS) {                                                                  \
            rc = lt_fail(err, what, st);                                                                               \
            goto done;                                                                                                 \
        }                                                                                                              \
    } while (0)

/* D (m, n) = A^T B, column-major: A (k, m) BF16 with stride lda, B (k, n) BF16
 * with stride ldb, D F32 with stride m; fp32 sums, alpha 1, beta 0. */
static kt_status lt_gemm(cublasLtHandle_t handle, const void *a, int64_t lda, const void *b, int64_t ldb, float *d,
                         int64_t m, int64_t n, int64_t k, void *workspace, cudaStream_t s, kt_err *err)
{
    cublasLtMatmulDesc_t op = NULL;
    cublasLtMatrixLayout_t a_layout = NULL, b_layout = NULL, d_layout = NULL;
    cublasLtMatmulPreference_t pref = NULL;
    cublasLtMatmulHeuristicResult_t best = {};
    cublasStatus_t st = CUBLAS_STATUS_SUCCESS;
    int n_algos = 0;
    kt_status rc = KT_OK;
    const int32_t trans_a = CUBLAS_OP_T, trans_b = CUBLAS_OP_N;
    const uint64_t workspace_bytes = LT_WORKSPACE_BYTES;
    const uint32_t align_a = alignment_of(a), align_b = alignment_of(b), align_d = alignment_of(d);
    const float alpha = 1.0f, beta = 0.0f; /* beta 0: C (given as D) is not read */
    const struct {
        cublasLtMatmulPreferenceAttributes_t attr;
        uint32_t bytes;
        const char *what;
    } aligns[] = {
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align_a, "set alignment of A"},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align_b, "set alignment of B"},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align_d, "set alignment of C"},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align_d, "set alignment of D"},
    };

    LT_TRY(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "create matmul descriptor");
    LT_TRY(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &trans_a, sizeof trans_a), "set TRANSA");
    LT_TRY(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &trans_b, sizeof trans_b), "set TRANSB");
    /* layouts describe A and B as stored, before op: A is (k, m) */
    LT_TRY(cublasLtMatrixLayoutCreate(&a_layout, CUDA_R_16BF, (uint64_t)k, (uint64_t)m, lda), "layout of A");
    LT_TRY(cublasLtMatrixLayoutCreate(&b_layout, CUDA_R_16BF, (uint64_t)k, (uint64_t)n, ldb), "layout of B");
    LT_TRY(cublasLtMatrixLayoutCreate(&d_layout, CUDA_R_32F, (uint64_t)m, (uint64_t)n, m), "layout of D");
    LT_TRY(cublasLtMatmulPreferenceCreate(&pref), "create preference");
    LT_TRY(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes,
                                                sizeof workspace_bytes),
           "set workspace size");
    for (size_t i = 0; i < sizeof aligns / sizeof aligns[0]; i++)
        LT_TRY(cublasLtMatmulPreferenceSetAttribute(pref, aligns[i].attr, &aligns[i].bytes, sizeof aligns[i].bytes),
               aligns[i].what);
    LT_TRY(cublasLtMatmulAlgoGetHeuristic(handle, op, a_layout, b_layout, d_layout, d_layout, pref, 1, &best,
                                          &n_algos),
           "heuristic");
    if (n_algos < 1 || best.state != CUBLAS_STATUS_SUCCESS) {
        /* nothing queued: the caller may take another path */
        rc = kt_err_set(err, KT_ERR_UNSUPPORTED,
                        "matmul_lt: cuBLASLt has no algorithm for m %lld, n %lld, k %lld (A %u-, B %u-, D %u-byte "
                        "aligned)", (long long)m, (long long)n, (long long)k, align_a, align_b, align_d);
        goto done;
    }
    LT_TRY(cublasLtMatmul(handle, op, &alpha, a, a_layout, b, b_layout, &beta, d, d_layout, d, d_layout, &best.algo,
                          workspace, LT_WORKSPACE_BYTES, s),
           "matmul");
done: /* host objects, no longer needed once the GEMM is enqueued */
    if (pref)
        cublasLtMatmulPreferenceDestroy(pref);
    if (d_layout)
        cublasLtMatrixLayoutDestroy(d_layout);
    if (b_layout)
        cublasLtMatrixLayoutDestroy(b_layout);
    if (a_layout)
        cublasLtMatrixLayoutDestroy(a_layout);
    if (op)
        cublasLtMatmulDescDestroy(op);
    return rc;
}

#undef LT_TRY

/* ---- entry points ------------------------------------------------------------------- */

extern "C" size_t kt_cuda_matmul_lt_scratch_bytes(const struct kt_cuda_mat *w, int64_t n_tok)
{
    if (kt_cuda_mat_check(w, "matmul_lt", NULL) != KT_OK || n_tok <= 0)
        return 0;
    return lt_scratch_total(w, n_tok);
}

extern "C" kt_status kt_cuda_matmul_lt(const struct kt_cuda_mat *w, const float *d_x, int64_t n_tok, float *d_y,
                                       void *d_scratch, size_t scratch_bytes, void *stream, kt_err *err)
{
    kt_status st = kt_cuda_mat_check(w, "matmul_lt", err);
    if (st != KT_OK)
        return st;
    if (n_tok <= 0 || !d_x || !d_y || !d_scratch)
        return kt_err_set(err, KT_ERR_INVALID, "matmul_lt: bad token count %lld, or NULL x, y or scratch",
                          (long long)n_tok);
    if ((uintptr_t)d_scratch % 256 != 0)
        return kt_err_set(err, KT_ERR_INVALID, "matmul_lt: scratch must be 256-byte aligned");
    size_t part[3];
    lt_scratch_parts(w, n_tok, part);
    if (scratch_bytes < part[0] + part[1] + part[2])
        return kt_err_set(err, KT_ERR_INVALID, "matmul_lt: scratch of %zu bytes, %zu needed", scratch_bytes,
                          part[0] + part[1] + part[2]);
    cublasLtHandle_t handle;
    if ((st = lt_get_handle(&handle, err)) != KT_OK)
        return st;

    cudaStream_t s = (cudaStream_t)stream;
    uint8_t *base = (uint8_t *)d_scratch;
    const int64_t ld = lt_bf16_ld(w->n_in);
    __nv_bfloat16 *xb = (__nv_bfloat16 *)(base + part[0]); /* (n_tok, ld) */
    const void *wb = w->data;                              /* (n_out, ldw) */
    int64_t ldw = (int64_t)(kt_cuda_mat_row_bytes(w) / sizeof(__nv_bfloat16));
    if (!lt_weight_in_place(w)) {
        __nv_bfloat16 *copy = (__nv_bfloat16 *)(base + part[0] + part[1]);
        if ((st = kt_cuda_mat_to_bf16(w, copy, ld, s, err)) != KT_OK)
            return st;
        wb = copy;
        ldw = ld;
    }
    const struct kt_cuda_mat x_rows = {KT_TYPE_F32, d_x, w->n_in, n_tok, 0}; /* x read as n_tok F32 rows */
    if ((st = kt_cuda_mat_to_bf16(&x_rows, xb, ld, s, err)) != KT_OK)
        return st;

    /*
     * cuBLASLt is column-major: a row-major (r, c) array with row stride ld is
     * the column-major (c, r) matrix with the same ld - its transpose.  So
     *   W (n_out, n_in), stride ldw    is  A = W^T, column-major (n_in, n_out)
     *   x (n_tok, n_in), stride ld     is  B = x^T, column-major (n_in, n_tok)
     *   y (n_tok, n_out), stride n_out is  D = y^T, column-major (n_out, n_tok)
     * and y = x W^T  <=>  y^T = W x^T = A^T B: TRANSA = T, TRANSB = N,
     * m = n_out, n = n_tok, k = n_in.
     */
    return lt_gemm(handle, wb, ldw, xb, ld, d_y, w->n_out, n_tok, w->n_in, base, s, err);
}
