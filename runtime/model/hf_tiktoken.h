/*
 * hf_tiktoken.h - Kimi's tiktoken.model (one line per token: the base64 of
 * its bytes, a space, its rank) read as a byte-level BPE vocabulary: every
 * rank's bytes as GPT-2 byte-level text (the form tokenizer.ggml.tokens holds)
 * and the merges BPE over the ranks implies, in llama.cpp's converter's order.
 * hf_tokenizer.c makes the tokenizer.ggml.* keys of them.
 *
 * The file must list ranks 0, 1, 2, ... one a line in that order (as
 * tiktoken writes it; empty lines are skipped), each token 1 to
 * KT_TIKTOKEN_MAX_TOKEN_BYTES bytes, no two the same: anything else (bad
 * base64, a duplicate, missing or out-of-order rank, a rank past 2^30, an
 * overlong line, a truncated last line) is refused naming the file and line.
 * Memory is a small multiple of the file's size; time is linear in it except
 * the merges, at most KT_TIKTOKEN_MAX_TOKEN_BYTES times the file's size.
 */
#ifndef KT_HF_TIKTOKEN_H
#define KT_HF_TIKTOKEN_H

#include <stddef.h>
#include <stdint.h>

#include "status.h"

#define KT_TIKTOKEN_MAX_TOKEN_BYTES 1024u

struct kt_tiktoken {
    uint32_t n_ranks;
    char **texts;      /* [n_ranks] rank r's bytes as byte-level text ("Ġthe"), NUL-terminated, malloc'd */
    uint32_t n_merges;
    char **merges;     /* [n_merges] "left right" (byte-level), in the order of the ranks they make */
};

/* len bytes of tiktoken.model; label names the file in messages. */
kt_status kt_tiktoken_parse(const char *text, size_t len, const char *label, struct kt_tiktoken *out, kt_err *err);

/* Frees what parse made (texts or merges set to NULL by a caller that took them are skipped). */
void kt_tiktoken_free(struct kt_tiktoken *t);

#endif
