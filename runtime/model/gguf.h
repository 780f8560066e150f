/*
 * gguf.h - GGUF v2/v3 reader and streaming writer.
 *
 * The reader maps a file (or takes a caller's buffer), checks every count,
 * string length, offset and tensor extent against the file size before using
 * it, and rejects anything malformed with a message naming the key or tensor
 * and the byte offset.  It never reads outside the buffer, whatever the input.
 * The writer produces files other GGUF readers load: header, metadata, tensor
 * infos, then tensor data aligned to general.alignment, streamed so memory use
 * stays bounded for files of any size.
 */
#ifndef KT_GGUF_H
#define KT_GGUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "status.h"

#define KT_GGUF_MAGIC "GGUF"
#define KT_GGUF_VERSION 3
#define KT_GGUF_DEFAULT_ALIGNMENT 32
#define KT_GGUF_MAX_DIMS 4
#define KT_GGUF_MAX_NAME 64   /* tensor names are shorter than this, NUL included */
#define KT_GGUF_MAX_DEPTH 8   /* nesting limit for arrays of arrays */

/* Metadata value types, ids as stored in the file. */
enum kt_gguf_type {
    KT_GGUF_UINT8 = 0,
    KT_GGUF_INT8 = 1,
    KT_GGUF_UINT16 = 2,
    KT_GGUF_INT16 = 3,
    KT_GGUF_UINT32 = 4,
    KT_GGUF_INT32 = 5,
    KT_GGUF_FLOAT32 = 6,
    KT_GGUF_BOOL = 7,
    KT_GGUF_STRING = 8,
    KT_GGUF_ARRAY = 9,
    KT_GGUF_UINT64 = 10,
    KT_GGUF_INT64 = 11,
    KT_GGUF_FLOAT64 = 12,
    KT_GGUF_TYPE_COUNT,
};

/* A string inside the file: not NUL-terminated, may contain any bytes. */
struct kt_gguf_str {
    const char *ptr;
    uint64_t len;
};

struct kt_gguf_value;

struct kt_gguf_array {
    enum kt_gguf_type elem_type;
    uint64_t count;
    /* Fixed-size element types: count packed little-endian elements, possibly
     * unaligned (read them with kt_gguf_array_int/_float).  NULL otherwise. */
    const void *data;
    /* STRING and ARRAY element types: count parsed values.  NULL otherwise. */
    struct kt_gguf_value *items;
};

struct kt_gguf_value {
    enum kt_gguf_type type;
    union {
        uint8_t u8;
        int8_t i8;
        uint16_t u16;
        int16_t i16;
        uint32_t u32;
        int32_t i32;
        float f32;
        bool b;
        uint64_t u64;
        int64_t i64;
        double f64;
        struct kt_gguf_str str;
        struct kt_gguf_array arr;
    };
};

struct kt_gguf_kv {
    char *key;                  /* NUL-terminated copy */
    uint64_t file_offset;       /* where the record starts, for messages */
    struct kt_gguf_value value;
};

struct kt_gguf_tensor {
    char name[KT_GGUF_MAX_NAME]; /* NUL-terminated */
    uint32_t n_dims;             /* 1..4 */
    int64_t ne[KT_GGUF_MAX_DIMS]; /* ne[0] contiguous; unused trailing dims are 1 */
    int type;                    /* enum kt_type; always a known id */
    uint64_t offset;             /* relative to the data section; multiple of alignment */
    uint64_t nbytes;
    const void *data;            /* inside the mapping; data..data+nbytes is in bounds */
    uint64_t info_offset;        /* where the tensor-info record starts, for messages */
    uint8_t source;              /* enum kt_tensor_source: where data is */
};

/* Where a tensor's bytes are.  A GGUF file's are all MAPPED; a checkpoint
 * directory (hf_model.h) converts some at kt_model_weights_ready and never
 * holds a stacked expert tensor whole. */
enum kt_tensor_source {
    KT_TENSOR_MAPPED = 0,   /* data points at the bytes, from the start */
    KT_TENSOR_DEFERRED = 1, /* data NULL until the model's weights are made ready */
    KT_TENSOR_STREAMED = 2, /* data always NULL: expert x's slab comes from kt_model_read_expert */
};

struct kt_gguf {
    uint32_t version;            /* 2 or 3 */
    uint32_t alignment;          /* general.alignment or 32 */
    uint64_t n_kv;
    struct kt_gguf_kv *kv;
    uint64_t n_tensors;
    struct kt_gguf_tensor *tensors; /* in file order */
    uint64_t data_offset;        /* file offset of the data section */
    const uint8_t *base;         /* the whole file */
    uint64_t file_bytes;
    char path[512];              /* "" for in-memory buffers */
    void *internal;              /* owned by gguf.c */
};

/* Maps and parses a file.  On failure *out is NULL and err names the problem
 * (KT_ERR_FORMAT for malformed input, KT_ERR_IO when the file cannot be read).
 * Tensor offsets need only be aligned, in bounds and non-overlapping; the
 * packed ggml layout the writer produces is not required.  An opened file is
 * never modified, so lookups may run from many threads. */
kt_status kt_gguf_open(const char *path, struct kt_gguf **out, kt_err *err);

/* Parses a caller-owned buffer, which must outlive the result. */
kt_status kt_gguf_open_memory(const void *data, size_t bytes, struct kt_gguf **out, kt_err *err);

/* A GGUF made in memory by another model source (a Hugging Face directory):
 * kv and tensors are the caller's, filled in, and stay valid until close,
 * which calls release(owner) (also on failure here).  Builds the lookup
 * indexes; refuses a key or tensor given twice and a tensor whose type,
 * shape and byte count disagree.  path names it in messages. */
kt_status kt_gguf_from_parts(struct kt_gguf_kv *kv, uint64_t n_kv, struct kt_gguf_tensor *tensors,
                             uint64_t n_tensors, void (*release)(void *owner), void *owner, const char *path,
                             struct kt_gguf **out, kt_err *err);

void kt_gguf_close(struct kt_gguf *g);

/* Lookups; NULL if absent. */
const struct kt_gguf_kv *kt_gguf_find_kv(const struct kt_gguf *g, const char *key);
const struct kt_gguf_tensor *kt_gguf_find_tensor(const struct kt_gguf *g, const char *name);

/* Typed getters.  KT_ERR_NOT_FOUND if the key is absent (err still names it),
 * KT_ERR_FORMAT if it has a type that cannot be converted without loss. */
kt_status kt_gguf_get_int(const struct kt_gguf *g, const char *key, int64_t *out, kt_err *err);   /* any integer type or bool */
kt_status kt_gguf_get_uint32(const struct kt_gguf *g, const char *key, uint32_t *out, kt_err *err); /* integer in [0, UINT32_MAX] */
kt_status kt_gguf_get_float(const struct kt_gguf *g, const char *key, double *out, kt_err *err); /* float32/64 or integer */
kt_status kt_gguf_get_bool(const struct kt_gguf *g, const char *key, bool *out, kt_err *err);
kt_status kt_gguf_get_str(const struct kt_gguf *g, const char *key, struct kt_gguf_str *out, kt_err *err);
kt_status kt_gguf_get_array(const struct kt_gguf *g, const char *key, const struct kt_gguf_array **out, kt_err *err);

/* Element i of an array of fixed-size numbers, converted.  false if the element
 * type is not a number (or bool) or i is out of range. */
bool kt_gguf_array_int(const struct kt_gguf_array *a, uint64_t i, int64_t *out);
bool kt_gguf_array_float(const struct kt_gguf_array *a, uint64_t i, double *out);

/* Bytes one element of a fixed-size type takes; 0 for STRING and ARRAY. */
size_t kt_gguf_type_size(enum kt_gguf_type t);
const char *kt_gguf_type_name(enum kt_gguf_type t);

/* ---- writer ------------------------------------------------------------------ */

struct kt_gguf_writer;

/* Writes to PATH.tmp and renames to PATH on finish, so a failed or interrupted
 * write never leaves a truncated file under the final name. */
kt_status kt_gguf_writer_create(const char *path, struct kt_gguf_writer **out, kt_err *err);

/* Metadata, in the order set (setting a key again replaces its value in place).
 * Values are deep-copied.  general.alignment must be a UINT32 power of two. */
kt_status kt_gguf_writer_set(struct kt_gguf_writer *w, const char *key, const struct kt_gguf_value *v, kt_err *err);
kt_status kt_gguf_writer_set_u32(struct kt_gguf_writer *w, const char *key, uint32_t v, kt_err *err);
kt_status kt_gguf_writer_set_i32(struct kt_gguf_writer *w, const char *key, int32_t v, kt_err *err);
kt_status kt_gguf_writer_set_u64(struct kt_gguf_writer *w, const char *key, uint64_t v, kt_err *err);
kt_status kt_gguf_writer_set_f32(struct kt_gguf_writer *w, const char *key, float v, kt_err *err);
kt_status kt_gguf_writer_set_bool(struct kt_gguf_writer *w, const char *key, bool v, kt_err *err);
kt_status kt_gguf_writer_set_str(struct kt_gguf_writer *w, const char *key, const char *v, kt_err *err);
/* Array of fixed-size elements, given packed in host (little-endian) order. */
kt_status kt_gguf_writer_set_array(struct kt_gguf_writer *w, const char *key, enum kt_gguf_type elem_type,
                                   const void *elems, uint64_t count, kt_err *err);
kt_status kt_gguf_writer_set_str_array(struct kt_gguf_writer *w, const char *key, const char *const *strs,
                                       uint64_t count, kt_err *err);

/* Declares the next tensor; data must later be written in declaration order. */
kt_status kt_gguf_writer_add_tensor(struct kt_gguf_writer *w, const char *name, int type, uint32_t n_dims,
                                    const int64_t *ne, kt_err *err);

/* Writes header, metadata and tensor infos.  Call once, after all set/add calls. */
kt_status kt_gguf_writer_write_header(struct kt_gguf_writer *w, kt_err *err);

/* Appends tensor data in any chunking; alignment padding between tensors is
 * inserted automatically.  Writing more than declared is an error. */
kt_status kt_gguf_writer_write_data(struct kt_gguf_writer *w, const void *bytes, size_t n, kt_err *err);

/* Checks every declared byte was written, flushes, fsyncs, closes and renames.
 * A file without tensors may skip write_header: finish writes it. */
kt_status kt_gguf_writer_finish(struct kt_gguf_writer *w, kt_err *err);

/* Finishes a file whose declared data not yet written is left as a hole: the
 * buffered bytes are flushed and the file is extended (ftruncate) to the size
 * finish would have given it, then fsynced and renamed like finish.  On a file
 * system with sparse files the hole takes no disk space; it reads as zeros.  For
 * files whose header matters and whose weights do not (planning a real-size
 * model); a writer that wrote everything ends the same as with finish. */
kt_status kt_gguf_writer_finish_sparse(struct kt_gguf_writer *w, kt_err *err);

/* Frees the writer; if it was not finished, removes the temporary file. */
void kt_gguf_writer_destroy(struct kt_gguf_writer *w);

#endif
