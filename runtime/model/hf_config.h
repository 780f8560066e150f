/*
 * hf_config.h - a Hugging Face checkpoint's config.json (DeepSeek-V3/R1,
 * Kimi-K2/K2-Thinking, and Kimi-K2.5's text_config) read as the deepseek2.*
 * GGUF keys kt already checks, plus the checkpoint's quantization_config.
 *
 * The keys go into a metadata-only kt_gguf (kt_gguf_from_parts), so
 * kt_hparams_read validates a directory's hyperparameters with exactly the
 * rules it applies to a GGUF file and names the same keys in its messages.
 * A config kt cannot run faithfully (another architecture, layers that are
 * not all MoE after the dense ones, YaRN with mscale != mscale_all_dim, an
 * unknown quantization method) is refused here with a message naming the
 * config field, never approximated.  Reading never writes anything.
 */
#ifndef KT_HF_CONFIG_H
#define KT_HF_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#include "status.h"

struct kt_gguf;

/* How the checkpoint's linear weights are stored (quantization_config). */
enum kt_hf_weight_format {
    KT_HF_WEIGHTS_PLAIN,      /* no quantization_config: BF16 (or F16/F32) tensors */
    KT_HF_WEIGHTS_FP8_BLOCK,  /* quant_method "fp8", fmt "e4m3", weight_block_size [rows, cols] */
    KT_HF_WEIGHTS_INT4_GROUP, /* compressed-tensors "pack-quantized", int, 4 bits, symmetric, group strategy */
    KT_HF_WEIGHTS_MXFP4,      /* quant_method "mxfp4" */
};

#define KT_HF_MAX_IGNORE 8

struct kt_hf_quant {
    enum kt_hf_weight_format format;
    uint32_t block_rows, block_cols; /* FP8: the scale blocks (128 x 128 in DeepSeek-V3) */
    uint32_t group_size;             /* INT4: elements per scale (32 in Kimi-K2-Thinking) */
    /* INT4: module names or "re:" patterns compressed-tensors left unquantized
     * (attention, shared experts, lm_head in Kimi's config), as given */
    uint32_t n_ignore;
    char ignore[KT_HF_MAX_IGNORE][96];
    char method[32];                 /* quant_method as written, for messages; "" without one */
};

/* Parses config.json's text (len bytes; label names it in messages) into a
 * metadata-only GGUF with the deepseek2.* keys, general.architecture and
 * general.name (name: _name_or_path, else label's last folder), and the
 * weights' format.  KT_ERR_FORMAT for malformed JSON or a field of the wrong
 * type, KT_ERR_UNSUPPORTED for a model or quantization kt does not run. */
kt_status kt_hf_config_parse(const char *text, size_t len, const char *label, struct kt_gguf **meta,
                             struct kt_hf_quant *quant, kt_err *err);

/* Reads DIR/config.json (at most 1 MiB) and parses it. */
kt_status kt_hf_config_read(const char *dir, struct kt_gguf **meta, struct kt_hf_quant *quant, kt_err *err);

#endif
