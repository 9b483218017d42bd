/* The reclaim thread's work on huge mappings; see huge_reclaim.h. */
#include "reclaim/huge_reclaim.h"
#include "reclaim/huge_cache.h"
#include "reclaim/huge_queue.h"
#include "reclaim/huge_tail.h"
#include "reclaim/policy.h"
#include "reclaim/purge_backend.h"
#include "base/config.h"
#include "numa/huge.h"

#include <sys/mman.h>

/* When each LAZY entry was purged: only this thread makes an entry LAZY,
 * and a freed mapping always comes back DIRTY, so the time belongs to the
 * word in the slot as long as that word is LAZY. */
static uint32_t lazy_since_ms[LULL_HUGE_CACHE_SLOTS];

/* Queue [from, from + len) in ranges of at most PURGE_RANGE_MAX, running
 * the ring when full; false if a purge failed. */
static bool purge_in_ranges(struct purge_backend *b, char *from, size_t len, int advice,
                            purge_range *ranges, size_t *n) {
    bool ok = true;
    for (size_t off = 0; off < len; off += PURGE_RANGE_MAX) {
        size_t l = len - off < PURGE_RANGE_MAX ? len - off : PURGE_RANGE_MAX;
        ranges[(*n)++] = (purge_range){from + off, l};
        if (*n == PURGE_RING_ENTRIES) {
            ok &= purge_backend_run(b, ranges, *n, advice, NULL) == *n;
            *n = 0;
        }
    }
    return ok;
}

/* Purge what of the mapping may have been touched, after the header page
 * (it describes the mapping until the unmap): the rest of the header slice
 * and the block's room; true if all succeeded. The slack (before the
 * header, between its slice and a block aligned further on, after the
 * room: numa/huge.h) was never touched: purged too, a block aligned to
 * 1 GiB cost 64 madvise ranges of nothing before its unmap. */
static bool purge_mapping(struct purge_backend *b, lull_huge *h, int advice) {
    purge_range ranges[PURGE_RING_ENTRIES];
    size_t n = 0;
    char *block = (char *)h + h->block_offset;
    bool ok;
    if (h->block_offset == LULL_HUGE_HEADER_BYTES) {
        ok = purge_in_ranges(b, (char *)h + LULL_PAGE_SIZE,
                             block + h->usable - (char *)h - LULL_PAGE_SIZE, advice, ranges, &n);
    } else {
        ok = purge_in_ranges(b, (char *)h + LULL_PAGE_SIZE, LULL_HUGE_HEADER_BYTES - LULL_PAGE_SIZE,
                             advice, ranges, &n);
        ok &= purge_in_ranges(b, block, h->usable, advice, ranges, &n);
    }
    if (n) ok &= purge_backend_run(b, ranges, n, advice, NULL) == n;
    return ok;
}

/* Unmap a mapping this thread owns, cached in `state` until now (DIRTY for
 * one from the queue). */
static void release(struct purge_backend *b, lull_huge *h, int state, lull_huge_reclaim_counts *c) {
    size_t len = h->map_len;
    if (state != LULL_HC_CLEAN) purge_mapping(b, h, MADV_DONTNEED);
    lull_huge_unmap(h, lull_huge_cache_block_resident(state));
    c->unmapped++;
    c->unmapped_bytes += len;
}

/* Unmap the cached mapping freed longest ago. False: nothing to evict. */
static bool evict_oldest(struct purge_backend *b, lull_huge_reclaim_counts *c) {
    lull_huge_cache_entry e, oldest = {0};
    unsigned slot = 0;
    for (unsigned i = 0; i < LULL_HUGE_CACHE_SLOTS; i++) {
        if (!lull_huge_cache_peek(i, &e) || e.state == LULL_HC_PURGING) continue;
        if (!oldest.word || (int32_t)(e.freed_ms - oldest.freed_ms) < 0) {
            oldest = e;
            slot = i;
        }
    }
    if (!oldest.word) return false;
    /* lost to a request thread that took it: the cache shrank all the same */
    if (lull_huge_cache_evict(slot, &oldest, oldest.freed_ms))
        release(b, oldest.h, oldest.state, c);
    return true;
}

/* A mapping freed while the cache was full (or before this thread ran):
 * cache it in place of older ones, if the cache keeps it at all. */
static bool keep(struct purge_backend *b, lull_huge *h, uint32_t now, uint64_t bound,
                 lull_huge_reclaim_counts *c) {
    if (!lull_huge_word_accepts(h) || h->map_len > bound) return false;
    for (unsigned n = 0; n <= LULL_HUGE_CACHE_SLOTS; n++) {
        if (lull_huge_cache_put(h, now)) return true;
        if (!evict_oldest(b, c)) return false;
    }
    return false;
}

/* The queue, oldest first: the overflow (which no malloc takes), then the
 * slots by push order, each claimed by one CAS that a malloc may win first
 * (it took the mapping back: nothing to do). So the newest stay longest
 * within reach of a malloc, and the newest are the ones left in the cache. */
static bool drain_queue(struct purge_backend *b, uint32_t now, uint64_t bound,
                        lull_huge_reclaim_counts *c) {
    bool work = false;
    lull_huge *list = NULL; /* the stack gives the newest first */
    for (lull_huge *q = lull_huge_queue_take_overflow(), *h; (h = q);) {
        q = h->next;
        h->next = list;
        list = h;
    }
    while (list) {
        lull_huge *h = list;
        list = h->next;
        work = true;
        if (!keep(b, h, now, bound, c)) release(b, h, LULL_HC_DIRTY, c);
    }
    lull_huge_queue_entry e[LULL_HUGE_QUEUE_SLOTS];
    unsigned n = 0;
    for (unsigned i = 0; i < LULL_HUGE_QUEUE_SLOTS; i++) {
        if (!lull_huge_queue_peek(i, &e[n])) continue;
        /* insertion by push order (serial numbers: compared with wrap) */
        lull_huge_queue_entry x = e[n];
        unsigned j = n++;
        for (; j > 0 && (int32_t)(x.seq - e[j - 1].seq) < 0; j--)
            e[j] = e[j - 1];
        e[j] = x;
    }
    for (unsigned k = 0; k < n; k++) {
        if (!lull_huge_queue_claim(&e[k])) continue;
        work = true;
        if (!keep(b, e[k].h, now, bound, c)) release(b, e[k].h, LULL_HC_DIRTY, c);
    }
    return work;
}

/* Is a DIRTY entry past the purge delay still held (lull_huge_hold_ms)?
 * Held ones count in *held_bytes, which stays within a sixteenth of the cache's
 * bound (64 MiB by default): beyond it an entry goes as before. */
static bool held(const lull_huge_cache_entry *e, uint32_t now, uint64_t *held_bytes) {
    uint32_t hold = lull_huge_hold_ms(e->gap_ms);
    if ((int32_t)(now - e->freed_ms) >= (int32_t)hold) return false;
    uint64_t room = __atomic_load_n(&lull_config.huge_cache_bytes, __ATOMIC_RELAXED) / 16;
    if (*held_bytes + e->usable > room) return false;
    *held_bytes += e->usable;
    return true;
}

static bool purge_cached(struct purge_backend *b, uint32_t now, long delay, int advice,
                         lull_huge_reclaim_counts *c) {
    uint32_t freed_before = now - (uint32_t)delay;
    bool work = false;
    uint64_t held_bytes = 0;
    lull_huge_cache_entry e;
    for (unsigned i = 0; i < LULL_HUGE_CACHE_SLOTS; i++) {
        if (!lull_huge_cache_peek(i, &e)) continue;
        int how;
        bool claimed = false;
        /* a held entry a malloc passed over since goes below, at once */
        if (e.state == LULL_HC_DIRTY && (int32_t)(freed_before - e.freed_ms) >= 0 &&
            !held(&e, now, &held_bytes))
            how = advice;
        else if (e.state == LULL_HC_LAZY &&
                 (int32_t)(now - lazy_since_ms[i]) >= LULL_POLICY_LAZY_MAX_MS)
            how = MADV_DONTNEED; /* as slices: MADV_FREE'd memory goes for good in the end */
        else if ((claimed = lull_huge_cache_claim_passed_over(i, &e)))
            how = MADV_DONTNEED; /* at once and for good: MADV_FREE'd pages stay in RSS */
        else
            continue;
        if (!claimed && !lull_huge_cache_claim_purge(i, &e, freed_before)) continue;
        work = true;
        bool ok = purge_mapping(b, e.h, how);
        int state = !ok ? LULL_HC_DIRTY : how == MADV_FREE ? LULL_HC_LAZY : LULL_HC_CLEAN;
        if (ok)
            c->purged_bytes += e.usable;
        else
            c->purge_failures++;
        if (state == LULL_HC_LAZY) lazy_since_ms[i] = now;
        lull_huge_cache_finish_purge(i, &e, state);
    }
    return work;
}

/* The tails of huge blocks shrunk in place (huge_tail.h): each purged
 * where it was the block's, then unmapped, as a freed mapping is, and its
 * bytes counted as unmapped (no mapping: the block keeps its own). Not
 * counted, `mapped` fell by a tail that huge_unmapped_bytes never saw
 * (tests/test_huge_unmapped_counted.c). */
static bool give_back_tails(struct purge_backend *b, lull_huge_reclaim_counts *c) {
    lull_huge_tail *t = lull_huge_tail_take_all();
    bool work = t != NULL;
    while (t) {
        lull_huge_tail next = *t; /* the node is in the pages given back */
        purge_range ranges[PURGE_RING_ENTRIES];
        size_t n = 0;
        /* after the node's page, which the unmap takes with the rest */
        if (next.dirty > LULL_PAGE_SIZE)
            purge_in_ranges(b, (char *)t + LULL_PAGE_SIZE, next.dirty - LULL_PAGE_SIZE,
                            MADV_DONTNEED, ranges, &n);
        if (n) purge_backend_run(b, ranges, n, MADV_DONTNEED, NULL);
        lull_huge_unmap_tail(t, next.len, next.dirty, next.node);
        lull_huge_tail_unmapped(next.len);
        c->unmapped_bytes += next.len;
        t = next.next;
    }
    return work;
}

bool lull_huge_reclaim_tick(struct purge_backend *b, uint32_t now, long delay, int advice,
                            lull_huge_reclaim_counts *c) {
    bool work = give_back_tails(b, c);
    uint64_t bound = __atomic_load_n(&lull_config.huge_cache_bytes, __ATOMIC_RELAXED);
    long idle = __atomic_load_n(&lull_config.huge_cache_idle_ms, __ATOMIC_RELAXED);
    lull_huge_cache_entry e;
    uint32_t idle_before = now - (uint32_t)idle;
    for (unsigned i = 0; i < LULL_HUGE_CACHE_SLOTS; i++) {
        if (!lull_huge_cache_peek(i, &e) || (int32_t)(idle_before - e.freed_ms) < 0) continue;
        if (lull_huge_cache_evict(i, &e, idle_before)) {
            release(b, e.h, e.state, c);
            work = true;
        }
    }
    /* the bound was lowered at run time */
    for (unsigned n = 0; lull_huge_cache_bytes() > bound && n < 2 * LULL_HUGE_CACHE_SLOTS; n++) {
        if (!evict_oldest(b, c)) break;
        work = true;
    }
    work |= drain_queue(b, now, bound, c);
    if (delay >= 0) work |= purge_cached(b, now, delay, advice, c);
    return work;
}

bool lull_huge_reclaim_all(struct purge_backend *b, uint32_t now, lull_huge_reclaim_counts *c) {
    bool work = give_back_tails(b, c);
    lull_huge_cache_entry e;
    for (unsigned i = 0; i < LULL_HUGE_CACHE_SLOTS; i++) {
        /* a malloc that takes the entry first has it: it is in use, not cached */
        if (!lull_huge_cache_peek(i, &e) || !lull_huge_cache_evict_any(i, &e)) continue;
        release(b, e.h, e.state, c);
        work = true;
    }
    /* a bound of 0: the cache keeps nothing, every queued mapping goes */
    return drain_queue(b, now, 0, c) || work;
}
