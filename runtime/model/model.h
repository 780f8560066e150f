/*
 * model.h - what a deepseek2 GGUF file describes: hyperparameters read from
 * the exact metadata keys llama.cpp's converters write (DeepSeek-V2/V2-Lite/
 * V3/R1, Kimi-K2), and the per-layer tensor table, each tensor checked for
 * presence, type and shape.  Nothing here computes; it describes.
 */
#ifndef KT_MODEL_H
#define KT_MODEL_H

#include <stdbool.h>
#include <stdint.h>

#include "gguf.h"
#include "status.h"

enum kt_gating {
    KT_GATING_SOFTMAX = 1,
    KT_GATING_SIGMOID = 2,
};

enum kt_rope_scaling {
    KT_ROPE_SCALING_NONE = 0,
    KT_ROPE_SCALING_LINEAR = 1,
    KT_ROPE_SCALING_YARN = 2,
};

struct kt_hparams {
    uint32_t n_layer;           /* block_count */
    uint32_t n_ctx_train;       /* context_length */
    uint32_t n_embd;            /* embedding_length (E) */
    uint32_t n_ff;              /* feed_forward_length: dense FFN width (F) */
    uint32_t n_head;            /* attention.head_count (H) */
    uint32_t n_head_kv;         /* attention.head_count_kv (1 in MLA-split files) */
    uint32_t q_lora_rank;       /* 0: plain attn_q (V2-Lite) */
    uint32_t kv_lora_rank;      /* kvr */
    uint32_t qk_nope_dim;       /* dn */
    uint32_t qk_rope_dim;       /* dr = rope.dimension_count */
    uint32_t v_head_dim;        /* dv */
    bool mla_split;             /* attn_k_b/attn_v_b (key_length_mla present) vs fused attn_kv_b */
    float rms_eps;

    float rope_freq_base;
    enum kt_rope_scaling rope_scaling; /* type absent: linear if factor != 1, else none */
    float rope_scaling_factor;  /* s; 1 when absent or 0 without a scaling type (a type needs one) */
    uint32_t rope_orig_ctx;     /* rope.scaling.original_context_length */
    float yarn_log_multiplier;  /* as stored: 0.1 x mscale_all_dim */
    /* YaRN β: the file's values when present (as HF and DeepSeek's code use
     * the config's), else the DeepSeek definition's 32 / 1.  llama.cpp ignores
     * these keys for deepseek2 and always uses 32 / 1, which differs for
     * Kimi-K2 (β 1 / 1): docs/deepseek2.md, RoPE/YaRN. */
    float yarn_beta_fast;
    float yarn_beta_slow;
    float rope_attn_factor;     /* rope.scaling.attn_factor, 1 when absent */

    uint32_t n_dense_lead;      /* leading_dense_block_count */
    uint32_t n_expert;          /* expert_count */
    uint32_t n_expert_used;     /* expert_used_count (k) */
    uint32_t n_expert_shared;   /* expert_shared_count */
    uint32_t n_ff_exp;          /* expert_feed_forward_length (f) */
    uint32_t n_expert_groups;   /* expert_group_count, 1 when absent or 0 */
    uint32_t n_group_used;      /* expert_group_used_count; = n_expert_groups (no limit) when absent or 0 */
    enum kt_gating gating;      /* expert_gating_func; softmax when absent or 0 */
    float expert_weights_scale; /* 1 when absent or 0 */
    bool expert_weights_norm;

    uint32_t n_vocab;           /* vocab_size, else the length of tokenizer.ggml.tokens */
};

/* Expert keys (expert_count, _used_count, _feed_forward_length, _shared_count)
 * are required only when some layer is MoE; feed_forward_length only when
 * some layer is dense.  Per-layer array forms of head_count, head_count_kv,
 * feed_forward_length, expert_used_count and expert_feed_forward_length are
 * accepted when all values are equal (else KT_ERR_UNSUPPORTED).  Missing
 * required keys and tensors: KT_ERR_NOT_FOUND; bad values, shapes and norm
 * types: KT_ERR_FORMAT; other architectures, gating functions, rope scaling
 * types and weight types kt cannot dequantize: KT_ERR_UNSUPPORTED. */

const char *kt_rope_scaling_name(enum kt_rope_scaling s);
const char *kt_gating_name(enum kt_gating g);

/* YaRN attention magnitude as DeepSeek/HF define it: 1 + 0.1*L*ln(s), with
 * L = yarn_log_multiplier/0.1 (mscale_all_dim); 1 without YaRN, s <= 1 or L = 0. */
double kt_hparams_yarn_mscale(const struct kt_hparams *hp);

/* Softmax scale of attention scores: mscale^2 / sqrt(dn + dr). */
double kt_hparams_kq_scale(const struct kt_hparams *hp);

/* Bytes of tensor data are reported by these classes. */
enum kt_tensor_class {
    KT_CLASS_EMBED_OUTPUT,  /* token_embd, output, output_norm */
    KT_CLASS_ATTENTION,     /* attn_* incl. norms */
    KT_CLASS_DENSE_FFN,     /* ffn_* of the leading dense layers, ffn_norm */
    KT_CLASS_ROUTER,        /* ffn_gate_inp, exp_probs_b */
    KT_CLASS_SHARED_EXPERTS,
    KT_CLASS_ROUTED_EXPERTS,
    KT_CLASS_COUNT,
};

const char *kt_tensor_class_name(enum kt_tensor_class c);

/* One layer's tensors; NULL where the file does not have one (e.g. attn_q_a
 * in V2-Lite, every ffn_*_exps in dense layers). */
struct kt_layer {
    bool is_moe;
    const struct kt_gguf_tensor *attn_norm;      /* {E} */
    const struct kt_gguf_tensor *attn_q_a;       /* {E, qr} */
    const struct kt_gguf_tensor *attn_q_a_norm;  /* {qr} */
    const struct kt_gguf_tensor *attn_q_b;       /* {qr, H*(dn+dr)} */
    const struct kt_gguf_tensor *attn_q;         /* {E, H*(dn+dr)} when qr == 0 */
    const struct kt_gguf_tensor *attn_kv_a_mqa;  /* {E, kvr+dr} */
    const struct kt_gguf_tensor *attn_kv_a_norm; /* {kvr} */
    const struct kt_gguf_tensor *attn_k_b;       /* {dn, kvr, H} split form */
    const struct kt_gguf_tensor *attn_v_b;       /* {kvr, dv, H} split form */
    const struct kt_gguf_tensor *attn_kv_b;      /* {kvr, H*(dn+dv)} fused form */
    const struct kt_gguf_tensor *attn_output;    /* {H*dv, E} */
    const struct kt_gguf_tensor *ffn_norm;       /* {E} */
    const struct kt_gguf_tensor *ffn_gate;       /* {E, F} dense */
    const struct kt_gguf_tensor *ffn_up;         /* {E, F} dense */
    const struct kt_gguf_tensor *ffn_down;       /* {F, E} dense */
    const struct kt_gguf_tensor *ffn_gate_inp;   /* {E, Ne} router */
    const struct kt_gguf_tensor *exp_probs_b;    /* {Ne} selection bias, optional */
    const struct kt_gguf_tensor *ffn_gate_exps;  /* {E, f, Ne} */
    const struct kt_gguf_tensor *ffn_up_exps;    /* {E, f, Ne} */
    const struct kt_gguf_tensor *ffn_gate_up_exps; /* {E, 2f, Ne} fused alternative */
    const struct kt_gguf_tensor *ffn_down_exps;  /* {f, E, Ne} */
    const struct kt_gguf_tensor *ffn_gate_shexp; /* {E, f*Ns} */
    const struct kt_gguf_tensor *ffn_up_shexp;   /* {E, f*Ns} */
    const struct kt_gguf_tensor *ffn_down_shexp; /* {f*Ns, E} */
};

struct kt_hf_weights;

struct kt_model {
    struct kt_gguf *gguf;       /* owned */
    struct kt_hf_weights *hf;   /* a checkpoint directory's weights (freed with gguf); NULL for a GGUF file */
    char arch[32];              /* "deepseek2" */
    char name[128];             /* general.name, may be "" */
    struct kt_hparams hp;
    const struct kt_gguf_tensor *token_embd;  /* {E, V} */
    const struct kt_gguf_tensor *output_norm; /* {E} */
    const struct kt_gguf_tensor *output;      /* {E, V}; token_embd when tied */
    bool output_tied;           /* no output.weight in the file */
    struct kt_layer *layers;    /* [n_layer] */
    /* Tensors in the table, by class (a tied output counted once). */
    uint64_t class_bytes[KT_CLASS_COUNT];
    uint32_t class_tensors[KT_CLASS_COUNT];
    uint64_t class_types[KT_CLASS_COUNT]; /* bit t set: a tensor of GGML type t is in the class */
    uint64_t n_params;          /* elements of all tensors in the table */
    uint32_t n_tensors_used;    /* tensors in the table */
    uint32_t n_tensors_extra;   /* tensors in the file kt does not use (e.g. MTP layers) */
    uint64_t extra_bytes;       /* and their bytes, in no class */
};

/* Reads hyperparameters only (no tensor checks). */
kt_status kt_hparams_read(const struct kt_gguf *g, struct kt_hparams *hp, kt_err *err);

/* Which model a file holds, for profiles and plans made on one file and used
 * with another: name and shape, and a fingerprint of the hyperparameters and
 * the tensor table (names and shapes, not types, so a profile holds across
 * quantizations of one model; never 0, which means unknown).  Reads only the
 * header. */
struct kt_model_identity {
    char name[128];             /* general.name; "" when absent */
    char arch[32];
    uint32_t n_layer, n_expert, n_expert_used, n_embd, n_ff_exp;
    uint64_t fingerprint;
};
void kt_model_identity(const struct kt_model *m, struct kt_model_identity *out);

/* Opens a GGUF file, reads hyperparameters and builds the checked tensor
 * table.  The first missing tensor, wrong type or wrong shape fails with a
 * message naming the tensor, what was expected and what the file has.  Then
 * the metadata must agree with the rest of the file (KT_ERR_FORMAT naming
 * both sides): no blk.N tensors past block_count but MTP layers (nextn.*),
 * no shared-expert tensors with expert_shared_count 0, no router or experts
 * in a layer leading_dense_block_count makes dense, no more tokens than
 * embedding rows, every tokenizer.ggml.*_token_id a token.  Every message
 * starts with "PATH: ", as kt_gguf_open's do. */
kt_status kt_model_open(const char *path, struct kt_model **out, kt_err *err);

/* kt_model_open also opens a Hugging Face checkpoint directory (hf_model.h):
 * its tensors then have the GGUF names and kt types, some converted only by
 * kt_model_weights_ready and its routed experts read one at a time by
 * kt_model_read_expert. */

/* The same over an already-open GGUF; takes ownership of g on success only. */
kt_status kt_model_from_gguf(struct kt_gguf *g, struct kt_model **out, kt_err *err);

void kt_model_close(struct kt_model *m);

/* Makes every tensor's data valid but the streamed experts' (a checkpoint
 * converts what it must, once, calling progress(ctx, bytes) (may be NULL)
 * as it goes; a GGUF file has nothing to do).  The engine calls it before it
 * reads a weight. */
kt_status kt_model_weights_ready(const struct kt_model *m, void (*progress)(void *ctx, uint64_t bytes), void *ctx,
                                 kt_err *err);

/* Bytes kt_model_weights_ready converts into memory of its own (a
 * checkpoint's deferred tensors: not file pages, so a memory check counts
 * them); 0 for a GGUF file. */
uint64_t kt_model_converted_bytes(const struct kt_model *m);

/* True when the stacked expert tensors have no data (a checkpoint): expert x's
 * slab is only had through kt_model_read_expert. */
bool kt_model_experts_streamed(const struct kt_model *m);

/* Expert x's slab of stacked expert tensor t (t->nbytes / n_expert bytes, in
 * t's type) into dst: a GGUF's bytes as they are, a checkpoint's converted. */
kt_status kt_model_read_expert(const struct kt_model *m, const struct kt_gguf_tensor *t, uint32_t x, void *dst,
                               kt_err *err);

/* Rows [first, first + n) of that slab (rows of t->ne[1], in t's type) into dst. */
kt_status kt_model_read_expert_rows(const struct kt_model *m, const struct kt_gguf_tensor *t, uint32_t x,
                                    int64_t first, int64_t n, void *dst, kt_err *err);

/* Advice on expert x's slab of stacked expert tensor t in the file's
 * mapping, for copies made out of it while serving (the device's uploads):
 * KT_EXPERT_WILL_NEED starts reading it ahead, asynchronously (a mapping
 * otherwise faults its pages in one by one, on the thread that touches
 * them); KT_EXPERT_DONE gives its whole pages back (read again from the file
 * if touched again), so what was copied out does not stay resident.  A
 * checkpoint's reads drop their own pages: DONE does nothing there. */
enum kt_expert_advice { KT_EXPERT_WILL_NEED, KT_EXPERT_DONE };
void kt_model_expert_advise(const struct kt_model *m, const struct kt_gguf_tensor *t, uint32_t x,
                            enum kt_expert_advice advice);

/* Memory one placement needs, in bytes. */
struct kt_memory_need {
    uint64_t gpu_bytes;         /* weights on the GPU + latent KV cache there */
    uint64_t cpu_bytes;         /* weights in RAM (+ KV cache when attention is on CPU) */
    uint64_t kv_cache_bytes;    /* n_layer x ctx x (kvr + dr) x bytes per value: the latent
                                   row is cached in both MLA forms */
};

/* Bytes of one routed expert of layer il (its gate, up and down slabs); 0 in dense layers. */
uint64_t kt_layer_expert_bytes(const struct kt_model *m, uint32_t il);

/* Weights are the tensors of the table (extra tensors are never loaded).
 * gpu_experts_per_layer < 0: everything on CPU, KV cache included.  0:
 * attention, router, dense layers, shared experts, embeddings/output and the
 * KV cache on the GPU, routed experts on CPU.  N > 0: additionally N routed
 * experts of each MoE layer on the GPU (capped at n_expert).
 * kv_bytes_per_value: 2 (f16) or 4 (f32).  Sums saturate at UINT64_MAX. */
struct kt_memory_need kt_model_memory_need(const struct kt_model *m, int gpu_experts_per_layer,
                                           uint32_t ctx, uint32_t kv_bytes_per_value);

#endif
