/*
 * amx_ops.h - the AMX tile operations kt's AMX kernels are written against:
 * the real instructions, or (with KT_AMX_EMULATE) a scalar model of them.
 *
 * Normally each op is the compiler's intrinsic for LDTILECFG, TILELOADD,
 * TILEZERO, TDPBSSD, TDPBUSD, TDPBF16PS, TILESTORED or TILERELEASE.  Built
 * with KT_AMX_EMULATE, each is plain C following the operation the Intel SDM
 * gives for that instruction, on a register file the caller keeps on its
 * stack (struct kt_amx_tiles), so the kernels run and are tested on CPUs
 * without AMX (tests/test_kernels_amx.c).  The model also checks what the CPU
 * would raise #UD on (an unconfigured tile, operand shapes that do not
 * match, one tile used twice by a dot product) and aborts there: a kernel
 * whose configuration passes emulated is one the hardware accepts.
 *
 * Tile numbers must be integer literals after macro expansion (the
 * instructions encode them).  The real ops must never run without the
 * kernel's XTILEDATA permission for this process (dispatch.c reaches them
 * only through the amx level, which exists only after arch_prctl granted
 * it), and a function that configures tiles must release them before it
 * returns: tile state left configured costs every context switch and
 * confuses the next user of the tiles.
 */
#ifndef KT_CPU_AMX_OPS_H
#define KT_CPU_AMX_OPS_H

#include <assert.h>
#include <stdint.h>

/* The 64-byte operand of LDTILECFG.  Palette 1: tiles 0..7, each at most
 * 16 rows of 64 bytes; a tile with rows = colsb = 0 is unused. */
struct kt_amx_tilecfg {
    uint8_t palette;      /* 1 */
    uint8_t start_row;    /* 0: where an interrupted TILELOADD resumes */
    uint8_t reserved[14]; /* zero */
    uint16_t colsb[16];   /* bytes per row of tile t (t < 8; the rest zero) */
    uint8_t rows[16];     /* rows of tile t */
};
static_assert(sizeof(struct kt_amx_tilecfg) == 64, "LDTILECFG reads 64 bytes");

#define KT_AMX_TILES 8
#define KT_AMX_MAX_ROWS 16
#define KT_AMX_MAX_COLSB 64

#ifndef KT_AMX_EMULATE

#include <immintrin.h>

/* The tiles live in the CPU; this stands in for the emulator's state. */
struct kt_amx_tiles {
    char unused;
};

/* gcc's tile intrinsics are asm statements that do not tell the compiler
 * they read memory (only TILESTORED says it writes; LDTILECFG names 8 of its
 * 64 bytes): without these barriers the stores filling a buffer or the
 * config could be moved past (or dropped before) the instruction reading it. */
#define KT_AMX_READS_MEMORY() __asm__ volatile("" ::: "memory")

#define kt_amx_config(s, cfg)                                                                     \
    do {                                                                                          \
        (void)(s);                                                                                \
        __asm__ volatile("" ::"m"(*(const struct kt_amx_tilecfg *)(cfg)) : "memory");             \
        _tile_loadconfig(cfg);                                                                    \
    } while (0)
#define kt_amx_load(s, t, base, stride) \
    do { (void)(s); KT_AMX_READS_MEMORY(); _tile_loadd(t, base, stride); } while (0)
#define kt_amx_store(s, t, base, stride) \
    do { (void)(s); _tile_stored(t, base, stride); } while (0)
#define kt_amx_zero(s, t) \
    do { (void)(s); _tile_zero(t); } while (0)
#define kt_amx_dpbssd(s, c, a, b) \
    do { (void)(s); _tile_dpbssd(c, a, b); } while (0)
#define kt_amx_dpbusd(s, c, a, b) \
    do { (void)(s); _tile_dpbusd(c, a, b); } while (0)
#define kt_amx_dpbf16ps(s, c, a, b) \
    do { (void)(s); _tile_dpbf16ps(c, a, b); } while (0)
#define kt_amx_release(s) \
    do { (void)(s); _tile_release(); } while (0)

#else /* KT_AMX_EMULATE: the SDM's pseudo-code, one element at a time */

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct kt_amx_tiles {
    struct kt_amx_tilecfg cfg;
    bool configured;
    /* tmm0..tmm7; bytes past a tile's rows x colsb are kept zero */
    uint8_t tile[KT_AMX_TILES][KT_AMX_MAX_ROWS][KT_AMX_MAX_COLSB];
};

/* Where the CPU would raise #UD (or #GP for a bad LDTILECFG operand). */
static inline void kt_amx_emu_fault(const char *op, const char *why)
{
    fprintf(stderr, "emulated AMX: %s faults: %s\n", op, why);
    abort();
}

/* LDTILECFG: palette 0 returns to the init state; all tiles start zeroed. */
static inline void kt_amx_emu_config(struct kt_amx_tiles *s, const struct kt_amx_tilecfg *cfg)
{
    memset(s, 0, sizeof *s);
    if (cfg->palette == 0)
        return;
    if (cfg->palette != 1)
        kt_amx_emu_fault("ldtilecfg", "palette other than 0 or 1");
    for (int i = 0; i < 14; i++)
        if (cfg->reserved[i])
            kt_amx_emu_fault("ldtilecfg", "reserved byte set");
    for (int t = 0; t < 16; t++) {
        const bool used = cfg->rows[t] || cfg->colsb[t];
        if (used && (t >= KT_AMX_TILES || !cfg->rows[t] || !cfg->colsb[t] || cfg->rows[t] > KT_AMX_MAX_ROWS ||
                     cfg->colsb[t] > KT_AMX_MAX_COLSB))
            kt_amx_emu_fault("ldtilecfg", "tile shape outside palette 1");
    }
    if (cfg->start_row)
        kt_amx_emu_fault("ldtilecfg", "start_row set (kt never restarts a load)");
    s->cfg = *cfg;
    s->configured = true;
}

static inline void kt_amx_emu_check_tile(const struct kt_amx_tiles *s, int t, const char *op)
{
    if (!s->configured)
        kt_amx_emu_fault(op, "tiles not configured");
    if (t < 0 || t >= KT_AMX_TILES || !s->cfg.rows[t])
        kt_amx_emu_fault(op, "tile not configured");
}

/* TILELOADD: rows x colsb bytes from base + row * stride; the rest zeroed. */
static inline void kt_amx_emu_load(struct kt_amx_tiles *s, int t, const void *base, long stride)
{
    kt_amx_emu_check_tile(s, t, "tileloadd");
    memset(s->tile[t], 0, sizeof s->tile[t]);
    for (int r = 0; r < s->cfg.rows[t]; r++)
        memcpy(s->tile[t][r], (const uint8_t *)base + (long)r * stride, s->cfg.colsb[t]);
}

/* TILESTORED: rows x colsb bytes to base + row * stride. */
static inline void kt_amx_emu_store(const struct kt_amx_tiles *s, int t, void *base, long stride)
{
    kt_amx_emu_check_tile(s, t, "tilestored");
    for (int r = 0; r < s->cfg.rows[t]; r++)
        memcpy((uint8_t *)base + (long)r * stride, s->tile[t][r], s->cfg.colsb[t]);
}

static inline void kt_amx_emu_zero(struct kt_amx_tiles *s, int t)
{
    kt_amx_emu_check_tile(s, t, "tilezero");
    memset(s->tile[t], 0, sizeof s->tile[t]);
}

/* The shape rules of every tile dot product: C (M x N dwords) += A (M x K
 * dwords) . B (K x N dwords), three different tiles. */
static inline void kt_amx_emu_check_dot(const struct kt_amx_tiles *s, int c, int a, int b, const char *op)
{
    kt_amx_emu_check_tile(s, c, op);
    kt_amx_emu_check_tile(s, a, op);
    kt_amx_emu_check_tile(s, b, op);
    const struct kt_amx_tilecfg *g = &s->cfg;
    if (c == a || c == b || a == b)
        kt_amx_emu_fault(op, "operands are not three different tiles");
    if (g->colsb[a] % 4 || g->colsb[c] % 4 || g->colsb[b] % 4)
        kt_amx_emu_fault(op, "a row is not whole dwords");
    if (g->colsb[a] / 4 != g->rows[b])
        kt_amx_emu_fault(op, "A's dwords per row != B's rows (K)");
    if (g->colsb[c] != g->colsb[b])
        kt_amx_emu_fault(op, "C's bytes per row != B's (N)");
    if (g->rows[c] != g->rows[a])
        kt_amx_emu_fault(op, "C's rows != A's rows (M)");
}

static inline uint32_t kt_amx_emu_dword(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* TDPBSSD / TDPBUSD: per C dword, the four byte products of each of the K
 * dword pairs are added to it in 32-bit arithmetic that wraps (no saturation);
 * A's bytes are signed unless a_unsigned, B's are signed. */
static inline void kt_amx_emu_dpb(struct kt_amx_tiles *s, int c, int a, int b, bool a_unsigned, const char *op)
{
    kt_amx_emu_check_dot(s, c, a, b, op);
    const int M = s->cfg.rows[c], K = s->cfg.colsb[a] / 4, N = s->cfg.colsb[c] / 4;
    for (int m = 0; m < M; m++) {
        for (int n = 0; n < N; n++) {
            uint32_t acc = kt_amx_emu_dword(&s->tile[c][m][4 * n]);
            for (int k = 0; k < K; k++)
                for (int i = 0; i < 4; i++) {
                    const uint8_t x = s->tile[a][m][4 * k + i], y = s->tile[b][k][4 * n + i];
                    const int32_t xv = a_unsigned ? (int32_t)x : (int32_t)(int8_t)x;
                    acc += (uint32_t)(xv * (int32_t)(int8_t)y);
                }
            memcpy(&s->tile[c][m][4 * n], &acc, sizeof acc);
        }
    }
}

/* Denormals in and out of TDPBF16PS are zeros of the same sign (DAZ, FTZ). */
static inline float kt_amx_emu_flush(float x)
{
    return fpclassify(x) == FP_SUBNORMAL ? copysignf(0.0f, x) : x;
}

static inline float kt_amx_emu_bf16(const uint8_t *p)
{
    const uint32_t bits = (uint32_t)p[0] << 16 | (uint32_t)p[1] << 24;
    float f;
    memcpy(&f, &bits, sizeof f);
    return kt_amx_emu_flush(f);
}

/* TDPBF16PS: per C float and each of the K bf16 pairs, C += a0*b0 then
 * C += a1*b1, each accumulation one fused multiply-add rounded to nearest
 * even (MXCSR is not consulted), denormal inputs and outputs flushed. */
static inline void kt_amx_emu_dpbf16ps(struct kt_amx_tiles *s, int c, int a, int b)
{
    kt_amx_emu_check_dot(s, c, a, b, "tdpbf16ps");
    const int M = s->cfg.rows[c], K = s->cfg.colsb[a] / 4, N = s->cfg.colsb[c] / 4;
    for (int m = 0; m < M; m++) {
        for (int n = 0; n < N; n++) {
            float acc;
            memcpy(&acc, &s->tile[c][m][4 * n], sizeof acc);
            acc = kt_amx_emu_flush(acc);
            for (int k = 0; k < K; k++)
                for (int e = 0; e < 2; e++) {
                    const float x = kt_amx_emu_bf16(&s->tile[a][m][4 * k + 2 * e]);
                    const float y = kt_amx_emu_bf16(&s->tile[b][k][4 * n + 2 * e]);
                    acc = kt_amx_emu_flush(fmaf(x, y, acc));
                }
            memcpy(&s->tile[c][m][4 * n], &acc, sizeof acc);
        }
    }
}

#define kt_amx_config(s, cfg) kt_amx_emu_config(s, cfg)
#define kt_amx_load(s, t, base, stride) kt_amx_emu_load(s, t, base, (long)(stride))
#define kt_amx_store(s, t, base, stride) kt_amx_emu_store(s, t, base, (long)(stride))
#define kt_amx_zero(s, t) kt_amx_emu_zero(s, t)
#define kt_amx_dpbssd(s, c, a, b) kt_amx_emu_dpb(s, c, a, b, false, "tdpbssd")
#define kt_amx_dpbusd(s, c, a, b) kt_amx_emu_dpb(s, c, a, b, true, "tdpbusd")
#define kt_amx_dpbf16ps(s, c, a, b) kt_amx_emu_dpbf16ps(s, c, a, b)
#define kt_amx_release(s) memset(s, 0, sizeof *(s))

#endif /* KT_AMX_EMULATE */

#endif
