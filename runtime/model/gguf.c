/*
 * gguf.c - GGUF v2/v3 reader (mmap or caller buffer) and streaming writer.
 *
 * The reader trusts nothing in the file: every count, length, offset and
 * tensor extent is compared with the bytes that remain before it is used, all
 * arithmetic on file values is overflow-checked, and no allocation is sized by
 * a count that has not first been bounded by the file size.  It must never
 * read outside [base, base + file_bytes), never abort on bad input, and never
 * write to the mapping.  The writer keeps only metadata in memory; tensor data
 * passes straight through to the file, so memory stays bounded whatever the
 * file size.  It must never leave a partial file under the final name.
 *
 * Layout (all little-endian):
 *   "GGUF" | u32 version | u64 n_tensors | u64 n_kv
 *   n_kv x  { string key | u32 type | value }
 *   n_tensors x { string name | u32 n_dims | i64 ne[n_dims] | i32 type | u64 offset }
 *   zero padding to general.alignment, then the data section; each tensor's
 *   offset is relative to the data section and a multiple of the alignment.
 *   string = u64 length + bytes; array = u32 elem type | u64 count | elements.
 */
#include "gguf.h"

#include "quant.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "gguf.c reads and writes GGUF scalars in host order: little-endian hosts only"
#endif

/* Smallest possible records, used to bound counts by the bytes left. */
#define MIN_KV_RECORD_BYTES (8 + 4 + 1)               /* empty key, type, one-byte value */
#define MIN_TENSOR_INFO_BYTES (8 + 4 + 8 + 4 + 8)     /* empty name, n_dims, one ne, type, offset */
#define MIN_STRING_BYTES 8
#define MIN_ARRAY_BYTES (4 + 8)
#define MAX_INDEXED ((uint64_t)UINT32_MAX - 1)        /* index slots hold index + 1 in a u32 */

/* ---- small helpers ------------------------------------------------------------- */

static bool add_overflows(uint64_t a, uint64_t b, uint64_t *sum)
{
    return __builtin_add_overflow(a, b, sum);
}

static bool mul_overflows(uint64_t a, uint64_t b, uint64_t *product)
{
    return __builtin_mul_overflow(a, b, product);
}

static bool is_pow2(uint64_t x)
{
    return x != 0 && (x & (x - 1)) == 0;
}

/* align_up for a power-of-two alignment; false on overflow. */
static bool align_up(uint64_t x, uint64_t alignment, uint64_t *out)
{
    uint64_t t;
    if (add_overflows(x, alignment - 1, &t))
        return false;
    *out = t & ~(alignment - 1);
    return true;
}

static uint64_t hash_bytes(const char *s, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ULL; /* FNV-1a */
    for (size_t i = 0; i < n; i++) {
        h ^= (uint8_t)s[i];
        h *= 0x100000001b3ULL;
    }
    return h;
}

size_t kt_gguf_type_size(enum kt_gguf_type t)
{
    switch (t) {
    case KT_GGUF_UINT8: case KT_GGUF_INT8: case KT_GGUF_BOOL: return 1;
    case KT_GGUF_UINT16: case KT_GGUF_INT16: return 2;
    case KT_GGUF_UINT32: case KT_GGUF_INT32: case KT_GGUF_FLOAT32: return 4;
    case KT_GGUF_UINT64: case KT_GGUF_INT64: case KT_GGUF_FLOAT64: return 8;
    case KT_GGUF_STRING: case KT_GGUF_ARRAY: case KT_GGUF_TYPE_COUNT: return 0;
    }
    return 0;
}

const char *kt_gguf_type_name(enum kt_gguf_type t)
{
    switch (t) {
    case KT_GGUF_UINT8: return "uint8";
    case KT_GGUF_INT8: return "int8";
    case KT_GGUF_UINT16: return "uint16";
    case KT_GGUF_INT16: return "int16";
    case KT_GGUF_UINT32: return "uint32";
    case KT_GGUF_INT32: return "int32";
    case KT_GGUF_FLOAT32: return "float32";
    case KT_GGUF_BOOL: return "bool";
    case KT_GGUF_STRING: return "string";
    case KT_GGUF_ARRAY: return "array";
    case KT_GGUF_UINT64: return "uint64";
    case KT_GGUF_INT64: return "int64";
    case KT_GGUF_FLOAT64: return "float64";
    case KT_GGUF_TYPE_COUNT: break;
    }
    return "unknown";
}

static bool type_is_valid(uint32_t t)
{
    return t < KT_GGUF_TYPE_COUNT;
}

/* Bytes of a tensor, or false if ne[0] is not a whole number of blocks or the
 * size overflows.  ne entries must already be known non-negative. */
static bool tensor_nbytes(const struct kt_type_traits *tr, const int64_t ne[KT_GGUF_MAX_DIMS], uint64_t *out)
{
    if (ne[0] % tr->block_elems != 0)
        return false;
    uint64_t bytes;
    if (mul_overflows((uint64_t)(ne[0] / tr->block_elems), tr->block_bytes, &bytes))
        return false;
    for (int d = 1; d < KT_GGUF_MAX_DIMS; d++)
        if (mul_overflows(bytes, (uint64_t)ne[d], &bytes))
            return false;
    *out = bytes;
    return true;
}

/* Element count, or false if it exceeds INT64_MAX (ggml's limit). */
static bool tensor_nelements(const int64_t ne[KT_GGUF_MAX_DIMS], uint64_t *out)
{
    uint64_t n = 1;
    for (int d = 0; d < KT_GGUF_MAX_DIMS; d++)
        if (mul_overflows(n, (uint64_t)ne[d], &n) || n > (uint64_t)INT64_MAX)
            return false;
    *out = n;
    return true;
}

/* ---- arena: every reader allocation, freed at once on close -------------------- */

struct arena_chunk {
    struct arena_chunk *next;
    size_t used, cap;
    max_align_t data[];
};

struct arena {
    struct arena_chunk *head;
};

#define ARENA_CHUNK_BYTES ((size_t)64 << 10)

/* Zeroed memory for n bytes, or NULL. */
static void *arena_alloc(struct arena *a, size_t n)
{
    const size_t align = sizeof(max_align_t);
    if (n > SIZE_MAX - align)
        return NULL;
    n = (n + align - 1) / align * align;
    if (n == 0)
        n = align;
    struct arena_chunk *c = a->head;
    if (!c || c->cap - c->used < n) {
        size_t cap = n > ARENA_CHUNK_BYTES / 4 ? n : ARENA_CHUNK_BYTES;
        if (cap > SIZE_MAX - sizeof *c)
            return NULL;
        c = calloc(1, sizeof *c + cap);
        if (!c)
            return NULL;
        c->cap = cap;
        if (cap != ARENA_CHUNK_BYTES && a->head) {
            /* a big one-off: keep the current small chunk at the head */
            c->next = a->head->next;
            a->head->next = c;
        } else {
            c->next = a->head;
            a->head = c;
        }
    }
    void *p = (char *)c->data + c->used;
    c->used += n;
    return p;
}

static void arena_free(struct arena *a)
{
    struct arena_chunk *c = a->head;
    while (c) {
        struct arena_chunk *next = c->next;
        free(c);
        c = next;
    }
    a->head = NULL;
}

/* ---- name index: open addressing, slot = index + 1, 0 empty --------------------- */

struct name_index {
    uint32_t *slots;
    uint64_t mask;
};

static bool index_init(struct name_index *ix, struct arena *a, uint64_t n)
{
    uint64_t cap = 8;
    while (cap < 2 * n)
        cap <<= 1;
    ix->slots = arena_alloc(a, (size_t)cap * sizeof *ix->slots);
    ix->mask = cap - 1;
    return ix->slots != NULL;
}

/* Finds name; returns the slot where it is or where it would go. */
static uint64_t index_probe(const struct name_index *ix, const char *name, size_t len,
                            const char *(*name_of)(const void *, uint32_t), const void *ctx)
{
    uint64_t i = hash_bytes(name, len) & ix->mask;
    while (ix->slots[i]) {
        const char *other = name_of(ctx, ix->slots[i] - 1);
        if (strncmp(other, name, len) == 0 && other[len] == '\0')
            return i;
        i = (i + 1) & ix->mask;
    }
    return i;
}

static const char *kv_name_of(const void *ctx, uint32_t i)
{
    return ((const struct kt_gguf *)ctx)->kv[i].key;
}

static const char *tensor_name_of(const void *ctx, uint32_t i)
{
    return ((const struct kt_gguf *)ctx)->tensors[i].name;
}

/* ---- reader ---------------------------------------------------------------------- */

struct reader_internal {
    struct arena arena;
    struct name_index kv_index;
    struct name_index tensor_index;
    void *map;          /* mmap'd region, NULL for caller buffers */
    size_t map_bytes;
    void (*release)(void *owner); /* kt_gguf_from_parts: frees what kv and tensors point into */
    void *owner;
};

struct parser {
    const uint8_t *base;
    uint64_t size;
    uint64_t pos;
    struct kt_gguf *g;
    struct arena *arena;
    kt_err *err;
    char where[192]; /* the record being parsed, for messages */
};

static kt_status parse_fail(struct parser *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static kt_status parse_fail(struct parser *p, const char *fmt, ...)
{
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return kt_err_set(p->err, KT_ERR_FORMAT, "%s: %s", p->where, msg);
}

static kt_status nomem(struct parser *p)
{
    return kt_err_set(p->err, KT_ERR_NOMEM, "%s: out of memory", p->where);
}

static uint64_t bytes_left(const struct parser *p)
{
    return p->size - p->pos;
}

/* Checks that n more bytes exist; what names the field. */
static kt_status need(struct parser *p, uint64_t n, const char *what)
{
    if (n > bytes_left(p))
        return parse_fail(p, "%s at byte %" PRIu64 " needs %" PRIu64 " bytes but the file ends at byte %" PRIu64
                          " (%" PRIu64 " left)", what, p->pos, n, p->size, bytes_left(p));
    return KT_OK;
}

static kt_status read_bytes(struct parser *p, void *dst, uint64_t n, const char *what)
{
    kt_status s = need(p, n, what);
    if (s)
        return s;
    memcpy(dst, p->base + p->pos, (size_t)n);
    p->pos += n;
    return KT_OK;
}

static kt_status read_u32(struct parser *p, uint32_t *v, const char *what)
{
    return read_bytes(p, v, sizeof *v, what);
}

static kt_status read_u64(struct parser *p, uint64_t *v, const char *what)
{
    return read_bytes(p, v, sizeof *v, what);
}

/* A string in place: the length is checked against the bytes left.  Hot for
 * vocabularies, so the message is only formatted on failure. */
static kt_status read_str(struct parser *p, struct kt_gguf_str *s, const char *what)
{
    uint64_t at = p->pos;
    uint64_t len;
    if (bytes_left(p) < sizeof len)
        return parse_fail(p, "%s length at byte %" PRIu64 " needs 8 bytes but the file ends at byte %" PRIu64
                          " (%" PRIu64 " left)", what, at, p->size, bytes_left(p));
    memcpy(&len, p->base + p->pos, sizeof len);
    p->pos += sizeof len;
    if (len > bytes_left(p))
        return parse_fail(p, "%s at byte %" PRIu64 " has length %" PRIu64 " but only %" PRIu64
                          " bytes are left in the file", what, at, len, bytes_left(p));
    s->ptr = (const char *)p->base + p->pos;
    s->len = len;
    p->pos += len;
    return KT_OK;
}

static kt_status parse_value(struct parser *p, enum kt_gguf_type type, struct kt_gguf_value *v, int level);

static kt_status parse_array(struct parser *p, struct kt_gguf_array *a, int level)
{
    uint64_t at = p->pos;
    if (level > KT_GGUF_MAX_DEPTH)
        return parse_fail(p, "array at byte %" PRIu64 " is nested %d deep (the limit is %d)", at, level,
                          KT_GGUF_MAX_DEPTH);
    uint32_t elem_type;
    kt_status s = read_u32(p, &elem_type, "array element type");
    if (s)
        return s;
    if (!type_is_valid(elem_type))
        return parse_fail(p, "array at byte %" PRIu64 " has unknown element type %" PRIu32, at, elem_type);
    uint64_t count;
    if ((s = read_u64(p, &count, "array count")))
        return s;
    a->elem_type = (enum kt_gguf_type)elem_type;
    a->count = count;
    size_t elem_bytes = kt_gguf_type_size(a->elem_type);
    if (elem_bytes) {
        if (count > bytes_left(p) / elem_bytes)
            return parse_fail(p, "array at byte %" PRIu64 " of %" PRIu64 " %s elements needs more than the %" PRIu64
                              " bytes left in the file", at, count, kt_gguf_type_name(a->elem_type), bytes_left(p));
        a->data = p->base + p->pos;
        p->pos += count * elem_bytes;
        return KT_OK;
    }
    uint64_t min_bytes = a->elem_type == KT_GGUF_STRING ? MIN_STRING_BYTES : MIN_ARRAY_BYTES;
    if (count > bytes_left(p) / min_bytes)
        return parse_fail(p, "array at byte %" PRIu64 " claims %" PRIu64 " %s elements but only %" PRIu64
                          " bytes are left in the file", at, count, kt_gguf_type_name(a->elem_type), bytes_left(p));
    if (count > SIZE_MAX / sizeof *a->items)
        return nomem(p);
    a->items = count ? arena_alloc(p->arena, (size_t)count * sizeof *a->items) : NULL;
    if (count && !a->items)
        return nomem(p);
    for (uint64_t i = 0; i < count; i++) {
        a->items[i].type = a->elem_type;
        if ((s = parse_value(p, a->elem_type, &a->items[i], level)))
            return s;
    }
    return KT_OK;
}

/* level: how many arrays enclose this value.  type is already known valid. */
static kt_status parse_value(struct parser *p, enum kt_gguf_type type, struct kt_gguf_value *v, int level)
{
    v->type = type;
    if (type == KT_GGUF_STRING)
        return read_str(p, &v->str, "string");
    if (type == KT_GGUF_ARRAY)
        return parse_array(p, &v->arr, level + 1);
    if (type == KT_GGUF_BOOL) {
        uint8_t b = 0;
        kt_status s = read_bytes(p, &b, 1, "bool value");
        v->b = b != 0;
        return s;
    }
    /* a fixed-size scalar: the union's members share their first bytes */
    return read_bytes(p, &v->u64, kt_gguf_type_size(type), kt_gguf_type_name(type));
}

static kt_status parse_header(struct parser *p)
{
    struct kt_gguf *g = p->g;
    snprintf(p->where, sizeof p->where, "header");
    if (p->size < 4)
        return parse_fail(p, "file is %" PRIu64 " bytes, too short for a GGUF header (24 bytes)", p->size);
    if (memcmp(p->base, KT_GGUF_MAGIC, 4) != 0)
        return parse_fail(p, "not a GGUF file: magic is %02x %02x %02x %02x, expected 47 47 55 46 (\"GGUF\")",
                          p->base[0], p->base[1], p->base[2], p->base[3]);
    p->pos = 4;
    uint32_t version;
    kt_status s = read_u32(p, &version, "version");
    if (s)
        return s;
    uint32_t swapped = __builtin_bswap32(version);
    if (version == 1)
        return parse_fail(p, "GGUF version 1 is not supported (it predates 64-bit counts); re-convert the model "
                          "with a current converter");
    if ((version & 0xffff) == 0 && swapped >= 1 && swapped <= 3)
        return parse_fail(p, "file is big-endian (version field reads 0x%08" PRIx32 ", version %" PRIu32
                          " byte-swapped); kt reads little-endian GGUF only", version, swapped);
    if (version != 2 && version != 3)
        return parse_fail(p, "unsupported GGUF version %" PRIu32 " (kt reads versions 2 and 3)", version);
    g->version = version;
    if ((s = read_u64(p, &g->n_tensors, "tensor count")) || (s = read_u64(p, &g->n_kv, "metadata count")))
        return s;
    /* Bound both counts by the smallest records that could hold them. */
    uint64_t kv_min, tensor_min, total;
    if (mul_overflows(g->n_kv, MIN_KV_RECORD_BYTES, &kv_min) ||
        mul_overflows(g->n_tensors, MIN_TENSOR_INFO_BYTES, &tensor_min) ||
        add_overflows(kv_min, tensor_min, &total) || total > bytes_left(p))
        return parse_fail(p, "%" PRIu64 " metadata records and %" PRIu64 " tensor infos cannot fit in the %" PRIu64
                          " bytes after the header", g->n_kv, g->n_tensors, bytes_left(p));
    if (g->n_kv > MAX_INDEXED || g->n_tensors > MAX_INDEXED)
        return parse_fail(p, "more than %" PRIu64 " metadata records or tensors", MAX_INDEXED);
    return KT_OK;
}

static kt_status parse_kvs(struct parser *p)
{
    struct kt_gguf *g = p->g;
    struct reader_internal *in = g->internal;
    snprintf(p->where, sizeof p->where, "metadata");
    if (!index_init(&in->kv_index, p->arena, g->n_kv))
        return nomem(p);
    if (g->n_kv && !(g->kv = arena_alloc(p->arena, (size_t)g->n_kv * sizeof *g->kv)))
        return nomem(p);
    for (uint64_t i = 0; i < g->n_kv; i++) {
        struct kt_gguf_kv *kv = &g->kv[i];
        kv->file_offset = p->pos;
        snprintf(p->where, sizeof p->where, "metadata record %" PRIu64 " (at byte %" PRIu64 ")", i, p->pos);
        struct kt_gguf_str key = {0};
        kt_status s = read_str(p, &key, "key");
        if (s)
            return s;
        if (memchr(key.ptr, '\0', (size_t)key.len))
            return parse_fail(p, "key contains a NUL byte");
        if (!(kv->key = arena_alloc(p->arena, (size_t)key.len + 1)))
            return nomem(p);
        memcpy(kv->key, key.ptr, (size_t)key.len);
        snprintf(p->where, sizeof p->where, "key '%.100s' (at byte %" PRIu64 ")", kv->key, kv->file_offset);
        uint64_t slot = index_probe(&in->kv_index, kv->key, (size_t)key.len, kv_name_of, g);
        if (in->kv_index.slots[slot])
            return parse_fail(p, "duplicate key (first defined at byte %" PRIu64 ")",
                              g->kv[in->kv_index.slots[slot] - 1].file_offset);
        uint64_t type_at = p->pos;
        uint32_t type;
        if ((s = read_u32(p, &type, "value type")))
            return s;
        if (!type_is_valid(type))
            return parse_fail(p, "unknown value type %" PRIu32 " at byte %" PRIu64, type, type_at);
        if ((s = parse_value(p, (enum kt_gguf_type)type, &kv->value, 0)))
            return s;
        in->kv_index.slots[slot] = (uint32_t)i + 1;
    }
    return KT_OK;
}

static kt_status parse_alignment(struct parser *p)
{
    struct kt_gguf *g = p->g;
    g->alignment = KT_GGUF_DEFAULT_ALIGNMENT;
    const struct kt_gguf_kv *kv = kt_gguf_find_kv(g, "general.alignment");
    if (!kv)
        return KT_OK;
    snprintf(p->where, sizeof p->where, "key 'general.alignment' (at byte %" PRIu64 ")", kv->file_offset);
    if (kv->value.type != KT_GGUF_UINT32)
        return parse_fail(p, "has type %s, must be uint32", kt_gguf_type_name(kv->value.type));
    if (!is_pow2(kv->value.u32))
        return parse_fail(p, "alignment %" PRIu32 " is not a power of two", kv->value.u32);
    g->alignment = kv->value.u32;
    return KT_OK;
}

static kt_status parse_tensor_infos(struct parser *p)
{
    struct kt_gguf *g = p->g;
    struct reader_internal *in = g->internal;
    snprintf(p->where, sizeof p->where, "tensor infos");
    if (!index_init(&in->tensor_index, p->arena, g->n_tensors))
        return nomem(p);
    if (g->n_tensors && !(g->tensors = arena_alloc(p->arena, (size_t)g->n_tensors * sizeof *g->tensors)))
        return nomem(p);
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        struct kt_gguf_tensor *t = &g->tensors[i];
        t->info_offset = p->pos;
        snprintf(p->where, sizeof p->where, "tensor info %" PRIu64 " (at byte %" PRIu64 ")", i, p->pos);
        struct kt_gguf_str name = {0};
        kt_status s = read_str(p, &name, "tensor name");
        if (s)
            return s;
        if (name.len >= KT_GGUF_MAX_NAME)
            return parse_fail(p, "tensor name is %" PRIu64 " bytes long; names must be shorter than %d", name.len,
                              KT_GGUF_MAX_NAME);
        if (memchr(name.ptr, '\0', (size_t)name.len))
            return parse_fail(p, "tensor name contains a NUL byte");
        memcpy(t->name, name.ptr, (size_t)name.len);
        t->name[name.len] = '\0';
        snprintf(p->where, sizeof p->where, "tensor '%s' (info at byte %" PRIu64 ")", t->name, t->info_offset);
        uint64_t slot = index_probe(&in->tensor_index, t->name, (size_t)name.len, tensor_name_of, g);
        if (in->tensor_index.slots[slot])
            return parse_fail(p, "duplicate tensor name (first defined at byte %" PRIu64 ")",
                              g->tensors[in->tensor_index.slots[slot] - 1].info_offset);

        if ((s = read_u32(p, &t->n_dims, "n_dims")))
            return s;
        if (t->n_dims < 1 || t->n_dims > KT_GGUF_MAX_DIMS)
            return parse_fail(p, "n_dims is %" PRIu32 ", must be 1..%d", t->n_dims, KT_GGUF_MAX_DIMS);
        for (int d = 0; d < KT_GGUF_MAX_DIMS; d++)
            t->ne[d] = 1;
        for (uint32_t d = 0; d < t->n_dims; d++) {
            uint64_t at = p->pos;
            if ((s = read_bytes(p, &t->ne[d], sizeof t->ne[d], "dimension")))
                return s;
            if (t->ne[d] < 0)
                return parse_fail(p, "ne[%" PRIu32 "] at byte %" PRIu64 " is negative (%" PRId64 ")", d, at, t->ne[d]);
        }
        uint64_t nelements;
        if (!tensor_nelements(t->ne, &nelements))
            return parse_fail(p, "shape [%" PRId64 ", %" PRId64 ", %" PRId64 ", %" PRId64 "] has more than 2^63 elements",
                              t->ne[0], t->ne[1], t->ne[2], t->ne[3]);
        uint64_t type_at = p->pos;
        uint32_t type;
        if ((s = read_u32(p, &type, "tensor type")))
            return s;
        const struct kt_type_traits *tr = kt_type_traits((int)type);
        if (type >= KT_TYPE_GGUF_END || !tr || tr->block_elems <= 0 || tr->block_bytes == 0) /* kt's own ids too */
            return parse_fail(p, "unknown tensor type %" PRIu32 " at byte %" PRIu64, type, type_at);
        t->type = (int)type;
        if (t->ne[0] % tr->block_elems != 0)
            return parse_fail(p, "ne[0] = %" PRId64 " is not a multiple of the %s block size %" PRId64, t->ne[0],
                              tr->name, tr->block_elems);
        if (!tensor_nbytes(tr, t->ne, &t->nbytes))
            return parse_fail(p, "size of shape [%" PRId64 ", %" PRId64 ", %" PRId64 ", %" PRId64 "] of %s overflows",
                              t->ne[0], t->ne[1], t->ne[2], t->ne[3], tr->name);
        uint64_t offset_at = p->pos;
        if ((s = read_u64(p, &t->offset, "tensor data offset")))
            return s;
        if (t->offset % g->alignment != 0)
            return parse_fail(p, "data offset %" PRIu64 " at byte %" PRIu64 " is not a multiple of the alignment %" PRIu32,
                              t->offset, offset_at, g->alignment);
        in->tensor_index.slots[slot] = (uint32_t)i + 1;
    }
    return KT_OK;
}

struct extent {
    uint64_t begin, end; /* relative to the data section */
    uint64_t index;
};

static int extent_cmp(const void *a, const void *b)
{
    const struct extent *x = a, *y = b;
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end)
        return x->end < y->end ? -1 : 1;
    return x->index < y->index ? -1 : x->index > y->index;
}

/* Places the data section, checks every extent lies inside the file and that
 * no two tensors share a byte. */
static kt_status check_tensor_data(struct parser *p)
{
    struct kt_gguf *g = p->g;
    snprintf(p->where, sizeof p->where, "tensor infos");
    if (!align_up(p->pos, g->alignment, &g->data_offset))
        return parse_fail(p, "data section offset overflows");
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        struct kt_gguf_tensor *t = &g->tensors[i];
        snprintf(p->where, sizeof p->where, "tensor '%s' (info at byte %" PRIu64 ")", t->name, t->info_offset);
        uint64_t begin, end;
        if (add_overflows(g->data_offset, t->offset, &begin) || add_overflows(begin, t->nbytes, &end))
            return parse_fail(p, "data at data section %" PRIu64 " + offset %" PRIu64 " + %" PRIu64
                              " bytes overflows", g->data_offset, t->offset, t->nbytes);
        if (end > g->file_bytes)
            return parse_fail(p, "data [%" PRIu64 ", %" PRIu64 ") extends past end of file (%" PRIu64 " bytes)",
                              begin, end, g->file_bytes);
        t->data = g->base + begin;
    }
    if (g->n_tensors < 2)
        return KT_OK;
    struct extent *ex = malloc((size_t)g->n_tensors * sizeof *ex);
    if (!ex)
        return nomem(p);
    for (uint64_t i = 0; i < g->n_tensors; i++)
        ex[i] = (struct extent){g->tensors[i].offset, g->tensors[i].offset + g->tensors[i].nbytes, i};
    qsort(ex, (size_t)g->n_tensors, sizeof *ex, extent_cmp);
    kt_status s = KT_OK;
    uint64_t reach = 0, reach_index = 0; /* furthest end so far, and whose */
    for (uint64_t i = 0; i < g->n_tensors && !s; i++) {
        const struct extent *e = &ex[i];
        if (e->end > e->begin && e->begin < reach) {
            const struct kt_gguf_tensor *t = &g->tensors[e->index], *o = &g->tensors[reach_index];
            snprintf(p->where, sizeof p->where, "tensor '%s' (info at byte %" PRIu64 ")", t->name, t->info_offset);
            s = parse_fail(p, "data [%" PRIu64 ", %" PRIu64 ") overlaps tensor '%s' (info at byte %" PRIu64
                           ") at [%" PRIu64 ", %" PRIu64 ")", g->data_offset + e->begin, g->data_offset + e->end,
                           o->name, o->info_offset, g->data_offset + o->offset, g->data_offset + o->offset + o->nbytes);
        }
        if (e->end > reach) {
            reach = e->end;
            reach_index = e->index;
        }
    }
    free(ex);
    return s;
}

static kt_status parse(struct kt_gguf *g, kt_err *err)
{
    struct reader_internal *in = g->internal;
    struct parser p = {.base = g->base, .size = g->file_bytes, .g = g, .arena = &in->arena, .err = err};
    kt_status s;
    if ((s = parse_header(&p)) || (s = parse_kvs(&p)) || (s = parse_alignment(&p)) ||
        (s = parse_tensor_infos(&p)) || (s = check_tensor_data(&p)))
        return s;
    return KT_OK;
}

static kt_status open_common(struct kt_gguf *g, struct kt_gguf **out, kt_err *err)
{
    kt_status s = parse(g, err);
    if (s) {
        if (g->path[0])
            kt_err_prefix(err, "%s", g->path);
        kt_gguf_close(g);
        return s;
    }
    *out = g;
    return KT_OK;
}

/* base of empty inputs, so base is never NULL */
static const uint8_t k_empty[1];

static struct kt_gguf *gguf_alloc(void)
{
    struct kt_gguf *g = calloc(1, sizeof *g);
    struct reader_internal *in = calloc(1, sizeof *in);
    if (!g || !in) {
        free(g);
        free(in);
        return NULL;
    }
    g->internal = in;
    return g;
}

kt_status kt_gguf_open_memory(const void *data, size_t bytes, struct kt_gguf **out, kt_err *err)
{
    if (!out)
        return kt_err_set(err, KT_ERR_INVALID, "kt_gguf_open_memory: out is NULL");
    *out = NULL;
    if (!data && bytes)
        return kt_err_set(err, KT_ERR_INVALID, "kt_gguf_open_memory: NULL buffer of %zu bytes", bytes);
    struct kt_gguf *g = gguf_alloc();
    if (!g)
        return kt_err_set(err, KT_ERR_NOMEM, "out of memory opening a GGUF buffer");
    g->base = data ? data : k_empty;
    g->file_bytes = bytes;
    return open_common(g, out, err);
}

kt_status kt_gguf_open(const char *path, struct kt_gguf **out, kt_err *err)
{
    if (!out || !path)
        return kt_err_set(err, KT_ERR_INVALID, "kt_gguf_open: NULL argument");
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return kt_err_set(err, KT_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return kt_err_set(err, KT_ERR_IO, "%s: cannot stat: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return kt_err_set(err, KT_ERR_IO, "%s: not a regular file", path);
    }
    if ((uint64_t)st.st_size > SIZE_MAX) {
        close(fd);
        return kt_err_set(err, KT_ERR_IO, "%s: file too large to map", path);
    }
    /* An empty file cannot be mapped; it is parsed as an empty buffer so the
     * message matches open_memory's. */
    size_t bytes = (size_t)st.st_size;
    void *map = bytes ? mmap(NULL, bytes, PROT_READ, MAP_SHARED, fd, 0) : NULL;
    int map_errno = errno;
    close(fd);
    if (map == MAP_FAILED)
        return kt_err_set(err, KT_ERR_IO, "%s: cannot mmap %zu bytes: %s", path, bytes, strerror(map_errno));
    struct kt_gguf *g = gguf_alloc();
    if (!g) {
        if (map)
            munmap(map, bytes);
        return kt_err_set(err, KT_ERR_NOMEM, "%s: out of memory", path);
    }
    struct reader_internal *in = g->internal;
    in->map = map;
    in->map_bytes = bytes;
    g->base = map ? map : k_empty;
    g->file_bytes = bytes;
    snprintf(g->path, sizeof g->path, "%s", path);
    return open_common(g, out, err);
}

kt_status kt_gguf_from_parts(struct kt_gguf_kv *kv, uint64_t n_kv, struct kt_gguf_tensor *tensors,
                             uint64_t n_tensors, void (*release)(void *owner), void *owner, const char *path,
                             struct kt_gguf **out, kt_err *err)
{
    *out = NULL;
    struct kt_gguf *g = gguf_alloc();
    if (!g) {
        if (release)
            release(owner);
        return kt_err_set(err, KT_ERR_NOMEM, "%s: out of memory", path);
    }
    struct reader_internal *in = g->internal;
    in->release = release, in->owner = owner;
    g->version = KT_GGUF_VERSION;
    g->alignment = KT_GGUF_DEFAULT_ALIGNMENT;
    g->kv = kv, g->n_kv = n_kv;
    g->tensors = tensors, g->n_tensors = n_tensors;
    g->base = k_empty;
    snprintf(g->path, sizeof g->path, "%s", path);
    kt_status st = KT_OK;
    if (n_kv > UINT32_MAX - 1 || n_tensors > UINT32_MAX - 1 || !index_init(&in->kv_index, &in->arena, n_kv) ||
        !index_init(&in->tensor_index, &in->arena, n_tensors))
        st = kt_err_set(err, KT_ERR_NOMEM, "%s: out of memory indexing %" PRIu64 " keys and %" PRIu64 " tensors", path,
                        n_kv, n_tensors);
    for (uint64_t i = 0; st == KT_OK && i < n_kv; i++) {
        uint64_t slot = index_probe(&in->kv_index, kv[i].key, strlen(kv[i].key), kv_name_of, g);
        if (in->kv_index.slots[slot])
            st = kt_err_set(err, KT_ERR_FORMAT, "%s: key %s given twice", path, kv[i].key);
        in->kv_index.slots[slot] = (uint32_t)i + 1;
    }
    for (uint64_t i = 0; st == KT_OK && i < n_tensors; i++) {
        const struct kt_gguf_tensor *t = &tensors[i];
        const struct kt_type_traits *tr = kt_type_traits(t->type);
        uint64_t nbytes = 0;
        if (!tr || tr->block_elems <= 0 || t->ne[0] % tr->block_elems != 0 || !tensor_nbytes(tr, t->ne, &nbytes) ||
            nbytes != t->nbytes || (!t->data && nbytes && t->source == KT_TENSOR_MAPPED) ||
            (t->data && t->source == KT_TENSOR_STREAMED) || t->source > KT_TENSOR_STREAMED) {
            st = kt_err_set(err, KT_ERR_FORMAT, "%s: tensor %s: type %s, shape [%" PRId64 ", %" PRId64 ", %" PRId64
                            ", %" PRId64 "] and %" PRIu64 " bytes do not agree", path, t->name, kt_type_name(t->type),
                            t->ne[0], t->ne[1], t->ne[2], t->ne[3], t->nbytes);
            break;
        }
        uint64_t slot = index_probe(&in->tensor_index, t->name, strlen(t->name), tensor_name_of, g);
        if (in->tensor_index.slots[slot])
            st = kt_err_set(err, KT_ERR_FORMAT, "%s: tensor %s given twice", path, t->name);
        in->tensor_index.slots[slot] = (uint32_t)i + 1;
    }
    if (st != KT_OK) {
        kt_gguf_close(g);
        return st;
    }
    *out = g;
    return KT_OK;
}

void kt_gguf_close(struct kt_gguf *g)
{
    if (!g)
        return;
    struct reader_internal *in = g->internal;
    if (in) {
        if (in->map)
            munmap(in->map, in->map_bytes);
        if (in->release)
            in->release(in->owner);
        arena_free(&in->arena);
        free(in);
    }
    free(g);
}

const struct kt_gguf_kv *kt_gguf_find_kv(const struct kt_gguf *g, const char *key)
{
    if (!g || !key || !g->n_kv)
        return NULL;
    const struct reader_internal *in = g->internal;
    uint64_t slot = index_probe(&in->kv_index, key, strlen(key), kv_name_of, g);
    uint32_t i = in->kv_index.slots[slot];
    return i ? &g->kv[i - 1] : NULL;
}

const struct kt_gguf_tensor *kt_gguf_find_tensor(const struct kt_gguf *g, const char *name)
{
    if (!g || !name || !g->n_tensors)
        return NULL;
    const struct reader_internal *in = g->internal;
    uint64_t slot = index_probe(&in->tensor_index, name, strlen(name), tensor_name_of, g);
    uint32_t i = in->tensor_index.slots[slot];
    return i ? &g->tensors[i - 1] : NULL;
}

/* ---- typed getters ------------------------------------------------------------- */

static kt_status find_typed(const struct kt_gguf *g, const char *key, const struct kt_gguf_kv **kv, kt_err *err)
{
    *kv = kt_gguf_find_kv(g, key);
    if (!*kv)
        return kt_err_set(err, KT_ERR_NOT_FOUND, "metadata key '%s' not found", key ? key : "(null)");
    return KT_OK;
}

static kt_status wrong_type(const struct kt_gguf_kv *kv, const char *expected, kt_err *err)
{
    return kt_err_set(err, KT_ERR_FORMAT, "metadata key '%s' (at byte %" PRIu64 ") has type %s, expected %s", kv->key,
                      kv->file_offset, kt_gguf_type_name(kv->value.type), expected);
}

/* Integer value (bool counts as 0/1); false for other types.  *is_big is set
 * for a uint64 above INT64_MAX, which does not fit *out. */
static bool value_as_int(const struct kt_gguf_value *v, int64_t *out, bool *is_big)
{
    *is_big = false;
    switch (v->type) {
    case KT_GGUF_UINT8: *out = v->u8; return true;
    case KT_GGUF_INT8: *out = v->i8; return true;
    case KT_GGUF_UINT16: *out = v->u16; return true;
    case KT_GGUF_INT16: *out = v->i16; return true;
    case KT_GGUF_UINT32: *out = v->u32; return true;
    case KT_GGUF_INT32: *out = v->i32; return true;
    case KT_GGUF_INT64: *out = v->i64; return true;
    case KT_GGUF_BOOL: *out = v->b; return true;
    case KT_GGUF_UINT64:
        *is_big = v->u64 > (uint64_t)INT64_MAX;
        *out = *is_big ? INT64_MAX : (int64_t)v->u64;
        return true;
    default: return false;
    }
}

kt_status kt_gguf_get_int(const struct kt_gguf *g, const char *key, int64_t *out, kt_err *err)
{
    const struct kt_gguf_kv *kv;
    kt_status s = find_typed(g, key, &kv, err);
    if (s)
        return s;
    bool big;
    if (!value_as_int(&kv->value, out, &big))
        return wrong_type(kv, "an integer", err);
    if (big)
        return kt_err_set(err, KT_ERR_FORMAT, "metadata key '%s' (at byte %" PRIu64 "): value %" PRIu64
                          " does not fit in int64", key, kv->file_offset, kv->value.u64);
    return KT_OK;
}

kt_status kt_gguf_get_uint32(const struct kt_gguf *g, const char *key, uint32_t *out, kt_err *err)
{
    const struct kt_gguf_kv *kv;
    kt_status s = find_typed(g, key, &kv, err);
    if (s)
        return s;
    int64_t v;
    bool big;
    if (!value_as_int(&kv->value, &v, &big))
        return wrong_type(kv, "an integer", err);
    if (big || v < 0 || v > (int64_t)UINT32_MAX) {
        char text[32];
        if (kv->value.type == KT_GGUF_UINT64)
            snprintf(text, sizeof text, "%" PRIu64, kv->value.u64);
        else
            snprintf(text, sizeof text, "%" PRId64, v);
        return kt_err_set(err, KT_ERR_FORMAT, "metadata key '%s' (at byte %" PRIu64 "): value %s is outside "
                          "[0, 4294967295]", key, kv->file_offset, text);
    }
    *out = (uint32_t)v;
    return KT_OK;
}

kt_status kt_gguf_get_float(const struct kt_gguf *g, const char *key, double *out, kt_err *err)
{
    const struct kt_gguf_kv *kv;
    kt_status s = find_typed(g, key, &kv, err);
    if (s)
        return s;
    int64_t v;
    bool big;
    if (kv->value.type == KT_GGUF_FLOAT32)
        *out = kv->value.f32;
    else if (kv->value.type == KT_GGUF_FLOAT64)
        *out = kv->value.f64;
    else if (kv->value.type == KT_GGUF_UINT64)
        *out = (double)kv->value.u64;
    else if (kv->value.type != KT_GGUF_BOOL && value_as_int(&kv->value, &v, &big))
        *out = (double)v;
    else
        return wrong_type(kv, "a number", err);
    return KT_OK;
}

kt_status kt_gguf_get_bool(const struct kt_gguf *g, const char *key, bool *out, kt_err *err)
{
    const struct kt_gguf_kv *kv;
    kt_status s = find_typed(g, key, &kv, err);
    if (s)
        return s;
    if (kv->value.type != KT_GGUF_BOOL)
        return wrong_type(kv, "bool", err);
    *out = kv->value.b;
    return KT_OK;
}

kt_status kt_gguf_get_str(const struct kt_gguf *g, const char *key, struct kt_gguf_str *out, kt_err *err)
{
    const struct kt_gguf_kv *kv;
    kt_status s = find_typed(g, key, &kv, err);
    if (s)
        return s;
    if (kv->value.type != KT_GGUF_STRING)
        return wrong_type(kv, "string", err);
    *out = kv->value.str;
    return KT_OK;
}

kt_status kt_gguf_get_array(const struct kt_gguf *g, const char *key, const struct kt_gguf_array **out, kt_err *err)
{
    const struct kt_gguf_kv *kv;
    kt_status s = find_typed(g, key, &kv, err);
    if (s)
        return s;
    if (kv->value.type != KT_GGUF_ARRAY)
        return wrong_type(kv, "array", err);
    *out = &kv->value.arr;
    return KT_OK;
}

/* Element i of a fixed-size array as a scalar value; false if not one. */
static bool array_elem(const struct kt_gguf_array *a, uint64_t i, struct kt_gguf_value *v)
{
    if (!a)
        return false;
    size_t size = kt_gguf_type_size(a->elem_type);
    if (!size || !a->data || i >= a->count)
        return false;
    v->type = a->elem_type;
    v->u64 = 0;
    const uint8_t *p = (const uint8_t *)a->data + i * size;
    if (a->elem_type == KT_GGUF_BOOL)
        v->b = p[0] != 0;
    else
        memcpy(&v->u64, p, size);
    return true;
}

bool kt_gguf_array_int(const struct kt_gguf_array *a, uint64_t i, int64_t *out)
{
    struct kt_gguf_value v;
    bool big;
    if (!a || !array_elem(a, i, &v) || !value_as_int(&v, out, &big) || big)
        return false;
    return true;
}

bool kt_gguf_array_float(const struct kt_gguf_array *a, uint64_t i, double *out)
{
    struct kt_gguf_value v;
    int64_t iv;
    bool big;
    if (!a || !array_elem(a, i, &v))
        return false;
    if (v.type == KT_GGUF_FLOAT32)
        *out = v.f32;
    else if (v.type == KT_GGUF_FLOAT64)
        *out = v.f64;
    else if (v.type == KT_GGUF_UINT64)
        *out = (double)v.u64;
    else if (value_as_int(&v, &iv, &big))
        *out = (double)iv;
    else
        return false;
    return true;
}

/* ---- writer ---------------------------------------------------------------------- */

/* A growable byte buffer for the encoded metadata. */
struct bytes {
    uint8_t *p;
    size_t len, cap;
};

static bool bytes_reserve(struct bytes *b, size_t more)
{
    if (more <= b->cap - b->len)
        return true;
    if (more > SIZE_MAX / 2 - b->len)
        return false;
    size_t cap = b->cap ? b->cap : 64;
    while (cap - b->len < more)
        cap *= 2;
    uint8_t *p = realloc(b->p, cap);
    if (!p)
        return false;
    b->p = p;
    b->cap = cap;
    return true;
}

static bool bytes_put(struct bytes *b, const void *src, size_t n)
{
    if (!bytes_reserve(b, n))
        return false;
    if (n)
        memcpy(b->p + b->len, src, n);
    b->len += n;
    return true;
}

static bool bytes_put_u32(struct bytes *b, uint32_t v)
{
    return bytes_put(b, &v, sizeof v);
}

static bool bytes_put_u64(struct bytes *b, uint64_t v)
{
    return bytes_put(b, &v, sizeof v);
}

static bool bytes_put_str(struct bytes *b, const char *s, uint64_t len)
{
    return len <= SIZE_MAX && bytes_put_u64(b, len) && bytes_put(b, s, (size_t)len);
}

struct writer_kv {
    char *key;
    struct bytes encoded; /* key string | type | value, exactly as written */
};

struct writer_tensor {
    char name[KT_GGUF_MAX_NAME];
    uint32_t n_dims;
    int64_t ne[KT_GGUF_MAX_DIMS];
    int type;
    uint64_t nbytes;
};

enum writer_state {
    WRITER_DECLARING, /* set / add_tensor allowed */
    WRITER_DATA,      /* header written, data streaming */
    WRITER_FINISHED,
    WRITER_FAILED,    /* an I/O error happened; only destroy is useful */
};

#define WRITER_BUFFER_BYTES ((size_t)1 << 20)

struct kt_gguf_writer {
    char *path, *tmp_path;
    int fd;
    enum writer_state state;
    uint32_t alignment;

    struct writer_kv *kv;
    size_t n_kv, cap_kv;

    struct writer_tensor *tensors;
    size_t n_tensors, cap_tensors;

    /* streaming position: tensor `cur`, `cur_written` of its bytes done */
    size_t cur;
    uint64_t cur_written;
    uint64_t data_left; /* declared tensor bytes not yet written */
    uint64_t file_pos;  /* bytes handed to the file so far (buffered or written) */

    uint8_t *buf; /* output buffer of WRITER_BUFFER_BYTES */
    size_t buf_len;
};

static kt_status writer_io_fail(struct kt_gguf_writer *w, kt_err *err, const char *what, int e)
{
    w->state = WRITER_FAILED;
    return kt_err_set(err, KT_ERR_IO, "%s: %s failed: %s", w->tmp_path, what, strerror(e));
}

static kt_status write_all(struct kt_gguf_writer *w, const void *src, size_t n, kt_err *err)
{
    const uint8_t *p = src;
    while (n > 0) {
        ssize_t k = write(w->fd, p, n);
        if (k < 0) {
            if (errno == EINTR)
                continue;
            return writer_io_fail(w, err, "write", errno);
        }
        if (k == 0)
            return writer_io_fail(w, err, "write", EIO);
        p += k;
        n -= (size_t)k;
    }
    return KT_OK;
}

static kt_status out_flush(struct kt_gguf_writer *w, kt_err *err)
{
    kt_status s = write_all(w, w->buf, w->buf_len, err);
    w->buf_len = 0;
    return s;
}

static kt_status out_write(struct kt_gguf_writer *w, const void *src, size_t n, kt_err *err)
{
    kt_status s = KT_OK;
    if (n > WRITER_BUFFER_BYTES - w->buf_len) {
        if ((s = out_flush(w, err)))
            return s;
    }
    if (n >= WRITER_BUFFER_BYTES) {
        s = write_all(w, src, n, err);
    } else if (n) {
        memcpy(w->buf + w->buf_len, src, n);
        w->buf_len += n;
    }
    if (!s)
        w->file_pos += n;
    return s;
}

static kt_status out_pad(struct kt_gguf_writer *w, kt_err *err)
{
    static const uint8_t zeros[4096];
    uint64_t end;
    if (!align_up(w->file_pos, w->alignment, &end))
        return kt_err_set(err, KT_ERR_INVALID, "%s: file size overflows", w->path);
    uint64_t n = end - w->file_pos;
    while (n > 0) {
        size_t k = n < sizeof zeros ? (size_t)n : sizeof zeros;
        kt_status s = out_write(w, zeros, k, err);
        if (s)
            return s;
        n -= k;
    }
    return KT_OK;
}

static kt_status writer_state_check(struct kt_gguf_writer *w, enum writer_state want, const char *fn, kt_err *err)
{
    if (!w)
        return kt_err_set(err, KT_ERR_INVALID, "%s: writer is NULL", fn);
    if (w->state == want)
        return KT_OK;
    static const char *const names[] = {"before the header", "after the header", "after finish", "after an error"};
    return kt_err_set(err, KT_ERR_INVALID, "%s: %s: not allowed %s", w->path, fn, names[w->state]);
}

kt_status kt_gguf_writer_create(const char *path, struct kt_gguf_writer **out, kt_err *err)
{
    if (!path || !out)
        return kt_err_set(err, KT_ERR_INVALID, "kt_gguf_writer_create: NULL argument");
    *out = NULL;
    struct kt_gguf_writer *w = calloc(1, sizeof *w);
    size_t len = strlen(path);
    if (!w || !(w->path = strdup(path)) || !(w->tmp_path = malloc(len + 5)) ||
        !(w->buf = malloc(WRITER_BUFFER_BYTES))) {
        if (w) {
            free(w->path);
            free(w->tmp_path);
        }
        free(w);
        return kt_err_set(err, KT_ERR_NOMEM, "%s: out of memory creating a GGUF writer", path);
    }
    memcpy(w->tmp_path, path, len);
    memcpy(w->tmp_path + len, ".tmp", 5);
    w->alignment = KT_GGUF_DEFAULT_ALIGNMENT;
    w->fd = open(w->tmp_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (w->fd < 0) {
        kt_status s = kt_err_set(err, KT_ERR_IO, "%s: cannot create: %s", w->tmp_path, strerror(errno));
        free(w->buf);
        free(w->path);
        free(w->tmp_path);
        free(w);
        return s;
    }
    *out = w;
    return KT_OK;
}

/* Appends the encoding of v (type id not included); level = enclosing arrays. */
static kt_status encode_value(struct bytes *b, const struct kt_gguf_value *v, int level, const char *key, kt_err *err)
{
    if (!type_is_valid((uint32_t)v->type))
        return kt_err_set(err, KT_ERR_INVALID, "key '%s': unknown value type %d", key, (int)v->type);
    size_t size = kt_gguf_type_size(v->type);
    bool ok;
    if (v->type == KT_GGUF_BOOL) {
        uint8_t byte = v->b ? 1 : 0;
        ok = bytes_put(b, &byte, 1);
    } else if (size) {
        ok = bytes_put(b, &v->u64, size); /* union members share their first bytes */
    } else if (v->type == KT_GGUF_STRING) {
        if (!v->str.ptr && v->str.len)
            return kt_err_set(err, KT_ERR_INVALID, "key '%s': string of %" PRIu64 " bytes has NULL data", key,
                              v->str.len);
        ok = bytes_put_str(b, v->str.ptr, v->str.len);
    } else {
        const struct kt_gguf_array *a = &v->arr;
        if (level + 1 > KT_GGUF_MAX_DEPTH)
            return kt_err_set(err, KT_ERR_INVALID, "key '%s': arrays nested deeper than %d", key, KT_GGUF_MAX_DEPTH);
        if (!type_is_valid((uint32_t)a->elem_type))
            return kt_err_set(err, KT_ERR_INVALID, "key '%s': unknown array element type %d", key, (int)a->elem_type);
        if (!bytes_put_u32(b, (uint32_t)a->elem_type) || !bytes_put_u64(b, a->count))
            return kt_err_set(err, KT_ERR_NOMEM, "key '%s': out of memory", key);
        size_t elem = kt_gguf_type_size(a->elem_type);
        if (elem) {
            uint64_t total;
            if (mul_overflows(a->count, elem, &total) || total > SIZE_MAX)
                return kt_err_set(err, KT_ERR_INVALID, "key '%s': array of %" PRIu64 " elements is too large", key,
                                  a->count);
            if (!a->data && a->count)
                return kt_err_set(err, KT_ERR_INVALID, "key '%s': array of %" PRIu64 " elements has NULL data", key,
                                  a->count);
            ok = bytes_put(b, a->data, (size_t)total);
        } else {
            if (!a->items && a->count)
                return kt_err_set(err, KT_ERR_INVALID, "key '%s': array of %" PRIu64 " elements has NULL items", key,
                                  a->count);
            ok = true;
            for (uint64_t i = 0; i < a->count; i++) {
                if (a->items[i].type != a->elem_type)
                    return kt_err_set(err, KT_ERR_INVALID, "key '%s': element %" PRIu64 " has type %s in an array of %s",
                                      key, i, kt_gguf_type_name(a->items[i].type), kt_gguf_type_name(a->elem_type));
                kt_status s = encode_value(b, &a->items[i], level + 1, key, err);
                if (s)
                    return s;
            }
        }
    }
    if (!ok)
        return kt_err_set(err, KT_ERR_NOMEM, "key '%s': out of memory", key);
    return KT_OK;
}

kt_status kt_gguf_writer_set(struct kt_gguf_writer *w, const char *key, const struct kt_gguf_value *v, kt_err *err)
{
    kt_status s = writer_state_check(w, WRITER_DECLARING, "set", err);
    if (s)
        return s;
    if (!key || !v)
        return kt_err_set(err, KT_ERR_INVALID, "%s: set: NULL key or value", w->path);
    bool is_alignment = strcmp(key, "general.alignment") == 0;
    if (is_alignment && (v->type != KT_GGUF_UINT32 || !is_pow2(v->u32)))
        return kt_err_set(err, KT_ERR_INVALID, "%s: general.alignment must be a uint32 power of two (got %s %s%" PRIu32 ")",
                          w->path, kt_gguf_type_name(v->type), v->type == KT_GGUF_UINT32 ? "" : "bits ", v->u32);

    struct bytes enc = {0};
    size_t key_len = strlen(key);
    if (!bytes_put_str(&enc, key, key_len) || !bytes_put_u32(&enc, (uint32_t)v->type)) {
        free(enc.p);
        return kt_err_set(err, KT_ERR_NOMEM, "key '%s': out of memory", key);
    }
    if ((s = encode_value(&enc, v, 0, key, err))) {
        free(enc.p);
        return s;
    }
    for (size_t i = 0; i < w->n_kv; i++) {
        if (strcmp(w->kv[i].key, key) == 0) {
            free(w->kv[i].encoded.p);
            w->kv[i].encoded = enc;
            if (is_alignment)
                w->alignment = v->u32;
            return KT_OK;
        }
    }
    if (w->n_kv == w->cap_kv) {
        size_t cap = w->cap_kv ? 2 * w->cap_kv : 16;
        struct writer_kv *kv = realloc(w->kv, cap * sizeof *kv);
        if (!kv) {
            free(enc.p);
            return kt_err_set(err, KT_ERR_NOMEM, "key '%s': out of memory", key);
        }
        w->kv = kv;
        w->cap_kv = cap;
    }
    char *copy = strdup(key);
    if (!copy) {
        free(enc.p);
        return kt_err_set(err, KT_ERR_NOMEM, "key '%s': out of memory", key);
    }
    w->kv[w->n_kv++] = (struct writer_kv){copy, enc};
    if (is_alignment)
        w->alignment = v->u32;
    return KT_OK;
}

kt_status kt_gguf_writer_set_u32(struct kt_gguf_writer *w, const char *key, uint32_t v, kt_err *err)
{
    struct kt_gguf_value val = {.type = KT_GGUF_UINT32, .u32 = v};
    return kt_gguf_writer_set(w, key, &val, err);
}

kt_status kt_gguf_writer_set_i32(struct kt_gguf_writer *w, const char *key, int32_t v, kt_err *err)
{
    struct kt_gguf_value val = {.type = KT_GGUF_INT32, .i32 = v};
    return kt_gguf_writer_set(w, key, &val, err);
}

kt_status kt_gguf_writer_set_u64(struct kt_gguf_writer *w, const char *key, uint64_t v, kt_err *err)
{
    struct kt_gguf_value val = {.type = KT_GGUF_UINT64, .u64 = v};
    return kt_gguf_writer_set(w, key, &val, err);
}

kt_status kt_gguf_writer_set_f32(struct kt_gguf_writer *w, const char *key, float v, kt_err *err)
{
    struct kt_gguf_value val = {.type = KT_GGUF_FLOAT32, .f32 = v};
    return kt_gguf_writer_set(w, key, &val, err);
}

kt_status kt_gguf_writer_set_bool(struct kt_gguf_writer *w, const char *key, bool v, kt_err *err)
{
    struct kt_gguf_value val = {.type = KT_GGUF_BOOL, .b = v};
    return kt_gguf_writer_set(w, key, &val, err);
}

kt_status kt_gguf_writer_set_str(struct kt_gguf_writer *w, const char *key, const char *v, kt_err *err)
{
    if (!v)
        return kt_err_set(err, KT_ERR_INVALID, "key '%s': NULL string", key ? key : "(null)");
    struct kt_gguf_value val = {.type = KT_GGUF_STRING, .str = {v, strlen(v)}};
    return kt_gguf_writer_set(w, key, &val, err);
}

kt_status kt_gguf_writer_set_array(struct kt_gguf_writer *w, const char *key, enum kt_gguf_type elem_type,
                                   const void *elems, uint64_t count, kt_err *err)
{
    if (!type_is_valid((uint32_t)elem_type) || !kt_gguf_type_size(elem_type))
        return kt_err_set(err, KT_ERR_INVALID, "key '%s': set_array needs a fixed-size element type, got %s",
                          key ? key : "(null)", kt_gguf_type_name(elem_type));
    struct kt_gguf_value val = {.type = KT_GGUF_ARRAY, .arr = {.elem_type = elem_type, .count = count, .data = elems}};
    return kt_gguf_writer_set(w, key, &val, err);
}

kt_status kt_gguf_writer_set_str_array(struct kt_gguf_writer *w, const char *key, const char *const *strs,
                                       uint64_t count, kt_err *err)
{
    if (count && !strs)
        return kt_err_set(err, KT_ERR_INVALID, "key '%s': NULL string array", key ? key : "(null)");
    if (count > SIZE_MAX / sizeof(struct kt_gguf_value))
        return kt_err_set(err, KT_ERR_INVALID, "key '%s': string array too large", key ? key : "(null)");
    struct kt_gguf_value *items = count ? malloc((size_t)count * sizeof *items) : NULL;
    if (count && !items)
        return kt_err_set(err, KT_ERR_NOMEM, "key '%s': out of memory", key ? key : "(null)");
    for (uint64_t i = 0; i < count; i++) {
        if (!strs[i]) {
            free(items);
            return kt_err_set(err, KT_ERR_INVALID, "key '%s': string %" PRIu64 " is NULL", key ? key : "(null)", i);
        }
        items[i] = (struct kt_gguf_value){.type = KT_GGUF_STRING, .str = {strs[i], strlen(strs[i])}};
    }
    struct kt_gguf_value val = {.type = KT_GGUF_ARRAY,
                                .arr = {.elem_type = KT_GGUF_STRING, .count = count, .items = items}};
    kt_status s = kt_gguf_writer_set(w, key, &val, err);
    free(items);
    return s;
}

kt_status kt_gguf_writer_add_tensor(struct kt_gguf_writer *w, const char *name, int type, uint32_t n_dims,
                                    const int64_t *ne, kt_err *err)
{
    kt_status s = writer_state_check(w, WRITER_DECLARING, "add_tensor", err);
    if (s)
        return s;
    if (!name || !ne)
        return kt_err_set(err, KT_ERR_INVALID, "%s: add_tensor: NULL name or shape", w->path);
    size_t len = strlen(name);
    if (len >= KT_GGUF_MAX_NAME)
        return kt_err_set(err, KT_ERR_INVALID, "tensor '%s': name is %zu bytes, must be shorter than %d", name, len,
                          KT_GGUF_MAX_NAME);
    if (n_dims < 1 || n_dims > KT_GGUF_MAX_DIMS)
        return kt_err_set(err, KT_ERR_INVALID, "tensor '%s': n_dims %" PRIu32 " is not 1..%d", name, n_dims,
                          KT_GGUF_MAX_DIMS);
    const struct kt_type_traits *tr = kt_type_traits(type);
    if (type >= KT_TYPE_GGUF_END || !tr || tr->block_elems <= 0 || tr->block_bytes == 0) /* no kt-internal ids */
        return kt_err_set(err, KT_ERR_INVALID, "tensor '%s': unknown type %d", name, type);
    struct writer_tensor t = {.n_dims = n_dims, .type = type};
    memcpy(t.name, name, len + 1);
    for (int d = 0; d < KT_GGUF_MAX_DIMS; d++)
        t.ne[d] = (uint32_t)d < n_dims ? ne[d] : 1;
    for (uint32_t d = 0; d < n_dims; d++)
        if (t.ne[d] < 0)
            return kt_err_set(err, KT_ERR_INVALID, "tensor '%s': ne[%" PRIu32 "] = %" PRId64 " is negative", name, d,
                              t.ne[d]);
    uint64_t nelements;
    if (t.ne[0] % tr->block_elems != 0)
        return kt_err_set(err, KT_ERR_INVALID, "tensor '%s': ne[0] = %" PRId64 " is not a multiple of the %s block "
                          "size %" PRId64, name, t.ne[0], tr->name, tr->block_elems);
    if (!tensor_nelements(t.ne, &nelements) || !tensor_nbytes(tr, t.ne, &t.nbytes))
        return kt_err_set(err, KT_ERR_INVALID, "tensor '%s': size overflows", name);
    for (size_t i = 0; i < w->n_tensors; i++)
        if (strcmp(w->tensors[i].name, name) == 0)
            return kt_err_set(err, KT_ERR_INVALID, "tensor '%s': declared twice (first as tensor %zu)", name, i);
    if (w->n_tensors == w->cap_tensors) {
        size_t cap = w->cap_tensors ? 2 * w->cap_tensors : 64;
        struct writer_tensor *p = realloc(w->tensors, cap * sizeof *p);
        if (!p)
            return kt_err_set(err, KT_ERR_NOMEM, "tensor '%s': out of memory", name);
        w->tensors = p;
        w->cap_tensors = cap;
    }
    w->tensors[w->n_tensors++] = t;
    return KT_OK;
}

/* Skips finished (incl. empty) tensors, padding each to the alignment. */
static kt_status advance_tensors(struct kt_gguf_writer *w, kt_err *err)
{
    while (w->cur < w->n_tensors && w->cur_written == w->tensors[w->cur].nbytes) {
        kt_status s = out_pad(w, err);
        if (s)
            return s;
        w->cur++;
        w->cur_written = 0;
    }
    return KT_OK;
}

kt_status kt_gguf_writer_write_header(struct kt_gguf_writer *w, kt_err *err)
{
    kt_status s = writer_state_check(w, WRITER_DECLARING, "write_header", err);
    if (s)
        return s;
    /* offset_i = sum of aligned sizes of the tensors before it, as ggml lays out */
    struct bytes infos = {0};
    uint64_t offset = 0, total = 0;
    for (size_t i = 0; i < w->n_tensors && !s; i++) {
        const struct writer_tensor *t = &w->tensors[i];
        bool ok = bytes_put_str(&infos, t->name, strlen(t->name)) && bytes_put_u32(&infos, t->n_dims) &&
                  bytes_put(&infos, t->ne, t->n_dims * sizeof t->ne[0]) && bytes_put_u32(&infos, (uint32_t)t->type) &&
                  bytes_put_u64(&infos, offset);
        uint64_t padded;
        if (!ok)
            s = kt_err_set(err, KT_ERR_NOMEM, "%s: out of memory", w->path);
        else if (!align_up(t->nbytes, w->alignment, &padded) || add_overflows(offset, padded, &offset) ||
                 add_overflows(total, t->nbytes, &total))
            s = kt_err_set(err, KT_ERR_INVALID, "tensor '%s': data section size overflows", t->name);
    }
    if (s) {
        free(infos.p);
        return s;
    }
    w->state = WRITER_DATA;
    w->data_left = total;
    struct {
        char magic[4];
        uint32_t version;
        uint64_t n_tensors, n_kv;
    } header = {{'G', 'G', 'U', 'F'}, KT_GGUF_VERSION, w->n_tensors, w->n_kv};
    static_assert(sizeof header == 24, "GGUF header is 24 bytes");
    s = out_write(w, &header, sizeof header, err);
    for (size_t i = 0; i < w->n_kv && !s; i++)
        s = out_write(w, w->kv[i].encoded.p, w->kv[i].encoded.len, err);
    if (!s)
        s = out_write(w, infos.p, infos.len, err);
    free(infos.p);
    if (!s)
        s = out_pad(w, err);
    if (!s)
        s = advance_tensors(w, err);
    if (s)
        w->state = WRITER_FAILED;
    return s;
}

kt_status kt_gguf_writer_write_data(struct kt_gguf_writer *w, const void *bytes, size_t n, kt_err *err)
{
    kt_status s = writer_state_check(w, WRITER_DATA, "write_data", err);
    if (s)
        return s;
    if (n > w->data_left)
        return kt_err_set(err, KT_ERR_INVALID, "%s: write_data of %zu bytes but only %" PRIu64 " declared bytes remain",
                          w->path, n, w->data_left);
    if (n && !bytes)
        return kt_err_set(err, KT_ERR_INVALID, "%s: write_data: NULL bytes", w->path);
    const uint8_t *p = bytes;
    while (n > 0) {
        uint64_t room = w->tensors[w->cur].nbytes - w->cur_written;
        size_t k = n < room ? n : (size_t)room;
        if ((s = out_write(w, p, k, err)))
            return s;
        p += k;
        n -= k;
        w->cur_written += k;
        w->data_left -= k;
        if ((s = advance_tensors(w, err)))
            return s;
    }
    return KT_OK;
}

/* Flushes, extends the file to `size` bytes when that is past what was written
 * (0: as written), fsyncs, closes and renames. */
static kt_status writer_close(struct kt_gguf_writer *w, uint64_t size, kt_err *err)
{
    kt_status s;
    if ((s = out_flush(w, err)))
        return s;
    if (size > w->file_pos && ftruncate(w->fd, (off_t)size) != 0)
        return writer_io_fail(w, err, "ftruncate", errno);
    if (fsync(w->fd) != 0)
        return writer_io_fail(w, err, "fsync", errno);
    int fd = w->fd;
    w->fd = -1;
    if (close(fd) != 0)
        return writer_io_fail(w, err, "close", errno);
    if (rename(w->tmp_path, w->path) != 0)
        return writer_io_fail(w, err, "rename", errno);
    w->state = WRITER_FINISHED;
    return KT_OK;
}

kt_status kt_gguf_writer_finish(struct kt_gguf_writer *w, kt_err *err)
{
    kt_status s;
    /* A metadata-only file needs no separate write_header call. */
    if (w && w->state == WRITER_DECLARING && (s = kt_gguf_writer_write_header(w, err)))
        return s;
    if ((s = writer_state_check(w, WRITER_DATA, "finish", err)))
        return s;
    if (w->data_left)
        return kt_err_set(err, KT_ERR_INVALID, "%s: finish: tensor '%s' and later still miss %" PRIu64 " bytes of data",
                          w->path, w->tensors[w->cur].name, w->data_left);
    return writer_close(w, 0, err);
}

kt_status kt_gguf_writer_finish_sparse(struct kt_gguf_writer *w, kt_err *err)
{
    kt_status s;
    if (w && w->state == WRITER_DECLARING && (s = kt_gguf_writer_write_header(w, err)))
        return s;
    if ((s = writer_state_check(w, WRITER_DATA, "finish_sparse", err)))
        return s;
    /* the size finish would reach: the rest of the current tensor, then each
     * later one, each padded to the alignment as advance_tensors pads */
    uint64_t end = w->file_pos;
    for (size_t i = w->cur; i < w->n_tensors; i++) {
        uint64_t left = w->tensors[i].nbytes - (i == w->cur ? w->cur_written : 0);
        if (add_overflows(end, left, &end) || !align_up(end, w->alignment, &end) || end > (uint64_t)INT64_MAX)
            return kt_err_set(err, KT_ERR_INVALID, "%s: file size overflows", w->path);
    }
    return writer_close(w, end, err);
}

void kt_gguf_writer_destroy(struct kt_gguf_writer *w)
{
    if (!w)
        return;
    if (w->fd >= 0)
        close(w->fd);
    if (w->state != WRITER_FINISHED)
        unlink(w->tmp_path);
    for (size_t i = 0; i < w->n_kv; i++) {
        free(w->kv[i].key);
        free(w->kv[i].encoded.p);
    }
    free(w->kv);
    free(w->tensors);
    free(w->buf);
    free(w->path);
    free(w->tmp_path);
    free(w);
}
