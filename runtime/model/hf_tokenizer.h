/*
 * hf_tokenizer.h - a checkpoint's tokenizer files (tokenizer.json, with
 * tokenizer_config.json when present) read as the tokenizer.ggml.* GGUF keys
 * kt's tokenizer (runtime/text/tokenizer.c) and chat templates read, so a
 * directory tokenizes exactly as a GGUF file of the same vocabulary does.
 *
 * tokenizer.json must hold a byte-level BPE model: its vocab (token text ->
 * id) and added_tokens (special ones become control tokens, the others
 * user-defined) make tokenizer.ggml.tokens and token_type, ids missing from
 * both become unused "[PAD<id>]" tokens; its merges (as "a b" strings or
 * ["a", "b"] pairs) tokenizer.ggml.merges in rank order.  The pre-tokenizer
 * is the family's (tokenizer.ggml.pre), named by config.json's model_type:
 * deepseek_v3 -> "deepseek-v3", kimi_k2 / kimi_k25 -> "kimi-k2".
 * tokenizer_config.json gives bos/eos (their texts, looked up), add_bos_token
 * and chat_template.  Anything else (another model type, a WordPiece or
 * Unigram model, Kimi's tiktoken.model without a tokenizer.json, an id past
 * 2^30, one id given two texts) is refused naming the file and field.
 */
#ifndef KT_HF_TOKENIZER_H
#define KT_HF_TOKENIZER_H

#include <stddef.h>

#include "status.h"

struct kt_gguf;

/* tokenizer.json's text (and tokenizer_config.json's, or NULL) with the
 * pre-tokenizer name pre, as a metadata-only GGUF (kt_gguf_from_parts); label
 * names the directory in messages. */
kt_status kt_hf_tokenizer_parse(const char *tokenizer_json, size_t tokenizer_len, const char *config_json,
                                size_t config_len, const char *pre, const char *label, struct kt_gguf **out,
                                kt_err *err);

/* DIR's tokenizer.json, tokenizer_config.json (optional) and config.json's
 * model_type (for the pre-tokenizer), parsed as above. */
kt_status kt_hf_tokenizer_read(const char *dir, struct kt_gguf **out, kt_err *err);

#endif
