/*
 * packed_avx512.c - Q4_K, Q8_0 and Q4_0 expert weights repacked 16 rows per
 * group for vpdpbusd, and the products over them (kernels/cpu/packed.h): the
 * prefill and decode kernels of the routed experts on CPUs with AVX-512 VNNI
 * (Q4_0: Kimi-K2's INT4 group-32 experts, kt_q4_0_from_int4_row).
 *
 * One zmm lane is one weight row: a 64-byte vector holds 4 consecutive
 * weights of each of 16 rows, so one vpdpbusd against a 4-byte activation
 * broadcast ({1to16} from memory) adds 16 rows x 4 products for one token,
 * and a weight vector loaded (and unpacked) once serves a tile of up to 16
 * tokens.  Every output equals the reference vec_dot
 * (kernels/cpu/ref/vec_dot_ref.c) bit for bit: each block's integer sums are
 * exact in int32 (vpdpbusd and vpdpwssd never saturate, and each layout below
 * states the bounds of its partials), and each row lane forms its block's
 * float term with the reference's expression and adds it in block order,
 * for any activation bytes (no quant range or bsums consistency is assumed).
 * This file must never merge two blocks' integer sums before their float
 * scale, never reorder or fuse (FMA) the float steps (-ffp-contract=off),
 * never read a weight or an activation row past its n elements, and never
 * write y outside the n_rows x n_tok outputs.  Packed buffers must be 64-byte
 * aligned.
 */
#if !defined(__AVX512F__) || !defined(__AVX512BW__) || !defined(__AVX512VL__) || !defined(__AVX512VNNI__)
#error "packed_avx512.c needs the AVX-512 level flags (kernels/CMakeLists.txt sets them for cpu/avx512/*.c)"
#endif

#include "cpu/avx512/packed_avx512.h"
#include "cpu/avx2/simd_avx2.h"

#include <limits.h>
#include <stdbool.h>
#include <string.h>

#define ROWS 16   /* rows per group: one per int32 lane of a zmm */
#define TOKENS 16 /* register tile: tokens sharing each weight vector */

/* The lanes of a group that hold real rows (the last group may be short). */
static inline __mmask16 row_mask(int64_t rows_left)
{
    return rows_left >= ROWS ? (__mmask16)0xffff : (__mmask16)((1u << rows_left) - 1);
}

#define prefetch_weights kt_packed_prefetch
#define PREFETCH_BYTES KT_PACKED_PREFETCH_BYTES /* streaming distance (see KT_AVX2_PREFETCH_BYTES) */

/* ---- the inner products are asm ------------------------------------------------- */

/*
 * GCC 12 neither folds activation broadcasts into vpdpbusd ({1to16} from
 * memory) nor keeps 16 accumulators in place across a loop (it copies and
 * spills them), and the out-of-order core overlaps the vpdpbusd chains of
 * several tokens well only when they are interleaved in program order:
 * together a fifth to a third of the speed.  So the innermost products are
 * small asm blocks; everything around them (unpacking, scales, the float
 * steps in the reference's order) stays C.  M(c, t) for the K tokens of a
 * block, t = 0 .. K-1:
 */
#define TOKENS1(M, c) M(c, 0)
#define TOKENS2(M, c) M(c, 0) M(c, 1)
#define TOKENS4(M, c) M(c, 0) M(c, 1) M(c, 2) M(c, 3)
#define TOKENS8(M, c) TOKENS4(M, c) M(c, 4) M(c, 5) M(c, 6) M(c, 7)
#define TOKENS16(M, c) TOKENS8(M, c) M(c, 8) M(c, 9) M(c, 10) M(c, 11) M(c, 12) M(c, 13) M(c, 14) M(c, 15)

/* ---- Q4_K x Q8_K ----------------------------------------------------------------- */

/*
 * A group is n/256 super-block slices of Q4K_SB_BYTES, slice i for elements
 * 256i .. 256i+255 of the 16 rows (r = row within the group, q the 4-bit
 * quants in element order as kt_unpack_q4_K gives them):
 *
 *   offset  bytes  contents
 *   0       2048   32 vectors V[h][p], h = 0..15 (half sub-block: elements
 *                  16h .. 16h+15), p = 0..1; bytes 4r .. 4r+3 of V[h][p]:
 *                    low nibble of byte e  = q[r][16h + 8p + e]
 *                    high nibble of byte e = q[r][16h + 8p + 4 + e]
 *   2048   128    sc[j][r]: 6-bit scale of sub-block j (elements 32j ..), u8
 *   2176   128    m[j][r]:  6-bit min of sub-block j, u8
 *   2304   32     d[r]:     fp16 super-block scale, as in the GGUF block
 *   2336   32     dmin[r]:  fp16 super-block min scale
 *
 * so (V & 0x0f) and (V >> 4 & 0x0f) are the unsigned vpdpbusd operands of
 * 4 consecutive elements per row, sc widens to int32 lanes with one
 * vpmovzxbd, and 2368 = 37 x 64 keeps every slice 64-byte aligned.  Rows
 * past n_rows in the last group are zero bytes throughout.
 *
 * Per token and half h the 4 vpdpbusd of that half sum 16 products per row,
 * |sum| <= 16 * 15 * 128 < 2^15, so the int32 lane is a sign-extended int16
 * and vpdpwssd against (sc_j, 0) adds sc_j * sum exactly; the mins term
 * sum_j m_j * (bsums[2j] + bsums[2j+1]) is vpdpwssd of (m_j, m_j) against
 * the broadcast bsums pair, exact for any int16 bsums.
 */
#define Q4K_SB_BYTES KT_PACKED_Q4_K_SB_BYTES
#define Q4K_SC KT_PACKED_Q4_K_SC
#define Q4K_M KT_PACKED_Q4_K_M
#define Q4K_D KT_PACKED_Q4_K_D
#define Q4K_DMIN KT_PACKED_Q4_K_DMIN
#define Q8K_QS 4      /* offsetof(struct kt_block_q8_K, qs) */
#define Q8K_BSUMS 260 /* offsetof(struct kt_block_q8_K, bsums) */

static_assert(Q4K_SB_BYTES % 64 == 0, "q4_K slices stay 64-byte aligned");
static_assert(sizeof(struct kt_block_q8_K) == 292 && Q8K_BSUMS == 4 + KT_QK_K, "q8_K field offsets");

static size_t q4_K_group_bytes(int64_t n)
{
    return (size_t)(n / KT_QK_K) * Q4K_SB_BYTES;
}

/* Elements k .. k+3 of a GGUF Q4_K block (k % 4 == 0), one per byte. */
static inline uint32_t q4_K_nibbles4(const uint8_t qs[KT_QK_K / 2], int k)
{
    const int l = k % 64;
    const uint32_t v = load_u32(qs + 32 * (k / 64) + (l & 31));
    return (l < 32 ? v : v >> 4) & 0x0f0f0f0fu;
}

static void q4_K_pack_block(const struct kt_block_q4_K *b, int r, uint8_t *s)
{
    for (int j = 0; j < 8; j++)
        kt_k_scale_min(b->scales, j, &s[Q4K_SC + 16 * j + r], &s[Q4K_M + 16 * j + r]);
    memcpy(s + Q4K_D + 2 * r, &b->d, sizeof b->d);
    memcpy(s + Q4K_DMIN + 2 * r, &b->dmin, sizeof b->dmin);
    for (int h = 0; h < 16; h++)
        for (int p = 0; p < 2; p++) {
            const int k = 16 * h + 8 * p;
            const uint32_t v = q4_K_nibbles4(b->qs, k) | q4_K_nibbles4(b->qs, k + 4) << 4;
            memcpy(s + 128 * h + 64 * p + 4 * r, &v, sizeof v);
        }
}

static void q4_K_pack(int64_t n, const void *w, size_t row_bytes, int64_t n_rows, void *dst)
{
    const int64_t nb = n / KT_QK_K;
    const size_t gb = q4_K_group_bytes(n);
    for (int64_t r0 = 0; r0 < n_rows; r0 += ROWS) {
        uint8_t *g = (uint8_t *)dst + (size_t)(r0 / ROWS) * gb;
        if (n_rows - r0 < ROWS)
            memset(g, 0, gb);
        for (int r = 0; r < ROWS && r0 + r < n_rows; r++) {
            const struct kt_block_q4_K *x = (const void *)((const uint8_t *)w + (size_t)(r0 + r) * row_bytes);
            for (int64_t i = 0; i < nb; i++)
                q4_K_pack_block(&x[i], r, g + (size_t)i * Q4K_SB_BYTES);
        }
    }
}

/* Lane r of 128-bit lane L takes byte 4L + r%4 twice: words (m_r, m_r). */
static inline __m512i q4_K_min_pairs(const uint8_t m16[16])
{
    const __m512i ctrl = _mm512_set_epi32(
        (int)0x800f800f, (int)0x800e800e, (int)0x800d800d, (int)0x800c800c, (int)0x800b800b, (int)0x800a800a,
        (int)0x80098009, (int)0x80088008, (int)0x80078007, (int)0x80068006, (int)0x80058005, (int)0x80048004,
        (int)0x80038003, (int)0x80028002, (int)0x80018001, (int)0x80008000);
    return _mm512_shuffle_epi8(_mm512_broadcast_i32x4(_mm_load_si128((const __m128i *)m16)), ctrl);
}

/* sq + sc * (the 16-element dot of w0..w3 with q[0..15]) per lane (see above),
 * then q += stride: the next token's half.  Walking one pointer keeps every
 * address base + displacement (an indexed one would cost the vpdpbusd its
 * micro-fusion, which measured slower than interleaving tokens gains). */
static inline __m512i q4_K_half(__m512i sq, __m512i w0, __m512i w1, __m512i w2, __m512i w3, __m512i sc,
                                const uint8_t **q, size_t stride)
{
    __m512i x;
    __asm__("vpxord %[x], %[x], %[x]\n\t"
            "vpdpbusd (%[q])%{1to16%}, %[w0], %[x]\n\t"
            "vpdpbusd 4(%[q])%{1to16%}, %[w1], %[x]\n\t"
            "vpdpbusd 8(%[q])%{1to16%}, %[w2], %[x]\n\t"
            "vpdpbusd 12(%[q])%{1to16%}, %[w3], %[x]\n\t"
            "vpdpwssd %[sc], %[x], %[sq]\n\t"
            "add %[stride], %[q]"
            : [sq] "+v"(sq), [x] "=&v"(x), [q] "+r"(*q)
            : [w0] "v"(w0), [w1] "v"(w1), [w2] "v"(w2), [w3] "v"(w3), [sc] "v"(sc), [stride] "r"(stride),
              "m"(*(const uint8_t(*)[16]) * q)
            : "cc");
    return sq;
}

/* sum_j m_j * (bsums[2j] + bsums[2j+1]) per lane, mp[j] = (m_j, m_j) words. */
static inline __m512i q4_K_mins(const __m512i mp[8], const uint8_t *bsums)
{
    __m512i sm;
    __asm__("vpxord %[sm], %[sm], %[sm]\n\t"
            "vpdpwssd (%[b])%{1to16%}, %[m0], %[sm]\n\t"
            "vpdpwssd 4(%[b])%{1to16%}, %[m1], %[sm]\n\t"
            "vpdpwssd 8(%[b])%{1to16%}, %[m2], %[sm]\n\t"
            "vpdpwssd 12(%[b])%{1to16%}, %[m3], %[sm]\n\t"
            "vpdpwssd 16(%[b])%{1to16%}, %[m4], %[sm]\n\t"
            "vpdpwssd 20(%[b])%{1to16%}, %[m5], %[sm]\n\t"
            "vpdpwssd 24(%[b])%{1to16%}, %[m6], %[sm]\n\t"
            "vpdpwssd 28(%[b])%{1to16%}, %[m7], %[sm]"
            : [sm] "=&v"(sm)
            : [m0] "v"(mp[0]), [m1] "v"(mp[1]), [m2] "v"(mp[2]), [m3] "v"(mp[3]), [m4] "v"(mp[4]),
              [m5] "v"(mp[5]), [m6] "v"(mp[6]), [m7] "v"(mp[7]), [b] "r"(bsums), "m"(*(const uint8_t(*)[32])bsums));
    return sm;
}

/*
 * y[t * y_stride + r] = dot(row r, token t) for the rows of one group (rmask)
 * and nt tokens from a (Q8_K rows act_bytes apart).  Lane r of acc[t] is the
 * reference's `sum` for (r, t), taking per super-block
 *   (d * da) * (float)sum_q - (dmin * da) * (float)sum_m.
 * acc and mins (the second product, formed first) are the caller's 16 x 16
 * floats each: in memory, so the 16 integer sums sum_q own the registers.
 */
static inline __attribute__((always_inline)) void q4_K_tile(int64_t nb, const uint8_t *g, const uint8_t *a,
                                                            size_t act_bytes, const int nt, float *acc, float *mins,
                                                            float *y, int64_t y_stride, __mmask16 rmask)
{
    const __m512i low4 = _mm512_set1_epi8(0x0f);
    for (int t = 0; t < nt; t++)
        _mm512_store_ps(acc + 16 * t, _mm512_setzero_ps());
    for (int64_t i = 0; i < nb; i++) {
        const uint8_t *s = g + (size_t)i * Q4K_SB_BYTES;
        const size_t act_off = (size_t)i * sizeof(struct kt_block_q8_K);
        for (int line = Q4K_SC; line < Q4K_SB_BYTES; line += 64) /* the h loop prefetches the quants */
            prefetch_weights(s + line, PREFETCH_BYTES);
        const __m512 dmin = _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)(s + Q4K_DMIN)));
        __m512i mp[8];
        for (int j = 0; j < 8; j++)
            mp[j] = q4_K_min_pairs(s + Q4K_M + 16 * j);
        const uint8_t *yb = a + act_off; /* token t's super-block i, t = 0 first */
        for (int t = 0; t < nt; t++, yb += act_bytes) {
            float da;
            memcpy(&da, yb, sizeof da);
            const __m512i sm = q4_K_mins(mp, yb + Q8K_BSUMS);
            const __m512 scale = _mm512_mul_ps(dmin, _mm512_set1_ps(da));
            _mm512_store_ps(mins + 16 * t, _mm512_mul_ps(scale, _mm512_cvtepi32_ps(sm)));
        }
        __m512i sq[TOKENS];
        for (int t = 0; t < nt; t++)
            sq[t] = _mm512_setzero_si512();
        for (int h = 0; h < 16; h++) {
            prefetch_weights(s + 128 * h, PREFETCH_BYTES);
            prefetch_weights(s + 128 * h + 64, PREFETCH_BYTES);
            const __m512i p0 = _mm512_load_si512((const void *)(s + 128 * h));
            const __m512i p1 = _mm512_load_si512((const void *)(s + 128 * h + 64));
            const __m512i w[4] = {_mm512_and_si512(p0, low4), _mm512_and_si512(_mm512_srli_epi16(p0, 4), low4),
                                  _mm512_and_si512(p1, low4), _mm512_and_si512(_mm512_srli_epi16(p1, 4), low4)};
            const __m512i sc = _mm512_cvtepu8_epi32(_mm_load_si128((const __m128i *)(s + Q4K_SC + 16 * (h / 2))));
            const uint8_t *q = a + act_off + Q8K_QS + 16 * h; /* token 0's half, then each next */
            for (int t = 0; t < nt; t++)
                sq[t] = q4_K_half(sq[t], w[0], w[1], w[2], w[3], sc, &q, act_bytes);
        }
        const __m512 d = _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)(s + Q4K_D)));
        for (int t = 0; t < nt; t++) {
            float da;
            memcpy(&da, a + (size_t)t * act_bytes + act_off, sizeof da);
            const __m512 scale = _mm512_mul_ps(d, _mm512_set1_ps(da));
            const __m512 term = _mm512_sub_ps(_mm512_mul_ps(scale, _mm512_cvtepi32_ps(sq[t])),
                                              _mm512_load_ps(mins + 16 * t));
            _mm512_store_ps(acc + 16 * t, _mm512_add_ps(_mm512_load_ps(acc + 16 * t), term));
        }
    }
    for (int t = 0; t < nt; t++)
        _mm512_mask_storeu_ps(y + t * y_stride, rmask, _mm512_load_ps(acc + 16 * t));
}

/*
 * The decode tile: y[r] = dot(row r, token a) for the rows of one group, one
 * token.  Measured on a Zen 4 VM (2 threads, `kt-bench kernels` and
 * interleaved triads) the general tile at nt = 1 streamed at about 0.8 x the
 * triad while AVX2's 8-row kernel reached about 1.0: each of its super-blocks
 * reads the scale lines at its end (2048 ..) before its 32 quant lines and
 * chains all 16 halves into one int32 sum.  Here a super-block is read in
 * address order (the quants, then sc, m, d and dmin) and its halves go into
 * two sums (even and odd h), added as integers before the float steps:
 * integer sums are exact whatever their order (|sum_q| <= 256 * 15 * 128 * 63
 * < 2^31), and the float steps are the general tile's, in its order, so
 * every output keeps the reference's bits.  Measured 1.26 x the triads beside
 * it where the general tile gave 0.79 (README.md, Measured).
 */
static void q4_K_decode(int64_t nb, const uint8_t *g, const uint8_t *a, float *y, __mmask16 rmask)
{
    const __m512i low4 = _mm512_set1_epi8(0x0f);
    __m512 acc = _mm512_setzero_ps();
    for (int64_t i = 0; i < nb; i++) {
        const uint8_t *s = g + (size_t)i * Q4K_SB_BYTES;
        const uint8_t *yb = a + (size_t)i * sizeof(struct kt_block_q8_K);
        __m512i sq0 = _mm512_setzero_si512(), sq1 = _mm512_setzero_si512();
        for (int h = 0; h < 16; h += 2) {
            const uint8_t *v = s + 128 * h; /* halves h and h + 1: four lines */
            __m512i p[4];
            for (int l = 0; l < 4; l++) {
                prefetch_weights(v + 64 * l, PREFETCH_BYTES);
                p[l] = _mm512_load_si512((const void *)(v + 64 * l));
            }
            const __m512i sc = _mm512_cvtepu8_epi32(_mm_load_si128((const __m128i *)(s + Q4K_SC + 16 * (h / 2))));
            const uint8_t *q = yb + Q8K_QS + 16 * h; /* half h's 16 bytes, then h + 1's */
            sq0 = q4_K_half(sq0, _mm512_and_si512(p[0], low4), _mm512_and_si512(_mm512_srli_epi16(p[0], 4), low4),
                            _mm512_and_si512(p[1], low4), _mm512_and_si512(_mm512_srli_epi16(p[1], 4), low4), sc, &q,
                            16);
            sq1 = q4_K_half(sq1, _mm512_and_si512(p[2], low4), _mm512_and_si512(_mm512_srli_epi16(p[2], 4), low4),
                            _mm512_and_si512(p[3], low4), _mm512_and_si512(_mm512_srli_epi16(p[3], 4), low4), sc, &q,
                            16);
        }
        for (int line = Q4K_SC; line < Q4K_SB_BYTES; line += 64)
            prefetch_weights(s + line, PREFETCH_BYTES);
        __m512i mp[8];
        for (int j = 0; j < 8; j++)
            mp[j] = q4_K_min_pairs(s + Q4K_M + 16 * j);
        float da;
        memcpy(&da, yb, sizeof da);
        const __m512i sm = q4_K_mins(mp, yb + Q8K_BSUMS);
        const __m512 dmin = _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)(s + Q4K_DMIN)));
        const __m512 mins = _mm512_mul_ps(_mm512_mul_ps(dmin, _mm512_set1_ps(da)), _mm512_cvtepi32_ps(sm));
        const __m512 d = _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)(s + Q4K_D)));
        const __m512 scale = _mm512_mul_ps(d, _mm512_set1_ps(da));
        const __m512i sq = _mm512_add_epi32(sq0, sq1);
        acc = _mm512_add_ps(acc, _mm512_sub_ps(_mm512_mul_ps(scale, _mm512_cvtepi32_ps(sq)), mins));
    }
    _mm512_mask_storeu_ps(y, rmask, acc);
}

typedef void (*q4_K_tile_fn)(int64_t nb, const uint8_t *g, const uint8_t *a, size_t act_bytes, float *acc,
                             float *mins, float *y, int64_t y_stride, __mmask16 rmask);

#define TILE_COUNTS(X) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11) X(12) X(13) X(14) X(15) X(16)

#define Q4K_TILE(nt)                                                                                     \
    static void q4_K_tile_##nt(int64_t nb, const uint8_t *g, const uint8_t *a, size_t act_bytes, float *acc, \
                               float *mins, float *y, int64_t y_stride, __mmask16 rmask)                  \
    {                                                                                                    \
        q4_K_tile(nb, g, a, act_bytes, nt, acc, mins, y, y_stride, rmask);                               \
    }
TILE_COUNTS(Q4K_TILE)
#define Q4K_TILE_REF(nt) q4_K_tile_##nt,
static const q4_K_tile_fn q4_K_tiles[TOKENS] = {TILE_COUNTS(Q4K_TILE_REF)};

/* Groups outer, token tiles inner: a group's weights (66 KiB at n = 7168)
 * stay in L2 while every token tile reads them; a tile of one token (decode,
 * or a batch's last) runs q4_K_decode. */
static void q4_K_gemm(int64_t n, const void *w, int64_t n_rows, const void *a, size_t act_bytes, int64_t n_tok,
                      float *y, int64_t y_stride)
{
    const int64_t nb = n / KT_QK_K;
    const size_t gb = q4_K_group_bytes(n);
    float acc[TOKENS * ROWS] __attribute__((aligned(64))), mins[TOKENS * ROWS] __attribute__((aligned(64)));
    for (int64_t r0 = 0; r0 < n_rows; r0 += ROWS) {
        const uint8_t *g = (const uint8_t *)w + (size_t)(r0 / ROWS) * gb;
        const __mmask16 rmask = row_mask(n_rows - r0);
        for (int64_t t0 = 0; t0 < n_tok; t0 += TOKENS) {
            const int64_t nt = n_tok - t0 < TOKENS ? n_tok - t0 : TOKENS;
            if (nt == 1) /* decode, or the last token of a batch */
                q4_K_decode(nb, g, (const uint8_t *)a + (size_t)t0 * act_bytes, y + t0 * y_stride + r0, rmask);
            else
                q4_K_tiles[nt - 1](nb, g, (const uint8_t *)a + (size_t)t0 * act_bytes, act_bytes, acc,
                                   mins, y + t0 * y_stride + r0, y_stride, rmask);
        }
    }
}

const struct kt_packed_format kt_packed_q4_K_avx512 = {
    .name = "q4_K.r16.avx512",
    .rows = ROWS,
    .exact = true,
    .group_bytes = q4_K_group_bytes,
    .pack = q4_K_pack,
    .gemm = q4_K_gemm,
};

/* ---- Q8_0 x Q8_0 and Q4_0 x Q8_0 --------------------------------------------------- */

/*
 * Both legacy types meet Q8_0 activations block by block (32 elements, one
 * fp16 scale per row and block) and share everything but their weight
 * slices: the activation panels, the vpdpbusd blocks, the token tiles and the
 * k chunks below (`q4` selects the slices at compile time).
 *
 * Q8_0: a group is ceil(nb / 2) pair slices of Q8_0_PAIR_BYTES, pair p for
 * blocks 2p and 2p+1 (elements 64p .. 64p+63) of the 16 rows:
 *
 *   offset  bytes  contents
 *   0       512    block 2p:   8 vectors V[c], c = 0..7; bytes 4r .. 4r+3 of
 *                  V[c] = w[r][4c .. 4c+3] + 128 (the int8 quants, sign bit
 *                  flipped: unsigned for vpdpbusd)
 *   512     512    block 2p+1: the same
 *   1024    32     d[r] of block 2p (fp16, as in the GGUF block)
 *   1056    32     d[r] of block 2p+1
 *
 * 1088 = 17 x 64.  sum (w+128)*a = sum w*a + 128 * sum a: the accumulator of
 * each (block, token) starts at -128 * sum a (|.| <= 2^19) and every partial
 * stays far inside int32.
 *
 * Q4_0: a group is ceil(nb / 2) pair slices of Q4_0_PAIR_BYTES:
 *
 *   offset  bytes  contents
 *   0       256    block 2p:   4 vectors V[c], c = 0..3; bytes 4r .. 4r+3 of
 *                  V[c] = row r's qs[4c .. 4c+3] as in the GGUF block: the
 *                  low nibble of byte e is code q[r][4c + e], the high nibble
 *                  q[r][16 + 4c + e] (codes 0..15, unsigned as they are)
 *   256     256    block 2p+1: the same
 *   512     32     d[r] of block 2p (fp16, as in the GGUF block)
 *   544     32     d[r] of block 2p+1
 *
 * 576 = 9 x 64, exactly the GGUF rows' 18 bytes per block and row when nb is
 * even.  V & 0x0f is the vpdpbusd operand of activation chunk c (elements
 * 4c .. 4c+3), V >> 4 & 0x0f that of chunk c + 4.  sum (q-8)*a = sum q*a -
 * 8 * sum a: the accumulator starts at -8 * sum a (|.| <= 2^15), and
 * |sum q*a| <= 32 * 15 * 128.
 *
 * With nb odd the last pair's second block is zero bytes and never read;
 * rows past n_rows in the last group are zero bytes throughout (a Q4_0
 * padding row has d = +0: every term is a zero, and its sum stays +0).
 */
#define Q8_0_PAIR_BYTES KT_PACKED_Q8_0_PAIR_BYTES
#define Q8_0_D KT_PACKED_Q8_0_D
#define Q4_0_PAIR_BYTES KT_PACKED_Q4_0_PAIR_BYTES
#define Q4_0_D KT_PACKED_Q4_0_D

static_assert(Q8_0_PAIR_BYTES % 64 == 0 && Q4_0_PAIR_BYTES % 64 == 0, "legacy pair slices stay 64-byte aligned");

static size_t q8_0_group_bytes(int64_t n)
{
    return (size_t)((n / KT_QK + 1) / 2) * Q8_0_PAIR_BYTES;
}

static size_t q4_0_group_bytes(int64_t n)
{
    return (size_t)((n / KT_QK + 1) / 2) * Q4_0_PAIR_BYTES;
}

static void q8_0_pack(int64_t n, const void *w, size_t row_bytes, int64_t n_rows, void *dst)
{
    const int64_t nb = n / KT_QK;
    const size_t gb = q8_0_group_bytes(n);
    for (int64_t r0 = 0; r0 < n_rows; r0 += ROWS) {
        uint8_t *g = (uint8_t *)dst + (size_t)(r0 / ROWS) * gb;
        if (n_rows - r0 < ROWS || nb % 2)
            memset(g, 0, gb);
        for (int r = 0; r < ROWS && r0 + r < n_rows; r++) {
            const struct kt_block_q8_0 *x = (const void *)((const uint8_t *)w + (size_t)(r0 + r) * row_bytes);
            for (int64_t b = 0; b < nb; b++) {
                uint8_t *s = g + (size_t)(b / 2) * Q8_0_PAIR_BYTES;
                for (int c = 0; c < 8; c++) {
                    const uint32_t v = load_u32(x[b].qs + 4 * c) ^ 0x80808080u;
                    memcpy(s + 512 * (b % 2) + 64 * c + 4 * r, &v, sizeof v);
                }
                memcpy(s + Q8_0_D + 32 * (b % 2) + 2 * r, &x[b].d, sizeof x[b].d);
            }
        }
    }
}

static void q4_0_pack(int64_t n, const void *w, size_t row_bytes, int64_t n_rows, void *dst)
{
    const int64_t nb = n / KT_QK;
    const size_t gb = q4_0_group_bytes(n);
    for (int64_t r0 = 0; r0 < n_rows; r0 += ROWS) {
        uint8_t *g = (uint8_t *)dst + (size_t)(r0 / ROWS) * gb;
        if (n_rows - r0 < ROWS || nb % 2)
            memset(g, 0, gb);
        for (int r = 0; r < ROWS && r0 + r < n_rows; r++) {
            const struct kt_block_q4_0 *x = (const void *)((const uint8_t *)w + (size_t)(r0 + r) * row_bytes);
            for (int64_t b = 0; b < nb; b++) {
                uint8_t *s = g + (size_t)(b / 2) * Q4_0_PAIR_BYTES;
                for (int c = 0; c < 4; c++)
                    memcpy(s + 256 * (b % 2) + 64 * c + 4 * r, x[b].qs + 4 * c, 4);
                memcpy(s + Q4_0_D + 32 * (b % 2) + 2 * r, &x[b].d, sizeof x[b].d);
            }
        }
    }
}

/*
 * Activations, rearranged once per call into panels: for a token tile of nt
 * tokens (ta = nt rounded up to a power of two) and one block, 40 * ta bytes
 *
 *   offset   bytes   contents
 *   0        32 ta   q[c][t][e] = quant 4c + e of token t, c = 0..7
 *   32 ta    4 ta    bias[t] = -2^shift * sum of token t's quants (int32):
 *                    shift 7 against Q8_0 weights, 3 against Q4_0
 *   36 ta    4 ta    d[t]    = token t's scale (float)
 *
 * so token t's bytes of chunk c sit at the constant offset 4 (ta c + t) from
 * the panel: one base register, no index (an indexed address would cost the
 * vpdpbusd its micro-fusion), for any number of tokens interleaved.  Panels
 * of consecutive blocks follow each other; slots t >= nt are never read.
 */
#define Q8_0_SCRATCH_BYTES (40 * 1024) /* panels of one (token, k) chunk, on the stack */
#define Q8_0_CHUNK_TILES 4             /* token tiles sharing a k chunk (64 tokens) */
#define Q8_0_BIAS_SHIFT 7              /* the weights' offset: +128 (Q8_0, flipped) */
#define Q4_0_BIAS_SHIFT 3              /* -8 (Q4_0's codes) */

static inline int tile_slots(int64_t nt)
{
    return nt <= 1 ? 1 : nt <= 2 ? 2 : nt <= 4 ? 4 : nt <= 8 ? 8 : 16;
}

/*
 * The panel of a full tile (16 tokens) for block b: the 16 x 8 quant dwords
 * transposed with two 8 x 8 transposes side by side (tokens 0-7 in the low
 * 256 bits, 8-15 in the high), the biases from vpdpbusd of ones against the
 * transposed quants, the scales by one gather.  A tenth of the scalar path's
 * work, which matters when a call covers few rows.
 */
static inline __attribute__((always_inline)) void q8_0_panel16(const uint8_t *a, size_t act_bytes, int64_t b,
                                                               uint8_t *p, const int shift)
{
    const uint8_t *q = a + (size_t)b * sizeof(struct kt_block_q8_0); /* token 0's block */
    __m512i r[8];
    for (int t = 0; t < 8; t++)
        r[t] = _mm512_inserti64x4(
            _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(q + (size_t)t * act_bytes + 2))),
            _mm256_loadu_si256((const __m256i *)(q + (size_t)(t + 8) * act_bytes + 2)), 1);
    __m512i u[8], v[8];
    for (int k = 0; k < 4; k++) {
        u[2 * k] = _mm512_unpacklo_epi32(r[2 * k], r[2 * k + 1]);
        u[2 * k + 1] = _mm512_unpackhi_epi32(r[2 * k], r[2 * k + 1]);
    }
    for (int k = 0; k < 2; k++)
        for (int h = 0; h < 2; h++) {
            v[4 * k + 2 * h] = _mm512_unpacklo_epi64(u[4 * k + h], u[4 * k + h + 2]);
            v[4 * k + 2 * h + 1] = _mm512_unpackhi_epi64(u[4 * k + h], u[4 * k + h + 2]);
        }
    /* v[4k + m], m = 0..3: dword m (lane 0) and m + 4 (lane 1) of tokens 4k .. 4k+3, per 256-bit half */
    const __m512i lane0 = _mm512_setr_epi64(0, 1, 8, 9, 4, 5, 12, 13);
    const __m512i lane1 = _mm512_setr_epi64(2, 3, 10, 11, 6, 7, 14, 15);
    const __m512i ones = _mm512_set1_epi8(1);
    __m512i sum = _mm512_setzero_si512();
    for (int m = 0; m < 4; m++) {
        const __m512i c_lo = _mm512_permutex2var_epi64(v[m], lane0, v[4 + m]); /* dword m of tokens 0..15 */
        const __m512i c_hi = _mm512_permutex2var_epi64(v[m], lane1, v[4 + m]); /* dword m + 4 */
        _mm512_store_si512((void *)(p + 64 * m), c_lo);
        _mm512_store_si512((void *)(p + 64 * (m + 4)), c_hi);
        sum = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(sum, ones, c_lo), ones, c_hi);
    }
    _mm512_store_si512((void *)(p + 512), _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(sum, shift)));
    /* the dword at each block's start: d (fp16) in its low half */
    const __m512i rows = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                            _mm512_set1_epi32((int)act_bytes));
    const __m512i head = _mm512_i32gather_epi32(rows, (const void *)q, 1);
    _mm512_store_ps(p + 576, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(head)));
}

/* The panels of nt tokens from a (rows act_bytes apart) for kb blocks from b0,
 * biases -2^shift * sum of the quants. */
static inline __attribute__((always_inline)) void q8_0_prepare(const uint8_t *a, size_t act_bytes, int64_t nt,
                                                               int64_t b0, int64_t kb, uint8_t *panels,
                                                               const int shift)
{
    const int ta = tile_slots(nt);
    if (nt == TOKENS && act_bytes <= INT32_MAX / TOKENS) {
        for (int64_t b = 0; b < kb; b++)
            q8_0_panel16(a, act_bytes, b0 + b, panels + (size_t)b * 40 * TOKENS, shift);
        return;
    }
    const __m256i flip = _mm256_set1_epi8((char)0x80);
    for (int64_t b = 0; b < kb; b++) {
        uint8_t *p = panels + (size_t)b * 40 * ta;
        for (int64_t t = 0; t < nt; t++) {
            const struct kt_block_q8_0 *blk =
                (const void *)(a + (size_t)t * act_bytes + (size_t)(b0 + b) * sizeof(struct kt_block_q8_0));
            for (int c = 0; c < 8; c++)
                memcpy(p + 4 * (ta * c + t), blk->qs + 4 * c, 4);
            /* sum (q + 128) over the 32 quants, as four 64-bit lanes */
            const __m256i s = _mm256_sad_epu8(_mm256_xor_si256(_mm256_loadu_si256((const __m256i *)blk->qs), flip),
                                              _mm256_setzero_si256());
            const __m128i s2 = _mm_add_epi64(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
            const int32_t sum = (int32_t)(_mm_cvtsi128_si64(s2) + _mm_extract_epi64(s2, 1)) - 32 * 128;
            const int32_t bias = -(1 << shift) * sum;
            const float d = fp16_to_f32(blk->d);
            memcpy(p + 32 * ta + 4 * t, &bias, sizeof bias);
            memcpy(p + 36 * ta + 4 * t, &d, sizeof d);
        }
    }
}

/*
 * One block for the K tokens of a panel from slot t0 (p = panel + 4 t0):
 * acc[t] = bias[t] + the 32-element dot of w (the unsigned weight operands of
 * chunks 0..7) with token t's quants = sum w * a exactly.  The K chains are
 * interleaved so the core runs them side by side.
 */
#define Q8_0_BIAS(c, t) "vpbroadcastd %c[bias]+4*" #t "(%[p]), %[a" #t "]\n\t"
#define Q8_0_DOT(c, t) "vpdpbusd %c[ta4]*" #c "+4*" #t "(%[p])%{1to16%}, %[w" #c "], %[a" #t "]\n\t"
#define Q8_0_ACC1 [a0] "=&v"(acc[0])
#define Q8_0_ACC2 Q8_0_ACC1, [a1] "=&v"(acc[1])
#define Q8_0_ACC4 Q8_0_ACC2, [a2] "=&v"(acc[2]), [a3] "=&v"(acc[3])
#define Q8_0_ACC8 Q8_0_ACC4, [a4] "=&v"(acc[4]), [a5] "=&v"(acc[5]), [a6] "=&v"(acc[6]), [a7] "=&v"(acc[7])
#define Q8_0_ACC16                                                                                              \
    Q8_0_ACC8, [a8] "=&v"(acc[8]), [a9] "=&v"(acc[9]), [a10] "=&v"(acc[10]), [a11] "=&v"(acc[11]),              \
        [a12] "=&v"(acc[12]), [a13] "=&v"(acc[13]), [a14] "=&v"(acc[14]), [a15] "=&v"(acc[15])
#define Q8_0_BLOCK(K)                                                                                           \
    static inline __attribute__((always_inline)) void q8_0_block##K(__m512i *acc, const __m512i w[8],          \
                                                                    const uint8_t *p, const int ta)             \
    {                                                                                                           \
        __asm__(TOKENS##K(Q8_0_BIAS, 0) TOKENS##K(Q8_0_DOT, 0) TOKENS##K(Q8_0_DOT, 1) TOKENS##K(Q8_0_DOT, 2)     \
                    TOKENS##K(Q8_0_DOT, 3) TOKENS##K(Q8_0_DOT, 4) TOKENS##K(Q8_0_DOT, 5) TOKENS##K(Q8_0_DOT, 6)  \
                        TOKENS##K(Q8_0_DOT, 7)                                                                  \
                : Q8_0_ACC##K                                                                                   \
                : [w0] "v"(w[0]), [w1] "v"(w[1]), [w2] "v"(w[2]), [w3] "v"(w[3]), [w4] "v"(w[4]),               \
                  [w5] "v"(w[5]), [w6] "v"(w[6]), [w7] "v"(w[7]), [p] "r"(p), [ta4] "i"(4 * ta),                 \
                  [bias] "i"(32 * ta)                                                                          \
                : "memory");                                                                                    \
    }
Q8_0_BLOCK(1)
Q8_0_BLOCK(2)
Q8_0_BLOCK(4)
Q8_0_BLOCK(8)
Q8_0_BLOCK(16)

/*
 * The 8 unsigned vpdpbusd operands of block b of a group's k chunk (g at the
 * chunk's first pair), prefetching as they stream (the scales: legacy_scales).
 */
static inline __attribute__((always_inline)) void legacy_weights(const uint8_t *g, int64_t b, const bool q4,
                                                                 __m512i w[8])
{
    const uint8_t *s = g + (size_t)(b / 2) * (q4 ? Q4_0_PAIR_BYTES : Q8_0_PAIR_BYTES);
    if (q4) {
        const __m512i low4 = _mm512_set1_epi8(0x0f);
        const uint8_t *v = s + 256 * (b % 2);
        for (int c = 0; c < 4; c++) {
            prefetch_weights(v + 64 * c, PREFETCH_BYTES);
            const __m512i bits = _mm512_load_si512((const void *)(v + 64 * c));
            w[c] = _mm512_and_si512(bits, low4);
            w[c + 4] = _mm512_and_si512(_mm512_srli_epi16(bits, 4), low4);
        }
        if (b % 2 == 0)
            prefetch_weights(s + Q4_0_D, PREFETCH_BYTES);
        return;
    }
    const uint8_t *v = s + 512 * (b % 2);
    for (int c = 0; c < 8; c++) {
        prefetch_weights(v + 64 * c, PREFETCH_BYTES);
        w[c] = _mm512_load_si512((const void *)(v + 64 * c));
    }
    if (b % 2 == 1) /* the pair's scale line too (unprefetched, it measured slower) */
        prefetch_weights(s + Q8_0_D, PREFETCH_BYTES);
}

/* The 16 rows' scales of block b (g as for legacy_weights), read after its
 * products: loaded before them (the pair's scale line ahead of its second
 * block's quants) the Q8_0 decode measured slower. */
static inline __attribute__((always_inline)) __m512 legacy_scales(const uint8_t *g, int64_t b, const bool q4)
{
    const uint8_t *s = g + (size_t)(b / 2) * (q4 ? Q4_0_PAIR_BYTES : Q8_0_PAIR_BYTES);
    return _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)(s + (q4 ? Q4_0_D : Q8_0_D) + 32 * (b % 2))));
}

/*
 * kb blocks of one group (g at the chunk's first pair) against the nt tokens
 * of a tile (their kb panels): lane r of acc[t] (the caller's 16 x 16
 * floats) is the reference's `sum` for (r, t), taking per block
 * (dw * da) * (float)sumi.  The first k chunk starts each sum at 0, later
 * ones continue from y.
 */
static inline __attribute__((always_inline)) void legacy_tile(int64_t kb, const uint8_t *g, const uint8_t *panels,
                                                              const int nt, const bool q4, bool first, float *acc,
                                                              float *y, int64_t y_stride, __mmask16 rmask)
{
    const int ta = nt <= 1 ? 1 : nt <= 2 ? 2 : nt <= 4 ? 4 : nt <= 8 ? 8 : 16;
    for (int t = 0; t < nt; t++)
        _mm512_store_ps(acc + 16 * t, first ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(rmask, y + t * y_stride));
    for (int64_t b = 0; b < kb; b++) {
        __m512i w[8];
        legacy_weights(g, b, q4, w);
        const uint8_t *p = panels + (size_t)b * 40 * ta;
        __m512i sumi[TOKENS];
        int t = 0;
        if (nt == 16)
            q8_0_block16(sumi, w, p, ta), t = 16;
        if (nt - t >= 8)
            q8_0_block8(sumi + t, w, p + 4 * t, ta), t += 8;
        if (nt - t >= 4)
            q8_0_block4(sumi + t, w, p + 4 * t, ta), t += 4;
        if (nt - t >= 2)
            q8_0_block2(sumi + t, w, p + 4 * t, ta), t += 2;
        if (nt - t >= 1)
            q8_0_block1(sumi + t, w, p + 4 * t, ta);
        const __m512 dw = legacy_scales(g, b, q4); /* after the products: see legacy_scales */
        for (t = 0; t < nt; t++) {
            float da;
            memcpy(&da, p + 36 * ta + 4 * t, sizeof da);
            const __m512 scale = _mm512_mul_ps(dw, _mm512_set1_ps(da));
            _mm512_store_ps(acc + 16 * t, _mm512_add_ps(_mm512_load_ps(acc + 16 * t),
                                                        _mm512_mul_ps(scale, _mm512_cvtepi32_ps(sumi[t]))));
        }
    }
    for (int t = 0; t < nt; t++)
        _mm512_mask_storeu_ps(y + t * y_stride, rmask, _mm512_load_ps(acc + 16 * t));
}

typedef void (*legacy_tile_fn)(int64_t kb, const uint8_t *g, const uint8_t *panels, bool first, float *acc, float *y,
                               int64_t y_stride, __mmask16 rmask);

#define LEGACY_TILE(nt)                                                                                        \
    static void q8_0_tile_##nt(int64_t kb, const uint8_t *g, const uint8_t *panels, bool first, float *acc,   \
                               float *y, int64_t y_stride, __mmask16 rmask)                                    \
    {                                                                                                          \
        legacy_tile(kb, g, panels, nt, false, first, acc, y, y_stride, rmask);                                 \
    }                                                                                                          \
    static void q4_0_tile_##nt(int64_t kb, const uint8_t *g, const uint8_t *panels, bool first, float *acc,   \
                               float *y, int64_t y_stride, __mmask16 rmask)                                    \
    {                                                                                                          \
        legacy_tile(kb, g, panels, nt, true, first, acc, y, y_stride, rmask);                                  \
    }
TILE_COUNTS(LEGACY_TILE)
#define Q8_0_TILE_REF(nt) q8_0_tile_##nt,
#define Q4_0_TILE_REF(nt) q4_0_tile_##nt,
static const legacy_tile_fn q8_0_tiles[TOKENS] = {TILE_COUNTS(Q8_0_TILE_REF)};
static const legacy_tile_fn q4_0_tiles[TOKENS] = {TILE_COUNTS(Q4_0_TILE_REF)};

/*
 * Token chunks of up to 4 tiles (64 tokens) outer; per chunk, k chunks as long
 * as the chunk's panels fit Q8_0_SCRATCH_BYTES (all of n = 7168 for one token,
 * 64 blocks for one full tile), then groups and tiles: each group's k chunk
 * (at most 34 KiB of Q8_0, 18 KiB of Q4_0) stays in L1/L2 while every tile of
 * the chunk reads it, and up to 64 tokens the weights stream from memory once
 * per call.  Between k chunks the running sums rest in y.
 */
static inline __attribute__((always_inline)) void legacy_gemm(int64_t n, const void *w, int64_t n_rows, const void *a,
                                                              size_t act_bytes, int64_t n_tok, float *y,
                                                              int64_t y_stride, const bool q4)
{
    const int64_t nb = n / KT_QK;
    const size_t gb = q4 ? q4_0_group_bytes(n) : q8_0_group_bytes(n);
    const size_t pair_bytes = q4 ? Q4_0_PAIR_BYTES : Q8_0_PAIR_BYTES;
    const legacy_tile_fn *tiles = q4 ? q4_0_tiles : q8_0_tiles;
    uint8_t panels[Q8_0_SCRATCH_BYTES] __attribute__((aligned(64)));
    float acc[TOKENS * ROWS] __attribute__((aligned(64)));
    for (int64_t tc = 0; tc < n_tok; tc += Q8_0_CHUNK_TILES * TOKENS) {
        const int64_t ntc = n_tok - tc < Q8_0_CHUNK_TILES * TOKENS ? n_tok - tc : Q8_0_CHUNK_TILES * TOKENS;
        const uint8_t *ac = (const uint8_t *)a + (size_t)tc * act_bytes;
        size_t block_bytes = 0; /* panel bytes of one block, all tiles of the chunk */
        for (int64_t t0 = 0; t0 < ntc; t0 += TOKENS)
            block_bytes += (size_t)40 * tile_slots(ntc - t0 < TOKENS ? ntc - t0 : TOKENS);
        int64_t kb_max = (int64_t)(Q8_0_SCRATCH_BYTES / block_bytes) / 2 * 2; /* even: chunks start at a pair */
        kb_max = kb_max > nb ? nb : kb_max;
        for (int64_t b0 = 0; b0 < nb; b0 += kb_max) {
            const int64_t kb = nb - b0 < kb_max ? nb - b0 : kb_max;
            uint8_t *tile_panels[Q8_0_CHUNK_TILES];
            uint8_t *next = panels;
            for (int64_t t0 = 0; t0 < ntc; t0 += TOKENS) {
                const int64_t nt = ntc - t0 < TOKENS ? ntc - t0 : TOKENS;
                tile_panels[t0 / TOKENS] = next;
                q8_0_prepare(ac + (size_t)t0 * act_bytes, act_bytes, nt, b0, kb, next,
                             q4 ? Q4_0_BIAS_SHIFT : Q8_0_BIAS_SHIFT);
                next += (size_t)kb * 40 * tile_slots(nt);
            }
            for (int64_t r0 = 0; r0 < n_rows; r0 += ROWS) {
                const uint8_t *g = (const uint8_t *)w + (size_t)(r0 / ROWS) * gb + (size_t)(b0 / 2) * pair_bytes;
                const __mmask16 rmask = row_mask(n_rows - r0);
                for (int64_t t0 = 0; t0 < ntc; t0 += TOKENS) {
                    const int64_t nt = ntc - t0 < TOKENS ? ntc - t0 : TOKENS;
                    tiles[nt - 1](kb, g, tile_panels[t0 / TOKENS], b0 == 0, acc, y + (tc + t0) * y_stride + r0,
                                  y_stride, rmask);
                }
            }
        }
    }
}

static void q8_0_gemm(int64_t n, const void *w, int64_t n_rows, const void *a, size_t act_bytes, int64_t n_tok,
                      float *y, int64_t y_stride)
{
    legacy_gemm(n, w, n_rows, a, act_bytes, n_tok, y, y_stride, false);
}

static void q4_0_gemm(int64_t n, const void *w, int64_t n_rows, const void *a, size_t act_bytes, int64_t n_tok,
                      float *y, int64_t y_stride)
{
    legacy_gemm(n, w, n_rows, a, act_bytes, n_tok, y, y_stride, true);
}

const struct kt_packed_format kt_packed_q8_0_avx512 = {
    .name = "q8_0.r16.avx512",
    .rows = ROWS,
    .exact = true,
    .group_bytes = q8_0_group_bytes,
    .pack = q8_0_pack,
    .gemm = q8_0_gemm,
};

const struct kt_packed_format kt_packed_q4_0_avx512 = {
    .name = "q4_0.r16.avx512",
    .rows = ROWS,
    .exact = true,
    .group_bytes = q4_0_group_bytes,
    .pack = q4_0_pack,
    .gemm = q4_0_gemm,
};
