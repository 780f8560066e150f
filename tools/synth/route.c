/*
 * route.c - the token classes of --route-input: which kind of text a token
 * of the synthetic vocabulary belongs to, decided from its bytes alone (so
 * any text the tokenizer accepts gets classes, not only the training text).
 * Never draws a random number (init.c does) and never prints.
 */
#include "route.h"

#include <stdbool.h>
#include <string.h>

#include "vocab.h"

/* The byte a byte-level code point stands for (GPT-2's bytes_to_unicode
 * inverse): printable Latin-1 maps to itself, the rest was moved to U+0100
 * upward in byte order.  -1 for a code point no byte maps to. */
static int byte_of_code_point(uint32_t c)
{
    if ((c >= 0x21 && c <= 0x7E) || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE && c <= 0xFF))
        return (int)c;
    if (c >= 0x100 && c <= 0x120)
        return (int)(c - 0x100); /* 0x00 .. 0x20 */
    if (c >= 0x121 && c <= 0x142)
        return (int)(0x7F + (c - 0x121)); /* 0x7F .. 0xA0 */
    if (c == 0x143)
        return 0xAD;
    return -1;
}

static bool is_code_symbol(unsigned char b)
{
    return b && strchr("{}()[];=<>*&|#\\/%^~`$@_+", b) != NULL;
}

/* Words that in the training text (corpus.c) and in practice mean code:
 * type and declaration keywords and the C library's names, not English words
 * ("for", "if", "return" stay prose: prose uses them as much). */
static bool is_code_word(const unsigned char *w, size_t n)
{
    static const char *const words[] = {
        "int",    "char",   "void",    "const",  "struct",  "static", "include", "define", "sizeof", "unsigned",
        "size_t", "uint",   "uint8_t", "uint32_t", "uint64_t", "int8_t", "def",   "self",   "None",   "NULL",
        "malloc", "printf",  "fopen",  "fclose",  "strlen", "strcpy",  "memcpy", "typedef", "enum",
        "bool",   "elif",   "argc",    "argv",   "stdio",   "stdlib", "len",    "str",
        "double", "float",  "int32_t", "int64_t", "uint16_t", "snprintf", "realloc", "qsort", "errno", "xs",
    };
    for (size_t i = 0; i < sizeof words / sizeof words[0]; i++)
        if (strlen(words[i]) == n && memcmp(words[i], w, n) == 0)
            return true;
    return false;
}

enum kt_synth_token_class kt_synth_token_class(const char *text, int32_t token_type)
{
    if (!text || token_type != KT_TOKEN_NORMAL)
        return KT_SYNTH_CLASS_NONE;
    bool letters = false, digits = false, code = false, script = false, other = false;
    unsigned spaces = 0, run = 0, tabs = 0;
    unsigned char word[24]; /* the token's bytes without a leading space, when short */
    size_t n_word = 0, n_bytes = 0;
    const unsigned char *s = (const unsigned char *)text;
    while (*s) {
        uint32_t c = *s++;
        if (c >= 0xC0 && (*s & 0xC0) == 0x80) /* byte-level texts use 1- and 2-byte UTF-8 only */
            c = ((c & 0x1F) << 6) | (*s++ & 0x3F);
        int b = byte_of_code_point(c);
        if (b < 0)
            return KT_SYNTH_CLASS_NONE;
        if (!(n_bytes++ == 0 && b == ' ')) {
            if (n_word < sizeof word)
                word[n_word] = (unsigned char)b;
            n_word++;
        }
        run = b == ' ' ? run + 1 : 0;
        spaces = run > spaces ? run : spaces;
        if (b >= 0x80)
            script = true;
        else if ((b | 0x20) >= 'a' && (b | 0x20) <= 'z')
            letters = true;
        else if (b >= '0' && b <= '9')
            digits = true;
        else if (b == '\t')
            tabs++;
        else if (is_code_symbol((unsigned char)b))
            code = true;
        else if (b != ' ' && b != '\n' && b != '\r')
            other = true; /* prose punctuation: . , ! ? ' " : - */
    }
    if (script)
        return KT_SYNTH_CLASS_SCRIPT;
    if (code || tabs || spaces >= 2 || (n_word <= sizeof word && is_code_word(word, n_word)))
        return KT_SYNTH_CLASS_CODE;
    if (letters)
        return KT_SYNTH_CLASS_PROSE;
    if (digits)
        return KT_SYNTH_CLASS_DIGITS;
    return other ? KT_SYNTH_CLASS_PROSE : KT_SYNTH_CLASS_NONE;
}
