/*
 * fuzz_safetensors.c - fuzz target for the safetensors shard reader.
 *
 * Each input is parsed with kt_st_open_memory from an exactly-sized copy; an
 * accepted shard is walked (every tensor found by name, every data byte read)
 * and the reader's promises are checked: extents inside the buffer and tiling
 * the data section exactly, sizes equal to numel times the dtype's bits, ranks
 * within the limit, rejections a format error with a message.  A broken
 * promise aborts.  It must never keep state between inputs.  kt_fuzz_seeds
 * hands replay.c a few valid shards (every dtype family, a scalar, an empty
 * tensor, metadata, a padded header) with every truncation and one-byte
 * mutations of them.
 */
#include "fuzz.h"

#include "safetensors.h"

#include <stdbool.h>

static void require(bool cond, const char *what)
{
    if (!cond) {
        fprintf(stderr, "fuzz_safetensors: broken promise: %s\n", what);
        abort();
    }
}

/* Sums bytes so the reads cannot be optimised away. */
static volatile uint64_t g_sink;

static void walk(const struct kt_st_dir *dir, const uint8_t *data, size_t size)
{
    require(dir->n_shards == 1, "one shard");
    const struct kt_st_shard *sh = &dir->shards[0];
    require(sh->base == data && sh->file_bytes == size, "base and size");
    require(sh->header_bytes <= KT_ST_MAX_HEADER_BYTES && sh->data_offset == 8 + sh->header_bytes &&
            sh->data_offset <= size, "header inside the file");
    require(sh->n_tensors == dir->n_tensors, "every tensor counted");
    uint64_t total = 0;
    for (uint64_t i = 0; i < dir->n_tensors; i++) {
        const struct kt_st_tensor *t = &dir->tensors[i];
        require(kt_st_find(dir, t->name) == t, "find finds every tensor");
        require(t->shard == 0 && (unsigned)t->dtype < KT_ST_DTYPE_COUNT && t->rank <= KT_ST_MAX_RANK, "record");
        uint64_t numel = 1;
        for (uint32_t d = 0; d < t->rank; d++)
            numel *= t->shape[d];
        require(numel == t->numel && t->numel * kt_st_dtype_bits(t->dtype) == 8 * t->bytes, "size");
        const uint8_t *p = t->data;
        require(p == data + t->file_offset && t->file_offset >= sh->data_offset && t->bytes <= size &&
                t->file_offset <= size - t->bytes, "data inside the buffer");
        uint64_t sum = 0;
        for (uint64_t j = 0; j < t->bytes; j++)
            sum += p[j];
        g_sink += sum;
        total += t->bytes;
    }
    require(total == size - sh->data_offset, "tensors tile the data section");
    require(kt_st_find(dir, "\x01 no such tensor") == NULL, "absent tensor");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* an exact-size copy: a read past the end leaves the heap block */
    uint8_t *copy = malloc(size ? size : 1);
    if (!copy)
        return 0;
    if (size)
        memcpy(copy, data, size);
    struct kt_st_dir *dir = NULL;
    kt_err err = {.msg = ""};
    kt_status s = kt_st_open_memory(copy, size, NULL, &dir, &err);
    require((s == KT_OK) == (dir != NULL), "result set exactly on success");
    if (s == KT_OK)
        walk(dir, copy, size);
    else
        require(s == KT_ERR_FORMAT && err.msg[0] != '\0', "rejections are format errors with a message");
    kt_st_close(dir);
    free(copy);
    return 0;
}

/* ---- seeds for replay.c ---------------------------------------------------------------- */

static const char *const k_seed_headers[] = {
    "{\"__metadata__\": {\"format\": \"pt\"},"
    " \"m.weight_packed\": {\"dtype\": \"I32\", \"shape\": [2, 1], \"data_offsets\": [0, 8]},"
    " \"m.weight_scale\": {\"dtype\": \"BF16\", \"shape\": [2, 1], \"data_offsets\": [8, 12]},"
    " \"m.weight_shape\": {\"dtype\": \"I64\", \"shape\": [2], \"data_offsets\": [12, 28]},"
    " \"f.weight\": {\"dtype\": \"F8_E4M3\", \"shape\": [2, 3], \"data_offsets\": [28, 34]},"
    " \"f.weight_scale_inv\": {\"dtype\": \"F32\", \"shape\": [], \"data_offsets\": [34, 38]},"
    " \"x.blocks\": {\"dtype\": \"U8\", \"shape\": [1, 1, 16], \"data_offsets\": [38, 54]},"
    " \"x.scales\": {\"dtype\": \"U8\", \"shape\": [1, 1], \"data_offsets\": [54, 55]},"
    " \"e\": {\"dtype\": \"F16\", \"shape\": [0, 7], \"data_offsets\": [55, 55]},"
    " \"p\": {\"dtype\": \"F4\", \"shape\": [2], \"data_offsets\": [55, 56]}}",
    "{\"a\": {\"dtype\": \"BF16\", \"shape\": [1, 1, 1, 1, 1, 1, 1, 2], \"data_offsets\": [0, 4]}}        ",
    "{}",
};
static const size_t k_seed_data_bytes[] = {56, 4, 0};

void kt_fuzz_seeds(kt_fuzz_emit_fn emit)
{
    static const uint8_t values[] = {0x00, 0xff, '"', '{', '[', '9', '-'};
    char label[64];
    for (size_t seed = 0; seed < sizeof k_seed_headers / sizeof k_seed_headers[0]; seed++) {
        const uint64_t n = strlen(k_seed_headers[seed]);
        const size_t len = 8 + n + k_seed_data_bytes[seed];
        uint8_t *buf = malloc(len), *m = malloc(len);
        require(buf && m, "seed memory");
        memcpy(buf, &n, 8);
        memcpy(buf + 8, k_seed_headers[seed], n);
        for (size_t i = 0; i < k_seed_data_bytes[seed]; i++)
            buf[8 + n + i] = (uint8_t)(i * 37 + 11);
        snprintf(label, sizeof label, "seed%zu", seed);
        emit(buf, len, label);
        for (size_t cut = 0; cut < len; cut++) {
            snprintf(label, sizeof label, "seed%zu-truncated-%zu", seed, cut);
            emit(buf, cut, label);
        }
        for (size_t i = 0; i < len; i++)
            for (size_t v = 0; v < sizeof values; v++) {
                if (buf[i] == values[v])
                    continue;
                memcpy(m, buf, len);
                m[i] = values[v];
                snprintf(label, sizeof label, "seed%zu-byte%zu=%02x", seed, i, values[v]);
                emit(m, len, label);
            }
        free(buf);
        free(m);
    }
}
