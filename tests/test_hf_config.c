/*
 * test_hf_config.c - config.json of native checkpoints read as kt's
 * hyperparameters: DeepSeek-V3 (block FP8), Kimi-K2-Thinking (INT4
 * pack-quantized) and Kimi-K2.5 (text_config) give the values their configs
 * state, field by field; a config written from a kt-synth GGUF's
 * hyperparameters gives that GGUF's; models, layouts and quantizations kt
 * does not run, malformed JSON and fields of the wrong type are refused
 * with a message naming the field.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gguf.h"
#include "hf_config.h"
#include "model.h"
#include "testlib.h"

/* DeepSeek-V3's config.json, as the checkpoint ships it (fields kt reads and some it does not). */
static const char deepseek_v3[] =
    "{\"architectures\": [\"DeepseekV3ForCausalLM\"], \"model_type\": \"deepseek_v3\","
    " \"vocab_size\": 129280, \"hidden_size\": 7168, \"intermediate_size\": 18432,"
    " \"moe_intermediate_size\": 2048, \"num_hidden_layers\": 61, \"num_nextn_predict_layers\": 1,"
    " \"num_attention_heads\": 128, \"num_key_value_heads\": 128, \"n_shared_experts\": 1,"
    " \"n_routed_experts\": 256, \"ep_size\": 1, \"routed_scaling_factor\": 2.5, \"kv_lora_rank\": 512,"
    " \"q_lora_rank\": 1536, \"qk_rope_head_dim\": 64, \"v_head_dim\": 128, \"qk_nope_head_dim\": 128,"
    " \"topk_method\": \"noaux_tc\", \"n_group\": 8, \"topk_group\": 4, \"num_experts_per_tok\": 8,"
    " \"moe_layer_freq\": 1, \"first_k_dense_replace\": 3, \"norm_topk_prob\": true,"
    " \"scoring_func\": \"sigmoid\", \"hidden_act\": \"silu\", \"max_position_embeddings\": 163840,"
    " \"initializer_range\": 0.02, \"rms_norm_eps\": 1e-06, \"use_cache\": true, \"bos_token_id\": 0,"
    " \"eos_token_id\": 1, \"rope_theta\": 10000, \"rope_scaling\": {\"beta_fast\": 32, \"beta_slow\": 1,"
    " \"factor\": 40, \"mscale\": 1.0, \"mscale_all_dim\": 1.0, \"original_max_position_embeddings\": 4096,"
    " \"type\": \"yarn\"}, \"tie_word_embeddings\": false, \"torch_dtype\": \"bfloat16\","
    " \"quantization_config\": {\"activation_scheme\": \"dynamic\", \"fmt\": \"e4m3\", \"quant_method\": \"fp8\","
    " \"weight_block_size\": [128, 128]}}";

/* Kimi-K2-Thinking's: Kimi-K2's dims, INT4 experts through compressed-tensors. */
#define KIMI_MODEL                                                                                                 \
    "\"architectures\": [\"DeepseekV3ForCausalLM\"], \"model_type\": \"kimi_k2\", \"vocab_size\": 163840,"        \
    " \"hidden_size\": 7168, \"intermediate_size\": 18432, \"moe_intermediate_size\": 2048,"                      \
    " \"num_hidden_layers\": 61, \"num_attention_heads\": 64, \"num_key_value_heads\": 64,"                        \
    " \"n_shared_experts\": 1, \"n_routed_experts\": 384, \"routed_scaling_factor\": 2.827,"                      \
    " \"kv_lora_rank\": 512, \"q_lora_rank\": 1536, \"qk_rope_head_dim\": 64, \"v_head_dim\": 128,"               \
    " \"qk_nope_head_dim\": 128, \"topk_method\": \"noaux_tc\", \"n_group\": 1, \"topk_group\": 1,"               \
    " \"num_experts_per_tok\": 8, \"moe_layer_freq\": 1, \"first_k_dense_replace\": 1,"                           \
    " \"norm_topk_prob\": true, \"scoring_func\": \"sigmoid\", \"max_position_embeddings\": 262144,"              \
    " \"rms_norm_eps\": 1e-05, \"rope_theta\": 50000.0, \"rope_scaling\": {\"beta_fast\": 1.0,"                  \
    " \"beta_slow\": 1.0, \"factor\": 64.0, \"mscale\": 1.0, \"mscale_all_dim\": 1.0,"                            \
    " \"original_max_position_embeddings\": 4096, \"type\": \"yarn\"}, \"tie_word_embeddings\": false"
#define KIMI_INT4                                                                                                  \
    "\"quantization_config\": {\"config_groups\": {\"group_0\": {\"input_activations\": null,"                    \
    " \"output_activations\": null, \"targets\": [\"Linear\"], \"weights\": {\"actorder\": null,"                 \
    " \"block_structure\": null, \"dynamic\": false, \"group_size\": 32, \"num_bits\": 4,"                         \
    " \"observer\": \"minmax\", \"observer_kwargs\": {}, \"strategy\": \"group\", \"symmetric\": true,"          \
    " \"type\": \"int\"}}}, \"format\": \"pack-quantized\", \"ignore\": [\"lm_head\","                          \
    " \"re:.*self_attn.*\", \"re:.*shared_experts.*\", \"re:.*mlp\\\\.(gate|up|gate_up|down)_proj.*\"],"         \
    " \"kv_cache_scheme\": null, \"quant_method\": \"compressed-tensors\", \"quantization_status\": \"compressed\"}"

static const char kimi_k2_thinking[] = "{" KIMI_MODEL ", " KIMI_INT4 "}";
/* Kimi-K2.5: a vision-language model; the language model's config is text_config */
static const char kimi_k25[] = "{\"architectures\": [\"KimiK25ForConditionalGeneration\"], \"model_type\": "
                               "\"kimi_k25\", \"vision_config\": {\"hidden_size\": 1152}, \"text_config\": {"
                               KIMI_MODEL "}, " KIMI_INT4 "}";

static bool parse(const char *text, struct kt_hparams *hp, struct kt_hf_quant *q, kt_err *err)
{
    struct kt_gguf *meta = NULL;
    kt_status st = kt_hf_config_parse(text, strlen(text), "ckpt/config.json", &meta, q, err);
    if (st == KT_OK)
        st = kt_hparams_read(meta, hp, err);
    kt_gguf_close(meta);
    return st == KT_OK;
}

static void deepseek_v3_reads_as_its_config_says(void)
{
    struct kt_hparams hp;
    struct kt_hf_quant q;
    kt_err err = {0};
    KT_CHECK(parse(deepseek_v3, &hp, &q, &err), "%s", err.msg);
    KT_CHECK(hp.n_layer == 61 && hp.n_ctx_train == 163840 && hp.n_embd == 7168 && hp.n_ff == 18432 &&
                 hp.n_dense_lead == 3 && hp.n_head == 128 && hp.n_head_kv == 128 && hp.q_lora_rank == 1536 &&
                 hp.kv_lora_rank == 512 && hp.qk_rope_dim == 64 && hp.qk_nope_dim == 128 && hp.v_head_dim == 128 &&
                 !hp.mla_split && hp.n_vocab == 129280,
             "dims: layers %u ctx %u embd %u ff %u dense %u heads %u/%u q %u kv %u rope %u nope %u v %u vocab %u",
             hp.n_layer, hp.n_ctx_train, hp.n_embd, hp.n_ff, hp.n_dense_lead, hp.n_head, hp.n_head_kv,
             hp.q_lora_rank, hp.kv_lora_rank, hp.qk_rope_dim, hp.qk_nope_dim, hp.v_head_dim, hp.n_vocab);
    KT_CHECK(hp.n_expert == 256 && hp.n_expert_used == 8 && hp.n_ff_exp == 2048 && hp.n_expert_shared == 1 &&
                 hp.n_expert_groups == 8 && hp.n_group_used == 4 && hp.expert_weights_scale == 2.5f &&
                 hp.expert_weights_norm && hp.rms_eps == 1e-6f,
             "moe: %u experts, %u used, ff %u, shared %u, groups %u/%u, scale %g, norm %d, eps %g", hp.n_expert,
             hp.n_expert_used, hp.n_ff_exp, hp.n_expert_shared, hp.n_expert_groups, hp.n_group_used,
             (double)hp.expert_weights_scale, hp.expert_weights_norm, (double)hp.rms_eps);
    KT_CHECK(hp.rope_scaling == KT_ROPE_SCALING_YARN && hp.rope_scaling_factor == 40.0f && hp.rope_orig_ctx == 4096 &&
                 hp.rope_freq_base == 10000.0f && hp.yarn_beta_fast == 32.0f && hp.yarn_beta_slow == 1.0f &&
                 hp.yarn_log_multiplier == 0.1f,
             "rope: scaling %d factor %g orig %u base %g beta %g/%g log multiplier %g", (int)hp.rope_scaling,
             (double)hp.rope_scaling_factor, hp.rope_orig_ctx, (double)hp.rope_freq_base, (double)hp.yarn_beta_fast,
             (double)hp.yarn_beta_slow, (double)hp.yarn_log_multiplier);
    KT_CHECK(q.format == KT_HF_WEIGHTS_FP8_BLOCK && q.block_rows == 128 && q.block_cols == 128 &&
                 strcmp(q.method, "fp8") == 0,
             "quantization: format %d blocks %ux%u method %s", (int)q.format, q.block_rows, q.block_cols, q.method);
}

static void kimi_int4_and_k25_read_as_their_configs_say(void)
{
    const char *const texts[2] = {kimi_k2_thinking, kimi_k25};
    for (int i = 0; i < 2; i++) {
        struct kt_hparams hp;
        struct kt_hf_quant q;
        kt_err err = {0};
        KT_CHECK(parse(texts[i], &hp, &q, &err), "config %d: %s", i, err.msg);
        KT_CHECK(hp.n_layer == 61 && hp.n_head == 64 && hp.n_expert == 384 && hp.n_dense_lead == 1 &&
                     hp.n_expert_groups == 1 && hp.n_group_used == 1 && hp.n_vocab == 163840 &&
                     hp.n_ctx_train == 262144 && hp.rope_freq_base == 50000.0f && hp.rope_scaling_factor == 64.0f &&
                     hp.expert_weights_scale == 2.827f && hp.rms_eps == 1e-5f,
                 "config %d: layers %u heads %u experts %u dense %u groups %u/%u vocab %u ctx %u base %g factor %g "
                 "scale %g", i, hp.n_layer, hp.n_head, hp.n_expert, hp.n_dense_lead, hp.n_expert_groups,
                 hp.n_group_used, hp.n_vocab, hp.n_ctx_train, (double)hp.rope_freq_base,
                 (double)hp.rope_scaling_factor, (double)hp.expert_weights_scale);
        KT_CHECK(q.format == KT_HF_WEIGHTS_INT4_GROUP && q.group_size == 32 && q.n_ignore == 4 &&
                     strcmp(q.ignore[0], "lm_head") == 0 && strcmp(q.ignore[2], "re:.*shared_experts.*") == 0 &&
                     strcmp(q.ignore[3], "re:.*mlp\\.(gate|up|gate_up|down)_proj.*") == 0,
                 "config %d: format %d group %u ignore %u (%s)", i, (int)q.format, q.group_size, q.n_ignore,
                 q.n_ignore > 3 ? q.ignore[3] : "");
    }
}

/* A config written from a GGUF's hyperparameters reads back as that GGUF's. */
static void a_synth_models_hparams_round_trip(void)
{
    const char *presets[] = {"tiny", "tiny-v3"};
    for (size_t p = 0; p < sizeof presets / sizeof presets[0]; p++) {
        const char *path = kt_test_path("hf-config.gguf");
        if (kt_test_system("%s --preset %s --header-only -o %s >/dev/null 2>&1", kt_test_tool("kt-synth"), presets[p],
                           path) != 0) {
            KT_CHECK(false, "kt-synth %s failed", presets[p]);
            continue;
        }
        struct kt_model *m = NULL;
        kt_err err = {0};
        if (kt_model_open(path, &m, &err) != KT_OK) {
            KT_CHECK(false, "%s", err.msg);
            continue;
        }
        const struct kt_hparams *a = &m->hp;
        char text[4096];
        const char *rope = a->rope_scaling == KT_ROPE_SCALING_YARN ? "yarn" : "none";
        snprintf(text, sizeof text,
                 "{\"architectures\": [\"DeepseekV3ForCausalLM\"], \"vocab_size\": %u, \"hidden_size\": %u,"
                 " \"intermediate_size\": %u, \"moe_intermediate_size\": %u, \"num_hidden_layers\": %u,"
                 " \"num_attention_heads\": %u, \"n_shared_experts\": %u, \"n_routed_experts\": %u,"
                 " \"routed_scaling_factor\": %.9g, \"kv_lora_rank\": %u, \"q_lora_rank\": %u,"
                 " \"qk_rope_head_dim\": %u, \"v_head_dim\": %u, \"qk_nope_head_dim\": %u, \"n_group\": %u,"
                 " \"topk_group\": %u, \"num_experts_per_tok\": %u, \"first_k_dense_replace\": %u,"
                 " \"norm_topk_prob\": %s, \"scoring_func\": \"%s\", \"max_position_embeddings\": %u,"
                 " \"rms_norm_eps\": %.9g, \"rope_theta\": %.9g, \"rope_scaling\": {\"type\": \"%s\","
                 " \"factor\": %.9g, \"original_max_position_embeddings\": %u, \"beta_fast\": %.9g,"
                 " \"beta_slow\": %.9g, \"mscale_all_dim\": %.9g}}",
                 a->n_vocab, a->n_embd, a->n_ff, a->n_ff_exp, a->n_layer, a->n_head, a->n_expert_shared, a->n_expert,
                 (double)a->expert_weights_scale, a->kv_lora_rank, a->q_lora_rank, a->qk_rope_dim, a->v_head_dim,
                 a->qk_nope_dim, a->n_expert_groups, a->n_group_used, a->n_expert_used, a->n_dense_lead,
                 a->expert_weights_norm ? "true" : "false", a->gating == KT_GATING_SIGMOID ? "sigmoid" : "softmax",
                 a->n_ctx_train, (double)a->rms_eps, (double)a->rope_freq_base, rope,
                 (double)(a->rope_scaling_factor > 0 ? a->rope_scaling_factor : 1), a->rope_orig_ctx,
                 (double)a->yarn_beta_fast, (double)a->yarn_beta_slow, (double)a->yarn_log_multiplier / 0.1);
        struct kt_hparams b;
        struct kt_hf_quant q;
        KT_CHECK(parse(text, &b, &q, &err), "%s: %s\n%s", presets[p], err.msg, text);
        /* the directory's MLA is fused (one kv_b_proj): the head-count of KV and mla_split differ by design */
        b.n_head_kv = a->n_head_kv, b.mla_split = a->mla_split;
        KT_CHECK(memcmp(a, &b, sizeof b) == 0 && q.format == KT_HF_WEIGHTS_PLAIN,
                 "%s: hyperparameters differ from the GGUF's (scale %g/%g, eps %g/%g, yarn %g/%g)", presets[p],
                 (double)a->expert_weights_scale, (double)b.expert_weights_scale, (double)a->rms_eps,
                 (double)b.rms_eps, (double)a->yarn_log_multiplier, (double)b.yarn_log_multiplier);
        kt_model_close(m);
        unlink(path);
    }
}

/* Replaces the first `from` in base with `to`. */
static char *edited(const char *base, const char *from, const char *to)
{
    const char *at = strstr(base, from);
    if (!at)
        return NULL;
    char *out = kt_test_xmalloc(strlen(base) + strlen(to) + 1);
    sprintf(out, "%.*s%s%s", (int)(at - base), base, to, at + strlen(from));
    return out;
}

static void unsupported_and_malformed_configs_are_refused(void)
{
    static const struct {
        const char *from, *to;
        kt_status st;
        const char *says;
    } cases[] = {
        {"\"DeepseekV3ForCausalLM\"", "\"LlamaForCausalLM\"", KT_ERR_UNSUPPORTED, "\"LlamaForCausalLM\" is not"},
        {"\"moe_layer_freq\": 1", "\"moe_layer_freq\": 2", KT_ERR_UNSUPPORTED, "moe_layer_freq must be 1"},
        {"\"mscale\": 1.0,", "\"mscale\": 0.707,", KT_ERR_UNSUPPORTED, "rope_scaling.mscale 0.707 differs"},
        {"\"quant_method\": \"fp8\"", "\"quant_method\": \"awq\"", KT_ERR_UNSUPPORTED, "quant_method \"awq\""},
        {"\"weight_block_size\": [128, 128]", "\"weight_block_size\": null", KT_ERR_UNSUPPORTED, "weight_block_size"},
        {"\"fmt\": \"e4m3\"", "\"fmt\": \"e5m2\"", KT_ERR_UNSUPPORTED, "\"e5m2\""},
        {"\"hidden_size\": 7168", "\"hidden_size\": \"7168\"", KT_ERR_FORMAT, "hidden_size must be a whole number"},
        {"\"hidden_size\": 7168", "\"hidden_size\": -1", KT_ERR_FORMAT, "hidden_size must be a whole number"},
        {"\"rms_norm_eps\": 1e-06", "\"rms_norm_eps\": \"small\"", KT_ERR_FORMAT, "rms_norm_eps must be a number"},
        {"\"norm_topk_prob\": true", "\"norm_topk_prob\": 1", KT_ERR_FORMAT, "norm_topk_prob must be true or false"},
        {"\"scoring_func\": \"sigmoid\"", "\"scoring_func\": \"relu\"", KT_ERR_UNSUPPORTED, "scoring_func \"relu\""},
        {"\"tie_word_embeddings\": false", "\"tie_word_embeddings\": true", KT_ERR_UNSUPPORTED, "tie_word_embeddings"},
        {"\"rope_scaling\": {", "\"rope_scaling\": [], \"x\": {", KT_ERR_FORMAT, "rope_scaling must be an object"},
        {"\"vocab_size\": 129280,", "\"vocab_size\": 129280, \"vocab_size\": 1,", KT_ERR_FORMAT, "not JSON"},
        {"\"num_hidden_layers\": 61,", "", KT_ERR_NOT_FOUND, "deepseek2.block_count"},
        {"\"kv_lora_rank\": 512,", "\"kv_lora_rank\": 0,", KT_ERR_FORMAT, "kv_lora_rank"},
        {"{\"architectures\"", "[{\"architectures\"", KT_ERR_FORMAT, "not JSON"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *text = edited(deepseek_v3, cases[i].from, cases[i].to);
        KT_CHECK(text != NULL, "case %zu: %s not in the config", i, cases[i].from);
        if (!text)
            continue;
        struct kt_gguf *meta = NULL;
        struct kt_hf_quant q;
        struct kt_hparams hp;
        kt_err err = {0};
        kt_status st = kt_hf_config_parse(text, strlen(text), "ckpt/config.json", &meta, &q, &err);
        if (st == KT_OK)
            st = kt_hparams_read(meta, &hp, &err);
        KT_CHECK(st == cases[i].st && strstr(err.msg, cases[i].says), "case %zu (%s): status %d, \"%s\"", i,
                 cases[i].to, (int)st, err.msg);
        kt_gguf_close(meta);
        free(text);
    }
    static const struct {
        const char *from, *to, *says;
    } int4[] = {
        {"\"num_bits\": 4", "\"num_bits\": 8", "num_bits 4"},
        {"\"symmetric\": true", "\"symmetric\": false", "symmetric"},
        {"\"format\": \"pack-quantized\"", "\"format\": \"float-quantized\"", "\"float-quantized\""},
        {"\"group_size\": 32", "\"group_size\": 30", "multiple of 8"},
        {"\"group_size\": 32", "\"group_size\": \"32\"", "group_size"},
        {"\"ignore\": [\"lm_head\",", "\"ignore\": [7,", "ignore[0]"},
    };
    for (size_t i = 0; i < sizeof int4 / sizeof int4[0]; i++) {
        char *text = edited(kimi_k2_thinking, int4[i].from, int4[i].to);
        KT_CHECK(text != NULL, "int4 case %zu: %s not in the config", i, int4[i].from);
        if (!text)
            continue;
        struct kt_gguf *meta = NULL;
        struct kt_hf_quant q;
        kt_err err = {0};
        kt_status st = kt_hf_config_parse(text, strlen(text), "ckpt/config.json", &meta, &q, &err);
        KT_CHECK(st != KT_OK && !meta && strstr(err.msg, int4[i].says) && strstr(err.msg, "ckpt/config.json"),
                 "int4 case %zu: status %d, \"%s\"", i, (int)st, err.msg);
        kt_gguf_close(meta);
        free(text);
    }
}

static void a_directory_is_read_and_named(void)
{
    char dir[1024];
    snprintf(dir, sizeof dir, "%s", kt_test_path("Kimi-K2-Thinking"));
    mkdir(dir, 0755);
    char path[1200];
    snprintf(path, sizeof path, "%s/config.json", dir);
    unlink(path);
    struct kt_gguf *meta = NULL;
    struct kt_hf_quant q;
    kt_err err = {0};
    KT_CHECK(kt_hf_config_read(dir, &meta, &q, &err) != KT_OK && !meta && strstr(err.msg, "config.json"),
             "no config.json: \"%s\"", err.msg);
    const char *text = "{" KIMI_MODEL "}"; /* no _name_or_path: the folder (Kimi-K2-Thinking.PID) names it */
    FILE *f = fopen(path, "w");
    KT_CHECK(f && fputs(text, f) >= 0 && fclose(f) == 0, "writing %s", path);
    KT_CHECK(kt_hf_config_read(dir, &meta, &q, &err) == KT_OK, "%s", err.msg);
    struct kt_gguf_str name = {0};
    KT_CHECK(meta && kt_gguf_get_str(meta, "general.name", &name, &err) == KT_OK && name.len == strlen(strrchr(dir, '/') + 1) &&
                 memcmp(name.ptr, strrchr(dir, '/') + 1, name.len) == 0 && q.format == KT_HF_WEIGHTS_PLAIN,
             "general.name \"%.*s\", format %d", (int)name.len, name.ptr, (int)q.format);
    kt_gguf_close(meta);
    unlink(path);
    rmdir(dir);
}

int main(void)
{
    KT_RUN(deepseek_v3_reads_as_its_config_says);
    KT_RUN(kimi_int4_and_k25_read_as_their_configs_say);
    KT_RUN(a_synth_models_hparams_round_trip);
    KT_RUN(unsupported_and_malformed_configs_are_refused);
    KT_RUN(a_directory_is_read_and_named);
    return kt_test_finish();
}
