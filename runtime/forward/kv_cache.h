/*
 * kv_cache.h - the latent KV cache of MLA attention, paged in fixed-size
 * blocks shared by many sequences.
 *
 * What is cached per token and layer is MLA's one key row,
 * [c (kv_lora_rank) | k_pe (qk_rope_dim)]: the normalised latent and the
 * roped shared key (docs/deepseek2.md, Attention (MLA)); values are the
 * first kv_lora_rank elements of the same row.  Rows are F32, BF16 or F16
 * (params.row_type): attention reads BF16/F16 rows as they are, widening each
 * element exactly (kernels/cpu/ref/ops.h, kt_row_type), so only the store
 * rounds; BF16 halves the cache at ~3 significant digits per element.
 *
 * Blocks hold block_tokens consecutive positions of one sequence for every
 * layer: block[layer][token][row].  A sequence is a table of blocks; its
 * token at position p is in block table[p / block_tokens], slot
 * p % block_tokens.  Blocks come from one pool with a free list and carry a
 * reference count: fork shares all of the parent's blocks, and a shared block
 * is copied the first time either sequence writes into it (copy-on-write;
 * only a partially filled last block is ever written again, so a fork costs
 * at most one block copy per sequence).
 *
 * Blocks are handed out only as sequences grow, so the pool is sized by
 * memory, not by sequences x context: a scheduler that shares it among many
 * sequences asks kt_kv_cache_grow_blocks what a step would take and frees
 * blocks (removing sequences) before stepping when it would not fit.
 *
 * Growing a sequence is all-or-nothing over a whole batch (kt_kv_cache_reserve):
 * when a sequence would pass its context limit, or the pool has too few free
 * blocks, nothing changes and KT_ERR_INVALID names the sequence and the
 * limits.  Never a crash, never a silent truncation.  Not thread-safe for
 * writers: one step at a time; row reads from many threads are fine.
 */
#ifndef KT_KV_CACHE_H
#define KT_KV_CACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cpu/ref/ops.h"
#include "status.h"

struct kt_kv_cache_params {
    uint32_t n_layer;
    uint32_t row_floats;    /* elements per row: kv_lora_rank + qk_rope_dim */
    enum kt_row_type row_type; /* their type; 0: KT_ROW_F32 */
    uint32_t block_tokens;  /* positions per block */
    uint32_t n_blocks;      /* blocks in the pool */
    uint32_t max_seqs;      /* sequence ids are 0 .. max_seqs-1 */
    uint32_t n_ctx;         /* most positions one sequence may hold */
    /* Where the pool lives.  NULL: the cache allocates it in host memory.
     * Else kt_kv_cache_pool_bytes of memory the caller owns (a device's, say),
     * which the cache never reads or writes itself: rows are only addressed
     * (kt_kv_cache_row, kt_kv_cache_rows, kt_kv_cache_seq_blocks) and the
     * copy-on-write copies go through copy_block(copy_ctx, dst, src, bytes),
     * called from kt_kv_cache_reserve in the order the copies are needed. */
    void *storage;
    void (*copy_block)(void *ctx, void *dst, const void *src, size_t bytes);
    void *copy_ctx;
};

struct kt_kv_cache_stats {
    uint32_t n_blocks, blocks_used, blocks_free, block_tokens;
    uint32_t n_seqs;            /* sequences added and not removed */
    uint64_t block_bytes;       /* one block, all layers */
    uint64_t bytes_total;       /* the pool (allocated at create) */
    uint64_t bytes_used;        /* blocks in use */
    uint64_t bytes_per_token;   /* n_layer x row_floats x the element size */
    uint64_t bytes_tables;      /* block tables and bookkeeping */
};

struct kt_kv_cache;

/* Bytes of the pool the params describe (n_blocks blocks of n_layer x
 * block_tokens x row_floats elements of row_type); KT_ERR_INVALID when that overflows. */
kt_status kt_kv_cache_pool_bytes(const struct kt_kv_cache_params *p, uint64_t *bytes, kt_err *err);

kt_status kt_kv_cache_create(const struct kt_kv_cache_params *p, struct kt_kv_cache **out, kt_err *err);
void kt_kv_cache_destroy(struct kt_kv_cache *c);

/* A new, empty sequence.  KT_ERR_INVALID if seq is out of range or in use. */
kt_status kt_kv_cache_seq_add(struct kt_kv_cache *c, uint32_t seq, kt_err *err);

/* Drops a sequence; its blocks return to the pool when no other sequence
 * shares them.  KT_ERR_INVALID if seq is not in use. */
kt_status kt_kv_cache_seq_remove(struct kt_kv_cache *c, uint32_t seq, kt_err *err);

/* dst (unused) becomes a copy of src: same length and rows, blocks shared
 * copy-on-write, so later writes to either never show in the other. */
kt_status kt_kv_cache_seq_fork(struct kt_kv_cache *c, uint32_t src, uint32_t dst, kt_err *err);

/* Keeps the first n_tokens positions of seq (n_tokens <= its length); blocks
 * past them are released. */
kt_status kt_kv_cache_seq_truncate(struct kt_kv_cache *c, uint32_t seq, uint32_t n_tokens, kt_err *err);

bool kt_kv_cache_seq_exists(const struct kt_kv_cache *c, uint32_t seq);
uint32_t kt_kv_cache_seq_length(const struct kt_kv_cache *c, uint32_t seq); /* 0 if not in use */

/*
 * Grows sequence seqs[i] by n_new[i] positions, for i < n (distinct
 * sequences, all in use), allocating and copying-on-write the blocks the new
 * positions need.  All or nothing: on error nothing changed.  The new rows
 * are uninitialised until written through kt_kv_cache_row.
 */
kt_status kt_kv_cache_reserve(struct kt_kv_cache *c, uint32_t n, const uint32_t *seqs, const uint32_t *n_new,
                              kt_err *err);

/* Blocks growing seq (in use) by n_new positions takes from the free list
 * when it grows alone: the new blocks past its table, plus a copy of its
 * partially filled last block when that block is shared.  A batch never
 * takes more than the sum over its sequences (sharers of one block in the
 * same batch leave the last of them uncopied), so a scheduler that keeps
 * that sum within the free blocks never sees kt_kv_cache_reserve refuse. */
uint32_t kt_kv_cache_grow_blocks(const struct kt_kv_cache *c, uint32_t seq, uint32_t n_new);

/* The row of (seq, layer, pos), pos < length: row_floats elements of row_type, writable
 * (its block is never shared after kt_kv_cache_reserve made room for pos;
 * rows of shared blocks must only be read). */
void *kt_kv_cache_row(struct kt_kv_cache *c, uint32_t seq, uint32_t layer, uint32_t pos);

/* rows[t] = the row of (seq, layer, t) for t < n <= length   (n pointers) */
void kt_kv_cache_rows(const struct kt_kv_cache *c, uint32_t seq, uint32_t layer, uint32_t n, const void **rows);

/* The blocks seq holds, in position order (position p is in blocks[p /
 * block_tokens]); returns how many: ceil(length / block_tokens).  Block b's
 * elements start at b x n_layer x block_tokens x row_floats in the pool, layer
 * l's rows at l x block_tokens x row_floats within it. */
uint32_t kt_kv_cache_seq_blocks(const struct kt_kv_cache *c, uint32_t seq, const uint32_t **blocks);

void kt_kv_cache_stats(const struct kt_kv_cache *c, struct kt_kv_cache_stats *s);

enum kt_row_type kt_kv_cache_row_type(const struct kt_kv_cache *c);

#endif
