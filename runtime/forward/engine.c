/*
 * engine.c - the CPU forward step: batch checks, the KV reservation, and the
 * layer loop of reference/deepseek2.md §4.1:
 *
 *     x = token_embd[token]
 *     for each layer:  x += Attention(norm(x) attn_norm)      (attention.c)
 *                      x += FFN(norm(x) ffn_norm)             (moe.c)
 *     logits = output . (norm(x) output_norm)
 *
 * Creation checks every weight's type against the CPU kernels and sizes all
 * buffers, so a step never allocates and fails only on a bad batch, before
 * touching any state.  It never prints, never exits, and never writes to
 * the model's mapping.
 */
#include "engine.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "forward.h"

#define DEFAULT_CTX 4096u
#define DEFAULT_BLOCK_TOKENS 16u
#define DEFAULT_MAX_BATCH 256u

/* The engine's buffers are carved from one allocation in two passes over the
 * same layout: the first (base NULL) only measures.  Under ASan each buffer
 * is followed by a poisoned red zone, so overruns between them still trap. */
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#define ARENA_REDZONE 64
#else
#define ARENA_REDZONE 0
#define ASAN_POISON_MEMORY_REGION(p, n) ((void)(p), (void)(n))
#define ASAN_UNPOISON_MEMORY_REGION(p, n) ((void)(p), (void)(n))
#endif

struct arena {
    uint8_t *base;
    size_t used;
};

static void *carve(struct arena *a, size_t bytes)
{
    size_t offset = (a->used + 63) & ~(size_t)63; /* cache-line aligned */
    a->used = offset + bytes + ARENA_REDZONE;
    if (!a->base)
        return NULL;
    ASAN_POISON_MEMORY_REGION(a->base + offset + bytes, ARENA_REDZONE);
    return a->base + offset;
}

/* ---- RoPE and scale from the hyperparameters ---------------------------------------- */

void kt_engine_rope_params(const struct kt_hparams *hp, struct kt_rope_params *rp)
{
    const bool yarn = hp->rope_scaling == KT_ROPE_SCALING_YARN;
    const double s = hp->rope_scaling == KT_ROPE_SCALING_NONE ? 1.0 : hp->rope_scaling_factor;
    memset(rp, 0, sizeof *rp);
    rp->n_dims = hp->qk_rope_dim;
    rp->freq_base = hp->rope_freq_base;
    rp->factor = s;
    rp->mode = yarn ? KT_ROPE_YARN : KT_ROPE_PLAIN;
    rp->orig_ctx = hp->rope_orig_ctx;
    rp->beta_fast = hp->yarn_beta_fast;
    rp->beta_slow = hp->yarn_beta_slow;
    /* HF's attention_factor = get_mscale(s, mscale) / get_mscale(s, mscale_all_dim):
     * 1 whenever the file has a log multiplier (mscale = mscale_all_dim in every
     * model kt knows; the file stores only the latter), else 1 + 0.1 ln s. */
    rp->magnitude = hp->rope_attn_factor;
    if (yarn && s > 1.0 && hp->yarn_log_multiplier == 0.0f)
        rp->magnitude *= 1.0 + 0.1 * log(s);
}

/* ---- creation --------------------------------------------------------------------------- */

/* A weight view, if the CPU kernels can multiply its type. */
static kt_status take_mat(const struct kt_gguf_tensor *t, struct kt_mat *m, kt_err *err)
{
    if (!kt_mat_kernels_for(t->type))
        return kt_err_set(err, KT_ERR_UNSUPPORTED, "%s: type %s has no CPU dot product in kt", t->name,
                          kt_type_name(t->type));
    *m = kt_mat_from_tensor(t);
    return KT_OK;
}

static kt_status take_ffn(const struct kt_gguf_tensor *gate, const struct kt_gguf_tensor *up,
                          const struct kt_gguf_tensor *down, struct kt_ffn_weights *w, kt_err *err)
{
    kt_status st;
    if ((st = take_mat(gate, &w->gate, err)) || (st = take_mat(up, &w->up, err)) || (st = take_mat(down, &w->down, err)))
        return st;
    w->n_ff = w->gate.n_out;
    return KT_OK;
}

static kt_status build_layer(const struct kt_layer *t, struct kt_layer_weights *L, kt_err *err)
{
    kt_status st;
    L->attn_norm = t->attn_norm->data;
    L->kv_a_norm = t->attn_kv_a_norm->data;
    L->ffn_norm = t->ffn_norm->data;
    if (t->attn_q_a) {
        L->q_a_norm = t->attn_q_a_norm->data;
        if ((st = take_mat(t->attn_q_a, &L->q_a, err)) || (st = take_mat(t->attn_q_b, &L->q_b, err)))
            return st;
    } else if ((st = take_mat(t->attn_q, &L->q, err))) {
        return st;
    }
    if ((st = take_mat(t->attn_kv_a_mqa, &L->kv_a, err)) || (st = take_mat(t->attn_output, &L->out, err)))
        return st;
    L->fused_kv_b = t->attn_kv_b != NULL;
    if (L->fused_kv_b) {
        if ((st = take_mat(t->attn_kv_b, &L->uk, err)))
            return st;
        L->uv = L->uk;
        L->uk_uv_bytes = t->attn_kv_b->nbytes;
    } else {
        if ((st = take_mat(t->attn_k_b, &L->uk, err)) || (st = take_mat(t->attn_v_b, &L->uv, err)))
            return st;
        L->uk_uv_bytes = t->attn_k_b->nbytes + t->attn_v_b->nbytes;
    }

    L->is_moe = t->is_moe;
    if (!t->is_moe)
        return take_ffn(t->ffn_gate, t->ffn_up, t->ffn_down, &L->dense, err);
    if ((st = take_mat(t->ffn_gate_inp, &L->router, err)))
        return st;
    L->exp_probs_b = t->exp_probs_b ? t->exp_probs_b->data : NULL;
    L->gate_up_fused = t->ffn_gate_up_exps != NULL;
    if (L->gate_up_fused)
        st = take_mat(t->ffn_gate_up_exps, &L->gate_exps, err);
    else if (!(st = take_mat(t->ffn_gate_exps, &L->gate_exps, err)))
        st = take_mat(t->ffn_up_exps, &L->up_exps, err);
    if (st || (st = take_mat(t->ffn_down_exps, &L->down_exps, err)))
        return st;
    if (t->ffn_gate_shexp && (st = take_ffn(t->ffn_gate_shexp, t->ffn_up_shexp, t->ffn_down_shexp, &L->shared, err)))
        return st;
    return KT_OK;
}

static size_t max_size(size_t a, size_t b)
{
    return a > b ? a : b;
}

/* Largest quantized activation row any matrix of the model takes, split by
 * what feeds it: block inputs, FFN gate/up inputs, FFN down inputs. */
struct act_sizes {
    size_t block_in, ffn_in, ffn_down_in, head_in;
    int64_t max_n_ff;
};

static void measure_ffn(struct act_sizes *s, const struct kt_ffn_weights *w)
{
    if (!w->n_ff)
        return;
    s->ffn_in = max_size(s->ffn_in, kt_act_row_bytes(w->gate.type, w->gate.n_in));
    s->ffn_in = max_size(s->ffn_in, kt_act_row_bytes(w->up.type, w->up.n_in));
    s->ffn_down_in = max_size(s->ffn_down_in, kt_act_row_bytes(w->down.type, w->down.n_in));
    if (w->n_ff > s->max_n_ff)
        s->max_n_ff = w->n_ff;
}

static struct act_sizes measure(const struct kt_engine *e)
{
    const struct kt_hparams *hp = &e->hp;
    struct act_sizes s = {0};
    s.block_in = kt_act_row_bytes(e->output.type, e->output.n_in);
    for (uint32_t il = 0; il < hp->n_layer; il++) {
        const struct kt_layer_weights *L = &e->layers[il];
        const struct kt_mat *in[] = {&L->q_a, &L->q_b, &L->q, &L->kv_a, &L->out, &L->router};
        for (size_t i = 0; i < sizeof in / sizeof in[0]; i++)
            if (in[i]->data)
                s.block_in = max_size(s.block_in, kt_act_row_bytes(in[i]->type, in[i]->n_in));
        /* per head: q_nope into W_UK (split), o_lat into W_UV */
        if (!L->fused_kv_b)
            s.head_in = max_size(s.head_in, kt_act_row_bytes(L->uk.type, hp->qk_nope_dim));
        s.head_in = max_size(s.head_in, kt_act_row_bytes(L->uv.type, hp->kv_lora_rank));
        measure_ffn(&s, &L->dense);
        measure_ffn(&s, &L->shared);
        if (L->is_moe) {
            struct kt_ffn_weights x = {L->gate_exps, L->gate_up_fused ? L->gate_exps : L->up_exps, L->down_exps,
                                       hp->n_ff_exp};
            measure_ffn(&s, &x);
        }
    }
    return s;
}

/* Lays out every buffer of the engine in a (see struct arena). */
static void layout_buffers(struct kt_engine *e, struct arena *a)
{
    const struct kt_hparams *hp = &e->hp;
    const size_t T = e->params.max_batch_tokens, E = hp->n_embd, H = hp->n_head;
    const size_t dn = hp->qk_nope_dim, dr = hp->qk_rope_dim, dk = dn + dr, dv = hp->v_head_dim;
    const size_t kvr = hp->kv_lora_rank, Ne = hp->n_expert, k = hp->n_expert_used, n_ctx = e->params.n_ctx;
    const size_t pairs = T * (k + 1);
    const struct act_sizes s = measure(e);
#define CARVE(ptr, count) ((ptr) = carve(a, (count) * sizeof *(ptr)))

    CARVE(e->chunks, e->params.max_seqs);
    CARVE(e->chunk_tokens, 2 * T);
    CARVE(e->reserve_seqs, e->params.max_seqs);
    CARVE(e->reserve_n, e->params.max_seqs);
    CARVE(e->seq_chunk, e->params.max_seqs);
    CARVE(e->x, T * E);
    CARVE(e->h, T * E);
    CARVE(e->y, T * E);
    CARVE(e->cos_sin, T * dr);
    CARVE(e->q, T * H * dk);
    CARVE(e->qa, T * hp->q_lora_rank);
    CARVE(e->kv_a, T * (kvr + dr));
    CARVE(e->o, T * H * dv);
    const size_t seqs_in_step = T < e->params.max_seqs ? T : e->params.max_seqs;
    CARVE(e->dev.step_block_ids, seqs_in_step * ((n_ctx + e->params.kv_block_tokens - 1) / e->params.kv_block_tokens));
    CARVE(e->dev.step_first_block, T);
    CARVE(e->dev.step_n_kv, T);
    CARVE(e->xq, T * s.block_in);
    CARVE(e->router_logits, T * Ne);
    CARVE(e->route_experts, T * k);
    CARVE(e->route_weights, T * k);
    CARVE(e->router_scratch, kt_router_scratch_floats(&e->router));
    CARVE(e->pair_token, pairs);
    CARVE(e->pair_of, T * k);
    CARVE(e->expert_pairs, Ne);
    CARVE(e->expert_unit, Ne);
    CARVE(e->active_experts, Ne);
    CARVE(e->expert_pool_of, Ne);
    CARVE(e->units, Ne + 1);
    struct kt_moe_bufs *b = &e->bufs;
    b->act_stride = (size_t)s.max_n_ff;
    CARVE(b->act, pairs * b->act_stride);
    b->act_q_stride = s.ffn_down_in;
    CARVE(b->act_q, pairs * b->act_q_stride);
    CARVE(b->pair_out, pairs * E);
    b->hq_row_bytes = s.ffn_in;
    for (int i = 0; i < 4; i++)
        CARVE(b->hq[i], T * b->hq_row_bytes);
    CARVE(b->hq_pairs_gate, pairs * b->hq_row_bytes);
    CARVE(b->hq_pairs_up, pairs * b->hq_row_bytes);

    const int n_threads = kt_threadpool_n_threads(e->pool);
    CARVE(e->scratch, (size_t)n_threads);
    for (int i = 0; i < n_threads; i++) {
        struct kt_thread_scratch measuring, *ts = a->base ? &e->scratch[i] : &measuring;
        CARVE(ts->rows, n_ctx);
        CARVE(ts->k_rows, n_ctx);
        CARVE(ts->v_rows, n_ctx);
        CARVE(ts->scores, KT_ATTN_HEAD_GROUP * n_ctx);
        CARVE(ts->query, KT_ATTN_HEAD_GROUP * (kvr + dr));
        CARVE(ts->o_lat, KT_ATTN_HEAD_GROUP * kvr);
        CARVE(ts->tmp, max_size(dn, kvr));
        CARVE(ts->act_q, s.head_in);
        CARVE(ts->w_uk, dn * kvr);
        CARVE(ts->w_uv, dv * kvr);
        CARVE(ts->k_exp, n_ctx * dk);
        CARVE(ts->v_exp, n_ctx * dv);
    }
#undef CARVE
}

static kt_status alloc_buffers(struct kt_engine *e, kt_err *err)
{
    struct arena a = {0};
    layout_buffers(e, &a);
    e->buffers = calloc(1, a.used); /* large: mapped lazily, untouched pages cost nothing */
    if (!e->buffers)
        return kt_err_set(err, KT_ERR_NOMEM, "out of memory allocating %zu bytes of buffers for %u tokens", a.used,
                          e->params.max_batch_tokens);
    e->scratch_bytes = a.used;
    a = (struct arena){.base = e->buffers};
    layout_buffers(e, &a);
    return KT_OK;
}

/* The NUMA node pools for the routed experts (none if experts_on_threadpool):
 * n_threads - 1 workers in all, at least one per pool (see engine.h). */
static kt_status create_pools(struct kt_engine *e, const struct kt_engine_params *d, kt_err *err)
{
    if (e->test.experts_on_threadpool)
        return KT_OK;
    kt_status st = kt_topology_create(d->topology, &e->topo, err);
    if (st != KT_OK)
        return st;
    int n_with_cores = 0;
    for (int i = 0; i < e->topo->n_nodes; i++)
        n_with_cores += e->topo->nodes[i].n_cores > 0;
    if (n_with_cores <= 1) { /* one node: its pool would be the thread pool again, competing with it */
        kt_topology_destroy(e->topo);
        e->topo = NULL;
        return KT_OK;
    }
    const int n_threads = kt_threadpool_n_threads(e->pool);
    struct kt_pools_config cfg = {.max_threads = n_threads - 1 > n_with_cores ? n_threads - 1 : n_with_cores};
    if ((st = kt_pools_create(e->topo, &cfg, &e->pools, err)) != KT_OK)
        return st;
    const int n_pools = kt_pools_count(e->pools);
    e->node_pool = calloc((size_t)e->topo->n_nodes, sizeof *e->node_pool);
    e->pool_units = calloc((size_t)n_pools + 1, sizeof *e->pool_units);
    e->pool_jobs = calloc((size_t)n_pools, sizeof *e->pool_jobs);
    e->pool_load = calloc((size_t)n_pools, sizeof *e->pool_load);
    if (!e->node_pool || !e->pool_units || !e->pool_jobs || !e->pool_load)
        return kt_err_set(err, KT_ERR_NOMEM, "engine: out of memory");
    for (int i = 0; i < n_pools; i++)
        e->node_pool[kt_pool_node(kt_pools_get(e->pools, i))] = i;
    return KT_OK;
}

static kt_status setup_device(struct kt_engine *e, const struct kt_engine_params *d, kt_err *err);
static void destroy_graphs(struct kt_engine *e);

/* ---- host weights repacked ------------------------------------------------------------------ */

/* m's rows repacked into the level's format in anonymous memory (huge pages
 * advised), when the level has one for m's type: the kernels read packed
 * groups at the expert path's bandwidth, and a mapping of huge pages costs
 * fewer TLB misses than the file's 4 KiB page-cache pages.  The file's pages
 * it read are then released from this process. */
static kt_status pack_host_mat(struct kt_engine *e, struct kt_mat *m, kt_err *err)
{
    const struct kt_packed_format *f = m->data && !m->packed ? kt_mat_kernels_for(m->type)->packed : NULL;
    if (!f || m->n_out < (int64_t)f->rows)
        return KT_OK;
    if (e->n_packed_blocks == e->max_packed_blocks)
        return kt_err_set(err, KT_ERR_INVALID, "engine: packed weight table full");
    const size_t bytes = kt_packed_bytes(f, m->n_in, m->n_out);
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return kt_err_set(err, KT_ERR_NOMEM, "engine: cannot map %zu bytes for packed weights", bytes);
#ifdef MADV_HUGEPAGE
    madvise(p, bytes, MADV_HUGEPAGE);
#endif
    f->pack(m->n_in, m->data, m->row_bytes, m->n_out, p);
    /* the file pages inside the matrix: this process will not read them again */
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    const uintptr_t lo = ((uintptr_t)m->data + page - 1) / page * page;
    const uintptr_t hi = ((uintptr_t)m->data + (uintptr_t)m->n_out * m->row_bytes) / page * page;
    if (hi > lo)
        madvise((void *)lo, hi - lo, MADV_DONTNEED);
    e->packed_blocks[e->n_packed_blocks] = p;
    e->packed_block_bytes[e->n_packed_blocks++] = bytes;
    m->data = p;
    m->packed = f;
    return KT_OK;
}

/* The matrices the host multiplies whole (attention projections, dense
 * FFNs, shared experts, the output head), each packed where its level has
 * a format and it stays on the host.  W_UK / W_UV stay in GGUF rows: they
 * are read per head. */
static kt_status pack_host_weights(struct kt_engine *e, kt_err *err)
{
    const uint32_t n_layer = e->hp.n_layer;
    e->max_packed_blocks = 12 * n_layer + 1;
    e->packed_blocks = calloc(e->max_packed_blocks, sizeof *e->packed_blocks);
    e->packed_block_bytes = calloc(e->max_packed_blocks, sizeof *e->packed_block_bytes);
    if (!e->packed_blocks || !e->packed_block_bytes)
        return kt_err_set(err, KT_ERR_NOMEM, "engine: out of memory");
    kt_status st = e->dev.output.data ? KT_OK : pack_host_mat(e, &e->output, err);
    for (uint32_t il = 0; il < n_layer && st == KT_OK; il++) {
        struct kt_layer_weights *L = &e->layers[il];
        /* what the device holds a copy of runs there: leave it in GGUF rows */
        const bool attention = !e->dev.layers, dense = !e->dev.dense, shared = !e->dev.shared;
        const struct {
            struct kt_mat *m;
            bool on_host;
        } mats[] = {
            {&L->q_a, attention},        {&L->q_b, attention},        {&L->q, attention},
            {&L->kv_a, attention},       {&L->out, attention},        {&L->dense.gate, dense},
            {&L->dense.up, dense},       {&L->dense.down, dense},     {&L->shared.gate, shared},
            {&L->shared.up, shared},     {&L->shared.down, shared},
        };
        for (size_t i = 0; i < sizeof mats / sizeof mats[0] && st == KT_OK; i++)
            if (mats[i].on_host)
                st = pack_host_mat(e, mats[i].m, err);
    }
    return st;
}

/* The KV cache the params describe; its pool in device memory at storage
 * (then its copy-on-write copies run on the device's queue), else on the host. */
static void device_copy_block(void *ctx, float *dst, const float *src, size_t bytes);

static struct kt_kv_cache_params kv_params(struct kt_engine *e, float *storage)
{
    return (struct kt_kv_cache_params){
        .n_layer = e->hp.n_layer,
        .row_floats = e->hp.kv_lora_rank + e->hp.qk_rope_dim,
        .block_tokens = e->params.kv_block_tokens,
        .n_blocks = e->params.kv_blocks,
        .max_seqs = e->params.max_seqs,
        .n_ctx = e->params.n_ctx,
        .storage = storage,
        .copy_block = storage ? device_copy_block : NULL,
        .copy_ctx = e,
    };
}

static kt_status kv_cache_create(struct kt_engine *e, float *storage, kt_err *err)
{
    const struct kt_kv_cache_params kp = kv_params(e, storage);
    return kt_kv_cache_create(&kp, &e->kv, err);
}

kt_status kt_engine_create(struct kt_model *m, const struct kt_engine_params *p, struct kt_engine **out, kt_err *err)
{
    *out = NULL;
    struct kt_engine *e = calloc(1, sizeof *e);
    if (!e)
        return kt_err_set(err, KT_ERR_NOMEM, "engine: out of memory");
    const struct kt_hparams *hp = &m->hp;
    kt_status st;
    e->model = m;
    e->hp = *hp;

    struct kt_engine_params d = p ? *p : (struct kt_engine_params){0};
    if (!d.n_ctx)
        d.n_ctx = hp->n_ctx_train < DEFAULT_CTX ? hp->n_ctx_train : DEFAULT_CTX;
    if (!d.max_seqs)
        d.max_seqs = 1;
    if (!d.kv_block_tokens)
        d.kv_block_tokens = DEFAULT_BLOCK_TOKENS;
    if (!d.kv_blocks)
        d.kv_blocks = (uint32_t)(((uint64_t)d.n_ctx + d.kv_block_tokens - 1) / d.kv_block_tokens * d.max_seqs);
    if (!d.max_batch_tokens)
        d.max_batch_tokens = DEFAULT_MAX_BATCH;
    if (d.test)
        e->test = *d.test;
    d.test = &e->test;
    if (d.n_ctx > (1u << 24) || d.max_seqs > (1u << 16) || d.max_batch_tokens > (1u << 16) ||
        e->test.attention_form > KT_ATTENTION_EXPANDED) {
        st = kt_err_set(err, KT_ERR_INVALID,
                        "engine: n_ctx %u (at most %u), max_seqs %u (at most %u), max_batch_tokens %u (at most %u), "
                        "attention form %d",
                        d.n_ctx, 1u << 24, d.max_seqs, 1u << 16, d.max_batch_tokens, 1u << 16, (int)e->test.attention_form);
        goto fail;
    }
    e->params = d;

    struct kt_rope_params rp;
    kt_engine_rope_params(hp, &rp);
    if (!kt_rope_init(&e->rope, &rp)) {
        st = kt_err_set(err, KT_ERR_UNSUPPORTED, "engine: rope dimension %u is not supported (even, at most %d)",
                        hp->qk_rope_dim, KT_ROPE_MAX_DIMS);
        goto fail;
    }
    e->kq_scale = (float)kt_hparams_kq_scale(hp);
    kt_router_from_hparams(hp, &e->router);

    if ((st = take_mat(m->token_embd, &e->token_embd, err)) || (st = take_mat(m->output, &e->output, err)))
        goto fail;
    e->output_norm = m->output_norm->data;
    e->layers = calloc(hp->n_layer, sizeof *e->layers);
    e->layer_stats = calloc(hp->n_layer, sizeof *e->layer_stats);
    if (!e->layers || !e->layer_stats) {
        st = kt_err_set(err, KT_ERR_NOMEM, "engine: out of memory");
        goto fail;
    }
    for (uint32_t il = 0; il < hp->n_layer; il++)
        if ((st = build_layer(&m->layers[il], &e->layers[il], err)))
            goto fail;

    if ((st = kt_threadpool_create((int)d.n_threads, &e->pool, err)) || (st = create_pools(e, &d, err)))
        goto fail;
    /* with attention on a device the KV cache lives there (device_attention) */
    const bool kv_on_device = d.device && d.attention_on_device;
    if ((!kv_on_device && (st = kv_cache_create(e, NULL, err))) || (st = alloc_buffers(e, err)))
        goto fail;
    /* Last: the long step, after everything cheap that could fail. */
    if (!e->test.experts_in_place) {
        struct kt_expert_store_params sp = {.progress = d.progress,
                                            .meminfo_path = e->test.meminfo_path,
                                            .keep_gguf_layout = e->test.keep_gguf_layout,
                                            .home_nodes = d.expert_home_nodes,
                                            .replica_nodes = d.expert_replica_nodes};
        if (e->test.experts_round_robin && e->topo)
            sp.round_robin_nodes = e->topo->n_nodes;
        if ((st = kt_expert_store_create(m, &sp, &e->experts, err)))
            goto fail;
    }
    if (d.device && (st = setup_device(e, &d, err)))
        goto fail;
    if (e->dev.backend) /* the step's buffers cross the link each layer; the threads' scratch (last, large) does not */
        e->dev.buffers_pinned =
            kt_backend_pin_host(e->dev.backend, e->buffers, (size_t)((uint8_t *)e->scratch - (uint8_t *)e->buffers));
    if (!e->test.keep_gguf_layout && (st = pack_host_weights(e, err)))
        goto fail;
    for (uint32_t s = 0; s < d.max_seqs; s++)
        e->seq_chunk[s] = UINT32_MAX;
    e->params.n_threads = (uint32_t)kt_threadpool_n_threads(e->pool);
    *out = e;
    return KT_OK;

fail:
    kt_engine_destroy(e);
    return st;
}

void kt_engine_destroy(struct kt_engine *e)
{
    if (!e)
        return;
    if (e->dev.backend) {
        kt_backend_sync(e->dev.backend);
        destroy_graphs(e);
        if (e->dev.buffers_pinned)
            kt_backend_unpin_host(e->dev.backend, e->buffers);
        for (uint32_t i = 0; i < e->dev.n_blocks; i++)
            kt_backend_free(e->dev.backend, e->dev.blocks[i], e->dev.block_bytes[i]);
        kt_backend_destroy(e->dev.backend);
    }
    for (uint32_t i = 0; e->packed_blocks && i < e->n_packed_blocks; i++)
        munmap(e->packed_blocks[i], e->packed_block_bytes[i]);
    free(e->packed_blocks);
    free(e->packed_block_bytes);
    free(e->dev.blocks);
    free(e->dev.block_bytes);
    free(e->dev.experts);
    free(e->dev.cuda_units);
    free(e->dev.shared);
    free(e->dev.layers);
    free(e->dev.cuda_layers);
    free(e->dev.jobs);
    free(e->dev.dense);
    kt_threadpool_destroy(e->pool);
    kt_pools_destroy(e->pools);
    kt_topology_destroy(e->topo);
    free(e->node_pool);
    free(e->pool_load);
    free(e->pool_units);
    free(e->pool_jobs);
    kt_kv_cache_destroy(e->kv);
    kt_expert_store_destroy(e->experts);
    if (e->buffers)
        ASAN_UNPOISON_MEMORY_REGION(e->buffers, e->scratch_bytes);
    free(e->buffers);
    free(e->layers);
    free(e->layer_stats);
    free(e);
}

/* ---- the device ---------------------------------------------------------------------------- */

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
    char msg[256];
    const struct kt_cuda_mat cm = kt_fwd_cuda_mat(m);
    if (e->dev.sizing && kt_backend_kind(e->dev.backend) == KT_BACKEND_CUDA && /* refused before anything is placed */
        kt_cuda_mat_usable(&cm, kt_type_name(m->type), msg, sizeof msg))
        return kt_err_set(err, KT_ERR_UNSUPPORTED, "device '%s': %s", kt_backend_name(e->dev.backend), msg);
    kt_status st = device_alloc(e, bytes, &p, err);
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
static void device_copy_block(void *ctx, float *dst, const float *src, size_t bytes)
{
    struct kt_engine *e = ctx;
    kt_backend_copy_device(e->dev.backend, dst, src, bytes);
}

/* What the cuda attention works in: per-step buffers for max_batch_tokens
 * tokens, the step's cache tables, and MLA's scratch sized for the worst
 * token count at a full context. */
static kt_status cuda_attention_buffers(struct kt_engine *e, kt_err *err)
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
        const size_t bytes = kt_cuda_mla_scratch_bytes(&shape, (int64_t)t, (int64_t)n_ctx);
        mla_scratch = bytes > mla_scratch ? bytes : mla_scratch;
    }
    if (!mla_scratch)
        return kt_err_set(err, KT_ERR_UNSUPPORTED, "device '%s': the GPU's MLA kernel does not take this shape "
                          "(%u heads, kv rank %u, rope %u)", kt_backend_name(e->dev.backend), hp->n_head, hp->kv_lora_rank,
                          hp->qk_rope_dim);
    /* cuBLASLt's scratch for the largest projection at a full batch (the
     * host's copies give the shapes; device copies are at least as aligned) */
    size_t lt_scratch = 0;
    for (uint32_t il = 0; T >= KT_CUDA_LT_MIN_TOKENS && il < hp->n_layer; il++) {
        const struct kt_layer_weights *L = &e->layers[il];
        const struct kt_mat *mats[] = {&L->q_a, &L->q_b, &L->q, &L->kv_a, &L->out};
        for (size_t i = 0; i < sizeof mats / sizeof mats[0]; i++) {
            const struct kt_cuda_mat w = kt_fwd_cuda_mat(mats[i]);
            const size_t bytes = mats[i]->data ? kt_cuda_matmul_lt_scratch_bytes(&w, (int64_t)T) : 0;
            lt_scratch = bytes > lt_scratch ? bytes : lt_scratch;
        }
    }
    struct kt_cuda_attention_step *s = &e->dev.cuda_step;
    const struct {
        void **ptr;
        size_t bytes;
    } want[] = {
        {(void **)&s->h, T * E * sizeof(float)},
        {(void **)&s->qa, T * (hp->q_lora_rank ? hp->q_lora_rank : 1) * sizeof(float)},
        {(void **)&s->q, T * H * dk * sizeof(float)},
        {(void **)&s->kv_a, T * (kvr + dr) * sizeof(float)},
        {(void **)&s->o, T * H * hp->v_head_dim * sizeof(float)},
        {(void **)&s->y, T * E * sizeof(float)},
        {(void **)&s->cos_sin, T * dr * sizeof(float)},
        {(void **)&s->cache.block_ids, (blocks ? blocks : 1) * sizeof(uint32_t)},
        {(void **)&s->cache.first_block, T * sizeof(uint32_t)},
        {(void **)&s->cache.n_kv, T * sizeof(uint32_t)},
        {&s->mla_scratch, mla_scratch},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        kt_status st = device_alloc(e, want[i].bytes, want[i].ptr, err);
        if (st)
            return st;
    }
    if (lt_scratch) {
        kt_status st = device_alloc(e, lt_scratch, &s->lt_scratch, err);
        if (st)
            return st;
        s->lt_scratch_bytes = lt_scratch;
    }
    s->mla_scratch_bytes = mla_scratch;
    s->cache.pool = e->dev.kv_pool;
    s->cache.block_tokens = e->params.kv_block_tokens;
    s->cache.block_floats = (int64_t)hp->n_layer * e->params.kv_block_tokens * (int64_t)(kvr + dr);
    s->x = e->dev.x;
    if (e->dev.sizing)
        return KT_OK;
    if (!(e->dev.cuda_layers = calloc(hp->n_layer, sizeof *e->dev.cuda_layers)))
        return kt_err_set(err, KT_ERR_NOMEM, "engine: out of memory");
    for (uint32_t il = 0; il < hp->n_layer; il++) {
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
    for (uint32_t il = 0; il < hp->n_layer && st == KT_OK; il++) {
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
    const size_t T = e->params.max_batch_tokens, k = hp->n_expert_used;
    if (st == KT_OK && hp->n_expert > 0 &&
        ((st = device_alloc(e, T * hp->n_expert * sizeof(float), (void **)&e->dev.router_logits, err)) ||
         (st = device_alloc(e, T * k * sizeof(uint32_t), (void **)&e->dev.route_experts, err)) ||
         (st = device_alloc(e, T * k * sizeof(float), (void **)&e->dev.route_weights, err))))
        return st;
    if (st == KT_OK)
        st = device_alloc(e, (size_t)e->params.max_batch_tokens * hp->n_embd * sizeof(float), (void **)&e->dev.x,
                          err);
    /* the KV cache's pool */
    uint64_t kv_bytes = 0;
    const struct kt_kv_cache_params kp = kv_params(e, NULL);
    if (st == KT_OK && (st = kt_kv_cache_pool_bytes(&kp, &kv_bytes, err)) == KT_OK)
        st = device_alloc(e, (size_t)kv_bytes, (void **)&e->dev.kv_pool, err);
    if (st == KT_OK && !e->dev.sizing)
        st = kv_cache_create(e, e->dev.kv_pool, err);
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
    const size_t T = e->params.max_batch_tokens, E = e->hp.n_embd, pairs = T * (e->hp.n_expert_used + 1);
    const struct kt_moe_bufs *h = &e->bufs;
    struct kt_moe_bufs *b = &e->dev.bufs;
    *b = *h;
    struct {
        void **ptr;
        size_t bytes;
    } want[] = {
        {(void **)&e->dev.h, T * E * sizeof(float)},
        {(void **)&e->dev.pair_token, pairs * sizeof(uint32_t)},
        {(void **)&b->act, pairs * h->act_stride * sizeof(float)},
        {(void **)&b->act_q, pairs * h->act_q_stride},
        {(void **)&b->pair_out, pairs * E * sizeof(float)},
        {(void **)&b->hq[0], T * h->hq_row_bytes},
        {(void **)&b->hq[1], T * h->hq_row_bytes},
        {(void **)&b->hq[2], T * h->hq_row_bytes},
        {(void **)&b->hq[3], T * h->hq_row_bytes},
        {(void **)&b->hq_pairs_gate, pairs * h->hq_row_bytes},
        {(void **)&b->hq_pairs_up, pairs * h->hq_row_bytes},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        kt_status st = device_alloc(e, want[i].bytes, want[i].ptr, err);
        if (st)
            return st;
    }
    return KT_OK;
}

/* Creates the device and copies in the experts (and shared experts) the
 * params put on it, then its working buffers; fails naming the device when
 * they do not fit its budget. */
static kt_status place_on_device(struct kt_engine *e, const struct kt_engine_params *d, kt_err *err);

static kt_status setup_device(struct kt_engine *e, const struct kt_engine_params *d, kt_err *err)
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
    e->dev.experts = calloc(n_experts ? n_experts : 1, sizeof *e->dev.experts);
    e->dev.cuda_units = calloc((size_t)hp->n_expert + 1, sizeof *e->dev.cuda_units);
    e->dev.shared = d->shared_on_device ? calloc(hp->n_layer, sizeof *e->dev.shared) : NULL;
    e->dev.dense = d->dense_on_device ? calloc(hp->n_layer, sizeof *e->dev.dense) : NULL;
    if (!e->dev.blocks || !e->dev.block_bytes || !e->dev.experts || !e->dev.cuda_units ||
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

/* Allocates and copies in what the params put on the device (or, while
 * device_sizing, only adds up its bytes). */
static kt_status place_on_device(struct kt_engine *e, const struct kt_engine_params *d, kt_err *err)
{
    const struct kt_hparams *hp = &e->hp;
    kt_status st = KT_OK;
    for (uint32_t il = 0; il < hp->n_layer; il++) {
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
            char what[32];
            snprintf(what, sizeof what, "expert %u", x);
            if ((st = device_ffn(e, &w, il, what, err)))
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
    if (d->output_on_device) {
        const size_t T = e->params.max_batch_tokens;
        struct kt_mat w = e->output;
        if ((st = device_mat(e, &w, err)) ||
            (st = device_alloc(e, T * hp->n_embd * sizeof(float), (void **)&e->dev.head_x, err)) ||
            (st = device_alloc(e, T * hp->n_vocab * sizeof(float), (void **)&e->dev.logits, err))) {
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

/* ---- sequences ---------------------------------------------------------------------------- */

kt_status kt_engine_seq_add(struct kt_engine *e, uint32_t seq, kt_err *err)
{
    return kt_kv_cache_seq_add(e->kv, seq, err);
}

kt_status kt_engine_seq_remove(struct kt_engine *e, uint32_t seq, kt_err *err)
{
    return kt_kv_cache_seq_remove(e->kv, seq, err);
}

kt_status kt_engine_seq_fork(struct kt_engine *e, uint32_t src, uint32_t dst, kt_err *err)
{
    return kt_kv_cache_seq_fork(e->kv, src, dst, err);
}

kt_status kt_engine_seq_truncate(struct kt_engine *e, uint32_t seq, uint32_t n_tokens, kt_err *err)
{
    return kt_kv_cache_seq_truncate(e->kv, seq, n_tokens, err);
}

uint32_t kt_engine_seq_length(const struct kt_engine *e, uint32_t seq)
{
    return kt_kv_cache_seq_length(e->kv, seq);
}

/* ---- the step ------------------------------------------------------------------------------ */

static void forget_chunks(struct kt_engine *e)
{
    for (uint32_t c = 0; c < e->n_chunks; c++)
        e->seq_chunk[e->chunks[c].seq] = UINT32_MAX;
    e->n_chunks = 0;
}

/* Checks every token and groups the batch by sequence into e->chunks. */
static kt_status group_batch(struct kt_engine *e, const struct kt_batch *b, uint32_t *n_wanted, kt_err *err)
{
    if (!b || !b->tokens || b->n_tokens == 0)
        return kt_err_set(err, KT_ERR_INVALID, "empty batch");
    if (b->n_tokens > e->params.max_batch_tokens)
        return kt_err_set(err, KT_ERR_INVALID,
                          "batch of %u tokens exceeds max_batch_tokens %u (split long prefills into chunks)",
                          b->n_tokens, e->params.max_batch_tokens);
    *n_wanted = 0;
    e->n_chunks = 0;
    for (uint32_t i = 0; i < b->n_tokens; i++) {
        const struct kt_batch_token *tok = &b->tokens[i];
        if (tok->token < 0 || (uint32_t)tok->token >= e->hp.n_vocab) {
            forget_chunks(e);
            return kt_err_set(err, KT_ERR_INVALID, "token %u: id %d is outside the vocabulary (0 .. %u)", i,
                              tok->token, e->hp.n_vocab - 1);
        }
        if (!kt_kv_cache_seq_exists(e->kv, tok->seq)) {
            forget_chunks(e);
            return kt_err_set(err, KT_ERR_INVALID, "token %u: sequence %u is not in use (kt_engine_seq_add it first)",
                              i, tok->seq);
        }
        uint32_t c = e->seq_chunk[tok->seq];
        if (c == UINT32_MAX) {
            c = e->n_chunks++;
            e->seq_chunk[tok->seq] = c;
            e->chunks[c] = (struct kt_seq_chunk){.seq = tok->seq, .start = kt_kv_cache_seq_length(e->kv, tok->seq)};
        }
        struct kt_seq_chunk *ch = &e->chunks[c];
        if (tok->pos != ch->start + ch->n) {
            forget_chunks(e);
            return kt_err_set(err, KT_ERR_INVALID,
                              "token %u: sequence %u continues at position %u, but the token has position %u", i,
                              tok->seq, ch->start + ch->n, tok->pos);
        }
        ch->n++;
        *n_wanted += tok->want_logits;
    }
    uint32_t offset = 0;
    for (uint32_t c = 0; c < e->n_chunks; c++) {
        e->chunks[c].tokens = e->chunk_tokens + offset;
        offset += e->chunks[c].n;
        e->chunks[c].n = 0;
    }
    for (uint32_t i = 0; i < b->n_tokens; i++) {
        struct kt_seq_chunk *ch = &e->chunks[e->seq_chunk[b->tokens[i].seq]];
        ch->tokens[ch->n++] = i;
    }
    return KT_OK;
}

static void add_rows(float *x, const float *y, size_t n);

/* x += Attention(RMSNorm(x)) for the step's tokens, with layer il's
 * attention weights where they live (host or device copies). */
static void attention_block(struct kt_engine *e, uint32_t il, float *x)
{
    const uint32_t T = e->n_tokens, E = e->hp.n_embd;
    const struct kt_layer_weights *L = kt_fwd_attention_weights(e, il);
    for (uint32_t t = 0; t < T; t++)
        kt_rmsnorm(e->h + (size_t)t * E, x + (size_t)t * E, L->attn_norm, E, e->hp.rms_eps);
    kt_fwd_attention(e, il, e->h, e->y);
    add_rows(x, e->y, (size_t)T * E);
}

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

/* A layer's device part on the sim's queue: attention_block on the residual
 * stream sent there (the stepping thread waits meanwhile, so the thread
 * pool is free), then in MoE layers the FFN norm and the router. */
static void layer_on_device(void *ctx)
{
    const struct kt_device_job *a = ctx;
    if (!job_fits(a))
        return;
    attention_block(a->e, a->il, a->e->dev.x);
    if (a->e->layers[a->il].is_moe)
        kt_fwd_route_on_device(a->e, a->il);
}

/* The same on the GPU (a kt_backend_cuda_fn): ctx is the layer's job. */
static int layer_on_cuda(void *ctx, void *stream, char *msg, size_t msg_bytes)
{
    const struct kt_device_job *a = ctx;
    struct kt_engine *e = a->e;
    const int64_t row = (int64_t)e->hp.kv_lora_rank + e->hp.qk_rope_dim;
    e->dev.cuda_step.cache.layer_offset = (int64_t)a->il * e->params.kv_block_tokens * row;
    if (kt_cuda_attention_block(&e->dev.cuda_layers[a->il], &e->dev.cuda_step, stream, msg, msg_bytes))
        return -1;
    return e->layers[a->il].is_moe ? kt_fwd_route_on_cuda(e, a->il, stream, msg, msg_bytes) : 0;
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
static void head_on_device(void *ctx)
{
    struct kt_engine *e = ctx;
    kt_fwd_matmul(e, &e->dev.output, e->dev.head_x, e->dev.head_rows, e->dev.logits, e->xq);
}

/* The same on the GPU (a kt_backend_cuda_fn). */
static int head_on_cuda(void *ctx, void *stream, char *msg, size_t msg_bytes)
{
    struct kt_engine *e = ctx;
    const struct kt_cuda_mat w = kt_fwd_cuda_mat(&e->dev.output);
    return kt_cuda_matmul(&w, e->dev.head_x, e->dev.head_rows, e->dev.logits, KT_CUDA_MATMUL_AUTO, stream, msg,
                          msg_bytes);
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

static void add_rows(float *x, const float *y, size_t n)
{
    for (size_t i = 0; i < n; i++)
        x[i] += y[i];
}

kt_status kt_engine_step(struct kt_engine *e, const struct kt_batch *b, float *logits, kt_err *err)
{
    const struct kt_hparams *hp = &e->hp;
    const uint32_t E = hp->n_embd;
    uint32_t n_wanted = 0;
    kt_status st = group_batch(e, b, &n_wanted, err);
    if (st != KT_OK)
        return st;
    if (n_wanted > 0 && !logits) {
        forget_chunks(e);
        return kt_err_set(err, KT_ERR_INVALID, "%u tokens want logits but no logits buffer was given", n_wanted);
    }
    for (uint32_t c = 0; c < e->n_chunks; c++) {
        e->reserve_seqs[c] = e->chunks[c].seq;
        e->reserve_n[c] = e->chunks[c].n;
    }
    if ((st = kt_kv_cache_reserve(e->kv, e->n_chunks, e->reserve_seqs, e->reserve_n, err)) != KT_OK) {
        forget_chunks(e);
        return st;
    }

    /* From here on only the device can fail (a copy or kernel, or a graph
     * replayed for the wrong batch): then every sequence goes back to its
     * length before the step (its cache rows past it are never read) and the
     * step's error state is cleared, so the next step runs as if this one
     * had not been asked for. */
    e->dev.graph_mismatch = false;
    uint64_t t0 = kt_fwd_now_ns();
    const uint32_t T = b->n_tokens;
    e->tokens = b->tokens;
    e->n_tokens = T;
    kt_fwd_choose_attention_forms(e);
    for (uint32_t c = 0; c < e->n_chunks; c++) {
        if (e->chunks[c].expanded)
            e->stats.expanded_tokens += e->chunks[c].n;
        else
            e->stats.absorbed_tokens += e->chunks[c].n;
    }
    for (uint32_t t = 0; t < T; t++) {
        const struct kt_batch_token *tok = &b->tokens[t];
        kt_rope_angles(&e->rope, tok->pos, e->cos_sin + (size_t)t * hp->qk_rope_dim);
        const kt_to_float_fn to_float = kt_type_traits(e->token_embd.type)->to_float;
        to_float(e->token_embd.data + (size_t)tok->token * e->token_embd.row_bytes, e->x + (size_t)t * E, E);
    }
    e->stats.weight_bytes += (uint64_t)T * e->token_embd.row_bytes;
    uint64_t t_embed = kt_fwd_now_ns() - t0;
    e->stats.other_ns += t_embed;
    e->stats.embed_head_ns += t_embed;
    if (e->dev.graphs && T <= KT_GRAPH_TOKENS)
        choose_graph_slot(e);
    if (e->dev.cuda_layers)
        send_cache_tables(e);

    for (uint32_t il = 0; il < hp->n_layer; il++) {
        const struct kt_layer_weights *L = &e->layers[il];
        struct kt_backend_stats dev0 = {0}, dev1 = {0};
        if (e->dev.backend)
            kt_backend_stats(e->dev.backend, &dev0);
        uint64_t ta = kt_fwd_now_ns();
        /* x goes to the device, through attention there (and in MoE layers
         * the FFN norm and the router), and back with h and the routing */
        const bool routed = e->dev.layers && L->is_moe;
        if (e->dev.layers) {
            const size_t k = hp->n_expert_used;
            kt_backend_copy_in(e->dev.backend, e->dev.x, e->x, (size_t)T * E * sizeof(float));
            run_device_layer(e, il);
            kt_backend_copy_out(e->dev.backend, e->x, e->dev.x, (size_t)T * E * sizeof(float));
            if (routed) {
                kt_backend_copy_out(e->dev.backend, e->h, e->dev.h, (size_t)T * E * sizeof(float));
                kt_backend_copy_out(e->dev.backend, e->route_experts, e->dev.route_experts, T * k * sizeof(uint32_t));
                kt_backend_copy_out(e->dev.backend, e->route_weights, e->dev.route_weights, T * k * sizeof(float));
            }
            kt_backend_sync(e->dev.backend);
        } else {
            attention_block(e, il, e->x);
        }
        uint64_t tb = kt_fwd_now_ns();
        e->stats.attention_ns += tb - ta;

        for (uint32_t t = 0; !routed && t < T; t++)
            kt_rmsnorm(e->h + (size_t)t * E, e->x + (size_t)t * E, L->ffn_norm, E, hp->rms_eps);
        uint64_t tf = kt_fwd_now_ns();
        e->stats.other_ns += tf - tb;
        const uint64_t router_before = e->stats.router_ns;
        kt_fwd_ffn(e, il, e->h, e->y);
        uint64_t tc = kt_fwd_now_ns();
        add_rows(e->x, e->y, (size_t)T * E);
        uint64_t te = kt_fwd_now_ns();
        e->stats.other_ns += te - tc;

        struct kt_engine_layer_stats *ls = &e->layer_stats[il];
        const uint64_t router = e->stats.router_ns - router_before;
        ls->attention_ns += tb - ta;
        ls->router_ns += router;
        ls->experts_ns += tc - tf > router ? tc - tf - router : 0;
        ls->combine_ns += (tf - tb) + (te - tc);
        if (e->dev.backend) { /* the layer synced with the device: its queue time is counted */
            kt_backend_stats(e->dev.backend, &dev1);
            ls->device_ns += dev1.busy_ns - dev0.busy_ns;
            ls->device_transfer_ns += dev1.transfer_ns - dev0.transfer_ns;
        }
    }

    /* Logits of the wanted tokens, in batch order: (n_wanted, V). */
    uint64_t td = kt_fwd_now_ns();
    uint32_t w = 0;
    for (uint32_t t = 0; t < T; t++)
        if (b->tokens[t].want_logits)
            kt_rmsnorm(e->h + (size_t)w++ * E, e->x + (size_t)t * E, e->output_norm, E, hp->rms_eps);
    if (n_wanted > 0 && e->dev.output.data) { /* the normed rows go to the device, the logits come back */
        e->dev.head_rows = n_wanted;
        kt_backend_copy_in(e->dev.backend, e->dev.head_x, e->h, (size_t)n_wanted * E * sizeof(float));
        kt_backend_run(e->dev.backend, head_on_device, e, head_on_cuda, e);
        kt_backend_copy_out(e->dev.backend, logits, e->dev.logits, (size_t)n_wanted * hp->n_vocab * sizeof(float));
        kt_backend_sync(e->dev.backend);
    } else if (n_wanted > 0) {
        kt_fwd_matmul(e, &e->output, e->h, n_wanted, logits, e->xq);
    }
    uint64_t t_head = kt_fwd_now_ns() - td;
    e->stats.other_ns += t_head;
    e->stats.embed_head_ns += t_head;

    st = e->dev.backend ? kt_backend_take_failure(e->dev.backend, err) : KT_OK;
    if (st == KT_OK && e->dev.graph_mismatch)
        st = kt_err_set(err, KT_ERR_INVALID, "engine: a device graph was replayed for another batch size");
    if (st != KT_OK) { /* these logits are not to be trusted, nor the cache rows the step wrote */
        for (uint32_t c = 0; c < e->n_chunks; c++)
            kt_kv_cache_seq_truncate(e->kv, e->chunks[c].seq, e->chunks[c].start, NULL);
        e->dev.graph_mismatch = false;
        forget_chunks(e);
        return st;
    }
    forget_chunks(e);
    e->stats.steps++;
    e->stats.tokens += T;
    return KT_OK;
}

/* ---- queries ------------------------------------------------------------------------------- */

uint32_t kt_engine_n_vocab(const struct kt_engine *e)
{
    return e->hp.n_vocab;
}

uint32_t kt_engine_max_batch_tokens(const struct kt_engine *e)
{
    return e->params.max_batch_tokens;
}

const struct kt_engine_params *kt_engine_params(const struct kt_engine *e)
{
    return &e->params;
}

const struct kt_kv_cache *kt_engine_kv_cache(const struct kt_engine *e)
{
    return e->kv;
}

uint64_t kt_engine_scratch_bytes(const struct kt_engine *e)
{
    return e->scratch_bytes;
}

uint64_t kt_engine_expert_store_bytes(const struct kt_engine *e)
{
    return e->experts ? kt_expert_store_bytes(e->experts) : 0;
}

void kt_engine_stats(const struct kt_engine *e, struct kt_engine_stats *s)
{
    *s = e->stats;
}

void kt_engine_stats_reset(struct kt_engine *e)
{
    memset(&e->stats, 0, sizeof e->stats);
    memset(e->layer_stats, 0, e->hp.n_layer * sizeof *e->layer_stats);
    if (e->dev.backend)
        kt_backend_stats_reset(e->dev.backend);
}

bool kt_engine_layer_stats(const struct kt_engine *e, uint32_t il, struct kt_engine_layer_stats *out)
{
    if (il >= e->hp.n_layer)
        return false;
    *out = e->layer_stats[il];
    return true;
}
