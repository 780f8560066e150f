/*
 * peak_amx.c - the AMX-INT8 throughput loop for kt-bench's peaks
 * (peak_loops.h): TDPBSSD on full 16 x 64-byte tiles, four independent
 * accumulators (2 A x 2 B tiles), so the tile unit never waits on a result.
 * Built with the AMX flags; must never be called unless
 * kt_peak_loops_for(KT_ISA_AMX) handed it out (the process then holds the
 * XTILEDATA permission).
 */
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "cpu/amx/amx_ops.h"
#include "cpu/peak_loops.h"

uint64_t kt_peak_dot_int8_amx(uint64_t iters, float *sink)
{
    _Alignas(64) int8_t a[16][64], b[16][64];
    _Alignas(64) int32_t c[16][16];
    for (int r = 0; r < 16; r++)
        for (int k = 0; k < 64; k++) {
            a[r][k] = (int8_t)((r + k) % 7 - 3);
            b[r][k] = (int8_t)((r * 3 + k) % 5 - 2);
        }
    struct kt_amx_tilecfg cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < KT_AMX_TILES; t++) {
        cfg.rows[t] = 16;
        cfg.colsb[t] = 64;
    }
    struct kt_amx_tiles tiles;
    kt_amx_config(&tiles, &cfg);
    kt_amx_load(&tiles, 0, a, 64);
    kt_amx_load(&tiles, 1, a, 64);
    kt_amx_load(&tiles, 2, b, 64);
    kt_amx_load(&tiles, 3, b, 64);
    kt_amx_zero(&tiles, 4);
    kt_amx_zero(&tiles, 5);
    kt_amx_zero(&tiles, 6);
    kt_amx_zero(&tiles, 7);
    for (uint64_t i = 0; i < iters; i++) {
        kt_amx_dpbssd(&tiles, 4, 0, 2);
        kt_amx_dpbssd(&tiles, 5, 0, 3);
        kt_amx_dpbssd(&tiles, 6, 1, 2);
        kt_amx_dpbssd(&tiles, 7, 1, 3);
    }
    kt_amx_store(&tiles, 4, c, 64);
    kt_amx_release(&tiles);
    uint32_t sum = 0; /* the lanes wrap: summed unsigned (they are only a sink) */
    for (int r = 0; r < 16; r++)
        for (int k = 0; k < 16; k++)
            sum += (uint32_t)c[r][k];
    *sink = (float)sum;
    return iters * 4 * 16 * 16 * 64 * 2;
}
