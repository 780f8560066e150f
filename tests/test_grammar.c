/*
 * test_grammar.c - constrained decoding (grammar.h, json_schema.h): every
 * construct accepts what it should and refuses what it should; masks hold
 * exactly the tokens that one-token-at-a-time stepping accepts, end of
 * generation only when the output is complete, and never nothing; and over
 * random schemas and seeds the constrained output always parses (jansson)
 * and validates against its schema (the small validator below, written from
 * the JSON Schema rules, not from the compiler).
 */
#include <jansson.h>
#include <locale.h>
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar.h"
#include "json_schema.h"
#include "schema_validate.h"
#include "testlib.h"

/* ---- a small vocabulary: every byte, JSON-ish pieces, words, CJK, partial UTF-8 ---- */

static const char *const pieces[] = {
    "{", "}", "{\"", "\"}", "\":", "\": ", "\",", "\", \"", ",\"", "\"", "\n", "\n  ", "  ", " ", "[", "]", "[]",
    "{}", "[\"", "\"]", "],", "},", "}}", "]]", "true", "false", "null", "tr", "ue", "nu", "ll", "0", "1", "12",
    "345", "-", "-1", ".", ".5", "e", "E+", "e-", "10", "00", "name", "age", "tags", "id", "ok", "kind", "a", "b",
    "c", "x", "hello", " world", "the", "\\", "\\n", "\\\"", "\\u", "00e9", "d8", "\xe4\xb8\xad", "\xe6\x96\x87",
    "\xe4\xb8", "\xad", "\xf0\x9f", "\x98\x80", "\xc3\xa9", "caf\xc3\xa9", "\":\"", "\":[", "\":{", "\":1",
    "\":true", "\"name\"", "\"age\"", "\"a\":", "\"b\":", "\":\"x\"}", "\t", "\r\n", "\"\n", "get_weather",
    "get", "_weather", ":", "0,", "1}", "\"x\"", "xy", "abc", "é", "~", "/", "\x7f",
};

enum { TOK_EOS = 0, TOK_CALL, TOK_THINK, N_SPECIAL };
static const char *const specials[N_SPECIAL] = {"<|eos|>", "<|call|>", "<think>"};

struct vocab {
    struct kt_grammar_vocab *v;
    const char *bytes[512];
    size_t lens[512];
    bool special[512];
    char single[256];
    uint32_t n;
    int32_t eos, call;
};

static struct vocab V;

static void vocab_build(void)
{
    uint32_t n = 0;
    for (int b = 0; b < 256; b++) {
        V.single[b] = (char)b;
        V.bytes[n] = &V.single[b];
        V.lens[n++] = 1;
    }
    for (size_t i = 0; i < sizeof pieces / sizeof *pieces; i++) {
        V.bytes[n] = pieces[i];
        V.lens[n++] = strlen(pieces[i]);
    }
    for (int i = 0; i < N_SPECIAL; i++) {
        V.bytes[n] = specials[i];
        V.lens[n] = strlen(specials[i]);
        V.special[n] = true;
        if (i == TOK_EOS)
            V.eos = (int32_t)n;
        if (i == TOK_CALL)
            V.call = (int32_t)n;
        n++;
    }
    V.n = n;
    kt_err err = {0};
    kt_status st = kt_grammar_vocab_create(V.bytes, V.lens, V.special, n, n + 7, &V.eos, 1, &V.v, &err);
    KT_CHECK(st == KT_OK, "%s", err.msg);
}

/* ---- helpers ------------------------------------------------------------------------ */

static struct kt_grammar *schema_grammar(const char *schema_text, kt_err *err)
{
    json_error_t je;
    json_t *schema = json_loads(schema_text, JSON_DECODE_ANY, &je);
    if (!schema) {
        fprintf(stderr, "bad test schema: %s\n", je.text);
        return NULL;
    }
    struct kt_grammar *g = NULL;
    uint32_t root;
    kt_status st = kt_grammar_create(&g, err);
    if (st == KT_OK)
        st = kt_json_schema_compile(g, schema, &root, err);
    if (st == KT_OK)
        st = kt_grammar_set_root(g, root, err);
    json_decref(schema);
    if (st != KT_OK) {
        kt_grammar_destroy(g);
        return NULL;
    }
    return g;
}

/* Whether text (whole) is accepted and then complete. */
static int accepts(struct kt_grammar *g, const char *text, bool *complete)
{
    struct kt_grammar_matcher *m;
    kt_err err = {0};
    if (kt_grammar_matcher_create(g, V.v, &m, &err) != KT_OK)
        return -1;
    bool ok = kt_grammar_matcher_accept_bytes(m, text, strlen(text));
    *complete = ok && kt_grammar_matcher_complete(m);
    kt_grammar_matcher_destroy(m);
    return ok;
}

static void expect(const char *schema, const char *text, bool prefix_ok, bool complete_ok)
{
    kt_err err = {0};
    struct kt_grammar *g = schema_grammar(schema, &err);
    KT_CHECK(g != NULL, "%s: %s", schema, err.msg);
    if (!g)
        return;
    bool complete = false;
    int ok = accepts(g, text, &complete);
    KT_CHECK(ok == prefix_ok, "%s on '%s': prefix %s, expected %s", schema, text, ok ? "accepted" : "refused",
             prefix_ok ? "accepted" : "refused");
    KT_CHECK(complete == complete_ok, "%s on '%s': complete %d, expected %d", schema, text, complete, complete_ok);
    kt_grammar_destroy(g);
}

#define YES(s, t) expect(s, t, true, true)       /* a whole sentence */
#define PREFIX(s, t) expect(s, t, true, false)   /* a proper prefix */
#define NO(s, t) expect(s, t, false, false)      /* not even a prefix */

/* ---- constructs --------------------------------------------------------------------- */

static void object_properties_required_optional_in_order(void)
{
    const char *s = "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":\"string\"}},"
                    "\"required\":[\"a\"],\"additionalProperties\":false}";
    YES(s, "{\"a\":1,\"b\":\"x\"}");
    YES(s, "{\"a\":1}");
    YES(s, "{ \"a\" : 1 , \"b\" : \"\" }");
    YES(s, "{\n  \"a\": -12\n}");
    NO(s, "{\"b\":\"x\"}");          /* a is required and comes first */
    NO(s, "{\"a\":1,\"c\":2}");      /* no other keys */
    NO(s, "{\"a\":1,}");
    NO(s, "{}");
    PREFIX(s, "{\"a\":1");
    PREFIX(s, "{\"a\":1,\"b\":\"x\"");
    NO(s, "{\"a\":1} ");             /* nothing after the value */
    NO(s, "{\"a\":\"1\"}");
    const char *opt = "{\"properties\":{\"x\":{\"type\":\"boolean\"},\"y\":{\"type\":\"null\"}}}";
    YES(opt, "{}");
    YES(opt, "{\"y\":null}");
    YES(opt, "{\"x\":true,\"y\":null}");
    NO(opt, "{\"y\":null,\"x\":true}");
    YES("{\"type\":\"object\",\"properties\":{},\"additionalProperties\":false}", "{}");
    NO("{\"type\":\"object\",\"properties\":{},\"additionalProperties\":false}", "{\"a\":1}");
    YES("{\"type\":\"object\",\"additionalProperties\":{\"type\":\"integer\"}}", "{\"any key\":1,\"\\n\":2}");
    NO("{\"type\":\"object\",\"additionalProperties\":{\"type\":\"integer\"}}", "{\"k\":\"v\"}");
    YES("{\"properties\":{\"q\\\"uote\":{\"const\":1}},\"required\":[\"q\\\"uote\"]}", "{\"q\\\"uote\":1}");
}

static void whitespace_is_bounded(void)
{
    const char *s = "{\"type\":\"array\",\"items\":{\"type\":\"integer\"}}";
    char text[128] = "[";
    for (int i = 0; i < KT_GRAMMAR_MAX_WS; i++)
        strcat(text, " ");
    PREFIX(s, text);
    strcat(text, " ");
    NO(s, text);
}

static void arrays_and_their_bounds(void)
{
    const char *s = "{\"type\":\"array\",\"items\":{\"type\":\"integer\"},\"minItems\":1,\"maxItems\":3}";
    NO(s, "[]");
    YES(s, "[1]");
    YES(s, "[1, 2,3]");
    NO(s, "[1,2,3,4]");
    NO(s, "[1,]");
    PREFIX(s, "[1,2");
    YES("{\"type\":\"array\"}", "[1,\"a\",{\"b\":[null,true]},[]]");
    YES("{\"type\":\"array\",\"maxItems\":0}", "[]");
    NO("{\"type\":\"array\",\"maxItems\":0}", "[1");
    YES("{\"type\":\"array\",\"items\":{\"type\":\"array\",\"items\":{\"type\":\"string\"}}}", "[[\"a\"],[]]");
}

static void strings_escapes_utf8_and_lengths(void)
{
    const char *s = "{\"type\":\"string\"}";
    YES(s, "\"\"");
    YES(s, "\"a\\\"b\\\\c\\/\\n\\u00e9\"");
    YES(s, "\"caf\xc3\xa9 \xe4\xb8\xad\xf0\x9f\x98\x80\"");
    NO(s, "\"\xc3\"");           /* a lead byte then a quote */
    NO(s, "\"\xc0\xaf\"");       /* overlong */
    NO(s, "\"\xed\xa0\x80\"");   /* UTF-8 surrogate */
    NO(s, "\"\\ud83d\"");         /* lone surrogate escape */
    NO(s, "\"\\u0000\"");         /* NUL */
    NO(s, "\"\\x\"");
    NO(s, "\"a\nb\"");           /* raw control character */
    PREFIX(s, "\"\xe4\xb8");
    const char *len = "{\"type\":\"string\",\"minLength\":2,\"maxLength\":3}";
    NO(len, "\"a\"");
    YES(len, "\"ab\"");
    YES(len, "\"\xe4\xb8\xad\xe6\x96\x87\"");  /* 2 characters, 6 bytes */
    YES(len, "\"a\\nb\"");                    /* an escape is one character */
    NO(len, "\"abcd\"");
}

static void numbers_and_integers(void)
{
    const char *n = "{\"type\":\"number\"}";
    YES(n, "0");
    YES(n, "-0.5");
    YES(n, "12e+3");
    YES(n, "1.25E-7");
    NO(n, "01");
    NO(n, "+1");
    PREFIX(n, "1.");
    NO(n, ".5");
    NO(n, "1e123");               /* at most 2 exponent digits */
    YES(n, "123456789012345");    /* 15 digits */
    NO(n, "1234567890123456");
    const char *i = "{\"type\":\"integer\"}";
    YES(i, "-42");
    NO(i, "4.2");
    NO(i, "1e3");
    struct kt_grammar *g;
    kt_err err = {0};
    uint32_t digits;
    KT_CHECK(kt_grammar_create(&g, &err) == KT_OK && kt_grammar_json_number(g, KT_GRAMMAR_DIGITS, &digits, &err) == KT_OK &&
                 kt_grammar_set_root(g, digits, &err) == KT_OK, "%s", err.msg);
    bool complete;
    KT_CHECK(accepts(g, "120", &complete) == 1 && complete, "digits");
    KT_CHECK(accepts(g, "-1", &complete) == 0, "no sign");
    KT_CHECK(accepts(g, "01", &complete) == 0, "no leading zero");
    KT_CHECK(accepts(g, "1.5", &complete) == 0, "no fraction");
    kt_grammar_destroy(g);
}

static void enum_const_boolean_null(void)
{
    const char *e = "{\"enum\":[\"red\",\"green\",1,1.5,null,{\"a\":[1]}]}";
    YES(e, "\"red\"");
    YES(e, "1");
    YES(e, "1.5");
    YES(e, "null");
    YES(e, "{\"a\":[1]}");
    NO(e, "\"blue\"");
    NO(e, "2");
    YES("{\"type\":\"string\",\"enum\":[\"a\",1]}", "\"a\"");
    NO("{\"type\":\"string\",\"enum\":[\"a\",1]}", "1");   /* 1 is no string */
    YES("{\"const\":\"fixed\"}", "\"fixed\"");
    NO("{\"const\":\"fixed\"}", "\"fixe\"");
    YES("{\"type\":\"boolean\"}", "false");
    PREFIX("{\"type\":\"boolean\"}", "fals");
    YES("{\"type\":[\"integer\",\"null\"]}", "null");
    YES("{\"type\":[\"integer\",\"null\"]}", "7");
}

static void any_of_follows_alternatives_in_parallel(void)
{
    const char *s = "{\"anyOf\":[{\"type\":\"object\",\"properties\":{\"kind\":{\"const\":\"a\"},\"x\":{\"type\":"
                    "\"integer\"}},\"required\":[\"kind\",\"x\"]},{\"type\":\"object\",\"properties\":{\"kind\":"
                    "{\"const\":\"b\"},\"y\":{\"type\":\"string\"}},\"required\":[\"kind\",\"y\"]}]}";
    YES(s, "{\"kind\":\"a\",\"x\":1}");
    YES(s, "{\"kind\":\"b\",\"y\":\"z\"}");
    NO(s, "{\"kind\":\"a\",\"y\":\"z\"}");
    NO(s, "{\"kind\":\"b\",\"x\":1}");
    YES("{\"anyOf\":[{\"type\":\"integer\"},{\"type\":\"number\"}]}", "1.5");
    YES("{\"anyOf\":[{\"type\":\"string\",\"maxLength\":1},{\"type\":\"string\",\"minLength\":3}]}", "\"abc\"");
    NO("{\"anyOf\":[{\"type\":\"string\",\"maxLength\":1},{\"type\":\"string\",\"minLength\":3}]}", "\"ab\"");
}

static void refs_resolve_and_may_recurse(void)
{
    const char *s = "{\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"integer\"},\"kids\":"
                    "{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/node\"}}},\"required\":[\"v\",\"kids\"]}},"
                    "\"$ref\":\"#/$defs/node\"}";
    YES(s, "{\"v\":1,\"kids\":[{\"v\":2,\"kids\":[]},{\"v\":3,\"kids\":[{\"v\":4,\"kids\":[]}]}]}");
    NO(s, "{\"v\":1,\"kids\":[{\"v\":2}]}");
    YES("{\"definitions\":{\"n\":{\"type\":\"null\"}},\"properties\":{\"a\":{\"$ref\":\"#/definitions/n\"}},"
        "\"required\":[\"a\"]}", "{\"a\":null}");
    YES("{\"type\":\"object\",\"properties\":{\"next\":{\"anyOf\":[{\"$ref\":\"#\"},{\"type\":\"null\"}]}},"
        "\"required\":[\"next\"]}", "{\"next\":{\"next\":null}}");
}

static void any_object_for_json_object_mode(void)
{
    struct kt_grammar *g;
    kt_err err = {0};
    uint32_t root;
    KT_CHECK(kt_grammar_create(&g, &err) == KT_OK, "%s", err.msg);
    KT_CHECK(kt_json_any_object(g, &root, &err) == KT_OK && kt_grammar_set_root(g, root, &err) == KT_OK, "%s",
             err.msg);
    bool complete;
    KT_CHECK(accepts(g, "{\"a\":[1,{\"b\":null}],\"c\":\"d\"}", &complete) == 1 && complete, "object");
    KT_CHECK(accepts(g, "[1]", &complete) == 0, "an array is not an object");
    KT_CHECK(accepts(g, "\"s\"", &complete) == 0, "a string is not an object");
    kt_grammar_destroy(g);
}

static void schema_errors_name_the_place(void)
{
    static const struct {
        const char *schema, *message;
    } cases[] = {
        {"{\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"string\",\"pattern\":\"(?!a)\"}}}",
         "#/properties/x/pattern: pattern: lookaround"},
        {"{\"properties\":{\"d\":{\"type\":\"string\",\"format\":\"date\"}}}", "#/properties/d/format"},
        {"{\"type\":\"strin\"}", "#/type: unknown type 'strin'"},
        {"{\"type\":[\"string\",3]}", "#/type/1: a type name must be a string"},
        {"{\"properties\":{\"a\":{}},\"required\":[\"b\"],\"additionalProperties\":false}",
         "#/required/0: 'b' is required but not among the properties"},
        {"{\"$ref\":\"#/$defs/missing\"}", "#/$ref: '#/$defs/missing' does not resolve"},
        {"{\"$ref\":\"https://example.com/s.json\"}", "does not resolve"},
        {"{\"anyOf\":[]}", "#/anyOf: 'anyOf' must be a non-empty array"},
        {"{\"anyOf\":[{\"type\":\"integer\"},{\"oneOf\":[]}]}", "#/anyOf/1/oneOf"},
        {"{\"type\":\"array\",\"minItems\":3,\"maxItems\":2}", "minItems 3 is more than maxItems 2"},
        {"{\"type\":\"array\",\"items\":[{\"type\":\"string\"}]}", "#/items: 'items' must be one schema"},
        {"{\"type\":\"string\",\"maxLength\":-1}", "#/maxLength: 'maxLength' must be a non-negative integer"},
        {"{\"$defs\":{\"a\":{\"$ref\":\"#/$defs/a\"}},\"$ref\":\"#/$defs/a\"}", "only refers to itself"},
        {"false", "#: the schema false matches nothing"},
        {"[1]", "a schema must be an object or a boolean"},
        {"{\"type\":\"string\",\"enum\":[1,2]}", "#/enum: no value of 'enum' has the schema's type"},
        {"{\"type\":\"integer\",\"minimum\":3}", "#/minimum"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        kt_err err = {0};
        struct kt_grammar *g = schema_grammar(cases[i].schema, &err);
        KT_CHECK(g == NULL, "%s compiled", cases[i].schema);
        KT_CHECK(strstr(err.msg, cases[i].message) != NULL, "%s: got '%s', expected '%s'", cases[i].schema, err.msg,
                 cases[i].message);
        kt_grammar_destroy(g);
    }
}

/* ---- masks ------------------------------------------------------------------------------ */

static uint32_t rng_next(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(*s >> 33);
}

static bool bit(const uint32_t *mask, uint32_t id)
{
    return (mask[id >> 5] >> (id & 31)) & 1;
}

struct walk {
    char text[8192];
    size_t len;
    bool ended;       /* EOS taken or the grammar closed */
    int mask_errors;  /* tokens where mask and stepping disagree */
    int empty_masks;
};

/* Generates from g by drawing among the allowed tokens; after `patience`
 * tokens it prefers tokens that close something (so bounded schemas end). */
static void random_walk(struct kt_grammar *g, uint64_t seed, int max_tokens, int patience, struct walk *w)
{
    memset(w, 0, sizeof *w);
    struct kt_grammar_matcher *m;
    kt_err err = {0};
    if (kt_grammar_matcher_create(g, V.v, &m, &err) != KT_OK) {
        w->empty_masks++;
        return;
    }
    uint32_t words = kt_grammar_vocab_mask_words(V.v);
    uint32_t *mask = calloc(words, sizeof *mask);
    uint32_t allowed[512], closing[512];
    for (int step = 0; step < max_tokens && !w->ended; step++) {
        uint32_t count = kt_grammar_matcher_fill_mask(m, mask);
        uint32_t n_allowed = 0, n_closing = 0;
        for (uint32_t id = 0; id < V.n + 7; id++) {
            bool in = bit(mask, id);
            bool can = id < V.n && kt_grammar_matcher_can_accept(m, (int32_t)id);
            if (in != can && w->mask_errors++ < 3)
                fprintf(stderr, "mask disagrees on token %u ('%.*s') after '%.*s': mask %d, stepping %d\n", id,
                        id < V.n ? (int)V.lens[id] : 0, id < V.n ? V.bytes[id] : "", (int)w->len, w->text, in, can);
            if (!in)
                continue;
            allowed[n_allowed++] = id;
            if (id < V.n && ((int32_t)id == V.eos || memchr(V.bytes[id], '"', V.lens[id]) ||
                             memchr(V.bytes[id], '}', V.lens[id]) || memchr(V.bytes[id], ']', V.lens[id]) ||
                             (V.lens[id] == 1 && strchr("0123456789el", V.bytes[id][0]))))
                closing[n_closing++] = id;
        }
        if (count != n_allowed)
            w->mask_errors++;
        if (n_allowed == 0) {
            w->empty_masks++;
            break;
        }
        bool eos_ok = bit(mask, (uint32_t)V.eos);
        KT_CHECK(eos_ok == kt_grammar_matcher_complete(m), "EOS in the mask %d, complete %d", eos_ok,
                 kt_grammar_matcher_complete(m));
        uint32_t id;
        if (step >= patience && n_closing)
            id = closing[rng_next(&seed) % n_closing];
        else
            id = allowed[rng_next(&seed) % n_allowed];
        if (kt_grammar_matcher_accept_token(m, (int32_t)id, &err) != KT_OK) {
            w->mask_errors++;
            break;
        }
        if ((int32_t)id == V.eos) {
            w->ended = true;
            break;
        }
        if (w->len + V.lens[id] < sizeof w->text) {
            memcpy(w->text + w->len, V.bytes[id], V.lens[id]);
            w->len += V.lens[id];
        }
        if (kt_grammar_matcher_closed(m))
            w->ended = true;
    }
    w->text[w->len] = '\0';
    free(mask);
    kt_grammar_matcher_destroy(m);
}

/* ---- random schemas ---------------------------------------------------------------------- */

static json_t *random_schema(uint64_t *r, int depth);

static json_t *random_scalar_value(uint64_t *r)
{
    switch (rng_next(r) % 5) {
    case 0: return json_integer((json_int_t)(rng_next(r) % 200) - 100);
    case 1: return json_real((double)(rng_next(r) % 100) / 8.0);
    case 2: {
        char s[8];
        snprintf(s, sizeof s, "v%u", rng_next(r) % 50);
        return json_string(s);
    }
    case 3: return json_boolean(rng_next(r) & 1);
    default: return json_null();
    }
}

static json_t *random_schema(uint64_t *r, int depth)
{
    unsigned k = rng_next(r) % (depth >= 3 ? 6 : 10);
    json_t *s = json_object();
    switch (k) {
    case 0: {
        json_object_set_new(s, "type", json_string("string"));
        unsigned mx = rng_next(r) % 8;
        json_object_set_new(s, "maxLength", json_integer(mx));
        if (rng_next(r) & 1)
            json_object_set_new(s, "minLength", json_integer(rng_next(r) % (mx + 1)));
        break;
    }
    case 1: json_object_set_new(s, "type", json_string("integer")); break;
    case 2: json_object_set_new(s, "type", json_string("number")); break;
    case 3: json_object_set_new(s, "type", json_string(rng_next(r) & 1 ? "boolean" : "null")); break;
    case 4: {
        json_t *e = json_array();
        unsigned n = 1 + rng_next(r) % 4;
        for (unsigned i = 0; i < n; i++)
            json_array_append_new(e, random_scalar_value(r));
        json_object_set_new(s, "enum", e);
        break;
    }
    case 5: json_object_set_new(s, "const", random_scalar_value(r)); break;
    case 6:
    case 7: {
        json_object_set_new(s, "type", json_string("object"));
        json_t *props = json_object(), *req = json_array();
        unsigned n = rng_next(r) % 4;
        for (unsigned i = 0; i < n; i++) {
            char name[16];
            snprintf(name, sizeof name, "%c%u", 'a' + (int)(rng_next(r) % 3), i);
            json_object_set_new(props, name, random_schema(r, depth + 1));
            if (rng_next(r) % 3)
                json_array_append_new(req, json_string(name));
        }
        json_object_set_new(s, "properties", props);
        json_object_set_new(s, "required", req);
        json_object_set_new(s, "additionalProperties", json_false());
        break;
    }
    case 8: {
        json_object_set_new(s, "type", json_string("array"));
        json_object_set_new(s, "items", random_schema(r, depth + 1));
        unsigned mn = rng_next(r) % 2, mx = mn + rng_next(r) % 3;
        json_object_set_new(s, "minItems", json_integer(mn));
        json_object_set_new(s, "maxItems", json_integer(mx));
        break;
    }
    default: {
        json_t *any = json_array();
        json_array_append_new(any, random_schema(r, depth + 1));
        json_array_append_new(any, random_schema(r, depth + 1));
        json_object_set_new(s, "anyOf", any);
        break;
    }
    }
    return s;
}

static void constrained_output_always_validates_over_random_schemas(void)
{
    int completed = 0, runs = 0;
    for (uint64_t seed = 1; seed <= 300; seed++) {
        uint64_t r = seed * 0x9E3779B97F4A7C15ull;
        json_t *schema = random_schema(&r, 0);
        char *text = json_dumps(schema, JSON_COMPACT);
        kt_err err = {0};
        struct kt_grammar *g = schema_grammar(text, &err);
        KT_CHECK(g != NULL, "seed %llu: %s: %s", (unsigned long long)seed, text, err.msg);
        if (g) {
            struct walk w;
            random_walk(g, seed, 400, 80, &w);
            runs++;
            KT_CHECK(w.mask_errors == 0, "seed %llu: %s: %d mask errors", (unsigned long long)seed, text,
                     w.mask_errors);
            KT_CHECK(w.empty_masks == 0, "seed %llu: %s: no token could continue '%s'", (unsigned long long)seed, text,
                     w.text);
            if (w.ended) {
                completed++;
                json_error_t je;
                json_t *out = json_loadb(w.text, w.len, JSON_DECODE_ANY, &je);
                KT_CHECK(out != NULL, "seed %llu: %s: output '%s' does not parse: %s", (unsigned long long)seed, text,
                         w.text, je.text);
                KT_CHECK(!out || validate(schema, schema, out, 0), "seed %llu: %s: output '%s' does not validate",
                         (unsigned long long)seed, text, w.text);
                json_decref(out);
            }
            kt_grammar_destroy(g);
        }
        free(text);
        json_decref(schema);
    }
    /* every schema above is bounded (strings have maxLength, arrays maxItems) */
    KT_CHECK(completed == runs, "%d of %d walks completed", completed, runs);
}

static void unbounded_schemas_validate_when_they_end(void)
{
    static const char *const schemas[] = {
        "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},\"tags\":{\"type\":\"array\",\"items\":"
        "{\"type\":\"string\"}},\"age\":{\"type\":\"integer\"}},\"required\":[\"name\",\"tags\",\"age\"],"
        "\"additionalProperties\":false}",
        "{\"type\":\"object\"}",
        "{\"$defs\":{\"n\":{\"type\":\"object\",\"properties\":{\"id\":{\"type\":\"integer\"},\"kids\":{\"type\":"
        "\"array\",\"items\":{\"$ref\":\"#/$defs/n\"},\"maxItems\":2}},\"required\":[\"id\",\"kids\"]}},\"$ref\":"
        "\"#/$defs/n\"}",
        "{\"anyOf\":[{\"type\":\"string\"},{\"type\":\"array\",\"items\":{\"type\":\"number\"}}]}",
    };
    for (size_t i = 0; i < sizeof schemas / sizeof *schemas; i++) {
        kt_err err = {0};
        json_t *schema = json_loads(schemas[i], 0, NULL);
        struct kt_grammar *g = schema_grammar(schemas[i], &err);
        KT_CHECK(g != NULL, "%s", err.msg);
        int ended = 0;
        for (uint64_t seed = 1; g && seed <= 40; seed++) {
            struct walk w;
            random_walk(g, seed * 7919 + i, 600, 40, &w);
            KT_CHECK(w.mask_errors == 0 && w.empty_masks == 0, "%s seed %llu: '%s'", schemas[i],
                     (unsigned long long)seed, w.text);
            if (!w.ended)
                continue;
            ended++;
            json_t *out = json_loadb(w.text, w.len, JSON_DECODE_ANY, NULL);
            KT_CHECK(out && validate(schema, schema, out, 0), "%s: '%s' does not validate", schemas[i], w.text);
            json_decref(out);
        }
        KT_CHECK(ended >= 20, "%s: only %d of 40 walks ended", schemas[i], ended);
        kt_grammar_destroy(g);
        json_decref(schema);
    }
}

static void patterns_match_as_regexes(void)
{
    const char *s = "{\"type\":\"string\",\"pattern\":\"^[a-z]{2,4}-\\\\d+$\"}";
    YES(s, "\"ab-12\"");
    YES(s, "\"abcd-0\"");
    NO(s, "\"a-1\"");
    NO(s, "\"abcde-1\"");
    PREFIX(s, "\"ab-");
    NO(s, "\"ab-\"");
    NO(s, "\"ab-12x\"");
    const char *free_sides = "{\"type\":\"string\",\"pattern\":\"ab\"}";
    YES(free_sides, "\"xxabyy\"");
    YES(free_sides, "\"ab\"");
    PREFIX(free_sides, "\"xya");
    NO(free_sides, "\"xyz\"");
    const char *alt = "{\"type\":\"string\",\"pattern\":\"^(cat|dog|bird)s?$\"}";
    YES(alt, "\"bird\"");
    YES(alt, "\"dogs\"");
    NO(alt, "\"cow\"");
    YES("{\"type\":\"string\",\"pattern\":\"^a\\\\.b$\"}", "\"a.b\"");
    NO("{\"type\":\"string\",\"pattern\":\"^a\\\\.b$\"}", "\"axb\"");
    YES("{\"type\":\"string\",\"pattern\":\"^\\\\n\\\\t$\"}", "\"\\n\\t\"");       /* JSON escapes are characters */
    YES("{\"type\":\"string\",\"pattern\":\"^[^x]$\"}", "\"\\u00e9\"");
    YES("{\"type\":\"string\",\"pattern\":\"^[\xc3\xa9\xe4\xb8\xad]+$\"}", "\"\xe4\xb8\xad\xc3\xa9\"");
    YES("{\"type\":\"string\",\"pattern\":\"^.{3}$\"}", "\"\xe4\xb8\xad\xe6\x96\x87!\"");
    NO("{\"type\":\"string\",\"pattern\":\"^.{3}$\"}", "\"ab\"");
    YES("{\"type\":\"string\",\"pattern\":\"^(a|b|c|d)*$\"}", "\"abcdda\"");
    YES("{\"type\":\"string\",\"pattern\":\"^((ab)+|c){1,2}$\"}", "\"ababc\"");
    NO("{\"type\":\"string\",\"pattern\":\"^((ab)+|c){1,2}$\"}", "\"cca\"");
    YES("{\"type\":\"string\",\"pattern\":\"^x{0}y$\"}", "\"y\"");
    YES("{\"type\":\"string\",\"pattern\":\"^[\\\\w-]+@[a-z]+\\\\.(com|org)$\"}", "\"ada_l-1@example.org\"");
    static const struct {
        const char *pattern, *message;
    } bad[] = {
        {"(?=a)", "lookaround"}, {"(a)\\\\1", "backreference"}, {"a{100}", "a count over 64"},
        {"[a-", "without its ']'"}, {"(ab", "without its ')'"}, {"ab)", "without its '('"}, {"*a", "nothing before"},
        {"a+?", "lazy"}, {"a^b", "only at the start"}, {"[z-a]", "out of order"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char schema[256];
        snprintf(schema, sizeof schema, "{\"type\":\"string\",\"pattern\":\"%s\"}", bad[i].pattern);
        kt_err err = {0};
        struct kt_grammar *g = schema_grammar(schema, &err);
        KT_CHECK(!g && strstr(err.msg, "#/pattern: pattern: ") && strstr(err.msg, bad[i].message), "%s: '%s'",
                 bad[i].pattern, err.msg);
        kt_grammar_destroy(g);
    }
    kt_err err = {0};
    struct kt_grammar *g = schema_grammar("{\"type\":\"string\",\"pattern\":\"a\",\"maxLength\":3}", &err);
    KT_CHECK(!g && strstr(err.msg, "minLength/maxLength"), "'%s'", err.msg);
    kt_grammar_destroy(g);
}

/* Random walks under patterns; POSIX regexec (another engine) checks each
 * output.  The patterns keep to syntax ERE and the subset share. */
static void pattern_outputs_match_by_posix_regexec(void)
{
    static const char *const patterns[] = {
        "^[a-c]{1,3}(-[0-9]{2})?$", "^(red|green|blue)$", "^[^\"\\\\]{0,5}$", "[yz]", "^([A-Z][a-z]+ ){0,2}[A-Z]$",
        "^(0|[1-9][0-9]{0,3})(\\.[0-9]{1,2})?$", "^.{2}$",
    };
    setlocale(LC_CTYPE, "C.UTF-8");
    for (size_t i = 0; i < sizeof patterns / sizeof *patterns; i++) {
        json_t *schema = json_pack("{s:s, s:s}", "type", "string", "pattern", patterns[i]);
        char *text = json_dumps(schema, JSON_COMPACT);
        kt_err err = {0};
        struct kt_grammar *g = schema_grammar(text, &err);
        KT_CHECK(g != NULL, "%s: %s", text, err.msg);
        regex_t re;
        KT_CHECK(regcomp(&re, patterns[i], REG_EXTENDED | REG_NOSUB) == 0, "regcomp %s", patterns[i]);
        int ended = 0;
        for (uint64_t seed = 1; g && seed <= 40; seed++) {
            struct walk w;
            random_walk(g, seed * 31 + i, 400, 200, &w);
            KT_CHECK(w.mask_errors == 0 && w.empty_masks == 0, "%s seed %llu: '%s'", patterns[i],
                     (unsigned long long)seed, w.text);
            if (!w.ended)
                continue;
            ended++;
            json_t *v = json_loadb(w.text, w.len, JSON_DECODE_ANY, NULL);
            KT_CHECK(json_is_string(v) && regexec(&re, json_string_value(v), 0, NULL, 0) == 0,
                     "%s: '%s' does not match", patterns[i], w.text);
            json_decref(v);
        }
        KT_CHECK(ended >= 5, "%s: only %d of 40 walks ended", patterns[i], ended);
        regfree(&re);
        kt_grammar_destroy(g);
        free(text);
        json_decref(schema);
    }
}

static void raw_regex_matches_the_whole_text(void)
{
    struct kt_grammar *g;
    kt_err err = {0};
    uint32_t node;
    const char *re = "[0-9]{3}-[a-z]+|(yes|no)\\.";
    KT_CHECK(kt_grammar_create(&g, &err) == KT_OK && kt_grammar_regex(g, re, strlen(re), &node, &err) == KT_OK &&
                 kt_grammar_set_root(g, node, &err) == KT_OK, "%s", err.msg);
    bool complete;
    KT_CHECK(accepts(g, "123-ab", &complete) == 1 && complete, "digits and letters");
    KT_CHECK(accepts(g, "123-", &complete) == 1 && !complete, "a prefix");
    KT_CHECK(accepts(g, "yes.", &complete) == 1 && complete, "yes.");
    KT_CHECK(accepts(g, "x123-ab", &complete) == 0, "anchored at the start");
    KT_CHECK(accepts(g, "123-ab!", &complete) == 0, "anchored at the end");
    KT_CHECK(accepts(g, "\"123-ab\"", &complete) == 0, "raw text, no quotes");
    struct kt_grammar_matcher *m;
    KT_CHECK(kt_grammar_matcher_create(g, V.v, &m, &err) == KT_OK, "%s", err.msg);
    KT_CHECK(kt_grammar_matcher_accept_bytes(m, "no.", 3) && kt_grammar_matcher_closed(m), "nothing may follow 'no.'");
    kt_grammar_matcher_destroy(m);
    kt_grammar_destroy(g);
    const char *bad = "a(b";
    KT_CHECK(kt_grammar_create(&g, &err) == KT_OK && kt_grammar_regex(g, bad, 3, &node, &err) != KT_OK &&
                 strstr(err.msg, "without its ')'"), "'%s'", err.msg);
    kt_grammar_destroy(g);
    /* random walks end in a match */
    const char *walkable = "(ab|c)+-[0-9]";
    KT_CHECK(kt_grammar_create(&g, &err) == KT_OK && kt_grammar_regex(g, walkable, strlen(walkable), &node, &err) == KT_OK &&
                 kt_grammar_set_root(g, node, &err) == KT_OK, "%s", err.msg);
    regex_t posix;
    KT_CHECK(regcomp(&posix, "^(ab|c)+-[0-9]$", REG_EXTENDED | REG_NOSUB) == 0, "regcomp");
    for (uint64_t seed = 1; seed <= 30; seed++) {
        struct walk w;
        random_walk(g, seed, 200, 10, &w);
        KT_CHECK(w.mask_errors == 0 && w.empty_masks == 0, "seed %llu: '%s'", (unsigned long long)seed, w.text);
        KT_CHECK(!w.ended || regexec(&posix, w.text, 0, NULL, 0) == 0, "'%s' does not match", w.text);
    }
    regfree(&posix);
    kt_grammar_destroy(g);
}

/* A reasoning block before the JSON: <think> free text <call> (standing in for </think>) then an object. */
static void free_text_until_a_special_token(void)
{
    struct kt_grammar *g;
    kt_err err = {0};
    uint32_t open = 0, text = 0, close = 0, body = 0, root = 0;
    int32_t think = V.call + 1; /* TOK_THINK follows TOK_CALL */
    kt_status st = kt_grammar_create(&g, &err);
    if (st == KT_OK)
        st = kt_grammar_token(g, think, &open, &err);
    if (st == KT_OK)
        st = kt_grammar_text(g, "<|call|>", 8, &text, &err);
    if (st == KT_OK)
        st = kt_grammar_token(g, V.call, &close, &err);
    if (st == KT_OK)
        st = kt_json_any_object(g, &body, &err);
    uint32_t items[] = {open, text, close, body};
    if (st == KT_OK)
        st = kt_grammar_seq(g, items, 4, &root, &err);
    if (st == KT_OK)
        st = kt_grammar_set_root(g, root, &err);
    KT_CHECK(st == KT_OK, "%s", err.msg);
    struct kt_grammar_matcher *m;
    KT_CHECK(kt_grammar_matcher_create(g, V.v, &m, &err) == KT_OK, "%s", err.msg);
    uint32_t mask[32];
    KT_CHECK(kt_grammar_matcher_fill_mask(m, mask) == 1 && bit(mask, (uint32_t)think), "only <think> first");
    KT_CHECK(kt_grammar_matcher_accept_token(m, think, &err) == KT_OK, "%s", err.msg);
    uint32_t n = kt_grammar_matcher_fill_mask(m, mask);
    uint32_t n_text = V.n - N_SPECIAL;
    KT_CHECK(n == n_text + 1 && bit(mask, (uint32_t)V.call) && !bit(mask, (uint32_t)V.eos),
             "every text token and the closing one (%u of %u)", n, n_text + 1);
    for (uint32_t id = 0; id < V.n; id++)
        KT_CHECK(bit(mask, id) == kt_grammar_matcher_can_accept(m, (int32_t)id), "token %u", id);
    KT_CHECK(kt_grammar_matcher_accept_bytes(m, "I think {\"a\": [ \xe4\xb8", 18), "reasoning text");
    KT_CHECK(!kt_grammar_matcher_accept_bytes(m, "a <|call|> b", 12), "not the closing token's text");
    KT_CHECK(kt_grammar_matcher_accept_bytes(m, " <|cal", 6), "a part of it");
    kt_grammar_matcher_fill_mask(m, mask);
    for (uint32_t id = 0; id < V.n; id++)
        KT_CHECK(bit(mask, id) == kt_grammar_matcher_can_accept(m, (int32_t)id), "token %u after a part", id);
    KT_CHECK(!kt_grammar_matcher_accept_bytes(m, "l|>", 3) && kt_grammar_matcher_accept_bytes(m, "l|x", 3),
             "the rest of it refused, another ending taken");
    KT_CHECK(kt_grammar_matcher_accept_token(m, V.call, &err) == KT_OK, "%s", err.msg);
    KT_CHECK(!kt_grammar_matcher_accept_bytes(m, "x", 1), "then JSON");
    KT_CHECK(kt_grammar_matcher_accept_bytes(m, "{\"k\":1}", 7) && kt_grammar_matcher_closed(m), "the object");
    kt_grammar_matcher_destroy(m);
    kt_grammar_destroy(g);
}

/* A tool call in a made-up family syntax: <|call|> NAME ":" ARGS, special tokens as tokens. */
static void special_tokens_frame_a_tool_call(void)
{
    kt_err err = {0};
    struct kt_grammar *g;
    uint32_t tok = 0, name = 0, sep = 0, args = 0, root = 0;
    KT_CHECK(kt_grammar_create(&g, &err) == KT_OK, "create");
    json_t *params = json_loads("{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\",\"maxLength\":4}},"
                                "\"required\":[\"city\"]}", 0, NULL);
    kt_status st = kt_grammar_token(g, V.call, &tok, &err);
    if (st == KT_OK)
        st = kt_grammar_literal(g, "get_weather", 11, &name, &err);
    if (st == KT_OK)
        st = kt_grammar_literal(g, ":", 1, &sep, &err);
    if (st == KT_OK)
        st = kt_json_schema_compile(g, params, &args, &err);
    uint32_t items[4] = {tok, name, sep, args};
    if (st == KT_OK)
        st = kt_grammar_seq(g, items, 4, &root, &err);
    if (st == KT_OK)
        st = kt_grammar_set_root(g, root, &err);
    KT_CHECK(st == KT_OK, "%s", err.msg);
    json_decref(params);
    struct kt_grammar_matcher *m;
    KT_CHECK(kt_grammar_matcher_create(g, V.v, &m, &err) == KT_OK, "%s", err.msg);
    uint32_t mask[32];
    uint32_t n = kt_grammar_matcher_fill_mask(m, mask);
    KT_CHECK(n == 1 && bit(mask, (uint32_t)V.call), "only the special token opens the call (%u allowed)", n);
    KT_CHECK(!kt_grammar_matcher_accept_bytes(m, "<|call|>", 8), "its text is not the token");
    KT_CHECK(kt_grammar_matcher_accept_token(m, V.call, &err) == KT_OK, "%s", err.msg);
    KT_CHECK(!kt_grammar_matcher_accept_bytes(m, "get_x", 5), "an unknown name");
    KT_CHECK(kt_grammar_matcher_accept_bytes(m, "get_weather:{\"city\":\"Oslo\"}", 27), "the call");
    KT_CHECK(kt_grammar_matcher_closed(m), "nothing may follow");
    n = kt_grammar_matcher_fill_mask(m, mask);
    KT_CHECK(n == 1 && bit(mask, (uint32_t)V.eos), "then only EOS (%u allowed)", n);
    kt_grammar_matcher_destroy(m);
    kt_grammar_destroy(g);
}

int main(void)
{
    vocab_build();
    KT_RUN(object_properties_required_optional_in_order);
    KT_RUN(whitespace_is_bounded);
    KT_RUN(arrays_and_their_bounds);
    KT_RUN(strings_escapes_utf8_and_lengths);
    KT_RUN(numbers_and_integers);
    KT_RUN(enum_const_boolean_null);
    KT_RUN(any_of_follows_alternatives_in_parallel);
    KT_RUN(refs_resolve_and_may_recurse);
    KT_RUN(any_object_for_json_object_mode);
    KT_RUN(schema_errors_name_the_place);
    KT_RUN(special_tokens_frame_a_tool_call);
    KT_RUN(constrained_output_always_validates_over_random_schemas);
    KT_RUN(unbounded_schemas_validate_when_they_end);
    KT_RUN(patterns_match_as_regexes);
    KT_RUN(pattern_outputs_match_by_posix_regexec);
    KT_RUN(raw_regex_matches_the_whole_text);
    KT_RUN(free_text_until_a_special_token);
    kt_grammar_vocab_destroy(V.v);
    return kt_test_finish();
}
