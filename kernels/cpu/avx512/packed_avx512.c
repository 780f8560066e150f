/*
 * packed_avx512.c - Q4_K and Q8_0 expert weights repacked 16 rows per group
 * for vpdpbusd, and the products over them (kernels/cpu/packed.h): the
 * prefill and decode kernels of the routed experts on CPUs with AVX-512 VNNI.
 *
 * One zmm lane is one weight row: a 64-byte vector holds 4 consecutive
 * weights of each of 16 rows, so one vpdpbusd against a 4-byte activation
 * broadcast ({1to16} from memory) adds 16 rows x 4 products for one token,
 * and a weight vector loaded (and unpacked) once serves a register tile of
 * up to 16 tokens.  Every output equals the reference vec_dot
 * (kernels/cpu/ref/vec_dot_ref.c) bit for bit: each block's integer sums are
 * exact in int32 (vpdpbusd and vpdpwssd never saturate, and every partial is
 * bounded below), and each row lane forms its block's float term with the
 * reference's expression and adds it in block order.  This file must never
 * merge two blocks' integer sums before their float scale, never reorder or
 * fuse (FMA) the float steps (-ffp-contract=off), never read a weight or an
 * activation row past its n elements, and never write y outside the
 * n_rows x n_tok outputs.  Packed buffers must be 64-byte aligned.
 */
#if !defined(__AVX512F__) || !defined(__AVX512BW__) || !defined(__AVX512VL__) || !defined(__AVX512VNNI__)
#error "packed_avx512.c needs the AVX-512 level flags (kernels/CMakeLists.txt sets them for cpu/avx512/*.c)"
#endif

#include "cpu/avx512/packed_avx512.h"
#include "cpu/avx2/simd_avx2.h"

#include <stdbool.h>
#include <string.h>

#define ROWS 16   /* rows per group: one per int32 lane of a zmm */
#define TOKENS 16 /* register tile: tokens sharing each weight vector */

/* The lanes of a group that hold real rows (the last group may be short). */
static inline __mmask16 row_mask(int64_t rows_left)
{
    return rows_left >= ROWS ? (__mmask16)0xffff : (__mmask16)((1u << rows_left) - 1);
}

/* Prefetches the weight line `ahead` bytes past p (an integer address: it may
 * lie past the end of the buffer, and a prefetch never faults). */
static inline void prefetch_weights(const void *p, size_t ahead)
{
    _mm_prefetch((const char *)((uintptr_t)p + ahead), _MM_HINT_T0);
}

/* Streaming distance for the decode shape (see KT_AVX2_PREFETCH_BYTES). */
#define PREFETCH_BYTES 4096

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
#define Q4K_SB_BYTES 2368
#define Q4K_SC 2048
#define Q4K_M 2176
#define Q4K_D 2304
#define Q4K_DMIN 2336
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

/*
 * y[t * y_stride + r] = dot(row r, token t) for the rows of one group (rmask)
 * and nt tokens from a (Q8_K rows act_bytes apart).  Lane r of acc[t] (the
 * caller's 16 x 16 floats: in memory, so the 16 integer sums own the
 * registers) is the reference's `sum` for (r, t), taking per super-block
 *   (d * da) * (float)sum_q - (dmin * da) * (float)sum_m.
 */
static inline __attribute__((always_inline)) void q4_K_tile(int64_t nb, const uint8_t *g, const uint8_t *a,
                                                            size_t act_bytes, const int nt, float *acc, float *y,
                                                            int64_t y_stride, __mmask16 rmask)
{
    const __m512i low4 = _mm512_set1_epi8(0x0f);
    for (int t = 0; t < nt; t++)
        _mm512_store_ps(acc + 16 * t, _mm512_setzero_ps());
    for (int64_t i = 0; i < nb; i++) {
        const uint8_t *s = g + (size_t)i * Q4K_SB_BYTES;
        const size_t act_off = (size_t)i * sizeof(struct kt_block_q8_K);
        __m512i sq[TOKENS];
        for (int t = 0; t < nt; t++)
            sq[t] = _mm512_setzero_si512();
        for (int h = 0; h < 16; h++) {
            prefetch_weights(s + 128 * h, PREFETCH_BYTES);
            prefetch_weights(s + 128 * h + 64, PREFETCH_BYTES);
            const __m512i p0 = _mm512_load_si512((const void *)(s + 128 * h));
            const __m512i p1 = _mm512_load_si512((const void *)(s + 128 * h + 64));
            const __m512i w0 = _mm512_and_si512(p0, low4), w1 = _mm512_and_si512(_mm512_srli_epi16(p0, 4), low4);
            const __m512i w2 = _mm512_and_si512(p1, low4), w3 = _mm512_and_si512(_mm512_srli_epi16(p1, 4), low4);
            const __m512i sc = _mm512_cvtepu8_epi32(_mm_load_si128((const __m128i *)(s + Q4K_SC + 16 * (h / 2))));
            for (int t = 0; t < nt; t++) {
                const uint8_t *q = a + (size_t)t * act_bytes + act_off + Q8K_QS + 16 * h;
                __m512i x = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w0, _mm512_set1_epi32((int)load_u32(q)));
                x = _mm512_dpbusd_epi32(x, w1, _mm512_set1_epi32((int)load_u32(q + 4)));
                x = _mm512_dpbusd_epi32(x, w2, _mm512_set1_epi32((int)load_u32(q + 8)));
                x = _mm512_dpbusd_epi32(x, w3, _mm512_set1_epi32((int)load_u32(q + 12)));
                sq[t] = _mm512_dpwssd_epi32(sq[t], x, sc);
            }
        }
        __m512i mp[8];
        for (int j = 0; j < 8; j++)
            mp[j] = q4_K_min_pairs(s + Q4K_M + 16 * j);
        const __m512 d = _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)(s + Q4K_D)));
        const __m512 dmin = _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)(s + Q4K_DMIN)));
        for (int t = 0; t < nt; t++) {
            const uint8_t *yb = a + (size_t)t * act_bytes + act_off;
            __m512i sm = _mm512_dpwssd_epi32(_mm512_setzero_si512(), mp[0],
                                             _mm512_set1_epi32((int)load_u32(yb + Q8K_BSUMS)));
            for (int j = 1; j < 8; j++)
                sm = _mm512_dpwssd_epi32(sm, mp[j], _mm512_set1_epi32((int)load_u32(yb + Q8K_BSUMS + 4 * j)));
            float da;
            memcpy(&da, yb, sizeof da);
            const __m512 vda = _mm512_set1_ps(da);
            const __m512 term = _mm512_sub_ps(_mm512_mul_ps(_mm512_mul_ps(d, vda), _mm512_cvtepi32_ps(sq[t])),
                                              _mm512_mul_ps(_mm512_mul_ps(dmin, vda), _mm512_cvtepi32_ps(sm)));
            _mm512_store_ps(acc + 16 * t, _mm512_add_ps(_mm512_load_ps(acc + 16 * t), term));
        }
    }
    for (int t = 0; t < nt; t++)
        _mm512_mask_storeu_ps(y + t * y_stride, rmask, _mm512_load_ps(acc + 16 * t));
}

typedef void (*q4_K_tile_fn)(int64_t nb, const uint8_t *g, const uint8_t *a, size_t act_bytes, float *acc,
                             float *y, int64_t y_stride, __mmask16 rmask);

#define TILE_COUNTS(X) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11) X(12) X(13) X(14) X(15) X(16)

#define Q4K_TILE(nt)                                                                                     \
    static void q4_K_tile_##nt(int64_t nb, const uint8_t *g, const uint8_t *a, size_t act_bytes, float *acc, \
                               float *y, int64_t y_stride, __mmask16 rmask)                               \
    {                                                                                                    \
        q4_K_tile(nb, g, a, act_bytes, nt, acc, y, y_stride, rmask);                                     \
    }
TILE_COUNTS(Q4K_TILE)
#define Q4K_TILE_REF(nt) q4_K_tile_##nt,
static const q4_K_tile_fn q4_K_tiles[TOKENS] = {TILE_COUNTS(Q4K_TILE_REF)};

/* Groups outer, token tiles inner: a group's weights (66 KiB at n = 7168)
 * stay in L2 while every token tile reads them. */
static void q4_K_gemm(int64_t n, const void *w, int64_t n_rows, const void *a, size_t act_bytes, int64_t n_tok,
                      float *y, int64_t y_stride)
{
    const int64_t nb = n / KT_QK_K;
    const size_t gb = q4_K_group_bytes(n);
    float acc[TOKENS * ROWS] __attribute__((aligned(64)));
    for (int64_t r0 = 0; r0 < n_rows; r0 += ROWS) {
        const uint8_t *g = (const uint8_t *)w + (size_t)(r0 / ROWS) * gb;
        const __mmask16 rmask = row_mask(n_rows - r0);
        for (int64_t t0 = 0; t0 < n_tok; t0 += TOKENS) {
            const int64_t nt = n_tok - t0 < TOKENS ? n_tok - t0 : TOKENS;
            q4_K_tiles[nt - 1](nb, g, (const uint8_t *)a + (size_t)t0 * act_bytes, act_bytes, acc,
                               y + t0 * y_stride + r0, y_stride, rmask);
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

/* ---- Q8_0 x Q8_0 ----------------------------------------------------------------- */

/*
 * A group is ceil(nb / 2) pair slices of Q8_0_PAIR_BYTES, pair p for blocks
 * 2p and 2p+1 (elements 64p .. 64p+63) of the 16 rows:
 *
 *   offset  bytes  contents
 *   0       512    block 2p:   8 vectors V[c], c = 0..7; bytes 4r .. 4r+3 of
 *                  V[c] = w[r][4c .. 4c+3] + 128 (the int8 quants, sign bit
 *                  flipped: unsigned for vpdpbusd)
 *   512     512    block 2p+1: the same
 *   1024    32     d[r] of block 2p (fp16, as in the GGUF block)
 *   1056    32     d[r] of block 2p+1
 *
 * 1088 = 17 x 64.  With nb odd the last pair's second block is zero bytes and
 * never read; rows past n_rows in the last group are zero bytes throughout.
 *
 * sum (w+128)*a = sum w*a + 128 * sum a: the accumulator of each (block,
 * token) starts at -128 * sum a (|.| <= 2^19), computed once per call for
 * each token and block, and every partial stays far inside int32.
 */
#define Q8_0_PAIR_BYTES 1088
#define Q8_0_D 1024
#define Q8_0_TERMS 4096 /* (token, block) terms prepared at once: 32 KiB of stack */

static_assert(Q8_0_PAIR_BYTES % 64 == 0, "q8_0 pair slices stay 64-byte aligned");

static size_t q8_0_group_bytes(int64_t n)
{
    return (size_t)((n / KT_QK + 1) / 2) * Q8_0_PAIR_BYTES;
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

/* What a token contributes to every row's block term, prepared once per call. */
struct q8_0_act_term {
    float d;      /* the block's scale */
    int32_t bias; /* -128 * sum of its quants */
};

/* terms[t * kb + b] for nt tokens from a and kb blocks from b0. */
static void q8_0_prepare(const uint8_t *a, size_t act_bytes, int64_t nt, int64_t b0, int64_t kb,
                         struct q8_0_act_term *terms)
{
    const __m256i flip = _mm256_set1_epi8((char)0x80);
    for (int64_t t = 0; t < nt; t++) {
        const struct kt_block_q8_0 *x = (const void *)(a + (size_t)t * act_bytes);
        for (int64_t b = 0; b < kb; b++) {
            const struct kt_block_q8_0 *blk = &x[b0 + b];
            /* sum (q + 128) over 32 bytes, as four 64-bit lanes */
            const __m256i s = _mm256_sad_epu8(
                _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)blk->qs), flip), _mm256_setzero_si256());
            const __m128i s2 = _mm_add_epi64(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
            const int32_t sum = (int32_t)(_mm_cvtsi128_si64(s2) + _mm_extract_epi64(s2, 1)) - 32 * 128;
            terms[t * kb + b] = (struct q8_0_act_term){fp16_to_f32(blk->d), -128 * sum};
        }
    }
}

/*
 * kb blocks of one group (g at the chunk's first pair) against nt tokens (a at
 * the chunk's first block of the first token): lane r of facc[t] is the
 * reference's `sum` for (r, t), taking per block (dw * da) * (float)sumi.  The
 * first chunk starts each sum at 0, later ones continue from y.
 */
static inline __attribute__((always_inline)) void q8_0_tile(int64_t kb, const uint8_t *g, const uint8_t *a,
                                                            size_t act_bytes, const struct q8_0_act_term *terms,
                                                            const int nt, bool first, float *y, int64_t y_stride,
                                                            __mmask16 rmask)
{
    __m512 facc[TOKENS];
    for (int t = 0; t < nt; t++)
        facc[t] = first ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(rmask, y + t * y_stride);
    for (int64_t b = 0; b < kb; b++) {
        const uint8_t *s = g + (size_t)(b / 2) * Q8_0_PAIR_BYTES;
        const uint8_t *v = s + 512 * (b % 2);
        prefetch_weights(v, PREFETCH_BYTES);
        __m512i wv[8];
        for (int c = 0; c < 8; c++) {
            prefetch_weights(v + 64 * c, PREFETCH_BYTES);
            wv[c] = _mm512_load_si512((const void *)(v + 64 * c));
        }
        const __m512 dw = _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)(s + Q8_0_D + 32 * (b % 2))));
        for (int t = 0; t < nt; t++) {
            const uint8_t *q = a + (size_t)t * act_bytes + (size_t)b * sizeof(struct kt_block_q8_0) + 2;
            const struct q8_0_act_term *term = &terms[t * kb + b];
            __m512i acc = _mm512_set1_epi32(term->bias);
            for (int c = 0; c < 8; c++)
                acc = _mm512_dpbusd_epi32(acc, wv[c], _mm512_set1_epi32((int)load_u32(q + 4 * c)));
            const __m512 scale = _mm512_mul_ps(dw, _mm512_set1_ps(term->d));
            facc[t] = _mm512_add_ps(facc[t], _mm512_mul_ps(scale, _mm512_cvtepi32_ps(acc)));
        }
    }
    for (int t = 0; t < nt; t++)
        _mm512_mask_storeu_ps(y + t * y_stride, rmask, facc[t]);
}

typedef void (*q8_0_tile_fn)(int64_t kb, const uint8_t *g, const uint8_t *a, size_t act_bytes,
                             const struct q8_0_act_term *terms, bool first, float *y, int64_t y_stride,
                             __mmask16 rmask);

#define Q8_0_TILE(nt)                                                                                    \
    static void q8_0_tile_##nt(int64_t kb, const uint8_t *g, const uint8_t *a, size_t act_bytes,        \
                               const struct q8_0_act_term *terms, bool first, float *y, int64_t y_stride, \
                               __mmask16 rmask)                                                          \
    {                                                                                                    \
        q8_0_tile(kb, g, a, act_bytes, terms, nt, first, y, y_stride, rmask);                            \
    }
TILE_COUNTS(Q8_0_TILE)
#define Q8_0_TILE_REF(nt) q8_0_tile_##nt,
static const q8_0_tile_fn q8_0_tiles[TOKENS] = {TILE_COUNTS(Q8_0_TILE_REF)};

/*
 * The (token, block) terms live in one stack buffer of Q8_0_TERMS: k chunks
 * as long as the token count allows (all of n at n = 7168 up to 18 tokens),
 * so up to Q8_0_TERMS / 2 tokens the weights stream from memory once per
 * call.  Per k chunk: groups outer, token tiles inner (a group's chunk stays
 * in L1 or L2 for every tile); between k chunks the running sums rest in y.
 */
static void q8_0_gemm(int64_t n, const void *w, int64_t n_rows, const void *a, size_t act_bytes, int64_t n_tok,
                      float *y, int64_t y_stride)
{
    const int64_t nb = n / KT_QK;
    const size_t gb = q8_0_group_bytes(n);
    struct q8_0_act_term terms[Q8_0_TERMS];
    int64_t kb_max = Q8_0_TERMS / (n_tok < 1 ? 1 : n_tok) / 2 * 2; /* even: k chunks start at a pair */
    kb_max = kb_max < 2 ? 2 : kb_max > nb ? nb : kb_max;
    const int64_t tc_max = Q8_0_TERMS / (kb_max < 1 ? 1 : kb_max);
    for (int64_t tc = 0; tc < n_tok; tc += tc_max) {
        const int64_t ntc = n_tok - tc < tc_max ? n_tok - tc : tc_max;
        const uint8_t *ac = (const uint8_t *)a + (size_t)tc * act_bytes;
        for (int64_t b0 = 0; b0 < nb; b0 += kb_max) {
            const int64_t kb = nb - b0 < kb_max ? nb - b0 : kb_max;
            q8_0_prepare(ac, act_bytes, ntc, b0, kb, terms);
            for (int64_t r0 = 0; r0 < n_rows; r0 += ROWS) {
                const uint8_t *g = (const uint8_t *)w + (size_t)(r0 / ROWS) * gb + (size_t)(b0 / 2) * Q8_0_PAIR_BYTES;
                const __mmask16 rmask = row_mask(n_rows - r0);
                for (int64_t t0 = 0; t0 < ntc; t0 += TOKENS) {
                    const int64_t nt = ntc - t0 < TOKENS ? ntc - t0 : TOKENS;
                    q8_0_tiles[nt - 1](kb, g, ac + (size_t)t0 * act_bytes + (size_t)b0 * sizeof(struct kt_block_q8_0),
                                       act_bytes, terms + t0 * kb, b0 == 0, y + (tc + t0) * y_stride + r0, y_stride,
                                       rmask);
                }
            }
        }
    }
}

const struct kt_packed_format kt_packed_q8_0_avx512 = {
    .name = "q8_0.r16.avx512",
    .rows = ROWS,
    .exact = true,
    .group_bytes = q8_0_group_bytes,
    .pack = q8_0_pack,
    .gemm = q8_0_gemm,
};
