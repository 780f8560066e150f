/*
 * hf_tensors.h - a Hugging Face checkpoint's tensors, matched against the
 * deepseek2 model its config describes: every linear weight kt needs, in
 * the stored form the quantization allows (BF16/F16/F32; block FP8 with its
 * weight_scale_inv; compressed-tensors INT4 weight_packed + weight_scale +
 * weight_shape, unless the config leaves the module unquantized), every norm,
 * router and selection bias, each checked for presence, dtype and shape,
 * scale grids included.  What it finds is summed by class, as kt_model
 * sums a GGUF's, so a plan can be made before any weight is read.
 *
 * It never reads a weight's data (only safetensors headers, through
 * kt_st_dir), and it refuses: a missing tensor, a wrong shape or dtype, an
 * FP8 weight without its scales or in a checkpoint that is not FP8, INT4
 * parts that disagree, naming the tensor and what was expected.
 */
#ifndef KT_HF_TENSORS_H
#define KT_HF_TENSORS_H

#include <stdint.h>

#include "hf_config.h"
#include "model.h"
#include "status.h"

struct kt_st_dir;
struct kt_st_tensor;

/* How one linear weight (out x in) is stored. */
enum kt_hf_stored {
    KT_HF_STORED_PLAIN, /* weight: BF16, F16 or F32 */
    KT_HF_STORED_FP8,   /* weight F8_E4M3 + weight_scale_inv F32 (ceil(out/br), ceil(in/bc)) */
    KT_HF_STORED_INT4,  /* weight_packed I32 (out, ceil(in/8)) + weight_scale BF16 (out, ceil(in/gs)) + weight_shape */
};

struct kt_hf_linear {
    enum kt_hf_stored stored;
    uint64_t out, in;
    const struct kt_st_tensor *weight; /* PLAIN and FP8: the values; INT4: weight_packed */
    const struct kt_st_tensor *scale;  /* FP8: weight_scale_inv; INT4: weight_scale; PLAIN: NULL */
};

/* The checkpoint's tensors by class. */
struct kt_hf_inventory {
    uint64_t class_bytes[KT_CLASS_COUNT];   /* stored bytes, scales included */
    uint32_t class_linears[KT_CLASS_COUNT]; /* linear weights (an expert's gate, up, down count 3) */
    uint32_t stored_linears[3];             /* by enum kt_hf_stored */
    uint64_t n_used, n_unused;              /* tensors matched / in the checkpoint but not used (MTP layers) */
    uint64_t unused_bytes;
};

/* Finds linear weight `module` (e.g. "model.layers.3.mlp.experts.7.up_proj")
 * of out x in elements in dir, in whichever stored form it has, checked
 * against the quantization q. */
kt_status kt_hf_find_linear(const struct kt_st_dir *dir, const struct kt_hf_quant *q, const char *module, uint64_t out,
                            uint64_t in, struct kt_hf_linear *lin, kt_err *err);

/* Checks every tensor the model of hp needs and sums them (see above). */
kt_status kt_hf_inventory(const struct kt_st_dir *dir, const struct kt_hparams *hp, const struct kt_hf_quant *q,
                          struct kt_hf_inventory *inv, kt_err *err);

/* One line on the checkpoint in DIR (name, layers, experts, weight format,
 * bytes, shards), having read its config and checked its tensors: for a
 * tool handed a directory it cannot load yet. */
kt_status kt_hf_describe(const char *dir, char *out, size_t out_size, kt_err *err);

#endif
