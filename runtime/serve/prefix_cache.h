/*
 * prefix_cache.h - which engine sequences hold the KV of which token
 * prefixes, so a new prompt that starts like an earlier one forks that
 * sequence's blocks (copy-on-write, kv_cache.h) instead of recomputing them.
 *
 * It is only an index: entries are (sequence id, the tokens its KV holds),
 * found by longest common prefix and evicted least recently used first.  It
 * never touches the engine; the scheduler forks, truncates and removes the
 * sequences it names.  Not thread-safe: the scheduler's thread owns it.
 */
#ifndef KT_PREFIX_CACHE_H
#define KT_PREFIX_CACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "status.h"

struct kt_prefix_cache;

/* capacity: most entries (0: a cache that never holds anything). */
kt_status kt_prefix_cache_create(uint32_t capacity, struct kt_prefix_cache **out, kt_err *err);
void kt_prefix_cache_destroy(struct kt_prefix_cache *c);

/* The entry sharing the longest prefix with tokens[0..n), at most max_match
 * tokens of it: its sequence id (and the entry becomes most recently used)
 * with *match set, or -1 with *match = 0 when no entry shares a token. */
int64_t kt_prefix_cache_lookup(struct kt_prefix_cache *c, const int32_t *tokens, size_t n, size_t max_match,
                               size_t *match);

/* Offers sequence seq, whose KV holds tokens[0..n) (copied).  Entries it
 * makes redundant (their tokens a prefix of these) and, when full, the least
 * recently used ones leave the cache: their ids go to evicted[] (room for
 * capacity + 1 ids), *n_evicted counts them.  When an entry already holds
 * these tokens and more, seq itself is not kept and comes back in evicted[].
 * The caller removes every returned sequence from the engine. */
kt_status kt_prefix_cache_insert(struct kt_prefix_cache *c, uint32_t seq, const int32_t *tokens, size_t n,
                                 uint32_t *evicted, size_t *n_evicted, kt_err *err);

/* Drops the least recently used entry; false when empty. */
bool kt_prefix_cache_evict_lru(struct kt_prefix_cache *c, uint32_t *seq);

uint32_t kt_prefix_cache_size(const struct kt_prefix_cache *c);
uint32_t kt_prefix_cache_capacity(const struct kt_prefix_cache *c);

#endif
