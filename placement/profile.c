/*
 * profile.c - routing profiles to and from JSON (see profile.h).  Must never
 * trust a file's shape: every row is checked before anything is allocated
 * for it, and every message names the file and the place in it.
 */
#include "small_file.h"
#include "profile.h"

#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PROFILE_MAX_FILE_BYTES (64u << 20)
#define PROFILE_MAX_DIM 65536u
#define PROFILE_MAX_CELLS (1u << 24) /* layers x experts: Kimi-K2 has 23424 */

static const char *const PHASE_NAME[KT_PROFILE_PHASES] = {"decode", "prefill"};

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
    if (n_layer > PROFILE_MAX_DIM || n_expert > PROFILE_MAX_DIM || (uint64_t)n_layer * n_expert > PROFILE_MAX_CELLS)
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

/* ---- reading ------------------------------------------------------------------------- */

/* Refuses any key of obj not in known (a NULL-terminated list); where: "" or "model: ". */
static kt_status known_keys(json_t *obj, const char *const *known, const char *name, const char *where, kt_err *err)
{
    const char *key;
    json_t *value;
    json_object_foreach(obj, key, value) {
        bool ok = false;
        for (const char *const *k = known; *k && !ok; k++)
            ok = strcmp(key, *k) == 0;
        if (!ok) {
            char list[256] = "";
            for (const char *const *k = known; *k; k++)
                snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", k == known ? "" : ", ", *k);
            return kt_err_set(err, KT_ERR_FORMAT, "%s: %sunknown key '%.64s' (known: %s)", name, where, key, list);
        }
    }
    return KT_OK;
}

/* A non-negative finite number (counts, token totals, the half-life). */
static bool amount(json_t *v, double *out)
{
    if (!json_is_number(v))
        return false;
    double t = json_number_value(v);
    if (!(t >= 0) || !isfinite(t))
        return false;
    *out = t;
    return true;
}

/* Checks the rows of one phase ("layers" in version 1) and returns their
 * common width (0: all empty); *width on entry: a width already seen (0: none). */
static kt_status row_width(json_t *rows, const char *name, const char *what, uint32_t *width, kt_err *err)
{
    size_t w = *width, i;
    json_t *row;
    json_array_foreach(rows, i, row) {
        if (!json_is_array(row))
            return kt_err_set(err, KT_ERR_FORMAT, "%s: %s[%zu]: expected an array of token counts", name, what, i);
        size_t n = json_array_size(row);
        if (n == 0)
            continue;
        if (n > PROFILE_MAX_DIM)
            return kt_err_set(err, KT_ERR_FORMAT, "%s: %s[%zu]: %zu experts is too many", name, what, i, n);
        if (w && n != w)
            return kt_err_set(err, KT_ERR_FORMAT, "%s: %s[%zu]: %zu experts, but earlier rows have %zu", name, what,
                              i, n, w);
        w = n;
    }
    *width = (uint32_t)w;
    return KT_OK;
}

static kt_status read_rows(json_t *rows, struct kt_profile *p, enum kt_profile_phase ph, const char *name,
                           const char *what, kt_err *err)
{
    for (size_t i = 0; i < p->n_layer; i++) {
        json_t *row = json_array_get(rows, i);
        for (size_t j = 0; j < json_array_size(row); j++)
            if (!amount(json_array_get(row, j), &p->counts[ph][i * p->n_expert + j]))
                return kt_err_set(err, KT_ERR_FORMAT, "%s: %s[%zu][%zu]: expected a non-negative number of tokens",
                                  name, what, i, j);
    }
    return KT_OK;
}

static kt_status parse_v1(json_t *root, const char *name, struct kt_profile **out, kt_err *err)
{
    static const char *const keys[] = {"version", "model", "layers", NULL};
    json_t *model = json_object_get(root, "model"), *layers = json_object_get(root, "layers");
    uint32_t width = 0;
    kt_status st = known_keys(root, keys, name, "", err);
    if (st)
        return st;
    if (model && !json_is_string(model))
        return kt_err_set(err, KT_ERR_FORMAT, "%s: model: expected a string", name);
    if (!json_is_array(layers))
        return kt_err_set(err, KT_ERR_FORMAT, "%s: layers: expected an array with one row per layer", name);
    if (json_array_size(layers) > PROFILE_MAX_DIM)
        return kt_err_set(err, KT_ERR_FORMAT, "%s: layers: %zu rows is too many", name, json_array_size(layers));
    if ((st = row_width(layers, name, "layers", &width, err)))
        return st;
    if ((uint64_t)json_array_size(layers) * width > PROFILE_MAX_CELLS)
        return kt_err_set(err, KT_ERR_FORMAT, "%s: layers: %zu x %u counts is too many", name,
                          json_array_size(layers), width);
    if ((st = kt_profile_create((uint32_t)json_array_size(layers), width, NULL, out, err)))
        return st;
    snprintf((*out)->model.name, sizeof (*out)->model.name, "%s", model ? json_string_value(model) : "");
    (*out)->model.n_layer = (*out)->n_layer;
    (*out)->model.n_expert = width;
    return read_rows(layers, *out, KT_PROFILE_DECODE, name, "layers", err);
}

/* The "model" object of a version 2 file into id. */
static kt_status parse_identity(json_t *model, const char *name, struct kt_model_identity *id, kt_err *err)
{
    static const char *const keys[] = {"name", "arch", "n_layer", "n_expert", "n_expert_used", "n_embd",
                                       "n_ff_exp", "fingerprint", NULL};
    if (!json_is_object(model))
        return kt_err_set(err, KT_ERR_FORMAT, "%s: model: expected an object (name, arch, shape, fingerprint)", name);
    kt_status st = known_keys(model, keys, name, "model: ", err);
    if (st)
        return st;
    json_t *s;
    if (!json_is_string(s = json_object_get(model, "name")))
        return kt_err_set(err, KT_ERR_FORMAT, "%s: model: name: expected a string", name);
    snprintf(id->name, sizeof id->name, "%s", json_string_value(s));
    if (!json_is_string(s = json_object_get(model, "arch")))
        return kt_err_set(err, KT_ERR_FORMAT, "%s: model: arch: expected a string", name);
    snprintf(id->arch, sizeof id->arch, "%s", json_string_value(s));
    struct {
        const char *key;
        uint32_t *dst;
    } dims[] = {{"n_layer", &id->n_layer},          {"n_expert", &id->n_expert}, {"n_expert_used", &id->n_expert_used},
                {"n_embd", &id->n_embd},            {"n_ff_exp", &id->n_ff_exp}};
    for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++) {
        json_t *v = json_object_get(model, dims[i].key);
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > (json_int_t)PROFILE_MAX_DIM * 16)
            return kt_err_set(err, KT_ERR_FORMAT, "%s: model: %s: expected a whole number from 0 to %u", name,
                              dims[i].key, PROFILE_MAX_DIM * 16);
        *dims[i].dst = (uint32_t)json_integer_value(v);
    }
    if (id->n_layer > PROFILE_MAX_DIM || id->n_expert > PROFILE_MAX_DIM ||
        (uint64_t)id->n_layer * id->n_expert > PROFILE_MAX_CELLS)
        return kt_err_set(err, KT_ERR_FORMAT, "%s: model: %u layers x %u experts is too large", name, id->n_layer,
                          id->n_expert);
    s = json_object_get(model, "fingerprint");
    const char *hex = json_is_string(s) ? json_string_value(s) : "";
    uint64_t f = 0;
    bool ok = json_is_string(s) && json_string_length(s) == 16;
    for (size_t i = 0; ok && i < 16; i++) {
        char c = hex[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        ok = d >= 0;
        f = f << 4 | (uint64_t)(d & 15);
    }
    if (!ok)
        return kt_err_set(err, KT_ERR_FORMAT, "%s: model: fingerprint: expected 16 hexadecimal digits", name);
    id->fingerprint = f;
    return KT_OK;
}

static kt_status parse_v2(json_t *root, const char *name, struct kt_profile **out, kt_err *err)
{
    static const char *const keys[] = {"version", "model", "half_life_tokens", "tokens", "decode", "prefill", NULL};
    static const char *const token_keys[] = {"decode", "prefill", NULL};
    struct kt_model_identity id = {0};
    kt_status st = known_keys(root, keys, name, "", err);
    if (st || (st = parse_identity(json_object_get(root, "model"), name, &id, err)))
        return st;
    double half_life = 0, tokens[KT_PROFILE_PHASES] = {0};
    json_t *v = json_object_get(root, "half_life_tokens");
    if (v && !amount(v, &half_life))
        return kt_err_set(err, KT_ERR_FORMAT, "%s: half_life_tokens: expected a non-negative number (0: no decay)",
                          name);
    json_t *jt = json_object_get(root, "tokens");
    if (!json_is_object(jt))
        return kt_err_set(err, KT_ERR_FORMAT, "%s: tokens: expected an object {\"decode\": N, \"prefill\": N}", name);
    if ((st = known_keys(jt, token_keys, name, "tokens: ", err)))
        return st;
    for (int ph = 0; ph < KT_PROFILE_PHASES; ph++)
        if (!amount(json_object_get(jt, PHASE_NAME[ph]), &tokens[ph]))
            return kt_err_set(err, KT_ERR_FORMAT, "%s: tokens: %s: expected a non-negative number of tokens", name,
                              PHASE_NAME[ph]);
    json_t *rows[KT_PROFILE_PHASES];
    uint32_t width = 0;
    for (int ph = 0; ph < KT_PROFILE_PHASES; ph++) {
        rows[ph] = json_object_get(root, PHASE_NAME[ph]);
        if (!json_is_array(rows[ph]))
            return kt_err_set(err, KT_ERR_FORMAT, "%s: %s: expected an array with one row per layer", name,
                              PHASE_NAME[ph]);
        if (json_array_size(rows[ph]) != id.n_layer)
            return kt_err_set(err, KT_ERR_FORMAT, "%s: %s: %zu rows, but model.n_layer is %u", name, PHASE_NAME[ph],
                              json_array_size(rows[ph]), id.n_layer);
        if ((st = row_width(rows[ph], name, PHASE_NAME[ph], &width, err)))
            return st;
        if (width && width != id.n_expert)
            return kt_err_set(err, KT_ERR_FORMAT, "%s: %s: rows of %u experts, but model.n_expert is %u", name,
                              PHASE_NAME[ph], width, id.n_expert);
    }
    if ((st = kt_profile_create(id.n_layer, id.n_expert, &id, out, err)))
        return st;
    (*out)->half_life_tokens = half_life;
    for (int ph = 0; ph < KT_PROFILE_PHASES; ph++) {
        (*out)->tokens[ph] = tokens[ph];
        if ((st = read_rows(rows[ph], *out, (enum kt_profile_phase)ph, name, PHASE_NAME[ph], err)))
            return st;
    }
    return KT_OK;
}

kt_status kt_profile_parse(const char *text, size_t len, const char *name, struct kt_profile **out, kt_err *err)
{
    *out = NULL;
    json_error_t jerr;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return kt_err_set(err, KT_ERR_FORMAT, "%s:%d:%d: %s", name, jerr.line, jerr.column, jerr.text);
    kt_status st;
    json_t *version = json_object_get(root, "version");
    json_int_t ver = json_is_integer(version) ? json_integer_value(version) : 0;
    struct kt_profile *p = NULL;
    if (!json_is_object(root))
        st = kt_err_set(err, KT_ERR_FORMAT, "%s: expected a JSON object", name);
    else if (ver == 1)
        st = parse_v1(root, name, &p, err);
    else if (ver == 2)
        st = parse_v2(root, name, &p, err);
    else if (json_is_integer(version))
        st = kt_err_set(err, KT_ERR_FORMAT, "%s: version: %lld is not one this kt reads (1 or 2)", name,
                        (long long)ver);
    else
        st = kt_err_set(err, KT_ERR_FORMAT, "%s: version: expected 1 or 2", name);
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

/* ---- writing ------------------------------------------------------------------------- */

/* Whole counts as JSON integers, decayed ones as reals. */
static json_t *token_count(double t)
{
    return t == floor(t) && t < 9007199254740992.0 ? json_integer((json_int_t)t) : json_real(t);
}

/* A name cut to its field may end inside a UTF-8 character: drop that character's bytes. */
static json_t *name_string(const char *s)
{
    char buf[sizeof ((struct kt_model_identity *)0)->name];
    snprintf(buf, sizeof buf, "%s", s);
    json_t *j = json_string(buf);
    for (int cut = 0; !j && cut < 4 && buf[0]; cut++) /* a UTF-8 character has at most 4 bytes */
        buf[strlen(buf) - 1] = 0, j = json_string(buf);
    return j ? j : json_string("");
}

static bool row_is_empty(const struct kt_profile *p, uint32_t il)
{
    for (uint32_t x = 0; x < p->n_expert; x++)
        if (kt_profile_count(p, il, x) != 0)
            return false;
    return true;
}

static json_t *profile_json(const struct kt_profile *p)
{
    const struct kt_model_identity *id = &p->model;
    char hex[17];
    snprintf(hex, sizeof hex, "%016" PRIx64, id->fingerprint);
    json_t *root = json_object(), *model = json_object(), *tokens = json_object();
    bool ok = root && model && tokens && json_object_set_new(root, "version", json_integer(2)) == 0 &&
              json_object_set_new(model, "name", name_string(id->name)) == 0 &&
              json_object_set_new(model, "arch", name_string(id->arch)) == 0 &&
              json_object_set_new(model, "n_layer", json_integer(p->n_layer)) == 0 &&
              json_object_set_new(model, "n_expert", json_integer(p->n_expert)) == 0 &&
              json_object_set_new(model, "n_expert_used", json_integer(id->n_expert_used)) == 0 &&
              json_object_set_new(model, "n_embd", json_integer(id->n_embd)) == 0 &&
              json_object_set_new(model, "n_ff_exp", json_integer(id->n_ff_exp)) == 0 &&
              json_object_set_new(model, "fingerprint", json_string(hex)) == 0 &&
              json_object_set(root, "model", model) == 0 &&
              json_object_set_new(root, "half_life_tokens", token_count(p->half_life_tokens)) == 0 &&
              json_object_set(root, "tokens", tokens) == 0;
    for (int ph = 0; ok && ph < KT_PROFILE_PHASES; ph++) {
        json_t *rows = json_array();
        ok = rows && json_object_set_new(tokens, PHASE_NAME[ph], token_count(p->tokens[ph])) == 0 &&
             json_object_set_new(root, PHASE_NAME[ph], rows) == 0;
        for (uint32_t il = 0; ok && il < p->n_layer; il++) {
            json_t *row = json_array();
            ok = row && json_array_append_new(rows, row) == 0;
            if (!ok || row_is_empty(p, il))
                continue;
            for (uint32_t x = 0; ok && x < p->n_expert; x++)
                ok = json_array_append_new(row, token_count(p->counts[ph][(size_t)il * p->n_expert + x])) == 0;
        }
    }
    json_decref(model);
    json_decref(tokens);
    if (!ok) {
        json_decref(root);
        return NULL;
    }
    return root;
}

char *kt_profile_dump(const struct kt_profile *p)
{
    json_t *root = profile_json(p);
    char *text = root ? json_dumps(root, JSON_COMPACT | JSON_REAL_PRECISION(12)) : NULL;
    json_decref(root);
    return text;
}

kt_status kt_profile_save(const struct kt_profile *p, const char *path, kt_err *err)
{
    char *text = kt_profile_dump(p);
    if (!text)
        return kt_err_set(err, KT_ERR_NOMEM, "%s: out of memory building the profile", path);
    size_t len = strlen(text);
    text[len] = '\n'; /* the NUL's place: the file ends with a newline */
    kt_status st = kt_write_file_atomic(path, text, len + 1, err);
    free(text);
    return st;
}

/* ---- using --------------------------------------------------------------------------- */

static void describe(char *buf, size_t size, const struct kt_model_identity *id, uint32_t n_layer, uint32_t n_expert)
{
    int n = snprintf(buf, size, "'%s' (%u layers x %u experts", id->name[0] ? id->name : "unnamed", n_layer, n_expert);
    if (n >= 0 && (size_t)n < size)
        snprintf(buf + n, size - (size_t)n, id->fingerprint ? ", fingerprint %016" PRIx64 ")" : ")", id->fingerprint);
}

kt_status kt_profile_check_model(const struct kt_profile *p, const struct kt_model_identity *id, const char *name,
                                 kt_err *err)
{
    bool same = p->model.fingerprint && id->fingerprint
                    ? p->model.fingerprint == id->fingerprint
                    : p->n_layer == id->n_layer && (p->n_expert == 0 || p->n_expert == id->n_expert);
    if (same)
        return KT_OK;
    char theirs[256], ours[256];
    describe(theirs, sizeof theirs, &p->model, p->n_layer, p->n_expert);
    describe(ours, sizeof ours, id, id->n_layer, id->n_expert);
    return kt_err_set(err, KT_ERR_INVALID, "%s: a profile of %s, not of this model %s", name, theirs, ours);
}

void kt_profile_add(struct kt_profile *p, enum kt_profile_phase ph, const uint64_t *counts, uint64_t n_tokens)
{
    const size_t cells = (size_t)p->n_layer * p->n_expert;
    if (p->half_life_tokens > 0 && n_tokens > 0) {
        const double keep = pow(0.5, (double)n_tokens / p->half_life_tokens);
        for (int q = 0; q < KT_PROFILE_PHASES; q++) {
            for (size_t i = 0; i < cells; i++)
                p->counts[q][i] *= keep;
            p->tokens[q] *= keep;
        }
    }
    if (counts)
        for (size_t i = 0; i < cells; i++)
            p->counts[ph][i] += (double)counts[i];
    p->tokens[ph] += (double)n_tokens;
}

double kt_profile_probability(const struct kt_profile *p, enum kt_profile_phase ph, uint32_t il, uint32_t x,
                              uint32_t n_expert_used)
{
    if (!p->n_expert || il >= p->n_layer || x >= p->n_expert)
        return 0;
    const size_t row = (size_t)il * p->n_expert;
    double count = 0, tokens = 0, row_sum = 0;
    for (int q = 0; q < KT_PROFILE_PHASES; q++) {
        if (ph != KT_PROFILE_PHASES && q != (int)ph)
            continue;
        count += p->counts[q][row + x];
        tokens += p->tokens[q];
    }
    if (tokens > 0)
        return count / tokens;
    for (uint32_t y = 0; y < p->n_expert; y++)
        for (int q = 0; q < KT_PROFILE_PHASES; q++)
            if (ph == KT_PROFILE_PHASES || q == (int)ph)
                row_sum += p->counts[q][row + y];
    return row_sum > 0 ? count / row_sum * n_expert_used : 0;
}

double kt_profile_count(const struct kt_profile *p, uint32_t il, uint32_t x)
{
    if (!p->n_expert || il >= p->n_layer || x >= p->n_expert)
        return 0;
    size_t i = (size_t)il * p->n_expert + x;
    return p->counts[KT_PROFILE_DECODE][i] + p->counts[KT_PROFILE_PREFILL][i];
}
