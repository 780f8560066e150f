/*
 * test_expert_store.c - the expert store (expert_store.h) and the memory
 * check in front of it (meminfo.h), on kt-synth's tiny models.
 *
 * Proves: kept in the GGUF layout, every expert buffer holds exactly the
 * file's gate, up and down slabs of that expert, adjacent and page-aligned,
 * homed on node 0; repacked (the default wherever the kernel level in use
 * has a packed format for the type), each matrix holds what that format's
 * pack makes of the file's rows, 64-byte aligned; the engine reading
 * experts from the store gives bit-identical logits to the engine reading
 * them in place (F32, Q4_K and Q8_0 experts, prefill + greedy decode) when
 * the packed formats are exact - their kernels promise the reference's
 * float for every output, so nothing looser than equality is acceptable -
 * and within 1e-4 of the largest logit for a format that is not; ctest runs
 * this file once per kernel level (KT_ISA) the CPU has; a load that cannot fit is refused before it starts, naming
 * needed and free memory; a file truncated under an open model fails the
 * load with a message naming the tensor; load progress goes to the stream
 * the caller gave.  Fused ffn_gate_up_exps files go through the store in
 * test_forward (fused_gate_up_exps_model_matches_separate_model).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cpu/dispatch.h"
#include "engine.h"
#include "engine_test.h"
#include "expert_store.h"
#include "meminfo.h"
#include "model.h"
#include "testlib.h"

#define PROMPT_LEN 12
#define DECODE_STEPS 4
static const int32_t prompt[PROMPT_LEN] = {1, 17, 300, 42, 999, 5, 77, 512, 3, 1000, 64, 128};

/* Writes a kt-synth model; returns its path (static per name) or NULL. */
static const char *synth(const char *name, const char *args)
{
    static char paths[4][1024];
    static int n;
    char *path = paths[n++ % 4];
    snprintf(path, sizeof paths[0], "%s", kt_test_path(name));
    int rc = kt_test_system("'%s' %s -q -o '%s' > /dev/null 2>&1", kt_test_tool("kt-synth"), args, path);
    KT_CHECK(rc == 0, "kt-synth %s failed (%d)", args, rc);
    return rc == 0 ? path : NULL;
}

static struct kt_model *open_model(const char *path)
{
    struct kt_model *m = NULL;
    kt_err err = {0};
    if (path && kt_model_open(path, &m, &err) != KT_OK)
        KT_CHECK(false, "%s", err.msg);
    return m;
}

/* A fake root holding only proc/meminfo (no proc/self/cgroup: no cgroup limits). */
static const char *write_meminfo(const char *name, const char *text)
{
    const char *root = kt_test_path(name);
    kt_test_system("rm -rf '%s'", root);
    KT_CHECK(kt_test_write_tree_file(root, "proc/meminfo", text), "cannot write %s/proc/meminfo", root);
    return root;
}

/* ---- meminfo ----------------------------------------------------------------------------- */

static void meminfo_parses_total_and_available(void)
{
    kt_err err = {0};
    struct kt_meminfo mi;
    const char *p = write_meminfo("meminfo-ok", "MemTotal:       1048576 kB\nMemFree:          1000 kB\n"
                                                "MemAvailable:    524288 kB\nCached:  3000 kB\n");
    KT_CHECK(kt_meminfo_read(p, &mi, &err) == KT_OK, "%s", err.msg);
    KT_CHECK(mi.total_bytes == 1048576ull * 1024 && mi.available_bytes == 524288ull * 1024 &&
                 mi.host_available_bytes == mi.available_bytes && !mi.cgroup.limited,
             "%llu %llu", (unsigned long long)mi.total_bytes, (unsigned long long)mi.available_bytes);
    kt_test_system("rm -rf '%s'", p);

    p = write_meminfo("meminfo-old", "MemTotal: 2048 kB\nMemFree: 100 kB\nCached: 20 kB\n");
    KT_CHECK(kt_meminfo_read(p, &mi, &err) == KT_OK, "%s", err.msg);
    KT_CHECK(mi.available_bytes == 120ull * 1024, "old kernels: MemFree + Cached, got %llu",
             (unsigned long long)mi.available_bytes);
    kt_test_system("rm -rf '%s'", p);

    p = write_meminfo("meminfo-bad", "nothing here\n");
    KT_CHECK(kt_meminfo_read(p, &mi, &err) == KT_ERR_FORMAT, "a file without MemTotal is malformed");
    kt_test_system("rm -rf '%s'", p);
    KT_CHECK(kt_meminfo_read(p, &mi, &err) == KT_ERR_IO && strstr(err.msg, "/proc/meminfo"),
             "a missing file is an I/O error naming it: %s", err.msg);

    KT_CHECK(kt_meminfo_read(NULL, &mi, &err) == KT_OK && mi.total_bytes > 0 && mi.available_bytes > 0 &&
                 mi.available_bytes <= mi.host_available_bytes,
             "/proc/meminfo: %s", err.msg);
}

/* ---- the store ----------------------------------------------------------------------------- */

static void store_buffers_hold_each_experts_file_slabs(void)
{
    const char *path = synth("store-q4k", "--preset tiny --experts-type q4_k --dense-type q8_0");
    struct kt_model *m = open_model(path);
    if (!m)
        return;
    struct kt_expert_store *s = NULL;
    kt_err err = {0};
    const struct kt_expert_store_params params = {.keep_gguf_layout = true};
    KT_CHECK(kt_expert_store_create(m, &params, &s, &err) == KT_OK, "%s", err.msg);
    if (s) {
        const uint32_t Ne = m->hp.n_expert;
        uint64_t data_bytes = 0;
        int moe_layers = 0;
        for (uint32_t il = 0; il < m->hp.n_layer; il++) {
            const struct kt_layer *L = &m->layers[il];
            if (!L->is_moe) {
                KT_CHECK(kt_expert_store_expert(s, il, 0)->data == NULL, "dense layer %u has no experts", il);
                continue;
            }
            moe_layers++;
            const struct kt_expert_layout *lay = kt_expert_store_layout(s, il);
            const uint64_t g = L->ffn_gate_exps->nbytes / Ne, u = L->ffn_up_exps->nbytes / Ne,
                           d = L->ffn_down_exps->nbytes / Ne;
            KT_CHECK(lay->gate_offset == 0 && lay->up_offset == g && lay->down_offset == g + u &&
                         lay->expert_bytes == g + u + d,
                     "layer %u: layout %llu %llu %llu %llu", il, (unsigned long long)lay->gate_offset,
                     (unsigned long long)lay->up_offset, (unsigned long long)lay->down_offset,
                     (unsigned long long)lay->expert_bytes);
            data_bytes += lay->expert_bytes * Ne;
            for (uint32_t x = 0; x < Ne; x++) {
                const struct kt_stored_expert *se = kt_expert_store_expert(s, il, x);
                KT_CHECK(se->data && (uintptr_t)se->data % 4096 == 0 && se->home_node == 0,
                         "layer %u expert %u: page-aligned on node 0", il, x);
                if (!se->data)
                    continue;
                const uint8_t *fg = (const uint8_t *)L->ffn_gate_exps->data + x * g;
                const uint8_t *fu = (const uint8_t *)L->ffn_up_exps->data + x * u;
                const uint8_t *fd = (const uint8_t *)L->ffn_down_exps->data + x * d;
                KT_CHECK(!memcmp(se->data + lay->gate_offset, fg, g) && !memcmp(se->data + lay->up_offset, fu, u) &&
                             !memcmp(se->data + lay->down_offset, fd, d),
                         "layer %u expert %u: bytes differ from the file's slabs", il, x);
            }
        }
        KT_CHECK(moe_layers > 0, "the tiny model has MoE layers");
        KT_CHECK(kt_expert_store_data_bytes(s) == data_bytes, "data bytes %llu, expected %llu",
                 (unsigned long long)kt_expert_store_data_bytes(s), (unsigned long long)data_bytes);
        KT_CHECK(kt_expert_store_bytes(s) >= data_bytes, "store bytes cover the data");
    }
    kt_expert_store_destroy(s);
    kt_model_close(m);
    unlink(path);
}

/* want = what `f` makes of the file slab (or the slab itself), compared with got. */
static bool matrix_matches_file(const struct kt_packed_format *f, const struct kt_gguf_tensor *t, const uint8_t *slab,
                                int64_t n_rows, const uint8_t *got)
{
    const size_t row_bytes = kt_type_row_bytes(t->type, t->ne[0]);
    if (!f)
        return memcmp(got, slab, (size_t)n_rows * row_bytes) == 0;
    const size_t bytes = kt_packed_bytes(f, t->ne[0], n_rows);
    uint8_t *want = malloc(bytes);
    if (!want)
        return false;
    f->pack(t->ne[0], slab, row_bytes, n_rows, want);
    bool same = memcmp(got, want, bytes) == 0;
    free(want);
    return same;
}

static void packed_store_holds_each_matrix_as_its_format_packs_it(const char *name, const char *args, int type)
{
    const struct kt_packed_format *f = kt_cpu_kernels()->type[type].packed;
    printf("  %s experts at level %s: %s\n", kt_type_traits(type)->name, kt_isa_name(kt_cpu_kernels()->isa),
           f ? f->name : "kept in GGUF rows (no packed format at this level)");
    const char *path = synth(name, args);
    struct kt_model *m = open_model(path);
    if (!m)
        return;
    struct kt_expert_store *s = NULL;
    kt_err err = {0};
    KT_CHECK(kt_expert_store_create(m, NULL, &s, &err) == KT_OK, "%s", err.msg);
    const int64_t f_rows = m->hp.n_ff_exp, E = m->hp.n_embd;
    for (uint32_t il = 0; s && il < m->hp.n_layer; il++) {
        const struct kt_layer *L = &m->layers[il];
        if (!L->is_moe)
            continue;
        const struct kt_expert_layout *lay = kt_expert_store_layout(s, il);
        const struct kt_gguf_tensor *tg = L->ffn_gate_exps, *tu = L->ffn_up_exps, *td = L->ffn_down_exps;
        const struct kt_cpu_kernels *k = kt_cpu_kernels();
        KT_CHECK(tg->type == type && lay->gate_packed == f && lay->up_packed == f &&
                     lay->down_packed == k->type[td->type].packed,
                 "layer %u: each matrix in its type's format at this level", il);
        KT_CHECK(lay->up_offset % 64 == 0 && lay->down_offset % 64 == 0, "layer %u: 64-byte aligned matrices", il);
        for (uint32_t x = 0; x < m->hp.n_expert; x++) {
            const uint8_t *data = kt_expert_store_expert(s, il, x)->data;
            const uint64_t g = tg->nbytes / m->hp.n_expert, u = tu->nbytes / m->hp.n_expert,
                           d = td->nbytes / m->hp.n_expert;
            bool ok = matrix_matches_file(f, tg, (const uint8_t *)tg->data + x * g, f_rows, data + lay->gate_offset) &&
                      matrix_matches_file(f, tu, (const uint8_t *)tu->data + x * u, f_rows, data + lay->up_offset) &&
                      matrix_matches_file(lay->down_packed, td, (const uint8_t *)td->data + x * d, E,
                                          data + lay->down_offset);
            KT_CHECK(ok, "layer %u expert %u: a matrix differs from its format's packing of the file", il, x);
        }
    }
    kt_expert_store_destroy(s);
    kt_model_close(m);
    unlink(path);
}

static void packed_store_holds_q4_k_matrices_as_packed(void)
{
    packed_store_holds_each_matrix_as_its_format_packs_it("packed-q4k", "--preset tiny --experts-type q4_k",
                                                          KT_TYPE_Q4_K);
}

static void packed_store_holds_q8_0_matrices_as_packed(void)
{
    packed_store_holds_each_matrix_as_its_format_packs_it("packed-q80", "--preset tiny --experts-type q8_0",
                                                          KT_TYPE_Q8_0);
}

/* ---- the engine ----------------------------------------------------------------------------- */

/* Prefill + greedy decode; returns (PROMPT_LEN + DECODE_STEPS, V) logits or NULL. */
static float *run_engine(struct kt_model *m, bool in_place, uint32_t n_threads, FILE *progress, uint64_t *store_bytes)
{
    struct kt_engine_params p = {.n_ctx = 64, .n_threads = n_threads, .max_batch_tokens = 64,
                                 .test = &(struct kt_engine_test_params){.experts_in_place = in_place}, .progress = progress};
    /* the store's size, from an engine of its own (cheap: tiny models) */
    struct kt_engine *e = NULL;
    kt_err err = {0};
    *store_bytes = 0;
    if (kt_engine_create(m, &(struct kt_engine_params){.n_ctx = 8, .test = &(struct kt_engine_test_params){.experts_in_place = in_place}}, &e, &err) == KT_OK)
        *store_bytes = kt_engine_expert_store_bytes(e);
    kt_engine_destroy(e);
    return kt_test_engine_greedy(m, &p, prompt, PROMPT_LEN, DECODE_STEPS, NULL, NULL, NULL);
}

static void store_logits_equal_in_place(const char *name, const char *args, int experts_type)
{
    const char *path = synth(name, args);
    struct kt_model *m = open_model(path);
    if (!m)
        return;
    const struct kt_packed_format *f = kt_cpu_kernels()->type[experts_type].packed;
    const bool exact = !f || f->exact;
    const size_t n = (size_t)(PROMPT_LEN + DECODE_STEPS) * m->hp.n_vocab;
    uint64_t bytes_in_place = 1, bytes_store = 0;
    FILE *progress = tmpfile();
    for (uint32_t threads = 1; threads <= 2; threads++) {
        float *a = run_engine(m, true, threads, NULL, &bytes_in_place);
        float *b = run_engine(m, false, threads, threads == 1 ? progress : NULL, &bytes_store);
        if (exact)
            KT_CHECK(a && b && !memcmp(a, b, n * sizeof *a), "%s, %u threads: store logits differ from in-place",
                     name, threads);
        else
            KT_CHECK(a && b && kt_test_worst_row_diff(a, b, PROMPT_LEN + DECODE_STEPS, m->hp.n_vocab) <= 1e-4,
                     "%s, %u threads: store logits (%s) further than 1e-4 from in-place", name, threads, f->name);
        free(a);
        free(b);
    }
    KT_CHECK(bytes_in_place == 0 && bytes_store > 0, "store bytes: in place %llu, store %llu",
             (unsigned long long)bytes_in_place, (unsigned long long)bytes_store);
    char text[4096] = "";
    if (progress) {
        rewind(progress);
        size_t got = fread(text, 1, sizeof text - 1, progress);
        text[got] = 0;
        fclose(progress);
    }
    KT_CHECK(strstr(text, "loading experts") && strstr(text, "B/s"), "progress stream got: \"%s\"", text);
    kt_model_close(m);
    unlink(path);
}

static void store_logits_equal_in_place_f32(void)
{
    store_logits_equal_in_place("store-f32", "--preset tiny", KT_TYPE_F32);
}

static void store_logits_equal_in_place_q4_k(void)
{
    store_logits_equal_in_place("store-q4k-q8", "--preset tiny --experts-type q4_k --dense-type q8_0", KT_TYPE_Q4_K);
}

static void store_logits_equal_in_place_q8_0(void)
{
    store_logits_equal_in_place("store-q80", "--preset tiny-v3 --experts-type q8_0", KT_TYPE_Q8_0);
}

/* Every weight kept in GGUF rows vs the default (experts in the store and
 * the host's attention, dense, shared and output matrices repacked where
 * the level has a format): exact formats promise the same bits. */
static void repacked_host_weights_give_the_same_logits(void)
{
    char path[1024];
    struct kt_model *m = kt_test_synth_model(
        "tiny", "--experts-type q4_k --dense-type q8_0 --attn-type q8_0 --shared-type q8_0 --output-type q8_0", path,
        sizeof path);
    if (!m)
        return;
    const struct kt_packed_format *f = kt_cpu_kernels()->type[KT_TYPE_Q8_0].packed;
    const bool exact = !f || f->exact;
    const size_t n = (size_t)(PROMPT_LEN + DECODE_STEPS) * m->hp.n_vocab;
    for (uint32_t threads = 1; threads <= 2; threads++) {
        struct kt_engine_params gguf = {.n_ctx = 64, .n_threads = threads, .max_batch_tokens = 64,
                                        .test = &(struct kt_engine_test_params){.keep_gguf_layout = true}};
        struct kt_engine_params packed = gguf;
        packed.test = NULL;
        float *a = kt_test_engine_greedy(m, &gguf, prompt, PROMPT_LEN, DECODE_STEPS, NULL, NULL, NULL);
        float *b = kt_test_engine_greedy(m, &packed, prompt, PROMPT_LEN, DECODE_STEPS, NULL, NULL, NULL);
        if (exact)
            KT_CHECK(a && b && !memcmp(a, b, n * sizeof *a), "%u threads: packed host weights changed the logits",
                     threads);
        else
            KT_CHECK(a && b && kt_test_worst_row_diff(a, b, PROMPT_LEN + DECODE_STEPS, m->hp.n_vocab) <= 1e-4,
                     "%u threads: packed host weights (%s) further than 1e-4 from GGUF rows", threads, f->name);
        free(a);
        free(b);
    }
    kt_test_synth_remove(m, path);
}

static void load_that_cannot_fit_is_refused_before_it_starts(void)
{
    const char *path = synth("store-nomem", "--preset tiny");
    struct kt_model *m = open_model(path);
    if (!m)
        return;
    const char *mi = write_meminfo("meminfo-tiny", "MemTotal: 4096 kB\nMemFree: 1024 kB\nMemAvailable: 2048 kB\n");
    struct kt_engine_test_params test = {.host_root = mi};
    struct kt_engine_params p = {.n_ctx = 64, .n_threads = 1, .max_batch_tokens = 64, .test = &test};
    struct kt_engine *e = NULL;
    kt_err err = {0};
    kt_status st = kt_engine_create(m, &p, &e, &err);
    KT_CHECK(st == KT_ERR_NOMEM && e == NULL, "status %d", (int)st);
    KT_CHECK(strstr(err.msg, "needs ") && strstr(err.msg, "GiB") && strstr(err.msg, "0.00 GiB is available") &&
                 strstr(err.msg, mi),
             "message names needed and free memory: %s", err.msg);

    /* The same file with room to spare loads. */
    kt_test_system("rm -rf '%s'", mi);
    mi = write_meminfo("meminfo-roomy", "MemTotal: 67108864 kB\nMemAvailable: 33554432 kB\n");
    test.host_root = mi;
    st = kt_engine_create(m, &p, &e, &err);
    KT_CHECK(st == KT_OK && kt_engine_expert_store_bytes(e) > 0, "%s", err.msg);
    kt_engine_destroy(e);
    kt_test_system("rm -rf '%s'", mi);
    kt_model_close(m);
    unlink(path);
}

static void truncated_file_fails_the_load_naming_the_tensor(void)
{
    const char *path = synth("store-trunc", "--preset tiny");
    struct kt_model *m = open_model(path);
    if (!m)
        return;
    /* Cut the file in the middle of the expert tensor that lies last in it,
     * after the model was opened (nothing reads expert data through the map). */
    const struct kt_gguf_tensor *last = NULL;
    for (uint32_t il = 0; il < m->hp.n_layer; il++) {
        const struct kt_layer *L = &m->layers[il];
        const struct kt_gguf_tensor *t[] = {L->ffn_gate_exps, L->ffn_up_exps, L->ffn_down_exps};
        for (int i = 0; i < 3; i++)
            if (t[i] && (!last || t[i]->offset > last->offset))
                last = t[i];
    }
    KT_CHECK(last != NULL, "the tiny model has expert tensors");
    if (last) {
        const off_t cut = (off_t)(m->gguf->data_offset + last->offset + last->nbytes / 2);
        KT_CHECK(truncate(path, cut) == 0, "truncate %s", path);
        struct kt_engine_params p = {.n_ctx = 64, .n_threads = 1, .max_batch_tokens = 64};
        struct kt_engine *e = NULL;
        kt_err err = {0};
        kt_status st = kt_engine_create(m, &p, &e, &err);
        KT_CHECK(st == KT_ERR_IO && e == NULL, "status %d: %s", (int)st, err.msg);
        KT_CHECK(strstr(err.msg, last->name) && strstr(err.msg, "truncated") && strstr(err.msg, path),
                 "message names file and tensor: %s", err.msg);
    }
    kt_model_close(m);
    unlink(path);
}

int main(void)
{
    KT_RUN(meminfo_parses_total_and_available);
    KT_RUN(store_buffers_hold_each_experts_file_slabs);
    KT_RUN(store_logits_equal_in_place_f32);
    KT_RUN(store_logits_equal_in_place_q4_k);
    KT_RUN(store_logits_equal_in_place_q8_0);
    KT_RUN(packed_store_holds_q4_k_matrices_as_packed);
    KT_RUN(packed_store_holds_q8_0_matrices_as_packed);
    KT_RUN(repacked_host_weights_give_the_same_logits);
    KT_RUN(load_that_cannot_fit_is_refused_before_it_starts);
    KT_RUN(truncated_file_fails_the_load_naming_the_tensor);
    return kt_test_finish();
}
