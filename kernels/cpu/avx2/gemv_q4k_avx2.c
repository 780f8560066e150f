/*
 * gemv_q4k_avx2.c - the AVX2 Q4_K gemv of the decode hot path: several Q4_K
 * weight rows against one Q8_K activation, four rows per pass, so each
 * activation block and its bsums are loaded once for four rows and the four
 * row streams are prefetched together (each row KT_GEMV_Q4K_PREFETCH bytes
 * ahead, past its end into the row the next pass reads).  It exists only to
 * stream the weights closer to DRAM bandwidth than one vec_dot per row does.
 * It must never change a result: out[r] equals kt_vec_dot_q4_K_q8_K_avx2 on
 * row r bit for bit (exact integer sums, then per row and per super-block
 * sum += d*da*(float)sum_q - dmin*da*(float)sum_m in block order, one row per
 * float lane), and it must never read outside the n_rows rows of n/256 blocks
 * nor the activation's n/256 blocks (only prefetches, which never fault, aim
 * further).  Q8_K bsums must be the sums of its qs, as quantize_act makes them.
 */
#include "cpu/avx2/gemv_q4k_avx2.h"
#include "cpu/avx2/simd_avx2.h"

/* Per row: how far ahead of the block being read the prefetches aim. */
#define KT_GEMV_Q4K_PREFETCH 2048

#define KT_GEMV_Q4K_ROWS 4

/* Bytes 0-7 = sc_0..7, bytes 8-15 = m_0..7 of the packed 6-bit scales, in
 * both 128-bit halves (as vec_dot_kquant_avx2.c's k_scales_mins). */
static inline __m256i scales_mins_q4_K(const uint8_t scales[12])
{
    return _mm256_broadcastsi128_si256(k_scales_mins_128(scales));
}

static inline __m256i byte_as_i16(__m256i v, int j)
{
    return _mm256_shuffle_epi8(v, _mm256_set1_epi16((short)(0x8000 | j)));
}

/* Prefetches block i of a row KT_GEMV_Q4K_PREFETCH bytes ahead; past the
 * row's end that is the same offset in the row next_row bytes further on. */
static inline void prefetch_block(uintptr_t row, size_t off, size_t row_bytes, size_t next_row)
{
    size_t ahead = off + KT_GEMV_Q4K_PREFETCH;
    uintptr_t p = ahead < row_bytes ? row + ahead : row + next_row + (ahead - row_bytes);
    _mm_prefetch((const char *)p, _MM_HINT_T0);
    _mm_prefetch((const char *)(p + 64), _MM_HINT_T0);
    _mm_prefetch((const char *)(p + 128), _MM_HINT_T0);
}

/* Four rows (pointers may repeat) -> out4[0..3]. */
static void rows4(int64_t nb, float out4[4], const uint8_t *const row[4], size_t row_bytes,
                  const struct kt_block_q8_K *y)
{
    const __m256i low4 = _mm256_set1_epi8(0x0f);
    const __m256i m_twice_idx =
        _mm256_setr_epi8(8, -1, 8, -1, 9, -1, 9, -1, 10, -1, 10, -1, 11, -1, 11, -1, 12, -1, 12, -1, 13, -1, 13, -1,
                         14, -1, 14, -1, 15, -1, 15, -1);
    const size_t next_row = KT_GEMV_Q4K_ROWS * row_bytes;
    __m128 sum = _mm_setzero_ps(); /* lane r: row r's running sum */
    for (int64_t i = 0; i < nb; i++) {
        const size_t off = (size_t)i * sizeof(struct kt_block_q4_K);
        const struct kt_block_q4_K *x[KT_GEMV_Q4K_ROWS];
        __m256i sm[KT_GEMV_Q4K_ROWS], acc[KT_GEMV_Q4K_ROWS];
        for (int r = 0; r < KT_GEMV_Q4K_ROWS; r++) {
            x[r] = (const struct kt_block_q4_K *)(row[r] + off);
            prefetch_block((uintptr_t)row[r], off, row_bytes, next_row);
            sm[r] = scales_mins_q4_K(x[r]->scales);
            acc[r] = _mm256_setzero_si256();
        }
        for (int c = 0; c < 4; c++) { /* byte l of chunk c: element 64c+l low, 64c+32+l high */
            const __m256i a_lo = _mm256_loadu_si256((const __m256i *)(y[i].qs + 64 * c));
            const __m256i a_hi = _mm256_loadu_si256((const __m256i *)(y[i].qs + 64 * c + 32));
            for (int r = 0; r < KT_GEMV_Q4K_ROWS; r++) {
                const __m256i bits = _mm256_loadu_si256((const __m256i *)(x[r]->qs + 32 * c));
                const __m256i lo = _mm256_and_si256(bits, low4);
                const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(bits, 4), low4);
                const __m256i p_lo = _mm256_madd_epi16(byte_as_i16(sm[r], 2 * c), _mm256_maddubs_epi16(lo, a_lo));
                const __m256i p_hi =
                    _mm256_madd_epi16(byte_as_i16(sm[r], 2 * c + 1), _mm256_maddubs_epi16(hi, a_hi));
                acc[r] = _mm256_add_epi32(acc[r], _mm256_add_epi32(p_lo, p_hi));
            }
        }
        const __m256i bsums = _mm256_loadu_si256((const __m256i *)y[i].bsums);
        __m256i mins[KT_GEMV_Q4K_ROWS];
        for (int r = 0; r < KT_GEMV_Q4K_ROWS; r++)
            mins[r] = _mm256_madd_epi16(_mm256_shuffle_epi8(sm[r], m_twice_idx), bsums);
        const __m128i sum_q = hsum4_epi32(acc[0], acc[1], acc[2], acc[3]);
        const __m128i sum_m = hsum4_epi32(mins[0], mins[1], mins[2], mins[3]);
        /* fp16 (d, dmin) of the four rows -> d0 dmin0 d1 dmin1 | d2 dmin2 d3 dmin3 */
        const __m256 dm = _mm256_cvtph_ps(_mm_setr_epi32((int)load_u32(&x[0]->d), (int)load_u32(&x[1]->d),
                                                         (int)load_u32(&x[2]->d), (int)load_u32(&x[3]->d)));
        const __m128 dm01 = _mm256_castps256_ps128(dm), dm23 = _mm256_extractf128_ps(dm, 1);
        const __m128 d = _mm_shuffle_ps(dm01, dm23, _MM_SHUFFLE(2, 0, 2, 0));
        const __m128 dmin = _mm_shuffle_ps(dm01, dm23, _MM_SHUFFLE(3, 1, 3, 1));
        const __m128 da = _mm_set1_ps(y[i].d);
        const __m128 t = _mm_sub_ps(_mm_mul_ps(_mm_mul_ps(d, da), _mm_cvtepi32_ps(sum_q)),
                                    _mm_mul_ps(_mm_mul_ps(dmin, da), _mm_cvtepi32_ps(sum_m)));
        sum = _mm_add_ps(sum, t);
    }
    _mm_storeu_ps(out4, sum);
}

void kt_gemv_q4_K_q8_K_avx2(int64_t n, float *out, const void *w, size_t row_bytes, const void *a, int64_t n_rows)
{
    const uint8_t *base = w;
    const int64_t nb = n / KT_QK_K;
    for (int64_t r0 = 0; r0 < n_rows; r0 += KT_GEMV_Q4K_ROWS) {
        const int64_t left = n_rows - r0;
        const uint8_t *row[KT_GEMV_Q4K_ROWS];
        for (int r = 0; r < KT_GEMV_Q4K_ROWS; r++) /* short last pass: repeat its last row */
            row[r] = base + (size_t)(r0 + (r < left ? r : left - 1)) * row_bytes;
        float out4[KT_GEMV_Q4K_ROWS];
        rows4(nb, out4, row, row_bytes, a);
        for (int r = 0; r < KT_GEMV_Q4K_ROWS && r < left; r++)
            out[r0 + r] = out4[r];
    }
}
