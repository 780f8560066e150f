/*
 * info.c - kt-run --info: the file, every hyperparameter and the values
 * derived from them, tensor bytes by class, and the memory each GPU/CPU
 * placement needs; with --placement, a dry run of that plan (expert homes,
 * memory per node and device, whether it fits: placement_opt.h).  It prints
 * what the library computes and must never compute model facts itself.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine_plan.h"
#include "gguf.h"
#include "hf_model.h"
#include "hf_tensors.h"
#include "meminfo.h"
#include "model_chat.h"
#include "model.h"
#include "placement_opt.h"
#include "preflight.h"
#include "quant.h"
#include "run.h"
#include "status.h"

#define DEFAULT_CTX 4096u


static double gib(uint64_t bytes)
{
    return (double)bytes / (1024.0 * 1024.0 * 1024.0);
}

/* 1.03 T, 15.7 B, 2.1 M, 950 */
static const char *human_count(uint64_t n, char *buf, size_t size)
{
    static const char *units[] = {"", " K", " M", " B", " T"};
    double v = (double)n;
    int u = 0;
    while (v >= 1000.0 && u < 4) {
        v /= 1000.0;
        u++;
    }
    snprintf(buf, size, u ? "%.2f%s" : "%.0f%s", v, units[u]);
    return buf;
}

static const char *types_list(uint64_t mask, char *buf, size_t size)
{
    size_t k = 0;
    buf[0] = 0;
    for (int t = 0; t < 64 && k < size; t++)
        if (mask & (1ull << t))
            k += (size_t)snprintf(buf + k, size - k, "%s%s", k ? ", " : "", kt_type_name(t));
    return buf;
}

static void row(const char *name, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void row(const char *name, const char *fmt, ...)
{
    va_list ap;
    printf("  %-30s ", name);
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
}

static void str_value(const struct kt_gguf *g, const char *key, char *buf, size_t size)
{
    struct kt_gguf_str s;
    if (!kt_gguf_find_kv(g, key) || kt_gguf_get_str(g, key, &s, NULL) != KT_OK) {
        snprintf(buf, size, "-");
        return;
    }
    snprintf(buf, size, "%.*s", (int)(s.len < size ? s.len : size - 1), s.ptr);
}

static void print_file(const char *path, const struct kt_model *m)
{
    const struct kt_gguf *g = m->gguf;
    char model[64], pre[64];
    str_value(g, "tokenizer.ggml.model", model, sizeof model);
    str_value(g, "tokenizer.ggml.pre", pre, sizeof pre);
    const struct kt_gguf_array *tokens = NULL;
    if (kt_gguf_find_kv(g, "tokenizer.ggml.tokens"))
        kt_gguf_get_array(g, "tokenizer.ggml.tokens", &tokens, NULL);

    printf("file\n");
    row("path", "%s", path);
    if (m->hf) { /* a checkpoint directory: what it holds, its stored form and shards */
        char what[400];
        kt_err err = {0};
        if (kt_hf_describe(path, what, sizeof what, &err) == KT_OK)
            row("checkpoint", "%s", what);
        row("stored weights", "%llu bytes (%.2f GiB); converted at load as hf_model.h says",
            (unsigned long long)kt_hf_stored_bytes(m->hf), gib(kt_hf_stored_bytes(m->hf)));
    } else {
        row("size", "%llu bytes (%.2f GiB)", (unsigned long long)g->file_bytes, gib(g->file_bytes));
        row("GGUF version", "%u", g->version);
    }
    row("name", "%s", m->name[0] ? m->name : "-");
    row("architecture", "%s", m->arch);
    row("tokenizer", "%s, pre %s", model, pre);
    if (tokens)
        row("tokenizer tokens", "%llu", (unsigned long long)tokens->count);
    else
        row("tokenizer tokens", "-");
}

static void print_hparams(const struct kt_model *m)
{
    const struct kt_hparams *hp = &m->hp;
    printf("hyperparameters\n");
    row("layers", "%u (%u dense, %u MoE)", hp->n_layer, hp->n_dense_lead, hp->n_layer - hp->n_dense_lead);
    row("context length (training)", "%u", hp->n_ctx_train);
    row("embedding width (E)", "%u", hp->n_embd);
    row("dense FFN width (F)", "%u", hp->n_ff);
    row("attention heads (H)", "%u", hp->n_head);
    row("KV heads (as stored)", "%u", hp->n_head_kv);
    row("q LoRA rank", hp->q_lora_rank ? "%u" : "%u (plain attn_q)", hp->q_lora_rank);
    row("kv LoRA rank", "%u", hp->kv_lora_rank);
    row("qk nope head dim (dn)", "%u", hp->qk_nope_dim);
    row("qk rope head dim (dr)", "%u", hp->qk_rope_dim);
    row("v head dim (dv)", "%u", hp->v_head_dim);
    row("MLA form", "%s", hp->mla_split ? "split (attn_k_b, attn_v_b)" : "fused (attn_kv_b)");
    row("RMS norm epsilon", "%g", (double)hp->rms_eps);
    row("rope freq base", "%g", (double)hp->rope_freq_base);
    row("rope scaling", "%s", kt_rope_scaling_name(hp->rope_scaling));
    row("rope scaling factor", "%g", (double)hp->rope_scaling_factor);
    row("rope original context", "%u", hp->rope_orig_ctx);
    row("yarn log multiplier", "%g", (double)hp->yarn_log_multiplier);
    row("yarn beta fast", "%g", (double)hp->yarn_beta_fast);
    row("yarn beta slow", "%g", (double)hp->yarn_beta_slow);
    row("rope attn factor", "%g", (double)hp->rope_attn_factor);
    row("routed experts", "%u", hp->n_expert);
    row("experts used per token", "%u", hp->n_expert_used);
    row("shared experts", "%u", hp->n_expert_shared);
    row("expert FFN width (f)", "%u", hp->n_ff_exp);
    row("expert groups", "%u", hp->n_expert_groups);
    row("expert groups used", "%u", hp->n_group_used);
    row("gating", "%s", kt_gating_name(hp->gating));
    row("expert weights norm", "%s", hp->expert_weights_norm ? "yes" : "no");
    row("expert weights scale", "%g", (double)hp->expert_weights_scale);
    row("vocabulary", "%u", hp->n_vocab);

    printf("derived\n");
    row("qk head dim (dk = dn+dr)", "%u", hp->qk_nope_dim + hp->qk_rope_dim);
    row("mscale", "%.6f", kt_hparams_yarn_mscale(hp));
    row("kq_scale (mscale^2/sqrt(dk))", "%.6f", kt_hparams_kq_scale(hp));
    row("KV cache row (kvr+dr)", "%u values per token per layer", hp->kv_lora_rank + hp->qk_rope_dim);
    if (hp->n_expert)
        row("experts per group", "%u", hp->n_expert / hp->n_expert_groups);
    char count[32];
    row("parameters", "%s (%llu)", human_count(m->n_params, count, sizeof count), (unsigned long long)m->n_params);
    row("output", "%s", m->output_tied ? "tied to token_embd" : "output.weight");
}

static void print_tensors(const struct kt_model *m)
{
    uint64_t total = 0;
    for (int c = 0; c < KT_CLASS_COUNT; c++)
        total += m->class_bytes[c];
    printf("tensors\n");
    row("in the file", "%llu", (unsigned long long)m->gguf->n_tensors);
    row("used by kt", "%u", m->n_tensors_used);
    row("not used by kt", "%u (%.2f GiB)", m->n_tensors_extra, gib(m->extra_bytes));
    printf("  %-20s %7s %10s %7s %16s  %s\n", "class", "tensors", "GiB", "%", "bytes", "types");
    for (int c = 0; c < KT_CLASS_COUNT; c++) {
        char types[256];
        double pct = total ? 100.0 * (double)m->class_bytes[c] / (double)total : 0.0;
        printf("  %-20s %7u %10.2f %6.1f%% %16llu  %s\n", kt_tensor_class_name((enum kt_tensor_class)c),
               m->class_tensors[c], gib(m->class_bytes[c]), pct, (unsigned long long)m->class_bytes[c],
               types_list(m->class_types[c], types, sizeof types));
    }
    printf("  %-20s %7u %10.2f %6.1f%% %16llu\n", "total", m->n_tensors_used, gib(total), total ? 100.0 : 0.0,
           (unsigned long long)total);
}

/* Memory needs count the KV cache at the row type --kv-type gives (runtime/forward/kv_cache.h). */
static void print_memory_row(const struct kt_model *m, const char *label, int gpu_experts, uint32_t ctx,
                             enum kt_row_type kv_type)
{
    struct kt_memory_need need = kt_model_memory_need(m, gpu_experts, ctx, (uint32_t)kt_row_type_size(kv_type));
    printf("  %-36s %10.2f %10.2f\n", label, gib(need.gpu_bytes), gib(need.cpu_bytes));
}

/* What this process can still allocate, and which limit decides: the host's
 * MemAvailable or its cgroup's (a container's) memory limit. */
static void print_available(void)
{
    struct kt_meminfo mi;
    kt_err err = {0};
    if (kt_meminfo_read(NULL, &mi, &err) != KT_OK) {
        printf("  %-36s cannot tell: %s\n", "available to this process", err.msg);
        return;
    }
    const struct kt_cgroup_memory *cg = &mi.cgroup;
    if (cg->limited && cg->room_bytes < mi.host_available_bytes)
        printf("  %-36s %10.2f GiB: cgroup v%d limit %.2f GiB (%s), %.2f GiB in use; the host has %.2f GiB\n",
               "available to this process", gib(mi.available_bytes), cg->version, gib(cg->limit_bytes),
               cg->limit_path, gib(cg->used_bytes), gib(mi.host_available_bytes));
    else
        printf("  %-36s %10.2f GiB: MemAvailable%s\n", "available to this process", gib(mi.available_bytes),
               cg->limited ? " (its cgroup's limit leaves more)" : "");
    if (cg->note[0])
        printf("  %-36s %s\n", "", cg->note);
}

/* Rows: all on CPU, attention+shared on GPU, then each asked count of GPU
 * experts per layer; counts past the model's experts all mean "every
 * expert", so each distinct placement is shown once. */
static void print_memory(const struct kt_model *m, const struct kt_run_options *o)
{
    uint32_t ctx = o->ctx ? o->ctx : (m->hp.n_ctx_train < DEFAULT_CTX ? m->hp.n_ctx_train : DEFAULT_CTX);
    const uint32_t kv_value_bytes = (uint32_t)kt_row_type_size(o->kv_type);
    printf("memory at context %u (KV cache %s, as the engine stores it: %.2f GiB; %llu bytes per token = %u layers "
           "x %u values x %u bytes)\n",
           ctx, kt_row_type_name(o->kv_type), gib(kt_model_memory_need(m, -1, ctx, kv_value_bytes).kv_cache_bytes),
           (unsigned long long)m->hp.n_layer * (m->hp.kv_lora_rank + m->hp.qk_rope_dim) * kv_value_bytes,
           m->hp.n_layer, m->hp.kv_lora_rank + m->hp.qk_rope_dim, kv_value_bytes);
    printf("  %-36s %10s %10s\n", "placement", "GPU GiB", "CPU GiB");
    print_memory_row(m, "all on CPU", -1, ctx, o->kv_type);
    print_memory_row(m, "attention+shared on GPU", 0, ctx, o->kv_type);

    uint32_t shown[KT_RUN_MAX_GPU_COUNTS + 1] = {0};
    int n_shown = 1;
    for (int i = 0; i < o->n_gpu_experts; i++) {
        uint32_t n = (uint32_t)o->gpu_experts[i] < m->hp.n_expert ? (uint32_t)o->gpu_experts[i] : m->hp.n_expert;
        bool seen = false;
        for (int j = 0; j < n_shown; j++)
            seen |= shown[j] == n;
        if (seen)
            continue;
        shown[n_shown++] = n;
        char label[64];
        if (n == m->hp.n_expert)
            snprintf(label, sizeof label, "+ all %u experts/layer on GPU", n);
        else
            snprintf(label, sizeof label, "+ %u experts/layer on GPU", n);
        print_memory_row(m, label, (int)n, ctx, o->kv_type);
    }
    print_available();
}

/* --info --placement FILE: the plan as kt-run would run it, nothing loaded.
 * Returns whether it fits this machine; err says why not (or what failed). */
static bool dry_run(const struct kt_run_options *o, const struct kt_model *m, kt_err *err)
{
    struct kt_placement *p = NULL;
    struct kt_engine_plan plan = {0};
    struct kt_engine_params ep = {.n_ctx = o->ctx, .kv_type = o->kv_type};
    bool fits = false;
    printf("placement (a dry run: nothing is loaded)\n");
    fflush(stdout);
    if (kt_tool_placement_resolve(o->placement, m, NULL, &p, err) == KT_OK) {
        kt_placement_describe(p, stdout);
        fflush(stdout); /* kt_engine_plan_apply's notes (e.g. running CPU-only) in their place */
        struct kt_tool_kv_pool pool;
        if (kt_engine_plan_apply(p, &plan, &ep, stdout, err) == KT_OK &&
            (!o->kv_type_given || (ep.kv_type = o->kv_type, true)) && /* --kv-type wins over kv_cache.type */
            kt_tool_kv_pool_size(m, p, &ep, &(struct kt_tool_kv_request){.ctx = o->ctx}, &pool, err) == KT_OK) {
            ep.n_ctx = pool.n_ctx; /* the pool kt-run would make, counted below */
            ep.kv_blocks = pool.n_blocks;
            printf("%s\n", pool.line);
            printf("expert homes, per MoE layer (layers placed alike together)\n");
            kt_tool_print_layer_homes(stdout, p);
            fits = kt_tool_placement_fits(stdout, m, p, &ep, err);
        }
    }
    kt_engine_plan_free(&plan);
    kt_placement_destroy(p);
    return fits;
}

/* How chat messages render: a native revision, the interpreter, or not at
 * all (and why).  false (after a message) only when --chat-template FILE was
 * given and cannot be used. */
static bool print_chat_template(const struct kt_model *m, const char *override_path)
{
    kt_chat_format format;
    char *text = NULL;
    kt_err err = {0};
    kt_status st = kt_tool_chat_template(m, override_path, "no chat template", &format, &text, &err);
    free(text);
    if (st != KT_OK && override_path) {
        fprintf(stderr, "kt-run: %s\n", err.msg);
        return false;
    }
    const char *from = override_path ? override_path : "tokenizer.chat_template";
    if (st != KT_OK)
        row("chat template", "none: %s (chat requests are refused)", err.msg);
    else if (format == KT_CHAT_JINJA)
        row("chat template", "jinja (unrecognised template: rendered by the interpreter), from %s", from);
    else
        row("chat template", "%s (rendered natively), from %s", kt_chat_format_name(format), from);
    return true;
}

int kt_run_info(const struct kt_run_options *o)
{
    struct kt_model *m;
    kt_err err = {0};
    if (kt_model_open(o->model, &m, &err) != KT_OK) {
        fprintf(stderr, "kt-run: %s\n", err.msg); /* the message starts with the path */
        return 1;
    }
    if (kt_tool_check_context("--ctx", o->ctx, m, o->model, &err) != KT_OK) {
        fprintf(stderr, "kt-run: %s\n", err.msg);
        kt_model_close(m);
        return 1;
    }
    print_file(o->model, m);
    if (!print_chat_template(m, o->chat_template)) {
        kt_model_close(m);
        return 1;
    }
    print_hparams(m);
    print_tensors(m);
    print_memory(m, o);
    bool fits = !o->placement || dry_run(o, m, &err);
    kt_model_close(m);
    if (fflush(stdout) != 0) {
        fprintf(stderr, "kt-run: writing output: %s\n", strerror(errno));
        return 1;
    }
    if (!fits) {
        fprintf(stderr, "kt-run: %s%s\n", err.status == KT_ERR_NOMEM ? "the plan does not fit this machine: " : "",
                err.msg);
        return 1;
    }
    return 0;
}

