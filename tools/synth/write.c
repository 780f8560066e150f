/*
 * write.c - kt-synth's file writer: the metadata a real deepseek2 GGUF
 * carries, then every tensor's rows drawn, quantized and streamed to disk.
 *
 * Memory stays bounded whatever the file size: rows are produced in chunks of
 * about CHUNK_BYTES into a ring of a few chunks per thread, and the calling
 * thread hands finished chunks to the GGUF writer strictly in file order.
 * Workers may finish out of order; a worker waits before reusing a ring slot
 * the writer has not yet emptied.  The bytes never depend on the thread count.
 * Must never print: progress goes to the caller's reporter.
 */
#include "synth.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "init.h"
#include "quant.h"

#define CHUNK_BYTES ((size_t)1 << 20) /* output bytes per chunk (one row at least) */
#define SLOTS_PER_THREAD 3

/* ---- metadata -------------------------------------------------------------------- */

/* The keys llama.cpp's converter writes for V3/R1/Kimi-K2 (docs/deepseek2.md, Hyperparameters), in
 * its order: general.*, the TextModel keys, the deepseek2 keys, the tokenizer,
 * and general.quantization_version last as llama-quantize appends it. */
kt_status kt_synth_write_metadata(struct kt_gguf_writer *w, const struct kt_synth_plan *p, kt_err *err)
{
    const struct kt_synth_config *c = &p->cfg;
    kt_status s = KT_OK;
#define U32(k, v) if ((s = kt_gguf_writer_set_u32(w, "deepseek2." k, (v), err)) != KT_OK) return s
#define F32(k, v) if ((s = kt_gguf_writer_set_f32(w, "deepseek2." k, (v), err)) != KT_OK) return s
    if ((s = kt_gguf_writer_set_str(w, "general.architecture", "deepseek2", err)) != KT_OK ||
        (s = kt_gguf_writer_set_str(w, "general.type", "model", err)) != KT_OK ||
        (s = kt_gguf_writer_set_str(w, "general.name", c->name, err)) != KT_OK ||
        (s = kt_gguf_writer_set_u32(w, "general.alignment", KT_GGUF_DEFAULT_ALIGNMENT, err)) != KT_OK)
        return s;
    U32("block_count", c->n_layer);
    U32("context_length", c->n_ctx_train);
    U32("embedding_length", c->n_embd);
    U32("feed_forward_length", c->n_ff);
    U32("attention.head_count", c->n_head);
    U32("attention.head_count_kv", 1);
    F32("rope.freq_base", c->rope_freq_base);
    F32("attention.layer_norm_rms_epsilon", c->rms_eps);
    U32("expert_used_count", c->n_expert_used);
    if ((s = kt_gguf_writer_set_u32(w, "general.file_type", p->file_type, err)) != KT_OK)
        return s;
    U32("leading_dense_block_count", p->n_dense_lead);
    U32("vocab_size", p->vocab.n_tokens);
    U32("attention.q_lora_rank", c->q_lora_rank);
    U32("attention.kv_lora_rank", c->kv_lora_rank);
    U32("attention.key_length", c->kv_lora_rank + c->qk_rope_dim);
    U32("attention.value_length", c->kv_lora_rank);
    U32("attention.key_length_mla", c->qk_nope_dim + c->qk_rope_dim);
    U32("attention.value_length_mla", c->v_head_dim);
    U32("expert_feed_forward_length", c->n_ff_exp);
    U32("expert_count", c->n_expert);
    U32("expert_shared_count", c->n_expert_shared);
    U32("expert_group_count", c->n_expert_groups);
    U32("expert_group_used_count", c->n_group_used);
    F32("expert_weights_scale", c->expert_weights_scale);
    if (c->expert_weights_norm &&
        (s = kt_gguf_writer_set_bool(w, "deepseek2.expert_weights_norm", true, err)) != KT_OK)
        return s;
    U32("expert_gating_func", c->gating);
    U32("rope.dimension_count", c->qk_rope_dim);
    if ((s = kt_gguf_writer_set_str(w, "deepseek2.rope.scaling.type", "yarn", err)) != KT_OK)
        return s;
    F32("rope.scaling.factor", c->rope_scaling_factor);
    U32("rope.scaling.original_context_length", c->rope_orig_ctx);
    F32("rope.scaling.yarn_log_multiplier", c->yarn_log_multiplier);
    F32("rope.scaling.yarn_beta_fast", c->yarn_beta_fast);
    F32("rope.scaling.yarn_beta_slow", c->yarn_beta_slow);
#undef U32
#undef F32
    if ((s = kt_synth_vocab_write(w, &p->vocab, err)) != KT_OK)
        return s;
    if (p->quantized && (s = kt_gguf_writer_set_u32(w, "general.quantization_version", 2, err)) != KT_OK)
        return s;
    for (uint32_t i = 0; i < p->n_tensors; i++) {
        const struct kt_synth_tensor *t = &p->tensors[i];
        if ((s = kt_gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, err)) != KT_OK)
            return s;
    }
    return KT_OK;
}

/* ---- chunked, threaded tensor data ------------------------------------------------ */

struct chunk {
    uint32_t tensor;
    uint32_t n_rows;
    uint64_t row0;   /* first row, counted over ne1*ne2 */
    size_t bytes;
};

struct pipeline {
    const struct kt_synth_plan *plan;
    struct chunk *chunks;
    uint64_t n_chunks;
    uint32_t n_slots;
    size_t slot_bytes;
    uint8_t **slots;        /* [n_slots][slot_bytes]: chunk c lives in slot c % n_slots */
    uint64_t *slot_chunk;   /* which chunk a slot holds ready, UINT64_MAX: none */

    pthread_mutex_t lock;   /* guards next, written, slot_chunk, abort */
    pthread_cond_t ready;   /* a chunk became ready (the writer waits) */
    pthread_cond_t freed;   /* the writer emptied a slot (workers wait) */
    uint64_t next;          /* next chunk to claim */
    uint64_t written;       /* chunks handed to the file */
    bool abort;
};

struct worker {
    struct pipeline *pl;
    float *scratch;         /* one row of floats, the widest ne0 */
    pthread_t thread;
};

static size_t row_bytes(const struct kt_synth_tensor *t)
{
    return kt_type_row_bytes(t->type, t->ne[0]);
}

/* Draws and quantizes the rows of chunk ch into dst. */
static void produce(const struct kt_synth_plan *plan, const struct chunk *ch, uint8_t *dst, float *scratch)
{
    const struct kt_synth_tensor *t = &plan->tensors[ch->tensor];
    const struct kt_type_traits *tr = kt_type_traits(t->type);
    size_t rb = row_bytes(t);
    for (uint32_t i = 0; i < ch->n_rows; i++) {
        uint8_t *out = dst + (size_t)i * rb;
        if (t->type == KT_TYPE_F32) {
            kt_synth_init_row(plan, ch->tensor, ch->row0 + i, (float *)(void *)out);
        } else {
            kt_synth_init_row(plan, ch->tensor, ch->row0 + i, scratch);
            tr->from_float(scratch, out, t->ne[0]);
        }
    }
}

static void *worker_main(void *arg)
{
    struct worker *wk = arg;
    struct pipeline *pl = wk->pl;
    for (;;) {
        pthread_mutex_lock(&pl->lock);
        if (pl->abort || pl->next == pl->n_chunks) {
            pthread_mutex_unlock(&pl->lock);
            return NULL;
        }
        uint64_t c = pl->next++;
        while (!pl->abort && c >= pl->written + pl->n_slots)
            pthread_cond_wait(&pl->freed, &pl->lock);
        bool stop = pl->abort;
        pthread_mutex_unlock(&pl->lock);
        if (stop)
            return NULL;

        produce(pl->plan, &pl->chunks[c], pl->slots[c % pl->n_slots], wk->scratch);

        pthread_mutex_lock(&pl->lock);
        pl->slot_chunk[c % pl->n_slots] = c;
        pthread_cond_signal(&pl->ready);
        pthread_mutex_unlock(&pl->lock);
    }
}

static kt_status make_chunks(struct pipeline *pl, kt_err *err)
{
    const struct kt_synth_plan *p = pl->plan;
    uint64_t n = 0;
    for (int pass = 0; pass < 2; pass++) {
        n = 0;
        for (uint32_t i = 0; i < p->n_tensors; i++) {
            const struct kt_synth_tensor *t = &p->tensors[i];
            size_t rb = row_bytes(t);
            uint64_t rows = (uint64_t)t->ne[1] * (uint64_t)t->ne[2];
            uint64_t per = CHUNK_BYTES / rb ? CHUNK_BYTES / rb : 1;
            for (uint64_t r = 0; r < rows; r += per, n++) {
                uint64_t k = rows - r < per ? rows - r : per;
                if (pass == 1)
                    pl->chunks[n] = (struct chunk){i, (uint32_t)k, r, (size_t)k * rb};
                if ((size_t)k * rb > pl->slot_bytes)
                    pl->slot_bytes = (size_t)k * rb;
            }
        }
        if (pass == 0 && !(pl->chunks = malloc((n ? n : 1) * sizeof *pl->chunks)))
            return kt_err_set(err, KT_ERR_NOMEM, "out of memory planning %llu chunks", (unsigned long long)n);
    }
    pl->n_chunks = n;
    return KT_OK;
}

static int64_t widest_row(const struct kt_synth_plan *p)
{
    int64_t w = 1;
    for (uint32_t i = 0; i < p->n_tensors; i++)
        if (p->tensors[i].ne[0] > w)
            w = p->tensors[i].ne[0];
    return w;
}

/* Runs the pipeline: workers produce, this thread writes in order. */
static kt_status stream_data(struct kt_gguf_writer *w, const struct kt_synth_plan *plan, struct kt_progress *progress,
                             kt_err *err)
{
    uint32_t n_threads = plan->cfg.n_threads;
    if (n_threads == 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        n_threads = n > 0 ? (uint32_t)(n < 1024 ? n : 1024) : 1;
    }
    struct pipeline pl = {.plan = plan};
    struct worker *workers = NULL;
    uint32_t started = 0;
    kt_status s = make_chunks(&pl, err);
    if (s != KT_OK)
        goto done;
    pl.n_slots = n_threads * SLOTS_PER_THREAD;
    pl.slots = calloc(pl.n_slots, sizeof *pl.slots);
    pl.slot_chunk = malloc(pl.n_slots * sizeof *pl.slot_chunk);
    workers = calloc(n_threads, sizeof *workers);
    if (!pl.slots || !pl.slot_chunk || !workers) {
        s = kt_err_set(err, KT_ERR_NOMEM, "out of memory setting up %u writer threads", n_threads);
        goto done;
    }
    for (uint32_t i = 0; i < pl.n_slots; i++) {
        pl.slot_chunk[i] = UINT64_MAX;
        if (!(pl.slots[i] = malloc(pl.slot_bytes))) {
            s = kt_err_set(err, KT_ERR_NOMEM, "out of memory for %u buffers of %zu bytes", pl.n_slots, pl.slot_bytes);
            goto done;
        }
    }
    size_t scratch_bytes = (size_t)widest_row(plan) * sizeof(float);
    for (uint32_t i = 0; i < n_threads; i++) {
        workers[i].pl = &pl;
        if (!(workers[i].scratch = malloc(scratch_bytes))) {
            s = kt_err_set(err, KT_ERR_NOMEM, "out of memory for row buffers");
            goto done;
        }
    }
    pthread_mutex_init(&pl.lock, NULL);
    pthread_cond_init(&pl.ready, NULL);
    pthread_cond_init(&pl.freed, NULL);
    for (; started < n_threads; started++) {
        if (pthread_create(&workers[started].thread, NULL, worker_main, &workers[started]) != 0) {
            s = kt_err_set(err, KT_ERR_NOMEM, "could not start writer thread %u of %u", started + 1, n_threads);
            break;
        }
    }
    for (uint64_t c = 0; s == KT_OK && c < pl.n_chunks; c++) {
        uint32_t slot = (uint32_t)(c % pl.n_slots);
        pthread_mutex_lock(&pl.lock);
        while (pl.slot_chunk[slot] != c)
            pthread_cond_wait(&pl.ready, &pl.lock);
        pthread_mutex_unlock(&pl.lock);

        s = kt_gguf_writer_write_data(w, pl.slots[slot], pl.chunks[c].bytes, err);
        kt_progress_add(progress, pl.chunks[c].bytes);

        pthread_mutex_lock(&pl.lock);
        pl.slot_chunk[slot] = UINT64_MAX;
        pl.written = c + 1;
        pthread_cond_broadcast(&pl.freed);
        pthread_mutex_unlock(&pl.lock);
    }
    pthread_mutex_lock(&pl.lock);
    pl.abort = true; /* stops workers early after a failure; a no-op once all chunks are claimed */
    pthread_cond_broadcast(&pl.freed);
    pthread_mutex_unlock(&pl.lock);
    for (uint32_t i = 0; i < started; i++)
        pthread_join(workers[i].thread, NULL);
    pthread_cond_destroy(&pl.freed);
    pthread_cond_destroy(&pl.ready);
    pthread_mutex_destroy(&pl.lock);
done:
    if (workers)
        for (uint32_t i = 0; i < n_threads; i++)
            free(workers[i].scratch);
    free(workers);
    if (pl.slots)
        for (uint32_t i = 0; i < pl.n_slots; i++)
            free(pl.slots[i]);
    free(pl.slots);
    free(pl.slot_chunk);
    free(pl.chunks);
    return s;
}

kt_status kt_synth_write(const struct kt_synth_plan *plan, const char *path, struct kt_progress *progress,
                         kt_err *err)
{
    if (!plan || !path)
        return kt_err_set(err, KT_ERR_INVALID, "kt_synth_write: NULL argument");
    struct kt_gguf_writer *w = NULL;
    kt_status s = kt_gguf_writer_create(path, &w, err);
    if (s == KT_OK)
        s = kt_synth_write_metadata(w, plan, err);
    if (s == KT_OK)
        s = kt_gguf_writer_write_header(w, err);
    if (s == KT_OK)
        s = stream_data(w, plan, progress, err);
    if (s == KT_OK)
        s = kt_gguf_writer_finish(w, err);
    kt_gguf_writer_destroy(w);
    return s;
}

kt_status kt_synth_write_header_only(const struct kt_synth_plan *plan, const char *path, kt_err *err)
{
    if (!plan || !path)
        return kt_err_set(err, KT_ERR_INVALID, "kt_synth_write_header_only: NULL argument");
    struct kt_gguf_writer *w = NULL;
    kt_status s = kt_gguf_writer_create(path, &w, err);
    if (s == KT_OK)
        s = kt_synth_write_metadata(w, plan, err);
    if (s == KT_OK)
        s = kt_gguf_writer_write_header(w, err);
    if (s == KT_OK)
        s = kt_gguf_writer_finish_sparse(w, err);
    kt_gguf_writer_destroy(w);
    return s;
}
