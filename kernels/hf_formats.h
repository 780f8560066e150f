/*
 * hf_formats.h - the weight formats Hugging Face checkpoints ship natively
 * (compressed-tensors INT4, DeepSeek-V3 block FP8, MXFP4, BF16), decoded to
 * F32 exactly as each format defines them: the scalar reference every faster
 * kernel for these formats is compared with, bit for bit.  Encoders for FP8
 * and INT4 (round to nearest even, as the formats' own quantizers) write
 * kt-synth's synthetic checkpoints.
 *
 * Pointers are raw tensor bytes as stored (little-endian, possibly unaligned:
 * a safetensors shard aligns nothing), so every multi-byte value is read with
 * memcpy.  Callers pass shapes already checked against the tensors' sizes;
 * these functions never allocate and never fail.  Where a format's own
 * tooling rounds its result to BF16, the value here is the exact product
 * before that rounding (runtime/model/README.md, "Native weight formats").
 */
#ifndef KT_HF_FORMATS_H
#define KT_HF_FORMATS_H

#include <assert.h>
#include <stdbool.h>
#include <stdint.h>

/* ---- scalar codes -------------------------------------------------------------- */

/* OCP FP8 E4M3 ("e4m3fn", safetensors F8_E4M3): s.eeee.mmm, bias 7, no
 * infinities, S.1111.111 is NaN, largest finite 448. */
float kt_fp8_e4m3_to_f32(uint8_t code);

/* OCP FP4 E2M1 (low 4 bits of code): s.ee.m, bias 1, values 0, 0.5, 1, 1.5,
 * 2, 3, 4, 6 and their negatives (-0 included). */
float kt_e2m1_to_f32(uint8_t code);

/* OCP E8M0 scale: 2^(code - 127); 255 is NaN; 0 is 2^-127 (an F32 subnormal). */
float kt_e8m0_to_f32(uint8_t code);

/* ggml's E8M0 for GGUF MXFP4, which scales E2M1 values doubled to integers:
 * 2^(code - 128) for every code, exact (0 and 1 are F32 subnormals, 255 is
 * 2^127, not NaN). */
float kt_e8m0_half_to_f32(uint8_t code);

/* ---- rows of native weight tensors ---------------------------------------------- */

/* compressed-tensors pack-quantized INT4, symmetric, per-group scales.
 * weight_packed: (rows, ceil(cols/8)) I32; word w of a row holds elements
 * 8w..8w+7, element 8w+k in bits 4k..4k+3 as q+8 (q in [-8, 7]); padding
 * nibbles past cols are ignored.  weight_scale: (rows, ceil(cols/group_size))
 * BF16.  out[c] = q[c] * scale[c / group_size]; the last group may be partial. */
void kt_int4_pack_row_to_f32(const void *weight_packed, const void *weight_scale, int64_t cols,
                             int64_t group_size, int64_t row, float *out);

/* DeepSeek-V3 block FP8.  weight: (rows, cols) F8_E4M3;  weight_scale_inv:
 * (ceil(rows/block_rows), ceil(cols/block_cols)) F32 (block 128x128 in the
 * real checkpoints); edge blocks may be partial.
 * out[c] = fp8(weight[row][c]) * scale_inv[row / block_rows][c / block_cols],
 * one F32 multiply. */
void kt_fp8_block_row_to_f32(const void *weight, const void *weight_scale_inv, int64_t cols, int64_t block_rows,
                             int64_t block_cols, int64_t row, float *out);

/* MXFP4 as Hugging Face checkpoints store it (gpt-oss): blocks (rows, cols/32,
 * 16) U8 and scales (rows, cols/32) U8 (E8M0); cols is a multiple of 32.
 * Element 2j of a block is the low nibble of byte j, element 2j+1 the high one.
 * out = e2m1 * 2^(scale-127), one F32 multiply; a scale of 255 makes the whole
 * block NaN (OCP MX v1.0). */
void kt_mxfp4_row_to_f32(const void *blocks, const void *scales, int64_t cols, int64_t row, float *out);

/* BF16 (rows, cols): widened exactly. */
void kt_bf16_row_to_f32(const void *weight, int64_t cols, int64_t row, float *out);

/* ---- GGUF's MXFP4 (ggml type 39) ------------------------------------------------ */

/* ggml's block: the E8M0 byte, then 16 bytes whose low nibbles are elements
 * 0..15 and high nibbles elements 16..31 (not HF's interleaving). */
struct kt_block_mxfp4 { uint8_t e; uint8_t qs[16]; };
static_assert(sizeof(struct kt_block_mxfp4) == 17, "mxfp4 block size");

/* n (a multiple of 32) elements of GGUF MXFP4, as ggml decodes them:
 * (2 * e2m1) * 2^(e-128), which is e2m1 * 2^(e-127) for every e; 255 is not
 * NaN here (ggml's scale for it is 2^127 on the doubled values), only
 * products past the F32 range become inf. */
void kt_mxfp4_gguf_to_f32(const void *blocks, float *out, int64_t n);

/* The block's 32 E2M1 values doubled, in element order: integers in [-12, 12]
 * (2 * e2m1(code)), so element i is q[i] * kt_e8m0_half_to_f32(b->e). */
void kt_unpack_mxfp4(const struct kt_block_mxfp4 *b, int8_t q[32]);

/* ---- block FP8 as kt's row-contiguous KT_TYPE_FP8_B128 (quant.h) ----------------- */

/* Row `row` of a DeepSeek-V3 block-FP8 tensor, weight (rows, cols) F8_E4M3 and
 * weight_scale_inv (ceil(rows/128), cols/128) F32, as cols/128 blocks of
 * struct kt_block_fp8_b128 at dst_row: block j's d = scale_inv[row/128][j], its
 * q the row's bytes 128j .. 128j+127 unchanged.  False, with dst_row in an
 * unspecified state, when cols is not a positive multiple of 128, row is not in
 * [0, rows), a weight byte is the E4M3 NaN (0x7f, 0xff) or a scale is not
 * finite: the FP8_B128 kernels assume none of these. */
bool kt_fp8_b128_from_hf(const void *weight, const void *weight_scale_inv, int64_t rows, int64_t cols,
                         int64_t row, void *dst_row);

/* True when n elements (a multiple of 128) of FP8_B128 have finite scales and
 * no NaN codes, the precondition of every FP8_B128 kernel. */
bool kt_fp8_b128_check_row(const void *row, int64_t n);

/* ---- compressed-tensors INT4 as Q4_0 --------------------------------------------- */

/* Row `row` of an INT4 pack-quantized tensor with group size 32 (weight_packed
 * (rows, cols/8) I32, weight_scale (rows, cols/32) BF16) as cols/32 Q4_0 blocks
 * at dst: each nibble (q + 8) kept, the group's scale as the block's FP16 d, so
 * Q4_0's d * (nibble - 8) is q * scale bit for bit.  False (dst unspecified)
 * when cols is not a positive multiple of 32 or a scale is not exactly an FP16
 * value (not finite, past 65504, or below 2^-17 where FP16 subnormals drop
 * BF16's bits): a loader must then keep another form, never round. */
bool kt_q4_0_from_int4_row(const void *weight_packed, const void *weight_scale, int64_t cols, int64_t row,
                           void *dst);

/* ---- encoders: F32 to the native formats (kt-synth's HF directories) ------------ */

/* F32 to OCP E4M3 (e4m3fn), rounded to nearest, ties to even, saturating:
 * |x| >= 448 (infinities included) gives ±448 (0x7E / 0xFE), NaN gives 0x7F;
 * values below the smallest subnormal (2^-9) round to ±0 or ±2^-9.
 * kt_fp8_e4m3_to_f32(kt_f32_to_fp8_e4m3(x)) is the E4M3 value nearest x. */
uint8_t kt_f32_to_fp8_e4m3(float x);

/* One stripe of block FP8: rows (<= the block's rows) x cols of w, row-major,
 * quantized with one scale per block_cols columns of the stripe:
 * scale_inv[j] = max|w| over the block / 448 (1 for an all-zero block),
 * q = kt_f32_to_fp8_e4m3(w / scale_inv[j]).  q: rows x cols codes;
 * scale_inv: ceil(cols / block_cols) F32 values. */
void kt_fp8_block_stripe_from_f32(const float *w, int64_t rows, int64_t cols, int64_t block_cols, uint8_t *q,
                                  float *scale_inv);

/* One row of cols F32 values to compressed-tensors pack-quantized INT4 (the
 * layout kt_int4_pack_row_to_f32 reads): per group of group_size, scale =
 * BF16 (nearest even) of max|w| / 7, q = clamp(round-half-even(w / scale),
 * -8, 7) (q = 0 where the scale is 0).  packed_row: ceil(cols/8) I32 words
 * (padding nibbles 0); scale_row: ceil(cols/group_size) BF16.  Decoding
 * gives q * scale exactly, and |w - q * scale| <= scale / 2 (up to one F32
 * rounding of w / scale at a tie), i.e. <= max|w| / 14 * (1 + 2^-8) with
 * the BF16 rounding of the scale. */
void kt_int4_pack_row_from_f32(const float *w, int64_t cols, int64_t group_size, void *packed_row, void *scale_row);

#endif
