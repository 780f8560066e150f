/*
 * test_long_context.c - a long context on kt-synth's tiny model (Kimi-K2
 * layout, 131072 positions of training context; one layer here, dense, to
 * keep it in CI time: attention is what is under test): a 16384-position sequence prefilled in
 * chunks of 512 tokens and then decoded, against the same sequence run as one
 * unchunked step, both with the default BF16 KV cache.
 *
 * What it proves:
 *  - chunked prefill over a long context gives, at the last prefill
 *    position, the bits of the unchunked step: both run the expanded form
 *    over the same key blocks (attention.c streams every context in blocks of
 *    KT_ATTN_EXPAND_ROWS rows with an online softmax, so a query's result
 *    depends on its keys only, not on the chunk around it);
 *  - decode steps at depth 16K (the absorbed form, flash-style over the
 *    cache's BF16 rows) give the unchunked step's logits within 1e-4 of the
 *    row's largest logit (absorbed vs expanded: the same math in another
 *    summation order, test_forward's tolerance) and the same greedy token;
 *  - nothing in the engine grows with the context but the cache and the row
 *    table: an engine at 16K positions is created and runs with the same
 *    per-thread attention scratch as at 64.
 * Under AddressSanitizer it runs 4096 positions (the same code paths, ~10x
 * slower per position); KT_LONG_CONTEXT_TOKENS=N sets another length (up to
 * the model's 131072) for a manual run.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "model.h"
#include "testlib.h"

#if defined(__SANITIZE_ADDRESS__)
#define LONG_TOKENS 4096u
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define LONG_TOKENS 4096u
#endif
#endif
#ifndef LONG_TOKENS
#define LONG_TOKENS 16384u
#endif

#define CHUNK 512u   /* prefill tokens per step */
#define DECODE 4u    /* decode steps at the end, one token each */

static uint32_t long_tokens(void)
{
    const char *s = getenv("KT_LONG_CONTEXT_TOKENS");
    const long n = s ? strtol(s, NULL, 10) : 0;
    return n >= (long)(2 * DECODE) && n <= 131072 ? (uint32_t)n : LONG_TOKENS;
}

static int32_t argmax(const float *x, uint32_t n)
{
    int32_t best = 0;
    for (uint32_t v = 1; v < n; v++)
        best = x[v] > x[best] ? (int32_t)v : best;
    return best;
}

static struct kt_engine *long_engine(struct kt_model *m, uint32_t n_ctx, uint32_t batch)
{
    struct kt_engine_params p = {.n_ctx = n_ctx, .max_seqs = 1, .n_threads = 2, .max_batch_tokens = batch,
                                 .kv_type = KT_ROW_BF16};
    struct kt_engine *e = NULL;
    kt_err err = {0};
    KT_CHECK(kt_engine_create(m, &p, &e, &err) == KT_OK, "engine at %u positions, %u per step: %s", n_ctx, batch,
             err.msg);
    return e;
}

/* Logits of positions L-DECODE-1 .. L-1 (DECODE + 1 rows): tokens [0, L -
 * DECODE) prefilled CHUNK at a time, then DECODE single-token steps. */
static float *chunked_then_decoded(struct kt_model *m, const int32_t *toks, uint32_t L, uint32_t *steps)
{
    struct kt_engine *e = long_engine(m, L, CHUNK);
    if (!e)
        return NULL;
    const uint32_t V = kt_engine_n_vocab(e), n_pre = L - DECODE;
    float *logits = kt_test_xmalloc((size_t)(DECODE + 1) * V * sizeof *logits);
    struct kt_batch_token *bt = kt_test_xmalloc(CHUNK * sizeof *bt);
    kt_err err = {0};
    bool ok = kt_engine_seq_add(e, 0, &err) == KT_OK;
    for (uint32_t p0 = 0; ok && p0 < n_pre; p0 += CHUNK) {
        const uint32_t n = n_pre - p0 < CHUNK ? n_pre - p0 : CHUNK;
        for (uint32_t i = 0; i < n; i++)
            bt[i] = (struct kt_batch_token){toks[p0 + i], 0, p0 + i, p0 + i == n_pre - 1};
        ok = kt_engine_step(e, &(struct kt_batch){n, bt}, logits, &err) == KT_OK;
    }
    for (uint32_t i = 0; ok && i < DECODE; i++) {
        const struct kt_batch_token one = {toks[n_pre + i], 0, n_pre + i, true};
        ok = kt_engine_step(e, &(struct kt_batch){1, &one}, logits + (size_t)(i + 1) * V, &err) == KT_OK;
    }
    KT_CHECK(ok, "chunked run: %s", err.msg);
    struct kt_engine_stats st;
    kt_engine_stats(e, &st);
    *steps = (uint32_t)st.steps;
    KT_CHECK(kt_engine_seq_length(e, 0) == L, "sequence length %u, expected %u", kt_engine_seq_length(e, 0), L);
    struct kt_kv_cache_stats ks;
    kt_kv_cache_stats(kt_engine_kv_cache(e), &ks);
    KT_CHECK(ks.bytes_per_token == (uint64_t)m->hp.n_layer * (m->hp.kv_lora_rank + m->hp.qk_rope_dim) * 2,
             "BF16 cache: %llu bytes per token", (unsigned long long)ks.bytes_per_token);
    free(bt);
    kt_engine_destroy(e);
    if (!ok) {
        free(logits);
        return NULL;
    }
    return logits;
}

/* The same positions' logits from one step of all L tokens. */
static float *unchunked(struct kt_model *m, const int32_t *toks, uint32_t L)
{
    struct kt_engine *e = long_engine(m, L, L);
    if (!e)
        return NULL;
    const uint32_t V = kt_engine_n_vocab(e);
    float *logits = kt_test_xmalloc((size_t)(DECODE + 1) * V * sizeof *logits);
    struct kt_batch_token *bt = kt_test_xmalloc((size_t)L * sizeof *bt);
    for (uint32_t i = 0; i < L; i++)
        bt[i] = (struct kt_batch_token){toks[i], 0, i, i >= L - DECODE - 1};
    kt_err err = {0};
    const bool ok = kt_engine_seq_add(e, 0, &err) == KT_OK &&
                    kt_engine_step(e, &(struct kt_batch){L, bt}, logits, &err) == KT_OK;
    KT_CHECK(ok, "unchunked run: %s", err.msg);
    free(bt);
    kt_engine_destroy(e);
    if (!ok) {
        free(logits);
        return NULL;
    }
    return logits;
}

static void chunked_long_prefill_and_decode_match_one_unchunked_step(void)
{
    char path[1024];
    struct kt_model *m = kt_test_synth_model("tiny", "--layers 1", path, sizeof path);
    if (!m)
        return;
    const uint32_t L = long_tokens(), V = m->hp.n_vocab;
    KT_CHECK(m->hp.n_ctx_train >= L, "tiny's context %u < %u", m->hp.n_ctx_train, L);
    int32_t *toks = kt_test_xmalloc((size_t)L * sizeof *toks);
    uint64_t s = 0x9e3779b97f4a7c15ull;
    for (uint32_t i = 0; i < L; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        toks[i] = (int32_t)(s % V);
    }
    uint32_t steps = 0;
    float *a = chunked_then_decoded(m, toks, L, &steps);
    float *b = unchunked(m, toks, L);
    if (a && b) {
        const uint32_t want_steps = (L - DECODE + CHUNK - 1) / CHUNK + DECODE;
        KT_CHECK(steps == want_steps, "%u steps, expected %u chunks of %u and %u decode steps", steps, want_steps - DECODE,
                 CHUNK, DECODE);
        KT_CHECK(!memcmp(a, b, (size_t)V * sizeof *a),
                 "position %u after chunked prefill: not the unchunked step's bits (worst diff %.3g)", L - DECODE - 1,
                 kt_test_worst_row_diff(b, a, 1, V));
        const double d = kt_test_worst_row_diff(b + V, a + V, DECODE, V);
        printf("  %u positions, chunks of %u: decode at depth %u..%u within %.3g of the unchunked step\n", L, CHUNK,
               L - DECODE, L - 1, d);
        KT_CHECK(d <= 1e-4, "decode at depth %u: %.3g of the largest logit off the unchunked step", L - DECODE, d);
        for (uint32_t i = 0; i <= DECODE; i++)
            KT_CHECK(argmax(a + (size_t)i * V, V) == argmax(b + (size_t)i * V, V), "greedy token at position %u",
                     L - DECODE - 1 + i);
    }
    free(a);
    free(b);
    free(toks);
    kt_test_synth_remove(m, path);
}

/* Attention's per-thread scratch does not grow with the context: what an
 * engine allocates beyond the KV cache at 16K positions is what it takes
 * at 64 plus the row table (one pointer per position per thread) and the
 * per-position step tables. */
static void attention_scratch_does_not_grow_with_the_context(void)
{
    char path[1024];
    struct kt_model *m = kt_test_synth_model("tiny", "--layers 1", path, sizeof path);
    if (!m)
        return;
    struct kt_engine *small = long_engine(m, 64, CHUNK), *large = long_engine(m, LONG_TOKENS, CHUNK);
    if (small && large) {
        const uint64_t a = kt_engine_scratch_bytes(small), b = kt_engine_scratch_bytes(large);
        /* per position: a row pointer per thread (2), one block id per 16 positions */
        const uint64_t allowed = (uint64_t)(LONG_TOKENS - 64) * (2 * sizeof(void *) + sizeof(uint32_t)) + (64u << 10);
        printf("  engine buffers: %llu bytes at 64 positions, %llu at %u\n", (unsigned long long)a,
               (unsigned long long)b, LONG_TOKENS);
        KT_CHECK(b <= a + allowed, "buffers grew by %llu bytes from 64 to %u positions (allowed %llu)",
                 (unsigned long long)(b - a), LONG_TOKENS, (unsigned long long)allowed);
    }
    kt_engine_destroy(small);
    kt_engine_destroy(large);
    kt_test_synth_remove(m, path);
}

int main(void)
{
    KT_RUN(chunked_long_prefill_and_decode_match_one_unchunked_step);
    KT_RUN(attention_scratch_does_not_grow_with_the_context);
    return kt_test_finish();
}
