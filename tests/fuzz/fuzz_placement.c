/*
 * fuzz_placement.c - fuzz target for placement configs and routing profiles.
 *
 * Each input is parsed as a placement config (kt_placement_config_parse) from
 * an exactly-sized copy; an accepted config that names no profile file is
 * resolved against a small model built in memory (4 layers, the first dense,
 * 32 experts) on 1 to 4 NUMA nodes, and the plan's promises are checked:
 * every routed expert has exactly one home on a device that exists, CPU homes
 * sit on a node the plan allows, replicas never include the home, budgets
 * hold and the bytes add up to the model; the same for each rank's own
 * placement (ranks[r].placement).  The same input is also parsed as
 * a profile.  A rejection must be a format error whose message starts with
 * the input's name.  A broken promise aborts.  It must never touch files or
 * keep state between inputs.  kt_fuzz_seeds hands replay.c valid configs,
 * their truncations and single-byte mutations.
 */
#include "fuzz.h"

#include "config.h"
#include "model.h"
#include "plan.h"
#include "profile.h"
#include "quant.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void require(bool cond, const char *what)
{
    if (!cond) {
        fprintf(stderr, "fuzz_placement: broken promise: %s\n", what);
        abort();
    }
}

/* ---- a model of tiny's shape, tensors without data -------------------------------- */

enum { N_LAYER = 4, N_EXPERT = 32, E = 64, F = 128, FE = 32, MAX_TENSORS = 64 };

struct small_model {
    struct kt_model m;
    struct kt_layer layers[N_LAYER];
    struct kt_gguf_tensor tensors[MAX_TENSORS];
    int n;
    /* what the tensors added so far weigh, and each layer's and the embeddings' and head's share */
    uint64_t bytes, layer_bytes[N_LAYER], head_bytes;
};

static const struct kt_gguf_tensor *add(struct small_model *s, enum kt_tensor_class c, int64_t ne0, int64_t ne1,
                                        int64_t ne2)
{
    require(s->n < MAX_TENSORS, "tensor table size");
    struct kt_gguf_tensor *t = &s->tensors[s->n++];
    t->type = KT_TYPE_F32;
    t->n_dims = 3;
    t->ne[0] = ne0;
    t->ne[1] = ne1;
    t->ne[2] = ne2;
    t->ne[3] = 1;
    t->nbytes = (uint64_t)(ne0 * ne1 * ne2) * 4;
    s->m.class_bytes[c] += t->nbytes;
    s->bytes += t->nbytes;
    return t;
}

static void build_model(struct small_model *s)
{
    memset(s, 0, sizeof *s);
    struct kt_model *m = &s->m;
    m->layers = s->layers;
    m->hp = (struct kt_hparams){.n_layer = N_LAYER, .n_embd = E, .n_ff = F, .n_head = 2, .n_head_kv = 1,
                                .q_lora_rank = 16, .kv_lora_rank = 16, .qk_nope_dim = 8, .qk_rope_dim = 8,
                                .v_head_dim = 8, .mla_split = true, .n_dense_lead = 1, .n_expert = N_EXPERT,
                                .n_expert_used = 4, .n_expert_shared = 1, .n_ff_exp = FE, .n_vocab = 100};
    m->token_embd = add(s, KT_CLASS_EMBED_OUTPUT, E, 100, 1);
    m->output_norm = add(s, KT_CLASS_EMBED_OUTPUT, E, 1, 1);
    m->output = add(s, KT_CLASS_EMBED_OUTPUT, E, 100, 1);
    s->head_bytes = s->bytes;
    for (int il = 0; il < N_LAYER; il++) {
        struct kt_layer *L = &s->layers[il];
        const uint64_t before = s->bytes;
        L->attn_norm = add(s, KT_CLASS_ATTENTION, E, 1, 1);
        L->attn_q = add(s, KT_CLASS_ATTENTION, E, 32, 1);
        L->attn_kv_a_mqa = add(s, KT_CLASS_ATTENTION, E, 24, 1);
        L->attn_output = add(s, KT_CLASS_ATTENTION, 16, E, 1);
        L->ffn_norm = add(s, KT_CLASS_DENSE_FFN, E, 1, 1);
        L->is_moe = il > 0;
        if (!L->is_moe) {
            L->ffn_gate = add(s, KT_CLASS_DENSE_FFN, E, F, 1);
            L->ffn_up = add(s, KT_CLASS_DENSE_FFN, E, F, 1);
            L->ffn_down = add(s, KT_CLASS_DENSE_FFN, F, E, 1);
            s->layer_bytes[il] = s->bytes - before;
            continue;
        }
        L->ffn_gate_inp = add(s, KT_CLASS_ROUTER, E, N_EXPERT, 1);
        L->ffn_gate_exps = add(s, KT_CLASS_ROUTED_EXPERTS, E, FE, N_EXPERT);
        L->ffn_up_exps = add(s, KT_CLASS_ROUTED_EXPERTS, E, FE, N_EXPERT);
        L->ffn_down_exps = add(s, KT_CLASS_ROUTED_EXPERTS, FE, E, N_EXPERT);
        L->ffn_gate_shexp = add(s, KT_CLASS_SHARED_EXPERTS, E, FE, 1);
        L->ffn_up_shexp = add(s, KT_CLASS_SHARED_EXPERTS, E, FE, 1);
        L->ffn_down_shexp = add(s, KT_CLASS_SHARED_EXPERTS, FE, E, 1);
        s->layer_bytes[il] = s->bytes - before;
    }
}

/* ---- checks ------------------------------------------------------------------------ */

/* p resolved for sm's model on n_nodes nodes: a rank's stage (stage_end set)
 * holds its layers' weights alone, and the embeddings and head when it
 * starts at layer 0. */
static void check_plan(const struct kt_placement *p, const struct small_model *sm, int n_nodes)
{
    require(p->n_devices >= 1 && p->n_devices <= KT_PLACEMENT_MAX_DEVICES, "device count");
    require(p->devices[0].backend == KT_PLACE_CPU && strcmp(p->devices[0].name, "cpu") == 0, "devices[0] is cpu");
    require(p->n_layer == N_LAYER && p->n_expert == N_EXPERT && p->n_nodes == n_nodes, "shape");
    require(p->expert_nodes != 0 && (n_nodes == 64 || p->expert_nodes >> n_nodes == 0), "expert nodes exist");
    require(p->embeddings >= 0 && p->embeddings < p->n_devices, "embeddings device");
    uint64_t weights = 0;
    uint32_t homed = 0, node_homed = 0;
    for (int i = 0; i < p->n_devices; i++) {
        const struct kt_placement_device *d = &p->devices[i];
        uint64_t sum = 0;
        for (int part = 0; part < KT_PART_COUNT; part++)
            sum += d->part_bytes[part];
        require(sum == d->bytes, "parts add up");
        require(i == 0 || d->bytes <= d->budget_bytes, "within budget");
        weights += d->bytes - d->part_bytes[KT_PART_KV_CACHE] - d->part_bytes[KT_PART_REPLICAS] -
                   d->part_bytes[KT_PART_WORK_BUFFERS];
        homed += d->n_experts;
    }
    for (int n = 0; n < n_nodes; n++)
        node_homed += p->node_experts[n];
    const uint32_t begin = p->stage_end ? p->stage_begin : 0, end = p->stage_end ? p->stage_end : N_LAYER;
    require(begin < end && end <= N_LAYER, "a stage within the model");
    uint64_t total = begin == 0 ? sm->head_bytes : 0;
    for (uint32_t il = begin; il < end; il++)
        total += sm->layer_bytes[il];
    require(weights == total, "weights add up to the model's, or to the stage's");
    require(homed == (end - (begin > 0 ? begin : 1)) * N_EXPERT, "every expert of the stage homed once");
    require(node_homed == p->devices[0].n_experts, "node counts add up to the CPU's");
    for (uint32_t il = 0; il < N_LAYER; il++) {
        const struct kt_placement_layer *pl = &p->layers[il];
        require(pl->attention >= 0 && pl->attention < p->n_devices, "attention device");
        require(pl->is_moe == (il > 0), "layer kind");
        require(!pl->cpu_sliced || pl->is_moe, "only MoE layers are row-sliced");
        require(pl->is_moe ? pl->dense_ffn == -1 && pl->shared_experts >= 0 && pl->experts
                           : pl->dense_ffn >= 0 && pl->shared_experts == -1 && !pl->experts,
                "layer parts");
        for (uint32_t x = 0; pl->experts && x < N_EXPERT; x++) {
            const struct kt_expert_home *h = kt_placement_expert(p, il, x);
            require(h == &pl->experts[x], "expert lookup");
            require(h->device >= 0 && h->device < p->n_devices, "home device");
            if (h->device == 0)
                require(h->node >= 0 && h->node < n_nodes, "CPU home on a node");
            else
                require(h->node == -1 && h->replica_nodes == 0, "accelerator homes have no node");
            require(h->device != 0 || !(h->replica_nodes >> h->node & 1), "a replica is never the home");
            require((h->replica_nodes & ~p->expert_nodes) == 0, "replicas on allowed nodes");
            require(!pl->cpu_sliced || h->replica_nodes == 0, "no replicas in a row-sliced layer");
        }
    }
    require(kt_placement_expert(p, 0, 0) == NULL && kt_placement_expert(p, 1, N_EXPERT) == NULL, "out of range");
    FILE *null = fopen("/dev/null", "w");
    if (null) {
        kt_placement_describe(p, null);
        fclose(null);
    }
}

static void check_error(kt_status s, const kt_err *err)
{
    require(s == KT_ERR_FORMAT || s == KT_ERR_NOMEM, "rejections are format errors");
    require(strncmp(err->msg, "fuzz.yaml", 9) == 0 || s == KT_ERR_NOMEM, "messages name the input");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *copy = malloc(size ? size : 1);
    if (!copy)
        return 0;
    if (size)
        memcpy(copy, data, size);
    struct kt_placement_config *c = NULL;
    kt_err err = {.msg = ""};
    kt_status s = kt_placement_config_parse(copy, size, "fuzz.yaml", &c, &err);
    require((s == KT_OK) == (c != NULL), "config set exactly on success");
    if (s != KT_OK)
        check_error(s, &err);
    if (c && !kt_placement_config_profile(c)) {
        struct small_model *sm = malloc(sizeof *sm);
        if (sm) {
            build_model(sm);
            int n_nodes = (int)(size % 4) + 1;
            struct kt_placement *p = NULL;
            s = kt_placement_resolve(c, &sm->m, n_nodes, NULL, &p, &err);
            require((s == KT_OK) == (p != NULL), "plan set exactly on success");
            if (p)
                check_plan(p, sm, n_nodes);
            else
                check_error(s, &err);
            kt_placement_destroy(p);
            /* each rank's own placement (ranks[r].placement) resolves with the same promises */
            for (int r = 0; r < kt_placement_config_ranks(c); r++) {
                const struct kt_placement_config *own = kt_placement_config_rank_placement(c, r);
                if (!own || kt_placement_config_profile(own))
                    continue;
                p = NULL;
                s = kt_placement_resolve(own, &sm->m, n_nodes, NULL, &p, &err);
                require((s == KT_OK) == (p != NULL), "a rank's plan set exactly on success");
                if (p)
                    check_plan(p, sm, n_nodes);
                else
                    check_error(s, &err);
                kt_placement_destroy(p);
            }
            free(sm);
        }
    }
    kt_placement_config_destroy(c);

    struct kt_profile *prof = NULL;
    s = kt_profile_parse(copy, size, "fuzz.json", &prof, &err);
    require((s == KT_OK) == (prof != NULL), "profile set exactly on success");
    for (size_t i = 0; prof && i < (size_t)prof->n_layer * prof->n_expert; i++)
        for (int ph = 0; ph < KT_PROFILE_PHASES; ph++)
            require(prof->counts[ph][i] >= 0 && isfinite(prof->counts[ph][i]), "token counts");
    for (int ph = 0; prof && ph < KT_PROFILE_PHASES; ph++)
        require(prof->tokens[ph] >= 0 && isfinite(prof->tokens[ph]), "token totals");
    if (prof) { /* what was accepted writes and reads back */
        char *text = kt_profile_dump(prof);
        struct kt_profile *again = NULL;
        require(text && kt_profile_parse(text, strlen(text), "dump", &again, &err) == KT_OK, "a dump parses");
        require(again->n_layer == prof->n_layer && again->n_expert == prof->n_expert &&
                    again->model.fingerprint == prof->model.fingerprint,
                "a dump keeps the shape and identity");
        kt_profile_destroy(again);
        free(text);
    }
    kt_profile_destroy(prof);
    free(copy);
    return 0;
}

/* ---- seeds for replay.c ---------------------------------------------------------- */

static const char *const SEEDS[] = {
    "version: 1\ndevices:\n  sim: {backend: sim, memory_gib: 0.125, transfer_gbps: 25, latency_us: 10}\n"
    "attention: sim\nexperts:\n  sim:\n    per_layer: 16\ncpu:\n  nodes: auto\n",
    "version: 1\ndescription: lists\nkv_cache: {tokens: 1024, type: f32}\ndevices:\n"
    "  a: {backend: cuda, device: 1, memory_gib: 1}\n  b: {backend: sim, memory_gib: 2}\n"
    "attention: a\nshared_experts: b\ndense_layers: cpu\nembeddings: cpu\n"
    "experts:\n  a:\n    per_layer: 2\n    layers: {1: [0-3, 9], 2-3: 4}\n  b: {layers: {3: all}}\n"
    "cpu:\n  nodes: [0, 1]\n  assign:\n    1: {layers: {1: [10, 12-14]}, per_layer: 1}\n"
    "  replicas: {hot_per_layer: 2}\n",
    "version: 1\nattention: cpu\ncpu: {nodes: [0], assign: {0: {per_layer: all}}}\n",
    "version: 1\nattention: cpu\ncpu: {sliced: [1, 2-3], replicas: {hot_per_layer: 2}}\n",
    "version: 1\nattention: cpu\ncpu:\n  nodes: [0, 1]\n  sliced: all\n",
    "version: 1\nattention: cpu\nranks:\n  - layers: 0-1\n    placement:\n      version: 1\n      attention: cpu\n"
    "      cpu: {nodes: [0], assign: {0: {layers: {1: all}}}}\n  - layers: 2-3\n    placement:\n"
    "      version: 1\n      attention: cpu\n      cpu:\n        nodes: [0, 1]\n        sliced: [2-3]\n",
    "{\"version\": 1, \"model\": \"m\", \"layers\": [[], [1, 2.5, 0], [3, 0, 1e3]]}",
    "{\"version\": 2, \"model\": {\"name\": \"K\", \"arch\": \"deepseek2\", \"n_layer\": 2, \"n_expert\": 3, "
    "\"n_expert_used\": 2, \"n_embd\": 64, \"n_ff_exp\": 32, \"fingerprint\": \"00ff00ff00ff00fa\"}, "
    "\"half_life_tokens\": 1000, \"tokens\": {\"decode\": 4, \"prefill\": 2.5}, \"decode\": [[], [4, 3, 1]], "
    "\"prefill\": [[], [0.5, 2, 2.5]]}",
};

void kt_fuzz_seeds(kt_fuzz_emit_fn emit)
{
    static const char values[] = {0, ':', '-', '[', '{', ' ', '\n', '9', '&', '*', '"', '\t'};
    kt_fuzz_mutated_seeds(emit, SEEDS, sizeof SEEDS / sizeof SEEDS[0], values, sizeof values);
}
