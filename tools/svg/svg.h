/*
 * svg.h - kt's pictures: standalone SVG 1.1 files drawn from plain arrays,
 * for people who would rather look than read (`kt-bench profile --svg`,
 * `kt-place --svg`, `kt-bench model --svg`).
 *
 * Each entry point checks its data (a clear message, nothing written, on a
 * negative, infinite or out-of-range value), builds the whole text in
 * memory and writes it atomically (kt_write_file_atomic).  Text is
 * XML-escaped; numbers are written in the C locale.  One rect per cell or
 * bar segment, so a 61 x 384 heat map is ~1 MB.  Never prints.
 *
 * Row labels come from a format with one "%u" (the row index; "%%" for a
 * percent sign), e.g. "layer %u".
 */
#ifndef KT_SVG_H
#define KT_SVG_H

#include <stdint.h>

#include "status.h"

/* Colours of the hot-to-cold scale at its ends (the heat map's coldest
 * and hottest cells carry exactly these fills). */
#define KT_SVG_COLD "#313695"
#define KT_SVG_HOT "#a50026"
#define KT_SVG_NO_DATA "#d9d9d9"
/* Most places / devices / parts a picture can colour apart. */
#define KT_SVG_MAX_CATEGORIES 10
/* A plan cell with no place (a dense layer's experts). */
#define KT_SVG_NO_PLACE 255

/* The fill of category i (places, devices, parts): "#rrggbb". */
const char *kt_svg_category_color(uint32_t i);

/* Layers x experts heat map: values (n_rows, n_cols) >= 0, NaN for no
 * value; colours on one linear scale from 0 (cold) to the largest value
 * (hot), with a legend.  A row without a positive value (a dense layer, a
 * layer nothing was routed through) is drawn grey. */
kt_status kt_svg_heatmap(const char *path, const char *title, uint32_t n_rows, uint32_t n_cols, const double *values,
                         const char *row_label_fmt, const char *col_label, kt_err *err);

/* A placement: which place each layer's experts live in, and next to it
 * each layer's predicted time per device as horizontal bars. */
struct kt_svg_plan {
    const char *title;
    const char *row_label_fmt;       /* "layer %u" */
    uint32_t n_layers, n_experts;
    const uint8_t *place;            /* (n_layers, n_experts): index into place_names, or KT_SVG_NO_PLACE */
    uint32_t n_places;               /* 1 .. KT_SVG_MAX_CATEGORIES */
    const char *const *place_names;  /* [n_places] "cpu node 0", ..., "cuda" */
    const double *heat;              /* (n_layers, n_experts) or NULL: when given, each row's experts are
                                        drawn hottest first (ties by index) */
    uint32_t n_devices;              /* 0 .. KT_SVG_MAX_CATEGORIES; 0: no time panel */
    const char *const *device_names; /* [n_devices]; coloured like the place of the same name, else in order */
    const double *time;              /* (n_layers, n_devices) >= 0 */
    const char *time_label;          /* the unit of time, e.g. "predicted decode ms" */
};
kt_status kt_svg_plan(const char *path, const struct kt_svg_plan *plan, kt_err *err);

/* Per-row time split: one horizontal bar per row, values (n_rows, n_parts)
 * >= 0 stacked in part order (a zero part draws nothing), with a legend of
 * part_names and an axis in value_label ("ms"). */
kt_status kt_svg_stacked_bars(const char *path, const char *title, uint32_t n_rows, uint32_t n_parts,
                              const double *values, const char *row_label_fmt, const char *const *part_names,
                              const char *value_label, kt_err *err);

#endif
