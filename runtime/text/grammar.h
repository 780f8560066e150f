/*
 * grammar.h - constrained decoding: a grammar over bytes and special tokens,
 * run as a pushdown automaton, and per decoding step the set of token ids
 * that keep the output a valid prefix of it (the token mask).
 *
 * A kt_grammar is built once per request from nodes (JSON values, literals,
 * sequences, alternatives, repeats, special tokens; json_schema.h compiles a
 * JSON Schema into them) and is immutable afterwards.  A kt_grammar_vocab is
 * built once per tokenizer: every text token's bytes in a trie, plus which
 * tokens are special (never matched as text) and which end generation.  A
 * kt_grammar_matcher is one sequence's position in the grammar: a set of
 * automaton stacks (alternatives that agree on the output so far are followed
 * in parallel, so anyOf needs no lookahead).  Matchers belong to one thread
 * at a time; grammars and vocabularies may be shared by any number.
 *
 * The mask holds a token iff all of its bytes (or, for a special token, the
 * token itself) can follow the output so far; end-of-generation tokens iff
 * the output is a complete sentence of the grammar.  JSON output never has
 * whitespace after the top-level value, at most KT_GRAMMAR_MAX_WS whitespace
 * bytes in a row inside it, integers of at most 15 digits, fractions of at
 * most 15 and exponents of at most 2 (so every number parses exactly), no
 * \u escape of a surrogate or NUL, and only valid UTF-8.  Nesting deeper
 * than KT_GRAMMAR_MAX_DEPTH frames is not offered.
 */
#ifndef KT_GRAMMAR_H
#define KT_GRAMMAR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "status.h"
#include "tokenizer.h"

#define KT_GRAMMAR_MAX_DEPTH 64   /* automaton frames on one stack */
#define KT_GRAMMAR_MAX_STACKS 64  /* alternatives followed at once */
#define KT_GRAMMAR_MAX_WS 20      /* whitespace bytes in a row inside JSON */
#define KT_GRAMMAR_UNBOUNDED UINT32_MAX

struct kt_grammar;

kt_status kt_grammar_create(struct kt_grammar **out, kt_err *err);
void kt_grammar_destroy(struct kt_grammar *g);

/* ---- nodes: each builder returns the new node's id in *node ---------------------- */

/* Exactly these bytes. */
kt_status kt_grammar_literal(struct kt_grammar *g, const char *bytes, size_t len, uint32_t *node, kt_err *err);
/* One of n byte strings (JSON enum / const values, serialized). */
kt_status kt_grammar_literals(struct kt_grammar *g, const char *const *texts, const size_t *lens, size_t n,
                              uint32_t *node, kt_err *err);
/* The special token id, as one token (never as its text). */
kt_status kt_grammar_token(struct kt_grammar *g, int32_t token, uint32_t *node, kt_err *err);
/* items in order; one of the items; item repeated min..max times (no separator). */
kt_status kt_grammar_seq(struct kt_grammar *g, const uint32_t *items, size_t n, uint32_t *node, kt_err *err);
kt_status kt_grammar_alt(struct kt_grammar *g, const uint32_t *items, size_t n, uint32_t *node, kt_err *err);
kt_status kt_grammar_repeat(struct kt_grammar *g, uint32_t item, uint32_t min, uint32_t max, uint32_t *node,
                            kt_err *err);
/* A node defined later (recursion, $ref): kt_grammar_define points it at target. */
kt_status kt_grammar_forward(struct kt_grammar *g, uint32_t *node, kt_err *err);
kt_status kt_grammar_define(struct kt_grammar *g, uint32_t forward, uint32_t target, kt_err *err);

/* Any text of text tokens (no special token) in which the bytes avoid (at
 * most 64; len 0: none) never appear, ending whenever what follows can
 * begin: a reasoning block before its closing special token, whose text
 * must not end it early as text. */
kt_status kt_grammar_text(struct kt_grammar *g, const char *avoid, size_t len, uint32_t *node, kt_err *err);
/* The same, of at most max_tokens tokens (KT_GRAMMAR_UNBOUNDED: any): once
 * they are spent only what follows the text can come (a thinking budget: the
 * closing token).  Counted per token accepted while the output is in the text. */
kt_status kt_grammar_text_budget(struct kt_grammar *g, const char *avoid, size_t len, uint32_t max_tokens,
                                 uint32_t *node, kt_err *err);
/* Any tokens at all, special ones included, ending anywhere (the unconstrained
 * rest after a bounded reasoning block). */
kt_status kt_grammar_any(struct kt_grammar *g, uint32_t *node, kt_err *err);

/* JSON values.  Strings count characters (code points; an escape is one). */
kt_status kt_grammar_json_string(struct kt_grammar *g, uint32_t min_chars, uint32_t max_chars, uint32_t *node,
                                 kt_err *err);
/* A string whose value matches pattern (a regex: the subset grammar.c's
 * "patterns" section lists; unanchored sides match anything, as JSON Schema
 * says).  KT_ERR_UNSUPPORTED / KT_ERR_INVALID naming the character at fault. */
kt_status kt_grammar_json_pattern_string(struct kt_grammar *g, const char *pattern, size_t len, uint32_t *node,
                                         kt_err *err);
/* Raw text (not a JSON string) matching pattern whole (vLLM's guided_regex):
 * the same regex subset, anchored at both ends whatever it says. */
kt_status kt_grammar_regex(struct kt_grammar *g, const char *pattern, size_t len, uint32_t *node, kt_err *err);
enum kt_grammar_number {
    KT_GRAMMAR_NUMBER,  /* JSON number */
    KT_GRAMMAR_INTEGER, /* -?(0|[1-9][0-9]*) */
    KT_GRAMMAR_DIGITS,  /* 0|[1-9][0-9]* (not JSON-typed: tool-call indices) */
};
kt_status kt_grammar_json_number(struct kt_grammar *g, enum kt_grammar_number kind, uint32_t *node, kt_err *err);
kt_status kt_grammar_json_array(struct kt_grammar *g, uint32_t item, uint32_t min_items, uint32_t max_items,
                                uint32_t *node, kt_err *err);
struct kt_grammar_property {
    const char *name; /* the key, UTF-8 (escaped as JSON needs) */
    size_t name_len;
    uint32_t value;   /* node */
    bool required;
};
/* An object with these properties, in this order (optional ones may be left
 * out), and no others.  At most 256 properties; names unique. */
kt_status kt_grammar_json_object(struct kt_grammar *g, const struct kt_grammar_property *props, size_t n,
                                 uint32_t *node, kt_err *err);
/* An object with any string keys, every value a `value`. */
kt_status kt_grammar_json_map(struct kt_grammar *g, uint32_t value, uint32_t *node, kt_err *err);

/* The sentence: the root node.  Checks every forward node was defined. */
kt_status kt_grammar_set_root(struct kt_grammar *g, uint32_t node, kt_err *err);

/* ---- vocabularies ------------------------------------------------------------------ */

struct kt_grammar_vocab;

/* n_tokens tokens: bytes[i] (lens[i] bytes) of token i; special[i]: matched
 * only by kt_grammar_token nodes (CONTROL, USER_DEFINED, ... tokens), never
 * as text; eog: the end-of-generation ids.  Masks are n_mask >= n_tokens bits
 * wide (a model may pad its vocabulary; the padding is never allowed). */
kt_status kt_grammar_vocab_create(const char *const *bytes, const size_t *lens, const bool *special,
                                  uint32_t n_tokens, uint32_t n_mask, const int32_t *eog, size_t n_eog,
                                  struct kt_grammar_vocab **out, kt_err *err);
/* The tokenizer's tokens: NORMAL, BYTE and UNDEFINED ones as text (their
 * decoded bytes), the others special. */
kt_status kt_grammar_vocab_from_tokenizer(const struct kt_tokenizer *t, uint32_t n_mask,
                                          struct kt_grammar_vocab **out, kt_err *err);
void kt_grammar_vocab_destroy(struct kt_grammar_vocab *v);
uint32_t kt_grammar_vocab_mask_words(const struct kt_grammar_vocab *v); /* uint32_t words of a mask */

/* ---- matching ------------------------------------------------------------------------ */

struct kt_grammar_matcher;

/* At the start of the root.  g and v must outlive the matcher. */
kt_status kt_grammar_matcher_create(const struct kt_grammar *g, const struct kt_grammar_vocab *v,
                                    struct kt_grammar_matcher **out, kt_err *err);
void kt_grammar_matcher_destroy(struct kt_grammar_matcher *m);

/* Writes the mask (kt_grammar_vocab_mask_words words; bit id%32 of word
 * id/32) for the next token.  Returns the number of tokens allowed. */
uint32_t kt_grammar_matcher_fill_mask(struct kt_grammar_matcher *m, uint32_t *mask);

/* Advances by a token (KT_ERR_INVALID, state unchanged, if the mask would
 * not hold it); an end-of-generation token ends the sentence. */
kt_status kt_grammar_matcher_accept_token(struct kt_grammar_matcher *m, int32_t token, kt_err *err);
/* Whether accept_token would take the token, one token at a time, without the
 * mask's shortcuts (the definition the masks are tested against). */
bool kt_grammar_matcher_can_accept(struct kt_grammar_matcher *m, int32_t token);
/* Advances by bytes of text (tests); false (state unchanged) if they do not fit. */
bool kt_grammar_matcher_accept_bytes(struct kt_grammar_matcher *m, const char *bytes, size_t len);

/* The output so far is a whole sentence (end-of-generation is allowed). */
bool kt_grammar_matcher_complete(const struct kt_grammar_matcher *m);
/* Nothing but end-of-generation can follow (or it was accepted): stop. */
bool kt_grammar_matcher_closed(const struct kt_grammar_matcher *m);

#endif
