/*
 * unicode.h - the Unicode 15.0 character properties the pre-tokenizers need,
 * and strict UTF-8 decoding and encoding.
 *
 * Properties come from runtime/text/unicode_tables.c, generated from the Unicode
 * Character Database (Debian's unicode-data 15.0.0) by tools/gen-unicode-tables.c:
 * regenerate, never hand-edit.  Decoding follows the Unicode standard's
 * "U+FFFD substitution of maximal subparts" (ch. 3.9), the rule JavaScript's
 * TextDecoder, Python's "replace" and Rust's from_utf8_lossy share.  Nothing
 * here allocates, and nothing here may ever read outside the given bytes.
 */
#ifndef KT_UNICODE_H
#define KT_UNICODE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define KT_UNICODE_MAX 0x10FFFFu
#define KT_UNICODE_REPLACEMENT 0xFFFDu

/* General categories; Cn (unassigned) is 0. */
enum kt_ucat {
    KT_UCAT_CN, KT_UCAT_LU, KT_UCAT_LL, KT_UCAT_LT, KT_UCAT_LM, KT_UCAT_LO,
    KT_UCAT_MN, KT_UCAT_MC, KT_UCAT_ME, KT_UCAT_ND, KT_UCAT_NL, KT_UCAT_NO,
    KT_UCAT_PC, KT_UCAT_PD, KT_UCAT_PS, KT_UCAT_PE, KT_UCAT_PI, KT_UCAT_PF, KT_UCAT_PO,
    KT_UCAT_SM, KT_UCAT_SC, KT_UCAT_SK, KT_UCAT_SO, KT_UCAT_ZS, KT_UCAT_ZL, KT_UCAT_ZP,
    KT_UCAT_CC, KT_UCAT_CF, KT_UCAT_CS, KT_UCAT_CO,
    KT_UCAT_COUNT,
};

/* One byte per code point: the category in the low 5 bits, then flags. */
#define KT_UPROP_CAT 0x1Fu
#define KT_UPROP_WHITE_SPACE 0x20u /* PropList White_Space: regex \s in Rust regex and Oniguruma */
#define KT_UPROP_HAN 0x40u         /* Scripts.txt Script=Han: \p{Han} */
#define KT_UPROP_PY_SPACE 0x80u    /* Python str.isspace(): Zs, or bidi class WS, B or S */

/* Category masks: (1u << cat) & mask. */
#define KT_UCAT_BIT(c) (1u << KT_UCAT_##c)
#define KT_UCAT_L (KT_UCAT_BIT(LU) | KT_UCAT_BIT(LL) | KT_UCAT_BIT(LT) | KT_UCAT_BIT(LM) | KT_UCAT_BIT(LO))
#define KT_UCAT_M (KT_UCAT_BIT(MN) | KT_UCAT_BIT(MC) | KT_UCAT_BIT(ME))
#define KT_UCAT_N (KT_UCAT_BIT(ND) | KT_UCAT_BIT(NL) | KT_UCAT_BIT(NO))
#define KT_UCAT_P (KT_UCAT_BIT(PC) | KT_UCAT_BIT(PD) | KT_UCAT_BIT(PS) | KT_UCAT_BIT(PE) | \
                   KT_UCAT_BIT(PI) | KT_UCAT_BIT(PF) | KT_UCAT_BIT(PO))
#define KT_UCAT_S (KT_UCAT_BIT(SM) | KT_UCAT_BIT(SC) | KT_UCAT_BIT(SK) | KT_UCAT_BIT(SO))

/* Two-stage table (unicode_tables.c): block = stage1[cp >> SHIFT], then
 * props = stage2[block << SHIFT | (cp & mask)]. */
#define KT_UNICODE_BLOCK_SHIFT 7
extern const uint16_t kt_unicode_stage1[(KT_UNICODE_MAX + 1) >> KT_UNICODE_BLOCK_SHIFT];
extern const uint8_t kt_unicode_stage2[];

/* Code points outside ASCII whose simple case folding equals one of the
 * letters of the contractions 's 't 're 've 'm 'll 'd (U+017F LONG S folds
 * to 's'), so a case-insensitive match of those letters can be exact. */
struct kt_unicode_fold {
    uint32_t cp;
    char ascii; /* lowercase ASCII letter it folds to */
};
extern const struct kt_unicode_fold kt_unicode_contraction_folds[];
extern const size_t kt_unicode_n_contraction_folds;

static inline unsigned kt_unicode_props(uint32_t cp)
{
    if (cp > KT_UNICODE_MAX)
        return KT_UCAT_CN;
    unsigned block = kt_unicode_stage1[cp >> KT_UNICODE_BLOCK_SHIFT];
    return kt_unicode_stage2[(block << KT_UNICODE_BLOCK_SHIFT) | (cp & ((1u << KT_UNICODE_BLOCK_SHIFT) - 1))];
}

static inline enum kt_ucat kt_unicode_cat(uint32_t cp) { return (enum kt_ucat)(kt_unicode_props(cp) & KT_UPROP_CAT); }

/* Lowercase ASCII letter cp matches under simple case folding if it is one
 * of "strevmld" in any case (or folds to one), else 0. */
char kt_unicode_contraction_letter(uint32_t cp);

/* ---- UTF-8 ------------------------------------------------------------------ */

enum kt_utf8_result {
    KT_UTF8_OK,        /* a well-formed sequence */
    KT_UTF8_INVALID,   /* a maximal ill-formed subpart: stands for one U+FFFD */
    KT_UTF8_TRUNCATED, /* a well-formed prefix cut by the end of the bytes */
};

/* Looks at s[0..n) (n >= 1).  Sets *len to the bytes of the sequence or
 * subpart (1..4) and *cp to the code point (U+FFFD unless OK). */
enum kt_utf8_result kt_utf8_next(const unsigned char *s, size_t n, size_t *len, uint32_t *cp);

/* True if all n bytes are well-formed UTF-8. */
bool kt_utf8_valid(const char *s, size_t n);

/* Writes cp (<= U+10FFFF, not a surrogate) as 1..4 bytes; returns the count. */
size_t kt_utf8_encode(uint32_t cp, char out[4]);

/* Writes s[0..n) to out with every ill-formed subpart (including a truncated
 * tail) replaced by U+FFFD.  out must hold 3 * n bytes; returns bytes written. */
size_t kt_utf8_sanitize(const char *s, size_t n, char *out);

#endif
