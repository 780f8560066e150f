/*
 * synth.h - kt-synth's generator: deepseek2 GGUF files laid out exactly like a
 * real family's (metadata keys, tensor names, order, shapes and quant types,
 * tokenizer keys and special tokens) with seeded random weights.
 *
 * A file is made in two steps: kt_synth_plan_create turns a configuration
 * (a preset plus command-line overrides) into the tensor list with final types,
 * and kt_synth_write streams it to disk with bounded memory on n_threads
 * threads.  The bytes depend only on the plan and the seed, never on the thread
 * count.  Library code: it reports through kt_err and the caller's progress
 * reporter and never prints.
 */
#ifndef KT_SYNTH_H
#define KT_SYNTH_H

#include <stdbool.h>
#include <stdint.h>

#include "gguf.h"
#include "progress.h"
#include "status.h"
#include "vocab.h"

#define KT_SYNTH_MAX_LAYERS 256
#define KT_SYNTH_MAX_EXPERTS 1024
/* Default Zipf exponents of router preference (init.c): clearly hot experts
 * in the tiny test models (top quarter of 32 experts takes ~60% of picks),
 * a milder, workload-like skew at real dimensions (~45-50%). */
#define KT_SYNTH_TINY_SKEW 1.0
#define KT_SYNTH_SLICE_SKEW 0.5
#define KT_SYNTH_DEFAULT_MERGES 768 /* ~1k tokens with the byte tokens and specials */

/* Which type option governs a tensor. */
enum kt_synth_role {
    KT_SYNTH_ROLE_EXPERTS, /* ffn_{gate,up,down}_exps */
    KT_SYNTH_ROLE_SHARED,  /* ffn_{gate,up,down}_shexp */
    KT_SYNTH_ROLE_ATTN,    /* attn_q_a, attn_q_b, attn_kv_a_mqa, attn_k_b, attn_v_b, attn_output */
    KT_SYNTH_ROLE_FFN,     /* ffn_{gate,up,down} of the leading dense layers */
    KT_SYNTH_ROLE_EMBD,    /* token_embd */
    KT_SYNTH_ROLE_OUTPUT,  /* output (lm_head) */
    KT_SYNTH_ROLE_COUNT,
    KT_SYNTH_ROLE_F32 = KT_SYNTH_ROLE_COUNT, /* norms, router, exp_probs_b: always F32 */
};

struct kt_synth_config {
    char preset[32];
    char name[64];                /* general.name */
    enum kt_synth_family family;  /* tokenizer family */
    const char *chat_template;    /* tokenizer.chat_template; NULL: the family's default */

    uint32_t n_layer;             /* block_count */
    uint32_t n_dense_max;         /* the family's leading dense layers; the file has
                                     min(n_dense_max, n_layer - 1): always one MoE layer */
    uint32_t n_embd, n_ff, n_ff_exp;
    uint32_t n_head, q_lora_rank, kv_lora_rank, qk_nope_dim, qk_rope_dim, v_head_dim;
    uint32_t n_expert, n_expert_used, n_expert_shared, n_expert_groups, n_group_used;
    uint32_t gating;              /* expert_gating_func: 1 softmax, 2 sigmoid */
    float expert_weights_scale;
    bool expert_weights_norm;

    uint32_t n_ctx_train;
    float rms_eps;
    float rope_freq_base;
    float rope_scaling_factor;    /* YaRN s */
    uint32_t rope_orig_ctx;
    float yarn_log_multiplier, yarn_beta_fast, yarn_beta_slow;

    uint32_t vocab_merges;        /* BPE merges learned by vocab.c */
    int types[KT_SYNTH_ROLE_COUNT]; /* enum kt_type per role, as requested */

    uint64_t seed;
    double skew;                  /* Zipf exponent of router preference; 0 = uniform */
    double skew_max;              /* above skew: the MoE layers' exponents spread over [skew, skew_max]
                                     in a seeded order (route.h); otherwise every layer has skew */
    double route_input;           /* 0 .. 1: share of a token embedding along its class direction,
                                     so routing depends on the kind of text (route.h); 0 = none */
    uint32_t n_threads;           /* 0: online CPUs */
};

/* Fills cfg with a preset's defaults: "tiny", "tiny-v3", "tiny-thinking", "tiny-r1",
 * "tiny-long", "kimi-k2-slice" or "deepseek-v3-slice".  KT_ERR_INVALID for an unknown name. */
kt_status kt_synth_preset(const char *name, struct kt_synth_config *cfg, kt_err *err);

/* A type id a tensor can be written as (has a reference quantizer and is a
 * storage format, not an activation format); -1 with err set otherwise. */
int kt_synth_parse_type(const char *name, kt_err *err);

struct kt_synth_tensor {
    char name[KT_GGUF_MAX_NAME];
    uint32_t n_dims;
    int64_t ne[KT_GGUF_MAX_DIMS];   /* unused trailing dims are 1 */
    int type;                       /* as written */
    int requested_type;             /* before the block-size fallback */
    enum kt_synth_role role;
    uint64_t nbytes;
    int32_t layer;                  /* -1 for token_embd, output_norm, output */
    /* How the values are drawn (chosen by synth.c, drawn by init.c): */
    int init;                       /* internal generator kind */
    float init_std;                 /* std of the uniform draw (or of the noise around 1 for norms) */
};

/* A block-size fallback that happened, reported once per (requested, used). */
struct kt_synth_fallback {
    int requested, used;
    uint32_t count;                 /* tensors affected */
    char first_tensor[KT_GGUF_MAX_NAME];
};

#define KT_SYNTH_MAX_FALLBACKS 16

struct kt_synth_plan {
    struct kt_synth_config cfg;     /* validated copy */
    uint32_t n_dense_lead;          /* leading_dense_block_count written */
    struct kt_synth_vocab vocab;
    uint32_t file_type;             /* general.file_type (llama_ftype) */
    bool quantized;                 /* a block-quantized tensor (not f16/bf16): general.quantization_version */
    uint32_t n_tensors;
    struct kt_synth_tensor *tensors; /* [n_tensors] in file order */
    uint64_t data_bytes;            /* tensor bytes, padding excluded */
    uint32_t n_fallbacks;
    struct kt_synth_fallback fallbacks[KT_SYNTH_MAX_FALLBACKS];
    double *layer_skew;             /* [n_layer] each layer's Zipf exponent (0 for dense layers) */
    float *skew_bias;               /* [n_layer][n_expert] exp_probs_b by rank - 1, before noise (init.c) */
    uint8_t *token_class;           /* [vocab.n_tokens] enum kt_synth_token_class; NULL at route_input 0 */
    float *class_dir;               /* [KT_SYNTH_CLASS_COUNT][n_embd] orthonormal; NULL at route_input 0 */
};

/* Checks the configuration (KT_ERR_INVALID with a message a user can act on:
 * experts not divisible by groups, top-k larger than the experts the groups
 * allow, zero dimensions), builds the vocabulary and the tensor list. */
kt_status kt_synth_plan_create(const struct kt_synth_config *cfg, struct kt_synth_plan **out, kt_err *err);
void kt_synth_plan_destroy(struct kt_synth_plan *plan);

/* Writes the plan to path (via path.tmp, renamed at the end).  progress may be
 * NULL; it is fed tensor bytes as they reach the file. */
kt_status kt_synth_write(const struct kt_synth_plan *plan, const char *path, struct kt_progress *progress,
                         kt_err *err);

/* Writes the plan's header (metadata and tensor table) to path (via path.tmp,
 * renamed at the end) and extends the file to its full size without writing
 * the data: a sparse file whose weights read as zeros, for planning a
 * real-size model's placement (kt-place), never for running it. */
kt_status kt_synth_write_header_only(const struct kt_synth_plan *plan, const char *path, kt_err *err);

/* The plan's metadata and tensor declarations on w, before its header is
 * written (what kt_synth_write starts with; tests write header-only files). */
kt_status kt_synth_write_metadata(struct kt_gguf_writer *w, const struct kt_synth_plan *plan, kt_err *err);

/* llama_ftype for a file whose routed experts are of type t (15 for Q4_K, the
 * Q4_K_M mix; 7 for Q8_0; 0 for F32 ...). */
uint32_t kt_synth_file_type(int t);

/* The seeded ranking of MoE layer `layer`'s experts that exp_probs_b encodes:
 * rank_of_expert[e] in 1..n_expert, 1 = most preferred; the expert of rank r
 * is selected with frequency ~ min(1, c r^-skew) for random hidden states
 * (see init.c).  KT_ERR_INVALID for a dense layer. */
kt_status kt_synth_expert_ranks(const struct kt_synth_plan *plan, uint32_t layer, uint32_t *rank_of_expert,
                                kt_err *err);

/* ---- Hugging Face checkpoint directories (hf.c) ---- */

/* How --format hf stores the weights (norms BF16 and e_score_correction_bias
 * F32 in every mode; embed_tokens, lm_head and the router BF16). */
enum kt_synth_hf_weights {
    KT_SYNTH_HF_BF16,         /* every linear BF16, no quantization_config */
    KT_SYNTH_HF_FP8,          /* DeepSeek-V3: every linear of the layers block FP8 (128 x 128, E4M3) */
    KT_SYNTH_HF_INT4_EXPERTS, /* Kimi-K2-Thinking: routed experts INT4 pack-quantized (group 32), the rest BF16 */
};

struct kt_synth_hf_options {
    enum kt_synth_hf_weights weights;
    uint64_t shard_bytes;     /* a shard holds modules up to this size (a bigger module: a shard of its own) */
};

/* "bf16", "fp8" or "int4-experts"; KT_ERR_INVALID naming the choices otherwise. */
kt_status kt_synth_hf_weights_parse(const char *name, enum kt_synth_hf_weights *out, kt_err *err);

/* The real family's storage: int4-experts for Kimi-K2 presets, fp8 for DeepSeek-V3's. */
enum kt_synth_hf_weights kt_synth_hf_default_weights(const struct kt_synth_config *cfg);

/* The tensor bytes and shard count kt_synth_write_hf will write. */
kt_status kt_synth_hf_size(const struct kt_synth_plan *plan, const struct kt_synth_hf_options *opt,
                           uint64_t *total_bytes, uint32_t *n_shards, kt_err *err);

/* Writes the plan's model, the same values as its GGUF file (same seed), into
 * dir as a Hugging Face checkpoint: config.json, model.safetensors.index.json,
 * model-0000K-of-0000N.safetensors, tokenizer.json, tokenizer_config.json.
 * dir must be new or empty (KT_ERR_INVALID otherwise); on failure the files
 * written are removed again.  Memory stays at a few stripes of 128 rows.
 * total_bytes and n_shards (may be NULL) get the tensor bytes and shards. */
kt_status kt_synth_write_hf(const struct kt_synth_plan *plan, const char *dir, const struct kt_synth_hf_options *opt,
                            struct kt_progress *progress, uint64_t *total_bytes, uint32_t *n_shards, kt_err *err);

#endif
