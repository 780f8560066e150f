/*
 * test_synth_vocab.c - the synthetic tokenizer kt-synth embeds: deterministic
 * BPE training, GPT-2 byte tokens, merges that compose and shorten text, the
 * families' special tokens and templates, the pre-tokenizer against the
 * reference splits, and every tokenizer key through a GGUF write and read.
 *
 * The checks re-derive what they check (the byte table, a BPE encoder) from
 * scratch instead of calling the code under test; they must never be
 * loosened to match a changed vocabulary without understanding why.
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "corpus.h"
#include "gguf.h"
#include "templates.h"
#include "testlib.h"
#include "vocab.h"

#define DEFAULT_MERGES 700u

static const enum kt_synth_family families[] = {KT_SYNTH_KIMI, KT_SYNTH_DEEPSEEK};
static const char *const family_names[] = {"kimi", "deepseek"};

static bool build(enum kt_synth_family f, uint32_t n_merges, struct kt_synth_vocab *v)
{
    kt_err err = {0};
    kt_status st = kt_synth_vocab_build(f, n_merges, v, &err);
    KT_CHECK(st == KT_OK, "build %s: %s", family_names[f], err.msg);
    return st == KT_OK;
}

/* Id of the token with this text, or -1 (linear: vocabularies here are ~1k tokens). */
static int64_t find_token(const struct kt_synth_vocab *v, const char *text)
{
    for (uint32_t i = 0; i < v->n_tokens; i++)
        if (strcmp(v->tokens[i], text) == 0)
            return i;
    return -1;
}

/* Id of the first byte token: DeepSeek puts BOS, EOS and pad before them. */
static uint32_t first_byte_id(enum kt_synth_family f) { return f == KT_SYNTH_DEEPSEEK ? 3 : 0; }

/* GPT-2's bytes_to_unicode, written out the way GPT-2 builds it. */
static void gpt2_byte_table(uint32_t table[256])
{
    bool printable[256] = {false};
    for (int b = '!'; b <= '~'; b++)
        printable[b] = true;
    for (int b = 0xA1; b <= 0xAC; b++)
        printable[b] = true;
    for (int b = 0xAE; b <= 0xFF; b++)
        printable[b] = true;
    uint32_t next = 256;
    for (int b = 0; b < 256; b++)
        table[b] = printable[b] ? (uint32_t)b : next++;
}

static void utf8_put(uint32_t c, char *out)
{
    if (c < 0x80) {
        out[0] = (char)c, out[1] = 0;
    } else if (c < 0x800) {
        out[0] = (char)(0xC0 | (c >> 6)), out[1] = (char)(0x80 | (c & 0x3F)), out[2] = 0;
    } else {
        out[0] = (char)(0xE0 | (c >> 12)), out[1] = (char)(0x80 | ((c >> 6) & 0x3F));
        out[2] = (char)(0x80 | (c & 0x3F)), out[3] = 0;
    }
}

/* ---- determinism and shape ---------------------------------------------------------- */

static void vocab_build_is_deterministic(void)
{
    for (int fi = 0; fi < 2; fi++) {
        struct kt_synth_vocab a, b;
        if (!build(families[fi], DEFAULT_MERGES, &a))
            continue;
        if (!build(families[fi], DEFAULT_MERGES, &b)) {
            kt_synth_vocab_free(&a);
            continue;
        }
        KT_CHECK(a.n_tokens == b.n_tokens && a.n_merges == b.n_merges, "%s: sizes differ", family_names[fi]);
        bool same = a.n_tokens == b.n_tokens && a.n_merges == b.n_merges;
        for (uint32_t i = 0; same && i < a.n_tokens; i++)
            same = strcmp(a.tokens[i], b.tokens[i]) == 0 && a.token_types[i] == b.token_types[i];
        for (uint32_t i = 0; same && i < a.n_merges; i++)
            same = strcmp(a.merges[i], b.merges[i]) == 0;
        KT_CHECK(same, "%s: two builds differ", family_names[fi]);
        KT_CHECK(a.bos_id == b.bos_id && a.eos_id == b.eos_id && a.pad_id == b.pad_id, "%s: ids differ",
                 family_names[fi]);
        kt_synth_vocab_free(&a);
        kt_synth_vocab_free(&b);
    }
}

static void default_vocabulary_has_700_merges_and_about_1k_tokens(void)
{
    for (int fi = 0; fi < 2; fi++) {
        struct kt_synth_vocab v;
        if (!build(families[fi], DEFAULT_MERGES, &v))
            continue;
        uint32_t n_specials = families[fi] == KT_SYNTH_DEEPSEEK ? 20 : 19;
        KT_CHECK(v.n_merges == DEFAULT_MERGES, "%s: %u merges", family_names[fi], v.n_merges);
        KT_CHECK(v.n_tokens == 256 + v.n_merges + n_specials, "%s: %u tokens", family_names[fi], v.n_tokens);
        kt_synth_vocab_free(&v);
    }
}

static void exhausted_text_gives_fewer_merges(void)
{
    struct kt_synth_vocab v;
    if (!build(KT_SYNTH_KIMI, 50000, &v))
        return;
    KT_CHECK(v.n_merges > DEFAULT_MERGES && v.n_merges < 50000, "%u merges from the embedded text", v.n_merges);
    KT_CHECK(v.n_tokens == 256 + v.n_merges + 19, "%u tokens", v.n_tokens);
    kt_synth_vocab_free(&v);

    if (!build(KT_SYNTH_DEEPSEEK, 0, &v))
        return;
    KT_CHECK(v.n_merges == 0 && v.n_tokens == 3 + 256 + 17, "no merges: %u merges %u tokens", v.n_merges,
             v.n_tokens);
    kt_synth_vocab_free(&v);
}

static void bad_arguments_are_rejected(void)
{
    struct kt_synth_vocab v;
    kt_err err = {0};
    KT_CHECK(kt_synth_vocab_build((enum kt_synth_family)7, 10, &v, &err) == KT_ERR_INVALID, "unknown family");
    KT_CHECK(strstr(err.msg, "family") != NULL, "message: %s", err.msg);
    KT_CHECK(kt_synth_vocab_build(KT_SYNTH_KIMI, 10, NULL, &err) == KT_ERR_INVALID, "no output");
    KT_CHECK(kt_synth_vocab_build(KT_SYNTH_KIMI, 1u << 30, &v, &err) == KT_ERR_INVALID, "absurd merge count");
    KT_CHECK(kt_synth_vocab_write(NULL, &v, &err) == KT_ERR_INVALID, "no writer");
    KT_CHECK(kt_synth_chat_template((enum kt_synth_family)7) == NULL, "template of an unknown family");
}

/* ---- byte tokens, merges, uniqueness ---------------------------------------------------- */

static void byte_tokens_use_gpt2_mapping(void)
{
    uint32_t table[256];
    gpt2_byte_table(table);
    KT_CHECK(table[' '] == 0x120 && table['\n'] == 0x10A && table['\t'] == 0x109 && table[0xAD] == 0x143,
             "the test's own table is wrong");
    for (int fi = 0; fi < 2; fi++) {
        struct kt_synth_vocab v;
        if (!build(families[fi], DEFAULT_MERGES, &v))
            continue;
        uint32_t base = first_byte_id(families[fi]);
        int bad = 0;
        for (int b = 0; b < 256; b++) {
            char want[4];
            utf8_put(table[b], want);
            if (strcmp(v.tokens[base + b], want) != 0 || v.token_types[base + b] != KT_TOKEN_NORMAL)
                bad++;
        }
        KT_CHECK(bad == 0, "%s: %d byte tokens wrong", family_names[fi], bad);
        KT_CHECK(strcmp(v.tokens[base + ' '], "\xC4\xA0") == 0, "%s: space is %s", family_names[fi],
                 v.tokens[base + ' ']);
        KT_CHECK(strcmp(v.tokens[base + '\n'], "\xC4\x8A") == 0, "%s: newline", family_names[fi]);
        KT_CHECK(strcmp(v.tokens[base + 0xAD], "\xC5\x83") == 0, "%s: 0xAD", family_names[fi]);
        KT_CHECK(strcmp(v.tokens[base + 'A'], "A") == 0 && strcmp(v.tokens[base + 0xE9], "\xC3\xA9") == 0,
                 "%s: printable bytes map to themselves", family_names[fi]);
        kt_synth_vocab_free(&v);
    }
}

static void merges_join_two_tokens_into_a_later_one(void)
{
    for (int fi = 0; fi < 2; fi++) {
        struct kt_synth_vocab v;
        if (!build(families[fi], DEFAULT_MERGES, &v))
            continue;
        uint32_t base = first_byte_id(families[fi]);
        int bad = 0;
        for (uint32_t r = 0; r < v.n_merges; r++) {
            const char *m = v.merges[r];
            const char *sp = m[0] ? strchr(m + 1, ' ') : NULL; /* llama.cpp: find(' ', 1) */
            if (!sp || strchr(sp + 1, ' ')) {
                bad++;
                continue;
            }
            char left[256], right[256], joined[512];
            size_t nl = (size_t)(sp - m);
            if (nl >= sizeof left || strlen(sp + 1) >= sizeof right) {
                bad++;
                continue;
            }
            memcpy(left, m, nl);
            left[nl] = 0;
            strcpy(right, sp + 1);
            snprintf(joined, sizeof joined, "%s%s", left, right);
            int64_t il = find_token(&v, left), ir = find_token(&v, right), ij = find_token(&v, joined);
            if (il < 0 || ir < 0 || ij < 0 || ij <= il || ij <= ir || ij != (int64_t)(base + 256 + r) ||
                v.token_types[ij] != KT_TOKEN_NORMAL) {
                if (bad++ < 3)
                    fprintf(stderr, "  merge %u \"%s\": ids %lld %lld -> %lld\n", r, m, (long long)il,
                            (long long)ir, (long long)ij);
            }
        }
        KT_CHECK(bad == 0, "%s: %d of %u merges do not compose", family_names[fi], bad, v.n_merges);
        kt_synth_vocab_free(&v);
    }
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static void token_texts_are_unique(void)
{
    for (int fi = 0; fi < 2; fi++) {
        struct kt_synth_vocab v;
        if (!build(families[fi], 50000, &v)) /* every merge the text allows: the most chances to collide */
            continue;
        char **sorted = malloc(v.n_tokens * sizeof *sorted);
        memcpy(sorted, v.tokens, v.n_tokens * sizeof *sorted);
        qsort(sorted, v.n_tokens, sizeof *sorted, cmp_str);
        int dups = 0, empty = 0;
        for (uint32_t i = 0; i < v.n_tokens; i++) {
            if (!sorted[i][0])
                empty++;
            if (i && strcmp(sorted[i - 1], sorted[i]) == 0)
                dups++;
        }
        KT_CHECK(dups == 0 && empty == 0, "%s: %d duplicate and %d empty texts", family_names[fi], dups, empty);
        free(sorted);
        kt_synth_vocab_free(&v);
    }
}

/* ---- special tokens and templates ------------------------------------------------------ */

static void check_special(const struct kt_synth_vocab *v, const char *text, int32_t type, const char *family)
{
    int64_t id = find_token(v, text);
    KT_CHECK(id >= 0, "%s: %s missing", family, text);
    if (id >= 0)
        KT_CHECK(v->token_types[id] == type, "%s: %s has type %d, want %d", family, text, v->token_types[id],
                 type);
}

static void deepseek_specials_have_real_ids_and_types(void)
{
    struct kt_synth_vocab v;
    if (!build(KT_SYNTH_DEEPSEEK, DEFAULT_MERGES, &v))
        return;
    KT_CHECK(strcmp(v.tokens[0], "<｜begin▁of▁sentence｜>") == 0 && v.bos_id == 0, "BOS is id 0");
    KT_CHECK(strcmp(v.tokens[1], "<｜end▁of▁sentence｜>") == 0 && v.eos_id == 1, "EOS is id 1");
    KT_CHECK(strcmp(v.tokens[2], "<｜▁pad▁｜>") == 0, "pad token is id 2");
    KT_CHECK(v.pad_id == 1, "padding id %lld (the EOS, as converted DeepSeek GGUFs carry)", (long long)v.pad_id);
    for (int i = 0; i < 3; i++)
        KT_CHECK(v.token_types[i] == KT_TOKEN_CONTROL, "id %d is CONTROL", i);
    const char *control[] = {"<｜User｜>", "<｜Assistant｜>", "<|EOT|>", "<｜tool▁calls▁begin｜>",
                             "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>",
                             "<｜tool▁outputs▁begin｜>", "<｜tool▁outputs▁end｜>", "<｜tool▁output▁begin｜>",
                             "<｜tool▁output▁end｜>", "<｜tool▁sep｜>", "<｜fim▁hole｜>", "<｜fim▁begin｜>",
                             "<｜fim▁end｜>"};
    for (size_t i = 0; i < sizeof control / sizeof control[0]; i++)
        check_special(&v, control[i], KT_TOKEN_CONTROL, "deepseek");
    check_special(&v, "<think>", KT_TOKEN_USER_DEFINED, "deepseek");
    check_special(&v, "</think>", KT_TOKEN_USER_DEFINED, "deepseek");
    KT_CHECK(find_token(&v, "<think>") == 3 + 256 + (int64_t)v.n_merges, "specials follow the merged tokens");
    KT_CHECK(v.add_bos, "DeepSeek adds BOS");
    KT_CHECK(strcmp(v.pre, "deepseek-v3") == 0, "pre %s", v.pre);
    KT_CHECK(v.chat_template == kt_synth_chat_template(KT_SYNTH_DEEPSEEK), "template");
    kt_synth_vocab_free(&v);
}

static void kimi_specials_are_control_after_the_merges(void)
{
    struct kt_synth_vocab v;
    if (!build(KT_SYNTH_KIMI, DEFAULT_MERGES, &v))
        return;
    const char *names[] = {"[BOS]", "[EOS]", "<|im_end|>", "<|im_user|>", "<|im_assistant|>",
                           "<|start_header_id|>", "<|end_header_id|>", "[EOT]", "<|im_system|>",
                           "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>", "<|tool_call_begin|>",
                           "<|tool_call_argument_begin|>", "<|tool_call_end|>", "<|im_middle|>", "<think>",
                           "</think>", "[UNK]", "[PAD]"};
    uint32_t first = 256 + v.n_merges;
    for (uint32_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        KT_CHECK(find_token(&v, names[i]) == (int64_t)(first + i), "%s at id %lld, want %u", names[i],
                 (long long)find_token(&v, names[i]), first + i);
        check_special(&v, names[i], KT_TOKEN_CONTROL, "kimi");
    }
    KT_CHECK(v.bos_id == (uint32_t)find_token(&v, "[BOS]"), "bos id %u", v.bos_id);
    KT_CHECK(v.eos_id == (uint32_t)find_token(&v, "[EOS]"), "eos id %u", v.eos_id);
    KT_CHECK(v.pad_id == find_token(&v, "[PAD]"), "pad id %lld", (long long)v.pad_id);
    KT_CHECK(!v.add_bos, "Kimi adds no BOS");
    KT_CHECK(strcmp(v.pre, "kimi-k2") == 0, "pre %s", v.pre);
    KT_CHECK(strcmp(v.tokens[0], "\xC4\x80") == 0, "Kimi starts with the byte tokens (0x00 -> U+0100)");
    kt_synth_vocab_free(&v);
}

static void templates_carry_detection_markers(void)
{
    const char *kimi = kt_synth_chat_template(KT_SYNTH_KIMI);
    const char *ds = kt_synth_chat_template(KT_SYNTH_DEEPSEEK);
    KT_CHECK(kimi && strstr(kimi, "<|tool_calls_section_begin|>") && strstr(kimi, "<|tool_call_begin|>"),
             "Kimi-K2 markers");
    KT_CHECK(kimi && strstr(kimi, "You are Kimi, an AI assistant created by Moonshot AI.") &&
                 strstr(kimi, "<|im_system|>tool_declare<|im_middle|>{{ tools | tojson }}<|im_end|>"),
             "Kimi-K2-Instruct revision");
    KT_CHECK(kimi && !strstr(kimi, "bos_token"), "Kimi renders no BOS");
    KT_CHECK(ds && strstr(ds, "<｜tool▁calls▁begin｜>") && strstr(ds, "<｜tool▁sep｜>"), "DeepSeek markers");
    KT_CHECK(ds && strncmp(ds, "{% if not add_generation_prompt is defined %}", 45) == 0 &&
                 strstr(ds, "{{ bos_token }}"),
             "DeepSeek template opening");
    KT_CHECK(ds && !strstr(ds, "<｜tool▁call▁begin｜>'+ tool['function']['name'] + '<｜tool▁sep｜>'"),
             "not the V3.1 template");
    KT_CHECK(ds && strstr(ds, "'\n' + '```json' + '\n'"), "newlines inside Jinja strings are real newlines, as in the GGUF");
    KT_CHECK(ds && strstr(ds, "'<｜User｜>' + message['content'] + '<｜Assistant｜>'"), "the V3-0324 revision");
    KT_CHECK(ds && strlen(ds) == 3052, "DeepSeek template is %zu bytes, the copied text 3052", ds ? strlen(ds) : 0);
    KT_CHECK(ds && ds[strlen(ds) - 1] == '}' && kimi && kimi[strlen(kimi) - 1] == '}', "no trailing newline");

    /* Every marker a template emits is one special token of its family. */
    for (int fi = 0; fi < 2; fi++) {
        struct kt_synth_vocab v;
        if (!build(families[fi], 0, &v))
            continue;
        const char *t = v.chat_template, *open = fi == 0 ? "<|" : "<｜", *close = fi == 0 ? "|>" : "｜>";
        int markers = 0, missing = 0;
        for (const char *p = strstr(t, open); p; p = strstr(p + 1, open)) {
            const char *q = strstr(p + strlen(open), close);
            if (!q || q - p > 64)
                continue;
            char marker[80];
            size_t n = (size_t)(q - p) + strlen(close);
            memcpy(marker, p, n);
            marker[n] = 0;
            if (strncmp(marker, "<|media_", 8) == 0) /* image placeholders: not text tokens */
                continue;
            markers++;
            if (find_token(&v, marker) < 0) {
                missing++;
                fprintf(stderr, "  %s: %s is not a token\n", family_names[fi], marker);
            }
        }
        KT_CHECK(markers >= 10 && missing == 0, "%s: %d markers, %d missing", family_names[fi], markers, missing);
        kt_synth_vocab_free(&v);
    }
}

/* ---- the pre-tokenizer ----------------------------------------------------------------- */

struct joined {
    char buf[512];
    size_t used;
    int chunks;
};

/* Joins chunks with '|' so a split can be compared with one string. */
static void join_chunk(const char *chunk, size_t bytes, void *ctx)
{
    struct joined *j = ctx;
    if (j->chunks++ && j->used + 1 < sizeof j->buf)
        j->buf[j->used++] = '|';
    if (j->used + bytes < sizeof j->buf) {
        memcpy(j->buf + j->used, chunk, bytes);
        j->used += bytes;
    }
    j->buf[j->used] = 0;
}

static void expect_split(enum kt_synth_family f, const char *text, const char *want)
{
    struct joined j = {.used = 0, .chunks = 0};
    j.buf[0] = 0;
    kt_err err = {0};
    kt_status st = kt_synth_pretokenize(f, text, strlen(text), join_chunk, &j, &err);
    KT_CHECK(st == KT_OK && strcmp(j.buf, want) == 0, "%s: \"%s\" -> \"%s\", want \"%s\"", family_names[f], text,
             j.buf, want);
}

/* The rows of the published pre-tokenizers' split table (DeepSeek-V3 column: its three passes). */
static void pretokenizer_matches_reference_splits(void)
{
    expect_split(KT_SYNTH_KIMI, "helloWorld fooBar", "hello|World| foo|Bar");
    expect_split(KT_SYNTH_DEEPSEEK, "helloWorld fooBar", "helloWorld| fooBar");
    expect_split(KT_SYNTH_KIMI, "HTTPServer parseJSON", "HTTPServer| parse|JSON");
    expect_split(KT_SYNTH_DEEPSEEK, "HTTPServer parseJSON", "HTTPServer| parseJSON");
    expect_split(KT_SYNTH_KIMI, "時々 〇 日本語の テキスト", "時々| |〇| |日本語|の| テキスト");
    expect_split(KT_SYNTH_DEEPSEEK, "時々 〇 日本語の テキスト", "時|々| |〇| |日本語の| |テキスト");
    expect_split(KT_SYNTH_KIMI, "ªB x", "ª|B| x");
    expect_split(KT_SYNTH_DEEPSEEK, "ªB x", "ªB| x");
    expect_split(KT_SYNTH_KIMI, "नमस्ते दुनिया", "नमस्ते| दुनिया");
    expect_split(KT_SYNTH_DEEPSEEK, "नमस्ते दुनिया", "नमस्ते| दुनिया");
    expect_split(KT_SYNTH_KIMI, "I'LL go, they've  \n\n  x", "I'LL| go|,| they've|  \n\n| | x");
    expect_split(KT_SYNTH_DEEPSEEK, "I'LL go, they've  \n\n  x", "I|'LL| go|,| they|'ve|  \n\n| | x");
    expect_split(KT_SYNTH_KIMI, "12345 3.14159", "123|45| |3|.|141|59");
    expect_split(KT_SYNTH_DEEPSEEK, "12345 3.14159", "123|45| |3|.|141|59");
    expect_split(KT_SYNTH_KIMI, "Hello! 毕老师！1 + 1 = 2", "Hello|!| |毕老师|！|1| +| |1| =| |2");
    expect_split(KT_SYNTH_DEEPSEEK, "Hello! 毕老师！1 + 1 = 2", "Hello|!| |毕老师|！|1| +| |1| =| |2");
    /* Whitespace at the end of the text, CRLF, a tab-led word, a bad byte. */
    expect_split(KT_SYNTH_KIMI, "a \r\n\tb   ", "a| \r\n|\tb|   ");
    expect_split(KT_SYNTH_DEEPSEEK, "x\xFFy", "x|\xFF|y");
}

struct rejoin {
    const char *text;
    size_t pos;
    bool in_order;
};

static void rejoin_chunk(const char *chunk, size_t bytes, void *ctx)
{
    struct rejoin *r = ctx;
    if (chunk != r->text + r->pos || bytes == 0)
        r->in_order = false;
    r->pos += bytes;
}

static void pretokenizer_chunks_cover_the_corpus(void)
{
    size_t n;
    const char *text = kt_synth_corpus(&n);
    KT_CHECK(n > 10000 && strlen(text) == n, "corpus is %zu bytes", n);
    for (int fi = 0; fi < 2; fi++) {
        struct rejoin r = {text, 0, true};
        kt_err err = {0};
        KT_CHECK(kt_synth_pretokenize(families[fi], text, n, rejoin_chunk, &r, &err) == KT_OK, "%s", err.msg);
        KT_CHECK(r.in_order && r.pos == n, "%s: chunks tile the text (%zu of %zu bytes)", family_names[fi], r.pos,
                 n);
    }
}

/* ---- the merges are useful: a naive BPE encoder --------------------------------------- */

/* Encodes one chunk the slow, obvious way: byte-level symbols, then repeatedly
 * merge the adjacent pair of lowest rank.  Returns the token count, or -1 if a
 * final symbol is not a token. */
static int naive_encode(const struct kt_synth_vocab *v, const unsigned char *chunk, size_t bytes)
{
    uint32_t table[256];
    gpt2_byte_table(table);
    char sym[64][136]; /* a 64-byte chunk is at most 128 bytes of byte-level text */
    int n = 0;
    if (bytes > 64)
        return -1;
    for (size_t i = 0; i < bytes; i++)
        utf8_put(table[chunk[i]], sym[n++]);
    for (;;) {
        int best = -1;
        uint32_t best_rank = UINT32_MAX;
        for (int i = 0; i + 1 < n; i++) {
            char pair[2 * sizeof sym[0] + 2];
            snprintf(pair, sizeof pair, "%s %s", sym[i], sym[i + 1]);
            for (uint32_t r = 0; r < v->n_merges && r < best_rank; r++)
                if (strcmp(v->merges[r], pair) == 0) {
                    best_rank = r, best = i;
                    break;
                }
        }
        if (best < 0)
            break;
        size_t nl = strlen(sym[best]), nr = strlen(sym[best + 1]);
        if (nl + nr >= sizeof sym[0])
            return -1;
        memcpy(sym[best] + nl, sym[best + 1], nr + 1);
        memmove(sym[best + 1], sym[best + 2], (size_t)(n - best - 2) * sizeof sym[0]);
        n--;
    }
    for (int i = 0; i < n; i++)
        if (find_token(v, sym[i]) < 0)
            return -1;
    return n;
}

static bool ascii_letter(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }

static void merges_shorten_the_training_text(void)
{
    size_t n;
    const char *text = kt_synth_corpus(&n);
    for (int fi = 0; fi < 2; fi++) {
        struct kt_synth_vocab v;
        if (!build(families[fi], DEFAULT_MERGES, &v))
            continue;
        /* Chunks: ASCII words with their leading space, as both pre-tokenizers cut them. */
        size_t bytes = 0, words = 0;
        long tokens = 0;
        bool unknown = false;
        for (size_t i = 0; i < n && words < 400;) {
            if (!ascii_letter(text[i])) {
                i++;
                continue;
            }
            size_t start = (i > 0 && text[i - 1] == ' ') ? i - 1 : i, end = i;
            while (end < n && ascii_letter(text[end]))
                end++;
            int t = naive_encode(&v, (const unsigned char *)text + start, end - start);
            if (t < 0)
                unknown = true;
            tokens += t;
            bytes += end - start;
            words++;
            i = end;
        }
        KT_CHECK(!unknown, "%s: a chunk ended in a non-token", family_names[fi]);
        printf("  %s: %zu ASCII words, %zu bytes -> %ld tokens\n", family_names[fi], words, bytes, tokens);
        KT_CHECK(words == 400 && tokens * 20 < (long)bytes * 9, "%s: %zu words, %zu bytes -> %ld tokens",
                 family_names[fi], words, bytes, tokens);
        /* Frequent chunks of each script become one or two tokens. */
        struct {
            const char *chunk;
            int max_tokens;
        } cases[] = {{" the", 1}, {" keeper", 2}, {"数字", 2}, {"ます", 2}, {"습니다", 2}};
        for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
            int t = naive_encode(&v, (const unsigned char *)cases[c].chunk, strlen(cases[c].chunk));
            KT_CHECK(t >= 1 && t <= cases[c].max_tokens, "%s: \"%s\" -> %d tokens", family_names[fi],
                     cases[c].chunk, t);
        }
        kt_synth_vocab_free(&v);
    }
}

static double seconds_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void training_1000_merges_is_fast(void)
{
    struct kt_synth_vocab v;
    double t0 = seconds_now();
    bool ok = build(KT_SYNTH_DEEPSEEK, 1000, &v);
    double dt = seconds_now() - t0;
    printf("  1000-merge DeepSeek vocabulary: %u tokens in %.3f s\n", ok ? v.n_tokens : 0, dt);
    /* 0.3 s is the budget on a 2-core machine; 10x covers sanitizer builds. */
    KT_CHECK(dt < 3.0, "training took %.3f s", dt);
    if (ok)
        kt_synth_vocab_free(&v);
}

/* ---- through a GGUF file ---------------------------------------------------------------- */

static void check_string_array(const struct kt_gguf *g, const char *key, char *const *want, uint32_t n)
{
    const struct kt_gguf_kv *kv = kt_gguf_find_kv(g, key);
    KT_CHECK(kv && kv->value.type == KT_GGUF_ARRAY && kv->value.arr.elem_type == KT_GGUF_STRING &&
                 kv->value.arr.count == n,
             "%s: string array of %u", key, n);
    if (!kv || kv->value.type != KT_GGUF_ARRAY || kv->value.arr.elem_type != KT_GGUF_STRING ||
        kv->value.arr.count != n)
        return;
    int bad = 0;
    for (uint32_t i = 0; i < n; i++) {
        const struct kt_gguf_str *s = &kv->value.arr.items[i].str;
        if (s->len != strlen(want[i]) || memcmp(s->ptr, want[i], s->len) != 0)
            bad++;
    }
    KT_CHECK(bad == 0, "%s: %d entries differ", key, bad);
}

static void check_scalar(const struct kt_gguf *g, const char *key, enum kt_gguf_type type, int64_t want)
{
    const struct kt_gguf_kv *kv = kt_gguf_find_kv(g, key);
    KT_CHECK(kv && kv->value.type == type, "%s: type %d, want %d", key, kv ? (int)kv->value.type : -1, (int)type);
    if (!kv || kv->value.type != type)
        return;
    int64_t got = type == KT_GGUF_BOOL ? kv->value.b : (int64_t)kv->value.u32;
    KT_CHECK(got == want, "%s = %lld, want %lld", key, (long long)got, (long long)want);
}

static void check_string(const struct kt_gguf *g, const char *key, const char *want)
{
    const struct kt_gguf_kv *kv = kt_gguf_find_kv(g, key);
    KT_CHECK(kv && kv->value.type == KT_GGUF_STRING && kv->value.str.len == strlen(want) &&
                 memcmp(kv->value.str.ptr, want, kv->value.str.len) == 0,
             "%s is not \"%.40s...\"", key, want);
}

static void gguf_round_trip_keeps_every_tokenizer_key(void)
{
    for (int fi = 0; fi < 2; fi++) {
        struct kt_synth_vocab v;
        if (!build(families[fi], DEFAULT_MERGES, &v))
            continue;
        const char *path = kt_test_path(fi == 0 ? "vocab-kimi.gguf" : "vocab-deepseek.gguf");
        kt_err err = {0};
        struct kt_gguf_writer *w = NULL;
        kt_status st = kt_gguf_writer_create(path, &w, &err);
        if (st == KT_OK)
            st = kt_gguf_writer_set_str(w, "general.architecture", "deepseek2", &err);
        if (st == KT_OK)
            st = kt_synth_vocab_write(w, &v, &err);
        if (st == KT_OK)
            st = kt_gguf_writer_write_header(w, &err);
        if (st == KT_OK)
            st = kt_gguf_writer_finish(w, &err);
        kt_gguf_writer_destroy(w);
        KT_CHECK(st == KT_OK, "%s: write: %s", family_names[fi], err.msg);

        struct kt_gguf *g = NULL;
        if (st == KT_OK) {
            st = kt_gguf_open(path, &g, &err);
            KT_CHECK(st == KT_OK, "%s: read back: %s", family_names[fi], err.msg);
        }
        if (g) {
            check_string(g, "tokenizer.ggml.model", "gpt2");
            check_string(g, "tokenizer.ggml.pre", fi == 0 ? "kimi-k2" : "deepseek-v3");
            check_string_array(g, "tokenizer.ggml.tokens", v.tokens, v.n_tokens);
            check_string_array(g, "tokenizer.ggml.merges", v.merges, v.n_merges);
            const struct kt_gguf_kv *kv = kt_gguf_find_kv(g, "tokenizer.ggml.token_type");
            bool types_ok = kv && kv->value.type == KT_GGUF_ARRAY && kv->value.arr.elem_type == KT_GGUF_INT32 &&
                            kv->value.arr.count == v.n_tokens;
            for (uint32_t i = 0; types_ok && i < v.n_tokens; i++) {
                int64_t t;
                types_ok = kt_gguf_array_int(&kv->value.arr, i, &t) && t == v.token_types[i];
            }
            KT_CHECK(types_ok, "%s: token_type is an INT32 array equal to the vocabulary's", family_names[fi]);
            check_scalar(g, "tokenizer.ggml.bos_token_id", KT_GGUF_UINT32, v.bos_id);
            check_scalar(g, "tokenizer.ggml.eos_token_id", KT_GGUF_UINT32, v.eos_id);
            check_scalar(g, "tokenizer.ggml.padding_token_id", KT_GGUF_UINT32, v.pad_id);
            check_scalar(g, "tokenizer.ggml.add_bos_token", KT_GGUF_BOOL, fi == 1);
            check_scalar(g, "tokenizer.ggml.add_eos_token", KT_GGUF_BOOL, 0);
            check_string(g, "tokenizer.chat_template", kt_synth_chat_template(families[fi]));
            kt_gguf_close(g);
        }
        unlink(path);
        kt_synth_vocab_free(&v);
    }
}

int main(void)
{
    KT_RUN(vocab_build_is_deterministic);
    KT_RUN(default_vocabulary_has_700_merges_and_about_1k_tokens);
    KT_RUN(exhausted_text_gives_fewer_merges);
    KT_RUN(bad_arguments_are_rejected);
    KT_RUN(byte_tokens_use_gpt2_mapping);
    KT_RUN(merges_join_two_tokens_into_a_later_one);
    KT_RUN(token_texts_are_unique);
    KT_RUN(deepseek_specials_have_real_ids_and_types);
    KT_RUN(kimi_specials_are_control_after_the_merges);
    KT_RUN(templates_carry_detection_markers);
    KT_RUN(pretokenizer_matches_reference_splits);
    KT_RUN(pretokenizer_chunks_cover_the_corpus);
    KT_RUN(merges_shorten_the_training_text);
    KT_RUN(training_1000_merges_is_fast);
    KT_RUN(gguf_round_trip_keeps_every_tokenizer_key);
    return kt_test_finish();
}
