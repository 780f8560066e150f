/*
 * machine_stub_place.c - PRIVATE STUB of machine.h for the `place` branch
 * while placement/machine.c is written on branch `machine`.  Deleted before
 * the branch is merged.
 */
#include "machine.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static const double GIB = 1073741824.0;

static double num(json_t *o, const char *k, double dflt)
{
    json_t *v = json_object_get(o, k);
    return json_is_number(v) ? json_number_value(v) : dflt;
}

static void rates(json_t *o, struct kt_machine_rate *r)
{
    const char *k;
    json_t *v;
    json_object_foreach(o, k, v) {
        int t = kt_type_from_name(k);
        if (t >= 0 && t < KT_TYPE_COUNT) {
            r[t].gbps = num(v, "gbps", 0);
            r[t].overhead_us = num(v, "overhead_us", 0);
        }
    }
}

kt_status kt_machine_parse(const char *text, size_t len, const char *name, struct kt_machine **out, kt_err *err)
{
    *out = NULL;
    json_error_t je;
    json_t *root = json_loadb(text, len, 0, &je);
    if (!root)
        return kt_err_set(err, KT_ERR_FORMAT, "%s: line %d: %s", name, je.line, je.text);
    struct kt_machine *m = calloc(1, sizeof *m);
    json_t *nodes = json_object_get(root, "nodes"), *acc = json_object_get(root, "accelerators");
    const char *kind = json_string_value(json_object_get(root, "kind"));
    kt_machine_defaults(m, json_array_size(nodes) ? (int)json_array_size(nodes) : 1);
    m->n_defaulted = 0;
    snprintf(m->kind, sizeof m->kind, "%s", kind ? kind : "");
    for (size_t i = 0; i < json_array_size(nodes) && i < KT_MACHINE_MAX_NODES; i++) {
        json_t *n = json_array_get(nodes, i);
        struct kt_machine_node *mn = &m->nodes[i];
        mn->node = (int)num(n, "node", (double)i);
        mn->threads = (uint32_t)num(n, "threads", mn->threads);
        mn->memory_bytes = (uint64_t)(num(n, "memory_gib", (double)mn->memory_bytes / GIB) * GIB);
        mn->triad_gbps = num(n, "triad_gbps", mn->triad_gbps);
        rates(json_object_get(n, "decode"), mn->decode);
    }
    m->n_accel = 0;
    for (size_t i = 0; i < json_array_size(acc) && i < KT_MACHINE_MAX_ACCEL; i++) {
        json_t *a = json_array_get(acc, i);
        struct kt_machine_accel *ma = &m->accel[m->n_accel++];
        const char *nm = json_string_value(json_object_get(a, "name"));
        const char *be = json_string_value(json_object_get(a, "backend"));
        snprintf(ma->name, sizeof ma->name, "%s", nm ? nm : "sim");
        ma->backend = be && strcmp(be, "cuda") == 0 ? KT_PLACE_CUDA : KT_PLACE_SIM;
        ma->memory_bytes = (uint64_t)(num(a, "memory_gib", 0.5) * GIB);
        ma->h2d_gbps = num(a, "h2d_gbps", 25);
        ma->d2h_gbps = num(a, "d2h_gbps", 25);
        ma->latency_us = num(a, "latency_us", 10);
        for (int t = 0; t < KT_TYPE_COUNT; t++)
            ma->decode[t] = (struct kt_machine_rate){ma->backend == KT_PLACE_CUDA ? 1000 : 20, 5};
        rates(json_object_get(a, "decode"), ma->decode);
    }
    json_decref(root);
    *out = m;
    return KT_OK;
}

kt_status kt_machine_load(const char *path, struct kt_machine **out, kt_err *err)
{
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f)
        return kt_err_set(err, KT_ERR_IO, "%s: cannot open", path);
    static char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    return kt_machine_parse(buf, n, path, out, err);
}

kt_status kt_machine_save(const struct kt_machine *m, const char *path, kt_err *err)
{
    (void)m;
    return kt_err_set(err, KT_ERR_UNSUPPORTED, "%s: stub", path);
}

void kt_machine_this_kind(char *buf, size_t size)
{
    snprintf(buf, size, "stub host | 1 nodes | avx512");
}

kt_status kt_machine_check_kind(const struct kt_machine *m, const char *name, kt_err *err)
{
    char here[160];
    kt_machine_this_kind(here, sizeof here);
    if (strcmp(m->kind, here) != 0)
        return kt_err_set(err, KT_ERR_INVALID, "%s: measured on %s, this machine is %s", name, m->kind, here);
    return KT_OK;
}

void kt_machine_defaults(struct kt_machine *m, int n_nodes)
{
    memset(m, 0, sizeof *m);
    kt_machine_this_kind(m->kind, sizeof m->kind);
    m->n_nodes = n_nodes;
    for (int n = 0; n < n_nodes; n++) {
        struct kt_machine_node *mn = &m->nodes[n];
        mn->node = n;
        mn->threads = 8;
        mn->memory_bytes = (uint64_t)(64 * GIB);
        mn->triad_gbps = 40;
        for (int t = 0; t < KT_TYPE_COUNT; t++)
            mn->decode[t] = (struct kt_machine_rate){20, 5};
        if (m->n_defaulted < KT_MACHINE_MAX_DEFAULTED)
            snprintf(m->defaulted[m->n_defaulted++], sizeof m->defaulted[0], "nodes[%d]: 20 GB/s assumed", n);
    }
    m->n_accel = 1;
    snprintf(m->accel[0].name, sizeof m->accel[0].name, "sim");
    m->accel[0].backend = KT_PLACE_SIM;
    m->accel[0].memory_bytes = (uint64_t)(0.5 * GIB);
    m->accel[0].h2d_gbps = m->accel[0].d2h_gbps = 25;
    m->accel[0].latency_us = 10;
    for (int t = 0; t < KT_TYPE_COUNT; t++)
        m->accel[0].decode[t] = (struct kt_machine_rate){20, 5};
    if (m->n_defaulted < KT_MACHINE_MAX_DEFAULTED)
        snprintf(m->defaulted[m->n_defaulted++], sizeof m->defaulted[0], "accelerators[0]: sim 0.5 GiB assumed");
}

double kt_machine_decode_seconds(const struct kt_machine_rate *r, int type, uint64_t bytes)
{
    double g = type >= 0 && type < KT_TYPE_COUNT && r[type].gbps > 0 ? r[type].gbps : 20;
    double o = type >= 0 && type < KT_TYPE_COUNT ? r[type].overhead_us : 0;
    return o * 1e-6 + (double)bytes / (g * 1e9);
}
