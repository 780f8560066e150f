/*
 * machine.c - the machine file to and from JSON, this host's kind, and the
 * stated defaults (see machine.h).  Must never trust a file: every figure is
 * checked (a finite, non-negative number below a sane ceiling) before it is
 * stored, and an error names the file and the JSON path of the bad value.
 */
#include "machine.h"

#include "small_file.h"
#include "topology.h"

#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#define MACHINE_MAX_FILE_BYTES (16u << 20)
#define MAX_FIGURE 1e9           /* GB/s, GFLOP/s, us: anything above is a broken file */
#define MAX_MEMORY_GIB 1048576.0 /* 1 PiB */
#define MAX_THREADS 65536
#define MIN_RATE_GBPS 1e-3       /* a rate below it would make a prediction overflow */

/* The weight formats the engine runs experts in and kt-bench machine measures. */
static const enum kt_type machine_types[] = {KT_TYPE_Q4_K, KT_TYPE_Q5_K, KT_TYPE_Q6_K, KT_TYPE_Q8_0,
                                             KT_TYPE_BF16, KT_TYPE_F16, KT_TYPE_F32};
#define N_MACHINE_TYPES (sizeof machine_types / sizeof machine_types[0])

/* ---- defaults ------------------------------------------------------------------------ */

/* Records one defaulted entry; past the table's size the last line counts the rest. */
static void note_default(struct kt_machine *m, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void note_default(struct kt_machine *m, const char *fmt, ...)
{
    if (m->n_defaulted < KT_MACHINE_MAX_DEFAULTED - 1) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(m->defaulted[m->n_defaulted++], sizeof m->defaulted[0], fmt, ap);
        va_end(ap);
        return;
    }
    unsigned more = 1; /* the last line: "... and N more entries assumed" */
    if (m->n_defaulted == KT_MACHINE_MAX_DEFAULTED &&
        sscanf(m->defaulted[KT_MACHINE_MAX_DEFAULTED - 1], "... and %u", &more) == 1)
        more++;
    snprintf(m->defaulted[KT_MACHINE_MAX_DEFAULTED - 1], sizeof m->defaulted[0],
             "... and %u more entries assumed (placement/README.md)", more);
    m->n_defaulted = KT_MACHINE_MAX_DEFAULTED;
}

/* Fills the node figures that are still 0 / unset (mask bits) with defaults. */
enum {
    HAVE_THREADS = 1, HAVE_MEMORY = 2, HAVE_TRIAD = 4, HAVE_FMA = 8, HAVE_INT8 = 16,
    HAVE_H2D = 32, HAVE_D2H = 64, HAVE_LATENCY = 128,
};

static double default_prefill(enum kt_type t, double fma_gflops, double int8_gops)
{
    return KT_MACHINE_DEFAULT_PREFILL_SHARE * (kt_type_traits(t)->is_quantized ? int8_gops : fma_gflops);
}

static void default_node(struct kt_machine *m, struct kt_machine_node *n, unsigned have, const bool *have_decode,
                         const bool *have_prefill)
{
    const int i = (int)(n - m->nodes);
    if (!(have & HAVE_TRIAD)) {
        n->triad_gbps = KT_MACHINE_DEFAULT_TRIAD_GBPS;
        note_default(m, "nodes[%d].triad_gbps: %g GB/s assumed", i, n->triad_gbps);
    }
    if (!(have & HAVE_FMA)) {
        n->fma_gflops = KT_MACHINE_DEFAULT_FMA_GFLOPS;
        note_default(m, "nodes[%d].fma_gflops: %g GFLOP/s assumed", i, n->fma_gflops);
    }
    if (!(have & HAVE_INT8)) {
        n->int8_gops = KT_MACHINE_DEFAULT_INT8_GOPS;
        note_default(m, "nodes[%d].int8_gops: %g GOP/s assumed", i, n->int8_gops);
    }
    if (!(have & HAVE_THREADS))
        note_default(m, "nodes[%d].threads: unknown (0)", i);
    if (!(have & HAVE_MEMORY))
        note_default(m, "nodes[%d].memory_gib: unknown (0)", i);
    for (size_t k = 0; k < N_MACHINE_TYPES; k++) {
        const enum kt_type t = machine_types[k];
        if (!have_decode[t]) {
            n->decode[t] = (struct kt_machine_rate){KT_MACHINE_DEFAULT_DECODE_SHARE * n->triad_gbps,
                                                    KT_MACHINE_DEFAULT_OVERHEAD_US};
            note_default(m, "nodes[%d].decode.%s: %.3g GB/s, %g us assumed", i, kt_type_name(t),
                         n->decode[t].gbps, n->decode[t].overhead_us);
        }
        if (!have_prefill[t]) {
            n->prefill_gflops[t] = default_prefill(t, n->fma_gflops, n->int8_gops);
            note_default(m, "nodes[%d].prefill_gflops.%s: %.3g assumed", i, kt_type_name(t), n->prefill_gflops[t]);
        }
    }
}

static void default_accel(struct kt_machine *m, struct kt_machine_accel *a, unsigned have, const bool *have_decode,
                          const bool *have_prefill)
{
    const int i = (int)(a - m->accel);
    const bool sim = a->backend == KT_PLACE_SIM;
    if (!(have & HAVE_H2D)) {
        a->h2d_gbps = KT_MACHINE_DEFAULT_LINK_GBPS;
        note_default(m, "accelerators[%d].h2d_gbps: %g GB/s assumed", i, a->h2d_gbps);
    }
    if (!(have & HAVE_D2H)) {
        a->d2h_gbps = KT_MACHINE_DEFAULT_LINK_GBPS;
        note_default(m, "accelerators[%d].d2h_gbps: %g GB/s assumed", i, a->d2h_gbps);
    }
    if (!(have & HAVE_LATENCY)) {
        a->latency_us = KT_MACHINE_DEFAULT_LINK_LATENCY_US;
        note_default(m, "accelerators[%d].latency_us: %g us assumed", i, a->latency_us);
    }
    if (!(have & HAVE_MEMORY) && !sim)
        note_default(m, "accelerators[%d].memory_gib: unknown (0)", i);
    for (size_t k = 0; k < N_MACHINE_TYPES; k++) {
        const enum kt_type t = machine_types[k];
        if (!have_decode[t]) {
            a->decode[t] = sim ? (struct kt_machine_rate){KT_MACHINE_DEFAULT_SIM_DECODE_GBPS,
                                                          KT_MACHINE_DEFAULT_OVERHEAD_US}
                               : (struct kt_machine_rate){KT_MACHINE_DEFAULT_GPU_DECODE_GBPS,
                                                          KT_MACHINE_DEFAULT_GPU_OVERHEAD_US};
            note_default(m, "accelerators[%d].decode.%s: %.3g GB/s, %g us assumed", i, kt_type_name(t),
                         a->decode[t].gbps, a->decode[t].overhead_us);
        }
        if (!have_prefill[t]) {
            a->prefill_gflops[t] = sim ? default_prefill(t, KT_MACHINE_DEFAULT_FMA_GFLOPS / 2,
                                                         KT_MACHINE_DEFAULT_INT8_GOPS / 2)
                                       : KT_MACHINE_DEFAULT_GPU_PREFILL_GFLOPS;
            note_default(m, "accelerators[%d].prefill_gflops.%s: %.3g assumed", i, kt_type_name(t),
                         a->prefill_gflops[t]);
        }
    }
}

void kt_machine_defaults(struct kt_machine *m, int n_nodes)
{
    memset(m, 0, sizeof *m);
    kt_machine_this_kind(m->kind, sizeof m->kind);
    n_nodes = n_nodes < 1 ? 1 : n_nodes > KT_MACHINE_MAX_NODES ? KT_MACHINE_MAX_NODES : n_nodes;
    const bool none[KT_TYPE_COUNT] = {false};
    m->n_nodes = n_nodes;
    for (int i = 0; i < n_nodes; i++) {
        m->nodes[i].node = i;
        default_node(m, &m->nodes[i], 0, none, none);
    }
    m->n_accel = 1;
    struct kt_machine_accel *sim = &m->accel[0];
    snprintf(sim->name, sizeof sim->name, "sim");
    sim->backend = KT_PLACE_SIM;
    sim->shares_host = true;
    default_accel(m, sim, 0, none, none);
    m->net_gbps = KT_MACHINE_DEFAULT_NET_GBPS;
    m->net_latency_us = KT_MACHINE_DEFAULT_NET_LATENCY_US;
}

/* ---- parsing --------------------------------------------------------------------------- */

struct parser {
    const char *name; /* the file, for messages */
    kt_err *err;
};

static kt_status bad(const struct parser *p, const char *path, const char *what)
{
    return kt_err_set(p->err, KT_ERR_FORMAT, "%s: %s: %s", p->name, path, what);
}

/* A finite number in [0, max]. */
static kt_status get_figure(const struct parser *p, json_t *v, const char *path, double max, double *out)
{
    const double x = json_is_number(v) ? json_number_value(v) : -1;
    if (!json_is_number(v) || !isfinite(x) || x < 0)
        return bad(p, path, "expected a non-negative number");
    if (x > max)
        return kt_err_set(p->err, KT_ERR_FORMAT, "%s: %s: %g is beyond any real machine (at most %g)", p->name, path,
                          x, max);
    *out = x;
    return KT_OK;
}

static kt_status get_int(const struct parser *p, json_t *v, const char *path, json_int_t max, json_int_t *out)
{
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > max) {
        char what[64];
        snprintf(what, sizeof what, "expected an integer from 0 to %lld", (long long)max);
        return bad(p, path, what);
    }
    *out = json_integer_value(v);
    return KT_OK;
}

/* The key among known[] (NULL-terminated), or -1 with an error naming the known keys. */
static int known_key(const struct parser *p, const char *path, const char *key, const char *const *known,
                     kt_status *st)
{
    for (int i = 0; known[i]; i++)
        if (!strcmp(key, known[i]))
            return i;
    char list[256] = "";
    for (int i = 0; known[i]; i++)
        snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", i ? ", " : "", known[i]);
    char what[384];
    snprintf(what, sizeof what, "unknown key '%.64s' (known: %s)", key, list);
    *st = bad(p, path, what);
    return -1;
}

/* A weight type's key at sub: its type in *t, or a refusal (unknown, or given twice in have). */
static kt_status type_key(const struct parser *p, const char *sub, const char *key, const bool *have, int *t)
{
    *t = kt_type_from_name(key);
    if (*t < 0 || !kt_type_traits(*t))
        return bad(p, sub, "unknown weight type (GGUF names: q4_K, q8_0, bf16, f32, ...)");
    if (have[*t])
        return bad(p, sub, "type given twice");
    return KT_OK;
}

/* {"TYPE": {"gbps": G, "overhead_us": U}, ...} at path into rates. */
static kt_status parse_decode(const struct parser *p, json_t *obj, const char *path, struct kt_machine_rate *rates,
                              bool *have)
{
    if (!json_is_object(obj))
        return bad(p, path, "expected an object of weight types ({\"q4_K\": {\"gbps\": G, \"overhead_us\": U}})");
    const char *key;
    json_t *v;
    char sub[160];
    json_object_foreach(obj, key, v) {
        snprintf(sub, sizeof sub, "%s.%.32s", path, key);
        int t;
        kt_status st = type_key(p, sub, key, have, &t);
        if (st)
            return st;
        if (!json_is_object(v))
            return bad(p, sub, "expected {\"gbps\": G, \"overhead_us\": U}");
        static const char *const known[] = {"gbps", "overhead_us", NULL};
        const char *k2;
        json_t *f;
        struct kt_machine_rate r = {0, 0};
        bool got_gbps = false;
        json_object_foreach(v, k2, f) {
            char leaf[200];
            snprintf(leaf, sizeof leaf, "%s.%s", sub, k2);
            st = KT_OK;
            const int which = known_key(p, sub, k2, known, &st);
            if (which < 0)
                return st;
            if ((st = get_figure(p, f, leaf, MAX_FIGURE, which == 0 ? &r.gbps : &r.overhead_us)))
                return st;
            got_gbps = got_gbps || which == 0;
        }
        if (!got_gbps || r.gbps < MIN_RATE_GBPS)
            return bad(p, sub, "gbps: expected a number of at least 0.001 (GB/s of weights read)");
        rates[t] = r;
        have[t] = true;
    }
    return KT_OK;
}

/* A rate at path: 0 (unknown) or at least MIN_RATE_GBPS (less would make a prediction overflow). */
static kt_status get_rate(const struct parser *p, json_t *v, const char *path, double *out)
{
    kt_status st = get_figure(p, v, path, MAX_FIGURE, out);
    if (!st && *out > 0 && *out < MIN_RATE_GBPS)
        st = bad(p, path, "expected 0 (unknown) or at least 0.001");
    return st;
}

/* {"TYPE": GFLOPS, ...} at path. */
static kt_status parse_prefill(const struct parser *p, json_t *obj, const char *path, double *gflops, bool *have)
{
    if (!json_is_object(obj))
        return bad(p, path, "expected an object of weight types ({\"q4_K\": GFLOPS})");
    const char *key;
    json_t *v;
    char sub[160];
    json_object_foreach(obj, key, v) {
        snprintf(sub, sizeof sub, "%s.%.32s", path, key);
        int t;
        kt_status st = type_key(p, sub, key, have, &t);
        if (st)
            return st;
        if ((st = get_rate(p, v, sub, &gflops[t])))
            return st;
        have[t] = gflops[t] > 0;
    }
    return KT_OK;
}

static kt_status parse_node(const struct parser *p, struct kt_machine *m, json_t *obj, int i)
{
    char path[64], sub[96];
    snprintf(path, sizeof path, "nodes[%d]", i);
    if (!json_is_object(obj))
        return bad(p, path, "expected an object");
    static const char *const known[] = {"node",      "threads", "memory_gib", "triad_gbps", "fma_gflops",
                                        "int8_gops", "decode",  "prefill_gflops", "f32_cached_gbps", "decode_rows",
                                        "prefill_rows_gflops", "prefill_fixed_gbps", "prefill_rows_fixed_gbps",
                                        "head_dequant_gelems", "attention_gflops", NULL};
    struct kt_machine_node *n = &m->nodes[i];
    bool have_decode[KT_TYPE_COUNT] = {false}, have_prefill[KT_TYPE_COUNT] = {false};
    bool have_rows[KT_TYPE_COUNT] = {false}, have_prefill_rows[KT_TYPE_COUNT] = {false};
    bool have_fixed[KT_TYPE_COUNT] = {false}, have_rows_fixed[KT_TYPE_COUNT] = {false};
    bool have_dequant[KT_TYPE_COUNT] = {false};
    unsigned have = 0;
    bool have_node = false;
    const char *key;
    json_t *v;
    kt_status st = KT_OK;
    json_object_foreach(obj, key, v) {
        const int which = known_key(p, path, key, known, &st);
        if (which < 0)
            return st;
        snprintf(sub, sizeof sub, "%s.%s", path, key);
        json_int_t iv = 0;
        double gib = 0;
        switch (which) {
        case 0:
            if ((st = get_int(p, v, sub, KT_MACHINE_MAX_NODES - 1, &iv)))
                return st;
            n->node = (int)iv;
            have_node = true;
            break;
        case 1:
            if ((st = get_int(p, v, sub, MAX_THREADS, &iv)))
                return st;
            n->threads = (uint32_t)iv;
            have |= HAVE_THREADS;
            break;
        case 2:
            if ((st = get_figure(p, v, sub, MAX_MEMORY_GIB, &gib)))
                return st;
            n->memory_bytes = (uint64_t)llround(gib * 1073741824.0);
            have |= HAVE_MEMORY;
            break;
        case 3: st = get_figure(p, v, sub, MAX_FIGURE, &n->triad_gbps), have |= HAVE_TRIAD; break;
        case 4: st = get_figure(p, v, sub, MAX_FIGURE, &n->fma_gflops), have |= HAVE_FMA; break;
        case 5: st = get_figure(p, v, sub, MAX_FIGURE, &n->int8_gops), have |= HAVE_INT8; break;
        case 6: st = parse_decode(p, v, sub, n->decode, have_decode); break;
        case 7: st = parse_prefill(p, v, sub, n->prefill_gflops, have_prefill); break;
        case 8: st = get_rate(p, v, sub, &n->f32_cached_gbps); break;
        case 9: st = parse_decode(p, v, sub, n->decode_rows, have_rows); break; /* optional: never defaulted */
        case 10: st = parse_prefill(p, v, sub, n->prefill_rows_gflops, have_prefill_rows); break; /* optional too */
        case 11: st = parse_prefill(p, v, sub, n->prefill_fixed_gbps, have_fixed); break; /* and the rest */
        case 12: st = parse_prefill(p, v, sub, n->prefill_rows_fixed_gbps, have_rows_fixed); break;
        case 13: st = parse_prefill(p, v, sub, n->head_dequant_gelems, have_dequant); break;
        default: st = get_rate(p, v, sub, &n->attention_gflops); break;
        }
        if (st)
            return st;
    }
    if (!have_node)
        return bad(p, path, "node: missing (the topology index of the NUMA node)");
    for (int j = 0; j < i; j++)
        if (m->nodes[j].node == n->node) {
            snprintf(sub, sizeof sub, "%s.node", path);
            char what[96];
            snprintf(what, sizeof what, "node %d is also nodes[%d]", n->node, j);
            return bad(p, sub, what);
        }
    /* a zero figure is as good as missing: nothing can be predicted from it */
    if ((n->triad_gbps > 0 && n->triad_gbps < MIN_RATE_GBPS) || (n->fma_gflops > 0 && n->fma_gflops < MIN_RATE_GBPS) ||
        (n->int8_gops > 0 && n->int8_gops < MIN_RATE_GBPS))
        return bad(p, path, "triad_gbps, fma_gflops, int8_gops: expected 0 (unknown) or at least 0.001");
    have &= ~(unsigned)((n->triad_gbps > 0 ? 0 : HAVE_TRIAD) | (n->fma_gflops > 0 ? 0 : HAVE_FMA) |
                        (n->int8_gops > 0 ? 0 : HAVE_INT8));
    default_node(m, n, have, have_decode, have_prefill);
    return KT_OK;
}

static kt_status parse_accel(const struct parser *p, struct kt_machine *m, json_t *obj, int i)
{
    char path[64], sub[96];
    snprintf(path, sizeof path, "accelerators[%d]", i);
    if (!json_is_object(obj))
        return bad(p, path, "expected an object");
    static const char *const known[] = {"name",     "backend",    "memory_gib", "h2d_gbps", "d2h_gbps",
                                        "latency_us", "decode", "prefill_gflops", "prefill_fixed_gbps", "shares_host", NULL};
    struct kt_machine_accel *a = &m->accel[i];
    bool have_decode[KT_TYPE_COUNT] = {false}, have_prefill[KT_TYPE_COUNT] = {false};
    bool have_fixed[KT_TYPE_COUNT] = {false};
    unsigned have = 0;
    bool have_name = false, have_backend = false, have_shares = false;
    const char *key;
    json_t *v;
    kt_status st = KT_OK;
    json_object_foreach(obj, key, v) {
        const int which = known_key(p, path, key, known, &st);
        if (which < 0)
            return st;
        snprintf(sub, sizeof sub, "%s.%s", path, key);
        double gib = 0;
        switch (which) {
        case 0:
            if (!json_is_string(v) || !json_string_length(v) || json_string_length(v) >= sizeof a->name ||
                strlen(json_string_value(v)) != json_string_length(v))
                return bad(p, sub, "expected a name of 1 to 31 characters");
            snprintf(a->name, sizeof a->name, "%s", json_string_value(v));
            have_name = true;
            break;
        case 1:
            if (!json_is_string(v))
                return bad(p, sub, "expected \"sim\" or \"cuda\"");
            if (!strcmp(json_string_value(v), "sim"))
                a->backend = KT_PLACE_SIM;
            else if (!strcmp(json_string_value(v), "cuda"))
                a->backend = KT_PLACE_CUDA;
            else
                return bad(p, sub, "expected \"sim\" or \"cuda\"");
            have_backend = true;
            break;
        case 2:
            if ((st = get_figure(p, v, sub, MAX_MEMORY_GIB, &gib)))
                return st;
            a->memory_bytes = (uint64_t)llround(gib * 1073741824.0);
            have |= HAVE_MEMORY;
            break;
        case 3: st = get_figure(p, v, sub, MAX_FIGURE, &a->h2d_gbps), have |= HAVE_H2D; break;
        case 4: st = get_figure(p, v, sub, MAX_FIGURE, &a->d2h_gbps), have |= HAVE_D2H; break;
        case 5: st = get_figure(p, v, sub, MAX_FIGURE, &a->latency_us), have |= HAVE_LATENCY; break;
        case 6: st = parse_decode(p, v, sub, a->decode, have_decode); break;
        case 7: st = parse_prefill(p, v, sub, a->prefill_gflops, have_prefill); break;
        case 8: st = parse_prefill(p, v, sub, a->prefill_fixed_gbps, have_fixed); break; /* optional */
        default: /* optional: true for the sim unless the file says otherwise */
            if (!json_is_boolean(v))
                return bad(p, sub, "expected true or false");
            a->shares_host = json_is_true(v);
            have_shares = true;
            break;
        }
        if (st)
            return st;
    }
    if (!have_name)
        return bad(p, path, "name: missing (\"sim\", \"cuda0\", ...)");
    if (!have_backend)
        return bad(p, path, "backend: missing (\"sim\" or \"cuda\")");
    if (!have_shares)
        a->shares_host = a->backend == KT_PLACE_SIM;
    for (int j = 0; j < i; j++)
        if (!strcmp(m->accel[j].name, a->name)) {
            snprintf(sub, sizeof sub, "%s.name", path);
            char what[96];
            snprintf(what, sizeof what, "'%s' is also accelerators[%d]", a->name, j);
            return bad(p, sub, what);
        }
    /* a link of 0 GB/s would make every transfer infinite: treat as missing */
    if ((a->h2d_gbps > 0 && a->h2d_gbps < MIN_RATE_GBPS) || (a->d2h_gbps > 0 && a->d2h_gbps < MIN_RATE_GBPS))
        return bad(p, path, "h2d_gbps, d2h_gbps: expected 0 (unknown) or at least 0.001");
    have &= ~(unsigned)((a->h2d_gbps > 0 ? 0 : HAVE_H2D) | (a->d2h_gbps > 0 ? 0 : HAVE_D2H));
    default_accel(m, a, have, have_decode, have_prefill);
    return KT_OK;
}

/* "network": {"bandwidth_gbps": B, "latency_us": L}, both optional. */
static kt_status parse_network(const struct parser *p, struct kt_machine *m, json_t *obj)
{
    static const char *const known[] = {"bandwidth_gbps", "latency_us", NULL};
    if (!json_is_object(obj))
        return bad(p, "network", "expected an object {\"bandwidth_gbps\": GB/s, \"latency_us\": us}");
    const char *key;
    json_t *v;
    kt_status st = KT_OK;
    json_object_foreach(obj, key, v) {
        if (known_key(p, "network", key, known, &st) < 0)
            return st;
    }
    json_t *bw = json_object_get(obj, "bandwidth_gbps"), *lat = json_object_get(obj, "latency_us");
    if (bw && (st = get_figure(p, bw, "network.bandwidth_gbps", 1e5, &m->net_gbps)))
        return st;
    if (bw && !(m->net_gbps > 0))
        return bad(p, "network.bandwidth_gbps", "expected a positive number of GB/s (0 would never deliver)");
    if (lat && (st = get_figure(p, lat, "network.latency_us", 1e7, &m->net_latency_us)))
        return st;
    m->network_given = true;
    return KT_OK;
}

kt_status kt_machine_parse(const char *text, size_t len, const char *name, struct kt_machine **out, kt_err *err)
{
    *out = NULL;
    struct parser p = {name ? name : "machine file", err};
    json_error_t jerr;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return kt_err_set(err, KT_ERR_FORMAT, "%s:%d:%d: %s", p.name, jerr.line, jerr.column, jerr.text);
    kt_status st = KT_OK;
    struct kt_machine *m = calloc(1, sizeof *m);
    if (!m) {
        st = kt_err_set(err, KT_ERR_NOMEM, "%s: out of memory", p.name);
        goto done;
    }
    if (!json_is_object(root)) {
        st = kt_err_set(err, KT_ERR_FORMAT, "%s: expected a JSON object", p.name);
        goto done;
    }
    static const char *const known[] = {"version", "kind", "topology", "nodes", "accelerators", "network", NULL};
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v) {
        if (known_key(&p, "(top level)", key, known, &st) < 0)
            goto done;
    }
    json_t *version = json_object_get(root, "version"), *kind = json_object_get(root, "kind");
    json_t *topology = json_object_get(root, "topology"), *nodes = json_object_get(root, "nodes");
    json_t *accel = json_object_get(root, "accelerators");
    if (!json_is_integer(version) || json_integer_value(version) != 1) {
        st = bad(&p, "version", "expected 1");
        goto done;
    }
    if (!json_is_string(kind) || json_string_length(kind) >= sizeof m->kind ||
        strlen(json_string_value(kind)) != json_string_length(kind)) {
        st = bad(&p, "kind", "expected a string of under 160 characters (kt_machine_this_kind)");
        goto done;
    }
    snprintf(m->kind, sizeof m->kind, "%s", json_string_value(kind));
    if (topology && (!json_is_string(topology) || json_string_length(topology) >= sizeof m->topology ||
                     strlen(json_string_value(topology)) != json_string_length(topology))) {
        st = bad(&p, "topology", "expected a string of under 128 characters (\"\": this machine's own)");
        goto done;
    }
    snprintf(m->topology, sizeof m->topology, "%s", topology ? json_string_value(topology) : "");
    if (!json_is_array(nodes) || json_array_size(nodes) == 0) {
        st = bad(&p, "nodes", "expected an array of one object per NUMA node");
        goto done;
    }
    if (json_array_size(nodes) > KT_MACHINE_MAX_NODES) {
        char what[64];
        snprintf(what, sizeof what, "%zu nodes is too many (at most %d)", json_array_size(nodes),
                 KT_MACHINE_MAX_NODES);
        st = bad(&p, "nodes", what);
        goto done;
    }
    m->n_nodes = (int)json_array_size(nodes);
    for (int i = 0; i < m->n_nodes; i++)
        if ((st = parse_node(&p, m, json_array_get(nodes, (size_t)i), i)))
            goto done;
    if (accel && !json_is_array(accel)) {
        st = bad(&p, "accelerators", "expected an array (may be empty)");
        goto done;
    }
    if (accel && json_array_size(accel) > KT_MACHINE_MAX_ACCEL) {
        char what[64];
        snprintf(what, sizeof what, "%zu accelerators is too many (at most %d)", json_array_size(accel),
                 KT_MACHINE_MAX_ACCEL);
        st = bad(&p, "accelerators", what);
        goto done;
    }
    m->n_accel = accel ? (int)json_array_size(accel) : 0;
    for (int i = 0; i < m->n_accel; i++)
        if ((st = parse_accel(&p, m, json_array_get(accel, (size_t)i), i)))
            goto done;
    m->net_gbps = KT_MACHINE_DEFAULT_NET_GBPS;
    m->net_latency_us = KT_MACHINE_DEFAULT_NET_LATENCY_US;
    json_t *network = json_object_get(root, "network");
    if (network && (st = parse_network(&p, m, network)))
        goto done;
done:
    json_decref(root);
    if (st) {
        free(m);
        return st;
    }
    *out = m;
    return KT_OK;
}

kt_status kt_machine_load(const char *path, struct kt_machine **out, kt_err *err)
{
    *out = NULL;
    char *text = NULL;
    size_t len = 0;
    kt_status st = kt_read_small_file(path, MACHINE_MAX_FILE_BYTES, &text, &len, err);
    if (st == KT_OK)
        st = kt_machine_parse(text, len, path, out, err);
    free(text);
    return st;
}

/* ---- saving ---------------------------------------------------------------------------- */

static bool set_real(json_t *o, const char *key, double v)
{
    return json_object_set_new(o, key, json_real(v)) == 0;
}

/* {"TYPE": {"gbps": G, "overhead_us": U}, ...} of the measured rates as key;
 * with none, the key only when always. */
static bool add_rates(json_t *o, const char *key, const struct kt_machine_rate *rates, bool always)
{
    json_t *j = json_object();
    bool ok = j != NULL, any = false;
    for (int t = 0; ok && t < KT_TYPE_COUNT; t++)
        if (rates[t].gbps > 0) {
            json_t *r = json_object();
            ok = r && json_object_set_new(j, kt_type_name(t), r) == 0 && set_real(r, "gbps", rates[t].gbps) &&
                 set_real(r, "overhead_us", rates[t].overhead_us);
            any = true;
        }
    ok = ok && (!(any || always) || json_object_set(o, key, j) == 0);
    json_decref(j);
    return ok;
}

/* {"TYPE": GFLOPS, ...} of the measured figures as key; with none, the key only when always. */
static bool add_figures(json_t *o, const char *key, const double *gflops, bool always)
{
    json_t *j = json_object();
    bool ok = j != NULL, any = false;
    for (int t = 0; ok && t < KT_TYPE_COUNT; t++)
        if (gflops[t] > 0) {
            ok = set_real(j, kt_type_name(t), gflops[t]);
            any = true;
        }
    ok = ok && (!(any || always) || json_object_set(o, key, j) == 0);
    json_decref(j);
    return ok;
}

/* The measured (non-zero) rates and prefill figures of one place, both keys always. */
static bool add_kernels(json_t *o, const struct kt_machine_rate *decode, const double *prefill)
{
    return add_rates(o, "decode", decode, true) && add_figures(o, "prefill_gflops", prefill, true);
}

kt_status kt_machine_save(const struct kt_machine *m, const char *path, kt_err *err)
{
    json_t *root = json_object(), *nodes = json_array(), *accel = json_array();
    bool ok = root && nodes && accel && json_object_set_new(root, "version", json_integer(1)) == 0 &&
              json_object_set_new(root, "kind", json_string(m->kind)) == 0 &&
              json_object_set_new(root, "topology", json_string(m->topology)) == 0 &&
              json_object_set(root, "nodes", nodes) == 0 && json_object_set(root, "accelerators", accel) == 0;
    for (int i = 0; ok && i < m->n_nodes; i++) {
        const struct kt_machine_node *n = &m->nodes[i];
        json_t *o = json_object();
        ok = o && json_array_append_new(nodes, o) == 0 && json_object_set_new(o, "node", json_integer(n->node)) == 0 &&
             json_object_set_new(o, "threads", json_integer(n->threads)) == 0 &&
             set_real(o, "memory_gib", (double)n->memory_bytes / 1073741824.0) &&
             set_real(o, "triad_gbps", n->triad_gbps) && set_real(o, "fma_gflops", n->fma_gflops) &&
             set_real(o, "int8_gops", n->int8_gops) && add_kernels(o, n->decode, n->prefill_gflops) &&
             (n->f32_cached_gbps <= 0 || set_real(o, "f32_cached_gbps", n->f32_cached_gbps)) &&
             add_rates(o, "decode_rows", n->decode_rows, false) &&
             add_figures(o, "prefill_rows_gflops", n->prefill_rows_gflops, false) &&
             add_figures(o, "prefill_fixed_gbps", n->prefill_fixed_gbps, false) &&
             add_figures(o, "prefill_rows_fixed_gbps", n->prefill_rows_fixed_gbps, false) &&
             add_figures(o, "head_dequant_gelems", n->head_dequant_gelems, false) &&
             (n->attention_gflops <= 0 || set_real(o, "attention_gflops", n->attention_gflops));
    }
    for (int i = 0; ok && i < m->n_accel; i++) {
        const struct kt_machine_accel *a = &m->accel[i];
        json_t *o = json_object();
        ok = o && json_array_append_new(accel, o) == 0 && json_object_set_new(o, "name", json_string(a->name)) == 0 &&
             json_object_set_new(o, "backend", json_string(kt_place_backend_name(a->backend))) == 0 &&
             set_real(o, "memory_gib", (double)a->memory_bytes / 1073741824.0) &&
             set_real(o, "h2d_gbps", a->h2d_gbps) && set_real(o, "d2h_gbps", a->d2h_gbps) &&
             set_real(o, "latency_us", a->latency_us) && add_kernels(o, a->decode, a->prefill_gflops) &&
             add_figures(o, "prefill_fixed_gbps", a->prefill_fixed_gbps, false) &&
             json_object_set_new(o, "shares_host", json_boolean(a->shares_host)) == 0;
    }
    if (ok && m->network_given) { /* as the file gave them */
        json_t *o = json_object();
        ok = o && json_object_set_new(root, "network", o) == 0 && set_real(o, "bandwidth_gbps", m->net_gbps) &&
             set_real(o, "latency_us", m->net_latency_us);
    }
    /* 10 significant digits: more than any figure measures, and short to read */
    char *text = ok ? json_dumps(root, JSON_INDENT(1) | JSON_REAL_PRECISION(10)) : NULL;
    kt_status st = text ? KT_OK : kt_err_set(err, KT_ERR_NOMEM, "%s: out of memory building the machine file", path);
    if (text) {
        size_t len = strlen(text);
        text[len] = '\n'; /* json_dumps's NUL becomes the final newline */
        st = kt_write_file_atomic(path, text, len + 1, err);
    }
    free(text);
    json_decref(nodes);
    json_decref(accel);
    json_decref(root);
    return st;
}

/* ---- this machine ------------------------------------------------------------------- */

/* The CPU's model name: /proc/cpuinfo's "model name", else CPUID's brand string. */
static void cpu_model(char *buf, size_t size)
{
    buf[0] = 0;
    FILE *f = fopen("/proc/cpuinfo", "r");
    char line[512];
    while (f && fgets(line, sizeof line, f)) {
        if (strncmp(line, "model name", 10))
            continue;
        const char *c = strchr(line, ':');
        if (!c)
            continue;
        c++;
        while (*c == ' ' || *c == '\t')
            c++;
        snprintf(buf, size, "%.*s", (int)strcspn(c, "\n"), c);
        break;
    }
    if (f)
        fclose(f);
#if defined(__x86_64__) || defined(__i386__)
    unsigned r[12];
    if (!buf[0] && (unsigned)__get_cpuid_max(0x80000000u, NULL) >= 0x80000004u) {
        for (unsigned i = 0; i < 3; i++)
            __get_cpuid(0x80000002u + i, &r[4 * i], &r[4 * i + 1], &r[4 * i + 2], &r[4 * i + 3]);
        char brand[49];
        memcpy(brand, r, 48);
        brand[48] = 0;
        const char *b = brand;
        while (*b == ' ')
            b++;
        snprintf(buf, size, "%s", b);
    }
#endif
    /* trailing blanks never belong to the name */
    for (size_t n = strlen(buf); n && (buf[n - 1] == ' ' || buf[n - 1] == '\t'); n--)
        buf[n - 1] = 0;
    if (!buf[0])
        snprintf(buf, size, "unknown CPU");
}

void kt_machine_this_kind(char *buf, size_t size)
{
    char model[128];
    cpu_model(model, sizeof model);
    struct kt_topology *t = NULL;
    kt_err err;
    int n_nodes = kt_topology_create(NULL, &t, &err) == KT_OK ? t->n_nodes : 0;
    kt_topology_destroy(t);
    char nodes[32];
    if (n_nodes > 0)
        snprintf(nodes, sizeof nodes, "%d node%s", n_nodes, n_nodes == 1 ? "" : "s");
    else
        snprintf(nodes, sizeof nodes, "? nodes");
    snprintf(buf, size, "%s | %s | %s", model, nodes, kt_isa_name(kt_cpu_kernels()->isa_max));
}

kt_status kt_machine_check_kind(const struct kt_machine *m, const char *name, kt_err *err)
{
    char here[sizeof m->kind];
    kt_machine_this_kind(here, sizeof here);
    if (!strcmp(here, m->kind))
        return KT_OK;
    return kt_err_set(err, KT_ERR_INVALID,
                      "%s: measured on %s, this machine is %s (measure this one: kt-bench machine -o FILE)",
                      name ? name : "machine file", m->kind, here);
}

/* ---- prediction ---------------------------------------------------------------------- */

static double bits_per_weight(int type)
{
    const struct kt_type_traits *tr = kt_type_traits(type);
    return tr && tr->block_elems > 0 ? 8.0 * (double)tr->block_bytes / (double)tr->block_elems : 0;
}

double kt_machine_decode_seconds(const struct kt_machine_rate *rates, int type, uint64_t bytes)
{
    int use = -1;
    if (type >= 0 && type < KT_TYPE_COUNT && rates[type].gbps > 0) {
        use = type;
    } else {
        /* the measured type nearest in bits per weight: its per-byte figures */
        const double want = bits_per_weight(type);
        double best = INFINITY;
        for (int t = 0; t < KT_TYPE_COUNT; t++) {
            const double d = fabs(bits_per_weight(t) - want);
            if (rates[t].gbps > 0 && d < best)
                best = d, use = t;
        }
    }
    const struct kt_machine_rate r =
        use >= 0 ? rates[use]
                 : (struct kt_machine_rate){KT_MACHINE_DEFAULT_DECODE_SHARE * KT_MACHINE_DEFAULT_TRIAD_GBPS,
                                            KT_MACHINE_DEFAULT_OVERHEAD_US};
    return r.overhead_us * 1e-6 + (double)bytes / (r.gbps * 1e9);
}
