/*
 * test_safetensors_corrupt.c - the safetensors reader refuses every malformed
 * shard, with a message, and never crashes or reads out of bounds.
 *
 * A valid small shard is built by hand, then broken deterministically: cut at
 * every byte, its header length set to hostile values, its JSON replaced by
 * non-JSON, non-objects and duplicate keys, each field of a tensor entry
 * (dtype, shape, data_offsets) made wrong in every way the format admits:
 * unknown dtypes, ranks past 8, negative and fractional dims, shapes whose
 * size overflows 64 bits, extents past the end, reversed, overlapping, with
 * gaps or slack, or of the wrong size for their dtype.  Each input is parsed
 * from an exactly-sized heap copy (so sanitizers see any overread) and from a
 * file, which must give the same verdict and message.  The inputs are also
 * written to $KT_TEST_TMP/corpus/safetensors for fuzz_safetensors_replay.
 * One-byte mutations of the valid shard may produce another valid one; those
 * must not crash and, if accepted, must be self-consistent.
 */
#include "safetensors.h"
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
    MAY_ACCEPT, /* a mutation that can leave another well-formed shard */
    MUST_ACCEPT,
};

static struct {
    char dir[1024];
    int n_inputs, n_rejected, n_mutations, n_mutations_accepted;
} g_corpus;

/* ---- building inputs ---------------------------------------------------------------- */

#define BASE_DATA_BYTES 27
static const char *k_base_header =
    "{\"__metadata__\": {\"format\": \"pt\"},"
    " \"w\": {\"dtype\": \"BF16\", \"shape\": [2, 4], \"data_offsets\": [0, 16]},"
    " \"s\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [16, 24]},"
    " \"q\": {\"dtype\": \"F8_E4M3\", \"shape\": [3], \"data_offsets\": [24, 27]}}";

/* u64 length | header | data_bytes of patterned data, malloc'd */
static uint8_t *shard_bytes(const char *header, size_t data_bytes, size_t *len)
{
    const uint64_t n = strlen(header);
    *len = 8 + n + data_bytes;
    uint8_t *buf = kt_test_xmalloc(*len);
    memcpy(buf, &n, 8);
    memcpy(buf + 8, header, n);
    for (size_t i = 0; i < data_bytes; i++)
        buf[8 + n + i] = (uint8_t)(i * 29 + 3);
    return buf;
}

/* ---- checking one input ------------------------------------------------------------- */

static void walk_accepted(const struct kt_st_dir *dir, const uint8_t *buf, size_t len, const char *label)
{
    const struct kt_st_shard *sh = &dir->shards[0];
    KT_CHECK(dir->n_shards == 1 && sh->base == buf && sh->file_bytes == len && sh->data_offset == 8 + sh->header_bytes,
             "%s: shard record", label);
    uint64_t total = 0;
    for (uint64_t i = 0; i < dir->n_tensors; i++) {
        const struct kt_st_tensor *t = &dir->tensors[i];
        const uint8_t *d = t->data;
        KT_CHECK(kt_st_find(dir, t->name) == t, "%s: '%s' not found by name", label, t->name);
        KT_CHECK(d >= buf + sh->data_offset && t->bytes <= len && (uint64_t)(d - buf) <= len - t->bytes,
                 "%s: '%s' data out of bounds", label, t->name);
        KT_CHECK(t->rank <= KT_ST_MAX_RANK && t->numel * kt_st_dtype_bits(t->dtype) == t->bytes * 8,
                 "%s: '%s' size invariants", label, t->name);
        unsigned sum = 0;
        for (uint64_t j = 0; j < t->bytes; j++)
            sum += d[j];
        (void)sum;
        total += t->bytes;
    }
    KT_CHECK(total == len - sh->data_offset, "%s: tensors tile the data section", label);
}

static void write_corpus_file(const char *label, const uint8_t *buf, size_t len, char *path, size_t path_size)
{
    snprintf(path, path_size, "%s/%04d-%s.safetensors", g_corpus.dir, g_corpus.n_inputs, label);
    FILE *f = fopen(path, "wb");
    bool ok = f && fwrite(buf, 1, len, f) == len;
    if (f && fclose(f) != 0)
        ok = false;
    KT_CHECK(ok, "cannot write %s: %s", path, strerror(errno));
}

static void check_input(const char *label, const uint8_t *src, size_t len, enum verdict want, const char *expect)
{
    uint8_t *buf = kt_test_xmalloc(len ? len : 1); /* exact size: an overread leaves the heap block */
    if (len)
        memcpy(buf, src, len);
    struct kt_st_dir *dir = NULL;
    kt_err err = {.msg = ""};
    kt_status s = kt_st_open_memory(buf, len, NULL, &dir, &err);
    g_corpus.n_inputs++;
    if (want == MUST_REJECT) {
        g_corpus.n_rejected += s != KT_OK;
        KT_CHECK(s == KT_ERR_FORMAT && dir == NULL, "%s: accepted or wrong status %d (%s)", label, (int)s, err.msg);
        KT_CHECK(err.msg[0] != '\0', "%s: empty message", label);
        if (expect)
            KT_CHECK(strstr(err.msg, expect) != NULL, "%s: message lacks '%s': %s", label, expect, err.msg);
    } else if (want == MUST_ACCEPT) {
        KT_CHECK(s == KT_OK, "%s: rejected: %s", label, err.msg);
    } else {
        g_corpus.n_mutations++;
        g_corpus.n_mutations_accepted += s == KT_OK;
        KT_CHECK(s == KT_OK || (s == KT_ERR_FORMAT && err.msg[0]), "%s: status %d (%s)", label, (int)s, err.msg);
    }
    if (dir)
        walk_accepted(dir, buf, len, label);

    /* the same bytes from a file: same verdict, same message after "path: " */
    char path[1200];
    write_corpus_file(label, buf, len, path, sizeof path);
    struct kt_st_dir *fdir = NULL;
    kt_err ferr = {.msg = ""};
    kt_status fs = kt_st_open_file(path, &fdir, &ferr);
    size_t plen = strlen(path);
    KT_CHECK(fs == s, "%s: file status %d, memory status %d (%s)", label, (int)fs, (int)s, ferr.msg);
    if (s != KT_OK && fs == s)
        KT_CHECK(strncmp(ferr.msg, path, plen) == 0 && strcmp(ferr.msg + plen + 2, err.msg) == 0,
                 "%s: file message '%s' vs memory message '%s'", label, ferr.msg, err.msg);
    if (dir && fdir)
        KT_CHECK(fdir->n_tensors == dir->n_tensors, "%s: file and memory parses differ", label);
    kt_st_close(fdir);
    kt_st_close(dir);
    free(buf);
}

/* A shard with this header and data_bytes of data. */
static void check_header(const char *label, const char *header, size_t data_bytes, enum verdict want,
                         const char *expect)
{
    size_t len;
    uint8_t *buf = shard_bytes(header, data_bytes, &len);
    check_input(label, buf, len, want, expect);
    free(buf);
}

/* The base shard with one tensor entry ("w" unless the entry names another) replaced. */
static void check_entry(const char *label, const char *entries, size_t data_bytes, enum verdict want,
                        const char *expect)
{
    char header[4096];
    snprintf(header, sizeof header, "{%s}", entries);
    check_header(label, header, data_bytes, want, expect);
}

#define S_Q ", \"s\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [16, 24]}," \
            " \"q\": {\"dtype\": \"F8_E4M3\", \"shape\": [3], \"data_offsets\": [24, 27]}"

/* ---- cases --------------------------------------------------------------------------- */

static void safetensors_base_shard_is_valid(void)
{
    check_header("valid-base", k_base_header, BASE_DATA_BYTES, MUST_ACCEPT, NULL);
    check_entry("valid-rank-8", "\"w\": {\"dtype\": \"BF16\", \"shape\": [1, 1, 1, 1, 1, 1, 2, 4], \"data_offsets\": [0, 16]}" S_Q,
                BASE_DATA_BYTES, MUST_ACCEPT, NULL);
    check_entry("valid-zero-size-at-one-offset",
                "\"w\": {\"dtype\": \"BF16\", \"shape\": [2, 4], \"data_offsets\": [0, 16]},"
                " \"e1\": {\"dtype\": \"BF16\", \"shape\": [0], \"data_offsets\": [16, 16]},"
                " \"e2\": {\"dtype\": \"I64\", \"shape\": [3, 0], \"data_offsets\": [16, 16]}" S_Q,
                BASE_DATA_BYTES, MUST_ACCEPT, NULL);
}

static void safetensors_every_truncation_is_rejected(void)
{
    size_t len;
    uint8_t *buf = shard_bytes(k_base_header, BASE_DATA_BYTES, &len);
    char label[64];
    for (size_t cut = 0; cut < len; cut++) {
        snprintf(label, sizeof label, "truncated-at-%zu", cut);
        check_input(label, buf, cut, MUST_REJECT, cut < 8 ? "too short" : NULL);
    }
    free(buf);
}

static void safetensors_hostile_header_lengths_are_rejected(void)
{
    size_t len;
    uint8_t *buf = shard_bytes(k_base_header, BASE_DATA_BYTES, &len);
    const uint64_t n = strlen(k_base_header);
    const struct {
        uint64_t value;
        const char *expect;
    } cases[] = {
        {UINT64_MAX, "exceeds the format's limit"},
        {1ull << 63, "exceeds the format's limit"},
        {KT_ST_MAX_HEADER_BYTES + 1ull, "exceeds the format's limit"},
        {len - 8 + 1, "runs past the end"},
        {KT_ST_MAX_HEADER_BYTES, "runs past the end"},
        {0, "not valid JSON"},
        {n - 1, "not valid JSON"},
        {n + 1, NULL}, /* a data byte joins the JSON */
        {len - 8, NULL},
    };
    char label[64];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        uint8_t *m = kt_test_xmalloc(len);
        memcpy(m, buf, len);
        memcpy(m, &cases[i].value, 8);
        snprintf(label, sizeof label, "header-length-%" PRIx64, cases[i].value);
        check_input(label, m, len, MUST_REJECT, cases[i].expect);
        free(m);
    }
    free(buf);
}

static void safetensors_non_json_headers_are_rejected(void)
{
    check_header("header-text", "hello", 0, MUST_REJECT, "not valid JSON");
    check_header("header-array", "[1, 2]", 0, MUST_REJECT, "not a JSON object");
    check_header("header-string", "\"w\"", 0, MUST_REJECT, "not valid JSON"); /* jansson wants a container */
    check_header("header-unclosed", "{\"w\": {\"dtype\": \"BF16\"", 0, MUST_REJECT, "not valid JSON");
    check_header("header-bad-utf8", "{\"\xff\xfe\": {}}", 0, MUST_REJECT, "not valid JSON");
    check_header("header-nul-escape", "{\"a\\u0000b\": {}}", 0, MUST_REJECT, "not valid JSON");
    check_header("header-two-objects", "{} {}", 0, MUST_REJECT, "not valid JSON");
    /* arrays nested past any parser's depth limit */
    char bomb[12000];
    size_t n = (size_t)snprintf(bomb, sizeof bomb, "{\"w\": ");
    for (int i = 0; i < 5000; i++)
        bomb[n++] = '[';
    for (int i = 0; i < 5000; i++)
        bomb[n++] = ']';
    snprintf(bomb + n, sizeof bomb - n, "}");
    check_header("header-nested-bomb", bomb, 0, MUST_REJECT, "not valid JSON");
    check_entry("duplicate-tensor-name",
                "\"w\": {\"dtype\": \"BF16\", \"shape\": [2, 4], \"data_offsets\": [0, 16]},"
                " \"w\": {\"dtype\": \"BF16\", \"shape\": [2, 4], \"data_offsets\": [0, 16]}" S_Q,
                BASE_DATA_BYTES, MUST_REJECT, "duplicate");
    check_entry("entry-not-object", "\"w\": 1" S_Q, BASE_DATA_BYTES, MUST_REJECT, "tensor 'w': entry is not a JSON object");
    check_entry("metadata-not-object", "\"__metadata__\": [], \"w\": {\"dtype\": \"BF16\", \"shape\": [2, 4], \"data_offsets\": [0, 16]}" S_Q,
                BASE_DATA_BYTES, MUST_REJECT, "__metadata__ is not a JSON object");
    check_entry("metadata-value-not-string", "\"__metadata__\": {\"format\": 1}, \"w\": {\"dtype\": \"BF16\", \"shape\": [2, 4], \"data_offsets\": [0, 16]}" S_Q,
                BASE_DATA_BYTES, MUST_REJECT, "__metadata__ value of 'format' is not a string");
}

static void safetensors_bad_dtypes_are_rejected(void)
{
    const struct {
        const char *label, *dtype_field, *expect;
    } cases[] = {
        {"dtype-missing", "", "tensor 'w': no dtype string"},
        {"dtype-number", "\"dtype\": 5,", "tensor 'w': no dtype string"},
        {"dtype-unknown", "\"dtype\": \"Q8_0\",", "tensor 'w': unknown dtype 'Q8_0'"},
        {"dtype-lowercase", "\"dtype\": \"bf16\",", "unknown dtype 'bf16'"},
        {"dtype-empty", "\"dtype\": \"\",", "unknown dtype ''"},
        /* a known dtype of another size: the extent no longer matches */
        {"dtype-f32-for-bf16", "\"dtype\": \"F32\",", "data_offsets span 16 bytes, but F32 [2, 4] takes 32"},
        {"dtype-u8-for-bf16", "\"dtype\": \"U8\",", "data_offsets span 16 bytes, but U8 [2, 4] takes 8"},
        {"dtype-f4-for-bf16", "\"dtype\": \"F4\",", "but F4 [2, 4] takes 4"},
    };
    char entries[1024];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(entries, sizeof entries, "\"w\": {%s \"shape\": [2, 4], \"data_offsets\": [0, 16]}" S_Q,
                 cases[i].dtype_field);
        check_entry(cases[i].label, entries, BASE_DATA_BYTES, MUST_REJECT, cases[i].expect);
    }
    check_entry("f4-odd-count", "\"w\": {\"dtype\": \"F4\", \"shape\": [3], \"data_offsets\": [0, 16]}" S_Q,
                BASE_DATA_BYTES, MUST_REJECT, "3 elements of F4 do not fill whole bytes");
    check_entry("f6-odd-count", "\"w\": {\"dtype\": \"F6_E2M3\", \"shape\": [5], \"data_offsets\": [0, 16]}" S_Q,
                BASE_DATA_BYTES, MUST_REJECT, "do not fill whole bytes");
}

static void safetensors_bad_shapes_are_rejected(void)
{
    const struct {
        const char *label, *shape, *expect;
    } cases[] = {
        {"shape-missing", "", "tensor 'w': no shape array"},
        {"shape-object", "\"shape\": {},", "no shape array"},
        {"shape-rank-9", "\"shape\": [1, 1, 1, 1, 1, 1, 1, 2, 4],", "rank 9 exceeds 8"},
        {"shape-negative", "\"shape\": [-2, -4],", "shape[0] is not a non-negative integer"},
        {"shape-fraction", "\"shape\": [2, 4.0],", "shape[1] is not a non-negative integer"},
        {"shape-string", "\"shape\": [\"2\", 4],", "shape[0] is not a non-negative integer"},
        {"shape-null", "\"shape\": [2, null],", "shape[1] is not a non-negative integer"},
        {"shape-too-big-for-json-int", "\"shape\": [18446744073709551616, 1],", "not valid JSON"},
        /* products past 64 bits, with a zero-size data span that must not hide them */
        {"shape-overflow-numel", "\"shape\": [4294967296, 4294967296],", "[4294967296, 4294967296] elements of BF16 overflow 64 bits"},
        {"shape-overflow-bits", "\"shape\": [1152921504606846976, 2],", "overflow 64 bits"},
        {"shape-overflow-after-zero", "\"shape\": [0, 9223372036854775807, 9223372036854775807],", NULL},
        {"shape-huge-no-overflow", "\"shape\": [1099511627776, 4],", "but BF16 [1099511627776, 4] takes 8796093022208"},
        {"shape-wrong-size", "\"shape\": [2, 3],", "data_offsets span 16 bytes, but BF16 [2, 3] takes 12"},
        {"shape-scalar", "\"shape\": [],", "but BF16 [] takes 2"},
    };
    char entries[1024];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(entries, sizeof entries, "\"w\": {\"dtype\": \"BF16\", %s \"data_offsets\": [0, 16]}" S_Q,
                 cases[i].shape);
        check_entry(cases[i].label, entries, BASE_DATA_BYTES, MUST_REJECT, cases[i].expect);
    }
}

static void safetensors_bad_data_offsets_are_rejected(void)
{
    const struct {
        const char *label, *offsets, *expect;
    } cases[] = {
        {"offsets-missing", "", "tensor 'w': data_offsets is not [begin, end]"},
        {"offsets-one", "\"data_offsets\": [16]", "data_offsets is not [begin, end]"},
        {"offsets-three", "\"data_offsets\": [0, 16, 32]", "data_offsets is not [begin, end]"},
        {"offsets-negative", "\"data_offsets\": [-16, 0]", "data_offsets is not [begin, end]"},
        {"offsets-fraction", "\"data_offsets\": [0, 16.5]", "data_offsets is not [begin, end]"},
        {"offsets-reversed", "\"data_offsets\": [16, 0]", "data_offsets [16, 0] end before they begin"},
        {"offsets-past-end", "\"data_offsets\": [0, 1000]", "data_offsets [0, 1000] run past the end of the 27 data bytes"},
        {"offsets-far-past-end", "\"data_offsets\": [9223372036854775800, 9223372036854775807]", "run past the end"},
        {"offsets-wrong-size", "\"data_offsets\": [0, 15]", "data_offsets span 15 bytes, but BF16 [2, 4] takes 16"},
        {"offsets-shifted", "\"data_offsets\": [1, 17]", "1 data bytes before tensor 'w'"},
    };
    char entries[1024];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(entries, sizeof entries, "\"w\": {\"dtype\": \"BF16\", \"shape\": [2, 4] %s %s}" S_Q,
                 cases[i].offsets[0] ? "," : "", cases[i].offsets);
        check_entry(cases[i].label, entries, BASE_DATA_BYTES, MUST_REJECT, cases[i].expect);
    }
}

static void safetensors_overlaps_gaps_and_slack_are_rejected(void)
{
    check_entry("overlap-partial",
                "\"w\": {\"dtype\": \"BF16\", \"shape\": [2, 4], \"data_offsets\": [0, 16]},"
                " \"s\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [8, 16]},"
                " \"q\": {\"dtype\": \"F8_E4M3\", \"shape\": [3], \"data_offsets\": [24, 27]}",
                BASE_DATA_BYTES, MUST_REJECT, "tensors 'w' and 's' overlap");
    check_entry("overlap-same-extent",
                "\"w\": {\"dtype\": \"BF16\", \"shape\": [2, 4], \"data_offsets\": [0, 16]},"
                " \"v\": {\"dtype\": \"BF16\", \"shape\": [2, 4], \"data_offsets\": [0, 16]}" S_Q,
                BASE_DATA_BYTES, MUST_REJECT, "overlap");
    check_entry("overlap-inside",
                "\"w\": {\"dtype\": \"BF16\", \"shape\": [2, 4], \"data_offsets\": [0, 16]},"
                " \"v\": {\"dtype\": \"U8\", \"shape\": [2], \"data_offsets\": [4, 6]}" S_Q,
                BASE_DATA_BYTES, MUST_REJECT, "overlap");
    check_entry("gap-before-first",
                "\"w\": {\"dtype\": \"BF16\", \"shape\": [2, 4], \"data_offsets\": [1, 17]},"
                " \"s\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [17, 25]},"
                " \"q\": {\"dtype\": \"F8_E4M3\", \"shape\": [2], \"data_offsets\": [25, 27]}",
                BASE_DATA_BYTES, MUST_REJECT, "1 data bytes before tensor 'w' belong to no tensor");
    check_entry("gap-between",
                "\"w\": {\"dtype\": \"BF16\", \"shape\": [2, 4], \"data_offsets\": [0, 16]},"
                " \"s\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [17, 25]},"
                " \"q\": {\"dtype\": \"F8_E4M3\", \"shape\": [2], \"data_offsets\": [25, 27]}",
                BASE_DATA_BYTES, MUST_REJECT, "1 data bytes before tensor 's' belong to no tensor");
    check_header("slack-after-last", k_base_header, BASE_DATA_BYTES + 5, MUST_REJECT,
                 "5 data bytes after the last tensor belong to no tensor");
    check_header("slack-without-tensors", "{}", 3, MUST_REJECT, "3 data bytes after the last tensor");
}

static void safetensors_byte_mutations_never_crash(void)
{
    size_t len;
    uint8_t *buf = shard_bytes(k_base_header, BASE_DATA_BYTES, &len);
    uint8_t *m = kt_test_xmalloc(len);
    static const uint8_t values[] = {0x00, 0xff, '"', '{', '9', '-'};
    char label[64];
    for (size_t i = 0; i < len; i++)
        for (size_t v = 0; v < sizeof values; v++) {
            if (buf[i] == values[v])
                continue;
            memcpy(m, buf, len);
            m[i] = values[v];
            snprintf(label, sizeof label, "byte%zu=%02x", i, values[v]);
            check_input(label, m, len, MAY_ACCEPT, NULL);
        }
    free(m);
    free(buf);
}

/* ---- corpus directory ------------------------------------------------------------------- */

static bool prepare_corpus_dir(void)
{
    const char *tmp = getenv("KT_TEST_TMP");
    char parent[900];
    snprintf(parent, sizeof parent, "%s/corpus", tmp && *tmp ? tmp : "/tmp");
    snprintf(g_corpus.dir, sizeof g_corpus.dir, "%s/safetensors", parent);
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
        if (n > 12 && strcmp(e->d_name + n - 12, ".safetensors") == 0) {
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
    if (!prepare_corpus_dir())
        return kt_test_finish();
    KT_RUN(safetensors_base_shard_is_valid);
    KT_RUN(safetensors_every_truncation_is_rejected);
    KT_RUN(safetensors_hostile_header_lengths_are_rejected);
    KT_RUN(safetensors_non_json_headers_are_rejected);
    KT_RUN(safetensors_bad_dtypes_are_rejected);
    KT_RUN(safetensors_bad_shapes_are_rejected);
    KT_RUN(safetensors_bad_data_offsets_are_rejected);
    KT_RUN(safetensors_overlaps_gaps_and_slack_are_rejected);
    KT_RUN(safetensors_byte_mutations_never_crash);
    printf("corpus: %d inputs in %s; %d must-reject rejected, %d mutations (%d of them accepted)\n",
           g_corpus.n_inputs, g_corpus.dir, g_corpus.n_rejected, g_corpus.n_mutations,
           g_corpus.n_mutations_accepted);
    return kt_test_finish();
}
