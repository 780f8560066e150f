/*
 * grammar.c - kt-bench grammar: what constrained decoding (grammar.h) costs
 * per generated token.  A vocabulary - the model's tokenizer with -m, else a
 * synthetic one of --vocab tokens shaped like a large byte-level BPE
 * vocabulary (English words with and without a leading space, code and JSON
 * punctuation runs, numbers of 1-3 digits, whitespace and indentation runs,
 * CJK and Cyrillic words, stray UTF-8 fragments, 256 special tokens at the
 * end as Kimi-K2 has them) - is indexed once, a realistic extraction schema
 * compiled, and a pretty-printed document valid under it generated token by
 * token: each step computes the mask (timed) and takes the longest allowed
 * token that continues the document, so every state a real generation passes
 * through (keys, strings, numbers, enums, nesting) is measured.  Reports the
 * vocabulary index's build time, the compile time, and the mask time per
 * token: mean, median, 99th percentile and worst, inside strings and
 * elsewhere.
 */
#include <jansson.h>
#include <time.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "grammar.h"
#include "json_schema.h"
#include "tokenizer.h"

/* ---- a synthetic vocabulary ---------------------------------------------------------- */

static uint64_t next(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static size_t put_utf8(char *p, uint32_t cp)
{
    if (cp < 0x80) {
        p[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        p[0] = (char)(0xC0 | cp >> 6);
        p[1] = (char)(0x80 | (cp & 63));
        return 2;
    }
    p[0] = (char)(0xE0 | cp >> 12);
    p[1] = (char)(0x80 | ((cp >> 6) & 63));
    p[2] = (char)(0x80 | (cp & 63));
    return 3;
}

/* One candidate token's bytes into buf (at most 48). */
static size_t synth_token(uint64_t *r, char *buf)
{
    static const char punct[] = " {}[]()\":,.;=<>/\\-_+*#'!?&|%$@`~\n\t";
    static const char vowels[] = "aeiouy", cons[] = "bcdfghjklmnprstvwz";
    unsigned kind = (unsigned)(next(r) % 100);
    size_t n = 0;
    if (kind < 58) { /* a word piece, half with a leading space, some capitalised */
        if (next(r) & 1)
            buf[n++] = ' ';
        size_t len = 2 + next(r) % 9;
        for (size_t i = 0; i < len; i++)
            buf[n++] = (i & 1) ? vowels[next(r) % 6] : cons[next(r) % 18];
        if (next(r) % 5 == 0)
            buf[n - len] = (char)(buf[n - len] - 32);
    } else if (kind < 72) { /* code and JSON punctuation, maybe around a short word */
        size_t len = 1 + next(r) % 4;
        for (size_t i = 0; i < len; i++)
            buf[n++] = punct[next(r) % (sizeof punct - 1)];
        if (next(r) & 1)
            for (size_t i = 0, w = 1 + next(r) % 5; i < w; i++)
                buf[n++] = cons[next(r) % 18];
    } else if (kind < 75) { /* whitespace: newlines and indentation */
        if (next(r) & 1)
            buf[n++] = '\n';
        for (size_t i = 0, w = next(r) % 16; i < w; i++)
            buf[n++] = ' ';
        if (n == 0)
            buf[n++] = '\t';
    } else if (kind < 90) { /* CJK, 1-3 characters */
        for (size_t i = 0, w = 1 + next(r) % 3; i < w; i++)
            n += put_utf8(buf + n, 0x4E00 + (uint32_t)(next(r) % 0x5000));
    } else if (kind < 97) { /* Cyrillic and Greek words */
        uint32_t base = next(r) & 1 ? 0x430 : 0x3B1;
        if (next(r) & 1)
            buf[n++] = ' ';
        for (size_t i = 0, w = 2 + next(r) % 6; i < w; i++)
            n += put_utf8(buf + n, base + (uint32_t)(next(r) % 24));
    } else { /* a UTF-8 fragment: a lead byte and part of its continuation, or continuation bytes */
        char tmp[4];
        size_t k = put_utf8(tmp, 0x4E00 + (uint32_t)(next(r) % 0x5000));
        size_t cut = 1 + next(r) % (k - 1);
        if (next(r) & 1)
            memcpy(buf, tmp, cut), n = cut;
        else
            memcpy(buf, tmp + cut, k - cut), n = k - cut;
    }
    return n;
}

static uint64_t hash_bytes(const char *s, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return h;
}

struct synth_vocab {
    char **bytes;
    size_t *lens;
    bool *special;
    uint32_t n;
    int32_t eos;
};

static void synth_vocab_free(struct synth_vocab *v)
{
    for (uint32_t i = 0; v->bytes && i < v->n; i++)
        free(v->bytes[i]);
    free(v->bytes), free(v->lens), free(v->special);
}

static bool add_token(struct synth_vocab *v, uint64_t *table, size_t table_size, const char *s, size_t n, bool special)
{
    uint64_t h = hash_bytes(s, n) | 1;
    size_t slot = h & (table_size - 1);
    while (table[slot]) {
        if (table[slot] == h)
            return false; /* taken (a 64-bit hash collision only drops a candidate) */
        slot = (slot + 1) & (table_size - 1);
    }
    table[slot] = h;
    v->bytes[v->n] = malloc(n + 1);
    if (!v->bytes[v->n])
        return false;
    memcpy(v->bytes[v->n], s, n);
    v->lens[v->n] = n;
    v->special[v->n] = special;
    v->n++;
    return true;
}

static bool synth_vocab_build(uint32_t n_tokens, uint64_t seed, struct synth_vocab *v)
{
    *v = (struct synth_vocab){0};
    size_t table_size = 1;
    while (table_size < 2 * (size_t)n_tokens)
        table_size *= 2;
    uint64_t *table = calloc(table_size, sizeof *table);
    v->bytes = calloc(n_tokens, sizeof *v->bytes);
    v->lens = calloc(n_tokens, sizeof *v->lens);
    v->special = calloc(n_tokens, sizeof *v->special);
    if (!table || !v->bytes || !v->lens || !v->special) {
        free(table);
        return false;
    }
    uint32_t n_text = n_tokens - 256;
    char buf[64];
    for (int b = 0; b < 256; b++) {
        buf[0] = (char)b;
        add_token(v, table, table_size, buf, 1, false);
    }
    for (int d = 0; d < 1000 && v->n < n_text; d++) { /* numbers: 0-999, as Kimi splits digits in threes */
        int len = snprintf(buf, sizeof buf, "%d", d);
        add_token(v, table, table_size, buf, (size_t)len, false);
        len = snprintf(buf, sizeof buf, "%03d", d);
        add_token(v, table, table_size, buf, (size_t)len, false);
    }
    uint64_t r = seed * 0x9E3779B97F4A7C15ull | 1;
    while (v->n < n_text) {
        size_t len = synth_token(&r, buf);
        add_token(v, table, table_size, buf, len, false);
    }
    for (int k = 0; k < 256; k++) {
        int len = snprintf(buf, sizeof buf, "<|reserved_special_%d|>", k);
        if (k == 2)
            len = snprintf(buf, sizeof buf, "<|im_end|>");
        add_token(v, table, table_size, buf, (size_t)len, true);
    }
    v->eos = (int32_t)(n_text + 2);
    free(table);
    return v->n == n_tokens;
}

/* ---- the workload ---------------------------------------------------------------------- */

static const char *const schema_text =
    "{\"type\":\"object\",\"properties\":{"
    "\"title\":{\"type\":\"string\"},"
    "\"summary\":{\"type\":\"string\"},"
    "\"language\":{\"enum\":[\"en\",\"zh\",\"ru\",\"other\"]},"
    "\"confidence\":{\"type\":\"number\"},"
    "\"published\":{\"type\":\"boolean\"},"
    "\"authors\":{\"type\":\"array\",\"items\":{\"type\":\"object\",\"properties\":{"
    "\"name\":{\"type\":\"string\"},\"email\":{\"anyOf\":[{\"type\":\"string\",\"pattern\":\"^[a-z.]+@[a-z]+\\\\.(org|com)$\"},{\"type\":\"null\"}]},"
    "\"role\":{\"enum\":[\"author\",\"editor\",\"reviewer\"]}},\"required\":[\"name\",\"email\",\"role\"],"
    "\"additionalProperties\":false}},"
    "\"keywords\":{\"type\":\"array\",\"items\":{\"type\":\"string\"},\"maxItems\":8},"
    "\"sections\":{\"type\":\"array\",\"items\":{\"type\":\"object\",\"properties\":{"
    "\"heading\":{\"type\":\"string\"},\"words\":{\"type\":\"integer\"},\"notes\":{\"type\":\"string\"}},"
    "\"required\":[\"heading\",\"words\"],\"additionalProperties\":false}}},"
    "\"required\":[\"title\",\"summary\",\"language\",\"confidence\",\"published\",\"authors\",\"keywords\","
    "\"sections\"],\"additionalProperties\":false}";

static const char *const document_text =
    "{\n"
    "  \"title\": \"Mixture-of-Experts inference on one machine\",\n"
    "  \"summary\": \"The paper measures how a trillion-parameter model decodes when the GPU holds only a small "
    "part of the weights: attention and shared experts stay on the device, routed experts run on the CPU "
    "close to their memory. \\\"Bandwidth\\\" decides the step, not compute.\\n\\u4e2d\\u6587 summary: "
    "\xe4\xb8\x93\xe5\xae\xb6\xe6\xb7\xb7\xe5\x90\x88\xe6\xa8\xa1\xe5\x9e\x8b\xe5\x9c\xa8\xe5\x8d\x95\xe6\x9c\xba"
    "\xe4\xb8\x8a\xe7\x9a\x84\xe6\x8e\xa8\xe7\x90\x86\xe3\x80\x82\",\n"
    "  \"language\": \"en\",\n"
    "  \"confidence\": 0.875,\n"
    "  \"published\": true,\n"
    "  \"authors\": [\n"
    "    {\"name\": \"Ada Lovelace\", \"email\": \"ada@example.org\", \"role\": \"author\"},\n"
    "    {\"name\": \"\xd0\x98\xd0\xb2\xd0\xb0\xd0\xbd \xd0\x9f\xd0\xb5\xd1\x82\xd1\x80\xd0\xbe\xd0\xb2\", "
    "\"email\": null, \"role\": \"reviewer\"}\n"
    "  ],\n"
    "  \"keywords\": [\"moe\", \"numa\", \"kv cache\", \"expert placement\", \"decode\"],\n"
    "  \"sections\": [\n"
    "    {\"heading\": \"Introduction\", \"words\": 1250, \"notes\": \"motivation and the memory wall\"},\n"
    "    {\"heading\": \"Placement\", \"words\": 3400},\n"
    "    {\"heading\": \"Results\", \"words\": 2875, \"notes\": \"decode 0.94 of the triad; prefill 0.47 of "
    "the int8 peak\"}\n"
    "  ]\n"
    "}";

static int compare_doubles(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

struct series {
    double *t;
    size_t n;
};

static void series_report(const char *what, struct series *s, json_t *out)
{
    if (s->n == 0) {
        printf("  %-22s      -\n", what);
        return;
    }
    qsort(s->t, s->n, sizeof *s->t, compare_doubles);
    double sum = 0;
    for (size_t i = 0; i < s->n; i++)
        sum += s->t[i];
    size_t i99 = (s->n * 99) / 100 < s->n ? (s->n * 99) / 100 : s->n - 1;
    double mean = sum / (double)s->n, p50 = s->t[s->n / 2], p99 = s->t[i99];
    double worst = s->t[s->n - 1];
    printf("  %-22s %6zu tokens  mean %8.3f ms  median %8.3f  p99 %8.3f  worst %8.3f\n", what, s->n, mean * 1e3,
           p50 * 1e3, p99 * 1e3, worst * 1e3);
    json_t *j = json_pack("{s:I, s:f, s:f, s:f, s:f}", "tokens", (json_int_t)s->n, "mean_ms", mean * 1e3, "median_ms",
                          p50 * 1e3, "p99_ms", p99 * 1e3, "worst_ms", worst * 1e3);
    json_object_set_new(out, what, j);
}

int kt_bench_grammar(const struct kt_bench_options *o)
{
    int rc = 1;
    kt_err err = {0};
    struct synth_vocab sv = {0};
    struct kt_gguf *gguf = NULL;
    struct kt_tokenizer *tok = NULL;
    struct kt_grammar_vocab *v = NULL;
    struct kt_grammar *g = NULL;
    struct kt_grammar_matcher *m = NULL;
    uint32_t *mask = NULL;
    json_t *schema = NULL, *report = json_object();
    struct series all = {0}, in_string = {0}, other = {0}, cpu_all = {0}, cpu_string = {0};
    const char **bytes = NULL;
    size_t *lens = NULL;
    uint32_t n_tokens;

    double t0 = kt_bench_now_seconds();
    if (o->model) {
        if (kt_gguf_open(o->model, &gguf, &err) != KT_OK || kt_tokenizer_create(gguf, &tok, &err) != KT_OK)
            goto fail;
        t0 = kt_bench_now_seconds();
        if (kt_grammar_vocab_from_tokenizer(tok, (uint32_t)kt_tokenizer_n_vocab(tok), &v, &err) != KT_OK)
            goto fail;
        n_tokens = (uint32_t)kt_tokenizer_n_vocab(tok);
        bytes = calloc(n_tokens, sizeof *bytes);
        lens = calloc(n_tokens, sizeof *lens);
        if (!bytes || !lens)
            goto nomem;
        for (uint32_t i = 0; i < n_tokens; i++) {
            enum kt_tok_type ty = kt_token_type(tok, (int32_t)i);
            bool text = ty == KT_TOK_NORMAL || ty == KT_TOK_BYTE || ty == KT_TOK_UNDEFINED;
            bytes[i] = text ? kt_token_bytes(tok, (int32_t)i, &lens[i]) : NULL;
            if (!bytes[i])
                lens[i] = 0;
        }
    } else {
        if (o->vocab_tokens < 512) {
            fprintf(stderr, "kt-bench: --vocab must be at least 512 tokens\n");
            return 1;
        }
        if (!synth_vocab_build(o->vocab_tokens, o->seed, &sv))
            goto nomem;
        t0 = kt_bench_now_seconds();
        if (kt_grammar_vocab_create((const char *const *)sv.bytes, sv.lens, sv.special, sv.n, sv.n, &sv.eos, 1, &v,
                                    &err) != KT_OK)
            goto fail;
        n_tokens = sv.n;
        bytes = calloc(n_tokens, sizeof *bytes);
        lens = calloc(n_tokens, sizeof *lens);
        if (!bytes || !lens)
            goto nomem;
        for (uint32_t i = 0; i < n_tokens; i++)
            if (!sv.special[i])
                bytes[i] = sv.bytes[i], lens[i] = sv.lens[i];
    }
    double t_vocab = kt_bench_now_seconds() - t0;

    schema = json_loads(schema_text, 0, NULL);
    uint32_t root;
    t0 = kt_bench_now_seconds();
    if (!schema || kt_grammar_create(&g, &err) != KT_OK || kt_json_schema_compile(g, schema, &root, &err) != KT_OK ||
        kt_grammar_set_root(g, root, &err) != KT_OK || kt_grammar_matcher_create(g, v, &m, &err) != KT_OK)
        goto fail;
    double t_compile = kt_bench_now_seconds() - t0;
    mask = malloc(kt_grammar_vocab_mask_words(v) * sizeof *mask);
    size_t doc_len = strlen(document_text), cap = doc_len + 2;
    all.t = malloc(cap * sizeof(double));
    in_string.t = malloc(cap * sizeof(double));
    other.t = malloc(cap * sizeof(double));
    cpu_all.t = malloc(cap * sizeof(double));
    cpu_string.t = malloc(cap * sizeof(double));
    if (!mask || !all.t || !in_string.t || !other.t || !cpu_all.t || !cpu_string.t)
        goto nomem;

    size_t n_steps = 0, allowed_total = 0;
    {
        size_t pos = 0;
        bool string = false, escaped = false; /* where the document is: inside a string or not */
        for (;;) {
            struct timespec c0, c1;
            clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c0);
            double s0 = kt_bench_now_seconds();
            uint32_t allowed = kt_grammar_matcher_fill_mask(m, mask);
            double dt = kt_bench_now_seconds() - s0;
            clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c1);
            double cpu = (double)(c1.tv_sec - c0.tv_sec) + 1e-9 * (double)(c1.tv_nsec - c0.tv_nsec);
            cpu_all.t[cpu_all.n++] = cpu;
            if (string)
                cpu_string.t[cpu_string.n++] = cpu;
            all.t[all.n++] = dt;
            if (string)
                in_string.t[in_string.n++] = dt;
            else
                other.t[other.n++] = dt;
            allowed_total += allowed;
            n_steps++;
            if (pos == doc_len)
                break;
            int32_t best = -1;
            size_t best_len = 0;
            for (uint32_t id = 0; id < n_tokens; id++)
                if (lens[id] > best_len && lens[id] <= doc_len - pos && ((mask[id >> 5] >> (id & 31)) & 1) &&
                    memcmp(bytes[id], document_text + pos, lens[id]) == 0)
                    best = (int32_t)id, best_len = lens[id];
            if (best < 0) {
                fprintf(stderr, "kt-bench: grammar: no allowed token continues the document at byte %zu\n", pos);
                goto done;
            }
            if (kt_grammar_matcher_accept_token(m, best, &err) != KT_OK)
                goto fail;
            for (size_t i = pos; i < pos + best_len; i++) {
                char c = document_text[i];
                if (escaped)
                    escaped = false;
                else if (string && c == '\\')
                    escaped = true;
                else if (c == '"')
                    string = !string;
            }
            pos += best_len;
        }
        if (!kt_grammar_matcher_complete(m)) {
            fprintf(stderr, "kt-bench: grammar: the document is not complete under the schema\n");
            goto done;
        }
    }
    printf("kt-bench grammar: %s vocabulary of %u tokens (%u words a mask)\n", o->model ? "the model's" : "a synthetic",
           n_tokens, kt_grammar_vocab_mask_words(v));
    printf("  index the vocabulary  %8.1f ms (once per tokenizer)\n", t_vocab * 1e3);
    printf("  compile the schema    %8.3f ms (once per request)\n", t_compile * 1e3);
    printf("  document: %zu bytes in %zu tokens, %.1f tokens allowed per step on average\n", doc_len, n_steps - 1,
           (double)allowed_total / (double)n_steps);
    json_object_set_new(report, "vocab_tokens", json_integer(n_tokens));
    json_object_set_new(report, "synthetic_vocab", json_boolean(!o->model));
    json_object_set_new(report, "index_ms", json_real(t_vocab * 1e3));
    json_object_set_new(report, "compile_ms", json_real(t_compile * 1e3));
    json_object_set_new(report, "document_tokens", json_integer((json_int_t)n_steps - 1));
    printf("mask per token, wall time (includes time the thread waited for a CPU):\n");
    series_report("all", &all, report);
    series_report("inside strings", &in_string, report);
    series_report("elsewhere", &other, report);
    printf("mask per token, this thread's CPU time:\n");
    series_report("cpu all", &cpu_all, report);
    series_report("cpu inside strings", &cpu_string, report);
    /* a reasoning block's free text (it avoids "</think>"): the first mask in a
     * state builds its token set, later ones reuse it */
    {
        struct kt_grammar *tg = NULL;
        struct kt_grammar_matcher *tm = NULL;
        uint32_t text, close, body, root2;
        int32_t close_id = -1;
        for (uint32_t id = 0; id < n_tokens && close_id < 0; id++)
            if (!bytes[id] && id != (uint32_t)(o->model ? kt_tokenizer_eos(tok) : sv.eos))
                close_id = (int32_t)id;
        if (close_id < 0 || kt_grammar_create(&tg, &err) != KT_OK ||
            kt_grammar_text(tg, "</think>", 8, &text, &err) != KT_OK || kt_grammar_token(tg, close_id, &close, &err) != KT_OK ||
            kt_json_any_object(tg, &body, &err) != KT_OK ||
            kt_grammar_seq(tg, (uint32_t[]){text, close, body}, 3, &root2, &err) != KT_OK ||
            kt_grammar_set_root(tg, root2, &err) != KT_OK || kt_grammar_matcher_create(tg, v, &tm, &err) != KT_OK) {
            kt_grammar_matcher_destroy(tm);
            kt_grammar_destroy(tg);
            goto fail;
        }
        double first = 0, later = 0;
        const char *reasoning = "Let me think about it: the user wants <b>JSON</b> and nothing else ";
        for (int k = 0; k < 16; k++) {
            double s0 = kt_bench_now_seconds();
            kt_grammar_matcher_fill_mask(tm, mask);
            double dt = kt_bench_now_seconds() - s0;
            if (k == 0)
                first = dt;
            else
                later += dt / 15;
            kt_grammar_matcher_accept_bytes(tm, reasoning + 4 * k, 4);
        }
        printf("  reasoning free text: first mask %.3f ms (builds its token set), later ones %.3f ms on average\n",
               first * 1e3, later * 1e3);
        json_object_set_new(report, "free_text_first_ms", json_real(first * 1e3));
        json_object_set_new(report, "free_text_later_ms", json_real(later * 1e3));
        kt_grammar_matcher_destroy(tm);
        kt_grammar_destroy(tg);
    }
    rc = o->json ? kt_bench_write_json(report, o->json) : 0;
    goto done;
nomem:
    err.status = KT_ERR_NOMEM;
    snprintf(err.msg, sizeof err.msg, "out of memory");
fail:
    fprintf(stderr, "kt-bench: grammar: %s\n", err.msg);
    rc = 1;
done:
    json_decref(report);
    json_decref(schema);
    free(mask), free(all.t), free(in_string.t), free(other.t), free(cpu_all.t), free(cpu_string.t);
    free(bytes), free(lens);
    kt_grammar_matcher_destroy(m);
    kt_grammar_destroy(g);
    kt_grammar_vocab_destroy(v);
    synth_vocab_free(&sv);
    kt_tokenizer_destroy(tok);
    kt_gguf_close(gguf);
    return rc;
}
