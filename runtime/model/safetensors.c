/*
 * safetensors.c - safetensors shards and checkpoint directories (see
 * safetensors.h).
 *
 * The reader trusts nothing in a shard or an index: the header length is
 * bounded by the file and the format's limit before the JSON is parsed, every
 * shape product and byte count is overflow-checked, every extent is compared
 * with the data section before a pointer is formed, and the extents must tile
 * the data section exactly, as the format's reference reader
 * (huggingface/safetensors, safetensors/src/tensor.rs: read_metadata and
 * validate) requires.  It must never read outside a mapping, write to one,
 * open a path the index names outside the directory, or abort on bad input.
 *
 * Shard layout (little-endian):
 *   u64 N | N bytes of UTF-8 JSON | data section
 *   JSON: { "__metadata__": {str: str}?,
 *           "<name>": {"dtype": "BF16", "shape": [d0, ..], "data_offsets": [begin, end]}, ... }
 *   offsets are relative to the data section; shape is outermost first.
 */
#include "safetensors.h"

#include "small_file.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors.c reads the header length in host order: little-endian hosts only"
#endif

#define MAX_INDEX_BYTES (256u << 20) /* a real index (~100k tensors) is ~10 MiB */

/* ---- dtypes ----------------------------------------------------------------------- */

static const struct dtype_row {
    const char *name;
    unsigned bits;
} k_dtypes[KT_ST_DTYPE_COUNT] = {
    [KT_ST_BOOL] = {"BOOL", 8},           [KT_ST_U8] = {"U8", 8},
    [KT_ST_I8] = {"I8", 8},               [KT_ST_F8_E4M3] = {"F8_E4M3", 8},
    [KT_ST_F8_E5M2] = {"F8_E5M2", 8},     [KT_ST_F8_E8M0] = {"F8_E8M0", 8},
    [KT_ST_F8_E4M3FNUZ] = {"F8_E4M3FNUZ", 8}, [KT_ST_F8_E5M2FNUZ] = {"F8_E5M2FNUZ", 8},
    [KT_ST_I16] = {"I16", 16},            [KT_ST_U16] = {"U16", 16},
    [KT_ST_F16] = {"F16", 16},            [KT_ST_BF16] = {"BF16", 16},
    [KT_ST_I32] = {"I32", 32},            [KT_ST_U32] = {"U32", 32},
    [KT_ST_F32] = {"F32", 32},            [KT_ST_I64] = {"I64", 64},
    [KT_ST_U64] = {"U64", 64},            [KT_ST_F64] = {"F64", 64},
    [KT_ST_C64] = {"C64", 64},            [KT_ST_F4] = {"F4", 4},
    [KT_ST_F6_E2M3] = {"F6_E2M3", 6},     [KT_ST_F6_E3M2] = {"F6_E3M2", 6},
};

const char *kt_st_dtype_name(enum kt_st_dtype dtype)
{
    return (unsigned)dtype < KT_ST_DTYPE_COUNT ? k_dtypes[dtype].name : "?";
}

unsigned kt_st_dtype_bits(enum kt_st_dtype dtype)
{
    return (unsigned)dtype < KT_ST_DTYPE_COUNT ? k_dtypes[dtype].bits : 0;
}

static int dtype_from_name(const char *s)
{
    for (int i = 0; i < KT_ST_DTYPE_COUNT; i++)
        if (strcmp(s, k_dtypes[i].name) == 0)
            return i;
    return -1;
}

/* ---- a name -> index hash (open addressing; slots hold index + 1) ---------------------- */

typedef const char *(*name_of_fn)(const void *ctx, uint32_t i);

struct name_index {
    uint32_t *slots;
    uint64_t mask;   /* capacity - 1; capacity a power of two >= 2 x entries */
    uint32_t count;
};

static uint64_t hash_name(const char *s)
{
    uint64_t h = 0xcbf29ce484222325ULL; /* FNV-1a */
    for (; *s; s++) {
        h ^= (uint8_t)*s;
        h *= 0x100000001b3ULL;
    }
    return h;
}

/* The slot holding name, or the empty slot where it would go. */
static uint64_t index_probe(const struct name_index *ix, const char *name, name_of_fn name_of, const void *ctx)
{
    uint64_t slot = hash_name(name) & ix->mask;
    while (ix->slots[slot] && strcmp(name_of(ctx, ix->slots[slot] - 1), name) != 0)
        slot = (slot + 1) & ix->mask;
    return slot;
}

static bool index_grow(struct name_index *ix, uint32_t want, name_of_fn name_of, const void *ctx)
{
    uint64_t cap = 16;
    while (cap < 2 * (uint64_t)want)
        cap *= 2;
    if (ix->slots && cap <= ix->mask + 1)
        return true;
    uint32_t *old = ix->slots;
    const uint64_t old_cap = old ? ix->mask + 1 : 0;
    ix->slots = calloc(cap, sizeof *ix->slots);
    if (!ix->slots) {
        ix->slots = old;
        return false;
    }
    ix->mask = cap - 1;
    for (uint64_t i = 0; i < old_cap; i++)
        if (old[i])
            ix->slots[index_probe(ix, name_of(ctx, old[i] - 1), name_of, ctx)] = old[i];
    free(old);
    return true;
}

/* Adds entry i under its name; *existing gets the index already there (and
 * nothing is added) or UINT32_MAX.  false: out of memory. */
static bool index_add(struct name_index *ix, uint32_t i, name_of_fn name_of, const void *ctx, uint32_t *existing)
{
    *existing = UINT32_MAX;
    if (!index_grow(ix, ix->count + 1, name_of, ctx))
        return false;
    uint64_t slot = index_probe(ix, name_of(ctx, i), name_of, ctx);
    if (ix->slots[slot]) {
        *existing = ix->slots[slot] - 1;
        return true;
    }
    ix->slots[slot] = i + 1;
    ix->count++;
    return true;
}

/* ---- the directory being built ------------------------------------------------------- */

struct mapping {
    void *map;       /* NULL for caller buffers and empty files */
    size_t bytes;
};

struct st_internal {
    struct mapping *maps;       /* per shard */
    uint64_t tensor_cap;
    struct name_index tensors;  /* over dir->tensors */
};

static const char *tensor_name_of(const void *ctx, uint32_t i)
{
    return ((const struct kt_st_dir *)ctx)->tensors[i].name;
}

static struct kt_st_dir *dir_alloc(void)
{
    struct kt_st_dir *dir = calloc(1, sizeof *dir);
    struct st_internal *in = calloc(1, sizeof *in);
    if (!dir || !in) {
        free(dir);
        free(in);
        return NULL;
    }
    dir->internal = in;
    return dir;
}

void kt_st_close(struct kt_st_dir *dir)
{
    if (!dir)
        return;
    struct st_internal *in = dir->internal;
    for (uint64_t i = 0; i < dir->n_tensors; i++)
        free((char *)dir->tensors[i].name);
    free(dir->tensors);
    for (uint32_t s = 0; s < dir->n_shards; s++) {
        if (in && in->maps && in->maps[s].map)
            munmap(in->maps[s].map, in->maps[s].bytes);
        free(dir->shards[s].path);
    }
    free(dir->shards);
    if (in) {
        free(in->maps);
        free(in->tensors.slots);
        free(in);
    }
    free(dir);
}

/* Appends a shard record (its bytes set later); returns its index or -1. */
static int64_t add_shard(struct kt_st_dir *dir, const char *path)
{
    struct st_internal *in = dir->internal;
    struct kt_st_shard *shards = realloc(dir->shards, (dir->n_shards + 1) * sizeof *shards);
    if (!shards)
        return -1;
    dir->shards = shards;
    struct mapping *maps = realloc(in->maps, (dir->n_shards + 1) * sizeof *maps);
    if (!maps)
        return -1;
    in->maps = maps;
    char *copy = strdup(path ? path : "");
    if (!copy)
        return -1;
    shards[dir->n_shards] = (struct kt_st_shard){.path = copy};
    maps[dir->n_shards] = (struct mapping){0};
    return dir->n_shards++;
}

static struct kt_st_tensor *add_tensor(struct kt_st_dir *dir)
{
    struct st_internal *in = dir->internal;
    if (dir->n_tensors == in->tensor_cap) {
        uint64_t cap = in->tensor_cap ? 2 * in->tensor_cap : 64;
        struct kt_st_tensor *t = realloc(dir->tensors, cap * sizeof *t);
        if (!t)
            return NULL;
        dir->tensors = t;
        in->tensor_cap = cap;
    }
    struct kt_st_tensor *t = &dir->tensors[dir->n_tensors++];
    memset(t, 0, sizeof *t);
    return t;
}

/* ---- one shard ----------------------------------------------------------------------- */

/* "[4, 8]" into buf, for messages. */
static const char *shape_text(const struct kt_st_tensor *t, char *buf, size_t size)
{
    size_t n = (size_t)snprintf(buf, size, "[");
    for (uint32_t d = 0; d < t->rank && n < size; d++)
        n += (size_t)snprintf(buf + n, size - n, "%s%" PRIu64, d ? ", " : "", t->shape[d]);
    if (n < size)
        snprintf(buf + n, size - n, "]");
    return buf;
}

/* A non-negative JSON integer, or false. */
static bool get_u64(const json_t *v, uint64_t *out)
{
    if (!json_is_integer(v) || json_integer_value(v) < 0)
        return false;
    *out = (uint64_t)json_integer_value(v);
    return true;
}

static kt_status parse_metadata(const json_t *meta, kt_err *err)
{
    if (!json_is_object(meta))
        return kt_err_set(err, KT_ERR_FORMAT, "__metadata__ is not a JSON object");
    const char *key;
    const json_t *value;
    json_object_foreach((json_t *)meta, key, value)
        if (!json_is_string(value))
            return kt_err_set(err, KT_ERR_FORMAT, "__metadata__ value of '%s' is not a string", key);
    return KT_OK;
}

/* Fills t from one header entry; data_bytes bounds the extent. */
static kt_status parse_entry(const char *name, const json_t *entry, uint64_t data_bytes, struct kt_st_tensor *t,
                             uint64_t *begin, uint64_t *end, kt_err *err)
{
    if (!json_is_object(entry))
        return kt_err_set(err, KT_ERR_FORMAT, "tensor '%s': entry is not a JSON object", name);
    const json_t *dtype = json_object_get(entry, "dtype");
    const json_t *shape = json_object_get(entry, "shape");
    const json_t *offsets = json_object_get(entry, "data_offsets");
    if (!json_is_string(dtype))
        return kt_err_set(err, KT_ERR_FORMAT, "tensor '%s': no dtype string", name);
    int dt = dtype_from_name(json_string_value(dtype));
    if (dt < 0)
        return kt_err_set(err, KT_ERR_FORMAT, "tensor '%s': unknown dtype '%.64s'", name, json_string_value(dtype));
    t->dtype = (enum kt_st_dtype)dt;
    if (!json_is_array(shape))
        return kt_err_set(err, KT_ERR_FORMAT, "tensor '%s': no shape array", name);
    if (json_array_size(shape) > KT_ST_MAX_RANK)
        return kt_err_set(err, KT_ERR_FORMAT, "tensor '%s': rank %zu exceeds %d", name, json_array_size(shape),
                          KT_ST_MAX_RANK);
    t->rank = (uint32_t)json_array_size(shape);
    uint64_t numel = 1;
    bool overflow = false;
    for (uint32_t d = 0; d < t->rank; d++) {
        if (!get_u64(json_array_get(shape, d), &t->shape[d]))
            return kt_err_set(err, KT_ERR_FORMAT, "tensor '%s': shape[%u] is not a non-negative integer", name, d);
        overflow |= __builtin_mul_overflow(numel, t->shape[d], &numel);
    }
    char shape_buf[256];
    uint64_t bits;
    if (overflow || __builtin_mul_overflow(numel, (uint64_t)k_dtypes[dt].bits, &bits))
        return kt_err_set(err, KT_ERR_FORMAT, "tensor '%s': %s elements of %s overflow 64 bits", name,
                          shape_text(t, shape_buf, sizeof shape_buf), k_dtypes[dt].name);
    if (bits % 8)
        return kt_err_set(err, KT_ERR_FORMAT, "tensor '%s': %" PRIu64 " elements of %s do not fill whole bytes",
                          name, numel, k_dtypes[dt].name);
    t->numel = numel;
    t->bytes = bits / 8;
    if (!json_is_array(offsets) || json_array_size(offsets) != 2 || !get_u64(json_array_get(offsets, 0), begin) ||
        !get_u64(json_array_get(offsets, 1), end))
        return kt_err_set(err, KT_ERR_FORMAT, "tensor '%s': data_offsets is not [begin, end] of non-negative integers",
                          name);
    if (*end < *begin)
        return kt_err_set(err, KT_ERR_FORMAT, "tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64 "] end before they begin",
                          name, *begin, *end);
    if (*end > data_bytes)
        return kt_err_set(err, KT_ERR_FORMAT,
                          "tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64 "] run past the end of the %" PRIu64
                          " data bytes (truncated shard?)", name, *begin, *end, data_bytes);
    if (*end - *begin != t->bytes)
        return kt_err_set(err, KT_ERR_FORMAT,
                          "tensor '%s': data_offsets span %" PRIu64 " bytes, but %s %s takes %" PRIu64, name,
                          *end - *begin, k_dtypes[dt].name, shape_text(t, shape_buf, sizeof shape_buf), t->bytes);
    return KT_OK;
}

struct extent {
    uint64_t begin, end;
    uint64_t tensor; /* index into dir->tensors */
};

static int by_extent(const void *a, const void *b)
{
    const struct extent *x = a, *y = b;
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end)
        return x->end < y->end ? -1 : 1;
    return 0;
}

/* The extents must cover [0, data_bytes) exactly, in order. */
static kt_status check_tiling(const struct kt_st_dir *dir, struct extent *ext, uint64_t n, uint64_t data_bytes,
                              kt_err *err)
{
    qsort(ext, n, sizeof *ext, by_extent);
    uint64_t covered = 0;
    for (uint64_t i = 0; i < n; i++) {
        const char *name = dir->tensors[ext[i].tensor].name;
        if (ext[i].begin < covered)
            return kt_err_set(err, KT_ERR_FORMAT,
                              "tensors '%s' and '%s' overlap: data_offsets [%" PRIu64 ", %" PRIu64 "] and [%" PRIu64
                              ", %" PRIu64 "]", dir->tensors[ext[i - 1].tensor].name, name, ext[i - 1].begin,
                              ext[i - 1].end, ext[i].begin, ext[i].end);
        if (ext[i].begin > covered)
            return kt_err_set(err, KT_ERR_FORMAT, "%" PRIu64 " data bytes before tensor '%s' belong to no tensor",
                              ext[i].begin - covered, name);
        covered = ext[i].end;
    }
    if (covered != data_bytes)
        return kt_err_set(err, KT_ERR_FORMAT, "%" PRIu64 " data bytes after the last tensor belong to no tensor",
                          data_bytes - covered);
    return KT_OK;
}

/* Parses shard s, whose base and file_bytes are set, appending its tensors. */
static kt_status parse_shard(struct kt_st_dir *dir, uint32_t s, kt_err *err)
{
    struct kt_st_shard *sh = &dir->shards[s];
    if (sh->file_bytes < 8)
        return kt_err_set(err, KT_ERR_FORMAT, "%" PRIu64 " bytes is too short for the 8-byte header length",
                          sh->file_bytes);
    uint64_t n;
    memcpy(&n, sh->base, sizeof n);
    if (n > KT_ST_MAX_HEADER_BYTES)
        return kt_err_set(err, KT_ERR_FORMAT, "header length %" PRIu64 " exceeds the format's limit of %u bytes", n,
                          KT_ST_MAX_HEADER_BYTES);
    if (n > sh->file_bytes - 8)
        return kt_err_set(err, KT_ERR_FORMAT, "header length %" PRIu64 " runs past the end of the %" PRIu64
                          "-byte file (truncated shard?)", n, sh->file_bytes);
    sh->header_bytes = n;
    sh->data_offset = 8 + n;
    const uint64_t data_bytes = sh->file_bytes - sh->data_offset;

    json_error_t jerr;
    json_t *root = json_loadb((const char *)sh->base + 8, (size_t)n, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return kt_err_set(err, KT_ERR_FORMAT, "header is not valid JSON: %s (header byte %d)", jerr.text,
                          jerr.position);
    kt_status st = KT_OK;
    struct extent *ext = NULL;
    if (!json_is_object(root)) {
        st = kt_err_set(err, KT_ERR_FORMAT, "header is not a JSON object");
        goto done;
    }
    ext = malloc((json_object_size(root) + 1) * sizeof *ext);
    if (!ext) {
        st = kt_err_set(err, KT_ERR_NOMEM, "out of memory for %zu tensor entries", json_object_size(root));
        goto done;
    }
    uint64_t n_ext = 0;
    const uint64_t first = dir->n_tensors;
    const char *key;
    json_t *value;
    json_object_foreach(root, key, value) {
        if (strcmp(key, "__metadata__") == 0) {
            if ((st = parse_metadata(value, err)))
                goto done;
            continue;
        }
        struct kt_st_tensor *t = add_tensor(dir);
        char *name = strdup(key);
        if (!t || !name) {
            free(name);
            if (t)
                dir->n_tensors--;
            st = kt_err_set(err, KT_ERR_NOMEM, "out of memory reading tensor '%s'", key);
            goto done;
        }
        t->name = name;
        t->shard = s;
        uint64_t begin = 0, end = 0;
        if ((st = parse_entry(name, value, data_bytes, t, &begin, &end, err)))
            goto done;
        t->file_offset = sh->data_offset + begin;
        t->data = sh->base + t->file_offset;
        ext[n_ext++] = (struct extent){begin, end, dir->n_tensors - 1};
    }
    sh->n_tensors = dir->n_tensors - first;
    st = check_tiling(dir, ext, n_ext, data_bytes, err);
done:
    free(ext);
    json_decref(root);
    return st;
}

/* Maps path as shard s; the mapping is recorded even if parsing fails, so
 * kt_st_close releases it.  Messages are prefixed with the path. */
static kt_status map_and_parse(struct kt_st_dir *dir, uint32_t s, kt_err *err)
{
    struct st_internal *in = dir->internal;
    struct kt_st_shard *sh = &dir->shards[s];
    int fd = open(sh->path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return kt_err_set(err, KT_ERR_IO, "%s: cannot open: %s", sh->path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return kt_err_set(err, KT_ERR_IO, "%s: cannot stat: %s", sh->path, strerror(e));
    }
    if (!S_ISREG(st.st_mode) || (uint64_t)st.st_size > SIZE_MAX) {
        close(fd);
        return kt_err_set(err, KT_ERR_IO, "%s: not a regular file that can be mapped", sh->path);
    }
    size_t bytes = (size_t)st.st_size;
    void *map = bytes ? mmap(NULL, bytes, PROT_READ, MAP_PRIVATE, fd, 0) : NULL;
    int map_errno = errno;
    close(fd);
    if (map == MAP_FAILED)
        return kt_err_set(err, KT_ERR_IO, "%s: cannot mmap %zu bytes: %s", sh->path, bytes, strerror(map_errno));
    static const uint8_t empty[1];
    in->maps[s] = (struct mapping){map, bytes};
    sh->base = map ? map : empty;
    sh->file_bytes = bytes;
    kt_status status = parse_shard(dir, s, err);
    if (status)
        kt_err_prefix(err, "%s", sh->path);
    return status;
}

/* Indexes every tensor by name; a name in two shards is refused. */
static kt_status build_index(struct kt_st_dir *dir, kt_err *err)
{
    struct st_internal *in = dir->internal;
    if (dir->n_tensors > UINT32_MAX - 1)
        return kt_err_set(err, KT_ERR_FORMAT, "%" PRIu64 " tensors are more than kt indexes", dir->n_tensors);
    if (!index_grow(&in->tensors, (uint32_t)dir->n_tensors, tensor_name_of, dir))
        return kt_err_set(err, KT_ERR_NOMEM, "out of memory indexing %" PRIu64 " tensors", dir->n_tensors);
    for (uint32_t i = 0; i < dir->n_tensors; i++) {
        uint32_t other;
        if (!index_add(&in->tensors, i, tensor_name_of, dir, &other))
            return kt_err_set(err, KT_ERR_NOMEM, "out of memory indexing tensors");
        if (other != UINT32_MAX)
            return kt_err_set(err, KT_ERR_FORMAT, "tensor '%s' is in both %s and %s", dir->tensors[i].name,
                              dir->shards[dir->tensors[other].shard].path, dir->shards[dir->tensors[i].shard].path);
    }
    return KT_OK;
}

/* ---- opening ---------------------------------------------------------------------------- */

kt_status kt_st_open_memory(const void *data, size_t bytes, const char *label, struct kt_st_dir **out,
                            kt_err *err)
{
    if (!out)
        return kt_err_set(err, KT_ERR_INVALID, "kt_st_open_memory: out is NULL");
    *out = NULL;
    if (!data && bytes)
        return kt_err_set(err, KT_ERR_INVALID, "kt_st_open_memory: NULL buffer of %zu bytes", bytes);
    static const uint8_t empty[1];
    struct kt_st_dir *dir = dir_alloc();
    if (!dir || add_shard(dir, label) < 0) {
        kt_st_close(dir);
        return kt_err_set(err, KT_ERR_NOMEM, "out of memory opening a safetensors buffer");
    }
    dir->shards[0].base = data ? data : empty;
    dir->shards[0].file_bytes = bytes;
    kt_status s = parse_shard(dir, 0, err);
    if (!s)
        s = build_index(dir, err);
    if (s) {
        if (label && *label)
            kt_err_prefix(err, "%s", label);
        kt_st_close(dir);
        return s;
    }
    *out = dir;
    return KT_OK;
}

kt_status kt_st_open_file(const char *path, struct kt_st_dir **out, kt_err *err)
{
    if (!out || !path)
        return kt_err_set(err, KT_ERR_INVALID, "kt_st_open_file: NULL argument");
    *out = NULL;
    struct kt_st_dir *dir = dir_alloc();
    if (!dir || add_shard(dir, path) < 0) {
        kt_st_close(dir);
        return kt_err_set(err, KT_ERR_NOMEM, "%s: out of memory", path);
    }
    kt_status s = map_and_parse(dir, 0, err);
    if (!s)
        s = build_index(dir, err);
    if (s) {
        kt_st_close(dir);
        return s;
    }
    *out = dir;
    return KT_OK;
}

/* A shard name from the index must be a file beside it: no folders, no "..". */
static bool plain_file_name(const char *s)
{
    return *s && strchr(s, '/') == NULL && strcmp(s, ".") != 0 && strcmp(s, "..") != 0;
}

static const char *shard_path_of(const void *ctx, uint32_t i)
{
    return ((const struct kt_st_dir *)ctx)->shards[i].path;
}

static char *join_path(const char *dir, const char *file)
{
    size_t n = strlen(dir) + strlen(file) + 2;
    char *p = malloc(n);
    if (p)
        snprintf(p, n, "%s/%s", dir, file);
    return p;
}

/* Reads the index, opens each shard it names once, and checks that every
 * tensor it lists is in the shard it names. */
static kt_status open_indexed(struct kt_st_dir *dir, const char *path, const char *index_path, kt_err *err)
{
    char *text = NULL;
    size_t len = 0;
    kt_status s = kt_read_small_file(index_path, MAX_INDEX_BYTES, &text, &len, err);
    if (s)
        return s;
    json_error_t jerr;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
    free(text);
    uint32_t *map_shard = NULL; /* per weight_map entry, in iteration order */
    struct name_index shard_names = {0};
    if (!root) {
        s = kt_err_set(err, KT_ERR_FORMAT, "%s: not valid JSON: %s (line %d)", index_path, jerr.text, jerr.line);
        goto done;
    }
    const json_t *weight_map = json_object_get(root, "weight_map");
    if (!json_is_object(weight_map)) {
        s = kt_err_set(err, KT_ERR_FORMAT, "%s: no weight_map object", index_path);
        goto done;
    }
    map_shard = malloc((json_object_size(weight_map) + 1) * sizeof *map_shard);
    if (!map_shard) {
        s = kt_err_set(err, KT_ERR_NOMEM, "%s: out of memory", index_path);
        goto done;
    }
    const char *name;
    const json_t *file;
    size_t entry = 0;
    json_object_foreach((json_t *)weight_map, name, file) {
        if (!json_is_string(file) || !plain_file_name(json_string_value(file))) {
            s = kt_err_set(err, KT_ERR_FORMAT, "%s: tensor '%s' maps to %s%.200s%s, not a file name in %s",
                           index_path, name, json_is_string(file) ? "'" : "", json_is_string(file) ?
                           json_string_value(file) : "a non-string", json_is_string(file) ? "'" : "", path);
            goto done;
        }
        char *shard_path = join_path(path, json_string_value(file));
        int64_t idx = shard_path ? add_shard(dir, shard_path) : -1;
        free(shard_path);
        uint32_t existing;
        if (idx < 0 || !index_add(&shard_names, (uint32_t)idx, shard_path_of, dir, &existing)) {
            s = kt_err_set(err, KT_ERR_NOMEM, "%s: out of memory", index_path);
            goto done;
        }
        if (existing != UINT32_MAX) { /* seen before: drop the duplicate record */
            free(dir->shards[--dir->n_shards].path);
            idx = existing;
        }
        map_shard[entry++] = (uint32_t)idx;
    }
    if (dir->n_shards == 0) {
        s = kt_err_set(err, KT_ERR_FORMAT, "%s: weight_map is empty", index_path);
        goto done;
    }
    for (uint32_t sh = 0; sh < dir->n_shards; sh++) {
        if ((s = map_and_parse(dir, sh, err))) {
            /* name a tensor that lives there, so the message says why the file matters */
            entry = 0;
            json_object_foreach((json_t *)weight_map, name, file) {
                if (map_shard[entry++] == sh) {
                    kt_err_prefix(err, "shard of tensor '%s' (%s)", name, KT_ST_INDEX_FILE);
                    break;
                }
            }
            goto done;
        }
    }
    if ((s = build_index(dir, err)))
        goto done;
    entry = 0;
    json_object_foreach((json_t *)weight_map, name, file) {
        const struct kt_st_tensor *t = kt_st_find(dir, name);
        const uint32_t want = map_shard[entry++];
        if (!t || t->shard != want) {
            s = kt_err_set(err, KT_ERR_FORMAT, "%s: tensor '%s' is mapped to %s, which does not contain it%s%s",
                           index_path, name, dir->shards[want].path, t ? "; it is in " : "",
                           t ? dir->shards[t->shard].path : "");
            goto done;
        }
    }
done:
    free(shard_names.slots);
    free(map_shard);
    json_decref(root);
    return s;
}

kt_status kt_st_open_dir(const char *path, struct kt_st_dir **out, kt_err *err)
{
    if (!out || !path)
        return kt_err_set(err, KT_ERR_INVALID, "kt_st_open_dir: NULL argument");
    *out = NULL;
    struct stat st;
    if (stat(path, &st) != 0)
        return kt_err_set(err, KT_ERR_IO, "%s: %s", path, strerror(errno));
    if (!S_ISDIR(st.st_mode))
        return kt_err_set(err, KT_ERR_INVALID, "%s: not a directory", path);
    char *index_path = join_path(path, KT_ST_INDEX_FILE);
    char *single_path = join_path(path, KT_ST_SINGLE_FILE);
    struct kt_st_dir *dir = dir_alloc();
    kt_status s = KT_OK;
    if (!index_path || !single_path || !dir) {
        s = kt_err_set(err, KT_ERR_NOMEM, "%s: out of memory", path);
    } else if (stat(index_path, &st) == 0) {
        s = open_indexed(dir, path, index_path, err);
    } else if (stat(single_path, &st) == 0) {
        s = add_shard(dir, single_path) < 0 ? kt_err_set(err, KT_ERR_NOMEM, "%s: out of memory", path)
                                            : map_and_parse(dir, 0, err);
        if (!s)
            s = build_index(dir, err);
    } else {
        s = kt_err_set(err, KT_ERR_NOT_FOUND, "%s: neither %s nor %s is there", path, KT_ST_INDEX_FILE,
                       KT_ST_SINGLE_FILE);
    }
    free(index_path);
    free(single_path);
    if (s) {
        kt_st_close(dir);
        return s;
    }
    *out = dir;
    return KT_OK;
}

/* ---- lookups ------------------------------------------------------------------------------ */

const struct kt_st_tensor *kt_st_find(const struct kt_st_dir *dir, const char *name)
{
    if (!dir || !name || !dir->n_tensors)
        return NULL;
    const struct st_internal *in = dir->internal;
    if (!in->tensors.slots)
        return NULL;
    uint64_t slot = index_probe(&in->tensors, name, tensor_name_of, dir);
    return in->tensors.slots[slot] ? &dir->tensors[in->tensors.slots[slot] - 1] : NULL;
}

kt_status kt_st_expect(const struct kt_st_dir *dir, const char *name, enum kt_st_dtype dtype, uint32_t rank,
                       const uint64_t *shape, const struct kt_st_tensor **out, kt_err *err)
{
    const struct kt_st_tensor *t = kt_st_find(dir, name);
    if (out)
        *out = NULL;
    if (!t)
        return kt_err_set(err, KT_ERR_NOT_FOUND, "tensor '%s' is missing", name);
    bool same = t->dtype == dtype && t->rank == rank;
    for (uint32_t d = 0; same && d < rank; d++)
        same = t->shape[d] == shape[d];
    if (!same) {
        struct kt_st_tensor want = {.rank = rank > KT_ST_MAX_RANK ? KT_ST_MAX_RANK : rank};
        for (uint32_t d = 0; d < want.rank; d++)
            want.shape[d] = shape[d];
        char have_buf[256], want_buf[256];
        return kt_err_set(err, KT_ERR_FORMAT, "%s: tensor '%s' is %s %s, expected %s %s",
                          dir->shards[t->shard].path, name, kt_st_dtype_name(t->dtype),
                          shape_text(t, have_buf, sizeof have_buf), kt_st_dtype_name(dtype),
                          shape_text(&want, want_buf, sizeof want_buf));
    }
    if (out)
        *out = t;
    return KT_OK;
}
