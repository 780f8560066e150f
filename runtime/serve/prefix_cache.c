/*
 * prefix_cache.c - the prefix index (see prefix_cache.h).  A flat array
 * scanned per lookup: capacities are tens of entries and a token comparison
 * is a few nanoseconds, so a tree would buy nothing measurable.
 */
#include "prefix_cache.h"

#include <stdlib.h>
#include <string.h>

struct entry {
    uint32_t seq;
    int32_t *tokens; /* [n] */
    size_t n;
    uint64_t last_used; /* tick of the last lookup hit or insert */
};

struct kt_prefix_cache {
    uint32_t capacity, size;
    uint64_t tick;
    struct entry *entries; /* [capacity] */
};

kt_status kt_prefix_cache_create(uint32_t capacity, struct kt_prefix_cache **out, kt_err *err)
{
    struct kt_prefix_cache *c = calloc(1, sizeof *c);
    if (c && capacity)
        c->entries = calloc(capacity, sizeof *c->entries);
    if (!c || (capacity && !c->entries)) {
        free(c);
        return kt_err_set(err, KT_ERR_NOMEM, "prefix cache: out of memory");
    }
    c->capacity = capacity;
    *out = c;
    return KT_OK;
}

void kt_prefix_cache_destroy(struct kt_prefix_cache *c)
{
    if (!c)
        return;
    for (uint32_t i = 0; i < c->size; i++)
        free(c->entries[i].tokens);
    free(c->entries);
    free(c);
}

static size_t common_prefix(const int32_t *a, size_t na, const int32_t *b, size_t nb)
{
    size_t n = na < nb ? na : nb, i = 0;
    while (i < n && a[i] == b[i])
        i++;
    return i;
}

int64_t kt_prefix_cache_lookup(struct kt_prefix_cache *c, const int32_t *tokens, size_t n, size_t max_match,
                               size_t *match)
{
    int64_t best = -1;
    size_t best_len = 0;
    for (uint32_t i = 0; i < c->size; i++) {
        size_t k = common_prefix(c->entries[i].tokens, c->entries[i].n, tokens, n);
        if (k > max_match)
            k = max_match;
        if (k > best_len)
            best = i, best_len = k;
    }
    *match = best_len;
    if (best < 0)
        return -1;
    c->entries[best].last_used = ++c->tick;
    return c->entries[best].seq;
}

static void remove_at(struct kt_prefix_cache *c, uint32_t i, uint32_t *evicted, size_t *n_evicted)
{
    evicted[(*n_evicted)++] = c->entries[i].seq;
    free(c->entries[i].tokens);
    c->entries[i] = c->entries[--c->size];
}

static uint32_t lru_index(const struct kt_prefix_cache *c)
{
    uint32_t lru = 0;
    for (uint32_t i = 1; i < c->size; i++)
        if (c->entries[i].last_used < c->entries[lru].last_used)
            lru = i;
    return lru;
}

kt_status kt_prefix_cache_insert(struct kt_prefix_cache *c, uint32_t seq, const int32_t *tokens, size_t n,
                                 uint32_t *evicted, size_t *n_evicted, kt_err *err)
{
    *n_evicted = 0;
    if (c->capacity == 0 || n == 0) {
        evicted[(*n_evicted)++] = seq;
        return KT_OK;
    }
    for (uint32_t i = 0; i < c->size;) {
        struct entry *e = &c->entries[i];
        size_t k = common_prefix(e->tokens, e->n, tokens, n);
        if (k == n) { /* an entry already holds all of this */
            e->last_used = ++c->tick;
            evicted[(*n_evicted)++] = seq;
            return KT_OK;
        }
        if (k == e->n)
            remove_at(c, i, evicted, n_evicted); /* this one holds all of that entry */
        else
            i++;
    }
    int32_t *copy = malloc(n * sizeof *copy);
    if (!copy) {
        evicted[(*n_evicted)++] = seq;
        return kt_err_set(err, KT_ERR_NOMEM, "prefix cache: out of memory");
    }
    memcpy(copy, tokens, n * sizeof *copy);
    if (c->size == c->capacity)
        remove_at(c, lru_index(c), evicted, n_evicted);
    c->entries[c->size++] = (struct entry){.seq = seq, .tokens = copy, .n = n, .last_used = ++c->tick};
    return KT_OK;
}

bool kt_prefix_cache_evict_lru(struct kt_prefix_cache *c, uint32_t *seq)
{
    if (c->size == 0)
        return false;
    size_t n = 0;
    remove_at(c, lru_index(c), seq, &n);
    return true;
}

uint32_t kt_prefix_cache_size(const struct kt_prefix_cache *c)
{
    return c->size;
}

uint32_t kt_prefix_cache_capacity(const struct kt_prefix_cache *c)
{
    return c->capacity;
}
