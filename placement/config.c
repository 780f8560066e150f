/*
 * config.c - reads placement config v1 (configs/README.md) into the checked
 * form of config_internal.h.  Strict by design: an unknown key, a value of
 * the wrong type, a duplicate or an overlapping range is an error naming the
 * line, column and key path, never a guess.  It must never trust the input's
 * sizes: ranges stay ranges and every count is bounded before it is used.
 */
#include "small_file.h"
#include "config_internal.h"

#include "yaml_tree.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define CONFIG_MAX_FILE_BYTES (16u << 20)
#define MAX_INDEX 65535u         /* largest layer or expert number a config may name */
#define MAX_KV_TOKENS (1u << 24)
#define MAX_GIB 1048576.0
#define DEFAULT_KV_TOKENS 4096
#define DEFAULT_TRANSFER_GBPS 25.0 /* PCIe 4.0 x16, as measured rather than as printed */
#define DEFAULT_LATENCY_US 10.0

struct parser {
    const char *name;
    kt_err *err;
    struct kt_placement_config *c;
    bool nested;                 /* a rank's own placement (ranks[r].placement): no ranks: of its own */
};

static kt_status parse_top(struct parser *p, const struct kt_ynode *root);
static struct kt_placement_config *config_new(const char *name);

/* ---- messages ----------------------------------------------------------------- */

/* At most 40 characters of a scalar, anything unprintable as '?'. */
static void printable(const char *s, size_t len, char *buf, size_t cap)
{
    size_t n = 0;
    for (size_t i = 0; i < len && n + 4 < cap && i < 40; i++)
        buf[n++] = (s[i] >= 0x20 && s[i] < 0x7f) ? s[i] : '?';
    if (len > 40 && n + 4 < cap) {
        memcpy(buf + n, "...", 3);
        n += 3;
    }
    buf[n] = 0;
}

/* How a node reads in "got ..." */
static const char *describe(const struct kt_ynode *n, char *buf, size_t cap)
{
    if (n->kind == KT_YMAP)
        return "a mapping";
    if (n->kind == KT_YSEQ)
        return "a sequence";
    if (n->len == 0 && n->plain)
        return "nothing";
    char text[48];
    printable(n->text, n->len, text, sizeof text);
    snprintf(buf, cap, "'%s'", text);
    return buf;
}

static kt_status fail(struct parser *p, const struct kt_ynode *at, const char *path, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static kt_status fail(struct parser *p, const struct kt_ynode *at, const char *path, const char *fmt, ...)
{
    char what[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return kt_err_set(p->err, KT_ERR_FORMAT, "%s:%u:%u: %s%s%s", p->name, at->line, at->col, path,
                      path[0] ? ": " : "", what);
}

/* Key paths are for messages: a long one is cut, never overflowed. */
static void path_printf(char out[KT_PLACEMENT_PATH_MAX], const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void path_printf(char out[KT_PLACEMENT_PATH_MAX], const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(out, KT_PLACEMENT_PATH_MAX, fmt, ap);
    va_end(ap);
}

static void join(char *out, const char *path, const struct kt_ynode *key)
{
    char k[48];
    printable(key->text, key->len, k, sizeof k);
    path_printf(out, "%s%s%s", path, path[0] ? "." : "", k);
}

static void set_where(struct kt_cfg_where *w, const struct kt_ynode *at, const char *path)
{
    w->line = at->line;
    w->col = at->col;
    snprintf(w->path, sizeof w->path, "%s", path);
}

/* ---- scalars ------------------------------------------------------------------ */

static bool all_digits(const char *s, size_t len)
{
    if (len == 0)
        return false;
    for (size_t i = 0; i < len; i++)
        if (s[i] < '0' || s[i] > '9')
            return false;
    return true;
}

/* Decimal digits only; false when out of [0, max]. */
static bool digits_value(const char *s, size_t len, uint64_t max, uint64_t *out)
{
    uint64_t v = 0;
    for (size_t i = 0; i < len; i++) {
        v = v * 10 + (uint64_t)(s[i] - '0');
        if (v > max)
            return false;
    }
    *out = v;
    return true;
}

static kt_status get_uint(struct parser *p, const struct kt_ynode *n, const char *path, uint32_t max, uint32_t *out)
{
    char got[64];
    if (n->kind != KT_YSCALAR || !n->plain || !all_digits(n->text, n->len))
        return fail(p, n, path, "expected a non-negative integer, got %s", describe(n, got, sizeof got));
    uint64_t v;
    if (!digits_value(n->text, n->len, max, &v))
        return fail(p, n, path, "%s is too large (at most %u)", describe(n, got, sizeof got), max);
    *out = (uint32_t)v;
    return KT_OK;
}

/* A plain decimal number in [min, max] (min itself excluded when open). */
static kt_status get_number(struct parser *p, const struct kt_ynode *n, const char *path, double min, bool open,
                            double max, double *out)
{
    char got[64];
    bool ok = n->kind == KT_YSCALAR && n->plain && n->len > 0 && n->len < 32 && strlen(n->text) == n->len;
    for (size_t i = 0; ok && i < n->len; i++)
        ok = strchr("0123456789.eE+-", n->text[i]) != NULL;
    char *end = NULL;
    double v = ok ? strtod(n->text, &end) : 0;
    if (!ok || end != n->text + n->len || !isfinite(v))
        return fail(p, n, path, "expected a number, got %s", describe(n, got, sizeof got));
    if (v < min || (open && v == min) || v > max)
        return fail(p, n, path, "%g is out of range (%s %g, at most %g)", v, open ? "above" : "at least", min, max);
    *out = v;
    return KT_OK;
}

/* A string without NULs, 1..cap-1 bytes. */
static kt_status get_string(struct parser *p, const struct kt_ynode *n, const char *path, size_t cap, char **out)
{
    char got[64];
    if (n->kind != KT_YSCALAR || n->len == 0 || strlen(n->text) != n->len || n->len >= cap)
        return fail(p, n, path, "expected a string of 1 to %zu characters, got %s", cap - 1,
                    describe(n, got, sizeof got));
    *out = strdup(n->text);
    if (!*out)
        return kt_err_set(p->err, KT_ERR_NOMEM, "%s: out of memory", p->name);
    return KT_OK;
}

static bool is_identifier(const char *s, size_t len)
{
    if (len == 0 || len > 31 || strlen(s) != len || !(isalpha((unsigned char)s[0]) || s[0] == '_'))
        return false;
    for (size_t i = 1; i < len; i++)
        if (!(isalnum((unsigned char)s[i]) || s[i] == '_' || s[i] == '-'))
            return false;
    return true;
}

/* "N" or "N-M" (N <= M <= max); *bad says why not. */
static bool parse_range(const struct kt_ynode *n, uint32_t max, struct kt_id_range *r, const char **bad)
{
    *bad = "expected N or N-M";
    if (n->kind != KT_YSCALAR)
        return false;
    const char *dash = memchr(n->text, '-', n->len);
    size_t len1 = dash ? (size_t)(dash - n->text) : n->len;
    size_t len2 = dash ? n->len - len1 - 1 : 0;
    if (!all_digits(n->text, len1) || (dash && !all_digits(dash + 1, len2)))
        return false;
    uint64_t a, b;
    *bad = "a number is too large";
    if (!digits_value(n->text, len1, max, &a) || (dash && !digits_value(dash + 1, len2, max, &b)))
        return false;
    if (!dash)
        b = a;
    *bad = "the first number is above the last";
    if (a > b)
        return false;
    r->first = (uint32_t)a;
    r->last = (uint32_t)b;
    return true;
}

/* ---- structure ---------------------------------------------------------------- */

static kt_status expect(struct parser *p, const struct kt_ynode *n, const char *path, enum kt_ynode_kind kind)
{
    char got[64];
    if (n->kind == kind)
        return KT_OK;
    return fail(p, n, path, "expected a %s, got %s", kind == KT_YMAP ? "mapping" : "sequence",
                describe(n, got, sizeof got));
}

/* Index of key in known[] (NULL-terminated), or an error naming the choices. */
static kt_status which_key(struct parser *p, const struct kt_ynode *key, const char *path, const char *const *known,
                           int *out)
{
    char list[256] = "", k[64];
    for (int i = 0; known[i]; i++) {
        if (kt_yscalar_is(key, known[i])) {
            *out = i;
            return KT_OK;
        }
        snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", i ? ", " : "", known[i]);
    }
    printable(key->text, key->len, k, sizeof k);
    return fail(p, key, path, "unknown key '%s' (expected one of: %s)", k, list);
}

static const struct kt_ynode *find_key(const struct kt_ynode *map, const char *key)
{
    for (uint32_t i = 0; i < kt_ymap_size(map); i++)
        if (kt_yscalar_is(kt_ymap_key(map, i), key))
            return kt_ymap_value(map, i);
    return NULL;
}

static int device_index(const struct kt_placement_config *c, const struct kt_ynode *n)
{
    for (int d = 0; d < c->n_devices; d++)
        if (kt_yscalar_is(n, c->devices[d].name))
            return d;
    return -1;
}

static kt_status unknown_device(struct parser *p, const struct kt_ynode *n, const char *path)
{
    char names[KT_PLACEMENT_MAX_DEVICES * 34] = "", got[64];
    for (int d = 0; d < p->c->n_devices; d++)
        snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", d ? ", " : "", p->c->devices[d].name);
    return fail(p, n, path, "unknown device %s (devices: %s)", describe(n, got, sizeof got), names);
}

/* ---- expert sets and rules ---------------------------------------------------- */

struct ranged {
    struct kt_id_range r;
    const struct kt_ynode *at;
};

static int by_first(const void *a, const void *b)
{
    const struct ranged *x = a, *y = b;
    if (x->r.first != y->r.first)
        return x->r.first < y->r.first ? -1 : 1;
    if (x->at->line != y->at->line)
        return x->at->line < y->at->line ? -1 : 1;
    return x->at->col < y->at->col ? -1 : x->at->col > y->at->col;
}

/* A count, "all", or a list of expert numbers and "N-M" ranges. */
static kt_status parse_set(struct parser *p, const struct kt_ynode *n, const char *path, struct kt_expert_set *s)
{
    char got[64];
    set_where(&s->where, n, path);
    if (kt_yscalar_is(n, "all")) {
        s->kind = KT_SET_ALL;
        return KT_OK;
    }
    if (n->kind == KT_YSCALAR && n->plain && all_digits(n->text, n->len)) {
        s->kind = KT_SET_COUNT;
        return get_uint(p, n, path, MAX_INDEX + 1, &s->count);
    }
    if (n->kind != KT_YSEQ)
        return fail(p, n, path, "expected a count, 'all' or a list of experts, got %s", describe(n, got, sizeof got));
    s->kind = KT_SET_LIST;
    if (n->n == 0)
        return KT_OK;
    struct ranged *items = malloc(n->n * sizeof *items);
    s->ranges = malloc(n->n * sizeof *s->ranges);
    if (!items || !s->ranges) {
        free(items);
        return kt_err_set(p->err, KT_ERR_NOMEM, "%s: out of memory", p->name);
    }
    kt_status st = KT_OK;
    for (uint32_t i = 0; i < n->n && !st; i++) {
        const char *bad;
        items[i].at = n->items[i];
        if (!parse_range(n->items[i], MAX_INDEX, &items[i].r, &bad))
            st = fail(p, n->items[i], path, "expected an expert number or a range N-M, got %s (%s)",
                      describe(n->items[i], got, sizeof got), bad);
    }
    if (!st) {
        qsort(items, n->n, sizeof *items, by_first);
        for (uint32_t i = 0; i < n->n && !st; i++) {
            if (i > 0 && items[i].r.first <= items[i - 1].r.last)
                st = fail(p, items[i].at, path, "expert %u is listed twice", items[i].r.first);
            s->ranges[i] = items[i].r;
        }
        s->n_ranges = n->n;
    }
    free(items);
    return st;
}

static kt_status fail_where(struct parser *p, const struct kt_cfg_where *w, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static kt_status fail_where(struct parser *p, const struct kt_cfg_where *w, const char *fmt, ...)
{
    char what[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return kt_err_set(p->err, KT_ERR_FORMAT, "%s:%u:%u: %s: %s", p->name, w->line, w->col, w->path, what);
}

static int by_first_layer(const void *a, const void *b)
{
    const struct kt_layer_rule *x = a, *y = b;
    if (x->layers.first != y->layers.first)
        return x->layers.first < y->layers.first ? -1 : 1;
    return x->set.where.line < y->set.where.line ? -1 : x->set.where.line > y->set.where.line;
}

/* layers: {RANGE: set, ...}, kept sorted and disjoint. */
static kt_status parse_layer_rules(struct parser *p, const struct kt_ynode *n, const char *path,
                                   struct kt_expert_rules *r)
{
    kt_status st = expect(p, n, path, KT_YMAP);
    uint32_t count = kt_ymap_size(n);
    if (st || count == 0)
        return st;
    r->layer_rules = calloc(count, sizeof *r->layer_rules);
    if (!r->layer_rules)
        return kt_err_set(p->err, KT_ERR_NOMEM, "%s: out of memory", p->name);
    for (uint32_t j = 0; j < count; j++) {
        const struct kt_ynode *key = kt_ymap_key(n, j);
        struct kt_layer_rule *rule = &r->layer_rules[j];
        const char *bad;
        char got[64], entry[KT_PLACEMENT_PATH_MAX];
        r->n_layer_rules = j + 1; /* owns the ranges parse_set allocates */
        if (!parse_range(key, MAX_INDEX, &rule->layers, &bad))
            return fail(p, key, path, "expected a layer number or a range N-M as key, got %s (%s)",
                        describe(key, got, sizeof got), bad);
        join(entry, path, key);
        if ((st = parse_set(p, kt_ymap_value(n, j), entry, &rule->set)))
            return st;
    }
    qsort(r->layer_rules, count, sizeof *r->layer_rules, by_first_layer);
    for (uint32_t j = 1; j < count; j++) {
        const struct kt_layer_rule *a = &r->layer_rules[j - 1], *b = &r->layer_rules[j];
        if (b->layers.first <= a->layers.last)
            return fail_where(p, &b->set.where, "layer %u is also given by %s (line %u)", b->layers.first,
                              a->set.where.path, a->set.where.line);
    }
    return KT_OK;
}

/* {per_layer: set, layers: {...}} */
static kt_status parse_rules(struct parser *p, const struct kt_ynode *n, const char *path, struct kt_expert_rules *r)
{
    static const char *const known[] = {"per_layer", "layers", NULL};
    kt_status st = expect(p, n, path, KT_YMAP);
    for (uint32_t i = 0; i < kt_ymap_size(n) && !st; i++) {
        int k;
        char sub[KT_PLACEMENT_PATH_MAX];
        const struct kt_ynode *key = kt_ymap_key(n, i), *v = kt_ymap_value(n, i);
        join(sub, path, key);
        if ((st = which_key(p, key, path, known, &k)))
            break;
        st = k == 0 ? parse_set(p, v, sub, &r->per_layer) : parse_layer_rules(p, v, sub, r);
    }
    return st;
}

static void free_rules(struct kt_expert_rules *r)
{
    free(r->per_layer.ranges);
    for (uint32_t i = 0; i < r->n_layer_rules; i++)
        free(r->layer_rules[i].set.ranges);
    free(r->layer_rules);
}

/* ---- sections ----------------------------------------------------------------- */

/* devices.NAME: {backend, device, memory_gib, transfer_gbps, latency_us} */
static kt_status parse_device(struct parser *p, const struct kt_ynode *key, const struct kt_ynode *n,
                              const char *path, struct kt_cfg_device *d)
{
    static const char *const known[] = {"backend", "device", "memory_gib", "transfer_gbps", "latency_us", NULL};
    char got[64];
    if (kt_yscalar_is(key, "cpu"))
        return fail(p, key, path, "'cpu' is reserved: the CPU is always there and needs no entry");
    if (!is_identifier(key->text, key->len))
        return fail(p, key, path, "a device name is a letter or '_' then up to 30 letters, digits, '_' or '-', got %s",
                    describe(key, got, sizeof got));
    memcpy(d->name, key->text, key->len + 1);
    set_where(&d->where, key, path);
    kt_status st = expect(p, n, path, KT_YMAP);
    if (st)
        return st;
    const struct kt_ynode *backend = find_key(n, "backend");
    char sub[KT_PLACEMENT_PATH_MAX];
    path_printf(sub, "%s.backend", path);
    if (!backend)
        return fail(p, n, path, "backend: missing (cuda or sim)");
    if (kt_yscalar_is(backend, "cuda"))
        d->backend = KT_PLACE_CUDA;
    else if (kt_yscalar_is(backend, "sim"))
        d->backend = KT_PLACE_SIM;
    else
        return fail(p, backend, sub, "expected cuda or sim, got %s", describe(backend, got, sizeof got));
    if (d->backend == KT_PLACE_SIM) {
        d->transfer_gbps = DEFAULT_TRANSFER_GBPS;
        d->latency_us = DEFAULT_LATENCY_US;
    }
    bool has_budget = false;
    for (uint32_t i = 0; i < kt_ymap_size(n) && !st; i++) {
        int k;
        uint32_t ordinal;
        const struct kt_ynode *field = kt_ymap_key(n, i), *v = kt_ymap_value(n, i);
        if ((st = which_key(p, field, path, known, &k)))
            break;
        join(sub, path, field);
        if ((k == 1 && d->backend != KT_PLACE_CUDA) || (k >= 3 && d->backend != KT_PLACE_SIM))
            return fail(p, field, sub, "only for backend: %s", k == 1 ? "cuda" : "sim");
        switch (k) {
        case 1:
            if (!(st = get_uint(p, v, sub, 63, &ordinal)))
                d->cuda_device = (int)ordinal;
            break;
        case 2:
            st = get_number(p, v, sub, 0, true, MAX_GIB, &d->memory_gib);
            has_budget = true;
            break;
        case 3: st = get_number(p, v, sub, 0, true, 1e6, &d->transfer_gbps); break;
        case 4: st = get_number(p, v, sub, 0, false, 1e6, &d->latency_us); break;
        default: break;
        }
    }
    if (!st && !has_budget)
        st = fail(p, n, path, "memory_gib: missing (the memory kt may use on this device, in GiB)");
    return st;
}

static kt_status parse_devices(struct parser *p, const struct kt_ynode *n)
{
    struct kt_placement_config *c = p->c;
    kt_status st = expect(p, n, "devices", KT_YMAP);
    for (uint32_t i = 0; i < kt_ymap_size(n) && !st; i++) {
        char sub[KT_PLACEMENT_PATH_MAX];
        const struct kt_ynode *key = kt_ymap_key(n, i);
        join(sub, "devices", key);
        if (c->n_devices == KT_PLACEMENT_MAX_DEVICES)
            return fail(p, key, "devices", "at most %d devices besides the cpu", KT_PLACEMENT_MAX_DEVICES - 1);
        struct kt_cfg_device *d = &c->devices[c->n_devices];
        if ((st = parse_device(p, key, kt_ymap_value(n, i), sub, d)))
            break;
        for (int e = 1; e < c->n_devices; e++)
            if (d->backend == KT_PLACE_CUDA && c->devices[e].backend == KT_PLACE_CUDA &&
                c->devices[e].cuda_device == d->cuda_device)
                return fail(p, key, sub, "cuda device %d is already '%s'", d->cuda_device, c->devices[e].name);
        c->n_devices++;
    }
    return st;
}

static kt_status parse_use(struct parser *p, const struct kt_ynode *n, const char *path, struct kt_cfg_use *u)
{
    set_where(&u->where, n, path);
    u->device = device_index(p->c, n);
    return u->device < 0 ? unknown_device(p, n, path) : KT_OK;
}

static kt_status parse_experts(struct parser *p, const struct kt_ynode *n)
{
    kt_status st = expect(p, n, "experts", KT_YMAP);
    for (uint32_t i = 0; i < kt_ymap_size(n) && !st; i++) {
        char sub[KT_PLACEMENT_PATH_MAX];
        const struct kt_ynode *key = kt_ymap_key(n, i);
        join(sub, "experts", key);
        if (kt_yscalar_is(key, "cpu"))
            return fail(p, key, "experts", "CPU experts are placed under cpu: (nodes, assign); "
                                           "every expert no device takes goes there");
        int d = device_index(p->c, key);
        if (d < 0)
            return unknown_device(p, key, "experts");
        st = parse_rules(p, kt_ymap_value(n, i), sub, &p->c->devices[d].experts);
    }
    return st;
}

static kt_status parse_nodes(struct parser *p, const struct kt_ynode *n)
{
    struct kt_placement_config *c = p->c;
    char got[64];
    if (kt_yscalar_is(n, "auto")) {
        c->nodes_auto = true;
        return KT_OK;
    }
    if (n->kind != KT_YSEQ || n->n == 0)
        return fail(p, n, "cpu.nodes", "expected auto or a list of NUMA node numbers, got %s",
                    n->kind == KT_YSEQ ? "an empty list" : describe(n, got, sizeof got));
    c->nodes_auto = false;
    for (uint32_t i = 0; i < n->n; i++) {
        uint32_t node;
        kt_status st = get_uint(p, n->items[i], "cpu.nodes", KT_PLACEMENT_MAX_NODES - 1, &node);
        if (st)
            return st;
        for (int j = 0; j < c->n_nodes; j++)
            if (c->nodes[j] == (int)node)
                return fail(p, n->items[i], "cpu.nodes", "node %u is listed twice", node);
        set_where(&c->node_where[c->n_nodes], n->items[i], "cpu.nodes");
        c->nodes[c->n_nodes++] = (int)node;
    }
    return KT_OK;
}

static kt_status parse_assign(struct parser *p, const struct kt_ynode *n)
{
    struct kt_placement_config *c = p->c;
    kt_status st = expect(p, n, "cpu.assign", KT_YMAP);
    for (uint32_t i = 0; i < kt_ymap_size(n) && !st; i++) {
        char sub[KT_PLACEMENT_PATH_MAX], got[64];
        const struct kt_ynode *key = kt_ymap_key(n, i);
        uint64_t node;
        join(sub, "cpu.assign", key);
        if (!all_digits(key->text, key->len) || !digits_value(key->text, key->len, KT_PLACEMENT_MAX_NODES - 1, &node))
            return fail(p, key, "cpu.assign", "expected a NUMA node number (0 to %d) as key, got %s",
                        KT_PLACEMENT_MAX_NODES - 1, describe(key, got, sizeof got));
        for (int j = 0; j < c->n_assign; j++)
            if (c->assign[j].node == (int)node)
                return fail(p, key, sub, "node %d is given twice (line %u)", (int)node, c->assign[j].where.line);
        struct kt_cfg_node_rules *a = &c->assign[c->n_assign++];
        a->node = (int)node;
        set_where(&a->where, key, sub);
        st = parse_rules(p, kt_ymap_value(n, i), sub, &a->experts);
    }
    return st;
}

/* cpu.sliced: all, or a list of layer numbers and N-M ranges (kept sorted and disjoint). */
static kt_status parse_sliced(struct parser *p, const struct kt_ynode *n)
{
    struct kt_cfg_sliced *s = &p->c->sliced;
    char got[64];
    if (kt_yscalar_is(n, "all")) {
        s->all = true;
        return KT_OK;
    }
    if (n->kind != KT_YSEQ)
        return fail(p, n, "cpu.sliced", "expected all or a list of layers and N-M ranges, got %s",
                    describe(n, got, sizeof got));
    if (n->n == 0)
        return KT_OK;
    struct ranged *items = malloc(n->n * sizeof *items);
    s->ranges = malloc(n->n * sizeof *s->ranges);
    s->where = malloc(n->n * sizeof *s->where);
    if (!items || !s->ranges || !s->where) {
        free(items);
        return kt_err_set(p->err, KT_ERR_NOMEM, "%s: out of memory", p->name);
    }
    kt_status st = KT_OK;
    for (uint32_t i = 0; i < n->n && !st; i++) {
        const char *bad;
        items[i].at = n->items[i];
        if (!parse_range(n->items[i], MAX_INDEX, &items[i].r, &bad))
            st = fail(p, n->items[i], "cpu.sliced", "expected a layer number or a range N-M, got %s (%s)",
                      describe(n->items[i], got, sizeof got), bad);
    }
    if (!st) {
        qsort(items, n->n, sizeof *items, by_first);
        for (uint32_t i = 0; i < n->n && !st; i++) {
            if (i > 0 && items[i].r.first <= items[i - 1].r.last)
                st = fail(p, items[i].at, "cpu.sliced", "layer %u is listed twice", items[i].r.first);
            s->ranges[i] = items[i].r;
            set_where(&s->where[i], items[i].at, "cpu.sliced");
        }
        s->n_ranges = n->n;
    }
    free(items);
    return st;
}

static kt_status parse_cpu(struct parser *p, const struct kt_ynode *n)
{
    static const char *const known[] = {"nodes", "assign", "replicas", "sliced", NULL};
    static const char *const replica_keys[] = {"hot_per_layer", NULL};
    struct kt_placement_config *c = p->c;
    kt_status st = expect(p, n, "cpu", KT_YMAP);
    for (uint32_t i = 0; i < kt_ymap_size(n) && !st; i++) {
        int k;
        const struct kt_ynode *key = kt_ymap_key(n, i), *v = kt_ymap_value(n, i);
        if ((st = which_key(p, key, "cpu", known, &k)))
            break;
        if (k == 0) {
            st = parse_nodes(p, v);
        } else if (k == 1) {
            st = parse_assign(p, v);
        } else if (k == 3) {
            st = parse_sliced(p, v);
        } else if (!(st = expect(p, v, "cpu.replicas", KT_YMAP))) {
            for (uint32_t j = 0; j < kt_ymap_size(v) && !st; j++)
                if (!(st = which_key(p, kt_ymap_key(v, j), "cpu.replicas", replica_keys, &k)))
                    st = get_uint(p, kt_ymap_value(v, j), "cpu.replicas.hot_per_layer", MAX_INDEX + 1,
                                  &c->replicas_hot_per_layer);
        }
    }
    for (int j = 0; j < c->n_assign && !st && !c->nodes_auto; j++) {
        bool listed = false;
        for (int k = 0; k < c->n_nodes; k++)
            listed |= c->nodes[k] == c->assign[j].node;
        if (!listed)
            st = fail_where(p, &c->assign[j].where, "node %d is not in cpu.nodes", c->assign[j].node);
    }
    return st;
}

static kt_status parse_kv_cache(struct parser *p, const struct kt_ynode *n)
{
    static const char *const known[] = {"tokens", "type", NULL};
    kt_status st = expect(p, n, "kv_cache", KT_YMAP);
    for (uint32_t i = 0; i < kt_ymap_size(n) && !st; i++) {
        int k;
        char got[64];
        const struct kt_ynode *v = kt_ymap_value(n, i);
        if ((st = which_key(p, kt_ymap_key(n, i), "kv_cache", known, &k)))
            break;
        if (k == 0) {
            st = get_uint(p, v, "kv_cache.tokens", MAX_KV_TOKENS, &p->c->kv_tokens);
            if (!st && p->c->kv_tokens == 0)
                st = fail(p, v, "kv_cache.tokens", "must be at least 1");
        } else {
            bool known_type = false;
            for (int t = 0; t < KT_ROW_TYPE_COUNT && !known_type; t++)
                if (kt_yscalar_is(v, kt_row_type_name((enum kt_row_type)t))) {
                    known_type = true;
                    p->c->kv_type = (enum kt_row_type)t;
                    p->c->kv_type_given = true;
                    p->c->kv_bytes_per_value = (uint32_t)kt_row_type_size(p->c->kv_type);
                }
            if (!known_type)
                st = fail(p, v, "kv_cache.type", "expected f32, bf16 or f16, got %s", describe(v, got, sizeof got));
        }
    }
    return st;
}

/* ranks[r].placement: the rank's own placement config v1 (its devices, NUMA nodes and its layers' experts),
 * a mapping read as a file of its own would be; messages keep this file's name and lines. */
static kt_status parse_rank_placement(struct parser *p, const struct kt_ynode *n, uint32_t r)
{
    char path[64];
    snprintf(path, sizeof path, "ranks[%u].placement", r);
    kt_status st = expect(p, n, path, KT_YMAP);
    if (st)
        return st;
    struct kt_placement_config *sub = config_new(p->name);
    if (!sub)
        return kt_err_set(p->err, KT_ERR_NOMEM, "%s: out of memory", p->name);
    struct parser sp = {.name = sub->name, .err = p->err, .c = sub, .nested = true};
    st = parse_top(&sp, n);
    if (st) {
        kt_placement_config_destroy(sub);
        return st;
    }
    sub->stage_begin = p->c->rank_layers[r].first; /* its bytes are its layers' (kt_placement_resolve) */
    sub->stage_end = p->c->rank_layers[r].last + 1;
    p->c->rank_placement[r] = sub;
    return KT_OK;
}

/* ranks: [{layers: N-M, placement: {...}}, ...]: each rank's layers, in rank order, following each other from
 * layer 0, and optionally the rank's own placement. */
static kt_status parse_ranks(struct parser *p, const struct kt_ynode *n)
{
    static const char *const known[] = {"layers", "placement", NULL};
    char got[64], path[64];
    kt_status st = expect(p, n, "ranks", KT_YSEQ);
    if (!st && p->nested)
        st = fail(p, n, "ranks", "a rank's own placement cannot list ranks of its own");
    if (!st && (n->n == 0 || n->n > KT_PLACEMENT_MAX_RANKS))
        st = fail(p, n, "ranks", "expected 1 to %d ranks, got %u", KT_PLACEMENT_MAX_RANKS, (unsigned)n->n);
    for (uint32_t r = 0; r < n->n && !st; r++) {
        const struct kt_ynode *item = n->items[r], *layers = NULL, *placement = NULL;
        snprintf(path, sizeof path, "ranks[%u]", r);
        if ((st = expect(p, item, path, KT_YMAP)))
            break;
        for (uint32_t i = 0; i < kt_ymap_size(item) && !st; i++) {
            int k;
            if (!(st = which_key(p, kt_ymap_key(item, i), path, known, &k))) {
                if (k == 0)
                    layers = kt_ymap_value(item, i);
                else
                    placement = kt_ymap_value(item, i);
            }
        }
        if (st)
            break;
        snprintf(path, sizeof path, "ranks[%u].layers", r);
        if (!layers) {
            st = fail(p, item, path, "missing (N-M: the rank's first and last layer)");
            break;
        }
        struct kt_id_range *lr = &p->c->rank_layers[r];
        const char *bad;
        if (!parse_range(layers, MAX_INDEX, lr, &bad)) {
            st = fail(p, layers, path, "%s, got %s", bad, describe(layers, got, sizeof got));
            break;
        }
        if (r == 0 && lr->first != 0) {
            st = fail(p, layers, path, "rank 0 starts at layer %u: the first rank starts at layer 0", lr->first);
            break;
        }
        if (r > 0 && lr->first != p->c->rank_layers[r - 1].last + 1) {
            st = fail(p, layers, path, "starts at layer %u, but rank %u ends at layer %u: the ranks' layers follow "
                      "each other in rank order", lr->first, r - 1, p->c->rank_layers[r - 1].last);
            break;
        }
        if (placement && (st = parse_rank_placement(p, placement, r)))
            break;
        p->c->n_ranks = (int)r + 1;
    }
    return st;
}

/* A relative profile path is relative to the config file. */
static kt_status set_profile(struct parser *p, const struct kt_ynode *n)
{
    char *rel = NULL;
    kt_status st = get_string(p, n, "profile", 4096, &rel);
    if (st)
        return st;
    set_where(&p->c->profile_where, n, "profile");
    const char *slash = strrchr(p->name, '/');
    if (rel[0] == '/' || !slash) {
        p->c->profile = rel;
        return KT_OK;
    }
    int dir_len = (int)(slash - p->name);
    size_t cap = (size_t)dir_len + strlen(rel) + 2;
    p->c->profile = malloc(cap);
    if (p->c->profile)
        snprintf(p->c->profile, cap, "%.*s/%s", dir_len, p->name, rel);
    free(rel);
    return p->c->profile ? KT_OK : kt_err_set(p->err, KT_ERR_NOMEM, "%s: out of memory", p->name);
}

static kt_status parse_top(struct parser *p, const struct kt_ynode *root)
{
    enum { VERSION, DESCRIPTION, PROFILE, KV_CACHE, DEVICES, ATTENTION, SHARED, DENSE, EMBEDDINGS, EXPERTS, CPU, RANKS };
    static const char *const known[] = {"version", "description", "profile", "kv_cache", "devices", "attention",
                                        "shared_experts", "dense_layers", "embeddings", "experts", "cpu", "ranks",
                                        NULL};
    struct kt_placement_config *c = p->c;
    char got[64];
    if (!root || root->kind != KT_YMAP) {
        static const struct kt_ynode start = {.kind = KT_YSCALAR, .line = 1, .col = 1};
        return fail(p, root ? root : &start, "", "expected a mapping that starts with 'version: 1', got %s",
                    root ? describe(root, got, sizeof got) : "an empty document");
    }
    /* version first, so a file of another version gets that message; devices next,
     * so names used before the devices: section resolve */
    const struct kt_ynode *version = find_key(root, "version"), *devices = find_key(root, "devices");
    if (!version)
        return fail(p, root, "", "version: missing (this kt reads 'version: 1')");
    uint32_t v;
    kt_status st = get_uint(p, version, "version", 1000000, &v);
    if (!st && v != 1)
        st = fail(p, version, "version", "unsupported version %u (this kt reads version 1)", v);
    if (!st && devices)
        st = parse_devices(p, devices);
    for (uint32_t i = 0; i < kt_ymap_size(root) && !st; i++) {
        int k;
        const struct kt_ynode *key = kt_ymap_key(root, i), *n = kt_ymap_value(root, i);
        if ((st = which_key(p, key, "", known, &k)))
            break;
        switch (k) {
        case DESCRIPTION: st = get_string(p, n, "description", 1024, &c->description); break;
        case PROFILE: st = set_profile(p, n); break;
        case KV_CACHE: st = parse_kv_cache(p, n); break;
        case ATTENTION: st = parse_use(p, n, "attention", &c->attention); break;
        case SHARED: st = parse_use(p, n, "shared_experts", &c->shared_experts); break;
        case DENSE: st = parse_use(p, n, "dense_layers", &c->dense_layers); break;
        case EMBEDDINGS: st = parse_use(p, n, "embeddings", &c->embeddings); break;
        case EXPERTS: st = parse_experts(p, n); break;
        case CPU: st = parse_cpu(p, n); break;
        case RANKS: st = parse_ranks(p, n); break;
        default: break; /* version and devices: done above */
        }
    }
    if (!st && c->attention.device < 0)
        st = fail(p, root, "", "attention: missing (a device name, or cpu)");
    return st;
}

/* ---- entry points ------------------------------------------------------------- */

void kt_placement_config_destroy(struct kt_placement_config *c)
{
    if (!c)
        return;
    for (int d = 0; d < c->n_devices; d++)
        free_rules(&c->devices[d].experts);
    for (int a = 0; a < c->n_assign; a++)
        free_rules(&c->assign[a].experts);
    free(c->sliced.ranges);
    free(c->sliced.where);
    free(c->description);
    free(c->profile);
    for (int r = 0; r < KT_PLACEMENT_MAX_RANKS; r++)
        kt_placement_config_destroy(c->rank_placement[r]);
    free(c);
}

const char *kt_placement_config_profile(const struct kt_placement_config *c)
{
    return c->profile;
}

uint32_t kt_placement_config_replicas_hot_per_layer(const struct kt_placement_config *c)
{
    return c->replicas_hot_per_layer;
}

int kt_placement_config_ranks(const struct kt_placement_config *c)
{
    return c->n_ranks;
}

void kt_placement_config_rank_layers(const struct kt_placement_config *c, int rank, uint32_t *first, uint32_t *last)
{
    *first = c->rank_layers[rank].first;
    *last = c->rank_layers[rank].last;
}

const struct kt_placement_config *kt_placement_config_rank_placement(const struct kt_placement_config *c, int rank)
{
    return rank >= 0 && rank < c->n_ranks ? c->rank_placement[rank] : NULL;
}

static struct kt_placement_config *config_new(const char *name)
{
    struct kt_placement_config *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    snprintf(c->name, sizeof c->name, "%s", name);
    snprintf(c->devices[0].name, sizeof c->devices[0].name, "cpu");
    c->n_devices = 1;
    c->kv_tokens = DEFAULT_KV_TOKENS;
    c->kv_type = KT_ROW_F32; /* no kv_cache.type: estimates count the widest rows, the engine runs --kv-type's */
    c->kv_bytes_per_value = 4;
    c->nodes_auto = true;
    c->attention.device = c->shared_experts.device = c->dense_layers.device = c->embeddings.device = -1;
    return c;
}

kt_status kt_placement_config_parse(const char *text, size_t len, const char *name,
                                    struct kt_placement_config **out, kt_err *err)
{
    *out = NULL;
    struct kt_placement_config *c = config_new(name);
    if (!c)
        return kt_err_set(err, KT_ERR_NOMEM, "%s: out of memory", name);
    struct parser p = {.name = c->name, .err = err, .c = c};
    struct kt_ynode *root = NULL;
    kt_status st = kt_yaml_tree_parse(text, len, c->name, &root, err);
    if (!st)
        st = parse_top(&p, root);
    kt_yaml_tree_destroy(root);
    if (st) {
        kt_placement_config_destroy(c);
        return st;
    }
    *out = c;
    return KT_OK;
}

kt_status kt_placement_config_load(const char *path, struct kt_placement_config **out, kt_err *err)
{
    *out = NULL;
    char *text = NULL;
    size_t len = 0;
    kt_status st = kt_read_small_file(path, CONFIG_MAX_FILE_BYTES, &text, &len, err);
    if (st == KT_OK)
        st = kt_placement_config_parse(text, len, path, out, err);
    free(text);
    return st;
}

void kt_placement_config_set_stage(struct kt_placement_config *c, uint32_t begin, uint32_t end)
{
    c->stage_begin = begin;
    c->stage_end = end;
}
