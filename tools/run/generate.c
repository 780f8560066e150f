/*
 * generate.c - kt-run's generation: prompt (raw or through the model's chat
 * template) -> tokens -> prefill in chunks -> sample and decode one token
 * per step, streaming the text; then prompt tokens, prefill and decode
 * speed, time to first token, peak memory.  With --bandwidth, a STREAM triad
 * on the same threads, and decode weight bytes per second as a share of it.
 *
 * It drives the runtime and prints; it must never compute model math itself.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "chat.h"
#include "engine.h"
#include "model_chat.h"
#include "membw.h"
#include "model.h"
#include "pipeline.h"
#include "placement_opt.h"
#include "preflight.h"
#include "ranks.h"
#include "run.h"
#include "sampler.h"
#include "threads.h"
#include "tokenizer.h"
#include "transport.h"
#include "backend.h"

static double now_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double peak_rss_mib(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_maxrss / 1024.0; /* Linux reports KiB */
}

/* Resident memory now (/proc/self/statm), in MiB; 0 where it cannot be read. */
static double rss_now_mib(void)
{
    FILE *f = fopen("/proc/self/statm", "r");
    unsigned long long size = 0, resident = 0;
    const bool ok = f && fscanf(f, "%llu %llu", &size, &resident) == 2;
    if (f)
        fclose(f);
    const long page = sysconf(_SC_PAGESIZE);
    return ok && page > 0 ? (double)resident * (double)page / (1024.0 * 1024.0) : 0.0;
}

/* The prompt as text to tokenize: raw -p text, or the rendered chat turn. */
static kt_status build_prompt(const struct kt_run_options *o, const struct kt_model *m,
                              const struct kt_tokenizer *tok, char **text, bool *add_special, char *format_name,
                              size_t format_size, kt_err *err)
{
    if (o->prompt) {
        *text = strdup(o->prompt);
        *add_special = true; /* BOS as the model's tokenizer adds it */
        snprintf(format_name, format_size, "raw");
        return *text ? KT_OK : kt_err_set(err, KT_ERR_NOMEM, "out of memory");
    }
    kt_chat_format format;
    char *tmpl = NULL, *bos = NULL, *eos = NULL;
    kt_status st = kt_tool_chat_template(m, o->chat_template, "--chat needs the model's chat template", &format,
                                         &tmpl, err);
    if (st != KT_OK)
        return st;
    if (format == KT_CHAT_JINJA)
        kt_tool_chat_special_texts(tok, &bos, &eos);
    kt_chat_message msgs[2];
    size_t n = 0;
    if (o->system)
        msgs[n++] = (kt_chat_message){.role = KT_CHAT_SYSTEM, .content = o->system};
    msgs[n++] = (kt_chat_message){.role = KT_CHAT_USER, .content = o->chat};
    kt_chat_options opts = {.add_generation_prompt = true, .bos_token = bos, .eos_token = eos, .template_text = tmpl};
    st = kt_chat_render(format, msgs, n, &opts, text, err);
    free(tmpl), free(bos), free(eos);
    /* The render carries BOS itself where the family has one (as the published templates do). */
    *add_special = false;
    snprintf(format_name, format_size, "%s", kt_chat_format_name(format));
    return st;
}

struct generation {
    struct kt_transport *transport; /* the job: one process, or the ranks of mpirun */
    struct kt_pipeline *pipeline;   /* the engine's layers over the ranks */
    struct kt_model *model;
    struct kt_tokenizer *tok;
    struct kt_engine *engine;
    struct kt_sampler *sampler;
    FILE *logits_file;
    float *logits;              /* [n_vocab] */
    int32_t *prompt;            /* [n_prompt] */
    size_t n_prompt;
    char *piece;                /* detokenizer output buffer */
};

static kt_status write_logits(struct generation *g, uint32_t n_vocab, kt_err *err)
{
    if (!g->logits_file)
        return KT_OK;
    if (fwrite(g->logits, sizeof(float), n_vocab, g->logits_file) != n_vocab)
        return kt_err_set(err, KT_ERR_IO, "writing logits: %s", strerror(errno));
    return KT_OK;
}

static void generation_free(struct generation *g)
{
    if (g->logits_file)
        fclose(g->logits_file);
    kt_sampler_destroy(g->sampler);
    kt_pipeline_destroy(g->pipeline); /* rank 0: the others stop */
    kt_engine_destroy(g->engine);
    kt_tokenizer_destroy(g->tok);
    kt_model_close(g->model);
    free(g->logits), free(g->prompt), free(g->piece);
}

int kt_run_generate(const struct kt_run_options *o)
{
    struct generation g = {0};
    struct kt_engine_plan plan = {0}; /* what the engine's placement fields point to, until it is created */
    kt_err err = {0};
    char *prompt_text = NULL;
    int rc = 1;
    double t_start = now_seconds();
    if (kt_transport_init(NULL, NULL, &g.transport, &err) != KT_OK)
        goto fail;
    const int rank = kt_transport_rank(g.transport), n_ranks = kt_transport_size(g.transport);

    /* ---- everything that can be refused, before a weight is read ------------------ */
    if (kt_model_open(o->model, &g.model, &err) != KT_OK)
        goto fail;
    if (kt_tool_check_context("--ctx", o->ctx, g.model, o->model, &err) != KT_OK)
        goto fail;
    if (kt_tokenizer_create(g.model->gguf, &g.tok, &err) != KT_OK) {
        kt_err_prefix(&err, "%s", o->model);
        goto fail;
    }
    bool add_special = false;
    char format[64];
    if (build_prompt(o, g.model, g.tok, &prompt_text, &add_special, format, sizeof format, &err) != KT_OK)
        goto fail;
    if (kt_tokenize(g.tok, prompt_text, strlen(prompt_text), add_special, true, &g.prompt, &g.n_prompt, &err) !=
        KT_OK)
        goto fail;
    if (g.n_prompt == 0) {
        kt_err_set(&err, KT_ERR_INVALID, "the prompt has no tokens: give some text");
        goto fail;
    }
    /* the placement, then the context: the model's when its KV cache fits memory, else the largest that does */
    struct kt_engine_params ep = {.max_seqs = 1, .kv_type = o->kv_type};
    struct kt_placement *placement = NULL;
    if (kt_tool_placement_resolve_rank(o->placement, g.model, NULL, n_ranks > 1 ? rank : -1, &placement, &err) !=
        KT_OK)
        goto fail;
    if (o->placement) {
        kt_placement_describe(placement, stderr);
        if (kt_engine_plan_apply(placement, &plan, &ep, stderr, &err) != KT_OK) {
            kt_placement_destroy(placement);
            goto fail;
        }
        if (o->kv_type_given) /* --kv-type wins over the config's kv_cache.type */
            ep.kv_type = o->kv_type;
    }
    struct kt_tool_kv_pool pool;
    kt_status sized = kt_tool_kv_pool_size(g.model, placement, &ep, &(struct kt_tool_kv_request){.ctx = o->ctx},
                                           &pool, &err);
    kt_placement_destroy(placement);
    if (sized != KT_OK)
        goto fail;
    const uint32_t n_ctx = pool.n_ctx;
    const uint32_t train = g.model->hp.n_ctx_train;
    if (!o->ctx && train && n_ctx < train)
        fprintf(stderr, "kt-run: %s\n", pool.line);
    if (train && g.n_prompt >= train) {
        kt_err_set(&err, KT_ERR_INVALID, "the prompt has %zu tokens; %s takes at most %u positions (context_length): "
                   "shorten the prompt", g.n_prompt, o->model, train);
        goto fail;
    }
    if (g.n_prompt >= n_ctx) {
        uint64_t want = (uint64_t)g.n_prompt + 1 + o->n_predict;
        want = train && want > train ? train : want > KT_TOOL_MAX_CTX ? KT_TOOL_MAX_CTX : want;
        kt_err_set(&err, KT_ERR_INVALID, "the prompt has %zu tokens; the context holds %u positions%s: give --ctx %llu "
                   "(room for the prompt and -n %u new tokens), or a shorter prompt",
                   g.n_prompt, n_ctx, o->ctx ? "" : " (the default)", (unsigned long long)want, o->n_predict);
        goto fail;
    }
    const uint32_t n_vocab = g.model->hp.n_vocab;
    struct kt_sampler_params sp = kt_sampler_params_default();
    sp.temperature = o->temperature;
    sp.top_k = o->top_k;
    sp.top_p = o->top_p;
    sp.min_p = o->min_p;
    sp.repetition_penalty = o->repeat_penalty;
    sp.presence_penalty = o->presence_penalty;
    sp.frequency_penalty = o->frequency_penalty;
    sp.seed = o->seed_given ? o->seed : (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
    if (kt_sampler_create(&sp, n_vocab, g.prompt, g.n_prompt, &g.sampler, &err) != KT_OK)
        goto fail;
    if (rank == 0 && o->logits_out && (kt_tool_check_writable("--logits-out", o->logits_out, &err) != KT_OK ||
                          !(g.logits_file = fopen(o->logits_out, "wb")))) {
        if (!err.msg[0])
            kt_err_set(&err, KT_ERR_IO, "--logits-out %s: %s", o->logits_out, strerror(errno));
        goto fail;
    }

    /* ---- the engine: the experts load here ---------------------------------------- */
    uint32_t threads = o->threads;
    if (!threads && kt_tool_default_threads("kt-run", stderr, &threads, &err) != KT_OK)
        goto fail;
    ep.n_ctx = n_ctx;
    ep.n_threads = threads;
    ep.max_batch_tokens = o->batch;
    ep.progress = rank == 0 ? stderr : NULL; /* expert-store load progress */
    if (n_ranks > 1 &&
        kt_tool_rank_layers(o->placement, g.model, n_ranks, rank, &ep.layer_begin, &ep.layer_end, &err) != KT_OK)
        goto fail;
    if (o->kv_type_given) /* --kv-type wins over the config's kv_cache.type */
        ep.kv_type = o->kv_type;
    kt_status created = kt_engine_create(g.model, &ep, &g.engine, &err);
    kt_engine_plan_free(&plan); /* only read at creation */
    if (created != KT_OK)
        goto fail;
    const struct kt_engine_params *eff = kt_engine_params(g.engine);
    const struct kt_pipeline_params pp = {.micro_batches = o->micro_batches,
                                          .timeout_ms = (int64_t)o->rank_timeout * 1000};
    if (kt_pipeline_create(g.transport, g.engine, &pp, &g.pipeline, &err) != KT_OK)
        goto fail;
    if (rank > 0) { /* the layers only: rank 0 drives every step */
        double t_follow = now_seconds();
        if (kt_pipeline_follow(g.pipeline, &err) != KT_OK)
            goto fail;
        struct kt_pipeline_stats ps;
        kt_pipeline_stats(g.pipeline, &ps);
        struct kt_backend_stats dev;
        char device[96] = "";
        if (kt_engine_device_stats(g.engine, &dev) == KT_OK) /* a hybrid stage: its device's share */
            snprintf(device, sizeof device, ", its device busy %.3f s (%llu ops)", (double)dev.busy_ns * 1e-9,
                     (unsigned long long)dev.ops);
        fprintf(stderr, "kt-run: rank %d (%s): layers [%u, %u), %llu slices, busy %.3f s of %.3f s%s, peak memory "
                "%.1f MiB resident\n", rank, kt_transport_host(g.transport), eff->layer_begin, eff->layer_end,
                (unsigned long long)ps.steps, (double)ps.busy_ns[rank] * 1e-9, now_seconds() - t_follow, device,
                peak_rss_mib());
        rc = 0;
        goto done;
    }
    if (n_ranks > 1)
        fprintf(stderr, "kt-run: pipeline of %d ranks (rank 0 on %s: layers [%u, %u), embedding and head)\n",
                n_ranks, kt_transport_host(g.transport), eff->layer_begin, eff->layer_end);

    g.logits = malloc((size_t)n_vocab * sizeof(float));
    size_t piece_cap = kt_detok_max_bytes(g.tok) + 4;
    g.piece = malloc(piece_cap);
    if (!g.logits || !g.piece) {
        kt_err_set(&err, KT_ERR_NOMEM, "out of memory");
        goto fail;
    }
    if (kt_engine_seq_add(g.engine, 0, &err) != KT_OK)
        goto fail;
    fprintf(stderr, "kt-run: %s, %u threads, prompt %zu tokens (%s), seed %llu\n", o->model, eff->n_threads,
            g.n_prompt, format, (unsigned long long)sp.seed);
    double t_loaded = now_seconds();

    /* ---- prefill, in chunks the engine accepts ---------------------------------- */
    uint32_t chunk = kt_engine_max_batch_tokens(g.engine);
    struct kt_batch_token *batch = calloc(chunk, sizeof *batch);
    if (!batch) {
        kt_err_set(&err, KT_ERR_NOMEM, "out of memory");
        goto fail;
    }
    kt_status st = KT_OK;
    for (size_t done = 0; done < g.n_prompt && st == KT_OK;) {
        uint32_t n = (uint32_t)(g.n_prompt - done < chunk ? g.n_prompt - done : chunk);
        for (uint32_t i = 0; i < n; i++)
            batch[i] = (struct kt_batch_token){.token = g.prompt[done + i], .seq = 0, .pos = (uint32_t)(done + i),
                                               .want_logits = done + i == g.n_prompt - 1};
        st = kt_engine_step(g.engine, &(struct kt_batch){.n_tokens = n, .tokens = batch},
                            done + n == g.n_prompt ? g.logits : NULL, &err);
        done += n;
    }
    free(batch);
    if (st != KT_OK || write_logits(&g, n_vocab, &err) != KT_OK)
        goto fail;
    double t_prefilled = now_seconds();
    struct kt_engine_stats prefill_stats;
    kt_engine_stats(g.engine, &prefill_stats);
    kt_engine_stats_reset(g.engine);
    if (g.pipeline)
        kt_pipeline_stats_reset(g.pipeline);

    /* ---- decode: sample, stream, step ----------------------------------------- */
    struct kt_detok detok = KT_DETOK_INIT;
    uint32_t generated = 0, pos = (uint32_t)g.n_prompt;
    double t_first = 0;
    const char *stop_reason = "length";
    while (generated < o->n_predict) {
        int32_t token;
        if (kt_sampler_sample(g.sampler, g.logits, &token, &err) != KT_OK)
            goto fail;
        if (generated == 0)
            t_first = now_seconds();
        generated++;
        if (!o->ignore_eos && kt_token_is_eog(g.tok, token)) {
            stop_reason = "end of generation";
            break;
        }
        size_t written;
        if (kt_detok_push(g.tok, &detok, token, false, g.piece, piece_cap, &written, &err) != KT_OK)
            goto fail;
        if (!o->quiet && written) {
            fwrite(g.piece, 1, written, stdout);
            fflush(stdout);
        }
        if (generated == o->n_predict)
            break;
        if (pos + 1 >= eff->n_ctx) {
            stop_reason = "context full";
            break;
        }
        struct kt_batch_token t = {.token = token, .seq = 0, .pos = pos++, .want_logits = true};
        if (kt_engine_step(g.engine, &(struct kt_batch){.n_tokens = 1, .tokens = &t}, g.logits, &err) != KT_OK)
            goto fail;
        if (write_logits(&g, n_vocab, &err) != KT_OK)
            goto fail;
    }
    size_t tail = kt_detok_flush(&detok, g.piece);
    if (!o->quiet) {
        fwrite(g.piece, 1, tail, stdout);
        fputc('\n', stdout);
        fflush(stdout);
    }
    double t_end = now_seconds();
    if (g.logits_file && fclose(g.logits_file) != 0) {
        g.logits_file = NULL;
        kt_err_set(&err, KT_ERR_IO, "%s: %s", o->logits_out, strerror(errno));
        goto fail;
    }
    g.logits_file = NULL;

    /* ---- report ---------------------------------------------------------------- */
    struct kt_engine_stats ds;
    kt_engine_stats(g.engine, &ds);
    double prefill_s = t_prefilled - t_loaded;
    double decode_s = t_end - t_first; /* decode steps after the first sampled token */
    fprintf(stderr, "\nkt-run: stopped: %s\n", stop_reason);
    fprintf(stderr, "  prompt tokens        %zu\n", g.n_prompt);
    fprintf(stderr, "  prefill              %.2f tok/s (%.3f s)\n", (double)g.n_prompt / prefill_s, prefill_s);
    fprintf(stderr, "  time to first token  %.3f s\n", t_first - t_loaded);
    if (ds.steps > 0) {
        fprintf(stderr, "  decode               %.2f tok/s (%llu steps, %.3f s)\n", (double)ds.steps / decode_s,
                (unsigned long long)ds.steps, decode_s);
        double bytes_per_token = (double)ds.weight_bytes / (double)ds.steps;
        fprintf(stderr, "  weights per token    %.1f MiB read; %.2f GB/s\n", bytes_per_token / (1 << 20),
                (double)ds.weight_bytes / decode_s * 1e-9);
        fprintf(stderr, "  decode time split    attention %.0f%%, router %.0f%%, experts %.0f%%, other %.0f%%\n",
                100.0 * (double)ds.attention_ns / (decode_s * 1e9), 100.0 * (double)ds.router_ns / (decode_s * 1e9),
                100.0 * (double)ds.experts_ns / (decode_s * 1e9), 100.0 * (double)ds.other_ns / (decode_s * 1e9));
    }
    if (n_ranks > 1 && ds.steps > 0) {
        struct kt_pipeline_stats ps;
        kt_pipeline_stats(g.pipeline, &ps);
        fprintf(stderr, "  pipeline             %d ranks; decode steps %.3f s, rank 0 waiting %.3f s; ranks busy",
                n_ranks, (double)ps.step_ns * 1e-9, (double)ps.wait_ns * 1e-9);
        for (int r = 0; r < n_ranks; r++)
            fprintf(stderr, " %.3f", (double)ps.busy_ns[r] * 1e-9);
        fprintf(stderr, " s; bubble %.0f%%\n", 100.0 * kt_pipeline_bubble(&ps));
    }
    fprintf(stderr, "  load                 %.3f s\n", t_loaded - t_start);
    const double now_mib = rss_now_mib();
    fprintf(stderr, "  peak memory          %.1f MiB resident (now %.1f MiB: peak %.3f x the footprint)\n",
            peak_rss_mib(), now_mib, now_mib > 0 ? peak_rss_mib() / now_mib : 0.0);
    (void)prefill_stats;
    if (o->bandwidth && ds.steps > 0) {
        struct kt_triad_result tr;
        if (kt_stream_triad(0, (int)eff->n_threads, 5, &tr, &err) != KT_OK)
            goto fail;
        double gbps = (double)ds.weight_bytes / decode_s * 1e-9;
        fprintf(stderr, "  STREAM triad         %.2f GB/s best of %d (%u threads, 3 x %zu MiB)\n", tr.best_gbps,
                tr.repeats, eff->n_threads, tr.array_bytes >> 20);
        fprintf(stderr, "  decode / triad       %.1f%%\n", 100.0 * gbps / tr.best_gbps);
    }
    rc = 0;
    goto done;
fail:
    fflush(stdout);
    if (g.transport && kt_transport_size(g.transport) > 1) {
        /* the other ranks wait on this one: end the job, not only this rank */
        fprintf(stderr, "kt-run: rank %d: %s\n", kt_transport_rank(g.transport), err.msg[0] ? err.msg : "failed");
        fflush(stderr);
        kt_transport_abort(g.transport, 1);
    }
    fprintf(stderr, "kt-run: %s\n", err.msg[0] ? err.msg : "failed");
done:
    kt_engine_plan_free(&plan);
    free(prompt_text);
    generation_free(&g);
    kt_transport_finalize(g.transport);
    return rc;
}
