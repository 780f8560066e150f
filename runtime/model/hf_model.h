/*
 * hf_model.h - a Hugging Face checkpoint directory (config.json, safetensors
 * shards, tokenizer files) as the deepseek2 GGUF model kt runs: a kt_gguf
 * built in memory whose keys are config.json's and the tokenizer's
 * (hf_config.h, hf_tokenizer.h) and whose tensors carry the GGUF names,
 * shapes and kt types of the checkpoint's weights, so kt_model_from_gguf
 * checks a directory with the rules it has for a file and nothing above the
 * model layer sees a second format.
 *
 * How each stored form becomes a kt type (never a lossy re-quantization):
 *   BF16 / F16 / F32 linears      the same type, read in place from the shard
 *                                 mapping (copied when misaligned)
 *   block FP8 (128 x 128)         KT_TYPE_FP8_B128 rows: the same bytes, each
 *                                 128-wide block with its F32 scale (lossless);
 *                                 another block shape, or rows not a multiple of
 *                                 128 wide: F32, W = f32(e4m3) * scale_inv, the
 *                                 definition's own arithmetic
 *   INT4 pack-quantized, group 32 KT_TYPE_Q4_0 blocks: the nibbles kept, the
 *                                 BF16 scale as FP16 (lossless; a scale FP16
 *                                 cannot hold exactly refuses the load, naming
 *                                 the tensor); another group size: F32
 *   norms, the router, its bias   F32 (exact from BF16 / F16)
 * Dense tensors that need converting are KT_TENSOR_DEFERRED: nothing is
 * converted until kt_hf_weights_ready (the engine calls it through
 * kt_model_weights_ready), so kt-run --info and kt-place read headers only.
 * Routed experts are KT_TENSOR_STREAMED: the stacked {E, f, Ne} tensor kt's
 * table names never exists in memory; the expert store reads expert x's slab
 * with kt_hf_read_expert, converted from that expert's own tensors, and the
 * shard pages it read are given back at once, so the store's copy is the only
 * one (peak memory close to the footprint).
 */
#ifndef KT_HF_MODEL_H
#define KT_HF_MODEL_H

#include <stdint.h>

#include "status.h"

struct kt_gguf;
struct kt_gguf_tensor;
struct kt_hf_weights;

/* Opens DIR as above.  *out is the GGUF (its tensor table complete, no
 * weight read) and *weights what it reads and converts from; both stay valid
 * until kt_gguf_close(*out), which frees the weights too.  Messages start
 * with "DIR: ". */
kt_status kt_hf_model_open(const char *dir, struct kt_gguf **out, struct kt_hf_weights **weights, kt_err *err);

/* Converts every deferred tensor into memory of its own and points its data
 * there, calling progress(ctx, bytes) (may be NULL) as each tensor is done;
 * later calls return at once.  Safe from several threads. */
kt_status kt_hf_weights_ready(struct kt_hf_weights *w, void (*progress)(void *ctx, uint64_t bytes), void *ctx,
                              kt_err *err);

/* Expert x's slab of the streamed stacked tensor t (t->nbytes / n_expert
 * bytes: its rows in t's type) into dst. */
kt_status kt_hf_read_expert(struct kt_hf_weights *w, const struct kt_gguf_tensor *t, uint32_t x, void *dst,
                            kt_err *err);

/* Rows [first, first + n) of that slab (of t->ne[1]) into dst; the shard
 * pages are given back once the last row is read. */
/* Starts reading expert x of t ahead (madvise WILLNEED on its tensors' pages); nothing when t is not one of ours. */
void kt_hf_expert_will_need(const struct kt_hf_weights *w, const struct kt_gguf_tensor *t, uint32_t x);
kt_status kt_hf_read_expert_rows(struct kt_hf_weights *w, const struct kt_gguf_tensor *t, uint32_t x, int64_t first,
                                 int64_t n, void *dst, kt_err *err);

/* Bytes of checkpoint data (shard bytes of the weights kt uses) behind the
 * table, for load throughput. */
uint64_t kt_hf_stored_bytes(const struct kt_hf_weights *w);

#endif
