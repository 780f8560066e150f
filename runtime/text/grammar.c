/*
 * grammar.c - the pushdown automaton behind constrained decoding and its
 * token masks (see grammar.h).
 *
 * A stack is an array of frames {node, a, b}: the node's kind decides what
 * a and b hold (a phase and a counter, a trie position, ...).  A state is a
 * set of stacks whose top frames all wait for a symbol (a byte 0..255, or
 * 256 + a special token id), plus whether the empty stack - the sentence
 * done - is among them.  Stepping a state by a symbol steps every stack's
 * top frame and then closes the result: epsilon moves (entering a sequence's
 * next item, taking each branch of an alternative, popping a finished
 * frame) are taken until every stack waits again.
 *
 * States live in one growable arena of uint32 words:
 *   [words, complete, n_stacks, (depth, frames[depth] as 3 words)...]
 * The current state sits at offset 0; a mask walk builds the state after
 * each prefix of a trie path above it, one level per byte, and pops levels
 * as the depth-first walk backs up.  The vocabulary's trie is stored in
 * preorder with each node's subtree end, so the walk is a linear scan that
 * skips a whole subtree when its first byte fails.
 *
 * Inside a JSON string most tokens only add characters, which would make the
 * walk visit the whole trie; so when every stack waits in a string body, the
 * mask is the precomputed set of "plain" tokens (complete UTF-8, no quote,
 * backslash or control byte) that fit the length left, plus the few "live"
 * tokens (a plain run ending at a quote, a backslash or an unfinished UTF-8
 * character) stepped one by one from their first such byte.
 * In free text (a reasoning block) every text token is allowed at once.
 * Strings with a pattern, and raw regex text, run a code-point DFA made at
 * compile time (the "patterns" section); their masks take the trie walk.
 *
 * Bounds, so no request can make a step unbounded: 64 frames a stack, 64
 * stacks, 4096 epsilon moves a step, 32 nested branches; a pattern's NFA and
 * DFA have at most 4096 and 2048 states and a bounded compile.  What the
 * bounds drop only narrows the mask; it never lets an invalid token in.
 */
#include "grammar.h"

#include <stdlib.h>
#include <string.h>

/* ---- the grammar ------------------------------------------------------------------- */

enum kind {
    K_SEQ,
    K_ALT,
    K_REPEAT,
    K_FORWARD,
    K_LITERALS, /* first: trie root */
    K_TOKEN,    /* min: token id */
    K_STRING,   /* min, max: characters */
    K_NUMBER,   /* min: enum kt_grammar_number */
    K_ARRAY,    /* child: item; min, max: items */
    K_OBJECT,   /* first: props index, n: count */
    K_MAP,      /* child: value; min: the key string node */
    K_PATTERN,  /* first: the DFA's start state */
    K_REGEX,    /* first: the DFA's start state; raw text, not a JSON string */
    K_TEXT,     /* any text (of text tokens) without one byte string; first: its table in g->avoid, n: its length;
                 * max: text tokens at most (frame a counts them) */
    K_ANY,      /* any tokens, special ones included */
};

struct node {
    uint8_t kind;
    uint32_t n, first;   /* items / props / trie root */
    uint32_t min, max;
    uint32_t child;      /* repeat item, array item, map value, forward target */
};

#define NONE UINT32_MAX

struct tnode {           /* a literal trie's node */
    uint32_t first_child, next_sibling;
    int32_t value;       /* terminal: which literal / property; -1 inner */
    uint8_t byte;
};

struct dfa_state {
    uint32_t first, n;   /* its transitions */
    bool accepting;
};

struct dfa_trans {
    uint32_t lo, hi;     /* code points */
    uint32_t next;
};

struct prop {
    uint32_t value;
    bool required;
    uint32_t key_root;   /* trie of the keys that may come next when this is the first left */
    bool can_close;      /* no required property from here on */
};

struct kt_grammar {
    struct node *nodes;
    size_t n_nodes, cap_nodes;
    uint32_t *items;
    size_t n_items, cap_items;
    struct tnode *trie;
    size_t n_trie, cap_trie;
    struct prop *props;  /* per object: n + 1 entries (the last: nothing left) */
    size_t n_props, cap_props;
    int32_t *tokens;     /* special tokens some node names, distinct */
    size_t n_tokens, cap_tokens;
    uint8_t *avoid;        /* free texts' byte-string matchers, [state][256] each */
    size_t n_avoid, cap_avoid;
    struct dfa_state *dfa;      /* patterns' DFAs, all in one array */
    size_t n_dfa, cap_dfa;
    struct dfa_trans *dfa_trans; /* per state: [first, first + n), ascending, disjoint */
    size_t n_dfa_trans, cap_dfa_trans;
    uint32_t root;
    bool has_root;
};

static bool grow(void **p, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap)
        return true;
    size_t c = *cap ? *cap : 16;
    while (c < need)
        c *= 2;
    void *q = realloc(*p, c * elem);
    if (!q)
        return false;
    *p = q;
    *cap = c;
    return true;
}

#define GROW(arr, n, cap, need) grow((void **)&(arr), &(cap), (need), sizeof *(arr))

kt_status kt_grammar_create(struct kt_grammar **out, kt_err *err)
{
    *out = calloc(1, sizeof **out);
    return *out ? KT_OK : kt_err_set(err, KT_ERR_NOMEM, "grammar: out of memory");
}

void kt_grammar_destroy(struct kt_grammar *g)
{
    if (!g)
        return;
    free(g->nodes);
    free(g->items);
    free(g->trie);
    free(g->props);
    free(g->tokens);
    free(g->dfa);
    free(g->avoid);
    free(g->dfa_trans);
    free(g);
}

static kt_status nomem(kt_err *err)
{
    return kt_err_set(err, KT_ERR_NOMEM, "grammar: out of memory");
}

static kt_status add_node(struct kt_grammar *g, struct node n, uint32_t *id, kt_err *err)
{
    if (g->n_nodes >= NONE - 1 || !GROW(g->nodes, g->n_nodes, g->cap_nodes, g->n_nodes + 1))
        return nomem(err);
    g->nodes[g->n_nodes] = n;
    *id = (uint32_t)g->n_nodes++;
    return KT_OK;
}

static kt_status check_ids(const struct kt_grammar *g, const uint32_t *items, size_t n, kt_err *err)
{
    for (size_t i = 0; i < n; i++)
        if (items[i] >= g->n_nodes)
            return kt_err_set(err, KT_ERR_INVALID, "grammar: node %u does not exist", items[i]);
    return KT_OK;
}

static kt_status add_items(struct kt_grammar *g, const uint32_t *items, size_t n, uint32_t *first, kt_err *err)
{
    if (!GROW(g->items, g->n_items, g->cap_items, g->n_items + n))
        return nomem(err);
    if (n)
        memcpy(g->items + g->n_items, items, n * sizeof *items);
    *first = (uint32_t)g->n_items;
    g->n_items += n;
    return KT_OK;
}

static kt_status trie_new(struct kt_grammar *g, uint8_t byte, uint32_t *id, kt_err *err)
{
    if (!GROW(g->trie, g->n_trie, g->cap_trie, g->n_trie + 1))
        return nomem(err);
    g->trie[g->n_trie] = (struct tnode){NONE, NONE, -1, byte};
    *id = (uint32_t)g->n_trie++;
    return KT_OK;
}

static uint32_t trie_child(const struct kt_grammar *g, uint32_t t, uint8_t byte)
{
    for (uint32_t c = g->trie[t].first_child; c != NONE; c = g->trie[c].next_sibling)
        if (g->trie[c].byte == byte)
            return c;
    return NONE;
}

/* Adds text to the trie at root with terminal value; KT_ERR_INVALID on a duplicate. */
static kt_status trie_add(struct kt_grammar *g, uint32_t root, const char *text, size_t len, int32_t value,
                          kt_err *err)
{
    uint32_t t = root;
    for (size_t i = 0; i < len; i++) {
        uint8_t b = (uint8_t)text[i];
        uint32_t c = trie_child(g, t, b);
        if (c == NONE) {
            kt_status st = trie_new(g, b, &c, err);
            if (st != KT_OK)
                return st;
            g->trie[c].next_sibling = g->trie[t].first_child;
            g->trie[t].first_child = c;
        }
        t = c;
    }
    if (g->trie[t].value >= 0)
        return kt_err_set(err, KT_ERR_INVALID, "grammar: the same literal twice");
    g->trie[t].value = value;
    return KT_OK;
}

kt_status kt_grammar_literals(struct kt_grammar *g, const char *const *texts, const size_t *lens, size_t n,
                              uint32_t *node, kt_err *err)
{
    if (n == 0)
        return kt_err_set(err, KT_ERR_INVALID, "grammar: an empty set of literals matches nothing");
    uint32_t root = 0;
    kt_status st = trie_new(g, 0, &root, err);
    for (size_t i = 0; st == KT_OK && i < n; i++) {
        if (lens[i] == 0) {
            st = kt_err_set(err, KT_ERR_INVALID, "grammar: an empty literal");
            break;
        }
        st = trie_add(g, root, texts[i], lens[i], (int32_t)i, err);
    }
    if (st != KT_OK)
        return st;
    return add_node(g, (struct node){.kind = K_LITERALS, .first = root}, node, err);
}

kt_status kt_grammar_literal(struct kt_grammar *g, const char *bytes, size_t len, uint32_t *node, kt_err *err)
{
    return kt_grammar_literals(g, &bytes, &len, 1, node, err);
}

kt_status kt_grammar_token(struct kt_grammar *g, int32_t token, uint32_t *node, kt_err *err)
{
    if (token < 0)
        return kt_err_set(err, KT_ERR_INVALID, "grammar: token id %d", token);
    size_t i = 0;
    while (i < g->n_tokens && g->tokens[i] != token)
        i++;
    if (i == g->n_tokens) {
        if (!GROW(g->tokens, g->n_tokens, g->cap_tokens, g->n_tokens + 1))
            return nomem(err);
        g->tokens[g->n_tokens++] = token;
    }
    return add_node(g, (struct node){.kind = K_TOKEN, .min = (uint32_t)token}, node, err);
}

kt_status kt_grammar_seq(struct kt_grammar *g, const uint32_t *items, size_t n, uint32_t *node, kt_err *err)
{
    uint32_t first = 0;
    kt_status st = check_ids(g, items, n, err);
    if (st == KT_OK)
        st = add_items(g, items, n, &first, err);
    if (st != KT_OK)
        return st;
    return add_node(g, (struct node){.kind = K_SEQ, .n = (uint32_t)n, .first = first}, node, err);
}

kt_status kt_grammar_alt(struct kt_grammar *g, const uint32_t *items, size_t n, uint32_t *node, kt_err *err)
{
    if (n == 0)
        return kt_err_set(err, KT_ERR_INVALID, "grammar: an alternative of nothing matches nothing");
    uint32_t first = 0;
    kt_status st = check_ids(g, items, n, err);
    if (st == KT_OK)
        st = add_items(g, items, n, &first, err);
    if (st != KT_OK)
        return st;
    return add_node(g, (struct node){.kind = K_ALT, .n = (uint32_t)n, .first = first}, node, err);
}

kt_status kt_grammar_repeat(struct kt_grammar *g, uint32_t item, uint32_t min, uint32_t max, uint32_t *node,
                            kt_err *err)
{
    kt_status st = check_ids(g, &item, 1, err);
    if (st != KT_OK)
        return st;
    if (min > max)
        return kt_err_set(err, KT_ERR_INVALID, "grammar: repeat %u..%u", min, max);
    return add_node(g, (struct node){.kind = K_REPEAT, .child = item, .min = min, .max = max}, node, err);
}

kt_status kt_grammar_forward(struct kt_grammar *g, uint32_t *node, kt_err *err)
{
    return add_node(g, (struct node){.kind = K_FORWARD, .child = NONE}, node, err);
}

kt_status kt_grammar_define(struct kt_grammar *g, uint32_t forward, uint32_t target, kt_err *err)
{
    if (forward >= g->n_nodes || g->nodes[forward].kind != K_FORWARD || target >= g->n_nodes)
        return kt_err_set(err, KT_ERR_INVALID, "grammar: node %u is not a forward node", forward);
    for (uint32_t t = target, hops = 0; g->nodes[t].kind == K_FORWARD; t = g->nodes[t].child, hops++)
        if (t == forward || g->nodes[t].child == NONE || hops > g->n_nodes)
            return kt_err_set(err, KT_ERR_INVALID, "grammar: a reference that only refers to itself");
    g->nodes[forward].child = target;
    return KT_OK;
}

kt_status kt_grammar_text(struct kt_grammar *g, const char *avoid, size_t len, uint32_t *node, kt_err *err)
{
    return kt_grammar_text_budget(g, avoid, len, KT_GRAMMAR_UNBOUNDED, node, err);
}

kt_status kt_grammar_any(struct kt_grammar *g, uint32_t *node, kt_err *err)
{
    return add_node(g, (struct node){.kind = K_ANY}, node, err);
}

kt_status kt_grammar_text_budget(struct kt_grammar *g, const char *avoid, size_t len, uint32_t max_tokens,
                                 uint32_t *node, kt_err *err)
{
    if (len > 64)
        return kt_err_set(err, KT_ERR_UNSUPPORTED, "grammar: text to avoid of %zu bytes (at most 64)", len);
    /* a matcher of avoid: [state = bytes of it matched][byte] -> next state (len: found) */
    size_t first = g->n_avoid;
    if (len && !GROW(g->avoid, g->n_avoid, g->cap_avoid, first + len * 256))
        return nomem(err);
    for (size_t s = 0; s < len; s++)
        for (int c = 0; c < 256; c++) {
            size_t k = s + 1 < len ? s + 1 : len; /* the longest prefix of avoid ending the text so far + c */
            for (; k > 0; k--) {
                if ((unsigned char)avoid[k - 1] != c)
                    continue;
                size_t from = s + 1 - k; /* prefix avoid[0..k-1) against the matched avoid[from..s) */
                if (memcmp(avoid, avoid + from, k - 1) == 0)
                    break;
            }
            g->avoid[first + s * 256 + (size_t)c] = (uint8_t)k;
        }
    if (len)
        g->n_avoid = first + len * 256;
    return add_node(g, (struct node){.kind = K_TEXT, .first = (uint32_t)first, .n = (uint32_t)len, .max = max_tokens},
                    node, err);
}

kt_status kt_grammar_json_string(struct kt_grammar *g, uint32_t min_chars, uint32_t max_chars, uint32_t *node,
                                 kt_err *err)
{
    if (min_chars > max_chars)
        return kt_err_set(err, KT_ERR_INVALID, "grammar: string length %u..%u", min_chars, max_chars);
    return add_node(g, (struct node){.kind = K_STRING, .min = min_chars, .max = max_chars}, node, err);
}

kt_status kt_grammar_json_number(struct kt_grammar *g, enum kt_grammar_number kind, uint32_t *node, kt_err *err)
{
    return add_node(g, (struct node){.kind = K_NUMBER, .min = (uint32_t)kind}, node, err);
}

kt_status kt_grammar_json_array(struct kt_grammar *g, uint32_t item, uint32_t min_items, uint32_t max_items,
                                uint32_t *node, kt_err *err)
{
    kt_status st = check_ids(g, &item, 1, err);
    if (st != KT_OK)
        return st;
    if (min_items > max_items)
        return kt_err_set(err, KT_ERR_INVALID, "grammar: array length %u..%u", min_items, max_items);
    if (max_items != KT_GRAMMAR_UNBOUNDED && max_items > (1u << 28))
        max_items = KT_GRAMMAR_UNBOUNDED;
    if (min_items > (1u << 28))
        return kt_err_set(err, KT_ERR_UNSUPPORTED, "grammar: more than 2^28 array items");
    return add_node(g, (struct node){.kind = K_ARRAY, .child = item, .min = min_items, .max = max_items}, node, err);
}

/* The key as JSON text, quotes included. */
static char *json_key_text(const char *name, size_t len, size_t *out_len)
{
    char *s = malloc(6 * len + 3);
    if (!s)
        return NULL;
    size_t k = 0;
    s[k++] = '"';
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)name[i];
        if (c == '"' || c == '\\') {
            s[k++] = '\\';
            s[k++] = (char)c;
        } else if (c < 0x20) {
            static const char hex[] = "0123456789abcdef";
            memcpy(s + k, "\\u00", 4);
            k += 4;
            s[k++] = hex[c >> 4];
            s[k++] = hex[c & 15];
        } else {
            s[k++] = (char)c;
        }
    }
    s[k++] = '"';
    *out_len = k;
    return s;
}

kt_status kt_grammar_json_object(struct kt_grammar *g, const struct kt_grammar_property *props, size_t n,
                                 uint32_t *node, kt_err *err)
{
    if (n > 256)
        return kt_err_set(err, KT_ERR_UNSUPPORTED, "grammar: an object of %zu properties (at most 256)", n);
    for (size_t i = 0; i < n; i++) {
        kt_status st = check_ids(g, &props[i].value, 1, err);
        if (st != KT_OK)
            return st;
        for (size_t j = 0; j < i; j++)
            if (props[j].name_len == props[i].name_len && memcmp(props[j].name, props[i].name, props[i].name_len) == 0)
                return kt_err_set(err, KT_ERR_INVALID, "grammar: property '%.*s' twice", (int)props[i].name_len,
                                  props[i].name);
    }
    if (!GROW(g->props, g->n_props, g->cap_props, g->n_props + n + 1))
        return nomem(err);
    size_t first = g->n_props;
    g->n_props += n + 1;
    bool can_close = true;
    for (size_t i = n + 1; i-- > 0;) {
        struct prop *p = &g->props[first + i];
        *p = (struct prop){.value = i < n ? props[i].value : NONE, .required = i < n && props[i].required,
                           .key_root = NONE};
        can_close = can_close && !p->required;
        p->can_close = can_close;
    }
    for (size_t i = 0; i < n; i++) {
        kt_status st = trie_new(g, 0, &g->props[first + i].key_root, err);
        for (size_t j = i; st == KT_OK && j < n; j++) {
            size_t len;
            char *key = json_key_text(props[j].name, props[j].name_len, &len);
            if (!key)
                return nomem(err);
            st = trie_add(g, g->props[first + i].key_root, key, len, (int32_t)j, err);
            free(key);
            if (props[j].required)
                break;
        }
        if (st != KT_OK)
            return st;
    }
    return add_node(g, (struct node){.kind = K_OBJECT, .first = (uint32_t)first, .n = (uint32_t)n}, node, err);
}

kt_status kt_grammar_json_map(struct kt_grammar *g, uint32_t value, uint32_t *node, kt_err *err)
{
    uint32_t key = 0;
    kt_status st = check_ids(g, &value, 1, err);
    if (st == KT_OK)
        st = kt_grammar_json_string(g, 0, KT_GRAMMAR_UNBOUNDED, &key, err);
    if (st != KT_OK)
        return st;
    return add_node(g, (struct node){.kind = K_MAP, .child = value, .min = key}, node, err);
}

kt_status kt_grammar_set_root(struct kt_grammar *g, uint32_t node, kt_err *err)
{
    kt_status st = check_ids(g, &node, 1, err);
    if (st != KT_OK)
        return st;
    for (size_t i = 0; i < g->n_nodes; i++)
        if (g->nodes[i].kind == K_FORWARD && g->nodes[i].child == NONE)
            return kt_err_set(err, KT_ERR_INVALID, "grammar: forward node %zu was never defined", i);
    g->root = node;
    g->has_root = true;
    return KT_OK;
}

/* ---- the vocabulary ------------------------------------------------------------------ */

enum plain_class { PLAIN_ALL, PLAIN_DEAD, PLAIN_LIVE };

struct kt_grammar_vocab {
    uint32_t n_tokens, n_mask, mask_words;
    /* the trie of text tokens in preorder; node 0 is the root (no byte) */
    uint32_t n_nodes;
    uint8_t *byte;          /* [n_nodes] */
    uint16_t *depth;        /* [n_nodes] bytes from the root */
    uint32_t *subtree_end;  /* [n_nodes] first node after this one's subtree */
    uint32_t *tok_first;    /* [n_nodes] into tok_list; tok_count 0: no token ends here */
    uint16_t *tok_count;
    uint32_t *tok_list;     /* token ids sorted by bytes */
    uint32_t max_len;
    /* strings: per text token, how it reads inside a string body */
    uint32_t *plain_bits;   /* [mask_words] the PLAIN_ALL tokens */
    uint32_t *text_bits;    /* [mask_words] every text token */
    uint16_t *plain_chars;  /* [n_tokens] characters of the plain run (PLAIN_ALL: all) */
    uint16_t *plain_bytes;  /* [n_tokens] bytes of the plain run */
    uint32_t max_plain_chars;
    uint32_t *live;         /* [n_live] PLAIN_LIVE token ids */
    uint32_t n_live;
    const char **bytes;     /* [n_tokens] copies' pointers into text */
    uint32_t *lens;
    char *text;
    bool *special;          /* [n_tokens] */
    int32_t *eog;
    size_t n_eog;
};

uint32_t kt_grammar_vocab_mask_words(const struct kt_grammar_vocab *v)
{
    return v->mask_words;
}

void kt_grammar_vocab_destroy(struct kt_grammar_vocab *v)
{
    if (!v)
        return;
    free(v->byte);
    free(v->depth);
    free(v->subtree_end);
    free(v->tok_first);
    free(v->tok_count);
    free(v->tok_list);
    free(v->plain_bits);
    free(v->text_bits);
    free(v->plain_chars);
    free(v->plain_bytes);
    free(v->live);
    free(v->bytes);
    free(v->lens);
    free(v->text);
    free(v->special);
    free(v->eog);
    free(v);
}

/* Bytes of the UTF-8 character starting at s (at most n bytes), 0 if not a
 * whole valid one. */
static size_t utf8_char(const unsigned char *s, size_t n)
{
    unsigned char c = s[0];
    if (c < 0x80)
        return 1;
    size_t len;
    unsigned char lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF)
        len = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
        len = 3;
        if (c == 0xE0)
            lo = 0xA0;
        if (c == 0xED)
            hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        len = 4;
        if (c == 0xF0)
            lo = 0x90;
        if (c == 0xF4)
            hi = 0x8F;
    } else
        return 0;
    if (n < len || s[1] < lo || s[1] > hi)
        return 0;
    for (size_t i = 2; i < len; i++)
        if (s[i] < 0x80 || s[i] > 0xBF)
            return 0;
    return len;
}

/* How the token reads in a string body: the plain run's bytes and characters,
 * and what stops it (nothing, a byte no string holds, or one the automaton must see). */
static enum plain_class classify(const unsigned char *s, size_t n, uint32_t *run_bytes, uint32_t *run_chars)
{
    size_t i = 0, chars = 0;
    while (i < n) {
        unsigned char c = s[i];
        if (c == '"' || c == '\\')
            break;
        if (c < 0x20)
            goto dead;
        size_t k = utf8_char(s + i, n - i);
        if (k == 0)
            break;
        i += k;
        chars++;
    }
    *run_bytes = (uint32_t)i;
    *run_chars = (uint32_t)chars;
    if (i == n)
        return PLAIN_ALL;
    unsigned char c = s[i];
    if (c == '"' || c == '\\')
        return PLAIN_LIVE;
    /* an unfinished character at the very end may be finished by the next token */
    if (c >= 0xC2 && c <= 0xF4) {
        size_t rest = n - i;
        unsigned char tmp[4] = {c, 0x80, 0x80, 0x80};
        memcpy(tmp, s + i, rest < 4 ? rest : 4);
        if (c == 0xE0)
            tmp[1] = rest > 1 ? tmp[1] : 0xA0;
        if (c == 0xF0)
            tmp[1] = rest > 1 ? tmp[1] : 0x90;
        size_t need = utf8_char(tmp, 4);
        if (need > rest)
            return PLAIN_LIVE;
    }
dead:
    *run_bytes = (uint32_t)i;
    *run_chars = (uint32_t)chars;
    return PLAIN_DEAD;
}

struct sort_ctx_item {
    const unsigned char *s;
    uint32_t len, id;
};

static int compare_bytes(const void *pa, const void *pb)
{
    const struct sort_ctx_item *a = pa, *b = pb;
    uint32_t n = a->len < b->len ? a->len : b->len;
    int c = memcmp(a->s, b->s, n);
    if (c)
        return c;
    if (a->len != b->len)
        return a->len < b->len ? -1 : 1;
    return a->id < b->id ? -1 : (a->id > b->id);
}

kt_status kt_grammar_vocab_create(const char *const *bytes, const size_t *lens, const bool *special,
                                  uint32_t n_tokens, uint32_t n_mask, const int32_t *eog, size_t n_eog,
                                  struct kt_grammar_vocab **out, kt_err *err)
{
    *out = NULL;
    if (n_mask < n_tokens)
        return kt_err_set(err, KT_ERR_INVALID, "grammar vocabulary: a mask of %u bits for %u tokens", n_mask,
                          n_tokens);
    struct kt_grammar_vocab *v = calloc(1, sizeof *v);
    struct sort_ctx_item *items = NULL;
    uint32_t *path = NULL;
    if (!v)
        return nomem(err);
    v->n_tokens = n_tokens;
    v->n_mask = n_mask;
    v->mask_words = (n_mask + 31) / 32;
    size_t total = 0;
    for (uint32_t i = 0; i < n_tokens; i++)
        total += lens[i];
    v->text = malloc(total ? total : 1);
    v->bytes = calloc(n_tokens ? n_tokens : 1, sizeof *v->bytes);
    v->lens = calloc(n_tokens ? n_tokens : 1, sizeof *v->lens);
    v->special = calloc(n_tokens ? n_tokens : 1, sizeof *v->special);
    v->plain_bits = calloc(v->mask_words ? v->mask_words : 1, sizeof *v->plain_bits);
    v->text_bits = calloc(v->mask_words ? v->mask_words : 1, sizeof *v->text_bits);
    v->plain_chars = calloc(n_tokens ? n_tokens : 1, sizeof *v->plain_chars);
    v->plain_bytes = calloc(n_tokens ? n_tokens : 1, sizeof *v->plain_bytes);
    v->live = malloc((n_tokens ? n_tokens : 1) * sizeof *v->live);
    v->eog = malloc((n_eog ? n_eog : 1) * sizeof *v->eog);
    items = malloc((n_tokens ? n_tokens : 1) * sizeof *items);
    if (!v->text || !v->bytes || !v->lens || !v->special || !v->plain_bits || !v->text_bits || !v->plain_chars ||
        !v->plain_bytes ||
        !v->live || !v->eog || !items)
        goto nomem;
    size_t off = 0, n_text = 0;
    for (uint32_t i = 0; i < n_tokens; i++) {
        if (lens[i] > 65535) {
            kt_grammar_vocab_destroy(v);
            free(items);
            return kt_err_set(err, KT_ERR_UNSUPPORTED, "grammar vocabulary: token %u is %zu bytes long", i, lens[i]);
        }
        memcpy(v->text + off, bytes[i], lens[i]);
        v->bytes[i] = v->text + off;
        v->lens[i] = (uint32_t)lens[i];
        off += lens[i];
        v->special[i] = special[i] || lens[i] == 0;
        if (v->special[i])
            continue;
        items[n_text++] = (struct sort_ctx_item){(const unsigned char *)v->bytes[i], v->lens[i], i};
        v->text_bits[i >> 5] |= 1u << (i & 31);
        if (v->lens[i] > v->max_len)
            v->max_len = v->lens[i];
        uint32_t rb, rc;
        enum plain_class pc = classify((const unsigned char *)v->bytes[i], v->lens[i], &rb, &rc);
        v->plain_bytes[i] = (uint16_t)rb;
        v->plain_chars[i] = (uint16_t)rc;
        if (pc == PLAIN_ALL) {
            v->plain_bits[i >> 5] |= 1u << (i & 31);
            if (rc > v->max_plain_chars)
                v->max_plain_chars = rc;
        } else if (pc == PLAIN_LIVE) {
            v->live[v->n_live++] = i;
        }
    }
    for (size_t i = 0; i < n_eog; i++) {
        if (eog[i] < 0 || (uint32_t)eog[i] >= n_tokens)
            continue;
        v->eog[v->n_eog++] = eog[i];
    }
    qsort(items, n_text, sizeof *items, compare_bytes);

    /* Preorder trie from the sorted tokens: each token shares its longest
     * common prefix with the previous one's path. */
    size_t cap = 1 + total;
    v->byte = malloc(cap);
    v->depth = malloc(cap * sizeof *v->depth);
    v->subtree_end = malloc(cap * sizeof *v->subtree_end);
    v->tok_first = malloc(cap * sizeof *v->tok_first);
    v->tok_count = calloc(cap, sizeof *v->tok_count);
    v->tok_list = malloc((n_text ? n_text : 1) * sizeof *v->tok_list);
    path = malloc((v->max_len + 2) * sizeof *path);
    if (!v->byte || !v->depth || !v->subtree_end || !v->tok_first || !v->tok_count || !v->tok_list || !path)
        goto nomem;
    uint32_t n_nodes = 1;
    v->byte[0] = 0;
    v->depth[0] = 0;
    path[0] = 0;
    uint32_t path_len = 1; /* nodes on the current path, root included */
    const unsigned char *prev = NULL;
    uint32_t prev_len = 0;
    for (size_t t = 0; t < n_text; t++) {
        const unsigned char *s = items[t].s;
        uint32_t len = items[t].len, lcp = 0;
        while (prev && lcp < len && lcp < prev_len && s[lcp] == prev[lcp])
            lcp++;
        for (uint32_t d = lcp + 1; d < path_len; d++) /* nodes leaving the path end their subtrees here */
            v->subtree_end[path[d]] = n_nodes;
        path_len = lcp + 1;
        for (uint32_t d = lcp; d < len; d++) {
            uint32_t id = n_nodes++;
            v->byte[id] = s[d];
            v->depth[id] = (uint16_t)(d + 1);
            v->tok_count[id] = 0;
            path[path_len++] = id;
        }
        uint32_t leaf = path[len];
        if (v->tok_count[leaf] == 0)
            v->tok_first[leaf] = (uint32_t)t;
        if (v->tok_count[leaf] < UINT16_MAX)
            v->tok_count[leaf]++;
        v->tok_list[t] = items[t].id;
        prev = s;
        prev_len = len;
    }
    for (uint32_t d = 0; d < path_len; d++)
        v->subtree_end[path[d]] = n_nodes;
    v->n_nodes = n_nodes;
    free(items);
    free(path);
    *out = v;
    return KT_OK;
nomem:
    free(items);
    free(path);
    kt_grammar_vocab_destroy(v);
    return nomem(err);
}

kt_status kt_grammar_vocab_from_tokenizer(const struct kt_tokenizer *t, uint32_t n_mask,
                                          struct kt_grammar_vocab **out, kt_err *err)
{
    int32_t n = kt_tokenizer_n_vocab(t);
    if (n < 0)
        n = 0;
    const char **bytes = calloc((size_t)n + 1, sizeof *bytes);
    size_t *lens = calloc((size_t)n + 1, sizeof *lens);
    bool *special = calloc((size_t)n + 1, sizeof *special);
    kt_status st;
    if (!bytes || !lens || !special) {
        st = nomem(err);
        goto done;
    }
    for (int32_t i = 0; i < n; i++) {
        enum kt_tok_type ty = kt_token_type(t, i);
        bytes[i] = kt_token_bytes(t, i, &lens[i]);
        if (!bytes[i])
            bytes[i] = "", lens[i] = 0;
        special[i] = !(ty == KT_TOK_NORMAL || ty == KT_TOK_BYTE || ty == KT_TOK_UNDEFINED);
    }
    size_t n_eog;
    const int32_t *eog = kt_tokenizer_eog_ids(t, &n_eog);
    st = kt_grammar_vocab_create(bytes, lens, special, (uint32_t)n, n_mask < (uint32_t)n ? (uint32_t)n : n_mask, eog,
                                 n_eog, out, err);
done:
    free(bytes);
    free(lens);
    free(special);
    return st;
}

/* ---- the automaton --------------------------------------------------------------------- */

struct frame {
    uint32_t node, a, b;
};

#define FRAME_WORDS 3
#define HDR_WORDS 3 /* words, complete, n_stacks */

struct kt_grammar_matcher {
    const struct kt_grammar *g;
    const struct kt_grammar_vocab *v;
    uint32_t *w;             /* the arena; the current state at 0 */
    size_t len, cap;
    bool oom;                /* an arena or scratch allocation failed: masks go empty */
    bool ended;              /* end-of-generation was accepted */
    int budget;              /* epsilon moves left in this step */
    int branches;            /* nested branch copies on the C stack now */
    struct frame scratch[KT_GRAMMAR_MAX_DEPTH];
    size_t *level;           /* [max_len + 2] arena offset of each walk level's state */
    uint32_t text_node;      /* the free-text node text_cache is for */
    uint32_t *text_cache[64]; /* [state] its allowed text tokens, made when first needed */
};

/* Object phases (a: phase | index << 3). */
enum { O_OPEN, O_KEY_OR_CLOSE, O_KEY, O_COLON, O_VALUE, O_AFTER, O_KEY_ONLY };
/* Array phases (a: phase | count << 3). */
enum { A_OPEN, A_FIRST, A_AFTER, A_NEXT };
/* String phases (a: phase | utf8 left << 3 | first-continuation kind << 5 | hex digits << 7 | hex << 10). */
enum { S_OPEN, S_BODY, S_ESC, S_HEX };
/* Number phases (a). */
enum { N_START, N_SIGN, N_ZERO, N_INT, N_DOT, N_FRAC, N_E, N_ESIGN, N_EXP };

#define PH(a) ((a) & 7u)
#define IDX(a) ((a) >> 3)

static struct frame frame_init(const struct kt_grammar *g, uint32_t node)
{
    struct frame f = {node, 0, 0};
    if (g->nodes[node].kind == K_LITERALS || g->nodes[node].kind == K_REGEX)
        f.b = g->nodes[node].first;
    return f;
}

static bool reserve(struct kt_grammar_matcher *m, size_t words)
{
    if (m->len + words <= m->cap)
        return true;
    size_t c = m->cap ? m->cap : 1024;
    while (c < m->len + words)
        c *= 2;
    uint32_t *w = realloc(m->w, c * sizeof *w);
    if (!w) {
        m->oom = true;
        return false;
    }
    m->w = w;
    m->cap = c;
    return true;
}

/* State being built at the arena's end, starting at offset start. */
static bool state_begin(struct kt_grammar_matcher *m, size_t *start)
{
    if (!reserve(m, HDR_WORDS))
        return false;
    *start = m->len;
    m->w[m->len] = HDR_WORDS;
    m->w[m->len + 1] = 0;
    m->w[m->len + 2] = 0;
    m->len += HDR_WORDS;
    return true;
}

static void emit(struct kt_grammar_matcher *m, size_t start, const struct frame *st, uint32_t depth)
{
    uint32_t *h = m->w + start;
    if (depth == 0) {
        h[1] = 1;
        return;
    }
    size_t words = 1 + FRAME_WORDS * (size_t)depth;
    size_t p = start + HDR_WORDS;
    for (uint32_t s = 0; s < h[2]; s++) {
        uint32_t d = m->w[p];
        if (d == depth && memcmp(m->w + p + 1, st, depth * sizeof *st) == 0)
            return;
        p += 1 + FRAME_WORDS * (size_t)d;
    }
    if (h[2] >= KT_GRAMMAR_MAX_STACKS)
        return;
    if (!reserve(m, words))
        return;
    h = m->w + start;
    m->w[m->len] = depth;
    memcpy(m->w + m->len + 1, st, depth * sizeof *st);
    m->len += words;
    h[0] += (uint32_t)words;
    h[2]++;
}

static bool is_ws(int c)
{
    return c == ' ' || c == '\n' || c == '\t' || c == '\r';
}

static bool push(const struct kt_grammar *g, struct frame *st, uint32_t *depth, uint32_t node)
{
    if (*depth >= KT_GRAMMAR_MAX_DEPTH)
        return false;
    st[(*depth)++] = frame_init(g, node);
    return true;
}

static void closure(struct kt_grammar_matcher *m, size_t start, struct frame *st, uint32_t depth);

/* A branch of a closure on its own copy of the stack (bounded nesting: each holds a copy on the C stack). */
static void branch(struct kt_grammar_matcher *m, size_t start, const struct frame *st, uint32_t depth,
                   struct frame replace_top, bool replace)
{
    if (m->branches >= 32)
        return;
    struct frame copy[KT_GRAMMAR_MAX_DEPTH];
    memcpy(copy, st, depth * sizeof *st);
    if (replace)
        copy[depth - 1] = replace_top;
    m->branches++;
    closure(m, start, copy, depth);
    m->branches--;
}

/* Takes every epsilon move from the stack st[depth] (modified) and emits the
 * waiting stacks into the state at start. */
static void closure(struct kt_grammar_matcher *m, size_t start, struct frame *st, uint32_t depth)
{
    const struct kt_grammar *g = m->g;
    for (;;) {
        if (--m->budget < 0)
            return;
        if (depth == 0) {
            emit(m, start, st, 0);
            return;
        }
        struct frame *f = &st[depth - 1];
        const struct node *n = &g->nodes[f->node];
        switch (n->kind) {
        case K_SEQ:
            if (f->a < n->n) {
                uint32_t child = g->items[n->first + f->a++];
                if (!push(g, st, &depth, child))
                    return;
            } else {
                depth--;
            }
            continue;
        case K_FORWARD:
            *f = frame_init(g, n->child);
            continue;
        case K_ALT: {
            for (uint32_t i = 1; i < n->n; i++)
                branch(m, start, st, depth, frame_init(g, g->items[n->first + i]), true);
            *f = frame_init(g, g->items[n->first]);
            continue;
        }
        case K_REPEAT: {
            bool more = f->a < n->max, end = f->a >= n->min;
            if (more && end) {
                branch(m, start, st, depth - 1, *f, false);
            }
            if (more) {
                f->a++;
                if (!push(g, st, &depth, n->child))
                    return;
            } else if (end) {
                depth--;
            } else {
                return;
            }
            continue;
        }
        case K_LITERALS: {
            const struct tnode *t = &g->trie[f->b];
            if (t->value >= 0) {
                if (t->first_child == NONE) {
                    depth--;
                    continue;
                }
                branch(m, start, st, depth - 1, *f, false);
            }
            emit(m, start, st, depth);
            return;
        }
        case K_TEXT:
        case K_ANY:
            branch(m, start, st, depth - 1, *f, false);
            emit(m, start, st, depth);
            return;
        case K_REGEX:
            if (g->dfa[f->b].accepting && (f->a & 0x18) == 0) { /* a whole match, no character half done */
                if (g->dfa[f->b].n == 0) {
                    depth--;
                    continue;
                }
                branch(m, start, st, depth - 1, *f, false);
            }
            emit(m, start, st, depth);
            return;
        case K_NUMBER: {
            uint32_t ph = f->a;
            if (ph == N_ZERO || ph == N_INT || ph == N_FRAC || ph == N_EXP) {
                branch(m, start, st, depth - 1, *f, false);
            }
            emit(m, start, st, depth);
            return;
        }
        case K_OBJECT:
        case K_MAP:
            if (PH(f->a) == O_VALUE) {
                if (f->b < KT_GRAMMAR_MAX_WS)
                    emit(m, start, st, depth); /* whitespace before the value */
                uint32_t j = IDX(f->a);
                uint32_t value = n->kind == K_MAP ? n->child : g->props[n->first + j].value;
                f->a = O_AFTER | ((n->kind == K_MAP ? 0 : j + 1) << 3);
                f->b = 0;
                if (!push(g, st, &depth, value))
                    return;
                continue;
            }
            emit(m, start, st, depth);
            return;
        case K_ARRAY: {
            uint32_t ph = PH(f->a);
            if ((ph == A_FIRST && n->max > 0) || ph == A_NEXT) {
                if (f->b < KT_GRAMMAR_MAX_WS || (ph == A_FIRST && n->min == 0))
                    emit(m, start, st, depth); /* whitespace, or ']' */
                uint32_t count = IDX(f->a) + 1;
                f->a = A_AFTER | (count << 3);
                f->b = 0;
                if (!push(g, st, &depth, n->child))
                    return;
                continue;
            }
            emit(m, start, st, depth);
            return;
        }
        default:
            emit(m, start, st, depth);
            return;
        }
    }
}

static bool hex_digit(int c, uint32_t *v)
{
    if (c >= '0' && c <= '9')
        *v = (uint32_t)(c - '0');
    else if (c >= 'a' && c <= 'f')
        *v = (uint32_t)(c - 'a' + 10);
    else if (c >= 'A' && c <= 'F')
        *v = (uint32_t)(c - 'A' + 10);
    else
        return false;
    return true;
}

/* One byte in a string body or escape; false if it cannot be there. */
static bool step_string(const struct node *n, struct frame *f, uint32_t *depth, int c)
{
    uint32_t ph = PH(f->a);
    uint32_t left = (f->a >> 3) & 3, kind = (f->a >> 5) & 3;
    switch (ph) {
    case S_OPEN:
        if (c != '"')
            return false;
        f->a = S_BODY;
        return true;
    case S_BODY:
        if (left) {
            unsigned lo = 0x80, hi = 0xBF;
            if (kind == 1)
                lo = 0xA0;
            else if (kind == 2)
                hi = 0x9F;
            else if (kind == 3)
                lo = 0x90;
            if ((f->a >> 12) & 1) /* F4 */
                hi = 0x8F, f->a &= ~(1u << 12);
            if (c < (int)lo || c > (int)hi)
                return false;
            f->a = S_BODY | ((left - 1) << 3);
            return true;
        }
        if (c == '"') {
            if (f->b < n->min)
                return false;
            (*depth)--;
            return true;
        }
        if (c == '\\') {
            if (f->b >= n->max)
                return false;
            f->a = S_ESC;
            return true;
        }
        if (c < 0x20 || (c >= 0x80 && c < 0xC2) || c > 0xF4)
            return false;
        if (f->b >= n->max)
            return false;
        f->b++;
        if (c >= 0xC2) {
            uint32_t need = c < 0xE0 ? 1 : c < 0xF0 ? 2 : 3;
            uint32_t k = c == 0xE0 ? 1 : c == 0xED ? 2 : c == 0xF0 ? 3 : 0;
            f->a = S_BODY | (need << 3) | (k << 5) | (c == 0xF4 ? 1u << 12 : 0);
        }
        return true;
    case S_ESC:
        if (c == 'u') {
            f->a = S_HEX;
            return true;
        }
        if (!strchr("\"\\/bfnrt", c) || c == 0)
            return false;
        f->b++;
        f->a = S_BODY;
        return true;
    case S_HEX: {
        uint32_t digits = (f->a >> 7) & 7, value = f->a >> 10, d;
        if (!hex_digit(c, &d))
            return false;
        value = value << 4 | d;
        digits++;
        if (digits == 2 && value >= 0xD8 && value <= 0xDF)
            return false; /* a surrogate: jansson (and strict JSON readers) refuse a lone one */
        if (digits == 4) {
            if (value == 0)
                return false; /* NUL */
            f->b++;
            f->a = S_BODY;
            return true;
        }
        f->a = S_HEX | (digits << 7) | (value << 10);
        return true;
    }
    }
    return false;
}

static bool step_number(const struct node *n, struct frame *f, int c)
{
    enum kt_grammar_number kind = (enum kt_grammar_number)n->min;
    bool digit = c >= '0' && c <= '9';
    bool real = kind == KT_GRAMMAR_NUMBER;
    switch (f->a) {
    case N_START:
        if (c == '-' && kind != KT_GRAMMAR_DIGITS) {
            f->a = N_SIGN;
            return true;
        }
        /* fall through */
    case N_SIGN:
        if (c == '0') {
            f->a = N_ZERO;
            return true;
        }
        if (digit) {
            f->a = N_INT;
            f->b = 1;
            return true;
        }
        return false;
    case N_ZERO:
    case N_INT:
        if (digit && f->a == N_INT && f->b < 15) {
            f->b++;
            return true;
        }
        if (real && c == '.') {
            f->a = N_DOT;
            f->b = 0;
            return true;
        }
        if (real && (c == 'e' || c == 'E')) {
            f->a = N_E;
            f->b = 0;
            return true;
        }
        return false;
    case N_DOT:
    case N_FRAC:
        if (digit && f->b < 15) {
            f->a = N_FRAC;
            f->b++;
            return true;
        }
        if (f->a == N_FRAC && (c == 'e' || c == 'E')) {
            f->a = N_E;
            f->b = 0;
            return true;
        }
        return false;
    case N_E:
        if (c == '+' || c == '-') {
            f->a = N_ESIGN;
            return true;
        }
        /* fall through */
    case N_ESIGN:
    case N_EXP:
        if (digit && f->b < 2) {
            f->a = N_EXP;
            f->b++;
            return true;
        }
        return false;
    }
    return false;
}


/* ---- patterns: a regex subset compiled to a code-point DFA ----------------------------- */

/*
 * The subset: literals (UTF-8), '.', classes [a-z0-9_] and [^...], the
 * escapes \d \w \s \D \W \S \. \\ \/ \- \n \t \r \f \v \uXXXX and escaped
 * punctuation, groups (...) and (?:...), alternation |, the quantifiers
 * * + ? {n} {n,} {n,m} (m at most 64), ^ at the start and $ at the end
 * (without them the pattern may match anywhere in the string, as JSON
 * Schema says).  \s and \w are ASCII's.  No backreferences, lookaround,
 * lazy quantifiers or Unicode classes.  Thompson NFA, then subsets.
 */

#define RX_MAX_NFA 4096
#define RX_MAX_DFA 2048
#define RX_HASH 4096 /* > RX_MAX_DFA, a power of two */
#define CP_MAX 0x10FFFF

struct rx_range {
    uint32_t lo, hi;
};

struct rx_nstate {
    int eps[2];          /* -1: none */
    int target;          /* on a code point in ranges; -1: none */
    uint32_t rfirst, rcount;
};

struct rx {
    const char *src;
    size_t len, pos;
    struct rx_nstate *st;
    int n_st;
    struct rx_range *ranges;
    size_t n_ranges, cap_ranges;
    kt_err *err;
    kt_status status;
};

struct rx_frag {
    int start, end;
};

static kt_status rx_fail(struct rx *r, kt_status st, const char *what)
{
    if (r->status == KT_OK)
        r->status = kt_err_set(r->err, st, "pattern: %s at character %zu", what, r->pos);
    return r->status;
}

static int rx_new(struct rx *r)
{
    if (r->n_st >= RX_MAX_NFA) {
        rx_fail(r, KT_ERR_UNSUPPORTED, "too complex (more than 4096 NFA states)");
        return -1;
    }
    r->st[r->n_st] = (struct rx_nstate){{-1, -1}, -1, 0, 0};
    return r->n_st++;
}

static void rx_eps(struct rx *r, int from, int to)
{
    if (from < 0 || to < 0)
        return;
    if (r->st[from].eps[0] < 0) {
        r->st[from].eps[0] = to;
    } else if (r->st[from].eps[1] < 0) {
        r->st[from].eps[1] = to;
    } else { /* a third edge: through a new state */
        int n = rx_new(r);
        if (n < 0)
            return;
        r->st[n].eps[0] = r->st[from].eps[1];
        r->st[n].eps[1] = to;
        r->st[from].eps[1] = n;
    }
}

static bool rx_add_range(struct rx *r, uint32_t lo, uint32_t hi)
{
    if (!GROW(r->ranges, r->n_ranges, r->cap_ranges, r->n_ranges + 1)) {
        rx_fail(r, KT_ERR_NOMEM, "out of memory");
        return false;
    }
    r->ranges[r->n_ranges++] = (struct rx_range){lo, hi};
    return true;
}

static int compare_ranges(const void *a, const void *b)
{
    const struct rx_range *x = a, *y = b;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

/* Sorts and merges ranges [first, n_ranges); negate: their complement. */
static void rx_normalise(struct rx *r, size_t first, bool negate)
{
    size_t n = r->n_ranges - first;
    struct rx_range *a = r->ranges + first;
    qsort(a, n, sizeof *a, compare_ranges);
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (k && a[i].lo <= a[k - 1].hi + 1) {
            if (a[i].hi > a[k - 1].hi)
                a[k - 1].hi = a[i].hi;
        } else {
            a[k++] = a[i];
        }
    }
    r->n_ranges = first + k;
    if (!negate)
        return;
    if (k > 254) {
        rx_fail(r, KT_ERR_UNSUPPORTED, "a negated class of more than 254 ranges");
        return;
    }
    struct rx_range tmp[256];
    size_t m = 0;
    uint32_t next = 0;
    for (size_t i = 0; i < k && m < 255; i++) {
        if (a[i].lo > next)
            tmp[m++] = (struct rx_range){next, a[i].lo - 1};
        next = a[i].hi + 1;
    }
    if (next <= CP_MAX && m < 256)
        tmp[m++] = (struct rx_range){next, CP_MAX};
    r->n_ranges = first;
    for (size_t i = 0; i < m; i++)
        rx_add_range(r, tmp[i].lo, tmp[i].hi);
}

/* One code point of the pattern's UTF-8. */
static bool rx_char(struct rx *r, uint32_t *cp)
{
    const unsigned char *s = (const unsigned char *)r->src + r->pos;
    size_t k = utf8_char(s, r->len - r->pos);
    if (k == 0) {
        rx_fail(r, KT_ERR_INVALID, "invalid UTF-8");
        return false;
    }
    if (k == 1)
        *cp = s[0];
    else if (k == 2)
        *cp = (uint32_t)(s[0] & 0x1F) << 6 | (s[1] & 0x3F);
    else if (k == 3)
        *cp = (uint32_t)(s[0] & 0x0F) << 12 | (uint32_t)(s[1] & 0x3F) << 6 | (s[2] & 0x3F);
    else
        *cp = (uint32_t)(s[0] & 0x07) << 18 | (uint32_t)(s[1] & 0x3F) << 12 | (uint32_t)(s[2] & 0x3F) << 6 |
              (s[3] & 0x3F);
    r->pos += k;
    return true;
}

/* An escape after '\': adds its ranges; false on failure. */
static bool rx_escape(struct rx *r, bool in_class)
{
    if (r->pos >= r->len)
        return rx_fail(r, KT_ERR_INVALID, "a '\\' at the end"), false;
    char c = r->src[r->pos++];
    size_t first = r->n_ranges;
    switch (c) {
    case 'd':
    case 'D':
        rx_add_range(r, '0', '9');
        rx_normalise(r, first, c == 'D');
        return r->status == KT_OK;
    case 'w':
    case 'W':
        rx_add_range(r, '0', '9'), rx_add_range(r, 'A', 'Z'), rx_add_range(r, 'a', 'z'), rx_add_range(r, '_', '_');
        rx_normalise(r, first, c == 'W');
        return r->status == KT_OK;
    case 's':
    case 'S':
        rx_add_range(r, '\t', '\r'), rx_add_range(r, ' ', ' ');
        rx_normalise(r, first, c == 'S');
        return r->status == KT_OK;
    case 'n': return rx_add_range(r, '\n', '\n');
    case 't': return rx_add_range(r, '\t', '\t');
    case 'r': return rx_add_range(r, '\r', '\r');
    case 'f': return rx_add_range(r, '\f', '\f');
    case 'v': return rx_add_range(r, '\v', '\v');
    case 'u': {
        uint32_t v = 0, d;
        for (int i = 0; i < 4; i++) {
            if (r->pos >= r->len || !hex_digit(r->src[r->pos], &d))
                return rx_fail(r, KT_ERR_INVALID, "\\u needs 4 hex digits"), false;
            v = v << 4 | d;
            r->pos++;
        }
        return rx_add_range(r, v, v);
    }
    default:
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'))
            return rx_fail(r, KT_ERR_UNSUPPORTED, in_class ? "an unsupported escape in a class"
                                                          : "an unsupported escape (backreference or class)"),
                   false;
        return rx_add_range(r, (unsigned char)c, (unsigned char)c);
    }
}

static bool rx_class(struct rx *r)
{
    size_t first = r->n_ranges;
    bool negate = r->pos < r->len && r->src[r->pos] == '^';
    if (negate)
        r->pos++;
    bool any = false;
    while (r->pos < r->len && (r->src[r->pos] != ']' || !any)) {
        any = true;
        uint32_t lo;
        if (r->src[r->pos] == '\\') {
            r->pos++;
            size_t before = r->n_ranges;
            if (!rx_escape(r, true))
                return false;
            if (r->n_ranges - before != 1 || r->ranges[before].lo != r->ranges[before].hi)
                continue; /* \d and friends: no range from them */
            lo = r->ranges[before].lo;
            r->n_ranges = before;
        } else if (!rx_char(r, &lo)) {
            return false;
        }
        uint32_t hi = lo;
        if (r->pos + 1 < r->len && r->src[r->pos] == '-' && r->src[r->pos + 1] != ']') {
            r->pos++;
            if (r->src[r->pos] == '\\') {
                r->pos++;
                size_t before = r->n_ranges;
                if (!rx_escape(r, true))
                    return false;
                hi = r->ranges[before].lo;
                r->n_ranges = before;
            } else if (!rx_char(r, &hi)) {
                return false;
            }
            if (hi < lo)
                return rx_fail(r, KT_ERR_INVALID, "a class range out of order"), false;
        }
        if (!rx_add_range(r, lo, hi))
            return false;
    }
    if (r->pos >= r->len)
        return rx_fail(r, KT_ERR_INVALID, "a '[' without its ']'"), false;
    r->pos++;
    rx_normalise(r, first, negate);
    return r->status == KT_OK;
}

/* A fragment matching one code point among the ranges added from first on. */
static struct rx_frag rx_ranges_frag(struct rx *r, size_t first)
{
    int a = rx_new(r), b = rx_new(r);
    if (a < 0 || b < 0)
        return (struct rx_frag){-1, -1};
    r->st[a].target = b;
    r->st[a].rfirst = (uint32_t)first;
    r->st[a].rcount = (uint32_t)(r->n_ranges - first);
    return (struct rx_frag){a, b};
}

static struct rx_frag rx_alt(struct rx *r, int depth);

static struct rx_frag rx_atom(struct rx *r, int depth)
{
    struct rx_frag none = {-1, -1};
    char c = r->src[r->pos];
    size_t first = r->n_ranges;
    if (c == '(') {
        r->pos++;
        if (r->pos + 1 < r->len && r->src[r->pos] == '?') {
            if (r->src[r->pos + 1] != ':')
                return rx_fail(r, KT_ERR_UNSUPPORTED, "lookaround and named groups are not supported"), none;
            r->pos += 2;
        }
        struct rx_frag f = rx_alt(r, depth + 1);
        if (r->status != KT_OK)
            return none;
        if (r->pos >= r->len || r->src[r->pos] != ')')
            return rx_fail(r, KT_ERR_INVALID, "a '(' without its ')'"), none;
        r->pos++;
        return f;
    }
    if (c == '[') {
        r->pos++;
        if (!rx_class(r))
            return none;
        return rx_ranges_frag(r, first);
    }
    if (c == '.') {
        r->pos++;
        rx_add_range(r, '\n', '\n'), rx_add_range(r, '\r', '\r'), rx_add_range(r, 0x2028, 0x2029);
        rx_normalise(r, first, true);
        return rx_ranges_frag(r, first);
    }
    if (c == '\\') {
        r->pos++;
        if (!rx_escape(r, false))
            return none;
        return rx_ranges_frag(r, first);
    }
    if (c == '*' || c == '+' || c == '?' || c == '{')
        return rx_fail(r, KT_ERR_INVALID, "a quantifier with nothing before it"), none;
    if (c == '^' || c == '$')
        return rx_fail(r, KT_ERR_UNSUPPORTED, "'^' and '$' only at the start and the end"), none;
    uint32_t cp;
    if (!rx_char(r, &cp) || !rx_add_range(r, cp, cp))
        return none;
    return rx_ranges_frag(r, first);
}

static bool rx_number(struct rx *r, uint32_t *v)
{
    if (r->pos >= r->len || r->src[r->pos] < '0' || r->src[r->pos] > '9')
        return false;
    *v = 0;
    while (r->pos < r->len && r->src[r->pos] >= '0' && r->src[r->pos] <= '9' && *v < 100000)
        *v = *v * 10 + (uint32_t)(r->src[r->pos++] - '0');
    return true;
}

/* atom quantifier?: a bounded count re-parses the atom once per copy. */
static struct rx_frag rx_repeat(struct rx *r, int depth)
{
    struct rx_frag none = {-1, -1};
    size_t atom_start = r->pos;
    struct rx_frag f = rx_atom(r, depth);
    if (r->status != KT_OK)
        return none;
    size_t atom_end = r->pos;
    if (r->pos >= r->len)
        return f;
    char q = r->src[r->pos];
    uint32_t lo, hi;
    if (q == '*')
        lo = 0, hi = UINT32_MAX;
    else if (q == '+')
        lo = 1, hi = UINT32_MAX;
    else if (q == '?')
        lo = 0, hi = 1;
    else if (q == '{') {
        size_t save = r->pos++;
        if (!rx_number(r, &lo)) {
            r->pos = save;
            return rx_fail(r, KT_ERR_INVALID, "a '{' that is no {n,m} quantifier"), none;
        }
        hi = lo;
        if (r->pos < r->len && r->src[r->pos] == ',') {
            r->pos++;
            if (!rx_number(r, &hi))
                hi = UINT32_MAX;
        }
        if (r->pos >= r->len || r->src[r->pos] != '}')
            return rx_fail(r, KT_ERR_INVALID, "a '{' without its '}'"), none;
        if (hi < lo)
            return rx_fail(r, KT_ERR_INVALID, "a {n,m} with m < n"), none;
        if (lo > 64 || (hi != UINT32_MAX && hi > 64))
            return rx_fail(r, KT_ERR_UNSUPPORTED, "a count over 64"), none;
    } else {
        return f;
    }
    r->pos++;
    if (r->pos < r->len && (r->src[r->pos] == '?' || r->src[r->pos] == '+'))
        return rx_fail(r, KT_ERR_UNSUPPORTED, "lazy and possessive quantifiers are not supported"), none;
    size_t after = r->pos;
    /* copies: the first is f; each further one parsed again from the atom's text */
    uint32_t copies = hi == UINT32_MAX ? (lo > 0 ? lo : 1) : hi;
    if (copies == 0) { /* {0}: matches the empty string */
        int e = rx_new(r);
        return (struct rx_frag){e, e};
    }
    int start = rx_new(r), end = rx_new(r);
    if (start < 0 || end < 0)
        return none;
    int prev = start;
    for (uint32_t k = 0; k < copies; k++) {
        struct rx_frag c = f;
        if (k > 0) {
            r->pos = atom_start;
            c = rx_atom(r, depth);
            if (r->status != KT_OK)
                return none;
            r->pos = atom_end;
        }
        rx_eps(r, prev, c.start);
        if (k >= lo) /* optional copies may be skipped to the end */
            rx_eps(r, prev, end);
        prev = c.end;
        if (hi == UINT32_MAX && k == copies - 1)
            rx_eps(r, c.end, c.start); /* the last copy loops */
    }
    rx_eps(r, prev, end);
    r->pos = after;
    return (struct rx_frag){start, end};
}

static struct rx_frag rx_concat(struct rx *r, int depth)
{
    int start = rx_new(r);
    int cur = start;
    while (r->status == KT_OK && r->pos < r->len && r->src[r->pos] != '|' && r->src[r->pos] != ')') {
        if (r->src[r->pos] == '$' && r->pos + 1 == r->len && depth == 0)
            break;
        struct rx_frag f = rx_repeat(r, depth);
        if (r->status != KT_OK)
            break;
        rx_eps(r, cur, f.start);
        cur = f.end;
    }
    return (struct rx_frag){start, cur};
}

static struct rx_frag rx_alt(struct rx *r, int depth)
{
    if (depth > 32) {
        rx_fail(r, KT_ERR_UNSUPPORTED, "groups nest deeper than 32");
        return (struct rx_frag){-1, -1};
    }
    struct rx_frag f = rx_concat(r, depth);
    if (r->status != KT_OK || r->pos >= r->len || r->src[r->pos] != '|')
        return f;
    /* a chain of splits: each to its branch and to the next split */
    int start = rx_new(r), end = rx_new(r), split = start;
    rx_eps(r, start, f.start);
    rx_eps(r, f.end, end);
    while (r->status == KT_OK && r->pos < r->len && r->src[r->pos] == '|') {
        r->pos++;
        struct rx_frag g = rx_concat(r, depth);
        int next = rx_new(r);
        if (r->status != KT_OK)
            break;
        rx_eps(r, split, next);
        rx_eps(r, next, g.start);
        rx_eps(r, g.end, end);
        split = next;
    }
    return (struct rx_frag){start, end};
}

/* A loop over any code point: an unanchored side. */
static struct rx_frag rx_anything(struct rx *r)
{
    size_t first = r->n_ranges;
    rx_add_range(r, 0, CP_MAX);
    struct rx_frag one = rx_ranges_frag(r, first);
    int s = rx_new(r);
    if (s < 0 || one.start < 0)
        return (struct rx_frag){-1, -1};
    rx_eps(r, s, one.start);
    rx_eps(r, one.end, s);
    return (struct rx_frag){s, s};
}

static void rx_closure(const struct rx *r, uint64_t *set, int s)
{
    int stack[RX_MAX_NFA];
    int n = 0;
    if (set[s >> 6] >> (s & 63) & 1)
        return;
    set[s >> 6] |= 1ull << (s & 63);
    stack[n++] = s;
    while (n) {
        int x = stack[--n];
        for (int k = 0; k < 2; k++) {
            int y = r->st[x].eps[k];
            if (y >= 0 && !(set[y >> 6] >> (y & 63) & 1)) {
                set[y >> 6] |= 1ull << (y & 63);
                stack[n++] = y;
            }
        }
    }
}

static bool ranges_contain(const struct rx *r, const struct rx_nstate *s, uint32_t cp)
{
    for (uint32_t i = 0; i < s->rcount; i++)
        if (cp >= r->ranges[s->rfirst + i].lo && cp <= r->ranges[s->rfirst + i].hi)
            return true;
    return false;
}

static int compare_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

static size_t set_slot(const uint64_t *set, size_t words)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t w = 0; w < words; w++)
        h = (h ^ set[w]) * 1099511628211ull;
    return (size_t)(h ^ (h >> 29)) & (RX_HASH - 1);
}

/* Subset construction into g's DFA arrays; *root: the start state's id. */
static kt_status rx_to_dfa(struct rx *r, struct kt_grammar *g, int nfa_start, int nfa_accept, uint32_t *root,
                           kt_err *err)
{
    size_t words = ((size_t)r->n_st + 63) / 64;
    uint64_t *sets = calloc(RX_MAX_DFA * words, sizeof *sets);
    uint64_t *tmp = calloc(words, sizeof *tmp);
    uint32_t *points = malloc((2 * r->n_ranges + 2) * sizeof *points);
    int *live = malloc((size_t)r->n_st * sizeof *live); /* the current set's states that read a code point */
    uint32_t *index = calloc(RX_HASH, sizeof *index);    /* sets by hash: DFA id + 1; 0 empty */
    uint64_t work = 0; /* a bound on compile time, whatever the pattern */
    kt_status st = KT_OK;
    if (!sets || !tmp || !points || !live || !index) {
        st = nomem(err);
        goto done;
    }
    size_t base = g->n_dfa, n_dfa = 1;
    rx_closure(r, sets, nfa_start);
    index[set_slot(sets, words)] = 1;
    for (size_t d = 0; d < n_dfa; d++) {
        const uint64_t *cur = sets + d * words;
        size_t n_points = 0, n_live = 0;
        for (int s = 0; s < r->n_st; s++)
            if (cur[s >> 6] >> (s & 63) & 1 && r->st[s].target >= 0)
                live[n_live++] = s;
        for (size_t k = 0; k < n_live; k++) {
            int s = live[k];
            for (uint32_t i = 0; i < r->st[s].rcount; i++) {
                    points[n_points++] = r->ranges[r->st[s].rfirst + i].lo;
                    points[n_points++] = r->ranges[r->st[s].rfirst + i].hi + 1;
            }
        }
        qsort(points, n_points, sizeof *points, compare_u32);
        if (!GROW(g->dfa, g->n_dfa, g->cap_dfa, base + d + 1)) {
            st = nomem(err);
            goto done;
        }
        g->dfa[base + d] = (struct dfa_state){.first = (uint32_t)g->n_dfa_trans, .n = 0,
                                              .accepting = (cur[nfa_accept >> 6] >> (nfa_accept & 63)) & 1};
        if (base + d + 1 > g->n_dfa)
            g->n_dfa = base + d + 1;
        for (size_t p = 0; p + 1 < n_points; p++) {
            uint32_t lo = points[p], hi = points[p + 1] - 1;
            if (points[p + 1] == points[p])
                continue;
            memset(tmp, 0, words * sizeof *tmp);
            bool any = false;
            work += n_live + 4 * words;
            if (work > 50000000u) {
                st = kt_err_set(err, KT_ERR_UNSUPPORTED, "pattern: too complex to compile");
                goto done;
            }
            for (size_t k = 0; k < n_live; k++)
                if (ranges_contain(r, &r->st[live[k]], lo)) {
                    rx_closure(r, tmp, r->st[live[k]].target);
                    any = true;
                }
            if (!any)
                continue;
            size_t slot = set_slot(tmp, words), t = n_dfa;
            for (; index[slot]; slot = (slot + 1) & (RX_HASH - 1))
                if (memcmp(sets + (index[slot] - 1) * words, tmp, words * sizeof *tmp) == 0) {
                    t = index[slot] - 1;
                    break;
                }
            if (t == n_dfa) {
                if (n_dfa == RX_MAX_DFA) {
                    st = kt_err_set(err, KT_ERR_UNSUPPORTED, "pattern: too complex (more than %d DFA states)",
                                    RX_MAX_DFA);
                    goto done;
                }
                memcpy(sets + n_dfa * words, tmp, words * sizeof *tmp);
                index[slot] = (uint32_t)++n_dfa;
            }
            struct dfa_trans *last = g->dfa[base + d].n ? &g->dfa_trans[g->n_dfa_trans - 1] : NULL;
            if (last && last->next == base + t && last->hi + 1 == lo) {
                last->hi = hi;
                continue;
            }
            if (!GROW(g->dfa_trans, g->n_dfa_trans, g->cap_dfa_trans, g->n_dfa_trans + 1)) {
                st = nomem(err);
                goto done;
            }
            g->dfa_trans[g->n_dfa_trans++] = (struct dfa_trans){lo, hi, (uint32_t)(base + t)};
            g->dfa[base + d].n++;
        }
    }
    *root = (uint32_t)base;
done:
    free(sets);
    free(tmp);
    free(points);
    free(live);
    free(index);
    return st;
}

/* The DFA of pattern; whole: the text must match all of it (as if anchored at both ends). */
static kt_status compile_pattern(struct kt_grammar *g, const char *pattern, size_t len, bool whole_text,
                                 uint32_t *root_out, kt_err *err)
{
    struct rx r = {.src = pattern, .len = len, .err = err, .status = KT_OK};
    r.st = malloc(RX_MAX_NFA * sizeof *r.st);
    if (!r.st)
        return nomem(err);
    bool anchored_start = len > 0 && pattern[0] == '^';
    bool anchored_end = len > 0 && pattern[len - 1] == '$' && !(len > 1 && pattern[len - 2] == '\\');
    if (anchored_start)
        r.pos = 1;
    struct rx_frag body = rx_alt(&r, 0);
    if (r.status == KT_OK && r.pos < r.len && !(anchored_end && r.pos == r.len - 1))
        rx_fail(&r, KT_ERR_INVALID, r.src[r.pos] == ')' ? "a ')' without its '('" : "unexpected text");
    struct rx_frag whole = body;
    if (r.status == KT_OK && !anchored_start && !whole_text) {
        struct rx_frag pre = rx_anything(&r);
        rx_eps(&r, pre.end, body.start);
        whole.start = pre.start;
    }
    if (r.status == KT_OK && !anchored_end && !whole_text) {
        struct rx_frag post = rx_anything(&r);
        rx_eps(&r, body.end, post.start);
        whole.end = post.end;
    }
    kt_status st = r.status;
    uint32_t root = 0;
    if (st == KT_OK)
        st = rx_to_dfa(&r, g, whole.start, whole.end, &root, err);
    free(r.st);
    free(r.ranges);
    *root_out = root;
    return st;
}

kt_status kt_grammar_json_pattern_string(struct kt_grammar *g, const char *pattern, size_t len, uint32_t *node,
                                         kt_err *err)
{
    uint32_t root;
    kt_status st = compile_pattern(g, pattern, len, false, &root, err);
    return st == KT_OK ? add_node(g, (struct node){.kind = K_PATTERN, .first = root}, node, err) : st;
}

kt_status kt_grammar_regex(struct kt_grammar *g, const char *pattern, size_t len, uint32_t *node, kt_err *err)
{
    uint32_t root;
    kt_status st = compile_pattern(g, pattern, len, true, &root, err);
    return st == KT_OK ? add_node(g, (struct node){.kind = K_REGEX, .first = root}, node, err) : st;
}

/* A code point through the pattern's DFA (state in f->b). */
static bool pattern_feed(const struct kt_grammar *g, struct frame *f, uint32_t cp)
{
    const struct dfa_state *d = &g->dfa[f->b];
    for (uint32_t i = 0; i < d->n; i++) {
        const struct dfa_trans *t = &g->dfa_trans[d->first + i];
        if (cp < t->lo)
            return false;
        if (cp <= t->hi) {
            f->b = t->next;
            f->a = S_BODY;
            return true;
        }
    }
    return false;
}

/* Whether some code point in [lo, hi] can leave DFA state d: a byte that
 * starts or continues a character (or an escape) is taken only then, so the
 * automaton never waits for a character that cannot come. */
static bool dfa_intersects(const struct kt_grammar *g, uint32_t d, uint32_t lo, uint32_t hi)
{
    const struct dfa_state *s = &g->dfa[d];
    for (uint32_t i = 0; i < s->n; i++) {
        const struct dfa_trans *t = &g->dfa_trans[s->first + i];
        if (t->lo <= hi && t->hi >= lo)
            return true;
    }
    return false;
}

/* The code points a character can still become: bits so far, continuation bytes left, the lead's limits. */
static bool utf8_possible(const struct kt_grammar *g, uint32_t d, uint32_t bits, uint32_t left, uint32_t kind,
                          bool f4)
{
    uint32_t lo = bits << (6 * left), hi = lo | ((1u << (6 * left)) - 1);
    if (kind == 1 && lo < 0x800)
        lo = 0x800;
    if (kind == 2 && hi > 0xD7FF)
        hi = 0xD7FF;
    if (kind == 3 && lo < 0x10000)
        lo = 0x10000;
    if (f4 && hi > 0x10FFFF)
        hi = 0x10FFFF;
    return lo <= hi && dfa_intersects(g, d, lo, hi);
}

/* One byte of a string that must match a pattern: the string's characters
 * (raw UTF-8 or JSON escapes) go through the DFA as code points.
 * a: phase | utf8 left << 3 | first-continuation kind << 5 | F4 << 7 | code point so far << 8;
 * in S_HEX: phase | hex digits << 3 | value << 8.  b: the DFA state. */
static bool step_pattern(const struct kt_grammar *g, const struct node *n, struct frame *f, uint32_t *depth, int c)
{
    uint32_t ph = PH(f->a);
    switch (ph) {
    case S_OPEN:
        if (c != '"')
            return false;
        f->a = S_BODY;
        f->b = n->first;
        return true;
    case S_BODY: {
        uint32_t left = (f->a >> 3) & 3, kind = (f->a >> 5) & 3, cp = f->a >> 8;
        if (left) {
            unsigned lo = kind == 1 ? 0xA0 : kind == 3 ? 0x90 : 0x80;
            unsigned hi = kind == 2 ? 0x9F : ((f->a >> 7) & 1) ? 0x8F : 0xBF;
            if (c < (int)lo || c > (int)hi)
                return false;
            cp = cp << 6 | ((uint32_t)c & 0x3F);
            if (left == 1)
                return pattern_feed(g, f, cp);
            if (!utf8_possible(g, f->b, cp, left - 1, 0, false))
                return false;
            f->a = S_BODY | ((left - 1) << 3) | (cp << 8);
            return true;
        }
        if (c == '"') {
            if (!g->dfa[f->b].accepting)
                return false;
            (*depth)--;
            return true;
        }
        if (c == '\\') {
            if (!dfa_intersects(g, f->b, 1, 0xFFFF)) /* every escape stands for one of these */
                return false;
            f->a = S_ESC;
            return true;
        }
        if (c < 0x20 || (c >= 0x80 && c < 0xC2) || c > 0xF4)
            return false;
        if (c < 0x80)
            return pattern_feed(g, f, (uint32_t)c);
        uint32_t need = c < 0xE0 ? 1 : c < 0xF0 ? 2 : 3;
        uint32_t k = c == 0xE0 ? 1 : c == 0xED ? 2 : c == 0xF0 ? 3 : 0;
        uint32_t bits = (uint32_t)c & (need == 1 ? 0x1F : need == 2 ? 0x0F : 0x07);
        if (!utf8_possible(g, f->b, bits, need, k, c == 0xF4))
            return false;
        f->a = S_BODY | (need << 3) | (k << 5) | (c == 0xF4 ? 1u << 7 : 0) | (bits << 8);
        return true;
    }
    case S_ESC: {
        static const char from[] = "\"\\/bfnrt";
        static const uint32_t to[] = {'"', '\\', '/', '\b', '\f', '\n', '\r', '\t'};
        if (c == 'u') {
            if (!dfa_intersects(g, f->b, 1, 0xD7FF) && !dfa_intersects(g, f->b, 0xE000, 0xFFFF))
                return false;
            f->a = S_HEX;
            return true;
        }
        const char *p = c ? strchr(from, c) : NULL;
        return p && pattern_feed(g, f, to[p - from]);
    }
    case S_HEX: {
        uint32_t digits = (f->a >> 3) & 7, value = f->a >> 8, d;
        if (!hex_digit(c, &d))
            return false;
        value = value << 4 | d;
        digits++;
        if (digits == 2 && value >= 0xD8 && value <= 0xDF)
            return false;
        if (digits == 4)
            return value != 0 && pattern_feed(g, f, value);
        uint32_t lo = value << (4 * (4 - digits)), hi = lo | ((1u << (4 * (4 - digits))) - 1);
        if (lo == 0)
            lo = 1;
        bool possible = (lo <= 0xD7FF && dfa_intersects(g, f->b, lo, hi < 0xD7FF ? hi : 0xD7FF)) ||
                        (hi >= 0xE000 && dfa_intersects(g, f->b, lo > 0xE000 ? lo : 0xE000, hi));
        if (!possible)
            return false;
        f->a = S_HEX | (digits << 3) | (value << 8);
        return true;
    }
    }
    return false;
}

/* One byte of raw text that must match a regex whole: UTF-8 characters
 * through the DFA.  a: utf8 left << 3 | first-continuation kind << 5 |
 * F4 << 7 | code point so far << 8 (phase bits 0); b: the DFA state. */
static bool step_regex(const struct kt_grammar *g, struct frame *f, int c)
{
    uint32_t left = (f->a >> 3) & 3, kind = (f->a >> 5) & 3, cp = f->a >> 8;
    if (left) {
        unsigned lo = kind == 1 ? 0xA0 : kind == 3 ? 0x90 : 0x80;
        unsigned hi = kind == 2 ? 0x9F : ((f->a >> 7) & 1) ? 0x8F : 0xBF;
        if (c < (int)lo || c > (int)hi)
            return false;
        cp = cp << 6 | ((uint32_t)c & 0x3F);
        if (left == 1) {
            if (!pattern_feed(g, f, cp))
                return false;
            f->a = 0;
            return true;
        }
        if (!utf8_possible(g, f->b, cp, left - 1, 0, false))
            return false;
        f->a = ((left - 1) << 3) | (cp << 8);
        return true;
    }
    if ((c >= 0x80 && c < 0xC2) || c > 0xF4)
        return false;
    if (c < 0x80) {
        if (!pattern_feed(g, f, (uint32_t)c))
            return false;
        f->a = 0;
        return true;
    }
    uint32_t need = c < 0xE0 ? 1 : c < 0xF0 ? 2 : 3;
    uint32_t k = c == 0xE0 ? 1 : c == 0xED ? 2 : c == 0xF0 ? 3 : 0;
    uint32_t bits = (uint32_t)c & (need == 1 ? 0x1F : need == 2 ? 0x0F : 0x07);
    if (!utf8_possible(g, f->b, bits, need, k, c == 0xF4))
        return false;
    f->a = (need << 3) | (k << 5) | (c == 0xF4 ? 1u << 7 : 0) | (bits << 8);
    return true;
}

/* Steps the waiting top frame of st[*depth] by symbol c; false if it cannot take it. */
static bool step_top(const struct kt_grammar *g, struct frame *st, uint32_t *depth, int c)
{
    struct frame *f = &st[*depth - 1];
    const struct node *n = &g->nodes[f->node];
    if (n->kind == K_ANY)
        return true;
    if (c >= 256) {
        if (n->kind != K_TOKEN || (int)n->min != c - 256)
            return false;
        (*depth)--;
        return true;
    }
    switch (n->kind) {
    case K_LITERALS: {
        uint32_t t = trie_child(g, f->b, (uint8_t)c);
        if (t == NONE)
            return false;
        f->b = t;
        return true;
    }
    case K_STRING:
        return step_string(n, f, depth, c);
    case K_PATTERN:
        return step_pattern(g, n, f, depth, c);
    case K_REGEX:
        return step_regex(g, f, c);
    case K_TEXT: {
        if (f->a >= n->max) /* its token budget is spent (the count moves at token ends) */
            return false;
        if (n->n == 0)
            return true;
        uint8_t next = g->avoid[n->first + f->b * 256 + (uint32_t)c];
        if (next == n->n)
            return false;
        f->b = next;
        return true;
    }
    case K_NUMBER:
        return step_number(n, f, c);
    case K_ARRAY: {
        uint32_t ph = PH(f->a), count = IDX(f->a);
        if (ph == A_OPEN) {
            if (c != '[')
                return false;
            f->a = A_FIRST;
            f->b = 0;
            return true;
        }
        if (is_ws(c)) {
            if (f->b >= KT_GRAMMAR_MAX_WS)
                return false;
            f->b++;
            return true;
        }
        if (c == ']' && ((ph == A_FIRST && n->min == 0) || (ph == A_AFTER && count >= n->min))) {
            (*depth)--;
            return true;
        }
        if (c == ',' && ph == A_AFTER && count < n->max) {
            f->a = A_NEXT | (count << 3);
            f->b = 0;
            return true;
        }
        return false;
    }
    case K_OBJECT:
    case K_MAP: {
        bool map = n->kind == K_MAP;
        uint32_t ph = PH(f->a), i = IDX(f->a);
        if (ph == O_OPEN) {
            if (c != '{')
                return false;
            f->a = O_KEY_OR_CLOSE;
            f->b = 0;
            return true;
        }
        if (ph == O_KEY) {
            uint32_t t = trie_child(g, f->b, (uint8_t)c);
            if (t == NONE)
                return false;
            if (g->trie[t].value >= 0) {
                f->a = O_COLON | ((uint32_t)g->trie[t].value << 3);
                f->b = 0;
            } else {
                f->b = t;
            }
            return true;
        }
        if (is_ws(c)) {
            if (f->b >= KT_GRAMMAR_MAX_WS)
                return false;
            f->b++;
            return true;
        }
        switch (ph) {
        case O_KEY_OR_CLOSE:
        case O_KEY_ONLY:
            if (c == '}' && ph == O_KEY_OR_CLOSE && (map || g->props[n->first + i].can_close)) {
                (*depth)--;
                return true;
            }
            if (map) {
                if (c != '"' || *depth >= KT_GRAMMAR_MAX_DEPTH)
                    return false;
                f->a = O_COLON;
                f->b = 0;
                st[(*depth)++] = (struct frame){n->min, S_BODY, 0};
                return true;
            }
            if (i >= n->n)
                return false;
            {
                uint32_t t = trie_child(g, g->props[n->first + i].key_root, (uint8_t)c);
                if (t == NONE)
                    return false;
                f->a = O_KEY | (i << 3);
                f->b = t;
            }
            return true;
        case O_COLON:
            if (c != ':')
                return false;
            f->a = O_VALUE | (i << 3);
            f->b = 0;
            return true;
        case O_AFTER:
            if (c == '}' && (map || g->props[n->first + i].can_close)) {
                (*depth)--;
                return true;
            }
            if (c == ',' && (map || i < n->n)) {
                f->a = O_KEY_ONLY | (i << 3);
                f->b = 0;
                return true;
            }
            return false;
        default: /* O_VALUE: only whitespace, taken above */
            return false;
        }
    }
    default:
        return false;
    }
}

/* Builds at the arena's end the state after symbol c from the state at from;
 * returns the new state's offset, or NONE-like SIZE_MAX when nothing fits. */
static size_t step_state(struct kt_grammar_matcher *m, size_t from, int c)
{
    size_t start;
    if (!state_begin(m, &start))
        return SIZE_MAX;
    m->budget = 4096;
    uint32_t n_stacks = m->w[from + 2];
    size_t p = from + HDR_WORDS;
    for (uint32_t s = 0; s < n_stacks; s++) {
        uint32_t depth = m->w[p];
        memcpy(m->scratch, m->w + p + 1, depth * sizeof *m->scratch);
        p += 1 + FRAME_WORDS * (size_t)depth;
        if (step_top(m->g, m->scratch, &depth, c))
            closure(m, start, m->scratch, depth);
    }
    if (m->w[start + 2] == 0 && m->w[start + 1] == 0) {
        m->len = start;
        return SIZE_MAX;
    }
    return start;
}

kt_status kt_grammar_matcher_create(const struct kt_grammar *g, const struct kt_grammar_vocab *v,
                                    struct kt_grammar_matcher **out, kt_err *err)
{
    *out = NULL;
    if (!g->has_root)
        return kt_err_set(err, KT_ERR_INVALID, "grammar: no root");
    struct kt_grammar_matcher *m = calloc(1, sizeof *m);
    if (!m)
        return nomem(err);
    m->g = g;
    m->v = v;
    m->level = malloc((v->max_len + 2) * sizeof *m->level);
    size_t start;
    if (!m->level || !state_begin(m, &start)) {
        kt_grammar_matcher_destroy(m);
        return nomem(err);
    }
    struct frame st[KT_GRAMMAR_MAX_DEPTH];
    st[0] = frame_init(g, g->root);
    m->budget = 4096;
    closure(m, start, st, 1);
    if (m->oom) {
        kt_grammar_matcher_destroy(m);
        return nomem(err);
    }
    *out = m;
    return KT_OK;
}

void kt_grammar_matcher_destroy(struct kt_grammar_matcher *m)
{
    if (!m)
        return;
    for (uint32_t s = 0; s < 64; s++)
        free(m->text_cache[s]);
    free(m->w);
    free(m->level);
    free(m);
}

bool kt_grammar_matcher_complete(const struct kt_grammar_matcher *m)
{
    return m->ended || m->w[1] != 0;
}

bool kt_grammar_matcher_closed(const struct kt_grammar_matcher *m)
{
    return m->ended || (m->w[1] != 0 && m->w[2] == 0);
}

/* Makes the state at off (ending at the arena's end) the current one. */
static void adopt(struct kt_grammar_matcher *m, size_t off)
{
    size_t words = m->w[off];
    memmove(m->w, m->w + off, words * sizeof *m->w);
    m->len = words;
}

bool kt_grammar_matcher_accept_bytes(struct kt_grammar_matcher *m, const char *bytes, size_t len)
{
    if (m->ended)
        return len == 0;
    size_t base = m->len, cur = 0;
    for (size_t i = 0; i < len; i++) {
        size_t next = step_state(m, cur, (unsigned char)bytes[i]);
        if (next == SIZE_MAX) {
            m->len = base;
            return false;
        }
        cur = next;
    }
    if (len)
        adopt(m, cur);
    return true;
}

/* One more text token in every free text the output is in now (budgets). */
static void count_text_token(struct kt_grammar_matcher *m)
{
    size_t p = HDR_WORDS;
    for (uint32_t s = 0; s < m->w[2]; s++) {
        uint32_t depth = m->w[p];
        struct frame *top = (struct frame *)(m->w + p + 1) + depth - 1;
        if (m->g->nodes[top->node].kind == K_TEXT && top->a < UINT32_MAX)
            top->a++;
        p += 1 + FRAME_WORDS * (size_t)depth;
    }
}

/* Some stack waits in K_ANY: every token may follow. */
static bool in_any(const struct kt_grammar_matcher *m)
{
    size_t p = HDR_WORDS;
    for (uint32_t s = 0; s < m->w[2]; s++) {
        uint32_t depth = m->w[p];
        const struct frame *top = (const struct frame *)(m->w + p + 1) + depth - 1;
        if (m->g->nodes[top->node].kind == K_ANY)
            return true;
        p += 1 + FRAME_WORDS * (size_t)depth;
    }
    return false;
}

static bool is_eog(const struct kt_grammar_vocab *v, int32_t token)
{
    for (size_t i = 0; i < v->n_eog; i++)
        if (v->eog[i] == token)
            return true;
    return false;
}

kt_status kt_grammar_matcher_accept_token(struct kt_grammar_matcher *m, int32_t token, kt_err *err)
{
    const struct kt_grammar_vocab *v = m->v;
    if (token < 0 || (uint32_t)token >= v->n_tokens || m->ended)
        return kt_err_set(err, KT_ERR_INVALID, "grammar: token %d cannot follow the output", token);
    if (is_eog(v, token)) {
        if (!kt_grammar_matcher_complete(m))
            return kt_err_set(err, KT_ERR_INVALID, "grammar: the output ended before it was complete");
        m->ended = true;
        return KT_OK;
    }
    if (v->special[token]) {
        size_t next = step_state(m, 0, 256 + token);
        if (next == SIZE_MAX)
            return kt_err_set(err, KT_ERR_INVALID, "grammar: special token %d cannot follow the output", token);
        adopt(m, next);
        return KT_OK;
    }
    if (!kt_grammar_matcher_accept_bytes(m, v->bytes[token], v->lens[token]))
        return kt_err_set(err, KT_ERR_INVALID, "grammar: token %d cannot follow the output", token);
    count_text_token(m);
    return KT_OK;
}

static void set_bit(uint32_t *mask, uint32_t id)
{
    mask[id >> 5] |= 1u << (id & 31);
}

/* Some stack waits in free text and the others only for special tokens:
 * every text token is allowed (the specials were stepped one by one). */
static bool in_free_text(const struct kt_grammar_matcher *m)
{
    bool text = false;
    size_t p = HDR_WORDS;
    for (uint32_t s = 0; s < m->w[2]; s++) {
        uint32_t depth = m->w[p];
        const struct frame *top = (const struct frame *)(m->w + p + 1) + depth - 1;
        uint8_t kind = m->g->nodes[top->node].kind;
        if (kind != K_TEXT && kind != K_TOKEN)
            return false;
        text = text || kind == K_TEXT;
        p += 1 + FRAME_WORDS * (size_t)depth;
    }
    return text;
}

/* The text tokens free text in state (node, b) allows: those whose bytes do
 * not complete the avoided string; made once per state a matcher meets. */
static const uint32_t *free_text_bits(struct kt_grammar_matcher *m, uint32_t node, uint32_t b)
{
    const struct kt_grammar_vocab *v = m->v;
    const struct node *n = &m->g->nodes[node];
    if (n->n == 0)
        return v->text_bits;
    if (m->text_node != node) {
        for (uint32_t s = 0; s < 64; s++)
            free(m->text_cache[s]), m->text_cache[s] = NULL;
        m->text_node = node;
    }
    if (m->text_cache[b])
        return m->text_cache[b];
    uint32_t *bits = calloc(v->mask_words, sizeof *bits);
    if (!bits) {
        m->oom = true;
        return NULL;
    }
    const uint8_t *table = m->g->avoid + n->first;
    for (uint32_t id = 0; id < v->n_tokens; id++) {
        if (!((v->text_bits[id >> 5] >> (id & 31)) & 1))
            continue;
        uint32_t s = b;
        const unsigned char *p = (const unsigned char *)v->bytes[id];
        uint32_t i = 0;
        for (; i < v->lens[id] && s < n->n; i++)
            s = table[s * 256 + p[i]];
        if (s < n->n)
            bits[id >> 5] |= 1u << (id & 31);
    }
    m->text_cache[b] = bits;
    return bits;
}

static void free_text_mask(struct kt_grammar_matcher *m, uint32_t *mask)
{
    size_t p = HDR_WORDS;
    for (uint32_t s = 0; s < m->w[2]; s++) {
        uint32_t depth = m->w[p];
        const struct frame *top = (const struct frame *)(m->w + p + 1) + depth - 1;
        p += 1 + FRAME_WORDS * (size_t)depth;
        if (m->g->nodes[top->node].kind != K_TEXT || top->a >= m->g->nodes[top->node].max)
            continue;
        const uint32_t *bits = free_text_bits(m, top->node, top->b);
        for (uint32_t w = 0; bits && w < m->v->mask_words; w++)
            mask[w] |= bits[w];
    }
}

/* Every stack of the current state waits in a string body with no character
 * half done: the plain-token shortcut applies.  *room: most characters any
 * stack may still add. */
static bool all_in_string_body(const struct kt_grammar_matcher *m, uint32_t *room)
{
    uint32_t n_stacks = m->w[2];
    if (n_stacks == 0)
        return false;
    size_t p = HDR_WORDS;
    *room = 0;
    for (uint32_t s = 0; s < n_stacks; s++) {
        uint32_t depth = m->w[p];
        const struct frame *top = (const struct frame *)(m->w + p + 1) + depth - 1;
        const struct node *n = &m->g->nodes[top->node];
        if (n->kind != K_STRING || top->a != S_BODY)
            return false;
        uint32_t r = n->max == KT_GRAMMAR_UNBOUNDED ? UINT32_MAX : n->max - top->b;
        if (r > *room)
            *room = r;
        p += 1 + FRAME_WORDS * (size_t)depth;
    }
    return true;
}

/* The current state with chars characters added to every stack's string,
 * dropping stacks without room; SIZE_MAX when none is left. */
static size_t state_with_chars(struct kt_grammar_matcher *m, uint32_t chars)
{
    size_t start;
    if (!state_begin(m, &start))
        return SIZE_MAX;
    uint32_t n_stacks = m->w[2];
    size_t p = HDR_WORDS;
    for (uint32_t s = 0; s < n_stacks; s++) {
        uint32_t depth = m->w[p];
        memcpy(m->scratch, m->w + p + 1, depth * sizeof *m->scratch);
        p += 1 + FRAME_WORDS * (size_t)depth;
        struct frame *top = &m->scratch[depth - 1];
        const struct node *n = &m->g->nodes[top->node];
        if (n->max != KT_GRAMMAR_UNBOUNDED && n->max - top->b < chars)
            continue;
        top->b += chars;
        emit(m, start, m->scratch, depth);
    }
    if (m->w[start + 2] == 0) {
        m->len = start;
        return SIZE_MAX;
    }
    return start;
}

static void string_mask(struct kt_grammar_matcher *m, uint32_t room, uint32_t *mask)
{
    const struct kt_grammar_vocab *v = m->v;
    if (room >= v->max_plain_chars) {
        memcpy(mask, v->plain_bits, v->mask_words * sizeof *mask);
    } else {
        for (uint32_t w = 0; w < v->mask_words; w++) {
            uint32_t bits = v->plain_bits[w];
            while (bits) {
                uint32_t id = w * 32 + (uint32_t)__builtin_ctz(bits);
                bits &= bits - 1;
                if (v->plain_chars[id] <= room)
                    mask[w] |= 1u << (id & 31);
            }
        }
    }
    size_t base = m->len;
    for (uint32_t k = 0; k < v->n_live; k++) {
        uint32_t id = v->live[k];
        if (v->plain_chars[id] > room)
            continue;
        size_t cur = v->plain_chars[id] ? state_with_chars(m, v->plain_chars[id]) : 0;
        const unsigned char *s = (const unsigned char *)v->bytes[id];
        for (uint32_t i = v->plain_bytes[id]; cur != SIZE_MAX && i < v->lens[id]; i++)
            cur = step_state(m, cur, s[i]);
        if (cur != SIZE_MAX)
            set_bit(mask, id);
        m->len = base;
    }
}

/* The whole trie, depth first, skipping every subtree whose path fails. */
static void trie_mask(struct kt_grammar_matcher *m, uint32_t *mask)
{
    const struct kt_grammar_vocab *v = m->v;
    size_t base = m->len;
    m->level[0] = 0;
    uint32_t i = 1;
    while (i < v->n_nodes) {
        uint32_t d = v->depth[i];
        m->len = d == 1 ? base : m->w[m->level[d - 1]] + m->level[d - 1];
        size_t next = step_state(m, m->level[d - 1], v->byte[i]);
        if (next == SIZE_MAX) {
            i = v->subtree_end[i];
            continue;
        }
        m->level[d] = next;
        for (uint32_t k = 0; k < v->tok_count[i]; k++)
            set_bit(mask, v->tok_list[v->tok_first[i] + k]);
        i++;
    }
    m->len = base;
}

uint32_t kt_grammar_matcher_fill_mask(struct kt_grammar_matcher *m, uint32_t *mask)
{
    const struct kt_grammar_vocab *v = m->v;
    memset(mask, 0, v->mask_words * sizeof *mask);
    if (m->oom)
        return 0;
    if (!m->ended) {
        if (m->w[1])
            for (size_t i = 0; i < v->n_eog; i++)
                set_bit(mask, (uint32_t)v->eog[i]);
        for (size_t k = 0; k < m->g->n_tokens; k++) {
            int32_t t = m->g->tokens[k];
            if ((uint32_t)t >= v->n_tokens || !v->special[t])
                continue;
            size_t base = m->len;
            if (step_state(m, 0, 256 + t) != SIZE_MAX)
                set_bit(mask, (uint32_t)t);
            m->len = base;
        }
        uint32_t room;
        if (in_any(m))
            for (uint32_t id = 0; id < v->n_tokens; id++)
                set_bit(mask, id);
        else if (in_free_text(m))
            free_text_mask(m, mask);
        else if (all_in_string_body(m, &room))
            string_mask(m, room, mask);
        else if (m->w[2] > 0)
            trie_mask(m, mask);
    }
    uint32_t count = 0;
    for (uint32_t w = 0; w < v->mask_words; w++)
        count += (uint32_t)__builtin_popcount(mask[w]);
    return count;
}

bool kt_grammar_matcher_can_accept(struct kt_grammar_matcher *m, int32_t token)
{
    const struct kt_grammar_vocab *v = m->v;
    if (token < 0 || (uint32_t)token >= v->n_tokens || m->ended || m->oom)
        return false;
    if (is_eog(v, token))
        return m->w[1] != 0;
    size_t base = m->len, cur = 0;
    if (v->special[token]) {
        bool ok = in_any(m);
        for (size_t k = 0; k < m->g->n_tokens && !ok; k++)
            ok = m->g->tokens[k] == token;
        ok = ok && step_state(m, 0, 256 + token) != SIZE_MAX;
        m->len = base;
        return ok;
    }
    const unsigned char *s = (const unsigned char *)v->bytes[token];
    for (uint32_t i = 0; cur != SIZE_MAX && i < v->lens[token]; i++)
        cur = step_state(m, cur, s[i]);
    m->len = base;
    return cur != SIZE_MAX;
}
