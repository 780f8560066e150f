/*
 * amx_emulated.c - kernels/cpu/amx/packed_amx.c compiled a second time for
 * test_kernels_amx: tiles emulated in C (amx_ops.h), no -mamx flag, formats
 * renamed kt_packed_*_amx_emulated.  Its steps between tile instructions are
 * AVX-512 (tests/CMakeLists.txt gives this file the avx512 level's flags), so
 * the test calls it only after checking the CPU has that level.
 */
#define KT_AMX_EMULATE 1
#define KT_AMX_NAME(x) x##_emulated
#include "cpu/amx/packed_amx.c"
