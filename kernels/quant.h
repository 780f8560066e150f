/*
 * quant.h - weight and activation formats: GGML type ids, block layouts and
 * the per-type traits table.
 *
 * Type ids and block layouts are exactly those of the GGUF specification, so a
 * tensor's bytes in a file from the wild are used as they are.  Call sites
 * never switch on a type: they look its row up in kt_type_traits().  This file
 * depends on nothing of kt's (kernels sit on the bottom floor).
 */
#ifndef KT_QUANT_H
#define KT_QUANT_H

#include <assert.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* GGML type ids as stored in GGUF tensor infos.  Ids 4 and 5 are unused. */
enum kt_type {
    KT_TYPE_F32 = 0,
    KT_TYPE_F16 = 1,
    KT_TYPE_Q4_0 = 2,
    KT_TYPE_Q4_1 = 3,
    KT_TYPE_Q5_0 = 6,
    KT_TYPE_Q5_1 = 7,
    KT_TYPE_Q8_0 = 8,
    KT_TYPE_Q8_1 = 9,
    KT_TYPE_Q2_K = 10,
    KT_TYPE_Q3_K = 11,
    KT_TYPE_Q4_K = 12,
    KT_TYPE_Q5_K = 13,
    KT_TYPE_Q6_K = 14,
    KT_TYPE_Q8_K = 15,
    KT_TYPE_IQ2_XXS = 16,
    KT_TYPE_IQ2_XS = 17,
    KT_TYPE_IQ3_XXS = 18,
    KT_TYPE_IQ1_S = 19,
    KT_TYPE_IQ4_NL = 20,
    KT_TYPE_IQ3_S = 21,
    KT_TYPE_IQ2_S = 22,
    KT_TYPE_IQ4_XS = 23,
    KT_TYPE_I8 = 24,
    KT_TYPE_I16 = 25,
    KT_TYPE_I32 = 26,
    KT_TYPE_I64 = 27,
    KT_TYPE_F64 = 28,
    KT_TYPE_IQ1_M = 29,
    KT_TYPE_BF16 = 30,
    KT_TYPE_TQ1_0 = 34,
    KT_TYPE_TQ2_0 = 35,
    KT_TYPE_MXFP4 = 39,
    /* kt-internal, never in a GGUF file (ids >= KT_TYPE_GGUF_END are refused there) */
    KT_TYPE_FP8_B128 = 40, /* DeepSeek-V3 block FP8, one row's blocks self-contained */
    KT_TYPE_COUNT = 41,
};

#define KT_QK 32   /* elements per legacy block (Q4_0 .. Q8_1) */
#define KT_QK_K 256 /* elements per K-quant super-block */
#define KT_TYPE_GGUF_END 40 /* GGUF defines type ids below this; kt's own types start here */
#define KT_QK_FP8 128 /* elements per FP8_B128 block: one 128-column block of a 128x128 scale tile */

/* Half-precision scalars are stored as raw bits. */
typedef uint16_t kt_fp16;
typedef uint16_t kt_bf16;

/* ---- legacy 32-element blocks ------------------------------------------------ */

struct kt_block_q4_0 { kt_fp16 d; uint8_t qs[KT_QK / 2]; };                       /* x = d*(q-8) */
struct kt_block_q4_1 { kt_fp16 d, m; uint8_t qs[KT_QK / 2]; };                    /* x = d*q + m */
struct kt_block_q5_0 { kt_fp16 d; uint8_t qh[4]; uint8_t qs[KT_QK / 2]; };         /* x = d*(q-16); qh: u32 LE */
struct kt_block_q5_1 { kt_fp16 d, m; uint8_t qh[4]; uint8_t qs[KT_QK / 2]; };      /* x = d*q + m */
struct kt_block_q8_0 { kt_fp16 d; int8_t qs[KT_QK]; };                             /* x = d*q */
struct kt_block_q8_1 { kt_fp16 d, s; int8_t qs[KT_QK]; };                          /* s = d*sum(q) */

static_assert(sizeof(struct kt_block_q4_0) == 18, "q4_0 block size");
static_assert(sizeof(struct kt_block_q4_1) == 20, "q4_1 block size");
static_assert(sizeof(struct kt_block_q5_0) == 22, "q5_0 block size");
static_assert(sizeof(struct kt_block_q5_1) == 24, "q5_1 block size");
static_assert(sizeof(struct kt_block_q8_0) == 34, "q8_0 block size");
static_assert(sizeof(struct kt_block_q8_1) == 36, "q8_1 block size");

/* ---- K-quant 256-element super-blocks ---------------------------------------- */

/* 8 sub-blocks of 32; 6-bit scales and mins packed in scales[12] (see quant.c). */
struct kt_block_q4_K { kt_fp16 d, dmin; uint8_t scales[12]; uint8_t qs[KT_QK_K / 2]; };
struct kt_block_q5_K { kt_fp16 d, dmin; uint8_t scales[12]; uint8_t qh[KT_QK_K / 8]; uint8_t qs[KT_QK_K / 2]; };
/* 16 sub-blocks of 16; q in [0,63] stored as low 4 bits (ql) + high 2 bits (qh), value q-32. */
struct kt_block_q6_K { uint8_t ql[KT_QK_K / 2]; uint8_t qh[KT_QK_K / 4]; int8_t scales[KT_QK_K / 16]; kt_fp16 d; };
/* Activation format for K-quant dot products; never stored in model files. */
struct kt_block_q8_K { float d; int8_t qs[KT_QK_K]; int16_t bsums[KT_QK_K / 16]; };

static_assert(sizeof(struct kt_block_q4_K) == 144, "q4_K block size");
static_assert(sizeof(struct kt_block_q5_K) == 176, "q5_K block size");
static_assert(sizeof(struct kt_block_q6_K) == 210, "q6_K block size");
static_assert(sizeof(struct kt_block_q8_K) == 292, "q8_K block size");

/* ---- kt-internal native formats ----------------------------------------------- */

/* Block FP8 (DeepSeek-V3's F8_E4M3 weight with 128x128 weight_scale_inv),
 * converted at load so each row carries its own scales: x[i] = e4m3(q[i]) * d,
 * d = weight_scale_inv[row / 128][block].  q never holds the E4M3 NaN codes
 * 0x7f / 0xff (refused at load: kt_fp8_b128_check_row in hf_formats.h), and d is
 * finite; the SIMD kernels rely on both. */
struct kt_block_fp8_b128 { float d; uint8_t q[KT_QK_FP8]; };
static_assert(sizeof(struct kt_block_fp8_b128) == 132, "fp8_b128 block size");

/* ---- traits ------------------------------------------------------------------ */

/* n is always a multiple of block_elems. */
typedef void (*kt_to_float_fn)(const void *src, float *dst, int64_t n);
typedef void (*kt_from_float_fn)(const float *src, void *dst, int64_t n);
/* *out = dot(w, a) over n elements; w is of this type, a of its vec_dot_type. */
typedef void (*kt_vec_dot_fn)(int64_t n, float *out, const void *w, const void *a);

struct kt_type_traits {
    const char *name;            /* ggml's spelling: "f32", "q4_K", "bf16" */
    int64_t block_elems;         /* elements per block (1 for plain floats) */
    size_t block_bytes;          /* bytes per block */
    bool is_quantized;
    kt_to_float_fn to_float;     /* NULL: kt knows the size but not the math */
    kt_from_float_fn from_float; /* round-to-nearest reference quantization; NULL if none */
    enum kt_type vec_dot_type;   /* activation format vec_dot expects */
    kt_vec_dot_fn vec_dot;       /* scalar reference; NULL if none */
};

/* The traits row of a GGML type id, or NULL if the id is not a known type. */
const struct kt_type_traits *kt_type_traits(int type);

/* "q4_K" etc., or "unknown". */
const char *kt_type_name(int type);

/* Case-insensitive parse of a type name ("q4_k", "Q8_0", "bf16"); -1 if unknown. */
int kt_type_from_name(const char *name);

/* Bytes of n elements of a type; 0 if the type is unknown or n is not a whole
 * number of blocks. */
size_t kt_type_row_bytes(int type, int64_t n);

/* ---- scalar conversions ------------------------------------------------------ */

float kt_fp16_to_fp32(kt_fp16 h);
kt_fp16 kt_fp32_to_fp16(float f);   /* round to nearest even; overflow to inf; NaN stays NaN */
float kt_bf16_to_fp32(kt_bf16 h);
kt_bf16 kt_fp32_to_bf16(float f);   /* round to nearest even; NaN -> quiet NaN */

/* ---- block unpacking --------------------------------------------------------- */

/* The one place that knows where each bit of a block lives: to_float and the
 * scalar reference dot products read blocks through these.  q receives the
 * integer quants in element order (element i of the block is q[i]). */
void kt_unpack_q4_0(const struct kt_block_q4_0 *b, int8_t q[KT_QK]);  /* q-8 in [-8, 7] */
void kt_unpack_q4_1(const struct kt_block_q4_1 *b, uint8_t q[KT_QK]); /* q in [0, 15] */
void kt_unpack_q5_0(const struct kt_block_q5_0 *b, int8_t q[KT_QK]);  /* q-16 in [-16, 15] */
void kt_unpack_q5_1(const struct kt_block_q5_1 *b, uint8_t q[KT_QK]); /* q in [0, 31] */

/* 6-bit scale and min of sub-block j (0..7) from the packed scales[12] of a
 * Q4_K / Q5_K block.  Element i belongs to sub-block i / 32. */
void kt_k_scale_min(const uint8_t scales[12], int j, uint8_t *sc, uint8_t *m);
void kt_unpack_q4_K(const struct kt_block_q4_K *b, uint8_t q[KT_QK_K], uint8_t sc[8], uint8_t m[8]);
void kt_unpack_q5_K(const struct kt_block_q5_K *b, uint8_t q[KT_QK_K], uint8_t sc[8], uint8_t m[8]);
/* q-32 in [-32, 31]; element i is scaled by b->scales[i / 16]. */
void kt_unpack_q6_K(const struct kt_block_q6_K *b, int8_t q[KT_QK_K]);

#ifdef __cplusplus
}
#endif

#endif
