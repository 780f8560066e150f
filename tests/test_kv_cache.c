/*
 * test_kv_cache.c - the paged latent KV cache: sequences added, grown,
 * removed, forked and truncated; blocks reused; copy-on-write isolation of
 * forks; context-limit and out-of-blocks errors that name the sequence and
 * the limits and change nothing.
 */
#include <stdlib.h>
#include <string.h>

#include "kv_cache.h"
#include "testlib.h"

#define LAYERS 3
#define ROW 5
#define BT 4 /* positions per block */

static struct kt_kv_cache *make(uint32_t n_blocks, uint32_t max_seqs, uint32_t n_ctx)
{
    struct kt_kv_cache_params p = {.n_layer = LAYERS, .row_floats = ROW, .block_tokens = BT,
                                   .n_blocks = n_blocks, .max_seqs = max_seqs, .n_ctx = n_ctx};
    struct kt_kv_cache *c = NULL;
    kt_err err = {0};
    kt_status st = kt_kv_cache_create(&p, &c, &err);
    KT_CHECK(st == KT_OK && c, "create: %s", err.msg);
    return c;
}

/* A value that identifies (seq tag, layer, pos, i). */
static float mark(uint32_t tag, uint32_t layer, uint32_t pos, uint32_t i)
{
    return (float)(tag * 100000 + layer * 10000 + pos * 10 + i);
}

static kt_status grow(struct kt_kv_cache *c, uint32_t seq, uint32_t n, kt_err *err)
{
    return kt_kv_cache_reserve(c, 1, &seq, &n, err);
}

static void write_rows(struct kt_kv_cache *c, uint32_t seq, uint32_t tag, uint32_t from, uint32_t to)
{
    for (uint32_t l = 0; l < LAYERS; l++)
        for (uint32_t p = from; p < to; p++) {
            float *r = kt_kv_cache_row(c, seq, l, p);
            for (uint32_t i = 0; i < ROW; i++)
                r[i] = mark(tag, l, p, i);
        }
}

/* Rows [from, to) of seq hold tag's marks, read through kt_kv_cache_rows. */
static bool rows_hold(const struct kt_kv_cache *c, uint32_t seq, uint32_t tag, uint32_t from, uint32_t to)
{
    const void *rows[256];
    for (uint32_t l = 0; l < LAYERS; l++) {
        kt_kv_cache_rows(c, seq, l, to, rows);
        for (uint32_t p = from; p < to; p++)
            for (uint32_t i = 0; i < ROW; i++)
                if (((const float *)rows[p])[i] != mark(tag, l, p, i))
                    return false;
    }
    return true;
}

static uint32_t blocks_used(const struct kt_kv_cache *c)
{
    struct kt_kv_cache_stats s;
    kt_kv_cache_stats(c, &s);
    return s.blocks_used;
}

static void sequences_grow_in_blocks_and_keep_their_rows(void)
{
    struct kt_kv_cache *c = make(16, 4, 64);
    kt_err err = {0};
    KT_CHECK(kt_kv_cache_seq_add(c, 0, &err) == KT_OK, "%s", err.msg);
    KT_CHECK(kt_kv_cache_seq_add(c, 2, &err) == KT_OK, "%s", err.msg);
    KT_CHECK(grow(c, 0, 5, &err) == KT_OK, "%s", err.msg); /* 2 blocks */
    write_rows(c, 0, 1, 0, 5);
    uint32_t seqs[2] = {2, 0}, n[2] = {9, 2};
    KT_CHECK(kt_kv_cache_reserve(c, 2, seqs, n, &err) == KT_OK, "%s", err.msg); /* 3 + 0 more blocks */
    write_rows(c, 0, 1, 5, 7);
    write_rows(c, 2, 2, 0, 9);
    KT_CHECK(kt_kv_cache_seq_length(c, 0) == 7 && kt_kv_cache_seq_length(c, 2) == 9, "lengths %u %u",
             kt_kv_cache_seq_length(c, 0), kt_kv_cache_seq_length(c, 2));
    KT_CHECK(blocks_used(c) == 5, "blocks used %u, expected 2 + 3", blocks_used(c));
    KT_CHECK(rows_hold(c, 0, 1, 0, 7) && rows_hold(c, 2, 2, 0, 9), "rows were overwritten");

    struct kt_kv_cache_stats s;
    kt_kv_cache_stats(c, &s);
    KT_CHECK(s.bytes_per_token == LAYERS * ROW * 4 && s.block_bytes == BT * s.bytes_per_token &&
                 s.bytes_total == 16 * s.block_bytes && s.bytes_used == 5 * s.block_bytes && s.n_seqs == 2,
             "stats: %llu per token, %llu per block, %llu total, %llu used, %u seqs",
             (unsigned long long)s.bytes_per_token, (unsigned long long)s.block_bytes,
             (unsigned long long)s.bytes_total, (unsigned long long)s.bytes_used, s.n_seqs);
    kt_kv_cache_destroy(c);
}

static void removed_sequences_return_their_blocks_for_reuse(void)
{
    struct kt_kv_cache *c = make(4, 2, 16);
    kt_err err = {0};
    for (int round = 0; round < 5; round++) {
        KT_CHECK(kt_kv_cache_seq_add(c, 1, &err) == KT_OK, "round %d: %s", round, err.msg);
        KT_CHECK(grow(c, 1, 16, &err) == KT_OK, "round %d: %s", round, err.msg); /* every block */
        write_rows(c, 1, (uint32_t)round, 0, 16);
        KT_CHECK(rows_hold(c, 1, (uint32_t)round, 0, 16), "round %d: rows", round);
        KT_CHECK(blocks_used(c) == 4, "round %d: %u blocks used", round, blocks_used(c));
        KT_CHECK(kt_kv_cache_seq_remove(c, 1, &err) == KT_OK, "round %d: %s", round, err.msg);
        KT_CHECK(blocks_used(c) == 0, "round %d: %u blocks still used after remove", round, blocks_used(c));
    }
    KT_CHECK(kt_kv_cache_seq_remove(c, 1, &err) == KT_ERR_INVALID && strstr(err.msg, "sequence 1"),
             "removing a removed sequence: %s", err.msg);
    KT_CHECK(kt_kv_cache_seq_add(c, 2, &err) == KT_ERR_INVALID && strstr(err.msg, "sequence 2"),
             "adding sequence 2 of 2: %s", err.msg);
    KT_CHECK(kt_kv_cache_seq_add(c, 0, &err) == KT_OK && kt_kv_cache_seq_add(c, 0, &err) == KT_ERR_INVALID,
             "adding sequence 0 twice: %s", err.msg);
    kt_kv_cache_destroy(c);
}

static void context_limit_error_names_sequence_and_limit_and_changes_nothing(void)
{
    struct kt_kv_cache *c = make(32, 2, 10);
    kt_err err = {0};
    kt_kv_cache_seq_add(c, 0, &err);
    kt_kv_cache_seq_add(c, 1, &err);
    KT_CHECK(grow(c, 0, 8, &err) == KT_OK, "%s", err.msg);
    write_rows(c, 0, 3, 0, 8);
    uint32_t used = blocks_used(c);
    uint32_t seqs[2] = {1, 0}, n[2] = {4, 3};
    kt_status st = kt_kv_cache_reserve(c, 2, seqs, n, &err);
    KT_CHECK(st == KT_ERR_INVALID, "status %d", (int)st);
    KT_CHECK(strstr(err.msg, "sequence 0") && strstr(err.msg, "limit of 10") && strstr(err.msg, "8 positions"),
             "message: %s", err.msg);
    KT_CHECK(kt_kv_cache_seq_length(c, 0) == 8 && kt_kv_cache_seq_length(c, 1) == 0 && blocks_used(c) == used,
             "a failed reservation changed the cache: lengths %u %u, blocks %u (was %u)",
             kt_kv_cache_seq_length(c, 0), kt_kv_cache_seq_length(c, 1), blocks_used(c), used);
    KT_CHECK(rows_hold(c, 0, 3, 0, 8), "rows changed");
    KT_CHECK(grow(c, 0, 2, &err) == KT_OK && kt_kv_cache_seq_length(c, 0) == 10, "filling to the limit: %s", err.msg);
    KT_CHECK(grow(c, 5, 1, &err) == KT_ERR_INVALID && strstr(err.msg, "sequence 5"), "unknown sequence: %s", err.msg);
    uint32_t twice[2] = {1, 1}, one[2] = {1, 1};
    KT_CHECK(kt_kv_cache_reserve(c, 2, twice, one, &err) == KT_ERR_INVALID && kt_kv_cache_seq_length(c, 1) == 0,
             "a sequence listed twice: %s", err.msg);
    kt_kv_cache_destroy(c);
}

static void out_of_blocks_error_names_the_need_and_changes_nothing(void)
{
    struct kt_kv_cache *c = make(5, 3, 64); /* 20 positions in all */
    kt_err err = {0};
    for (uint32_t s = 0; s < 3; s++)
        kt_kv_cache_seq_add(c, s, &err);
    KT_CHECK(grow(c, 0, 12, &err) == KT_OK, "%s", err.msg); /* 3 blocks */
    write_rows(c, 0, 7, 0, 12);
    uint32_t seqs[2] = {1, 2}, n[2] = {4, 5}; /* 1 + 2 blocks, 2 free */
    kt_status st = kt_kv_cache_reserve(c, 2, seqs, n, &err);
    KT_CHECK(st == KT_ERR_INVALID, "status %d", (int)st);
    KT_CHECK(strstr(err.msg, "out of blocks") && strstr(err.msg, "needs 3 more blocks") && strstr(err.msg, "2 of 5"),
             "message: %s", err.msg);
    KT_CHECK(kt_kv_cache_seq_length(c, 1) == 0 && kt_kv_cache_seq_length(c, 2) == 0 && blocks_used(c) == 3,
             "a failed reservation changed the cache");
    KT_CHECK(kt_kv_cache_reserve(c, 1, seqs, n, &err) == KT_OK, "the part that fits: %s", err.msg);
    KT_CHECK(kt_kv_cache_seq_remove(c, 0, &err) == KT_OK && grow(c, 2, 5, &err) == KT_OK,
             "after freeing blocks: %s", err.msg);
    kt_kv_cache_destroy(c);
}

static void forks_share_blocks_and_copy_on_write(void)
{
    struct kt_kv_cache *c = make(16, 4, 64);
    kt_err err = {0};
    kt_kv_cache_seq_add(c, 0, &err);
    KT_CHECK(grow(c, 0, 6, &err) == KT_OK, "%s", err.msg); /* one full block, one with 2 of 4 */
    write_rows(c, 0, 1, 0, 6);
    KT_CHECK(kt_kv_cache_seq_fork(c, 0, 3, &err) == KT_OK, "fork: %s", err.msg);
    KT_CHECK(blocks_used(c) == 2, "fork copied blocks: %u used", blocks_used(c));
    KT_CHECK(kt_kv_cache_seq_length(c, 3) == 6 && rows_hold(c, 3, 1, 0, 6), "the fork does not see the prefix");

    /* Both grow into the shared half-full block: each gets its own copy. */
    uint32_t seqs[2] = {0, 3}, n[2] = {3, 1};
    KT_CHECK(kt_kv_cache_reserve(c, 2, seqs, n, &err) == KT_OK, "%s", err.msg);
    KT_CHECK(blocks_used(c) == 1 + 2 + 1, "blocks used %u: shared full block, two copies, one new", blocks_used(c));
    write_rows(c, 0, 2, 6, 9);
    write_rows(c, 3, 3, 6, 7);
    KT_CHECK(rows_hold(c, 0, 1, 0, 6) && rows_hold(c, 0, 2, 6, 9), "parent rows");
    KT_CHECK(rows_hold(c, 3, 1, 0, 6) && rows_hold(c, 3, 3, 6, 7), "fork rows: the parent's writes leaked in");

    /* Removing the parent keeps the shared prefix alive for the fork. */
    KT_CHECK(kt_kv_cache_seq_remove(c, 0, &err) == KT_OK, "%s", err.msg);
    KT_CHECK(rows_hold(c, 3, 1, 0, 6) && blocks_used(c) == 2, "fork after parent removal: %u blocks",
             blocks_used(c));
    KT_CHECK(kt_kv_cache_seq_fork(c, 3, 3, &err) == KT_ERR_INVALID, "forking onto itself accepted");
    KT_CHECK(kt_kv_cache_seq_fork(c, 1, 2, &err) == KT_ERR_INVALID && strstr(err.msg, "sequence 1"),
             "forking an unused sequence: %s", err.msg);
    kt_kv_cache_destroy(c);
}

static void fork_of_a_full_last_block_copies_nothing(void)
{
    struct kt_kv_cache *c = make(8, 2, 64);
    kt_err err = {0};
    kt_kv_cache_seq_add(c, 0, &err);
    grow(c, 0, 8, &err);
    write_rows(c, 0, 1, 0, 8);
    kt_kv_cache_seq_fork(c, 0, 1, &err);
    uint32_t seqs[2] = {0, 1}, n[2] = {1, 1};
    KT_CHECK(kt_kv_cache_reserve(c, 2, seqs, n, &err) == KT_OK, "%s", err.msg);
    KT_CHECK(blocks_used(c) == 4, "%u blocks used: two shared, one new each", blocks_used(c));
    write_rows(c, 0, 5, 8, 9);
    write_rows(c, 1, 6, 8, 9);
    KT_CHECK(rows_hold(c, 0, 5, 8, 9) && rows_hold(c, 1, 6, 8, 9) && rows_hold(c, 1, 1, 0, 8), "rows");
    kt_kv_cache_destroy(c);
}

/* With one free block, two forks of a half-full block both grow: the first
 * copies, the last sharer writes in place, so the batch fits exactly. */
static void last_sharer_writes_in_place_so_tight_pools_fit(void)
{
    struct kt_kv_cache *c = make(2, 2, 64);
    kt_err err = {0};
    kt_kv_cache_seq_add(c, 0, &err);
    grow(c, 0, 2, &err);
    write_rows(c, 0, 1, 0, 2);
    kt_kv_cache_seq_fork(c, 0, 1, &err);
    uint32_t seqs[2] = {0, 1}, n[2] = {1, 1};
    KT_CHECK(kt_kv_cache_reserve(c, 2, seqs, n, &err) == KT_OK, "%s", err.msg);
    write_rows(c, 0, 2, 2, 3);
    write_rows(c, 1, 3, 2, 3);
    KT_CHECK(rows_hold(c, 0, 1, 0, 2) && rows_hold(c, 1, 1, 0, 2) && rows_hold(c, 0, 2, 2, 3) &&
                 rows_hold(c, 1, 3, 2, 3),
             "rows");
    KT_CHECK(blocks_used(c) == 2, "%u blocks used", blocks_used(c));
    kt_kv_cache_destroy(c);
}

static void truncate_releases_blocks_and_copies_shared_tail_on_write(void)
{
    struct kt_kv_cache *c = make(8, 2, 64);
    kt_err err = {0};
    kt_kv_cache_seq_add(c, 0, &err);
    grow(c, 0, 12, &err);
    write_rows(c, 0, 1, 0, 12);
    kt_kv_cache_seq_fork(c, 0, 1, &err);
    KT_CHECK(kt_kv_cache_seq_truncate(c, 1, 5, &err) == KT_OK && kt_kv_cache_seq_length(c, 1) == 5, "%s", err.msg);
    KT_CHECK(blocks_used(c) == 3, "%u blocks", blocks_used(c));
    KT_CHECK(grow(c, 1, 2, &err) == KT_OK, "%s", err.msg);
    write_rows(c, 1, 2, 5, 7);
    KT_CHECK(rows_hold(c, 0, 1, 0, 12), "the parent's positions 5, 6 were overwritten through the truncated fork");
    KT_CHECK(rows_hold(c, 1, 1, 0, 5) && rows_hold(c, 1, 2, 5, 7), "fork rows");
    KT_CHECK(kt_kv_cache_seq_truncate(c, 1, 8, &err) == KT_ERR_INVALID, "truncating past the end accepted");
    KT_CHECK(kt_kv_cache_seq_truncate(c, 0, 0, &err) == KT_OK && blocks_used(c) == 2, "%u blocks", blocks_used(c));
    kt_kv_cache_destroy(c);
}

/* Caller-owned storage (a device's memory): the cache only addresses it and
 * hands its copy-on-write copies to the caller's function. */
struct copies {
    uint32_t n;
    float *dst, *src;
    size_t bytes;
};

static void record_copy(void *ctx, void *dst, const void *src, size_t bytes)
{
    struct copies *cp = ctx;
    cp->n++;
    cp->dst = dst;
    cp->src = (float *)src;
    cp->bytes = bytes;
    memcpy(dst, src, bytes);
}

static void caller_storage_is_addressed_and_copied_through_the_callback(void)
{
    struct copies cp = {0};
    struct kt_kv_cache_params p = {.n_layer = LAYERS, .row_floats = ROW, .block_tokens = BT,
                                   .n_blocks = 6, .max_seqs = 2, .n_ctx = 16};
    uint64_t bytes = 0;
    kt_err err = {0};
    KT_CHECK(kt_kv_cache_pool_bytes(&p, &bytes, &err) == KT_OK && bytes == 6ull * LAYERS * BT * ROW * sizeof(float),
             "pool bytes %llu", (unsigned long long)bytes);
    float *storage = calloc(1, bytes);
    struct kt_kv_cache *c = NULL;
    p.storage = storage;
    KT_CHECK(kt_kv_cache_create(&p, &c, &err) == KT_ERR_INVALID && !c, "storage without a copy function refused");
    p.copy_block = record_copy;
    p.copy_ctx = &cp;
    KT_CHECK(kt_kv_cache_create(&p, &c, &err) == KT_OK && c, "create: %s", err.msg);
    if (!c) {
        free(storage);
        return;
    }
    kt_kv_cache_seq_add(c, 0, &err);
    KT_CHECK(grow(c, 0, 6, &err) == KT_OK, "grow: %s", err.msg);
    write_rows(c, 0, 1, 0, 6);
    const size_t block_floats = (size_t)LAYERS * BT * ROW;
    KT_CHECK(kt_kv_cache_row(c, 0, 2, 5) == storage + 1 * block_floats + (2 * BT + 1) * ROW,
             "row (layer 2, pos 5) in block 1 of the caller's storage");
    const uint32_t *blocks = NULL;
    KT_CHECK(kt_kv_cache_seq_blocks(c, 0, &blocks) == 2 && blocks[0] == 0 && blocks[1] == 1, "blocks 0, 1 held");
    kt_kv_cache_seq_fork(c, 0, 1, &err);
    KT_CHECK(cp.n == 0, "a fork copies nothing");
    KT_CHECK(grow(c, 1, 1, &err) == KT_OK, "grow the fork: %s", err.msg);
    KT_CHECK(cp.n == 1 && cp.src == storage + block_floats && cp.dst == storage + 2 * block_floats &&
                 cp.bytes == block_floats * sizeof(float),
             "the shared partial block 1 was copied to block 2 through the callback (%u copies)", cp.n);
    write_rows(c, 1, 2, 6, 7);
    KT_CHECK(rows_hold(c, 1, 1, 0, 6) && rows_hold(c, 1, 2, 6, 7) && rows_hold(c, 0, 1, 0, 6),
             "both sequences read their own rows");
    kt_kv_cache_destroy(c);
    free(storage); /* the cache never frees caller storage */
}

static void zero_sizes_are_rejected(void)
{
    struct kt_kv_cache_params p = {.n_layer = LAYERS, .row_floats = ROW, .block_tokens = 0,
                                   .n_blocks = 4, .max_seqs = 1, .n_ctx = 16};
    struct kt_kv_cache *c = NULL;
    kt_err err = {0};
    KT_CHECK(kt_kv_cache_create(&p, &c, &err) == KT_ERR_INVALID && !c, "block of 0 positions accepted");
}

/* BF16 and F16 rows: half the bytes per token, rows at their own stride,
 * values stored rounded to nearest even and read back widened exactly
 * (integers below 256 are exact in both: every element must come back
 * as it went in; a value between two BF16 neighbours must round to the
 * nearer); an unknown row type is refused. */
static void half_width_rows_halve_the_cache_and_round_to_nearest(void)
{
    const enum kt_row_type types[] = {KT_ROW_BF16, KT_ROW_F16};
    for (size_t k = 0; k < 2; k++) {
        const enum kt_row_type t = types[k];
        struct kt_kv_cache_params p = {.n_layer = LAYERS, .row_floats = ROW, .row_type = t, .block_tokens = BT,
                                       .n_blocks = 4, .max_seqs = 1, .n_ctx = 16};
        uint64_t bytes = 0;
        kt_err err = {0};
        KT_CHECK(kt_kv_cache_pool_bytes(&p, &bytes, &err) == KT_OK && bytes == 4ull * LAYERS * BT * ROW * 2,
                 "%s pool bytes %llu", kt_row_type_name(t), (unsigned long long)bytes);
        struct kt_kv_cache *c = NULL;
        KT_CHECK(kt_kv_cache_create(&p, &c, &err) == KT_OK && c, "create: %s", err.msg);
        if (!c)
            return;
        kt_kv_cache_seq_add(c, 0, &err);
        KT_CHECK(grow(c, 0, 6, &err) == KT_OK, "grow: %s", err.msg);
        struct kt_kv_cache_stats s;
        kt_kv_cache_stats(c, &s);
        KT_CHECK(kt_kv_cache_row_type(c) == t && s.bytes_per_token == LAYERS * ROW * 2 &&
                     s.block_bytes == BT * s.bytes_per_token,
                 "%s: %llu bytes per token, %llu per block", kt_row_type_name(t),
                 (unsigned long long)s.bytes_per_token, (unsigned long long)s.block_bytes);
        KT_CHECK((uint8_t *)kt_kv_cache_row(c, 0, 1, 5) - (uint8_t *)kt_kv_cache_row(c, 0, 1, 4) == ROW * 2,
                 "%s rows are %d bytes apart", kt_row_type_name(t), ROW * 2);
        for (uint32_t l = 0; l < LAYERS; l++)
            for (uint32_t pos = 0; pos < 6; pos++) {
                float v[ROW];
                for (uint32_t i = 0; i < ROW; i++)
                    v[i] = (float)(l * 60 + pos * 10 + i) - 100.0f;
                kt_row_from_f32(t, kt_kv_cache_row(c, 0, l, pos), v, ROW);
            }
        const void *rows[6];
        bool exact = true;
        for (uint32_t l = 0; l < LAYERS; l++) {
            kt_kv_cache_rows(c, 0, l, 6, rows);
            for (uint32_t pos = 0; pos < 6; pos++) {
                float back[ROW];
                kt_row_to_f32(t, back, rows[pos], ROW);
                for (uint32_t i = 0; i < ROW; i++)
                    exact &= back[i] == (float)(l * 60 + pos * 10 + i) - 100.0f;
            }
        }
        KT_CHECK(exact, "%s: small integers came back changed", kt_row_type_name(t));
        /* 1 + 2^-8 + 2^-10 lies between BF16's 1 + 2^-7 and 1; nearer 1 + 2^-7 (F16 holds it exactly) */
        const float x = 1.0f + 0x1p-8f + 0x1p-10f;
        float back = 0.0f;
        kt_row_from_f32(t, kt_kv_cache_row(c, 0, 0, 0), &x, 1);
        kt_row_to_f32(t, &back, kt_kv_cache_row(c, 0, 0, 0), 1);
        KT_CHECK(back == (t == KT_ROW_BF16 ? 1.0f + 0x1p-7f : x), "%s stored %.9g as %.9g", kt_row_type_name(t),
                 (double)x, (double)back);
        kt_kv_cache_destroy(c);
    }
    struct kt_kv_cache_params bad = {.n_layer = LAYERS, .row_floats = ROW, .row_type = KT_ROW_TYPE_COUNT,
                                     .block_tokens = BT, .n_blocks = 4, .max_seqs = 1, .n_ctx = 16};
    struct kt_kv_cache *c = NULL;
    kt_err err = {0};
    KT_CHECK(kt_kv_cache_create(&bad, &c, &err) == KT_ERR_INVALID && !c && strstr(err.msg, "row type"),
             "an unknown row type was accepted (%s)", err.msg);
    enum kt_row_type parsed = KT_ROW_F32;
    KT_CHECK(kt_row_type_parse("BF16", &parsed) && parsed == KT_ROW_BF16 && kt_row_type_parse("f16", &parsed) &&
                 parsed == KT_ROW_F16 && !kt_row_type_parse("q8_0", &parsed) && !kt_row_type_parse("", &parsed),
             "row type names");
}

int main(void)
{
    KT_RUN(sequences_grow_in_blocks_and_keep_their_rows);
    KT_RUN(removed_sequences_return_their_blocks_for_reuse);
    KT_RUN(context_limit_error_names_sequence_and_limit_and_changes_nothing);
    KT_RUN(out_of_blocks_error_names_the_need_and_changes_nothing);
    KT_RUN(forks_share_blocks_and_copy_on_write);
    KT_RUN(fork_of_a_full_last_block_copies_nothing);
    KT_RUN(last_sharer_writes_in_place_so_tight_pools_fit);
    KT_RUN(truncate_releases_blocks_and_copies_shared_tail_on_write);
    KT_RUN(caller_storage_is_addressed_and_copied_through_the_callback);
    KT_RUN(zero_sizes_are_rejected);
    KT_RUN(half_width_rows_halve_the_cache_and_round_to_nearest);
    return kt_test_finish();
}
