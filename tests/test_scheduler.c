/*
 * test_scheduler.c - continuous batching on the tiny model: a job's greedy
 * tokens are the engine's own greedy tokens whatever else shares the batch
 * (long prompts prefilled in chunks beside decoding streams, n choices
 * forked from one prompt, prompts reusing cached prefixes); stop strings end
 * text exactly; cancelling frees the sequence; a full queue refuses; drain
 * finishes what runs; the request histograms all count the completed
 * requests; a poke runs its hook between two steps, or at once when idle;
 * a scored prompt (prompt_logprobs) gets the engine's own logprob of every
 * position, prefilled in chunks, never from the prefix cache.
 */
#include <math.h>
#include <stdatomic.h>
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

static struct kt_model *g_model;
static struct kt_tokenizer *g_tok;
static struct kt_engine *g_engine;
static struct kt_serve_model g_sm;
static struct kt_serve_metrics g_metrics;

#define N_CTX 512
#define MAX_RUNNING 4
#define CACHE_ENTRIES 4

static bool setup(void)
{
    const char *path = kt_test_path("sched-tiny.gguf");
    if (kt_test_system("%s --preset tiny -o %s >/dev/null 2>&1", kt_test_tool("kt-synth"), path) != 0) {
        KT_CHECK(false, "kt-synth failed");
        return false;
    }
    kt_err err = {0};
    struct kt_engine_params ep = {.n_ctx = N_CTX, .n_threads = 2,
                                  .max_seqs = kt_sched_engine_seqs(MAX_RUNNING, CACHE_ENTRIES),
                                  .kv_blocks = kt_sched_kv_blocks_needed(MAX_RUNNING, N_CTX, 16),
                                  .max_batch_tokens = 64};
    bool ok = kt_model_open(path, &g_model, &err) == KT_OK && kt_tokenizer_create(g_model->gguf, &g_tok, &err) == KT_OK &&
              kt_engine_create(g_model, &ep, &g_engine, &err) == KT_OK;
    unlink(path);
    KT_CHECK(ok, "setup: %s", err.msg);
    char why[256];
    g_sm = (struct kt_serve_model){.tok = g_tok, .format = kt_serve_chat_format(g_model->gguf, why, sizeof why),
                                   .n_ctx = N_CTX, .n_vocab = kt_engine_n_vocab(g_engine),
                                   .allow_forced_output = true};
    kt_serve_metrics_init(&g_metrics);
    return ok;
}

static struct kt_sched *start(uint32_t max_waiting, uint32_t budget, uint32_t cache_entries)
{
    struct kt_sched *s = NULL;
    kt_err err = {0};
    struct kt_sched_params p = {.engine = g_engine, .tok = g_tok, .max_running_seqs = MAX_RUNNING,
                                .max_waiting = max_waiting, .max_batch_tokens = budget,
                                .prefix_cache_entries = cache_entries, .metrics = &g_metrics};
    KT_CHECK(kt_sched_create(&p, &s, &err) == KT_OK, "%s", err.msg);
    return s;
}

/* A job from a JSON request body (completions unless it has messages). */
static struct kt_job *job_from(const char *body)
{
    return sched_job_from(&g_sm, body);
}

static void wait_done(struct kt_job *job)
{
    sched_wait_done(job, 60000);
}

/* The engine's greedy continuation of ids, alone in a fresh sequence. */
static size_t greedy_reference(const int32_t *ids, size_t n, int32_t *out, size_t max_out)
{
    kt_err err = {0};
    const uint32_t seq = MAX_RUNNING + CACHE_ENTRIES - 1; /* unused while no scheduler runs */
    uint32_t nv = kt_engine_n_vocab(g_engine);
    float *logits = kt_test_xmalloc(nv * sizeof *logits);
    KT_CHECK(kt_engine_seq_add(g_engine, seq, &err) == KT_OK, "%s", err.msg);
    struct kt_batch_token t;
    size_t produced = 0;
    for (size_t i = 0; i < n; i++) {
        t = (struct kt_batch_token){.token = ids[i], .seq = seq, .pos = (uint32_t)i, .want_logits = i + 1 == n};
        kt_engine_step(g_engine, &(struct kt_batch){1, &t}, i + 1 == n ? logits : NULL, &err);
    }
    for (uint32_t pos = (uint32_t)n; produced < max_out; pos++) {
        int32_t best = 0;
        for (uint32_t v = 1; v < nv; v++)
            if (logits[v] > logits[best])
                best = (int32_t)v;
        out[produced++] = best;
        if (kt_token_is_eog(g_tok, best) || produced == max_out)
            break;
        t = (struct kt_batch_token){.token = best, .seq = seq, .pos = pos, .want_logits = true};
        kt_engine_step(g_engine, &(struct kt_batch){1, &t}, logits, &err);
    }
    kt_engine_seq_remove(g_engine, seq, &err);
    free(logits);
    return produced;
}

static char *reference_text(const char *prompt, size_t max_tokens)
{
    int32_t *ids, out[256];
    size_t n;
    kt_err err = {0};
    kt_tokenize(g_tok, prompt, strlen(prompt), true, true, &ids, &n, &err);
    size_t k = greedy_reference(ids, n, out, max_tokens);
    free(ids);
    if (k && kt_token_is_eog(g_tok, out[k - 1]))
        k--;
    char *text;
    size_t len;
    kt_detokenize(g_tok, out, k, false, &text, &len, &err);
    return text;
}

static const char *const prompts[] = {
    "The river runs to the sea and",
    "Once upon a time in a land far away, there lived a king who",
    ("1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31 32 33 34 35 36 "
     "37 38 39 40 41 42 43 44 45 46 47 48 49 50 51 52 53 54 55 56 57 58 59 60"),
    "Hello",
    "Rivers and mountains, oceans and plains: the world is wide and",
    "A",
};
#define N_PROMPTS (sizeof prompts / sizeof prompts[0])

static void concurrent_greedy_jobs_match_the_engine_alone(void)
{
    char *expected[N_PROMPTS];
    for (size_t i = 0; i < N_PROMPTS; i++)
        expected[i] = reference_text(prompts[i], 24);
    struct kt_sched *s = start(16, 16, CACHE_ENTRIES); /* 16-token steps: long prompts take several */
    struct kt_job *jobs[N_PROMPTS];
    for (size_t i = 0; i < N_PROMPTS; i++) {
        char body[1024];
        snprintf(body, sizeof body, "{\"prompt\": \"%s\", \"max_tokens\": 24, \"temperature\": 0}", prompts[i]);
        jobs[i] = job_from(body);
        KT_CHECK(kt_sched_submit(s, jobs[i]) == KT_SUBMIT_OK, "submit %zu", i);
    }
    for (size_t i = 0; i < N_PROMPTS; i++) {
        wait_done(jobs[i]);
        KT_CHECK(strcmp(kt_buf_str(&jobs[i]->choices[0].text), expected[i]) == 0, "prompt %zu: '%s' vs '%s'", i,
                 kt_buf_str(&jobs[i]->choices[0].text), expected[i]);
        KT_CHECK(jobs[i]->choices[0].finish == KT_FINISH_LENGTH || jobs[i]->choices[0].finish == KT_FINISH_STOP,
                 "finish %d", jobs[i]->choices[0].finish);
        kt_job_release(jobs[i]);
        free(expected[i]);
    }
    kt_sched_destroy(s);
}

static void a_repeated_prompt_reuses_its_cached_prefix(void)
{
    struct kt_sched *s = start(4, 64, CACHE_ENTRIES);
    const char *body = "{\"prompt\": \"Rivers and mountains, oceans and plains: the world is wide and\", "
                       "\"max_tokens\": 8, \"temperature\": 0}";
    struct kt_job *a = job_from(body), *b = job_from(body);
    kt_sched_submit(s, a);
    wait_done(a);
    kt_sched_submit(s, b);
    wait_done(b);
    KT_CHECK(a->n_cached == 0, "first run found %u cached tokens", a->n_cached);
    KT_CHECK(b->n_cached == b->prompt.n_ids - 1, "second run: %u of %zu cached", b->n_cached, b->prompt.n_ids);
    KT_CHECK(strcmp(kt_buf_str(&a->choices[0].text), kt_buf_str(&b->choices[0].text)) == 0, "'%s' vs '%s'",
             kt_buf_str(&a->choices[0].text), kt_buf_str(&b->choices[0].text));
    kt_job_release(a), kt_job_release(b);
    kt_sched_destroy(s);
    struct kt_kv_cache_stats ks;
    kt_kv_cache_stats(kt_engine_kv_cache(g_engine), &ks);
    KT_CHECK(ks.n_seqs == 0 && ks.blocks_used == 0, "destroy left %u sequences, %u blocks", ks.n_seqs,
             ks.blocks_used);
}

/* A scored prompt (prompt_logprobs, max_tokens 0), prefilled in 16-token
 * chunks beside a decoding job: every position's logprob, rank and
 * alternatives are those of the engine's logits stepped one token at a time
 * (within 1e-5: what shares a batch moves them by an ulp); nothing is
 * generated; run again once its prompt is in the prefix cache, it takes
 * nothing from the cache and scores the same. */
static void a_scored_prompt_matches_the_engine_position_by_position(void)
{
    const char *prompt = prompts[2];
    int32_t *ids = NULL;
    size_t n = 0;
    kt_err err = {0};
    kt_tokenize(g_tok, prompt, strlen(prompt), true, true, &ids, &n, &err);
    const uint32_t nv = kt_engine_n_vocab(g_engine), seq = MAX_RUNNING + CACHE_ENTRIES - 1;
    float *ref = kt_test_xmalloc(n * nv * sizeof *ref); /* (n, V): row p after tokens 0..p */
    KT_CHECK(kt_engine_seq_add(g_engine, seq, &err) == KT_OK, "%s", err.msg);
    for (size_t i = 0; i < n; i++) {
        struct kt_batch_token t = {.token = ids[i], .seq = seq, .pos = (uint32_t)i, .want_logits = true};
        kt_engine_step(g_engine, &(struct kt_batch){1, &t}, ref + i * nv, &err);
    }
    kt_engine_seq_remove(g_engine, seq, &err);
    struct kt_sched *s = start(8, 16, CACHE_ENTRIES);
    char body[1024];
    snprintf(body, sizeof body, "{\"prompt\": \"%s\", \"max_tokens\": 0, \"prompt_logprobs\": 3, \"n\": 2}", prompt);
    struct kt_job *other = job_from("{\"prompt\": \"The river runs to the sea and\", \"max_tokens\": 40, "
                                    "\"temperature\": 0, \"ignore_eos\": true}");
    for (int run = 0; run < 2; run++) {
        struct kt_job *job = job_from(body);
        KT_CHECK(job && job->score_prompt && job->prompt_top == 3 && job->prompt.n_ids == n, "a scored job");
        if (!job)
            break;
        if (run == 0)
            kt_sched_submit(s, other);
        kt_sched_submit(s, job);
        wait_done(job);
        KT_CHECK(n > 32 && job->n_scored == n - 1, "run %d: %u of %zu positions scored", run, job->n_scored, n - 1);
        KT_CHECK(job->n_cached == 0, "run %d: %u tokens from the prefix cache", run, job->n_cached);
        for (uint32_t c = 0; c < 2; c++)
            KT_CHECK(job->choices[c].finish == KT_FINISH_LENGTH && job->choices[c].n_tokens == 0 &&
                         job->choices[c].text.len == 0,
                     "run %d choice %u: nothing generated, finish %d", run, c, job->choices[c].finish);
        size_t wrong = 0;
        for (size_t p = 1; p <= job->n_scored && p < n; p++) {
            struct kt_logprobs want;
            kt_logprobs_compute(ref + (p - 1) * nv, nv, ids[p], 3, &want, &err);
            uint32_t rank = 0;
            for (uint32_t v = 0; v < nv; v++)
                rank += ref[(p - 1) * nv + v] >= ref[(p - 1) * nv + (uint32_t)ids[p]];
            const struct kt_prompt_logprob *got = &job->prompt_lp[p];
            /* the engine's logits move by an ulp with what shares the batch: near-ties may swap */
            bool same = got->lp.token == ids[p] && fabsf(got->lp.logprob - want.logprob) <= 1e-5f &&
                        (got->rank > rank ? got->rank - rank : rank - got->rank) <= 2 && got->lp.n_top == 3;
            for (uint32_t k = 0; same && k < 3; k++)
                same = fabsf(got->lp.top[k].logprob - want.top[k].logprob) <= 1e-5f;
            if (!same && wrong < 3)
                printf("run %d position %zu: token %d/%d logprob %.9g/%.9g rank %u/%u\n", run, p, got->lp.token, ids[p],
                       got->lp.logprob, want.logprob, got->rank, rank);
            wrong += !same;
        }
        KT_CHECK(wrong == 0, "run %d: %zu of %zu positions differ from the engine stepped alone", run, wrong, n - 1);
        kt_job_release(job);
    }
    wait_done(other);
    KT_CHECK(other->choices[0].n_tokens == 40, "the decoding job beside it: %u tokens", other->choices[0].n_tokens);
    kt_job_release(other);
    kt_sched_destroy(s);
    free(ref);
    free(ids);
}

static void n_choices_fork_one_prompt(void)
{
    struct kt_sched *s = start(4, 64, 0);
    struct kt_job *job = job_from("{\"prompt\": \"The river runs to the sea and\", \"max_tokens\": 12, "
                                  "\"temperature\": 0, \"n\": 3}");
    char *expected = reference_text("The river runs to the sea and", 12);
    kt_sched_submit(s, job);
    wait_done(job);
    for (int c = 0; c < 3; c++)
        KT_CHECK(strcmp(kt_buf_str(&job->choices[c].text), expected) == 0, "choice %d: '%s'", c,
                 kt_buf_str(&job->choices[c].text));
    free(expected);
    kt_job_release(job);
    /* sampled choices with one seed differ from each other but repeat per seed */
    struct kt_job *x = job_from("{\"prompt\": \"Hello\", \"max_tokens\": 16, \"temperature\": 1.5, \"n\": 2, "
                                "\"seed\": 7}");
    struct kt_job *y = job_from("{\"prompt\": \"Hello\", \"max_tokens\": 16, \"temperature\": 1.5, \"n\": 2, "
                                "\"seed\": 7}");
    kt_sched_submit(s, x);
    kt_sched_submit(s, y);
    wait_done(x), wait_done(y);
    KT_CHECK(strcmp(kt_buf_str(&x->choices[1].text), kt_buf_str(&y->choices[1].text)) == 0, "seeded choices differ");
    KT_CHECK(strcmp(kt_buf_str(&x->choices[0].text), kt_buf_str(&x->choices[1].text)) != 0,
             "two choices sampled the same 16 tokens");
    kt_job_release(x), kt_job_release(y);
    kt_sched_destroy(s);
}

static void stop_strings_end_the_text_exactly(void)
{
    char *full = reference_text("Once upon a time in a land far away, there lived a king who", 24);
    size_t len = strlen(full);
    KT_CHECK(len > 8, "reference too short: '%s'", full);
    if (len <= 8) {
        free(full);
        return;
    }
    /* a stop of about 4 bytes from the middle, cut at character boundaries */
    size_t i = len / 2, j;
    while (i < len && (full[i] & 0xC0) == 0x80)
        i++;
    j = i + 4 < len ? i + 4 : len;
    while (j < len && (full[j] & 0xC0) == 0x80)
        j++;
    char stop[16] = {0};
    memcpy(stop, full + i, j - i < 15 ? j - i : 15);
    struct kt_buf want = {0};
    kt_buf_append(&want, full, (size_t)(strstr(full, stop) - full));
    struct kt_sched *s = start(4, 64, 0);
    struct kt_buf body = {0};
    json_t *js = json_string(stop);
    char *stop_json = json_dumps(js, JSON_ENCODE_ANY);
    kt_buf_printf(&body, "{\"prompt\": \"Once upon a time in a land far away, there lived a king who\", "
                         "\"max_tokens\": 24, \"temperature\": 0, \"stop\": [\"zzzz\", %s]}", stop_json);
    struct kt_job *job = job_from(kt_buf_str(&body));
    if (!job) {
        kt_sched_destroy(s);
        return;
    }
    kt_sched_submit(s, job);
    wait_done(job);
    KT_CHECK(strcmp(kt_buf_str(&job->choices[0].text), kt_buf_str(&want)) == 0, "'%s' vs '%s'",
             kt_buf_str(&job->choices[0].text), kt_buf_str(&want));
    KT_CHECK(job->choices[0].finish == KT_FINISH_STOP && job->choices[0].stop_index == 1, "finish %d stop %d",
             job->choices[0].finish, job->choices[0].stop_index);
    kt_job_release(job);
    kt_sched_destroy(s);
    free(stop_json), json_decref(js), kt_buf_free(&body), kt_buf_free(&want), free(full);
}

static void cancel_frees_the_sequence_and_full_queue_refuses(void)
{
    struct kt_sched *s = start(1, 64, 0);
    struct kt_job *jobs[MAX_RUNNING + 2];
    for (int i = 0; i < MAX_RUNNING + 2; i++)
        jobs[i] = job_from("{\"prompt\": \"Hello\", \"max_tokens\": 400, \"ignore_eos\": true}");
    /* one at a time (the queue holds one): all four run, then one more queues and the next is refused */
    for (int i = 0; i < MAX_RUNNING; i++) {
        KT_CHECK(kt_sched_submit(s, jobs[i]) == KT_SUBMIT_OK, "submit %d", i);
        for (int tries = 0; tries < 5000; tries++) {
            pthread_mutex_lock(&jobs[i]->mu);
            bool started = jobs[i]->started;
            pthread_mutex_unlock(&jobs[i]->mu);
            if (started)
                break;
            usleep(1000);
        }
    }
    KT_CHECK(kt_sched_submit(s, jobs[MAX_RUNNING]) == KT_SUBMIT_OK, "the queue's one place");
    KT_CHECK(kt_sched_submit(s, jobs[MAX_RUNNING + 1]) == KT_SUBMIT_FULL, "a full queue refuses");
    for (int i = 0; i <= MAX_RUNNING; i++)
        kt_job_cancel(jobs[i]);
    for (int i = 0; i <= MAX_RUNNING; i++) {
        wait_done(jobs[i]);
        KT_CHECK(jobs[i]->choices[0].finish == KT_FINISH_CANCELLED, "job %d finish %d", i, jobs[i]->choices[0].finish);
        KT_CHECK(jobs[i]->choices[0].n_tokens < 400, "job %d ran to the end", i);
    }
    kt_sched_drain(s, 1.0);
    struct kt_kv_cache_stats ks;
    kt_kv_cache_stats(kt_engine_kv_cache(g_engine), &ks);
    KT_CHECK(ks.n_seqs == 0 && ks.blocks_used == 0, "cancelled jobs left %u sequences, %u blocks", ks.n_seqs,
             ks.blocks_used);
    for (int i = 0; i < MAX_RUNNING + 2; i++)
        kt_job_release(jobs[i]);
    kt_sched_destroy(s);
}

static void drain_finishes_running_jobs_then_refuses(void)
{
    struct kt_sched *s = start(4, 64, CACHE_ENTRIES);
    struct kt_job *job = job_from("{\"prompt\": \"Hello\", \"max_tokens\": 10, \"ignore_eos\": true}");
    struct kt_job *late = job_from("{\"prompt\": \"Hello\", \"max_tokens\": 10}");
    kt_sched_submit(s, job);
    kt_sched_drain(s, 30.0);
    KT_CHECK(job->done && job->choices[0].finish == KT_FINISH_LENGTH && job->choices[0].n_tokens == 10,
             "drained job: done %d finish %d tokens %u", job->done, job->choices[0].finish, job->choices[0].n_tokens);
    KT_CHECK(kt_sched_submit(s, late) == KT_SUBMIT_STOPPING, "a draining scheduler refuses");
    kt_job_release(job), kt_job_release(late);
    kt_sched_destroy(s);
}

static bool has_token(struct kt_job *job)
{
    pthread_mutex_lock(&job->mu);
    bool yes = job->choices[0].n_tokens > 0;
    pthread_mutex_unlock(&job->mu);
    return yes;
}

/* The request histograms count one population - the requests that completed
 * - whether the others were aborted in the queue or after their first token
 * (TTFT and queue time used to leave the first out and count the second,
 * while end-to-end latency counted both). */
static void request_histograms_count_the_same_requests(void)
{
    kt_serve_metrics_destroy(&g_metrics);
    kt_serve_metrics_init(&g_metrics);
    struct kt_sched *s = start(4, 64, 0);
    struct kt_job *done = job_from("{\"prompt\": \"Hello\", \"max_tokens\": 3, \"ignore_eos\": true}");
    KT_CHECK(kt_sched_submit(s, done) == KT_SUBMIT_OK, "submit");
    wait_done(done);
    struct kt_job *running[MAX_RUNNING], *queued = job_from("{\"prompt\": \"Hello\", \"max_tokens\": 400}");
    for (int i = 0; i < MAX_RUNNING; i++) {
        running[i] = job_from("{\"prompt\": \"Hello\", \"max_tokens\": 400, \"ignore_eos\": true}");
        KT_CHECK(kt_sched_submit(s, running[i]) == KT_SUBMIT_OK, "submit %d", i);
    }
    for (int i = 0; i < MAX_RUNNING; i++) {
        uint64_t seen = 0;
        for (int tries = 0; tries < 3000 && !has_token(running[i]); tries++)
            kt_job_wait(running[i], &seen, 10);
        KT_CHECK(has_token(running[i]), "job %d made no token", i);
    }
    KT_CHECK(kt_sched_submit(s, queued) == KT_SUBMIT_OK, "submit behind a full batch");
    kt_job_cancel(queued);
    wait_done(queued);
    KT_CHECK(!queued->started, "the queued job ran");
    for (int i = 0; i < MAX_RUNNING; i++)
        kt_job_cancel(running[i]);
    for (int i = 0; i < MAX_RUNNING; i++)
        wait_done(running[i]);
    kt_sched_drain(s, 1.0);
    struct kt_serve_metrics *m = &g_metrics;
    pthread_mutex_lock(&m->mu);
    uint64_t completed = m->request_success[KT_METRIC_STOP] + m->request_success[KT_METRIC_LENGTH];
    KT_CHECK(completed == 1 && m->request_success[KT_METRIC_ABORT] == MAX_RUNNING + 1, "completed %llu, aborted %llu",
             (unsigned long long)completed, (unsigned long long)m->request_success[KT_METRIC_ABORT]);
    KT_CHECK(m->ttft.count == completed && m->queue_time.count == completed && m->e2e.count == completed &&
                 m->prompt_len.count == completed && m->generation_len.count == completed,
             "observations: ttft %llu, queue %llu, e2e %llu, prompt %llu, generation %llu; %llu completed",
             (unsigned long long)m->ttft.count, (unsigned long long)m->queue_time.count,
             (unsigned long long)m->e2e.count, (unsigned long long)m->prompt_len.count,
             (unsigned long long)m->generation_len.count, (unsigned long long)completed);
    KT_CHECK(m->generation_len.sum == 3 && m->ttft.sum <= m->e2e.sum && m->queue_time.sum <= m->ttft.sum,
             "the completed job: %g tokens, queue %g <= ttft %g <= e2e %g s", m->generation_len.sum,
             m->queue_time.sum, m->ttft.sum, m->e2e.sum);
    pthread_mutex_unlock(&m->mu);
    for (int i = 0; i < MAX_RUNNING; i++)
        kt_job_release(running[i]);
    kt_job_release(queued), kt_job_release(done);
    kt_sched_destroy(s);
}

static void forced_output_and_chat_stop_at_the_end_token(void)
{
    struct kt_sched *s = start(4, 64, 0);
    struct kt_job *job = job_from("{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], "
                                  "\"kt_test_forced_output\": \"<think>plan</think>Hi there<|im_end|>ignored\"}");
    kt_sched_submit(s, job);
    wait_done(job);
    KT_CHECK(strcmp(kt_buf_str(&job->choices[0].text), "<think>plan</think>Hi there") == 0, "'%s'",
             kt_buf_str(&job->choices[0].text));
    KT_CHECK(job->choices[0].finish == KT_FINISH_STOP && job->choices[0].stop_token >= 0, "finish %d",
             job->choices[0].finish);
    kt_job_release(job);
    kt_sched_destroy(s);
}

static uint32_t tokens_of(struct kt_job *job)
{
    pthread_mutex_lock(&job->mu);
    uint32_t n = job->choices[0].n_tokens;
    pthread_mutex_unlock(&job->mu);
    return n;
}

/* A long prompt is prefilled 16 tokens a step beside a decoding stream: the
 * stream gets a token every one of those steps. */
static void a_long_prefill_does_not_stall_running_streams(void)
{
    struct kt_sched *s = start(4, 16, 0);
    struct kt_job *a = job_from("{\"prompt\": \"Hello\", \"max_tokens\": 400, \"ignore_eos\": true}");
    struct kt_buf body = {0};
    kt_buf_puts(&body, "{\"prompt\": \"");
    for (int i = 0; i < 60; i++) /* ~300 tokens */
        kt_buf_puts(&body, "river stone ");
    kt_buf_puts(&body, "\", \"max_tokens\": 1}");
    struct kt_job *b = job_from(kt_buf_str(&body));
    kt_sched_submit(s, a);
    while (tokens_of(a) < 2)
        usleep(1000);
    uint32_t before = tokens_of(a);
    kt_sched_submit(s, b);
    wait_done(b);
    uint32_t during = tokens_of(a) - before, steps = (uint32_t)(b->prompt.n_ids / 15);
    KT_CHECK(during + 2 >= steps, "a %zu-token prefill took ~%u steps, the stream got only %u tokens",
             b->prompt.n_ids, steps, during);
    kt_job_cancel(a);
    wait_done(a);
    kt_job_release(a), kt_job_release(b);
    kt_buf_free(&body);
    kt_sched_destroy(s);
}

/* kt_sched_poke: an idle scheduler calls the poked hook at once; a busy one
 * right after a step (after_step has run for it), never during one. */
struct poke_log {
    _Atomic uint32_t steps, pokes, pokes_after_a_step;
    _Atomic bool in_step_hook;
};

static void poke_after_step(void *ctx, const struct kt_engine *e)
{
    (void)e;
    struct poke_log *l = ctx;
    atomic_fetch_add(&l->steps, 1);
}

static void poke_hook(void *ctx)
{
    struct poke_log *l = ctx;
    atomic_fetch_add(&l->pokes, 1);
    if (atomic_load(&l->steps) > 0)
        atomic_fetch_add(&l->pokes_after_a_step, 1);
}

static bool wait_for(_Atomic uint32_t *v, uint32_t want)
{
    for (int i = 0; i < 3000 && atomic_load(v) < want; i++)
        usleep(1000);
    return atomic_load(v) >= want;
}

static void a_poke_runs_its_hook_between_steps_or_at_once_when_idle(void)
{
    struct poke_log l = {0};
    struct kt_sched *s = NULL;
    kt_err err = {0};
    struct kt_sched_params p = {.engine = g_engine, .tok = g_tok, .max_running_seqs = MAX_RUNNING, .max_waiting = 4,
                                .max_batch_tokens = 64, .metrics = &g_metrics, .after_step = poke_after_step,
                                .poked = poke_hook, .after_step_ctx = &l};
    const bool created = kt_sched_create(&p, &s, &err) == KT_OK;
    KT_CHECK(created, "%s", err.msg);
    if (!created)
        return;
    kt_sched_poke(s);
    KT_CHECK(wait_for(&l.pokes, 1) && atomic_load(&l.steps) == 0, "idle: poked %u times, %u steps",
             atomic_load(&l.pokes), atomic_load(&l.steps));
    usleep(20000);
    KT_CHECK(atomic_load(&l.pokes) == 1, "one poke, one call: %u", atomic_load(&l.pokes));

    struct kt_job *job = job_from("{\"prompt\": \"Hello\", \"max_tokens\": 40, \"ignore_eos\": true}");
    kt_sched_submit(s, job);
    KT_CHECK(wait_for(&l.steps, 2), "the job did not step");
    kt_sched_poke(s);
    KT_CHECK(wait_for(&l.pokes, 2) && atomic_load(&l.pokes_after_a_step) == 1, "busy: poked %u times (%u after a step)",
             atomic_load(&l.pokes), atomic_load(&l.pokes_after_a_step));
    wait_done(job);
    kt_job_release(job);
    kt_sched_destroy(s);
    KT_CHECK(atomic_load(&l.pokes) == 2, "two pokes, two calls: %u", atomic_load(&l.pokes));
}

int main(void)
{
    if (!setup())
        return kt_test_finish();
    KT_RUN(a_long_prefill_does_not_stall_running_streams);
    KT_RUN(concurrent_greedy_jobs_match_the_engine_alone);
    KT_RUN(a_repeated_prompt_reuses_its_cached_prefix);
    KT_RUN(a_scored_prompt_matches_the_engine_position_by_position);
    KT_RUN(n_choices_fork_one_prompt);
    KT_RUN(stop_strings_end_the_text_exactly);
    KT_RUN(cancel_frees_the_sequence_and_full_queue_refuses);
    KT_RUN(drain_finishes_running_jobs_then_refuses);
    KT_RUN(forced_output_and_chat_stop_at_the_end_token);
    KT_RUN(request_histograms_count_the_same_requests);
    KT_RUN(a_poke_runs_its_hook_between_steps_or_at_once_when_idle);
    kt_engine_destroy(g_engine);
    kt_tokenizer_destroy(g_tok);
    kt_model_close(g_model);
    kt_serve_metrics_destroy(&g_metrics);
    return kt_test_finish();
}
