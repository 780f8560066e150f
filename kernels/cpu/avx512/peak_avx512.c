/*
 * peak_avx512.c - AVX-512 throughput loops for kt-bench's peaks
 * (peak_loops.h): 10 independent 512-bit FMA chains and 10 independent
 * vpdpbusd (VNNI) chains.  Built with AVX-512 flags; must never be called
 * unless kt_peak_loops_for(KT_ISA_AVX512) handed it out.
 */
#include <immintrin.h>

#include "cpu/peak_loops.h"

#define CHAINS 10

uint64_t kt_peak_fma_avx512(uint64_t iters, float *sink)
{
    __m512 acc[CHAINS];
    for (int k = 0; k < CHAINS; k++)
        acc[k] = _mm512_set1_ps(0.5f + 0.01f * (float)k);
    const __m512 m = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-6f); /* converges: no inf, no denormal */
    for (uint64_t i = 0; i < iters; i++)
        for (int k = 0; k < CHAINS; k++)
            acc[k] = _mm512_fmadd_ps(acc[k], m, c);
    __m512 s = acc[0];
    for (int k = 1; k < CHAINS; k++)
        s = _mm512_add_ps(s, acc[k]);
    *sink = _mm512_reduce_add_ps(s);
    return iters * CHAINS * 16 * 2;
}

uint64_t kt_peak_dot_int8_avx512(uint64_t iters, float *sink)
{
    __m512i acc[CHAINS], b[CHAINS];
    for (int k = 0; k < CHAINS; k++) {
        acc[k] = _mm512_setzero_si512();
        b[k] = _mm512_set1_epi8((char)(k - 5));
    }
    __m512i a = _mm512_set1_epi8(3);
    for (uint64_t i = 0; i < iters; i++) {
        __asm__ volatile("" : "+v"(a)); /* keeps the loop honest, as in the AVX2 one */
        for (int k = 0; k < CHAINS; k++)
            acc[k] = _mm512_dpbusd_epi32(acc[k], a, b[k]);
    }
    __m512i s = acc[0];
    for (int k = 1; k < CHAINS; k++)
        s = _mm512_add_epi32(s, acc[k]);
    /* the lanes wrap (they are only a sink): summed unsigned, as _mm512_reduce_add_epi32's signed adds
     * would overflow, which is undefined in C (UBSan caught it in kt-bench model's peak) */
    uint32_t lanes[16], sum = 0;
    _mm512_storeu_si512(lanes, s);
    for (int k = 0; k < 16; k++)
        sum += lanes[k];
    *sink = (float)sum;
    return iters * CHAINS * 64 * 2;
}
