/*
 * fuzz_hf_config.c - fuzz target for a checkpoint's config.json
 * (kt_hf_config_parse, then kt_hparams_read on what it made).
 *
 * An accepted config must give a metadata-only GGUF (no tensors) whose
 * general.architecture is deepseek2, and a quantization format from the
 * enum with its parameters set only for that format (FP8: block sizes from
 * 1 to 65536; INT4: a group size that is a multiple of 8).  A rejection must
 * name the input.  A broken promise aborts.  It must never touch files or
 * keep state between inputs.  kt_fuzz_seeds hands replay.c a DeepSeek-V3 and
 * a Kimi-K2-Thinking config, their truncations and one-byte changes.
 */
#include "fuzz.h"

#include "gguf.h"
#include "hf_config.h"
#include "model.h"

static void require(bool cond, const char *what)
{
    if (!cond) {
        fprintf(stderr, "fuzz_hf_config: broken promise: %s\n", what);
        abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *copy = malloc(size ? size : 1); /* exactly sized: an overread is caught */
    if (!copy)
        return 0;
    memcpy(copy, data, size);
    struct kt_gguf *meta = NULL;
    struct kt_hf_quant q;
    kt_err err = {0};
    kt_status st = kt_hf_config_parse(copy, size, "fuzz/config.json", &meta, &q, &err);
    if (st != KT_OK) {
        require(!meta, "no metadata on failure");
        require(strncmp(err.msg, "fuzz/config.json: ", 18) == 0, "message names the input");
    } else {
        require(meta && meta->n_tensors == 0, "metadata only");
        struct kt_gguf_str arch = {0};
        require(kt_gguf_get_str(meta, "general.architecture", &arch, &err) == KT_OK && arch.len == 9 &&
                    memcmp(arch.ptr, "deepseek2", 9) == 0,
                "architecture");
        require(q.format == KT_HF_WEIGHTS_FP8_BLOCK
                    ? q.block_rows >= 1 && q.block_rows <= 65536 && q.block_cols >= 1 && q.block_cols <= 65536
                    : q.block_rows == 0 && q.block_cols == 0,
                "block sizes");
        require(q.format == KT_HF_WEIGHTS_INT4_GROUP ? q.group_size >= 8 && q.group_size % 8 == 0 : q.group_size == 0,
                "group size");
        require(q.n_ignore <= KT_HF_MAX_IGNORE && memchr(q.method, 0, sizeof q.method), "ignore list");
        struct kt_hparams hp;
        (void)kt_hparams_read(meta, &hp, &err); /* either way: no crash, no undefined behaviour */
    }
    kt_gguf_close(meta);
    free(copy);
    return 0;
}

void kt_fuzz_seeds(kt_fuzz_emit_fn emit)
{
    static const char *const seeds[] = {
        "{\"architectures\": [\"DeepseekV3ForCausalLM\"], \"vocab_size\": 129280, \"hidden_size\": 7168,"
        " \"intermediate_size\": 18432, \"moe_intermediate_size\": 2048, \"num_hidden_layers\": 61,"
        " \"num_attention_heads\": 128, \"n_shared_experts\": 1, \"n_routed_experts\": 256,"
        " \"routed_scaling_factor\": 2.5, \"kv_lora_rank\": 512, \"q_lora_rank\": 1536, \"qk_rope_head_dim\": 64,"
        " \"v_head_dim\": 128, \"qk_nope_head_dim\": 128, \"n_group\": 8, \"topk_group\": 4,"
        " \"num_experts_per_tok\": 8, \"moe_layer_freq\": 1, \"first_k_dense_replace\": 3, \"norm_topk_prob\": true,"
        " \"scoring_func\": \"sigmoid\", \"max_position_embeddings\": 163840, \"rms_norm_eps\": 1e-06,"
        " \"rope_theta\": 10000, \"rope_scaling\": {\"beta_fast\": 32, \"beta_slow\": 1, \"factor\": 40,"
        " \"mscale\": 1.0, \"mscale_all_dim\": 1.0, \"original_max_position_embeddings\": 4096, \"type\": \"yarn\"},"
        " \"quantization_config\": {\"fmt\": \"e4m3\", \"quant_method\": \"fp8\", \"weight_block_size\": [128, 128]}}",
        "{\"text_config\": {\"architectures\": [\"DeepseekV3ForCausalLM\"], \"num_hidden_layers\": 61,"
        " \"hidden_size\": 7168, \"num_attention_heads\": 64, \"kv_lora_rank\": 512, \"qk_rope_head_dim\": 64,"
        " \"qk_nope_head_dim\": 128, \"v_head_dim\": 128, \"rms_norm_eps\": 1e-05, \"vocab_size\": 163840,"
        " \"max_position_embeddings\": 262144, \"n_routed_experts\": 384, \"num_experts_per_tok\": 8,"
        " \"moe_intermediate_size\": 2048, \"n_shared_experts\": 1, \"first_k_dense_replace\": 1,"
        " \"intermediate_size\": 18432}, \"quantization_config\": {\"quant_method\": \"compressed-tensors\","
        " \"format\": \"pack-quantized\", \"config_groups\": {\"g\": {\"weights\": {\"num_bits\": 4,"
        " \"type\": \"int\", \"symmetric\": true, \"strategy\": \"group\", \"group_size\": 32}}},"
        " \"ignore\": [\"lm_head\", \"re:.*self_attn.*\"]}}",
    };
    kt_fuzz_mutated_seeds(emit, seeds, sizeof seeds / sizeof seeds[0], "\"{}[],:0-e.1tn ", 15);
}
