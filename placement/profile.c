/*
 * profile.c - routing profiles to and from JSON (see profile.h).  Must never
 * trust a file's shape: every row is checked before anything is allocated
 * for it.
 */
#include "small_file.h"
#include "profile.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define PROFILE_MAX_FILE_BYTES (64u << 20)
#define PROFILE_MAX_DIM 65536u

void kt_profile_destroy(struct kt_profile *p)
{
    if (!p)
        return;
    free(p->counts[0]);
    free(p->counts[1]);
    free(p);
}

kt_status kt_profile_create(uint32_t n_layer, uint32_t n_expert, const struct kt_model_identity *id,
                            struct kt_profile **out, kt_err *err)
{
    *out = NULL;
    if (n_layer > PROFILE_MAX_DIM || n_expert > PROFILE_MAX_DIM)
        return kt_err_set(err, KT_ERR_INVALID, "profile of %u layers x %u experts is too large", n_layer, n_expert);
    struct kt_profile *p = calloc(1, sizeof *p);
    size_t cells = (size_t)n_layer * n_expert;
    double *decode = calloc(cells ? cells : 1, sizeof *decode), *prefill = calloc(cells ? cells : 1, sizeof *prefill);
    if (!p || !decode || !prefill) {
        free(p);
        free(decode);
        free(prefill);
        return kt_err_set(err, KT_ERR_NOMEM, "out of memory for a profile of %u x %u", n_layer, n_expert);
    }
    if (id)
        p->model = *id;
    p->n_layer = n_layer;
    p->n_expert = n_expert;
    p->counts[KT_PROFILE_DECODE] = decode;
    p->counts[KT_PROFILE_PREFILL] = prefill;
    *out = p;
    return KT_OK;
}

/* Checks the rows of layers and returns their common width (0: all empty). */
static kt_status row_width(json_t *layers, const char *name, uint32_t *width, kt_err *err)
{
    size_t w = 0, i;
    json_t *row;
    json_array_foreach(layers, i, row) {
        if (!json_is_array(row))
            return kt_err_set(err, KT_ERR_FORMAT, "%s: layers[%zu]: expected an array of token counts", name, i);
        size_t n = json_array_size(row);
        if (n == 0)
            continue;
        if (n > PROFILE_MAX_DIM)
            return kt_err_set(err, KT_ERR_FORMAT, "%s: layers[%zu]: %zu experts is too many", name, i, n);
        if (w && n != w)
            return kt_err_set(err, KT_ERR_FORMAT, "%s: layers[%zu]: %zu experts, but earlier rows have %zu", name,
                              i, n, w);
        w = n;
    }
    *width = (uint32_t)w;
    return KT_OK;
}

kt_status kt_profile_parse(const char *text, size_t len, const char *name, struct kt_profile **out, kt_err *err)
{
    *out = NULL;
    json_error_t jerr;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return kt_err_set(err, KT_ERR_FORMAT, "%s:%d:%d: %s", name, jerr.line, jerr.column, jerr.text);
    kt_status st = KT_OK;
    struct kt_profile *p = NULL;
    json_t *version = json_object_get(root, "version");
    json_t *model = json_object_get(root, "model");
    json_t *layers = json_object_get(root, "layers");
    const char *key;
    json_t *value;
    uint32_t width = 0;
    if (!json_is_object(root)) {
        st = kt_err_set(err, KT_ERR_FORMAT, "%s: expected a JSON object", name);
        goto done;
    }
    json_object_foreach(root, key, value) {
        if (strcmp(key, "version") && strcmp(key, "model") && strcmp(key, "layers")) {
            st = kt_err_set(err, KT_ERR_FORMAT, "%s: unknown key '%.64s' (known: version, model, layers)", name, key);
            goto done;
        }
    }
    if (!json_is_integer(version) || json_integer_value(version) != 1) {
        st = kt_err_set(err, KT_ERR_FORMAT, "%s: version: expected 1", name);
        goto done;
    }
    if (model && !json_is_string(model)) {
        st = kt_err_set(err, KT_ERR_FORMAT, "%s: model: expected a string", name);
        goto done;
    }
    if (!json_is_array(layers)) {
        st = kt_err_set(err, KT_ERR_FORMAT, "%s: layers: expected an array with one row per layer", name);
        goto done;
    }
    if (json_array_size(layers) > PROFILE_MAX_DIM) {
        st = kt_err_set(err, KT_ERR_FORMAT, "%s: layers: %zu rows is too many", name, json_array_size(layers));
        goto done;
    }
    if ((st = row_width(layers, name, &width, err)))
        goto done;
    if ((st = kt_profile_create((uint32_t)json_array_size(layers), width, NULL, &p, err)))
        goto done;
    snprintf(p->model.name, sizeof p->model.name, "%s", model ? json_string_value(model) : "");
    for (size_t i = 0; i < p->n_layer; i++) {
        json_t *row = json_array_get(layers, i);
        for (size_t j = 0; j < json_array_size(row); j++) {
            json_t *v = json_array_get(row, j);
            double t = json_is_number(v) ? json_number_value(v) : -1;
            if (!(t >= 0) || !isfinite(t)) {
                st = kt_err_set(err, KT_ERR_FORMAT, "%s: layers[%zu][%zu]: expected a non-negative number of tokens",
                                name, i, j);
                goto done;
            }
            p->counts[KT_PROFILE_DECODE][i * p->n_expert + j] = t;
        }
    }
done:
    json_decref(root);
    if (st) {
        kt_profile_destroy(p);
        return st;
    }
    *out = p;
    return KT_OK;
}

kt_status kt_profile_load(const char *path, struct kt_profile **out, kt_err *err)
{
    *out = NULL;
    char *text = NULL;
    size_t len = 0;
    kt_status st = kt_read_small_file(path, PROFILE_MAX_FILE_BYTES, &text, &len, err);
    if (st == KT_OK)
        st = kt_profile_parse(text, len, path, out, err);
    free(text);
    return st;
}

/* Whole counts as JSON integers, decayed ones as reals. */
static json_t *token_count(double t)
{
    return t == floor(t) && t < 9007199254740992.0 ? json_integer((json_int_t)t) : json_real(t);
}

kt_status kt_profile_save(const struct kt_profile *p, const char *path, kt_err *err)
{
    kt_status st = KT_OK;
    json_t *root = json_object(), *layers = json_array();
    bool ok = root && layers && json_object_set_new(root, "version", json_integer(1)) == 0 &&
              json_object_set_new(root, "model", json_string(p->model.name)) == 0;
    for (uint32_t il = 0; ok && il < p->n_layer; il++) {
        json_t *row = json_array();
        ok = row && json_array_append_new(layers, row) == 0;
        for (uint32_t x = 0; ok && x < p->n_expert; x++)
            ok = json_array_append_new(row, token_count(kt_profile_count(p, il, x))) == 0;
    }
    ok = ok && json_object_set(root, "layers", layers) == 0;
    if (!ok)
        st = kt_err_set(err, KT_ERR_NOMEM, "%s: out of memory building the profile", path);
    else if (json_dump_file(root, path, JSON_COMPACT | JSON_REAL_PRECISION(17)) != 0)
        st = kt_err_set(err, KT_ERR_IO, "%s: cannot write: %s", path, strerror(errno));
    json_decref(layers);
    json_decref(root);
    return st;
}

double kt_profile_count(const struct kt_profile *p, uint32_t il, uint32_t x)
{
    if (!p->n_expert || il >= p->n_layer || x >= p->n_expert)
        return 0;
    size_t i = (size_t)il * p->n_expert + x;
    return p->counts[KT_PROFILE_DECODE][i] + p->counts[KT_PROFILE_PREFILL][i];
}
