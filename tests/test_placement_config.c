/*
 * test_placement_config.c - placement config v1 (placement/config.h) and its
 * resolution against a model (placement/plan.h), with routing profiles
 * (placement/profile.h).
 *
 * Proves: every file in configs/ parses and resolves against the model it is
 * written for - the Kimi-K2 and DeepSeek-V3 examples against models of the
 * real dimensions built in memory, with types at least as large as a Q4_K_M
 * file's, so their memory budgets really hold; each class of bad document is
 * refused with the right line and key path; errors that need the model
 * (unknown experts and layers, dense layers, over-claimed layers, double
 * placements, missing NUMA nodes, budgets) name the config line too; tiny-sim
 * puts attention, shared experts and half of the routed experts on the sim
 * device; a profile picks the hottest experts (ties to the lower index) and
 * balances CPU nodes by load while keeping their expert counts within one;
 * replicas copy the hottest CPU experts to the other nodes.
 */
#include <dirent.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config.h"
#include "engine_plan.h"
#include "model.h"
#include "plan.h"
#include "profile.h"
#include "quant.h"
#include "testlib.h"

/* ---- helpers --------------------------------------------------------------------- */

static struct kt_placement_config *parse(const char *text)
{
    struct kt_placement_config *c = NULL;
    kt_err err = {0};
    KT_CHECK(kt_placement_config_parse(text, strlen(text), "t.yaml", &c, &err) == KT_OK, "%s\n%s", err.msg, text);
    return c;
}

static struct kt_placement *resolve(const char *text, const struct kt_model *m, int n_nodes, const char *profile)
{
    struct kt_placement_config *c = parse(text);
    struct kt_placement *p = NULL;
    kt_err err = {0};
    if (c && m)
        KT_CHECK(kt_placement_resolve(c, m, n_nodes, profile, &p, &err) == KT_OK, "%s\n%s", err.msg, text);
    kt_placement_config_destroy(c);
    return p;
}

/* The message of a refused resolution ("" when it was accepted). */
static const char *resolve_error(const char *text, const struct kt_model *m, int n_nodes, const char *profile)
{
    static kt_err err;
    memset(&err, 0, sizeof err);
    struct kt_placement_config *c = parse(text);
    struct kt_placement *p = NULL;
    if (c && m && kt_placement_resolve(c, m, n_nodes, profile, &p, &err) == KT_OK)
        err.msg[0] = 0;
    KT_CHECK((p == NULL) == (err.msg[0] != 0), "a plan exactly when there is no error");
    kt_placement_destroy(p);
    kt_placement_config_destroy(c);
    return err.msg;
}

/* kt-synth's tiny and tiny-v3, written once and opened by every case that needs one. */
static char g_tiny_path[2][1024];

static struct kt_model *tiny_model(const char *preset)
{
    char *path = g_tiny_path[strcmp(preset, "tiny") != 0];
    if (!path[0]) {
        snprintf(path, sizeof g_tiny_path[0], "%s", kt_test_path(preset));
        int rc = kt_test_system("'%s' --preset %s -q -o '%s' > /dev/null 2>&1", kt_test_tool("kt-synth"), preset,
                                path);
        KT_CHECK(rc == 0, "kt-synth --preset %s failed (%d)", preset, rc);
    }
    struct kt_model *m = NULL;
    kt_err err = {0};
    KT_CHECK(kt_model_open(path, &m, &err) == KT_OK, "%s", err.msg);
    return m;
}

static const char *write_text(const char *name, const char *text)
{
    const char *path = kt_test_path(name);
    FILE *f = fopen(path, "w");
    KT_CHECK(f != NULL, "cannot write %s", path);
    if (f) {
        fputs(text, f);
        fclose(f);
    }
    return path;
}

static uint32_t experts_on(const struct kt_placement *p, uint32_t il, int device)
{
    uint32_t n = 0;
    for (uint32_t x = 0; x < p->n_expert; x++)
        n += kt_placement_expert(p, il, x)->device == device;
    return n;
}

/* ---- models of real dimensions, in memory ------------------------------------------ */

/* The deepseek2 tensor table of a model, without data: only shapes and bytes,
 * which is all placement reads. */
struct shape {
    uint32_t n_layer, n_dense, E, F, H, qr, kvr, dn, dr, dv, n_expert, f, n_shared, n_vocab;
    int matrix_type;             /* every 2-D weight not named below */
    int k_b_type;                /* attn_k_b: rows of dn = 128 take no K-quant */
    int down_type;               /* every ffn_down: dense, shared and routed */
    int output_type;
};

/* Kimi-K2 and DeepSeek-V3 (docs/deepseek2.md, Hyperparameters) as llama.cpp's Q4_K_M recipe stores them,
 * rounded up: q4_K everywhere, attn_k_b q5_0 (its fallback), output q6_K, and
 * every ffn_down q6_K where the recipe gives q6_K to only some layers' - so a
 * Q4_K_M file is no larger than this in any part. */
static const struct shape KIMI_K2 = {61, 1, 7168, 18432, 64, 1536, 512, 128, 64, 128, 384, 2048, 1, 163840,
                                     KT_TYPE_Q4_K, KT_TYPE_Q5_0, KT_TYPE_Q6_K, KT_TYPE_Q6_K};
static const struct shape DEEPSEEK_V3 = {61, 3, 7168, 18432, 128, 1536, 512, 128, 64, 128, 256, 2048, 1, 129280,
                                         KT_TYPE_Q4_K, KT_TYPE_Q5_0, KT_TYPE_Q6_K, KT_TYPE_Q6_K};
/* kt-synth --preset tiny, to check the builder against a real file. */
static const struct shape TINY = {4, 1, 512, 1024, 8, 192, 128, 32, 16, 32, 32, 128, 1, 1043,
                                  KT_TYPE_F32, KT_TYPE_F32, KT_TYPE_F32, KT_TYPE_F32};

struct shaped_model {
    struct kt_model m;
    struct kt_gguf_tensor tensors[2048]; /* 61 layers of at most 19, and 3 more */
    int n_tensors;
};

static const struct kt_gguf_tensor *add(struct shaped_model *s, enum kt_tensor_class c, int type, int64_t ne0,
                                        int64_t ne1, int64_t ne2)
{
    const struct kt_type_traits *tr = kt_type_traits(type);
    if (s->n_tensors == (int)(sizeof s->tensors / sizeof s->tensors[0])) {
        fprintf(stderr, "shaped_model: too many tensors\n");
        exit(2);
    }
    struct kt_gguf_tensor *t = &s->tensors[s->n_tensors++];
    t->type = type;
    t->ne[0] = ne0;
    t->ne[1] = ne1;
    t->ne[2] = ne2;
    t->ne[3] = 1;
    t->n_dims = ne2 > 1 ? 3 : ne1 > 1 ? 2 : 1;
    t->nbytes = (uint64_t)(ne0 / tr->block_elems) * tr->block_bytes * (uint64_t)ne1 * (uint64_t)ne2;
    s->m.class_bytes[c] += t->nbytes;
    s->m.class_tensors[c]++;
    return t;
}

static struct shaped_model *shaped_model(const struct shape *sh)
{
    struct shaped_model *s = kt_test_xmalloc(sizeof *s);
    memset(s, 0, sizeof *s);
    struct kt_model *m = &s->m;
    struct kt_hparams *hp = &m->hp;
    snprintf(m->arch, sizeof m->arch, "deepseek2");
    *hp = (struct kt_hparams){.n_layer = sh->n_layer, .n_embd = sh->E, .n_ff = sh->F, .n_head = sh->H,
                              .n_head_kv = 1, .q_lora_rank = sh->qr, .kv_lora_rank = sh->kvr,
                              .qk_nope_dim = sh->dn, .qk_rope_dim = sh->dr, .v_head_dim = sh->dv, .mla_split = true,
                              .n_dense_lead = sh->n_dense, .n_expert = sh->n_expert, .n_expert_used = 8,
                              .n_expert_shared = sh->n_shared, .n_ff_exp = sh->f, .n_vocab = sh->n_vocab};
    m->layers = kt_test_xmalloc(sh->n_layer * sizeof *m->layers);
    memset(m->layers, 0, sh->n_layer * sizeof *m->layers);
    const int F32 = KT_TYPE_F32, M = sh->matrix_type, D = sh->down_type;
    const uint32_t E = sh->E, H = sh->H, fs = sh->f * sh->n_shared;
    m->token_embd = add(s, KT_CLASS_EMBED_OUTPUT, M, E, sh->n_vocab, 1);
    m->output_norm = add(s, KT_CLASS_EMBED_OUTPUT, F32, E, 1, 1);
    m->output = add(s, KT_CLASS_EMBED_OUTPUT, sh->output_type, E, sh->n_vocab, 1);
    for (uint32_t il = 0; il < sh->n_layer; il++) {
        struct kt_layer *L = &m->layers[il];
        const enum kt_tensor_class A = KT_CLASS_ATTENTION;
        L->attn_norm = add(s, A, F32, E, 1, 1);
        L->attn_q_a = add(s, A, M, E, sh->qr, 1);
        L->attn_q_a_norm = add(s, A, F32, sh->qr, 1, 1);
        L->attn_q_b = add(s, A, M, sh->qr, H * (sh->dn + sh->dr), 1);
        L->attn_kv_a_mqa = add(s, A, M, E, sh->kvr + sh->dr, 1);
        L->attn_kv_a_norm = add(s, A, F32, sh->kvr, 1, 1);
        L->attn_k_b = add(s, A, sh->k_b_type, sh->dn, sh->kvr, H);
        L->attn_v_b = add(s, A, M, sh->kvr, sh->dv, H);
        L->attn_output = add(s, A, M, H * sh->dv, E, 1);
        L->ffn_norm = add(s, KT_CLASS_DENSE_FFN, F32, E, 1, 1);
        L->is_moe = il >= sh->n_dense;
        if (!L->is_moe) {
            L->ffn_gate = add(s, KT_CLASS_DENSE_FFN, M, E, sh->F, 1);
            L->ffn_up = add(s, KT_CLASS_DENSE_FFN, M, E, sh->F, 1);
            L->ffn_down = add(s, KT_CLASS_DENSE_FFN, D, sh->F, E, 1);
            continue;
        }
        L->ffn_gate_inp = add(s, KT_CLASS_ROUTER, F32, E, sh->n_expert, 1);
        L->exp_probs_b = add(s, KT_CLASS_ROUTER, F32, sh->n_expert, 1, 1);
        L->ffn_gate_exps = add(s, KT_CLASS_ROUTED_EXPERTS, M, E, sh->f, sh->n_expert);
        L->ffn_up_exps = add(s, KT_CLASS_ROUTED_EXPERTS, M, E, sh->f, sh->n_expert);
        L->ffn_down_exps = add(s, KT_CLASS_ROUTED_EXPERTS, D, sh->f, E, sh->n_expert);
        L->ffn_gate_shexp = add(s, KT_CLASS_SHARED_EXPERTS, M, E, fs, 1);
        L->ffn_up_shexp = add(s, KT_CLASS_SHARED_EXPERTS, M, E, fs, 1);
        L->ffn_down_shexp = add(s, KT_CLASS_SHARED_EXPERTS, D, fs, E, 1);
    }
    return s;
}

static void shaped_model_destroy(struct shaped_model *s)
{
    if (s)
        free(s->m.layers);
    free(s);
}

static uint64_t model_bytes(const struct kt_model *m)
{
    uint64_t total = 0;
    for (int c = 0; c < KT_CLASS_COUNT; c++)
        total += m->class_bytes[c];
    return total;
}

/* Weights on all devices add up to the model; the KV cache is the estimate. */
static void check_totals(const struct kt_placement *p, const struct kt_model *m)
{
    uint64_t weights = 0, kv = 0;
    uint32_t experts = 0;
    for (int i = 0; i < p->n_devices; i++) {
        const struct kt_placement_device *d = &p->devices[i];
        uint64_t sum = 0;
        for (int part = 0; part < KT_PART_COUNT; part++)
            sum += d->part_bytes[part];
        KT_CHECK(sum == d->bytes, "%s: parts add up", d->name);
        weights += d->bytes - d->part_bytes[KT_PART_KV_CACHE] - d->part_bytes[KT_PART_REPLICAS] -
                   d->part_bytes[KT_PART_WORK_BUFFERS];
        kv += d->part_bytes[KT_PART_KV_CACHE];
        experts += d->n_experts;
        KT_CHECK(d->budget_bytes == 0 || d->bytes <= d->budget_bytes, "%s within budget", d->name);
    }
    KT_CHECK(weights == model_bytes(m), "weights %llu, model %llu", (unsigned long long)weights,
             (unsigned long long)model_bytes(m));
    KT_CHECK(kv == kt_model_memory_need(m, -1, p->kv_tokens, p->kv_bytes_per_value).kv_cache_bytes, "KV cache");
    uint32_t n_moe = m->hp.n_layer - m->hp.n_dense_lead;
    KT_CHECK(experts == n_moe * m->hp.n_expert, "every routed expert has one home: %u", experts);
}

static void shaped_model_matches_a_kt_synth_file(void)
{
    struct kt_model *file = tiny_model("tiny");
    struct shaped_model *s = shaped_model(&TINY);
    for (int c = 0; file && c < KT_CLASS_COUNT; c++)
        KT_CHECK(s->m.class_bytes[c] == file->class_bytes[c], "%s: %llu built, %llu in the file",
                 kt_tensor_class_name(c), (unsigned long long)s->m.class_bytes[c],
                 (unsigned long long)file->class_bytes[c]);
    shaped_model_destroy(s);
    kt_model_close(file);
}

/* ---- the shipped configs ------------------------------------------------------------- */

/* configs/README.md's table row for a config that puts routed experts on a
 * device ("N experts/layer: X of Y GiB") states what resolution gives. */
static void readme_row_matches(const char *dir, const char *base, const struct kt_placement *p, const struct kt_model *m)
{
    char path[2048], key[256];
    snprintf(path, sizeof path, "%s/README.md", dir);
    snprintf(key, sizeof key, "| `%s` |", base);
    size_t n = 0;
    char *text = kt_test_read_file(path, &n), *row = NULL;
    if (text) {
        char *z = realloc(text, n + 1);
        z[n] = 0;
        text = z;
        row = strstr(text, key);
    }
    const char *cell = row ? strstr(row, " experts/layer: ") : NULL, *eol = row ? strchr(row, '\n') : NULL;
    if (p->n_devices < 2 || !cell || (eol && cell > eol)) {
        free(text);
        return; /* no device, or a row in another form (cpu-only, tiny-sim) */
    }
    const char *num = cell;
    while (num > row && num[-1] >= '0' && num[-1] <= '9')
        num--;
    unsigned per_layer = 0;
    double used = 0, budget = 0;
    int got = sscanf(num, "%u experts/layer: %lf of %lf GiB", &per_layer, &used, &budget);
    const uint32_t n_moe = m->hp.n_layer - m->hp.n_dense_lead;
    const struct kt_placement_device *d = &p->devices[1];
    const double gib = (double)(1ull << 30);
    KT_CHECK(got == 3 && per_layer * n_moe == d->n_experts && fabs(used - (double)d->bytes / gib) < 0.051 &&
                 fabs(budget - (double)d->budget_bytes / gib) < 0.051,
             "configs/README.md says %s puts %u experts/layer, %.1f of %.1f GiB; resolution: %u, %.2f of %.2f GiB",
             base, per_layer, used, budget, d->n_experts / n_moe, (double)d->bytes / gib,
             (double)d->budget_bytes / gib);
    free(text);
}

static void resolve_file(const char *dir, const char *path, const char *base, const struct kt_model *m, int n_nodes)
{
    struct kt_placement_config *c = NULL;
    struct kt_placement *p = NULL;
    kt_err err = {0};
    KT_CHECK(kt_placement_config_load(path, &c, &err) == KT_OK, "%s", err.msg);
    if (c)
        KT_CHECK(kt_placement_resolve(c, m, n_nodes, NULL, &p, &err) == KT_OK, "%s", err.msg);
    if (p) {
        check_totals(p, m);
        readme_row_matches(dir, base, p, m);
        printf("%s on %d NUMA node(s):\n", base, n_nodes);
        kt_placement_describe(p, stdout);
    }
    kt_placement_destroy(p);
    kt_placement_config_destroy(c);
}

static void every_shipped_config_parses_and_fits_its_model(void)
{
    const char *src = getenv("KT_SOURCE_DIR");
    char dir[1024], path[2048];
    snprintf(dir, sizeof dir, "%s/configs", src && *src ? src : "..");
    struct shaped_model *kimi = shaped_model(&KIMI_K2), *v3 = shaped_model(&DEEPSEEK_V3);
    struct kt_model *tiny = tiny_model("tiny"), *tiny_v3 = tiny_model("tiny-v3");
    struct dirent **entries = NULL;
    int n = scandir(dir, &entries, NULL, alphasort), n_yaml = 0;
    KT_CHECK(n > 0, "cannot list %s", dir);
    for (int i = 0; i < n; i++) {
        const char *base = entries[i]->d_name;
        size_t len = strlen(base);
        if (len > 5 && strcmp(base + len - 5, ".yaml") == 0) {
            n_yaml++;
            snprintf(path, sizeof path, "%s/%s", dir, base);
            int nodes = strstr(base, "2socket") ? 2 : 1;
            if (strncmp(base, "kimi-k2", 7) == 0) {
                resolve_file(dir, path, base, &kimi->m, nodes);
            } else if (strncmp(base, "deepseek-v3", 11) == 0) {
                resolve_file(dir, path, base, &v3->m, nodes);
            } else if (tiny && tiny_v3) {
                resolve_file(dir, path, base, tiny, 1);
                resolve_file(dir, path, base, tiny_v3, 2);
            }
        }
        free(entries[i]);
    }
    free(entries);
    KT_CHECK(n_yaml >= 6, "configs/ has the six examples, found %d", n_yaml);
    shaped_model_destroy(kimi);
    shaped_model_destroy(v3);
    kt_model_close(tiny);
    kt_model_close(tiny_v3);
}

/* ---- bad documents ------------------------------------------------------------------- */

struct bad_doc {
    const char *text;
    unsigned line;
    const char *needle;          /* in the message after "t.yaml:LINE:" */
};

#define V1 "version: 1\n"
#define GPU "devices:\n  gpu: {backend: cuda, memory_gib: 20}\n" /* lines 2-3 after V1 */

static const struct bad_doc BAD_DOCS[] = {
    {"", 1, "an empty document"},
    {"- 1\n- 2\n", 1, "expected a mapping that starts with 'version: 1', got a sequence"},
    {"attention: cpu\n", 1, "version: missing"},
    {"version: 2\nattention: cpu\n", 1, "version: unsupported version 2"},
    {"version: one\n", 1, "version: expected a non-negative integer, got 'one'"},
    {V1, 1, "attention: missing"},
    {V1 "attention: cpu\nattenton: cpu\n", 3, "unknown key 'attenton' (expected one of: version,"},
    {V1 "attention: gpu\n", 2, "attention: unknown device 'gpu' (devices: cpu)"},
    {V1 "attention: cpu\nattention: cpu\n", 3, "duplicate key (first given at line 2)"},
    {V1 "attention: cpu\nranks: 3\n", 3, "ranks: expected a sequence, got"},
    {V1 "attention: cpu\nranks: []\n", 3, "ranks: expected 1 to 16 ranks, got 0"},
    {V1 "attention: cpu\nranks:\n  - layers: 1-3\n", 4, "ranks[0].layers: rank 0 starts at layer 1"},
    {V1 "attention: cpu\nranks:\n  - layers: 0-1\n  - layers: 3-4\n", 5,
     "ranks[1].layers: starts at layer 3, but rank 0 ends at layer 1"},
    {V1 "attention: cpu\nranks:\n  - layers: 2-1\n", 4, "ranks[0].layers: the first number is above the last"},
    {V1 "attention: cpu\nranks:\n  - {}\n", 4, "ranks[0].layers: missing"},
    {V1 "attention: cpu\nranks:\n  - nodes: [0]\n", 4, "ranks[0]: unknown key 'nodes' (expected one of: layers, placement)"},
    {V1 "devices:\n  gpu: {memory_gib: 8}\nattention: gpu\n", 3, "devices.gpu: backend: missing"},
    {V1 "devices:\n  gpu: {backend: tpu, memory_gib: 8}\n", 3, "devices.gpu.backend: expected cuda or sim, got 'tpu'"},
    {V1 "devices:\n  gpu:\n    backend: cuda\n    memory_gib: -3\n", 5, "devices.gpu.memory_gib: -3 is out of range"},
    {V1 "devices:\n  gpu:\n    backend: cuda\n    memory_gib: lots\n", 5,
     "devices.gpu.memory_gib: expected a number, got 'lots'"},
    {V1 "devices:\n  gpu:\n    backend: cuda\n", 4, "devices.gpu: memory_gib: missing"},
    {V1 "devices:\n  gpu:\n    backend: cuda\n    memory_gib: 8\n    transfer_gbps: 9\n", 6,
     "devices.gpu.transfer_gbps: only for backend: sim"},
    {V1 "devices:\n  cpu: {backend: sim, memory_gib: 1}\n", 3, "devices.cpu: 'cpu' is reserved"},
    {V1 "devices:\n  gpu: {backend: cuda, memory_gib: 8}\n  gpu2: {backend: cuda, memory_gib: 8}\n", 4,
     "devices.gpu2: cuda device 0 is already 'gpu'"},
    {V1 "devices:\n  1gpu: {backend: cuda, memory_gib: 8}\n", 3, "a device name is a letter"},
    {V1 GPU "attention: gpu\nexperts:\n  gpu:\n    per_layer: eight\n", 7,
     "experts.gpu.per_layer: expected a count, 'all' or a list of experts, got 'eight'"},
    {V1 GPU "attention: gpu\nexperts:\n  gpu:\n    per_layer: -1\n", 7, "experts.gpu.per_layer: expected a count"},
    {V1 GPU "attention: gpu\nexperts:\n  gpu:\n    per_layer: \"8\"\n", 7, "got '8'"},
    {V1 GPU "attention: gpu\nexperts:\n  gpu:\n    per_layers: 8\n", 7, "experts.gpu: unknown key 'per_layers'"},
    {V1 GPU "attention: gpu\nexperts:\n  gpu:\n    layers:\n      5-3: 2\n", 8,
     "experts.gpu.layers: expected a layer number or a range N-M as key, got '5-3' "
     "(the first number is above the last)"},
    {V1 GPU "attention: gpu\nexperts:\n  gpu:\n    layers:\n      3-10: 4\n      5: 2\n", 9,
     "experts.gpu.layers.5: layer 5 is also given by experts.gpu.layers.3-10 (line 8)"},
    {V1 GPU "attention: gpu\nexperts:\n  gpu:\n    layers: {3: [1, 2, 1]}\n", 7,
     "experts.gpu.layers.3: expert 1 is listed twice"},
    {V1 GPU "attention: gpu\nexperts:\n  gpu:\n    layers: {3: [1, 4-2]}\n", 7,
     "expected an expert number or a range N-M, got '4-2'"},
    {V1 GPU "attention: gpu\nexperts:\n  gpu:\n    layers: {3: [x]}\n", 7, "got 'x'"},
    {V1 GPU "attention: gpu\nexperts:\n  gpu:\n    layers: {3: 99999999999}\n", 7, "is too large"},
    {V1 GPU "attention: gpu\nexperts:\n  cpu: {per_layer: 2}\n", 6, "experts: CPU experts are placed under cpu:"},
    {V1 GPU "attention: gpu\nexperts:\n  gpu2: {per_layer: 2}\n", 6, "experts: unknown device 'gpu2'"},
    {V1 GPU "attention: gpu\nexperts:\n  gpu: 8\n", 6, "experts.gpu: expected a mapping, got '8'"},
    {V1 "attention: cpu\ncpu:\n  nodes: [0, 0]\n", 4, "cpu.nodes: node 0 is listed twice"},
    {V1 "attention: cpu\ncpu:\n  nodes: []\n", 4,
     "cpu.nodes: expected auto or a list of NUMA node numbers, got an empty list"},
    {V1 "attention: cpu\ncpu:\n  nodes: [0]\n  assign:\n    1: {per_layer: 2}\n", 6,
     "cpu.assign.1: node 1 is not in cpu.nodes"},
    {V1 "attention: cpu\ncpu:\n  assign:\n    x: {per_layer: 2}\n", 5, "cpu.assign: expected a NUMA node number"},
    {V1 "attention: cpu\ncpu:\n  replicas: {hot: 2}\n", 4, "cpu.replicas: unknown key 'hot'"},
    {V1 "attention: cpu\ncpu:\n  sliced: some\n", 4,
     "cpu.sliced: expected all or a list of layers and N-M ranges, got 'some'"},
    {V1 "attention: cpu\ncpu:\n  sliced: 3\n", 4, "cpu.sliced: expected all or a list of layers"},
    {V1 "attention: cpu\ncpu:\n  sliced: [1-3, 2]\n", 4, "cpu.sliced: layer 2 is listed twice"},
    {V1 "attention: cpu\ncpu:\n  sliced: [3-1]\n", 4,
     "cpu.sliced: expected a layer number or a range N-M, got '3-1' (the first number is above the last)"},
    {V1 "attention: cpu\ncpu:\n  sliced: [1, x]\n", 4, "cpu.sliced: expected a layer number or a range N-M, got 'x'"},
    {V1 "attention: cpu\ncpu:\n  sliced: all\n  sliced: all\n", 5, "duplicate key"},
    {V1 "attention: cpu\nkv_cache: {tokens: 0}\n", 3, "kv_cache.tokens: must be at least 1"},
    {V1 "attention: cpu\nkv_cache: {type: f8}\n", 3, "kv_cache.type: expected f32, bf16 or f16, got 'f8'"},
    {V1 "attention: cpu\ndescription:\n", 3, "description: expected a string"},
    {V1 "attention: &a cpu\n", 2, "anchors (&name) are not supported"},
    {V1 "attention: *a\n", 2, "aliases (*name) are not supported"},
    {V1 "attention: !!str cpu\n", 2, "tags (!tag) are not supported"},
    {V1 "attention: cpu\n---\nversion: 1\n", 3, "only one YAML document is allowed"},
    {V1 "? {a: 1}\n: 2\n", 2, "a mapping key must be a scalar"},
    {V1 "attention: [cpu\n", 3, "did not find expected ',' or ']'"},
    {V1 "attention:\tcpu\n\tkey: 1\n", 3, "found a tab character that violates indentation"},
};

static void bad_documents_name_line_and_key(void)
{
    for (size_t i = 0; i < sizeof BAD_DOCS / sizeof BAD_DOCS[0]; i++) {
        const struct bad_doc *b = &BAD_DOCS[i];
        struct kt_placement_config *c = NULL;
        kt_err err = {0};
        kt_status st = kt_placement_config_parse(b->text, strlen(b->text), "t.yaml", &c, &err);
        char prefix[32];
        snprintf(prefix, sizeof prefix, "t.yaml:%u:", b->line);
        KT_CHECK(st == KT_ERR_FORMAT && c == NULL, "case %zu accepted:\n%s", i, b->text);
        KT_CHECK(strncmp(err.msg, prefix, strlen(prefix)) == 0 && strstr(err.msg, b->needle),
                 "case %zu: want '%s...%s', got '%s'", i, prefix, b->needle, err.msg);
        kt_placement_config_destroy(c);
    }
}

static void ranks_give_each_rank_its_layers(void)
{
    const char *text = V1 "attention: cpu\nranks:\n  - layers: 0-0\n  - layers: 1-3\n";
    struct kt_placement_config *c = NULL;
    kt_err err = {0};
    KT_CHECK(kt_placement_config_parse(text, strlen(text), "r.yaml", &c, &err) == KT_OK, "%s", err.msg);
    if (!c)
        return;
    KT_CHECK(kt_placement_config_ranks(c) == 2, "%d ranks", kt_placement_config_ranks(c));
    uint32_t first = 9, last = 9;
    kt_placement_config_rank_layers(c, 0, &first, &last);
    KT_CHECK(first == 0 && last == 0, "rank 0: %u-%u", first, last);
    kt_placement_config_rank_layers(c, 1, &first, &last);
    KT_CHECK(first == 1 && last == 3, "rank 1: %u-%u", first, last);
    kt_placement_config_destroy(c);
    text = V1 "attention: cpu\n";
    KT_CHECK(kt_placement_config_parse(text, strlen(text), "r.yaml", &c, &err) == KT_OK, "%s", err.msg);
    KT_CHECK(c && kt_placement_config_ranks(c) == 0, "ranks without a ranks: section");
    kt_placement_config_destroy(c);
}

/* Text libyaml's reader refuses (bad UTF-8, control characters) is reported
 * where it is, not at 1:1: libyaml gives such errors a byte offset only. */
static void unreadable_text_is_reported_at_its_line_and_column(void)
{
    static const struct {
        const char *text, *want;
    } cases[] = {
        {"version: 1\nattention: cpu\ndescription: caf\xff\n", "t.yaml:3:17: invalid leading UTF-8 octet (0xFF at byte 42)"},
        /* CRLF line ends; the column counts é as one character, as libyaml's columns do */
        {"version: 1\r\nattention: cpu\r\ndescription: \xc3\xa9 \xfe\r\n", "t.yaml:3:16: invalid leading UTF-8 octet (0xFE"},
        {"version: 1\nattention: cpu\n\n# a comment \x80\n", "t.yaml:4:13: invalid leading UTF-8 octet (0x80"},
        {"\xff", "t.yaml:1:1: invalid leading UTF-8 octet (0xFF at byte 0)"},
        {"version: 1\nattention: cpu\ndescription: a\x01z\n", "t.yaml:3:15: control characters are not allowed (0x1 at"},
        {"version: 1\nattention: cpu\ndescription: ab\xe2\x82", "t.yaml:3:16: incomplete UTF-8 octet sequence (at byte"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct kt_placement_config *c = NULL;
        kt_err err = {0};
        kt_status st = kt_placement_config_parse(cases[i].text, strlen(cases[i].text), "t.yaml", &c, &err);
        KT_CHECK(st == KT_ERR_FORMAT && c == NULL && !strncmp(err.msg, cases[i].want, strlen(cases[i].want)) &&
                     strstr(err.msg, "a config must be UTF-8 text"),
                 "case %zu: want '%s...', got '%s'", i, cases[i].want, err.msg);
        kt_placement_config_destroy(c);
    }
}

static void deep_and_odd_input_is_refused_cleanly(void)
{
    char deep[4096] = V1 "attention: cpu\nx: ";
    for (int i = 0; i < 200; i++)
        strcat(deep, "[");
    struct kt_placement_config *c = NULL;
    kt_err err = {0};
    KT_CHECK(kt_placement_config_parse(deep, strlen(deep), "t.yaml", &c, &err) == KT_ERR_FORMAT &&
                 strstr(err.msg, "nested too deeply"),
             "%s", err.msg);
    const char nul[] = "version: 1\nattention: \"cp\\0u\"\n";
    KT_CHECK(kt_placement_config_parse(nul, strlen(nul), "t.yaml", &c, &err) == KT_ERR_FORMAT &&
                 strstr(err.msg, "t.yaml:2:12: attention: unknown device 'cp?u'"),
             "%s", err.msg);
    KT_CHECK(kt_placement_config_load("/nonexistent/x.yaml", &c, &err) == KT_ERR_IO, "%s", err.msg);
}

/* ---- resolution on the tiny model ------------------------------------------------------ */

static const char *TINY_SIM = V1 "devices:\n  sim: {backend: sim, memory_gib: 0.125}\n"
                                 "attention: sim\nexperts:\n  sim: {per_layer: 16}\n";

static void tiny_sim_puts_attention_shared_and_half_the_experts_on_sim(void)
{
    struct kt_model *m = tiny_model("tiny");
    struct kt_placement *p = resolve(TINY_SIM, m, 2, NULL);
    if (!p) {
        kt_model_close(m);
        return;
    }
    KT_CHECK(p->n_devices == 2 && strcmp(p->devices[1].name, "sim") == 0 && p->devices[1].backend == KT_PLACE_SIM,
             "devices");
    KT_CHECK(p->devices[1].transfer_gbps == 25 && p->devices[1].latency_us == 10, "sim defaults");
    KT_CHECK(p->embeddings == 1, "embeddings follow attention");
    for (uint32_t il = 0; il < p->n_layer; il++) {
        const struct kt_placement_layer *pl = &p->layers[il];
        KT_CHECK(pl->attention == 1, "layer %u attention on sim", il);
        KT_CHECK(!pl->is_moe || experts_on(p, il, 1) == 16, "layer %u: 16 experts on sim", il);
        KT_CHECK(pl->is_moe ? pl->dense_ffn == -1 && pl->shared_experts == 1 : pl->dense_ffn == 1 && !pl->experts,
                 "layer %u parts", il);
        for (uint32_t x = 0; pl->is_moe && x < p->n_expert; x++) {
            const struct kt_expert_home *h = kt_placement_expert(p, il, x);
            /* no profile: the lowest 16 on sim; the rest alternate over the two nodes */
            KT_CHECK(x < 16 ? h->device == 1 && h->node == -1 : h->device == 0 && h->node >= 0 && h->node < 2,
                     "layer %u expert %u: device %d node %d", il, x, h->device, h->node);
            KT_CHECK(h->replica_nodes == 0, "no replicas asked for");
        }
    }
    KT_CHECK(p->node_experts[0] == 24 && p->node_experts[1] == 24, "24 + 24 CPU experts: %u %u", p->node_experts[0],
             p->node_experts[1]);
    KT_CHECK(p->node_bytes[0] == 24 * kt_layer_expert_bytes(m, 1), "node bytes");
    check_totals(p, m);
    KT_CHECK(p->devices[1].part_bytes[KT_PART_ROUTED_EXPERTS] == 48 * kt_layer_expert_bytes(m, 1), "sim experts");
    KT_CHECK(p->devices[0].part_bytes[KT_PART_ATTENTION] == 0 && p->devices[0].part_bytes[KT_PART_SHARED_EXPERTS] == 0,
             "nothing but routed experts on the CPU");
    kt_placement_destroy(p);
    kt_model_close(m);
}

static void budget_overflow_names_need_and_budget(void)
{
    struct kt_model *m = tiny_model("tiny");
    const char *msg = resolve_error(V1 "devices:\n  sim:\n    backend: sim\n    memory_gib: 0.03\n"
                                       "attention: sim\nexperts:\n  sim: {per_layer: 16}\n",
                                    m, 1, NULL);
    KT_CHECK(strstr(msg, "t.yaml:3:3: devices.sim: the plan needs ") && strstr(msg, "but memory_gib is 0.03") &&
                 strstr(msg, "routed experts 36.0 MiB") && strstr(msg, "48 routed experts") &&
                 strstr(msg, "KV cache for 4096 tokens") && strstr(msg, "working buffers "),
             "%s", msg);
    /* the KV cache counts: the same plan fits with 0.1 GiB (the working buffers
     * for 256-token steps included), not with a long context */
    KT_CHECK(!resolve_error(V1 "devices:\n  sim: {backend: sim, memory_gib: 0.1}\n"
                               "attention: sim\nexperts:\n  sim: {per_layer: 16}\n",
                            m, 1, NULL)[0],
             "fits");
    msg = resolve_error(V1 "kv_cache: {tokens: 100000, type: f32}\ndevices:\n  sim: {backend: sim, memory_gib: 0.1}\n"
                           "attention: sim\nexperts:\n  sim: {per_layer: 16}\n",
                        m, 1, NULL);
    KT_CHECK(strstr(msg, "t.yaml:4:3: devices.sim:") && strstr(msg, "KV cache 219.7 MiB"), "%s", msg);
    kt_model_close(m);
}

struct bad_plan {
    const char *text;
    int n_nodes;
    const char *needle;
};

#define SIM "devices:\n  sim: {backend: sim, memory_gib: 1}\n  sim2: {backend: sim, memory_gib: 1}\nattention: sim\n"

static const struct bad_plan BAD_PLANS[] = {
    {V1 SIM "experts:\n  sim:\n    layers: {2: [3, 40]}\n", 1,
     "t.yaml:8:17: experts.sim.layers.2: expert 40 does not exist (the model has 32 per layer)"},
    {V1 SIM "experts:\n  sim:\n    layers: {2-9: 4}\n", 1,
     "t.yaml:8:19: experts.sim.layers.2-9: layer 9 does not exist (the model has 4, 0-3)"},
    {V1 SIM "experts:\n  sim:\n    layers: {0-3: 4}\n", 1,
     "t.yaml:8:19: experts.sim.layers.0-3: layer 0 is dense: it has no routed experts (the first 1 layers are dense)"},
    {V1 SIM "experts:\n  sim:\n    per_layer: 33\n", 1,
     "t.yaml:8:16: experts.sim.per_layer: 33 experts per layer, but the model has 32"},
    {V1 SIM "experts:\n  sim: {per_layer: 20}\n  sim2: {per_layer: 20}\n", 1,
     "t.yaml:8:21: experts.sim2.per_layer: layer 1: 20 experts asked for, "
     "but only 12 of its 32 are left by the other rules"},
    {V1 SIM "experts:\n  sim: {layers: {2: [1, 2]}}\ncpu:\n  assign:\n    0: {layers: {2: [2]}}\n", 1,
     "t.yaml:10:21: cpu.assign.0.layers.2: layer 2: expert 2 is also placed by experts.sim.layers.2 (line 7)"},
    {V1 SIM "experts:\n  sim: {per_layer: all}\n  sim2: {layers: {3: all}}\n", 1,
     "t.yaml:8:22: experts.sim2.layers.3: layer 3: experts.sim.per_layer (line 7) already takes all the rest"},
    {V1 SIM "cpu:\n  nodes: [0, 3]\n", 2, "t.yaml:7:14: cpu.nodes: NUMA node 3 does not exist (this machine has 2)"},
    {V1 SIM "cpu:\n  assign:\n    2: {per_layer: 1}\n", 2,
     "t.yaml:8:5: cpu.assign.2: NUMA node 2 does not exist (this machine has 2)"},
    {V1 "attention: cpu\ncpu:\n  sliced: [0-2]\n", 2,
     "t.yaml:4:12: cpu.sliced: layer 0 is dense: it has no routed experts to slice (the first 1 layers are dense)"},
    {V1 "attention: cpu\ncpu:\n  sliced: [1, 2-7]\n", 2,
     "t.yaml:4:15: cpu.sliced: layer 7 does not exist (the model has 4, 0-3)"},
    {V1 "profile: no-such-profile.json\nattention: cpu\n", 1,
     "t.yaml:2:10: profile: no-such-profile.json: No such file"},
};

static void resolution_errors_name_the_config_line(void)
{
    struct kt_model *m = tiny_model("tiny");
    for (size_t i = 0; m && i < sizeof BAD_PLANS / sizeof BAD_PLANS[0]; i++) {
        const char *msg = resolve_error(BAD_PLANS[i].text, m, BAD_PLANS[i].n_nodes, NULL);
        KT_CHECK(strstr(msg, BAD_PLANS[i].needle) == msg, "case %zu: want '%s', got '%s'", i, BAD_PLANS[i].needle,
                 msg);
    }
    kt_model_close(m);
}

static void explicit_lists_counts_and_all_combine(void)
{
    struct kt_model *m = tiny_model("tiny");
    /* layer 1: sim gets 0-3 and 31, sim2 the two hottest left (4, 5) and cpu node 1 the rest;
     * layer 2-3: sim2 takes all */
    struct kt_placement *p = resolve(V1 SIM "experts:\n  sim:\n    layers: {1: [0-3, 31]}\n"
                                            "  sim2:\n    per_layer: all\n    layers: {1: 2}\n"
                                            "cpu:\n  assign:\n    1: {layers: {1: all}}\n",
                                     m, 2, NULL);
    for (uint32_t x = 0; p && x < 32; x++) {
        const struct kt_expert_home *h = kt_placement_expert(p, 1, x);
        int want = x <= 3 || x == 31 ? 1 : x <= 5 ? 2 : 0;
        KT_CHECK(h->device == want && (want != 0 || h->node == 1), "layer 1 expert %u: %d/%d", x, h->device, h->node);
        KT_CHECK(kt_placement_expert(p, 2, x)->device == 2 && kt_placement_expert(p, 3, x)->device == 2, "sim2 all");
    }
    if (p)
        check_totals(p, m);
    kt_placement_destroy(p);
    kt_model_close(m);
}

/* ---- profiles ------------------------------------------------------------------------- */

/* Saves a profile of tiny's shape (4 layers x 32 experts) from tokens; the dense layer 0 gets zeros. */
static const char *write_profile(const char *name, double tokens[4][32])
{
    struct kt_profile *prof = NULL;
    kt_err err = {0};
    KT_CHECK(kt_profile_create(4, 32, NULL, &prof, &err) == KT_OK, "%s", err.msg);
    if (!prof)
        return NULL;
    for (uint32_t il = 0; il < 4; il++)
        for (uint32_t x = 0; x < 32; x++)
            prof->counts[KT_PROFILE_DECODE][il * 32 + x] = il == 0 ? 0 : tokens[il][x];
    const char *path = kt_test_path(name);
    KT_CHECK(kt_profile_save(prof, path, &err) == KT_OK, "%s", err.msg);
    kt_profile_destroy(prof);
    return path;
}

static void profile_picks_the_hottest_and_breaks_ties_by_index(void)
{
    struct kt_model *m = tiny_model("tiny");
    double tokens[4][32];
    for (uint32_t il = 0; il < 4; il++)
        for (uint32_t x = 0; x < 32; x++)
            tokens[il][x] = (double)((x * 7 + il * 5) % 32) + 0.25;
    tokens[2][10] = tokens[2][20] = 1000; /* a tie for the hottest: both are in */
    tokens[3][4] = tokens[3][9] = 500;    /* another tie, between layers' hottest */
    const char *path = write_profile("profile", tokens);
    struct kt_placement *p = resolve(TINY_SIM, m, 2, path);
    for (uint32_t il = 1; p && il < 4; il++) {
        for (uint32_t x = 0; x < 32; x++) {
            uint32_t hotter = 0; /* experts ranked ahead of x */
            for (uint32_t y = 0; y < 32; y++)
                hotter += tokens[il][y] > tokens[il][x] || (tokens[il][y] == tokens[il][x] && y < x);
            bool on_sim = kt_placement_expert(p, il, x)->device == 1;
            KT_CHECK(on_sim == (hotter < 16), "layer %u expert %u (%g tokens, rank %u) on sim: %d", il, x,
                     tokens[il][x], hotter, on_sim);
        }
    }
    KT_CHECK(p && strcmp(p->profile, path) == 0, "the plan names its profile");
    kt_placement_destroy(p);
    unlink(path);

    /* the cut falls inside a tie: the lower index wins */
    for (uint32_t x = 0; x < 32; x++)
        tokens[3][x] = x < 10 ? 100 : 1;
    tokens[3][20] = tokens[3][25] = 50;
    path = write_profile("profile-tie", tokens);
    p = resolve(V1 "devices:\n  sim: {backend: sim, memory_gib: 1}\nattention: sim\nexperts:\n  sim: {per_layer: 11}\n",
                m, 1, path);
    KT_CHECK(p && kt_placement_expert(p, 3, 20)->device == 1 && kt_placement_expert(p, 3, 25)->device == 0,
             "tie at the cut goes to the lower index");
    kt_placement_destroy(p);
    unlink(path);

    /* a profile of another shape is refused */
    struct kt_profile *small = NULL;
    kt_err err = {0};
    KT_CHECK(kt_profile_create(3, 32, NULL, &small, &err) == KT_OK, "%s", err.msg);
    const char *bad = kt_test_path("profile-small");
    KT_CHECK(small && kt_profile_save(small, bad, &err) == KT_OK, "%s", err.msg);
    kt_profile_destroy(small);
    const char *msg = resolve_error(TINY_SIM, m, 1, bad);
    KT_CHECK(strstr(msg, "a profile of 3 layers x 32 experts, but the model has 4 x 32"), "%s", msg);
    unlink(bad);
    kt_model_close(m);
}

static void config_profile_is_relative_to_the_config_and_override_wins(void)
{
    struct kt_model *m = tiny_model("tiny");
    double hot_high[4][32], hot_low[4][32];
    for (uint32_t il = 0; il < 4; il++)
        for (uint32_t x = 0; x < 32; x++) {
            hot_high[il][x] = x;        /* experts 16-31 hottest */
            hot_low[il][x] = 32 - x;    /* experts 0-15 hottest */
        }
    const char *high = write_profile("hot-high", hot_high), *low = write_profile("hot-low", hot_low);
    const char *base = strrchr(high, '/') + 1;
    char text[1024];
    snprintf(text, sizeof text, V1 "profile: %s\ndevices:\n  sim: {backend: sim, memory_gib: 1}\nattention: sim\n"
                                   "experts:\n  sim: {per_layer: 16}\n", base);
    const char *cfg = write_text("relative.yaml", text);
    struct kt_placement_config *c = NULL;
    struct kt_placement *p = NULL;
    kt_err err = {0};
    KT_CHECK(kt_placement_config_load(cfg, &c, &err) == KT_OK, "%s", err.msg);
    KT_CHECK(c && strcmp(kt_placement_config_profile(c), high) == 0, "profile path joined to the config's directory");
    if (c) {
        KT_CHECK(kt_placement_resolve(c, m, 1, NULL, &p, &err) == KT_OK, "%s", err.msg);
        KT_CHECK(p && kt_placement_expert(p, 2, 31)->device == 1 && kt_placement_expert(p, 2, 0)->device == 0,
                 "the config's profile");
        kt_placement_destroy(p);
        p = NULL;
        KT_CHECK(kt_placement_resolve(c, m, 1, low, &p, &err) == KT_OK, "%s", err.msg);
        KT_CHECK(p && kt_placement_expert(p, 2, 0)->device == 1 && kt_placement_expert(p, 2, 31)->device == 0,
                 "the override");
        kt_placement_destroy(p);
    }
    kt_placement_config_destroy(c);
    unlink(cfg);
    unlink(high);
    unlink(low);
    kt_model_close(m);
}

static void cpu_spread_balances_load_and_keeps_counts_even(void)
{
    struct kt_model *m = tiny_model("tiny");
    double tokens[4][32];
    for (uint32_t il = 0; il < 4; il++)
        for (uint32_t x = 0; x < 32; x++)
            tokens[il][x] = x < 4 ? 1000 : (double)(x % 5); /* four very hot experts */
    const char *path = write_profile("spread", tokens);
    struct kt_placement *p = resolve(V1 "attention: cpu\ncpu:\n  nodes: [0, 1, 3]\n", m, 4, path);
    for (uint32_t il = 1; p && il < 4; il++) {
        uint32_t count[4] = {0};
        double load[4] = {0};
        for (uint32_t x = 0; x < 32; x++) {
            const struct kt_expert_home *h = kt_placement_expert(p, il, x);
            KT_CHECK(h->device == 0 && (h->node == 0 || h->node == 1 || h->node == 3), "node %d", h->node);
            count[h->node]++;
            load[h->node] += tokens[il][x];
        }
        KT_CHECK(count[2] == 0, "node 2 is not in cpu.nodes");
        KT_CHECK(count[0] >= 10 && count[0] <= 11 && count[1] >= 10 && count[1] <= 11 && count[3] >= 10 &&
                     count[3] <= 11,
                 "layer %u counts %u %u %u", il, count[0], count[1], count[3]);
        double hi = load[0], lo = load[0];
        for (int n = 1; n < 4; n++)
            if (n != 2) {
                hi = load[n] > hi ? load[n] : hi;
                lo = load[n] < lo ? load[n] : lo;
            }
        /* four hot experts over three nodes: one node holds two, the others one each */
        KT_CHECK(hi < 2100 && lo > 1000, "layer %u loads %g %g %g", il, load[0], load[1], load[3]);
    }
    if (p) {
        KT_CHECK(p->node_experts[0] + p->node_experts[1] + p->node_experts[3] == 96 && p->node_experts[2] == 0,
                 "node totals");
        KT_CHECK(p->node_experts[0] == 32 && p->node_experts[1] == 32 && p->node_experts[3] == 32,
                 "the odd expert rotates over layers: %u %u %u", p->node_experts[0], p->node_experts[1],
                 p->node_experts[3]);
        check_totals(p, m);
    }
    kt_placement_destroy(p);
    unlink(path);
    kt_model_close(m);
}

static void replicas_copy_the_hottest_cpu_experts_to_other_nodes(void)
{
    struct kt_model *m = tiny_model("tiny");
    const char *text = V1 "devices:\n  sim: {backend: sim, memory_gib: 1}\nattention: sim\n"
                          "experts:\n  sim: {per_layer: 2}\ncpu:\n  replicas: {hot_per_layer: 3}\n";
    struct kt_placement *p = resolve(text, m, 2, NULL);
    uint64_t expert_bytes = kt_layer_expert_bytes(m, 1);
    for (uint32_t il = 1; p && il < 4; il++)
        for (uint32_t x = 0; x < 32; x++) {
            const struct kt_expert_home *h = kt_placement_expert(p, il, x);
            /* by index: 0-1 on sim, 2-4 the hottest on CPU */
            uint64_t want = x >= 2 && x <= 4 ? 1ull << (1 - h->node) : 0;
            KT_CHECK(h->replica_nodes == want, "layer %u expert %u replicas %llx", il, x,
                     (unsigned long long)h->replica_nodes);
        }
    if (p) {
        KT_CHECK(p->devices[0].part_bytes[KT_PART_REPLICAS] == 9 * expert_bytes, "replica bytes");
        KT_CHECK(p->node_bytes[0] + p->node_bytes[1] == (90 + 9) * expert_bytes, "node bytes count replicas");
        check_totals(p, m);
    }
    kt_placement_destroy(p);
    p = resolve(text, m, 1, NULL);
    KT_CHECK(p && p->devices[0].part_bytes[KT_PART_REPLICAS] == 0, "one node: nowhere to replicate to");
    kt_placement_destroy(p);
    kt_model_close(m);
}

/* cpu.sliced marks MoE layers, keeps their homes balanced, gives them no
 * replicas, shows in the description and reaches the engine's parameters. */
static void sliced_layers_are_marked_take_no_replicas_and_reach_the_engine(void)
{
    struct kt_model *m = tiny_model("tiny");
    const char *some = V1 "attention: cpu\ncpu:\n  sliced: [2-3]\n  replicas: {hot_per_layer: 2}\n";
    struct kt_placement *p = resolve(some, m, 2, NULL);
    for (uint32_t il = 0; p && il < 4; il++) {
        KT_CHECK(p->layers[il].cpu_sliced == (il >= 2), "layer %u sliced: %d", il, p->layers[il].cpu_sliced);
        uint32_t replicated = 0, on[2] = {0};
        for (uint32_t x = 0; il > 0 && x < 32; x++) {
            replicated += kt_placement_expert(p, il, x)->replica_nodes != 0;
            on[kt_placement_expert(p, il, x)->node & 1]++;
        }
        KT_CHECK(replicated == (il == 1 ? 2u : 0u), "layer %u: %u replicated", il, replicated);
        KT_CHECK(il == 0 || (on[0] == 16 && on[1] == 16), "layer %u: homes %u / %u", il, on[0], on[1]);
    }
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (p && f)
        kt_placement_describe(p, f);
    if (f)
        fclose(f);
    KT_CHECK(text && strstr(text, "  row-sliced CPU experts: layers 2-3, each expert's rows split over nodes 0, 1\n"),
             "%s", text ? text : "");
    free(text);

    struct kt_engine_plan ep_arrays;
    struct kt_engine_params ep = {0};
    kt_err err = {0};
    KT_CHECK(p && kt_engine_plan_apply(p, &ep_arrays, &ep, NULL, &err) == KT_OK, "%s", err.msg);
    if (p && ep.layer_sliced) {
        KT_CHECK(!ep.layer_sliced[0] && !ep.layer_sliced[1] && ep.layer_sliced[2] && ep.layer_sliced[3] &&
                     ep.expert_slice_nodes == 0x3,
                 "engine params: sliced %d%d%d%d over 0x%x", ep.layer_sliced[0], ep.layer_sliced[1],
                 ep.layer_sliced[2], ep.layer_sliced[3], ep.expert_slice_nodes);
        kt_engine_plan_free(&ep_arrays);
    }
    kt_placement_destroy(p);

    p = resolve(V1 "attention: cpu\ncpu:\n  sliced: all\n  nodes: [1]\n", m, 2, NULL);
    for (uint32_t il = 0; p && il < 4; il++)
        KT_CHECK(p->layers[il].cpu_sliced == (il > 0), "all: layer %u sliced: %d", il, p->layers[il].cpu_sliced);
    if (p && kt_engine_plan_apply(p, &ep_arrays, &ep, NULL, &err) == KT_OK) {
        KT_CHECK(ep.expert_slice_nodes == 0x2, "sliced over the expert nodes only: 0x%x", ep.expert_slice_nodes);
        kt_engine_plan_free(&ep_arrays);
    }
    kt_placement_destroy(p);
    p = resolve(V1 "attention: cpu\ncpu:\n  sliced: []\n", m, 2, NULL);
    for (uint32_t il = 0; p && il < 4; il++)
        KT_CHECK(!p->layers[il].cpu_sliced, "[]: layer %u not sliced", il);
    kt_placement_destroy(p);
    kt_model_close(m);
}

static void profile_files_round_trip_and_bad_ones_are_refused(void)
{
    struct kt_profile *p = NULL;
    kt_err err = {0};
    const char *good = "{\"version\": 1, \"model\": \"m\", \"layers\": [[], [1, 2.5, 0], [3, 0, 1e3]]}";
    KT_CHECK(kt_profile_parse(good, strlen(good), "p.json", &p, &err) == KT_OK, "%s", err.msg);
    KT_CHECK(p && p->n_layer == 3 && p->n_expert == 3 && p->counts[0][0] == 0 && p->counts[0][4] == 2.5 &&
                 p->counts[0][8] == 1000 && strcmp(p->model.name, "m") == 0 && p->model.fingerprint == 0 &&
                 p->tokens[0] == 0 && p->tokens[1] == 0 && p->counts[1][4] == 0,
             "version 1: decode counts, no totals, unknown identity");
    const char *path = kt_test_path("roundtrip.json");
    struct kt_profile *q = NULL;
    KT_CHECK(p && kt_profile_save(p, path, &err) == KT_OK, "%s", err.msg);
    KT_CHECK(kt_profile_load(path, &q, &err) == KT_OK, "%s", err.msg);
    KT_CHECK(q && p && q->n_layer == 3 && q->n_expert == 3 && memcmp(p->counts[0], q->counts[0], 9 * sizeof *p->counts[0]) == 0,
             "round trip");
    unlink(path);
    kt_profile_destroy(p);
    kt_profile_destroy(q);

    /* version 2: both phases, totals, decay and identity survive a save and a load */
    const char *v2 = "{\"version\": 2, \"model\": {\"name\": \"K\", \"arch\": \"deepseek2\", \"n_layer\": 2, "
                     "\"n_expert\": 3, \"n_expert_used\": 2, \"n_embd\": 64, \"n_ff_exp\": 32, "
                     "\"fingerprint\": \"00ff00ff00ff00fA\"}, \"half_life_tokens\": 1000, "
                     "\"tokens\": {\"decode\": 4, \"prefill\": 2.5}, \"decode\": [[], [4, 3, 1]], "
                     "\"prefill\": [[], [0.5, 2, 2.5]]}";
    p = q = NULL;
    KT_CHECK(kt_profile_parse(v2, strlen(v2), "v2.json", &p, &err) == KT_OK, "%s", err.msg);
    KT_CHECK(p && p->n_layer == 2 && p->n_expert == 3 && p->model.fingerprint == 0x00ff00ff00ff00faull &&
                 strcmp(p->model.name, "K") == 0 && strcmp(p->model.arch, "deepseek2") == 0 &&
                 p->model.n_expert_used == 2 && p->model.n_embd == 64 && p->model.n_ff_exp == 32 &&
                 p->half_life_tokens == 1000 && p->tokens[0] == 4 && p->tokens[1] == 2.5 && p->counts[0][3] == 4 &&
                 p->counts[1][5] == 2.5 && p->counts[1][0] == 0,
             "version 2 values");
    KT_CHECK(p && kt_profile_save(p, path, &err) == KT_OK, "%s", err.msg);
    KT_CHECK(kt_profile_load(path, &q, &err) == KT_OK, "%s", err.msg);
    KT_CHECK(p && q && memcmp(&p->model, &q->model, sizeof p->model) == 0 && q->half_life_tokens == 1000 &&
                 q->tokens[0] == 4 && q->tokens[1] == 2.5 && memcmp(p->counts[0], q->counts[0], 6 * sizeof(double)) == 0 &&
                 memcmp(p->counts[1], q->counts[1], 6 * sizeof(double)) == 0,
             "version 2 round trip");
    char *dumped = p ? kt_profile_dump(p) : NULL;
    size_t n_file = 0;
    char *file = kt_test_read_file(path, &n_file);
    KT_CHECK(dumped && file && n_file == strlen(dumped) + 1 && memcmp(file, dumped, n_file - 1) == 0 &&
                 file[n_file - 1] == '\n' && strstr(dumped, "\"version\":2") &&
                 strstr(dumped, "\"fingerprint\":\"00ff00ff00ff00fa\""),
             "the dump is the file: %s", dumped ? dumped : "(null)");
    free(dumped);
    free(file);
    /* probabilities: count / tokens per phase and both together */
    KT_CHECK(p && kt_profile_probability(p, KT_PROFILE_DECODE, 1, 0, 2) == 1.0 &&
                 kt_profile_probability(p, KT_PROFILE_PREFILL, 1, 2, 2) == 1.0 &&
                 fabs(kt_profile_probability(p, KT_PROFILE_PHASES, 1, 1, 2) - 5.0 / 6.5) < 1e-15 &&
                 kt_profile_probability(p, KT_PROFILE_DECODE, 0, 0, 2) == 0 &&
                 kt_profile_probability(p, KT_PROFILE_DECODE, 7, 0, 2) == 0 && kt_profile_count(p, 1, 2) == 3.5,
             "probabilities and counts");
    unlink(path);
    kt_profile_destroy(p);
    kt_profile_destroy(q);

    static const struct {
        const char *text, *needle;
    } bad[] = {
        {"{\"version\": 1, \"layers\": [[1, 2], [1]]}", "p.json: layers[1]: 1 experts, but earlier rows have 2"},
        {"{\"version\": 1, \"layers\": [[1, -2]]}", "p.json: layers[0][1]: expected a non-negative number"},
        {"{\"version\": 1, \"layers\": [[1, \"2\"]]}", "p.json: layers[0][1]: expected a non-negative number"},
        {"{\"version\": 3, \"layers\": []}", "p.json: version: 3 is not one this kt reads (1 or 2)"},
        {"{\"version\": \"2\"}", "p.json: version: expected 1 or 2"},
        {"{\"version\": 1, \"layers\": {}}", "p.json: layers: expected an array"},
        {"{\"version\": 1, \"layers\": [], \"extra\": 1}", "p.json: unknown key 'extra'"},
        {"{\"version\": 1, \"layers\": [7]}", "p.json: layers[0]: expected an array"},
        {"{\"version\": 1, \"version\": 1}", "p.json:1:"},
        {"[1, 2", "p.json:1:"},
        {"[1, 2]", "p.json: expected a JSON object"},
#define M2 "{\"version\": 2, \"model\": {\"name\": \"K\", \"arch\": \"deepseek2\", \"n_layer\": 2, \"n_expert\": 2, " \
           "\"n_expert_used\": 1, \"n_embd\": 8, \"n_ff_exp\": 4, \"fingerprint\": \"0123456789abcdef\"}, "
        {M2 "\"tokens\": {\"decode\": 1, \"prefill\": 0}, \"decode\": [[], [1, 2]], \"prefill\": [[], [1]]}",
         "p.json: prefill[1]: 1 experts, but earlier rows have 2"},
        {M2 "\"tokens\": {\"decode\": 1, \"prefill\": 0}, \"decode\": [[], [1, 2, 3]], \"prefill\": [[], []]}",
         "p.json: decode: rows of 3 experts, but model.n_expert is 2"},
        {M2 "\"tokens\": {\"decode\": 1, \"prefill\": 0}, \"decode\": [[1, 2]], \"prefill\": [[], []]}",
         "p.json: decode: 1 rows, but model.n_layer is 2"},
        {M2 "\"tokens\": {\"decode\": 1, \"prefill\": 0}, \"decode\": [[], [1, 2]], \"prefill\": [[], [1, -0.5]]}",
         "p.json: prefill[1][1]: expected a non-negative number"},
        {M2 "\"tokens\": {\"decode\": 1, \"prefill\": 0}, \"decode\": [[], [1, null]], \"prefill\": [[], []]}",
         "p.json: decode[1][1]: expected a non-negative number"},
        {M2 "\"tokens\": {\"decode\": -1, \"prefill\": 0}, \"decode\": [[], []], \"prefill\": [[], []]}",
         "p.json: tokens: decode: expected a non-negative number"},
        {M2 "\"tokens\": {\"decode\": 1}, \"decode\": [[], []], \"prefill\": [[], []]}",
         "p.json: tokens: prefill: expected a non-negative number"},
        {M2 "\"tokens\": {\"decode\": 1, \"prefill\": 0, \"x\": 0}, \"decode\": [[], []], \"prefill\": [[], []]}",
         "p.json: tokens: unknown key 'x'"},
        {M2 "\"tokens\": {\"decode\": 1, \"prefill\": 0}, \"decode\": [[], []]}", "p.json: prefill: expected an array"},
        {M2 "\"half_life_tokens\": -5, \"tokens\": {\"decode\": 1, \"prefill\": 0}, \"decode\": [[], []], "
            "\"prefill\": [[], []]}",
         "p.json: half_life_tokens: expected a non-negative number"},
        {M2 "\"tokens\": {\"decode\": 1, \"prefill\": 0}, \"decode\": [[], []], \"prefill\": [[], []], \"co\": 1}",
         "p.json: unknown key 'co'"},
        {"{\"version\": 2, \"model\": \"K\"}", "p.json: model: expected an object"},
        {"{\"version\": 2, \"model\": {\"name\": \"K\", \"arch\": \"d\", \"n_layer\": 1, \"n_expert\": 1, "
         "\"n_expert_used\": 1, \"n_embd\": 1, \"n_ff_exp\": 1, \"fingerprint\": \"0123456789abcdeg\"}}",
         "p.json: model: fingerprint: expected 16 hexadecimal digits"},
        {"{\"version\": 2, \"model\": {\"name\": \"K\", \"arch\": \"d\", \"n_layer\": 1, \"n_expert\": 1, "
         "\"n_expert_used\": 1, \"n_embd\": 1, \"n_ff_exp\": 1, \"fingerprint\": \"123\"}}",
         "p.json: model: fingerprint: expected 16 hexadecimal digits"},
        {"{\"version\": 2, \"model\": {\"name\": \"K\", \"arch\": \"d\", \"n_layer\": -1, \"n_expert\": 1, "
         "\"n_expert_used\": 1, \"n_embd\": 1, \"n_ff_exp\": 1, \"fingerprint\": \"0123456789abcdef\"}}",
         "p.json: model: n_layer: expected a whole number"},
        {"{\"version\": 2, \"model\": {\"name\": \"K\", \"size\": 1}}", "p.json: model: unknown key 'size'"},
#undef M2
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        p = NULL;
        KT_CHECK(kt_profile_parse(bad[i].text, strlen(bad[i].text), "p.json", &p, &err) == KT_ERR_FORMAT && !p &&
                     strstr(err.msg, bad[i].needle) == err.msg,
                 "case %zu: want '%s', got '%s'", i, bad[i].needle, err.msg);
        kt_profile_destroy(p);
    }
    /* a NaN cannot be written in JSON; a huge number is refused as not finite */
    const char *inf = "{\"version\": 1, \"layers\": [[1e999]]}";
    p = NULL;
    KT_CHECK(kt_profile_parse(inf, strlen(inf), "p.json", &p, &err) == KT_ERR_FORMAT && !p &&
                 strstr(err.msg, "p.json"),
             "1e999: %s", err.msg);
    kt_profile_destroy(p);
    /* a failed save leaves the earlier file as it was */
    struct kt_profile *z = NULL;
    KT_CHECK(kt_profile_create(1, 2, NULL, &z, &err) == KT_OK, "%s", err.msg);
    KT_CHECK(z && kt_profile_save(z, "/nonexistent-dir/p.json", &err) == KT_ERR_IO && strstr(err.msg, "/nonexistent-dir/p.json"),
             "%s", err.msg);
    kt_profile_destroy(z);
}

static void profile_decays_by_half_life_in_tokens(void)
{
    struct kt_profile *p = NULL;
    kt_err err = {0};
    KT_CHECK(kt_profile_create(2, 4, NULL, &p, &err) == KT_OK, "%s", err.msg);
    if (!p)
        return;
    const uint64_t a[8] = {0, 0, 0, 0, 8, 0, 4, 4}, b[8] = {0, 0, 0, 0, 0, 16, 0, 0};
    kt_profile_add(p, KT_PROFILE_DECODE, a, 8); /* no decay: plain sums */
    kt_profile_add(p, KT_PROFILE_DECODE, a, 8);
    KT_CHECK(p->counts[0][4] == 16 && p->tokens[0] == 16 && p->tokens[1] == 0, "sums without decay");
    p->half_life_tokens = 100;
    kt_profile_add(p, KT_PROFILE_PREFILL, b, 100); /* one half-life: everything before halves */
    KT_CHECK(fabs(p->counts[0][4] - 8) < 1e-12 && fabs(p->tokens[0] - 8) < 1e-12 && p->counts[1][5] == 16 &&
                 p->tokens[1] == 100,
             "one half-life: %g %g", p->counts[0][4], p->tokens[0]);
    kt_profile_add(p, KT_PROFILE_DECODE, NULL, 200); /* two more: a quarter */
    KT_CHECK(fabs(p->counts[0][4] - 2) < 1e-12 && fabs(p->counts[1][5] - 4) < 1e-12 && fabs(p->tokens[1] - 25) < 1e-12 &&
                 fabs(p->tokens[0] - 202) < 1e-12,
             "three half-lives: %g %g %g", p->counts[0][4], p->counts[1][5], p->tokens[0]);
    /* decay keeps probabilities of an unchanged mix */
    double before = kt_profile_probability(p, KT_PROFILE_PREFILL, 1, 1, 2);
    kt_profile_add(p, KT_PROFILE_DECODE, NULL, 0);
    KT_CHECK(kt_profile_probability(p, KT_PROFILE_PREFILL, 1, 1, 2) == before, "no tokens: no decay");
    kt_profile_destroy(p);
}

/* kt_model_identity: the shape and tensor table, not the weights' types or values. */
/* The identity of a kt-synth model (the file is gone afterwards); fingerprint 0 after a failed check. */
static struct kt_model_identity synth_identity(const char *extra)
{
    char path[1024] = "";
    struct kt_model_identity id = {0};
    struct kt_model *m = kt_test_synth_model("kimi-k2-slice", extra, path, sizeof path);
    if (m)
        kt_model_identity(m, &id);
    kt_test_synth_remove(m, path);
    return id;
}

static void profile_refuses_another_model_by_fingerprint(void)
{
    struct kt_model_identity ia = synth_identity("--layers 2 --experts 16 --experts-type q4_k");
    struct kt_model_identity ib = synth_identity("--layers 2 --experts 16 --experts-type q8_0 --seed 7");
    struct kt_model_identity ic = synth_identity("--layers 2 --experts 32");
    if (!ia.fingerprint || !ib.fingerprint || !ic.fingerprint)
        return;
    KT_CHECK(ia.fingerprint != 0 && ia.fingerprint == ib.fingerprint, "q4_k and q8_0 of one shape: %llx %llx",
             (unsigned long long)ia.fingerprint, (unsigned long long)ib.fingerprint);
    KT_CHECK(ia.fingerprint != ic.fingerprint, "16 and 32 experts differ");
    KT_CHECK(ia.n_layer == 2 && ia.n_expert == 16 && ic.n_expert == 32 && ia.n_expert_used == 8, "shape");

    struct kt_profile *p = NULL;
    kt_err err = {0};
    KT_CHECK(kt_profile_create(ia.n_layer, ia.n_expert, &ia, &p, &err) == KT_OK, "%s", err.msg);
    KT_CHECK(p && kt_profile_check_model(p, &ib, "p.json", &err) == KT_OK, "%s", err.msg);
    KT_CHECK(p && kt_profile_check_model(p, &ic, "p.json", &err) == KT_ERR_INVALID &&
                 strstr(err.msg, "p.json: a profile of '") == err.msg && strstr(err.msg, "(2 layers x 16 experts") &&
                 strstr(err.msg, "not of this model '") && strstr(err.msg, "(2 layers x 32 experts"),
             "%s", err.msg);
    /* the same shape with another tensor table is still another model */
    struct kt_model_identity forged = ic;
    forged.n_expert = 16;
    KT_CHECK(p && kt_profile_check_model(p, &forged, "p.json", &err) == KT_ERR_INVALID, "fingerprint, not shape");
    kt_profile_destroy(p);
    /* version 1: shape only */
    const char *v1 = "{\"version\": 1, \"model\": \"old\", \"layers\": [[], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, "
                     "14, 15, 16]]}";
    p = NULL;
    KT_CHECK(kt_profile_parse(v1, strlen(v1), "v1.json", &p, &err) == KT_OK, "%s", err.msg);
    KT_CHECK(p && kt_profile_check_model(p, &ia, "v1.json", &err) == KT_OK, "%s", err.msg);
    KT_CHECK(p && kt_profile_check_model(p, &ic, "v1.json", &err) == KT_ERR_INVALID &&
                 strstr(err.msg, "v1.json: a profile of 'old' (2 layers x 16 experts), not of this model"),
             "%s", err.msg);
    kt_profile_destroy(p);
}

static void describe_summarises_each_device(void)
{
    struct kt_model *m = tiny_model("tiny");
    struct kt_placement *p = resolve(TINY_SIM, m, 2, NULL);
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (p && f)
        kt_placement_describe(p, f);
    if (f)
        fclose(f);
    KT_CHECK(text &&
                 strstr(text, "placement t.yaml: 4 layers (1 dense, 3 MoE) of 32 routed experts; hot experts by index"),
             "%s", text ? text : "");
    KT_CHECK(text && strstr(text, "  sim (sim, 25 GB/s, 10 us): ") && strstr(text, "    attention: layers 0-3\n") &&
                 strstr(text, "    dense FFN: layers 0\n") && strstr(text, "    shared experts: layers 1-3\n") &&
                 strstr(text, "    routed experts: 48 (16 per MoE layer)\n") &&
                 strstr(text, "  NUMA nodes: 0: 24 experts"),
             "%s", text ? text : "");
    free(text);
    kt_placement_destroy(p);
    kt_model_close(m);
}

/* kv_cache.type f32, bf16 or f16: the KV estimate at that row size and, the
 * file having said it, the engine's row type; without it the estimate counts
 * f32 rows and the engine's type is left to the tool (--kv-type). */
static void kv_cache_type_sizes_the_estimate_and_reaches_the_engine(void)
{
    struct kt_model *m = tiny_model("tiny");
    const char *names[] = {"f32", "bf16", "f16"};
    const enum kt_row_type types[] = {KT_ROW_F32, KT_ROW_BF16, KT_ROW_F16};
    uint64_t kv_bytes[3] = {0};
    for (int i = 0; i < 3 && m; i++) {
        char text[256];
        snprintf(text, sizeof text, V1 "attention: cpu\nkv_cache: {tokens: 1000, type: %s}\n", names[i]);
        struct kt_placement *p = resolve(text, m, 1, NULL);
        if (!p)
            continue;
        KT_CHECK(p->kv_type == types[i] && p->kv_type_given && p->kv_bytes_per_value == (i == 0 ? 4u : 2u),
                 "%s: type %d, given %d, %u bytes a value", names[i], (int)p->kv_type, p->kv_type_given,
                 p->kv_bytes_per_value);
        kv_bytes[i] = p->devices[0].part_bytes[KT_PART_KV_CACHE];
        check_totals(p, m);
        struct kt_engine_plan arrays;
        struct kt_engine_params ep = {.kv_type = types[i] == KT_ROW_F32 ? KT_ROW_BF16 : KT_ROW_F32}; /* another type */
        kt_err err = {0};
        if (kt_engine_plan_apply(p, &arrays, &ep, NULL, &err) == KT_OK) {
            KT_CHECK(ep.kv_type == types[i], "%s reached the engine's params as %d", names[i], (int)ep.kv_type);
            kt_engine_plan_free(&arrays);
        }
        kt_placement_destroy(p);
    }
    KT_CHECK(kv_bytes[0] > 0 && kv_bytes[1] * 2 == kv_bytes[0] && kv_bytes[2] == kv_bytes[1],
             "KV estimates f32 %llu, bf16 %llu, f16 %llu bytes", (unsigned long long)kv_bytes[0],
             (unsigned long long)kv_bytes[1], (unsigned long long)kv_bytes[2]);
    struct kt_placement *p = m ? resolve(V1 "attention: cpu\nkv_cache: {tokens: 1000}\n", m, 1, NULL) : NULL;
    if (p) {
        KT_CHECK(!p->kv_type_given && p->kv_bytes_per_value == 4, "no type: f32 estimate, not given");
        struct kt_engine_plan arrays;
        struct kt_engine_params ep = {.kv_type = KT_ROW_BF16};
        kt_err err = {0};
        if (kt_engine_plan_apply(p, &arrays, &ep, NULL, &err) == KT_OK) {
            KT_CHECK(ep.kv_type == KT_ROW_BF16, "no type in the file: the tool's row type stays");
            kt_engine_plan_free(&arrays);
        }
        kt_placement_destroy(p);
    }
    kt_model_close(m);
}

/* A rank's own placement counts its stage alone: its CPU experts per node
 * are its layers' (2 MoE layers of tiny's 3); one for layers past the
 * model's last is refused, naming them. */
static void a_rank_placement_resolves_its_stage_alone(void)
{
    struct kt_model *m = tiny_model("tiny");
    static const char *const texts[2] = {
        V1 "attention: cpu\nranks:\n  - layers: 0-1\n  - layers: 2-3\n    placement:\n      version: 1\n"
           "      attention: cpu\n",
        V1 "attention: cpu\nranks:\n  - layers: 0-1\n  - layers: 2-7\n    placement:\n      version: 1\n"
           "      attention: cpu\n"};
    for (int i = 0; m && i < 2; i++) {
        struct kt_placement_config *c = parse(texts[i]);
        const struct kt_placement_config *own = c ? kt_placement_config_rank_placement(c, 1) : NULL;
        KT_CHECK(own != NULL, "case %d: rank 1 has no placement", i);
        struct kt_placement *p = NULL;
        kt_err err = {0};
        const kt_status st = own ? kt_placement_resolve(own, m, 2, NULL, &p, &err) : KT_ERR_INVALID;
        if (i == 0) {
            KT_CHECK(st == KT_OK && p, "%s", err.msg);
            KT_CHECK(!p || (p->node_experts[0] + p->node_experts[1] == 2 * p->n_expert &&
                            p->devices[0].n_experts == 2 * p->n_expert &&
                            p->devices[0].part_bytes[KT_PART_ROUTED_EXPERTS] == 2 * p->n_expert * kt_layer_expert_bytes(m, 2) &&
                            p->devices[0].part_bytes[KT_PART_EMBEDDINGS] == 0),
                     "stage 2-3: %u + %u experts on the nodes, %u on the CPU", p ? p->node_experts[0] : 0,
                     p ? p->node_experts[1] : 0, p ? p->devices[0].n_experts : 0);
        } else {
            KT_CHECK(st == KT_ERR_FORMAT && !p && strstr(err.msg, "layers 2-7, of a model of 4 layers"), "%s",
                     err.msg);
        }
        kt_placement_destroy(p);
        kt_placement_config_destroy(c);
    }
    kt_model_close(m);
}

int main(void)
{
    KT_RUN(shaped_model_matches_a_kt_synth_file);
    KT_RUN(every_shipped_config_parses_and_fits_its_model);
    KT_RUN(bad_documents_name_line_and_key);
    KT_RUN(ranks_give_each_rank_its_layers);
    KT_RUN(unreadable_text_is_reported_at_its_line_and_column);
    KT_RUN(deep_and_odd_input_is_refused_cleanly);
    KT_RUN(tiny_sim_puts_attention_shared_and_half_the_experts_on_sim);
    KT_RUN(budget_overflow_names_need_and_budget);
    KT_RUN(resolution_errors_name_the_config_line);
    KT_RUN(explicit_lists_counts_and_all_combine);
    KT_RUN(profile_picks_the_hottest_and_breaks_ties_by_index);
    KT_RUN(config_profile_is_relative_to_the_config_and_override_wins);
    KT_RUN(cpu_spread_balances_load_and_keeps_counts_even);
    KT_RUN(replicas_copy_the_hottest_cpu_experts_to_other_nodes);
    KT_RUN(sliced_layers_are_marked_take_no_replicas_and_reach_the_engine);
    KT_RUN(profile_files_round_trip_and_bad_ones_are_refused);
    KT_RUN(profile_decays_by_half_life_in_tokens);
    KT_RUN(profile_refuses_another_model_by_fingerprint);
    KT_RUN(describe_summarises_each_device);
    KT_RUN(kv_cache_type_sizes_the_estimate_and_reaches_the_engine);
    KT_RUN(a_rank_placement_resolves_its_stage_alone);
    unlink(g_tiny_path[0]);
    unlink(g_tiny_path[1]);
    return kt_test_finish();
}
