/*
 * test_safetensors.c - safetensors shards and checkpoint directories read
 * back exactly as written, and a directory whose index and shards disagree
 * (a missing or truncated shard, a tensor listed but absent, a tensor in two
 * shards, a shard name outside the directory) is refused with a message
 * naming the file and the tensor.
 *
 * Shards are built here by hand, header text and all, so the test states the
 * format rather than trusting a writer.  Malformed single shards are
 * test_safetensors_corrupt's.
 */
#include "hf_formats.h"
#include "safetensors.h"
#include "testlib.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- building shards ------------------------------------------------------------------ */

/* u64 header length | header | data, malloc'd. */
static uint8_t *shard_bytes(const char *header, const uint8_t *data, size_t data_bytes, size_t *len)
{
    const uint64_t n = strlen(header);
    *len = 8 + n + data_bytes;
    uint8_t *buf = kt_test_xmalloc(*len);
    memcpy(buf, &n, 8);
    memcpy(buf + 8, header, n);
    if (data_bytes)
        memcpy(buf + 8 + n, data, data_bytes);
    return buf;
}

static bool write_bytes(const char *path, const void *bytes, size_t len)
{
    FILE *f = fopen(path, "wb");
    bool ok = f && fwrite(bytes, 1, len, f) == len;
    if (f && fclose(f) != 0)
        ok = false;
    KT_CHECK(ok, "cannot write %s: %s", path, strerror(errno));
    return ok;
}

static void write_shard(const char *path, const char *header, const uint8_t *data, size_t data_bytes)
{
    size_t len;
    uint8_t *buf = shard_bytes(header, data, data_bytes, &len);
    write_bytes(path, buf, len);
    free(buf);
}

static void write_text(const char *dir, const char *file, const char *text)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    write_bytes(path, text, strlen(text));
}

/* A fresh, empty scratch directory. */
static const char *make_dir(const char *name)
{
    static char dirs[16][512];
    static int next;
    char *d = dirs[next++ % 16];
    snprintf(d, 512, "%s", kt_test_path(name));
    kt_test_system("rm -rf '%s'", d);
    KT_CHECK(mkdir(d, 0755) == 0, "mkdir %s: %s", d, strerror(errno));
    return d;
}

static void fill(uint8_t *p, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (uint8_t)(i * 131 + seed * 17 + 7);
}

/* ---- one shard ------------------------------------------------------------------------------ */

struct want {
    const char *name;
    enum kt_st_dtype dtype;
    uint32_t rank;
    uint64_t shape[3];
    uint64_t begin, end;
};

/* Listed out of offset order on purpose; offsets tile [0, 185). */
static const struct want k_tensors[] = {
    {"layers.0.experts.0.w1.weight_scale", KT_ST_BF16, 2, {4, 3}, 144, 168},
    {"layers.0.experts.0.w1.weight_packed", KT_ST_I32, 2, {4, 9}, 0, 144},
    {"layers.0.experts.0.w1.weight_shape", KT_ST_I64, 1, {2}, 168, 184},
    {"scalar", KT_ST_F32, 0, {0}, 184, 184 + 4},
    {"empty", KT_ST_BF16, 2, {0, 4}, 188, 188},
    {"fp8", KT_ST_F8_E4M3, 2, {3, 5}, 188, 203},
    {"fp4", KT_ST_F4, 2, {2, 3}, 203, 206},
    {"e8m0", KT_ST_F8_E8M0, 1, {3}, 206, 209},
    {"i8", KT_ST_I8, 1, {2}, 209, 211},
    {"f16", KT_ST_F16, 1, {1}, 211, 213},
};
#define N_TENSORS (sizeof k_tensors / sizeof k_tensors[0])
#define DATA_BYTES 213

static const char *k_header =
    "{\"__metadata__\": {\"format\": \"pt\"},"
    "\"layers.0.experts.0.w1.weight_scale\": {\"dtype\": \"BF16\", \"shape\": [4, 3], \"data_offsets\": [144, 168]},"
    "\"layers.0.experts.0.w1.weight_packed\": {\"dtype\": \"I32\", \"shape\": [4, 9], \"data_offsets\": [0, 144]},"
    "\"layers.0.experts.0.w1.weight_shape\": {\"dtype\": \"I64\", \"shape\": [2], \"data_offsets\": [168, 184]},"
    "\"scalar\": {\"dtype\": \"F32\", \"shape\": [], \"data_offsets\": [184, 188]},"
    "\"empty\": {\"dtype\": \"BF16\", \"shape\": [0, 4], \"data_offsets\": [188, 188]},"
    "\"fp8\": {\"dtype\": \"F8_E4M3\", \"shape\": [3, 5], \"data_offsets\": [188, 203]},"
    "\"fp4\": {\"dtype\": \"F4\", \"shape\": [2, 3], \"data_offsets\": [203, 206]},"
    "\"e8m0\": {\"dtype\": \"F8_E8M0\", \"shape\": [3], \"data_offsets\": [206, 209]},"
    "\"i8\": {\"dtype\": \"I8\", \"shape\": [2], \"data_offsets\": [209, 211]},"
    "\"f16\": {\"dtype\": \"F16\", \"shape\": [1], \"data_offsets\": [211, 213]}}";

static void check_tensors(const struct kt_st_dir *dir, const uint8_t *data, const char *label)
{
    KT_CHECK(dir->n_tensors == N_TENSORS, "%s: %llu tensors", label, (unsigned long long)dir->n_tensors);
    const uint64_t header_bytes = strlen(k_header);
    for (size_t i = 0; i < N_TENSORS; i++) {
        const struct want *w = &k_tensors[i];
        const struct kt_st_tensor *t = kt_st_find(dir, w->name);
        KT_CHECK(t != NULL, "%s: '%s' not found", label, w->name);
        if (!t)
            continue;
        uint64_t numel = 1;
        for (uint32_t d = 0; d < w->rank; d++)
            numel *= w->shape[d];
        KT_CHECK(strcmp(t->name, w->name) == 0 && t->dtype == w->dtype && t->rank == w->rank && t->numel == numel,
                 "%s: '%s' dtype %s rank %u numel %llu", label, w->name, kt_st_dtype_name(t->dtype), t->rank,
                 (unsigned long long)t->numel);
        for (uint32_t d = 0; d < w->rank; d++)
            KT_CHECK(t->shape[d] == w->shape[d], "%s: '%s' shape[%u]", label, w->name, d);
        KT_CHECK(t->bytes == w->end - w->begin && t->file_offset == 8 + header_bytes + w->begin,
                 "%s: '%s' bytes %llu offset %llu", label, w->name, (unsigned long long)t->bytes,
                 (unsigned long long)t->file_offset);
        KT_CHECK(t->bytes == 0 || memcmp(t->data, data + w->begin, t->bytes) == 0, "%s: '%s' data differs", label,
                 w->name);
        const struct kt_st_shard *sh = &dir->shards[t->shard];
        KT_CHECK((const uint8_t *)t->data == sh->base + t->file_offset && sh->data_offset == 8 + header_bytes,
                 "%s: '%s' data pointer", label, w->name);
    }
    KT_CHECK(kt_st_find(dir, "absent") == NULL && kt_st_find(dir, "__metadata__") == NULL &&
             kt_st_find(dir, "") == NULL, "%s: absent names are not found", label);
}

static void safetensors_shard_reads_back_every_tensor(void)
{
    uint8_t data[DATA_BYTES];
    fill(data, sizeof data, 1);
    const char *path = kt_test_path("st_one.safetensors");
    write_shard(path, k_header, data, sizeof data);
    struct kt_st_dir *dir = NULL;
    kt_err err = {0};
    KT_CHECK(kt_st_open_file(path, &dir, &err) == KT_OK, "open: %s", err.msg);
    if (dir) {
        KT_CHECK(dir->n_shards == 1 && strcmp(dir->shards[0].path, path) == 0, "one shard, named by its path");
        check_tensors(dir, data, "file");
    }
    kt_st_close(dir);

    size_t len;
    uint8_t *buf = shard_bytes(k_header, data, sizeof data, &len);
    dir = NULL;
    KT_CHECK(kt_st_open_memory(buf, len, "mem", &dir, &err) == KT_OK, "open_memory: %s", err.msg);
    if (dir)
        check_tensors(dir, data, "memory");
    kt_st_close(dir);
    free(buf);
    unlink(path);
}

static void safetensors_header_padded_with_spaces_is_accepted(void)
{
    /* the reference writer pads the header with spaces to a multiple of 8 */
    char header[256];
    snprintf(header, sizeof header, "%s", "{\"x\": {\"dtype\": \"U8\", \"shape\": [3], \"data_offsets\": [0, 3]}}   ");
    const uint8_t data[3] = {1, 2, 3};
    size_t len;
    uint8_t *buf = shard_bytes(header, data, 3, &len);
    struct kt_st_dir *dir = NULL;
    kt_err err = {0};
    KT_CHECK(kt_st_open_memory(buf, len, NULL, &dir, &err) == KT_OK, "padded header: %s", err.msg);
    const struct kt_st_tensor *t = kt_st_find(dir, "x");
    KT_CHECK(t && t->bytes == 3 && memcmp(t->data, data, 3) == 0, "x reads back");
    kt_st_close(dir);
    free(buf);
}

static void safetensors_empty_shard_is_valid(void)
{
    size_t len;
    uint8_t *buf = shard_bytes("{}", NULL, 0, &len);
    struct kt_st_dir *dir = NULL;
    kt_err err = {0};
    KT_CHECK(kt_st_open_memory(buf, len, NULL, &dir, &err) == KT_OK && dir && dir->n_tensors == 0,
             "a shard with no tensors: %s", err.msg);
    KT_CHECK(kt_st_find(dir, "x") == NULL, "nothing found in an empty shard");
    kt_st_close(dir);
    free(buf);
}

/* ---- directories ------------------------------------------------------------------------------ */

/* Two shards: a.weight + a.weight_scale_inv in the first, b.weight in the second. */
static void write_two_shards(const char *dir)
{
    char path[1024];
    uint8_t d1[15 + 4], d2[8];
    fill(d1, sizeof d1, 2);
    fill(d2, sizeof d2, 3);
    snprintf(path, sizeof path, "%s/model-00001-of-00002.safetensors", dir);
    write_shard(path,
                "{\"a.weight\": {\"dtype\": \"F8_E4M3\", \"shape\": [3, 5], \"data_offsets\": [0, 15]},"
                " \"a.weight_scale_inv\": {\"dtype\": \"F32\", \"shape\": [1, 1], \"data_offsets\": [15, 19]}}",
                d1, sizeof d1);
    snprintf(path, sizeof path, "%s/model-00002-of-00002.safetensors", dir);
    write_shard(path, "{\"b.weight\": {\"dtype\": \"BF16\", \"shape\": [2, 2], \"data_offsets\": [0, 8]}}", d2,
                sizeof d2);
}

static const char *k_index =
    "{\"metadata\": {\"total_size\": 27}, \"weight_map\": {"
    "\"a.weight\": \"model-00001-of-00002.safetensors\","
    "\"a.weight_scale_inv\": \"model-00001-of-00002.safetensors\","
    "\"b.weight\": \"model-00002-of-00002.safetensors\"}}";

static void safetensors_dir_with_index_opens_every_shard(void)
{
    const char *d = make_dir("st_dir_index");
    write_two_shards(d);
    write_text(d, KT_ST_INDEX_FILE, k_index);
    struct kt_st_dir *dir = NULL;
    kt_err err = {0};
    KT_CHECK(kt_st_open_dir(d, &dir, &err) == KT_OK, "open_dir: %s", err.msg);
    if (!dir)
        return;
    KT_CHECK(dir->n_shards == 2 && dir->n_tensors == 3, "%u shards, %llu tensors", dir->n_shards,
             (unsigned long long)dir->n_tensors);
    const struct kt_st_tensor *a = kt_st_find(dir, "a.weight"), *s = kt_st_find(dir, "a.weight_scale_inv"),
                              *b = kt_st_find(dir, "b.weight");
    KT_CHECK(a && s && b, "all three found");
    if (a && s && b) {
        KT_CHECK(strstr(dir->shards[a->shard].path, "model-00001-of-00002") && a->shard == s->shard,
                 "a.* in the first shard");
        KT_CHECK(strstr(dir->shards[b->shard].path, "model-00002-of-00002") && b->shard != a->shard,
                 "b.weight in the second");
        uint8_t d1[19];
        fill(d1, sizeof d1, 2);
        KT_CHECK(memcmp(a->data, d1, 15) == 0 && memcmp(s->data, d1 + 15, 4) == 0, "shard 1 data");
    }
    kt_st_close(dir);
}

static void safetensors_dir_with_single_file_opens_it(void)
{
    const char *d = make_dir("st_dir_single");
    uint8_t data[DATA_BYTES];
    fill(data, sizeof data, 1);
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", d, KT_ST_SINGLE_FILE);
    write_shard(path, k_header, data, sizeof data);
    struct kt_st_dir *dir = NULL;
    kt_err err = {0};
    KT_CHECK(kt_st_open_dir(d, &dir, &err) == KT_OK, "open_dir: %s", err.msg);
    if (dir)
        check_tensors(dir, data, "single-file dir");
    kt_st_close(dir);
}

static void safetensors_dir_without_either_file_is_not_found(void)
{
    const char *d = make_dir("st_dir_empty");
    struct kt_st_dir *dir = (struct kt_st_dir *)1;
    kt_err err = {0};
    KT_CHECK(kt_st_open_dir(d, &dir, &err) == KT_ERR_NOT_FOUND && dir == NULL, "status %d", (int)err.status);
    KT_CHECK(strstr(err.msg, KT_ST_INDEX_FILE) && strstr(err.msg, d), "message: %s", err.msg);
    KT_CHECK(kt_st_open_dir(kt_test_path("st_no_such_dir"), &dir, &err) == KT_ERR_IO, "a missing directory: %s",
             err.msg);
}

static void safetensors_expect_checks_dtype_and_shape(void)
{
    const char *d = make_dir("st_dir_expect");
    write_two_shards(d);
    write_text(d, KT_ST_INDEX_FILE, k_index);
    struct kt_st_dir *dir = NULL;
    kt_err err = {0};
    KT_CHECK(kt_st_open_dir(d, &dir, &err) == KT_OK, "open_dir: %s", err.msg);
    if (!dir)
        return;
    const struct kt_st_tensor *t = NULL;
    const uint64_t good[2] = {2, 2}, bad[2] = {2, 3};
    KT_CHECK(kt_st_expect(dir, "b.weight", KT_ST_BF16, 2, good, &t, &err) == KT_OK && t, "match: %s", err.msg);
    KT_CHECK(kt_st_expect(dir, "b.weight", KT_ST_BF16, 2, bad, &t, &err) == KT_ERR_FORMAT && !t, "shape mismatch");
    KT_CHECK(strstr(err.msg, "'b.weight' is BF16 [2, 2], expected BF16 [2, 3]") &&
             strstr(err.msg, "model-00002-of-00002.safetensors"), "message: %s", err.msg);
    KT_CHECK(kt_st_expect(dir, "b.weight", KT_ST_F32, 2, good, &t, &err) == KT_ERR_FORMAT &&
             strstr(err.msg, "expected F32 [2, 2]"), "dtype mismatch: %s", err.msg);
    KT_CHECK(kt_st_expect(dir, "c.weight", KT_ST_F32, 2, good, &t, &err) == KT_ERR_NOT_FOUND &&
             strstr(err.msg, "'c.weight'"), "absent: %s", err.msg);
    kt_st_close(dir);
}

/* A Kimi-K2-Thinking-style INT4 expert read through the reader and decoded. */
static void safetensors_int4_expert_decodes_through_the_reader(void)
{
    /* weight (4 x 72): q[r][c] = (r * 5 + c) % 16 - 8; scale per 32 columns: (r + 1) * 2^-(g+1) */
    uint8_t data[DATA_BYTES];
    fill(data, sizeof data, 1);
    uint32_t packed[4][9] = {{0}};
    uint16_t scale[4][3];
    for (int r = 0; r < 4; r++) {
        for (int c = 0; c < 72; c++)
            packed[r][c / 8] |= (uint32_t)((r * 5 + c) % 16) << (4 * (c % 8));
        for (int g = 0; g < 3; g++) {
            float f = ldexpf((float)(r + 1), -(g + 1));
            uint32_t u;
            memcpy(&u, &f, 4);
            scale[r][g] = (uint16_t)(u >> 16); /* exact: small integers times powers of two */
        }
    }
    const int64_t shape[2] = {4, 72};
    memcpy(data, packed, sizeof packed);
    memcpy(data + 144, scale, sizeof scale);
    memcpy(data + 168, shape, sizeof shape);
    size_t len;
    uint8_t *buf = shard_bytes(k_header, data, sizeof data, &len);
    struct kt_st_dir *dir = NULL;
    kt_err err = {0};
    KT_CHECK(kt_st_open_memory(buf, len, NULL, &dir, &err) == KT_OK, "open: %s", err.msg);
    const struct kt_st_tensor *w = NULL, *s = NULL, *sh = NULL;
    const uint64_t wshape[2] = {4, 9}, sshape[2] = {4, 3}, shshape[1] = {2};
    bool ok = dir && kt_st_expect(dir, "layers.0.experts.0.w1.weight_packed", KT_ST_I32, 2, wshape, &w, &err) == KT_OK &&
              kt_st_expect(dir, "layers.0.experts.0.w1.weight_scale", KT_ST_BF16, 2, sshape, &s, &err) == KT_OK &&
              kt_st_expect(dir, "layers.0.experts.0.w1.weight_shape", KT_ST_I64, 1, shshape, &sh, &err) == KT_OK;
    KT_CHECK(ok, "expert tensors: %s", err.msg);
    if (ok) {
        int64_t cols_rows[2];
        memcpy(cols_rows, sh->data, sizeof cols_rows);
        KT_CHECK(cols_rows[0] == 4 && cols_rows[1] == 72, "weight_shape");
        for (int r = 0; r < 4; r++) {
            float out[72];
            kt_int4_pack_row_to_f32(w->data, s->data, 72, 32, r, out);
            for (int c = 0; c < 72; c++) {
                float want = (float)((r * 5 + c) % 16 - 8) * ldexpf((float)(r + 1), -(c / 32 + 1));
                KT_CHECK(out[c] == want, "[%d][%d]: %g, want %g", r, c, out[c], want);
            }
        }
    }
    kt_st_close(dir);
    free(buf);
}

/* ---- directories that must be refused --------------------------------------------------------- */

/* Opens d, which must fail with status want and a message holding every string given. */
static void expect_dir_refused(const char *d, kt_status want, ...)
{
    struct kt_st_dir *dir = (struct kt_st_dir *)1;
    kt_err err = {.msg = ""};
    kt_status s = kt_st_open_dir(d, &dir, &err);
    KT_CHECK(s == want && dir == NULL, "%s: status %d, want %d (%s)", d, (int)s, (int)want, err.msg);
    va_list ap;
    va_start(ap, want);
    for (const char *part; (part = va_arg(ap, const char *)) != NULL;)
        KT_CHECK(strstr(err.msg, part) != NULL, "%s: message lacks '%s': %s", d, part, err.msg);
    va_end(ap);
}

static void safetensors_dir_missing_shard_is_refused(void)
{
    const char *d = make_dir("st_bad_missing");
    write_two_shards(d);
    char path[1024];
    snprintf(path, sizeof path, "%s/model-00002-of-00002.safetensors", d);
    unlink(path);
    write_text(d, KT_ST_INDEX_FILE, k_index);
    expect_dir_refused(d, KT_ERR_IO, "model-00002-of-00002.safetensors", "'b.weight'", "cannot open", NULL);
}

static void safetensors_dir_truncated_shard_is_refused(void)
{
    const char *d = make_dir("st_bad_truncated");
    write_two_shards(d);
    char path[1024];
    snprintf(path, sizeof path, "%s/model-00001-of-00002.safetensors", d);
    struct stat st;
    KT_CHECK(stat(path, &st) == 0 && truncate(path, st.st_size - 3) == 0, "truncate %s", path);
    write_text(d, KT_ST_INDEX_FILE, k_index);
    expect_dir_refused(d, KT_ERR_FORMAT, "model-00001-of-00002.safetensors", "'a.weight_scale_inv'",
                       "truncated shard", NULL);
}

static void safetensors_dir_tensor_listed_but_absent_is_refused(void)
{
    const char *d = make_dir("st_bad_absent");
    write_two_shards(d);
    write_text(d, KT_ST_INDEX_FILE,
               "{\"weight_map\": {\"a.weight\": \"model-00001-of-00002.safetensors\","
               "\"a.weight_scale_inv\": \"model-00001-of-00002.safetensors\","
               "\"b.weight\": \"model-00002-of-00002.safetensors\","
               "\"c.weight\": \"model-00002-of-00002.safetensors\"}}");
    expect_dir_refused(d, KT_ERR_FORMAT, "'c.weight'", "model-00002-of-00002.safetensors", "does not contain it",
                       NULL);
}

static void safetensors_dir_tensor_in_the_wrong_shard_is_refused(void)
{
    const char *d = make_dir("st_bad_wrong_shard");
    write_two_shards(d);
    write_text(d, KT_ST_INDEX_FILE,
               "{\"weight_map\": {\"a.weight\": \"model-00001-of-00002.safetensors\","
               "\"a.weight_scale_inv\": \"model-00002-of-00002.safetensors\","
               "\"b.weight\": \"model-00002-of-00002.safetensors\"}}");
    expect_dir_refused(d, KT_ERR_FORMAT, "'a.weight_scale_inv'", "does not contain it; it is in",
                       "model-00001-of-00002.safetensors", NULL);
}

static void safetensors_dir_tensor_in_two_shards_is_refused(void)
{
    const char *d = make_dir("st_bad_twice");
    write_two_shards(d);
    char path[1024];
    uint8_t d3[8] = {0};
    snprintf(path, sizeof path, "%s/extra.safetensors", d);
    write_shard(path, "{\"b.weight\": {\"dtype\": \"BF16\", \"shape\": [2, 2], \"data_offsets\": [0, 8]}}", d3, 8);
    write_text(d, KT_ST_INDEX_FILE,
               "{\"weight_map\": {\"a.weight\": \"model-00001-of-00002.safetensors\","
               "\"a.weight_scale_inv\": \"model-00001-of-00002.safetensors\","
               "\"b.weight\": \"model-00002-of-00002.safetensors\", \"x\": \"extra.safetensors\"}}");
    expect_dir_refused(d, KT_ERR_FORMAT, "'b.weight' is in both", "extra.safetensors", NULL);
}

static void safetensors_dir_index_naming_paths_outside_is_refused(void)
{
    const char *names[] = {"../model.safetensors", "/etc/passwd", "sub/x.safetensors", "..", ""};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        const char *d = make_dir("st_bad_path");
        write_two_shards(d);
        char index[512];
        snprintf(index, sizeof index, "{\"weight_map\": {\"a.weight\": \"%s\"}}", names[i]);
        write_text(d, KT_ST_INDEX_FILE, index);
        expect_dir_refused(d, KT_ERR_FORMAT, "'a.weight'", "not a file name", NULL);
    }
    const char *d = make_dir("st_bad_path_type");
    write_text(d, KT_ST_INDEX_FILE, "{\"weight_map\": {\"a.weight\": 7}}");
    expect_dir_refused(d, KT_ERR_FORMAT, "'a.weight' maps to a non-string", NULL);
}

static void safetensors_dir_bad_index_is_refused(void)
{
    const char *d = make_dir("st_bad_index_json");
    write_two_shards(d);
    write_text(d, KT_ST_INDEX_FILE, "{\"weight_map\": {\"a.weight\": ");
    expect_dir_refused(d, KT_ERR_FORMAT, KT_ST_INDEX_FILE, "not valid JSON", NULL);
    write_text(d, KT_ST_INDEX_FILE, "{\"metadata\": {}}");
    expect_dir_refused(d, KT_ERR_FORMAT, "no weight_map", NULL);
    write_text(d, KT_ST_INDEX_FILE, "{\"weight_map\": {}}");
    expect_dir_refused(d, KT_ERR_FORMAT, "weight_map is empty", NULL);
    write_text(d, KT_ST_INDEX_FILE,
               "{\"weight_map\": {\"a.weight\": \"model-00001-of-00002.safetensors\","
               " \"a.weight\": \"model-00002-of-00002.safetensors\"}}");
    expect_dir_refused(d, KT_ERR_FORMAT, "duplicate", NULL);
}

static void safetensors_dir_bad_shard_names_the_tensor_and_file(void)
{
    const char *d = make_dir("st_bad_shard_header");
    write_two_shards(d);
    char path[1024];
    snprintf(path, sizeof path, "%s/model-00002-of-00002.safetensors", d);
    write_shard(path, "{\"b.weight\": {\"dtype\": \"Q4_K\", \"shape\": [2, 2], \"data_offsets\": [0, 8]}}",
                (const uint8_t *)"01234567", 8);
    write_text(d, KT_ST_INDEX_FILE, k_index);
    expect_dir_refused(d, KT_ERR_FORMAT, "model-00002-of-00002.safetensors", "unknown dtype 'Q4_K'", "'b.weight'",
                       NULL);
}

int main(void)
{
    KT_RUN(safetensors_shard_reads_back_every_tensor);
    KT_RUN(safetensors_header_padded_with_spaces_is_accepted);
    KT_RUN(safetensors_empty_shard_is_valid);
    KT_RUN(safetensors_dir_with_index_opens_every_shard);
    KT_RUN(safetensors_dir_with_single_file_opens_it);
    KT_RUN(safetensors_dir_without_either_file_is_not_found);
    KT_RUN(safetensors_expect_checks_dtype_and_shape);
    KT_RUN(safetensors_int4_expert_decodes_through_the_reader);
    KT_RUN(safetensors_dir_missing_shard_is_refused);
    KT_RUN(safetensors_dir_truncated_shard_is_refused);
    KT_RUN(safetensors_dir_tensor_listed_but_absent_is_refused);
    KT_RUN(safetensors_dir_tensor_in_the_wrong_shard_is_refused);
    KT_RUN(safetensors_dir_tensor_in_two_shards_is_refused);
    KT_RUN(safetensors_dir_index_naming_paths_outside_is_refused);
    KT_RUN(safetensors_dir_bad_index_is_refused);
    KT_RUN(safetensors_dir_bad_shard_names_the_tensor_and_file);
    return kt_test_finish();
}
