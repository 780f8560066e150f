/*
 * test_sched_preempt.c - KV memory on demand: under a block pool far too
 * small for the load, the scheduler preempts the youngest running job and
 * recomputes it later, and every job still ends with exactly the text it
 * gets alone (greedy) or under a pool that never runs out (seeded
 * sampling, n choices), with preemptions counted; a job that cannot fit
 * the pool even alone fails with a clear error while the others complete;
 * cached prefixes give way before any running job does.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine.h"
#include "kv_cache.h"
#include "model.h"
#include "scheduler.h"
#include "serve_metrics.h"
#include "serve_prompt.h"
#include "serve_request.h"
#include "sched_harness.h"
#include "testlib.h"
#include "tokenizer.h"

#define N_CTX 512
#define MAX_RUNNING 4
#define CACHE_ENTRIES 4
#define SMALL_BLOCKS 12 /* 192 positions: one job at a time fits, four do not */

static struct kt_model *g_model;
static struct kt_tokenizer *g_tok;
static struct kt_engine *g_big, *g_small;
static struct kt_serve_model g_sm;

static struct kt_engine *engine_with(uint32_t kv_blocks)
{
    kt_err err = {0};
    struct kt_engine *e = NULL;
    struct kt_engine_params ep = {.n_ctx = N_CTX, .n_threads = 2,
                                  .max_seqs = kt_sched_engine_seqs(MAX_RUNNING, CACHE_ENTRIES),
                                  .kv_blocks = kv_blocks, .max_batch_tokens = 64};
    KT_CHECK(kt_engine_create(g_model, &ep, &e, &err) == KT_OK, "engine: %s", err.msg);
    return e;
}

static bool setup(void)
{
    const char *path = kt_test_path("preempt-tiny.gguf");
    if (kt_test_system("%s --preset tiny -o %s >/dev/null 2>&1", kt_test_tool("kt-synth"), path) != 0) {
        KT_CHECK(false, "kt-synth failed");
        return false;
    }
    kt_err err = {0};
    bool ok = kt_model_open(path, &g_model, &err) == KT_OK && kt_tokenizer_create(g_model->gguf, &g_tok, &err) == KT_OK;
    KT_CHECK(ok, "setup: %s", err.msg);
    if (ok) {
        g_big = engine_with(kt_sched_kv_blocks_needed(MAX_RUNNING, N_CTX, 16) + CACHE_ENTRIES * N_CTX / 16);
        g_small = engine_with(SMALL_BLOCKS);
    }
    unlink(path);
    if (!ok)
        return false;
    char why[256];
    g_sm = (struct kt_serve_model){.tok = g_tok, .format = kt_serve_chat_format(g_model->gguf, why, sizeof why),
                                   .n_ctx = N_CTX, .n_vocab = kt_engine_n_vocab(g_small)};
    return g_big && g_small;
}

static struct kt_sched *start(struct kt_engine *e, uint32_t cache_entries, struct kt_serve_metrics *m)
{
    struct kt_sched *s = NULL;
    kt_err err = {0};
    struct kt_sched_params p = {.engine = e, .tok = g_tok, .max_running_seqs = MAX_RUNNING, .max_waiting = 32,
                                .max_batch_tokens = 32, .prefix_cache_entries = cache_entries, .metrics = m};
    KT_CHECK(kt_sched_create(&p, &s, &err) == KT_OK, "%s", err.msg);
    return s;
}

static struct kt_job *job_from(const char *body)
{
    return sched_job_from(&g_sm, body);
}

static void wait_done(struct kt_job *job)
{
    sched_wait_done(job, 120000);
}

/* The engine's greedy continuation of prompt, alone in one sequence of e (no scheduler on it), max_tokens of it
 * whatever they are. */
static char *greedy_alone(struct kt_engine *e, const char *prompt, size_t max_tokens)
{
    kt_err err = {0};
    int32_t *ids, out[256];
    size_t n, produced = 0;
    kt_tokenize(g_tok, prompt, strlen(prompt), true, true, &ids, &n, &err);
    const uint32_t nv = kt_engine_n_vocab(e), seq = 0;
    float *logits = kt_test_xmalloc(nv * sizeof *logits);
    KT_CHECK(kt_engine_seq_add(e, seq, &err) == KT_OK, "%s", err.msg);
    struct kt_batch_token t;
    for (size_t i = 0; i < n; i++) {
        t = (struct kt_batch_token){.token = ids[i], .seq = seq, .pos = (uint32_t)i, .want_logits = i + 1 == n};
        KT_CHECK(kt_engine_step(e, &(struct kt_batch){1, &t}, i + 1 == n ? logits : NULL, &err) == KT_OK, "%s",
                 err.msg);
    }
    for (uint32_t pos = (uint32_t)n; produced < max_tokens; pos++) {
        int32_t best = 0;
        for (uint32_t v = 1; v < nv; v++)
            if (logits[v] > logits[best])
                best = (int32_t)v;
        out[produced++] = best;
        if (produced == max_tokens) /* the jobs ignore end-of-generation tokens too */
            break;
        t = (struct kt_batch_token){.token = best, .seq = seq, .pos = pos, .want_logits = true};
        KT_CHECK(kt_engine_step(e, &(struct kt_batch){1, &t}, logits, &err) == KT_OK, "%s", err.msg);
    }
    kt_engine_seq_remove(e, seq, &err);
    free(logits);
    free(ids);
    char *text;
    size_t len;
    kt_detokenize(g_tok, out, produced, false, &text, &len, &err);
    return text;
}

static const char *const prompts[] = {
    "The river runs to the sea and",
    "Once upon a time in a land far away, there lived a king who",
    "1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20",
    "Hello",
    "Rivers and mountains, oceans and plains: the world is wide and",
    "A",
    "The river runs to the sea and the sea runs to",
    "Seven small birds sat on a wire",
};
#define N_PROMPTS (sizeof prompts / sizeof prompts[0])
#define MAX_TOKENS 48

static uint64_t preemptions(struct kt_serve_metrics *m)
{
    pthread_mutex_lock(&m->mu);
    uint64_t n = m->preemptions;
    pthread_mutex_unlock(&m->mu);
    return n;
}

/* Runs every prompt at once on e with the body's extra fields; texts[i * n + c] = choice c's text. */
static void run_all(struct kt_engine *e, uint32_t cache_entries, const char *extra, uint32_t n, char **texts,
                    struct kt_serve_metrics *m)
{
    struct kt_sched *s = start(e, cache_entries, m);
    struct kt_job *jobs[N_PROMPTS];
    for (size_t i = 0; i < N_PROMPTS; i++) {
        char body[1024];
        snprintf(body, sizeof body, "{\"prompt\": \"%s\", \"max_tokens\": %d, \"n\": %u, \"ignore_eos\": true%s}",
                 prompts[i], MAX_TOKENS, n, extra);
        jobs[i] = job_from(body);
        KT_CHECK(jobs[i] && kt_sched_submit(s, jobs[i]) == KT_SUBMIT_OK, "submit %zu", i);
    }
    for (size_t i = 0; i < N_PROMPTS; i++) {
        wait_done(jobs[i]);
        for (uint32_t c = 0; c < n; c++) {
            const struct kt_job_choice *jc = &jobs[i]->choices[c];
            KT_CHECK(jc->finish == KT_FINISH_LENGTH && jc->n_tokens == MAX_TOKENS,
                     "prompt %zu choice %u: finish %s after %u tokens (%s)", i, c, kt_finish_name(jc->finish),
                     jc->n_tokens, jobs[i]->error);
            texts[i * n + c] = strdup(kt_buf_str(&jc->text));
        }
        kt_job_release(jobs[i]);
    }
    kt_sched_destroy(s);
    struct kt_kv_cache_stats ks;
    kt_kv_cache_stats(kt_engine_kv_cache(e), &ks);
    KT_CHECK(ks.n_seqs == 0 && ks.blocks_used == 0, "the scheduler left %u sequences, %u blocks", ks.n_seqs,
             ks.blocks_used);
}

static void greedy_jobs_under_a_small_pool_match_each_alone(void)
{
    char *alone[N_PROMPTS];
    for (size_t i = 0; i < N_PROMPTS; i++)
        alone[i] = greedy_alone(g_small, prompts[i], MAX_TOKENS);
    for (uint32_t cache = 0; cache <= CACHE_ENTRIES; cache += CACHE_ENTRIES) {
        struct kt_serve_metrics m;
        kt_serve_metrics_init(&m);
        char *texts[N_PROMPTS];
        run_all(g_small, cache, ", \"temperature\": 0", 1, texts, &m);
        for (size_t i = 0; i < N_PROMPTS; i++) {
            KT_CHECK(strcmp(texts[i], alone[i]) == 0, "prefix cache %u, prompt %zu: '%s' under pressure, '%s' alone",
                     cache, i, texts[i], alone[i]);
            free(texts[i]);
        }
        KT_CHECK(preemptions(&m) > 0, "prefix cache %u: %u jobs of up to %d positions in %d blocks preempted none",
                 cache, (unsigned)N_PROMPTS, MAX_TOKENS + 24, SMALL_BLOCKS);
        printf("  prefix cache %u: %llu preemptions\n", cache, (unsigned long long)preemptions(&m));
        kt_serve_metrics_destroy(&m);
    }
    for (size_t i = 0; i < N_PROMPTS; i++)
        free(alone[i]);
}

/* Seeded sampling keeps its sampler across a preemption: same text as under a pool that never runs out; with n
 * choices each choice recomputes its own tokens. */
static void seeded_choices_under_pressure_match_a_large_pool(void)
{
    for (uint32_t n = 1; n <= 2; n++) {
        char *big[N_PROMPTS * 2], *small[N_PROMPTS * 2];
        struct kt_serve_metrics mb, ms;
        kt_serve_metrics_init(&mb);
        kt_serve_metrics_init(&ms);
        const char *extra = ", \"temperature\": 0.9, \"top_p\": 0.95, \"seed\": 17";
        run_all(g_big, CACHE_ENTRIES, extra, n, big, &mb);
        run_all(g_small, CACHE_ENTRIES, extra, n, small, &ms);
        KT_CHECK(preemptions(&mb) == 0, "the large pool preempted %llu", (unsigned long long)preemptions(&mb));
        KT_CHECK(preemptions(&ms) > 0, "n=%u: the small pool preempted none", n);
        for (size_t i = 0; i < N_PROMPTS * n; i++) {
            KT_CHECK(strcmp(big[i], small[i]) == 0, "n=%u, text %zu: '%s' with room, '%s' under pressure", n, i,
                     big[i], small[i]);
            free(big[i]);
            free(small[i]);
        }
        printf("  n=%u: %llu preemptions\n", n, (unsigned long long)preemptions(&ms));
        kt_serve_metrics_destroy(&mb);
        kt_serve_metrics_destroy(&ms);
    }
}

/* A prompt longer than the whole pool: the job fails saying so, and the others run to the end. */
static void a_job_larger_than_the_pool_fails_alone(void)
{
    struct kt_serve_metrics m;
    kt_serve_metrics_init(&m);
    struct kt_sched *s = start(g_small, 0, &m);
    char prompt[4096] = "";
    for (int i = 0; i < 120; i++) /* well over 192 tokens */
        snprintf(prompt + strlen(prompt), sizeof prompt - strlen(prompt), "w%d ", i);
    char body[4400];
    snprintf(body, sizeof body, "{\"prompt\": \"%s\", \"max_tokens\": 4, \"temperature\": 0}", prompt);
    struct kt_job *huge = job_from(body);
    struct kt_job *small = job_from("{\"prompt\": \"Hello\", \"max_tokens\": 8, \"temperature\": 0}");
    KT_CHECK(huge && huge->prompt.n_ids > SMALL_BLOCKS * 16, "the prompt has %zu tokens",
             huge ? huge->prompt.n_ids : 0);
    KT_CHECK(kt_sched_submit(s, huge) == KT_SUBMIT_OK && kt_sched_submit(s, small) == KT_SUBMIT_OK, "submit");
    wait_done(huge);
    wait_done(small);
    KT_CHECK(huge->choices[0].finish == KT_FINISH_ERROR && strstr(huge->error, "KV cache") &&
                 strstr(huge->error, "whole pool"),
             "the huge job: %s, '%s'", kt_finish_name(huge->choices[0].finish), huge->error);
    KT_CHECK(small->choices[0].finish == KT_FINISH_LENGTH && small->choices[0].n_tokens == 8,
             "the small job: %s after %u tokens", kt_finish_name(small->choices[0].finish),
             small->choices[0].n_tokens);
    kt_job_release(huge);
    kt_job_release(small);
    kt_sched_destroy(s);
    kt_serve_metrics_destroy(&m);

    /* the server-side check: kt_prompt_prepare refuses it with 413 when it knows the pool */
    struct kt_serve_model sm = g_sm;
    sm.kv_positions = SMALL_BLOCKS * 16;
    struct kt_api_request r;
    struct kt_api_error e;
    struct kt_prompt p;
    KT_CHECK(kt_api_request_parse(KT_API_COMPLETION, body, strlen(body), &r, &e), "parse");
    KT_CHECK(!kt_prompt_prepare(&sm, &r, "t", &p, &e) && e.http_status == 413 && strcmp(e.code, "kv_cache_exceeded") == 0,
             "prepare: %d %s: %s", e.http_status, e.code, e.message);
    kt_api_request_free(&r);
}

/* A sequence never holds more than the whole pool: one job alone stops (length) at the pool's size. */
static void one_sequence_stops_at_the_pool_size(void)
{
    struct kt_sched *s = start(g_small, 0, NULL);
    struct kt_job *job = job_from("{\"prompt\": \"Hello\", \"max_tokens\": 400, \"temperature\": 0, "
                                  "\"ignore_eos\": true}");
    KT_CHECK(job && kt_sched_submit(s, job) == KT_SUBMIT_OK, "submit");
    wait_done(job);
    const size_t positions = job->prompt.n_ids + job->choices[0].n_tokens;
    KT_CHECK(job->choices[0].finish == KT_FINISH_LENGTH && positions == SMALL_BLOCKS * 16 + 1,
             "%s after %u tokens (%zu positions; the pool holds %d)", kt_finish_name(job->choices[0].finish),
             job->choices[0].n_tokens, positions, SMALL_BLOCKS * 16);
    kt_job_release(job);
    kt_sched_destroy(s);
}

int main(void)
{
    if (!setup())
        return kt_test_finish();
    KT_RUN(greedy_jobs_under_a_small_pool_match_each_alone);
    KT_RUN(seeded_choices_under_pressure_match_a_large_pool);
    KT_RUN(a_job_larger_than_the_pool_fails_alone);
    KT_RUN(one_sequence_stops_at_the_pool_size);
    kt_engine_destroy(g_big);
    kt_engine_destroy(g_small);
    kt_tokenizer_destroy(g_tok);
    kt_model_close(g_model);
    return kt_test_finish();
}
