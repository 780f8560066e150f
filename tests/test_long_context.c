/*
 * test_long_context.c - the model's whole context, 131072 positions, on
 * kt-synth's tiny-long (tiny's Kimi-K2 layout and semantics, YaRN RoPE,
 * 131072 positions of training context, with the smallest attention: 2
 * heads, kv rank 32, nope 8, rope 8, v 8; one layer here, dense: attention
 * is what is under test), prefilled in chunks of 512 tokens and decoded, with
 * the default BF16 KV cache.
 *
 * What it proves:
 *  - at the full 131072 positions, the last prefill position and 4 decode
 *    steps at depth 131068..131071 (the expanded form, then the absorbed
 *    form over 2048 key blocks of the cache's BF16 rows) give the logits of
 *    tests/reference_forward.c (ref_forward_last: double, every cache row
 *    rounded to BF16 as the cache stores it) within 1e-4 of the row's
 *    largest logit, and the same greedy token;
 *  - chunked prefill gives, at the last prefill position, the bits of one
 *    unchunked step: both run the expanded form over the same key blocks
 *    (attention.c streams every context in blocks of KT_ATTN_EXPAND_ROWS rows
 *    with an online softmax, so a query's result depends on its keys only,
 *    not on the chunk around it); decode after it within 1e-4 of the
 *    unchunked step's logits (absorbed vs expanded: the same math in another
 *    summation order, test_forward's tolerance), the same greedy token;
 *  - nothing in the engine grows with the context but the cache and the row
 *    table: an engine at 131072 positions is created and runs with the same
 *    per-thread attention scratch as at 64.
 *
 * Why the unchunked comparison runs at 16384 positions, not 131072: the
 * engine's attention costs up to ~13 ns of CPU per (query, key, head) on this
 * layer whatever the dims (exp, the running max and the per-row calls dominate
 * at 16-wide keys), and a 131072-token prefill has 8.6e9 such pairs per head:
 * the chunked run is most of this test's time, an unchunked one would
 * double it.  The bit-identity it checks is a property of the chunking
 * (which keys a query sees, in which blocks), not of the depth, and
 * everything that does depend on the depth (RoPE at large positions, block
 * tables, 2048 key blocks of online softmax, the decode's absorbed form
 * deep in the cache) is held at 131072 against the reference, which is
 * independent of the engine and, for one layer, linear in the context: a
 * position reaches a later one's logits only through its key and value,
 * which depend on its token alone.
 *
 * Under AddressSanitizer the full-context case runs 16384 positions and the
 * unchunked one 4096 (the same code paths, ~10x slower per position);
 * KT_LONG_CONTEXT_TOKENS=N sets the full-context case's length (up to the
 * model's 131072) for a manual run.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine.h"
#include "model.h"
#include "quant.h"
#include "reference_forward.h"
#include "testlib.h"

#if defined(__SANITIZE_ADDRESS__)
#define KT_LONG_CONTEXT_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KT_LONG_CONTEXT_ASAN 1
#endif
#endif
#ifdef KT_LONG_CONTEXT_ASAN
#define LONG_TOKENS 16384u    /* the full-context case */
#define UNCHUNKED_TOKENS 4096u /* chunked against one unchunked step */
#else
#define LONG_TOKENS 131072u
#define UNCHUNKED_TOKENS 16384u
#endif

#define CHUNK 512u   /* prefill tokens per step */
#define DECODE 4u    /* decode steps at the end, one token each */
#define TOLERANCE 1e-4 /* of the row's largest logit */

static uint32_t long_tokens(void)
{
    const char *s = getenv("KT_LONG_CONTEXT_TOKENS");
    const long n = s ? strtol(s, NULL, 10) : 0;
    return n >= (long)(2 * DECODE) && n <= 131072 ? (uint32_t)n : LONG_TOKENS;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int32_t argmax(const float *x, uint32_t n)
{
    int32_t best = 0;
    for (uint32_t v = 1; v < n; v++)
        best = x[v] > x[best] ? (int32_t)v : best;
    return best;
}

static int32_t argmax_d(const double *x, uint32_t n)
{
    int32_t best = 0;
    for (uint32_t v = 1; v < n; v++)
        best = x[v] > x[best] ? (int32_t)v : best;
    return best;
}

static struct kt_model *long_model(char *path, size_t path_size)
{
    return kt_test_synth_model("tiny-long", "--layers 1", path, path_size);
}

/* L tokens drawn from the vocabulary, the same sequence every run. */
static int32_t *long_tokens_of(uint32_t L, uint32_t V)
{
    int32_t *toks = kt_test_xmalloc((size_t)L * sizeof *toks);
    uint64_t s = 0x9e3779b97f4a7c15ull;
    for (uint32_t i = 0; i < L; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        toks[i] = (int32_t)(s % V);
    }
    return toks;
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
static float *chunked_then_decoded(struct kt_model *m, const int32_t *toks, uint32_t L)
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
    KT_CHECK(ok, "chunked run of %u positions: %s", L, err.msg);
    struct kt_engine_stats st;
    kt_engine_stats(e, &st);
    const uint32_t want_steps = (n_pre + CHUNK - 1) / CHUNK + DECODE;
    KT_CHECK(st.steps == want_steps, "%llu steps, expected %u chunks of %u and %u decode steps",
             (unsigned long long)st.steps, want_steps - DECODE, CHUNK, DECODE);
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

/* The worst row's max |got - want| over max |want|. */
static double worst_diff_d(const float *got, const double *want, uint32_t rows, uint32_t V)
{
    double worst = 0.0;
    for (uint32_t r = 0; r < rows; r++) {
        double d = 0.0, big = 0.0;
        for (uint32_t v = 0; v < V; v++) {
            const double x = want[(size_t)r * V + v], diff = fabs(got[(size_t)r * V + v] - x);
            d = diff > d || isnan(diff) ? diff : d;
            big = fabs(x) > big ? fabs(x) : big;
        }
        worst = d / big > worst || isnan(d) ? d / big : worst;
    }
    return worst;
}

static void full_context_prefill_and_decode_match_the_reference(void)
{
    char path[1024];
    struct kt_model *m = long_model(path, sizeof path);
    if (!m)
        return;
    const uint32_t L = long_tokens(), V = m->hp.n_vocab;
    KT_CHECK(m->hp.n_ctx_train >= L, "tiny-long's context %u < %u", m->hp.n_ctx_train, L);
    int32_t *toks = long_tokens_of(L, V);
    double t0 = now_s();
    float *got = chunked_then_decoded(m, toks, L);
    const double engine_s = now_s() - t0;
    t0 = now_s();
    double *want = ref_forward_last(m, toks, L, DECODE + 1, KT_TYPE_BF16);
    const double ref_s = now_s() - t0;
    KT_CHECK(want != NULL, "no reference for the last %u positions", DECODE + 1);
    if (got && want) {
        const double d_pre = worst_diff_d(got, want, 1, V), d_dec = worst_diff_d(got + V, want + V, DECODE, V);
        printf("  %u positions (chunks of %u, %.1f s; reference %.1f s): last prefill position within %.3g of the "
               "reference, decode at depth %u..%u within %.3g\n",
               L, CHUNK, engine_s, ref_s, d_pre, L - DECODE, L - 1, d_dec);
        KT_CHECK(d_pre <= TOLERANCE, "position %u after chunked prefill: %.3g of the largest logit off the reference",
                 L - DECODE - 1, d_pre);
        KT_CHECK(d_dec <= TOLERANCE, "decode at depth %u: %.3g of the largest logit off the reference", L - DECODE,
                 d_dec);
        for (uint32_t i = 0; i <= DECODE; i++)
            KT_CHECK(argmax(got + (size_t)i * V, V) == argmax_d(want + (size_t)i * V, V),
                     "greedy token at position %u", L - DECODE - 1 + i);
    }
    free(got);
    free(want);
    free(toks);
    kt_test_synth_remove(m, path);
}

static void chunked_prefill_gives_the_unchunked_step_s_bits(void)
{
    char path[1024];
    struct kt_model *m = long_model(path, sizeof path);
    if (!m)
        return;
    const uint32_t L = UNCHUNKED_TOKENS, V = m->hp.n_vocab;
    int32_t *toks = long_tokens_of(L, V);
    float *a = chunked_then_decoded(m, toks, L);
    float *b = unchunked(m, toks, L);
    if (a && b) {
        KT_CHECK(!memcmp(a, b, (size_t)V * sizeof *a),
                 "position %u after chunked prefill: not the unchunked step's bits (worst diff %.3g)", L - DECODE - 1,
                 kt_test_worst_row_diff(b, a, 1, V));
        const double d = kt_test_worst_row_diff(b + V, a + V, DECODE, V);
        printf("  %u positions, chunks of %u: decode at depth %u..%u within %.3g of the unchunked step\n", L, CHUNK,
               L - DECODE, L - 1, d);
        KT_CHECK(d <= TOLERANCE, "decode at depth %u: %.3g of the largest logit off the unchunked step", L - DECODE, d);
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
 * engine allocates beyond the KV cache at LONG_TOKENS positions is what it
 * takes at 64 plus the row table (one pointer per position per thread) and
 * the per-position step tables. */
static void attention_scratch_does_not_grow_with_the_context(void)
{
    char path[1024];
    struct kt_model *m = long_model(path, sizeof path);
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
    KT_RUN(full_context_prefill_and_decode_match_the_reference);
    KT_RUN(chunked_prefill_gives_the_unchunked_step_s_bits);
    KT_RUN(attention_scratch_does_not_grow_with_the_context);
    return kt_test_finish();
}
