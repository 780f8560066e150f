/*
 * packed_amx.c - expert weights packed for AMX tiles, and the products
 * y[t][r] = dot(W[r], A[t]) that read them: Q8_0, Q4_0 and Q4_K with AMX-INT8
 * (bit for bit the reference), BF16 with AMX-BF16 (a float GEMM's accuracy,
 * not the reference's bits: activations as two bf16 terms).  The amx level's
 * packed rows (kernels/cpu/dispatch.c).
 *
 * The integer formats share the avx512 level's layouts (packed_avx512.c: pack
 * and group_bytes are that level's), so one packed copy of an expert serves
 * both kernels: a call of fewer than a few tokens (AMX_MIN_TOKENS_*: decode)
 * runs the AVX-512 VNNI kernel, and a larger one the tiles.  Both are the
 * reference bit for bit, so the switch changes no output.  (Before 2026-12
 * the tiles had layouts of their own and served decode too, at 0.62-0.94 x
 * the AVX-512 kernels' GB/s.)
 *
 * A C tile is tokens x weight rows: the A tile holds up to 16 tokens (the
 * integer products load it straight from the activation rows, row stride
 * act_bytes; BF16 from a bf16 copy made per step of K), and the B
 * tile 16 weight rows in the VNNI order (each dword: 4 consecutive int8 or 2
 * bf16 of one row), which is why a group is 16 rows.  The integer products
 * step K by 32 bytes, one Q8_0 / Q4_0 block or Q4_K sub-block, so every C element
 * is that block's exact int32 sum; it is stored and scaled per (token, row)
 * by AVX-512 in the reference's float expression and block order.  Both
 * weights and tokens are signed bytes under TDPBSSD: the B tile of a block is
 * unpacked from the avx512 layout per pass (Q8_0's quants stored +128 get
 * their sign bit back, Q4_0's codes less 8 are int8 in [-8, 7], Q4_K's
 * nibbles 0..15 are valid non-negative int8) - TDPBUSD would need
 * the unsigned operand in A, i.e. weights as A and the activations copied
 * into the VNNI layout of B on every call, for the same throughput.  BF16
 * keeps its C tiles across all of K (there is no per-block scale).
 *
 * Tiles are configured once per call and released before it returns.  A
 * pass covers 32 rows (two groups, two B tiles, each A tile feeding both)
 * and up to 64 tokens (32 for BF16), whose token tiles all reuse the B
 * tiles, so a weight byte leaves memory once per 64 (32) tokens.
 *
 * This file must never: run except through the amx level (a tile
 * instruction without the kernel's XTILEDATA permission kills the process);
 * return with tiles configured; merge two blocks' integer sums before their
 * scale, or reorder or fuse (FMA) the float steps (-ffp-contract=off); read
 * an activation row past its n elements, or write y outside n_rows x n_tok.
 * Compiled a second time by the tests with KT_AMX_EMULATE (amx_ops.h), where
 * the formats are renamed through KT_AMX_NAME.
 */
/* gcc spells the feature macros __AMX_TILE__, clang __AMXTILE__. */
#if !defined(KT_AMX_EMULATE) && !(defined(__AMX_TILE__) && defined(__AMX_INT8__) && defined(__AMX_BF16__)) && \
    !(defined(__AMXTILE__) && defined(__AMXINT8__) && defined(__AMXBF16__))
#error "packed_amx.c needs -mamx-tile -mamx-int8 -mamx-bf16 (kernels/CMakeLists.txt sets them for cpu/amx/*.c)"
#endif
#if !defined(__AVX512F__) || !defined(__AVX512BW__) || !defined(__AVX512VL__) || !defined(__AVX512VNNI__) || \
    !defined(__AVX512BF16__) || !defined(__F16C__)
#error "packed_amx.c needs the AVX-512 level's flags for the steps between tile instructions"
#endif

#include "cpu/amx/packed_amx.h"

#include "cpu/amx/amx_ops.h"
#include "cpu/avx512/packed_avx512.h"
#include "quant.h"

#include <immintrin.h>
#include <stddef.h>
#include <string.h>

#ifndef KT_AMX_NAME
#define KT_AMX_NAME(x) x
#endif
#ifdef KT_AMX_EMULATE
#define KT_AMX_LABEL ".amx-emulated"
#else
#define KT_AMX_LABEL ".amx"
#endif

#define GROUP_ROWS 16   /* weight rows per group: the 16 dword columns of a C tile */
#define PASS_ROWS 32    /* rows per pass: two groups, two B tiles */
#define TILE_TOKENS 16  /* tokens per A tile: its rows */
#define CHUNK_TOKENS 64 /* tokens whose float sums a pass of the integer products keeps */

static inline int64_t min_i64(int64_t a, int64_t b)
{
    return a < b ? a : b;
}

/* Tokens per chunk of a call: at most CHUNK_TOKENS, as even as whole token
 * tiles allow (96 tokens: 48 + 48, not 64 + 32, whose short chunk pays a
 * whole pass's weight unpacking for half the products). */
static inline int64_t chunk_tokens(int64_t n_tok)
{
    const int64_t chunks = (n_tok + CHUNK_TOKENS - 1) / CHUNK_TOKENS;
    const int64_t even = (n_tok + chunks - 1) / chunks;
    return min_i64(CHUNK_TOKENS, (even + TILE_TOKENS - 1) / TILE_TOKENS * TILE_TOKENS);
}

/* The tiles stream the weights once per pass, prefetched as the AVX-512 kernels do. */
#define prefetch_weights kt_packed_prefetch
#define PREFETCH_BYTES KT_PACKED_PREFETCH_BYTES

/* The first k lanes of 16 (k clamped to 0..16). */
static inline __mmask16 first_lanes(int64_t k)
{
    return k <= 0 ? 0 : k >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << k) - 1);
}

static inline void set_tile(struct kt_amx_tilecfg *cfg, int t, int rows, int colsb)
{
    cfg->rows[t] = (uint8_t)rows;
    cfg->colsb[t] = (uint16_t)colsb;
}

/* y[t * y_stride + r] = acc[t][r] for t < nt, r < min(rows, 32). */
static void store_pass(const float (*acc)[PASS_ROWS], int64_t nt, int64_t rows, float *y, int64_t y_stride)
{
    for (int64_t t = 0; t < nt; t++)
        for (int g = 0; g < 2; g++)
            _mm512_mask_storeu_ps(y + t * y_stride + GROUP_ROWS * g, first_lanes(rows - GROUP_ROWS * g),
                                  _mm512_load_ps(&acc[t][GROUP_ROWS * g]));
}

/* ---- integer products: one 32-byte step of K per tile product ------------------ */

#define TILE_B0 0      /* weights of the pass's group 0: 8 rows (K/4) x 64 bytes (16 rows' dwords) */
#define TILE_B1 1      /* weights of group 1 */
#define TILE_A 2       /* 16 tokens x 32 bytes */
#define TILE_A_TAIL 3  /* the last n_tok % 16 tokens x 32 bytes */
#define TILE_C0 4      /* int32 sums: 16 tokens x group 0's 16 rows */
#define TILE_C1 5      /* 16 tokens x group 1's rows */
#define TILE_C0_TAIL 6 /* n_tok % 16 tokens x group 0's rows */
#define TILE_C1_TAIL 7

static void int8_tile_config(struct kt_amx_tilecfg *cfg, int tail_tokens)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->palette = 1;
    set_tile(cfg, TILE_B0, 8, 64);
    set_tile(cfg, TILE_B1, 8, 64);
    set_tile(cfg, TILE_A, TILE_TOKENS, 32);
    set_tile(cfg, TILE_C0, TILE_TOKENS, 64);
    set_tile(cfg, TILE_C1, TILE_TOKENS, 64);
    if (tail_tokens) {
        set_tile(cfg, TILE_A_TAIL, tail_tokens, 32);
        set_tile(cfg, TILE_C0_TAIL, tail_tokens, 64);
        set_tile(cfg, TILE_C1_TAIL, tail_tokens, 64);
    }
}

/*
 * c[g][m][r] = sum over 32 bytes of token m's int8 (at a + m * stride) times
 * group g's row r (the B tiles, already loaded), for the 16 tokens of a full
 * tile or the n_tok % 16 of the tail; g < 2 if two_groups, else g = 0.
 */
static inline void int8_token_tile(struct kt_amx_tiles *s, bool tail, bool two_groups, const uint8_t *a,
                                   size_t stride, int32_t c[2][TILE_TOKENS][GROUP_ROWS])
{
    if (!tail) {
        kt_amx_load(s, TILE_A, a, stride);
        kt_amx_zero(s, TILE_C0);
        kt_amx_dpbssd(s, TILE_C0, TILE_A, TILE_B0);
        if (two_groups) {
            kt_amx_zero(s, TILE_C1);
            kt_amx_dpbssd(s, TILE_C1, TILE_A, TILE_B1);
        }
        kt_amx_store(s, TILE_C0, c[0], GROUP_ROWS * sizeof(int32_t));
        if (two_groups)
            kt_amx_store(s, TILE_C1, c[1], GROUP_ROWS * sizeof(int32_t));
    } else {
        kt_amx_load(s, TILE_A_TAIL, a, stride);
        kt_amx_zero(s, TILE_C0_TAIL);
        kt_amx_dpbssd(s, TILE_C0_TAIL, TILE_A_TAIL, TILE_B0);
        if (two_groups) {
            kt_amx_zero(s, TILE_C1_TAIL);
            kt_amx_dpbssd(s, TILE_C1_TAIL, TILE_A_TAIL, TILE_B1);
        }
        kt_amx_store(s, TILE_C0_TAIL, c[0], GROUP_ROWS * sizeof(int32_t));
        if (two_groups)
            kt_amx_store(s, TILE_C1_TAIL, c[1], GROUP_ROWS * sizeof(int32_t));
    }
}

/* ---- Q8_0 x Q8_0 and Q4_0 x Q8_0 ---------------------------------------------------- */

/*
 * The avx512 level's legacy layouts (packed_avx512.c), read here per block i:
 * a group is pair slices, pair i/2 holding blocks i and i^1 of the 16 rows,
 *   Q8_0 (1088 bytes a pair): block i's 8 vectors at 512 (i%2), bytes 4r ..
 *       4r+3 of vector kk = row r's qs[4kk .. 4kk+3] + 128 (sign bit
 *       flipped), so flipped back they are block i's 8 x 64-byte B tile;
 *       d[r] fp16 at 1024 + 32 (i%2);
 *   Q4_0 (576 bytes a pair): block i's 4 vectors at 256 (i%2), bytes 4r ..
 *       4r+3 of vector kk = row r's qs[4kk .. 4kk+3], the GGUF bytes: low
 *       nibble code 4kk + b, high nibble code 16 + 4kk + b; split (AND 0x0f /
 *       shift 4) and less 8 they are block i's B tile, rows kk the low
 *       nibbles and rows 4 + kk the high, int8 in [-8, 7];
 *       d[r] fp16 at 512 + 32 (i%2).
 */
#define Q8_0_PAIR_BYTES KT_PACKED_Q8_0_PAIR_BYTES
#define Q8_0_QS_BYTES (KT_PACKED_Q8_0_D / 2) /* a block's quants; the pair's scales follow both */
#define Q4_0_PAIR_BYTES KT_PACKED_Q4_0_PAIR_BYTES
#define Q4_0_QS_BYTES (KT_PACKED_Q4_0_D / 2)

static size_t q8_0_group_bytes(int64_t n)
{
    return kt_packed_q8_0_avx512.group_bytes(n);
}

static size_t q4_0_group_bytes(int64_t n)
{
    return kt_packed_q4_0_avx512.group_bytes(n);
}

static void q8_0_pack(int64_t n, const void *w, size_t row_bytes, int64_t n_rows, void *dst)
{
    kt_packed_q8_0_avx512.pack(n, w, row_bytes, n_rows, dst);
}

static void q4_0_pack(int64_t n, const void *w, size_t row_bytes, int64_t n_rows, void *dst)
{
    kt_packed_q4_0_avx512.pack(n, w, row_bytes, n_rows, dst);
}

/* The B tile (512 bytes) of one Q8_0 block from its 512 packed bytes. */
static inline void q8_0_signed(const uint8_t *qs, uint8_t tile[512])
{
    const __m512i flip = _mm512_set1_epi8((char)0x80);
    for (int v = 0; v < 8; v++) {
        prefetch_weights(qs + 64 * v, PREFETCH_BYTES);
        _mm512_store_si512((void *)(tile + 64 * v),
                           _mm512_xor_si512(_mm512_load_si512((const void *)(qs + 64 * v)), flip));
    }
}

/* The B tile (512 bytes) of one Q4_0 block from its 256 packed bytes: codes
 * less 8, int8. */
static inline void q4_0_split_nibbles(const uint8_t *qs, uint8_t tile[512])
{
    const __m512i mask = _mm512_set1_epi8(0x0f), eight = _mm512_set1_epi8(8);
    for (int v = 0; v < 4; v++) {
        prefetch_weights(qs + 64 * v, PREFETCH_BYTES);
        const __m512i x = _mm512_loadu_si512((const void *)(qs + 64 * v));
        _mm512_store_si512((void *)(tile + 64 * v), _mm512_sub_epi8(_mm512_and_si512(x, mask), eight));
        _mm512_store_si512((void *)(tile + 256 + 64 * v),
                           _mm512_sub_epi8(_mm512_and_si512(_mm512_srli_epi16(x, 4), mask), eight));
    }
}

/* Per (token, row), block after block: sum += (dw * da) * (float)sumi, the
 * expression of kt_vec_dot_q8_0_q8_0_ref (q4: of kt_vec_dot_q4_0_q8_0_ref),
 * 16 rows per vector. */
static inline __attribute__((always_inline)) void legacy_gemm(int64_t n, const void *w, int64_t n_rows, const void *a,
                                                              size_t act_bytes, int64_t n_tok, float *y,
                                                              int64_t y_stride, const bool q4)
{
    const int64_t nb = n / KT_QK;
    const size_t group_bytes = q4 ? q4_0_group_bytes(n) : q8_0_group_bytes(n);
    const size_t pair_bytes = q4 ? Q4_0_PAIR_BYTES : Q8_0_PAIR_BYTES;
    const size_t qs_bytes = q4 ? Q4_0_QS_BYTES : Q8_0_QS_BYTES; /* per block; a pair's two, then their scales */
    const uint8_t *act = a;
    _Alignas(64) float acc[CHUNK_TOKENS][PASS_ROWS];
    _Alignas(64) int32_t c[2][TILE_TOKENS][GROUP_ROWS];
    _Alignas(64) uint8_t bq[2][512]; /* the unpacked B tiles of the pass's groups */
    struct kt_amx_tilecfg cfg;
    struct kt_amx_tiles tiles;
    int8_tile_config(&cfg, (int)(n_tok % TILE_TOKENS));
    kt_amx_config(&tiles, &cfg);
    const int64_t chunk = chunk_tokens(n_tok);
    for (int64_t t0 = 0; t0 < n_tok; t0 += chunk) {
        const int64_t nt = min_i64(chunk, n_tok - t0);
        for (int64_t r0 = 0; r0 < n_rows; r0 += PASS_ROWS) {
            const int ng = n_rows - r0 > GROUP_ROWS ? 2 : 1;
            const uint8_t *grp[2];
            grp[0] = (const uint8_t *)w + (size_t)(r0 / GROUP_ROWS) * group_bytes;
            grp[1] = ng == 2 ? grp[0] + group_bytes : grp[0];
            memset(acc, 0, (size_t)nt * sizeof acc[0]);
            for (int64_t i = 0; i < nb; i++) {
                const size_t pair = (size_t)(i / 2) * pair_bytes, half = (size_t)(i % 2);
                if (half == 0)
                    for (int g = 0; g < ng; g++) /* the pair's scale line */
                        prefetch_weights(grp[g] + pair + 2 * qs_bytes, PREFETCH_BYTES);
                __m512 dw[2];
                for (int g = 0; g < 2; g++)
                    dw[g] = _mm512_cvtph_ps(_mm256_load_si256(
                        (const __m256i *)(grp[g] + pair + 2 * qs_bytes + GROUP_ROWS * sizeof(kt_fp16) * half)));
                for (int g = 0; g < ng; g++) {
                    const uint8_t *qs = grp[g] + pair + qs_bytes * half;
                    if (q4)
                        q4_0_split_nibbles(qs, bq[g]);
                    else
                        q8_0_signed(qs, bq[g]);
                }
                kt_amx_load(&tiles, TILE_B0, bq[0], 64);
                if (ng == 2)
                    kt_amx_load(&tiles, TILE_B1, bq[1], 64);
                for (int64_t m0 = 0; m0 < nt; m0 += TILE_TOKENS) {
                    const int64_t mt = min_i64(TILE_TOKENS, nt - m0);
                    const uint8_t *tok = act + (size_t)(t0 + m0) * act_bytes;
                    int8_token_tile(&tiles, mt < TILE_TOKENS, ng == 2,
                                    tok + i * sizeof(struct kt_block_q8_0) + offsetof(struct kt_block_q8_0, qs),
                                    act_bytes, c);
                    for (int64_t m = 0; m < mt; m++) {
                        const struct kt_block_q8_0 *yb = (const void *)(tok + (size_t)m * act_bytes);
                        const __m512 da = _mm512_set1_ps(_cvtsh_ss(yb[i].d));
                        float *sum = acc[m0 + m];
                        for (int g = 0; g < ng; g++) {
                            const __m512 sumi = _mm512_cvtepi32_ps(_mm512_load_si512(c[g][m]));
                            const __m512 term = _mm512_mul_ps(_mm512_mul_ps(dw[g], da), sumi);
                            _mm512_store_ps(sum + GROUP_ROWS * g,
                                            _mm512_add_ps(_mm512_load_ps(sum + GROUP_ROWS * g), term));
                        }
                    }
                }
            }
            store_pass(acc, nt, n_rows - r0, y + t0 * y_stride + r0, y_stride);
        }
    }
    kt_amx_release(&tiles);
}

static void q8_0_tiles(int64_t n, const void *w, int64_t n_rows, const void *a, size_t act_bytes, int64_t n_tok,
                      float *y, int64_t y_stride)
{
    legacy_gemm(n, w, n_rows, a, act_bytes, n_tok, y, y_stride, false);
}

static void q4_0_tiles(int64_t n, const void *w, int64_t n_rows, const void *a, size_t act_bytes, int64_t n_tok,
                      float *y, int64_t y_stride)
{
    legacy_gemm(n, w, n_rows, a, act_bytes, n_tok, y, y_stride, true);
}

/* ---- Q4_K x Q8_K ------------------------------------------------------------------ */

/*
 * The avx512 level's Q4_K layout (packed_avx512.c): a group of 16 rows is
 * n/256 super-block slices of Q4_K_SB_BYTES,
 *   quants at 0: sub-block j's 32 elements in the 4 vectors at 256j + 64v,
 *       bytes 4r .. 4r+3 of vector v: low nibbles row r's elements 32j + 8v
 *       .. +3, high nibbles 32j + 8v + 4 .. +7, so split (AND 0x0f / shift 4)
 *       they are rows 2v and 2v+1 of sub-block j's B tile;
 *   sc[8][16] at 2048, m[8][16] at 2176: row r's 6-bit scale and min of
 *       sub-block j, u8;
 *   d[16], dmin[16] fp16 at 2304 and 2336.
 */
#define Q4_K_SC KT_PACKED_Q4_K_SC
#define Q4_K_M KT_PACKED_Q4_K_M
#define Q4_K_D KT_PACKED_Q4_K_D
#define Q4_K_DMIN KT_PACKED_Q4_K_DMIN
#define Q4_K_SB_BYTES KT_PACKED_Q4_K_SB_BYTES

static size_t q4_K_group_bytes(int64_t n)
{
    return kt_packed_q4_K_avx512.group_bytes(n);
}

static void q4_K_pack(int64_t n, const void *w, size_t row_bytes, int64_t n_rows, void *dst)
{
    kt_packed_q4_K_avx512.pack(n, w, row_bytes, n_rows, dst);
}

/*
 * The tiles cannot scale a C element per sub-block without storing it every
 * 32 bytes of K, which is what kept them slower than AVX-512.  Instead each
 * row's 6-bit scale splits as sc = 8 sh + sl (sh, sl in 0..7) and the B tiles
 * carry the products sh * q and sl * q (at most 7 * 15 = 105, still int8):
 *   sum_q = sum_j sc_j * (sum of sub-block j) = 8 * H + L,
 *   H = sum over the super-block of (sh * q) * a,  L = the same with sl,
 * two int32 sums the tiles accumulate across all 256 elements (|L|, |H| <=
 * 256 * 105 * 128 < 2^22), exact, so equal to the reference's sum_q.  The
 * B tiles of a super-block (K = 64 bytes each, two sub-blocks) are built
 * once per pass and serve every token tile.
 *
 * Where its time goes (one core of the AMX VM, 2026-12-03, 2048 x 7168 and
 * 7168 x 2048 at 64 tokens, each part timed alone by disabling the others):
 * the tile products with their loads and stores take 0.45 of the whole's time,
 * the per (token, row, super-block) float epilogue 0.47, building the B tiles
 * 0.30: together 1.2 x the whole, so on that VM the tile unit and the
 * AVX-512 work overlapped little.  Three restructurings stayed within 3% of
 * this loop: two token tiles x one group (the peak loop's 2 x 2 blocking;
 * the activations then leave L2 twice as often), the epilogue software-
 * pipelined one tile behind the products with Q8_K's pair sums gathered
 * once per chunk (the epilogue alone 20% faster), and super-blocks outermost
 * so each super-block's activations stay in L1 with the sums kept in y.
 * What is left is work to remove, not to hide: the epilogue's float steps
 * are the reference's and cannot be merged.
 */

/* Words (s_r, s_r) in dword r from 16 u8 s_r. */
static inline __m512i word_pairs(__m512i s32)
{
    return _mm512_or_si512(s32, _mm512_slli_epi32(s32, 16));
}

/* Sub-block j of a group (256 packed bytes at qs) into the halves of the
 * super-block's H and L B tiles: rows 2v and 2v+1 from vector v's low and
 * high nibbles, each byte times its row's sh or sl (vpmullw on byte pairs:
 * both products stay under 256, so neither carries into the other byte). */
static inline void q4_K_scaled_tile(const uint8_t *qs, __m512i shw, __m512i slw, uint8_t h[512], uint8_t l[512])
{
    const __m512i mask = _mm512_set1_epi8(0x0f);
    for (int v = 0; v < 4; v++) {
        prefetch_weights(qs + 64 * v, PREFETCH_BYTES);
        const __m512i x = _mm512_load_si512((const void *)(qs + 64 * v));
        const __m512i lo = _mm512_and_si512(x, mask), hi = _mm512_and_si512(_mm512_srli_epi16(x, 4), mask);
        _mm512_store_si512((void *)(h + 128 * v), _mm512_mullo_epi16(lo, shw));
        _mm512_store_si512((void *)(h + 128 * v + 64), _mm512_mullo_epi16(hi, shw));
        _mm512_store_si512((void *)(l + 128 * v), _mm512_mullo_epi16(lo, slw));
        _mm512_store_si512((void *)(l + 128 * v + 64), _mm512_mullo_epi16(hi, slw));
    }
}

/* Words (m[2p][r], m[2p+1][r]) in dword r: the mins of sub-blocks 2p and
 * 2p+1 as the int16 pairs that meet Q8_K's pair sums in one VPDPWSSD. */
static inline __m512i q4_K_min_pair(const uint8_t *m, int p)
{
    const __m128i lo = _mm_load_si128((const __m128i *)(m + 32 * p));
    const __m128i hi = _mm_load_si128((const __m128i *)(m + 32 * p + 16));
    const __m256i pairs = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_unpacklo_epi8(lo, hi)),
                                                  _mm_unpackhi_epi8(lo, hi), 1);
    return _mm512_cvtepu8_epi16(pairs);
}

#define TILE_QB0 0 /* B: 16 K-quads (two sub-blocks) x 16 rows' dwords */
#define TILE_QB1 1
#define TILE_QA 2  /* 16 tokens x 64 bytes */
#define TILE_QH0 4 /* int32 H of group 0: 16 tokens x 16 rows */
#define TILE_QL0 5
#define TILE_QH1 6
#define TILE_QL1 7

/*
 * Per (token, row) and super-block, as kt_vec_dot_q4_K_q8_K_ref:
 *   sum_q = 8 H + L                                     (tiles)
 *   sum_m = sum_j m_j * (bsums[2j] + bsums[2j+1])      (VPDPWSSD)
 *   sum  += d*da*(float)sum_q - dmin*da*(float)sum_m
 * The float steps are the reference's, super-block after super-block.  A
 * token tile short of 16 (the last) loads its A tiles from a zero-padded copy
 * of its tokens' quants, so every tile is 16 rows and one configuration
 * serves the call.
 */
static void q4_K_tiles(int64_t n, const void *w, int64_t n_rows, const void *a, size_t act_bytes, int64_t n_tok,
                       float *y, int64_t y_stride)
{
    const int64_t nsb = n / KT_QK_K;
    const size_t group_bytes = q4_K_group_bytes(n);
    const uint8_t *act = a;
    _Alignas(64) float acc[CHUNK_TOKENS][PASS_ROWS];
    _Alignas(64) int32_t ch[2][TILE_TOKENS][GROUP_ROWS], cl[2][TILE_TOKENS][GROUP_ROWS];
    _Alignas(64) uint8_t bh[2][4][1024], bl[2][4][1024]; /* [group][K step]: the super-block's B tiles */
    _Alignas(64) uint8_t pad[TILE_TOKENS][KT_QK_K];      /* the short tile's quants, zero rows after */
    memset(pad, 0, sizeof pad);
    struct kt_amx_tilecfg cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    set_tile(&cfg, TILE_QB0, 16, 64);
    set_tile(&cfg, TILE_QB1, 16, 64);
    set_tile(&cfg, TILE_QA, TILE_TOKENS, 64);
    for (int t = TILE_QH0; t <= TILE_QL1; t++)
        set_tile(&cfg, t, TILE_TOKENS, 64);
    struct kt_amx_tiles tiles;
    kt_amx_config(&tiles, &cfg);
    const int64_t chunk = chunk_tokens(n_tok);
    for (int64_t t0 = 0; t0 < n_tok; t0 += chunk) {
        const int64_t nt = min_i64(chunk, n_tok - t0);
        for (int64_t r0 = 0; r0 < n_rows; r0 += PASS_ROWS) {
            const int ng = n_rows - r0 > GROUP_ROWS ? 2 : 1;
            const uint8_t *grp[2];
            grp[0] = (const uint8_t *)w + (size_t)(r0 / GROUP_ROWS) * group_bytes;
            grp[1] = ng == 2 ? grp[0] + group_bytes : grp[0];
            memset(acc, 0, (size_t)nt * sizeof acc[0]);
            for (int64_t sb = 0; sb < nsb; sb++) {
                const uint8_t *blk[2] = {grp[0] + sb * Q4_K_SB_BYTES, grp[1] + sb * Q4_K_SB_BYTES};
                for (int g = 0; g < ng; g++)
                    for (int line = Q4_K_SC; line < Q4_K_SB_BYTES; line += 64)
                        prefetch_weights(blk[g] + line, PREFETCH_BYTES);
                for (int g = 0; g < ng; g++)
                    for (int j = 0; j < 8; j++) {
                        const __m512i sc =
                            _mm512_cvtepu8_epi32(_mm_load_si128((const __m128i *)(blk[g] + Q4_K_SC + GROUP_ROWS * j)));
                        const __m512i shw = word_pairs(_mm512_srli_epi32(sc, 3));
                        const __m512i slw = word_pairs(_mm512_and_si512(sc, _mm512_set1_epi32(7)));
                        q4_K_scaled_tile(blk[g] + 256 * j, shw, slw, bh[g][j / 2] + 512 * (j % 2),
                                         bl[g][j / 2] + 512 * (j % 2));
                    }
                __m512 d[2], dmin[2];
                __m512i mins[2][4];
                for (int g = 0; g < 2; g++) {
                    d[g] = _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)(blk[g] + Q4_K_D)));
                    dmin[g] = _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)(blk[g] + Q4_K_DMIN)));
                    for (int p = 0; p < 4; p++)
                        mins[g][p] = q4_K_min_pair(blk[g] + Q4_K_M, p);
                }
                for (int64_t m0 = 0; m0 < nt; m0 += TILE_TOKENS) {
                    const int64_t mt = min_i64(TILE_TOKENS, nt - m0);
                    const uint8_t *tok = act + (size_t)(t0 + m0) * act_bytes;
                    const uint8_t *qa = tok + sb * sizeof(struct kt_block_q8_K) + offsetof(struct kt_block_q8_K, qs);
                    size_t qa_stride = act_bytes;
                    if (mt < TILE_TOKENS) {
                        for (int64_t m = 0; m < mt; m++)
                            memcpy(pad[m], qa + (size_t)m * act_bytes, KT_QK_K);
                        qa = &pad[0][0];
                        qa_stride = KT_QK_K;
                    }
                    /* (tile numbers are immediates: group 1's tiles are spelled out) */
                    kt_amx_zero(&tiles, TILE_QH0);
                    kt_amx_zero(&tiles, TILE_QL0);
                    if (ng == 2) {
                        kt_amx_zero(&tiles, TILE_QH1);
                        kt_amx_zero(&tiles, TILE_QL1);
                    }
                    for (int kb = 0; kb < 4; kb++) {
                        kt_amx_load(&tiles, TILE_QA, qa + 64 * kb, qa_stride);
                        kt_amx_load(&tiles, TILE_QB0, bh[0][kb], 64);
                        kt_amx_dpbssd(&tiles, TILE_QH0, TILE_QA, TILE_QB0);
                        kt_amx_load(&tiles, TILE_QB1, bl[0][kb], 64);
                        kt_amx_dpbssd(&tiles, TILE_QL0, TILE_QA, TILE_QB1);
                        if (ng == 2) {
                            kt_amx_load(&tiles, TILE_QB0, bh[1][kb], 64);
                            kt_amx_dpbssd(&tiles, TILE_QH1, TILE_QA, TILE_QB0);
                            kt_amx_load(&tiles, TILE_QB1, bl[1][kb], 64);
                            kt_amx_dpbssd(&tiles, TILE_QL1, TILE_QA, TILE_QB1);
                        }
                    }
                    kt_amx_store(&tiles, TILE_QH0, ch[0], GROUP_ROWS * sizeof(int32_t));
                    kt_amx_store(&tiles, TILE_QL0, cl[0], GROUP_ROWS * sizeof(int32_t));
                    if (ng == 2) {
                        kt_amx_store(&tiles, TILE_QH1, ch[1], GROUP_ROWS * sizeof(int32_t));
                        kt_amx_store(&tiles, TILE_QL1, cl[1], GROUP_ROWS * sizeof(int32_t));
                    }
                    for (int64_t m = 0; m < mt; m++) {
                        const struct kt_block_q8_K *yb =
                            (const struct kt_block_q8_K *)(const void *)(tok + (size_t)m * act_bytes) + sb;
                        const __m512 da = _mm512_set1_ps(yb->d);
                        __m512i pair[4]; /* (bsum of sub-block 2p, of 2p+1) as int16, in every dword */
                        for (int p = 0; p < 4; p++) {
                            const int16_t lo = (int16_t)(yb->bsums[4 * p] + yb->bsums[4 * p + 1]);
                            const int16_t hi = (int16_t)(yb->bsums[4 * p + 2] + yb->bsums[4 * p + 3]);
                            pair[p] =
                                _mm512_set1_epi32((int)((uint32_t)(uint16_t)lo | (uint32_t)(uint16_t)hi << 16));
                        }
                        for (int g = 0; g < ng; g++) {
                            __m512i sum_m = _mm512_setzero_si512();
                            for (int p = 0; p < 4; p++)
                                sum_m = _mm512_dpwssd_epi32(sum_m, mins[g][p], pair[p]);
                            const __m512i q = _mm512_add_epi32(_mm512_slli_epi32(_mm512_load_si512(ch[g][m]), 3),
                                                               _mm512_load_si512(cl[g][m]));
                            const __m512 sum_q = _mm512_cvtepi32_ps(q);
                            const __m512 term = _mm512_sub_ps(_mm512_mul_ps(_mm512_mul_ps(d[g], da), sum_q),
                                                              _mm512_mul_ps(_mm512_mul_ps(dmin[g], da),
                                                                            _mm512_cvtepi32_ps(sum_m)));
                            float *sum = &acc[m0 + m][GROUP_ROWS * g];
                            _mm512_store_ps(sum, _mm512_add_ps(_mm512_load_ps(sum), term));
                        }
                    }
                }
            }
            store_pass(acc, nt, n_rows - r0, y + t0 * y_stride + r0, y_stride);
        }
    }
    kt_amx_release(&tiles);
}

/* ---- BF16 x F32 (activations as two bf16 terms) -------------------------------- */

/*
 * A group of 16 rows, per step k of 32 elements (ceil(n/32) steps, so any
 * n): [kk][r][e] bf16 = row r's element 32k + 2kk + e (zero past n), one
 * 16 x 64-byte B tile.
 *
 * The result is not the reference's: each activation a is split into two
 * bf16 terms, hi = bf16(a) and lo = bf16(a - hi) (nearest even, denormals
 * to zero: VCVTNE2PS2BF16; a - hi is exact in fp32), so hi + lo keeps 16 of
 * a's 24 bits, |a - hi - lo| <= 2^-16 |a|.  Both terms' products with the
 * weights, exact in fp32, are summed in fp32 by the tile (nearest even at
 * every step) instead of in double:
 *     |y - ref| <= (2^-16 + n * 2^-23) * sum|w_i * a_i|,
 * a float GEMM's error, checked by tests/test_kernels_amx.c.  (One term,
 * bf16(a) alone, was 2^-8: end to end that showed; see fill_amx in
 * kernels/cpu/dispatch.c.)  The second term doubles the tile products, for
 * 2.4-3.4 x the avx512 BF16 GEMM still (8 to 128 tokens, one core).
 */
#define BF16_TILE_BYTES 1024

#define TILE_W0 0   /* weights of group 0: 16 rows (K/2 pairs) x 64 bytes */
#define TILE_W1 1   /* weights of group 1 */
#define TILE_X0 2   /* tokens 0..15 of the block: 16 x 32 bf16 */
#define TILE_X1 3   /* tokens 16..31 */
#define TILE_Y00 4  /* fp32 sums: tokens 0..15 x group 0 */
#define TILE_Y01 5  /* tokens 0..15 x group 1 */
#define TILE_Y10 6  /* tokens 16..31 x group 0 */
#define TILE_Y11 7  /* tokens 16..31 x group 1 */

static size_t bf16_group_bytes(int64_t n)
{
    return (size_t)((n + 31) / 32) * BF16_TILE_BYTES;
}

static void bf16_pack(int64_t n, const void *w, size_t row_bytes, int64_t n_rows, void *dst)
{
    const size_t group_bytes = bf16_group_bytes(n);
    const int64_t full_steps = n / 32;
    /* dword r of a tile row kk: row r's pair kk, gathered 16 rows at a time */
    const __m512i rows = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                            _mm512_set1_epi32((int)(row_bytes / 4)));
    for (int64_t g = 0; g * GROUP_ROWS < n_rows; g++) {
        uint8_t *grp = (uint8_t *)dst + (size_t)g * group_bytes;
        const uint8_t *src = (const uint8_t *)w + (size_t)(g * GROUP_ROWS) * row_bytes;
        const int64_t nr = min_i64(GROUP_ROWS, n_rows - g * GROUP_ROWS);
        if (nr == GROUP_ROWS && row_bytes % 4 == 0 && row_bytes / 4 <= INT32_MAX / GROUP_ROWS) {
            for (int64_t k = 0; k < full_steps; k++)
                for (int kk = 0; kk < 16; kk++)
                    _mm512_store_si512((void *)(grp + k * BF16_TILE_BYTES + 64 * kk),
                                       _mm512_i32gather_epi32(rows, (const void *)(src + 64 * k + 4 * kk), 4));
        } else {
            memset(grp, 0, (size_t)full_steps * BF16_TILE_BYTES);
            for (int64_t r = 0; r < nr; r++)
                for (int64_t i = 0; i < full_steps * 32; i += 2)
                    memcpy(grp + (i / 32) * BF16_TILE_BYTES + 64 * ((i % 32) / 2) + 4 * r,
                           src + (size_t)r * row_bytes + 2 * i, 2 * sizeof(kt_bf16));
        }
        if (full_steps * 32 < n) { /* the last step, zero past n: one pair (or the last element) at a time */
            uint8_t *tile = grp + full_steps * BF16_TILE_BYTES;
            memset(tile, 0, BF16_TILE_BYTES);
            for (int64_t r = 0; r < nr; r++)
                for (int64_t i = full_steps * 32; i < n; i += 2)
                    memcpy(tile + 64 * ((i % 32) / 2) + 4 * r, src + (size_t)r * row_bytes + 2 * i,
                           (size_t)min_i64(2, n - i) * sizeof(kt_bf16));
        }
    }
}

/* x[s][m / 16][m % 16][e] = term s of token m's element 32k + e, zero past n
 * (m < nt): term 0 = bf16(a), term 1 = bf16(a - term 0). */
static inline void bf16_activations(const uint8_t *act, size_t act_bytes, int64_t nt, int64_t n, int64_t k,
                                    uint16_t x[2][2][TILE_TOKENS][32])
{
    const int64_t left = n - 32 * k;
    const __mmask16 lo_lanes = first_lanes(left), hi_lanes = first_lanes(left - 16);
    for (int64_t m = 0; m < nt; m++) {
        const float *row = (const float *)(const void *)(act + (size_t)m * act_bytes) + 32 * k;
        const __m512 lo = _mm512_maskz_loadu_ps(lo_lanes, row);
        const __m512 hi = hi_lanes ? _mm512_maskz_loadu_ps(hi_lanes, row + 16) : _mm512_setzero_ps();
        const __m512i t0 = (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
        /* the terms' floats: bf16 widened by a 16-bit shift, exactly */
        const __m512 lo0 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(t0)), 16));
        const __m512 hi0 =
            _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(t0, 1)), 16));
        _mm512_store_si512((void *)x[0][m / TILE_TOKENS][m % TILE_TOKENS], t0);
        _mm512_store_si512((void *)x[1][m / TILE_TOKENS][m % TILE_TOKENS],
                           (__m512i)_mm512_cvtne2ps_pbh(_mm512_sub_ps(hi, hi0), _mm512_sub_ps(lo, lo0)));
    }
}
/* y[t * y_stride + r] = c[t][r] for t < min(tokens, 16), r < min(rows, 16). */
static void store_tile(const float c[TILE_TOKENS][GROUP_ROWS], int64_t tokens, int64_t rows, float *y,
                       int64_t y_stride)
{
    for (int64_t t = 0; t < min_i64(tokens, TILE_TOKENS); t++)
        _mm512_mask_storeu_ps(y + t * y_stride, first_lanes(rows), _mm512_load_ps(c[t]));
}

/* The float products' tiles: all eight 16 x 64 bytes. */
static void float_tiles_config(struct kt_amx_tiles *tiles)
{
    struct kt_amx_tilecfg cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < KT_AMX_TILES; t++)
        set_tile(&cfg, t, 16, 64);
    kt_amx_config(tiles, &cfg);
}

static inline __attribute__((always_inline)) void float_zero_sums(struct kt_amx_tiles *tiles)
{
    kt_amx_zero(tiles, TILE_Y00);
    kt_amx_zero(tiles, TILE_Y01);
    kt_amx_zero(tiles, TILE_Y10);
    kt_amx_zero(tiles, TILE_Y11);
}

/* One step of K into the C tiles: the weight tiles at w0 (and w1, two
 * groups) against both terms of the token tiles in x (bf16_activations);
 * the weight tiles serve both terms.  (Tile numbers are immediates: the
 * second group's and token tile's products are spelled out.) */
static inline __attribute__((always_inline)) void float_step(struct kt_amx_tiles *tiles,
                                                             uint16_t x[2][2][TILE_TOKENS][32], const uint8_t *w0,
                                                             const uint8_t *w1, bool two_groups, bool two_tiles)
{
    kt_amx_load(tiles, TILE_W0, w0, 64);
    if (two_groups)
        kt_amx_load(tiles, TILE_W1, w1, 64);
    for (int s = 0; s < 2; s++) { /* the two terms, into the same sums */
        kt_amx_load(tiles, TILE_X0, x[s][0], 64);
        kt_amx_dpbf16ps(tiles, TILE_Y00, TILE_X0, TILE_W0);
        if (two_groups)
            kt_amx_dpbf16ps(tiles, TILE_Y01, TILE_X0, TILE_W1);
        if (two_tiles) {
            kt_amx_load(tiles, TILE_X1, x[s][1], 64);
            kt_amx_dpbf16ps(tiles, TILE_Y10, TILE_X1, TILE_W0);
            if (two_groups)
                kt_amx_dpbf16ps(tiles, TILE_Y11, TILE_X1, TILE_W1);
        }
    }
}

/* ---- FP8_B128 x F32 (the BF16 tiles, per 128-element block) ---------------------- */

/*
 * A group of 16 rows, per block b of 128 elements (n a multiple of 128):
 * four B tiles as BF16's, of e4m3(q) (exact in bf16: 4 significant bits),
 * at FP8_BLOCK_BYTES * b + 1024 kk, then the 16 rows' d (float) at + 4096.
 * Each block's products sum in its own C tiles, scaled by d per (token, row)
 * into float accumulators after the block:
 *     y = sum_b d_b * (sum over the block of e4m3(q_i) * (hi_i + lo_i)),
 * the activations as BF16's two terms.  Not the reference's bits (which
 * rounds each weight e4m3(q) * d to fp32 and sums in 64 lanes): within
 * (2^-16 + (n + 2 n/128) * 2^-23) * sum|w_i * a_i|, checked by
 * tests/test_kernels_amx.c.
 */
#define FP8_BLOCK_BYTES (4 * BF16_TILE_BYTES + 64)

static size_t fp8_group_bytes(int64_t n)
{
    return (size_t)(n / KT_QK_FP8) * FP8_BLOCK_BYTES;
}

/* e4m3(q) for 16 codes as bf16 pairs' halves: F32 e4m3(q) * 2^-120 exactly
 * (the sign-extended code shifted by 20, as fp8_avx512.c), times 2^120. */
static inline __m512 e4m3x16(const uint8_t *q)
{
    const __m512i s = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(const void *)q));
    const __m512 x = _mm512_castsi512_ps(_mm512_and_si512(_mm512_slli_epi32(s, 20), _mm512_set1_epi32((int)0x87f00000u)));
    return _mm512_mul_ps(x, _mm512_set1_ps(0x1p120f));
}

static void fp8_pack(int64_t n, const void *w, size_t row_bytes, int64_t n_rows, void *dst)
{
    const size_t group_bytes = fp8_group_bytes(n);
    const int64_t nb = n / KT_QK_FP8;
    const __m512i lanes = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                             _mm512_set1_epi32(16)); /* dword r * 16 of pairs[r][.] */
    _Alignas(64) uint32_t pairs[GROUP_ROWS][16]; /* a step's 16 pairs per row, then gathered down the rows */
    for (int64_t g = 0; g * GROUP_ROWS < n_rows; g++) {
        uint8_t *grp = (uint8_t *)dst + (size_t)g * group_bytes;
        const int64_t nr = min_i64(GROUP_ROWS, n_rows - g * GROUP_ROWS);
        for (int64_t b = 0; b < nb; b++) {
            uint8_t *blk = grp + (size_t)b * FP8_BLOCK_BYTES;
            float d[GROUP_ROWS] = {0};
            for (int kk = 0; kk < 4; kk++) {
                memset(pairs, 0, sizeof pairs);
                for (int64_t r = 0; r < nr; r++) {
                    const struct kt_block_fp8_b128 *x =
                        (const void *)((const uint8_t *)w + (size_t)(g * GROUP_ROWS + r) * row_bytes);
                    d[r] = x[b].d;
                    const uint8_t *q = x[b].q + 32 * kk;
                    _mm512_store_si512((void *)pairs[r], (__m512i)_mm512_cvtne2ps_pbh(e4m3x16(q + 16), e4m3x16(q)));
                }
                for (int p = 0; p < 16; p++) /* tile row p: pair p of the 16 rows */
                    _mm512_store_si512((void *)(blk + BF16_TILE_BYTES * kk + 64 * p),
                                       _mm512_i32gather_epi32(lanes, (const void *)&pairs[0][p], 4));
            }
            memcpy(blk + 4 * BF16_TILE_BYTES, d, sizeof d);
        }
    }
}

/* acc[t][r] += d[r] * c[t][r], t < 16 */
static inline void fp8_scale_tile(const float c[TILE_TOKENS][GROUP_ROWS], __m512 d, float (*acc)[PASS_ROWS], int g)
{
    for (int t = 0; t < TILE_TOKENS; t++) {
        float *s = &acc[t][GROUP_ROWS * g];
        _mm512_store_ps(s, _mm512_fmadd_ps(d, _mm512_load_ps(c[t]), _mm512_load_ps(s)));
    }
}


/* How a float format's groups hold K: blocks of steps 32-element steps (a
 * B tile each, BF16_TILE_BYTES apart), block_bytes apart; scaled blocks end
 * in their 16 rows' float scales, applied to the block's sums. */
struct float_layout {
    size_t group_bytes, block_bytes;
    int64_t blocks, steps;
    bool scaled;
};

/*
 * Blocks of 32 tokens x 32 rows: four C tiles sum a block of K (BF16: all
 * of it, one block).  The activations are split into their two bf16 terms
 * per step into a 4 KiB buffer (again for every pair of groups: the price
 * of not allocating); the weight tiles of a step serve both terms.  An
 * unscaled block's sums are the outputs; a scaled one's are multiplied by
 * its scales and added into float accumulators, stored after the last.
 */
static void float_gemm(int64_t n, const void *w, int64_t n_rows, const void *a, size_t act_bytes, int64_t n_tok,
                       float *y, int64_t y_stride, const struct float_layout *L)
{
    const uint8_t *act = a;
    _Alignas(64) uint16_t x[2][2][TILE_TOKENS][32]; /* [term][token tile] */
    _Alignas(64) float c[TILE_TOKENS][GROUP_ROWS];
    _Alignas(64) float acc[2][TILE_TOKENS][PASS_ROWS]; /* [token tile]: scaled blocks' sums */
    struct kt_amx_tiles tiles;
    float_tiles_config(&tiles);
    for (int64_t t0 = 0; t0 < n_tok; t0 += 2 * TILE_TOKENS) {
        const int64_t nt = min_i64(2 * TILE_TOKENS, n_tok - t0);
        const bool two_tiles = nt > TILE_TOKENS;
        const uint8_t *tok = act + (size_t)t0 * act_bytes;
        memset(x, 0, sizeof x); /* the rows past nt stay zero */
        for (int64_t r0 = 0; r0 < n_rows; r0 += PASS_ROWS) {
            const bool two_groups = n_rows - r0 > GROUP_ROWS;
            const uint8_t *w0 = (const uint8_t *)w + (size_t)(r0 / GROUP_ROWS) * L->group_bytes;
            const uint8_t *w1 = two_groups ? w0 + L->group_bytes : w0;
            float *y0 = y + t0 * y_stride + r0;
            if (L->scaled)
                memset(acc, 0, sizeof acc);
            for (int64_t b = 0; b < L->blocks; b++) {
                const uint8_t *b0 = w0 + (size_t)b * L->block_bytes, *b1 = w1 + (size_t)b * L->block_bytes;
                float_zero_sums(&tiles);
                for (int64_t kk = 0; kk < L->steps; kk++) {
                    bf16_activations(tok, act_bytes, nt, n, b * L->steps + kk, x);
                    float_step(&tiles, x, b0 + kk * BF16_TILE_BYTES, b1 + kk * BF16_TILE_BYTES, two_groups, two_tiles);
                }
                if (!L->scaled) {
                    kt_amx_store(&tiles, TILE_Y00, c, sizeof c[0]);
                    store_tile(c, nt, n_rows - r0, y0, y_stride);
                    if (two_groups) {
                        kt_amx_store(&tiles, TILE_Y01, c, sizeof c[0]);
                        store_tile(c, nt, n_rows - r0 - GROUP_ROWS, y0 + GROUP_ROWS, y_stride);
                    }
                    if (two_tiles) {
                        kt_amx_store(&tiles, TILE_Y10, c, sizeof c[0]);
                        store_tile(c, nt - TILE_TOKENS, n_rows - r0, y0 + TILE_TOKENS * y_stride, y_stride);
                        if (two_groups) {
                            kt_amx_store(&tiles, TILE_Y11, c, sizeof c[0]);
                            store_tile(c, nt - TILE_TOKENS, n_rows - r0 - GROUP_ROWS,
                                       y0 + TILE_TOKENS * y_stride + GROUP_ROWS, y_stride);
                        }
                    }
                    continue;
                }
                const size_t d_off = (size_t)L->steps * BF16_TILE_BYTES;
                const __m512 d0 = _mm512_loadu_ps((const float *)(const void *)(b0 + d_off));
                kt_amx_store(&tiles, TILE_Y00, c, sizeof c[0]);
                fp8_scale_tile(c, d0, acc[0], 0);
                if (two_tiles) {
                    kt_amx_store(&tiles, TILE_Y10, c, sizeof c[0]);
                    fp8_scale_tile(c, d0, acc[1], 0);
                }
                if (two_groups) {
                    const __m512 d1 = _mm512_loadu_ps((const float *)(const void *)(b1 + d_off));
                    kt_amx_store(&tiles, TILE_Y01, c, sizeof c[0]);
                    fp8_scale_tile(c, d1, acc[0], 1);
                    if (two_tiles) {
                        kt_amx_store(&tiles, TILE_Y11, c, sizeof c[0]);
                        fp8_scale_tile(c, d1, acc[1], 1);
                    }
                }
            }
            if (!L->scaled)
                continue;
            for (int i = 0; i < (two_tiles ? 2 : 1); i++)
                for (int64_t t = 0; t < min_i64(TILE_TOKENS, nt - TILE_TOKENS * i); t++)
                    for (int g = 0; g < (two_groups ? 2 : 1); g++)
                        _mm512_mask_storeu_ps(y0 + (TILE_TOKENS * i + t) * y_stride + GROUP_ROWS * g,
                                              first_lanes(n_rows - r0 - GROUP_ROWS * g),
                                              _mm512_load_ps(&acc[i][t][GROUP_ROWS * g]));
        }
    }
    kt_amx_release(&tiles);
}

/* BF16: one block of all ceil(n/32) steps, unscaled. */
static void bf16_gemm(int64_t n, const void *w, int64_t n_rows, const void *a, size_t act_bytes, int64_t n_tok,
                      float *y, int64_t y_stride)
{
    const struct float_layout L = {
        .group_bytes = bf16_group_bytes(n), .block_bytes = 0, .blocks = 1, .steps = (n + 31) / 32, .scaled = false};
    float_gemm(n, w, n_rows, a, act_bytes, n_tok, y, y_stride, &L);
}

/* FP8_B128: blocks of 128 elements, four steps each, scaled. */
static void fp8_gemm(int64_t n, const void *w, int64_t n_rows, const void *a, size_t act_bytes, int64_t n_tok,
                     float *y, int64_t y_stride)
{
    const struct float_layout L = {.group_bytes = fp8_group_bytes(n),
                                   .block_bytes = FP8_BLOCK_BYTES,
                                   .blocks = n / KT_QK_FP8,
                                   .steps = KT_QK_FP8 / 32,
                                   .scaled = true};
    float_gemm(n, w, n_rows, a, act_bytes, n_tok, y, y_stride, &L);
}

/* ---- the formats ------------------------------------------------------------------- */

/*
 * Below a few tokens the AVX-512 kernels read the shared layouts faster than
 * the tiles: each step of K costs the tiles a B-tile unpack (and Q8_0 / Q4_0
 * a C-tile store and per (token, row) the block's scaling) whatever the
 * token count.  Measured on one core of a Sapphire-Rapids-class VM
 * (2026-12-03, 2048 x 7168 matrices streamed from memory, both kernels
 * prefetching), AVX-512 time / tiles time: Q4_K 0.70 at 1 token, 0.80 at 8,
 * 1.03 at 16, 1.30 at 32, 1.56 at 64; Q8_0 1.00 at 1, 1.19 at 4, 1.29 at 8,
 * 1.50 at 32; Q4_0 0.87 at 1, 0.96 at 4, 1.21 at 6, 1.31 at 32.  The
 * emulated build takes the tiles at every count, so the tests check them at
 * every shape.
 */
#ifdef KT_AMX_EMULATE
#define AMX_MIN_TOKENS_Q8_0 1
#define AMX_MIN_TOKENS_Q4_0 1
#define AMX_MIN_TOKENS_Q4_K 1
#else
#define AMX_MIN_TOKENS_Q8_0 4
#define AMX_MIN_TOKENS_Q4_0 6
#define AMX_MIN_TOKENS_Q4_K 16
#endif

static void q8_0_gemm(int64_t n, const void *w, int64_t n_rows, const void *a, size_t act_bytes, int64_t n_tok,
                      float *y, int64_t y_stride)
{
    (n_tok < AMX_MIN_TOKENS_Q8_0 ? kt_packed_q8_0_avx512.gemm : q8_0_tiles)(n, w, n_rows, a, act_bytes, n_tok, y,
                                                                      y_stride);
}

static void q4_0_gemm(int64_t n, const void *w, int64_t n_rows, const void *a, size_t act_bytes, int64_t n_tok,
                      float *y, int64_t y_stride)
{
    (n_tok < AMX_MIN_TOKENS_Q4_0 ? kt_packed_q4_0_avx512.gemm : q4_0_tiles)(n, w, n_rows, a, act_bytes, n_tok, y,
                                                                      y_stride);
}

static void q4_K_gemm(int64_t n, const void *w, int64_t n_rows, const void *a, size_t act_bytes, int64_t n_tok,
                      float *y, int64_t y_stride)
{
    (n_tok < AMX_MIN_TOKENS_Q4_K ? kt_packed_q4_K_avx512.gemm : q4_K_tiles)(n, w, n_rows, a, act_bytes, n_tok, y,
                                                                      y_stride);
}

#define INT8_FORMAT(type, label, gemm_fn)                                                                    \
    {                                                                                                        \
        .name = #type ".r16" label, .rows = GROUP_ROWS, .exact = true, .group_bytes = type##_group_bytes,    \
        .pack = type##_pack, .gemm = gemm_fn,                                                                \
    }

const struct kt_packed_format KT_AMX_NAME(kt_packed_q8_0_amx) = INT8_FORMAT(q8_0, KT_AMX_LABEL, q8_0_gemm);
const struct kt_packed_format KT_AMX_NAME(kt_packed_q4_0_amx) = INT8_FORMAT(q4_0, KT_AMX_LABEL, q4_0_gemm);
const struct kt_packed_format KT_AMX_NAME(kt_packed_q4_K_amx) = INT8_FORMAT(q4_K, KT_AMX_LABEL, q4_K_gemm);
const struct kt_packed_format KT_AMX_NAME(kt_packed_q8_0_amx_tiles) = INT8_FORMAT(q8_0, KT_AMX_LABEL ".tiles", q8_0_tiles);
const struct kt_packed_format KT_AMX_NAME(kt_packed_q4_0_amx_tiles) = INT8_FORMAT(q4_0, KT_AMX_LABEL ".tiles", q4_0_tiles);
const struct kt_packed_format KT_AMX_NAME(kt_packed_q4_K_amx_tiles) = INT8_FORMAT(q4_K, KT_AMX_LABEL ".tiles", q4_K_tiles);

const struct kt_packed_format KT_AMX_NAME(kt_packed_bf16_amx) = {
    .name = "bf16.r16" KT_AMX_LABEL,
    .rows = GROUP_ROWS,
    .exact = false,
    .group_bytes = bf16_group_bytes,
    .pack = bf16_pack,
    .gemm = bf16_gemm,
};

const struct kt_packed_format KT_AMX_NAME(kt_packed_fp8_b128_amx) = {
    .name = "fp8_b128.r16" KT_AMX_LABEL,
    .rows = GROUP_ROWS,
    .exact = false,
    .group_bytes = fp8_group_bytes,
    .pack = fp8_pack,
    .gemm = fp8_gemm,
};
