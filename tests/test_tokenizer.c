/*
 * test_tokenizer.c - kt's tokenizer against independent tokenizers, and its
 * contract: golden ids from DeepSeek-V3's tokenizer.json (run by HF's
 * tokenizers.js) and from tiktoken running Kimi-K2's pattern
 * (tests/golden/tokenizer, made once by generate.mjs; no Node here), special
 * tokens on and off, BOS, end-of-generation ids, the streaming decoder,
 * invalid UTF-8, round trips, kt-synth's vocabularies, the Unicode tables
 * against the UCD files, and speed.
 *
 * The expected values come from outside kt (the golden files, the Unicode
 * data, facts re-derived here); never regenerate or loosen them to make a
 * failing check pass without understanding the difference.
 */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "gguf.h"
#include "testlib.h"
#include "tokenizer.h"
#include "unicode.h"

#if defined(__SANITIZE_ADDRESS__)
#define SLOWDOWN 10.0 /* sanitizer builds */
#else
#define SLOWDOWN 1.0
#endif

/* ---- helpers ------------------------------------------------------------------- */

static const char *golden_path(const char *file)
{
    static char buf[2][2048];
    static int next;
    char *out = buf[next++ % 2];
    const char *src = getenv("KT_SOURCE_DIR");
    if (src && *src) {
        snprintf(out, sizeof buf[0], "%s/tests/golden/tokenizer/%s", src, file);
    } else { /* run by hand: next to this file */
        const char *slash = strrchr(__FILE__, '/');
        int dir = slash ? (int)(slash - __FILE__) : 1;
        snprintf(out, sizeof buf[0], "%.*s/golden/tokenizer/%s", dir, slash ? __FILE__ : ".", file);
    }
    return out;
}

static json_t *load_json(const char *file)
{
    json_error_t jerr;
    json_t *j = json_load_file(golden_path(file), JSON_ALLOW_NUL, &jerr);
    KT_CHECK(j != NULL, "%s: %s (line %d)", golden_path(file), jerr.text, jerr.line);
    return j;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The bytes of a golden case: "text", "hex" (raw, maybe invalid UTF-8) or "repeat". */
static char *case_text(const json_t *c, size_t *len)
{
    const json_t *v;
    char *out = NULL;
    *len = 0;
    if ((v = json_object_get(c, "text"))) {
        *len = json_string_length(v);
        out = malloc(*len + 1);
        memcpy(out, json_string_value(v), *len);
    } else if ((v = json_object_get(c, "hex"))) {
        const char *h = json_string_value(v);
        *len = strlen(h) / 2;
        out = malloc(*len + 1);
        for (size_t i = 0; i < *len; i++) {
            unsigned b;
            sscanf(h + 2 * i, "%2x", &b);
            out[i] = (char)b;
        }
    } else if ((v = json_object_get(c, "repeat"))) {
        size_t i, total = 0;
        const json_t *p;
        json_array_foreach(v, i, p) total += json_string_length(json_array_get(p, 0)) *
                                              (size_t)json_integer_value(json_array_get(p, 1));
        out = malloc(total + 1);
        json_array_foreach(v, i, p)
        {
            const char *s = json_string_value(json_array_get(p, 0));
            size_t n = json_string_length(json_array_get(p, 0));
            for (json_int_t k = 0; k < json_integer_value(json_array_get(p, 1)); k++, *len += n)
                memcpy(out + *len, s, n);
        }
    }
    if (out)
        out[*len] = 0;
    return out;
}

static uint64_t fnv1a64_ids(const int32_t *ids, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++)
        for (int k = 0; k < 4; k++) {
            h ^= ((uint32_t)ids[i] >> (8 * k)) & 0xFF;
            h *= 0x100000001b3ull;
        }
    return h;
}

/* Prints the first difference with the tokens' texts around it. */
static void show_diff(const struct kt_tokenizer *t, const char *what, const json_t *expected, const int32_t *got,
                      size_t n)
{
    size_t ne = json_array_size(expected), i = 0;
    while (i < ne && i < n && json_integer_value(json_array_get(expected, i)) == got[i])
        i++;
    fprintf(stderr, "  %s: %zu ids expected, %zu got, first difference at %zu:\n", what, ne, n, i);
    for (size_t k = i >= 2 ? i - 2 : 0; k < i + 4 && (k < ne || k < n); k++) {
        int32_t e = k < ne ? (int32_t)json_integer_value(json_array_get(expected, k)) : -1;
        int32_t g = k < n ? got[k] : -1;
        size_t le = 0, lg = 0;
        const char *te = e >= 0 ? kt_token_text(t, e, &le) : "";
        const char *tg = g >= 0 ? kt_token_text(t, g, &lg) : "";
        fprintf(stderr, "    [%zu] expected %d '%.*s'  got %d '%.*s'\n", k, e, (int)le, te ? te : "", g, (int)lg,
                tg ? tg : "");
    }
}

/* Compares ids with a golden expectation ({"ids": [...]} or {"n_ids", "ids_fnv1a64"}). */
static bool ids_match(const struct kt_tokenizer *t, const char *what, const json_t *exp, const int32_t *ids,
                      size_t n)
{
    const json_t *arr = json_object_get(exp, "ids");
    if (arr) {
        bool same = json_array_size(arr) == n;
        for (size_t i = 0; same && i < n; i++)
            same = json_integer_value(json_array_get(arr, i)) == ids[i];
        if (!same)
            show_diff(t, what, arr, ids, n);
        return same;
    }
    uint64_t want = strtoull(json_string_value(json_object_get(exp, "ids_fnv1a64")), NULL, 16);
    size_t want_n = (size_t)json_integer_value(json_object_get(exp, "n_ids"));
    bool same = want_n == n && want == fnv1a64_ids(ids, n);
    if (!same)
        fprintf(stderr, "  %s: %zu ids (hash %016llx) expected, %zu (hash %016llx) got\n", what, want_n,
                (unsigned long long)want, n, (unsigned long long)fnv1a64_ids(ids, n));
    return same;
}

/* Writes a tokenizer-only GGUF file and loads a tokenizer from it (the file
 * is closed and removed before returning: the tokenizer must not need it). */
struct vocab_spec {
    const char *model, *pre;
    uint32_t n_vocab;
    const char **tokens;
    const int32_t *types;
    const char **merges;
    uint32_t n_merges;
    int64_t bos, eos, eot; /* -1: key absent */
    bool add_bos;
};

static kt_status build_tokenizer(const struct vocab_spec *v, struct kt_tokenizer **out, kt_err *err)
{
    const char *path = kt_test_path("tokenizer.gguf");
    struct kt_gguf_writer *w = NULL;
    struct kt_gguf *g = NULL;
    kt_status st = kt_gguf_writer_create(path, &w, err);
    if (st == KT_OK)
        st = kt_gguf_writer_set_str(w, "tokenizer.ggml.model", v->model, err);
    if (st == KT_OK)
        st = kt_gguf_writer_set_str(w, "tokenizer.ggml.pre", v->pre, err);
    if (st == KT_OK)
        st = kt_gguf_writer_set_str_array(w, "tokenizer.ggml.tokens", v->tokens, v->n_vocab, err);
    if (st == KT_OK)
        st = kt_gguf_writer_set_array(w, "tokenizer.ggml.token_type", KT_GGUF_INT32, v->types, v->n_vocab, err);
    if (st == KT_OK && v->n_merges)
        st = kt_gguf_writer_set_str_array(w, "tokenizer.ggml.merges", v->merges, v->n_merges, err);
    if (st == KT_OK && v->bos >= 0)
        st = kt_gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)v->bos, err);
    if (st == KT_OK && v->eos >= 0)
        st = kt_gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)v->eos, err);
    if (st == KT_OK && v->eot >= 0)
        st = kt_gguf_writer_set_u32(w, "tokenizer.ggml.eot_token_id", (uint32_t)v->eot, err);
    if (st == KT_OK)
        st = kt_gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", v->add_bos, err);
    if (st == KT_OK)
        st = kt_gguf_writer_finish(w, err);
    kt_gguf_writer_destroy(w);
    if (st == KT_OK)
        st = kt_gguf_open(path, &g, err);
    if (st == KT_OK)
        st = kt_tokenizer_create(g, out, err);
    kt_gguf_close(g);
    unlink(path);
    return st;
}

/* ---- golden vocabularies -------------------------------------------------------------- */

struct golden {
    json_t *json;
    struct vocab_spec spec;
    char **owned;     /* [n_vocab] token texts */
    int32_t *types;   /* [n_vocab] */
    const char **merges;
    struct kt_tokenizer *tok;
};

static struct golden deepseek_golden, kimi_golden;

static bool looks_special(const char *s)
{
    size_t n = strlen(s);
    return (n >= 4 && strncmp(s, "<|", 2) == 0 && strcmp(s + n - 2, "|>") == 0) ||
           (n >= 6 && strncmp(s, "<｜", 4) == 0 && strcmp(s + n - 4, "｜>") == 0);
}

static void golden_alloc(struct golden *gd, uint32_t n_vocab)
{
    gd->owned = calloc(n_vocab, sizeof *gd->owned);
    gd->types = malloc(n_vocab * sizeof *gd->types);
    for (uint32_t i = 0; i < n_vocab; i++) {
        char pad[32];
        snprintf(pad, sizeof pad, "[PAD%u]", i); /* what the converter writes for ids without a token */
        gd->owned[i] = strdup(pad);
        gd->types[i] = KT_TOK_UNUSED;
    }
    gd->spec.n_vocab = n_vocab;
    gd->spec.tokens = (const char **)gd->owned;
    gd->spec.types = gd->types;
    gd->spec.model = "gpt2";
    gd->spec.eot = -1;
}

static void golden_set(struct golden *gd, json_int_t id, const char *text, int32_t type)
{
    free(gd->owned[id]);
    gd->owned[id] = strdup(text);
    gd->types[id] = type;
}

/* DeepSeek-V3 as llama.cpp's converter writes it: base vocabulary NORMAL,
 * added tokens CONTROL when special or special-looking, else USER_DEFINED. */
static bool load_deepseek(void)
{
    struct golden *gd = &deepseek_golden;
    if (!(gd->json = load_json("deepseek_v3.json")))
        return false;
    golden_alloc(gd, (uint32_t)json_integer_value(json_object_get(gd->json, "n_vocab")));
    size_t i;
    const json_t *e;
    json_array_foreach(json_object_get(gd->json, "tokens"), i, e)
        golden_set(gd, json_integer_value(json_array_get(e, 0)), json_string_value(json_array_get(e, 1)), KT_TOK_NORMAL);
    json_array_foreach(json_object_get(gd->json, "added"), i, e)
    {
        const char *text = json_string_value(json_array_get(e, 1));
        bool special = json_is_true(json_array_get(e, 2)) || looks_special(text);
        golden_set(gd, json_integer_value(json_array_get(e, 0)), text, special ? KT_TOK_CONTROL : KT_TOK_USER_DEFINED);
    }
    const json_t *merges = json_object_get(gd->json, "merges");
    gd->merges = malloc(json_array_size(merges) * sizeof *gd->merges);
    json_array_foreach(merges, i, e) gd->merges[i] = json_string_value(e);
    gd->spec.merges = gd->merges;
    gd->spec.n_merges = (uint32_t)json_array_size(merges);
    gd->spec.pre = "deepseek-v3";
    gd->spec.bos = json_integer_value(json_object_get(gd->json, "bos_id"));
    gd->spec.eos = json_integer_value(json_object_get(gd->json, "eos_id"));
    gd->spec.add_bos = json_is_true(json_object_get(gd->json, "add_bos"));
    kt_err err = {0};
    kt_status st = build_tokenizer(&gd->spec, &gd->tok, &err);
    KT_CHECK(st == KT_OK, "deepseek-v3 vocabulary: %s", err.msg);
    return st == KT_OK;
}

/* Kimi-K2's layout over tiktoken ranks: id = rank, then 256 CONTROL specials; no merges. */
static bool load_kimi(void)
{
    struct golden *gd = &kimi_golden;
    if (!(gd->json = load_json("kimi_k2.json")))
        return false;
    json_int_t n_base = json_integer_value(json_object_get(gd->json, "n_base"));
    golden_alloc(gd, (uint32_t)n_base + 256);
    size_t i;
    const json_t *e;
    json_array_foreach(json_object_get(gd->json, "tokens"), i, e)
        golden_set(gd, json_integer_value(json_array_get(e, 0)), json_string_value(json_array_get(e, 1)), KT_TOK_NORMAL);
    json_array_foreach(json_object_get(gd->json, "specials"), i, e)
        golden_set(gd, json_integer_value(json_array_get(e, 0)), json_string_value(json_array_get(e, 1)), KT_TOK_CONTROL);
    gd->spec.pre = "kimi-k2";
    gd->spec.bos = json_integer_value(json_object_get(gd->json, "bos_id"));
    gd->spec.eos = json_integer_value(json_object_get(gd->json, "eos_id"));
    gd->spec.add_bos = json_is_true(json_object_get(gd->json, "add_bos"));
    kt_err err = {0};
    kt_status st = build_tokenizer(&gd->spec, &gd->tok, &err);
    KT_CHECK(st == KT_OK, "kimi-k2 vocabulary: %s", err.msg);
    return st == KT_OK;
}

static void golden_free(struct golden *gd)
{
    kt_tokenizer_destroy(gd->tok);
    for (uint32_t i = 0; gd->owned && i < gd->spec.n_vocab; i++)
        free(gd->owned[i]);
    free(gd->owned);
    free(gd->types);
    free(gd->merges);
    json_decref(gd->json);
    memset(gd, 0, sizeof *gd);
}

/* Every golden case: ids as the reference made them (specials parsed, as the
 * models' own tokenizers do), and without special parsing where given. */
static void check_golden(const struct golden *gd, const char *family)
{
    if (!gd->tok)
        return;
    size_t i, n_cases = 0, n_bytes = 0;
    const json_t *c;
    json_array_foreach(json_object_get(gd->json, "cases"), i, c)
    {
        const char *name = json_string_value(json_object_get(c, "name"));
        size_t len;
        char *text = case_text(c, &len);
        int32_t *ids = NULL;
        size_t n = 0;
        kt_err err = {0};
        kt_status st = kt_tokenize(gd->tok, text, len, false, true, &ids, &n, &err);
        KT_CHECK(st == KT_OK, "%s %s: %s", family, name, err.msg);
        char what[256];
        snprintf(what, sizeof what, "%s %s", family, name);
        KT_CHECK(ids_match(gd->tok, what, c, ids, n), "%s: ids differ from the reference", what);
        free(ids);
        const json_t *ordinary = json_object_get(c, "ordinary");
        if (ordinary) {
            st = kt_tokenize(gd->tok, text, len, false, false, &ids, &n, &err);
            snprintf(what, sizeof what, "%s %s (parse_special off)", family, name);
            KT_CHECK(st == KT_OK && ids_match(gd->tok, what, ordinary, ids, n), "%s: ids differ from the reference",
                     what);
            free(ids);
        }
        n_cases++;
        n_bytes += len;
        free(text);
    }
    printf("  %s: %zu cases, %zu bytes (%s)\n", family, n_cases, n_bytes,
           json_string_value(json_object_get(gd->json, "source")));
    KT_CHECK(n_cases >= 60, "%s: only %zu golden cases", family, n_cases);
}

static void golden_deepseek_v3_matches_hf_tokenizer(void) { check_golden(&deepseek_golden, "deepseek-v3"); }
static void golden_kimi_k2_matches_tiktoken(void) { check_golden(&kimi_golden, "kimi-k2"); }

/* Kimi GGUF files converted by llama.cpp carry merges derived from the ranks;
 * kt merges by rank for kimi-k2 whatever they say (here: nonsense merges). */
static void kimi_k2_ignores_merges_in_the_file(void)
{
    if (!kimi_golden.tok)
        return;
    struct golden alt = kimi_golden;
    const char *merges[] = {"Ġ t", "h e", "e r", "ä ¸"};
    alt.spec.merges = merges;
    alt.spec.n_merges = 4;
    kt_err err = {0};
    KT_CHECK(build_tokenizer(&alt.spec, &alt.tok, &err) == KT_OK, "%s", err.msg);
    if (alt.tok)
        check_golden(&alt, "kimi-k2 with merges");
    kt_tokenizer_destroy(alt.tok);
}

/* decode(encode(x)) == x for every valid case; invalid ones decode to U+FFFD substitutions. */
static void round_trip_golden(const struct golden *gd, const char *family)
{
    if (!gd->tok)
        return;
    size_t i;
    const json_t *c;
    json_array_foreach(json_object_get(gd->json, "cases"), i, c)
    {
        const char *name = json_string_value(json_object_get(c, "name"));
        size_t len, out_len = 0;
        char *text = case_text(c, &len), *out = NULL;
        int32_t *ids = NULL;
        size_t n = 0;
        kt_err err = {0};
        bool ok = kt_tokenize(gd->tok, text, len, false, true, &ids, &n, &err) == KT_OK &&
                  kt_detokenize(gd->tok, ids, n, true, &out, &out_len, &err) == KT_OK;
        KT_CHECK(ok, "%s %s: %s", family, name, err.msg);
        if (kt_utf8_valid(text, len)) {
            KT_CHECK(ok && out_len == len && memcmp(out, text, len) == 0, "%s %s: round trip changed the text",
                     family, name);
        } else {
            KT_CHECK(ok && kt_utf8_valid(out, out_len) && out_len > len / 2,
                     "%s %s: invalid input did not decode to valid UTF-8", family, name);
        }
        free(ids);
        free(out);
        free(text);
    }
}

static void round_trip_restores_every_golden_text(void)
{
    round_trip_golden(&deepseek_golden, "deepseek-v3");
    round_trip_golden(&kimi_golden, "kimi-k2");
}

/* ---- special tokens, BOS, EOG -------------------------------------------------------------- */

static bool contains(const int32_t *ids, size_t n, int32_t id)
{
    for (size_t i = 0; i < n; i++)
        if (ids[i] == id)
            return true;
    return false;
}

static void tokenize_ok(const struct kt_tokenizer *t, const char *s, bool add_special, bool parse_special,
                        int32_t **ids, size_t *n)
{
    kt_err err = {0};
    kt_status st = kt_tokenize(t, s, strlen(s), add_special, parse_special, ids, n, &err);
    KT_CHECK(st == KT_OK, "tokenize \"%s\": %s", s, err.msg);
}

static void special_tokens_parse_only_when_asked(void)
{
    const struct kt_tokenizer *ds = deepseek_golden.tok, *km = kimi_golden.tok;
    if (!ds || !km)
        return;
    int32_t user = kt_token_find(ds, "<｜User｜>", strlen("<｜User｜>"));
    int32_t im_end = kt_token_find(km, "<|im_end|>", strlen("<|im_end|>"));
    KT_CHECK(user == 128803, "<｜User｜> is %d", user);
    KT_CHECK(kt_token_type(ds, user) == KT_TOK_CONTROL, "<｜User｜> type %d", kt_token_type(ds, user));
    KT_CHECK(im_end == kt_tokenizer_n_vocab(km) - 256 + 2, "<|im_end|> is %d", im_end);

    const char *ds_text = "Hi<｜User｜>there", *km_text = "Hi<|im_end|>there";
    int32_t *ids;
    size_t n;
    tokenize_ok(ds, ds_text, false, true, &ids, &n);
    KT_CHECK(n == 3 && ids[1] == user, "deepseek: <｜User｜> not parsed (%zu ids)", n);
    free(ids);
    tokenize_ok(ds, ds_text, false, false, &ids, &n);
    KT_CHECK(n > 3 && !contains(ids, n, user), "deepseek: <｜User｜> parsed with parse_special off");
    char *out;
    size_t out_len;
    kt_err err = {0};
    KT_CHECK(kt_detokenize(ds, ids, n, false, &out, &out_len, &err) == KT_OK && strcmp(out, ds_text) == 0,
             "deepseek: special text as plain text does not round-trip");
    free(out);
    free(ids);

    tokenize_ok(km, km_text, false, true, &ids, &n);
    KT_CHECK(contains(ids, n, im_end), "kimi: <|im_end|> not parsed");
    /* rendering: CONTROL only when asked */
    KT_CHECK(kt_detokenize(km, ids, n, false, &out, &out_len, &err) == KT_OK && strcmp(out, "Hithere") == 0,
             "kimi: control token rendered without special: \"%s\"", out);
    free(out);
    KT_CHECK(kt_detokenize(km, ids, n, true, &out, &out_len, &err) == KT_OK && strcmp(out, km_text) == 0,
             "kimi: control token not rendered with special");
    free(out);
    free(ids);
    tokenize_ok(km, km_text, false, false, &ids, &n);
    KT_CHECK(!contains(ids, n, im_end), "kimi: <|im_end|> parsed with parse_special off");
    free(ids);

    char buf[64];
    KT_CHECK(kt_token_piece(km, im_end, false, buf, sizeof buf) == 0, "kimi: CONTROL piece without special");
    size_t pl = kt_token_piece(km, im_end, true, buf, sizeof buf);
    KT_CHECK(pl == 10 && memcmp(buf, "<|im_end|>", 10) == 0, "kimi: CONTROL piece with special");
    KT_CHECK(kt_token_piece(km, im_end, true, buf, 3) == 10 && memcmp(buf, "<|i", 3) == 0,
             "kimi: truncated piece must report the full length");
    KT_CHECK(kt_token_find(km, "no such token text", 18) == -1, "find of an absent text");
    KT_CHECK(kt_token_find(km, "<|im_end|", 9) != im_end, "find must match exact text");
}

static void bos_is_added_as_the_file_says(void)
{
    const struct kt_tokenizer *ds = deepseek_golden.tok, *km = kimi_golden.tok;
    if (!ds || !km)
        return;
    int32_t *a, *b;
    size_t na, nb;
    tokenize_ok(ds, "Hello world", false, true, &a, &na);
    tokenize_ok(ds, "Hello world", true, true, &b, &nb);
    KT_CHECK(kt_tokenizer_add_bos(ds) && kt_tokenizer_bos(ds) == 0, "deepseek: add_bos/bos");
    KT_CHECK(nb == na + 1 && b[0] == 0 && memcmp(a, b + 1, na * sizeof *a) == 0, "deepseek: BOS not prepended");
    free(a);
    free(b);
    tokenize_ok(ds, "", true, true, &b, &nb);
    KT_CHECK(nb == 1 && b[0] == 0, "deepseek: empty text with add_special is just BOS");
    free(b);
    tokenize_ok(km, "Hello world", false, true, &a, &na);
    tokenize_ok(km, "Hello world", true, true, &b, &nb);
    KT_CHECK(!kt_tokenizer_add_bos(km) && kt_tokenizer_bos(km) == kt_tokenizer_n_vocab(km) - 256,
             "kimi: add_bos/bos");
    KT_CHECK(nb == na && memcmp(a, b, na * sizeof *a) == 0, "kimi: a BOS was added");
    free(a);
    free(b);
}

static void end_of_generation_ids(void)
{
    const struct kt_tokenizer *ds = deepseek_golden.tok, *km = kimi_golden.tok;
    if (!ds || !km)
        return;
    KT_CHECK(kt_token_is_eog(ds, 1), "deepseek: <｜end▁of▁sentence｜> (eos) is EOG");
    KT_CHECK(kt_token_is_eog(ds, 128805), "deepseek: <|EOT|> is EOG");
    KT_CHECK(!kt_token_is_eog(ds, 0) && !kt_token_is_eog(ds, 128803) && !kt_token_is_eog(ds, 100),
             "deepseek: BOS, <｜User｜>, a word are not EOG");
    KT_CHECK(!kt_token_is_eog(ds, -1) && !kt_token_is_eog(ds, 1 << 30), "out of range ids are not EOG");
    int32_t base = kt_tokenizer_n_vocab(km) - 256;
    const char *stops[] = {"[EOS]", "<|im_end|>", "[EOT]", "[PAD]"};
    for (size_t i = 0; i < 4; i++) {
        int32_t id = kt_token_find(km, stops[i], strlen(stops[i]));
        KT_CHECK(id >= base && kt_token_is_eog(km, id), "kimi: %s is EOG", stops[i]);
    }
    const char *go[] = {"[BOS]", "<|im_user|>", "<|im_middle|>", "<think>", "<|tool_call_end|>"};
    for (size_t i = 0; i < 5; i++) {
        int32_t id = kt_token_find(km, go[i], strlen(go[i]));
        KT_CHECK(id >= base && !kt_token_is_eog(km, id), "kimi: %s is not EOG", go[i]);
    }
    size_t n;
    const int32_t *eog = kt_tokenizer_eog_ids(km, &n);
    KT_CHECK(n == 4, "kimi: %zu EOG ids, want 4", n);
    for (size_t i = 1; i < n; i++)
        KT_CHECK(eog[i - 1] < eog[i], "EOG ids ascending");
}

/* ---- bytes and decoding --------------------------------------------------------------------- */

/* GPT-2's bytes_to_unicode, written out the way GPT-2 builds it. */
static void gpt2_byte_table(uint32_t table[256])
{
    uint32_t next = 256;
    for (uint32_t b = 0; b < 256; b++) {
        bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
        table[b] = printable ? b : next++;
    }
}

static void byte_tokens_decode_to_their_byte(void)
{
    const struct kt_tokenizer *t = kimi_golden.tok;
    if (!t)
        return;
    uint32_t table[256];
    gpt2_byte_table(table);
    for (unsigned b = 0; b < 256; b++) {
        char text[4];
        size_t n = kt_utf8_encode(table[b], text), len;
        int32_t id = kt_token_find(t, text, n);
        const char *bytes = id >= 0 ? kt_token_bytes(t, id, &len) : NULL;
        KT_CHECK(bytes && len == 1 && (unsigned char)bytes[0] == b, "byte 0x%02X: token %d", b, id);
    }
    size_t len;
    int32_t the = kt_token_find(t, "Ġthe", strlen("Ġthe"));
    const char *bytes = the >= 0 ? kt_token_bytes(t, the, &len) : NULL;
    KT_CHECK(bytes && len == 4 && memcmp(bytes, " the", 4) == 0, "Ġthe decodes to \" the\"");
}

static bool push_all(const struct kt_tokenizer *t, const int32_t *ids, size_t n, char *out, size_t *out_len,
                     bool *each_valid, size_t *n_held)
{
    struct kt_detok d = KT_DETOK_INIT;
    size_t cap = kt_detok_max_bytes(t);
    char *buf = malloc(cap);
    *out_len = 0;
    *each_valid = true;
    *n_held = 0;
    bool ok = true;
    for (size_t i = 0; i < n && ok; i++) {
        size_t w;
        kt_err err = {0};
        ok = kt_detok_push(t, &d, ids[i], true, buf, cap, &w, &err) == KT_OK;
        *each_valid = *each_valid && kt_utf8_valid(buf, w);
        *n_held += d.n_held > 0;
        memcpy(out + *out_len, buf, w);
        *out_len += w;
    }
    *out_len += kt_detok_flush(&d, out + *out_len);
    free(buf);
    return ok;
}

static void streaming_decoder_holds_back_split_characters(void)
{
    const struct kt_tokenizer *t = kimi_golden.tok;
    if (!t)
        return;
    const char *text = "👨‍👩‍👧‍👦 🍕 ok 日本語のテキスト 🫠";
    int32_t *ids;
    size_t n;
    tokenize_ok(t, text, false, true, &ids, &n);
    bool partial = false;
    for (size_t i = 0; i < n; i++) {
        size_t len;
        const char *b = kt_token_bytes(t, ids[i], &len);
        partial = partial || !kt_utf8_valid(b, len);
    }
    KT_CHECK(partial, "no token ends inside a character: the test would not exercise hold-back");
    char out[256];
    size_t out_len, held;
    bool each_valid;
    KT_CHECK(push_all(t, ids, n, out, &out_len, &each_valid, &held), "push failed");
    KT_CHECK(each_valid, "a push emitted invalid UTF-8");
    KT_CHECK(held > 0, "nothing was ever held back");
    KT_CHECK(out_len == strlen(text) && memcmp(out, text, out_len) == 0, "stream decoded \"%.*s\"", (int)out_len,
             out);
    free(ids);

    /* 🍕 = F0 9F 8D 95 as four byte tokens: nothing until the last byte. */
    uint32_t table[256];
    gpt2_byte_table(table);
    const unsigned char pizza[4] = {0xF0, 0x9F, 0x8D, 0x95};
    struct kt_detok d = KT_DETOK_INIT;
    size_t cap = kt_detok_max_bytes(t), w = 0;
    char *buf = malloc(cap);
    kt_err err = {0};
    for (int i = 0; i < 4; i++) {
        char c[4];
        int32_t id = kt_token_find(t, c, kt_utf8_encode(table[pizza[i]], c));
        KT_CHECK(kt_detok_push(t, &d, id, false, buf, cap, &w, &err) == KT_OK, "%s", err.msg);
        KT_CHECK(i < 3 ? w == 0 : (w == 4 && memcmp(buf, pizza, 4) == 0), "byte %d of 🍕 wrote %zu bytes", i, w);
    }
    KT_CHECK(kt_detok_flush(&d, buf) == 0, "flush after a complete character writes nothing");

    /* an unfinished character at the end becomes one U+FFFD; one that cannot finish, at once */
    char c[4];
    int32_t f0 = kt_token_find(t, c, kt_utf8_encode(table[0xF0], c));
    int32_t x9f = kt_token_find(t, c, kt_utf8_encode(table[0x9F], c));
    int32_t a = kt_token_find(t, "a", 1);
    kt_detok_push(t, &d, f0, false, buf, cap, &w, &err);
    kt_detok_push(t, &d, x9f, false, buf, cap, &w, &err);
    KT_CHECK(w == 0 && d.n_held == 2, "F0 9F held");
    size_t fl = kt_detok_flush(&d, buf);
    KT_CHECK(fl == 3 && memcmp(buf, "\xEF\xBF\xBD", 3) == 0 && d.n_held == 0, "flush of F0 9F is one U+FFFD");
    kt_detok_push(t, &d, f0, false, buf, cap, &w, &err);
    kt_detok_push(t, &d, a, false, buf, cap, &w, &err);
    KT_CHECK(w == 4 && memcmp(buf, "\xEF\xBF\xBD" "a", 4) == 0, "F0 then 'a' is U+FFFD a");
    kt_detok_push(t, &d, x9f, false, buf, cap, &w, &err);
    KT_CHECK(w == 3 && memcmp(buf, "\xEF\xBF\xBD", 3) == 0 && d.n_held == 0, "a lone continuation byte is U+FFFD");
    KT_CHECK(kt_detok_push(t, &d, -1, false, buf, cap, &w, &err) == KT_ERR_INVALID, "bad id rejected");
    KT_CHECK(kt_detok_push(t, &d, a, false, buf, 2, &w, &err) == KT_ERR_INVALID, "small buffer rejected");
    free(buf);
}

/* ---- invalid input, empty input, errors ---------------------------------------------------------- */

static void invalid_utf8_never_fails(void)
{
    const struct kt_tokenizer *toks[2] = {deepseek_golden.tok, kimi_golden.tok};
    unsigned long long seed = 12345;
    for (int round = 0; round < 600; round++) {
        size_t len = kt_test_rand_u64(&seed) % 64;
        char text[64];
        for (size_t i = 0; i < len; i++) {
            unsigned long long r = kt_test_rand_u64(&seed);
            /* mostly bytes that make (and break) multi-byte sequences */
            static const unsigned char pool[] = {0x80, 0xBF, 0xC0, 0xC2, 0xDF, 0xE0, 0xE4, 0xED, 0xEF, 0xF0,
                                                 0xF4, 0xF5, 0xFF, 0x9F, 0xA0, 0x8F, 'a', ' ', '\n', '<'};
            text[i] = (char)(r % 3 ? pool[(r >> 8) % sizeof pool] : (r >> 16) & 0xFF);
        }
        char clean[3 * 64];
        size_t clean_len = kt_utf8_sanitize(text, len, clean);
        KT_CHECK(kt_utf8_valid(clean, clean_len), "sanitize made invalid UTF-8");
        for (int k = 0; k < 2; k++) {
            if (!toks[k])
                continue;
            int32_t *ids = NULL;
            size_t n = 0, out_len = 0;
            char *out = NULL;
            kt_err err = {0};
            KT_CHECK(kt_tokenize(toks[k], text, len, true, true, &ids, &n, &err) == KT_OK, "%s", err.msg);
            for (size_t i = 0; i < n; i++)
                KT_CHECK(ids[i] >= 0 && ids[i] < kt_tokenizer_n_vocab(toks[k]), "id out of range");
            KT_CHECK(kt_detokenize(toks[k], ids, n, false, &out, &out_len, &err) == KT_OK, "%s", err.msg);
            KT_CHECK(out_len == clean_len && memcmp(out, clean, clean_len) == 0,
                     "invalid input must decode to its U+FFFD substitution");
            free(ids);
            free(out);
        }
    }
}

static void utf8_decoder_follows_the_standard(void)
{
    static const struct {
        const char *bytes;
        enum kt_utf8_result r;
        size_t len;
        uint32_t cp;
    } cases[] = {
        {"A", KT_UTF8_OK, 1, 'A'},
        {"\xC3\xA9", KT_UTF8_OK, 2, 0xE9},
        {"\xE4\xB8\xAD", KT_UTF8_OK, 3, 0x4E2D},
        {"\xF0\x9F\x8D\x95", KT_UTF8_OK, 4, 0x1F355},
        {"\xF4\x8F\xBF\xBF", KT_UTF8_OK, 4, 0x10FFFF},
        {"\xC0\xAF", KT_UTF8_INVALID, 1, 0xFFFD},     /* overlong lead */
        {"\xE0\x80\xAF", KT_UTF8_INVALID, 1, 0xFFFD}, /* overlong: E0 needs A0..BF */
        {"\xED\xA0\x80", KT_UTF8_INVALID, 1, 0xFFFD}, /* surrogate */
        {"\xF4\x90\x80\x80", KT_UTF8_INVALID, 1, 0xFFFD},
        {"\xE4\xB8" "A", KT_UTF8_INVALID, 2, 0xFFFD}, /* maximal subpart of two bytes */
        {"\xF0\x9F\x8D" "A", KT_UTF8_INVALID, 3, 0xFFFD},
        {"\xE4\xB8", KT_UTF8_TRUNCATED, 2, 0xFFFD},
        {"\x80", KT_UTF8_INVALID, 1, 0xFFFD},
        {"\xFF", KT_UTF8_INVALID, 1, 0xFFFD},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        size_t len;
        uint32_t cp;
        enum kt_utf8_result r =
            kt_utf8_next((const unsigned char *)cases[i].bytes, strlen(cases[i].bytes), &len, &cp);
        KT_CHECK(r == cases[i].r && len == cases[i].len && cp == cases[i].cp, "case %zu: %d %zu U+%04X", i, r, len,
                 cp);
    }
    char out[16];
    size_t n = kt_utf8_sanitize("a\xE4\xB8" "b\xF0", 5, out);
    KT_CHECK(n == 8 && memcmp(out, "a\xEF\xBF\xBD" "b\xEF\xBF\xBD", 8) == 0, "sanitize");
}

static void empty_text_gives_no_tokens(void)
{
    const struct kt_tokenizer *t = kimi_golden.tok;
    if (!t)
        return;
    int32_t *ids = (int32_t *)&ids;
    size_t n = 99;
    kt_err err = {0};
    KT_CHECK(kt_tokenize(t, "", 0, true, true, &ids, &n, &err) == KT_OK && n == 0 && ids == NULL, "empty text");
    KT_CHECK(kt_tokenize(t, NULL, 0, false, false, &ids, &n, &err) == KT_OK && n == 0, "NULL text of length 0");
    KT_CHECK(kt_tokenize(t, NULL, 3, false, false, &ids, &n, &err) == KT_ERR_INVALID, "NULL text of length 3");
    char *out = NULL;
    size_t len = 1;
    KT_CHECK(kt_detokenize(t, NULL, 0, true, &out, &len, &err) == KT_OK && len == 0 && out && out[0] == 0,
             "empty decode");
    free(out);
    int32_t bad = kt_tokenizer_n_vocab(t);
    KT_CHECK(kt_detokenize(t, &bad, 1, true, &out, &len, &err) == KT_ERR_INVALID, "out of range id rejected");
}

static void unknown_formats_are_refused_by_name(void)
{
    const char *tokens[] = {"a", "b", "ab"};
    const int32_t types[] = {1, 1, 1};
    const char *merges[] = {"a b"};
    struct vocab_spec v = {"gpt2", "qwen35", 3, tokens, types, merges, 1, -1, -1, -1, false};
    struct kt_tokenizer *t = NULL;
    kt_err err = {0};
    KT_CHECK(build_tokenizer(&v, &t, &err) == KT_ERR_UNSUPPORTED && strstr(err.msg, "qwen35"),
             "unknown pre-tokenizer: %s", err.msg);
    v.pre = "gpt2";
    v.model = "llama";
    KT_CHECK(build_tokenizer(&v, &t, &err) == KT_ERR_UNSUPPORTED && strstr(err.msg, "llama"), "spm model: %s",
             err.msg);
    v.model = "gpt2";
    const char *bad_merges[] = {"ab"};
    v.merges = bad_merges;
    KT_CHECK(build_tokenizer(&v, &t, &err) == KT_ERR_FORMAT, "merge without a space: %s", err.msg);
    v.merges = merges;
    KT_CHECK(build_tokenizer(&v, &t, &err) == KT_OK, "%s", err.msg);
    int32_t *ids;
    size_t n;
    tokenize_ok(t, "abab a", false, false, &ids, &n); /* gpt2: "abab" " a"; bytes ' ' missing -> dropped */
    KT_CHECK(n == 3 && ids[0] == 2 && ids[1] == 2 && ids[2] == 0, "gpt2 pre-tokenizer with merges: %zu ids", n);
    free(ids);
    kt_tokenizer_destroy(t);
}

/* A bad token type or merge found after the loaders' scratch buffers were
 * grown is refused by name; under LSan (the sanitizer build) a buffer left
 * behind on that return fails this test at exit. */
static void bad_tokens_and_merges_are_refused_without_leaks(void)
{
    const char *tokens[] = {"a", "b", "ab", "c", "d"};
    const int32_t bad_type[] = {1, 1, 1, 1, 9}, negative_type[] = {1, 1, -1, 1, 1}, types[] = {1, 1, 1, 1, 1};
    const char *merges[] = {"a b"}, *bad_merges[] = {"a b", "c d", "cd"};
    struct vocab_spec v = {"gpt2", "gpt2", 5, tokens, bad_type, merges, 1, -1, -1, -1, false};
    struct kt_tokenizer *t = NULL;
    kt_err err = {0};
    KT_CHECK(build_tokenizer(&v, &t, &err) == KT_ERR_FORMAT && t == NULL &&
                 strstr(err.msg, "token 4 has type 9 in tokenizer.ggml.token_type"),
             "type 9: %s", err.msg);
    v.types = negative_type;
    KT_CHECK(build_tokenizer(&v, &t, &err) == KT_ERR_FORMAT && t == NULL && strstr(err.msg, "token 2 has type -1"),
             "type -1: %s", err.msg);
    v.types = types;
    v.merges = bad_merges;
    v.n_merges = 3;
    KT_CHECK(build_tokenizer(&v, &t, &err) == KT_ERR_FORMAT && t == NULL &&
                 strstr(err.msg, "merge 2 (\"cd\") of tokenizer.ggml.merges has no space"),
             "third merge without a space: %s", err.msg);
    v.n_merges = 2;
    KT_CHECK(build_tokenizer(&v, &t, &err) == KT_OK, "the first two merges load: %s", err.msg);
    kt_tokenizer_destroy(t);
}

/* With no merges, a pair merges iff its concatenation is a token, lowest id
 * first; a whole piece that is a token is taken as is (tiktoken). */
static void rank_merging_follows_tiktoken(void)
{
    /* "abcd" is reachable only by looking the whole piece up: no pair of its parts is a token */
    const char *tokens[] = {"a", "b", "c", "d", "bc", "ab", "abcd", "cd"};
    const int32_t types[] = {1, 1, 1, 1, 1, 1, 1, 1};
    struct vocab_spec v = {"gpt2", "gpt2", 8, tokens, types, NULL, 0, -1, -1, -1, false};
    struct kt_tokenizer *t = NULL;
    kt_err err = {0};
    KT_CHECK(build_tokenizer(&v, &t, &err) == KT_OK, "%s", err.msg);
    if (!t)
        return;
    int32_t *ids;
    size_t n;
    tokenize_ok(t, "abcd", false, false, &ids, &n);
    KT_CHECK(n == 1 && ids[0] == 6, "whole piece: %zu ids", n);
    free(ids);
    tokenize_ok(t, "abc", false, false, &ids, &n); /* bc (4) ranks before ab (5): a + bc */
    KT_CHECK(n == 2 && ids[0] == 0 && ids[1] == 4, "abc -> a bc, got %zu ids", n);
    free(ids);
    tokenize_ok(t, "abcdab", false, false, &ids, &n); /* bc, then cd is gone; a bc d ab */
    KT_CHECK(n == 4 && ids[0] == 0 && ids[1] == 4 && ids[2] == 3 && ids[3] == 5, "abcdab: %zu ids", n);
    free(ids);
    kt_tokenizer_destroy(t);
}

/* ---- kt-synth's vocabularies ------------------------------------------------------------------ */

static void synth_vocabulary(const char *preset, const char *pre, bool add_bos)
{
    const char *path = kt_test_path(preset);
    int rc = kt_test_system("%s --preset %s -q -o %s", kt_test_tool("kt-synth"), preset, path);
    KT_CHECK(rc == 0, "kt-synth --preset %s exited %d (is it built?)", preset, rc);
    if (rc != 0)
        return;
    struct kt_gguf *g = NULL;
    struct kt_tokenizer *t = NULL;
    kt_err err = {0};
    KT_CHECK(kt_gguf_open(path, &g, &err) == KT_OK, "%s", err.msg);
    KT_CHECK(g && kt_tokenizer_create(g, &t, &err) == KT_OK, "%s: %s", preset, err.msg);
    kt_gguf_close(g);
    unlink(path);
    if (!t)
        return;
    KT_CHECK(strcmp(kt_tokenizer_pre(t), pre) == 0, "%s: pre %s", preset, kt_tokenizer_pre(t));
    KT_CHECK(kt_tokenizer_add_bos(t) == add_bos, "%s: add_bos", preset);
    static const char *const texts[] = {
        "The quick brown fox jumps over the lazy dog. It's 12345 o'clock!\n\tdef f(x): return x ** 2",
        "人工智能正在改变世界。日本語のテキスト、カタカナ。안녕하세요 세계! Привет, мир. café naïve",
        "emoji 👨‍👩‍👧‍👦🍕 and   spaces\r\n\r\n   helloWorld HTTPServer",
    };
    size_t total_bytes = 0, total_ids = 0;
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
        int32_t *ids;
        size_t n, out_len;
        char *out = NULL;
        tokenize_ok(t, texts[i], true, true, &ids, &n);
        KT_CHECK(!add_bos || (n > 0 && ids[0] == kt_tokenizer_bos(t)), "%s: BOS first", preset);
        KT_CHECK(kt_detokenize(t, ids, n, false, &out, &out_len, &err) == KT_OK && strcmp(out, texts[i]) == 0,
                 "%s: round trip of text %zu gave \"%s\"", preset, i, out ? out : "");
        total_bytes += strlen(texts[i]);
        total_ids += n;
        free(out);
        free(ids);
    }
    KT_CHECK(total_ids * 5 < total_bytes * 4, "%s: merges barely applied (%zu ids for %zu bytes)", preset, total_ids,
             total_bytes);
    /* <think>: USER_DEFINED in DeepSeek (always parsed), CONTROL in Kimi */
    int32_t think = kt_token_find(t, "<think>", 7);
    KT_CHECK(think >= 0, "%s: <think> exists", preset);
    int32_t *ids;
    size_t n;
    tokenize_ok(t, "a<think>b", false, false, &ids, &n);
    bool user_defined = kt_token_type(t, think) == KT_TOK_USER_DEFINED;
    KT_CHECK(contains(ids, n, think) == user_defined, "%s: <think> parsing without parse_special", preset);
    free(ids);
    int32_t eos = kt_tokenizer_eos(t);
    KT_CHECK(eos >= 0 && kt_token_is_eog(t, eos), "%s: EOS is EOG", preset);
    kt_tokenizer_destroy(t);
}

static void synth_vocabularies_load_and_round_trip(void)
{
    synth_vocabulary("tiny", "kimi-k2", false);
    synth_vocabulary("tiny-v3", "deepseek-v3", true);
}

/* ---- the Unicode tables against the UCD files ------------------------------------------------ */

static bool ucd_ranges(const char *file, void (*fn)(uint32_t lo, uint32_t hi, const char *value, void *ctx),
                       void *ctx)
{
    char path[512];
    snprintf(path, sizeof path, "/usr/share/unicode/%s", file);
    FILE *f = fopen(path, "r");
    if (!f)
        return false;
    char line[1024];
    while (fgets(line, sizeof line, f)) {
        unsigned lo, hi;
        char value[64];
        if (sscanf(line, "%x..%x ; %63s", &lo, &hi, value) == 3 ||
            (sscanf(line, "%x ; %63s", &lo, value) == 2 && (hi = lo, 1)))
            fn(lo, hi, value, ctx);
    }
    fclose(f);
    return true;
}

static const char *const cat_names[KT_UCAT_COUNT] = {
    "Cn", "Lu", "Ll", "Lt", "Lm", "Lo", "Mn", "Mc", "Me", "Nd", "Nl", "No", "Pc", "Pd", "Ps",
    "Pe", "Pi", "Pf", "Po", "Sm", "Sc", "Sk", "So", "Zs", "Zl", "Zp", "Cc", "Cf", "Cs", "Co",
};

static void check_category(uint32_t lo, uint32_t hi, const char *value, void *ctx)
{
    size_t *bad = ctx;
    for (uint32_t cp = lo; cp <= hi && cp <= KT_UNICODE_MAX; cp++)
        if (strcmp(cat_names[kt_unicode_cat(cp)], value) != 0 && (*bad)++ < 5)
            fprintf(stderr, "  U+%04X: table %s, UCD %s\n", cp, cat_names[kt_unicode_cat(cp)], value);
}

struct flag_ctx {
    const char *value;
    uint8_t *set; /* [0x110000] */
};

static void collect_flag(uint32_t lo, uint32_t hi, const char *value, void *ctx)
{
    struct flag_ctx *fc = ctx;
    if (strcmp(value, fc->value) == 0)
        for (uint32_t cp = lo; cp <= hi && cp <= KT_UNICODE_MAX; cp++)
            fc->set[cp] = 1;
}

static void unicode_tables_match_the_ucd(void)
{
    size_t bad = 0;
    if (!ucd_ranges("extracted/DerivedGeneralCategory.txt", check_category, &bad)) {
        printf("  (no /usr/share/unicode: apt-get install unicode-data to check the tables)\n");
        return;
    }
    KT_CHECK(bad == 0, "%zu code points with the wrong category", bad);
    uint8_t *set = calloc(KT_UNICODE_MAX + 1, 1);
    struct {
        const char *file, *value;
        unsigned flag;
    } flags[] = {{"PropList.txt", "White_Space", KT_UPROP_WHITE_SPACE}, {"Scripts.txt", "Han", KT_UPROP_HAN}};
    for (size_t k = 0; k < 2; k++) {
        memset(set, 0, KT_UNICODE_MAX + 1);
        struct flag_ctx fc = {flags[k].value, set};
        KT_CHECK(ucd_ranges(flags[k].file, collect_flag, &fc), "%s", flags[k].file);
        size_t wrong = 0;
        for (uint32_t cp = 0; cp <= KT_UNICODE_MAX; cp++)
            wrong += !!(kt_unicode_props(cp) & flags[k].flag) != set[cp];
        KT_CHECK(wrong == 0, "%s: %zu code points wrong", flags[k].value, wrong);
    }
    free(set);
    KT_CHECK(kt_unicode_contraction_letter(0x17F) == 's' && kt_unicode_contraction_letter('S') == 's' &&
                 kt_unicode_contraction_letter('L') == 'l' && kt_unicode_contraction_letter('E') == 'e' &&
                 kt_unicode_contraction_letter('x') == 0 &&
                 kt_unicode_contraction_letter(0x212A) == 0,
             "contraction letters");
    KT_CHECK((kt_unicode_props(0x1C) & KT_UPROP_PY_SPACE) && !(kt_unicode_props(0x1C) & KT_UPROP_WHITE_SPACE) &&
                 (kt_unicode_props(0x85) & KT_UPROP_PY_SPACE) && !(kt_unicode_props(0x200B) & KT_UPROP_PY_SPACE),
             "Python isspace");
}

/* ---- speed ----------------------------------------------------------------------------------- */

static void tokenizing_a_megabyte_is_fast(void)
{
    const struct golden *gds[2] = {&deepseek_golden, &kimi_golden};
    const char *names[2] = {"deepseek-v3", "kimi-k2"};
    /* 1 MiB of the golden corpus's ordinary texts, and 1 MiB with no spaces at
     * all (a quarter of that, against the same time per MiB, under sanitizers) */
    const size_t size = SLOWDOWN > 1 ? 1u << 18 : 1u << 20;
    size_t cap = size + 4096, len = 0;
    char *text = malloc(cap);
    bool full = !deepseek_golden.json;
    while (!full) {
        size_t i;
        const json_t *c;
        json_array_foreach(json_object_get(deepseek_golden.json, "cases"), i, c)
        {
            if (!json_object_get(c, "text"))
                continue;
            size_t n = json_string_length(json_object_get(c, "text"));
            if (len >= size || len + n > cap) {
                full = true;
                break;
            }
            memcpy(text + len, json_string_value(json_object_get(c, "text")), n);
            len += n;
        }
    }
    char *word = malloc(size);
    for (size_t i = 0; i < size; i++)
        word[i] = "abcdefghij"[i % 7];
    for (int k = 0; k < 2; k++) {
        if (!gds[k]->tok)
            continue;
        for (int which = 0; which < 2; which++) {
            const char *s = which ? word : text;
            size_t n = which ? size : len, n_ids, out_len;
            int32_t *ids;
            char *out;
            kt_err err = {0};
            double t0 = now_s();
            kt_status st = kt_tokenize(gds[k]->tok, s, n, false, true, &ids, &n_ids, &err);
            double dt = now_s() - t0;
            KT_CHECK(st == KT_OK, "%s", err.msg);
            printf("  %s: %.2f MiB %s in %.3f s (%.1f MiB/s, %zu tokens)\n", names[k], (double)n / (1 << 20),
                   which ? "without spaces" : "of corpus text", dt, (double)n / (1 << 20) / dt, n_ids);
            double per_mib = dt * (1 << 20) / (double)n;
            KT_CHECK(per_mib < 1.0 * SLOWDOWN, "%s: %.2f s per MiB", names[k], per_mib);
            KT_CHECK(kt_detokenize(gds[k]->tok, ids, n_ids, true, &out, &out_len, &err) == KT_OK && out_len == n &&
                         memcmp(out, s, n) == 0,
                     "%s: the text does not round-trip", names[k]);
            free(out);
            free(ids);
        }
    }
    free(word);
    free(text);
}

int main(void)
{
    load_deepseek();
    load_kimi();
    KT_RUN(golden_deepseek_v3_matches_hf_tokenizer);
    KT_RUN(golden_kimi_k2_matches_tiktoken);
    KT_RUN(kimi_k2_ignores_merges_in_the_file);
    KT_RUN(round_trip_restores_every_golden_text);
    KT_RUN(special_tokens_parse_only_when_asked);
    KT_RUN(bos_is_added_as_the_file_says);
    KT_RUN(end_of_generation_ids);
    KT_RUN(byte_tokens_decode_to_their_byte);
    KT_RUN(streaming_decoder_holds_back_split_characters);
    KT_RUN(invalid_utf8_never_fails);
    KT_RUN(utf8_decoder_follows_the_standard);
    KT_RUN(empty_text_gives_no_tokens);
    KT_RUN(unknown_formats_are_refused_by_name);
    KT_RUN(bad_tokens_and_merges_are_refused_without_leaks);
    KT_RUN(rank_merging_follows_tiktoken);
    KT_RUN(synth_vocabularies_load_and_round_trip);
    KT_RUN(unicode_tables_match_the_ucd);
    KT_RUN(tokenizing_a_megabyte_is_fast);
    golden_free(&deepseek_golden);
    golden_free(&kimi_golden);
    return kt_test_finish();
}
