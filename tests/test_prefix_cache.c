/*
 * test_prefix_cache.c - the prefix index: lookups find the entry sharing the
 * longest prefix (capped), a full cache evicts the least recently used
 * entry (a lookup hit counts as a use), an entry that another one extends
 * leaves, an offer already covered comes straight back, and a cache of
 * capacity 0 keeps nothing.
 */
#include "prefix_cache.h"
#include "testlib.h"

static void longest_prefix_wins_and_is_capped(void)
{
    struct kt_prefix_cache *c;
    kt_err err = {0};
    KT_CHECK(kt_prefix_cache_create(4, &c, &err) == KT_OK, "%s", err.msg);
    uint32_t ev[8];
    size_t n_ev;
    const int32_t a[] = {1, 2, 3, 4, 5}, b[] = {1, 2, 9, 9}, q[] = {1, 2, 3, 4, 5, 6};
    kt_prefix_cache_insert(c, 10, a, 5, ev, &n_ev, &err);
    KT_CHECK(n_ev == 0, "nothing evicted");
    kt_prefix_cache_insert(c, 11, b, 4, ev, &n_ev, &err);
    size_t match;
    KT_CHECK(kt_prefix_cache_lookup(c, q, 6, 5, &match) == 10 && match == 5, "seq 10, %zu tokens", match);
    KT_CHECK(kt_prefix_cache_lookup(c, q, 6, 3, &match) == 10 && match == 3, "capped at 3: %zu", match);
    const int32_t r[] = {1, 2, 9};
    KT_CHECK(kt_prefix_cache_lookup(c, r, 3, 2, &match) >= 10 && match == 2, "two tokens: %zu", match);
    const int32_t none[] = {7};
    KT_CHECK(kt_prefix_cache_lookup(c, none, 1, 1, &match) == -1 && match == 0, "no match");
    kt_prefix_cache_destroy(c);
}

static void least_recently_used_leaves_first(void)
{
    struct kt_prefix_cache *c;
    kt_err err = {0};
    kt_prefix_cache_create(2, &c, &err);
    uint32_t ev[8];
    size_t n_ev, match;
    const int32_t a[] = {1, 1}, b[] = {2, 2}, x[] = {3, 3};
    kt_prefix_cache_insert(c, 1, a, 2, ev, &n_ev, &err);
    kt_prefix_cache_insert(c, 2, b, 2, ev, &n_ev, &err);
    kt_prefix_cache_lookup(c, a, 2, 2, &match); /* a is now the more recent */
    kt_prefix_cache_insert(c, 3, x, 2, ev, &n_ev, &err);
    KT_CHECK(n_ev == 1 && ev[0] == 2, "evicted %zu: %u", n_ev, n_ev ? ev[0] : 0);
    uint32_t seq;
    KT_CHECK(kt_prefix_cache_evict_lru(c, &seq) && seq == 1, "then a: %u", seq);
    KT_CHECK(kt_prefix_cache_evict_lru(c, &seq) && seq == 3, "then x: %u", seq);
    KT_CHECK(!kt_prefix_cache_evict_lru(c, &seq) && kt_prefix_cache_size(c) == 0, "empty");
    kt_prefix_cache_destroy(c);
}

static void covered_entries_are_dropped(void)
{
    struct kt_prefix_cache *c;
    kt_err err = {0};
    kt_prefix_cache_create(4, &c, &err);
    uint32_t ev[8];
    size_t n_ev;
    const int32_t shorter[] = {5, 6}, longer[] = {5, 6, 7};
    kt_prefix_cache_insert(c, 1, shorter, 2, ev, &n_ev, &err);
    kt_prefix_cache_insert(c, 2, longer, 3, ev, &n_ev, &err);
    KT_CHECK(n_ev == 1 && ev[0] == 1 && kt_prefix_cache_size(c) == 1, "the shorter entry left");
    kt_prefix_cache_insert(c, 3, shorter, 2, ev, &n_ev, &err);
    KT_CHECK(n_ev == 1 && ev[0] == 3 && kt_prefix_cache_size(c) == 1, "an offer already covered comes back");
    kt_prefix_cache_destroy(c);
    kt_prefix_cache_create(0, &c, &err);
    kt_prefix_cache_insert(c, 4, longer, 3, ev, &n_ev, &err);
    KT_CHECK(n_ev == 1 && ev[0] == 4 && kt_prefix_cache_size(c) == 0, "capacity 0 keeps nothing");
    kt_prefix_cache_destroy(c);
}

int main(void)
{
    KT_RUN(longest_prefix_wins_and_is_capped);
    KT_RUN(least_recently_used_leaves_first);
    KT_RUN(covered_entries_are_dropped);
    return kt_test_finish();
}
