/*
 * packed_avx2.c - Q4_K, Q8_0 and Q4_0 expert weights repacked 8 rows per
 * group for AVX2 without VNNI, and the products over them
 * (kernels/cpu/packed.h): the prefill and decode kernels of the routed
 * experts on CPUs with AVX2 only.
 *
 * One ymm int32 lane is one weight row: a 32-byte vector holds 4 consecutive
 * weights (Q4_K, Q4_0) or 2 widened ones (Q8_0) of each of 8 rows, multiplied by a
 * broadcast activation group with vpmaddubsw (u8 x s8 -> pairs summed in
 * int16, saturating) or vpmaddwd (s16 x s16 -> pairs summed in int32), and a
 * weight vector loaded (and unpacked) once serves a tile of up to 8 tokens.
 * Every output equals the reference vec_dot (kernels/cpu/ref/vec_dot_ref.c)
 * bit for bit: every integer sum is exact (the bounds are stated where the
 * sums are formed; no int16 sum can reach the saturation of vpmaddubsw or the
 * wrap of vpaddw), and each row lane forms its block's float term with the
 * reference's expression and adds it in block order.  This file must never
 * merge two blocks' integer sums before their float scale, never reorder or
 * fuse (FMA) the float steps (-ffp-contract=off), never read a weight or an
 * activation row past its n elements, and never write y outside the
 * n_rows x n_tok outputs.  Packed buffers must be 32-byte aligned (the
 * expert store's 64-byte alignment is more than enough).
 */
#if !defined(__AVX2__) || !defined(__FMA__) || !defined(__F16C__)
#error "packed_avx2.c needs -mavx2 -mfma -mf16c (kernels/CMakeLists.txt sets them for cpu/avx2/*.c)"
#endif

#include "cpu/avx2/packed_avx2.h"
#include "cpu/avx2/simd_avx2.h"

#include <stdbool.h>
#include <string.h>

#define ROWS 8   /* rows per group: one per int32 lane of a ymm */
#define TOKENS 8 /* token tile: tokens sharing each weight vector */

/* All-ones in the lanes of a group that hold real rows (the last group may be short). */
static inline __m256i row_mask(int64_t rows_left)
{
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(rows_left >= ROWS ? ROWS : (int)rows_left), lane);
}

/* Prefetches the weight line `ahead` bytes past p (an integer address: it may
 * lie past the end of the buffer, and a prefetch never faults).  Always
 * inlined: GCC 12 deems a function holding only a prefetch const and drops
 * the calls it did not inline. */
static inline __attribute__((always_inline)) void prefetch_weights(const void *p, size_t ahead)
{
    _mm_prefetch((const char *)((uintptr_t)p + ahead), _MM_HINT_T0);
}

static inline __m256i bcast_u32(const void *p)
{
    return _mm256_set1_epi32((int)load_u32(p));
}

/* Dword lane r (0..7) = words (x_r, x_r) of the 8 bytes x at p (nothing past
 * them is read). */
static inline __m256i byte_pairs8(const uint8_t *p)
{
    const __m256i ctrl = _mm256_setr_epi32((int)0x80008000, (int)0x80018001, (int)0x80028002, (int)0x80038003,
                                           (int)0x80048004, (int)0x80058005, (int)0x80068006, (int)0x80078007);
    return _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(_mm_loadl_epi64((const __m128i *)p)), ctrl);
}

#define TILE_COUNTS(X) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8)

/*
 * The innermost products are small asm blocks: GCC 12 spills the int16 sums
 * of a token tile to the stack between vpmaddubsw and vpaddw, and copies
 * loop-carried accumulators around, which cost up to half the speed.  Each
 * block covers K tokens; everything around them (unpacking, scales, the
 * float steps in the reference's order) stays C.  M(c, t) for the K tokens
 * of a block, t = 0 .. K-1; TOKt addresses token t's row at q + t * s (a
 * broadcast is a pure load, so an index costs nothing here).
 */
#define TOK0 "(%[q])"
#define TOK1 "(%[q],%[s],1)"
#define TOKENS1(M, c) M(c, 0)
#define TOKENS2(M, c) M(c, 0) M(c, 1)
#define TOKENS4(M, c) M(c, 0) M(c, 1) M(c, 2) M(c, 3)
#define TOKENS8(M, c) TOKENS4(M, c) M(c, 4) M(c, 5) M(c, 6) M(c, 7)

/* ---- Q4_K x Q8_K ----------------------------------------------------------------- */

/*
 * A group is n/256 super-block slices of Q4K_SB_BYTES (then zero bytes up to
 * a multiple of 64), slice i for elements 256i .. 256i+255 of the 8 rows
 * (r = row within the group, q the 4-bit quants in element order):
 *
 *   offset  bytes  contents
 *   0       1024   32 vectors V[j][p], j = 0..7 (sub-block: elements 32j ..
 *                  32j+31), p = 0..3; bytes 4r .. 4r+3 of V[j][p]:
 *                    low nibble of byte e  = q[r][32j + 8p + e]
 *                    high nibble of byte e = q[r][32j + 8p + 4 + e]
 *   1024    64     sc[j][r]: 6-bit scale of sub-block j, u8
 *   1088    64     m[j][r]:  6-bit min of sub-block j, u8
 *   1152    16     d[r]:     fp16 super-block scale, as in the GGUF block
 *   1168    16     dmin[r]:  fp16 super-block min scale
 *
 * 1184 = 37 x 32: every vector stays 32-byte aligned.  Rows past n_rows in
 * the last group are zero bytes throughout.
 *
 * vpmaddubsw of (V & 0x0f) or (V >> 4 & 0x0f) with 4 broadcast activation
 * bytes gives per row two int16 pairs, each |.| <= 2 * 15 * 128; the 8 of a
 * sub-block summed with vpaddw stay within 16 * 15 * 128 = 30720 < 2^15, and
 * vpmaddwd against (sc_j, sc_j) adds sc_j times both words into int32
 * exactly.  The mins term sum_j m_j * (bsums[2j] + bsums[2j+1]) is vpmaddwd
 * of (m_j, m_j) against the broadcast bsums pair, exact for any int16 bsums.
 */
#define Q4K_SB_BYTES 1184
#define Q4K_SC 1024
#define Q4K_M 1088
#define Q4K_D 1152
#define Q4K_DMIN 1168
#define Q8K_QS 4      /* offsetof(struct kt_block_q8_K, qs) */
#define Q8K_BSUMS 260 /* offsetof(struct kt_block_q8_K, bsums) */

static_assert(Q4K_SB_BYTES % 32 == 0, "q4_K slices stay 32-byte aligned");
static_assert(sizeof(struct kt_block_q8_K) == 292 && Q8K_BSUMS == 4 + KT_QK_K, "q8_K field offsets");

static size_t q4_K_group_bytes(int64_t n)
{
    return ((size_t)(n / KT_QK_K) * Q4K_SB_BYTES + 63) & ~(size_t)63;
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
    for (int j = 0; j < 8; j++) {
        kt_k_scale_min(b->scales, j, &s[Q4K_SC + 8 * j + r], &s[Q4K_M + 8 * j + r]);
        for (int p = 0; p < 4; p++) {
            const int k = 32 * j + 8 * p;
            const uint32_t v = q4_K_nibbles4(b->qs, k) | q4_K_nibbles4(b->qs, k + 4) << 4;
            memcpy(s + 32 * (4 * j + p) + 4 * r, &v, sizeof v);
        }
    }
    memcpy(s + Q4K_D + 2 * r, &b->d, sizeof b->d);
    memcpy(s + Q4K_DMIN + 2 * r, &b->dmin, sizeof b->dmin);
}

static void q4_K_pack(int64_t n, const void *w, size_t row_bytes, int64_t n_rows, void *dst)
{
    const int64_t nb = n / KT_QK_K;
    const size_t gb = q4_K_group_bytes(n);
    for (int64_t r0 = 0; r0 < n_rows; r0 += ROWS) {
        uint8_t *g = (uint8_t *)dst + (size_t)(r0 / ROWS) * gb;
        if (n_rows - r0 < ROWS)
            memset(g, 0, gb);
        else
            memset(g + (size_t)nb * Q4K_SB_BYTES, 0, gb - (size_t)nb * Q4K_SB_BYTES);
        for (int r = 0; r < ROWS && r0 + r < n_rows; r++) {
            const struct kt_block_q4_K *x = (const void *)((const uint8_t *)w + (size_t)(r0 + r) * row_bytes);
            for (int64_t i = 0; i < nb; i++)
                q4_K_pack_block(&x[i], r, g + (size_t)i * Q4K_SB_BYTES);
        }
    }
}

/*
 * One sub-block for K tokens: sq[t] += sc * (sum of its 32 products), where
 * w[c] holds elements 4c .. 4c+3 (unsigned nibbles), token t's 32 activation
 * bytes start at q + t * s and its int32 sums at sq + 8t (written in memory,
 * so the asm is volatile).  x_t collects the 8 vpmaddubsw results in int16
 * (bounded above), then vpmaddwd against (sc, sc) folds both words into int32.
 */
#define Q4K_FIRST(c, t) "vpbroadcastd 4*" #c TOK##t ", %[b" #t "]\n\tvpmaddubsw %[b" #t "], %[w" #c "], %[x" #t "]\n\t"
#define Q4K_NEXT(c, t)                                                                                         \
    "vpbroadcastd 4*" #c TOK##t ", %[b" #t "]\n\tvpmaddubsw %[b" #t "], %[w" #c "], %[b" #t "]\n\t"             \
    "vpaddw %[b" #t "], %[x" #t "], %[x" #t "]\n\t"
#define Q4K_FOLD(c, t)                                                                                         \
    "vpmaddwd %[sc], %[x" #t "], %[x" #t "]\n\tvpaddd 32*" #t "(%[sq]), %[x" #t "], %[x" #t "]\n\t"            \
    "vmovdqa %[x" #t "], 32*" #t "(%[sq])\n\t"
#define Q4K_TMP1 [x0] "=&x"(x0), [b0] "=&x"(b0)
#define Q4K_TMP2 Q4K_TMP1, [x1] "=&x"(x1), [b1] "=&x"(b1)
#define Q4K_SUB(K)                                                                                             \
    static inline __attribute__((always_inline)) void q4_K_sub##K(int32_t *sq, const __m256i w[8], __m256i sc, \
                                                                  const uint8_t *q, size_t s)                  \
    {                                                                                                          \
        __m256i x0, b0, x1, b1; /* scratch */                                                                  \
        (void)x1, (void)b1, (void)s;                                                                           \
        __asm__ volatile(TOKENS##K(Q4K_FIRST, 0) TOKENS##K(Q4K_NEXT, 1) TOKENS##K(Q4K_NEXT, 2)                  \
                             TOKENS##K(Q4K_NEXT, 3) TOKENS##K(Q4K_NEXT, 4) TOKENS##K(Q4K_NEXT, 5)              \
                                 TOKENS##K(Q4K_NEXT, 6) TOKENS##K(Q4K_NEXT, 7) TOKENS##K(Q4K_FOLD, 0)          \
                : Q4K_TMP##K                                                                                   \
                : [w0] "x"(w[0]), [w1] "x"(w[1]), [w2] "x"(w[2]), [w3] "x"(w[3]), [w4] "x"(w[4]),              \
                  [w5] "x"(w[5]), [w6] "x"(w[6]), [w7] "x"(w[7]), [sc] "x"(sc), [q] "r"(q), [s] "r"(s),          \
                  [sq] "r"(sq)                                                                                 \
                : "memory");                                                                                   \
    }
Q4K_SUB(1)
Q4K_SUB(2)

/*
 * y[t * y_stride + r] = dot(row r, token t) for the rows of one group (rmask)
 * and nt tokens from a (Q8_K rows act_bytes apart).  Lane r of acc[t] is the
 * reference's `sum` for (r, t), taking per super-block
 *   (d * da) * (float)sum_q - (dmin * da) * (float)sum_m;
 * acc, mins (the second product, formed first) and sq (the int32 sums sum_q)
 * are the caller's 8 x 8 lanes each: in memory, so the int16 sub-block sums of
 * all 8 tokens own the registers.
 */
static inline __attribute__((always_inline)) void q4_K_tile(int64_t nb, const uint8_t *g, const uint8_t *a,
                                                            size_t act_bytes, const int nt, float *acc, float *mins,
                                                            int32_t *sq, float *y, int64_t y_stride, __m256i rmask)
{
    const __m256i low4 = _mm256_set1_epi8(0x0f);
    for (int t = 0; t < nt; t++)
        _mm256_store_ps(acc + 8 * t, _mm256_setzero_ps());
    for (int64_t i = 0; i < nb; i++) {
        const uint8_t *s = g + (size_t)i * Q4K_SB_BYTES;
        const size_t act_off = (size_t)i * sizeof(struct kt_block_q8_K);
        const __m256 dmin = _mm256_cvtph_ps(_mm_load_si128((const __m128i *)(s + Q4K_DMIN)));
        __m256i mp[8];
        for (int j = 0; j < 8; j++)
            mp[j] = byte_pairs8(s + Q4K_M + 8 * j);
        for (int t = 0; t < nt; t++) {
            const uint8_t *yb = a + (size_t)t * act_bytes + act_off;
            __m256i sm = _mm256_madd_epi16(mp[0], bcast_u32(yb + Q8K_BSUMS));
            for (int j = 1; j < 8; j++)
                sm = _mm256_add_epi32(sm, _mm256_madd_epi16(mp[j], bcast_u32(yb + Q8K_BSUMS + 4 * j)));
            float da;
            memcpy(&da, yb, sizeof da);
            const __m256 scale = _mm256_mul_ps(dmin, _mm256_set1_ps(da));
            _mm256_store_ps(mins + 8 * t, _mm256_mul_ps(scale, _mm256_cvtepi32_ps(sm)));
            _mm256_store_si256((__m256i *)(sq + 8 * t), _mm256_setzero_si256());
        }
        for (int j = 0; j < 8; j++) {
            const uint8_t *v = s + 128 * j;
            prefetch_weights(v, KT_AVX2_PREFETCH_BYTES);
            prefetch_weights(v + 64, KT_AVX2_PREFETCH_BYTES);
            __m256i w[8];
            for (int p = 0; p < 4; p++) {
                const __m256i bits = _mm256_load_si256((const __m256i *)(v + 32 * p));
                w[2 * p] = _mm256_and_si256(bits, low4);
                w[2 * p + 1] = _mm256_and_si256(_mm256_srli_epi16(bits, 4), low4);
            }
            const __m256i sc = byte_pairs8(s + Q4K_SC + 8 * j);
            const uint8_t *q = a + act_off + Q8K_QS + 32 * j; /* token 0's sub-block */
            int t = 0;
            for (; t + 2 <= nt; t += 2)
                q4_K_sub2(sq + 8 * t, w, sc, q + (size_t)t * act_bytes, act_bytes);
            if (t < nt)
                q4_K_sub1(sq + 8 * t, w, sc, q + (size_t)t * act_bytes, act_bytes);
        }
        const __m256 d = _mm256_cvtph_ps(_mm_load_si128((const __m128i *)(s + Q4K_D)));
        for (int t = 0; t < nt; t++) {
            float da;
            memcpy(&da, a + (size_t)t * act_bytes + act_off, sizeof da);
            const __m256 sumq = _mm256_cvtepi32_ps(_mm256_load_si256((const __m256i *)(sq + 8 * t)));
            const __m256 term = _mm256_sub_ps(_mm256_mul_ps(_mm256_mul_ps(d, _mm256_set1_ps(da)), sumq),
                                              _mm256_load_ps(mins + 8 * t));
            _mm256_store_ps(acc + 8 * t, _mm256_add_ps(_mm256_load_ps(acc + 8 * t), term));
        }
    }
    for (int t = 0; t < nt; t++)
        _mm256_maskstore_ps(y + t * y_stride, rmask, _mm256_load_ps(acc + 8 * t));
}

typedef void (*q4_K_tile_fn)(int64_t nb, const uint8_t *g, const uint8_t *a, size_t act_bytes, float *scratch,
                             float *y, int64_t y_stride, __m256i rmask);

#define Q4K_TILE(nt)                                                                                          \
    static void q4_K_tile_##nt(int64_t nb, const uint8_t *g, const uint8_t *a, size_t act_bytes, float *scratch, \
                               float *y, int64_t y_stride, __m256i rmask)                                      \
    {                                                                                                         \
        q4_K_tile(nb, g, a, act_bytes, nt, scratch, scratch + 64, (int32_t *)(scratch + 128), y, y_stride,    \
                  rmask);                                                                                     \
    }
TILE_COUNTS(Q4K_TILE)
#define Q4K_TILE_REF(nt) q4_K_tile_##nt,
static const q4_K_tile_fn q4_K_tiles[TOKENS] = {TILE_COUNTS(Q4K_TILE_REF)};

/* Groups outer, token tiles inner: a group's weights (33 KiB at n = 7168)
 * stay in L1/L2 while every token tile reads them. */
static void q4_K_gemm(int64_t n, const void *w, int64_t n_rows, const void *a, size_t act_bytes, int64_t n_tok,
                      float *y, int64_t y_stride)
{
    const int64_t nb = n / KT_QK_K;
    const size_t gb = q4_K_group_bytes(n);
    float scratch[3 * TOKENS * ROWS] __attribute__((aligned(32)));
    for (int64_t r0 = 0; r0 < n_rows; r0 += ROWS) {
        const uint8_t *g = (const uint8_t *)w + (size_t)(r0 / ROWS) * gb;
        const __m256i rmask = row_mask(n_rows - r0);
        for (int64_t t0 = 0; t0 < n_tok; t0 += TOKENS) {
            const int64_t nt = n_tok - t0 < TOKENS ? n_tok - t0 : TOKENS;
            q4_K_tiles[nt - 1](nb, g, (const uint8_t *)a + (size_t)t0 * act_bytes, act_bytes, scratch,
                               y + t0 * y_stride + r0, y_stride, rmask);
        }
    }
}

const struct kt_packed_format kt_packed_q4_K_avx2 = {
    .name = "q4_K.r8.avx2",
    .rows = ROWS,
    .exact = true,
    .group_bytes = q4_K_group_bytes,
    .pack = q4_K_pack,
    .gemm = q4_K_gemm,
};

/* ---- Q8_0 x Q8_0 ----------------------------------------------------------------- */

/*
 * A group is n/32 block slices of Q8_0_BLOCK_BYTES (then zero bytes up to a
 * multiple of 64), slice b for elements 32b .. 32b+31 of the 8 rows:
 *
 *   offset  bytes  contents
 *   0       256    16 pair vectors V[p], p = 0..15; bytes 2r, 2r+1 of V[p] =
 *                  w[r][2p], w[r][2p+1] (the int8 quants as they are)
 *   256     16     d[r]: fp16 block scale, as in the GGUF block
 *
 * vpmovsxbw widens a pair vector to the words (w[r][2p], w[r][2p+1]) of int32
 * lane r, and vpmaddwd against a broadcast pair of int16 activations adds
 * both products in int32: signed times signed with no saturation anywhere
 * (vpmaddubsw would need an unsigned side, and (w + 128) * a pairs overflow
 * int16).  |sumi| <= 32 * 128 * 128.  Rows past n_rows in the last group are
 * zero bytes throughout.
 */
#define Q8_0_BLOCK_BYTES 272
#define Q8_0_D 256

static size_t q8_0_group_bytes(int64_t n)
{
    return ((size_t)(n / KT_QK) * Q8_0_BLOCK_BYTES + 63) & ~(size_t)63;
}

static void q8_0_pack(int64_t n, const void *w, size_t row_bytes, int64_t n_rows, void *dst)
{
    const int64_t nb = n / KT_QK;
    const size_t gb = q8_0_group_bytes(n);
    for (int64_t r0 = 0; r0 < n_rows; r0 += ROWS) {
        uint8_t *g = (uint8_t *)dst + (size_t)(r0 / ROWS) * gb;
        if (n_rows - r0 < ROWS)
            memset(g, 0, gb);
        else
            memset(g + (size_t)nb * Q8_0_BLOCK_BYTES, 0, gb - (size_t)nb * Q8_0_BLOCK_BYTES);
        for (int r = 0; r < ROWS && r0 + r < n_rows; r++) {
            const struct kt_block_q8_0 *x = (const void *)((const uint8_t *)w + (size_t)(r0 + r) * row_bytes);
            for (int64_t b = 0; b < nb; b++) {
                uint8_t *s = g + (size_t)b * Q8_0_BLOCK_BYTES;
                for (int p = 0; p < 16; p++)
                    memcpy(s + 16 * p + 2 * r, x[b].qs + 2 * p, 2);
                memcpy(s + Q8_0_D + 2 * r, &x[b].d, sizeof x[b].d);
            }
        }
    }
}

/*
 * Activations, rearranged once per call into panels: for a token tile of nt
 * tokens (ta = nt rounded up to a power of two) and one block, 68 * ta bytes
 *
 *   offset   bytes   contents
 *   0        64 ta   a[p][t][e] = quant 2p + e of token t as int16, p = 0..15
 *   64 ta    4 ta    d[t] = token t's scale (float)
 *
 * so each vpbroadcastd of a token's pair is one aligned 4-byte load at a
 * constant offset.  Panels of consecutive blocks follow each other; slots
 * t >= nt are never read.
 */
#define Q8_0_SCRATCH_BYTES (36 * 1024) /* panels of one (token, k) chunk, on the stack */
#define Q8_0_CHUNK_TILES 4             /* token tiles sharing a k chunk (32 tokens) */

static inline int tile_slots(int64_t nt)
{
    return nt <= 1 ? 1 : nt <= 2 ? 2 : nt <= 4 ? 4 : 8;
}

/* The panels of nt tokens from a (rows act_bytes apart) for kb blocks from b0. */
static void q8_0_prepare(const uint8_t *a, size_t act_bytes, int64_t nt, int64_t b0, int64_t kb, uint8_t *panels)
{
    const int ta = tile_slots(nt);
    for (int64_t b = 0; b < kb; b++) {
        uint8_t *p = panels + (size_t)b * 68 * ta;
        for (int64_t t = 0; t < nt; t++) {
            const struct kt_block_q8_0 *blk =
                (const void *)(a + (size_t)t * act_bytes + (size_t)(b0 + b) * sizeof(struct kt_block_q8_0));
            int16_t wide[KT_QK];
            _mm256_storeu_si256((__m256i *)wide, _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)blk->qs)));
            _mm256_storeu_si256((__m256i *)(wide + 16),
                                _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(blk->qs + 16))));
            for (int q = 0; q < 16; q++)
                memcpy(p + 4 * (ta * q + t), wide + 2 * q, 4);
            const float d = fp16_to_f32(blk->d);
            memcpy(p + 64 * ta + 4 * t, &d, sizeof d);
        }
    }
}

/*
 * One block for the K tokens of a panel from slot t0 (p = panel + 4 t0):
 * sumi[t] = the 32-element dot of the block's weights (w, 16 pair vectors)
 * with token t's quants, each pair vector widened once for all K tokens.
 */
#define Q8_0_WIDEN(q) "vpmovsxbw 16*" #q "(%[w]), %[wq]\n\t"
#define Q8_0_FIRST(q, t) "vpbroadcastd 4*" #t "(%[p]), %[b]\n\tvpmaddwd %[b], %[wq], %[s" #t "]\n\t"
#define Q8_0_NEXT(q, t)                                                                                        \
    "vpbroadcastd %c[ta4]*" #q "+4*" #t "(%[p]), %[b]\n\tvpmaddwd %[b], %[wq], %[b]\n\t"                       \
    "vpaddd %[b], %[s" #t "], %[s" #t "]\n\t"
#define Q8_0_STEP(q, K) Q8_0_WIDEN(q) TOKENS##K(Q8_0_NEXT, q)
#define Q8_0_SUM1 [s0] "=&x"(sumi[0])
#define Q8_0_SUM2 Q8_0_SUM1, [s1] "=&x"(sumi[1])
#define Q8_0_SUM4 Q8_0_SUM2, [s2] "=&x"(sumi[2]), [s3] "=&x"(sumi[3])
#define Q8_0_SUM8 Q8_0_SUM4, [s4] "=&x"(sumi[4]), [s5] "=&x"(sumi[5]), [s6] "=&x"(sumi[6]), [s7] "=&x"(sumi[7])
#define Q8_0_BLOCK(K)                                                                                          \
    static inline __attribute__((always_inline)) void q8_0_block##K(__m256i *sumi, const uint8_t *w,          \
                                                                    const uint8_t *p, const int ta)            \
    {                                                                                                          \
        __m256i wq, b; /* scratch */                                                                           \
        __asm__(Q8_0_WIDEN(0) TOKENS##K(Q8_0_FIRST, 0) Q8_0_STEP(1, K) Q8_0_STEP(2, K) Q8_0_STEP(3, K)          \
                    Q8_0_STEP(4, K) Q8_0_STEP(5, K) Q8_0_STEP(6, K) Q8_0_STEP(7, K) Q8_0_STEP(8, K)             \
                        Q8_0_STEP(9, K) Q8_0_STEP(10, K) Q8_0_STEP(11, K) Q8_0_STEP(12, K) Q8_0_STEP(13, K)     \
                            Q8_0_STEP(14, K) Q8_0_STEP(15, K)                                                  \
                : Q8_0_SUM##K, [wq] "=&x"(wq), [b] "=&x"(b)                                                    \
                : [w] "r"(w), [p] "r"(p), [ta4] "i"(4 * ta)                                                    \
                : "memory");                                                                                   \
    }
Q8_0_BLOCK(1)
Q8_0_BLOCK(2)
Q8_0_BLOCK(4)
Q8_0_BLOCK(8)

/*
 * kb blocks of one group (g at the chunk's first block) against the nt tokens
 * of a tile (their kb panels): lane r of acc[t] (the caller's 8 x 8 floats)
 * is the reference's `sum` for (r, t), taking per block
 * (dw * da) * (float)sumi.  The first k chunk starts each sum at 0, later
 * ones continue from y.
 */
static inline __attribute__((always_inline)) void q8_0_tile(int64_t kb, const uint8_t *g, const uint8_t *panels,
                                                            const int nt, bool first, float *acc, float *y,
                                                            int64_t y_stride, __m256i rmask)
{
    const int ta = nt <= 1 ? 1 : nt <= 2 ? 2 : nt <= 4 ? 4 : 8;
    for (int t = 0; t < nt; t++)
        _mm256_store_ps(acc + 8 * t, first ? _mm256_setzero_ps() : _mm256_maskload_ps(y + t * y_stride, rmask));
    for (int64_t b = 0; b < kb; b++) {
        const uint8_t *s = g + (size_t)b * Q8_0_BLOCK_BYTES;
        const uint8_t *p = panels + (size_t)b * 68 * ta;
        for (int c = 0; c < 4; c++)
            prefetch_weights(s + 64 * c, KT_AVX2_PREFETCH_BYTES);
        __m256i sumi[TOKENS];
        int t = 0;
        if (nt - t >= 8)
            q8_0_block8(sumi + t, s, p + 4 * t, ta), t += 8;
        if (nt - t >= 4)
            q8_0_block4(sumi + t, s, p + 4 * t, ta), t += 4;
        if (nt - t >= 2)
            q8_0_block2(sumi + t, s, p + 4 * t, ta), t += 2;
        if (nt - t >= 1)
            q8_0_block1(sumi + t, s, p + 4 * t, ta);
        const __m256 dw = _mm256_cvtph_ps(_mm_load_si128((const __m128i *)(s + Q8_0_D)));
        for (t = 0; t < nt; t++) {
            float da;
            memcpy(&da, p + 64 * ta + 4 * t, sizeof da);
            const __m256 scale = _mm256_mul_ps(dw, _mm256_set1_ps(da));
            _mm256_store_ps(acc + 8 * t, _mm256_add_ps(_mm256_load_ps(acc + 8 * t),
                                                       _mm256_mul_ps(scale, _mm256_cvtepi32_ps(sumi[t]))));
        }
    }
    for (int t = 0; t < nt; t++)
        _mm256_maskstore_ps(y + t * y_stride, rmask, _mm256_load_ps(acc + 8 * t));
}

typedef void (*q8_0_tile_fn)(int64_t kb, const uint8_t *g, const uint8_t *panels, bool first, float *acc, float *y,
                             int64_t y_stride, __m256i rmask);

#define Q8_0_TILE(nt)                                                                                          \
    static void q8_0_tile_##nt(int64_t kb, const uint8_t *g, const uint8_t *panels, bool first, float *acc,   \
                               float *y, int64_t y_stride, __m256i rmask)                                      \
    {                                                                                                          \
        q8_0_tile(kb, g, panels, nt, first, acc, y, y_stride, rmask);                                          \
    }
TILE_COUNTS(Q8_0_TILE)
#define Q8_0_TILE_REF(nt) q8_0_tile_##nt,
static const q8_0_tile_fn q8_0_tiles[TOKENS] = {TILE_COUNTS(Q8_0_TILE_REF)};

/*
 * Token chunks of up to 4 tiles (32 tokens) outer; per chunk, k chunks as long
 * as the chunk's panels fit Q8_0_SCRATCH_BYTES (all of n = 7168 for one token,
 * 67 blocks for one full tile), then groups and tiles: each group's k chunk
 * stays in L1/L2 while every tile of the chunk reads it.  Between k chunks
 * the running sums rest in y.
 */
static void q8_0_gemm(int64_t n, const void *w, int64_t n_rows, const void *a, size_t act_bytes, int64_t n_tok,
                      float *y, int64_t y_stride)
{
    const int64_t nb = n / KT_QK;
    const size_t gb = q8_0_group_bytes(n);
    uint8_t panels[Q8_0_SCRATCH_BYTES] __attribute__((aligned(32)));
    float acc[TOKENS * ROWS] __attribute__((aligned(32)));
    for (int64_t tc = 0; tc < n_tok; tc += Q8_0_CHUNK_TILES * TOKENS) {
        const int64_t ntc = n_tok - tc < Q8_0_CHUNK_TILES * TOKENS ? n_tok - tc : Q8_0_CHUNK_TILES * TOKENS;
        const uint8_t *ac = (const uint8_t *)a + (size_t)tc * act_bytes;
        size_t block_bytes = 0; /* panel bytes of one block, all tiles of the chunk */
        for (int64_t t0 = 0; t0 < ntc; t0 += TOKENS)
            block_bytes += (size_t)68 * tile_slots(ntc - t0 < TOKENS ? ntc - t0 : TOKENS);
        int64_t kb_max = (int64_t)(Q8_0_SCRATCH_BYTES / block_bytes);
        kb_max = kb_max > nb ? nb : kb_max;
        for (int64_t b0 = 0; b0 < nb; b0 += kb_max) {
            const int64_t kb = nb - b0 < kb_max ? nb - b0 : kb_max;
            uint8_t *tile_panels[Q8_0_CHUNK_TILES];
            uint8_t *next = panels;
            for (int64_t t0 = 0; t0 < ntc; t0 += TOKENS) {
                const int64_t nt = ntc - t0 < TOKENS ? ntc - t0 : TOKENS;
                tile_panels[t0 / TOKENS] = next;
                q8_0_prepare(ac + (size_t)t0 * act_bytes, act_bytes, nt, b0, kb, next);
                next += (size_t)kb * 68 * tile_slots(nt);
            }
            for (int64_t r0 = 0; r0 < n_rows; r0 += ROWS) {
                const uint8_t *g = (const uint8_t *)w + (size_t)(r0 / ROWS) * gb + (size_t)b0 * Q8_0_BLOCK_BYTES;
                const __m256i rmask = row_mask(n_rows - r0);
                for (int64_t t0 = 0; t0 < ntc; t0 += TOKENS) {
                    const int64_t nt = ntc - t0 < TOKENS ? ntc - t0 : TOKENS;
                    q8_0_tiles[nt - 1](kb, g, tile_panels[t0 / TOKENS], b0 == 0, acc, y + (tc + t0) * y_stride + r0,
                                       y_stride, rmask);
                }
            }
        }
    }
}

const struct kt_packed_format kt_packed_q8_0_avx2 = {
    .name = "q8_0.r8.avx2",
    .rows = ROWS,
    .exact = true,
    .group_bytes = q8_0_group_bytes,
    .pack = q8_0_pack,
    .gemm = q8_0_gemm,
};

/* ---- Q4_0 x Q8_0 ----------------------------------------------------------------- */

/*
 * A group is ceil(nb / 2) pair slices of Q4_0_PAIR_BYTES (then zero bytes up
 * to a multiple of 64), pair p for blocks 2p and 2p+1 of the 8 rows:
 *
 *   offset  bytes  contents
 *   0       128    block 2p:   4 vectors V[c], c = 0..3; bytes 4r .. 4r+3 of
 *                  V[c] = row r's qs[4c .. 4c+3] as in the GGUF block: the
 *                  low nibble of byte e is code q[r][4c + e], the high nibble
 *                  q[r][16 + 4c + e] (codes 0..15)
 *   128     128    block 2p+1: the same
 *   256     16     d[r] of block 2p (fp16, as in the GGUF block)
 *   272     16     d[r] of block 2p+1
 *
 * 288 = 9 x 32, exactly the GGUF rows' 18 bytes per block and row when nb is
 * even; with nb odd the last pair's second block is zero bytes and never
 * read.  Rows past n_rows in the last group are zero bytes throughout (d =
 * +0: every term is a zero, and the sum stays +0).
 *
 * V & 0x0f is the unsigned vpmaddubsw operand of activation chunk c (elements
 * 4c .. 4c+3), V >> 4 & 0x0f that of chunk c + 4.  Per row each vpmaddubsw
 * word is a pair of products, |.| <= 2 * 15 * 128; the 8 of a block summed
 * with vpaddw stay within 16 * 15 * 128 = 30720 < 2^15, so vpmaddwd against
 * ones gives sum q*a exactly, and sum (q-8)*a = sum q*a - 8 * sum a adds the
 * token's bias -8 * sum a (from its panel) in int32.
 */
#define Q4_0_PAIR_BYTES 288
#define Q4_0_D 256

static_assert(Q4_0_PAIR_BYTES % 32 == 0, "q4_0 pair slices stay 32-byte aligned");

static size_t q4_0_group_bytes(int64_t n)
{
    return ((size_t)((n / KT_QK + 1) / 2) * Q4_0_PAIR_BYTES + 63) & ~(size_t)63;
}

static void q4_0_pack(int64_t n, const void *w, size_t row_bytes, int64_t n_rows, void *dst)
{
    const int64_t nb = n / KT_QK;
    const size_t gb = q4_0_group_bytes(n);
    for (int64_t r0 = 0; r0 < n_rows; r0 += ROWS) {
        uint8_t *g = (uint8_t *)dst + (size_t)(r0 / ROWS) * gb;
        memset(g, 0, gb); /* padding rows, an odd block count's last half pair, the tail to 64 bytes */
        for (int r = 0; r < ROWS && r0 + r < n_rows; r++) {
            const struct kt_block_q4_0 *x = (const void *)((const uint8_t *)w + (size_t)(r0 + r) * row_bytes);
            for (int64_t b = 0; b < nb; b++) {
                uint8_t *s = g + (size_t)(b / 2) * Q4_0_PAIR_BYTES;
                for (int c = 0; c < 4; c++)
                    memcpy(s + 128 * (b % 2) + 32 * c + 4 * r, x[b].qs + 4 * c, 4);
                memcpy(s + Q4_0_D + 16 * (b % 2) + 2 * r, &x[b].d, sizeof x[b].d);
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
 *   32 ta    4 ta    bias[t] = -8 * sum of token t's quants (int32)
 *   36 ta    4 ta    d[t]    = token t's scale (float)
 *
 * so each broadcast is one 4-byte load at a constant offset from the panel.
 * Panels of consecutive blocks follow each other; slots t >= nt are never
 * read.
 */
#define Q4_0_SCRATCH_BYTES (36 * 1024) /* panels of one (token, k) chunk, on the stack */
#define Q4_0_CHUNK_TILES 4             /* token tiles sharing a k chunk (32 tokens) */

/* The panels of nt tokens from a (rows act_bytes apart) for kb blocks from b0. */
static void q4_0_prepare(const uint8_t *a, size_t act_bytes, int64_t nt, int64_t b0, int64_t kb, uint8_t *panels)
{
    const int ta = tile_slots(nt);
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
            const int32_t bias = -8 * ((int32_t)(_mm_cvtsi128_si64(s2) + _mm_extract_epi64(s2, 1)) - 32 * 128);
            const float d = fp16_to_f32(blk->d);
            memcpy(p + 32 * ta + 4 * t, &bias, sizeof bias);
            memcpy(p + 36 * ta + 4 * t, &d, sizeof d);
        }
    }
}

/*
 * One block for the K tokens of a panel from slot t0 (p = panel + 4 t0):
 * sumi[t] = bias[t] + sum over chunks c of vpmaddubsw(w[c], token t's chunk
 * c), the words added with vpaddw and folded to int32 by vpmaddwd against
 * ones = the block's sum (q-8)*a exactly (bounds above).
 */
#define Q4_0_FIRST(c, t)                                                                                       \
    "vpbroadcastd %c[ta4]*" #c "+4*" #t "(%[p]), %[b" #t "]\n\tvpmaddubsw %[b" #t "], %[w" #c "], %[x" #t "]\n\t"
#define Q4_0_NEXT(c, t)                                                                                        \
    "vpbroadcastd %c[ta4]*" #c "+4*" #t "(%[p]), %[b" #t "]\n\tvpmaddubsw %[b" #t "], %[w" #c "], %[b" #t "]\n\t" \
    "vpaddw %[b" #t "], %[x" #t "], %[x" #t "]\n\t"
#define Q4_0_FOLD(c, t)                                                                                        \
    "vpmaddwd %[ones], %[x" #t "], %[x" #t "]\n\tvpbroadcastd %c[bias]+4*" #t "(%[p]), %[b" #t "]\n\t"         \
    "vpaddd %[b" #t "], %[x" #t "], %[x" #t "]\n\t"
#define Q4_0_OUT1 [x0] "=&x"(sumi[0]), [b0] "=&x"(b0)
#define Q4_0_OUT2 Q4_0_OUT1, [x1] "=&x"(sumi[1]), [b1] "=&x"(b1)
#define Q4_0_BLOCK(K)                                                                                          \
    static inline __attribute__((always_inline)) void q4_0_block##K(__m256i *sumi, const __m256i w[8],        \
                                                                    __m256i ones, const uint8_t *p, const int ta) \
    {                                                                                                          \
        __m256i b0, b1; /* scratch */                                                                          \
        (void)b1;                                                                                              \
        __asm__(TOKENS##K(Q4_0_FIRST, 0) TOKENS##K(Q4_0_NEXT, 1) TOKENS##K(Q4_0_NEXT, 2)                        \
                    TOKENS##K(Q4_0_NEXT, 3) TOKENS##K(Q4_0_NEXT, 4) TOKENS##K(Q4_0_NEXT, 5)                    \
                        TOKENS##K(Q4_0_NEXT, 6) TOKENS##K(Q4_0_NEXT, 7) TOKENS##K(Q4_0_FOLD, 0)                \
                : Q4_0_OUT##K                                                                                  \
                : [w0] "x"(w[0]), [w1] "x"(w[1]), [w2] "x"(w[2]), [w3] "x"(w[3]), [w4] "x"(w[4]),              \
                  [w5] "x"(w[5]), [w6] "x"(w[6]), [w7] "x"(w[7]), [ones] "x"(ones), [p] "r"(p),                 \
                  [ta4] "i"(4 * ta), [bias] "i"(32 * ta)                                                      \
                : "memory");                                                                                   \
    }
Q4_0_BLOCK(1)
Q4_0_BLOCK(2)

/* acc[t] += (dw * da[t]) * (float)sumi: the reference's term for 8 rows. */
static inline __attribute__((always_inline)) void q4_0_add_term(float *acc, __m256 dw, const uint8_t *p, int ta,
                                                                int t, __m256i sumi)
{
    float da;
    memcpy(&da, p + 36 * ta + 4 * t, sizeof da);
    const __m256 scale = _mm256_mul_ps(dw, _mm256_set1_ps(da));
    _mm256_store_ps(acc + 8 * t,
                    _mm256_add_ps(_mm256_load_ps(acc + 8 * t), _mm256_mul_ps(scale, _mm256_cvtepi32_ps(sumi))));
}

/*
 * kb blocks of one group (g at the chunk's first pair) against the nt tokens
 * of a tile (their kb panels): lane r of acc[t] (the caller's 8 x 8 floats)
 * is the reference's `sum` for (r, t), taking per block
 * (dw * da) * (float)sumi.  The first k chunk starts each sum at 0, later
 * ones continue from y.
 */
static inline __attribute__((always_inline)) void q4_0_tile(int64_t kb, const uint8_t *g, const uint8_t *panels,
                                                            const int nt, bool first, float *acc, float *y,
                                                            int64_t y_stride, __m256i rmask)
{
    const int ta = nt <= 1 ? 1 : nt <= 2 ? 2 : nt <= 4 ? 4 : 8;
    const __m256i low4 = _mm256_set1_epi8(0x0f), ones = _mm256_set1_epi16(1);
    for (int t = 0; t < nt; t++)
        _mm256_store_ps(acc + 8 * t, first ? _mm256_setzero_ps() : _mm256_maskload_ps(y + t * y_stride, rmask));
    for (int64_t b = 0; b < kb; b++) {
        const uint8_t *s = g + (size_t)(b / 2) * Q4_0_PAIR_BYTES;
        const uint8_t *v = s + 128 * (b % 2);
        prefetch_weights(v, KT_AVX2_PREFETCH_BYTES);
        prefetch_weights(v + 64, KT_AVX2_PREFETCH_BYTES);
        if (b % 2 == 0)
            prefetch_weights(s + Q4_0_D, KT_AVX2_PREFETCH_BYTES);
        __m256i w[8];
        for (int c = 0; c < 4; c++) {
            const __m256i bits = _mm256_load_si256((const __m256i *)(v + 32 * c));
            w[c] = _mm256_and_si256(bits, low4);
            w[c + 4] = _mm256_and_si256(_mm256_srli_epi16(bits, 4), low4);
        }
        const __m256 dw = _mm256_cvtph_ps(_mm_load_si128((const __m128i *)(s + Q4_0_D + 16 * (b % 2))));
        const uint8_t *p = panels + (size_t)b * 40 * ta;
        int t = 0;
        for (; t + 2 <= nt; t += 2) {
            __m256i sumi[2];
            q4_0_block2(sumi, w, ones, p + 4 * t, ta);
            q4_0_add_term(acc, dw, p, ta, t, sumi[0]);
            q4_0_add_term(acc, dw, p, ta, t + 1, sumi[1]);
        }
        if (t < nt) {
            __m256i sumi[1];
            q4_0_block1(sumi, w, ones, p + 4 * t, ta);
            q4_0_add_term(acc, dw, p, ta, t, sumi[0]);
        }
    }
    for (int t = 0; t < nt; t++)
        _mm256_maskstore_ps(y + t * y_stride, rmask, _mm256_load_ps(acc + 8 * t));
}

#define Q4_0_TILE(nt)                                                                                          \
    static void q4_0_tile_##nt(int64_t kb, const uint8_t *g, const uint8_t *panels, bool first, float *acc,   \
                               float *y, int64_t y_stride, __m256i rmask)                                      \
    {                                                                                                          \
        q4_0_tile(kb, g, panels, nt, first, acc, y, y_stride, rmask);                                          \
    }
TILE_COUNTS(Q4_0_TILE)
#define Q4_0_TILE_REF(nt) q4_0_tile_##nt,
static const q8_0_tile_fn q4_0_tiles[TOKENS] = {TILE_COUNTS(Q4_0_TILE_REF)};

/*
 * As q8_0_gemm: token chunks of up to 4 tiles (32 tokens) outer; per chunk,
 * k chunks (an even number of blocks: chunks start at a pair) as long as the
 * chunk's panels fit Q4_0_SCRATCH_BYTES, then groups and tiles.  Between k
 * chunks the running sums rest in y.
 */
static void q4_0_gemm(int64_t n, const void *w, int64_t n_rows, const void *a, size_t act_bytes, int64_t n_tok,
                      float *y, int64_t y_stride)
{
    const int64_t nb = n / KT_QK;
    const size_t gb = q4_0_group_bytes(n);
    uint8_t panels[Q4_0_SCRATCH_BYTES] __attribute__((aligned(32)));
    float acc[TOKENS * ROWS] __attribute__((aligned(32)));
    for (int64_t tc = 0; tc < n_tok; tc += Q4_0_CHUNK_TILES * TOKENS) {
        const int64_t ntc = n_tok - tc < Q4_0_CHUNK_TILES * TOKENS ? n_tok - tc : Q4_0_CHUNK_TILES * TOKENS;
        const uint8_t *ac = (const uint8_t *)a + (size_t)tc * act_bytes;
        size_t block_bytes = 0; /* panel bytes of one block, all tiles of the chunk */
        for (int64_t t0 = 0; t0 < ntc; t0 += TOKENS)
            block_bytes += (size_t)40 * tile_slots(ntc - t0 < TOKENS ? ntc - t0 : TOKENS);
        int64_t kb_max = (int64_t)(Q4_0_SCRATCH_BYTES / block_bytes) / 2 * 2;
        kb_max = kb_max > nb ? nb : kb_max;
        for (int64_t b0 = 0; b0 < nb; b0 += kb_max) {
            const int64_t kb = nb - b0 < kb_max ? nb - b0 : kb_max;
            uint8_t *tile_panels[Q4_0_CHUNK_TILES];
            uint8_t *next = panels;
            for (int64_t t0 = 0; t0 < ntc; t0 += TOKENS) {
                const int64_t nt = ntc - t0 < TOKENS ? ntc - t0 : TOKENS;
                tile_panels[t0 / TOKENS] = next;
                q4_0_prepare(ac + (size_t)t0 * act_bytes, act_bytes, nt, b0, kb, next);
                next += (size_t)kb * 40 * tile_slots(nt);
            }
            for (int64_t r0 = 0; r0 < n_rows; r0 += ROWS) {
                const uint8_t *g = (const uint8_t *)w + (size_t)(r0 / ROWS) * gb + (size_t)(b0 / 2) * Q4_0_PAIR_BYTES;
                const __m256i rmask = row_mask(n_rows - r0);
                for (int64_t t0 = 0; t0 < ntc; t0 += TOKENS) {
                    const int64_t nt = ntc - t0 < TOKENS ? ntc - t0 : TOKENS;
                    q4_0_tiles[nt - 1](kb, g, tile_panels[t0 / TOKENS], b0 == 0, acc, y + (tc + t0) * y_stride + r0,
                                       y_stride, rmask);
                }
            }
        }
    }
}

const struct kt_packed_format kt_packed_q4_0_avx2 = {
    .name = "q4_0.r8.avx2",
    .rows = ROWS,
    .exact = true,
    .group_bytes = q4_0_group_bytes,
    .pack = q4_0_pack,
    .gemm = q4_0_gemm,
};
