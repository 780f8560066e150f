/*
 * unicode.c - strict UTF-8 decoding with maximal-subpart replacement, UTF-8
 * encoding, and the case-folding helper for tokenizer contractions.
 *
 * The decoder accepts exactly the well-formed sequences of the Unicode
 * standard's table 3-7 (no overlongs, no surrogates, nothing above
 * U+10FFFF).  It must never read past the n bytes it is given.
 */
#include "unicode.h"

#include <string.h>

char kt_unicode_contraction_letter(uint32_t cp)
{
    if (cp < 0x80) {
        char c = (char)(cp | 0x20);
        return (cp | 0x20) >= 'a' && (cp | 0x20) <= 'z' && strchr("strevmld", c) ? c : 0;
    }
    for (size_t i = 0; i < kt_unicode_n_contraction_folds; i++)
        if (kt_unicode_contraction_folds[i].cp == cp)
            return kt_unicode_contraction_folds[i].ascii;
    return 0;
}

enum kt_utf8_result kt_utf8_next(const unsigned char *s, size_t n, size_t *len, uint32_t *cp)
{
    unsigned char b = s[0];
    *cp = KT_UNICODE_REPLACEMENT;
    *len = 1;
    if (b < 0x80) {
        *cp = b;
        return KT_UTF8_OK;
    }
    size_t need;
    unsigned char lo = 0x80, hi = 0xBF; /* allowed range of the second byte */
    uint32_t c;
    if (b >= 0xC2 && b <= 0xDF) {
        need = 2, c = b & 0x1F;
    } else if (b >= 0xE0 && b <= 0xEF) {
        need = 3, c = b & 0x0F;
        if (b == 0xE0)
            lo = 0xA0; /* no overlongs */
        else if (b == 0xED)
            hi = 0x9F; /* no surrogates */
    } else if (b >= 0xF0 && b <= 0xF4) {
        need = 4, c = b & 0x07;
        if (b == 0xF0)
            lo = 0x90;
        else if (b == 0xF4)
            hi = 0x8F; /* nothing above U+10FFFF */
    } else {
        return KT_UTF8_INVALID; /* 80..C1, F5..FF never start a sequence */
    }
    for (size_t i = 1; i < need; i++) {
        if (i == n) {
            *len = i;
            return KT_UTF8_TRUNCATED;
        }
        unsigned char x = s[i];
        if (x < (i == 1 ? lo : 0x80) || x > (i == 1 ? hi : 0xBF)) {
            *len = i;
            return KT_UTF8_INVALID;
        }
        c = (c << 6) | (x & 0x3F);
    }
    *len = need;
    *cp = c;
    return KT_UTF8_OK;
}

bool kt_utf8_valid(const char *s, size_t n)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        if (p[i] < 0x80) {
            i++;
            continue;
        }
        size_t len;
        uint32_t cp;
        if (kt_utf8_next(p + i, n - i, &len, &cp) != KT_UTF8_OK)
            return false;
        i += len;
    }
    return true;
}

size_t kt_utf8_encode(uint32_t cp, char out[4])
{
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

size_t kt_utf8_sanitize(const char *s, size_t n, char *out)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0, o = 0;
    while (i < n) {
        size_t len;
        uint32_t cp;
        if (kt_utf8_next(p + i, n - i, &len, &cp) == KT_UTF8_OK) {
            memcpy(out + o, s + i, len);
            o += len;
        } else {
            o += kt_utf8_encode(KT_UNICODE_REPLACEMENT, out + o);
        }
        i += len;
    }
    return o;
}
