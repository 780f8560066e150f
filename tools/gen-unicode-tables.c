/*
 * gen-unicode-tables.c - writes runtime/text/unicode_tables.c from the Unicode
 * Character Database files of Debian's unicode-data package:
 *
 *   gen-unicode-tables [UCD_DIR (/usr/share/unicode)] [OUT (stdout)]
 *
 * It reads extracted/DerivedGeneralCategory.txt (category of every code
 * point), PropList.txt (White_Space), Scripts.txt (Han), UnicodeData.txt
 * (bidi classes, for Python's str.isspace) and CaseFolding.txt (simple case
 * folding onto the contraction letters), and prints a two-stage table of one
 * property byte per code point (see runtime/text/unicode.h).  A developer tool:
 * the build never runs it, and its output is committed.  It must never emit
 * a table that does not cover every code point 0..U+10FFFF.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "unicode.h"

#define N_CP (KT_UNICODE_MAX + 1)
#define BLOCK (1u << KT_UNICODE_BLOCK_SHIFT)

static uint8_t props[N_CP];
static uint8_t py_space[N_CP];

static const char *const cat_names[KT_UCAT_COUNT] = {
    "Cn", "Lu", "Ll", "Lt", "Lm", "Lo", "Mn", "Mc", "Me", "Nd", "Nl", "No", "Pc", "Pd", "Ps",
    "Pe", "Pi", "Pf", "Po", "Sm", "Sc", "Sk", "So", "Zs", "Zl", "Zp", "Cc", "Cf", "Cs", "Co",
};

static FILE *open_ucd(const char *dir, const char *name)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "gen-unicode-tables: cannot open %s (apt-get install unicode-data)\n", path);
        exit(1);
    }
    return f;
}

/* Parses "XXXX[..YYYY] ; Value[ ; ...] # comment".  false for blank/comment lines. */
static bool parse_range_line(char *line, uint32_t *lo, uint32_t *hi, char **value)
{
    char *hash = strchr(line, '#');
    if (hash)
        *hash = 0;
    char *semi = strchr(line, ';');
    if (!semi)
        return false;
    *semi = 0;
    char *end;
    *lo = (uint32_t)strtoul(line, &end, 16);
    if (end == line)
        return false;
    *hi = *lo;
    if (end[0] == '.' && end[1] == '.')
        *hi = (uint32_t)strtoul(end + 2, NULL, 16);
    char *v = semi + 1;
    while (*v == ' ' || *v == '\t')
        v++;
    char *stop = v;
    while (*stop && *stop != ' ' && *stop != '\t' && *stop != ';' && *stop != '\n' && *stop != '\r')
        stop++;
    *stop = 0;
    *value = v;
    if (*hi < *lo || *hi > KT_UNICODE_MAX) {
        fprintf(stderr, "gen-unicode-tables: bad range %X..%X\n", *lo, *hi);
        exit(1);
    }
    return true;
}

static void read_categories(const char *dir)
{
    FILE *f = open_ucd(dir, "extracted/DerivedGeneralCategory.txt");
    char line[1024];
    static uint8_t seen[N_CP];
    while (fgets(line, sizeof line, f)) {
        uint32_t lo, hi;
        char *v;
        if (!parse_range_line(line, &lo, &hi, &v))
            continue;
        int cat = -1;
        for (int c = 0; c < KT_UCAT_COUNT; c++)
            if (strcmp(v, cat_names[c]) == 0)
                cat = c;
        if (cat < 0) {
            fprintf(stderr, "gen-unicode-tables: unknown category %s\n", v);
            exit(1);
        }
        for (uint32_t cp = lo; cp <= hi; cp++) {
            props[cp] = (uint8_t)((props[cp] & ~KT_UPROP_CAT) | (unsigned)cat);
            seen[cp] = 1;
        }
    }
    fclose(f);
    for (uint32_t cp = 0; cp < N_CP; cp++)
        if (!seen[cp]) {
            fprintf(stderr, "gen-unicode-tables: U+%04X has no category\n", cp);
            exit(1);
        }
}

static void read_flag(const char *dir, const char *file, const char *value, uint8_t flag)
{
    FILE *f = open_ucd(dir, file);
    char line[1024];
    unsigned n = 0;
    while (fgets(line, sizeof line, f)) {
        uint32_t lo, hi;
        char *v;
        if (!parse_range_line(line, &lo, &hi, &v) || strcmp(v, value) != 0)
            continue;
        for (uint32_t cp = lo; cp <= hi; cp++, n++)
            props[cp] |= flag;
    }
    fclose(f);
    if (n == 0) {
        fprintf(stderr, "gen-unicode-tables: no %s in %s\n", value, file);
        exit(1);
    }
}

/* Python: isspace() is true for category Zs and bidi classes WS, B, S. */
static void read_bidi_spaces(const char *dir)
{
    FILE *f = open_ucd(dir, "UnicodeData.txt");
    char line[1024];
    while (fgets(line, sizeof line, f)) {
        char *field[6] = {0};
        char *p = line;
        for (int i = 0; i < 6 && p; i++) {
            field[i] = p;
            p = strchr(p, ';');
            if (p)
                *p++ = 0;
        }
        if (!field[4])
            continue;
        uint32_t cp = (uint32_t)strtoul(field[0], NULL, 16);
        if (cp <= KT_UNICODE_MAX && (!strcmp(field[4], "WS") || !strcmp(field[4], "B") || !strcmp(field[4], "S")))
            py_space[cp] = 1;
    }
    fclose(f);
    for (uint32_t cp = 0; cp < N_CP; cp++)
        if (py_space[cp] || (props[cp] & KT_UPROP_CAT) == KT_UCAT_ZS)
            props[cp] |= KT_UPROP_PY_SPACE;
}

/* Non-ASCII code points whose simple (C or S) folding is one of the
 * contraction letters, or that share a folding with one. */
static void write_folds(const char *dir, FILE *out)
{
    static uint32_t fold[N_CP];
    for (uint32_t cp = 0; cp < N_CP; cp++)
        fold[cp] = cp;
    FILE *f = open_ucd(dir, "CaseFolding.txt");
    char line[1024];
    while (fgets(line, sizeof line, f)) {
        char *hash = strchr(line, '#');
        if (hash)
            *hash = 0;
        unsigned cp, status_end, to;
        char status;
        if (sscanf(line, "%x; %c; %x;%n", &cp, &status, &to, &status_end) < 3)
            continue;
        if ((status == 'C' || status == 'S') && cp <= KT_UNICODE_MAX)
            fold[cp] = to;
    }
    fclose(f);
    fprintf(out, "const struct kt_unicode_fold kt_unicode_contraction_folds[] = {\n");
    unsigned n = 0;
    for (uint32_t cp = 0x80; cp < N_CP; cp++) {
        uint32_t t = fold[cp];
        for (const char *l = "strevmld"; *l; l++)
            if (t == (uint32_t)*l || t == fold[(unsigned char)*l]) {
                fprintf(out, "    {0x%04X, '%c'},\n", cp, *l);
                n++;
            }
    }
    if (n == 0)
        fprintf(out, "    {0, 0},\n");
    fprintf(out, "};\nconst size_t kt_unicode_n_contraction_folds = %u;\n", n);
}

int main(int argc, char **argv)
{
    const char *dir = argc > 1 ? argv[1] : "/usr/share/unicode";
    FILE *out = stdout;
    if (argc > 2 && !(out = fopen(argv[2], "w"))) {
        fprintf(stderr, "gen-unicode-tables: cannot write %s\n", argv[2]);
        return 1;
    }
    read_categories(dir);
    read_flag(dir, "PropList.txt", "White_Space", KT_UPROP_WHITE_SPACE);
    read_flag(dir, "Scripts.txt", "Han", KT_UPROP_HAN);
    read_bidi_spaces(dir);

    /* Deduplicate blocks. */
    static uint16_t stage1[N_CP / BLOCK];
    static uint32_t block_start[N_CP / BLOCK]; /* first code point of each unique block */
    unsigned n_blocks = 0;
    for (uint32_t b = 0; b < N_CP / BLOCK; b++) {
        unsigned k;
        for (k = 0; k < n_blocks; k++)
            if (memcmp(props + block_start[k], props + b * BLOCK, BLOCK) == 0)
                break;
        if (k == n_blocks)
            block_start[n_blocks++] = b * BLOCK;
        stage1[b] = (uint16_t)k;
    }

    fprintf(out,
            "/*\n"
            " * unicode_tables.c - Unicode 15.0 property bytes for every code point\n"
            " * (general category, White_Space, Script=Han, Python isspace) and the\n"
            " * case foldings onto the contraction letters; see unicode.h.\n"
            " *\n"
            " * GENERATED by tools/gen-unicode-tables.c from Debian's unicode-data files:\n"
            " * never edit by hand, regenerate (ninja unicode-tables).\n"
            " */\n"
            "#include \"unicode.h\"\n\n");
    fprintf(out, "const uint16_t kt_unicode_stage1[%u] = {\n", N_CP / BLOCK);
    for (uint32_t b = 0; b < N_CP / BLOCK; b++)
        fprintf(out, "%s%u,%s", b % 16 ? " " : "    ", stage1[b], b % 16 == 15 ? "\n" : "");
    fprintf(out, "};\n\n");
    fprintf(out, "/* %u unique blocks of %u code points */\n", n_blocks, BLOCK);
    fprintf(out, "const uint8_t kt_unicode_stage2[%u] = {\n", n_blocks * BLOCK);
    for (unsigned k = 0; k < n_blocks; k++)
        for (uint32_t i = 0; i < BLOCK; i++)
            fprintf(out, "%s0x%02x,%s", i % 16 ? " " : "    ", props[block_start[k] + i], i % 16 == 15 ? "\n" : "");
    fprintf(out, "};\n\n");
    write_folds(dir, out);
    if (out != stdout && fclose(out) != 0) {
        fprintf(stderr, "gen-unicode-tables: write failed\n");
        return 1;
    }
    return 0;
}
