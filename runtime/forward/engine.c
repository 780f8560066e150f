/*
 * engine.c - the forward step: batch checks, the KV reservation, and the
 * layer loop of docs/deepseek2.md (walked through in docs/forward-step.md):
 *
 *     x = token_embd[token]
 *     for each layer:  x += Attention(norm(x) attn_norm)      (attention.c)
 *                      x += FFN(norm(x) ffn_norm)             (moe.c)
 *     logits = output . (norm(x) output_norm)
 *
 * What a placement puts on an accelerator runs there (device.c); the time of
 * each part is kept by step_clock.c.  Creation checks every weight's type
 * against the CPU kernels and sizes all buffers, so a step never allocates;
 * it fails on a bad batch before touching any state, or on a device failure,
 * after which every sequence is as it was.  It never prints, never exits,
 * and never writes to the model's mapping.
 */
#include "engine.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "forward.h"
#include "progress.h"

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

struct kt_engine_params kt_fwd_params_resolved(const struct kt_hparams *hp, const struct kt_engine_params *p)
{
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
    if (!d.layer_begin && !d.layer_end)
        d.layer_end = hp->n_layer;
    return d;
}

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
    L->uk_abs = L->uk, L->uv_abs = L->uv;

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

/* The widest activation row (in bytes, of the types that take it) of every
 * matrix in t's list: t may hold NULLs. */
static size_t widest_row(const struct kt_gguf_tensor *const *t, size_t n)
{
    size_t w = 0;
    for (size_t i = 0; i < n; i++)
        if (t[i])
            w = max_size(w, kt_act_row_bytes(t[i]->type, t[i]->ne[0]));
    return w;
}

/* One FFN's widths into s: a dense layer's (moe false) or a MoE layer's expert or shared expert's. */
static void measure_ffn(struct kt_fwd_act_sizes *s, bool moe, const struct kt_gguf_tensor *gate,
                        const struct kt_gguf_tensor *up, const struct kt_gguf_tensor *down, int64_t n_ff)
{
    if (!gate || !down)
        return;
    const struct kt_gguf_tensor *in[] = {gate, up};
    s->ffn_in = max_size(s->ffn_in, widest_row(in, 2));
    const size_t down_in = kt_act_row_bytes(down->type, down->ne[0]);
    size_t *di = moe ? &s->moe_down_in : &s->dense_down_in;
    int64_t *ff = moe ? &s->moe_n_ff : &s->dense_n_ff;
    *di = max_size(*di, down_in);
    *ff = n_ff > *ff ? n_ff : *ff;
}

/* From the model's tensor table alone (types and shapes), so a planner that
 * read only a file's header sizes the same buffers (kt_engine_device_work_bytes). */
struct kt_fwd_act_sizes kt_fwd_act_sizes(const struct kt_model *m)
{
    const struct kt_hparams *hp = &m->hp;
    struct kt_fwd_act_sizes s = {0};
    /* a model kt_model_open accepted has every tensor used here; a table that
     * lacks one (a planner's fuzzed header) only sizes less */
    const struct kt_gguf_tensor *out[] = {m->output};
    s.block_in = widest_row(out, 1);
    for (uint32_t il = 0; m->layers && il < hp->n_layer; il++) {
        const struct kt_layer *t = &m->layers[il];
        const struct kt_gguf_tensor *in[] = {t->attn_q_a, t->attn_q_b,  t->attn_q,
                                             t->attn_kv_a_mqa, t->attn_output, t->ffn_gate_inp};
        s.block_in = max_size(s.block_in, widest_row(in, sizeof in / sizeof in[0]));
        /* per head: q_nope into W_UK (split), o_lat into W_UV */
        if (t->attn_kv_b) {
            s.head_in = max_size(s.head_in, kt_act_row_bytes(t->attn_kv_b->type, hp->kv_lora_rank));
        } else if (t->attn_k_b && t->attn_v_b) {
            s.head_in = max_size(s.head_in, kt_act_row_bytes(t->attn_k_b->type, hp->qk_nope_dim));
            s.head_in = max_size(s.head_in, kt_act_row_bytes(t->attn_v_b->type, hp->kv_lora_rank));
        }
        if (!t->is_moe) {
            measure_ffn(&s, false, t->ffn_gate, t->ffn_up, t->ffn_down, t->ffn_gate ? t->ffn_gate->ne[1] : 0);
            continue;
        }
        if (t->ffn_gate_shexp)
            measure_ffn(&s, true, t->ffn_gate_shexp, t->ffn_up_shexp, t->ffn_down_shexp, t->ffn_gate_shexp->ne[1]);
        const struct kt_gguf_tensor *gate = t->ffn_gate_up_exps ? t->ffn_gate_up_exps : t->ffn_gate_exps;
        measure_ffn(&s, true, gate, t->ffn_gate_up_exps ? NULL : t->ffn_up_exps, t->ffn_down_exps, hp->n_ff_exp);
    }
    return s;
}


size_t kt_fwd_act_floats(const struct kt_fwd_act_sizes *s, size_t T, size_t pairs)
{
    return max_size(T * (size_t)s->dense_n_ff, pairs * (size_t)s->moe_n_ff);
}

size_t kt_fwd_act_q_bytes(const struct kt_fwd_act_sizes *s, size_t T, size_t pairs)
{
    return max_size(T * s->dense_down_in, pairs * s->moe_down_in);
}

void kt_fwd_set_act_strides(struct kt_engine *e, bool moe)
{
    const struct kt_fwd_act_sizes *s = &e->act_sizes;
    e->bufs.act_stride = e->dev.bufs.act_stride = (size_t)(moe ? s->moe_n_ff : s->dense_n_ff);
    e->bufs.act_q_stride = e->dev.bufs.act_q_stride = moe ? s->moe_down_in : s->dense_down_in;
}
/* Lays out every buffer of the engine in a (see struct arena). */
static void layout_buffers(struct kt_engine *e, struct arena *a)
{
    const struct kt_hparams *hp = &e->hp;
    const size_t T = e->params.max_batch_tokens, E = hp->n_embd, H = hp->n_head;
    const size_t dn = hp->qk_nope_dim, dr = hp->qk_rope_dim, dk = dn + dr, dv = hp->v_head_dim;
    const size_t kvr = hp->kv_lora_rank, Ne = hp->n_expert, k = hp->n_expert_used, n_ctx = e->params.n_ctx;
    const size_t pairs = T * (k + 1);
    const struct kt_fwd_act_sizes s = kt_fwd_act_sizes(e->model);
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
    CARVE(e->token_prefill, T);
    CARVE(e->expert_pairs, Ne);
    CARVE(e->expert_unit, Ne);
    CARVE(e->active_experts, Ne);
    CARVE(e->expert_pool_of, Ne);
    CARVE(e->units, Ne + 1);
    struct kt_moe_bufs *b = &e->bufs;
    e->act_sizes = s;
    kt_fwd_set_act_strides(e, true);
    CARVE(b->act, kt_fwd_act_floats(&s, T, pairs));
    CARVE(b->act_q, kt_fwd_act_q_bytes(&s, T, pairs));
    CARVE(b->pair_out, pairs * E);
    b->hq_row_bytes = s.ffn_in;
    for (int i = 0; i < 4; i++)
        CARVE(b->hq[i], T * b->hq_row_bytes);
    CARVE(b->hq_pairs_gate, pairs * b->hq_row_bytes);
    CARVE(b->hq_pairs_up, pairs * b->hq_row_bytes);

    const int n_threads = kt_pool_n_threads(e->pool);
    CARVE(e->scratch, (size_t)n_threads);
    for (int i = 0; i < n_threads; i++) {
        struct kt_thread_scratch measuring, *ts = a->base ? &e->scratch[i] : &measuring;
        CARVE(ts->rows, n_ctx);
        CARVE(ts->k_rows, KT_ATTN_EXPAND_ROWS);
        CARVE(ts->v_rows, KT_ATTN_EXPAND_ROWS);
        CARVE(ts->scores, KT_ATTN_HEAD_GROUP * KT_ATTN_EXPAND_ROWS);
        CARVE(ts->q_max, T);
        CARVE(ts->q_sum, T);
        CARVE(ts->query, KT_ATTN_HEAD_GROUP * (kvr + dr));
        CARVE(ts->o_lat, KT_ATTN_HEAD_GROUP * kvr);
        CARVE(ts->tmp, max_size((size_t)KT_MAT_T_ROWS * dn, kvr));
        CARVE(ts->act_q, s.head_in);
        CARVE(ts->w_uk, dn * kvr);
        CARVE(ts->w_uv, dv * kvr);
        CARVE(ts->k_exp, (size_t)KT_ATTN_EXPAND_ROWS * dk);
        CARVE(ts->v_exp, (size_t)KT_ATTN_EXPAND_ROWS * dv);
        CARVE(ts->c_block, (size_t)KT_ATTN_EXPAND_ROWS * kvr);
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

/* The routed experts' pools (engine.h `topology`): one per NUMA node with
 * cores, n_threads - 1 workers in all, at least one per pool; with one such
 * node, the step's pool alone. */
static kt_status create_pools(struct kt_engine *e, const struct kt_engine_params *d, kt_err *err)
{
    kt_status st = kt_topology_create(d->topology, &e->topo, err);
    if (st != KT_OK)
        return st;
    int n_with_cores = 0;
    for (int i = 0; i < e->topo->n_nodes; i++)
        n_with_cores += e->topo->nodes[i].n_cores > 0;
    const int n_threads = kt_pool_n_threads(e->pool);
    struct kt_pools_config cfg = {.max_threads = n_threads - 1 > n_with_cores ? n_threads - 1 : n_with_cores};
    if (n_with_cores > 1 && (st = kt_pools_create(e->topo, &cfg, &e->pools, err)) != KT_OK)
        return st;
    e->n_pools = e->pools ? kt_pools_count(e->pools) : 1;
    e->help_first_pool = !e->pools || kt_pools_caller_helps(e->pools);
    e->expert_pools = calloc((size_t)e->n_pools, sizeof *e->expert_pools);
    e->node_pool = calloc((size_t)e->topo->n_nodes, sizeof *e->node_pool);
    e->pool_units = calloc((size_t)e->n_pools + 1, sizeof *e->pool_units);
    e->pool_jobs = calloc((size_t)e->n_pools, sizeof *e->pool_jobs);
    e->pool_load = calloc((size_t)e->n_pools, sizeof *e->pool_load);
    if (!e->expert_pools || !e->node_pool || !e->pool_units || !e->pool_jobs || !e->pool_load)
        return kt_err_set(err, KT_ERR_NOMEM, "engine: out of memory");
    for (int i = 0; i < e->n_pools; i++) {
        e->expert_pools[i] = e->pools ? kt_pools_get(e->pools, i) : e->pool;
        if (kt_pool_node(e->expert_pools[i]) >= 0)
            e->node_pool[kt_pool_node(e->expert_pools[i])] = i;
    }
    return KT_OK;
}

/* The parts of row-sliced layers (engine.h layer_sliced): the nodes of
 * expert_slice_nodes (0: every node with a pool), each with its pool; fewer
 * than two leave every layer whole (n_slices 0, *nodes 0).  Made whenever
 * two or more nodes have pools, so a layer can be sliced while serving
 * (kt_engine_layer_slice_copy); *nodes is set only when layers start sliced. */
static kt_status plan_slices(struct kt_engine *e, const struct kt_engine_params *d, uint16_t *nodes, kt_err *err)
{
    *nodes = 0;
    if (!e->pools || e->test.experts_in_place)
        return KT_OK;
    uint32_t with_pool = 0;
    for (int g = 0; g < e->n_pools; g++)
        if (kt_pool_node(e->expert_pools[g]) >= 0 && kt_pool_node(e->expert_pools[g]) < KT_EXPERT_MAX_NODES)
            with_pool |= 1u << kt_pool_node(e->expert_pools[g]);
    const uint32_t want = d->expert_slice_nodes ? d->expert_slice_nodes : with_pool;
    if ((want & ~with_pool) && !d->layer_sliced)
        return KT_OK; /* only a start sliced is refused for it */
    if (want & ~with_pool)
        return kt_err_set(err, KT_ERR_INVALID,
                          "engine: expert_slice_nodes 0x%x names node %d, which has no worker pool (nodes with pools: "
                          "0x%x)",
                          want, __builtin_ctz(want & ~with_pool), with_pool);
    if (__builtin_popcount(want) < 2)
        return KT_OK;
    const size_t per_pool = (size_t)e->hp.n_expert + 2;
    e->pool_slice = malloc((size_t)e->n_pools * sizeof *e->pool_slice);
    e->slice_first = malloc((size_t)e->n_pools * per_pool * sizeof *e->slice_first);
    if (!e->pool_slice || !e->slice_first)
        return kt_err_set(err, KT_ERR_NOMEM, "engine: out of memory");
    for (int g = 0; g < e->n_pools; g++) {
        const int node = kt_pool_node(e->expert_pools[g]);
        e->pool_slice[g] = node >= 0 && node < KT_EXPERT_MAX_NODES && (want >> node & 1)
                               ? __builtin_popcount(want & ((1u << node) - 1))
                               : -1;
    }
    e->n_slices = __builtin_popcount(want);
    e->slice_nodes = (uint16_t)want;
    *nodes = d->layer_sliced ? (uint16_t)want : 0;
    return KT_OK;
}


/* ---- host weights repacked ------------------------------------------------------------------ */

/* m's rows repacked into the level's format in anonymous memory (huge pages
 * advised), when the level has one for m's type: the kernels read packed
 * groups at the expert path's bandwidth, and a mapping of huge pages costs
 * fewer TLB misses than the file's 4 KiB page-cache pages.  The file's pages
 * it read are then released from this process. */
/* The packed format m gets on the host, or NULL: it stays in GGUF rows (no
 * format for its type, or fewer rows than one group).  kt_engine_host_bytes
 * predicts with the same rule. */
static const struct kt_packed_format *host_pack_format(const struct kt_mat *m)
{
    const struct kt_cpu_type_kernels *k = kt_mat_kernels_for(m->type);
    const struct kt_packed_format *f = k ? k->packed : NULL;
    return f && m->n_out >= (int64_t)f->rows ? f : NULL;
}

static kt_status pack_host_mat(struct kt_engine *e, struct kt_mat *m, bool drop_file_pages, kt_err *err)
{
    const struct kt_packed_format *f = m->data && !m->packed ? host_pack_format(m) : NULL;
    if (!f)
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
    if (drop_file_pages && hi > lo)
        madvise((void *)lo, hi - lo, MADV_DONTNEED);
    e->packed_blocks[e->n_packed_blocks] = p;
    e->packed_block_bytes[e->n_packed_blocks++] = bytes;
    m->data = p;
    m->packed = f;
    return KT_OK;
}

/* The matrices the host multiplies whole (attention projections, dense
 * FFNs, shared experts, the output head), each packed where its level has
 * a format and it stays on the host.  Split W_UK / W_UV keep their GGUF
 * rows (the expanded form dequantizes them) and get packed copies for the
 * absorbed form, which multiplies one head's slice (whole groups: kvr and dv
 * are multiples of 16) per token: a packed tile streams it at the projections'
 * rate where one vec_dot per 128-wide row did not (kt-bench model, decode). */
/* Whether a packed m can be sliced per head: heads of head_rows rows start on group boundaries. */
static bool heads_whole_groups(const struct kt_mat *m, int64_t head_rows)
{
    const struct kt_packed_format *f = kt_mat_kernels_for(m->type)->packed;
    return f && head_rows % f->rows == 0;
}

static kt_status pack_host_weights(struct kt_engine *e, kt_err *err)
{
    const uint32_t n_layer = e->hp.n_layer;
    e->max_packed_blocks = 14 * n_layer + 1;
    e->packed_blocks = calloc(e->max_packed_blocks, sizeof *e->packed_blocks);
    e->packed_block_bytes = calloc(e->max_packed_blocks, sizeof *e->packed_block_bytes);
    if (!e->packed_blocks || !e->packed_block_bytes)
        return kt_err_set(err, KT_ERR_NOMEM, "engine: out of memory");
    /* a later pipeline stage holds no head; no stage packs another's layers */
    const bool head_here = e->params.layer_begin == 0;
    kt_status st = e->dev.output.data || !head_here ? KT_OK : pack_host_mat(e, &e->output, true, err);
    for (uint32_t il = e->params.layer_begin; il < e->params.layer_end && st == KT_OK; il++) {
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
                st = pack_host_mat(e, mats[i].m, true, err);
        if (st == KT_OK && !e->dev.layers && !L->fused_kv_b && heads_whole_groups(&L->uk_abs, e->hp.kv_lora_rank))
            st = pack_host_mat(e, &L->uk_abs, false, err);
        if (st == KT_OK && !e->dev.layers && !L->fused_kv_b && heads_whole_groups(&L->uv_abs, e->hp.v_head_dim))
            st = pack_host_mat(e, &L->uv_abs, false, err);
    }
    return st;
}

/* ---- host memory, before creation --------------------------------------------------------- */

/* Bytes of t's rows repacked for the host kernels; 0 where the level has no packed format for its type. */
static uint64_t packed_bytes(const struct kt_gguf_tensor *t)
{
    if (!t)
        return 0;
    const struct kt_mat m = kt_mat_from_tensor(t);
    const struct kt_packed_format *f = host_pack_format(&m);
    return f ? kt_packed_bytes(f, m.n_in, m.n_out) : 0;
}

/* packed_bytes of a per-head matrix, where heads of head_rows rows start on its format's groups (else 0). */
static uint64_t packed_heads_bytes(const struct kt_gguf_tensor *t, int64_t head_rows)
{
    const struct kt_mat m = kt_mat_from_tensor(t);
    return heads_whole_groups(&m, head_rows) ? packed_bytes(t) : 0;
}

struct kt_engine_host_bytes kt_engine_host_bytes(const struct kt_model *m, const struct kt_engine_params *p)
{
    const struct kt_hparams *hp = &m->hp;
    const struct kt_engine_params d = kt_fwd_params_resolved(hp, p);
    const bool dev = d.device != NULL;
    struct kt_engine_host_bytes b = {0};
    /* the matrices pack_host_weights packs, where the device does not run them */
    if (!(dev && d.output_on_device) && d.layer_begin == 0)
        b.packed += packed_bytes(m->output);
    for (uint32_t il = d.layer_begin; il < d.layer_end; il++) {
        const struct kt_layer *t = &m->layers[il];
        if (!(dev && d.attention_on_device)) {
            b.packed += packed_bytes(t->attn_q_a) + packed_bytes(t->attn_q_b) + packed_bytes(t->attn_q) +
                        packed_bytes(t->attn_kv_a_mqa) + packed_bytes(t->attn_output);
            /* split W_UK / W_UV: packed copies for the absorbed form where heads are whole groups */
            if (!t->attn_kv_b && t->attn_k_b && t->attn_v_b) {
                b.packed += packed_heads_bytes(t->attn_k_b, hp->kv_lora_rank);
                b.packed += packed_heads_bytes(t->attn_v_b, hp->v_head_dim);
            }
        }
        if (!t->is_moe && !(dev && d.dense_on_device))
            b.packed += packed_bytes(t->ffn_gate) + packed_bytes(t->ffn_up) + packed_bytes(t->ffn_down);
        if (t->is_moe && !(dev && d.shared_on_device))
            b.packed += packed_bytes(t->ffn_gate_shexp) + packed_bytes(t->ffn_up_shexp) +
                        packed_bytes(t->ffn_down_shexp);
    }
    if (!(dev && d.attention_on_device)) {
        struct kt_kv_cache_params kp = {.n_layer = hp->n_layer, .row_floats = hp->kv_lora_rank + hp->qk_rope_dim,
                                        .row_type = d.kv_type,
                                        .block_tokens = d.kv_block_tokens, .n_blocks = d.kv_blocks,
                                        .max_seqs = d.max_seqs, .n_ctx = d.n_ctx};
        uint64_t kv = 0;
        kt_err ignored = {0};
        if (kt_kv_cache_pool_bytes(&kp, &kv, &ignored) == KT_OK)
            b.kv_cache = kv;
    }
    return b;
}

uint64_t kt_engine_host_packed_bytes(const struct kt_engine *e)
{
    uint64_t bytes = 0;
    for (uint32_t i = 0; i < e->n_packed_blocks; i++)
        bytes += e->packed_block_bytes[i];
    return bytes;
}

static kt_status kv_cache_create(struct kt_engine *e, kt_err *err)
{
    const struct kt_kv_cache_params kp = kt_fwd_kv_params(e);
    return kt_kv_cache_create(&kp, &e->kv, err);
}

static void progress_add(void *ctx, uint64_t bytes)
{
    kt_progress_add(ctx, bytes);
}

/* The model's converted tensors (a checkpoint's), with a progress bar of their own. */
static kt_status weights_ready(const struct kt_model *m, FILE *out, kt_err *err)
{
    const uint64_t bytes = kt_model_converted_bytes(m);
    struct kt_progress *prog = bytes ? kt_progress_create(out, "converting weights", bytes, KT_PROGRESS_AUTO) : NULL;
    kt_status st = kt_model_weights_ready(m, prog ? progress_add : NULL, prog, err);
    if (prog && st == KT_OK)
        kt_progress_finish(prog);
    kt_progress_destroy(prog);
    return st;
}

kt_status kt_engine_create(struct kt_model *m, const struct kt_engine_params *p, struct kt_engine **out, kt_err *err)
{
    *out = NULL;
    struct kt_engine *e = calloc(1, sizeof *e);
    if (!e)
        return kt_err_set(err, KT_ERR_NOMEM, "engine: out of memory");
    const struct kt_hparams *hp = &m->hp;
    kt_status st = KT_OK;
    e->model = m;
    e->hp = *hp;

    struct kt_engine_params d = kt_fwd_params_resolved(hp, p);
    if (d.test)
        e->test = *d.test;
    d.test = &e->test;
    if (d.reference && d.device) {
        st = kt_err_set(err, KT_ERR_INVALID,
                        "engine: the reference form runs on the CPU alone, but a device ('%s') was given: drop it",
                        d.device->name ? d.device->name : "unnamed");
        goto fail;
    }
    /* every weight read in its GGUF rows: in place, or for a checkpoint's
     * experts (which are never in memory whole) the store's copy of them */
    if (d.reference)
        e->test.experts_in_place = !kt_model_experts_streamed(m), e->test.keep_gguf_layout = true;
    if (e->test.experts_in_place && kt_model_experts_streamed(m)) {
        st = kt_err_set(err, KT_ERR_INVALID, "engine: a checkpoint's experts are read into the expert store, not "
                        "used in place");
        goto fail;
    }
    if ((st = weights_ready(m, d.progress, err)) != KT_OK)
        goto fail;
    /* each limit named with the value that broke it */
    if (d.n_ctx > (1u << 24))
        st = kt_err_set(err, KT_ERR_INVALID, "engine: n_ctx %u is more than %u positions per sequence: lower it",
                        d.n_ctx, 1u << 24);
    else if (d.max_seqs > (1u << 16))
        st = kt_err_set(err, KT_ERR_INVALID, "engine: max_seqs %u is more than %u sequences: lower it", d.max_seqs,
                        1u << 16);
    else if (d.max_batch_tokens > (1u << 16))
        st = kt_err_set(err, KT_ERR_INVALID, "engine: max_batch_tokens %u is more than %u tokens a step: lower it",
                        d.max_batch_tokens, 1u << 16);
    else if (e->test.attention_form > KT_ATTENTION_EXPANDED)
        st = kt_err_set(err, KT_ERR_INVALID, "engine: attention form %d is not one of 0 to %d",
                        (int)e->test.attention_form, (int)KT_ATTENTION_EXPANDED);
    else if (d.layer_begin >= d.layer_end || d.layer_end > hp->n_layer)
        st = kt_err_set(err, KT_ERR_INVALID, "engine: layers [%u, %u) are not a range of the model's %u layers",
                        d.layer_begin, d.layer_end, hp->n_layer);
    if (st != KT_OK)
        goto fail;
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
    e->route_counts[KT_ROUTE_DECODE] = calloc(2 * (size_t)hp->n_layer * hp->n_expert + 1, sizeof(uint64_t));
    if (!e->layers || !e->layer_stats || !e->route_counts[KT_ROUTE_DECODE]) {
        st = kt_err_set(err, KT_ERR_NOMEM, "engine: out of memory");
        goto fail;
    }
    e->route_counts[KT_ROUTE_PREFILL] = e->route_counts[KT_ROUTE_DECODE] + (size_t)hp->n_layer * hp->n_expert;
    for (uint32_t il = 0; il < hp->n_layer; il++)
        if ((st = build_layer(&m->layers[il], &e->layers[il], err)))
            goto fail;

    uint16_t slice_nodes = 0;
    if ((st = kt_pool_create((int)d.n_threads, &e->pool, err)) || (st = create_pools(e, &d, err)) ||
        (st = plan_slices(e, &d, &slice_nodes, err)))
        goto fail;
    /* with attention on a device the KV cache lives there (device_attention) */
    const bool kv_on_device = d.device && d.attention_on_device;
    if ((!kv_on_device && (st = kv_cache_create(e, err))) || (st = alloc_buffers(e, err)))
        goto fail;
    /* Last: the long step, after everything cheap that could fail. */
    if (!e->test.experts_in_place) {
        struct kt_expert_store_params sp = {.progress = d.progress,
                                            .host_root = e->test.host_root,
                                            .keep_gguf_layout = e->test.keep_gguf_layout,
                                            .home_nodes = d.expert_home_nodes,
                                            .replica_nodes = d.expert_replica_nodes,
                                            .sliced_layers = slice_nodes ? d.layer_sliced : NULL,
                                            .slice_nodes = slice_nodes,
                                            .layer_begin = d.layer_begin,
                                            .layer_end = d.layer_end};
        if (!e->test.keep_gguf_layout) {
            const struct kt_engine_host_bytes hb = kt_engine_host_bytes(m, &d);
            sp.other_host_bytes = hb.packed + hb.kv_cache;
        }
        if (e->test.experts_round_robin && e->pools)
            sp.round_robin_nodes = e->topo->n_nodes;
        if ((st = kt_expert_store_create(m, &sp, &e->experts, err)))
            goto fail;
    }
    if (d.device && (st = kt_dev_create(e, &d, err)))
        goto fail;
    if (e->dev.backend) /* the step's buffers cross the link each layer; the threads' scratch (last, large) does not */
        e->dev.buffers_pinned =
            kt_backend_pin_host(e->dev.backend, e->buffers, (size_t)((uint8_t *)e->scratch - (uint8_t *)e->buffers));
    if (!e->test.keep_gguf_layout && (st = pack_host_weights(e, err)))
        goto fail;
    if (d.expert_cache && (st = kt_engine_expert_cache_start(e, d.expert_cache, err)))
        goto fail;
    e->params.expert_cache = NULL; /* read at creation only */
    for (uint32_t s = 0; s < d.max_seqs; s++)
        e->seq_chunk[s] = UINT32_MAX;
    e->params.n_threads = (uint32_t)kt_pool_n_threads(e->pool);
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
    kt_dev_destroy(e, e->buffers);
    for (uint32_t i = 0; e->packed_blocks && i < e->n_packed_blocks; i++)
        munmap(e->packed_blocks[i], e->packed_block_bytes[i]);
    free(e->packed_blocks);
    free(e->packed_block_bytes);
    kt_pool_destroy(e->pool);
    kt_pools_destroy(e->pools);
    free(e->expert_pools);
    kt_topology_destroy(e->topo);
    free(e->node_pool);
    free(e->pool_load);
    free(e->pool_units);
    free(e->pool_jobs);
    free(e->pool_slice);
    free(e->slice_first);
    kt_kv_cache_destroy(e->kv);
    kt_expert_store_destroy(e->experts);
    if (e->buffers)
        ASAN_UNPOISON_MEMORY_REGION(e->buffers, e->scratch_bytes);
    free(e->buffers);
    free(e->layers);
    free(e->route_counts[KT_ROUTE_DECODE]);
    free(e->layer_stats);
    free(e);
}

/* ---- sequences ---------------------------------------------------------------------------- */

kt_status kt_engine_seq_apply(struct kt_engine *e, enum kt_engine_seq_op op, uint32_t seq, uint32_t arg, kt_err *err)
{
    switch (op) {
    case KT_SEQ_ADD:
        return kt_kv_cache_seq_add(e->kv, seq, err);
    case KT_SEQ_REMOVE:
        return kt_kv_cache_seq_remove(e->kv, seq, err);
    case KT_SEQ_FORK:
        return kt_kv_cache_seq_fork(e->kv, seq, arg, err);
    case KT_SEQ_TRUNCATE:
        return kt_kv_cache_seq_truncate(e->kv, seq, arg, err);
    }
    return kt_err_set(err, KT_ERR_INVALID, "engine: sequence operation %d is not one of %d to %d", (int)op,
                      KT_SEQ_ADD, KT_SEQ_TRUNCATE);
}

/* Here, then (after it succeeded) on the pipeline's other stages. */
static kt_status seq_op(struct kt_engine *e, enum kt_engine_seq_op op, uint32_t seq, uint32_t arg, kt_err *err)
{
    kt_status st = kt_engine_seq_apply(e, op, seq, arg, err);
    if (st == KT_OK && e->stage_hooks.seq)
        st = e->stage_hooks.seq(e->stage_hooks.ctx, op, seq, arg, err);
    return st;
}

kt_status kt_engine_seq_add(struct kt_engine *e, uint32_t seq, kt_err *err)
{
    return seq_op(e, KT_SEQ_ADD, seq, 0, err);
}

kt_status kt_engine_seq_remove(struct kt_engine *e, uint32_t seq, kt_err *err)
{
    return seq_op(e, KT_SEQ_REMOVE, seq, 0, err);
}

kt_status kt_engine_seq_fork(struct kt_engine *e, uint32_t src, uint32_t dst, kt_err *err)
{
    return seq_op(e, KT_SEQ_FORK, src, dst, err);
}

kt_status kt_engine_seq_truncate(struct kt_engine *e, uint32_t seq, uint32_t n_tokens, kt_err *err)
{
    return seq_op(e, KT_SEQ_TRUNCATE, seq, n_tokens, err);
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


/* x (T, E) = token_embd[token] for the step's tokens, or x_in (a pipeline's
 * previous stage), and their RoPE angles (T, dr). */
static void embed(struct kt_engine *e, const float *x_in)
{
    const uint32_t E = e->hp.n_embd;
    for (uint32_t t = 0; t < e->n_tokens; t++)
        kt_rope_angles(&e->rope, e->tokens[t].pos, e->cos_sin + (size_t)t * e->hp.qk_rope_dim);
    if (x_in) {
        memcpy(e->x, x_in, (size_t)e->n_tokens * E * sizeof(float));
        return;
    }
    const kt_to_float_fn to_float = kt_type_traits(e->token_embd.type)->to_float;
    for (uint32_t t = 0; t < e->n_tokens; t++)
        to_float(e->token_embd.data + (size_t)e->tokens[t].token * e->token_embd.row_bytes, e->x + (size_t)t * E, E);
    e->stats.weight_bytes += (uint64_t)e->n_tokens * e->token_embd.row_bytes;
}

/* logits (n_wanted, V) = output . RMSNorm(x) of the tokens that want them, in batch order. */
static void head(struct kt_engine *e, uint32_t n_wanted, float *logits)
{
    const uint32_t E = e->hp.n_embd;
    uint32_t w = 0;
    for (uint32_t t = 0; t < e->n_tokens; t++)
        if (e->tokens[t].want_logits)
            kt_rmsnorm(e->h + (size_t)w++ * E, e->x + (size_t)t * E, e->output_norm, E, e->hp.rms_eps);
    if (n_wanted > 0 && e->dev.output.data)
        kt_dev_head(e, n_wanted, logits);
    else if (n_wanted > 0)
        kt_fwd_matmul(e, &e->output, e->h, n_wanted, logits, e->xq);
}

/* h = RMSNorm(x) * ffn_norm for the step's tokens. */
static void ffn_norm(struct kt_engine *e, const struct kt_layer_weights *L)
{
    const uint32_t E = e->hp.n_embd;
    for (uint32_t t = 0; t < e->n_tokens; t++)
        kt_rmsnorm(e->h + (size_t)t * E, e->x + (size_t)t * E, L->ffn_norm, E, e->hp.rms_eps);
}

/* Reserves the step's KV rows, after checking the batch; on error nothing changed. */
static kt_status begin_step(struct kt_engine *e, const struct kt_batch *b, bool head, float *logits,
                            uint32_t *n_wanted, kt_err *err)
{
    kt_status st = group_batch(e, b, n_wanted, err);
    if (st != KT_OK)
        return st;
    if (head && *n_wanted > 0 && !logits) {
        forget_chunks(e);
        return kt_err_set(err, KT_ERR_INVALID, "%u tokens want logits but no logits buffer was given", *n_wanted);
    }
    for (uint32_t c = 0; c < e->n_chunks; c++) {
        e->reserve_seqs[c] = e->chunks[c].seq;
        e->reserve_n[c] = e->chunks[c].n;
    }
    if ((st = kt_kv_cache_reserve(e->kv, e->n_chunks, e->reserve_seqs, e->reserve_n, err)) != KT_OK) {
        forget_chunks(e);
        return st;
    }
    e->tokens = b->tokens;
    e->n_tokens = b->n_tokens;
    e->dev.graph_mismatch = false;
    kt_fwd_choose_attention_forms(e);
    for (uint32_t c = 0; c < e->n_chunks; c++) {
        if (e->chunks[c].expanded)
            e->stats.expanded_tokens += e->chunks[c].n;
        else
            e->stats.absorbed_tokens += e->chunks[c].n;
    }
    for (uint32_t c = 0; c < e->n_chunks; c++) { /* routing counts: prefill is a sequence's tokens in a step, > 1 */
        const struct kt_seq_chunk *ch = &e->chunks[c];
        const bool prefill = ch->n > 1;
        for (uint32_t i = 0; i < ch->n; i++)
            e->token_prefill[ch->tokens[i]] = prefill;
        e->route_tokens[prefill] += ch->n;
    }
    return KT_OK;
}

/* Adds layer il's routing (e->route_experts, computed here or by the device)
 * to the counts of each token's phase: T * k increments, a few ns per token. */
static void count_routes(struct kt_engine *e, uint32_t il)
{
    const size_t k = e->hp.n_expert_used, Ne = e->hp.n_expert;
    uint64_t *rows[2] = {e->route_counts[KT_ROUTE_DECODE] + il * Ne, e->route_counts[KT_ROUTE_PREFILL] + il * Ne};
    for (uint32_t t = 0; t < e->n_tokens; t++) {
        uint64_t *row = rows[e->token_prefill[t]];
        const uint32_t *x = e->route_experts + t * k;
        for (size_t j = 0; j < k; j++)
            row[x[j]]++;
    }
}

/* Only the device can fail a step that began (a copy or kernel, or a graph
 * replayed for the wrong batch): then every sequence goes back to its length
 * before the step (its cache rows past it are never read) and the step's
 * error state is cleared, so the next step runs as if this one had not been
 * asked for. */
static kt_status end_step(struct kt_engine *e, kt_err *err)
{
    kt_status st = e->dev.backend ? kt_backend_take_failure(e->dev.backend, err) : KT_OK;
    if (st == KT_OK && e->dev.graph_mismatch)
        st = kt_err_set(err, KT_ERR_INVALID, "engine: a device graph was replayed for another batch size");
    if (st != KT_OK) { /* these logits are not to be trusted, nor the cache rows the step wrote */
        for (uint32_t c = 0; c < e->n_chunks; c++)
            kt_kv_cache_seq_truncate(e->kv, e->chunks[c].seq, e->chunks[c].start, NULL);
        e->dev.graph_mismatch = false;
        kt_cache_flush(e); /* a slot's copy may have been among what failed */
    }
    forget_chunks(e);
    kt_dev_retire(e); /* what was given back before the step: its last readers have run */
    return st;
}

/* engine_test.h migrate_every_step: expert (steps so far % n_expert) of each
 * MoE layer onto the device or off it (with a device), then to the next node
 * with cores, where it can move. */
static void test_migrate(struct kt_engine *e)
{
    const uint32_t x = (uint32_t)(e->test_steps++ % (e->hp.n_expert ? e->hp.n_expert : 1));
    for (uint32_t il = 0; e->experts && il < e->hp.n_layer; il++) {
        const struct kt_stored_expert *se = kt_expert_store_expert(e->experts, il, x);
        if (!se->data)
            continue;
        kt_err ignored = {0};
        if (e->dev.backend && kt_engine_expert_on_device(e, il, x))
            kt_engine_expert_off_device(e, il, x, &ignored);
        else if (e->dev.backend)
            kt_engine_expert_to_device(e, il, x, NULL, &ignored);
        for (int k = 1; k < e->topo->n_nodes; k++) {
            const int node = (se->home_node + k) % e->topo->n_nodes;
            if (e->topo->nodes[node].n_cores > 0) {
                kt_engine_move_expert(e, il, x, node, &ignored);
                break;
            }
        }
        /* and the next expert gains a replica on another node, or loses the one it has */
        const uint32_t y = (x + 1) % e->hp.n_expert;
        const uint16_t replicas = kt_engine_expert_replica_nodes(e, il, y);
        const int home = kt_engine_expert_node(e, il, y);
        for (int node = 0; home >= 0 && node < e->topo->n_nodes && node < KT_EXPERT_MAX_NODES; node++) {
            struct kt_expert_copy *c = NULL;
            if (replicas >> node & 1) {
                kt_engine_expert_drop_replica(e, il, y, node, &ignored);
                break;
            }
            if (!replicas && node != home && e->topo->nodes[node].n_cores > 0 &&
                kt_engine_expert_copy(e, il, y, node, &c, &ignored) == KT_OK) {
                kt_engine_expert_add_replica(e, c, &ignored);
                break;
            }
        }
    }
}

/* A step, or a pipeline stage's part of one: x_in NULL embeds b's tokens;
 * x_out NULL ends with the head (logits), else takes the stream. */
static kt_status run_step(struct kt_engine *e, const struct kt_batch *b, const float *x_in, float *x_out,
                          float *logits, kt_err *err)
{
    uint32_t n_wanted = 0;
    if (e->test.migrate_every_step)
        test_migrate(e);
    kt_status st = begin_step(e, b, !x_out, logits, &n_wanted, err);
    if (st != KT_OK)
        return st;
    const size_t TE = (size_t)e->n_tokens * e->hp.n_embd;
    struct kt_step_clock clock;
    kt_step_clock_start(e, &clock);

    embed(e, x_in);                                     /* x = token_embd[token] */
    kt_dev_begin_step(e);
    kt_step_clock_lap(e, &clock, KT_PART_EMBED_HEAD);

    for (uint32_t il = e->params.layer_begin; il < e->params.layer_end; il++) {
        const struct kt_layer_weights *L = &e->layers[il];
        kt_step_clock_begin_layer(e, &clock);
        /* x += Attention(RMSNorm(x)); with attention on the device, a MoE
         * layer's h = RMSNorm(x) and routing come back with x */
        bool h_ready = false;
        if (e->dev.layers)
            h_ready = kt_dev_attention_layer(e, il);
        else
            kt_fwd_attention_block(e, il, e->x);
        kt_step_clock_lap(e, &clock, KT_PART_ATTENTION);
        if (!h_ready)
            ffn_norm(e, L);                             /* h = RMSNorm(x) */
        kt_step_clock_lap(e, &clock, KT_PART_COMBINE);
        kt_fwd_ffn(e, il, e->h, e->y);                  /* y = FFN(h): dense, or MoE + shared experts */
        if (L->is_moe)
            count_routes(e, il);
        kt_step_clock_lap(e, &clock, KT_PART_FFN);
        kt_fwd_add_rows(e->x, e->y, TE);                /* x += y */
        kt_step_clock_lap(e, &clock, KT_PART_COMBINE);
        kt_step_clock_end_layer(e, &clock, il);
        if (e->stage_hooks.progress)
            e->stage_hooks.progress(e->stage_hooks.ctx);
        if (e->layer_hook) { /* its time goes to no part of the step */
            e->layer_hook(e->layer_hook_ctx, il, e->x, e->n_tokens, e->hp.n_embd);
            clock.last_ns = kt_fwd_now_ns();
        }
    }

    if (x_out)                                          /* the next stage's input */
        memcpy(x_out, e->x, TE * sizeof(float));
    else
        head(e, n_wanted, logits);                      /* logits = output . RMSNorm(x) */
    kt_step_clock_lap(e, &clock, KT_PART_EMBED_HEAD);

    if ((st = end_step(e, err)) != KT_OK)
        return st;
    e->stats.steps++;
    e->stats.tokens += b->n_tokens;
    return KT_OK;
}

static bool whole_model(const struct kt_engine *e)
{
    return e->params.layer_begin == 0 && e->params.layer_end == e->hp.n_layer;
}

kt_status kt_engine_step(struct kt_engine *e, const struct kt_batch *b, float *logits, kt_err *err)
{
    if (e->stage_hooks.step)
        return e->stage_hooks.step(e->stage_hooks.ctx, e, b, logits, err);
    if (!whole_model(e))
        return kt_err_set(err, KT_ERR_INVALID, "engine: this engine runs layers [%u, %u) of %u, a pipeline stage: "
                          "step it with kt_engine_step_layers (or through runtime/dist's pipeline)",
                          e->params.layer_begin, e->params.layer_end, e->hp.n_layer);
    return run_step(e, b, NULL, NULL, logits, err);
}

kt_status kt_engine_step_layers(struct kt_engine *e, const struct kt_batch *b, const float *x_in, float *x_out,
                                kt_err *err)
{
    if (!x_out)
        return kt_err_set(err, KT_ERR_INVALID, "engine: a stage's step needs a buffer for its output stream");
    if (!x_in && e->params.layer_begin > 0)
        return kt_err_set(err, KT_ERR_INVALID, "engine: layers [%u, %u) start past the embedding: give the stream "
                          "the previous stage returned", e->params.layer_begin, e->params.layer_end);
    return run_step(e, b, x_in, x_out, NULL, err);
}

kt_status kt_engine_head(struct kt_engine *e, const struct kt_batch *b, const float *x, float *logits, kt_err *err)
{
    if (e->params.layer_begin > 0)
        return kt_err_set(err, KT_ERR_INVALID, "engine: layers [%u, %u) hold no output head (the first stage does)",
                          e->params.layer_begin, e->params.layer_end);
    if (!b || !b->tokens || !x || b->n_tokens == 0 || b->n_tokens > e->params.max_batch_tokens)
        return kt_err_set(err, KT_ERR_INVALID, "engine: the head takes 1 to %u rows", e->params.max_batch_tokens);
    uint32_t n_wanted = 0;
    for (uint32_t t = 0; t < b->n_tokens; t++)
        n_wanted += b->tokens[t].want_logits;
    if (n_wanted > 0 && !logits)
        return kt_err_set(err, KT_ERR_INVALID, "%u tokens want logits but no logits buffer was given", n_wanted);
    const uint64_t t0 = kt_fwd_now_ns();
    e->tokens = b->tokens;
    e->n_tokens = b->n_tokens;
    memcpy(e->x, x, (size_t)b->n_tokens * e->hp.n_embd * sizeof(float));
    head(e, n_wanted, logits);
    const uint64_t ns = kt_fwd_now_ns() - t0;
    e->stats.embed_head_ns += ns;
    e->stats.other_ns += ns;
    e->tokens = NULL;
    e->n_tokens = 0;
    return KT_OK;
}

void kt_engine_set_stage_hooks(struct kt_engine *e, const struct kt_engine_stage_hooks *h)
{
    e->stage_hooks = h ? *h : (struct kt_engine_stage_hooks){0};
}

void kt_engine_layer_range(const struct kt_engine *e, uint32_t *begin, uint32_t *end)
{
    *begin = e->params.layer_begin;
    *end = e->params.layer_end;
}

uint32_t kt_engine_n_embd(const struct kt_engine *e)
{
    return e->hp.n_embd;
}

uint32_t kt_engine_n_layer(const struct kt_engine *e)
{
    return e->hp.n_layer;
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

void kt_engine_set_layer_hook(struct kt_engine *e, kt_engine_layer_hook fn, void *ctx)
{
    e->layer_hook = fn;
    e->layer_hook_ctx = fn ? ctx : NULL;
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
    memset(e->route_counts[KT_ROUTE_DECODE], 0, 2 * (size_t)e->hp.n_layer * e->hp.n_expert * sizeof(uint64_t));
    e->route_tokens[KT_ROUTE_DECODE] = e->route_tokens[KT_ROUTE_PREFILL] = 0;
    if (e->dev.backend)
        kt_backend_stats_reset(e->dev.backend);
    kt_cache_stats_reset(e);
}

bool kt_engine_layer_stats(const struct kt_engine *e, uint32_t il, struct kt_engine_layer_stats *out)
{
    if (il >= e->hp.n_layer)
        return false;
    *out = e->layer_stats[il];
    return true;
}

const uint64_t *kt_engine_route_counts(const struct kt_engine *e, int phase, uint64_t *n_tokens)
{
    if (phase != KT_ROUTE_DECODE && phase != KT_ROUTE_PREFILL)
        return NULL;
    if (n_tokens)
        *n_tokens = e->route_tokens[phase];
    return e->route_counts[phase];
}

/* ---- moving routed experts between nodes (engine.h) ------------------------------------------ */

kt_status kt_engine_expert_copy(const struct kt_engine *e, uint32_t il, uint32_t x, int node,
                                struct kt_expert_copy **out, kt_err *err)
{
    *out = NULL;
    if (!e->experts)
        return kt_err_set(err, KT_ERR_UNSUPPORTED, "the routed experts are read in place: there is no copy to move");
    if (il >= e->hp.n_layer || x >= e->hp.n_expert || !e->layers[il].is_moe)
        return kt_err_set(err, KT_ERR_INVALID, "no routed expert %u in layer %u", x, il);
    if (node < 0 || node >= e->topo->n_nodes || e->topo->nodes[node].n_cores == 0)
        return kt_err_set(err, KT_ERR_INVALID, "node %d is not a node with cores of this engine's topology (%d nodes)",
                          node, e->topo->n_nodes);
    return kt_expert_store_copy(e->experts, il, x, node, out, err);
}

kt_status kt_engine_expert_switch(struct kt_engine *e, struct kt_expert_copy *c, kt_err *err)
{
    const uint64_t bytes = kt_expert_copy_bytes(c);
    kt_status st = kt_expert_store_switch(e->experts, c, err);
    if (st == KT_OK)
        e->stats.experts_moved++, e->stats.experts_moved_bytes += bytes;
    return st;
}

kt_status kt_engine_expert_add_replica(struct kt_engine *e, struct kt_expert_copy *c, kt_err *err)
{
    return kt_expert_store_add_replica(e->experts, c, err);
}

kt_status kt_engine_layer_slice_copy(const struct kt_engine *e, uint32_t il, uint32_t x0, uint32_t x1,
                                     struct kt_layer_slices **out, kt_err *err)
{
    *out = NULL;
    if (!e->experts)
        return kt_err_set(err, KT_ERR_UNSUPPORTED, "the routed experts are read in place: they cannot be sliced");
    if (e->n_slices < 2)
        return kt_err_set(err, KT_ERR_UNSUPPORTED, "layer %u: the engine has worker pools on fewer than two nodes: "
                                                   "nothing to slice over", il);
    return kt_expert_store_slice_copy(e->experts, e->model, il, e->slice_nodes, x0, x1, out, err);
}

kt_status kt_engine_layer_slice_switch(struct kt_engine *e, struct kt_layer_slices *c, kt_err *err)
{
    return kt_expert_store_slice_switch(e->experts, c, err);
}

bool kt_engine_layer_sliced(const struct kt_engine *e, uint32_t il)
{
    return e->experts && il < e->hp.n_layer && kt_expert_store_layout(e->experts, il)->sliced;
}

uint32_t kt_engine_layer_sliced_experts(const struct kt_engine *e, uint32_t il)
{
    return e->experts && il < e->hp.n_layer ? kt_expert_store_layout(e->experts, il)->n_sliced : 0;
}

uint32_t kt_engine_layer_move_experts(const struct kt_engine *e, uint32_t il, bool slice, uint64_t budget)
{
    const uint32_t Ne = e->hp.n_expert;
    if (!e->experts || il >= e->hp.n_layer || !e->layers[il].is_moe || e->n_slices < 2)
        return Ne;
    /* the memory a copy of n experts holds: the shares exactly; whole copies
     * at most one 2 MiB rounding per node over their buffers */
    const uint64_t whole = kt_expert_store_whole_bytes(e->experts, il), round = 2ull << 20;
    uint32_t lo = 1, hi = Ne; /* the most experts whose copy fits, at least one */
    while (lo < hi) {
        const uint32_t mid = lo + (hi - lo + 1) / 2;
        const uint64_t bytes = slice ? kt_expert_store_slice_bytes(e->experts, e->model, il, e->slice_nodes, mid)
                                     : (uint64_t)mid * whole + (uint64_t)e->topo->n_nodes * round;
        if (bytes <= budget)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

kt_status kt_engine_layer_whole_copy(const struct kt_engine *e, uint32_t il, const int *homes, uint32_t x0, uint32_t x1,
                                     struct kt_layer_whole **out, kt_err *err)
{
    *out = NULL;
    if (!e->experts)
        return kt_err_set(err, KT_ERR_UNSUPPORTED, "the routed experts are read in place: no layer is sliced");
    if (il >= e->hp.n_layer || !e->layers[il].is_moe)
        return kt_err_set(err, KT_ERR_INVALID, "layer %u has no routed experts", il);
    for (uint32_t x = x0; x < x1 && x < e->hp.n_expert; x++)
        if (homes[x] < 0 || homes[x] >= e->topo->n_nodes || e->topo->nodes[homes[x]].n_cores == 0)
            return kt_err_set(err, KT_ERR_INVALID, "layer %u expert %u: node %d is not a node with cores of this "
                              "engine's topology (%d nodes)", il, x, homes[x], e->topo->n_nodes);
    return kt_expert_store_whole_copy(e->experts, il, homes, x0, x1, out, err);
}

kt_status kt_engine_layer_whole_switch(struct kt_engine *e, struct kt_layer_whole *c, kt_err *err)
{
    return kt_expert_store_whole_switch(e->experts, c, err);
}

kt_status kt_engine_expert_drop_replica(struct kt_engine *e, uint32_t il, uint32_t x, int node, kt_err *err)
{
    if (!e->experts)
        return kt_err_set(err, KT_ERR_UNSUPPORTED, "the routed experts are read in place: they have no replicas");
    return kt_expert_store_drop_replica(e->experts, il, x, node, err);
}

uint16_t kt_engine_expert_replica_nodes(const struct kt_engine *e, uint32_t il, uint32_t x)
{
    if (kt_engine_expert_node(e, il, x) < 0)
        return 0;
    const struct kt_stored_expert *se = kt_expert_store_expert(e->experts, il, x);
    return (uint16_t)(se->nodes & ~(1u << se->home_node));
}

kt_status kt_engine_move_expert(struct kt_engine *e, uint32_t il, uint32_t x, int node, kt_err *err)
{
    struct kt_expert_copy *c = NULL;
    kt_status st = kt_engine_expert_copy(e, il, x, node, &c, err);
    return st ? st : kt_engine_expert_switch(e, c, err);
}

/* An error unless expert x of layer il is a routed expert the device can take or give back. */
static kt_status device_move_check(const struct kt_engine *e, uint32_t il, uint32_t x, bool to_device, kt_err *err)
{
    if (!e->dev.backend)
        return kt_err_set(err, KT_ERR_UNSUPPORTED, "this engine has no device");
    if (il >= e->hp.n_layer || x >= e->hp.n_expert || !e->layers[il].is_moe)
        return kt_err_set(err, KT_ERR_INVALID, "no routed expert %u in layer %u", x, il);
    if (kt_engine_expert_on_device(e, il, x) == to_device)
        return kt_err_set(err, KT_ERR_INVALID, "layer %u expert %u is %s the device already", il, x,
                          to_device ? "on" : "off");
    return KT_OK;
}

kt_status kt_engine_expert_to_device(struct kt_engine *e, uint32_t il, uint32_t x, struct kt_expert_upload *u,
                                     kt_err *err)
{
    kt_status st = device_move_check(e, il, x, true, err);
    struct kt_expert_upload *read_here = NULL;
    if (st == KT_OK && !u && (st = kt_engine_expert_upload_read(e, il, x, &read_here, err)) == KT_OK)
        u = read_here;
    if (st != KT_OK)
        return st;
    const uint64_t bytes = kt_expert_upload_bytes(u);
    kt_cache_forget(e, il, x); /* homed there now: its slot goes back to the cache */
    if ((st = kt_dev_expert_upload(e, il, x, u, err)) != KT_OK) {
        kt_expert_upload_discard(read_here);
        return st;
    }
    e->stats.experts_moved++, e->stats.experts_moved_bytes += bytes;
    return KT_OK;
}

kt_status kt_engine_expert_off_device(struct kt_engine *e, uint32_t il, uint32_t x, kt_err *err)
{
    kt_status st = device_move_check(e, il, x, false, err);
    if (st == KT_OK) {
        kt_dev_expert_drop(e, il, x);
        e->stats.experts_moved++;
    }
    return st;
}

bool kt_engine_expert_on_device(const struct kt_engine *e, uint32_t il, uint32_t x)
{
    return il < e->hp.n_layer && x < e->hp.n_expert && kt_fwd_expert_on_device(e, il, x) && !kt_cache_holds(e, il, x);
}

int kt_engine_expert_node(const struct kt_engine *e, uint32_t il, uint32_t x)
{
    if (!e->experts || il >= e->hp.n_layer || x >= e->hp.n_expert || !e->layers[il].is_moe)
        return -1;
    const struct kt_stored_expert *se = kt_expert_store_expert(e->experts, il, x);
    return se->data ? se->home_node : -1;
}
