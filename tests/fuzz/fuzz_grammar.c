/*
 * fuzz_grammar.c - fuzz target for constrained decoding (grammar.h,
 * json_schema.h): each input is a JSON Schema, a newline, then output text.
 * The schema is compiled (a refusal must say why); the text is fed one byte
 * token at a time, and before each byte the mask must hold that byte's
 * token exactly when one-token stepping accepts it, and accepting must
 * succeed exactly then; end-of-generation is in the mask exactly when the
 * output is complete.  The first line is also compiled as a string pattern.
 * Then the same promises for a reasoning block with a token budget: <call>,
 * free text (without "\"}") of at most 1 + size % 4 tokens, <call>, then the
 * schema's value or (odd sizes) any token at all; byte 0x01 of the text
 * stands for <call> there, and a spent budget must refuse more text.
 * It must never keep state between inputs.
 */
#include "fuzz.h"

#include <jansson.h>

#include "grammar.h"
#include "json_schema.h"

static void require(bool cond, const char *what)
{
    if (!cond) {
        fprintf(stderr, "fuzz_grammar: broken promise: %s\n", what);
        abort();
    }
}

/* 256 byte tokens, a few longer ones, EOS and a special token. */
static struct kt_grammar_vocab *make_vocab(void)
{
    static const char *const pieces[] = {"{\"", "\":", "\",", "\"}", "true", "null", "12", " \"", "\\n", "\xe4\xb8\xad"};
    enum { N_PIECES = sizeof pieces / sizeof pieces[0], N = 256 + N_PIECES + 2 };
    char single[256]; /* the vocabulary copies the bytes */
    const char *bytes[N];
    size_t lens[N];
    bool special[N] = {false};
    for (int b = 0; b < 256; b++) {
        single[b] = (char)b;
        bytes[b] = &single[b];
        lens[b] = 1;
    }
    for (int i = 0; i < N_PIECES; i++) {
        bytes[256 + i] = pieces[i];
        lens[256 + i] = strlen(pieces[i]);
    }
    bytes[N - 2] = "<eos>", lens[N - 2] = 5, special[N - 2] = true;
    bytes[N - 1] = "<call>", lens[N - 1] = 6, special[N - 1] = true;
    int32_t eos = N - 2;
    struct kt_grammar_vocab *v = NULL;
    kt_err err = {0};
    require(kt_grammar_vocab_create(bytes, lens, special, N, N + 3, &eos, 1, &v, &err) == KT_OK, "vocab builds");
    return v;
}

/* Feeds tokens (a byte each; call_byte >= 0: that byte is the <call> token) checking the mask's promises. */
static void walk(struct kt_grammar_matcher *m, const char *text, size_t text_len, int call_byte, uint32_t budget)
{
    uint32_t mask[16];
    const int32_t eos = 256 + 10, call = 256 + 11;
    uint32_t in_text = 0; /* text tokens accepted since the first <call> (budget walks) */
    int calls = 0;
    kt_err err = {0};
    for (size_t i = 0; i <= text_len && i < 256; i++) {
        kt_grammar_matcher_fill_mask(m, mask);
        bool eos_in = (mask[eos >> 5] >> (eos & 31)) & 1;
        require(eos_in == kt_grammar_matcher_complete(m), "EOS in the mask exactly when the output is complete");
        if (i == text_len)
            break;
        int32_t t = call_byte >= 0 && (unsigned char)text[i] == call_byte ? call : (unsigned char)text[i];
        bool in = (mask[t >> 5] >> (t & 31)) & 1;
        bool can = kt_grammar_matcher_can_accept(m, t);
        require(in == can, "the mask holds a token exactly when stepping accepts it");
        if (budget && calls == 1 && in_text >= budget)
            require(t == call ? true : !can, "a spent budget takes no more text");
        bool took = kt_grammar_matcher_accept_token(m, t, &err) == KT_OK;
        require(took == can, "accepting succeeds exactly when stepping accepts");
        if (!took)
            break;
        if (t == call)
            calls++;
        else if (calls == 1)
            in_text++;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *nl = memchr(data, '\n', size);
    size_t schema_len = nl ? (size_t)(nl - data) : size;
    const char *text = nl ? (const char *)nl + 1 : "";
    size_t text_len = nl ? size - schema_len - 1 : 0;

    struct kt_grammar *g = NULL;
    kt_err err = {0};
    uint32_t node;
    require(kt_grammar_create(&g, &err) == KT_OK, "create");
    kt_status st = kt_grammar_json_pattern_string(g, (const char *)data, schema_len, &node, &err);
    require(st == KT_OK || err.msg[0], "a refused pattern says why");
    kt_grammar_destroy(g);

    json_t *schema = json_loadb((const char *)data, schema_len, JSON_DECODE_ANY, NULL);
    if (!schema)
        return 0;
    require(kt_grammar_create(&g, &err) == KT_OK, "create");
    st = kt_json_schema_compile(g, schema, &node, &err);
    if (st == KT_OK)
        st = kt_grammar_set_root(g, node, &err);
    json_decref(schema);
    if (st != KT_OK) {
        require(err.msg[0] == '#' || st == KT_ERR_NOMEM || err.msg[0], "a refused schema says where");
        kt_grammar_destroy(g);
        return 0;
    }
    struct kt_grammar_vocab *v = make_vocab();
    struct kt_grammar_matcher *m = NULL;
    if (kt_grammar_matcher_create(g, v, &m, &err) == KT_OK) {
        walk(m, text, text_len, -1, 0);
        kt_grammar_matcher_destroy(m);
    }
    kt_grammar_destroy(g);

    /* the same value after a budgeted reasoning block (or anything after it) */
    uint32_t budget = 1 + (uint32_t)(size % 4), reason = 0, open = 0, close = 0, rest = 0, root = 0;
    schema = json_loadb((const char *)data, schema_len, JSON_DECODE_ANY, NULL);
    require(kt_grammar_create(&g, &err) == KT_OK, "create");
    st = size % 2 ? kt_grammar_any(g, &rest, &err) : kt_json_schema_compile(g, schema, &rest, &err);
    json_decref(schema);
    if (st == KT_OK)
        st = kt_grammar_text_budget(g, "\"}", 2, budget, &reason, &err);
    if (st == KT_OK)
        st = kt_grammar_token(g, 256 + 11, &open, &err);
    if (st == KT_OK)
        st = kt_grammar_token(g, 256 + 11, &close, &err);
    if (st == KT_OK)
        st = kt_grammar_seq(g, (const uint32_t[]){open, reason, close, rest}, 4, &root, &err);
    if (st == KT_OK)
        st = kt_grammar_set_root(g, root, &err);
    require(st == KT_OK || st == KT_ERR_NOMEM, "a schema that compiled compiles after a reasoning block");
    if (st == KT_OK && kt_grammar_matcher_create(g, v, &m, &err) == KT_OK) {
        walk(m, text, text_len, 1, budget);
        kt_grammar_matcher_destroy(m);
    }
    kt_grammar_vocab_destroy(v);
    kt_grammar_destroy(g);
    return 0;
}

/* ---- seeds for replay.c ------------------------------------------------------------------------- */

static const char *const seeds[] = {
    "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":\"string\",\"maxLength\":3}},"
    "\"required\":[\"a\"]}\n{\"a\": -12, \"b\": \"x\\u00e9\"}",
    "{\"anyOf\":[{\"type\":\"array\",\"items\":{\"enum\":[1,\"x\",null]},\"maxItems\":2},{\"type\":\"number\"}]}\n"
    "[1,\"x\"]",
    "{\"$defs\":{\"n\":{\"type\":\"object\",\"properties\":{\"k\":{\"$ref\":\"#/$defs/n\"}}}},\"$ref\":\"#/$defs/n\"}\n"
    "{\"k\":{\"k\":{}}}",
    "{\"type\":\"string\",\"pattern\":\"^[a-z]{2,4}(-\\\\d+)?$\"}\n\"ab-12\"",
    "^(cat|dog)s?\\.[^x]{1,3}$\n\"cats.yy\"",
    "{\"type\":\"object\"}\n{\"\xe4\xb8\xad\": [true, 1.5e-3, {}]}",
    "{\"type\":\"integer\"}\n\x01" "ab\x01" "12",  /* a reasoning block of two tokens, then the value */
    "{\"type\":\"integer\"}\n\x01" "abcdef\x01" "1", /* past its budget */
};

void kt_fuzz_seeds(kt_fuzz_emit_fn emit)
{
    kt_fuzz_mutated_seeds(emit, seeds, sizeof seeds / sizeof seeds[0], "\"{}[]\\:,0a\xff\n", 12);
}
