/*
 * peak_loops.c - which throughput loops exist here (see peak_loops.h).  The
 * loops live in the per-ISA directories, built with their ISA flags; this
 * file is built without them and must never execute a SIMD instruction
 * itself, only hand out the loops CPUID allows.
 */
#include "cpu/peak_loops.h"

#include <stddef.h>

#include "cpu/cpu_features.h"

const struct kt_peak_loops *kt_peak_loops_for(enum kt_isa isa)
{
    const struct kt_cpu_features *f = kt_cpu_features();
    (void)f;
#ifdef KT_HAVE_AVX2_KERNELS
    static const struct kt_peak_loops avx2 = {256, kt_peak_fma_avx2, kt_peak_dot_int8_avx2,
                                              "vpmaddubsw+vpmaddwd+vpaddd"};
    if (isa == KT_ISA_AVX2 && f->avx2 && f->fma)
        return &avx2;
#endif
#ifdef KT_HAVE_AVX512_KERNELS
    static const struct kt_peak_loops avx512 = {512, kt_peak_fma_avx512, kt_peak_dot_int8_avx512, "vpdpbusd"};
    if (isa == KT_ISA_AVX512 && f->avx512f && f->avx512bw && f->avx512vnni)
        return &avx512;
#endif
#ifdef KT_HAVE_AMX_KERNELS
    /* no f32 tile product: the level's floats are the avx512 ones (their peak is that level's) */
    static const struct kt_peak_loops amx = {8192, NULL, kt_peak_dot_int8_amx, "tdpbssd"};
    if (isa == KT_ISA_AMX && kt_cpu_kernels_for(KT_ISA_AMX) && f->amx_int8 && f->amx_permitted)
        return &amx;
#endif
    (void)isa;
    return NULL;
}
