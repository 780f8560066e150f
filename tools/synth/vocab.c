/*
 * vocab.c - builds the small byte-level BPE vocabulary kt-synth writes into
 * its GGUF files, and writes it with the tokenizer.* keys llama.cpp's
 * converters produce for DeepSeek-V3 and Kimi-K2.
 *
 * The embedded text is split the way the family's pre-tokenizer splits, each
 * chunk is taken as bytes, and classic BPE training merges the most frequent
 * adjacent pair (ties: the pair whose left, then right, token bytes sort
 * first) until n_merges merges exist or no pair occurs twice.  A merge whose
 * result already exists as a token is never recorded, so token texts stay
 * unique and every merged token sits above both of its parts.
 *
 * This file must never depend on anything but the embedded text and the
 * arguments: the same call gives the same vocabulary on every machine.
 */
#include "vocab.h"

#include <stdlib.h>
#include <string.h>

#include "corpus.h"
#include "hf_tiktoken.h"
#include "templates.h"

#define MAX_MERGES 100000u

/* ---- Unicode classes ---------------------------------------------------------- */

/* Flags of one code point.  UPPER = Lu/Lt/Lm/Lo and LOWER = Ll/Lm/Lo, the two
 * letter classes of Kimi's pattern before Han is removed. */
enum {
    CP_LETTER = 1u << 0,
    CP_UPPER = 1u << 1,
    CP_LOWER = 1u << 2,
    CP_MARK = 1u << 3,
    CP_NUMBER = 1u << 4,
    CP_PUNCT_SYMBOL = 1u << 5, /* \p{P} or \p{S} */
    CP_SPACE = 1u << 6,        /* White_Space */
    CP_HAN = 1u << 7,          /* Script=Han */
    CP_CASE_EVEN = 1u << 8,    /* table only: even code points upper, odd lower */
    CP_CASE_ODD = 1u << 9,     /* table only: odd code points upper, even lower */
};

#define LU (CP_LETTER | CP_UPPER)
#define LL (CP_LETTER | CP_LOWER)
#define LO (CP_LETTER | CP_UPPER | CP_LOWER) /* Lo and Lm: in both letter classes */
#define ALT_EVEN (CP_LETTER | CP_CASE_EVEN)
#define ALT_ODD (CP_LETTER | CP_CASE_ODD)

struct cp_range {
    uint32_t lo, hi;
    uint16_t flags;
};

/* Non-ASCII ranges, sorted and disjoint.  Code points not listed are treated
 * as punctuation or symbols (emoji, arrows, box drawing, CJK punctuation). */
static const struct cp_range cp_ranges[] = {
    {0x0080, 0x0084, 0}, {0x0085, 0x0085, CP_SPACE}, {0x0086, 0x009F, 0}, {0x00A0, 0x00A0, CP_SPACE},
    {0x00AA, 0x00AA, LO}, {0x00AD, 0x00AD, 0}, {0x00B2, 0x00B3, CP_NUMBER}, {0x00B5, 0x00B5, LL},
    {0x00B9, 0x00B9, CP_NUMBER}, {0x00BA, 0x00BA, LO}, {0x00BC, 0x00BE, CP_NUMBER}, {0x00C0, 0x00D6, LU},
    {0x00D8, 0x00DE, LU}, {0x00DF, 0x00F6, LL}, {0x00F8, 0x00FF, LL}, {0x0100, 0x0137, ALT_EVEN},
    {0x0138, 0x0138, LL}, {0x0139, 0x0148, ALT_ODD}, {0x0149, 0x0149, LL}, {0x014A, 0x0177, ALT_EVEN},
    {0x0178, 0x0178, LU}, {0x0179, 0x017E, ALT_ODD}, {0x017F, 0x017F, LL}, {0x0180, 0x024F, LO},
    {0x0250, 0x02AF, LL}, {0x02B0, 0x02C1, LO}, {0x02C6, 0x02D1, LO}, {0x02E0, 0x02E4, LO},
    {0x0300, 0x036F, CP_MARK}, {0x0370, 0x0373, ALT_EVEN}, {0x0376, 0x0377, ALT_EVEN}, {0x037B, 0x037D, LL},
    {0x0386, 0x0386, LU}, {0x0388, 0x038F, LU}, {0x0390, 0x0390, LL}, {0x0391, 0x03AB, LU},
    {0x03AC, 0x03CE, LL}, {0x03CF, 0x03FF, LO}, {0x0400, 0x042F, LU}, {0x0430, 0x045F, LL},
    {0x0460, 0x0481, ALT_EVEN}, {0x0483, 0x0489, CP_MARK}, {0x048A, 0x052F, ALT_EVEN}, {0x0531, 0x0556, LU},
    {0x0561, 0x0587, LL}, {0x0591, 0x05BD, CP_MARK}, {0x05D0, 0x05EA, LO}, {0x0610, 0x061A, CP_MARK},
    {0x0620, 0x064A, LO}, {0x064B, 0x065F, CP_MARK}, {0x0660, 0x0669, CP_NUMBER}, {0x066E, 0x06D3, LO},
    {0x0900, 0x0903, CP_MARK}, {0x0904, 0x0939, LO}, {0x093A, 0x093C, CP_MARK}, {0x093D, 0x093D, LO},
    {0x093E, 0x094F, CP_MARK}, {0x0950, 0x0950, LO}, {0x0951, 0x0957, CP_MARK}, {0x0958, 0x0961, LO},
    {0x0962, 0x0963, CP_MARK}, {0x0966, 0x096F, CP_NUMBER}, {0x0971, 0x097F, LO}, {0x0E01, 0x0E30, LO},
    {0x0E31, 0x0E31, CP_MARK}, {0x0E32, 0x0E33, LO}, {0x0E34, 0x0E3A, CP_MARK}, {0x0E40, 0x0E46, LO},
    {0x0E47, 0x0E4E, CP_MARK}, {0x0E50, 0x0E59, CP_NUMBER}, {0x1100, 0x11FF, LO}, {0x1680, 0x1680, CP_SPACE},
    {0x1E00, 0x1EFF, ALT_EVEN}, {0x1F00, 0x1FBC, LO}, {0x2000, 0x200A, CP_SPACE}, {0x200B, 0x200F, 0},
    {0x2028, 0x2029, CP_SPACE}, {0x202A, 0x202E, 0}, {0x202F, 0x202F, CP_SPACE}, {0x205F, 0x205F, CP_SPACE},
    {0x2060, 0x206F, 0}, {0x2070, 0x2070, CP_NUMBER}, {0x2071, 0x2071, LL}, {0x2074, 0x2079, CP_NUMBER},
    {0x207F, 0x207F, LL}, {0x2080, 0x2089, CP_NUMBER}, {0x20D0, 0x20F0, CP_MARK}, {0x2150, 0x2189, CP_NUMBER},
    {0x2460, 0x249B, CP_NUMBER}, {0x24EA, 0x24FF, CP_NUMBER}, {0x2776, 0x2793, CP_NUMBER},
    {0x3000, 0x3000, CP_SPACE}, {0x3005, 0x3005, LO | CP_HAN}, {0x3006, 0x3006, LO},
    {0x3007, 0x3007, CP_NUMBER | CP_HAN}, {0x3021, 0x3029, CP_NUMBER | CP_HAN}, {0x302A, 0x302F, CP_MARK},
    {0x3031, 0x3035, LO}, {0x3038, 0x303A, CP_NUMBER | CP_HAN}, {0x303B, 0x303B, LO | CP_HAN},
    {0x303C, 0x303C, LO}, {0x3041, 0x3096, LO}, {0x3099, 0x309A, CP_MARK}, {0x309D, 0x309F, LO},
    {0x30A1, 0x30FA, LO}, {0x30FC, 0x30FF, LO}, {0x3105, 0x312F, LO}, {0x3131, 0x318E, LO},
    {0x31F0, 0x31FF, LO}, {0x3400, 0x4DBF, LO | CP_HAN}, {0x4E00, 0x9FFF, LO | CP_HAN}, {0xA000, 0xA48C, LO},
    {0xAC00, 0xD7A3, LO}, {0xD800, 0xF8FF, 0}, {0xF900, 0xFAFF, LO | CP_HAN}, {0xFB00, 0xFB06, LL},
    {0xFE00, 0xFE0F, CP_MARK}, {0xFE20, 0xFE2F, CP_MARK}, {0xFEFF, 0xFEFF, 0}, {0xFF10, 0xFF19, CP_NUMBER},
    {0xFF21, 0xFF3A, LU}, {0xFF41, 0xFF5A, LL}, {0xFF66, 0xFF9F, LO}, {0xFFA0, 0xFFDC, LO},
    {0xFFF9, 0xFFFB, 0}, {0x10400, 0x10427, LU}, {0x10428, 0x1044F, LL}, {0x1D400, 0x1D7CB, LO},
    {0x1D7CE, 0x1D7FF, CP_NUMBER}, {0x1F100, 0x1F10C, CP_NUMBER}, {0x20000, 0x3134F, LO | CP_HAN},
    {0xE0001, 0xE007F, 0}, {0xE0100, 0xE01EF, CP_MARK}, {0xF0000, 0x10FFFF, 0},
};

static unsigned cp_flags(uint32_t c)
{
    if (c < 0x80) {
        if (c >= 'A' && c <= 'Z')
            return LU;
        if (c >= 'a' && c <= 'z')
            return LL;
        if (c >= '0' && c <= '9')
            return CP_NUMBER;
        if (c == ' ' || (c >= '\t' && c <= '\r'))
            return CP_SPACE;
        if (c < 0x20 || c == 0x7F)
            return 0;
        return CP_PUNCT_SYMBOL;
    }
    size_t lo = 0, hi = sizeof cp_ranges / sizeof cp_ranges[0];
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (c < cp_ranges[mid].lo)
            hi = mid;
        else if (c > cp_ranges[mid].hi)
            lo = mid + 1;
        else {
            unsigned f = cp_ranges[mid].flags;
            if (f & (CP_CASE_EVEN | CP_CASE_ODD)) {
                bool upper = ((c & 1) == 0) == ((f & CP_CASE_EVEN) != 0);
                return upper ? LU : LL;
            }
            return f;
        }
    }
    return CP_PUNCT_SYMBOL;
}

/* ---- the text as code points ---------------------------------------------------- */

struct cptext {
    const char *text;
    uint32_t *cp;   /* [n] code points; an invalid byte decodes as U+FFFD */
    unsigned *fl;   /* [n] cp_flags of each */
    size_t *off;    /* [n + 1] byte offset of each code point, off[n] = bytes */
    size_t n;
    kt_synth_chunk_fn fn;
    void *ctx;
};

/* Length of the valid UTF-8 sequence at s (1..4), or 0 if it is not one. */
static size_t utf8_decode(const unsigned char *s, size_t avail, uint32_t *out)
{
    unsigned char b = s[0];
    size_t len;
    uint32_t c, min;
    if (b < 0x80) {
        *out = b;
        return 1;
    } else if (b >= 0xC2 && b <= 0xDF) {
        len = 2, c = b & 0x1F, min = 0x80;
    } else if (b >= 0xE0 && b <= 0xEF) {
        len = 3, c = b & 0x0F, min = 0x800;
    } else if (b >= 0xF0 && b <= 0xF4) {
        len = 4, c = b & 0x07, min = 0x10000;
    } else {
        return 0;
    }
    if (avail < len)
        return 0;
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80)
            return 0;
        c = (c << 6) | (s[i] & 0x3F);
    }
    if (c < min || c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF))
        return 0;
    *out = c;
    return len;
}

static kt_status cptext_init(struct cptext *t, const char *text, size_t bytes, kt_err *err)
{
    memset(t, 0, sizeof *t);
    t->text = text;
    t->cp = malloc((bytes + 1) * sizeof *t->cp);
    t->fl = malloc((bytes + 1) * sizeof *t->fl);
    t->off = malloc((bytes + 1) * sizeof *t->off);
    if (!t->cp || !t->fl || !t->off)
        return kt_err_set(err, KT_ERR_NOMEM, "pre-tokenizer: out of memory for %zu bytes of text", bytes);
    const unsigned char *s = (const unsigned char *)text;
    size_t i = 0;
    while (i < bytes) {
        uint32_t c;
        size_t len = utf8_decode(s + i, bytes - i, &c);
        if (len == 0)
            c = 0xFFFD, len = 1;
        t->cp[t->n] = c;
        t->fl[t->n] = cp_flags(c);
        t->off[t->n] = i;
        t->n++;
        i += len;
    }
    t->off[t->n] = bytes;
    return KT_OK;
}

static void cptext_free(struct cptext *t)
{
    free(t->cp);
    free(t->fl);
    free(t->off);
}

static void emit(const struct cptext *t, size_t a, size_t b)
{
    if (b > a)
        t->fn(t->text + t->off[a], t->off[b] - t->off[a], t->ctx);
}

static bool is_cr_lf(uint32_t c) { return c == '\r' || c == '\n'; }

/* \s*[\r\n]+ | \s+(?!\S) | \s+ at i (a space), within [i, end). */
static size_t match_spaces(const struct cptext *t, size_t i, size_t end)
{
    size_t j = i;
    while (j < end && (t->fl[j] & CP_SPACE))
        j++;
    for (size_t k = j; k > i; k--)
        if (is_cr_lf(t->cp[k - 1]))
            return k;
    if (j == end || j - i == 1)
        return j;
    return j - 1; /* leave the last space to lead the next word */
}

/* An "isolated" split pass: matches and the gaps between them are chunks,
 * each handed to next (or emitted when next is NULL). */
typedef size_t (*match_fn)(const struct cptext *t, size_t i, size_t end);
typedef void (*pass_fn)(const struct cptext *t, size_t a, size_t b);

static void split_isolated(const struct cptext *t, size_t a, size_t b, match_fn match, pass_fn next)
{
    size_t gap = a, i = a;
    while (i < b) {
        size_t e = match(t, i, b);
        if (e <= i) {
            i++;
            continue;
        }
        if (gap < i)
            next ? next(t, gap, i) : emit(t, gap, i);
        next ? next(t, i, e) : emit(t, i, e);
        i = gap = e;
    }
    if (gap < b)
        next ? next(t, gap, b) : emit(t, gap, b);
}

/* ---- deepseek-v3: \p{N}{1,3}, then [一-龥぀-ゟ゠-ヿ]+, then the word regex ------------ */

static size_t match_digits3(const struct cptext *t, size_t i, size_t end)
{
    size_t j = i;
    while (j < end && j < i + 3 && (t->fl[j] & CP_NUMBER))
        j++;
    return j;
}

static bool deepseek_cjk(uint32_t c)
{
    return (c >= 0x4E00 && c <= 0x9FA5) || (c >= 0x3040 && c <= 0x30FF);
}

static size_t match_deepseek_cjk(const struct cptext *t, size_t i, size_t end)
{
    size_t j = i;
    while (j < end && deepseek_cjk(t->cp[j]))
        j++;
    return j;
}

static bool ascii_alpha(uint32_t c) { return (c | 0x20) >= 'a' && (c | 0x20) <= 'z'; }

/* [!-/:-@[-`{-~][A-Za-z]+ | [^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+ | ␠?[\p{P}\p{S}]+[\r\n]* | spaces */
static size_t match_deepseek_word(const struct cptext *t, size_t i, size_t end)
{
    uint32_t c = t->cp[i];
    unsigned f = t->fl[i];
    size_t j;
    if (c < 0x80 && (f & CP_PUNCT_SYMBOL) && i + 1 < end && ascii_alpha(t->cp[i + 1])) {
        for (j = i + 1; j < end && ascii_alpha(t->cp[j]);)
            j++;
        return j;
    }
    j = i;
    if (!is_cr_lf(c) && !(f & (CP_LETTER | CP_PUNCT_SYMBOL)) && i + 1 < end &&
        (t->fl[i + 1] & (CP_LETTER | CP_MARK)))
        j = i + 1;
    if (t->fl[j] & (CP_LETTER | CP_MARK)) {
        while (j < end && (t->fl[j] & (CP_LETTER | CP_MARK)))
            j++;
        return j;
    }
    j = (c == ' ' && i + 1 < end && (t->fl[i + 1] & CP_PUNCT_SYMBOL)) ? i + 1 : i;
    if (t->fl[j] & CP_PUNCT_SYMBOL) {
        while (j < end && (t->fl[j] & CP_PUNCT_SYMBOL))
            j++;
        while (j < end && is_cr_lf(t->cp[j]))
            j++;
        return j;
    }
    if (f & CP_SPACE)
        return match_spaces(t, i, end);
    return i;
}

static void deepseek_pass3(const struct cptext *t, size_t a, size_t b)
{
    split_isolated(t, a, b, match_deepseek_word, NULL);
}

static void deepseek_pass2(const struct cptext *t, size_t a, size_t b)
{
    split_isolated(t, a, b, match_deepseek_cjk, deepseek_pass3);
}

/* ---- kimi-k2: tiktoken's pat_str -------------------------------------------------- */

static bool kimi_upper(unsigned f) { return !(f & CP_HAN) && (f & (CP_UPPER | CP_MARK)); }
static bool kimi_lower(unsigned f) { return !(f & CP_HAN) && (f & (CP_LOWER | CP_MARK)); }

/* (?i:'s|'t|'re|'ve|'m|'ll|'d) at i: its length, or 0. */
static size_t match_contraction(const struct cptext *t, size_t i, size_t end)
{
    if (i + 1 >= end || t->cp[i] != '\'')
        return 0;
    uint32_t c1 = t->cp[i + 1] | 0x20, c2 = i + 2 < end ? t->cp[i + 2] | 0x20 : 0;
    if (t->cp[i + 1] >= 0x80)
        return 0;
    if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd')
        return 2;
    if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l'))
        return i + 2 < end && t->cp[i + 2] < 0x80 ? 3 : 0;
    return 0;
}

/* U* W+ C? at i (alternative 2), greedy with the backtracking the regex does:
 * the end, or i when it does not match. */
static size_t match_kimi_lower_word(const struct cptext *t, size_t i, size_t end)
{
    size_t r = i, last_lower = SIZE_MAX, e;
    while (r < end && kimi_upper(t->fl[r])) {
        if (kimi_lower(t->fl[r]))
            last_lower = r;
        r++;
    }
    if (r < end && kimi_lower(t->fl[r])) {
        while (r < end && kimi_lower(t->fl[r]))
            r++;
        e = r;
    } else if (last_lower != SIZE_MAX) {
        e = last_lower + 1;
    } else {
        return i;
    }
    return e + match_contraction(t, e, end);
}

/* U+ W* C? at i (alternative 3). */
static size_t match_kimi_upper_word(const struct cptext *t, size_t i, size_t end)
{
    size_t r = i;
    while (r < end && kimi_upper(t->fl[r]))
        r++;
    if (r == i)
        return i;
    while (r < end && kimi_lower(t->fl[r]))
        r++;
    return r + match_contraction(t, r, end);
}

static size_t match_kimi(const struct cptext *t, size_t i, size_t end)
{
    unsigned f = t->fl[i];
    size_t j;
    if (f & CP_HAN) { /* [\p{Han}]+ */
        for (j = i; j < end && (t->fl[j] & CP_HAN);)
            j++;
        return j;
    }
    bool lead = !is_cr_lf(t->cp[i]) && !(f & (CP_LETTER | CP_NUMBER)) && i + 1 < end;
    if (lead && (j = match_kimi_lower_word(t, i + 1, end)) > i + 1)
        return j;
    if ((j = match_kimi_lower_word(t, i, end)) > i)
        return j;
    if (lead && (j = match_kimi_upper_word(t, i + 1, end)) > i + 1)
        return j;
    if ((j = match_kimi_upper_word(t, i, end)) > i)
        return j;
    if (f & CP_NUMBER)
        return match_digits3(t, i, end);
    /* ␠?[^\s\p{L}\p{N}]+[\r\n]* */
    unsigned other = CP_SPACE | CP_LETTER | CP_NUMBER;
    j = (t->cp[i] == ' ' && i + 1 < end && !(t->fl[i + 1] & other)) ? i + 1 : i;
    if (!(t->fl[j] & other)) {
        while (j < end && !(t->fl[j] & other))
            j++;
        while (j < end && is_cr_lf(t->cp[j]))
            j++;
        return j;
    }
    return match_spaces(t, i, end);
}

kt_status kt_synth_pretokenize(enum kt_synth_family family, const char *text, size_t bytes,
                               kt_synth_chunk_fn fn, void *ctx, kt_err *err)
{
    if (!fn || (!text && bytes))
        return kt_err_set(err, KT_ERR_INVALID, "pre-tokenizer: no text or no callback");
    if (family != KT_SYNTH_KIMI && family != KT_SYNTH_DEEPSEEK)
        return kt_err_set(err, KT_ERR_INVALID, "pre-tokenizer: unknown model family %d", (int)family);
    struct cptext t;
    kt_status st = cptext_init(&t, text, bytes, err);
    if (st == KT_OK) {
        t.fn = fn;
        t.ctx = ctx;
        if (family == KT_SYNTH_DEEPSEEK)
            split_isolated(&t, 0, t.n, match_digits3, deepseek_pass2);
        else
            split_isolated(&t, 0, t.n, match_kimi, NULL);
    }
    cptext_free(&t);
    return st;
}

/* ---- BPE training --------------------------------------------------------------- */

/* Token byte strings, one arena: token i is bytes[start[i] .. start[i + 1]). */
struct token_store {
    unsigned char *bytes;
    size_t used, cap;
    size_t *start; /* [n + 1] */
    uint32_t n, max;
    uint32_t *slots; /* open-addressing set of token ids by byte content, UINT32_MAX = empty */
    size_t n_slots;
};

static uint64_t hash_bytes(const unsigned char *p, size_t n)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (size_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

static uint64_t hash_u64(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return x;
}

static size_t token_len(const struct token_store *s, uint32_t id) { return s->start[id + 1] - s->start[id]; }
static const unsigned char *token_ptr(const struct token_store *s, uint32_t id) { return s->bytes + s->start[id]; }

/* Slot for bytes p[0..n): the slot holding the token with those bytes, or the empty one where it goes. */
static size_t token_slot(const struct token_store *s, const unsigned char *p, size_t n)
{
    size_t mask = s->n_slots - 1, k = (size_t)hash_bytes(p, n) & mask;
    while (s->slots[k] != UINT32_MAX) {
        uint32_t id = s->slots[k];
        if (token_len(s, id) == n && memcmp(token_ptr(s, id), p, n) == 0)
            break;
        k = (k + 1) & mask;
    }
    return k;
}

static kt_status token_store_init(struct token_store *s, uint32_t max_tokens, kt_err *err)
{
    memset(s, 0, sizeof *s);
    s->max = max_tokens;
    s->cap = 4096;
    s->n_slots = 16;
    while (s->n_slots < 2 * (size_t)max_tokens)
        s->n_slots *= 2;
    s->bytes = malloc(s->cap);
    s->start = malloc(((size_t)max_tokens + 1) * sizeof *s->start);
    s->slots = malloc(s->n_slots * sizeof *s->slots);
    if (!s->bytes || !s->start || !s->slots)
        return kt_err_set(err, KT_ERR_NOMEM, "vocabulary: out of memory for %u tokens", max_tokens);
    memset(s->slots, 0xFF, s->n_slots * sizeof *s->slots);
    s->start[0] = 0;
    return KT_OK;
}

static void token_store_free(struct token_store *s)
{
    free(s->bytes);
    free(s->start);
    free(s->slots);
}

/* Makes room for a token of n more bytes.  Call it before taking token_ptr()s
 * for token_add: growing moves the arena. */
static kt_status token_reserve(struct token_store *s, size_t n, kt_err *err)
{
    if (s->used + n <= s->cap)
        return KT_OK;
    size_t cap = s->cap;
    while (s->used + n > cap)
        cap *= 2;
    unsigned char *grown = realloc(s->bytes, cap);
    if (!grown)
        return kt_err_set(err, KT_ERR_NOMEM, "vocabulary: out of memory for token bytes");
    s->bytes = grown;
    s->cap = cap;
    return KT_OK;
}

/* Adds a token made of a then b (nb may be 0), with room already reserved;
 * its id, or UINT32_MAX if those bytes are already a token. */
static uint32_t token_add(struct token_store *s, const unsigned char *a, size_t na, const unsigned char *b,
                          size_t nb)
{
    unsigned char *p = s->bytes + s->used;
    memmove(p, a, na);
    if (nb)
        memmove(p + na, b, nb);
    size_t k = token_slot(s, p, na + nb);
    if (s->slots[k] != UINT32_MAX || s->n == s->max)
        return UINT32_MAX;
    s->slots[k] = s->n;
    s->used += na + nb;
    s->start[s->n + 1] = s->used;
    return s->n++;
}

/* Training state: every distinct chunk once, with how often it occurs. */
struct trainer {
    struct token_store tokens;
    uint32_t *syms;       /* all words' symbols (token ids), back to back */
    size_t n_syms;
    size_t *word_start;   /* [n_words] */
    uint32_t *word_len;   /* [n_words] current symbol count */
    uint32_t *word_count; /* [n_words] occurrences in the text */
    size_t n_words, cap_words;
    /* distinct-chunk set while collecting: word index + 1, 0 = empty */
    uint32_t *chunk_slots;
    size_t n_chunk_slots;
    const char **word_text; /* [n_words] chunk bytes inside the corpus */
    size_t *word_bytes;
    /* pair counts of one round: key (left << 32 | right), UINT64_MAX = empty */
    uint64_t *pair_keys;
    uint64_t *pair_counts;
    size_t n_pair_slots;
    uint64_t *banned; /* pairs whose merge would duplicate a token */
    size_t n_banned, cap_banned;
    kt_status status;
    kt_err *err;
};

static void collect_chunk(const char *chunk, size_t bytes, void *ctx)
{
    struct trainer *tr = ctx;
    if (tr->status != KT_OK)
        return;
    size_t mask = tr->n_chunk_slots - 1, k = (size_t)hash_bytes((const unsigned char *)chunk, bytes) & mask;
    while (tr->chunk_slots[k]) {
        size_t w = tr->chunk_slots[k] - 1;
        if (tr->word_bytes[w] == bytes && memcmp(tr->word_text[w], chunk, bytes) == 0) {
            tr->word_count[w]++;
            return;
        }
        k = (k + 1) & mask;
    }
    if (tr->n_words == tr->cap_words) { /* cannot happen: there are fewer chunks than bytes */
        tr->status = kt_err_set(tr->err, KT_ERR_INVALID, "vocabulary: more chunks than bytes");
        return;
    }
    size_t w = tr->n_words++;
    tr->chunk_slots[k] = (uint32_t)w + 1;
    tr->word_text[w] = chunk;
    tr->word_bytes[w] = bytes;
    tr->word_count[w] = 1;
}

static bool pair_banned(const struct trainer *tr, uint64_t key)
{
    for (size_t i = 0; i < tr->n_banned; i++)
        if (tr->banned[i] == key)
            return true;
    return false;
}

/* Byte order of two pairs' texts (left token first, then right): < 0 if p sorts before q. */
static int pair_order(const struct token_store *s, uint64_t p, uint64_t q)
{
    uint32_t ids_p[2] = {(uint32_t)(p >> 32), (uint32_t)p}, ids_q[2] = {(uint32_t)(q >> 32), (uint32_t)q};
    for (int side = 0; side < 2; side++) {
        size_t np = token_len(s, ids_p[side]), nq = token_len(s, ids_q[side]);
        int c = memcmp(token_ptr(s, ids_p[side]), token_ptr(s, ids_q[side]), np < nq ? np : nq);
        if (c != 0)
            return c;
        if (np != nq)
            return np < nq ? -1 : 1;
    }
    return 0;
}

/* Counts every adjacent pair; returns the best one (most frequent, then
 * first in byte order) that is not banned, with its count in *count. */
static uint64_t best_pair(struct trainer *tr, uint64_t *count)
{
    size_t mask = tr->n_pair_slots - 1;
    memset(tr->pair_keys, 0xFF, tr->n_pair_slots * sizeof *tr->pair_keys);
    for (size_t w = 0; w < tr->n_words; w++) {
        const uint32_t *s = tr->syms + tr->word_start[w];
        for (uint32_t i = 0; i + 1 < tr->word_len[w]; i++) {
            uint64_t key = (uint64_t)s[i] << 32 | s[i + 1];
            size_t k = (size_t)hash_u64(key) & mask;
            while (tr->pair_keys[k] != key && tr->pair_keys[k] != UINT64_MAX)
                k = (k + 1) & mask;
            if (tr->pair_keys[k] == UINT64_MAX) {
                tr->pair_keys[k] = key;
                tr->pair_counts[k] = 0;
            }
            tr->pair_counts[k] += tr->word_count[w];
        }
    }
    uint64_t best = UINT64_MAX, best_count = 0;
    for (size_t k = 0; k < tr->n_pair_slots; k++) {
        uint64_t key = tr->pair_keys[k];
        if (key == UINT64_MAX || tr->pair_counts[k] < best_count)
            continue;
        if (tr->pair_counts[k] == best_count && pair_order(&tr->tokens, key, best) >= 0)
            continue;
        if (pair_banned(tr, key))
            continue;
        best = key;
        best_count = tr->pair_counts[k];
    }
    *count = best_count;
    return best;
}

/* Replaces every (left, right) in every word, left to right, by merged. */
static void apply_merge(struct trainer *tr, uint32_t left, uint32_t right, uint32_t merged)
{
    for (size_t w = 0; w < tr->n_words; w++) {
        uint32_t *s = tr->syms + tr->word_start[w];
        uint32_t n = tr->word_len[w], out = 0;
        for (uint32_t i = 0; i < n; i++) {
            if (i + 1 < n && s[i] == left && s[i + 1] == right) {
                s[out++] = merged;
                i++;
            } else {
                s[out++] = s[i];
            }
        }
        tr->word_len[w] = out;
    }
}

static void trainer_free(struct trainer *tr)
{
    token_store_free(&tr->tokens);
    free(tr->syms);
    free(tr->word_start);
    free(tr->word_len);
    free(tr->word_count);
    free(tr->chunk_slots);
    free(tr->word_text);
    free(tr->word_bytes);
    free(tr->pair_keys);
    free(tr->pair_counts);
    free(tr->banned);
}

/* Learns up to n_merges merges; on success tr->tokens holds the 256 byte
 * tokens then one token per merge, and merges[r] = (left, right) of merge r. */
static kt_status train(enum kt_synth_family family, uint32_t n_merges, struct trainer *tr, uint64_t *merges,
                       uint32_t *n_done, kt_err *err)
{
    size_t corpus_bytes;
    const char *corpus = kt_synth_corpus(&corpus_bytes);
    memset(tr, 0, sizeof *tr);
    tr->err = err;
    kt_status st = token_store_init(&tr->tokens, 256 + n_merges, err);
    if (st != KT_OK)
        return st;
    tr->cap_words = corpus_bytes;
    tr->n_chunk_slots = 16;
    while (tr->n_chunk_slots < 2 * corpus_bytes)
        tr->n_chunk_slots *= 2;
    tr->word_start = malloc(corpus_bytes * sizeof *tr->word_start);
    tr->word_len = malloc(corpus_bytes * sizeof *tr->word_len);
    tr->word_count = malloc(corpus_bytes * sizeof *tr->word_count);
    tr->word_text = malloc(corpus_bytes * sizeof *tr->word_text);
    tr->word_bytes = malloc(corpus_bytes * sizeof *tr->word_bytes);
    tr->chunk_slots = calloc(tr->n_chunk_slots, sizeof *tr->chunk_slots);
    tr->syms = malloc(corpus_bytes * sizeof *tr->syms);
    tr->n_pair_slots = tr->n_chunk_slots;
    tr->pair_keys = malloc(tr->n_pair_slots * sizeof *tr->pair_keys);
    tr->pair_counts = malloc(tr->n_pair_slots * sizeof *tr->pair_counts);
    if (!tr->word_start || !tr->word_len || !tr->word_count || !tr->word_text || !tr->word_bytes ||
        !tr->chunk_slots || !tr->syms || !tr->pair_keys || !tr->pair_counts)
        return kt_err_set(err, KT_ERR_NOMEM, "vocabulary: out of memory for the training text");

    if ((st = token_reserve(&tr->tokens, 256, err)) != KT_OK)
        return st;
    for (uint32_t b = 0; b < 256; b++) {
        unsigned char byte = (unsigned char)b;
        token_add(&tr->tokens, &byte, 1, NULL, 0);
    }
    tr->status = KT_OK;
    if ((st = kt_synth_pretokenize(family, corpus, corpus_bytes, collect_chunk, tr, err)) != KT_OK)
        return st;
    if (tr->status != KT_OK)
        return tr->status;
    for (size_t w = 0; w < tr->n_words; w++) {
        tr->word_start[w] = tr->n_syms;
        tr->word_len[w] = (uint32_t)tr->word_bytes[w];
        for (size_t i = 0; i < tr->word_bytes[w]; i++)
            tr->syms[tr->n_syms++] = (unsigned char)tr->word_text[w][i];
    }

    *n_done = 0;
    while (*n_done < n_merges) {
        uint64_t count, key = best_pair(tr, &count);
        if (key == UINT64_MAX || count < 2)
            break;
        uint32_t left = (uint32_t)(key >> 32), right = (uint32_t)key;
        size_t nl = token_len(&tr->tokens, left), nr = token_len(&tr->tokens, right);
        if ((st = token_reserve(&tr->tokens, nl + nr, err)) != KT_OK)
            return st;
        uint32_t merged =
            token_add(&tr->tokens, token_ptr(&tr->tokens, left), nl, token_ptr(&tr->tokens, right), nr);
        if (merged == UINT32_MAX) { /* "ab"+"c" after "a"+"bc": never a second token for the same bytes */
            if (tr->n_banned == tr->cap_banned) {
                size_t cap = tr->cap_banned ? 2 * tr->cap_banned : 64;
                uint64_t *grown = realloc(tr->banned, cap * sizeof *grown);
                if (!grown)
                    return kt_err_set(err, KT_ERR_NOMEM, "vocabulary: out of memory");
                tr->banned = grown;
                tr->cap_banned = cap;
            }
            tr->banned[tr->n_banned++] = key;
            continue;
        }
        merges[(*n_done)++] = key;
        apply_merge(tr, left, right, merged);
    }
    return KT_OK;
}

/* ---- the family's token list ------------------------------------------------------ */

struct special_token {
    const char *text;
    int32_t type;
};

/*
 * DeepSeek-V3/R1, in their real relative order (ids 0..2, then 128798..128814).
 * llama.cpp's converter types an added token CONTROL when it is marked special
 * or "looks special" (<|...|> or <｜...｜>), USER_DEFINED otherwise: every
 * <｜...｜> marker is therefore CONTROL although tokenizer.json marks most of
 * them special: false; only <think> and </think> stay USER_DEFINED.
 */
static const struct special_token deepseek_front[] = {
    {"<｜begin▁of▁sentence｜>", KT_TOKEN_CONTROL},
    {"<｜end▁of▁sentence｜>", KT_TOKEN_CONTROL},
    {"<｜▁pad▁｜>", KT_TOKEN_CONTROL},
};
static const struct special_token deepseek_back[] = {
    {"<think>", KT_TOKEN_USER_DEFINED},
    {"</think>", KT_TOKEN_USER_DEFINED},
    {"<｜fim▁hole｜>", KT_TOKEN_CONTROL},
    {"<｜fim▁begin｜>", KT_TOKEN_CONTROL},
    {"<｜fim▁end｜>", KT_TOKEN_CONTROL},
    {"<｜User｜>", KT_TOKEN_CONTROL},
    {"<｜Assistant｜>", KT_TOKEN_CONTROL},
    {"<|EOT|>", KT_TOKEN_CONTROL},
    {"<｜tool▁calls▁begin｜>", KT_TOKEN_CONTROL},
    {"<｜tool▁calls▁end｜>", KT_TOKEN_CONTROL},
    {"<｜tool▁call▁begin｜>", KT_TOKEN_CONTROL},
    {"<｜tool▁call▁end｜>", KT_TOKEN_CONTROL},
    {"<｜tool▁outputs▁begin｜>", KT_TOKEN_CONTROL},
    {"<｜tool▁outputs▁end｜>", KT_TOKEN_CONTROL},
    {"<｜tool▁output▁begin｜>", KT_TOKEN_CONTROL},
    {"<｜tool▁output▁end｜>", KT_TOKEN_CONTROL},
    {"<｜tool▁sep｜>", KT_TOKEN_CONTROL},
};

/*
 * Kimi-K2, in their real relative order (163584..163839).  The converter
 * types all 256 reserved ids CONTROL, whatever tokenizer_config.json says.
 * BOS [BOS] and EOS [EOS] as config.json and tokenizer_config.json name them
 * (generation_config.json stops on <|im_end|>, which llama.cpp adds to EOG by
 * its text); padding [PAD], as llama.cpp's converter writes it.
 */
static const struct special_token kimi_back[] = {
    {"[BOS]", KT_TOKEN_CONTROL},
    {"[EOS]", KT_TOKEN_CONTROL},
    {"<|im_end|>", KT_TOKEN_CONTROL},
    {"<|im_user|>", KT_TOKEN_CONTROL},
    {"<|im_assistant|>", KT_TOKEN_CONTROL},
    {"<|start_header_id|>", KT_TOKEN_CONTROL},
    {"<|end_header_id|>", KT_TOKEN_CONTROL},
    {"[EOT]", KT_TOKEN_CONTROL},
    {"<|im_system|>", KT_TOKEN_CONTROL},
    {"<|tool_calls_section_begin|>", KT_TOKEN_CONTROL},
    {"<|tool_calls_section_end|>", KT_TOKEN_CONTROL},
    {"<|tool_call_begin|>", KT_TOKEN_CONTROL},
    {"<|tool_call_argument_begin|>", KT_TOKEN_CONTROL},
    {"<|tool_call_end|>", KT_TOKEN_CONTROL},
    {"<|im_middle|>", KT_TOKEN_CONTROL},
    {"<think>", KT_TOKEN_CONTROL},
    {"</think>", KT_TOKEN_CONTROL},
    {"[UNK]", KT_TOKEN_CONTROL},
    {"[PAD]", KT_TOKEN_CONTROL},
};

#define COUNT(a) (sizeof(a) / sizeof((a)[0]))

static char *byte_level_dup(const struct token_store *s, uint32_t id)
{
    char *out = malloc(2 * token_len(s, id) + 1);
    if (out)
        kt_byte_level_text(token_ptr(s, id), token_len(s, id), out);
    return out;
}

void kt_synth_vocab_free(struct kt_synth_vocab *v)
{
    if (!v)
        return;
    if (v->tokens)
        for (uint32_t i = 0; i < v->n_tokens; i++)
            free(v->tokens[i]);
    if (v->merges)
        for (uint32_t i = 0; i < v->n_merges; i++)
            free(v->merges[i]);
    free(v->tokens);
    free(v->token_types);
    free(v->merges);
    memset(v, 0, sizeof *v);
}

kt_status kt_synth_vocab_build(enum kt_synth_family family, uint32_t n_merges, struct kt_synth_vocab *out,
                               kt_err *err)
{
    if (!out)
        return kt_err_set(err, KT_ERR_INVALID, "vocabulary: no output");
    memset(out, 0, sizeof *out);
    if (family != KT_SYNTH_KIMI && family != KT_SYNTH_DEEPSEEK)
        return kt_err_set(err, KT_ERR_INVALID, "vocabulary: unknown model family %d", (int)family);
    if (n_merges > MAX_MERGES)
        return kt_err_set(err, KT_ERR_INVALID, "vocabulary: %u merges requested, at most %u", n_merges,
                          MAX_MERGES);

    const struct special_token *front = NULL, *back;
    size_t n_front = 0, n_back;
    if (family == KT_SYNTH_DEEPSEEK) {
        front = deepseek_front, n_front = COUNT(deepseek_front);
        back = deepseek_back, n_back = COUNT(deepseek_back);
    } else {
        back = kimi_back, n_back = COUNT(kimi_back);
    }

    struct trainer tr;
    uint64_t *merge_pairs = malloc(((size_t)n_merges + 1) * sizeof *merge_pairs);
    uint32_t n_done = 0;
    kt_status st = merge_pairs ? train(family, n_merges, &tr, merge_pairs, &n_done, err)
                               : kt_err_set(err, KT_ERR_NOMEM, "vocabulary: out of memory");
    if (st != KT_OK)
        goto done;

    uint32_t n_learned = tr.tokens.n; /* 256 + n_done */
    out->n_tokens = (uint32_t)(n_front + n_learned + n_back);
    out->n_merges = n_done;
    out->tokens = calloc(out->n_tokens, sizeof *out->tokens);
    out->token_types = calloc(out->n_tokens, sizeof *out->token_types);
    out->merges = calloc(n_done ? n_done : 1, sizeof *out->merges);
    if (!out->tokens || !out->token_types || !out->merges) {
        st = kt_err_set(err, KT_ERR_NOMEM, "vocabulary: out of memory for %u tokens", out->n_tokens);
        goto done;
    }
    uint32_t id = 0;
    for (size_t i = 0; i < n_front; i++, id++) {
        out->tokens[id] = strdup(front[i].text);
        out->token_types[id] = front[i].type;
    }
    for (uint32_t t = 0; t < n_learned; t++, id++) {
        out->tokens[id] = byte_level_dup(&tr.tokens, t);
        out->token_types[id] = KT_TOKEN_NORMAL; /* byte tokens too: the gpt2 converter never writes BYTE */
    }
    for (size_t i = 0; i < n_back; i++, id++) {
        out->tokens[id] = strdup(back[i].text);
        out->token_types[id] = back[i].type;
    }
    for (uint32_t r = 0; r < n_done; r++) {
        uint32_t left = (uint32_t)(merge_pairs[r] >> 32), right = (uint32_t)merge_pairs[r];
        size_t nl = token_len(&tr.tokens, left), nr = token_len(&tr.tokens, right);
        char *m = malloc(2 * (nl + nr) + 2);
        if (m) {
            size_t o = kt_byte_level_text(token_ptr(&tr.tokens, left), nl, m);
            m[o] = ' ';
            kt_byte_level_text(token_ptr(&tr.tokens, right), nr, m + o + 1);
        }
        out->merges[r] = m;
    }
    for (uint32_t i = 0; i < out->n_tokens; i++)
        if (!out->tokens[i])
            st = KT_ERR_NOMEM;
    for (uint32_t r = 0; r < n_done; r++)
        if (!out->merges[r])
            st = KT_ERR_NOMEM;
    if (st != KT_OK) {
        kt_err_set(err, st, "vocabulary: out of memory for token texts");
        goto done;
    }
    /* A merged token's byte-level text never looks like a special's, but say so if it ever does. */
    for (uint32_t t = 256; t < n_learned; t++)
        for (size_t i = 0; i < n_front + n_back; i++) {
            const char *special = i < n_front ? front[i].text : back[i - n_front].text;
            if (strcmp(out->tokens[n_front + t], special) == 0) {
                st = kt_err_set(err, KT_ERR_INVALID, "vocabulary: merged token %u spells the special %s",
                                (unsigned)(n_front + t), special);
                goto done;
            }
        }

    if (family == KT_SYNTH_DEEPSEEK) {
        out->bos_id = 0;
        out->eos_id = 1;
        out->pad_id = 1; /* pad_token in tokenizer_config.json is the EOS text; the converter writes id 1 */
        out->add_bos = true;
        out->pre = "deepseek-v3";
    } else {
        out->bos_id = n_learned;     /* [BOS] */
        out->eos_id = n_learned + 1; /* [EOS] */
        out->pad_id = n_learned + (uint32_t)n_back - 1; /* [PAD] */
        out->add_bos = false;
        out->pre = "kimi-k2";
    }
    out->chat_template = kt_synth_chat_template(family);

done:
    if (merge_pairs)
        trainer_free(&tr);
    free(merge_pairs);
    if (st != KT_OK)
        kt_synth_vocab_free(out);
    return st;
}

/* ---- GGUF keys ------------------------------------------------------------------- */

kt_status kt_synth_vocab_write(struct kt_gguf_writer *w, const struct kt_synth_vocab *v, kt_err *err)
{
    if (!w || !v || !v->tokens || !v->token_types || !v->pre || !v->chat_template)
        return kt_err_set(err, KT_ERR_INVALID, "tokenizer: no writer or an incomplete vocabulary");
    if (v->bos_id >= v->n_tokens || v->eos_id >= v->n_tokens || v->pad_id >= (int64_t)v->n_tokens)
        return kt_err_set(err, KT_ERR_INVALID, "tokenizer: special token id out of range (%u tokens)",
                          v->n_tokens);
    kt_status st;
    if ((st = kt_gguf_writer_set_str(w, "tokenizer.ggml.model", "gpt2", err)) != KT_OK ||
        (st = kt_gguf_writer_set_str(w, "tokenizer.ggml.pre", v->pre, err)) != KT_OK ||
        (st = kt_gguf_writer_set_str_array(w, "tokenizer.ggml.tokens", (const char *const *)v->tokens,
                                           v->n_tokens, err)) != KT_OK ||
        (st = kt_gguf_writer_set_array(w, "tokenizer.ggml.token_type", KT_GGUF_INT32, v->token_types,
                                       v->n_tokens, err)) != KT_OK ||
        (st = kt_gguf_writer_set_str_array(w, "tokenizer.ggml.merges", (const char *const *)v->merges,
                                           v->n_merges, err)) != KT_OK ||
        (st = kt_gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", v->bos_id, err)) != KT_OK ||
        (st = kt_gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", v->eos_id, err)) != KT_OK)
        return st;
    if (v->pad_id >= 0 &&
        (st = kt_gguf_writer_set_u32(w, "tokenizer.ggml.padding_token_id", (uint32_t)v->pad_id, err)) != KT_OK)
        return st;
    if ((st = kt_gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", v->add_bos, err)) != KT_OK ||
        (st = kt_gguf_writer_set_bool(w, "tokenizer.ggml.add_eos_token", false, err)) != KT_OK ||
        (st = kt_gguf_writer_set_str(w, "tokenizer.chat_template", v->chat_template, err)) != KT_OK)
        return st;
    return KT_OK;
}
