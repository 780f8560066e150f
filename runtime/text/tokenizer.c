/*
 * tokenizer.c - byte-level BPE for the deepseek2 family: GGUF vocabulary,
 * special-token matching, the models' exact pre-tokenizers as hand-written
 * matchers over Unicode properties, BPE merging, and decoding.
 *
 * Pipeline of kt_tokenize:
 *   text -> invalid UTF-8 replaced (U+FFFD per maximal subpart)
 *        -> Kimi only: hard cuts where Moonshot's wrapper cuts (400k chars,
 *           25k-char runs of whitespace / non-whitespace)
 *        -> special tokens (leftmost-longest) -> pre-tokenizer chunks
 *        -> BPE per chunk (merge ranks, or tiktoken rank-of-concatenation)
 *
 * Where llama.cpp differs from the models' own tokenizers, kt follows the
 * model.  Differences, each marked "llama.cpp:" where it is handled:
 *   - kimi-k2 pattern: llama.cpp's hand-coded splitter ignores letter case
 *     (helloWorld stays one chunk; tiktoken splits hello|World), treats
 *     combining marks as non-letters (breaks नमस्ते at its vowel signs), uses a
 *     narrower Han set (misses 々 〇 〡-〩 radicals, Ext-G/H), and compares
 *     contractions in ASCII only ('ſ is a contraction under Unicode folding).
 *   - kimi-k2 merging: llama.cpp runs pair-rank BPE over merges its converter
 *     derived from tiktoken ranks; tiktoken looks a whole piece up first and
 *     otherwise merges by the rank of the concatenation.  kt does the latter
 *     for kimi-k2 (ids are the ranks), with or without merges in the file.
 *   - Kimi's wrapper cuts input at 400,000 characters and at 25,000-character
 *     runs of whitespace / non-whitespace (Python str.isspace) before
 *     tiktoken sees it; llama.cpp does not.
 *   - special tokens: llama.cpp matches them longest token first over the
 *     whole text; HF tokenizers (and, for non-overlapping specials, tiktoken)
 *     match leftmost-longest.  kt matches leftmost-longest.  They differ only
 *     when two special texts overlap in the input.
 *   - invalid UTF-8: llama.cpp makes one U+FFFD per bad byte; the models take
 *     Unicode strings, which standard decoders build with one U+FFFD per
 *     maximal ill-formed subpart.  kt does the latter.
 *   - decoding: characters of a normal token's text outside GPT-2's byte
 *     table decode to their own UTF-8 (HF ByteLevel); llama.cpp writes
 *     "[UNK_BYTE_0x..]".
 *   - end of generation: llama.cpp's list misses DeepSeek's <|EOT|>; kt adds
 *     it (and keeps llama.cpp's other texts, [PAD] included).
 *
 * Nothing here may print, exit, or read outside the text it is given.
 */
#include "tokenizer.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "unicode.h"

#define KIMI_MAX_ENCODE_CHARS 400000u /* tokenization_kimi.py TIKTOKEN_MAX_ENCODE_CHARS */
#define KIMI_MAX_RUN_CHARS 25000u     /* tokenization_kimi.py MAX_NO_WHITESPACES_CHARS */

enum pre_kind { PRE_DEEPSEEK3, PRE_KIMI, PRE_GPT2 };

/* ---- GPT-2 byte-level mapping --------------------------------------------------- */

/* The byte a code point of byte-level text stands for, or -1.  GPT-2 maps
 * printable Latin-1 bytes to themselves and the other 68 bytes, in order, to
 * U+0100..U+0143 (so ' ' is 'Ġ' U+0120 and '\n' is 'Ċ' U+010A). */
static int cp_to_byte(uint32_t cp)
{
    if ((cp >= 0x21 && cp <= 0x7E) || (cp >= 0xA1 && cp <= 0xAC) || (cp >= 0xAE && cp <= 0xFF))
        return (int)cp;
    if (cp >= 0x100 && cp <= 0x120)
        return (int)(cp - 0x100);
    if (cp >= 0x121 && cp <= 0x142)
        return (int)(0x7F + cp - 0x121);
    if (cp == 0x143)
        return 0xAD;
    return -1;
}

/* Decodes byte-level text s[0..n) into out (room for n bytes).  Characters
 * outside the table are copied as their UTF-8 (HF's ByteLevel decoder does
 * this; llama.cpp: "[UNK_BYTE_0x..]"); *pure says whether there were none. */
static size_t byte_level_decode(const char *s, size_t n, char *out, bool *pure)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0, o = 0;
    *pure = true;
    while (i < n) {
        size_t len;
        uint32_t cp;
        enum kt_utf8_result r = kt_utf8_next(p + i, n - i, &len, &cp);
        int b = r == KT_UTF8_OK ? cp_to_byte(cp) : -1;
        if (b >= 0) {
            out[o++] = (char)b;
        } else {
            memcpy(out + o, s + i, len);
            o += len;
            *pure = false;
        }
        i += len;
    }
    return o;
}

/* ---- arenas and hash maps --------------------------------------------------------- */

/* Byte strings back to back: item i is bytes[off[i] .. off[i + 1]). */
struct arena {
    char *bytes;
    size_t used, cap;
    uint32_t *off; /* [n + 1] */
    uint32_t n, cap_n;
};

static kt_status arena_push(struct arena *a, const char *p, size_t len)
{
    if (a->used + len > UINT32_MAX)
        return KT_ERR_FORMAT;
    if (a->used + len > a->cap) {
        size_t cap = a->cap ? a->cap : 4096;
        while (cap < a->used + len)
            cap *= 2;
        char *grown = realloc(a->bytes, cap);
        if (!grown)
            return KT_ERR_NOMEM;
        a->bytes = grown;
        a->cap = cap;
    }
    if (a->n + 2 > a->cap_n) {
        uint32_t cap_n = a->cap_n ? 2 * a->cap_n : 1024;
        uint32_t *grown = realloc(a->off, (size_t)cap_n * sizeof *grown);
        if (!grown)
            return KT_ERR_NOMEM;
        a->off = grown;
        a->cap_n = cap_n;
    }
    if (a->n == 0)
        a->off[0] = 0;
    if (len)
        memcpy(a->bytes + a->used, p, len);
    a->used += len;
    a->off[++a->n] = (uint32_t)a->used;
    return KT_OK;
}

static const char *arena_item(const struct arena *a, uint32_t i, size_t *len)
{
    *len = a->off[i + 1] - a->off[i];
    return a->bytes + a->off[i];
}

static void arena_free(struct arena *a)
{
    free(a->bytes);
    free(a->off);
}

static uint64_t mix64(uint64_t h)
{
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ull;
    h ^= h >> 33;
    return h;
}

static uint64_t hash_bytes(const char *p, size_t n)
{
    uint64_t h = 0x9E3779B97F4A7C15ull ^ n;
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        h = (h ^ w) * 0x100000001b3ull;
        h ^= h >> 29;
        p += 8;
        n -= 8;
    }
    uint64_t w = 0;
    memcpy(&w, p, n);
    return mix64(h ^ w);
}

/* Open-addressing set of arena items keyed by their bytes; slot = item + 1. */
struct strmap {
    uint32_t *slots;
    size_t mask;
    size_t count;
};

static int64_t strmap_find(const struct strmap *m, const struct arena *a, const char *p, size_t n)
{
    if (!m->slots)
        return -1;
    for (size_t k = (size_t)hash_bytes(p, n) & m->mask;; k = (k + 1) & m->mask) {
        uint32_t s = m->slots[k];
        if (!s)
            return -1;
        size_t len;
        const char *q = arena_item(a, s - 1, &len);
        if (len == n && memcmp(p, q, n) == 0)
            return s - 1;
    }
}

static void strmap_put(struct strmap *m, const struct arena *a, uint32_t item)
{
    size_t n;
    const char *p = arena_item(a, item, &n);
    size_t k = (size_t)hash_bytes(p, n) & m->mask;
    while (m->slots[k])
        k = (k + 1) & m->mask;
    m->slots[k] = item + 1;
    m->count++;
}

/* Adds item unless its bytes are already present (the first one stays). */
static kt_status strmap_add(struct strmap *m, const struct arena *a, uint32_t item)
{
    if (2 * (m->count + 1) > m->mask + 1 || !m->slots) {
        size_t n_slots = m->slots ? 2 * (m->mask + 1) : 1024;
        struct strmap grown = {calloc(n_slots, sizeof(uint32_t)), n_slots - 1, 0};
        if (!grown.slots)
            return KT_ERR_NOMEM;
        for (size_t k = 0; m->slots && k <= m->mask; k++)
            if (m->slots[k])
                strmap_put(&grown, a, m->slots[k] - 1);
        free(m->slots);
        *m = grown;
    }
    size_t n;
    const char *p = arena_item(a, item, &n);
    if (strmap_find(m, a, p, n) < 0)
        strmap_put(m, a, item);
    return KT_OK;
}

/* Open-addressing map from a 64-bit key to two 32-bit values. */
struct pair_entry {
    uint64_t key; /* UINT64_MAX: empty */
    uint32_t a, b;
};
struct pairmap {
    struct pair_entry *e;
    size_t mask;
    size_t count;
};

static const struct pair_entry *pairmap_find(const struct pairmap *m, uint64_t key)
{
    if (!m->e)
        return NULL;
    for (size_t k = (size_t)mix64(key) & m->mask;; k = (k + 1) & m->mask) {
        if (m->e[k].key == key)
            return &m->e[k];
        if (m->e[k].key == UINT64_MAX)
            return NULL;
    }
}

/* Adds key -> (a, b) unless key is present (the first one stays). */
static kt_status pairmap_add(struct pairmap *m, uint64_t key, uint32_t a, uint32_t b)
{
    if (!m->e || 2 * (m->count + 1) > m->mask + 1) {
        size_t n_slots = m->e ? 2 * (m->mask + 1) : 1024;
        struct pair_entry *e = malloc(n_slots * sizeof *e);
        if (!e)
            return KT_ERR_NOMEM;
        for (size_t k = 0; k < n_slots; k++)
            e[k].key = UINT64_MAX;
        for (size_t k = 0; m->e && k <= m->mask; k++) {
            if (m->e[k].key == UINT64_MAX)
                continue;
            size_t j = (size_t)mix64(m->e[k].key) & (n_slots - 1);
            while (e[j].key != UINT64_MAX)
                j = (j + 1) & (n_slots - 1);
            e[j] = m->e[k];
        }
        free(m->e);
        m->e = e;
        m->mask = n_slots - 1;
    }
    size_t k = (size_t)mix64(key) & m->mask;
    while (m->e[k].key != UINT64_MAX) {
        if (m->e[k].key == key)
            return KT_OK;
        k = (k + 1) & m->mask;
    }
    m->e[k] = (struct pair_entry){key, a, b};
    m->count++;
    return KT_OK;
}

/* ---- the tokenizer -------------------------------------------------------------- */

/*
 * Symbols are what BPE merges: ids below n_vocab are tokens, ids above are
 * byte strings that merges produce or consume but that are not tokens (a
 * well-formed vocabulary has none; llama.cpp keeps such strings too and
 * spells them out byte by byte at the end).
 */
struct kt_tokenizer {
    uint32_t n_vocab;
    uint8_t *type;          /* [n_vocab] enum kt_tok_type */
    uint8_t *is_eog;        /* [n_vocab] */
    int32_t *eog_ids;       /* [n_eog] ascending */
    size_t n_eog;
    struct arena text;      /* [n_vocab] token texts as in the file */
    struct strmap text_map; /* file text -> id, every token */
    struct arena sym;       /* [n_vocab] each token's bytes (its piece), then extra symbols' bytes */
    struct strmap bpe_map;  /* bytes -> symbol: mergeable tokens (NORMAL/BYTE) and extra symbols */
    uint32_t byte_sym[256]; /* symbol of each single byte */
    size_t max_sym_bytes;   /* longest key in bpe_map */
    size_t max_piece;
    bool rank_mode;         /* merge by rank of the concatenation (tiktoken) instead of merges */
    struct pairmap merges;  /* (left symbol << 32 | right symbol) -> (rank, merged symbol) */
    struct pairmap trie;    /* special texts: (node << 8 | byte) -> (child node, -) */
    int32_t *trie_token;    /* [n_nodes] special token ending at the node, or -1 */
    uint32_t n_nodes, cap_nodes;
    bool special_first[256]; /* bytes a special text can start with */
    enum pre_kind pre;
    char pre_name[64];
    int32_t bos, eos;
    bool add_bos, add_eos;
};

static bool type_mergeable(unsigned type)
{
    return type == KT_TOK_NORMAL || type == KT_TOK_UNDEFINED || type == KT_TOK_BYTE;
}

static bool type_special(unsigned type)
{
    return type == KT_TOK_CONTROL || type == KT_TOK_USER_DEFINED || type == KT_TOK_UNKNOWN;
}

/* Symbol for bytes p[0..n): the token or extra symbol with those bytes, added if absent. */
static kt_status symbol_for(struct kt_tokenizer *t, const char *p, size_t n, uint32_t *sym)
{
    int64_t s = strmap_find(&t->bpe_map, &t->sym, p, n);
    if (s >= 0) {
        *sym = (uint32_t)s;
        return KT_OK;
    }
    if (t->sym.n == UINT32_MAX - 1)
        return KT_ERR_FORMAT;
    kt_status st = arena_push(&t->sym, p, n);
    if (st == KT_OK)
        st = strmap_add(&t->bpe_map, &t->sym, t->sym.n - 1);
    if (n > t->max_sym_bytes)
        t->max_sym_bytes = n;
    *sym = t->sym.n - 1;
    return st;
}

static kt_status trie_node_new(struct kt_tokenizer *t, uint32_t *node)
{
    if (t->n_nodes == t->cap_nodes) {
        uint32_t cap = t->cap_nodes ? 2 * t->cap_nodes : 256;
        int32_t *grown = realloc(t->trie_token, (size_t)cap * sizeof *grown);
        if (!grown)
            return KT_ERR_NOMEM;
        t->trie_token = grown;
        t->cap_nodes = cap;
    }
    t->trie_token[t->n_nodes] = -1;
    *node = t->n_nodes++;
    return KT_OK;
}

static kt_status trie_add(struct kt_tokenizer *t, const char *s, size_t n, int32_t id)
{
    uint32_t node = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t key = (uint64_t)node << 8 | (unsigned char)s[i];
        const struct pair_entry *e = pairmap_find(&t->trie, key);
        if (e) {
            node = e->a;
            continue;
        }
        uint32_t child;
        kt_status st = trie_node_new(t, &child);
        if (st == KT_OK)
            st = pairmap_add(&t->trie, key, child, 0);
        if (st != KT_OK)
            return st;
        node = child;
    }
    if (t->trie_token[node] < 0) /* two tokens with one text: the first id wins */
        t->trie_token[node] = id;
    t->special_first[(unsigned char)s[0]] = true;
    return KT_OK;
}

/* Texts that end generation whatever their id (llama.cpp's list, the ones of
 * these families first, plus DeepSeek's <|EOT|>, which llama.cpp misses). */
static const char *const eog_texts[] = {
    "<|im_end|>", "[EOT]", "[EOS]", "<｜end▁of▁sentence｜>", "<|EOT|>", "<|endoftext|>", "<|eot_id|>",
    "<|eom_id|>", "<|end|>", "<|end_of_text|>", "<end_of_turn>", "<EOT>", "_<EOT>",
    /* llama.cpp makes FIM padding tokens EOG; Kimi's [PAD] is one. */
    "[PAD]", "<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>",
};

static kt_status read_id(const struct kt_gguf *g, const char *key, uint32_t n_vocab, int32_t *out, kt_err *err)
{
    uint32_t v;
    kt_err e2 = {0};
    kt_status st = kt_gguf_get_uint32(g, key, &v, &e2);
    *out = -1;
    if (st == KT_ERR_NOT_FOUND)
        return KT_OK;
    if (st != KT_OK)
        return kt_err_set(err, st, "tokenizer: %s", e2.msg);
    if (v < n_vocab) /* out of range: ignored, as llama.cpp does */
        *out = (int32_t)v;
    return KT_OK;
}

static kt_status read_bool(const struct kt_gguf *g, const char *key, bool *out, kt_err *err)
{
    kt_err e2 = {0};
    kt_status st = kt_gguf_get_bool(g, key, out, &e2);
    if (st == KT_ERR_NOT_FOUND) {
        *out = false;
        return KT_OK;
    }
    return st == KT_OK ? KT_OK : kt_err_set(err, st, "tokenizer: %s", e2.msg);
}

static kt_status load_tokens(struct kt_tokenizer *t, const struct kt_gguf *g, kt_err *err)
{
    const struct kt_gguf_array *tokens, *types = NULL;
    kt_err e2 = {0};
    kt_status st = kt_gguf_get_array(g, "tokenizer.ggml.tokens", &tokens, &e2);
    if (st != KT_OK)
        return kt_err_set(err, st == KT_ERR_NOT_FOUND ? KT_ERR_FORMAT : st, "tokenizer: %s", e2.msg);
    if (tokens->elem_type != KT_GGUF_STRING || tokens->count == 0 || tokens->count > INT32_MAX / 2)
        return kt_err_set(err, KT_ERR_FORMAT, "tokenizer: tokenizer.ggml.tokens must be a non-empty string array "
                          "of fewer than 2^30 entries");
    t->n_vocab = (uint32_t)tokens->count;
    st = kt_gguf_get_array(g, "tokenizer.ggml.token_type", &types, &e2);
    if (st == KT_ERR_NOT_FOUND)
        types = NULL;
    else if (st != KT_OK)
        return kt_err_set(err, st, "tokenizer: %s", e2.msg);
    else if (types->count != tokens->count)
        return kt_err_set(err, KT_ERR_FORMAT, "tokenizer: %llu token types for %u tokens",
                          (unsigned long long)types->count, t->n_vocab);

    t->type = malloc(t->n_vocab);
    t->is_eog = calloc(t->n_vocab, 1);
    if (!t->type || !t->is_eog)
        return kt_err_set(err, KT_ERR_NOMEM, "tokenizer: out of memory for %u tokens", t->n_vocab);
    st = KT_OK;
    char *piece = NULL; /* one token's decoded bytes, grown as needed; freed on every return */
    size_t piece_cap = 0;
    for (uint32_t id = 0; id < t->n_vocab; id++) {
        int64_t ty = KT_TOK_NORMAL;
        if (types && !kt_gguf_array_int(types, id, &ty)) {
            st = kt_err_set(err, KT_ERR_FORMAT, "tokenizer: tokenizer.ggml.token_type is an array of %s, not of "
                            "integers", kt_gguf_type_name(types->elem_type));
            goto done;
        }
        if (ty < KT_TOK_UNDEFINED || ty > KT_TOK_BYTE) {
            st = kt_err_set(err, KT_ERR_FORMAT, "tokenizer: token %u has type %lld in tokenizer.ggml.token_type "
                            "(types are %d .. %d)", id, (long long)ty, KT_TOK_UNDEFINED, KT_TOK_BYTE);
            goto done;
        }
        t->type[id] = (uint8_t)ty;
        const struct kt_gguf_str *s = &tokens->items[id].str;
        if ((st = arena_push(&t->text, s->ptr, s->len)) != KT_OK)
            goto fail;
        if ((st = strmap_add(&t->text_map, &t->text, id)) != KT_OK)
            goto fail;

        /* the piece: literal for specials, byte-level decoded otherwise, nothing for UNUSED */
        bool pure = false;
        size_t n = 0;
        if (s->len > piece_cap) {
            piece_cap = 2 * s->len;
            char *grown = realloc(piece, piece_cap);
            if (!grown) {
                st = KT_ERR_NOMEM;
                goto fail;
            }
            piece = grown;
        }
        if (type_special((unsigned)ty)) {
            memcpy(piece, s->ptr, s->len);
            n = s->len;
        } else if (ty != KT_TOK_UNUSED) {
            n = byte_level_decode(s->ptr, s->len, piece, &pure);
        }
        if ((st = arena_push(&t->sym, piece, n)) != KT_OK)
            goto fail;
        if (n > t->max_piece)
            t->max_piece = n;
        if (pure && n > 0 && type_mergeable((unsigned)ty)) {
            if ((st = strmap_add(&t->bpe_map, &t->sym, id)) != KT_OK)
                goto fail;
            if (n > t->max_sym_bytes)
                t->max_sym_bytes = n;
        }
        if (type_special((unsigned)ty) && s->len > 0 && kt_utf8_valid(s->ptr, s->len) &&
            (st = trie_add(t, s->ptr, s->len, (int32_t)id)) != KT_OK)
            goto fail;
    }
    goto done;
fail:
    st = kt_err_set(err, st, "tokenizer: %s loading %u tokens",
                    st == KT_ERR_NOMEM ? "out of memory" : "more than 4 GiB of text", t->n_vocab);
done:
    free(piece);
    return st;
}

static kt_status load_merges(struct kt_tokenizer *t, const struct kt_gguf_array *merges, kt_err *err)
{
    char *buf = NULL; /* one merge's decoded bytes, grown as needed; freed on every return */
    size_t buf_cap = 0;
    kt_status st = KT_OK;
    for (uint64_t r = 0; r < merges->count; r++) {
        const struct kt_gguf_str *s = &merges->items[r].str;
        /* "left right", split at the first space after the first byte */
        const char *sp = s->len > 1 ? memchr(s->ptr + 1, ' ', s->len - 1) : NULL;
        if (!sp) {
            st = kt_err_set(err, KT_ERR_FORMAT, "tokenizer: merge %llu (\"%.*s\") of tokenizer.ggml.merges has no "
                            "space between its two parts", (unsigned long long)r, (int)(s->len < 64 ? s->len : 64),
                            s->ptr);
            goto done;
        }
        if (s->len > buf_cap) {
            buf_cap = 2 * s->len;
            char *grown = realloc(buf, buf_cap);
            if (!grown) {
                st = KT_ERR_NOMEM;
                goto fail;
            }
            buf = grown;
        }
        size_t nl = (size_t)(sp - s->ptr), nr = s->len - nl - 1;
        bool pure_l, pure_r;
        size_t bl = byte_level_decode(s->ptr, nl, buf, &pure_l);
        size_t br = byte_level_decode(sp + 1, nr, buf + bl, &pure_r);
        if (!pure_l || !pure_r || bl == 0 || br == 0)
            continue; /* can never apply: symbols are byte strings */
        uint32_t left, right, merged;
        if ((st = symbol_for(t, buf, bl, &left)) != KT_OK || (st = symbol_for(t, buf + bl, br, &right)) != KT_OK ||
            (st = symbol_for(t, buf, bl + br, &merged)) != KT_OK ||
            (st = pairmap_add(&t->merges, (uint64_t)left << 32 | right, (uint32_t)r, merged)) != KT_OK)
            goto fail;
    }
    goto done;
fail:
    st = kt_err_set(err, st, "tokenizer: %s loading %llu merges",
                    st == KT_ERR_NOMEM ? "out of memory" : "more than 2^32 symbols or 4 GiB of their text",
                    (unsigned long long)merges->count);
done:
    free(buf);
    return st;
}

static kt_status load_eog(struct kt_tokenizer *t, const struct kt_gguf *g, kt_err *err)
{
    static const char *const id_keys[] = {"tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id",
                                          "tokenizer.ggml.eom_token_id"};
    for (size_t k = 0; k < sizeof id_keys / sizeof id_keys[0]; k++) {
        int32_t id;
        kt_status st = read_id(g, id_keys[k], t->n_vocab, &id, err);
        if (st != KT_OK)
            return st;
        if (id >= 0)
            t->is_eog[id] = 1;
    }
    for (size_t k = 0; k < sizeof eog_texts / sizeof eog_texts[0]; k++) {
        int32_t id = kt_token_find(t, eog_texts[k], strlen(eog_texts[k]));
        if (id >= 0 && type_special(t->type[id]))
            t->is_eog[id] = 1;
    }
    for (uint32_t id = 0; id < t->n_vocab; id++)
        t->n_eog += t->is_eog[id];
    t->eog_ids = malloc((t->n_eog ? t->n_eog : 1) * sizeof *t->eog_ids);
    if (!t->eog_ids)
        return kt_err_set(err, KT_ERR_NOMEM, "tokenizer: out of memory");
    size_t k = 0;
    for (uint32_t id = 0; id < t->n_vocab; id++)
        if (t->is_eog[id])
            t->eog_ids[k++] = (int32_t)id;
    return KT_OK;
}

kt_status kt_tokenizer_create(const struct kt_gguf *g, struct kt_tokenizer **out, kt_err *err)
{
    if (!out)
        return kt_err_set(err, KT_ERR_INVALID, "tokenizer: no output pointer");
    *out = NULL;
    if (!g)
        return kt_err_set(err, KT_ERR_INVALID, "tokenizer: no GGUF file");
    struct kt_gguf_str model, pre;
    kt_err e2 = {0};
    kt_status st = kt_gguf_get_str(g, "tokenizer.ggml.model", &model, &e2);
    if (st != KT_OK)
        return kt_err_set(err, st == KT_ERR_NOT_FOUND ? KT_ERR_FORMAT : st, "tokenizer: %s", e2.msg);
    if (model.len != 4 || memcmp(model.ptr, "gpt2", 4) != 0)
        return kt_err_set(err, KT_ERR_UNSUPPORTED, "tokenizer: tokenizer.ggml.model \"%.*s\" is not supported "
                          "(kt runs byte-level BPE, \"gpt2\")", (int)(model.len < 64 ? model.len : 64), model.ptr);
    st = kt_gguf_get_str(g, "tokenizer.ggml.pre", &pre, &e2);
    if (st == KT_ERR_NOT_FOUND)
        pre = (struct kt_gguf_str){"gpt2", 4};
    else if (st != KT_OK)
        return kt_err_set(err, st, "tokenizer: %s", e2.msg);

    struct kt_tokenizer *t = calloc(1, sizeof *t);
    if (!t)
        return kt_err_set(err, KT_ERR_NOMEM, "tokenizer: out of memory");
    size_t np = pre.len < sizeof t->pre_name - 1 ? pre.len : sizeof t->pre_name - 1;
    memcpy(t->pre_name, pre.ptr, np);
    t->pre_name[np] = 0;
    if (strcmp(t->pre_name, "deepseek-v3") == 0 && pre.len == np) {
        t->pre = PRE_DEEPSEEK3;
    } else if (strcmp(t->pre_name, "kimi-k2") == 0 && pre.len == np) {
        t->pre = PRE_KIMI;
    } else if (strcmp(t->pre_name, "gpt2") == 0 && pre.len == np) {
        t->pre = PRE_GPT2;
    } else {
        st = kt_err_set(err, KT_ERR_UNSUPPORTED, "tokenizer: pre-tokenizer \"%.*s\" is not supported "
                        "(kt knows deepseek-v3, kimi-k2, gpt2)", (int)(pre.len < 64 ? pre.len : 64), pre.ptr);
        goto fail;
    }

    uint32_t root;
    if ((st = trie_node_new(t, &root)) != KT_OK) {
        kt_err_set(err, st, "tokenizer: out of memory");
        goto fail;
    }
    if ((st = load_tokens(t, g, err)) != KT_OK)
        goto fail;
    for (unsigned b = 0; b < 256; b++) {
        char c = (char)b;
        if ((st = symbol_for(t, &c, 1, &t->byte_sym[b])) != KT_OK) {
            kt_err_set(err, st, "tokenizer: out of memory");
            goto fail;
        }
    }

    const struct kt_gguf_array *merges = NULL;
    st = kt_gguf_get_array(g, "tokenizer.ggml.merges", &merges, &e2);
    if (st != KT_OK && st != KT_ERR_NOT_FOUND) {
        kt_err_set(err, st, "tokenizer: %s", e2.msg);
        goto fail;
    }
    if (st == KT_OK && merges->count > 0 && merges->elem_type != KT_GGUF_STRING) {
        st = kt_err_set(err, KT_ERR_FORMAT, "tokenizer: tokenizer.ggml.merges is not a string array");
        goto fail;
    }
    /* Kimi's own tokenizer is tiktoken: its ranks are the token ids, and the
     * merges in a GGUF file were derived from them (llama.cpp: merges). */
    t->rank_mode = st == KT_ERR_NOT_FOUND || merges->count == 0 || t->pre == PRE_KIMI;
    if (!t->rank_mode && (st = load_merges(t, merges, err)) != KT_OK)
        goto fail;

    if ((st = read_id(g, "tokenizer.ggml.bos_token_id", t->n_vocab, &t->bos, err)) != KT_OK ||
        (st = read_id(g, "tokenizer.ggml.eos_token_id", t->n_vocab, &t->eos, err)) != KT_OK ||
        (st = read_bool(g, "tokenizer.ggml.add_bos_token", &t->add_bos, err)) != KT_OK ||
        (st = read_bool(g, "tokenizer.ggml.add_eos_token", &t->add_eos, err)) != KT_OK ||
        (st = load_eog(t, g, err)) != KT_OK)
        goto fail;
    *out = t;
    return KT_OK;
fail:
    kt_tokenizer_destroy(t);
    return st;
}

void kt_tokenizer_destroy(struct kt_tokenizer *t)
{
    if (!t)
        return;
    free(t->type);
    free(t->is_eog);
    free(t->eog_ids);
    arena_free(&t->text);
    free(t->text_map.slots);
    arena_free(&t->sym);
    free(t->bpe_map.slots);
    free(t->merges.e);
    free(t->trie.e);
    free(t->trie_token);
    free(t);
}

int32_t kt_tokenizer_n_vocab(const struct kt_tokenizer *t) { return (int32_t)t->n_vocab; }
int32_t kt_tokenizer_bos(const struct kt_tokenizer *t) { return t->bos; }
int32_t kt_tokenizer_eos(const struct kt_tokenizer *t) { return t->eos; }
bool kt_tokenizer_add_bos(const struct kt_tokenizer *t) { return t->add_bos && t->bos >= 0; }
const char *kt_tokenizer_pre(const struct kt_tokenizer *t) { return t->pre_name; }
size_t kt_tokenizer_max_piece(const struct kt_tokenizer *t) { return t->max_piece; }

/* ---- encoding state ------------------------------------------------------------------ */

struct bpe_sym {
    uint32_t start, len; /* bytes of the chunk; len 0 once merged into its left neighbour */
    int32_t prev, next;  /* -1 at the ends */
    uint32_t sym;
};

struct bpe_cand {
    uint32_t rank, left, left_len, right_len, merged;
};

/* One kt_tokenize call's scratch and output; never shared between calls. */
struct enc {
    const struct kt_tokenizer *t;
    /* the fragment being pre-tokenized, as code points */
    const char *frag;
    uint32_t *cp;  /* [n_cp] */
    uint8_t *pr;   /* [n_cp] kt_unicode_props */
    size_t *off;   /* [n_cp + 1] byte offset of each code point in frag */
    size_t n_cp, cap_cp;
    /* BPE */
    struct bpe_sym *syms;
    size_t cap_syms;
    struct bpe_cand *heap;
    size_t n_heap, cap_heap;
    /* output */
    int32_t *ids;
    size_t n_ids, cap_ids;
    kt_status st; /* KT_ERR_NOMEM once an allocation failed; everything after is skipped */
};

static bool grow(struct enc *e, void **p, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap)
        return true;
    size_t cap2 = *cap ? *cap : 64;
    while (cap2 < need)
        cap2 *= 2;
    void *q = realloc(*p, cap2 * elem);
    if (!q) {
        e->st = KT_ERR_NOMEM;
        return false;
    }
    *p = q;
    *cap = cap2;
    return true;
}

static void emit_id(struct enc *e, int32_t id)
{
    if (e->st == KT_OK && grow(e, (void **)&e->ids, &e->cap_ids, e->n_ids + 1, sizeof *e->ids))
        e->ids[e->n_ids++] = id;
}

/* ---- BPE ------------------------------------------------------------------------ */

static bool cand_less(const struct bpe_cand *a, const struct bpe_cand *b)
{
    return a->rank < b->rank || (a->rank == b->rank && a->left < b->left);
}

static void heap_push(struct enc *e, struct bpe_cand c)
{
    if (!grow(e, (void **)&e->heap, &e->cap_heap, e->n_heap + 1, sizeof *e->heap))
        return;
    size_t i = e->n_heap++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!cand_less(&c, &e->heap[parent]))
            break;
        e->heap[i] = e->heap[parent];
        i = parent;
    }
    e->heap[i] = c;
}

static struct bpe_cand heap_pop(struct enc *e)
{
    struct bpe_cand top = e->heap[0], last = e->heap[--e->n_heap];
    size_t i = 0, n = e->n_heap;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n)
            break;
        if (c + 1 < n && cand_less(&e->heap[c + 1], &e->heap[c]))
            c++;
        if (!cand_less(&e->heap[c], &last))
            break;
        e->heap[i] = e->heap[c];
        i = c;
    }
    if (n > 0)
        e->heap[i] = last;
    return top;
}

/* Queues the merge of symbols l and r if one exists. */
static void try_pair(struct enc *e, const char *chunk, int32_t l, int32_t r)
{
    if (l < 0 || r < 0)
        return;
    const struct kt_tokenizer *t = e->t;
    const struct bpe_sym *a = &e->syms[l], *b = &e->syms[r];
    uint32_t rank, merged;
    if (t->rank_mode) {
        size_t n = (size_t)a->len + b->len;
        if (n > t->max_sym_bytes)
            return;
        int64_t id = strmap_find(&t->bpe_map, &t->sym, chunk + a->start, n);
        if (id < 0 || id >= t->n_vocab)
            return;
        rank = merged = (uint32_t)id;
    } else {
        const struct pair_entry *m = pairmap_find(&t->merges, (uint64_t)a->sym << 32 | b->sym);
        if (!m)
            return;
        rank = m->a;
        merged = m->b;
    }
    heap_push(e, (struct bpe_cand){rank, (uint32_t)l, a->len, b->len, merged});
}

/* Emits a final symbol: a token, or (not a token) its bytes' tokens. */
static void emit_symbol(struct enc *e, const char *chunk, const struct bpe_sym *s)
{
    const struct kt_tokenizer *t = e->t;
    if (s->sym < t->n_vocab) {
        emit_id(e, (int32_t)s->sym);
        return;
    }
    for (uint32_t i = 0; i < s->len; i++) {
        uint32_t b = t->byte_sym[(unsigned char)chunk[s->start + i]];
        if (b < t->n_vocab) /* a vocabulary without this byte loses it, as llama.cpp does */
            emit_id(e, (int32_t)b);
    }
}

static void bpe_chunk(struct enc *e, const char *chunk, size_t n)
{
    const struct kt_tokenizer *t = e->t;
    if (e->st != KT_OK || n == 0)
        return;
    if (t->rank_mode && n <= t->max_sym_bytes) {
        /* tiktoken looks the whole piece up before merging */
        int64_t id = strmap_find(&t->bpe_map, &t->sym, chunk, n);
        if (id >= 0 && id < t->n_vocab) {
            emit_id(e, (int32_t)id);
            return;
        }
    }
    if (n > INT32_MAX || !grow(e, (void **)&e->syms, &e->cap_syms, n, sizeof *e->syms)) {
        e->st = KT_ERR_NOMEM;
        return;
    }
    for (size_t i = 0; i < n; i++)
        e->syms[i] = (struct bpe_sym){(uint32_t)i, 1, (int32_t)i - 1, i + 1 < n ? (int32_t)i + 1 : -1,
                                      t->byte_sym[(unsigned char)chunk[i]]};
    e->n_heap = 0;
    for (size_t i = 0; i + 1 < n; i++)
        try_pair(e, chunk, (int32_t)i, (int32_t)i + 1);
    while (e->n_heap > 0 && e->st == KT_OK) {
        struct bpe_cand c = heap_pop(e);
        struct bpe_sym *l = &e->syms[c.left];
        if (l->len != c.left_len || l->next < 0)
            continue; /* stale: the left symbol changed */
        struct bpe_sym *r = &e->syms[l->next];
        if (r->len != c.right_len)
            continue;
        l->len += r->len;
        l->sym = c.merged;
        l->next = r->next;
        if (r->next >= 0)
            e->syms[r->next].prev = (int32_t)c.left;
        r->len = 0;
        try_pair(e, chunk, l->prev, (int32_t)c.left);
        try_pair(e, chunk, (int32_t)c.left, l->next);
    }
    for (int32_t i = 0; i >= 0 && e->st == KT_OK; i = e->syms[i].next)
        emit_symbol(e, chunk, &e->syms[i]);
}

static void emit_chunk(struct enc *e, size_t a, size_t b)
{
    if (b > a)
        bpe_chunk(e, e->frag + e->off[a], e->off[b] - e->off[a]);
}

/* ---- pre-tokenizers ------------------------------------------------------------------- */

static unsigned catbit(const struct enc *e, size_t i) { return 1u << (e->pr[i] & KT_UPROP_CAT); }
static bool is_ws(const struct enc *e, size_t i) { return e->pr[i] & KT_UPROP_WHITE_SPACE; }
static bool is_crlf(const struct enc *e, size_t i) { return e->cp[i] == '\r' || e->cp[i] == '\n'; }
static bool is_ascii_alpha(uint32_t c) { return (c | 0x20) >= 'a' && (c | 0x20) <= 'z'; }

/* Whitespace at i, end of the string at end:
 *   \s*[\r\n]+ | \s+(?!\S) | \s+
 * The first ends after the run's last \r or \n; the second keeps all of a
 * run that ends the string, else all but the last character (which then
 * leads the next word); the third takes a single space before a non-space. */
static size_t match_spaces(const struct enc *e, size_t i, size_t end, bool crlf_alt)
{
    size_t j = i;
    while (j < end && is_ws(e, j))
        j++;
    if (j == i)
        return i; /* not whitespace: no match */
    if (crlf_alt)
        for (size_t k = j; k > i; k--)
            if (is_crlf(e, k - 1))
                return k;
    if (j == end || j - i == 1)
        return j;
    return j - 1;
}

typedef size_t (*match_fn)(const struct enc *e, size_t i, size_t end);
typedef void (*chunk_fn)(struct enc *e, size_t a, size_t b);

/* HF Split(behavior: Isolated) / llama.cpp's regex split: the leftmost match
 * at each position and the gaps between matches each become a chunk. */
static void split_isolated(struct enc *e, size_t a, size_t b, match_fn match, chunk_fn next)
{
    size_t gap = a, i = a;
    while (i < b && e->st == KT_OK) {
        size_t m = match(e, i, b);
        if (m <= i) {
            i++;
            continue;
        }
        if (gap < i)
            next(e, gap, i);
        next(e, i, m);
        i = gap = m;
    }
    if (gap < b)
        next(e, gap, b);
}

/* \p{N}{1,3} */
static size_t match_digits3(const struct enc *e, size_t i, size_t end)
{
    size_t j = i;
    while (j < end && j < i + 3 && (catbit(e, j) & KT_UCAT_N))
        j++;
    return j;
}

/* DeepSeek-V3 pass 2: [一-龥぀-ゟ゠-ヿ]+, literally U+4E00-9FA5, U+3040-30FF. */
static size_t match_ds3_cjk(const struct enc *e, size_t i, size_t end)
{
    size_t j = i;
    while (j < end && ((e->cp[j] >= 0x4E00 && e->cp[j] <= 0x9FA5) || (e->cp[j] >= 0x3040 && e->cp[j] <= 0x30FF)))
        j++;
    return j;
}

/* DeepSeek-V3 pass 3, one alternative after another:
 *   [!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+
 *   [^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+
 *    ?[\p{P}\p{S}]+[\r\n]*
 *   \s*[\r\n]+ | \s+(?!\S) | \s+                                                   */
static size_t match_ds3_word(const struct enc *e, size_t i, size_t end)
{
    uint32_t c = e->cp[i];
    unsigned cb = catbit(e, i);
    size_t j;
    bool ascii_punct = (c >= 0x21 && c <= 0x2F) || (c >= 0x3A && c <= 0x40) || (c >= 0x5B && c <= 0x60) ||
                       (c >= 0x7B && c <= 0x7E);
    if (ascii_punct && i + 1 < end && is_ascii_alpha(e->cp[i + 1])) {
        for (j = i + 1; j < end && is_ascii_alpha(e->cp[j]);)
            j++;
        return j;
    }
    const unsigned lm = KT_UCAT_L | KT_UCAT_M, ps = KT_UCAT_P | KT_UCAT_S;
    j = i;
    if (c != '\r' && c != '\n' && !(cb & (KT_UCAT_L | ps)) && i + 1 < end && (catbit(e, i + 1) & lm))
        j = i + 1; /* the optional leading character */
    if (catbit(e, j) & lm) {
        while (j < end && (catbit(e, j) & lm))
            j++;
        return j;
    }
    j = (c == ' ' && i + 1 < end && (catbit(e, i + 1) & ps)) ? i + 1 : i;
    if (catbit(e, j) & ps) {
        while (j < end && (catbit(e, j) & ps))
            j++;
        while (j < end && is_crlf(e, j))
            j++;
        return j;
    }
    if (is_ws(e, i))
        return match_spaces(e, i, end, true);
    return i;
}

static void ds3_pass3(struct enc *e, size_t a, size_t b) { split_isolated(e, a, b, match_ds3_word, emit_chunk); }
static void ds3_pass2(struct enc *e, size_t a, size_t b) { split_isolated(e, a, b, match_ds3_cjk, ds3_pass3); }

/* Kimi-K2 (tiktoken pat_str, tokenization_kimi.py):
 *   [\p{Han}]+
 * | [^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?
 * | [^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?
 * | \p{N}{1,3}
 * |  ?[^\s\p{L}\p{N}]+[\r\n]*
 * | \s*[\r\n]+ | \s+(?!\S) | \s+
 * with U = the first letter class ("upper"), W = the second ("lower"); Lm,
 * Lo and marks are in both.  The pattern covers every character, so tiktoken
 * (which drops unmatched text) never drops any. */
static bool kimi_u(const struct enc *e, size_t i)
{
    return !(e->pr[i] & KT_UPROP_HAN) &&
           (catbit(e, i) & (KT_UCAT_BIT(LU) | KT_UCAT_BIT(LT) | KT_UCAT_BIT(LM) | KT_UCAT_BIT(LO) | KT_UCAT_M));
}

static bool kimi_w(const struct enc *e, size_t i)
{
    return !(e->pr[i] & KT_UPROP_HAN) &&
           (catbit(e, i) & (KT_UCAT_BIT(LL) | KT_UCAT_BIT(LM) | KT_UCAT_BIT(LO) | KT_UCAT_M));
}

/* (?i:'s|'t|'re|'ve|'m|'ll|'d) at i: its length or 0.  Case-insensitive is
 * Unicode simple case folding, so 'ſ (U+017F) counts (llama.cpp: ASCII only). */
static size_t match_contraction(const struct enc *e, size_t i, size_t end)
{
    if (i + 1 >= end || e->cp[i] != '\'')
        return 0;
    char c1 = kt_unicode_contraction_letter(e->cp[i + 1]);
    char c2 = i + 2 < end ? kt_unicode_contraction_letter(e->cp[i + 2]) : 0;
    if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd')
        return 2;
    if (((c1 == 'r' || c1 == 'v') && c2 == 'e') || (c1 == 'l' && c2 == 'l'))
        return 3;
    return 0;
}

/* U* W+ C? at s, with the backtracking the regex does: if the greedy U run
 * is not followed by a W, the match ends after the run's last W character. */
static size_t match_kimi_lower(const struct enc *e, size_t s, size_t end)
{
    size_t r = s, last_w = SIZE_MAX, m;
    while (r < end && kimi_u(e, r)) {
        if (kimi_w(e, r))
            last_w = r;
        r++;
    }
    if (r < end && kimi_w(e, r)) {
        while (r < end && kimi_w(e, r))
            r++;
        m = r;
    } else if (last_w != SIZE_MAX) {
        m = last_w + 1;
    } else {
        return s;
    }
    return m + match_contraction(e, m, end);
}

/* U+ W* C? at s. */
static size_t match_kimi_upper(const struct enc *e, size_t s, size_t end)
{
    size_t r = s;
    while (r < end && kimi_u(e, r))
        r++;
    if (r == s)
        return s;
    while (r < end && kimi_w(e, r))
        r++;
    return r + match_contraction(e, r, end);
}

static size_t match_kimi(const struct enc *e, size_t i, size_t end)
{
    size_t j;
    if (e->pr[i] & KT_UPROP_HAN) {
        for (j = i; j < end && (e->pr[j] & KT_UPROP_HAN);)
            j++;
        return j;
    }
    unsigned cb = catbit(e, i);
    bool lead = !is_crlf(e, i) && !(cb & (KT_UCAT_L | KT_UCAT_N)) && i + 1 < end;
    if (lead && (j = match_kimi_lower(e, i + 1, end)) > i + 1)
        return j;
    if ((j = match_kimi_lower(e, i, end)) > i)
        return j;
    if (lead && (j = match_kimi_upper(e, i + 1, end)) > i + 1)
        return j;
    if ((j = match_kimi_upper(e, i, end)) > i)
        return j;
    if (cb & KT_UCAT_N)
        return match_digits3(e, i, end);
    /*  ?[^\s\p{L}\p{N}]+[\r\n]* */
    const unsigned ln = KT_UCAT_L | KT_UCAT_N;
    j = (e->cp[i] == ' ' && i + 1 < end && !is_ws(e, i + 1) && !(catbit(e, i + 1) & ln)) ? i + 1 : i;
    if (!is_ws(e, j) && !(catbit(e, j) & ln)) {
        while (j < end && !is_ws(e, j) && !(catbit(e, j) & ln))
            j++;
        while (j < end && is_crlf(e, j))
            j++;
        return j;
    }
    return match_spaces(e, i, end, true);
}

/* GPT-2: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ */
static size_t match_gpt2(const struct enc *e, size_t i, size_t end)
{
    uint32_t c = e->cp[i];
    size_t j;
    if (c == '\'' && i + 1 < end) {
        uint32_t c1 = e->cp[i + 1], c2 = i + 2 < end ? e->cp[i + 2] : 0;
        if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd')
            return i + 2;
        if (((c1 == 'r' || c1 == 'v') && c2 == 'e') || (c1 == 'l' && c2 == 'l'))
            return i + 3;
    }
    size_t s = (c == ' ' && i + 1 < end) ? i + 1 : i;
    const unsigned classes[2] = {KT_UCAT_L, KT_UCAT_N};
    for (int k = 0; k < 2; k++) {
        j = (catbit(e, s) & classes[k]) ? s : i;
        if (catbit(e, j) & classes[k]) {
            while (j < end && (catbit(e, j) & classes[k]))
                j++;
            return j;
        }
    }
    const unsigned ln = KT_UCAT_L | KT_UCAT_N;
    j = (!is_ws(e, s) && !(catbit(e, s) & ln)) ? s : i;
    if (!is_ws(e, j) && !(catbit(e, j) & ln)) {
        while (j < end && !is_ws(e, j) && !(catbit(e, j) & ln))
            j++;
        return j;
    }
    return match_spaces(e, i, end, false);
}

/* Pre-tokenizes and BPE-encodes n bytes that contain no special token. */
static void encode_text(struct enc *e, const char *s, size_t n)
{
    if (n == 0 || e->st != KT_OK)
        return;
    size_t old_cap = e->cap_cp;
    if (!grow(e, (void **)&e->cp, &e->cap_cp, n + 1, sizeof *e->cp))
        return;
    if (e->cap_cp != old_cap || !e->pr || !e->off) { /* pr and off follow cp's capacity */
        uint8_t *pr = realloc(e->pr, e->cap_cp);
        if (pr)
            e->pr = pr;
        size_t *off = pr ? realloc(e->off, e->cap_cp * sizeof *off) : NULL;
        if (off)
            e->off = off;
        if (!pr || !off) {
            e->st = KT_ERR_NOMEM;
            return;
        }
    }
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0, k = 0;
    while (i < n) {
        size_t len = 1;
        uint32_t c = p[i];
        if (c >= 0x80)
            kt_utf8_next(p + i, n - i, &len, &c); /* U+FFFD for the (unexpected) ill-formed bytes */
        e->cp[k] = c;
        e->pr[k] = (uint8_t)kt_unicode_props(c);
        e->off[k] = i;
        k++;
        i += len;
    }
    e->off[k] = n;
    e->n_cp = k;
    e->frag = s;
    switch (e->t->pre) {
    case PRE_DEEPSEEK3:
        split_isolated(e, 0, k, match_digits3, ds3_pass2);
        break;
    case PRE_KIMI:
        split_isolated(e, 0, k, match_kimi, emit_chunk);
        break;
    case PRE_GPT2:
        split_isolated(e, 0, k, match_gpt2, emit_chunk);
        break;
    }
}

/* Length of the special token at s[0..n) (leftmost-longest: the caller scans
 * left to right, this picks the longest allowed text), 0 if none. */
static size_t match_special(const struct kt_tokenizer *t, const char *s, size_t n, bool parse_special, int32_t *id)
{
    uint32_t node = 0;
    size_t best = 0;
    for (size_t k = 0; k < n; k++) {
        const struct pair_entry *c = pairmap_find(&t->trie, (uint64_t)node << 8 | (unsigned char)s[k]);
        if (!c)
            break;
        node = c->a;
        int32_t tok = t->trie_token[node];
        if (tok >= 0 && (parse_special || t->type[tok] == KT_TOK_USER_DEFINED)) {
            best = k + 1;
            *id = tok;
        }
    }
    return best;
}

/* Special tokens, then the pre-tokenizer and BPE on the text between them. */
static void encode_segment(struct enc *e, const char *s, size_t n, bool parse_special)
{
    size_t start = 0;
    for (size_t i = 0; i < n && e->st == KT_OK; i++) {
        if (!e->t->special_first[(unsigned char)s[i]])
            continue;
        int32_t id;
        size_t len = match_special(e->t, s + i, n - i, parse_special, &id);
        if (len == 0)
            continue;
        encode_text(e, s + start, i - start);
        emit_id(e, id);
        start = i + len;
        i = start - 1;
    }
    encode_text(e, s + start, n - start);
}

/* Moonshot's wrapper: 400k-character slices, each cut so that no substring
 * holds more than 25k consecutive whitespace or non-whitespace characters
 * (Python isspace); each substring is encoded on its own. */
static void encode_kimi(struct enc *e, const char *s, size_t n, bool parse_special)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0, sub = 0, n_chars = 0, run = 0;
    bool run_space = false;
    while (i < n && e->st == KT_OK) {
        size_t len = 1;
        uint32_t c = p[i];
        if (c >= 0x80)
            kt_utf8_next(p + i, n - i, &len, &c);
        bool space = kt_unicode_props(c) & KT_UPROP_PY_SPACE;
        if (n_chars % KIMI_MAX_ENCODE_CHARS == 0) { /* a new slice */
            if (i > sub)
                encode_segment(e, s + sub, i - sub, parse_special);
            sub = i;
            run_space = space;
            run = 0;
        }
        if (space != run_space) {
            run = 1;
            run_space = space;
        } else if (++run > KIMI_MAX_RUN_CHARS) {
            encode_segment(e, s + sub, i - sub, parse_special);
            sub = i;
            run = 1;
        }
        n_chars++;
        i += len;
    }
    encode_segment(e, s + sub, n - sub, parse_special);
}

kt_status kt_tokenize(const struct kt_tokenizer *t, const char *text, size_t len, bool add_special,
                      bool parse_special, int32_t **ids, size_t *n, kt_err *err)
{
    if (!t || !ids || !n || (!text && len))
        return kt_err_set(err, KT_ERR_INVALID, "tokenize: missing tokenizer, text or output");
    *ids = NULL;
    *n = 0;
    if (!text)
        text = "";
    struct enc e = {.t = t, .st = KT_OK};
    char *clean = NULL;
    if (!kt_utf8_valid(text, len)) {
        if (len > SIZE_MAX / 3 || !(clean = malloc(3 * len)))
            return kt_err_set(err, KT_ERR_NOMEM, "tokenize: out of memory for %zu bytes", len);
        len = kt_utf8_sanitize(text, len, clean);
        text = clean;
    }
    if (add_special && t->add_bos && t->bos >= 0)
        emit_id(&e, t->bos);
    if (t->pre == PRE_KIMI)
        encode_kimi(&e, text, len, parse_special);
    else
        encode_segment(&e, text, len, parse_special);
    if (add_special && t->add_eos && t->eos >= 0)
        emit_id(&e, t->eos);
    free(clean);
    free(e.cp);
    free(e.pr);
    free(e.off);
    free(e.syms);
    free(e.heap);
    if (e.st != KT_OK) {
        free(e.ids);
        return kt_err_set(err, e.st, "tokenize: out of memory for %zu bytes", len);
    }
    *ids = e.ids;
    *n = e.n_ids;
    return KT_OK;
}

/* ---- tokens ------------------------------------------------------------------------ */

static bool valid_id(const struct kt_tokenizer *t, int32_t id) { return id >= 0 && (uint32_t)id < t->n_vocab; }

enum kt_tok_type kt_token_type(const struct kt_tokenizer *t, int32_t id)
{
    return valid_id(t, id) ? (enum kt_tok_type)t->type[id] : KT_TOK_UNUSED;
}

bool kt_token_is_eog(const struct kt_tokenizer *t, int32_t id) { return valid_id(t, id) && t->is_eog[id]; }

const int32_t *kt_tokenizer_eog_ids(const struct kt_tokenizer *t, size_t *n)
{
    *n = t->n_eog;
    return t->eog_ids;
}

const char *kt_token_text(const struct kt_tokenizer *t, int32_t id, size_t *len)
{
    if (!valid_id(t, id))
        return NULL;
    return arena_item(&t->text, (uint32_t)id, len);
}

int32_t kt_token_find(const struct kt_tokenizer *t, const char *text, size_t len)
{
    if (!text && len)
        return -1;
    return (int32_t)strmap_find(&t->text_map, &t->text, text ? text : "", len);
}

const char *kt_token_bytes(const struct kt_tokenizer *t, int32_t id, size_t *len)
{
    if (!valid_id(t, id))
        return NULL;
    return arena_item(&t->sym, (uint32_t)id, len);
}

/* The bytes id renders as: nothing for CONTROL/UNKNOWN unless special. */
static const char *render(const struct kt_tokenizer *t, int32_t id, bool special, size_t *len)
{
    unsigned ty = t->type[id];
    if (!special && (ty == KT_TOK_CONTROL || ty == KT_TOK_UNKNOWN)) {
        *len = 0;
        return "";
    }
    return arena_item(&t->sym, (uint32_t)id, len);
}

size_t kt_token_piece(const struct kt_tokenizer *t, int32_t id, bool special, char *buf, size_t cap)
{
    if (!valid_id(t, id))
        return 0;
    size_t len;
    const char *p = render(t, id, special, &len);
    if (buf && cap)
        memcpy(buf, p, len < cap ? len : cap);
    return len;
}

/* ---- detokenizing ------------------------------------------------------------------ */

size_t kt_detok_max_bytes(const struct kt_tokenizer *t) { return 3 * (t->max_piece + 3); }

/* Writes the complete characters of held + p[0..n) to out; keeps a trailing
 * well-formed prefix in d.  Returns bytes written (<= 3 * (n_held + n)). */
static size_t detok_bytes(struct kt_detok *d, const char *p, size_t n, char *out)
{
    size_t o = 0, i = 0;
    if (d->n_held > 0) {
        unsigned char tmp[4];
        size_t k = d->n_held, take = n < 4 - k ? n : 4 - k;
        memcpy(tmp, d->held, k);
        memcpy(tmp + k, p, take);
        size_t len;
        uint32_t cp;
        enum kt_utf8_result r = kt_utf8_next(tmp, k + take, &len, &cp);
        if (r == KT_UTF8_TRUNCATED) { /* still incomplete: all of p is held */
            memcpy(d->held, tmp, k + take);
            d->n_held = (unsigned)(k + take);
            return 0;
        }
        if (r == KT_UTF8_OK) {
            memcpy(out, tmp, len);
            o = len;
        } else {
            o = kt_utf8_encode(KT_UNICODE_REPLACEMENT, out);
        }
        i = len - k; /* a held prefix is well-formed, so the sequence or subpart covers it */
        d->n_held = 0;
    }
    const unsigned char *u = (const unsigned char *)p;
    while (i < n) {
        if (u[i] < 0x80) {
            out[o++] = p[i++];
            continue;
        }
        size_t len;
        uint32_t cp;
        enum kt_utf8_result r = kt_utf8_next(u + i, n - i, &len, &cp);
        if (r == KT_UTF8_OK) {
            memcpy(out + o, p + i, len);
            o += len;
        } else if (r == KT_UTF8_TRUNCATED) {
            memcpy(d->held, p + i, len);
            d->n_held = (unsigned)len;
        } else {
            o += kt_utf8_encode(KT_UNICODE_REPLACEMENT, out + o);
        }
        i += len;
    }
    return o;
}

kt_status kt_detok_push(const struct kt_tokenizer *t, struct kt_detok *d, int32_t id, bool special, char *out,
                        size_t cap, size_t *written, kt_err *err)
{
    *written = 0;
    if (!t || !d || !valid_id(t, id))
        return kt_err_set(err, KT_ERR_INVALID, "detokenize: token id %d out of range", (int)id);
    if (!out || cap < kt_detok_max_bytes(t))
        return kt_err_set(err, KT_ERR_INVALID, "detokenize: output of %zu bytes, %zu needed", cap,
                          kt_detok_max_bytes(t));
    size_t len;
    const char *p = render(t, id, special, &len);
    *written = detok_bytes(d, p, len, out);
    return KT_OK;
}

size_t kt_detok_flush(struct kt_detok *d, char *out)
{
    size_t o = d->n_held ? kt_utf8_encode(KT_UNICODE_REPLACEMENT, out) : 0;
    d->n_held = 0;
    return o;
}

kt_status kt_detokenize(const struct kt_tokenizer *t, const int32_t *ids, size_t n, bool special, char **text,
                        size_t *len, kt_err *err)
{
    if (!t || !text || !len || (!ids && n))
        return kt_err_set(err, KT_ERR_INVALID, "detokenize: missing tokenizer, ids or output");
    *text = NULL;
    *len = 0;
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        if (!valid_id(t, ids[i]))
            return kt_err_set(err, KT_ERR_INVALID, "detokenize: token %zu has id %d, out of range", i, (int)ids[i]);
        size_t l;
        render(t, ids[i], special, &l);
        total += l;
    }
    if (total > (SIZE_MAX - 16) / 3)
        return kt_err_set(err, KT_ERR_NOMEM, "detokenize: output too large");
    char *out = malloc(3 * total + 16); /* each byte at worst one U+FFFD, plus the flush and NUL */
    if (!out)
        return kt_err_set(err, KT_ERR_NOMEM, "detokenize: out of memory for %zu bytes", 3 * total);
    struct kt_detok d = KT_DETOK_INIT;
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        size_t l;
        const char *p = render(t, ids[i], special, &l);
        o += detok_bytes(&d, p, l, out + o);
    }
    o += kt_detok_flush(&d, out + o);
    out[o] = 0;
    *text = out;
    *len = o;
    return KT_OK;
}
