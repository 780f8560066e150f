/*
 * hf_tiktoken.c - tiktoken.model as byte-level tokens and merges (see
 * hf_tiktoken.h).
 *
 * Tokens: rank r's bytes, each byte mapped to one code point by GPT-2's
 * bytes_to_unicode table (printable Latin-1 bytes to themselves, the other 68
 * in byte order to U+0100..U+0143), as llama.cpp's converter writes Kimi's
 * tokens (QwenModel.token_bytes_to_string) and kt's tokenizer reads them.
 *
 * Merges, the rule confirmed in llama.cpp's convert_hf_to_gguf.py
 * (DeepseekV2Model.set_vocab, branch tokpre == "kimi-k2", and the same code
 * for Kimi-Linear): for every token of two or more bytes, in the ranks'
 * order, QwenModel.bpe(mergeable_ranks, token, max_rank=rank) starts from the
 * token's single bytes and repeatedly merges the adjacent pair whose
 * concatenation has the lowest rank (the leftmost such pair: a strictly
 * lower rank replaces the best), stopping when no pair's concatenation is a
 * token or the lowest rank is >= the token's own rank.  If exactly two parts
 * remain, "A B" (both byte-level) is the next merge; otherwise (three or more:
 * the token is not reachable by merges) none is written.  The converter walks
 * the ranks in the file's line order; kt requires that order to be the
 * ranks' own, so the two agree.
 *
 * Never keeps state between calls; everything it allocates is sized by the
 * file (lines, bytes).
 */
#include "hf_tiktoken.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#define MAX_RANK (1u << 30) /* ranks are < 2^30, as token ids are everywhere in kt */
/* base64 of the longest token, one space, ten digits, a CR and some slack for spaces */
#define MAX_LINE (4 * ((KT_TIKTOKEN_MAX_TOKEN_BYTES + 2) / 3) + 32)

/* ---- base64 and byte-level text ------------------------------------------------------------ */

static int b64_value(unsigned char c)
{
    if (c >= 'A' && c <= 'Z')
        return c - 'A';
    if (c >= 'a' && c <= 'z')
        return c - 'a' + 26;
    if (c >= '0' && c <= '9')
        return c - '0' + 52;
    if (c == '+')
        return 62;
    if (c == '/')
        return 63;
    return -1;
}

/* Standard base64 with padding (what tiktoken writes); the bytes into out, their count, or -1. */
static long b64_decode(const char *s, size_t n, unsigned char *out)
{
    if (n == 0 || n % 4 != 0)
        return -1;
    size_t pad = s[n - 1] == '=' ? (s[n - 2] == '=' ? 2 : 1) : 0;
    long o = 0;
    for (size_t i = 0; i < n; i += 4) {
        int v[4];
        for (int k = 0; k < 4; k++) {
            const bool padding = i + 4 == n && k >= 4 - (int)pad;
            v[k] = padding ? 0 : b64_value((unsigned char)s[i + k]);
            if (v[k] < 0)
                return -1;
        }
        const uint32_t w = (uint32_t)v[0] << 18 | (uint32_t)v[1] << 12 | (uint32_t)v[2] << 6 | (uint32_t)v[3];
        const int bytes = i + 4 == n ? 3 - (int)pad : 3;
        for (int k = 0; k < bytes; k++)
            out[o++] = (unsigned char)(w >> (16 - 8 * k));
        /* the bits padding drops must be zero, so one text means one token */
        if (i + 4 == n && pad > 0 && (w & ((1u << (8 * pad)) - 1)) != 0)
            return -1;
    }
    return o;
}

/* GPT-2's bytes_to_unicode: the code point byte b stands for. */
static uint32_t byte_code_point(unsigned char b)
{
    if ((b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE)
        return b;
    if (b <= 0x20)
        return 0x100 + b;
    if (b <= 0xA0)
        return 0x100 + 0x21 + (b - 0x7F);
    return 0x143; /* 0xAD */
}

/* n bytes as byte-level text at out (room for 2n + 1); its length. */
static size_t byte_level(const unsigned char *p, size_t n, char *out)
{
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        const uint32_t c = byte_code_point(p[i]);
        if (c < 0x80) {
            out[o++] = (char)c;
        } else {
            out[o++] = (char)(0xC0 | (c >> 6));
            out[o++] = (char)(0x80 | (c & 0x3F));
        }
    }
    out[o] = '\0';
    return o;
}

/* ---- the ranks: bytes in one arena, a hash from bytes to rank ------------------------------- */

struct ranks {
    unsigned char *bytes; /* every token's bytes, rank after rank */
    size_t *start;        /* [n + 1] rank r is bytes[start[r] .. start[r + 1]) */
    uint32_t n;
    uint32_t *slots;      /* [n_slots] rank + 1, 0 empty; open addressing */
    size_t n_slots;
};

static uint64_t hash_bytes(const unsigned char *p, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

/* The rank whose bytes are p[0..n), or -1; *slot_out: where it is or would go. */
static int64_t rank_of(const struct ranks *r, const unsigned char *p, size_t n, size_t *slot_out)
{
    const size_t mask = r->n_slots - 1;
    size_t k = (size_t)hash_bytes(p, n) & mask;
    for (; r->slots[k] != 0; k = (k + 1) & mask) {
        const uint32_t q = r->slots[k] - 1;
        if (r->start[q + 1] - r->start[q] == n && memcmp(r->bytes + r->start[q], p, n) == 0) {
            if (slot_out)
                *slot_out = k;
            return q;
        }
    }
    if (slot_out)
        *slot_out = k;
    return -1;
}

static void ranks_free(struct ranks *r)
{
    free(r->bytes), free(r->start), free(r->slots);
}

/* One line's fields: [b, b + nb) the base64, [d, d + nd) the rank's digits; false if not "B64 RANK". */
static bool split_line(const char *line, size_t n, const char **b, size_t *nb, const char **d, size_t *nd)
{
    size_t i = 0;
    while (i < n && line[i] != ' ' && line[i] != '\t')
        i++;
    *b = line, *nb = i;
    while (i < n && (line[i] == ' ' || line[i] == '\t'))
        i++;
    *d = line + i;
    const size_t d0 = i;
    while (i < n && line[i] >= '0' && line[i] <= '9')
        i++;
    *nd = i - d0;
    while (i < n && (line[i] == ' ' || line[i] == '\t'))
        i++;
    return *nb > 0 && *nd > 0 && i == n;
}

static kt_status read_ranks(const char *text, size_t len, const char *label, struct ranks *r, kt_err *err)
{
    size_t cap = 1024; /* grows with the ranks read, each at least 7 bytes of the file ("AA== 0\n") */
    r->start = malloc((cap + 1) * sizeof *r->start);
    r->bytes = malloc(len / 4 * 3 + 3);
    if (!r->start || !r->bytes)
        return kt_err_set(err, KT_ERR_NOMEM, "%s: out of memory for %zu bytes", label, len);
    r->start[0] = 0;
    size_t line_no = 0, used = 0;
    for (size_t at = 0; at < len;) {
        const char *nl = memchr(text + at, '\n', len - at);
        const size_t end = nl ? (size_t)(nl - text) : len;
        const char *line = text + at;
        size_t n = end - at;
        at = end + 1;
        line_no++;
        if (n > 0 && line[n - 1] == '\r')
            n--;
        if (n == 0)
            continue; /* tiktoken skips empty lines */
        if (n > MAX_LINE)
            return kt_err_set(err, KT_ERR_FORMAT, "%s:%zu: a line of %zu bytes: a token is the base64 of at most %u "
                              "bytes and a rank", label, line_no, n, KT_TIKTOKEN_MAX_TOKEN_BYTES);
        const char *b, *d;
        size_t nb, nd;
        if (!split_line(line, n, &b, &nb, &d, &nd))
            return kt_err_set(err, KT_ERR_FORMAT, "%s:%zu: not \"BASE64 RANK\"%s", label, line_no,
                              nl ? "" : " (the file ends in the middle of a line: truncated?)");
        uint64_t rank = 0;
        for (size_t i = 0; i < nd && rank < MAX_RANK; i++)
            rank = rank * 10 + (uint64_t)(d[i] - '0');
        if (rank >= MAX_RANK)
            return kt_err_set(err, KT_ERR_FORMAT, "%s:%zu: rank %.*s: ranks must be below 2^30", label, line_no,
                              (int)(nd < 24 ? nd : 24), d);
        if (rank != r->n)
            return kt_err_set(err, KT_ERR_FORMAT, "%s:%zu: rank %llu where rank %u belongs: %s", label, line_no,
                              (unsigned long long)rank, r->n,
                              rank < r->n ? "a rank given twice (ranks run 0, 1, 2, ... one a line)"
                                          : "ranks are missing (ranks run 0, 1, 2, ... one a line)");
        const long got = b64_decode(b, nb, r->bytes + used);
        if (got < 0)
            return kt_err_set(err, KT_ERR_FORMAT, "%s:%zu: \"%.*s\" is not base64%s", label, line_no,
                              (int)(nb < 40 ? nb : 40), b,
                              nl ? "" : " (the file ends in the middle of a line: truncated?)");
        if (got == 0 || got > (long)KT_TIKTOKEN_MAX_TOKEN_BYTES)
            return kt_err_set(err, KT_ERR_FORMAT, "%s:%zu: a token of %ld bytes (1 to %u)", label, line_no, got,
                              KT_TIKTOKEN_MAX_TOKEN_BYTES);
        used += (size_t)got;
        if (r->n == cap) {
            size_t *grown = realloc(r->start, (2 * cap + 1) * sizeof *r->start);
            if (!grown)
                return kt_err_set(err, KT_ERR_NOMEM, "%s: out of memory for %u ranks", label, r->n);
            r->start = grown;
            cap *= 2;
        }
        r->start[++r->n] = used;
    }
    if (r->n == 0)
        return kt_err_set(err, KT_ERR_FORMAT, "%s: no tokens", label);
    r->n_slots = 16;
    while (r->n_slots < 2 * (size_t)r->n)
        r->n_slots *= 2;
    if (!(r->slots = calloc(r->n_slots, sizeof *r->slots)))
        return kt_err_set(err, KT_ERR_NOMEM, "%s: out of memory for %u ranks", label, r->n);
    for (uint32_t q = 0; q < r->n; q++) {
        size_t slot;
        const int64_t other = rank_of(r, r->bytes + r->start[q], r->start[q + 1] - r->start[q], &slot);
        if (other >= 0)
            return kt_err_set(err, KT_ERR_FORMAT, "%s: rank %u has the bytes of rank %lld: every token must be "
                              "different", label, q, (long long)other);
        r->slots[slot] = q + 1;
    }
    return KT_OK;
}

/* ---- merges ---------------------------------------------------------------------------------- */

/* BPE over token q's bytes with the ranks below q (the rule in the file
 * comment); the split point when exactly two parts remain, else 0.  part_end[]
 * and pair_rank[] have room for the token's length. */
static size_t two_part_split(const struct ranks *r, uint32_t q, uint32_t *part_end, int64_t *pair_rank)
{
    const unsigned char *tok = r->bytes + r->start[q];
    const size_t n = r->start[q + 1] - r->start[q];
    size_t parts = n;
    for (size_t i = 0; i < n; i++)
        part_end[i] = (uint32_t)(i + 1);
    /* pair_rank[i]: rank of part i joined to part i + 1 (parts compacted to 0..parts-1), -1 none */
    for (size_t i = 0; i + 1 < parts; i++)
        pair_rank[i] = rank_of(r, tok + i, 2, NULL);
    for (;;) {
        size_t best = parts;
        for (size_t i = 0; i + 1 < parts; i++)
            if (pair_rank[i] >= 0 && (best == parts || pair_rank[i] < pair_rank[best]))
                best = i;
        if (best == parts || pair_rank[best] >= (int64_t)q)
            break;
        part_end[best] = part_end[best + 1];
        memmove(part_end + best + 1, part_end + best + 2, (parts - best - 2) * sizeof *part_end);
        if (parts >= best + 3) /* pairs right of the merged one move down; the pair it consumed goes */
            memmove(pair_rank + best + 1, pair_rank + best + 2, (parts - best - 3) * sizeof *pair_rank);
        parts--;
        for (size_t i = best > 0 ? best - 1 : 0; i <= best && i + 1 < parts; i++) {
            const size_t from = i > 0 ? part_end[i - 1] : 0;
            pair_rank[i] = rank_of(r, tok + from, part_end[i + 1] - from, NULL);
        }
    }
    return parts == 2 ? part_end[0] : 0;
}

static kt_status make_texts(const struct ranks *r, const char *label, struct kt_tiktoken *out, kt_err *err)
{
    out->texts = calloc(r->n, sizeof *out->texts);
    out->merges = calloc(r->n, sizeof *out->merges);
    uint32_t *part_end = malloc(KT_TIKTOKEN_MAX_TOKEN_BYTES * sizeof *part_end);
    int64_t *pair_rank = malloc(KT_TIKTOKEN_MAX_TOKEN_BYTES * sizeof *pair_rank);
    kt_status st = KT_OK;
    if (!out->texts || !out->merges || !part_end || !pair_rank) {
        st = kt_err_set(err, KT_ERR_NOMEM, "%s: out of memory for %u tokens", label, r->n);
        goto done;
    }
    out->n_ranks = r->n;
    for (uint32_t q = 0; q < r->n; q++) {
        const unsigned char *tok = r->bytes + r->start[q];
        const size_t n = r->start[q + 1] - r->start[q];
        if (!(out->texts[q] = malloc(2 * n + 1))) {
            st = kt_err_set(err, KT_ERR_NOMEM, "%s: out of memory", label);
            goto done;
        }
        byte_level(tok, n, out->texts[q]);
        const size_t split = n >= 2 ? two_part_split(r, q, part_end, pair_rank) : 0;
        if (split == 0)
            continue;
        char *m = malloc(2 * n + 2);
        if (!m) {
            st = kt_err_set(err, KT_ERR_NOMEM, "%s: out of memory", label);
            goto done;
        }
        const size_t left = byte_level(tok, split, m);
        m[left] = ' ';
        byte_level(tok + split, n - split, m + left + 1);
        out->merges[out->n_merges++] = m;
    }
done:
    free(part_end), free(pair_rank);
    return st;
}

kt_status kt_tiktoken_parse(const char *text, size_t len, const char *label, struct kt_tiktoken *out, kt_err *err)
{
    memset(out, 0, sizeof *out);
    struct ranks r = {0};
    kt_status st = read_ranks(text, len, label, &r, err);
    if (st == KT_OK)
        st = make_texts(&r, label, out, err);
    ranks_free(&r);
    if (st != KT_OK)
        kt_tiktoken_free(out);
    return st;
}

void kt_tiktoken_free(struct kt_tiktoken *t)
{
    if (!t)
        return;
    for (uint32_t i = 0; t->texts && i < t->n_ranks; i++)
        free(t->texts[i]);
    for (uint32_t i = 0; t->merges && i < t->n_merges; i++)
        free(t->merges[i]);
    free(t->texts), free(t->merges);
    memset(t, 0, sizeof *t);
}
