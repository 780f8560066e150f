/*
 * tokenizer.h - the byte-level BPE tokenizer of DeepSeek-V3/R1 and Kimi-K2,
 * built from a GGUF file's tokenizer.* metadata: text -> token ids and back.
 *
 * kt tokenizes the way each model's own tokenizer does (DeepSeek-V3: the
 * Hugging Face tokenizer.json; Kimi-K2: Moonshot's tiktoken wrapper), not the
 * way llama.cpp approximates it; tokenizer.c lists every difference.  A
 * tokenizer is immutable once created, so any number of threads may use it at
 * once.  Nothing here prints, exits, or fails on any input text: invalid UTF-8
 * is tokenized as U+FFFD, one per maximal ill-formed subpart.
 */
#ifndef KT_TOKENIZER_H
#define KT_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gguf.h"
#include "status.h"

struct kt_tokenizer;

/* tokenizer.ggml.token_type values. */
enum kt_tok_type {
    KT_TOK_UNDEFINED = 0, /* treated as NORMAL */
    KT_TOK_NORMAL = 1,
    KT_TOK_UNKNOWN = 2,
    KT_TOK_CONTROL = 3,      /* matched in text only with parse_special; rendered only on request */
    KT_TOK_USER_DEFINED = 4, /* always matched in text, always rendered */
    KT_TOK_UNUSED = 5,       /* never produced by tokenizing; renders as nothing */
    KT_TOK_BYTE = 6,
};

/* Reads tokenizer.ggml.{model,pre,tokens,token_type,merges,*_token_id,
 * add_bos_token,add_eos_token}.  model must be "gpt2" (byte-level BPE); pre
 * one of "deepseek-v3", "kimi-k2" or "gpt2"/"default" (GPT-2's pattern), else
 * KT_ERR_UNSUPPORTED naming it.  Without merges, merging follows tiktoken:
 * a pair merges iff its concatenation is a token, lowest id first.  The file
 * may be closed afterwards. */
kt_status kt_tokenizer_create(const struct kt_gguf *g, struct kt_tokenizer **out, kt_err *err);
void kt_tokenizer_destroy(struct kt_tokenizer *t);

int32_t kt_tokenizer_n_vocab(const struct kt_tokenizer *t);
int32_t kt_tokenizer_bos(const struct kt_tokenizer *t); /* -1 if none */
int32_t kt_tokenizer_eos(const struct kt_tokenizer *t); /* -1 if none */
bool kt_tokenizer_add_bos(const struct kt_tokenizer *t);
const char *kt_tokenizer_pre(const struct kt_tokenizer *t); /* tokenizer.ggml.pre as read */

/* Tokenizes len bytes of text into a malloc'd array (*ids, *n; free() it;
 * NULL with *n = 0 for no tokens).  add_special: prepend BOS / append EOS as
 * add_bos_token / add_eos_token say.  parse_special: CONTROL and UNKNOWN
 * token texts in the text become those tokens (USER_DEFINED ones always do);
 * both models' own tokenizers behave as with parse_special = true.
 * Fails only for KT_ERR_NOMEM or bad arguments. */
kt_status kt_tokenize(const struct kt_tokenizer *t, const char *text, size_t len, bool add_special,
                      bool parse_special, int32_t **ids, size_t *n, kt_err *err);

/* ---- tokens ------------------------------------------------------------------- */

enum kt_tok_type kt_token_type(const struct kt_tokenizer *t, int32_t id); /* UNUSED if out of range */
bool kt_token_is_eog(const struct kt_tokenizer *t, int32_t id);         /* generation stops on it */
/* All end-of-generation ids, ascending. */
const int32_t *kt_tokenizer_eog_ids(const struct kt_tokenizer *t, size_t *n);

/* The token's text as stored in the GGUF file (byte-level form, e.g. "Ġthe"):
 * not NUL-terminated; NULL if id is out of range. */
const char *kt_token_text(const struct kt_tokenizer *t, int32_t id, size_t *len);

/* Id of the token whose GGUF text is exactly text[0..len), or -1. */
int32_t kt_token_find(const struct kt_tokenizer *t, const char *text, size_t len);

/* The bytes a token stands for: byte-level decoded for normal tokens (may be
 * part of a UTF-8 sequence), the literal text for CONTROL, USER_DEFINED and
 * UNKNOWN tokens, nothing for UNUSED ones.  NULL if out of range. */
const char *kt_token_bytes(const struct kt_tokenizer *t, int32_t id, size_t *len);

/* Copies the token's bytes to buf (at most cap) and returns their full count,
 * like snprintf without the NUL.  CONTROL and UNKNOWN tokens render only when
 * special is true (0 otherwise); USER_DEFINED always. */
size_t kt_token_piece(const struct kt_tokenizer *t, int32_t id, bool special, char *buf, size_t cap);

/* Longest kt_token_bytes of any token. */
size_t kt_tokenizer_max_piece(const struct kt_tokenizer *t);

/* ---- detokenizing ---------------------------------------------------------------- */

/* Decodes a whole sequence to valid UTF-8 (ill-formed parts become U+FFFD),
 * malloc'd and NUL-terminated; the models' decode(ids) with errors="replace". */
kt_status kt_detokenize(const struct kt_tokenizer *t, const int32_t *ids, size_t n, bool special, char **text,
                        size_t *len, kt_err *err);

/* Streaming decoder of one sequence: emits only complete UTF-8 characters,
 * holding back the start of a character whose bytes a later token completes.
 * Zero-initialize it (or use KT_DETOK_INIT); no other setup or cleanup. */
struct kt_detok {
    unsigned char held[4]; /* a well-formed but incomplete UTF-8 prefix */
    unsigned n_held;       /* 0..3 */
};
#define KT_DETOK_INIT {{0}, 0}

/* Most bytes one kt_detok_push or kt_detok_flush can write. */
size_t kt_detok_max_bytes(const struct kt_tokenizer *t);

/* Appends token id's text to the stream and writes the UTF-8 now complete to
 * out (*written bytes, no NUL).  Bytes that can never become valid come out
 * as U+FFFD at once.  KT_ERR_INVALID (nothing consumed) if id is out of range
 * or cap < kt_detok_max_bytes(t). */
kt_status kt_detok_push(const struct kt_tokenizer *t, struct kt_detok *d, int32_t id, bool special, char *out,
                        size_t cap, size_t *written, kt_err *err);

/* Ends the stream: a held incomplete character becomes one U+FFFD.  out must
 * hold 3 bytes; returns bytes written.  The decoder is reset for reuse. */
size_t kt_detok_flush(struct kt_detok *d, char *out);

#endif
