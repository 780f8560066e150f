/*
 * kv_cache.c - paged latent KV cache (see kv_cache.h for the layout and the
 * copy-on-write rule).
 *
 * Invariants: a block is on the free list iff its reference count is 0; a
 * sequence in use holds ceil(length / block_tokens) blocks, one reference
 * each; a block with a reference count above 1 is never written.  Every
 * check happens before the first change, so a failing call leaves the cache
 * as it was.  It never prints and never truncates a sequence on its own.
 */
#include "kv_cache.h"

#include <stdlib.h>
#include <string.h>

struct seq {
    bool in_use;
    uint32_t length;        /* positions stored */
    uint32_t *blocks;       /* [blocks_per_seq]: the first ceil(length / block_tokens) are held */
};

struct kt_kv_cache {
    struct kt_kv_cache_params p;
    uint32_t blocks_per_seq;    /* ceil(n_ctx / block_tokens) */
    size_t row_bytes;           /* row_floats elements of row_type */
    size_t block_bytes;         /* n_layer * block_tokens * row_bytes */
    uint8_t *pool;              /* [n_blocks][n_layer][block_tokens][row_floats] of row_type */
    bool own_pool;              /* allocated here (else params.storage) */
    uint32_t *refs;             /* [n_blocks] reference counts */
    uint32_t *free_list;        /* [n_blocks] stack of free block ids */
    uint32_t n_free;
    struct seq *seqs;           /* [max_seqs] */
    uint32_t *tables;           /* [max_seqs][blocks_per_seq], seqs[i].blocks point in here */
    uint32_t *cow_scratch;      /* [max_seqs] blocks whose count reserve's check lowered */
    uint32_t n_seqs;
};

static uint32_t blocks_for(const struct kt_kv_cache *c, uint64_t tokens)
{
    return (uint32_t)((tokens + c->p.block_tokens - 1) / c->p.block_tokens);
}

static uint8_t *block_data(const struct kt_kv_cache *c, uint32_t block)
{
    return c->pool + (size_t)block * c->block_bytes;
}

kt_status kt_kv_cache_pool_bytes(const struct kt_kv_cache_params *p, uint64_t *bytes, kt_err *err)
{
    uint64_t block_elems;
    if (__builtin_mul_overflow((uint64_t)p->n_layer * p->block_tokens, (uint64_t)p->row_floats, &block_elems) ||
        __builtin_mul_overflow(block_elems, (uint64_t)kt_row_type_size(p->row_type) * p->n_blocks, bytes) ||
        *bytes > SIZE_MAX / 2)
        return kt_err_set(err, KT_ERR_INVALID,
                          "KV cache: %u blocks of %u layers x %u positions x %u %s elements overflow the address space",
                          p->n_blocks, p->n_layer, p->block_tokens, p->row_floats, kt_row_type_name(p->row_type));
    return KT_OK;
}

kt_status kt_kv_cache_create(const struct kt_kv_cache_params *p, struct kt_kv_cache **out, kt_err *err)
{
    *out = NULL;
    if (!p->n_layer || !p->row_floats || !p->block_tokens || !p->n_blocks || !p->max_seqs || !p->n_ctx)
        return kt_err_set(err, KT_ERR_INVALID,
                          "KV cache: every size must be positive (layers %u, row %u elements, block %u tokens, "
                          "%u blocks, %u sequences, context %u)",
                          p->n_layer, p->row_floats, p->block_tokens, p->n_blocks, p->max_seqs, p->n_ctx);
    if ((unsigned)p->row_type >= KT_ROW_TYPE_COUNT)
        return kt_err_set(err, KT_ERR_INVALID, "KV cache: unknown row type %d", (int)p->row_type);
    if (p->storage && !p->copy_block)
        return kt_err_set(err, KT_ERR_INVALID, "KV cache: caller-owned storage needs a block copy function");
    uint64_t pool_bytes = 0;
    kt_status st = kt_kv_cache_pool_bytes(p, &pool_bytes, err);
    if (st != KT_OK)
        return st;
    struct kt_kv_cache *c = calloc(1, sizeof *c);
    if (!c)
        return kt_err_set(err, KT_ERR_NOMEM, "KV cache: out of memory");
    c->p = *p;
    c->blocks_per_seq = blocks_for(c, p->n_ctx);
    c->row_bytes = (size_t)p->row_floats * kt_row_type_size(p->row_type);
    c->block_bytes = (size_t)p->n_layer * p->block_tokens * c->row_bytes;
    c->own_pool = !p->storage;
    /* pages of an own pool are touched as blocks are used */
    c->pool = c->own_pool ? calloc(p->n_blocks, c->block_bytes) : p->storage;
    c->refs = calloc(p->n_blocks, sizeof *c->refs);
    c->free_list = malloc(p->n_blocks * sizeof *c->free_list);
    c->seqs = calloc(p->max_seqs, sizeof *c->seqs);
    c->tables = malloc((size_t)p->max_seqs * c->blocks_per_seq * sizeof *c->tables);
    c->cow_scratch = malloc(p->max_seqs * sizeof *c->cow_scratch);
    if (!c->pool || !c->refs || !c->free_list || !c->seqs || !c->tables || !c->cow_scratch) {
        kt_kv_cache_destroy(c);
        return kt_err_set(err, KT_ERR_NOMEM, "KV cache: out of memory allocating %u blocks (%llu bytes)", p->n_blocks,
                          (unsigned long long)pool_bytes);
    }
    /* Lowest ids on top of the stack, so a fresh cache hands out 0, 1, 2, ... */
    for (uint32_t i = 0; i < p->n_blocks; i++)
        c->free_list[i] = p->n_blocks - 1 - i;
    c->n_free = p->n_blocks;
    for (uint32_t s = 0; s < p->max_seqs; s++)
        c->seqs[s].blocks = c->tables + (size_t)s * c->blocks_per_seq;
    *out = c;
    return KT_OK;
}

void kt_kv_cache_destroy(struct kt_kv_cache *c)
{
    if (!c)
        return;
    if (c->own_pool)
        free(c->pool);
    free(c->refs);
    free(c->free_list);
    free(c->seqs);
    free(c->tables);
    free(c->cow_scratch);
    free(c);
}

/* ---- blocks ---------------------------------------------------------------------- */

static uint32_t block_take(struct kt_kv_cache *c)
{
    uint32_t b = c->free_list[--c->n_free];
    c->refs[b] = 1;
    return b;
}

static void block_release(struct kt_kv_cache *c, uint32_t b)
{
    if (--c->refs[b] == 0)
        c->free_list[c->n_free++] = b;
}

/* ---- sequences ------------------------------------------------------------------- */

static kt_status check_seq(const struct kt_kv_cache *c, uint32_t seq, bool want_in_use, kt_err *err)
{
    if (seq >= c->p.max_seqs)
        return kt_err_set(err, KT_ERR_INVALID, "sequence %u: out of range (the cache holds sequences 0 .. %u)", seq,
                          c->p.max_seqs - 1);
    if (c->seqs[seq].in_use != want_in_use)
        return kt_err_set(err, KT_ERR_INVALID, "sequence %u: %s", seq, want_in_use ? "not in use" : "already in use");
    return KT_OK;
}

kt_status kt_kv_cache_seq_add(struct kt_kv_cache *c, uint32_t seq, kt_err *err)
{
    kt_status st = check_seq(c, seq, false, err);
    if (st != KT_OK)
        return st;
    c->seqs[seq].in_use = true;
    c->seqs[seq].length = 0;
    c->n_seqs++;
    return KT_OK;
}

kt_status kt_kv_cache_seq_remove(struct kt_kv_cache *c, uint32_t seq, kt_err *err)
{
    kt_status st = check_seq(c, seq, true, err);
    if (st != KT_OK)
        return st;
    struct seq *s = &c->seqs[seq];
    for (uint32_t i = 0; i < blocks_for(c, s->length); i++)
        block_release(c, s->blocks[i]);
    s->in_use = false;
    s->length = 0;
    c->n_seqs--;
    return KT_OK;
}

kt_status kt_kv_cache_seq_fork(struct kt_kv_cache *c, uint32_t src, uint32_t dst, kt_err *err)
{
    kt_status st;
    if ((st = check_seq(c, src, true, err)) != KT_OK || (st = check_seq(c, dst, false, err)) != KT_OK)
        return st;
    const struct seq *s = &c->seqs[src];
    struct seq *d = &c->seqs[dst];
    for (uint32_t i = 0; i < blocks_for(c, s->length); i++) {
        d->blocks[i] = s->blocks[i];
        c->refs[s->blocks[i]]++;
    }
    d->in_use = true;
    d->length = s->length;
    c->n_seqs++;
    return KT_OK;
}

kt_status kt_kv_cache_seq_truncate(struct kt_kv_cache *c, uint32_t seq, uint32_t n_tokens, kt_err *err)
{
    kt_status st = check_seq(c, seq, true, err);
    if (st != KT_OK)
        return st;
    struct seq *s = &c->seqs[seq];
    if (n_tokens > s->length)
        return kt_err_set(err, KT_ERR_INVALID, "sequence %u: cannot truncate %u positions to %u", seq, s->length,
                          n_tokens);
    for (uint32_t i = blocks_for(c, n_tokens); i < blocks_for(c, s->length); i++)
        block_release(c, s->blocks[i]);
    s->length = n_tokens;
    return KT_OK;
}

bool kt_kv_cache_seq_exists(const struct kt_kv_cache *c, uint32_t seq)
{
    return seq < c->p.max_seqs && c->seqs[seq].in_use;
}

uint32_t kt_kv_cache_seq_length(const struct kt_kv_cache *c, uint32_t seq)
{
    return kt_kv_cache_seq_exists(c, seq) ? c->seqs[seq].length : 0;
}

/* Blocks growing s by n positions takes: new blocks past its table, plus a
 * copy of its partially filled last block when that block is shared. */
static uint32_t blocks_needed(const struct kt_kv_cache *c, const struct seq *s, uint32_t n)
{
    uint32_t held = blocks_for(c, s->length);
    uint32_t need = blocks_for(c, (uint64_t)s->length + n) - held;
    if (n > 0 && s->length % c->p.block_tokens != 0 && c->refs[s->blocks[held - 1]] > 1)
        need++;
    return need;
}

uint32_t kt_kv_cache_grow_blocks(const struct kt_kv_cache *c, uint32_t seq, uint32_t n_new)
{
    if (!kt_kv_cache_seq_exists(c, seq))
        return 0;
    return blocks_needed(c, &c->seqs[seq], n_new);
}

/* The shared last block s would copy before writing, or UINT32_MAX. */
static uint32_t cow_block(const struct kt_kv_cache *c, const struct seq *s, uint32_t n)
{
    uint32_t held = blocks_for(c, s->length);
    if (n > 0 && s->length % c->p.block_tokens != 0 && c->refs[s->blocks[held - 1]] > 1)
        return s->blocks[held - 1];
    return UINT32_MAX;
}

kt_status kt_kv_cache_reserve(struct kt_kv_cache *c, uint32_t n, const uint32_t *seqs, const uint32_t *n_new,
                              kt_err *err)
{
    /* Check everything first: nothing changes unless the whole batch fits.
     * A shared block copied by one sequence of the batch may be left to the
     * last of its sharers uncopied; the check counts that by lowering its
     * count while it looks (restored below). */
    if (n > c->p.max_seqs)
        return kt_err_set(err, KT_ERR_INVALID, "reservation for %u sequences: the cache holds %u", n, c->p.max_seqs);
    kt_status st = KT_OK;
    uint64_t need = 0;
    uint32_t n_lowered = 0;
    for (uint32_t i = 0; i < n && st == KT_OK; i++) {
        if ((st = check_seq(c, seqs[i], true, err)) != KT_OK)
            break;
        for (uint32_t j = 0; j < i && st == KT_OK; j++)
            if (seqs[j] == seqs[i])
                st = kt_err_set(err, KT_ERR_INVALID, "sequence %u: listed twice in one reservation", seqs[i]);
        const struct seq *s = &c->seqs[seqs[i]];
        if (st == KT_OK && (uint64_t)s->length + n_new[i] > c->p.n_ctx)
            st = kt_err_set(err, KT_ERR_INVALID,
                            "sequence %u: %u positions + %u new would exceed its context limit of %u positions",
                            seqs[i], s->length, n_new[i], c->p.n_ctx);
        if (st != KT_OK)
            break;
        need += blocks_needed(c, s, n_new[i]);
        uint32_t b = cow_block(c, s, n_new[i]);
        if (b != UINT32_MAX) {
            c->refs[b]--;
            c->cow_scratch[n_lowered++] = b;
        }
    }
    for (uint32_t i = 0; i < n_lowered; i++)
        c->refs[c->cow_scratch[i]]++;
    if (st != KT_OK)
        return st;
    if (need > c->n_free)
        return kt_err_set(err, KT_ERR_INVALID,
                          "KV cache out of blocks: this batch needs %llu more blocks of %u positions but %u of %u are "
                          "free (%u sequences in use); remove sequences or create the engine with more KV blocks",
                          (unsigned long long)need, c->p.block_tokens, c->n_free, c->p.n_blocks, c->n_seqs);

    for (uint32_t i = 0; i < n; i++) {
        struct seq *s = &c->seqs[seqs[i]];
        uint32_t held = blocks_for(c, s->length);
        uint32_t shared = cow_block(c, s, n_new[i]);
        if (shared != UINT32_MAX) {
            /* Copy-on-write: the shared last block gets a private copy before it is written. */
            uint32_t copy = block_take(c);
            if (c->own_pool)
                memcpy(block_data(c, copy), block_data(c, shared), c->block_bytes);
            else
                c->p.copy_block(c->p.copy_ctx, block_data(c, copy), block_data(c, shared), c->block_bytes);
            block_release(c, shared);
            s->blocks[held - 1] = copy;
        }
        uint32_t want = blocks_for(c, (uint64_t)s->length + n_new[i]);
        for (uint32_t b = held; b < want; b++)
            s->blocks[b] = block_take(c);
        s->length += n_new[i];
    }
    return KT_OK;
}

void *kt_kv_cache_row(struct kt_kv_cache *c, uint32_t seq, uint32_t layer, uint32_t pos)
{
    const struct seq *s = &c->seqs[seq];
    const uint32_t bt = c->p.block_tokens;
    return block_data(c, s->blocks[pos / bt]) + ((size_t)layer * bt + pos % bt) * c->row_bytes;
}

void kt_kv_cache_rows(const struct kt_kv_cache *c, uint32_t seq, uint32_t layer, uint32_t n, const void **rows)
{
    const struct seq *s = &c->seqs[seq];
    const uint32_t bt = c->p.block_tokens;
    for (uint32_t b = 0; b * bt < n; b++) {
        const uint8_t *base = block_data(c, s->blocks[b]) + (size_t)layer * bt * c->row_bytes;
        for (uint32_t t = b * bt; t < n && t < (b + 1) * bt; t++)
            rows[t] = base + (size_t)(t - b * bt) * c->row_bytes;
    }
}

uint32_t kt_kv_cache_seq_blocks(const struct kt_kv_cache *c, uint32_t seq, const uint32_t **blocks)
{
    const struct seq *s = &c->seqs[seq];
    *blocks = s->blocks;
    return blocks_for(c, s->length);
}

void kt_kv_cache_stats(const struct kt_kv_cache *c, struct kt_kv_cache_stats *s)
{
    memset(s, 0, sizeof *s);
    s->n_blocks = c->p.n_blocks;
    s->blocks_free = c->n_free;
    s->blocks_used = c->p.n_blocks - c->n_free;
    s->block_tokens = c->p.block_tokens;
    s->n_seqs = c->n_seqs;
    s->block_bytes = c->block_bytes;
    s->bytes_total = s->block_bytes * c->p.n_blocks;
    s->bytes_used = s->block_bytes * s->blocks_used;
    s->bytes_per_token = (uint64_t)c->p.n_layer * c->row_bytes;
    s->bytes_tables = (uint64_t)c->p.n_blocks * (sizeof *c->refs + sizeof *c->free_list) +
                      (uint64_t)c->p.max_seqs *
                          (sizeof *c->seqs + c->blocks_per_seq * sizeof *c->tables + sizeof *c->cow_scratch);
}

enum kt_row_type kt_kv_cache_row_type(const struct kt_kv_cache *c)
{
    return c->p.row_type;
}
