/*
 * test_gguf_corrupt.c - the GGUF reader rejects every malformed file, with a
 * message, and never crashes or reads out of bounds.
 *
 * A valid small file is written, then corrupted deterministically: truncated
 * at every byte, each count / length / type / n_dims / ne / offset field set
 * to hostile values, keys and names duplicated, alignment broken, arrays
 * nested past the limit, the header's magic and version damaged.  Each input
 * is parsed from an exactly-sized heap copy (so sanitizers see any overread)
 * and from a file, and both must give the same verdict.  The inputs are also
 * written to $KT_TEST_TMP/corpus/gguf for fuzz_gguf_replay and as libFuzzer
 * seeds.  A few mutations can produce another well-formed file (a count made
 * smaller, say); those are listed as "reinterpretable": they must not crash,
 * and if accepted must be self-consistent.  This test must never weaken a
 * must-reject case into a reinterpretable one to make it pass.
 */
#include "gguf.h"
#include "quant.h"
#include "testlib.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

enum verdict {
    MUST_REJECT,
    MAY_ACCEPT,   /* reinterpretable: another well-formed file may result */
    MUST_ACCEPT,
};

struct corpus {
    char dir[1024];
    int n_inputs;
    int n_rejected;
    int n_reinterpretable, n_reinterpretable_accepted;
};

static struct corpus g_corpus;

/* ---- the valid base file and where its fields are --------------------------------- */

static uint8_t *g_base;     /* the valid file */
static size_t g_base_bytes;
static uint64_t g_required; /* bytes a reader needs: end of the last tensor's data */

struct kv_field {
    const char *key;
    uint64_t record;    /* key length field */
    uint64_t type;      /* value type field */
    uint64_t value;     /* value (string length / array elem type / scalar) */
    uint32_t value_type;
};

struct tensor_field {
    const char *name;
    uint64_t record;    /* name length field */
    uint64_t n_dims;
    uint64_t ne[4];
    uint32_t dims;
    uint64_t type;
    uint64_t offset;
};

static struct kv_field g_kvs[16];
static size_t g_n_kvs;
static struct tensor_field g_tensors[8];
static size_t g_n_tensors;

static void put_u32(uint8_t *p, uint32_t v)
{
    memcpy(p, &v, 4);
}

static void put_u64(uint8_t *p, uint64_t v)
{
    memcpy(p, &v, 8);
}

static uint64_t get_u64(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

static uint32_t get_u32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* Writes the base file and records every field's position from its layout. */
static bool build_base(void)
{
    const char *path = kt_test_path("gguf_corrupt_base.gguf");
    struct kt_gguf_writer *w = NULL;
    kt_err err = {0};
    const char *toks[] = {"a", "bc", ""};
    const uint32_t u32s[] = {1, 2, 3};
    const int16_t i16s[] = {-1, 7};
    struct kt_gguf_value inner[2] = {
        {.type = KT_GGUF_ARRAY, .arr = {.elem_type = KT_GGUF_INT16, .count = 2, .data = i16s}},
        {.type = KT_GGUF_ARRAY, .arr = {.elem_type = KT_GGUF_UINT32, .count = 3, .data = u32s}},
    };
    struct kt_gguf_value nested = {.type = KT_GGUF_ARRAY, .arr = {.elem_type = KT_GGUF_ARRAY, .count = 2, .items = inner}};
    const int64_t ne_a[] = {8, 3}, ne_b[] = {64, 2}, ne_c[] = {256}, ne_d[] = {4, 2, 2, 2};
    bool ok = kt_gguf_writer_create(path, &w, &err) == KT_OK &&
              kt_gguf_writer_set_u32(w, "general.alignment", 64, &err) == KT_OK &&
              kt_gguf_writer_set_str(w, "general.architecture", "deepseek2", &err) == KT_OK &&
              kt_gguf_writer_set_u32(w, "kt.test.aaa", 1, &err) == KT_OK &&
              kt_gguf_writer_set_u32(w, "kt.test.bbb", 2, &err) == KT_OK &&
              kt_gguf_writer_set_f32(w, "kt.test.f32", 0.5f, &err) == KT_OK &&
              kt_gguf_writer_set_bool(w, "kt.test.bool", true, &err) == KT_OK &&
              kt_gguf_writer_set_str_array(w, "tokenizer.ggml.tokens", toks, 3, &err) == KT_OK &&
              kt_gguf_writer_set_array(w, "kt.test.u32s", KT_GGUF_UINT32, u32s, 3, &err) == KT_OK &&
              kt_gguf_writer_set(w, "kt.test.nested", &nested, &err) == KT_OK &&
              kt_gguf_writer_add_tensor(w, "blk.0.a", KT_TYPE_F32, 2, ne_a, &err) == KT_OK &&
              kt_gguf_writer_add_tensor(w, "blk.0.b", KT_TYPE_Q8_0, 2, ne_b, &err) == KT_OK &&
              kt_gguf_writer_add_tensor(w, "blk.0.c", KT_TYPE_Q4_K, 1, ne_c, &err) == KT_OK &&
              kt_gguf_writer_add_tensor(w, "blk.0.d", KT_TYPE_F16, 4, ne_d, &err) == KT_OK &&
              kt_gguf_writer_write_header(w, &err) == KT_OK;
    unsigned long long state = 5;
    uint8_t chunk[64];
    for (int left = 96 + 136 + 144 + 64; ok && left > 0; left -= 64) {
        for (int i = 0; i < 64; i++)
            chunk[i] = (uint8_t)kt_test_rand_u64(&state);
        ok = kt_gguf_writer_write_data(w, chunk, left < 64 ? (size_t)left : 64, &err) == KT_OK;
    }
    ok = ok && kt_gguf_writer_finish(w, &err) == KT_OK;
    KT_CHECK(ok, "base file: %s", err.msg);
    kt_gguf_writer_destroy(w);
    if (!ok)
        return false;
    g_base = kt_test_read_file(path, &g_base_bytes);
    unlink(path);
    struct kt_gguf *g = NULL;
    KT_CHECK(g_base && kt_gguf_open_memory(g_base, g_base_bytes, &g, &err) == KT_OK, "base parses: %s", err.msg);
    if (!g)
        return false;
    for (uint64_t i = 0; i < g->n_kv && i < 16; i++) {
        struct kv_field *f = &g_kvs[g_n_kvs++];
        uint64_t key_len = get_u64(g_base + g->kv[i].file_offset);
        f->key = g->kv[i].key;
        f->record = g->kv[i].file_offset;
        f->type = f->record + 8 + key_len;
        f->value = f->type + 4;
        f->value_type = g->kv[i].value.type;
    }
    for (uint64_t i = 0; i < g->n_tensors && i < 8; i++) {
        const struct kt_gguf_tensor *t = &g->tensors[i];
        struct tensor_field *f = &g_tensors[g_n_tensors++];
        uint64_t name_len = get_u64(g_base + t->info_offset);
        f->name = t->name;
        f->record = t->info_offset;
        f->n_dims = f->record + 8 + name_len;
        f->dims = t->n_dims;
        for (uint32_t d = 0; d < t->n_dims; d++)
            f->ne[d] = f->n_dims + 4 + 8 * d;
        f->type = f->n_dims + 4 + 8 * t->n_dims;
        f->offset = f->type + 4;
        uint64_t end = g->data_offset + t->offset + t->nbytes;
        if (end > g_required)
            g_required = end;
    }
    /* The cases below rely on this shape: zero padding before the data, no
     * slack after the last tensor, ggml-style offsets. */
    KT_CHECK(g->data_offset >= g_tensors[3].offset + 8 + 12, "12 bytes of zero padding before the data section");
    KT_CHECK(g_required == g_base_bytes, "last tensor ends the file");
    KT_CHECK(g->tensors[1].offset == 128 && g->tensors[2].offset == 320 && g->tensors[3].offset == 512,
             "offsets %" PRIu64 " %" PRIu64 " %" PRIu64, g->tensors[1].offset, g->tensors[2].offset,
             g->tensors[3].offset);
    /* keep the key and name strings: they point into g, closed below */
    static char keys[16][64], names[8][64];
    for (size_t i = 0; i < g_n_kvs; i++) {
        snprintf(keys[i], sizeof keys[i], "%s", g_kvs[i].key);
        g_kvs[i].key = keys[i];
    }
    for (size_t i = 0; i < g_n_tensors; i++) {
        snprintf(names[i], sizeof names[i], "%s", g_tensors[i].name);
        g_tensors[i].name = names[i];
    }
    kt_gguf_close(g);
    return g_n_kvs == 9 && g_n_tensors == 4;
}

/* ---- checking one input ------------------------------------------------------------ */

/* Reads everything an accepted file offers and checks the reader's promises. */
static void walk_accepted(const struct kt_gguf *g, const char *label)
{
    for (uint64_t i = 0; i < g->n_kv; i++)
        KT_CHECK(kt_gguf_find_kv(g, g->kv[i].key) == &g->kv[i], "%s: kv '%s' not found by name", label, g->kv[i].key);
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const struct kt_gguf_tensor *t = &g->tensors[i];
        const uint8_t *d = t->data;
        KT_CHECK(kt_gguf_find_tensor(g, t->name) == t, "%s: tensor '%s' not found by name", label, t->name);
        KT_CHECK(d >= g->base + g->data_offset && t->nbytes <= g->file_bytes &&
                 (uint64_t)(d - g->base) <= g->file_bytes - t->nbytes, "%s: tensor '%s' data out of bounds", label,
                 t->name);
        KT_CHECK(t->offset % g->alignment == 0 && kt_type_traits(t->type) && t->n_dims >= 1 && t->n_dims <= 4,
                 "%s: tensor '%s' invariants", label, t->name);
        unsigned sum = 0;
        for (uint64_t j = 0; j < t->nbytes; j++)
            sum += d[j];
        (void)sum;
    }
}

static void write_corpus_file(const char *label, const uint8_t *buf, size_t len, char *path, size_t path_size)
{
    snprintf(path, path_size, "%s/%04d-%s.gguf", g_corpus.dir, g_corpus.n_inputs, label);
    FILE *f = fopen(path, "wb");
    bool ok = f && fwrite(buf, 1, len, f) == len;
    if (f && fclose(f) != 0)
        ok = false;
    KT_CHECK(ok, "cannot write %s: %s", path, strerror(errno));
}

/* Parses buf from memory and from a file; checks the verdict and message. */
static void check_input(const char *label, const uint8_t *src, size_t len, enum verdict want, const char *expect)
{
    uint8_t *buf = malloc(len ? len : 1); /* exact size: any overread is past the heap block */
    memcpy(buf, src, len);
    struct kt_gguf *g = NULL;
    kt_err err = {.msg = ""};
    kt_status s = kt_gguf_open_memory(buf, len, &g, &err);
    g_corpus.n_inputs++;
    if (want == MUST_REJECT) {
        g_corpus.n_rejected += s != KT_OK;
        KT_CHECK(s == KT_ERR_FORMAT && g == NULL, "%s: accepted or wrong status %d (%s)", label, (int)s, err.msg);
        KT_CHECK(err.msg[0] != '\0', "%s: empty message", label);
        if (expect)
            KT_CHECK(strstr(err.msg, expect) != NULL, "%s: message lacks '%s': %s", label, expect, err.msg);
    } else if (want == MUST_ACCEPT) {
        KT_CHECK(s == KT_OK, "%s: rejected: %s", label, err.msg);
    } else {
        g_corpus.n_reinterpretable++;
        g_corpus.n_reinterpretable_accepted += s == KT_OK;
        KT_CHECK(s == KT_OK || (s == KT_ERR_FORMAT && err.msg[0]), "%s: status %d (%s)", label, (int)s, err.msg);
    }
    if (g)
        walk_accepted(g, label);

    /* the same bytes from a file: same verdict, same message after the path */
    char path[1200];
    write_corpus_file(label, buf, len, path, sizeof path);
    struct kt_gguf *gf = NULL;
    kt_err ferr = {.msg = ""};
    kt_status fs = kt_gguf_open(path, &gf, &ferr);
    size_t plen = strlen(path);
    KT_CHECK(fs == s, "%s: file status %d, memory status %d (%s)", label, (int)fs, (int)s, ferr.msg);
    if (s != KT_OK && fs == s)
        KT_CHECK(strncmp(ferr.msg, path, plen) == 0 && strcmp(ferr.msg + plen + 2, err.msg) == 0,
                 "%s: file message '%s' vs memory message '%s'", label, ferr.msg, err.msg);
    if (g && gf)
        KT_CHECK(gf->n_kv == g->n_kv && gf->n_tensors == g->n_tensors && gf->data_offset == g->data_offset,
                 "%s: file and memory parses differ", label);
    kt_gguf_close(gf);
    kt_gguf_close(g);
    free(buf);
}

/* The base file with `width` bytes at pos replaced by the little-endian value. */
static void check_patch(const char *label, uint64_t pos, int width, uint64_t value, enum verdict want,
                        const char *expect)
{
    uint8_t *buf = malloc(g_base_bytes);
    memcpy(buf, g_base, g_base_bytes);
    if (width == 8)
        put_u64(buf + pos, value);
    else if (width == 4)
        put_u32(buf + pos, (uint32_t)value);
    else
        buf[pos] = (uint8_t)value;
    check_input(label, buf, g_base_bytes, want, expect);
    free(buf);
}

/* ---- cases ---------------------------------------------------------------------- */

static void gguf_base_file_is_valid(void)
{
    check_input("valid-base", g_base, g_base_bytes, MUST_ACCEPT, NULL);
}

static void gguf_every_truncation_is_rejected(void)
{
    char label[64];
    for (uint64_t cut = 0; cut < g_required; cut++) {
        snprintf(label, sizeof label, "truncated-at-%" PRIu64, cut);
        check_input(label, g_base, (size_t)cut, MUST_REJECT, NULL);
    }
}

static void gguf_bad_magic_and_versions_are_rejected(void)
{
    char label[64];
    for (int i = 0; i < 4; i++) {
        snprintf(label, sizeof label, "magic-byte-%d", i);
        check_patch(label, (uint64_t)i, 1, g_base[i] ^ 0x20, MUST_REJECT, "not a GGUF file");
    }
    check_patch("version-0", 4, 4, 0, MUST_REJECT, "unsupported GGUF version 0");
    check_patch("version-1", 4, 4, 1, MUST_REJECT, "version 1 is not supported");
    check_patch("version-4", 4, 4, 4, MUST_REJECT, "unsupported GGUF version 4");
    check_patch("version-max", 4, 4, UINT32_MAX, MUST_REJECT, "unsupported GGUF version");
    check_patch("version-3-byte-swapped", 4, 4, 0x03000000, MUST_REJECT, "big-endian");
    check_patch("version-2-byte-swapped", 4, 4, 0x02000000, MUST_REJECT, "big-endian");
    check_patch("version-65536", 4, 4, 0x00010000, MUST_REJECT, "unsupported GGUF version");
}

static const uint64_t k_hostile_counts[] = {UINT64_MAX, 1ull << 40, 1ull << 63, (1ull << 63) - 1, 1ull << 61};

static void gguf_hostile_header_counts_are_rejected(void)
{
    char label[64];
    for (size_t i = 0; i < sizeof k_hostile_counts / sizeof k_hostile_counts[0]; i++) {
        snprintf(label, sizeof label, "n_tensors-%" PRIx64, k_hostile_counts[i]);
        check_patch(label, 8, 8, k_hostile_counts[i], MUST_REJECT, "cannot fit");
        snprintf(label, sizeof label, "n_kv-%" PRIx64, k_hostile_counts[i]);
        check_patch(label, 16, 8, k_hostile_counts[i], MUST_REJECT, "cannot fit");
    }
    /* just past the bound by the smallest records (13-byte kv, 32-byte tensor
     * info): refused up front, before anything is allocated for them */
    uint64_t left = g_base_bytes - 24;
    check_patch("n_kv-just-past-bound", 16, 8, (left - 4 * 32) / 13 + 1, MUST_REJECT, "cannot fit");
    check_patch("n_tensors-just-past-bound", 8, 8, (left - 9 * 13) / 32 + 1, MUST_REJECT, "cannot fit");
    /* one more tensor info than written: the parser lands in zero padding */
    check_patch("n_tensors-plus-1", 8, 8, g_n_tensors + 1, MUST_REJECT, "n_dims is 0");
    /* smaller counts can leave another well-formed file */
    check_patch("n_tensors-0", 8, 8, 0, MAY_ACCEPT, NULL);
    check_patch("n_tensors-minus-1", 8, 8, g_n_tensors - 1, MAY_ACCEPT, NULL);
    check_patch("n_kv-0", 16, 8, 0, MAY_ACCEPT, NULL);
    check_patch("n_kv-minus-1", 16, 8, g_n_kvs - 1, MAY_ACCEPT, NULL);
    check_patch("n_kv-plus-1", 16, 8, g_n_kvs + 1, MAY_ACCEPT, NULL);
}

static void gguf_hostile_metadata_fields_are_rejected(void)
{
    char label[96];
    for (size_t i = 0; i < g_n_kvs; i++) {
        const struct kv_field *f = &g_kvs[i];
        uint64_t left_after_len = g_base_bytes - f->record - 8;
        const uint64_t lens[] = {UINT64_MAX, 1ull << 40, 1ull << 63, left_after_len + 1};
        for (size_t j = 0; j < sizeof lens / sizeof lens[0]; j++) {
            snprintf(label, sizeof label, "kv%zu-key-length-%" PRIx64, i, lens[j]);
            check_patch(label, f->record, 8, lens[j], MUST_REJECT, "key at byte");
        }
        const uint32_t types[] = {13, 100, INT32_MAX, UINT32_MAX};
        for (size_t j = 0; j < sizeof types / sizeof types[0]; j++) {
            snprintf(label, sizeof label, "kv%zu-type-%" PRIu32, i, types[j]);
            check_patch(label, f->type, 4, types[j], MUST_REJECT, "unknown value type");
        }
        snprintf(label, sizeof label, "kv%zu-key-nul", i);
        check_patch(label, f->record + 8 + 2, 1, 0, MUST_REJECT, "NUL");

        uint64_t left_after_value_len = g_base_bytes - f->value - 8;
        if (f->value_type == KT_GGUF_STRING) {
            const uint64_t slens[] = {UINT64_MAX, 1ull << 40, left_after_value_len + 1};
            for (size_t j = 0; j < sizeof slens / sizeof slens[0]; j++) {
                snprintf(label, sizeof label, "kv%zu-string-length-%" PRIx64, i, slens[j]);
                check_patch(label, f->value, 8, slens[j], MUST_REJECT, "string at byte");
            }
        }
        if (f->value_type == KT_GGUF_ARRAY) {
            const uint32_t elem_types[] = {13, UINT32_MAX};
            for (size_t j = 0; j < sizeof elem_types / sizeof elem_types[0]; j++) {
                snprintf(label, sizeof label, "kv%zu-array-elem-type-%" PRIu32, i, elem_types[j]);
                check_patch(label, f->value, 4, elem_types[j], MUST_REJECT, "unknown element type");
            }
            uint64_t left = g_base_bytes - f->value - 12;
            uint32_t elem = get_u32(g_base + f->value);
            size_t size = kt_gguf_type_size((enum kt_gguf_type)elem);
            /* 2^62 x 4 bytes wraps to 0 in 64 bits: the bound must be a division */
            const uint64_t counts[] = {UINT64_MAX, 1ull << 62, 1ull << 61, 1ull << 40,
                                       left / (size ? size : 8) + 1};
            for (size_t j = 0; j < sizeof counts / sizeof counts[0]; j++) {
                snprintf(label, sizeof label, "kv%zu-array-count-%" PRIx64, i, counts[j]);
                check_patch(label, f->value + 4, 8, counts[j], MUST_REJECT, "array at byte");
            }
            if (elem == KT_GGUF_STRING) {
                snprintf(label, sizeof label, "kv%zu-array-item-length-max", i);
                check_patch(label, f->value + 12, 8, UINT64_MAX, MUST_REJECT, "string at byte");
            }
            if (elem == KT_GGUF_ARRAY) {
                snprintf(label, sizeof label, "kv%zu-inner-array-count-max", i);
                check_patch(label, f->value + 12 + 4, 8, UINT64_MAX, MUST_REJECT, "array at byte");
                snprintf(label, sizeof label, "kv%zu-inner-array-type-13", i);
                check_patch(label, f->value + 12, 4, 13, MUST_REJECT, "unknown element type");
            }
        }
    }
}

static void gguf_duplicate_keys_and_names_are_rejected(void)
{
    /* kt.test.aaa and kt.test.bbb have the same length: copy one over the other */
    const struct kv_field *a = NULL, *b = NULL;
    for (size_t i = 0; i < g_n_kvs; i++) {
        if (strcmp(g_kvs[i].key, "kt.test.aaa") == 0)
            a = &g_kvs[i];
        if (strcmp(g_kvs[i].key, "kt.test.bbb") == 0)
            b = &g_kvs[i];
    }
    KT_CHECK(a && b, "base keys");
    if (a && b) {
        uint8_t *buf = malloc(g_base_bytes);
        memcpy(buf, g_base, g_base_bytes);
        memcpy(buf + b->record + 8, "kt.test.aaa", 11);
        check_input("duplicate-key", buf, g_base_bytes, MUST_REJECT, "duplicate key");
        free(buf);
    }
    char label[64];
    for (size_t j = 1; j < g_n_tensors; j++) {
        uint8_t *buf = malloc(g_base_bytes);
        memcpy(buf, g_base, g_base_bytes);
        memcpy(buf + g_tensors[j].record + 8, "blk.0.a", 7);
        snprintf(label, sizeof label, "duplicate-tensor-name-%zu", j);
        check_input(label, buf, g_base_bytes, MUST_REJECT, "duplicate tensor name");
        free(buf);
    }
}

static void gguf_bad_alignment_is_rejected(void)
{
    const struct kv_field *f = &g_kvs[0];
    KT_CHECK(strcmp(f->key, "general.alignment") == 0, "alignment is the first key");
    const uint32_t values[] = {0, 3, 48, 96, UINT32_MAX, 0x80000001u};
    char label[64];
    for (size_t i = 0; i < sizeof values / sizeof values[0]; i++) {
        snprintf(label, sizeof label, "alignment-%" PRIu32, values[i]);
        check_patch(label, f->value, 4, values[i], MUST_REJECT, "not a power of two");
    }
    check_patch("alignment-as-int32", f->type, 4, KT_GGUF_INT32, MUST_REJECT, "must be uint32");
    check_patch("alignment-as-float32", f->type, 4, KT_GGUF_FLOAT32, MUST_REJECT, "must be uint32");
    /* offsets 320 is not a multiple of 128 */
    check_patch("alignment-128", f->value, 4, 128, MUST_REJECT, "not a multiple of the alignment 128");
    check_patch("alignment-2p31", f->value, 4, 0x80000000u, MUST_REJECT, "not a multiple of the alignment");
    /* smaller alignments move the data section: may or may not stay valid */
    check_patch("alignment-1", f->value, 4, 1, MAY_ACCEPT, NULL);
    check_patch("alignment-32", f->value, 4, 32, MAY_ACCEPT, NULL);
}

static void gguf_hostile_tensor_infos_are_rejected(void)
{
    char label[96];
    for (size_t j = 0; j < g_n_tensors; j++) {
        const struct tensor_field *f = &g_tensors[j];
        const char *n = f->name;
        const uint64_t lens[] = {64, 65, UINT64_MAX, 1ull << 40, 1ull << 63};
        for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++) {
            snprintf(label, sizeof label, "%s-name-length-%" PRIx64, n, lens[i]);
            check_patch(label, f->record, 8, lens[i], MUST_REJECT, lens[i] < 100 ? "must be shorter" : "tensor name");
        }
        snprintf(label, sizeof label, "%s-name-nul", n);
        check_patch(label, f->record + 8 + 3, 1, 0, MUST_REJECT, "NUL");

        const uint32_t dims[] = {0, 5, UINT32_MAX, 0x80000000u};
        for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++) {
            snprintf(label, sizeof label, "%s-n_dims-%" PRIu32, n, dims[i]);
            check_patch(label, f->n_dims, 4, dims[i], MUST_REJECT, "n_dims");
        }
        for (uint32_t d = 0; d < f->dims; d++) {
            int64_t ne = (int64_t)get_u64(g_base + f->ne[d]);
            const int64_t negative[] = {-1, INT64_MIN, -ne};
            for (size_t i = 0; i < sizeof negative / sizeof negative[0]; i++) {
                snprintf(label, sizeof label, "%s-ne%" PRIu32 "-%" PRId64, n, d, negative[i]);
                check_patch(label, f->ne[d], 8, (uint64_t)negative[i], MUST_REJECT, "negative");
            }
            /* big, but a whole number of blocks */
            const int64_t big[] = {INT64_MAX / 256 * 256, 1ll << 40, ne * 4};
            for (size_t i = 0; i < sizeof big / sizeof big[0]; i++) {
                snprintf(label, sizeof label, "%s-ne%" PRIu32 "-%" PRId64, n, d, big[i]);
                check_patch(label, f->ne[d], 8, (uint64_t)big[i], MUST_REJECT, NULL);
            }
            snprintf(label, sizeof label, "%s-ne%" PRIu32 "-0", n, d);
            check_patch(label, f->ne[d], 8, 0, MAY_ACCEPT, NULL); /* an empty tensor is legal */
        }
        if (f->dims >= 2) {
            /* 2^32 x 2^32 elements: the product overflows 63 bits */
            uint8_t *buf = malloc(g_base_bytes);
            memcpy(buf, g_base, g_base_bytes);
            put_u64(buf + f->ne[0], 1ull << 32);
            put_u64(buf + f->ne[1], 1ull << 32);
            snprintf(label, sizeof label, "%s-ne-product-overflow", n);
            check_input(label, buf, g_base_bytes, MUST_REJECT, "2^63 elements");
            free(buf);
        }
        const uint32_t types[] = {4, 5, 31, 40, 41, 1000, INT32_MAX, UINT32_MAX}; /* 40: kt's FP8_B128, not GGUF's */
        for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
            snprintf(label, sizeof label, "%s-type-%" PRIu32, n, types[i]);
            check_patch(label, f->type, 4, types[i], MUST_REJECT, "unknown tensor type");
        }
        uint64_t offset = get_u64(g_base + f->offset);
        const uint64_t misaligned[] = {offset + 1, offset + 32, offset + 63};
        for (size_t i = 0; i < sizeof misaligned / sizeof misaligned[0]; i++) {
            snprintf(label, sizeof label, "%s-offset-%" PRIu64, n, misaligned[i]);
            check_patch(label, f->offset, 8, misaligned[i], MUST_REJECT, "not a multiple of the alignment 64");
        }
        const uint64_t past_end[] = {UINT64_MAX & ~63ull, 1ull << 62, (g_base_bytes + 63) & ~63ull};
        for (size_t i = 0; i < sizeof past_end / sizeof past_end[0]; i++) {
            snprintf(label, sizeof label, "%s-offset-%" PRIx64, n, past_end[i]);
            check_patch(label, f->offset, 8, past_end[i], MUST_REJECT, n);
        }
    }
    /* a quantized type whose block does not divide ne[0] = 8 */
    check_patch("blk.0.a-type-q8_0", g_tensors[0].type, 4, KT_TYPE_Q8_0, MUST_REJECT, "block size");
    /* f16 -> f32 doubles the last tensor: past the end of the file */
    check_patch("blk.0.d-type-f32", g_tensors[3].type, 4, KT_TYPE_F32, MUST_REJECT, "extends past end of file");
    check_patch("blk.0.a-type-f16", g_tensors[0].type, 4, KT_TYPE_F16, MAY_ACCEPT, NULL);
}

static void gguf_overlapping_tensors_are_rejected(void)
{
    char label[96];
    for (size_t j = 1; j < g_n_tensors; j++) {
        uint64_t prev = get_u64(g_base + g_tensors[j - 1].offset);
        snprintf(label, sizeof label, "%s-offset-equals-previous", g_tensors[j].name);
        check_patch(label, g_tensors[j].offset, 8, prev, MUST_REJECT, "overlaps");
        snprintf(label, sizeof label, "%s-offset-inside-previous", g_tensors[j].name);
        check_patch(label, g_tensors[j].offset, 8, prev + 64, MUST_REJECT, "overlaps");
    }
    /* the last tensor moved onto the first one */
    uint64_t first = get_u64(g_base + g_tensors[0].offset);
    check_patch("blk.0.d-offset-equals-first", g_tensors[g_n_tensors - 1].offset, 8, first, MUST_REJECT, "overlaps");
    /* the second tensor grown into the third */
    check_patch("blk.0.b-ne1-grown", g_tensors[1].ne[1], 8, 4, MUST_REJECT, "overlaps");
}

/* Hand-built files whose single key holds arrays nested `levels` deep. */
static void check_nested(const char *label, int levels, enum verdict want)
{
    size_t len = 24 + 8 + 4 + 4 + (size_t)levels * 12 + 8;
    uint8_t *buf = calloc(1, len);
    memcpy(buf, "GGUF", 4);
    put_u32(buf + 4, 3);
    put_u64(buf + 8, 0);
    put_u64(buf + 16, 1);
    put_u64(buf + 24, 4);
    memcpy(buf + 32, "bomb", 4);
    put_u32(buf + 36, KT_GGUF_ARRAY);
    size_t p = 40;
    for (int l = 0; l < levels; l++) {
        put_u32(buf + p, l + 1 < levels ? KT_GGUF_ARRAY : KT_GGUF_UINT8);
        put_u64(buf + p + 4, l + 1 < levels ? 1 : 0);
        p += 12;
    }
    /* 8 spare bytes at the end keep a trailing count from reading past the end */
    check_input(label, buf, len, want, want == MUST_REJECT ? "nested" : NULL);
    free(buf);
}

static void gguf_nested_array_bombs_are_rejected(void)
{
    check_nested("nested-at-limit", KT_GGUF_MAX_DEPTH, MUST_ACCEPT);
    check_nested("nested-one-past-limit", KT_GGUF_MAX_DEPTH + 1, MUST_REJECT);
    check_nested("nested-100000", 100000, MUST_REJECT);
}

static void gguf_tiny_and_empty_inputs_are_rejected(void)
{
    check_input("empty", (const uint8_t *)"", 0, MUST_REJECT, "too short");
    check_input("three-bytes", (const uint8_t *)"GGU", 3, MUST_REJECT, "too short");
    check_input("magic-only", (const uint8_t *)"GGUF", 4, MUST_REJECT, "version");
    uint8_t zeros[64] = {0};
    check_input("zeros", zeros, sizeof zeros, MUST_REJECT, "not a GGUF file");
}

/* ---- corpus directory ---------------------------------------------------------- */

static bool prepare_corpus_dir(void)
{
    const char *tmp = getenv("KT_TEST_TMP");
    char parent[900];
    snprintf(parent, sizeof parent, "%s/corpus", tmp && *tmp ? tmp : "/tmp");
    snprintf(g_corpus.dir, sizeof g_corpus.dir, "%s/gguf", parent);
    if ((mkdir(parent, 0755) != 0 && errno != EEXIST) || (mkdir(g_corpus.dir, 0755) != 0 && errno != EEXIST)) {
        KT_CHECK(0, "mkdir %s: %s", g_corpus.dir, strerror(errno));
        return false;
    }
    /* stale inputs of an older corpus would only confuse the replay */
    DIR *d = opendir(g_corpus.dir);
    struct dirent *e;
    char path[1400];
    while (d && (e = readdir(d))) {
        size_t n = strlen(e->d_name);
        if (n > 5 && strcmp(e->d_name + n - 5, ".gguf") == 0) {
            snprintf(path, sizeof path, "%s/%s", g_corpus.dir, e->d_name);
            unlink(path);
        }
    }
    if (d)
        closedir(d);
    return true;
}

int main(void)
{
    if (!prepare_corpus_dir() || !build_base())
        return kt_test_finish();
    KT_RUN(gguf_base_file_is_valid);
    KT_RUN(gguf_every_truncation_is_rejected);
    KT_RUN(gguf_bad_magic_and_versions_are_rejected);
    KT_RUN(gguf_hostile_header_counts_are_rejected);
    KT_RUN(gguf_hostile_metadata_fields_are_rejected);
    KT_RUN(gguf_duplicate_keys_and_names_are_rejected);
    KT_RUN(gguf_bad_alignment_is_rejected);
    KT_RUN(gguf_hostile_tensor_infos_are_rejected);
    KT_RUN(gguf_overlapping_tensors_are_rejected);
    KT_RUN(gguf_nested_array_bombs_are_rejected);
    KT_RUN(gguf_tiny_and_empty_inputs_are_rejected);
    printf("corpus: %d inputs in %s; %d must-reject rejected, %d reinterpretable (%d of them accepted)\n",
           g_corpus.n_inputs, g_corpus.dir, g_corpus.n_rejected, g_corpus.n_reinterpretable,
           g_corpus.n_reinterpretable_accepted);
    free(g_base);
    return kt_test_finish();
}
