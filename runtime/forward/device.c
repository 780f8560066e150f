/*
 * device.c - the engine's accelerator (backend.h): what the placement puts on
 * it is copied there at creation, and each step sends it work.
 *
 * Per layer with attention there: x goes to the device, through attention
 * (and in MoE layers the FFN norm and the router), and comes back with h and
 * the routing in one round trip (kt_dev_attention_layer); decode-sized
 * batches replay that part from a graph.  The device's expert units are
 * queued by moe.c beside the CPU's; the output head may run there too
 * (kt_dev_head).  Every piece has a host half (the sim runs kt's CPU code on
 * its queue) and a cuda half (enqueues kernels from kernels/cuda).  State:
 * struct kt_engine_device (forward.h), all zero without a device.
 */
#include <stdlib.h>
#include <string.h>

#include "forward.h"
#include "lt_plan.h"
#include "mla_plan.h"

/* ---- creation ------------------------------------------------------------------------------ */

/* `bytes` of device memory, remembered for destroy. */
static kt_status device_alloc(struct kt_engine *e, size_t bytes, void **ptr, kt_err *err)
{
    if (e->dev.sizing) { /* the first pass only adds up what the second will take */
        e->dev.need_bytes += bytes;
        *ptr = e; /* any non-NULL address: never read or written in this pass */
        return KT_OK;
    }
    if (e->dev.n_blocks == e->dev.max_blocks)
        return kt_err_set(err, KT_ERR_INVALID, "engine: device block table full");
    kt_status st = kt_backend_alloc(e->dev.backend, bytes, ptr, err);
    if (st == KT_OK) {
        e->dev.blocks[e->dev.n_blocks] = *ptr;
        e->dev.block_bytes[e->dev.n_blocks++] = bytes;
    }
    return st;
}

/* A copy of matrix m in device memory (rows as they are). */
static kt_status device_mat(struct kt_engine *e, struct kt_mat *m, kt_err *err)
{
    void *p = NULL;
    const size_t bytes = (size_t)kt_mat_bytes(m);
    struct kt_cuda_mat cm = kt_fwd_cuda_mat(m);
    if (!cm.data) /* sizing a checkpoint's streamed expert: its rows are read only to be placed; the check needs
                     an address, never read, aligned as the device buffer will be */
        cm.data = (const void *)e;
    kt_status st;
    if (e->dev.sizing && kt_backend_kind(e->dev.backend) == KT_BACKEND_CUDA && /* refused before anything is placed */
        (st = kt_cuda_mat_usable(&cm, kt_type_name(m->type), err)) != KT_OK) {
        kt_err_prefix(err, "device '%s'", kt_backend_name(e->dev.backend));
        return st;
    }
    st = device_alloc(e, bytes, &p, err);
    if (st == KT_OK && !e->dev.sizing) {
        kt_backend_copy_in(e->dev.backend, p, m->data, bytes);
        m->data = p;
    }
    return st;
}

/* A copy of n floats in device memory. */
static kt_status device_floats(struct kt_engine *e, const float **v, size_t n, kt_err *err)
{
    void *p = NULL;
    if (!*v)
        return KT_OK;
    kt_status st = device_alloc(e, n * sizeof(float), &p, err);
    if (st == KT_OK && !e->dev.sizing) {
        kt_backend_copy_in(e->dev.backend, p, *v, n * sizeof(float));
        *v = p;
    }
    return st;
}

/* The KV cache's copy-on-write copy of a block, on the device's queue. */
static void device_copy_block(void *ctx, void *dst, const void *src, size_t bytes)
{
    struct kt_engine *e = ctx;
    kt_backend_copy_device(e->dev.backend, dst, src, bytes);
}

/* ---- working buffers: what the device keeps besides weights and the KV cache --------------- */

/* One working buffer: where its address goes, and its size. */
struct work_buf {
    void **ptr;
    size_t bytes;
};
#define MAX_WORK_BUFS 16

/* The FFN buffers, sized as the host's (engine.c layout_buffers): h for T
 * tokens, the pairs' token ids, activations, quantized activations and
 * outputs for T (k + 1) pairs (the shared experts' too), and the quantized
 * h in four formats and per pair for gate and up. */
static int ffn_work(struct kt_engine *e, const struct kt_fwd_act_sizes *s, struct work_buf *w)
{
    const size_t T = e->params.max_batch_tokens, E = e->hp.n_embd, pairs = T * (e->hp.n_expert_used + 1);
    struct kt_moe_bufs *b = &e->dev.bufs;
    const size_t act = kt_fwd_act_floats(s, T, pairs), act_q = kt_fwd_act_q_bytes(s, T, pairs), hq = s->ffn_in;
    int n = 0;
    w[n++] = (struct work_buf){(void **)&e->dev.h, T * E * sizeof(float)};
    w[n++] = (struct work_buf){(void **)&e->dev.pair_token, pairs * sizeof(uint32_t)};
    w[n++] = (struct work_buf){(void **)&b->act, act * sizeof(float)};
    w[n++] = (struct work_buf){(void **)&b->act_q, act_q};
    w[n++] = (struct work_buf){(void **)&b->pair_out, pairs * E * sizeof(float)};
    for (int i = 0; i < 4; i++)
        w[n++] = (struct work_buf){(void **)&b->hq[i], T * hq};
    w[n++] = (struct work_buf){(void **)&b->hq_pairs_gate, pairs * hq};
    w[n++] = (struct work_buf){(void **)&b->hq_pairs_up, pairs * hq};
    return n;
}

/* With attention there: the residual stream x and, in a model with experts, the router's logits and choice. */
static int attention_work(struct kt_engine *e, struct work_buf *w)
{
    const size_t T = e->params.max_batch_tokens, k = e->hp.n_expert_used;
    int n = 0;
    if (e->hp.n_expert > 0) {
        w[n++] = (struct work_buf){(void **)&e->dev.router_logits, T * e->hp.n_expert * sizeof(float)};
        w[n++] = (struct work_buf){(void **)&e->dev.route_experts, T * k * sizeof(uint32_t)};
        w[n++] = (struct work_buf){(void **)&e->dev.route_weights, T * k * sizeof(float)};
    }
    w[n++] = (struct work_buf){(void **)&e->dev.x, T * e->hp.n_embd * sizeof(float)};
    return n;
}

/* With the output head there: its input rows and the logits. */
static int head_work(struct kt_engine *e, struct work_buf *w)
{
    const size_t T = e->params.max_batch_tokens;
    w[0] = (struct work_buf){(void **)&e->dev.head_x, T * e->hp.n_embd * sizeof(float)};
    w[1] = (struct work_buf){(void **)&e->dev.logits, T * e->hp.n_vocab * sizeof(float)};
    return 2;
}

/* What the cuda attention works in: per-step buffers for max_batch_tokens
 * tokens, the step's cache tables, MLA's scratch sized for the worst token
 * count at a full context and cuBLASLt's for the largest projection at a
 * full batch (the file's shapes; device copies are at least as aligned), both
 * by the GPU path's own arithmetic (mla_plan.h, lt_plan.h), which needs no
 * device or weights: a planner that read only a header gets the same. */
static int cuda_work(struct kt_engine *e, struct work_buf *w)
{
    const struct kt_hparams *hp = &e->hp;
    const size_t T = e->params.max_batch_tokens, E = hp->n_embd, H = hp->n_head, dr = hp->qk_rope_dim;
    const size_t dk = hp->qk_nope_dim + dr, kvr = hp->kv_lora_rank, n_ctx = e->params.n_ctx;
    const size_t seqs = T < e->params.max_seqs ? T : e->params.max_seqs;
    const size_t blocks = seqs * ((n_ctx + e->params.kv_block_tokens - 1) / e->params.kv_block_tokens);
    const struct kt_cuda_mla shape = {.n_head = H, .nope_dim = hp->qk_nope_dim, .rope_dim = dr,
                                      .v_dim = hp->v_head_dim, .kv_rank = kvr, .kq_scale = e->kq_scale};
    size_t mla_scratch = 0;
    for (size_t t = 1; t <= T; t++) { /* the split of the context, so the scratch, varies with the token count */
        const size_t bytes = mla_scratch_total(&shape, (int64_t)t, (int64_t)n_ctx);
        mla_scratch = bytes > mla_scratch ? bytes : mla_scratch;
    }
    size_t lt_scratch = 0;
    for (uint32_t il = e->params.layer_begin; T >= KT_CUDA_LT_MIN_TOKENS && il < e->params.layer_end; il++) {
        const struct kt_layer *L = &e->model->layers[il];
        const struct kt_gguf_tensor *mats[] = {L->attn_q_a, L->attn_q_b, L->attn_q, L->attn_kv_a_mqa, L->attn_output};
        for (size_t i = 0; i < sizeof mats / sizeof mats[0]; i++) {
            if (!mats[i])
                continue;
            const struct kt_mat m = kt_mat_from_tensor(mats[i]);
            const struct kt_cuda_mat cm = kt_fwd_cuda_mat(&m);
            const size_t bytes = lt_scratch_total(&cm, (int64_t)T);
            lt_scratch = bytes > lt_scratch ? bytes : lt_scratch;
        }
    }
    struct kt_cuda_attention_step *s = &e->dev.cuda_step;
    s->mla_scratch_bytes = mla_scratch;
    s->lt_scratch_bytes = lt_scratch;
    int n = 0;
    w[n++] = (struct work_buf){(void **)&s->h, T * E * sizeof(float)};
    w[n++] = (struct work_buf){(void **)&s->qa, T * (hp->q_lora_rank ? hp->q_lora_rank : 1) * sizeof(float)};
    w[n++] = (struct work_buf){(void **)&s->q, T * H * dk * sizeof(float)};
    w[n++] = (struct work_buf){(void **)&s->kv_a, T * (kvr + dr) * sizeof(float)};
    w[n++] = (struct work_buf){(void **)&s->o, T * H * hp->v_head_dim * sizeof(float)};
    w[n++] = (struct work_buf){(void **)&s->y, T * E * sizeof(float)};
    w[n++] = (struct work_buf){(void **)&s->cos_sin, T * dr * sizeof(float)};
    w[n++] = (struct work_buf){(void **)&s->cache.block_ids, (blocks ? blocks : 1) * sizeof(uint32_t)};
    w[n++] = (struct work_buf){(void **)&s->cache.first_block, T * sizeof(uint32_t)};
    w[n++] = (struct work_buf){(void **)&s->cache.n_kv, T * sizeof(uint32_t)};
    w[n++] = (struct work_buf){&s->mla_scratch, mla_scratch};
    if (lt_scratch)
        w[n++] = (struct work_buf){&s->lt_scratch, lt_scratch};
    return n;
}

static kt_status alloc_work(struct kt_engine *e, const struct work_buf *w, int n, kt_err *err)
{
    for (int i = 0; i < n; i++) {
        kt_status st = device_alloc(e, w[i].bytes, w[i].ptr, err);
        if (st)
            return st;
        if (!e->dev.sizing)
            e->dev.work_bytes += w[i].bytes;
    }
    return KT_OK;
}

static size_t work_bytes(const struct work_buf *w, int n)
{
    size_t sum = 0;
    for (int i = 0; i < n; i++)
        sum += w[i].bytes;
    return sum;
}

uint64_t kt_engine_device_work_bytes(const struct kt_model *m, const struct kt_engine_params *p, bool cuda)
{
    struct kt_engine *e = calloc(1, sizeof *e); /* a stand-in: only sizes are read from it */
    if (!e)
        return 0;
    e->model = (struct kt_model *)m;
    e->hp = m->hp;
    e->params = kt_fwd_params_resolved(&m->hp, p);
    const struct kt_fwd_act_sizes s = kt_fwd_act_sizes(m);
    struct work_buf w[MAX_WORK_BUFS];
    uint64_t sum = work_bytes(w, ffn_work(e, &s, w));
    if (e->params.attention_on_device)
        sum += work_bytes(w, attention_work(e, w)) + (cuda ? work_bytes(w, cuda_work(e, w)) : 0);
    if (e->params.output_on_device && e->params.layer_begin == 0)
        sum += work_bytes(w, head_work(e, w));
    free(e);
    return sum;
}

/* What the cuda attention works in (cuda_work), then its layers' shapes. */
static kt_status cuda_attention_buffers(struct kt_engine *e, kt_err *err)
{
    const struct kt_hparams *hp = &e->hp;
    const size_t dr = hp->qk_rope_dim, kvr = hp->kv_lora_rank;
    const struct kt_cuda_mla shape = {.n_head = hp->n_head, .nope_dim = hp->qk_nope_dim, .rope_dim = dr,
                                      .v_dim = hp->v_head_dim, .kv_rank = kvr, .kq_scale = e->kq_scale};
    struct work_buf w[MAX_WORK_BUFS];
    const int n = cuda_work(e, w);
    struct kt_cuda_attention_step *s = &e->dev.cuda_step;
    if (!kt_cuda_mla_scratch_bytes(&shape, 1, (int64_t)e->params.n_ctx))
        return kt_err_set(err, KT_ERR_UNSUPPORTED, "device '%s': the GPU's MLA kernel does not take this shape "
                          "(%u heads, kv rank %u, rope %u)", kt_backend_name(e->dev.backend), hp->n_head, hp->kv_lora_rank,
                          hp->qk_rope_dim);
    kt_status st = alloc_work(e, w, n, err);
    if (st)
        return st;
    s->cache.pool = e->dev.kv_pool;
    s->cache.block_tokens = e->params.kv_block_tokens;
    s->cache.block_elems = (int64_t)hp->n_layer * e->params.kv_block_tokens * (int64_t)(kvr + dr);
    s->cache.row_type = (int)e->params.kv_type;
    s->x = e->dev.x;
    if (e->dev.sizing)
        return KT_OK;
    if (!(e->dev.cuda_layers = calloc(hp->n_layer, sizeof *e->dev.cuda_layers)))
        return kt_err_set(err, KT_ERR_NOMEM, "engine: out of memory");
    for (uint32_t il = e->params.layer_begin; il < e->params.layer_end; il++) { /* a stage: its layers */
        const struct kt_layer_weights *L = &e->dev.layers[il];
        struct kt_cuda_mla mla = shape;
        mla.w_uk = kt_fwd_cuda_mat(&L->uk);
        mla.w_uv = kt_fwd_cuda_mat(&L->uv);
        e->dev.cuda_layers[il] = (struct kt_cuda_attention_layer){
            .attn_norm = L->attn_norm, .q_a_norm = L->q_a_norm, .kv_a_norm = L->kv_a_norm,
            .q_a = kt_fwd_cuda_mat(&L->q_a), .q_b = kt_fwd_cuda_mat(&L->q_b), .q = kt_fwd_cuda_mat(&L->q),
            .kv_a = kt_fwd_cuda_mat(&L->kv_a), .out = kt_fwd_cuda_mat(&L->out), .mla = mla,
            .n_embd = hp->n_embd, .q_rank = hp->q_lora_rank, .eps = hp->rms_eps};
    }
    return KT_OK;
}

/* Every layer's attention weights copied to the device (device_layers),
 * the residual stream's buffer there, and the KV cache, whose pool lives in
 * device memory from here on; on cuda also what its kernels work in. */
static kt_status device_attention(struct kt_engine *e, kt_err *err)
{
    const struct kt_hparams *hp = &e->hp;
    const bool cuda = kt_backend_kind(e->dev.backend) == KT_BACKEND_CUDA;
    if (cuda && e->layers[0].fused_kv_b)
        return kt_err_set(err, KT_ERR_UNSUPPORTED,
                          "device '%s': the GPU's MLA reads split attn_k_b / attn_v_b tensors and this file has "
                          "the fused attn_kv_b; place attention on the cpu or convert the file",
                          kt_backend_name(e->dev.backend));
    if (!e->dev.layers && !(e->dev.layers = calloc(hp->n_layer, sizeof *e->dev.layers)))
        return kt_err_set(err, KT_ERR_NOMEM, "engine: out of memory");
    kt_status st = KT_OK;
    for (uint32_t il = e->params.layer_begin; il < e->params.layer_end && st == KT_OK; il++) { /* a stage: its own */
        struct kt_layer_weights *L = &e->dev.layers[il];
        *L = e->layers[il];
        const bool uv_is_uk = L->uv.data == L->uk.data; /* fused attn_kv_b: one tensor for both */
        struct kt_mat *mats[] = {&L->q_a, &L->q_b, &L->q, &L->kv_a, &L->uk, &L->out};
        for (size_t i = 0; i < sizeof mats / sizeof mats[0] && st == KT_OK; i++)
            if (mats[i]->data)
                st = device_mat(e, mats[i], err);
        if (st == KT_OK && L->uv.data)
            L->uv.data = uv_is_uk ? L->uk.data : L->uv.data;
        if (st == KT_OK && !uv_is_uk && L->uv.data)
            st = device_mat(e, &L->uv, err);
        if (st == KT_OK)
            st = device_floats(e, &L->attn_norm, hp->n_embd, err);
        if (st == KT_OK)
            st = device_floats(e, &L->q_a_norm, hp->q_lora_rank, err);
        if (st == KT_OK)
            st = device_floats(e, &L->kv_a_norm, hp->kv_lora_rank, err);
        if (st == KT_OK && L->is_moe) /* the FFN norm and router follow attention */
            st = device_floats(e, &L->ffn_norm, hp->n_embd, err);
        if (st == KT_OK && L->is_moe)
            st = device_mat(e, &L->router, err);
        if (st == KT_OK && L->is_moe)
            st = device_floats(e, &L->exp_probs_b, hp->n_expert, err);
    }
    struct work_buf w[MAX_WORK_BUFS];
    if (st == KT_OK)
        st = alloc_work(e, w, attention_work(e, w), err);
    /* the KV cache's pool */
    uint64_t kv_bytes = 0;
    struct kt_kv_cache_params kp = kt_fwd_kv_params(e);
    if (st == KT_OK && (st = kt_kv_cache_pool_bytes(&kp, &kv_bytes, err)) == KT_OK)
        st = device_alloc(e, (size_t)kv_bytes, &e->dev.kv_pool, err);
    if (st == KT_OK && !e->dev.sizing) { /* its copy-on-write copies run on the device's queue */
        kp.storage = e->dev.kv_pool;
        kp.copy_block = device_copy_block;
        kp.copy_ctx = e;
        st = kt_kv_cache_create(&kp, &e->kv, err);
    }
    if (st == KT_OK && !e->dev.sizing) { /* the jobs, and the graphs decode batches replay */
        const size_t n_jobs = (size_t)hp->n_layer * (KT_GRAPH_TOKENS + 1);
        const size_t n_graphs = (size_t)hp->n_layer * KT_GRAPH_SLOTS;
        if (!(e->dev.jobs = calloc(n_jobs, sizeof *e->dev.jobs)) ||
            (!e->test.no_device_graphs && (!(e->dev.graphs = calloc(n_graphs, sizeof *e->dev.graphs)) ||
                                             !(e->dev.graph_seen = calloc(n_graphs, 1)))))
            return kt_err_set(err, KT_ERR_NOMEM, "engine: out of memory");
        for (size_t i = 0; i < n_jobs; i++)
            e->dev.jobs[i] = (struct kt_device_job){e, (uint32_t)(i / (KT_GRAPH_TOKENS + 1)),
                                                       (uint32_t)(i % (KT_GRAPH_TOKENS + 1))};
    }
    if (st == KT_OK && cuda)
        st = cuda_attention_buffers(e, err);
    return st;
}

/* The FFN buffers again, in device memory. */
static kt_status device_bufs(struct kt_engine *e, kt_err *err)
{
    e->dev.bufs = e->bufs; /* the strides; the buffers are the device's */
    const struct kt_fwd_act_sizes s = kt_fwd_act_sizes(e->model);
    struct work_buf w[MAX_WORK_BUFS];
    return alloc_work(e, w, ffn_work(e, &s, w), err);
}

/* Creates the device and copies in the experts (and shared experts) the
 * params put on it, then its working buffers; fails naming the device when
 * they do not fit its budget. */
static kt_status place_on_device(struct kt_engine *e, const struct kt_engine_params *d, kt_err *err);

kt_status kt_dev_create(struct kt_engine *e, const struct kt_engine_params *d, kt_err *err)
{
    const struct kt_hparams *hp = &e->hp;
    const size_t n_experts = (size_t)hp->n_layer * hp->n_expert;
    kt_status st = kt_backend_create(d->device, &e->dev.backend, err);
    if (st)
        return st;
    /* 3 matrices per expert; per layer at most 3 dense or 3 shared matrices,
     * 7 attention matrices, 3 norms; the buffers, the KV pool and the attention buffers */
    e->dev.max_blocks = (uint32_t)(3 * n_experts + 16 * (size_t)hp->n_layer + 64);
    e->dev.blocks = calloc(e->dev.max_blocks, sizeof *e->dev.blocks);
    e->dev.block_bytes = calloc(e->dev.max_blocks, sizeof *e->dev.block_bytes);
    e->dev.block_retired = calloc(e->dev.max_blocks, sizeof *e->dev.block_retired);
    e->dev.experts = calloc(n_experts ? n_experts : 1, sizeof *e->dev.experts);
    e->dev.cuda_units = calloc((size_t)hp->n_expert + 1, sizeof *e->dev.cuda_units);
    e->dev.shared = d->shared_on_device ? calloc(hp->n_layer, sizeof *e->dev.shared) : NULL;
    e->dev.dense = d->dense_on_device ? calloc(hp->n_layer, sizeof *e->dev.dense) : NULL;
    if (!e->dev.blocks || !e->dev.block_bytes || !e->dev.block_retired || !e->dev.experts || !e->dev.cuda_units ||
        (d->shared_on_device && !e->dev.shared) || (d->dense_on_device && !e->dev.dense))
        return kt_err_set(err, KT_ERR_NOMEM, "engine: out of memory");

    /* First add up what the placement needs, so a budget it exceeds is
     * refused before anything is allocated, with the whole need in the message. */
    e->dev.sizing = true;
    e->dev.need_bytes = 0;
    st = place_on_device(e, d, err);
    e->dev.sizing = false;
    const uint64_t budget = kt_backend_budget_bytes(e->dev.backend);
    if (st == KT_OK && budget && e->dev.need_bytes > budget)
        return kt_err_set(err, KT_ERR_NOMEM,
                          "device '%s': the placement needs %.1f MiB (the weights, KV cache and working buffers "
                          "it holds), its budget is %.1f MiB",
                          kt_backend_name(e->dev.backend), e->dev.need_bytes / 1048576.0, budget / 1048576.0);
    if (st == KT_OK)
        st = place_on_device(e, d, err);
    if (st != KT_OK)
        return st;
    kt_backend_sync(e->dev.backend);
    kt_backend_stats_reset(e->dev.backend); /* the stats count steps, not the load */
    return KT_OK;
}

/* Copies of an FFN's gate, up and down in device memory; on failure err
 * names `what` of layer il. */
static kt_status device_ffn(struct kt_engine *e, struct kt_ffn_weights *w, uint32_t il, const char *what, kt_err *err)
{
    kt_status st;
    if ((st = device_mat(e, &w->gate, err)) || (st = device_mat(e, &w->up, err)) || (st = device_mat(e, &w->down, err)))
        kt_err_prefix(err, "layer %u %s", il, what);
    return st;
}

/* A checkpoint's experts are never in memory whole (kt_model_experts_streamed):
 * expert x's slabs are read (converted) into host buffers of the caller's,
 * which w's matrices then point at, kept until its copies are done
 * (free_streamed_expert).  Nothing to do for a GGUF file's experts. */
static kt_status read_streamed_expert(struct kt_engine *e, uint32_t il, uint32_t x, struct kt_ffn_weights *w,
                                      uint8_t *host[3], kt_err *err)
{
    if (!kt_model_experts_streamed(e->model))
        return KT_OK;
    const struct kt_layer *t = &e->model->layers[il];
    const struct kt_gguf_tensor *slabs[3] = {t->ffn_gate_exps, t->ffn_up_exps, t->ffn_down_exps};
    struct kt_mat *mats[3] = {&w->gate, &w->up, &w->down};
    kt_status st = KT_OK;
    for (int i = 0; i < 3 && st == KT_OK; i++) {
        if (!slabs[i])
            st = kt_err_set(err, KT_ERR_UNSUPPORTED, "layer %u: a checkpoint's experts have no fused gate_up slab", il);
        else if (!(host[i] = malloc((size_t)kt_mat_bytes(mats[i]))))
            st = kt_err_set(err, KT_ERR_NOMEM, "out of memory reading expert %u of layer %u", x, il);
        else
            st = kt_model_read_expert(e->model, slabs[i], x, host[i], err);
        if (st == KT_OK)
            mats[i]->data = host[i];
    }
    if (st != KT_OK)
        for (int i = 0; i < 3; i++)
            free(host[i]), host[i] = NULL;
    return st;
}

static void free_streamed_expert(struct kt_engine *e, uint8_t *host[3])
{
    if (!host[0])
        return;
    kt_backend_sync(e->dev.backend); /* the copies from them are done */
    for (int i = 0; i < 3; i++)
        free(host[i]);
}

/* Allocates and copies in what the params put on the device (or, while
 * device_sizing, only adds up its bytes). */
static kt_status place_on_device(struct kt_engine *e, const struct kt_engine_params *d, kt_err *err)
{
    const struct kt_hparams *hp = &e->hp;
    kt_status st = KT_OK;
    for (uint32_t il = e->params.layer_begin; il < e->params.layer_end; il++) { /* a stage: its layers only */
        const struct kt_layer_weights *L = &e->layers[il];
        if (!L->is_moe && e->dev.dense) {
            struct kt_ffn_weights w = L->dense;
            if ((st = device_ffn(e, &w, il, "dense FFN", err)))
                return st;
            e->dev.dense[il] = w;
        }
        if (!L->is_moe)
            continue;
        for (uint32_t x = 0; d->expert_on_device && x < hp->n_expert; x++) {
            if (!d->expert_on_device[(size_t)il * hp->n_expert + x])
                continue;
            /* the file's rows (every backend's kernels read GGUF blocks) */
            struct kt_ffn_weights w = kt_fwd_expert_gguf(e, L, x);
            uint8_t *host[3] = {NULL, NULL, NULL};
            if (!e->dev.sizing && (st = read_streamed_expert(e, il, x, &w, host, err)))
                return st;
            char what[32];
            snprintf(what, sizeof what, "expert %u", x);
            st = device_ffn(e, &w, il, what, err);
            free_streamed_expert(e, host);
            if (st)
                return st;
            if (!e->dev.sizing)
                e->dev.experts[(size_t)il * hp->n_expert + x] = w;
        }
        if (e->dev.shared && L->shared.n_ff > 0) {
            struct kt_ffn_weights w = L->shared;
            if ((st = device_ffn(e, &w, il, "shared experts", err)))
                return st;
            e->dev.shared[il] = w;
        }
    }
    if (d->attention_on_device && (st = device_attention(e, err))) {
        kt_err_prefix(err, "attention weights");
        return st;
    }
    if (d->output_on_device && e->params.layer_begin == 0) { /* a later stage holds no head */
        struct kt_mat w = e->output;
        struct work_buf wb[MAX_WORK_BUFS];
        if ((st = device_mat(e, &w, err)) || (st = alloc_work(e, wb, head_work(e, wb), err))) {
            kt_err_prefix(err, "output head");
            return st;
        }
        if (!e->dev.sizing)
            e->dev.output = w;
    }
    if ((st = device_bufs(e, err))) {
        kt_err_prefix(err, "its working buffers");
        return st;
    }
    return KT_OK;
}

kt_status kt_engine_device_stats(const struct kt_engine *e, struct kt_backend_stats *out)
{
    if (!e->dev.backend)
        return KT_ERR_NOT_FOUND;
    kt_backend_stats(e->dev.backend, out);
    return KT_OK;
}

const char *kt_engine_device_name(const struct kt_engine *e)
{
    return e->dev.backend ? kt_backend_name(e->dev.backend) : NULL;
}

/* ---- graphs and the layer parts ------------------------------------------------------------ */

/* The recorded layer graphs, dropped (none is queued: every layer part syncs). */
static void destroy_graphs(struct kt_engine *e)
{
    for (size_t i = 0; e->dev.graphs && i < (size_t)e->hp.n_layer * KT_GRAPH_SLOTS; i++)
        kt_backend_graph_destroy(e->dev.graphs[i]);
    free(e->dev.graphs);
    free(e->dev.graph_seen);
    e->dev.graphs = NULL;
    e->dev.graph_seen = NULL;
}

/* The job a layer's host function got still fits the step: false (and the
 * step fails) when a graph was replayed for another batch size. */
static bool job_fits(const struct kt_device_job *job)
{
    if (job->n_tok && job->n_tok != job->e->n_tokens) {
        job->e->dev.graph_mismatch = true;
        return false;
    }
    return true;
}

/* A layer's device part on the sim's queue: kt_fwd_attention_block on the residual
 * stream sent there (the stepping thread waits meanwhile, so the thread
 * pool is free), then in MoE layers the FFN norm and the router. */
static void layer_on_device(void *ctx)
{
    const struct kt_device_job *a = ctx;
    if (!job_fits(a))
        return;
    kt_fwd_attention_block(a->e, a->il, a->e->dev.x);
    if (a->e->layers[a->il].is_moe)
        kt_fwd_route_on_device(a->e, a->il);
}

/* The same on the GPU (a kt_backend_cuda_fn): ctx is the layer's job. */
static kt_status layer_on_cuda(void *ctx, void *stream, kt_err *err)
{
    const struct kt_device_job *a = ctx;
    struct kt_engine *e = a->e;
    const int64_t row = (int64_t)e->hp.kv_lora_rank + e->hp.qk_rope_dim;
    e->dev.cuda_step.cache.layer_offset = (int64_t)a->il * e->params.kv_block_tokens * row;
    const kt_status st = kt_cuda_attention_block(&e->dev.cuda_layers[a->il], &e->dev.cuda_step, stream, err);
    if (st != KT_OK)
        return st;
    return e->layers[a->il].is_moe ? kt_fwd_route_on_cuda(e, a->il, stream, err) : KT_OK;
}

/* Layer il's device part: a decode-sized batch replays the layer's graph for
 * its size (recorded now if it is the first), anything else runs directly.
 * A recording that fails turns graphs off. */
static void run_device_layer(struct kt_engine *e, uint32_t il)
{
    const uint32_t T = e->n_tokens;
    const bool graph = e->dev.graphs && T <= KT_GRAPH_TOKENS;
    struct kt_device_job *job = &e->dev.jobs[(size_t)il * (KT_GRAPH_TOKENS + 1) + (graph ? T : 0)];
    if (!graph) {
        kt_backend_run(e->dev.backend, layer_on_device, job, layer_on_cuda, job);
        return;
    }
    const size_t slot = (size_t)il * KT_GRAPH_SLOTS + e->dev.graph_slot;
    struct kt_backend_graph **g = &e->dev.graphs[slot];
    if (!*g && !e->dev.graph_seen[slot]) { /* the first time runs directly */
        e->dev.graph_seen[slot] = 1;
        kt_backend_run(e->dev.backend, layer_on_device, job, layer_on_cuda, job);
        return;
    }
    kt_err err = {0};
    if (!*g && kt_backend_graph_begin(e->dev.backend, &err) == KT_OK) {
        kt_backend_run(e->dev.backend, layer_on_device, job, layer_on_cuda, job);
        kt_backend_graph_end(e->dev.backend, g, &err);
    }
    if (*g) {
        kt_backend_graph_launch(e->dev.backend, *g);
        return;
    }
    destroy_graphs(e); /* recording failed: from now on every batch runs directly */
    job = &e->dev.jobs[(size_t)il * (KT_GRAPH_TOKENS + 1)];
    kt_backend_run(e->dev.backend, layer_on_device, job, layer_on_cuda, job);
}

/* The output head on the sim device's queue, on the rows sent there. */
/* The head's work: the engine and the rows it multiplies this step. */
struct head_job {
    struct kt_engine *e;
    uint32_t n_rows;
};

static void head_on_device(void *ctx)
{
    const struct head_job *j = ctx;
    struct kt_engine *e = j->e;
    kt_fwd_matmul(e, &e->dev.output, e->dev.head_x, j->n_rows, e->dev.logits, e->xq);
}

/* The same on the GPU (a kt_backend_cuda_fn). */
static kt_status head_on_cuda(void *ctx, void *stream, kt_err *err)
{
    const struct head_job *j = ctx;
    struct kt_engine *e = j->e;
    const struct kt_cuda_mat w = kt_fwd_cuda_mat(&e->dev.output);
    return kt_cuda_matmul(&w, e->dev.head_x, j->n_rows, e->dev.logits, KT_CUDA_MATMUL_AUTO, stream, err);
}

/* A decode batch's graph slot (its batch size and the bucket of its longest
 * context) and the context bound that bucket's graphs are sized for. */
static void choose_graph_slot(struct kt_engine *e)
{
    uint32_t n_kv_max = 0;
    for (uint32_t t = 0; t < e->n_tokens; t++)
        n_kv_max = e->tokens[t].pos + 1 > n_kv_max ? e->tokens[t].pos + 1 : n_kv_max;
    uint32_t b = 0;
    while (b + 1 < KT_GRAPH_BUCKETS && (256u << b) < n_kv_max)
        b++;
    e->dev.graph_bound = (256u << b) < e->params.n_ctx ? (256u << b) : e->params.n_ctx;
    e->dev.graph_slot = b * KT_GRAPH_TOKENS + e->n_tokens - 1;
}

/* cuda attention: the step's cache tables (each sequence's blocks, where
 * each token's table starts, each token's context) and RoPE angles go to
 * the device once per step; every layer reads them there. */
static void send_cache_tables(struct kt_engine *e)
{
    const uint32_t T = e->n_tokens;
    uint32_t n_ids = 0, n_kv_max = 0;
    for (uint32_t c = 0; c < e->n_chunks; c++) {
        const struct kt_seq_chunk *ch = &e->chunks[c];
        const uint32_t *blocks = NULL;
        const uint32_t n = kt_kv_cache_seq_blocks(e->kv, ch->seq, &blocks);
        memcpy(e->dev.step_block_ids + n_ids, blocks, n * sizeof *blocks);
        for (uint32_t q = 0; q < ch->n; q++) {
            const uint32_t b = ch->tokens[q];
            e->dev.step_first_block[b] = n_ids;
            e->dev.step_n_kv[b] = e->tokens[b].pos + 1; /* causal: positions 0 .. pos */
            n_kv_max = e->dev.step_n_kv[b] > n_kv_max ? e->dev.step_n_kv[b] : n_kv_max;
        }
        n_ids += n;
    }
    struct kt_cuda_attention_step *s = &e->dev.cuda_step;
    s->n_tok = T;
    /* a graph replays the launch shapes it was recorded with: its bucket's bound */
    s->n_kv_max = e->dev.graphs && T <= KT_GRAPH_TOKENS ? e->dev.graph_bound : n_kv_max;
    kt_backend_copy_in(e->dev.backend, (void *)s->cache.block_ids, e->dev.step_block_ids, n_ids * sizeof(uint32_t));
    kt_backend_copy_in(e->dev.backend, (void *)s->cache.first_block, e->dev.step_first_block, T * sizeof(uint32_t));
    kt_backend_copy_in(e->dev.backend, (void *)s->cache.n_kv, e->dev.step_n_kv, T * sizeof(uint32_t));
    kt_backend_copy_in(e->dev.backend, (void *)s->cos_sin, e->cos_sin, (size_t)T * e->hp.qk_rope_dim * sizeof(float));
}

/* ---- the step's device parts ---------------------------------------------------------------- */

void kt_dev_begin_step(struct kt_engine *e)
{
    if (e->dev.graphs && e->n_tokens <= KT_GRAPH_TOKENS)
        choose_graph_slot(e);
    if (e->dev.cuda_layers)
        send_cache_tables(e);
}

bool kt_dev_attention_layer(struct kt_engine *e, uint32_t il)
{
    const size_t T = e->n_tokens, E = e->hp.n_embd, k = e->hp.n_expert_used;
    const bool routed = e->layers[il].is_moe;
    kt_backend_copy_in(e->dev.backend, e->dev.x, e->x, T * E * sizeof(float));
    run_device_layer(e, il);
    kt_backend_copy_out(e->dev.backend, e->x, e->dev.x, T * E * sizeof(float));
    if (routed) {
        kt_backend_copy_out(e->dev.backend, e->h, e->dev.h, T * E * sizeof(float));
        kt_backend_copy_out(e->dev.backend, e->route_experts, e->dev.route_experts, T * k * sizeof(uint32_t));
        kt_backend_copy_out(e->dev.backend, e->route_weights, e->dev.route_weights, T * k * sizeof(float));
    }
    kt_backend_sync(e->dev.backend);
    return routed;
}

void kt_dev_head(struct kt_engine *e, uint32_t n_rows, float *logits)
{
    const size_t E = e->hp.n_embd;
    struct head_job job = {e, n_rows}; /* lives until the sync below */
    kt_backend_copy_in(e->dev.backend, e->dev.head_x, e->h, n_rows * E * sizeof(float));
    kt_backend_run(e->dev.backend, head_on_device, &job, head_on_cuda, &job);
    kt_backend_copy_out(e->dev.backend, logits, e->dev.logits, n_rows * e->hp.n_vocab * sizeof(float));
    kt_backend_sync(e->dev.backend);
}

void kt_dev_destroy(struct kt_engine *e, void *pinned_buffers)
{
    if (e->dev.backend) {
        kt_cache_destroy(e);
        kt_dev_retire(e);
        kt_backend_sync(e->dev.backend);
        destroy_graphs(e);
        if (e->dev.buffers_pinned)
            kt_backend_unpin_host(e->dev.backend, pinned_buffers);
        for (uint32_t i = 0; i < e->dev.n_blocks; i++)
            kt_backend_free(e->dev.backend, e->dev.blocks[i], e->dev.block_bytes[i]);
        kt_backend_destroy(e->dev.backend);
    }
    free(e->dev.blocks);
    free(e->dev.block_bytes);
    free(e->dev.block_retired);
    free(e->dev.experts);
    free(e->dev.cuda_units);
    free(e->dev.shared);
    free(e->dev.layers);
    free(e->dev.cuda_layers);
    free(e->dev.jobs);
    free(e->dev.dense);
    memset(&e->dev, 0, sizeof e->dev);
}

kt_status kt_engine_device_bytes(const struct kt_engine *e, uint64_t *total, uint64_t *work)
{
    if (!e->dev.backend)
        return KT_ERR_NOT_FOUND;
    uint64_t sum = 0;
    for (uint32_t i = 0; i < e->dev.n_blocks; i++)
        sum += e->dev.block_bytes[i];
    struct kt_expert_cache_stats cache;
    if (kt_engine_expert_cache_stats(e, -1, &cache))
        sum += cache.device_bytes;
    *total = sum;
    *work = e->dev.work_bytes;
    return KT_OK;
}

/* ---- routed experts moving on and off the device (engine.h) ------------------------------------ */

/* The device block at ptr: freed now, or (retire) marked to be freed by
 * kt_dev_retire once the queue has run what is queued now. */
static void device_release(struct kt_engine *e, const void *ptr, bool retire)
{
    for (uint32_t i = 0; i < e->dev.n_blocks; i++) {
        if (e->dev.blocks[i] != ptr)
            continue;
        if (retire) {
            e->dev.n_retired += !e->dev.block_retired[i];
            e->dev.block_retired[i] = true;
            return;
        }
        e->dev.n_retired -= e->dev.block_retired[i];
        kt_backend_free(e->dev.backend, e->dev.blocks[i], e->dev.block_bytes[i]);
        e->dev.n_blocks--;
        e->dev.blocks[i] = e->dev.blocks[e->dev.n_blocks];
        e->dev.block_bytes[i] = e->dev.block_bytes[e->dev.n_blocks];
        e->dev.block_retired[i] = e->dev.block_retired[e->dev.n_blocks];
        return;
    }
}

/* An expert staged in host memory for the device. */
struct kt_expert_upload {
    uint32_t il, x;
    uint8_t *host[3];                    /* gate, up, down: each as the device holds it */
    uint64_t bytes;
    struct kt_expert_upload *next;       /* on e->dev.retired_uploads */
};

void kt_expert_upload_discard(struct kt_expert_upload *u)
{
    if (!u)
        return;
    for (int i = 0; i < 3; i++)
        free(u->host[i]);
    free(u);
}

uint64_t kt_expert_upload_bytes(const struct kt_expert_upload *u)
{
    return u ? u->bytes : 0;
}

kt_status kt_engine_expert_upload_read(const struct kt_engine *e, uint32_t il, uint32_t x,
                                       struct kt_expert_upload **out, kt_err *err)
{
    *out = NULL;
    if (!e->dev.backend)
        return kt_err_set(err, KT_ERR_UNSUPPORTED, "this engine has no device");
    if (il >= e->hp.n_layer || x >= e->hp.n_expert || !e->layers[il].is_moe)
        return kt_err_set(err, KT_ERR_INVALID, "no routed expert %u in layer %u", x, il);
    struct kt_expert_upload *u = calloc(1, sizeof *u);
    if (!u)
        return kt_err_set(err, KT_ERR_NOMEM, "out of memory staging expert %u of layer %u", x, il);
    *u = (struct kt_expert_upload){.il = il, .x = x};
    const struct kt_layer *t = &e->model->layers[il];
    const struct kt_gguf_tensor *slabs[3] = {t->ffn_gate_exps, t->ffn_up_exps, t->ffn_down_exps};
    const struct kt_ffn_weights w = kt_fwd_expert_gguf(e, &e->layers[il], x);
    const struct kt_mat *mats[3] = {&w.gate, &w.up, &w.down};
    const bool streamed = kt_model_experts_streamed(e->model);
    for (int i = 0; i < 3 && !streamed; i++) /* the three slabs read ahead together, hundreds of MiB apart */
        kt_model_expert_advise(e->model, slabs[i], x, KT_EXPERT_WILL_NEED);
    kt_status st = KT_OK;
    for (int i = 0; i < 3 && st == KT_OK; i++) {
        const size_t n = (size_t)kt_mat_bytes(mats[i]);
        if (streamed && !slabs[i])
            st = kt_err_set(err, KT_ERR_UNSUPPORTED, "layer %u: a checkpoint's experts have no fused gate_up slab", il);
        else if (!(u->host[i] = aligned_alloc(64, (n + 63) / 64 * 64)))
            st = kt_err_set(err, KT_ERR_NOMEM, "out of memory staging expert %u of layer %u (%zu bytes)", x, il, n);
        else if (streamed)
            st = kt_model_read_expert(e->model, slabs[i], x, u->host[i], err);
        else
            memcpy(u->host[i], mats[i]->data, n); /* the file's pages, read here */
        if (st == KT_OK && !streamed) /* copied out: its pages need not stay resident */
            kt_model_expert_advise(e->model, slabs[i], x, KT_EXPERT_DONE);
        u->bytes += n;
    }
    if (st != KT_OK) {
        kt_expert_upload_discard(u);
        return st;
    }
    *out = u;
    return KT_OK;
}

kt_status kt_dev_expert_upload(struct kt_engine *e, uint32_t il, uint32_t x, struct kt_expert_upload *u, kt_err *err)
{
    if (u->il != il || u->x != x)
        return kt_err_set(err, KT_ERR_INVALID, "the staged copy is of layer %u expert %u, not layer %u expert %u",
                          u->il, u->x, il, x);
    const bool cuda = kt_backend_kind(e->dev.backend) == KT_BACKEND_CUDA;
    struct kt_ffn_weights w = kt_fwd_expert_gguf(e, &e->layers[il], x);
    struct kt_mat *mats[3] = {&w.gate, &w.up, &w.down};
    void *dst[3] = {NULL, NULL, NULL};
    kt_status st = KT_OK;
    for (int i = 0; i < 3 && st == KT_OK; i++) {
        mats[i]->data = u->host[i];
        const struct kt_cuda_mat cm = kt_fwd_cuda_mat(mats[i]);
        if (cuda)
            st = kt_cuda_mat_usable(&cm, kt_type_name(mats[i]->type), err);
        if (st == KT_OK && (st = device_alloc(e, (size_t)kt_mat_bytes(mats[i]), &dst[i], err)) == KT_ERR_NOMEM &&
            e->dev.n_retired > 0) {
            kt_dev_retire(e); /* what experts given back still hold: the queue runs their last readers now */
            st = device_alloc(e, (size_t)kt_mat_bytes(mats[i]), &dst[i], err);
        }
    }
    if (st != KT_OK) { /* the device's budget or block table: nothing changes */
        for (int i = 0; i < 3; i++)
            if (dst[i])
                device_release(e, dst[i], false);
        kt_err_prefix(err, "device '%s': layer %u expert %u", kt_backend_name(e->dev.backend), il, x);
        return st;
    }
    for (int i = 0; i < 3; i++) { /* queued ahead of the next step's work, which then reads it there */
        kt_backend_copy_in(e->dev.backend, dst[i], u->host[i], (size_t)kt_mat_bytes(mats[i]));
        mats[i]->data = dst[i];
    }
    u->next = e->dev.retired_uploads; /* the copies read it until the queue has run them */
    e->dev.retired_uploads = u;
    e->dev.experts[(size_t)il * e->hp.n_expert + x] = w;
    return KT_OK;
}

void kt_dev_expert_drop(struct kt_engine *e, uint32_t il, uint32_t x)
{
    struct kt_ffn_weights *w = &e->dev.experts[(size_t)il * e->hp.n_expert + x];
    device_release(e, w->gate.data, true); /* queued work may still read them */
    device_release(e, w->up.data, true);
    device_release(e, w->down.data, true);
    memset(w, 0, sizeof *w);
}

void kt_dev_retire(struct kt_engine *e)
{
    if (!e->dev.backend || (e->dev.n_retired == 0 && !e->dev.retired_uploads))
        return;
    kt_backend_sync(e->dev.backend); /* at a step's end the queue is idle, or runs the last uploads */
    for (uint32_t i = e->dev.n_blocks; i-- > 0;)
        if (e->dev.block_retired[i])
            device_release(e, e->dev.blocks[i], false);
    while (e->dev.retired_uploads) {
        struct kt_expert_upload *u = e->dev.retired_uploads;
        e->dev.retired_uploads = u->next;
        kt_expert_upload_discard(u);
    }
}
