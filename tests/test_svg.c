/*
 * test_svg.c - kt_svg's pictures are well-formed XML that draw exactly the
 * data they were given: one cell per (layer, expert), one bar per value, the
 * scale's ends at the smallest and largest values, text escaped; bad data
 * is refused with a message and nothing written.
 *
 * The SVG is read back with a small XML parser written here (elements nest,
 * attributes are quoted and unique, entities are the five predefined ones
 * or character references), independent of the writer.
 */
#include "svg.h"
#include "testlib.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- a small XML parser ----------------------------------------------------------------- */

#define MAX_ATTRS 16

struct xml_elem {
    char name[32];
    int parent;               /* index of the parent element, -1 for the root */
    int n_attrs;
    char *attr_name[MAX_ATTRS], *attr_value[MAX_ATTRS]; /* decoded */
    char *text;               /* decoded character data directly inside, concatenated */
};

struct xml_doc {
    struct xml_elem *elems;
    int n, cap;
    char error[160];
};

static void xml_free(struct xml_doc *d)
{
    for (int i = 0; i < d->n; i++) {
        for (int a = 0; a < d->elems[i].n_attrs; a++) {
            free(d->elems[i].attr_name[a]);
            free(d->elems[i].attr_value[a]);
        }
        free(d->elems[i].text);
    }
    free(d->elems);
    memset(d, 0, sizeof *d);
}

static bool is_name_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_' ||
           c == ':' || c == '.';
}

/* Decodes s[0..n) (text or an attribute value) into a malloc'd string;
 * false for '<', a bare '&' or an unknown entity. */
static bool decode(const char *s, size_t n, char **out)
{
    char *o = malloc(n + 1);
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] == '<') {
            free(o);
            return false;
        }
        if (s[i] != '&') {
            o[k++] = s[i];
            continue;
        }
        const char *semi = memchr(s + i, ';', n - i);
        if (!semi) {
            free(o);
            return false;
        }
        size_t len = (size_t)(semi - (s + i)) + 1;
        static const char *const ents[][2] = {{"&amp;", "&"}, {"&lt;", "<"}, {"&gt;", ">"}, {"&quot;", "\""},
                                              {"&apos;", "'"}};
        bool ok = false;
        for (size_t e = 0; e < 5 && !ok; e++)
            if (strlen(ents[e][0]) == len && memcmp(s + i, ents[e][0], len) == 0) {
                o[k++] = ents[e][1][0];
                ok = true;
            }
        if (!ok && len > 3 && s[i + 1] == '#') { /* &#N; or &#xH; (ASCII only here) */
            char *end;
            long v = s[i + 2] == 'x' ? strtol(s + i + 3, &end, 16) : strtol(s + i + 2, &end, 10);
            ok = end == semi && v > 0 && v < 128;
            if (ok)
                o[k++] = (char)v;
        }
        if (!ok) {
            free(o);
            return false;
        }
        i += len - 1;
    }
    o[k] = 0;
    *out = o;
    return true;
}

static bool fail(struct xml_doc *d, const char *s, const char *at, const char *what)
{
    snprintf(d->error, sizeof d->error, "offset %ld: %s", (long)(at - s), what);
    return false;
}

static void append_text(struct xml_elem *e, const char *t)
{
    size_t old = e->text ? strlen(e->text) : 0, add = strlen(t);
    e->text = realloc(e->text, old + add + 1);
    memcpy(e->text + old, t, add + 1);
}

/* Parses a whole document: optional <?xml ...?>, comments, exactly one root. */
static bool xml_parse(const char *s, struct xml_doc *d)
{
    memset(d, 0, sizeof *d);
    const char *p = s;
    int stack[256], depth = 0;
    bool root_done = false;
    if (strncmp(p, "<?xml", 5) == 0) {
        const char *end = strstr(p, "?>");
        if (!end)
            return fail(d, s, p, "unterminated XML declaration");
        p = end + 2;
    }
    while (*p) {
        if (*p != '<') { /* character data */
            const char *lt = strchr(p, '<');
            size_t n = lt ? (size_t)(lt - p) : strlen(p);
            char *t;
            if (!decode(p, n, &t))
                return fail(d, s, p, "bad character data or entity");
            bool blank = strspn(t, " \t\r\n") == strlen(t);
            if (depth == 0 && !blank) {
                free(t);
                return fail(d, s, p, "text outside the root element");
            }
            if (depth > 0)
                append_text(&d->elems[stack[depth - 1]], t);
            free(t);
            p += n;
            continue;
        }
        if (strncmp(p, "<!--", 4) == 0) {
            const char *end = strstr(p + 4, "-->");
            if (!end)
                return fail(d, s, p, "unterminated comment");
            p = end + 3;
            continue;
        }
        if (p[1] == '/') { /* end tag */
            const char *q = p + 2;
            size_t n = 0;
            while (is_name_char(q[n]))
                n++;
            if (depth == 0)
                return fail(d, s, p, "end tag without a start tag");
            const struct xml_elem *open = &d->elems[stack[depth - 1]];
            if (strlen(open->name) != n || memcmp(open->name, q, n) != 0)
                return fail(d, s, p, "end tag does not match the open element");
            q += n;
            while (*q == ' ' || *q == '\n')
                q++;
            if (*q != '>')
                return fail(d, s, q, "end tag not closed");
            p = q + 1;
            if (--depth == 0)
                root_done = true;
            continue;
        }
        /* start tag */
        if (root_done)
            return fail(d, s, p, "a second root element");
        const char *q = p + 1;
        size_t n = 0;
        while (is_name_char(q[n]))
            n++;
        if (n == 0 || n >= sizeof d->elems[0].name)
            return fail(d, s, p, "bad element name");
        if (d->n == d->cap) {
            d->cap = d->cap ? 2 * d->cap : 1024;
            d->elems = realloc(d->elems, (size_t)d->cap * sizeof *d->elems);
        }
        struct xml_elem *e = &d->elems[d->n];
        memset(e, 0, sizeof *e);
        memcpy(e->name, q, n);
        e->parent = depth ? stack[depth - 1] : -1;
        int index = d->n++;
        q += n;
        for (;;) {
            const char *ws = q;
            while (*q == ' ' || *q == '\n' || *q == '\t' || *q == '\r')
                q++;
            if (*q == '>' || (q[0] == '/' && q[1] == '>'))
                break;
            if (q == ws)
                return fail(d, s, q, "attributes must be separated by white space");
            size_t an = 0;
            while (is_name_char(q[an]))
                an++;
            if (an == 0 || q[an] != '=' || (q[an + 1] != '"' && q[an + 1] != '\''))
                return fail(d, s, q, "attribute without a quoted value");
            char quote = q[an + 1];
            const char *v = q + an + 2, *vend = strchr(v, quote);
            if (!vend)
                return fail(d, s, q, "unterminated attribute value");
            if (e->n_attrs == MAX_ATTRS)
                return fail(d, s, q, "too many attributes");
            char *name = strndup(q, an), *value;
            for (int a = 0; a < e->n_attrs; a++)
                if (strcmp(e->attr_name[a], name) == 0) {
                    free(name);
                    return fail(d, s, q, "duplicate attribute");
                }
            if (!decode(v, (size_t)(vend - v), &value)) {
                free(name);
                return fail(d, s, v, "bad attribute value or entity");
            }
            e->attr_name[e->n_attrs] = name;
            e->attr_value[e->n_attrs++] = value;
            q = vend + 1;
        }
        if (*q == '/') {
            p = q + 2;
            if (depth == 0)
                root_done = true;
        } else {
            if (depth == 256)
                return fail(d, s, q, "nesting too deep");
            stack[depth++] = index;
            p = q + 1;
        }
    }
    if (depth != 0)
        return fail(d, s, p, "unclosed element at the end");
    if (!root_done)
        return fail(d, s, p, "no root element");
    return true;
}

static const char *attr(const struct xml_elem *e, const char *name)
{
    for (int a = 0; a < e->n_attrs; a++)
        if (strcmp(e->attr_name[a], name) == 0)
            return e->attr_value[a];
    return NULL;
}

/* Index of the element with id `id`, or -1. */
static int by_id(const struct xml_doc *d, const char *id)
{
    for (int i = 0; i < d->n; i++) {
        const char *v = attr(&d->elems[i], "id");
        if (v && strcmp(v, id) == 0)
            return i;
    }
    return -1;
}

static bool inside(const struct xml_doc *d, int i, int ancestor)
{
    for (int p = d->elems[i].parent; p >= 0; p = d->elems[p].parent)
        if (p == ancestor)
            return true;
    return false;
}

/* The rects under the element with id `id`, in document order (at most max). */
static int rects_under(const struct xml_doc *d, const char *id, const struct xml_elem **out, int max)
{
    int g = by_id(d, id), n = 0;
    for (int i = 0; g >= 0 && i < d->n; i++)
        if (strcmp(d->elems[i].name, "rect") == 0 && inside(d, i, g)) {
            if (n < max)
                out[n] = &d->elems[i];
            n++;
        }
    return n;
}

/* Reads and parses a picture; checks the root is an SVG 1.1 <svg>. */
static bool load_svg(const char *path, struct xml_doc *d, size_t *bytes)
{
    size_t n = 0;
    char *text = kt_test_read_file(path, &n);
    KT_CHECK(text != NULL, "cannot read %s", path);
    if (!text)
        return false;
    char *z = realloc(text, n + 1);
    z[n] = 0;
    bool ok = xml_parse(z, d);
    KT_CHECK(ok, "%s is not well-formed: %s", path, d->error);
    free(z);
    if (bytes)
        *bytes = n;
    if (ok) {
        const char *xmlns = attr(&d->elems[0], "xmlns"), *version = attr(&d->elems[0], "version");
        KT_CHECK(strcmp(d->elems[0].name, "svg") == 0 && xmlns && strcmp(xmlns, "http://www.w3.org/2000/svg") == 0 &&
                     version && strcmp(version, "1.1") == 0,
                 "%s: root is <%s>, not an SVG 1.1 <svg>", path, d->elems[0].name);
    }
    return ok;
}

static bool file_exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

/* ---- the parser itself ------------------------------------------------------------------ */

static void parser_rejects_malformed_xml(void)
{
    static const char *const bad[] = {
        "<svg><g></svg></g>",          "<svg a=1/>",         "<svg a=\"1\" a=\"2\"/>", "<svg>&nbsp;</svg>",
        "<svg>a & b</svg>",            "<svg><g></svg>",     "<svg/><svg/>",           "<svg a=\"<\"/>",
        "<svg>x</svg>trailing",        "<svg a=\"1\"b=\"2\"/>",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        struct xml_doc d;
        KT_CHECK(!xml_parse(bad[i], &d), "accepted malformed '%s'", bad[i]);
        xml_free(&d);
    }
    struct xml_doc d;
    bool ok = xml_parse("<?xml version=\"1.0\"?>\n<svg x='1'><!-- c --><t>a &amp; &#60;b&#x3e;</t><r/></svg>\n", &d);
    KT_CHECK(ok && d.n == 3 && strcmp(d.elems[1].text, "a & <b>") == 0, "a well-formed document: %s", d.error);
    xml_free(&d);
}

/* ---- heat map ----------------------------------------------------------------------------- */

static void heatmap_draws_every_cell_on_the_scale(void)
{
    enum { R = 4, C = 32 };
    double v[R * C];
    for (int c = 0; c < C; c++) {
        v[0 * C + c] = 0;                       /* a dense layer: no data */
        v[1 * C + c] = c;                        /* 0 .. 31: the scale's ends */
        v[2 * C + c] = c == 5 ? NAN : 10 + c % 7; /* one missing value */
        v[3 * C + c] = (c * 37) % 11;
    }
    const char *path = kt_test_path("heat.svg");
    const char *title = "routing <decode> & \"prefill\"";
    kt_err err = {0};
    KT_CHECK(kt_svg_heatmap(path, title, R, C, v, "layer %u", "expert", &err) == KT_OK, "%s", err.msg);
    struct xml_doc d;
    if (load_svg(path, &d, NULL)) {
        const struct xml_elem *cells[R * C];
        int n = rects_under(&d, "cells", cells, R * C);
        KT_CHECK(n == R * C, "%d cells for %d values", n, R * C);
        if (n == R * C) {
            for (int c = 0; c < C; c++)
                KT_CHECK(strcmp(attr(cells[c], "fill"), KT_SVG_NO_DATA) == 0, "dense row cell %d is %s", c,
                         attr(cells[c], "fill"));
            KT_CHECK(strcmp(attr(cells[C + 0], "fill"), KT_SVG_COLD) == 0, "value 0 is %s, want %s",
                     attr(cells[C], "fill"), KT_SVG_COLD);
            KT_CHECK(strcmp(attr(cells[C + 31], "fill"), KT_SVG_HOT) == 0, "the largest value is %s, want %s",
                     attr(cells[C + 31], "fill"), KT_SVG_HOT);
            KT_CHECK(strcmp(attr(cells[C + 15], "fill"), KT_SVG_HOT) != 0 &&
                         strcmp(attr(cells[C + 15], "fill"), KT_SVG_COLD) != 0,
                     "a middle value is at an end of the scale");
            KT_CHECK(strcmp(attr(cells[2 * C + 5], "fill"), KT_SVG_NO_DATA) == 0, "a NaN cell is %s",
                     attr(cells[2 * C + 5], "fill"));
            /* Equal values, equal colours. */
            KT_CHECK(strcmp(attr(cells[2 * C + 0], "fill"), attr(cells[2 * C + 7], "fill")) == 0,
                     "equal values, different colours");
        }
        /* The title reads back exactly: it was escaped. */
        bool found = false;
        for (int i = 0; i < d.n; i++)
            found |= strcmp(d.elems[i].name, "title") == 0 && d.elems[i].text && strcmp(d.elems[i].text, title) == 0;
        KT_CHECK(found, "the title does not read back as written");
        xml_free(&d);
    }
    unlink(path);
}

static void heatmap_of_kimi_k2_shape_stays_small(void)
{
    enum { R = 61, C = 384 };
    double *v = kt_test_xmalloc(R * C * sizeof *v);
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++)
            v[r * C + c] = r == 0 ? 0 : 1000.0 / (1 + (c * 7 + r) % C);
    const char *path = kt_test_path("kimi.svg");
    kt_err err = {0};
    KT_CHECK(kt_svg_heatmap(path, "Kimi-K2 routing", R, C, v, "layer %u", "expert", &err) == KT_OK, "%s", err.msg);
    struct xml_doc d;
    size_t bytes = 0;
    if (load_svg(path, &d, &bytes)) {
        int n = rects_under(&d, "cells", NULL, 0);
        KT_CHECK(n == R * C, "%d cells for %d values", n, R * C);
        printf("  61 x 384 heat map: %zu bytes\n", bytes);
        KT_CHECK(bytes < 2u << 20, "%zu bytes", bytes);
        xml_free(&d);
    }
    unlink(path);
    free(v);
}

/* ---- plan ---------------------------------------------------------------------------------- */

static void plan_draws_homes_sorted_and_times_to_scale(void)
{
    enum { L = 3, N = 8, D = 3 };
    uint8_t place[L * N];
    double heat[L * N], time[L * D] = {0, 0, 0, 2.0, 1.0, 4.0, 1.5, 1.5, 3.0};
    const char *places[] = {"cpu node 0", "cpu node 1", "cuda"};
    const char *devices[] = {"cpu node 0", "cpu node 1", "cuda"};
    for (int l = 0; l < L; l++)
        for (int e = 0; e < N; e++) {
            place[l * N + e] = l == 0 ? KT_SVG_NO_PLACE : (uint8_t)(e % 2);
            heat[l * N + e] = e;
        }
    place[1 * N + 7] = 2; /* layer 1's hottest expert is on the device */
    place[2 * N + 3] = 2;
    struct kt_svg_plan p = {
        .title = "plan", .row_label_fmt = "layer %u", .n_layers = L, .n_experts = N, .place = place,
        .n_places = 3, .place_names = places, .heat = heat, .n_devices = D, .device_names = devices, .time = time,
        .time_label = "predicted decode ms",
    };
    const char *path = kt_test_path("plan.svg");
    kt_err err = {0};
    KT_CHECK(kt_svg_plan(path, &p, &err) == KT_OK, "%s", err.msg);
    struct xml_doc d;
    if (load_svg(path, &d, NULL)) {
        const struct xml_elem *cells[L * N], *bars[L * D];
        int nc = rects_under(&d, "cells", cells, L * N), nb = rects_under(&d, "bars", bars, L * D);
        KT_CHECK(nc == L * N && nb == L * D, "%d cells, %d bars", nc, nb);
        if (nc == L * N && nb == L * D) {
            KT_CHECK(strcmp(attr(cells[0], "fill"), KT_SVG_NO_DATA) == 0, "a dense layer's expert has a home");
            /* Hottest first: layer 1's first cell is expert 7 (the device), layer 2's fifth is expert 3. */
            KT_CHECK(strcmp(attr(cells[N], "fill"), kt_svg_category_color(2)) == 0, "layer 1 first cell %s",
                     attr(cells[N], "fill"));
            KT_CHECK(strcmp(attr(cells[2 * N + 4], "fill"), kt_svg_category_color(2)) == 0, "layer 2 fifth cell %s",
                     attr(cells[2 * N + 4], "fill"));
            /* Bars to scale: 4.0 is the longest, 2.0 half of it, 0 nothing. */
            double w4 = atof(attr(bars[5], "width")), w2 = atof(attr(bars[3], "width"));
            KT_CHECK(w4 > 0 && fabs(w2 - w4 / 2) < 0.02 && atof(attr(bars[0], "width")) == 0, "bar widths %g %g",
                     w4, w2);
            KT_CHECK(strcmp(attr(bars[5], "fill"), kt_svg_category_color(2)) == 0, "the device's bar is coloured %s",
                     attr(bars[5], "fill"));
        }
        xml_free(&d);
    }
    unlink(path);
}

/* ---- stacked bars ------------------------------------------------------------------------- */

static void stacked_bars_draw_each_positive_part(void)
{
    enum { R = 3, P = 3 };
    double v[R * P] = {1, 2, 3, 0, 1.5, 0.5, 2, 2, 2};
    const char *parts[] = {"attention", "routed <experts>", "shared & dense"};
    const char *path = kt_test_path("bars.svg");
    kt_err err = {0};
    KT_CHECK(kt_svg_stacked_bars(path, "per-layer time", R, P, v, "layer %u", parts, "ms", &err) == KT_OK, "%s",
             err.msg);
    struct xml_doc d;
    if (load_svg(path, &d, NULL)) {
        const struct xml_elem *bars[R * P];
        int n = rects_under(&d, "bars", bars, R * P);
        KT_CHECK(n == 8, "%d bar segments for 8 positive values", n);
        if (n == 8) {
            KT_CHECK(strcmp(attr(bars[3], "fill"), kt_svg_category_color(1)) == 0, "row 1 starts with part 1");
            /* Rows 0 and 2 both total 6, the longest: their last segments end at the same x. */
            double end0 = atof(attr(bars[2], "x")) + atof(attr(bars[2], "width"));
            double end2 = atof(attr(bars[7], "x")) + atof(attr(bars[7], "width"));
            KT_CHECK(fabs(end0 - end2) < 0.02, "equal totals end at %g and %g", end0, end2);
        }
        int legend = by_id(&d, "legend"), names = 0;
        for (int i = 0; legend >= 0 && i < d.n; i++)
            names += strcmp(d.elems[i].name, "text") == 0 && inside(&d, i, legend) && d.elems[i].text &&
                     strcmp(d.elems[i].text, parts[1]) == 0;
        KT_CHECK(names == 1, "the legend names '%s' %d times", parts[1], names);
        xml_free(&d);
    }
    unlink(path);
}

/* ---- bad data ----------------------------------------------------------------------------- */

static void bad_data_is_refused_and_nothing_written(void)
{
    const char *path = kt_test_path("bad.svg");
    double neg[4] = {1, -1, 2, 3}, inf[4] = {1, INFINITY, 2, 3}, nan_bar[4] = {1, NAN, 2, 3}, ok[4] = {1, 2, 3, 4};
    const char *parts[] = {"a", "b"};
    kt_err err = {0};
    kt_status cases[] = {
        kt_svg_heatmap(path, "t", 2, 2, neg, "layer %u", "expert", &err),
        kt_svg_heatmap(path, "t", 2, 2, inf, "layer %u", "expert", &err),
        kt_svg_heatmap(path, "t", 2, 2, ok, "layer %s", "expert", &err),
        kt_svg_heatmap(path, "t", 2, 2, ok, "layer", "expert", &err),
        kt_svg_heatmap(path, "t", 0, 2, ok, "layer %u", "expert", &err),
        kt_svg_stacked_bars(path, "t", 2, 2, nan_bar, "layer %u", parts, "ms", &err),
        kt_svg_stacked_bars(path, "t", 2, 11, ok, "layer %u", parts, "ms", &err),
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        KT_CHECK(cases[i] == KT_ERR_INVALID, "case %zu accepted", i);
    uint8_t place[4] = {0, 1, 3, 0};
    const char *places[] = {"cpu", "cuda"};
    struct kt_svg_plan p = {.title = "t", .row_label_fmt = "layer %u", .n_layers = 2, .n_experts = 2,
                            .place = place, .n_places = 2, .place_names = places};
    KT_CHECK(kt_svg_plan(path, &p, &err) == KT_ERR_INVALID && strstr(err.msg, "place 3"), "place 3 of 2: %s",
             err.msg);
    KT_CHECK(strstr(err.msg, path) != NULL, "the message names the file: %s", err.msg);
    KT_CHECK(!file_exists(path), "a refused picture was written");
    /* An unwritable path: the error names it. */
    KT_CHECK(kt_svg_heatmap("/nonexistent-dir/x.svg", "t", 2, 2, ok, "layer %u", "e", &err) != KT_OK &&
                 strstr(err.msg, "/nonexistent-dir/x.svg"),
             "unwritable path: %s", err.msg);
}

int main(void)
{
    KT_RUN(parser_rejects_malformed_xml);
    KT_RUN(heatmap_draws_every_cell_on_the_scale);
    KT_RUN(heatmap_of_kimi_k2_shape_stays_small);
    KT_RUN(plan_draws_homes_sorted_and_times_to_scale);
    KT_RUN(stacked_bars_draw_each_positive_part);
    KT_RUN(bad_data_is_refused_and_nothing_written);
    return kt_test_finish();
}
