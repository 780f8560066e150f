/*
 * safetensors.h - reader for safetensors shards and Hugging Face checkpoint
 * directories (model.safetensors.index.json + shards, or one model.safetensors).
 *
 * A shard is mapped read-only; its 8-byte header length, JSON header and
 * every tensor's dtype, shape and data_offsets are checked before anything is
 * used: the header lies inside the file, every extent is computed with
 * overflow checks and must equal its dtype and shape's size, and the tensors
 * tile the data section exactly (no overlap, no gap, nothing after the last:
 * the format's own reader demands the same).  A directory's index must name
 * only plain file names beside it, and every tensor it lists must be in the
 * shard it names.  Anything else is refused with a message naming the file
 * and tensor.  It never reads outside a mapping and never writes to one,
 * whatever the input.
 */
#ifndef KT_SAFETENSORS_H
#define KT_SAFETENSORS_H

#include <stdint.h>
#include <stddef.h>

#include "status.h"

#define KT_ST_MAX_RANK 8
#define KT_ST_MAX_HEADER_BYTES 100000000u /* the format's own limit */
#define KT_ST_INDEX_FILE "model.safetensors.index.json"
#define KT_ST_SINGLE_FILE "model.safetensors"

/* Element types, spelled as in the header ("BF16", "F8_E4M3", ...). */
enum kt_st_dtype {
    KT_ST_BOOL,
    KT_ST_U8,
    KT_ST_I8,
    KT_ST_F8_E4M3,     /* OCP e4m3fn */
    KT_ST_F8_E5M2,
    KT_ST_F8_E8M0,     /* MX scale */
    KT_ST_F8_E4M3FNUZ,
    KT_ST_F8_E5M2FNUZ,
    KT_ST_I16,
    KT_ST_U16,
    KT_ST_F16,
    KT_ST_BF16,
    KT_ST_I32,
    KT_ST_U32,
    KT_ST_F32,
    KT_ST_I64,
    KT_ST_U64,
    KT_ST_F64,
    KT_ST_C64,
    KT_ST_F4,          /* MX FP4, two per byte */
    KT_ST_F6_E2M3,     /* MX FP6 */
    KT_ST_F6_E3M2,
    KT_ST_DTYPE_COUNT,
};

struct kt_st_tensor {
    const char *name;             /* NUL-terminated */
    enum kt_st_dtype dtype;
    uint32_t rank;                /* 0 (a scalar) .. KT_ST_MAX_RANK */
    uint64_t shape[KT_ST_MAX_RANK]; /* outermost first: shape[rank-1] is contiguous; unused dims 0 */
    uint64_t numel;               /* product of shape (1 for a scalar) */
    const void *data;             /* inside the shard's mapping, any alignment: read with memcpy */
    uint64_t bytes;               /* numel * the dtype's bits / 8, exactly */
    uint64_t file_offset;         /* where data starts in the shard file, for messages */
    uint32_t shard;               /* index into kt_st_dir.shards */
};

struct kt_st_shard {
    char *path;                   /* as opened; the label given to kt_st_open_memory */
    const uint8_t *base;          /* the whole file */
    uint64_t file_bytes;
    uint64_t header_bytes;        /* the JSON header's length */
    uint64_t data_offset;         /* 8 + header_bytes */
    uint64_t n_tensors;
};

struct kt_st_dir {
    uint32_t n_shards;
    struct kt_st_shard *shards;
    uint64_t n_tensors;
    struct kt_st_tensor *tensors; /* every shard's tensors, shard by shard, by data offset */
    void *internal;               /* owned by safetensors.c */
};

/* Opens a checkpoint directory: its model.safetensors.index.json and every
 * shard the index names, or, without an index, its model.safetensors.  On
 * failure *out is NULL and err names the file (and tensor): KT_ERR_FORMAT for
 * malformed input, KT_ERR_IO when a file cannot be read (a missing shard),
 * KT_ERR_NOT_FOUND for a directory with neither file. */
kt_status kt_st_open_dir(const char *path, struct kt_st_dir **out, kt_err *err);

/* One shard file on its own, as a directory of one shard. */
kt_status kt_st_open_file(const char *path, struct kt_st_dir **out, kt_err *err);

/* One shard in a caller's buffer, which must outlive the result; label names
 * it in messages (may be NULL). */
kt_status kt_st_open_memory(const void *data, size_t bytes, const char *label, struct kt_st_dir **out,
                            kt_err *err);

void kt_st_close(struct kt_st_dir *dir);

/* The tensor called name, or NULL.  Lookups never change dir, so they may run
 * from many threads. */
const struct kt_st_tensor *kt_st_find(const struct kt_st_dir *dir, const char *name);

/* The tensor called name, checked to have this dtype and shape: KT_ERR_NOT_FOUND
 * if it is absent, KT_ERR_FORMAT (naming what differs) if it does not match. */
kt_status kt_st_expect(const struct kt_st_dir *dir, const char *name, enum kt_st_dtype dtype, uint32_t rank,
                       const uint64_t *shape, const struct kt_st_tensor **out, kt_err *err);

/* "BF16" etc.; "?" for an out-of-range value. */
const char *kt_st_dtype_name(enum kt_st_dtype dtype);
/* Bits per element (4, 6, 8, 16, 32, 64, 64 for C64); 0 for an out-of-range value. */
unsigned kt_st_dtype_bits(enum kt_st_dtype dtype);

#endif
