/*
 * hf_tokenizer.h - a checkpoint's tokenizer files read as the tokenizer.ggml.*
 * GGUF keys kt's tokenizer (runtime/text/tokenizer.c) and chat templates
 * read, so a directory tokenizes exactly as a GGUF file of the same
 * vocabulary does.  Two kinds:
 *
 * tokenizer.json (DeepSeek) must hold a byte-level BPE model: its vocab
 * (token text -> id) and added_tokens (special ones become control tokens,
 * the others user-defined) make tokenizer.ggml.tokens and token_type, ids
 * missing from both become unused "[PAD<id>]" tokens; its merges (as "a b"
 * strings or ["a", "b"] pairs) tokenizer.ggml.merges in rank order.
 *
 * tiktoken.model (Kimi, no tokenizer.json; hf_tiktoken.h reads its lines):
 * rank r is token r, NORMAL, as GPT-2 byte-level text; the 256 ids after the
 * ranks are Kimi's special tokens, all CONTROL, named by
 * tokenizer_config.json's added_tokens_decoder or <|reserved_token_ID|>
 * (tokenization_kimi.py), cut at config.json's vocab_size, and ids past them
 * up to vocab_size unused "[PAD<id>]", as llama.cpp's converter writes them;
 * merges derived from the ranks (hf_tiktoken.c says how); pre "kimi-k2".
 *
 * The pre-tokenizer is the family's (tokenizer.ggml.pre), named by
 * config.json's model_type: deepseek_v3 -> "deepseek-v3", kimi_k2 / kimi_k25
 * -> "kimi-k2".  tokenizer_config.json gives bos/eos/pad (their texts, looked
 * up), add_bos_token and chat_template (a string, or a list of {name,
 * template}: the "default" one); chat_template.jinja beside it, when there,
 * replaces that template (as transformers does) as tokenizer.chat_template.
 * Anything else (another model type, a WordPiece or Unigram model, an id past
 * 2^30, one id given two texts, a malformed tiktoken.model) is refused
 * naming the file and field or line.
 */
#ifndef KT_HF_TOKENIZER_H
#define KT_HF_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "status.h"

struct kt_gguf;

/* tokenizer.json's text (and tokenizer_config.json's, or NULL) with the
 * pre-tokenizer name pre, as a metadata-only GGUF (kt_gguf_from_parts); label
 * names the directory in messages. */
kt_status kt_hf_tokenizer_parse(const char *tokenizer_json, size_t tokenizer_len, const char *config_json,
                                size_t config_len, const char *pre, const char *label, struct kt_gguf **out,
                                kt_err *err);

/* tiktoken.model's text (and tokenizer_config.json's, or NULL) as above, with
 * config.json's vocab_size (0: not given, the ranks and 256 specials). */
kt_status kt_hf_tokenizer_parse_tiktoken(const char *model, size_t model_len, const char *config_json,
                                         size_t config_len, uint32_t vocab_size, const char *label,
                                         struct kt_gguf **out, kt_err *err);

/* DIR's tokenizer.json or else tiktoken.model, tokenizer_config.json and
 * chat_template.jinja (both optional) and config.json's model_type (for the
 * pre-tokenizer) and vocab_size, parsed as above. */
kt_status kt_hf_tokenizer_read(const char *dir, struct kt_gguf **out, kt_err *err);

#endif
