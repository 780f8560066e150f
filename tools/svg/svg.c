/*
 * svg.c - the pictures of svg.h: a growable text buffer, XML escaping, a
 * hot-to-cold colour ramp, axis ticks, and the three layouts.
 *
 * Geometry is in whole pixels so cells sit on the pixel grid; every size
 * adapts to the data (a 4 x 32 map gets big cells, 61 x 384 small ones).
 * Nothing here prints or touches the file system but through
 * kt_write_file_atomic at the end.
 */
#include "svg.h"

#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "small_file.h"

/* ---- text buffer ------------------------------------------------------------------ */

struct sbuf {
    char *p;
    size_t len, cap;
    bool failed; /* an allocation failed: the text is incomplete */
};

static void sb_reserve(struct sbuf *b, size_t more)
{
    if (b->failed || b->len + more + 1 <= b->cap)
        return;
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->len + more + 1)
        cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) {
        b->failed = true;
        return;
    }
    b->p = p;
    b->cap = cap;
}

static void sb_printf(struct sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(struct sbuf *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char small[256];
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n < 0) {
        b->failed = true;
        return;
    }
    sb_reserve(b, (size_t)n);
    if (b->failed)
        return;
    if ((size_t)n < sizeof small) {
        memcpy(b->p + b->len, small, (size_t)n + 1);
    } else {
        va_start(ap, fmt);
        vsnprintf(b->p + b->len, (size_t)n + 1, fmt, ap);
        va_end(ap);
    }
    b->len += (size_t)n;
}

/* Appends s XML-escaped (text and attribute values alike).  Control
 * characters XML 1.0 forbids become U+FFFD's stand-in '?'. */
static void sb_text(struct sbuf *b, const char *s)
{
    for (; s && *s; s++) {
        unsigned char c = (unsigned char)*s;
        switch (c) {
        case '&': sb_printf(b, "&amp;"); break;
        case '<': sb_printf(b, "&lt;"); break;
        case '>': sb_printf(b, "&gt;"); break;
        case '"': sb_printf(b, "&quot;"); break;
        case '\'': sb_printf(b, "&apos;"); break;
        default: sb_printf(b, "%c", c < 0x20 && c != '\t' && c != '\n' && c != '\r' ? '?' : (char)c); break;
        }
    }
}

static kt_status sb_write(struct sbuf *b, const char *path, kt_err *err)
{
    kt_status s = b->failed ? kt_err_set(err, KT_ERR_NOMEM, "%s: out of memory drawing the picture", path)
                            : kt_write_file_atomic(path, b->p, b->len, err);
    free(b->p);
    return s;
}

/* ---- checks and labels ------------------------------------------------------------- */

/* A row label format: exactly one "%u", any "%%", no other conversion. */
static kt_status check_label_fmt(const char *path, const char *fmt, kt_err *err)
{
    if (!fmt)
        return kt_err_set(err, KT_ERR_INVALID, "%s: no row label format", path);
    int n_u = 0;
    for (const char *p = fmt; *p; p++) {
        if (*p != '%')
            continue;
        if (p[1] == '%') {
            p++;
        } else if (p[1] == 'u') {
            n_u++;
            p++;
        } else {
            return kt_err_set(err, KT_ERR_INVALID, "%s: row label format '%s' may hold only %%u and %%%%", path, fmt);
        }
    }
    if (n_u != 1)
        return kt_err_set(err, KT_ERR_INVALID, "%s: row label format '%s' needs exactly one %%u", path, fmt);
    return KT_OK;
}

/* Appends the escaped label of row `row` (fmt checked by check_label_fmt). */
static void sb_row_label(struct sbuf *b, const char *fmt, uint32_t row)
{
    char one[2] = {0};
    for (const char *p = fmt; *p; p++) {
        if (*p == '%' && p[1] == 'u') {
            sb_printf(b, "%u", row);
            p++;
        } else {
            if (*p == '%' && p[1] == '%')
                p++;
            one[0] = *p;
            sb_text(b, one);
        }
    }
}

static kt_status check_values(const char *path, const char *what, const double *v, size_t n, bool nan_ok,
                              double *max, kt_err *err)
{
    *max = 0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(v[i]) && nan_ok)
            continue;
        if (!(v[i] >= 0) || isinf(v[i]))
            return kt_err_set(err, KT_ERR_INVALID, "%s: %s value %zu is %g; values must be finite and >= 0", path,
                              what, i, v[i]);
        *max = v[i] > *max ? v[i] : *max;
    }
    return KT_OK;
}

/* ---- colours ---------------------------------------------------------------------- */

/* ColorBrewer's RdYlBu, cold (blue) to hot (red). */
static const unsigned char ramp[][3] = {
    {0x31, 0x36, 0x95}, {0x45, 0x75, 0xb4}, {0x74, 0xad, 0xd1}, {0xab, 0xd9, 0xe9}, {0xfe, 0xe0, 0x90},
    {0xfd, 0xae, 0x61}, {0xf4, 0x6d, 0x43}, {0xd7, 0x30, 0x27}, {0xa5, 0x00, 0x26},
};
#define RAMP_STOPS (sizeof ramp / sizeof ramp[0])

/* "#rrggbb" of t in [0, 1] on the ramp (t = 0 and 1 give its ends exactly). */
static void ramp_color(double t, char out[8])
{
    t = t < 0 ? 0 : t > 1 ? 1 : t;
    double x = t * (RAMP_STOPS - 1);
    size_t i = (size_t)x;
    if (i >= RAMP_STOPS - 1)
        i = RAMP_STOPS - 2;
    double f = x - (double)i;
    int rgb[3];
    for (int c = 0; c < 3; c++)
        rgb[c] = (int)lround(ramp[i][c] + f * (ramp[i + 1][c] - ramp[i][c]));
    snprintf(out, 8, "#%02x%02x%02x", rgb[0], rgb[1], rgb[2]);
}

static const char *const categories[KT_SVG_MAX_CATEGORIES] = {
    "#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac",
};

const char *kt_svg_category_color(uint32_t i)
{
    return categories[i % KT_SVG_MAX_CATEGORIES];
}

/* ---- layout helpers ---------------------------------------------------------------- */

static uint32_t clamp_u(double x, uint32_t lo, uint32_t hi)
{
    return x < lo ? lo : x > hi ? hi : (uint32_t)x;
}

/* A round tick step (1, 2 or 5 times a power of ten) giving about n ticks up to max. */
static double tick_step(double max, int n)
{
    if (!(max > 0))
        return 1;
    double raw = max / n, p = pow(10, floor(log10(raw)));
    double m = raw / p;
    return (m <= 1 ? 1 : m <= 2 ? 2 : m <= 5 ? 5 : 10) * p;
}

static void sb_header(struct sbuf *b, uint32_t width, uint32_t height, const char *title)
{
    sb_printf(b, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
                 "<svg xmlns=\"http://www.w3.org/2000/svg\" version=\"1.1\" width=\"%u\" height=\"%u\" "
                 "viewBox=\"0 0 %u %u\" font-family=\"sans-serif\" font-size=\"11\">\n",
              width, height, width, height);
    sb_printf(b, "<title>");
    sb_text(b, title ? title : "");
    sb_printf(b, "</title>\n<rect width=\"%u\" height=\"%u\" fill=\"#ffffff\"/>\n", width, height);
    sb_printf(b, "<text x=\"10\" y=\"20\" font-size=\"15\" font-weight=\"bold\">");
    sb_text(b, title ? title : "");
    sb_printf(b, "</text>\n");
}

/* Rows are labelled every `every` rows so labels never overlap. */
static uint32_t label_every(uint32_t row_h)
{
    return row_h >= 10 ? 1 : (10 + row_h - 1) / row_h;
}

static void sb_row_labels(struct sbuf *b, const char *fmt, uint32_t n_rows, uint32_t x_right, uint32_t y0,
                          uint32_t row_h)
{
    uint32_t every = label_every(row_h), size = row_h < 11 ? (row_h < 9 ? 9 : row_h) : 11;
    sb_printf(b, "<g font-size=\"%u\" text-anchor=\"end\">\n", size);
    for (uint32_t r = 0; r < n_rows; r += every) {
        sb_printf(b, "<text x=\"%u\" y=\"%u\">", x_right, y0 + r * row_h + row_h / 2 + size / 2 - 1);
        sb_row_label(b, fmt, r);
        sb_printf(b, "</text>\n");
    }
    sb_printf(b, "</g>\n");
}

/* Column numbers every power-of-two-ish step above the grid, and the axis title. */
static void sb_col_axis(struct sbuf *b, const char *label, uint32_t n_cols, uint32_t x0, uint32_t y, uint32_t cell_w)
{
    uint32_t step = 1;
    while (step * cell_w < 28)
        step *= 2;
    sb_printf(b, "<g font-size=\"9\" text-anchor=\"middle\" fill=\"#444444\">\n");
    for (uint32_t c = 0; c < n_cols; c += step)
        sb_printf(b, "<text x=\"%u\" y=\"%u\">%u</text>\n", x0 + c * cell_w + cell_w / 2, y, c);
    sb_printf(b, "</g>\n<text x=\"%u\" y=\"%u\" text-anchor=\"middle\">", x0 + n_cols * cell_w / 2, y - 13);
    sb_text(b, label ? label : "");
    sb_printf(b, "</text>\n");
}

/* A horizontal value axis from x0 (0) to x0 + w (max) at y, with ticks and a unit. */
static void sb_value_axis(struct sbuf *b, double max, uint32_t x0, uint32_t w, uint32_t y, uint32_t grid_bottom,
                          const char *unit)
{
    double step = tick_step(max, 4);
    sb_printf(b, "<g font-size=\"9\" text-anchor=\"middle\" fill=\"#444444\">\n");
    for (double v = 0; max > 0 && v <= max * (1 + 1e-9); v += step) {
        double x = x0 + w * v / max;
        sb_printf(b, "<line x1=\"%.1f\" y1=\"%u\" x2=\"%.1f\" y2=\"%u\" stroke=\"#e0e0e0\"/>", x, y + 3, x, grid_bottom);
        sb_printf(b, "<text x=\"%.1f\" y=\"%u\">%g</text>\n", x, y, v);
    }
    sb_printf(b, "</g>\n<text x=\"%u\" y=\"%u\" text-anchor=\"middle\">", x0 + w / 2, y - 13);
    sb_text(b, unit ? unit : "");
    sb_printf(b, "</text>\n");
}

/* A legend of coloured squares and names, one per line from (x, y). */
static void sb_category_legend(struct sbuf *b, uint32_t x, uint32_t y, uint32_t n, const char *const *names,
                               const char *const *colors)
{
    sb_printf(b, "<g id=\"legend\">\n");
    for (uint32_t i = 0; i < n; i++) {
        sb_printf(b, "<rect x=\"%u\" y=\"%u\" width=\"12\" height=\"12\" fill=\"%s\"/>", x, y + 18 * i, colors[i]);
        sb_printf(b, "<text x=\"%u\" y=\"%u\">", x + 17, y + 18 * i + 10);
        sb_text(b, names && names[i] ? names[i] : "");
        sb_printf(b, "</text>\n");
    }
    sb_printf(b, "</g>\n");
}

/* ---- heat map ---------------------------------------------------------------------- */

#define TOOLTIP_MAX_CELLS 4096 /* <title> per cell below this; above it they would triple the file */

kt_status kt_svg_heatmap(const char *path, const char *title, uint32_t n_rows, uint32_t n_cols, const double *values,
                         const char *row_label_fmt, const char *col_label, kt_err *err)
{
    if (!path)
        return kt_err_set(err, KT_ERR_INVALID, "heat map: no output path");
    if (n_rows == 0 || n_cols == 0 || !values)
        return kt_err_set(err, KT_ERR_INVALID, "%s: a heat map needs at least one row and column of values", path);
    if ((uint64_t)n_rows * n_cols > (1u << 24))
        return kt_err_set(err, KT_ERR_INVALID, "%s: %u x %u cells are too many to draw", path, n_rows, n_cols);
    kt_status s = check_label_fmt(path, row_label_fmt, err);
    double max;
    if (s != KT_OK || (s = check_values(path, "heat map", values, (size_t)n_rows * n_cols, true, &max, err)) != KT_OK)
        return s;

    const uint32_t cell_w = clamp_u(1200.0 / n_cols, 2, 24), cell_h = clamp_u(720.0 / n_rows, 4, 24);
    const uint32_t x0 = 90, y0 = 62, grid_w = n_cols * cell_w, grid_h = n_rows * cell_h;
    const uint32_t legend_x = x0 + grid_w + 24, legend_h = grid_h < 200 ? (grid_h < 80 ? 80 : grid_h) : 200;
    const uint32_t width = legend_x + 90, height = y0 + (grid_h > legend_h + 30 ? grid_h : legend_h + 30) + 20;
    const bool tooltips = (uint64_t)n_rows * n_cols <= TOOLTIP_MAX_CELLS;
    struct sbuf b = {0};
    sb_header(&b, width, height, title);
    sb_col_axis(&b, col_label, n_cols, x0, y0 - 6, cell_w);
    sb_row_labels(&b, row_label_fmt, n_rows, x0 - 6, y0, cell_h);
    sb_printf(&b, "<g id=\"cells\">\n");
    for (uint32_t r = 0; r < n_rows; r++) {
        const double *row = values + (size_t)r * n_cols;
        bool has_data = false;
        for (uint32_t c = 0; c < n_cols; c++)
            has_data |= row[c] > 0;
        sb_printf(&b, "<g transform=\"translate(%u,%u)\">", x0, y0 + r * cell_h);
        for (uint32_t c = 0; c < n_cols; c++) {
            char fill[8];
            if (!has_data || isnan(row[c]))
                snprintf(fill, sizeof fill, "%s", KT_SVG_NO_DATA);
            else
                ramp_color(row[c] / max, fill);
            sb_printf(&b, "<rect x=\"%u\" width=\"%u\" height=\"%u\" fill=\"%s\"", c * cell_w, cell_w, cell_h, fill);
            if (tooltips) {
                sb_printf(&b, "><title>");
                sb_row_label(&b, row_label_fmt, r);
                sb_printf(&b, ", ");
                sb_text(&b, col_label ? col_label : "column");
                if (isnan(row[c]))
                    sb_printf(&b, " %u: no data</title></rect>", c);
                else
                    sb_printf(&b, " %u: %g</title></rect>", c, row[c]);
            } else {
                sb_printf(&b, "/>");
            }
        }
        sb_printf(&b, "</g>\n");
    }
    sb_printf(&b, "</g>\n");

    /* Legend: the ramp from cold (bottom) to hot (top), ticks at 0, half and the maximum. */
    sb_printf(&b, "<defs><linearGradient id=\"ramp\" x1=\"0\" y1=\"1\" x2=\"0\" y2=\"0\">");
    for (size_t i = 0; i < RAMP_STOPS; i++)
        sb_printf(&b, "<stop offset=\"%.4f\" stop-color=\"#%02x%02x%02x\"/>", (double)i / (RAMP_STOPS - 1), ramp[i][0],
                  ramp[i][1], ramp[i][2]);
    sb_printf(&b, "</linearGradient></defs>\n");
    sb_printf(&b, "<text x=\"%u\" y=\"%u\">hot</text>\n", legend_x, y0 - 6);
    sb_printf(&b, "<rect x=\"%u\" y=\"%u\" width=\"14\" height=\"%u\" fill=\"url(#ramp)\" stroke=\"#888888\"/>\n",
              legend_x, y0, legend_h);
    for (int i = 0; i <= 2; i++)
        sb_printf(&b, "<text x=\"%u\" y=\"%u\" font-size=\"9\">%.4g</text>\n", legend_x + 18,
                  y0 + legend_h - (uint32_t)(legend_h * i / 2) + (i == 0 ? 0 : i == 2 ? 8 : 4), max * i / 2);
    sb_printf(&b, "<rect x=\"%u\" y=\"%u\" width=\"14\" height=\"10\" fill=\"%s\"/>", legend_x, y0 + legend_h + 8,
              KT_SVG_NO_DATA);
    sb_printf(&b, "<text x=\"%u\" y=\"%u\" font-size=\"9\">no data</text>\n", legend_x + 18, y0 + legend_h + 17);
    sb_printf(&b, "</svg>\n");
    return sb_write(&b, path, err);
}

/* ---- plan -------------------------------------------------------------------------- */

struct ranked {
    double heat;
    uint32_t expert;
};

static int hottest_first(const void *a, const void *b)
{
    const struct ranked *x = a, *y = b;
    bool xn = isnan(x->heat), yn = isnan(y->heat);
    if (xn != yn)
        return xn ? 1 : -1;
    if (!xn && x->heat != y->heat)
        return x->heat > y->heat ? -1 : 1;
    return x->expert < y->expert ? -1 : x->expert > y->expert;
}

static kt_status check_plan(const char *path, const struct kt_svg_plan *p, double *max_time, kt_err *err)
{
    if (!p)
        return kt_err_set(err, KT_ERR_INVALID, "%s: no plan to draw", path);
    if (p->n_layers == 0 || p->n_experts == 0 || !p->place)
        return kt_err_set(err, KT_ERR_INVALID, "%s: a plan picture needs layers, experts and their places", path);
    if ((uint64_t)p->n_layers * p->n_experts > (1u << 24))
        return kt_err_set(err, KT_ERR_INVALID, "%s: %u x %u experts are too many to draw", path, p->n_layers,
                          p->n_experts);
    if (p->n_places == 0 || p->n_places > KT_SVG_MAX_CATEGORIES || !p->place_names)
        return kt_err_set(err, KT_ERR_INVALID, "%s: %u places; a plan picture shows 1 to %d, each named", path,
                          p->n_places, KT_SVG_MAX_CATEGORIES);
    if (p->n_devices > KT_SVG_MAX_CATEGORIES || (p->n_devices && (!p->device_names || !p->time)))
        return kt_err_set(err, KT_ERR_INVALID, "%s: %u devices; a plan picture shows 0 to %d, each named, with times",
                          path, p->n_devices, KT_SVG_MAX_CATEGORIES);
    kt_status s = check_label_fmt(path, p->row_label_fmt, err);
    if (s != KT_OK)
        return s;
    for (size_t i = 0; i < (size_t)p->n_layers * p->n_experts; i++)
        if (p->place[i] >= p->n_places && p->place[i] != KT_SVG_NO_PLACE)
            return kt_err_set(err, KT_ERR_INVALID, "%s: layer %zu expert %zu is in place %u of only %u", path,
                              i / p->n_experts, i % p->n_experts, p->place[i], p->n_places);
    double max_heat;
    if (p->heat &&
        (s = check_values(path, "heat", p->heat, (size_t)p->n_layers * p->n_experts, true, &max_heat, err)) != KT_OK)
        return s;
    *max_time = 0;
    if (p->n_devices)
        return check_values(path, "time", p->time, (size_t)p->n_layers * p->n_devices, false, max_time, err);
    return KT_OK;
}

kt_status kt_svg_plan(const char *path, const struct kt_svg_plan *p, kt_err *err)
{
    if (!path)
        return kt_err_set(err, KT_ERR_INVALID, "plan picture: no output path");
    double max_time = 0;
    kt_status s = check_plan(path, p, &max_time, err);
    if (s != KT_OK)
        return s;
    struct ranked *order = malloc(p->n_experts * sizeof *order);
    if (!order)
        return kt_err_set(err, KT_ERR_NOMEM, "%s: out of memory drawing the plan", path);

    const uint32_t L = p->n_layers, N = p->n_experts, D = p->n_devices;
    const uint32_t cell_w = clamp_u(900.0 / N, 2, 24), cell_h = clamp_u(720.0 / L, 4 > 2 * D ? 4 : 2 * D, 24);
    const uint32_t x0 = 90, y0 = 62, grid_w = N * cell_w, grid_h = L * cell_h;
    const uint32_t bars_x = x0 + grid_w + 30, bars_w = D ? 300 : 0;
    const uint32_t legend_x = bars_x + bars_w + (D ? 24 : 0);
    const uint32_t legend_h = 18 * (p->n_places + D + 2);
    const uint32_t width = legend_x + 150, height = y0 + (grid_h > legend_h ? grid_h : legend_h) + 20;
    struct sbuf b = {0};
    sb_header(&b, width, height, p->title);
    sb_col_axis(&b, p->heat ? "experts, hottest first" : "expert", N, x0, y0 - 6, cell_w);
    sb_row_labels(&b, p->row_label_fmt, L, x0 - 6, y0, cell_h);

    sb_printf(&b, "<g id=\"cells\">\n");
    for (uint32_t l = 0; l < L; l++) {
        for (uint32_t e = 0; e < N; e++)
            order[e] = (struct ranked){p->heat ? p->heat[(size_t)l * N + e] : 0, e};
        if (p->heat)
            qsort(order, N, sizeof *order, hottest_first);
        sb_printf(&b, "<g transform=\"translate(%u,%u)\">", x0, y0 + l * cell_h);
        for (uint32_t c = 0; c < N; c++) {
            uint8_t place = p->place[(size_t)l * N + order[c].expert];
            sb_printf(&b, "<rect x=\"%u\" width=\"%u\" height=\"%u\" fill=\"%s\"/>", c * cell_w, cell_w, cell_h,
                      place == KT_SVG_NO_PLACE ? KT_SVG_NO_DATA : categories[place]);
        }
        sb_printf(&b, "</g>\n");
    }
    sb_printf(&b, "</g>\n");

    const char *device_color[KT_SVG_MAX_CATEGORIES];
    for (uint32_t d = 0; d < D; d++) {
        device_color[d] = categories[d];
        for (uint32_t q = 0; q < p->n_places; q++)
            if (p->device_names[d] && p->place_names[q] && strcmp(p->device_names[d], p->place_names[q]) == 0)
                device_color[d] = categories[q];
    }
    if (D) {
        sb_value_axis(&b, max_time, bars_x, bars_w, y0 - 6, y0 + grid_h, p->time_label);
        const uint32_t bar_h = (cell_h - 1) / D;
        sb_printf(&b, "<g id=\"bars\">\n");
        for (uint32_t l = 0; l < L; l++)
            for (uint32_t d = 0; d < D; d++) {
                double t = p->time[(size_t)l * D + d], w = max_time > 0 ? bars_w * t / max_time : 0;
                sb_printf(&b, "<rect x=\"%u\" y=\"%u\" width=\"%.2f\" height=\"%u\" fill=\"%s\"><title>", bars_x,
                          y0 + l * cell_h + d * bar_h, w, bar_h, device_color[d]);
                sb_row_label(&b, p->row_label_fmt, l);
                sb_printf(&b, ", ");
                sb_text(&b, p->device_names[d]);
                sb_printf(&b, ": %g</title></rect>\n", t);
            }
        sb_printf(&b, "</g>\n");
    }

    const char *names[2 * KT_SVG_MAX_CATEGORIES + 1], *colors[2 * KT_SVG_MAX_CATEGORIES + 1];
    uint32_t n = 0;
    for (uint32_t q = 0; q < p->n_places; q++, n++) {
        names[n] = p->place_names[q];
        colors[n] = categories[q];
    }
    names[n] = "no place (dense)";
    colors[n++] = KT_SVG_NO_DATA;
    sb_printf(&b, "<text x=\"%u\" y=\"%u\" font-weight=\"bold\">expert homes</text>\n", legend_x, y0 + 4);
    sb_category_legend(&b, legend_x, y0 + 12, n, names, colors);
    if (D) {
        uint32_t y = y0 + 12 + 18 * n + 14;
        sb_printf(&b, "<text x=\"%u\" y=\"%u\" font-weight=\"bold\">time per device</text>\n", legend_x, y);
        sb_category_legend(&b, legend_x, y + 8, D, (const char *const *)p->device_names, device_color);
    }
    sb_printf(&b, "</svg>\n");
    free(order);
    return sb_write(&b, path, err);
}

/* ---- stacked bars ------------------------------------------------------------------ */

kt_status kt_svg_stacked_bars(const char *path, const char *title, uint32_t n_rows, uint32_t n_parts,
                              const double *values, const char *row_label_fmt, const char *const *part_names,
                              const char *value_label, kt_err *err)
{
    if (!path)
        return kt_err_set(err, KT_ERR_INVALID, "stacked bars: no output path");
    if (n_rows == 0 || n_rows > 65536 || !values)
        return kt_err_set(err, KT_ERR_INVALID, "%s: stacked bars need 1 to 65536 rows of values", path);
    if (n_parts == 0 || n_parts > KT_SVG_MAX_CATEGORIES || !part_names)
        return kt_err_set(err, KT_ERR_INVALID, "%s: %u parts; stacked bars show 1 to %d, each named", path, n_parts,
                          KT_SVG_MAX_CATEGORIES);
    double max_part, max = 0;
    kt_status s = check_label_fmt(path, row_label_fmt, err);
    if (s != KT_OK || (s = check_values(path, "bar", values, (size_t)n_rows * n_parts, false, &max_part, err)) != KT_OK)
        return s;
    for (uint32_t r = 0; r < n_rows; r++) {
        double sum = 0;
        for (uint32_t k = 0; k < n_parts; k++)
            sum += values[(size_t)r * n_parts + k];
        max = sum > max ? sum : max;
    }

    const uint32_t row_h = clamp_u(720.0 / n_rows, 4, 28), bar_h = row_h > 6 ? row_h - 2 : row_h;
    const uint32_t x0 = 90, y0 = 62, bars_w = 700, grid_h = n_rows * row_h;
    const uint32_t legend_x = x0 + bars_w + 70, legend_h = 18 * n_parts;
    const uint32_t width = legend_x + 160, height = y0 + (grid_h > legend_h ? grid_h : legend_h) + 20;
    struct sbuf b = {0};
    sb_header(&b, width, height, title);
    sb_value_axis(&b, max, x0, bars_w, y0 - 6, y0 + grid_h, value_label);
    sb_row_labels(&b, row_label_fmt, n_rows, x0 - 6, y0, row_h);
    sb_printf(&b, "<g id=\"bars\">\n");
    for (uint32_t r = 0; r < n_rows; r++) {
        double at = 0;
        for (uint32_t k = 0; k < n_parts; k++) {
            double v = values[(size_t)r * n_parts + k];
            if (v <= 0)
                continue;
            double x = x0 + bars_w * at / max, w = bars_w * v / max;
            sb_printf(&b, "<rect x=\"%.2f\" y=\"%u\" width=\"%.2f\" height=\"%u\" fill=\"%s\"><title>", x,
                      y0 + r * row_h + (row_h - bar_h) / 2, w, bar_h, categories[k]);
            sb_row_label(&b, row_label_fmt, r);
            sb_printf(&b, ", ");
            sb_text(&b, part_names[k] ? part_names[k] : "");
            sb_printf(&b, ": %g</title></rect>\n", v);
            at += v;
        }
        if (row_h >= 9 && at > 0)
            sb_printf(&b, "<text x=\"%.2f\" y=\"%u\" font-size=\"9\" fill=\"#444444\">%.3g</text>\n",
                      x0 + bars_w * at / max + 4, y0 + r * row_h + row_h / 2 + 3, at);
    }
    sb_printf(&b, "</g>\n");
    const char *colors[KT_SVG_MAX_CATEGORIES];
    for (uint32_t k = 0; k < n_parts; k++)
        colors[k] = categories[k];
    sb_category_legend(&b, legend_x, y0, n_parts, part_names, colors);
    sb_printf(&b, "</svg>\n");
    return sb_write(&b, path, err);
}
